// A child process for end-to-end tests that must interrupt the ptdp binary: started through
// /bin/sh with stdout and stderr on one pipe, read line by line with a deadline, killed with
// any signal, and reaped. Kill-9 tests use it to stop `ptdp train` at a chosen moment.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>

namespace ptdp::testing {

class Child {
 public:
  // Runs `cmd` with /bin/sh -c (stdout and stderr both to the pipe this object reads).
  explicit Child(const std::string& cmd) {
    const std::string script = "exec " + cmd;  // built before fork: no allocation in the child
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], 1);
      dup2(fds[1], 2);
      close(fds[0]);
      close(fds[1]);
      execl("/bin/sh", "sh", "-c", script.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(fds[1]);
    fd_ = fds[0];
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      Wait();
    }
    if (fd_ >= 0) close(fd_);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  bool started() const { return pid_ > 0 && fd_ >= 0; }

  // Reads until a line containing `needle` has arrived (true; the line is in *line) or the
  // output ends or `timeout_s` passes (false). Everything read is kept in output().
  bool WaitForLine(const std::string& needle, double timeout_s, std::string* line = nullptr) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    for (;;) {
      for (size_t nl; (nl = pending_.find('\n')) != std::string::npos;) {
        const std::string l = pending_.substr(0, nl);
        pending_.erase(0, nl + 1);
        if (l.find(needle) != std::string::npos) {
          if (line) *line = l;
          return true;
        }
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !ReadSome(int(left.count()))) return false;
    }
  }

  // Sends `sig` (e.g. SIGKILL) to the child.
  void Signal(int sig) {
    if (pid_ > 0) kill(pid_, sig);
  }

  // Reads the rest of the output and reaps the child; returns its wait status.
  int Wait() {
    while (ReadSome(-1)) {
    }
    int status = 0;
    if (pid_ > 0 && !reaped_) {
      waitpid(pid_, &status, 0);
      reaped_ = true;
      status_ = status;
    }
    return status_;
  }

  const std::string& output() const { return all_; }

 private:
  // Reads what is available within timeout_ms (-1: until data or EOF); false at EOF/timeout.
  bool ReadSome(int timeout_ms) {
    if (fd_ < 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return false;
    char buf[4096];
    const ssize_t n = read(fd_, buf, sizeof buf);
    if (n <= 0) return false;
    pending_.append(buf, size_t(n));
    all_.append(buf, size_t(n));
    return true;
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  bool reaped_ = false;
  int status_ = 0;
  std::string pending_, all_;
};

}  // namespace ptdp::testing
