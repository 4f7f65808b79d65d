// Helpers of the end-to-end tests of the ptdp binary: run a command (exit code and output), make
// a fresh directory for its files, count a string in what it wrote, check a one-line failure.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace ptdp::testing {

struct CmdResult {
  int code = -1;     // exit status, -1 when it did not exit normally
  std::string out;   // stdout, and stderr when asked
};

// Runs `cmd` through the shell; `out` is its stdout (and stderr when `with_stderr`).
inline CmdResult Shell(const std::string& cmd, bool with_stderr = true) {
  CmdResult r;
  FILE* p = popen((cmd + (with_stderr ? " 2>&1" : " 2>/dev/null")).c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// A new directory under the test's temp dir, "<name>-XXXXXX"; empty if it could not be made.
inline std::string FreshDir(const std::string& name) {
  std::string tmpl = ::testing::TempDir() + "/" + name + "-XXXXXX";
  char* dir = mkdtemp(tmpl.data());
  return dir ? std::string(dir) : std::string();
}

// How often `needle` occurs in `hay` (overlapping occurrences count).
inline size_t Count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t i = hay.find(needle); i != std::string::npos; i = hay.find(needle, i + 1)) ++n;
  return n;
}

// A failure of the ptdp binary: exit `code` (any non-zero when -1), one line starting with
// "ptdp:" that contains `must_contain`.
inline void ExpectOneLineError(const CmdResult& r, const std::string& must_contain, int code = -1) {
  if (code == -1) {
    EXPECT_NE(r.code, 0) << r.out;
  } else {
    EXPECT_EQ(r.code, code) << r.out;
  }
  EXPECT_NE(r.out.find(must_contain), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << "more than one line: " << r.out;
  EXPECT_EQ(r.out.rfind("ptdp:", 0), 0u) << r.out;
}

}  // namespace ptdp::testing
