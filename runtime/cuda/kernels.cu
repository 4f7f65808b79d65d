// The CUDA backend's own kernels (everything but the GEMMs) and their host-side launchers; see
// kernels.cuh for the contracts. Each kernel mirrors a loop of runtime/cpu/cpu_backend.cc with
// the same formula, so the two differ only in the order of fp32 additions inside reductions.
//
// Storage. Activations and weights may be stored as fp32 or bf16 (the kernels' T, A, B, O, X, Y);
// every element is loaded through Ld (widened to fp32, exact) and stored through St (rounded to
// nearest even into bf16), and the arithmetic in between is the fp32 code for both, so a bf16
// kernel is its fp32 kernel on the widened inputs with each output rounded once. An output that
// accumulates ("adds to") is loaded, added to in fp32 and stored rounded.
//
// Launch shapes. Element-wise kernels: 256 threads a block, at most 65535 blocks, grid-stride
// loops (any n). Row-wise kernels (LayerNorm, softmax, cross-entropy reductions): one warp per
// row, the warp's 32 lanes striding over the row (rows of any length: nothing is held in shared
// memory), warps striding over rows. Column sums: 32 columns x 8 row lanes a block over chunks
// of rows (gridDim.y = chunks <= 65535, see SplitRows), then one thread per column.
#include "runtime/cuda/kernels.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace ptdp::rt::cuda::kernels {
namespace {

constexpr int kThreads = 256;                   // threads per block of 1-D launches
constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = kThreads / kWarp;
constexpr int64_t kMaxBlocks = 65535;           // grid-stride loops cover larger n
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

// Column sums: a block covers kColTile columns with kColLanes threads per column.
constexpr int kColTile = 32;
constexpr int kColLanes = 8;
constexpr int64_t kMinRowsPerChunk = 128;

// Embedding backward: token ids staged in shared memory per round; columns x row groups a block.
constexpr int kEmbTokens = 1024;
constexpr int kEmbCols = 32;
constexpr int kEmbGroupsPerBlock = 8;
constexpr int64_t kEmbTargetThreads = 65536;  // enough to fill an H100's 132 SMs
constexpr int64_t kEmbMaxGroups = 64;

constexpr int64_t kSumMaxBlocks = 1024;  // partials of a whole-tensor sum
constexpr int64_t kSumItemsPerThread = 8;

unsigned Blocks(int64_t items, int64_t per_block) {
  return unsigned(std::min<int64_t>((items + per_block - 1) / per_block, kMaxBlocks));
}
// Blocks of kThreads for one warp per row.
unsigned RowBlocks(int64_t rows) { return Blocks(rows, kWarpsPerBlock); }

// ---- storage: load as fp32, store rounded -------------------------------------------------------

__device__ __forceinline__ float Ld(const float* p) { return *p; }
__device__ __forceinline__ float Ld(const bf16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void St(float* p, float v) { *p = v; }
__device__ __forceinline__ void St(bf16* p, float v) { *p = __float2bfloat16_rn(v); }

// ---- vector loads: kVec elements a thread at once ------------------------------------------------
// The flat element-wise kernels move kVec consecutive elements a thread with 16-byte loads and
// stores (one for 8 bf16, two for 8 fp32) where every operand is 16-byte aligned, and one
// element at a time otherwise and for the tail: a warp then moves 512 bytes of bf16 an
// instruction instead of 64. Each element's arithmetic and its rounding (round to nearest even,
// per element) are the scalar path's, so both paths give the same bits.
constexpr int kVec = 8;

template <int W, typename T>
__device__ __forceinline__ void LdN(const T* p, float (&v)[W]) {
  if constexpr (W == 1) {
    v[0] = Ld(p);
  } else if constexpr (std::is_same_v<T, float>) {
    static_assert(W == 8);
    const float4* q = reinterpret_cast<const float4*>(p);
    const float4 a = q[0], b = q[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    static_assert(W == 8 && std::is_same_v<T, bf16>);
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(h[j]);
      v[2 * j] = f.x, v[2 * j + 1] = f.y;
    }
  }
}

template <int W, typename T>
__device__ __forceinline__ void StN(T* p, const float (&v)[W]) {
  if constexpr (W == 1) {
    St(p, v[0]);
  } else if constexpr (std::is_same_v<T, float>) {
    static_assert(W == 8);
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    static_assert(W == 8 && std::is_same_v<T, bf16>);
    uint4 raw;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
    for (int j = 0; j < 4; ++j) h[j] = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
    *reinterpret_cast<uint4*>(p) = raw;
  }
}

// Blocks of kThreads for a flat kernel over n elements: a thread per kVec of them on the vector
// path (the tail's n mod kVec need no more threads).
unsigned FlatBlocks(int64_t n, bool vec) { return Blocks(vec ? n / kVec + 1 : n, kThreads); }

__device__ __forceinline__ int64_t ThreadIndex() {
  return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t ThreadCount() { return int64_t(gridDim.x) * blockDim.x; }

// body(std::integral_constant<int, W>) with W = kVec on the vector path, else 1.
template <typename Body>
__device__ __forceinline__ void WithWidth(bool vec, const Body& body) {
  vec ? body(std::integral_constant<int, kVec>{}) : body(std::integral_constant<int, 1>{});
}

// Body(std::integral_constant<int, W>, i) handles elements i .. i + W - 1: groups of kVec on the
// vector path, then the tail (or everything) one element at a time.
template <typename Body>
__device__ __forceinline__ void ForElements(int64_t n, bool vec, const Body& body) {
  int64_t start = 0;
  if (vec) {
    const int64_t groups = n / kVec;
    for (int64_t g = ThreadIndex(); g < groups; g += ThreadCount())
      body(std::integral_constant<int, kVec>{}, g * kVec);
    start = groups * kVec;
  }
  for (int64_t i = start + ThreadIndex(); i < n; i += ThreadCount())
    body(std::integral_constant<int, 1>{}, i);
}

// One warp per row: blockDim.x is a multiple of 32, so a warp lies within one block.
__device__ __forceinline__ int64_t WarpIndex() { return ThreadIndex() / kWarp; }
__device__ __forceinline__ int64_t WarpCount() { return ThreadCount() / kWarp; }
__device__ __forceinline__ int Lane() { return int(threadIdx.x) % kWarp; }

// Butterfly reductions: every lane ends with the same value (a + b == b + a in IEEE).
__device__ __forceinline__ float WarpSum(float v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double WarpSum(double v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// ---- column sums ---------------------------------------------------------------------------

// Thread (x, y) of block (bx, by) sums columns (bx*32 + x) W .. + W-1 over rows r0 + y, r0 + y
// + 8, ... of chunk by; the 8 lanes of a column are then added in lane order.
// W consecutive columns a thread (kVec with 16-byte loads where c % kVec == 0 and the rows are
// aligned, else 1; the launchers' ColumnsVec): each column still sums the same rows in the same
// order and its lanes in lane order, so both paths give the same bits.
template <int W, typename T>
__global__ void BiasGradPartialsKernel(const T* dy, int64_t n, int64_t c, int64_t rows_per_chunk,
                                       float* partials) {
  __shared__ float acc[kColLanes][W][kColTile + 1];
  const int64_t col = (int64_t(blockIdx.x) * kColTile + threadIdx.x) * W;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < n ? r0 + rows_per_chunk : n;
  float sum[W];
  for (int k = 0; k < W; ++k) sum[k] = 0.0f;
  if (col < c) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColLanes) {
      float v[W];
      LdN<W>(dy + r * c + col, v);
      for (int k = 0; k < W; ++k) sum[k] += v[k];
    }
  }
  for (int k = 0; k < W; ++k) acc[threadIdx.y][k][threadIdx.x] = sum[k];
  __syncthreads();
  if (threadIdx.y == 0 && col < c) {
    for (int k = 0; k < W; ++k) {
      float total = 0.0f;
      for (int y = 0; y < kColLanes; ++y) total += acc[y][k][threadIdx.x];
      partials[int64_t(blockIdx.y) * c + col + k] = total;
    }
  }
}

template <int W, typename T>
__global__ void LayerNormParamPartialsKernel(const T* dy, const T* x, const float* mean,
                                             const float* rstd, int64_t n, int64_t c,
                                             int64_t rows_per_chunk, float* dgamma_partials,
                                             float* dbeta_partials) {
  __shared__ float acc_g[kColLanes][W][kColTile + 1];
  __shared__ float acc_b[kColLanes][W][kColTile + 1];
  const int64_t col = (int64_t(blockIdx.x) * kColTile + threadIdx.x) * W;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < n ? r0 + rows_per_chunk : n;
  float sum_g[W], sum_b[W];
  for (int k = 0; k < W; ++k) sum_g[k] = sum_b[k] = 0.0f;
  if (col < c) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColLanes) {
      float g[W], xv[W];
      LdN<W>(dy + r * c + col, g);
      LdN<W>(x + r * c + col, xv);
      const float m = mean[r], s = rstd[r];
      for (int k = 0; k < W; ++k) {
        const float xhat = (xv[k] - m) * s;
        sum_g[k] += xhat * g[k];
        sum_b[k] += g[k];
      }
    }
  }
  for (int k = 0; k < W; ++k) {
    acc_g[threadIdx.y][k][threadIdx.x] = sum_g[k];
    acc_b[threadIdx.y][k][threadIdx.x] = sum_b[k];
  }
  __syncthreads();
  if (threadIdx.y == 0 && col < c) {
    for (int k = 0; k < W; ++k) {
      float total_g = 0.0f, total_b = 0.0f;
      for (int y = 0; y < kColLanes; ++y) {
        total_g += acc_g[y][k][threadIdx.x];
        total_b += acc_b[y][k][threadIdx.x];
      }
      dgamma_partials[int64_t(blockIdx.y) * c + col + k] = total_g;
      dbeta_partials[int64_t(blockIdx.y) * c + col + k] = total_b;
    }
  }
}

__global__ void ColumnFinalizeKernel(const float* partials, int64_t chunks, int64_t c,
                                     float* out) {
  for (int64_t col = ThreadIndex(); col < c; col += ThreadCount()) {
    float total = 0.0f;
    for (int64_t k = 0; k < chunks; ++k) total += partials[k * c + col];
    out[col] += total;
  }
}

// ---- bias, GeLU, element-wise ----------------------------------------------------------------

// Threads over columns (coalesced, one bias load each), blockIdx.y over rows: no division per
// element (the 64-bit i % c of a flat loop costs more than the add). W columns a thread (kVec
// with 16-byte loads where c % 8 == 0 and the operands are 16-byte aligned, else 1): `row(i,
// b)` handles elements i .. i + W - 1 of a row given their bias values b.
template <int W, typename T, typename Row>
__device__ __forceinline__ void ColumnBands(const T* bias, int64_t n, int64_t c, const Row& row) {
  for (int64_t col = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * W; col < c;
       col += int64_t(gridDim.x) * blockDim.x * W) {
    float b[W];
    LdN<W>(bias + col, b);
    for (int64_t r = blockIdx.y; r < n; r += gridDim.y) row(r * c + col, b);
  }
}

template <typename T>
__global__ void AddBiasKernel(T* y, const T* bias, int64_t n, int64_t c, bool vec) {
  auto body = [&](auto w) {
    constexpr int W = decltype(w)::value;
    ColumnBands<W>(bias, n, c, [&](int64_t i, const float (&b)[W]) {
      float v[W];
      LdN<W>(y + i, v);
      for (int j = 0; j < W; ++j) v[j] = v[j] + b[j];
      StN<W>(y + i, v);
    });
  };
  WithWidth(vec, body);
}

// As AddBiasKernel; each element's (x + bias) + residual in fp32.
template <typename T>
__global__ void AddBiasResidualKernel(T* x, const T* bias, const T* residual, int64_t n,
                                      int64_t c, bool vec) {
  auto body = [&](auto w) {
    constexpr int W = decltype(w)::value;
    ColumnBands<W>(bias, n, c, [&](int64_t i, const float (&b)[W]) {
      float v[W], res[W];
      LdN<W>(x + i, v);
      LdN<W>(residual + i, res);
      for (int j = 0; j < W; ++j) v[j] = (v[j] + b[j]) + res[j];
      StN<W>(x + i, v);
    });
  };
  WithWidth(vec, body);
}

// Elements i .. i + W - 1 of a flat kernel: out = f(a) or f(a, b), element by element.
template <int W, typename A, typename O, typename F>
__device__ __forceinline__ void Map1(const A* a, O* out, int64_t i, const F& f) {
  float u[W];
  LdN<W>(a + i, u);
  for (int j = 0; j < W; ++j) u[j] = f(u[j]);
  StN<W>(out + i, u);
}
template <int W, typename A, typename B, typename O, typename F>
__device__ __forceinline__ void Map2(const A* a, const B* b, O* out, int64_t i, const F& f) {
  float u[W], v[W];
  LdN<W>(a + i, u);
  LdN<W>(b + i, v);
  for (int j = 0; j < W; ++j) u[j] = f(u[j], v[j]);
  StN<W>(out + i, u);
}

// y may alias x: elements are read before the same thread writes them, here and in the other
// flat kernels (out may alias a or b of its type).
template <typename T>
__global__ void GeluForwardKernel(const T* x, T* y, int64_t n, bool vec) {
  ForElements(n, vec, [&](auto w, int64_t i) {
    Map1<decltype(w)::value>(x, y, i, [](float v) {
      const float cube = 0.044715f * v * v * v;
      return 0.5f * v * (1.0f + tanhf(kGeluScale * (v + cube)));
    });
  });
}

template <typename T>
__global__ void GeluBackwardKernel(const T* dy, const T* x, T* dx, int64_t n, bool vec) {
  ForElements(n, vec, [&](auto w, int64_t i) {
    Map2<decltype(w)::value>(x, dy, dx, i, [](float v, float g) {
      const float t = tanhf(kGeluScale * (v + 0.044715f * v * v * v));
      const float sech2 = 1.0f - t * t;
      const float local =
          0.5f * (1.0f + t) + 0.5f * v * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * v * v);
      return local * g;
    });
  });
}

template <typename A, typename B, typename O>
__global__ void AddKernel(const A* a, const B* b, O* out, int64_t n, bool vec) {
  ForElements(n, vec, [&](auto w, int64_t i) {
    Map2<decltype(w)::value>(a, b, out, i, [](float u, float v) { return u + v; });
  });
}

template <typename X, typename Y>
__global__ void AxpyKernel(float alpha, const X* x, Y* y, int64_t n, bool vec) {
  ForElements(n, vec, [&](auto w, int64_t i) {
    Map2<decltype(w)::value>(y, x, y, i, [alpha](float u, float v) { return u + alpha * v; });
  });
}

template <typename X>
__global__ void ScaleKernel(float alpha, X* x, int64_t n, bool vec) {
  ForElements(n, vec, [&](auto w, int64_t i) {
    Map1<decltype(w)::value>(x, x, i, [alpha](float u) { return u * alpha; });
  });
}

template <typename X>
__global__ void FillKernel(float value, X* x, int64_t n, bool vec) {
  ForElements(n, vec, [&](auto w, int64_t i) {
    constexpr int W = decltype(w)::value;
    float u[W];
    for (int j = 0; j < W; ++j) u[j] = value;
    StN<W>(x + i, u);
  });
}

// ---- LayerNorm ---------------------------------------------------------------------------------

// Two passes over the row (mean, then the biased variance of x - mean) as the CPU backend does.
// y may alias x: each lane writes only the elements it reads in the last loop, after both warp
// reductions (which every lane reaches only once its reads are done).
// One warp a row; each lane takes W consecutive elements at a time (elements W lane .. +W-1,
// then 32 W further on): W = kVec with 16-byte loads and stores where the row length is a
// multiple of kVec and every operand 16-byte aligned (the launchers' RowsVec), else 1. The
// per-element arithmetic is the same either way; the lanes' partial sums take their elements in
// another order, so the W = 8 and W = 1 sums may differ in the last bits (deterministic each).
// One warp's LayerNorm of row `row` (xr) into y, given each lane's sum of its elements: the mean,
// the biased variance of x - mean (a second pass), the output, and the row's mean and rstd.
template <int W, typename T>
__device__ void NormaliseRow(const T* xr, float lane_sum, const T* gamma, const T* beta,
                             float eps, int64_t row, int64_t c, int lane, T* y, float* mean,
                             float* rstd) {
  const float m = WarpSum(lane_sum) / float(c);
  float var = 0.0f;
  for (int64_t i = int64_t(lane) * W; i < c; i += int64_t(kWarp) * W) {
    float x[W];
    LdN<W>(xr + i, x);
    for (int k = 0; k < W; ++k) {
      const float d = x[k] - m;
      var += d * d;
    }
  }
  const float s = 1.0f / sqrtf(WarpSum(var) / float(c) + eps);
  T* yr = y + row * c;
  for (int64_t i = int64_t(lane) * W; i < c; i += int64_t(kWarp) * W) {
    float x[W], g[W], b[W];
    LdN<W>(xr + i, x);
    LdN<W>(gamma + i, g);
    LdN<W>(beta + i, b);
    for (int k = 0; k < W; ++k) x[k] = (x[k] - m) * s * g[k] + b[k];
    StN<W>(yr + i, x);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

template <int W, typename T>
__global__ void LayerNormForwardKernel(const T* x, const T* gamma, const T* beta, float eps,
                                       int64_t n, int64_t c, T* y, float* mean, float* rstd) {
  const int lane = Lane();
  for (int64_t row = WarpIndex(); row < n; row += WarpCount()) {
    const T* xr = x + row * c;
    float sum = 0.0f;
    for (int64_t i = int64_t(lane) * W; i < c; i += int64_t(kWarp) * W) {
      float v[W];
      LdN<W>(xr + i, v);
      for (int k = 0; k < W; ++k) sum += v[k];
    }
    NormaliseRow<W>(xr, sum, gamma, beta, eps, row, c, lane, y, mean, rstd);
  }
}

// AddBiasResidual, then NormaliseRow on the stored (rounded) sums: each lane re-reads only the
// elements it stored itself, so no synchronisation is needed.
template <int W, typename T>
__global__ void AddBiasResidualLayerNormKernel(T* x, const T* bias, const T* residual,
                                               const T* gamma, const T* beta, float eps,
                                               int64_t n, int64_t c, T* y, float* mean,
                                               float* rstd) {
  const int lane = Lane();
  for (int64_t row = WarpIndex(); row < n; row += WarpCount()) {
    T* xr = x + row * c;
    const T* rr = residual + row * c;
    float sum = 0.0f;
    for (int64_t i = int64_t(lane) * W; i < c; i += int64_t(kWarp) * W) {
      float v[W], b[W], r[W];
      LdN<W>(xr + i, v);
      LdN<W>(bias + i, b);
      LdN<W>(rr + i, r);
      for (int k = 0; k < W; ++k) v[k] = (v[k] + b[k]) + r[k];
      StN<W>(xr + i, v);
      LdN<W>(xr + i, v);  // as stored
      for (int k = 0; k < W; ++k) sum += v[k];
    }
    NormaliseRow<W>(xr, sum, gamma, beta, eps, row, c, lane, y, mean, rstd);
  }
}

template <int W, typename T>
__global__ void LayerNormBackwardInputKernel(const T* dy, const T* x, const T* gamma,
                                             const float* mean, const float* rstd, int64_t n,
                                             int64_t c, T* dx) {
  const int lane = Lane();
  for (int64_t row = WarpIndex(); row < n; row += WarpCount()) {
    const T* gr = dy + row * c;
    const T* xr = x + row * c;
    const float m = mean[row], s = rstd[row];
    // xhat and gamma * dy of elements i .. i + W - 1 (both passes read them).
    auto norms = [&](int64_t i, float (&xhat)[W], float (&dnorm)[W]) {
      float g[W], d[W];
      LdN<W>(xr + i, xhat);
      LdN<W>(gamma + i, g);
      LdN<W>(gr + i, d);
      for (int k = 0; k < W; ++k) {
        xhat[k] = (xhat[k] - m) * s;
        dnorm[k] = g[k] * d[k];
      }
    };
    // mean(gamma * dy) and mean(gamma * dy * xhat) over the row.
    float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
    for (int64_t i = int64_t(lane) * W; i < c; i += int64_t(kWarp) * W) {
      float xhat[W], dnorm[W];
      norms(i, xhat, dnorm);
      for (int k = 0; k < W; ++k) {
        dnorm_sum += dnorm[k];
        dnorm_norm_sum += dnorm[k] * xhat[k];
      }
    }
    const float dnorm_mean = WarpSum(dnorm_sum) / float(c);
    const float dnorm_norm_mean = WarpSum(dnorm_norm_sum) / float(c);
    T* dr = dx + row * c;
    for (int64_t i = int64_t(lane) * W; i < c; i += int64_t(kWarp) * W) {
      float xhat[W], dnorm[W], out[W];
      norms(i, xhat, dnorm);
      LdN<W>(dr + i, out);
      for (int k = 0; k < W; ++k)
        out[k] = out[k] + (dnorm[k] - dnorm_mean - xhat[k] * dnorm_norm_mean) * s;
      StN<W>(dr + i, out);
    }
  }
}

// ---- attention -----------------------------------------------------------------------------

// The element of a token-row activation that element `idx` of heads (nmat, L, s, d) maps to.
__device__ __forceinline__ int64_t RowElement(const HeadLayout& lay, int64_t idx) {
  const int64_t i = idx % lay.d;
  int64_t rest = idx / lay.d;
  const int64_t t = rest % lay.s;
  rest /= lay.s;
  const int64_t l = lay.b * lay.nh;
  const int64_t bh = rest % l;
  const int64_t mat = rest / l;
  const int64_t bi = bh / lay.nh, j = bh % lay.nh;
  const int64_t row = lay.seq_first ? t * lay.b + bi : bi * lay.s + t;
  const int64_t a = lay.nh * lay.d;
  return row * (lay.nmat * a) + mat * a + j * lay.d + i;
}

template <typename T>
__global__ void RowsToHeadsKernel(const T* rows, HeadLayout lay, int64_t total, float* heads) {
  for (int64_t idx = ThreadIndex(); idx < total; idx += ThreadCount())
    heads[idx] = Ld(rows + RowElement(lay, idx));
}

template <typename T>
__global__ void HeadsToRowsKernel(const float* heads, HeadLayout lay, int64_t total, T* rows) {
  for (int64_t idx = ThreadIndex(); idx < total; idx += ThreadCount())
    St(rows + RowElement(lay, idx), heads[idx]);
}

// Row r of the (L*s, s) scores is query position t = r % s; it sees keys 0..t. Each lane reads
// back only the elements it wrote.
__global__ void CausalSoftmaxForwardKernel(float* p, int64_t rows, int64_t s, float scale) {
  const int lane = Lane();
  for (int64_t r = WarpIndex(); r < rows; r += WarpCount()) {
    float* pr = p + r * s;
    const int64_t t = r % s;
    float mx = -INFINITY;
    for (int64_t u = lane; u <= t; u += kWarp) mx = fmaxf(mx, pr[u] * scale);
    mx = WarpMax(mx);
    float sum = 0.0f;
    for (int64_t u = lane; u <= t; u += kWarp) {
      const float e = expf(pr[u] * scale - mx);
      pr[u] = e;
      sum += e;
    }
    const float inv = 1.0f / WarpSum(sum);
    for (int64_t u = lane; u < s; u += kWarp) pr[u] = u <= t ? pr[u] * inv : 0.0f;
  }
}

__global__ void CausalSoftmaxBackwardKernel(const float* p, float* dp, int64_t rows, int64_t s,
                                            float scale) {
  const int lane = Lane();
  for (int64_t r = WarpIndex(); r < rows; r += WarpCount()) {
    const float* pr = p + r * s;
    float* dr = dp + r * s;
    const int64_t t = r % s;
    float dot = 0.0f;
    for (int64_t u = lane; u <= t; u += kWarp) dot += pr[u] * dr[u];
    dot = WarpSum(dot);
    for (int64_t u = lane; u < s; u += kWarp) dr[u] = u <= t ? pr[u] * (dr[u] - dot) * scale : 0.0f;
  }
}

// ---- fp32 <-> bf16 (Backend::Copy between the two) ----------------------------------------------

__global__ void ToBf16Kernel(const float* x, __nv_bfloat16* y, int64_t n) {
  for (int64_t i = ThreadIndex(); i < n; i += ThreadCount()) y[i] = __float2bfloat16_rn(x[i]);
}

__global__ void FromBf16Kernel(const __nv_bfloat16* x, float* y, int64_t n) {
  for (int64_t i = ThreadIndex(); i < n; i += ThreadCount()) y[i] = __bfloat162float(x[i]);
}

// ---- MoE combine -------------------------------------------------------------------------------

// out may alias x (of its type): element i is read before the same thread writes it.
template <typename X, typename O>
__global__ void ScaleRowsKernel(const X* x, const float* scale, int64_t total, int64_t c, O* out) {
  for (int64_t i = ThreadIndex(); i < total; i += ThreadCount())
    St(out + i, Ld(x + i) * scale[i / c]);
}

template <typename A, typename B>
__global__ void RowDotKernel(const A* a, const B* b, int64_t n, int64_t c, float* out) {
  const int lane = Lane();
  for (int64_t r = WarpIndex(); r < n; r += WarpCount()) {
    double acc = 0.0;
    for (int64_t j = lane; j < c; j += kWarp) acc += double(Ld(a + r * c + j)) * Ld(b + r * c + j);
    acc = WarpSum(acc);
    if (lane == 0) out[r] = float(acc);
  }
}

// ---- context-parallel attention blocks ---------------------------------------------------------

__device__ __forceinline__ int64_t BlockPos(int64_t u, int64_t len, int64_t first0,
                                            int64_t first1) {
  return u < len ? first0 + u : first1 + (u - len);
}

template <typename T>
__device__ __forceinline__ float Dot(const T* x, const T* y, int64_t d) {
  float acc = 0.0f;
  for (int64_t c = 0; c < d; ++c) acc += Ld(x + c) * Ld(y + c);
  return acc;
}

template <typename T>
__global__ void AttentionBlockForwardKernel(const T* qkv, const T* kv, BlockAttention a,
                                            bool first, float* out, float* lse) {
  const int64_t nq = 2 * a.lq, nk = 2 * a.lk, A = a.nh * a.d, total = a.b * a.nh * nq;
  const float scale = rsqrtf(float(a.d));
  const float neg_inf = -INFINITY;
  for (int64_t i = ThreadIndex(); i < total; i += ThreadCount()) {
    const int64_t u = i % nq, j = (i / nq) % a.nh, bi = i / (nq * a.nh);
    const int64_t qp = BlockPos(u, a.lq, a.q0, a.q1);
    const T* q = qkv + (u * a.b + bi) * 3 * A + j * a.d;
    float m = neg_inf;
    for (int64_t v = 0; v < nk; ++v) {
      if (BlockPos(v, a.lk, a.k0, a.k1) > qp) continue;
      m = fmaxf(m, Dot(q, kv + (v * a.b + bi) * 2 * A + j * a.d, a.d) * scale);
    }
    float lse_b = neg_inf;
    float acc[kMaxBlockHeadDim];
    for (int64_t c = 0; c < a.d; ++c) acc[c] = 0.0f;
    if (m != neg_inf) {
      float l = 0.0f;
      for (int64_t v = 0; v < nk; ++v) {
        if (BlockPos(v, a.lk, a.k0, a.k1) > qp) continue;
        const T* kr = kv + (v * a.b + bi) * 2 * A + j * a.d;
        const float p = expf(Dot(q, kr, a.d) * scale - m);
        l += p;
        for (int64_t c = 0; c < a.d; ++c) acc[c] += p * Ld(kr + A + c);
      }
      for (int64_t c = 0; c < a.d; ++c) acc[c] /= l;
      lse_b = m + logf(l);
    }
    float* o = out + (u * a.b + bi) * A + j * a.d;
    float& lr = lse[(bi * a.nh + j) * nq + u];
    const float lo = first ? neg_inf : lr;
    if (first || (lo == neg_inf && lse_b != neg_inf)) {
      for (int64_t c = 0; c < a.d; ++c) o[c] = acc[c];
      lr = lse_b;
    } else if (lse_b != neg_inf) {
      const float mx = fmaxf(lo, lse_b);
      const float ln = mx + logf(expf(lo - mx) + expf(lse_b - mx));
      const float wo = expf(lo - ln), wb = expf(lse_b - ln);
      for (int64_t c = 0; c < a.d; ++c) o[c] = o[c] * wo + acc[c] * wb;
      lr = ln;
    }
  }
}

template <typename T>
__global__ void AttentionBlockDqKernel(const T* dout, const T* qkv, const T* kv, const T* out,
                                       const float* lse, BlockAttention a, float* dqkv) {
  const int64_t nq = 2 * a.lq, nk = 2 * a.lk, A = a.nh * a.d, total = a.b * a.nh * nq;
  const float scale = rsqrtf(float(a.d));
  for (int64_t i = ThreadIndex(); i < total; i += ThreadCount()) {
    const int64_t u = i % nq, j = (i / nq) % a.nh, bi = i / (nq * a.nh);
    const int64_t qp = BlockPos(u, a.lq, a.q0, a.q1);
    const float lu = lse[(bi * a.nh + j) * nq + u];
    if (lu == -INFINITY) continue;
    const T* q = qkv + (u * a.b + bi) * 3 * A + j * a.d;
    const T* g = dout + (u * a.b + bi) * A + j * a.d;
    const float D = Dot(g, out + (u * a.b + bi) * A + j * a.d, a.d);
    float acc[kMaxBlockHeadDim];
    for (int64_t c = 0; c < a.d; ++c) acc[c] = 0.0f;
    for (int64_t v = 0; v < nk; ++v) {
      if (BlockPos(v, a.lk, a.k0, a.k1) > qp) continue;
      const T* kr = kv + (v * a.b + bi) * 2 * A + j * a.d;
      const float p = expf(Dot(q, kr, a.d) * scale - lu);
      const float ds = p * (Dot(g, kr + A, a.d) - D) * scale;
      for (int64_t c = 0; c < a.d; ++c) acc[c] += ds * Ld(kr + c);
    }
    float* dq = dqkv + (u * a.b + bi) * 3 * A + j * a.d;
    for (int64_t c = 0; c < a.d; ++c) dq[c] += acc[c];
  }
}

template <typename T>
__global__ void AttentionBlockDkvKernel(const T* dout, const T* qkv, const T* kv, const T* out,
                                        const float* lse, BlockAttention a, float* dkv) {
  const int64_t nq = 2 * a.lq, nk = 2 * a.lk, A = a.nh * a.d, total = a.b * a.nh * nk;
  const float scale = rsqrtf(float(a.d));
  for (int64_t i = ThreadIndex(); i < total; i += ThreadCount()) {
    const int64_t v = i % nk, j = (i / nk) % a.nh, bi = i / (nk * a.nh);
    const int64_t kp = BlockPos(v, a.lk, a.k0, a.k1);
    const T* kr = kv + (v * a.b + bi) * 2 * A + j * a.d;
    float dk[kMaxBlockHeadDim], dv[kMaxBlockHeadDim];
    for (int64_t c = 0; c < a.d; ++c) dk[c] = dv[c] = 0.0f;
    for (int64_t u = 0; u < nq; ++u) {
      if (kp > BlockPos(u, a.lq, a.q0, a.q1)) continue;
      const float lu = lse[(bi * a.nh + j) * nq + u];
      if (lu == -INFINITY) continue;
      const T* q = qkv + (u * a.b + bi) * 3 * A + j * a.d;
      const T* g = dout + (u * a.b + bi) * A + j * a.d;
      const float D = Dot(g, out + (u * a.b + bi) * A + j * a.d, a.d);
      const float p = expf(Dot(q, kr, a.d) * scale - lu);
      const float ds = p * (Dot(g, kr + A, a.d) - D) * scale;
      for (int64_t c = 0; c < a.d; ++c) {
        dk[c] += ds * Ld(q + c);
        dv[c] += p * Ld(g + c);
      }
    }
    float* dr = dkv + (v * a.b + bi) * 2 * A + j * a.d;
    for (int64_t c = 0; c < a.d; ++c) {
      dr[c] += dk[c];
      dr[A + c] += dv[c];
    }
  }
}

// ---- embedding ---------------------------------------------------------------------------------

template <typename T>
__global__ void EmbeddingForwardKernel(const int32_t* tokens, int64_t total, const T* table,
                                       int64_t v, int64_t h, int64_t vocab_start, T* out) {
  for (int64_t i = ThreadIndex(); i < total; i += ThreadCount()) {
    const int64_t n = i / h, col = i - n * h;
    const int64_t row = int64_t(tokens[n]) - vocab_start;
    St(out + i, (row >= 0 && row < v) ? Ld(table + row * h + col) : 0.0f);
  }
}

// Thread (x, y) of block (bx, by) owns column bx*32 + x of the table rows r with
// r % groups == by*8 + y, and walks all tokens in order: every table element is updated by one
// thread, token by token, in the CPU backend's order. Token ids are staged kEmbTokens at a time.
template <typename T>
__global__ void EmbeddingBackwardKernel(const T* dout, const int32_t* tokens, int64_t n,
                                        int64_t vocab_start, int64_t v, int64_t h, int64_t groups,
                                        float* dtable) {
  __shared__ int32_t row_s[kEmbTokens];    // table row of each staged token, -1 outside the shard
  __shared__ int32_t group_s[kEmbTokens];  // its row group, -1 outside the shard
  const int64_t col = int64_t(blockIdx.x) * kEmbCols + threadIdx.x;
  const int64_t group = int64_t(blockIdx.y) * kEmbGroupsPerBlock + threadIdx.y;
  const int tid = int(threadIdx.y) * kEmbCols + int(threadIdx.x);
  const bool active = col < h && group < groups;
  for (int64_t n0 = 0; n0 < n; n0 += kEmbTokens) {
    const int count = int(n - n0 < kEmbTokens ? n - n0 : kEmbTokens);
    __syncthreads();  // every thread is done with the previous round's ids
    for (int k = tid; k < count; k += kEmbCols * kEmbGroupsPerBlock) {
      const int64_t r = int64_t(tokens[n0 + k]) - vocab_start;
      const bool in_shard = r >= 0 && r < v;
      row_s[k] = in_shard ? int32_t(r) : -1;
      group_s[k] = in_shard ? int32_t(r % groups) : -1;
    }
    __syncthreads();
    if (!active) continue;
    for (int k = 0; k < count; ++k) {
      if (group_s[k] != group) continue;
      dtable[int64_t(row_s[k]) * h + col] += Ld(dout + (n0 + k) * h + col);
    }
  }
}

// ---- cross entropy -------------------------------------------------------------------------------

// The logits kernels read rows of the vocabulary shard v (50304 for GPT-2): kVec elements a
// lane with 16-byte loads when v % kVec == 0 and the logits are 16-byte aligned (then so is every
// row), else one (`vec`, LogitsVec).
template <typename T>
__global__ void CrossEntropyMaxKernel(const T* logits, int64_t n, int64_t v, float* row_max,
                                      bool vec) {
  const int lane = Lane();
  for (int64_t row = WarpIndex(); row < n; row += WarpCount()) {
    const T* lr = logits + row * v;
    float m = -INFINITY;
    WithWidth(vec, [&](auto width) {
      constexpr int W = decltype(width)::value;
      for (int64_t i = int64_t(lane) * W; i < v; i += int64_t(kWarp) * W) {
        float x[W];
        LdN<W>(lr + i, x);
        for (int k = 0; k < W; ++k) m = fmaxf(m, x[k]);
      }
    });
    m = WarpMax(m);
    if (lane == 0) row_max[row] = m;
  }
}

template <typename T>
__global__ void CrossEntropySumExpKernel(const T* logits, const float* row_max, int64_t n,
                                         int64_t v, float* sum_exp, bool vec) {
  const int lane = Lane();
  for (int64_t row = WarpIndex(); row < n; row += WarpCount()) {
    const T* lr = logits + row * v;
    const float m = row_max[row];
    double sum = 0.0;  // as the CPU backend: a row has up to ~50k terms
    WithWidth(vec, [&](auto width) {
      constexpr int W = decltype(width)::value;
      for (int64_t i = int64_t(lane) * W; i < v; i += int64_t(kWarp) * W) {
        float x[W];
        LdN<W>(lr + i, x);
        for (int k = 0; k < W; ++k) sum += expf(x[k] - m);
      }
    });
    sum = WarpSum(sum);
    if (lane == 0) sum_exp[row] = float(sum);
  }
}

template <typename T>
__global__ void CrossEntropyTargetKernel(const T* logits, const int32_t* targets, int64_t n,
                                         int64_t v, int64_t vocab_start, float* target_logit) {
  for (int64_t row = ThreadIndex(); row < n; row += ThreadCount()) {
    const int64_t col = int64_t(targets[row]) - vocab_start;
    target_logit[row] = (col >= 0 && col < v) ? Ld(logits + row * v + col) : 0.0f;
  }
}

__global__ void CrossEntropyLossKernel(const float* row_max, const float* sum_exp,
                                       const float* target_logit, int64_t n, float* loss) {
  for (int64_t row = ThreadIndex(); row < n; row += ThreadCount())
    loss[row] = logf(sum_exp[row]) + row_max[row] - target_logit[row];
}

// One block a row (grid-stride over rows), its threads over the columns: the row's max, 1/sum
// and target read once, no division per element (a flat loop's 64-bit i / v cost more than the
// arithmetic, over 412M logits a GPT-2 micro-batch of 8). Each element's arithmetic is the flat
// loop's: p = exp(x - m) * (1 / sum), (p - onehot) * scale. Element i is read before the same
// thread writes it: dlogits may alias logits.
template <typename T>
__global__ void CrossEntropyBackwardKernel(const T* logits, const int32_t* targets, int64_t n,
                                           int64_t v, int64_t vocab_start, const float* row_max,
                                           const float* sum_exp, float scale, T* dlogits,
                                           bool vec) {
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const float m = row_max[row], inv = 1.0f / sum_exp[row];
    const int64_t target = int64_t(targets[row]) - vocab_start;
    const T* lr = logits + row * v;
    T* dr = dlogits + row * v;
    WithWidth(vec, [&](auto width) {
      constexpr int W = decltype(width)::value;
      for (int64_t i = int64_t(threadIdx.x) * W; i < v; i += int64_t(blockDim.x) * W) {
        float x[W];
        LdN<W>(lr + i, x);
        for (int k = 0; k < W; ++k) {
          const float p = expf(x[k] - m) * inv;
          x[k] = (p - (i + k == target ? 1.0f : 0.0f)) * scale;
        }
        StN<W>(dr + i, x);
      }
    });
  }
}

// ---- sums ------------------------------------------------------------------------------------

// Sums kThreads doubles of shared memory in a fixed tree; the result is in acc[0].
__device__ void BlockTreeSum(double* acc) {
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (int(threadIdx.x) < w) acc[threadIdx.x] += acc[threadIdx.x + w];
    __syncthreads();
  }
}

template <typename X>
__global__ void SumPartialsKernel(const X* x, int64_t n, bool squares, double* partials) {
  __shared__ double acc[kThreads];
  double sum = 0.0;
  for (int64_t i = ThreadIndex(); i < n; i += ThreadCount()) {
    const double v = Ld(x + i);
    sum += squares ? v * v : v;
  }
  acc[threadIdx.x] = sum;
  BlockTreeSum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc[0];
}

// One block.
__global__ void SumFinalizeKernel(const double* partials, int64_t blocks, float* out) {
  __shared__ double acc[kThreads];
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < blocks; i += kThreads) sum += partials[i];
  acc[threadIdx.x] = sum;
  BlockTreeSum(acc);
  if (threadIdx.x == 0) out[0] += float(acc[0]);
}

// ---- AdamW -------------------------------------------------------------------------------------

// kVec elements a thread with 16-byte loads and stores (two float4 per array) where all four
// arrays are 16-byte aligned, else one; each element's arithmetic the same either way.
__global__ void AdamWKernel(float* param, const float* grad, float* m, float* v, int64_t n,
                            AdamWArgs a, bool vec) {
  ForElements(n, vec, [&](auto width, int64_t i) {
    constexpr int W = decltype(width)::value;
    float pw[W], gw[W], mw[W], vw[W];
    LdN<W>(param + i, pw);
    LdN<W>(grad + i, gw);
    LdN<W>(m + i, mw);
    LdN<W>(v + i, vw);
    for (int k = 0; k < W; ++k) {
      const float g = gw[k] * a.grad_scale;
      const float mi = a.beta1 * mw[k] + (1.0f - a.beta1) * g;
      const float vi = a.beta2 * vw[k] + (1.0f - a.beta2) * g * g;
      mw[k] = mi;
      vw[k] = vi;
      const float m_hat = mi / a.bias_correction1;
      const float v_hat = vi / a.bias_correction2;
      pw[k] -= a.lr * (m_hat / (sqrtf(v_hat) + a.eps) + a.weight_decay * pw[k]);
    }
    StN<W>(m + i, mw);
    StN<W>(v + i, vw);
    StN<W>(param + i, pw);
  });
}

}  // namespace

// ---- launchers -----------------------------------------------------------------------------------

RowSplit SplitRows(int64_t n) {
  if (n <= 0) return {};
  RowSplit split;
  split.rows_per_chunk = std::max(kMinRowsPerChunk, (n + kMaxBlocks - 1) / kMaxBlocks);
  split.chunks = (n + split.rows_per_chunk - 1) / split.rows_per_chunk;  // <= 65535 (gridDim.y)
  return split;
}

// The column-sum kernels' vector path (kVec columns a thread): whole groups in every row, the
// rows 16-byte aligned. Their grid: blocks of kColTile threads x w columns, one row per chunk.
template <typename... P>
bool ColumnsVec(int64_t c, const P*... p) {
  return c % kVec == 0 && Aligned16(p...);
}
dim3 ColumnGrid(int64_t c, int64_t w, const RowSplit& split) {
  return dim3(unsigned((c + kColTile * w - 1) / (kColTile * w)), unsigned(split.chunks));
}

template <typename T>
cudaError_t BiasGradPartials(const T* dy, int64_t n, int64_t c, RowSplit split, float* partials,
                             cudaStream_t st) {
  if (split.chunks == 0 || c == 0) return cudaSuccess;
  const dim3 block(kColTile, kColLanes);
  if (ColumnsVec(c, dy))
    BiasGradPartialsKernel<kVec, T><<<ColumnGrid(c, kVec, split), block, 0, st>>>(
        dy, n, c, split.rows_per_chunk, partials);
  else
    BiasGradPartialsKernel<1, T><<<ColumnGrid(c, 1, split), block, 0, st>>>(
        dy, n, c, split.rows_per_chunk, partials);
  return cudaGetLastError();
}

cudaError_t ColumnFinalize(const float* partials, int64_t chunks, int64_t c, float* out,
                           cudaStream_t st) {
  if (chunks == 0 || c == 0) return cudaSuccess;
  ColumnFinalizeKernel<<<Blocks(c, kThreads), kThreads, 0, st>>>(partials, chunks, c, out);
  return cudaGetLastError();
}

// The grid of a kernel with threads over columns and blocks over row bands (AddBiasKernel):
// about 1024 blocks (a few per SM, to hide the memory latency).
dim3 ColumnsByRowBands(int64_t n, int64_t c) {
  const unsigned cols = Blocks(c, kThreads);
  const unsigned rows =
      unsigned(std::clamp<int64_t>(1024 / int64_t(cols), 1, std::min<int64_t>(n, kMaxBlocks)));
  return dim3(cols, rows);
}

template <typename T>
cudaError_t AddBias(T* y, const T* bias, int64_t n, int64_t c, cudaStream_t st) {
  if (n == 0 || c == 0) return cudaSuccess;
  const bool vec = c % kVec == 0 && Aligned16(y, bias);
  AddBiasKernel<T><<<ColumnsByRowBands(n, vec ? c / kVec : c), kThreads, 0, st>>>(y, bias, n, c,
                                                                                  vec);
  return cudaGetLastError();
}

template <typename T>
cudaError_t AddBiasResidual(T* x, const T* bias, const T* residual, int64_t n, int64_t c,
                            cudaStream_t st) {
  if (n == 0 || c == 0) return cudaSuccess;
  const bool vec = c % kVec == 0 && Aligned16(x, bias, residual);
  AddBiasResidualKernel<T><<<ColumnsByRowBands(n, vec ? c / kVec : c), kThreads, 0, st>>>(
      x, bias, residual, n, c, vec);
  return cudaGetLastError();
}

// The row kernels' vector path (LayerNorm's): whole kVec groups in every row of c, every
// operand 16-byte aligned (then so is every row).
template <typename... P>
bool RowsVec(int64_t c, const P*... p) {
  return c % kVec == 0 && Aligned16(p...);
}

template <typename T>
cudaError_t AddBiasResidualLayerNorm(T* x, const T* bias, const T* residual, const T* gamma,
                                     const T* beta, float eps, int64_t n, int64_t c, T* y,
                                     float* mean, float* rstd, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  if (RowsVec(c, x, bias, residual, gamma, beta, y))
    AddBiasResidualLayerNormKernel<kVec, T><<<RowBlocks(n), kThreads, 0, st>>>(
        x, bias, residual, gamma, beta, eps, n, c, y, mean, rstd);
  else
    AddBiasResidualLayerNormKernel<1, T><<<RowBlocks(n), kThreads, 0, st>>>(
        x, bias, residual, gamma, beta, eps, n, c, y, mean, rstd);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LayerNormForward(const T* x, const T* gamma, const T* beta, float eps, int64_t n,
                             int64_t c, T* y, float* mean, float* rstd, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  if (RowsVec(c, x, gamma, beta, y))
    LayerNormForwardKernel<kVec, T><<<RowBlocks(n), kThreads, 0, st>>>(x, gamma, beta, eps, n, c,
                                                                        y, mean, rstd);
  else
    LayerNormForwardKernel<1, T><<<RowBlocks(n), kThreads, 0, st>>>(x, gamma, beta, eps, n, c, y,
                                                                     mean, rstd);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LayerNormBackwardInput(const T* dy, const T* x, const T* gamma, const float* mean,
                                   const float* rstd, int64_t n, int64_t c, T* dx,
                                   cudaStream_t st) {
  if (n == 0 || c == 0) return cudaSuccess;
  if (RowsVec(c, dy, x, gamma, dx))
    LayerNormBackwardInputKernel<kVec, T><<<RowBlocks(n), kThreads, 0, st>>>(dy, x, gamma, mean,
                                                                              rstd, n, c, dx);
  else
    LayerNormBackwardInputKernel<1, T><<<RowBlocks(n), kThreads, 0, st>>>(dy, x, gamma, mean,
                                                                           rstd, n, c, dx);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LayerNormParamPartials(const T* dy, const T* x, const float* mean, const float* rstd,
                                   int64_t n, int64_t c, RowSplit split, float* dgamma_partials,
                                   float* dbeta_partials, cudaStream_t st) {
  if (split.chunks == 0 || c == 0) return cudaSuccess;
  const dim3 block(kColTile, kColLanes);
  if (ColumnsVec(c, dy, x))
    LayerNormParamPartialsKernel<kVec, T><<<ColumnGrid(c, kVec, split), block, 0, st>>>(
        dy, x, mean, rstd, n, c, split.rows_per_chunk, dgamma_partials, dbeta_partials);
  else
    LayerNormParamPartialsKernel<1, T><<<ColumnGrid(c, 1, split), block, 0, st>>>(
        dy, x, mean, rstd, n, c, split.rows_per_chunk, dgamma_partials, dbeta_partials);
  return cudaGetLastError();
}

template <typename T>
cudaError_t GeluForward(const T* x, T* y, int64_t n, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  const bool vec = Aligned16(x, y);
  GeluForwardKernel<T><<<FlatBlocks(n, vec), kThreads, 0, st>>>(x, y, n, vec);
  return cudaGetLastError();
}

template <typename T>
cudaError_t GeluBackward(const T* dy, const T* x, T* dx, int64_t n, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  const bool vec = Aligned16(dy, x, dx);
  GeluBackwardKernel<T><<<FlatBlocks(n, vec), kThreads, 0, st>>>(dy, x, dx, n, vec);
  return cudaGetLastError();
}

template <typename T>
cudaError_t RowsToHeads(const T* rows, HeadLayout lay, float* heads, cudaStream_t st) {
  const int64_t total = lay.nmat * lay.b * lay.nh * lay.s * lay.d;
  if (total == 0) return cudaSuccess;
  RowsToHeadsKernel<T><<<Blocks(total, kThreads), kThreads, 0, st>>>(rows, lay, total, heads);
  return cudaGetLastError();
}

template <typename T>
cudaError_t HeadsToRows(const float* heads, HeadLayout lay, T* rows, cudaStream_t st) {
  const int64_t total = lay.nmat * lay.b * lay.nh * lay.s * lay.d;
  if (total == 0) return cudaSuccess;
  HeadsToRowsKernel<T><<<Blocks(total, kThreads), kThreads, 0, st>>>(heads, lay, total, rows);
  return cudaGetLastError();
}

cudaError_t CausalSoftmaxForward(float* p, int64_t l, int64_t s, float scale, cudaStream_t st) {
  if (l == 0 || s == 0) return cudaSuccess;
  CausalSoftmaxForwardKernel<<<RowBlocks(l * s), kThreads, 0, st>>>(p, l * s, s, scale);
  return cudaGetLastError();
}

cudaError_t CausalSoftmaxBackward(const float* p, float* dp, int64_t l, int64_t s, float scale,
                                  cudaStream_t st) {
  if (l == 0 || s == 0) return cudaSuccess;
  CausalSoftmaxBackwardKernel<<<RowBlocks(l * s), kThreads, 0, st>>>(p, dp, l * s, s, scale);
  return cudaGetLastError();
}

cudaError_t ToBf16(const float* x, bf16* y, int64_t n, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  ToBf16Kernel<<<Blocks(n, kThreads), kThreads, 0, st>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t FromBf16(const bf16* x, float* y, int64_t n, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  FromBf16Kernel<<<Blocks(n, kThreads), kThreads, 0, st>>>(x, y, n);
  return cudaGetLastError();
}

template <typename X, typename O>
cudaError_t ScaleRows(const X* x, const float* scale, int64_t n, int64_t c, O* out,
                      cudaStream_t st) {
  if (n == 0 || c == 0) return cudaSuccess;
  ScaleRowsKernel<X, O><<<Blocks(n * c, kThreads), kThreads, 0, st>>>(x, scale, n * c, c, out);
  return cudaGetLastError();
}

template <typename A, typename B>
cudaError_t RowDot(const A* a, const B* b, int64_t n, int64_t c, float* out, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  RowDotKernel<A, B><<<RowBlocks(n), kThreads, 0, st>>>(a, b, n, c, out);
  return cudaGetLastError();
}

template <typename T>
cudaError_t AttentionBlockForward(const T* qkv, const T* kv, BlockAttention a, bool first,
                                  float* out, float* lse, cudaStream_t st) {
  const int64_t rows = a.b * a.nh * 2 * a.lq;
  if (rows == 0 || a.d == 0) return cudaSuccess;
  if (a.d > kMaxBlockHeadDim) return cudaErrorInvalidValue;
  AttentionBlockForwardKernel<T><<<Blocks(rows, kThreads), kThreads, 0, st>>>(qkv, kv, a, first,
                                                                             out, lse);
  return cudaGetLastError();
}

template <typename T>
cudaError_t AttentionBlockBackward(const T* dout, const T* qkv, const T* kv, const T* out,
                                   const float* lse, BlockAttention a, float* dqkv, float* dkv,
                                   cudaStream_t st) {
  const int64_t qrows = a.b * a.nh * 2 * a.lq, krows = a.b * a.nh * 2 * a.lk;
  if (qrows == 0 || krows == 0 || a.d == 0) return cudaSuccess;
  if (a.d > kMaxBlockHeadDim) return cudaErrorInvalidValue;
  AttentionBlockDqKernel<T><<<Blocks(qrows, kThreads), kThreads, 0, st>>>(dout, qkv, kv, out, lse,
                                                                         a, dqkv);
  AttentionBlockDkvKernel<T><<<Blocks(krows, kThreads), kThreads, 0, st>>>(dout, qkv, kv, out,
                                                                          lse, a, dkv);
  return cudaGetLastError();
}

template <typename T>
cudaError_t EmbeddingForward(const int32_t* tokens, int64_t n, const T* table, int64_t v,
                             int64_t h, int64_t vocab_start, T* out, cudaStream_t st) {
  if (n == 0 || h == 0) return cudaSuccess;
  EmbeddingForwardKernel<T><<<Blocks(n * h, kThreads), kThreads, 0, st>>>(tokens, n * h, table,
                                                                          v, h, vocab_start, out);
  return cudaGetLastError();
}

template <typename T>
cudaError_t EmbeddingBackward(const T* dout, const int32_t* tokens, int64_t n,
                              int64_t vocab_start, int64_t v, int64_t h, float* dtable,
                              cudaStream_t st) {
  if (n == 0 || h == 0 || v == 0) return cudaSuccess;
  const int64_t col_blocks = (h + kEmbCols - 1) / kEmbCols;
  // Row groups: about kEmbTargetThreads threads in all, a multiple of 8, 8..64.
  const int64_t want = kEmbTargetThreads / (col_blocks * kEmbCols);
  const int64_t groups =
      std::clamp<int64_t>((want / kEmbGroupsPerBlock) * kEmbGroupsPerBlock, kEmbGroupsPerBlock,
                          kEmbMaxGroups);
  const dim3 grid(unsigned(col_blocks), unsigned(groups / kEmbGroupsPerBlock));
  EmbeddingBackwardKernel<T><<<grid, dim3(kEmbCols, kEmbGroupsPerBlock), 0, st>>>(
      dout, tokens, n, vocab_start, v, h, groups, dtable);
  return cudaGetLastError();
}

// The logits kernels' vector path: whole kVec groups in every row, each row 16-byte aligned.
template <typename T>
bool LogitsVec(const T* logits, int64_t v) {
  return v % kVec == 0 && Aligned16(logits);
}

template <typename T>
cudaError_t CrossEntropyMax(const T* logits, int64_t n, int64_t v, float* row_max,
                            cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  CrossEntropyMaxKernel<T>
      <<<RowBlocks(n), kThreads, 0, st>>>(logits, n, v, row_max, LogitsVec(logits, v));
  return cudaGetLastError();
}

template <typename T>
cudaError_t CrossEntropySumExp(const T* logits, const float* row_max, int64_t n, int64_t v,
                               float* sum_exp, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  CrossEntropySumExpKernel<T><<<RowBlocks(n), kThreads, 0, st>>>(logits, row_max, n, v, sum_exp,
                                                                  LogitsVec(logits, v));
  return cudaGetLastError();
}

template <typename T>
cudaError_t CrossEntropyTarget(const T* logits, const int32_t* targets, int64_t n, int64_t v,
                               int64_t vocab_start, float* target_logit, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  CrossEntropyTargetKernel<T><<<Blocks(n, kThreads), kThreads, 0, st>>>(logits, targets, n, v,
                                                                        vocab_start,
                                                                        target_logit);
  return cudaGetLastError();
}

cudaError_t CrossEntropyLoss(const float* row_max, const float* sum_exp, const float* target_logit,
                             int64_t n, float* loss, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  CrossEntropyLossKernel<<<Blocks(n, kThreads), kThreads, 0, st>>>(row_max, sum_exp,
                                                                   target_logit, n, loss);
  return cudaGetLastError();
}

template <typename T>
cudaError_t CrossEntropyBackward(const T* logits, const int32_t* targets, int64_t n, int64_t v,
                                 int64_t vocab_start, const float* row_max, const float* sum_exp,
                                 float scale, T* dlogits, cudaStream_t st) {
  if (n == 0 || v == 0) return cudaSuccess;
  const unsigned blocks = unsigned(std::min<int64_t>(n, 65535));
  CrossEntropyBackwardKernel<T><<<blocks, kThreads, 0, st>>>(
      logits, targets, n, v, vocab_start, row_max, sum_exp, scale, dlogits,
      LogitsVec(logits, v) && Aligned16(dlogits));
  return cudaGetLastError();
}

template <typename A, typename B, typename O>
cudaError_t Add(const A* a, const B* b, O* out, int64_t n, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  const bool vec = Aligned16(a, b, out);
  AddKernel<A, B, O><<<FlatBlocks(n, vec), kThreads, 0, st>>>(a, b, out, n, vec);
  return cudaGetLastError();
}

template <typename X, typename Y>
cudaError_t Axpy(float alpha, const X* x, Y* y, int64_t n, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  const bool vec = Aligned16(x, y);
  AxpyKernel<X, Y><<<FlatBlocks(n, vec), kThreads, 0, st>>>(alpha, x, y, n, vec);
  return cudaGetLastError();
}

template <typename X>
cudaError_t Scale(float alpha, X* x, int64_t n, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  const bool vec = Aligned16(x);
  ScaleKernel<X><<<FlatBlocks(n, vec), kThreads, 0, st>>>(alpha, x, n, vec);
  return cudaGetLastError();
}

template <typename X>
cudaError_t Fill(float value, X* x, int64_t n, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  const bool vec = Aligned16(x);
  FillKernel<X><<<FlatBlocks(n, vec), kThreads, 0, st>>>(value, x, n, vec);
  return cudaGetLastError();
}

int64_t SumBlocks(int64_t n) {
  if (n <= 0) return 0;
  return std::min<int64_t>((n + kThreads * kSumItemsPerThread - 1) / (kThreads * kSumItemsPerThread),
                           kSumMaxBlocks);
}

template <typename X>
cudaError_t SumPartials(const X* x, int64_t n, bool squares, double* partials, cudaStream_t st) {
  const int64_t blocks = SumBlocks(n);
  if (blocks == 0) return cudaSuccess;
  SumPartialsKernel<X><<<unsigned(blocks), kThreads, 0, st>>>(x, n, squares, partials);
  return cudaGetLastError();
}

cudaError_t SumFinalize(const double* partials, int64_t blocks, float* out, cudaStream_t st) {
  if (blocks == 0) return cudaSuccess;
  SumFinalizeKernel<<<1, kThreads, 0, st>>>(partials, blocks, out);
  return cudaGetLastError();
}

cudaError_t AdamW(float* param, const float* grad, float* m, float* v, int64_t n, AdamWArgs a,
                  cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  const bool vec = Aligned16(param, grad, m, v);
  AdamWKernel<<<FlatBlocks(n, vec), kThreads, 0, st>>>(param, grad, m, v, n, a, vec);
  return cudaGetLastError();
}

// ---- explicit instantiations --------------------------------------------------------------------
// Every template of kernels.cuh for each storage type (every combination for the multi-type
// ones): M(T) for T in {float, bf16}, M(X, Y) and M(A, B, O) over all pairs and triples.

#define PTDP_EACH_1(M) M(float) M(bf16)
#define PTDP_EACH_2(M) M(float, float) M(float, bf16) M(bf16, float) M(bf16, bf16)
#define PTDP_EACH_3(M)                                                                     \
  M(float, float, float) M(float, float, bf16) M(float, bf16, float) M(float, bf16, bf16) \
  M(bf16, float, float) M(bf16, float, bf16) M(bf16, bf16, float) M(bf16, bf16, bf16)

#define PTDP_INSTANTIATE_T(T)                                                                   \
  template cudaError_t BiasGradPartials<T>(const T*, int64_t, int64_t, RowSplit, float*,        \
                                           cudaStream_t);                                       \
  template cudaError_t AddBias<T>(T*, const T*, int64_t, int64_t, cudaStream_t);                \
  template cudaError_t AddBiasResidual<T>(T*, const T*, const T*, int64_t, int64_t,             \
                                          cudaStream_t);                                        \
  template cudaError_t AddBiasResidualLayerNorm<T>(T*, const T*, const T*, const T*, const T*,  \
                                                   float, int64_t, int64_t, T*, float*, float*, \
                                                   cudaStream_t);                               \
  template cudaError_t LayerNormForward<T>(const T*, const T*, const T*, float, int64_t,        \
                                           int64_t, T*, float*, float*, cudaStream_t);          \
  template cudaError_t LayerNormBackwardInput<T>(const T*, const T*, const T*, const float*,    \
                                                 const float*, int64_t, int64_t, T*,            \
                                                 cudaStream_t);                                 \
  template cudaError_t LayerNormParamPartials<T>(const T*, const T*, const float*, const float*, \
                                                 int64_t, int64_t, RowSplit, float*, float*,    \
                                                 cudaStream_t);                                 \
  template cudaError_t GeluForward<T>(const T*, T*, int64_t, cudaStream_t);                     \
  template cudaError_t GeluBackward<T>(const T*, const T*, T*, int64_t, cudaStream_t);          \
  template cudaError_t RowsToHeads<T>(const T*, HeadLayout, float*, cudaStream_t);              \
  template cudaError_t HeadsToRows<T>(const float*, HeadLayout, T*, cudaStream_t);              \
  template cudaError_t AttentionBlockForward<T>(const T*, const T*, BlockAttention, bool,       \
                                                float*, float*, cudaStream_t);                  \
  template cudaError_t AttentionBlockBackward<T>(const T*, const T*, const T*, const T*,        \
                                                 const float*, BlockAttention, float*, float*,  \
                                                 cudaStream_t);                                 \
  template cudaError_t EmbeddingForward<T>(const int32_t*, int64_t, const T*, int64_t, int64_t, \
                                           int64_t, T*, cudaStream_t);                          \
  template cudaError_t EmbeddingBackward<T>(const T*, const int32_t*, int64_t, int64_t, int64_t, \
                                            int64_t, float*, cudaStream_t);                     \
  template cudaError_t CrossEntropyMax<T>(const T*, int64_t, int64_t, float*, cudaStream_t);    \
  template cudaError_t CrossEntropySumExp<T>(const T*, const float*, int64_t, int64_t, float*,  \
                                             cudaStream_t);                                     \
  template cudaError_t CrossEntropyTarget<T>(const T*, const int32_t*, int64_t, int64_t,        \
                                             int64_t, float*, cudaStream_t);                    \
  template cudaError_t CrossEntropyBackward<T>(const T*, const int32_t*, int64_t, int64_t,      \
                                               int64_t, const float*, const float*, float, T*,  \
                                               cudaStream_t);                                   \
  template cudaError_t Scale<T>(float, T*, int64_t, cudaStream_t);                              \
  template cudaError_t Fill<T>(float, T*, int64_t, cudaStream_t);                               \
  template cudaError_t SumPartials<T>(const T*, int64_t, bool, double*, cudaStream_t);
#define PTDP_INSTANTIATE_2(X, Y)                                                                \
  template cudaError_t Axpy<X, Y>(float, const X*, Y*, int64_t, cudaStream_t);                  \
  template cudaError_t ScaleRows<X, Y>(const X*, const float*, int64_t, int64_t, Y*,            \
                                       cudaStream_t);                                           \
  template cudaError_t RowDot<X, Y>(const X*, const Y*, int64_t, int64_t, float*, cudaStream_t);
#define PTDP_INSTANTIATE_3(A, B, O) \
  template cudaError_t Add<A, B, O>(const A*, const B*, O*, int64_t, cudaStream_t);

PTDP_EACH_1(PTDP_INSTANTIATE_T)
PTDP_EACH_2(PTDP_INSTANTIATE_2)
PTDP_EACH_3(PTDP_INSTANTIATE_3)

#undef PTDP_INSTANTIATE_3
#undef PTDP_INSTANTIATE_2
#undef PTDP_INSTANTIATE_T
#undef PTDP_EACH_3
#undef PTDP_EACH_2
#undef PTDP_EACH_1

}  // namespace ptdp::rt::cuda::kernels
