// GradReducer: Megatron's --overlap-grad-reduce on one rank. The trainer hands it each gradient
// bucket (all-reduce; with the distributed optimizer, each parameter's reduce-scatter) as soon as the last micro-batch's backward has completed the bucket's gradients (the
// grad-ready moments of GptChunk::Backward); a thread of the rank's own runs the buckets'
// all-reduces one after another, in hand-over order, while the rank's thread goes on with the
// backward; Wait() returns when every bucket handed over is reduced (the start of the
// optimizer step: Megatron's finish_grad_sync).
//
// Source: megatron/core/distributed/distributed_data_parallel.py and param_and_grad_buffer.py
// (register_grad_ready, start_grad_sync, finish_grad_sync): a bucket's collective starts when
// all its parameters' gradients are ready in the last micro-batch, on a communication stream,
// and the optimizer waits for all of them.
//
// Ordering (communicator.h's rules): every rank of a group hands over the same buckets in the
// same order (they have the same chunks and parameters), and only this thread uses the
// buckets' communicators between the first Launch() and Wait(), so the rank's thread may use
// its other groups (TP, CP, PP, EP) meanwhile. Only communicator calls run here; no Backend
// call (the backends are used by their rank's thread only).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "core/status.h"
#include "runtime/communicator.h"
#include "runtime/tensor.h"

namespace ptdp::rt {

class GradReducer {
 public:
  using Clock = std::chrono::steady_clock;
  // One reduced bucket: when its all-reduce ran (host clock), and its tag (Launch's).
  struct Span {
    int tag = 0;
    Clock::time_point start, end;
  };

  GradReducer();
  ~GradReducer();  // finishes what was handed over, then stops the thread
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Hands over an all-reduce (SUM) of `grads` over `group`: runs after every earlier one.
  // `grads` must stay valid and untouched by the caller until Wait() returns.
  void Launch(Communicator* group, Tensor grads, int tag);
  // The same for a reduce-scatter (SUM) of `in` into `out` (the distributed optimizer's slice).
  void LaunchReduceScatter(Communicator* group, Tensor in, Tensor out, int tag);
  // Blocks until everything handed over has run; returns the first failure since the last
  // Wait() (later buckets still ran: their groups refuse at once after a failure) and appends
  // each bucket's Span to `spans` when given.
  Status Wait(std::vector<Span>* spans = nullptr);

 private:
  struct Job {
    Communicator* group;
    Tensor in, out;  // out undefined: an all-reduce of `in` in place
    int tag;
  };
  void Push(Job job);
  void Work();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  size_t running_ = 0;  // jobs taken but not finished (0 or 1)
  bool stop_ = false;
  Status first_error_;
  std::vector<Span> spans_;
  std::thread thread_;
};

}  // namespace ptdp::rt
