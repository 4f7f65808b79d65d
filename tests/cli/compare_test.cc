// `ptdp compare` and `ptdp calibrate` end to end: the JSON keys, --max-error's exit code, errors
// that name the file, the communicator recorded in the calibrated file, the CUDA backend refused
// with CUDA's reason where it cannot run. (The calibrated loop and its accuracy bound are in
// calibrated_loop_test.cc; calibrating on a GPU in calibrate_cuda_test.cc.)
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/fakes/shell.h"

namespace {

using ptdp::testing::CmdResult;

const std::string kSrc = PTDP_SOURCE_DIR;
const std::string kBin = std::string(PTDP_BINARY_DIR) + "/ptdp";
const std::string kCpu = kSrc + "/configs/clusters/local-cpu.yaml";
const std::string kTiny = kSrc + "/configs/models/gpt-tiny.yaml";

CmdResult Ptdp(const std::string& args, bool with_stderr = true) {
  return ptdp::testing::Shell(kBin + " " + args, with_stderr);
}

// Per process: ctest runs each test in its own process, in parallel, and two writing one file
// raced (a test read a plan or measured.json another was writing).
std::string Tmp(const std::string& name) {
  return ::testing::TempDir() + "/cmp-" + std::to_string(getpid()) + "-" + name;
}

std::string Plan(const std::string& name, const std::string& flags, int gpus) {
  const std::string path = Tmp(name + ".plan.yaml");
  const CmdResult r = Ptdp("plan --cluster " + kCpu + " --model " + kTiny + " --gpus " +
                           std::to_string(gpus) + " --global-batch 8 " + flags +
                           " --refine 0 --out " + path);
  EXPECT_EQ(r.code, 0) << r.out;
  return path;
}

// A pp 2 plan trained for 3 steps (1 warm-up, 2 timed), shared by the tests below.
struct Trained {
  std::string plan, measured;
};
const Trained& Pp2() {
  static const Trained t = [] {
    Trained x;
    x.plan = Plan("pp2", "--pp 2", 2);
    x.measured = Tmp("pp2.measured.json");
    const CmdResult r = Ptdp("train " + x.plan + " --steps 3 --out " + x.measured);
    EXPECT_EQ(r.code, 0) << r.out;
    return x;
  }();
  return t;
}

TEST(Compare, JsonHasTheErrorAtTheTopAndEveryRank) {
  const CmdResult r = Ptdp("compare " + Pp2().plan + " " + Pp2().measured + " --json", false);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"step_time_error_pct", "memory_error_pct", "predicted_step_time_s",
                        "measured_step_time_s", "components", "ranks", "layout"})
    EXPECT_TRUE(j.contains(k)) << k;
  // The error is (predicted - measured) / measured, in percent.
  const double p = j["predicted_step_time_s"], m = j["measured_step_time_s"];
  EXPECT_NEAR(j["step_time_error_pct"].get<double>(), 100 * (p - m) / m, 1e-9);
  EXPECT_EQ(j["timed_steps"], 2);
  EXPECT_EQ(j["warmup_steps"], 1);
  ASSERT_EQ(j["ranks"].size(), 2u);
  EXPECT_EQ(j["ranks"][1]["stage"], 1);
  for (const char* c : {"compute", "tp_comm", "pp_bubble", "dp_comm", "optimizer", "idle"})
    EXPECT_TRUE(j["components"].contains(c)) << c;
  EXPECT_GT(j["ranks"][0]["measured"]["compute_s"].get<double>(), 0);
  EXPECT_GT(j["ranks"][1]["measured"]["pp_bubble_s"].get<double>(), 0);
}

TEST(Compare, TextHasTheTableAndASummary) {
  const CmdResult r = Ptdp("compare " + Pp2().plan + " " + Pp2().measured);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"step time", "pp_bubble", "peak memory", "per rank", "summary: tp1 pp2"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
}

TEST(Compare, MaxErrorSetsTheExitCode) {
  // Any measured run is within a billion percent, and none is predicted to the last bit.
  CmdResult r = Ptdp("compare " + Pp2().plan + " " + Pp2().measured + " --max-error 1e9");
  EXPECT_EQ(r.code, 0) << r.out;
  r = Ptdp("compare " + Pp2().plan + " " + Pp2().measured + " --max-error 0 --json", false);
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_TRUE(nlohmann::json::parse(r.out).contains("step_time_error_pct"));  // still printed
  r = Ptdp("compare " + Pp2().plan + " " + Pp2().measured + " --max-error 0");
  EXPECT_NE(r.out.find("is above --max-error 0%"), std::string::npos) << r.out;
}

// MoE at ep 2: measured.json carries the run's expert load (the most loaded EP rank's routed
// rows over the mean) and compare predicts the step again at that load: the same time when the
// measured load is the one the prediction assumed, a longer one at a heavier load.
TEST(Compare, MoeReportsTheMeasuredExpertLoad) {
  const std::string moe = kSrc + "/configs/models/gpt-tiny-moe.yaml";
  const std::string plan = Tmp("ep2.plan.yaml"), measured = Tmp("ep2.measured.json");
  CmdResult r = Ptdp("plan --cluster " + kCpu + " --model " + moe +
                     " --gpus 2 --ep 2 --global-batch 8 --refine 0 --out " + plan);
  ASSERT_EQ(r.code, 0) << r.out;
  r = Ptdp("train " + plan + " --steps 3 --out " + measured);
  ASSERT_EQ(r.code, 0) << r.out;
  r = Ptdp("compare " + plan + " " + measured + " --json", false);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j["expert_load"].is_object()) << r.out;
  const double assumed = j["expert_load"]["predicted"], predicted = j["predicted_step_time_s"];
  EXPECT_GE(j["expert_load"]["measured"].get<double>(), 1.0);
  EXPECT_GT(assumed, 1.0);
  // measured.json with the load set by hand.
  auto with_load = [&](double load) {
    std::ifstream in(measured);
    auto m = nlohmann::json::parse(in);
    for (auto& rank : m["timing"]["ranks"]) rank["expert_load"] = load;
    const std::string path = Tmp("ep2-load.measured.json");
    std::ofstream(path) << m.dump();
    const CmdResult c = Ptdp("compare " + plan + " " + path + " --json", false);
    EXPECT_EQ(c.code, 0) << c.out;
    return nlohmann::json::parse(c.out)["expert_load"]["predicted_step_time_s"].get<double>();
  };
  EXPECT_NEAR(with_load(assumed), predicted, 1e-12 * predicted);
  EXPECT_GT(with_load(2.0), predicted * 1.01);
  r = Ptdp("compare " + plan + " " + measured);
  EXPECT_NE(r.out.find("expert load (the most loaded EP rank's routed rows / the mean)"),
            std::string::npos) << r.out;
}

// dp 2 of a dense model: both ranks do the same work, so compute that differs between them is
// the machine's (unequal cores, a straggling GPU): compare gives the ratio, and says so above
// 1.1x. Here the run's own ratio, then measured.json with rank 1's compute doubled by hand.
TEST(Compare, SaysWhenRanksDoingTheSameWorkComputedAtUnequalSpeed) {
  const std::string plan = Plan("dp2", "--dp 2", 2), measured = Tmp("dp2.measured.json");
  CmdResult r = Ptdp("train " + plan + " --steps 3 --out " + measured);
  ASSERT_EQ(r.code, 0) << r.out;
  r = Ptdp("compare " + plan + " " + measured + " --json", false);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j["compute_spread"].is_object()) << r.out;
  EXPECT_GE(j["compute_spread"]["ratio"].get<double>(), 1.0);
  std::ifstream in(measured);
  auto m = nlohmann::json::parse(in);
  auto& rank1 = m["timing"]["ranks"][1];
  auto& rank0 = m["timing"]["ranks"][0];
  rank1["forward_s"] = 2 * rank0["forward_s"].get<double>();
  rank1["backward_s"] = 2 * rank0["backward_s"].get<double>();
  const std::string slow = Tmp("dp2-slow.measured.json");
  std::ofstream(slow) << m.dump();
  r = Ptdp("compare " + plan + " " + slow + " --json", false);
  ASSERT_EQ(r.code, 0) << r.out;
  j = nlohmann::json::parse(r.out);
  EXPECT_NEAR(j["compute_spread"]["ratio"].get<double>(), 2.0, 1e-9);
  EXPECT_EQ(j["compute_spread"]["slow_rank"], 1);
  EXPECT_EQ(j["compute_spread"]["fast_rank"], 0);
  EXPECT_EQ(j["compute_spread"]["unequal"], true);
  r = Ptdp("compare " + plan + " " + slow);
  EXPECT_NE(r.out.find("ranks doing the same work computed at unequal speed: rank 1 took 2.00x "
                       "rank 0's compute time"),
            std::string::npos) << r.out;
  // pp 2: the stages' work differs, so there is nothing to compare.
  r = Ptdp("compare " + Pp2().plan + " " + Pp2().measured + " --json", false);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(nlohmann::json::parse(r.out)["compute_spread"].is_null()) << r.out;
}

// The host speed probe: `train --out` times a few of calibrate's ops before and after its steps
// (measured.json speed_probe) and compare holds them against the calibration: the ratio, and
// the prediction with the op tables at that speed. Then measured.json with every probe time
// doubled by hand (the host twice as slow: the ratio doubles and the 1x1x1 step, all compute,
// nearly so), with the second probe 10% slower than the first (drift within the run), and
// with a negative time (an error naming the file); --no-speed-probe writes none.
TEST(Compare, HoldsTheHostSpeedAgainstTheCalibration) {
  const std::string cal = Tmp("probe-cal.yaml");
  CmdResult r = Ptdp("calibrate --backend cpu --quick --max-ranks 2 --out " + cal);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string plan = Tmp("probe.plan.yaml"), measured = Tmp("probe.measured.json");
  r = Ptdp("plan --cluster " + cal + " --model " + kTiny +
           " --gpus 1 --global-batch 8 --top 1 --refine 0 --out " + plan);
  ASSERT_EQ(r.code, 0) << r.out;
  r = Ptdp("train " + plan + " --steps 2 --out " + measured);
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(measured);
  const auto m = nlohmann::json::parse(in);
  ASSERT_TRUE(m.contains("speed_probe")) << m.dump().substr(0, 500);
  EXPECT_EQ(m["speed_probe"]["backend"], "cpu");
  EXPECT_EQ(m["speed_probe"]["threads"], 1);  // one rank keeps one core busy
  EXPECT_GT(m["speed_probe"]["points"].size(), 40u);
  auto compare = [&](const nlohmann::json& file) {
    const std::string path = Tmp("probe-edit.measured.json");
    std::ofstream(path) << file.dump();
    const CmdResult c = Ptdp("compare " + plan + " " + path + " --json", false);
    EXPECT_EQ(c.code, 0) << c.out;
    return nlohmann::json::parse(c.out)["host_speed"];
  };
  const auto base = compare(m);
  ASSERT_TRUE(base.is_object());
  const double ratio = base["ratio"], predicted = base["predicted_step_time_s"];
  EXPECT_GT(ratio, 0);
  EXPECT_GT(predicted, 0);
  EXPECT_TRUE(base["by_table"].contains("gemm_nt"));
  EXPECT_EQ(base["threads"], 1);
  EXPECT_FALSE(base["by_table"].contains("all_reduce"));
  auto edited = [&](double before, double after) {
    nlohmann::json e = m;
    for (auto& p : e["speed_probe"]["points"]) {
      p["before_s"] = before * p["before_s"].get<double>();
      p["after_s"] = after * p["after_s"].get<double>();
    }
    return e;
  };
  const auto twice = compare(edited(2, 2));
  EXPECT_NEAR(twice["ratio"].get<double>(), 2 * ratio, 1e-9 * ratio);
  EXPECT_GT(twice["predicted_step_time_s"].get<double>(), 1.8 * predicted);
  EXPECT_LE(twice["predicted_step_time_s"].get<double>(), 2.0 * predicted * (1 + 1e-9));
  const auto drift = compare(edited(1, 1.1));
  EXPECT_NEAR(drift["drift_within_run"].get<double>() / base["drift_within_run"].get<double>(),
              1.1, 1e-9);
  r = Ptdp("compare " + plan + " " + measured);
  EXPECT_NE(r.out.find("host speed: the calibrated ops took"), std::string::npos) << r.out;
  nlohmann::json bad = m;
  bad["speed_probe"]["points"][0]["after_s"] = -1;
  const std::string bad_file = Tmp("probe-bad.measured.json");
  std::ofstream(bad_file) << bad.dump();
  r = Ptdp("compare " + plan + " " + bad_file);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find(bad_file + ": speed_probe point 1"), std::string::npos) << r.out;
  const std::string none = Tmp("probe-none.measured.json");
  r = Ptdp("train " + plan + " --steps 1 --no-speed-probe --out " + none);
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in2(none);
  EXPECT_FALSE(nlohmann::json::parse(in2).contains("speed_probe"));
}

TEST(Compare, ErrorsNameTheFile) {
  CmdResult r = Ptdp("compare " + Pp2().plan + " /nonexistent/measured.json");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("/nonexistent/measured.json"), std::string::npos) << r.out;
  // A measured run of another layout is not this plan's.
  const std::string dp2 = Plan("dp2", "--dp 2", 2);
  r = Ptdp("compare " + dp2 + " " + Pp2().measured);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("is not the plan's tp1 pp1 dp2"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << "one line: " << r.out;
  const std::string junk = ::testing::TempDir() + "/cmp-junk.json";
  std::ofstream(junk) << "{ not json";
  r = Ptdp("compare " + Pp2().plan + " " + junk);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find(junk), std::string::npos) << r.out;
}

TEST(Calibrate, RefusesWhatItCannotMeasure) {
  const std::string out = ::testing::TempDir() + "/c.yaml";
  CmdResult r;
  // Where CUDA cannot run (not compiled in, or no GPU as on the build machine): one line with
  // CUDA's reason, as `ptdp train --backend cuda` words it, and no file.
  const auto info = nlohmann::json::parse(Ptdp("info --json", false).out);
  if (info["gpus_visible"].get<int>() == 0) {
    std::remove(out.c_str());
    r = Ptdp("calibrate --backend cuda --quick --out " + out);
    EXPECT_EQ(r.code, 1);
    EXPECT_EQ(r.out.rfind("ptdp: --backend cuda: ", 0), 0u) << r.out;
    EXPECT_NE(r.out.find(info["cuda_compiled"] == true ? "no CUDA GPU is usable here: "
                                                       : "built without the CUDA backend"),
              std::string::npos) << r.out;
    if (info.contains("why_no_gpu")) {
      EXPECT_NE(r.out.find(info["why_no_gpu"].get<std::string>()), std::string::npos) << r.out;
    }
    EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << "one line: " << r.out;
    EXPECT_FALSE(std::ifstream(out).good());
  }
  r = Ptdp("calibrate --backend cuda --precision fp8 --out " + out);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--precision 'fp8': expected bf16 or fp32"), std::string::npos) << r.out;
  r = Ptdp("calibrate --backend cpu --precision bf16 --out " + out);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("only for --backend cuda"), std::string::npos) << r.out;
  r = Ptdp("calibrate --backend tpu --out " + ::testing::TempDir() + "/c.yaml");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("'tpu'"), std::string::npos) << r.out;
  r = Ptdp("calibrate");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--out is required"), std::string::npos) << r.out;
  r = Ptdp("calibrate --cluster /nonexistent.yaml --out " + ::testing::TempDir() + "/c.yaml");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("/nonexistent.yaml"), std::string::npos) << r.out;
}

// The calibrated file says which communicator the collectives went through (`measured.
// communicator`), the planner reads it back, and a value it does not know is an error naming
// the file and the key.
TEST(Calibrate, RecordsTheCommunicator) {
  const std::string out = ::testing::TempDir() + "/cal-threads.yaml";
  const std::string err = ::testing::TempDir() + "/cal-threads.stderr";
  CmdResult r = Ptdp("calibrate --backend cpu --quick --max-ranks 2 --json --out " + out +
                         " 2>" + err, false);
  ASSERT_EQ(r.code, 0) << r.out << "\nstderr:\n"
                       << [&] { std::stringstream e; e << std::ifstream(err).rdbuf(); return e.str(); }();
  EXPECT_EQ(nlohmann::json::parse(r.out)["communicator"], "threads");
  std::stringstream text;
  text << std::ifstream(out).rdbuf();
  const std::string yaml = text.str();
  ASSERT_NE(yaml.find("  communicator: threads"), std::string::npos) << yaml.substr(0, 2000);
  r = Ptdp("plan --cluster " + out + " --model " + kTiny + " --gpus 2 --global-batch 8 --top 1");
  EXPECT_EQ(r.code, 0) << r.out;
  std::string bad = yaml;
  bad.replace(bad.find("communicator: threads"), 21, "communicator: pigeons");
  const std::string bad_file = ::testing::TempDir() + "/cal-pigeons.yaml";
  std::ofstream(bad_file) << bad;
  r = Ptdp("plan --cluster " + bad_file + " --model " + kTiny + " --gpus 2 --global-batch 8");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find(bad_file), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("communicator"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("threads, device, nccl"), std::string::npos) << r.out;
}

}  // namespace
