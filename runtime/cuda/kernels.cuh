// Host-side launchers of the CUDA backend's own kernels (kernels.cu): every Backend op that is not
// a GEMM. Each enqueues its kernels on `st` and returns cudaGetLastError() after the launches (a
// bad launch configuration, or an earlier sticky fault), so that the backend can record the first
// failure with file and line. With nothing to do (an empty tensor) nothing is launched and
// cudaSuccess is returned. Pointers are device pointers, aligned to their element (tensor views may start
// at any element); counts are elements. Letters as in runtime/backend.h; L = b*nh.
//
// Determinism: no atomics; every reduction has a fixed order that depends only on the shapes
// (per-thread loops, then warp butterflies or shared-memory trees of fixed size), so the same
// inputs give bit-identical outputs.
//
// Storage types (runtime/backend.h's dtype rules): T, A, B, O, X, Y are float or bf16
// (__nv_bfloat16); each template is instantiated for both (every combination for the
// multi-type element-wise ones) in kernels.cu. Kernels load T as fp32, compute in fp32 exactly
// as the fp32 kernel does, and store into a bf16 output rounded to nearest even
// (__float2bfloat16_rn), so a bf16 kernel is its fp32 kernel on the widened inputs with each
// output rounded once: the CPU backend's bf16 rule. Statistics, partial sums, parameter
// gradients and the CP blocks' accumulators are float whatever T is.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ptdp::rt::cuda::kernels {

using bf16 = __nv_bfloat16;

// Every pointer on a 16-byte boundary: what 16-byte vector loads (the element-wise kernels) and
// cuBLASLt's epilogue GEMMs need.
template <typename... P>
bool Aligned16(const P*... p) {
  return ((reinterpret_cast<uintptr_t>(p) % 16 == 0) && ...);
}

// ---- column sums in two passes (BiasGrad, LayerNorm's dgamma/dbeta) ------------------------------
// Rows are cut into `chunks` runs of `rows_per_chunk` rows; pass 1 writes one partial sum per
// (chunk, column) into a (chunks, C) scratch, pass 2 adds the chunks' partials in chunk order.
struct RowSplit {
  int64_t rows_per_chunk = 0;
  int64_t chunks = 0;  // 0 when there are no rows
};
RowSplit SplitRows(int64_t n);

// partials (chunks, C) = column sums of dy (N, C) per chunk of rows.
template <typename T>
cudaError_t BiasGradPartials(const T* dy, int64_t n, int64_t c, RowSplit split, float* partials,
                             cudaStream_t st);
// out (C) adds the sum over chunks of partials (chunks, C), chunk 0 first.
cudaError_t ColumnFinalize(const float* partials, int64_t chunks, int64_t c, float* out,
                           cudaStream_t st);

// ---- bias -----------------------------------------------------------------------------------------
// y (N, C) += bias (C).
template <typename T>
cudaError_t AddBias(T* y, const T* bias, int64_t n, int64_t c, cudaStream_t st);
// x (N, C) = (x + bias) + residual, in fp32, stored once.
template <typename T>
cudaError_t AddBiasResidual(T* x, const T* bias, const T* residual, int64_t n, int64_t c,
                            cudaStream_t st);
// The same, then y = LayerNorm(x as stored) with mean, rstd (N) saved: one warp a row, one
// kernel (the residual stream read once more from cache instead of three more kernels' passes).
// y does not overlap x.
template <typename T>
cudaError_t AddBiasResidualLayerNorm(T* x, const T* bias, const T* residual, const T* gamma,
                                     const T* beta, float eps, int64_t n, int64_t c, T* y,
                                     float* mean, float* rstd, cudaStream_t st);

// ---- LayerNorm (one warp per row) -------------------------------------------------------------------
// y (N, C) = (x - mean) * rstd * gamma + beta; mean, rstd (N) saved. y may alias x.
template <typename T>
cudaError_t LayerNormForward(const T* x, const T* gamma, const T* beta, float eps, int64_t n,
                             int64_t c, T* y, float* mean, float* rstd, cudaStream_t st);
// dx (N, C) adds the input gradient.
template <typename T>
cudaError_t LayerNormBackwardInput(const T* dy, const T* x, const T* gamma, const float* mean,
                                   const float* rstd, int64_t n, int64_t c, T* dx,
                                   cudaStream_t st);
// dgamma_partials, dbeta_partials (chunks, C): per chunk of rows, the column sums of xhat * dy
// and of dy (finished by ColumnFinalize).
template <typename T>
cudaError_t LayerNormParamPartials(const T* dy, const T* x, const float* mean, const float* rstd,
                                   int64_t n, int64_t c, RowSplit split, float* dgamma_partials,
                                   float* dbeta_partials, cudaStream_t st);

// ---- GeLU (tanh approximation) ----------------------------------------------------------------------
template <typename T>
cudaError_t GeluForward(const T* x, T* y, int64_t n, cudaStream_t st);  // y may alias x
template <typename T>
cudaError_t GeluBackward(const T* dy, const T* x, T* dx, int64_t n,
                         cudaStream_t st);  // dx may alias dy

// ---- attention --------------------------------------------------------------------------------------
// A token-row activation (b, s, W) or (s, b, W) seen as heads: `nmat` matrices of nh heads of
// width d side by side per row (matrix m, head j at columns m*nh*d + j*d), W = nmat*nh*d.
struct HeadLayout {
  int64_t b = 0, s = 0, nh = 0, d = 0;
  int64_t nmat = 1;        // 3 for qkv, 1 for the attention output
  bool seq_first = false;  // TokenOrder::kSeqFirst: row = t*b + bi; else row = bi*s + t
};
// heads (nmat, L, s, d) <- rows (b*s, W): unpack, L index bi*nh + j.
template <typename T>
cudaError_t RowsToHeads(const T* rows, HeadLayout lay, float* heads, cudaStream_t st);
// rows (b*s, W) <- heads (nmat, L, s, d): pack (every element of rows is written).
template <typename T>
cudaError_t HeadsToRows(const float* heads, HeadLayout lay, T* rows, cudaStream_t st);
// In place on p (L, s, s) holding the raw scores q k^T: row t of each matrix becomes
// softmax(scale * p[t, 0..t]) with zeros at columns > t (one warp per row).
cudaError_t CausalSoftmaxForward(float* p, int64_t l, int64_t s, float scale, cudaStream_t st);
// In place on dp (L, s, s): dS = P * (dP - rowsum(P * dP)) * scale, zero above the diagonal.
cudaError_t CausalSoftmaxBackward(const float* p, float* dp, int64_t l, int64_t s, float scale,
                                  cudaStream_t st);

// ---- context-parallel attention blocks (Backend::AttentionBlockForward / Backward) -----------------
// Seq-first: qkv (2 lq, b, 3A), kv (2 lk, b, 2A) = [K | V], out and dout (2 lq, b, A), lse
// (b, nh, 2 lq). Local row u of the queries is position q0 + u (u < lq) or q1 + u - lq, keys
// likewise with k0, k1, lk; query u sees key v when its position is not after u's. Naive: one
// thread per (batch, head, query row) (per key row for dK/dV) walking the other side's rows, two
// passes over the scores; the head dimension at most kMaxBlockHeadDim.
constexpr int64_t kMaxBlockHeadDim = 256;
struct BlockAttention {
  int64_t b = 0, nh = 0, d = 0;
  int64_t lq = 0, q0 = 0, q1 = 0;
  int64_t lk = 0, k0 = 0, k1 = 0;
};
template <typename T>
cudaError_t AttentionBlockForward(const T* qkv, const T* kv, BlockAttention a, bool first,
                                  float* out, float* lse, cudaStream_t st);
// dqkv adds dQ at its columns [0, A); dkv adds dK at [0, A) and dV at [A, 2A).
template <typename T>
cudaError_t AttentionBlockBackward(const T* dout, const T* qkv, const T* kv, const T* out,
                                   const float* lse, BlockAttention a, float* dqkv, float* dkv,
                                   cudaStream_t st);

// ---- vocab-parallel embedding -----------------------------------------------------------------------
// out (N, h) = table[token - vocab_start] for tokens in [vocab_start, vocab_start + V), else 0.
template <typename T>
cudaError_t EmbeddingForward(const int32_t* tokens, int64_t n, const T* table, int64_t v,
                             int64_t h, int64_t vocab_start, T* out, cudaStream_t st);
// dtable (V, h) adds dout[n] at row token[n] - vocab_start, n = 0, 1, ... in order for every
// element (the CPU backend's order, so the sums are bit-identical to it).
template <typename T>
cudaError_t EmbeddingBackward(const T* dout, const int32_t* tokens, int64_t n,
                              int64_t vocab_start, int64_t v, int64_t h, float* dtable,
                              cudaStream_t st);

// ---- vocab-parallel cross entropy (logits (N, V); one warp per row for the row reductions) --------
// sum_exp accumulates in double, as the CPU backend does.
template <typename T>
cudaError_t CrossEntropyMax(const T* logits, int64_t n, int64_t v, float* row_max,
                            cudaStream_t st);
template <typename T>
cudaError_t CrossEntropySumExp(const T* logits, const float* row_max, int64_t n, int64_t v,
                               float* sum_exp, cudaStream_t st);
template <typename T>
cudaError_t CrossEntropyTarget(const T* logits, const int32_t* targets, int64_t n, int64_t v,
                               int64_t vocab_start, float* target_logit, cudaStream_t st);
cudaError_t CrossEntropyLoss(const float* row_max, const float* sum_exp, const float* target_logit,
                             int64_t n, float* loss, cudaStream_t st);
// dlogits may alias logits.
template <typename T>
cudaError_t CrossEntropyBackward(const T* logits, const int32_t* targets, int64_t n, int64_t v,
                                 int64_t vocab_start, const float* row_max, const float* sum_exp,
                                 float scale, T* dlogits, cudaStream_t st);

// ---- element-wise -----------------------------------------------------------------------------------
// out may alias a or b (then of the same type).
template <typename A, typename B, typename O>
cudaError_t Add(const A* a, const B* b, O* out, int64_t n, cudaStream_t st);
template <typename X, typename Y>
cudaError_t Axpy(float alpha, const X* x, Y* y, int64_t n, cudaStream_t st);
template <typename X>
cudaError_t Scale(float alpha, X* x, int64_t n, cudaStream_t st);
template <typename X>
cudaError_t Fill(float value, X* x, int64_t n, cudaStream_t st);

// ---- MoE combine ---------------------------------------------------------------------------------
// out (N, C) = x * scale[row] (out may alias x, then of the same type); out (N) = row dot products of a, b (one warp per
// row, in double as the CPU backend).
template <typename X, typename O>
cudaError_t ScaleRows(const X* x, const float* scale, int64_t n, int64_t c, O* out,
                      cudaStream_t st);
template <typename A, typename B>
cudaError_t RowDot(const A* a, const B* b, int64_t n, int64_t c, float* out, cudaStream_t st);

// ---- fp32 <-> bf16 ------------------------------------------------------------------------------
// y = bf16(x) rounded to nearest even (__float2bfloat16_rn), and y = float(x) (exact).
cudaError_t ToBf16(const float* x, bf16* y, int64_t n, cudaStream_t st);
cudaError_t FromBf16(const bf16* x, float* y, int64_t n, cudaStream_t st);

// ---- whole-tensor sums in two passes, in double --------------------------------------------------
// The number of partials pass 1 writes for n elements (fixed by n: the order is deterministic).
int64_t SumBlocks(int64_t n);
// partials (SumBlocks(n)) = per-block sums of x (or of x^2 with squares) in double.
template <typename X>
cudaError_t SumPartials(const X* x, int64_t n, bool squares, double* partials, cudaStream_t st);
// out[0] += float(sum of partials), in a fixed order.
cudaError_t SumFinalize(const double* partials, int64_t blocks, float* out, cudaStream_t st);

// ---- AdamW ---------------------------------------------------------------------------------------
struct AdamWArgs {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
  float bias_correction1;  // 1 - beta1^step
  float bias_correction2;  // 1 - beta2^step
};
cudaError_t AdamW(float* param, const float* grad, float* m, float* v, int64_t n, AdamWArgs a,
                  cudaStream_t st);

}  // namespace ptdp::rt::cuda::kernels
