// GradReducer (--overlap-grad-reduce's thread): buckets handed over run in hand-over order on
// the reducer's own thread, beside the caller, and Wait() returns once all have; a failed
// collective is reported by Wait(), named, and the later buckets still run (and fail at once on
// the aborted group), so that nothing hangs.
#include "runtime/grad_reducer.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/cpu/thread_communicator.h"
#include "runtime/tensor.h"

namespace ptdp::rt {
namespace {

// A host f32 tensor over v's memory (v outlives it; no Backend needed).
Tensor Floats(std::vector<float>& v) {
  auto buf = std::make_shared<Buffer>(v.data(), v.size() * sizeof(float), [](void*, size_t) {});
  return Tensor(buf, Shape({int64_t(v.size())}), DType::kF32);
}

TEST(GradReducer, RunsBucketsInHandOverOrderBesideTheCaller) {
  ThreadWorld world(2, 10.0);
  std::vector<std::vector<std::vector<float>>> data(2);
  auto rank = [&](int r) {
    auto group = world.Group(r, {0, 1}, "DP");
    ASSERT_TRUE(group.ok()) << group.status().message();
    // Three buckets of different sizes; rank r holds r + 1 + bucket index everywhere.
    data[size_t(r)] = {std::vector<float>(5, float(r + 1)), std::vector<float>(3, float(r + 2)),
                       std::vector<float>(7, float(r + 3))};
    GradReducer reducer;
    for (int k = 0; k < 3; ++k) reducer.Launch(group->get(), Floats(data[size_t(r)][size_t(k)]), k);
    std::vector<GradReducer::Span> spans;
    const Status st = reducer.Wait(&spans);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(spans.size(), 3u);
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(spans[size_t(k)].tag, k);
      EXPECT_LE(spans[size_t(k)].start, spans[size_t(k)].end);
      if (k > 0) {
        EXPECT_LE(spans[size_t(k - 1)].end, spans[size_t(k)].start);
      }
    }
    // A second round on the same reducer (the next step).
    reducer.Launch(group->get(), Floats(data[size_t(r)][0]), 7);
    ASSERT_TRUE(reducer.Wait().ok());
  };
  std::thread other(rank, 1);
  rank(0);
  other.join();
  for (int r = 0; r < 2; ++r) {
    for (float x : data[size_t(r)][0]) EXPECT_EQ(x, 2 * (1 + 2));  // reduced twice: 3, then 6
    for (float x : data[size_t(r)][1]) EXPECT_EQ(x, 2 + 3);
    for (float x : data[size_t(r)][2]) EXPECT_EQ(x, 3 + 4);
  }
}

TEST(GradReducer, WaitReportsAFailedBucketAndTheRestStillRun) {
  ThreadWorld world(2, 0.5);
  auto rank = [&](int r) {
    auto group = world.Group(r, {0, 1}, "DP");
    ASSERT_TRUE(group.ok()) << group.status().message();
    // Rank 1's first bucket is longer than rank 0's: a mismatch every later call shares.
    std::vector<float> a(r == 0 ? 4 : 6, 1.0f), b(2, 1.0f);
    GradReducer reducer;
    reducer.Launch(group->get(), Floats(a), 0);
    reducer.Launch(group->get(), Floats(b), 1);
    const Status st = reducer.Wait();
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("gradient bucket 0"), std::string::npos) << st.message();
    EXPECT_TRUE(reducer.Wait().ok());  // reported once
  };
  std::thread other(rank, 1);
  rank(0);
  other.join();
}

// The distributed optimizer's all-gathers go through the same queue (--overlap-param-gather):
// each Launch returns its ticket (1, 2, 3 ...), WaitFor(n) returns once the first n have run
// and hands over their spans; the gathered tensor holds every rank's block in rank order.
TEST(GradReducer, GathersAndWaitsForATicket) {
  ThreadWorld world(2, 10.0);
  std::vector<std::vector<float>> gathered(2), reduced(2);
  auto rank = [&](int r) {
    auto group = world.Group(r, {0, 1}, "DP");
    ASSERT_TRUE(group.ok()) << group.status().message();
    reduced[size_t(r)] = std::vector<float>(3, float(r + 1));
    gathered[size_t(r)] = std::vector<float>(4, -1.0f);
    gathered[size_t(r)][size_t(2 * r)] = float(10 * r);  // this rank's block of 2
    gathered[size_t(r)][size_t(2 * r + 1)] = float(10 * r + 1);
    Tensor full = Floats(gathered[size_t(r)]);
    GradReducer reducer;
    EXPECT_EQ(reducer.Launch(group->get(), Floats(reduced[size_t(r)]), 0), 1u);
    EXPECT_EQ(reducer.LaunchAllGather(group->get(), full.View(Shape({2}), 2 * r), full, 5), 2u);
    std::vector<GradReducer::Span> spans;
    ASSERT_TRUE(reducer.WaitFor(2, &spans).ok());
    ASSERT_GE(spans.size(), 2u);
    EXPECT_EQ(spans[0].tag, 0);
    EXPECT_EQ(spans[1].tag, 5);
    for (int k = 0; k < 4; ++k) EXPECT_EQ(gathered[size_t(r)][size_t(k)], float(10 * (k / 2) + k % 2));
    EXPECT_EQ(reducer.LaunchAllGather(group->get(), full.View(Shape({2}), 2 * r), full, 6), 3u);
    ASSERT_TRUE(reducer.Wait().ok());
  };
  std::thread other(rank, 1);
  rank(0);
  other.join();
  for (int r = 0; r < 2; ++r)
    for (float x : reduced[size_t(r)]) EXPECT_EQ(x, 1 + 2);
}

}  // namespace
}  // namespace ptdp::rt
