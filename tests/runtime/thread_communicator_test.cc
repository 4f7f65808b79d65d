// The thread communicator: every collective and p2p pattern the runtime uses, on 2 to 8 rank
// threads, with hand-checkable values; rank-order (bit-identical) reductions; and the failures
// that must come back as errors, quickly, instead of hangs (a missing rank, mismatched calls).
#include "runtime/cpu/thread_communicator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/rank_grid.h"

namespace ptdp::rt {
namespace {

constexpr double kTimeoutS = 5.0;       // for tests that must not time out
constexpr double kShortTimeoutS = 0.2;  // for tests that must

// A host f32 tensor over new[]'d memory (no Backend needed), filled with `values` if given.
Tensor HostTensor(Shape shape, const std::vector<float>& values = {}) {
  size_t n = size_t(shape.numel());
  auto buf = std::make_shared<Buffer>(new float[n](), n * sizeof(float),
                                      [](void* p, size_t) { delete[] static_cast<float*>(p); });
  Tensor t(buf, shape, DType::kF32);
  if (!values.empty()) {
    EXPECT_EQ(values.size(), n);
    std::memcpy(t.data(), values.data(), n * sizeof(float));
  }
  return t;
}

std::vector<float> Values(const Tensor& t) {
  const float* p = t.data_as<float>();
  return std::vector<float>(p, p + t.numel());
}

// Runs fn(global_rank) on one thread per rank and joins them.
void RunRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

std::vector<int> Iota(int n, int first = 0) {
  std::vector<int> v;
  for (int r = 0; r < n; ++r) v.push_back(first + r);
  return v;
}

std::unique_ptr<Communicator> Comm(ThreadWorld& w, int rank, const std::vector<int>& ranks,
                                   const std::string& label = "G") {
  auto c = w.Group(rank, ranks, label);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? std::move(c).value() : nullptr;
}

class ThreadCommN : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(Ranks, ThreadCommN, ::testing::Values(2, 3, 4, 8));

TEST_P(ThreadCommN, AllReduceSumAndMax) {
  // Rank r contributes x[e] = (r + 1) * (e + 1) for e < 7 (7 elements: blocks of uneven size).
  // Sum over r: (e + 1) * n(n+1)/2. Max: (e + 1) * n.
  int n = GetParam();
  ThreadWorld world(n, kTimeoutS);
  std::vector<std::vector<float>> sum(static_cast<size_t>(n)), max(static_cast<size_t>(n));
  std::vector<Status> st(static_cast<size_t>(n));
  RunRanks(n, [&](int r) {
    auto c = Comm(world, r, Iota(n));
    std::vector<float> x;
    for (int e = 0; e < 7; ++e) x.push_back(float((r + 1) * (e + 1)));
    Tensor a = HostTensor({7}, x), b = HostTensor({7}, x);
    Status s1 = c->AllReduce(a, ReduceOp::kSum);
    Status s2 = c->AllReduce(b, ReduceOp::kMax);
    st[size_t(r)] = s1.ok() ? s2 : s1;
    sum[size_t(r)] = Values(a);
    max[size_t(r)] = Values(b);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(st[size_t(r)].ok()) << st[size_t(r)].message();
    for (int e = 0; e < 7; ++e) {
      EXPECT_EQ(sum[size_t(r)][size_t(e)], float((e + 1) * n * (n + 1) / 2)) << r << " " << e;
      EXPECT_EQ(max[size_t(r)][size_t(e)], float((e + 1) * n)) << r << " " << e;
    }
  }
}

TEST_P(ThreadCommN, AllGatherThenReduceScatterRoundTrip) {
  // Rank r holds in = (2, 3) with in[k] = 10r + k. All-gather gives G = (2n, 3), block r = rank
  // r's in. Reduce-scatter of G (the same on every rank) gives block r summed n times: n * in.
  int n = GetParam();
  ThreadWorld world(n, kTimeoutS);
  std::vector<std::vector<float>> gathered(static_cast<size_t>(n));
  std::vector<std::vector<float>> scattered(static_cast<size_t>(n));
  std::vector<Status> st(static_cast<size_t>(n));
  RunRanks(n, [&](int r) {
    auto c = Comm(world, r, Iota(n));
    std::vector<float> x;
    for (int k = 0; k < 6; ++k) x.push_back(float(10 * r + k));
    Tensor in = HostTensor({2, 3}, x), g = HostTensor({2 * n, 3}), out = HostTensor({2, 3});
    Status s1 = c->AllGather(in, g);
    Status s2 = c->ReduceScatter(g, out, ReduceOp::kSum);
    st[size_t(r)] = s1.ok() ? s2 : s1;
    gathered[size_t(r)] = Values(g);
    scattered[size_t(r)] = Values(out);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(st[size_t(r)].ok()) << st[size_t(r)].message();
    for (int q = 0; q < n; ++q)
      for (int k = 0; k < 6; ++k)
        EXPECT_EQ(gathered[size_t(r)][size_t(6 * q + k)], float(10 * q + k));
    for (int k = 0; k < 6; ++k)
      EXPECT_EQ(scattered[size_t(r)][size_t(k)], float(n * (10 * r + k)));
  }
}

TEST_P(ThreadCommN, AllToAllWithPerPeerCounts) {
  // Rank r sends c(r, j) = (r + 2 j) % 3 elements to rank j (zeros included, its own block too),
  // each of value 100 r + j; rank j receives them in rank order.
  int n = GetParam();
  ThreadWorld world(n, kTimeoutS);
  auto count = [](int r, int j) { return int64_t((r + 2 * j) % 3); };
  std::vector<std::vector<float>> got(static_cast<size_t>(n));
  std::vector<Status> st(static_cast<size_t>(n));
  RunRanks(n, [&](int r) {
    auto c = Comm(world, r, Iota(n));
    std::vector<int64_t> send, recv;
    std::vector<float> x;
    for (int j = 0; j < n; ++j) {
      send.push_back(count(r, j));
      recv.push_back(count(j, r));
      for (int64_t k = 0; k < count(r, j); ++k) x.push_back(float(100 * r + j));
    }
    int64_t total = 0;
    for (int64_t v : recv) total += v;
    Tensor in = HostTensor({int64_t(x.size()) > 0 ? int64_t(x.size()) : 1},
                           x.empty() ? std::vector<float>{0} : x);
    if (x.empty()) in = in.View({0});
    Tensor out = HostTensor({total > 0 ? total : 1});
    if (total == 0) out = out.View({0});
    st[size_t(r)] = c->AllToAll(in, send, out, recv);
    got[size_t(r)] = total > 0 ? Values(out) : std::vector<float>{};
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(st[size_t(r)].ok()) << st[size_t(r)].message();
    std::vector<float> want;
    for (int j = 0; j < n; ++j)
      for (int64_t k = 0; k < count(j, r); ++k) want.push_back(float(100 * j + r));
    EXPECT_EQ(got[size_t(r)], want) << "rank " << r;
  }
}

TEST(ThreadComm, AllToAllRefusesCountsThatDoNotFit) {
  ThreadWorld world(2, kTimeoutS);
  std::vector<Status> st(2);
  RunRanks(2, [&](int r) {
    auto c = Comm(world, r, Iota(2));
    Tensor in = HostTensor({4}), out = HostTensor({4});
    st[size_t(r)] = c->AllToAll(in, {2, 1}, out, {2, 2});  // 3 sent from 4 elements
  });
  for (const Status& s : st) {
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("all-to-all on G"), std::string::npos) << s.message();
  }
}

TEST_P(ThreadCommN, InPlaceAllGather) {
  // `in` is this rank's slot of `out`, as NCCL allows: out = [0, 1, ..., n-1].
  int n = GetParam();
  ThreadWorld world(n, kTimeoutS);
  std::vector<std::vector<float>> got(static_cast<size_t>(n));
  RunRanks(n, [&](int r) {
    auto c = Comm(world, r, Iota(n));
    Tensor out = HostTensor({n});
    Tensor mine = out.View({1}, r);
    mine.data_as<float>()[0] = float(r);
    EXPECT_TRUE(c->AllGather(mine, out).ok());
    got[size_t(r)] = Values(out);
  });
  for (int r = 0; r < n; ++r)
    for (int q = 0; q < n; ++q) EXPECT_EQ(got[size_t(r)][size_t(q)], float(q));
}

TEST_P(ThreadCommN, BroadcastFromLastRank) {
  // Root n-1 holds [7, 8, 9]; the others start at zero and end with the root's values.
  int n = GetParam();
  ThreadWorld world(n, kTimeoutS);
  std::vector<std::vector<float>> got(static_cast<size_t>(n));
  RunRanks(n, [&](int r) {
    auto c = Comm(world, r, Iota(n));
    Tensor t = r == n - 1 ? HostTensor({3}, {7, 8, 9}) : HostTensor({3});
    EXPECT_TRUE(c->Broadcast(t, n - 1).ok());
    got[size_t(r)] = Values(t);
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(got[size_t(r)], (std::vector<float>{7, 8, 9}));
}

TEST_P(ThreadCommN, BarrierWaitsForEveryRank) {
  // Every rank counts itself in before the barrier, so after it every rank sees n.
  int n = GetParam();
  ThreadWorld world(n, kTimeoutS);
  std::atomic<int> in{0};
  std::vector<int> seen(static_cast<size_t>(n));
  RunRanks(n, [&](int r) {
    auto c = Comm(world, r, Iota(n));
    std::this_thread::sleep_for(std::chrono::milliseconds(r));
    ++in;
    EXPECT_TRUE(c->Barrier().ok());
    seen[size_t(r)] = in.load();
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(seen[size_t(r)], n);
}

TEST(ThreadComm, SumsInRankOrderBitIdentically) {
  // fp32 rounds 1e8 + 1 to 1e8 (spacing 8 there), so the order of the terms decides the result:
  //   element 0: ranks give 1e8, -1e8, 1  ->  (1e8 - 1e8) + 1 = 1
  //   element 1: ranks give 1e8, 1, -1e8  ->  (1e8 + 1) - 1e8 = 0
  // Rank order holds whatever order the threads arrive in (staggered differently each round).
  const float v[3][2] = {{1e8f, 1e8f}, {-1e8f, 1.0f}, {1.0f, -1e8f}};
  ThreadWorld world(3, kTimeoutS);
  std::vector<std::vector<float>> got(3 * 20);
  RunRanks(3, [&](int r) {
    auto c = Comm(world, r, Iota(3));
    for (int round = 0; round < 20; ++round) {
      std::this_thread::sleep_for(std::chrono::microseconds(((r + round) % 3) * 300));
      Tensor t = HostTensor({2}, {v[r][0], v[r][1]});
      EXPECT_TRUE(c->AllReduce(t, ReduceOp::kSum).ok());
      got[size_t(3 * round + r)] = Values(t);
    }
  });
  for (const auto& g : got) EXPECT_EQ(g, (std::vector<float>{1.0f, 0.0f}));
}

TEST(ThreadComm, RandomSumsEqualTheRankOrderSumOnEveryRank) {
  // 8 ranks, 1000 random values each: every rank's result equals, bit for bit, the sum
  // computed here in rank order ((x0 + x1) + x2) + ...
  const int n = 8, len = 1000;
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-1e4f, 1e4f);
  std::vector<std::vector<float>> x(n, std::vector<float>(len));
  for (auto& xr : x)
    for (float& e : xr) e = dist(rng);
  std::vector<float> expect = x[0];
  for (int r = 1; r < n; ++r)
    for (int e = 0; e < len; ++e) expect[size_t(e)] += x[size_t(r)][size_t(e)];
  ThreadWorld world(n, kTimeoutS);
  std::vector<std::vector<float>> got(n);
  RunRanks(n, [&](int r) {
    auto c = Comm(world, r, Iota(n));
    Tensor t = HostTensor({len}, x[size_t(r)]);
    EXPECT_TRUE(c->AllReduce(t, ReduceOp::kSum).ok());
    got[size_t(r)] = Values(t);
  });
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(std::memcmp(got[size_t(r)].data(), expect.data(), len * sizeof(float)), 0) << r;
}

TEST(ThreadComm, SendRecvPingPong) {
  // Rank 0 sends v, rank 1 adds 1 and sends it back; 10 rounds from 0 leave 10 * 2 = 20 on
  // rank 0 (rank 0 adds 1 too).
  ThreadWorld world(2, kTimeoutS);
  float final_value = -1;
  RunRanks(2, [&](int r) {
    auto c = Comm(world, r, {0, 1}, "PP");
    Tensor t = HostTensor({1}, {0.0f});
    for (int round = 0; round < 10; ++round) {
      if (r == 0) {
        EXPECT_TRUE(c->Send(t, 1).ok());
        EXPECT_TRUE(c->Recv(t, 1).ok());
        t.data_as<float>()[0] += 1;
      } else {
        EXPECT_TRUE(c->Recv(t, 0).ok());
        t.data_as<float>()[0] += 1;
        EXPECT_TRUE(c->Send(t, 0).ok());
      }
    }
    if (r == 0) final_value = t.data_as<float>()[0];
  });
  EXPECT_EQ(final_value, 20.0f);
}

TEST(ThreadComm, GroupedExchangeWhereBothPeersSendFirst) {
  // Both ranks send, then receive, inside one group: no deadlock; each gets the other's 10 + r.
  ThreadWorld world(2, kTimeoutS);
  std::vector<float> got(2);
  RunRanks(2, [&](int r) {
    auto c = Comm(world, r, {0, 1}, "PP");
    Tensor mine = HostTensor({4}, std::vector<float>(4, float(10 + r))), theirs = HostTensor({4});
    EXPECT_TRUE(c->GroupStart().ok());
    EXPECT_TRUE(c->Send(mine, 1 - r).ok());
    EXPECT_TRUE(c->Recv(theirs, 1 - r).ok());
    Status s = c->GroupEnd();
    EXPECT_TRUE(s.ok()) << s.message();
    got[size_t(r)] = theirs.data_as<float>()[3];
  });
  EXPECT_EQ(got, (std::vector<float>{11, 10}));
}

TEST(ThreadComm, UngroupedSendFirstOnBothPeersTimesOutLikeNccl) {
  // The NCCL rule: Send blocks until received, so two peers that both send first wait for each
  // other. Here that is an error naming the send, not a hang.
  ThreadWorld world(2, kShortTimeoutS);
  std::vector<Status> st(2);
  RunRanks(2, [&](int r) {
    auto c = Comm(world, r, {0, 1}, "PP");
    Tensor t = HostTensor({2});
    st[size_t(r)] = c->Send(t, 1 - r);
    if (st[size_t(r)].ok()) st[size_t(r)] = c->Recv(t, 1 - r);
  });
  for (const Status& s : st) {
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("send #1 to rank"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("never received it"), std::string::npos) << s.message();
  }
}

TEST(ThreadComm, RingOfGroupedSendsOnGlobalRanks4To7) {
  // Group [4,5,6,7] of an 8-rank world (peers are group ranks): each sends 100 + its global
  // rank to the next and receives from the previous, 3 times, posting the recv first.
  ThreadWorld world(8, kTimeoutS);
  std::vector<float> got(8, -1);
  RunRanks(8, [&](int g) {
    if (g < 4) return;
    auto c = Comm(world, g, {4, 5, 6, 7}, "PP");
    int i = c->rank(), next = (i + 1) % 4, prev = (i + 3) % 4;
    for (int round = 0; round < 3; ++round) {
      Tensor out = HostTensor({1}, {float(100 + g)}), in = HostTensor({1});
      EXPECT_TRUE(c->GroupStart().ok());
      EXPECT_TRUE(c->Recv(in, prev).ok());
      EXPECT_TRUE(c->Send(out, next).ok());
      EXPECT_TRUE(c->GroupEnd().ok());
      got[size_t(g)] = in.data_as<float>()[0];
    }
  });
  EXPECT_EQ(got, (std::vector<float>{-1, -1, -1, -1, 107, 104, 105, 106}));
}

TEST(ThreadComm, SelfSendInsideAGroup) {
  // As in NCCL, a rank may send to itself inside a group (a 1-rank PP group's boundary).
  ThreadWorld world(1, kTimeoutS);
  auto c = Comm(world, 0, {0});
  Tensor a = HostTensor({2}, {3, 4}), b = HostTensor({2});
  ASSERT_TRUE(c->GroupStart().ok());
  ASSERT_TRUE(c->Send(a, 0).ok());
  ASSERT_TRUE(c->Recv(b, 0).ok());
  ASSERT_TRUE(c->GroupEnd().ok());
  EXPECT_EQ(Values(b), (std::vector<float>{3, 4}));
  ASSERT_TRUE(c->AllReduce(b, ReduceOp::kSum).ok());  // a 1-rank group: identity
  EXPECT_EQ(Values(b), (std::vector<float>{3, 4}));
}

TEST(ThreadComm, ConcurrentTpDpPpAndEmbeddingGroupsOfRankGrid222) {
  // RankGrid(2,2,2): TP [0,1] [2,3] [4,5] [6,7]; DP [0,2] [1,3] [4,6] [5,7]; PP [0,4] ...;
  // embedding = PP here (first and last stage) but an independent group by label.
  // Rank g contributes g + 1 + round; a group's sum is the sum over its members.
  const RankGrid grid(2, 2, 2);
  ThreadWorld world(grid.world(), kTimeoutS);
  std::atomic<int> failures{0};
  RunRanks(grid.world(), [&](int g) {
    std::vector<std::vector<int>> groups = {grid.TpGroup(g), grid.DpGroup(g), grid.PpGroup(g),
                                            grid.EmbeddingGroup(g)};
    const char* labels[] = {"TP", "DP", "PP", "EMB"};
    std::vector<std::unique_ptr<Communicator>> comms;
    for (size_t k = 0; k < groups.size(); ++k)
      comms.push_back(Comm(world, g, groups[k], labels[k]));
    for (int round = 0; round < 25; ++round) {
      for (size_t k = 0; k < groups.size(); ++k) {
        Tensor t = HostTensor({3}, std::vector<float>(3, float(g + 1 + round)));
        float expect = 0;
        for (int m : groups[k]) expect += float(m + 1 + round);
        Status s = comms[k]->AllReduce(t, ReduceOp::kSum);
        if (!s.ok() || t.data_as<float>()[2] != expect) ++failures;
      }
    }
  });
  EXPECT_EQ(failures.load(), 0);
}

TEST(ThreadComm, MissingRankTimesOutNamingItAndTheOp) {
  // Ranks 0 and 1 all-reduce on [0,1,2]; rank 2 never calls. Both get an error within about
  // the 0.2 s timeout, and the group refuses later calls at once.
  ThreadWorld world(3, kShortTimeoutS);
  std::vector<Status> st(3), later(3);
  auto start = std::chrono::steady_clock::now();
  RunRanks(3, [&](int r) {
    auto c = Comm(world, r, {0, 1, 2}, "TP");
    if (r == 2) return;
    Tensor t = HostTensor({4});
    st[size_t(r)] = c->AllReduce(t, ReduceOp::kSum);
    later[size_t(r)] = c->Barrier();
  });
  double elapsed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(elapsed_s, 2.0);
  for (int r = 0; r < 2; ++r) {
    const std::string& m = st[size_t(r)].message();
    EXPECT_FALSE(st[size_t(r)].ok());
    EXPECT_NE(m.find("all-reduce #1 (sum of 4 x f32) on group [0,1,2] (TP) timed out after 0.2 s"),
              std::string::npos) << m;
    EXPECT_NE(m.find("ranks 0, 1 arrived"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 2 never arrived (it has not called any operation yet)"),
              std::string::npos) << m;
    EXPECT_FALSE(later[size_t(r)].ok());
    EXPECT_NE(later[size_t(r)].message().find("barrier on group [0,1,2] (TP) refused"),
              std::string::npos) << later[size_t(r)].message();
  }
}

TEST(ThreadComm, TimeoutSaysWhereTheMissingRankIsStuck) {
  // Rank 1 all-reduces on TP [0,1]; rank 0 is stuck receiving on PP [0,2] from rank 2, which
  // never sends. Rank 1's error says where rank 0 waits; rank 0's says rank 2 never sent.
  ThreadWorld world(3, kShortTimeoutS);
  std::vector<Status> st(3);
  RunRanks(3, [&](int r) {
    auto tp = r < 2 ? Comm(world, r, {0, 1}, "TP") : nullptr;
    auto pp = r != 1 ? Comm(world, r, {0, 2}, "PP") : nullptr;
    Tensor t = HostTensor({2});
    if (r == 0) {  // starts later, so that rank 1 times out while rank 0 still waits
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      st[0] = pp->Recv(t, 1);
    }
    if (r == 1) st[1] = tp->AllReduce(t, ReduceOp::kSum);
  });
  EXPECT_NE(st[1].message().find("rank 0 never arrived (it is waiting in recv #1 from rank 2 on "
                                 "group [0,2] (PP))"),
            std::string::npos)
      << st[1].message();
  EXPECT_NE(st[0].message().find("recv #1 from rank 2 (2 x f32) at rank 0 on group [0,2] (PP) "
                                 "timed out after 0.2 s: rank 2 never sent it"),
            std::string::npos)
      << st[0].message();
}

TEST(ThreadComm, MismatchedCollectivesAreErrorsOnBothRanks) {
  // Rank 0 all-reduces, rank 1 all-gathers; then, on a fresh group, both all-reduce but with
  // 4 and 6 elements. Each is an error naming both calls, on every rank, without waiting for
  // the timeout.
  ThreadWorld world(2, kTimeoutS);
  std::vector<Status> kind(2), count(2);
  auto start = std::chrono::steady_clock::now();
  RunRanks(2, [&](int r) {
    auto a = Comm(world, r, {0, 1}, "TP");
    auto b = Comm(world, r, {0, 1}, "DP");
    Tensor t = HostTensor({4}), g = HostTensor({8});
    kind[size_t(r)] = r == 0 ? a->AllReduce(t, ReduceOp::kSum) : a->AllGather(t, g);
    Tensor u = HostTensor({r == 0 ? 4 : 6});
    count[size_t(r)] = b->AllReduce(u, ReduceOp::kSum);
  });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2.0);
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(kind[size_t(r)].message().find(
                  "mismatched calls in collective #1 on group [0,1] (TP): rank 0 called "
                  "all-reduce (sum of 4 x f32), rank 1 called all-gather (4 x f32)"),
              std::string::npos)
        << kind[size_t(r)].message();
    EXPECT_NE(count[size_t(r)].message().find("rank 0 called all-reduce (sum of 4 x f32), rank 1 "
                                              "called all-reduce (sum of 6 x f32)"),
              std::string::npos)
        << count[size_t(r)].message();
  }
}

TEST(ThreadComm, BadArgumentsFailTheGroupForEveryRank) {
  // Rank 0 passes an all-gather output of the wrong size: it gets the reason at once, and rank
  // 1, already waiting, gets the same message instead of waiting out the timeout.
  ThreadWorld world(2, kTimeoutS);
  std::vector<Status> st(2);
  auto start = std::chrono::steady_clock::now();
  RunRanks(2, [&](int r) {
    auto c = Comm(world, r, {0, 1}, "TP");
    Tensor in = HostTensor({2}), out = HostTensor({r == 0 ? 3 : 4});
    if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    st[size_t(r)] = c->AllGather(in, out);
  });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2.0);
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(st[size_t(r)].message().find(
                  "rank 0: all-gather on group [0,1] (TP): out (3) f32 is not 2 x in (2) f32"),
              std::string::npos)
        << st[size_t(r)].message();
}

TEST(ThreadComm, RecvOfTheWrongSizeIsAnError) {
  ThreadWorld world(2, kTimeoutS);
  std::vector<Status> st(2);
  RunRanks(2, [&](int r) {
    auto c = Comm(world, r, {0, 1}, "PP");
    Tensor t = HostTensor({r == 0 ? 4 : 5});
    st[size_t(r)] = r == 0 ? c->Send(t, 1) : c->Recv(t, 0);
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(st[size_t(r)].message().find(
                  "recv #1 from rank 0 (5 x f32) at rank 1 on group [0,1] (PP): "
                  "rank 0 sent 4 x f32"),
              std::string::npos)
        << st[size_t(r)].message();
}

TEST(ThreadComm, GroupRejectsBadRankLists) {
  ThreadWorld world(4, kTimeoutS);
  struct Case {
    int rank;
    std::vector<int> ranks;
    const char* error;
  } cases[] = {
      {0, {}, "no ranks"},
      {0, {0, 4}, "rank 4 is outside the world of 4"},
      {0, {0, 1, 0}, "rank 0 appears twice"},
      {2, {0, 1}, "the calling rank 2 is not a member"},
  };
  for (const Case& c : cases) {
    auto r = world.Group(c.rank, c.ranks, "TP");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find(c.error), std::string::npos) << r.status().message();
  }
  auto ok = world.Group(3, {1, 3}, "DP");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)->rank(), 1);
  EXPECT_EQ((*ok)->size(), 2);
  EXPECT_EQ((*ok)->label(), "DP");
}

}  // namespace
}  // namespace ptdp::rt
