// The layout-invariance proof of tests/runtime/trainer_test.cc repeated on CUDA: a tiny GPT
// (L 8, h 32, a 4, f 128, s 16, V 256 bytes) trains 3 steps (B 8) on one GPU, every rank a
// thread with its own CudaBackend (exact fp32 GEMMs) and stream, collectives by DeviceWorld. Each
// layout's per-step losses and grad norms must equal the 1x1x1 CUDA run's within 1e-5 relative
// (the sums run in other orders, as on the CPU), and the 1x1x1 CUDA run the CPU backend's within
// 1e-4 (cuBLAS and Eigen order their fp32 sums differently; three AdamW steps with lr 1e-3 keep
// the difference near fp32 rounding times the steps). Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/thread_communicator.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/device_world.h"
#include "runtime/data.h"
#include "runtime/trainer.h"

namespace ptdp::rt::cuda {
namespace {

constexpr int kSteps = 3;
const std::string kCorpus = std::string(PTDP_SOURCE_DIR) + "/data/tinyshakespeare/input.txt";

#define SKIP_WITHOUT_GPU()                                                      \
  do {                                                                          \
    const CudaInfo info = ProbeCuda();                                          \
    if (info.gpus_visible == 0) GTEST_SKIP() << "no CUDA GPU visible: " << info.why_none; \
  } while (0)

struct Spec {
  const char* name;
  int tp = 1, pp = 1, dp = 1, vp = 1;
  bool sp = false, dopt = false;
  ScheduleKind schedule = ScheduleKind::kOneFOneB;
};

TrainerConfig Config(const Spec& s, const std::vector<int32_t>& tokens) {
  TrainerConfig c;
  c.model.name = "tiny";
  c.model.layers = 8;
  c.model.hidden = 32;
  c.model.heads = c.model.kv_heads = 4;
  c.model.ffn_hidden = 128;
  c.model.seq_len = 16;
  c.model.vocab = 256;
  Layout& l = c.layout;
  l.tp = s.tp, l.pp = s.pp, l.dp = s.dp, l.vp = s.vp;
  l.micro_batch = 2;
  l.global_batch = 8;
  l.sequence_parallel = s.sp;
  l.distributed_optimizer = s.dopt;
  l.schedule = s.schedule;
  l.precision = Precision::kFp32;
  c.optimizer.lr = 1e-3;
  c.train_tokens = &tokens;
  return c;
}

struct Curve {
  std::vector<double> loss, grad_norm;
};

Curve Train(const TrainerConfig& c, BackendFactory backends, CommunicatorFactory& comms) {
  Curve run;
  auto t = Trainer::Create(c, std::move(backends), comms);
  EXPECT_TRUE(t.ok()) << t.status().message();
  if (!t.ok()) return run;
  for (int i = 0; i < kSteps; ++i) {
    auto s = (*t)->Step();
    EXPECT_TRUE(s.ok()) << s.status().message();
    if (!s.ok()) return run;
    run.loss.push_back(s->loss);
    run.grad_norm.push_back(s->grad_norm);
  }
  return run;
}

// Every rank on GPU 0 with its own backend and stream.
// bf16 runs (c.bf16) in the bf16 GEMM precision, so that attention runs the flash kernels.
Curve TrainOnGpu(const TrainerConfig& c) {
  const int world = c.layout.world();
  auto streams = std::make_shared<std::vector<cudaStream_t>>(size_t(world), nullptr);
  DeviceWorld comms(world, 60.0, 0, [streams](int g) { return (*streams)[size_t(g)]; });
  const GemmPrecision gemm = c.bf16 ? GemmPrecision::kBf16 : GemmPrecision::kFp32;
  return Train(c, [streams, gemm](int g) -> std::unique_ptr<Backend> {
    CudaBackendOptions o;
    o.gemm = gemm;
    auto b = CudaBackend::Create(o);
    EXPECT_TRUE(b.ok()) << b.status().message();
    if (!b.ok()) return nullptr;
    (*streams)[size_t(g)] = (*b)->stream();
    return std::move(*b);
  }, comms);
}

Curve TrainOnGpu(const Spec& s, const std::vector<int32_t>& tokens) {
  return TrainOnGpu(Config(s, tokens));
}

void ExpectClose(const Curve& a, const Curve& b, double rel, const std::string& what) {
  ASSERT_EQ(a.loss.size(), size_t(kSteps)) << what;
  ASSERT_EQ(b.loss.size(), size_t(kSteps)) << what;
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_NEAR(a.loss[size_t(i)], b.loss[size_t(i)], rel * std::fabs(b.loss[size_t(i)]))
        << what << " step " << i << " loss";
    EXPECT_NEAR(a.grad_norm[size_t(i)], b.grad_norm[size_t(i)], rel * std::fabs(b.grad_norm[size_t(i)]))
        << what << " step " << i << " grad norm";
  }
}

const std::vector<int32_t>& Tokens() {
  static const std::vector<int32_t> tokens = [] {
    auto c = LoadCorpus(kCorpus, 0.1, 17);
    EXPECT_TRUE(c.ok()) << c.status().message();
    return c.ok() ? c->train : std::vector<int32_t>{};
  }();
  return tokens;
}

TEST(CudaTrainer, SingleRankMatchesTheCpuBackend) {
  SKIP_WITHOUT_GPU();
  const Spec one{"1x1x1"};
  ThreadWorld cpu_world(1, 60.0);
  const Curve cpu = Train(Config(one, Tokens()), [](int) { return std::make_unique<CpuBackend>(); },
                        cpu_world);
  ExpectClose(TrainOnGpu(one, Tokens()), cpu, 1e-4, "cuda 1x1x1 vs cpu 1x1x1");
}

// bf16 mixed precision (TrainerConfig::bf16: bf16 activations and weights on both backends, the
// GPU's kernels on bf16 tensors, flash attention) against the CPU's: the same storage points on
// both, so the losses agree within bf16 tolerance (an element on a rounding boundary can land
// one bf16 step away after another fp32 sum order, and the flash kernels round P to bf16; on
// the CPU, layouts under bf16 agree within 2e-4, tests/runtime/bf16_test.cc). Then tp 2 with
// SP and pp 2 on one GPU (DeviceWorld, bf16 TP and pipeline exchanges) against the GPU's 1x1x1.
TEST(CudaTrainer, Bf16MatchesTheCpuAndLayoutsAgree) {
  SKIP_WITHOUT_GPU();
  TrainerConfig c = Config(Spec{"1x1x1"}, Tokens());
  c.bf16 = true;
  ThreadWorld cpu_world(1, 60.0);
  const Curve cpu = Train(c, [](int) { return std::make_unique<CpuBackend>(); }, cpu_world);
  const Curve gpu = TrainOnGpu(c);
  ASSERT_EQ(gpu.loss.size(), size_t(kSteps));
  ASSERT_EQ(cpu.loss.size(), size_t(kSteps));
  for (int i = 0; i < kSteps; ++i)
    EXPECT_NEAR(gpu.loss[size_t(i)], cpu.loss[size_t(i)], 2e-3) << "step " << i;
  for (const Spec& s : {Spec{"tp2_sp", 2, 1, 1, 1, true}, Spec{"pp2", 1, 2}}) {
    TrainerConfig l = Config(s, Tokens());
    l.bf16 = true;
    const Curve run = TrainOnGpu(l);
    ASSERT_EQ(run.loss.size(), size_t(kSteps)) << s.name;
    for (int i = 0; i < kSteps; ++i)
      EXPECT_NEAR(run.loss[size_t(i)], gpu.loss[size_t(i)], 2e-3) << s.name << " step " << i;
  }
}

// --grad-reduce-in-bf16 on the GPU (the bf16 mirror's copies and scale, DeviceWorld's bf16
// all-reduce, reduce-scatter and the tied embedding's all-reduce) against the CPU's run of the
// same layouts: within bf16 tolerance, as the bf16 runs above.
TEST(CudaTrainer, GradReduceInBf16MatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  for (const Spec& s : {Spec{"dp2", 1, 1, 2}, Spec{"dp2_dopt", 1, 1, 2, 1, false, true},
                        Spec{"pp2", 1, 2}}) {
    TrainerConfig c = Config(s, Tokens());
    c.bf16 = true;
    c.layout.precision = Precision::kBf16;
    c.layout.grad_reduce_in_bf16 = true;
    ThreadWorld cpu_world(c.layout.world(), 60.0);
    const Curve cpu = Train(c, [](int) { return std::make_unique<CpuBackend>(); }, cpu_world);
    const Curve gpu = TrainOnGpu(c);
    ASSERT_EQ(gpu.loss.size(), size_t(kSteps)) << s.name;
    ASSERT_EQ(cpu.loss.size(), size_t(kSteps)) << s.name;
    for (int i = 0; i < kSteps; ++i)
      EXPECT_NEAR(gpu.loss[size_t(i)], cpu.loss[size_t(i)], 2e-3) << s.name << " step " << i;
  }
}

class CudaLayouts : public ::testing::TestWithParam<Spec> {};

TEST_P(CudaLayouts, LossesEqualTheSingleRankRun) {
  SKIP_WITHOUT_GPU();
  static const Curve reference = TrainOnGpu(Spec{"1x1x1"}, Tokens());
  ExpectClose(TrainOnGpu(GetParam(), Tokens()), reference, 1e-5, GetParam().name);
}

INSTANTIATE_TEST_SUITE_P(
    OneGpu, CudaLayouts,
    ::testing::Values(Spec{"tp2_sp", 2, 1, 1, 1, true}, Spec{"pp2", 1, 2},
                      Spec{"dp2_dopt", 1, 1, 2, 1, false, true},
                      Spec{"pp4_vp2", 1, 4, 1, 2, false, false, ScheduleKind::kInterleaved},
                      Spec{"tp2_pp2_dp2", 2, 2, 2, 1, true}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace ptdp::rt::cuda
