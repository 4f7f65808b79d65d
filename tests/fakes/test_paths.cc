// See test_paths.h.
#include "tests/fakes/test_paths.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace ptdp_test_paths {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "test paths: %s\n", what.c_str());
  std::exit(1);
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

// The nearest of `from` and its ancestors holding `relative`; "" when none does.
std::string Ancestor(fs::path from, const std::string& relative) {
  std::error_code ec;
  for (; !from.empty(); from = from.parent_path()) {
    if (fs::exists(from / relative, ec)) return from.string();
    if (from == from.root_path()) break;
  }
  return "";
}

// The value of `key` (`KEY:TYPE=value`) in <binary dir>/CMakeCache.txt; "" when absent.
std::string CacheValue(const std::string& key) {
  std::ifstream in(fs::path(BinaryDir()) / "CMakeCache.txt");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key + ":", 0) == 0) {
      const size_t eq = line.find('=');
      if (eq != std::string::npos) return line.substr(eq + 1);
    }
  return "";
}

std::string Exe() {
  std::error_code ec;
  const fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.string();
}

}  // namespace

const char* BinaryDir() {
  static const std::string dir = [] {
    std::string d = Env("PTDP_TEST_BINARY_DIR");
    if (d.empty()) d = Ancestor(fs::path(Exe()).parent_path(), "CMakeCache.txt");
    if (d.empty())
      Fail("no CMakeCache.txt above " + Exe() + ": set PTDP_TEST_BINARY_DIR to the build folder");
    return d;
  }();
  return dir.c_str();
}

const char* SourceDir() {
  static const std::string dir = [] {
    std::string d = Env("PTDP_TEST_SOURCE_DIR");
    if (d.empty()) d = Ancestor(BinaryDir(), "tests/fakes/test_paths.h");
    if (d.empty()) {
      const std::string home = CacheValue("CMAKE_HOME_DIRECTORY");
      std::error_code ec;
      if (!home.empty() && fs::exists(fs::path(home) / "tests/fakes/test_paths.h", ec)) d = home;
    }
    if (d.empty())
      Fail(std::string("no source tree above ") + BinaryDir() +
           ": set PTDP_TEST_SOURCE_DIR to the checkout");
    return d;
  }();
  return dir.c_str();
}

const char* SharedDir() {
  static const std::string dir = [] {
    std::string d = Env("PTDP_TEST_SHARED_DIR");
    std::error_code ec;
    if (d.empty()) {
      const std::string cached = CacheValue("PTDP_SHARED_DIR");
      if (!cached.empty() && fs::exists(cached, ec)) d = cached;
    }
    if (d.empty()) d = (fs::path(SourceDir()) / ".." / "shared").lexically_normal().string();
    return d;
  }();
  return dir.c_str();
}

}  // namespace ptdp_test_paths
