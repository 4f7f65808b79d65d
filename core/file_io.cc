// See file_io.h.
#include "core/file_io.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace ptdp {

Result<std::string> ReadFileText(const std::string& path, const std::string& what) {
  const std::string role = what.empty() ? "file" : what;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return Status::Error(path + ": cannot open " + role + ": " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) return Status::Error(path + ": is a directory, not " + (what.empty() ? "a file" : what));
  if (!S_ISREG(st.st_mode))
    return Status::Error(path + ": is not a regular file (a FIFO, socket or device), not " +
                         (what.empty() ? "a file" : what));
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error(path + ": cannot open " + role);
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::Error(path + ": cannot read " + role);
  return ss.str();
}

}  // namespace ptdp
