// bf16 mixed precision (runtime/bf16.h, backend.h's dtype rules, TrainerConfig::bf16): the
// rounding itself against hand-made cases (ties to even, carries, Inf, NaN, -0.0), the CPU
// backend's bf16 tensors, and the trainer with them: weights are bf16 values of fp32 main
// weights, the run departs from the fp32 run by bf16-sized amounts, layouts agree within bf16
// tolerance, checkpoints keep the main weights and resume bit-exactly, jobs split over Trainers
// match one Trainer bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "runtime/bf16.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/thread_communicator.h"
#include "runtime/trainer.h"
#include "tests/fakes/tiny_training.h"

namespace ptdp::rt {
namespace {

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

TEST(Bf16Round, TiesToEvenCarriesAndSpecials) {
  const float ulp = std::ldexp(1.0f, -7);  // bf16's step at 1.0 (7 stored mantissa bits)
  EXPECT_EQ(Bf16Round(1.0f), 1.0f);
  EXPECT_EQ(Bf16Round(1.0f + ulp / 2), 1.0f);                 // tie, 1.0 is even
  EXPECT_EQ(Bf16Round(1.0f + 1.5f * ulp), 1.0f + 2 * ulp);    // tie, 1 + 2 ulp is even
  EXPECT_EQ(Bf16Round(1.0f + ulp / 2 + std::ldexp(1.0f, -20)), 1.0f + ulp);  // past the tie
  EXPECT_EQ(Bf16Round(1.0f + ulp / 2 - std::ldexp(1.0f, -20)), 1.0f);
  EXPECT_EQ(Bf16Round(2.0f - ulp / 4), 2.0f);                 // the carry into the exponent
  EXPECT_EQ(Bf16Round(-3.0f), -3.0f);
  EXPECT_EQ(Bits(Bf16Round(-0.0f)), Bits(-0.0f));
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(Bf16Round(inf), inf);
  EXPECT_EQ(Bf16Round(-inf), -inf);
  EXPECT_EQ(Bf16Round(std::numeric_limits<float>::max()), inf);  // past bf16's 3.3895e38
  EXPECT_EQ(Bf16Round(3.3895313892515355e38f), 3.3895313892515355e38f);  // bf16's largest
  EXPECT_TRUE(std::isnan(Bf16Round(std::numeric_limits<float>::quiet_NaN())));
  float nan_low;  // a NaN whose payload lies in the low 16 bits only: still NaN
  const uint32_t nan_bits = 0x7f800001u;
  std::memcpy(&nan_low, &nan_bits, sizeof nan_low);
  EXPECT_TRUE(std::isnan(Bf16Round(nan_low)));
  EXPECT_EQ(Bits(Bf16Round(1e-40f)) & 0xffffu, 0u);  // subnormals round too
}

TEST(Bf16Round, TheCpuBackendStoresEveryElementRoundedToTheNearest) {
  CpuBackend be;
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.0f, 3.0f);
  std::vector<float> x(4097);
  for (float& v : x) v = n(rng);
  const Shape shape{int64_t(x.size())};
  auto t = be.Alloc(shape, DType::kF32);
  auto half = be.Alloc(shape, DType::kBF16);
  auto uploaded = be.Alloc(shape, DType::kBF16);
  ASSERT_TRUE(t.ok() && half.ok() && uploaded.ok());
  EXPECT_EQ(half->bytes(), 2 * x.size());
  ASSERT_TRUE(be.CopyFromHost(x.data(), *t).ok());
  be.Copy(*t, *half);  // fp32 -> bf16 on the device
  ASSERT_TRUE(be.CopyFromHost(x.data(), *uploaded).ok());  // rounded on the way in
  std::vector<float> y(x.size()), u(x.size());
  ASSERT_TRUE(be.CopyToHost(*half, y.data()).ok());
  ASSERT_TRUE(be.CopyToHost(*uploaded, u.data()).ok());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(Bits(y[i]) & 0xffffu, 0u) << x[i];
    // Nearest: within half a bf16 step of x (2^-8 relative, a step being 2^-7 of the exponent).
    EXPECT_LE(std::fabs(y[i] - x[i]), std::ldexp(std::fabs(x[i]), -8)) << x[i];
    EXPECT_EQ(y[i], Bf16Round(x[i]));
    EXPECT_EQ(u[i], y[i]);
  }
}

// An op with bf16 tensors is its fp32 op on the widened values, each bf16 output rounded once:
// LayerNorm with a bf16 input, weights and output (fp32 statistics) against the fp32 op on the
// same (bf16-valued) inputs; a GEMM of bf16 operands into an fp32 accumulator (beta 1) keeps the
// fp32 sum unrounded.
// k standard-normal values rounded to bf16, so that fp32 and bf16 paths see the same inputs.
std::vector<float> Bf16Values(std::mt19937& rng, size_t k) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> v(k);
  for (float& x : v) x = Bf16Round(n(rng));
  return v;
}

// A tensor of `be` of dtype d and shape s holding v.
Tensor Make(CpuBackend& be, DType d, const std::vector<float>& v, Shape s) {
  Tensor t = *be.Alloc(s, d);
  EXPECT_TRUE(be.CopyFromHost(v.data(), t).ok());
  return t;
}

TEST(Bf16Ops, ComputeInFp32AndRoundOnceOnStore) {
  CpuBackend be;
  std::mt19937 rng(11);
  auto host = [&](size_t k) { return Bf16Values(rng, k); };
  const int64_t rows = 5, cols = 48;
  const std::vector<float> x = host(size_t(rows * cols)), g = host(cols), b = host(cols);
  auto make = [&](DType d, const std::vector<float>& v, Shape s) { return Make(be, d, v, s); };
  Tensor mean32 = *be.Alloc({rows}, DType::kF32), rstd32 = *be.Alloc({rows}, DType::kF32);
  Tensor mean16 = *be.Alloc({rows}, DType::kF32), rstd16 = *be.Alloc({rows}, DType::kF32);
  Tensor y32 = *be.Alloc({rows, cols}, DType::kF32), y16 = *be.Alloc({rows, cols}, DType::kBF16);
  be.LayerNormForward(make(DType::kF32, x, {rows, cols}), make(DType::kF32, g, {cols}),
                      make(DType::kF32, b, {cols}), 1e-5f, y32, mean32, rstd32);
  be.LayerNormForward(make(DType::kBF16, x, {rows, cols}), make(DType::kBF16, g, {cols}),
                      make(DType::kBF16, b, {cols}), 1e-5f, y16, mean16, rstd16);
  std::vector<float> a(size_t(rows * cols)), c(size_t(rows * cols)), m32(rows), m16(rows);
  ASSERT_TRUE(be.CopyToHost(y32, a.data()).ok());
  ASSERT_TRUE(be.CopyToHost(y16, c.data()).ok());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(c[i], Bf16Round(a[i])) << i;
  ASSERT_TRUE(be.CopyToHost(mean32, m32.data()).ok());
  ASSERT_TRUE(be.CopyToHost(mean16, m16.data()).ok());
  EXPECT_EQ(m32, m16);  // statistics stay fp32
  // dw (cols, cols) += dy^T x with bf16 dy and x, twice: an fp32 accumulator, never rounded.
  Tensor dw16 = *be.Alloc({cols, cols}, DType::kF32), dw32 = *be.Alloc({cols, cols}, DType::kF32);
  for (int i = 0; i < 2; ++i) {
    be.Matmul(make(DType::kBF16, x, {rows, cols}), true, make(DType::kBF16, x, {rows, cols}),
              false, dw16, 1.0f, 1.0f);
    be.Matmul(make(DType::kF32, x, {rows, cols}), true, make(DType::kF32, x, {rows, cols}),
              false, dw32, 1.0f, 1.0f);
  }
  std::vector<float> w16(size_t(cols * cols)), w32(size_t(cols * cols));
  ASSERT_TRUE(be.CopyToHost(dw16, w16.data()).ok());
  ASSERT_TRUE(be.CopyToHost(dw32, w32.data()).ok());
  EXPECT_EQ(w16, w32);
  int unrounded = 0;  // sums of 5 products of bf16 values need more than bf16's 8 bits
  for (float w : w16) unrounded += (Bits(w) & 0xffffu) != 0;
  EXPECT_GT(unrounded, cols * cols / 2);
}

// The linear layers' epilogue GEMMs (Backend::MatmulBias, MatmulBiasGelu; cuBLASLt's BIAS and
// GELU_AUX_BIAS epilogues on a GPU): in fp32 exactly Matmul, AddBias and GeluForward; on bf16
// tensors the fp32 sum with its bias rounded once, and the GeLU of the unrounded sum rounded
// once, not the two- and three-times-rounded sequence of the separate ops.
TEST(Bf16Ops, EpilogueGemmsRoundTheFp32SumOnce) {
  CpuBackend be;
  std::mt19937 rng(13);
  const int64_t m = 6, k = 40, p = 24;
  const std::vector<float> x = Bf16Values(rng, size_t(m * k)), w = Bf16Values(rng, size_t(p * k));
  const std::vector<float> bias = Bf16Values(rng, p);
  auto make = [&](DType d, const std::vector<float>& v, Shape s) { return Make(be, d, v, s); };
  auto read = [&](const Tensor& t) {
    std::vector<float> v(size_t(t.numel()));
    EXPECT_TRUE(be.CopyToHost(t, v.data()).ok());
    return v;
  };
  // fp32: the separate ops, bit for bit.
  Tensor x32 = make(DType::kF32, x, {m, k}), w32 = make(DType::kF32, w, {p, k});
  Tensor b32 = make(DType::kF32, bias, {p});
  Tensor sum = *be.Alloc({m, p}, DType::kF32), gelu = *be.Alloc({m, p}, DType::kF32);
  be.Matmul(x32, false, w32, true, sum);
  be.AddBias(sum, b32);
  be.GeluForward(sum, gelu);
  Tensor c32 = *be.Alloc({m, p}, DType::kF32), pre32 = *be.Alloc({m, p}, DType::kF32);
  Tensor act32 = *be.Alloc({m, p}, DType::kF32);
  be.MatmulBias(x32, false, w32, true, b32, c32);
  be.MatmulBiasGelu(x32, false, w32, true, b32, pre32, act32);
  const std::vector<float> want_sum = read(sum), want_gelu = read(gelu);
  EXPECT_EQ(read(c32), want_sum);
  EXPECT_EQ(read(pre32), want_sum);
  EXPECT_EQ(read(act32), want_gelu);
  // bf16: each output the fp32 result rounded once.
  Tensor x16 = make(DType::kBF16, x, {m, k}), w16 = make(DType::kBF16, w, {p, k});
  Tensor b16 = make(DType::kBF16, bias, {p});
  Tensor c16 = *be.Alloc({m, p}, DType::kBF16), pre16 = *be.Alloc({m, p}, DType::kBF16);
  Tensor act16 = *be.Alloc({m, p}, DType::kBF16);
  be.MatmulBias(x16, false, w16, true, b16, c16);
  be.MatmulBiasGelu(x16, false, w16, true, b16, pre16, act16);
  const std::vector<float> c = read(c16), pre = read(pre16), act = read(act16);
  int twice = 0;  // elements where rounding the product first would have given another value
  for (size_t i = 0; i < want_sum.size(); ++i) {
    EXPECT_EQ(c[i], Bf16Round(want_sum[i])) << i;
    EXPECT_EQ(pre[i], Bf16Round(want_sum[i])) << i;
    EXPECT_EQ(act[i], Bf16Round(want_gelu[i])) << i;
  }
  Tensor two = *be.Alloc({m, p}, DType::kBF16);
  be.Matmul(x16, false, w16, true, two);
  be.AddBias(two, b16);
  const std::vector<float> unfused = read(two);
  for (size_t i = 0; i < c.size(); ++i) twice += unfused[i] != c[i];
  EXPECT_GT(twice, 0);  // so the comparison above could tell the two apart
}

// FC2's dgrad through the GeLU (Backend::MatmulGeluBackward; cuBLASLt's DGELU epilogue on a
// GPU): in fp32 exactly Matmul then GeluBackward; on bf16 tensors gelu'(pre) times the fp32
// product rounded once, not the product rounded and then the gradient rounded again.
TEST(Bf16Ops, GeluBackwardEpilogueRoundsOnce) {
  CpuBackend be;
  std::mt19937 rng(14);
  const int64_t m = 6, k = 40, p = 24;
  const std::vector<float> dy = Bf16Values(rng, size_t(m * k)), w = Bf16Values(rng, size_t(k * p));
  std::vector<float> pre = Bf16Values(rng, size_t(m * p));
  for (float& v : pre) v *= 4;  // across GeLU's bend (a power of two: still bf16 values)
  auto read = [&](const Tensor& t) {
    std::vector<float> v(size_t(t.numel()));
    EXPECT_TRUE(be.CopyToHost(t, v.data()).ok());
    return v;
  };
  Tensor dy32 = Make(be, DType::kF32, dy, {m, k}), w32 = Make(be, DType::kF32, w, {k, p});
  Tensor pre32 = Make(be, DType::kF32, pre, {m, p});
  Tensor sep = *be.Alloc({m, p}, DType::kF32), fused = *be.Alloc({m, p}, DType::kF32);
  be.Matmul(dy32, false, w32, false, sep);
  be.GeluBackward(sep, pre32, sep);
  be.MatmulGeluBackward(dy32, false, w32, false, pre32, fused);
  const std::vector<float> want = read(sep);
  EXPECT_EQ(read(fused), want);
  Tensor dy16 = Make(be, DType::kBF16, dy, {m, k}), w16 = Make(be, DType::kBF16, w, {k, p});
  Tensor pre16 = Make(be, DType::kBF16, pre, {m, p});
  Tensor dx16 = *be.Alloc({m, p}, DType::kBF16), two = *be.Alloc({m, p}, DType::kBF16);
  be.MatmulGeluBackward(dy16, false, w16, false, pre16, dx16);
  const std::vector<float> dx = read(dx16);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(dx[i], Bf16Round(want[i])) << i;
  be.Matmul(dy16, false, w16, false, two);
  be.GeluBackward(two, pre16, two);
  const std::vector<float> unfused = read(two);
  int twice = 0;
  for (size_t i = 0; i < dx.size(); ++i) twice += unfused[i] != dx[i];
  EXPECT_GT(twice, 0);  // so the comparison above could tell the two apart
}

// The residual connection (Backend::AddBiasResidual, and with the next LayerNorm
// AddBiasResidualLayerNorm): fp32 exactly AddBias then Add (then LayerNormForward); bf16 the
// fp32 (x + bias) + residual rounded once, and the LayerNorm of the sum as stored.
TEST(Bf16Ops, ResidualRoundsTheFp32SumOnceAndNormalisesWhatItStored) {
  CpuBackend be;
  std::mt19937 rng(17);
  const int64_t n = 5, c = 64;
  const std::vector<float> x = Bf16Values(rng, size_t(n * c)), r = Bf16Values(rng, size_t(n * c));
  const std::vector<float> bias = Bf16Values(rng, c), g = Bf16Values(rng, c), b = Bf16Values(rng, c);
  auto read = [&](const Tensor& t) {
    std::vector<float> v(size_t(t.numel()));
    EXPECT_TRUE(be.CopyToHost(t, v.data()).ok());
    return v;
  };
  auto stats = [&]() {
    return std::pair(*be.Alloc({n}, DType::kF32), *be.Alloc({n}, DType::kF32));
  };
  // fp32: the separate ops, bit for bit.
  Tensor sep = Make(be, DType::kF32, x, {n, c}), fused = Make(be, DType::kF32, x, {n, c});
  Tensor both = Make(be, DType::kF32, x, {n, c});
  Tensor b32 = Make(be, DType::kF32, bias, {c}), r32 = Make(be, DType::kF32, r, {n, c});
  Tensor g32 = Make(be, DType::kF32, g, {c}), be32 = Make(be, DType::kF32, b, {c});
  be.AddBias(sep, b32);
  be.Add(sep, r32, sep);
  be.AddBiasResidual(fused, b32, r32);
  EXPECT_EQ(read(fused), read(sep));
  Tensor y_sep = *be.Alloc({n, c}, DType::kF32), y_both = *be.Alloc({n, c}, DType::kF32);
  auto [m_sep, s_sep] = stats();
  auto [m_both, s_both] = stats();
  be.LayerNormForward(sep, g32, be32, 1e-5f, y_sep, m_sep, s_sep);
  be.AddBiasResidualLayerNorm(both, b32, r32, g32, be32, 1e-5f, y_both, m_both, s_both);
  EXPECT_EQ(read(both), read(sep));
  EXPECT_EQ(read(y_both), read(y_sep));
  EXPECT_EQ(read(m_both), read(m_sep));
  EXPECT_EQ(read(s_both), read(s_sep));
  // bf16: the fp32 sum rounded once; the norm of the stored sum.
  const std::vector<float> sum = read(sep);
  Tensor x16 = Make(be, DType::kBF16, x, {n, c}), b16 = Make(be, DType::kBF16, bias, {c});
  Tensor r16 = Make(be, DType::kBF16, r, {n, c});
  Tensor g16 = Make(be, DType::kBF16, g, {c}), be16 = Make(be, DType::kBF16, b, {c});
  Tensor y16 = *be.Alloc({n, c}, DType::kBF16);
  auto [m16, s16] = stats();
  be.AddBiasResidualLayerNorm(x16, b16, r16, g16, be16, 1e-5f, y16, m16, s16);
  const std::vector<float> stored = read(x16);
  int twice = 0;  // elements where rounding x + bias first would have given another value
  for (size_t i = 0; i < sum.size(); ++i) {
    EXPECT_EQ(stored[i], Bf16Round(sum[i])) << i;
    twice += Bf16Round(Bf16Round(x[i] + bias[i % size_t(c)]) + r[i]) != stored[i];
  }
  EXPECT_GT(twice, 0);
  Tensor again = Make(be, DType::kBF16, stored, {n, c}), y_again = *be.Alloc({n, c}, DType::kBF16);
  auto [m_again, s_again] = stats();
  be.LayerNormForward(again, g16, be16, 1e-5f, y_again, m_again, s_again);
  EXPECT_EQ(read(y16), read(y_again));
  EXPECT_EQ(read(m16), read(m_again));
  EXPECT_EQ(read(s16), read(s_again));
}

constexpr double kTimeoutS = 30.0;
using Spec = testing::TinyLayoutSpec;

TrainerConfig Config(const Spec& s, bool bf16, const ModelSpec& model = testing::TinyGpt(4)) {
  TrainerConfig c;
  c.model = model;
  c.layout = testing::TinyLayout(s);
  c.optimizer.lr = 1e-3;
  c.train_tokens = &testing::Shakespeare().train;
  c.bf16 = bf16;
  return c;
}

struct Bf16Run {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params;
  TrainingState state;
};

Bf16Run Train(const TrainerConfig& cfg, int steps, const TrainingState* from = nullptr) {
  Bf16Run run;
  ThreadWorld world(cfg.layout.world(), kTimeoutS);
  auto tr = Trainer::Create(cfg, testing::CpuBackends(), world);
  EXPECT_TRUE(tr.ok()) << tr.status().message();
  if (!tr.ok()) return run;
  if (from) {
    EXPECT_TRUE((*tr)->ImportState(*from).ok());
  }
  for (int i = 0; i < steps; ++i) {
    auto r = (*tr)->Step();
    EXPECT_TRUE(r.ok()) << r.status().message();
    if (!r.ok()) return run;
    run.losses.push_back(r->loss);
  }
  auto p = (*tr)->GatherParameters();
  EXPECT_TRUE(p.ok());
  if (p.ok()) run.params = *p;
  auto st = (*tr)->ExportState();
  EXPECT_TRUE(st.ok());
  if (st.ok()) run.state = *st;
  return run;
}

bool AllBf16(const std::vector<float>& v) {
  for (float x : v)
    if ((Bits(x) & 0xffffu) != 0) return false;
  return true;
}

// The model's weights are bf16 values; the main weights (the checkpoint's "param/") are not;
// the run departs from the fp32 run, by bf16-sized amounts at first.
TEST(Bf16Training, WeightsAreBf16CopiesOfFp32MainWeights) {
  const Bf16Run bf = Train(Config(Spec{}, true), 3), fp = Train(Config(Spec{}, false), 3);
  ASSERT_EQ(bf.losses.size(), 3u);
  ASSERT_EQ(fp.losses.size(), 3u);
  ASSERT_FALSE(bf.params.empty());
  for (const auto& [name, v] : bf.params) EXPECT_TRUE(AllBf16(v)) << name;
  bool main_has_low_bits = false;
  for (const NamedTensor& t : bf.state.tensors)
    if (t.name.rfind("param/", 0) == 0 && !AllBf16(t.data)) main_has_low_bits = true;
  EXPECT_TRUE(main_has_low_bits) << "the checkpoint holds the rounded copies, not the main weights";
  bool differs = false;
  for (int i = 0; i < 3; ++i) {
    differs = differs || bf.losses[size_t(i)] != fp.losses[size_t(i)];
    // bf16 keeps 8 significant bits: the loss (~5.5) moves by well under a percent.
    EXPECT_NEAR(bf.losses[size_t(i)], fp.losses[size_t(i)], 0.02) << "step " << i;
    std::printf("  step %d: loss bf16 %.6f, fp32 %.6f\n", i, bf.losses[size_t(i)],
                fp.losses[size_t(i)]);
  }
  EXPECT_TRUE(differs) << "bf16 emulation changed nothing";
}

// Other layouts under bf16: the same run within bf16 tolerance (their fp32 sums differ in
// order, and an element near a rounding boundary can land one bf16 step away).
TEST(Bf16Training, LayoutsAgreeWithinBf16Tolerance) {
  const Bf16Run ref = Train(Config(Spec{}, true), 3);
  ASSERT_EQ(ref.losses.size(), 3u);
  auto spec = [](int tp, int pp, int dp, bool sp, bool dopt) {
    Spec s;
    s.tp = tp, s.pp = pp, s.dp = dp, s.sp = sp, s.dopt = dopt;
    return s;
  };
  for (const Spec& s : {spec(2, 1, 1, true, false), spec(1, 2, 1, false, false),
                        spec(1, 1, 2, false, true)}) {
    SCOPED_TRACE("tp " + std::to_string(s.tp) + " pp " + std::to_string(s.pp) + " dp " +
                 std::to_string(s.dp));
    const Bf16Run run = Train(Config(s, true), 3);
    ASSERT_EQ(run.losses.size(), 3u);
    double worst = 0;
    for (int i = 0; i < 3; ++i) {
      EXPECT_NEAR(run.losses[size_t(i)], ref.losses[size_t(i)], 2e-3);
      worst = std::max(worst, std::fabs(run.losses[size_t(i)] - ref.losses[size_t(i)]));
    }
    std::printf("  tp %d pp %d dp %d: largest loss difference to 1x1x1 under bf16 %.2e\n", s.tp,
                s.pp, s.dp, worst);
    for (const auto& [name, v] : run.params) EXPECT_TRUE(AllBf16(v)) << name;
  }
}

// Context parallelism (the ring's fp32 merges, stored in bf16 once), full recompute with TP and
// SP, and MoE with expert parallelism (bf16 all-to-alls, fp32 router logits and combine sums)
// under bf16: the 1x1x1 run of the same model within bf16 tolerance.
TEST(Bf16Training, CpRecomputeAndExpertLayoutsAgreeWithinBf16Tolerance) {
  struct Case {
    const char* name;
    ModelSpec model;
    Spec spec;
  };
  Spec cp2, full, ep2, tp2ep2;
  cp2.cp = 2;
  full.tp = 2, full.sp = true, full.recompute = Recompute::kFull;
  ep2.dp = 2, ep2.ep = 2;
  tp2ep2.tp = 2, tp2ep2.sp = true, tp2ep2.ep = 2, tp2ep2.etp = 1;
  const ModelSpec moe = testing::TinyMoe();
  const Bf16Run dense_ref = Train(Config(Spec{}, true), 3);
  const Bf16Run moe_ref = Train(Config(Spec{}, true, moe), 3);
  ASSERT_EQ(dense_ref.losses.size(), 3u);
  ASSERT_EQ(moe_ref.losses.size(), 3u);
  for (const Case& c : {Case{"cp2", testing::TinyGpt(4), cp2},
                        Case{"tp2 sp full recompute", testing::TinyGpt(4), full},
                        Case{"moe ep2", moe, ep2}, Case{"moe tp2 ep2 etp1", moe, tp2ep2}}) {
    SCOPED_TRACE(c.name);
    const Bf16Run& ref = c.model.moe() ? moe_ref : dense_ref;
    const Bf16Run run = Train(Config(c.spec, true, c.model), 3);
    ASSERT_EQ(run.losses.size(), 3u);
    double worst = 0;
    for (int i = 0; i < 3; ++i) {
      EXPECT_NEAR(run.losses[size_t(i)], ref.losses[size_t(i)], 2e-3);
      worst = std::max(worst, std::fabs(run.losses[size_t(i)] - ref.losses[size_t(i)]));
    }
    std::printf("  %s: largest loss difference to 1x1x1 under bf16 %.2e\n", c.name, worst);
    for (const auto& [name, v] : run.params) EXPECT_TRUE(AllBf16(v)) << name;
  }
}

// 2 steps + export + import (another layout: resharding the main weights) + 1 step == 3 steps,
// bit for bit in the same layout; within bf16 tolerance across layouts.
TEST(Bf16Training, CheckpointsResumeWithTheMainWeights) {
  Spec dopt;
  dopt.dp = 2, dopt.dopt = true;
  const Bf16Run whole = Train(Config(dopt, true), 3);
  const Bf16Run first = Train(Config(dopt, true), 2);
  const Bf16Run resumed = Train(Config(dopt, true), 1, &first.state);
  ASSERT_EQ(whole.losses.size(), 3u);
  ASSERT_EQ(resumed.losses.size(), 1u);
  EXPECT_EQ(resumed.losses[0], whole.losses[2]);
  ASSERT_EQ(resumed.state.tensors.size(), whole.state.tensors.size());
  for (size_t i = 0; i < whole.state.tensors.size(); ++i)
    EXPECT_EQ(std::memcmp(resumed.state.tensors[i].data.data(), whole.state.tensors[i].data.data(),
                          whole.state.tensors[i].data.size() * sizeof(float)), 0)
        << whole.state.tensors[i].name;
  const Bf16Run other = Train(Config(Spec{}, true), 1, &first.state);  // 1x1x1 from dp2 dist-opt
  ASSERT_EQ(other.losses.size(), 1u);
  EXPECT_NEAR(other.losses[0], whole.losses[2], 5e-3);
}

// Megatron's --grad-reduce-in-bf16: the gradients the optimizer reads are bf16 values (each
// micro-batch's sums rounded, the reduction in bf16), in every reduction path: DP buckets, the
// distributed optimizer's reduce-scatter, the tied embedding between pipeline stages, SP's
// TP-partial gradients, routed experts held once. With beta1 = 0.5 and no clipping, AdamW's
// first moment after one step is exactly half the gradient it read.
TrainerConfig Bf16GradConfig(const Spec& s, bool bf16_grads, const ModelSpec& model) {
  TrainerConfig c = Config(s, true, model);
  c.layout.precision = Precision::kBf16;
  c.layout.grad_reduce_in_bf16 = bf16_grads;
  c.optimizer.beta1 = 0.5;
  c.optimizer.clip_grad = 0;
  return c;
}

bool MomentsAreHalfBf16Gradients(const TrainingState& state, std::string* first_bad) {
  bool any = false;
  for (const NamedTensor& t : state.tensors) {
    if (t.name.rfind("adam_m/", 0) != 0) continue;
    any = true;
    std::vector<float> g(t.data);
    for (float& x : g) x *= 2;
    if (!AllBf16(g)) {
      *first_bad = t.name;
      return false;
    }
  }
  return any;
}

struct GradCase {
  const char* name;
  ModelSpec model;
  Spec spec;
};

std::vector<GradCase> GradCases() {
  Spec dp2, dopt, pp2, tpsp, ep2;
  dp2.dp = 2;
  dopt.dp = 2, dopt.dopt = true;
  pp2.pp = 2;
  tpsp.tp = 2, tpsp.sp = true, tpsp.dp = 2;
  ep2.dp = 2, ep2.ep = 2;
  return {{"1x1x1", testing::TinyGpt(4), Spec{}},
          {"dp2", testing::TinyGpt(4), dp2},
          {"dp2 dist-opt", testing::TinyGpt(4), dopt},
          {"pp2 (tied embedding)", testing::TinyGpt(4), pp2},
          {"tp2 sp dp2", testing::TinyGpt(4), tpsp},
          {"moe dp2 ep2 (experts held once)", testing::TinyMoe(), ep2}};
}

TEST(Bf16Training, GradReduceInBf16GivesTheOptimizerBf16Gradients) {
  for (const GradCase& c : GradCases()) {
    SCOPED_TRACE(c.name);
    std::string bad;
    const Bf16Run bf = Train(Bf16GradConfig(c.spec, true, c.model), 1);
    ASSERT_EQ(bf.losses.size(), 1u);
    EXPECT_TRUE(MomentsAreHalfBf16Gradients(bf.state, &bad)) << bad << " is not a bf16 gradient";
    // The control: fp32 gradients (Megatron's default) are not all bf16 values.
    const Bf16Run fp = Train(Bf16GradConfig(c.spec, false, c.model), 1);
    ASSERT_EQ(fp.losses.size(), 1u);
    EXPECT_FALSE(MomentsAreHalfBf16Gradients(fp.state, &bad));
  }
}

// The same run with bf16 gradients: within bf16 tolerance of fp32 gradients, in each layout.
TEST(Bf16Training, GradReduceInBf16StaysWithinBf16ToleranceOfFp32Gradients) {
  for (const GradCase& c : GradCases()) {
    SCOPED_TRACE(c.name);
    TrainerConfig bf = Config(c.spec, true, c.model), fp = bf;
    bf.layout.precision = fp.layout.precision = Precision::kBf16;
    bf.layout.grad_reduce_in_bf16 = true;
    const Bf16Run a = Train(bf, 3), b = Train(fp, 3);
    ASSERT_EQ(a.losses.size(), 3u);
    ASSERT_EQ(b.losses.size(), 3u);
    double worst = 0;
    for (int i = 0; i < 3; ++i) {
      EXPECT_NEAR(a.losses[size_t(i)], b.losses[size_t(i)], 2e-3) << "step " << i;
      worst = std::max(worst, std::fabs(a.losses[size_t(i)] - b.losses[size_t(i)]));
    }
    EXPECT_NE(a.losses[2], b.losses[2]) << "bf16 gradients changed nothing";
    std::printf("  %s: largest loss difference, bf16 against fp32 gradients %.2e\n", c.name,
                worst);
  }
}

// The micro-batches accumulate in bf16: with two micro-batches the gradient is
// round(round(G1) + G2), not the rounding of the fp32 sum round(G1 + G2) (what rounding only at
// the reduction would give). Some elements differ; the first rounding moves each by at most
// half a bf16 step of |G1|, which can exceed the sum's own step where G1 and G2 cancel, so the
// bound is on the whole: the differences add up to well under a bf16 step (2^-8) of the sum.
TEST(Bf16Training, GradReduceInBf16AccumulatesTheMicroBatchesInBf16) {
  Spec two;
  two.b = 4;  // global batch 8: two micro-batches
  const ModelSpec model = testing::TinyGpt(4);
  const Bf16Run bf = Train(Bf16GradConfig(two, true, model), 1);
  const Bf16Run fp = Train(Bf16GradConfig(two, false, model), 1);
  ASSERT_EQ(bf.state.tensors.size(), fp.state.tensors.size());
  int64_t differ = 0, total = 0;
  double diff_sum = 0, magnitude = 0;
  for (size_t i = 0; i < bf.state.tensors.size(); ++i) {
    const NamedTensor &a = bf.state.tensors[i], &b = fp.state.tensors[i];
    if (a.name.rfind("adam_m/", 0) != 0) continue;
    ASSERT_EQ(a.data.size(), b.data.size());
    for (size_t e = 0; e < a.data.size(); ++e) {
      const float accumulated = 2 * a.data[e], rounded_sum = Bf16Round(2 * b.data[e]);
      ++total;
      magnitude += std::fabs(rounded_sum);
      if (accumulated == rounded_sum) continue;
      ++differ;
      diff_sum += std::fabs(accumulated - rounded_sum);
    }
  }
  EXPECT_GT(differ, 0) << "no element shows the first micro-batch's rounding";
  EXPECT_LT(diff_sum, std::ldexp(magnitude, -8));
  std::printf("  %lld of %lld gradient elements differ from the rounded fp32 sum, by %.2e of "
              "the sum's magnitude in all\n",
              (long long)differ, (long long)total, diff_sum / magnitude);
}

// bf16 gradients need bf16 training (Megatron reads the flag under --bf16 only).
TEST(Bf16Training, GradReduceInBf16NeedsBf16Training) {
  TrainerConfig c = Bf16GradConfig(Spec{}, true, testing::TinyGpt(4));
  c.bf16 = false;
  ThreadWorld world(1, kTimeoutS);
  auto tr = Trainer::Create(c, testing::CpuBackends(), world);
  ASSERT_FALSE(tr.ok());
  EXPECT_NE(tr.status().message().find("grad_reduce_in_bf16"), std::string::npos)
      << tr.status().message();
}

}  // namespace
}  // namespace ptdp::rt
