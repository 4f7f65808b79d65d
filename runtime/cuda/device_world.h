// DeviceWorld: many ranks on ONE GPU, ranks as threads of one process, each rank with its own
// stream. NCCL before 2.30 refuses two ranks of a communicator on one device, yet a plan's layout
// (tp 2, pp 2, dp 2, ...) is worth running, and checking bit for bit against the CPU runtime, on a
// single GPU. The collectives and p2p are device-to-device copies and an ordered reduction kernel
// (device_reduce.h) on the calling rank's stream; the rendezvous, matching, timeouts and
// poisoned groups are runtime/rendezvous.h's, the same code ThreadWorld runs and the CPU tests
// prove. So the semantics are exactly ThreadWorld's:
//  - reductions combine the ranks' values in group-rank order ((x0 + x1) + x2) ..., one shared
//    result copied by every rank: bit-identical on every rank, run to run, and to ThreadWorld for
//    f32 (bf16 is also reduced here: accumulated in f32, rounded once);
//  - Send is a rendezvous (the receiver copies out of the sender's tensor); GroupStart/End post
//    sends first; a missing peer or mismatched calls are errors naming the ranks and the
//    operation after timeout_s; a failure fails the whole group.
//
// Streams and synchronisation. A rank's tensors are written by kernels on its stream (its
// CudaBackend's). Before other ranks read a rank's buffer, that rank synchronizes its stream
// (the "publish" point), and every rank synchronizes its stream after its own copies and
// reductions (the "finish" point) before the group's second barrier and before returning; so an
// operation returns with its result complete, as communicator.h asks, and no rank frees or
// overwrites a buffer another rank still reads. The cost is a stream synchronization per
// operation: DeviceWorld is for correctness and small runs on one GPU, not for overlap.
//
//   DeviceWorld world(4, /*timeout_s=*/30, /*device=*/0,
//                     [&](int g) { return backends[g]->stream(); });
//   auto tp = world.Group(r, grid.TpGroup(r), "TP");   // in rank r's thread or any thread
//
// Preconditions of every operation: tensors are device memory of `device` (or host memory the
// device can address), and the calling thread may be any thread (the device is made current).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/rendezvous.h"

typedef struct CUstream_st* cudaStream_t;

namespace ptdp::rt::cuda {

// The stream of a global rank: where its communicators enqueue their copies and reductions.
using StreamOf = std::function<cudaStream_t(int global_rank)>;

class DeviceWorld final : public CommunicatorFactory {
 public:
  // `stream_of(g)` is called by Group(g, ...) (so a launcher may create rank g's backend first,
  // as Trainer::Create does, and hand out its stream); nullptr means the legacy default stream.
  // Preconditions: world_size > 0, timeout_s > 0, stream_of set.
  DeviceWorld(int world_size, double timeout_s, int device, StreamOf stream_of);
  ~DeviceWorld() override;
  DeviceWorld(const DeviceWorld&) = delete;
  DeviceWorld& operator=(const DeviceWorld&) = delete;

  int world_size() const override;
  bool CollectivesBesideCompute() const override { return false; }  // the rank's stream
  double timeout_s() const;
  int device() const { return device_; }

  // As ThreadWorld::Group. Thread-safe if stream_of is.
  Result<std::unique_ptr<Communicator>> Group(int global_rank, const std::vector<int>& ranks,
                                              const std::string& label) override;

 private:
  Rendezvous rendezvous_;
  int device_;
  StreamOf stream_of_;
};

}  // namespace ptdp::rt::cuda
