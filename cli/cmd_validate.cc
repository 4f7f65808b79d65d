// `ptdp validate`: the cost model's error on published measured runs (the shipped
// data/published/runs.yaml, plus vTrain's third-party CSV from `--data DIR` when a user has it),
// and `--fit` to refit named constants on them (how the shipped constants were obtained;
// docs/cost-model.md).
#include <cstdio>
#include <iostream>
#include <cmath>
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

constexpr double kGiB = 1024.0 * 1024 * 1024;

struct ValidateFlags {
  std::vector<std::string> runs;  // published runs files (default: the shipped ones)
  std::string data;           // a folder with vtrain_single_node/measured.csv (not shipped)
  std::string a100 = "dgx-a100";
  std::string h100 = "dgx-h100";
  std::string fit_gpu;      // A100, H100, B200, GB200 or GB300
  std::string fit_params;   // "name:lo:hi,name:lo:hi" (default: the GPU's set in fit.yaml)
  std::string fit_sets;     // the fit sets (default: the shipped data/published/fit.yaml)
  int rounds = 0;           // 0: the fit set's
  bool loso = false;        // --leave-one-source-out
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

nlohmann::json StatsJson(const ErrorStats& s) {
  return {{"rows", s.rows}, {"mean_abs_pct", 100 * s.mean_abs}, {"max_abs_pct", 100 * s.max_abs},
          {"bias_pct", 100 * s.bias}, {"median_abs_pct", 100 * s.median_abs}, {"worst", s.worst}};
}

nlohmann::json SourceJson(const SourceStats& s) {
  nlohmann::json j = StatsJson(s.stats);
  j["source"] = s.source;
  j["gpu"] = s.gpu;
  return j;
}

nlohmann::json BoundsJson(const std::vector<BoundHit>& hits) {
  nlohmann::json a = nlohmann::json::array();
  for (const BoundHit& h : hits)
    a.push_back({{"gpu", h.gpu}, {"name", h.name}, {"value", h.value}, {"lo", h.lo},
                 {"hi", h.hi}, {"bound", h.at_hi ? "hi" : "lo"}});
  return a;
}

void PrintSource(const SourceStats& s) {
  std::printf("  %5zu rows  mean |err| %5.1f%%  max %5.1f%%  bias %+6.1f%%  [%s] %s\n",
              s.stats.rows, 100 * s.stats.mean_abs, 100 * s.stats.max_abs, 100 * s.stats.bias,
              s.gpu.c_str(), s.source.c_str());
}

std::string BoundText(const BoundHit& h) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "%s %s = %.4g on its %s bound (fit range %.4g..%.4g)",
                h.gpu.c_str(), h.name.c_str(), h.value, h.at_hi ? "upper" : "lower", h.lo, h.hi);
  return buf;
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
  // Blackwell rows run on the shipped clusters of their generation (default constants: no
  // calibration of them yet).
  for (const auto& [gpu, name] : {std::pair<const char*, const char*>{"B200", "dgx-b200"},
                                  {"B300", "dgx-b300"}, {"GB200", "gb200-nvl72"},
                                  {"GB300", "gb300-nvl72"}}) {
    auto file = ResolveConfig("clusters", name);
    if (!file.ok()) return Fail(file.status().message());
    auto c = LoadClusterFile(*file);
    if (!c.ok()) return Fail(c.status().message());
    clusters[gpu] = *c;
  }
  std::vector<std::string> runs_files = f.runs;
  if (runs_files.empty()) {
    for (const char* name : {"published/runs.yaml", "published/megatron_recipes.yaml",
                             "published/megatron_moe.yaml"}) {
      auto file = ShippedData(name);
      if (!file.ok()) return Fail(file.status().message());
      runs_files.push_back(*file);
    }
  }
  std::vector<MeasuredRun> runs;
  std::vector<std::string> skipped;
  std::vector<size_t> rows_per_file;
  for (const std::string& file : runs_files) {
    auto pub = LoadPublishedRuns(file);
    if (!pub.ok()) return Fail(pub.status().message());
    runs.insert(runs.end(), pub->runs.begin(), pub->runs.end());
    skipped.insert(skipped.end(), pub->skipped.begin(), pub->skipped.end());
    rows_per_file.push_back(pub->runs.size());
  }
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

  auto sets_file = f.fit_sets.empty() ? ShippedData("published/fit.yaml") : Result<std::string>(f.fit_sets);
  if (!sets_file.ok()) return Fail(sets_file.status().message());
  auto sets = LoadFitSets(*sets_file);
  if (!sets.ok()) return Fail(sets.status().message());

  if (!f.fit_gpu.empty()) {
    if (!clusters.count(f.fit_gpu)) return Fail("--fit '" + f.fit_gpu + "': expected A100, H100, B200, B300, GB200 or GB300");
    Result<std::vector<FitParam>> params = std::vector<FitParam>{};
    int rounds = f.rounds;
    if (!f.fit_params.empty()) {
      params = ParseFitParams(f.fit_params);
    } else if (sets->count(f.fit_gpu)) {
      params = sets->at(f.fit_gpu).params;
      if (rounds == 0) rounds = sets->at(f.fit_gpu).rounds;
    } else {
      params = Status::Error("--fit " + f.fit_gpu + ": " + *sets_file +
                             " has no fit set for it: give --fit-params");
    }
    if (!params.ok()) return Fail(params.status().message());
    if (rounds == 0) rounds = 4;
    std::vector<MeasuredRun> fit_runs, report_runs;
    for (size_t i = 0; i < runs.size(); ++i) (i % 2 == 0 ? fit_runs : report_runs).push_back(runs[i]);
    const auto fitted =
        FitConstants(f.holdout ? fit_runs : runs, f.fit_gpu, *params, &clusters, rounds);
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
  const std::vector<SourceStats> sources = BySource(rows);
  const std::vector<BoundHit> at_bound = ConstantsAtBound(clusters, *sets);
  std::vector<HeldOutSource> loso;
  if (f.loso) loso = LeaveOneSourceOut(runs, clusters, *sets);
  std::map<std::string, std::vector<ValidationRow>> groups;
  std::vector<ValidationRow> steps, over;
  size_t with_memory = 0;  // step rows with a predicted memory and a capacity
  for (const auto& r : rows) {
    groups[r.group].push_back(r);
    if (r.group.rfind("layer", 0) != 0) {
      steps.push_back(r);
      with_memory += r.capacity_bytes > 0;
    }
    if (r.over_capacity()) over.push_back(r);
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
    j["sources"] = nlohmann::json::array();
    for (const SourceStats& s : sources) j["sources"].push_back(SourceJson(s));
    j["constants_at_bound"] = BoundsJson(at_bound);
    j["fit_sets_file"] = *sets_file;
    if (f.loso) {
      j["leave_one_source_out"] = nlohmann::json::array();
      for (const HeldOutSource& h : loso) {
        nlohmann::json o = SourceJson(h.held_out);
        o["fitted_on_rows"] = h.fitted_on_rows;
        o["constants"] = h.constants;
        o["constants_at_bound"] = BoundsJson(h.at_bound);
        o["rows"] = nlohmann::json::array();
        for (const auto& r : h.rows)
          o["rows"].push_back({{"id", r.id}, {"group", r.group}, {"measured_s", r.measured_s},
                               {"predicted_s", r.predicted_s}, {"error_pct", 100 * r.error()}});
        j["leave_one_source_out"].push_back(o);
      }
    }
    j["all_steps"] = stats(steps);
    j["memory_checked_rows"] = with_memory;
    j["over_capacity"] = nlohmann::json::array();
    for (const auto& r : over)
      j["over_capacity"].push_back({{"id", r.id}, {"group", r.group},
                                    {"predicted_gib", r.memory_bytes / kGiB},
                                    {"capacity_gib", r.capacity_bytes / kGiB},
                                    {"weights_gib", r.memory.weights / kGiB},
                                    {"grads_gib", r.memory.grads / kGiB},
                                    {"optimizer_gib", r.memory.optimizer / kGiB},
                                    {"activations_gib", r.memory.activations / kGiB},
                                    {"other_gib", r.memory.other / kGiB}});
    j["rows"] = nlohmann::json::array();
    for (const auto& r : rows)
      j["rows"].push_back({{"id", r.id}, {"group", r.group}, {"source", r.source},
                           {"measured_s", r.measured_s}, {"predicted_s", r.predicted_s},
                           {"error_pct", 100 * r.error()},
                           {"memory_gib", r.memory_bytes / kGiB},
                           {"capacity_gib", r.capacity_bytes / kGiB}});
    j["skipped"] = skipped;
    j["runs_files"] = runs_files;
    j["vtrain_included"] = !f.data.empty();
    std::cout << DumpJson(j) << "\n";
    return 0;
  }
  for (size_t i = 0; i < runs_files.size(); ++i)
    std::printf("published runs: %s (%zu rows)\n", runs_files[i].c_str(), rows_per_file[i]);
  if (!vtrain_note.empty()) std::printf("%s\n", vtrain_note.c_str());
  std::printf("\n");
  for (const auto& [name, rs] : groups)
    PrintGroup(name, rs, f.verbose || name.rfind("vtrain", 0) != 0);
  const ErrorStats all = Summarize(steps);
  std::printf("\nall step-time rows: %zu, mean |err| %.1f%%, median %.1f%%, max %.1f%% (%s)\n",
              all.rows, 100 * all.mean_abs, 100 * all.median_abs, 100 * all.max_abs,
              all.worst.c_str());
  // Every measured run ran: a layout the memory model puts over its GPU's capacity is a memory
  // error (the one check of the memory model the published step times allow).
  std::printf("memory: %zu of %zu published layouts predicted over their GPU's capacity "
              "(they ran)%s\n", over.size(), with_memory, over.empty() ? "" : ":");
  if (!over.empty())
    std::printf("    (GiB: weights + grads + optimizer + activations + other, the most loaded "
                "stage)\n");
  for (const auto& r : over) {
    const MemoryBytes& m = r.memory;
    std::printf("    %-50s predicted %6.1f GiB > capacity %6.1f GiB  (%.1f + %.1f + %.1f + %.1f "
                "+ %.1f)\n", r.id.c_str(), r.memory_bytes / kGiB, r.capacity_bytes / kGiB,
                m.weights / kGiB, m.grads / kGiB, m.optimizer / kGiB, m.activations / kGiB,
                m.other / kGiB);
  }
  std::printf("\nby source (bias: mean signed error, > 0 predicts too slow):\n");
  for (const SourceStats& s : sources) PrintSource(s);
  if (f.loso) {
    std::printf("\nleave one source out (each source predicted by constants fitted on the other "
                "sources of its GPU, %s):\n", sets_file->c_str());
    for (const HeldOutSource& h : loso) {
      PrintSource(h.held_out);
      if (h.fitted_on_rows == 0)
        std::printf("        no other rows of %s: the constants as given\n", h.held_out.gpu.c_str());
      else
        std::printf("        fitted on %zu rows%s\n", h.fitted_on_rows,
                    h.at_bound.empty() ? "" : "; on a bound:");
      for (const BoundHit& b : h.at_bound) std::printf("          %s\n", BoundText(b).c_str());
    }
  }
  if (f.loso) {
    // The MoE rows held out with their source, per family (issue 15's measure): the mean over
    // the family's sources of each source's mean |error| on its MoE rows, and the worst row.
    std::map<std::string, std::vector<std::pair<double, double>>> fam;  // family -> (src mean, max)
    for (const HeldOutSource& h : loso) {
      std::map<std::string, std::vector<double>> by;
      for (const auto& r : h.rows)
        if (r.group.rfind("moe ", 0) == 0) by[r.group].push_back(std::fabs(r.error()));
      for (const auto& [g, errs] : by) {
        double sum = 0, mx = 0;
        for (double e : errs) sum += e, mx = std::max(mx, e);
        fam[g].push_back({sum / errs.size(), mx});
      }
    }
    if (!fam.empty()) std::printf("\nMoE rows left out with their source, per family:\n");
    for (const auto& [g, srcs] : fam) {
      double sum = 0, mx = 0;
      for (const auto& [mean, m] : srcs) sum += mean, mx = std::max(mx, m);
      std::printf("  %-26s %2zu sources  mean of source means %5.1f%%  max %5.1f%%\n", g.c_str(),
                  srcs.size(), 100 * sum / srcs.size(), 100 * mx);
    }
  }
  std::printf("\nconstants on a bound of their fit range (%s): %s\n", sets_file->c_str(),
              at_bound.empty() ? "none" : "a mechanism the model lacks, not a range to widen");
  for (const BoundHit& b : at_bound) std::printf("    %s\n", BoundText(b).c_str());
  std::printf("skipped %zu rows:\n", skipped.size());
  for (const auto& s : skipped) std::printf("    %s\n", s.c_str());
  return 0;
}

}  // namespace

Runner SetupValidate(CLI::App* sub) {
  auto f = std::make_shared<ValidateFlags>();
  sub->add_option("--runs", f->runs,
                  "published runs in ptdp's format, repeatable (default: the shipped "
                  "data/published/runs.yaml and megatron_recipes.yaml)");
  sub->add_option("--data", f->data,
                  "folder with vTrain's vtrain_single_node/measured.csv (not shipped), to add its rows");
  sub->add_option("--a100", f->a100, "cluster (name or file) for A100 rows (default dgx-a100)");
  sub->add_option("--h100", f->h100, "cluster (name or file) for H100 rows (default dgx-h100)");
  sub->add_option("--fit", f->fit_gpu, "refit constants on the runs of this GPU (A100, H100, B200, GB200, GB300)");
  sub->add_option("--fit-params", f->fit_params,
                  "name:lo:hi,... constants to fit (default: the GPU's set in the fit sets)");
  sub->add_option("--fit-sets", f->fit_sets,
                  "constants fitted per GPU and their ranges (default: the shipped data/published/fit.yaml)");
  sub->add_option("--rounds", f->rounds, "coordinate-descent rounds for --fit (default: the fit set's, else 4)")
      ->check(CLI::Range(1, 100));
  sub->add_flag("--leave-one-source-out", f->loso,
                "predict each source with constants fitted on the other sources of its GPU");
  sub->add_flag("--holdout", f->holdout, "with --fit: fit on even rows, report the odd ones");
  sub->add_flag("--verbose", f->verbose, "print every vTrain row too");
  sub->add_flag("--json", f->json, "machine-readable output");
  return [f] { return RunValidate(*f); };
}

}  // namespace ptdp::cli
