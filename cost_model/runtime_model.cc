// The runtime's cost model over measured primitives; see runtime_model.h. Each function lists
// the runtime's ops in the order runtime/gpt.cc and runtime/trainer.cc issue them.
#include "cost_model/runtime_model.h"

#include <algorithm>
#include <cassert>
#include <cmath>

namespace ptdp {
namespace {

// A tensor's place in its chunk's buffers (GptChunk::BufferOrder): replicated, other dense,
// routed experts; the weight-decayed ones first within each.
int BufferOrder(const RuntimeTensor& t) {
  return 2 * (t.expert ? 2 : t.replicated ? 0 : 1) + (t.decay ? 0 : 1);
}

// Bytes of the runtime's fp32 statistics (LayerNorm mean / rstd, attention lse or P, cross
// entropy's row figures), i32 ids and fp32 accumulators, whatever the activations' dtype.
constexpr double kStatBytes = 4;

// The sizes of one micro-batch of a layout (letters as in the header).
// s: the rows of the sequence a CP rank holds (S/c); S the whole sequence.
struct Dims {
  double b, S, s, h, T, Tl, A, Q, F, Fi, Vl, nh, hd;
  int t, c;
  bool sp;
};

Dims DimsOf(const ModelSpec& M, const Layout& l) {
  Dims x;
  x.t = l.tp;
  x.sp = l.sequence_parallel && l.tp > 1;
  const double t = l.tp;
  x.b = l.micro_batch;
  x.c = l.cp;
  x.S = double(M.seq_len);
  x.s = x.S / l.cp;
  x.h = double(M.hidden);
  x.T = x.b * x.s;
  x.Tl = x.sp ? x.T / t : x.T;
  x.hd = double(M.head_dim());
  x.A = x.h / t;
  const double kv_local = std::max(1.0, double(M.kv_heads) / t);
  x.Q = x.A + 2 * kv_local * x.hd;
  x.F = double(M.ffn_hidden) / t;
  x.Fi = M.activation == Activation::kSwiglu ? 2 * x.F : x.F;
  x.Vl = double(M.padded_vocab(l.tp)) / t;
  x.nh = double(M.heads) / t;
  return x;
}

}  // namespace

RuntimeModel::RuntimeModel(const ModelSpec& model, const MeasuredPrimitives& m, int gpus_per_node)
    : model_(model), m_(m), gpus_per_node_(gpus_per_node) {}

Layout RuntimeModel::Executed(const Layout& l) const {
  Layout x = l;
  // Buckets (dist-opt: each parameter's reduce-scatter) beside the backward
  // (runtime/grad_reducer.h) where its communicators run beside compute
  // (CommunicatorFactory::CollectivesBesideCompute: NCCL; ThreadWorld when 2 threads a rank fit
  // the cores; not DeviceWorld); with the distributed optimizer there, the all-gather of the
  // updated slices beside the next forward (--overlap-param-gather; else after AdamW:
  // ChunkDpGather).
  bool beside = m_.communicator != "device";
  if (m_.communicator == "threads" || (m_.communicator.empty() && m_.backend == "cpu"))
    beside = 2 * int64_t(l.world()) <= int64_t(m_.cores);
  x.overlap_grad_reduce = l.overlap_grad_reduce && beside;
  x.tp_comm_overlap = false;
  x.shard_gradients = false;  // the runtime's distributed optimizer shards the optimizer only
  x.shard_params = false;
  x.cpu_offload_layers = 0;
  x.moe_a2a_overlap = false;  // its MoE exchanges block, with the all-to-all dispatcher
  x.moe_flex_dispatcher = false;
  // Its AdamW keeps fp32 moments and masters (runtime/params.h).
  x.optimizer_state = {};
  if (m_.element_bytes == 4) {  // an fp32 runtime: nothing in bf16 (TrainerConfig::bf16 off)
    x.precision = Precision::kFp32;
    x.grad_reduce_in_bf16 = false;
  }
  return x;
}

// More ranks than cores take turns; the cores that compute at once each run slower than one
// alone (calibrate's busy_cores_slowdown: on the 2-core dev VM 1.0-1.3x over an hour, which
// put every 2-rank layout 14-27% above a prediction at one core's speed while 1x1x1 was on it).
double RuntimeModel::Slowdown(const Layout& l) const {
  const double ranks = std::min(l.world(), gpus_per_node_);
  return std::max(1.0, ranks / std::max(1, m_.cores)) * m_.BusyCoresFactor(ranks);
}

double RuntimeModel::Gemm(const char* table, double m, double n, double k, double slow) const {
  return m_.Table(table)->Seconds(m, n, k) * slow;
}

double RuntimeModel::Op(const char* table, double a, double slow) const {
  return m_.Table(table)->Seconds(std::max(a, 1.0)) * slow;
}

double RuntimeModel::Op(const char* table, double a, double b, double slow) const {
  return m_.Table(table)->Seconds(std::max(a, 1.0), std::max(b, 1.0)) * slow;
}

double RuntimeModel::Alloc(double bytes, double slow) const { return Op("alloc", bytes, slow); }

// fc1's outputs on a freshly initialised layer: LayerNorm outputs (unit variance) times weights
// drawn N(0, 0.02^2) (GPT-2 and Megatron's init, runtime/params.cc), summed over h inputs.
double RuntimeModel::GeluSigma() const { return 0.02 * std::sqrt(double(model_.hidden)); }

double RuntimeModel::Gelu(const char* table, double elements, double slow) const {
  return m_.Table(table)->Seconds(std::max(elements, 1.0), GeluSigma()) * slow;
}

// Collectives were measured with the group's ranks as the only busy threads; when more of the
// layout's ranks share the cores, they take turns.
double RuntimeModel::Coll(const char* table, int ranks, double bytes, const Layout& l) const {
  if (ranks <= 1) return 0;
  const double busy = std::min(l.world(), gpus_per_node_);
  const double share = std::max(1.0, busy / std::max(ranks, m_.cores));
  const MeasuredTable& t = *m_.Table(table);
  const double s = t.dims() == 1 ? t.Seconds(std::max(bytes, 1.0))
                                 : t.Seconds(double(ranks), std::max(bytes, 1.0));
  return s * share;
}

OpShape RuntimeModel::Shape(const Layout& l) const {
  OpShape s = ShapeOf(Executed(l), /*score_bytes=*/0);
  if (model_.moe()) {  // the mean load (AnalyticModel sets the slowest rank's)
    s.ep = l.ep;
    s.etp = l.expert_tp();
    s.expert_load = 1;
  }
  s.act_bytes = m_.element_bytes;
  s.runtime = true;
  s.fp8 = false;
  s.saved_per_score = m_.attention_saved_per_score;
  s.saved_per_token = m_.attention_saved_per_token;
  return s;
}

// One op by its measured table: GEMMs by pass (fprop x W^T: gemm_nt, dgrad: gemm_nn, wgrad:
// gemm_tn), the attention per (micro-batch x head), memory-bound kernels by their tensor's
// rows x columns or elements, collectives over their group.
double RuntimeModel::TimeOp(const Layout& l, const LayerOp& op) const {
  return op.repeat * TimeOnce(l, op);
}

double RuntimeModel::TimeOnce(const Layout& l, const LayerOp& op) const {
  const double k = Slowdown(l);
  const bool fwd = op.pass == GemmPass::kFprop;
  switch (op.kind) {
    case LayerOpKind::kGemm: {
      if (op.epilogue != GemmEpilogue::kNone) return EpilogueGemm(op, k);
      const char* table = op.pass == GemmPass::kFprop   ? "gemm_nt"
                          : op.pass == GemmPass::kDgrad ? "gemm_nn"
                                                        : "gemm_tn";
      return Gemm(table, op.m, op.n, op.k, k);
    }
    case LayerOpKind::kAttention: {
      const char* table =
          op.cp_block == 1 ? (fwd ? "attention_block_diagonal_forward"
                                  : "attention_block_diagonal_backward")
          : op.cp_block == 2 ? (fwd ? "attention_block_forward" : "attention_block_backward")
                             : (fwd ? "attention_forward" : "attention_backward");
      return op.m * Op(table, op.k, op.head_dim, k);
    }
    case LayerOpKind::kComm: {
      const char* table = op.comm == CommKind::kAllReduce   ? "all_reduce"
                          : op.comm == CommKind::kAllGather ? "all_gather"
                          : op.comm == CommKind::kSendRecv  ? "ring_exchange"
                          : op.comm == CommKind::kAllToAll  ? "all_to_all"
                                                            : "reduce_scatter";
      const int ranks = op.group == CommGroup::kTp     ? l.tp
                        : op.group == CommGroup::kCp   ? l.cp
                        : op.group == CommGroup::kEp   ? l.ep
                        : op.group == CommGroup::kEtp  ? l.expert_tp()
                                                       : l.tp * l.cp;
      return Coll(table, ranks, op.bytes, l);
    }
    case LayerOpKind::kMemory:
      return MemoryOp(op, k);
  }
  return 0;
}

void RuntimeModel::TimeOps(const Layout& l, const LayerOpList& ops, double* compute,
                           double* tp) const {
  for (const LayerOp& op : ops) *(op.kind == LayerOpKind::kComm ? tp : compute) += TimeOp(l, op);
}

// A linear layer's forward with its bias (and GeLU) in the call (Backend::MatmulBias,
// MatmulBiasGelu), or FC2's dgrad through GeLU's gradient (MatmulGeluBackward): where the
// backend fuses them into the GEMM (CUDA's cuBLASLt epilogues) the calibration timed the fused
// call over the GEMM grid; elsewhere (the CPU backend runs the GEMM, then the bias, then the
// GeLU or its gradient) it is their sum.
double RuntimeModel::EpilogueGemm(const LayerOp& op, double k) const {
  if (op.epilogue == GemmEpilogue::kGeluBackward) {
    if (const MeasuredTable* t = m_.Table("gemm_nn_dgelu"))
      return t->Seconds(op.m, op.n, op.k) * k;
    return Gemm("gemm_nn", op.m, op.n, op.k, k) + Gelu("gelu_backward", op.m * op.n, k);
  }
  const bool gelu = op.epilogue == GemmEpilogue::kBiasGelu;
  if (const MeasuredTable* t = m_.Table(gelu ? "gemm_nt_bias_gelu" : "gemm_nt_bias"))
    return t->Seconds(op.m, op.n, op.k) * k;
  return Gemm("gemm_nt", op.m, op.n, op.k, k) + Op("bias_add", op.m, op.n, k) +
         (gelu ? Gelu("gelu_forward", op.m * op.n, k) : 0.0);
}

// The residual kernels: the bias and the residual added in one (AddBiasResidual), then the next
// LayerNorm (AddBiasResidualLayerNorm); from a calibration that predates their tables, as the
// separate kernels.
double RuntimeModel::BiasResidual(const LayerOp& op, bool norm, double k) const {
  if (norm) {
    if (const MeasuredTable* t = m_.Table("bias_residual_layernorm"))
      return t->Seconds(std::max(op.m, 1.0), std::max(op.n, 1.0)) * k;
  }
  const double add = m_.Table("bias_residual")
                         ? Op("bias_residual", op.m, op.n, k)
                         : Op("bias_add", op.m, op.n, k) + Op("add", op.m * op.n, k);
  return add + (norm ? Op("layernorm_forward", op.m, op.n, k) : 0.0);
}

double RuntimeModel::MemoryOp(const LayerOp& op, double k) const {
  switch (op.kernel) {
    case MemoryKernel::kAlloc: return Alloc(op.bytes, k);
    case MemoryKernel::kNorm: return Op("layernorm_forward", op.m, op.n, k);
    case MemoryKernel::kNormBackward: return Op("layernorm_backward", op.m, op.n, k);
    case MemoryKernel::kActivation: return Gelu("gelu_forward", op.m * op.n, k);
    case MemoryKernel::kActivationBackward: return Gelu("gelu_backward", op.m * op.n, k);
    case MemoryKernel::kBiasAdd: return Op("bias_add", op.m, op.n, k);
    case MemoryKernel::kBiasResidual: return BiasResidual(op, /*norm=*/false, k);
    case MemoryKernel::kBiasResidualNorm: return BiasResidual(op, /*norm=*/true, k);
    case MemoryKernel::kBiasGrad: return Op("bias_grad", op.m, op.n, k);
    case MemoryKernel::kAdd: return Op("add", op.m * op.n, k);
    case MemoryKernel::kCopy: return Op("copy", op.m * op.n, k);
    case MemoryKernel::kEmbedding: return Op("embedding_forward", op.m, op.n, k);
    case MemoryKernel::kEmbeddingBackward: return Op("embedding_backward", op.m, op.n, k);
    case MemoryKernel::kCrossEntropy: return Op("cross_entropy_forward", op.m, op.n, k);
    case MemoryKernel::kCrossEntropyBackward: return Op("cross_entropy_backward", op.m, op.n, k);
    case MemoryKernel::kLossSum: return Op("sum_squares", op.m, k);
    case MemoryKernel::kFill: return Op("fill", op.m * op.n, k);
    // Megatron-Core's fused kernels: never in a runtime list (Shape() sets runtime, and
    // AnalyticModel::Create refuses a model that is not GPT-shaped, CheckGptShaped).
    case MemoryKernel::kNone: case MemoryKernel::kRotary: case MemoryKernel::kRotaryBackward:
    case MemoryKernel::kBiasDropoutAdd: case MemoryKernel::kBiasDropoutAddBackward:
    case MemoryKernel::kSoftmax: case MemoryKernel::kSoftmaxBackward:
    case MemoryKernel::kFp8Cast:
    case MemoryKernel::kRouter: case MemoryKernel::kRouterBackward:
    case MemoryKernel::kPermute: case MemoryKernel::kPermuteBackward:
    case MemoryKernel::kSsmScan: case MemoryKernel::kSsmScanBackward:
      break;
  }
  assert(false && "a Megatron-only kernel in a runtime op list");
  return 0;
}

RuntimeLayerTimes RuntimeModel::Layer(const Layout& l) const {
  LayerOps ops;
  BuildLayerOps(model_, Shape(l), &ops);
  RuntimeLayerTimes lt;
  TimeOps(l, ops.forward, &lt.fwd_compute_s, &lt.fwd_tp_s);
  TimeOps(l, ops.backward, &lt.bwd_compute_s, &lt.bwd_tp_s);
  return lt;
}

RuntimeLayerTimes RuntimeModel::ChunkExtras(const Layout& l, bool embedding, bool output) const {
  const OpShape s = Shape(l);
  RuntimeLayerTimes r;
  LayerOpList fwd, bwd;
  if (embedding)
    BuildEmbeddingOps(model_, s, &fwd, &bwd);
  else
    BuildStageInputOps(model_, s, &fwd, &bwd);
  TimeOps(l, fwd, &r.fwd_compute_s, &r.fwd_tp_s);
  TimeOps(l, bwd, &r.bwd_compute_s, &r.bwd_tp_s);
  if (output) {
    BuildOutputOps(model_, s, &fwd, &bwd);
    TimeOps(l, fwd, &r.fwd_compute_s, &r.fwd_tp_s);
    TimeOps(l, bwd, &r.bwd_compute_s, &r.bwd_tp_s);
  }
  return r;
}

double RuntimeModel::P2p(const Layout& l) const {
  if (l.pp == 1) return 0;
  const Dims x = DimsOf(model_, l);
  return Coll("send_recv", 2, x.Tl * x.h * m_.element_bytes, l);
}

std::vector<RuntimeTensor> RuntimeModel::ChunkTensors(const Layout& l, int r, int c) const {
  const ModelSpec& M = model_;
  const Dims x = DimsOf(M, l);
  const int stage = c * l.pp + r, last = l.pp * l.vp - 1;
  const bool embedding = stage == 0, output = stage == last;
  const int64_t layers = ChunkLayers(M, l, r, c);
  const int norm_tensors = M.norm == Norm::kLayerNorm ? 2 : 1;
  std::vector<RuntimeTensor> t;
  if (embedding || output) t.push_back({x.Vl * x.h, false, false, true});  // one table, both uses
  if (embedding && M.position == PositionEmbedding::kLearned) t.push_back({x.S * x.h, true});
  const int64_t first = ChunkFirstLayer(M, l, r, c);
  for (int64_t i = 0; i < layers; ++i) {
    for (int n = 0; n < 2 * norm_tensors; ++n) t.push_back({x.h, true});
    t.push_back({x.Q * x.h, false, false, true});  // QKV weight (column-parallel)
    t.push_back({x.h * x.A, false, false, true});  // projection weight (row-parallel)
    if (M.bias) {
      t.push_back({x.Q, false});
      t.push_back({x.h, true});
    }
    if (M.is_moe_layer(first + i)) {  // router, shared experts, the local experts (no biases)
      t.push_back({double(M.num_experts) * x.h, true, false, true});  // the router
      if (M.moe_shared_ffn_hidden > 0) {
        t.push_back({double(M.moe_shared_ffn_hidden) / l.tp * x.h, false, false, true});
        t.push_back({double(M.moe_shared_ffn_hidden) / l.tp * x.h, false, false, true});
      }
      const double fe = double(M.moe_ffn_hidden) / l.expert_tp();
      for (int64_t e = 0; e < M.num_experts / l.ep; ++e) {
        t.push_back({fe * x.h, false, true, true});
        t.push_back({fe * x.h, false, true, true});
      }
      continue;
    }
    t.push_back({x.Fi * x.h, false, false, true});  // fc1
    t.push_back({x.h * x.F, false, false, true});   // fc2
    if (M.bias) {
      t.push_back({x.Fi, false});
      t.push_back({x.h, true});
    }
  }
  if (output) {
    for (int n = 0; n < norm_tensors; ++n) t.push_back({x.h, true});
    if (!M.tied_embeddings) t.push_back({x.Vl * x.h, false, false, true});
  }
  return t;
}

int RuntimeModel::ExpertDp(const Layout& l) const {
  return std::max(1, l.tp * l.cp * l.dp / (l.expert_tp() * l.ep));
}

std::vector<RuntimeModel::DpBucket> RuntimeModel::ChunkDpBuckets(const Layout& l, int r,
                                                                  int c) const {
  std::vector<RuntimeTensor> ts = ChunkTensors(l, r, c);
  std::stable_sort(ts.begin(), ts.end(), [](const RuntimeTensor& a, const RuntimeTensor& b) {
    return BufferOrder(a) < BufferOrder(b);
  });
  const double cap = l.overlap_grad_reduce ? double(l.GradBucketParams())
                                           : std::numeric_limits<double>::infinity();
  const bool tp_partial = l.overlap_grad_reduce && l.sequence_parallel && l.tp > 1;
  std::vector<DpBucket> out;
  for (const bool expert : {false, true}) {
    if ((expert ? ExpertDp(l) : l.dp * l.cp) <= 1) continue;
    std::vector<const RuntimeTensor*> run;
    for (const RuntimeTensor& t : ts)
      if (t.expert == expert) run.push_back(&t);
    if (l.distributed_optimizer) {  // each tensor's reduce-scatter on its own
      for (size_t j = run.size(); j-- > 0;)
        out.push_back({run[j]->numel, expert,
                       l.overlap_grad_reduce && !(tp_partial && run[j]->replicated), true});
      continue;
    }
    double held = 0;
    for (size_t j = run.size(); j-- > 0;) {
      held += run[j]->numel;
      const bool partial = tp_partial && run[j]->replicated;
      if (j > 0 && held < cap && (tp_partial && run[j - 1]->replicated) == partial) continue;
      out.push_back({held, expert, l.overlap_grad_reduce && !partial});
      held = 0;
    }
  }
  return out;
}

double RuntimeModel::ChunkDp(const Layout& l, int r, int c) const {
  const double k = Slowdown(l);
  double s = 0;
  // What the runtime reduces whole lies in one contiguous grad buffer per chunk, dense before
  // routed experts (GptChunk::grad_buffer): per bucket one all-reduce and one scale. With the
  // distributed optimizer, per tensor a reduce-scatter (of a zero-padded flat copy where the
  // group does not divide it: R slices of ks) and a scale of the slice.
  // Gradients are fp32 (4 bytes) whatever the weights' dtype; with --grad-reduce-in-bf16 the
  // runtime rounds each bucket into its bf16 mirror, scales it there, reduces 2-byte elements
  // and copies the result back (Trainer's ToWire), also where no peer shares it.
  const bool average = l.dp > 1, bf16 = l.grad_reduce_in_bf16;
  const double g = bf16 ? 2 : 4;
  const double scale = average ? 1 : 0;
  double bucketed = 0;
  for (const DpBucket& b : ChunkDpBuckets(l, r, c)) {
    const int d = b.expert ? ExpertDp(l) : l.dp * l.cp;
    bucketed += b.numel;
    const double to_wire = bf16 ? Op("copy", b.numel, k) + scale * Op("scale", b.numel, k) : 0;
    if (!b.scatter) {
      s += to_wire + Coll("all_reduce", d, b.numel * g, l) +
           (bf16 ? Op("copy", b.numel, k) : scale * Op("scale", b.numel, k));
      continue;
    }
    const double ks = std::ceil(b.numel / d), padded = d * ks;
    if (padded != b.numel) s += Alloc(padded * g, k) + Op("copy", b.numel, k);
    s += to_wire + Coll("reduce_scatter", d, padded * g, l) + Op(bf16 ? "copy" : "scale", ks, k);
  }
  // What no peer shares (routed experts held once, or no DP x CP at all): scaled by 1/d, in
  // bf16 through the mirror.
  const bool held_once = average && model_.moe() && ExpertDp(l) <= 1;
  if (!bf16 && !held_once) return s;
  double alone = 0, experts = 0;
  for (const RuntimeTensor& t : ChunkTensors(l, r, c)) {
    alone += t.numel;
    if (t.expert) experts += t.numel;
  }
  alone -= bucketed;
  if (bf16 && alone > 0)
    s += 2 * Op("copy", alone, k) + scale * Op("scale", alone, k);
  else if (!bf16 && experts > 0)
    s += Op("scale", experts, k);
  return s;
}

double RuntimeModel::ChunkDpGather(const Layout& l, int r, int c) const {
  if (!l.distributed_optimizer) return 0;
  const double k = Slowdown(l), e = m_.element_bytes;
  double s = 0;
  // The all-gather of the updated slices (the weights, e bytes each) into the parameter; where
  // the group does not divide it, into a padded buffer (this rank's block copied in) and back.
  for (const RuntimeTensor& t : ChunkTensors(l, r, c)) {
    const int d = t.expert ? ExpertDp(l) : l.dp * l.cp;
    if (d <= 1) continue;
    const double ks = std::ceil(t.numel / d), padded = d * ks;
    s += Coll("all_gather", d, padded * e, l);
    if (padded != t.numel) s += Alloc(padded * e, k) + Op("copy", ks, k) + Op("copy", t.numel, k);
  }
  return s;
}

int RuntimeModel::ChunkDpGatherParts(const Layout& l, int r, int c) const {
  if (!l.distributed_optimizer) return 0;
  const int stage = c * l.pp + r, last = l.pp * l.vp - 1;
  const int64_t layers = ChunkLayers(model_, l, r, c);
  if (l.dp * l.cp > 1) return int(layers) + (stage == 0) + (stage == last);
  // Only the routed experts are sliced (over expert DP): the MoE layers.
  if (model_.moe() && ExpertDp(l) > 1)
    return int(model_.moe_layers_in(ChunkFirstLayer(model_, l, r, c), layers));
  return 0;
}

double RuntimeModel::EmbeddingReduce(const Layout& l) const {
  if (!model_.tied_embeddings || l.pp == 1) return 0;
  const Dims x = DimsOf(model_, l);
  double n = x.Vl * x.h;
  const int R = l.dp * l.cp;
  if (l.distributed_optimizer && R > 1) n = std::ceil(n / R);
  if (!l.grad_reduce_in_bf16) return Coll("all_reduce", 2, n * 4, l);  // fp32 gradients
  // --grad-reduce-in-bf16: through a bf16 copy and back.
  return Coll("all_reduce", 2, n * 2, l) + 2 * Op("copy", n, Slowdown(l));
}

RuntimeOptimizerTimes RuntimeModel::Optimizer(const Layout& l, int r) const {
  const double k = Slowdown(l);
  const bool main_weights = m_.element_bytes < 4;  // bf16: AdamW on them, then a rounded copy
  const int R = l.dp * l.cp;
  RuntimeOptimizerTimes o;
  double compute = Alloc(4, k);  // the norm accumulator
  for (int c = 0; c < l.vp; ++c) {
    // Per chunk: one fill of its grad buffer; with SP one TP all-reduce of its leading
    // replicated (TP-partial) gradients (GptChunk::ZeroGrads, FinalizeTpGrads); the whole
    // (not dist-opt-sliced) parameters in runs of the buffer's order (replicated, other dense,
    // routed experts; decayed first within each), one sum_squares and one adamw (+ copy) each;
    // a sliced one on its own.
    double grads = 0, tp_partial = 0, runs[6] = {0, 0, 0, 0, 0, 0};
    for (const RuntimeTensor& t : ChunkTensors(l, r, c)) {
      grads += t.numel;
      if (t.replicated && !t.expert) tp_partial += t.numel;
      const int g = t.expert ? ExpertDp(l) : R;
      if (!(l.distributed_optimizer && g > 1)) {
        runs[BufferOrder(t)] += t.numel;
        continue;
      }
      const double owned = std::ceil(t.numel / g);
      compute += Op("sum_squares", owned, k) + Op("adamw", owned, k) +
                 (main_weights ? Op("copy", owned, k) : 0.0);
    }
    // Neighbours with the same decay are one run (as on TP rank 0, where every whole
    // parameter but a tied copy counts in the norm).
    auto run = [&](double n) {
      compute += Op("sum_squares", n, k) + Op("adamw", n, k) +
                 (main_weights ? Op("copy", n, k) : 0.0);
    };
    double open = 0;
    int open_decay = -1;
    for (int order = 0; order < 6; ++order) {
      if (runs[order] == 0) continue;
      const int decay = order % 2 == 0 ? 1 : 0;
      if (decay != open_decay && open > 0) {
        run(open);
        open = 0;
      }
      open += runs[order];
      open_decay = decay;
    }
    if (open > 0) run(open);
    o.fill_s += Op("fill", grads, k);
    if (l.grad_reduce_in_bf16)
      o.round_s += double(l.num_microbatches() - 1) * 2 * Op("copy", grads, k);
    if (l.sequence_parallel && l.tp > 1 && tp_partial > 0)  // fp32 gradients
      o.tp_s += Coll("all_reduce", l.tp, tp_partial * 4, l);
  }
  // The squared norms (each element counted by one rank) summed over every rank at once.
  compute += Coll("all_reduce", l.world(), 8, l);
  if (r == l.pp - 1) o.dp_s = Coll("all_reduce", R, 4, l);  // the reported loss, DP x CP
  o.total_s = compute + o.fill_s + o.round_s + o.tp_s + o.dp_s;
  return o;
}

// What the attention core keeps for its backward (the backend's AttentionSavedShape, or with
// CP the log-sum-exp of each of the s queries and heads; fp32) and its output (T A): what
// selective recompute drops until the layer's backward.
double RuntimeModel::AttentionCoreBytes(const Layout& l) const {
  const Dims x = DimsOf(model_, l);
  const double saved = x.c > 1 ? x.b * x.nh * x.s
                               : x.b * x.nh * (m_.attention_saved_per_score * x.s * x.s +
                                               m_.attention_saved_per_token * x.s);
  return saved * kStatBytes + x.T * x.A * m_.element_bytes;
}

// Without recompute: x and x2 (Tl h), the two LN outputs as the GEMMs read them (T h), LN
// statistics (4 Tl, fp32), QKV (T Q), fc1 and its activation (T F each), and the attention core's
// (AttentionCoreBytes). An MoE layer keeps instead of fc1 and its activation (runtime/moe.cc's
// MoeSaved): its input (Tl h, apart from the gathered one with SP), the probabilities and the
// index tensors (5 n k + 2 R 4-byte words, n k = Tl k assignments, R = n k etp rows its experts
// compute), the experts' input, fc1 and GeLU (R h, 2 R Fe), each assignment's output
// (n k h), the shared experts' fc1 and GeLU (2 T Fs). Selective recompute keeps all but the
// core's; full only x.
double RuntimeModel::LayerActivationBytes(const Layout& l, bool moe) const {
  const Dims x = DimsOf(model_, l);
  if (l.recompute == Recompute::kFull) return x.Tl * x.h * m_.element_bytes;
  double elements = 2 * x.Tl * x.h + 2 * x.T * x.h + x.T * x.Q, words = 4 * x.Tl;
  if (moe) {
    const ModelSpec& M = model_;
    const double nk = x.Tl * double(M.moe_topk), R = nk * l.expert_tp();
    const double fe = double(M.moe_ffn_hidden) / l.expert_tp();
    const double fs = double(M.moe_shared_ffn_hidden) / l.tp;
    elements += (x.sp ? x.Tl * x.h : 0) + R * x.h + 2 * R * fe + nk * x.h + 2 * x.T * fs;
    words += 5 * nk + 2 * R;
  } else {
    elements += x.T * x.Fi + x.T * x.F;
  }
  const double core = l.recompute == Recompute::kSelective ? 0 : AttentionCoreBytes(l);
  return elements * m_.element_bytes + words * kStatBytes + core;
}

// What the backward of one layer restores first: all of its activations (full recompute) or
// its attention core's (selective).
double RuntimeModel::RecomputedBytes(const Layout& l, bool moe) const {
  if (l.recompute == Recompute::kNone) return 0;
  if (l.recompute == Recompute::kSelective) return AttentionCoreBytes(l);
  Layout none = l;
  none.recompute = Recompute::kNone;
  return LayerActivationBytes(none, moe);
}

// The most an MoE MLP holds at once besides what it saves (runtime/moe.cc: every tensor lives
// until the function returns): forward, the fp32 router logits (Tl E), the rows sent,
// received, gathered, in expert order and back (n k h, R_ep h, R h), weighted and the output
// (Tl h), the shared experts' partial sum (T h); backward, the same path's gradients and the
// logits' (Tl E). The fp32 combine accumulators of a bf16 run are not counted apart.
double RuntimeModel::MoeWorkingSet(const Layout& l) const {
  const Dims x = DimsOf(model_, l);
  const ModelSpec& M = model_;
  const double nk = x.Tl * double(M.moe_topk), etp = l.expert_tp(), R = nk * etp;
  const double ep = l.ep > 1 ? 1 : 0, tp = etp > 1 ? 1 : 0, E = double(M.num_experts);
  const double fs = double(M.moe_shared_ffn_hidden) / l.tp;
  const double e = m_.element_bytes;
  const double fwd = x.Tl * E * kStatBytes +
                     (nk * x.h * (2 + ep) + nk * x.h * ep + R * x.h * (2 + tp) + nk * x.h * tp +
                      x.Tl * x.h + (fs > 0 ? x.T * x.h + x.Tl * x.h : 0)) * e;
  const double bwd = (3 * x.Tl * x.h + nk * x.h * (3 + ep) + nk * x.h * ep +
                      R * x.h * (3 + tp) + nk * x.h * tp + x.Tl * E) * e + nk * kStatBytes;
  return std::max(fwd, bwd);
}

// The most a layer's backward holds at once besides the saved activations: the incoming and
// outgoing residual gradients, the MLP's input gradient (T F), the gathered/reduced (T h)
// gradients and the attention's (T A) and QKV (T Q) gradients.
double RuntimeModel::BackwardWorkingSet(const Layout& l) const {
  const Dims x = DimsOf(model_, l);
  const double e = m_.element_bytes;
  double elements = 2 * x.Tl * x.h + x.T * x.F + 2 * x.T * x.h + x.T * x.A;
  if (x.sp) elements += 2 * x.T * x.h + 2 * x.Tl * x.h;
  if (x.c == 1) return (elements + x.T * x.Q) * e;
  // The CP ring's backward holds the K/V block and the next (T 2A each), their fp32 dK/dV
  // accumulators, and the QKV gradient in fp32 (stored in the activations' dtype after).
  return (elements + 2 * x.T * 2 * x.A) * e + (2 * x.T * 2 * x.A + x.T * x.Q) * kStatBytes;
}

double RuntimeModel::InFlight(const Layout& l, int r) const {
  const double m = double(l.num_microbatches());
  if (l.schedule == ScheduleKind::kGPipe) return m * l.vp;
  if (l.vp > 1)
    return std::min(m * l.vp, double(l.pp - r - 1) * 2 + double(l.vp - 1) * l.group_size() + 1);
  return std::min(double(l.pp - r), m);
}

MemoryBytes RuntimeModel::StageMemory(const Layout& l, int r, double workspace_bytes,
                                      double fragmentation, double capacity) const {
  const Dims x = DimsOf(model_, l);
  const double e = m_.element_bytes;
  const int R = l.dp * l.cp;
  MemoryBytes mem;
  // The weights in the activations' dtype (e bytes); gradients, optimizer state and, when e is
  // under 4 (bf16, TrainerConfig::bf16), the fp32 main weights sliced like the moments: fp32.
  const bool main_weights = e < 4;
  double params = 0, state = 0, wire_slices = 0;
  for (int c = 0; c < l.vp; ++c)
    for (const RuntimeTensor& t : ChunkTensors(l, r, c)) {
      params += t.numel;
      const int g = t.expert ? ExpertDp(l) : R;
      const bool sliced = l.distributed_optimizer && g > 1;
      const double slice = sliced ? std::ceil(t.numel / g) : t.numel;
      if (sliced) wire_slices += slice;
      // AdamW m, v (+ the main weights) (+ the dist-opt grad slice)
      state += (main_weights ? 3 : 2) * std::max(1.0, slice) + (sliced ? slice : 0);
    }
  mem.weights = params * e;
  // --grad-reduce-in-bf16: a bf16 mirror of every gradient (and of each dist-opt slice).
  mem.grads = params * 4 + (l.grad_reduce_in_bf16 ? params * 2 + wire_slices * 2 : 0);
  mem.optimizer = state * 4;
  const double in_flight = InFlight(l, r);
  // A chunk's layers, dense and MoE, averaged over the rank's chunks.
  double dense = 0, moe = 0;
  for (int c = 0; c < l.vp; ++c) {
    const int64_t n = ChunkLayers(model_, l, r, c);
    const int64_t k = model_.moe_layers_in(ChunkFirstLayer(model_, l, r, c), n);
    dense += double(n - k) / l.vp;
    moe += double(k) / l.vp;
  }
  const double restored = std::max(RecomputedBytes(l), moe > 0 ? RecomputedBytes(l, true) : 0.0);
  const double working = std::max(BackwardWorkingSet(l), moe > 0 ? MoeWorkingSet(l) : 0.0);
  double act = in_flight * (dense * LayerActivationBytes(l) +
                            (moe > 0 ? moe * LayerActivationBytes(l, true) : 0)) +
               restored + working;
  double cached = 0;
  if (r == 0) {  // sequence-first token ids per micro-batch in flight; the cached position ids
    act += in_flight / l.vp * x.T * 4;
    cached += x.T * 4;
  }
  if (r == l.pp - 1) {
    // The output layer's saved tensors (final LN input and output, statistics, logits, targets,
    // row max and sum) for the micro-batches in flight there: all with GPipe; one with 1F1B and
    // interleaving, whose last virtual stage runs each backward right after its forward.
    const double out_in_flight =
        l.schedule == ScheduleKind::kGPipe ? double(l.num_microbatches()) : 1.0;
    const double out =
        (x.Tl * x.h + x.T * x.h + x.T * x.Vl) * e + (2 * x.Tl + 3 * x.T) * kStatBytes;
    // A micro-batch's output tensors go with its loss backward (runtime/gpt.cc Backward), whose
    // own gradients (the gathered final-LN gradient T h, with SP its scattered part, and the
    // layers' incoming Tl h) come and go before the layers' backward holds its working set and
    // a recomputed layer: the peak holds the larger of the two phases, besides the other
    // micro-batches' outputs (GPipe).
    const double loss_backward = out + (x.T * x.h + x.Tl * x.h + (x.sp ? x.Tl * x.h : 0)) * e;
    act += (out_in_flight - 1) * out + std::max(0.0, loss_backward - restored - working);
    cached += x.Vl * e;  // the padded-vocabulary mask
  }
  // A stage below the last holds one more (Tl, h) tensor at its peak: the received gradient
  // while its layers pass on new ones (interleaved: the next forward's input, received with it).
  if (l.pp > 1 && r < l.pp - 1) act += x.Tl * x.h * e;
  mem.activations = act;
  const double sum = mem.weights + mem.grads + mem.optimizer + mem.activations;
  mem.other = cached + workspace_bytes + fragmentation * sum;
  mem.total = sum + mem.other;
  mem.capacity = capacity;
  return mem;
}

}  // namespace ptdp
