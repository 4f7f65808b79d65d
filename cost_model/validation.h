// The cost model's error on measured runs (calibration_data.h), and a least-error fit of named
// constants on them: how the shipped constants were obtained (docs/cost-model.md).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/plan.h"
#include "core/status.h"
#include "cost_model/calibration_data.h"
#include "topology/cluster.h"

namespace ptdp {

struct ValidationRow {
  std::string id;
  std::string group;      // "vtrain (A100)", "published (H100)", "layer (A100)", "moe grok-1 (H100)"
  double measured_s = 0;
  double predicted_s = 0;
  std::string source;     // MeasuredRun::source
  std::string gpu;        // "A100", "H100"
  // The memory the model predicts per GPU (the most loaded stage) and the GPU's capacity, in
  // bytes; 0 for per-layer rows. A run that was measured ran: over capacity is a memory-model
  // error.
  double memory_bytes = 0, capacity_bytes = 0;
  MemoryBytes memory{};  // its parts (weights, grads, optimizer, activations, other)
  double error() const { return (predicted_s - measured_s) / measured_s; }  // signed
  bool over_capacity() const { return capacity_bytes > 0 && memory_bytes > capacity_bytes; }
};

struct ErrorStats {
  size_t rows = 0;
  double mean_abs = 0;    // fraction
  double median_abs = 0;  // fraction
  double max_abs = 0;     // fraction
  double bias = 0;        // mean signed error, fraction: > 0 predicts too slow
  std::string worst;      // id of the max
};
ErrorStats Summarize(const std::vector<ValidationRow>& rows);

// The error of each source's rows (rows of one source share one GPU kind), most rows first.
struct SourceStats {
  std::string source;
  std::string gpu;
  ErrorStats stats;
};
std::vector<SourceStats> BySource(const std::vector<ValidationRow>& rows);

// Base cluster per GPU kind ("A100", "H100"); each run gets it resized to its GPU count.
using ClusterByGpu = std::map<std::string, ClusterSpec>;

// Predicts every run; runs that cannot be predicted go to `skipped` with the reason.
std::vector<ValidationRow> PredictRuns(const std::vector<MeasuredRun>& runs,
                                       const ClusterByGpu& clusters,
                                       std::vector<std::string>* skipped);

// Coordinate descent on the named constants of clusters[gpu].calibration (multiplicative steps,
// bounded to [lo, hi] per constant) minimising the mean absolute step-time error of the runs
// of that GPU. The Mixture-of-Experts constants (all_to_all_eff, grouped_gemm_eff,
// moe_dropless_load) are fitted on the (non-hybrid) MoE rows after the others on the dense rows,
// the hybrid models' ssm_scan_eff last on the hybrid rows. Returns the
// fitted values; `clusters` is updated in place.
struct FitParam {
  std::string name;
  double lo, hi;
};
std::map<std::string, double> FitConstants(const std::vector<MeasuredRun>& runs,
                                           const std::string& gpu,
                                           const std::vector<FitParam>& params,
                                           ClusterByGpu* clusters, int rounds);

// The constants fitted per GPU generation and their ranges (data/published/fit.yaml).
struct FitSet {
  std::vector<FitParam> params;
  int rounds = 6;
};
using FitSets = std::map<std::string, FitSet>;  // by GPU kind
// Reads fit.yaml; an unknown constant, a range with lo <= 0 or hi < lo, unknown keys: errors
// naming file:line and key.
Result<FitSets> LoadFitSets(const std::string& path);

// The value a cluster gives constant `name`: its calibration override, else the default.
double ConstantValue(const ClusterSpec& cluster, const std::string& name);

// A constant whose value sits on a bound of its fit range (within 0.1%): a mechanism the model
// lacks (issue 13), named by `ptdp validate`.
struct BoundHit {
  std::string gpu, name;
  double value = 0, lo = 0, hi = 0;
  bool at_hi = false;  // else at lo
};
std::vector<BoundHit> ConstantsAtBound(const ClusterByGpu& clusters, const FitSets& sets);

// Leave-one-source-out: each source's rows predicted by constants fitted (sets[gpu], starting
// from `clusters`) on the other sources' rows of its GPU. A source whose GPU has no other rows
// is predicted with the constants as given (fitted_on_rows 0).
struct HeldOutSource {
  SourceStats held_out;
  size_t fitted_on_rows = 0;               // rows of the other sources the model can predict
  std::map<std::string, double> constants;  // as fitted without the source
  std::vector<BoundHit> at_bound;           // of those
  std::vector<ValidationRow> rows;          // the held-out rows as predicted
};
std::vector<HeldOutSource> LeaveOneSourceOut(const std::vector<MeasuredRun>& runs,
                                             const ClusterByGpu& clusters, const FitSets& sets);

}  // namespace ptdp
