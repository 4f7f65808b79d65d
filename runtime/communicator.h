// The Communicator interface: one rank's handle on one process group (a TP, DP, PP or embedding
// group of core/RankGrid) with NCCL's collectives and point-to-point operations, and the
// CommunicatorFactory that hands each rank its handles. Implementations: runtime/cpu/
// ThreadWorld (every rank a thread of one process, host memory), runtime/cuda/DeviceWorld (every
// rank a thread, all on one GPU) and runtime/cuda/NcclWorld (NCCL, one rank per GPU, any number
// of processes).
//
// Ranks: a group is a list of global ranks; group rank i is ranks[i] (RankGrid's group order).
// Every `peer` and `root` argument below is a group rank.
//
// Ordering rules (NCCL's, kept by every implementation so that a program that runs on threads
// also runs on NCCL):
//  - every member of a group issues the same collectives on it in the same order, each with the
//    same kind, dtype, element count, reduce op and root;
//  - every rank issues its operations on different groups in one order that cannot wait in a
//    cycle (e.g. all ranks: TP op, then DP op);
//  - an ungrouped Send blocks until the peer receives it, so two peers that both Send first
//    deadlock; bracket such exchanges in GroupStart()/GroupEnd() on both peers.
//
// Failures are Status values, never hangs: a peer that does not arrive within the timeout, calls
// that do not match between ranks, bad arguments. The message names the group (its global ranks
// and label), the operation and the ranks involved. After a failure the group is unusable:
// every later operation on it returns an error too (as an aborted NCCL communicator).
//
// A Communicator is used by one thread (its rank's); different ranks' handles may be used
// concurrently, which is the point.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/tensor.h"

namespace ptdp::rt {

enum class ReduceOp { kSum, kMax };

inline const char* ToString(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : "max"; }

class Communicator {
 public:
  virtual ~Communicator() = default;

  // This rank's index in the group, 0 <= rank() < size().
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The group's global ranks in group-rank order, and its label ("TP", "DP", ...).
  virtual const std::vector<int>& ranks() const = 0;
  virtual const std::string& label() const = 0;

  // ---- Collectives. Each returns when this rank's result is complete. A reduction's result is
  // identical on every rank. Reductions take fp32 (the CUDA communicator also bf16); gathers,
  // broadcasts and p2p copy any dtype. Not allowed between GroupStart() and GroupEnd().

  // t <- op over all ranks' t (in place). Precondition: t defined.
  virtual Status AllReduce(Tensor& t, ReduceOp op) = 0;
  // out <- concatenation along dim 0 of every rank's `in`, in group-rank order.
  // Preconditions: out.numel() == size() * in.numel(), same dtype; out does not overlap `in`,
  // except that `in` may be exactly this rank's slot of out (in place, as NCCL allows).
  virtual Status AllGather(const Tensor& in, Tensor& out) = 0;
  // out <- op over all ranks of block rank() of `in`, where `in` is split along dim 0 into
  // size() equal blocks. Precondition: in.numel() == size() * out.numel(), same dtype.
  virtual Status ReduceScatter(const Tensor& in, Tensor& out, ReduceOp op = ReduceOp::kSum) = 0;
  // t <- root's t on every rank.
  virtual Status Broadcast(Tensor& t, int root) = 0;
  // Returns once every rank of the group has called Barrier().
  virtual Status Barrier() = 0;

  // ---- Point to point. Messages between two ranks match in FIFO order; a Recv's tensor must
  // have the dtype and element count of the matching Send's.

  // Outside a group: blocks until `peer` has received t (t is read in place, not buffered).
  // Inside a group: recorded; t must stay valid and unchanged until GroupEnd() returns.
  virtual Status Send(const Tensor& t, int peer) = 0;
  // Outside a group: blocks until t holds the message. Inside a group: recorded; t is filled
  // by GroupEnd().
  virtual Status Recv(Tensor& t, int peer) = 0;
  // Brackets sends and receives that are posted together and complete together: GroupEnd()
  // posts every send first, then completes every receive and send, so two peers that both send
  // then receive inside a group do not deadlock. Groups nest; the outermost GroupEnd() runs the
  // operations and returns the first failure. Grouping covers this communicator's operations.
  virtual Status GroupStart() = 0;
  virtual Status GroupEnd() = 0;

  // ---- All-to-all with per-peer counts (MoE token dispatch and combine). `in` holds, in
  // group-rank order, send_counts[j] elements for each rank j (its own block included); `out`
  // receives recv_counts[j] elements from each rank j, in group-rank order. Flat: counts are
  // elements of the tensors' storage order. Every rank's send_counts[j] must equal rank j's
  // recv_counts[me]. The default runs one Send and one Recv per non-empty block inside a group
  // (NCCL's all-to-all-v: grouped ncclSend/ncclRecv, a rank's own block included), so every
  // implementation has it; not allowed between GroupStart() and GroupEnd().
  virtual Status AllToAll(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                          const std::vector<int64_t>& recv_counts) {
    const int n = size();
    const std::string what = "all-to-all on " + label() + ": ";
    if (int(send_counts.size()) != n || int(recv_counts.size()) != n)
      return Status::Error(what + "needs one send and one receive count per rank (" +
                           std::to_string(n) + ")");
    if (!in.defined() || !out.defined() || in.dtype() != out.dtype())
      return Status::Error(what + "undefined tensors or different dtypes");
    int64_t sent = 0, received = 0;
    for (int j = 0; j < n; ++j) {
      if (send_counts[size_t(j)] < 0 || recv_counts[size_t(j)] < 0)
        return Status::Error(what + "negative count for rank " + std::to_string(j));
      sent += send_counts[size_t(j)];
      received += recv_counts[size_t(j)];
    }
    if (sent != in.numel() || received != out.numel())
      return Status::Error(what + "counts add up to " + std::to_string(sent) + " sent / " +
                           std::to_string(received) + " received, the tensors hold " +
                           std::to_string(in.numel()) + " / " + std::to_string(out.numel()));
    PTDP_RETURN_IF_ERROR(GroupStart());
    Status st;
    int64_t at_in = 0, at_out = 0;
    for (int j = 0; j < n && st.ok(); ++j) {
      const int64_t k = send_counts[size_t(j)];
      if (k > 0) st = Send(in.View(Shape({k}), at_in), j);
      at_in += k;
    }
    for (int j = 0; j < n && st.ok(); ++j) {
      const int64_t k = recv_counts[size_t(j)];
      if (k > 0) {
        Tensor block = out.View(Shape({k}), at_out);
        st = Recv(block, j);
      }
      at_out += k;
    }
    const Status end = GroupEnd();
    return st.ok() ? end : st;
  }

  // ---- For a thread beside the rank's (the trainer's GradReducer). MarkReady(), on the rank's
  // thread when it hands an operation over, marks the work the rank has issued so far;
  // RunAfter(mark), on the other thread just before the operation, makes that operation wait
  // for the marked work only, not for what the rank's thread issued since (on an asynchronous
  // device: an event of the rank's stream, as Megatron's communication stream waits for the
  // compute stream at dispatch); RunAfter(nullptr) clears a mark no call used. Where a call's
  // inputs are complete when it is made (the CPU) there is no mark (null) and nothing to do.
  class ReadyMark {
   public:
    virtual ~ReadyMark() = default;
  };
  virtual Result<std::shared_ptr<ReadyMark>> MarkReady() { return std::shared_ptr<ReadyMark>(); }
  virtual void RunAfter(std::shared_ptr<ReadyMark> mark) { (void)mark; }
};

// One label's groups, for CommunicatorFactory::Prepare: disjoint lists of global ranks, each in
// group-rank order. A rank in none of them takes no part in this label (e.g. "EMB": only the
// first and last pipeline stages).
struct GroupSet {
  std::string label;
  std::vector<std::vector<int>> groups;
};

// Hands each rank its communicators. One factory serves the whole world (ThreadWorld is shared
// by the rank threads; an NCCL factory is per process and may drive several ranks).
class CommunicatorFactory {
 public:
  virtual ~CommunicatorFactory() = default;

  virtual int world_size() const = 0;

  // Announces, once and before any Group(), every group that will be asked for, label by label,
  // in the same order in every process (Trainer::Create calls it with RankGrid's TP, PP, DP, EMB
  // and WORLD groups). A factory whose groups must be created collectively by every rank of the
  // world (NCCL: ncclCommSplit from the world communicator) creates them all here, so that the
  // Group() calls, which come one rank after another from one thread, never block. Factories
  // that create groups on demand (the in-process ones) keep this default. Errors: groups that
  // overlap within a label, ranks outside the world, or the creation failing.
  virtual Status Prepare(const std::vector<GroupSet>& sets) { return Status::Ok(); }

  // Whether a thread beside each rank's can run collectives while the rank computes, which
  // --overlap-grad-reduce needs (the trainer's GradReducer): NCCL, on a stream of its own (the
  // default, true); ThreadWorld when every rank and its reducer have a core of their own
  // (2 x world size <= cores: on fewer, the reducer's rendezvous and copies would take the cores
  // the ranks compute on, and its waits could not spin); never DeviceWorld (one GPU, the rank's
  // stream). Without it the trainer reduces after the backward, as Megatron does without the
  // flag (the same sums).
  virtual bool CollectivesBesideCompute() const { return true; }

  // The communicator of `global_rank` on the group `ranks` (global ranks, group-rank order, no
  // duplicates, containing global_rank). Each member calls it once for its own handle; members
  // create their groups in the same order (an NCCL factory creates them collectively).
  // Two calls with the same ranks and label give handles on the same group; a different label
  // gives an independent group (as two NCCL communicators), e.g. PP [0,4] and embedding [0,4].
  // Errors: a rank outside [0, world_size()), a duplicate, global_rank not in ranks.
  virtual Result<std::unique_ptr<Communicator>> Group(int global_rank,
                                                      const std::vector<int>& ranks,
                                                      const std::string& label) = 0;
};

}  // namespace ptdp::rt
