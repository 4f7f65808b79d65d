// Planner test helpers: a search space of a world and a global batch, and a search that fails
// the test (not the caller) when SearchLayouts refuses.
#pragma once

#include <gtest/gtest.h>

#include "planner/planner.h"

namespace ptdp::testing {

inline SearchSpace Space(int world, int64_t batch) {
  SearchSpace s;
  s.world = world;
  s.global_batch = batch;
  return s;
}

inline PlanResult Search(const Estimator& est, const ModelSpec& m, const ClusterSpec& c,
                         const SearchSpace& s, int top_k) {
  auto r = SearchLayouts(est, m, c, s, top_k);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? *r : PlanResult{};
}

}  // namespace ptdp::testing
