// Trainer reliability: a run checkpointed after step 3 and resumed (through a checkpoint file)
// gives the same losses, grad norms and final state to the last bit as a run never
// interrupted; resuming into another layout continues the trajectory within fp32 tolerance and
// reshards losslessly; bad states are refused; a NaN or Inf in a gradient is caught on every
// rank (skip or stop); a rank that stops answering is reported by the others' timeouts.
// Tiny GPT (L 8, h 32, a 4, f 128, s 16, bytes), global batch 8, on the shipped corpus.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include <unistd.h>

#include "runtime/checkpoint.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/thread_communicator.h"
#include "runtime/data.h"
#include "runtime/trainer.h"
#include "tests/fakes/poison_backend.h"
#include "tests/fakes/stalling_communicator.h"
#include "tests/fakes/tiny_training.h"

namespace ptdp::rt {
namespace {

constexpr double kTimeoutS = 30.0;

using Spec = testing::TinyLayoutSpec;  // the schedule follows vp (Config)

std::string Name(const Spec& s) {
  return "tp" + std::to_string(s.tp) + "_pp" + std::to_string(s.pp) + "_dp" +
         std::to_string(s.dp) + "_vp" + std::to_string(s.vp) + (s.sp ? "_sp" : "") +
         (s.dopt ? "_dopt" : "") + (s.cp > 1 ? "_cp" + std::to_string(s.cp) : "");
}

TrainerConfig Config(const Spec& s) {
  TrainerConfig c;
  c.model = testing::TinyGpt();
  c.layout = testing::TinyLayout(s);
  c.layout.schedule = s.vp > 1 ? ScheduleKind::kInterleaved : ScheduleKind::kOneFOneB;
  c.optimizer.lr = 3e-3;
  c.optimizer.warmup_steps = 2;
  c.optimizer.decay_steps = 4;  // the schedule changes at every step of the 6
  c.train_tokens = &testing::Shakespeare().train;
  return c;
}

struct TrainRun {
  std::vector<StepResult> steps;
  TrainingState end;  // exported after the last step
};

// Trains `steps` steps, first importing `start` when given.
TrainRun Train(const TrainerConfig& cfg, int steps, const TrainingState* start = nullptr) {
  TrainRun run;
  ThreadWorld world(cfg.layout.world(), kTimeoutS);
  auto tr = Trainer::Create(cfg, testing::CpuBackends(), world);
  EXPECT_TRUE(tr.ok()) << tr.status().message();
  if (!tr.ok()) return run;
  if (start) {
    Status st = (*tr)->ImportState(*start);
    EXPECT_TRUE(st.ok()) << st.message();
    if (!st.ok()) return run;
  }
  for (int i = 0; i < steps; ++i) {
    auto r = (*tr)->Step();
    EXPECT_TRUE(r.ok()) << r.status().message();
    if (!r.ok()) return run;
    run.steps.push_back(*r);
  }
  auto st = (*tr)->ExportState();
  EXPECT_TRUE(st.ok()) << st.status().message();
  if (st.ok()) run.end = std::move(st).value();
  return run;
}

// Writes `state` as a checkpoint file and reads it back (what `ptdp train --resume` does).
TrainingState ThroughFile(const TrainerConfig& cfg, TrainingState state, const std::string& name) {
  Checkpoint c;
  c.model = cfg.model;
  c.seed = cfg.seed;
  c.global_batch = cfg.layout.global_batch;
  c.layout = cfg.layout.ShortName();
  c.state = std::move(state);
  // The process id too: ctest runs these tests at once in three processes (runtime_test and
  // its kernels_baseline / kernels_avx2 runs), which renamed each other's temporary file.
  const std::string path = ::testing::TempDir() + "/resume_" + std::to_string(::getpid()) + "_" +
                           name + ".ckpt";
  Status w = WriteCheckpoint(path, c);
  EXPECT_TRUE(w.ok()) << w.message();
  auto r = ReadCheckpoint(path);
  EXPECT_TRUE(r.ok()) << r.status().message();
  std::filesystem::remove(path);
  return r.ok() ? std::move(r->state) : TrainingState{};
}

// Every tensor of `a` equals `b`'s bit for bit.
void ExpectSameBits(const TrainingState& a, const TrainingState& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    EXPECT_EQ(a.tensors[i].name, b.tensors[i].name);
    EXPECT_EQ(a.tensors[i].shape, b.tensors[i].shape);
    ASSERT_EQ(a.tensors[i].data.size(), b.tensors[i].data.size());
    EXPECT_EQ(std::memcmp(a.tensors[i].data.data(), b.tensors[i].data.data(),
                          a.tensors[i].data.size() * sizeof(float)),
              0)
        << a.tensors[i].name;
  }
}

class Resume : public ::testing::TestWithParam<Spec> {};

INSTANTIATE_TEST_SUITE_P(
    Trainer, Resume,
    ::testing::Values(Spec{}, Spec{2, 2, 2, 1, 2, true, true}, Spec{1, 4, 2, 2, 1, false, true},
                      Spec{2, 1, 2, 1, 2, false, false},
                      Spec{2, 1, 2, 1, 2, true, true, ScheduleKind::kOneFOneB, 2},
                      Spec{1, 2, 1, 1, 2, false, false, ScheduleKind::kOneFOneB, 2}),
    [](const ::testing::TestParamInfo<Spec>& i) { return Name(i.param); });

// 6 steps in one go versus 3 steps, checkpoint file, a new trainer, 3 steps: == everywhere.
TEST_P(Resume, IsBitExact) {
  const TrainerConfig cfg = Config(GetParam());
  const TrainRun whole = Train(cfg, 6);
  const TrainRun first = Train(cfg, 3);
  ASSERT_EQ(whole.steps.size(), 6u);
  ASSERT_EQ(first.steps.size(), 3u);
  EXPECT_EQ(first.end.step, 3);
  EXPECT_EQ(first.end.optimizer_steps, 3);
  EXPECT_EQ(first.end.consumed_samples, 24);  // 3 steps x B 8
  const TrainingState saved = ThroughFile(cfg, first.end, Name(GetParam()));
  const TrainRun second = Train(cfg, 3, &saved);
  ASSERT_EQ(second.steps.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const StepResult &a = second.steps[size_t(i)], &w = whole.steps[size_t(3 + i)];
    EXPECT_EQ(a.step, w.step);
    EXPECT_EQ(a.loss, w.loss) << "step " << w.step;  // bit-exact, not a tolerance
    EXPECT_EQ(a.grad_norm, w.grad_norm) << "step " << w.step;
    EXPECT_EQ(a.lr, w.lr) << "step " << w.step;
  }
  // The steps did change things (a resume that ignored the state would not match anyway).
  EXPECT_NE(whole.steps[3].loss, whole.steps[0].loss);
  EXPECT_EQ(second.end.step, 6);
  ExpectSameBits(second.end, whole.end);
}

// Layout A for 3 steps, then layout B from A's checkpoint: B's export right after the import is
// A's state bit for bit (resharding loses nothing), and B's next 3 steps follow A's own within
// the tolerance of the layout-invariance proof (runtime/trainer_test.cc).
TEST(Reshard, ContinuesTheTrajectoryInAnotherLayout) {
  const TrainerConfig a = Config(Spec{2, 2, 1, 1, 2, true, false});
  const TrainerConfig b = Config(Spec{1, 4, 2, 2, 1, false, true});
  const TrainerConfig c = Config(Spec{4, 1, 2, 1, 2, true, true});
  const TrainerConfig d = Config(Spec{2, 1, 1, 1, 2, true, true, ScheduleKind::kOneFOneB, 4});
  const TrainRun whole = Train(a, 6);
  const TrainRun first = Train(a, 3);
  ASSERT_EQ(whole.steps.size(), 6u);
  const TrainingState saved = ThroughFile(a, first.end, "reshard");
  for (const TrainerConfig* other : {&b, &c, &d}) {
    SCOPED_TRACE(other->layout.ShortName());
    ExpectSameBits(Train(*other, 0, &saved).end, saved);
    const TrainRun second = Train(*other, 3, &saved);
    ASSERT_EQ(second.steps.size(), 3u);
    for (int i = 0; i < 3; ++i) {
      const StepResult &x = second.steps[size_t(i)], &w = whole.steps[size_t(3 + i)];
      EXPECT_NEAR(x.loss, w.loss, 1e-5 * w.loss) << "step " << w.step;
      EXPECT_NEAR(x.grad_norm, w.grad_norm, 1e-4 * w.grad_norm) << "step " << w.step;
      EXPECT_EQ(x.lr, w.lr);
    }
    // Parameters within 1e-5 + 1e-5 |x| (the invariance proof's bound at eps 1e-8).
    int bad = 0;
    for (size_t i = 0; i < whole.end.tensors.size(); ++i) {
      const NamedTensor &x = second.end.tensors[i], &w = whole.end.tensors[i];
      if (x.name.rfind("param/", 0) != 0) continue;
      for (size_t k = 0; k < w.data.size(); ++k)
        if (std::fabs(x.data[k] - w.data[k]) > 1e-5 + 1e-5 * std::fabs(w.data[k]) && bad++ < 5)
          ADD_FAILURE() << x.name << "[" << k << "]: " << x.data[k] << " vs " << w.data[k];
    }
  }
}

// MoE checkpoints: an ep 2 run resumes bit-exactly, and its checkpoint continues in other
// expert layouts (every expert back on one rank, expert TP over tp 2, ep 2 over tp 2 x dp 2
// with the distributed optimizer over expert DP) within the invariance tolerance.
TEST(Reshard, MoeResumesBitExactlyAndAcrossExpertLayouts) {
  auto moe = [](Spec s) {
    TrainerConfig c = Config(s);
    c.model = testing::TinyMoe();
    return c;
  };
  Spec ep2;
  ep2.dp = 2;
  ep2.ep = 2;
  ep2.dopt = true;
  const TrainerConfig a = moe(ep2);
  const TrainRun whole = Train(a, 6);
  const TrainRun first = Train(a, 3);
  ASSERT_EQ(whole.steps.size(), 6u);
  ASSERT_EQ(first.steps.size(), 3u);
  const TrainingState saved = ThroughFile(a, first.end, "moe");
  const TrainRun again = Train(a, 3, &saved);
  ASSERT_EQ(again.steps.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(again.steps[size_t(i)].loss, whole.steps[size_t(3 + i)].loss);
  ExpectSameBits(again.end, whole.end);
  Spec one, etp2, big;
  etp2.tp = 2, etp2.sp = true, etp2.etp = 2;
  big.tp = 2, big.dp = 2, big.sp = true, big.ep = 2, big.etp = 1, big.dopt = true;
  for (const Spec& other : {one, etp2, big}) {
    const TrainerConfig b = moe(other);
    SCOPED_TRACE(b.layout.ShortName());
    ExpectSameBits(Train(b, 0, &saved).end, saved);
    const TrainRun second = Train(b, 3, &saved);
    ASSERT_EQ(second.steps.size(), 3u);
    for (int i = 0; i < 3; ++i) {
      const StepResult &x = second.steps[size_t(i)], &w = whole.steps[size_t(3 + i)];
      EXPECT_NEAR(x.loss, w.loss, 1e-5 * w.loss) << "step " << w.step;
      EXPECT_NEAR(x.grad_norm, w.grad_norm, 1e-4 * w.grad_norm) << "step " << w.step;
    }
  }
}

TEST(ImportState, RefusesWhatDoesNotFitAndChangesNothing) {
  const TrainerConfig cfg = Config(Spec{2, 1, 1, 1, 2, false, false});
  const TrainRun base = Train(cfg, 1);
  ThreadWorld world(2, kTimeoutS);
  auto tr = Trainer::Create(cfg, testing::CpuBackends(), world);
  ASSERT_TRUE(tr.ok());
  auto before = (*tr)->ExportState();
  ASSERT_TRUE(before.ok());

  TrainingState missing = base.end;
  missing.tensors.erase(missing.tensors.begin() + 5);
  const std::string gone = base.end.tensors[5].name;
  Status st = (*tr)->ImportState(missing);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("no tensor '" + gone + "'"), std::string::npos) << st.message();

  TrainingState shape = base.end;
  shape.tensors[0].shape = {128, 64};  // embedding.word is (256, 32)
  st = (*tr)->ImportState(shape);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("'param/embedding.word' has shape (128, 64), this model needs (256, 32)"),
            std::string::npos)
      << st.message();

  TrainingState batch = base.end;
  batch.consumed_samples = 16;  // 1 step of B 16
  st = (*tr)->ImportState(batch);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("same global batch"), std::string::npos) << st.message();

  EXPECT_EQ((*tr)->steps_done(), 0);
  auto after = (*tr)->ExportState();
  ASSERT_TRUE(after.ok());
  ExpectSameBits(*after, *before);
}

// ---- non-finite gradients

struct Poisoned {
  std::vector<StepResult> steps;
  std::vector<Status> errors;  // per step, OK when it returned a result
  TrainingState end;
  int poisoned = 0;
};

// Runs `steps` steps on a layout whose rank `rank` poisons its next bias gradient with `value`
// before step `at`.
Poisoned TrainPoisoned(const TrainerConfig& cfg, int steps, int rank, int at, float value) {
  Poisoned out;
  std::vector<testing::PoisonBackend*> fakes(size_t(cfg.layout.world()), nullptr);
  BackendFactory factory = [&](int g) {
    auto* fake = new testing::PoisonBackend(std::make_unique<CpuBackend>());
    fakes[size_t(g)] = fake;
    return std::unique_ptr<Backend>(fake);
  };
  ThreadWorld world(cfg.layout.world(), kTimeoutS);
  auto tr = Trainer::Create(cfg, factory, world);
  EXPECT_TRUE(tr.ok()) << tr.status().message();
  if (!tr.ok()) return out;
  for (int i = 0; i < steps; ++i) {
    if (i == at) fakes[size_t(rank)]->Arm(value);
    auto r = (*tr)->Step();
    out.errors.push_back(r.status());
    if (r.ok()) out.steps.push_back(*r);
  }
  out.poisoned = fakes[size_t(rank)]->poisoned();
  auto st = (*tr)->ExportState();
  EXPECT_TRUE(st.ok());
  if (st.ok()) out.end = std::move(st).value();
  return out;
}

// Rank 3 of tp 2 x pp 2 x dp 2 (tp 1, dp 1, stage 0) poisons a bias gradient in step 1. With
// skip, no rank updates in step 1: the state after steps 0-2 equals the state of a clean run
// whose step 1 never happened except for the data (step 2 reads step 2's batch); the counters
// say 3 steps, 2 updates.
TEST(NonFinite, SkipLeavesEveryRankUnchanged) {
  TrainerConfig cfg = Config(Spec{2, 2, 2, 1, 2, true, true});
  cfg.on_nan = NanPolicy::kSkip;
  for (float value : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    SCOPED_TRACE(value);
    const Poisoned run = TrainPoisoned(cfg, 3, 3, 1, value);
    EXPECT_EQ(run.poisoned, 1);
    ASSERT_EQ(run.steps.size(), 3u);
    EXPECT_FALSE(run.steps[0].skipped);
    EXPECT_TRUE(run.steps[1].skipped);
    EXPECT_FALSE(std::isfinite(run.steps[1].grad_norm));
    EXPECT_FALSE(run.steps[2].skipped);
    EXPECT_TRUE(std::isfinite(run.steps[2].loss));
    EXPECT_EQ(run.end.step, 3);
    EXPECT_EQ(run.end.optimizer_steps, 2);
    // The skipped step's update never happened: step 2 used the LR of update 1, as the clean
    // run's step 1 did.
    const TrainRun clean = Train(cfg, 2);
    ASSERT_EQ(clean.steps.size(), 2u);
    EXPECT_EQ(run.steps[2].lr, clean.steps[1].lr);
    // After the skip, the parameters and moments equal the clean run's after 1 step, bit for
    // bit (moments gathered from every DP rank's slice, so rank 3's own update would show).
    const TrainRun one = Train(cfg, 1);
    const Poisoned two = TrainPoisoned(cfg, 2, 3, 1, value);
    EXPECT_EQ(two.end.step, 2);
    EXPECT_EQ(two.end.optimizer_steps, 1);
    ExpectSameBits(two.end, one.end);
  }
}

TEST(NonFinite, StopFailsBeforeAnyUpdate) {
  TrainerConfig cfg = Config(Spec{2, 2, 2, 1, 2, true, true});
  ASSERT_EQ(cfg.on_nan, NanPolicy::kStop);  // the default
  const Poisoned run = TrainPoisoned(cfg, 2, 6, 1, std::numeric_limits<float>::quiet_NaN());
  ASSERT_EQ(run.errors.size(), 2u);
  EXPECT_TRUE(run.errors[0].ok());
  ASSERT_FALSE(run.errors[1].ok());
  const std::string& msg = run.errors[1].message();
  EXPECT_NE(msg.find("step 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not finite"), std::string::npos) << msg;
  EXPECT_EQ(run.end.step, 1);
  const TrainRun one = Train(cfg, 1);
  ExpectSameBits(run.end, one.end);  // step 1 changed nothing on any rank
}

// ---- a rank that stops answering

struct StallCase {
  int rank;           // global rank that stalls
  const char* label;  // on this group
  int nth;            // in its n-th operation there
};

class Stall : public ::testing::TestWithParam<StallCase> {};

INSTANTIATE_TEST_SUITE_P(
    Trainer, Stall,
    ::testing::Values(StallCase{3, "DP", 1}, StallCase{2, "PP", 1}, StallCase{1, "TP", 3},
                      StallCase{6, "EMB", 1}),
    [](const ::testing::TestParamInfo<StallCase>& i) {
      return std::string(i.param.label) + "_rank" + std::to_string(i.param.rank);
    });

// tp 2 x pp 2 x dp 2, world timeout 0.5 s, the staller sleeps 3 s: Step() returns the first
// error in time, which names the silent rank, and the operation and group its peer waited in
// (which peer times out first depends on thread timing, so the operation is not fixed), within
// the stall: no hang.
TEST_P(Stall, OthersTimeOutNamingTheRankAndTheOperation) {
  const StallCase sc = GetParam();
  const TrainerConfig cfg = Config(Spec{2, 2, 2, 1, 2, true, true});
  ThreadWorld world(8, 0.5);
  testing::StallingWorld stalling(world, sc.rank, sc.label, sc.nth, 3.0);
  auto tr = Trainer::Create(cfg, testing::CpuBackends(), stalling);
  ASSERT_TRUE(tr.ok()) << tr.status().message();
  const auto t0 = std::chrono::steady_clock::now();
  auto r = (*tr)->Step();
  const double elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(stalling.stalls(), 1);
  ASSERT_FALSE(r.ok());
  const std::string msg = r.status().message();
  EXPECT_NE(msg.find("timed out after 0.5 s"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank " + std::to_string(sc.rank) + " never"), std::string::npos) << msg;
  EXPECT_TRUE(std::regex_search(msg, std::regex("(all-reduce|all-gather|reduce-scatter|broadcast|"
                                                "barrier|recv|send) #[0-9]+ .*on group "
                                                "\\[[0-9,]+\\] \\((TP|PP|DP|EMB)\\)")))
      << msg;
  EXPECT_LT(elapsed_s, 10.0);  // the 3 s stall plus slack: returned, did not hang
  std::printf("  after %.2f s: %s\n", elapsed_s, msg.c_str());
}

}  // namespace
}  // namespace ptdp::rt
