// Extreme numbers and non-UTF-8 names end to end on the real binary: `plan`, `simulate`,
// `topo`, `compare` and `train` (with --json where it has one) exit non-zero with a one-line
// message naming the file, key, value and range (core/limits.h), never 0 with a null, an inf
// or a NaN in the output; a crafted checkpoint with a negative min_lr is refused on --resume.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "cli/common.h"
#include "runtime/checkpoint.h"
#include "tests/fakes/shell.h"

namespace {

namespace fs = std::filesystem;
using ptdp::testing::CmdResult;
using ptdp::testing::ExpectOneLineError;

const std::string kSrc = PTDP_SOURCE_DIR;
const std::string kBin = std::string(PTDP_BINARY_DIR) + "/ptdp";
const std::string kA100 = kSrc + "/configs/clusters/dgx-a100.yaml";
const std::string kCpu = kSrc + "/configs/clusters/local-cpu.yaml";
const std::string kTiny = kSrc + "/configs/models/gpt-tiny.yaml";
const std::string kTmp = ::testing::TempDir() + "/extreme_" + std::to_string(getpid());

struct RemoveTmpAtExit {
  ~RemoveTmpAtExit() { fs::remove_all(kTmp); }
} remove_tmp_at_exit;

CmdResult Ptdp(const std::string& args) { return ptdp::testing::Shell(kBin + " " + args); }

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string Write(const std::string& name, const std::string& text) {
  fs::create_directories(kTmp);
  const std::string path = kTmp + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// `file` with the first `from` replaced by `to`, written as `name`.
std::string Edited(const std::string& file, const std::string& from, const std::string& to,
                   const std::string& name) {
  std::string text = Slurp(file);
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return Write(name, text);
}

struct Case {
  const char* what;
  std::string from, to;  // in dgx-a100.yaml
  std::string message;   // the key and the range
};

// Every kind of quantity of a cluster, through plan --json and simulate --json.
TEST(ExtremeInputs, ClusterQuantitiesAreRefusedByPlanAndSimulate) {
  const Case cases[] = {
      {"memory 1e308 GiB", "memory: 80 GiB", "memory: 1e308 GiB",
       "gpu.memory: \"1e308 GiB\" overflows once converted to SI units"},
      {"denormal HBM bandwidth", "hbm_bandwidth: 2039 GB/s", "hbm_bandwidth: 4.9e-324 GB/s",
       "gpu.hbm_bandwidth: '4.9e-324 GB/s' is outside 1 MB/s..1 PB/s"},
      {"oversubscription inf", "oversubscription: 1", "oversubscription: .inf",
       "inter_node.oversubscription: '.inf' is not a number"},
      {"oversubscription 1e308", "oversubscription: 1", "oversubscription: 1e308",
       "inter_node.oversubscription: '1e308' is outside 1..1000"},
      {"peak 1e-320", "bf16: 312 TFLOP/s", "bf16: 1e-320 TFLOP/s",
       "gpu.peak.bf16: '1e-320 TFLOP/s' is outside 1 MFLOP/s..1 EFLOP/s"},
      {"latency of an hour", "latency: 5 us", "latency: 3600 s",
       "inter_node.latency: '3600 s' is outside 0 or 1 ns..1 s"},
      {"nodes 9223372036854775807", "nodes: 128", "nodes: 9223372036854775807",
       "nodes: '9223372036854775807' is larger than the limit 262144"},
  };
  int n = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string cluster = Edited(kA100, c.from, c.to, "c" + std::to_string(n++) + ".yaml");
    ExpectOneLineError(Ptdp("plan --cluster " + cluster + " --model " + kTiny +
                            " --global-batch 8 --json"),
                       cluster + ":");
    ExpectOneLineError(Ptdp("plan --cluster " + cluster + " --model " + kTiny +
                            " --global-batch 8 --json"),
                       c.message);
    ExpectOneLineError(Ptdp("simulate --cluster " + cluster + " --model " + kTiny +
                            " --global-batch 8 --tp 1 --pp 1 --dp 8 --json"),
                       c.message);
  }
}

// Names that are not UTF-8 broke every --json output with an internal error; now the input is
// refused naming the file and key, the bad byte escaped.
TEST(ExtremeInputs, NonUtf8NamesAreRefusedAtInput) {
  const std::string cluster =
      Edited(kCpu, "name: cpu-rank-slot", "name: \"cpu\xff\"", "utf8_cluster.yaml");
  ExpectOneLineError(Ptdp("plan --cluster " + cluster + " --model " + kTiny +
                          " --global-batch 8 --json"),
                     cluster + ":10: gpu.name: 'cpu\\xff' is not valid UTF-8");
  ExpectOneLineError(Ptdp("topo --cluster " + cluster + " --json"), "gpu.name");
  const std::string model = Write("utf8_model.yaml", "name: \"tiny\xc3\"\n" + Slurp(kTiny).substr(
                                                         Slurp(kTiny).find("layers:")));
  ExpectOneLineError(Ptdp("simulate --cluster " + kCpu + " --model " + model +
                          " --global-batch 8 --tp 1 --pp 1 --dp 1 --gpus 1 --json"),
                     model + ":1: name: 'tiny\\xc3' is not valid UTF-8");
}

// A plan whose prediction was edited to NaN, inf or 0: simulate and compare refuse it.
TEST(ExtremeInputs, PlanNumbersAreRefusedBySimulate) {
  const std::string plan = kTmp + "/tiny.plan.yaml";
  fs::create_directories(kTmp);
  const CmdResult p = Ptdp("plan --cluster " + kCpu + " --model " + kTiny +
                           " --gpus 1 --global-batch 8 --refine 0 --out " + plan);
  ASSERT_EQ(p.code, 0) << p.out;
  const std::string text = Slurp(plan);
  const size_t at = text.find("step_time_s: ");
  ASSERT_NE(at, std::string::npos);
  const size_t end = text.find('\n', at);
  int n = 0;
  for (const std::string v : {".nan", "0", "-1", "1e308", "4.9e-324"}) {
    SCOPED_TRACE(v);
    std::string t = text;
    t.replace(at, end - at, "step_time_s: " + v);
    const std::string edited = Write("p" + std::to_string(n++) + ".plan.yaml", t);
    ExpectOneLineError(Ptdp("simulate " + edited + " --json"), "prediction.step_time_s: '" + v);
  }
}

// measured.json with a negative or out-of-range time: compare refuses it naming the number.
TEST(ExtremeInputs, MeasuredJsonTimesAreRefusedByCompare) {
  const std::string plan = kTmp + "/cmp.plan.yaml";
  fs::create_directories(kTmp);
  const CmdResult p = Ptdp("plan --cluster " + kCpu + " --model " + kTiny +
                           " --gpus 1 --global-batch 8 --refine 0 --out " + plan);
  ASSERT_EQ(p.code, 0) << p.out;
  const std::string measured = kTmp + "/measured.json";
  const CmdResult t = Ptdp("train " + plan + " --steps 2 --no-speed-probe --out " + measured);
  ASSERT_EQ(t.code, 0) << t.out;
  ASSERT_EQ(Ptdp("compare " + plan + " " + measured + " --json").code, 0);
  const nlohmann::json good = nlohmann::json::parse(Slurp(measured));
  struct Edit {
    const char* what;
    nlohmann::json::json_pointer at;
    double value;
    std::string message;
  };
  const Edit edits[] = {
      {"negative step", nlohmann::json::json_pointer("/timing/step_time_median_s"), -1,
       "timing: step_time_median_s: -1 is outside 1 ns..1e+09 s"},
      {"zero step", nlohmann::json::json_pointer("/timing/step_time_median_s"), 0,
       "step_time_median_s: 0 is outside"},
      {"huge phase", nlohmann::json::json_pointer("/timing/ranks/0/forward_s"), 1e308,
       "rank 0: forward_s: 1e+308 is outside 0 s..1e+09 s"},
      {"negative phase", nlohmann::json::json_pointer("/timing/ranks/0/dp_comm_s"), -0.5,
       "rank 0: dp_comm_s: -0.5 is outside"},
  };
  for (const Edit& e : edits) {
    SCOPED_TRACE(e.what);
    nlohmann::json j = good;
    ASSERT_TRUE(j.contains(e.at)) << e.at.to_string();
    j[e.at] = e.value;
    const std::string path = Write("measured_edited.json", j.dump(2));
    ExpectOneLineError(Ptdp("compare " + plan + " " + path + " --json"), path + ": ");
    ExpectOneLineError(Ptdp("compare " + plan + " " + path + " --json"), e.message);
  }
  // JSON has no NaN: a hand-written one is malformed, refused naming the file.
  std::string text = Slurp(measured);
  const size_t at = text.find("\"step_time_median_s\": ");
  ASSERT_NE(at, std::string::npos);
  text.insert(at + 22, "NaN, \"x\": ");
  const std::string nan = Write("measured_nan.json", text);
  ExpectOneLineError(Ptdp("compare " + plan + " " + nan + " --json"), nan + ": ");
}

// A crafted checkpoint with a negative min_lr trained with a negative learning rate; --resume
// now refuses it naming the file and the setting. Flags that set the optimizer are checked by
// the same function.
TEST(ExtremeInputs, OptimizerSettingsOfACheckpointAndFlagsAreChecked) {
  const std::string plan = kTmp + "/train.plan.yaml";
  fs::create_directories(kTmp);
  const CmdResult p = Ptdp("plan --cluster " + kCpu + " --model " + kTiny +
                           " --gpus 1 --global-batch 8 --refine 0 --out " + plan);
  ASSERT_EQ(p.code, 0) << p.out;
  const std::string dir = kTmp + "/ckpt";
  fs::remove_all(dir);
  const CmdResult t = Ptdp("train " + plan + " --steps 1 --checkpoint-dir " + dir);
  ASSERT_EQ(t.code, 0) << t.out;
  const std::string file = dir + "/" + ptdp::rt::CheckpointFileName(1);
  auto ckpt = ptdp::rt::ReadCheckpoint(file);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  for (const auto& [key, value, message] :
       std::vector<std::tuple<std::string, double, std::string>>{
           {"min_lr", -1e-4, "optimizer.min_lr: -0.0001 is outside 0..1"},
           {"lr", 1e300, "optimizer.lr: 1e+300 is outside 1e-12..1"},
           {"beta2", 1, "optimizer.beta2: 1 is outside 0..1 (1 excluded)"},
           {"eps", 4.9e-324, "optimizer.eps: 5e-324 is outside 1e-30..1"},
           {"weight_decay", -0.1, "optimizer.weight_decay: -0.1 is outside 0..100"},
           {"clip_grad", -1, "optimizer.clip_grad: -1 is outside 0..1e+09"},
       }) {
    SCOPED_TRACE(key);
    ptdp::rt::Checkpoint c = *ckpt;
    c.optimizer[key] = value;
    ASSERT_TRUE(ptdp::rt::WriteCheckpoint(file, c).ok());
    const CmdResult r = Ptdp("train " + plan + " --steps 3 --checkpoint-dir " + dir + " --resume");
    EXPECT_NE(r.code, 0) << r.out;
    // stderr's error line comes before the buffered stdout ("loaded ...") in the pipe.
    EXPECT_NE(r.out.find("ptdp: " + file + ": " + message + "\n"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("loss"), std::string::npos) << "trained: " << r.out;
  }
  // min_lr above lr.
  ptdp::rt::Checkpoint c = *ckpt;
  c.optimizer["min_lr"] = 2 * c.optimizer["lr"];
  ASSERT_TRUE(ptdp::rt::WriteCheckpoint(file, c).ok());
  const CmdResult r = Ptdp("train " + plan + " --steps 3 --checkpoint-dir " + dir + " --resume");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("optimizer.min_lr (at most lr): 0.002 is outside 0..0.001"), std::string::npos)
      << r.out;
  // The flags: the same check.
  ExpectOneLineError(Ptdp("train " + plan + " --steps 3 --warmup 2000000000"),
                     "optimizer.warmup_steps: 2000000000 is outside 0..1000000000");
  ExpectOneLineError(Ptdp("train " + plan + " --steps 3 --lr nan"), "--lr");
}

// What is not refused at input (a hostname, a path from the command line) may still not be
// UTF-8: every JSON output goes through DumpJson, which replaces the bad bytes with U+FFFD
// instead of throwing (nlohmann's strict default throws type_error 316).
TEST(ExtremeInputs, DumpJsonNeverThrows) {
  const nlohmann::json j = {{"host", "lab\xff" "box"}, {"n", 1}};
  EXPECT_THROW(j.dump(), nlohmann::json::type_error);
  std::string text;
  EXPECT_NO_THROW(text = ptdp::cli::DumpJson(j));
  EXPECT_NE(text.find("lab\xef\xbf\xbd" "box"), std::string::npos) << text;
  EXPECT_EQ(ptdp::cli::DumpJson(j, -1), "{\"host\":\"lab\xef\xbf\xbd" "box\",\"n\":1}");
}

}  // namespace
