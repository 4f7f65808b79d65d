// ThreadWorld: the in-process CommunicatorFactory of the CPU runtime. Every rank is a std::thread
// of one process; ranks exchange data by reading each other's buffers directly (no copies into
// queues), with a mutex and condition variable per group.
//
//   ThreadWorld world(8, /*timeout_s=*/5.0);            // shared by the 8 rank threads
//   // in the thread of global rank r:
//   auto tp = world.Group(r, grid.TpGroup(r), "TP");     // Result<unique_ptr<Communicator>>
//   Status s = (*tp)->AllReduce(x, ReduceOp::kSum);
//
// Semantics (see runtime/communicator.h for the interface contract):
//  - Determinism: reductions add (or max) the ranks' values in group-rank order,
//    ((x0 + x1) + x2) + ..., and every rank copies the one shared result, so results are
//    bit-identical on every rank and from run to run whatever the thread timing.
//  - Collectives: a two-phase rendezvous per group. Each rank deposits pointers to its buffers
//    and waits until all members arrived; then each rank computes its share (a chunk of an
//    all-reduce, its own output otherwise) by reading the others' buffers; a second barrier
//    keeps every buffer valid until all have finished reading.
//  - Send is a rendezvous, not buffered: the receiver copies straight from the sender's tensor,
//    and an ungrouped Send returns once received (NCCL's behaviour for large messages, so the
//    "both peers send first" bug shows up here too, as a timeout instead of a hang).
//  - Timeout: a rank waiting for peers to arrive (a collective) or to match its message (p2p)
//    gives up after timeout_s and fails the group with a message naming the operation, the
//    ranks that arrived and what each missing rank is doing (e.g. "waiting in recv #1 from rank
//    2 on group [0,2] (PP)"). Once every member has arrived the operation always completes.
//  - Any failure (timeout, mismatched calls, a bad argument on one rank) fails the whole group at
//    once: ranks waiting on it return the error at once and later calls on it are refused.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/communicator.h"

namespace ptdp::rt {

class ThreadWorld final : public CommunicatorFactory {
 public:
  // Preconditions: world_size > 0, timeout_s > 0.
  ThreadWorld(int world_size, double timeout_s);
  ~ThreadWorld() override;
  ThreadWorld(const ThreadWorld&) = delete;
  ThreadWorld& operator=(const ThreadWorld&) = delete;

  int world_size() const override;
  double timeout_s() const;

  // Thread-safe. The handles keep the shared group state alive, so they may outlive the world.
  Result<std::unique_ptr<Communicator>> Group(int global_rank, const std::vector<int>& ranks,
                                              const std::string& label) override;

  struct State;  // defined in the .cc

 private:
  std::shared_ptr<State> state_;
};

}  // namespace ptdp::rt
