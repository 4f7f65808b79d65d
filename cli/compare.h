// Predicted against measured for one plan: the prediction (event simulation of the plan on its
// cluster, or on a calibrated one) next to a measured.json from `ptdp train`, per component and
// per rank, with the measured step's timeline. `ptdp compare` prints it; `ptdp report
// --measured` draws it. Errors are (predicted - measured) / measured, signed, as `ptdp
// validate` reports them: positive when the model predicts too long a step or too much memory.
#pragma once

#include <array>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "core/measured.h"
#include "core/plan.h"
#include "cost_model/simulator.h"

namespace ptdp::cli {

// The parts of one rank's step as the runtime measures them (runtime/trainer.h RankTimes) and
// as the prediction splits them the same way. pp_bubble: time blocked in p2p groups, which on
// the runtime includes waiting for the pipeline peer, i.e. the bubble.
enum Component { kCompute, kTpComm, kPpBubble, kDpComm, kOptimizer, kIdle };
constexpr int kNumComponents = 6;
const char* ComponentName(int c);  // "compute", "tp_comm", "pp_bubble", "dp_comm", ...

using Parts = std::array<double, kNumComponents>;  // seconds

struct RankComparison {
  int rank = 0;                     // global rank
  int stage = 0;                    // its pipeline rank
  Parts predicted{}, measured{};
  double predicted_memory_bytes = 0, measured_memory_bytes = 0;
};

// One interval of the measured timeline (measured.json "timeline").
struct MeasuredEvent {
  std::string kind;                 // forward, backward, p2p, tp, dp, embedding, optimizer
  int microbatch = -1, chunk = -1;
  double start_s = 0, end_s = 0;
};

struct Comparison {
  Plan plan;
  std::string cluster_name, measured_file, backend, host;
  bool calibrated = false;  // the cluster carries measured primitives (`ptdp calibrate`)
  int warmup_steps = 0, timed_steps = 0;
  double predicted_step_s = 0, measured_step_s = 0;
  double measured_step_min_s = 0, measured_step_max_s = 0;  // spread of the timed steps
  std::vector<RankComparison> ranks;          // by global rank
  SimResult sim;                              // the prediction, with events
  Prediction prediction;                      // the simulated prediction (memory per stage)
  std::vector<std::vector<MeasuredEvent>> timeline;  // by global rank; empty when not recorded
  double timeline_step_s = 0;                 // that step's time
  // MoE with ep > 1: the routing the prediction assumed (moe_dropless_load: the most loaded
  // EP rank's routed rows over the mean) and the run's (the largest rank's median of
  // measured.json's expert_load), and the predicted step time with the measured load: how
  // much of the error is the routing rather than the cost model. 0 when not measured.
  double predicted_expert_load = 0, measured_expert_load = 0;
  double predicted_step_at_measured_load_s = 0;
  // The host's speed during the run against its calibration (measured.json's speed_probe held
  // against the cluster's measured tables, core/measured.h HostSpeed; ratio > 1: slower now),
  // and the predicted step with the calibrated op tables scaled to that speed (and, for MoE
  // with ep > 1, at the measured expert load): how much of the error is the host's drift since
  // calibration rather than the cost model. host_speed.points 0 when not measured (no probe,
  // an uncalibrated cluster, or a probe of another backend).
  HostSpeed host_speed;
  double host_drift_within_run = 0;  // the probe after the steps over the one before
  int host_probe_threads = 1;        // threads the probe ran on at once (the slowest counts)
  double predicted_step_at_host_speed_s = 0;

  // Mean over ranks of each part.
  Parts PredictedMean() const;
  Parts MeasuredMean() const;
  double PredictedMemoryMax() const;
  double MeasuredMemoryMax() const;
  // Share of the machine's cores other processes used during the timed steps (measured.json
  // timing.other_cpu_share; < 0 when unknown), and the machine's cores.
  double other_cpu_share = -1;
  int machine_cores = 0;
  // Whether other processes took cores the ranks needed: more than the cores the layout left
  // free, plus a tenth of the machine. Then rank threads waiting in a collective wake up late
  // and the times are the machine under load, not its own.
  bool busy() const;
  static constexpr double kBusyShare = 0.1;

  // Ranks doing the same work (a dense model's TP, CP and DP ranks of one pipeline stage) that
  // computed at unequal speed: for the stage where it is largest, its slowest rank's measured
  // compute over its fastest's. ratio 0 when no stage has two such ranks or the model routes
  // tokens to experts (their ranks' work differs by design). On a shared host (vCPUs of unequal
  // speed) or with a straggling or throttled GPU, every collective waits for the slowest.
  struct ComputeSpread {
    double ratio = 0;
    int slow_rank = -1, fast_rank = -1;
  };
  ComputeSpread MeasuredComputeSpread() const;
  // Above this ratio compare says so.
  static constexpr double kUnequalCompute = 1.1;
};

// The line `ptdp compare` prints when Comparison::MeasuredComputeSpread() is above
// kUnequalCompute, else "".
std::string SpreadNote(const Comparison& c);

// What other processes did during the timed steps, as `ptdp compare` and `ptdp report` say
// it: "other processes used 51% of the cores during the timed steps: the machine was busy
// (...), so the measured times are not this machine's own" (busy) or "... used 3% of the cores
// during the timed steps"; "" when measured.json does not say.
std::string LoadNote(const Comparison& c);

// Signed error in percent, (predicted - measured) / measured; 0 when both are 0, and +-inf when
// only the measurement is 0.
double ErrorPct(double predicted, double measured);

// Reads measured.json (from `ptdp train --out`) and predicts the plan on its cluster (or
// `cluster_override`, e.g. a calibrated one). Fails naming the file when measured.json is not
// one, or its layout is not the plan's.
Result<Comparison> ComparePlan(const Plan& plan, const std::string& measured_file,
                               const std::string& cluster_override);

// The --json of `ptdp compare`.
nlohmann::json ComparisonJson(const Comparison& c);

}  // namespace ptdp::cli
