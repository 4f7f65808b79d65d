// `ptdp validate`: the cost model's error on published measured runs (the shipped
// data/published/runs.yaml, plus vTrain's third-party CSV from `--data DIR` when a user has it),
// and `--fit` to refit named constants on them (how the shipped constants were obtained;
// docs/cost-model.md).
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/paths.h"
#include "cost_model/calibration_data.h"
#include "cost_model/validation.h"

namespace ptdp::cli {
namespace {

struct ValidateFlags {
  std::string runs;           // published runs file (default: the shipped one)
  std::string data;           // a folder with vtrain_single_node/measured.csv (not shipped)
  std::string a100 = "dgx-a100";
  std::string h100 = "dgx-h100";
  std::string fit_gpu;      // "A100" or "H100"
  std::string fit_params;   // "name:lo:hi,name:lo:hi"
  int rounds = 4;
  bool holdout = false;     // fit on even rows, report the odd ones
  bool verbose = false;
  bool json = false;
};

Result<std::vector<FitParam>> ParseFitParams(const std::string& text) {
  std::vector<FitParam> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    FitParam p;
    char name[64];
    if (std::sscanf(item.c_str(), "%63[^:]:%lf:%lf", name, &p.lo, &p.hi) != 3 || p.lo <= 0 ||
        p.hi < p.lo)
      return Status::Error("--fit-params '" + item + "': expected name:lo:hi with 0 < lo <= hi");
    p.name = name;
    out.push_back(p);
  }
  if (out.empty()) return Status::Error("--fit-params is empty");
  return out;
}

void PrintGroup(const std::string& name, const std::vector<ValidationRow>& rows, bool all) {
  const ErrorStats s = Summarize(rows);
  std::printf("%-22s %5zu rows  mean |err| %5.1f%%  median %5.1f%%  max %5.1f%% (%s)\n",
              name.c_str(), s.rows, 100 * s.mean_abs, 100 * s.median_abs, 100 * s.max_abs,
              s.worst.c_str());
  if (!all) return;
  for (const auto& r : rows)
    std::printf("    %-50s measured %9.4f s  predicted %9.4f s  %+6.1f%%\n", r.id.c_str(),
                r.measured_s, r.predicted_s, 100 * r.error());
}

int RunValidate(const ValidateFlags& f) {
  ClusterByGpu clusters;
  for (const auto& [gpu, name] : {std::pair<std::string, std::string>{"A100", f.a100}, {"H100", f.h100}}) {
    auto file = ResolveConfig("clusters", name);
    if (!file.ok()) return Fail(file.status().Prefixed(gpu == "A100" ? "--a100" : "--h100").message());
    auto c = LoadClusterFile(*file);
    if (!c.ok()) return Fail(c.status().message());
    clusters[gpu] = *c;
  }
  auto runs_file = f.runs.empty() ? ShippedData("published/runs.yaml") : Result<std::string>(f.runs);
  if (!runs_file.ok()) return Fail(runs_file.status().message());
  auto pub = LoadPublishedRuns(*runs_file);
  if (!pub.ok()) return Fail(pub.status().message());
  std::vector<MeasuredRun> runs = pub->runs;
  std::vector<std::string> skipped = pub->skipped;
  std::string vtrain_note;
  if (!f.data.empty()) {
    auto vt = LoadVtrainCsv(f.data + "/vtrain_single_node/measured.csv");
    if (!vt.ok()) return Fail(vt.status().Prefixed("--data").message());
    runs.insert(runs.end(), vt->runs.begin(), vt->runs.end());
    skipped.insert(skipped.end(), vt->skipped.begin(), vt->skipped.end());
  } else {
    vtrain_note = "vTrain's 1,440 single-node A100 runs are a third-party file ptdp does not ship: "
                  "give --data DIR with DIR/vtrain_single_node/measured.csv to include them";
  }

  if (!f.fit_gpu.empty()) {
    if (!clusters.count(f.fit_gpu)) return Fail("--fit '" + f.fit_gpu + "': expected A100 or H100");
    auto params = ParseFitParams(f.fit_params);
    if (!params.ok()) return Fail(params.status().message());
    std::vector<MeasuredRun> fit_runs, report_runs;
    for (size_t i = 0; i < runs.size(); ++i) (i % 2 == 0 ? fit_runs : report_runs).push_back(runs[i]);
    const auto fitted =
        FitConstants(f.holdout ? fit_runs : runs, f.fit_gpu, *params, &clusters, f.rounds);
    if (f.holdout) {
      runs = report_runs;
      std::printf("hold-out: fitted on %zu even-numbered rows, reporting the %zu others\n",
                  fit_runs.size(), report_runs.size());
    }
    std::printf("fitted on %s runs (put these under calibration: in the cluster file):\n",
                f.fit_gpu.c_str());
    for (const auto& [name, v] : fitted) std::printf("  %s: %.4g\n", name.c_str(), v);
    std::printf("\n");
  }

  const auto rows = PredictRuns(runs, clusters, &skipped);
  std::map<std::string, std::vector<ValidationRow>> groups;
  std::vector<ValidationRow> steps;
  for (const auto& r : rows) {
    groups[r.group].push_back(r);
    if (r.group.rfind("layer", 0) != 0) steps.push_back(r);
  }
  if (f.json) {
    nlohmann::json j;
    auto stats = [](const std::vector<ValidationRow>& rs) {
      const ErrorStats s = Summarize(rs);
      return nlohmann::json{{"rows", s.rows}, {"mean_abs_error_pct", 100 * s.mean_abs},
                            {"median_abs_error_pct", 100 * s.median_abs},
                            {"max_abs_error_pct", 100 * s.max_abs}, {"worst", s.worst}};
    };
    for (const auto& [name, rs] : groups) j["groups"][name] = stats(rs);
    j["all_steps"] = stats(steps);
    j["skipped"] = skipped;
    j["runs_file"] = *runs_file;
    j["vtrain_included"] = !f.data.empty();
    std::cout << DumpJson(j) << "\n";
    return 0;
  }
  std::printf("published runs: %s (%zu rows)\n", runs_file->c_str(), pub->runs.size());
  if (!vtrain_note.empty()) std::printf("%s\n", vtrain_note.c_str());
  std::printf("\n");
  for (const auto& [name, rs] : groups)
    PrintGroup(name, rs, f.verbose || name.rfind("vtrain", 0) != 0);
  const ErrorStats all = Summarize(steps);
  std::printf("\nall step-time rows: %zu, mean |err| %.1f%%, median %.1f%%, max %.1f%% (%s)\n",
              all.rows, 100 * all.mean_abs, 100 * all.median_abs, 100 * all.max_abs,
              all.worst.c_str());
  std::printf("skipped %zu rows:\n", skipped.size());
  for (const auto& s : skipped) std::printf("    %s\n", s.c_str());
  return 0;
}

}  // namespace

Runner SetupValidate(CLI::App* sub) {
  auto f = std::make_shared<ValidateFlags>();
  sub->add_option("--runs", f->runs,
                  "published runs in ptdp's format (default: the shipped data/published/runs.yaml)");
  sub->add_option("--data", f->data,
                  "folder with vTrain's vtrain_single_node/measured.csv (not shipped), to add its rows");
  sub->add_option("--a100", f->a100, "cluster (name or file) for A100 rows (default dgx-a100)");
  sub->add_option("--h100", f->h100, "cluster (name or file) for H100 rows (default dgx-h100)");
  sub->add_option("--fit", f->fit_gpu, "refit constants on the runs of this GPU (A100|H100)");
  sub->add_option("--fit-params", f->fit_params, "name:lo:hi,... constants to fit");
  sub->add_option("--rounds", f->rounds, "coordinate-descent rounds for --fit (default 4)");
  sub->add_flag("--holdout", f->holdout, "with --fit: fit on even rows, report the odd ones");
  sub->add_flag("--verbose", f->verbose, "print every vTrain row too");
  sub->add_flag("--json", f->json, "machine-readable output");
  return [f] { return RunValidate(*f); };
}

}  // namespace ptdp::cli
