// The CUDA backend's own kernels (everything but the GEMMs) and their host-side launchers; see
// kernels.cuh for the contracts. Each kernel mirrors a loop of runtime/cpu/cpu_backend.cc with
// the same formula, so the two differ only in the order of fp32 additions inside reductions.
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

__device__ __forceinline__ int64_t ThreadIndex() {
  return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t ThreadCount() { return int64_t(gridDim.x) * blockDim.x; }
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

// Thread (x, y) of block (bx, by) sums column bx*32 + x over rows r0 + y, r0 + y + 8, ... of
// chunk by; the 8 lanes of a column are then added in lane order.
__global__ void BiasGradPartialsKernel(const float* dy, int64_t n, int64_t c,
                                       int64_t rows_per_chunk, float* partials) {
  __shared__ float acc[kColLanes][kColTile + 1];
  const int64_t col = int64_t(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < n ? r0 + rows_per_chunk : n;
  float sum = 0.0f;
  if (col < c) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColLanes) sum += dy[r * c + col];
  }
  acc[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < c) {
    float total = 0.0f;
    for (int k = 0; k < kColLanes; ++k) total += acc[k][threadIdx.x];
    partials[int64_t(blockIdx.y) * c + col] = total;
  }
}

__global__ void LayerNormParamPartialsKernel(const float* dy, const float* x, const float* mean,
                                             const float* rstd, int64_t n, int64_t c,
                                             int64_t rows_per_chunk, float* dgamma_partials,
                                             float* dbeta_partials) {
  __shared__ float acc_g[kColLanes][kColTile + 1];
  __shared__ float acc_b[kColLanes][kColTile + 1];
  const int64_t col = int64_t(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < n ? r0 + rows_per_chunk : n;
  float sum_g = 0.0f, sum_b = 0.0f;
  if (col < c) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColLanes) {
      const float g = dy[r * c + col];
      const float xhat = (x[r * c + col] - mean[r]) * rstd[r];
      sum_g += xhat * g;
      sum_b += g;
    }
  }
  acc_g[threadIdx.y][threadIdx.x] = sum_g;
  acc_b[threadIdx.y][threadIdx.x] = sum_b;
  __syncthreads();
  if (threadIdx.y == 0 && col < c) {
    float total_g = 0.0f, total_b = 0.0f;
    for (int k = 0; k < kColLanes; ++k) {
      total_g += acc_g[k][threadIdx.x];
      total_b += acc_b[k][threadIdx.x];
    }
    dgamma_partials[int64_t(blockIdx.y) * c + col] = total_g;
    dbeta_partials[int64_t(blockIdx.y) * c + col] = total_b;
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
// element (the 64-bit i % c of a flat loop costs more than the add).
__global__ void AddBiasKernel(float* y, const float* bias, int64_t n, int64_t c) {
  for (int64_t col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; col < c;
       col += int64_t(gridDim.x) * blockDim.x) {
    const float b = bias[col];
    for (int64_t r = blockIdx.y; r < n; r += gridDim.y) y[r * c + col] += b;
  }
}

__global__ void GeluForwardKernel(const float* x, float* y, int64_t n) {
  for (int64_t i = ThreadIndex(); i < n; i += ThreadCount()) {
    const float v = x[i];
    const float cube = 0.044715f * v * v * v;
    y[i] = 0.5f * v * (1.0f + tanhf(kGeluScale * (v + cube)));
  }
}

__global__ void GeluBackwardKernel(const float* dy, const float* x, float* dx, int64_t n) {
  for (int64_t i = ThreadIndex(); i < n; i += ThreadCount()) {
    const float v = x[i];
    const float t = tanhf(kGeluScale * (v + 0.044715f * v * v * v));
    const float sech2 = 1.0f - t * t;
    const float local =
        0.5f * (1.0f + t) + 0.5f * v * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * v * v);
    dx[i] = local * dy[i];
  }
}

__global__ void AddKernel(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = ThreadIndex(); i < n; i += ThreadCount()) out[i] = a[i] + b[i];
}

__global__ void AxpyKernel(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = ThreadIndex(); i < n; i += ThreadCount()) y[i] += alpha * x[i];
}

__global__ void ScaleKernel(float alpha, float* x, int64_t n) {
  for (int64_t i = ThreadIndex(); i < n; i += ThreadCount()) x[i] *= alpha;
}

__global__ void FillKernel(float value, float* x, int64_t n) {
  for (int64_t i = ThreadIndex(); i < n; i += ThreadCount()) x[i] = value;
}

// ---- LayerNorm ---------------------------------------------------------------------------------

// Two passes over the row (mean, then the biased variance of x - mean) as the CPU backend does.
// y may alias x: each lane writes only the elements it reads in the last loop, after both warp
// reductions (which every lane reaches only once its reads are done).
__global__ void LayerNormForwardKernel(const float* x, const float* gamma, const float* beta,
                                       float eps, int64_t n, int64_t c, float* y, float* mean,
                                       float* rstd) {
  const int lane = Lane();
  for (int64_t row = WarpIndex(); row < n; row += WarpCount()) {
    const float* xr = x + row * c;
    float sum = 0.0f;
    for (int64_t i = lane; i < c; i += kWarp) sum += xr[i];
    const float m = WarpSum(sum) / float(c);
    float var = 0.0f;
    for (int64_t i = lane; i < c; i += kWarp) {
      const float d = xr[i] - m;
      var += d * d;
    }
    const float s = 1.0f / sqrtf(WarpSum(var) / float(c) + eps);
    float* yr = y + row * c;
    for (int64_t i = lane; i < c; i += kWarp) yr[i] = (xr[i] - m) * s * gamma[i] + beta[i];
    if (lane == 0) {
      mean[row] = m;
      rstd[row] = s;
    }
  }
}

__global__ void LayerNormBackwardInputKernel(const float* dy, const float* x, const float* gamma,
                                             const float* mean, const float* rstd, int64_t n,
                                             int64_t c, float* dx) {
  const int lane = Lane();
  for (int64_t row = WarpIndex(); row < n; row += WarpCount()) {
    const float* gr = dy + row * c;
    const float* xr = x + row * c;
    const float m = mean[row], s = rstd[row];
    // mean(gamma * dy) and mean(gamma * dy * xhat) over the row.
    float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
    for (int64_t i = lane; i < c; i += kWarp) {
      const float xhat = (xr[i] - m) * s;
      const float dnorm = gamma[i] * gr[i];
      dnorm_sum += dnorm;
      dnorm_norm_sum += dnorm * xhat;
    }
    const float dnorm_mean = WarpSum(dnorm_sum) / float(c);
    const float dnorm_norm_mean = WarpSum(dnorm_norm_sum) / float(c);
    float* dr = dx + row * c;
    for (int64_t i = lane; i < c; i += kWarp) {
      const float xhat = (xr[i] - m) * s;
      const float dnorm = gamma[i] * gr[i];
      dr[i] += (dnorm - dnorm_mean - xhat * dnorm_norm_mean) * s;
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

__global__ void RowsToHeadsKernel(const float* rows, HeadLayout lay, int64_t total, float* heads) {
  for (int64_t idx = ThreadIndex(); idx < total; idx += ThreadCount())
    heads[idx] = rows[RowElement(lay, idx)];
}

__global__ void HeadsToRowsKernel(const float* heads, HeadLayout lay, int64_t total, float* rows) {
  for (int64_t idx = ThreadIndex(); idx < total; idx += ThreadCount())
    rows[RowElement(lay, idx)] = heads[idx];
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

// ---- bf16 rounding (the mixed-precision emulation's storage points) -----------------------------

__global__ void RoundToBf16Kernel(float* x, int64_t n) {
  for (int64_t i = ThreadIndex(); i < n; i += ThreadCount())
    x[i] = __bfloat162float(__float2bfloat16_rn(x[i]));
}

// ---- MoE combine -------------------------------------------------------------------------------

__global__ void ScaleRowsKernel(const float* x, const float* scale, int64_t total, int64_t c,
                                float* out) {
  for (int64_t i = ThreadIndex(); i < total; i += ThreadCount()) out[i] = x[i] * scale[i / c];
}

__global__ void RowDotKernel(const float* a, const float* b, int64_t n, int64_t c, float* out) {
  const int lane = Lane();
  for (int64_t r = WarpIndex(); r < n; r += WarpCount()) {
    double acc = 0.0;
    for (int64_t j = lane; j < c; j += kWarp) acc += double(a[r * c + j]) * b[r * c + j];
    acc = WarpSum(acc);
    if (lane == 0) out[r] = float(acc);
  }
}

// ---- context-parallel attention blocks ---------------------------------------------------------

__device__ __forceinline__ int64_t BlockPos(int64_t u, int64_t len, int64_t first0,
                                            int64_t first1) {
  return u < len ? first0 + u : first1 + (u - len);
}

__device__ __forceinline__ float Dot(const float* x, const float* y, int64_t d) {
  float acc = 0.0f;
  for (int64_t c = 0; c < d; ++c) acc += x[c] * y[c];
  return acc;
}

__global__ void AttentionBlockForwardKernel(const float* qkv, const float* kv, BlockAttention a,
                                            bool first, float* out, float* lse) {
  const int64_t nq = 2 * a.lq, nk = 2 * a.lk, A = a.nh * a.d, total = a.b * a.nh * nq;
  const float scale = rsqrtf(float(a.d));
  const float neg_inf = -INFINITY;
  for (int64_t i = ThreadIndex(); i < total; i += ThreadCount()) {
    const int64_t u = i % nq, j = (i / nq) % a.nh, bi = i / (nq * a.nh);
    const int64_t qp = BlockPos(u, a.lq, a.q0, a.q1);
    const float* q = qkv + (u * a.b + bi) * 3 * A + j * a.d;
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
        const float* kr = kv + (v * a.b + bi) * 2 * A + j * a.d;
        const float p = expf(Dot(q, kr, a.d) * scale - m);
        l += p;
        for (int64_t c = 0; c < a.d; ++c) acc[c] += p * kr[A + c];
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

__global__ void AttentionBlockDqKernel(const float* dout, const float* qkv, const float* kv,
                                       const float* out, const float* lse, BlockAttention a,
                                       float* dqkv) {
  const int64_t nq = 2 * a.lq, nk = 2 * a.lk, A = a.nh * a.d, total = a.b * a.nh * nq;
  const float scale = rsqrtf(float(a.d));
  for (int64_t i = ThreadIndex(); i < total; i += ThreadCount()) {
    const int64_t u = i % nq, j = (i / nq) % a.nh, bi = i / (nq * a.nh);
    const int64_t qp = BlockPos(u, a.lq, a.q0, a.q1);
    const float lu = lse[(bi * a.nh + j) * nq + u];
    if (lu == -INFINITY) continue;
    const float* q = qkv + (u * a.b + bi) * 3 * A + j * a.d;
    const float* g = dout + (u * a.b + bi) * A + j * a.d;
    const float D = Dot(g, out + (u * a.b + bi) * A + j * a.d, a.d);
    float acc[kMaxBlockHeadDim];
    for (int64_t c = 0; c < a.d; ++c) acc[c] = 0.0f;
    for (int64_t v = 0; v < nk; ++v) {
      if (BlockPos(v, a.lk, a.k0, a.k1) > qp) continue;
      const float* kr = kv + (v * a.b + bi) * 2 * A + j * a.d;
      const float p = expf(Dot(q, kr, a.d) * scale - lu);
      const float ds = p * (Dot(g, kr + A, a.d) - D) * scale;
      for (int64_t c = 0; c < a.d; ++c) acc[c] += ds * kr[c];
    }
    float* dq = dqkv + (u * a.b + bi) * 3 * A + j * a.d;
    for (int64_t c = 0; c < a.d; ++c) dq[c] += acc[c];
  }
}

__global__ void AttentionBlockDkvKernel(const float* dout, const float* qkv, const float* kv,
                                        const float* out, const float* lse, BlockAttention a,
                                        float* dkv) {
  const int64_t nq = 2 * a.lq, nk = 2 * a.lk, A = a.nh * a.d, total = a.b * a.nh * nk;
  const float scale = rsqrtf(float(a.d));
  for (int64_t i = ThreadIndex(); i < total; i += ThreadCount()) {
    const int64_t v = i % nk, j = (i / nk) % a.nh, bi = i / (nk * a.nh);
    const int64_t kp = BlockPos(v, a.lk, a.k0, a.k1);
    const float* kr = kv + (v * a.b + bi) * 2 * A + j * a.d;
    float dk[kMaxBlockHeadDim], dv[kMaxBlockHeadDim];
    for (int64_t c = 0; c < a.d; ++c) dk[c] = dv[c] = 0.0f;
    for (int64_t u = 0; u < nq; ++u) {
      if (kp > BlockPos(u, a.lq, a.q0, a.q1)) continue;
      const float lu = lse[(bi * a.nh + j) * nq + u];
      if (lu == -INFINITY) continue;
      const float* q = qkv + (u * a.b + bi) * 3 * A + j * a.d;
      const float* g = dout + (u * a.b + bi) * A + j * a.d;
      const float D = Dot(g, out + (u * a.b + bi) * A + j * a.d, a.d);
      const float p = expf(Dot(q, kr, a.d) * scale - lu);
      const float ds = p * (Dot(g, kr + A, a.d) - D) * scale;
      for (int64_t c = 0; c < a.d; ++c) {
        dk[c] += ds * q[c];
        dv[c] += p * g[c];
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

__global__ void EmbeddingForwardKernel(const int32_t* tokens, int64_t total, const float* table,
                                       int64_t v, int64_t h, int64_t vocab_start, float* out) {
  for (int64_t i = ThreadIndex(); i < total; i += ThreadCount()) {
    const int64_t n = i / h, col = i - n * h;
    const int64_t row = int64_t(tokens[n]) - vocab_start;
    out[i] = (row >= 0 && row < v) ? table[row * h + col] : 0.0f;
  }
}

// Thread (x, y) of block (bx, by) owns column bx*32 + x of the table rows r with
// r % groups == by*8 + y, and walks all tokens in order: every table element is updated by one
// thread, token by token, in the CPU backend's order. Token ids are staged kEmbTokens at a time.
__global__ void EmbeddingBackwardKernel(const float* dout, const int32_t* tokens, int64_t n,
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
      dtable[int64_t(row_s[k]) * h + col] += dout[(n0 + k) * h + col];
    }
  }
}

// ---- cross entropy -------------------------------------------------------------------------------

__global__ void CrossEntropyMaxKernel(const float* logits, int64_t n, int64_t v, float* row_max) {
  const int lane = Lane();
  for (int64_t row = WarpIndex(); row < n; row += WarpCount()) {
    const float* lr = logits + row * v;
    float m = -INFINITY;
    for (int64_t i = lane; i < v; i += kWarp) m = fmaxf(m, lr[i]);
    m = WarpMax(m);
    if (lane == 0) row_max[row] = m;
  }
}

__global__ void CrossEntropySumExpKernel(const float* logits, const float* row_max, int64_t n,
                                         int64_t v, float* sum_exp) {
  const int lane = Lane();
  for (int64_t row = WarpIndex(); row < n; row += WarpCount()) {
    const float* lr = logits + row * v;
    const float m = row_max[row];
    double sum = 0.0;  // as the CPU backend: a row has up to ~50k terms
    for (int64_t i = lane; i < v; i += kWarp) sum += expf(lr[i] - m);
    sum = WarpSum(sum);
    if (lane == 0) sum_exp[row] = float(sum);
  }
}

__global__ void CrossEntropyTargetKernel(const float* logits, const int32_t* targets, int64_t n,
                                         int64_t v, int64_t vocab_start, float* target_logit) {
  for (int64_t row = ThreadIndex(); row < n; row += ThreadCount()) {
    const int64_t col = int64_t(targets[row]) - vocab_start;
    target_logit[row] = (col >= 0 && col < v) ? logits[row * v + col] : 0.0f;
  }
}

__global__ void CrossEntropyLossKernel(const float* row_max, const float* sum_exp,
                                       const float* target_logit, int64_t n, float* loss) {
  for (int64_t row = ThreadIndex(); row < n; row += ThreadCount())
    loss[row] = logf(sum_exp[row]) + row_max[row] - target_logit[row];
}

// Element i is read before it is written by the same thread: dlogits may alias logits.
__global__ void CrossEntropyBackwardKernel(const float* logits, const int32_t* targets, int64_t n,
                                           int64_t v, int64_t vocab_start, const float* row_max,
                                           const float* sum_exp, float scale, float* dlogits) {
  const int64_t total = n * v;
  for (int64_t i = ThreadIndex(); i < total; i += ThreadCount()) {
    const int64_t row = i / v, col = i - row * v;
    const float p = expf(logits[i] - row_max[row]) * (1.0f / sum_exp[row]);
    const int64_t target = int64_t(targets[row]) - vocab_start;
    dlogits[i] = (p - (col == target ? 1.0f : 0.0f)) * scale;
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

__global__ void SumPartialsKernel(const float* x, int64_t n, bool squares, double* partials) {
  __shared__ double acc[kThreads];
  double sum = 0.0;
  for (int64_t i = ThreadIndex(); i < n; i += ThreadCount()) {
    const double v = x[i];
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

__global__ void AdamWKernel(float* param, const float* grad, float* m, float* v, int64_t n,
                            AdamWArgs a) {
  for (int64_t i = ThreadIndex(); i < n; i += ThreadCount()) {
    const float g = grad[i] * a.grad_scale;
    const float mi = a.beta1 * m[i] + (1.0f - a.beta1) * g;
    const float vi = a.beta2 * v[i] + (1.0f - a.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float m_hat = mi / a.bias_correction1;
    const float v_hat = vi / a.bias_correction2;
    param[i] -= a.lr * (m_hat / (sqrtf(v_hat) + a.eps) + a.weight_decay * param[i]);
  }
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

cudaError_t BiasGradPartials(const float* dy, int64_t n, int64_t c, RowSplit split,
                             float* partials, cudaStream_t st) {
  if (split.chunks == 0 || c == 0) return cudaSuccess;
  const dim3 grid(unsigned((c + kColTile - 1) / kColTile), unsigned(split.chunks));
  BiasGradPartialsKernel<<<grid, dim3(kColTile, kColLanes), 0, st>>>(dy, n, c,
                                                                      split.rows_per_chunk,
                                                                      partials);
  return cudaGetLastError();
}

cudaError_t ColumnFinalize(const float* partials, int64_t chunks, int64_t c, float* out,
                           cudaStream_t st) {
  if (chunks == 0 || c == 0) return cudaSuccess;
  ColumnFinalizeKernel<<<Blocks(c, kThreads), kThreads, 0, st>>>(partials, chunks, c, out);
  return cudaGetLastError();
}

cudaError_t AddBias(float* y, const float* bias, int64_t n, int64_t c, cudaStream_t st) {
  if (n == 0 || c == 0) return cudaSuccess;
  // About 1024 blocks (a few per SM, to hide the memory latency): column blocks times row bands.
  const unsigned cols = Blocks(c, kThreads);
  const unsigned rows =
      unsigned(std::clamp<int64_t>(1024 / int64_t(cols), 1, std::min<int64_t>(n, kMaxBlocks)));
  AddBiasKernel<<<dim3(cols, rows), kThreads, 0, st>>>(y, bias, n, c);
  return cudaGetLastError();
}

cudaError_t LayerNormForward(const float* x, const float* gamma, const float* beta, float eps,
                             int64_t n, int64_t c, float* y, float* mean, float* rstd,
                             cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  LayerNormForwardKernel<<<RowBlocks(n), kThreads, 0, st>>>(x, gamma, beta, eps, n, c, y, mean,
                                                            rstd);
  return cudaGetLastError();
}

cudaError_t LayerNormBackwardInput(const float* dy, const float* x, const float* gamma,
                                   const float* mean, const float* rstd, int64_t n, int64_t c,
                                   float* dx, cudaStream_t st) {
  if (n == 0 || c == 0) return cudaSuccess;
  LayerNormBackwardInputKernel<<<RowBlocks(n), kThreads, 0, st>>>(dy, x, gamma, mean, rstd, n, c,
                                                                  dx);
  return cudaGetLastError();
}

cudaError_t LayerNormParamPartials(const float* dy, const float* x, const float* mean,
                                   const float* rstd, int64_t n, int64_t c, RowSplit split,
                                   float* dgamma_partials, float* dbeta_partials,
                                   cudaStream_t st) {
  if (split.chunks == 0 || c == 0) return cudaSuccess;
  const dim3 grid(unsigned((c + kColTile - 1) / kColTile), unsigned(split.chunks));
  LayerNormParamPartialsKernel<<<grid, dim3(kColTile, kColLanes), 0, st>>>(
      dy, x, mean, rstd, n, c, split.rows_per_chunk, dgamma_partials, dbeta_partials);
  return cudaGetLastError();
}

cudaError_t GeluForward(const float* x, float* y, int64_t n, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  GeluForwardKernel<<<Blocks(n, kThreads), kThreads, 0, st>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t GeluBackward(const float* dy, const float* x, float* dx, int64_t n, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  GeluBackwardKernel<<<Blocks(n, kThreads), kThreads, 0, st>>>(dy, x, dx, n);
  return cudaGetLastError();
}

cudaError_t RowsToHeads(const float* rows, HeadLayout lay, float* heads, cudaStream_t st) {
  const int64_t total = lay.nmat * lay.b * lay.nh * lay.s * lay.d;
  if (total == 0) return cudaSuccess;
  RowsToHeadsKernel<<<Blocks(total, kThreads), kThreads, 0, st>>>(rows, lay, total, heads);
  return cudaGetLastError();
}

cudaError_t HeadsToRows(const float* heads, HeadLayout lay, float* rows, cudaStream_t st) {
  const int64_t total = lay.nmat * lay.b * lay.nh * lay.s * lay.d;
  if (total == 0) return cudaSuccess;
  HeadsToRowsKernel<<<Blocks(total, kThreads), kThreads, 0, st>>>(heads, lay, total, rows);
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

cudaError_t RoundToBf16(float* x, int64_t n, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  RoundToBf16Kernel<<<Blocks(n, kThreads), kThreads, 0, st>>>(x, n);
  return cudaGetLastError();
}

cudaError_t ScaleRows(const float* x, const float* scale, int64_t n, int64_t c, float* out,
                      cudaStream_t st) {
  if (n == 0 || c == 0) return cudaSuccess;
  ScaleRowsKernel<<<Blocks(n * c, kThreads), kThreads, 0, st>>>(x, scale, n * c, c, out);
  return cudaGetLastError();
}

cudaError_t RowDot(const float* a, const float* b, int64_t n, int64_t c, float* out,
                   cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  RowDotKernel<<<RowBlocks(n), kThreads, 0, st>>>(a, b, n, c, out);
  return cudaGetLastError();
}

cudaError_t AttentionBlockForward(const float* qkv, const float* kv, BlockAttention a, bool first,
                                  float* out, float* lse, cudaStream_t st) {
  const int64_t rows = a.b * a.nh * 2 * a.lq;
  if (rows == 0 || a.d == 0) return cudaSuccess;
  if (a.d > kMaxBlockHeadDim) return cudaErrorInvalidValue;
  AttentionBlockForwardKernel<<<Blocks(rows, kThreads), kThreads, 0, st>>>(qkv, kv, a, first, out,
                                                                          lse);
  return cudaGetLastError();
}

cudaError_t AttentionBlockBackward(const float* dout, const float* qkv, const float* kv,
                                   const float* out, const float* lse, BlockAttention a,
                                   float* dqkv, float* dkv, cudaStream_t st) {
  const int64_t qrows = a.b * a.nh * 2 * a.lq, krows = a.b * a.nh * 2 * a.lk;
  if (qrows == 0 || krows == 0 || a.d == 0) return cudaSuccess;
  if (a.d > kMaxBlockHeadDim) return cudaErrorInvalidValue;
  AttentionBlockDqKernel<<<Blocks(qrows, kThreads), kThreads, 0, st>>>(dout, qkv, kv, out, lse, a,
                                                                      dqkv);
  AttentionBlockDkvKernel<<<Blocks(krows, kThreads), kThreads, 0, st>>>(dout, qkv, kv, out, lse,
                                                                       a, dkv);
  return cudaGetLastError();
}

cudaError_t EmbeddingForward(const int32_t* tokens, int64_t n, const float* table, int64_t v,
                             int64_t h, int64_t vocab_start, float* out, cudaStream_t st) {
  if (n == 0 || h == 0) return cudaSuccess;
  EmbeddingForwardKernel<<<Blocks(n * h, kThreads), kThreads, 0, st>>>(tokens, n * h, table, v,
                                                                       h, vocab_start, out);
  return cudaGetLastError();
}

cudaError_t EmbeddingBackward(const float* dout, const int32_t* tokens, int64_t n,
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
  EmbeddingBackwardKernel<<<grid, dim3(kEmbCols, kEmbGroupsPerBlock), 0, st>>>(
      dout, tokens, n, vocab_start, v, h, groups, dtable);
  return cudaGetLastError();
}

cudaError_t CrossEntropyMax(const float* logits, int64_t n, int64_t v, float* row_max,
                            cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  CrossEntropyMaxKernel<<<RowBlocks(n), kThreads, 0, st>>>(logits, n, v, row_max);
  return cudaGetLastError();
}

cudaError_t CrossEntropySumExp(const float* logits, const float* row_max, int64_t n, int64_t v,
                               float* sum_exp, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  CrossEntropySumExpKernel<<<RowBlocks(n), kThreads, 0, st>>>(logits, row_max, n, v, sum_exp);
  return cudaGetLastError();
}

cudaError_t CrossEntropyTarget(const float* logits, const int32_t* targets, int64_t n, int64_t v,
                               int64_t vocab_start, float* target_logit, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  CrossEntropyTargetKernel<<<Blocks(n, kThreads), kThreads, 0, st>>>(logits, targets, n, v,
                                                                     vocab_start, target_logit);
  return cudaGetLastError();
}

cudaError_t CrossEntropyLoss(const float* row_max, const float* sum_exp, const float* target_logit,
                             int64_t n, float* loss, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  CrossEntropyLossKernel<<<Blocks(n, kThreads), kThreads, 0, st>>>(row_max, sum_exp,
                                                                   target_logit, n, loss);
  return cudaGetLastError();
}

cudaError_t CrossEntropyBackward(const float* logits, const int32_t* targets, int64_t n, int64_t v,
                                 int64_t vocab_start, const float* row_max, const float* sum_exp,
                                 float scale, float* dlogits, cudaStream_t st) {
  if (n == 0 || v == 0) return cudaSuccess;
  CrossEntropyBackwardKernel<<<Blocks(n * v, kThreads), kThreads, 0, st>>>(
      logits, targets, n, v, vocab_start, row_max, sum_exp, scale, dlogits);
  return cudaGetLastError();
}

cudaError_t Add(const float* a, const float* b, float* out, int64_t n, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  AddKernel<<<Blocks(n, kThreads), kThreads, 0, st>>>(a, b, out, n);
  return cudaGetLastError();
}

cudaError_t Axpy(float alpha, const float* x, float* y, int64_t n, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  AxpyKernel<<<Blocks(n, kThreads), kThreads, 0, st>>>(alpha, x, y, n);
  return cudaGetLastError();
}

cudaError_t Scale(float alpha, float* x, int64_t n, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  ScaleKernel<<<Blocks(n, kThreads), kThreads, 0, st>>>(alpha, x, n);
  return cudaGetLastError();
}

cudaError_t Fill(float value, float* x, int64_t n, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  FillKernel<<<Blocks(n, kThreads), kThreads, 0, st>>>(value, x, n);
  return cudaGetLastError();
}

int64_t SumBlocks(int64_t n) {
  if (n <= 0) return 0;
  return std::min<int64_t>((n + kThreads * kSumItemsPerThread - 1) / (kThreads * kSumItemsPerThread),
                           kSumMaxBlocks);
}

cudaError_t SumPartials(const float* x, int64_t n, bool squares, double* partials,
                        cudaStream_t st) {
  const int64_t blocks = SumBlocks(n);
  if (blocks == 0) return cudaSuccess;
  SumPartialsKernel<<<unsigned(blocks), kThreads, 0, st>>>(x, n, squares, partials);
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
  AdamWKernel<<<Blocks(n, kThreads), kThreads, 0, st>>>(param, grad, m, v, n, a);
  return cudaGetLastError();
}

}  // namespace ptdp::rt::cuda::kernels
