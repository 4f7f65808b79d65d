// The rendezvous core: rank threads meet in a per-group rendezvous (collectives) or per
// (src, dst) mailboxes (p2p) and move bytes straight between each other's buffers through their
// RankPlanes. n is the group size; i, r are group ranks.
#include "runtime/rendezvous.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

namespace ptdp::rt {
namespace {

enum class OpKind { kNone, kAllReduce, kAllGather, kReduceScatter, kBroadcast, kBarrier, kSend,
                    kRecv };

const char* OpName(OpKind k) {
  switch (k) {
    case OpKind::kNone: return "none";
    case OpKind::kAllReduce: return "all-reduce";
    case OpKind::kAllGather: return "all-gather";
    case OpKind::kReduceScatter: return "reduce-scatter";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kBarrier: return "barrier";
    case OpKind::kSend: return "send";
    case OpKind::kRecv: return "recv";
  }
  return "?";
}

// One rank's collective call; every member of the group must make an equal one.
struct CollDesc {
  OpKind kind = OpKind::kNone;
  DType dtype = DType::kF32;
  int64_t count = 0;                 // elements of this rank's input
  ReduceOp reduce = ReduceOp::kSum;  // all-reduce, reduce-scatter
  int root = 0;                      // broadcast

  bool operator==(const CollDesc& o) const {
    bool reduces = kind == OpKind::kAllReduce || kind == OpKind::kReduceScatter;
    return kind == o.kind && dtype == o.dtype && count == o.count &&
           (!reduces || reduce == o.reduce) && (kind != OpKind::kBroadcast || root == o.root);
  }
  // e.g. "sum of 4 x f32", "4 x f32 from rank 2"; root_global maps the broadcast root.
  std::string Args(int root_global) const {
    std::ostringstream s;
    if (kind == OpKind::kBarrier) return "no data";
    if (kind == OpKind::kAllReduce || kind == OpKind::kReduceScatter)
      s << ToString(reduce) << " of ";
    s << count << " x " << ToString(dtype);
    if (kind == OpKind::kBroadcast) s << " from rank " << root_global;
    return s.str();
  }
};

struct GroupState;

// What a global rank is doing or did last, for timeout messages.
struct Activity {
  const GroupState* group = nullptr;  // nullptr: no call yet
  OpKind kind = OpKind::kNone;
  int64_t seq = 0;       // collective number on the group, or message number to/from peer
  int peer_global = -1;  // p2p only
  bool waiting = false;  // inside the call (else returned from it)
};

// A posted send. It lives in the sender's GroupEnd until done; the mailbox holds a pointer.
struct Message {
  const void* data = nullptr;
  size_t bytes = 0;
  DType dtype = DType::kF32;
  int64_t count = 0;
  int64_t seq = 0;     // 1-based number of this message from src to dst
  bool taken = false;  // the receiver popped it and is copying
  bool done = false;   // the receiver finished copying
};

// One rank's buffers in the current collective.
struct Slot {
  CollDesc desc;
  const void* in = nullptr;
  void* out = nullptr;
  bool arrived = false;
};

struct GroupState {
  std::vector<int> ranks;  // global ranks in group-rank order
  std::string name;        // "[0,2] (TP)"
  std::mutex mu;
  std::condition_variable cv;
  // Bumped (under mu) with every notify, so that a spinning waiter sees a change without the lock.
  std::atomic<uint64_t> epoch{0};
  std::string failure;  // non-empty once the group failed (guarded by mu)

  // Holding mu: wakes every waiter, spinning or sleeping.
  void Notify() {
    epoch.fetch_add(1, std::memory_order_release);
    cv.notify_all();
  }

  // Collective rendezvous: generation `gen` gathers (arrived < n), runs (all arrived), and ends
  // when the last member finished computing, which advances gen.
  uint64_t gen = 0;
  int arrived = 0;
  int computed = 0;
  bool running = false;
  std::vector<Slot> slots;        // per member
  std::vector<int64_t> coll_seq;  // per member: collectives called so far
  // All-reduce result, filled chunk by chunk: plane memory, grown by the last member to arrive.
  std::shared_ptr<void> scratch;
  size_t scratch_bytes = 0;

  // p2p: mailbox[src * n + dst] holds src's posted sends to dst, FIFO.
  std::vector<std::deque<Message*>> mailbox;
  std::vector<int64_t> sent, received;  // per (src, dst): messages posted / taken so far

  int size() const { return int(ranks.size()); }
};

// "0, 1, 2"
std::string JoinRanks(const std::vector<int>& ranks, const char* sep = ", ") {
  std::string s;
  for (size_t k = 0; k < ranks.size(); ++k) s += (k ? sep : "") + std::to_string(ranks[k]);
  return s;
}
// "[0,2]"
std::string RankList(const std::vector<int>& ranks) { return "[" + JoinRanks(ranks, ",") + "]"; }

// [lo, hi) of block i when `count` elements are split into n nearly equal blocks.
std::pair<int64_t, int64_t> Chunk(int64_t count, int n, int i) {
  return {count * i / n, count * (i + 1) / n};
}

const char* At(const void* p, size_t offset_bytes) {
  return static_cast<const char*>(p) + offset_bytes;
}
char* At(void* p, size_t offset_bytes) { return static_cast<char*>(p) + offset_bytes; }

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Takes `mu`, first polling try_lock for a few microseconds when `spin`. Why: a std::mutex that
// is held puts the caller to sleep in the kernel and its holder's unlock must wake it; on the
// dev VM that costs the waker a system call and the sleeper tens of microseconds (a halted
// vCPU), while the sections these mutexes guard last a microsecond or two. Two ranks entering
// the same exchange contend for its group's mutex every time (issue 16: ep2's all-to-alls took
// 40-70 us against 25-35 us in the microbenchmark). No spinning when ranks outnumber cores.
void LockSpinning(std::mutex& mu, bool spin) {
  if (spin)
    for (int i = 0; i < 4096; ++i) {
      if (mu.try_lock()) return;
      CpuRelax();
    }
  mu.lock();
}
// Locks the (unlocked) unique_lock's mutex as LockSpinning does.
void RelockSpinning(std::unique_lock<std::mutex>& lk, bool spin) {
  std::mutex* mu = lk.mutex();
  LockSpinning(*mu, spin);
  lk = std::unique_lock<std::mutex>(*mu, std::adopt_lock);
}

}  // namespace

struct Rendezvous::State {
  int size = 0;
  double timeout_s = 0;
  double spin_s = 0;  // how long a waiting rank spins before it sleeps
  std::string name;
  std::mutex mu;  // guards groups and activity; never held while taking a group's mu
  std::map<std::pair<std::string, std::vector<int>>, std::unique_ptr<GroupState>> groups;
  std::vector<Activity> activity;  // per global rank

  std::string Describe(int global_rank) {
    LockSpinning(mu, spin_s > 0);
    std::lock_guard<std::mutex> lk(mu, std::adopt_lock);
    const Activity& a = activity[size_t(global_rank)];
    if (a.group == nullptr) return "has not called any operation yet";
    std::ostringstream s;
    s << (a.waiting ? "is waiting in " : "returned from ") << OpName(a.kind) << " #" << a.seq;
    if (a.kind == OpKind::kSend) s << " to rank " << a.peer_global;
    if (a.kind == OpKind::kRecv) s << " from rank " << a.peer_global;
    s << " on group " << a.group->name;
    return s.str();
  }
  void Set(int global_rank, Activity a) {
    LockSpinning(mu, spin_s > 0);
    std::lock_guard<std::mutex> lk(mu, std::adopt_lock);
    activity[size_t(global_rank)] = a;
  }
  void SetWaiting(int global_rank, bool waiting) {
    LockSpinning(mu, spin_s > 0);
    std::lock_guard<std::mutex> lk(mu, std::adopt_lock);
    activity[size_t(global_rank)].waiting = waiting;
  }
};

namespace {

using State = Rendezvous::State;

// One call of the p2p part of GroupEnd: a send or a receive.
struct P2pOp {
  bool send = false;
  Tensor t;  // shares the caller's buffer: a recv writes the caller's memory
  int peer = 0;
};

class RendezvousCommunicator final : public Communicator {
 public:
  RendezvousCommunicator(std::shared_ptr<State> world, GroupState* g, int me, std::string label,
                         std::unique_ptr<RankPlane> plane)
      : w_(std::move(world)), g_(*g), me_(me), global_(g->ranks[size_t(me)]),
        label_(std::move(label)), plane_(std::move(plane)) {}

  int rank() const override { return me_; }
  int size() const override { return g_.size(); }
  const std::vector<int>& ranks() const override { return g_.ranks; }
  const std::string& label() const override { return label_; }

  Status AllReduce(Tensor& t, ReduceOp op) override {
    if (Status s = CheckDefined(OpKind::kAllReduce, t); !s.ok()) return s;
    if (!Reduces(t.dtype())) return Unsupported(OpKind::kAllReduce, t.dtype());
    return Collective({OpKind::kAllReduce, t.dtype(), t.numel(), op, 0}, t.data(), t.data());
  }

  Status AllGather(const Tensor& in, Tensor& out) override {
    if (Status s = CheckDefined(OpKind::kAllGather, in, out); !s.ok()) return s;
    if (out.dtype() != in.dtype() || out.numel() != size() * in.numel())
      return Fail(LocalError(OpKind::kAllGather, "out " + out.shape().ToString() + " " +
                                                     ToString(out.dtype()) + " is not " +
                                                     std::to_string(size()) + " x in " +
                                                     in.shape().ToString() + " " +
                                                     ToString(in.dtype())));
    return Collective({OpKind::kAllGather, in.dtype(), in.numel(), ReduceOp::kSum, 0}, in.data(),
                      out.data());
  }

  Status ReduceScatter(const Tensor& in, Tensor& out, ReduceOp op) override {
    if (Status s = CheckDefined(OpKind::kReduceScatter, in, out); !s.ok()) return s;
    if (!Reduces(in.dtype())) return Unsupported(OpKind::kReduceScatter, in.dtype());
    if (out.dtype() != in.dtype() || in.numel() != size() * out.numel())
      return Fail(LocalError(OpKind::kReduceScatter, "in " + in.shape().ToString() + " " +
                                                         ToString(in.dtype()) + " is not " +
                                                         std::to_string(size()) + " x out " +
                                                         out.shape().ToString() + " " +
                                                         ToString(out.dtype())));
    return Collective({OpKind::kReduceScatter, in.dtype(), in.numel(), op, 0}, in.data(),
                      out.data());
  }

  Status Broadcast(Tensor& t, int root) override {
    if (Status s = CheckDefined(OpKind::kBroadcast, t); !s.ok()) return s;
    if (root < 0 || root >= size())
      return Fail(LocalError(OpKind::kBroadcast,
                             "root " + std::to_string(root) + " is not a group rank"));
    return Collective({OpKind::kBroadcast, t.dtype(), t.numel(), ReduceOp::kSum, root}, t.data(),
                      t.data());
  }

  Status Barrier() override {
    return Collective({OpKind::kBarrier, DType::kF32, 0, ReduceOp::kSum, 0}, nullptr, nullptr);
  }

  Status Send(const Tensor& t, int peer) override { return P2p({true, t, peer}); }
  Status Recv(Tensor& t, int peer) override { return P2p({false, t, peer}); }

  Status GroupStart() override {
    ++depth_;
    return Status::Ok();
  }

  Status GroupEnd() override {
    if (depth_ == 0)
      return Fail(Prefix() + "GroupEnd() without GroupStart() on group " + g_.name);
    if (--depth_ > 0) return Status::Ok();
    std::vector<P2pOp> ops = std::move(pending_);
    pending_.clear();
    return RunP2p(ops);
  }

 private:
  std::string Prefix() const {
    return w_->name + ": rank " + std::to_string(global_) + ": ";
  }
  std::string LocalError(OpKind k, const std::string& what) const {
    return Prefix() + OpName(k) + " on group " + g_.name + ": " + what;
  }
  bool Reduces(DType d) const {
    std::vector<DType> ok = plane_->ReduceDTypes();
    return std::find(ok.begin(), ok.end(), d) != ok.end();
  }
  Status Unsupported(OpKind k, DType d) {
    std::string takes;
    for (DType x : plane_->ReduceDTypes()) takes += (takes.empty() ? "" : ", ") + std::string(ToString(x));
    return Fail(LocalError(k, std::string("dtype ") + ToString(d) +
                                  " is not supported (reductions take " + takes + ")"));
  }
  Status CheckDefined(OpKind k, const Tensor& a) { return CheckDefined(k, a, a); }
  Status CheckDefined(OpKind k, const Tensor& a, const Tensor& b) {
    if (!a.defined() || !b.defined()) return Fail(LocalError(k, "undefined tensor"));
    if (depth_ > 0)
      return Fail(LocalError(k, "collective between GroupStart() and GroupEnd()"));
    return Status::Ok();
  }

  // Fails the group with `message` (keeping an earlier failure's message) and wakes every rank
  // waiting on it.
  Status Fail(const std::string& message) {
    LockSpinning(g_.mu, Spins());
    std::lock_guard<std::mutex> lk(g_.mu, std::adopt_lock);
    return FailLocked(message);
  }
  Status FailLocked(const std::string& message) {
    if (g_.failure.empty()) g_.failure = message;
    g_.Notify();
    return Status::Error(message);
  }
  // A failed plane operation fails the group; the message names the operation.
  std::string PlaneError(OpKind k, const Status& s) const {
    return LocalError(k, "data plane: " + s.message());
  }
  // The error of a call on a group that had already failed.
  Status Refused(OpKind k) const {
    return Status::Error(Prefix() + OpName(k) + " on group " + g_.name +
                         " refused: the group failed earlier: " + g_.failure);
  }
  std::chrono::nanoseconds Timeout() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::duration<double>(w_->timeout_s));
  }
  // Waits until pred() holds (evaluated holding the lock) or `timeout` passed; returns pred().
  // A waiter first spins for up to the world's spin_s, watching the group's epoch without the
  // lock, and only then sleeps on the condition variable. Why: a rank that sleeps is woken by the
  // kernel, and on a virtual machine a vCPU that halted during a wait of more than some 50-200 us
  // takes tens of microseconds to come back (measured on the 2-core dev VM: 2.5 us after a 50 us
  // wait, 37-42 us after 1-3 ms, with a tail past 0.5 ms), more on a busy host. A training step
  // waits hundreds of times (each TP collective, each pipeline transfer), so that latency lands
  // in step times but not in the microbenchmarks' back-to-back calls. NCCL's kernels and MPI's
  // progress engines poll for the same reason. spin_s is 0 when the world has more ranks than
  // cores (Rendezvous::DefaultSpinSeconds), where a spinning rank would take a working one's core.
  template <class Pred>
  bool WaitFor(std::unique_lock<std::mutex>& lk, std::chrono::nanoseconds timeout, Pred pred) {
    const auto start = std::chrono::steady_clock::now();
    if (pred() || Spin(lk, start + std::min(timeout, SpinTime()), pred)) return true;
    return g_.cv.wait_until(lk, start + timeout, pred);
  }
  // As WaitFor, without a timeout.
  template <class Pred>
  void Wait(std::unique_lock<std::mutex>& lk, Pred pred) {
    if (pred() || Spin(lk, std::chrono::steady_clock::now() + SpinTime(), pred)) return;
    g_.cv.wait(lk, pred);
  }
  bool Spins() const { return w_->spin_s > 0; }
  std::chrono::nanoseconds SpinTime() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::duration<double>(w_->spin_s));
  }
  // Holding the lock on entry and exit: polls the group's epoch without it until pred() holds
  // (true) or `end` passed (false).
  template <class Pred>
  bool Spin(std::unique_lock<std::mutex>& lk, std::chrono::steady_clock::time_point end,
            Pred pred) {
    int polls = 0;
    while (std::chrono::steady_clock::now() < end) {
      const uint64_t seen = g_.epoch.load(std::memory_order_acquire);
      lk.unlock();
      while (g_.epoch.load(std::memory_order_acquire) == seen) {
        // Pause first (a peer usually answers within microseconds), then yield, so that a rank
        // spinning on a machine shared with other work gives its core away.
        if (++polls < 2048) {
          CpuRelax();
        } else {
          std::this_thread::yield();
        }
        if ((polls & 63) == 0 && std::chrono::steady_clock::now() >= end) break;
      }
      RelockSpinning(lk, true);
      if (pred()) return true;
    }
    return false;
  }

  std::string TimeoutText() const {
    std::ostringstream s;
    s << "timed out after " << w_->timeout_s << " s";
    return s.str();
  }

  // ---- Collectives

  Status Collective(const CollDesc& d, const void* in, void* out) {
    // Peers read `in` (and the root's buffer) once all arrived: it must be complete by then.
    if (Status s = plane_->Publish(); !s.ok()) return Fail(PlaneError(d.kind, s));
    LockSpinning(g_.mu, Spins());
    std::unique_lock<std::mutex> lk(g_.mu, std::adopt_lock);
    if (!g_.failure.empty()) return Refused(d.kind);
    int n = size();
    int64_t seq = ++g_.coll_seq[size_t(me_)];
    w_->Set(global_, {&g_, d.kind, seq, -1, true});
    uint64_t gen = g_.gen;
    g_.slots[size_t(me_)] = {d, in, out, true};
    if (++g_.arrived == n) {
      if (Status s = CheckMatch(seq); !s.ok()) return s;
      if (Status s = GrowScratch(d); !s.ok()) return s;
      g_.running = true;
      g_.Notify();
    } else {
      bool ready = WaitFor(lk, Timeout(), [&] {
        return (g_.running && g_.gen == gen) || !g_.failure.empty();
      });
      if (!ready) return FailLocked(CollectiveTimeout(d, seq));
      if (!g_.running || g_.gen != gen) {  // failed by another rank while gathering
        w_->SetWaiting(global_, false);
        return Status::Error(g_.failure);
      }
    }
    lk.unlock();

    // Finish even after a failed share: whatever was enqueued must stop reading the peers'
    // buffers before the barrier lets them go.
    Status computed = Compute(d);
    const Status finished = plane_->Finish();
    if (computed.ok()) computed = finished;

    // Second barrier: nobody returns (and frees or overwrites its buffers) before all have read
    // them. No timeout: every member has arrived, so every member finishes. A member whose
    // share failed fails the group, so that no member takes a result with a hole in it.
    RelockSpinning(lk, Spins());
    if (!computed.ok()) FailLocked(PlaneError(d.kind, computed));
    if (++g_.computed == n) {
      for (Slot& s : g_.slots) s.arrived = false;
      g_.arrived = g_.computed = 0;
      g_.running = false;
      ++g_.gen;
      g_.Notify();
    } else {
      Wait(lk, [&] { return g_.gen != gen; });
    }
    const std::string failure = g_.failure;
    lk.unlock();
    if (!failure.empty()) {
      w_->SetWaiting(global_, false);
      return Status::Error(failure);
    }
    Status st = CopyOut(d, out);
    w_->SetWaiting(global_, false);
    return st.ok() ? st : Fail(PlaneError(d.kind, st));
  }

  // Called by the last member to arrive (holding mu): room for an all-reduce result.
  Status GrowScratch(const CollDesc& d) {
    size_t bytes = size_t(d.count) * DTypeBytes(d.dtype);
    if (d.kind != OpKind::kAllReduce || bytes <= g_.scratch_bytes) return Status::Ok();
    g_.scratch.reset();  // every member finished with it: they all arrived here
    g_.scratch_bytes = 0;
    Result<std::shared_ptr<void>> mem = plane_->Allocate(bytes);
    if (!mem.ok()) {
      w_->SetWaiting(global_, false);
      return FailLocked(PlaneError(d.kind, mem.status()));
    }
    g_.scratch = std::move(mem).value();
    g_.scratch_bytes = bytes;
    return Status::Ok();
  }

  // This rank's share of the work, reading the other ranks' buffers (all members have arrived).
  Status Compute(const CollDesc& d) {
    int n = size();
    size_t elem = DTypeBytes(d.dtype);
    std::vector<const void*> in(static_cast<size_t>(n), nullptr);
    switch (d.kind) {
      case OpKind::kAllReduce: {  // chunk me_ of the shared result
        auto [lo, hi] = Chunk(d.count, n, me_);
        if (hi == lo) return Status::Ok();
        for (int r = 0; r < n; ++r) in[size_t(r)] = At(g_.slots[size_t(r)].in, size_t(lo) * elem);
        return plane_->Reduce(At(g_.scratch.get(), size_t(lo) * elem), in, hi - lo, d.dtype,
                              d.reduce);
      }
      case OpKind::kReduceScatter: {  // block me_, into tmp_ until the others stop reading
        int64_t block = d.count / n;
        if (block == 0) return Status::Ok();
        for (int r = 0; r < n; ++r)
          in[size_t(r)] = At(g_.slots[size_t(r)].in, size_t(block * me_) * elem);
        PTDP_RETURN_IF_ERROR(GrowTmp(size_t(block) * elem));
        return plane_->Reduce(tmp_.get(), in, block, d.dtype, d.reduce);
      }
      case OpKind::kAllGather: {
        size_t bytes = size_t(d.count) * elem;
        void* out = g_.slots[size_t(me_)].out;
        for (int r = 0; r < n && bytes > 0; ++r) {
          const void* src = g_.slots[size_t(r)].in;
          if (src != At(out, size_t(r) * bytes))
            PTDP_RETURN_IF_ERROR(plane_->Copy(At(out, size_t(r) * bytes), src, bytes));
        }
        return Status::Ok();
      }
      case OpKind::kBroadcast:
        if (me_ == d.root || d.count == 0) return Status::Ok();
        return plane_->Copy(g_.slots[size_t(me_)].out, g_.slots[size_t(d.root)].in,
                            size_t(d.count) * elem);
      default:
        return Status::Ok();
    }
  }

  // After the second barrier: the all-reduce result (shared scratch, which stays put until every
  // member arrives at the next collective) or the reduce-scatter block (tmp_) into `out`.
  Status CopyOut(const CollDesc& d, void* out) {
    size_t elem = DTypeBytes(d.dtype);
    if (d.kind == OpKind::kAllReduce && d.count > 0) {
      PTDP_RETURN_IF_ERROR(plane_->Copy(out, g_.scratch.get(), size_t(d.count) * elem));
      return plane_->Finish();
    }
    if (d.kind == OpKind::kReduceScatter && d.count / size() > 0) {
      PTDP_RETURN_IF_ERROR(plane_->Copy(out, tmp_.get(), size_t(d.count / size()) * elem));
      return plane_->Finish();
    }
    return Status::Ok();
  }

  Status GrowTmp(size_t bytes) {
    if (bytes <= tmp_bytes_) return Status::Ok();
    tmp_.reset();
    tmp_bytes_ = 0;
    PTDP_ASSIGN_OR_RETURN(tmp_, plane_->Allocate(bytes));
    tmp_bytes_ = bytes;
    return Status::Ok();
  }

  // Called by the last member to arrive (holding mu): all calls must equal member 0's.
  Status CheckMatch(int64_t seq) {
    const Slot& first = g_.slots[0];
    for (int r = 1; r < size(); ++r) {
      const Slot& s = g_.slots[size_t(r)];
      if (s.desc == first.desc) continue;
      std::ostringstream m;
      m << w_->name << ": mismatched calls in collective #" << seq << " on group " << g_.name
        << ": rank " << g_.ranks[0] << " called " << OpName(first.desc.kind) << " ("
        << first.desc.Args(RootGlobal(first.desc)) << "), rank " << g_.ranks[size_t(r)]
        << " called " << OpName(s.desc.kind) << " (" << s.desc.Args(RootGlobal(s.desc)) << ")";
      w_->SetWaiting(global_, false);
      return FailLocked(m.str());
    }
    return Status::Ok();
  }
  int RootGlobal(const CollDesc& d) const {
    return d.root >= 0 && d.root < size() ? g_.ranks[size_t(d.root)] : d.root;
  }

  // Holding mu: "all-reduce #3 (sum of 4 x f32) on group [0,2] (TP) timed out after 5 s:
  // rank 0 arrived; rank 2 never arrived (it is waiting in ...)".
  std::string CollectiveTimeout(const CollDesc& d, int64_t seq) {
    std::ostringstream m;
    m << w_->name << ": " << OpName(d.kind) << " #" << seq << " (" << d.Args(RootGlobal(d))
      << ") on group " << g_.name << " " << TimeoutText() << ": ";
    std::vector<int> here, missing;
    for (int r = 0; r < size(); ++r)
      (g_.slots[size_t(r)].arrived ? here : missing).push_back(g_.ranks[size_t(r)]);
    m << (here.size() == 1 ? "rank " : "ranks ") << JoinRanks(here) << " arrived";
    for (int r : missing) m << "; rank " << r << " never arrived (it " << w_->Describe(r) << ")";
    w_->SetWaiting(global_, false);
    return m.str();
  }

  // ---- Point to point

  Status P2p(P2pOp op) {
    OpKind k = op.send ? OpKind::kSend : OpKind::kRecv;
    if (!op.t.defined()) return Fail(LocalError(k, "undefined tensor"));
    if (op.peer < 0 || op.peer >= size())
      return Fail(LocalError(k, "peer " + std::to_string(op.peer) + " is not a group rank"));
    if (depth_ > 0) {
      pending_.push_back(std::move(op));
      return Status::Ok();
    }
    std::vector<P2pOp> ops;
    ops.push_back(std::move(op));
    return RunP2p(ops);
  }

  // Posts every send, then completes every receive in order, then waits for every send to be
  // taken. On failure, sends nobody took are withdrawn before returning (their tensors may go).
  Status RunP2p(const std::vector<P2pOp>& ops) {
    int n = size();
    bool sends = std::any_of(ops.begin(), ops.end(), [](const P2pOp& o) { return o.send; });
    // Receivers copy out of the sent tensors as soon as they are posted.
    if (sends)
      if (Status s = plane_->Publish(); !s.ok()) return Fail(PlaneError(OpKind::kSend, s));
    std::vector<Message> msgs(ops.size());  // fixed size: the mailboxes point into it
    LockSpinning(g_.mu, Spins());
    std::unique_lock<std::mutex> lk(g_.mu, std::adopt_lock);
    if (!g_.failure.empty() && !ops.empty())
      return Refused(ops[0].send ? OpKind::kSend : OpKind::kRecv);
    for (size_t k = 0; k < ops.size(); ++k) {
      if (!ops[k].send) continue;
      const Tensor& t = ops[k].t;
      size_t box = size_t(me_ * n + ops[k].peer);
      msgs[k] = {t.data(), t.bytes(), t.dtype(), t.numel(), ++g_.sent[box], false, false};
      g_.mailbox[box].push_back(&msgs[k]);
    }
    g_.Notify();

    Status st;
    for (size_t k = 0; k < ops.size() && st.ok(); ++k)
      if (!ops[k].send) st = ReceiveLocked(lk, ops[k]);
    for (size_t k = 0; k < ops.size(); ++k) {
      if (!ops[k].send) continue;
      Status s = FinishSendLocked(lk, ops[k], msgs[k], st.ok());
      if (st.ok()) st = s;
    }
    return st;
  }

  Status ReceiveLocked(std::unique_lock<std::mutex>& lk, const P2pOp& op) {
    int peer_global = g_.ranks[size_t(op.peer)];
    std::deque<Message*>& box = g_.mailbox[size_t(op.peer * size() + me_)];
    int64_t seq = g_.received[size_t(op.peer * size() + me_)] + 1;
    w_->Set(global_, {&g_, OpKind::kRecv, seq, peer_global, true});
    bool ready = WaitFor(lk, Timeout(), [&] { return !box.empty() || !g_.failure.empty(); });
    if (!g_.failure.empty()) {
      w_->SetWaiting(global_, false);
      return Status::Error(g_.failure);
    }
    std::string head = w_->name + ": recv #" + std::to_string(seq) + " from rank " +
                       std::to_string(peer_global) + " (" + std::to_string(op.t.numel()) + " x " +
                       ToString(op.t.dtype()) + ") at rank " + std::to_string(global_) +
                       " on group " + g_.name;
    if (!ready) {
      w_->SetWaiting(global_, false);
      return FailLocked(head + " " + TimeoutText() + ": rank " + std::to_string(peer_global) +
                        " never sent it (it " + w_->Describe(peer_global) + ")");
    }
    Message* m = box.front();
    if (m->dtype != op.t.dtype() || m->count != op.t.numel()) {
      w_->SetWaiting(global_, false);
      return FailLocked(head + ": rank " + std::to_string(peer_global) + " sent " +
                        std::to_string(m->count) + " x " + ToString(m->dtype));
    }
    box.pop_front();
    m->taken = true;
    ++g_.received[size_t(op.peer * size() + me_)];
    lk.unlock();
    // The copy is complete before the sender learns it is done (and may reuse its tensor).
    Status copied = m->bytes > 0 ? plane_->Copy(op.t.data(), m->data, m->bytes) : Status::Ok();
    const Status finished = plane_->Finish();
    if (copied.ok()) copied = finished;
    RelockSpinning(lk, Spins());
    m->done = true;
    g_.Notify();
    w_->SetWaiting(global_, false);
    if (!copied.ok()) return FailLocked(head + ": data plane: " + copied.message());
    return Status::Ok();
  }

  // Waits until `m` was received. With `wait` false (an earlier failure), or once the group
  // failed or the timeout passed, an untaken message is withdrawn; a taken one is always
  // waited for, since its receiver is copying out of the sender's tensor.
  Status FinishSendLocked(std::unique_lock<std::mutex>& lk, const P2pOp& op, Message& m,
                          bool wait) {
    int peer_global = g_.ranks[size_t(op.peer)];
    w_->Set(global_, {&g_, OpKind::kSend, m.seq, peer_global, true});
    bool ready = !wait || WaitFor(lk, Timeout(), [&] { return m.done || !g_.failure.empty(); });
    Status st;
    if (!m.taken) {
      std::deque<Message*>& box = g_.mailbox[size_t(me_ * size() + op.peer)];
      box.erase(std::find(box.begin(), box.end(), &m));
      if (!ready) {
        st = FailLocked(w_->name + ": send #" + std::to_string(m.seq) + " to rank " +
                        std::to_string(peer_global) + " (" + std::to_string(m.count) + " x " +
                        ToString(m.dtype) + ") at rank " + std::to_string(global_) +
                        " on group " + g_.name + " " + TimeoutText() + ": rank " +
                        std::to_string(peer_global) + " never received it (it " +
                        w_->Describe(peer_global) + ")");
      } else if (!g_.failure.empty()) {
        st = Status::Error(g_.failure);
      }
    }
    Wait(lk, [&] { return m.done || !m.taken; });
    w_->SetWaiting(global_, false);
    return st;
  }

  std::shared_ptr<State> w_;
  GroupState& g_;  // owned by *w_
  int me_;         // group rank
  int global_;
  std::string label_;
  std::unique_ptr<RankPlane> plane_;
  int depth_ = 0;               // GroupStart() nesting
  std::vector<P2pOp> pending_;  // p2p recorded inside a group
  std::shared_ptr<void> tmp_;   // reduce-scatter result until the second barrier (plane memory)
  size_t tmp_bytes_ = 0;
};

}  // namespace

double Rendezvous::DefaultSpinSeconds(int world_size, int cores) {
  // Up to 20 ms: longer than any wait inside a step of the models the CPU runtime trains
  // (a pipeline stage's warm-up forward, a TP collective behind a slower peer), short enough
  // that a rank left waiting for long (a failed peer, a timeout) soon stops burning its core.
  return cores > 0 && world_size <= cores ? 0.02 : 0.0;
}

namespace {
// PTDP_COMM_SPIN_US (microseconds, >= 0) if set to a number, else the default for this machine.
double SpinSecondsHere(int world_size) {
  if (const char* env = std::getenv("PTDP_COMM_SPIN_US")) {
    char* end = nullptr;
    const double us = std::strtod(env, &end);
    if (end != env && *end == '\0' && us >= 0 && us <= 1e9) return us * 1e-6;
  }
  return Rendezvous::DefaultSpinSeconds(world_size, int(std::thread::hardware_concurrency()));
}
}  // namespace

Rendezvous::Rendezvous(int world_size, double timeout_s, std::string name)
    : Rendezvous(world_size, timeout_s, std::move(name), SpinSecondsHere(world_size)) {}

Rendezvous::Rendezvous(int world_size, double timeout_s, std::string name, double spin_s)
    : state_(std::make_shared<State>()) {
  assert(world_size > 0 && timeout_s > 0 && spin_s >= 0);
  state_->size = world_size;
  state_->timeout_s = timeout_s;
  state_->spin_s = spin_s;
  state_->name = std::move(name);
  state_->activity.resize(size_t(world_size));
}

Rendezvous::~Rendezvous() = default;

int Rendezvous::world_size() const { return state_->size; }
double Rendezvous::timeout_s() const { return state_->timeout_s; }
double Rendezvous::spin_s() const { return state_->spin_s; }

Result<std::unique_ptr<Communicator>> Rendezvous::Group(int global_rank,
                                                        const std::vector<int>& ranks,
                                                        const std::string& label,
                                                        std::unique_ptr<RankPlane> plane) {
  std::string where = state_->name + ": group " + RankList(ranks) + " (" + label + ")";
  if (ranks.empty()) return Status::Error(where + ": no ranks");
  int me = -1;
  for (size_t k = 0; k < ranks.size(); ++k) {
    if (ranks[k] < 0 || ranks[k] >= state_->size)
      return Status::Error(where + ": rank " + std::to_string(ranks[k]) +
                           " is outside the world of " + std::to_string(state_->size));
    if (std::count(ranks.begin(), ranks.end(), ranks[k]) > 1)
      return Status::Error(where + ": rank " + std::to_string(ranks[k]) + " appears twice");
    if (ranks[k] == global_rank) me = int(k);
  }
  if (me < 0)
    return Status::Error(where + ": the calling rank " + std::to_string(global_rank) +
                         " is not a member");
  assert(plane != nullptr);

  std::lock_guard<std::mutex> lk(state_->mu);
  std::unique_ptr<GroupState>& g = state_->groups[{label, ranks}];
  if (!g) {
    g = std::make_unique<GroupState>();
    size_t n = ranks.size();
    g->ranks = ranks;
    g->name = RankList(ranks) + " (" + label + ")";
    g->slots.resize(n);
    g->coll_seq.assign(n, 0);
    g->mailbox.resize(n * n);
    g->sent.assign(n * n, 0);
    g->received.assign(n * n, 0);
  }
  return std::unique_ptr<Communicator>(
      std::make_unique<RendezvousCommunicator>(state_, g.get(), me, label, std::move(plane)));
}

}  // namespace ptdp::rt
