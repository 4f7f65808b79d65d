// A CUDA emulator for the backend's own kernels (kernels.cu, flash_attention.cu, device_reduce.cu),
// so that every kernel runs and is checked on a machine without a GPU (README.md here; the GPU
// tests' emulated twins in tests/runtime/cuda, with fake_cuda.cc standing in for the CUDA
// libraries). The .cu files are compiled as C++ with this header included first
// (runtime/cuda/emu/CMakeLists.txt; to_cpp.pl rewrites each `kernel<<<grid, block, smem,
// stream>>>(args)` into `::ptdp::emu::Launch(kernel, grid, block, smem, stream)(args)` and each
// `extern __shared__ ... name[];` into a pointer to the launch's dynamic shared memory).
//
// What runs: every thread of a block is a fiber on the calling thread (emu.cc); a block's
// fibers run in turn, each until it reaches a barrier or a warp-collective operation, then the
// next; blocks run one after the other. So the kernels' index arithmetic, bounds, shared-memory
// layout, barriers and warp collectives run as written, on host memory (device pointers are host
// pointers here), and the sanitizers (make test-asan) see every out-of-bounds access.
//
// What is checked beyond the results (each a failure TakeFailure() returns and stderr shows, the
// kernel stopped):
// - a __syncthreads that not every thread of the block reaches (a thread that returned early, or
//   threads at different barriers), and warp collectives (__shfl_xor_sync, __syncwarp, ldmatrix,
//   mma.sync) that not all 32 lanes of the mask reach, or reach with different operations;
// - launch configurations CUDA rejects: block or grid dimensions out of range, dynamic shared
//   memory above 48 KiB without cudaFuncSetAttribute(MaxDynamicSharedMemorySize) raising the
//   kernel's limit, or above the device's 227 KiB (sm_90);
// - deadlock: a pass over the block's fibers in which none advances.
// Options (SetOptions; a host thread's first from PTDP_CUDA_EMU_SCHEDULE) vary what the hardware
// leaves free, so that races show as wrong results: the order in which a block's threads and the
// grid's blocks run (forward or reverse), and when a cp.async copy lands (at once, or only when
// cp.async.wait_group makes the thread wait for it: the latest a GPU may land it). Within a warp,
// WMMA loads read the tile when the first lane arrives and ldmatrix each row as its lane
// arrives, so a store not yet ordered by __syncwarp is not seen.
//
// What is not the GPU's: WMMA fragments hold the whole tile in every lane (the layout is
// unspecified by CUDA; our kernels only scale every element alike) and the product is computed
// once a warp; the tensor-core products (WMMA, mma.sync) sum in fp32 in k order; device math
// (expf, exp2f, rsqrtf, tanhf) is the host's; between warps memory is sequentially consistent. Results therefore match the GPU's
// within the tolerances of the GPU tests, not bit for bit; the GPU tests (tests/runtime/cuda)
// stay the judge of the device.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <vector_types.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace ptdp::emu {

// ---- options and the failure record -------------------------------------------------------------
struct Options {
  bool reverse = false;     // threads of a block and blocks of a grid in reverse order
  bool late_async = false;  // cp.async copies land at the cp.async.wait_group that waits for them
  bool report = true;       // print each failure to stderr as it happens
};
void SetOptions(const Options& o);
Options GetOptions();
// The first failure since the last call ("" if none), then cleared. A failed launch also sets the
// sticky error cudaGetLastError() returns (cudaErrorLaunchFailure, or the configuration error).
std::string TakeFailure();
// Kernel launches since the process started, by every thread.
int64_t Launches();

namespace detail {

struct Thread {
  uint3 thread_idx;
  uint3 block_idx;
};
const Thread& Current();
const dim3& BlockDim();
const dim3& GridDim();
unsigned char* DynamicShared();

// Runs `body` for every thread of every block (returns false after a failure).
using Body = void (*)(void* ctx);
void Run(const void* kernel, dim3 grid, dim3 block, size_t smem, Body body, void* ctx);
cudaError_t SetMaxDynamicShared(const void* kernel, int bytes);
cudaError_t LastError();  // cudaGetLastError: the launch error, configuration errors cleared
cudaError_t Fault();      // the sticky fault of a failed kernel (cudaSuccess if none), kept

void SyncThreads();
void SyncWarp(unsigned mask);
// A warp-collective operation: every lane of the warp deposits `in` (in_bytes <= 64) with the
// operation's id, waits for all lanes, then calls compute(all lanes' deposits, lane, out); the
// deposits stay valid until the warp's next collective.
using Compute = void (*)(const unsigned char (*in)[64], int lane, void* out, const void* extra);
void WarpCollective(int op, unsigned mask, const void* in, size_t in_bytes, Compute compute,
                    void* out, const void* extra);

// `f` run by every lane of the warp between two warp barriers: all lanes arrive, then each runs
// f, then none leaves before all have run it (a warp-wide memory operation such as WMMA's
// load_matrix_sync and store_matrix_sync: every lane reads before any lane writes after it).
template <typename F>
void WarpStep(int op, F&& f) {
  using Fn = std::remove_reference_t<F>;
  WarpCollective(
      op, 0xffffffffu, nullptr, 0,
      [](const unsigned char (*)[64], int, void* fn, const void*) { (*static_cast<Fn*>(fn))(); },
      const_cast<void*>(static_cast<const void*>(&f)), nullptr);
}

// A callable as a plain function and its object (what the out-of-line Impl functions take).
struct Callback {
  void (*call)(void*);
  void* f;
};
template <typename F>
Callback AsCallback(F& f) {
  return {[](void* fn) { (*static_cast<F*>(fn))(); }, const_cast<void*>(static_cast<const void*>(&f))};
}

// A warp-wide load: `f` (which reads memory into `bytes` <= 4096 at `out`) run by the first lane
// of the warp to arrive, before the others have (so before their earlier stores: without a
// __syncwarp those need not be visible, and here they are not); every lane then takes its copy.
void WarpLoadImpl(int op, Callback f, void* out, size_t bytes);
template <typename F>
void WarpLoad(int op, F&& f, void* out, size_t bytes) {
  WarpLoadImpl(op, AsCallback(f), out, bytes);
}

// `f` (which writes `bytes` <= 4096 at `out`) run by one lane of the warp, the others taking a
// copy of its result: for warp-wide operations whose inputs every lane holds alike (WMMA's
// mma_sync on whole-tile fragments), done once instead of 32 times.
void WarpOnceImpl(int op, Callback f, void* out, size_t bytes);
template <typename F>
void WarpOnce(int op, F&& f, void* out, size_t bytes) {
  WarpOnceImpl(op, AsCallback(f), out, bytes);
}

// cp.async: copy `src_bytes` (0..16) of src to dst and zero the rest of the 16 bytes.
void CpAsync16(void* dst, const void* src, int src_bytes);
void CpAsyncCommit();
void CpAsyncWait(int n);

template <typename T>
T ShflXor(unsigned mask, T v, int lane_mask) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  T out;
  WarpCollective(
      1, mask, &v, sizeof(T),
      [](const unsigned char (*in)[64], int lane, void* o, const void* extra) {
        const int partner = (lane ^ *static_cast<const int*>(extra)) & 31;
        std::memcpy(o, in[partner], sizeof(T));
      },
      &out, &lane_mask);
  return out;
}

}  // namespace detail

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 and
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, as PTX ISA specifies them (emu.cc).
void LdMatrixX4(uint32_t (&r)[4], const void* p, bool trans);
void Mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

// Kernel launch: Launch(kernel, grid, block, smem, stream)(args...).
template <typename... P>
struct Launcher {
  void (*kernel)(P...);
  dim3 grid, block;
  size_t smem;
  template <typename... A>
  void operator()(A&&... a) const {
    std::tuple<P...> args(std::forward<A>(a)...);
    struct Ctx {
      void (*kernel)(P...);
      std::tuple<P...>* args;
    } ctx{kernel, &args};
    detail::Run(
        reinterpret_cast<const void*>(kernel), grid, block, smem,
        [](void* c) {
          auto* x = static_cast<Ctx*>(c);
          std::tuple<P...> copy = *x->args;  // each thread its own copy of the parameters
          std::apply(x->kernel, copy);
        },
        &ctx);
  }
};
template <typename... P>
Launcher<P...> Launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem = 0,
                      cudaStream_t = nullptr) {
  return Launcher<P...>{kernel, grid, block, smem};
}

}  // namespace ptdp::emu

// ---- WMMA (nvcuda::wmma): every lane holds the whole tile --------------------------------------
// Loads read the tile once, when the first lane of the warp arrives (detail::WarpLoad: other
// lanes' stores not yet ordered by a __syncwarp are not seen); stores are warp steps
// (detail::WarpStep: every lane has arrived, so every lane's earlier load of the tile is done).
namespace nvcuda::wmma {
struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static constexpr int kRows = std::is_same_v<Use, matrix_b> ? K : M;
  static constexpr int kCols = std::is_same_v<Use, matrix_a> ? K : N;
  static constexpr int num_elements = kRows * kCols;
  T x[num_elements];  // element (r, c) at x[r * kCols + c]
};

template <typename Use, int M, int N, int K, typename T, typename L, typename V>
inline void fill_fragment(fragment<Use, M, N, K, T, L>& f, const V& v) {
  for (auto& e : f.x) e = T(v);
}
template <typename Use, int M, int N, int K, typename T, typename L>
inline void load_matrix_sync(fragment<Use, M, N, K, T, L>& f, const T* p, unsigned ld) {
  using F = fragment<Use, M, N, K, T, L>;
  ::ptdp::emu::detail::WarpLoad(
      6,
      [&] {
        for (int r = 0; r < F::kRows; ++r)
          for (int c = 0; c < F::kCols; ++c)
            f.x[r * F::kCols + c] =
                std::is_same_v<L, col_major> ? p[size_t(c) * ld + r] : p[size_t(r) * ld + c];
      },
      f.x, sizeof f.x);
}
template <int M, int N, int K, typename T>
inline void load_matrix_sync(fragment<accumulator, M, N, K, T>& f, const T* p, unsigned ld,
                             layout_t layout) {
  ::ptdp::emu::detail::WarpLoad(
      6,
      [&] {
        for (int r = 0; r < M; ++r)
          for (int c = 0; c < N; ++c)
            f.x[r * N + c] =
                layout == mem_col_major ? p[size_t(c) * ld + r] : p[size_t(r) * ld + c];
      },
      f.x, sizeof f.x);
}
template <int M, int N, int K, typename T>
inline void store_matrix_sync(T* p, const fragment<accumulator, M, N, K, T>& f, unsigned ld,
                              layout_t layout) {
  ::ptdp::emu::detail::WarpStep(7, [&] {
    for (int r = 0; r < M; ++r)
      for (int c = 0; c < N; ++c)
        (layout == mem_col_major ? p[size_t(c) * ld + r] : p[size_t(r) * ld + c]) = f.x[r * N + c];
  });
}
template <int M, int N, int K, typename A, typename LA, typename LB, typename C>
inline void mma_sync(fragment<accumulator, M, N, K, C>& d, const fragment<matrix_a, M, N, K, A, LA>& a,
                     const fragment<matrix_b, M, N, K, A, LB>& b,
                     const fragment<accumulator, M, N, K, C>& c) {
  fragment<accumulator, M, N, K, C> out;
  ::ptdp::emu::detail::WarpOnce(
      8,
      [&] {
        float fa[M * K], fb[K * N];
        for (int i = 0; i < M * K; ++i) fa[i] = float(a.x[i]);
        for (int i = 0; i < K * N; ++i) fb[i] = float(b.x[i]);
        for (int i = 0; i < M; ++i)
          for (int j = 0; j < N; ++j) {
            float sum = float(c.x[i * N + j]);
            for (int k = 0; k < K; ++k) sum += fa[i * K + k] * fb[k * N + j];
            out.x[i * N + j] = C(sum);
          }
      },
      &out, sizeof out);
  d = out;
}
}  // namespace nvcuda::wmma

// ---- the CUDA language, on the host ---------------------------------------------------------------
// cuda_runtime.h defines __global__, __device__, __host__ and __shared__ empty for a host
// compiler: shared memory becomes function statics, one per host thread (a thread runs one block
// at a time, all its CUDA threads as fibers; host threads, e.g. DeviceWorld's ranks, run their
// kernels side by side).
#undef __shared__
#define __shared__ static thread_local
#define __launch_bounds__(...)
#define threadIdx (::ptdp::emu::detail::Current().thread_idx)
#define blockIdx (::ptdp::emu::detail::Current().block_idx)
#define blockDim (::ptdp::emu::detail::BlockDim())
#define gridDim (::ptdp::emu::detail::GridDim())
#define cudaGetLastError() ::ptdp::emu::detail::LastError()
#define cudaFuncSetAttribute(kernel, attr, bytes)                                      \
  ((attr) == cudaFuncAttributeMaxDynamicSharedMemorySize                               \
       ? ::ptdp::emu::detail::SetMaxDynamicShared(reinterpret_cast<const void*>(kernel), \
                                                  (bytes))                             \
       : cudaSuccess)

inline void __syncthreads() { ::ptdp::emu::detail::SyncThreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::ptdp::emu::detail::SyncWarp(mask); }
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  return ::ptdp::emu::detail::ShflXor(mask, v, lane_mask);
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
