// The HTML report of `ptdp report`: one self-contained page (inline CSS and SVG, nothing
// fetched from the network) with the ranking, the chosen plan's step-time breakdown, memory
// per pipeline stage, a Gantt chart of its simulated step, the rejections and why it won.
// Rendering is a pure function of ReportData; cmd_report.cc gathers the data and writes it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cli/compare.h"
#include "core/layout.h"
#include "core/plan.h"
#include "cost_model/simulator.h"

namespace ptdp::cli {

// One row of the ranking table.
struct ReportPlanRow {
  Layout layout;
  double step_time_s = 0;
  double tflops_per_gpu = 0;       // model FLOPs per second per GPU, TFLOP/s
  double mfu = 0;                  // 0..1
  double bubble_fraction = 0;      // 0..1
  double memory_total_bytes = 0;   // the most loaded GPU
  bool fits = false;
  std::string source = "analytic"; // "analytic" or "simulated"
};

struct ReportData {
  std::string title;               // page title and heading
  std::string model_name, cluster_name;
  ModelSpec model;                 // the model planned (stage layers in the JSON)
  int gpus = 0;                    // world size used
  int64_t global_batch = 0;        // B, sequences per step
  // Search figures; all 0 when the plan came from a plan.yaml (nothing was searched).
  int64_t evaluated = 0, legal = 0, fitting = 0;
  bool searched = false;           // true when the ranking comes from the planner

  std::vector<ReportPlanRow> plans;  // best first; plans[0] is the chosen plan (may be empty)
  Prediction chosen;                 // the chosen plan's analytic prediction
  std::vector<std::pair<std::string, int64_t>> rejected;  // (reason key, count), count > 0
  std::vector<std::string> explanation;  // planner ExplainChoice lines; may be empty

  bool has_sim = false;            // `sim` holds the chosen plan's simulated step
  SimResult sim;                   // with events (record_events)

  bool has_comparison = false;     // `comparison` holds a measured run of the chosen plan
  Comparison comparison;           // (`ptdp report --measured`), drawn in #compare
};

// The whole page. Every piece of text from `d` is HTML-escaped. Sections carry stable ids:
// #ranking, #breakdown, #memory, #gantt, #rejected, #why, and with a measured run #compare
// (what `ptdp compare` says of the machine's load, predicted and measured bars per component
// and per rank, and the measured step's timeline under the simulated one, on one time axis).
// Charts are SVGs with a viewBox that shrink with the window: the page fits any window from
// 800 px. Throughput is in the unit that suits it (FormatFlopRate). The <body> starts with
// data-script-errors="0" (the page has no script; the attribute is for browser tests).
// Never fails: missing data renders as a short note in its section.
std::string RenderReportHtml(const ReportData& d);

// Escapes & < > " ' for HTML text and attribute values.
std::string HtmlEscape(const std::string& s);

}  // namespace ptdp::cli
