// GptChunk: forward and backward of one GPT pipeline chunk over Backend + Communicator; see gpt.h
// for the letters and the picture of a layer.
#include "runtime/gpt.h"

#include <cassert>
#include <memory>
#include <numeric>
#include <utility>

#include "runtime/gpt_internal.h"

namespace ptdp::rt {
namespace {

constexpr float kLnEps = 1e-5f;  // LayerNorm epsilon (GPT-2, Megatron)
// Added to the logits of padded vocabulary rows: exp(kMaskedLogit - max) is exactly 0 in fp32,
// so the padding never enters the softmax (the loss does not depend on the padding, i.e. on t),
// and it stays finite so max and the sums never see an inf.
constexpr float kMaskedLogit = -1e30f;

std::string Str(int64_t v) { return std::to_string(v); }

}  // namespace

// With full recompute only x is kept between forward and backward; with selective, all but
// att_saved and att.
struct GptChunk::LayerSaved {
  Tensor x;                    // (sl*b, h) layer input
  Tensor ln1_mean, ln1_rstd;   // (sl*b)
  Tensor ln1_full;             // (s*b, h) LN1 output, gathered along s with SP
  Tensor qkv;                  // (s*b, 3A)
  Tensor att_saved;            // AttentionSavedShape (without CP)
  Tensor lse;                  // (b, A/d, s) log-sum-exp of the scores (with CP)
  Tensor att;                  // (s*b, A)
  Tensor x2;                   // (sl*b, h) after the attention residual
  Tensor ln2_mean, ln2_rstd;   // (sl*b)
  Tensor ln2_full;             // (s*b, h)
  Tensor fc1;                  // (s*b, F) before GeLU
  Tensor gelu;                 // (s*b, F)
  std::shared_ptr<MoeSaved> moe;  // MoE layers: instead of fc1, gelu
};

struct GptChunk::Saved {
  int64_t b = 0;                    // micro-batch size
  Tensor tokens;                    // (s*b) i32 seq-first token ids (has_embedding)
  Tensor positions;                 // (sl*b) i32 this rank's position ids (has_embedding)
  std::vector<LayerSaved> layers;   // one per layer held
  Tensor final_x;                   // (sl*b, h) input of the final LN (has_output)
  Tensor lnf_mean, lnf_rstd;        // (sl*b)
  Tensor lnf_full;                  // (s*b, h)
  Tensor logits;                    // (s*b, Vl) masked
  Tensor targets;                   // (s*b) i32 seq-first
  Tensor row_max, sum_exp;          // (s*b) global over TP
  float row_scale = 0.0f;           // dLoss / dloss[n] = loss_scale / (s*b)
  float loss_scale = 1.0f;          // Forward's (full recompute reruns MoE layers with it)
};

GptChunk::GptChunk(const GptChunkConfig& cfg, Backend& backend, const GptChunkComms& comms)
    : cfg_(cfg),
      be_(backend),
      act_(cfg.bf16 ? DType::kBF16 : DType::kF32),
      tp_comm_(*comms.tp),
      cp_comm_(comms.cp),
      ep_comm_(comms.ep),
      etp_comm_(comms.etp),
      tokens_comm_(comms.tokens) {}

GptChunk::~GptChunk() = default;

Result<std::unique_ptr<GptChunk>> GptChunk::Create(const GptChunkConfig& cfg, Backend& backend,
                                                   Communicator& tp_comm) {
  GptChunkComms comms;
  comms.tp = &tp_comm;
  return Create(cfg, backend, comms);
}

Result<std::unique_ptr<GptChunk>> GptChunk::Create(const GptChunkConfig& cfg, Backend& backend,
                                                   const GptChunkComms& comms) {
  const ModelSpec& m = cfg.model;
  if (comms.tp == nullptr) return Status::Error("GptChunk: no TP communicator");
  Communicator& tp_comm = *comms.tp;
  PTDP_RETURN_IF_ERROR(ValidateModel(m, "GptChunk"));
  PTDP_RETURN_IF_ERROR(CheckGptShaped(m).Prefixed("GptChunk"));
  if (cfg.tp < 1 || cfg.tp_rank < 0 || cfg.tp_rank >= cfg.tp)
    return Status::Error("GptChunk: tp rank " + Str(cfg.tp_rank) + " of tp " + Str(cfg.tp));
  if (tp_comm.size() != cfg.tp || tp_comm.rank() != cfg.tp_rank)
    return Status::Error("GptChunk: TP communicator is rank " + Str(tp_comm.rank()) + " of " +
                         Str(tp_comm.size()) + ", config says rank " + Str(cfg.tp_rank) +
                         " of " + Str(cfg.tp));
  if (m.heads % cfg.tp != 0 || m.ffn_hidden % cfg.tp != 0)
    return Status::Error("GptChunk: heads " + Str(m.heads) + " and ffn_hidden " +
                         Str(m.ffn_hidden) + " must be divisible by tp " + Str(cfg.tp));
  if (cfg.cp < 1 || cfg.cp_rank < 0 || cfg.cp_rank >= cfg.cp)
    return Status::Error("GptChunk: cp rank " + Str(cfg.cp_rank) + " of cp " + Str(cfg.cp));
  if (cfg.cp > 1) {
    if (comms.cp == nullptr || comms.cp->size() != cfg.cp || comms.cp->rank() != cfg.cp_rank)
      return Status::Error("GptChunk: the CP communicator does not match cp rank " +
                           Str(cfg.cp_rank) + " of " + Str(cfg.cp));
    if (m.seq_len % (2 * cfg.cp) != 0)
      return Status::Error("GptChunk: context parallelism needs seq_len " + Str(m.seq_len) +
                           " divisible by 2 * cp = " + Str(2 * cfg.cp));
  }
  const int64_t s_local = m.seq_len / cfg.cp;
  if (cfg.sequence_parallel && s_local % cfg.tp != 0)
    return Status::Error("GptChunk: sequence parallelism needs seq_len / cp = " + Str(s_local) +
                         " divisible by tp " + Str(cfg.tp));
  if (cfg.first_layer < 0 || cfg.n_layers < 0 || cfg.first_layer + cfg.n_layers > m.layers)
    return Status::Error("GptChunk: layers [" + Str(cfg.first_layer) + ", " +
                         Str(cfg.first_layer + cfg.n_layers) + ") outside the model's " +
                         Str(m.layers));
  if (m.moe_layers_in(cfg.first_layer, cfg.n_layers) > 0) {
    auto matches = [](const Communicator* c, int size, int rank) {
      return c == nullptr ? size == 1 : c->size() == size && c->rank() == rank;
    };
    if (cfg.ep < 1 || m.num_experts % cfg.ep != 0 || cfg.ep_rank < 0 || cfg.ep_rank >= cfg.ep)
      return Status::Error("GptChunk: ep rank " + Str(cfg.ep_rank) + " of ep " + Str(cfg.ep) +
                           " for " + Str(m.num_experts) + " experts");
    if (cfg.etp < 1 || m.moe_ffn_hidden % cfg.etp != 0 || cfg.etp_rank < 0 ||
        cfg.etp_rank >= cfg.etp || m.moe_shared_ffn_hidden % cfg.tp != 0)
      return Status::Error("GptChunk: expert TP rank " + Str(cfg.etp_rank) + " of etp " +
                           Str(cfg.etp) + " for moe_ffn_hidden " + Str(m.moe_ffn_hidden) +
                           " (shared " + Str(m.moe_shared_ffn_hidden) + " over tp " +
                           Str(cfg.tp) + ")");
    if (!matches(comms.ep, cfg.ep, cfg.ep_rank) || !matches(comms.etp, cfg.etp, cfg.etp_rank))
      return Status::Error("GptChunk: the EP / expert-TP communicators do not match ep rank " +
                           Str(cfg.ep_rank) + " of " + Str(cfg.ep) + ", etp rank " +
                           Str(cfg.etp_rank) + " of " + Str(cfg.etp));
    if (cfg.tp > 1 && !cfg.sequence_parallel)
      return Status::Error("GptChunk: an MoE layer with tp " + Str(cfg.tp) +
                           " needs sequence parallelism (as Megatron's MoELayer)");
  }
  std::unique_ptr<GptChunk> c(new GptChunk(cfg, backend, comms));
  PTDP_RETURN_IF_ERROR(c->Init());
  return c;
}

Status GptChunk::Init() {
  const ModelSpec& m = cfg_.model;
  const int t = cfg_.tp;
  h_ = m.hidden;
  seq_ = m.seq_len;
  s_ = m.seq_len / cfg_.cp;
  sl_ = cfg_.sequence_parallel ? s_ / t : s_;
  nh_ = m.heads / t;
  attn_ = nh_ * m.head_dim();
  ffn_ = m.ffn_hidden / t;
  vocab_local_ = m.padded_vocab(t) / t;
  vocab_start_ = cfg_.tp_rank * vocab_local_;

  const int last = cfg_.first_layer + cfg_.n_layers;
  const int64_t local_experts = m.moe() ? m.num_experts / cfg_.ep : 0;
  std::vector<Shape> shapes;  // of params_
  for (const ParamSpec& p : GptParams(m, t)) {
    bool held = false;
    if (p.name == "embedding.word") held = cfg_.has_embedding || cfg_.has_output;
    else if (p.name == "embedding.position") held = cfg_.has_embedding;
    else if (p.layer >= 0) held = p.layer >= cfg_.first_layer && p.layer < last;
    else held = cfg_.has_output;  // final_ln.*
    if (held && p.expert >= 0) held = p.expert / local_experts == cfg_.ep_rank;
    if (!held) continue;
    ChunkParam cp;
    cp.spec = p;
    shapes.push_back(Shape(LocalShape(p, ShardDegree(p, t, cfg_.etp))));
    cp.tp_partial_grad = cfg_.sequence_parallel && p.shard == ShardKind::kReplicated;
    params_.push_back(std::move(cp));
  }
  // Values and gradients: views of one buffer each, by BufferOrder (see grad_buffer()); the
  // gradients zeroed, the values each parameter's InitShard (rounded to bf16 with bf16).
  int64_t total = 0;
  for (int order = 0; order < kBufferOrders; ++order)
    for (size_t i = 0; i < params_.size(); ++i)
      if (BufferOrder(params_[i].spec) == order) {
        params_[i].offset = total;
        total += shapes[i].numel();
        if (BufferGroup(params_[i].spec) == 0) replicated_numel_ = total;
      }
  PTDP_ASSIGN_OR_RETURN(values_, be_.AllocUninit(Shape({std::max<int64_t>(total, 1)}), act_));
  PTDP_ASSIGN_OR_RETURN(grads_, F32(Shape({std::max<int64_t>(total, 1)})));
  for (size_t i = 0; i < params_.size(); ++i) {
    ChunkParam& cp = params_[i];
    cp.value = values_.View(shapes[i], cp.offset);
    cp.grad = grads_.View(shapes[i], cp.offset);
    std::vector<float> host(size_t(cp.value.numel()));
    InitialValue(cp, host.data());
    PTDP_RETURN_IF_ERROR(be_.CopyFromHost(host.data(), cp.value));  // bf16: rounded
  }
  // params_ is final: pointers into it stay valid.
  word_ = Find("embedding.word");
  position_ = Find("embedding.position");
  final_w_ = Find("final_ln.weight");
  final_b_ = Find("final_ln.bias");
  for (int l = cfg_.first_layer; l < last; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    LayerRefs w{Find(p + "ln1.weight"),      Find(p + "ln1.bias"),
                Find(p + "attn.qkv.weight"), Find(p + "attn.qkv.bias"),
                Find(p + "attn.proj.weight"), Find(p + "attn.proj.bias"),
                Find(p + "ln2.weight"),      Find(p + "ln2.bias"),
                Find(p + "mlp.fc1.weight"),  Find(p + "mlp.fc1.bias"),
                Find(p + "mlp.fc2.weight"),  Find(p + "mlp.fc2.bias")};
    if (m.is_moe_layer(l)) {
      w.moe = true;
      w.router = Find(p + "moe.router.weight");
      w.shared_fc1 = Find(p + "moe.shared.fc1.weight");
      w.shared_fc2 = Find(p + "moe.shared.fc2.weight");
      for (int64_t g = 0; g < local_experts; ++g) {
        const std::string e = p + "moe.experts." + std::to_string(cfg_.ep_rank * local_experts + g);
        w.expert_fc1.push_back(Find(e + ".fc1.weight"));
        w.expert_fc2.push_back(Find(e + ".fc2.weight"));
      }
    }
    layers_.push_back(std::move(w));
  }
  if (cfg_.has_output) {
    std::vector<float> mask(size_t(vocab_local_), 0.0f);
    for (int64_t v = 0; v < vocab_local_; ++v)
      if (vocab_start_ + v >= m.vocab) mask[size_t(v)] = kMaskedLogit;
    PTDP_ASSIGN_OR_RETURN(vocab_mask_, Out({vocab_local_}));
    PTDP_RETURN_IF_ERROR(be_.CopyFromHost(mask.data(), vocab_mask_));
  }
  return Status::Ok();
}

void GptChunk::InitialValue(const ChunkParam& p, float* out) const {
  const int shard = p.spec.expert >= 0 ? cfg_.etp_rank : cfg_.tp_rank;
  InitShard(p.spec, cfg_.seed, ShardDegree(p.spec, cfg_.tp, cfg_.etp), shard, out);
}

ChunkParam* GptChunk::Find(const std::string& name) {
  for (ChunkParam& p : params_)
    if (p.spec.name == name) return &p;
  return nullptr;
}

void GptChunk::ZeroGrads() { be_.Fill(0.0f, grads_); }

Status GptChunk::FinalizeTpGrads() {
  if (!cfg_.sequence_parallel || cfg_.tp == 1 || replicated_numel_ == 0) return Status::Ok();
  Tensor partial = grads_.View(Shape({replicated_numel_}));  // the tp_partial_grad ones
  return tp_comm_.AllReduce(partial, ReduceOp::kSum);
}

void GptChunk::Release(int slot) { saved_.erase(slot); }

// ---- helpers -------------------------------------------------------------------------------

Result<Tensor> GptChunk::F32(const Shape& shape) { return be_.Alloc(shape, DType::kF32); }
Result<Tensor> GptChunk::Out(const Shape& shape) { return be_.AllocUninit(shape, act_); }
Result<Tensor> GptChunk::ActZeros(const Shape& shape) { return be_.Alloc(shape, act_); }
Result<Tensor> GptChunk::Stat(const Shape& shape) { return be_.AllocUninit(shape, DType::kF32); }

Result<Tensor> GptChunk::ToAct(const Tensor& x) {
  if (x.dtype() == act_) return x;
  PTDP_ASSIGN_OR_RETURN(Tensor out, Out(x.shape()));
  be_.Copy(x, out);
  return out;
}

Result<Tensor> GptChunk::I32(const std::vector<int32_t>& host) {
  PTDP_ASSIGN_OR_RETURN(Tensor t, be_.Alloc({std::max<int64_t>(int64_t(host.size()), 1)},
                                            DType::kI32));
  if (!host.empty()) {
    Tensor v = t.View(Shape({int64_t(host.size())}));
    PTDP_RETURN_IF_ERROR(be_.CopyFromHost(host.data(), v));
  }
  return t.View(Shape({int64_t(host.size())}));
}

// (b, s) batch-first ids -> (s*b) seq-first ids. Through the host: ids are b*s integers, and the
// Backend has no transpose.
Result<Tensor> GptChunk::SeqFirstIds(const Tensor& ids_bs) {
  assert(ids_bs.dtype() == DType::kI32 && ids_bs.shape().rank() == 2 && ids_bs.shape()[1] == s_);
  const int64_t b = ids_bs.shape()[0];
  std::vector<int32_t> bs(size_t(b * s_)), sb(size_t(b * s_));
  PTDP_RETURN_IF_ERROR(be_.CopyToHost(ids_bs, bs.data()));
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ti = 0; ti < s_; ++ti) sb[size_t(ti * b + bi)] = bs[size_t(bi * s_ + ti)];
  PTDP_ASSIGN_OR_RETURN(Tensor out, be_.Alloc({b * s_}, DType::kI32));
  PTDP_RETURN_IF_ERROR(be_.CopyFromHost(sb.data(), out));
  return out;
}

int64_t GptChunk::GlobalPosition(int64_t u) const {
  return cfg_.cp == 1 ? u : CpBlock(cfg_.cp_rank).Position(u);
}

SeqBlock GptChunk::CpBlock(int cp_rank) const {
  return LoadBalancedChunks(seq_, cfg_.cp, cp_rank);
}

// This rank's position ids (sl*b) i32: row t*b + bi of the local sequence holds t's global
// position.
Result<Tensor> GptChunk::PositionIds(int64_t b) {
  if (position_ids_b_ != b) {
    std::vector<int32_t> ids(size_t(s_ * b));
    for (int64_t ti = 0; ti < s_; ++ti)
      for (int64_t bi = 0; bi < b; ++bi) ids[size_t(ti * b + bi)] = int32_t(GlobalPosition(ti));
    PTDP_ASSIGN_OR_RETURN(position_ids_, be_.Alloc({s_ * b}, DType::kI32));
    PTDP_RETURN_IF_ERROR(be_.CopyFromHost(ids.data(), position_ids_));
    position_ids_b_ = b;
  }
  const int64_t first = cfg_.sequence_parallel ? cfg_.tp_rank * sl_ * b : 0;
  return position_ids_.View({sl_ * b}, first);
}

Result<Tensor> GptChunk::GatherSeq(const Tensor& x) {
  if (!cfg_.sequence_parallel || cfg_.tp == 1) return x;
  PTDP_ASSIGN_OR_RETURN(Tensor full, Out({x.shape()[0] * cfg_.tp, x.shape()[1]}));
  PTDP_RETURN_IF_ERROR(tp_comm_.AllGather(x, full));
  return full;
}

Result<Tensor> GptChunk::ReduceSeq(Tensor& partial) {
  if (cfg_.tp == 1) return partial;
  if (!cfg_.sequence_parallel) {
    PTDP_RETURN_IF_ERROR(tp_comm_.AllReduce(partial, ReduceOp::kSum));
    return partial;
  }
  PTDP_ASSIGN_OR_RETURN(Tensor local, Out({partial.shape()[0] / cfg_.tp, partial.shape()[1]}));
  PTDP_RETURN_IF_ERROR(tp_comm_.ReduceScatter(partial, local, ReduceOp::kSum));
  return local;
}

// ---- forward ---------------------------------------------------------------------------------

Result<Tensor> GptChunk::Forward(int slot, const Tensor& input, const Tensor& targets,
                                 float loss_scale, const ParamsNeeded& need) {
  if (saved_.count(slot))
    return Status::Error("GptChunk::Forward: micro-batch slot " + Str(slot) + " is in flight");
  auto sv = std::make_unique<Saved>();
  sv->loss_scale = loss_scale_ = loss_scale;
  Tensor x;  // (sl*b, h)
  if (cfg_.has_embedding) {
    assert(input.dtype() == DType::kI32 && input.shape().rank() == 2);
    sv->b = input.shape()[0];
    if (need) PTDP_RETURN_IF_ERROR(need(kEmbeddingGrads));
    PTDP_ASSIGN_OR_RETURN(x, EmbedForward(input, *sv));
  } else {
    assert(input.dtype() == act_ && input.numel() % (sl_ * h_) == 0);
    sv->b = input.numel() / (sl_ * h_);
    PTDP_ASSIGN_OR_RETURN(x, Out({sl_ * sv->b, h_}));
    be_.Copy(input, x);
  }
  sv->layers.resize(layers_.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (need) PTDP_RETURN_IF_ERROR(need(cfg_.first_layer + int(l)));
    PTDP_ASSIGN_OR_RETURN(x, LayerForward(layers_[l], x, sv->b, sv->layers[l]));
  }
  Tensor out = x.View({sl_, sv->b, h_});
  if (cfg_.has_output) {
    if (need) PTDP_RETURN_IF_ERROR(need(kOutputGrads));
    PTDP_ASSIGN_OR_RETURN(out, OutputForward(x, targets, loss_scale, *sv));
  }
  saved_[slot] = std::move(sv);
  return out;
}

// Vocab-parallel lookup of the local rows, g (or SP reduce-scatter), plus positions.
Result<Tensor> GptChunk::EmbedForward(const Tensor& tokens, Saved& sv) {
  const int64_t b = sv.b, n = s_ * b;
  PTDP_ASSIGN_OR_RETURN(sv.tokens, SeqFirstIds(tokens));
  PTDP_ASSIGN_OR_RETURN(Tensor partial, Out({n, h_}));
  be_.EmbeddingForward(sv.tokens, word_->value, vocab_start_, partial);
  PTDP_ASSIGN_OR_RETURN(Tensor x, ReduceSeq(partial));  // (sl*b, h)
  PTDP_ASSIGN_OR_RETURN(sv.positions, PositionIds(b));
  PTDP_ASSIGN_OR_RETURN(Tensor pos, Out({sl_ * b, h_}));
  be_.EmbeddingForward(sv.positions, position_->value, 0, pos);
  be_.Add(x, pos, x);
  return x;
}

Result<Tensor> GptChunk::LayerForward(const LayerRefs& w, const Tensor& x, int64_t b,
                                      LayerSaved& sv, bool recomputing) {
  const int64_t nl = sl_ * b, n = s_ * b;
  sv.x = x;
  // Attention: x2 = x + proj(attn(qkv(LN1(x)))).
  PTDP_ASSIGN_OR_RETURN(Tensor ln1, Out({nl, h_}));
  PTDP_ASSIGN_OR_RETURN(sv.ln1_mean, Stat({nl}));
  PTDP_ASSIGN_OR_RETURN(sv.ln1_rstd, Stat({nl}));
  be_.LayerNormForward(x, w.ln1_w->value, w.ln1_b->value, kLnEps, ln1, sv.ln1_mean, sv.ln1_rstd);
  PTDP_ASSIGN_OR_RETURN(sv.ln1_full, GatherSeq(ln1));
  PTDP_ASSIGN_OR_RETURN(sv.qkv, Out({n, 3 * attn_}));
  be_.MatmulBias(sv.ln1_full, false, w.qkv_w->value, true, w.qkv_b->value, sv.qkv);
  PTDP_RETURN_IF_ERROR(AttentionCore(sv, b));
  PTDP_ASSIGN_OR_RETURN(Tensor proj, Out({n, h_}));
  be_.Matmul(sv.att, false, w.proj_w->value, true, proj);
  if (cfg_.recompute == Recompute::kSelective && !recomputing) {  // redone from sv.qkv
    sv.att_saved = Tensor();
    sv.lse = Tensor();
    sv.att = Tensor();
  }
  PTDP_ASSIGN_OR_RETURN(sv.x2, ReduceSeq(proj));
  // MLP: out = x2 + fc2(gelu(fc1(LN2(x2)))); x2 and LN2(x2) in one op (fused on CUDA).
  PTDP_ASSIGN_OR_RETURN(Tensor ln2, Out({nl, h_}));
  PTDP_ASSIGN_OR_RETURN(sv.ln2_mean, Stat({nl}));
  PTDP_ASSIGN_OR_RETURN(sv.ln2_rstd, Stat({nl}));
  be_.AddBiasResidualLayerNorm(sv.x2, w.proj_b->value, x, w.ln2_w->value, w.ln2_b->value, kLnEps,
                               ln2, sv.ln2_mean, sv.ln2_rstd);
  PTDP_ASSIGN_OR_RETURN(sv.ln2_full, GatherSeq(ln2));
  Tensor out;  // (sl*b, h) the MLP's output
  if (w.moe) {
    sv.moe = std::make_shared<MoeSaved>();
    PTDP_ASSIGN_OR_RETURN(out, MoeForward(w, ln2, sv.ln2_full, *sv.moe));
    if (!recomputing)
      expert_rows_.push_back(std::accumulate(sv.moe->expert_rows.begin(),
                                             sv.moe->expert_rows.end(), int64_t(0)));
    be_.Add(out, sv.x2, out);
  } else {
    PTDP_ASSIGN_OR_RETURN(sv.fc1, Out({n, ffn_}));
    PTDP_ASSIGN_OR_RETURN(sv.gelu, Out({n, ffn_}));
    be_.MatmulBiasGelu(sv.ln2_full, false, w.fc1_w->value, true, w.fc1_b->value, sv.fc1, sv.gelu);
    PTDP_ASSIGN_OR_RETURN(Tensor fc2, Out({n, h_}));
    be_.Matmul(sv.gelu, false, w.fc2_w->value, true, fc2);
    PTDP_ASSIGN_OR_RETURN(out, ReduceSeq(fc2));
    be_.AddBiasResidual(out, w.fc2_b->value, sv.x2);
  }
  if (cfg_.recompute == Recompute::kFull && !recomputing) {  // keep the input; rerun later
    Tensor input = sv.x;
    sv = LayerSaved();
    sv.x = input;
  }
  return out;
}

Status GptChunk::RestoreForBackward(const LayerRefs& w, int64_t b, LayerSaved& sv) {
  if (cfg_.recompute == Recompute::kFull) {
    LayerSaved fresh;
    auto out = LayerForward(w, sv.x, b, fresh, /*recomputing=*/true);
    PTDP_RETURN_IF_ERROR(out.status());
    sv = std::move(fresh);
  } else if (cfg_.recompute == Recompute::kSelective) {
    PTDP_RETURN_IF_ERROR(AttentionCore(sv, b));
  }
  return Status::Ok();
}

// ---- attention core: whole sequence, or the CP ring -----------------------------------------

Status GptChunk::RingExchange(const std::vector<const Tensor*>& out,
                              const std::vector<Tensor*>& in) {
  const int c = cfg_.cp, next = (cfg_.cp_rank + 1) % c, prev = (cfg_.cp_rank + c - 1) % c;
  PTDP_RETURN_IF_ERROR(cp_comm_->GroupStart());
  Status st;
  for (const Tensor* t : out)
    if (st.ok()) st = cp_comm_->Send(*t, next);
  for (Tensor* t : in)
    if (st.ok()) st = cp_comm_->Recv(*t, prev);
  const Status end = cp_comm_->GroupEnd();
  PTDP_RETURN_IF_ERROR(st);
  return end;
}

Status GptChunk::AttentionCore(LayerSaved& sv, int64_t b) {
  const int64_t n = s_ * b;
  const Tensor qkv3 = sv.qkv.View({s_, b, 3 * attn_});
  if (cfg_.cp == 1) {
    PTDP_ASSIGN_OR_RETURN(sv.att, Out({n, attn_}));
    Tensor att3 = sv.att.View({s_, b, attn_});
    PTDP_ASSIGN_OR_RETURN(sv.att_saved, Stat(be_.AttentionSavedShape(b, s_, nh_, attn_ / nh_)));
    be_.AttentionForward(qkv3, nh_, TokenOrder::kSeqFirst, att3, sv.att_saved);
    return Status::Ok();
  }
  // Ring: step i merges the K/V block of CP rank (me - i) mod c, then passes it on. The merge
  // runs in fp32 (as Transformer Engine's CP); the output is stored in act_ after the last block.
  const int c = cfg_.cp;
  PTDP_ASSIGN_OR_RETURN(Tensor merged, Stat({n, attn_}));
  Tensor att3 = merged.View({s_, b, attn_});
  PTDP_ASSIGN_OR_RETURN(sv.lse, Stat({b, nh_, s_}));
  PTDP_ASSIGN_OR_RETURN(Tensor kv, Out({n, 2 * attn_}));
  be_.CopyColumns(sv.qkv, attn_, kv, 0, 2 * attn_);
  const SeqBlock mine = CpBlock(cfg_.cp_rank);
  for (int i = 0; i < c; ++i) {
    const int owner = (cfg_.cp_rank + c - i) % c;
    be_.AttentionBlockForward(qkv3, mine, kv.View({s_, b, 2 * attn_}), CpBlock(owner), nh_,
                              i == 0, att3, sv.lse);
    if (i + 1 == c) break;
    PTDP_ASSIGN_OR_RETURN(Tensor next, Out({n, 2 * attn_}));
    PTDP_RETURN_IF_ERROR(RingExchange({&kv}, {&next}).Prefixed("CP ring (attention forward)"));
    kv = next;
  }
  PTDP_ASSIGN_OR_RETURN(sv.att, ToAct(merged));
  return Status::Ok();
}

Result<Tensor> GptChunk::AttentionCoreBackward(const Tensor& datt, const LayerSaved& sv,
                                               int64_t b) {
  const int64_t n = s_ * b;
  // Overwritten by the whole-sequence backward; the CP blocks add to it (zeroed).
  PTDP_ASSIGN_OR_RETURN(Tensor dqkv, cfg_.cp == 1 ? Out({n, 3 * attn_}) : F32({n, 3 * attn_}));
  Tensor dqkv3 = dqkv.View({s_, b, 3 * attn_});
  const Tensor qkv3 = sv.qkv.View({s_, b, 3 * attn_});
  const Tensor datt3 = datt.View({s_, b, attn_}), att3 = sv.att.View({s_, b, attn_});
  if (cfg_.cp == 1) {
    be_.AttentionBackward(datt3, qkv3, att3, sv.att_saved, nh_, TokenOrder::kSeqFirst, dqkv3);
    return dqkv;
  }
  // The K/V block travels the ring again with its gradient accumulator dkv; after c - 1 hops
  // the accumulator at rank r belongs to rank r + 1: one more hop brings each home.
  const int c = cfg_.cp;
  PTDP_ASSIGN_OR_RETURN(Tensor kv, Out({n, 2 * attn_}));
  be_.CopyColumns(sv.qkv, attn_, kv, 0, 2 * attn_);
  PTDP_ASSIGN_OR_RETURN(Tensor dkv, F32({n, 2 * attn_}));
  const SeqBlock mine = CpBlock(cfg_.cp_rank);
  for (int i = 0; i < c; ++i) {
    const int owner = (cfg_.cp_rank + c - i) % c;
    Tensor dkv3 = dkv.View({s_, b, 2 * attn_});
    be_.AttentionBlockBackward(datt3, qkv3, mine, kv.View({s_, b, 2 * attn_}), CpBlock(owner),
                               att3, sv.lse, nh_, dqkv3, dkv3);
    PTDP_ASSIGN_OR_RETURN(Tensor next_dkv, Stat({n, 2 * attn_}));  // fp32, as dkv
    if (i + 1 == c) {
      PTDP_RETURN_IF_ERROR(
          RingExchange({&dkv}, {&next_dkv}).Prefixed("CP ring (dK/dV home)"));
      dkv = next_dkv;
      break;
    }
    PTDP_ASSIGN_OR_RETURN(Tensor next_kv, Out({n, 2 * attn_}));
    PTDP_RETURN_IF_ERROR(RingExchange({&kv, &dkv}, {&next_kv, &next_dkv})
                             .Prefixed("CP ring (attention backward)"));
    kv = next_kv;
    dkv = next_dkv;
  }
  be_.CopyColumns(dkv, 0, dqkv, attn_, 2 * attn_);
  return ToAct(dqkv);  // summed in fp32 over the blocks, stored once
}

// Final LN, (SP all-gather), local logits against the tied embedding shard, vocab-parallel CE.
Result<Tensor> GptChunk::OutputForward(const Tensor& x, const Tensor& targets, float loss_scale,
                                       Saved& sv) {
  const int64_t nl = sl_ * sv.b, n = s_ * sv.b;
  sv.final_x = x;
  PTDP_ASSIGN_OR_RETURN(Tensor lnf, Out({nl, h_}));
  PTDP_ASSIGN_OR_RETURN(sv.lnf_mean, Stat({nl}));
  PTDP_ASSIGN_OR_RETURN(sv.lnf_rstd, Stat({nl}));
  be_.LayerNormForward(x, final_w_->value, final_b_->value, kLnEps, lnf, sv.lnf_mean,
                       sv.lnf_rstd);
  PTDP_ASSIGN_OR_RETURN(sv.lnf_full, GatherSeq(lnf));
  PTDP_ASSIGN_OR_RETURN(sv.logits, Out({n, vocab_local_}));
  // The padded vocabulary's mask as the GEMM's bias (on CUDA its epilogue: no pass of its own
  // over the (tokens, vocabulary) logits).
  be_.MatmulBias(sv.lnf_full, false, word_->value, true, vocab_mask_, sv.logits);
  PTDP_ASSIGN_OR_RETURN(sv.targets, SeqFirstIds(targets));
  const bool reduce = cfg_.tp > 1;
  PTDP_ASSIGN_OR_RETURN(sv.row_max, Stat({n}));
  be_.CrossEntropyMax(sv.logits, sv.row_max);
  if (reduce) PTDP_RETURN_IF_ERROR(tp_comm_.AllReduce(sv.row_max, ReduceOp::kMax));
  PTDP_ASSIGN_OR_RETURN(sv.sum_exp, Stat({n}));
  be_.CrossEntropySumExp(sv.logits, sv.row_max, sv.sum_exp);
  if (reduce) PTDP_RETURN_IF_ERROR(tp_comm_.AllReduce(sv.sum_exp, ReduceOp::kSum));
  PTDP_ASSIGN_OR_RETURN(Tensor target_logit, Stat({n}));
  be_.CrossEntropyTarget(sv.logits, sv.targets, vocab_start_, target_logit);
  if (reduce) PTDP_RETURN_IF_ERROR(tp_comm_.AllReduce(target_logit, ReduceOp::kSum));
  PTDP_ASSIGN_OR_RETURN(Tensor rows, Stat({n}));
  be_.CrossEntropyLoss(sv.row_max, sv.sum_exp, target_logit, rows);
  PTDP_ASSIGN_OR_RETURN(Tensor loss, F32({1}));
  be_.Sum(rows, loss);
  sv.row_scale = loss_scale / float(seq_ * sv.b);  // over the whole sequences (CP: partial)
  be_.Scale(sv.row_scale, loss);
  return loss;
}

// ---- backward --------------------------------------------------------------------------------

int GptChunk::GradsDoneAt(const ParamSpec& p) const {
  if (p.layer >= 0) return p.layer;
  if (p.name == "embedding.position") return kEmbeddingGrads;
  if (p.name == "embedding.word") return cfg_.has_embedding ? kEmbeddingGrads : kOutputGrads;
  return kOutputGrads;  // final_ln.*
}

Result<Tensor> GptChunk::Backward(int slot, const Tensor& grad_output, const GradsDone& done) {
  auto it = saved_.find(slot);
  if (it == saved_.end())
    return Status::Error("GptChunk::Backward: micro-batch slot " + Str(slot) + " not in flight");
  std::unique_ptr<Saved> sv = std::move(it->second);
  saved_.erase(it);
  Tensor dx;  // (sl*b, h)
  if (cfg_.has_output) {
    PTDP_ASSIGN_OR_RETURN(dx, OutputBackward(*sv));
    // Its saved tensors go now, as autograd frees them, before a layer is recomputed.
    sv->final_x = sv->lnf_mean = sv->lnf_rstd = sv->lnf_full = Tensor();
    sv->logits = sv->targets = sv->row_max = sv->sum_exp = Tensor();
    if (done) PTDP_RETURN_IF_ERROR(done(kOutputGrads));
  } else {
    assert(grad_output.numel() == sl_ * sv->b * h_);
    dx = grad_output.View({sl_ * sv->b, h_});
  }
  loss_scale_ = sv->loss_scale;  // for a full recompute's rerun of MoE layers
  for (size_t l = layers_.size(); l-- > 0;) {
    LayerSaved& ls = sv->layers[l];
    PTDP_RETURN_IF_ERROR(RestoreForBackward(layers_[l], sv->b, ls).Prefixed("recompute"));
    PTDP_ASSIGN_OR_RETURN(dx, LayerBackward(layers_[l], dx, sv->b, ls));
    ls = LayerSaved();  // freed as soon as its backward is done
    if (done) PTDP_RETURN_IF_ERROR(done(cfg_.first_layer + int(l)));
  }
  if (cfg_.has_embedding) {
    PTDP_RETURN_IF_ERROR(EmbedBackward(dx, *sv));
    if (done) PTDP_RETURN_IF_ERROR(done(kEmbeddingGrads));
    return Tensor();
  }
  return dx.View({sl_, sv->b, h_});
}

Result<Tensor> GptChunk::OutputBackward(const Saved& sv) {
  const int64_t nl = sl_ * sv.b, n = s_ * sv.b;
  Tensor dlogits = sv.logits;  // in place: the logits are not needed again
  be_.CrossEntropyBackward(sv.logits, sv.targets, vocab_start_, sv.row_max, sv.sum_exp,
                           sv.row_scale, dlogits);
  be_.Matmul(dlogits, true, sv.lnf_full, false, word_->grad, 1.0f, 1.0f);
  PTDP_ASSIGN_OR_RETURN(Tensor dlnf_full, Out({n, h_}));
  be_.Matmul(dlogits, false, word_->value, false, dlnf_full);
  PTDP_ASSIGN_OR_RETURN(Tensor dlnf, ReduceSeq(dlnf_full));  // f backward (SP: reduce-scatter)
  PTDP_ASSIGN_OR_RETURN(Tensor dx, ActZeros({nl, h_}));      // LN backward adds
  be_.LayerNormBackward(dlnf, sv.final_x, final_w_->value, sv.lnf_mean, sv.lnf_rstd, dx,
                        final_w_->grad, final_b_->grad);
  return dx;
}

// dout (sl*b, h) is read only; returns a new (sl*b, h) gradient of the layer input.
Result<Tensor> GptChunk::LayerBackward(const LayerRefs& w, const Tensor& dout, int64_t b,
                                       const LayerSaved& sv) {
  const int64_t nl = sl_ * b, n = s_ * b;
  // The residual passes dout to x2 (and on to x): dx accumulates in one buffer.
  PTDP_ASSIGN_OR_RETURN(Tensor dx, Out({nl, h_}));
  be_.Copy(dout, dx);
  // MLP.
  if (w.moe) {
    PTDP_ASSIGN_OR_RETURN(Tensor dln2, MoeBackward(w, dout, *sv.moe));
    be_.LayerNormBackward(dln2, sv.x2, w.ln2_w->value, sv.ln2_mean, sv.ln2_rstd, dx,
                          w.ln2_w->grad, w.ln2_b->grad);
    return AttentionBackward(w, b, sv, dx);
  }
  be_.BiasGrad(dout, w.fc2_b->grad);
  PTDP_ASSIGN_OR_RETURN(Tensor dfc2, GatherSeq(dout));  // g backward (SP: all-gather)
  be_.Matmul(dfc2, true, sv.gelu, false, w.fc2_w->grad, 1.0f, 1.0f);
  PTDP_ASSIGN_OR_RETURN(Tensor dh, Out({n, ffn_}));
  // FC2's dgrad through the GeLU in one call (CUDA: cuBLASLt's DGELU epilogue).
  be_.MatmulGeluBackward(dfc2, false, w.fc2_w->value, false, sv.fc1, dh);
  be_.BiasGrad(dh, w.fc1_b->grad);
  be_.Matmul(dh, true, sv.ln2_full, false, w.fc1_w->grad, 1.0f, 1.0f);
  PTDP_ASSIGN_OR_RETURN(Tensor dln2_full, Out({n, h_}));
  be_.Matmul(dh, false, w.fc1_w->value, false, dln2_full);
  PTDP_ASSIGN_OR_RETURN(Tensor dln2, ReduceSeq(dln2_full));  // f backward
  be_.LayerNormBackward(dln2, sv.x2, w.ln2_w->value, sv.ln2_mean, sv.ln2_rstd, dx,
                        w.ln2_w->grad, w.ln2_b->grad);
  return AttentionBackward(w, b, sv, dx);
}

// The attention block's backward; dx (sl*b, h) holds the gradient of x2 and receives x's.
Result<Tensor> GptChunk::AttentionBackward(const LayerRefs& w, int64_t b, const LayerSaved& sv,
                                           Tensor dx) {
  const int64_t n = s_ * b;
  be_.BiasGrad(dx, w.proj_b->grad);
  PTDP_ASSIGN_OR_RETURN(Tensor dproj, GatherSeq(dx));  // without SP this is dx itself
  be_.Matmul(dproj, true, sv.att, false, w.proj_w->grad, 1.0f, 1.0f);
  PTDP_ASSIGN_OR_RETURN(Tensor datt, Out({n, attn_}));
  be_.Matmul(dproj, false, w.proj_w->value, false, datt);
  PTDP_ASSIGN_OR_RETURN(Tensor dqkv, AttentionCoreBackward(datt, sv, b));
  be_.BiasGrad(dqkv, w.qkv_b->grad);
  be_.Matmul(dqkv, true, sv.ln1_full, false, w.qkv_w->grad, 1.0f, 1.0f);
  PTDP_ASSIGN_OR_RETURN(Tensor dln1_full, Out({n, h_}));
  be_.Matmul(dqkv, false, w.qkv_w->value, false, dln1_full);
  PTDP_ASSIGN_OR_RETURN(Tensor dln1, ReduceSeq(dln1_full));  // f backward
  be_.LayerNormBackward(dln1, sv.x, w.ln1_w->value, sv.ln1_mean, sv.ln1_rstd, dx,
                        w.ln1_w->grad, w.ln1_b->grad);
  return dx;
}

Status GptChunk::EmbedBackward(const Tensor& dx, const Saved& sv) {
  be_.EmbeddingBackward(dx, sv.positions, 0, position_->grad);
  PTDP_ASSIGN_OR_RETURN(Tensor dfull, GatherSeq(dx));  // g backward (SP: all-gather)
  be_.EmbeddingBackward(dfull, sv.tokens, vocab_start_, word_->grad);
  return Status::Ok();
}

}  // namespace ptdp::rt
