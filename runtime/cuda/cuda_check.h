// Check macros for every CUDA, cuBLAS and NCCL call (style.md habit 4; nccl-tests' CUDACHECK,
// llm.c's cudaCheck): a failed call becomes a Status whose message names the call, the library's
// own error text, and the file and line. Only runtime/cuda/ includes this header (it pulls in the
// CUDA headers); the rest of ptdp sees Status values.
//
//   PTDP_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));      // in a function returning Status/Result
//   Status s = PTDP_CUDA_STATUS(cublasSetStream(h, st));    // when the Status is wanted as a value
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "core/status.h"

namespace ptdp::rt::cuda {

// "cudaMalloc(&p, bytes) failed: out of memory (cudaErrorMemoryAllocation) at
// runtime/cuda/cuda_backend.cc:120". Ok() when `e` is success.
Status CheckCuda(cudaError_t e, const char* call, const char* file, int line);
Status CheckCublas(cublasStatus_t e, const char* call, const char* file, int line);
Status CheckNccl(ncclResult_t e, const char* call, const char* file, int line);

inline Status CheckAny(cudaError_t e, const char* c, const char* f, int l) { return CheckCuda(e, c, f, l); }
inline Status CheckAny(cublasStatus_t e, const char* c, const char* f, int l) { return CheckCublas(e, c, f, l); }
inline Status CheckAny(ncclResult_t e, const char* c, const char* f, int l) { return CheckNccl(e, c, f, l); }

}  // namespace ptdp::rt::cuda

#define PTDP_CUDA_STATUS(call) ::ptdp::rt::cuda::CheckAny((call), #call, __FILE__, __LINE__)

#define PTDP_CUDA_RETURN_IF_ERROR(call)                     \
  do {                                                      \
    ::ptdp::Status ptdp_cuda_s_ = PTDP_CUDA_STATUS(call);    \
    if (!ptdp_cuda_s_.ok()) return ptdp_cuda_s_;            \
  } while (0)
