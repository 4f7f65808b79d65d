// `ptdp calibrate --backend cuda` on a GPU, end to end: the quick calibration writes a cluster
// whose `measured:` tables are complete and positive, recorded as the CUDA backend with the
// communicator `ptdp train` uses here (DeviceWorld with one GPU, NCCL with more); a plan on that
// cluster trains with `--backend cuda` and `ptdp compare` compares the two. No accuracy bound:
// this checks that the loop runs on a GPU (scripts/gpu-check.sh records the errors). Skips, with
// the reason, where no GPU is usable (not compiled in, no device, no driver).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/fakes/shell.h"
#include "topology/cluster.h"

namespace {

using ptdp::testing::CmdResult;

const std::string kSrc = PTDP_SOURCE_DIR;

// `ptdp ARGS`: exit code and stdout, with stderr unless `with_stderr` is false (--json output).
CmdResult Ptdp(const std::string& args, bool with_stderr = true) {
  return ptdp::testing::Shell(std::string(PTDP_BINARY_DIR) + "/ptdp " + args, with_stderr);
}

// `ptdp info --json`, for the GPUs this binary can use.
nlohmann::json Info() { return nlohmann::json::parse(Ptdp("info --json", false).out); }

#define SKIP_WITHOUT_GPU(info)                                                             \
  do {                                                                                     \
    if ((info)["gpus_visible"].get<int>() == 0)                                            \
      GTEST_SKIP() << "no CUDA GPU usable: "                                               \
                   << ((info)["cuda_compiled"] == true ? (info).value("why_no_gpu", "?")   \
                                                       : std::string("CUDA not compiled in")); \
  } while (0)

// The shipped cluster calibrate picks by the GPU's name, or none (then the test names one).
bool Shipped(const std::string& gpu) {
  for (const char* model : {"A100", "H100", "H200"})
    if (gpu.find(model) != std::string::npos) return true;
  return false;
}

TEST(CalibrateCuda, QuickCalibrationThenPlanTrainCompare) {
  const nlohmann::json info = Info();
  SKIP_WITHOUT_GPU(info);
  const int gpus = info["gpus_visible"].get<int>();
  const std::string gpu = info["gpu"]["name"].get<std::string>();
  const std::string dir = ptdp::testing::FreshDir("calcuda");
  ASSERT_FALSE(dir.empty());
  const std::string tiny = kSrc + "/configs/models/gpt-tiny.yaml";
  const std::string cal = dir + "/calibrated.yaml";
  // The base cluster after the GPU's name where one is shipped; any GPU cluster otherwise (the
  // tables are this GPU's whatever the base).
  const std::string base = Shipped(gpu) ? "" : " --cluster " + kSrc + "/configs/clusters/dgx-h200.yaml";
  CmdResult r = Ptdp("calibrate --backend cuda --quick --json --max-ranks 2" + base + " --out " + cal,
                     false);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["backend"], "cuda");
  EXPECT_EQ(j["communicator"], gpus == 1 ? "device" : "nccl");
  EXPECT_EQ(j["cores"], gpus);
  EXPECT_GT(j["peak_flop_per_s"].get<double>(), 0);

  auto c = ptdp::LoadClusterFile(cal);
  ASSERT_TRUE(c.ok()) << c.status().message();
  const ptdp::MeasuredPrimitives& m = c->measured;
  EXPECT_TRUE(m.CheckComplete(cal).ok());
  EXPECT_EQ(m.backend, "cuda");
  EXPECT_EQ(m.communicator, gpus == 1 ? "device" : "nccl");
  EXPECT_EQ(m.cores, gpus);
  // bf16 tensors (calibrate's default on CUDA, as `ptdp train` runs bf16 plans): every table,
  // the cuBLASLt epilogue GEMMs (gemm_nt_bias, gemm_nt_bias_gelu, gemm_nn_dgelu) included.
  EXPECT_DOUBLE_EQ(m.element_bytes, 2);
  EXPECT_EQ(m.tables.size(), ptdp::MeasuredTableKinds().size());
  for (const auto& [name, t] : m.tables)
    for (double s : t.seconds()) EXPECT_TRUE(s > 0 && std::isfinite(s)) << name << ": " << s;
  // Collectives over 2 ranks: on GPU 0 by device copies, or on GPUs 0 and 1 by NCCL.
  EXPECT_EQ(m.Table("all_reduce")->axis_values()[0], std::vector<double>{2});

  // A 1-rank and a 2-rank (TP, so every layer's collectives run) plan on the calibrated cluster.
  struct Case {
    const char* name;
    const char* flags;
  };
  for (const Case& k : {Case{"1x1x1", "--gpus 1"}, Case{"tp2", "--gpus 2 --tp 2"}}) {
    SCOPED_TRACE(k.name);
    const std::string plan = dir + "/" + k.name + ".plan.yaml";
    const std::string measured = dir + "/" + k.name + ".measured.json";
    r = Ptdp("plan --cluster " + cal + " --model " + tiny + " --global-batch 8 " + k.flags +
             " --recompute none --top 1 --out " + plan);
    ASSERT_EQ(r.code, 0) << r.out;
    r = Ptdp("train " + plan + " --backend cuda --steps 4 --out " + measured);
    ASSERT_EQ(r.code, 0) << r.out;
    r = Ptdp("compare " + plan + " " + measured + " --json", false);
    ASSERT_EQ(r.code, 0) << r.out;
    const auto cmp = nlohmann::json::parse(r.out);
    EXPECT_GT(cmp["predicted_step_time_s"].get<double>(), 0);
    EXPECT_GT(cmp["measured_step_time_s"].get<double>(), 0);
    EXPECT_TRUE(std::isfinite(cmp["step_time_error_pct"].get<double>()));
    std::printf("%s on %s: predicted %.3f ms, measured %.3f ms (%+.1f%%)\n", k.name, gpu.c_str(),
                1e3 * cmp["predicted_step_time_s"].get<double>(),
                1e3 * cmp["measured_step_time_s"].get<double>(),
                cmp["step_time_error_pct"].get<double>());
  }
}

// With NCCL a collective group has one GPU per rank: --max-ranks above the GPUs is refused
// before anything is measured.
TEST(CalibrateCuda, MaxRanksAboveTheGpusIsRefused) {
  const nlohmann::json info = Info();
  SKIP_WITHOUT_GPU(info);
  const int gpus = info["gpus_visible"].get<int>();
  if (gpus < 2) GTEST_SKIP() << "one GPU: every rank shares it (DeviceWorld), any --max-ranks fits";
  const CmdResult r = Ptdp("calibrate --backend cuda --cluster " + kSrc +
                           "/configs/clusters/dgx-h200.yaml --max-ranks " + std::to_string(gpus + 1) +
                           " --out " + ::testing::TempDir() + "/x.yaml");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("GPUs are visible"), std::string::npos) << r.out;
}

}  // namespace
