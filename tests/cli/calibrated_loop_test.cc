// The loop of `make demo`, small: calibrate this machine (--quick), plan gpt-tiny on the
// calibrated cluster, train the layouts that fit 2 cores (1x1x1, tp 2, pp 2, cp 2, tp 2 with
// selective recompute, cp 2 with full recompute, gpt-tiny-moe at ep 2, dp 2) and compare
// each against its prediction. Checked: every command of the loop works, each layout's peak
// memory is within 5% of the prediction (deterministic: byte-exact but for MoE's routing), and
// its step time within 40% (a gross-error bound), the report draws the comparison.
//
// The step-time bound is not the accuracy target (10%, issues 6 and 16): accuracy targets are
// measured by scripts/accuracy.sh, which calibrates, runs each layout until 5 runs were quiet
// and prints the medians (docs/cost-model.md, "Accuracy on the CPU runtime", has the figures).
// A unit test cannot hold a 10% or 20% bound on this machine: one calibration is a snapshot of
// a shared VM whose host moves its speed by 20% from one minute to the next with no process of
// this machine running (1x1x1 75 ms one hour, 90 the next); here the errors are a few percent
// to +-15%, while CI's machine put all 8 layouts at -17% to -31% in one loop (2026-12-05),
// having calibrated in a fast moment. What 40% still catches: a part of the step the model
// leaves out or counts twice (a missing all-to-all, recompute's forward, an extra optimizer
// pass), a calibration table read at the wrong shape, a rank's work booked to all ranks.
// The test runs alone (RUN_SERIAL), takes the median of 10 timed steps, gives a layout up to
// 5 training runs, the last three each planned on a fresh calibration (a calibration taken
// in a fast or slow moment of the host puts every layout off by the same 20-33%, here as in
// CI; a gross model error shows with every calibration), and counts a run only when other
// processes did not take cores its ranks needed (`ptdp compare`'s machine_busy, from measured.json timing.other_cpu_share): when
// another process holds the cores a waiting rank loses its time slice and that wait lands in
// the step (two busy loops beside tp 2 turn 46 ms into 235 ms, all of it in TP collectives).
// When no run of a layout was quiet, the timing bound cannot be checked here: the test says
// so and skips (the memory bound is checked on every run).
// Under AddressSanitizer (`make test-asan`) the binary is a Debug -O1 build whose allocations,
// copies and thread hand-offs cost several times more than its arithmetic: the calibrated
// primitives are not that binary's step (CI measured -20% to -38% on every layout). There the
// loop runs once per layout, 4 steps without the host speed probe, and checks everything but
// the step-time bound (and not alone: RUN_SERIAL is for the timing, tests/cli/CMakeLists.txt).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/fakes/shell.h"

namespace {

using ptdp::testing::FreshDir;
using ptdp::testing::Count;

using ptdp::testing::CmdResult;
using ptdp::testing::Shell;

const std::string kSrc = PTDP_SOURCE_DIR;
const std::string kBin = std::string(PTDP_BINARY_DIR) + "/ptdp";
const std::string kTiny = kSrc + "/configs/models/gpt-tiny.yaml";
const std::string kTinyMoe = kSrc + "/configs/models/gpt-tiny-moe.yaml";

constexpr double kMaxStepErrorPct = 40;  // gross errors only: see the top
constexpr double kMaxMemoryErrorPct = 5;
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
constexpr int kAttempts = kSanitized ? 1 : 5;
// Training steps of a run and of them timed: the median of 10; under the sanitizers (no time
// checked) 3, enough for compare, and no host speed probe (a small calibration at each run's
// start and end; Compare.HoldsTheHostSpeedAgainstTheCalibration runs it under the sanitizers).
constexpr int kSteps = kSanitized ? 4 : 12;
constexpr int kWarmupSteps = kSanitized ? 1 : 2;
constexpr const char* kTrainExtra = kSanitized ? " --no-speed-probe" : "";
// Attempts from this one on each run on a fresh calibration (see the top).
constexpr int kFreshCalibrationFrom = 2;

TEST(CalibratedLoop, EachLayoutRunsAndComparesAfterCalibration) {
  const std::string dir = FreshDir("loop");
  ASSERT_FALSE(dir.empty());
  const std::string cal = dir + "/calibrated.yaml";
  CmdResult r = Shell(kBin + " calibrate --backend cpu --quick --out " + cal);
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_NE(r.out.find("wrote " + cal), std::string::npos) << r.out;
  // --quick: the median of 3 sweeps over the op grids, each sweep's time said.
  EXPECT_NE(r.out.find("the 3 sweeps over the op grids took"), std::string::npos) << r.out;
  // simulate --ops on the calibrated cluster lists the runtime's calls, the fused ones as such.
  r = Shell(kBin + " simulate --cluster " + cal + " --model " + kTiny +
            " --global-batch 8 --gpus 1 --recompute none --ops");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* op : {"qkv+bias ", "fc1+bias+gelu ", "bias_residual_add1+norm2 ",
                         "bias_residual_add2 ", "logits+bias "})
    EXPECT_NE(r.out.find(op), std::string::npos) << op << "\n" << r.out;

  struct Case {
    const char* name;
    const char* flags;
    const std::string* model = &kTiny;
    // MoE with ep > 1: the bound is on the prediction at the measured expert load (compare's
    // expert_load.step_time_error_pct). How evenly a learned router spreads the tokens is the
    // trained model's, not the machine's: gpt-tiny-moe's moves from 1.07 to 1.48 within the
    // first 12 steps (moe_dropless_load assumes 1.2); the calibrated machine model is what this
    // loop checks. Both errors are printed.
    bool at_measured_load = false;
    // (ep 2 at the planned load: -15% to -26% here, -34% in CI, 2026-12-05.)
  };
  int checked = 0;
  std::string unchecked;  // layouts whose every run was on a busy machine
  const Case cases[] = {{"1x1x1", "--gpus 1 --recompute none"},
                        {"tp2", "--gpus 2 --tp 2 --recompute none"},
                        {"pp2", "--gpus 2 --pp 2 --recompute none"},
                        {"cp2", "--gpus 2 --cp 2 --recompute none"},
                        {"tp2-selective", "--gpus 2 --tp 2 --recompute selective"},
                        {"cp2-full", "--gpus 2 --cp 2 --recompute full"},
                        {"ep2", "--gpus 2 --ep 2 --recompute none", &kTinyMoe, true},
                        {"dp2", "--gpus 2 --dp 2 --recompute none"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string plan = dir + "/" + c.name + ".plan.yaml";
    r = Shell(kBin + " plan --cluster " + cal + " --model " + *c.model + " --global-batch 8 " +
              c.flags + " --top 1 --out " + plan);
    ASSERT_EQ(r.code, 0) << r.out;
    double best = 1e9;
    std::string tried;
    for (int attempt = 0; attempt < kAttempts && std::fabs(best) > kMaxStepErrorPct; ++attempt) {
      if (attempt >= kFreshCalibrationFrom) {  // a new snapshot of the host (see the top)
        const std::string fresh = dir + "/" + c.name + ".recalibrated.yaml";
        r = Shell(kBin + " calibrate --backend cpu --quick --out " + fresh);
        ASSERT_EQ(r.code, 0) << r.out;
        r = Shell(kBin + " plan --cluster " + fresh + " --model " + *c.model +
                  " --global-batch 8 " + c.flags + " --top 1 --out " + plan);
        ASSERT_EQ(r.code, 0) << r.out;
        tried += std::string(tried.empty() ? "" : ", ") + "recalibrated";
      }
      const std::string measured = dir + "/" + c.name + ".measured.json";
      r = Shell(kBin + " train " + plan + " --steps " + std::to_string(kSteps) +
                " --timing-warmup " + std::to_string(kWarmupSteps) + kTrainExtra + " --out " +
                measured);
      ASSERT_EQ(r.code, 0) << r.out;
      r = Shell(kBin + " compare " + plan + " " + measured + " --json", false);
      ASSERT_EQ(r.code, 0) << r.out;
      const auto j = nlohmann::json::parse(r.out);
      EXPECT_EQ(j["timed_steps"], kSteps - kWarmupSteps);
      const double planned = j["step_time_error_pct"], mem = j["memory_error_pct"];
      const double step =
          c.at_measured_load ? j["expert_load"]["step_time_error_pct"].get<double>() : planned;
      EXPECT_LE(std::fabs(mem), kMaxMemoryErrorPct) << "memory error " << mem << "%";
      const bool busy = j["machine_busy"];
      tried += (tried.empty() ? "" : ", ") + std::to_string(step) + "%" +
               (c.at_measured_load ? " (at the planned load " + std::to_string(planned) + "%)"
                                   : "") +
               (busy ? " (busy: others used " +
                           std::to_string(int(100 * j["other_cpu_share"].get<double>())) + "%)"
                     : "");
      if (!busy && std::fabs(step) < std::fabs(best)) best = step;
    }
    std::printf("%-6s step-time error after calibration: %s\n", c.name, tried.c_str());
    if (kSanitized) continue;  // the instrumented binary's times are not the model's
    if (best == 1e9) {
      unchecked += std::string(unchecked.empty() ? "" : "; ") + c.name + ": " + tried;
      continue;
    }
    ++checked;
    std::string breakdown;  // the last run's comparison per part, to see where a miss comes from
    if (std::fabs(best) > kMaxStepErrorPct)
      breakdown = Shell(kBin + " compare " + plan + " " + dir + "/" + c.name + ".measured.json",
                        false).out;
    EXPECT_LE(std::fabs(best), kMaxStepErrorPct)
        << c.name << ": step-time errors " << tried << "\n" << breakdown;
  }

  // The report of the last layout draws the comparison: bars per rank and both timelines.
  const std::string html = dir + "/report.html";
  r = Shell(kBin + " report " + dir + "/dp2.plan.yaml --measured " + dir +
            "/dp2.measured.json --html " + html);
  ASSERT_EQ(r.code, 0) << r.out;
  std::stringstream page;
  page << std::ifstream(html).rdbuf();
  EXPECT_NE(page.str().find("<section id=\"compare\">"), std::string::npos);
  EXPECT_EQ(Count(page.str(), "<g class=\"cmp-rank\""), 2u);
  EXPECT_EQ(Count(page.str(), "<g class=\"meas-rank\""), 2u);
  EXPECT_EQ(Count(page.str(), "<g class=\"sim-rank\""), 1u);
  if (!unchecked.empty())
    std::printf("step-time bound not checked, the machine was busy in every run of: %s\n",
                unchecked.c_str());
  if (kSanitized)
    GTEST_SKIP() << "built with AddressSanitizer: the loop ran and memory was checked; the "
                    "step-time bound is the release build's";
  if (checked == 0) GTEST_SKIP() << "the machine was busy in every run: " << unchecked;
}

}  // namespace
