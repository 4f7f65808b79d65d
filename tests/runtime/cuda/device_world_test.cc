// DeviceWorld: 2 to 4 (and 40) ranks as threads on one GPU. The collectives and p2p the runtime
// uses with hand-checkable values; f32 reductions bit-identical to ThreadWorld's on the same
// inputs (the same group-rank order, on the device); bf16 reductions; inputs written
// asynchronously on each rank's stream (so a missing publish would read stale data); a send
// buffer overwritten right after Send returns; and the failures (a missing rank, mismatched
// calls) as errors naming ranks and operations. Skips without a GPU.
#include "runtime/cuda/device_world.h"

#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/cpu/thread_communicator.h"
#include "tests/runtime/cuda/gpu_test_util.h"

namespace ptdp::rt::cuda {
namespace {

constexpr int kDevice = 0;
constexpr double kTimeoutS = 30.0;
constexpr double kShortTimeoutS = 0.2;

void RunRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

std::vector<int> Iota(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) v[size_t(r)] = r;
  return v;
}

std::unique_ptr<Communicator> Comm(CommunicatorFactory& w, int rank, const std::vector<int>& ranks,
                                   const std::string& label = "G") {
  auto c = w.Group(rank, ranks, label);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? std::move(c).value() : nullptr;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

class DeviceWorldN : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(Ranks, DeviceWorldN, ::testing::Values(2, 3, 4));

TEST_P(DeviceWorldN, AllReduceIsBitIdenticalToThreadWorld) {
  // 1000 random f32 per rank in [-1e4, 1e4]: sums and maxes equal ThreadWorld's bit for bit on
  // every rank (both add in group-rank order; 1000 elements split in uneven chunks of n).
  PTDP_SKIP_WITHOUT_GPU();
  const int n = GetParam(), len = 1000;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1e4f, 1e4f);
  std::vector<std::vector<float>> x(static_cast<size_t>(n), std::vector<float>(len));
  for (auto& xr : x)
    for (float& e : xr) e = dist(rng);

  ThreadWorld host(n, kTimeoutS);
  std::vector<std::vector<float>> want_sum(static_cast<size_t>(n)), want_max(static_cast<size_t>(n));
  RunRanks(n, [&](int r) {
    auto c = Comm(host, r, Iota(n));
    auto buf = std::make_shared<Buffer>(new float[2 * len], 2 * len * sizeof(float),
                                        [](void* p, size_t) { delete[] static_cast<float*>(p); });
    Tensor a(buf, {len}, DType::kF32), b(buf, {len}, DType::kF32, len);
    std::memcpy(a.data(), x[size_t(r)].data(), len * sizeof(float));
    std::memcpy(b.data(), x[size_t(r)].data(), len * sizeof(float));
    EXPECT_TRUE(c->AllReduce(a, ReduceOp::kSum).ok());
    EXPECT_TRUE(c->AllReduce(b, ReduceOp::kMax).ok());
    want_sum[size_t(r)].assign(a.data_as<float>(), a.data_as<float>() + len);
    want_max[size_t(r)].assign(b.data_as<float>(), b.data_as<float>() + len);
  });

  Streams streams(kDevice, n);
  DeviceWorld dev(n, kTimeoutS, kDevice, [&](int g) { return streams[g]; });
  std::vector<std::vector<float>> got_sum(static_cast<size_t>(n)), got_max(static_cast<size_t>(n));
  std::vector<Status> st(static_cast<size_t>(n));
  RunRanks(n, [&](int r) {
    auto c = Comm(dev, r, Iota(n));
    Tensor a = DeviceTensor(kDevice, {len}), b = DeviceTensor(kDevice, {len});
    UploadAsync(x[size_t(r)], a, streams[r]);
    UploadAsync(x[size_t(r)], b, streams[r]);
    Status s1 = c->AllReduce(a, ReduceOp::kSum);
    Status s2 = c->AllReduce(b, ReduceOp::kMax);
    st[size_t(r)] = s1.ok() ? s2 : s1;
    got_sum[size_t(r)] = Download<float>(a, streams[r]);
    got_max[size_t(r)] = Download<float>(b, streams[r]);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(st[size_t(r)].ok()) << st[size_t(r)].message();
    for (int e = 0; e < len; ++e) {
      ASSERT_EQ(Bits(got_sum[size_t(r)][size_t(e)]), Bits(want_sum[0][size_t(e)]))
          << "rank " << r << " element " << e;
      ASSERT_EQ(Bits(got_max[size_t(r)][size_t(e)]), Bits(want_max[0][size_t(e)]))
          << "rank " << r << " element " << e;
    }
  }
}

TEST_P(DeviceWorldN, GatherScatterBroadcastBarrierAndBf16) {
  // Rank r: in = (2, 3) with in[k] = 10r + k. All-gather: block q = 10q + k. Reduce-scatter of
  // the gathered (2n, 3): n * (10r + k). Broadcast from rank n-1 of [7, 8, 9]. bf16 all-reduce
  // of r + 1 (exact in bf16 up to 256): n(n+1)/2. Barrier: everyone counted in before it.
  PTDP_SKIP_WITHOUT_GPU();
  const int n = GetParam();
  Streams streams(kDevice, n);
  DeviceWorld dev(n, kTimeoutS, kDevice, [&](int g) { return streams[g]; });
  std::vector<std::vector<float>> gathered(static_cast<size_t>(n)), scattered(static_cast<size_t>(n)), bcast(static_cast<size_t>(n));
  std::vector<float> bf16_sum(static_cast<size_t>(n));
  std::atomic<int> in_count{0};
  std::vector<int> seen(static_cast<size_t>(n));
  RunRanks(n, [&](int r) {
    auto c = Comm(dev, r, Iota(n));
    cudaStream_t s = streams[r];
    std::vector<float> x;
    for (int k = 0; k < 6; ++k) x.push_back(float(10 * r + k));
    Tensor in = DeviceTensor(kDevice, {2, 3}), g = DeviceTensor(kDevice, {2 * n, 3}),
           out = DeviceTensor(kDevice, {2, 3});
    UploadAsync(x, in, s);
    EXPECT_TRUE(c->AllGather(in, g).ok());
    EXPECT_TRUE(c->ReduceScatter(g, out, ReduceOp::kSum).ok());
    gathered[size_t(r)] = Download<float>(g, s);
    scattered[size_t(r)] = Download<float>(out, s);
    Tensor b = DeviceTensor(kDevice, {3});
    if (r == n - 1) UploadAsync(std::vector<float>{7, 8, 9}, b, s);
    EXPECT_TRUE(c->Broadcast(b, n - 1).ok());
    bcast[size_t(r)] = Download<float>(b, s);
    Tensor h = DeviceTensor(kDevice, {5}, DType::kBF16);
    UploadAsync(std::vector<__nv_bfloat16>(5, __float2bfloat16(float(r + 1))), h, s);
    EXPECT_TRUE(c->AllReduce(h, ReduceOp::kSum).ok());
    bf16_sum[size_t(r)] = __bfloat162float(Download<__nv_bfloat16>(h, s)[4]);
    ++in_count;
    EXPECT_TRUE(c->Barrier().ok());
    seen[size_t(r)] = in_count.load();
  });
  for (int r = 0; r < n; ++r) {
    for (int q = 0; q < n; ++q)
      for (int k = 0; k < 6; ++k)
        EXPECT_EQ(gathered[size_t(r)][size_t(6 * q + k)], float(10 * q + k));
    for (int k = 0; k < 6; ++k) EXPECT_EQ(scattered[size_t(r)][size_t(k)], float(n * (10 * r + k)));
    EXPECT_EQ(bcast[size_t(r)], (std::vector<float>{7, 8, 9}));
    EXPECT_EQ(bf16_sum[size_t(r)], float(n * (n + 1) / 2));
    EXPECT_EQ(seen[size_t(r)], n);
  }
}

TEST_P(DeviceWorldN, GroupedRingAndInPlaceAllGather) {
  // Ring inside a group: rank r sends 100 + r to r+1, receives from r-1, 3 rounds. In-place
  // all-gather: `in` is rank r's slot of out, filled with r.
  PTDP_SKIP_WITHOUT_GPU();
  const int n = GetParam();
  Streams streams(kDevice, n);
  DeviceWorld dev(n, kTimeoutS, kDevice, [&](int g) { return streams[g]; });
  std::vector<float> ring(static_cast<size_t>(n), -1);
  std::vector<std::vector<float>> gathered(static_cast<size_t>(n));
  RunRanks(n, [&](int r) {
    auto c = Comm(dev, r, Iota(n), "PP");
    cudaStream_t s = streams[r];
    for (int round = 0; round < 3; ++round) {
      Tensor out = DeviceTensor(kDevice, {4}), in = DeviceTensor(kDevice, {4});
      UploadAsync(std::vector<float>(4, float(100 + r)), out, s);
      EXPECT_TRUE(c->GroupStart().ok());
      EXPECT_TRUE(c->Recv(in, (r + n - 1) % n).ok());
      EXPECT_TRUE(c->Send(out, (r + 1) % n).ok());
      Status e = c->GroupEnd();
      EXPECT_TRUE(e.ok()) << e.message();
      ring[size_t(r)] = Download<float>(in, s)[3];
    }
    Tensor all = DeviceTensor(kDevice, {n});
    Tensor mine = all.View({1}, r);
    UploadAsync(std::vector<float>{float(r)}, mine, s);
    EXPECT_TRUE(c->AllGather(mine, all).ok());
    gathered[size_t(r)] = Download<float>(all, s);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(ring[size_t(r)], float(100 + (r + n - 1) % n)) << r;
    for (int q = 0; q < n; ++q) EXPECT_EQ(gathered[size_t(r)][size_t(q)], float(q));
  }
}

TEST(DeviceWorld, SendReturnsOnlyAfterTheReceiverCopied) {
  // Rank 0 overwrites its send buffer with -1 right after each Send returns; rank 1 must still
  // receive 1, 2, ..., 20 (the receiver's copy finished before the send completed).
  PTDP_SKIP_WITHOUT_GPU();
  Streams streams(kDevice, 2);
  DeviceWorld dev(2, kTimeoutS, kDevice, [&](int g) { return streams[g]; });
  std::vector<float> got;
  RunRanks(2, [&](int r) {
    auto c = Comm(dev, r, {0, 1}, "PP");
    Tensor t = DeviceTensor(kDevice, {1 << 16});
    for (int i = 1; i <= 20; ++i) {
      if (r == 0) {
        UploadAsync(std::vector<float>(1 << 16, float(i)), t, streams[0]);
        EXPECT_TRUE(c->Send(t, 1).ok());
        UploadAsync(std::vector<float>(1 << 16, -1.0f), t, streams[0]);
      } else {
        EXPECT_TRUE(c->Recv(t, 0).ok());
        got.push_back(Download<float>(t, streams[1]).back());
      }
    }
  });
  std::vector<float> want;
  for (int i = 1; i <= 20; ++i) want.push_back(float(i));
  EXPECT_EQ(got, want);
}

TEST(DeviceWorld, FortyRanksReduceInStagesInRankOrder) {
  // 40 ranks > kMaxReduceInputs (32): the kernel runs in two stages, still in group-rank order,
  // so f32 sums equal ThreadWorld's bit for bit; and sum of r + 1 is 40 * 41 / 2 = 820.
  PTDP_SKIP_WITHOUT_GPU();
  const int n = 40, len = 257;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1e3f, 1e3f);
  std::vector<std::vector<float>> x(n, std::vector<float>(len));
  for (auto& xr : x)
    for (float& e : xr) e = dist(rng);
  std::vector<float> want = x[0];
  for (int r = 1; r < n; ++r)
    for (int e = 0; e < len; ++e) want[size_t(e)] += x[size_t(r)][size_t(e)];
  Streams streams(kDevice, n);
  DeviceWorld dev(n, kTimeoutS, kDevice, [&](int g) { return streams[g]; });
  std::vector<std::vector<float>> got(n);
  std::vector<float> count(n);
  RunRanks(n, [&](int r) {
    auto c = Comm(dev, r, Iota(n));
    Tensor t = DeviceTensor(kDevice, {len}), k = DeviceTensor(kDevice, {1});
    UploadAsync(x[size_t(r)], t, streams[r]);
    UploadAsync(std::vector<float>{float(r + 1)}, k, streams[r]);
    EXPECT_TRUE(c->AllReduce(t, ReduceOp::kSum).ok());
    EXPECT_TRUE(c->AllReduce(k, ReduceOp::kSum).ok());
    got[size_t(r)] = Download<float>(t, streams[r]);
    count[size_t(r)] = Download<float>(k, streams[r])[0];
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(count[size_t(r)], 820.0f);
    EXPECT_EQ(std::memcmp(got[size_t(r)].data(), want.data(), len * sizeof(float)), 0) << r;
  }
}

TEST(DeviceWorld, MaxPropagatesNaN) {
  PTDP_SKIP_WITHOUT_GPU();
  Streams streams(kDevice, 2);
  DeviceWorld dev(2, kTimeoutS, kDevice, [&](int g) { return streams[g]; });
  std::vector<std::vector<float>> got(2);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  RunRanks(2, [&](int r) {
    auto c = Comm(dev, r, {0, 1});
    Tensor t = DeviceTensor(kDevice, {2});
    UploadAsync(r == 0 ? std::vector<float>{1, nan} : std::vector<float>{nan, 2}, t, streams[r]);
    EXPECT_TRUE(c->AllReduce(t, ReduceOp::kMax).ok());
    got[size_t(r)] = Download<float>(t, streams[r]);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(std::isnan(got[size_t(r)][0])) << r;
    EXPECT_TRUE(std::isnan(got[size_t(r)][1])) << r;
  }
}

TEST(DeviceWorld, MissingRankTimesOutNamingItAndTheOp) {
  // Ranks 0 and 1 all-reduce on [0,1,2]; rank 2 never calls: both fail within about 0.2 s with
  // ThreadWorld's message, and the group refuses the next call.
  PTDP_SKIP_WITHOUT_GPU();
  Streams streams(kDevice, 3);
  DeviceWorld dev(3, kShortTimeoutS, kDevice, [&](int g) { return streams[g]; });
  std::vector<Status> st(3), later(3);
  RunRanks(3, [&](int r) {
    auto c = Comm(dev, r, {0, 1, 2}, "TP");
    if (r == 2) return;
    Tensor t = DeviceTensor(kDevice, {4});
    st[size_t(r)] = c->AllReduce(t, ReduceOp::kSum);
    later[size_t(r)] = c->Barrier();
  });
  for (int r = 0; r < 2; ++r) {
    const std::string& m = st[size_t(r)].message();
    EXPECT_NE(m.find("device communicator: all-reduce #1 (sum of 4 x f32) on group [0,1,2] (TP) "
                     "timed out after 0.2 s"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("rank 2 never arrived (it has not called any operation yet)"),
              std::string::npos)
        << m;
    EXPECT_NE(later[size_t(r)].message().find("barrier on group [0,1,2] (TP) refused"),
              std::string::npos);
  }
}

TEST(DeviceWorld, MismatchedCallsAreErrorsOnEveryRank) {
  PTDP_SKIP_WITHOUT_GPU();
  Streams streams(kDevice, 2);
  DeviceWorld dev(2, kTimeoutS, kDevice, [&](int g) { return streams[g]; });
  std::vector<Status> st(2);
  RunRanks(2, [&](int r) {
    auto c = Comm(dev, r, {0, 1}, "DP");
    Tensor u = DeviceTensor(kDevice, {r == 0 ? 4 : 6});
    st[size_t(r)] = c->AllReduce(u, ReduceOp::kSum);
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(st[size_t(r)].message().find("mismatched calls in collective #1 on group [0,1] (DP): "
                                           "rank 0 called all-reduce (sum of 4 x f32), rank 1 "
                                           "called all-reduce (sum of 6 x f32)"),
              std::string::npos)
        << st[size_t(r)].message();
}

TEST(DeviceWorld, AsksForEachRanksStreamAtGroupTime) {
  // Group() asks stream_of for the calling rank only (a launcher creates rank g's backend, and
  // so its stream, just before rank g's groups); a bad rank list asks for nothing.
  std::vector<int> asked;
  DeviceWorld dev(4, kTimeoutS, kDevice, [&](int g) {
    asked.push_back(g);
    return cudaStream_t(nullptr);
  });
  EXPECT_TRUE(dev.Group(2, {2, 3}, "TP").ok());
  EXPECT_FALSE(dev.Group(5, {5}, "TP").ok());
  EXPECT_FALSE(dev.Group(1, {2, 3}, "TP").ok());
  EXPECT_EQ(asked, (std::vector<int>{2}));
}

}  // namespace
}  // namespace ptdp::rt::cuda
