// See file_io.h.
#include "core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

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

Status SysError(const std::string& what, int err) {
  return Status::Error(what + ": " + std::error_code(err, std::generic_category()).message());
}

std::string FolderOf(const std::string& path) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

Status SyncFolderOf(const std::string& path) {
  const std::string dir = FolderOf(path);
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.fd < 0) {
    const int err = errno;
    return SysError(dir + ": cannot open the folder to sync it", err);
  }
  if (::fsync(fd.fd) != 0) {
    const int err = errno;
    return SysError(dir + ": fsync of the folder failed", err);
  }
  return Status::Ok();
}

Status RenameIntoPlace(const std::string& tmp, const std::string& path) {
  // Renaming over a device, FIFO, socket or folder would replace it: `--out /dev/null` run as
  // root turned /dev/null into a regular file.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    ::unlink(tmp.c_str());
    return Status::Error(path + ": is not a regular file (a " +
                         (S_ISDIR(st.st_mode) ? "folder" : "FIFO, socket or device") +
                         "); give the path of a file to write");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return SysError(path + ": cannot rename " + tmp + " to it", err);
  }
  return SyncFolderOf(path);
}

Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  std::string tmp = path + ".tmp-XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) {
    const int err = errno;
    return SysError(path + ": cannot create a temporary file beside it", err);
  }
  Status st = Status::Ok();
  if (::fchmod(fd, 0644) != 0) {
    const int err = errno;
    st = SysError(tmp + ": cannot set its mode", err);
  }
  for (size_t at = 0; st.ok() && at < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + at, bytes.size() - at);
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      st = SysError(tmp + ": cannot write", err);
    } else {
      at += size_t(n);
    }
  }
  if (st.ok() && ::fsync(fd) != 0) {
    const int err = errno;
    st = SysError(tmp + ": fsync failed", err);
  }
  if (::close(fd) != 0 && st.ok()) {
    const int err = errno;
    st = SysError(tmp + ": close failed", err);
  }
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  return RenameIntoPlace(tmp, path);
}

}  // namespace ptdp
