// ThreadWorld: the in-process CommunicatorFactory of the CPU runtime. Every rank is a std::thread
// of one process; ranks exchange data by reading each other's host buffers directly (no copies
// into queues). The logic (rendezvous, matching, timeouts, poisoned groups) is runtime/
// rendezvous.h's, shared with the GPU's DeviceWorld; this file adds the host data plane
// (memcpy, and reductions in group-rank order on the calling thread).
//
//   ThreadWorld world(8, /*timeout_s=*/5.0);            // shared by the 8 rank threads
//   // in the thread of global rank r:
//   auto tp = world.Group(r, grid.TpGroup(r), "TP");     // Result<unique_ptr<Communicator>>
//   Status s = (*tp)->AllReduce(x, ReduceOp::kSum);
//
// Semantics: those of runtime/rendezvous.h (deterministic group-rank-order reductions,
// bit-identical on every rank; rendezvous sends; timeouts naming the missing rank and what it is
// doing; a failure fails the whole group). Reductions take f32.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/rendezvous.h"

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
  bool CollectivesBesideCompute() const override;

  // Thread-safe. The handles keep the shared group state alive, so they may outlive the world.
  Result<std::unique_ptr<Communicator>> Group(int global_rank, const std::vector<int>& ranks,
                                              const std::string& label) override;

 private:
  Rendezvous rendezvous_;
};

}  // namespace ptdp::rt
