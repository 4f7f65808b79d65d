// The analytic cost model: for a model on a cluster and one layout, the step time with its
// breakdown, FLOPs, MFU and memory per GPU, in closed form (docs/cost-model.md lists every
// formula with its source). Evaluate() is the planner's hot path: no allocation, ~1 us.
// Letters: b micro-batch, s sequence (s_l = s/c per CP rank), h hidden, a heads, L layers,
// V padded vocabulary, f ffn hidden, t/c/p/d/v tensor/context/pipeline/data/virtual sizes,
// m micro-batches per step.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/layer_ops.h"
#include "core/layout.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/status.h"
#include "cost_model/hardware_table.h"
#include "cost_model/runtime_model.h"
#include "topology/topology.h"

namespace ptdp {

// Times of one micro-batch through a list of kernels, split as the stage needs them.
struct PassTimes {
  double fwd_compute_s = 0, fwd_tp_s = 0, bwd_compute_s = 0, bwd_tp_s = 0;
};

// Times of one micro-batch through one transformer layer of one kind, seconds.
struct OneLayerTimes {
  double fwd_compute_s = 0, bwd_compute_s = 0, recompute_s = 0, fwd_tp_s = 0, bwd_tp_s = 0;
  // The GPU's time (kernels and exposed communication) and the host's dispatch time of the
  // forward and of the backward (with its recompute), apart: a hybrid model's stage takes the
  // larger of their sums over its layers (the host runs ahead across the one-block layers as
  // it does within a transformer layer).
  double fwd_gpu_s = 0, bwd_gpu_s = 0, fwd_host_s = 0, bwd_host_s = 0;
};

// Times of one micro-batch through one transformer layer on one GPU, seconds.
struct LayerTimes {
  double fwd_compute_s = 0;    // GEMMs + attention + element-wise + overhead
  double bwd_compute_s = 0;    // backward, plus recompute
  double recompute_s = 0;      // the recompute part of bwd_compute_s
  double fwd_tp_s = 0;         // exposed TP (and CP) communication in forward
  double bwd_tp_s = 0;         // exposed TP communication in backward (+ recompute's)
  // The first stage's embedding, the last stage's output layer, and what a chunk does with the
  // input it receives from another stage (core/layer_ops.h), timed with the layer.
  PassTimes embedding, output, input;
  // An MoE model's MoE layer (the fields above are its dense layer: attention + dense MLP);
  // tp_s of `moe` includes the expert all-to-alls and expert-TP collectives.
  OneLayerTimes moe;
  // One multi-token-prediction module beyond its transformer layer (DeepSeek-V3: two norms and
  // the 2h x h projection, then the shared output layer and loss again), on the last stage.
  PassTimes mtp;
  // A hybrid model's layers by kind (LayerKind: Mamba, attention, MLP, MoE), those it has; the
  // fields above are then its mean layer (the pattern's average), `moe` its E layer.
  std::array<OneLayerTimes, kLayerKinds> kinds{};
};

// Times of an operation list (TimeOps).
struct OpListTimes {
  double compute_s = 0;   // GPU time of the compute kernels (GEMM, attention, memory-bound)
  double exposed_s = 0;   // communication left on the critical path
  double hidden_s = 0;    // communication hidden under compute
  double host_s = 0;      // host dispatch of all its kernels
  double busy_s = 0;      // GPU time: compute + exposed communication
  int kernels = 0;
  // Wall time of the list: the GPU's finish, or the host's if it issues the last op later.
  double busy() const { return busy_s > host_s ? busy_s : host_s; }
};

// One op's times (TimeOps' optional detail, for `ptdp simulate --ops`).
struct OpTime {
  double gpu_s = 0;      // compute kernel: its law + kernel overhead; comm: 0
  double comm_s = 0;     // comm: the collective's full time
  double exposed_s = 0;  // comm: what stays on the critical path
  double host_s = 0;     // host dispatch
  double end_s = 0;      // GPU time from the list's start to its end
};
using OpTimes = std::array<OpTime, LayerOpList::kMax>;

// Collective times already computed for one layout (TimeOps fills and reads it).
struct CollCache {
  static constexpr int kMax = 8;
  struct Entry {
    Collective kind;
    uint8_t group;  // CommGroup
    double bytes, seconds;
  };
  Entry entries[kMax];
  int size = 0;
};

// Per-micro-batch time of one pipeline stage (all its v chunks), seconds.
struct StageTimes {
  double fwd_s = 0, bwd_s = 0;            // compute + exposed TP, forward and backward
  double compute_s = 0;                   // of which pure compute (fwd + bwd)
  double tp_s = 0;                        // of which exposed TP/CP communication
  double fwd_tp_s = 0, bwd_tp_s = 0;      // tp_s split into forward and backward
  double total() const { return fwd_s + bwd_s; }
};

// Lean result of Evaluate(): what ranking needs, without per-stage vectors.
struct Estimate {
  double step_time_s = 0;
  Breakdown breakdown;
  double model_flops = 0;     // per step, whole job (no recompute)
  double hw_flops = 0;        // per step, with recompute
  double mfu = 0;
  double bubble_fraction = 0;
  MemoryBytes memory;         // the most loaded stage
  bool fits = false;
};

// Ok when every figure of `e` is a number in range: step time and memory total finite and
// > 0; each breakdown part, bubble fraction, MFU and memory part finite and >= 0. Otherwise a
// one-line error naming the layout and the first term out of range, the breakdown parts
// first (they are what went wrong when the step time is off), e.g.
//   "cost model: tp1 pp4 dp2 mb1 [fp32]: dp_comm_s is inf (step_time_s inf): not a finite,
//   non-negative figure". A bug in the cost model or the cluster's figures, never a layout to
//   rank: the planner, the simulator and the fuzz targets refuse it.
Status CheckEstimate(const Layout& l, const Estimate& e);

// A seam for the planner (and its tests): anything that scores a legal layout.
class Estimator {
 public:
  virtual ~Estimator() = default;
  // Precondition: the layout is legal for the model (CheckLayout == kOk) and its world fits
  // the cluster.
  virtual Estimate Evaluate(const Layout& l) const = 0;
};

class AnalyticModel : public Estimator {
 public:
  // Fails when the cluster's calibration names an unknown constant, or its `measured:` block
  // lacks a table.
  static Result<AnalyticModel> Create(const ModelSpec& model, const Topology& topo);
  // With a complete `measured:` block in the topology's cluster, times and memory come from the
  // RuntimeModel (the layout as ptdp's runtime executes it, on the measured primitives).
  AnalyticModel(const ModelSpec& model, const Topology& topo, const CostConstants& k);

  Estimate Evaluate(const Layout& l) const override;
  // Layer() remembers, per thread, the times of the last layers it computed (the planner asks
  // for a few hundred distinct layers thousands of times); this forgets them for this model
  // (benchmarks of the cold cost).
  void ResetMemo();
  // Evaluate() plus memory per stage, as the plan file stores it.
  Prediction Predict(const Layout& l) const;

  // The layout as the machine executes it: itself, or with a measured runtime its Executed()
  // form (no recompute or overlap on ptdp's runtime, fp32). Evaluate and the simulator use it.
  Layout Executed(const Layout& l) const { return runtime_ ? runtime_->Executed(l) : l; }
  // The runtime model when the cluster carries measured primitives, else nullptr.
  const RuntimeModel* runtime() const { return runtime_.get(); }

  // Pieces, public for tests, the simulator and docs.
  LayerTimes Layer(const Layout& l) const;
  // Stage r of p: r == 0 holds the embedding, r == p-1 the output layer and loss.
  StageTimes Stage(const Layout& l, int r) const;
  // One model chunk c of stage r (ChunkLayers of core/layout.h; the embedding rides on chunk 0
  // of stage 0, the output layer and loss on chunk v-1 of stage p-1), given Layer(l). Stage -1
  // / chunk -1: the average chunk, L/(p v) layers, neither embedding nor output.
  StageTimes Chunk(const Layout& l, int r, int c, const LayerTimes& lt) const;
  // Layers of that chunk (fractional for the average chunk), and of them the MoE layers.
  double ChunkLayerCount(const Layout& l, int r, int c) const;
  double ChunkMoeLayerCount(const Layout& l, int r, int c) const;
  // The same by kind (LayerKind), and those of all the chunks of pipeline rank r.
  LayerCounts ChunkLayerCounts(const Layout& l, int r, int c) const;
  LayerCounts RankLayerCounts(const Layout& l, int r) const;
  // MoE layers of pipeline rank r (all its chunks).
  double RankMoeLayers(const Layout& l, int r) const;
  // Static memory of stage r: weights, grads, optimizer and other, without activations.
  double StaticMemory(const Layout& l, int r) const;
  // Activation bytes chunk c of stage r keeps per micro-batch in flight (the layers' share; the
  // embedding output and logits are in StageMemory); -1, -1: the average chunk.
  double ChunkActivationBytes(const Layout& l, int r, int c) const;
  // DP gradient reduction of the parameters of one chunk (+ the embedding/output on the first
  // and last chunk), seconds; the per-chunk buckets that --overlap-grad-reduce launches.
  double ChunkDpTime(const Layout& l, int r, int c) const;
  // The measured runtime's distributed-optimizer all-gather of stage r's chunks
  // (RuntimeModel::ChunkDpGather), as much of it as the step waits for: all of it after
  // AdamW, or with --overlap-param-gather (the executed layout's overlap_grad_reduce) what the
  // next forward (`fwd_s`, one micro-batch of the stage) does not hide, each part of it waiting
  // for its own parameters. 0 for the GPU model, whose ChunkDpTime covers it.
  double StageDpGatherTime(const Layout& l, int r, double fwd_s) const;
  // Parameters of chunk c of stage r, and Megatron's gradient buckets over them (1 without
  // --overlap-grad-reduce; on the measured runtime, those it hands over during the backward).
  double ChunkParams(const Layout& l, int r, int c) const;
  int ChunkDpBuckets(const Layout& l, int r, int c) const;
  // With gradient sharding (ZeRO-2), the reduce-scatter of chunk c's gradients that follows
  // each of its backwards (0 otherwise).
  double ChunkGradShardTime(const Layout& l, int r, int c) const;
  // The layers whose activations --cpu-offloading-num-layers sends to host memory: 0 when not
  // asked, or when the cluster states no host link (the CLI refuses that).
  double OffloadedLayers(const Layout& l) const {
    return topo_->spec().gpu.host_bw_bytes_per_s > 0 ? double(l.cpu_offload_layers) : 0;
  }
  // The share of a rank's layers (`counts`) whose activations wait in host memory at the
  // forward's end: layers 0..N-1 of L (Transformer Engine's OffloadSynchronizer copies them
  // out and reloads them so that L - N stay: its cpu_offload.py, "peak memory usage of saving
  // activations is (num_layers - num_offloaded_layers) * T").
  double OffloadedShare(const Layout& l, const LayerCounts& counts) const {
    const double L = counts.total();
    return L > 0 ? std::min(L, OffloadedLayers(l)) / L : 0;
  }
  double GradBytes(const Layout& l) const;  // bytes per gradient element (fp32, or ZeRO-2's)
  // Optimizer state per parameter the distributed optimizer shards: the master weights (none in
  // fp32 training) and Adam's two moments, in --use-precision-aware-optimizer's dtypes.
  static double OptimizerStateBytes(const Layout& l);
  // Analytic lower bound of the step: m times the slowest stage's compute, plus the optimizer;
  // no bubble, no communication.
  double LowerBound(const Layout& l) const;
  // The times of a list of kernels (core/layer_ops.h) on one GPU of the layout, each by the
  // law of its kind; communication by its overlap rule. With measured primitives, each by its
  // measured table (RuntimeModel::TimeOp), every collective blocking as in ptdp's runtime.
  // `before`: the state after the ops issued before these (the recompute before the backward).
  OpListTimes TimeOps(const Layout& l, const LayerOpList& ops,
                      const OpListTimes& before = OpListTimes{}, OpTimes* each = nullptr,
                      CollCache* colls = nullptr) const;
  // The per-rank shape of one micro-batch of this layout, fused or unfused attention as the
  // constants say (with measured primitives: the layout as ptdp's runtime executes it), and
  // the layer's operation lists built from it (what Layer() times).
  OpShape Shape(const Layout& l) const;
  LayerOps Ops(const Layout& l) const;
  // Exposed DP communication of a stage holding `params` parameters with Megatron's buckets
  // (max(40M, 1M x dp x cp) parameters each): the gradient reduce-scatter (all-reduce) buckets
  // start as the backward of the last micro-batch (`bwd_s`) produces them, the distributed
  // optimizer's parameter all-gather buckets run ahead of the first forward (`fwd_s`).
  double DpExposed(const Layout& l, double params, double bwd_s, double fwd_s) const;
  // The same when `expert_params` of them are routed experts, reduced over expert DP.
  double DpExposed(const Layout& l, double params, double expert_params, double bwd_s,
                   double fwd_s) const;
  // Megatron's DDP bucket size in parameters for this layout.
  double BucketParams(const Layout& l) const;
  // Time of an (m x k) x (k x n) GEMM at precision p: tiles in waves over the SMs.
  double Gemm(double m, double n, double k, Precision p) const;
  MemoryBytes StageMemory(const Layout& l, int r) const;
  double ParamsOnStage(const Layout& l, int r) const;  // parameters held by one GPU of stage r
  // Of them, the routed experts' (E/ep experts of f_e/etp per MoE layer): reduced and sharded
  // over the expert-DP group (edp), not dp x cp.
  double ExpertParamsOnStage(const Layout& l, int r) const;
  double MtpParamsPerGpu(const Layout& l) const;  // one MTP module's weights on a last-stage GPU
  // Activation bytes one layer keeps for one micro-batch (Korthikanti 2022 table 2); `moe`:
  // an MoE layer's (its MLP part for the routed and shared experts).
  double LayerActivationBytes(const Layout& l, bool moe = false) const;
  // The same for a layer of kind k (a hybrid model's Mamba, attention, MLP and MoE layers).
  double LayerActivationBytes(const Layout& l, LayerKind k) const;
  double ModelFlops(const Layout& l) const;            // per step (Korthikanti model FLOPs)
  double HardwareFlops(const Layout& l) const;         // per step, recompute included
  double P2pTime(const Layout& l) const;               // one boundary transfer, seconds
  double DpTime(const Layout& l, double params) const; // gradient reduction (+ param gather)
  double ExpertDpTime(const Layout& l, double params) const;  // the same over expert DP
  // The load of the most loaded expert rank relative to the mean (OpShape::expert_load): 1
  // force-balanced, the capacity factor with token dropping, the dropless constant otherwise
  // (1 at ep 1: no other EP rank to wait for).
  double ExpertLoad(const Layout& l) const;
  // One all-to-all over `size` ranks `stride` apart, `bytes` leaving each rank in all: what stays
  // in the NVLink domain moves over NVLink, what leaves it over the rank's share of the NICs,
  // both at once (NCCL's all-to-all is point-to-point sends, not a ring).
  // `flex`: the flex dispatcher's deduplication (Layout::moe_flex_dispatcher) of the model's
  // top-k copies of a token bound for one remote domain.
  double AllToAll(int stride, int size, double bytes, bool flex = false) const;
  double EmbeddingReduceTime(const Layout& l) const;   // tied-embedding all-reduce, seconds
  // step + grad norm + overhead; `expert_params` of the parameters sharded over expert DP.
  double OptimizerTime(const Layout& l, double params, double expert_params = 0) const;
  double StageOptimizerTime(const Layout& l, int r) const;     // the optimizer op of stage r
  double PeakFlops(Precision p) const;                 // FLOP/s used for GEMMs at p
  double MfuPeak(Precision p) const;                   // the MFU basis (16-bit peak for fp8)

  // The share of GPU memory a layout must leave free (--memory-headroom; 0 by default here, the
  // CLI's default is 5%): Evaluate and Predict fit against (1 - headroom) x capacity, on top of
  // the per-GPU reserve (workspace_bytes) already in `other`.
  void set_memory_headroom(double h) { headroom_ = h; }
  double memory_headroom() const { return headroom_; }
  const CostConstants& constants() const { return k_; }
  const ModelSpec& model() const { return model_; }
  const Topology& topology() const { return *topo_; }

 private:
  // Stage(l, r) given the layer times (computed once per layout in Evaluate).
  StageTimes StageFrom(const Layout& l, int r, const LayerTimes& lt) const;
  StageTimes Work(const Layout& l, LayerCounts layers, bool embedding, bool output,
                  const LayerTimes& lt) const;
  // One layer of kind k: its op lists timed (an MoE kind with --overlap-moe-expert-parallel-comm
  // hiding its all-to-alls under the paired micro-batch's compute).
  OneLayerTimes KindTimes(const Layout& l, LayerKind k, CollCache* colls) const;
  double Coll(Collective c, int stride, int size, double bytes) const;
  double Activations(const Layout& l, int r) const;
  // Activation bytes of `n` layers, each kind its LayerActivationBytes.
  double KindsActivationBytes(const Layout& l, const LayerCounts& n) const;

  ModelSpec model_;
  const Topology* topo_;
  CostConstants k_;
  std::shared_ptr<const RuntimeModel> runtime_;  // set when the cluster has measured primitives
  // A hybrid model's layer kinds before each layer (prefix sums: kinds_before_[i] counts layers
  // [0, i)), so that a chunk's counts cost O(1) in the planner's hot path; shared by copies.
  std::shared_ptr<const std::vector<LayerCounts>> kinds_before_;
  double fwd_flops_per_token_ = 0;  // the model's forward FLOPs per token (ModelFlops)
  double attention_layers_ = 0;     // layers with attention (selective recompute's FLOPs)
  double dense_mlp_layers_ = 0;     // layers with a dense MLP (--recompute-modules mlp)
  double moe_layers_ = 0;           // layers with an MoE MLP (--recompute-modules moe, ...)
  // Identifies this model's data for Layer()'s per-thread memo (copies share it: same data).
  uint64_t id_ = 0;
  double headroom_ = 0;
  // Weights of one layer, computed once: a dense layer, an MoE layer's non-expert part, and its
  // routed experts.
  struct LayerParams {
    // latent: one MoE layer's LatentMoE projections, whole on every TP rank.
    double dense_layer = 0, moe_layer_shared = 0, routed = 0, latent = 0;
    std::array<double, kLayerKinds> kind{};  // all weights of one layer of each kind
  } layer_params_;
  void RankLayerParams(const Layout& l, int r, double* dense, double* experts) const;
  // The gradient reduction of `params` over `size` ranks `stride` apart: the reduce-scatter (or
  // all-reduce) and the distributed optimizer's weight all-gather; DpTime, ExpertDpTime and
  // DpExposed's buckets.
  struct GradReduce {
    double reduce_s = 0, gather_s = 0;
  };
  GradReduce GradReduceTimes(const Layout& l, int stride, int size, double params) const;
  LayerTimes ComputeLayer(const Layout& l) const;
};

// The shape of a regular Megatron group: `size` ranks `stride` apart, on nodes of
// `gpus_per_node` (TP: stride 1; DP: stride t*c; PP: stride t*c*d; tied embedding: stride
// t*c*d*(p-1)), taken at its first member, rank 0. It spans as many nodes as ranks 0 ..
// (size-1)*stride do, so never more than a cluster holding those ranks has. The cost model
// passes the NVLink domain's GPUs as `gpus_per_node` (GroupShape counts domains).
GroupShape RegularGroupShape(int stride, int size, int gpus_per_node);

}  // namespace ptdp
