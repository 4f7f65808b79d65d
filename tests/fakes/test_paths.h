// Where the tests find the source tree (configs, tests/data fixtures, scripts), the build tree
// (the ptdp binary, modules) and ../shared, found when the test runs, never compiled in: a build
// made on one machine and carried to another (scripts/gpu-check.sh carries the CUDA build to a
// lent GPU) runs its tests there. Force-included into every test (tests/CMakeLists.txt), so the
// tests keep writing PTDP_SOURCE_DIR, PTDP_BINARY_DIR and PTDP_SHARED_DIR.
//
//   binary dir: $PTDP_TEST_BINARY_DIR, else the nearest ancestor of the test binary holding
//               CMakeCache.txt (build/tests/cli/compare_test -> build)
//   source dir: $PTDP_TEST_SOURCE_DIR, else the nearest ancestor of the binary dir holding this
//               file (build/ inside the checkout), else the cache's CMAKE_HOME_DIRECTORY
//   shared dir: $PTDP_TEST_SHARED_DIR, else the cache's PTDP_SHARED_DIR when it exists, else
//               <source>/../shared (a test needing it skips when it is absent)
// When a dir cannot be found the test binary exits at once, saying which variable to set.
#pragma once

namespace ptdp_test_paths {
const char* SourceDir();
const char* BinaryDir();
const char* SharedDir();
}  // namespace ptdp_test_paths

#define PTDP_SOURCE_DIR (::ptdp_test_paths::SourceDir())
#define PTDP_BINARY_DIR (::ptdp_test_paths::BinaryDir())
#define PTDP_SHARED_DIR (::ptdp_test_paths::SharedDir())
