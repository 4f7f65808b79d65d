// Test doubles at the Backend seam (over runtime/forwarding_backend.h): PoisonBackend, once
// armed, writes NaN (or Inf) into the next bias gradient it computes, the way a numerically
// broken step would, so tests can check how the trainer reacts.
#pragma once

#include <atomic>
#include <limits>
#include <memory>
#include <utility>

#include "runtime/backend.h"
#include "runtime/forwarding_backend.h"

namespace ptdp::testing {

using rt::Backend;
using rt::ForwardingBackend;
using rt::DType;
using rt::SeqBlock;
using rt::Shape;
using rt::Tensor;
using rt::TokenOrder;

// After Arm(value), the next BiasGrad writes `value` (NaN or Inf) into the whole dbias.
// Arm is called by the test thread between steps; BiasGrad runs on the rank's thread.
class PoisonBackend final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  void Arm(float value) {
    value_ = value;
    armed_.store(true);
  }
  int poisoned() const { return poisoned_.load(); }
  void BiasGrad(const Tensor& dy, Tensor& dbias) override {
    inner().BiasGrad(dy, dbias);
    if (armed_.exchange(false)) {
      inner().Fill(value_, dbias);
      ++poisoned_;
    }
  }

 private:
  std::atomic<bool> armed_{false};
  std::atomic<int> poisoned_{0};
  float value_ = std::numeric_limits<float>::quiet_NaN();
};

}  // namespace ptdp::testing
