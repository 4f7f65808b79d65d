// Event-driven simulation of one training step: each pipeline rank executes its core/ Schedule
// (compute stream + communication stream); forward/backward durations per model chunk come from
// the analytic model (compute + exposed TP); p2p transfers rendezvous under blocking, grouped
// semantics and share each rank's outbound link; DP gradient reduction runs per chunk on the
// communication stream (overlapped with the last backward when --overlap-grad-reduce), then the
// tied-embedding reduction between the first and last stage, then the optimizer.
// One pipeline is simulated: its TP and DP replicas behave the same (their contention for the
// node's NICs is in the collective and p2p bandwidths of topology/).
#pragma once

#include <string>
#include <vector>

#include "core/layout.h"
#include "core/plan.h"
#include "core/schedule.h"
#include "core/status.h"
#include "cost_model/analytic.h"

namespace ptdp {

enum class SimTrack { kCompute = 0, kComm = 1 };

// One interval on a rank's track, for traces and Gantt charts.
struct SimEvent {
  int rank = 0;                  // pipeline rank
  SimTrack track = SimTrack::kCompute;
  OpKind kind = OpKind::kForward;
  int microbatch = -1, chunk = -1, peer = -1;
  int transfer = -1;             // p2p: the transfer's number, shared by the send and its
                                 // receive (0, 1, ... as they happen); -1 for other events
  double start_s = 0, end_s = 0;
  // "F3.1", "B0.0", "send act F3.1 -> 2", "recv grad B3.1 <- 2", "dp reduce", "optimizer".
  std::string Name() const;
};

struct SimRankStats {
  double compute_s = 0;       // busy on the compute stream (forward, backward, recompute)
  double p2p_wait_s = 0;      // blocked in p2p groups
  double pipeline_end_s = 0;  // when its last backward (and last p2p) finished
  double bubble_s = 0;        // idle until the whole pipeline drained: max pipeline_end over
                              // ranks - compute - p2p_wait
  double end_s = 0;           // after the optimizer
  // Where the rank's time went, the way the runtime measures it (ptdp compare): exposed TP
  // inside its forwards and backwards (part of compute_s), time blocked in p2p groups (the
  // transfers and the waits for peers, i.e. most of the bubble), from its DP reduction's start
  // to the optimizer (DP and tied-embedding reductions, waits included), and its optimizer op.
  double tp_s = 0;
  double p2p_blocked_s = 0;
  double dp_s = 0;
  double optimizer_s = 0;
  int peak_inflight = 0;      // max (forwards - backwards) in chunks
  double peak_memory_bytes = 0;
  // (time, bytes) each time the rank's memory changes (activations come and go).
  std::vector<std::pair<double, double>> memory_timeline;
};

struct SimResult {
  double step_time_s = 0;
  double bubble_s = 0;          // bubble of the rank that finishes the pipeline last
  double bubble_fraction = 0;   // bubble_s / step_time_s
  Breakdown breakdown;          // same components as the analytic model, from the simulation
  std::vector<SimRankStats> ranks;
  std::vector<SimEvent> events; // when SimOptions::record_events
  int64_t num_events = 0;       // events processed (for events/s)
};

struct SimOptions {
  bool record_events = true;       // fill SimResult::events (traces, Gantt)
  bool free_communication = false; // all p2p, TP, DP and embedding communication takes 0 s
  bool uniform_stages = false;     // drop embedding/output work so every chunk costs the same
};

// Simulates one step of a legal layout (CheckLayout == kOk). Fails when the schedule cannot be
// built (a layout the schedule rules refuse), and when the analytic estimate of the layout
// (CheckEstimate) or the simulated step has a figure that is not a finite number in range (a
// cost-model bug: the message names the layout, the rank and the figure).
Result<SimResult> SimulateStep(const AnalyticModel& cost, const Layout& l, const SimOptions& opt);

// The simulation as a Prediction (source "simulated"), memory per stage from the simulation's
// peaks plus the analytic static memory.
Prediction SimulatedPrediction(const AnalyticModel& cost, const Layout& l, const SimResult& sim);

}  // namespace ptdp
