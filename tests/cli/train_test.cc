// `ptdp train` end to end on the CPU backend: a plan from `ptdp plan --out` trains, prints a
// line per step and writes measured.json with the documented keys; plans the runtime cannot
// honour are refused with one line.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/fakes/shell.h"

namespace {

using ptdp::testing::CmdResult;

const std::string kSrc = PTDP_SOURCE_DIR;
const std::string kBin = std::string(PTDP_BINARY_DIR) + "/ptdp";
const std::string kCpu = kSrc + "/configs/clusters/local-cpu.yaml";
const std::string kTiny = kSrc + "/configs/models/gpt-tiny.yaml";

CmdResult Ptdp(const std::string& args) { return ptdp::testing::Shell(kBin + " " + args); }

// A plan for gpt-tiny with a fixed layout on `gpus` CPU rank slots.
std::string MakePlan(const std::string& name, const std::string& layout_flags, int gpus) {
  const std::string path = ::testing::TempDir() + "/" + name + ".plan.yaml";
  const CmdResult r = Ptdp("plan --cluster " + kCpu + " --model " + kTiny + " --gpus " +
                           std::to_string(gpus) + " --global-batch 8 " + layout_flags +
                           " --refine 0 --out " + path);
  EXPECT_EQ(r.code, 0) << r.out;
  return path;
}

TEST(Train, WritesMeasuredJson) {
  const std::string plan = MakePlan("tp2pp2", "--tp 2 --pp 2 --micro-batch 2", 4);
  const std::string out = ::testing::TempDir() + "/measured.json";
  const CmdResult r = Ptdp("train " + plan + " --backend cpu --steps 2 --out " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step    2/2 | loss"), std::string::npos) << r.out;
  std::ifstream in(out);
  const auto j = nlohmann::json::parse(in);
  ASSERT_EQ(j["steps"].size(), 2u);
  for (const char* k : {"step", "loss", "grad_norm", "lr", "step_time_s", "tokens_per_s"})
    EXPECT_TRUE(j["steps"][0].contains(k)) << k;
  ASSERT_EQ(j["ranks"].size(), 4u);
  for (const char* k : {"forward_s", "backward_s", "tp_comm_s", "pp_wait_s", "dp_comm_s",
                        "optimizer_s", "idle_s", "peak_memory_bytes"})
    EXPECT_TRUE(j["ranks"][0].contains(k)) << k;
  EXPECT_EQ(j["layout"]["tp"], 2);
  EXPECT_EQ(j["layout"]["pp"], 2);
  EXPECT_TRUE(j["machine"].contains("cores"));
  // Byte-level model at init: the loss is near log(256) = 5.55.
  EXPECT_NEAR(j["steps"][0]["loss"].get<double>(), 5.55, 0.3);
}

TEST(Train, RefusesWhatItCannotHonour) {
  const std::string plan = MakePlan("dp4", "--dp 4", 4);
  CmdResult r = Ptdp("train " + plan + " --backend cpu --max-ranks 2 --steps 1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--max-ranks 2"), std::string::npos) << r.out;
  // Where CUDA cannot run (not compiled in, or no GPU as on the build machine), --backend cuda
  // is refused with the reason; with a GPU, the 4 ranks share it or get one GPU each.
  const auto info = nlohmann::json::parse(Ptdp("info --json").out);
  if (info["gpus_visible"].get<int>() == 0) {
    r = Ptdp("train " + plan + " --backend cuda --steps 1");
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.out.find("--backend cuda: "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(info["cuda_compiled"] == true ? "no CUDA GPU is usable" : "without the CUDA backend"),
              std::string::npos) << r.out;
  }
  r = Ptdp("train " + plan + " --backend tpu --steps 1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--backend 'tpu'"), std::string::npos) << r.out;
  r = Ptdp("train " + plan + " --steps 0");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--steps 0"), std::string::npos) << r.out;
  r = Ptdp("train /nonexistent.plan.yaml");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("/nonexistent.plan.yaml"), std::string::npos) << r.out;
  r = Ptdp("train " + plan + " --corpus /nonexistent.txt --steps 1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("/nonexistent.txt"), std::string::npos) << r.out;
}

// --grad-reduce-in-bf16 end to end: a bf16 plan (made for H100s, rehearsed on CPU rank threads)
// trains with its gradients reduced in bf16 and says so; --fp32-activations (no bf16 training)
// cannot honour it and is refused with one line.
TEST(Train, GradReduceInBf16PlanTrainsAndSaysSo) {
  const std::string path = ::testing::TempDir() + "/grad-bf16.plan.yaml";
  CmdResult r = Ptdp("plan --cluster " + kSrc + "/configs/clusters/dgx-h100.yaml --model " + kTiny +
                     " --gpus 2 --dp 2 --global-batch 8 --micro-batch 2 --grad-reduce-in-bf16 "
                     "--refine 0 --out " + path);
  ASSERT_EQ(r.code, 0) << r.out;
  r = Ptdp("train " + path + " --backend cpu --steps 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("[grad-bf16 ce-te]"), std::string::npos) << r.out;  // plan's loss kernel
  EXPECT_NE(r.out.find("reduced in bf16 (--grad-reduce-in-bf16)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step    2/2 | loss"), std::string::npos) << r.out;
  r = Ptdp("train " + path + " --backend cpu --steps 1 --fp32-activations");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("grad_reduce_in_bf16 (--grad-reduce-in-bf16) needs bf16 training"),
            std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
}

// --timeout becomes a deadline in every collective: values that cannot be one are refused at
// parse, naming the flag and the value (they used to fail the first collective, blaming a
// healthy rank).
TEST(Train, RefusesATimeoutThatIsNotAFinitePositiveNumberOfSeconds) {
  const std::string plan = MakePlan("timeout", "--tp 2 --pp 2 --micro-batch 2", 4);
  for (const char* v : {"0", "-1", "nan", "inf", "1e300", "604801"}) {
    const CmdResult r = Ptdp("train " + plan + " --steps 1 --timeout " + std::string(v));
    ptdp::testing::ExpectOneLineError(r, "ptdp: --timeout ", 1);
    EXPECT_NE(r.out.find(": must be a number of seconds above 0 and at most 604800 (7 days)"),
              std::string::npos) << r.out;
  }
  const CmdResult r = Ptdp("train " + plan + " --steps 1 --timeout 604800");
  EXPECT_EQ(r.code, 0) << r.out;
}

// measured.json is serialised before its file is touched and written through a temporary file
// renamed over it: a name that is not UTF-8 (byte 0xFF in the plan's path) gives valid JSON
// with U+FFFD in its place, or (where inputs refuse such names) a refusal; never a 0-byte or
// partial file, and no temporary file stays behind.
TEST(Train, MeasuredJsonIsWholeEvenForNamesThatAreNotUtf8) {
  const std::string dir = ::testing::TempDir() + "/utf8-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string plan = dir + "/bad\xff" "name.plan.yaml";
  std::filesystem::copy_file(MakePlan("utf8", "--tp 2 --pp 2 --micro-batch 2", 4), plan,
                             std::filesystem::copy_options::overwrite_existing);
  const std::string out = dir + "/measured.json";
  const CmdResult r = Ptdp("train '" + plan + "' --steps 1 --out " + out);
  if (r.code == 0) {
    std::ifstream in(out);
    const auto j = nlohmann::json::parse(in);  // throws on invalid UTF-8
    EXPECT_NE(j["plan"].get<std::string>().find("bad\xEF\xBF\xBDname"), std::string::npos) << j["plan"];
    EXPECT_TRUE(j["interrupted"].is_null());
  } else {
    EXPECT_FALSE(std::filesystem::exists(out)) << r.out;
  }
  for (const auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  std::filesystem::remove_all(dir);
}

}  // namespace
