// GptChunk: one pipeline chunk of the runtime's GPT model (pre-LN decoder, learned positions,
// GeLU MLP, causal multi-head attention, final LN, output tied to the word embedding), written
// once against Backend + Communicator. Tensor parallelism is Megatron's: column-parallel QKV and
// fc1, row-parallel proj and fc2, the f and g operators, vocab-parallel embedding and cross
// entropy (full logits never gathered), optional sequence parallelism.
//
// Letters: b micro-batch, S the model's sequence length, c CP size, s = S/c the rows of the
// sequence this rank holds, h hidden, t TP size, sl = s/t with SP else s, A = h/t (local
// attention width), F = ffn/t, Vl = padded vocabulary / t.
//
// Context parallelism (Megatron's causal load balancing): the sequence is cut into 2c chunks of
// S/(2c) tokens; CP rank i holds chunks i and 2c-1-i, stored as s consecutive rows (inputs and
// targets arrive already cut so). Everything but attention is row-wise; attention is a ring
// over the CP group: each rank's K/V block visits every rank (c-1 exchanges), which merges it
// into its queries' output with the online softmax (Backend::AttentionBlockForward); the
// backward sends the K/V block round again with its gradient accumulator, and a last hop brings
// each block's dK/dV home.
//
// Recompute (Megatron --recompute-granularity): selective recomputes the core attention (the
// s x s probabilities and the attention output, from the saved QKV) in the backward; full keeps
// only each layer's input and reruns the layer's forward (its TP and CP communication
// included) just before its backward.
// Activations are kSeqFirst, (s, b, h) row-major (Megatron), so an SP chunk is rows
// [r*sl*b, (r+1)*sl*b) of the full activation and the SP all-gather / reduce-scatter run along
// dimension 0.
//
//   x --LN1--[SP all-gather | f]--QKV--attn--proj--[SP reduce-scatter | g]--(+x)--> x2
//   x2 --LN2--[SP all-gather | f]--fc1--GeLU--fc2--[SP reduce-scatter | g]--(+x2)--> out
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/layout.h"
#include "core/model.h"
#include "core/status.h"
#include "runtime/backend.h"
#include "runtime/communicator.h"
#include "runtime/params.h"
#include "runtime/tensor.h"

namespace ptdp::rt {

// Megatron's causal load balancing for context parallelism: a sequence of `seq` tokens is cut
// into 2c chunks and CP rank r of c holds chunks r and 2c-1-r (as its rows, in that order).
inline SeqBlock LoadBalancedChunks(int64_t seq, int cp, int cp_rank) {
  SeqBlock blk;
  blk.len = seq / (2 * cp);
  blk.first0 = cp_rank * blk.len;
  blk.first1 = (2 * cp - 1 - cp_rank) * blk.len;
  return blk;
}

struct GptChunkConfig {
  ModelSpec model;                 // GPT shape: gelu, layernorm, learned positions, tied, bias
  int first_layer = 0;             // first transformer layer of the model held here
  int n_layers = 0;                // layers [first_layer, first_layer + n_layers); may be 0
  bool has_embedding = false;      // holds the word + position embedding (model's first stage)
  bool has_output = false;         // holds final LN + tied output + loss (model's last stage)
  int tp = 1;                      // TP size t (the TP communicator's size)
  int tp_rank = 0;                 // this rank's index in the TP group
  bool sequence_parallel = false;  // Megatron SP (needs s % t == 0)
  int cp = 1;                      // CP size c (the CP communicator's size); S % (2c) == 0
  int cp_rank = 0;                 // this rank's index in the CP group
  Recompute recompute = Recompute::kNone;  // what the backward recomputes (see above)
  // MoE layers (runtime/moe.cc): the expert grid's EP and expert-TP sizes and this rank's
  // indices in them (core/rank_grid.h); EP rank i holds experts [i E/ep, (i+1) E/ep).
  int ep = 1, ep_rank = 0;
  int etp = 1, etp_rank = 0;
  uint64_t seed = 0;               // initialisation seed (InitShard)
  // Megatron --bf16 (backend.h's dtype rules): the activations, their gradients and the
  // weights (values) in bf16; statistics and the weights' gradients fp32. Off: all fp32.
  bool bf16 = false;
};

// The communicators a chunk uses; each must outlive the chunk. tp is required; cp is required
// when cp > 1.
struct GptChunkComms {
  Communicator* tp = nullptr;  // TP group (size t, rank tp_rank)
  Communicator* cp = nullptr;  // CP group (size c, rank cp_rank), group order = CP index
  // MoE models only (required when the chunk holds an MoE layer): the EP and expert-TP groups,
  // and the TP x CP group of the ranks that share a micro-batch's tokens (the auxiliary loss
  // counts tokens per expert over it; may be null when t * c == 1).
  Communicator* ep = nullptr;
  Communicator* etp = nullptr;
  Communicator* tokens = nullptr;
};

// One parameter shard and its gradient.
struct ChunkParam {
  ParamSpec spec;               // global name, shape and sharding (GptParams at this t)
  Tensor value;                 // this rank's shard, LocalShape(spec, t), fp32 (bf16 with
                                // GptChunkConfig::bf16: the model's copy of the weights); a
                                // view of the chunk's value_buffer() at offset
  Tensor grad;                  // same shape, fp32; Backward adds to it, ZeroGrads clears it;
                                // a view of the chunk's grad_buffer() at offset
  int64_t offset = 0;
  bool tp_partial_grad = false;  // with SP each TP rank holds a partial sum of this grad
                                 // (LN, row-parallel biases, positions): FinalizeTpGrads sums
};

class GptChunk {
 public:
  // Allocates and initialises this rank's parameter shards (InitShard, so every layout starts
  // from the same weights) and zeroed grads on `backend`. `tp_comm` is the TP group (size t,
  // rank tp_rank). Both must outlive the chunk. Fails on a model or range this chunk cannot run
  // (not GPT-shaped, heads % t, SP with s % t, layers out of range, communicator mismatch) or
  // when the backend cannot allocate.
  static Result<std::unique_ptr<GptChunk>> Create(const GptChunkConfig& cfg, Backend& backend,
                                                  const GptChunkComms& comms);
  // The same without CP.
  static Result<std::unique_ptr<GptChunk>> Create(const GptChunkConfig& cfg, Backend& backend,
                                                  Communicator& tp_comm);
  ~GptChunk();
  GptChunk(const GptChunk&) = delete;
  GptChunk& operator=(const GptChunk&) = delete;

  // Runs micro-batch `slot` forward and keeps what its Backward needs until then (several slots
  // may be in flight; a slot in flight is an error).
  //  input: has_embedding: token ids (b, s) i32, batch-first as the DataLoader writes them
  //         (this CP rank's two chunks of each sequence, in order);
  //         otherwise the previous chunk's output (sl, b, h) in act_dtype() (copied: the
  //         caller may reuse it after the call).
  //  targets: has_output only: (b, s) i32 next tokens; otherwise ignored (may be undefined).
  //  loss_scale: has_output only: the loss is the sum over this rank's b*s tokens divided by
  //         the b*S tokens of the whole sequences, times loss_scale (the executor passes 1/m,
  //         Megatron's loss / m): with CP the ranks' losses add up to the mean.
  // Returns the output activation (sl, b, h) in act_dtype(), or with has_output the loss, a
  // (1) fp32 tensor equal on every TP rank. Fails when a collective fails or memory runs out.
  //  need (when given): called before each part of the forward with the GradsDoneAt moment of
  //         the parameters it reads (kEmbeddingGrads, each layer, kOutputGrads), in forward
  //         order (the distributed optimizer's --overlap-param-gather waits there for those
  //         parameters' all-gathers); a failure ends the forward.
  using ParamsNeeded = std::function<Status(int moment)>;
  Result<Tensor> Forward(int slot, const Tensor& input, const Tensor& targets, float loss_scale,
                         const ParamsNeeded& need = nullptr);

  // The moments of a backward after which parameters' gradients hold this micro-batch's whole
  // contribution (Megatron's grad-ready hooks, which start the buckets of
  // --overlap-grad-reduce): kOutputGrads after the output layer (final LN; the word embedding of
  // a chunk without the embedding), a transformer layer's index (ParamSpec::layer) after that
  // layer, kEmbeddingGrads after the embedding (word and position).
  static constexpr int kOutputGrads = -2, kEmbeddingGrads = -3;
  // The moment of p (one of params()) in that sense.
  int GradsDoneAt(const ParamSpec& p) const;
  using GradsDone = std::function<Status(int moment)>;  // a failure ends the backward

  // Backward of micro-batch `slot` (then forgotten). grad_output: the gradient of the output
  // (sl, b, h); ignored with has_output (the loss is the output). Adds to every parameter's
  // grad; calls `done` (when given) at each moment of GradsDoneAt, in backward order, and fails
  // with it.
  // Returns the gradient of the input (sl, b, h), or an undefined Tensor with
  // has_embedding. Fails on a slot not in flight, a failed collective or memory.
  Result<Tensor> Backward(int slot, const Tensor& grad_output, const GradsDone& done = nullptr);

  // Forgets a slot's saved state without a backward (forward-only evaluation). No-op if absent.
  void Release(int slot);

  // Sets every grad to zero (before the first micro-batch of a step): one fill of grad_buffer().
  void ZeroGrads();

  // With SP and t > 1: all-reduces (SUM) over TP the grads marked tp_partial_grad, after the
  // last Backward of a step (Megatron's finalize): one all-reduce of BufferGroup 0, which leads
  // grad_buffer().
  // Without SP those grads are already equal on every TP rank: nothing to do.
  Status FinalizeTpGrads();

  // Every parameter's gradient, in one fp32 buffer (Megatron's contiguous grad buffer, so that
  // a reduction covers many parameters in one collective), and every parameter's value in one
  // buffer of act_dtype() (its param buffer, so that the optimizer updates many in one call):
  // the same order and offsets, no padding between parameters, ordered by BufferOrder (the
  // replicated ones first, which with SP are the tp_partial_grad ones, then the other dense
  // ones, then the routed experts; each group's weight-decayed ones first), params() order
  // within.
  const Tensor& grad_buffer() const { return grads_; }
  const Tensor& value_buffer() const { return values_; }
  // 0: replicated over TP (norms, row-parallel biases, positions, the router), 1: the other
  // dense parameters, 2: routed experts (reduced over expert DP, not DP x CP).
  static int BufferGroup(const ParamSpec& p) {
    return p.expert >= 0 ? 2 : p.shard == ShardKind::kReplicated ? 0 : 1;
  }
  // The position in the buffers: by BufferGroup, then DecaysWeight first.
  static int BufferOrder(const ParamSpec& p) { return 2 * BufferGroup(p) + (DecaysWeight(p) ? 0 : 1); }
  static constexpr int kBufferOrders = 6;

  // This chunk's parameters in GptParams order: embedding.word (with has_embedding or
  // has_output: one tensor for both uses when the chunk has both), embedding.position, the
  // layers' parameters, final_ln.*.
  // The Tensors are handles: an optimizer writes the values through them in place.
  const std::vector<ChunkParam>& params() const { return params_; }
  // The initial fp32 values of p (one of params()): its shard of InitShard, numel() floats at
  // out. value holds them (rounded to bf16 with GptChunkConfig::bf16, whose trainer keeps these
  // as the fp32 main weights).
  void InitialValue(const ChunkParam& p, float* out) const;
  // The dtype of the activations and weights: bf16 with GptChunkConfig::bf16, else fp32.
  DType act_dtype() const { return act_; }
  // The parameter named `name`, or nullptr when this chunk does not hold it.
  ChunkParam* Find(const std::string& name);

  const GptChunkConfig& config() const { return cfg_; }
  // Micro-batches forwarded but not yet backwarded (or released).
  size_t in_flight() const { return saved_.size(); }

  // The rows this rank's routed experts computed in each MoE layer forward since the last call,
  // in call order (a full recompute's rerun not counted), and forgets them. The trainer's
  // measured expert load (RankTimes::expert_load) comes from these.
  std::vector<int64_t> TakeExpertRows() { return std::exchange(expert_rows_, {}); }

 private:
  Tensor grads_, values_;          // grad_buffer(), value_buffer()
  int64_t replicated_numel_ = 0;  // their leading BufferGroup 0 elements

  struct LayerRefs;   // a layer's parameters
  struct LayerSaved;  // a layer's activations for backward
  struct Saved;       // one micro-batch's activations
  struct MoeSaved;    // an MoE layer's routing and expert activations (runtime/moe.cc)

  GptChunk(const GptChunkConfig& cfg, Backend& backend, const GptChunkComms& comms);
  Status Init();
  // Global position of local sequence row u (CP's two chunks; u itself without CP).
  int64_t GlobalPosition(int64_t u) const;
  SeqBlock CpBlock(int cp_rank) const;  // the positions of CP rank cp_rank's rows
  // The core attention of a layer: sv.qkv -> sv.att, keeping what its backward needs
  // (sv.att_saved without CP, sv.lse with it); the CP ring with cp > 1.
  Status AttentionCore(LayerSaved& sv, int64_t b);
  // Its backward: datt (s*b, A) -> dqkv (s*b, 3A).
  Result<Tensor> AttentionCoreBackward(const Tensor& datt, const LayerSaved& sv, int64_t b);
  // One ring step on the CP group: sends each of `out` to the next CP rank, receives each of
  // `in` from the previous one (posted together).
  Status RingExchange(const std::vector<const Tensor*>& out, const std::vector<Tensor*>& in);

  // A zeroed fp32 tensor (for an accumulator: an op that adds to it); an activation (act_
  // dtype) with unspecified contents (Backend::AllocUninit) for an op's output that the op
  // overwrites whole, and a zeroed one; an fp32 statistic (LayerNorm mean, lse, ...) with
  // unspecified contents; x in act_ (x itself when it is already, else a rounded copy).
  Result<Tensor> F32(const Shape& shape);
  Result<Tensor> Out(const Shape& shape);
  Result<Tensor> ActZeros(const Shape& shape);
  Result<Tensor> Stat(const Shape& shape);
  Result<Tensor> ToAct(const Tensor& x);
  Result<Tensor> SeqFirstIds(const Tensor& ids_bs);
  Result<Tensor> PositionIds(int64_t b);
  // SP: all-gather along s of (sl*b, C) -> (s*b, C); otherwise `x` itself (f forward).
  Result<Tensor> GatherSeq(const Tensor& x);
  // SP: reduce-scatter along s of (s*b, C) -> (sl*b, C); otherwise all-reduce in place (g).
  Result<Tensor> ReduceSeq(Tensor& partial);

  Result<Tensor> EmbedForward(const Tensor& tokens, Saved& sv);
  Status EmbedBackward(const Tensor& dx, const Saved& sv);
  // `recomputing`: the backward's rerun (full recompute), which keeps everything.
  Result<Tensor> LayerForward(const LayerRefs& w, const Tensor& x, int64_t b, LayerSaved& sv,
                              bool recomputing = false);
  // Brings sv back to what LayerBackward reads: reruns the layer (full recompute, sv holds the
  // input only) or the core attention (selective).
  Status RestoreForBackward(const LayerRefs& w, int64_t b, LayerSaved& sv);
  Result<Tensor> LayerBackward(const LayerRefs& w, const Tensor& dout, int64_t b,
                               const LayerSaved& sv);
  // The attention block's backward: dx holds the gradient of x2 (after the MLP's) and becomes
  // the layer input's.
  Result<Tensor> AttentionBackward(const LayerRefs& w, int64_t b, const LayerSaved& sv, Tensor dx);
  Result<Tensor> OutputForward(const Tensor& x, const Tensor& targets, float loss_scale,
                               Saved& sv);
  Result<Tensor> OutputBackward(const Saved& sv);
  // An MoE layer's MLP (runtime/moe.cc): router, dispatch over EP (and expert TP), the local
  // experts, combine, shared experts. x: this rank's (sl*b, h) LN2 output, x_full: it gathered
  // along s with SP (x itself without); returns the (sl*b, h) MLP output.
  Result<Tensor> MoeForward(const LayerRefs& w, const Tensor& x, const Tensor& x_full,
                            MoeSaved& sv);
  // Its backward: dout (sl*b, h) -> the gradient of x (sl*b, h); adds the parameters' grads.
  Result<Tensor> MoeBackward(const LayerRefs& w, const Tensor& dout, const MoeSaved& sv);
  // Rows of `rows_of` (one block per rank of `comm`, counts[q] rows of width w each) gathered
  // to every rank: out holds every rank's block in group order.
  Status AllGatherRows(Communicator& comm, const Tensor& mine, const std::vector<int64_t>& counts,
                       int64_t w, Tensor& out);
  // The inverse: `all` holds a partial block for every rank (counts[q] rows); out (counts[me]
  // rows) = the sum over the ranks of their partials of this rank's block, in group order.
  Status ReduceScatterRows(Communicator& comm, const Tensor& all,
                           const std::vector<int64_t>& counts, int64_t w, Tensor& out);
  Result<Tensor> I32(const std::vector<int32_t>& host);
  // MoE helpers: a (rows, cols) activation (rows may be 0; unspecified until written, as
  // Out); rows idx[i] of src; the EP all-to-all of (rows, h) blocks with per-rank row counts
  // (the input itself at ep 1).
  Result<Tensor> MoeRows(int64_t rows, int64_t cols);
  Result<Tensor> MoeGather(const Tensor& src, const Tensor& idx, int64_t cols);
  Result<Tensor> MoeExchange(const Tensor& in, const std::vector<int64_t>& send,
                             const std::vector<int64_t>& recv, int64_t out_rows,
                             const char* what);
  // With expert TP: every ETP rank's received rows gathered (sv.etp_rows each), and the
  // inverse, this rank's rows summed over the ETP ranks' partials; the input itself at etp 1.
  Result<Tensor> MoeEtpGather(const Tensor& recv, const MoeSaved& sv, const char* what);
  Result<Tensor> MoeEtpReduce(const Tensor& gathered, const MoeSaved& sv, const char* what);

  GptChunkConfig cfg_;
  Backend& be_;
  DType act_ = DType::kF32;  // act_dtype()
  std::vector<int64_t> expert_rows_;  // TakeExpertRows
  Communicator& tp_comm_;
  Communicator* cp_comm_ = nullptr;
  Communicator* ep_comm_ = nullptr;
  Communicator* etp_comm_ = nullptr;
  Communicator* tokens_comm_ = nullptr;
  float loss_scale_ = 1.0f;  // of the micro-batch being run (the MoE auxiliary loss's scale)
  int64_t seq_ = 0;  // S, the whole sequence
  int64_t h_ = 0, s_ = 0, sl_ = 0, nh_ = 0, attn_ = 0, ffn_ = 0, vocab_local_ = 0,
          vocab_start_ = 0;
  std::vector<ChunkParam> params_;
  std::vector<LayerRefs> layers_;
  ChunkParam* word_ = nullptr;       // embedding.word (Vl, h)
  ChunkParam* position_ = nullptr;   // embedding.position (s, h)
  ChunkParam* final_w_ = nullptr;    // final_ln.weight (h)
  ChunkParam* final_b_ = nullptr;    // final_ln.bias (h)
  Tensor vocab_mask_;                // (Vl): 0 for real rows, kMaskedLogit for padded rows
  Tensor position_ids_;              // (s*b) i32, row t*b + bi holds t
  int64_t position_ids_b_ = 0;       // the b position_ids_ was built for
  std::map<int, std::unique_ptr<Saved>> saved_;  // micro-batches in flight, by slot
};

}  // namespace ptdp::rt
