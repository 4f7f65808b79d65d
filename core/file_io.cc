// See file_io.h.
#include "core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace ptdp {

std::string ByteSize(uint64_t bytes) {
  char buf[48];
  if (bytes < 1024) {
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(bytes));
    return buf;
  }
  const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = double(bytes) / 1024;
  int u = 0;
  for (; v >= 1024 && u < 5; ++u) v /= 1024;
  if (v == double(uint64_t(v)))
    std::snprintf(buf, sizeof buf, "%.0f %s", v, units[u]);
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

namespace {
struct Fd {
  int fd;
  explicit Fd(int f) : fd(f) {}
  ~Fd() { if (fd >= 0) ::close(fd); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};
}  // namespace

Result<std::string> ReadFileText(const std::string& path, const std::string& what,
                                 uint64_t max_bytes) {
  const std::string role = what.empty() ? "file" : what;
  const std::string a_role = what.empty() ? "a file" : what;
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever. The
  // flag changes nothing for a regular file, the only kind that is read.
  Fd f(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (f.fd < 0) {
    const int err = errno;
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
      return Status::Error(path + ": is a directory, not " + a_role);
    return Status::Error(path + ": cannot open " + role + ": " + std::strerror(err));
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0)
    return Status::Error(path + ": cannot open " + role + ": " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) return Status::Error(path + ": is a directory, not " + a_role);
  if (!S_ISREG(st.st_mode))
    return Status::Error(path + ": is not a regular file (a FIFO, socket or device), not " +
                         a_role);
  const auto too_large = [&](uint64_t bytes, const char* more) {
    return Status::Error(path + ": " + ByteSize(bytes) + more + ", more than the " +
                         ByteSize(max_bytes) + " " + a_role + " may have");
  };
  if (uint64_t(st.st_size) > max_bytes) return too_large(uint64_t(st.st_size), "");
  // Read to the end, not to st_size: the file may grow while it is read; never past the limit.
  std::string text(size_t(st.st_size), '\0');
  size_t have = 0;
  for (;;) {
    if (have == text.size()) {
      if (text.size() > max_bytes) return too_large(text.size(), " and growing");
      text.resize(std::min<uint64_t>(max_bytes + 1, std::max<size_t>(2 * text.size(), 4096)));
    }
    const ssize_t n = ::read(f.fd, text.data() + have, text.size() - have);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::Error(path + ": cannot read " + role + ": " + std::strerror(errno));
    }
    if (n == 0) break;
    have += size_t(n);
  }
  if (have > max_bytes) return too_large(have, "");
  text.resize(have);
  return text;
}

}  // namespace ptdp
