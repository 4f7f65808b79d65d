// The messages behind PTDP_CUDA_STATUS (cuda_check.h).
#include "runtime/cuda/cuda_check.h"

#include <string>

namespace ptdp::rt::cuda {
namespace {

Status Failed(const char* call, const std::string& why, const char* file, int line) {
  return Status::Error(std::string(call) + " failed: " + why + " at " + file + ":" +
                       std::to_string(line));
}

}  // namespace

Status CheckCuda(cudaError_t e, const char* call, const char* file, int line) {
  if (e == cudaSuccess) return Status::Ok();
  return Failed(call, std::string(cudaGetErrorString(e)) + " (" + cudaGetErrorName(e) + ")", file,
                line);
}

Status CheckCublas(cublasStatus_t e, const char* call, const char* file, int line) {
  if (e == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Failed(call, std::string(cublasGetStatusString(e)) + " (cublas status " +
                          std::to_string(int(e)) + ")",
                file, line);
}

Status CheckNccl(ncclResult_t e, const char* call, const char* file, int line) {
  if (e == ncclSuccess) return Status::Ok();
  std::string why = ncclGetErrorString(e);
  // NCCL keeps the detail of the last failure (e.g. which peer) apart from the code's text.
  if (const char* last = ncclGetLastError(nullptr); last && *last) why += ": " + std::string(last);
  return Failed(call, why + " (nccl result " + std::to_string(int(e)) + ")", file, line);
}

}  // namespace ptdp::rt::cuda
