// Causal flash attention forward and backward on bf16 tensor cores (WMMA 16x16x16, fp32
// accumulators); the contract and the design are in flash_attention.cuh.
//
// A block is 4 warps (128 threads) and one tile of 64 rows (queries in the forward and in the dQ
// kernel, keys in the dK/dV kernel); warp w owns rows 16w .. 16w+15 of every per-row buffer, so
// within a tile only __syncwarp is needed, and __syncthreads only around the tiles all warps
// read (the loaded Q/K/V/dO). In the element-wise steps two lanes share a row: lane 2i and
// 2i+1 hold row 16w + i, columns 0..31 and 32..63 of the 64-wide score tile (or the halves of
// the head dimension), and combine their partial maxima and sums with one shuffle.
//
// Scores are handled in base 2: x = s * scale * log2(e), p = exp2(x - m), lse_2 = lse * log2(e).
//
// Token rows (qkv, out, dout, dqkv) are float or bf16 (T): fp32 rows are rounded to bf16 as they
// enter the tiles, bf16 rows are copied in as they are (rounding a bf16 value to bf16 is the
// identity, so the tiles are those of fp32 rows holding the widened values), and out and dqkv are
// computed in fp32 as for fp32 rows and stored rounded to nearest even.
#include "runtime/cuda/flash_attention.cuh"

#include "runtime/cuda/flash_fragments.h"

#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace ptdp::rt::cuda::kernels {
namespace {

constexpr int kTile = 64;        // rows (queries or keys) of a block, and columns of a score tile
constexpr int kFlashWarps = 4;
constexpr int kFlashThreads = kFlashWarps * 32;
constexpr int kLdS = kTile + 4;  // float score tiles (WMMA: a multiple of 4 floats)
constexpr int kLdP = kTile + 8;  // bf16 probability tiles (a multiple of 8 halves)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shared-memory layout of the three kernels for a padded head dimension D: bf16 row tiles of
// D + 8 (LdH), float output rows of D + 4 (LdO). Every region is a multiple of 128 bytes, so each
// starts 32-byte aligned as WMMA's loads and stores require.
template <int D>
struct Smem {
  static constexpr int LdH = D + 8;
  static constexpr int LdO = D + 4;
  static constexpr size_t kRowTile = size_t(kTile) * LdH * sizeof(bf16);
  static constexpr size_t kScores = size_t(kTile) * kLdS * sizeof(float);
  static constexpr size_t kProbs = size_t(kTile) * kLdP * sizeof(bf16);
  static constexpr size_t kOut = size_t(kTile) * LdO * sizeof(float);
  static constexpr size_t kRowStats = 2 * kTile * sizeof(float);
  // Q, K, V; scores; P; O.
  static constexpr size_t kForward = 3 * kRowTile + kScores + kProbs + kOut;
  // Q, dO, K, V; S and dP (then the float output rows, which fit in both: static_assert
  // below); P and dS (the dQ kernel uses only dS); lse and delta.
  static constexpr size_t kBackward = 4 * kRowTile + 2 * kScores + 2 * kProbs + kRowStats;
  static_assert(kOut <= 2 * kScores, "the output rows reuse the two score tiles");
};

bool Supported(int64_t d) { return d >= 1 && d <= kFlashMaxHeadDim; }

__device__ __forceinline__ int64_t TokenRow(const HeadLayout& lay, int64_t bi, int64_t t) {
  return lay.seq_first ? t * lay.b + bi : bi * lay.s + t;
}

// A token-row element as fp32 (exact), and an fp32 value stored into a token row (bf16 rounded
// to nearest even).
__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void StoreFloat(float* p, float v) { *p = v; }
__device__ __forceinline__ void StoreFloat(bf16* p, float v) { *p = __float2bfloat16_rn(v); }

// dst[r][c] (bf16, row length LdH) = src's row of position t0 + r, columns col0 + c (row width
// w), zero past the sequence or past the head dimension d. 16-byte loads when d is a multiple of
// 4 and src 16-byte aligned (then so is every row's start: w and col0 are multiples of d's
// stride 4, as w = nmat nh d and col0 = m nh d + j d); else one float a thread.
template <int D>
__device__ void LoadRows(const float* src, const HeadLayout& lay, int64_t w, int64_t col0,
                         int64_t bi, int64_t t0, bf16* dst) {
  if (lay.d % 4 == 0 && (reinterpret_cast<uintptr_t>(src) & 15) == 0) {
    for (int idx = threadIdx.x; idx < kTile * D / 4; idx += kFlashThreads) {
      const int r = idx / (D / 4), c = (idx % (D / 4)) * 4;
      const int64_t t = t0 + r;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (t < lay.s && c < lay.d)
        v = *reinterpret_cast<const float4*>(src + TokenRow(lay, bi, t) * w + col0 + c);
      // 4-byte aligned: LdH is even and c a multiple of 4.
      __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(dst + r * Smem<D>::LdH + c);
      o[0] = __floats2bfloat162_rn(v.x, v.y);
      o[1] = __floats2bfloat162_rn(v.z, v.w);
    }
    return;
  }
  for (int idx = threadIdx.x; idx < kTile * D; idx += kFlashThreads) {
    const int r = idx / D, c = idx % D;
    const int64_t t = t0 + r;
    float v = 0.0f;
    if (t < lay.s && c < lay.d) v = src[TokenRow(lay, bi, t) * w + col0 + c];
    dst[r * Smem<D>::LdH + c] = __float2bfloat16_rn(v);
  }
}

// The same from bf16 rows, copied into the tile as they are: the tile the float overload makes
// from the widened values. 16-byte loads of 8 elements when d is a multiple of 8 and src 16-byte
// aligned (then so is every row's start, as above with stride 8); else one element a thread.
template <int D>
__device__ void LoadRows(const bf16* src, const HeadLayout& lay, int64_t w, int64_t col0,
                         int64_t bi, int64_t t0, bf16* dst) {
  static_assert(Smem<D>::LdH * sizeof(bf16) % 16 == 0, "16-byte aligned tile rows");
  if (lay.d % 8 == 0 && (reinterpret_cast<uintptr_t>(src) & 15) == 0) {
    // Unrolled by 2: two loads (16 elements) in flight a thread, as the float loop's four (the
    // compiler unrolls that one by 4); unrolled by 4 here, the d = 128 dK/dV kernel spilled more
    // than its fp32 twin (ptxas, sm_80 and sm_90).
#pragma unroll 2
    for (int idx = threadIdx.x; idx < kTile * D / 8; idx += kFlashThreads) {
      const int r = idx / (D / 8), c = (idx % (D / 8)) * 8;
      const int64_t t = t0 + r;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);  // eight bf16 zeros
      if (t < lay.s && c < lay.d)
        v = *reinterpret_cast<const uint4*>(src + TokenRow(lay, bi, t) * w + col0 + c);
      // 16-byte aligned: the tiles start 32-byte aligned, LdH is a multiple of 8 and so is c.
      *reinterpret_cast<uint4*>(dst + r * Smem<D>::LdH + c) = v;
    }
    return;
  }
  for (int idx = threadIdx.x; idx < kTile * D; idx += kFlashThreads) {
    const int r = idx / D, c = idx % D;
    const int64_t t = t0 + r;
    bf16 v = __float2bfloat16_rn(0.0f);
    if (t < lay.s && c < lay.d) v = src[TokenRow(lay, bi, t) * w + col0 + c];
    dst[r * Smem<D>::LdH + c] = v;
  }
}

// Row statistics of 64 queries from position q0: lse in base 2 and delta (0 past the sequence).
__device__ void LoadRowStats(const float* lse, const float* delta, int64_t l, int64_t s,
                             int64_t q0, float* lse_s, float* delta_s) {
  for (int i = threadIdx.x; i < kTile; i += kFlashThreads) {
    const int64_t t = q0 + i;
    lse_s[i] = t < s ? lse[l * s + t] * kLog2e : 0.0f;
    delta_s[i] = t < s ? delta[l * s + t] : 0.0f;
  }
}

// Defined with the register-resident kernels below (cp.async).
template <int D>
__device__ void LoadRowsAsync(const bf16* src, const HeadLayout& lay, int64_t w, int64_t col0,
                              int64_t bi, int64_t t0, bf16* dst);
template <int D>
__device__ void LoadRowsAsync(const float* src, const HeadLayout& lay, int64_t w, int64_t col0,
                              int64_t bi, int64_t t0, bf16* dst);

// One row tile: by LoadRows, or started in the background by LoadRowsAsync (kAsync).
template <int D, bool kAsync, typename T>
__device__ void LoadTile(const T* src, const HeadLayout& lay, int64_t w, int64_t col0, int64_t bi,
                         int64_t t0, bf16* dst) {
  if constexpr (kAsync)
    LoadRowsAsync<D>(src, lay, w, col0, bi, t0, dst);
  else
    LoadRows<D>(src, lay, w, col0, bi, t0, dst);
}

// Q and dO of the 64 queries from q0 into (qs, dos), their lse (base 2) and delta into (lse_s,
// delta_s); K and V of the 64 keys from k0 into (ks, vs). All threads; head l = bi nh + j.
template <int D, bool kAsync, typename T>
__device__ void LoadQueryTiles(const T* qkv, const T* dout, const float* lse, const float* delta,
                               const HeadLayout& lay, int64_t l, int64_t q0, bf16* qs, bf16* dos,
                               float* lse_s, float* delta_s) {
  const int64_t bi = l / lay.nh, j = l % lay.nh, a = lay.nh * lay.d;
  HeadLayout lay_o = lay;
  lay_o.nmat = 1;
  LoadTile<D, kAsync>(qkv, lay, 3 * a, j * lay.d, bi, q0, qs);
  LoadTile<D, kAsync>(dout, lay_o, a, j * lay.d, bi, q0, dos);
  LoadRowStats(lse, delta, l, lay.s, q0, lse_s, delta_s);
}
template <int D, bool kAsync, typename T>
__device__ void LoadKeyTiles(const T* qkv, const HeadLayout& lay, int64_t l, int64_t k0, bf16* ks,
                             bf16* vs) {
  const int64_t bi = l / lay.nh, j = l % lay.nh, a = lay.nh * lay.d;
  LoadTile<D, kAsync>(qkv, lay, 3 * a, a + j * lay.d, bi, k0, ks);
  LoadTile<D, kAsync>(qkv, lay, 3 * a, 2 * a + j * lay.d, bi, k0, vs);
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define PTDP_FLASH_TENSOR_CORES 1
namespace wmma = nvcuda::wmma;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// out (16 x 64 floats, row length kLdS) = a (16 x K, row-major, lda) times b^T, b (64 x K,
// row-major, ldb): one warp's rows of a score tile. K a multiple of 16.
template <int K>
__device__ void ScoreTile(const bf16* a, int lda, const bf16* b, int ldb, float* out) {
#pragma unroll
  for (int n = 0; n < kTile / 16; ++n) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int k = 0; k < K / 16; ++k) {
      FragA fa;
      FragBt fb;
      wmma::load_matrix_sync(fa, a + k * 16, lda);
      wmma::load_matrix_sync(fb, b + n * 16 * ldb + k * 16, ldb);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + n * 16, acc, kLdS, wmma::mem_row_major);
  }
}

// acc[n] (16 x D in D/16 fragments) += a (16 x 64, row-major, kLdP) times b (64 x D, row-major,
// ldb).
template <int D>
__device__ void AccumulateRows(const bf16* a, const bf16* b, int ldb, FragC (&acc)[D / 16]) {
#pragma unroll
  for (int k = 0; k < kTile / 16; ++k) {
    FragA fa;
    wmma::load_matrix_sync(fa, a + k * 16, kLdP);
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      FragB fb;
      wmma::load_matrix_sync(fb, b + k * 16 * ldb + n * 16, ldb);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// Writes one warp's 16 x D accumulator rows (times `scale`) into the rows of `dst` (row width w,
// columns col0 + c < d) for positions t0 + 16 warp + i < s, through the warp's rows of `stage`
// (row length LdO).
template <int D, typename T>
__device__ void StoreRows(FragC (&acc)[D / 16], float scale, float* stage, const HeadLayout& lay,
                          int64_t w, int64_t col0, int64_t bi, int64_t t0, T* dst) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* rows = stage + warp * 16 * Smem<D>::LdO;
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    for (int i = 0; i < acc[n].num_elements; ++i) acc[n].x[i] *= scale;
    wmma::store_matrix_sync(rows + n * 16, acc[n], Smem<D>::LdO, wmma::mem_row_major);
  }
  __syncwarp();
  for (int i = 0; i < 16; ++i) {
    const int64_t t = t0 + warp * 16 + i;
    if (t >= lay.s) break;
    T* out = dst + TokenRow(lay, bi, t) * w + col0;
    for (int c = lane; c < lay.d; c += 32) StoreFloat(out + c, rows[i * Smem<D>::LdO + c]);
  }
  __syncwarp();
}
#endif

// The indices every kernel starts from: the block's (batch, head) l = bi nh + j (blockIdx.x), A
// = nh d and qkv's row width w = 3A; the thread's warp and lane, the tile row r its lane pair
// holds and which half of the row's columns it takes.
struct Place {
  int64_t l, bi, j, a, w;
  int warp, lane, r, half;
};
__device__ __forceinline__ Place PlaceOf(const HeadLayout& lay) {
  const int64_t l = blockIdx.x, a = lay.nh * lay.d;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  return {l, l / lay.nh, l % lay.nh, a, 3 * a, warp, lane, warp * 16 + lane / 2, lane & 1};
}

// Grid (L, query tiles), the last query tile (the most key tiles) first.
template <int D, typename T>
__global__ void __launch_bounds__(kFlashThreads)
    FlashForwardKernel(const T* qkv, HeadLayout lay, float scale2, T* out, float* lse) {
#ifdef PTDP_FLASH_TENSOR_CORES
  using S = Smem<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* ks = qs + kTile * S::LdH;
  bf16* vs = ks + kTile * S::LdH;
  float* ss = reinterpret_cast<float*>(vs + kTile * S::LdH);
  bf16* ps = reinterpret_cast<bf16*>(ss + kTile * kLdS);
  float* os = reinterpret_cast<float*>(ps + kTile * kLdP);

  const auto [l, bi, j, a, w, warp, lane, r, half] = PlaceOf(lay);
  const int64_t qt = int64_t(gridDim.y) - 1 - blockIdx.y, q0 = qt * kTile;
  const int64_t qpos = q0 + r;

  LoadRows<D>(qkv, lay, w, j * lay.d, bi, q0, qs);
  for (int i = threadIdx.x; i < kTile * S::LdO; i += kFlashThreads) os[i] = 0.0f;
  float m = -INFINITY, sum = 0.0f;  // this row's running max (base 2) and sum of exp2
  for (int64_t kt = 0; kt <= qt; ++kt) {
    const int64_t k0 = kt * kTile;
    __syncthreads();  // every warp is done with the previous K and V (and the zeroed O)
    LoadRows<D>(qkv, lay, w, a + j * lay.d, bi, k0, ks);
    LoadRows<D>(qkv, lay, w, 2 * a + j * lay.d, bi, k0, vs);
    __syncthreads();
    ScoreTile<D>(qs + warp * 16 * S::LdH, S::LdH, ks, S::LdH, ss + warp * 16 * kLdS);
    __syncwarp();
    // Online softmax of row r over this tile: key k0 <= q0 <= qpos is always visible, so the
    // row's maximum is finite.
    const float* srow = ss + r * kLdS + half * 32;
    float x[32];
    float tile_max = -INFINITY;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const int64_t kpos = k0 + half * 32 + c;
      x[c] = kpos <= qpos && kpos < lay.s ? srow[c] * scale2 : -INFINITY;
      tile_max = fmaxf(tile_max, x[c]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float m_new = fmaxf(m, tile_max);
    const float alpha = exp2f(m - m_new);  // 0 on the first tile (m = -inf)
    float tile_sum = 0.0f;
    bf16* prow = ps + r * kLdP + half * 32;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const float p = exp2f(x[c] - m_new);
      prow[c] = __float2bfloat16_rn(p);
      tile_sum += p;
    }
    tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, 1);
    sum = sum * alpha + tile_sum;
    m = m_new;
    float* orow = os + r * S::LdO + half * (D / 2);
    for (int c = 0; c < D / 2; ++c) orow[c] *= alpha;
    __syncwarp();
    // O (the warp's 16 rows) += P V.
    float* owarp = os + warp * 16 * S::LdO;
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      FragC acc;
      wmma::load_matrix_sync(acc, owarp + n * 16, S::LdO, wmma::mem_row_major);
#pragma unroll
      for (int k = 0; k < kTile / 16; ++k) {
        FragA fa;
        FragB fb;
        wmma::load_matrix_sync(fa, ps + warp * 16 * kLdP + k * 16, kLdP);
        wmma::load_matrix_sync(fb, vs + k * 16 * S::LdH + n * 16, S::LdH);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(owarp + n * 16, acc, S::LdO, wmma::mem_row_major);
    }
    __syncwarp();
  }
  if (qpos < lay.s) {
    const float inv = 1.0f / sum;
    const float* orow = os + r * S::LdO;
    T* dst = out + TokenRow(lay, bi, qpos) * a + j * lay.d;
    for (int c = half * (D / 2); c < (half + 1) * (D / 2) && c < lay.d; ++c)
      StoreFloat(dst + c, orow[c] * inv);
    if (half == 0) lse[l * lay.s + qpos] = (m + log2f(sum)) * kLn2;
  }
#endif
}

// delta[l s + t] = sum_c dout[row][j d + c] * out[row][j d + c]: one warp per (l, t).
template <typename T>
__global__ void FlashDeltaKernel(const T* dout, const T* out, HeadLayout lay, float* delta) {
  const int64_t rows = lay.b * lay.nh * lay.s, a = lay.nh * lay.d;
  const int lane = threadIdx.x % 32;
  for (int64_t q = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; q < rows;
       q += int64_t(gridDim.x) * blockDim.x / 32) {
    const int64_t l = q / lay.s, t = q % lay.s, bi = l / lay.nh, j = l % lay.nh;
    const int64_t base = TokenRow(lay, bi, t) * a + j * lay.d;
    float v = 0.0f;
    for (int64_t c = lane; c < lay.d; c += 32)
      v += ToFloat(dout[base + c]) * ToFloat(out[base + c]);
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) delta[q] = v;
  }
}

// The backward kernels' shared memory (Smem<D>::kBackward): Q, dO, K, V row tiles; S and dP
// scores; P and dS probabilities (the dQ kernel uses only dS); lse and delta of the queries.
template <int D>
struct BackwardTiles {
  bf16 *qs, *dos, *ks, *vs, *ps, *dss;
  float *ss, *dps, *lse_s, *delta_s;
  __device__ explicit BackwardTiles(unsigned char* smem) {
    constexpr int ld = Smem<D>::LdH;
    qs = reinterpret_cast<bf16*>(smem);
    dos = qs + kTile * ld;
    ks = dos + kTile * ld;
    vs = ks + kTile * ld;
    ss = reinterpret_cast<float*>(vs + kTile * ld);
    dps = ss + kTile * kLdS;
    ps = reinterpret_cast<bf16*>(dps + kTile * kLdS);
    dss = ps + kTile * kLdP;
    lse_s = reinterpret_cast<float*>(dss + kTile * kLdP);
    delta_s = lse_s + kTile;
  }
  // Q and dO of the 64 queries from q0 with their lse and delta (all threads).
  template <typename T>
  __device__ void LoadQueries(const T* qkv, const T* dout, const float* lse, const float* delta,
                              const HeadLayout& lay, int64_t l, int64_t q0) {
    LoadQueryTiles<D, false>(qkv, dout, lse, delta, lay, l, q0, qs, dos, lse_s, delta_s);
  }
  // K and V of the 64 keys from k0 (all threads).
  template <typename T>
  __device__ void LoadKeys(const T* qkv, const HeadLayout& lay, int64_t l, int64_t k0) {
    LoadKeyTiles<D, false>(qkv, lay, l, k0, ks, vs);
  }
};

// dK, dV of one key tile over the query tiles that see it. Grid (L, key tiles), the first key
// tile (the most query tiles) first. Warp w owns keys 16w.., and its score tiles are transposed:
// rows keys, columns queries (S^T = K Q^T, dP^T = V dO^T).
template <int D, typename T>
__global__ void __launch_bounds__(kFlashThreads)
    FlashBackwardKvKernel(const T* dout, const T* qkv, const float* lse, const float* delta,
                          HeadLayout lay, float scale, T* dqkv) {
#ifdef PTDP_FLASH_TENSOR_CORES
  using S = Smem<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  BackwardTiles<D> t(smem);
  bf16 *qs = t.qs, *dos = t.dos, *ks = t.ks, *vs = t.vs, *ps = t.ps, *dss = t.dss;
  float *ss = t.ss, *dps = t.dps, *lse_s = t.lse_s, *delta_s = t.delta_s;

  const auto [l, bi, j, a, w, warp, lane, r, half] = PlaceOf(lay);
  const int64_t tiles = gridDim.y, kt = blockIdx.y, k0 = kt * kTile;
  const int64_t kpos = k0 + r;
  const float scale2 = scale * kLog2e;

  t.LoadKeys(qkv, lay, l, k0);
  FragC dk[D / 16], dv[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  for (int64_t qt = kt; qt < tiles; ++qt) {
    const int64_t q0 = qt * kTile;
    __syncthreads();  // every warp is done with the previous Q and dO
    t.LoadQueries(qkv, dout, lse, delta, lay, l, q0);
    __syncthreads();
    ScoreTile<D>(ks + warp * 16 * S::LdH, S::LdH, qs, S::LdH, ss + warp * 16 * kLdS);
    ScoreTile<D>(vs + warp * 16 * S::LdH, S::LdH, dos, S::LdH, dps + warp * 16 * kLdS);
    __syncwarp();
    // P^T and dS^T = P^T * (dP^T - delta) for key r and queries half*32 ..
#pragma unroll 8
    for (int c = 0; c < 32; ++c) {
      const int qi = half * 32 + c;
      const int64_t qpos = q0 + qi;
      const bool seen = kpos <= qpos && qpos < lay.s;
      const float p = seen ? exp2f(ss[r * kLdS + qi] * scale2 - lse_s[qi]) : 0.0f;
      ps[r * kLdP + qi] = __float2bfloat16_rn(p);
      dss[r * kLdP + qi] = __float2bfloat16_rn(p * (dps[r * kLdS + qi] - delta_s[qi]));
    }
    __syncwarp();
    AccumulateRows<D>(ps + warp * 16 * kLdP, dos, S::LdH, dv);   // dV += P^T dO
    AccumulateRows<D>(dss + warp * 16 * kLdP, qs, S::LdH, dk);  // dK += dS^T Q
  }
  __syncthreads();  // the score tiles become the output rows
  StoreRows<D>(dv, 1.0f, ss, lay, w, 2 * a + j * lay.d, bi, k0, dqkv);
  StoreRows<D>(dk, scale, ss, lay, w, a + j * lay.d, bi, k0, dqkv);
#endif
}

// dQ of one query tile over the key tiles it sees. Grid (L, query tiles), the last first.
template <int D, typename T>
__global__ void __launch_bounds__(kFlashThreads)
    FlashBackwardQKernel(const T* dout, const T* qkv, const float* lse, const float* delta,
                         HeadLayout lay, float scale, T* dqkv) {
#ifdef PTDP_FLASH_TENSOR_CORES
  using S = Smem<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  BackwardTiles<D> t(smem);
  bf16 *qs = t.qs, *dos = t.dos, *ks = t.ks, *vs = t.vs, *dss = t.dss;
  float *ss = t.ss, *dps = t.dps, *lse_s = t.lse_s, *delta_s = t.delta_s;

  const auto [l, bi, j, a, w, warp, lane, r, half] = PlaceOf(lay);
  const int64_t qt = int64_t(gridDim.y) - 1 - blockIdx.y, q0 = qt * kTile;
  const int64_t qpos = q0 + r;
  const float scale2 = scale * kLog2e;

  t.LoadQueries(qkv, dout, lse, delta, lay, l, q0);
  FragC dq[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(dq[n], 0.0f);
  for (int64_t kt = 0; kt <= qt; ++kt) {
    const int64_t k0 = kt * kTile;
    __syncthreads();  // every warp is done with the previous K and V (and sees the row stats)
    t.LoadKeys(qkv, lay, l, k0);
    __syncthreads();
    ScoreTile<D>(qs + warp * 16 * S::LdH, S::LdH, ks, S::LdH, ss + warp * 16 * kLdS);
    ScoreTile<D>(dos + warp * 16 * S::LdH, S::LdH, vs, S::LdH, dps + warp * 16 * kLdS);
    __syncwarp();
    const float lse_r = lse_s[r], delta_r = delta_s[r];
#pragma unroll 8
    for (int c = 0; c < 32; ++c) {
      const int ki = half * 32 + c;
      const bool seen = k0 + ki <= qpos && qpos < lay.s;
      const float p = seen ? exp2f(ss[r * kLdS + ki] * scale2 - lse_r) : 0.0f;
      dss[r * kLdP + ki] = __float2bfloat16_rn(p * (dps[r * kLdS + ki] - delta_r));
    }
    __syncwarp();
    AccumulateRows<D>(dss + warp * 16 * kLdP, ks, S::LdH, dq);  // dQ += dS K
  }
  __syncthreads();  // the score tiles become the output rows
  StoreRows<D>(dq, scale, ss, lay, w, j * lay.d, bi, q0, dqkv);
#endif
}

// ---- the register-resident variant (FlashVariant::kMma) ----------------------------------------
//
// FlashAttention-2 as its paper has it: each warp keeps its 16 rows' scores, probabilities and
// output accumulators in registers, as the fragments of PTX's mma.sync.m16n8k16 (bf16 inputs,
// fp32 accumulators), instead of passing them through shared memory between WMMA calls as the
// kernels above do. Only the Q/K/V/dO row tiles are in shared memory (45 KiB a block at D = 64 in
// the forward instead of 70 KiB, two K/V buffers: the next key tile arrives by cp.async while
// the warps compute on this one), read into fragments with ldmatrix. The fragment layouts are
// PTX ISA's ("Matrix Fragments for mma.m16n8k16 with floating point type"): lane = 4 g + t holds
// accumulator elements (g, 2t), (g, 2t+1) [c0, c1] and (g+8, 2t), (g+8, 2t+1) [c2, c3] of each
// 16 x 8 tile; an A fragment (16 x 16) is {(g, 2t..), (g+8, 2t..), (g, 8+2t..), (g+8, 8+2t..)};
// a B fragment (16 x 8, k x n) is {(2t.., g), (8+2t.., g)}. Two adjacent accumulator tiles are
// therefore the A fragment of the next product (P V, dS K, ...) once rounded to bf16, the
// register reuse FlashAttention-2 is built on. Same tiles (64 x 64), same rounding points, same
// two deterministic backward kernels and the same results up to the order of fp32 additions.
#ifdef PTDP_FLASH_TENSOR_CORES
#ifdef PTDP_CUDA_EMU
// On the host (runtime/cuda/emu): the instructions as PTX ISA defines them, warp by warp.
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const bf16* p) {
  ::ptdp::emu::LdMatrixX4(r, p, false);
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const bf16* p) {
  ::ptdp::emu::LdMatrixX4(r, p, true);
}
__device__ __forceinline__ void Mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  ::ptdp::emu::Mma16816(c, a, b0, b1);
}
#else
__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8. Lane 4g + t
// receives elements (g, 2t) and (g, 2t+1) of each matrix (transposed: (2t, g) and (2t+1, g)).
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(p)));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(p)));
}

// c (16 x 8, fp32) += a (16 x 16, bf16) b (16 x 8, bf16).
__device__ __forceinline__ void Mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#endif  // PTDP_CUDA_EMU

// Two fp32 values rounded to nearest even as one bf16 pair, `lo` in the low half (the element
// of the smaller column, as ldmatrix and mma order them).
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// s (16 x 64: eight 16 x 8 accumulator tiles) = a (16 x D) times b^T, b (64 x D); both
// row-major bf16 tiles in shared memory with row length LdH. The A fragment of k-step kk: lane l
// points at row (l % 8) + 8 ((l / 8) % 2), column 16 kk + 8 (l / 16). B = b^T is column-major,
// i.e. b's rows as stored: matrices {rows n0.., k 0-7}, {n0.., k 8-15}, {n0+8.., k 0-7},
// {n0+8.., k 8-15} are b0, b1 of tile n0 and b0, b1 of tile n0 + 8.
template <int D>
__device__ __forceinline__ void MmaScores(const bf16* a, const bf16* b, float (&s)[8][4]) {
  constexpr int ld = Smem<D>::LdH;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t fa[4];
    LdMatrixX4(fa, a + fragments::ARow(lane) * ld + 16 * kk + fragments::ACol(lane));
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t fb[4];
      LdMatrixX4(fb, b + (16 * np + fragments::BtRow(lane)) * ld + 16 * kk + fragments::BtCol(lane));
      Mma16816(s[2 * np], fa, fb[0], fb[1]);
      Mma16816(s[2 * np + 1], fa, fb[2], fb[3]);
    }
  }
}

// acc (16 x D: D/8 accumulator tiles) += p (16 x 64 accumulator tiles, rounded to bf16 here)
// times b (64 x D, row-major bf16 in shared memory, row length LdH). Tiles 2kk and 2kk+1 of p are
// the A fragment of k-step kk; B (k x n) is b as stored, so ldmatrix transposes: matrices {rows
// 16kk.., cols n0..}, {16kk+8.., n0..}, {16kk.., n0+8..}, {16kk+8.., n0+8..} are b0, b1 of tile
// n0 and b0, b1 of tile n0 + 8.
template <int D>
__device__ __forceinline__ void MmaAccumulate(const float (&p)[8][4], const bf16* b,
                                              float (&acc)[D / 8][4]) {
  constexpr int ld = Smem<D>::LdH;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t fa[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float* acc_tile = p[fragments::AccTileOfReg(kk, r)];
      fa[r] = PackBf16(acc_tile[fragments::AccElemOfReg(r)],
                       acc_tile[fragments::AccElemOfReg(r) + 1]);
    }
#pragma unroll
    for (int np = 0; np < D / 16; ++np) {
      uint32_t fb[4];
      LdMatrixX4Trans(fb, b + (16 * kk + fragments::BRow(lane)) * ld + 16 * np +
                              fragments::BCol(lane));
      Mma16816(acc[2 * np], fa, fb[0], fb[1]);
      Mma16816(acc[2 * np + 1], fa, fb[2], fb[3]);
    }
  }
}

// Stores a warp's accumulator rows: element (g + 8h, 8n + 2t + e) of acc, times scale[h], into
// column col0 + 8n + 2t + e (< d) of the token row of position t_g + 8h (< s).
template <int D, typename T>
__device__ __forceinline__ void MmaStoreRows(const float (&acc)[D / 8][4], const float (&scale)[2],
                                             const HeadLayout& lay, int64_t w, int64_t col0,
                                             int64_t bi, int64_t t_g, T* dst) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t t = t_g + 8 * h;  // fragments::CRow(lane, 2h) - CRow(lane, 0) = 8h
    if (t >= lay.s) continue;
    T* row = dst + TokenRow(lay, bi, t) * w + col0;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int e = 2 * h; e < 2 * h + 2; ++e) {
        const int c = 8 * n + fragments::CCol(lane, e);
        if (c < lay.d) StoreFloat(row + c, acc[n][e] * scale[h]);
      }
  }
}

// cp.async (sm_80): 16 bytes from global to shared memory without passing through registers,
// completing in the background; src_bytes 0 fills the 16 bytes with zeros (nothing is read).
#ifdef PTDP_CUDA_EMU
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, int src_bytes) {
  ::ptdp::emu::detail::CpAsync16(dst, src, src_bytes);
}
__device__ __forceinline__ void CpAsyncCommit() { ::ptdp::emu::detail::CpAsyncCommit(); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  ::ptdp::emu::detail::CpAsyncWait(N);
}
#else
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SharedAddress(dst)),
               "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
#endif  // PTDP_CUDA_EMU

// A row tile as LoadRows<D> fills it, started in the background where it can be (bf16 rows
// with d a multiple of 8 and src 16-byte aligned: LoadRows' vector path, each 16-byte piece a
// cp.async, zeros past the sequence or the head dimension); otherwise loaded now by LoadRows.
// Either way the tile is complete for this thread after CpAsyncCommit and CpAsyncWait, and for
// the block after a __syncthreads.
template <int D>
__device__ void LoadRowsAsync(const bf16* src, const HeadLayout& lay, int64_t w, int64_t col0,
                              int64_t bi, int64_t t0, bf16* dst) {
  if (lay.d % 8 != 0 || (reinterpret_cast<uintptr_t>(src) & 15) != 0) {
    LoadRows<D>(src, lay, w, col0, bi, t0, dst);
    return;
  }
  for (int idx = threadIdx.x; idx < kTile * D / 8; idx += kFlashThreads) {
    const int r = idx / (D / 8), c = (idx % (D / 8)) * 8;
    const int64_t t = t0 + r;
    const bool in = t < lay.s && c < lay.d;
    CpAsync16(dst + r * Smem<D>::LdH + c, in ? src + TokenRow(lay, bi, t) * w + col0 + c : src,
              in ? 16 : 0);
  }
}
template <int D>
__device__ void LoadRowsAsync(const float* src, const HeadLayout& lay, int64_t w, int64_t col0,
                              int64_t bi, int64_t t0, bf16* dst) {
  LoadRows<D>(src, lay, w, col0, bi, t0, dst);  // rounded to bf16 on the way: no cp.async
}

// One step of the two-buffer pipeline: start the next tile where there is one (start_next loads
// and commits it into the buffer every warp finished with at the end of the previous step), wait
// for this step's tile only, then make it visible to the block.
template <typename StartNext>
__device__ __forceinline__ void PipelineStep(bool has_next, const StartNext& start_next) {
  if (has_next) {
    start_next();
    CpAsyncWait<1>();
  } else {
    CpAsyncWait<0>();
  }
  __syncthreads();
}

// Max and sum over the four lanes of a quad (the lanes holding one accumulator row).
__device__ __forceinline__ float QuadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float QuadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
#endif

// Shared memory of the register-resident kernels: the Q tile and two K and two V tiles (the
// forward loads the next key tile while it computes on this one); in the backward two fixed
// tiles, two buffers of two streamed ones and two of row statistics (MmaBackwardTiles).
template <int D>
struct MmaSmem {
  static constexpr size_t kForward = 5 * Smem<D>::kRowTile;
  static constexpr size_t kBackward = 6 * Smem<D>::kRowTile + 2 * Smem<D>::kRowStats;
};

// Grid (L, query tiles), the last query tile first, as FlashForwardKernel. Warp w holds queries
// q0 + 16w + g and + 8 (lane 4g + t).
template <int D, typename T>
__global__ void __launch_bounds__(kFlashThreads)
    FlashMmaForwardKernel(const T* qkv, HeadLayout lay, float scale2, T* out, float* lse) {
#ifdef PTDP_FLASH_TENSOR_CORES
  constexpr int ld = Smem<D>::LdH;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* kv_tiles = qs + kTile * ld;  // K of buffer 0, V of 0, K of 1, V of 1

  const auto [l, bi, j, a, w, warp, lane, r, half] = PlaceOf(lay);
  const int64_t qt = int64_t(gridDim.y) - 1 - blockIdx.y, q0 = qt * kTile;
  const int64_t row0 = q0 + 16 * warp;                   // the warp's first query
  const int64_t t_g = row0 + fragments::CRow(lane, 0);  // the lane's first row; the second + 8
  // Key tile kt's K (then V) buffer: kt % 2; loaded in the background where it can be.
  auto keys_of = [&](int64_t kt) { return kv_tiles + (kt % 2) * 2 * kTile * ld; };
  const int64_t head = l;
  auto load_keys = [&](int64_t kt) {
    LoadKeyTiles<D, true>(qkv, lay, head, kt * kTile, keys_of(kt), keys_of(kt) + kTile * ld);
    CpAsyncCommit();
  };

  LoadRows<D>(qkv, lay, w, j * lay.d, bi, q0, qs);
  load_keys(0);
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f};  // sum: this lane's part
  for (int64_t kt = 0; kt <= qt; ++kt) {
    const int64_t k0 = kt * kTile;
    PipelineStep(kt < qt, [&] { load_keys(kt + 1); });  // key tile kt (and Q) complete
    const bf16* ks = keys_of(kt);
    const bf16* vs = ks + kTile * ld;
    float s[8][4];
    MmaScores<D>(qs + 16 * warp * ld, ks, s);
    // Online softmax (base 2). Key k0 <= q0 <= the row's position is visible to every row of
    // the tile, so each row's tile maximum is finite.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t kpos = k0 + 8 * n + fragments::CCol(lane, e);
        const int64_t qpos = row0 + fragments::CRow(lane, e);
        const float x = kpos <= qpos && kpos < lay.s ? s[n][e] * scale2 : -INFINITY;
        s[n][e] = x;
        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], x);
      }
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new = fmaxf(m[h], QuadMax(tile_max[h]));
      alpha[h] = exp2f(m[h] - m_new);  // 0 on the first tile (m = -inf)
      m[h] = m_new;
      sum[h] *= alpha[h];
    }
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(s[n][e] - m[e >> 1]);
        s[n][e] = p;
        sum[e >> 1] += p;
      }
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][e] *= alpha[e >> 1];
    MmaAccumulate<D>(s, vs, o);  // O += P V
    __syncthreads();  // every warp is done with buffer kt % 2 before tile kt + 2 goes there
  }
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float total = QuadSum(sum[h]);
    inv[h] = 1.0f / total;
    const int64_t t = t_g + 8 * h;
    if (lane % 4 == 0 && t < lay.s) lse[l * lay.s + t] = (m[h] + log2f(total)) * kLn2;
  }
  MmaStoreRows<D>(o, inv, lay, a, j * lay.d, bi, t_g, out);
#endif
}

// Shared memory of the register-resident backward kernels (MmaSmem<D>::kBackward): two fixed row
// tiles (the dK/dV kernel's K and V; the dQ kernel's Q and dO), two buffers of two streamed row
// tiles (Q and dO; K and V), and two buffers of row statistics (lse in base 2 and delta of the
// streamed queries; the dQ kernel keeps its own queries' in buffer 0). Buffer b + 1 mod 2 is
// filled (cp.async where LoadRowsAsync can) while the warps compute on buffer b.
template <int D>
struct MmaBackwardTiles {
  static constexpr int ld = Smem<D>::LdH;
  bf16* fixed;    // two row tiles
  bf16* streamed; // buffer b: two row tiles from streamed + 2 b kTile ld
  float* stats;   // buffer b: lse (kTile) then delta (kTile) from stats + 2 b kTile
  __device__ explicit MmaBackwardTiles(unsigned char* smem) {
    fixed = reinterpret_cast<bf16*>(smem);
    streamed = fixed + 2 * kTile * ld;
    stats = reinterpret_cast<float*>(streamed + 4 * kTile * ld);
  }
  __device__ bf16* Fixed(int i) const { return fixed + i * kTile * ld; }
  __device__ bf16* Streamed(int64_t b, int i) const { return streamed + (2 * (b % 2) + i) * kTile * ld; }
  __device__ float* Lse(int64_t b) const { return stats + 2 * (b % 2) * kTile; }
  __device__ float* Delta(int64_t b) const { return Lse(b) + kTile; }
  // The 64 queries from q0: Q and dO into (first, second), their lse and delta into buffer b;
  // the 64 keys from k0: K and V into (first, second). In the background where they can be.
  template <typename T>
  __device__ void Queries(const T* qkv, const T* dout, const float* lse, const float* delta,
                          const HeadLayout& lay, int64_t l, int64_t q0, bf16* first,
                          bf16* second, int64_t b) const {
    LoadQueryTiles<D, true>(qkv, dout, lse, delta, lay, l, q0, first, second, Lse(b), Delta(b));
  }
  template <typename T>
  __device__ void Keys(const T* qkv, const HeadLayout& lay, int64_t l, int64_t k0, bf16* first,
                       bf16* second) const {
    LoadKeyTiles<D, true>(qkv, lay, l, k0, first, second);
  }
};

// dK, dV of one key tile over the query tiles that see it; grid as FlashBackwardKvKernel. Warp w
// holds keys k0 + 16w + g and + 8; its score tiles are transposed (rows keys, columns queries):
// S^T = K Q^T, dP^T = V dO^T, then dV += P^T dO and dK += dS^T Q from the same registers.
template <int D, typename T>
__global__ void __launch_bounds__(kFlashThreads)
    FlashMmaBackwardKvKernel(const T* dout, const T* qkv, const float* lse, const float* delta,
                             HeadLayout lay, float scale, T* dqkv) {
#ifdef PTDP_FLASH_TENSOR_CORES
  constexpr int ld = Smem<D>::LdH;
  extern __shared__ __align__(128) unsigned char smem[];
  const MmaBackwardTiles<D> t(smem);
  const bf16 *ks = t.Fixed(0), *vs = t.Fixed(1);

  const auto [l, bi, j, a, w, warp, lane, r, half] = PlaceOf(lay);
  const int64_t tiles = gridDim.y, kt = blockIdx.y, k0 = kt * kTile;
  const int64_t key0 = k0 + 16 * warp;                   // the warp's first key
  const int64_t key_g = key0 + fragments::CRow(lane, 0);
  const float scale2 = scale * kLog2e;
  // Query tile qt into buffer qt - kt (mod 2).
  const int64_t head = l;
  auto load_queries = [&](int64_t qt) {
    t.Queries(qkv, dout, lse, delta, lay, head, qt * kTile, t.Streamed(qt - kt, 0),
              t.Streamed(qt - kt, 1), qt - kt);
    CpAsyncCommit();
  };

  t.Keys(qkv, lay, l, k0, t.Fixed(0), t.Fixed(1));
  load_queries(kt);  // one group: K, V and the first query tile
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.0f;
  for (int64_t qt = kt; qt < tiles; ++qt) {
    const int64_t q0 = qt * kTile, b = qt - kt;
    PipelineStep(qt + 1 < tiles, [&] { load_queries(qt + 1); });  // query tile qt (and K, V)
    const bf16 *qs = t.Streamed(b, 0), *dos = t.Streamed(b, 1);
    const float *lse_s = t.Lse(b), *delta_s = t.Delta(b);
    float p[8][4], ds[8][4];
    MmaScores<D>(ks + 16 * warp * ld, qs, p);   // S^T
    MmaScores<D>(vs + 16 * warp * ld, dos, ds); // dP^T
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = 8 * n + fragments::CCol(lane, e);
        const int64_t qpos = q0 + qi, kpos = key0 + fragments::CRow(lane, e);
        const bool seen = kpos <= qpos && qpos < lay.s;
        const float pe = seen ? exp2f(p[n][e] * scale2 - lse_s[qi]) : 0.0f;
        p[n][e] = pe;
        ds[n][e] = pe * (ds[n][e] - delta_s[qi]);
      }
    MmaAccumulate<D>(p, dos, dv);  // dV += P^T dO
    MmaAccumulate<D>(ds, qs, dk);  // dK += dS^T Q
    __syncthreads();  // every warp is done with buffer b before query tile qt + 2 goes there
  }
  const float one[2] = {1.0f, 1.0f}, sc[2] = {scale, scale};
  MmaStoreRows<D>(dv, one, lay, w, 2 * a + j * lay.d, bi, key_g, dqkv);
  MmaStoreRows<D>(dk, sc, lay, w, a + j * lay.d, bi, key_g, dqkv);
#endif
}

// dQ of one query tile over the key tiles it sees; grid as FlashBackwardQKernel. Warp w holds
// queries q0 + 16w + g and + 8: S = Q K^T, dP = dO V^T, dQ += dS K.
template <int D, typename T>
__global__ void __launch_bounds__(kFlashThreads)
    FlashMmaBackwardQKernel(const T* dout, const T* qkv, const float* lse, const float* delta,
                            HeadLayout lay, float scale, T* dqkv) {
#ifdef PTDP_FLASH_TENSOR_CORES
  constexpr int ld = Smem<D>::LdH;
  extern __shared__ __align__(128) unsigned char smem[];
  const MmaBackwardTiles<D> t(smem);
  const bf16 *qs = t.Fixed(0), *dos = t.Fixed(1);
  const float *lse_s = t.Lse(0), *delta_s = t.Delta(0);

  const auto [l, bi, j, a, w, warp, lane, r, half] = PlaceOf(lay);
  const int row_g = 16 * warp + fragments::CRow(lane, 0);  // tile rows row_g and row_g + 8
  const int64_t qt = int64_t(gridDim.y) - 1 - blockIdx.y, q0 = qt * kTile;
  const int64_t t_g = q0 + row_g;
  const float scale2 = scale * kLog2e;
  // Key tile kt into buffer kt (mod 2).
  const int64_t head = l;
  auto load_keys = [&](int64_t kt) {
    t.Keys(qkv, lay, head, kt * kTile, t.Streamed(kt, 0), t.Streamed(kt, 1));
    CpAsyncCommit();
  };

  t.Queries(qkv, dout, lse, delta, lay, l, q0, t.Fixed(0), t.Fixed(1), 0);
  load_keys(0);  // one group: Q, dO and the first key tile
  float dq[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
  for (int64_t kt = 0; kt <= qt; ++kt) {
    const int64_t k0 = kt * kTile;
    PipelineStep(kt < qt, [&] { load_keys(kt + 1); });  // key tile kt (and Q, dO, row stats)
    const bf16 *ks = t.Streamed(kt, 0), *vs = t.Streamed(kt, 1);
    const float lse_r[2] = {lse_s[row_g], lse_s[row_g + 8]};
    const float delta_r[2] = {delta_s[row_g], delta_s[row_g + 8]};
    float p[8][4], ds[8][4];
    MmaScores<D>(qs + 16 * warp * ld, ks, p);    // S
    MmaScores<D>(dos + 16 * warp * ld, vs, ds);  // dP
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        const int64_t kpos = k0 + 8 * n + fragments::CCol(lane, e);
        const int64_t qpos = q0 + 16 * warp + fragments::CRow(lane, e);
        const bool seen = kpos <= qpos && qpos < lay.s;
        const float pe = seen ? exp2f(p[n][e] * scale2 - lse_r[h]) : 0.0f;
        ds[n][e] = pe * (ds[n][e] - delta_r[h]);
      }
    MmaAccumulate<D>(ds, ks, dq);  // dQ += dS K
    __syncthreads();  // every warp is done with buffer kt before key tile kt + 2 goes there
  }
  const float sc[2] = {scale, scale};
  MmaStoreRows<D>(dq, sc, lay, w, j * lay.d, bi, t_g, dqkv);
#endif
}

// The kernels of one variant and head size (D): forward, and the backward's two.
template <int D, typename T>
struct Kernels {
  using ForwardFn = void (*)(const T*, HeadLayout, float, T*, float*);
  using BackwardFn = void (*)(const T*, const T*, const float*, const float*, HeadLayout, float, T*);
  ForwardFn forward;
  BackwardFn kv, q;
  size_t forward_bytes, backward_bytes;
};
template <int D, typename T>
Kernels<D, T> KernelsOf(FlashVariant v) {
  if (v == FlashVariant::kMma)
    return {FlashMmaForwardKernel<D, T>, FlashMmaBackwardKvKernel<D, T>,
            FlashMmaBackwardQKernel<D, T>, MmaSmem<D>::kForward, MmaSmem<D>::kBackward};
  return {FlashForwardKernel<D, T>, FlashBackwardKvKernel<D, T>, FlashBackwardQKernel<D, T>,
          Smem<D>::kForward, Smem<D>::kBackward};
}

template <typename F>
cudaError_t AllowSmem(F* kernel, size_t bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
}

template <int D, typename T>
cudaError_t Forward(FlashVariant v, const T* qkv, HeadLayout lay, T* out, float* lse,
                    cudaStream_t st) {
  const Kernels<D, T> k = KernelsOf<D, T>(v);
  const cudaError_t e = AllowSmem(k.forward, k.forward_bytes);
  if (e != cudaSuccess) return e;
  const dim3 grid(unsigned(lay.b * lay.nh), unsigned((lay.s + kTile - 1) / kTile));
  const float scale2 = kLog2e / std::sqrt(float(lay.d));
  k.forward<<<grid, kFlashThreads, k.forward_bytes, st>>>(qkv, lay, scale2, out, lse);
  return cudaGetLastError();
}

template <int D, typename T>
cudaError_t Backward(FlashVariant v, const T* dout, const T* qkv, const float* lse,
                     const float* delta, HeadLayout lay, T* dqkv, cudaStream_t st) {
  const Kernels<D, T> k = KernelsOf<D, T>(v);
  cudaError_t e = AllowSmem(k.kv, k.backward_bytes);
  if (e == cudaSuccess) e = AllowSmem(k.q, k.backward_bytes);
  if (e != cudaSuccess) return e;
  const dim3 grid(unsigned(lay.b * lay.nh), unsigned((lay.s + kTile - 1) / kTile));
  const float scale = 1.0f / std::sqrt(float(lay.d));
  k.kv<<<grid, kFlashThreads, k.backward_bytes, st>>>(dout, qkv, lse, delta, lay, scale, dqkv);
  k.q<<<grid, kFlashThreads, k.backward_bytes, st>>>(dout, qkv, lse, delta, lay, scale, dqkv);
  return cudaGetLastError();
}

}  // namespace

bool FlashAttentionSupported(int64_t d, int major, int64_t smem_optin, FlashVariant v) {
  if (!Supported(d) || major < 8) return false;
  size_t need = d <= 64 ? Smem<64>::kBackward : Smem<128>::kBackward;
  if (v == FlashVariant::kMma) need = d <= 64 ? MmaSmem<64>::kBackward : MmaSmem<128>::kBackward;
  return int64_t(need) <= smem_optin;
}

template <typename T>
cudaError_t FlashAttentionForward(const T* qkv, HeadLayout lay, T* out, float* lse,
                                  cudaStream_t st, FlashVariant v) {
  if (lay.b * lay.nh * lay.s == 0) return cudaSuccess;
  if (!Supported(lay.d) || lay.nmat != 3) return cudaErrorInvalidValue;
  return lay.d <= 64 ? Forward<64>(v, qkv, lay, out, lse, st)
                     : Forward<128>(v, qkv, lay, out, lse, st);
}

template <typename T>
cudaError_t FlashAttentionBackward(const T* dout, const T* qkv, const T* out, const float* lse,
                                   HeadLayout lay, float* delta, T* dqkv, cudaStream_t st,
                                   FlashVariant v) {
  const int64_t rows = lay.b * lay.nh * lay.s;
  if (rows == 0) return cudaSuccess;
  if (!Supported(lay.d) || lay.nmat != 3) return cudaErrorInvalidValue;
  HeadLayout lay_o = lay;
  lay_o.nmat = 1;
  const int64_t blocks = std::min<int64_t>((rows + 7) / 8, 65535);  // 8 warps a block
  FlashDeltaKernel<T><<<unsigned(blocks), 256, 0, st>>>(dout, out, lay_o, delta);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  return lay.d <= 64 ? Backward<64>(v, dout, qkv, lse, delta, lay, dqkv, st)
                     : Backward<128>(v, dout, qkv, lse, delta, lay, dqkv, st);
}

template cudaError_t FlashAttentionForward<float>(const float*, HeadLayout, float*, float*,
                                                  cudaStream_t, FlashVariant);
template cudaError_t FlashAttentionForward<bf16>(const bf16*, HeadLayout, bf16*, float*,
                                                 cudaStream_t, FlashVariant);
template cudaError_t FlashAttentionBackward<float>(const float*, const float*, const float*,
                                                   const float*, HeadLayout, float*, float*,
                                                   cudaStream_t, FlashVariant);
template cudaError_t FlashAttentionBackward<bf16>(const bf16*, const bf16*, const bf16*,
                                                  const float*, HeadLayout, float*, bf16*,
                                                  cudaStream_t, FlashVariant);

}  // namespace ptdp::rt::cuda::kernels
