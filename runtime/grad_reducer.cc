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

uint64_t GradReducer::Launch(Communicator* group, Tensor grads, int tag) {
  return Push({Kind::kAllReduce, group, std::move(grads), Tensor(), tag, nullptr});
}

uint64_t GradReducer::LaunchReduceScatter(Communicator* group, Tensor in, Tensor out, int tag) {
  return Push({Kind::kReduceScatter, group, std::move(in), std::move(out), tag, nullptr});
}

uint64_t GradReducer::LaunchAllGather(Communicator* group, Tensor in, Tensor out, int tag) {
  return Push({Kind::kAllGather, group, std::move(in), std::move(out), tag, nullptr});
}

uint64_t GradReducer::Push(Job job) {
  // On the caller's (the rank's) thread: the work the job waits for. A failed mark leaves the
  // job waiting for all the rank's work at its start, as a plain call does.
  if (auto mark = job.group->MarkReady(); mark.ok()) job.ready = std::move(mark).value();
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(job));
    ticket = ++pushed_;
  }
  cv_.notify_all();
  return ticket;
}

Status GradReducer::Wait(std::vector<Span>* spans) {
  uint64_t all = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    all = pushed_;
  }
  return WaitFor(all, spans);
}

Status GradReducer::WaitFor(uint64_t ticket, std::vector<Span>* spans) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this, ticket] { return finished_ >= ticket; });
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
    lock.unlock();
    const Clock::time_point start = Clock::now();
    job.group->RunAfter(std::move(job.ready));
    Status st = job.kind == Kind::kReduceScatter
                    ? job.group->ReduceScatter(job.in, job.out, ReduceOp::kSum)
                : job.kind == Kind::kAllGather ? job.group->AllGather(job.in, job.out)
                                               : job.group->AllReduce(job.in, ReduceOp::kSum);
    // Cleared whether or not the call used it (one that returns early does not), so that no
    // later call of the handle, the rank's own included, waits for this older mark.
    job.group->RunAfter(nullptr);
    const Clock::time_point end = Clock::now();
    lock.lock();
    ++finished_;
    spans_.push_back({job.tag, start, end});
    if (!st.ok() && first_error_.ok()) {
      const std::string what = job.kind == Kind::kReduceScatter ? "reduce-scatter of gradient bucket "
                               : job.kind == Kind::kAllGather
                                   ? "all-gather of parameter "
                                   : "all-reduce of gradient bucket ";
      first_error_ = st.Prefixed(what + std::to_string(job.tag) +
                                 (job.kind == Kind::kAllGather ? " beside the forward"
                                                               : " beside the backward"));
    }
    cv_.notify_all();
  }
}

}  // namespace ptdp::rt
