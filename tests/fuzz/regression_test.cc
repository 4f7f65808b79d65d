// The fuzz targets' bodies (fuzz/targets.h) in the ordinary test suite: every finding the
// fuzzers made (fuzz/regressions/<target>/) is now refused with a message, and the seeds the
// fuzzers start from are accepted. Under `make test-asan` this replays the findings with the
// sanitizers that found them.
#include "fuzz/targets.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

namespace ptdp::fuzz {
namespace {

namespace fs = std::filesystem;
const std::string kSrc = PTDP_SOURCE_DIR;

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

Status RunTarget(const std::string& target, const std::string& text) {
  if (target == "cluster") return FuzzCluster(text);
  if (target == "model") return FuzzModel(text);
  if (target == "plan") return FuzzPlan(text);
  if (target == "hf_config") return FuzzHfConfig(text);
  if (target == "layout_flags") return FuzzLayoutFlags(text);
  if (target == "checkpoint") return FuzzCheckpoint(text);
  ADD_FAILURE() << "no target " << target;
  return Status::Ok();
}

struct Finding {
  const char* target;
  const char* file;    // in fuzz/regressions/<target>/
  const char* expect;  // in the error message now
  const char* was;     // what the fuzzer found before the fix
};

const Finding kFindings[] = {
    {"model", "hidden_overflow.yaml", "fuzz.yaml:3: layers: missing required key",
     "UBSan: signed overflow in 4 * hidden (the default ffn_hidden), core/model.cc"},
    // Found by reading the readers while fixing the above; the old fuzz binaries report each
    // (UBSan) or misread it silently (truncation).
    {"plan", "tp_truncated.plan.yaml", "layout.tp: '4294967298' is larger than the limit 262144",
     "tp read as int64 and cast to int: 4294967298 became tp 2, silently"},
    {"plan", "world_overflow.plan.yaml", "65536 nodes x 65536 GPUs is above the 262144-GPU limit",
     "UBSan: signed overflow in nodes * gpus_per_node, core/plan.cc"},
    {"plan", "layout_overflow.plan.yaml", "tp*cp*pp*dp is above the 262144-rank limit",
     "UBSan: signed overflow in Layout::world(), core/layout.h"},
    {"cluster", "world_overflow.yaml", "100000 nodes x 100000 GPUs is above the 262144-GPU limit",
     "UBSan: signed overflow in ClusterSpec::world(), topology/cluster.h"},
    {"cluster", "link_index_truncated.yaml", "links[0].b: '4294967297' is larger than the limit",
     "link GPU index cast to int: 4294967297 became GPU 1, silently"},
    {"cluster", "gemm_eff_zero.yaml", "calibration.gemm_eff_max = 0: must be in (0, 1]",
     "gemm_eff_max '0.e8002' read as 0: every GEMM infinite, the planner's estimate not finite"},
    {"cluster", "calibration_key_nul.yaml", "calibration: 'attentio\\x00n_eff' is not a constant's name",
     "a calibration key with a NUL byte written back raw: ClusterToYaml's output unparsable"},
    {"layout_flags", "tp_pp_cp_overflow.txt", "divide the world size",
     "UBSan: signed overflow in tp * pp * cp, cli/common.cc LayoutFromFlags"},
    {"layout_flags", "dp_given_overflow.txt", "divide the world size",
     "UBSan: signed overflow in tp * pp * cp, cli/common.cc LayoutFromFlags"},
};

TEST(FuzzRegressions, EveryFindingIsRefusedWithAMessage) {
  for (const Finding& f : kFindings) {
    SCOPED_TRACE(std::string(f.target) + "/" + f.file + " (was: " + f.was + ")");
    const Status st = RunTarget(f.target, Read(kSrc + "/fuzz/regressions/" + f.target + "/" + f.file));
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find(f.expect), std::string::npos) << st.message();
  }
}

TEST(FuzzRegressions, EverySavedFindingIsListed) {
  std::set<std::string> listed;
  for (const Finding& f : kFindings) listed.insert(std::string(f.target) + "/" + f.file);
  for (const auto& dir : fs::directory_iterator(kSrc + "/fuzz/regressions"))
    for (const auto& file : fs::directory_iterator(dir.path())) {
      const std::string name = dir.path().filename().string() + "/" + file.path().filename().string();
      EXPECT_TRUE(listed.count(name)) << name << " is not in kFindings";
    }
}

// The fuzzers' seeds: everything shipped is accepted by the target bodies.
TEST(FuzzTargets, AcceptTheSeeds) {
  const std::vector<std::pair<std::string, std::string>> seeds = {
      {"cluster", "configs/clusters"}, {"model", "configs/models"}, {"plan", "fuzz/seeds/plan"},
      {"layout_flags", "fuzz/seeds/layout_flags"}, {"checkpoint", "fuzz/seeds/checkpoint"}};
  for (const auto& [target, dir] : seeds)
    for (const auto& file : fs::directory_iterator(kSrc + "/" + dir)) {
      SCOPED_TRACE(file.path().string());
      const Status st = RunTarget(target, Read(file.path().string()));
      EXPECT_TRUE(st.ok()) << st.message();
    }
  // Every Hugging Face fixture (the hf_config fuzzer's seeds) but the ones made to be refused.
  const std::set<std::string> refused = {"malformed.json", "missing_heads.json", "bad_type.json",
                                         "Qwen3-Next-80B-A3B-Instruct.json"};
  for (const auto& file : fs::directory_iterator(kSrc + "/tests/data/hf")) {
    const std::string name = file.path().filename().string();
    if (file.path().extension() != ".json") continue;
    const Status st = FuzzHfConfig(Read(file.path().string()));
    EXPECT_EQ(st.ok(), !refused.count(name)) << name << ": " << st.message();
  }
}

}  // namespace
}  // namespace ptdp::fuzz
