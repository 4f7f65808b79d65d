// Layout legality (megatron-reference.md section 1): a table of legal and illegal layouts
// covering every Rejection CheckLayout can return, ValidateLayout's messages, and the string
// round trips. Letters: a heads, k kv heads, L layers, t/p/d tp/pp/dp, v virtual stages,
// b micro-batch, B global batch, m = B/(b d) micro-batches, g interleaving group size.
#include "core/layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>
#include <set>
#include <string>
#include <vector>

namespace ptdp {
namespace {

using ::testing::HasSubstr;

// a 32, k 8, L 24, h 4096, s 2048: divisible enough that each case breaks one rule only.
ModelSpec TestModel() {
  ModelSpec m;
  m.name = "test";
  m.layers = 24; m.hidden = 4096; m.heads = 32; m.kv_heads = 8; m.ffn_hidden = 16384;
  m.seq_len = 2048; m.vocab = 32000;
  return m;
}

struct LayoutArgs {
  int tp = 1, pp = 1, dp = 1, vp = 1, cp = 1, mb = 1;
  int64_t gb = 64;
  int group = 0;
  bool sp = false;
  // -1: interleaved iff vp > 1 (the consistent choice); otherwise the given kind.
  int schedule = -1;
  bool p2p_overlap = true;
  int first = 0, last = 0;  // --decoder-first/last-pipeline-num-layers
  bool emb = false, loss = false;  // --account-for-embedding/loss-in-pipeline-split
};

Layout Make(const LayoutArgs& a) {
  Layout l;
  l.tp = a.tp; l.pp = a.pp; l.dp = a.dp; l.vp = a.vp; l.cp = a.cp;
  l.micro_batch = a.mb; l.global_batch = a.gb; l.microbatch_group = a.group;
  l.sequence_parallel = a.sp;
  l.overlap_p2p = a.p2p_overlap;
  l.first_stage_layers = a.first;
  l.last_stage_layers = a.last;
  l.embedding_in_split = a.emb;
  l.loss_in_split = a.loss;
  l.schedule = a.schedule >= 0 ? static_cast<ScheduleKind>(a.schedule)
               : a.vp > 1      ? ScheduleKind::kInterleaved
                               : ScheduleKind::kOneFOneB;
  return l;
}

struct Case {
  const char* label;
  ModelSpec model;
  LayoutArgs args;
  Rejection expected;
};

ModelSpec WithKv(int64_t heads, int64_t kv) {
  ModelSpec m = TestModel();
  m.heads = heads;
  m.kv_heads = kv;
  m.hidden = heads * 128;
  return m;
}

ModelSpec WithSeq(int64_t s) {
  ModelSpec m = TestModel();
  m.seq_len = s;
  return m;
}

TEST(CheckLayoutTest, Table) {
  const ModelSpec m = TestModel();
  const int gpipe = static_cast<int>(ScheduleKind::kGPipe);
  const int interleaved = static_cast<int>(ScheduleKind::kInterleaved);
  const Case cases[] = {
      // --- legal
      {"single_gpu", m, {}, Rejection::kOk},
      {"tp8_pp4_dp2", m, {.tp = 8, .pp = 4, .dp = 2, .gb = 64}, Rejection::kOk},
      {"gpipe_schedule", m, {.pp = 4, .schedule = gpipe}, Rejection::kOk},
      // --- heads: a % t
      {"heads24_tp5", WithKv(24, 24), {.tp = 5}, Rejection::kHeadsTp},    // 24 % 5 = 4
      {"heads32_tp64", m, {.tp = 64}, Rejection::kHeadsTp},              // 32 % 64 = 32
      // --- GQA: legal when k % t == 0 or t % k == 0
      {"kv8_tp4", WithKv(32, 8), {.tp = 4}, Rejection::kOk},    // 8 % 4 == 0
      {"kv8_tp8", WithKv(32, 8), {.tp = 8}, Rejection::kOk},
      {"kv8_tp16", WithKv(32, 8), {.tp = 16}, Rejection::kOk},  // 16 % 8 == 0 (newer Megatron)
      {"kv8_tp3", WithKv(24, 8), {.tp = 3}, Rejection::kKvHeadsTp},  // 24 % 3 = 0, 8 vs 3
      {"kv6_tp4", WithKv(24, 6), {.tp = 4}, Rejection::kKvHeadsTp},  // 6 % 4 = 2, 4 % 6 = 4
      // --- L % p
      {"layers24_pp5", m, {.pp = 5}, Rejection::kLayersPp},
      {"layers24_pp16", m, {.pp = 16}, Rejection::kLayersPp},
      {"layers24_pp8", m, {.pp = 8}, Rejection::kOk},
      // --- (L/p) % v: L/p = 24/4 = 6
      {"stage6_vp3", m, {.pp = 4, .vp = 3, .gb = 8}, Rejection::kOk},   // 6 % 3 == 0
      {"stage6_vp4", m, {.pp = 4, .vp = 4, .gb = 8}, Rejection::kLayersVp},  // 6 % 4 = 2
      // --- interleaving needs p > 1 with p2p overlap (the default), p > 2 without
      //     (L/p = 12, 12 % 2 = 0, so only this rule breaks)
      {"interleave_pp2", m, {.pp = 2, .vp = 2, .gb = 8}, Rejection::kOk},
      {"interleave_pp2_no_overlap", m, {.pp = 2, .vp = 2, .gb = 8, .p2p_overlap = false},
       Rejection::kInterleavePp},
      {"interleave_pp3_no_overlap", m, {.pp = 3, .vp = 2, .gb = 6, .p2p_overlap = false},
       Rejection::kOk},
      {"interleave_pp1", m, {.pp = 1, .vp = 2, .gb = 8}, Rejection::kInterleavePp},
      // --- uneven splits, L = 24 (megatron/core/transformer/transformer_config.py)
      {"emb_loss_pp2", m, {.pp = 2, .emb = true, .loss = true}, Rejection::kOk},   // 26 / 2
      {"emb_loss_pp4", m, {.pp = 4, .emb = true, .loss = true}, Rejection::kLayersPp},  // 26 % 4
      {"emb_pp5", m, {.pp = 5, .emb = true}, Rejection::kOk},                      // 25 / 5
      {"emb_loss_vp", m, {.pp = 2, .vp = 13, .gb = 8, .emb = true, .loss = true}, Rejection::kOk},
      {"emb_loss_vp2", m, {.pp = 2, .vp = 2, .gb = 8, .emb = true, .loss = true}, Rejection::kLayersVp},
      {"first5_last5", m, {.pp = 4, .first = 5, .last = 5}, Rejection::kOk},      // 14 / 2 middle
      {"first5_pp4", m, {.pp = 4, .first = 5}, Rejection::kUnevenSplit},           // 19 % 3
      {"first6_pp4", m, {.pp = 4, .first = 6}, Rejection::kOk},                    // 18 / 3
      {"first_last_vp", m, {.pp = 4, .vp = 2, .gb = 8, .first = 6, .last = 6}, Rejection::kOk},
      {"first_vp_odd", m, {.pp = 4, .vp = 2, .gb = 8, .first = 5, .last = 7}, Rejection::kUnevenSplit},
      {"first_with_emb", m, {.pp = 4, .first = 6, .emb = true}, Rejection::kUnevenSplit},
      {"first_last_pp2_rest", m, {.pp = 2, .first = 10, .last = 10}, Rejection::kUnevenSplit},  // 4 left
      {"first_last_pp2", m, {.pp = 2, .first = 10, .last = 14}, Rejection::kOk},
      {"interleave_pp3", m, {.pp = 3, .vp = 2, .gb = 6}, Rejection::kOk},  // m 6, g 3
      // --- interleaving micro-batch rule, p 4, v 2 (L/p = 6): p <= g <= m and
      //     (m % g == 0 or m % g >= p); g defaults to p.
      {"m8_g4", m, {.pp = 4, .vp = 2, .gb = 8}, Rejection::kOk},          // 8 % 4 == 0
      {"m6_g4", m, {.pp = 4, .vp = 2, .gb = 6}, Rejection::kInterleaveMicrobatches},  // 6%4=2<4
      {"m2_g4", m, {.pp = 4, .vp = 2, .gb = 2}, Rejection::kInterleaveMicrobatches},  // g > m
      {"m12_g5", m, {.pp = 4, .vp = 2, .gb = 12, .group = 5},
       Rejection::kInterleaveMicrobatches},                                // 12 % 5 = 2 < 4
      {"m12_g6", m, {.pp = 4, .vp = 2, .gb = 12, .group = 6}, Rejection::kOk},  // 12 % 6 == 0
      {"m9_g5", m, {.pp = 4, .vp = 2, .gb = 9, .group = 5}, Rejection::kOk},    // 9 % 5 = 4 >= 4
      {"m12_g3", m, {.pp = 4, .vp = 2, .gb = 12, .group = 3},
       Rejection::kInterleaveMicrobatches},                                // g < p
      {"m6_b2_dp2", m, {.pp = 4, .dp = 2, .vp = 2, .mb = 2, .gb = 24},
       Rejection::kInterleaveMicrobatches},  // m = 24 / (2*2) = 6: 6 % 4 = 2 < 4
      {"no_interleave_m6", m, {.pp = 4, .gb = 6}, Rejection::kOk},  // 1F1B: no m rule
      // --- B % (b d)
      {"batch_64_b3", m, {.mb = 3, .gb = 64}, Rejection::kBatch},
      {"batch_64_b2_d3", m, {.dp = 3, .mb = 2, .gb = 64}, Rejection::kBatch},  // 64 % 6 = 4
      {"batch_96_b2_d3", m, {.dp = 3, .mb = 2, .gb = 96}, Rejection::kOk},     // m = 16
      // --- SP needs t > 1
      {"sp_tp1", m, {.sp = true}, Rejection::kSpNeedsTp},
      {"sp_tp2", m, {.tp = 2, .sp = true}, Rejection::kOk},
      // --- context parallelism: s % (2c)
      {"cp2_s2048", m, {.cp = 2}, Rejection::kOk},
      {"cp3_s2048", m, {.cp = 3}, Rejection::kSeqCp},           // 2048 % 6 = 2
      {"cp2_s1001", WithSeq(1001), {.cp = 2}, Rejection::kSeqCp},  // 1001 % 4 = 1
      // --- schedule kind must agree with v
      {"interleaved_vp1", m, {.pp = 4, .schedule = interleaved}, Rejection::kScheduleMismatch},
      {"1f1b_vp2", m, {.pp = 4, .vp = 2, .gb = 8, .schedule = 1}, Rejection::kScheduleMismatch},
      {"gpipe_vp2", m, {.pp = 4, .vp = 2, .gb = 8, .schedule = gpipe},
       Rejection::kScheduleMismatch},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    const Layout l = Make(c.args);
    EXPECT_EQ(RejectionKey(CheckLayout(c.model, l)), std::string(RejectionKey(c.expected)))
        << ExplainRejection(CheckLayout(c.model, l), c.model, l);
  }
}

// Megatron's expert grid (parallel folding): etp x ep x edp over tp x cp x dp of each stage.
TEST(CheckLayoutTest, ExpertParallelRules) {
  ModelSpec moe = TestModel();
  moe.num_experts = 16; moe.moe_topk = 2; moe.moe_ffn_hidden = 1024;
  auto with = [](LayoutArgs a, int ep, int etp, bool tpo = false) {
    Layout l = Make(a);
    l.ep = ep; l.etp = etp; l.tp_comm_overlap = tpo;
    return l;
  };
  EXPECT_EQ(CheckLayout(moe, with({.tp = 1, .dp = 8}, 8, 0)), Rejection::kOk);
  // ep may exceed dp: it folds over tp x cp x dp (tp 2 x dp 4 = 8 = etp 1 x ep 8).
  EXPECT_EQ(CheckLayout(moe, with({.tp = 2, .dp = 4, .sp = true}, 8, 1)), Rejection::kOk);
  EXPECT_EQ(with({.tp = 2, .dp = 4, .sp = true}, 8, 1).expert_dp(), 1);
  EXPECT_EQ(with({.tp = 2, .dp = 4, .cp = 2, .sp = true}, 4, 1).expert_dp(), 4);
  EXPECT_EQ(CheckLayout(moe, with({.tp = 1, .dp = 8}, 3, 0)), Rejection::kExpertsEp);
  EXPECT_EQ(CheckLayout(moe, with({.tp = 1, .dp = 4}, 8, 0)), Rejection::kExpertGrid);
  EXPECT_EQ(CheckLayout(moe, with({.tp = 2, .dp = 4, .sp = true}, 8, 0)), Rejection::kExpertGrid);
  EXPECT_EQ(CheckLayout(moe, with({.tp = 2, .dp = 4}, 4, 1)), Rejection::kEpTpNeedsSp);
  // ep 1 too: Megatron's MoELayer checks the attention TP size, not ep.
  EXPECT_EQ(CheckLayout(moe, with({.tp = 2, .dp = 4}, 1, 0)), Rejection::kEpTpNeedsSp);
  moe.moe_ffn_hidden = 1000;
  EXPECT_EQ(CheckLayout(moe, with({.tp = 1, .dp = 8}, 2, 0)), Rejection::kOk);
  EXPECT_EQ(CheckLayout(moe, with({.tp = 1, .dp = 32}, 2, 16)), Rejection::kExpertTpFfn);
  // Dense models take no ep; --tp-comm-overlap needs SP for any model.
  EXPECT_EQ(CheckLayout(TestModel(), with({.tp = 1, .dp = 8}, 2, 0)), Rejection::kEpWithoutMoe);
  EXPECT_EQ(CheckLayout(TestModel(), with({.tp = 2, .dp = 4}, 1, 0, true)),
            Rejection::kTpCommOverlapNeedsSp);
  EXPECT_EQ(CheckLayout(TestModel(), with({.tp = 2, .dp = 4, .sp = true}, 1, 0, true)),
            Rejection::kOk);
  // Every rejection names its numbers.
  EXPECT_THAT(ExplainRejection(Rejection::kExpertGrid, moe, with({.tp = 1, .dp = 4}, 8, 0)),
              HasSubstr("ep 8"));
  EXPECT_STREQ(RejectionKey(Rejection::kExpertsEp), "experts_not_divisible_by_ep");
}

TEST(CheckLayoutTest, GptTinyAllowsPp4WithTwoVirtualStages) {
  ModelSpec tiny;
  tiny.layers = 8; tiny.hidden = 64; tiny.heads = 4; tiny.kv_heads = 4; tiny.ffn_hidden = 256;
  tiny.seq_len = 64; tiny.vocab = 256;
  // L/p = 2, 2 % 2 == 0; m = 8 = 2 groups of 4.
  EXPECT_EQ(CheckLayout(tiny, Make({.pp = 4, .vp = 2, .gb = 8})), Rejection::kOk);
  EXPECT_EQ(CheckLayout(tiny, Make({.tp = 4, .pp = 2})), Rejection::kOk);
}

TEST(LayoutTest, DerivedFigures) {
  const Layout l = Make({.tp = 8, .pp = 4, .dp = 2, .vp = 3, .mb = 2, .gb = 64});
  EXPECT_EQ(l.world(), 64);             // 8 * 1 * 4 * 2
  EXPECT_EQ(l.num_microbatches(), 16);  // 64 / (2 * 2)
  EXPECT_EQ(l.group_size(), 4);         // 0 means p
  EXPECT_EQ(Make({.pp = 4, .group = 6}).group_size(), 6);
  EXPECT_EQ(Make({.tp = 2, .pp = 2, .dp = 2, .cp = 2}).world(), 16);
  EXPECT_EQ(l.ShortName(), "tp8 pp4 dp2 vp3 mb2");
  EXPECT_EQ(Make({.tp = 2, .cp = 2}).ShortName(), "tp2 cp2 pp1 dp1 mb1");
}

TEST(ExplainRejectionTest, ContainsTheNumbers) {
  const ModelSpec m = TestModel();
  struct Expl {
    Rejection r;
    LayoutArgs args;
    std::vector<std::string> pieces;
  };
  const Expl cases[] = {
      {Rejection::kHeadsTp, {.tp = 5}, {"heads 32", "tp 5"}},
      {Rejection::kKvHeadsTp, {.tp = 3}, {"kv_heads 8", "tp 3"}},
      {Rejection::kLayersPp, {.pp = 5}, {"layers 24", "pp 5"}},
      {Rejection::kLayersVp, {.pp = 4, .vp = 4}, {"6", "vp 4"}},
      {Rejection::kInterleavePp, {.pp = 2, .vp = 2, .p2p_overlap = false},
       {"vp 2", "pp 2", "pp > 2 without", "off"}},
      {Rejection::kLayersPp, {.pp = 4, .emb = true, .loss = true}, {"layers 24 + 2", "pp 4"}},
      {Rejection::kUnevenSplit, {.pp = 4, .first = 5}, {"middle layers 19", "middle stages 3"}},
      {Rejection::kInterleaveMicrobatches, {.pp = 4, .vp = 2, .gb = 12, .group = 5},
       {"pp 4", "g 5", "m 12"}},
      {Rejection::kBatch, {.dp = 3, .mb = 2, .gb = 64}, {"64", "2", "dp 3"}},
      {Rejection::kSpNeedsTp, {.sp = true}, {"tp > 1"}},
      {Rejection::kGradShardingNeedsDistOpt, {}, {"distributed optimizer"}},
      {Rejection::kGradReduceDtype, {}, {"--grad-reduce-in-bf16", "bf16"}},
      {Rejection::kSeqCp, {.cp = 3}, {"2048", "cp 3"}},
      {Rejection::kScheduleMismatch, {.pp = 4, .schedule = 2}, {"interleaved", "vp 1"}},
      {Rejection::kWorldSize, {.tp = 2, .pp = 2, .dp = 2}, {"2*1*2*2 = 8"}},
      {Rejection::kTpCrossesNode, {.tp = 16}, {"tp 16"}},
      {Rejection::kPrecisionUnsupported, {}, {"bf16"}},
  };
  for (const Expl& c : cases) {
    SCOPED_TRACE(RejectionKey(c.r));
    const std::string text = ExplainRejection(c.r, m, Make(c.args));
    for (const std::string& p : c.pieces) EXPECT_THAT(text, HasSubstr(p));
  }
  EXPECT_EQ(ExplainRejection(Rejection::kOk, m, Make({})), "legal");
}

// Layers per chunk as Megatron builds them (get_num_layers_to_build), for each split form.
// ChunkFirstLayer's closed form agrees with the running sum of StageLayers for every split.
TEST(StageLayersTest, ChunkFirstLayerIsThePrefixSum) {
  ModelSpec m = TestModel();
  m.layers = 61;
  m.num_experts = 8; m.moe_topk = 2; m.moe_ffn_hidden = 512; m.moe_dense_layers_first = 3;
  std::vector<Layout> ls;
  for (int p : {1, 2, 4, 8})
    for (int v : {1, 2})
      for (int first : {0, 5, 9})
        for (int last : {0, 6})
          for (bool emb : {false, true})
            for (bool loss : {false, true}) {
              Layout l = Make({.tp = 1, .pp = p, .vp = v, .gb = 64,
                               .first = first, .last = last, .emb = emb, .loss = loss});
              if (p * v > 1 && v > 1) l.schedule = ScheduleKind::kInterleaved;
              if (CheckLayout(m, l) == Rejection::kOk || CheckLayout(m, l) == Rejection::kBatch ||
                  CheckLayout(m, l) == Rejection::kInterleaveMicrobatches)
                ls.push_back(l);
            }
  ASSERT_GT(ls.size(), 10u);
  for (const Layout& l : ls) {
    SCOPED_TRACE(l.ShortName() + " " + l.SplitName());
    const std::vector<int> st = StageLayers(m, l);
    int before = 0, moe = 0;
    for (int c = 0; c < l.vp; ++c)
      for (int r = 0; r < l.pp; ++r) {
        ASSERT_EQ(ChunkFirstLayer(m, l, r, c), before);
        before += st[size_t(c) * l.pp + r];
        moe += ChunkMoeLayers(m, l, r, c);
      }
    // Every layer once (Megatron's last-stage count wins at pp 1 with both counts set).
    if (std::accumulate(st.begin(), st.end(), 0) == m.layers) {
      EXPECT_EQ(moe, 58);
    }
  }
}

TEST(StageLayersTest, MegatronsCounts) {
  ModelSpec m = TestModel();
  // Even: 24 over pp 4 x vp 2, 3 each.
  EXPECT_EQ(StageLayers(m, Make({.pp = 4, .vp = 2, .gb = 8})), std::vector<int>(8, 3));
  // Embedding and loss accounted: 26 slots over pp 2 -> 12 and 12 transformer layers.
  EXPECT_EQ(StageLayers(m, Make({.pp = 2, .emb = true, .loss = true})), (std::vector<int>{12, 12}));
  // With vp 13: every chunk 1 layer, chunk 0 of rank 0 and the last chunk of rank 1 none.
  const std::vector<int> v13 = StageLayers(m, Make({.pp = 2, .vp = 13, .gb = 8, .emb = true, .loss = true}));
  ASSERT_EQ(v13.size(), 26u);
  EXPECT_EQ(v13.front(), 0);
  EXPECT_EQ(v13.back(), 0);
  EXPECT_EQ(std::accumulate(v13.begin(), v13.end(), 0), 24);
  // First 6 (vp 2: 3 per chunk), last 6, middle (24 - 12)/2 = 6 (3 per chunk); virtual stage
  // c * p + r.
  EXPECT_EQ(StageLayers(m, Make({.pp = 4, .vp = 2, .gb = 8, .first = 6, .last = 6})),
            std::vector<int>(8, 3));
  EXPECT_EQ(StageLayers(m, Make({.pp = 4, .first = 5, .last = 5})), (std::vector<int>{5, 7, 7, 5}));
  EXPECT_EQ(RankLayers(m, Make({.pp = 4, .first = 6}), 0), 6);
  // Llama 3 405B's published split: 126 layers, pp 16, embedding and loss accounted: 7, 8 x 14, 7.
  m.layers = 126;
  const std::vector<int> llama = StageLayers(m, Make({.pp = 16, .emb = true, .loss = true}));
  EXPECT_EQ(llama.front(), 7);
  EXPECT_EQ(llama[1], 8);
  EXPECT_EQ(llama.back(), 7);
}

TEST(PipelineLayoutTest, ParsesMegatronsStrings) {
  auto pl = ParsePipelineLayout("Et|(tt|)*30,L");
  ASSERT_TRUE(pl.ok()) << pl.status().message();
  ASSERT_EQ(pl->layers.size(), 32u);
  EXPECT_EQ(pl->layers.front(), 1);
  EXPECT_EQ(pl->layers[1], 2);
  EXPECT_EQ(pl->layers.back(), 0);  // "L" alone
  EXPECT_EQ(std::accumulate(pl->layers.begin(), pl->layers.end(), 0), 61);
  // DeepSeek-V3's 61 layers at pp 16: 3 | 14 x 4 | 2 -> written as a repeat of t*4.
  pl = ParsePipelineLayout("Ettt|(t*4|)*14tt,mL");
  ASSERT_TRUE(pl.ok()) << pl.status().message();
  EXPECT_EQ(pl->layers.size(), 16u);
  EXPECT_EQ(pl->layers.front(), 3);
  EXPECT_EQ(pl->layers[7], 4);
  EXPECT_EQ(pl->layers.back(), 2);
  EXPECT_EQ(pl->mtp_layers, 1);
  for (const auto& [bad, why] : std::vector<std::pair<std::string, std::string>>{
           {"tt|ttL", "'E' (first)"}, {"Ett|tt", "'L' (last)"}, {"Ett|tLt", "must close"},
           {"Etx|ttL", "'x' is not a layer"}, {"E(tt|*3L", "without ')'"}, {"E(tt|)3L", "must be followed by '*n'"},
           {"Et|tt)*2L", "without '('"}, {"Et|t*|tL", "followed by a count"},
           {"Etm|tL", "before MTP"}, {"E(t)*99999999L", "repeat count above"}}) {
    auto r = ParsePipelineLayout(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr(why)) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr("'" + bad + "'"));
  }
}

TEST(PipelineLayoutTest, CheckedAgainstTheModelAndPp) {
  const ModelSpec m = TestModel();  // 24 layers
  auto layout = [&](const std::string& text, int pp, int vp) {
    Layout l = Make({.pp = pp, .vp = vp, .gb = 8});
    l.pipeline_layout = std::make_shared<const PipelineLayout>(*ParsePipelineLayout(text));
    return l;
  };
  Layout ok = layout("Ettttt|t*7|t*7|t*5L", 4, 1);
  EXPECT_EQ(CheckLayout(m, ok), Rejection::kOk);
  EXPECT_EQ(StageLayers(m, ok), (std::vector<int>{5, 7, 7, 5}));
  EXPECT_EQ(RankLayers(m, ok, 3), 5);
  ok = layout("Ettt|(t*3|)*6,tttL", 4, 2);  // 8 stages = pp 4 x vp 2
  EXPECT_EQ(CheckLayout(m, ok), Rejection::kOk);
  EXPECT_EQ(ChunkLayers(m, ok, 1, 0), 3);  // virtual stage 1
  EXPECT_EQ(ChunkLayers(m, ok, 0, 1), 3);  // virtual stage 4
  for (const auto& [l, why] : std::vector<std::pair<Layout, std::string>>{
           {layout("Ettttt|t*7|t*7|t*5L", 3, 1), "not a multiple of pp 3"},
           {layout("Ettttt|t*7|t*7|t*5L", 2, 1), "not vp 1"},
           {layout("Etttt|t*7|t*7|t*5L", 4, 1), "places 23 transformer layers"},
           {layout("Ettttt|t*7|t*7|t*5mL", 4, 1), "MTP"}}) {
    EXPECT_EQ(CheckLayout(m, l), Rejection::kPipelineLayout) << l.pipeline_layout->text;
    EXPECT_THAT(ExplainRejection(Rejection::kPipelineLayout, m, l), HasSubstr(why));
  }
  Layout both = layout("Ettttt|t*7|t*7|t*5L", 4, 1);
  both.embedding_in_split = true;
  EXPECT_THAT(ExplainRejection(CheckLayout(m, both), m, both), HasSubstr("cannot be combined"));
}

// Megatron-FSDP's optim_grads (ZeRO-2) rides on the distributed optimizer.
TEST(CheckLayoutTest, GradientShardingNeedsTheDistributedOptimizer) {
  Layout l = Make({.dp = 8});
  l.shard_gradients = true;
  EXPECT_EQ(CheckLayout(TestModel(), l), Rejection::kGradShardingNeedsDistOpt);
  l.distributed_optimizer = true;
  EXPECT_EQ(CheckLayout(TestModel(), l), Rejection::kOk);
  EXPECT_EQ(l.Knobs(), "zero2");
  // ZeRO-3 (optim_grads_params) shards the gradients as well as the weights.
  l.shard_params = true;
  EXPECT_EQ(l.Knobs(), "zero3");
  EXPECT_EQ(CheckLayout(TestModel(), l), Rejection::kOk);
  l.shard_gradients = false;
  EXPECT_EQ(CheckLayout(TestModel(), l), Rejection::kGradShardingNeedsDistOpt);
  EXPECT_NE(ExplainRejection(Rejection::kGradShardingNeedsDistOpt, TestModel(), l)
                .find("optim_grads_params"),
            std::string::npos);
}

// --grad-reduce-in-bf16 is read under --bf16 only (fp8 and fp4 train with bf16 weights):
// with fp16 or fp32 weights it would be a flag Megatron ignores.
TEST(CheckLayoutTest, GradientBufferDtypeFlags) {
  Layout l = Make({.dp = 8});
  l.grad_reduce_in_bf16 = true;
  for (Precision p : {Precision::kBf16, Precision::kFp8, Precision::kFp4}) {
    l.precision = p;
    EXPECT_EQ(CheckLayout(TestModel(), l), Rejection::kOk) << ToString(p);
  }
  for (Precision p : {Precision::kFp16, Precision::kFp32}) {
    l.precision = p;
    EXPECT_EQ(CheckLayout(TestModel(), l), Rejection::kGradReduceDtype) << ToString(p);
    EXPECT_THAT(ExplainRejection(Rejection::kGradReduceDtype, TestModel(), l),
                HasSubstr(std::string("got ") + ToString(p)));
  }
  l.precision = Precision::kBf16;
  EXPECT_EQ(l.Knobs(), "grad-bf16");
  // Both buffer dtypes at once: a contradiction (Megatron lets --grad-reduce-in-bf16 win).
  l.accumulate_grads_in_fp32 = true;
  EXPECT_EQ(CheckLayout(TestModel(), l), Rejection::kGradReduceDtype);
  EXPECT_THAT(ExplainRejection(Rejection::kGradReduceDtype, TestModel(), l),
              HasSubstr("--accumulate-allreduce-grads-in-fp32"));
  l.grad_reduce_in_bf16 = false;
  EXPECT_EQ(CheckLayout(TestModel(), l), Rejection::kOk);
  l.precision = Precision::kFp16;
  EXPECT_EQ(l.Knobs(), "grad-fp32 fp16");
}

// --use-precision-aware-optimizer's rules (optimizer_config.py, optimizer/__init__.py,
// training/arguments.py): each dtype fp32 without it, the distributed optimizer with it, no
// Megatron-FSDP (its own dtype flags), bf16 main gradients only over bf16 weights and not with
// fp32 accumulation.
TEST(CheckLayoutTest, PrecisionAwareOptimizerRules) {
  Layout l = Make({.dp = 8});
  l.optimizer_state.exp_avg = StateDtype::kBf16;
  EXPECT_EQ(CheckLayout(TestModel(), l), Rejection::kOptimizerDtypes);
  EXPECT_THAT(ExplainRejection(Rejection::kOptimizerDtypes, TestModel(), l),
              HasSubstr("--exp-avg-dtype bf16 needs --use-precision-aware-optimizer"));
  l.optimizer_state.precision_aware = true;
  EXPECT_THAT(PrecisionAwareProblem(l), HasSubstr("distributed optimizer"));
  l.distributed_optimizer = true;
  EXPECT_EQ(CheckLayout(TestModel(), l), Rejection::kOk);
  EXPECT_EQ(l.Knobs(), "dopt pa-opt(m=bf16)");
  l.optimizer_state.main_grads = StateDtype::kBf16;
  EXPECT_EQ(CheckLayout(TestModel(), l), Rejection::kOk);
  for (Precision p : {Precision::kFp16, Precision::kFp32}) {
    l.precision = p;
    EXPECT_THAT(PrecisionAwareProblem(l), HasSubstr("needs bf16 weights")) << ToString(p);
  }
  l.precision = Precision::kFp8;
  EXPECT_EQ(CheckLayout(TestModel(), l), Rejection::kOk);
  l.accumulate_grads_in_fp32 = true;
  EXPECT_THAT(PrecisionAwareProblem(l), HasSubstr("--accumulate-allreduce-grads-in-fp32"));
  l.accumulate_grads_in_fp32 = false;
  l.shard_gradients = true;
  EXPECT_THAT(PrecisionAwareProblem(l), HasSubstr("Megatron-FSDP"));
  l.shard_gradients = false;
  EXPECT_EQ(CheckLayout(TestModel(), l), Rejection::kOk);
  // The dtypes Megatron offers each flag, and nothing else.
  EXPECT_EQ(*ParseStateDtype("--exp-avg-dtype", "fp8",
                             {StateDtype::kFp32, StateDtype::kFp16, StateDtype::kBf16,
                              StateDtype::kFp8}),
            StateDtype::kFp8);
  const auto bad = ParseStateDtype("--main-params-dtype", "bf16", {StateDtype::kFp32, StateDtype::kFp16});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "--main-params-dtype 'bf16' is not one of: fp32, fp16");
  EXPECT_EQ(StateDtypeBytes(StateDtype::kFp8), 1);
  EXPECT_EQ(StateDtypeBytes(StateDtype::kBf16), 2);
}

TEST(RejectionKeyTest, AllDistinctAndNamed) {
  std::set<std::string> keys;
  for (int i = 0; i < kNumRejections; ++i) {
    const std::string key = RejectionKey(static_cast<Rejection>(i));
    EXPECT_NE(key, "?") << i;
    EXPECT_FALSE(key.empty()) << i;
    EXPECT_EQ(key.find(' '), std::string::npos) << key;  // usable as a JSON key
    keys.insert(key);
    // Every rejection has an explanation.
    EXPECT_FALSE(ExplainRejection(static_cast<Rejection>(i), TestModel(), Make({})).empty());
  }
  EXPECT_EQ(keys.size(), static_cast<size_t>(kNumRejections));
  EXPECT_STREQ(RejectionKey(Rejection::kHeadsTp), "heads_not_divisible_by_tp");
}

TEST(ValidateLayoutTest, Messages) {
  const ModelSpec m = TestModel();
  // Legal: tp 8 inside an 8-GPU node, 64 GPUs.
  EXPECT_TRUE(ValidateLayout(m, Make({.tp = 8, .pp = 4, .dp = 2}), 64, 8, false).ok());

  // World mismatch: 8 * 4 * 2 = 64 GPUs asked on 32.
  Status s = ValidateLayout(m, Make({.tp = 8, .pp = 4, .dp = 2}), 32, 8, false);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tp8 pp4 dp2"));
  EXPECT_THAT(s.message(), HasSubstr("= 64"));
  EXPECT_THAT(s.message(), HasSubstr("(32)"));

  // TP 16 with 8 GPUs per node spans two nodes: refused unless allowed.
  const Layout tp16 = Make({.tp = 16, .dp = 2});
  s = ValidateLayout(m, tp16, 32, 8, false);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tp 16 spans NVLink domains"));
  EXPECT_TRUE(ValidateLayout(m, tp16, 32, 8, true).ok());
  // tp 3 does not divide 8 GPUs per node: some TP group straddles a node boundary.
  EXPECT_FALSE(ValidateLayout(WithKv(24, 24), Make({.tp = 3}), 3, 8, false).ok());

  // A broken Megatron rule is named with its numbers.
  s = ValidateLayout(m, Make({.tp = 5}), 5, 8, true);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("illegal layout"));
  EXPECT_THAT(s.message(), HasSubstr("heads 32 % tp 5"));

  // Non-positive sizes.
  s = ValidateLayout(m, Make({.tp = 0}), 0, 8, false);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("must be positive"));
}

TEST(LayoutStringsTest, ParseToStringRoundTrips) {
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    Result<Recompute> back = ParseRecompute(ToString(r));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, r);
  }
  for (Precision p : {Precision::kBf16, Precision::kFp16, Precision::kFp8, Precision::kFp4,
                      Precision::kFp32}) {
    Result<Precision> back = ParsePrecision(ToString(p));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, p);
  }
  for (ScheduleKind k : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kInterleaved}) {
    Result<ScheduleKind> back = ParseScheduleKind(ToString(k));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, k);
  }
  EXPECT_STREQ(ToString(ScheduleKind::kOneFOneB), "1f1b");
  Result<Recompute> bad_r = ParseRecompute("partial");
  ASSERT_FALSE(bad_r.ok());
  EXPECT_THAT(bad_r.status().message(), HasSubstr("'partial'"));
  EXPECT_THAT(bad_r.status().message(), HasSubstr("none, selective, full"));
  EXPECT_FALSE(ParsePrecision("BF16").ok());  // case-sensitive, like the YAML values
  EXPECT_STREQ(ToString(Precision::kFp4), "fp4");
  Result<Precision> bad_p = ParsePrecision("nvfp4");
  ASSERT_FALSE(bad_p.ok());
  EXPECT_EQ(bad_p.status().message(), "precision 'nvfp4' is not one of: bf16, fp16, fp8, fp4, fp32");
  Result<ScheduleKind> bad_s = ParseScheduleKind("zero-bubble");
  ASSERT_FALSE(bad_s.ok());
  EXPECT_THAT(bad_s.status().message(), HasSubstr("gpipe, 1f1b, interleaved"));
}

}  // namespace
}  // namespace ptdp
