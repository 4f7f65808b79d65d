// `ptdp train --backend cuda` end to end on the CUDA emulator (runtime/cuda/emu: the module
// lib/ptdp/libptdp_cuda_emu.so, chosen by PTDP_CUDA_MODULE), so that the path scripts/gpu-check.sh
// runs on a lent GPU (plan, train 1x1x1 and tp 2 / pp 2 on one GPU, the attention and epilogue
// switches, measured.json) runs and is checked on every machine first. gpt-tiny, a few steps;
// no speed: the emulator runs kernels on the CPU.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "tests/fakes/shell.h"

namespace {

using ptdp::testing::CmdResult;

const std::string kSrc = PTDP_SOURCE_DIR;
const std::string kModule = PTDP_CUDA_EMU_MODULE;

CmdResult Ptdp(const std::string& args, const std::string& env = "") {
  return ptdp::testing::Shell("PTDP_CUDA_MODULE=" + kModule + " " + env + " " +
                              std::string(PTDP_BINARY_DIR) + "/ptdp " + args);
}

class CudaEmuTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = ptdp::testing::FreshDir("cudaemu");
    ASSERT_FALSE(dir.empty());
  }
  // Plans gpt-tiny with `layout` on `gpus` GPUs and trains it `steps` steps with the CUDA
  // backend; returns measured.json.
  nlohmann::json Train(const std::string& name, int gpus, const std::string& layout,
                       const std::string& env = "", const std::string& flags = "",
                       std::string* log = nullptr) {
    const std::string plan = dir + "/" + name + ".plan.yaml", out = dir + "/" + name + ".json";
    CmdResult r = Ptdp("plan --cluster " + kSrc + "/configs/clusters/dgx-h200.yaml --model " +
                       kSrc + "/configs/models/gpt-tiny.yaml --gpus " + std::to_string(gpus) +
                       " --global-batch 4 --micro-batch 2 --recompute none --top 1 " + layout +
                       " --out " + plan);
    EXPECT_EQ(r.code, 0) << r.out;
    r = Ptdp("train " + plan + " --backend cuda --steps 3 --timing-warmup 1 --no-speed-probe " +
                 flags + " --out " + out,
             env);
    EXPECT_EQ(r.code, 0) << r.out;
    if (log != nullptr) *log = r.out;
    std::ifstream f(out);
    if (!f) return nlohmann::json();
    return nlohmann::json::parse(f);
  }
  static std::vector<double> Losses(const nlohmann::json& m) {
    std::vector<double> v;
    if (m.is_object())
      for (const auto& s : m["steps"]) v.push_back(s["loss"].get<double>());
    return v;
  }
  // The largest loss difference of b to a (gpu-check's "against 1x1x1").
  static double MaxDiff(const std::vector<double>& a, const std::vector<double>& b) {
    EXPECT_EQ(a.size(), b.size());
    double d = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
    return d;
  }
  std::string dir;
};

TEST_F(CudaEmuTrain, LayoutsAndKernelChoicesAgreeWithOneGpu) {
  const nlohmann::json one = Train("1x1x1", 1, "--tp 1 --pp 1");
  ASSERT_TRUE(one.is_object());
  // What scripts/gpu-check.sh reads from measured.json.
  const auto& s = one["summary"];
  EXPECT_GT(s["median_step_time_s"].get<double>(), 0);
  EXPECT_GT(s["tokens_per_s"].get<double>(), 0);
  EXPECT_GE(s["mfu"].get<double>(), 0);
  ASSERT_FALSE(one["timing"]["ranks"].empty());
  EXPECT_GT(one["timing"]["ranks"][0]["peak_memory_bytes"].get<double>(), 0);
  const std::vector<double> ref = Losses(one);
  ASSERT_EQ(ref.size(), 3u);
  EXPECT_LT(ref.back(), ref.front()) << "the loss falls over three steps";
  // tp 2 (with SP) and pp 2 on the one emulated GPU (DeviceWorld), the flash-mma kernels, the
  // unfused attention core and the epilogues off: the same 4 sequences a step, bf16 rounding
  // apart (gpu-check reports the same difference on a GPU).
  struct Run {
    const char* name;
    int gpus;
    const char* layout;
    const char* env;
    const char* flags;
  };
  for (const Run& run : {Run{"tp2", 2, "--tp 2 --pp 1", "", "--one-gpu"},
                         Run{"pp2", 2, "--tp 1 --pp 2", "", "--one-gpu"},
                         Run{"flash-mma", 1, "--tp 1 --pp 1", "PTDP_CUDA_ATTENTION=flash-mma", ""},
                         Run{"unfused", 1, "--tp 1 --pp 1", "PTDP_CUDA_ATTENTION=unfused", ""},
                         Run{"no-epilogue", 1, "--tp 1 --pp 1", "PTDP_CUDA_EPILOGUE=off", ""}}) {
    const std::vector<double> got = Losses(Train(run.name, run.gpus, run.layout, run.env, run.flags));
    EXPECT_LT(MaxDiff(ref, got), 5e-3) << run.name;
  }
}

// PTDP_CUDA_PROFILE=1: when the backend goes, a table of the device time per op and shape
// (runtime/cuda/op_profile.h), the GEMMs and attention with their TFLOP/s; gpu-check puts it in
// its summary. The emulator's times mean nothing: this checks what the table holds.
TEST_F(CudaEmuTrain, ProfileListsTheOpsWithShapes) {
  std::string log;
  Train("profile", 1, "--tp 1 --pp 1", "PTDP_CUDA_PROFILE=1", "", &log);
  ASSERT_NE(log.find("CUDA op profile, CUDA device 0"), std::string::npos) << log;
  // gpt-tiny: b 2, s 64, 4 heads of 16; hidden 64, vocabulary 256, 2 micro-batches of 128 tokens.
  for (const char* row : {"AttentionForward flash b2 s64 nh4 d16", "AttentionBackward flash",
                          "MatmulBiasGelu 128x256x64", "LayerNormForward", "AdamW",
                          "(between ops", " all"})
    EXPECT_NE(log.find(row), std::string::npos) << row << "\n" << log;
  EXPECT_EQ(log.find("Mark"), std::string::npos) << "phase marks are not ops";
}

}  // namespace
