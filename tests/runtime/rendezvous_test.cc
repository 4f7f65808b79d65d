// The rendezvous core with data planes other than ThreadWorld's: a "lazy" host plane that
// behaves like a CUDA stream (copies, reductions and the rank's own writes are queued and run
// only at Publish or Finish), so that a core that read a peer's buffer before the peer published
// it, or returned before finishing its own copies, would produce stale numbers here; and planes
// that fail, which must fail the group for every rank. ThreadWorld's own tests
// (thread_communicator_test.cc) cover the matching, timeout and p2p logic.
#include "runtime/rendezvous.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/cpu/thread_communicator.h"

namespace ptdp::rt {
namespace {

constexpr double kTimeoutS = 5.0;

Tensor HostTensor(Shape shape, DType dtype = DType::kF32) {
  size_t bytes = size_t(shape.numel()) * DTypeBytes(dtype);
  auto buf = std::make_shared<Buffer>(new char[bytes](), bytes,
                                      [](void* p, size_t) { delete[] static_cast<char*>(p); });
  return Tensor(buf, shape, dtype);
}

std::vector<float> Values(const Tensor& t) {
  const float* p = t.data_as<float>();
  return std::vector<float>(p, p + t.numel());
}

// A rank's "stream": work queued in order, run when the rank synchronizes.
class Stream {
 public:
  void Defer(std::function<void()> f) { q_.push_back(std::move(f)); }
  void Run() {
    for (auto& f : q_) f();
    q_.clear();
  }
  size_t pending() const { return q_.size(); }

 private:
  std::vector<std::function<void()>> q_;
};

// Host memory, but every operation waits in the rank's Stream until Publish or Finish.
class LazyPlane : public RankPlane {
 public:
  explicit LazyPlane(std::shared_ptr<Stream> s) : s_(std::move(s)) {}
  Status Publish() override {
    s_->Run();
    return Status::Ok();
  }
  Status Copy(void* dst, const void* src, size_t bytes) override {
    s_->Defer([=] { std::memcpy(dst, src, bytes); });
    return Status::Ok();
  }
  Status Reduce(void* dst, const std::vector<const void*>& in, int64_t count, DType dtype,
                ReduceOp op) override {
    s_->Defer([=] {
      float* d = static_cast<float*>(dst);
      for (int64_t e = 0; e < count; ++e) {
        float acc = static_cast<const float*>(in[0])[e];
        for (size_t r = 1; r < in.size(); ++r) {
          float x = static_cast<const float*>(in[r])[e];
          acc = op == ReduceOp::kSum ? acc + x : std::max(acc, x);
        }
        d[e] = acc;
      }
    });
    return Status::Ok();
  }
  Status Finish() override {
    s_->Run();
    return Status::Ok();
  }
  Result<std::shared_ptr<void>> Allocate(size_t bytes) override {
    return std::shared_ptr<void>(new char[bytes], [](void* p) { delete[] static_cast<char*>(p); });
  }
  std::vector<DType> ReduceDTypes() const override { return {DType::kF32}; }

 protected:
  std::shared_ptr<Stream> s_;
};

void RunRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

// Writes `values` into t the way a device kernel would: queued on the rank's stream.
void DeferredFill(Stream& s, Tensor t, std::vector<float> values) {
  s.Defer([t, values] { std::memcpy(t.data(), values.data(), values.size() * sizeof(float)); });
}

TEST(Rendezvous, LazyPlanePublishesBeforeSharingAndFinishesBeforeReturning) {
  // 3 ranks; rank r's inputs are queued writes of r + 1 (x4 elements), never run by the test.
  //   all-reduce sum: 1 + 2 + 3 = 6; max: 3
  //   all-gather of [r + 1]: [1, 2, 3]
  //   reduce-scatter of [r+1, r+1, r+1] (block per rank): 6 on every rank
  //   broadcast from rank 2 of [10, 20]: [10, 20]
  //   ring send to r + 1 of [100 + r]: rank r gets 100 + (r + 2) % 3
  const int n = 3;
  Rendezvous world(n, kTimeoutS, "lazy communicator");
  std::vector<std::vector<float>> sum(n), max(n), gathered(n), scattered(n), bcast(n), ring(n);
  std::vector<size_t> left(n);
  RunRanks(n, [&](int r) {
    auto stream = std::make_shared<Stream>();
    auto c = world.Group(r, {0, 1, 2}, "G", std::make_unique<LazyPlane>(stream));
    ASSERT_TRUE(c.ok()) << c.status().message();
    Communicator& comm = **c;
    const float v = float(r + 1);
    Tensor a = HostTensor({4}), b = HostTensor({4});
    DeferredFill(*stream, a, {v, v, v, v});
    DeferredFill(*stream, b, {v, v, v, v});
    EXPECT_TRUE(comm.AllReduce(a, ReduceOp::kSum).ok());
    EXPECT_TRUE(comm.AllReduce(b, ReduceOp::kMax).ok());
    Tensor in = HostTensor({1}), out = HostTensor({3});
    DeferredFill(*stream, in, {v});
    EXPECT_TRUE(comm.AllGather(in, out).ok());
    Tensor rs_in = HostTensor({3}), rs_out = HostTensor({1});
    DeferredFill(*stream, rs_in, {v, v, v});
    EXPECT_TRUE(comm.ReduceScatter(rs_in, rs_out, ReduceOp::kSum).ok());
    Tensor bc = HostTensor({2});
    if (r == 2) DeferredFill(*stream, bc, {10, 20});
    EXPECT_TRUE(comm.Broadcast(bc, 2).ok());
    Tensor send = HostTensor({1}), recv = HostTensor({1});
    DeferredFill(*stream, send, {float(100 + r)});
    EXPECT_TRUE(comm.GroupStart().ok());
    EXPECT_TRUE(comm.Send(send, (r + 1) % n).ok());
    EXPECT_TRUE(comm.Recv(recv, (r + n - 1) % n).ok());
    EXPECT_TRUE(comm.GroupEnd().ok());
    sum[r] = Values(a);
    max[r] = Values(b);
    gathered[r] = Values(out);
    scattered[r] = Values(rs_out);
    bcast[r] = Values(bc);
    ring[r] = Values(recv);
    left[r] = stream->pending();
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(sum[r], (std::vector<float>{6, 6, 6, 6})) << r;
    EXPECT_EQ(max[r], (std::vector<float>{3, 3, 3, 3})) << r;
    EXPECT_EQ(gathered[r], (std::vector<float>{1, 2, 3})) << r;
    EXPECT_EQ(scattered[r], (std::vector<float>{6})) << r;
    EXPECT_EQ(bcast[r], (std::vector<float>{10, 20})) << r;
    EXPECT_EQ(ring[r], (std::vector<float>{float(100 + (r + 2) % n)})) << r;
    EXPECT_EQ(left[r], 0u) << "rank " << r << " returned with queued work";
  }
}

// Fails Reduce on one rank, as a device plane whose kernel launch failed.
class FailingReducePlane final : public LazyPlane {
 public:
  FailingReducePlane(std::shared_ptr<Stream> s, bool fail) : LazyPlane(std::move(s)), fail_(fail) {}
  Status Reduce(void* dst, const std::vector<const void*>& in, int64_t count, DType dtype,
                ReduceOp op) override {
    if (fail_) return Status::Error("injected launch failure");
    return LazyPlane::Reduce(dst, in, count, dtype, op);
  }

 private:
  bool fail_;
};

TEST(Rendezvous, APlaneFailureFailsTheCollectiveOnEveryRankAndPoisonsTheGroup) {
  // Rank 1's share of the all-reduce fails: no rank may take the result (it has a hole), every
  // rank's error names the failure, and the next call on the group is refused.
  Rendezvous world(2, kTimeoutS, "lazy communicator");
  std::vector<Status> st(2), later(2);
  RunRanks(2, [&](int r) {
    auto c = world.Group(r, {0, 1}, "TP",
                         std::make_unique<FailingReducePlane>(std::make_shared<Stream>(), r == 1));
    ASSERT_TRUE(c.ok());
    Tensor t = HostTensor({8});
    st[r] = (*c)->AllReduce(t, ReduceOp::kSum);
    later[r] = (*c)->Barrier();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(st[r].message().find("rank 1: all-reduce on group [0,1] (TP): data plane: "
                                   "injected launch failure"),
              std::string::npos)
        << st[r].message();
    EXPECT_NE(later[r].message().find("barrier on group [0,1] (TP) refused"), std::string::npos)
        << later[r].message();
  }
}

// Allocation always fails, as a device out of memory.
class NoMemoryPlane final : public LazyPlane {
 public:
  using LazyPlane::LazyPlane;
  Result<std::shared_ptr<void>> Allocate(size_t bytes) override {
    return Status::Error("out of memory for " + std::to_string(bytes) + " bytes");
  }
};

TEST(Rendezvous, ScratchAllocationFailureIsAnErrorOnEveryRank) {
  // The all-reduce result needs 4 x 4 = 16 bytes of scratch, allocated by the last to arrive.
  Rendezvous world(2, kTimeoutS, "lazy communicator");
  std::vector<Status> st(2);
  RunRanks(2, [&](int r) {
    auto c = world.Group(r, {0, 1}, "DP", std::make_unique<NoMemoryPlane>(std::make_shared<Stream>()));
    ASSERT_TRUE(c.ok());
    Tensor t = HostTensor({4});
    st[r] = (*c)->AllReduce(t, ReduceOp::kSum);
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(st[r].message().find("data plane: out of memory for 16 bytes"), std::string::npos)
        << st[r].message();
}

TEST(Rendezvous, ThreadWorldReducesBf16OnceInFp32AndCopiesAnyDtype) {
  // bf16 sums run in fp32 and are rounded once (as DeviceWorld's kernel): 1 + 2^-8 + 2^-8 is
  // 1 + 2^-7 = 0x3f81, where rounding after each add would give 1 (1 + 2^-8 is a tie, to even).
  // Gathers copy any dtype (2 bf16 = 4 bytes per rank); i32 is not reduced.
  ThreadWorld world(3, kTimeoutS);
  std::vector<Status> reduce(3), gather(3), ints(3);
  std::vector<uint16_t> sum(3);
  std::vector<std::vector<uint16_t>> got(3);
  RunRanks(3, [&](int r) {
    auto a = world.Group(r, {0, 1, 2}, "A");
    auto b = world.Group(r, {0, 1, 2}, "B");
    auto c = world.Group(r, {0, 1, 2}, "C");
    Tensor t = HostTensor({1}, DType::kBF16);
    t.data_as<uint16_t>()[0] = r == 0 ? 0x3f80 : 0x3b80;  // 1.0, 2^-8, 2^-8
    reduce[r] = (*a)->AllReduce(t, ReduceOp::kSum);
    sum[r] = t.data_as<uint16_t>()[0];
    Tensor in = HostTensor({2}, DType::kBF16), out = HostTensor({6}, DType::kBF16);
    uint16_t* p = in.data_as<uint16_t>();
    p[0] = uint16_t(0x3f80 + r);  // distinct bit patterns per rank
    p[1] = uint16_t(0x4000 + r);
    gather[r] = (*b)->AllGather(in, out);
    const uint16_t* o = out.data_as<uint16_t>();
    got[r] = std::vector<uint16_t>(o, o + 6);
    Tensor i = HostTensor({2}, DType::kI32);
    ints[r] = (*c)->AllReduce(i, ReduceOp::kSum);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(reduce[r].ok()) << reduce[r].message();
    EXPECT_EQ(sum[r], 0x3f81) << "rank " << r;
    EXPECT_TRUE(gather[r].ok()) << gather[r].message();
    EXPECT_EQ(got[r], (std::vector<uint16_t>{0x3f80, 0x4000, 0x3f81, 0x4001, 0x3f82, 0x4002}));
    EXPECT_NE(ints[r].message().find("dtype i32 is not supported (reductions take f32, bf16)"),
              std::string::npos)
        << ints[r].message();
  }
}

TEST(Rendezvous, SpinsOnlyWhenEveryRankHasACore) {
  EXPECT_GT(Rendezvous::DefaultSpinSeconds(2, 2), 0);
  EXPECT_GT(Rendezvous::DefaultSpinSeconds(1, 16), 0);
  EXPECT_EQ(Rendezvous::DefaultSpinSeconds(3, 2), 0);  // a spinner would take a worker's core
  EXPECT_EQ(Rendezvous::DefaultSpinSeconds(2, 0), 0);  // cores unknown
  EXPECT_EQ(Rendezvous(2, kTimeoutS, "x", 0.5).spin_s(), 0.5);
}

// Spinning (for longer than any wait here), sleeping at once, and the default: the same results.
// Rank 0 sleeps before some calls, so that the others wait long enough to stop spinning (1 ms
// spin) or keep spinning (10 s), and both wake paths (epoch seen while spinning, notify while
// sleeping) are taken.
class RendezvousSpin : public ::testing::TestWithParam<double> {};
INSTANTIATE_TEST_SUITE_P(SpinSeconds, RendezvousSpin, ::testing::Values(0.0, 1e-3, 10.0));

TEST_P(RendezvousSpin, CollectivesAndRingSendsAgreeWithTheSleepingPath) {
  constexpr int n = 3, kRounds = 60;
  Rendezvous world(n, kTimeoutS, "spin communicator", GetParam());
  std::vector<std::vector<float>> sums(n), got(n);
  RunRanks(n, [&](int r) {
    auto all = world.Group(r, {0, 1, 2}, "ALL", std::make_unique<LazyPlane>(std::make_shared<Stream>()));
    auto ring = world.Group(r, {0, 1, 2}, "RING", std::make_unique<LazyPlane>(std::make_shared<Stream>()));
    ASSERT_TRUE(all.ok() && ring.ok());
    for (int k = 0; k < kRounds; ++k) {
      if (r == 0 && k % 10 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(3));
      Tensor x = HostTensor({2});
      x.data_as<float>()[0] = float(r + k);
      x.data_as<float>()[1] = float(r * k);
      ASSERT_TRUE((*all)->AllReduce(x, ReduceOp::kSum).ok());
      sums[r].push_back(x.data_as<float>()[0] + x.data_as<float>()[1]);
      Tensor out = HostTensor({1}), in = HostTensor({1});
      out.data_as<float>()[0] = float(100 * r + k);
      ASSERT_TRUE((*ring)->GroupStart().ok());
      ASSERT_TRUE((*ring)->Send(out, (r + 1) % n).ok());
      ASSERT_TRUE((*ring)->Recv(in, (r + n - 1) % n).ok());
      ASSERT_TRUE((*ring)->GroupEnd().ok());
      got[r].push_back(in.data_as<float>()[0]);
    }
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(sums[r].size(), size_t(kRounds));
    for (int k = 0; k < kRounds; ++k) {
      EXPECT_EQ(sums[r][size_t(k)], float(3 * k + 3 + 3 * k)) << "rank " << r << " round " << k;
      EXPECT_EQ(got[r][size_t(k)], float(100 * ((r + n - 1) % n) + k));
    }
  }
}

TEST(Rendezvous, ATimeoutShorterThanTheSpinStillFires) {
  // Spinning for 60 s must not delay a 0.2 s timeout: rank 1 never calls.
  Rendezvous world(2, 0.2, "spin communicator", 60.0);
  auto c = world.Group(0, {0, 1}, "TP", std::make_unique<LazyPlane>(std::make_shared<Stream>()));
  ASSERT_TRUE(c.ok());
  Tensor t = HostTensor({1});
  const auto t0 = std::chrono::steady_clock::now();
  Status st = (*c)->AllReduce(t, ReduceOp::kSum);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(st.message().find("timed out after 0.2 s"), std::string::npos) << st.message();
  EXPECT_LT(waited, 30.0);  // far below the spin: the timeout, not the spin, ended the wait
}

}  // namespace
}  // namespace ptdp::rt
