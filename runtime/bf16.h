// bfloat16 rounding on the host: the value a float keeps when stored as bf16 (its top 16 bits
// after rounding to nearest, ties to even), back as a float. The same as CUDA's
// __float2bfloat16_rn followed by __bfloat162float: Inf stays Inf, NaN stays a (quiet) NaN,
// finite values past the largest bf16 (3.3895e38) round to Inf, -0.0 stays -0.0.
#pragma once

#include <cstdint>
#include <cstring>

namespace ptdp::rt {

inline float Bf16Round(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u) {
    if ((u & 0x007fffffu) != 0) u |= 0x00400000u;  // NaN: quiet, so truncation keeps it NaN
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);  // to nearest, ties to even (a carry may reach Inf)
  }
  u &= 0xffff0000u;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

}  // namespace ptdp::rt

namespace ptdp::rt {

// The 16 bits a bf16 tensor stores for x (Bf16Round's top half), and back to a float (exact).
inline uint16_t Bf16Bits(float x) {
  const float r = Bf16Round(x);
  uint32_t u;
  std::memcpy(&u, &r, sizeof u);
  return uint16_t(u >> 16);
}
inline float Bf16ToFloat(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
// n values at once, each as above.
inline void Bf16BitsOf(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Bf16Bits(src[i]);
}
inline void FloatsOfBf16(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(src[i]);
}

}  // namespace ptdp::rt
