// A CommunicatorFactory that forwards to another and says its collectives can run beside
// compute (CommunicatorFactory::CollectivesBesideCompute), so that the trainer runs
// --overlap-grad-reduce's GradReducer whatever the cores of the test machine (ThreadWorld says
// so only when every rank and its reducer have a core of their own).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/communicator.h"

namespace ptdp::testing {

class BesideWorld final : public rt::CommunicatorFactory {
 public:
  explicit BesideWorld(rt::CommunicatorFactory& inner) : in_(inner) {}  // inner outlives this
  int world_size() const override { return in_.world_size(); }
  Status Prepare(const std::vector<rt::GroupSet>& sets) override { return in_.Prepare(sets); }
  bool CollectivesBesideCompute() const override { return true; }
  Result<std::unique_ptr<rt::Communicator>> Group(int global_rank, const std::vector<int>& ranks,
                                                  const std::string& label) override {
    return in_.Group(global_rank, ranks, label);
  }

 private:
  rt::CommunicatorFactory& in_;
};

}  // namespace ptdp::testing
