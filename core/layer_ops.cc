// The layer as its kernels; see layer_ops.h for the sources and letters.
#include "core/layer_ops.h"

#include <algorithm>
#include <cassert>
#include <string_view>

namespace ptdp {

LayerOp& LayerOpList::Add(LayerOpKind kind, const char* name) {
  // kMax bounds the longest list (the backward with SP, CP, rotary, fp8 and unfused attention
  // is 31 ops); a longer one is a bug here, caught by the tests, never user input.
  assert(size < kMax);
  LayerOp& op = ops[size < kMax ? size++ : kMax - 1];
  op = LayerOp{};  // zero
  op.kind = kind;
  op.name = name;
  op.with = -1;
  op.chunks = 1;
  op.kernels = 1;
  op.groups = 1;
  op.expert = false;
  op.quantized = false;
  op.cp_block = 0;
  op.repeat = 1;
  op.epilogue = GemmEpilogue::kNone;
  return op;
}

int LayerOpList::Gemms() const {
  int n = 0;
  for (const LayerOp& op : *this) n += op.kind == LayerOpKind::kGemm;
  return n;
}

double LayerOpList::GemmFlops() const {
  double f = 0;
  for (const LayerOp& op : *this)
    if (op.kind == LayerOpKind::kGemm) f += op.flops;
  return f;
}

OpShape ShapeOf(const Layout& l, double score_bytes) {
  OpShape s;
  s.tp = l.tp;
  s.cp = l.cp;
  s.micro_batch = l.micro_batch;
  s.sp = l.sequence_parallel && l.tp > 1;
  s.act_bytes = l.precision == Precision::kFp32 ? 4.0 : 2.0;
  s.recompute = l.recompute;
  s.recompute_modules = l.RecomputedModules();
  // fp4 (NVFP4) quantizes the same operands: counted with fp8's bytes, an upper bound (the
  // 4-bit copies are half the size, plus one scale per 16 elements).
  s.fp8 = l.precision == Precision::kFp8 || l.precision == Precision::kFp4;
  s.score_bytes = score_bytes;
  s.cross_entropy = l.cross_entropy;
  return s;
}

double CausalShare(double s, double block) { return 0.5 * (1.0 + std::min(1.0, block / s)); }

double AttentionShare(const ModelSpec& m, double s, double block) {
  const double causal = CausalShare(s, block);
  const double windowed = double(m.windowed_layers()) / double(std::max<int64_t>(1, m.layers));
  if (windowed <= 0 || double(m.sliding_window) >= s) return causal;
  // Each query attends over min(q, w) keys: w/s (1 - w/2s) of the square; flash attention runs
  // the blocks the band touches, about one more block of keys per query block.
  const double w = double(m.sliding_window);
  const double band = std::min(1.0, w / s * (1.0 - w / (2 * s)) + block / s);
  return (1 - windowed) * causal + windowed * std::min(causal, band);
}

namespace {

struct Dims {
  double T, Tl, h, A, Q, F, Fi, hd, heads, kv, sl, s, e;
  int t;
  // Attention head sizes of queries/keys and of values (MLA: qk + qk_pos and v; else d_h), the
  // share of the scores computed (causal, windows).
  double hd_qk, hd_v, share;
  // MoE: routed experts E, top-k, local experts G = E/ep, one expert's width on this rank
  // Fe = f_e/etp (Fei: 2 Fe gated), the shared experts' Fs = f_s/t (Fsi), and the routed
  // assignments this rank's experts compute, Tr = Tl k x load (x etp: gathered over expert TP).
  double E, topk, G, Fe, Fei, Fs, Fsi, Tr;
  // The width the routed tokens carry through the dispatch, the experts and the combine: h,
  // or LatentMoE's latent size L (lat, 0 without: the h x L projections on either side).
  double hm, lat;
  double rot;  // elements per token RoPE rotates
  double kvw;  // K and V elements per token on this rank (the CP ring's message)
  // Mamba-2 (hybrid models) per TP rank: d_inner, the in_proj's outputs, the conv channels;
  // the scan's forward FLOPs and bytes per token of this rank (MambaForward).
  double mi, min, mconv, mscan_flops, mscan_bytes;
};

Dims DimsOf(const ModelSpec& M, const OpShape& s) {
  Dims x;
  x.t = s.tp;
  const double t = s.tp;
  x.s = double(M.seq_len);
  x.sl = x.s / s.cp;
  x.T = s.micro_batch * x.sl;
  x.Tl = s.sp ? x.T / t : x.T;
  x.h = double(M.hidden);
  x.hd = double(M.head_dim());
  x.heads = double(M.heads) / t;
  x.hd_qk = M.mla() ? double(M.qk_head_dim + M.qk_pos_head_dim) : x.hd;
  x.hd_v = M.mla() ? double(M.v_head_dim) : x.hd;
  // The local attention width: heads/t values of d_v (h/t for GPT shapes; kv_channels and MLA
  // set it apart from h).
  x.A = x.heads * x.hd_v;
  // K/V heads per TP rank: k/t, or one group replicated when t > k (GQA).
  x.kv = std::max(1.0, double(M.kv_heads) / t);
  x.Q = M.mla() ? x.heads * (2 * x.hd_qk + x.hd_v) : x.A + 2 * x.kv * x.hd;
  // What RoPE rotates: MLA's rotary query part and its one shared rotary key; else q and k
  // (rotary_percent of each head).
  x.rot = M.mla() ? (x.heads + 1) * double(M.qk_pos_head_dim)
                  : (x.A + x.kv * x.hd) * M.rotary_percent;
  x.F = double(M.ffn_hidden) / t;
  x.Fi = M.gated() ? 2 * x.F : x.F;
  x.e = s.act_bytes;
  x.share = AttentionShare(M, x.s);
  x.kvw = M.mla() ? x.heads * (x.hd_qk + x.hd_v) : 2 * x.kv * x.hd;
  x.E = double(M.num_experts);
  x.topk = double(M.moe_topk);
  x.G = M.moe() ? x.E / s.ep : 0;
  x.Fe = double(M.moe_ffn_hidden) / s.etp;
  x.Fei = M.gated() ? 2 * x.Fe : x.Fe;
  x.Fs = double(M.moe_shared_ffn_hidden) / t;
  x.Fsi = M.gated() ? 2 * x.Fs : x.Fs;
  // Tokens enter the MoE block split over TP (SP) or, without SP (t 1 or ep 1), whole.
  x.Tr = x.Tl * x.topk * s.expert_load * (s.sp ? s.etp : 1);
  x.lat = double(M.moe_latent_size);
  x.hm = double(M.moe_width());
  x.mi = double(M.mamba_inner()) / t;
  x.min = double(M.mamba_in_proj()) / t;
  x.mconv = double(M.mamba_conv_channels()) / t;
  {
    // With CP each rank scans the whole sequence for heads/(t c): per token of its own the
    // same work as heads/t without CP.
    const double nh = double(M.mamba_num_heads) / t, g = double(M.mamba_num_groups) / t;
    const double P = double(M.mamba_head_dim), N = double(M.mamba_state_dim);
    const double Q = double(ModelSpec::kMambaChunk), taps = double(ModelSpec::kMambaConvKernel);
    x.mscan_flops = nh * (2 * Q * P + 4 * N * P) + g * 2 * Q * N + 2 * taps * x.mconv;
    x.mscan_bytes = x.e * (3 * x.mconv + nh + 4 * x.mi) + 12 * nh * P * N / Q + 8 * Q * g;
  }
  return x;
}

LayerOp& Memory(LayerOpList* l, const char* name, MemoryKernel kernel, double rows, double cols,
                double bytes, bool replicated) {
  LayerOp& op = l->Add(LayerOpKind::kMemory, name);
  op.kernel = kernel;
  op.m = rows;
  op.n = cols;
  op.bytes = bytes;
  op.replicated = replicated;
  return op;
}

// The runtime's allocation of a new tensor (OpShape::runtime only): uninitialised, as the
// runtime allocates what an op overwrites (GptChunk::Out, Backend::AllocUninit).
void Alloc(LayerOpList* l, const OpShape& s, double bytes) {
  if (s.runtime) Memory(l, "alloc", MemoryKernel::kAlloc, 0, 0, bytes, false);
}

// A new tensor the runtime zeroes because ops add to it (GptChunk::F32 and ActZeros: the CP
// dK/dV accumulators, the MoE combine and its gradient, the final norm's input gradient): the
// allocation and a fill of its bytes (the fill table, timed on activation elements).
void AllocZeroed(LayerOpList* l, const OpShape& s, double bytes) {
  if (!s.runtime) return;
  Alloc(l, s, bytes);
  Memory(l, "alloc.zero", MemoryKernel::kFill, bytes / s.act_bytes, 1, bytes, false);
}

// A GEMM; with fp8, preceded by the cast of its (m x k) operand for fprop and dgrad (`fused`:
// the cast rides on the norm before it, only its writes remain). The runtime allocates the
// output of fprop and dgrad (wgrad accumulates into the gradient).
LayerOp& Gemm(LayerOpList* l, const OpShape& s, const char* name, GemmPass pass, double m,
              double n, double k, bool fused = false) {
  if (s.fp8 && pass != GemmPass::kWgrad)
    Memory(l, pass == GemmPass::kFprop ? "fp8_cast" : "fp8_cast.backward",
           MemoryKernel::kFp8Cast, m, k, m * k * (fused ? 2.0 : 4.0), false);
  if (pass != GemmPass::kWgrad) Alloc(l, s, m * n * s.act_bytes);
  LayerOp& op = l->Add(LayerOpKind::kGemm, name);
  op.quantized = s.fp8;
  op.pass = pass;
  op.m = m;
  op.n = n;
  op.k = k;
  op.flops = 2 * m * n * k;
  return op;
}

// A TP or CP collective of `bytes` (the gathered / unreduced tensor); returns its index. The
// runtime's collectives block, and it allocates what a gather or reduce-scatter returns.
int Comm(LayerOpList* l, const OpShape& s, const char* name, CommKind kind, CommGroup group,
         double bytes, CommOverlap overlap, int with, int chunks = 1) {
  LayerOp& op = l->Add(LayerOpKind::kComm, name);
  op.comm = kind;
  op.group = group;
  op.bytes = bytes;
  op.overlap = s.runtime ? CommOverlap::kBlocking : overlap;
  op.with = s.runtime ? -1 : with;
  op.chunks = s.runtime ? 1 : chunks;
  const int at = l->size - 1;
  if (kind == CommKind::kAllGather) Alloc(l, s, bytes);
  if (kind == CommKind::kReduceScatter) {
    const int ranks = group == CommGroup::kTp    ? s.tp
                      : group == CommGroup::kEtp ? s.etp
                      : group == CommGroup::kEp  ? s.ep
                                                 : s.cp;
    Alloc(l, s, bytes / ranks);
  }
  return at;
}

int Last(const LayerOpList& l) { return l.size - 1; }

// Comm op `at` overlaps op `with` (set once `with` is in the list); nothing for a blocking one.
void Overlaps(LayerOpList* l, int at, int with) {
  if (at >= 0 && l->ops[at].overlap != CommOverlap::kBlocking) l->ops[at].with = with;
}

// Transformer Engine's userbuffer methods (transformer_engine/pytorch/module/base.py,
// initialize_ub defaults): ring-exchange all-gathers in t pieces (qkv/fc1 fprop, proj/fc2
// dgrad), pipelined reduce-scatters in 4 (proj/fc2 fprop).
constexpr int kPipelineSplits = 4;

// A norm's forward: its (Tl, h) output and, in the runtime, the output and its two (Tl)
// statistics allocated first. `residual` (the runtime's norm2): the projection's bias and the
// residual added to its input in the same kernel (Backend::AddBiasResidualLayerNorm: reads the
// input and the residual, writes the sum and the norm).
void NormForward(const OpShape& s, const Dims& x, const char* name, LayerOpList* l,
                 bool residual = false) {
  Alloc(l, s, x.Tl * x.h * x.e);
  Alloc(l, s, x.Tl * x.e);
  Alloc(l, s, x.Tl * x.e);
  Memory(l, name, residual ? MemoryKernel::kBiasResidualNorm : MemoryKernel::kNorm, x.Tl, x.h,
         (residual ? 4 : 2) * x.Tl * x.h * x.e, !s.sp);
}

// A norm, then a column-parallel GEMM of `out` local outputs fed by it: with SP the norm's
// output is all-gathered first (TE: ring-exchange in t pieces under the GEMM with
// --tp-comm-overlap); the fp8 cast rides on the norm; Megatron fuses the bias into the GEMM,
// so does the runtime (`bias`: Backend::MatmulBias, the GEMM's epilogue). `residual`: as
// NormForward's. Returns the GEMM.
LayerOp& NormColumnForward(const OpShape& s, const Dims& x, const char* norm, const char* gather,
                           const char* gemm, bool bias, double out, LayerOpList* l,
                           bool residual = false) {
  NormForward(s, x, norm, l, residual);
  int ag = -1;
  if (s.sp)
    ag = Comm(l, s, gather, CommKind::kAllGather, CommGroup::kTp, x.T * x.h * x.e,
              CommOverlap::kTpOverlap, -1, x.t);
  LayerOp& g = Gemm(l, s, gemm, GemmPass::kFprop, x.T, out, x.h, /*fused=*/true);
  Overlaps(l, ag, Last(*l));
  if (s.runtime && bias) g.epilogue = GemmEpilogue::kBias;
  return g;
}

// A row-parallel GEMM's output reduction: all-reduce, or with SP reduce-scatter (TE: pipelined
// in 4 pieces under the GEMM with --tp-comm-overlap), then bias-dropout-add. The runtime (no
// dropout): the bias and the residual in one kernel (`add`: Backend::AddBiasResidual), or
// with `into_norm` in the next norm's (NormForward's `residual`).
void RowReduceAndAdd(const ModelSpec& M, const OpShape& s, const Dims& x, const char* ar,
                     const char* rs, const char* bda, const char* add, bool into_norm,
                     LayerOpList* l) {
  if (x.t > 1)
    Comm(l, s, s.sp ? rs : ar, s.sp ? CommKind::kReduceScatter : CommKind::kAllReduce,
         CommGroup::kTp, x.T * x.h * x.e, CommOverlap::kTpOverlap, Last(*l), kPipelineSplits);
  if (!s.runtime) {
    Memory(l, bda, MemoryKernel::kBiasDropoutAdd, x.Tl, x.h, 3 * x.Tl * x.h * x.e, !s.sp);
    return;
  }
  if (into_norm) return;
  Memory(l, add, M.bias ? MemoryKernel::kBiasResidual : MemoryKernel::kAdd, x.Tl, x.h,
         3 * x.Tl * x.h * x.e, !s.sp);
}

// The attention core over this rank's s_l queries and all s keys, forward or backward: flash
// attention skips the blocks above the diagonal (backward: FlashAttention-2 recomputes S, then
// dV, dP, dQ, dK: 5 of the forward's 2 matmuls); unfused attention runs the full masked scores
// (backward: dQ, dK from dS, dV, dP from the stored probabilities) and moves them through HBM
// in its softmax. With CP, the K/V ring (its gradients in backward) runs under it. The runtime
// allocates what it saves and its output (forward), the QKV gradient (backward).
// ptdp's runtime with CP (runtime/gpt.cc AttentionCore / AttentionCoreBackward): the K/V
// columns copied out of QKV, the rank's own block, then c - 1 ring steps each receiving
// another rank's block (and, backward, its dK/dV accumulator, which a last hop brings home),
// each block merged by Backend::AttentionBlockForward / Backward; the forward keeps the
// (b, heads, s_l) log-sum-exp for the backward.
void RuntimeCpAttentionCore(const OpShape& s, const Dims& x, bool backward, const char* name,
                            LayerOpList* l) {
  const double batch = s.micro_batch * x.heads, kv = x.T * 2 * x.A * x.e;
  const double steps = s.cp - 1;
  if (!backward) {
    Alloc(l, s, batch * x.sl * x.e);  // lse
    Alloc(l, s, x.T * x.A * x.e);     // the output
  } else {
    AllocZeroed(l, s, x.T * x.Q * x.e);  // dqkv: the blocks add to it
  }
  Alloc(l, s, kv);
  Memory(l, "attention.cp_kv_copy", MemoryKernel::kCopy, x.T, 2 * x.A, 2 * kv, false);
  if (backward) AllocZeroed(l, s, kv);  // the dK/dV accumulator
  const double square = 2 * batch * x.sl * x.sl * (x.hd_qk + x.hd_v);  // QK^T and AV, one block
  for (int block = 1; block <= 2; ++block) {
    if (block == 2 && steps == 0) break;
    LayerOp& a = l->Add(LayerOpKind::kAttention, name);
    a.m = block == 1 ? batch : batch * steps;
    a.n = x.sl;
    a.k = x.sl;
    a.head_dim = (x.hd_qk + x.hd_v) / 2;
    // Half of each block's scores are computed (causal load balancing); backward 2x.
    a.flops = (backward ? 2 : 1) * 0.5 * square * (block == 1 ? 1 : steps);
    a.pass = backward ? GemmPass::kDgrad : GemmPass::kFprop;
    a.cp_block = block;
  }
  if (steps > 0) {
    // Each step allocates what it receives (forward: the next K/V; backward: K/V and dK/dV).
    const double per_step = backward ? 2 * kv : kv;
    const int at = l->size;
    Alloc(l, s, per_step);
    if (l->size > at) l->ops[at].repeat = int(steps);
    Comm(l, s, backward ? "attention.cp_ring.backward" : "attention.cp_ring", CommKind::kSendRecv,
         CommGroup::kCp, per_step, CommOverlap::kBlocking, -1);
    l->ops[Last(*l)].repeat = int(steps);
    if (backward) {  // the accumulators' last hop home
      Alloc(l, s, kv);
      Comm(l, s, "attention.cp_ring.home", CommKind::kSendRecv, CommGroup::kCp, kv,
           CommOverlap::kBlocking, -1);
    }
  }
  if (backward)
    Memory(l, "attention.cp_dkv_copy", MemoryKernel::kCopy, x.T, 2 * x.A, 2 * kv, false);
}

void AttentionCore(const OpShape& s, const Dims& x, bool backward, const char* name,
                   LayerOpList* l) {
  if (s.runtime && s.cp > 1) return RuntimeCpAttentionCore(s, x, backward, name, l);
  const double batch = s.micro_batch * x.heads;
  if (!backward) {
    Alloc(l, s, batch * (s.saved_per_score * x.sl * x.s + s.saved_per_token * x.sl) * x.e);
    Alloc(l, s, x.T * x.A * x.e);
  } else {
    Alloc(l, s, x.T * x.Q * x.e);
  }
  const double full = 2 * batch * x.sl * x.s * (x.hd_qk + x.hd_v);  // QK^T and AV, forward
  const bool unfused = s.score_bytes > 0;
  LayerOp& a = l->Add(LayerOpKind::kAttention, name);
  a.m = batch;
  a.n = x.sl;
  a.k = x.s;
  a.head_dim = (x.hd_qk + x.hd_v) / 2;
  a.flops = unfused ? (backward ? 2 : 1) * full : (backward ? 2.5 : 1) * full * x.share;
  a.pass = backward ? GemmPass::kDgrad : GemmPass::kFprop;
  if (unfused) a.kernels = backward ? 4 : 2;
  const int attn = Last(*l);
  if (unfused)
    Memory(l, backward ? "softmax.backward" : "softmax",
           backward ? MemoryKernel::kSoftmaxBackward : MemoryKernel::kSoftmax, batch * x.sl, x.s,
           batch * x.sl * x.s * s.score_bytes, false);
  if (s.cp > 1)
    Comm(l, s, backward ? "attention.cp_ring.backward" : "attention.cp_ring",
         backward ? CommKind::kReduceScatter : CommKind::kAllGather, CommGroup::kCp,
         x.T * x.kvw * x.e * s.cp, CommOverlap::kRing, attn);
}

// Multi-latent attention's projections (megatron/core/transformer/multi_latent_attention.py,
// DeepSeek-V2 sec. 2.1): the down projections to the q and kv latents (and the shared rotary
// key) on the whole gathered input, replicated over TP, their norms, then the column-parallel
// up projections to each local head's q (qk + qk_pos) and k, v (qk + v).
void ColumnParallelBackward(const OpShape& s, const Dims& x, const char* name_ag,
                            const char* name_red, const char* dgrad, const char* wgrad,
                            const char* bias, double out, LayerOpList* l);
double MlaDown(const ModelSpec& M) {
  return double(M.q_lora_rank + M.kv_lora_rank + M.qk_pos_head_dim);
}
void MlaForward(const ModelSpec& M, const OpShape& s, const Dims& x, LayerOpList* l) {
  const double down = MlaDown(M);
  NormColumnForward(s, x, "norm1", "qkv.all_gather", "qkv_down", false, down, l);
  Memory(l, "qkv_down.norm", MemoryKernel::kNorm, x.T, down - M.qk_pos_head_dim,
         2 * x.T * (down - M.qk_pos_head_dim) * x.e, true);
  const double q_in = M.q_lora_rank > 0 ? double(M.q_lora_rank) : x.h;
  Gemm(l, s, "q_up", GemmPass::kFprop, x.T, x.heads * x.hd_qk, q_in);
  Gemm(l, s, "kv_up", GemmPass::kFprop, x.T, x.heads * (M.qk_head_dim + x.hd_v),
       double(M.kv_lora_rank));
}
void MlaBackward(const ModelSpec& M, const OpShape& s, const Dims& x, LayerOpList* b) {
  const double down = MlaDown(M);
  const double q_in = M.q_lora_rank > 0 ? double(M.q_lora_rank) : x.h;
  const double kv_out = x.heads * (M.qk_head_dim + x.hd_v);
  Gemm(b, s, "kv_up.dgrad", GemmPass::kDgrad, x.T, double(M.kv_lora_rank), kv_out);
  Gemm(b, s, "kv_up.wgrad", GemmPass::kWgrad, kv_out, double(M.kv_lora_rank), x.T);
  Gemm(b, s, "q_up.dgrad", GemmPass::kDgrad, x.T, q_in, x.heads * x.hd_qk);
  Gemm(b, s, "q_up.wgrad", GemmPass::kWgrad, x.heads * x.hd_qk, q_in, x.T);
  Memory(b, "qkv_down.norm.backward", MemoryKernel::kNormBackward, x.T,
         down - M.qk_pos_head_dim, 4 * x.T * (down - M.qk_pos_head_dim) * x.e, true);
  ColumnParallelBackward(s, x, "qkv.input_all_gather", s.sp ? "qkv.reduce_scatter.backward"
                                                            : "qkv.all_reduce.backward",
                         "qkv_down.dgrad", "qkv_down.wgrad", nullptr, down, b);
}

// The attention block's forward (or its recompute): norm1 .. bias-dropout-add.
void AttentionForward(const ModelSpec& M, const OpShape& s, const Dims& x, LayerOpList* l) {
  if (M.mla())
    MlaForward(M, s, x, l);
  else
    NormColumnForward(s, x, "norm1", "qkv.all_gather", "qkv", M.bias, x.Q, l);
  if (M.position == PositionEmbedding::kRope)
    Memory(l, "rotary", MemoryKernel::kRotary, x.T, x.rot, 2 * x.T * x.rot * x.e, false);
  AttentionCore(s, x, /*backward=*/false, "attention", l);
  Gemm(l, s, "proj", GemmPass::kFprop, x.T, x.h, x.heads * x.hd_v);
  // The runtime adds the projection's bias and the residual in norm2's kernel (MlpForward,
  // RuntimeMoeForward).
  RowReduceAndAdd(M, s, x, "proj.all_reduce", "proj.reduce_scatter", "bias_dropout_add1",
                  "bias_residual_add1", /*into_norm=*/true, l);
}

void MlpForward(const ModelSpec& M, const OpShape& s, const Dims& x, LayerOpList* l) {
  // The runtime: norm2 with the attention's bias and residual (AddBiasResidualLayerNorm).
  LayerOp& fc1 = NormColumnForward(s, x, s.runtime ? "bias_residual_add1+norm2" : "norm2",
                                   "fc1.all_gather", "fc1", M.bias, x.Fi, l, s.runtime);
  // GeLU reads F and writes F (bias fused: bias_gelu); SwiGLU reads 2F, writes F. The runtime
  // runs it in FC1's epilogue (MatmulBiasGelu: the pre-activation and the GeLU written).
  Alloc(l, s, x.T * x.F * x.e);
  if (s.runtime)
    fc1.epilogue = GemmEpilogue::kBiasGelu;
  else
    Memory(l, "activation", MemoryKernel::kActivation, x.T, x.F, (x.Fi + x.F) * x.T * x.e, false);
  Gemm(l, s, "fc2", GemmPass::kFprop, x.T, x.h, x.F, /*fused=*/true);  // TE: activation casts
  RowReduceAndAdd(M, s, x, "fc2.all_reduce", "fc2.reduce_scatter", "bias_dropout_add2",
                  "bias_residual_add2", /*into_norm=*/false, l);
}

// Backward of a row-parallel linear (proj, FC2): with SP, all-gather the output gradient
// (TE: ring-exchange under dgrad), then dgrad and wgrad. Returns the dgrad GEMM.
LayerOp& RowParallelBackward(const OpShape& s, const Dims& x, const char* name_ag,
                             const char* dgrad, const char* wgrad, double in, LayerOpList* l) {
  int gather = -1;
  if (s.sp)
    gather = Comm(l, s, name_ag, CommKind::kAllGather, CommGroup::kTp, x.T * x.h * x.e,
                  CommOverlap::kTpOverlap, -1, x.t);
  LayerOp& d = Gemm(l, s, dgrad, GemmPass::kDgrad, x.T, in, x.h);
  Overlaps(l, gather, Last(*l));
  Gemm(l, s, wgrad, GemmPass::kWgrad, x.h, in, x.T);  // dW (out = h) x (in)
  return d;
}

// Backward of a column-parallel linear (QKV, FC1) of `out` local outputs: with SP the input is
// re-gathered under dgrad; the input gradient's all-reduce (SP: reduce-scatter) runs under
// wgrad (Megatron's LinearWithGradAccumulationAndAsyncCommunication). The runtime kept the
// gathered input and computes the bias gradient (`bias`, or null) first.
void ColumnParallelBackward(const OpShape& s, const Dims& x, const char* name_ag,
                            const char* name_red, const char* dgrad, const char* wgrad,
                            const char* bias, double out, LayerOpList* l) {
  if (s.runtime && bias != nullptr)
    Memory(l, bias, MemoryKernel::kBiasGrad, x.T, out, x.T * out * x.e, false);
  int gather = -1, reduce = -1;
  if (s.sp && !s.runtime)
    gather = Comm(l, s, name_ag, CommKind::kAllGather, CommGroup::kTp, x.T * x.h * x.e,
                  CommOverlap::kAsync, -1);
  Gemm(l, s, dgrad, GemmPass::kDgrad, x.T, x.h, out);
  Overlaps(l, gather, Last(*l));
  if (x.t > 1)
    reduce = Comm(l, s, name_red, s.sp ? CommKind::kReduceScatter : CommKind::kAllReduce,
                  CommGroup::kTp, x.T * x.h * x.e, CommOverlap::kAsync, -1);
  Gemm(l, s, wgrad, GemmPass::kWgrad, out, x.h, x.T);
  Overlaps(l, reduce, Last(*l));
}

// The backward of a bias-dropout-add: the residual gradient, and (the runtime) the bias's
// gradient; `first`: the layer's first backward op, where the runtime copies the incoming
// residual gradient into a new buffer.
void BiasDropoutAddBackward(const ModelSpec& M, const OpShape& s, const Dims& x, bool first,
                            const char* name, const char* bias, LayerOpList* l) {
  if (!s.runtime) {
    Memory(l, name, MemoryKernel::kBiasDropoutAddBackward, x.Tl, x.h, 2 * x.Tl * x.h * x.e,
           !s.sp);
    return;
  }
  if (first) {
    Alloc(l, s, x.Tl * x.h * x.e);
    Memory(l, "residual_grad.copy", MemoryKernel::kCopy, x.Tl, x.h, 2 * x.Tl * x.h * x.e, !s.sp);
  }
  if (M.bias) Memory(l, bias, MemoryKernel::kBiasGrad, x.Tl, x.h, x.Tl * x.h * x.e, !s.sp);
}


// A grouped GEMM over the G local experts of Tr routed tokens in all (m x n x k per expert,
// split along m for fprop and dgrad, along k for wgrad).
LayerOp& GroupedGemm(LayerOpList* l, const OpShape& s, const Dims& x, const char* name,
                     GemmPass pass, double m, double n, double k) {
  const double g = std::max(1.0, x.G);
  LayerOp& op = pass == GemmPass::kWgrad ? Gemm(l, s, name, pass, m, n, k / g)
                                         : Gemm(l, s, name, pass, m / g, n, k);
  // The fp8 cast before it quantizes all groups' rows (Gemm sized it for one group's).
  if (l->size >= 2 && l->ops[l->size - 2].kernel == MemoryKernel::kFp8Cast &&
      l->ops[l->size - 2].kind == LayerOpKind::kMemory && pass != GemmPass::kWgrad) {
    l->ops[l->size - 2].m *= g;
    l->ops[l->size - 2].bytes *= g;
  }
  op.groups = int(g);
  op.expert = true;
  op.flops = 2 * m * n * k;
  return op;
}

// The expert-TP reduction of the routed tokens' outputs (reduce-scatter with SP, else
// all-reduce) and an all-to-all over the EP group, where those groups have more than one rank.
void EtpReduce(LayerOpList* l, const OpShape& s, const Dims& x, const char* rs, const char* ar) {
  if (s.etp > 1)
    Comm(l, s, s.sp ? rs : ar, s.sp ? CommKind::kReduceScatter : CommKind::kAllReduce,
         CommGroup::kEtp, x.Tr * x.hm * x.e, CommOverlap::kBlocking, -1);
}
void EpAllToAll(LayerOpList* l, const OpShape& s, const char* name, double bytes) {
  if (s.ep > 1)
    Comm(l, s, name, CommKind::kAllToAll, CommGroup::kEp, bytes, CommOverlap::kBlocking, -1);
}

// The MoE block as ptdp's runtime runs it (runtime/moe.cc), forward: the router GEMM (the
// top-k runs on the host, not timed), the dispatch counts over EP (and expert TP), the
// auxiliary loss's counts over TP x CP, the row gathers (Backend::EmbeddingForward) into send
// order, the all-to-all, the expert-TP all-gather, expert order; each of the G local experts'
// fc1, GeLU, fc2 on its R/G rows (R = Tl k x load x etp); back the same way, weighted
// (ScaleRows) and added per token (EmbeddingBackward); the shared experts as a TP MLP.
// `e` bytes for activations, 4 for the i32 index tensors.
// The runtime's row gather of `rows` (h wide) into a new tensor (Backend::EmbeddingForward).
void RuntimeRowGather(LayerOpList* l, const OpShape& s, const Dims& x, const char* name,
                      double rows) {
  Alloc(l, s, rows * x.h * x.e);
  Memory(l, name, MemoryKernel::kEmbedding, rows, x.h, 2 * rows * x.h * x.e, false);
}

// The runtime's G local experts' GEMMs, one after another (m x n x k each, `repeat` G).
void RuntimeExpertGemms(LayerOpList* l, const Dims& x, const char* name, GemmPass pass, double m,
                        double n, double k) {
  LayerOp& op = l->Add(LayerOpKind::kGemm, name);
  op.pass = pass;
  op.m = m, op.n = n, op.k = k;
  op.flops = 2 * m * n * k * x.G;
  op.groups = 1;
  op.expert = true;
  op.repeat = int(x.G);
}

void RuntimeMoeForward(const ModelSpec& M, const OpShape& s, const Dims& x, LayerOpList* l) {
  const double nk = x.Tl * x.topk, Rep = nk * s.expert_load, R = Rep * s.etp, G = x.G;
  NormForward(s, x, "bias_residual_add1+norm2", l, /*residual=*/true);
  if (s.sp)
    Comm(l, s, "shared.all_gather", CommKind::kAllGather, CommGroup::kTp, x.T * x.h * x.e,
         CommOverlap::kBlocking, -1);
  Gemm(l, s, "router", GemmPass::kFprop, x.Tl, x.E, x.h);
  Alloc(l, s, 4 * nk * 4 + nk * x.e + 2 * R * 4);  // index tensors and probabilities
  if (M.moe_aux_loss_coeff > 0 && s.tp * s.cp > 1)
    Comm(l, s, "router.aux_counts", CommKind::kAllReduce, CommGroup::kTpCp, x.E * 4,
         CommOverlap::kBlocking, -1);
  if (s.ep > 1)
    Comm(l, s, "dispatch.counts", CommKind::kAllToAll, CommGroup::kEp, x.E * 4,
         CommOverlap::kBlocking, -1);
  if (s.etp > 1)
    Comm(l, s, "dispatch.counts.all_gather", CommKind::kAllGather, CommGroup::kEtp,
         s.etp * s.ep * G * 4, CommOverlap::kBlocking, -1);
  auto gather = [&](const char* name, double rows) { RuntimeRowGather(l, s, x, name, rows); };
  auto experts = [&](const char* name, GemmPass pass, double m, double n, double k) {
    RuntimeExpertGemms(l, x, name, pass, m, n, k);
  };
  gather("dispatch.gather", nk);
  if (s.ep > 1) {
    Alloc(l, s, Rep * x.h * x.e);
    Comm(l, s, "dispatch.all_to_all", CommKind::kAllToAll, CommGroup::kEp, nk * x.h * x.e,
         CommOverlap::kBlocking, -1);
  }
  if (s.etp > 1)
    Comm(l, s, "dispatch.all_gather", CommKind::kAllGather, CommGroup::kEtp, R * x.h * x.e,
         CommOverlap::kBlocking, -1);
  gather("experts.order", R);
  Alloc(l, s, 2 * R * x.Fe * x.e + R * x.h * x.e);
  experts("experts.fc1", GemmPass::kFprop, R / G, x.Fe, x.h);
  Memory(l, "experts.activation", MemoryKernel::kActivation, R, x.Fe, 2 * R * x.Fe * x.e, false);
  experts("experts.fc2", GemmPass::kFprop, R / G, x.h, x.Fe);
  gather("combine.order", R);
  if (s.etp > 1) {  // the other ranks' partials of this rank's rows (runtime/moe.cc)
    Alloc(l, s, Rep * x.h * x.e * (s.etp - 1));
    Comm(l, s, "combine.reduce_scatter", CommKind::kReduceScatter, CommGroup::kEtp,
         R * x.h * x.e, CommOverlap::kBlocking, -1);
  }
  if (s.ep > 1) {
    Alloc(l, s, nk * x.h * x.e);
    Comm(l, s, "combine.all_to_all", CommKind::kAllToAll, CommGroup::kEp, nk * x.h * x.e,
         CommOverlap::kBlocking, -1);
  }
  gather("combine.gather", nk);
  Alloc(l, s, nk * x.h * x.e);
  Memory(l, "combine.weights", MemoryKernel::kCopy, nk, x.h, 2 * nk * x.h * x.e, false);
  AllocZeroed(l, s, x.Tl * x.h * x.e);  // the combine adds every token's k rows to it
  Memory(l, "combine.add", MemoryKernel::kEmbeddingBackward, nk, x.h, 2 * nk * x.h * x.e, false);
  if (x.Fs > 0) {
    Gemm(l, s, "shared.fc1", GemmPass::kFprop, x.T, x.Fs, x.h);
    Alloc(l, s, x.T * x.Fs * x.e);
    Memory(l, "shared.activation", MemoryKernel::kActivation, x.T, x.Fs, 2 * x.T * x.Fs * x.e,
           false);
    Gemm(l, s, "shared.fc2", GemmPass::kFprop, x.T, x.h, x.Fs);
    if (x.t > 1)
      Comm(l, s, s.sp ? "shared.reduce_scatter" : "shared.all_reduce",
           s.sp ? CommKind::kReduceScatter : CommKind::kAllReduce, CommGroup::kTp,
           x.T * x.h * x.e, CommOverlap::kBlocking, -1);
    Memory(l, "shared.add", MemoryKernel::kAdd, x.Tl, x.h, 3 * x.Tl * x.h * x.e, false);
  }
  Memory(l, "residual_add2", MemoryKernel::kAdd, x.Tl, x.h, 3 * x.Tl * x.h * x.e, !s.sp);
}

// Its backward (runtime/moe.cc MoeBackward), then the norm's.
void RuntimeMoeBackward(const OpShape& s, const Dims& x, LayerOpList* b) {
  const double nk = x.Tl * x.topk, Rep = nk * s.expert_load, R = Rep * s.etp, G = x.G;
  Alloc(b, s, x.Tl * x.h * x.e);
  Memory(b, "residual_grad.copy", MemoryKernel::kCopy, x.Tl, x.h, 2 * x.Tl * x.h * x.e, !s.sp);
  AllocZeroed(b, s, x.Tl * x.h * x.e);  // dx: every part adds to it
  if (x.Fs > 0) {
    if (s.sp)
      Comm(b, s, "shared.all_gather.backward", CommKind::kAllGather, CommGroup::kTp,
           x.T * x.h * x.e, CommOverlap::kBlocking, -1);
    Gemm(b, s, "shared.fc2.wgrad", GemmPass::kWgrad, x.h, x.Fs, x.T);
    Gemm(b, s, "shared.fc2.dgrad", GemmPass::kDgrad, x.T, x.Fs, x.h);
    Memory(b, "shared.activation.backward", MemoryKernel::kActivationBackward, x.T, x.Fs,
           3 * x.T * x.Fs * x.e, false);
    Gemm(b, s, "shared.fc1.wgrad", GemmPass::kWgrad, x.Fs, x.h, x.T);
    Gemm(b, s, "shared.fc1.dgrad", GemmPass::kDgrad, x.T, x.h, x.Fs);
    if (x.t > 1)
      Comm(b, s, s.sp ? "shared.reduce_scatter.backward" : "shared.all_reduce.backward",
           s.sp ? CommKind::kReduceScatter : CommKind::kAllReduce, CommGroup::kTp,
           x.T * x.h * x.e, CommOverlap::kBlocking, -1);
    Memory(b, "shared.add.backward", MemoryKernel::kAdd, x.Tl, x.h, 3 * x.Tl * x.h * x.e, false);
  }
  auto gather = [&](const char* name, double rows) { RuntimeRowGather(b, s, x, name, rows); };
  auto experts = [&](const char* name, GemmPass pass, double m, double n, double k) {
    RuntimeExpertGemms(b, x, name, pass, m, n, k);
  };
  gather("combine.gather.backward", nk);
  Alloc(b, s, nk * 4);
  Memory(b, "combine.weights.grad", MemoryKernel::kCopy, nk, x.h, nk * x.h * x.e * 2, false);
  Memory(b, "combine.weights.backward", MemoryKernel::kCopy, nk, x.h, 2 * nk * x.h * x.e, false);
  gather("dispatch.gather.backward", nk);
  if (s.ep > 1) {
    Alloc(b, s, Rep * x.h * x.e);
    Comm(b, s, "combine.all_to_all.backward", CommKind::kAllToAll, CommGroup::kEp,
         nk * x.h * x.e, CommOverlap::kBlocking, -1);
  }
  if (s.etp > 1) {
    Comm(b, s, "combine.all_gather.backward", CommKind::kAllGather, CommGroup::kEtp,
         R * x.h * x.e, CommOverlap::kBlocking, -1);
  }
  gather("experts.order.backward", R);
  Alloc(b, s, R * x.h * x.e);
  experts("experts.fc2.wgrad", GemmPass::kWgrad, x.h, x.Fe, R / G);
  Alloc(b, s, R / G * x.Fe * x.e);
  experts("experts.fc2.dgrad", GemmPass::kDgrad, R / G, x.Fe, x.h);
  Memory(b, "experts.activation.backward", MemoryKernel::kActivationBackward, R, x.Fe,
         3 * R * x.Fe * x.e, false);
  experts("experts.fc1.wgrad", GemmPass::kWgrad, x.Fe, x.h, R / G);
  experts("experts.fc1.dgrad", GemmPass::kDgrad, R / G, x.h, x.Fe);
  gather("dispatch.order.backward", R);
  if (s.etp > 1) {
    Alloc(b, s, Rep * x.h * x.e * (s.etp - 1));
    Comm(b, s, "dispatch.reduce_scatter.backward", CommKind::kReduceScatter, CommGroup::kEtp,
         R * x.h * x.e, CommOverlap::kBlocking, -1);
  }
  if (s.ep > 1) {
    Alloc(b, s, nk * x.h * x.e);
    Comm(b, s, "dispatch.all_to_all.backward", CommKind::kAllToAll, CommGroup::kEp,
         nk * x.h * x.e, CommOverlap::kBlocking, -1);
  }
  gather("dispatch.ungather.backward", nk);
  Memory(b, "dispatch.add.backward", MemoryKernel::kEmbeddingBackward, nk, x.h,
         2 * nk * x.h * x.e, false);
  Alloc(b, s, x.Tl * x.E * 4);
  Gemm(b, s, "router.wgrad", GemmPass::kWgrad, x.E, x.h, x.Tl);
  LayerOp& dg = b->Add(LayerOpKind::kGemm, "router.dgrad");  // adds to dx: no new tensor
  dg.pass = GemmPass::kDgrad;
  dg.m = x.Tl, dg.n = x.h, dg.k = x.E;
  dg.flops = 2 * x.Tl * x.h * x.E;
  Memory(b, "norm2.backward", MemoryKernel::kNormBackward, x.Tl, x.h, 4 * x.Tl * x.h * x.e,
         !s.sp);
}

// The MoE block (megatron/core/transformer/moe/moe_layer.py with the all-to-all token
// dispatcher, token_dispatcher.py; experts as TE GroupedLinear, experts.py TEGroupedMLP): norm,
// router GEMM and top-k, permutation, all-to-all over the EP group (each of this rank's Tl k
// assignments to the rank of its expert), all-gather over expert TP, the experts' FC1,
// activation and FC2 on the Tr assignments this rank computes, reduce-scatter over expert TP,
// the all-to-all back and the weighted un-permutation; the shared experts, a TP-parallel MLP on
// the same input, add to it.
// The MoE block (megatron/core/transformer/moe/moe_layer.py): norm, router, with LatentMoE
// fc1_latent_proj (h to L on this rank's tokens: the weights are replicated over TP), the
// permutation and the dispatch of the routed tokens at the latent width, the experts, the
// combine, and fc2_latent_proj back to h; the shared experts on the norm's output.
void MoeForward(const ModelSpec& M, const OpShape& s, const Dims& x, LayerOpList* l) {
  if (s.runtime) return RuntimeMoeForward(M, s, x, l);
  NormForward(s, x, "norm2", l);
  Gemm(l, s, "router", GemmPass::kFprop, x.Tl, x.E, x.h, /*fused=*/true);
  Memory(l, "router.topk", MemoryKernel::kRouter, x.Tl, x.E, 3 * x.Tl * x.E * 4, false);
  if (x.lat > 0) Gemm(l, s, "latent.fc1", GemmPass::kFprop, x.Tl, x.lat, x.h, /*fused=*/true);
  Memory(l, "permute", MemoryKernel::kPermute, x.Tl * x.topk, x.hm,
         (1 + x.topk) * x.Tl * x.hm * x.e, false);
  const double sent = x.Tl * x.topk * s.expert_load * x.hm * x.e;
  EpAllToAll(l, s, "dispatch.all_to_all", sent);
  if (s.etp > 1 && s.sp)
    Comm(l, s, "dispatch.all_gather", CommKind::kAllGather, CommGroup::kEtp, x.Tr * x.hm * x.e,
         CommOverlap::kBlocking, -1);
  GroupedGemm(l, s, x, "experts.fc1", GemmPass::kFprop, x.Tr, x.Fei, x.hm);
  Memory(l, "experts.activation", MemoryKernel::kActivation, x.Tr, x.Fe,
         (x.Fei + x.Fe) * x.Tr * x.e, false);
  GroupedGemm(l, s, x, "experts.fc2", GemmPass::kFprop, x.Tr, x.hm, x.Fe);
  EtpReduce(l, s, x, "combine.reduce_scatter", "combine.all_reduce");
  EpAllToAll(l, s, "combine.all_to_all", sent);
  Memory(l, "unpermute", MemoryKernel::kPermute, x.Tl * x.topk, x.hm,
         (1 + x.topk) * x.Tl * x.hm * x.e, false);
  if (x.lat > 0) Gemm(l, s, "latent.fc2", GemmPass::kFprop, x.Tl, x.h, x.lat);
  if (x.Fs > 0) {  // shared experts: a TP-split MLP of f_s on the norm's output
    int ag = -1;
    if (s.sp)
      ag = Comm(l, s, "shared.all_gather", CommKind::kAllGather, CommGroup::kTp, x.T * x.h * x.e,
                CommOverlap::kTpOverlap, -1, x.t);
    Gemm(l, s, "shared.fc1", GemmPass::kFprop, x.T, x.Fsi, x.h, /*fused=*/true);
    Overlaps(l, ag, Last(*l));
    Memory(l, "shared.activation", MemoryKernel::kActivation, x.T, x.Fs,
           (x.Fsi + x.Fs) * x.T * x.e, false);
    Gemm(l, s, "shared.fc2", GemmPass::kFprop, x.T, x.h, x.Fs, /*fused=*/true);
    if (x.t > 1)
      Comm(l, s, s.sp ? "shared.reduce_scatter" : "shared.all_reduce",
           s.sp ? CommKind::kReduceScatter : CommKind::kAllReduce, CommGroup::kTp,
           x.T * x.h * x.e, CommOverlap::kTpOverlap, Last(*l), kPipelineSplits);
  }
  Memory(l, "bias_dropout_add2", MemoryKernel::kBiasDropoutAdd, x.Tl, x.h, 3 * x.Tl * x.h * x.e,
         !s.sp);
}

void MoeBackward(const ModelSpec& M, const OpShape& s, const Dims& x, LayerOpList* b) {
  if (s.runtime) return RuntimeMoeBackward(s, x, b);
  BiasDropoutAddBackward(M, s, x, /*first=*/true, "bias_dropout_add2.backward", "", b);
  if (x.Fs > 0) {
    RowParallelBackward(s, x, "shared.fc2.all_gather.backward", "shared.fc2.dgrad",
                        "shared.fc2.wgrad", x.Fs, b);
    Memory(b, "shared.activation.backward", MemoryKernel::kActivationBackward, x.T, x.Fs,
           (2 * x.Fsi + x.Fs) * x.T * x.e, false);
    ColumnParallelBackward(s, x, "shared.fc1.input_all_gather",
                           s.sp ? "shared.fc1.reduce_scatter.backward"
                                : "shared.fc1.all_reduce.backward",
                           "shared.fc1.dgrad", "shared.fc1.wgrad", nullptr, x.Fsi, b);
  }
  if (x.lat > 0) {
    Gemm(b, s, "latent.fc2.dgrad", GemmPass::kDgrad, x.Tl, x.lat, x.h);
    Gemm(b, s, "latent.fc2.wgrad", GemmPass::kWgrad, x.h, x.lat, x.Tl);
  }
  const double sent = x.Tl * x.topk * s.expert_load * x.hm * x.e;
  Memory(b, "unpermute.backward", MemoryKernel::kPermuteBackward, x.Tl * x.topk, x.hm,
         (1 + x.topk) * x.Tl * x.hm * x.e, false);
  EpAllToAll(b, s, "combine.all_to_all.backward", sent);
  if (s.etp > 1 && s.sp)
    Comm(b, s, "combine.all_gather.backward", CommKind::kAllGather, CommGroup::kEtp,
         x.Tr * x.hm * x.e, CommOverlap::kBlocking, -1);
  GroupedGemm(b, s, x, "experts.fc2.dgrad", GemmPass::kDgrad, x.Tr, x.Fe, x.hm);
  GroupedGemm(b, s, x, "experts.fc2.wgrad", GemmPass::kWgrad, x.hm, x.Fe, x.Tr);
  Memory(b, "experts.activation.backward", MemoryKernel::kActivationBackward, x.Tr, x.Fe,
         (2 * x.Fei + x.Fe) * x.Tr * x.e, false);
  GroupedGemm(b, s, x, "experts.fc1.dgrad", GemmPass::kDgrad, x.Tr, x.hm, x.Fei);
  GroupedGemm(b, s, x, "experts.fc1.wgrad", GemmPass::kWgrad, x.Fei, x.hm, x.Tr);
  EtpReduce(b, s, x, "dispatch.reduce_scatter.backward", "dispatch.all_reduce.backward");
  EpAllToAll(b, s, "dispatch.all_to_all.backward", sent);
  Memory(b, "permute.backward", MemoryKernel::kPermuteBackward, x.Tl * x.topk, x.hm,
         (1 + x.topk) * x.Tl * x.hm * x.e, false);
  if (x.lat > 0) {
    Gemm(b, s, "latent.fc1.dgrad", GemmPass::kDgrad, x.Tl, x.h, x.lat);
    Gemm(b, s, "latent.fc1.wgrad", GemmPass::kWgrad, x.lat, x.h, x.Tl);
  }
  Memory(b, "router.backward", MemoryKernel::kRouterBackward, x.Tl, x.E, 3 * x.Tl * x.E * 4,
         false);
  Gemm(b, s, "router.dgrad", GemmPass::kDgrad, x.Tl, x.h, x.E);
  Gemm(b, s, "router.wgrad", GemmPass::kWgrad, x.E, x.h, x.Tl);
  Memory(b, "norm2.backward", MemoryKernel::kNormBackward, x.Tl, x.h, 4 * x.Tl * x.h * x.e,
         !s.sp);
}

// The dense MLP block's backward: bias-dropout-add, FC2 (the runtime: GeLU's gradient in its
// dgrad), the activation, FC1, norm2.
void MlpBackward(const ModelSpec& M, const OpShape& s, const Dims& x, LayerOpList* b) {
  BiasDropoutAddBackward(M, s, x, /*first=*/true, "bias_dropout_add2.backward", "fc2.bias.grad",
                         b);
  LayerOp& fc2_dgrad =
      RowParallelBackward(s, x, "fc2.all_gather.backward", "fc2.dgrad", "fc2.wgrad", x.F, b);
  // The runtime runs GeLU's gradient in FC2's dgrad (MatmulGeluBackward).
  if (s.runtime)
    fc2_dgrad.epilogue = GemmEpilogue::kGeluBackward;
  else
    Memory(b, "activation.backward", MemoryKernel::kActivationBackward, x.T, x.F,
           (2 * x.Fi + x.F) * x.T * x.e, false);
  ColumnParallelBackward(s, x, "fc1.input_all_gather", s.sp ? "fc1.reduce_scatter.backward"
                                                            : "fc1.all_reduce.backward",
                         "fc1.dgrad", "fc1.wgrad", M.bias ? "fc1.bias.grad" : nullptr, x.Fi, b);
  Memory(b, "norm2.backward", MemoryKernel::kNormBackward, x.Tl, x.h, 4 * x.Tl * x.h * x.e, !s.sp);
}

// The attention block's backward: bias-dropout-add, the projection, the attention core,
// rotary, QKV (or MLA's projections), norm1.
void AttentionBackward(const ModelSpec& M, const OpShape& s, const Dims& x, LayerOpList* b) {
  BiasDropoutAddBackward(M, s, x, /*first=*/false, "bias_dropout_add1.backward",
                         "proj.bias.grad", b);
  RowParallelBackward(s, x, "proj.all_gather.backward", "proj.dgrad", "proj.wgrad", x.A, b);
  AttentionCore(s, x, /*backward=*/true, "attention.backward", b);
  if (M.position == PositionEmbedding::kRope)
    Memory(b, "rotary.backward", MemoryKernel::kRotaryBackward, x.T, x.rot,
           2 * x.T * x.rot * x.e, false);
  if (M.mla()) {
    MlaBackward(M, s, x, b);
  } else {
    ColumnParallelBackward(s, x, "qkv.input_all_gather", s.sp ? "qkv.reduce_scatter.backward"
                                                              : "qkv.all_reduce.backward",
                           "qkv.dgrad", "qkv.wgrad", M.bias ? "qkv.bias.grad" : nullptr, x.Q,
                           b);
  }
  Memory(b, "norm1.backward", MemoryKernel::kNormBackward, x.Tl, x.h, 4 * x.Tl * x.h * x.e, !s.sp);
}

// The Mamba-2 mixer (megatron/core/ssm/mamba_mixer.py, training's memory-efficient path):
// norm and in_proj (column-parallel: z, x, B, C, dt), with CP the all-to-all that trades the
// sequence split for a head split (mamba_context_parallel.py pre_conv_ssm: each rank then scans
// the whole sequence for heads/(t c) heads), the fused conv1d + SSD chunked scan + gated
// RMSNorm (mamba_ssm's mamba_split_conv1d_scan_combined, Triton), the all-to-all back, out_proj
// (row-parallel) and the residual add. The scan: per token and head 2QP (the intra-chunk
// (L o C B^T) X) + 4NP (chunk states B^T X and the inter-chunk C h), per group 2QN (C B^T),
// the conv's 2 x 4 taps per channel (Mamba-2 paper, Dao & Gu 2024, sec. 6 "SSD algorithm");
// its bytes: the conv's input read twice and output once, dt, y written, the gated norm's
// y, z and output, and the fp32 chunk states (written, passed, read: 12 NP/Q per token and
// head) and the C B^T blocks (8 Q per token and group).
void MambaForward(const ModelSpec& M, const OpShape& s, const Dims& x, LayerOpList* l) {
  NormColumnForward(s, x, "norm", "in_proj.all_gather", "in_proj", /*bias=*/false, x.min, l);
  if (s.cp > 1)
    Comm(l, s, "mamba.cp_all_to_all", CommKind::kAllToAll, CommGroup::kCp, x.T * x.min * x.e,
         CommOverlap::kBlocking, -1);
  LayerOp& scan = Memory(l, "ssm_scan", MemoryKernel::kSsmScan, x.T, x.mi, x.T * x.mscan_bytes,
                         false);
  scan.flops = x.T * x.mscan_flops;
  scan.kernels = 7;  // conv1d, chunk cumsum, chunk state, state passing, C B^T, chunk scan, norm
  if (s.cp > 1)
    Comm(l, s, "mamba.cp_all_to_all.out", CommKind::kAllToAll, CommGroup::kCp, x.T * x.mi * x.e,
         CommOverlap::kBlocking, -1);
  Gemm(l, s, "out_proj", GemmPass::kFprop, x.T, x.h, x.mi, /*fused=*/true);
  RowReduceAndAdd(M, s, x, "out_proj.all_reduce", "out_proj.reduce_scatter",
                  "residual_add", "residual_add", /*into_norm=*/false, l);
}

// Its backward: the residual, out_proj, the scan's backward (twice the forward's FLOPs; it
// reruns the conv, reads what the forward read and writes the in_proj output's gradient), the
// all-to-alls, in_proj, the norm.
void MambaBackward(const ModelSpec& M, const OpShape& s, const Dims& x, LayerOpList* b) {
  BiasDropoutAddBackward(M, s, x, /*first=*/true, "residual_add.backward", nullptr, b);
  RowParallelBackward(s, x, "out_proj.all_gather.backward", "out_proj.dgrad", "out_proj.wgrad",
                      x.mi, b);
  if (s.cp > 1)
    Comm(b, s, "mamba.cp_all_to_all.backward", CommKind::kAllToAll, CommGroup::kCp,
         x.T * x.mi * x.e, CommOverlap::kBlocking, -1);
  LayerOp& scan = Memory(b, "ssm_scan.backward", MemoryKernel::kSsmScanBackward, x.T, x.mi,
                         x.T * (2 * x.mscan_bytes + x.min * x.e), false);
  scan.flops = 2 * x.T * x.mscan_flops;
  scan.kernels = 12;
  if (s.cp > 1)
    Comm(b, s, "mamba.cp_all_to_all.out.backward", CommKind::kAllToAll, CommGroup::kCp,
         x.T * x.min * x.e, CommOverlap::kBlocking, -1);
  ColumnParallelBackward(s, x, "in_proj.input_all_gather", s.sp ? "in_proj.reduce_scatter.backward"
                                                                : "in_proj.all_reduce.backward",
                         "in_proj.dgrad", "in_proj.wgrad", nullptr, x.min, b);
  Memory(b, "norm.backward", MemoryKernel::kNormBackward, x.Tl, x.h, 4 * x.Tl * x.h * x.e, !s.sp);
}

// Whether a forward op belongs to a module --recompute-modules reruns (by the op's kind and
// the names the builders above give: core_attn the attention core, layernorm the layers'
// norms, mla_up_proj MLA's q and kv up projections, mlp the dense MLP's FC1, activation and FC2
// with their collectives, moe the MoE block from the router to the combine (LatentMoE's
// projections with it) and its shared experts, moe_act the routed experts' activation,
// shared_experts the shared experts' MLP).
bool InRecomputeModules(const LayerOp& op, uint8_t modules) {
  const std::string_view n = op.name ? op.name : "";
  auto starts = [&n](std::string_view p) { return n.substr(0, p.size()) == p; };
  if ((modules & kRecomputeCoreAttn) &&
      (op.kind == LayerOpKind::kAttention ||
       (op.kind == LayerOpKind::kMemory && op.kernel == MemoryKernel::kSoftmax)))
    return true;
  if ((modules & kRecomputeLayernorm) && op.kind == LayerOpKind::kMemory &&
      op.kernel == MemoryKernel::kNorm && starts("norm"))
    return true;
  if ((modules & kRecomputeMlaUpProj) && (n == "q_up" || n == "kv_up")) return true;
  if ((modules & kRecomputeMlp) && (starts("fc1") || starts("fc2") || n == "activation"))
    return true;
  if ((modules & kRecomputeMoe) &&
      (starts("router") || starts("latent.") || starts("permute") || starts("dispatch.") ||
       starts("experts.") || starts("combine.") || starts("unpermute") || starts("shared.")))
    return true;
  if ((modules & kRecomputeMoeAct) && n == "experts.activation") return true;
  if ((modules & kRecomputeSharedExperts) && starts("shared.")) return true;
  return false;
}

}  // namespace

void BuildLayerOps(const ModelSpec& M, const OpShape& s, LayerOps* out, bool moe) {
  BuildLayerOps(M, s, out, moe && M.moe() ? LayerKind::kMoe : LayerKind::kDense);
}

void BuildLayerOps(const ModelSpec& M, const OpShape& s, LayerOps* out, LayerKind kind) {
  const Dims x = DimsOf(M, s);
  out->forward.size = out->backward.size = out->recompute.size = 0;
  const bool attention = HasAttention(kind), mamba = kind == LayerKind::kMamba;
  const bool moe = HasMoe(kind) && M.moe();
  const bool mlp = kind == LayerKind::kDense || kind == LayerKind::kMlp;
  auto forward = [&](LayerOpList* l) {
    if (attention) AttentionForward(M, s, x, l);
    if (mamba) MambaForward(M, s, x, l);
    if (moe) MoeForward(M, s, x, l);
    if (mlp) MlpForward(M, s, x, l);
  };
  forward(&out->forward);

  if (s.recompute == Recompute::kFull) {
    forward(&out->recompute);
  } else if (s.recompute == Recompute::kSelective && s.runtime) {
    // The runtime reruns its attention core, allocations and CP ring included.
    if (attention) AttentionCore(s, x, /*backward=*/false, "attention.recompute", &out->recompute);
  } else if (s.recompute == Recompute::kSelective) {
    // Megatron's selective recompute reruns the modules --recompute-modules names (default the
    // core attention, Korthikanti 2022 sec. 5) from their kept inputs, in forward order; a
    // collective overlapping an op that is not rerun becomes blocking.
    const LayerOpList& f = out->forward;
    LayerOpList& r = out->recompute;
    std::array<int, LayerOpList::kMax> at;
    for (int i = 0; i < f.size; ++i)
      at[size_t(i)] = InRecomputeModules(f[i], s.recompute_modules) ? r.size++ : -1;
    r.size = 0;
    for (int i = 0; i < f.size; ++i) {
      if (at[size_t(i)] < 0) continue;
      const LayerOp& op = f[i];
      LayerOp& c = r.Add(op.kind, op.name);
      c = op;
      if (op.kind == LayerOpKind::kAttention) c.name = "attention.recompute";
      if (op.kind == LayerOpKind::kMemory && op.kernel == MemoryKernel::kSoftmax)
        c.name = "softmax.recompute";
      if (op.kind == LayerOpKind::kComm && op.with >= 0) {
        c.with = at[size_t(op.with)];
        if (c.with < 0) c.overlap = CommOverlap::kBlocking;
      }
    }
  }

  LayerOpList& b = out->backward;
  // The blocks in reverse: the MLP (dense or MoE), then attention (or the Mamba mixer).
  if (moe) MoeBackward(M, s, x, &b);
  if (mlp) MlpBackward(M, s, x, &b);
  if (attention) AttentionBackward(M, s, x, &b);
  if (mamba) MambaBackward(M, s, x, &b);
}

void BuildEmbeddingOps(const ModelSpec& M, const OpShape& s, LayerOpList* fwd, LayerOpList* bwd) {
  const Dims x = DimsOf(M, s);
  fwd->size = bwd->size = 0;
  // Vocab-parallel lookup (each rank its rows, zeros elsewhere), then the TP all-reduce that
  // sums them (SP: reduce-scatter along s), positions and dropout. The runtime allocates the
  // (sequence-first) ids and the lookup, and adds the positions after the reduction.
  Alloc(fwd, s, x.T * 4);
  Alloc(fwd, s, x.T * x.h * x.e);
  Memory(fwd, "embedding", MemoryKernel::kEmbedding, x.T, x.h, 2 * x.T * x.h * x.e, false);
  if (x.t > 1)
    Comm(fwd, s, s.sp ? "embedding.reduce_scatter" : "embedding.all_reduce",
         s.sp ? CommKind::kReduceScatter : CommKind::kAllReduce, CommGroup::kTp,
         x.T * x.h * x.e, CommOverlap::kBlocking, -1);
  if (s.runtime) {
    Alloc(fwd, s, x.Tl * x.h * x.e);
    Memory(fwd, "embedding.position", MemoryKernel::kEmbedding, x.Tl, x.h, 2 * x.Tl * x.h * x.e,
           !s.sp);
    Memory(fwd, "embedding.add", MemoryKernel::kAdd, x.Tl, x.h, 3 * x.Tl * x.h * x.e, !s.sp);
    Memory(bwd, "embedding.position.backward", MemoryKernel::kEmbeddingBackward, x.Tl, x.h,
           2 * x.Tl * x.h * x.e, !s.sp);
  } else {
    Memory(fwd, "embedding.dropout", MemoryKernel::kBiasDropoutAdd, x.Tl, x.h,
           2 * x.Tl * x.h * x.e, !s.sp);
  }
  if (s.sp)
    Comm(bwd, s, "embedding.all_gather.backward", CommKind::kAllGather, CommGroup::kTp,
         x.T * x.h * x.e, CommOverlap::kBlocking, -1);
  Memory(bwd, "embedding.backward", MemoryKernel::kEmbeddingBackward, x.T, x.h,
         4 * x.T * x.h * x.e, false);
}

void BuildOutputOps(const ModelSpec& M, const OpShape& layer_shape, LayerOpList* fwd,
                    LayerOpList* bwd) {
  // The output layer is not quantized under fp8 or fp4 (LayerOp::quantized): no casts, bf16
  // GEMMs.
  OpShape s = layer_shape;
  s.fp8 = false;
  const Dims x = DimsOf(M, s);
  fwd->size = bwd->size = 0;
  const double Vl = double(M.padded_vocab(s.tp)) / s.tp;
  NormForward(s, x, "final_norm", fwd);
  if (s.sp)
    Comm(fwd, s, "output.all_gather", CommKind::kAllGather, CommGroup::kTp, x.T * x.h * x.e,
         CommOverlap::kBlocking, -1);
  LayerOp& logits = Gemm(fwd, s, "logits", GemmPass::kFprop, x.T, Vl, x.h, /*fused=*/true);
  // The runtime masks the padded vocabulary rows with a bias of -1e30, the GEMM's (MatmulBias).
  if (s.runtime) logits.epilogue = GemmEpilogue::kBias;
  // Vocab-parallel cross entropy on fp32 logits: max, exp-sum and target logit, each with a
  // small TP all-reduce (megatron/core/tensor_parallel/cross_entropy.py). The runtime keeps six
  // (T) vectors (targets, row max, sum, target logit, loss and its gradient scale) and sums the
  // micro-batch's loss.
  for (int i = 0; i < 6; ++i) Alloc(fwd, s, x.T * 4);
  if (!s.runtime && s.cross_entropy == CrossEntropyFusion::kTe) {
    // Transformer Engine's parallel_cross_entropy (Triton): an online-softmax pass over the
    // 16-bit logits, the (max, sum) pairs gathered over TP, then a pass that writes the
    // gradient over the logits; the backward scales it in place (element_mul).
    LayerOp& ce = Memory(fwd, "cross_entropy", MemoryKernel::kCrossEntropy, x.T, Vl,
                         3.0 * x.T * Vl * x.e, false);
    ce.kernels = 2;
    if (x.t > 1)
      Comm(fwd, s, "cross_entropy.stats", CommKind::kAllGather, CommGroup::kTp, x.T * 8.0 * x.t,
           CommOverlap::kBlocking, -1);
    Memory(bwd, "cross_entropy.backward", MemoryKernel::kCrossEntropyBackward, x.T, Vl,
           2.0 * x.T * Vl * x.e, false);
  } else {
    // Megatron's on an fp32 copy: separate ops (kernels 4, three TP all-reduces) or jit-fused
    // (--cross-entropy-fusion-impl native: two kernels, the sum and target logit reduced
    // together).
    const bool fused = !s.runtime && s.cross_entropy == CrossEntropyFusion::kNative;
    LayerOp& ce = Memory(fwd, "cross_entropy", MemoryKernel::kCrossEntropy, x.T, Vl,
                         2.5 * x.T * Vl * 4, false);
    ce.kernels = fused ? 2 : 4;
    if (s.runtime) Memory(fwd, "loss.sum", MemoryKernel::kLossSum, x.T, 1, x.T * 4, false);
    if (x.t > 1) {
      if (fused) {
        Comm(fwd, s, "cross_entropy.max", CommKind::kAllReduce, CommGroup::kTp, x.T * 4.0,
             CommOverlap::kBlocking, -1);
        Comm(fwd, s, "cross_entropy.sum_target", CommKind::kAllReduce, CommGroup::kTp,
             x.T * 8.0, CommOverlap::kBlocking, -1);
      } else {
        for (const char* n : {"cross_entropy.max", "cross_entropy.sum", "cross_entropy.target"})
          Comm(fwd, s, n, CommKind::kAllReduce, CommGroup::kTp, x.T * (s.runtime ? x.e : 4.0),
               CommOverlap::kBlocking, -1);
      }
    }
    Memory(bwd, "cross_entropy.backward", MemoryKernel::kCrossEntropyBackward, x.T, Vl,
           2.0 * x.T * Vl * 4, false);
  }
  ColumnParallelBackward(s, x, "output.input_all_gather",
                         s.sp ? "output.reduce_scatter.backward" : "output.all_reduce.backward",
                         "logits.dgrad", "logits.wgrad", nullptr, Vl, bwd);
  AllocZeroed(bwd, s, x.Tl * x.h * x.e);  // the norm's backward adds to it
  Memory(bwd, "final_norm.backward", MemoryKernel::kNormBackward, x.Tl, x.h,
         4 * x.Tl * x.h * x.e, !s.sp);
}

void BuildStageInputOps(const ModelSpec& M, const OpShape& s, LayerOpList* fwd, LayerOpList* bwd) {
  const Dims x = DimsOf(M, s);
  fwd->size = bwd->size = 0;
  if (!s.runtime) return;
  Alloc(fwd, s, x.Tl * x.h * x.e);
  Memory(fwd, "input.copy", MemoryKernel::kCopy, x.Tl, x.h, 2 * x.Tl * x.h * x.e, !s.sp);
}

const char* ToString(LayerOpKind k) {
  switch (k) {
    case LayerOpKind::kGemm: return "gemm";
    case LayerOpKind::kAttention: return "attention";
    case LayerOpKind::kMemory: return "memory";
    case LayerOpKind::kComm: return "comm";
  }
  return "?";
}

const char* ToString(CommKind k) {
  switch (k) {
    case CommKind::kAllReduce: return "all_reduce";
    case CommKind::kAllGather: return "all_gather";
    case CommKind::kReduceScatter: return "reduce_scatter";
    case CommKind::kAllToAll: return "all_to_all";
    case CommKind::kSendRecv: return "send_recv";
  }
  return "?";
}

}  // namespace ptdp
