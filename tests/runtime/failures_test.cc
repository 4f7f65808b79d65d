// RootFailure: among the ranks' failures, the one naming the silent rank is reported, following
// the chain of timeouts from the earliest failure.
#include "runtime/failures.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

namespace ptdp::rt {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<Clock::time_point> At(const std::vector<int>& ms) {
  std::vector<Clock::time_point> t;
  const Clock::time_point t0 = Clock::now();
  for (int x : ms) t.push_back(t0 + std::chrono::milliseconds(x));
  return t;
}

TEST(RootFailure, NoneFailed) {
  EXPECT_EQ(RootFailure({Status::Ok(), Status::Ok()}, At({1, 2})), 2u);
  EXPECT_TRUE(ReportRankFailures({Status::Ok()}, At({1})).ok());
}

TEST(RootFailure, FollowsTheWaitsToTheSilentRank) {
  // Rank 3 stopped answering; rank 1 waited on it (second in time); rank 5 waited on rank 1
  // and timed out first; rank 0 waited on rank 5; rank 3 eventually returned its own error.
  const std::vector<Status> s = {
      Status::Error("all-reduce #1 on group [0,5] (X) timed out: rank 5 never arrived (it ...)"),
      Status::Error("reduce-scatter #1 on group [1,3] (DP) timed out: rank 1 arrived; rank 3 "
                    "never arrived (it returned from all-gather #2)"),
      Status::Ok(),
      Status::Error("gave up"),
      Status::Ok(),
      Status::Error("all-reduce #1 on group [1,5] (EMB) timed out: rank 1 never arrived (it is "
                    "waiting in reduce-scatter #1 on group [1,3] (DP))"),
  };
  EXPECT_EQ(RootFailure(s, At({30, 20, 0, 3000, 0, 10})), 1u);
  const Status r = ReportRankFailures(s, At({30, 20, 0, 3000, 0, 10}));
  EXPECT_EQ(r.message().rfind("rank 1 (3 other ranks failed too): reduce-scatter #1", 0), 0u)
      << r.message();
}

TEST(RootFailure, WithoutTimeoutsTheEarliestFailureWins) {
  const std::vector<Status> s = {Status::Error("a"), Status::Error("b"), Status::Ok()};
  EXPECT_EQ(RootFailure(s, At({5, 1, 0})), 1u);
  EXPECT_EQ(ReportRankFailures(s, At({5, 1, 0})).message(), "rank 1 (1 other rank failed too): b");
}

TEST(RootFailure, ACycleOfWaitsEnds) {
  // p2p peers that both timed out naming each other, and a recv naming a healthy rank.
  const std::vector<Status> s = {
      Status::Error("recv #1 from rank 1 timed out: rank 1 never sent it"),
      Status::Error("send #1 to rank 0 timed out: rank 0 never received it"),
      Status::Error("recv #2 from rank 3 timed out: rank 3 never sent it"),
      Status::Ok(),
  };
  EXPECT_EQ(RootFailure(s, At({0, 1, 2, 0})), 1u);
  EXPECT_EQ(RootFailure(s, At({9, 9, 0, 0})), 2u);
}

}  // namespace
}  // namespace ptdp::rt
