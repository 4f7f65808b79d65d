// Shared pieces of the libFuzzer targets: the input as text, and an abort for properties that
// must hold (libFuzzer saves the input that broke one as a crash).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace ptdp::fuzz {

inline std::string Text(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// A property violated: print why and abort, so that libFuzzer records the input.
[[noreturn]] inline void Broken(const std::string& what) {
  std::fprintf(stderr, "fuzz property broken: %s\n", what.c_str());
  std::abort();
}

}  // namespace ptdp::fuzz
