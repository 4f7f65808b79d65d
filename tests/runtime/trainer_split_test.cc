// Multi-process training, on the CPU: two Trainers in one process share one ThreadWorld, each
// driving some of the ranks (TrainerConfig::local_ranks), each called from its own thread, as two
// processes sharing an NCCL world would be. Their step losses, grad norms, every rank's times
// count, evaluation loss and gathered parameters must equal, bit for bit, those of one Trainer
// driving every rank: the same arithmetic on the same ranks, the results exchanged through the
// communicators' WORLD group. The exported training state (checkpoints) too, and a state
// exported by one split job resumes in another split, bit for bit.
#include <gtest/gtest.h>

#include <cstring>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/thread_communicator.h"
#include "runtime/data.h"
#include "runtime/trainer.h"
#include "tests/fakes/split_job.h"
#include "tests/fakes/tiny_training.h"

namespace ptdp::rt {
namespace {

constexpr int kSteps = 3;
constexpr double kTimeoutS = 30.0;

// The trainer tests' tiny GPT (L 4, h 32, 4 heads, s 16, bytes), 8 sequences per step.
TrainerConfig Config(int tp, int pp, int dp, bool dopt = false) {
  TrainerConfig c;
  c.layout.distributed_optimizer = dopt;
  c.model = testing::TinyGpt(4);
  c.layout.tp = tp;
  c.layout.pp = pp;
  c.layout.dp = dp;
  c.layout.micro_batch = 2;
  c.layout.global_batch = 8;
  c.layout.sequence_parallel = tp > 1;
  c.layout.precision = Precision::kFp32;
  c.train_tokens = &testing::Shakespeare().train;
  return c;
}

struct JobRun {
  std::vector<StepResult> steps;
  double eval_loss = 0;
  std::map<std::string, std::vector<float>> params;
  TrainingState state;  // ExportState after the steps
};

using testing::ExpectSameState;  // tests/fakes/split_job.h

// Steps, evaluates and gathers on `trainer` (a Trainer of a job that others may share).
JobRun Drive(Trainer& trainer) {
  JobRun run;
  for (int i = 0; i < kSteps; ++i) {
    auto r = trainer.Step();
    EXPECT_TRUE(r.ok()) << r.status().message();
    if (!r.ok()) return run;
    run.steps.push_back(*r);
  }
  static const std::vector<int32_t> val = ValidationWindows(testing::Shakespeare().val, 16, 5);
  auto e = trainer.Evaluate(val, 5);
  EXPECT_TRUE(e.ok()) << e.status().message();
  if (e.ok()) run.eval_loss = *e;
  auto p = trainer.GatherParameters();
  EXPECT_TRUE(p.ok()) << p.status().message();
  if (p.ok()) run.params = *p;
  auto st = trainer.ExportState();  // a collective when the job spans several Trainers
  EXPECT_TRUE(st.ok()) << st.status().message();
  if (st.ok()) run.state = *st;
  return run;
}

// One Trainer per rank list, all over one ThreadWorld, each driven from its own thread.
std::vector<JobRun> TrainSplit(const TrainerConfig& base, const std::vector<std::vector<int>>& parts) {
  ThreadWorld world(base.layout.world(), kTimeoutS);
  std::vector<std::unique_ptr<Trainer>> trainers;
  for (const std::vector<int>& part : parts) {
    TrainerConfig cfg = base;
    cfg.local_ranks = part;
    auto t = Trainer::Create(cfg, testing::CpuBackends(), world);
    EXPECT_TRUE(t.ok()) << t.status().message();
    if (!t.ok()) return {};
    trainers.push_back(std::move(t).value());
  }
  std::vector<JobRun> runs(parts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < parts.size(); ++i)
    threads.emplace_back([&, i] { runs[i] = Drive(*trainers[i]); });
  for (std::thread& th : threads) th.join();
  return runs;
}

void ExpectIdentical(const JobRun& got, const JobRun& want, const std::string& what) {
  ASSERT_EQ(got.steps.size(), want.steps.size()) << what;
  for (size_t i = 0; i < want.steps.size(); ++i) {
    const StepResult &a = got.steps[i], &b = want.steps[i];
    EXPECT_EQ(a.loss, b.loss) << what << " step " << i;
    EXPECT_EQ(a.grad_norm, b.grad_norm) << what << " step " << i;
    ASSERT_EQ(a.ranks.size(), b.ranks.size()) << what;
    for (size_t g = 0; g < a.ranks.size(); ++g)
      EXPECT_GT(a.ranks[g].forward_s + a.ranks[g].backward_s, 0.0)
          << what << ": rank " << g << " reported no compute time";
  }
  EXPECT_EQ(got.eval_loss, want.eval_loss) << what;
  EXPECT_EQ(got.params, want.params) << what;  // bit for bit, every element
  ExpectSameState(got.state, want.state, what);
}

struct SplitCase {
  const char* name;
  int tp, pp, dp;
  std::vector<std::vector<int>> parts;  // the ranks of each Trainer
  bool dopt = false;                    // the distributed optimizer (moments in slices)
};

class TrainerSplit : public ::testing::TestWithParam<SplitCase> {};

INSTANTIATE_TEST_SUITE_P(
    Runtime, TrainerSplit,
    ::testing::Values(
        // RankGrid(tp 2, dp 1, pp 2): stage 0 = ranks 0, 1; stage 1 = ranks 2, 3.
        SplitCase{"tp2_pp2_by_stage", 2, 2, 1, {{0, 1}, {2, 3}}},
        SplitCase{"tp2_pp2_across_stages", 2, 2, 1, {{0, 3}, {1, 2}}},
        // RankGrid(tp 1, dp 2, pp 2): replica 0 = ranks 0, 2; replica 1 = ranks 1, 3.
        SplitCase{"dp2_pp2_by_stage", 1, 2, 2, {{0, 1}, {2, 3}}},
        SplitCase{"dp2_pp2_three_trainers", 1, 2, 2, {{3}, {0, 2}, {1}}},
        SplitCase{"dp2_pp2_dopt_by_replica", 1, 2, 2, {{0, 2}, {1, 3}}, true}),
    [](const ::testing::TestParamInfo<SplitCase>& i) { return std::string(i.param.name); });

TEST_P(TrainerSplit, EqualsOneTrainerDrivingEveryRankBitForBit) {
  const SplitCase& c = GetParam();
  const TrainerConfig cfg = Config(c.tp, c.pp, c.dp, c.dopt);
  const std::vector<JobRun> whole = TrainSplit(cfg, {{}});  // empty: every rank
  ASSERT_EQ(whole.size(), 1u);
  ASSERT_EQ(whole[0].steps.size(), size_t(kSteps));
  EXPECT_EQ(whole[0].params.size(), 4u * 12u + 4u);  // 12 per layer, 2 embeddings, final LN
  const std::vector<JobRun> parts = TrainSplit(cfg, c.parts);
  ASSERT_EQ(parts.size(), c.parts.size());
  for (size_t i = 0; i < parts.size(); ++i)
    ExpectIdentical(parts[i], whole[0], "trainer " + std::to_string(i));
}

// A checkpoint of a job over several processes: each Trainer of a split job exports the whole
// state (a collective); a job split another way imports it in every Trainer and continues. Its
// next step equals, bit for bit, that of one Trainer that never stopped.
TEST(TrainerSplit, ResumesAStateExportedOverSeveralTrainersBitForBit) {
  const TrainerConfig cfg = Config(1, 2, 2, /*dopt=*/true);
  auto job = [&](const std::vector<std::vector<int>>& parts,
                 const std::function<void(size_t, Trainer&)>& fn) {
    testing::SplitJob(cfg, parts, fn, kTimeoutS);
  };
  auto steps = testing::StepsOf;
  // The reference: one Trainer, 3 steps.
  std::vector<double> ref_losses;
  TrainingState ref;
  job({{}}, [&](size_t, Trainer& t) {
    steps(t, 3, &ref_losses);
    auto st = t.ExportState();
    ASSERT_TRUE(st.ok()) << st.status().message();
    ref = *st;
  });
  // Two steps split by pipeline stage, exported by both Trainers.
  std::vector<TrainingState> saved(2);
  std::vector<std::vector<double>> losses(2);
  job({{0, 1}, {2, 3}}, [&](size_t i, Trainer& t) {
    steps(t, 2, &losses[i]);
    auto st = t.ExportState();
    ASSERT_TRUE(st.ok()) << st.status().message();
    saved[i] = *st;
  });
  ExpectSameState(saved[1], saved[0], "the two Trainers' exports");
  // Resumed in a job split by DP replica (ranks 0, 2 and 1, 3) plus one more step.
  std::vector<TrainingState> resumed(2);
  std::vector<std::vector<double>> more(2);
  job({{0, 2}, {1, 3}}, [&](size_t i, Trainer& t) {
    ASSERT_TRUE(t.ImportState(saved[0]).ok());
    steps(t, 1, &more[i]);
    auto st = t.ExportState();
    ASSERT_TRUE(st.ok()) << st.status().message();
    resumed[i] = *st;
  });
  ASSERT_EQ(ref_losses.size(), 3u);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_EQ(losses[i].size(), 2u);
    EXPECT_EQ(losses[i][1], ref_losses[1]);
    ASSERT_EQ(more[i].size(), 1u);
    EXPECT_EQ(more[i][0], ref_losses[2]) << "trainer " << i;
    ExpectSameState(resumed[i], ref, "resumed trainer " + std::to_string(i));
  }
}

TEST(TrainerSplit, RefusesLocalRanksOutsideTheLayoutOrTwice) {
  ThreadWorld world(4, kTimeoutS);
  struct Case {
    std::vector<int> local;
    const char* error;
  } cases[] = {{{0, 4}, "local rank 4 is outside the layout's 4 ranks"},
               {{1, 1}, "local rank 1 is listed twice"}};
  for (const Case& k : cases) {
    TrainerConfig cfg = Config(2, 2, 1);
    cfg.local_ranks = k.local;
    auto t = Trainer::Create(cfg, testing::CpuBackends(), world);
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find(k.error), std::string::npos) << t.status().message();
  }
}

// A stop request (ptdp train: a signal) seen by one process must stop every process after the
// same step, or the others would wait in the next step's collectives. Trainer A's ranks ask to
// stop (code 15) from step 1 on, trainer B's never: both get stop 0 from step 0 and 15 from
// step 1. One Trainer whose ranks disagree within a step (its first two polls say 0, the rest
// 7) reports 7 for that step: the largest code of any rank.
TEST(TrainerSplit, EveryTrainerSeesAStopRequestedByOne) {
  const TrainerConfig base = Config(2, 2, 1);
  ThreadWorld world(base.layout.world(), kTimeoutS);
  std::atomic<int> a_code{0};
  TrainerConfig a = base, b = base;
  a.local_ranks = {0, 1};
  a.stop_requested = [&] { return a_code.load(); };
  b.local_ranks = {2, 3};
  b.stop_requested = [] { return 0; };
  auto ta = Trainer::Create(a, testing::CpuBackends(), world);
  auto tb = Trainer::Create(b, testing::CpuBackends(), world);
  ASSERT_TRUE(ta.ok() && tb.ok());
  std::vector<int> stops_a, stops_b;
  std::thread run_b([&] {
    for (int i = 0; i < 2; ++i) {
      auto r = (*tb)->Step();
      ASSERT_TRUE(r.ok()) << r.status().message();
      stops_b.push_back(r->stop);
    }
  });
  for (int i = 0; i < 2; ++i) {
    auto r = (*ta)->Step();
    ASSERT_TRUE(r.ok()) << r.status().message();
    stops_a.push_back(r->stop);
    a_code = 15;  // polled at the end of step 1, not before
  }
  run_b.join();
  EXPECT_EQ(stops_a, (std::vector<int>{0, 15}));
  EXPECT_EQ(stops_b, (std::vector<int>{0, 15}));

  ThreadWorld one_world(base.layout.world(), kTimeoutS);
  TrainerConfig c = base;
  std::atomic<int> polls{0};
  c.stop_requested = [&] { return polls++ < 2 ? 0 : 7; };
  auto t = Trainer::Create(c, testing::CpuBackends(), one_world);
  ASSERT_TRUE(t.ok()) << t.status().message();
  auto r = (*t)->Step();
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(polls.load(), 4);  // once per rank
  EXPECT_EQ(r->stop, 7);
}

}  // namespace
}  // namespace ptdp::rt
