// The ordered reduction kernel of DeviceWorld (see device_reduce.h). One thread per element
// (grid-stride), each walking the inputs in group-rank order, so the order of the terms, and so
// the rounding, is the host plane's.
#include "runtime/cuda/device_reduce.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "runtime/cuda/cuda_check.h"

namespace ptdp::rt::cuda {
namespace {

struct ReduceArgs {
  const void* in[kMaxReduceInputs];  // device pointers, group-rank order
  int n = 0;                         // inputs used, 1..kMaxReduceInputs
  void* dst = nullptr;
  int64_t count = 0;
};

__device__ inline float Load(const float* p, int64_t e) { return p[e]; }
__device__ inline float Load(const __nv_bfloat16* p, int64_t e) { return __bfloat162float(p[e]); }
__device__ inline void Store(float* p, int64_t e, float v) { p[e] = v; }
__device__ inline void Store(__nv_bfloat16* p, int64_t e, float v) { p[e] = __float2bfloat16_rn(v); }

// acc op x, with max propagating NaN from either side (acc is NaN already, or x is).
template <bool kMax>
__device__ inline float Combine(float acc, float x) {
  if (!kMax) return acc + x;
  return (x > acc || isnan(x)) ? x : acc;
}

template <typename T, bool kMax>
__global__ void ReduceKernel(ReduceArgs a) {
  const int64_t stride = int64_t(blockDim.x) * gridDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < a.count; e += stride) {
    float acc = Load(static_cast<const T*>(a.in[0]), e);
    for (int r = 1; r < a.n; ++r) acc = Combine<kMax>(acc, Load(static_cast<const T*>(a.in[r]), e));
    Store(static_cast<T*>(a.dst), e, acc);
  }
}

template <typename T>
void Launch(const ReduceArgs& a, ReduceOp op, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((a.count + kThreads - 1) / kThreads, 65535);
  if (op == ReduceOp::kMax)
    ReduceKernel<T, true><<<unsigned(blocks), kThreads, 0, stream>>>(a);
  else
    ReduceKernel<T, false><<<unsigned(blocks), kThreads, 0, stream>>>(a);
}

}  // namespace

Status LaunchReduce(void* dst, const std::vector<const void*>& in, int64_t count, DType dtype,
                    ReduceOp op, cudaStream_t stream) {
  if (count <= 0 || in.empty()) return Status::Ok();
  if (dtype != DType::kF32 && dtype != DType::kBF16)
    return Status::Error(std::string("device reduce: dtype ") + ToString(dtype) +
                        " is not supported (f32, bf16)");
  // Stage 1 reduces in[0 .. k) into dst; each later stage reduces [dst, next inputs) into dst
  // (a thread reads dst[e] before writing it), which keeps the order ((x0 op x1) op x2) ...
  size_t next = 0;
  bool first = true;
  while (next < in.size()) {
    ReduceArgs a;
    a.dst = dst;
    a.count = count;
    if (!first) a.in[a.n++] = dst;
    while (a.n < kMaxReduceInputs && next < in.size()) a.in[a.n++] = in[next++];
    if (dtype == DType::kF32)
      Launch<float>(a, op, stream);
    else
      Launch<__nv_bfloat16>(a, op, stream);
    PTDP_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    first = false;
  }
  return Status::Ok();
}

}  // namespace ptdp::rt::cuda
