// The CPU Backend: fp32 on host memory; the hot kernels (GEMM, GeLU, AdamW) from
// runtime/cpu/cpu_kernels.h, vectorised per x86-64 level and chosen at run time, the rest plain
// loops (llm.c style). The reference every other backend is checked against.
// bf16 tensors (backend.h's dtype rules) are stored as bf16; an op given one runs its fp32
// kernel on widened copies of its bf16 tensors and rounds what it writes back into them, which
// is the rule every backend follows (compute in fp32, round to nearest even on a bf16 store).
// The widened copies are scratch, not counted in CurrentBytes(): the tracked bytes are what a
// GPU computing on bf16 directly would hold.
//
// One CpuBackend per rank; ranks are threads, so each op runs on its caller's thread and uses no
// threads of its own: results are bit-identical run to run (for one kernel level). The memory
// counters are atomic and outlive the backend (a tensor may be freed after it).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <map>
#include <vector>

#include "runtime/backend.h"
#include "runtime/cpu/cpu_kernels.h"

namespace ptdp::rt {

struct CpuBackendOptions {
  // Alloc fails once CurrentBytes() would pass this many bytes (a GPU's memory, to rehearse
  // "does not fit" on a CPU); 0 means no limit but the host's.
  size_t capacity_bytes = 0;
  // Freed blocks kept for reuse, up to this many bytes in all (a caching allocator, as
  // PyTorch's on GPUs): a training step allocates the same shapes every micro-batch, and handing
  // them back to malloc made it return pages to the kernel and fault them in again (tp 2 on
  // gpt-tiny: 2.5x the page faults of dp 2, compute 15% over its ops' time). An Alloc takes the
  // smallest cached block of its rounded size up to twice it (kMaxReuseWaste): MoE with ep > 1
  // receives a different number of rows every step, and a block per exact size class faulted
  // in fresh pages for each new count (ep 2 on gpt-tiny-moe: ~200 page faults a step, steps
  // twice as long while the routing moved). 0: every block goes back to malloc at once, the
  // default under AddressSanitizer, so that it sees every use of a freed tensor.
  size_t cache_bytes = kDefaultCacheBytes;
  // The kernels to run (KernelsFor(level) of a level this CPU supports); nullptr: the process's
  // choice, ChosenCpuKernels() (the best level this CPU runs, or PTDP_CPU_KERNELS).
  const CpuKernels* kernels = nullptr;
  // Called with (m, n, k) of every Matmul (the GEMMs; not MatmulBatched, the attention core),
  // on the calling rank's thread: instrumentation, e.g. checking that the runtime executes the
  // GEMMs core/layer_ops.h describes (tests/runtime/layer_ops_runtime_test.cc). Empty: nothing.
  std::function<void(int64_t m, int64_t n, int64_t k)> on_matmul;
  // AllocUninit fills a float tensor with NaN (an i32 one with 0x7fc00000) instead of leaving
  // it as found: the tests turn this on so that any read of an output before it is written
  // reaches a loss or a parameter as NaN.
  bool poison_uninit = false;

#if defined(__SANITIZE_ADDRESS__)
  static constexpr size_t kDefaultCacheBytes = 0;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  static constexpr size_t kDefaultCacheBytes = 0;
#else
  static constexpr size_t kDefaultCacheBytes = size_t(256) << 20;
#endif
#else
  static constexpr size_t kDefaultCacheBytes = size_t(256) << 20;
#endif
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(CpuBackendOptions options = {});

  const char* Name() const override { return "cpu"; }
  // The kernel level this backend runs.
  const CpuKernels& kernels() const { return *kernels_; }

  Result<Tensor> Alloc(const Shape& shape, DType dtype) override {
    return Allocate(shape, dtype, /*zero=*/true);
  }
  Result<Tensor> AllocUninit(const Shape& shape, DType dtype) override {
    return Allocate(shape, dtype, /*zero=*/false);
  }
  size_t CurrentBytes() const override;
  size_t PeakBytes() const override;
  void ResetPeak() override;
  Status Synchronize() override { return Status::Ok(); }
  int Mark() override {
    marks_.push_back(std::chrono::steady_clock::now());
    return int(marks_.size()) - 1;
  }
  double MarkSeconds(int a, int b) override {
    return std::chrono::duration<double>(marks_.at(size_t(b)) - marks_.at(size_t(a))).count();
  }
  void ClearMarks() override { marks_.clear(); }

  Status CopyFromHost(const float* src, Tensor& dst) override;
  Status CopyFromHost(const int32_t* src, Tensor& dst) override;
  Status CopyToHost(const Tensor& src, float* dst) override;
  Status CopyToHost(const Tensor& src, int32_t* dst) override;

  void Matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
              float alpha = 1.0f, float beta = 0.0f) override;
  void MatmulBatched(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
                     float alpha = 1.0f, float beta = 0.0f) override;

  // The fused results (backend.h): on bf16 tensors the fp32 ops on widened copies, each output
  // rounded once.
  void MatmulBias(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                  const Tensor& bias, Tensor& c) override;
  void MatmulBiasGelu(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                      const Tensor& bias, Tensor& pre, Tensor& act) override;
  void MatmulGeluBackward(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                          const Tensor& pre, Tensor& dx) override;
  void AddBias(Tensor& y, const Tensor& bias) override;
  // backend.h's fused result: on bf16 tensors the fp32 sum on widened copies, rounded once (then
  // the base class's LayerNorm of x as stored, in AddBiasResidualLayerNorm).
  void AddBiasResidual(Tensor& x, const Tensor& bias, const Tensor& residual) override;
  void BiasGrad(const Tensor& dy, Tensor& dbias) override;

  void LayerNormForward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                        Tensor& y, Tensor& mean, Tensor& rstd) override;
  void LayerNormBackward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                         const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) override;

  void GeluForward(const Tensor& x, Tensor& y) override;
  void GeluBackward(const Tensor& dy, const Tensor& x, Tensor& dx) override;

  // Saves the softmax probabilities P (b, nh, s, s), zero above the diagonal.
  Shape AttentionSavedShape(int64_t b, int64_t s, int64_t nh, int64_t d) const override;
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
  void ScaleRows(const Tensor& x, const Tensor& scale, Tensor& out) override;
  void RowDot(const Tensor& a, const Tensor& b, Tensor& out) override;
  void Copy(const Tensor& src, Tensor& dst) override;
  void SumSquares(const Tensor& x, Tensor& out) override;
  void Sum(const Tensor& x, Tensor& out) override;

  void AdamW(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
             const AdamWConfig& cfg) override;

 private:
  std::vector<std::chrono::steady_clock::time_point> marks_;  // Mark()
  // Shared with every tensor's release, so that tensors may outlive the backend.
  struct Counters {
    std::atomic<size_t> current{0};
    std::atomic<size_t> peak{0};
    std::mutex mu;  // guards the cache
    std::map<size_t, std::vector<void*>> cache;  // freed blocks by their size
    size_t cached = 0;                                      // bytes in `cache`
    void FreeCache();  // holding mu
    ~Counters();
  };
  // Alloc (zero) and AllocUninit (!zero).
  Result<Tensor> Allocate(const Shape& shape, DType dtype, bool zero);
  // Runs kernels_->gemm with the packing workspace in pack_.
  void Gemm(const GemmArgs& g);
  // When any of `args` is a bf16 tensor: calls op with each bf16 tensor replaced by an fp32
  // copy (Widen), then rounds the op's non-const Tensor& arguments back into their bf16 tensors,
  // and returns true. Otherwise does nothing and returns false (op runs as it is).
  template <typename... P, typename... A>
  bool Widened(void (CpuBackend::*op)(P...), A&&... args);
  // t itself when it is not bf16; else an fp32 copy of it in wide_ (valid until the next
  // Widened call).
  Tensor Widen(const Tensor& t);
  template <typename T>
  friend struct WideArg;

  CpuBackendOptions options_;
  const CpuKernels* kernels_;
  std::shared_ptr<Counters> counters_;
  std::vector<float> scratch_;  // (s, s): dP in the attention backward
  std::vector<float> block_;    // the CP attention blocks' scores, block output and row sums
  std::vector<float> pack_;     // the GEMM's packed panels (64-byte aligned inside)
  std::vector<std::vector<float>> wide_;  // Widen's copies, one per bf16 argument of a call
  size_t wide_used_ = 0;                  // of wide_ in the current Widened call
};

}  // namespace ptdp::rt
