// NcclWorld on the visible GPUs of this machine (one process, one thread per rank; 1 GPU gives a
// world of one rank, which still exercises init, split, every operation and the watchdog), and
// the pieces that need no GPU: the split plan of RankGrid's groups and the option checks. The GPU
// tests skip with a message when none is visible.
#include "runtime/cuda/nccl_world.h"

#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/rank_grid.h"
#include "tests/runtime/cuda/gpu_test_util.h"

namespace ptdp::rt::cuda {
namespace {

constexpr double kTimeoutS = 120.0;  // NCCL init can take seconds; a hang takes all of it

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

// ---- No GPU needed ------------------------------------------------------------------------

TEST(NcclSplit, RankGridGroupsGiveColorsAndGroupRanks) {
  // RankGrid(tp 2, dp 2, pp 2): TP [0,1] [2,3] [4,5] [6,7] -> rank 5 is in group 2 at index 1;
  // PP [0,4] [1,5] [2,6] [3,7] -> rank 5 in group 1 at index 1; EMB (first and last stage of
  // each pipeline, p = 2): the PP groups again.
  const RankGrid grid(2, 2, 2);
  auto tp = PlanSplit({"TP", grid.AllTpGroups()}, 8, {5, 0});
  ASSERT_TRUE(tp.ok()) << tp.status().message();
  EXPECT_EQ((*tp)[0].color, 2);
  EXPECT_EQ((*tp)[0].key, 1);
  EXPECT_EQ((*tp)[1].color, 0);
  EXPECT_EQ((*tp)[1].key, 0);
  auto pp = PlanSplit({"PP", grid.AllPpGroups()}, 8, {5});
  ASSERT_TRUE(pp.ok());
  EXPECT_EQ((*pp)[0].color, 1);
  EXPECT_EQ((*pp)[0].key, 1);
}

TEST(NcclSplit, RanksInNoGroupGetNoColor) {
  // pp 4: the embedding groups hold stages 0 and 3 only ([0,3] for one pipeline of 4 ranks);
  // the middle stages 1 and 2 take part in the split without a color.
  auto emb = PlanSplit({"EMB", {{0, 3}}}, 4, {0, 1, 2, 3});
  ASSERT_TRUE(emb.ok()) << emb.status().message();
  EXPECT_EQ((*emb)[0].color, 0);
  EXPECT_EQ((*emb)[1].color, -1);
  EXPECT_EQ((*emb)[2].color, -1);
  EXPECT_EQ((*emb)[3].color, 0);
  EXPECT_EQ((*emb)[3].key, 1);
}

TEST(NcclSplit, RefusesOverlapsEmptyGroupsAndOutsiders) {
  struct Case {
    GroupSet set;
    const char* error;
  } cases[] = {
      {{"TP", {{0, 1}, {1, 2}}}, "groups of TP: rank 1 is in two groups ([0,1] and [1,2])"},
      {{"DP", {{0}, {}}}, "groups of DP: group 1 is empty"},
      {{"PP", {{0, 4}}}, "groups of PP: rank 4 is outside the world of 4"},
      {{"X", {{0, 0}}}, "rank 0 is in two groups"},
  };
  for (const Case& c : cases) {
    auto r = PlanSplit(c.set, 4, {0});
    ASSERT_FALSE(r.ok()) << c.error;
    EXPECT_NE(r.status().message().find(c.error), std::string::npos) << r.status().message();
  }
}

TEST(NcclWorldOptions, BadOptionsAreRefusedBeforeAnyNcclCall) {
  StreamOf none;
  StreamOf some = [](int) { return cudaStream_t(nullptr); };
  struct Case {
    NcclWorldOptions o;
    const char* error;
  } cases[] = {
      {{0, {0}, {0}, {}, 1, some}, "world size must be positive"},
      {{2, {}, {}, {}, 1, some}, "no local ranks"},
      {{2, {0, 1}, {0}, {}, 1, some}, "2 local ranks but 1 devices"},
      {{2, {0}, {0}, {}, 0, some}, "timeout_s must be positive"},
      {{2, {0}, {0}, {}, 1, none}, "no stream_of"},
  };
  for (const Case& c : cases) {
    auto w = NcclWorld::Create(c.o);
    ASSERT_FALSE(w.ok()) << c.error;
    EXPECT_NE(w.status().message().find(c.error), std::string::npos) << w.status().message();
  }
}

// ---- On the visible GPUs ------------------------------------------------------------------

// A world of the visible GPUs (up to 8), one rank per GPU, all driven by this process.
struct GpuWorld {
  int n = 0;
  std::unique_ptr<Streams> streams;
  std::unique_ptr<NcclWorld> world;
};

GpuWorld MakeWorld(double timeout_s) {
  GpuWorld g;
  g.n = std::min(VisibleGpus(), 8);
  g.streams = std::make_unique<Streams>(Iota(g.n));
  auto id = NewNcclId();
  EXPECT_TRUE(id.ok()) << id.status().message();
  if (!id.ok()) return g;
  NcclWorldOptions o;
  o.world_size = g.n;
  o.local_ranks = Iota(g.n);
  o.devices = Iota(g.n);
  o.id = *id;
  o.timeout_s = timeout_s;
  Streams* s = g.streams.get();
  o.stream_of = [s](int r) { return (*s)[r]; };
  auto w = NcclWorld::Create(o);
  EXPECT_TRUE(w.ok()) << w.status().message();
  if (w.ok()) g.world = std::move(w).value();
  return g;
}

// ALL: every rank; HALF: [0..n/2) and [n/2..n) (one group when n == 1); SELF: one per rank.
std::vector<GroupSet> TestSets(int n) {
  std::vector<GroupSet> sets = {{"ALL", {Iota(n)}}, {"HALF", {}}, {"SELF", {}}};
  if (n == 1) {
    sets[1].groups = {{0}};
  } else {
    std::vector<int> lo, hi;
    for (int r = 0; r < n; ++r) (r < n / 2 ? lo : hi).push_back(r);
    sets[1].groups = {lo, hi};
  }
  for (int r = 0; r < n; ++r) sets[2].groups.push_back({r});
  return sets;
}

std::vector<int> HalfOf(int n, int r) {
  // A named copy: a range-for over a member of the temporary TestSets(n) would read it after its
  // end (C++20 extends only the range expression's own temporary).
  const std::vector<GroupSet> sets = TestSets(n);
  for (const auto& g : sets[1].groups)
    if (std::find(g.begin(), g.end(), r) != g.end()) return g;
  return {};
}

TEST(NcclWorld, EveryOperationOnTheVisibleGpus) {
  // Rank r (device r) of n: all-reduce sum of r + 1 -> n(n+1)/2 (f32 and bf16, exact); max ->
  // n; all-gather of [10r, 10r+1] -> block q = [10q, 10q+1]; reduce-scatter of the gathered
  // (2n) -> n * [10r, 10r+1]; broadcast of [7, 8, 9] from the last rank; a barrier; a ring of
  // grouped sends on ALL (100 + r to r+1); a self send/recv on SELF; an all-reduce on HALF.
  PTDP_SKIP_WITHOUT_GPU();
  GpuWorld g = MakeWorld(kTimeoutS);
  ASSERT_TRUE(g.world);
  const int n = g.n;
  Status prepared = g.world->Prepare(TestSets(n));
  ASSERT_TRUE(prepared.ok()) << prepared.message();
  std::vector<std::string> failures(static_cast<size_t>(n));
  RunRanks(n, [&](int r) {
    std::string& f = failures[size_t(r)];
    auto expect = [&](bool ok, const std::string& what) { if (!ok && f.empty()) f = what; };
    auto all = g.world->Group(r, Iota(n), "ALL");
    auto half = g.world->Group(r, HalfOf(n, r), "HALF");
    auto self = g.world->Group(r, {r}, "SELF");
    if (!all.ok() || !half.ok() || !self.ok()) {
      f = "group: " + all.status().message() + half.status().message() + self.status().message();
      return;
    }
    cudaStream_t s = (*g.streams)[r];
    Communicator& c = **all;
    Tensor a = DeviceTensor(r, {3}), m = DeviceTensor(r, {3});
    UploadAsync(std::vector<float>(3, float(r + 1)), a, s);
    UploadAsync(std::vector<float>(3, float(r + 1)), m, s);
    Status st = c.AllReduce(a, ReduceOp::kSum);
    expect(st.ok(), st.message());
    st = c.AllReduce(m, ReduceOp::kMax);
    expect(st.ok(), st.message());
    expect(Download<float>(a, s)[2] == float(n * (n + 1) / 2), "f32 sum");
    expect(Download<float>(m, s)[2] == float(n), "max");
    Tensor h = DeviceTensor(r, {4}, DType::kBF16);
    UploadAsync(std::vector<__nv_bfloat16>(4, __float2bfloat16(float(r + 1))), h, s);
    st = c.AllReduce(h, ReduceOp::kSum);
    expect(st.ok(), st.message());
    expect(__bfloat162float(Download<__nv_bfloat16>(h, s)[3]) == float(n * (n + 1) / 2),
           "bf16 sum");
    Tensor in = DeviceTensor(r, {2}), gathered = DeviceTensor(r, {2 * n}),
           scattered = DeviceTensor(r, {2});
    UploadAsync(std::vector<float>{float(10 * r), float(10 * r + 1)}, in, s);
    st = c.AllGather(in, gathered);
    expect(st.ok(), st.message());
    st = c.ReduceScatter(gathered, scattered, ReduceOp::kSum);
    expect(st.ok(), st.message());
    std::vector<float> gv = Download<float>(gathered, s), sv = Download<float>(scattered, s);
    for (int q = 0; q < n; ++q)
      expect(gv[size_t(2 * q)] == float(10 * q) && gv[size_t(2 * q + 1)] == float(10 * q + 1),
             "all-gather block " + std::to_string(q));
    expect(sv[0] == float(n * 10 * r) && sv[1] == float(n * (10 * r + 1)), "reduce-scatter");
    Tensor b = DeviceTensor(r, {3});
    if (r == n - 1) UploadAsync(std::vector<float>{7, 8, 9}, b, s);
    st = c.Broadcast(b, n - 1);
    expect(st.ok(), st.message());
    expect(Download<float>(b, s) == std::vector<float>{7, 8, 9}, "broadcast");
    st = c.Barrier();
    expect(st.ok(), st.message());
    Tensor out = DeviceTensor(r, {5}), got = DeviceTensor(r, {5});
    UploadAsync(std::vector<float>(5, float(100 + r)), out, s);
    expect(c.GroupStart().ok(), "group start");
    expect(c.Send(out, (r + 1) % n).ok(), "send");
    expect(c.Recv(got, (r + n - 1) % n).ok(), "recv");
    st = c.GroupEnd();
    expect(st.ok(), st.message());
    expect(Download<float>(got, s)[4] == float(100 + (r + n - 1) % n), "ring");
    Tensor x = DeviceTensor(r, {2}), y = DeviceTensor(r, {2});
    UploadAsync(std::vector<float>{3, 4}, x, s);
    expect((*self)->GroupStart().ok(), "self group start");
    expect((*self)->Send(x, 0).ok() && (*self)->Recv(y, 0).ok(), "self send/recv");
    st = (*self)->GroupEnd();
    expect(st.ok(), st.message());
    expect(Download<float>(y, s) == std::vector<float>{3, 4}, "self exchange");
    Tensor hv = DeviceTensor(r, {1});
    UploadAsync(std::vector<float>{1}, hv, s);
    st = (*half)->AllReduce(hv, ReduceOp::kSum);
    expect(st.ok(), st.message());
    expect(Download<float>(hv, s)[0] == float((*half)->size()), "half all-reduce");
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(failures[size_t(r)], "") << "rank " << r;
}

TEST(NcclWorld, UnpreparedGroupsAndForeignRanksAreErrors) {
  PTDP_SKIP_WITHOUT_GPU();
  GpuWorld g = MakeWorld(kTimeoutS);
  ASSERT_TRUE(g.world);
  ASSERT_TRUE(g.world->Prepare(TestSets(g.n)).ok());
  auto nope = g.world->Group(0, {0}, "NOPE");
  ASSERT_FALSE(nope.ok());
  EXPECT_NE(nope.status().message().find("group [0] (NOPE) was not prepared"), std::string::npos)
      << nope.status().message();
  Status again = g.world->Prepare({{"ALL", {Iota(g.n)}}});
  EXPECT_NE(again.message().find("groups of ALL were prepared already"), std::string::npos)
      << again.message();
}

TEST(NcclWorld, AStuckOperationTimesOutAbortsAndPoisonsTheGroup) {
  // With 2+ GPUs: rank 0 all-reduces on ALL, the others never call. With 1 GPU: a receive from
  // itself that no send matches. Either way the watchdog aborts after the 2 s timeout, the error
  // names the operation and the group, and the next call on the group is refused.
  PTDP_SKIP_WITHOUT_GPU();
  GpuWorld g = MakeWorld(2.0);
  ASSERT_TRUE(g.world);
  ASSERT_TRUE(g.world->Prepare(TestSets(g.n)).ok());
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < g.n; ++r) {
    auto c = g.world->Group(r, Iota(g.n), "ALL");
    ASSERT_TRUE(c.ok()) << c.status().message();
    comms.push_back(std::move(c).value());
  }
  Tensor t = DeviceTensor(0, {4});
  const auto t0 = std::chrono::steady_clock::now();
  Status st = g.n > 1 ? comms[0]->AllReduce(t, ReduceOp::kSum) : comms[0]->Recv(t, 0);
  const double elapsed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(st.ok());
  EXPECT_LT(elapsed_s, 30.0);
  const std::string want = g.n > 1 ? "all-reduce #1 (sum of 4 x f32) at rank 0 on group"
                                   : "recv #1 from rank 0 (4 x f32)";
  EXPECT_NE(st.message().find(want), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("(ALL)"), std::string::npos) << st.message();
  if (g.n > 1) {
    EXPECT_NE(st.message().find("timed out after 2 s"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("rank 1 has not called any operation yet"), std::string::npos)
        << st.message();
  }
  Status later = comms[0]->Barrier();
  EXPECT_NE(later.message().find("refused: the group failed earlier"), std::string::npos)
      << later.message();
}

}  // namespace
}  // namespace ptdp::rt::cuda
