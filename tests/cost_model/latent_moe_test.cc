// LatentMoE (Megatron --moe-latent-size: h -> L before the dispatch, L -> h after the combine)
// and a hybrid model's MTP depths (the unified --hybrid-layer-pattern "MAIN/DEPTH/...", with
// --mtp-use-repeated-layer): the weights and FLOPs Megatron counts, the MoE block's operations
// at the latent width, the TP-replicated projections, and MTP depths that cost what the
// transformer's MTP layer of the same blocks costs.
#include <gtest/gtest.h>

#include <yaml-cpp/yaml.h>

#include "core/layer_ops.h"
#include "core/layout.h"
#include "cost_model/analytic.h"
#include "tests/fakes/test_cluster.h"

namespace ptdp {
namespace {

ModelSpec Moe(int64_t layers, int64_t latent) {
  ModelSpec m;
  m.name = "latent";
  m.layers = layers; m.hidden = 2048; m.heads = 16; m.kv_heads = 4; m.ffn_hidden = 4096;
  m.seq_len = 4096; m.vocab = 32000;
  m.activation = Activation::kSquaredRelu; m.norm = Norm::kRmsNorm;
  m.position = PositionEmbedding::kRope; m.tied_embeddings = false; m.bias = false;
  m.dropout = false;
  m.num_experts = 64; m.moe_topk = 8; m.moe_ffn_hidden = 1024; m.moe_shared_ffn_hidden = 2048;
  m.moe_routing = MoeRouting::kBalanced;
  m.moe_latent_size = latent;
  return m;
}

Layout Lay(int tp, int pp, int dp, int ep) {
  Layout l;
  l.tp = tp; l.pp = pp; l.dp = dp; l.ep = ep; l.etp = 1;
  l.sequence_parallel = tp > 1;
  l.micro_batch = 1; l.global_batch = 64;
  l.distributed_optimizer = true;
  l.precision = Precision::kBf16;
  return l;
}

const LayerOp* Find(const LayerOpList& ops, const std::string& name) {
  for (const LayerOp& op : ops)
    if (op.name && name == op.name) return &op;
  return nullptr;
}

TEST(LatentMoe, WeightsAndFlopsAsMegatronCountsThem) {
  const ModelSpec plain = Moe(4, 0), lat = Moe(4, 512);
  ASSERT_TRUE(ValidateModel(lat, "m").ok()) << ValidateModel(lat, "m").message();
  // theoretical_memory_usage.py: experts 2 L f E (squared ReLU), projections 2 h L.
  EXPECT_EQ(lat.routed_expert_params(), 64 * 2 * 512 * 1024);
  EXPECT_EQ(lat.latent_params(), 2 * 2048 * 512);
  EXPECT_EQ(plain.latent_params(), 0);
  EXPECT_EQ(lat.moe_mlp_params() - plain.moe_mlp_params(),
            lat.latent_params() + lat.routed_expert_params() - plain.routed_expert_params());
  // training.py moe_layer_flops: routed 4 T L f k, the projections 4 T h L (forward 2 each
  // per token); ptdp adds the router's 2 h E, as for every MoE model.
  const double fwd = 2.0 * double(lat.moe_mlp_active_linear_params());
  EXPECT_DOUBLE_EQ(fwd, 2.0 * 2048 * 64 + 4.0 * 512 * 1024 * 8 + 4.0 * 2048 * 512 +
                            4.0 * 2048 * 2048);
  // Without a latent size the width is h and nothing changes.
  EXPECT_EQ(plain.moe_width(), plain.hidden);
  EXPECT_EQ(lat.moe_width(), 512);
}

TEST(LatentMoe, TheDispatchAndTheExpertsRunAtTheLatentWidth) {
  const Topology topo = *Topology::Build(testing::DgxB200Like(1));
  const ModelSpec plain = Moe(4, 0), lat = Moe(4, 512);
  const AnalyticModel cp(plain, topo, CostConstants{}), cl(lat, topo, CostConstants{});
  const Layout l = Lay(2, 1, 4, 4);
  LayerOps a, b;
  BuildLayerOps(plain, cp.Shape(l), &a, LayerKind::kMoe);
  BuildLayerOps(lat, cl.Shape(l), &b, LayerKind::kMoe);
  const LayerOp *da = Find(a.forward, "dispatch.all_to_all"), *db = Find(b.forward, "dispatch.all_to_all");
  ASSERT_TRUE(da && db);
  EXPECT_DOUBLE_EQ(db->bytes, da->bytes * 512 / 2048);
  const LayerOp* fc1 = Find(b.forward, "experts.fc1");
  ASSERT_TRUE(fc1);
  EXPECT_DOUBLE_EQ(fc1->k, 512);
  // The projections: this rank's tokens (SP: T / t) through h x L, forward and backward.
  const double Tl = 4096.0 / 2;
  const LayerOp *p1 = Find(b.forward, "latent.fc1"), *p2 = Find(b.forward, "latent.fc2");
  ASSERT_TRUE(p1 && p2);
  EXPECT_DOUBLE_EQ(p1->flops, 2 * Tl * 2048 * 512);
  EXPECT_DOUBLE_EQ(p2->flops, 2 * Tl * 2048 * 512);
  ASSERT_TRUE(Find(b.backward, "latent.fc1.wgrad") && Find(b.backward, "latent.fc2.dgrad"));
  EXPECT_EQ(Find(a.forward, "latent.fc1"), nullptr);
  // --recompute-modules moe reruns the projections with the block.
  Layout r = l;
  r.recompute = Recompute::kSelective;
  r.recompute_modules = kRecomputeMoe;
  BuildLayerOps(lat, cl.Shape(r), &b, LayerKind::kMoe);
  EXPECT_NE(Find(b.recompute, "latent.fc1"), nullptr);
  EXPECT_NE(Find(b.recompute, "latent.fc2"), nullptr);
  // The smaller all-to-alls and expert GEMMs make the layer cheaper once the GPU, not the host's
  // launches (two GEMMs more each way), sets the pace; the routed activations are smaller.
  Layout big = l;
  big.micro_batch = 8;
  EXPECT_LT(cl.Evaluate(big).step_time_s, cp.Evaluate(big).step_time_s);
  EXPECT_LT(cl.LayerActivationBytes(l, LayerKind::kMoe), cp.LayerActivationBytes(l, LayerKind::kMoe));
}

TEST(LatentMoe, TheProjectionsAreWholeOnEveryTpRank) {
  const Topology topo = *Topology::Build(testing::DgxB200Like(1));
  const ModelSpec m = Moe(4, 512);
  const AnalyticModel cost(m, topo, CostConstants{});
  const Layout t1 = Lay(1, 1, 8, 8), t2 = Lay(2, 1, 4, 4);
  // Embedding, output and final norm aside, the dense weights split over t but the
  // projections (parallel_mode "duplicated"); the experts over ep x etp either way.
  const double routed = 4.0 * double(m.routed_expert_params());
  const double shared = 4.0 * double(m.kind_params(LayerKind::kMoe)) - routed;
  const double proj = 4.0 * double(m.latent_params());
  auto layers_on = [&](const Layout& l) {
    const double p = cost.ParamsOnStage(l, 0);
    const double emb = double(m.padded_vocab(l.tp)) * m.hidden / l.tp;
    return p - 2 * emb - double(m.hidden);  // input and output embedding, final RMSNorm
  };
  EXPECT_NEAR(layers_on(t1), shared + routed / 8, 1.0);
  EXPECT_NEAR(layers_on(t2), (shared - proj) / 2 + proj + routed / 4, 1.0);
}

// A transformer MoE model with two MTP layers and the hybrid pattern that spells it with two
// "*E" depths predict the same step, weights and FLOPs.
TEST(HybridMtp, DepthsOfAPatternCostTheTransformersMtpLayers) {
  const Topology topo = *Topology::Build(testing::DgxB200Like(2));
  ModelSpec t = Moe(8, 0);
  t.mtp_layers = 2;
  ModelSpec h = t;
  h.layers = 16;
  h.hybrid_pattern.clear();
  for (int i = 0; i < 8; ++i) h.hybrid_pattern += "*E";
  h.mtp_pattern = "*E";
  ASSERT_TRUE(ValidateModel(h, "h").ok()) << ValidateModel(h, "h").message();
  EXPECT_EQ(h.mtp_params(), t.mtp_params());
  EXPECT_EQ(h.mtp_routed_params(), t.mtp_routed_params());
  const AnalyticModel ct(t, topo, CostConstants{}), ch(h, topo, CostConstants{});
  for (Layout l : {Lay(1, 1, 16, 4), Lay(2, 2, 4, 2)}) {
    SCOPED_TRACE(l.ShortName());
    ASSERT_EQ(CheckLayout(h, l), Rejection::kOk) << ExplainRejection(CheckLayout(h, l), h, l);
    const Estimate et = ct.Evaluate(l), eh = ch.Evaluate(l);
    EXPECT_NEAR(eh.step_time_s, et.step_time_s, 1e-9 * et.step_time_s);
    EXPECT_NEAR(eh.memory.total, et.memory.total, 1e-6 * et.memory.total);
    EXPECT_NEAR(eh.model_flops, et.model_flops, 1e-9 * et.model_flops);
    // The MTP depths are real work on the last stage: without them the step is shorter.
    ModelSpec none = h;
    none.mtp_layers = 0;
    none.mtp_pattern.clear();
    EXPECT_LT(AnalyticModel(none, topo, CostConstants{}).Evaluate(l).step_time_s,
              eh.step_time_s);
  }
  // --mtp-use-repeated-layer: one depth's weights for both, the same work.
  ModelSpec rep = h;
  rep.mtp_repeated = true;
  const AnalyticModel cr(rep, topo, CostConstants{});
  const Layout l = Lay(1, 1, 16, 4);
  // The same work; only the optimizer and the DP traffic shrink.
  EXPECT_DOUBLE_EQ(cr.Stage(l, 0).compute_s, ch.Stage(l, 0).compute_s);
  EXPECT_LT(cr.Evaluate(l).step_time_s, ch.Evaluate(l).step_time_s);
  EXPECT_NEAR(ch.ParamsOnStage(l, 0) - cr.ParamsOnStage(l, 0), ch.MtpParamsPerGpu(l), 1.0);
  EXPECT_GT(ch.MtpParamsPerGpu(l), 0);
}

TEST(HybridMtp, TheUnifiedPatternInModelYaml) {
  const std::string base =
      "name: x\nlayers: 4\nhidden: 512\nheads: 8\nseq_len: 1024\nvocab: 1000\n"
      "num_experts: 8\nmoe_topk: 2\nmoe_ffn_hidden: 256\nposition_embedding: none\n";
  auto read = [&](const std::string& extra) {
    return ModelFromYaml(YAML::Load(base + extra), "m.yaml", "");
  };
  auto m = read("hybrid_pattern: 'M*ME/*E/*E'\nmtp_repeated_layer: true\nmoe_latent_size: 128\n");
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->hybrid_pattern, "M*ME");
  EXPECT_EQ(m->mtp_pattern, "*E");
  EXPECT_EQ(m->mtp_layers, 2);
  EXPECT_TRUE(m->mtp_repeated);
  EXPECT_EQ(m->moe_latent_size, 128);
  // Written back in the unified form, and read again the same.
  const std::string yaml = ModelToYaml(*m, "");
  EXPECT_NE(yaml.find("hybrid_pattern: \"M*ME/*E/*E\""), std::string::npos) << yaml;
  auto again = ModelFromYaml(YAML::Load(yaml), "again.yaml", "");
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(ModelToYaml(*again, ""), yaml);
  // What Megatron refuses, and what the pattern contradicts.
  auto err = [&](const std::string& extra) {
    auto r = read(extra);
    return r.ok() ? std::string("accepted") : r.status().message();
  };
  EXPECT_NE(err("hybrid_pattern: 'M*ME/*E/*-'\n").find("every depth the same"), std::string::npos);
  EXPECT_NE(err("hybrid_pattern: 'M*ME/'\n").find("empty"), std::string::npos);
  EXPECT_NE(err("hybrid_pattern: 'M*ME/*E'\nmtp_layers: 2\n").find("1 MTP depths"),
            std::string::npos);
  EXPECT_NE(err("hybrid_pattern: 'M*ME'\nmtp_layers: 1\n").find("needs its depths"),
            std::string::npos);
  EXPECT_NE(err("hybrid_pattern: 'M*ME/*|E'\n").find("'|'"), std::string::npos);
  EXPECT_NE(err("hybrid_pattern: 'M*ME'\nmtp_repeated_layer: true\n").find("no MTP layers"),
            std::string::npos);
  const std::string dense =
      "name: x\nlayers: 4\nhidden: 512\nheads: 8\nseq_len: 1024\nvocab: 1000\n";
  auto d = ModelFromYaml(YAML::Load(dense + "moe_latent_size: 128\n"), "d.yaml", "");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("moe_latent_size"), std::string::npos);
  // The runtime does not train latent projections: refused by name.
  const std::string gpt =
      "name: g\nlayers: 2\nhidden: 256\nheads: 4\nseq_len: 128\nvocab: 512\n"
      "num_experts: 4\nmoe_topk: 1\nmoe_ffn_hidden: 256\nmoe_latent_size: 64\n";
  auto g = ModelFromYaml(YAML::Load(gpt), "g.yaml", "");
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_NE(CheckGptShaped(*g).message().find("moe_latent_size"), std::string::npos);
}

}  // namespace
}  // namespace ptdp
