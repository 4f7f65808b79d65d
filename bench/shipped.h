// The benchmarks' shipped inputs: share/ptdp/<relative> (configs/, data/) found from the running
// binary's path as `ptdp` finds them (cli/paths.h), so a build carried to another machine (the
// GPU check) still finds them; no source path is compiled in.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "cli/paths.h"

namespace ptdp::bench {

// Exits naming what it looked for when share/ptdp is missing: a benchmark has no one to return
// an error to.
inline std::string Shipped(const std::string& relative) {
  auto dir = cli::ShareDir();
  if (!dir.ok()) {
    std::fprintf(stderr, "bench: %s\n", dir.status().message().c_str());
    std::exit(1);
  }
  return *dir + "/" + relative;
}

}  // namespace ptdp::bench
