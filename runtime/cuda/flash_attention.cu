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
    const int64_t bi = l / lay.nh, j = l % lay.nh, a = lay.nh * lay.d;
    HeadLayout lay_o = lay;
    lay_o.nmat = 1;
    LoadRows<D>(qkv, lay, 3 * a, j * lay.d, bi, q0, qs);
    LoadRows<D>(dout, lay_o, a, j * lay.d, bi, q0, dos);
    LoadRowStats(lse, delta, l, lay.s, q0, lse_s, delta_s);
  }
  // K and V of the 64 keys from k0 (all threads).
  template <typename T>
  __device__ void LoadKeys(const T* qkv, const HeadLayout& lay, int64_t l, int64_t k0) {
    const int64_t bi = l / lay.nh, j = l % lay.nh, a = lay.nh * lay.d;
    LoadRows<D>(qkv, lay, 3 * a, a + j * lay.d, bi, k0, ks);
    LoadRows<D>(qkv, lay, 3 * a, 2 * a + j * lay.d, bi, k0, vs);
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

template <int D, typename T>
cudaError_t Forward(const T* qkv, HeadLayout lay, T* out, float* lse, cudaStream_t st) {
  const size_t bytes = Smem<D>::kForward;
  cudaError_t e = cudaFuncSetAttribute(FlashForwardKernel<D, T>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (e != cudaSuccess) return e;
  const dim3 grid(unsigned(lay.b * lay.nh), unsigned((lay.s + kTile - 1) / kTile));
  const float scale2 = kLog2e / std::sqrt(float(lay.d));
  FlashForwardKernel<D, T><<<grid, kFlashThreads, bytes, st>>>(qkv, lay, scale2, out, lse);
  return cudaGetLastError();
}

template <int D, typename T>
cudaError_t Backward(const T* dout, const T* qkv, const float* lse, const float* delta,
                     HeadLayout lay, T* dqkv, cudaStream_t st) {
  const size_t bytes = Smem<D>::kBackward;
  cudaError_t e = cudaFuncSetAttribute(FlashBackwardKvKernel<D, T>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(FlashBackwardQKernel<D, T>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (e != cudaSuccess) return e;
  const dim3 grid(unsigned(lay.b * lay.nh), unsigned((lay.s + kTile - 1) / kTile));
  const float scale = 1.0f / std::sqrt(float(lay.d));
  FlashBackwardKvKernel<D, T>
      <<<grid, kFlashThreads, bytes, st>>>(dout, qkv, lse, delta, lay, scale, dqkv);
  FlashBackwardQKernel<D, T>
      <<<grid, kFlashThreads, bytes, st>>>(dout, qkv, lse, delta, lay, scale, dqkv);
  return cudaGetLastError();
}

}  // namespace

bool FlashAttentionSupported(int64_t d, int major, int64_t smem_optin) {
  if (!Supported(d) || major < 8) return false;
  const size_t need = d <= 64 ? Smem<64>::kBackward : Smem<128>::kBackward;
  return int64_t(need) <= smem_optin;
}

template <typename T>
cudaError_t FlashAttentionForward(const T* qkv, HeadLayout lay, T* out, float* lse,
                                  cudaStream_t st) {
  if (lay.b * lay.nh * lay.s == 0) return cudaSuccess;
  if (!Supported(lay.d) || lay.nmat != 3) return cudaErrorInvalidValue;
  return lay.d <= 64 ? Forward<64>(qkv, lay, out, lse, st) : Forward<128>(qkv, lay, out, lse, st);
}

template <typename T>
cudaError_t FlashAttentionBackward(const T* dout, const T* qkv, const T* out, const float* lse,
                                   HeadLayout lay, float* delta, T* dqkv, cudaStream_t st) {
  const int64_t rows = lay.b * lay.nh * lay.s;
  if (rows == 0) return cudaSuccess;
  if (!Supported(lay.d) || lay.nmat != 3) return cudaErrorInvalidValue;
  HeadLayout lay_o = lay;
  lay_o.nmat = 1;
  const int64_t blocks = std::min<int64_t>((rows + 7) / 8, 65535);  // 8 warps a block
  FlashDeltaKernel<T><<<unsigned(blocks), 256, 0, st>>>(dout, out, lay_o, delta);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  return lay.d <= 64 ? Backward<64>(dout, qkv, lse, delta, lay, dqkv, st)
                     : Backward<128>(dout, qkv, lse, delta, lay, dqkv, st);
}

template cudaError_t FlashAttentionForward<float>(const float*, HeadLayout, float*, float*,
                                                  cudaStream_t);
template cudaError_t FlashAttentionForward<bf16>(const bf16*, HeadLayout, bf16*, float*,
                                                 cudaStream_t);
template cudaError_t FlashAttentionBackward<float>(const float*, const float*, const float*,
                                                   const float*, HeadLayout, float*, float*,
                                                   cudaStream_t);
template cudaError_t FlashAttentionBackward<bf16>(const bf16*, const bf16*, const bf16*,
                                                  const float*, HeadLayout, float*, bf16*,
                                                  cudaStream_t);

}  // namespace ptdp::rt::cuda::kernels
