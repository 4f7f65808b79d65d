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

// Each job waits for the rank's work at its hand-over: the reducer takes the group's mark
// (Communicator::MarkReady) on the thread that hands the job over and gives it back
// (RunAfter) on its own thread just before that job's collective, in hand-over order.
class MarkingCommunicator final : public Communicator {
 public:
  struct Mark final : ReadyMark {
    int seq = 0;
    std::thread::id taken_on;
  };
  explicit MarkingCommunicator(std::unique_ptr<Communicator> inner) : in_(std::move(inner)) {}
  int rank() const override { return in_->rank(); }
  int size() const override { return in_->size(); }
  const std::vector<int>& ranks() const override { return in_->ranks(); }
  const std::string& label() const override { return in_->label(); }
  Status AllReduce(Tensor& t, ReduceOp op) override { Ran(); return in_->AllReduce(t, op); }
  Status AllGather(const Tensor& in, Tensor& out) override { Ran(); return in_->AllGather(in, out); }
  Status ReduceScatter(const Tensor& in, Tensor& out, ReduceOp op) override {
    Ran();
    return in_->ReduceScatter(in, out, op);
  }
  Status Broadcast(Tensor& t, int root) override { return in_->Broadcast(t, root); }
  Status Barrier() override { return in_->Barrier(); }
  Status Send(const Tensor& t, int peer) override { return in_->Send(t, peer); }
  Status Recv(Tensor& t, int peer) override { return in_->Recv(t, peer); }
  Status GroupStart() override { return in_->GroupStart(); }
  Status GroupEnd() override { return in_->GroupEnd(); }
  Result<std::shared_ptr<ReadyMark>> MarkReady() override {
    auto m = std::make_shared<Mark>();
    m->seq = marks_++;
    m->taken_on = std::this_thread::get_id();
    return std::shared_ptr<ReadyMark>(m);
  }
  void RunAfter(std::shared_ptr<ReadyMark> mark) override {
    next_ = std::dynamic_pointer_cast<Mark>(std::move(mark));
  }
  // Per collective: the mark it ran after (-1: none), and whether the mark was taken on
  // another thread than the one that ran it.
  std::vector<int> seqs;
  std::vector<bool> taken_elsewhere;

 private:
  void Ran() {
    seqs.push_back(next_ ? next_->seq : -1);
    taken_elsewhere.push_back(next_ && next_->taken_on != std::this_thread::get_id());
    next_.reset();
  }
  std::unique_ptr<Communicator> in_;
  std::shared_ptr<Mark> next_;
  int marks_ = 0;
};

TEST(GradReducer, EachJobRunsAfterTheMarkTakenAtItsHandOver) {
  ThreadWorld world(2, 10.0);
  auto rank = [&](int r) {
    auto group = world.Group(r, {0, 1}, "DP");
    ASSERT_TRUE(group.ok()) << group.status().message();
    MarkingCommunicator marking(std::move(group).value());
    std::vector<float> a(4, 1.0f), b(4, 2.0f), full(4, 0.0f);
    Tensor g = Floats(full);
    GradReducer reducer;
    reducer.Launch(&marking, Floats(a), 0);
    reducer.LaunchReduceScatter(&marking, Floats(a), Floats(b).View(Shape({2})), 1);
    reducer.LaunchAllGather(&marking, g.View(Shape({2}), 2 * r), g, 2);
    ASSERT_TRUE(reducer.Wait().ok());
    EXPECT_EQ(marking.seqs, (std::vector<int>{0, 1, 2}));
    EXPECT_EQ(marking.taken_elsewhere, (std::vector<bool>{true, true, true}));
  };
  std::thread other(rank, 1);
  rank(0);
  other.join();
}

}  // namespace
}  // namespace ptdp::rt
