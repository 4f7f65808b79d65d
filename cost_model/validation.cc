// Validation and fitting on measured runs; see validation.h.
#include "cost_model/validation.h"

#include <algorithm>
#include <cmath>

#include "core/file_io.h"
#include "core/yaml_reader.h"
#include "cost_model/analytic.h"
#include "cost_model/hardware_table.h"
#include "topology/topology.h"

namespace ptdp {

ErrorStats Summarize(const std::vector<ValidationRow>& rows) {
  ErrorStats s;
  s.rows = rows.size();
  if (rows.empty()) return s;
  std::vector<double> errs;
  for (const auto& r : rows) {
    const double e = std::fabs(r.error());
    errs.push_back(e);
    s.mean_abs += e;
    s.bias += r.error();
    if (e > s.max_abs) { s.max_abs = e; s.worst = r.id; }
  }
  s.mean_abs /= rows.size();
  s.bias /= rows.size();
  std::sort(errs.begin(), errs.end());
  s.median_abs = errs[errs.size() / 2];
  return s;
}

std::vector<SourceStats> BySource(const std::vector<ValidationRow>& rows) {
  std::map<std::pair<std::string, std::string>, std::vector<ValidationRow>> by;
  for (const ValidationRow& r : rows) by[{r.source, r.gpu}].push_back(r);
  std::vector<SourceStats> out;
  for (const auto& [key, rs] : by) out.push_back({key.first, key.second, Summarize(rs)});
  std::stable_sort(out.begin(), out.end(), [](const SourceStats& a, const SourceStats& b) {
    return a.stats.rows > b.stats.rows;
  });
  return out;
}

namespace {

struct RunPrediction {
  double step_s = 0;
  MemoryBytes memory;  // the most loaded stage's
};

Result<RunPrediction> PredictOne(const MeasuredRun& run, const ClusterSpec& base) {
  ClusterSpec c = base;
  c.nodes = std::max(1, (run.gpus + c.gpus_per_node - 1) / c.gpus_per_node);
  // Whole NVLink domains: a 256-GPU run on NVL72 racks (64 trays) sits on 4 racks (72 trays).
  const int npd = c.nodes_per_nvlink_domain;
  c.nodes = (c.nodes + npd - 1) / npd * npd;
  PTDP_ASSIGN_OR_RETURN(Topology topo, Topology::Build(c));
  PTDP_ASSIGN_OR_RETURN(AnalyticModel cost, AnalyticModel::Create(run.model, topo));
  if (run.per_layer) {  // Korthikanti table 4: fwd + bwd of one layer, TP communication included
    const LayerTimes lt = cost.Layer(run.layout);
    return RunPrediction{lt.fwd_compute_s + lt.bwd_compute_s + lt.fwd_tp_s + lt.bwd_tp_s, {}};
  }
  const Rejection why = CheckLayout(run.model, run.layout);
  if (why != Rejection::kOk) return Status::Error(ExplainRejection(why, run.model, run.layout));
  const Estimate e = cost.Evaluate(run.layout);
  PTDP_RETURN_IF_ERROR(CheckEstimate(run.layout, e));
  return RunPrediction{e.step_time_s, e.memory};
}

std::string GroupOf(const MeasuredRun& run) {
  if (run.per_layer) return "layer (" + run.gpu + ")";
  if (run.id.rfind("vtrain:", 0) == 0) return "vtrain (" + run.gpu + ")";
  if (run.model.moe()) return "moe " + (run.family.empty() ? run.model.name : run.family) + " (" + run.gpu + ")";
  return "published (" + run.gpu + ")";
}

// The fit's objective: the mean |error| of each source, averaged over the sources, so that
// every source weighs the same whatever its row count (vTrain's 1,440 small single-node runs
// would otherwise decide the GEMM efficiency that Korthikanti's 5 large layers measure).
double MeanAbsError(const std::vector<MeasuredRun>& runs, const ClusterSpec& c) {
  std::map<std::string, std::pair<double, size_t>> by_source;
  for (const auto& run : runs) {
    auto p = PredictOne(run, c);
    if (!p.ok()) continue;
    auto& [sum, n] = by_source[run.source];
    sum += std::fabs((p->step_s - run.measured_s) / run.measured_s);
    ++n;
  }
  double total = 0;
  for (const auto& [source, acc] : by_source) total += acc.first / acc.second;
  return by_source.empty() ? 0 : total / by_source.size();
}

}  // namespace

std::vector<ValidationRow> PredictRuns(const std::vector<MeasuredRun>& runs,
                                       const ClusterByGpu& clusters,
                                       std::vector<std::string>* skipped) {
  std::vector<ValidationRow> rows;
  for (const auto& run : runs) {
    auto it = clusters.find(run.gpu);
    if (it == clusters.end()) {
      skipped->push_back(run.id + ": no cluster file for GPU " + run.gpu);
      continue;
    }
    auto p = PredictOne(run, it->second);
    if (!p.ok()) {
      skipped->push_back(run.id + ": " + p.status().message());
      continue;
    }
    rows.push_back({run.id, GroupOf(run), run.measured_s, p->step_s, run.source, run.gpu,
                    p->memory.total, p->memory.capacity, p->memory});
  }
  return rows;
}

std::map<std::string, double> FitConstants(const std::vector<MeasuredRun>& all,
                                           const std::string& gpu,
                                           const std::vector<FitParam>& params,
                                           ClusterByGpu* clusters, int rounds) {
  std::vector<MeasuredRun> runs;
  for (const auto& r : all)
    if (r.gpu == gpu) runs.push_back(r);
  ClusterSpec& c = (*clusters)[gpu];
  auto value = [&](const FitParam& p) { return ConstantValue(c, p.name); };
  // A constant outside its range (e.g. a default of 0, which multiplicative steps never leave)
  // starts at the range's geometric middle.
  for (const FitParam& p : params) {
    const double v = value(p);
    if (!(v >= p.lo && v <= p.hi)) c.calibration[p.name] = std::sqrt(p.lo * p.hi);
  }
  // The Mixture-of-Experts constants change no dense row: the others are fitted on the dense
  // rows, then these on the MoE rows with the others fixed (so MoE rows never move a dense
  // constant, and a dense fit is the same with or without MoE rows in the data).
  // Likewise the hybrid models' constant, last, on the hybrid rows with the others fixed.
  enum Pass { kDensePass, kMoePass, kHybridPass };
  auto pass_of = [](const std::string& name) {
    if (name == "all_to_all_eff" || name == "grouped_gemm_eff" || name == "moe_dropless_load")
      return kMoePass;
    return name == "ssm_scan_eff" ? kHybridPass : kDensePass;
  };
  auto descend = [&](const std::vector<MeasuredRun>& rows, Pass pass) {
    std::vector<FitParam> ps;
    for (const FitParam& p : params)
      if (pass_of(p.name) == pass) ps.push_back(p);
    if (ps.empty() || rows.empty()) return;
    double best = MeanAbsError(rows, c);
    for (int round = 0; round < rounds; ++round) {
      const double step = 0.25 / (1 << std::min(round, 4));  // 25%, 12.5%, ... multiplicative
      for (const FitParam& p : ps) {
        for (double dir : {1.0 + step, 1.0 / (1.0 + step)}) {
          for (;;) {
            const double old = value(p);
            const double tried = std::clamp(old * dir, p.lo, p.hi);
            if (tried == old) break;
            c.calibration[p.name] = tried;
            const double err = MeanAbsError(rows, c);
            if (err < best - 1e-6) { best = err; continue; }
            c.calibration[p.name] = old;
            break;
          }
        }
      }
    }
  };
  std::vector<MeasuredRun> dense, moe, hybrid;
  for (const MeasuredRun& r : runs)
    (r.model.hybrid() ? hybrid : r.model.moe() ? moe : dense).push_back(r);
  descend(dense, kDensePass);
  descend(moe, kMoePass);
  descend(hybrid, kHybridPass);
  std::map<std::string, double> out;
  for (const FitParam& p : params) out[p.name] = value(p);
  return out;
}

double ConstantValue(const ClusterSpec& cluster, const std::string& name) {
  auto it = cluster.calibration.find(name);
  if (it != cluster.calibration.end()) return it->second;
  const Result<CostConstants> k = ConstantsFor(cluster);
  const CostConstants defaults = k.ok() ? *k : CostConstants{};
  for (const auto& row : ConstantTable())
    if (name == row.name) return defaults.*(row.field);
  return std::nan("");
}

Result<FitSets> LoadFitSets(const std::string& path) {
  PTDP_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlFile(path, "a fit-set YAML", kMaxDataBytes));
  YamlReader r(root, path, "");
  if (r.PositiveInt("ptdp_fit_version") != 1) r.Fail("ptdp_fit_version", "only version 1 is understood");
  const YAML::Node gpus = r.Child("gpus");
  PTDP_RETURN_IF_ERROR(r.Finish());
  if (!gpus.IsMap()) return Status::Error(path + ": 'gpus' must be a mapping of GPU kinds");
  FitSets sets;
  for (auto g = gpus.begin(); g != gpus.end(); ++g) {
    const std::string gpu = g->first.Scalar(), where = "gpus." + gpu;
    YamlReader gr(g->second, path, where);
    FitSet set;
    set.rounds = gr.PositiveIntAtMost("rounds", 100, 6);
    const YAML::Node params = gr.Child("params");
    PTDP_RETURN_IF_ERROR(gr.Finish());
    if (!params.IsMap() || params.size() == 0)
      return Status::Error(path + ": " + where + ".params must be a mapping of constant: [lo, hi]");
    for (auto p = params.begin(); p != params.end(); ++p) {
      const std::string name = p->first.Scalar();
      const std::string at = path + ":" + std::to_string(p->first.Mark().line + 1) + ": " +
                             where + ".params." + name;
      const ConstantInfo* row = nullptr;
      for (const auto& r : ConstantTable())
        if (name == r.name) row = &r;
      if (row == nullptr)
        return Status::Error(at + ": not a constant of the cost model (cost_model/hardware_table.h)");
      FitParam fp{name, 0, 0};
      const YAML::Node range = p->second;
      bool ok = range.IsSequence() && range.size() == 2;
      for (size_t k = 0; ok && k < 2; ++k)
        ok = range[k].IsScalar() && ParsePlainNumber(range[k].Scalar(), k == 0 ? &fp.lo : &fp.hi) &&
             std::isfinite(k == 0 ? fp.lo : fp.hi);
      if (!ok || !(fp.lo > 0) || fp.hi < fp.lo)
        return Status::Error(at + ": expected [lo, hi] with 0 < lo <= hi");
      if (!row->range.Contains(fp.lo) || !row->range.Contains(fp.hi))
        return Status::Error(at + ": [" + range[0].Scalar() + ", " + range[1].Scalar() +
                             "] leaves the constant's range: it must be " + row->range.Describe());
      set.params.push_back(fp);
    }
    sets[gpu] = set;
  }
  return sets;
}

namespace {
std::vector<BoundHit> AtBound(const std::string& gpu, const ClusterSpec& c, const FitSet& set) {
  std::vector<BoundHit> out;
  for (const FitParam& p : set.params) {
    const double v = ConstantValue(c, p.name);
    const bool lo = v <= p.lo * (1 + 1e-3), hi = v >= p.hi * (1 - 1e-3);
    if (lo || hi) out.push_back({gpu, p.name, v, p.lo, p.hi, hi && !lo});
  }
  return out;
}
}  // namespace

std::vector<BoundHit> ConstantsAtBound(const ClusterByGpu& clusters, const FitSets& sets) {
  std::vector<BoundHit> out;
  for (const auto& [gpu, set] : sets) {
    auto c = clusters.find(gpu);
    if (c == clusters.end()) continue;
    for (BoundHit& h : AtBound(gpu, c->second, set)) out.push_back(std::move(h));
  }
  return out;
}

std::vector<HeldOutSource> LeaveOneSourceOut(const std::vector<MeasuredRun>& runs,
                                             const ClusterByGpu& clusters, const FitSets& sets) {
  std::vector<std::pair<std::string, std::string>> sources;  // (source, gpu), first seen first
  for (const MeasuredRun& r : runs)
    if (std::find(sources.begin(), sources.end(), std::pair(r.source, r.gpu)) == sources.end())
      sources.emplace_back(r.source, r.gpu);
  std::vector<HeldOutSource> out;
  for (const auto& [source, gpu] : sources) {
    std::vector<MeasuredRun> held, train;
    for (const MeasuredRun& r : runs) {
      if (r.gpu != gpu) continue;
      (r.source == source ? held : train).push_back(r);
    }
    HeldOutSource h;
    ClusterByGpu fitted = clusters;
    auto set = sets.find(gpu);
    if (set != sets.end() && !train.empty() && fitted.count(gpu)) {
      h.constants = FitConstants(train, gpu, set->second.params, &fitted, set->second.rounds);
      std::vector<std::string> unpredictable;  // rows the fit could not use either
      h.fitted_on_rows = PredictRuns(train, clusters, &unpredictable).size();
      h.at_bound = AtBound(gpu, fitted.at(gpu), set->second);
    }
    std::vector<std::string> skipped;
    const std::vector<ValidationRow> rows = PredictRuns(held, fitted, &skipped);
    h.held_out = {source, gpu, Summarize(rows)};
    h.rows = rows;
    out.push_back(std::move(h));
  }
  std::stable_sort(out.begin(), out.end(), [](const HeldOutSource& a, const HeldOutSource& b) {
    return a.held_out.stats.rows > b.held_out.stats.rows;
  });
  return out;
}

}  // namespace ptdp
