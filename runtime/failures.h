// Which of several ranks' failures to report. When one rank stops answering, every rank that
// waits on it times out, then every rank that waits on those, and so on: the useful message is
// the one naming the silent rank, which is not always the first in rank order or in time (a
// rank that waited on a waiter may have started waiting earlier).
#pragma once

#include <chrono>
#include <cstddef>
#include <vector>

#include "core/status.h"

namespace ptdp::rt {

// The index (global rank) of the failure to report among `status` (one per rank; `when` is
// when each returned), or status.size() when none failed. Starts at the earliest failure and
// follows the waits that communicator timeouts name ("rank N never arrived / sent it /
// received it", runtime/cpu/thread_communicator.h) to a failing rank N that itself timed out
// waiting for someone, until the named rank did not time out waiting (it is the silent one):
// returns the rank whose message names it.
size_t RootFailure(const std::vector<Status>& status,
                   const std::vector<std::chrono::steady_clock::time_point>& when);

// status[RootFailure] prefixed with "rank <r>" (and how many others failed); OK if none did.
Status ReportRankFailures(const std::vector<Status>& status,
                          const std::vector<std::chrono::steady_clock::time_point>& when);

}  // namespace ptdp::rt
