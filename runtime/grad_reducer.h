// GradReducer: Megatron's --overlap-grad-reduce and --overlap-param-gather on one rank. The
// trainer hands it each gradient bucket (all-reduce; with the distributed optimizer, each
// parameter's reduce-scatter) as soon as the last micro-batch's backward has completed the
// bucket's gradients (the grad-ready moments of GptChunk::Backward), and with the distributed
// optimizer, after AdamW, the all-gather of each parameter's updated slices in the order the
// next forward needs them. A thread of the rank's own runs them one after another, in hand-over
// order, while the rank's thread goes on with the backward (the next forward); Wait() returns
// when every job handed over has run (the start of the optimizer step: Megatron's
// finish_grad_sync), WaitFor(n) when the first n have (the forward's wait for a layer's
// parameters: finish_param_sync).
//
// Source: megatron/core/distributed/distributed_data_parallel.py and param_and_grad_buffer.py
// (register_grad_ready, start_grad_sync, finish_grad_sync; start_param_sync and the forward
// pre-hook's finish_param_sync): a bucket's collective starts when all its parameters'
// gradients are ready in the last micro-batch, on a communication stream, and the optimizer
// waits for all of them; the parameters' all-gathers run on it under the next forward, each
// module waiting for its own before it computes.
//
// Each job waits for the rank's work issued before its hand-over, not for what the rank issued
// since (Communicator::MarkReady at the hand-over, RunAfter before the job: on a GPU, an event of
// the rank's stream).
//
// Ordering (communicator.h's rules): every rank of a group hands over the same buckets in the
// same order (they have the same chunks and parameters), and only this thread uses the
// buckets' communicators between the first Launch() and Wait(), so the rank's thread may use
// its other groups (TP, CP, PP, EP) meanwhile. Only communicator calls run here; no Backend
// call (the backends are used by their rank's thread only).
#pragma once

#include <chrono>
#include <cstdint>
#include <condition_variable>
#include <deque>
#include <memory>
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

  // Each Launch returns the job's ticket: the number of jobs handed over so far, this one
  // included (WaitFor's argument).
  // Hands over an all-reduce (SUM) of `grads` over `group`: runs after every earlier one.
  // `grads` must stay valid and untouched by the caller until the job has run.
  uint64_t Launch(Communicator* group, Tensor grads, int tag);
  // The same for a reduce-scatter (SUM) of `in` into `out` (the distributed optimizer's slice).
  uint64_t LaunchReduceScatter(Communicator* group, Tensor in, Tensor out, int tag);
  // The same for an all-gather of `in` (this rank's block) into `out` (the updated parameter).
  uint64_t LaunchAllGather(Communicator* group, Tensor in, Tensor out, int tag);
  // Blocks until everything handed over has run; returns the first failure since the last
  // wait (later jobs still ran: their groups refuse at once after a failure) and appends each
  // finished job's Span to `spans` when given.
  Status Wait(std::vector<Span>* spans = nullptr);
  // The same until the first `ticket` jobs handed over have run (later ones may still run).
  Status WaitFor(uint64_t ticket, std::vector<Span>* spans = nullptr);

 private:
  enum class Kind { kAllReduce, kReduceScatter, kAllGather };
  struct Job {
    Kind kind;
    Communicator* group;
    Tensor in, out;  // out undefined: an all-reduce of `in` in place
    int tag;
    // The rank's work at the hand-over (Communicator::MarkReady), which the job waits for.
    std::shared_ptr<Communicator::ReadyMark> ready;
  };
  uint64_t Push(Job job);
  void Work();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  uint64_t pushed_ = 0, finished_ = 0;  // jobs handed over, jobs run (in that order)
  bool stop_ = false;
  Status first_error_;
  std::vector<Span> spans_;
  std::thread thread_;
};

}  // namespace ptdp::rt
