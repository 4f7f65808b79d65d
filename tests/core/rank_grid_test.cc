// RankGrid: Megatron's tp-dp-pp rank order (megatron-reference.md section 2).
//   global_rank = tp_idx + t * (dp_idx + d * pp_idx)
// Reference example, world 16, t=2, d=2, p=4:
//   pp stage:   0          1          2           3
//            [0 1|2 3]  [4 5|6 7]  [8 9|10 11] [12 13|14 15]
#include "core/rank_grid.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace ptdp {
namespace {

using Groups = std::vector<std::vector<int>>;

TEST(RankGridTest, ReferenceExampleGroups) {
  const RankGrid g(/*tp=*/2, /*dp=*/2, /*pp=*/4);
  EXPECT_EQ(g.world(), 16);
  EXPECT_EQ(g.TpGroup(0), (std::vector<int>{0, 1}));
  EXPECT_EQ(g.TpGroup(3), (std::vector<int>{2, 3}));
  EXPECT_EQ(g.DpGroup(0), (std::vector<int>{0, 2}));
  EXPECT_EQ(g.DpGroup(1), (std::vector<int>{1, 3}));
  EXPECT_EQ(g.DpGroup(6), (std::vector<int>{4, 6}));
  EXPECT_EQ(g.PpGroup(8), (std::vector<int>{0, 4, 8, 12}));
  EXPECT_EQ(g.PpGroup(13), (std::vector<int>{1, 5, 9, 13}));
  // Rank 5 = tp 1, dp 0, pp 1: its pipeline is [1, 5, 9, 13]; first and last stage tie.
  EXPECT_EQ(g.EmbeddingGroup(5), (std::vector<int>{1, 13}));

  EXPECT_EQ(g.AllTpGroups(), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7},
                                      {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(g.AllDpGroups(), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7},
                                      {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(g.AllPpGroups(), (Groups{{0, 4, 8, 12}, {1, 5, 9, 13},
                                      {2, 6, 10, 14}, {3, 7, 11, 15}}));
}

TEST(RankGridTest, CoordinatesOfTheExample) {
  const RankGrid g(2, 2, 4);
  // 13 = 1 + 2 * (0 + 2 * 3): tp 1, dp 0, pp 3.
  const RankCoord c = g.Coord(13);
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.dp, 0);
  EXPECT_EQ(c.pp, 3);
  EXPECT_EQ(g.Rank({.tp = 0, .dp = 1, .pp = 2}), 10);  // 0 + 2 * (1 + 2 * 2)
}

TEST(RankGridTest, EmbeddingGroupWithOneStageIsOneRank) {
  const RankGrid g(4, 2, 1);
  EXPECT_EQ(g.EmbeddingGroup(5), (std::vector<int>{5}));
}

struct Shape {
  int tp, dp, pp;
};
const Shape kShapes[] = {{1, 1, 1}, {2, 2, 4}, {8, 4, 2}, {1, 8, 1}, {4, 1, 3},
                         {3, 5, 2}, {8, 16, 8}};

TEST(RankGridTest, RankOfCoordIsIdentity) {
  for (const Shape& s : kShapes) {
    const RankGrid g(s.tp, s.dp, s.pp);
    SCOPED_TRACE(testing::Message() << "tp " << s.tp << " dp " << s.dp << " pp " << s.pp);
    for (int r = 0; r < g.world(); ++r) {
      const RankCoord c = g.Coord(r);
      EXPECT_GE(c.tp, 0); EXPECT_LT(c.tp, s.tp);
      EXPECT_GE(c.dp, 0); EXPECT_LT(c.dp, s.dp);
      EXPECT_GE(c.pp, 0); EXPECT_LT(c.pp, s.pp);
      EXPECT_EQ(g.Rank(c), r);
    }
  }
}

// Each kind of group partitions the world: every rank appears exactly once, each group has
// the right size, and every rank's own group (TpGroup(r) etc.) is one of them and contains r.
void ExpectPartition(const Groups& groups, int world, int size, const char* what) {
  SCOPED_TRACE(what);
  std::vector<int> seen(world, 0);
  for (const auto& grp : groups) {
    EXPECT_EQ(static_cast<int>(grp.size()), size);
    for (int r : grp) {
      ASSERT_GE(r, 0);
      ASSERT_LT(r, world);
      ++seen[r];
    }
  }
  EXPECT_EQ(static_cast<int>(groups.size()), world / size);
  for (int r = 0; r < world; ++r) EXPECT_EQ(seen[r], 1) << "rank " << r;
}

TEST(RankGridTest, AllGroupsPartitionTheWorld) {
  for (const Shape& s : kShapes) {
    const RankGrid g(s.tp, s.dp, s.pp);
    SCOPED_TRACE(testing::Message() << "tp " << s.tp << " dp " << s.dp << " pp " << s.pp);
    ExpectPartition(g.AllTpGroups(), g.world(), s.tp, "tp");
    ExpectPartition(g.AllDpGroups(), g.world(), s.dp, "dp");
    ExpectPartition(g.AllPpGroups(), g.world(), s.pp, "pp");
    const Groups tp = g.AllTpGroups(), dp = g.AllDpGroups(), pp = g.AllPpGroups();
    for (int r = 0; r < g.world(); ++r) {
      for (const auto& [mine, all] :
           {std::pair{g.TpGroup(r), &tp}, std::pair{g.DpGroup(r), &dp},
            std::pair{g.PpGroup(r), &pp}}) {
        EXPECT_NE(std::find(mine.begin(), mine.end(), r), mine.end());
        EXPECT_NE(std::find(all->begin(), all->end(), mine), all->end());
      }
      // Group order is coordinate order.
      EXPECT_EQ(g.TpGroup(r)[g.Coord(r).tp], r);
      EXPECT_EQ(g.DpGroup(r)[g.Coord(r).dp], r);
      EXPECT_EQ(g.PpGroup(r)[g.Coord(r).pp], r);
    }
  }
}

TEST(RankGridTest, TpGroupsAreConsecutiveRanks) {
  // TP innermost: with t = 8 every TP group is 8 consecutive ranks, i.e. one 8-GPU node.
  const RankGrid g(8, 4, 2);
  for (const auto& grp : g.AllTpGroups())
    for (int i = 0; i < 8; ++i) EXPECT_EQ(grp[i], grp[0] + i);
  // PP outermost: stage k holds ranks [k*t*d, (k+1)*t*d).
  for (int r = 0; r < g.world(); ++r) EXPECT_EQ(g.Coord(r).pp, r / 32);
}


TEST(RankGrid, ContextParallelOrderTpCpDpPp) {
  // t=2, c=2, d=2, p=2 (world 16): global = tp + 2 * (cp + 2 * (dp + 2 * pp)).
  const RankGrid g(2, 2, 2, 2, 1, 1);
  EXPECT_EQ(g.world(), 16);
  EXPECT_EQ(g.Rank({.tp = 1, .dp = 1, .pp = 0, .cp = 0}), 5);   // 1 + 2 * (0 + 2 * 1)
  EXPECT_EQ(g.Rank({.tp = 0, .dp = 0, .pp = 1, .cp = 1}), 10);  // 0 + 2 * (1 + 2 * 2)
  const RankCoord c = g.Coord(11);  // 11 = 1 + 2 * (1 + 2 * (0 + 2 * 1))
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.cp, 1);
  EXPECT_EQ(c.dp, 0);
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(g.TpGroup(2), (std::vector<int>{2, 3}));
  EXPECT_EQ(g.CpGroup(0), (std::vector<int>{0, 2}));
  EXPECT_EQ(g.DpGroup(0), (std::vector<int>{0, 4}));
  EXPECT_EQ(g.DpCpGroup(1), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(g.TpCpGroup(4), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(g.PpGroup(3), (std::vector<int>{3, 11}));
  EXPECT_EQ(g.EmbeddingGroup(13), (std::vector<int>{5, 13}));
  EXPECT_EQ(g.AllCpGroups().size(), 8u);
  EXPECT_EQ(g.AllDpCpGroups().size(), 4u);  // tp x pp
}

TEST(RankGrid, ExpertGridFoldsOverTheStage) {
  // t=2, c=1, d=4, p=2: 8 ranks a stage. etp=2, ep=2: edp = 8 / 4 = 2; q = etp + 2 (ep + 2 edp).
  const RankGrid g(2, 1, 4, 2, 2, 2);
  EXPECT_EQ(g.edp(), 2);
  EXPECT_EQ(g.EtpGroup(0), (std::vector<int>{0, 1}));
  EXPECT_EQ(g.EpGroup(0), (std::vector<int>{0, 2}));
  EXPECT_EQ(g.EdpGroup(0), (std::vector<int>{0, 4}));
  EXPECT_EQ(g.EpGroup(13), (std::vector<int>{13, 15}));  // stage 1: q = 5 = 1 + 2 (0 + 2 * 1)
  const ExpertCoord e = g.Expert(13);
  EXPECT_EQ(e.etp, 1);
  EXPECT_EQ(e.ep, 0);
  EXPECT_EQ(e.edp, 1);
  // etp=1, ep=4 (edp 2): EP groups are 4 consecutive ranks; expert DP strides by 4.
  const RankGrid h(2, 1, 4, 1, 1, 4);
  EXPECT_EQ(h.EpGroup(5), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(h.EdpGroup(5), (std::vector<int>{1, 5}));
  EXPECT_EQ(h.AllEpGroups().size(), 2u);
  EXPECT_EQ(h.AllEdpGroups().size(), 4u);
  // Without experts (etp 1, ep 1): the expert-DP group is the whole stage.
  const RankGrid dense(2, 2, 1);
  EXPECT_EQ(dense.EdpGroup(1), (std::vector<int>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace ptdp
