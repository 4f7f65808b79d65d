// The event simulator against the closed forms it must reproduce (Narayanan 2021 sec. 2.2
// bubble; in-flight micro-batches of megatron-reference.md section 3) and the analytic model.
#include "cost_model/simulator.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "tests/fakes/test_cluster.h"

namespace ptdp {
namespace {

ModelSpec Gpt(int layers) {
  ModelSpec m;
  m.name = "gpt";
  m.layers = layers; m.hidden = 4096; m.heads = 32; m.kv_heads = 32; m.ffn_hidden = 16384;
  m.seq_len = 2048; m.vocab = 51200;
  return m;
}

Layout MakeLayout(int tp, int pp, int dp, int vp, int mb, int64_t gb, ScheduleKind kind) {
  Layout l;
  l.tp = tp; l.pp = pp; l.dp = dp; l.vp = vp; l.micro_batch = mb; l.global_batch = gb;
  l.schedule = kind;
  return l;
}

class SimulatorTest : public ::testing::Test {
 protected:
  SimulatorTest() : topo_(*Topology::Build(testing::DgxA100Like(16))), model_(Gpt(48)),
                    cost_(model_, topo_, CostConstants{}) {}
  Topology topo_;
  ModelSpec model_;
  AnalyticModel cost_;
};

// Uniform stages, free communication: bubble = (p-1)/(v m) of the ideal (busy) time.
TEST_F(SimulatorTest, BubbleMatchesNarayananExactly) {
  SimOptions opt;
  opt.free_communication = true;
  opt.uniform_stages = true;
  opt.record_events = false;
  struct Case { int pp, vp, m; ScheduleKind kind; };
  const Case cases[] = {{4, 1, 8, ScheduleKind::kOneFOneB},  {8, 1, 32, ScheduleKind::kOneFOneB},
                        {4, 2, 8, ScheduleKind::kInterleaved}, {4, 3, 12, ScheduleKind::kInterleaved},
                        {8, 2, 16, ScheduleKind::kInterleaved}, {16, 3, 64, ScheduleKind::kInterleaved},
                        {4, 1, 8, ScheduleKind::kGPipe}};
  for (const Case& c : cases) {
    const Layout l = MakeLayout(1, c.pp, 128 / c.pp, c.vp, 1, int64_t(c.m) * (128 / c.pp), c.kind);
    auto sim = SimulateStep(cost_, l, opt);
    ASSERT_TRUE(sim.ok()) << sim.status().message();
    for (int r = 0; r < c.pp; ++r) {
      const SimRankStats& rs = sim->ranks[r];
      const double expected = double(c.pp - 1) / (c.vp * c.m);
      EXPECT_NEAR(rs.bubble_s / rs.compute_s, expected, 1e-9 * expected)
          << "p " << c.pp << " v " << c.vp << " m " << c.m << " rank " << r;
    }
  }
}

TEST_F(SimulatorTest, PeakInFlightMicroBatches) {
  SimOptions opt;
  opt.record_events = false;
  // GPipe keeps all m; 1F1B keeps min(p - r, m) on rank r.
  for (int m : {2, 4, 16}) {
    auto g = SimulateStep(cost_, MakeLayout(1, 4, 32, 1, 1, 32 * m, ScheduleKind::kGPipe), opt);
    ASSERT_TRUE(g.ok());
    for (const auto& rs : g->ranks) EXPECT_EQ(rs.peak_inflight, m);
    auto f = SimulateStep(cost_, MakeLayout(1, 4, 32, 1, 1, 32 * m, ScheduleKind::kOneFOneB), opt);
    ASSERT_TRUE(f.ok());
    for (int r = 0; r < 4; ++r) EXPECT_EQ(f->ranks[r].peak_inflight, std::min(4 - r, m)) << r;
  }
}

TEST_F(SimulatorTest, NeverBelowTheAnalyticLowerBound) {
  SimOptions opt;
  opt.record_events = false;
  for (int tp : {1, 2, 8})
    for (int pp : {1, 2, 4, 8})
      for (int vp : {1, 2, 3}) {
        if (vp > 1 && pp <= 2) continue;
        const int dp = 128 / (tp * pp);
        Layout l = MakeLayout(tp, pp, dp, vp, 1, dp * 16,
                              vp > 1 ? ScheduleKind::kInterleaved : ScheduleKind::kOneFOneB);
        if (CheckLayout(model_, l) != Rejection::kOk) continue;
        auto sim = SimulateStep(cost_, l, opt);
        ASSERT_TRUE(sim.ok()) << l.ShortName();
        EXPECT_GE(sim->step_time_s, cost_.LowerBound(l) * (1 - 1e-12)) << l.ShortName();
        EXPECT_NEAR(sim->breakdown.total(), sim->step_time_s, 1e-9 * sim->step_time_s);
      }
}

TEST_F(SimulatorTest, AgreesWithAnalyticWhereItsAssumptionsHold) {
  // Inside one node (cheap p2p), 1F1B, many micro-batches: the analytic closed form holds.
  // tp 2 x pp x dp = 8: the one node's GPUs (16 ranks broke the cost model's precondition
  // that the layout fits the cluster; the Debug build's assertion in Coll caught it).
  SimOptions opt;
  opt.record_events = false;
  for (int pp : {1, 2, 4}) {
    const Layout l = MakeLayout(2, pp, 4 / pp, 1, 1, 64, ScheduleKind::kOneFOneB);
    ClusterSpec one = testing::DgxA100Like(1);
    Topology topo = *Topology::Build(one);
    AnalyticModel cost(model_, topo, CostConstants{});
    auto sim = SimulateStep(cost, l, opt);
    ASSERT_TRUE(sim.ok());
    const double analytic = cost.Evaluate(l).step_time_s;
    EXPECT_NEAR(sim->step_time_s / analytic, 1.0, 0.02) << l.ShortName();
  }
}

TEST_F(SimulatorTest, RecordsEventsOnBothTracks) {
  SimOptions opt;
  const Layout l = MakeLayout(2, 4, 16, 2, 1, 16 * 8, ScheduleKind::kInterleaved);
  auto sim = SimulateStep(cost_, l, opt);
  ASSERT_TRUE(sim.ok());
  int fwd = 0, sends = 0, dp = 0;
  for (const SimEvent& e : sim->events) {
    EXPECT_LE(e.start_s, e.end_s);
    EXPECT_LE(e.end_s, sim->step_time_s * (1 + 1e-12));
    if (e.kind == OpKind::kForward) ++fwd;
    if (e.kind == OpKind::kSendActivation) ++sends;
    if (e.kind == OpKind::kReduceGradients) ++dp;
  }
  EXPECT_EQ(fwd, 4 * 8 * 2);          // p * m * v
  EXPECT_EQ(sends, 8 * (4 * 2 - 1));  // m * (virtual stages - 1)
  EXPECT_EQ(dp, 4 * 2);               // one bucket per chunk per rank
  const SimEvent f31{0, SimTrack::kCompute, OpKind::kForward, 3, 1};
  EXPECT_EQ(f31.Name(), "F3.1");
}

// Each transfer is one send and one receive: on the two ends of the pair, over the same
// interval, with a number of their own (the trace draws an arrow from one to the other).
TEST_F(SimulatorTest, SendAndReceiveShareATransferNumber) {
  SimOptions opt;
  const Layout l = MakeLayout(2, 4, 16, 2, 1, 16 * 8, ScheduleKind::kInterleaved);
  auto sim = SimulateStep(cost_, l, opt);
  ASSERT_TRUE(sim.ok());
  std::map<int, std::vector<const SimEvent*>> by_transfer;
  for (const SimEvent& e : sim->events) {
    const bool p2p = e.peer >= 0;
    EXPECT_EQ(p2p, e.transfer >= 0) << e.Name();
    if (p2p) by_transfer[e.transfer].push_back(&e);
  }
  // m (2v p - 2) transfers: 8 micro-batches cross 7 stage boundaries forwards and backwards.
  EXPECT_EQ(by_transfer.size(), 8u * 2 * 7);
  for (const auto& [id, pair] : by_transfer) {
    ASSERT_EQ(pair.size(), 2u) << id;
    const SimEvent& snd = *pair[0];
    const SimEvent& rcv = *pair[1];
    EXPECT_TRUE(snd.kind == OpKind::kSendActivation || snd.kind == OpKind::kSendGradient) << id;
    EXPECT_EQ(rcv.kind, snd.kind == OpKind::kSendActivation ? OpKind::kRecvActivation
                                                             : OpKind::kRecvGradient);
    EXPECT_EQ(snd.peer, rcv.rank);
    EXPECT_EQ(rcv.peer, snd.rank);
    EXPECT_EQ(snd.microbatch, rcv.microbatch);
    EXPECT_EQ(snd.start_s, rcv.start_s);
    EXPECT_EQ(snd.end_s, rcv.end_s);
  }
}

TEST_F(SimulatorTest, MemoryTimelinePeaksWhereAnalyticSaysOnRankZero) {
  SimOptions opt;
  const Layout l = MakeLayout(1, 4, 32, 1, 1, 32 * 8, ScheduleKind::kOneFOneB);
  auto sim = SimulateStep(cost_, l, opt);
  ASSERT_TRUE(sim.ok());
  EXPECT_GT(sim->ranks[0].peak_memory_bytes, sim->ranks[3].peak_memory_bytes);
  EXPECT_FALSE(sim->ranks[0].memory_timeline.empty());
}

}  // namespace
}  // namespace ptdp
