// A user's clone or install, not our checkout: the ptdp binary finds its shipped configs and
// data relative to itself from any working directory (cli/paths.h), by name or by path, also
// after `cmake --install` to a prefix; `validate` runs on the shipped published data alone;
// and the small things a newcomer hits give clear answers (directories as files, unknown
// --emit values, --json with --emit, no legal layout).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/fakes/shell.h"

namespace {

const std::string kSrc = PTDP_SOURCE_DIR;
const std::string kBuild = PTDP_BINARY_DIR;
const std::string kBin = kBuild + "/ptdp";

using ptdp::testing::CmdResult;
using ptdp::testing::ExpectOneLineError;
using ptdp::testing::FreshDir;
using ptdp::testing::Shell;

// Runs ptdp in a fresh directory that holds nothing of the repository.
CmdResult PtdpElsewhere(const std::string& args, const std::string& dir = "") {
  const std::string where = dir.empty() ? FreshDir("elsewhere") : dir;
  return Shell("cd '" + where + "' && " + kBin + " " + args);
}

TEST(Standalone, ConfigsByNameFromAnyFolder) {
  const std::string dir = FreshDir("names");
  const CmdResult r = PtdpElsewhere(
      "plan --cluster dgx-a100 --model gpt3-175b --global-batch 1536 --top 1 --out p.yaml", dir);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("gpt3-175b (174.6B parameters, 174.6B active per token), sequence 2048\non dgx-a100"),
            std::string::npos) << r.out;
  // The plan records the name, so it works from yet another folder.
  std::ifstream in(dir + "/p.yaml");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("file: \"dgx-a100\""), std::string::npos) << text;
  const CmdResult s = PtdpElsewhere("simulate '" + dir + "/p.yaml'");
  EXPECT_EQ(s.code, 0) << s.out;
  EXPECT_EQ(PtdpElsewhere("topo --cluster local-cpu").code, 0);
}

TEST(Standalone, AFilePlanRecordsAnAbsolutePath) {
  const std::string dir = FreshDir("relpath");
  std::filesystem::copy_file(kSrc + "/configs/clusters/local-cpu.yaml", dir + "/mine.yaml");
  const CmdResult r = PtdpElsewhere(
      "plan --cluster mine.yaml --model gpt-tiny --gpus 2 --global-batch 8 --out p.yaml", dir);
  ASSERT_EQ(r.code, 0) << r.out;
  const CmdResult s = PtdpElsewhere("simulate '" + dir + "/p.yaml'");
  EXPECT_EQ(s.code, 0) << s.out;
}

TEST(Standalone, UnknownNameListsTheShippedOnes) {
  const CmdResult r = PtdpElsewhere("plan --cluster dgx-a1000 --model gpt3-175b --global-batch 8");
  ExpectOneLineError(r, "'dgx-a1000' is not a shipped cluster");
  EXPECT_NE(r.out.find("dgx-a100, dgx-b200, dgx-b300, dgx-h100"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gb200-nvl72, gb300-nvl72"), std::string::npos) << r.out;
  ExpectOneLineError(PtdpElsewhere("plan --cluster dgx-a100 --model gpt5 --global-batch 8"),
                     "'gpt5' is not a shipped model");
  // A value with '/' or ending in .yaml is a path: a missing one is named as a cluster file.
  ExpectOneLineError(PtdpElsewhere("plan --cluster dgx-a100.yaml --model gpt3-175b --global-batch 8"),
                     "dgx-a100.yaml: cannot open a cluster YAML: No such file or directory");
}

TEST(Standalone, ValidateRunsOnTheShippedData) {
  const CmdResult r = PtdpElsewhere("validate --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["groups"]["layer (A100)"]["rows"], 5);
  EXPECT_GE(j["groups"]["published (H100)"]["rows"].get<int>(), 60);
  EXPECT_FALSE(j["vtrain_included"].get<bool>());
  ASSERT_EQ(j["runs_files"].size(), 3u);
  const std::string runs = j["runs_files"][0], recipes = j["runs_files"][1],
                    moe = j["runs_files"][2];
  EXPECT_NE(runs.find("share/ptdp/data/published/runs.yaml"), std::string::npos) << runs;
  EXPECT_NE(recipes.find("share/ptdp/data/published/megatron_recipes.yaml"), std::string::npos);
  EXPECT_NE(moe.find("share/ptdp/data/published/megatron_moe.yaml"), std::string::npos);
  EXPECT_GE(j["groups"]["moe grok-1 (H100)"]["rows"].get<int>(), 30);
  EXPECT_GE(j["rows"].size(), 250u);
  const CmdResult text = PtdpElsewhere("validate");
  EXPECT_NE(text.out.find("give --data DIR with DIR/vtrain_single_node/measured.csv"),
            std::string::npos) << text.out;
  ExpectOneLineError(PtdpElsewhere("validate --data /nonexistent"),
                     "/nonexistent/vtrain_single_node/measured.csv");
}

// Issue 13's validation by source: `sources` [{source, gpu, rows, mean_abs_pct, max_abs_pct,
// bias_pct}], `constants_at_bound`, and with --leave-one-source-out the same per source
// predicted by constants fitted without it.
TEST(Standalone, ValidateReportsEachSourceAndLeavesEachOut) {
  // The smaller shipped file keeps the 5 fits short (all shipped runs: 12 fits of ~118 rows).
  const std::string runs = " --runs " + kBuild + "/share/ptdp/data/published/runs.yaml";
  const CmdResult r = PtdpElsewhere("validate --json --leave-one-source-out" + runs);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j["sources"].is_array());
  ASSERT_GE(j["sources"].size(), 4u);
  size_t rows = 0;
  for (const auto& s : j["sources"]) {
    for (const char* k : {"source", "gpu", "rows", "mean_abs_pct", "max_abs_pct", "bias_pct"})
      EXPECT_TRUE(s.contains(k)) << k << " in " << s.dump();
    EXPECT_LE(std::fabs(s["bias_pct"].get<double>()), s["mean_abs_pct"].get<double>() + 1e-9);
    rows += s["rows"].get<size_t>();
  }
  EXPECT_EQ(rows, j["groups"]["layer (A100)"]["rows"].get<size_t>() +
                      j["groups"]["published (H100)"]["rows"].get<size_t>());
  ASSERT_EQ(j["leave_one_source_out"].size(), j["sources"].size());
  for (const auto& h : j["leave_one_source_out"]) {
    EXPECT_TRUE(h.contains("fitted_on_rows") && h.contains("constants")) << h.dump();
    EXPECT_TRUE(h.contains("bias_pct"));
  }
  EXPECT_TRUE(j["constants_at_bound"].is_array());
  const CmdResult text = PtdpElsewhere("validate --leave-one-source-out" + runs);
  EXPECT_NE(text.out.find("by source (bias: mean signed error"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("leave one source out"), std::string::npos);
  EXPECT_NE(text.out.find("constants on a bound of their fit range"), std::string::npos);
  ExpectOneLineError(PtdpElsewhere("validate --fit-sets /nonexistent.yaml"), "/nonexistent.yaml");
}

// `cmake --install` puts bin/ptdp and share/ptdp under a prefix; the installed binary finds its
// configs and data there, with the build tree gone from its view (run from another folder).
TEST(Standalone, InstalledBinaryFindsItsFiles) {
  const std::string prefix = std::filesystem::path(FreshDir("prefix")).lexically_normal().string();
  const CmdResult inst = Shell("cmake --install '" + kBuild + "' --prefix '" + prefix + "'");
  ASSERT_EQ(inst.code, 0) << inst.out;
  const std::string bin = prefix + "/bin/ptdp";
  ASSERT_TRUE(std::filesystem::exists(bin)) << inst.out;
  EXPECT_TRUE(std::filesystem::exists(prefix + "/share/ptdp/configs/clusters/dgx-a100.yaml"));
  EXPECT_TRUE(std::filesystem::exists(prefix + "/share/ptdp/data/published/runs.yaml"));
  const std::string dir = FreshDir("installed-run");
  const CmdResult r = Shell("cd '" + dir + "' && '" + bin +
                            "' plan --cluster local-cpu --model gpt-tiny --gpus 1 "
                            "--global-batch 8 --out p.yaml");
  ASSERT_EQ(r.code, 0) << r.out;
  const CmdResult v = Shell("cd '" + dir + "' && '" + bin + "' validate --json");
  ASSERT_EQ(v.code, 0) << v.out;
  const nlohmann::json validated = nlohmann::json::parse(v.out);  // outlives the loop
  for (const auto& file : validated["runs_files"]) {
    const std::string runs = file;
    EXPECT_EQ(runs.rfind(prefix, 0), 0u) << runs << " is not under " << prefix;
  }
  // Training reads the installed corpus by default.
  const CmdResult t = Shell("cd '" + dir + "' && '" + bin + "' train p.yaml --steps 1");
  EXPECT_EQ(t.code, 0) << t.out;
}

// A build carried to another machine (the GPU check carries the CUDA build to a lent GPU) works
// there: no binary that ships or benchmarks holds this checkout's path (configs and data are
// found from the binary's own path; __FILE__ is mapped relative to the source tree).
TEST(Standalone, BinariesHoldNoPathOfTheCheckout) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer build's diagnostics name their source files by path (GCC does "
                  "not map them); such builds are not shipped";
#endif
  namespace fs = std::filesystem;
  std::vector<fs::path> binaries = {kBin};
  for (const char* dir : {"/bench", "/lib/ptdp"}) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(kBuild + dir, ec))
      if (e.is_regular_file()) binaries.push_back(e.path());
  }
  const std::string needle = kSrc + "/";
  for (const fs::path& b : binaries) {
    std::ifstream in(b, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (b != fs::path(kBin) && bytes.rfind("\x7f" "ELF", 0) != 0) continue;  // binaries only
    ASSERT_FALSE(bytes.empty()) << b;
    EXPECT_EQ(bytes.find(needle), std::string::npos) << b << " holds " << needle;
  }
}

TEST(Standalone, DirectoriesAreNamedAsSuch) {
  const std::string dir = FreshDir("dirs");
  ExpectOneLineError(PtdpElsewhere("simulate '" + dir + "'"), "is a directory, not a plan.yaml");
  const CmdResult p = PtdpElsewhere(
      "plan --cluster local-cpu --model gpt-tiny --gpus 1 --global-batch 8 --out p.yaml", dir);
  ASSERT_EQ(p.code, 0) << p.out;
  ExpectOneLineError(PtdpElsewhere("train '" + dir + "/p.yaml' --corpus '" + dir + "' --steps 1"),
                     "is a directory, not a corpus");
  ExpectOneLineError(PtdpElsewhere("compare '" + dir + "/p.yaml' '" + dir + "'"),
                     "is a directory, not a measured.json");
  ExpectOneLineError(PtdpElsewhere("plan --cluster '" + dir + "/' --model gpt-tiny --global-batch 8"),
                     "is a directory");
}

TEST(Standalone, HfFolderReadsItsConfigJson) {
  const std::string dir = FreshDir("hf");
  std::filesystem::copy_file(kSrc + "/tests/data/hf/llama.json", dir + "/config.json");
  const CmdResult a = PtdpElsewhere("plan --cluster dgx-a100 --model 'hf:" + dir +
                                    "' --global-batch 64 --top 1 --json");
  const CmdResult b = PtdpElsewhere("plan --cluster dgx-a100 --model 'hf:" + dir +
                                    "/config.json' --global-batch 64 --top 1 --json");
  ASSERT_EQ(a.code, 0) << a.out;
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_EQ(nlohmann::json::parse(a.out)["plans"], nlohmann::json::parse(b.out)["plans"]);
  ExpectOneLineError(PtdpElsewhere("plan --cluster dgx-a100 --model 'hf:" + FreshDir("empty") +
                                   "' --global-batch 64"),
                     "config.json: cannot open a Hugging Face config.json");
}

// An imported config's sequence length is a stated default: the header and --json say so, and
// --seq-len replaces it and the note; an unmodelled architecture is one line naming the key.
TEST(Standalone, HfImportStatesItsSequenceLength) {
  const std::string model = "--model 'hf:" + kSrc + "/tests/data/hf/Mixtral-8x7B-v0.1.json'";
  const CmdResult a = PtdpElsewhere("plan --cluster dgx-h100 " + model + " --gpus 64 --global-batch 512 --top 1");
  ASSERT_EQ(a.code, 0) << a.out;
  EXPECT_NE(a.out.find("Mixtral-8x7B-v0.1 (46.7B parameters, 12.9B active per token), sequence 4096 "
                       "(default for an imported config; max_position_embeddings 32768 is the "
                       "context limit, not the training length; --seq-len sets it)"),
            std::string::npos) << a.out;
  const CmdResult j = PtdpElsewhere("plan --cluster dgx-h100 " + model + " --gpus 64 --global-batch 512 --top 1 --json");
  ASSERT_EQ(j.code, 0) << j.out;
  const nlohmann::json doc = nlohmann::json::parse(j.out);
  EXPECT_EQ(doc["seq_len"], 4096);
  EXPECT_NE(doc["seq_len_note"].get<std::string>().find("--seq-len sets it"), std::string::npos);
  EXPECT_EQ(doc["params_total"], 46702792704);
  const CmdResult s = PtdpElsewhere("plan --cluster dgx-h100 " + model + " --gpus 64 --global-batch 512 --top 1 --seq-len 2048 --json");
  ASSERT_EQ(s.code, 0) << s.out;
  EXPECT_EQ(nlohmann::json::parse(s.out)["seq_len"], 2048);
  EXPECT_FALSE(nlohmann::json::parse(s.out).contains("seq_len_note"));
  ExpectOneLineError(PtdpElsewhere("plan --cluster dgx-h100 --model 'hf:" + kSrc +
                                   "/tests/data/hf/Qwen3-Next-80B-A3B-Instruct.json' --global-batch 64"),
                     "key 'model_type' = \"qwen3_next\": Gated DeltaNet (linear-attention) layers");
  // A Nemotron-H hybrid imports and plans: Mamba-2, attention and MLP layers.
  const CmdResult h = PtdpElsewhere("plan --cluster dgx-h100 --model 'hf:" + kSrc +
                                    "/tests/data/hf/Nemotron-H-8B-Base-8K.json' --gpus 8 "
                                    "--global-batch 64 --top 1 --json");
  ASSERT_EQ(h.code, 0) << h.out;
  EXPECT_EQ(nlohmann::json::parse(h.out)["seq_len"], 8192);
}

TEST(Standalone, EmitTakesOnlyWhatItKnows) {
  const std::string plan = "plan --cluster dgx-a100 --model gpt3-175b --global-batch 1536 --top 1";
  const CmdResult bad = PtdpElsewhere(plan + " --emit deepspeed");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("'deepspeed' is not a launcher ptdp writes; expected: megatron"),
            std::string::npos) << bad.out;
  // With --json the command is a field, and the output stays one JSON document.
  const CmdResult j = Shell("cd /tmp && " + kBin + " " + plan + " --emit megatron --json", false);
  ASSERT_EQ(j.code, 0) << j.out;
  const auto doc = nlohmann::json::parse(j.out);  // throws (fails the test) on trailing text
  const std::string cmd = doc["megatron_command"];
  EXPECT_NE(cmd.find("--tensor-model-parallel-size 8"), std::string::npos) << cmd;
}

TEST(Standalone, NoLegalLayoutSaysSoWithTheReasons) {
  // 5 GPUs, B 7, micro-batch 2: 96 heads are not divisible by 5, 7 is not divisible by 2*dp,
  // 96 layers not by 5 (nor 98 or 97 with the embedding/loss in the split; the first/last-stage
  // splits and the balanced layout strings at pp 5 break the batch rule; cp 5 does not split
  // 2048 in 10): nothing is legal (the dp 1 layouts without a distributed-optimizer twin).
  const CmdResult r = PtdpElsewhere(
      "plan --cluster dgx-a100 --model gpt3-175b --global-batch 7 --gpus 5 --micro-batch 2");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("no layout is legal"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("smallest are"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("heads_not_divisible_by_tp"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ptdp: no legal layout among 270 (global_batch_not_divisible_by_mb_x_dp 120, "
                       "heads_not_divisible_by_tp 72, seq_len_not_divisible_by_2cp 72"),
            std::string::npos) << r.out;
}

}  // namespace
