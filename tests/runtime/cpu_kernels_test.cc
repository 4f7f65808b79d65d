// The CPU kernels of every level this CPU runs (runtime/cpu/cpu_kernels.h): the GEMM against a
// double-precision triple loop on every layout, edge and block boundary, the triangular options,
// tanh and GeLU against std::tanh in double with stated bounds, AdamW bit for bit across levels,
// determinism, and the choice of level by PTDP_CPU_KERNELS.
#include "runtime/cpu/cpu_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tests/fakes/random_floats.h"

namespace ptdp::rt {
namespace {

constexpr double kU = 1.0 / (1 << 24);  // fp32 unit roundoff, 2^-24

using testing::RandomFloats;

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

class CpuKernelsTest : public ::testing::TestWithParam<CpuKernelLevel> {
 protected:
  const CpuKernels& k = KernelsFor(GetParam());

  // Runs the GEMM with a packing buffer full of NaNs (it must not read what it did not write).
  void Gemm(const GemmArgs& g) {
    std::vector<float> pack(k.gemm_pack_floats(g.m, g.n, g.k) + 16,
                            std::numeric_limits<float>::quiet_NaN());
    const uintptr_t at = reinterpret_cast<uintptr_t>(pack.data());
    k.gemm(g, pack.data() + (64 - at % 64) % 64 / sizeof(float));
  }
};

INSTANTIATE_TEST_SUITE_P(Levels, CpuKernelsTest, ::testing::ValuesIn(SupportedCpuKernelLevels()),
                         [](const auto& info) { return std::string(ToString(info.param)); });

// ---- GEMM -------------------------------------------------------------------------------------

// One case: C (m, n) with rows ldc = n + 3 apart (the 3 floats between rows must stay untouched),
// op(A) stored (m, k) or transposed, op(B) (k, n) or transposed.
struct GemmCase {
  int64_t m, n, k;
  bool ta, tb;
  float alpha, beta;
};

// Each element against the double triple loop, within the forward error bound of an fp32 dot
// product in any summation order (Higham, gamma_k = k u / (1 - k u) times sum |a| |b|), plus one
// rounding each of alpha's product, beta's product and their sum: tol = gamma_k |alpha| S +
// 3 u (|alpha| S + |beta c|) with S = sum_p |op(A)(i, p)| |op(B)(p, j)|.
void CheckGemm(const GemmArgs& g, const std::vector<float>& c_before, const std::vector<float>& c,
               Triangle a_tri, const std::string& what) {
  const double gamma = double(g.k) * kU / (1.0 - double(g.k) * kU);
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) {
      if (g.c_lower && j > i) continue;
      double dot = 0.0, s = 0.0;
      for (int64_t p = 0; p < g.k; ++p) {
        if ((a_tri == Triangle::kLower && p > i) || (a_tri == Triangle::kUpper && p < i)) continue;
        const double x = g.a[i * g.a_rs + p * g.a_cs], y = g.b[p * g.b_rs + j * g.b_cs];
        dot += x * y;
        s += std::fabs(x * y);
      }
      const double old = g.beta == 0.0f ? 0.0 : double(c_before[size_t(i * g.ldc + j)]);
      const double want = double(g.alpha) * dot + double(g.beta) * old;
      const double tol = gamma * std::fabs(g.alpha) * s +
                         3 * kU * (std::fabs(g.alpha) * s + std::fabs(g.beta * old)) + 1e-30;
      ASSERT_NEAR(c[size_t(i * g.ldc + j)], want, tol) << what << " at (" << i << ", " << j << ")";
    }
    for (int64_t j = g.n; j < g.ldc; ++j) {
      ASSERT_TRUE(SameBits(c[size_t(i * g.ldc + j)], c_before[size_t(i * g.ldc + j)]))
          << what << ": wrote between rows at (" << i << ", " << j << ")";
    }
  }
}

TEST_P(CpuKernelsTest, GemmMatchesTheTripleLoopOnEveryLayoutAndEdge) {
  // Sizes around the micro-tiles (6 or 12 rows, 8, 16 or 32 columns), k across the 256-deep
  // blocks, n across the 2048-wide blocks, and the shapes of the model's GEMMs.
  const GemmCase cases[] = {
      {1, 1, 1, false, false, 1.0f, 0.0f},     {5, 7, 3, false, true, 1.0f, 0.0f},
      {13, 33, 17, true, false, -0.5f, 1.0f},  {12, 32, 256, false, false, 1.0f, 0.25f},
      {25, 31, 257, true, true, 2.0f, 0.0f},   {100, 70, 600, false, true, 1.0f, 1.0f},
      {7, 2100, 9, false, false, 1.0f, 0.0f},  {64, 128, 64, true, false, 1.0f, 1.0f},
      {256, 96, 128, false, true, 1.0f, 0.0f}, {130, 33, 520, true, false, 1.0f, 1.0f},
  };
  int seed = 1;
  for (const GemmCase& t : cases) {
    std::vector<float> a = RandomFloats(size_t(t.m * t.k), seed++),
                       b = RandomFloats(size_t(t.k * t.n), seed++);
    const int64_t ldc = t.n + 3;
    std::vector<float> c = RandomFloats(size_t(t.m * ldc), seed++);
    if (t.beta == 0.0f)  // not read: NaNs must not leak into the result
      for (int64_t i = 0; i < t.m; ++i)
        for (int64_t j = 0; j < t.n; ++j) c[size_t(i * ldc + j)] = NAN;
    const std::vector<float> before = c;
    GemmArgs g;
    g.m = t.m, g.n = t.n, g.k = t.k;
    g.a = a.data(), g.a_rs = t.ta ? 1 : t.k, g.a_cs = t.ta ? t.m : 1;
    g.b = b.data(), g.b_rs = t.tb ? 1 : t.n, g.b_cs = t.tb ? t.k : 1;
    g.c = c.data(), g.ldc = ldc;
    g.alpha = t.alpha, g.beta = t.beta;
    Gemm(g);
    CheckGemm(g, before, c, Triangle::kNone,
              "m " + std::to_string(t.m) + " n " + std::to_string(t.n) + " k " +
                  std::to_string(t.k) + (t.ta ? " ta" : "") + (t.tb ? " tb" : ""));
  }
}

TEST_P(CpuKernelsTest, TriangularGemmsReadOnlyTheirHalf) {
  // The attention's products: op(A) an (s, s) matrix whose other half holds NaNs, stored plain
  // or transposed; and scores whose upper triangle is not wanted (c_lower). s crosses tiles.
  for (int64_t s : {1, 5, 13, 40, 70}) {
    for (Triangle tri : {Triangle::kLower, Triangle::kUpper}) {
      for (bool ta : {false, true}) {
        const int64_t d = 9;
        std::vector<float> a = RandomFloats(size_t(s * s), uint32_t(s)),
                           b = RandomFloats(size_t(s * d), 7);
        for (int64_t i = 0; i < s; ++i) {
          for (int64_t p = 0; p < s; ++p) {  // op(A)(i, p) outside `tri` is NaN
            const bool out = tri == Triangle::kLower ? p > i : p < i;
            if (out) a[size_t(ta ? p * s + i : i * s + p)] = NAN;
          }
        }
        std::vector<float> c(size_t(s * d), NAN);
        const std::vector<float> before = c;
        GemmArgs g;
        g.m = s, g.n = d, g.k = s;
        g.a = a.data(), g.a_rs = ta ? 1 : s, g.a_cs = ta ? s : 1;
        g.b = b.data(), g.b_rs = d, g.b_cs = 1;
        g.c = c.data(), g.ldc = d;
        g.a_tri = tri;
        Gemm(g);
        CheckGemm(g, before, c, tri, "s " + std::to_string(s) + (ta ? " ta" : ""));
      }
    }
    // Scores Q K^T, lower triangle only.
    const int64_t d = 11;
    std::vector<float> q = RandomFloats(size_t(s * d), 8), kk = RandomFloats(size_t(s * d), 9);
    std::vector<float> c(size_t(s * s), NAN);
    const std::vector<float> before = c;
    GemmArgs g;
    g.m = s, g.n = s, g.k = d;
    g.a = q.data(), g.a_rs = d, g.a_cs = 1;
    g.b = kk.data(), g.b_rs = 1, g.b_cs = d;
    g.c = c.data(), g.ldc = s;
    g.c_lower = true;
    Gemm(g);
    CheckGemm(g, before, c, Triangle::kNone, "scores s " + std::to_string(s));
  }
}

TEST_P(CpuKernelsTest, GemmWithNoKScalesOrClears) {
  std::vector<float> c = {1, 2, NAN, 4};  // (2, 2)
  GemmArgs g;
  g.m = 2, g.n = 2, g.k = 0;
  g.c = c.data(), g.ldc = 2;
  Gemm(g);  // beta 0: cleared, NaN included
  EXPECT_EQ(c, (std::vector<float>{0, 0, 0, 0}));
  c = {1, 2, 3, 4};
  g.beta = 0.5f;
  Gemm(g);
  EXPECT_EQ(c, (std::vector<float>{0.5f, 1, 1.5f, 2}));
}

TEST_P(CpuKernelsTest, GemmIsDeterministic) {
  const int64_t m = 77, n = 45, k = 300;
  std::vector<float> a = RandomFloats(size_t(m * k), 11), b = RandomFloats(size_t(k * n), 12);
  std::vector<float> c1(size_t(m * n)), c2(size_t(m * n));
  GemmArgs g;
  g.m = m, g.n = n, g.k = k;
  g.a = a.data(), g.a_rs = k, g.a_cs = 1;
  g.b = b.data(), g.b_rs = 1, g.b_cs = k;
  g.ldc = n;
  g.c = c1.data();
  Gemm(g);
  g.c = c2.data();
  Gemm(g);
  for (size_t i = 0; i < c1.size(); ++i) ASSERT_TRUE(SameBits(c1[i], c2[i])) << i;
}

// ---- tanh and GeLU ----------------------------------------------------------------------------

// Every float step of 2^-14 on [-12, 12] (393,217 points: each branch, both sides of the 0.5
// switch-over, the clamp at 10) and the specials.
std::vector<float> TanhGrid() {
  std::vector<float> x;
  for (int64_t i = -12 * 16384; i <= 12 * 16384; ++i) x.push_back(float(i) / 16384.0f);
  return x;
}

TEST_P(CpuKernelsTest, TanhIsWithinTwoUlpOfStdTanh) {
  // Bounds: 1.2e-7 absolute (2^-23, one ulp of 1) and 2.5e-7 relative (about 2 ulp at every
  // magnitude). Measured on all three levels: 8.6e-8 absolute and 1.7e-7 relative, near |x| =
  // 0.56 where 1 - 2 / (e^2x + 1) loses a bit to the subtraction.
  const std::vector<float> x = TanhGrid();
  std::vector<float> y(x.size());
  k.tanh(x.data(), y.data(), int64_t(x.size()));
  double worst_abs = 0.0, worst_rel = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = std::tanh(double(x[i]));
    const double err = std::fabs(double(y[i]) - want);
    worst_abs = std::max(worst_abs, err);
    if (want != 0.0) worst_rel = std::max(worst_rel, err / std::fabs(want));
    ASSERT_LE(std::fabs(y[i]), 1.0f) << x[i];
  }
  EXPECT_LE(worst_abs, 1.2e-7);
  EXPECT_LE(worst_rel, 2.5e-7);
  // Specials; 37 elements so that the last 37 % (4, 8 or 16) take the padded tail path.
  std::vector<float> s(37, 0.25f);
  s[0] = 0.0f, s[1] = -0.0f, s[2] = INFINITY, s[3] = -INFINITY, s[4] = NAN, s[5] = 1e-30f;
  s[6] = -1e-40f /* subnormal */, s[7] = 50.0f, s[8] = -1e30f, s[36] = NAN, s[35] = -3.0f;
  std::vector<float> t(s.size());
  k.tanh(s.data(), t.data(), int64_t(s.size()));
  EXPECT_EQ(t[0], 0.0f);
  EXPECT_EQ(t[2], 1.0f);
  EXPECT_EQ(t[3], -1.0f);
  EXPECT_TRUE(std::isnan(t[4]));
  EXPECT_EQ(t[5], 1e-30f);  // x + x^3 P(x^2): the cube underflows
  EXPECT_EQ(t[6], -1e-40f);
  EXPECT_EQ(t[7], 1.0f);
  EXPECT_EQ(t[8], -1.0f);
  EXPECT_TRUE(std::isnan(t[36]));
  EXPECT_NEAR(t[35], std::tanh(-3.0), 1.2e-7);
  EXPECT_NEAR(t[20], std::tanh(0.25), 1.2e-7 * 0.25);
}

TEST_P(CpuKernelsTest, GeluAndItsGradientAgainstDouble) {
  // GeLU: |error| <= 1e-6 on [-12, 12]. Its parts: tanh's 1.2e-7 times 0.5 |x| where tanh is not
  // saturated (|x| < 4.6, so <= 2.8e-7) and the fp32 rounding of 0.5 x (1 + t) (half an ulp of
  // gelu(x), 4.8e-7 at x = 12). Measured 4.3e-7, as the former std::tanh formula.
  // gelu': |error| <= 1.5e-6: 1 - t^2 cancels to ~1 ulp of 1 (1.2e-7), times 0.5 |x| sqrt(2/pi)
  // (1 + 0.134 x^2), about 8 near |x| = 4.9 where t^2 still differs from 1. Measured 5.6e-7.
  const std::vector<float> x = TanhGrid();
  std::vector<float> y(x.size()), dx(x.size()), ones(x.size(), 1.0f);
  k.gelu_forward(x.data(), y.data(), int64_t(x.size()));
  k.gelu_backward(ones.data(), x.data(), dx.data(), int64_t(x.size()));
  double worst_y = 0.0, worst_dx = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i], c = 0.7978845608028654, t = std::tanh(c * (v + 0.044715 * v * v * v));
    const double gelu = 0.5 * v * (1 + t);
    const double grad = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * c * (1 + 3 * 0.044715 * v * v);
    worst_y = std::max(worst_y, std::fabs(y[i] - gelu));
    worst_dx = std::max(worst_dx, std::fabs(dx[i] - grad));
  }
  EXPECT_LE(worst_y, 1e-6);
  EXPECT_LE(worst_dx, 1.5e-6);
  // dx = gelu'(x) dy, in place (dx aliases dy), on a tail-sized array.
  std::vector<float> xs = RandomFloats(37, 5, -4, 4), g = RandomFloats(37, 6), one(37, 1.0f),
                     d1(37);
  k.gelu_backward(one.data(), xs.data(), d1.data(), 37);
  std::vector<float> d2 = g;
  k.gelu_backward(d2.data(), xs.data(), d2.data(), 37);
  for (size_t i = 0; i < 37; ++i) EXPECT_FLOAT_EQ(d2[i], d1[i] * g[i]) << i;
}

// ---- AdamW ------------------------------------------------------------------------------------

TEST(CpuKernels, AdamWGivesTheSameBitsOnEveryLevel) {
  // 53 elements: whole vectors and a tail on every level; two steps with decay and clipping.
  const int64_t n = 53;
  const std::vector<float> p0 = RandomFloats(n, 21), g1 = RandomFloats(n, 22),
                           g2 = RandomFloats(n, 23, -1e-3f, 1e-3f);
  std::vector<float> want_p, want_m, want_v;
  for (CpuKernelLevel level : SupportedCpuKernelLevels()) {
    const CpuKernels& k = KernelsFor(level);
    std::vector<float> p = p0, m(n, 0.0f), v(n, 0.0f);
    k.adamw(p.data(), g1.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f,
            1.0f - 0.9f, 1.0f - 0.95f);
    k.adamw(p.data(), g2.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f,
            1.0f - 0.9f * 0.9f, 1.0f - 0.95f * 0.95f);
    if (want_p.empty()) {
      want_p = p, want_m = m, want_v = v;
      // The first level against the formula (up to the compiler's rounding of this loop).
      std::vector<float> rp = p0, rm(n, 0.0f), rv(n, 0.0f);
      const float scale[2] = {0.5f, 1.0f}, bc1[2] = {1.0f - 0.9f, 1.0f - 0.9f * 0.9f};
      const float bc2[2] = {1.0f - 0.95f, 1.0f - 0.95f * 0.95f};
      for (int s = 0; s < 2; ++s) {
        const std::vector<float>& g = s == 0 ? g1 : g2;
        for (int64_t i = 0; i < n; ++i) {
          const float gi = g[i] * scale[s];
          rm[i] = 0.9f * rm[i] + (1.0f - 0.9f) * gi;
          rv[i] = 0.95f * rv[i] + (1.0f - 0.95f) * gi * gi;
          rp[i] -= 1e-3f * ((rm[i] / bc1[s]) / (std::sqrt(rv[i] / bc2[s]) + 1e-8f) + 0.1f * rp[i]);
        }
      }
      for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(p[i], rp[i], 1e-7f) << i;
      continue;
    }
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(SameBits(p[i], want_p[i]) && SameBits(m[i], want_m[i]) &&
                  SameBits(v[i], want_v[i]))
          << k.name << " at " << i;
    }
  }
}

// ---- the choice of level ----------------------------------------------------------------------

TEST(CpuKernels, ChoiceFollowsTheVariableWhereTheCpuCan) {
  const std::vector<CpuKernelLevel> levels = SupportedCpuKernelLevels();
  ASSERT_FALSE(levels.empty());
  EXPECT_EQ(levels.front(), CpuKernelLevel::kBaseline);  // every x86-64 CPU runs it
  const CpuKernelLevel best = levels.back();
  for (CpuKernelLevel l : levels) {
    EXPECT_EQ(KernelsFor(l).level, l);
    EXPECT_STREQ(KernelsFor(l).name, ToString(l));
  }
  CpuKernelChoice unset = ChooseCpuKernels(nullptr);
  EXPECT_EQ(unset.kernels->level, best);
  EXPECT_EQ(unset.why, "the best this CPU runs");
  EXPECT_EQ(ChooseCpuKernels("auto").kernels->level, best);

  CpuKernelChoice forced = ChooseCpuKernels("baseline");
  EXPECT_EQ(forced.kernels->level, CpuKernelLevel::kBaseline);
  EXPECT_EQ(forced.why, "set by PTDP_CPU_KERNELS");

  CpuKernelChoice bogus = ChooseCpuKernels("sse9");
  EXPECT_EQ(bogus.kernels->level, best);
  EXPECT_NE(bogus.why.find("PTDP_CPU_KERNELS=sse9 is not"), std::string::npos) << bogus.why;

  CpuKernelChoice wide = ChooseCpuKernels("avx512");
  if (CpuSupports(CpuKernelLevel::kAvx512)) {
    EXPECT_EQ(wide.kernels->level, CpuKernelLevel::kAvx512);
  } else {
    EXPECT_EQ(wide.kernels->level, best);
    EXPECT_NE(wide.why.find("lacks"), std::string::npos) << wide.why;
  }
}

}  // namespace
}  // namespace ptdp::rt
