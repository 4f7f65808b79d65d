// Hybrid models (Megatron-Core's hybrid stack, --hybrid-layer-pattern): the model's layer kinds
// and weights, the Mamba-2 mixer's operations, the layout rules Megatron's mixer and pattern
// allocation impose, and the cost model's plumbing of per-kind layers through stages, memory
// and FLOPs (a pattern of one-block layers that spells a transformer predicts what the
// transformer does).
#include <gtest/gtest.h>

#include "core/layer_ops.h"
#include "core/layout.h"
#include "cost_model/analytic.h"
#include "planner/planner.h"
#include "tests/fakes/test_cluster.h"

namespace ptdp {
namespace {

// A small Llama-like transformer and the same model written as a hybrid pattern.
ModelSpec Transformer(int64_t layers, bool moe = false) {
  ModelSpec m;
  m.name = "t";
  m.layers = layers; m.hidden = 2048; m.heads = 16; m.kv_heads = 4; m.ffn_hidden = 8192;
  m.seq_len = 4096; m.vocab = 32000;
  m.activation = Activation::kSwiglu; m.norm = Norm::kRmsNorm;
  m.position = PositionEmbedding::kRope; m.tied_embeddings = false; m.bias = false;
  m.dropout = false;
  if (moe) {
    m.num_experts = 16; m.moe_topk = 2; m.moe_ffn_hidden = 2048;
    m.moe_shared_ffn_hidden = 2048; m.moe_routing = MoeRouting::kBalanced;
  }
  return m;
}

ModelSpec AsHybrid(const ModelSpec& t) {
  ModelSpec h = t;
  h.layers = 2 * t.layers;
  h.hybrid_pattern.clear();
  for (int64_t i = 0; i < t.layers; ++i) h.hybrid_pattern += t.is_moe_layer(i) ? "*E" : "*-";
  return h;
}

// Nemotron-H-like: Mamba, attention and MLP layers.
ModelSpec Mamba(const std::string& pattern = "M-M*-M-M-") {
  ModelSpec m = Transformer(int64_t(pattern.size()));
  m.hybrid_pattern = pattern;
  m.activation = Activation::kSquaredRelu;
  m.position = PositionEmbedding::kNone;
  m.mamba_num_heads = 64; m.mamba_head_dim = 64; m.mamba_num_groups = 8; m.mamba_state_dim = 128;
  return m;
}

Layout Lay(int tp, int pp, int dp, int cp = 1) {
  Layout l;
  l.tp = tp; l.pp = pp; l.dp = dp; l.cp = cp;
  l.sequence_parallel = tp > 1;
  l.micro_batch = 1; l.global_batch = 64;
  l.distributed_optimizer = true;
  l.precision = Precision::kBf16;
  return l;
}

TEST(HybridModel, KindsCountsAndWeights) {
  const ModelSpec m = Mamba();
  ASSERT_TRUE(ValidateModel(m, "m").ok()) << ValidateModel(m, "m").message();
  EXPECT_EQ(m.layer_kind(0), LayerKind::kMamba);
  EXPECT_EQ(m.layer_kind(1), LayerKind::kMlp);
  EXPECT_EQ(m.layer_kind(3), LayerKind::kAttention);
  const LayerCounts n = m.layer_counts(0, m.layers);
  EXPECT_EQ(n[LayerKind::kMamba], 4);
  EXPECT_EQ(n[LayerKind::kAttention], 1);
  EXPECT_EQ(n[LayerKind::kMlp], 4);
  EXPECT_EQ(n.total(), 9);
  EXPECT_EQ(m.layer_counts(2, 3)[LayerKind::kAttention], 1);
  // MambaMixer: in_proj h x (2 d_inner + 2 g N + heads), out_proj d_inner x h, conv1d (x, B, C)
  // x 4 taps + bias, A, D, dt bias per head, the gated norm (d_inner), the pre-norm (h).
  const int64_t di = 64 * 64, conv = di + 2 * 8 * 128;
  EXPECT_EQ(m.mamba_in_proj(), 2 * di + 2 * 8 * 128 + 64);
  EXPECT_EQ(m.mamba_params(), 2048 + 2048 * m.mamba_in_proj() + di * 2048 + conv * 5 + 3 * 64 + di);
  EXPECT_EQ(m.layer_params(0, m.layers),
            4 * m.mamba_params() + m.attention_params() + 4 * m.dense_mlp_params());
  // A pattern that spells a transformer has the transformer's weights and active weights.
  for (bool moe : {false, true}) {
    const ModelSpec t = Transformer(6, moe), h = AsHybrid(t);
    ASSERT_TRUE(ValidateModel(h, "h").ok()) << ValidateModel(h, "h").message();
    EXPECT_EQ(h.total_params(), t.total_params());
    EXPECT_EQ(h.active_params(), t.active_params());
    EXPECT_EQ(h.moe_layers(), t.moe_layers());
  }
}

TEST(HybridModel, RefusesWhatItDoesNotModel) {
  auto problem = [](ModelSpec m) { return ValidateModel(m, "m").message(); };
  ModelSpec m = Mamba();
  m.hybrid_pattern = "M-M*-M-M|";
  EXPECT_NE(problem(m).find("pipeline separators '|' are not modelled"), std::string::npos);
  m.hybrid_pattern = "M-M*-M-MG";
  EXPECT_NE(problem(m).find("'G'"), std::string::npos);
  m.hybrid_pattern = "M-M*-M-M";
  EXPECT_NE(problem(m).find("has 8 layer symbols but layers is 9"), std::string::npos);
  m = Mamba("M-M*-M-ME");
  EXPECT_NE(problem(m).find("has E (MoE) layers but num_experts is 0"), std::string::npos);
  m = Mamba();
  m.mamba_num_groups = 3;
  EXPECT_NE(problem(m).find("mamba_num_groups '3' does not divide mamba_num_heads 64"),
            std::string::npos);
  m = Mamba("*-*-*-*-*");
  EXPECT_NE(problem(m).find("has no M (Mamba) layer but the mamba_* sizes are set"),
            std::string::npos);
  m = Transformer(4);
  m.mamba_num_heads = 8;
  EXPECT_NE(problem(m).find("mamba_num_heads is set but hybrid_pattern is empty"),
            std::string::npos);
  m = Mamba();
  m.mtp_layers = 1;
  // MTP on a hybrid model: the depths in the pattern ('MAIN/DEPTH'), not a bare count.
  EXPECT_NE(problem(m).find("mtp_layers '1' on a hybrid model needs its depths"), std::string::npos);
  // The runtime trains transformers only.
  EXPECT_FALSE(CheckGptShaped(Mamba()).ok());
}

TEST(HybridLayout, MegatronsMixerAndPatternRules) {
  const ModelSpec m = Mamba();  // 64 Mamba heads, 8 groups
  EXPECT_EQ(CheckLayout(m, Lay(2, 1, 4)), Rejection::kOk);
  EXPECT_EQ(CheckLayout(m, Lay(1, 1, 8, 2)), Rejection::kOk);
  ModelSpec odd = m;
  odd.mamba_num_heads = 40;  // 40 % tp 16 != 0
  odd.heads = 16;
  EXPECT_EQ(CheckLayout(odd, Lay(16, 1, 1)), Rejection::kHybrid);
  EXPECT_NE(ExplainRejection(Rejection::kHybrid, odd, Lay(16, 1, 1)).find("multiples of tp 16"),
            std::string::npos);
  // Groups per TP rank (8 / 4 = 2) and cp 4: cp is a multiple, legal (groups repeat);
  // heads 64 / (4 x 4) fine. cp 3 divides neither.
  EXPECT_EQ(CheckLayout(m, Lay(4, 1, 1, 4)), Rejection::kOk);
  Layout vp = Lay(1, 3, 1);
  vp.vp = 3;
  vp.schedule = ScheduleKind::kInterleaved;
  vp.global_batch = 64;
  EXPECT_EQ(CheckLayout(m, vp), Rejection::kHybrid);
  EXPECT_NE(ExplainRejection(Rejection::kHybrid, m, vp).find("'|' stage separators"),
            std::string::npos);
  EXPECT_EQ(CheckLayout(m, Lay(1, 3, 1)), Rejection::kOk);   // 9 layers over 3 stages
  EXPECT_EQ(CheckLayout(m, Lay(1, 2, 1)), Rejection::kLayersPp);
  EXPECT_EQ(RejectionKey(Rejection::kHybrid), std::string("hybrid_model_rule"));
  Layout a2a = Lay(1, 1, 8);
  a2a.moe_a2a_overlap = true;
  EXPECT_EQ(CheckLayout(m, a2a), Rejection::kHybrid);
  EXPECT_NE(ExplainRejection(Rejection::kHybrid, m, a2a).find("HybridModel lacks"),
            std::string::npos);
}

TEST(HybridOps, MambaLayer) {
  const ModelSpec m = Mamba();
  Layout l = Lay(2, 1, 4);
  const Topology topo = *Topology::Build(testing::DgxB200Like(1));
  const AnalyticModel cost(m, topo, CostConstants{});
  LayerOps ops;
  BuildLayerOps(m, cost.Shape(l), &ops, LayerKind::kMamba);
  const double T = 4096;  // tokens of one micro-batch
  // The linear layers' FLOPs: forward 2 T x (in_proj + out_proj) / t, backward twice that.
  EXPECT_DOUBLE_EQ(ops.forward.GemmFlops(), 2 * T * double(m.mamba_linear_params()) / 2);
  EXPECT_DOUBLE_EQ(ops.backward.GemmFlops(), 4 * T * double(m.mamba_linear_params()) / 2);
  int scans = 0, all_to_all = 0;
  for (const LayerOp& op : ops.forward) {
    scans += op.kind == LayerOpKind::kMemory && op.kernel == MemoryKernel::kSsmScan;
    all_to_all += op.kind == LayerOpKind::kComm && op.comm == CommKind::kAllToAll;
  }
  EXPECT_EQ(scans, 1);
  EXPECT_EQ(all_to_all, 0);
  // Selective recompute reruns attention cores only: none in a Mamba layer.
  l.recompute = Recompute::kSelective;
  BuildLayerOps(m, cost.Shape(l), &ops, LayerKind::kMamba);
  EXPECT_EQ(ops.recompute.size, 0);
  // CP trades the sequence split for a head split: two all-to-alls each way, CP group.
  l = Lay(1, 1, 4, 2);
  BuildLayerOps(m, cost.Shape(l), &ops, LayerKind::kMamba);
  all_to_all = 0;
  for (const LayerOp& op : ops.forward)
    all_to_all += op.kind == LayerOpKind::kComm && op.comm == CommKind::kAllToAll &&
                  op.group == CommGroup::kCp;
  EXPECT_EQ(all_to_all, 2);
  // An attention layer and an MLP layer are a transformer layer's two halves.
  LayerOps a, b, d;
  const OpShape s = cost.Shape(Lay(2, 1, 4));
  BuildLayerOps(m, s, &a, LayerKind::kAttention);
  BuildLayerOps(m, s, &b, LayerKind::kMlp);
  BuildLayerOps(m, s, &d, LayerKind::kDense);
  EXPECT_EQ(a.forward.size + b.forward.size, d.forward.size);
  EXPECT_DOUBLE_EQ(a.forward.GemmFlops() + b.forward.GemmFlops(), d.forward.GemmFlops());
  EXPECT_DOUBLE_EQ(a.backward.GemmFlops() + b.backward.GemmFlops(), d.backward.GemmFlops());
}

// A pattern of one-block layers that spells a transformer ('*-' per layer, '*E' per MoE layer)
// predicts the transformer's step, memory and FLOPs: every per-kind path (stage counts, times,
// weights, activations, FLOPs) adds up as the transformer's.
TEST(HybridCost, APatternThatSpellsATransformerPredictsIt) {
  const Topology topo = *Topology::Build(testing::DgxB200Like(2));
  for (bool moe : {false, true}) {
    const ModelSpec t = Transformer(8, moe), h = AsHybrid(t);
    const AnalyticModel ct(t, topo, CostConstants{}), ch(h, topo, CostConstants{});
    for (Layout l : {Lay(1, 1, 16), Lay(2, 2, 4), Lay(4, 4, 1), Lay(2, 1, 4, 2)}) {
      if (moe) l.ep = 2, l.etp = 1;
      for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
        l.recompute = rc;
        SCOPED_TRACE(l.ShortName() + (moe ? " moe " : " ") + ToString(rc));
        ASSERT_EQ(CheckLayout(h, l), Rejection::kOk) << ExplainRejection(CheckLayout(h, l), h, l);
        const Estimate et = ct.Evaluate(l), eh = ch.Evaluate(l);
        EXPECT_NEAR(eh.step_time_s, et.step_time_s, 1e-9 * et.step_time_s);
        // Full recompute keeps each layer's input and reruns one layer at a time: a hybrid
        // layer is one block (Megatron checkpoints per layer), so the two differ there.
        if (rc != Recompute::kFull) {
          EXPECT_NEAR(eh.memory.total, et.memory.total, 1e-6 * et.memory.total);
          EXPECT_NEAR(eh.memory.activations, et.memory.activations, 1e-6 * et.memory.activations);
        }
        EXPECT_NEAR(eh.model_flops, et.model_flops, 1e-9 * et.model_flops);
        EXPECT_NEAR(eh.hw_flops, et.hw_flops, 1e-9 * et.hw_flops);
      }
    }
  }
}

TEST(HybridCost, MambaLayersCostTheirScanAndStagesFollowThePattern) {
  const Topology topo = *Topology::Build(testing::DgxB200Like(1));
  const ModelSpec m = Mamba("MMMMMM*-*-*-");  // the Mamba layers all on stage 0 of 2
  const AnalyticModel cost(m, topo, CostConstants{});
  const Layout l = Lay(1, 2, 4);
  const LayerTimes lt = cost.Layer(l);
  const OneLayerTimes& mamba = lt.kinds[size_t(LayerKind::kMamba)];
  EXPECT_GT(mamba.fwd_compute_s, 0);
  EXPECT_GT(mamba.bwd_compute_s, mamba.fwd_compute_s);
  EXPECT_EQ(cost.RankLayerCounts(l, 0)[LayerKind::kMamba], 6);
  EXPECT_EQ(cost.RankLayerCounts(l, 1)[LayerKind::kAttention], 3);
  EXPECT_NEAR(cost.Stage(l, 0).compute_s - lt.embedding.fwd_compute_s - lt.embedding.bwd_compute_s,
              6 * (mamba.fwd_compute_s + mamba.bwd_compute_s), 1e-12);
  // A slower scan (ssm_scan_eff) slows the Mamba stage only.
  CostConstants slow;
  slow.ssm_scan_eff = slow.ssm_scan_eff / 4;
  const AnalyticModel slower(m, topo, slow);
  EXPECT_GT(slower.Stage(l, 0).compute_s, cost.Stage(l, 0).compute_s);
  EXPECT_DOUBLE_EQ(slower.Stage(l, 1).compute_s, cost.Stage(l, 1).compute_s);
  // Weights on each stage add up to the model's (embedding and output on their stages).
  EXPECT_NEAR(cost.ParamsOnStage(l, 0) + cost.ParamsOnStage(l, 1),
              double(m.total_params()) - double(m.vocab) * m.hidden * 2 +
                  double(m.padded_vocab(1)) * m.hidden * 2,
              1.0);
}

TEST(HybridPlanner, PlansAHybridModel) {
  const ClusterSpec c = testing::DgxB200Like(1);
  const Topology topo = *Topology::Build(c);
  const ModelSpec m = Mamba("M-M*-M-M-M*-");  // 12 layers: pp 1, 2, 3, 4, 6 even
  const AnalyticModel cost(m, topo, CostConstants{});
  SearchSpace s;
  s.world = 8;
  s.global_batch = 64;
  auto r = SearchLayouts(cost, m, c, s, 10);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_FALSE(r->top.empty());
  for (const RankedLayout& x : r->top) {
    EXPECT_EQ(x.layout.vp, 1);
    EXPECT_EQ(CheckLayout(m, x.layout), Rejection::kOk);
  }
  EXPECT_GT(r->rejected[int(Rejection::kHybrid)], 0);  // the interleaved candidates
}

// The planner's default EP all-to-all overlap (on wherever Megatron allows it for a GPT model)
// is off for a hybrid MoE model, whose HybridModel cannot run it: else every pp-1 layout with
// EP but full recompute would be refused (the planner then missed Nemotron 3's published
// layouts).
TEST(HybridPlanner, AnMoeHybridPlansEpWithoutTheA2aOverlap) {
  const ClusterSpec c = testing::DgxB200Like(1);
  const Topology topo = *Topology::Build(c);
  ModelSpec m = Mamba("M*EM*EM*EM*E");
  m.num_experts = 8; m.moe_topk = 2; m.moe_ffn_hidden = 1024;
  m.moe_routing = MoeRouting::kBalanced;
  ASSERT_TRUE(ValidateModel(m, "m").ok()) << ValidateModel(m, "m").message();
  const AnalyticModel cost(m, topo, CostConstants{});
  SearchSpace s;
  s.world = 8;
  s.global_batch = 64;
  s.pp = 1;
  s.ep = 8;
  s.recompute = Recompute::kNone;
  auto r = SearchLayouts(cost, m, c, s, 10);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_FALSE(r->top.empty());
  for (const RankedLayout& x : r->top) {
    EXPECT_FALSE(x.layout.moe_a2a_overlap);
    EXPECT_EQ(CheckLayout(m, x.layout), Rejection::kOk);
  }
}

}  // namespace
}  // namespace ptdp
