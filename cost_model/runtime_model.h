// The cost model of a layout executed by ptdp's own runtime (runtime/: GptChunk and Trainer) on
// a machine whose primitives `ptdp calibrate` measured (core/measured.h). AnalyticModel
// delegates to it when the cluster YAML carries `measured:`; without it nothing here is used.
//
// Times are composed, not fitted: a layer, the embedding and the output layer are the op lists
// of core/layer_ops.h in the runtime's flavour (OpShape::runtime: the GEMMs and collectives of
// Megatron-Core's lists, plus the bias, residual and position kernels and the allocation of
// each new tensor that the runtime runs, as its backend's calls: a GEMM with its bias and GeLU,
// a bias and residual with the next norm), each op by its measured table (TimeOp; a fused call
// the calibration did not time as the sum of its parts); the backward
// is its ops (dgrad and wgrad GEMMs at their own shapes, LN/GeLU/attention backward, bias
// grads) rather than 2x the forward. AnalyticModel times the same lists through TimeOp, so
// the analytic and the runtime model differ only in who times an op.
// The runtime differs from Megatron on GPUs in ways the formulas follow, for every layout:
//  - activations and weights take element_bytes (4: fp32; 2: a bf16 run's, which also keeps
//    fp32 main weights), gradients and optimizer state fp32; DP does not overlap the backward;
//    recompute reruns what Megatron's does (full: the layer; selective: the attention core)
//    inside the backward;
//  - the DP reduction is one collective per parameter tensor (no buckets) over DP x CP, the PP
//    transfer the whole (s/t with SP, b, h) activation per TP rank (no scatter/gather);
//  - the attention keeps what the backend's AttentionSavedShape says (P, b x a/t x s x s, on CPU);
//    with CP it runs the ring of attention blocks (its own tables) and keeps a log-sum-exp;
//  - the gradient norm is one all-reduce over every rank;
//  - ranks beyond `cores` on a node share them: compute takes ranks/cores times longer;
//  - GeLU's cost depends on its inputs' magnitude (tanh); they are taken as a freshly
//    initialised layer's, N(0, 0.02^2 h): the prediction is for the first steps of training.
// Letters: b micro-batch, s = S/c the rows of the sequence a CP rank holds, h hidden, t/c/p/d/v
// TP/CP/PP/DP/virtual sizes, T = b s tokens,
// Tl = T/t with SP else T, A = h/t, Q = (h + 2 kv_heads d_h)/t QKV width, F = ffn/t, Fi = F (2F
// for SwiGLU), Vl = padded vocabulary / t, e element bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "core/layer_ops.h"
#include "core/layout.h"
#include "core/measured.h"
#include "core/model.h"
#include "core/plan.h"

namespace ptdp {

// One micro-batch through one layer, seconds (the analytic model's LayerTimes fields).
struct RuntimeLayerTimes {
  double fwd_compute_s = 0, bwd_compute_s = 0, fwd_tp_s = 0, bwd_tp_s = 0;
};

// The optimizer op of one pipeline rank (end of step), seconds; total_s includes the parts.
struct RuntimeOptimizerTimes {
  double total_s = 0;
  double tp_s = 0;    // SP-partial grads over TP (FinalizeTpGrads)
  double dp_s = 0;    // the loss all-reduce over DP x CP (last stage)
  double fill_s = 0;  // zeroing the gradients at the start of the step
  // --grad-reduce-in-bf16: rounding each chunk's gradients to bf16 after its backwards but the
  // last (two copies through the bf16 mirror; measured as backward time)
  double round_s = 0;
};

// A parameter tensor held by one rank.
struct RuntimeTensor {
  double numel = 0;         // elements of this rank's shard
  bool replicated = false;  // same on every TP rank (norms, row-parallel biases, positions)
  bool expert = false;      // a routed expert's weight: reduced over expert DP
  bool decay = false;       // AdamW's weight decay applies (the 2-D weights but positions)
};

class RuntimeModel {
 public:
  // `gpus_per_node`: rank slots of a node (the cores are shared by the ranks on one node).
  // Precondition: m.CheckComplete() is OK.
  RuntimeModel(const ModelSpec& model, const MeasuredPrimitives& m, int gpus_per_node);

  // The layout as the runtime executes it: recompute as planned, no TP overlap, DP reduction
  // overlapped as planned (--overlap-grad-reduce) where its communicators run beside compute
  // (NCCL; CPU threads when each rank and its reducer have a core; never on one GPU; the
  // distributed optimizer's all-gather after AdamW), fp32 when the runtime stores 4-byte
  // elements. The cost model evaluates this one.
  Layout Executed(const Layout& l) const;

  // The shape of the op lists (core/layer_ops.h) the runtime executes for this layout.
  OpShape Shape(const Layout& l) const;
  // One op by its measured table, seconds.
  double TimeOp(const Layout& l, const LayerOp& op) const;  // op.repeat times
  // One op list, each op by its measured table: compute and TP communication, added to.
  void TimeOps(const Layout& l, const LayerOpList& ops, double* compute, double* tp) const;

  // One layer's forward and backward: core/layer_ops.h's lists in the runtime's flavour.
  RuntimeLayerTimes Layer(const Layout& l) const;
  // Extra work of a chunk holding the embedding and/or the output layer, or of a chunk whose
  // input comes from another stage (a copy); fields as Layer().
  RuntimeLayerTimes ChunkExtras(const Layout& l, bool embedding, bool output) const;
  double P2p(const Layout& l) const;  // one activation or gradient transfer between stages
  // DP reduction of chunk c of pipeline rank r: per bucket (ChunkDpBuckets) all-reduce and
  // scale, or with the distributed optimizer per tensor reduce-scatter (of a padded copy where
  // the group does not divide it) and scale.
  double ChunkDp(const Layout& l, int r, int c) const;
  // The distributed optimizer's all-gather of chunk c's updated slices, after AdamW or beside
  // the next forward (0 without).
  double ChunkDpGather(const Layout& l, int r, int c) const;
  // The parts of chunk c's forward (embedding, each layer, output) that wait for sliced
  // parameters' all-gathers beside it (--overlap-param-gather); 0 without the distributed
  // optimizer or anything sliced.
  int ChunkDpGatherParts(const Layout& l, int r, int c) const;
  double EmbeddingReduce(const Layout& l) const;  // tied embedding, first <-> last stage
  RuntimeOptimizerTimes Optimizer(const Layout& l, int r) const;

  // Memory of one rank of stage r (dp rank 0, which owns the largest slices), bytes, as the
  // runtime's backend counts it: parameters, gradients, AdamW state, and at the peak the saved
  // activations of the micro-batches in flight plus the working set of one backward.
  MemoryBytes StageMemory(const Layout& l, int r, double workspace_bytes,
                          double fragmentation, double capacity) const;
  // Bytes one layer (`moe`: an MoE layer) keeps per micro-batch for its backward (after
  // recompute's drops).
  double LayerActivationBytes(const Layout& l, bool moe = false) const;
  // The attention core's saved tensors and output (what selective recompute drops).
  double AttentionCoreBytes(const Layout& l) const;
  // What a layer's backward restores before it runs (recompute), bytes; 0 without recompute.
  double RecomputedBytes(const Layout& l, bool moe = false) const;

  // The tensors chunk c of pipeline rank r holds.
  std::vector<RuntimeTensor> ChunkTensors(const Layout& l, int r, int c) const;

  // The gradient buckets the runtime all-reduces for chunk c of pipeline rank r (Trainer's
  // BuildState): the tensors reduced whole (not the distributed optimizer's slices) with peers,
  // in grad-buffer order (replicated, other dense, routed experts), a run per reduction group,
  // split with --overlap-grad-reduce from the buffer's end into buckets of at least
  // Layout::GradBucketParams() elements, and apart at SP's TP-partial gradients; with the
  // distributed optimizer each tensor's reduce-scatter (`scatter`). `overlapped`: handed over
  // during the backward (SP's TP-partial ones wait for their TP sum).
  struct DpBucket {
    double numel = 0;
    bool expert = false;
    bool overlapped = false;
    bool scatter = false;
  };
  std::vector<DpBucket> ChunkDpBuckets(const Layout& l, int r, int c) const;

 private:
  double Gemm(const char* table, double m, double n, double k, double slow) const;
  double Op(const char* table, double a, double slow) const;             // 1-axis tables
  double Op(const char* table, double a, double b, double slow) const;   // 2-axis tables
  double Alloc(double bytes, double slow) const;
  double MemoryOp(const LayerOp& op, double slow) const;  // a kMemory op by its table
  double EpilogueGemm(const LayerOp& op, double slow) const;  // a GEMM with its bias (+ GeLU)
  double BiasResidual(const LayerOp& op, bool norm, double slow) const;  // (+ the next norm)
  double TimeOnce(const Layout& l, const LayerOp& op) const;
  // The standard deviation of GeLU's inputs (its cost depends on it, see core/measured.cc).
  double GeluSigma() const;
  double Gelu(const char* table, double elements, double slow) const;
  // A collective over `ranks` ranks of `bytes`; 0 when ranks == 1.
  double Coll(const char* table, int ranks, double bytes, const Layout& l) const;
  // How much slower compute runs with this layout's ranks sharing a node's cores (>= 1).
  double Slowdown(const Layout& l) const;
  double BackwardWorkingSet(const Layout& l) const;  // bytes, transient, one layer's backward
  double MoeWorkingSet(const Layout& l) const;  // bytes, transient, an MoE MLP's forward / backward
  int ExpertDp(const Layout& l) const;          // ranks of an expert-DP group
  double InFlight(const Layout& l, int r) const;     // chunks in flight at stage r's peak

  ModelSpec model_;
  MeasuredPrimitives m_;
  int gpus_per_node_;
};

}  // namespace ptdp
