// A fake Estimator for planner tests: step time and memory are simple functions of the layout
// chosen so that the expected ranking is obvious.
#pragma once

#include "cost_model/analytic.h"

namespace ptdp::testing {

// step time = 1 + 0.1 * pp + 0.01 * micro_batch + (sp ? 0 : 0.001) seconds; memory = 10 GiB *
// micro_batch / pp; capacity 40 GiB. So the best layout has the smallest pp, then the smallest
// micro-batch, SP on; layouts with micro_batch / pp > 4 do not fit.
class FakeEstimator : public Estimator {
 public:
  Estimate Evaluate(const Layout& l) const override {
    ++calls;
    Estimate e;
    e.step_time_s = 1 + 0.1 * l.pp + 0.01 * l.micro_batch + (l.sequence_parallel ? 0 : 0.001);
    e.breakdown.compute_s = e.step_time_s;
    e.memory.total = 10.0 * 1073741824.0 * l.micro_batch / l.pp;
    e.memory.capacity = 40.0 * 1073741824.0;
    e.fits = e.memory.total <= e.memory.capacity;
    return e;
  }
  mutable int calls = 0;
};

}  // namespace ptdp::testing
