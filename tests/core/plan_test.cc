// plan.yaml: PlanToYaml -> PlanFromYamlText round trips field by field (with and without a
// prediction), and a hand-edited plan that breaks a rule is reported with file and key.
#include "core/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/core/test_util.h"

namespace ptdp {
namespace {

using ::ptdp::testing_util::SourcePath;
using ::ptdp::testing_util::WriteTemp;
using ::testing::HasSubstr;

// GPT-3 175B on 16 nodes of 8 GPUs: tp 8, pp 8, dp 2 = 128 GPUs; v 3 (96/8 = 12 layers per
// stage, 12 % 3 == 0); m = 512 / (1 * 2) = 256, a multiple of g = p = 8.
Plan SamplePlan() {
  Plan p;
  ModelSpec& m = p.model;
  m.name = "gpt3-175b";
  m.layers = 96; m.hidden = 12288; m.heads = 96; m.kv_heads = 96; m.ffn_hidden = 49152;
  m.seq_len = 2048; m.vocab = 50257;
  Layout& l = p.layout;
  l.tp = 8; l.pp = 8; l.dp = 2; l.vp = 3; l.cp = 1;
  l.micro_batch = 1; l.global_batch = 512; l.microbatch_group = 0;
  l.sequence_parallel = true;
  l.recompute = Recompute::kSelective;
  l.distributed_optimizer = true;
  l.precision = Precision::kBf16;
  l.schedule = ScheduleKind::kInterleaved;
  l.overlap_grad_reduce = false;  // non-default, so the round trip must carry it
  l.ddp_bucket_size = 12345678;   // likewise (0 is Megatron's default)
  l.tp_comm_overlap = true;
  l.grad_reduce_in_bf16 = true;   // non-default
  l.optimizer_state.precision_aware = true;  // and its dtypes, each non-default
  l.optimizer_state.main_params = StateDtype::kFp16;
  l.optimizer_state.exp_avg = StateDtype::kBf16;
  l.optimizer_state.exp_avg_sq = StateDtype::kFp8;
  l.optimizer_state.main_grads = StateDtype::kBf16;
  p.cluster_file = "configs/clusters/dgx-a100.yaml";
  p.cluster_name = "DGX A100 (8x A100 80GB, 8x HDR 200 Gb/s)";
  p.nodes = 16;
  p.gpus_per_node = 8;
  p.allow_tp_across_nodes = false;
  return p;
}

Plan WithPrediction(Plan p) {
  p.has_prediction = true;
  Prediction& q = p.prediction;
  q.source = "simulated";
  q.step_time_s = 12.345678901234567;
  q.tflops_per_gpu = 1.0 / 3.0 * 500;   // not short in decimal: exercises %.17g
  q.hw_tflops_per_gpu = 180.25;
  q.mfu = 0.5123456789;
  q.bubble_fraction = 0;                 // zero is a legal prediction
  q.fits = true;
  q.breakdown = {.compute_s = 9.5, .tp_comm_s = 0.75, .pp_comm_s = 0.125, .dp_comm_s = 0.1,
                 .bubble_s = 1.8, .optimizer_s = 0.07};
  q.memory = {.weights = 4.5e9, .grads = 9e9, .optimizer = 1.35e10, .activations = 3.2e10,
              .other = 2.1e9, .total = 6.11e10, .capacity = 80.0 * 1073741824};
  q.stage_memory_bytes = {6.11e10, 5.9e10, 5.8e10, 5.7e10, 5.6e10, 5.5e10, 5.4e10, 6.0e10};
  return p;
}

void ExpectSameModel(const ModelSpec& a, const ModelSpec& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.layers, b.layers);
  EXPECT_EQ(a.hidden, b.hidden);
  EXPECT_EQ(a.heads, b.heads);
  EXPECT_EQ(a.kv_heads, b.kv_heads);
  EXPECT_EQ(a.ffn_hidden, b.ffn_hidden);
  EXPECT_EQ(a.seq_len, b.seq_len);
  EXPECT_EQ(a.vocab, b.vocab);
  EXPECT_EQ(a.activation, b.activation);
  EXPECT_EQ(a.norm, b.norm);
  EXPECT_EQ(a.position, b.position);
  EXPECT_EQ(a.tied_embeddings, b.tied_embeddings);
  EXPECT_EQ(a.bias, b.bias);
}

void ExpectSameLayout(const Layout& a, const Layout& b) {
  EXPECT_EQ(a.tp, b.tp);
  EXPECT_EQ(a.pp, b.pp);
  EXPECT_EQ(a.dp, b.dp);
  EXPECT_EQ(a.vp, b.vp);
  EXPECT_EQ(a.cp, b.cp);
  EXPECT_EQ(a.micro_batch, b.micro_batch);
  EXPECT_EQ(a.global_batch, b.global_batch);
  EXPECT_EQ(a.microbatch_group, b.microbatch_group);
  EXPECT_EQ(a.sequence_parallel, b.sequence_parallel);
  EXPECT_EQ(a.recompute, b.recompute);
  EXPECT_EQ(a.distributed_optimizer, b.distributed_optimizer);
  EXPECT_EQ(a.precision, b.precision);
  EXPECT_EQ(a.schedule, b.schedule);
  EXPECT_EQ(a.overlap_grad_reduce, b.overlap_grad_reduce);
  EXPECT_EQ(a.ddp_bucket_size, b.ddp_bucket_size);
  EXPECT_EQ(a.tp_comm_overlap, b.tp_comm_overlap);
  EXPECT_EQ(a.grad_reduce_in_bf16, b.grad_reduce_in_bf16);
  EXPECT_EQ(a.accumulate_grads_in_fp32, b.accumulate_grads_in_fp32);
  EXPECT_EQ(a.optimizer_state.precision_aware, b.optimizer_state.precision_aware);
  EXPECT_EQ(a.optimizer_state.main_params, b.optimizer_state.main_params);
  EXPECT_EQ(a.optimizer_state.exp_avg, b.optimizer_state.exp_avg);
  EXPECT_EQ(a.optimizer_state.exp_avg_sq, b.optimizer_state.exp_avg_sq);
  EXPECT_EQ(a.optimizer_state.main_grads, b.optimizer_state.main_grads);
  EXPECT_EQ(a.shard_gradients, b.shard_gradients);
  EXPECT_EQ(a.shard_params, b.shard_params);
  EXPECT_EQ(a.cpu_offload_layers, b.cpu_offload_layers);
}

// Doubles must come back bit-exact (EXPECT_EQ, not NEAR): the writer uses %.17g.
void ExpectSamePrediction(const Prediction& a, const Prediction& b) {
  EXPECT_EQ(a.source, b.source);
  EXPECT_EQ(a.step_time_s, b.step_time_s);
  EXPECT_EQ(a.tflops_per_gpu, b.tflops_per_gpu);
  EXPECT_EQ(a.hw_tflops_per_gpu, b.hw_tflops_per_gpu);
  EXPECT_EQ(a.mfu, b.mfu);
  EXPECT_EQ(a.bubble_fraction, b.bubble_fraction);
  EXPECT_EQ(a.fits, b.fits);
  EXPECT_EQ(a.breakdown.compute_s, b.breakdown.compute_s);
  EXPECT_EQ(a.breakdown.tp_comm_s, b.breakdown.tp_comm_s);
  EXPECT_EQ(a.breakdown.pp_comm_s, b.breakdown.pp_comm_s);
  EXPECT_EQ(a.breakdown.dp_comm_s, b.breakdown.dp_comm_s);
  EXPECT_EQ(a.breakdown.bubble_s, b.breakdown.bubble_s);
  EXPECT_EQ(a.breakdown.optimizer_s, b.breakdown.optimizer_s);
  EXPECT_EQ(a.memory.weights, b.memory.weights);
  EXPECT_EQ(a.memory.grads, b.memory.grads);
  EXPECT_EQ(a.memory.optimizer, b.memory.optimizer);
  EXPECT_EQ(a.memory.activations, b.memory.activations);
  EXPECT_EQ(a.memory.other, b.memory.other);
  EXPECT_EQ(a.memory.total, b.memory.total);
  EXPECT_EQ(a.memory.capacity, b.memory.capacity);
  EXPECT_EQ(a.stage_memory_bytes, b.stage_memory_bytes);
}

void ExpectSamePlan(const Plan& a, const Plan& b) {
  ExpectSameModel(a.model, b.model);
  ExpectSameLayout(a.layout, b.layout);
  EXPECT_EQ(a.cluster_file, b.cluster_file);
  EXPECT_EQ(a.cluster_name, b.cluster_name);
  EXPECT_EQ(a.nodes, b.nodes);
  EXPECT_EQ(a.gpus_per_node, b.gpus_per_node);
  EXPECT_EQ(a.nodes_per_nvlink_domain, b.nodes_per_nvlink_domain);
  EXPECT_EQ(a.allow_tp_across_nodes, b.allow_tp_across_nodes);
  EXPECT_EQ(a.has_prediction, b.has_prediction);
  if (a.has_prediction && b.has_prediction) ExpectSamePrediction(a.prediction, b.prediction);
}

TEST(PlanRoundTripTest, WithoutPrediction) {
  const Plan p = SamplePlan();
  Result<Plan> back = PlanFromYamlText(PlanToYaml(p), "plan.yaml");
  ASSERT_TRUE(back.ok()) << back.status().message();
  ExpectSamePlan(p, *back);
}

TEST(PlanRoundTripTest, WithPrediction) {
  const Plan p = WithPrediction(SamplePlan());
  Result<Plan> back = PlanFromYamlText(PlanToYaml(p), "plan.yaml");
  ASSERT_TRUE(back.ok()) << back.status().message();
  ExpectSamePlan(p, *back);
  // Writing the read-back plan gives the same text.
  EXPECT_EQ(PlanToYaml(*back), PlanToYaml(p));
}

TEST(PlanRoundTripTest, LlamaShapeAndDefaults) {
  // GQA, SwiGLU, RMSNorm, RoPE, untied, no bias; 1F1B; default layout flags.
  Plan p;
  p.model.name = "llama3-8b";
  p.model.layers = 32; p.model.hidden = 4096; p.model.heads = 32; p.model.kv_heads = 8;
  p.model.ffn_hidden = 14336; p.model.seq_len = 8192; p.model.vocab = 128256;
  p.model.activation = Activation::kSwiglu; p.model.norm = Norm::kRmsNorm;
  p.model.position = PositionEmbedding::kRope; p.model.tied_embeddings = false;
  p.model.bias = false;
  p.layout.tp = 2; p.layout.pp = 2; p.layout.dp = 2; p.layout.micro_batch = 2;
  p.layout.global_batch = 64; p.layout.microbatch_group = 0;
  p.layout.precision = Precision::kFp8;
  p.layout.recompute = Recompute::kFull;
  p.cluster_file = "c.yaml"; p.nodes = 1; p.gpus_per_node = 8;  // uses 8 of 8 GPUs
  Result<Plan> back = PlanFromYamlText(PlanToYaml(p), "plan.yaml");
  ASSERT_TRUE(back.ok()) << back.status().message();
  ExpectSamePlan(p, *back);
}

// Uneven pipelines: every split form (first/last counts, accounting, a layout string) and the
// p2p-overlap knob survive the round trip, with stage_layers written and checked on reading.
TEST(PlanRoundTripTest, UnevenPipelineSplits) {
  for (int form = 0; form < 3; ++form) {
    Plan p = SamplePlan();  // 96 layers, pp 8, vp 3
    Layout& l = p.layout;
    l.overlap_p2p = false;
    l.shard_gradients = form == 1;  // with the distributed optimizer of SamplePlan
    l.shard_params = form == 1;     // ZeRO-3
    // Megatron-FSDP keeps its own dtypes: no --use-precision-aware-optimizer there.
    if (form == 1) l.optimizer_state = {};
    if (form == 0) l.first_stage_layers = 15, l.last_stage_layers = 9;  // 72 middle / 6 = 12, / vp 3
    if (form == 1) l.embedding_in_split = l.loss_in_split = true, p.model.layers = 94;  // 96 / 8 / 3
    if (form == 2) {
      l.vp = 1;
      l.pipeline_layout = std::make_shared<const PipelineLayout>(
          *ParsePipelineLayout("Et*11|(t*12|)*6,t*13L"));
    }
    l.schedule = l.vp > 1 ? ScheduleKind::kInterleaved : ScheduleKind::kOneFOneB;
    ASSERT_EQ(CheckLayout(p.model, l), Rejection::kOk) << form << " " << l.SplitName();
    const std::string text = PlanToYaml(p);
    EXPECT_NE(text.find("  stage_layers: ["), std::string::npos) << text;
    Result<Plan> back = PlanFromYamlText(text, "plan.yaml");
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_EQ(back->layout.first_stage_layers, l.first_stage_layers);
    EXPECT_EQ(back->layout.last_stage_layers, l.last_stage_layers);
    EXPECT_EQ(back->layout.embedding_in_split, l.embedding_in_split);
    EXPECT_EQ(back->layout.loss_in_split, l.loss_in_split);
    EXPECT_EQ(back->layout.pipeline_layout != nullptr, l.pipeline_layout != nullptr);
    EXPECT_FALSE(back->layout.overlap_p2p);
    EXPECT_EQ(back->layout.shard_gradients, form == 1);
    EXPECT_EQ(back->layout.shard_params, form == 1);
    EXPECT_EQ(StageLayers(back->model, back->layout), StageLayers(p.model, l));
    EXPECT_EQ(PlanToYaml(*back), text);
    // A hand-edited stage_layers that disagrees with the split is named.
    std::string edited = text;
    const size_t at = edited.find("  stage_layers: [") + 17;
    edited.insert(at, "1, ");
    Result<Plan> bad = PlanFromYamlText(edited, "plan.yaml");
    ASSERT_FALSE(bad.ok());
    EXPECT_THAT(bad.status().message(), HasSubstr("layout.stage_layers: [1, "));
    EXPECT_THAT(bad.status().message(), HasSubstr("disagrees with the split"));
  }
}

// An NVL72 plan: 4-GPU trays, 18 to a rack's NVLink domain. tp 8 spans two trays of one rack:
// legal, and carried through the round trip; as plain 4-GPU nodes it would span two domains.
TEST(PlanRoundTripTest, NvlinkDomainOfTrays) {
  Plan p = SamplePlan();  // tp 8 pp 8 dp 2 = 128 GPUs
  p.nodes = 36;           // two racks of 18 trays: 144 GPUs
  p.gpus_per_node = 4;
  p.nodes_per_nvlink_domain = 18;
  const std::string text = PlanToYaml(p);
  EXPECT_NE(text.find("  nodes_per_nvlink_domain: 18\n"), std::string::npos) << text;
  Result<Plan> back = PlanFromYamlText(text, "plan.yaml");
  ASSERT_TRUE(back.ok()) << back.status().message();
  ExpectSamePlan(p, *back);
  p.nodes_per_nvlink_domain = 1;
  back = PlanFromYamlText(PlanToYaml(p), "plan.yaml");
  ASSERT_FALSE(back.ok());
  EXPECT_THAT(back.status().message(), HasSubstr("tp 8 spans NVLink domains"));
  std::string partial = text;
  partial.replace(partial.find("  nodes: 36\n"), 12, "  nodes: 20\n");
  back = PlanFromYamlText(partial, "plan.yaml");
  ASSERT_FALSE(back.ok());
  EXPECT_THAT(back.status().message(),
              HasSubstr("cluster.nodes_per_nvlink_domain: '18' does not divide nodes '20'"));
}

// fp4 (NVFP4 on Blackwell) is one of layout.precision's values: written and read back.
TEST(PlanRoundTripTest, Fp4Precision) {
  Plan p = SamplePlan();
  p.layout.precision = Precision::kFp4;
  const std::string text = PlanToYaml(p);
  EXPECT_NE(text.find("  precision: fp4\n"), std::string::npos) << text;
  Result<Plan> back = PlanFromYamlText(text, "plan.yaml");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->layout.precision, Precision::kFp4);
  ExpectSamePlan(p, *back);
  std::string bad = text;
  bad.replace(bad.find("precision: fp4"), 14, "precision: fp2");
  back = PlanFromYamlText(bad, "plan.yaml");
  ASSERT_FALSE(back.ok());
  EXPECT_THAT(back.status().message(), HasSubstr("layout.precision"));
  EXPECT_THAT(back.status().message(), HasSubstr("fp4"));
}

TEST(PlanRoundTripTest, RecomputeModules) {
  Plan p = SamplePlan();
  p.layout.recompute = Recompute::kSelective;
  p.layout.recompute_modules = kRecomputeMlp | kRecomputeLayernorm;
  const std::string text = PlanToYaml(p);
  EXPECT_NE(text.find("  recompute_modules: \"layernorm,mlp\""), std::string::npos) << text;
  Result<Plan> back = PlanFromYamlText(text, "plan.yaml");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->layout.recompute_modules, kRecomputeMlp | kRecomputeLayernorm);
  ExpectSamePlan(p, *back);
  std::string bad = text;
  bad.replace(bad.find("layernorm,mlp"), 13, "layernorm,mpl");
  back = PlanFromYamlText(bad, "plan.yaml");
  ASSERT_FALSE(back.ok());
  EXPECT_THAT(back.status().message(), HasSubstr("layout.recompute_modules"));
  EXPECT_THAT(back.status().message(), HasSubstr("'mpl'"));
  bad = text;
  bad.replace(bad.find("recompute: selective"), 20, "recompute: full     ");
  back = PlanFromYamlText(bad, "plan.yaml");
  ASSERT_FALSE(back.ok());
  EXPECT_THAT(back.status().message(), HasSubstr("needs recompute: selective"));
  // Without modules the key is left out, as before.
  p.layout.recompute_modules = 0;
  EXPECT_EQ(PlanToYaml(p).find("recompute_modules"), std::string::npos);
}

// CPU activation offloading: the plan key round-trips and is left out when unset.
TEST(PlanRoundTripTest, CpuOffloading) {
  Plan p = SamplePlan();
  p.layout.cpu_offload_layers = 12;
  // Megatron's rules on reading: the sample's pp 8 and selective recompute refuse it.
  Result<Plan> back = PlanFromYamlText(PlanToYaml(p), "plan.yaml");
  ASSERT_FALSE(back.ok());
  EXPECT_THAT(back.status().message(), HasSubstr("without pipeline parallelism (pp 8)"));
  Layout& l = p.layout;
  l.pp = 1; l.vp = 1; l.dp = 16;
  l.schedule = ScheduleKind::kOneFOneB;
  l.recompute = Recompute::kNone;
  const std::string text = PlanToYaml(p);
  EXPECT_NE(text.find("  cpu_offloading_num_layers: 12"), std::string::npos) << text;
  back = PlanFromYamlText(text, "plan.yaml");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->layout.cpu_offload_layers, 12);
  ExpectSamePlan(p, *back);
  p.layout.cpu_offload_layers = 0;
  EXPECT_EQ(PlanToYaml(p).find("cpu_offloading"), std::string::npos);
}

TEST(PlanRoundTripTest, ThroughAFile) {
  const Plan p = WithPrediction(SamplePlan());
  const std::string path = ::testing::TempDir() + "/plan_roundtrip.yaml";
  ASSERT_TRUE(WritePlanFile(p, path).ok());
  Result<Plan> back = LoadPlanFile(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
  ExpectSamePlan(p, *back);
}

// Strings are escaped on output: a '"' or '\' in the cluster name, cluster file or model
// name survives the round trip.
TEST(PlanRoundTripTest, StringsWithQuotesAndBackslashes) {
  Plan p = SamplePlan();
  p.cluster_file = "C:\\clusters\\dgx-a100.yaml";
  p.cluster_name = "lab \"A\" pod";
  p.model.name = "gpt3 \"175b\"";
  Result<Plan> back = PlanFromYamlText(PlanToYaml(p), "plan.yaml");
  ASSERT_TRUE(back.ok()) << back.status().message();
  ExpectSamePlan(p, *back);
}

// Replaces the first occurrence of `from` in the sample plan's YAML by `to`.
std::string Edited(const std::string& from, const std::string& to, bool prediction = false) {
  std::string text = PlanToYaml(prediction ? WithPrediction(SamplePlan()) : SamplePlan());
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

struct BadPlan {
  const char* label;
  std::string text;
  std::vector<std::string> in_message;
};

TEST(PlanErrorsTest, HandEditedPlans) {
  std::string no_layout = PlanToYaml(SamplePlan());
  no_layout = no_layout.substr(0, no_layout.find("layout:\n"));
  const BadPlan cases[] = {
      {"missing_layout", no_layout, {"layout"}},
      {"missing_model", Edited("model:\n", "modelx:\n"), {"'model'"}},
      {"unknown_top_key", Edited("ptdp_plan_version: 1\n", "ptdp_plan_version: 1\ncolor: red\n"),
       {":4:", "unknown key 'color'"}},
      {"unknown_layout_key", Edited("  tp: 8\n", "  tp: 8\n  zp: 2\n"),
       {"unknown key 'layout.zp'"}},
      // ep and etp are read (MoE plans), and checked against the model.
      {"ep_on_a_dense_model", Edited("  tp: 8\n", "  tp: 8\n  ep: 2\n"),
       {"plan.yaml", "illegal layout", "ep 2 on a model without experts"}},
      {"unknown_prediction_key", Edited("  mfu:", "  mfu_x: 1\n  mfu:", true),
       {"unknown key 'prediction.mfu_x'"}},
      // heads 96 % tp 5 (world 5*8*2 = 80 <= 128 GPUs, so only the heads rule breaks).
      {"illegal_layout", Edited("  tp: 8\n", "  tp: 5\n"),
       {"plan.yaml", "illegal layout", "heads 96 % tp 5"}},
      // B/(b d) = 512/2 = 256, the file says 100.
      {"num_microbatches", Edited("num_microbatches: 256", "num_microbatches: 100"),
       {"plan.yaml:", "layout.num_microbatches", "'100'", "256"}},
      // dp 4: 8 * 8 * 4 = 256 GPUs on a 16 x 8 = 128-GPU cluster. num_microbatches must
      // follow (512 / 4 = 128) so that only the GPU count is wrong.
      {"too_many_gpus",
       [] {
         std::string t = Edited("  dp: 2\n", "  dp: 4\n");
         return t.replace(t.find("num_microbatches: 256"), 21, "num_microbatches: 128");
       }(),
       {"needs 256 GPUs", "has 128"}},
      {"bad_version", Edited("ptdp_plan_version: 1", "ptdp_plan_version: 2"),
       {"ptdp_plan_version", "only version 1"}},
      {"bad_enum", Edited("recompute: selective", "recompute: some"),
       {"layout.recompute", "'some'"}},
      {"negative_prediction", Edited("  mfu: ", "  mfu: -", true),
       {"prediction.mfu", "is outside 0..1e+06"}},
      {"malformed", "cluster: [\n", {"plan.yaml", "malformed YAML"}},
      // The optimizer's dtypes: Megatron's choices per key, and its rules (SamplePlan has the
      // precision-aware optimizer on with fp16 masters).
      {"bad_optimizer_dtype", Edited("exp_avg_sq_dtype: fp8", "exp_avg_sq_dtype: int4"),
       {"layout.exp_avg_sq_dtype", "value 'int4' is not one of: fp32, fp16, bf16, fp8"}},
      {"bf16_masters", Edited("main_params_dtype: fp16", "main_params_dtype: bf16"),
       {"layout.main_params_dtype", "value 'bf16' is not one of: fp32, fp16"}},
      {"dtype_without_the_flag",
       Edited("  use_precision_aware_optimizer: true", "  use_precision_aware_optimizer: false"),
       {"illegal layout", "--main-params-dtype fp16 needs --use-precision-aware-optimizer"}},
  };
  for (const BadPlan& c : cases) {
    SCOPED_TRACE(c.label);
    Result<Plan> r = PlanFromYamlText(c.text, "plan.yaml");
    ASSERT_FALSE(r.ok());
    for (const std::string& piece : c.in_message)
      EXPECT_THAT(r.status().message(), HasSubstr(piece));
  }
}

// Every number of a plan is checked: step_time_s finite and positive, the other predictions
// finite and not negative, sizes within their limits. The message names file, key, value and
// range (core/limits.h).
TEST(PlanErrorsTest, ExtremeNumbersAreRefusedNamingKeyValueAndRange) {
  struct Case {
    const char* label;
    std::string from, to;
    std::vector<std::string> in_message;
  };
  const Case cases[] = {
      {"zero_step_time", "step_time_s: 12.345678901234567", "step_time_s: 0",
       {"prediction.step_time_s: '0' is outside 1e-12 s..1e+30 s"}},
      {"minus_zero_step_time", "step_time_s: 12.345678901234567", "step_time_s: -0",
       {"prediction.step_time_s: '-0' is outside"}},
      {"negative_step_time", "step_time_s: 12.345678901234567", "step_time_s: -1e308",
       {"prediction.step_time_s: '-1e308' is outside"}},
      {"huge_step_time", "step_time_s: 12.345678901234567", "step_time_s: 1e308",
       {"prediction.step_time_s: '1e308' is outside 1e-12 s..1e+30 s"}},
      {"denormal_step_time", "step_time_s: 12.345678901234567", "step_time_s: 4.9e-324",
       {"prediction.step_time_s: '4.9e-324' is outside"}},
      {"nan_step_time", "step_time_s: 12.345678901234567", "step_time_s: .nan",
       {"prediction.step_time_s: '.nan' is not a number"}},
      {"inf_step_time", "step_time_s: 12.345678901234567", "step_time_s: inf",
       {"prediction.step_time_s: 'inf' is not a number"}},
      {"hex_step_time", "step_time_s: 12.345678901234567", "step_time_s: 0x10",
       {"prediction.step_time_s: '0x10' is not a number"}},
      {"negative_breakdown", "    compute: ", "    compute: -",
       {"prediction.breakdown_s.compute: '-", "is outside 0 s..1e+30 s"}},
      {"huge_memory", "    total: ", "    total: 1e308 # was ",
       {"prediction.memory_bytes.total: '1e308' is outside 0 B..1e+30 B"}},
      {"bubble_fraction_above_1", "  bubble_fraction: ", "  bubble_fraction: 2 # was ",
       {"prediction.bubble_fraction: '2' is outside 0..1"}},
      {"stage_memory_inf", "stage_memory_bytes: [", "stage_memory_bytes: [.inf, ",
       {"prediction.stage_memory_bytes: '.inf' is not a number"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    Result<Plan> r = PlanFromYamlText(Edited(c.from, c.to, true), "plan.yaml");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().message().rfind("plan.yaml:", 0), 0u) << r.status().message();
    for (const std::string& piece : c.in_message)
      EXPECT_THAT(r.status().message(), HasSubstr(piece));
  }
  for (const auto& [from, to, piece] : std::vector<std::array<std::string, 3>>{
           {"  tp: 8\n", "  tp: 9223372036854775807\n", "layout.tp: '9223372036854775807' is larger than the limit 262144"},
           {"  tp: 8\n", "  tp: 0x7fffffff\n", "layout.tp: '0x7fffffff' is not an integer"},
           {"  nodes: 16\n", "  nodes: 2147483647\n", "cluster.nodes: '2147483647' is larger than the limit 262144"},
       }) {
    Result<Plan> r = PlanFromYamlText(Edited(from, to), "plan.yaml");
    ASSERT_FALSE(r.ok()) << to;
    EXPECT_THAT(r.status().message(), HasSubstr(piece));
  }
}

// Names of a plan (cluster name and file, model name) must be UTF-8 like every string read.
TEST(PlanErrorsTest, NonUtf8NamesAreRefusedNamingTheKey) {
  Plan p = SamplePlan();
  p.cluster_name = "pod\xff";
  Result<Plan> r = PlanFromYamlText(PlanToYaml(p), "plan.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("cluster.name: 'pod\\xff' is not valid UTF-8"));
  p = SamplePlan();
  p.model.name = "\xe2\x82";  // a truncated euro sign
  r = PlanFromYamlText(PlanToYaml(p), "plan.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("model.name: '\\xe2\\x82' is not valid UTF-8"));
}

// The plans `ptdp plan` writes (the fuzz seeds) are inside every range.
TEST(PlanRoundTripTest, EveryShippedPlanLoads) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(SourcePath("fuzz/seeds/plan"))) {
    Result<Plan> r = LoadPlanFile(e.path().string());
    EXPECT_TRUE(r.ok()) << r.status().message();
    ++n;
  }
  EXPECT_GE(n, 3);
}

// A stage_memory_bytes entry that is not a number is an error naming
// prediction.stage_memory_bytes, never a silent 0.
TEST(PlanErrorsTest, NonNumericStageMemoryIsAnError) {
  const std::string text = Edited("stage_memory_bytes: [", "stage_memory_bytes: [lots, ", true);
  Result<Plan> r = PlanFromYamlText(text, "plan.yaml");
  ASSERT_FALSE(r.ok()) << "'lots' was read as " << r->prediction.stage_memory_bytes[0];
  EXPECT_THAT(r.status().message(), HasSubstr("stage_memory_bytes"));
}

TEST(PlanErrorsTest, MissingFileNamesIt) {
  const std::string path = ::testing::TempDir() + "/no_such_plan.yaml";
  Result<Plan> r = LoadPlanFile(path);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr(path));
  EXPECT_THAT(r.status().message(), HasSubstr("cannot open"));
}

TEST(PlanErrorsTest, ErrorsFromAFileNameTheFile) {
  const std::string path = WriteTemp("bad_plan.yaml", Edited("  tp: 8\n", "  tp: 5\n"));
  Result<Plan> r = LoadPlanFile(path);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr(path));
}

TEST(PlanErrorsTest, TpAcrossNodesNeedsTheFlag) {
  // tp 16 on 8-GPU nodes: refused as written, accepted with allow_tp_across_nodes: true.
  std::string text = Edited("  tp: 8\n", "  tp: 16\n");
  text.replace(text.find("  pp: 8\n"), 8, "  pp: 4\n");  // 16 * 4 * 2 = 128 GPUs
  text.replace(text.find("  vp: 3\n"), 8, "  vp: 2\n");  // 96/4 = 24 layers, 24 % 2 == 0
  text.erase(text.find("  stage_layers:"), text.find("\n", text.find("  stage_layers:")) - text.find("  stage_layers:") + 1);
  Result<Plan> r = PlanFromYamlText(text, "plan.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("tp 16 spans NVLink domains"));
  text.replace(text.find("allow_tp_across_nodes: false"), 28, "allow_tp_across_nodes: true");
  r = PlanFromYamlText(text, "plan.yaml");
  EXPECT_TRUE(r.ok()) << r.status().message();
}

}  // namespace
}  // namespace ptdp
