// Finding shipped files relative to the binary; see paths.h.
#include "cli/paths.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace ptdp::cli {
namespace fs = std::filesystem;

std::string ExecutableDir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  return exe.parent_path().string();
}

Result<std::string> FindShipped(const std::string& relative) {
  const std::string dir = ExecutableDir();
  if (dir.empty()) return Status::Error("cannot read /proc/self/exe to find " + relative);
  std::error_code ec;
  for (fs::path p = dir;; p = p.parent_path()) {
    const fs::path candidate = p / relative;
    if (fs::exists(candidate, ec)) return candidate.string();
    if (p == p.parent_path()) break;
  }
  return Status::Error("no " + relative + " at or above the binary's folder " + dir);
}

Result<std::string> ShareDir() {
  if (const char* env = std::getenv("PTDP_SHARE_DIR"); env && *env) {
    std::error_code ec;
    if (!fs::is_directory(fs::path(env) / "configs", ec))
      return Status::Error("PTDP_SHARE_DIR '" + std::string(env) + "' has no configs/ folder");
    return std::string(env);
  }
  auto found = FindShipped("share/ptdp");
  if (!found.ok())
    return Status::Error("cannot find ptdp's shipped configs and data: " +
                         found.status().message() +
                         " (build with cmake, install with cmake --install, or set PTDP_SHARE_DIR)");
  return found;
}

bool IsConfigName(const std::string& value) {
  const bool yaml = value.size() >= 5 && value.compare(value.size() - 5, 5, ".yaml") == 0;
  return !value.empty() && value.find('/') == std::string::npos && !yaml;
}

std::string ConfigReference(const std::string& value) {
  if (IsConfigName(value)) return value;
  std::error_code ec;
  const fs::path abs = fs::absolute(value, ec);
  return ec ? value : abs.lexically_normal().string();
}

std::vector<std::string> ShippedConfigNames(const std::string& kind) {
  std::vector<std::string> names;
  auto share = ShareDir();
  if (!share.ok()) return names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(*share) / "configs" / kind, ec))
    if (e.path().extension() == ".yaml") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

Result<std::string> ResolveConfig(const std::string& kind, const std::string& value) {
  if (!IsConfigName(value)) return value;
  PTDP_ASSIGN_OR_RETURN(std::string share, ShareDir());
  const fs::path file = fs::path(share) / "configs" / kind / (value + ".yaml");
  std::error_code ec;
  if (fs::is_regular_file(file, ec)) return file.string();
  std::string known;
  for (const auto& n : ShippedConfigNames(kind)) known += (known.empty() ? "" : ", ") + n;
  const std::string what = kind == "clusters" ? "cluster" : "model";
  return Status::Error("'" + value + "' is not a shipped " + what + " (" +
                       (known.empty() ? std::string("none found") : known) +
                       "); give a file's path to use your own");
}

Result<std::string> ShippedData(const std::string& relative) {
  PTDP_ASSIGN_OR_RETURN(std::string share, ShareDir());
  const fs::path file = fs::path(share) / "data" / relative;
  std::error_code ec;
  if (!fs::exists(file, ec))
    return Status::Error(file.string() + ": not found among ptdp's shipped data");
  return file.string();
}

}  // namespace ptdp::cli
