// Closed-form step time, FLOPs and memory. Sources: Narayanan et al. 2021 (arXiv 2104.04473)
// eq. 2-3 and sec. 3; Korthikanti et al. 2022 (arXiv 2205.05198) table 2 and sec. 6;
// ../shared/reference/megatron-reference.md; constants in hardware_table.h.
#include "cost_model/analytic.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>

namespace ptdp {
namespace {

double ActBytes(Precision p) { return p == Precision::kFp32 ? 4.0 : 2.0; }
double WeightBytes(Precision p) { return p == Precision::kFp32 ? 4.0 : 2.0; }

}  // namespace

// The members are ranks 0, stride, ..., (size-1)*stride (every other group of the kind is this
// one shifted). With stride < gpus_per_node the first node holds ceil(gpus_per_node / stride)
// of them, and they span floor((size-1)*stride / gpus_per_node) + 1 nodes; a stride of a node
// or more puts each on its own node. Counting nodes by the span, not by size / per_node, is
// what keeps a stride that does not divide the node on it. Megatron's rank = tp + t*(dp + d*pp)
// and its embedding group is the first and last PP rank (megatron-reference.md section 2), so
// at pp 4 x dp 2 it is ranks 0 and 6, stride t*c*d*(p-1) = 6, on one 8-GPU node; size / (8 / 6)
// made it two nodes, and on a one-node cluster that asked the absent network for its
// bandwidth (0: an infinite, or 0/0, collective time; issue 12).
GroupShape RegularGroupShape(int stride, int size, int gpus_per_node) {
  GroupShape g;
  g.size = size;
  if (size <= 1) return g;
  if (stride >= gpus_per_node) {
    g.per_node = 1;
    g.nodes = size;
  } else {
    g.per_node = std::min(size, (gpus_per_node + stride - 1) / stride);
    g.nodes = int(int64_t(size - 1) * stride / gpus_per_node) + 1;
  }
  g.sharing = g.nodes == 1 ? 1 : std::max(1, gpus_per_node / g.per_node);
  return g;
}

Status CheckEstimate(const Layout& l, const Estimate& e) {
  const Breakdown& b = e.breakdown;
  const MemoryBytes& m = e.memory;
  // (name, value, must be > 0 rather than >= 0)
  struct Term { const char* name; double v; bool positive; };
  const Term terms[] = {
      {"compute_s", b.compute_s, false},         {"tp_comm_s", b.tp_comm_s, false},
      {"pp_comm_s", b.pp_comm_s, false},         {"dp_comm_s", b.dp_comm_s, false},
      {"bubble_s", b.bubble_s, false},           {"optimizer_s", b.optimizer_s, false},
      {"step_time_s", e.step_time_s, true},      {"bubble_fraction", e.bubble_fraction, false},
      {"mfu", e.mfu, false},                     {"memory.weights", m.weights, false},
      {"memory.grads", m.grads, false},          {"memory.optimizer", m.optimizer, false},
      {"memory.activations", m.activations, false}, {"memory.other", m.other, false},
      {"memory.total", m.total, true}};
  for (const Term& t : terms) {
    if (std::isfinite(t.v) && (t.positive ? t.v > 0 : t.v >= 0)) continue;
    char buf[96];
    std::snprintf(buf, sizeof buf, ": %s is %g (step_time_s %g): not a finite, %s figure",
                  t.name, t.v, e.step_time_s, t.positive ? "positive" : "non-negative");
    return Status::Error("cost model: " + l.ShortName() + " [" + l.Knobs() + "]" + buf);
  }
  return Status::Ok();
}

Result<AnalyticModel> AnalyticModel::Create(const ModelSpec& model, const Topology& topo) {
  PTDP_ASSIGN_OR_RETURN(CostConstants k, ConstantsFor(topo.spec()));
  const MeasuredPrimitives& m = topo.spec().measured;
  if (!m.empty()) PTDP_RETURN_IF_ERROR(m.CheckComplete(topo.spec().file));
  return AnalyticModel(model, topo, k);
}

AnalyticModel::AnalyticModel(const ModelSpec& model, const Topology& topo,
                             const CostConstants& k)
    : model_(model), topo_(&topo), k_(k) {
  const ClusterSpec& c = topo.spec();
  if (!c.measured.empty() && c.measured.CheckComplete(c.file).ok())
    runtime_ = std::make_shared<RuntimeModel>(model, c.measured, c.gpus_per_node);
}

double AnalyticModel::PeakFlops(Precision p) const {
  double peak = topo_->spec().gpu.PeakFlops(p);
  if (peak <= 0) peak = topo_->spec().gpu.PeakFlops(Precision::kBf16);
  return peak;
}

double AnalyticModel::MfuPeak(Precision p) const {
  // NeMo and the dgxc recipes quote fp8 MFU against the 16-bit peak; so do we.
  return PeakFlops(p == Precision::kFp8 ? Precision::kBf16 : p);
}

// time = flops / (peak * eff(d)), eff = eff_max * d / (d + d_half), d = min(m, n, k).
double AnalyticModel::Gemm(double m, double n, double k, Precision p) const {
  const double d = std::min(m, std::min(n, k));
  const double eff_max = p == Precision::kFp8 ? k_.gemm_eff_max_fp8 : k_.gemm_eff_max;
  const double eff = eff_max * d / (d + k_.gemm_half_dim);
  return 2.0 * m * n * k / (PeakFlops(p) * eff);
}

// Collective time with NCCL's achievable share of the link: latency + bytes / (bw * eff).
double AnalyticModel::Coll(Collective c, int stride, int size, double bytes) const {
  if (size <= 1 || bytes <= 0) return 0;
  const GroupShape g = RegularGroupShape(stride, size, topo_->spec().gpus_per_node);
  // The layout's world fits the cluster (Evaluate's precondition), so its groups do too: a
  // group on more nodes than exist would be timed on a network that is not there.
  assert(g.nodes <= topo_->spec().nodes);
  const double lat = topo_->CollectiveTime(c, g, 0);
  const double full = topo_->CollectiveTime(c, g, bytes);
  const double eff = g.nodes > 1 ? k_.nccl_inter_eff : k_.nccl_intra_eff;
  return k_.collective_overhead_s + lat + (full - lat) / eff;
}

LayerTimes AnalyticModel::Layer(const Layout& l) const {
  if (runtime_) {
    const RuntimeLayerTimes r = runtime_->Layer(l);
    LayerTimes lt;
    lt.fwd_compute_s = r.fwd_compute_s;
    lt.bwd_compute_s = r.bwd_compute_s;
    lt.fwd_tp_s = r.fwd_tp_s;
    lt.bwd_tp_s = r.bwd_tp_s;
    return lt;
  }
  const ModelSpec& M = model_;
  const double t = l.tp, c = l.cp, b = l.micro_batch;
  const double s = M.seq_len, sl = s / c, h = M.hidden, a = M.heads, hd = M.head_dim();
  const double T = b * sl;  // tokens of one micro-batch on this CP rank
  const Precision prec = l.precision;
  const double peak16 = PeakFlops(l.precision == Precision::kFp8 ? Precision::kBf16 : l.precision);
  const double hbm = topo_->spec().gpu.hbm_bw_bytes_per_s * k_.hbm_eff;
  const double act = ActBytes(l.precision);
  // K/V heads held per TP rank: kv/t, or one group replicated when t > kv (GQA).
  const double kv_local = std::max(1.0, double(M.kv_heads) / t);
  const double mlp_in = M.activation == Activation::kSwiglu ? 2.0 * M.ffn_hidden : M.ffn_hidden;

  // GEMMs of one layer, (m, n, k): QKV, attention output, MLP in, MLP out.
  const double gemm = Gemm(T, h / t + 2 * kv_local * hd, h, prec) + Gemm(T, h, h / t, prec) +
                      Gemm(T, mlp_in / t, h, prec) + Gemm(T, h, M.ffn_hidden / t, prec);
  // Attention core: QK^T and AV, 4 b s_l s h / t FLOPs (Narayanan's 4 b s^2 h term).
  const double attn_flops = 4.0 * b * sl * s * h / t;
  const double attn = attn_flops / (peak16 * k_.attention_eff) +
                b * (a / t) * sl * s * k_.softmax_bytes_per_score / hbm;
  const double ew_rep = l.sequence_parallel ? k_.elementwise_replicated / t
                                            : k_.elementwise_replicated;
  const double elementwise = T * h * act * (ew_rep + k_.elementwise_tp_split / t) / hbm;

  // The host issues a layer's kernels while the GPU runs earlier ones: a layer takes the longer
  // of the GPU's work and the host's dispatch time (PyTorch eager launches dozens of kernels per
  // layer), which dominates small layers.
  LayerTimes lt;
  lt.fwd_compute_s = std::max(gemm + attn + elementwise, k_.layer_overhead_s);
  const double bwd = std::max(2.0 * (gemm + attn + elementwise), 2.0 * k_.layer_overhead_s);
  if (l.recompute == Recompute::kFull) lt.recompute_s = lt.fwd_compute_s;
  if (l.recompute == Recompute::kSelective) lt.recompute_s = attn;
  lt.bwd_compute_s = bwd + lt.recompute_s;

  // TP: 2 all-reduces of T*h elements forward and 2 backward (with SP the same bytes as
  // all-gather + reduce-scatter pairs); full recompute repeats the forward's 2.
  const double msg = T * h * act;
  const double tp_one = l.tp > 1 ? Coll(Collective::kAllReduce, 1, l.tp, msg) * TpExposed(l) : 0;
  // CP: all-gather of this rank's K and V across c ranks (reduce-scatter of their grads in
  // backward), overlapped with the attention core (Megatron's ring attention).
  double cp_f = 0, cp_b = 0;
  if (l.cp > 1) {
    const double kv_bytes = 2.0 * T * kv_local * hd * act * c;
    cp_f = std::max(0.0, Coll(Collective::kAllGather, l.tp, l.cp, kv_bytes) - attn);
    cp_b = std::max(0.0, Coll(Collective::kReduceScatter, l.tp, l.cp, kv_bytes) - 2 * attn);
  }
  lt.fwd_tp_s = 2 * tp_one + cp_f;
  lt.bwd_tp_s = 2 * tp_one + cp_b + (l.recompute == Recompute::kFull ? 2 * tp_one + cp_f : 0);
  return lt;
}

StageTimes AnalyticModel::Stage(const Layout& l, int r) const { return StageFrom(l, r, Layer(l)); }

StageTimes AnalyticModel::StageFrom(const Layout& l, int r, const LayerTimes& lt) const {
  return Work(l, double(model_.layers) / l.pp, r == 0, r == l.pp - 1, lt);
}

StageTimes AnalyticModel::Chunk(const Layout& l, int r, int c, const LayerTimes& lt) const {
  return Work(l, double(model_.layers) / (double(l.pp) * l.vp), r == 0 && c == 0,
              r == l.pp - 1 && c == l.vp - 1, lt);
}

StageTimes AnalyticModel::Work(const Layout& l, double layers, bool embedding, bool output,
                               const LayerTimes& lt) const {
  const ModelSpec& M = model_;
  StageTimes st;
  double fc = layers * lt.fwd_compute_s, bc = layers * lt.bwd_compute_s;
  double ftp = layers * lt.fwd_tp_s, btp = layers * lt.bwd_tp_s;
  const double t = l.tp, T = double(l.micro_batch) * M.seq_len / l.cp, h = M.hidden;
  const double act = ActBytes(l.precision);
  const double hbm = topo_->spec().gpu.hbm_bw_bytes_per_s * k_.hbm_eff;
  const double tp_exp = TpExposed(l);
  if (runtime_) {
    const RuntimeLayerTimes x = runtime_->ChunkExtras(l, embedding, output);
    fc += x.fwd_compute_s;
    bc += x.bwd_compute_s;
    ftp += x.fwd_tp_s;
    btp += x.bwd_tp_s;
    embedding = output = false;  // done
  }
  if (embedding) {  // embedding lookup (+ dropout) and its TP all-reduce (vocab-parallel)
    fc += 4.0 * T * h * act / hbm;
    bc += 4.0 * T * h * act / hbm;
    if (l.tp > 1) ftp += Coll(Collective::kAllReduce, 1, l.tp, T * h * act) * tp_exp;
  }
  if (output) {  // final norm, logits GEMM (fwd + 2 bwd), vocab-parallel cross entropy
    const double V = M.padded_vocab(l.tp);
    const double logits = Gemm(T, V / t, h, l.precision);
    const double ce_bytes = T * (V / t) * 4.0;  // fp32 logits read/written per pass
    fc += logits + 2.5 * ce_bytes / hbm + 2.0 * T * h * act / hbm;
    bc += 2 * logits + 2.0 * ce_bytes / hbm + 2.0 * T * h * act / hbm;
    if (l.tp > 1 && l.sequence_parallel) {  // all-gather before, reduce-scatter after
      ftp += Coll(Collective::kAllGather, 1, l.tp, T * h * act) * tp_exp;
      btp += Coll(Collective::kReduceScatter, 1, l.tp, T * h * act) * tp_exp;
    }
  }
  st.fwd_s = fc + ftp;
  st.bwd_s = bc + btp;
  st.compute_s = fc + bc;
  st.tp_s = ftp + btp;
  st.fwd_tp_s = ftp;
  st.bwd_tp_s = btp;
  return st;
}

double AnalyticModel::P2pTime(const Layout& l) const {
  if (l.pp == 1) return 0;
  if (runtime_) return runtime_->P2p(l);
  const double T = double(l.micro_batch) * model_.seq_len / l.cp;
  const double full = T * model_.hidden * ActBytes(l.precision);
  // Scatter/gather optimisation (Narayanan sec. 4.1): each TP rank sends 1/t, then the
  // receivers all-gather over NVLink. With SP the tensor is already split along s.
  const double sent = l.tp > 1 ? full / l.tp : full;
  double time = Coll(Collective::kSendRecv, l.tp * l.cp * l.dp, 2, sent);
  if (l.tp > 1 && !l.sequence_parallel) time += Coll(Collective::kAllGather, 1, l.tp, full);
  return time;
}

double AnalyticModel::ParamsOnStage(const Layout& l, int r) const {
  const ModelSpec& M = model_;
  const double t = l.tp;
  double p = double(M.layers) / l.pp * M.params_per_layer() / t;
  const double vocab_rows = double(M.padded_vocab(l.tp)) * M.hidden / t;
  if (r == 0)
    p += vocab_rows + (M.position == PositionEmbedding::kLearned ? double(M.seq_len) * M.hidden : 0);
  if (r == l.pp - 1) {
    const double final_norm = M.norm == Norm::kLayerNorm ? 2.0 * M.hidden : M.hidden;
    p += final_norm;
    if (!M.tied_embeddings || l.pp > 1) p += vocab_rows;  // untied, or the tied copy on the last stage
  }
  return p;
}

double AnalyticModel::DpTime(const Layout& l, double params) const {
  const int n = l.dp * l.cp;  // gradients are reduced over DP x CP (Megatron)
  if (n <= 1) return 0;
  const double grad_bytes = params * 4.0;  // fp32 main grads (--accumulate-allreduce-grads-in-fp32)
  if (l.distributed_optimizer)
    return Coll(Collective::kReduceScatter, l.tp, n, grad_bytes) +
           Coll(Collective::kAllGather, l.tp, n, params * WeightBytes(l.precision));
  return Coll(Collective::kAllReduce, l.tp, n, grad_bytes);
}

double AnalyticModel::LayerActivationBytes(const Layout& l) const {
  if (runtime_) return runtime_->LayerActivationBytes(l);
  const ModelSpec& M = model_;
  const double t = l.tp, b = l.micro_batch, s = M.seq_len, sl = s / l.cp, h = M.hidden,
               a = M.heads;
  const double sbh = sl * b * h;
  if (l.recompute == Recompute::kFull)  // only the layer input is kept
    return 2.0 * sbh / (l.sequence_parallel ? t : 1) * (l.precision == Precision::kFp32 ? 2 : 1);
  // Fused (flash) attention never stores the s x s scores: the 5as/h term disappears, as
  // with selective recompute.
  const bool fused_attention = k_.softmax_bytes_per_score == 0;
  const bool sel = l.recompute == Recompute::kSelective;
  const double score_term = (fused_attention || sel) ? 0 : 5.0 * a * s / h;
  const double bytes = l.sequence_parallel ? sbh / t * (34 + score_term)
                                           : sbh * (10 + 24 / t + score_term / t);
  return l.precision == Precision::kFp32 ? 2 * bytes : bytes;  // table 2 is for 16-bit
}

// Activation bytes held on stage r at its peak: per-layer bytes times the layers of the
// micro-batches in flight (megatron-reference.md section 3), plus embedding and logits.
double AnalyticModel::Activations(const Layout& l, int r) const {
  const ModelSpec& M = model_;
  const double t = l.tp, sbh = double(M.seq_len) / l.cp * l.micro_batch * M.hidden;
  const double per_layer = LayerActivationBytes(l);
  const double m = double(l.num_microbatches());
  const double layers_per_chunk = double(M.layers) / (l.pp * l.vp);
  double chunks_in_flight;
  if (l.schedule == ScheduleKind::kGPipe) {
    chunks_in_flight = m * l.vp;
  } else if (l.vp > 1) {
    const double warmup = double(l.pp - r - 1) * 2 + double(l.vp - 1) * l.group_size();
    chunks_in_flight = std::min(m * l.vp, warmup + 1);
  } else {
    chunks_in_flight = std::min(double(l.pp - r), m);
  }
  double bytes = chunks_in_flight * layers_per_chunk * per_layer;
  if (l.recompute == Recompute::kFull) {  // one layer's full activations while recomputing
    Layout none = l;
    none.recompute = Recompute::kNone;
    bytes += LayerActivationBytes(none);
  }
  if (r == 0) bytes += chunks_in_flight / l.vp * sbh * 3.0 / (l.sequence_parallel ? t : 1);
  if (r == l.pp - 1)  // output layer and loss (megatron-reference.md section 7)
    bytes += 4.0 * sbh * (1 + double(M.padded_vocab(l.tp)) / M.hidden) / t;
  return bytes;
}

MemoryBytes AnalyticModel::StageMemory(const Layout& l, int r) const {
  if (runtime_)
    return runtime_->StageMemory(l, r, k_.workspace_bytes, k_.fragmentation,
                                 topo_->spec().gpu.memory_bytes);
  const double params = ParamsOnStage(l, r);
  const double shard = l.distributed_optimizer ? double(l.dp) * l.cp : 1.0;
  MemoryBytes mem;
  mem.weights = params * WeightBytes(l.precision);
  mem.grads = params * 4.0;
  // fp32 master copy (none when training in fp32) + Adam m and v.
  mem.optimizer = params * (l.precision == Precision::kFp32 ? 8.0 : 12.0) / shard;
  mem.activations = Activations(l, r);
  const double sum = mem.weights + mem.grads + mem.optimizer + mem.activations;
  mem.other = k_.workspace_bytes + k_.fragmentation * sum;
  mem.total = sum + mem.other;
  mem.capacity = topo_->spec().gpu.memory_bytes;
  return mem;
}

double AnalyticModel::ModelFlops(const Layout& l) const {
  // Per token: 3 x (2 x linear weights + 4 s h attention) per layer + 3 x 2 h V logits; equals
  // Korthikanti's 72 B L s h^2 (1 + s/(6h) + V/(12 h L)) for GPT shapes.
  const ModelSpec& M = model_;
  const double tokens = double(l.global_batch) * M.seq_len;
  const double layer_fwd = 2.0 * M.linear_params_per_layer() + 4.0 * M.seq_len * M.hidden;
  return 3.0 * tokens * (M.layers * layer_fwd + 2.0 * M.hidden * M.vocab);
}

double AnalyticModel::HardwareFlops(const Layout& l) const {
  const ModelSpec& M = model_;
  const double tokens = double(l.global_batch) * M.seq_len;
  const double layer_fwd = 2.0 * M.linear_params_per_layer() + 4.0 * M.seq_len * M.hidden;
  double extra = 0;
  if (l.recompute == Recompute::kFull) extra = tokens * M.layers * layer_fwd;  // Narayanan eq. 3
  if (l.recompute == Recompute::kSelective)  // Korthikanti: s/(3h) instead of s/(6h)
    extra = tokens * M.layers * 12.0 * M.seq_len * M.hidden;
  return ModelFlops(l) + extra;
}

Estimate AnalyticModel::Evaluate(const Layout& layout) const {
  const Layout l = Executed(layout);
  Estimate e;
  const int p = l.pp;
  const double m = double(l.num_microbatches());
  // Stages: first, a middle one (all middle stages are alike), last.
  const LayerTimes lt = Layer(l);
  const StageTimes first = StageFrom(l, 0, lt);
  const StageTimes last = p > 1 ? StageFrom(l, p - 1, lt) : first;
  const StageTimes mid = p > 2 ? StageFrom(l, 1, lt) : first;
  const StageTimes* slow = &first;
  if (last.total() > slow->total()) slow = &last;
  if (p > 2 && mid.total() > slow->total()) slow = &mid;
  const double sum_stages =
      p == 1 ? first.total() : first.total() + last.total() + (p - 2) * mid.total();

  Breakdown& br = e.breakdown;
  br.compute_s = m * slow->compute_s;
  br.tp_comm_s = m * slow->tp_s;
  // Fill and drain: every other stage's work once, shortened v times by interleaving
  // (Narayanan sec. 2.2: bubble (p-1)/(v m) of the ideal time for uniform stages).
  br.bubble_s = (sum_stages - slow->total()) / l.vp;
  // Blocking p2p on the critical path: a send per chunk boundary each way for every micro-batch,
  // plus the fill and drain hops.
  br.pp_comm_s = p > 1 ? k_.pp_exposed * 2.0 * (m * l.vp + p - 1) * P2pTime(l) : 0;

  // DP: the stage with the most parameters finishes last.
  const double params = std::max(ParamsOnStage(l, 0), ParamsOnStage(l, p - 1));
  double dp = 0;
  if (runtime_) {  // per-tensor reductions of the stage with the most to reduce
    for (int r : {0, p - 1}) {
      double stage = 0;
      for (int c = 0; c < l.vp; ++c) stage += runtime_->ChunkDp(l, r, c);
      dp = std::max(dp, stage);
    }
  } else {
    dp = DpTime(l, params);
  }
  if (l.overlap_grad_reduce)
    dp = std::max(0.0, dp - k_.dp_overlap_window * (slow->bwd_s + (l.distributed_optimizer ? slow->fwd_s : 0)));
  br.dp_comm_s = dp + EmbeddingReduceTime(l);
  br.optimizer_s = std::max(StageOptimizerTime(l, 0), StageOptimizerTime(l, p - 1));

  e.step_time_s = br.total();
  e.bubble_fraction = br.bubble_s / e.step_time_s;
  e.model_flops = ModelFlops(l);
  e.hw_flops = HardwareFlops(l);
  e.mfu = e.model_flops / (e.step_time_s * l.world() * MfuPeak(l.precision));
  // Memory: the first stage keeps the most micro-batches in flight; the last holds the logits.
  const MemoryBytes m0 = StageMemory(l, 0);
  const MemoryBytes ml = p > 1 ? StageMemory(l, p - 1) : m0;
  e.memory = ml.total > m0.total ? ml : m0;
  e.fits = e.memory.total <= e.memory.capacity;
  return e;
}

double AnalyticModel::EmbeddingReduceTime(const Layout& l) const {
  if (runtime_) return runtime_->EmbeddingReduce(l);
  // Tied embedding gradient between first and last stage (the embedding group).
  if (!model_.tied_embeddings || l.pp == 1) return 0;
  const double emb = double(model_.padded_vocab(l.tp)) * model_.hidden / l.tp * 4.0;
  return Coll(Collective::kAllReduce, l.tp * l.cp * l.dp * (l.pp - 1), 2, emb);
}

double AnalyticModel::OptimizerTime(const Layout& l, double params) const {
  const double hbm = topo_->spec().gpu.hbm_bw_bytes_per_s * k_.hbm_eff;
  const double shard = l.distributed_optimizer ? double(l.dp) * l.cp : 1.0;
  return params / shard * k_.optimizer_bytes_per_param / hbm +
         params * 4.0 / hbm +  // gradient norm reads every local gradient
         k_.step_overhead_s;
}

double AnalyticModel::StageOptimizerTime(const Layout& l, int r) const {
  if (runtime_) return runtime_->Optimizer(l, r).total_s;
  return OptimizerTime(l, ParamsOnStage(l, r));
}

double AnalyticModel::StaticMemory(const Layout& l, int r) const {
  const MemoryBytes m = StageMemory(l, r);
  return m.total - m.activations * (1 + k_.fragmentation);
}

double AnalyticModel::ChunkActivationBytes(const Layout& l) const {
  return LayerActivationBytes(l) * double(model_.layers) / (double(l.pp) * l.vp) *
         (1 + k_.fragmentation);
}

double AnalyticModel::ChunkDpTime(const Layout& l, int r, int c) const {
  if (runtime_) return runtime_->ChunkDp(l, r, c);
  // The stage's parameters split over its chunks; the embedding/output rows go with the chunk
  // that holds them.
  const double layer_part = double(model_.layers) / l.pp * model_.params_per_layer() / l.tp;
  const double extra = ParamsOnStage(l, r) - layer_part;
  double params = layer_part / l.vp;
  if ((r == 0 && c == 0) || (r == l.pp - 1 && c == l.vp - 1)) params += extra;
  return DpTime(l, params);
}

double AnalyticModel::LowerBound(const Layout& layout) const {
  const Layout l = Executed(layout);
  const LayerTimes lt = Layer(l);
  double compute = 0;
  for (int r : {0, l.pp / 2, l.pp - 1}) compute = std::max(compute, StageFrom(l, r, lt).compute_s);
  return double(l.num_microbatches()) * compute +
         std::max(StageOptimizerTime(l, 0), StageOptimizerTime(l, l.pp - 1));
}

Prediction AnalyticModel::Predict(const Layout& l) const {
  const Estimate e = Evaluate(l);
  Prediction p;
  p.step_time_s = e.step_time_s;
  p.tflops_per_gpu = e.model_flops / e.step_time_s / l.world() / 1e12;
  p.hw_tflops_per_gpu = e.hw_flops / e.step_time_s / l.world() / 1e12;
  p.mfu = e.mfu;
  p.bubble_fraction = e.bubble_fraction;
  p.breakdown = e.breakdown;
  p.memory = e.memory;
  p.fits = e.fits;
  p.source = "analytic";
  const Layout x = Executed(l);
  for (int r = 0; r < l.pp; ++r) {
    const MemoryBytes mem = StageMemory(x, r);
    p.stage_memory_bytes.push_back(mem.total);
    if (mem.total > p.memory.total) p.memory = mem;
  }
  p.fits = p.memory.total <= p.memory.capacity;
  return p;
}

}  // namespace ptdp
