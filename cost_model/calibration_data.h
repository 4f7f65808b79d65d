// Published measured runs as (model, layout, GPU, measured time) rows, for `ptdp validate` and
// the accuracy tests. Three readers:
//   - LoadPublishedRuns: the project's own data/published/runs.yaml (shipped; strict);
//   - LoadMeasuredRuns: the team's ../shared/calibration/measured_runs.yaml, the source that
//     file was carried over from (scripts/import-published.py); read for the fields used, rows
//     without a full layout counted as skipped with the reason;
//   - LoadVtrainCsv: vTrain's third-party CSV, which the repository does not ship.
#pragma once

#include <string>
#include <vector>

#include "core/layout.h"
#include "core/model.h"
#include "core/status.h"

namespace ptdp {

struct MeasuredRun {
  std::string id;            // entry id, or "vtrain:<line>"
  // The table it comes from, as cited (the rows of one source share it): validation reports
  // the error per source and can predict each source from constants fitted without it.
  std::string source;
  std::string gpu;           // "A100" or "H100"
  std::string family;        // model family of MoE rows ("deepseek-v3"), else empty
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

// Reads data/published/runs.yaml (ptdp_published_runs_version 1: `runs:` with id, source, gpu,
// gpus, model (model YAML keys), layout (plan.yaml layout keys), step_time_s or
// layer_fwd_bwd_ms, step_time_derived, published; `not_carried:` rows go to `skipped`).
// Unknown keys, bad values and tp*cp*pp*dp != gpus are errors naming file:line, key and value.
Result<CalibrationSet> LoadPublishedRuns(const std::string& path);
// Reads measured_runs.yaml (the `entries:` list).
Result<CalibrationSet> LoadMeasuredRuns(const std::string& path);
// Reads vtrain_single_node/measured.csv: A100, full recompute, 1F1B, fp16, no DP overlap.
Result<CalibrationSet> LoadVtrainCsv(const std::string& path);
// The source of every vTrain row.
extern const char* const kVtrainSource;

}  // namespace ptdp
