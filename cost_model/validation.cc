// Validation and fitting on measured runs; see validation.h.
#include "cost_model/validation.h"

#include <algorithm>
#include <cmath>

#include "cost_model/analytic.h"
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
    if (e > s.max_abs) { s.max_abs = e; s.worst = r.id; }
  }
  s.mean_abs /= rows.size();
  std::sort(errs.begin(), errs.end());
  s.median_abs = errs[errs.size() / 2];
  return s;
}

namespace {

Result<double> PredictOne(const MeasuredRun& run, const ClusterSpec& base) {
  ClusterSpec c = base;
  c.nodes = std::max(1, (run.gpus + c.gpus_per_node - 1) / c.gpus_per_node);
  PTDP_ASSIGN_OR_RETURN(Topology topo, Topology::Build(c));
  PTDP_ASSIGN_OR_RETURN(AnalyticModel cost, AnalyticModel::Create(run.model, topo));
  if (run.per_layer) {  // Korthikanti table 4: fwd + bwd of one layer, TP communication included
    const LayerTimes lt = cost.Layer(run.layout);
    return lt.fwd_compute_s + lt.bwd_compute_s + lt.fwd_tp_s + lt.bwd_tp_s;
  }
  const Rejection why = CheckLayout(run.model, run.layout);
  if (why != Rejection::kOk) return Status::Error(ExplainRejection(why, run.model, run.layout));
  const Estimate e = cost.Evaluate(run.layout);
  PTDP_RETURN_IF_ERROR(CheckEstimate(run.layout, e));
  return e.step_time_s;
}

std::string GroupOf(const MeasuredRun& run) {
  if (run.per_layer) return "layer (" + run.gpu + ")";
  if (run.id.rfind("vtrain:", 0) == 0) return "vtrain (" + run.gpu + ")";
  return "published (" + run.gpu + ")";
}

double MeanAbsError(const std::vector<MeasuredRun>& runs, const ClusterSpec& c) {
  double sum = 0;
  size_t n = 0;
  for (const auto& run : runs) {
    auto p = PredictOne(run, c);
    if (!p.ok()) continue;
    sum += std::fabs((*p - run.measured_s) / run.measured_s);
    ++n;
  }
  return n ? sum / n : 0;
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
    rows.push_back({run.id, GroupOf(run), run.measured_s, *p});
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
  auto value = [&](const FitParam& p) {
    auto it = c.calibration.find(p.name);
    if (it != c.calibration.end()) return it->second;
    auto k = ConstantsFor(c);
    for (const auto& row : ConstantTable())
      if (p.name == row.name) return (*k).*(row.field);
    return p.lo;
  };
  double best = MeanAbsError(runs, c);
  for (int round = 0; round < rounds; ++round) {
    const double step = 0.25 / (1 << std::min(round, 4));  // 25%, 12.5%, ... multiplicative
    for (const FitParam& p : params) {
      for (double dir : {1.0 + step, 1.0 / (1.0 + step)}) {
        for (;;) {
          const double old = value(p);
          const double tried = std::clamp(old * dir, p.lo, p.hi);
          if (tried == old) break;
          c.calibration[p.name] = tried;
          const double err = MeanAbsError(runs, c);
          if (err < best - 1e-6) { best = err; continue; }
          c.calibration[p.name] = old;
          break;
        }
      }
    }
  }
  std::map<std::string, double> out;
  for (const FitParam& p : params) out[p.name] = value(p);
  return out;
}

}  // namespace ptdp
