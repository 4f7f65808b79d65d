// The CPU backend's hot kernels (GEMM, tanh/GeLU, AdamW), compiled once per
// x86-64 level into the same portable binary and chosen at run time by the CPU's features.
//
//   level      instructions                          GEMM micro-tile   chosen when the CPU has
//   baseline   SSE2 (every x86-64 CPU), no FMA        6 x 8             always possible
//   avx2       AVX2 + FMA (x86-64-v3)                 6 x 16            avx2 and fma
//   avx512     AVX-512 F/VL/DQ/BW + the above (v4)    12 x 32           avx512f/vl/dq/bw too
//
// PTDP_CPU_KERNELS=baseline|avx2|avx512 overrides the choice (tests, diagnosis); a level the CPU
// lacks is never run (the best one it has is taken, and the choice says why). Every level is
// deterministic (the same inputs give bit-identical outputs); levels differ from each other only
// in fp32 rounding (FMA or not, summation blocking), within the tolerances the tests state.
// Off x86-64 there is one level, "baseline", plain C++ (docs/runtime.md, "CPU kernels").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ptdp::rt {

enum class CpuKernelLevel { kBaseline, kAvx2, kAvx512 };

// Which entries of op(A) a GEMM may read: a triangular A's other half holds anything (the
// attention's score matrices) and is treated as zero.
enum class Triangle { kNone, kLower, kUpper };  // kLower: op(A)(i, p) = 0 for p > i; kUpper: p < i

// C = alpha * op(A) op(B) + beta * C, every operand addressed by strides so that transposes and
// strided head blocks need no copies:
//   op(A)(i, p) = a[i * a_rs + p * a_cs]    (m, k)
//   op(B)(p, j) = b[p * b_rs + j * b_cs]    (k, n)
//   C(i, j)     = c[i * ldc + j]            (m, n)
// With beta == 0, C is not read (it may hold NaNs). C must not overlap A or B.
struct GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  const float* a = nullptr;
  int64_t a_rs = 0, a_cs = 0;
  const float* b = nullptr;
  int64_t b_rs = 0, b_cs = 0;
  float* c = nullptr;
  int64_t ldc = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
  Triangle a_tri = Triangle::kNone;  // which part of op(A) is read (the rest is taken as 0)
  bool c_lower = false;  // only C(i, j) with j <= i is wanted; the others are left unspecified
};

// One level's kernels. Pointers, element counts n >= 0; outputs may alias inputs where the
// Backend op they implement allows it (runtime/backend.h).
struct CpuKernels {
  CpuKernelLevel level;
  const char* name;  // "baseline", "avx2", "avx512"
  // Floats of packing workspace gemm() needs for these sizes (64-byte aligned by the caller).
  size_t (*gemm_pack_floats)(int64_t m, int64_t n, int64_t k);
  void (*gemm)(const GemmArgs& g, float* pack);
  // y = tanh(x) (the vectorised approximation GeLU uses; exposed for its accuracy test).
  void (*tanh)(const float* x, float* y, int64_t n);
  // GeLU, tanh approximation: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  void (*gelu_forward)(const float* x, float* y, int64_t n);
  // dx = gelu'(x) * dy.
  void (*gelu_backward)(const float* dy, const float* x, float* dx, int64_t n);
  // AdamW on n elements (runtime/backend.h's formula; bc1, bc2 = 1 - beta^step). Every level
  // rounds exactly as the scalar formula does (no FMA, IEEE sqrt and division): bit-identical.
  void (*adamw)(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                float beta2, float eps, float weight_decay, float grad_scale, float bc1, float bc2);
};

// The kernels of `level`. Precondition: CpuSupports(level) (running another level's code on a CPU
// without its instructions dies with SIGILL).
const CpuKernels& KernelsFor(CpuKernelLevel level);
// Whether this CPU (and OS) can run `level`'s instructions.
bool CpuSupports(CpuKernelLevel level);
// Every level this CPU can run, baseline first.
std::vector<CpuKernelLevel> SupportedCpuKernelLevels();
const char* ToString(CpuKernelLevel level);

// The choice for a value of PTDP_CPU_KERNELS (nullptr: unset): the level it names when this CPU
// runs it, else the best level this CPU runs. `why` says which ("the best this CPU runs", "set by
// PTDP_CPU_KERNELS", or why the value was not taken).
struct CpuKernelChoice {
  const CpuKernels* kernels;
  std::string why;
};
CpuKernelChoice ChooseCpuKernels(const char* env);
// The process's choice: ChooseCpuKernels(getenv("PTDP_CPU_KERNELS")), made once on first use.
const CpuKernelChoice& ChosenCpuKernels();

}  // namespace ptdp::rt
