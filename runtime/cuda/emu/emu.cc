// The CUDA emulator's scheduler (cuda_emu.h): a block's threads as fibers, barriers, warp
// collectives, cp.async, ldmatrix and mma.sync.
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/bf16.h"
#include "runtime/cuda/emu/cuda_emu.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PTDP_EMU_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define PTDP_EMU_ASAN 1
#endif
#ifdef PTDP_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

// Switching between fibers: on x86-64 a few instructions that save the callee-saved registers
// and the floating-point control words, then swap stack pointers (glibc's swapcontext also saves
// the signal mask, a system call per switch, which made the emulator three times slower); on
// other machines ucontext.
#if defined(__x86_64__)
extern "C" void ptdp_emu_switch(void** save_sp, void* to_sp);
asm(R"(
  .text
  .globl ptdp_emu_switch
  .type ptdp_emu_switch, @function
ptdp_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size ptdp_emu_switch, .-ptdp_emu_switch
)");
#endif

namespace ptdp::emu {
namespace detail {

std::atomic<int64_t> total_launches{0};  // every thread's (Launches())

namespace {

struct Context {
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t uc;
#endif
};

void SwitchTo(Context& save, Context& to) {
#if defined(__x86_64__)
  ptdp_emu_switch(&save.sp, to.sp);
#else
  swapcontext(&save.uc, &to.uc);
#endif
}

// A fresh context that starts entry() on the stack [stack, stack + bytes); entry never returns.
void MakeContext(Context& c, char* stack, size_t bytes, void (*entry)()) {
#ifdef PTDP_EMU_ASAN
  ASAN_UNPOISON_MEMORY_REGION(stack, bytes);  // the redzones of the stack's previous fiber
#endif
#if defined(__x86_64__)
  auto top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t(15);
  auto* sp = reinterpret_cast<uint64_t*>(top);
  *--sp = 0;                                      // entry's return address: none (rsp % 16 == 8)
  *--sp = reinterpret_cast<uint64_t>(entry);      // where ptdp_emu_switch's ret goes
  for (int i = 0; i < 6; ++i) *--sp = 0;          // rbp, rbx, r12..r15
  uint32_t mxcsr;
  uint16_t fcw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fcw));
  *--sp = uint64_t(mxcsr) | (uint64_t(fcw) << 32);
  c.sp = sp;
#else
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
#endif
}

constexpr int kWarp = 32;
constexpr size_t kStackBytes = 512 * 1024;  // kernels keep register arrays on the fiber's stack
constexpr size_t kDefaultSmem = 48 * 1024;  // dynamic shared memory without the opt-in
constexpr size_t kMaxSmem = 227 * 1024;     // sm_90's opt-in limit per block

struct Copy {
  unsigned char* dst;
  const unsigned char* src;
  int src_bytes;
};

struct Fiber {
  Context ctx;
  std::unique_ptr<char[]> stack;
  Thread thread;
  bool done = false;
  // What the fiber waits at: 0 nothing, 1 the block's barrier, 2 its warp's; until the
  // barrier's generation passes wait_gen (the scheduler does not resume it before).
  int waiting = 0;
  uint64_t wait_gen = 0;
  std::vector<Copy> open_group;            // cp.async copies not yet committed
  std::deque<std::vector<Copy>> in_flight;  // committed groups, oldest first
  void* fake_stack = nullptr;                // AddressSanitizer's, while switched away
};

struct Warp {
  int lanes = 0;     // threads of the block in this warp
  int arrived = 0;   // lanes at the current phase
  uint64_t gen = 0;  // phases completed
  // Two banks of deposits, alternating from one collective to the next: a lane can deposit
  // for the next collective while others still read this one's (it cannot get two ahead: the
  // next collective waits for every lane), so one barrier a collective suffices.
  int op[2][kWarp] = {};
  unsigned char slot[2][kWarp][64] = {};
  unsigned char shared[4096] = {};     // WarpOnce's result
  unsigned char loaded[2][4096] = {};  // WarpLoad's tile, per bank
};

struct Emu {
  Options options;
  std::string failure;
  cudaError_t sticky = cudaSuccess;
  std::map<const void*, int> max_smem;  // cudaFuncSetAttribute per kernel

  // The running launch.
  bool running = false;
  dim3 grid, block;
  std::vector<unsigned char> smem;
  Body body = nullptr;
  void* body_ctx = nullptr;
  std::vector<Fiber> fibers;  // the first nthreads are this launch's block
  int nthreads = 0;
  int current = -1;
  Context scheduler;
  int exited = 0;
  int bar_arrived = 0;
  uint64_t bar_gen = 0;
  std::vector<Warp> warps;
  uint64_t progress = 0;
  bool abort = false;  // a failure: fibers stop at their next wait
  // AddressSanitizer: the scheduler's stack, for switching back to it.
  void* sched_fake_stack = nullptr;
  const void* main_bottom = nullptr;
  size_t main_size = 0;
};

// The options a host thread starts with: PTDP_CUDA_EMU_SCHEDULE = in-order (the default),
// reversed or late-cp-async (ctest runs the emulated GPU tests in each).
Options FromEnvironment() {
  Options o;
  const char* s = std::getenv("PTDP_CUDA_EMU_SCHEDULE");
  const std::string v = s ? s : "";
  if (v == "reversed") o.reverse = true;
  if (v == "late-cp-async") o.late_async = true;
  if (!v.empty() && v != "in-order" && v != "reversed" && v != "late-cp-async") {
    std::fprintf(stderr, "PTDP_CUDA_EMU_SCHEDULE '%s': expected in-order, reversed or late-cp-async\n",
                 v.c_str());
    std::abort();
  }
  return o;
}

// The calling thread's emulator. (Not initial-exec TLS, which would be cheaper: the emulated
// CUDA module is dlopen'ed, and the static TLS block has no room left for it then.)
Emu& E() {
  static thread_local Emu e;
  static thread_local bool configured = false;
  if (__builtin_expect(!configured, 0)) {
    e.options = FromEnvironment();
    configured = true;
  }
  return e;
}

void Fail(const std::string& what) {
  Emu& e = E();
  if (e.failure.empty()) {
    e.failure = what;
    // The backend above sees only cudaErrorLaunchFailure: say why where a person reads it.
    if (e.options.report) std::fprintf(stderr, "ptdp CUDA emulator: %s\n", what.c_str());
  }
  e.abort = true;
  e.sticky = cudaErrorLaunchFailure;
}

std::string Where() {
  const Emu& e = E();
  if (e.current < 0) return "";
  const Thread& t = e.fibers[size_t(e.current)].thread;
  char buf[128];
  std::snprintf(buf, sizeof buf, "block (%u, %u, %u) thread (%u, %u, %u)", t.block_idx.x,
                t.block_idx.y, t.block_idx.z, t.thread_idx.x, t.thread_idx.y, t.thread_idx.z);
  return buf;
}

// Back to the scheduler; returns when the scheduler resumes this fiber.
void Yield() {
  Emu& e = E();
  Fiber& f = e.fibers[size_t(e.current)];
#ifdef PTDP_EMU_ASAN
  __sanitizer_start_switch_fiber(&f.fake_stack, e.main_bottom, e.main_size);
#endif
  SwitchTo(f.ctx, e.scheduler);
#ifdef PTDP_EMU_ASAN
  __sanitizer_finish_switch_fiber(f.fake_stack, nullptr, nullptr);
#endif
}

// A fiber that must stop (after a failure) parks here for good: the scheduler never resumes it.
[[noreturn]] void Park() {
  for (;;) Yield();
}

void PerformCopies(const std::vector<Copy>& group) {
  for (const Copy& c : group) {
    if (c.src_bytes > 0) std::memcpy(c.dst, c.src, size_t(c.src_bytes));
    if (c.src_bytes < 16) std::memset(c.dst + c.src_bytes, 0, size_t(16 - c.src_bytes));
  }
}

void MaybeReleaseBarrier() {
  Emu& e = E();
  const int n = e.nthreads;
  if (e.bar_arrived > 0 && e.bar_arrived + e.exited == n) {
    if (e.exited > 0) {
      Fail("__syncthreads reached by " + std::to_string(e.bar_arrived) + " of " +
           std::to_string(n) + " threads: " + std::to_string(e.exited) +
           " returned before it (CUDA: undefined unless the whole block reaches it)");
      return;
    }
    e.bar_arrived = 0;
    ++e.bar_gen;
    ++e.progress;
  }
}

void ThreadMain() {
  Emu& e = E();
#ifdef PTDP_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &e.main_bottom, &e.main_size);
#endif
  e.body(e.body_ctx);
  Fiber& f = e.fibers[size_t(e.current)];
  // Copies still in flight land before the kernel ends.
  PerformCopies(f.open_group);
  for (const auto& g : f.in_flight) PerformCopies(g);
  f.open_group.clear();
  f.in_flight.clear();
  f.done = true;
  ++e.exited;
  ++e.progress;
  const Warp& w = e.warps[size_t(e.current / kWarp)];
  if (w.arrived > 0)
    Fail(Where() + " returned while its warp waits at a warp-collective operation");
  else
    MaybeReleaseBarrier();
#ifdef PTDP_EMU_ASAN
  __sanitizer_start_switch_fiber(nullptr, e.main_bottom, e.main_size);  // this stack is done
#endif
  Context done;
  SwitchTo(done, e.scheduler);  // never resumed
  std::abort();
}

void RunBlock(const uint3& block_idx) {
  Emu& e = E();
  const int n = int(e.block.x * e.block.y * e.block.z);
  e.exited = 0;
  e.bar_arrived = 0;
  e.warps.assign(size_t((n + kWarp - 1) / kWarp), Warp{});
  for (int w = 0; w < int(e.warps.size()); ++w) e.warps[size_t(w)].lanes = std::min(kWarp, n - w * kWarp);
  for (int i = 0; i < n; ++i) {
    Fiber& f = e.fibers[size_t(i)];
    f.thread.thread_idx = uint3{unsigned(i) % e.block.x, (unsigned(i) / e.block.x) % e.block.y,
                                unsigned(i) / (e.block.x * e.block.y)};
    f.thread.block_idx = block_idx;
    f.done = false;
    f.waiting = 0;
    f.open_group.clear();  // a stopped kernel's copies never land
    f.in_flight.clear();
    MakeContext(f.ctx, f.stack.get(), kStackBytes, ThreadMain);
  }
  int alive = n;
  while (alive > 0 && !e.abort) {
    const uint64_t before = e.progress;
    for (int k = 0; k < n && !e.abort; ++k) {
      const int i = e.options.reverse ? n - 1 - k : k;
      Fiber& f = e.fibers[size_t(i)];
      if (f.done) continue;
      // Still waiting: not resumed (it would only yield back).
      if (f.waiting == 1 && e.bar_gen == f.wait_gen) continue;
      if (f.waiting == 2 && e.warps[size_t(i / kWarp)].gen == f.wait_gen) continue;
      e.current = i;
#ifdef PTDP_EMU_ASAN
      __sanitizer_start_switch_fiber(&e.sched_fake_stack, f.stack.get(), kStackBytes);
#endif
      SwitchTo(e.scheduler, f.ctx);
#ifdef PTDP_EMU_ASAN
      __sanitizer_finish_switch_fiber(e.sched_fake_stack, nullptr, nullptr);
#endif
      e.current = -1;
      if (f.done) --alive;
    }
    if (alive > 0 && e.progress == before && !e.abort) {
      int at_barrier = 0, at_warp = 0;
      for (int i = 0; i < n; ++i)
        if (!e.fibers[size_t(i)].done) (e.fibers[size_t(i)].waiting == 1 ? at_barrier : at_warp) += 1;
      Fail("deadlock: " + std::to_string(at_barrier) + " threads wait at __syncthreads, " +
           std::to_string(at_warp) + " at warp-collective operations, " +
           std::to_string(e.exited) + " returned");
    }
  }
}

}  // namespace

const Thread& Current() {
  Emu& e = E();
  if (e.current < 0) {
    std::fprintf(stderr, "ptdp::emu: threadIdx outside a kernel\n");
    std::abort();
  }
  return e.fibers[size_t(e.current)].thread;
}
const dim3& BlockDim() { return E().block; }
const dim3& GridDim() { return E().grid; }
unsigned char* DynamicShared() { return E().smem.data(); }

cudaError_t SetMaxDynamicShared(const void* kernel, int bytes) {
  if (bytes < 0 || size_t(bytes) > kMaxSmem) return cudaErrorInvalidValue;
  E().max_smem[kernel] = bytes;
  return cudaSuccess;
}

cudaError_t LastError() {
  Emu& e = E();
  const cudaError_t s = e.sticky;
  // Configuration errors are not sticky in CUDA; launch failures (our failed checks) are.
  if (s == cudaErrorInvalidConfiguration || s == cudaErrorInvalidValue) e.sticky = cudaSuccess;
  return s;
}

cudaError_t Fault() {
  const cudaError_t s = E().sticky;
  return s == cudaErrorLaunchFailure ? s : cudaSuccess;
}

void Run(const void* kernel, dim3 grid, dim3 block, size_t smem, Body body, void* ctx) {
  Emu& e = E();
  if (e.running) {
    std::fprintf(stderr, "ptdp::emu: a kernel launched from inside a kernel\n");
    std::abort();
  }
  ++total_launches;
  if (e.sticky == cudaErrorLaunchFailure) return;  // a sticky fault: nothing runs any more
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  const bool bad_block = threads == 0 || threads > 1024 || block.z > 64;
  const bool bad_grid = grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 ||
                        grid.z > 65535 || grid.x > 2147483647u;
  if (bad_block || bad_grid) {
    e.sticky = cudaErrorInvalidConfiguration;
    if (e.failure.empty())
      e.failure = "invalid launch configuration: grid (" + std::to_string(grid.x) + ", " +
                  std::to_string(grid.y) + ", " + std::to_string(grid.z) + "), block (" +
                  std::to_string(block.x) + ", " + std::to_string(block.y) + ", " +
                  std::to_string(block.z) + ")";
    return;
  }
  auto it = e.max_smem.find(kernel);
  const size_t limit = it == e.max_smem.end() ? kDefaultSmem : size_t(it->second);
  if (smem > limit) {
    e.sticky = cudaErrorInvalidValue;
    if (e.failure.empty())
      e.failure = "dynamic shared memory " + std::to_string(smem) + " bytes above the kernel's " +
                  std::to_string(limit) + " (cudaFuncSetAttribute MaxDynamicSharedMemorySize)";
    return;
  }
  e.running = true;
  e.abort = false;
  e.grid = grid;
  e.block = block;
  // Fresh shared memory holds garbage on a GPU: fill it with a NaN pattern so that reading what
  // was never written shows.
  e.smem.assign(smem + 16, 0xff);
  e.body = body;
  e.body_ctx = ctx;
  // The fibers (and their stacks) of the largest block so far stay for the next launches.
  if (e.fibers.size() < threads) e.fibers.resize(threads);
  for (Fiber& f : e.fibers)
    if (!f.stack) f.stack.reset(new char[kStackBytes]);
  e.nthreads = int(threads);
  const uint64_t blocks = uint64_t(grid.x) * grid.y * grid.z;
  for (uint64_t k = 0; k < blocks && !e.abort; ++k) {
    const uint64_t b = e.options.reverse ? blocks - 1 - k : k;
    RunBlock(uint3{unsigned(b % grid.x), unsigned((b / grid.x) % grid.y),
                   unsigned(b / (uint64_t(grid.x) * grid.y))});
  }
  e.running = false;
}

namespace {
// Parks the calling fiber until `counter` (a barrier's generation) passes `gen`: kind 1 the
// block's barrier, 2 its warp's (what the scheduler checks before resuming it).
void WaitFor(Fiber& f, int kind, uint64_t gen, const uint64_t& counter) {
  f.waiting = kind;
  f.wait_gen = gen;
  while (counter == gen) {
    if (E().abort) Park();
    Yield();
  }
  f.waiting = 0;
}
}  // namespace

void SyncThreads() {
  Emu& e = E();
  Fiber& f = e.fibers[size_t(e.current)];
  const uint64_t gen = e.bar_gen;
  ++e.bar_arrived;
  ++e.progress;
  MaybeReleaseBarrier();
  WaitFor(f, 1, gen, e.bar_gen);
}

namespace {
// One phase of a warp's collective: wait until every lane of the warp arrived.
void WarpPhase(Warp& w) {
  Emu& e = E();
  const uint64_t gen = w.gen;
  ++w.arrived;
  ++e.progress;
  if (w.arrived == w.lanes) {
    w.arrived = 0;
    ++w.gen;
    return;
  }
  WaitFor(e.fibers[size_t(e.current)], 2, gen, w.gen);
}
}  // namespace

void WarpCollective(int op, unsigned mask, const void* in, size_t in_bytes, Compute compute,
                    void* out, const void* extra) {
  Emu& e = E();
  const int lane = e.current % kWarp;
  Warp& w = e.warps[size_t(e.current / kWarp)];
  const unsigned full = w.lanes == kWarp ? 0xffffffffu : (1u << w.lanes) - 1u;
  if (mask != 0xffffffffu && mask != full) {
    Fail(Where() + ": warp operation with mask " + std::to_string(mask) +
         " (the emulator takes whole warps only)");
    Park();
  }
  if (w.lanes != kWarp && mask == 0xffffffffu) {
    Fail(Where() + ": full-mask warp operation in a warp of " + std::to_string(w.lanes) +
         " threads");
    Park();
  }
  for (int l = 0; l < w.lanes; ++l) {
    const int t = (e.current / kWarp) * kWarp + l;
    if (e.fibers[size_t(t)].done) {
      Fail(Where() + ": warp operation while lane " + std::to_string(l) + " has returned");
      Park();
    }
  }
  const int bank = int(w.gen & 1);
  w.op[bank][lane] = op;
  if (in_bytes > 0) std::memcpy(w.slot[bank][lane], in, in_bytes);
  WarpPhase(w);
  for (int l = 0; l < w.lanes; ++l)
    if (w.op[bank][l] != op) {
      Fail(Where() + ": lanes of one warp at different warp operations (" + std::to_string(op) +
           " and " + std::to_string(w.op[bank][l]) + ")");
      Park();
    }
  if (compute != nullptr) compute(w.slot[bank], lane, out, extra);
}

void WarpOnceImpl(int op, Callback f, void* out, size_t bytes) {
  Emu& e = E();
  if (bytes > sizeof(Warp::shared)) {
    std::fprintf(stderr, "ptdp::emu: WarpOnce of %zu bytes\n", bytes);
    std::abort();
  }
  Warp& w = e.warps[size_t(e.current / kWarp)];
  struct Ctx {
    Callback f;
    void* out;
    size_t bytes;
    Warp* w;
  } ctx{f, out, bytes, &w};
  // All lanes arrive; then lane 0 computes and publishes.
  WarpCollective(op, 0xffffffffu, nullptr, 0,
                 [](const unsigned char (*)[64], int l, void* c, const void*) {
                   if (l != 0) return;
                   auto* x = static_cast<Ctx*>(c);
                   x->f.call(x->f.f);
                   std::memcpy(x->w->shared, x->out, x->bytes);
                 },
                 &ctx, nullptr);
  // All lanes arrive again (lane 0 has published); then the others copy its result. Lane 0
  // cannot publish again before they have: the next WarpOnce waits for every lane.
  WarpCollective(op, 0xffffffffu, nullptr, 0,
                 [](const unsigned char (*)[64], int l, void* c, const void*) {
                   if (l == 0) return;
                   auto* x = static_cast<Ctx*>(c);
                   std::memcpy(x->out, x->w->shared, x->bytes);
                 },
                 &ctx, nullptr);
}

void WarpLoadImpl(int op, Callback f, void* out, size_t bytes) {
  Emu& e = E();
  if (bytes > sizeof(Warp::loaded[0])) {
    std::fprintf(stderr, "ptdp::emu: WarpLoad of %zu bytes\n", bytes);
    std::abort();
  }
  Warp& w = e.warps[size_t(e.current / kWarp)];
  const int bank = int(w.gen & 1);  // the bank of the collective below (no yield in between)
  const bool first = w.arrived == 0;
  if (first) {
    f.call(f.f);
    std::memcpy(w.loaded[bank], out, bytes);
  }
  WarpCollective(op, 0xffffffffu, nullptr, 0, nullptr, nullptr, nullptr);
  if (!first) std::memcpy(out, w.loaded[bank], bytes);
}

void SyncWarp(unsigned mask) { WarpCollective(2, mask, nullptr, 0, nullptr, nullptr, nullptr); }

void CpAsync16(void* dst, const void* src, int src_bytes) {
  Emu& e = E();
  if (src_bytes < 0 || src_bytes > 16) {
    Fail(Where() + ": cp.async of " + std::to_string(src_bytes) + " bytes");
    Park();
  }
  if ((reinterpret_cast<uintptr_t>(dst) & 15) != 0 ||
      (src_bytes > 0 && (reinterpret_cast<uintptr_t>(src) & 15) != 0)) {
    Fail(Where() + ": cp.async.cg with an address not on a 16-byte boundary");
    Park();
  }
  const unsigned char* base = e.smem.data();
  if (static_cast<unsigned char*>(dst) < base || static_cast<unsigned char*>(dst) + 16 > base + e.smem.size() - 16) {
    Fail(Where() + ": cp.async destination outside the block's dynamic shared memory");
    Park();
  }
  const Copy c{static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src), src_bytes};
  if (!e.options.late_async) {
    PerformCopies({c});
    return;
  }
  e.fibers[size_t(e.current)].open_group.push_back(c);
}

void CpAsyncCommit() {
  Emu& e = E();
  Fiber& f = e.fibers[size_t(e.current)];
  f.in_flight.push_back(std::move(f.open_group));
  f.open_group.clear();
}

void CpAsyncWait(int n) {
  Emu& e = E();
  Fiber& f = e.fibers[size_t(e.current)];
  while (int(f.in_flight.size()) > n) {
    PerformCopies(f.in_flight.front());
    f.in_flight.pop_front();
  }
}

}  // namespace detail

void SetOptions(const Options& o) { detail::E().options = o; }
Options GetOptions() { return detail::E().options; }
std::string TakeFailure() {
  std::string f;
  f.swap(detail::E().failure);
  if (detail::E().sticky == cudaErrorLaunchFailure) detail::E().sticky = cudaSuccess;
  return f;
}
int64_t Launches() { return detail::total_launches.load(); }

// ---- ldmatrix and mma.sync, as PTX ISA defines them -------------------------------------------
namespace {

// The two bf16 halves of a 32-bit register, the lower first (runtime/bf16.h).
float Bf16Lo(uint32_t r) { return rt::Bf16ToFloat(uint16_t(r & 0xffffu)); }
float Bf16Hi(uint32_t r) { return rt::Bf16ToFloat(uint16_t(r >> 16)); }

struct MmaIn {
  float c[4];
  uint32_t a[4];
  uint32_t b[2];
};
static_assert(sizeof(MmaIn) <= 64);

}  // namespace

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane l gives the address of row l % 8 of
// 8x8 matrix l / 8 (8 consecutive 16-bit elements, 16-byte aligned); register i of lane 4g + t
// receives matrix i's elements (g, 2t) and (g, 2t + 1), or with .trans (2t, g) and (2t + 1, g),
// the smaller column (row) in the low half.
void LdMatrixX4(uint32_t (&r)[4], const void* p, bool trans) {
  if ((reinterpret_cast<uintptr_t>(p) & 15) != 0) {
    detail::Fail(detail::Where() + ": ldmatrix row address not on a 16-byte boundary");
    detail::Park();
  }
  // Each lane's row is read as the lane arrives: a row another lane has yet to store (no
  // __syncwarp or __syncthreads between) is read as it was.
  uint16_t row[8];
  std::memcpy(row, p, sizeof row);
  detail::WarpCollective(
      trans ? 4 : 3, 0xffffffffu, row, sizeof row,
      [](const unsigned char (*in)[64], int lane, void* out, const void* extra) {
        const bool tr = *static_cast<const bool*>(extra);
        auto* reg = static_cast<uint32_t*>(out);
        const int g = lane / 4, t = lane % 4;
        for (int i = 0; i < 4; ++i) {
          uint16_t h[2];
          for (int e = 0; e < 2; ++e) {
            const int rw = tr ? 2 * t + e : g, col = tr ? g : 2 * t + e;
            std::memcpy(&h[e], in[8 * i + rw] + 2 * col, 2);
          }
          reg[i] = uint32_t(h[0]) | (uint32_t(h[1]) << 16);
        }
      },
      r, &trans);
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, d = a b + c; lane 4g + t holds
// a: {a0, a1} (g, 2t..2t+1), {a2, a3} (g+8, 2t..), {a4, a5} (g, 2t+8..), {a6, a7} (g+8, 2t+8..);
// b: {b0, b1} (k 2t..2t+1, n g), {b2, b3} (k 2t+8.., n g); c, d: c0, c1 (g, 2t..2t+1),
// c2, c3 (g+8, 2t..2t+1). Products summed in fp32 in k order onto c.
void Mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  MmaIn in;
  std::memcpy(in.c, c, sizeof in.c);
  std::memcpy(in.a, a, sizeof in.a);
  in.b[0] = b0;
  in.b[1] = b1;
  detail::WarpCollective(
      5, 0xffffffffu, &in, sizeof in,
      [](const unsigned char (*slots)[64], int lane, void* out, const void*) {
        float A[16][16], B[16][8];
        for (int l = 0; l < 32; ++l) {
          MmaIn x;
          std::memcpy(&x, slots[l], sizeof x);
          const int g = l / 4, t = l % 4;
          A[g][2 * t] = Bf16Lo(x.a[0]);
          A[g][2 * t + 1] = Bf16Hi(x.a[0]);
          A[g + 8][2 * t] = Bf16Lo(x.a[1]);
          A[g + 8][2 * t + 1] = Bf16Hi(x.a[1]);
          A[g][2 * t + 8] = Bf16Lo(x.a[2]);
          A[g][2 * t + 9] = Bf16Hi(x.a[2]);
          A[g + 8][2 * t + 8] = Bf16Lo(x.a[3]);
          A[g + 8][2 * t + 9] = Bf16Hi(x.a[3]);
          B[2 * t][g] = Bf16Lo(x.b[0]);
          B[2 * t + 1][g] = Bf16Hi(x.b[0]);
          B[2 * t + 8][g] = Bf16Lo(x.b[1]);
          B[2 * t + 9][g] = Bf16Hi(x.b[1]);
        }
        MmaIn mine;
        std::memcpy(&mine, slots[lane], sizeof mine);
        const int g = lane / 4, t = lane % 4;
        auto* d = static_cast<float*>(out);
        for (int e = 0; e < 4; ++e) {
          const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
          float sum = mine.c[e];
          for (int k = 0; k < 16; ++k) sum += A[row][k] * B[k][col];
          d[e] = sum;
        }
      },
      c, nullptr);
}

}  // namespace ptdp::emu
