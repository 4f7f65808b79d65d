// Schedule (core/schedule.h): Megatron's orderings letter for letter against the tables of
// megatron-reference.md section 3, warmup and in-flight counts, the p2p groups, and the
// checker, both on every legal small schedule and on corrupted ones. Letters: p pipeline
// ranks, v chunks per rank, m micro-batches, g group size, T = m*v, W warmup forwards.
#include "core/schedule.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

namespace ptdp {
namespace {

using ::testing::HasSubstr;

Schedule Build(ScheduleKind kind, int p, int v, int m, int g = 0) {
  auto s = BuildSchedule(kind, p, v, m, g);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? *s : Schedule{};
}

std::vector<std::string> Tokens(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string t; in >> t;) out.push_back(t);
  return out;
}

// Forwards before the first backward: W + 1 when a steady phase exists (its first forward
// comes before its first backward), otherwise every forward.
int LeadingForwards(const Schedule& s, int r) {
  int n = 0;
  for (const ScheduleOp& op : s.ranks[r]) {
    if (op.kind == OpKind::kBackward) break;
    n += op.kind == OpKind::kForward;
  }
  return n;
}

// Max over the op sequence of (forwards done - backwards done).
int InFlight(const Schedule& s, int r) {
  int now = 0, peak = 0;
  for (const ScheduleOp& op : s.ranks[r]) {
    now += op.kind == OpKind::kForward ? 1 : op.kind == OpKind::kBackward ? -1 : 0;
    peak = std::max(peak, now);
  }
  return peak;
}

// The reference table's interleaved line: "rank0 (W=10): <warmup> | <steady> | <cooldown>",
// the prefix padded to 13 characters. The cooldown holds the W backwards steady left over.
std::string PhasedLine(const Schedule& s, int r, int warmup) {
  const std::vector<std::string> t = Tokens(s.Notation(r));
  std::string prefix = "rank" + std::to_string(r) + " (W=" + std::to_string(warmup) + "):";
  prefix.resize(std::max<size_t>(prefix.size(), 13), ' ');
  std::string out = prefix;
  for (size_t i = 0; i < t.size(); ++i) {
    if (i == size_t(warmup) || i == t.size() - warmup) out += " |";
    out += " " + t[i];
  }
  return out;
}

// ------------------------------------------------------------------------------------------
// Orderings

TEST(ScheduleTest, OneFOneBMatchesReferenceTable) {
  // megatron-reference.md section 3, p=4, m=8.
  const std::vector<std::string> expected = {
      "rank0: F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
      "rank1: F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
      "rank2: F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
      "rank3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7",
  };
  const Schedule s = Build(ScheduleKind::kOneFOneB, 4, 1, 8);
  ASSERT_EQ(s.ranks.size(), 4u);
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ("rank" + std::to_string(r) + ": " + s.Notation(r), expected[r]);
}

TEST(ScheduleTest, InterleavedMatchesReferenceTable) {
  // megatron-reference.md section 3, p=4, v=2, m=8; W = (p-r-1)*2 + (v-1)*g: 10 and 4.
  const std::string rank0 =
      "rank0 (W=10): F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 F4.0 F5.0 | F6.0 B0.1 F7.0 B1.1 "
      "F4.1 B2.1 F5.1 B3.1 F6.1 B0.0 F7.1 B1.0 | B2.0 B3.0 B4.1 B5.1 B6.1 B7.1 B4.0 B5.0 B6.0 "
      "B7.0";
  const std::string rank3 =
      "rank3 (W=4):  F0.0 F1.0 F2.0 F3.0 | F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.1 B3.1 F4.0 B0.0 "
      "F5.0 B1.0 F6.0 B2.0 F7.0 B3.0 F4.1 B4.1 F5.1 B5.1 F6.1 B6.1 F7.1 B7.1 | B4.0 B5.0 B6.0 "
      "B7.0";
  const Schedule s = Build(ScheduleKind::kInterleaved, 4, 2, 8);
  EXPECT_EQ(s.group_size, 4);
  EXPECT_EQ(PhasedLine(s, 0, 10), rank0);
  EXPECT_EQ(PhasedLine(s, 3, 4), rank3);
  EXPECT_EQ(LeadingForwards(s, 0), 11);  // the steady phase starts with a forward
  EXPECT_EQ(LeadingForwards(s, 3), 5);
}

TEST(ScheduleTest, WarmupCounts) {
  struct Case {
    ScheduleKind kind;
    int p, v, m;
    std::vector<int> leading;  // forwards before the first backward, per rank
  };
  const Case cases[] = {
      // 1F1B W = min(p-r-1, m); leading = W + 1 while a steady phase exists.
      {ScheduleKind::kOneFOneB, 4, 1, 8, {4, 3, 2, 1}},
      // m = 2: W = 2, 2, 1, 0, so ranks 0 and 1 have no steady phase: 2, 2; then 2, 1.
      {ScheduleKind::kOneFOneB, 4, 1, 2, {2, 2, 2, 1}},
      {ScheduleKind::kOneFOneB, 1, 1, 3, {1}},  // p = 1: F0 B0 F1 B1 F2 B2
      // Interleaved p=4 v=2 g=4 m=8: W = 10, 8, 6, 4 (T = 16).
      {ScheduleKind::kInterleaved, 4, 2, 8, {11, 9, 7, 5}},
      // m = 4, T = 8: W = min(10, 8), min(8, 8), 6, 4; ranks 0 and 1 are all warmup.
      {ScheduleKind::kInterleaved, 4, 2, 4, {8, 8, 7, 5}},
      // p=2 v=3 m=2 g=2, T = 6: W = min(2 + 4, 6) = 6 and 0 + 4 = 4.
      {ScheduleKind::kInterleaved, 2, 3, 2, {6, 5}},
      // GPipe: every forward first.
      {ScheduleKind::kGPipe, 3, 1, 5, {5, 5, 5}},
  };
  for (const Case& c : cases) {
    const Schedule s = Build(c.kind, c.p, c.v, c.m);
    for (int r = 0; r < c.p; ++r)
      EXPECT_EQ(LeadingForwards(s, r), c.leading[r])
          << ToString(c.kind) << " p " << c.p << " v " << c.v << " m " << c.m << " rank " << r;
  }
}

// ForwardsOfChunk against the built schedules: of each rank's first n forwards, how many run
// each chunk, for every n, with full and partial micro-batch groups (m % g != 0).
TEST(ScheduleTest, ForwardsOfChunkCountsTheBuiltOrder) {
  int checked = 0;
  for (int p : {2, 3, 4})
    for (int v : {2, 3})
      for (int g : {0, 5, 6})
        for (int m : {2, 4, 6, 7, 10, 12}) {
          auto s = BuildSchedule(ScheduleKind::kInterleaved, p, v, m, g);
          if (!s.ok()) continue;
          const int group = g > 0 ? g : p;
          for (int r = 0; r < p; ++r) {
            std::vector<int64_t> seen(size_t(v), 0);
            int n = 0;
            for (const ScheduleOp& op : s->ranks[size_t(r)]) {
              if (op.kind != OpKind::kForward) continue;
              ++seen[size_t(op.chunk)];
              ++n;
              for (int c = 0; c < v; ++c)
                ASSERT_EQ(ForwardsOfChunk(m, v, group, n, c), seen[size_t(c)])
                    << "p " << p << " v " << v << " m " << m << " g " << group << " n " << n
                    << " chunk " << c;
              ++checked;
            }
          }
        }
  EXPECT_GT(checked, 500);
  // Past the last forward the counts stay at m; none before the first.
  EXPECT_EQ(ForwardsOfChunk(7, 3, 4, 100, 2), 7);
  EXPECT_EQ(ForwardsOfChunk(7, 3, 4, 0, 0), 0);
}

// PeakInFlight against a walk of the built schedules: each forward of chunk c adds kept[c],
// its backward frees it; the most ever held, for chunks of unequal and of equal weight, long
// steady states (the periodic shortcut) and partial last groups.
TEST(ScheduleTest, PeakInFlightWalksTheBuiltSchedule) {
  int checked = 0;
  for (ScheduleKind kind : {ScheduleKind::kOneFOneB, ScheduleKind::kInterleaved, ScheduleKind::kGPipe})
    for (int p : {1, 2, 3, 4})
      for (int v : {1, 2, 3, 4})
        for (int g : {0, 5})
          for (int m : {1, 3, 4, 7, 8, 12, 30, 61})
            for (bool a2a : {false, true}) {
              auto s = BuildSchedule(kind, p, v, m, g, a2a);
              if (!s.ok()) continue;
              for (const std::vector<double>& base :
                   {std::vector<double>{9, 1, 4, 2}, std::vector<double>{1, 1, 1, 7},
                    std::vector<double>{3, 3, 3, 3}}) {
                const std::vector<double> kept(base.begin(), base.begin() + v);
                for (int r = 0; r < p; ++r) {
                  double held = 0, peak = 0;
                  for (const ScheduleOp& op : s->ranks[size_t(r)]) {
                    if (op.kind == OpKind::kForward) peak = std::max(peak, held += kept[size_t(op.chunk)]);
                    if (op.kind == OpKind::kBackward) held -= kept[size_t(op.chunk)];
                  }
                  EXPECT_DOUBLE_EQ(PeakInFlight(kind, p, v, m, g, r, a2a, kept), peak)
                      << ToString(kind) << " p " << p << " v " << v << " m " << m << " g " << g
                      << " a2a " << a2a << " rank " << r << " kept[0] " << kept[0];
                  ++checked;
                }
              }
            }
  EXPECT_GT(checked, 1000);
}

TEST(ScheduleTest, GPipeRunsAllForwardsThenAllBackwards) {
  const Schedule s = Build(ScheduleKind::kGPipe, 3, 1, 4);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(s.Notation(r), "F0 F1 F2 F3 B0 B1 B2 B3");
  // Middle rank: receive, compute, send, one group each.
  const std::vector<ScheduleOp>& ops = s.ranks[1];
  ASSERT_GE(ops.size(), 3u);
  EXPECT_EQ(ops[0].kind, OpKind::kRecvActivation);
  EXPECT_EQ(ops[0].peer, 0);
  EXPECT_EQ(ops[1].kind, OpKind::kForward);
  EXPECT_EQ(ops[2].kind, OpKind::kSendActivation);
  EXPECT_EQ(ops[2].peer, 2);
  EXPECT_NE(ops[0].group, ops[2].group);
}

TEST(ScheduleTest, InFlightMicrobatches) {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      const Schedule gpipe = Build(ScheduleKind::kGPipe, p, 1, m);
      const Schedule ofob = Build(ScheduleKind::kOneFOneB, p, 1, m);
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(InFlight(gpipe, r), m) << "gpipe p " << p << " m " << m << " rank " << r;
        EXPECT_EQ(InFlight(ofob, r), std::min(p - r, m)) << "1f1b p " << p << " m " << m
                                                           << " rank " << r;
      }
    }
  // Interleaved: W forwards, then the steady forward before its backward: min(W + 1, T).
  const Schedule s = Build(ScheduleKind::kInterleaved, 4, 2, 8);
  const int expected[] = {11, 9, 7, 5};
  for (int r = 0; r < 4; ++r) EXPECT_EQ(InFlight(s, r), expected[r]) << "rank " << r;
}

// --overlap-moe-expert-parallel-comm: Megatron's combined 1F1B runs one more warm-up forward
// (get_pp_rank_microbatches), at pp 1 one forward ahead of each backward
// (combined_1f1b_schedule_for_no_pipelining): one more micro-batch of activations in flight.
// Sound either way; refused where Megatron refuses the overlap (pp > 1 without vp, GPipe).
TEST(ScheduleTest, AllToAllOverlapRunsOneMoreWarmupForward) {
  auto built = BuildSchedule(ScheduleKind::kOneFOneB, 1, 1, 4, 0, true);
  ASSERT_TRUE(built.ok()) << built.status().message();
  EXPECT_EQ(built->Notation(0), "F0 F1 B0 F2 B1 F3 B2 B3");
  EXPECT_TRUE(CheckSchedule(*built).ok());
  EXPECT_EQ(InFlight(*built, 0), 2);
  built = BuildSchedule(ScheduleKind::kInterleaved, 4, 2, 8, 0, true);
  ASSERT_TRUE(built.ok()) << built.status().message();
  const Status check = CheckSchedule(*built);
  EXPECT_TRUE(check.ok()) << check.message();
  const int expected[] = {12, 10, 8, 6};  // W + 1 + 1 of InFlightMicrobatches' 11, 9, 7, 5
  for (int r = 0; r < 4; ++r) EXPECT_EQ(InFlight(*built, r), expected[r]) << "rank " << r;
  for (int m : {4, 8, 12})  // all-warmup ranks too (T = 8 at m 4)
    for (int r = 0; r < 4; ++r) {
      auto s = BuildSchedule(ScheduleKind::kInterleaved, 4, 2, m, 0, true);
      ASSERT_TRUE(s.ok()) << m;
      EXPECT_TRUE(CheckSchedule(*s).ok()) << "m " << m;
    }
  EXPECT_FALSE(BuildSchedule(ScheduleKind::kOneFOneB, 4, 1, 8, 0, true).ok());
  EXPECT_FALSE(BuildSchedule(ScheduleKind::kGPipe, 1, 1, 8, 0, true).ok());
}

TEST(ScheduleTest, InterleavedNotationNamesChunks) {
  // p=2 v=2 m=2 g=2, T = 4: rank 1 W = 2, table (0,0) (1,0) (0,1) (1,1).
  const Schedule s = Build(ScheduleKind::kInterleaved, 2, 2, 2);
  EXPECT_EQ(s.Notation(1), "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 B0.0 B1.0");
}

// ------------------------------------------------------------------------------------------
// P2p ops and groups

// The ops of `rank`'s group `group`, in order.
std::vector<ScheduleOp> Group(const Schedule& s, int rank, int group) {
  std::vector<ScheduleOp> out;
  for (const ScheduleOp& op : s.ranks[rank])
    if (op.is_p2p() && op.group == group) out.push_back(op);
  return out;
}

// The group id of the first op on `rank` matching kind, micro-batch and chunk.
int GroupOf(const Schedule& s, int rank, OpKind kind, int mb, int chunk) {
  for (const ScheduleOp& op : s.ranks[rank])
    if (op.kind == kind && op.microbatch == mb && op.chunk == chunk) return op.group;
  return -2;
}

TEST(ScheduleTest, OneFOneBGroupsFollowMegatronHelpers) {
  const Schedule s = Build(ScheduleKind::kOneFOneB, 4, 1, 8);
  // Rank 1, W = 2. After steady forward F2: send_forward_recv_backward {send F2, recv B0}.
  const int g = GroupOf(s, 1, OpKind::kSendActivation, 2, 0);
  const std::vector<ScheduleOp> ops = Group(s, 1, g);
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops[1].kind, OpKind::kRecvGradient);
  EXPECT_EQ(ops[1].microbatch, 0);
  EXPECT_EQ(ops[1].peer, 2);
  // After B0: send_backward_recv_forward {send B0 to rank 0, recv F3 from rank 0}.
  const std::vector<ScheduleOp> back = Group(s, 1, GroupOf(s, 1, OpKind::kSendGradient, 0, 0));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].peer, 0);
  EXPECT_EQ(back[1].kind, OpKind::kRecvActivation);
  EXPECT_EQ(back[1].microbatch, 3);
  // The last steady iteration (B5, W + 6 = 8 forwards) sends alone.
  EXPECT_EQ(Group(s, 1, GroupOf(s, 1, OpKind::kSendGradient, 5, 0)).size(), 1u);
  // First stage: no recv-activation, no send-gradient; last stage: the mirror image.
  for (const ScheduleOp& op : s.ranks[0]) {
    EXPECT_NE(op.kind, OpKind::kRecvActivation);
    EXPECT_NE(op.kind, OpKind::kSendGradient);
  }
  for (const ScheduleOp& op : s.ranks[3]) {
    EXPECT_NE(op.kind, OpKind::kSendActivation);
    EXPECT_NE(op.kind, OpKind::kRecvGradient);
  }
}

TEST(ScheduleTest, InterleavedSteadyGroupSendsAndReceivesBothWays) {
  // p=4 v=2 m=8, rank 1: W = 2*2 + 4 = 8. Steady k = 0 runs F(table[8]) = F4.0 and
  // B(0, chunk 1) = B0.1, then one group: send F4.0 to rank 2, send B0.1 to virtual stage
  // 1*4 + 1 - 1 = 4 (rank 0), receive F(table[9]) = F5.0 from rank 0 and B(1, 1) from rank 2.
  const Schedule s = Build(ScheduleKind::kInterleaved, 4, 2, 8);
  const std::vector<ScheduleOp> ops = Group(s, 1, GroupOf(s, 1, OpKind::kSendActivation, 4, 0));
  ASSERT_EQ(ops.size(), 4u);
  auto has = [&](OpKind k, int mb, int c, int peer) {
    return std::any_of(ops.begin(), ops.end(), [&](const ScheduleOp& o) {
      return o.kind == k && o.microbatch == mb && o.chunk == c && o.peer == peer;
    });
  };
  EXPECT_TRUE(has(OpKind::kSendActivation, 4, 0, 2));
  EXPECT_TRUE(has(OpKind::kSendGradient, 0, 1, 0));
  EXPECT_TRUE(has(OpKind::kRecvActivation, 5, 0, 0));
  EXPECT_TRUE(has(OpKind::kRecvGradient, 1, 1, 2));
  // Chunk 0 of rank 3 feeds chunk 1 of rank 0, and the gradient comes back the same way.
  EXPECT_EQ(s.ranks[0].front().kind, OpKind::kForward);  // virtual stage 0 receives nothing
  EXPECT_NE(GroupOf(s, 0, OpKind::kRecvActivation, 0, 1), -2);
  EXPECT_NE(GroupOf(s, 3, OpKind::kSendActivation, 0, 0), -2);
  EXPECT_EQ(GroupOf(s, 3, OpKind::kSendActivation, 0, 1), -2);  // the last virtual stage
  EXPECT_NE(GroupOf(s, 0, OpKind::kSendGradient, 0, 1), -2);
  EXPECT_EQ(GroupOf(s, 0, OpKind::kSendGradient, 0, 0), -2);    // the first virtual stage
}

TEST(ScheduleTest, EndOfStepOps) {
  const Schedule s = Build(ScheduleKind::kOneFOneB, 3, 1, 4);
  auto tail = [&](int r, size_t n) {
    std::vector<OpKind> out;
    for (size_t i = s.ranks[r].size() - n; i < s.ranks[r].size(); ++i)
      out.push_back(s.ranks[r][i].kind);
    return out;
  };
  const std::vector<OpKind> edge = {OpKind::kReduceGradients, OpKind::kReduceEmbedding,
                                    OpKind::kOptimizerStep};
  EXPECT_EQ(tail(0, 3), edge);
  EXPECT_EQ(tail(2, 3), edge);
  EXPECT_EQ(tail(1, 2), (std::vector<OpKind>{OpKind::kReduceGradients, OpKind::kOptimizerStep}));
  EXPECT_NE(s.ranks[1][s.ranks[1].size() - 3].kind, OpKind::kReduceEmbedding);
  // p = 1: no p2p and no embedding reduction.
  const Schedule one = Build(ScheduleKind::kGPipe, 1, 1, 2);
  for (const ScheduleOp& op : one.ranks[0]) {
    EXPECT_FALSE(op.is_p2p());
    EXPECT_NE(op.kind, OpKind::kReduceEmbedding);
  }
  EXPECT_EQ(one.ranks[0].size(), 4u + 2u);
}

// ------------------------------------------------------------------------------------------
// Legality

TEST(ScheduleTest, BuildRejectsIllegalCombinations) {
  struct Case {
    ScheduleKind kind;
    int p, v, m, g;
    const char* needle;
  };
  const Case cases[] = {
      {ScheduleKind::kOneFOneB, 4, 2, 8, 0, "needs vp == 1"},
      {ScheduleKind::kGPipe, 4, 2, 8, 0, "needs vp == 1"},
      {ScheduleKind::kInterleaved, 4, 1, 8, 0, "needs vp > 1"},
      {ScheduleKind::kInterleaved, 1, 2, 8, 0, "needs pp >= 2"},
      {ScheduleKind::kInterleaved, 4, 2, 6, 0, "m % g = 2"},   // 6 % 4 = 2 < p
      {ScheduleKind::kInterleaved, 4, 2, 2, 0, "g <= m"},      // g = 4 > m = 2
      {ScheduleKind::kInterleaved, 4, 2, 8, 3, "p <= g"},      // g = 3 < p = 4
      {ScheduleKind::kOneFOneB, 0, 1, 8, 0, "pp 0"},
      {ScheduleKind::kOneFOneB, 4, 1, 0, 0, "microbatches 0"},
      {ScheduleKind::kOneFOneB, 4, 0, 8, 0, "vp 0"},
  };
  for (const Case& c : cases) {
    auto s = BuildSchedule(c.kind, c.p, c.v, c.m, c.g);
    ASSERT_FALSE(s.ok()) << ToString(c.kind) << " p " << c.p << " v " << c.v << " m " << c.m;
    EXPECT_THAT(s.status().message(), HasSubstr(c.needle));
  }
  // Legal edge cases: interleaving with m % g >= p, with p = 2, and a 1-rank pipeline.
  EXPECT_TRUE(BuildSchedule(ScheduleKind::kInterleaved, 4, 2, 10, 6).ok());  // 10 % 6 = 4
  EXPECT_TRUE(BuildSchedule(ScheduleKind::kInterleaved, 2, 4, 2).ok());
  EXPECT_TRUE(BuildSchedule(ScheduleKind::kOneFOneB, 1, 1, 1).ok());
}

// ------------------------------------------------------------------------------------------
// The checker

// Megatron's group rule with group size g.
bool GroupRule(int p, int m, int g) { return p <= g && g <= m && (m % g == 0 || m % g >= p); }

TEST(ScheduleTest, CheckerPassesEveryLegalSmallSchedule) {
  int checked = 0;
  for (int p = 1; p <= 16; ++p)
    for (int m = 1; m <= 64; ++m) {
      for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
        const Schedule s = Build(kind, p, 1, m);
        const Status st = CheckSchedule(s);
        ASSERT_TRUE(st.ok()) << ToString(kind) << " p " << p << " m " << m << ": " << st.message();
        ++checked;
      }
      for (int v = 2; v <= 4; ++v) {
        auto s = BuildSchedule(ScheduleKind::kInterleaved, p, v, m);
        ASSERT_EQ(s.ok(), p >= 2 && GroupRule(p, m, p)) << "p " << p << " v " << v << " m " << m;
        if (!s.ok()) continue;
        const Status st = CheckSchedule(*s);
        ASSERT_TRUE(st.ok()) << "interleaved p " << p << " v " << v << " m " << m << ": "
                             << st.message();
        ++checked;
      }
    }
  // 2 * 16 * 64 non-interleaved, plus 3 v's times the multiples of p up to 64 for p = 2..16:
  // 32 + 21 + 16 + 12 + 10 + 9 + 8 + 7 + 6 + 5 + 5 + 4 + 4 + 4 + 4 = 147.
  EXPECT_EQ(checked, 2 * 16 * 64 + 3 * 147);
}

TEST(ScheduleTest, CheckerPassesEveryLegalGroupSize) {
  int checked = 0;
  for (int p = 2; p <= 6; ++p)
    for (int v = 2; v <= 3; ++v)
      for (int m = p; m <= 24; ++m)
        for (int g = p; g <= m; ++g) {
          if (!GroupRule(p, m, g)) continue;
          const Schedule s = Build(ScheduleKind::kInterleaved, p, v, m, g);
          const Status st = CheckSchedule(s);
          ASSERT_TRUE(st.ok()) << "p " << p << " v " << v << " m " << m << " g " << g << ": "
                               << st.message();
          ++checked;
        }
  EXPECT_GT(checked, 500);
}

// Removes the first op of `rank` that matches.
void Drop(Schedule* s, int rank, OpKind kind, int mb, int chunk) {
  auto& ops = s->ranks[rank];
  ops.erase(std::find_if(ops.begin(), ops.end(), [&](const ScheduleOp& o) {
    return o.kind == kind && o.microbatch == mb && o.chunk == chunk;
  }));
}

// Swaps the op runs of groups a and b (a before b) on one rank.
void SwapGroups(Schedule* s, int rank, int a, int b) {
  auto& ops = s->ranks[rank];
  auto first = [&](int g) {
    return std::find_if(ops.begin(), ops.end(),
                        [&](const ScheduleOp& o) { return o.is_p2p() && o.group == g; });
  };
  auto last = [&](int g) {
    auto it = first(g);
    while (it != ops.end() && it->is_p2p() && it->group == g) ++it;
    return it;
  };
  std::vector<ScheduleOp> out(ops.begin(), first(a));
  out.insert(out.end(), first(b), last(b));
  out.insert(out.end(), last(a), first(b));
  out.insert(out.end(), first(a), last(a));
  out.insert(out.end(), last(b), ops.end());
  ops = out;
}

TEST(ScheduleTest, CheckerCatchesADroppedReceive) {
  Schedule s = Build(ScheduleKind::kOneFOneB, 4, 1, 8);
  Drop(&s, 2, OpKind::kRecvActivation, 3, 0);
  const Status st = CheckSchedule(s);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "rank 1: send-activation F3 to rank 2 has no matching receive on rank 2");
}

TEST(ScheduleTest, CheckerCatchesADeadlock) {
  // GPipe p=3 m=2, rank 1: ... F1 [g3: send F1 to rank 2] [g4: recv B0 from rank 2] B0 ...
  // Swapping g3 and g4 makes rank 1 wait for B0's gradient before handing F1 over; rank 2
  // needs F1 before it runs B0 and sends that gradient; rank 0 (groups: send F0, send F1,
  // recv B0, ...) waits in its group 2 for B0's gradient from rank 1.
  Schedule s = Build(ScheduleKind::kGPipe, 3, 1, 2);
  ASSERT_EQ(GroupOf(s, 1, OpKind::kSendActivation, 1, 0), 3);
  ASSERT_EQ(GroupOf(s, 1, OpKind::kRecvGradient, 0, 0), 4);
  SwapGroups(&s, 1, 3, 4);
  EXPECT_EQ(CheckSchedule(s).message(),
            "deadlock: rank 0 blocks in group 2 (recv-gradient B0 from rank 1); "
            "rank 1 blocks in group 4 (recv-gradient B0 from rank 2); "
            "rank 2 blocks in group 1 (recv-activation F1 from rank 1) forever");
}

TEST(ScheduleTest, CheckerCatchesReceivesOutOfOrder) {
  // 1F1B p=4 m=8: rank 1 swaps its receive of F0 (group 0) with its receive of B7's gradient
  // (last group). Each still has a partner, but rank 1 now takes F1 from rank 0 before F0:
  // a communicator that matches in order, as NCCL does, would hand it the wrong tensor.
  Schedule s = Build(ScheduleKind::kOneFOneB, 4, 1, 8);
  SwapGroups(&s, 1, 0, GroupOf(s, 1, OpKind::kRecvGradient, 7, 0));
  EXPECT_EQ(CheckSchedule(s).message(),
            "rank 0: send-activation F0 to rank 1 pairs with rank 1: recv-activation F0 from "
            "rank 0, but not in the same order among the tensors between the two ranks");
}

TEST(ScheduleTest, CheckerCatchesADuplicateForward) {
  Schedule s = Build(ScheduleKind::kInterleaved, 4, 2, 8);
  auto& ops = s.ranks[2];
  const auto it = std::find_if(ops.begin(), ops.end(),
                               [](const ScheduleOp& o) { return o.kind == OpKind::kForward; });
  ops.insert(it + 1, *it);
  const Status st = CheckSchedule(s);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "rank 2: F0.0 appears twice");
}

TEST(ScheduleTest, CheckerCatchesDependencyAndPeerErrors) {
  {  // A forward moved before the receive of its input.
    Schedule s = Build(ScheduleKind::kGPipe, 2, 1, 2);
    std::swap(s.ranks[1][0], s.ranks[1][1]);  // F0 before recv-activation F0
    EXPECT_EQ(CheckSchedule(s).message(),
              "rank 1: F0 runs before its recv-activation completed");
  }
  {  // A send posted before the forward that produces it.
    Schedule s = Build(ScheduleKind::kGPipe, 2, 1, 2);
    std::swap(s.ranks[0][0], s.ranks[0][1]);  // send-activation F0 before F0
    EXPECT_EQ(CheckSchedule(s).message(),
              "rank 0: send-activation F0 to rank 1 is posted before its forward ran");
  }
  {  // A wrong peer.
    Schedule s = Build(ScheduleKind::kOneFOneB, 3, 1, 3);
    s.ranks[1].front().peer = 2;
    EXPECT_THAT(CheckSchedule(s).message(), HasSubstr("rank 1: recv-activation F0 from rank 2 "
                                                      "names the wrong peer"));
  }
  {  // A missing backward.
    Schedule s = Build(ScheduleKind::kOneFOneB, 2, 1, 2);
    Drop(&s, 0, OpKind::kBackward, 1, 0);
    EXPECT_EQ(CheckSchedule(s).message(), "rank 0: B1 is missing");
  }
}

}  // namespace
}  // namespace ptdp
