// Helpers of the GPU communicator tests: whether a GPU is visible (cudaGetDeviceCount directly;
// ProbeCuda belongs to the backend), device tensors over cudaMalloc, and per-rank streams.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace ptdp::rt::cuda {

// Empty when at least one GPU is visible; otherwise why not (the CUDA runtime's words).
inline std::string NoGpuReason() {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    std::string why = cudaGetErrorString(e);
    (void)cudaGetLastError();
    return why;
  }
  return count > 0 ? "" : "cudaGetDeviceCount found 0 devices";
}

inline int VisibleGpus() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

#define PTDP_SKIP_WITHOUT_GPU()                                             \
  do {                                                                      \
    const std::string ptdp_why_ = ::ptdp::rt::cuda::NoGpuReason();          \
    if (!ptdp_why_.empty()) GTEST_SKIP() << "no CUDA GPU visible: " << ptdp_why_; \
  } while (0)

// A zeroed tensor in device memory of `device`.
inline Tensor DeviceTensor(int device, Shape shape, DType dtype = DType::kF32) {
  size_t bytes = std::max<size_t>(size_t(shape.numel()) * DTypeBytes(dtype), 1);
  void* p = nullptr;
  EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
  EXPECT_EQ(cudaMemset(p, 0, bytes), cudaSuccess);
  // cudaMemset runs on the legacy default stream, which the ranks' non-blocking streams do not
  // wait for: finish it before any of them writes the tensor.
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto buf = std::make_shared<Buffer>(p, bytes, [device](void* q, size_t) {
    cudaSetDevice(device);
    cudaFree(q);
  });
  return Tensor(buf, shape, dtype);
}

// Writes host bytes into t on `stream` without waiting: as a rank's kernel would, so that the
// communicator must publish before its peers read.
template <typename T>
void UploadAsync(const std::vector<T>& host, Tensor& t, cudaStream_t stream) {
  ASSERT_EQ(host.size() * sizeof(T), t.bytes());
  // From pageable memory the call returns once the bytes are staged: `host` may go after it.
  ASSERT_EQ(cudaMemcpyAsync(t.data(), host.data(), t.bytes(), cudaMemcpyHostToDevice, stream),
            cudaSuccess);
}

template <typename T>
std::vector<T> Download(const Tensor& t, cudaStream_t stream) {
  std::vector<T> host(size_t(t.numel()));
  EXPECT_EQ(cudaMemcpyAsync(host.data(), t.data(), t.bytes(), cudaMemcpyDeviceToHost, stream),
            cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  return host;
}

// One non-blocking stream per rank on `device`, destroyed with the object.
class Streams {
 public:
  Streams(int device, int n) : device_(device), s_(size_t(n), nullptr) {
    cudaSetDevice(device);
    for (auto& s : s_) EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  }
  // One stream per (rank, device) pair: rank r on devices[r].
  explicit Streams(const std::vector<int>& devices) : device_(-1), s_(devices.size(), nullptr) {
    for (size_t r = 0; r < devices.size(); ++r) {
      cudaSetDevice(devices[r]);
      EXPECT_EQ(cudaStreamCreateWithFlags(&s_[r], cudaStreamNonBlocking), cudaSuccess);
    }
    devices_ = devices;
  }
  ~Streams() {
    for (size_t r = 0; r < s_.size(); ++r) {
      cudaSetDevice(devices_.empty() ? device_ : devices_[r]);
      cudaStreamDestroy(s_[r]);
    }
  }
  cudaStream_t operator[](int r) const { return s_[size_t(r)]; }

 private:
  int device_;
  std::vector<int> devices_;
  std::vector<cudaStream_t> s_;
};

}  // namespace ptdp::rt::cuda
