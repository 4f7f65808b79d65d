// The CUDA Backend: memory from the device's stream-ordered pool, GEMMs by cuBLAS, the other ops
// by the kernels of kernels.cu, everything in order on one stream. Letters as in
// runtime/backend.h; L = b*nh, X = L*s*d (one of q, k, v unpacked per head).
#include "runtime/cuda/cuda_backend.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <cassert>
#include <climits>
#include <cstdio>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "runtime/bf16.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/flash_attention.cuh"
#include "runtime/cuda/kernels.cuh"
#include "runtime/cuda/op_profile.h"

namespace ptdp::rt::cuda {
namespace {

// cuBLAS's recommended workspace on Hopper (cuBLAS docs, cublasSetWorkspace: 32 MiB on sm_90,
// 4 MiB elsewhere); one size for all is simpler and costs little. Not counted in CurrentBytes().
constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;

// The tensor read as 2-D (N, C): C the last dimension, N the product of the others.

// (b, s) of a rank-3 activation in `order`.
void BatchSeq(const Tensor& t, TokenOrder order, int64_t* b, int64_t* s) {
  assert(t.shape().rank() == 3);
  *b = order == TokenOrder::kBatchFirst ? t.shape()[0] : t.shape()[1];
  *s = order == TokenOrder::kBatchFirst ? t.shape()[1] : t.shape()[0];
}

std::string Label(int device) { return "CUDA device " + std::to_string(device); }

// "no CUDA-capable device is detected (cudaErrorNoDevice)"
std::string ErrorText(cudaError_t e) {
  return std::string(cudaGetErrorString(e)) + " (" + cudaGetErrorName(e) + ")";
}

// What the buffers' release functions need: shared with them, so that a tensor may outlive the
// backend (its memory is then freed synchronously).
struct SharedState {
  int device = 0;
  std::atomic<size_t> current{0};  // bytes of live tensors and scratch
  std::atomic<size_t> peak{0};
  std::atomic<bool> failed{false};  // first_error holds a failure not yet returned
  std::mutex mu;                    // guards stream and first_error
  cudaStream_t stream = nullptr;    // null once the backend is gone
  Status first_error;

  void RecordLocked(const Status& s) {
    if (s.ok() || failed.load()) return;
    first_error = s;
    failed.store(true);
  }
  void Record(const Status& s) {
    if (s.ok()) return;
    std::lock_guard<std::mutex> lock(mu);
    RecordLocked(s);
  }
  // The failure recorded since the last call (Ok when none), forgotten.
  Status Take() {
    if (!failed.load()) return Status::Ok();
    std::lock_guard<std::mutex> lock(mu);
    Status s = std::move(first_error);
    first_error = Status::Ok();
    failed.store(false);
    return s;
  }
  void Release(void* p, size_t bytes) {
    current.fetch_sub(bytes);
    if (p == nullptr) return;
    std::lock_guard<std::mutex> lock(mu);
    int previous = -1;
    const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device;
    if (switched) (void)cudaSetDevice(device);
    if (stream != nullptr) {
      RecordLocked(PTDP_CUDA_STATUS(cudaFreeAsync(p, stream)));  // ordered after its last use
    } else {
      (void)cudaFree(p);  // the backend synchronized its stream before it went
    }
    if (switched) (void)cudaSetDevice(previous);
  }
};

// One operand of a (batched) GEMM as stored: row-major (rows, cols), matrices `stride` apart,
// fp32 or bf16.
struct Operand {
  const void* data;
  int64_t rows, cols;
  bool trans;
  int64_t stride;
  DType dtype = DType::kF32;
};
// The fp32 scratch operands of the unfused attention.
Operand F32Operand(const float* data, int64_t rows, int64_t cols, bool trans, int64_t stride) {
  return Operand{data, rows, cols, trans, stride, DType::kF32};
}
Operand TensorOperand(const Tensor& t, int64_t rows, int64_t cols, bool trans, int64_t stride) {
  assert(t.dtype() == DType::kF32 || t.dtype() == DType::kBF16);
  return Operand{t.data(), rows, cols, trans, stride, t.dtype()};
}

cudaDataType_t CudaType(DType d) { return d == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F; }

// Calls f with a value of the storage type of float dtype d (float or bf16): the kernels'
// template argument for a tensor of that dtype (backend.h's dtype rules).
template <typename F>
cudaError_t ByType(DType d, F&& f) {
  assert(d == DType::kF32 || d == DType::kBF16);
  return d == DType::kBF16 ? f(kernels::bf16{}) : f(float{});
}
// A tensor's data as its storage type T (asserted: our invariant).
template <typename T>
constexpr DType DTypeOf() {
  return std::is_same_v<T, float> ? DType::kF32 : DType::kBF16;
}
template <typename T>
const T* In(const Tensor& t) {
  assert(t.defined() && t.dtype() == DTypeOf<T>());
  return t.data_as<const T>();
}
template <typename T>
T* Out(Tensor& t) {
  assert(t.defined() && t.dtype() == DTypeOf<T>());
  return t.data_as<T>();
}

}  // namespace

struct CudaBackend::Impl {
  CudaBackendOptions options;
  std::string name;  // "CUDA device 0 (NVIDIA H100 80GB HBM3)"
  std::shared_ptr<SharedState> shared = std::make_shared<SharedState>();
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t lt = nullptr;  // the epilogue GEMMs (MatmulBias, MatmulBiasGelu, ...Backward)
  // cuBLASLt's choice per epilogue GEMM shape (m, p, k, trans_a, trans_b, the epilogue, the
  // pointers' alignment); nullopt: it has none (the op falls back to the unfused calls).
  std::map<std::tuple<int64_t, int64_t, int64_t, bool, bool, int, uint32_t>,
           std::optional<cublasLtMatmulAlgo_t>>
      lt_algos;
  std::vector<cudaEvent_t> events;  // Mark(): created once, reused after ClearMarks
  size_t marks = 0;                 // events[0, marks) recorded since ClearMarks
  void* workspace = nullptr;
  int cc_major = 0;            // compute capability
  int64_t smem_optin = 0;      // cudaDevAttrMaxSharedMemoryPerBlockOptin

  explicit Impl(const CudaBackendOptions& o) : options(o), name(Label(o.device)) {
    shared->device = o.device;
  }
  ~Impl();
  Status Init();

  // PTDP_CUDA_PROFILE=1: device time per op (op_profile.h), printed when the backend goes.
  std::unique_ptr<OpProfile> profile;

  // An op in progress (Begin's result): false when the op must be skipped; ends the op's
  // profile record when it goes (at the end of the op's function).
  class Op {
   public:
    Op(Impl* im, bool ok) : im_(im), ok_(ok) {}
    Op(const Op&) = delete;
    Op& operator=(const Op&) = delete;
    ~Op() {
      if (im_ != nullptr && im_->profile) im_->profile->End(im_->stream);
    }
    explicit operator bool() const { return ok_; }

   private:
    Impl* im_;
    bool ok_;
  };
  // Called first by every compute op (`name`: its name, for the profile; nullptr for none):
  // makes the device current and clears a stale error of an earlier call (already returned by
  // that call) so that it is not blamed on this op's launches. False when a failure is pending:
  // the op is then skipped.
  Op Begin(const char* name) {
    if (shared->failed.load()) return Op(nullptr, false);
    Status s = PTDP_CUDA_STATUS(cudaSetDevice(options.device));
    if (!s.ok()) {
      (void)cudaGetLastError();
      shared->Record(s);
      return Op(nullptr, false);
    }
    (void)cudaGetLastError();
    if (!profile || name == nullptr) return Op(nullptr, true);
    profile->Begin(name, stream);
    return Op(this, true);
  }
  // The running op's shape and floating-point operations, for the profile.
  void Annotate(int64_t m, int64_t p, int64_t k, int64_t batch) {
    if (!profile) return;
    std::string shape = std::to_string(m) + "x" + std::to_string(p) + "x" + std::to_string(k);
    if (batch != 1) shape = std::to_string(batch) + " x " + shape;
    profile->Annotate(shape, 2.0 * double(m) * double(p) * double(k) * double(batch));
  }
  // The causal attention core's useful FLOPs (no recomputation): 2 b nh s^2 d forward (two
  // products, half of each score matrix), twice that backward.
  void AnnotateAttention(int64_t b, int64_t s, int64_t nh, int64_t d, bool backward, bool flash) {
    if (!profile) return;
    const std::string shape = std::string(flash ? "flash" : "unfused") + " b" + std::to_string(b) +
                              " s" + std::to_string(s) + " nh" + std::to_string(nh) + " d" +
                              std::to_string(d);
    const double fwd = 2.0 * double(b) * double(nh) * double(s) * double(s) * double(d);
    profile->Annotate(shape, backward ? 2.0 * fwd : fwd);
  }
  // Records a failure (the next Synchronize returns it); true when s is OK.
  bool Check(const Status& s) {
    if (!s.ok()) shared->Record(s);
    return s.ok();
  }
  Result<Tensor> Alloc(const Shape& shape, DType dtype, bool zero);
  // Scratch of an op (not zeroed; counted like tensors); a failure is recorded.
  Result<Tensor> Scratch(const char* op, const Shape& shape) {
    Result<Tensor> t = Alloc(shape, DType::kF32, /*zero=*/false);
    if (!t.ok()) shared->Record(t.status().Prefixed(std::string(op) + " scratch"));
    return t;
  }
  // c (batch of (m, p), stride_c apart, of dtype c_dtype) = alpha * op(a) @ op(b) + beta * c.
  // a and b of one dtype: fp32 in options.gemm's precision, bf16 on tensor cores with fp32
  // accumulation; c fp32 or a's dtype.
  void Gemm(const char* op, const Operand& a, const Operand& b, void* c, DType c_dtype,
            int64_t m, int64_t p, int64_t k, float alpha, float beta, int64_t batch,
            int64_t stride_c);
  // One cuBLASLt call on bf16 operands, row-major outputs (m, p), fp32 accumulation, the
  // epilogue on the fp32 product, each output rounded once:
  //   kBias:     d = op(a) op(b) + bias;
  //   kBiasGelu: aux = op(a) op(b) + bias (the pre-activation, written), d = gelu of that sum;
  //   kDGelu:    d = gelu'(aux) * op(a) op(b) (aux, the pre-activation, read).
  // False (nothing enqueued) for a tensor that is not bf16, with the epilogues off, or where
  // cuBLASLt has no algorithm for it; a failure is recorded.
  enum class Epilogue { kBias, kBiasGelu, kDGelu };
  bool EpilogueGemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Epilogue e,
                    const Tensor* bias, const Tensor* aux, Tensor& d);
  // out[0] += sum(x) or sum(x^2), deterministic (kernels::SumPartials, SumFinalize).
  void Reduce(const char* op, const Tensor& x, bool squares, Tensor& out);
  // A host <-> device copy, waited for. A pending failure is returned first (and the copy
  // skipped).
  Status Transfer(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
};

// ---- creation -------------------------------------------------------------------------------

CudaInfo ProbeCuda() {
  CudaInfo info;
  if (cudaRuntimeGetVersion(&info.runtime_version) != cudaSuccess) info.runtime_version = 0;
  if (cudaDriverGetVersion(&info.driver_version) != cudaSuccess) info.driver_version = 0;
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS)
    info.cublas_version = major * 10000 + minor * 100 + patch;
  if (ncclGetVersion(&info.nccl_version) != ncclSuccess) info.nccl_version = 0;
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    info.why_none = ErrorText(e);
    count = 0;
  } else if (count == 0) {
    info.why_none = "cudaGetDeviceCount found no devices";
  }
  info.gpus_visible = count;
  cudaDeviceProp prop{};
  if (count > 0 && cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    info.device_name = prop.name;
    info.device_memory_bytes = prop.totalGlobalMem;
  }
  (void)cudaGetLastError();  // the probe's failures are in `info`, not pending for others
  return info;
}

Status CudaBackend::Impl::Init() {
  const int dev = options.device;
  PTDP_CUDA_RETURN_IF_ERROR(cudaSetDevice(dev));
  cudaDeviceProp prop{};
  PTDP_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, dev));
  name = Label(dev) + " (" + prop.name + ")";
  cc_major = prop.major;
  smem_optin = int64_t(prop.sharedMemPerBlockOptin);
  int pools = 0;
  PTDP_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, dev));
  if (pools == 0)
    return Status::Error(std::string(prop.name) +
                         " has no stream-ordered allocator (cudaDevAttrMemoryPoolsSupported 0)");
  PTDP_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Keep freed memory in the pool (the default threshold 0 returns it to the driver at every
  // synchronization): per-micro-batch allocations then cost no driver calls.
  cudaMemPool_t pool = nullptr;
  PTDP_CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool, dev));
  uint64_t threshold = UINT64_MAX;
  PTDP_CUDA_RETURN_IF_ERROR(
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  PTDP_CUDA_RETURN_IF_ERROR(cublasCreate(&cublas));
  // cublasSetStream resets the workspace to cuBLAS's own pool: set the stream first.
  PTDP_CUDA_RETURN_IF_ERROR(cublasSetStream(cublas, stream));
  PTDP_CUDA_RETURN_IF_ERROR(cudaMalloc(&workspace, kCublasWorkspaceBytes));
  PTDP_CUDA_RETURN_IF_ERROR(cublasSetWorkspace(cublas, workspace, kCublasWorkspaceBytes));
  PTDP_CUDA_RETURN_IF_ERROR(cublasLtCreate(&lt));
  if (OpProfile::Requested()) profile = std::make_unique<OpProfile>();
  std::lock_guard<std::mutex> lock(shared->mu);
  shared->stream = stream;
  return Status::Ok();
}

CudaBackend::Impl::~Impl() {
  if (stream != nullptr) {
    (void)cudaSetDevice(options.device);
    (void)cudaStreamSynchronize(stream);
  }
  if (profile) {
    (void)profile->Resolve();
    const std::string table = profile->Table(name);
    if (!table.empty()) std::fprintf(stderr, "%s", table.c_str());
    profile.reset();
  }
  {
    std::lock_guard<std::mutex> lock(shared->mu);
    shared->stream = nullptr;  // tensors released from now on are freed synchronously
  }
  if (cublas != nullptr) (void)cublasDestroy(cublas);
  if (lt != nullptr) (void)cublasLtDestroy(lt);
  for (cudaEvent_t e : events) (void)cudaEventDestroy(e);
  if (workspace != nullptr) (void)cudaFree(workspace);
  if (stream != nullptr) (void)cudaStreamDestroy(stream);
  (void)cudaGetLastError();
}

Result<std::unique_ptr<CudaBackend>> CudaBackend::Create(const CudaBackendOptions& options) {
  const std::string label = Label(options.device);
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return Status::Error(label + ": " + ErrorText(e) +
                         "; `ptdp info` lists the GPUs this machine has");
  }
  if (options.device < 0 || options.device >= count)
    return Status::Error(label + ": no such device, this machine has " + std::to_string(count) +
                         " GPU(s) (devices 0.." + std::to_string(count - 1) +
                         "); `ptdp info` lists them");
  auto impl = std::make_unique<Impl>(options);
  Status s = impl->Init();
  if (!s.ok()) {
    (void)cudaGetLastError();
    return s.Prefixed(label);
  }
  return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(impl)));
}

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaBackend::~CudaBackend() = default;

int CudaBackend::device() const { return impl_->options.device; }
cudaStream_t CudaBackend::stream() const { return impl_->stream; }

// ---- memory -----------------------------------------------------------------------------------

Result<Tensor> CudaBackend::Impl::Alloc(const Shape& shape, DType dtype, bool zero) {
  const std::string what = "Alloc " + shape.ToString() + " " + ToString(dtype) + " on " + name;
  for (int64_t d : shape.dims) {
    if (d < 0) return Status::Error(what + ": negative dimension");
  }
  const size_t bytes = size_t(shape.numel()) * DTypeBytes(dtype);
  const size_t now = shared->current.fetch_add(bytes) + bytes;
  if (options.capacity_bytes != 0 && now > options.capacity_bytes) {
    shared->current.fetch_sub(bytes);
    return Status::Error(what + ": " + std::to_string(bytes) + " bytes do not fit (" +
                         std::to_string(now - bytes) + " in use of a " +
                         std::to_string(options.capacity_bytes) + "-byte capacity)");
  }
  void* data = nullptr;
  if (bytes > 0) {
    Status s = PTDP_CUDA_STATUS(cudaSetDevice(options.device));
    if (s.ok()) s = PTDP_CUDA_STATUS(cudaMallocAsync(&data, bytes, stream));
    if (s.ok() && zero) {
      s = PTDP_CUDA_STATUS(cudaMemsetAsync(data, 0, bytes, stream));
      if (!s.ok()) (void)cudaFreeAsync(data, stream);
    }
    if (!s.ok()) {
      (void)cudaGetLastError();
      shared->current.fetch_sub(bytes);
      return Status::Error(what + ": " + std::to_string(bytes) + " bytes: " + s.message());
    }
  }
  size_t peak = shared->peak.load();
  while (now > peak && !shared->peak.compare_exchange_weak(peak, now)) {
  }
  std::shared_ptr<SharedState> state = shared;
  auto release = [state](void* p, size_t n) { state->Release(p, n); };
  return Tensor(std::make_shared<Buffer>(data, bytes, release), shape, dtype);
}

Result<Tensor> CudaBackend::Alloc(const Shape& shape, DType dtype) {
  return impl_->Alloc(shape, dtype, /*zero=*/true);
}
Result<Tensor> CudaBackend::AllocUninit(const Shape& shape, DType dtype) {
  return impl_->Alloc(shape, dtype, /*zero=*/false);
}

size_t CudaBackend::CurrentBytes() const { return impl_->shared->current.load(); }
size_t CudaBackend::PeakBytes() const { return impl_->shared->peak.load(); }
void CudaBackend::ResetPeak() { impl_->shared->peak.store(impl_->shared->current.load()); }

Status CudaBackend::Synchronize() {
  Status s = PTDP_CUDA_STATUS(cudaSetDevice(impl_->options.device));
  if (s.ok()) s = PTDP_CUDA_STATUS(cudaStreamSynchronize(impl_->stream));
  if (s.ok() && impl_->profile) s = impl_->profile->Resolve();
  if (!s.ok()) {
    (void)cudaGetLastError();
    impl_->shared->Record(s);
  }
  return impl_->shared->Take();
}

// ---- device-time marks (events on the stream) -------------------------------------------------

int CudaBackend::Mark() {
  Impl& im = *impl_;
  const int index = int(im.marks);
  if (!im.Begin(nullptr)) {
    ++im.marks;
    return index;
  }
  if (im.marks == im.events.size()) {
    cudaEvent_t e = nullptr;
    if (!im.Check(PTDP_CUDA_STATUS(cudaEventCreate(&e)))) {
      ++im.marks;
      return index;
    }
    im.events.push_back(e);
  }
  im.Check(PTDP_CUDA_STATUS(cudaEventRecord(im.events[im.marks], im.stream)));
  ++im.marks;
  return index;
}

double CudaBackend::MarkSeconds(int a, int b) {
  Impl& im = *impl_;
  if (a < 0 || b < 0 || size_t(std::max(a, b)) >= std::min(im.marks, im.events.size()))
    return 0.0;
  if (!im.Begin(nullptr)) return 0.0;
  float ms = 0.0f;
  if (!im.Check(PTDP_CUDA_STATUS(cudaEventSynchronize(im.events[size_t(b)])))) return 0.0;
  if (!im.Check(PTDP_CUDA_STATUS(
          cudaEventElapsedTime(&ms, im.events[size_t(a)], im.events[size_t(b)]))))
    return 0.0;
  return double(ms) * 1e-3;
}

void CudaBackend::ClearMarks() { impl_->marks = 0; }

// ---- host transfer ----------------------------------------------------------------------------

Status CudaBackend::Impl::Transfer(void* dst, const void* src, size_t bytes,
                                   cudaMemcpyKind kind) {
  PTDP_RETURN_IF_ERROR(shared->Take());
  Status s = PTDP_CUDA_STATUS(cudaSetDevice(options.device));
  if (s.ok() && bytes > 0) s = PTDP_CUDA_STATUS(cudaMemcpyAsync(dst, src, bytes, kind, stream));
  if (s.ok()) s = PTDP_CUDA_STATUS(cudaStreamSynchronize(stream));
  if (!s.ok()) (void)cudaGetLastError();
  shared->Record(s);
  return shared->Take();  // this copy's failure, or one a release recorded meanwhile
}

Status CudaBackend::CopyFromHost(const float* src, Tensor& dst) {
  if (dst.dtype() == DType::kBF16) {  // rounded on the host, as the CPU backend rounds
    std::vector<uint16_t> bits(size_t(dst.numel()));
    Bf16BitsOf(src, bits.data(), dst.numel());
    return impl_->Transfer(dst.data(), bits.data(), dst.bytes(), cudaMemcpyHostToDevice);
  }
  return impl_->Transfer(MutF32(dst), src, dst.bytes(), cudaMemcpyHostToDevice);
}

Status CudaBackend::CopyFromHost(const int32_t* src, Tensor& dst) {
  assert(dst.dtype() == DType::kI32);
  return impl_->Transfer(dst.data(), src, dst.bytes(), cudaMemcpyHostToDevice);
}

Status CudaBackend::CopyToHost(const Tensor& src, float* dst) {
  if (src.dtype() == DType::kBF16) {
    std::vector<uint16_t> bits(size_t(src.numel()));
    PTDP_RETURN_IF_ERROR(
        impl_->Transfer(bits.data(), src.data(), src.bytes(), cudaMemcpyDeviceToHost));
    FloatsOfBf16(bits.data(), dst, src.numel());
    return Status::Ok();
  }
  return impl_->Transfer(dst, F32(src), src.bytes(), cudaMemcpyDeviceToHost);
}

Status CudaBackend::CopyToHost(const Tensor& src, int32_t* dst) {
  return impl_->Transfer(dst, I32(src), src.bytes(), cudaMemcpyDeviceToHost);
}

// ---- GEMM -------------------------------------------------------------------------------------

// Row-major C (m, p) = op(A) op(B) is column-major C^T (p, m) = op(B)^T op(A)^T, and a row-major
// matrix read column-major is its transpose: so cuBLAS gets b first and a second, each with its
// own op and its stored row length as leading dimension, and C with ldc = p.
void CudaBackend::Impl::Gemm(const char* op, const Operand& a, const Operand& b, void* c,
                             DType c_dtype, int64_t m, int64_t p, int64_t k, float alpha,
                             float beta, int64_t batch, int64_t stride_c) {
  assert(a.dtype == b.dtype && (c_dtype == DType::kF32 || c_dtype == a.dtype));
  if (m == 0 || p == 0 || batch == 0) return;
  if (k == 0) {  // an empty sum: c = beta * c (c is contiguous: a whole tensor)
    const int64_t n = batch * m * p;
    Check(PTDP_CUDA_STATUS(ByType(c_dtype, [&](auto tag) {
      using T = decltype(tag);
      return beta == 0.0f ? kernels::Fill(0.0f, static_cast<T*>(c), n, stream)
                          : kernels::Scale(beta, static_cast<T*>(c), n, stream);
    })));
    return;
  }
  for (int64_t dim : {m, p, k, a.cols, b.cols, batch}) {
    if (dim > INT_MAX) {
      shared->Record(Status::Error(std::string(op) + ": dimension " + std::to_string(dim) +
                                   " exceeds cuBLAS's int range"));
      return;
    }
  }
  // bf16 operands are bf16 GEMMs whatever options.gemm says (fp32 accumulation, c rounded
  // once when it is bf16); fp32 operands follow options.gemm.
  const cublasComputeType_t compute =
      a.dtype == DType::kBF16 || options.gemm != GemmPrecision::kBf16
          ? CUBLAS_COMPUTE_32F
          : CUBLAS_COMPUTE_32F_FAST_16BF;
  Annotate(m, p, k, batch);
  const cudaDataType_t ab = CudaType(a.dtype), ct = CudaType(c_dtype);
  const cublasOperation_t op_a = a.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = b.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (batch == 1) {
    Check(PTDP_CUDA_STATUS(cublasGemmEx(cublas, op_b, op_a, int(p), int(m), int(k), &alpha,
                                        b.data, ab, int(b.cols), a.data, ab, int(a.cols), &beta,
                                        c, ct, int(p), compute, CUBLAS_GEMM_DEFAULT)));
  } else {
    Check(PTDP_CUDA_STATUS(cublasGemmStridedBatchedEx(
        cublas, op_b, op_a, int(p), int(m), int(k), &alpha, b.data, ab, int(b.cols), b.stride,
        a.data, ab, int(a.cols), a.stride, &beta, c, ct, int(p), stride_c, int(batch), compute,
        CUBLAS_GEMM_DEFAULT)));
  }
}

void CudaBackend::Matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
                         float alpha, float beta) {
  const int64_t m = trans_a ? Cols(a) : Rows(a), k = trans_a ? Rows(a) : Cols(a);
  const int64_t p = trans_b ? Rows(b) : Cols(b);
  assert(Rows(c) == m && Cols(c) == p && (trans_b ? Cols(b) : Rows(b)) == k);
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  impl_->Gemm("Matmul", TensorOperand(a, Rows(a), Cols(a), trans_a, 0),
              TensorOperand(b, Rows(b), Cols(b), trans_b, 0), c.data(), c.dtype(), m, p, k, alpha,
              beta, 1, 0);
}

void CudaBackend::MatmulBatched(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                                Tensor& c, float alpha, float beta) {
  assert(a.shape().rank() == 3 && b.shape().rank() == 3 && c.shape().rank() == 3);
  assert(a.shape()[0] == b.shape()[0] && a.shape()[0] == c.shape()[0]);
  const int64_t batch = a.shape()[0];
  const int64_t ar = a.shape()[1], ac = a.shape()[2], br = b.shape()[1], bc = b.shape()[2];
  const int64_t m = trans_a ? ac : ar, k = trans_a ? ar : ac, p = trans_b ? br : bc;
  assert(c.shape()[1] == m && c.shape()[2] == p && (trans_b ? bc : br) == k);
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  impl_->Gemm("MatmulBatched", TensorOperand(a, ar, ac, trans_a, ar * ac),
              TensorOperand(b, br, bc, trans_b, br * bc), c.data(), c.dtype(), m, p, k, alpha,
              beta, batch, m * p);
}

// ---- GEMM with a bias (and GeLU) epilogue ------------------------------------------------------

namespace {

// cuBLASLt descriptors, destroyed with the call.
struct LtCall {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, out = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtCall() {
    if (pref != nullptr) (void)cublasLtMatmulPreferenceDestroy(pref);
    if (out != nullptr) (void)cublasLtMatrixLayoutDestroy(out);
    if (second != nullptr) (void)cublasLtMatrixLayoutDestroy(second);
    if (first != nullptr) (void)cublasLtMatrixLayoutDestroy(first);
    if (desc != nullptr) (void)cublasLtMatmulDescDestroy(desc);
  }
};

}  // namespace

// As Gemm: column-major C^T (p, m) = op(B)^T op(A)^T, b first. The bias runs along C^T's rows
// (p, the output features: cuBLASLt's "bias vector length matches D's rows"), broadcast over
// its m columns; the aux matrix (the pre-activation: written by GELU_AUX_BIAS, read by DGELU)
// has the output's shape, ld p. Source: the cuBLAS docs (cublasLtMatmulDescAttributes_t,
// cublasLtEpilogue_t); llm.c's matmul_cublaslt does the same for its FC layers (GELU_AUX_BIAS
// forward, DGELU backward).
bool CudaBackend::Impl::EpilogueGemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                                     Epilogue e, const Tensor* bias, const Tensor* aux,
                                     Tensor& d) {
  const int64_t m = trans_a ? Cols(a) : Rows(a), k = trans_a ? Rows(a) : Cols(a);
  const int64_t p = trans_b ? Rows(b) : Cols(b);
  if (m == 0 || p == 0 || k == 0) return false;
  for (int64_t dim : {m, p, k}) if (dim > INT_MAX) return false;
  const bool with_bias = e != Epilogue::kDGelu, with_aux = e != Epilogue::kBias;
  assert(with_bias == (bias != nullptr) && with_aux == (aux != nullptr));
  // Only bf16 tensors, and only with the epilogues on (PTDP_CUDA_EPILOGUE): else the caller's
  // separate ops.
  if (!options.epilogues) return false;
  for (const Tensor* t : {&a, &b, bias, aux, static_cast<const Tensor*>(&d)})
    if (t != nullptr && t->dtype() != DType::kBF16) return false;
  // cuBLASLt's heuristic assumes 256-byte aligned matrices unless told less (a view may be 16).
  uint32_t align = 256;
  for (const void* ptr : {a.data(), b.data(), d.data(), with_bias ? bias->data() : d.data(),
                          with_aux ? aux->data() : d.data()}) {
    if (!kernels::Aligned16(ptr)) return false;
    if (reinterpret_cast<uintptr_t>(ptr) % 256 != 0) align = 16;
  }
  if (with_aux && p % 8 != 0) return false;  // the aux leading dimension's rule
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  LtCall call;
  auto ok = [&](cublasStatus_t s, const char* what) {
    return Check(CheckCublas(s, what, __FILE__, __LINE__));
  };
  if (!ok(cublasLtMatmulDescCreate(&call.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate"))
    return true;
  const cublasLtEpilogue_t epilogue = e == Epilogue::kBias       ? CUBLASLT_EPILOGUE_BIAS
                                      : e == Epilogue::kBiasGelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                                 : CUBLASLT_EPILOGUE_DGELU;
  const void* bias_ptr = with_bias ? bias->data() : nullptr;
  void* aux_ptr = with_aux ? aux->data() : nullptr;
  const int64_t ld_aux = p;
  bool set = ok(cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_b,
                                               sizeof(op_b)), "TRANSA") &&
             ok(cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_a,
                                               sizeof(op_a)), "TRANSB") &&
             ok(cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                               sizeof(epilogue)), "EPILOGUE");
  if (set && with_bias)
    set = ok(cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                            &bias_ptr, sizeof(bias_ptr)), "BIAS_POINTER");
  if (set && with_aux)
    set = ok(cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                            &aux_ptr, sizeof(aux_ptr)), "EPILOGUE_AUX_POINTER") &&
          ok(cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                            &ld_aux, sizeof(ld_aux)), "EPILOGUE_AUX_LD");
  // The stored matrices read column-major: b (Rows(b), Cols(b)) row-major is (Cols(b), Rows(b)).
  set = set &&
        ok(cublasLtMatrixLayoutCreate(&call.first, CUDA_R_16BF, uint64_t(Cols(b)),
                                      uint64_t(Rows(b)), Cols(b)), "layout b") &&
        ok(cublasLtMatrixLayoutCreate(&call.second, CUDA_R_16BF, uint64_t(Cols(a)),
                                      uint64_t(Rows(a)), Cols(a)), "layout a") &&
        ok(cublasLtMatrixLayoutCreate(&call.out, CUDA_R_16BF, uint64_t(p), uint64_t(m), p),
           "layout c");
  if (!set) return true;  // recorded
  const auto key = std::make_tuple(m, p, k, trans_a, trans_b, int(e), align);
  auto it = lt_algos.find(key);
  if (it == lt_algos.end()) {
    const uint64_t bytes = kCublasWorkspaceBytes;
    cublasLtMatmulHeuristicResult_t found{};
    int count = 0;
    std::optional<cublasLtMatmulAlgo_t> algo;
    if (ok(cublasLtMatmulPreferenceCreate(&call.pref), "PreferenceCreate") &&
        ok(cublasLtMatmulPreferenceSetAttribute(call.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &bytes, sizeof(bytes)), "MAX_WORKSPACE_BYTES") &&
        [&] {
          for (const auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
            if (!ok(cublasLtMatmulPreferenceSetAttribute(call.pref, attr, &align, sizeof(align)),
                    "MIN_ALIGNMENT"))
              return false;
          return true;
        }() &&
        cublasLtMatmulAlgoGetHeuristic(lt, call.desc, call.first, call.second, call.out, call.out,
                                       call.pref, 1, &found, &count) == CUBLAS_STATUS_SUCCESS &&
        count > 0)
      algo = found.algo;
    it = lt_algos.emplace(key, algo).first;
  }
  if (!it->second) return false;
  Annotate(m, p, k, 1);
  const float alpha = 1.0f, beta = 0.0f;
  void* out = d.data();
  const cublasStatus_t s =
      cublasLtMatmul(lt, call.desc, &alpha, b.data(), call.first, a.data(), call.second, &beta,
                     out, call.out, out, call.out, &*it->second, workspace, kCublasWorkspaceBytes,
                     stream);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) {
    it->second.reset();  // declined at launch (nothing enqueued): the separate ops from now on
    return false;
  }
  ok(s, "cublasLtMatmul");
  return true;
}

// The epilogue GEMMs take bf16 operands (EpilogueGemm falls back for a shape cuBLASLt declines).
bool CudaBackend::FusesGemmEpilogues(DType act) const {
  return impl_->options.epilogues && act == DType::kBF16;
}

void CudaBackend::MatmulBias(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                             const Tensor& bias, Tensor& c) {
  assert(bias.numel() == Cols(c));
  const auto began = impl_->Begin(__func__);
  if (began &&
      impl_->EpilogueGemm(a, trans_a, b, trans_b, Impl::Epilogue::kBias, &bias, nullptr, c))
    return;
  Backend::MatmulBias(a, trans_a, b, trans_b, bias, c);
}

void CudaBackend::MatmulBiasGelu(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                                 const Tensor& bias, Tensor& pre, Tensor& act) {
  assert(bias.numel() == Cols(pre) && act.numel() == pre.numel());
  const auto began = impl_->Begin(__func__);
  if (began &&
      impl_->EpilogueGemm(a, trans_a, b, trans_b, Impl::Epilogue::kBiasGelu, &bias, &pre, act))
    return;
  Backend::MatmulBiasGelu(a, trans_a, b, trans_b, bias, pre, act);
}

void CudaBackend::MatmulGeluBackward(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                                     const Tensor& pre, Tensor& dx) {
  assert(pre.numel() == dx.numel() && pre.data() != dx.data());
  const auto began = impl_->Begin(__func__);
  if (began &&
      impl_->EpilogueGemm(a, trans_a, b, trans_b, Impl::Epilogue::kDGelu, nullptr, &pre, dx))
    return;
  Backend::MatmulGeluBackward(a, trans_a, b, trans_b, pre, dx);
}

// ---- bias -------------------------------------------------------------------------------------

void CudaBackend::AddBias(Tensor& y, const Tensor& bias) {
  assert(bias.numel() == Cols(y));
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  impl_->Check(PTDP_CUDA_STATUS(ByType(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return kernels::AddBias(Out<T>(y), In<T>(bias), Rows(y), Cols(y), impl_->stream);
  })));
}

void CudaBackend::BiasGrad(const Tensor& dy, Tensor& dbias) {
  const int64_t n = Rows(dy), c = Cols(dy);
  assert(dbias.numel() == c);
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  const kernels::RowSplit split = kernels::SplitRows(n);
  if (split.chunks == 0 || c == 0) return;
  Result<Tensor> partials = impl_->Scratch("BiasGrad", Shape{split.chunks, c});
  if (!partials.ok()) return;
  impl_->Check(PTDP_CUDA_STATUS(ByType(dy.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return kernels::BiasGradPartials(In<T>(dy), n, c, split, MutF32(*partials), impl_->stream);
  })));
  impl_->Check(PTDP_CUDA_STATUS(
      kernels::ColumnFinalize(F32(*partials), split.chunks, c, MutF32(dbias), impl_->stream)));
}

// ---- LayerNorm --------------------------------------------------------------------------------

void CudaBackend::AddBiasResidual(Tensor& x, const Tensor& bias, const Tensor& residual) {
  assert(bias.numel() == Cols(x) && residual.numel() == x.numel());
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  impl_->Check(PTDP_CUDA_STATUS(ByType(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return kernels::AddBiasResidual(Out<T>(x), In<T>(bias), In<T>(residual), Rows(x), Cols(x),
                                    impl_->stream);
  })));
}

void CudaBackend::AddBiasResidualLayerNorm(Tensor& x, const Tensor& bias, const Tensor& residual,
                                           const Tensor& gamma, const Tensor& beta, float eps,
                                           Tensor& y, Tensor& mean, Tensor& rstd) {
  const int64_t n = Rows(x), c = Cols(x);
  assert(bias.numel() == c && residual.numel() == x.numel() && y.numel() == x.numel());
  assert(gamma.numel() == c && beta.numel() == c && mean.numel() == n && rstd.numel() == n);
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  impl_->Check(PTDP_CUDA_STATUS(ByType(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return kernels::AddBiasResidualLayerNorm(Out<T>(x), In<T>(bias), In<T>(residual),
                                             In<T>(gamma), In<T>(beta), eps, n, c, Out<T>(y),
                                             MutF32(mean), MutF32(rstd), impl_->stream);
  })));
}

void CudaBackend::LayerNormForward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                   float eps, Tensor& y, Tensor& mean, Tensor& rstd) {
  const int64_t n = Rows(x), c = Cols(x);
  assert(y.numel() == x.numel() && gamma.numel() == c && beta.numel() == c);
  assert(mean.numel() == n && rstd.numel() == n);
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  impl_->Check(PTDP_CUDA_STATUS(ByType(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return kernels::LayerNormForward(In<T>(x), In<T>(gamma), In<T>(beta), eps, n, c, Out<T>(y),
                                     MutF32(mean), MutF32(rstd), impl_->stream);
  })));
}

void CudaBackend::LayerNormBackward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                    const Tensor& mean, const Tensor& rstd, Tensor& dx,
                                    Tensor& dgamma, Tensor& dbeta) {
  const int64_t n = Rows(x), c = Cols(x);
  assert(dy.numel() == x.numel() && dx.numel() == x.numel());
  assert(gamma.numel() == c && dgamma.numel() == c && dbeta.numel() == c);
  assert(mean.numel() == n && rstd.numel() == n);
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  cudaStream_t st = impl_->stream;
  impl_->Check(PTDP_CUDA_STATUS(ByType(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return kernels::LayerNormBackwardInput(In<T>(dy), In<T>(x), In<T>(gamma), F32(mean),
                                           F32(rstd), n, c, Out<T>(dx), st);
  })));
  const kernels::RowSplit split = kernels::SplitRows(n);
  if (split.chunks == 0 || c == 0) return;
  Result<Tensor> partials = impl_->Scratch("LayerNormBackward", Shape{2, split.chunks, c});
  if (!partials.ok()) return;
  float* dgamma_partials = MutF32(*partials);
  float* dbeta_partials = dgamma_partials + split.chunks * c;
  impl_->Check(PTDP_CUDA_STATUS(ByType(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return kernels::LayerNormParamPartials(In<T>(dy), In<T>(x), F32(mean), F32(rstd), n, c,
                                           split, dgamma_partials, dbeta_partials, st);
  })));
  impl_->Check(PTDP_CUDA_STATUS(
      kernels::ColumnFinalize(dgamma_partials, split.chunks, c, MutF32(dgamma), st)));
  impl_->Check(PTDP_CUDA_STATUS(
      kernels::ColumnFinalize(dbeta_partials, split.chunks, c, MutF32(dbeta), st)));
}

// ---- GeLU -------------------------------------------------------------------------------------

void CudaBackend::GeluForward(const Tensor& x, Tensor& y) {
  assert(y.numel() == x.numel());
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  impl_->Check(PTDP_CUDA_STATUS(ByType(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return kernels::GeluForward(In<T>(x), Out<T>(y), x.numel(), impl_->stream);
  })));
}

void CudaBackend::GeluBackward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  assert(dy.numel() == x.numel() && dx.numel() == x.numel());
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  impl_->Check(PTDP_CUDA_STATUS(ByType(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return kernels::GeluBackward(In<T>(dy), In<T>(x), Out<T>(dx), x.numel(), impl_->stream);
  })));
}

// ---- attention --------------------------------------------------------------------------------

namespace {
// Which flash kernels AttentionKernel names (kUnfused: none, never asked).
kernels::FlashVariant VariantOf(AttentionKernel k) {
  return k == AttentionKernel::kFlashMma ? kernels::FlashVariant::kMma
                                         : kernels::FlashVariant::kWmma;
}
}  // namespace

// bf16 plans with heads of d <= 128 on sm_80+ run the flash kernels and save the log-sum-exp
// (b, nh, s); the unfused path saves the softmax probabilities P (b, nh, s, s), zero above the
// diagonal, as the CPU backend.
bool CudaBackend::UsesFlashAttention(int64_t d) const {
  return impl_->options.gemm == GemmPrecision::kBf16 &&
         impl_->options.attention != AttentionKernel::kUnfused &&
         kernels::FlashAttentionSupported(d, impl_->cc_major, impl_->smem_optin,
                                          VariantOf(impl_->options.attention));
}

Shape CudaBackend::AttentionSavedShape(int64_t b, int64_t s, int64_t nh, int64_t d) const {
  if (UsesFlashAttention(d)) return Shape{b, nh, s};
  return Shape{b, nh, s, s};
}

// q, k, v unpacked per head to (L, s, d) each; S = q k^T (L, s, s) into saved by one strided
// batched GEMM (the full square: the masked half costs the GEMM twice the causal minimum), the
// fused scale + mask + softmax in place, O = P v, packed back into out's rows.
void CudaBackend::AttentionForward(const Tensor& qkv, int64_t nh, TokenOrder order, Tensor& out,
                                   Tensor& saved) {
  int64_t b = 0, s = 0;
  BatchSeq(qkv, order, &b, &s);
  const int64_t a = Cols(qkv) / 3, d = a / nh, l = b * nh, x = l * s * d;
  assert(Cols(qkv) == 3 * a && a == nh * d && out.numel() == b * s * a);
  assert(saved.shape() == AttentionSavedShape(b, s, nh, d));
  const auto began = impl_->Begin(__func__);
  if (!began || x == 0) return;
  impl_->AnnotateAttention(b, s, nh, d, /*backward=*/false, UsesFlashAttention(d));
  const bool seq_first = order == TokenOrder::kSeqFirst;
  cudaStream_t st = impl_->stream;
  if (UsesFlashAttention(d)) {
    impl_->Check(PTDP_CUDA_STATUS(ByType(qkv.dtype(), [&](auto tag) {
      using T = decltype(tag);
      return kernels::FlashAttentionForward(In<T>(qkv),
                                            kernels::HeadLayout{b, s, nh, d, 3, seq_first},
                                            Out<T>(out), MutF32(saved), st,
                                            VariantOf(impl_->options.attention));
    })));
    return;
  }
  Result<Tensor> heads = impl_->Scratch("AttentionForward", Shape{3, l, s, d});  // q | k | v
  if (!heads.ok()) return;
  Result<Tensor> o = impl_->Scratch("AttentionForward", Shape{l, s, d});
  if (!o.ok()) return;
  const float* q = F32(*heads);
  const float* k = q + x;
  const float* v = q + 2 * x;
  float* p = MutF32(saved);
  impl_->Check(PTDP_CUDA_STATUS(ByType(qkv.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return kernels::RowsToHeads(In<T>(qkv), kernels::HeadLayout{b, s, nh, d, 3, seq_first},
                                MutF32(*heads), st);
  })));
  impl_->Gemm("AttentionForward", F32Operand(q, s, d, false, s * d),
              F32Operand(k, s, d, true, s * d), p, DType::kF32, s, s, d, 1.0f, 0.0f, l, s * s);
  impl_->Check(PTDP_CUDA_STATUS(
      kernels::CausalSoftmaxForward(p, l, s, 1.0f / std::sqrt(float(d)), st)));
  impl_->Gemm("AttentionForward", F32Operand(p, s, s, false, s * s),
              F32Operand(v, s, d, false, s * d), MutF32(*o), DType::kF32, s, d, s, 1.0f, 0.0f,
              l, s * d);
  impl_->Check(PTDP_CUDA_STATUS(ByType(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return kernels::HeadsToRows(F32(*o), kernels::HeadLayout{b, s, nh, d, 1, seq_first},
                                Out<T>(out), st);
  })));
}

// With dO the gradient of O per head:
//   dV = P^T dO;  dP = dO V^T;  dS = P * (dP - rowsum(P * dP)) / sqrt(d);  dQ = dS K;
//   dK = dS^T Q; dQ, dK, dV packed into dqkv's rows.
void CudaBackend::AttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                    const Tensor& saved, int64_t nh, TokenOrder order,
                                    Tensor& dqkv) {
  int64_t b = 0, s = 0;
  BatchSeq(qkv, order, &b, &s);
  const int64_t a = Cols(qkv) / 3, d = a / nh, l = b * nh, x = l * s * d;
  assert(a == nh * d && dout.numel() == b * s * a && dqkv.shape() == qkv.shape());
  assert(out.numel() == dout.numel());
  assert(saved.shape() == AttentionSavedShape(b, s, nh, d));
  const auto began = impl_->Begin(__func__);
  if (!began || x == 0) return;
  impl_->AnnotateAttention(b, s, nh, d, /*backward=*/true, UsesFlashAttention(d));
  const bool seq_first = order == TokenOrder::kSeqFirst;
  cudaStream_t st = impl_->stream;
  const char* op = "AttentionBackward";
  if (UsesFlashAttention(d)) {
    Result<Tensor> delta = impl_->Scratch(op, Shape{l, s});
    if (!delta.ok()) return;
    impl_->Check(PTDP_CUDA_STATUS(ByType(qkv.dtype(), [&](auto tag) {
      using T = decltype(tag);
      return kernels::FlashAttentionBackward(In<T>(dout), In<T>(qkv), In<T>(out), F32(saved),
                                             kernels::HeadLayout{b, s, nh, d, 3, seq_first},
                                             MutF32(*delta), Out<T>(dqkv), st,
                                             VariantOf(impl_->options.attention));
    })));
    return;
  }
  Result<Tensor> heads = impl_->Scratch(op, Shape{3, l, s, d});   // q | k | v
  if (!heads.ok()) return;
  Result<Tensor> dheads = impl_->Scratch(op, Shape{3, l, s, d});  // dq | dk | dv
  if (!dheads.ok()) return;
  Result<Tensor> dout_heads = impl_->Scratch(op, Shape{l, s, d});
  if (!dout_heads.ok()) return;
  Result<Tensor> dp = impl_->Scratch(op, Shape{l, s, s});  // dP, then dS in place
  if (!dp.ok()) return;
  const float* q = F32(*heads);
  const float* k = q + x;
  const float* v = q + 2 * x;
  float* dq = MutF32(*dheads);
  float* dk = dq + x;
  float* dv = dq + 2 * x;
  const float* p = F32(saved);
  const float* dO = F32(*dout_heads);
  float* ds = MutF32(*dp);
  impl_->Check(PTDP_CUDA_STATUS(ByType(qkv.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const cudaError_t e = kernels::RowsToHeads(
        In<T>(qkv), kernels::HeadLayout{b, s, nh, d, 3, seq_first}, MutF32(*heads), st);
    if (e != cudaSuccess) return e;
    return kernels::RowsToHeads(In<T>(dout), kernels::HeadLayout{b, s, nh, d, 1, seq_first},
                                MutF32(*dout_heads), st);
  })));
  impl_->Gemm(op, F32Operand(p, s, s, true, s * s), F32Operand(dO, s, d, false, s * d), dv,
              DType::kF32, s, d, s, 1.0f, 0.0f, l, s * d);
  impl_->Gemm(op, F32Operand(dO, s, d, false, s * d), F32Operand(v, s, d, true, s * d), ds,
              DType::kF32, s, s, d, 1.0f, 0.0f, l, s * s);
  impl_->Check(PTDP_CUDA_STATUS(
      kernels::CausalSoftmaxBackward(p, ds, l, s, 1.0f / std::sqrt(float(d)), st)));
  impl_->Gemm(op, F32Operand(ds, s, s, false, s * s), F32Operand(k, s, d, false, s * d), dq,
              DType::kF32, s, d, s, 1.0f, 0.0f, l, s * d);
  impl_->Gemm(op, F32Operand(ds, s, s, true, s * s), F32Operand(q, s, d, false, s * d), dk,
              DType::kF32, s, d, s, 1.0f, 0.0f, l, s * d);
  impl_->Check(PTDP_CUDA_STATUS(ByType(dqkv.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return kernels::HeadsToRows(F32(*dheads), kernels::HeadLayout{b, s, nh, d, 3, seq_first},
                                Out<T>(dqkv), st);
  })));
}

// ---- context-parallel attention blocks (naive kernels: kernels.cuh) ---------------------------

namespace {
kernels::BlockAttention BlockArgs(const Tensor& qkv, const SeqBlock& qpos, const SeqBlock& kpos,
                                  int64_t nh) {
  kernels::BlockAttention a;
  a.b = qkv.shape()[1];
  a.nh = nh;
  a.d = Cols(qkv) / 3 / nh;
  a.lq = qpos.len, a.q0 = qpos.first0, a.q1 = qpos.first1;
  a.lk = kpos.len, a.k0 = kpos.first0, a.k1 = kpos.first1;
  return a;
}
}  // namespace

void CudaBackend::AttentionBlockForward(const Tensor& qkv, const SeqBlock& qpos, const Tensor& kv,
                                        const SeqBlock& kpos, int64_t nh, bool first, Tensor& out,
                                        Tensor& lse) {
  assert(qkv.shape().rank() == 3 && kv.shape().rank() == 3 && Cols(kv) * 3 == Cols(qkv) * 2);
  assert(qkv.shape()[0] == 2 * qpos.len && kv.shape()[0] == 2 * kpos.len);
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  impl_->Check(PTDP_CUDA_STATUS(ByType(qkv.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return kernels::AttentionBlockForward(In<T>(qkv), In<T>(kv), BlockArgs(qkv, qpos, kpos, nh),
                                          first, MutF32(out), MutF32(lse), impl_->stream);
  })));
}

void CudaBackend::AttentionBlockBackward(const Tensor& dout, const Tensor& qkv,
                                         const SeqBlock& qpos, const Tensor& kv,
                                         const SeqBlock& kpos, const Tensor& out,
                                         const Tensor& lse, int64_t nh, Tensor& dqkv,
                                         Tensor& dkv) {
  assert(dqkv.shape() == qkv.shape() && dkv.shape() == kv.shape());
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  impl_->Check(PTDP_CUDA_STATUS(ByType(qkv.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return kernels::AttentionBlockBackward(In<T>(dout), In<T>(qkv), In<T>(kv), In<T>(out),
                                           F32(lse), BlockArgs(qkv, qpos, kpos, nh),
                                           MutF32(dqkv), MutF32(dkv), impl_->stream);
  })));
}

void CudaBackend::ScaleRows(const Tensor& x, const Tensor& scale, Tensor& out) {
  assert(scale.numel() == Rows(x) && out.numel() == x.numel());
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  impl_->Check(PTDP_CUDA_STATUS(ByType(x.dtype(), [&](auto xt) {
    return ByType(out.dtype(), [&](auto ot) {
      using X = decltype(xt);
      using O = decltype(ot);
      return kernels::ScaleRows(In<X>(x), F32(scale), Rows(x), Cols(x), Out<O>(out),
                                impl_->stream);
    });
  })));
}

void CudaBackend::RowDot(const Tensor& a, const Tensor& b, Tensor& out) {
  assert(b.numel() == a.numel() && out.numel() == Rows(a));
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  impl_->Check(PTDP_CUDA_STATUS(ByType(a.dtype(), [&](auto at) {
    return ByType(b.dtype(), [&](auto bt) {
      using A = decltype(at);
      using B = decltype(bt);
      return kernels::RowDot(In<A>(a), In<B>(b), Rows(a), Cols(a), MutF32(out), impl_->stream);
    });
  })));
}

void CudaBackend::CopyColumns(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col,
                              int64_t ncols) {
  const int64_t rows = Rows(src), ws = Cols(src), wd = Cols(dst);
  assert(Rows(dst) == rows && src_col + ncols <= ws && dst_col + ncols <= wd);
  const auto began = impl_->Begin(__func__);
  if (!began || rows == 0 || ncols == 0) return;
  assert(src.dtype() == dst.dtype());
  const size_t f = DTypeBytes(src.dtype());
  impl_->Check(PTDP_CUDA_STATUS(cudaMemcpy2DAsync(
      static_cast<char*>(dst.data()) + dst_col * f, size_t(wd) * f,
      static_cast<const char*>(src.data()) + src_col * f, size_t(ws) * f, size_t(ncols) * f,
      size_t(rows), cudaMemcpyDeviceToDevice, impl_->stream)));
}

// ---- vocab-parallel embedding -----------------------------------------------------------------

void CudaBackend::EmbeddingForward(const Tensor& tokens, const Tensor& table, int64_t vocab_start,
                                   Tensor& out) {
  const int64_t n = tokens.numel(), v = Rows(table), h = Cols(table);
  assert(out.numel() == n * h);
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  impl_->Check(PTDP_CUDA_STATUS(ByType(table.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return kernels::EmbeddingForward(I32(tokens), n, In<T>(table), v, h, vocab_start, Out<T>(out),
                                     impl_->stream);
  })));
}

void CudaBackend::EmbeddingBackward(const Tensor& dout, const Tensor& tokens, int64_t vocab_start,
                                    Tensor& dtable) {
  const int64_t n = tokens.numel(), v = Rows(dtable), h = Cols(dtable);
  assert(dout.numel() == n * h);
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  impl_->Check(PTDP_CUDA_STATUS(ByType(dout.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return kernels::EmbeddingBackward(In<T>(dout), I32(tokens), n, vocab_start, v, h,
                                      MutF32(dtable), impl_->stream);
  })));
}

// ---- vocab-parallel cross entropy -------------------------------------------------------------

void CudaBackend::CrossEntropyMax(const Tensor& logits, Tensor& row_max) {
  assert(row_max.numel() == Rows(logits));
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  impl_->Check(PTDP_CUDA_STATUS(ByType(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return kernels::CrossEntropyMax(In<T>(logits), Rows(logits), Cols(logits), MutF32(row_max),
                                    impl_->stream);
  })));
}

void CudaBackend::CrossEntropySumExp(const Tensor& logits, const Tensor& row_max,
                                     Tensor& sum_exp) {
  assert(row_max.numel() == Rows(logits) && sum_exp.numel() == Rows(logits));
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  impl_->Check(PTDP_CUDA_STATUS(ByType(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return kernels::CrossEntropySumExp(In<T>(logits), F32(row_max), Rows(logits), Cols(logits),
                                       MutF32(sum_exp), impl_->stream);
  })));
}

void CudaBackend::CrossEntropyTarget(const Tensor& logits, const Tensor& targets,
                                     int64_t vocab_start, Tensor& target_logit) {
  assert(targets.numel() == Rows(logits) && target_logit.numel() == Rows(logits));
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  impl_->Check(PTDP_CUDA_STATUS(ByType(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return kernels::CrossEntropyTarget(In<T>(logits), I32(targets), Rows(logits), Cols(logits),
                                       vocab_start, MutF32(target_logit), impl_->stream);
  })));
}

void CudaBackend::CrossEntropyLoss(const Tensor& row_max, const Tensor& sum_exp,
                                   const Tensor& target_logit, Tensor& loss) {
  const int64_t n = row_max.numel();
  assert(sum_exp.numel() == n && target_logit.numel() == n && loss.numel() == n);
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  impl_->Check(PTDP_CUDA_STATUS(kernels::CrossEntropyLoss(
      F32(row_max), F32(sum_exp), F32(target_logit), n, MutF32(loss), impl_->stream)));
}

void CudaBackend::CrossEntropyBackward(const Tensor& logits, const Tensor& targets,
                                       int64_t vocab_start, const Tensor& row_max,
                                       const Tensor& sum_exp, float scale, Tensor& dlogits) {
  const int64_t n = Rows(logits), v = Cols(logits);
  assert(targets.numel() == n && row_max.numel() == n && sum_exp.numel() == n);
  assert(dlogits.numel() == logits.numel());
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  impl_->Check(PTDP_CUDA_STATUS(ByType(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return kernels::CrossEntropyBackward(In<T>(logits), I32(targets), n, v, vocab_start,
                                         F32(row_max), F32(sum_exp), scale, Out<T>(dlogits),
                                         impl_->stream);
  })));
}

// ---- element-wise and reductions --------------------------------------------------------------

void CudaBackend::Add(const Tensor& a, const Tensor& b, Tensor& out) {
  assert(a.numel() == out.numel() && b.numel() == out.numel());
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  impl_->Check(PTDP_CUDA_STATUS(ByType(a.dtype(), [&](auto at) {
    return ByType(b.dtype(), [&](auto bt) {
      return ByType(out.dtype(), [&](auto ot) {
        using A = decltype(at);
        using B = decltype(bt);
        using O = decltype(ot);
        return kernels::Add(In<A>(a), In<B>(b), Out<O>(out), out.numel(), impl_->stream);
      });
    });
  })));
}

void CudaBackend::Axpy(float alpha, const Tensor& x, Tensor& y) {
  assert(x.numel() == y.numel());
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  impl_->Check(PTDP_CUDA_STATUS(ByType(x.dtype(), [&](auto xt) {
    return ByType(y.dtype(), [&](auto yt) {
      using X = decltype(xt);
      using Y = decltype(yt);
      return kernels::Axpy(alpha, In<X>(x), Out<Y>(y), y.numel(), impl_->stream);
    });
  })));
}

void CudaBackend::Scale(float alpha, Tensor& x) {
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  impl_->Check(PTDP_CUDA_STATUS(ByType(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return kernels::Scale(alpha, Out<T>(x), x.numel(), impl_->stream);
  })));
}

void CudaBackend::Fill(float value, Tensor& x) {
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  impl_->Check(PTDP_CUDA_STATUS(ByType(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return kernels::Fill(value, Out<T>(x), x.numel(), impl_->stream);
  })));
}

void CudaBackend::Copy(const Tensor& src, Tensor& dst) {
  assert(src.numel() == dst.numel());
  const auto began = impl_->Begin(__func__);
  if (!began || src.numel() == 0) return;
  if (src.dtype() == DType::kF32 && dst.dtype() == DType::kBF16) {
    impl_->Check(PTDP_CUDA_STATUS(
        kernels::ToBf16(F32(src), Out<kernels::bf16>(dst), src.numel(), impl_->stream)));
  } else if (src.dtype() == DType::kBF16 && dst.dtype() == DType::kF32) {
    impl_->Check(PTDP_CUDA_STATUS(
        kernels::FromBf16(In<kernels::bf16>(src), MutF32(dst), src.numel(), impl_->stream)));
  } else if (src.data() != dst.data()) {
    assert(src.dtype() == dst.dtype());
    impl_->Check(PTDP_CUDA_STATUS(cudaMemcpyAsync(dst.data(), src.data(), src.bytes(),
                                                  cudaMemcpyDeviceToDevice, impl_->stream)));
  }
}

// out[0] += the sum of x (or of x^2) through SumBlocks(n) double partials in scratch.
void CudaBackend::Impl::Reduce(const char* op, const Tensor& x, bool squares, Tensor& out) {
  const int64_t blocks = kernels::SumBlocks(x.numel());
  if (blocks == 0) return;
  Result<Tensor> partials = Scratch(op, Shape{2 * blocks});  // doubles in f32 pairs
  if (!partials.ok()) return;
  double* p = reinterpret_cast<double*>(MutF32(*partials));  // 256-byte aligned: a whole buffer
  Check(PTDP_CUDA_STATUS(ByType(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return kernels::SumPartials(In<T>(x), x.numel(), squares, p, stream);
  })));
  Check(PTDP_CUDA_STATUS(kernels::SumFinalize(p, blocks, MutF32(out), stream)));
}

void CudaBackend::SumSquares(const Tensor& x, Tensor& out) {
  assert(out.numel() == 1);
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  impl_->Reduce("SumSquares", x, /*squares=*/true, out);
}

void CudaBackend::Sum(const Tensor& x, Tensor& out) {
  assert(out.numel() == 1);
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  impl_->Reduce("Sum", x, /*squares=*/false, out);
}

// ---- optimizer --------------------------------------------------------------------------------

void CudaBackend::AdamW(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                        const AdamWConfig& cfg) {
  assert(grad.numel() == param.numel() && m.numel() == param.numel() &&
         v.numel() == param.numel() && cfg.step >= 1);
  const auto began = impl_->Begin(__func__);
  if (!began) return;
  // The bias corrections as the CPU backend computes them (fp32 pow on the host).
  const kernels::AdamWArgs args{cfg.lr,
                                cfg.beta1,
                                cfg.beta2,
                                cfg.eps,
                                cfg.weight_decay,
                                cfg.grad_scale,
                                1.0f - std::pow(cfg.beta1, float(cfg.step)),
                                1.0f - std::pow(cfg.beta2, float(cfg.step))};
  impl_->Check(PTDP_CUDA_STATUS(kernels::AdamW(MutF32(param), F32(grad), MutF32(m), MutF32(v),
                                               param.numel(), args, impl_->stream)));
}

}  // namespace ptdp::rt::cuda
