// A job split over several Trainers, as over processes: one ThreadWorld, one Trainer per rank
// list (TrainerConfig::local_ranks; an empty list: every rank), each driven from its own
// thread, as processes sharing an NCCL world would be; and the bit-for-bit comparison of their
// training states. For the multi-process tests.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/cpu/thread_communicator.h"
#include "runtime/trainer.h"
#include "tests/fakes/tiny_training.h"

namespace ptdp::testing {

// Builds the Trainers (a failure is a test failure) and runs fn(i, trainer i) on thread i.
inline void SplitJob(const rt::TrainerConfig& cfg, const std::vector<std::vector<int>>& parts,
                     const std::function<void(size_t, rt::Trainer&)>& fn,
                     double timeout_s = 30.0) {
  rt::ThreadWorld world(cfg.layout.world(), timeout_s);
  std::vector<std::unique_ptr<rt::Trainer>> trainers;
  for (const std::vector<int>& part : parts) {
    rt::TrainerConfig c = cfg;
    c.local_ranks = part;
    auto t = rt::Trainer::Create(c, CpuBackends(), world);
    ASSERT_TRUE(t.ok()) << t.status().message();
    trainers.push_back(std::move(t).value());
  }
  std::vector<std::thread> threads;
  for (size_t i = 0; i < trainers.size(); ++i)
    threads.emplace_back([&, i] { fn(i, *trainers[i]); });
  for (std::thread& th : threads) th.join();
}

// n steps of `t`, each step's loss appended to *losses.
inline void StepsOf(rt::Trainer& t, int n, std::vector<double>* losses) {
  for (int i = 0; i < n; ++i) {
    auto r = t.Step();
    ASSERT_TRUE(r.ok()) << r.status().message();
    losses->push_back(r->loss);
  }
}

// Every tensor and counter bit for bit (memcmp: -0.0 is not +0.0 here).
inline void ExpectSameState(const rt::TrainingState& got, const rt::TrainingState& want,
                            const std::string& what) {
  EXPECT_EQ(got.step, want.step) << what;
  EXPECT_EQ(got.optimizer_steps, want.optimizer_steps) << what;
  EXPECT_EQ(got.consumed_samples, want.consumed_samples) << what;
  ASSERT_EQ(got.tensors.size(), want.tensors.size()) << what;
  for (size_t i = 0; i < want.tensors.size(); ++i) {
    const rt::NamedTensor &a = got.tensors[i], &b = want.tensors[i];
    EXPECT_EQ(a.name, b.name) << what;
    EXPECT_EQ(a.shape, b.shape) << what << " " << b.name;
    ASSERT_EQ(a.data.size(), b.data.size()) << what << " " << b.name;
    EXPECT_EQ(std::memcmp(a.data.data(), b.data.data(), b.data.size() * sizeof(float)), 0)
        << what << ": " << b.name << " differs";
  }
}

}  // namespace ptdp::testing
