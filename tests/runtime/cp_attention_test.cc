// The context-parallel attention blocks (Backend::AttentionBlockForward / Backward) on the CPU:
// a ring of blocks over Megatron's load-balanced chunks (rank i holds chunks i and 2c-1-i)
// composes to the whole-sequence causal attention (AttentionForward / AttentionBackward, which
// cpu_backend_test checks against finite differences), for cp 1, 2 and 4, its log-sum-exp to a
// naive one in double; CopyColumns moves the named columns only.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "runtime/cpu/cpu_backend.h"
#include "tests/fakes/random_floats.h"

namespace ptdp::rt {
namespace {

using testing::RandomFloats;

class CpAttention : public ::testing::Test {
 protected:
  Tensor F(const Shape& shape, const std::vector<float>& values = {}) {
    Result<Tensor> t = be.Alloc(shape, DType::kF32);
    EXPECT_TRUE(t.ok()) << t.status().message();
    if (!values.empty()) {
      EXPECT_TRUE(be.CopyFromHost(values.data(), *t).ok());
    }
    return *t;
  }
  std::vector<float> Host(const Tensor& t) {
    std::vector<float> v(size_t(t.numel()));
    EXPECT_TRUE(be.CopyToHost(t, v.data()).ok());
    return v;
  }
  CpuBackend be;
};

SeqBlock Block(int rank, int cp, int64_t S) {
  SeqBlock blk;
  blk.len = S / (2 * cp);
  blk.first0 = rank * blk.len;
  blk.first1 = (2 * cp - 1 - rank) * blk.len;
  return blk;
}

// Rows of a seq-first (S, b, W) host array at the block's positions: (2 len, b, W).
std::vector<float> Gather(const std::vector<float>& full, const SeqBlock& blk, int64_t b,
                          int64_t W, int64_t col0, int64_t ncols) {
  std::vector<float> out(size_t(2 * blk.len * b * ncols));
  for (int64_t u = 0; u < 2 * blk.len; ++u)
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t c = 0; c < ncols; ++c)
        out[size_t((u * b + bi) * ncols + c)] =
            full[size_t((blk.Position(u) * b + bi) * W + col0 + c)];
  return out;
}

struct Case {
  int cp;
  int64_t S, b, nh, d;
};

// The whole-sequence log-sum-exp of the scaled causal scores, in double: (b, nh, S).
std::vector<double> NaiveLse(const std::vector<float>& qkv, const Case& k) {
  const int64_t A = k.nh * k.d;
  std::vector<double> lse(size_t(k.b * k.nh * k.S));
  for (int64_t bi = 0; bi < k.b; ++bi)
    for (int64_t j = 0; j < k.nh; ++j)
      for (int64_t t = 0; t < k.S; ++t) {
        std::vector<double> sc;
        for (int64_t u = 0; u <= t; ++u) {
          double dot = 0;
          for (int64_t c = 0; c < k.d; ++c)
            dot += double(qkv[size_t((t * k.b + bi) * 3 * A + j * k.d + c)]) *
                   qkv[size_t((u * k.b + bi) * 3 * A + A + j * k.d + c)];
          sc.push_back(dot / std::sqrt(double(k.d)));
        }
        double m = -1e300, sum = 0;
        for (double x : sc) m = std::max(m, x);
        for (double x : sc) sum += std::exp(x - m);
        lse[size_t((bi * k.nh + j) * k.S + t)] = m + std::log(sum);
      }
  return lse;
}

class CpAttentionRing : public CpAttention, public ::testing::WithParamInterface<Case> {};

TEST_P(CpAttentionRing, BlocksComposeToTheWholeSequence) {
  const Case k = GetParam();
  const int64_t A = k.nh * k.d, S = k.S, b = k.b;
  const std::vector<float> qkv = RandomFloats(size_t(S * b * 3 * A), 31, -2, 2);
  const std::vector<float> dout = RandomFloats(size_t(S * b * A), 32);
  // Reference: the whole sequence on one rank.
  Tensor in = F({S, b, 3 * A}, qkv), out = F({S, b, A});
  Tensor saved = F(be.AttentionSavedShape(b, S, k.nh, k.d));
  be.AttentionForward(in, k.nh, TokenOrder::kSeqFirst, out, saved);
  Tensor g = F({S, b, A}, dout), dqkv = F({S, b, 3 * A});
  be.AttentionBackward(g, in, out, saved, k.nh, TokenOrder::kSeqFirst, dqkv);
  const std::vector<float> want_out = Host(out), want_dqkv = Host(dqkv);
  const std::vector<double> want_lse = NaiveLse(qkv, k);

  const int c = k.cp;
  std::vector<Tensor> q_local, kv_local, o_local, lse_local, dq_local, dkv_local, g_local;
  for (int r = 0; r < c; ++r) {
    const SeqBlock blk = Block(r, c, S);
    const int64_t n = 2 * blk.len;
    q_local.push_back(F({n, b, 3 * A}, Gather(qkv, blk, b, 3 * A, 0, 3 * A)));
    kv_local.push_back(F({n, b, 2 * A}));
    be.CopyColumns(q_local.back(), A, kv_local.back(), 0, 2 * A);
    o_local.push_back(F({n, b, A}));
    lse_local.push_back(F({b, k.nh, n}));
    dq_local.push_back(F({n, b, 3 * A}));
    dkv_local.push_back(F({n, b, 2 * A}));
    g_local.push_back(F({n, b, A}, Gather(dout, blk, b, A, 0, A)));
  }
  // The ring's order: step i brings rank r the block of rank (r - i) mod c.
  for (int r = 0; r < c; ++r)
    for (int i = 0; i < c; ++i) {
      const int owner = (r + c - i) % c;
      be.AttentionBlockForward(q_local[size_t(r)], Block(r, c, S), kv_local[size_t(owner)],
                               Block(owner, c, S), k.nh, i == 0, o_local[size_t(r)],
                               lse_local[size_t(r)]);
    }
  for (int r = 0; r < c; ++r)
    for (int i = 0; i < c; ++i) {
      const int owner = (r + c - i) % c;
      be.AttentionBlockBackward(g_local[size_t(r)], q_local[size_t(r)], Block(r, c, S),
                                kv_local[size_t(owner)], Block(owner, c, S), o_local[size_t(r)],
                                lse_local[size_t(r)], k.nh, dq_local[size_t(r)],
                                dkv_local[size_t(owner)]);
    }
  for (int r = 0; r < c; ++r) {
    const SeqBlock blk = Block(r, c, S);
    const std::vector<float> o = Host(o_local[size_t(r)]), lse = Host(lse_local[size_t(r)]);
    const std::vector<float> dq = Host(dq_local[size_t(r)]), dkv = Host(dkv_local[size_t(r)]);
    const std::vector<float> o_want = Gather(want_out, blk, b, A, 0, A);
    const std::vector<float> dq_want = Gather(want_dqkv, blk, b, 3 * A, 0, A);
    const std::vector<float> dkv_want = Gather(want_dqkv, blk, b, 3 * A, A, 2 * A);
    for (size_t i = 0; i < o.size(); ++i) ASSERT_NEAR(o[i], o_want[i], 2e-5) << "out " << i;
    for (int64_t u = 0; u < 2 * blk.len; ++u)
      for (int64_t bi = 0; bi < b; ++bi)
        for (int64_t j = 0; j < k.nh; ++j)
          ASSERT_NEAR(lse[size_t((bi * k.nh + j) * 2 * blk.len + u)],
                      want_lse[size_t((bi * k.nh + j) * S + blk.Position(u))], 2e-5)
              << "lse rank " << r << " row " << u;
    for (int64_t u = 0; u < 2 * blk.len; ++u)
      for (int64_t bi = 0; bi < b; ++bi)
        for (int64_t col = 0; col < A; ++col) {
          const size_t i = size_t((u * b + bi) * A + col);
          ASSERT_NEAR(dq[size_t((u * b + bi) * 3 * A + col)], dq_want[i], 5e-5) << "dq " << i;
          EXPECT_EQ(dq[size_t((u * b + bi) * 3 * A + A + col)], 0.0f) << "K/V columns untouched";
        }
    for (size_t i = 0; i < dkv.size(); ++i) ASSERT_NEAR(dkv[i], dkv_want[i], 5e-5) << "dkv " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Cp, CpAttentionRing,
                         ::testing::Values(Case{1, 8, 2, 2, 4}, Case{2, 8, 2, 2, 4},
                                           Case{4, 16, 1, 3, 4}, Case{2, 12, 3, 1, 8}));

// A block whose keys all come after the queries leaves a merged row alone, and on its own (the
// first block) gives -inf and zeros.
TEST_F(CpAttention, HiddenBlockChangesNothing) {
  const int64_t b = 1, nh = 1, A = 2;  // d = 2
  const SeqBlock q{0, 6, 1};     // query rows at positions 0 and 6
  const SeqBlock late{7, 7, 1};  // keys at position 7 only
  Tensor qkv = F({2, b, 3 * A}, RandomFloats(size_t(2 * 3 * A), 41));
  Tensor kv = F({2, b, 2 * A}, RandomFloats(size_t(2 * 2 * A), 42));
  Tensor out = F({2, b, A}), lse = F({b, nh, 2});
  be.AttentionBlockForward(qkv, q, kv, late, nh, /*first=*/true, out, lse);
  const std::vector<float> o = Host(out), l = Host(lse);
  for (float x : o) EXPECT_EQ(x, 0.0f);
  EXPECT_EQ(l[0], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(l[1], -std::numeric_limits<float>::infinity());
  const SeqBlock early{0, 1, 1};  // positions 0 and 1: row 0 (position 0) sees position 0 only
  be.AttentionBlockForward(qkv, q, kv, early, nh, /*first=*/false, out, lse);
  const std::vector<float> o2 = Host(out), l2 = Host(lse);
  EXPECT_TRUE(std::isfinite(l2[0]) && std::isfinite(l2[1]));
  const std::vector<float> kvh = Host(kv);
  EXPECT_FLOAT_EQ(o2[0], kvh[2]);  // one visible key: its V
  EXPECT_FLOAT_EQ(o2[1], kvh[3]);
  be.AttentionBlockForward(qkv, q, kv, late, nh, /*first=*/false, out, lse);
  EXPECT_EQ(Host(out), o2);
  EXPECT_EQ(Host(lse), l2);
}

TEST_F(CpAttention, CopyColumnsMovesOnlyTheNamedColumns) {
  Tensor src = F({2, 3, 4}, RandomFloats(24, 51));
  std::vector<float> before = RandomFloats(30, 52);
  Tensor dst = F({6, 5}, before);
  be.CopyColumns(src, 1, dst, 2, 3);
  const std::vector<float> s = Host(src), d = Host(dst);
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t c = 0; c < 5; ++c) {
      const float want = (c >= 2) ? s[size_t(r * 4 + 1 + (c - 2))] : before[size_t(r * 5 + c)];
      EXPECT_EQ(d[size_t(r * 5 + c)], want) << r << "," << c;
    }
}

}  // namespace
}  // namespace ptdp::rt
