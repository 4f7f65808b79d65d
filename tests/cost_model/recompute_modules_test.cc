// Megatron's --recompute-modules (selective recompute of named parts of a layer): the names, the
// rules transformer_config.py imposes, the ops each module reruns before the backward, and the
// activations it no longer keeps.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "core/layer_ops.h"
#include "core/layout.h"
#include "cost_model/analytic.h"
#include "tests/fakes/test_cluster.h"

namespace ptdp {
namespace {

ModelSpec Moe(bool mla = false) {
  ModelSpec m;
  m.name = "moe";
  m.layers = 8; m.hidden = 2048; m.heads = 16; m.kv_heads = 16; m.ffn_hidden = 8192;
  m.seq_len = 4096; m.vocab = 32000;
  m.activation = Activation::kSwiglu; m.norm = Norm::kRmsNorm;
  m.position = PositionEmbedding::kRope; m.tied_embeddings = false; m.bias = false;
  m.dropout = false;
  m.num_experts = 16; m.moe_topk = 2; m.moe_ffn_hidden = 1024; m.moe_shared_ffn_hidden = 1024;
  m.moe_dense_layers_first = 2; m.moe_routing = MoeRouting::kBalanced;
  if (mla) {
    m.q_lora_rank = 512; m.kv_lora_rank = 256; m.qk_head_dim = 64; m.qk_pos_head_dim = 32;
    m.v_head_dim = 64;
  }
  return m;
}

Layout Sel(uint8_t modules) {
  Layout l;
  l.tp = 2; l.dp = 4; l.ep = 4; l.etp = 1;
  l.sequence_parallel = true;
  l.micro_batch = 1; l.global_batch = 64;
  l.distributed_optimizer = true;
  l.recompute = Recompute::kSelective;
  l.recompute_modules = modules;
  return l;
}

std::set<std::string> Names(const LayerOpList& ops) {
  std::set<std::string> n;
  for (const LayerOp& op : ops) n.insert(op.name);
  return n;
}

TEST(RecomputeModules, NamesParseAndPrintInMegatronsSpelling) {
  EXPECT_EQ(RecomputeModulesString(0), "core_attn");
  EXPECT_EQ(RecomputeModulesString(kAllRecomputeModules),
            "core_attn,mla_up_proj,layernorm,mlp,moe,moe_act,shared_experts");
  const Result<uint8_t> b = ParseRecomputeModules("moe_act layernorm,core_attn");
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(*b, kRecomputeMoeAct | kRecomputeLayernorm | kRecomputeCoreAttn);
  EXPECT_FALSE(ParseRecomputeModules("moe_layer").ok());
  EXPECT_NE(ParseRecomputeModules("moe_layer").status().message().find("'moe_layer'"),
            std::string::npos);
  EXPECT_FALSE(ParseRecomputeModules(" , ").ok());
  Layout l = Sel(kRecomputeMoeAct);
  EXPECT_EQ(l.Knobs(), "sp rc-sel(moe_act) dopt");
  EXPECT_EQ(Sel(0).Knobs(), "sp rc-sel dopt");
  EXPECT_EQ(Sel(0).RecomputedModules(), kRecomputeCoreAttn);
  l.recompute = Recompute::kFull;
  EXPECT_EQ(l.RecomputedModules(), 0);
}

TEST(RecomputeModules, MegatronsRules) {
  const ModelSpec moe = Moe(), mla = Moe(true);
  EXPECT_EQ(CheckLayout(moe, Sel(kRecomputeMoe | kRecomputeLayernorm)), Rejection::kOk);
  EXPECT_EQ(CheckLayout(moe, Sel(kRecomputeMlaUpProj)), Rejection::kRecomputeModules);
  EXPECT_NE(ExplainRejection(Rejection::kRecomputeModules, moe, Sel(kRecomputeMlaUpProj))
                .find("needs multi-latent attention"),
            std::string::npos);
  EXPECT_EQ(CheckLayout(mla, Sel(kRecomputeMlaUpProj)), Rejection::kOk);
  ModelSpec dense = moe;
  dense.num_experts = 0; dense.moe_topk = 0; dense.moe_ffn_hidden = 0;
  dense.moe_shared_ffn_hidden = 0; dense.moe_dense_layers_first = 0;
  Layout dl = Sel(kRecomputeMoeAct);
  dl.ep = 1; dl.etp = 0;
  EXPECT_EQ(CheckLayout(dense, dl), Rejection::kRecomputeModules);
  Layout full = Sel(kRecomputeMlp);
  full.recompute = Recompute::kFull;
  EXPECT_EQ(CheckLayout(moe, full), Rejection::kRecomputeModules);
  Layout a2a = Sel(kRecomputeMoe);
  a2a.moe_a2a_overlap = true;
  EXPECT_EQ(CheckLayout(moe, a2a), Rejection::kRecomputeModules);
  EXPECT_EQ(RejectionKey(Rejection::kRecomputeModules), std::string("recompute_modules_illegal"));
}

TEST(RecomputeModules, EachModuleRerunsItsOps) {
  const ModelSpec m = Moe(true);
  LayerOps ops;
  auto rerun = [&](uint8_t mods, bool moe_layer) {
    BuildLayerOps(m, ShapeOf(Sel(mods), 0), &ops, moe_layer);
    return Names(ops.recompute);
  };
  EXPECT_EQ(rerun(kRecomputeCoreAttn, false), std::set<std::string>({"attention.recompute"}));
  EXPECT_EQ(rerun(kRecomputeLayernorm, false), std::set<std::string>({"norm1", "norm2"}));
  EXPECT_EQ(rerun(kRecomputeMlaUpProj, false), std::set<std::string>({"q_up", "kv_up"}));
  EXPECT_EQ(rerun(kRecomputeMoeAct, true), std::set<std::string>({"experts.activation"}));
  const std::set<std::string> mlp = rerun(kRecomputeMlp, false);
  EXPECT_TRUE(mlp.count("fc1") && mlp.count("fc2") && mlp.count("activation") &&
              mlp.count("fc1.all_gather") && mlp.count("fc2.reduce_scatter"));
  EXPECT_EQ(rerun(kRecomputeMlp, true).size(), 0u);  // an MoE layer has no dense MLP
  const std::set<std::string> shared = rerun(kRecomputeSharedExperts, true);
  EXPECT_TRUE(shared.count("shared.fc1") && shared.count("shared.fc2"));
  EXPECT_FALSE(shared.count("experts.fc1"));
  // moe: the block from the router to the combine, all-to-alls and shared experts included;
  // a collective keeps overlapping the op it overlapped when that op is rerun too.
  OpShape shape = ShapeOf(Sel(kRecomputeMoe), 0);
  shape.ep = 4;  // (AnalyticModel::Shape sets the expert grid; ShapeOf leaves it at 1)
  shape.etp = 1;
  BuildLayerOps(m, shape, &ops, true);
  const std::set<std::string> block = Names(ops.recompute);
  for (const char* n : {"router", "permute", "dispatch.all_to_all", "experts.fc1",
                        "experts.activation", "experts.fc2", "combine.all_to_all", "unpermute",
                        "shared.fc1"})
    EXPECT_TRUE(block.count(n)) << n;
  EXPECT_FALSE(block.count("norm2"));
  for (int i = 0; i < ops.recompute.size; ++i) {
    const LayerOp& op = ops.recompute[i];
    if (op.kind == LayerOpKind::kComm && op.with >= 0) {
      ASSERT_LT(op.with, ops.recompute.size);
      EXPECT_NE(ops.recompute[op.with].kind, LayerOpKind::kComm) << op.name;
    }
  }
}

TEST(RecomputeModules, LessMemoryMoreTimeAndTheirFlops) {
  const Topology topo = *Topology::Build(testing::DgxB200Like(1));
  const ModelSpec m = Moe(true);
  const AnalyticModel cost(m, topo, CostConstants{});
  const Estimate base = cost.Evaluate(Sel(0));
  for (uint8_t mods : {uint8_t(kRecomputeLayernorm), uint8_t(kRecomputeMlaUpProj),
                       uint8_t(kRecomputeMlp), uint8_t(kRecomputeMoe), uint8_t(kRecomputeMoeAct),
                       uint8_t(kRecomputeSharedExperts)}) {
    SCOPED_TRACE(RecomputeModulesString(mods));
    const Estimate e = cost.Evaluate(Sel(mods | kRecomputeCoreAttn));
    EXPECT_LT(e.memory.activations, base.memory.activations);
    EXPECT_GT(e.step_time_s, base.step_time_s);
  }
  // The whole MoE block is more than its activation; the block's FLOPs once more.
  const Estimate moe = cost.Evaluate(Sel(kRecomputeMoe)), act = cost.Evaluate(Sel(kRecomputeMoeAct));
  EXPECT_LT(moe.memory.activations, act.memory.activations);
  EXPECT_GT(moe.step_time_s, act.step_time_s);
  const double tokens = 64.0 * m.seq_len;
  EXPECT_NEAR(cost.HardwareFlops(Sel(kRecomputeMoe)) - cost.ModelFlops(Sel(kRecomputeMoe)),
              tokens * m.moe_layers() * 2.0 * double(m.moe_mlp_active_linear_params()), 1.0);
  EXPECT_NEAR(cost.HardwareFlops(Sel(kRecomputeMlp)) - cost.ModelFlops(Sel(kRecomputeMlp)),
              tokens * 2 * 2.0 * double(m.dense_mlp_linear_params()), 1.0);  // 2 dense layers
}

}  // namespace
}  // namespace ptdp
