// The CUDA Backend: one rank's ops on one GPU, in order on one stream. GEMMs by cuBLAS on tensor
// cores, every other op an own kernel (kernels.cuh), each with the CPU backend as its reference
// (style.md habit 10). Parallelism stays out of it, as in every Backend: the communicators
// (nccl_world.h, device_world.h) move data between ranks on the same stream.
//
// Precision. Tensors are fp32 in memory, as everywhere in the runtime (the model is written once
// against fp32 Tensors): master weights, gradients and AdamW state are fp32. The GEMMs run
//  - kBf16 (default): bf16 inputs on tensor cores with fp32 accumulation
//    (CUBLAS_COMPUTE_32F_FAST_16BF: cuBLAS rounds the fp32 operands to bf16 inside the GEMM);
//  - kFp32: exact fp32 (CUBLAS_COMPUTE_32F), for comparisons with the CPU backend.
// Activations are stored fp32, so memory and the bandwidth of the element-wise kernels are twice
// Megatron's bf16 activations; docs/runtime.md says so next to the measured figures.
//
// Threads. Ranks are threads (one per rank, possibly several ranks on one GPU). Every method
// first makes this backend's device current on the calling thread, so a rank's thread may be a
// different one at each step.
//
// Errors. Compute ops return nothing (backend.h): the first failed CUDA/cuBLAS call or kernel
// launch is recorded with file and line and returned by the next Synchronize(), CopyToHost() or
// CopyFromHost(); later ops are skipped until then.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/backend.h"

// Opaque CUDA handles, so that including this header needs no CUDA headers.
typedef struct CUstream_st* cudaStream_t;

namespace ptdp::rt::cuda {

enum class GemmPrecision { kBf16, kFp32 };
// The attention core of bf16 plans: the flash kernels (flash_attention.cuh; heads of d <= 128 on
// sm_80 and later) or the unfused cuBLAS path, which fp32 plans and larger heads always take.
// kFlash runs the WMMA flash kernels, kFlashMma the register-resident ones (FlashVariant::kMma:
// written without a GPU, opt-in until a GPU has timed both).
enum class AttentionKernel { kFlash, kFlashMma, kUnfused };

struct CudaBackendOptions {
  int device = 0;                             // CUDA device ordinal
  GemmPrecision gemm = GemmPrecision::kBf16;  // see the file comment
  AttentionKernel attention = AttentionKernel::kFlash;
  // MatmulBias/MatmulBiasGelu as cuBLASLt epilogues on bf16 tensors; false: the separate ops
  // (PTDP_CUDA_EPILOGUE=off, to measure the difference).
  bool epilogues = true;
  size_t capacity_bytes = 0;                  // Alloc fails past this many live bytes; 0: none
};

// What the machine has, for `ptdp info` and for tests deciding whether to skip.
struct CudaInfo {
  int gpus_visible = 0;           // cudaGetDeviceCount; 0 when no driver or no device
  std::string why_none;           // when 0: cudaGetDeviceCount's error text, e.g. "no CUDA-capable device"
  std::string device_name;        // of device 0, "" when none
  size_t device_memory_bytes = 0; // of device 0
  int runtime_version = 0;        // cudaRuntimeGetVersion, e.g. 13000
  int driver_version = 0;         // cudaDriverGetVersion; 0 when no driver
  int cublas_version = 0;         // cublasGetProperty major*10000 + minor*100 + patch
  int nccl_version = 0;           // ncclGetVersion, e.g. 22805
};
// Never fails: absent drivers or devices give gpus_visible = 0 and why_none.
CudaInfo ProbeCuda();

class CudaBackend final : public Backend {
 public:
  // Creates the stream, the cuBLAS handle and the workspace on options.device. Fails with a
  // message naming the device when it does not exist or cannot be used.
  static Result<std::unique_ptr<CudaBackend>> Create(const CudaBackendOptions& options);
  ~CudaBackend() override;

  const char* Name() const override { return "cuda"; }
  int device() const;
  // The stream every op of this backend runs on; the rank's communicators use it too.
  cudaStream_t stream() const;

  // --- everything of backend.h, implemented in cuda_backend.cc ---
  Result<Tensor> Alloc(const Shape& shape, DType dtype) override;
  Result<Tensor> AllocUninit(const Shape& shape, DType dtype) override;
  size_t CurrentBytes() const override;
  size_t PeakBytes() const override;
  void ResetPeak() override;
  Status Synchronize() override;
  int Mark() override;
  double MarkSeconds(int a, int b) override;
  void ClearMarks() override;

  Status CopyFromHost(const float* src, Tensor& dst) override;
  Status CopyFromHost(const int32_t* src, Tensor& dst) override;
  Status CopyToHost(const Tensor& src, float* dst) override;
  Status CopyToHost(const Tensor& src, int32_t* dst) override;

  void Matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
              float alpha = 1.0f, float beta = 0.0f) override;
  void MatmulBatched(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
                     float alpha = 1.0f, float beta = 0.0f) override;
  // bf16: one cuBLASLt GEMM with the bias (and GeLU) epilogue, or GeLU's gradient (DGELU), each
  // output rounded once, as the CPU backend computes; fp32, or a shape cuBLASLt declines: Matmul,
  // AddBias (and GeluForward), or Matmul and GeluBackward.
  void MatmulBias(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                  const Tensor& bias, Tensor& c) override;
  void MatmulGeluBackward(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                          const Tensor& pre, Tensor& dx) override;
  void MatmulBiasGelu(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                      const Tensor& bias, Tensor& pre, Tensor& act) override;
  void AddBias(Tensor& y, const Tensor& bias) override;
  void AddBiasResidual(Tensor& x, const Tensor& bias, const Tensor& residual) override;
  void AddBiasResidualLayerNorm(Tensor& x, const Tensor& bias, const Tensor& residual,
                                const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                Tensor& mean, Tensor& rstd) override;
  void BiasGrad(const Tensor& dy, Tensor& dbias) override;
  void LayerNormForward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                        Tensor& y, Tensor& mean, Tensor& rstd) override;
  void LayerNormBackward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                         const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) override;
  void GeluForward(const Tensor& x, Tensor& y) override;
  void GeluBackward(const Tensor& dy, const Tensor& x, Tensor& dx) override;
  Shape AttentionSavedShape(int64_t b, int64_t s, int64_t nh, int64_t d) const override;
  bool FusesGemmEpilogues(DType act) const override;
  // Whether the attention core of heads of dimension d runs the flash kernels (AttentionKernel).
  bool UsesFlashAttention(int64_t d) const;
  void AttentionForward(const Tensor& qkv, int64_t nh, TokenOrder order, Tensor& out,
                        Tensor& saved) override;
  void AttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                         const Tensor& saved, int64_t nh, TokenOrder order, Tensor& dqkv) override;
  void AttentionBlockForward(const Tensor& qkv, const SeqBlock& qpos, const Tensor& kv,
                             const SeqBlock& kpos, int64_t nh, bool first, Tensor& out,
                             Tensor& lse) override;
  void AttentionBlockBackward(const Tensor& dout, const Tensor& qkv, const SeqBlock& qpos,
                              const Tensor& kv, const SeqBlock& kpos, const Tensor& out,
                              const Tensor& lse, int64_t nh, Tensor& dqkv, Tensor& dkv) override;
  void CopyColumns(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col,
                   int64_t ncols) override;
  void ScaleRows(const Tensor& x, const Tensor& scale, Tensor& out) override;
  void RowDot(const Tensor& a, const Tensor& b, Tensor& out) override;
  void EmbeddingForward(const Tensor& tokens, const Tensor& table, int64_t vocab_start,
                        Tensor& out) override;
  void EmbeddingBackward(const Tensor& dout, const Tensor& tokens, int64_t vocab_start,
                         Tensor& dtable) override;
  void CrossEntropyMax(const Tensor& logits, Tensor& row_max) override;
  void CrossEntropySumExp(const Tensor& logits, const Tensor& row_max, Tensor& sum_exp) override;
  void CrossEntropyTarget(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                          Tensor& target_logit) override;
  void CrossEntropyLoss(const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
                        Tensor& loss) override;
  void CrossEntropyBackward(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                            const Tensor& row_max, const Tensor& sum_exp, float scale,
                            Tensor& dlogits) override;
  void Add(const Tensor& a, const Tensor& b, Tensor& out) override;
  void Axpy(float alpha, const Tensor& x, Tensor& y) override;
  void Scale(float alpha, Tensor& x) override;
  void Fill(float value, Tensor& x) override;
  void Copy(const Tensor& src, Tensor& dst) override;
  void SumSquares(const Tensor& x, Tensor& out) override;
  void Sum(const Tensor& x, Tensor& out) override;
  void AdamW(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
             const AdamWConfig& cfg) override;

 private:
  struct Impl;
  explicit CudaBackend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ptdp::rt::cuda
