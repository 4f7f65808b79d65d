// The CPU kernels once per x86-64 level (cpu_kernels_impl.h included into three namespaces, each
// with its vector type and target attribute) and the run-time choice between them.
#include "runtime/cpu/cpu_kernels.h"

#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ptdp::rt {
namespace {

#if defined(__x86_64__)

// ---- baseline: SSE2, which every x86-64 CPU has -------------------------------------------------
namespace baseline {
#define PTDP_KFN static
#define PTDP_KINLINE static inline __attribute__((always_inline))
struct Isa {
  static constexpr CpuKernelLevel kLevel = CpuKernelLevel::kBaseline;
  static constexpr const char* kName = "baseline";
  // 16 xmm registers: a 6 x 8 tile is 12 accumulators, 2 of B, 1 of A (packed pre-broadcast).
  static constexpr int kW = 4, kMr = 6;
  static constexpr bool kSplatA = true;
  static constexpr int64_t kKc = 256, kMc = 96, kNc = 2048;
  using V = __m128;
  PTDP_KINLINE V Load(const float* p) { return _mm_loadu_ps(p); }
  PTDP_KINLINE void Store(float* p, V v) { _mm_storeu_ps(p, v); }
  PTDP_KINLINE V Set(float x) { return _mm_set1_ps(x); }
  PTDP_KINLINE V Zero() { return _mm_setzero_ps(); }
  PTDP_KINLINE V Add(V a, V b) { return _mm_add_ps(a, b); }
  PTDP_KINLINE V Sub(V a, V b) { return _mm_sub_ps(a, b); }
  PTDP_KINLINE V Mul(V a, V b) { return _mm_mul_ps(a, b); }
  PTDP_KINLINE V Div(V a, V b) { return _mm_div_ps(a, b); }
  PTDP_KINLINE V Sqrt(V a) { return _mm_sqrt_ps(a); }
  PTDP_KINLINE V Fma(V a, V b, V c) { return _mm_add_ps(_mm_mul_ps(a, b), c); }  // a b + c
  PTDP_KINLINE V Min(V a, V b) { return _mm_min_ps(a, b); }  // b when either is NaN
  PTDP_KINLINE V Abs(V a) { return _mm_and_ps(a, _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff))); }
  // |a| with the sign of s (a >= 0).
  PTDP_KINLINE V CopySign(V a, V s) {
    return _mm_or_ps(a, _mm_and_ps(s, _mm_castsi128_ps(_mm_set1_epi32(int(0x80000000u)))));
  }
  PTDP_KINLINE V Less(V a, V b) { return _mm_cmplt_ps(a, b); }
  PTDP_KINLINE V Select(V mask, V a, V b) {  // mask ? a : b
    return _mm_or_ps(_mm_and_ps(mask, a), _mm_andnot_ps(mask, b));
  }
  // To the nearest integer (|x| < 2^31; the default rounding mode), as a float.
  PTDP_KINLINE V Round(V x) { return _mm_cvtepi32_ps(_mm_cvtps_epi32(x)); }
  // 2^n for integral n in [-126, 127].
  PTDP_KINLINE V Pow2(V n) {
    return _mm_castsi128_ps(
        _mm_slli_epi32(_mm_add_epi32(_mm_cvtps_epi32(n), _mm_set1_epi32(127)), 23));
  }
  // dst[j * ldd + i] = src[i * ld + j] for i, j < 4 (SSE registers, also on the wider levels).
  PTDP_KINLINE void Transpose4(const float* src, int64_t ld, float* dst, int64_t ldd) {
    __m128 r0 = _mm_loadu_ps(src), r1 = _mm_loadu_ps(src + ld);
    __m128 r2 = _mm_loadu_ps(src + 2 * ld), r3 = _mm_loadu_ps(src + 3 * ld);
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
    _mm_storeu_ps(dst, r0);
    _mm_storeu_ps(dst + ldd, r1);
    _mm_storeu_ps(dst + 2 * ldd, r2);
    _mm_storeu_ps(dst + 3 * ldd, r3);
  }
};
#include "runtime/cpu/cpu_kernels_impl.h"
#undef PTDP_KFN
#undef PTDP_KINLINE
}  // namespace baseline

// ---- avx2: AVX2 + FMA (x86-64-v3) ---------------------------------------------------------------
namespace avx2 {
#define PTDP_KFN static __attribute__((target("avx2,fma")))
#define PTDP_KINLINE static inline __attribute__((always_inline, target("avx2,fma")))
struct Isa {
  static constexpr CpuKernelLevel kLevel = CpuKernelLevel::kAvx2;
  static constexpr const char* kName = "avx2";
  // 16 ymm registers: a 6 x 16 tile is 12 accumulators, 2 of B, 1 broadcast.
  static constexpr int kW = 8, kMr = 6;
  static constexpr bool kSplatA = false;
  static constexpr int64_t kKc = 256, kMc = 96, kNc = 2048;
  using V = __m256;
  PTDP_KINLINE V Load(const float* p) { return _mm256_loadu_ps(p); }
  PTDP_KINLINE void Store(float* p, V v) { _mm256_storeu_ps(p, v); }
  PTDP_KINLINE V Set(float x) { return _mm256_set1_ps(x); }
  PTDP_KINLINE V Zero() { return _mm256_setzero_ps(); }
  PTDP_KINLINE V Add(V a, V b) { return _mm256_add_ps(a, b); }
  PTDP_KINLINE V Sub(V a, V b) { return _mm256_sub_ps(a, b); }
  PTDP_KINLINE V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  PTDP_KINLINE V Div(V a, V b) { return _mm256_div_ps(a, b); }
  PTDP_KINLINE V Sqrt(V a) { return _mm256_sqrt_ps(a); }
  PTDP_KINLINE V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  PTDP_KINLINE V Min(V a, V b) { return _mm256_min_ps(a, b); }
  PTDP_KINLINE V Abs(V a) {
    return _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
  }
  PTDP_KINLINE V CopySign(V a, V s) {
    return _mm256_or_ps(a,
                        _mm256_and_ps(s, _mm256_castsi256_ps(_mm256_set1_epi32(int(0x80000000u)))));
  }
  PTDP_KINLINE V Less(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  PTDP_KINLINE V Select(V mask, V a, V b) { return _mm256_blendv_ps(b, a, mask); }
  PTDP_KINLINE V Round(V x) {
    return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  PTDP_KINLINE V Pow2(V n) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  // dst[j * ldd + i] = src[i * ld + j] for i, j < 4 (SSE registers, also on the wider levels).
  PTDP_KINLINE void Transpose4(const float* src, int64_t ld, float* dst, int64_t ldd) {
    __m128 r0 = _mm_loadu_ps(src), r1 = _mm_loadu_ps(src + ld);
    __m128 r2 = _mm_loadu_ps(src + 2 * ld), r3 = _mm_loadu_ps(src + 3 * ld);
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
    _mm_storeu_ps(dst, r0);
    _mm_storeu_ps(dst + ldd, r1);
    _mm_storeu_ps(dst + 2 * ldd, r2);
    _mm_storeu_ps(dst + 3 * ldd, r3);
  }
};
#include "runtime/cpu/cpu_kernels_impl.h"
#undef PTDP_KFN
#undef PTDP_KINLINE
}  // namespace avx2

// ---- avx512: AVX-512 F/VL/DQ/BW (x86-64-v4) -----------------------------------------------------
// GCC 12 warns that _mm512_undefined_ps() (inside _mm512_min_ps, _mm512_sqrt_ps, ...) "may be used
// uninitialized" (GCC bug 105593, fixed in 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
namespace avx512 {
#define PTDP_KFN static __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")))
#define PTDP_KINLINE \
  static inline      \
      __attribute__((always_inline, target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")))
struct Isa {
  static constexpr CpuKernelLevel kLevel = CpuKernelLevel::kAvx512;
  static constexpr const char* kName = "avx512";
  // 32 zmm registers: a 12 x 32 tile is 24 accumulators, 2 of B, 1 broadcast.
  static constexpr int kW = 16, kMr = 12;
  static constexpr bool kSplatA = false;
  static constexpr int64_t kKc = 256, kMc = 96, kNc = 2048;
  using V = __m512;
  PTDP_KINLINE V Load(const float* p) { return _mm512_loadu_ps(p); }
  PTDP_KINLINE void Store(float* p, V v) { _mm512_storeu_ps(p, v); }
  PTDP_KINLINE V Set(float x) { return _mm512_set1_ps(x); }
  PTDP_KINLINE V Zero() { return _mm512_setzero_ps(); }
  PTDP_KINLINE V Add(V a, V b) { return _mm512_add_ps(a, b); }
  PTDP_KINLINE V Sub(V a, V b) { return _mm512_sub_ps(a, b); }
  PTDP_KINLINE V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  PTDP_KINLINE V Div(V a, V b) { return _mm512_div_ps(a, b); }
  PTDP_KINLINE V Sqrt(V a) { return _mm512_sqrt_ps(a); }
  PTDP_KINLINE V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  PTDP_KINLINE V Min(V a, V b) { return _mm512_min_ps(a, b); }
  PTDP_KINLINE V Abs(V a) {
    return _mm512_and_ps(a, _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff)));
  }
  PTDP_KINLINE V CopySign(V a, V s) {
    return _mm512_or_ps(a,
                        _mm512_and_ps(s, _mm512_castsi512_ps(_mm512_set1_epi32(int(0x80000000u)))));
  }
  PTDP_KINLINE __mmask16 Less(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  PTDP_KINLINE V Select(__mmask16 mask, V a, V b) { return _mm512_mask_blend_ps(mask, b, a); }
  PTDP_KINLINE V Round(V x) {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  PTDP_KINLINE V Pow2(V n) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  // dst[j * ldd + i] = src[i * ld + j] for i, j < 4 (SSE registers, also on the wider levels).
  PTDP_KINLINE void Transpose4(const float* src, int64_t ld, float* dst, int64_t ldd) {
    __m128 r0 = _mm_loadu_ps(src), r1 = _mm_loadu_ps(src + ld);
    __m128 r2 = _mm_loadu_ps(src + 2 * ld), r3 = _mm_loadu_ps(src + 3 * ld);
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
    _mm_storeu_ps(dst, r0);
    _mm_storeu_ps(dst + ldd, r1);
    _mm_storeu_ps(dst + 2 * ldd, r2);
    _mm_storeu_ps(dst + 3 * ldd, r3);
  }
};
#include "runtime/cpu/cpu_kernels_impl.h"
#undef PTDP_KFN
#undef PTDP_KINLINE
}  // namespace avx512
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#else  // not x86-64: one level, plain C++ on one float at a time

namespace baseline {
#define PTDP_KFN static
#define PTDP_KINLINE static inline
struct Isa {
  static constexpr CpuKernelLevel kLevel = CpuKernelLevel::kBaseline;
  static constexpr const char* kName = "baseline";
  static constexpr int kW = 1, kMr = 4;
  static constexpr bool kSplatA = false;
  static constexpr int64_t kKc = 256, kMc = 64, kNc = 1024;
  using V = float;
  PTDP_KINLINE V Load(const float* p) { return *p; }
  PTDP_KINLINE void Store(float* p, V v) { *p = v; }
  PTDP_KINLINE V Set(float x) { return x; }
  PTDP_KINLINE V Zero() { return 0.0f; }
  PTDP_KINLINE V Add(V a, V b) { return a + b; }
  PTDP_KINLINE V Sub(V a, V b) { return a - b; }
  PTDP_KINLINE V Mul(V a, V b) { return a * b; }
  PTDP_KINLINE V Div(V a, V b) { return a / b; }
  PTDP_KINLINE V Sqrt(V a) { return __builtin_sqrtf(a); }
  PTDP_KINLINE V Fma(V a, V b, V c) { return a * b + c; }
  PTDP_KINLINE V Min(V a, V b) { return a < b ? a : b; }
  PTDP_KINLINE V Abs(V a) { return __builtin_fabsf(a); }
  PTDP_KINLINE V CopySign(V a, V s) { return __builtin_copysignf(a, s); }
  PTDP_KINLINE bool Less(V a, V b) { return a < b; }
  PTDP_KINLINE V Select(bool mask, V a, V b) { return mask ? a : b; }
  PTDP_KINLINE V Round(V x) { return __builtin_rintf(x); }
  PTDP_KINLINE V Pow2(V n) {
    const uint32_t bits = uint32_t(int32_t(n) + 127) << 23;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  PTDP_KINLINE void Transpose4(const float* src, int64_t ld, float* dst, int64_t ldd) {
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) dst[j * ldd + i] = src[i * ld + j];
  }
};
#include "runtime/cpu/cpu_kernels_impl.h"
#undef PTDP_KFN
#undef PTDP_KINLINE
}  // namespace baseline

#endif

constexpr CpuKernelLevel kLevels[] = {CpuKernelLevel::kBaseline, CpuKernelLevel::kAvx2,
                                      CpuKernelLevel::kAvx512};

}  // namespace

const CpuKernels& KernelsFor(CpuKernelLevel level) {
#if defined(__x86_64__)
  switch (level) {
    case CpuKernelLevel::kBaseline:
      return baseline::kKernels;
    case CpuKernelLevel::kAvx2:
      return avx2::kKernels;
    case CpuKernelLevel::kAvx512:
      return avx512::kKernels;
  }
#endif
  return baseline::kKernels;
}

bool CpuSupports(CpuKernelLevel level) {
#if defined(__x86_64__)
  __builtin_cpu_init();  // libgcc's feature bits, which also check that the OS saves the registers
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  switch (level) {
    case CpuKernelLevel::kBaseline:
      return true;
    case CpuKernelLevel::kAvx2:
      return avx2;
    case CpuKernelLevel::kAvx512:
      return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw");
  }
  return false;
#else
  return level == CpuKernelLevel::kBaseline;
#endif
}

std::vector<CpuKernelLevel> SupportedCpuKernelLevels() {
  std::vector<CpuKernelLevel> out;
  for (CpuKernelLevel l : kLevels)
    if (CpuSupports(l)) out.push_back(l);
  return out;
}

const char* ToString(CpuKernelLevel level) {
  switch (level) {
    case CpuKernelLevel::kBaseline:
      return "baseline";
    case CpuKernelLevel::kAvx2:
      return "avx2";
    case CpuKernelLevel::kAvx512:
      return "avx512";
  }
  return "?";
}

CpuKernelChoice ChooseCpuKernels(const char* env) {
  const CpuKernels* best = &KernelsFor(SupportedCpuKernelLevels().back());
  const std::string want = env == nullptr ? "" : env;
  if (want.empty() || want == "auto") return {best, "the best this CPU runs"};
  for (CpuKernelLevel l : kLevels) {
    if (want != ToString(l)) continue;
    if (CpuSupports(l)) return {&KernelsFor(l), "set by PTDP_CPU_KERNELS"};
    return {best,
            "PTDP_CPU_KERNELS=" + want + " needs instructions this CPU lacks; the best it runs"};
  }
  return {best, "PTDP_CPU_KERNELS=" + want +
                    " is not baseline, avx2, avx512 or auto; the best this CPU runs"};
}

const CpuKernelChoice& ChosenCpuKernels() {
  static const CpuKernelChoice choice = ChooseCpuKernels(std::getenv("PTDP_CPU_KERNELS"));
  return choice;
}

}  // namespace ptdp::rt
