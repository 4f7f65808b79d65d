// The cost model's error on measured runs (calibration_data.h), and a least-error fit of named
// constants on them: how the shipped constants were obtained (docs/cost-model.md).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "cost_model/calibration_data.h"
#include "topology/cluster.h"

namespace ptdp {

struct ValidationRow {
  std::string id;
  std::string group;      // "vtrain (A100)", "published (H100)", "layer (A100)"
  double measured_s = 0;
  double predicted_s = 0;
  double error() const { return (predicted_s - measured_s) / measured_s; }  // signed
};

struct ErrorStats {
  size_t rows = 0;
  double mean_abs = 0;    // fraction
  double median_abs = 0;  // fraction
  double max_abs = 0;     // fraction
  std::string worst;      // id of the max
};
ErrorStats Summarize(const std::vector<ValidationRow>& rows);

// Base cluster per GPU kind ("A100", "H100"); each run gets it resized to its GPU count.
using ClusterByGpu = std::map<std::string, ClusterSpec>;

// Predicts every run; runs that cannot be predicted go to `skipped` with the reason.
std::vector<ValidationRow> PredictRuns(const std::vector<MeasuredRun>& runs,
                                       const ClusterByGpu& clusters,
                                       std::vector<std::string>* skipped);

// Coordinate descent on the named constants of clusters[gpu].calibration (multiplicative steps,
// bounded to [lo, hi] per constant) minimising the mean absolute step-time error of the runs
// of that GPU. Returns the fitted values; `clusters` is updated in place.
struct FitParam {
  std::string name;
  double lo, hi;
};
std::map<std::string, double> FitConstants(const std::vector<MeasuredRun>& runs,
                                           const std::string& gpu,
                                           const std::vector<FitParam>& params,
                                           ClusterByGpu* clusters, int rounds);

}  // namespace ptdp
