// libFuzzer entry point of FuzzCheckpoint (fuzz/targets.h): any input must give a result or an error,
// never a crash, a hang or a sanitizer report.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)ptdp::fuzz::FuzzCheckpoint(std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}
