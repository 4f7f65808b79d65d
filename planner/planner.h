// The layout planner: enumerate every layout of a model on a number of GPUs, reject the
// illegal ones with a named reason (Megatron's rules, TP across nodes, precision, memory),
// score the rest with an Estimator and rank them by predicted step time. Any knob can be
// fixed; the rest are searched.
#pragma once

#include <algorithm>
#include <array>
#include <initializer_list>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/layout.h"
#include "core/model.h"
#include "cost_model/analytic.h"
#include "topology/cluster.h"

namespace ptdp {

// The values one knob may take: empty means "search every legal value", one value fixes it, a
// list (--tp 4,8) searches those. Assigning a value or an optional keeps the old one-value form.
template <typename T>
class Choice {
 public:
  Choice() = default;
  Choice(T v) : v_{v} {}  // NOLINT: a fixed value
  Choice(std::initializer_list<T> v) : v_(v) {}
  Choice(std::vector<T> v) : v_(std::move(v)) {}  // NOLINT
  Choice(const std::optional<T>& o) { if (o) v_ = {*o}; }  // NOLINT
  explicit operator bool() const { return !v_.empty(); }
  T operator*() const { return v_.front(); }  // by value: vector<bool> has no bool&
  const std::vector<T>& values() const { return v_; }
  bool single() const { return v_.size() == 1; }
  bool Allows(const T& x) const {
    return v_.empty() || std::find(v_.begin(), v_.end(), x) != v_.end();
  }
  // The values to try: the given ones, or `all`.
  std::vector<T> Or(std::vector<T> all) const { return v_.empty() ? all : v_; }

 private:
  std::vector<T> v_;
};

// How the planner may split the layers over the pipeline (Megatron-LM's flags).
enum class SplitSearch {
  kAuto,      // the even split, embedding/loss accounting, and first/last-stage counts that
              // balance the embedding and the output layer (where legal)
  kEvenOnly,  // only L/(p v)
  kFixed,     // exactly the split in SearchSpace::split (the user's flags)
};

// What to search.
struct SearchSpace {
  int world = 0;                          // GPUs used (tp * cp * pp * dp)
  int64_t global_batch = 0;               // B, fixed by the user
  Choice<int> tp, pp, dp, vp, cp, micro_batch;
  // Expert parallelism (MoE models): ep and expert TP (etp; 0 stands for "= tp", Megatron's
  // default). Unset: every legal fold of the expert grid is searched.
  Choice<int> ep, etp;
  // --overlap-moe-expert-parallel-comm: unset, on wherever Megatron allows it (ep > 1, vp with
  // pp > 1, no full recompute): it only hides all-to-alls.
  Choice<bool> moe_a2a_overlap;
  // --moe-token-dispatcher-type flex: unset, used where the EP group leaves the NVLink domain.
  Choice<bool> moe_flex_dispatcher;
  // --cross-entropy-loss-fusion / --cross-entropy-fusion-impl: unset, Transformer Engine's
  // (less memory and traffic than the others at the same math; none for ptdp's runtime, whose
  // loss is its own kernel).
  std::optional<CrossEntropyFusion> cross_entropy;
  Choice<bool> sequence_parallel, distributed_optimizer;
  // Megatron-FSDP's optim_grads (ZeRO-2) on top of the distributed optimizer. Unset: tried only
  // when no layout fits without it (SearchLayouts; it buys memory with a reduce-scatter per
  // micro-batch), never for ptdp's runtime.
  Choice<bool> shard_gradients;
  // Megatron-FSDP's optim_grads_params (ZeRO-3) on top of that: unset, tried with ZeRO-2 when no
  // layout fits without them (it buys memory with two weight all-gathers per micro-batch).
  Choice<bool> shard_params;
  Choice<Recompute> recompute;
  // --recompute-modules: what the selective layouts rerun (Layout::recompute_modules; 0:
  // core_attn, Megatron's default).
  uint8_t recompute_modules = 0;
  Precision precision = Precision::kBf16;
  int max_micro_batch = 16;               // largest b tried when b is searched
  bool allow_tp_across_nodes = false;     // otherwise such layouts are rejected (named reason)
  bool overlap_grad_reduce = true;
  bool overlap_param_gather = true;  // --overlap-param-gather
  bool grad_reduce_in_bf16 = false;  // Megatron's --grad-reduce-in-bf16 on every layout
  bool accumulate_grads_in_fp32 = false;  // --accumulate-allreduce-grads-in-fp32 likewise
  OptimizerState optimizer_state;  // --use-precision-aware-optimizer and its dtypes, every layout
  int64_t ddp_bucket_size = 0;  // Layout::ddp_bucket_size
  int cpu_offload_layers = 0;   // Layout::cpu_offload_layers (--cpu-offloading-num-layers)
  // With cpu_offload_layers 0: a layout that does not fit and may offload (pp 1, no recompute,
  // a cluster with a host link) is tried again with the fewest layers' activations offloaded
  // that make it fit. Off by default (Megatron's default is no offloading): `ptdp plan` turns it
  // on for its "Megatron options left off" advice.
  bool search_cpu_offload = false;
  bool tp_comm_overlap = false;
  bool overlap_p2p = true;                // --overlap-p2p-communication
  SplitSearch split_search = SplitSearch::kAuto;
  // Set for clusters of CPU rank slots and calibrated (measured) clusters, whose plans are for
  // `ptdp train`: the runtime trains every layout the search makes (CP, MoE, uneven splits and
  // recompute since issue 16) but not Megatron-FSDP's gradient sharding, which is not tried.
  bool runtime_layouts = false;
  // The user's split (first/last counts, accounting, layout string) when kFixed: its fields
  // first_stage_layers .. pipeline_layout are copied into every layout.
  Layout split;
  // Fraction of HBM kept free on top of the cost model's per-GPU reserve: a layout fits when
  // its most loaded GPU needs at most (1 - headroom) x capacity.
  double memory_headroom = 0;
};

struct RankedLayout {
  Layout layout;
  Estimate estimate;              // simulated figures once refined
  bool simulated = false;         // estimate comes from the event simulator
  double analytic_step_time_s = 0;  // the analytic figure (kept after refinement)
};

struct PlanResult {
  int64_t evaluated = 0;      // candidate layouts enumerated
  int64_t legal = 0;          // passed every rule except memory
  int64_t fitting = 0;        // legal and fit in memory
  std::array<int64_t, kNumRejections> rejected{};  // by Rejection
  std::vector<RankedLayout> top;        // best first: fitting by step time, then the rest
  std::vector<RankedLayout> unfitting;  // the smallest-memory legal layouts when none fits
  double elapsed_s = 0;
};

// Checks the user's fixed knobs against the world and model before searching (e.g. --tp 3
// with 64 heads): a Status naming the flag and value, so an impossible request is an error
// and not an empty table.
Status CheckSearchSpace(const ModelSpec& model, const ClusterSpec& cluster,
                        const SearchSpace& space);

// Enumerates and ranks. `top_k` best fitting layouts are kept. Fails, naming the layout and
// the term, when the estimator gives a legal layout a figure that is not a number in range
// (CheckEstimate): such an estimate is a cost-model bug, and a NaN would break the ranking.
Result<PlanResult> SearchLayouts(const Estimator& est, const ModelSpec& model,
                                 const ClusterSpec& cluster, const SearchSpace& space, int top_k);

// Re-scores the first `k` fitting layouts of `result->top` with the event-driven simulator
// (cost_model/simulator.h) and re-ranks them by simulated step time; the others keep their
// analytic figures and stay behind them. Fails if a layout cannot be simulated or its
// simulation has a figure out of range (SimulateStep).
Status RefineWithSimulator(const AnalyticModel& cost, int k, PlanResult* result);

// Why the winner beat the runner-up, in a few lines: step-time difference and the components
// that differ most, with the knobs that cause them.
std::vector<std::string> ExplainChoice(const RankedLayout& best, const RankedLayout& runner_up);

}  // namespace ptdp
