// The CUDA runtime, cuBLAS, cuBLASLt and NCCL entry points the CUDA backend calls
// (runtime/cuda/cuda_backend.cc, cuda_check.cc, device_world.cc), implemented on the host for the
// CUDA emulator (cuda_emu.h): linked instead of libcudart, libcublas, libcublasLt and libnccl, it
// lets the unchanged backend, and the GPU tests written for it, run on a machine without a GPU
// (tests/runtime/cuda: the *_emu tests). One emulated device, "ptdp CUDA emulator (sm_90)",
// with an H100's limits (compute capability 9.0, 227 KiB of shared memory a block).
//
// - Memory: device pointers are host memory (256-byte aligned, as cudaMalloc's); frees check the
//   pointer; every copy and memset is done at once (streams are in order anyway).
// - Kernels run when launched (cuda_emu.h); a kernel's failure is the sticky
//   cudaErrorLaunchFailure that cudaStreamSynchronize and cudaGetLastError then return.
// - cuBLAS: GEMMs in fp32 (dot products in k order), operands rounded to bf16 first for
//   CUBLAS_COMPUTE_32F_FAST_16BF, outputs rounded to nearest even when bf16; beta 0 reads no C.
//   cuBLASLt: the same product with the epilogues the backend uses (BIAS, GELU_AUX_BIAS, DGELU;
//   GeLU the tanh approximation, cuBLASLt's).
// - Events: host clock readings (the emulator runs each kernel at its launch).
// - NCCL: communicators of one rank, whose collectives copy and whose sends to itself meet its
//   receives in a group (one device: NcclWorld's one rank per GPU); more ranks are refused with
//   a message.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <atomic>
#include <mutex>
#include <string>
#include <vector>
#include <algorithm>
#include <cstdio>

#include "runtime/bf16.h"
#include "runtime/cuda/emu/cuda_emu.h"

// cuda_emu.h's macros are for kernel sources; here are the functions themselves.
#undef cudaGetLastError
#undef cudaFuncSetAttribute

struct CUstream_st {
  int device = 0;
};
struct CUevent_st {
  std::chrono::steady_clock::time_point at;
  bool recorded = false;
};
struct CUmemPoolHandle_st {};
struct cublasContext {
  cudaStream_t stream = nullptr;
};
struct cublasLtContext {};

namespace {

constexpr int kDevices = 1;

// PTDP_CUDA_EMU_STATS=1: at exit, what the process asked of the emulated GPU (kernel launches,
// library calls, host synchronizations and copies): the counts a real GPU's run makes too, e.g.
// per training step, where each synchronization drains the GPU's queue.
struct Stats {
  std::atomic<int64_t> gemms{0}, lt_gemms{0}, syncs{0}, d2h{0}, h2d{0}, d2d{0}, mallocs{0},
      frees{0}, nccl{0};
  ~Stats() {
    const char* on = std::getenv("PTDP_CUDA_EMU_STATS");
    if (on == nullptr || *on == '\0' || *on == '0') return;
    std::fprintf(stderr,
                 "ptdp CUDA emulator: %lld kernel launches, %lld cuBLAS and %lld cuBLASLt GEMMs, "
                 "%lld NCCL calls, %lld host synchronizations, copies %lld to the host, %lld from "
                 "it, %lld on the device, %lld allocations, %lld frees\n",
                 (long long)ptdp::emu::Launches(), (long long)gemms.load(),
                 (long long)lt_gemms.load(), (long long)nccl.load(), (long long)syncs.load(),
                 (long long)d2h.load(), (long long)h2d.load(), (long long)d2d.load(),
                 (long long)mallocs.load(), (long long)frees.load());
  }
};
Stats stats;

void CountCopy(cudaMemcpyKind kind) {
  if (kind == cudaMemcpyDeviceToHost) ++stats.d2h;
  else if (kind == cudaMemcpyHostToDevice) ++stats.h2d;
  else ++stats.d2d;
}
constexpr size_t kDeviceBytes = size_t(80) << 30;

thread_local int current_device = 0;
thread_local cudaError_t runtime_error = cudaSuccess;  // the last failed runtime call's

cudaError_t Err(cudaError_t e) {
  if (e != cudaSuccess) runtime_error = e;
  return e;
}

std::mutex mu;
std::map<void*, size_t>& Allocations() {
  static std::map<void*, size_t> a;
  return a;
}

size_t allocated = 0;  // bytes live on the emulated device (guarded by mu)

// The device's memory is kDeviceBytes: more fails as cudaMalloc does, without asking the host.
cudaError_t Allocate(void** p, size_t bytes) {
  if (p == nullptr) return Err(cudaErrorInvalidValue);
  ++stats.mallocs;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (bytes > kDeviceBytes - allocated) return Err(cudaErrorMemoryAllocation);
    allocated += bytes;
  }
  const size_t rounded = ((bytes == 0 ? 1 : bytes) + 255) / 256 * 256;
  void* q = std::aligned_alloc(256, rounded);
  std::lock_guard<std::mutex> lock(mu);
  if (q == nullptr) {
    allocated -= bytes;
    return Err(cudaErrorMemoryAllocation);
  }
  Allocations()[q] = bytes;
  *p = q;
  return cudaSuccess;
}

cudaError_t Release(void* p) {
  if (p == nullptr) return cudaSuccess;
  ++stats.frees;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = Allocations().find(p);
    if (it == Allocations().end()) return Err(cudaErrorInvalidValue);
    allocated -= it->second;
    Allocations().erase(it);
  }
  std::free(p);
  return cudaSuccess;
}

// The sticky failure of a kernel (cuda_emu.h), as an asynchronous fault surfaces on a GPU at
// the next synchronization.
cudaError_t KernelFault() { return ptdp::emu::detail::Fault(); }

using ptdp::rt::Bf16Bits;  // runtime/bf16.h: CUDA's round to nearest even, on the host
using ptdp::rt::Bf16Round;
using ptdp::rt::Bf16ToFloat;

float Load(const void* p, cudaDataType t, int64_t i) {
  return t == CUDA_R_16BF ? Bf16ToFloat(static_cast<const uint16_t*>(p)[i])
                          : static_cast<const float*>(p)[i];
}
void Store(void* p, cudaDataType t, int64_t i, float v) {
  if (t == CUDA_R_16BF) {
    static_cast<uint16_t*>(p)[i] = Bf16Bits(v);
  } else {
    static_cast<float*>(p)[i] = v;
  }
}
bool Supported(cudaDataType t) { return t == CUDA_R_32F || t == CUDA_R_16BF; }

// Column-major op(A) (m x k) op(B) (k x n) in fp32, each element a dot product in k order.
struct Matrix {
  int64_t rows, cols;
  std::vector<float> v;  // column-major
  float operator()(int64_t i, int64_t j) const { return v[size_t(i + j * rows)]; }
};
Matrix Product(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* a, cudaDataType at,
               int64_t lda, const void* b, cudaDataType bt, int64_t ldb, bool round_inputs) {
  std::vector<float> A(size_t(m * k)), B(size_t(n * k));  // row i of op(A), column j of op(B)
  for (int64_t i = 0; i < m; ++i)
    for (int64_t l = 0; l < k; ++l) {
      const float v = Load(a, at, ta ? l + i * lda : i + l * lda);
      A[size_t(i * k + l)] = round_inputs ? Bf16Round(v) : v;
    }
  for (int64_t j = 0; j < n; ++j)
    for (int64_t l = 0; l < k; ++l) {
      const float v = Load(b, bt, tb ? j + l * ldb : l + j * ldb);
      B[size_t(j * k + l)] = round_inputs ? Bf16Round(v) : v;
    }
  Matrix p{m, n, std::vector<float>(size_t(m * n))};
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      const float* x = &A[size_t(i * k)];
      const float* y = &B[size_t(j * k)];
      float sum = 0.0f;
      for (int64_t l = 0; l < k; ++l) sum += x[l] * y[l];
      p.v[size_t(i + j * m)] = sum;
    }
  return p;
}

float Gelu(float x) {
  const float c = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + std::tanh(c * (x + 0.044715f * x * x * x)));
}
float GeluGrad(float x) {
  const float c = 0.7978845608028654f;
  const float u = c * (x + 0.044715f * x * x * x);
  const float t = std::tanh(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * c * (1.0f + 3.0f * 0.044715f * x * x);
}

cublasStatus_t Gemm(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                    const void* alpha, const void* A, cudaDataType at, int64_t lda,
                    const void* B, cudaDataType bt, int64_t ldb, const void* beta, void* C,
                    cudaDataType ct, int64_t ldc, cublasComputeType_t compute) {
  if (m < 0 || n < 0 || k < 0 || !Supported(at) || !Supported(bt) || !Supported(ct))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_16BF)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
  if (lda < std::max(1, ta ? k : m) || ldb < std::max(1, tb ? n : k) || ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  const Matrix p = Product(ta, tb, m, n, k, A, at, lda, B, bt, ldb,
                                    compute == CUBLAS_COMPUTE_32F_FAST_16BF);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      float v = al * p(i, j);
      if (be != 0.0f) v += be * Load(C, ct, i + j * ldc);
      Store(C, ct, i + j * ldc, v);
    }
  return CUBLAS_STATUS_SUCCESS;
}

struct LtDesc {
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cublasOperation_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  void* aux = nullptr;
  int64_t aux_ld = 0;
};
struct LtLayout {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
};
std::map<const void*, LtDesc>& Descs() {
  static std::map<const void*, LtDesc> d;
  return d;
}
std::map<const void*, LtLayout>& Layouts() {
  static std::map<const void*, LtLayout> l;
  return l;
}

template <typename V>
bool Read(const void* buf, size_t size, V* out) {
  if (buf == nullptr || size != sizeof(V)) return false;
  std::memcpy(out, buf, sizeof(V));
  return true;
}

thread_local std::string nccl_last;
ncclResult_t NcclFail(ncclResult_t r, const std::string& why) {
  nccl_last = why;
  return r;
}
struct Comm {};
ncclComm_t NewComm() { return reinterpret_cast<ncclComm_t>(new Comm); }
ncclResult_t FreeComm(ncclComm_t c) {
  delete reinterpret_cast<Comm*>(c);
  return ncclSuccess;
}
size_t ElemBytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}
ncclResult_t CopyElems(void* dst, const void* src, size_t count, ncclDataType_t t) {
  const size_t size = ElemBytes(t);
  if (size == 0) return NcclFail(ncclInvalidArgument, "data type " + std::to_string(int(t)));
  if (dst != src && count > 0) std::memmove(dst, src, count * size);
  return ncclSuccess;
}
// Point-to-point in a one-rank communicator: to and from rank 0 itself, inside a group.
struct SelfCopy {
  void* ptr;
  size_t bytes;
};
thread_local int nccl_group_depth = 0;
thread_local std::vector<SelfCopy> nccl_sends, nccl_recvs;
ncclResult_t SelfTransfer(std::vector<SelfCopy>& queue, void* buf, size_t count, ncclDataType_t t,
                          int peer, const char* what) {
  if (peer != 0)
    return NcclFail(ncclInvalidArgument, std::string(what) + " peer " + std::to_string(peer) +
                                             " in a one-rank communicator");
  if (nccl_group_depth == 0)
    return NcclFail(ncclInvalidUsage, std::string(what) + " self outside a group (it would wait "
                                                          "for itself)");
  if (ElemBytes(t) == 0) return NcclFail(ncclInvalidArgument, "data type " + std::to_string(int(t)));
  queue.push_back(SelfCopy{buf, count * ElemBytes(t)});
  return ncclSuccess;
}

}  // namespace

extern "C" {

// ---- runtime: errors and versions ------------------------------------------------------------------
cudaError_t cudaGetLastError(void) {
  cudaError_t e = ptdp::emu::detail::LastError();  // a launch's error first
  if (e == cudaSuccess) e = runtime_error;
  runtime_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) {
  const cudaError_t e = KernelFault();
  return e != cudaSuccess ? e : runtime_error;
}
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    default: return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorLaunchFailure: return "unspecified launch failure (in the CUDA emulator)";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    default: return "unknown error";
  }
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}

// ---- runtime: devices -------------------------------------------------------------------------------
cudaError_t cudaGetDeviceCount(int* count) {
  *count = kDevices;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= kDevices) return Err(cudaErrorInvalidDevice);
  current_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = current_device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device < 0 || device >= kDevices) return Err(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "ptdp CUDA emulator (sm_90)");
  prop->totalGlobalMem = kDeviceBytes;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->sharedMemPerBlockOptin = 227 * 1024;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device < 0 || device >= kDevices) return Err(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMemoryPoolsSupported: *value = 1; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = 227 * 1024; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMultiProcessorCount: *value = 132; break;
    default: *value = 0; break;
  }
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
  ++stats.syncs;
  return KernelFault();
}
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  static CUmemPoolHandle_st the_pool;
  if (device < 0 || device >= kDevices) return Err(cudaErrorInvalidDevice);
  *pool = &the_pool;
  return cudaSuccess;
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, cudaMemPoolAttr, void*) { return cudaSuccess; }

// ---- runtime: memory ---------------------------------------------------------------------------------
cudaError_t cudaMalloc(void** p, size_t bytes) { return Allocate(p, bytes); }
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t) { return Allocate(p, bytes); }
cudaError_t cudaFree(void* p) { return Release(p); }
cudaError_t cudaFreeAsync(void* p, cudaStream_t) { return Release(p); }
cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  CountCopy(kind);
  ++stats.syncs;  // synchronous
  if (n > 0) std::memmove(dst, src, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t) {
  CountCopy(kind);
  if (n > 0) std::memmove(dst, src, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind, cudaStream_t) {
  CountCopy(kind);
  if (width > dpitch || width > spitch) return Err(cudaErrorInvalidPitchValue);
  for (size_t r = 0; r < height; ++r)
    std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
                 width);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int v, size_t n) {
  std::memset(p, v, n);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t) {
  std::memset(p, v, n);
  return cudaSuccess;
}

// ---- runtime: streams and events ---------------------------------------------------------------------
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  *s = new CUstream_st{current_device};
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  ++stats.syncs;
  return KernelFault();
}
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) { return cudaEventCreate(e); }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) { return cudaSuccess; }
cudaError_t cudaStreamQuery(cudaStream_t) { return KernelFault(); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  e->at = std::chrono::steady_clock::now();
  e->recorded = true;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) {
  ++stats.syncs;
  return KernelFault();
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  if (!a->recorded || !b->recorded) return Err(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(b->at - a->at).count();
  return cudaSuccess;
}

// ---- cuBLAS ----------------------------------------------------------------------------------------
cublasStatus_t cublasGetProperty(libraryPropertyType type, int* value) {
  *value = type == MAJOR_VERSION ? CUBLAS_VER_MAJOR
           : type == MINOR_VERSION ? CUBLAS_VER_MINOR
                                   : CUBLAS_VER_PATCH;
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_INTERNAL_ERROR";
  }
}
cublasStatus_t cublasCreate(cublasHandle_t* h) {
  *h = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace(cublasHandle_t, void*, size_t) { return CUBLAS_STATUS_SUCCESS; }

cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t transa, cublasOperation_t transb,
                            int m, int n, int k, const void* alpha, const void* A,
                            cudaDataType at, int lda, const void* B, cudaDataType bt, int ldb,
                            const void* beta, void* C, cudaDataType ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t) {
  ++stats.gemms;
  return Gemm(transa, transb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, compute);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void* alpha, const void* A, cudaDataType at,
                                          int lda, long long stride_a, const void* B,
                                          cudaDataType bt, int ldb, long long stride_b,
                                          const void* beta, void* C, cudaDataType ct, int ldc,
                                          long long stride_c, int batch,
                                          cublasComputeType_t compute, cublasGemmAlgo_t) {
  ++stats.gemms;
  auto at_ = [](const void* p, cudaDataType t, long long off) {
    return static_cast<const char*>(p) + off * (t == CUDA_R_16BF ? 2 : 4);
  };
  for (int i = 0; i < batch; ++i) {
    const cublasStatus_t s =
        Gemm(transa, transb, m, n, k, alpha, at_(A, at, i * stride_a), at, lda,
             at_(B, bt, i * stride_b), bt, ldb, beta,
             const_cast<char*>(at_(C, ct, i * stride_c)), ct, ldc, compute);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
  }
  return CUBLAS_STATUS_SUCCESS;
}

// ---- cuBLASLt ----------------------------------------------------------------------------------------
cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  *h = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  if (scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  *d = new cublasLtMatmulDescOpaque_t;
  std::lock_guard<std::mutex> lock(mu);
  Descs()[*d].compute = compute;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  {
    std::lock_guard<std::mutex> lock(mu);
    Descs().erase(d);
  }
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  std::lock_guard<std::mutex> lock(mu);
  LtDesc& x = Descs()[d];
  bool ok = false;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: ok = Read(buf, size, &x.transa); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: ok = Read(buf, size, &x.transb); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: ok = Read(buf, size, &x.epilogue); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: ok = Read(buf, size, &x.bias); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: ok = Read(buf, size, &x.aux); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: ok = Read(buf, size, &x.aux_ld); break;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (!Supported(type) || ld < int64_t(std::max<uint64_t>(1, rows)))
    return CUBLAS_STATUS_INVALID_VALUE;
  *l = new cublasLtMatrixLayoutOpaque_t;
  std::lock_guard<std::mutex> lock(mu);
  Layouts()[*l] = LtLayout{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  {
    std::lock_guard<std::mutex> lock(mu);
    Layouts().erase(l);
  }
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  *p = new cublasLtMatmulPreferenceOpaque_t;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t,
                                                    cublasLtMatmulPreferenceAttributes_t,
                                                    const void*, size_t) {
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatmulPreference_t, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* count) {
  if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
  results[0] = cublasLtMatmulHeuristicResult_t{};
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *count = 1;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t adesc, const void* B,
                              cublasLtMatrixLayout_t bdesc, const void* beta, const void* C,
                              cublasLtMatrixLayout_t cdesc, void* D, cublasLtMatrixLayout_t ddesc,
                              const cublasLtMatmulAlgo_t*, void*, size_t, cudaStream_t) {
  ++stats.lt_gemms;
  LtDesc x;
  LtLayout la, lb, lc, ld;
  {
    std::lock_guard<std::mutex> lock(mu);
    x = Descs().at(desc);
    la = Layouts().at(adesc);
    lb = Layouts().at(bdesc);
    lc = Layouts().at(cdesc);
    ld = Layouts().at(ddesc);
  }
  const bool ta = x.transa != CUBLAS_OP_N, tb = x.transb != CUBLAS_OP_N;
  const int64_t m = int64_t(ta ? la.cols : la.rows), k = int64_t(ta ? la.rows : la.cols);
  const int64_t n = int64_t(tb ? lb.rows : lb.cols);
  if (int64_t(tb ? lb.cols : lb.rows) != k || int64_t(ld.rows) != m || int64_t(ld.cols) != n ||
      lc.rows != ld.rows || lc.cols != ld.cols)
    return CUBLAS_STATUS_INVALID_VALUE;
  const bool bias = x.epilogue == CUBLASLT_EPILOGUE_BIAS || x.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool gelu_aux = x.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool dgelu = x.epilogue == CUBLASLT_EPILOGUE_DGELU;
  if (!bias && !dgelu && x.epilogue != CUBLASLT_EPILOGUE_DEFAULT) return CUBLAS_STATUS_NOT_SUPPORTED;
  if ((bias && x.bias == nullptr) || ((gelu_aux || dgelu) && (x.aux == nullptr || x.aux_ld < m)))
    return CUBLAS_STATUS_INVALID_VALUE;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  const Matrix p = Product(ta, tb, m, n, k, A, la.type, la.ld, B, lb.type, lb.ld,
                                    x.compute == CUBLAS_COMPUTE_32F_FAST_16BF);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      float v = al * p(i, j);
      if (be != 0.0f) v += be * Load(C, lc.type, i + j * lc.ld);
      if (bias) v += Load(x.bias, ld.type, i);  // the bias in D's type, one per row of D
      if (gelu_aux) {
        Store(x.aux, ld.type, i + j * x.aux_ld, v);
        v = Gelu(v);
      } else if (dgelu) {
        v *= GeluGrad(Load(x.aux, ld.type, i + j * x.aux_ld));
      }
      Store(D, ld.type, i + j * ld.ld, v);
    }
  return CUBLAS_STATUS_SUCCESS;
}

// ---- NCCL: communicators of one rank (the emulator has one device) ---------------------------------
ncclResult_t ncclGetVersion(int* version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}
const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    default: return "internal error";
  }
}
const char* ncclGetLastError(ncclComm_t) { return nccl_last.c_str(); }
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  *id = ncclUniqueId{};
  std::snprintf(id->internal, sizeof id->internal, "ptdp-cuda-emulator");
  return ncclSuccess;
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId, int rank,
                                    ncclConfig_t*) {
  if (nranks != 1 || rank != 0)
    return NcclFail(ncclInvalidUsage, "the CUDA emulator runs NCCL communicators of one rank (" +
                                          std::to_string(nranks) + " asked)");
  *comm = NewComm();
  return ncclSuccess;
}
ncclResult_t ncclCommSplit(ncclComm_t, int color, int, ncclComm_t* newcomm, ncclConfig_t*) {
  *newcomm = color == NCCL_SPLIT_NOCOLOR ? nullptr : NewComm();
  return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t, int* count) {
  *count = 1;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t, int* rank) {
  *rank = 0;
  return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* e) {
  *e = ncclSuccess;
  return ncclSuccess;
}
ncclResult_t ncclCommFinalize(ncclComm_t) { return ncclSuccess; }
ncclResult_t ncclCommDestroy(ncclComm_t comm) { return FreeComm(comm); }
ncclResult_t ncclCommAbort(ncclComm_t comm) { return FreeComm(comm); }
ncclResult_t ncclGroupStart() {
  ++nccl_group_depth;
  return ncclSuccess;
}
// The group's sends to self meet its receives from self in order, as NCCL pairs them.
ncclResult_t ncclGroupEnd() {
  if (nccl_group_depth == 0) return NcclFail(ncclInvalidUsage, "ncclGroupEnd without a start");
  if (--nccl_group_depth > 0) return ncclSuccess;
  std::vector<SelfCopy> sends, recvs;
  sends.swap(nccl_sends);
  recvs.swap(nccl_recvs);
  if (sends.size() != recvs.size())
    return NcclFail(ncclInvalidUsage, std::to_string(sends.size()) + " sends to self, " +
                                          std::to_string(recvs.size()) + " receives");
  for (size_t i = 0; i < sends.size(); ++i) {
    if (sends[i].bytes != recvs[i].bytes)
      return NcclFail(ncclInvalidUsage, "send and receive to self of different sizes");
    if (sends[i].bytes > 0) std::memmove(recvs[i].ptr, sends[i].ptr, sends[i].bytes);
  }
  return ncclSuccess;
}
// With one rank every collective is a copy of the input.
ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t t,
                           ncclRedOp_t, ncclComm_t, cudaStream_t) {
  ++stats.nccl;
  return CopyElems(recv, send, count, t);
}
ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t t,
                           ncclComm_t, cudaStream_t) {
  ++stats.nccl;
  return CopyElems(recv, send, count, t);
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t t,
                               ncclRedOp_t, ncclComm_t, cudaStream_t) {
  ++stats.nccl;
  return CopyElems(recv, send, count, t);
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t t, int root,
                           ncclComm_t, cudaStream_t) {
  ++stats.nccl;
  if (root != 0) return NcclFail(ncclInvalidArgument, "broadcast root " + std::to_string(root));
  return CopyElems(recv, send, count, t);
}
ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t,
                      cudaStream_t) {
  ++stats.nccl;
  return SelfTransfer(nccl_sends, const_cast<void*>(buf), count, t, peer, "send to");
}
ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t,
                      cudaStream_t) {
  ++stats.nccl;
  return SelfTransfer(nccl_recvs, buf, count, t, peer, "receive from");
}

}  // extern "C"
