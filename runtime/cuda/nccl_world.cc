// NcclWorld and its communicators: non-blocking NCCL communicators made by one init and one
// split per label, operations enqueued on the rank's stream and watched until complete (abort on
// timeout or asynchronous error). See nccl_world.h for the design.
#include "runtime/cuda/nccl_world.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <cstring>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include "runtime/cuda/cuda_check.h"

namespace ptdp::rt::cuda {
namespace {

using Clock = std::chrono::steady_clock;

static_assert(sizeof(ncclUniqueId) == sizeof(NcclId::bytes), "NcclId holds an ncclUniqueId");

constexpr const char* kName = "nccl communicator";

std::string JoinRanks(const std::vector<int>& ranks, const char* sep = ", ") {
  std::string s;
  for (size_t k = 0; k < ranks.size(); ++k) s += (k ? sep : "") + std::to_string(ranks[k]);
  return s;
}
std::string RankList(const std::vector<int>& ranks) { return "[" + JoinRanks(ranks, ",") + "]"; }

std::string Seconds(double s) {
  std::ostringstream o;
  o << s << " s";
  return o.str();
}

Clock::time_point Deadline(double timeout_s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(timeout_s));
}

// Spins briefly (a small collective completes in microseconds), then sleeps in short steps.
void Pause(int& polls) {
  if (++polls < 2000)
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(50));
}

// "unhandled system error (nccl result 2): <NCCL's last error text>"
std::string NcclError(ncclResult_t r) {
  std::string why = std::string(ncclGetErrorString(r)) + " (nccl result " + std::to_string(int(r)) + ")";
  if (const char* last = ncclGetLastError(nullptr); last && *last) why += ": " + std::string(last);
  return why;
}

ncclConfig_t NonBlockingConfig() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

// Longest wait for a healthy communicator to finalize at destruction before aborting it.
constexpr double kFinalizeMaxS = 10.0;

// One rank's NCCL communicator. Destroyed with its last holder: finalized and destroyed when
// healthy (NCCL's order for non-blocking communicators: finalize, wait, destroy), aborted when it
// failed or does not finalize within min(timeout_s, kFinalizeMaxS).
class CommHandle {
 public:
  CommHandle(ncclComm_t comm, int device, double timeout_s)
      : comm_(comm), device_(device), timeout_s_(timeout_s) {}
  ~CommHandle() {
    if (comm_ == nullptr) return;
    (void)cudaSetDevice(device_);
    if (Finalize()) {
      (void)ncclCommDestroy(comm_);
    } else {
      (void)ncclCommAbort(comm_);
    }
  }
  CommHandle(const CommHandle&) = delete;
  CommHandle& operator=(const CommHandle&) = delete;

  ncclComm_t get() const { return comm_; }
  int device() const { return device_; }
  bool aborted() const { return comm_ == nullptr; }
  // Makes a stuck kernel of this communicator return and frees it; later calls see aborted().
  void Abort() {
    if (comm_ == nullptr) return;
    (void)cudaSetDevice(device_);
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  bool Finalize() {
    if (ncclCommFinalize(comm_) != ncclSuccess) {
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess || state != ncclInProgress)
        return false;
    }
    const Clock::time_point deadline = Deadline(std::min(timeout_s_, kFinalizeMaxS));
    int polls = 0;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) return false;
      if (state == ncclSuccess) return true;
      if (state != ncclInProgress || Clock::now() > deadline) return false;
      Pause(polls);
    }
  }

  ncclComm_t comm_;
  int device_;
  double timeout_s_;
};

// Polls `comm` until it leaves ncclInProgress (an init, a split or an enqueue finished). Ok on
// success; otherwise the NCCL error, or "timeout" when the deadline passed first.
Status WaitReady(ncclComm_t comm, Clock::time_point deadline, bool* timed_out) {
  *timed_out = false;
  int polls = 0;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    PTDP_CUDA_RETURN_IF_ERROR(ncclCommGetAsyncError(comm, &state));
    if (state == ncclSuccess) return Status::Ok();
    if (state != ncclInProgress) return Status::Error(NcclError(state));
    if (Clock::now() > deadline) {
      *timed_out = true;
      return Status::Error("timeout");
    }
    Pause(polls);
  }
}

// The failure shared by this process's handles on one group (label, ranks): the first failure
// of any local member poisons the group for all of them.
struct GroupShared {
  std::vector<int> ranks;
  std::string name;  // "[0,1] (TP)"
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::string failure;  // guarded by mu

  void Fail(const std::string& message) {
    std::lock_guard<std::mutex> lk(mu);
    if (failure.empty()) failure = message;
    failed = true;
  }
  std::string Failure() {
    std::lock_guard<std::mutex> lk(mu);
    return failure;
  }
};

// A group made by Prepare: its shared state and each local member's communicator.
struct Prepared {
  std::shared_ptr<GroupShared> shared;
  std::map<int, std::shared_ptr<CommHandle>> comms;  // by global rank
};

}  // namespace

struct NcclWorld::State {
  NcclWorldOptions options;
  std::vector<std::shared_ptr<CommHandle>> world;  // per local rank
  std::map<std::pair<std::string, std::vector<int>>, Prepared> groups;
  std::vector<std::string> labels;  // prepared so far
  std::string broken;               // why the world is unusable (a failed init or split)
  // Where NCCL writes the communicators a split makes: its jobs write there when they finish,
  // which after a failure is at the latest when Break's aborts return; kept with the state so
  // that no late write lands in freed memory.
  std::list<std::vector<ncclComm_t>> split_outputs;

  std::mutex mu;                          // guards activity
  std::map<int, std::string> activity;  // local global rank -> what it is doing

  void SetActivity(int global_rank, std::string what) {
    std::lock_guard<std::mutex> lk(mu);
    activity[global_rank] = std::move(what);
  }
  // "rank 1 is waiting in all-reduce #3 on group [0,1] (TP)", or that it is in another process.
  std::string Describe(int global_rank) {
    const std::vector<int>& local = options.local_ranks;
    if (std::find(local.begin(), local.end(), global_rank) == local.end())
      return "rank " + std::to_string(global_rank) + " is in another process";
    std::lock_guard<std::mutex> lk(mu);
    auto it = activity.find(global_rank);
    return "rank " + std::to_string(global_rank) + " " +
           (it == activity.end() ? std::string("has not called any operation yet") : it->second);
  }
  int LocalIndex(int global_rank) const {
    const std::vector<int>& local = options.local_ranks;
    auto it = std::find(local.begin(), local.end(), global_rank);
    return it == local.end() ? -1 : int(it - local.begin());
  }
  // Aborts every communicator this process made and marks the world unusable.
  Status Break(const std::string& why) {
    broken = why;
    for (auto& c : world)
      if (c) c->Abort();
    for (auto& [key, g] : groups)
      for (auto& [rank, c] : g.comms) c->Abort();
    return Status::Error(why);
  }
};

namespace {

using State = NcclWorld::State;

ncclDataType_t NcclType(DType d) {
  switch (d) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kI32: return ncclInt32;
  }
  return ncclFloat32;
}

ncclRedOp_t NcclOp(ReduceOp op) { return op == ReduceOp::kSum ? ncclSum : ncclMax; }

// One recorded send or receive (inside GroupStart/GroupEnd, or a single ungrouped one).
struct P2pOp {
  bool send = false;
  Tensor t;
  int peer = 0;  // group rank
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<State> w, std::shared_ptr<GroupShared> g,
                   std::shared_ptr<CommHandle> comm, int me, std::string label,
                   cudaStream_t stream)
      : w_(std::move(w)), g_(std::move(g)), comm_(std::move(comm)), me_(me),
        global_(g_->ranks[size_t(me)]), label_(std::move(label)), stream_(stream) {}

  int rank() const override { return me_; }
  int size() const override { return int(g_->ranks.size()); }
  const std::vector<int>& ranks() const override { return g_->ranks; }
  const std::string& label() const override { return label_; }

  Status AllReduce(Tensor& t, ReduceOp op) override {
    const std::string what = Numbered("all-reduce", coll_seq_ + 1) + " (" + ToString(op) +
                             " of " + Elems(t) + ")";
    PTDP_RETURN_IF_ERROR(CheckCollective(what, t, t, true));
    ++coll_seq_;
    if (t.numel() == 0) return Status::Ok();
    return Run(what, [&] {
      return ncclAllReduce(t.data(), t.data(), size_t(t.numel()), NcclType(t.dtype()), NcclOp(op),
                           comm_->get(), side_);
    });
  }

  Status AllGather(const Tensor& in, Tensor& out) override {
    const std::string what = Numbered("all-gather", coll_seq_ + 1) + " (" + Elems(in) + ")";
    PTDP_RETURN_IF_ERROR(CheckCollective(what, in, out, false));
    if (out.dtype() != in.dtype() || out.numel() != size() * in.numel())
      return Fail(Local(what, "out " + out.shape().ToString() + " " + ToString(out.dtype()) +
                                  " is not " + std::to_string(size()) + " x in " +
                                  in.shape().ToString() + " " + ToString(in.dtype())));
    ++coll_seq_;
    if (in.numel() == 0) return Status::Ok();
    return Run(what, [&] {
      return ncclAllGather(in.data(), out.data(), size_t(in.numel()), NcclType(in.dtype()),
                           comm_->get(), side_);
    });
  }

  Status ReduceScatter(const Tensor& in, Tensor& out, ReduceOp op) override {
    const std::string what = Numbered("reduce-scatter", coll_seq_ + 1) + " (" + ToString(op) +
                             " of " + Elems(in) + ")";
    PTDP_RETURN_IF_ERROR(CheckCollective(what, in, out, true));
    if (out.dtype() != in.dtype() || in.numel() != size() * out.numel())
      return Fail(Local(what, "in " + in.shape().ToString() + " " + ToString(in.dtype()) +
                                  " is not " + std::to_string(size()) + " x out " +
                                  out.shape().ToString() + " " + ToString(out.dtype())));
    ++coll_seq_;
    if (out.numel() == 0) return Status::Ok();
    return Run(what, [&] {
      return ncclReduceScatter(in.data(), out.data(), size_t(out.numel()), NcclType(in.dtype()),
                               NcclOp(op), comm_->get(), side_);
    });
  }

  Status Broadcast(Tensor& t, int root) override {
    const int root_global = root >= 0 && root < size() ? g_->ranks[size_t(root)] : root;
    const std::string what = Numbered("broadcast", coll_seq_ + 1) + " (" + Elems(t) +
                             " from rank " + std::to_string(root_global) + ")";
    PTDP_RETURN_IF_ERROR(CheckCollective(what, t, t, false));
    if (root < 0 || root >= size())
      return Fail(Local(what, "root " + std::to_string(root) + " is not a group rank"));
    ++coll_seq_;
    if (t.numel() == 0) return Status::Ok();
    return Run(what, [&] {
      return ncclBroadcast(t.data(), t.data(), size_t(t.numel()), NcclType(t.dtype()), root,
                           comm_->get(), side_);
    });
  }

  // NCCL has no barrier: an all-reduce of one float that this handle keeps on the device.
  Status Barrier() override {
    const std::string what = Numbered("barrier", coll_seq_ + 1);
    if (depth_ > 0) return Fail(Local(what, "collective between GroupStart() and GroupEnd()"));
    if (Status s = Usable(what); !s.ok()) return s;
    if (barrier_ == nullptr) {
      PTDP_RETURN_IF_ERROR(Checked(what, PTDP_CUDA_STATUS(cudaSetDevice(comm_->device()))));
      PTDP_RETURN_IF_ERROR(Checked(what, PTDP_CUDA_STATUS(cudaMalloc(&barrier_, sizeof(float)))));
      PTDP_RETURN_IF_ERROR(
          Checked(what, PTDP_CUDA_STATUS(cudaMemsetAsync(barrier_, 0, sizeof(float), stream_))));
    }
    ++coll_seq_;
    return Run(what, [&] {
      return ncclAllReduce(barrier_, barrier_, 1, ncclFloat32, ncclSum, comm_->get(), side_);
    });
  }

  Status Send(const Tensor& t, int peer) override { return P2p({true, t, peer}); }
  Status Recv(Tensor& t, int peer) override { return P2p({false, t, peer}); }

  Status GroupStart() override {
    ++depth_;
    return Status::Ok();
  }

  Status GroupEnd() override {
    if (depth_ == 0)
      return Fail(Prefix() + "GroupEnd() without GroupStart() on group " + g_->name);
    if (--depth_ > 0) return Status::Ok();
    std::vector<P2pOp> ops = std::move(pending_);
    pending_.clear();
    return RunP2p(ops);
  }

  // An event of the rank's stream, recorded on the rank's thread at a hand-over to its
  // GradReducer; the operation that follows on this handle waits for it (Run).
  class StreamMark final : public ReadyMark {
   public:
    ~StreamMark() override {
      if (event != nullptr) (void)cudaEventDestroy(event);  // released once recorded work ran
    }
    cudaEvent_t event = nullptr;
  };
  // Touches no state of the handle but the mark (the reducer's thread may be in Run meanwhile);
  // a failure is the caller's to handle (GradReducer: the operation waits for all, as without).
  Result<std::shared_ptr<ReadyMark>> MarkReady() override {
    PTDP_RETURN_IF_ERROR(PTDP_CUDA_STATUS(cudaSetDevice(comm_->device())));
    auto mark = std::make_shared<StreamMark>();
    PTDP_RETURN_IF_ERROR(
        PTDP_CUDA_STATUS(cudaEventCreateWithFlags(&mark->event, cudaEventDisableTiming)));
    PTDP_RETURN_IF_ERROR(PTDP_CUDA_STATUS(cudaEventRecord(mark->event, stream_)));
    return std::shared_ptr<ReadyMark>(std::move(mark));
  }
  void RunAfter(std::shared_ptr<ReadyMark> mark) override {
    next_after_ = std::dynamic_pointer_cast<StreamMark>(std::move(mark));
  }

  ~NcclCommunicator() override {
    if (barrier_ == nullptr && side_ == nullptr) return;
    (void)cudaSetDevice(comm_->device());
    if (barrier_ != nullptr) (void)cudaFree(barrier_);
    if (side_ != nullptr) {  // released once its work completed (never waited for here)
      (void)cudaStreamDestroy(side_);
      (void)cudaEventDestroy(after_);
    }
  }

 private:
  std::string Prefix() const { return std::string(kName) + ": rank " + std::to_string(global_) + ": "; }
  static std::string Numbered(const char* op, int64_t seq) {
    return std::string(op) + " #" + std::to_string(seq);
  }
  static std::string Elems(const Tensor& t) {
    return std::to_string(t.numel()) + " x " + ToString(t.dtype());
  }
  // "nccl communicator: rank 0: all-gather #2 (4 x f32) on group [0,1] (TP): <what>"
  std::string Local(const std::string& op, const std::string& what) const {
    return Prefix() + op + " on group " + g_->name + ": " + what;
  }

  // Fails the group for every local member and aborts this rank's communicator of it.
  Status Fail(const std::string& message) {
    g_->Fail(message);
    comm_->Abort();
    w_->SetActivity(global_, "failed on group " + g_->name);
    return Status::Error(message);
  }
  Status Checked(const std::string& op, const Status& s) {
    return s.ok() ? s : Fail(Local(op, s.message()));
  }
  // Refuses calls on a failed group (aborting this rank's communicator of it, if not yet).
  Status Usable(const std::string& op) {
    if (!g_->failed) return Status::Ok();
    comm_->Abort();
    return Status::Error(Prefix() + op + " on group " + g_->name +
                         " refused: the group failed earlier: " + g_->Failure());
  }
  Status CheckCollective(const std::string& op, const Tensor& a, const Tensor& b, bool reduces) {
    if (Status s = Usable(op); !s.ok()) return s;
    if (!a.defined() || !b.defined()) return Fail(Local(op, "undefined tensor"));
    if (depth_ > 0) return Fail(Local(op, "collective between GroupStart() and GroupEnd()"));
    if (reduces && a.dtype() != DType::kF32 && a.dtype() != DType::kBF16)
      return Fail(Local(op, std::string("dtype ") + ToString(a.dtype()) +
                                " is not supported (reductions take f32, bf16)"));
    return Status::Ok();
  }

  // Enqueues with `enqueue` (one NCCL call, or a group of them) and watches it to completion:
  // first until NCCL has enqueued (the communicator leaves ncclInProgress), then until the stream
  // has run it. Aborts past the deadline, on an asynchronous NCCL error, or when another local
  // member failed the group meanwhile.
  //
  // The operation runs on this handle's own stream (side_), after the work the rank's stream
  // holds so far (an event; or, after RunAfter, the work it held at the hand-over), and only
  // side_ is watched: the caller's wait ends with the
  // operation, not with whatever the rank's thread enqueued meanwhile, so that a thread beside
  // the rank's (the trainer's GradReducer, --overlap-grad-reduce) reduces gradient buckets while
  // the backward's kernels run (Megatron's communication stream).
  Status Run(const std::string& op, const std::function<ncclResult_t()>& enqueue) {
    const Clock::time_point deadline = Deadline(w_->options.timeout_s);
    w_->SetActivity(global_, "is waiting in " + op + " on group " + g_->name);
    PTDP_RETURN_IF_ERROR(Checked(op, PTDP_CUDA_STATUS(cudaSetDevice(comm_->device()))));
    if (side_ == nullptr) {
      PTDP_RETURN_IF_ERROR(
          Checked(op, PTDP_CUDA_STATUS(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking))));
      PTDP_RETURN_IF_ERROR(
          Checked(op, PTDP_CUDA_STATUS(cudaEventCreateWithFlags(&after_, cudaEventDisableTiming))));
    }
    // The mark (the rank's work at the hand-over) lives until side_ waits for it.
    const std::shared_ptr<StreamMark> mark = std::exchange(next_after_, nullptr);
    cudaEvent_t after = after_;
    if (mark)
      after = mark->event;
    else
      PTDP_RETURN_IF_ERROR(Checked(op, PTDP_CUDA_STATUS(cudaEventRecord(after_, stream_))));
    PTDP_RETURN_IF_ERROR(Checked(op, PTDP_CUDA_STATUS(cudaStreamWaitEvent(side_, after, 0))));
    const ncclResult_t r = enqueue();
    if (r != ncclSuccess && r != ncclInProgress) return Fail(Local(op, NcclError(r)));
    int polls = 0;
    bool enqueued = false;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      if (ncclResult_t q = ncclCommGetAsyncError(comm_->get(), &state); q != ncclSuccess)
        return Fail(Local(op, "ncclCommGetAsyncError: " + NcclError(q)));
      if (state != ncclSuccess && state != ncclInProgress)
        return Fail(Local(op, "NCCL reports " + NcclError(state) +
                                  " (a peer failed, or the network)"));
      if (!enqueued && state == ncclSuccess) enqueued = true;
      if (enqueued) {
        const cudaError_t e = cudaStreamQuery(side_);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady)
          return Fail(Local(op, "the stream reports " + PTDP_CUDA_STATUS(e).message()));
      }
      if (g_->failed)
        return Fail(Prefix() + op + " on group " + g_->name +
                    " failed: another member failed the group: " + g_->Failure());
      if (Clock::now() > deadline) return Fail(TimeoutMessage(op, enqueued));
      Pause(polls);
    }
    w_->SetActivity(global_, "returned from " + op + " on group " + g_->name);
    return Status::Ok();
  }

  // "nccl communicator: all-reduce #3 (sum of 4 x f32) at rank 0 on group [0,1] (TP) timed out
  // after 5 s (the communicator was aborted); rank 1 is waiting in all-reduce #2 on group ...".
  std::string TimeoutMessage(const std::string& op, bool enqueued) const {
    std::string m = std::string(kName) + ": " + op + " at rank " + std::to_string(global_) +
                    " on group " + g_->name + " timed out after " +
                    Seconds(w_->options.timeout_s) +
                    (enqueued ? " waiting for its peers" : " before NCCL could enqueue it") +
                    " (the communicator was aborted)";
    for (int r : g_->ranks)
      if (r != global_) m += "; " + w_->Describe(r);
    return m;
  }

  Status P2p(P2pOp op) {
    const char* kind = op.send ? "send" : "recv";
    const std::string what = std::string(kind) + " " + (op.send ? "to" : "from") + " rank " +
                             std::to_string(op.peer >= 0 && op.peer < size()
                                                ? g_->ranks[size_t(op.peer)] : op.peer);
    if (Status s = Usable(what); !s.ok()) return s;
    if (!op.t.defined()) return Fail(Local(what, "undefined tensor"));
    if (op.peer < 0 || op.peer >= size())
      return Fail(Local(what, "peer " + std::to_string(op.peer) + " is not a group rank"));
    if (depth_ > 0) {
      pending_.push_back(std::move(op));
      return Status::Ok();
    }
    std::vector<P2pOp> ops;
    ops.push_back(std::move(op));
    return RunP2p(ops);
  }

  // Posts the sends and receives in one NCCL group (on both peers alike) and waits for them.
  Status RunP2p(const std::vector<P2pOp>& ops) {
    if (ops.empty()) return Status::Ok();
    std::string what;
    int64_t bytes = 0;
    for (const P2pOp& o : ops) {
      const int64_t n = ++(o.send ? sent_ : received_)[size_t(o.peer)];
      what += std::string(what.empty() ? "" : ", ") + (o.send ? "send #" : "recv #") +
              std::to_string(n) + (o.send ? " to rank " : " from rank ") +
              std::to_string(g_->ranks[size_t(o.peer)]) + " (" + Elems(o.t) + ")";
      bytes += int64_t(o.t.bytes());
    }
    if (Status s = Usable(what); !s.ok()) return s;
    if (bytes == 0) return Status::Ok();  // both peers hold the same counts: both skip
    return Run(what, [&] {
      ncclResult_t first = ncclGroupStart();
      if (first != ncclSuccess) return first;
      for (const P2pOp& o : ops) {
        if (o.t.numel() == 0) continue;
        const ncclResult_t r =
            o.send ? ncclSend(o.t.data(), size_t(o.t.numel()), NcclType(o.t.dtype()), o.peer,
                              comm_->get(), side_)
                   : ncclRecv(o.t.data(), size_t(o.t.numel()), NcclType(o.t.dtype()), o.peer,
                              comm_->get(), side_);
        if (first == ncclSuccess && r != ncclSuccess && r != ncclInProgress) first = r;
      }
      const ncclResult_t end = ncclGroupEnd();  // always: closes NCCL's group of this thread
      return first != ncclSuccess ? first : end;
    });
  }

  std::shared_ptr<State> w_;
  std::shared_ptr<GroupShared> g_;
  std::shared_ptr<CommHandle> comm_;
  int me_;
  int global_;
  std::string label_;
  cudaStream_t stream_;          // the rank's (its backend's)
  cudaStream_t side_ = nullptr;  // this handle's operations (Run), made at the first
  cudaEvent_t after_ = nullptr;  // the rank's stream's work so far, which side_ waits for
  std::shared_ptr<StreamMark> next_after_;  // RunAfter's: what the next operation waits for
  int64_t coll_seq_ = 0;
  std::vector<int64_t> sent_ = std::vector<int64_t>(g_->ranks.size(), 0);      // per peer
  std::vector<int64_t> received_ = std::vector<int64_t>(g_->ranks.size(), 0);  // per peer
  int depth_ = 0;
  std::vector<P2pOp> pending_;
  void* barrier_ = nullptr;  // one device float, for Barrier()
};

// The checks every CommunicatorFactory::Group makes (ThreadWorld's messages).
Status CheckGroup(int world_size, int global_rank, const std::vector<int>& ranks,
                  const std::string& where) {
  if (ranks.empty()) return Status::Error(where + ": no ranks");
  bool member = false;
  for (int r : ranks) {
    if (r < 0 || r >= world_size)
      return Status::Error(where + ": rank " + std::to_string(r) + " is outside the world of " +
                           std::to_string(world_size));
    if (std::count(ranks.begin(), ranks.end(), r) > 1)
      return Status::Error(where + ": rank " + std::to_string(r) + " appears twice");
    member = member || r == global_rank;
  }
  if (!member)
    return Status::Error(where + ": the calling rank " + std::to_string(global_rank) +
                         " is not a member");
  return Status::Ok();
}

Status CheckOptions(const NcclWorldOptions& o) {
  const std::string where = std::string(kName) + ": world options";
  if (o.world_size <= 0) return Status::Error(where + ": world size must be positive");
  if (o.local_ranks.empty()) return Status::Error(where + ": no local ranks");
  if (o.devices.size() != o.local_ranks.size())
    return Status::Error(where + ": " + std::to_string(o.local_ranks.size()) +
                         " local ranks but " + std::to_string(o.devices.size()) + " devices");
  if (o.timeout_s <= 0) return Status::Error(where + ": timeout_s must be positive");
  if (!o.stream_of) return Status::Error(where + ": no stream_of");
  int count = 0;
  PTDP_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  for (size_t i = 0; i < o.local_ranks.size(); ++i) {
    const int g = o.local_ranks[i], d = o.devices[i];
    if (g < 0 || g >= o.world_size)
      return Status::Error(where + ": local rank " + std::to_string(g) +
                           " is outside the world of " + std::to_string(o.world_size));
    if (std::count(o.local_ranks.begin(), o.local_ranks.end(), g) > 1)
      return Status::Error(where + ": local rank " + std::to_string(g) + " appears twice");
    if (d < 0 || d >= count)
      return Status::Error(where + ": device " + std::to_string(d) + " (of rank " +
                           std::to_string(g) + ") does not exist: " + std::to_string(count) +
                           " visible");
    if (std::count(o.devices.begin(), o.devices.end(), d) > 1)
      return Status::Error(where + ": device " + std::to_string(d) +
                           " is given to two ranks; NCCL takes one rank per GPU (DeviceWorld "
                           "runs many ranks on one GPU)");
  }
  return Status::Ok();
}

// Waits for every communicator in `comms` (nullptr entries skipped) to finish its init or split.
Status WaitAll(const std::vector<ncclComm_t>& comms, const std::vector<int>& ranks,
               double timeout_s, const std::string& what) {
  const Clock::time_point deadline = Deadline(timeout_s);
  for (size_t i = 0; i < comms.size(); ++i) {
    if (comms[i] == nullptr) continue;
    bool timed_out = false;
    Status s = WaitReady(comms[i], deadline, &timed_out);
    if (timed_out)
      return Status::Error(std::string(kName) + ": " + what + " timed out after " +
                           Seconds(timeout_s) + " at rank " + std::to_string(ranks[i]) +
                           ": not every rank of the world took part (does every process run "
                           "with the same world size, id and groups?)");
    if (!s.ok())
      return s.Prefixed(std::string(kName) + ": " + what + " at rank " + std::to_string(ranks[i]));
  }
  return Status::Ok();
}

}  // namespace

Result<NcclId> NewNcclId() {
  ncclUniqueId id;
  PTDP_CUDA_RETURN_IF_ERROR(ncclGetUniqueId(&id));
  NcclId out;
  std::memcpy(out.bytes.data(), &id, sizeof(id));
  return out;
}

Result<std::vector<SplitArgs>> PlanSplit(const GroupSet& set, int world_size,
                                         const std::vector<int>& ranks) {
  const std::string where = std::string(kName) + ": groups of " + set.label;
  std::vector<SplitArgs> by_rank(size_t(std::max(world_size, 0)));
  std::vector<bool> seen(by_rank.size(), false);
  for (size_t c = 0; c < set.groups.size(); ++c) {
    const std::vector<int>& group = set.groups[c];
    if (group.empty()) return Status::Error(where + ": group " + std::to_string(c) + " is empty");
    for (size_t k = 0; k < group.size(); ++k) {
      const int r = group[k];
      if (r < 0 || r >= world_size)
        return Status::Error(where + ": rank " + std::to_string(r) + " is outside the world of " +
                             std::to_string(world_size));
      if (seen[size_t(r)])
        return Status::Error(where + ": rank " + std::to_string(r) + " is in two groups (" +
                             RankList(set.groups[size_t(by_rank[size_t(r)].color)]) + " and " +
                             RankList(group) + ")");
      seen[size_t(r)] = true;
      by_rank[size_t(r)] = {int(c), int(k)};
    }
  }
  std::vector<SplitArgs> out;
  for (int r : ranks) {
    if (r < 0 || r >= world_size)
      return Status::Error(where + ": rank " + std::to_string(r) + " is outside the world of " +
                           std::to_string(world_size));
    out.push_back(by_rank[size_t(r)]);
  }
  return out;
}

NcclWorld::NcclWorld(std::shared_ptr<State> state) : state_(std::move(state)) {}
NcclWorld::~NcclWorld() = default;

int NcclWorld::world_size() const { return state_->options.world_size; }
const std::vector<int>& NcclWorld::local_ranks() const { return state_->options.local_ranks; }

Result<std::unique_ptr<NcclWorld>> NcclWorld::Create(NcclWorldOptions options) {
  PTDP_RETURN_IF_ERROR(CheckOptions(options));
  auto state = std::make_shared<State>();
  state->options = std::move(options);
  const NcclWorldOptions& o = state->options;
  const size_t n = o.local_ranks.size();
  ncclUniqueId id;
  std::memcpy(&id, o.id.bytes.data(), sizeof(id));
  ncclConfig_t config = NonBlockingConfig();
  std::vector<ncclComm_t> comms(n, nullptr);
  // One thread, several GPUs: the inits must be one NCCL group.
  PTDP_CUDA_RETURN_IF_ERROR(ncclGroupStart());
  ncclResult_t first = ncclSuccess;
  for (size_t i = 0; i < n; ++i) {
    if (cudaSetDevice(o.devices[i]) != cudaSuccess && first == ncclSuccess) {
      first = ncclUnhandledCudaError;
      continue;
    }
    const ncclResult_t r = ncclCommInitRankConfig(&comms[i], o.world_size, id, o.local_ranks[i],
                                                  &config);
    if (first == ncclSuccess && r != ncclSuccess && r != ncclInProgress) first = r;
  }
  const ncclResult_t end = ncclGroupEnd();
  for (size_t i = 0; i < n; ++i)
    state->world.push_back(comms[i] ? std::make_shared<CommHandle>(comms[i], o.devices[i], o.timeout_s)
                                    : nullptr);
  const std::string what = "creating the world of " + std::to_string(o.world_size) +
                           " ranks (local ranks " + JoinRanks(o.local_ranks) + ")";
  if (first != ncclSuccess || (end != ncclSuccess && end != ncclInProgress))
    return state->Break(std::string(kName) + ": " + what + ": " +
                        NcclError(first != ncclSuccess ? first : end));
  if (Status s = WaitAll(comms, o.local_ranks, o.timeout_s, what); !s.ok())
    return state->Break(s.message());
  return std::unique_ptr<NcclWorld>(new NcclWorld(std::move(state)));
}

Status NcclWorld::Prepare(const std::vector<GroupSet>& sets) {
  State& st = *state_;
  const NcclWorldOptions& o = st.options;
  if (!st.broken.empty())
    return Status::Error(std::string(kName) + ": the world is unusable: " + st.broken);
  for (const GroupSet& set : sets) {
    if (std::find(st.labels.begin(), st.labels.end(), set.label) != st.labels.end())
      return Status::Error(std::string(kName) + ": groups of " + set.label +
                           " were prepared already");
    // Bad sets fail the same way in every process, before any split: nothing to abort.
    PTDP_ASSIGN_OR_RETURN(std::vector<SplitArgs> args,
                          PlanSplit(set, o.world_size, o.local_ranks));
    const size_t n = o.local_ranks.size();
    std::vector<ncclComm_t>& children = st.split_outputs.emplace_back(n, nullptr);
    ncclConfig_t config = NonBlockingConfig();
    const std::string what = "splitting the " + set.label + " groups";
    PTDP_CUDA_RETURN_IF_ERROR(ncclGroupStart());
    ncclResult_t first = ncclSuccess;
    for (size_t i = 0; i < n; ++i) {
      if (cudaSetDevice(o.devices[i]) != cudaSuccess && first == ncclSuccess) {
        first = ncclUnhandledCudaError;
        continue;
      }
      const int color = args[i].color < 0 ? NCCL_SPLIT_NOCOLOR : args[i].color;
      const ncclResult_t r =
          ncclCommSplit(st.world[i]->get(), color, args[i].key, &children[i], &config);
      if (first == ncclSuccess && r != ncclSuccess && r != ncclInProgress) first = r;
    }
    const ncclResult_t end = ncclGroupEnd();
    if (first != ncclSuccess || (end != ncclSuccess && end != ncclInProgress))
      return st.Break(std::string(kName) + ": " + what + ": " +
                      NcclError(first != ncclSuccess ? first : end));
    // The split jobs report through the parents; the children exist once the parents are done.
    std::vector<ncclComm_t> parents;
    for (auto& w : st.world) parents.push_back(w->get());
    if (Status s = WaitAll(parents, o.local_ranks, o.timeout_s, what); !s.ok())
      return st.Break(s.message());
    // Own every child at once, so that any failure below frees them.
    std::vector<std::shared_ptr<CommHandle>> handles(n);
    for (size_t i = 0; i < n; ++i)
      if (children[i] != nullptr)
        handles[i] = std::make_shared<CommHandle>(children[i], o.devices[i], o.timeout_s);
    for (size_t i = 0; i < n; ++i) {
      if (args[i].color < 0) continue;
      const std::vector<int>& group = set.groups[size_t(args[i].color)];
      std::string where = std::string(kName) + ": " + what + ": rank " +
                          std::to_string(o.local_ranks[i]) + " of " + RankList(group);
      if (children[i] == nullptr) {
        for (size_t j = 0; j < n; ++j)
          if (handles[j]) handles[j]->Abort();
        return st.Break(where + ": NCCL made no communicator");
      }
      bool timed_out = false;
      Status ready = WaitReady(children[i], Deadline(o.timeout_s), &timed_out);
      int count = 0, user_rank = -1;
      if (ready.ok()) ready = PTDP_CUDA_STATUS(ncclCommCount(children[i], &count));
      if (ready.ok()) ready = PTDP_CUDA_STATUS(ncclCommUserRank(children[i], &user_rank));
      if (!ready.ok() && timed_out) ready = Status::Error("timed out after " + Seconds(o.timeout_s));
      if (ready.ok() && (count != int(group.size()) || user_rank != args[i].key))
        ready = Status::Error("NCCL made rank " + std::to_string(user_rank) + " of " +
                              std::to_string(count) + ", expected rank " +
                              std::to_string(args[i].key) + " of " + std::to_string(group.size()));
      if (!ready.ok()) {
        for (size_t j = 0; j < n; ++j)
          if (handles[j]) handles[j]->Abort();
        return st.Break(ready.Prefixed(where).message());
      }
    }
    for (size_t i = 0; i < n; ++i) {
      if (args[i].color < 0) continue;
      const std::vector<int>& group = set.groups[size_t(args[i].color)];
      Prepared& p = st.groups[{set.label, group}];
      if (!p.shared) {
        p.shared = std::make_shared<GroupShared>();
        p.shared->ranks = group;
        p.shared->name = RankList(group) + " (" + set.label + ")";
      }
      p.comms[o.local_ranks[i]] = handles[i];
    }
    st.labels.push_back(set.label);
  }
  return Status::Ok();
}

Result<std::unique_ptr<Communicator>> NcclWorld::Group(int global_rank,
                                                       const std::vector<int>& ranks,
                                                       const std::string& label) {
  State& st = *state_;
  const std::string where = std::string(kName) + ": group " + RankList(ranks) + " (" + label + ")";
  PTDP_RETURN_IF_ERROR(CheckGroup(st.options.world_size, global_rank, ranks, where));
  if (!st.broken.empty()) return Status::Error(where + ": the world is unusable: " + st.broken);
  if (st.LocalIndex(global_rank) < 0)
    return Status::Error(where + ": rank " + std::to_string(global_rank) +
                         " is not driven by this process (local ranks " +
                         JoinRanks(st.options.local_ranks) + ")");
  auto it = st.groups.find({label, ranks});
  if (it == st.groups.end())
    return Status::Error(where + " was not prepared: NcclWorld creates its groups in Prepare(), "
                                 "whose sets must list it (Trainer::Create does)");
  const std::shared_ptr<CommHandle>& comm = it->second.comms.at(global_rank);
  const int me = int(std::find(ranks.begin(), ranks.end(), global_rank) - ranks.begin());
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(
      state_, it->second.shared, comm, me, label, st.options.stream_of(global_rank)));
}

}  // namespace ptdp::rt::cuda
