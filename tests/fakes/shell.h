// Runs a command for end-to-end tests of the ptdp binary: exit code and output.
#pragma once

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

}  // namespace ptdp::testing
