// Issue 14's search: uneven pipeline splits where the even one is illegal, value lists for the
// knobs, context parallelism searched like tp and pp (TP x CP inside a node unless asked), the
// memory headroom, and the pick at long sequences never slower than a forced cp.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "planner/planner.h"
#include "tests/fakes/fake_estimator.h"
#include "tests/fakes/search.h"
#include "tests/fakes/test_cluster.h"

namespace ptdp {
namespace {

using testing::Search;
using testing::Space;

ModelSpec Gpt(int64_t layers, int64_t seq) {
  ModelSpec m;
  m.name = "gpt";
  m.layers = layers; m.hidden = 2048; m.heads = 16; m.kv_heads = 16; m.ffn_hidden = 8192;
  m.seq_len = seq; m.vocab = 50257;
  return m;
}

// 22 layers at pp 4: the even split is illegal, embedding + loss accounted (24 slots) and
// first/last counts (e.g. 5 | 6 | 6 | 5) are legal, and every split found is one Megatron takes.
TEST(PipelineSearch, UnevenSplitsWhereTheEvenOneIsIllegal) {
  testing::FakeEstimator fake;
  const ClusterSpec c = testing::DgxA100Like(2);
  SearchSpace s = Space(16, 64);
  s.pp = 4;
  s.tp = 2;
  s.cp = 1;
  const ModelSpec m = Gpt(22, 2048);
  const PlanResult r = Search(fake, m, c, s, 100000);
  ASSERT_FALSE(r.top.empty());
  EXPECT_GT(r.rejected[int(Rejection::kLayersPp)], 0);  // the even split, named
  std::set<std::string> splits;
  for (const auto& row : r.top) {
    EXPECT_TRUE(row.layout.uneven()) << row.layout.ShortName();
    EXPECT_EQ(CheckLayout(m, row.layout), Rejection::kOk);
    int sum = 0;
    for (int n : StageLayers(m, row.layout)) sum += n;
    EXPECT_EQ(sum, 22);
    splits.insert(row.layout.SplitName());
  }
  // 5 | 6 | 6 | 5 as the accounting gives it (first 5 last 5 is the same placement, not
  // repeated), and 6 | 5 | 5 | 6 from first/last counts.
  EXPECT_TRUE(splits.count("embedding+loss in split")) << *splits.begin();
  EXPECT_FALSE(splits.count("first 5 last 5"));
  EXPECT_TRUE(splits.count("first 6 last 6"));
  // Fixed to the even split only, nothing is legal.
  s.split_search = SplitSearch::kEvenOnly;
  EXPECT_EQ(Search(fake, m, c, s, 10).legal, 0);
}

// A user's split is kept in every row; an illegal one is rejected with its key.
TEST(PipelineSearch, FixedSplitIsRespected) {
  testing::FakeEstimator fake;
  const ClusterSpec c = testing::DgxA100Like(2);
  SearchSpace s = Space(16, 64);
  s.pp = 4;
  s.split_search = SplitSearch::kFixed;
  s.split.first_stage_layers = 4;
  s.split.last_stage_layers = 4;
  const ModelSpec m = Gpt(24, 2048);
  PlanResult r = Search(fake, m, c, s, 1000);
  ASSERT_FALSE(r.top.empty());
  for (const auto& row : r.top) {
    EXPECT_EQ(row.layout.first_stage_layers, 4);
    EXPECT_EQ(row.layout.last_stage_layers, 4);
  }
  s.split.first_stage_layers = 5;  // 24 - 5 - 4 = 15 middle layers over 2 stages
  r = Search(fake, m, c, s, 10);
  EXPECT_EQ(r.legal, 0);
  EXPECT_GT(r.rejected[int(Rejection::kUnevenSplit)], 0);
}

TEST(PipelineSearch, ValueListsSearchOnlyThoseValues) {
  testing::FakeEstimator fake;
  const ClusterSpec c = testing::DgxA100Like(4);
  SearchSpace s = Space(32, 128);
  s.tp = {2, 8};
  s.pp = {2, 4};
  s.micro_batch = {1, 4};
  const PlanResult r = Search(fake, Gpt(24, 4096), c, s, 100000);
  ASSERT_FALSE(r.top.empty());
  std::set<int> tps, pps, mbs;
  for (const auto& row : r.top) {
    tps.insert(row.layout.tp);
    pps.insert(row.layout.pp);
    mbs.insert(row.layout.micro_batch);
  }
  EXPECT_EQ(tps, (std::set<int>{2, 8}));
  EXPECT_EQ(pps, (std::set<int>{2, 4}));
  EXPECT_EQ(mbs, (std::set<int>{1, 4}));
}

// CP is searched where the sequence splits (s % 2cp), TP inside a node (CP's ring may cross:
// it is priced on the network); interleaving at pp 2 is legal with p2p overlap and rejected
// without it.
TEST(PipelineSearch, ContextParallelismAndInterleavingAtPp2) {
  testing::FakeEstimator fake;
  const ClusterSpec c = testing::DgxA100Like(4);  // 8 GPUs per node
  SearchSpace s = Space(32, 64);
  const PlanResult r = Search(fake, Gpt(24, 8192), c, s, 100000);
  std::set<int> cps;
  bool pp2_interleaved = false;
  for (const auto& row : r.top) {
    cps.insert(row.layout.cp);
    EXPECT_LE(row.layout.tp, 8) << row.layout.ShortName();
    pp2_interleaved = pp2_interleaved || (row.layout.pp == 2 && row.layout.vp > 1);
  }
  EXPECT_TRUE(cps.count(2) && cps.count(4) && cps.count(8) && cps.count(16));
  EXPECT_TRUE(pp2_interleaved);
  s.overlap_p2p = false;
  for (const auto& row : Search(fake, Gpt(24, 8192), c, s, 100000).top)
    EXPECT_FALSE(row.layout.pp == 2 && row.layout.vp > 1) << row.layout.ShortName();
  // cp 3 does not split 8192 into 2 x 3 chunks: the flag is refused.
  s.cp = 3;
  s.tp = {};
  SearchSpace bad = s;
  bad.world = 24;
  EXPECT_FALSE(CheckSearchSpace(Gpt(24, 8192), testing::DgxA100Like(3), bad).ok());
}

// The headroom: a layout fits when it needs at most (1 - headroom) of the GPU's memory.
TEST(PipelineSearch, MemoryHeadroomRejectsNearlyFullLayouts) {
  testing::FakeEstimator fake;
  const ClusterSpec c = testing::DgxA100Like(2);
  SearchSpace s = Space(16, 64);
  const PlanResult loose = Search(fake, Gpt(24, 2048), c, s, 100000);
  s.memory_headroom = 0.5;
  const PlanResult tight = Search(fake, Gpt(24, 2048), c, s, 100000);
  EXPECT_LT(tight.fitting, loose.fitting);
  for (const auto& row : tight.top)
    EXPECT_LE(row.estimate.memory.total, 0.5 * row.estimate.memory.capacity);
  s.memory_headroom = 1.0;
  EXPECT_FALSE(CheckSearchSpace(Gpt(24, 2048), c, s).ok());
}

// ZeRO-2 (Megatron-FSDP optim_grads) shards the gradients: Llama 3 405B at Meta's
// tp 8 x pp 16 x dp 128 without recompute fits only with it, and the planner falls back to it
// there; where the distributed optimizer alone fits, it is not used.
TEST(PipelineSearch, GradientShardingIsTheFallbackWhenNothingElseFits) {
  const std::string src = PTDP_SOURCE_DIR;
  auto cluster = LoadClusterFile(src + "/configs/clusters/dgx-h100.yaml");
  ASSERT_TRUE(cluster.ok());
  cluster->nodes = 2048;
  auto topo = Topology::Build(*cluster);
  ASSERT_TRUE(topo.ok());
  auto model = LoadModelFile(src + "/configs/models/llama3-405b.yaml");
  ASSERT_TRUE(model.ok());
  auto cost = AnalyticModel::Create(*model, *topo);
  ASSERT_TRUE(cost.ok());
  SearchSpace s = Space(16384, 2048);
  s.tp = 8;
  s.pp = 16;
  s.cp = 1;
  s.recompute = Recompute::kNone;
  s.memory_headroom = 0.05;
  const PlanResult r = Search(*cost, *model, *cluster, s, 5);
  ASSERT_FALSE(r.top.empty());
  for (const auto& row : r.top) {
    EXPECT_TRUE(row.layout.shard_gradients && row.layout.distributed_optimizer);
    EXPECT_LE(row.estimate.memory.total, 0.95 * row.estimate.memory.capacity);
  }
  // The same layout with the distributed optimizer alone needs more than 80 GiB.
  Layout zero1 = r.top[0].layout;
  zero1.shard_gradients = false;
  EXPECT_GT(cost->Evaluate(zero1).memory.total, 0.95 * 80 * 1073741824.0);
  EXPECT_LT(cost->Evaluate(r.top[0].layout).memory.grads, cost->Evaluate(zero1).memory.grads / 4);
  // ZeRO-2's reduce-scatter per micro-batch costs DP time.
  EXPECT_GT(cost->Evaluate(r.top[0].layout).breakdown.dp_comm_s, cost->Evaluate(zero1).breakdown.dp_comm_s);
  // ZeRO-3 shards the weights too (two layers' worth gathered at a time) and adds two weight
  // all-gathers per micro-batch: less memory, more DP time than ZeRO-2.
  Layout zero3 = r.top[0].layout, zero2 = zero3;
  zero2.shard_params = false;
  zero3.shard_params = true;
  const Estimate e2 = cost->Evaluate(zero2), e3 = cost->Evaluate(zero3);
  const double unit = double(model->params_per_layer()) / zero3.tp;
  EXPECT_NEAR(e3.memory.weights, e3.memory.grads, 1.0);  // bf16 weights, bf16 FSDP gradients
  EXPECT_GT(e3.memory.weights, 2 * unit * 2);
  EXPECT_LT(e3.memory.weights, e2.memory.weights / 2);
  EXPECT_GE(e3.breakdown.dp_comm_s, e2.breakdown.dp_comm_s);
  EXPECT_GT(cost->ChunkGradShardTime(zero3, 0, 0), cost->ChunkGradShardTime(zero2, 0, 0));
  // With recompute allowed, layouts fit without it, and it is not tried.
  s.recompute = {};
  for (const auto& row : Search(*cost, *model, *cluster, s, 5).top) EXPECT_FALSE(row.layout.shard_gradients);
}

// Megatron-Bridge's Llama 3 70B FP8 recipe on 64 GB200s: Megatron-FSDP (ZeRO-3) at tp 1 pp 1
// mb 2, 40 layers' activations offloaded to the Grace. Asked to offload where that makes a
// layout fit, the search finds such a layout with the fewest layers that fit (one fewer does
// not), and never more than the host memory holds.
TEST(PipelineSearch, OffloadsTheFewestLayersThatMakeALayoutFit) {
  const std::string src = PTDP_SOURCE_DIR;
  auto cluster = LoadClusterFile(src + "/configs/clusters/gb200-nvl72.yaml");
  ASSERT_TRUE(cluster.ok()) << cluster.status().message();
  cluster->nodes = 18;
  auto topo = Topology::Build(*cluster);
  ASSERT_TRUE(topo.ok());
  auto model = LoadModelFile(src + "/configs/models/llama3-70b.yaml");
  ASSERT_TRUE(model.ok());
  auto cost = AnalyticModel::Create(*model, *topo);
  ASSERT_TRUE(cost.ok());
  SearchSpace s = Space(64, 256);
  s.tp = 1; s.pp = 1; s.cp = 1; s.micro_batch = 2;
  s.precision = Precision::kFp8;
  s.recompute = Recompute::kNone;
  s.distributed_optimizer = true;
  s.shard_gradients = true;
  s.shard_params = true;
  s.memory_headroom = 0.05;
  cost->set_memory_headroom(0.05);
  EXPECT_TRUE(Search(*cost, *model, *cluster, s, 5).top.empty());  // 80 layers' activations
  s.search_cpu_offload = true;
  const PlanResult r = Search(*cost, *model, *cluster, s, 5);
  ASSERT_EQ(r.top.size(), 1u);
  const Layout& l = r.top[0].layout;
  EXPECT_GT(l.cpu_offload_layers, 20);
  EXPECT_LT(l.cpu_offload_layers, 60);
  EXPECT_TRUE(r.top[0].estimate.fits);
  Layout fewer = l;
  --fewer.cpu_offload_layers;
  EXPECT_FALSE(cost->Evaluate(fewer).fits);
  const MemoryBytes& m = r.top[0].estimate.memory;
  EXPECT_GT(m.host, 0);
  EXPECT_NEAR(m.host_usable, 0.95 * 240e9, 1e6);
  EXPECT_TRUE(m.host_fits());
  // A host that cannot hold them: no layout.
  ClusterSpec small = *cluster;
  small.gpu.host_memory_bytes = 50e9;
  auto small_topo = Topology::Build(small);
  ASSERT_TRUE(small_topo.ok());
  auto small_cost = AnalyticModel::Create(*model, *small_topo);
  ASSERT_TRUE(small_cost.ok());
  small_cost->set_memory_headroom(0.05);
  EXPECT_FALSE(small_cost->Evaluate(l).fits);
  EXPECT_TRUE(Search(*small_cost, *model, small, s, 5).top.empty());
  // Megatron refuses offloading with recompute or pp > 1: nothing is offloaded there.
  s.recompute = Recompute::kSelective;
  for (const auto& row : Search(*cost, *model, *cluster, s, 5).top)
    EXPECT_EQ(row.layout.cpu_offload_layers, 0);
}

// At 32K tokens the analytic pick is never slower than the best layout with cp forced.
TEST(PipelineSearch, PickAtLongSequencesNeverSlowerThanAForcedCp) {
  const std::string src = PTDP_SOURCE_DIR;
  auto cluster = LoadClusterFile(src + "/configs/clusters/dgx-h100.yaml");
  ASSERT_TRUE(cluster.ok()) << cluster.status().message();
  cluster->nodes = 64;
  auto topo = Topology::Build(*cluster);
  ASSERT_TRUE(topo.ok());
  auto model = LoadModelFile(src + "/configs/models/llama3-70b.yaml");
  ASSERT_TRUE(model.ok());
  model->seq_len = 32768;
  auto cost = AnalyticModel::Create(*model, *topo);
  ASSERT_TRUE(cost.ok()) << cost.status().message();
  SearchSpace s = Space(512, 256);
  const PlanResult pick = Search(*cost, *model, *cluster, s, 1);
  ASSERT_FALSE(pick.top.empty());
  for (int cp : {1, 2, 4, 8}) {
    s.cp = cp;
    const PlanResult forced = Search(*cost, *model, *cluster, s, 1);
    if (forced.top.empty()) continue;
    EXPECT_LE(pick.top[0].estimate.step_time_s, forced.top[0].estimate.step_time_s)
        << "cp " << cp << ": " << forced.top[0].layout.ShortName();
  }
}

}  // namespace
}  // namespace ptdp
