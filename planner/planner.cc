// Layout search; see planner.h. The inner loop allocates nothing: candidates are scored
// into a fixed-size top-K list.
#include "planner/planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "core/units.h"
#include "cost_model/simulator.h"

namespace ptdp {
namespace {

std::vector<int> Divisors(int64_t n) {
  std::vector<int> d;
  for (int64_t i = 1; i * i <= n; ++i) {
    if (n % i) continue;
    d.push_back(int(i));
    if (i * i != n) d.push_back(int(n / i));
  }
  std::sort(d.begin(), d.end());
  return d;
}

template <typename T>
std::vector<T> OneOr(const std::optional<T>& fixed, std::vector<T> all) {
  if (fixed) return {*fixed};
  return all;
}

// Keeps the k smallest by `key`, sorted. Keys are finite (SearchLayouts checks every
// estimate), so `<` is a strict weak ordering.
class TopK {
 public:
  explicit TopK(int k) : k_(std::max(1, k)) { items_.reserve(k_ + 1); }
  void Offer(const RankedLayout& r, double key) {
    if (int(items_.size()) == k_ && key >= items_.back().second) return;
    auto it = std::upper_bound(items_.begin(), items_.end(), key,
                               [](double v, const auto& e) { return v < e.second; });
    items_.insert(it, {r, key});
    if (int(items_.size()) > k_) items_.pop_back();
  }
  std::vector<RankedLayout> Take() const {
    std::vector<RankedLayout> out;
    for (const auto& [r, key] : items_) out.push_back(r);
    return out;
  }

 private:
  int k_;
  std::vector<std::pair<RankedLayout, double>> items_;
};

// TP groups stay inside an NVLink domain (a node, or an NVL72 rack of trays).
bool TpCrossesNode(int tp, int domain_gpus) {
  return tp > 1 && (tp > domain_gpus || domain_gpus % tp != 0);
}

}  // namespace

Status CheckSearchSpace(const ModelSpec& model, const ClusterSpec& cluster,
                        const SearchSpace& s) {
  auto positive = [](const std::optional<int>& v) { return !v || *v > 0; };
  if (!positive(s.tp) || !positive(s.pp) || !positive(s.dp) || !positive(s.vp) ||
      !positive(s.micro_batch) || s.cp <= 0)
    return Status::Error("--tp, --pp, --dp, --vp, --cp and --micro-batch must be positive");
  if (s.global_batch <= 0 || s.global_batch > kMaxGlobalBatch)
    return Status::Error("--global-batch " + std::to_string(s.global_batch) + " must be in 1.." +
                         std::to_string(kMaxGlobalBatch));
  if (s.world <= 0 || s.world > cluster.world())
    return Status::Error("--gpus " + std::to_string(s.world) + ": the cluster has " +
                         std::to_string(cluster.world()) + " GPUs");
  // 64 bits, and no growing past the world: the product of flags up to INT_MAX would overflow.
  int64_t fixed = s.cp;
  for (const auto& v : {s.tp, s.pp, s.dp})
    if (v && fixed <= s.world) fixed *= *v;
  if (fixed > s.world || s.world % fixed != 0)
    return Status::Error("fixed sizes (tp*cp*pp*dp so far " + std::to_string(fixed) +
                         ") do not divide the world size " + std::to_string(s.world));
  if (s.tp && s.pp && s.dp && fixed != s.world)
    return Status::Error("--tp " + std::to_string(*s.tp) + " * --pp " + std::to_string(*s.pp) +
                         " * --dp " + std::to_string(*s.dp) + " != " + std::to_string(s.world) +
                         " GPUs");
  if (s.tp && model.heads % *s.tp != 0)
    return Status::Error("--tp " + std::to_string(*s.tp) + ": heads " +
                         std::to_string(model.heads) + " are not divisible by it");
  if (s.pp && model.layers % *s.pp != 0)
    return Status::Error("--pp " + std::to_string(*s.pp) + ": layers " +
                         std::to_string(model.layers) + " are not divisible by it");
  if (s.precision == Precision::kFp8 && cluster.gpu.peak_fp8 <= 0)
    return Status::Error("--precision fp8: GPU " + cluster.gpu.name + " has no fp8 peak");
  if (s.precision == Precision::kFp4 && cluster.gpu.peak_fp4 <= 0)
    return Status::Error("--precision fp4: GPU " + cluster.gpu.name + " has no fp4 peak");
  return Status::Ok();
}

Result<PlanResult> SearchLayouts(const Estimator& est, const ModelSpec& model,
                                 const ClusterSpec& cluster, const SearchSpace& s, int top_k) {
  const auto start = std::chrono::steady_clock::now();
  PlanResult res;
  TopK best(top_k), small(top_k);
  const int gpn = cluster.nvlink_domain_gpus();
  const bool precision_ok = cluster.gpu.PeakFlops(s.precision) > 0;
  const int rest = s.world / s.cp;
  const std::vector<Recompute> recomputes =
      OneOr(s.recompute, {Recompute::kNone, Recompute::kSelective, Recompute::kFull});
  const std::vector<bool> dist_opts = OneOr(s.distributed_optimizer, {false, true});

  for (int tp : OneOr(s.tp, Divisors(rest))) {
    if (rest % tp) continue;
    for (int pp : OneOr(s.pp, Divisors(rest / tp))) {
      if ((rest / tp) % pp) continue;
      const int dp = rest / tp / pp;
      if (s.dp && *s.dp != dp) continue;
      const std::vector<int> vps = OneOr(s.vp, Divisors(std::max<int64_t>(1, model.layers / pp)));
      std::vector<int> mbs;
      if (s.micro_batch) mbs = {*s.micro_batch};
      else
        for (int b : Divisors(std::max<int64_t>(1, s.global_batch / dp)))
          if (b <= s.max_micro_batch) mbs.push_back(b);
      if (mbs.empty()) mbs = {1};
      const std::vector<bool> sps = OneOr(s.sequence_parallel, tp > 1 ? std::vector<bool>{false, true}
                                                                     : std::vector<bool>{false});
      for (int vp : vps)
        for (int mb : mbs)
          for (bool sp : sps)
            for (Recompute rc : recomputes)
              for (bool dopt : dist_opts) {
                // With no DP (dp x cp == 1) the distributed optimizer shards over one rank: the
                // same layout twice, unless asked for (issue 14: no duplicate rows).
                if (dopt && !s.distributed_optimizer && dp * s.cp == 1) continue;
                Layout l;
                l.tp = tp; l.pp = pp; l.dp = dp; l.vp = vp; l.cp = s.cp;
                l.micro_batch = mb;
                l.global_batch = s.global_batch;
                l.sequence_parallel = sp;
                l.recompute = rc;
                l.distributed_optimizer = dopt;
                l.precision = s.precision;
                l.schedule = vp > 1 ? ScheduleKind::kInterleaved : ScheduleKind::kOneFOneB;
                l.overlap_grad_reduce = s.overlap_grad_reduce;
                l.tp_comm_overlap = s.tp_comm_overlap;
                ++res.evaluated;
                Rejection why = CheckLayout(model, l);
                if (why == Rejection::kOk && !s.allow_tp_across_nodes && TpCrossesNode(tp, gpn))
                  why = Rejection::kTpCrossesNode;
                if (why == Rejection::kOk && !precision_ok) why = Rejection::kPrecisionUnsupported;
                if (why != Rejection::kOk) {
                  ++res.rejected[int(why)];
                  continue;
                }
                ++res.legal;
                RankedLayout r{l, est.Evaluate(l)};
                // The keys below must be numbers: a NaN breaks TopK's ordering.
                PTDP_RETURN_IF_ERROR(CheckEstimate(l, r.estimate));
                r.analytic_step_time_s = r.estimate.step_time_s;
                if (r.estimate.fits) {
                  ++res.fitting;
                  best.Offer(r, r.estimate.step_time_s);
                } else {
                  ++res.rejected[int(Rejection::kMemory)];
                  small.Offer(r, r.estimate.memory.total);
                }
              }
    }
  }
  res.top = best.Take();
  if (res.top.empty()) res.unfitting = small.Take();
  res.elapsed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return res;
}

Status RefineWithSimulator(const AnalyticModel& cost, int k, PlanResult* result) {
  const auto start = std::chrono::steady_clock::now();
  auto& top = result->top;
  const int n = std::min<int>(k, int(top.size()));
  SimOptions opt;
  opt.record_events = false;
  for (int i = 0; i < n; ++i) {
    RankedLayout& r = top[i];
    auto sim = SimulateStep(cost, r.layout, opt);
    if (!sim.ok()) return sim.status();
    Estimate& e = r.estimate;
    e.step_time_s = sim->step_time_s;
    e.breakdown = sim->breakdown;
    e.bubble_fraction = sim->bubble_fraction;
    e.mfu = e.model_flops / (e.step_time_s * r.layout.world() * cost.MfuPeak(r.layout.precision));
    r.simulated = true;
  }
  std::stable_sort(top.begin(), top.begin() + n, [](const RankedLayout& a, const RankedLayout& b) {
    return a.estimate.step_time_s < b.estimate.step_time_s;
  });
  result->elapsed_s +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return Status::Ok();
}

std::vector<std::string> ExplainChoice(const RankedLayout& a, const RankedLayout& b) {
  std::vector<std::string> out;
  char buf[256];
  const double ta = a.estimate.step_time_s, tb = b.estimate.step_time_s;
  std::snprintf(buf, sizeof buf, "%s [%s] beats %s [%s] by %.3f s per step (%.1f%%)",
                a.layout.ShortName().c_str(), a.layout.Knobs().c_str(),
                b.layout.ShortName().c_str(), b.layout.Knobs().c_str(), tb - ta,
                100.0 * (tb - ta) / tb);
  out.push_back(buf);
  struct Part { const char* name; double da; double db; };
  const Breakdown& x = a.estimate.breakdown;
  const Breakdown& y = b.estimate.breakdown;
  std::vector<Part> parts = {{"compute", x.compute_s, y.compute_s},
                             {"TP communication", x.tp_comm_s, y.tp_comm_s},
                             {"pipeline bubble", x.bubble_s, y.bubble_s},
                             {"PP communication", x.pp_comm_s, y.pp_comm_s},
                             {"DP communication", x.dp_comm_s, y.dp_comm_s},
                             {"optimizer", x.optimizer_s, y.optimizer_s}};
  std::sort(parts.begin(), parts.end(), [](const Part& p, const Part& q) {
    return std::fabs(p.da - p.db) > std::fabs(q.da - q.db);
  });
  for (int i = 0; i < 3; ++i) {
    const Part& p = parts[i];
    if (std::fabs(p.da - p.db) < 1e-6) break;
    std::snprintf(buf, sizeof buf, "  %s: %.3f s vs %.3f s (%s%.3f s)", p.name, p.da, p.db,
                  p.da < p.db ? "-" : "+", std::fabs(p.da - p.db));
    out.push_back(buf);
  }
  const Layout& la = a.layout;
  const Layout& lb = b.layout;
  std::string knobs;
  auto diff = [&](const char* name, const std::string& va, const std::string& vb) {
    if (va != vb) knobs += std::string(knobs.empty() ? "" : ", ") + name + " " + va + " vs " + vb;
  };
  diff("tp", std::to_string(la.tp), std::to_string(lb.tp));
  diff("pp", std::to_string(la.pp), std::to_string(lb.pp));
  diff("dp", std::to_string(la.dp), std::to_string(lb.dp));
  diff("vp", std::to_string(la.vp), std::to_string(lb.vp));
  diff("micro-batch", std::to_string(la.micro_batch), std::to_string(lb.micro_batch));
  diff("sp", la.sequence_parallel ? "on" : "off", lb.sequence_parallel ? "on" : "off");
  diff("recompute", ToString(la.recompute), ToString(lb.recompute));
  diff("dist-opt", la.distributed_optimizer ? "on" : "off", lb.distributed_optimizer ? "on" : "off");
  if (!knobs.empty()) out.push_back("  differing knobs: " + knobs);
  out.push_back("  memory: " + FormatBytes(a.estimate.memory.total) + " vs " +
                FormatBytes(b.estimate.memory.total) + " per GPU");
  return out;
}

}  // namespace ptdp
