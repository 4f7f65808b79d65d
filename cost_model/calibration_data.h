// Published measured runs (../shared/calibration) as (model, layout, GPU, measured time)
// rows, and the prediction error of the cost model on them. The data file is read strictly
// for the fields used; rows without a full layout (no micro-batch, no model shape, no time)
// are counted as skipped with the reason.
#pragma once

#include <string>
#include <vector>

#include "core/layout.h"
#include "core/model.h"
#include "core/status.h"

namespace ptdp {

struct MeasuredRun {
  std::string id;            // entry id, or "vtrain:<line>"
  std::string gpu;           // "A100" or "H100"
  int gpus = 1;              // world size of the run
  ModelSpec model;
  Layout layout;
  bool per_layer = false;    // a single-layer timing (Korthikanti table 4), not a step
  double measured_s = 0;     // step time, or fwd+bwd of one layer when per_layer
};

struct CalibrationSet {
  std::vector<MeasuredRun> runs;
  std::vector<std::string> skipped;  // "id: reason"
};

// Reads measured_runs.yaml (the `entries:` list).
Result<CalibrationSet> LoadMeasuredRuns(const std::string& path);
// Reads vtrain_single_node/measured.csv: A100, full recompute, 1F1B, fp16, no DP overlap.
Result<CalibrationSet> LoadVtrainCsv(const std::string& path);

}  // namespace ptdp
