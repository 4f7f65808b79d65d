// bf16 mixed precision, emulated (runtime/bf16.h, runtime/bf16_backend.h, TrainerConfig::bf16):
// the rounding itself against hand-made cases (ties to even, carries, Inf, NaN, -0.0), and the
// trainer under it: weights are bf16 values of fp32 main weights, the run departs from the fp32
// run by bf16-sized amounts, layouts agree within bf16 tolerance, checkpoints keep the main
// weights and resume bit-exactly, jobs split over Trainers match one Trainer bit for bit.
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

TEST(Bf16Round, TheCpuBackendRoundsEveryElementToTheNearest) {
  CpuBackend be;
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.0f, 3.0f);
  std::vector<float> x(4097);
  for (float& v : x) v = n(rng);
  auto t = be.Alloc({int64_t(x.size())}, DType::kF32);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(be.CopyFromHost(x.data(), *t).ok());
  be.RoundToBf16(*t);
  std::vector<float> y(x.size());
  ASSERT_TRUE(be.CopyToHost(*t, y.data()).ok());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(Bits(y[i]) & 0xffffu, 0u) << x[i];
    // Nearest: within half a bf16 step of x (2^-8 relative, a step being 2^-7 of the exponent).
    EXPECT_LE(std::fabs(y[i] - x[i]), std::ldexp(std::fabs(x[i]), -8)) << x[i];
    EXPECT_EQ(y[i], Bf16Round(x[i]));
  }
}

constexpr double kTimeoutS = 30.0;
using Spec = testing::TinyLayoutSpec;

TrainerConfig Config(const Spec& s, bool bf16) {
  TrainerConfig c;
  c.model = testing::TinyGpt(4);
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

}  // namespace
}  // namespace ptdp::rt
