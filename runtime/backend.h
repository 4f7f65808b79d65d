// The Backend: every operation the GPT model needs, forward and backward, behind one interface.
// The model is written once against it; runtime/cpu (own fp32 kernels per x86-64 level) and
// runtime/cuda (bf16 GEMMs with fp32 accumulation, own kernels) implement it. Parallelism is not in here: the
// Communicator moves tensors between ranks, the Backend computes on one rank's tensors.
//
// Letters in shape comments (defined once for this file):
//   N   rows: all leading dimensions of a tensor flattened (b*s tokens for activations)
//   C   channels: the last dimension (h, 3h/t, 4h/t, ...)
//   b   micro-batch, s sequence length, h hidden
//   nh  attention heads on this rank (heads / t), d head dimension, A = nh*d
//   V   vocabulary rows on this rank (the shard [vocab_start, vocab_start + V)), t TP size
//
// Conventions of every op:
//   - Float tensors are fp32 (DType::kF32) or bf16 (DType::kBF16); i32 where the comment says
//     so (token ids, targets). Megatron's --bf16 (TrainerConfig::bf16) stores the activations,
//     their gradients and the weights' model copies in bf16 ("act" below) and keeps the
//     statistics (LayerNorm mean / rstd, attention lse or probabilities, cross entropy's row
//     figures, losses), the weight gradients and the optimizer state in fp32. Every op computes
//     in fp32 (fp32 accumulation, as tensor cores accumulate bf16 products) and rounds to
//     nearest even where it stores into a bf16 output. Which tensor may be which:
//       * GEMMs: a and b of one dtype; c fp32 or that dtype (bf16 products into fp32 weight
//         gradients, or the router's fp32 logits).
//       * Element-wise ops, ScaleRows, RowDot, Copy, the sums, BiasGrad and EmbeddingBackward's
//         gradient in: each float tensor either dtype (their outputs that accumulate are fp32).
//       * The fused ops (LayerNorm, GeLU, attention and its CP blocks, embedding lookups, cross
//         entropy, AddBias): the act tensors of one call share one dtype; the statistics, the
//         parameter gradients, the CP blocks' out / lse / dqkv / dkv accumulators are fp32.
//       * AdamW: every tensor fp32 (the bf16 run's main weights).
//     bf16 stores the top 16 bits of the rounded fp32 value (runtime/bf16.h).
//   - An output is overwritten unless the comment says "adds to" (parameter gradients and the
//     residual-stream gradient accumulate, llm.c style; zero them with Fill before the first
//     micro-batch).
//   - Shape and dtype preconditions are our own invariants: they are assert()ed, not Statuses.
//     Outputs must not overlap inputs unless the comment allows it ("may alias").
//   - Compute ops return nothing. On the CPU they cannot fail; a device backend records its
//     first failure (with file and line) and returns it from the next Synchronize() or
//     CopyToHost(). Operations are ordered on one rank as they are called.
//   - Deterministic: the same inputs on the same backend give bit-identical outputs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "runtime/tensor.h"

namespace ptdp::rt {

// Where the token rows of a (b, s)-token activation lie. Only attention cares: every other op is
// row-wise. Megatron uses kSeqFirst so that sequence-parallel chunks are contiguous (the SP
// all-gather / reduce-scatter run along dimension 0).
enum class TokenOrder {
  kBatchFirst,  // (b, s, C): row = bi * s + t
  kSeqFirst,    // (s, b, C): row = t * b + bi
};

// Positions of a CP rank's local sequence rows (see AttentionBlockForward): row u < len is
// position first0 + u, row u >= len is first1 + (u - len).
struct SeqBlock {
  int64_t first0 = 0, first1 = 0, len = 0;
  int64_t Position(int64_t u) const { return u < len ? first0 + u : first1 + (u - len); }
};

// One AdamW step's hyper-parameters (PyTorch AdamW / llm.c; decoupled weight decay).
struct AdamWConfig {
  float lr = 3e-4f;           // learning rate of this step (after warmup / decay)
  float beta1 = 0.9f;         // first-moment decay
  float beta2 = 0.95f;        // second-moment decay
  float eps = 1e-8f;          // added to sqrt(v_hat)
  float weight_decay = 0.0f;  // decoupled; 0 for biases and LayerNorm parameters
  float grad_scale = 1.0f;    // the gradient is multiplied by this first (clipping coefficient)
  int64_t step = 1;           // 1-based step number, for the bias corrections 1 - beta^step
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu", "cuda".
  virtual const char* Name() const = 0;

  // ---- memory -------------------------------------------------------------------------------
  // A new zeroed tensor of `shape` (every dim >= 0). Its memory counts in CurrentBytes() until
  // the last handle to it goes. Fails (naming the shape and bytes) when the memory cannot be
  // had: host or device memory exhausted, or a capacity the backend was given exceeded.
  virtual Result<Tensor> Alloc(const Shape& shape, DType dtype) = 0;
  // The same without the zero-fill: the contents are unspecified until written (CPU with
  // CpuBackendOptions::poison_uninit: NaN in every float, so a read before a write shows).
  // For an op's output that the op overwrites whole; an accumulator ("adds to") needs Alloc.
  // The fill is what llm.c and PyTorch's caching allocator skip: memset was ~6% of a CPU MoE
  // step, and one device pass over every activation on a GPU.
  virtual Result<Tensor> AllocUninit(const Shape& shape, DType dtype) = 0;
  // Bytes of live tensors allocated here (as requested: numel * dtype bytes).
  virtual size_t CurrentBytes() const = 0;
  // The most CurrentBytes() has been since construction or the last ResetPeak().
  virtual size_t PeakBytes() const = 0;
  // Sets the peak to the current bytes (e.g. after the parameters are allocated, or per step).
  virtual void ResetPeak() = 0;

  // Waits for every op called so far; returns the first failure recorded since the last call.
  virtual Status Synchronize() = 0;

  // Device-time marks, for timing phases of asynchronous work (the trainer's RankTimes and
  // timeline): Mark() records the point this backend's work has reached in its order of
  // execution (CUDA: an event recorded on its stream; CPU, whose work is done when a call
  // returns: the host clock) and returns its number, counted from 0 after each ClearMarks().
  // MarkSeconds(a, b): the seconds from mark a to mark b, waiting for b to complete (0 after
  // a failure, which the next Synchronize reports).
  virtual int Mark() = 0;
  virtual double MarkSeconds(int a, int b) = 0;
  virtual void ClearMarks() = 0;

  // ---- host transfer (dst/src hold numel() elements; i32 for an i32 tensor, float for a float
  // one: into a bf16 tensor the values are rounded to nearest even, out of one widened) --------
  virtual Status CopyFromHost(const float* src, Tensor& dst) = 0;
  virtual Status CopyFromHost(const int32_t* src, Tensor& dst) = 0;
  virtual Status CopyToHost(const Tensor& src, float* dst) = 0;
  virtual Status CopyToHost(const Tensor& src, int32_t* dst) = 0;

  // ---- GEMM ---------------------------------------------------------------------------------
  // c = alpha * op(a) @ op(b) + beta * c, row-major. Tensors of rank > 2 are read as 2-D
  // (N, C). op(a) is (M, K): a is stored (M, K), or (K, M) when trans_a. op(b) is (K, P): b is
  // stored (K, P), or (P, K) when trans_b. c is (M, P). With beta == 0, c is not read (it may
  // hold anything). c must not overlap a or b.
  // A linear layer with weight w (out, in): y = x @ w^T is Matmul(x, false, w, true, y);
  // dx = dy @ w is Matmul(dy, false, w, false, dx); dw += dy^T @ x is
  // Matmul(dy, true, x, false, dw, 1, 1).
  virtual void Matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
                      float alpha = 1.0f, float beta = 0.0f) = 0;
  // The same for each index of a leading batch dimension L: a, b, c are 3-D (L, ., .) with the
  // same L, and each slice follows the 2-D rule above.
  virtual void MatmulBatched(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                             Tensor& c, float alpha = 1.0f, float beta = 0.0f) = 0;
  // A linear layer with its bias in the GEMM's epilogue: c = op(a) op(b) + bias (broadcast over
  // rows; c (M, P), bias (P)), the sum taken in fp32 and rounded once where c is bf16
  // (cuBLASLt's CUBLASLT_EPILOGUE_BIAS). The default is Matmul then AddBias, which rounds a
  // bf16 c twice; the CPU backend computes the fused result (the reference), CUDA fuses it.
  virtual void MatmulBias(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                          const Tensor& bias, Tensor& c) {
    Matmul(a, trans_a, b, trans_b, c);
    AddBias(c, bias);
  }
  // Whether MatmulBias, MatmulBiasGelu and MatmulGeluBackward on `act` tensors run the bias
  // (and the GeLU or its gradient) inside the GEMM's own kernel, as CUDA's cuBLASLt epilogues
  // do: calibrate then times those calls over the GEMM grid (gemm_nt_bias, gemm_nt_bias_gelu,
  // gemm_nn_dgelu); false (the default): a GEMM, then the separate kernels, which their own
  // tables time.
  virtual bool FusesGemmEpilogues(DType act) const {
    (void)act;
    return false;
  }
  // The same followed by GeLU (an MLP's FC1): pre = op(a) op(b) + bias (the GeLU's input, kept
  // for GeluBackward) and act = gelu of that fp32 sum, each rounded once where bf16
  // (CUBLASLT_EPILOGUE_GELU_AUX_BIAS: the activation of the unrounded pre-activation). pre
  // and act do not overlap. The default is MatmulBias then GeluForward(pre, act).
  virtual void MatmulBiasGelu(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                              const Tensor& bias, Tensor& pre, Tensor& act) {
    MatmulBias(a, trans_a, b, trans_b, bias, pre);
    GeluForward(pre, act);
  }
  // An MLP's input gradient through its GeLU (FC2's dgrad): dx = gelu'(pre) * (op(a) op(b)),
  // dx and pre (M, P), the product in fp32 and dx rounded once where bf16 (cuBLASLt's
  // CUBLASLT_EPILOGUE_DGELU with pre as the aux input, as llm.c's backward does). dx and pre do
  // not overlap. The default is Matmul then GeluBackward (a bf16 dx rounded twice); the CPU
  // backend computes the fused result (the reference), CUDA fuses it.
  virtual void MatmulGeluBackward(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                                  const Tensor& pre, Tensor& dx) {
    Matmul(a, trans_a, b, trans_b, dx);
    GeluBackward(dx, pre, dx);
  }

  // ---- bias ---------------------------------------------------------------------------------
  // y (N, C) += bias (C), broadcast over rows. A learned position embedding wpe (s, h) on a
  // kBatchFirst activation x (b, s, h) is AddBias(x viewed (b, s*h), wpe viewed (s*h)).
  virtual void AddBias(Tensor& y, const Tensor& bias) = 0;
  // dbias (C) adds the column sums of dy (N, C).
  virtual void BiasGrad(const Tensor& dy, Tensor& dbias) = 0;
  // A residual connection (Megatron's bias-dropout-add without dropout): x (N, C) += bias (C) +
  // residual (N, C), the sum (x + bias) + residual taken in fp32 and rounded once where x is
  // bf16. The default is AddBias then Add (a bf16 x rounded twice); the CPU backend computes the
  // fused result (the reference), CUDA in one kernel.
  virtual void AddBiasResidual(Tensor& x, const Tensor& bias, const Tensor& residual) {
    AddBias(x, bias);
    Add(x, residual, x);
  }
  // The same, then the next LayerNorm of x as stored: y, mean, rstd as LayerNormForward(x, ...)
  // (a pre-LN block's residual stream into its next norm). y does not overlap x. CUDA fuses the
  // two into one kernel; the default runs AddBiasResidual then LayerNormForward.
  virtual void AddBiasResidualLayerNorm(Tensor& x, const Tensor& bias, const Tensor& residual,
                                        const Tensor& gamma, const Tensor& beta, float eps,
                                        Tensor& y, Tensor& mean, Tensor& rstd) {
    AddBiasResidual(x, bias, residual);
    LayerNormForward(x, gamma, beta, eps, y, mean, rstd);
  }

  // ---- LayerNorm over the last dimension ----------------------------------------------------
  // y (N, C) = (x - mean) * rstd * gamma + beta with mean, rstd = 1/sqrt(var + eps) over C
  // (biased variance). Saves mean (N) and rstd (N) for the backward. y may alias x.
  virtual void LayerNormForward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                                Tensor& y, Tensor& mean, Tensor& rstd) = 0;
  // Given dy (N, C), the forward's input x (N, C), gamma (C) and the saved mean, rstd (N):
  // dx (N, C), dgamma (C), dbeta (C) all ADD the gradient (dx is the residual stream's gradient
  // in a pre-LN block, so it usually already holds the gradient from the skip connection).
  virtual void LayerNormBackward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                 const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dgamma,
                                 Tensor& dbeta) = 0;

  // ---- GeLU, tanh approximation (GPT-2, Megatron) --------------------------------------------
  // y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), any shape. y may alias x.
  virtual void GeluForward(const Tensor& x, Tensor& y) = 0;
  // dx = gelu'(x) * dy, any shape (all three the same numel). dx may alias dy.
  virtual void GeluBackward(const Tensor& dy, const Tensor& x, Tensor& dx) = 0;

  // ---- causal multi-head self-attention -----------------------------------------------------
  // qkv holds per row [q | k | v], each A = nh*d wide with head j at columns j*d .. j*d+d-1:
  // qkv is (b, s, 3A) or (s, b, 3A) per `order`; out is (b, s, A) or (s, b, A) likewise.
  // out = softmax(q k^T / sqrt(d) with positions > the query's masked) v, per batch and head.
  // `saved` receives what the backward needs; allocate it with AttentionSavedShape (fp32) for
  // heads of dimension d: the CPU backend keeps the probabilities (b, nh, s, s), the CUDA
  // backend's flash kernels only the log-sum-exp of each query (b, nh, s).
  virtual Shape AttentionSavedShape(int64_t b, int64_t s, int64_t nh, int64_t d) const = 0;
  virtual void AttentionForward(const Tensor& qkv, int64_t nh, TokenOrder order, Tensor& out,
                                Tensor& saved) = 0;
  // dqkv (same shape as qkv) = the gradient of the forward given dout (shape of out), the
  // forward's qkv, out and saved. dqkv is overwritten.
  virtual void AttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                 const Tensor& saved, int64_t nh, TokenOrder order,
                                 Tensor& dqkv) = 0;

  // ---- context-parallel attention blocks (Megatron's ring attention; runtime/gpt.h) ---------
  // A CP rank holds two chunks of each sequence (causal load balancing): its s = 2*len local
  // rows are positions first0 .. first0+len-1, then first1 .. first1+len-1.
  //
  // One ring step of the online softmax, seq-first: qkv (2Lq, b, 3A) holds this rank's queries
  // at columns [0, A) (positions qpos), kv (2Lk, b, 2A) a K/V block [K | V] at positions kpos.
  // Query u sees key v when kpos(v) <= qpos(u). With `first`, out (2Lq, b, A) and lse
  // (b, nh, 2Lq) are overwritten with this block's softmax(q k^T / sqrt(d)) v and its row
  // log-sum-exp of the scaled scores (-inf for a row that sees no key); otherwise the block is
  // merged into them: lse' = log(e^lse + e^lse_b), out' = out e^(lse - lse') + o_b e^(lse_b - lse').
  // After every block, out and lse are those of attention over all the blocks' keys.
  virtual void AttentionBlockForward(const Tensor& qkv, const SeqBlock& qpos, const Tensor& kv,
                                     const SeqBlock& kpos, int64_t nh, bool first, Tensor& out,
                                     Tensor& lse) = 0;
  // The block's part of the backward, given the final out and lse of the forward and dout:
  // dqkv (shape of qkv) adds dQ at columns [0, A) (the K/V columns are left alone); dkv (shape
  // of kv) adds dK at [0, A) and dV at [A, 2A).
  virtual void AttentionBlockBackward(const Tensor& dout, const Tensor& qkv, const SeqBlock& qpos,
                                      const Tensor& kv, const SeqBlock& kpos, const Tensor& out,
                                      const Tensor& lse, int64_t nh, Tensor& dqkv,
                                      Tensor& dkv) = 0;
  // dst[:, dst_col .. dst_col+ncols) = src[:, src_col .. src_col+ncols) of two row-major
  // matrices with equal rows (the last dimension as columns).
  virtual void CopyColumns(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col,
                           int64_t ncols) = 0;

  // ---- vocab-parallel embedding -------------------------------------------------------------
  // tokens (N) i32 any leading shape; table (V, h) holds global rows [vocab_start,
  // vocab_start + V); out (N, h) = table[token - vocab_start] for tokens in the shard, zeros
  // for the others, so the TP all-reduce (SUM) of out gives the full lookup. Position
  // embeddings in any TokenOrder: tokens = position ids, vocab_start = 0, then Add.
  virtual void EmbeddingForward(const Tensor& tokens, const Tensor& table, int64_t vocab_start,
                                Tensor& out) = 0;
  // dtable (V, h) adds dout[n] at row token[n] - vocab_start for the tokens in the shard
  // (scatter-add, in row order n = 0, 1, ... so it is deterministic).
  virtual void EmbeddingBackward(const Tensor& dout, const Tensor& tokens, int64_t vocab_start,
                                 Tensor& dtable) = 0;

  // ---- vocab-parallel cross entropy (megatron-reference.md section 4) ------------------------
  // With local logits (N, V) and global targets (N) i32, rank by rank over TP:
  //   CrossEntropyMax        -> row_max (N)     ; all-reduce MAX -> global max m
  //   CrossEntropySumExp(m)  -> sum_exp (N)     ; all-reduce SUM -> global sum S
  //   CrossEntropyTarget     -> target_logit (N); all-reduce SUM -> the target's logit z
  //   CrossEntropyLoss(m, S, z) -> loss (N) = log S + m - z
  //   CrossEntropyBackward(m, S) -> dlogits = (softmax - onehot) * scale, per shard.
  virtual void CrossEntropyMax(const Tensor& logits, Tensor& row_max) = 0;
  // sum_exp[n] = sum over the local columns v of exp(logits[n, v] - row_max[n]).
  virtual void CrossEntropySumExp(const Tensor& logits, const Tensor& row_max, Tensor& sum_exp) = 0;
  // target_logit[n] = logits[n, target[n] - vocab_start] when the target is in the shard, else 0.
  virtual void CrossEntropyTarget(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                  Tensor& target_logit) = 0;
  // loss (N) = log(sum_exp) + row_max - target_logit, from the all-reduced pieces.
  virtual void CrossEntropyLoss(const Tensor& row_max, const Tensor& sum_exp,
                                const Tensor& target_logit, Tensor& loss) = 0;
  // dlogits (N, V) = (exp(logits - row_max) / sum_exp - onehot(target - vocab_start)) * scale,
  // with the global row_max and sum_exp. `scale` is dLoss/dloss[n] (1 / tokens in the batch
  // for a mean). dlogits may alias logits (in place, as Megatron does to save memory).
  virtual void CrossEntropyBackward(const Tensor& logits, const Tensor& targets,
                                    int64_t vocab_start, const Tensor& row_max,
                                    const Tensor& sum_exp, float scale, Tensor& dlogits) = 0;

  // ---- element-wise and reductions (any shapes with equal numel) ----------------------------
  // out = a + b. out may alias a or b (the residual add).
  virtual void Add(const Tensor& a, const Tensor& b, Tensor& out) = 0;
  // y += alpha * x.
  virtual void Axpy(float alpha, const Tensor& x, Tensor& y) = 0;
  // x *= alpha.
  virtual void Scale(float alpha, Tensor& x) = 0;
  // x = value everywhere.
  virtual void Fill(float value, Tensor& x) = 0;
  // out (N, C) = x (N, C) with row n times scale[n] (N); out may alias x (MoE combine weights).
  virtual void ScaleRows(const Tensor& x, const Tensor& scale, Tensor& out) = 0;
  // out (N) = the dot product of row n of a and of b (N, C), summed in double (the gradient of
  // the MoE combine weights).
  virtual void RowDot(const Tensor& a, const Tensor& b, Tensor& out) = 0;
  // dst = src, shapes may differ (a reshaping copy): any dtype the same in both, or between fp32
  // and bf16 (fp32 -> bf16 rounds to nearest even as CUDA's __float2bfloat16_rn: Inf stays
  // Inf, NaN stays NaN, values past the largest bf16 become Inf; bf16 -> fp32 is exact).
  virtual void Copy(const Tensor& src, Tensor& dst) = 0;
  // out (a 1-element tensor) adds sum(x^2): one call per gradient tensor, then the all-reduce
  // over TP/PP (and DP shards) and a sqrt give the global gradient norm.
  virtual void SumSquares(const Tensor& x, Tensor& out) = 0;
  // out (a 1-element tensor) adds sum(x), e.g. of the per-row losses.
  virtual void Sum(const Tensor& x, Tensor& out) = 0;

  // ---- optimizer ----------------------------------------------------------------------------
  // One AdamW step in place on param, with m and v (fp32 state, zero before step 1); all four
  // have equal numel:
  //   g = grad * grad_scale; m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2
  //   param -= lr * ((m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps)
  //                  + weight_decay * param)
  virtual void AdamW(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                     const AdamWConfig& cfg) = 0;
};

}  // namespace ptdp::rt
