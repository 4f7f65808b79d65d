// The CPU backend, op by op: hand-checked numbers where the numbers are small, naive references
// written here otherwise, every backward against central finite differences, the vocab-parallel
// pieces over 2 shards against 1 shard, AdamW against its formula, and the memory accounting;
// every test on every kernel level this CPU runs (runtime/cpu/cpu_kernels.h).
//
// Finite differences: L = sum(out * R) (R fixed random weights, summed in double) at x +- eps
// with eps = 1e-3 in fp32; |fd - analytic| <= 3e-4 + 1e-3 |analytic|. The fp32 forward's
// rounding (~1e-6 on L) divided by 2 eps dominates the error, hence the absolute term.
#include "runtime/cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "tests/fakes/random_floats.h"

namespace ptdp::rt {
namespace {

constexpr double kFdEps = 1e-3;
constexpr double kFdAbsTol = 3e-4;
constexpr double kFdRelTol = 1e-3;

using testing::RandomFloats;

// Options with a capacity and a cache of `cache_bytes` (0: none), the rest the defaults.
CpuBackendOptions Memory(size_t capacity_bytes, size_t cache_bytes) {
  CpuBackendOptions o;
  o.capacity_bytes = capacity_bytes;
  o.cache_bytes = cache_bytes;
  return o;
}

class CpuBackendTest : public ::testing::TestWithParam<CpuKernelLevel> {
 protected:
  CpuBackendOptions Options() {
    CpuBackendOptions o;
    o.kernels = &KernelsFor(GetParam());
    return o;
  }
  Tensor F(const Shape& shape, const std::vector<float>& values = {}) {
    Result<Tensor> t = be.Alloc(shape, DType::kF32);
    EXPECT_TRUE(t.ok()) << t.status().message();
    if (!values.empty()) {
      EXPECT_EQ(int64_t(values.size()), t->numel());
      EXPECT_TRUE(be.CopyFromHost(values.data(), *t).ok());
    }
    return *t;
  }
  Tensor I(const Shape& shape, const std::vector<int32_t>& values) {
    Result<Tensor> t = be.Alloc(shape, DType::kI32);
    EXPECT_TRUE(t.ok()) << t.status().message();
    EXPECT_TRUE(be.CopyFromHost(values.data(), *t).ok());
    return *t;
  }
  std::vector<float> Host(const Tensor& t) {
    std::vector<float> v(size_t(t.numel()));
    EXPECT_TRUE(be.CopyToHost(t, v.data()).ok());
    return v;
  }
  void Set(Tensor& t, const std::vector<float>& v) {
    ASSERT_TRUE(be.CopyFromHost(v.data(), t).ok());
  }
  // sum(t * r) in double: the scalar loss of the finite-difference checks.
  double Dot(const Tensor& t, const std::vector<float>& r) {
    std::vector<float> v = Host(t);
    double s = 0.0;
    for (size_t i = 0; i < v.size(); ++i) s += double(v[i]) * r[i];
    return s;
  }
  // Central differences of loss() w.r.t. each element of x (loss() reads x) against `grad`.
  static void ExpectGrad(const std::string& what, std::vector<float>& x,
                         const std::vector<float>& grad, const std::function<double()>& loss) {
    ASSERT_EQ(x.size(), grad.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const float keep = x[i];
      x[i] = float(keep + kFdEps);
      const double plus = loss();
      x[i] = float(keep - kFdEps);
      const double minus = loss();
      x[i] = keep;
      const double fd = (plus - minus) / (2 * kFdEps);
      EXPECT_NEAR(fd, grad[i], kFdAbsTol + kFdRelTol * std::fabs(grad[i]))
          << what << "[" << i << "]";
    }
  }
  static void ExpectNear(const std::vector<float>& got, const std::vector<float>& want,
                         double tol) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "at " << i;
  }

  CpuBackend be{Options()};
};

INSTANTIATE_TEST_SUITE_P(Levels, CpuBackendTest, ::testing::ValuesIn(SupportedCpuKernelLevels()),
                         [](const auto& info) { return std::string(ToString(info.param)); });

// ---- memory ---------------------------------------------------------------------------------

TEST_P(CpuBackendTest, AllocIsZeroedAndTracksCurrentAndPeak) {
  EXPECT_EQ(be.CurrentBytes(), 0u);
  {
    Tensor a = F({2, 3});  // 24 bytes
    EXPECT_EQ(Host(a), std::vector<float>(6, 0.0f));
    Tensor b = *be.Alloc(Shape{10}, DType::kI32);  // 40 bytes
    EXPECT_EQ(be.CurrentBytes(), 64u);
    Tensor view = a.View(Shape{3}, 3);  // a view costs nothing
    EXPECT_EQ(be.CurrentBytes(), 64u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u);  // 64-byte aligned
  }
  EXPECT_EQ(be.CurrentBytes(), 0u);
  EXPECT_EQ(be.PeakBytes(), 64u);  // the peak stays after the frees
  Tensor c = F({4});               // 16 bytes
  EXPECT_EQ(be.PeakBytes(), 64u);
  be.ResetPeak();
  EXPECT_EQ(be.PeakBytes(), 16u);  // reset to the current bytes
}

TEST_P(CpuBackendTest, AllocRefusesNegativeShapesAndCapacityOverflow) {
  Result<Tensor> bad = be.Alloc(Shape{2, -1}, DType::kF32);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("(2, -1)"), std::string::npos);

  CpuBackend small(Memory(100, CpuBackendOptions::kDefaultCacheBytes));
  Tensor a = *small.Alloc(Shape{20}, DType::kF32);        // 80 of 100 bytes
  Result<Tensor> b = small.Alloc(Shape{6}, DType::kF32);  // 24 more: 104 > 100
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("do not fit"), std::string::npos) << b.status().message();
  EXPECT_EQ(small.CurrentBytes(), 80u);                  // the failed request is not counted
  EXPECT_TRUE(small.Alloc(Shape{5}, DType::kF32).ok());  // exactly 100
  EXPECT_TRUE(be.Alloc(Shape{0, 4}, DType::kF32).ok());  // empty tensors are fine
}

TEST_P(CpuBackendTest, TensorMayOutliveItsBackend) {
  Tensor t;
  {
    CpuBackend local;
    t = *local.Alloc(Shape{8}, DType::kF32);
  }
  t.data_as<float>()[7] = 1.0f;
  t = Tensor();  // frees through the counters the backend shared with the buffer
}

// ---- host transfer and element-wise ---------------------------------------------------------

TEST_P(CpuBackendTest, AFreedBlockIsReusedZeroedAndCountedAgain) {
  CpuBackend be(Memory(0, 1 << 20));  // a cache whatever the build's default
  const void* first = nullptr;
  {
    Tensor a = *be.Alloc(Shape{1000}, DType::kF32);
    first = a.data();
    std::fill_n(a.data_as<float>(), 1000, 7.0f);
  }
  EXPECT_EQ(be.CurrentBytes(), 0u);
  Tensor b = *be.Alloc(Shape{250, 4}, DType::kF32);  // the same 4000 bytes: the cached block
  EXPECT_EQ(b.data(), first);
  EXPECT_EQ(be.CurrentBytes(), 4000u);
  const float* p = b.data_as<float>();
  EXPECT_TRUE(std::all_of(p, p + 1000, [](float x) { return x == 0.0f; }));
  Tensor c = *be.Alloc(Shape{1000}, DType::kF32);  // b holds the cached one: a new block
  EXPECT_NE(c.data(), first);
}

// A cached block serves a smaller request of up to half its size (MoE with ep > 1 receives a
// different number of rows every step; exact size classes faulted in fresh pages for each), is
// counted at the request's bytes, and goes back to the cache at its own size.
TEST_P(CpuBackendTest, ACachedBlockServesSmallerRequestsUpToHalfItsSize) {
  CpuBackend be(Memory(0, 1 << 20));
  const void* big = nullptr;
  { big = be.Alloc(Shape{5000}, DType::kF32)->data(); }  // 20000 bytes, a 20480-byte block
  {
    Tensor t = *be.Alloc(Shape{4096}, DType::kF32);  // 16384 bytes: the cached block
    EXPECT_EQ(t.data(), big);
    EXPECT_EQ(be.CurrentBytes(), 16384u);
    const float* p = t.data_as<float>();
    EXPECT_TRUE(std::all_of(p, p + 4096, [](float x) { return x == 0.0f; }));
  }
  EXPECT_EQ(be.CurrentBytes(), 0u);
  Tensor again = *be.Alloc(Shape{5000}, DType::kF32);  // back at its size: it fits again
  EXPECT_EQ(again.data(), big);
  again = Tensor();
  Tensor small = *be.Alloc(Shape{2000}, DType::kF32);  // 8000 bytes: under half, a new block
  EXPECT_NE(small.data(), big);
}

TEST_P(CpuBackendTest, AllocUninitPoisonsWhenAskedAndAllocStillZeroes) {
  // Poisoned: every float NaN, from a fresh block and from a cached one that held 7s; Alloc of
  // the same block afterwards is zeros again; the bytes count as Alloc's.
  CpuBackendOptions o = Memory(0, 1 << 20);
  o.poison_uninit = true;
  CpuBackend be(o);
  const void* first = nullptr;
  {
    Tensor a = *be.AllocUninit(Shape{1000}, DType::kF32);
    first = a.data();
    EXPECT_EQ(be.CurrentBytes(), 4000u);
    const float* p = a.data_as<float>();
    EXPECT_TRUE(std::all_of(p, p + 1000, [](float x) { return std::isnan(x); }));
    std::fill_n(a.data_as<float>(), 1000, 7.0f);
  }
  {
    Tensor b = *be.AllocUninit(Shape{1000}, DType::kF32);
    EXPECT_EQ(b.data(), first);
    const float* p = b.data_as<float>();
    EXPECT_TRUE(std::all_of(p, p + 1000, [](float x) { return std::isnan(x); }));
  }
  Tensor c = *be.Alloc(Shape{1000}, DType::kF32);
  EXPECT_EQ(c.data(), first);
  const float* p = c.data_as<float>();
  EXPECT_TRUE(std::all_of(p, p + 1000, [](float x) { return x == 0.0f; }));
  EXPECT_FALSE(be.AllocUninit(Shape{-1}, DType::kF32).ok());
}

TEST_P(CpuBackendTest, NoCacheAndAFullCacheFreeAtOnce) {
  // With cache_bytes 4096, one freed 4000-byte block is kept: the newest, the older one goes back
  // to malloc to make room for it; with 0 nothing is kept (and nothing leaks: the sanitizer build
  // checks).
  CpuBackend small(Memory(0, 4096));
  const void* kept = nullptr;
  {
    Tensor a = *small.Alloc(Shape{1000}, DType::kF32);
    Tensor b = *small.Alloc(Shape{1000}, DType::kF32);
    kept = a.data();
  }  // b goes first (into the cache), then a (b back to malloc to make room)
  Tensor c = *small.Alloc(Shape{1000}, DType::kF32);
  EXPECT_EQ(c.data(), kept);
  EXPECT_EQ(small.CurrentBytes(), 4000u);
  // A full cache of large blocks makes room for a small one: the 8 KiB block goes, the small
  // one is served from the cache next.
  {
    CpuBackend mixed(Memory(0, 8192));
    const void* small_block = nullptr;
    {
      Tensor big = *mixed.Alloc(Shape{2048}, DType::kF32);  // 8192 bytes: fills the cache
    }
    {
      Tensor s = *mixed.Alloc(Shape{16}, DType::kF32);  // 64 bytes: a block of its own
      small_block = s.data();
    }
    Tensor again = *mixed.Alloc(Shape{16}, DType::kF32);
    EXPECT_EQ(again.data(), small_block);
  }
  CpuBackend none(Memory(0, 0));
  for (int i = 0; i < 3; ++i) {
    Tensor t = *none.Alloc(Shape{64}, DType::kF32);
    EXPECT_EQ(none.CurrentBytes(), 256u);
  }
  EXPECT_EQ(none.CurrentBytes(), 0u);
}

TEST_P(CpuBackendTest, HostRoundTripAndCopyOfTokens) {
  Tensor tok = I({2, 2}, {1, 2, 3, 4});
  Tensor tok2 = *be.Alloc(Shape{4}, DType::kI32);
  be.Copy(tok, tok2);  // a reshaping copy
  std::vector<int32_t> out(4);
  ASSERT_TRUE(be.CopyToHost(tok2, out.data()).ok());
  EXPECT_EQ(out, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_TRUE(be.Synchronize().ok());
}

TEST_P(CpuBackendTest, ElementWiseOps) {
  Tensor a = F({3}, {1, 2, 3});
  Tensor b = F({3}, {10, 20, 30});
  Tensor c = F({3});
  be.Add(a, b, c);
  EXPECT_EQ(Host(c), (std::vector<float>{11, 22, 33}));
  be.Add(c, a, c);  // out aliases an input
  EXPECT_EQ(Host(c), (std::vector<float>{12, 24, 36}));
  be.Axpy(-2.0f, a, c);  // c - 2a
  EXPECT_EQ(Host(c), (std::vector<float>{10, 20, 30}));
  be.Scale(0.5f, c);
  EXPECT_EQ(Host(c), (std::vector<float>{5, 10, 15}));
  be.Fill(7.0f, c);
  EXPECT_EQ(Host(c), (std::vector<float>{7, 7, 7}));
  be.Copy(a, c);
  EXPECT_EQ(Host(c), (std::vector<float>{1, 2, 3}));

  Tensor acc = F({1});
  be.SumSquares(a, acc);  // 1 + 4 + 9
  EXPECT_EQ(Host(acc)[0], 14.0f);
  be.SumSquares(b, acc);  // adds 100 + 400 + 900
  EXPECT_EQ(Host(acc)[0], 1414.0f);
  Tensor sum = F({1});
  be.Sum(b, sum);
  EXPECT_EQ(Host(sum)[0], 60.0f);
}

// ---- GEMM -----------------------------------------------------------------------------------

TEST_P(CpuBackendTest, MatmulByHand) {
  // [1 2 3; 4 5 6] @ [7 8; 9 10; 11 12] = [1*7+2*9+3*11, 1*8+2*10+3*12; ...] = [58 64; 139 154]
  Tensor a = F({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = F({3, 2}, {7, 8, 9, 10, 11, 12});
  Tensor c = F({2, 2}, {NAN, NAN, NAN, NAN});  // beta = 0: c is not read
  be.Matmul(a, false, b, false, c);
  EXPECT_EQ(Host(c), (std::vector<float>{58, 64, 139, 154}));
  // c = 0.5 * a @ b + 1 * c = 1.5 * (a @ b)
  be.Matmul(a, false, b, false, c, 0.5f, 1.0f);
  EXPECT_EQ(Host(c), (std::vector<float>{87, 96, 208.5f, 231}));
  // a^T @ a^T^T: (3, 2) @ (2, 3) with both stored transposed: b^T (2, 3) @ a^T (3, 2)
  be.Matmul(b, true, a, true, c);  // = (a @ b)^T
  EXPECT_EQ(Host(c), (std::vector<float>{58, 139, 64, 154}));
}

// c[i][j] = sum_k op(a)[i][k] op(b)[k][j], the textbook triple loop.
std::vector<float> NaiveMatmul(const std::vector<float>& a, int64_t ar, int64_t ac, bool ta,
                               const std::vector<float>& b, int64_t br, int64_t bc, bool tb) {
  const int64_t m = ta ? ac : ar, k = ta ? ar : ac, p = tb ? br : bc;
  std::vector<float> c(size_t(m * p));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < p; ++j) {
      double s = 0.0;
      for (int64_t q = 0; q < k; ++q) {
        const float x = ta ? a[size_t(q * ac + i)] : a[size_t(i * ac + q)];
        const float y = tb ? b[size_t(j * bc + q)] : b[size_t(q * bc + j)];
        s += double(x) * y;
      }
      c[size_t(i * p + j)] = float(s);
    }
  }
  return c;
}

TEST_P(CpuBackendTest, MatmulAllTransposesAgainstNaive) {
  const int64_t M = 5, K = 7, P = 3;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? P : K, bc = tb ? K : P;
      std::vector<float> av = RandomFloats(size_t(M * K), 1), bv = RandomFloats(size_t(K * P), 2);
      Tensor a = F({ar, ac}, av), b = F({br, bc}, bv), c = F({M, P});
      be.Matmul(a, ta, b, tb, c);
      ExpectNear(Host(c), NaiveMatmul(av, ar, ac, ta, bv, br, bc, tb), 1e-5);
    }
  }
}

TEST_P(CpuBackendTest, MatmulReadsRank3AsRowsAndBatchedMatchesSlices) {
  // x (2, 3, 4) is 6 rows of 4: y = x @ w^T with w (5, 4).
  std::vector<float> xv = RandomFloats(24, 3), wv = RandomFloats(20, 4);
  Tensor x = F({2, 3, 4}, xv), w = F({5, 4}, wv), y = F({2, 3, 5});
  be.Matmul(x, false, w, true, y);
  ExpectNear(Host(y), NaiveMatmul(xv, 6, 4, false, wv, 5, 4, true), 1e-5);

  // Batched: L = 3 of (2, 4)^T-stored a times (2, 5) b -> (4, 5).
  std::vector<float> av = RandomFloats(3 * 2 * 4, 5), bv = RandomFloats(3 * 2 * 5, 6);
  Tensor a = F({3, 2, 4}, av), b = F({3, 2, 5}, bv), c = F({3, 4, 5});
  be.MatmulBatched(a, true, b, false, c, 2.0f);
  std::vector<float> got = Host(c);
  for (int64_t l = 0; l < 3; ++l) {
    std::vector<float> al(av.begin() + l * 8, av.begin() + l * 8 + 8);
    std::vector<float> bl(bv.begin() + l * 10, bv.begin() + l * 10 + 10);
    std::vector<float> want = NaiveMatmul(al, 2, 4, true, bl, 2, 5, false);
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(got[size_t(l * 20) + i], 2 * want[i], 1e-5);
  }
}

// The linear-layer recipe of backend.h: y = x w^T + bias; dx = dy w; dw += dy^T x; dbias += sum dy.
TEST_P(CpuBackendTest, LinearBackwardRecipeMatchesFiniteDifferences) {
  const int64_t N = 4, in = 3, out = 5;
  std::vector<float> xv = RandomFloats(size_t(N * in), 7), wv = RandomFloats(size_t(out * in), 8);
  std::vector<float> bv = RandomFloats(size_t(out), 9), r = RandomFloats(size_t(N * out), 10);
  Tensor x = F({N, in}, xv), w = F({out, in}, wv), bias = F({out}, bv), y = F({N, out});
  auto loss = [&] {
    Set(x, xv);
    Set(w, wv);
    Set(bias, bv);
    be.Matmul(x, false, w, true, y);
    be.AddBias(y, bias);
    return Dot(y, r);
  };
  Tensor dy = F({N, out}, r), dx = F({N, in}), dw = F({out, in}), db = F({out});
  be.Matmul(dy, false, w, false, dx);
  be.Matmul(dy, true, x, false, dw, 1.0f, 1.0f);
  be.BiasGrad(dy, db);
  ExpectGrad("dx", xv, Host(dx), loss);
  ExpectGrad("dw", wv, Host(dw), loss);
  ExpectGrad("dbias", bv, Host(db), loss);
}

TEST_P(CpuBackendTest, BiasByHand) {
  Tensor y = F({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor bias = F({3}, {10, 20, 30});
  be.AddBias(y, bias);
  EXPECT_EQ(Host(y), (std::vector<float>{11, 22, 33, 14, 25, 36}));
  Tensor db = F({3}, {1, 1, 1});
  be.BiasGrad(y, db);  // adds the column sums 25, 47, 69
  EXPECT_EQ(Host(db), (std::vector<float>{26, 48, 70}));
}

// ---- LayerNorm ------------------------------------------------------------------------------

TEST_P(CpuBackendTest, LayerNormByHand) {
  // [1, 2, 3]: mean 2, biased variance 2/3, so (x - 2) / sqrt(2/3 + 1e-5) = [-1.2247, 0, 1.2247].
  Tensor x = F({1, 3}, {1, 2, 3}), g = F({3}, {1, 1, 1}), b = F({3}), y = F({1, 3});
  Tensor mean = F({1}), rstd = F({1});
  be.LayerNormForward(x, g, b, 1e-5f, y, mean, rstd);
  ExpectNear(Host(y), {-1.2247357f, 0.0f, 1.2247357f}, 1e-5);
  EXPECT_FLOAT_EQ(Host(mean)[0], 2.0f);
  EXPECT_NEAR(Host(rstd)[0], 1.0 / std::sqrt(2.0 / 3.0 + 1e-5), 1e-6);
  // gamma scales, beta shifts: 2 * xhat + 1.
  Set(g, {2, 2, 2});
  Set(b, {1, 1, 1});
  be.LayerNormForward(x, g, b, 1e-5f, x, mean, rstd);  // in place
  ExpectNear(Host(x), {-1.4494714f, 1.0f, 3.4494714f}, 1e-5);
}

TEST_P(CpuBackendTest, LayerNormBackwardMatchesFiniteDifferencesAndAccumulates) {
  const int64_t N = 3, C = 5;
  std::vector<float> xv = RandomFloats(size_t(N * C), 11, -2, 2);
  std::vector<float> gv = RandomFloats(size_t(C), 12, 0.5f, 1.5f);
  std::vector<float> bv = RandomFloats(size_t(C), 13), r = RandomFloats(size_t(N * C), 14);
  Tensor x = F({N, C}, xv), g = F({C}, gv), b = F({C}, bv), y = F({N, C});
  Tensor mean = F({N}), rstd = F({N});
  auto loss = [&] {
    Set(x, xv);
    Set(g, gv);
    Set(b, bv);
    be.LayerNormForward(x, g, b, 1e-5f, y, mean, rstd);
    return Dot(y, r);
  };
  loss();
  // The grads start at 1: the backward adds to them.
  std::vector<float> ones_x(size_t(N * C), 1.0f), ones_c(size_t(C), 1.0f);
  Tensor dy = F({N, C}, r), dx = F({N, C}, ones_x), dg = F({C}, ones_c), db = F({C}, ones_c);
  be.LayerNormBackward(dy, x, g, mean, rstd, dx, dg, db);
  auto minus_one = [](std::vector<float> v) {
    for (float& e : v) e -= 1.0f;
    return v;
  };
  ExpectGrad("dx", xv, minus_one(Host(dx)), loss);
  ExpectGrad("dgamma", gv, minus_one(Host(dg)), loss);
  ExpectGrad("dbeta", bv, minus_one(Host(db)), loss);
}

// ---- GeLU -----------------------------------------------------------------------------------

TEST_P(CpuBackendTest, GeluByHand) {
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): at 1, tanh(0.7978846 * 1.044715) = 0.6823840.
  Tensor x = F({3}, {0, 1, -1}), y = F({3});
  be.GeluForward(x, y);
  ExpectNear(Host(y), {0.0f, 0.8411920f, -0.1588080f}, 1e-6);
}

TEST_P(CpuBackendTest, GeluBackwardMatchesFiniteDifferences) {
  std::vector<float> xv = RandomFloats(20, 15, -3, 3), r = RandomFloats(20, 16);
  Tensor x = F({4, 5}, xv), y = F({4, 5});
  auto loss = [&] {
    Set(x, xv);
    be.GeluForward(x, y);
    return Dot(y, r);
  };
  Tensor d = F({4, 5}, r);
  be.GeluBackward(d, x, d);  // in place: dx aliases dy
  ExpectGrad("dx", xv, Host(d), loss);
}

// ---- attention ------------------------------------------------------------------------------

// Naive causal attention on a batch-first qkv (b, s, 3 nh d) -> (b, s, nh d).
std::vector<float> NaiveAttention(const std::vector<float>& qkv, int64_t b, int64_t s, int64_t nh,
                                  int64_t d) {
  const int64_t A = nh * d;
  std::vector<float> out(size_t(b * s * A));
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t j = 0; j < nh; ++j) {
      for (int64_t t = 0; t < s; ++t) {
        const float* q = &qkv[size_t((bi * s + t) * 3 * A + j * d)];
        std::vector<double> w(size_t(t + 1));
        double mx = -1e30, sum = 0.0;
        for (int64_t u = 0; u <= t; ++u) {
          const float* k = &qkv[size_t((bi * s + u) * 3 * A + A + j * d)];
          double dot = 0.0;
          for (int64_t i = 0; i < d; ++i) dot += double(q[i]) * k[i];
          w[size_t(u)] = dot / std::sqrt(double(d));
          mx = std::max(mx, w[size_t(u)]);
        }
        for (double& e : w) sum += (e = std::exp(e - mx));
        for (int64_t i = 0; i < d; ++i) {
          double o = 0.0;
          for (int64_t u = 0; u <= t; ++u) {
            o += w[size_t(u)] / sum * qkv[size_t((bi * s + u) * 3 * A + 2 * A + j * d + i)];
          }
          out[size_t((bi * s + t) * A + j * d + i)] = float(o);
        }
      }
    }
  }
  return out;
}

// (b, s, W) <-> (s, b, W) on the host.
std::vector<float> SwapBS(const std::vector<float>& v, int64_t b, int64_t s, int64_t W) {
  std::vector<float> out(v.size());
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t t = 0; t < s; ++t) {
      for (int64_t i = 0; i < W; ++i)
        out[size_t((t * b + bi) * W + i)] = v[size_t((bi * s + t) * W + i)];
    }
  }
  return out;
}

TEST_P(CpuBackendTest, AttentionFirstPositionSeesOnlyItself) {
  // b = 1, s = 3, nh = 1, d = 2: out at t = 0 is v at t = 0 whatever q and k are.
  std::vector<float> qkv = RandomFloats(3 * 6, 17, -3, 3);
  Tensor in = F({1, 3, 6}, qkv), out = F({1, 3, 2}), saved = F(be.AttentionSavedShape(1, 3, 1, 2));
  be.AttentionForward(in, 1, TokenOrder::kBatchFirst, out, saved);
  std::vector<float> o = Host(out);
  EXPECT_FLOAT_EQ(o[0], qkv[4]);
  EXPECT_FLOAT_EQ(o[1], qkv[5]);
  // Saved probabilities: rows sum to 1, zero above the diagonal.
  std::vector<float> p = Host(saved);
  EXPECT_FLOAT_EQ(p[0], 1.0f);
  EXPECT_EQ(p[1], 0.0f);
  EXPECT_EQ(p[2], 0.0f);
  EXPECT_EQ(p[5], 0.0f);
  EXPECT_NEAR(p[3] + p[4], 1.0, 1e-6);
  EXPECT_NEAR(p[6] + p[7] + p[8], 1.0, 1e-6);
}

TEST_P(CpuBackendTest, AttentionMatchesNaiveInBothTokenOrders) {
  const int64_t b = 2, s = 5, nh = 3, d = 4, A = nh * d;
  std::vector<float> qkv = RandomFloats(size_t(b * s * 3 * A), 18, -2, 2);
  std::vector<float> want = NaiveAttention(qkv, b, s, nh, d);
  Tensor saved = F(be.AttentionSavedShape(b, s, nh, d));
  Tensor in = F({b, s, 3 * A}, qkv), out = F({b, s, A});
  be.AttentionForward(in, nh, TokenOrder::kBatchFirst, out, saved);
  ExpectNear(Host(out), want, 1e-5);
  Tensor in_sf = F({s, b, 3 * A}, SwapBS(qkv, b, s, 3 * A)), out_sf = F({s, b, A});
  be.AttentionForward(in_sf, nh, TokenOrder::kSeqFirst, out_sf, saved);
  ExpectNear(SwapBS(Host(out_sf), s, b, A), want, 1e-5);
}

TEST_P(CpuBackendTest, AttentionBackwardMatchesFiniteDifferences) {
  const int64_t b = 2, s = 3, nh = 2, d = 2, A = nh * d;
  for (TokenOrder order : {TokenOrder::kBatchFirst, TokenOrder::kSeqFirst}) {
    const Shape in_shape =
        order == TokenOrder::kBatchFirst ? Shape{b, s, 3 * A} : Shape{s, b, 3 * A};
    const Shape out_shape = order == TokenOrder::kBatchFirst ? Shape{b, s, A} : Shape{s, b, A};
    std::vector<float> qkv = RandomFloats(size_t(b * s * 3 * A), 19);
    std::vector<float> r = RandomFloats(size_t(b * s * A), 20);
    Tensor in = F(in_shape), out = F(out_shape), saved = F(be.AttentionSavedShape(b, s, nh, d));
    auto loss = [&] {
      Set(in, qkv);
      be.AttentionForward(in, nh, order, out, saved);
      return Dot(out, r);
    };
    loss();
    Tensor dout = F(out_shape, r), dqkv = F(in_shape);
    be.AttentionBackward(dout, in, out, saved, nh, order, dqkv);
    ExpectGrad(order == TokenOrder::kBatchFirst ? "dqkv (b, s)" : "dqkv (s, b)", qkv, Host(dqkv),
               loss);
  }
}

TEST_P(CpuBackendTest, AttentionIsDeterministic) {
  const int64_t b = 2, s = 16, nh = 2, d = 8, A = nh * d;
  Tensor in = F({b, s, 3 * A}, RandomFloats(size_t(b * s * 3 * A), 21));
  Tensor dout = F({b, s, A}, RandomFloats(size_t(b * s * A), 22));
  std::vector<float> first_out, first_grad;
  for (int rep = 0; rep < 2; ++rep) {
    Tensor out = F({b, s, A}), saved = F(be.AttentionSavedShape(b, s, nh, d));
    Tensor dqkv = F({b, s, 3 * A});
    be.AttentionForward(in, nh, TokenOrder::kBatchFirst, out, saved);
    be.AttentionBackward(dout, in, out, saved, nh, TokenOrder::kBatchFirst, dqkv);
    if (rep == 0) {
      first_out = Host(out);
      first_grad = Host(dqkv);
    } else {
      EXPECT_EQ(0, std::memcmp(first_out.data(), Host(out).data(), first_out.size() * 4));
      EXPECT_EQ(0, std::memcmp(first_grad.data(), Host(dqkv).data(), first_grad.size() * 4));
    }
  }
}

// ---- vocab-parallel embedding ---------------------------------------------------------------

TEST_P(CpuBackendTest, EmbeddingShardsSumToTheFullLookup) {
  // Vocabulary 4, h = 2: row v of the table is [10 v, 10 v + 1].
  Tensor table = F({4, 2}, {0, 1, 10, 11, 20, 21, 30, 31});
  Tensor tokens = I({2, 2}, {3, 0, 2, 3});
  Tensor full = F({2, 2, 2});
  be.EmbeddingForward(tokens, table, 0, full);
  EXPECT_EQ(Host(full), (std::vector<float>{30, 31, 0, 1, 20, 21, 30, 31}));
  // Two shards of 2 rows: each gives zeros for the other's tokens; the sum is the full lookup.
  Tensor lo = table.View(Shape{2, 2}, 0), hi = table.View(Shape{2, 2}, 4);
  Tensor out0 = F({2, 2, 2}), out1 = F({2, 2, 2}), sum = F({2, 2, 2});
  be.EmbeddingForward(tokens, lo, 0, out0);
  be.EmbeddingForward(tokens, hi, 2, out1);
  EXPECT_EQ(Host(out0), (std::vector<float>{0, 0, 0, 1, 0, 0, 0, 0}));
  be.Add(out0, out1, sum);
  EXPECT_EQ(Host(sum), Host(full));

  // Backward: token 3 appears twice, so row 3 gets both gradients; shard 1 holds rows 2, 3.
  Tensor dout = F({2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  Tensor dfull = F({4, 2}), d1 = F({2, 2});
  be.EmbeddingBackward(dout, tokens, 0, dfull);
  EXPECT_EQ(Host(dfull), (std::vector<float>{3, 4, 0, 0, 5, 6, 8, 10}));
  be.EmbeddingBackward(dout, tokens, 2, d1);
  EXPECT_EQ(Host(d1), (std::vector<float>{5, 6, 8, 10}));
}

TEST_P(CpuBackendTest, EmbeddingBackwardMatchesFiniteDifferences) {
  std::vector<float> wv = RandomFloats(12, 23), r = RandomFloats(5 * 3, 24);
  Tensor table = F({4, 3}, wv), tokens = I({5}, {1, 3, 1, 0, 9}), out = F({5, 3});  // 9: outside
  auto loss = [&] {
    Set(table, wv);
    be.EmbeddingForward(tokens, table, 0, out);
    return Dot(out, r);
  };
  Tensor dout = F({5, 3}, r), dtable = F({4, 3});
  be.EmbeddingBackward(dout, tokens, 0, dtable);
  ExpectGrad("dtable", wv, Host(dtable), loss);
}

// ---- vocab-parallel cross entropy -----------------------------------------------------------

// loss_n = logsumexp(logits_n) - logits_n[target_n], in double.
std::vector<double> NaiveCrossEntropy(const std::vector<float>& logits,
                                      const std::vector<int32_t>& tgt, int64_t V) {
  std::vector<double> loss(tgt.size());
  for (size_t n = 0; n < tgt.size(); ++n) {
    double mx = -1e30, sum = 0.0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, double(logits[n * size_t(V) + size_t(v)]));
    for (int64_t v = 0; v < V; ++v) sum += std::exp(logits[n * size_t(V) + size_t(v)] - mx);
    loss[n] = std::log(sum) + mx - logits[n * size_t(V) + size_t(tgt[n])];
  }
  return loss;
}

TEST_P(CpuBackendTest, CrossEntropyByHand) {
  // Logits [0, 0] with target 1: loss = log 2; gradient (softmax - onehot) = [0.5, -0.5].
  Tensor logits = F({1, 2}), tgt = I({1}, {1});
  Tensor mx = F({1}), se = F({1}), z = F({1}), loss = F({1}), dl = F({1, 2});
  be.CrossEntropyMax(logits, mx);
  be.CrossEntropySumExp(logits, mx, se);
  be.CrossEntropyTarget(logits, tgt, 0, z);
  be.CrossEntropyLoss(mx, se, z, loss);
  EXPECT_FLOAT_EQ(Host(loss)[0], std::log(2.0f));
  be.CrossEntropyBackward(logits, tgt, 0, mx, se, 1.0f, dl);
  EXPECT_EQ(Host(dl), (std::vector<float>{0.5f, -0.5f}));
}

// One shard of V = 6 against two shards of 3, combined by hand the way the communicator will:
// MAX of the row maxima, SUM of the sum-exps (each taken at the global max), SUM of the targets.
TEST_P(CpuBackendTest, CrossEntropyOverTwoShardsEqualsOneShard) {
  const int64_t N = 4, V = 6, Vl = 3;
  std::vector<float> lv = RandomFloats(size_t(N * V), 25, -4, 4);
  std::vector<int32_t> tv = {0, 5, 2, 3};  // targets in both shards
  const float scale = 1.0f / float(N);
  Tensor logits = F({N, V}, lv), tgt = I({N}, tv);
  Tensor mx = F({N}), se = F({N}), z = F({N}), loss = F({N}), dl = F({N, V});
  be.CrossEntropyMax(logits, mx);
  be.CrossEntropySumExp(logits, mx, se);
  be.CrossEntropyTarget(logits, tgt, 0, z);
  be.CrossEntropyLoss(mx, se, z, loss);
  be.CrossEntropyBackward(logits, tgt, 0, mx, se, scale, dl);
  std::vector<double> want = NaiveCrossEntropy(lv, tv, V);
  std::vector<float> full_loss = Host(loss), full_grad = Host(dl);
  for (int64_t n = 0; n < N; ++n) EXPECT_NEAR(full_loss[size_t(n)], want[size_t(n)], 1e-5);

  // The shards: columns [0, 3) and [3, 6) of each row, as two (N, 3) tensors.
  std::vector<Tensor> shard(2), smx(2), sse(2), sz(2);
  for (int r = 0; r < 2; ++r) {
    std::vector<float> part;
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t v = 0; v < Vl; ++v) part.push_back(lv[size_t(n * V + r * Vl + v)]);
    }
    shard[size_t(r)] = F({N, Vl}, part);
    smx[size_t(r)] = F({N});
    sse[size_t(r)] = F({N});
    sz[size_t(r)] = F({N});
    be.CrossEntropyMax(shard[size_t(r)], smx[size_t(r)]);
  }
  Tensor gmx = F({N}), gse = F({N}), gz = F({N}), gloss = F({N});
  std::vector<float> m0 = Host(smx[0]), m1 = Host(smx[1]);
  std::vector<float> m(m0.size());
  for (size_t n = 0; n < size_t(N); ++n) m[n] = std::max(m0[n], m1[n]);  // all-reduce MAX
  Set(gmx, m);
  for (int r = 0; r < 2; ++r) {
    be.CrossEntropySumExp(shard[size_t(r)], gmx, sse[size_t(r)]);
    be.CrossEntropyTarget(shard[size_t(r)], tgt, r * Vl, sz[size_t(r)]);
  }
  be.Add(sse[0], sse[1], gse);  // all-reduce SUM
  be.Add(sz[0], sz[1], gz);     // all-reduce SUM
  be.CrossEntropyLoss(gmx, gse, gz, gloss);
  ExpectNear(Host(gloss), full_loss, 1e-6);
  for (int r = 0; r < 2; ++r) {
    Tensor& sl = shard[size_t(r)];
    be.CrossEntropyBackward(sl, tgt, r * Vl, gmx, gse, scale, sl);  // in place
    std::vector<float> g = Host(sl);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t v = 0; v < Vl; ++v) {
        EXPECT_NEAR(g[size_t(n * Vl + v)], full_grad[size_t(n * V + r * Vl + v)], 1e-7);
      }
    }
  }
}

TEST_P(CpuBackendTest, CrossEntropyBackwardMatchesFiniteDifferences) {
  const int64_t N = 3, V = 5;
  std::vector<float> lv = RandomFloats(size_t(N * V), 26, -2, 2);
  Tensor logits = F({N, V}), tgt = I({N}, {4, 0, 2});
  Tensor mx = F({N}), se = F({N}), z = F({N}), loss = F({N}), total = F({1});
  auto mean_loss = [&] {
    Set(logits, lv);
    be.CrossEntropyMax(logits, mx);
    be.CrossEntropySumExp(logits, mx, se);
    be.CrossEntropyTarget(logits, tgt, 0, z);
    be.CrossEntropyLoss(mx, se, z, loss);
    be.Fill(0.0f, total);
    be.Sum(loss, total);
    return double(Host(total)[0]) / double(N);
  };
  mean_loss();
  Tensor dl = F({N, V});
  be.CrossEntropyBackward(logits, tgt, 0, mx, se, 1.0f / float(N), dl);
  ExpectGrad("dlogits", lv, Host(dl), mean_loss);
}

// ---- AdamW ----------------------------------------------------------------------------------

TEST_P(CpuBackendTest, AdamWFirstStepByHand) {
  // Step 1: m_hat = g and v_hat = g^2, so the update is lr * (g / (|g| + eps) + wd * p):
  // p = 1, g = 0.5, lr = 0.1, wd = 0.1: 1 - 0.1 * (1 + 0.1) = 0.89 (eps 1e-8 is invisible).
  Tensor p = F({1}, {1.0f}), g = F({1}, {0.5f}), m = F({1}), v = F({1});
  AdamWConfig cfg{.lr = 0.1f,
                  .beta1 = 0.9f,
                  .beta2 = 0.95f,
                  .eps = 1e-8f,
                  .weight_decay = 0.1f,
                  .grad_scale = 1.0f,
                  .step = 1};
  be.AdamW(p, g, m, v, cfg);
  EXPECT_FLOAT_EQ(Host(p)[0], 0.89f);
  EXPECT_FLOAT_EQ(Host(m)[0], 0.05f);    // (1 - 0.9) * 0.5
  EXPECT_FLOAT_EQ(Host(v)[0], 0.0125f);  // (1 - 0.95) * 0.25
}

TEST_P(CpuBackendTest, AdamWTwoStepsAgainstTheFormula) {
  const size_t n = 6;
  std::vector<float> pv = RandomFloats(n, 27), g1 = RandomFloats(n, 28), g2 = RandomFloats(n, 29);
  AdamWConfig cfg{.lr = 0.01f,
                  .beta1 = 0.9f,
                  .beta2 = 0.95f,
                  .eps = 1e-8f,
                  .weight_decay = 0.1f,
                  .grad_scale = 0.5f,
                  .step = 1};
  Tensor p = F({2, 3}, pv), g = F({2, 3}, g1), m = F({2, 3}), v = F({2, 3});
  be.AdamW(p, g, m, v, cfg);
  Set(g, g2);
  cfg.step = 2;
  be.AdamW(p, g, m, v, cfg);
  // The reference in double.
  std::vector<double> rp(pv.begin(), pv.end()), rm(n, 0.0), rv(n, 0.0);
  for (int step = 1; step <= 2; ++step) {
    const std::vector<float>& gs = step == 1 ? g1 : g2;
    for (size_t i = 0; i < n; ++i) {
      const double gi = 0.5 * gs[i];
      rm[i] = 0.9 * rm[i] + 0.1 * gi;
      rv[i] = 0.95 * rv[i] + 0.05 * gi * gi;
      const double mh = rm[i] / (1 - std::pow(0.9, step)), vh = rv[i] / (1 - std::pow(0.95, step));
      rp[i] -= 0.01 * (mh / (std::sqrt(vh) + 1e-8) + 0.1 * rp[i]);
    }
  }
  std::vector<float> got = Host(p);
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(got[i], rp[i], 1e-6) << i;
}

}  // namespace
}  // namespace ptdp::rt
