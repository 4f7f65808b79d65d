// The ptdp executable end to end: every bad-input path gives a one-line message naming the
// file, key or value and a non-zero exit; --json carries the documented keys; plan --out
// writes a plan that simulate reads back.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <tuple>

#include "tests/fakes/shell.h"

namespace {

const std::string kSrc = PTDP_SOURCE_DIR;
const std::string kBin = std::string(PTDP_BINARY_DIR) + "/ptdp";
const std::string kA100 = kSrc + "/configs/clusters/dgx-a100.yaml";
const std::string k175b = kSrc + "/configs/models/gpt3-175b.yaml";
const std::string kTiny = kSrc + "/configs/models/gpt-tiny.yaml";
const std::string kCpu = kSrc + "/configs/clusters/local-cpu.yaml";

using ptdp::testing::CmdResult;

CmdResult Ptdp(const std::string& args) { return ptdp::testing::Shell(kBin + " " + args); }

std::string Write(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// A failure is one line, starts with "ptdp:", and names what is wrong.
using ptdp::testing::ExpectOneLineError;

TEST(Cli, HelpHasAnExampleForEveryCommand) {
  for (const char* cmd : {"plan", "simulate", "topo", "validate", "schedule", "report", "train", "info",
                          "calibrate", "compare", "checkpoint"}) {
    const CmdResult r = Ptdp(std::string(cmd) + " --help");
    EXPECT_EQ(r.code, 0) << cmd;
    const size_t at = r.out.find("\nExample");  // "Example:" or "Examples:"
    ASSERT_NE(at, std::string::npos) << cmd << ": " << r.out;
    // Every example line is one whole command a user can paste: "ptdp <cmd> ...", never two
    // commands joined with '|' (a shell pipes one into the other).
    std::istringstream lines(r.out.substr(r.out.find('\n', at + 1) + 1));
    int examples = 0;
    for (std::string line; std::getline(lines, line) && !line.empty(); ++examples) {
      EXPECT_EQ(line.rfind("  ptdp " + std::string(cmd), 0), 0u) << line;
      EXPECT_EQ(line.find('|'), std::string::npos) << line;
    }
    EXPECT_GE(examples, 1) << cmd;
  }
}

TEST(Cli, MissingClusterFile) {
  ExpectOneLineError(Ptdp("plan --cluster /nonexistent.yaml --model " + k175b + " --global-batch 8"),
                     "/nonexistent.yaml");
}

TEST(Cli, MalformedModelYaml) {
  const std::string bad = Write("bad-model.yaml", "layers: [1, 2\nhidden: 3\n");
  ExpectOneLineError(Ptdp("plan --cluster " + kA100 + " --model " + bad + " --global-batch 8"),
                     "bad-model.yaml");
}

TEST(Cli, UnknownKeyInModel) {
  const std::string bad = Write("unknown-key.yaml",
                                "layers: 2\nhidden: 64\nheads: 4\nseq_len: 64\nvocab: 256\nwidth: 3\n");
  const CmdResult r = Ptdp("plan --cluster " + kA100 + " --model " + bad + " --global-batch 8");
  ExpectOneLineError(r, "width");
  EXPECT_NE(r.out.find("unknown-key.yaml:6"), std::string::npos) << r.out;
}

TEST(Cli, NegativeSizeInModel) {
  const std::string bad = Write("negative.yaml",
                                "layers: 2\nhidden: -64\nheads: 4\nseq_len: 64\nvocab: 256\n");
  const CmdResult r = Ptdp("plan --cluster " + kA100 + " --model " + bad + " --global-batch 8");
  ExpectOneLineError(r, "hidden");
  EXPECT_NE(r.out.find("-64"), std::string::npos) << r.out;
}

TEST(Cli, BareNumberForBandwidth) {
  const std::string bad = Write("bare.yaml",
                                "name: x\nnodes: 1\ngpus_per_node: 2\n"
                                "gpu: {name: g, memory: 80 GiB, hbm_bandwidth: 2 TB/s, peak: {bf16: 312 TFLOP/s}}\n"
                                "intra_node: {fabric: nvswitch, bandwidth: 300, latency: 3 us}\n");
  const CmdResult r = Ptdp("topo --cluster " + bad);
  ExpectOneLineError(r, "bandwidth");
  EXPECT_NE(r.out.find("bare.yaml:"), std::string::npos) << r.out;
}

TEST(Cli, IllegalLayoutForSimulate) {
  ExpectOneLineError(Ptdp("simulate --cluster " + kA100 + " --model " + k175b +
                          " --global-batch 1536 --tp 5 --pp 1 --dp 1 --gpus 5"),
                     "heads");
}

TEST(Cli, ZeroAndNegativeFlags) {
  ExpectOneLineError(Ptdp("plan --cluster " + kA100 + " --model " + k175b + " --global-batch 0"),
                     "--global-batch");
  ExpectOneLineError(Ptdp("plan --cluster " + kA100 + " --model " + k175b +
                          " --global-batch 8 --nodes -1"),
                     "--nodes");
  ExpectOneLineError(Ptdp("plan --cluster " + kA100 + " --model " + k175b +
                          " --global-batch 8 --gpus 100000"),
                     "--gpus 100000");
  ExpectOneLineError(Ptdp("plan --cluster " + kA100 + " --model " + k175b +
                          " --global-batch 8 --sp maybe"),
                     "--sp");
  // Absurd sizes are refused quickly, not enumerated.
  ExpectOneLineError(Ptdp("plan --cluster " + kA100 + " --model " + k175b +
                          " --global-batch 9223372036854775807"),
                     "--global-batch");
  ExpectOneLineError(Ptdp("simulate --cluster " + kA100 + " --model " + k175b +
                          " --global-batch 99999999999 --tp 8 --pp 16"),
                     "--global-batch");
}

TEST(Cli, UnknownFlagIsAUsageError) {
  const CmdResult r = Ptdp("plan --cluster " + kA100 + " --model " + k175b + " --global-batch 8 --tpp 4");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--tpp"), std::string::npos) << r.out;
}

TEST(Cli, PlanJsonHasTheDocumentedKeys) {
  const CmdResult r = Ptdp("plan --cluster " + kA100 + " --model " + k175b +
                     " --global-batch 1536 --json --top 3");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"step_time_s", "tflops_per_gpu", "hw_tflops_per_gpu", "mfu",
                        "bubble_fraction", "breakdown_s", "memory_bytes", "fits", "layout",
                        "evaluated", "legal", "fitting", "elapsed_s", "rejected", "plans"})
    EXPECT_TRUE(j.contains(k)) << k;
  for (const char* k : {"compute", "tp_comm", "pp_comm", "dp_comm", "bubble", "optimizer"})
    EXPECT_TRUE(j["breakdown_s"].contains(k)) << k;
  for (const char* k : {"weights", "grads", "optimizer", "activations", "other", "total", "capacity"})
    EXPECT_TRUE(j["memory_bytes"].contains(k)) << k;
  for (const char* k : {"tp", "pp", "dp", "vp", "micro_batch", "global_batch", "num_microbatches",
                        "sequence_parallel", "recompute", "distributed_optimizer", "schedule"})
    EXPECT_TRUE(j["layout"].contains(k)) << k;
  EXPECT_EQ(j["plans"].size(), 3u);
  EXPECT_LE(j["layout"]["tp"].get<int>(), 8);  // TP stays inside a node
  EXPECT_TRUE(j["fits"].get<bool>());
  EXPECT_GT(j["evaluated"].get<int64_t>(), j["legal"].get<int64_t>());
}

// The Megatron options the search leaves off (Megatron's defaults), each tried on its own and
// together: Llama 3 70B in fp8 on 64 GB200s plans faster with Megatron-FSDP and the Grace's
// memory for activations (Megatron-Bridge's recipe: FSDP, mb 2, 40 layers offloaded).
TEST(Cli, PlanNamesTheOptionsItLeftOff) {
  const std::string args = "plan --cluster " + kSrc + "/configs/clusters/gb200-nvl72.yaml " +
                           "--gpus 64 --model " + kSrc + "/configs/models/llama3-70b.yaml " +
                           "--global-batch 256 --precision fp8 --top 2";
  const CmdResult r = Ptdp(args + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.contains("options_left_off"));
  const double pick = j["step_time_s"].get<double>();
  bool fsdp_offload = false;
  for (const auto& o : j["options_left_off"]) {
    ASSERT_TRUE(o.contains("flags") && o.contains("tried") && o.contains("faster"));
    if (!o.contains("plan")) continue;
    const auto& p = o["plan"];
    EXPECT_EQ(o["faster"].get<bool>(), p["step_time_s"].get<double>() < 0.99 * pick);
    if (p["layout"]["shard_params"].get<bool>() &&
        p["layout"]["cpu_offloading_num_layers"].get<int>() > 0) {
      fsdp_offload = true;
      EXPECT_TRUE(o["faster"].get<bool>());
      EXPECT_NE(o["flags"].get<std::string>().find("--cpu-offloading-num-layers "),
                std::string::npos);
      EXPECT_EQ(p["layout"]["pp"].get<int>(), 1);
      EXPECT_TRUE(p["fits"].get<bool>());
    }
  }
  EXPECT_TRUE(fsdp_offload);
  // The precision-aware optimizer with bf16 moments is tried on its own (it refuses FSDP):
  // its layout carries it, and its flags say the dtypes.
  bool pa_opt = false;
  for (const auto& o : j["options_left_off"]) {
    if (o["tried"].get<std::string>().rfind("--use-precision-aware-optimizer", 0) != 0) continue;
    pa_opt = true;
    ASSERT_TRUE(o.contains("plan")) << o.dump();
    EXPECT_TRUE(o["plan"]["layout"]["use_precision_aware_optimizer"].get<bool>());
    EXPECT_EQ(o["plan"]["layout"]["exp_avg_dtype"], "bf16");
    EXPECT_FALSE(o["plan"]["layout"]["shard_gradients"].get<bool>());
    EXPECT_EQ(o["flags"], "--use-precision-aware-optimizer --exp-avg-dtype bf16 "
                          "--exp-avg-sq-dtype bf16");
  }
  EXPECT_TRUE(pa_opt);
  const CmdResult t = Ptdp(args);
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_NE(t.out.find("Megatron options left off"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("optim_grads_params"), std::string::npos) << t.out;
  // Options the user set are not advised: with the others given, offloading is left.
  const CmdResult all = Ptdp(args + " --json --tp-comm-overlap on --grad-reduce-in-bf16 "
                             "--data-parallel-sharding-strategy optim "
                             "--use-precision-aware-optimizer");
  ASSERT_EQ(all.code, 0) << all.out;
  const auto left = nlohmann::json::parse(all.out)["options_left_off"];
  ASSERT_EQ(left.size(), 1u) << all.out;
  EXPECT_EQ(left[0]["tried"].get<std::string>(), "--cpu-offloading-num-layers N");
  // --options-left-off off skips them; a value other than on or off is refused.
  const CmdResult off = Ptdp(args + " --json --options-left-off off");
  ASSERT_EQ(off.code, 0) << off.out;
  EXPECT_FALSE(nlohmann::json::parse(off.out).contains("options_left_off"));
  ExpectOneLineError(Ptdp(args + " --options-left-off maybe"), "--options-left-off");
}

TEST(Cli, PlanOutThenSimulateThePlan) {
  const std::string plan = ::testing::TempDir() + "/plan-tiny.yaml";
  const CmdResult p = Ptdp("plan --cluster " + kCpu + " --model " + kTiny +
                     " --global-batch 16 --gpus 4 --out " + plan);
  ASSERT_EQ(p.code, 0) << p.out;
  const CmdResult s = Ptdp("simulate " + plan + " --json");
  ASSERT_EQ(s.code, 0) << s.out;
  const auto j = nlohmann::json::parse(s.out);
  EXPECT_EQ(j["layout"]["global_batch"].get<int>(), 16);
  EXPECT_EQ(j["layout"]["tp"].get<int>() * j["layout"]["pp"].get<int>() *
                j["layout"]["dp"].get<int>(),
            4);
  EXPECT_GT(j["step_time_s"].get<double>(), 0);
}

TEST(Cli, EmitMegatron) {
  const CmdResult r = Ptdp("plan --cluster " + kA100 + " --model " + k175b +
                     " --global-batch 1536 --tp 8 --pp 16 --emit megatron");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("--tensor-model-parallel-size 8"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--pipeline-model-parallel-size 16"), std::string::npos);
  EXPECT_NE(r.out.find("--global-batch-size 1536"), std::string::npos);
}

// The MoE chain: plan DeepSeek-V3 with the expert grid searched, write the plan, simulate it back
// (ep, etp, the dispatcher and the A2A overlap survive plan.yaml), emit its Megatron command.
TEST(Cli, MoePlanSimulateAndEmit) {
  const std::string h100 = kSrc + "/configs/clusters/dgx-h100.yaml";
  const std::string dsv3 = kSrc + "/configs/models/deepseek-v3.yaml";
  const std::string plan = ::testing::TempDir() + "/plan-dsv3.yaml";
  const CmdResult p = Ptdp("plan --cluster " + h100 + " --model " + dsv3 +
                           " --gpus 512 --global-batch 4096 --pp 8 --json --out " + plan);
  ASSERT_EQ(p.code, 0) << p.out;
  const auto j = nlohmann::json::parse(p.out);
  EXPECT_GT(j["params_total"].get<double>(), 660e9);
  EXPECT_LT(j["params_active"].get<double>(), 40e9);
  const int ep = j["layout"]["ep"].get<int>();
  EXPECT_GT(ep, 1);
  EXPECT_EQ(256 % ep, 0);
  ASSERT_TRUE(j.contains("rejected"));
  EXPECT_TRUE(j["rejected"].contains("moe_with_tp_needs_sequence_parallel") ||
              j["rejected"].contains("expert_grid_does_not_fold"));
  const CmdResult s = Ptdp("simulate " + plan + " --json --emit megatron");
  ASSERT_EQ(s.code, 0) << s.out;
  const auto k = nlohmann::json::parse(s.out);
  EXPECT_EQ(k["layout"]["ep"].get<int>(), ep);
  EXPECT_GT(k["step_time_s"].get<double>(), 0);
  const std::string cmd = k["megatron_command"].get<std::string>();
  EXPECT_NE(cmd.find("--expert-model-parallel-size " + std::to_string(ep)), std::string::npos);
  EXPECT_NE(cmd.find("--multi-latent-attention"), std::string::npos);
  EXPECT_NE(cmd.find("--moe-layer-freq '([0]*3+[1]*58)'"), std::string::npos);
  // A dense model takes no ep.
  ExpectOneLineError(Ptdp("plan --cluster " + kA100 + " --model " + k175b +
                          " --global-batch 1536 --ep 2"),
                     "no experts");
}

// Megatron's --moe-token-dispatcher-type and --overlap-moe-expert-parallel-comm: simulate times
// the layout the planner chose with them (DeepSeek-V3 with its EP group over 4 DGX B200 nodes,
// Megatron-Bridge 26.04.01's B200 MXFP8 recipe), plan takes them as fixed choices, and a bad
// value, the allgather dispatcher, an illegal overlap or a dense model get a one-line error.
TEST(Cli, MoeDispatcherAndAllToAllOverlapFlags) {
  const std::string b200 = kSrc + "/configs/clusters/dgx-b200.yaml";
  const std::string dsv3 = kSrc + "/configs/models/deepseek-v3.yaml";
  // The recipe's layout (DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2): 16 stages of 61 layers.
  const std::string split = " --pp 8 --vp 2 --pipeline-model-parallel-layout 'Et*4|(t*4|)*14tmL'";
  const std::string sim = "simulate --cluster " + b200 + " --model " + dsv3 +
                          " --gpus 256 --tp 1 --ep 32 --global-batch 4096" + split +
                          " --recompute-modules mla_up_proj mlp --dist-opt on --precision fp8 "
                          "--grad-reduce-in-bf16 --json ";
  auto step = [&](const std::string& extra, nlohmann::json* layout) {
    const CmdResult r = Ptdp(sim + extra);
    EXPECT_EQ(r.code, 0) << r.out;
    if (r.code != 0) return 0.0;
    const auto j = nlohmann::json::parse(r.out);
    if (layout) *layout = j["layout"];
    return j["step_time_s"].get<double>();
  };
  nlohmann::json a2a, flex, both;
  const double t_a2a = step("", &a2a);
  const double t_flex = step("--moe-token-dispatcher-type flex", &flex);
  const double t_both =
      step("--moe-token-dispatcher-type flex --overlap-moe-expert-parallel-comm on", &both);
  EXPECT_FALSE(a2a["moe_flex_dispatcher"].get<bool>());
  EXPECT_FALSE(a2a["moe_a2a_overlap"].get<bool>());
  EXPECT_TRUE(flex["moe_flex_dispatcher"].get<bool>());
  EXPECT_TRUE(both["moe_a2a_overlap"].get<bool>());
  // Over 4 nodes a token crosses the network once per remote node holding its experts, not once
  // per expert; the overlap then hides all-to-alls under the paired micro-batch's compute.
  EXPECT_LT(t_flex, 0.8 * t_a2a);
  EXPECT_LT(t_both, 0.8 * t_flex);
  EXPECT_NEAR(t_a2a, step("--moe-token-dispatcher-type alltoall "
                          "--overlap-moe-expert-parallel-comm off", nullptr), 1e-9);

  // plan: each flag fixes its choice (unset, the planner turns both on here).
  const std::string plan = "plan --cluster " + b200 + " --model " + dsv3 +
                           " --gpus 256 --tp 1 --ep 32 --global-batch 4096" + split +
                           " --recompute-modules mla_up_proj mlp --precision fp8 --json "
                           "--options-left-off off --top 1 ";
  for (const auto& [flags, flex_on, overlap_on] :
       {std::tuple{std::string(), true, true},
        std::tuple{std::string("--moe-token-dispatcher-type alltoall"), false, true},
        std::tuple{std::string("--overlap-moe-expert-parallel-comm off"), true, false}}) {
    const CmdResult p = Ptdp(plan + flags);
    ASSERT_EQ(p.code, 0) << flags << "\n" << p.out;
    const auto l = nlohmann::json::parse(p.out)["layout"];
    EXPECT_EQ(l["moe_flex_dispatcher"].get<bool>(), flex_on) << flags;
    EXPECT_EQ(l["moe_a2a_overlap"].get<bool>(), overlap_on) << flags;
  }

  ExpectOneLineError(Ptdp(sim + "--moe-token-dispatcher-type allgather"), "not modelled");
  ExpectOneLineError(Ptdp(sim + "--moe-token-dispatcher-type deepep"),
                     "'deepep': expected alltoall or flex");
  ExpectOneLineError(Ptdp(sim + "--overlap-moe-expert-parallel-comm maybe"),
                     "expected on or off");
  // Megatron asserts virtual stages with pp > 1 for the overlap.
  ExpectOneLineError(Ptdp("simulate --cluster " + b200 + " --model " + dsv3 +
                          " --gpus 256 --pp 16 --ep 8 --global-batch 4096 "
                          "--pipeline-model-parallel-layout 'Et*3|(t*4|)*14t*2mL' "
                          "--overlap-moe-expert-parallel-comm on"),
                     "--overlap-moe-expert-parallel-comm needs");
  // `ptdp schedule` prints the combined 1F1B: one more warm-up forward.
  const CmdResult sch = Ptdp("schedule --pp 1 --microbatches 4 --overlap-moe-expert-parallel-comm on");
  ASSERT_EQ(sch.code, 0) << sch.out;
  EXPECT_NE(sch.out.find("rank0 (warmup 1): F0 | F1 B0 F2 B1 F3 B2 | B3"), std::string::npos)
      << sch.out;
  ExpectOneLineError(Ptdp("schedule --pp 2 --microbatches 4 --overlap-moe-expert-parallel-comm on"),
                     "needs virtual stages with pp > 1");
  ExpectOneLineError(Ptdp("simulate --cluster " + kA100 + " --model " + k175b +
                          " --global-batch 8 --moe-token-dispatcher-type flex"),
                     "no experts");
  ExpectOneLineError(Ptdp("plan --cluster " + kA100 + " --model " + k175b +
                          " --global-batch 8 --overlap-moe-expert-parallel-comm on"),
                     "no experts");
}

// Megatron's --cross-entropy-loss-fusion and --cross-entropy-fusion-impl: simulate keeps
// Megatron's default (no fusion) unless told, Transformer Engine's kernel keeps half the
// logits' bytes on the last stage (2, not fp32's 4) and moves less; plan takes it unless told,
// and the command, plan.yaml and --json carry it; bad values get a one-line error.
TEST(Cli, CrossEntropyFusionFlags) {
  const std::string h100 = kSrc + "/configs/clusters/dgx-h100.yaml";
  const std::string llama = kSrc + "/configs/models/llama3-8b.yaml";
  const std::string sim = "simulate --cluster " + h100 + " --model " + llama +
                          " --gpus 8 --tp 2 --pp 2 --dp 2 --global-batch 16 --json ";
  auto run = [&](const std::string& extra) {
    const CmdResult r = Ptdp(sim + extra);
    EXPECT_EQ(r.code, 0) << extra << "\n" << r.out;
    return r.code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
  };
  const auto none = run(""), native = run("--cross-entropy-loss-fusion on"),
             te = run("--cross-entropy-fusion-impl te");
  ASSERT_TRUE(none.contains("layout") && native.contains("layout") && te.contains("layout"));
  EXPECT_EQ(none["layout"]["cross_entropy_fusion"], "none");
  EXPECT_EQ(native["layout"]["cross_entropy_fusion"], "native");
  EXPECT_EQ(te["layout"]["cross_entropy_fusion"], "te");
  EXPECT_EQ(run("--cross-entropy-loss-fusion on --cross-entropy-fusion-impl te")["layout"]
                ["cross_entropy_fusion"], "te");
  // The last stage keeps one micro-batch's logits: s b V/t of them, 2 bytes fewer each.
  const double logits = 8192.0 * 1 * 128256 / 2;
  const auto last = [](const nlohmann::json& j) { return j["stage_memory_bytes"][1].get<double>(); };
  const auto first = [](const nlohmann::json& j) { return j["stage_memory_bytes"][0].get<double>(); };
  EXPECT_NEAR(last(none) - last(te), 2 * logits * 1.05, 0.02 * logits);  // + fragmentation
  EXPECT_DOUBLE_EQ(last(none), last(native));
  EXPECT_DOUBLE_EQ(first(none), first(te));
  EXPECT_LT(te["step_time_s"].get<double>(), native["step_time_s"].get<double>());
  EXPECT_LT(native["step_time_s"].get<double>(), none["step_time_s"].get<double>());

  // plan: te unless told; the Megatron command and plan.yaml carry it.
  const std::string yaml = ::testing::TempDir() + "/plan-ce.yaml";
  const std::string plan = "plan --cluster " + h100 + " --model " + llama +
                           " --gpus 8 --global-batch 16 --top 1 ";
  const CmdResult p = Ptdp(plan + "--json");
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_EQ(nlohmann::json::parse(p.out)["layout"]["cross_entropy_fusion"], "te");
  const CmdResult cmd = Ptdp(plan + "--emit megatron");
  ASSERT_EQ(cmd.code, 0) << cmd.out;
  EXPECT_NE(cmd.out.find("--cross-entropy-loss-fusion --cross-entropy-fusion-impl te"),
            std::string::npos) << cmd.out;
  const CmdResult off = Ptdp(plan + "--cross-entropy-loss-fusion off --json");
  ASSERT_EQ(off.code, 0) << off.out;
  EXPECT_EQ(nlohmann::json::parse(off.out)["layout"]["cross_entropy_fusion"], "none");
  const CmdResult off_cmd = Ptdp(plan + "--cross-entropy-loss-fusion off --emit megatron");
  ASSERT_EQ(off_cmd.code, 0) << off_cmd.out;
  EXPECT_EQ(off_cmd.out.find("--cross-entropy"), std::string::npos);
  const CmdResult out = Ptdp(plan + "--cross-entropy-fusion-impl native --out " + yaml);
  ASSERT_EQ(out.code, 0) << out.out;
  std::stringstream text;
  text << std::ifstream(yaml).rdbuf();
  EXPECT_NE(text.str().find("cross_entropy_fusion: native"), std::string::npos) << text.str();
  const CmdResult again = Ptdp("simulate " + yaml + " --json");
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_EQ(nlohmann::json::parse(again.out)["layout"]["cross_entropy_fusion"], "native");

  ExpectOneLineError(Ptdp(sim + "--cross-entropy-fusion-impl te --cross-entropy-loss-fusion off"),
                     "--cross-entropy-fusion-impl te needs --cross-entropy-loss-fusion on");
  ExpectOneLineError(Ptdp(sim + "--cross-entropy-fusion-impl triton"),
                     "'triton': expected native or te");
  ExpectOneLineError(Ptdp(sim + "--cross-entropy-loss-fusion maybe"), "expected on or off");
}

// Megatron's --overlap-param-gather on its own: off, the distributed optimizer's all-gather is
// exposed (more DP time), the command leaves the flag out, plan.yaml keeps it; Megatron's
// assertions (the distributed optimizer, --overlap-grad-reduce) refuse it in a line.
TEST(Cli, OverlapParamGatherFlag) {
  const std::string sim = "simulate --cluster " + kSrc + "/configs/clusters/dgx-h100.yaml --model " +
                          kSrc + "/configs/models/llama3-70b.yaml --gpus 64 --tp 8 --pp 2 "
                          "--global-batch 128 --dist-opt on ";
  const CmdResult on = Ptdp(sim + "--json"), off = Ptdp(sim + "--overlap-param-gather off --json");
  ASSERT_EQ(on.code, 0) << on.out;
  ASSERT_EQ(off.code, 0) << off.out;
  const auto jon = nlohmann::json::parse(on.out), joff = nlohmann::json::parse(off.out);
  EXPECT_TRUE(jon["layout"]["overlap_param_gather"].get<bool>());
  EXPECT_FALSE(joff["layout"]["overlap_param_gather"].get<bool>());
  // (The analytic figure: the simulator's DP stream runs each chunk's all-gather after its
  // reduce-scatter either way.)
  EXPECT_GT(joff["analytic_step_time_s"].get<double>(), jon["analytic_step_time_s"].get<double>());
  const CmdResult cmd_on = Ptdp(sim + "--emit megatron"),
                  cmd_off = Ptdp(sim + "--overlap-param-gather off --emit megatron");
  ASSERT_EQ(cmd_on.code, 0) << cmd_on.out;
  ASSERT_EQ(cmd_off.code, 0) << cmd_off.out;
  EXPECT_NE(cmd_on.out.find("--overlap-param-gather"), std::string::npos);
  EXPECT_EQ(cmd_off.out.find("--overlap-param-gather"), std::string::npos);
  EXPECT_NE(cmd_off.out.find("--overlap-grad-reduce"), std::string::npos);
  const std::string yaml = ::testing::TempDir() + "/plan-ag.yaml";
  const CmdResult p = Ptdp("plan --cluster " + kSrc + "/configs/clusters/dgx-h100.yaml --model " +
                           kSrc + "/configs/models/llama3-70b.yaml --gpus 64 --global-batch 128 "
                           "--dist-opt on --overlap-param-gather off --top 1 --options-left-off off "
                           "--out " + yaml);
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("no-ag-overlap"), std::string::npos) << p.out;
  const CmdResult again = Ptdp("simulate " + yaml + " --json");
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_FALSE(nlohmann::json::parse(again.out)["layout"]["overlap_param_gather"].get<bool>());
  ExpectOneLineError(Ptdp(sim + "--overlap-param-gather on --overlap-grad-reduce off"),
                     "--overlap-param-gather on needs --overlap-grad-reduce on");
  ExpectOneLineError(Ptdp("simulate --cluster " + kSrc + "/configs/clusters/dgx-h100.yaml --model " +
                          kSrc + "/configs/models/llama3-70b.yaml --gpus 64 --tp 8 --pp 2 "
                          "--global-batch 128 --dist-opt off --overlap-param-gather on"),
                     "needs the distributed optimizer");
  ExpectOneLineError(Ptdp(sim + "--overlap-param-gather maybe"), "expected on or off");
}

// fp4 needs an fp4 tensor-core peak (Blackwell): on H100 plan and simulate refuse it in a line.
TEST(Cli, Fp4RefusedOnH100) {
  const std::string h100 = kSrc + "/configs/clusters/dgx-h100.yaml";
  const std::string llama = kSrc + "/configs/models/llama3-8b.yaml";
  ExpectOneLineError(Ptdp("plan --cluster " + h100 + " --model " + llama +
                          " --global-batch 512 --precision fp4"),
                     "--precision fp4: GPU H100-SXM5-80GB has no fp4 peak");
  ExpectOneLineError(Ptdp("simulate --cluster " + h100 + " --model " + llama +
                          " --global-batch 512 --tp 8 --precision fp4"),
                     "--precision fp4: GPU H100-SXM5-80GB has no peak rate for it");
  ExpectOneLineError(Ptdp("plan --cluster " + h100 + " --model " + llama +
                          " --global-batch 512 --precision fp6"),
                     "bf16, fp16, fp8, fp4, fp32");
}

// Every Blackwell cluster file plans a small model (the NVL72 files' 576 GPUs split 32 layers only
// unevenly, at pp 9: the test takes --gpus 512).
TEST(Cli, BlackwellClustersPlanLlama3_8b) {
  for (const char* c : {"dgx-b200", "dgx-b300", "gb200-nvl72", "gb300-nvl72"}) {
    const std::string gpus = std::string(c).rfind("gb", 0) == 0 ? " --gpus 512" : "";
    const CmdResult r = Ptdp("plan --cluster " + kSrc + "/configs/clusters/" + c + ".yaml --model " +
                             kSrc + "/configs/models/llama3-8b.yaml --global-batch 512 --refine 2" +
                             gpus + " --json");
    ASSERT_EQ(r.code, 0) << c << ": " << r.out;
    const auto j = nlohmann::json::parse(r.out);
    ASSERT_FALSE(j["plans"].empty()) << c;
    EXPECT_TRUE(j["fits"].get<bool>()) << c;
    EXPECT_GT(j["step_time_s"].get<double>(), 0) << c;
  }
}

// NVL72: the rack is the NVLink domain. topo shows it; --nodes must be whole racks; an fp4 plan
// emits Megatron-LM's fp4 flags and 4 processes per tray.
TEST(Cli, Nvl72RacksAndFp4) {
  const std::string nvl = kSrc + "/configs/clusters/gb200-nvl72.yaml";
  const std::string llama = kSrc + "/configs/models/llama3-8b.yaml";
  CmdResult r = Ptdp("topo --cluster " + nvl);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("NVLink domain: 18 nodes x 4 GPUs = 72 GPUs"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(next node, same NVLink domain)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 72 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(next NVLink domain)"), std::string::npos) << r.out;
  r = Ptdp("topo --cluster " + nvl + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["nvlink_domain_gpus"], 72);
  ExpectOneLineError(Ptdp("plan --cluster " + nvl + " --model " + llama +
                          " --global-batch 512 --nodes 20"),
                     "--nodes 20: " + nvl + " has 18 nodes per NVLink domain; give a multiple of it");
  r = Ptdp("plan --cluster " + nvl + " --model " + llama +
           " --gpus 64 --global-batch 256 --tp 8 --precision fp4 --emit megatron");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("--tensor-model-parallel-size 8"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--bf16 --fp4-format e2m1 --fp4-recipe nvfp4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--nproc_per_node=4 --nnodes=16"), std::string::npos) << r.out;
}

TEST(Cli, TopoPrintsTheNode) {
  const CmdResult r = Ptdp("topo --cluster " + kA100);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("GPU7"), std::string::npos);
  EXPECT_NE(r.out.find("300 GB/s"), std::string::npos) << r.out;
}

TEST(Cli, SimulatePlanFileErrorsNameTheFile) {
  const std::string bad = Write("bad-plan.yaml", "ptdp_plan_version: 1\ncluster: {file: x}\n");
  const CmdResult r = Ptdp("simulate " + bad);
  ExpectOneLineError(r, "bad-plan.yaml");
}

TEST(Cli, SimulateWritesAPerfettoTrace) {
  const std::string trace = ::testing::TempDir() + "/trace.json";
  const CmdResult r = Ptdp("simulate --cluster " + kA100 + " --model " + k175b +
                           " --global-batch 64 --nodes 4 --tp 8 --pp 4 --vp 2 --trace " + trace);
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(trace);
  const auto j = nlohmann::json::parse(in);
  ASSERT_TRUE(j.contains("traceEvents"));
  int processes = 0, forwards = 0, comm = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") ++processes;
    if (e["ph"] == "X" && e["name"].get<std::string>().rfind("F", 0) == 0) ++forwards;
    if (e["ph"] == "X" && e["tid"] == 1) ++comm;
  }
  EXPECT_EQ(processes, 4);          // a process per pipeline rank
  EXPECT_EQ(forwards, 4 * 2 * 64);  // p * v * m: dp = 32 / (8 * 4) = 1, so m = B = 64
  EXPECT_GT(comm, 0);
}

TEST(Cli, SimulateTimelineAndJson) {
  const CmdResult r = Ptdp("simulate --cluster " + kA100 + " --model " + k175b +
                           " --global-batch 8 --nodes 4 --tp 8 --pp 4 --timeline --width 60");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("rank 3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("analytic model:"), std::string::npos);
  const CmdResult j = Ptdp("simulate --cluster " + kA100 + " --model " + k175b +
                           " --global-batch 8 --nodes 4 --tp 8 --pp 4 --json");
  ASSERT_EQ(j.code, 0) << j.out;
  const auto js = nlohmann::json::parse(j.out);
  EXPECT_EQ(js["source"], "simulated");
  EXPECT_EQ(js["ranks"].size(), 4u);
  EXPECT_GT(js["analytic_step_time_s"].get<double>(), 0);
}

// Issue 13: --ops shows the layer as its kernels, with what each costs and what stays exposed.
TEST(Cli, SimulateOpsListsTheKernels) {
  const std::string args = "simulate --cluster " + kA100 + " --model " + k175b +
                           " --global-batch 8 --nodes 4 --tp 8 --pp 4 --sp on --ops";
  const CmdResult r = Ptdp(args);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* want : {"layer forward, one micro-batch", "layer backward", "output forward",
                           "fc1.wgrad", "async under qkv.wgrad", "tp-overlap under qkv"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  const CmdResult j = Ptdp(args + " --json");
  ASSERT_EQ(j.code, 0) << j.out;
  const auto js = nlohmann::json::parse(j.out);
  ASSERT_TRUE(js.contains("layer_ops"));
  int gemms = 0;
  double fwd = 0;
  for (const auto& list : js["layer_ops"]) {
    EXPECT_GT(list["time_s"].get<double>(), 0) << list["list"];
    if (list["list"] == "layer forward") fwd = list["time_s"].get<double>();
    for (const auto& op : list["ops"]) {
      gemms += op["kind"] == "gemm";
      if (op["kind"] == "comm") {
        EXPECT_LE(op["exposed_s"].get<double>(), op["comm_s"].get<double>() * 1.2);
      }
    }
  }
  EXPECT_EQ(gemms, 4 + 8 + 3);  // a layer's forward and backward, the logits fwd + bwd
  EXPECT_GT(fwd, 0);
}

TEST(Cli, PlanSaysWhichFiguresAreSimulated) {
  const CmdResult r = Ptdp("plan --cluster " + kA100 + " --model " + k175b +
                           " --global-batch 1536 --json --top 20 --refine 4");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["plans"].size(), 20u);
  int simulated = 0;
  for (const auto& p : j["plans"]) simulated += p["source"] == "simulated";
  EXPECT_EQ(simulated, 4);
  EXPECT_EQ(j["plans"][0]["source"], "simulated");
  EXPECT_EQ(j["source"], "simulated");
}

// Issue 12: on the one-node clusters the tied-embedding reduction of pp 4 x dp 2 was timed on a
// network that is not there: simulate's text died with "basic_string::_M_create", --json gave a
// null step time, plan --out wrote "step_time_s: -nan" and 120 of 282 layouts ranked as NaN.
TEST(Cli, OneNodeClustersGiveNumbers) {
  const std::string kPcie = kSrc + "/configs/clusters/workstation-pcie4.yaml";
  for (const auto& [cluster, gpus, pp_dp] :
       {std::tuple{kCpu, 8, "--pp 4 --dp 2"}, std::tuple{kPcie, 4, "--pp 4 --dp 1"}}) {
    const std::string layout = " --model " + kTiny + " --global-batch 8 --gpus " +
                               std::to_string(gpus) + " --tp 1 " + pp_dp;
    const CmdResult text = Ptdp("simulate --cluster " + cluster + layout);
    ASSERT_EQ(text.code, 0) << text.out;
    EXPECT_NE(text.out.find("step time"), std::string::npos) << text.out;
    const CmdResult j = Ptdp("simulate --cluster " + cluster + layout + " --json");
    ASSERT_EQ(j.code, 0) << j.out;
    const auto js = nlohmann::json::parse(j.out);
    for (const char* k : {"step_time_s", "analytic_step_time_s", "bubble_fraction", "mfu"})
      EXPECT_TRUE(js[k].is_number()) << k << ": " << j.out;
    const std::string plan = ::testing::TempDir() + "/one_node_plan.yaml";
    const CmdResult out = Ptdp("plan --cluster " + cluster + layout + " --out " + plan);
    ASSERT_EQ(out.code, 0) << out.out;
    std::stringstream file;
    file << std::ifstream(plan).rdbuf();
    for (const char* bad : {": nan", ": -nan", ": inf", ": -inf", ".inf", ".nan"})
      EXPECT_EQ(file.str().find(bad), std::string::npos) << bad << " in " << file.str();
    const CmdResult back = Ptdp("simulate " + plan + " --json");
    EXPECT_EQ(back.code, 0) << back.out;
    // Every layout of the search: a number, best first.
    const CmdResult all = Ptdp("plan --cluster " + cluster + " --model " + kTiny +
                               " --global-batch 8 --gpus " + std::to_string(gpus) +
                               " --top 10000 --json");
    ASSERT_EQ(all.code, 0) << all.out;
    const auto plans = nlohmann::json::parse(all.out)["plans"];
    EXPECT_GT(plans.size(), 100u);
    double last = 0;
    for (const auto& p : plans) {
      ASSERT_TRUE(p["step_time_s"].is_number()) << p.dump();
      EXPECT_GE(p["step_time_s"].get<double>(), last);
      last = p["step_time_s"].get<double>();
    }
  }
}

TEST(Cli, InfoSaysWhatThisBinaryRuns) {
  const CmdResult r = Ptdp("info --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"cuda_compiled", "gpus_visible", "nccl_version", "cublas_version", "mpi", "backends"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["backends"][0], "cpu");
  ASSERT_TRUE(j["gpus_visible"].is_number_integer());
  // cuda is listed exactly when it can run: compiled in and a GPU visible; otherwise the JSON
  // says why not (on the build machine: no driver).
  const bool can_run_cuda = j["cuda_compiled"] == true && j["gpus_visible"].get<int>() > 0;
  EXPECT_EQ(j["backends"].size(), can_run_cuda ? 2u : 1u);
  if (j["cuda_compiled"] == true && !can_run_cuda) {
    EXPECT_FALSE(j["why_no_gpu"].get<std::string>().empty());
  }
  if (j["cuda_compiled"] == true) {
    EXPECT_TRUE(j["nccl_version"].is_string());
  }
}

}  // namespace

// Issue 14's targets through the CLI: Llama 3 405B on 16,384 H100s (126 layers: no even split
// at pp 16) plans, and tp 8 x pp 16 fits; the split's layers per virtual stage are in the JSON
// with the model's parameter counts; Megatron's own flags come back in the command.
namespace {
const std::string kH100 = kSrc + "/configs/clusters/dgx-h100.yaml";
const std::string k405b = kSrc + "/configs/models/llama3-405b.yaml";
}  // namespace

TEST(Cli, Llama3_405bOn16kH100sPlansWithAnUnevenSplit) {
  const CmdResult r = Ptdp("plan --cluster " + kH100 + " --model " + k405b +
                           " --nodes 2048 --global-batch 2048 --tp 8 --pp 16 --refine 4 --json "
                           "--emit megatron --train-tokens 15T");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["fits"].get<bool>());
  EXPECT_EQ(j["params_total"].get<int64_t>(), 405853388800);
  EXPECT_EQ(j["params_active"].get<int64_t>(), 405853388800);
  EXPECT_EQ(j["seq_len"].get<int>(), 8192);
  const auto& lay = j["layout"];
  EXPECT_EQ(lay["tp"].get<int>(), 8);
  EXPECT_EQ(lay["pp"].get<int>(), 16);
  const auto stages = lay["stage_layers"].get<std::vector<int>>();
  ASSERT_EQ(stages.size(), size_t(16 * lay["vp"].get<int>()));
  int sum = 0;
  for (int n : stages) sum += n;
  EXPECT_EQ(sum, 126);
  EXPECT_NE(lay["pipeline_split"].get<std::string>(), "even");
  const std::string cmd = j["megatron_command"];
  EXPECT_TRUE(cmd.find("--account-for-embedding-in-pipeline-split") != std::string::npos ||
              cmd.find("--decoder-first-pipeline-num-layers") != std::string::npos ||
              cmd.find("--decoder-last-pipeline-num-layers") != std::string::npos)
      << cmd;
  EXPECT_GT(j["training"]["days"].get<double>(), 1);
  EXPECT_GT(j["training"]["gpu_hours"].get<double>(), 1e6);
}

TEST(Cli, SimulatesAPipelineLayoutString) {
  // 126 layers over pp 16 as 7 | 8 x 14 | 7, with E and L in the first and last stage.
  const CmdResult r = Ptdp("simulate --cluster " + kH100 + " --model " + k405b +
                           " --nodes 2048 --global-batch 2048 --tp 8 --pp 16 --recompute full "
                           "--pipeline-model-parallel-layout 'Et*7|(t*8|)*14,t*7L' --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  const auto stages = j["layout"]["stage_layers"].get<std::vector<int>>();
  ASSERT_EQ(stages.size(), 16u);
  EXPECT_EQ(stages.front(), 7);
  EXPECT_EQ(stages[1], 8);
  EXPECT_EQ(stages.back(), 7);
  EXPECT_EQ(j["stage_memory_bytes"].size(), 16u);
  // The same split from Megatron's accounting flags, in the command it prints.
  const CmdResult m = Ptdp("plan --cluster " + kH100 + " --model " + k405b +
                           " --nodes 2048 --global-batch 2048 --tp 8 --pp 16 --vp 4 --refine 0 "
                           "--account-for-embedding-in-pipeline-split "
                           "--account-for-loss-in-pipeline-split --emit megatron");
  ASSERT_EQ(m.code, 0) << m.out;
  for (const char* flag : {"--account-for-embedding-in-pipeline-split",
                           "--account-for-loss-in-pipeline-split",
                           "--num-virtual-stages-per-pipeline-rank 4"})
    EXPECT_NE(m.out.find(flag), std::string::npos) << flag << "\n" << m.out;
}

TEST(Cli, PipelineSplitFlagsRefuseBadValuesInALine) {
  const std::string base = "simulate --cluster " + kH100 + " --model " + k405b +
                           " --nodes 2048 --global-batch 2048 --tp 8 --pp 16 ";
  ExpectOneLineError(Ptdp(base + "--pipeline-model-parallel-layout 'Et*7|x|L'"),
                     "'x' is not a layer");
  ExpectOneLineError(Ptdp(base + "--decoder-first-pipeline-num-layers 0"),
                     "--decoder-first-pipeline-num-layers 0 must be in 1..");
  ExpectOneLineError(Ptdp(base + "--decoder-first-pipeline-num-layers 7"),
                     "middle layers 119 % middle stages 15 != 0");
  ExpectOneLineError(Ptdp(base + "--overlap-p2p-communication maybe"),
                     "--overlap-p2p-communication 'maybe': expected on or off");
  ExpectOneLineError(Ptdp(base + "--memory-headroom 1.5"), "--memory-headroom 1.5");
  ExpectOneLineError(Ptdp("simulate --cluster " + kH100 + " --model " + k405b +
                          " --global-batch 2048 --tp 8,4"),
                     "--tp takes one value here");
  ExpectOneLineError(Ptdp("plan --cluster " + kH100 + " --model " + k405b +
                          " --global-batch 2048 --train-tokens 15X"),
                     "unknown suffix 'X'");
}

// With no layout that fits, the JSON still names the model and its parameters.
TEST(Cli, NoFitStillCarriesTheParameterCounts) {
  const CmdResult r = Ptdp("plan --cluster " + kH100 + " --model " + k405b +
                           " --nodes 8 --global-batch 64 --json");
  ASSERT_NE(r.code, 0);
  const size_t brace = r.out.find('{');
  ASSERT_NE(brace, std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(r.out.substr(brace, r.out.rfind('}') - brace + 1));
  EXPECT_EQ(j["params_total"].get<int64_t>(), 405853388800);
  EXPECT_TRUE(j["plans"].size() > 0);  // the smallest, none fitting
}

// The schedule with the layers of each chunk for a split (issue 14).
TEST(Cli, ScheduleShowsEachChunksLayers) {
  CmdResult r = Ptdp("schedule --pp 4 --vp 2 --microbatches 8 --layers 22 "
                     "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["stage_layers"].get<std::vector<int>>(), (std::vector<int>{2, 3, 3, 3, 3, 3, 3, 2}));
  // Interleaving at pp 2 from a layout string (4 stages = pp 2 x vp 2).
  r = Ptdp("schedule --pp 2 --microbatches 4 --layers 6 --pipeline-model-parallel-layout 'Et|tt|tt|tL'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("interleaved schedule: pp 2, vp 2"), std::string::npos) << r.out;
  // What each rank holds: a heavy chunk 0 piles up past the warm-up (rank 1's 8 and 1 layers:
  // 3 x 8 + 3 x 1 = 27 at the warm-up's end, then forwards of chunk 0 beside backwards of
  // chunk 1, to 48), as the simulator's memory timeline has it.
  r = Ptdp("schedule --pp 3 --microbatches 12 --layers 24 "
           "--pipeline-model-parallel-layout 'Ettt|tttttttt|ttt|ttt|t|ttttttL' --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto k = nlohmann::json::parse(r.out);
  EXPECT_EQ(k["peak_layer_microbatches"].get<std::vector<double>>(), (std::vector<double>{24, 48, 15}));
  EXPECT_EQ(k["warmup_layer_microbatches"].get<std::vector<double>>(), (std::vector<double>{24, 27, 15}));
  ExpectOneLineError(Ptdp("schedule --pp 4 --microbatches 8 --layers 22 --decoder-first-pipeline-num-layers 5"),
                     "middle layers 17 % middle stages 3 != 0");
  ExpectOneLineError(Ptdp("schedule --pp 4 --microbatches 8 --account-for-loss-in-pipeline-split"),
                     "need --layers");
}

// With no legal layout, the power-of-two hint comes only when the model's shape is what the world
// does not divide (heads, layers): here the batch is the cause (7 % (2 dp) != 0), and no hint.
TEST(Cli, NoLegalLayoutHintFollowsTheCause) {
  const CmdResult r = Ptdp("plan --cluster " + kA100 + " --model " + k175b +
                           " --nodes 3 --global-batch 7 --micro-batch 2");
  ASSERT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("global_batch_not_divisible_by_mb_x_dp"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("not a power of two"), std::string::npos) << r.out;
}

// Meta's Llama 3 405B layout (tp 8, pp 16, dp 128, no recompute) fits with Megatron-FSDP's
// optim_grads, and the command says so; ZeRO-3 is refused as not modelled.
TEST(Cli, Llama3_405bAsMetaRanItFitsWithGradientSharding) {
  const CmdResult r = Ptdp("plan --cluster " + kH100 + " --model " + k405b +
                           " --nodes 2048 --global-batch 2048 --tp 8 --pp 16 --cp 1 --recompute none"
                           " --refine 0 --json --emit megatron");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["fits"].get<bool>());
  EXPECT_TRUE(j["layout"]["shard_gradients"].get<bool>());
  EXPECT_EQ(j["layout"]["dp"].get<int>(), 128);
  const std::string cmd = j["megatron_command"];
  EXPECT_NE(cmd.find("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads"),
            std::string::npos) << cmd;
  EXPECT_NE(cmd.find("--use-distributed-optimizer"), std::string::npos) << cmd;
  const std::string base = "simulate --cluster " + kH100 + " --model " + k405b +
                           " --nodes 2048 --global-batch 2048 --tp 8 --pp 16 ";
  // ZeRO-3 (optim_grads_params) shards the weights too: less memory than ZeRO-2, the
  // command says so.
  const std::string split = "--decoder-first-pipeline-num-layers 7 "
                            "--decoder-last-pipeline-num-layers 7 --recompute none --json ";
  const CmdResult z2 = Ptdp(base + split + "--data-parallel-sharding-strategy optim_grads");
  const CmdResult z3 = Ptdp(base + split + "--data-parallel-sharding-strategy optim_grads_params "
                                           "--emit megatron");
  ASSERT_EQ(z2.code, 0) << z2.out;
  ASSERT_EQ(z3.code, 0) << z3.out;
  const auto j2 = nlohmann::json::parse(z2.out), j3 = nlohmann::json::parse(z3.out);
  EXPECT_TRUE(j3["layout"]["shard_params"].get<bool>());
  EXPECT_FALSE(j2["layout"]["shard_params"].get<bool>());
  EXPECT_LT(j3["memory_bytes"]["weights"].get<double>(),
            j2["memory_bytes"]["weights"].get<double>() / 3);
  EXPECT_NE(j3["megatron_command"].get<std::string>().find(
                "--data-parallel-sharding-strategy optim_grads_params"),
            std::string::npos);
  ExpectOneLineError(Ptdp(base + "--data-parallel-sharding-strategy fsdp"), "is not one of");
  // CPU activation offloading: Megatron's rules, and a cluster that states its host link.
  ExpectOneLineError(Ptdp(base + split + "--cpu-offloading-num-layers 8"),
                     "without pipeline parallelism (pp 16)");
  ExpectOneLineError(Ptdp(base + "--cpu-offloading-num-layers 0"), "must be a positive number");
  ExpectOneLineError(Ptdp("simulate --cluster " + std::string(PTDP_SOURCE_DIR) +
                          "/configs/clusters/local-cpu.yaml --model " + k405b +
                          " --gpus 1 --global-batch 8 --cpu-offloading-num-layers 4"),
                     "gives no gpu host_bandwidth");
  ExpectOneLineError(Ptdp(base + "--data-parallel-sharding-strategy optim_grads --dist-opt off"),
                     "contradicts --dist-opt off");
}
