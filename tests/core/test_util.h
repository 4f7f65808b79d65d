// Helpers shared by the core tests: fixture paths and scratch files under TempDir().
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <string>

namespace ptdp::testing_util {

// Absolute path of a file in the source tree (never the working directory).
inline std::string SourcePath(const std::string& rel) {
  return std::string(PTDP_SOURCE_DIR) + "/" + rel;
}

// Writes `text` to TempDir()/name and returns the path.
inline std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

}  // namespace ptdp::testing_util
