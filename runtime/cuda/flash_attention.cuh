// Causal flash attention on tensor cores (issue 17, item 2): the CUDA backend's attention core for
// bf16 plans, forward and backward without the (b, heads, s, s) probabilities. Our own kernel in
// the manner of FlashAttention-2 (Dao 2023, "FlashAttention-2: Faster Attention with Better
// Parallelism and Work Partitioning", algorithms 1 and 2), not cuDNN's fused SDPA: it reads the
// qkv rows the model keeps as they are (no repacking per head), saves only the row
// log-sum-exp, and is tested kernel by kernel against the CPU backend on every lent GPU
// (tests/runtime/cuda). cuDNN's graph API would need its C++ frontend (not a Debian package) or
// some hundred lines of backend descriptors per graph, and fp16/bf16 inputs in its own layout.
// The token rows are fp32 or bf16 (a bf16 run's activations, runtime/backend.h): bf16 rows go
// into the tiles as they are, and the output and gradients are stored rounded to bf16.
//
// Shapes as kernels.cuh's HeadLayout: qkv (b, s, 3A) or (s, b, 3A) with nmat = 3, out and dout
// the same with nmat = 1 (A = nh d), lse (L, s) with L = b nh, index (bi nh + j) s + t.
//
// Numerics. Q, K, V, P, dO and dS are rounded to bf16 (round to nearest even) where they enter a
// tensor-core product; products accumulate in fp32; the online softmax, the log-sum-exp and the
// normalisation are fp32. The rounding points are those of cuBLAS's bf16 GEMMs in the unfused
// path, so the two have the same error budget (tests/runtime/cuda/cuda_backend_test.cc).
//
// Tiles: 64 queries x 64 keys, 4 warps of 16 rows; the head dimension padded with zeros to 64 or
// 128 (d <= 128). Backward in two kernels, one over key tiles (dK, dV) and one over query tiles
// (dQ), each recomputing the scores: no atomics, so the result is bit-identical run to run (the
// determinism of kernels.cuh), at the price of two more tile products than FlashAttention-2's
// atomic dQ.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/cuda/kernels.cuh"

namespace ptdp::rt::cuda::kernels {

constexpr int64_t kFlashMaxHeadDim = 128;

// Two implementations of the same contract, tiles and rounding points:
// - kWmma: WMMA 16x16x16 fragments; each warp's scores, probabilities and output rows pass
//   through shared memory between products (WMMA does not say which element a lane holds).
//   70 KiB of shared memory a forward block at d = 64; the default.
// - kMma: PTX mma.sync.m16n8k16 and ldmatrix, whose fragment layouts PTX specifies, so scores,
//   probabilities and accumulators stay in registers (FlashAttention-2's design; 45 KiB a
//   forward block at d = 64, the next K/V tile loading by cp.async during this one's products). Written without a GPU (2026-12-06); selected by
//   PTDP_CUDA_ATTENTION=flash-mma until a GPU has tested and timed it against kWmma.
enum class FlashVariant { kWmma, kMma };

// Whether the flash kernels run head dimension d on a device of compute capability `major` with
// `smem_optin` bytes of shared memory per block (cudaDevAttrMaxSharedMemoryPerBlockOptin):
// bf16 tensor cores need sm_80 or later, and the backward's tiles about 121 KiB at d > 64
// (kWmma; kMma: 103 KiB).
bool FlashAttentionSupported(int64_t d, int major, int64_t smem_optin,
                             FlashVariant v = FlashVariant::kWmma);

// out (rows of `lay` with nmat 1) = causal softmax(q k^T / sqrt(d)) v; lse (L, s) = the natural
// log-sum-exp of each query's scaled scores. `lay` describes qkv (nmat = 3).
// T: float or bf16 (kernels.cuh), the storage of qkv, out, dout and dqkv; lse and delta fp32.
template <typename T>
cudaError_t FlashAttentionForward(const T* qkv, HeadLayout lay, T* out, float* lse,
                                  cudaStream_t st, FlashVariant v = FlashVariant::kWmma);

// dqkv (shape of qkv, every element written) = the gradient given dout, the forward's qkv, out
// and lse. delta: scratch of L s floats (rowsum(dO * O) per query).
template <typename T>
cudaError_t FlashAttentionBackward(const T* dout, const T* qkv, const T* out, const float* lse,
                                   HeadLayout lay, float* delta, T* dqkv, cudaStream_t st,
                                   FlashVariant v = FlashVariant::kWmma);

}  // namespace ptdp::rt::cuda::kernels
