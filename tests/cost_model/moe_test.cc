// Mixture of Experts and MLA in the cost model: the MoE layer's operations against the FLOPs
// and bytes of megatron-reference.md section 5b, expert parameters and optimizer state over the
// expert grid (parallel folding), the all-to-all's placement in the NVLink domain, and the
// planner's search of ep / etp.
#include <gtest/gtest.h>

#include <cmath>

#include "core/layer_ops.h"
#include "cost_model/analytic.h"
#include "planner/planner.h"
#include "tests/fakes/test_cluster.h"

namespace ptdp {
namespace {

// A Mixtral-like model, small enough to reason about: 8 layers, 8 SwiGLU experts, top 2.
ModelSpec Moe() {
  ModelSpec m;
  m.name = "moe-test";
  m.layers = 8; m.hidden = 4096; m.heads = 32; m.kv_heads = 8; m.ffn_hidden = 14336;
  m.seq_len = 4096; m.vocab = 32000;
  m.activation = Activation::kSwiglu; m.norm = Norm::kRmsNorm;
  m.position = PositionEmbedding::kRope; m.tied_embeddings = false; m.bias = false;
  m.dropout = false;
  m.num_experts = 8; m.moe_topk = 2; m.moe_ffn_hidden = 14336;
  m.moe_routing = MoeRouting::kBalanced;
  return m;
}

Layout MoeLayout(int tp, int ep, int etp, int dp, int pp = 1) {
  Layout l;
  l.tp = tp; l.dp = dp; l.pp = pp; l.ep = ep; l.etp = etp;
  l.sequence_parallel = tp > 1;
  l.micro_batch = 1; l.global_batch = 64;
  l.distributed_optimizer = true;
  return l;
}

double GemmFlops(const LayerOpList& ops, const char* prefix) {
  double f = 0;
  for (const LayerOp& op : ops)
    if (op.kind == LayerOpKind::kGemm && std::string(op.name).rfind(prefix, 0) == 0) f += op.flops;
  return f;
}

double CommBytes(const LayerOpList& ops, CommGroup g) {
  double b = 0;
  for (const LayerOp& op : ops)
    if (op.kind == LayerOpKind::kComm && op.group == g) b += op.bytes;
  return b;
}

TEST(MoeLayerOps, ExpertFlopsAreTheRoutedTokensWhateverTheGrid) {
  const ModelSpec m = Moe();
  // Reference 5b: forward expert FLOPs with gated experts 6 T k h f_e per rank's T tokens.
  for (auto [tp, ep, etp] : {std::tuple{1, 1, 1}, {1, 8, 1}, {2, 4, 1}, {2, 4, 2}, {4, 2, 4}}) {
    SCOPED_TRACE(std::to_string(tp) + " " + std::to_string(ep) + " " + std::to_string(etp));
    OpShape s = ShapeOf(MoeLayout(tp, ep, etp, 8), 0);
    s.ep = ep; s.etp = etp;
    LayerOps ops;
    BuildLayerOps(m, s, &ops, /*moe=*/true);
    const double T = double(m.seq_len);  // tokens of the micro-batch
    const double per_rank_tokens = s.sp ? T / tp : T;
    EXPECT_NEAR(GemmFlops(ops.forward, "experts."),
                6.0 * per_rank_tokens * 2 * 4096 * 14336 * (s.sp ? 1.0 : 1.0 / etp),
                1e-6 * GemmFlops(ops.forward, "experts."));
    // Backward: dgrad and wgrad, twice the forward.
    EXPECT_NEAR(GemmFlops(ops.backward, "experts."), 2 * GemmFlops(ops.forward, "experts."),
                1e-6 * GemmFlops(ops.backward, "experts."));
    // Dispatch + combine, forward and backward: 4 all-to-alls of T_l k h bytes (16-bit).
    const double a2a = CommBytes(ops.forward, CommGroup::kEp) + CommBytes(ops.backward, CommGroup::kEp);
    EXPECT_DOUBLE_EQ(a2a, ep > 1 ? 4 * per_rank_tokens * 2 * 4096 * 2 : 0);
    // Expert TP gathers the routed tokens and reduce-scatters the outputs (forward and back).
    EXPECT_EQ(CommBytes(ops.forward, CommGroup::kEtp) > 0, etp > 1);
  }
  // A dense layer of the same model has no expert op.
  LayerOps dense;
  BuildLayerOps(m, ShapeOf(MoeLayout(1, 1, 1, 8), 0), &dense, /*moe=*/false);
  EXPECT_EQ(GemmFlops(dense.forward, "experts."), 0);
  EXPECT_EQ(CommBytes(dense.forward, CommGroup::kEp), 0);
}

TEST(MoeLayerOps, LoadFollowsTheRoutingPolicy) {
  ModelSpec m = Moe();
  const Topology topo = *Topology::Build(testing::DgxA100Like(8));
  const Layout l = MoeLayout(1, 8, 1, 8), ep1 = MoeLayout(1, 1, 1, 8);
  EXPECT_DOUBLE_EQ(AnalyticModel(m, topo, CostConstants{}).ExpertLoad(l), 1.0);
  m.moe_routing = MoeRouting::kCapacity;
  m.moe_capacity_factor = 1.25;
  EXPECT_DOUBLE_EQ(AnalyticModel(m, topo, CostConstants{}).ExpertLoad(l), 1.25);
  EXPECT_DOUBLE_EQ(AnalyticModel(m, topo, CostConstants{}).ExpertLoad(ep1), 1.25);  // padding
  m.moe_routing = MoeRouting::kDropless;
  m.moe_capacity_factor = 0;
  CostConstants k;
  k.moe_dropless_load = 1.3;
  EXPECT_DOUBLE_EQ(AnalyticModel(m, topo, k).ExpertLoad(l), 1.3);
  // One EP rank computes exactly the routed rows: nobody to wait for.
  EXPECT_DOUBLE_EQ(AnalyticModel(m, topo, k).ExpertLoad(ep1), 1.0);
  // The slowest rank's extra tokens cost time.
  m.moe_routing = MoeRouting::kBalanced;
  const double balanced = AnalyticModel(m, topo, k).Evaluate(l).step_time_s;
  m.moe_routing = MoeRouting::kDropless;
  EXPECT_GT(AnalyticModel(m, topo, k).Evaluate(l).step_time_s, balanced * 1.02);
}

TEST(MoeMemory, ExpertsShardOverEpAndTheirOptimizerOverExpertDp) {
  const ModelSpec m = Moe();
  const Topology topo = *Topology::Build(testing::DgxA100Like(8));
  const AnalyticModel cost(m, topo, CostConstants{});
  const Layout ep1 = MoeLayout(1, 1, 1, 8), ep8 = MoeLayout(1, 8, 1, 8);
  const double routed = double(m.routed_params(0, m.layers));
  EXPECT_NEAR(cost.ExpertParamsOnStage(ep1, 0), routed, 1);
  EXPECT_NEAR(cost.ExpertParamsOnStage(ep8, 0), routed / 8, 1);
  EXPECT_NEAR(cost.ParamsOnStage(ep1, 0) - cost.ParamsOnStage(ep8, 0), routed * 7 / 8, 1);
  // With ep 8 over 8 ranks the expert DP group is one rank: the experts' Adam state is not
  // sharded; the rest is sharded over dp 8.
  EXPECT_EQ(ep8.expert_dp(), 1);
  const MemoryBytes mem = cost.StageMemory(ep8, 0);
  const double dense = cost.ParamsOnStage(ep8, 0) - cost.ExpertParamsOnStage(ep8, 0);
  EXPECT_NEAR(mem.optimizer, 12.0 * (dense / 8 + routed / 8), 1e3);
  // More EP, less memory per GPU.
  EXPECT_LT(cost.StageMemory(ep8, 0).total, cost.StageMemory(ep1, 0).total);
}

TEST(MoeCollectives, AllToAllAcrossNodesIsSlowerThanInside) {
  const ModelSpec m = Moe();
  const Topology topo = *Topology::Build(testing::DgxA100Like(8));
  const AnalyticModel cost(m, topo, CostConstants{});
  const double bytes = 64e6;
  const double inside = cost.AllToAll(1, 8, bytes);    // one node, NVSwitch
  const double across = cost.AllToAll(1, 16, bytes);   // two nodes: 8 of 16 peers remote
  const double strided = cost.AllToAll(8, 8, bytes);   // 8 nodes, one rank each
  EXPECT_GT(inside, 0);
  EXPECT_GT(across, 2 * inside);
  EXPECT_GT(strided, across);
  EXPECT_EQ(cost.AllToAll(1, 1, bytes), 0);
}

TEST(MoeOverlap, A2aOverlapHidesAllToAllsAndIsLegalOnlyWhereMegatronAllowsIt) {
  const ModelSpec m = Moe();
  const Topology topo = *Topology::Build(testing::DgxA100Like(8));
  const AnalyticModel cost(m, topo, CostConstants{});
  Layout l = MoeLayout(1, 8, 1, 64);
  l.global_batch = 512;
  const Estimate off = cost.Evaluate(l);
  l.moe_a2a_overlap = true;
  EXPECT_EQ(CheckLayout(m, l), Rejection::kOk);
  const Estimate on = cost.Evaluate(l);
  EXPECT_LT(on.step_time_s, off.step_time_s);
  EXPECT_LT(on.breakdown.tp_comm_s, off.breakdown.tp_comm_s);
  l.ep = 1;
  EXPECT_EQ(CheckLayout(m, l), Rejection::kA2aOverlap);
  l.ep = 8; l.pp = 2; l.dp = 32;
  EXPECT_EQ(CheckLayout(m, l), Rejection::kA2aOverlap);  // pp > 1 without virtual stages
}

TEST(MoeFlops, ModelFlopsCountTheActiveWeights) {
  const ModelSpec m = Moe();
  const Topology topo = *Topology::Build(testing::DgxA100Like(8));
  const AnalyticModel cost(m, topo, CostConstants{});
  const Layout l = MoeLayout(1, 8, 1, 8);
  const double tokens = double(l.global_batch) * m.seq_len;
  // 6 x active weights (embedding lookup excluded, logits included) + attention per token.
  const double linear = double(m.active_params()) - double(m.vocab) * m.hidden -
                        m.layers * (double(m.attention_params() - m.attention_linear_params()) +
                                    m.hidden) - m.hidden;
  const double attention = 3.0 * 4.0 * m.seq_len * m.hidden * m.layers;
  EXPECT_NEAR(cost.ModelFlops(l), tokens * (6.0 * linear + attention), 1e-3 * cost.ModelFlops(l));
}

TEST(MoePlanner, SearchesTheExpertGridAndPicksEp) {
  ModelSpec m = Moe();
  m.layers = 16;
  ClusterSpec c = testing::DgxA100Like(8);
  const Topology topo = *Topology::Build(c);
  const AnalyticModel cost(m, topo, CostConstants{});
  SearchSpace s;
  s.world = 64;
  s.global_batch = 256;
  auto r = SearchLayouts(cost, m, c, s, 5);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_FALSE(r->top.empty());
  bool any_ep = false;
  for (const RankedLayout& x : r->top) {
    EXPECT_EQ(CheckLayout(m, x.layout), Rejection::kOk);
    any_ep = any_ep || x.layout.ep > 1;
  }
  EXPECT_TRUE(any_ep);
  EXPECT_GT(r->rejected[int(Rejection::kEpTpNeedsSp)], 0);
  // A dense model refuses --expert-model-parallel-size.
  ModelSpec dense = m;
  dense.num_experts = 0; dense.moe_topk = 0; dense.moe_ffn_hidden = 0;
  s.ep = 2;
  EXPECT_FALSE(CheckSearchSpace(dense, c, s).ok());
  s.ep = 3;
  EXPECT_FALSE(CheckSearchSpace(m, c, s).ok());  // 8 experts % 3
}

}  // namespace
}  // namespace ptdp
