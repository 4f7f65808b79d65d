#include "runtime/grad_reducer.h"

#include <string>
#include <utility>

namespace ptdp::rt {

GradReducer::GradReducer() : thread_([this] { Work(); }) {}

GradReducer::~GradReducer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void GradReducer::Launch(Communicator* group, Tensor grads, int tag) {
  Push({group, std::move(grads), Tensor(), tag});
}

void GradReducer::LaunchReduceScatter(Communicator* group, Tensor in, Tensor out, int tag) {
  Push({group, std::move(in), std::move(out), tag});
}

void GradReducer::Push(Job job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(job));
  }
  cv_.notify_all();
}

Status GradReducer::Wait(std::vector<Span>* spans) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return queue_.empty() && running_ == 0; });
  if (spans) spans->insert(spans->end(), spans_.begin(), spans_.end());
  spans_.clear();
  return std::exchange(first_error_, Status::Ok());
}

void GradReducer::Work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    // Stops only once the queue is empty: a destroyed reducer finishes what was handed over
    // (its peers' reducers wait for these collectives).
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;
    Job job = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    lock.unlock();
    const Clock::time_point start = Clock::now();
    Status st = job.out.defined() ? job.group->ReduceScatter(job.in, job.out, ReduceOp::kSum)
                                  : job.group->AllReduce(job.in, ReduceOp::kSum);
    const Clock::time_point end = Clock::now();
    lock.lock();
    --running_;
    spans_.push_back({job.tag, start, end});
    if (!st.ok() && first_error_.ok())
      first_error_ = st.Prefixed(std::string(job.out.defined() ? "reduce-scatter" : "all-reduce") +
                                 " of gradient bucket " + std::to_string(job.tag) +
                                 " beside the backward");
    cv_.notify_all();
  }
}

}  // namespace ptdp::rt
