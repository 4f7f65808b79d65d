// GPT parameter list, TP shards and the layout-independent initialisation.
#include "runtime/params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

namespace ptdp::rt {
namespace {

ModelSpec Tiny() {
  ModelSpec m;
  m.name = "tiny";
  m.layers = 2; m.hidden = 8; m.heads = 4; m.kv_heads = 4; m.ffn_hidden = 32;
  m.seq_len = 16; m.vocab = 200;
  return m;
}

std::vector<float> Shard(const ParamSpec& p, int tp, int rank) {
  std::vector<int64_t> s = LocalShape(p, tp);
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  std::vector<float> out(static_cast<size_t>(n), 0.0f);
  InitShard(p, 1234, tp, rank, out.data());
  return out;
}

TEST(GptParams, CountMatchesModelSpec) {
  // Tied embeddings, learned positions: the runtime's parameters are ModelSpec::total_params()
  // (unpadded) plus the padding rows of the vocabulary.
  const ModelSpec m = Tiny();
  int64_t n = 0;
  for (const ParamSpec& p : GptParams(m, 1)) {
    int64_t e = 1;
    for (int64_t d : p.shape) e *= d;
    n += e;
  }
  EXPECT_EQ(n, m.total_params() + (m.padded_vocab(1) - m.vocab) * m.hidden);
}

TEST(GptParams, ShardsTileTheGlobalTensorWhateverTheTpSize) {
  // Concatenating the TP shards of every parameter reproduces the tp = 1 tensor exactly.
  const ModelSpec m = Tiny();
  const auto full = GptParams(m, 1);
  std::map<std::string, std::vector<float>> reference;
  for (const auto& p : full) reference[p.name] = Shard(p, 1, 0);
  for (int tp : {2, 4}) {
    for (const ParamSpec& p : GptParams(m, tp)) {
      const std::vector<float>& ref = reference[p.name];
      const int64_t cols = p.shape.size() > 1 ? p.shape[1] : 1;
      for (int k = 0; k < tp; ++k) {
        const std::vector<float> s = Shard(p, tp, k);
        const auto local = LocalShape(p, tp);
        const int64_t lc = local.size() > 1 ? local[1] : 1;
        for (int64_t i = 0; i < local[0]; ++i)
          for (int64_t j = 0; j < lc; ++j) {
            const int64_t gi = GlobalRow(p, tp, k, i);
            const int64_t gj = p.shard == ShardKind::kColumns ? k * lc + j : j;
            // The tp = 1 table has 256 padded rows; larger tp pads further (rows >= 256 are 0).
            const float expected = gi * cols + gj < int64_t(ref.size()) ? ref[size_t(gi * cols + gj)] : 0.0f;
            ASSERT_EQ(s[size_t(i * lc + j)], expected) << p.name << " tp " << tp << " rank " << k;
          }
      }
    }
  }
}

TEST(GptParams, InitStatistics) {
  const ModelSpec m = Tiny();
  for (const ParamSpec& p : GptParams(m, 1)) {
    const std::vector<float> v = Shard(p, 1, 0);
    if (p.init == InitKind::kOnes) {
      EXPECT_EQ(v[0], 1.0f) << p.name;
    }
    if (p.init == InitKind::kZeros) {
      EXPECT_EQ(v[0], 0.0f) << p.name;
    }
    if (p.name == "embedding.word") {
      // Rows 200..255 are padding: zero. The rest ~ N(0, 0.02^2).
      EXPECT_EQ(v[size_t(200 * 8)], 0.0f);
      double sum = 0, sq = 0;
      for (int64_t i = 0; i < 200 * 8; ++i) { sum += v[size_t(i)]; sq += double(v[size_t(i)]) * v[size_t(i)]; }
      const double mean = sum / 1600, std = std::sqrt(sq / 1600 - mean * mean);
      EXPECT_NEAR(mean, 0.0, 0.002);
      EXPECT_NEAR(std, 0.02, 0.002);
    }
  }
}

TEST(GptParams, SeedChangesValues) {
  const ParamSpec p = GptParams(Tiny(), 1)[0];
  EXPECT_NE(InitValue(1, p, 5), InitValue(2, p, 5));
  EXPECT_EQ(InitValue(1, p, 5), InitValue(1, p, 5));
  EXPECT_NE(InitValue(1, p, 5), InitValue(1, p, 6));
}

}  // namespace
}  // namespace ptdp::rt

namespace ptdp::rt {
namespace {

TEST(GptParams, QkvShardHoldsItsHeadsInEachBlock) {
  // h = 8, t = 2: the QKV weight has rows [Q 0..7; K 8..15; V 16..23]; rank 1 holds Q rows 4..7,
  // K rows 12..15, V rows 20..23, stacked.
  ParamSpec p;
  p.shape = {24, 8};
  p.shard = ShardKind::kQkvRows;
  EXPECT_EQ(GlobalRow(p, 2, 1, 0), 4);
  EXPECT_EQ(GlobalRow(p, 2, 1, 3), 7);
  EXPECT_EQ(GlobalRow(p, 2, 1, 4), 12);
  EXPECT_EQ(GlobalRow(p, 2, 1, 11), 23);
  EXPECT_EQ(GlobalRow(p, 2, 0, 8), 16);
}

}  // namespace
}  // namespace ptdp::rt
