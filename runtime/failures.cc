// Picking the failure that names the silent rank; see failures.h.
#include "runtime/failures.h"

#include <regex>
#include <string>

namespace ptdp::rt {
namespace {

// Global ranks a timeout message says never came: "rank 3 never arrived", "never sent it", ...
std::vector<size_t> WaitedFor(const std::string& message) {
  static const std::regex kNever("rank ([0-9]+) never (arrived|sent|received)");
  std::vector<size_t> out;
  for (auto it = std::sregex_iterator(message.begin(), message.end(), kNever);
       it != std::sregex_iterator(); ++it) {
    const std::string digits = (*it)[1].str();
    if (digits.size() < 9) out.push_back(size_t(std::stoul(digits)));
  }
  return out;
}

}  // namespace

size_t RootFailure(const std::vector<Status>& status,
                   const std::vector<std::chrono::steady_clock::time_point>& when) {
  const size_t n = status.size();
  size_t cur = n;
  for (size_t i = 0; i < n; ++i)
    if (!status[i].ok() && (cur == n || when[i] < when[cur])) cur = i;
  if (cur == n) return n;
  std::vector<bool> seen(n, false);
  seen[cur] = true;
  for (;;) {
    size_t next = n;
    for (size_t j : WaitedFor(status[cur].message()))
      if (j < n && !seen[j] && !status[j].ok() && !WaitedFor(status[j].message()).empty()) {
        next = j;
        break;
      }
    if (next == n) return cur;
    seen[next] = true;
    cur = next;
  }
}

Status ReportRankFailures(const std::vector<Status>& status,
                          const std::vector<std::chrono::steady_clock::time_point>& when) {
  const size_t root = RootFailure(status, when);
  if (root == status.size()) return Status::Ok();
  int others = 0;
  for (const Status& s : status) others += s.ok() ? 0 : 1;
  --others;
  std::string prefix = "rank " + std::to_string(root);
  if (others > 0)
    prefix += " (" + std::to_string(others) + " other rank" + (others > 1 ? "s" : "") +
              " failed too)";
  return status[root].Prefixed(prefix);
}

}  // namespace ptdp::rt
