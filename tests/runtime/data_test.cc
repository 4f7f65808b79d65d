// Byte tokenizer, corpus split and batches: deterministic, layout-independent, full coverage.
#include "runtime/data.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <numeric>
#include <set>

namespace ptdp::rt {
namespace {

const std::string kCorpus = std::string(PTDP_SOURCE_DIR) + "/data/tinyshakespeare/input.txt";

std::vector<int32_t> Counting(int n) {
  std::vector<int32_t> t(size_t(n), 0);
  std::iota(t.begin(), t.end(), 0);
  return t;
}

TEST(ByteTokenizer, RoundTrip) {
  const std::string text = "First Citizen:\nBefore we proceed";
  const auto ids = ByteTokenizer::Encode(text);
  EXPECT_EQ(ids[0], 'F');
  EXPECT_EQ(ByteTokenizer::Decode(ids), text);
  EXPECT_EQ(ByteTokenizer::Decode({300, -1, 65}), "??A");
}

TEST(Corpus, ShippedCorpusSplitsNinetyTen) {
  auto c = LoadCorpus(kCorpus, 0.1, 65);
  ASSERT_TRUE(c.ok()) << c.status().message();
  // 1,115,394 bytes: 90% = 1,003,854 train tokens, the rest validation.
  EXPECT_EQ(c->train.size(), 1003854u);
  EXPECT_EQ(c->train.size() + c->val.size(), 1115394u);
}

TEST(Corpus, ErrorsNameTheFile) {
  auto missing = LoadCorpus("/nonexistent/corpus.txt", 0.1, 65);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/corpus.txt"), std::string::npos);
  const std::string tiny = ::testing::TempDir() + "/tiny.txt";
  std::ofstream(tiny) << "abc";
  auto short_corpus = LoadCorpus(tiny, 0.1, 65);
  ASSERT_FALSE(short_corpus.ok());
  EXPECT_NE(short_corpus.status().message().find("too short"), std::string::npos);
}

TEST(DataLoader, SameTokensWhateverTheLayout) {
  // B = 8 sequences of s = 4: (dp 1, b 8), (dp 2, b 2), (dp 4, b 1) must give the same global
  // batch when the DP ranks' micro-batches are concatenated in order.
  const auto tokens = Counting(1000);
  const int s = 4, B = 8;
  DataLoader loader(&tokens, s, B, 42);
  for (int64_t step : {0, 1, 37}) {
    std::vector<int32_t> reference(size_t(B * (s + 1)));
    loader.MicroBatch(step, 0, 1, B, 0, reference.data());
    for (auto [dp, b] : std::vector<std::pair<int, int>>{{2, 2}, {4, 1}, {2, 4}}) {
      std::vector<int32_t> joined;
      for (int d = 0; d < dp; ++d)
        for (int mb = 0; mb < B / (dp * b); ++mb) {
          std::vector<int32_t> part(size_t(b * (s + 1)));
          loader.MicroBatch(step, d, dp, b, mb, part.data());
          joined.insert(joined.end(), part.begin(), part.end());
        }
      EXPECT_EQ(joined, reference) << "dp " << dp << " b " << b << " step " << step;
    }
  }
}

TEST(DataLoader, WindowsAreContiguousAndCoverAnEpochOnce) {
  // 101 tokens, s = 4: W = (101 - 1) / 4 = 25 windows starting at multiples of 4.
  const auto tokens = Counting(101);
  DataLoader loader(&tokens, 4, 5, 7);
  EXPECT_EQ(loader.windows(), 25);
  std::set<int64_t> starts;
  for (int64_t i = 0; i < 25; ++i) starts.insert(loader.SampleOffset(i));
  EXPECT_EQ(starts.size(), 25u);
  EXPECT_EQ(*starts.rbegin(), 96);
  std::vector<int32_t> mb(5);
  loader.MicroBatch(3, 0, 1, 1, 0, mb.data());
  for (int t = 1; t < 5; ++t) EXPECT_EQ(mb[size_t(t)], mb[0] + t);  // one contiguous window
}

TEST(DataLoader, SeedDecidesTheOrder) {
  const auto tokens = Counting(10000);
  DataLoader a(&tokens, 8, 4, 1), b(&tokens, 8, 4, 1), c(&tokens, 8, 4, 2);
  int same_ab = 0, same_ac = 0;
  for (int64_t i = 0; i < 100; ++i) {
    same_ab += a.SampleOffset(i) == b.SampleOffset(i);
    same_ac += a.SampleOffset(i) == c.SampleOffset(i);
  }
  EXPECT_EQ(same_ab, 100);
  EXPECT_LT(same_ac, 10);
}

TEST(ValidationWindows, InOrder) {
  const auto tokens = Counting(20);
  const auto v = ValidationWindows(tokens, 4, 3);
  ASSERT_EQ(v.size(), 15u);
  EXPECT_EQ(v[5], 4);   // second window starts at token 4
  EXPECT_EQ(v[14], 12); // third window ends at token 12
}

}  // namespace
}  // namespace ptdp::rt
