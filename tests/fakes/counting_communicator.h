// Test double at the CommunicatorFactory seam: every handle comes from a real factory (a
// ThreadWorld) and forwards every operation; the handles of one global rank count the
// all-reduces they run and the elements they reduce, per group label.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/communicator.h"

namespace ptdp::testing {

struct AllReduceCount {
  int calls = 0;
  int64_t elements = 0;
};

class CountingCommunicator final : public rt::Communicator {
 public:
  using Record = std::function<void(const std::string& label, int64_t elements)>;
  CountingCommunicator(std::unique_ptr<rt::Communicator> inner, Record record)
      : in_(std::move(inner)), record_(std::move(record)) {}
  int rank() const override { return in_->rank(); }
  int size() const override { return in_->size(); }
  const std::vector<int>& ranks() const override { return in_->ranks(); }
  const std::string& label() const override { return in_->label(); }
  Status AllReduce(rt::Tensor& t, rt::ReduceOp op) override {
    record_(in_->label(), t.numel());
    return in_->AllReduce(t, op);
  }
  Status AllGather(const rt::Tensor& in, rt::Tensor& out) override {
    return in_->AllGather(in, out);
  }
  Status ReduceScatter(const rt::Tensor& in, rt::Tensor& out, rt::ReduceOp op) override {
    return in_->ReduceScatter(in, out, op);
  }
  Status Broadcast(rt::Tensor& t, int root) override { return in_->Broadcast(t, root); }
  Status Barrier() override { return in_->Barrier(); }
  Status Send(const rt::Tensor& t, int peer) override { return in_->Send(t, peer); }
  Status Recv(rt::Tensor& t, int peer) override { return in_->Recv(t, peer); }
  Status GroupStart() override { return in_->GroupStart(); }
  Status GroupEnd() override { return in_->GroupEnd(); }
  Status AllToAll(const rt::Tensor& in, const std::vector<int64_t>& send_counts, rt::Tensor& out,
                  const std::vector<int64_t>& recv_counts) override {
    return in_->AllToAll(in, send_counts, out, recv_counts);
  }
  Result<std::shared_ptr<ReadyMark>> MarkReady() override { return in_->MarkReady(); }
  void RunAfter(std::shared_ptr<ReadyMark> mark) override { in_->RunAfter(std::move(mark)); }

 private:
  std::unique_ptr<rt::Communicator> in_;
  Record record_;
};

class CountingWorld final : public rt::CommunicatorFactory {
 public:
  // `inner` must outlive this. Counts what the handles of global rank `rank` run.
  CountingWorld(rt::CommunicatorFactory& inner, int rank) : in_(inner), rank_(rank) {}
  int world_size() const override { return in_.world_size(); }
  Status Prepare(const std::vector<rt::GroupSet>& sets) override { return in_.Prepare(sets); }
  bool CollectivesBesideCompute() const override { return in_.CollectivesBesideCompute(); }
  Result<std::unique_ptr<rt::Communicator>> Group(int global_rank, const std::vector<int>& ranks,
                                                  const std::string& label) override {
    auto c = in_.Group(global_rank, ranks, label);
    if (!c.ok() || global_rank != rank_) return c;
    return std::unique_ptr<rt::Communicator>(new CountingCommunicator(
        std::move(c).value(), [this](const std::string& l, int64_t n) {
          std::lock_guard<std::mutex> lock(mu_);
          AllReduceCount& c = counts_[l];
          ++c.calls;
          c.elements += n;
        }));
  }
  // The all-reduces counted so far on groups labelled `label`, and forgets all counts.
  std::map<std::string, AllReduceCount> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(counts_, {});
  }

 private:
  rt::CommunicatorFactory& in_;
  int rank_;
  std::mutex mu_;
  std::map<std::string, AllReduceCount> counts_;
};

}  // namespace ptdp::testing
