// Test double at the CommunicatorFactory seam: a world in which one rank stops answering. Every
// handle comes from a real factory (a ThreadWorld); the chosen rank's handle on the group with
// the chosen label stalls in its n-th operation (collective, or p2p group end / send / recv):
// it sleeps stall_s, longer than the world's timeout, then gives up with an error of its own,
// so the other ranks must be released by their timeouts, not by the staller.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/communicator.h"

namespace ptdp::testing {

class StallingCommunicator final : public rt::Communicator {
 public:
  StallingCommunicator(std::unique_ptr<rt::Communicator> inner, int nth, double stall_s,
                       std::atomic<int>* stalls)
      : in_(std::move(inner)), nth_(nth), stall_s_(stall_s), stalls_(stalls) {}
  int rank() const override { return in_->rank(); }
  int size() const override { return in_->size(); }
  const std::vector<int>& ranks() const override { return in_->ranks(); }
  const std::string& label() const override { return in_->label(); }
  Status AllReduce(rt::Tensor& t, rt::ReduceOp op) override {
    if (Stall()) return GaveUp("all-reduce");
    return in_->AllReduce(t, op);
  }
  Status AllGather(const rt::Tensor& in, rt::Tensor& out) override {
    if (Stall()) return GaveUp("all-gather");
    return in_->AllGather(in, out);
  }
  Status ReduceScatter(const rt::Tensor& in, rt::Tensor& out, rt::ReduceOp op) override {
    if (Stall()) return GaveUp("reduce-scatter");
    return in_->ReduceScatter(in, out, op);
  }
  Status Broadcast(rt::Tensor& t, int root) override {
    if (Stall()) return GaveUp("broadcast");
    return in_->Broadcast(t, root);
  }
  Status Barrier() override {
    if (Stall()) return GaveUp("barrier");
    return in_->Barrier();
  }
  // Inside a group the p2p calls are only recorded; the stall happens where they run.
  Status Send(const rt::Tensor& t, int peer) override {
    if (depth_ == 0 && Stall()) return GaveUp("send");
    return in_->Send(t, peer);
  }
  Status Recv(rt::Tensor& t, int peer) override {
    if (depth_ == 0 && Stall()) return GaveUp("recv");
    return in_->Recv(t, peer);
  }
  Status GroupStart() override {
    ++depth_;
    return in_->GroupStart();
  }
  Status GroupEnd() override {
    // On a stall the recorded calls are never run: this handle is dead, as the rank is.
    if (--depth_ == 0 && Stall()) return GaveUp("group end");
    return in_->GroupEnd();
  }
  Result<std::shared_ptr<ReadyMark>> MarkReady() override { return in_->MarkReady(); }
  void RunAfter(std::shared_ptr<ReadyMark> mark) override { in_->RunAfter(std::move(mark)); }

 private:
  // True on the n-th operation: sleeps first (the rank "stops answering").
  bool Stall() {
    if (++calls_ != nth_) return false;
    ++*stalls_;
    std::this_thread::sleep_for(std::chrono::duration<double>(stall_s_));
    return true;
  }
  Status GaveUp(const std::string& op) {
    return Status::Error("test double: stalled " + std::to_string(stall_s_) + " s in " + op +
                         " on " + in_->label() + ", then gave up");
  }

  std::unique_ptr<rt::Communicator> in_;
  int nth_;
  double stall_s_;
  std::atomic<int>* stalls_;
  int calls_ = 0;
  int depth_ = 0;
};

class StallingWorld final : public rt::CommunicatorFactory {
 public:
  // `inner` must outlive this. The handle of `rank` on groups labelled `label` stalls in its
  // `nth` operation (1-based) for stall_s seconds.
  StallingWorld(rt::CommunicatorFactory& inner, int rank, std::string label, int nth,
                double stall_s)
      : in_(inner), rank_(rank), label_(std::move(label)), nth_(nth), stall_s_(stall_s) {}
  int world_size() const override { return in_.world_size(); }
  Result<std::unique_ptr<rt::Communicator>> Group(int global_rank, const std::vector<int>& ranks,
                                                  const std::string& label) override {
    auto c = in_.Group(global_rank, ranks, label);
    if (!c.ok() || global_rank != rank_ || label != label_) return c;
    return std::unique_ptr<rt::Communicator>(
        new StallingCommunicator(std::move(c).value(), nth_, stall_s_, &stalls_));
  }
  int stalls() const { return stalls_.load(); }

 private:
  rt::CommunicatorFactory& in_;
  int rank_;
  std::string label_;
  int nth_;
  double stall_s_;
  std::atomic<int> stalls_{0};
};

}  // namespace ptdp::testing
