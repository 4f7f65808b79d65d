// Reproducible random test inputs: n floats uniform in [lo, hi) from a seeded mt19937.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace ptdp::testing {

inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

}  // namespace ptdp::testing
