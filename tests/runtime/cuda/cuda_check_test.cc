// The check macros turn a failed CUDA/cuBLAS/NCCL call into a Status naming the call, the
// library's error text, the file and the line. Needs no GPU: the error texts are host-side.
#include "runtime/cuda/cuda_check.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ptdp::rt::cuda {
namespace {

using ::testing::HasSubstr;

Status ReturnsEarly(bool* reached_end) {
  PTDP_CUDA_RETURN_IF_ERROR(cudaErrorMemoryAllocation);
  *reached_end = true;
  return Status::Ok();
}

TEST(CudaCheck, SuccessIsOk) {
  EXPECT_TRUE(PTDP_CUDA_STATUS(cudaSuccess).ok());
  EXPECT_TRUE(PTDP_CUDA_STATUS(CUBLAS_STATUS_SUCCESS).ok());
  EXPECT_TRUE(PTDP_CUDA_STATUS(ncclSuccess).ok());
}

TEST(CudaCheck, CudaErrorNamesCallTextFileAndLine) {
  bool reached_end = false;
  Status s = ReturnsEarly(&reached_end);
  ASSERT_FALSE(s.ok());
  EXPECT_FALSE(reached_end);
  EXPECT_THAT(s.message(), HasSubstr("cudaErrorMemoryAllocation failed: "));
  EXPECT_THAT(s.message(), HasSubstr("(cudaErrorMemoryAllocation)"));
  EXPECT_THAT(s.message(), HasSubstr("cuda_check_test.cc:"));
}

TEST(CudaCheck, CublasAndNcclErrorsNameTheirCodes) {
  Status b = PTDP_CUDA_STATUS(CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_THAT(b.message(), HasSubstr("cublas status 1"));
  Status n = PTDP_CUDA_STATUS(ncclInvalidArgument);
  EXPECT_THAT(n.message(), HasSubstr("nccl result 4"));
  EXPECT_THAT(n.message(), HasSubstr("cuda_check_test.cc:"));
}

}  // namespace
}  // namespace ptdp::rt::cuda
