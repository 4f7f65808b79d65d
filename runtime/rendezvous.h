// Rendezvous: the control plane shared by the communicators whose ranks are threads of one
// process (runtime/cpu ThreadWorld: host memory; runtime/cuda DeviceWorld: many ranks on one
// GPU). It owns everything but the bytes: groups, the two-phase rendezvous of collectives,
// FIFO p2p mailboxes with rendezvous sends, GroupStart/End, matching of calls, timeouts that name
// the missing rank and what it is doing, and failures that poison a group. The bytes move through
// a RankPlane, one per rank and group handle: host memcpy and loops, or device copies and a
// reduction kernel on the rank's stream. So the logic the GPU path runs is the logic the CPU
// tests (and ThreadSanitizer) prove.
//
//   Rendezvous world(4, /*timeout_s=*/5.0, "thread communicator");
//   // in the thread of global rank r:
//   auto c = world.Group(r, {0, 1, 2, 3}, "TP", std::make_unique<HostPlane>());
//   Status s = (*c)->AllReduce(x, ReduceOp::kSum);
//
// Semantics (runtime/communicator.h is the interface contract):
//  - Determinism: a reduction combines the ranks' values in group-rank order,
//    ((x0 op x1) op x2) op ..., into one shared result that every rank copies, so results are
//    bit-identical on every rank and from run to run, whatever the thread timing.
//  - Collectives: each rank makes its input visible (RankPlane::Publish), deposits pointers to
//    its buffers and waits until all members arrived; then each rank computes its share (a chunk
//    of an all-reduce, its own output otherwise) by reading the others' buffers and waits for its
//    own plane (Finish); a second barrier keeps every buffer valid until all have finished
//    reading.
//  - p2p: a send is a rendezvous, not buffered: the receiver copies straight from the sender's
//    tensor (after the sender published it) and finishes the copy before the send completes. An
//    ungrouped Send returns once received (NCCL's behaviour for large messages, so the "both
//    peers send first" bug shows up here too, as a timeout instead of a hang).
//  - Timeout: a rank waiting for peers to arrive (a collective) or to match its message (p2p)
//    gives up after timeout_s and fails the group with a message naming the operation, the ranks
//    that arrived and what each missing rank is doing (e.g. "waiting in recv #1 from rank 2 on
//    group [0,2] (PP)"). Once every member has arrived the operation always completes.
//  - Waiting: a rank waiting for its peers spins (polling, then yielding its core) for up to
//    spin_s before it sleeps, so that a kernel wake-up (tens of microseconds on a VM, more on a
//    busy host) does not land in every collective; spin_s defaults to 20 ms when the world has
//    no more ranks than the machine has cores and to 0 (sleep at once) otherwise.
//  - Any failure (timeout, mismatched calls, a bad argument on one rank, a failed plane
//    operation) fails the whole group at once: ranks waiting on it return the error at once and
//    later calls on it are refused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/communicator.h"
#include "runtime/tensor.h"

namespace ptdp::rt {

// One rank's data plane on one group handle. Used only by that rank's thread, except Allocate
// (called by whichever member arrives last, under the group's lock). Buffers passed in may belong
// to other ranks (the core guarantees they stay valid until the caller's Finish returns).
class RankPlane {
 public:
  virtual ~RankPlane() = default;

  // Makes this rank's work so far visible to the other ranks' planes: everything written to the
  // buffers it is about to share (host: nothing to do; device: synchronize its stream).
  virtual Status Publish() = 0;
  // dst[0, bytes) <- src[0, bytes). May only be enqueued; Finish completes it.
  virtual Status Copy(void* dst, const void* src, size_t bytes) = 0;
  // dst[e] = ((in[0][e] op in[1][e]) op in[2][e]) ... for e < count, in exactly this order, for
  // a dtype in ReduceDTypes(). dst does not overlap any input. kMax propagates NaN. May only be
  // enqueued; Finish completes it.
  virtual Status Reduce(void* dst, const std::vector<const void*>& in, int64_t count, DType dtype,
                        ReduceOp op) = 0;
  // Waits until every Copy and Reduce issued so far has completed.
  virtual Status Finish() = 0;
  // `bytes` (> 0) of memory that every rank's plane of this world can read and write (host
  // memory, or memory of the shared device). Freed when the last pointer goes.
  virtual Result<std::shared_ptr<void>> Allocate(size_t bytes) = 0;
  // The dtypes Reduce takes, e.g. {kF32}.
  virtual std::vector<DType> ReduceDTypes() const = 0;
};

class Rendezvous {
 public:
  // `name` starts every message ("thread communicator", "device communicator"). The first form
  // spins for PTDP_COMM_SPIN_US microseconds when that is set to a number >= 0, else for
  // DefaultSpinSeconds(world_size, this machine's hardware threads).
  // Preconditions: world_size > 0, timeout_s > 0, spin_s >= 0.
  Rendezvous(int world_size, double timeout_s, std::string name);
  Rendezvous(int world_size, double timeout_s, std::string name, double spin_s);
  // How long a waiting rank spins before sleeping: 20 ms when world_size <= cores, else 0.
  static double DefaultSpinSeconds(int world_size, int cores);
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  int world_size() const;
  double timeout_s() const;
  double spin_s() const;

  // As CommunicatorFactory::Group (same errors), with this rank's data plane for the handle.
  // Thread-safe. The handles keep the shared state alive, so they may outlive the Rendezvous.
  Result<std::unique_ptr<Communicator>> Group(int global_rank, const std::vector<int>& ranks,
                                              const std::string& label,
                                              std::unique_ptr<RankPlane> plane);

  struct State;  // defined in the .cc

 private:
  std::shared_ptr<State> state_;
};

}  // namespace ptdp::rt
