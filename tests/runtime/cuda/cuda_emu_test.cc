// The CUDA backend's own kernels (runtime/cuda/kernels.cu, flash_attention.cu) run on the CPU by
// the CUDA emulator (runtime/cuda/emu/cuda_emu.h) and compared with the CPU backend, the same
// references and tolerances as the GPU tests (cuda_backend_test.cc) use. Runs on every machine
// the CUDA backend builds on, GPU or not: the kernels' indexing, bounds (under the sanitizers),
// barriers, warp collectives, shared-memory layouts and launch configurations are checked here
// first; the GPU tests remain the judge of the device itself (cuda_emu.h says what differs).
// Each kernel test runs in three schedules (EmuSchedule): threads and blocks in order, in reverse
// order, and with cp.async copies landing as late as a GPU may land them, so that a missing
// barrier or wait shows as a wrong result in at least one.
#include "runtime/cuda/emu/cuda_emu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/cuda/flash_attention.cuh"
#include "runtime/cuda/kernels.cuh"

namespace ptdp::rt::cuda {
namespace {

namespace k = kernels;
using bf16 = __nv_bfloat16;

// ---- the emulator itself ---------------------------------------------------------------------------

void ShuffleSum(float* out) {
  float v = float(threadIdx.x);
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

void SharedReverse(const int* in, int* out) {
  __shared__ int tile[64];
  tile[threadIdx.x] = in[blockIdx.x * 64 + threadIdx.x];
  __syncthreads();
  out[blockIdx.x * 64 + threadIdx.x] = tile[63 - threadIdx.x];
}

void EarlyReturnThenBarrier(int* out) {
  if (threadIdx.x >= 40) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

void ShuffleAfterLaneReturned(float* out) {
  if (threadIdx.x % 32 == 5) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

void HalfAWarpAtABarrier(float* out) {
  float v = 1.0f;
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  }
  out[threadIdx.x] = v;
}

TEST(CudaEmu, ShufflesBarriersAndBlocks) {
  std::vector<float> sums(3 * 64);
  emu::Launch(ShuffleSum, 3, 64)(sums.data());
  ASSERT_EQ(emu::TakeFailure(), "");
  for (int b = 0; b < 3; ++b)
    for (int t = 0; t < 64; ++t) {
      const int w = t / 32;  // lanes 32w .. 32w + 31
      EXPECT_EQ(sums[size_t(b * 64 + t)], float(32 * 32 * w + 31 * 32 / 2)) << b << " " << t;
    }
  std::vector<int> in(2 * 64), out(2 * 64);
  for (int i = 0; i < 128; ++i) in[size_t(i)] = i;
  for (bool reverse : {false, true}) {
    emu::SetOptions({reverse, false});
    emu::Launch(SharedReverse, 2, 64)(in.data(), out.data());
    ASSERT_EQ(emu::TakeFailure(), "");
    for (int i = 0; i < 128; ++i) EXPECT_EQ(out[size_t(i)], (i / 64) * 64 + 63 - i % 64);
  }
  emu::SetOptions({});
}

TEST(CudaEmu, ReportsWhatAGpuLeavesUndefined) {
  emu::SetOptions({false, false, /*report=*/false});  // the failures below are expected
  std::vector<int> out(64);
  std::vector<float> f(64);
  emu::Launch(EarlyReturnThenBarrier, 1, 64)(out.data());
  EXPECT_NE(emu::TakeFailure().find("returned before it"), std::string::npos);
  emu::Launch(ShuffleAfterLaneReturned, 1, 64)(f.data());
  EXPECT_NE(emu::TakeFailure().find("returned while its warp waits"), std::string::npos);
  emu::Launch(HalfAWarpAtABarrier, 1, 32)(f.data());
  EXPECT_NE(emu::TakeFailure().find("deadlock"), std::string::npos);
  // Launch configurations CUDA refuses, and the error cudaGetLastError then reports.
  emu::Launch(ShuffleSum, 1, 2048)(f.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_NE(emu::TakeFailure().find("invalid launch configuration"), std::string::npos);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  emu::Launch(ShuffleSum, 1, 64, 64 * 1024)(f.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_NE(emu::TakeFailure().find("dynamic shared memory"), std::string::npos);
  ASSERT_EQ(cudaFuncSetAttribute(ShuffleSum, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024),
            cudaSuccess);
  emu::Launch(ShuffleSum, 1, 64, 64 * 1024)(f.data());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(emu::TakeFailure(), "");
  emu::SetOptions({});
}

// ---- kernels against the CPU backend -------------------------------------------------------------

std::vector<float> Random(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

double MaxAbs(const std::vector<float>& v) {
  double m = 0.0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double abs_tol,
                 double rel_tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - double(want[i]));
    if (!(err <= worst)) worst = err;  // NaN included
    if (!(err <= abs_tol + rel_tol * std::fabs(want[i])) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs CPU " << want[i];
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size()
                    << " elements out of tolerance, largest error " << worst;
}

struct Schedule {
  const char* name;
  emu::Options options;
};
const Schedule kSchedules[] = {{"in_order", {false, false, true}},
                               {"reversed", {true, false, true}},
                               {"late_cp_async", {false, true, true}}};

class EmuKernelTest : public ::testing::TestWithParam<Schedule> {
 protected:
  void SetUp() override {
    emu::SetOptions(GetParam().options);
    emu::TakeFailure();
  }
  void TearDown() override {
    EXPECT_EQ(emu::TakeFailure(), "") << "the emulator's checks";
    emu::SetOptions({});
  }
  // A tensor of the CPU backend holding v (fp32, or rounded to bf16).
  Tensor T(const Shape& shape, DType dt, const std::vector<float>& v = {}) {
    Tensor t = *cpu.Alloc(shape, dt);
    if (!v.empty()) {
      EXPECT_TRUE(cpu.CopyFromHost(v.data(), t).ok());
    }
    return t;
  }
  std::vector<float> Host(const Tensor& t) {
    std::vector<float> v(size_t(t.numel()));
    EXPECT_TRUE(cpu.CopyToHost(t, v.data()).ok());
    return v;
  }
  template <typename X>
  static X* P(const Tensor& t) {
    return static_cast<X*>(t.data());
  }
  CpuBackend cpu;
};
INSTANTIATE_TEST_SUITE_P(Emu, EmuKernelTest, ::testing::ValuesIn(kSchedules),
                         [](const ::testing::TestParamInfo<Schedule>& i) { return std::string(i.param.name); });

// ---- flash attention ------------------------------------------------------------------------------

struct FlashCase {
  k::FlashVariant variant;
  TokenOrder order;
  int64_t b, s, nh, d;
};

std::string Describe(const FlashCase& c) {
  return std::string(c.variant == k::FlashVariant::kMma ? "mma" : "wmma") +
         (c.order == TokenOrder::kBatchFirst ? " batch-first" : " seq-first") + " b " +
         std::to_string(c.b) + " s " + std::to_string(c.s) + " nh " + std::to_string(c.nh) +
         " d " + std::to_string(c.d);
}

// The GPU test's shapes (cuda_backend_test.cc, AttentionCases) that the emulator runs in seconds:
// d 16 (padded to 64), 64 over three tiles, 96 and 80 (padded to 128), one token; both variants.
std::vector<FlashCase> FlashCases() {
  std::vector<FlashCase> cases;
  for (k::FlashVariant v : {k::FlashVariant::kWmma, k::FlashVariant::kMma}) {
    cases.push_back({v, TokenOrder::kSeqFirst, 2, 67, 3, 16});
    cases.push_back({v, TokenOrder::kBatchFirst, 1, 130, 1, 64});
    cases.push_back({v, TokenOrder::kSeqFirst, 1, 80, 1, 96});
    cases.push_back({v, TokenOrder::kBatchFirst, 2, 1, 2, 80});
  }
  return cases;
}

TEST_P(EmuKernelTest, FlashAttentionAgainstCpu) {
  for (const FlashCase& c : FlashCases()) {
    for (DType dt : {DType::kBF16, DType::kF32}) {
      const std::string what = Describe(c) + (dt == DType::kBF16 ? " bf16 rows" : " fp32 rows");
      const int64_t a = c.nh * c.d;
      const bool bf = c.order == TokenOrder::kBatchFirst;
      const Shape in = bf ? Shape{c.b, c.s, 3 * a} : Shape{c.s, c.b, 3 * a};
      const Shape os = bf ? Shape{c.b, c.s, a} : Shape{c.s, c.b, a};
      Tensor qkv = T(in, dt, Random(size_t(c.b * c.s * 3 * a), 98));
      Tensor out = T(os, dt), saved = T(cpu.AttentionSavedShape(c.b, c.s, c.nh, c.d), DType::kF32);
      cpu.AttentionForward(qkv, c.nh, c.order, out, saved);
      const k::HeadLayout lay{c.b, c.s, c.nh, c.d, 3, !bf};
      Tensor eout = T(os, dt), lse = T({c.b, c.nh, c.s}, DType::kF32);
      Tensor dout = T(os, dt, Random(size_t(c.b * c.s * a), 99));
      Tensor dqkv = T(in, dt), edqkv = T(in, dt), delta = T({c.b, c.nh, c.s}, DType::kF32);
      cudaError_t e;
      if (dt == DType::kBF16) {
        e = k::FlashAttentionForward(P<bf16>(qkv), lay, P<bf16>(eout), P<float>(lse), nullptr,
                                     c.variant);
      } else {
        e = k::FlashAttentionForward(P<float>(qkv), lay, P<float>(eout), P<float>(lse), nullptr,
                                     c.variant);
      }
      ASSERT_EQ(e, cudaSuccess) << what << ": " << emu::TakeFailure();
      ASSERT_EQ(emu::TakeFailure(), "") << what;
      // The GPU test's tolerance (cuda_backend_test.cc, ForwardAndBackwardAgainstCpu).
      ExpectClose(Host(eout), Host(out), 0.02, 0, what + " out");
      cpu.AttentionBackward(dout, qkv, out, saved, c.nh, c.order, dqkv);
      if (dt == DType::kBF16) {
        e = k::FlashAttentionBackward(P<bf16>(dout), P<bf16>(qkv), P<bf16>(eout), P<float>(lse),
                                      lay, P<float>(delta), P<bf16>(edqkv), nullptr, c.variant);
      } else {
        e = k::FlashAttentionBackward(P<float>(dout), P<float>(qkv), P<float>(eout),
                                      P<float>(lse), lay, P<float>(delta), P<float>(edqkv),
                                      nullptr, c.variant);
      }
      ASSERT_EQ(e, cudaSuccess) << what << ": " << emu::TakeFailure();
      ASSERT_EQ(emu::TakeFailure(), "") << what;
      const std::vector<float> want = Host(dqkv);
      ExpectClose(Host(edqkv), want, 5e-2 * MaxAbs(want), 0, what + " dqkv");
    }
  }
}

}  // namespace
}  // namespace ptdp::rt::cuda
