// The transformer layer as the kernels Megatron-Core runs, per rank, with their shapes: one
// description of what a layer, the embedding and the output layer are, read by the analytic
// cost model (a law per kernel kind), the simulator (through it) and checked against what
// ptdp's runtime executes (tests/core/layer_ops_test.cc). MoE, MLA and context-parallel
// variants add operations here, not formulas elsewhere.
//
// Order and shapes follow Megatron-Core's TransformerLayer with the Transformer Engine spec
// (megatron/core/transformer/transformer_layer.py, attention.py, mlp.py) and its linear layers
// (megatron/core/tensor_parallel/layers.py: ColumnParallelLinear / RowParallelLinear and
// LinearWithGradAccumulationAndAsyncCommunication):
//   forward   norm1, [SP all-gather], QKV, [rotary], attention, proj, [TP all-reduce | SP
//             reduce-scatter], bias-dropout-add, norm2, [SP all-gather], FC1, activation, FC2,
//             [all-reduce | reduce-scatter], bias-dropout-add
//   backward  the reverse; a column-parallel layer (QKV, FC1) computes its input gradient
//             (dgrad), then launches its TP all-reduce (SP: reduce-scatter) asynchronously
//             under the weight-gradient GEMM (wgrad); with SP it also re-gathers its input
//             for wgrad, asynchronously under dgrad. A row-parallel layer (proj, FC2) with SP
//             all-gathers its output gradient before dgrad.
// Letters: b micro-batch, s sequence, s_l = s/c tokens per CP rank, h hidden, t/c TP/CP size,
// T = b s_l tokens, Tl = T/t with SP else T, A = h/t, Q = A + 2 max(1, k/t) d_h the local QKV
// width, F = f/t, Fi = F (2F for SwiGLU), e activation bytes.
#pragma once

#include <array>
#include <cstdint>

#include "core/layout.h"
#include "core/model.h"

namespace ptdp {

enum class LayerOpKind : uint8_t {
  kGemm,       // dense GEMM on tensor cores: output m x n, reduction k
  kAttention,  // attention core (fused flash attention, or the unfused batched GEMMs)
  kMemory,     // memory-bound kernel: its cost is the bytes it moves
  kComm,       // TP or CP communication
};

enum class GemmPass : uint8_t { kFprop, kDgrad, kWgrad };
// kSendRecv: ptdp's runtime only, one step of the CP ring: a grouped send of `bytes` to the
// next CP rank and a receive of as many from the previous one.
enum class CommKind : uint8_t { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kSendRecv };
// kEp: the expert-parallel group (ep ranks, etp apart); kEtp: the expert tensor-parallel group
// (etp consecutive ranks), both of the expert grid (Layout::ep, etp).
// kTpCp: ptdp's runtime only, the t x c ranks that hold one micro-batch's tokens (the MoE
// auxiliary loss counts tokens per expert over them).
enum class CommGroup : uint8_t { kTp, kCp, kEp, kEtp, kTpCp };

// How a communication op runs against the compute around it (Megatron's schedule).
enum class CommOverlap : uint8_t {
  kBlocking,   // the next op needs its result: on the critical path
  kAsync,      // launched asynchronously under op `with` (Megatron's async TP all-reduce /
               // reduce-scatter of dgrad under wgrad, the SP input re-gather under dgrad)
  kTpOverlap,  // blocking, unless --tp-comm-overlap splits it into `chunks` pipelined against
               // op `with` (Transformer Engine's userbuffers: ring-exchange or pipeline)
  kRing,       // CP ring exchange of K/V blocks, pipelined with the attention `with`
};

// What a memory-bound kernel is (the analytic model times it by its bytes; a runtime model by
// its measured table).
enum class MemoryKernel : uint8_t {
  kNone,
  kNorm, kNormBackward,            // LayerNorm / RMSNorm (+ the residual gradient add)
  kRotary, kRotaryBackward,        // RoPE on q and k
  kActivation, kActivationBackward,  // GeLU (bias fused) / SwiGLU / squared ReLU
  kBiasDropoutAdd, kBiasDropoutAddBackward,
  kSoftmax, kSoftmaxBackward,      // unfused attention only: mask + softmax + dropout
  kEmbedding, kEmbeddingBackward,  // lookup / scatter-add (+ positions)
  kCrossEntropy, kCrossEntropyBackward,  // vocab-parallel, fp32 logits
  kFp8Cast,                        // fp8 GEMM operand: quantize (+ amax) and transposed copy
  // ptdp's own runtime only (OpShape::runtime): what Megatron fuses, it runs as kernels of
  // its own, and it allocates each new tensor.
  kBiasAdd, kBiasGrad,             // bias broadcast over rows / its gradient, a column sum
  kAdd, kCopy,                     // residual add; a copy (the residual gradient, inputs)
  // A row-parallel linear's bias and the residual added in one kernel (Backend::AddBiasResidual,
  // FC2), and the same followed by the next LayerNorm (AddBiasResidualLayerNorm: the
  // projection's output into norm2).
  kBiasResidual, kBiasResidualNorm,
  kLossSum,                        // the micro-batch's loss, a sum of squares over T
  kAlloc,                          // a new tensor of `bytes`, uninitialised (GptChunk::Out)
  kFill,                           // zeroing a new accumulator (Backend::Alloc's zero-fill)
  // Mixture of Experts (megatron/core/transformer/moe/): the router's score function and top-k
  // over (T, E) fp32 scores, the token permutation into expert order and its inverse (the
  // combine, weighted by the router's probabilities).
  kRouter, kRouterBackward,
  kPermute, kPermuteBackward,
  // A hybrid model's Mamba-2 mixer between in_proj and out_proj: conv1d, the SSD chunked scan
  // and the gated RMSNorm (mamba_ssm's mamba_split_conv1d_scan_combined), FLOPs in `flops`.
  kSsmScan, kSsmScanBackward,
};

// What a GEMM's epilogue adds to its output in ptdp's runtime (Backend::MatmulBias,
// MatmulBiasGelu, MatmulGeluBackward; cuBLASLt's CUBLASLT_EPILOGUE_BIAS, GELU_AUX_BIAS and DGELU
// on CUDA): a bias, or a bias and then GeLU (the pre-activation kept for the backward), or
// GeLU's gradient at the kept pre-activation (FC2's dgrad).
enum class GemmEpilogue : uint8_t { kNone, kBias, kBiasGelu, kGeluBackward };

// Trivially constructible (no member initialisers): a list of kMax ops costs nothing until
// Add() fills one; Add() sets every field (kind and name as given, with -1, chunks and kernels
// 1, the rest 0 / first enumerator).
struct LayerOp {
  LayerOpKind kind;
  const char* name;
  // kGemm: (m x k) x (k x n). kAttention: m = b x local heads (the batch), n = queries of this
  // rank (s_l), k = keys it attends over (s), and `head_dim`. kMemory: the tensor it works on,
  // m rows (tokens) x n columns.
  double m, n, k, head_dim;
  GemmPass pass;  // kGemm; kAttention: kFprop forward, kDgrad backward
  double flops;  // FLOPs executed: 2mnk for a GEMM; attention with its causal share
  // kMemory: HBM bytes read + written. kComm: the message (the gathered / unreduced tensor).
  double bytes;
  bool replicated;  // kMemory: work repeated on every TP rank (norms, residual; not with SP)
  MemoryKernel kernel;
  CommKind comm;
  CommGroup group;
  CommOverlap overlap;
  int with;     // kComm: index, in the same list, of the compute op it overlaps (-1: none)
  int chunks;   // kTpOverlap: pieces under --tp-comm-overlap (ring-exchange: t; pipeline: 4)
  int kernels;  // kernel launches (host dispatch)
  // kGemm: a grouped GEMM over `groups` experts (Transformer Engine's GroupedLinear, one
  // launch): m, n, k are one group's; the FLOPs are all groups'. 1 for a plain GEMM.
  int groups;
  bool expert;  // kGemm: a routed experts' GEMM (grouped_gemm_eff applies)
  // kGemm: its operands are quantized (fp8 or fp4 runs, OpShape::fp8), so it runs at the
  // layout's precision; false: at the 16-bit one. Megatron-Core's output layer is its own
  // ColumnParallelLinear outside Transformer Engine's fp8 autocast (which wraps the transformer
  // block's layers: transformer_block.py, get_fp8_context), so its logits GEMMs stay bf16.
  bool quantized;
  GemmEpilogue epilogue;  // kGemm, the runtime only: its bias (and GeLU) or GeLU's gradient in the same call
  // kAttention in ptdp's runtime with CP (Backend::AttentionBlockForward): 1 the rank's own
  // K/V block (ring step 0), 2 another rank's (m counts the c - 1 of them); 0 otherwise.
  int cp_block;
  // The op runs this many times back to back (the runtime's CP ring steps); 1 otherwise.
  int repeat;
};

// A fixed-capacity list: the planner's hot path builds one per layout without allocating.
struct LayerOpList {
  static constexpr int kMax = 96;
  std::array<LayerOp, kMax> ops;
  int size = 0;
  LayerOp& Add(LayerOpKind kind, const char* name);
  const LayerOp* begin() const { return ops.data(); }
  const LayerOp* end() const { return ops.data() + size; }
  const LayerOp& operator[](int i) const { return ops[i]; }
  int Gemms() const;        // number of GEMM ops
  double GemmFlops() const;  // their FLOPs
};

// The per-rank shape of one micro-batch, from a layout.
struct OpShape {
  int tp = 1, cp = 1;
  double micro_batch = 1;
  bool sp = false;            // sequence parallel (t > 1)
  double act_bytes = 2;       // bytes per activation element (4 in fp32)
  Recompute recompute = Recompute::kNone;
  // With selective recompute, the modules it reruns (Layout::RecomputedModules: core_attn unless
  // --recompute-modules names others); 0 otherwise.
  uint8_t recompute_modules = 0;
  // fp8 GEMMs (Transformer Engine, --fp8-format): each fprop and dgrad GEMM first casts its
  // (m x k) activation or gradient operand to fp8 with a transposed copy for the later wgrad
  // (TE's cast_transpose: read 2 bytes, write 1 + 1 per element; after a norm the cast is
  // fused into it, as into the activation before FC2, and only the writes remain). Weights are cast once per step (TE's
  // is_first_microbatch cache), not counted.
  bool fp8 = false;  // and fp4 (NVFP4: the same operands are quantized)
  // Unfused attention: bytes moved per attention score by mask + softmax + dropout, forward
  // (and again in backward); 0 for fused (flash) attention, which never writes the scores.
  double score_bytes = 0;
  // The layer as ptdp's runtime (runtime/gpt.cc, a GPT shape) executes it rather than
  // Megatron-Core: the same GEMMs and collectives, but biases, residual adds and positions as
  // its backend's calls (QKV and FC1 with their bias and GeLU as GEMM epilogues, the
  // projection's bias and residual fused into norm2, FC2's into one kernel: kBiasResidual,
  // kBiasResidualNorm, kAdd, ...), every new tensor allocated (kAlloc), the SP
  // input kept from the forward (no re-gather for wgrad), every collective blocking, and the
  // attention saving `saved_per_score` elements per score and `saved_per_token` per token and
  // head for its backward (the backend's AttentionSavedShape), or with CP its own ring of
  // attention blocks (one log-sum-exp per query and head saved). Its recompute reruns the
  // layer (full) or its attention core with allocations and ring (selective). No fp8.
  bool runtime = false;
  double saved_per_score = 0, saved_per_token = 0;
  // Expert parallelism (MoE models): the expert grid's ep and etp, and the load of the most
  // loaded expert rank relative to the mean T k / E per expert (1: force-balanced; a capacity
  // factor C with padding: C; dropless: the cost model's imbalance constant).
  int ep = 1, etp = 1;
  double expert_load = 1;
  // The loss over the vocabulary (Layout::cross_entropy): Megatron's on fp32 logits, separate
  // ops or jit-fused, or Transformer Engine's kernel on the 16-bit ones.
  CrossEntropyFusion cross_entropy = CrossEntropyFusion::kNone;
};
OpShape ShapeOf(const Layout& l, double score_bytes);

// One transformer layer: forward, backward, and what the backward reruns first (full
// recompute: the whole forward; selective: the attention core; none: empty).
struct LayerOps {
  LayerOpList forward, backward, recompute;
};
// `moe`: the layer's MLP is the MoE block (router, dispatch, grouped experts, combine, shared
// experts) rather than the dense MLP. Attention is multi-latent (MLA) when the model says so.
void BuildLayerOps(const ModelSpec& m, const OpShape& s, LayerOps* out, bool moe = false);
// A layer of kind `kind` (core/model.h): a transformer layer, or a hybrid model's one-block
// Mamba, attention, MLP or MoE layer (each with its pre-norm and residual add).
void BuildLayerOps(const ModelSpec& m, const OpShape& s, LayerOps* out, LayerKind kind);

// The first stage's embedding (vocab-parallel lookup, its TP reduction, positions) and the last
// stage's output layer (final norm, logits GEMM, vocab-parallel cross entropy), forward and
// backward.
void BuildEmbeddingOps(const ModelSpec& m, const OpShape& s, LayerOpList* fwd, LayerOpList* bwd);
void BuildOutputOps(const ModelSpec& m, const OpShape& s, LayerOpList* fwd, LayerOpList* bwd);
// A chunk whose input comes from another stage: Megatron-Core computes on the received buffer
// (both lists empty); ptdp's runtime copies it into a tensor of the chunk's own.
void BuildStageInputOps(const ModelSpec& m, const OpShape& s, LayerOpList* fwd, LayerOpList* bwd);

// The causal share of attention FLOPs a flash kernel executes with blocks of `block` keys:
// (1 + block/s)/2 of the full s x s (the diagonal blocks run whole).
double CausalShare(double s, double block = 128);
// The share of the s x s scores a layer's attention computes, averaged over the model's
// layers: causal (CausalShare) for global layers, a band of `sliding_window` keys for
// windowed ones (about w/s (1 - w/2s) of the square, plus the diagonal blocks).
double AttentionShare(const ModelSpec& m, double s, double block = 128);

const char* ToString(LayerOpKind k);
const char* ToString(CommKind k);

}  // namespace ptdp
