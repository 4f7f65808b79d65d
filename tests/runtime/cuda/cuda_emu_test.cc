// The CUDA emulator itself (runtime/cuda/emu/cuda_emu.h): warp shuffles, barriers and shared
// memory in both schedules, and the failures it reports where CUDA leaves the behaviour undefined
// or refuses a launch. The backend's kernels run on it in the GPU tests' emulated twins
// (cuda_backend_emu_test and the others, in each schedule: tests/runtime/cuda/CMakeLists.txt).
#include "runtime/cuda/emu/cuda_emu.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ptdp::rt::cuda {
namespace {

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

}  // namespace
}  // namespace ptdp::rt::cuda
