// Planner: enumeration counts, rejection reasons, ranking, fixed knobs, TP never across nodes.
#include "planner/planner.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/fakes/fake_estimator.h"
#include "tests/fakes/search.h"
#include "tests/fakes/test_cluster.h"

namespace ptdp {
namespace {

using testing::Search;
using testing::Space;

ModelSpec SmallGpt() {
  ModelSpec m;
  m.name = "small";
  m.layers = 24; m.hidden = 2048; m.heads = 16; m.kv_heads = 16; m.ffn_hidden = 8192;
  m.seq_len = 2048; m.vocab = 50257;
  return m;
}

TEST(Planner, RanksByStepTimeAndFiltersMemory) {
  testing::FakeEstimator fake;
  const ClusterSpec c = testing::DgxA100Like(2);
  SearchSpace s = Space(16, 64);
  s.recompute = Recompute::kNone;
  s.distributed_optimizer = false;
  const PlanResult r = Search(fake, SmallGpt(), c, s, 5);
  ASSERT_EQ(r.top.size(), 5u);
  // Fake: smallest pp first (pp 1), then smallest micro-batch, SP on.
  EXPECT_EQ(r.top[0].layout.pp, 1);
  EXPECT_EQ(r.top[0].layout.micro_batch, 1);
  for (size_t i = 1; i < r.top.size(); ++i)
    EXPECT_LE(r.top[i - 1].estimate.step_time_s, r.top[i].estimate.step_time_s);
  for (const auto& row : r.top) EXPECT_TRUE(row.estimate.fits);
  // Every candidate is counted once: legal + rejected (memory included) == evaluated.
  int64_t rejected = 0;
  for (int64_t v : r.rejected) rejected += v;
  EXPECT_EQ(r.legal + rejected - r.rejected[int(Rejection::kMemory)], r.evaluated);
  EXPECT_EQ(r.legal, r.fitting + r.rejected[int(Rejection::kMemory)]);
  EXPECT_EQ(fake.calls, r.legal);
  EXPECT_GT(r.rejected[int(Rejection::kMemory)], 0);  // mb 8 at pp 1 is 80 GiB > 40
}

// The distributed optimizer at dp 1 shards over one rank: not searched twice, unless forced.
TEST(Planner, NoDistributedOptimizerTwinAtDp1) {
  testing::FakeEstimator fake;
  const ClusterSpec c = testing::DgxA100Like(1);
  SearchSpace s = Space(8, 16);
  s.dp = 1;
  s.cp = 1;  // dp x cp = 1 (cp 2 would shard over two ranks)
  s.recompute = Recompute::kNone;
  const PlanResult r = Search(fake, SmallGpt(), c, s, 1000);
  ASSERT_FALSE(r.top.empty());
  for (const auto& row : r.top) EXPECT_FALSE(row.layout.distributed_optimizer) << row.layout.ShortName();
  s.distributed_optimizer = true;
  const PlanResult forced = Search(fake, SmallGpt(), c, s, 1000);
  ASSERT_FALSE(forced.top.empty());
  for (const auto& row : forced.top) EXPECT_TRUE(row.layout.distributed_optimizer);
  EXPECT_EQ(forced.evaluated, r.evaluated);
}

TEST(Planner, NeverLetsTpCrossANodeUnlessForced) {
  testing::FakeEstimator fake;
  const ClusterSpec c = testing::DgxA100Like(4);  // 32 GPUs, 8 per node
  SearchSpace s = Space(32, 64);
  const PlanResult r = Search(fake, SmallGpt(), c, s, 1000);
  EXPECT_GT(r.rejected[int(Rejection::kTpCrossesNode)], 0);  // tp 16 is enumerated and refused
  for (const auto& row : r.top) EXPECT_LE(row.layout.tp, 8) << row.layout.ShortName();
  s.allow_tp_across_nodes = true;
  const PlanResult forced = Search(fake, SmallGpt(), c, s, 100000);
  EXPECT_EQ(forced.rejected[int(Rejection::kTpCrossesNode)], 0);
  bool saw_tp16 = false;
  for (const auto& row : forced.top) saw_tp16 |= row.layout.tp == 16;
  EXPECT_TRUE(saw_tp16);
}

// On NVL72 racks TP stays inside the rack's NVLink domain, not the 4-GPU tray: tp 8 (two trays)
// is legal, tp 16 is refused (72 % 16 != 0: the group of ranks 64..79 spans two racks). The
// same trays without the rack's NVLink (nodes_per_nvlink_domain 1) refuse tp 8.
TEST(Planner, TpStaysInsideTheNvlinkDomainNotTheTray) {
  testing::FakeEstimator fake;
  ClusterSpec c = testing::Nvl72Like(2);  // 144 GPUs, 4 per tray, 72 per rack
  SearchSpace s = Space(144, 144);
  s.recompute = Recompute::kNone;
  s.distributed_optimizer = false;
  const PlanResult r = Search(fake, SmallGpt(), c, s, 100000);
  EXPECT_GT(r.rejected[int(Rejection::kTpCrossesNode)], 0);
  bool saw_tp8 = false;
  for (const auto& row : r.top) {
    EXPECT_LE(row.layout.tp, 8) << row.layout.ShortName();
    saw_tp8 |= row.layout.tp == 8;
  }
  EXPECT_TRUE(saw_tp8);
  c.nodes_per_nvlink_domain = 1;  // 4-GPU nodes, each its own domain
  const PlanResult trays = Search(fake, SmallGpt(), c, s, 100000);
  for (const auto& row : trays.top) EXPECT_LE(row.layout.tp, 4) << row.layout.ShortName();
}

// The fake's figures, except a NaN DP time (the 0/0 of issue 12) at pp 2: the search stops with
// an error naming the layout and the term instead of ranking a NaN.
class NanAtPp2 : public Estimator {
 public:
  Estimate Evaluate(const Layout& l) const override {
    Estimate e = fake_.Evaluate(l);
    if (l.pp == 2) {
      e.breakdown.dp_comm_s = std::nan("");
      e.step_time_s = e.breakdown.total();
    }
    return e;
  }

 private:
  testing::FakeEstimator fake_;
};

TEST(Planner, RefusesAnEstimateThatIsNotANumber) {
  const ClusterSpec c = testing::DgxA100Like(2);
  SearchSpace s = Space(16, 64);
  s.pp = 2;
  s.tp = 1;
  s.vp = 1;
  s.micro_batch = 1;
  s.recompute = Recompute::kNone;
  s.distributed_optimizer = false;
  auto r = SearchLayouts(NanAtPp2(), SmallGpt(), c, s, 5);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "cost model: tp1 pp2 dp8 mb1 [ce-te]: dp_comm_s is nan (step_time_s nan): not a finite, "
            "non-negative figure");
  // Without pp 2 every figure is a number and the ranking is the fake's.
  s.pp = 4;
  EXPECT_TRUE(SearchLayouts(NanAtPp2(), SmallGpt(), c, s, 5).ok());
}

TEST(Planner, FixedKnobsAreRespected) {
  testing::FakeEstimator fake;
  const ClusterSpec c = testing::DgxA100Like(2);
  SearchSpace s = Space(16, 64);
  s.tp = 2;
  s.pp = 4;
  s.micro_batch = 2;
  s.sequence_parallel = true;
  s.recompute = Recompute::kSelective;
  const PlanResult r = Search(fake, SmallGpt(), c, s, 100);
  ASSERT_FALSE(r.top.empty());
  for (const auto& row : r.top) {
    EXPECT_EQ(row.layout.tp, 2);
    EXPECT_EQ(row.layout.pp, 4);
    EXPECT_EQ(row.layout.dp * row.layout.cp, 2);  // cp is searched too
    EXPECT_EQ(row.layout.micro_batch, 2);
    EXPECT_TRUE(row.layout.sequence_parallel);
    EXPECT_EQ(row.layout.recompute, Recompute::kSelective);
  }
}

TEST(Planner, NamesEachRejection) {
  testing::FakeEstimator fake;
  const ClusterSpec c = testing::DgxA100Like(2);
  SearchSpace s = Space(16, 64);
  const PlanResult r = Search(fake, SmallGpt(), c, s, 10);
  // 24 layers: pp 16 is illegal; vp > 1 with pp <= 2 is illegal; SP is only tried with tp > 1.
  EXPECT_GT(r.rejected[int(Rejection::kLayersPp)], 0);
  EXPECT_GT(r.rejected[int(Rejection::kInterleavePp)], 0);
  EXPECT_EQ(r.rejected[int(Rejection::kSpNeedsTp)], 0);
}

TEST(Planner, Fp8RefusedOnA100) {
  const ClusterSpec c = testing::DgxA100Like(2);
  SearchSpace s = Space(16, 64);
  s.precision = Precision::kFp8;
  Status st = CheckSearchSpace(SmallGpt(), c, s);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("fp8"), std::string::npos);
}

// fp4 needs an fp4 peak: refused on an H100 (fp8 but no fp4), in one line naming the GPU;
// searched on a Blackwell GPU that has one.
TEST(Planner, Fp4RefusedWithoutAnFp4Peak) {
  ClusterSpec h100 = testing::DgxA100Like(2);
  h100.gpu.name = "H100-SXM5-80GB";
  h100.gpu.peak_fp8 = 1979e12;
  SearchSpace s = Space(16, 64);
  s.precision = Precision::kFp4;
  Status st = CheckSearchSpace(SmallGpt(), h100, s);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "--precision fp4: GPU H100-SXM5-80GB has no fp4 peak");
  ClusterSpec b200 = testing::DgxB200Like(2);
  b200.gpu.peak_fp4 = 9e15;
  EXPECT_TRUE(CheckSearchSpace(SmallGpt(), b200, s).ok());
  testing::FakeEstimator fake;
  const PlanResult r = Search(fake, SmallGpt(), b200, s, 1);
  ASSERT_FALSE(r.top.empty());
  EXPECT_EQ(r.top[0].layout.precision, Precision::kFp4);
}

TEST(Planner, CheckSearchSpaceNamesTheFlag) {
  const ClusterSpec c = testing::DgxA100Like(2);
  SearchSpace s = Space(16, 64);
  s.tp = 3;  // 16 heads % 3 != 0, and 3 does not divide 16
  Status st = CheckSearchSpace(SmallGpt(), c, s);
  ASSERT_FALSE(st.ok());
  s = Space(16, 64);
  s.tp = 0;
  EXPECT_FALSE(CheckSearchSpace(SmallGpt(), c, s).ok());
  s = Space(32, 64);  // more GPUs than the cluster
  st = CheckSearchSpace(SmallGpt(), c, s);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("--gpus 32"), std::string::npos);
  s = Space(16, 0);
  EXPECT_FALSE(CheckSearchSpace(SmallGpt(), c, s).ok());
}

TEST(Planner, ExplainsTheWinner) {
  RankedLayout a, b;
  a.layout.pp = 2;
  b.layout.pp = 4;
  a.estimate.step_time_s = 1.0;
  a.estimate.breakdown.bubble_s = 0.1;
  b.estimate.step_time_s = 1.5;
  b.estimate.breakdown.bubble_s = 0.6;
  const auto lines = ExplainChoice(a, b);
  ASSERT_GE(lines.size(), 3u);
  EXPECT_NE(lines[0].find("0.500 s"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("pipeline bubble"), std::string::npos) << lines[1];
  bool knobs = false;
  for (const auto& l : lines) knobs |= l.find("pp 2 vs 4") != std::string::npos;
  EXPECT_TRUE(knobs);
}

}  // namespace
}  // namespace ptdp
