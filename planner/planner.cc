// Layout search; see planner.h. The inner loop allocates nothing: candidates are scored
// into a fixed-size top-K list.
#include "planner/planner.h"

#include <algorithm>
#include <numeric>
#include <optional>
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
  const std::pair<const char*, const Choice<int>*> sizes[] = {
      {"--tp", &s.tp}, {"--pp", &s.pp}, {"--dp", &s.dp}, {"--vp", &s.vp}, {"--cp", &s.cp},
      {"--micro-batch", &s.micro_batch}};
  for (const auto& [flag, c] : sizes)
    for (int v : c->values())
      if (v <= 0)
        return Status::Error(std::string(flag) + " " + std::to_string(v) + " must be positive");
  if (s.global_batch <= 0 || s.global_batch > kMaxGlobalBatch)
    return Status::Error("--global-batch " + std::to_string(s.global_batch) + " must be in 1.." +
                         std::to_string(kMaxGlobalBatch));
  if (s.recompute_modules) {  // what the model lacks, said once (every layout would refuse it)
    Layout l;
    l.recompute = Recompute::kSelective;
    l.recompute_modules = s.recompute_modules;
    const std::string why = RecomputeModulesProblem(model, l);
    if (!why.empty()) return Status::Error("--recompute-modules: " + why);
    if (s.runtime_layouts && (s.recompute_modules & ~kRecomputeCoreAttn))
      return Status::Error("--recompute-modules " + RecomputeModulesString(s.recompute_modules) +
                           ": ptdp's runtime reruns the attention core only (core_attn)");
  }
  if (s.world <= 0 || s.world > cluster.world())
    return Status::Error("--gpus " + std::to_string(s.world) + ": the cluster has " +
                         std::to_string(cluster.world()) + " GPUs");
  if (!(s.memory_headroom >= 0 && s.memory_headroom < 1))
    return Status::Error("--memory-headroom " + std::to_string(s.memory_headroom) +
                         " must be a fraction in [0, 1)");
  for (const auto& [flag, c] : {sizes[0], sizes[1], sizes[2], sizes[4]})
    for (int v : c->values())
      if (s.world % v != 0)
        return Status::Error(std::string(flag) + " " + std::to_string(v) +
                             " does not divide the world size " + std::to_string(s.world));
  // One value each: their product must divide the world (64 bits: flags up to INT_MAX).
  int64_t fixed = 1;
  for (const Choice<int>* c : {&s.tp, &s.cp, &s.pp, &s.dp})
    if (c->single() && fixed <= s.world) fixed *= **c;
  if (fixed > s.world || s.world % fixed != 0)
    return Status::Error("fixed sizes (tp*cp*pp*dp so far " + std::to_string(fixed) +
                         ") do not divide the world size " + std::to_string(s.world));
  if (s.tp.single() && s.pp.single() && s.dp.single() && s.cp.single() && fixed != s.world)
    return Status::Error("--tp " + std::to_string(*s.tp) + " * --cp " + std::to_string(*s.cp) +
                         " * --pp " + std::to_string(*s.pp) + " * --dp " + std::to_string(*s.dp) +
                         " != " + std::to_string(s.world) + " GPUs");
  for (const auto& [flag, c] : {std::pair<const char*, const Choice<int>*>{"--expert-model-parallel-size", &s.ep},
                                {"--expert-tensor-parallel-size", &s.etp}})
    for (int v : c->values()) {
      if (v <= 0 || s.world % v != 0)
        return Status::Error(std::string(flag) + " " + std::to_string(v) +
                             " must be positive and divide the world size " +
                             std::to_string(s.world));
      if (!model.moe() && v != 1)
        return Status::Error(std::string(flag) + " " + std::to_string(v) + ": model " +
                             model.name + " has no experts (num_experts 0)");
    }
  for (int ep : s.ep.values())
    if (model.moe() && model.num_experts % ep != 0)
      return Status::Error("--expert-model-parallel-size " + std::to_string(ep) + ": num_experts " +
                           std::to_string(model.num_experts) + " is not divisible by it");
  for (int tp : s.tp.values())
    if (model.heads % tp != 0)
      return Status::Error("--tp " + std::to_string(tp) + ": heads " +
                           std::to_string(model.heads) + " are not divisible by it");
  for (int cp : s.cp.values())
    if (cp > 1 && model.seq_len % (2 * cp) != 0)
      return Status::Error("--cp " + std::to_string(cp) + ": seq_len " +
                           std::to_string(model.seq_len) + " is not divisible by 2 x cp");
  if (s.split_search == SplitSearch::kFixed && s.split.pipeline_layout && s.pp.single() &&
      s.split.pipeline_layout->layers.size() % size_t(*s.pp) != 0)
    return Status::Error("--pipeline-model-parallel-layout '" + s.split.pipeline_layout->text +
                         "' has " + std::to_string(s.split.pipeline_layout->layers.size()) +
                         " stages, not a multiple of --pp " + std::to_string(*s.pp));
  if (s.precision == Precision::kFp8 && cluster.gpu.peak_fp8 <= 0)
    return Status::Error("--precision fp8: GPU " + cluster.gpu.name + " has no fp8 peak");
  if (s.precision == Precision::kFp4 && cluster.gpu.peak_fp4 <= 0)
    return Status::Error("--precision fp4: GPU " + cluster.gpu.name + " has no fp4 peak");
  return Status::Ok();
}

namespace {

// Whether Megatron accepts how `l` splits the layers (its other rules aside).
bool SplitLegal(const ModelSpec& model, const Layout& l) {
  const Rejection why = CheckLayout(model, l);
  return why != Rejection::kLayersPp && why != Rejection::kLayersVp &&
         why != Rejection::kUnevenSplit && why != Rejection::kPipelineLayout;
}

void CopySplit(const Layout& from, Layout* to) {
  to->first_stage_layers = from.first_stage_layers;
  to->last_stage_layers = from.last_stage_layers;
  to->embedding_in_split = from.embedding_in_split;
  to->loss_in_split = from.loss_in_split;
  to->pipeline_layout = from.pipeline_layout;
}

// The splits tried at pipeline size p, each as a layout holding pp, vp, the schedule and
// Megatron's split flags (the rest left at the defaults, filled in by the search). Fixed: the user's, at each vp asked for (or the layout
// string's). Otherwise the even split at every vp dividing L/p (CheckLayout names why it is
// illegal when p does not divide L), and where Megatron accepts them and they place the layers
// differently: the embedding and/or loss counted as a layer's slot
// (--account-for-embedding/loss-in-pipeline-split), and first/last-stage counts
// (--decoder-first/last-pipeline-num-layers) around middle stages of q layers, q a multiple of
// vp next to L/p, the rest shared by the first and last stage both ways round, or given to one
// when it makes that stage the lighter one.
std::vector<Layout> SplitsFor(const ModelSpec& model, int p, const SearchSpace& s) {
  std::vector<Layout> out;
  const int64_t L = model.layers;
  auto split = [&](int v, const Layout& flags) {
    Layout l;
    l.pp = p;
    l.vp = v;
    l.schedule = v > 1 ? ScheduleKind::kInterleaved : ScheduleKind::kOneFOneB;
    CopySplit(flags, &l);
    return l;
  };
  if (s.split_search == SplitSearch::kFixed) {
    if (s.split.pipeline_layout) {
      out.push_back(split(std::max(1, int(s.split.pipeline_layout->layers.size() / size_t(p))),
                          s.split));
      return out;
    }
    const int64_t per_rank =
        std::max<int64_t>(1, s.split.first_stage_layers > 0 ? s.split.first_stage_layers
                             : s.split.last_stage_layers > 0 ? s.split.last_stage_layers
                             : (L + s.split.embedding_in_split + s.split.loss_in_split) / p);
    for (int v : s.vp.Or(Divisors(per_rank))) out.push_back(split(v, s.split));
    return out;
  }
  for (int v : s.vp.Or(Divisors(std::max<int64_t>(1, L / p)))) out.push_back(split(v, Layout{}));
  if (p == 1 || s.split_search == SplitSearch::kEvenOnly) return out;
  // The alternatives, kept when legal and placing the layers unlike every split before them.
  std::vector<std::vector<int>> seen;
  for (const Layout& l : out)
    if (SplitLegal(model, l)) seen.push_back(StageLayers(model, l));
  auto offer = [&](int v, int first, int last, bool emb, bool loss) {
    if (!s.vp.Allows(v)) return;
    Layout flags;
    flags.first_stage_layers = first;
    flags.last_stage_layers = last;
    flags.embedding_in_split = emb;
    flags.loss_in_split = loss;
    const Layout l = split(v, flags);
    if (!SplitLegal(model, l)) return;
    std::vector<int> layers = StageLayers(model, l);
    if (std::find(seen.begin(), seen.end(), layers) != seen.end()) return;
    seen.push_back(std::move(layers));
    out.push_back(l);
  };
  for (int extra : {2, 1})
    if ((L + extra) % p == 0)
      for (int v : Divisors((L + extra) / p)) {
        if (extra == 2) offer(v, 0, 0, true, true);
        else offer(v, 0, 0, false, true), offer(v, 0, 0, true, false);
      }
  for (int v : Divisors(std::max<int64_t>(1, (L + p - 1) / p))) {
    if (!s.vp.Allows(v)) continue;
    const int64_t lo = L / p / v * v, hi = (L + p * int64_t(v) - 1) / (p * int64_t(v)) * v;
    for (int64_t q : {lo, hi}) {
      if (q < v) continue;
      const int64_t rest = L - (p - 2) * q;  // first + last
      if (rest >= 2 * v && rest % v == 0) {
        const int64_t half = rest / 2 / v * v;
        offer(v, int(rest - half), int(half), false, false);
        offer(v, int(half), int(rest - half), false, false);
      }
      const int64_t one = L - (p - 1) * q;  // first or last alone, the lighter end
      if (one >= v && one < q && one % v == 0) {
        offer(v, int(one), 0, false, false);
        offer(v, 0, int(one), false, false);
      }
    }
  }
  // A --pipeline-model-parallel-layout string, as Megatron-Bridge writes them for DeepSeek-V3
  // ("Et|(tt|)*30mL": 61 layers over 32 virtual stages): c = ceil((L + 2)/S) layers per
  // stage, one fewer beside the embedding, the rest (and the MTP layers) with the loss; any
  // virtual-stage count, where the forms above need L or F/v, G/v to divide.
  for (int v : s.vp.Or({1, 2, 4, 8})) {
    const int64_t S = int64_t(p) * v, c = (L + 2 + S - 1) / S;
    const int64_t last = L - (c - 1) - (S - 2) * c;
    if (S < 2 || c < 1 || last < 0 || last > c) continue;
    std::string text = "E" + std::string(size_t(c - 1), 't') + "|";
    if (S > 2) text += "(" + std::string(size_t(c), 't') + "|)*" + std::to_string(S - 2);
    text += std::string(size_t(last), 't') + std::string(size_t(model.mtp_layers), 'm') + "L";
    Result<PipelineLayout> pl = ParsePipelineLayout(text);
    if (!pl.ok() || !s.vp.Allows(v)) continue;
    Layout l = split(v, Layout{});
    l.pipeline_layout = std::make_shared<const PipelineLayout>(std::move(*pl));
    if (!SplitLegal(model, l)) continue;
    std::vector<int> layers = StageLayers(model, l);
    if (std::find(seen.begin(), seen.end(), layers) != seen.end()) continue;
    seen.push_back(std::move(layers));
    out.push_back(l);
  }
  return out;
}

// A layout's estimate as the ranking takes it: it fits when the estimator says so (host memory
// included) and its GPU needs at most `usable` of the capacity.
RankedLayout Ranked(const Estimator& est, const Layout& l, double usable) {
  RankedLayout r{l, est.Evaluate(l)};
  r.analytic_step_time_s = r.estimate.step_time_s;
  r.estimate.fits =
      r.estimate.fits && r.estimate.memory.total <= r.estimate.memory.capacity * usable;
  return r;
}

// --cpu-offloading-num-layers for a layout `l` that does not fit (estimate `e`): the fewest
// layers whose offloaded activations bring it within `usable` of the GPU's memory, or nothing
// where Megatron's rules refuse offloading (pp > 1, recompute) or no N < L is enough. Steps
// by the layers' mean share of the activations (the embedding's and the loss's bytes, which
// stay, make it a little more than a layer's) while the estimate is over, then back down while
// one layer fewer still fits.
std::optional<RankedLayout> FewestOffloadedLayers(const Estimator& est, const ModelSpec& model,
                                                  const Layout& l, const Estimate& e,
                                                  double usable) {
  Layout o = l;
  o.cpu_offload_layers = 1;
  if (CheckLayout(model, o) != Rejection::kOk || model.layers < 2) return std::nullopt;
  const double per_layer = e.memory.activations / model.layers;
  if (per_layer <= 0) return std::nullopt;
  double over = e.memory.total - e.memory.capacity * usable;
  const int last = int(model.layers) - 1;  // Megatron: N < num_layers
  int n = 0;
  for (int tries = 0; tries < 8 && over > 0; ++tries) {
    n = std::min(last, n + std::max(1, int(std::ceil(over / per_layer))));
    o.cpu_offload_layers = n;
    RankedLayout fit = Ranked(est, o, usable);
    if (fit.estimate.fits) {
      for (int down = 0; down < 16 && o.cpu_offload_layers > 1; ++down) {
        --o.cpu_offload_layers;
        RankedLayout fewer = Ranked(est, o, usable);
        if (!fewer.estimate.fits) break;
        fit = fewer;
      }
      return fit;
    }
    over = fit.estimate.memory.total - e.memory.capacity * usable;
    if (n == last) break;
  }
  return std::nullopt;
}

Result<PlanResult> SearchOnce(const Estimator& est, const ModelSpec& model,
                              const ClusterSpec& cluster, const SearchSpace& s, int top_k) {
  const auto start = std::chrono::steady_clock::now();
  PlanResult res;
  TopK best(top_k), small(top_k);
  const int gpn = cluster.nvlink_domain_gpus();
  const bool precision_ok = cluster.gpu.PeakFlops(s.precision) > 0;
  const std::vector<Recompute> recomputes =
      s.recompute.Or({Recompute::kNone, Recompute::kSelective, Recompute::kFull});
  const std::vector<bool> dist_opts = s.distributed_optimizer.Or({false, true});
  const double usable = 1 - s.memory_headroom;

  for (int tp : s.tp.Or(Divisors(s.world))) {
    if (s.world % tp) continue;
    // Context parallelism: searched where the sequence splits (CheckLayout), rank order
    // tp-cp-dp-pp. TP stays inside the NVLink domain (its collectives block every layer); the
    // CP ring may leave it: it overlaps attention and the cost model prices it on the link it
    // crosses (NeMo's long-sequence recipes run cp 2-16 across nodes). Keeping TP x CP inside
    // made the pick at 32K tokens 20% slower than a forced cp 4 (tests/planner/
    // pipeline_search_test.cc).
    for (int cp : s.cp.Or(Divisors(s.world / tp))) {
      if ((s.world / tp) % cp) continue;
      const int rest = s.world / tp / cp;
      for (int pp : s.pp.Or(Divisors(rest))) {
        if (rest % pp) continue;
        const int dp = rest / pp;
        if (!s.dp.Allows(dp)) continue;
        const std::vector<Layout> splits = SplitsFor(model, pp, s);
        std::vector<int> mbs;
        if (s.micro_batch) mbs = s.micro_batch.values();
        else
          for (int b : Divisors(std::max<int64_t>(1, s.global_batch / dp)))
            if (b <= s.max_micro_batch) mbs.push_back(b);
        if (mbs.empty()) mbs = {1};
        const std::vector<bool> sps = s.sequence_parallel.Or(
            tp > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false});
        // The expert grid (MoE models): etp 1 or tp (Megatron's default; the recipes use 1), and
        // every ep dividing the experts that folds over tp x cp x dp with it (parallel folding).
        std::vector<std::pair<int, int>> grids;  // (ep, etp)
        if (!model.moe()) {
          grids.push_back({1, 0});
        } else {
          std::vector<int> etps = s.etp.Or(tp > 1 ? std::vector<int>{1, tp} : std::vector<int>{1});
          for (int etp : etps) {
            const int64_t fold = int64_t(tp) * cp * dp;
            if (fold % etp) continue;
            for (int ep : s.ep.Or(Divisors(std::gcd<int64_t>(model.num_experts, fold / etp))))
              grids.push_back({ep, etp});
          }
          if (grids.empty()) grids.push_back({1, tp});  // CheckLayout names the broken rule
        }
        for (const auto& [ep, etp] : grids)
        for (const Layout& split : splits)
          for (int mb : mbs)
            for (bool sp : sps)
              for (Recompute rc : recomputes)
                for (bool dopt : dist_opts)
                for (bool shard : s.shard_gradients.Or({false}))
                for (bool zero3 : s.shard_params.Or({false})) {
                  // Gradient sharding rides on the distributed optimizer, weight sharding on
                  // gradient sharding, and they shard nothing over one rank.
                  if (shard && (!dopt || dp * cp == 1)) continue;
                  if (zero3 && !shard) continue;
                  // With no DP (dp x cp == 1) the distributed optimizer shards over one rank: the
                  // same layout twice, unless asked for (issue 14: no duplicate rows).
                  if (dopt && !s.distributed_optimizer && dp * cp == 1) continue;
                  Layout l = split;  // pp, vp, schedule and the split flags
                  l.tp = tp; l.dp = dp; l.cp = cp;
                  l.ep = ep; l.etp = etp;
                  // The flex dispatcher (DeepEP / HybridEP) where EP leaves the NVLink domain,
                  // the only place it changes the traffic; alltoall (Megatron's default) inside.
                  l.moe_flex_dispatcher = s.moe_flex_dispatcher
                                              ? *s.moe_flex_dispatcher
                                              : model.moe() && ep > 1 &&
                                                    int64_t(ep) * (etp > 0 ? etp : tp) > gpn;
                  // (Not for a hybrid model: Megatron's HybridModel has no build_schedule_plan.)
                  l.moe_a2a_overlap = s.moe_a2a_overlap
                                          ? *s.moe_a2a_overlap
                                          : model.moe() && !model.hybrid() && ep > 1 &&
                                                (split.pp == 1 || split.vp > 1) &&
                                                rc != Recompute::kFull;
                  l.cross_entropy = s.cross_entropy ? *s.cross_entropy
                                    : s.runtime_layouts ? CrossEntropyFusion::kNone
                                                        : CrossEntropyFusion::kTe;
                  l.micro_batch = mb;
                  l.global_batch = s.global_batch;
                  l.sequence_parallel = sp;
                  l.recompute = rc;
                  l.recompute_modules = rc == Recompute::kSelective ? s.recompute_modules : 0;
                  l.distributed_optimizer = dopt;
                  l.shard_gradients = shard;
                  l.shard_params = zero3;
                  l.precision = s.precision;
                  l.overlap_grad_reduce = s.overlap_grad_reduce;
                  l.overlap_param_gather = s.overlap_param_gather;
                  l.grad_reduce_in_bf16 = s.grad_reduce_in_bf16;
                  l.accumulate_grads_in_fp32 = s.accumulate_grads_in_fp32;
                  l.optimizer_state = s.optimizer_state;
                  l.ddp_bucket_size = s.ddp_bucket_size;
                  l.cpu_offload_layers = s.cpu_offload_layers;
                  // --tp-comm-overlap where it can apply: Megatron asserts it needs SP.
                  l.tp_comm_overlap = s.tp_comm_overlap && sp;
                  l.overlap_p2p = s.overlap_p2p;
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
                  RankedLayout r = Ranked(est, l, usable);
                  // The keys below must be numbers: a NaN breaks TopK's ordering.
                  PTDP_RETURN_IF_ERROR(CheckEstimate(l, r.estimate));
                  if (!r.estimate.fits && s.search_cpu_offload && l.cpu_offload_layers == 0 &&
                      cluster.gpu.host_bw_bytes_per_s > 0) {
                    auto offloaded = FewestOffloadedLayers(est, model, l, r.estimate, usable);
                    if (offloaded) {
                      PTDP_RETURN_IF_ERROR(CheckEstimate(offloaded->layout, offloaded->estimate));
                      r = *offloaded;
                    }
                  }
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
  }
  res.top = best.Take();
  if (res.top.empty()) res.unfitting = small.Take();
  res.elapsed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return res;
}

}  // namespace

// Megatron-FSDP's optim_grads (ZeRO-2) buys memory with a reduce-scatter after every
// micro-batch: tried only when nothing fits without it (or when asked for), so that it never
// outranks the distributed optimizer on the strength of communication the cost model hides.
Result<PlanResult> SearchLayouts(const Estimator& est, const ModelSpec& model,
                                 const ClusterSpec& cluster, const SearchSpace& s, int top_k) {
  if (s.shard_gradients || s.runtime_layouts) return SearchOnce(est, model, cluster, s, top_k);
  PTDP_ASSIGN_OR_RETURN(PlanResult plain, SearchOnce(est, model, cluster, s, top_k));
  if (plain.fitting > 0 || plain.legal == 0 || !s.distributed_optimizer.Allows(true)) return plain;
  SearchSpace sharded = s;
  sharded.distributed_optimizer = true;
  sharded.shard_gradients = true;
  if (!s.shard_params) sharded.shard_params = Choice<bool>({false, true});
  PTDP_ASSIGN_OR_RETURN(PlanResult zero2, SearchOnce(est, model, cluster, sharded, top_k));
  if (zero2.fitting == 0) return plain;
  zero2.evaluated += plain.evaluated;
  zero2.legal += plain.legal;
  for (int i = 0; i < kNumRejections; ++i) zero2.rejected[i] += plain.rejected[i];
  zero2.elapsed_s += plain.elapsed_s;
  return zero2;
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
  diff("cp", std::to_string(la.cp), std::to_string(lb.cp));
  diff("vp", std::to_string(la.vp), std::to_string(lb.vp));
  diff("pipeline split", la.SplitName(), lb.SplitName());
  diff("micro-batch", std::to_string(la.micro_batch), std::to_string(lb.micro_batch));
  diff("sp", la.sequence_parallel ? "on" : "off", lb.sequence_parallel ? "on" : "off");
  diff("recompute", ToString(la.recompute), ToString(lb.recompute));
  diff("dist-opt", la.distributed_optimizer ? "on" : "off", lb.distributed_optimizer ? "on" : "off");
  diff("gradient sharding", la.shard_gradients ? "on" : "off", lb.shard_gradients ? "on" : "off");
  diff("weight sharding", la.shard_params ? "on" : "off", lb.shard_params ? "on" : "off");
  if (!knobs.empty()) out.push_back("  differing knobs: " + knobs);
  out.push_back("  memory: " + FormatBytes(a.estimate.memory.total) + " vs " +
                FormatBytes(b.estimate.memory.total) + " per GPU");
  return out;
}

}  // namespace ptdp
