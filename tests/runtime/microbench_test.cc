// The microbenchmarks on the CPU backend and thread communicator, on tiny grids: every table is
// measured with positive times, bigger work takes longer, and what the backend's attention saves
// is read from AttentionSavedShape (P, s x s per head, on the CPU). The worlds come from one
// factory with their ranks' backends: which worlds are asked for, that each is prepared before
// its groups, that each rank takes its backend once, and that a failing factory's reason comes
// back.
#include "runtime/microbench.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <set>
#include <string>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/forwarding_backend.h"
#include "runtime/cpu/thread_communicator.h"

namespace ptdp::rt {
namespace {

// ThreadWorld over `ranks` ranks with a CpuBackend per rank: the CPU placement of cli/launch.
Result<BenchWorld> CpuWorld(int ranks) {
  BenchWorld w;
  w.comms = std::make_shared<ThreadWorld>(ranks, 30.0);
  w.backends = [](int) { return std::make_unique<CpuBackend>(); };
  return w;
}

// Worlds of one rank whose backend `make` builds (the ops-only benchmarks ask for no other).
template <typename Make>
MakeWorld OneRankWorld(Make make) {
  return [make](int) -> Result<BenchWorld> {
    BenchWorld w;
    w.comms = std::make_shared<ThreadWorld>(1, 30.0);
    w.backends = [make](int) -> std::unique_ptr<Backend> { return make(); };
    return w;
  };
}

// A ThreadWorld that records Prepare() and Group() calls.
class RecordingWorld : public CommunicatorFactory {
 public:
  explicit RecordingWorld(int ranks) : inner_(ranks, 30.0) {}
  int world_size() const override { return inner_.world_size(); }
  Status Prepare(const std::vector<GroupSet>& sets) override {
    std::lock_guard<std::mutex> lk(mu_);
    for (const GroupSet& s : sets) prepared_.insert(s.label);
    return Status::Ok();
  }
  Result<std::unique_ptr<Communicator>> Group(int rank, const std::vector<int>& ranks,
                                              const std::string& label) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!prepared_.count(label)) unprepared_ = true;
    }
    return inner_.Group(rank, ranks, label);
  }
  bool unprepared() const { return unprepared_; }

 private:
  ThreadWorld inner_;
  std::mutex mu_;
  std::set<std::string> prepared_;
  bool unprepared_ = false;  // a group asked for before Prepare announced its label
};

MicrobenchOptions Tiny() {
  MicrobenchOptions opt;
  opt.min_batch_s = 1e-4;
  MicrobenchGrids g;
  g.gemm_dims = {16, 128};
  g.attention_s = {16, 64};
  g.attention_d = {16};
  g.row_rows = {16, 64};
  g.row_cols = {16, 64};
  g.elements = {64, 65536};
  g.gelu_sigma = {0.25, 1};
  g.alloc_bytes = {256, 65536};
  g.comm_ranks = {2};
  g.comm_bytes = {32, 65536};
  opt.grids = g;
  return opt;
}

TEST(Microbench, MeasuresEveryTableOnTheCpuBackend) {
  int calls = 0;
  double last = 0;
  auto m = RunMicrobenchmarks(
      CpuWorld, Tiny(), [&](double fraction, const std::string& what) {
        ++calls;
        EXPECT_GE(fraction, last) << what;
        last = fraction;
      });
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_TRUE(m->CheckComplete("test").ok());
  EXPECT_EQ(last, 1.0);
  EXPECT_GT(calls, 8);
  for (const auto& [name, t] : m->tables)
    for (double s : t.seconds()) EXPECT_GT(s, 0) << name;
  // 128^3 is 512x the FLOPs of 16^3: far slower. The 16^3 cell is timed for ~0.3 ms in all, so
  // one preemption of a millisecond (ctest -j on 2 cores) can inflate it 100x (seen once: 51 us
  // against 0.6 us): then a second, independent run decides; both hit is the failure.
  auto ratio = [](const MeasuredPrimitives& p) {
    const MeasuredTable& g = *p.Table("gemm_nt");
    return g.Seconds(128, 128, 128) / g.Seconds(16, 16, 16);
  };
  double best = ratio(*m);
  if (best <= 20) {
    auto again = RunMicrobenchmarks(CpuWorld, Tiny(), nullptr);
    ASSERT_TRUE(again.ok()) << again.status().message();
    best = std::max(best, ratio(*again));
  }
  EXPECT_GT(best, 20);
  const MeasuredTable& c = *m->Table("copy");
  EXPECT_GT(c.Seconds(65536), c.Seconds(64));
  // The CPU backend saves the probabilities: one element per score, none per token.
  EXPECT_DOUBLE_EQ(m->attention_saved_per_score, 1);
  EXPECT_DOUBLE_EQ(m->attention_saved_per_token, 0);
  EXPECT_DOUBLE_EQ(m->element_bytes, 4);
  EXPECT_EQ(m->Table("all_reduce")->axis_values()[0], std::vector<double>{2});
  // The CPU backend runs a GEMM's bias and GeLU as kernels of their own (timed by bias_add and
  // gelu_forward): no epilogue GEMM tables. Its residual kernels are timed as called.
  EXPECT_EQ(m->Table("gemm_nt_bias"), nullptr);
  EXPECT_EQ(m->Table("gemm_nt_bias_gelu"), nullptr);
  EXPECT_EQ(m->Table("gemm_nn_dgelu"), nullptr);
  EXPECT_NE(m->Table("bias_residual"), nullptr);
  EXPECT_NE(m->Table("bias_residual_layernorm"), nullptr);
}

// The speed probe of `ptdp train`: ops only (no world of several ranks is asked for, no
// collective table), and each probe point lies on both the quick and the full grids, so that
// compare holds it against a measured point of either calibration, not an interpolation.
TEST(Microbench, TheSpeedProbeTimesOpsOnlyAtPointsOfEveryCalibration) {
  MicrobenchOptions opt = Tiny();
  opt.grids = SpeedProbeGrids();
  opt.ops_only = true;
  std::set<int> worlds;
  auto m = RunMicrobenchmarks(
      [&](int ranks) {
        worlds.insert(ranks);
        return CpuWorld(ranks);
      },
      opt, nullptr);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(worlds, std::set<int>{1});
  for (const char* comm : {"all_reduce", "all_gather", "reduce_scatter", "send_recv",
                           "ring_exchange", "all_to_all"})
    EXPECT_EQ(m->Table(comm), nullptr) << comm;
  for (const char* op : {"gemm_nt", "gemm_nn", "gemm_tn", "attention_forward",
                         "attention_block_backward", "layernorm_backward", "gelu_forward", "adamw",
                         "alloc"})
    ASSERT_NE(m->Table(op), nullptr) << op;
  for (bool device : {false, true}) {
    for (bool quick : {true, false}) {
      SCOPED_TRACE(device ? "device" : "cpu");
      const MicrobenchGrids probe = SpeedProbeGrids(device);
      MicrobenchOptions o;
      o.quick = quick;
      o.device = device;
      const MicrobenchGrids g = GridsFor(o);
      EXPECT_EQ(probe.attention_heads, g.attention_heads);  // per (batch, head) as calibrated
      auto within = [&](const std::vector<double>& sub, const std::vector<double>& all,
                        const char* what) {
        for (double v : sub)
          EXPECT_NE(std::find(all.begin(), all.end(), v), all.end())
              << what << " " << v << (quick ? " (quick)" : " (full)");
      };
      within(probe.gemm_dims, g.gemm_dims, "gemm");
      within(probe.attention_s, g.attention_s, "attention s");
      within(probe.attention_d, g.attention_d, "attention d");
      within(probe.row_rows, g.row_rows, "rows");
      within(probe.row_cols, g.row_cols, "cols");
      within(probe.elements, g.elements, "elements");
      within(probe.gelu_sigma, g.gelu_sigma, "sigma");
      within(probe.alloc_bytes, g.alloc_bytes, "alloc");
    }
  }
}

// A GPU's grids reach the sizes of a training step (GPT-2 medium at micro-batch 8 on one GPU:
// GEMMs of 8192 tokens x 1024..4096, attention at s 1024 over 128 (batch, head)s, LayerNorm
// over (8192, 1024), logits (8192, 50304), 700 MB of gradients to reduce), where its efficiency
// has levelled off: beyond the grid a table scales its largest point's rate. The CPU's grids
// stay small (one core is at its rate from a few hundred).
TEST(Microbench, DeviceGridsReachATrainingStepsSizes) {
  for (bool quick : {true, false}) {
    SCOPED_TRACE(quick ? "quick" : "full");
    MicrobenchOptions o;
    o.quick = quick;
    const MicrobenchGrids cpu = GridsFor(o);
    o.device = true;
    const MicrobenchGrids gpu = GridsFor(o);
    auto top = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
    EXPECT_GE(top(gpu.gemm_dims), 8192);
    EXPECT_GE(top(gpu.attention_s), 4096);
    EXPECT_GE(top(gpu.attention_d), 128);
    EXPECT_GE(gpu.attention_heads * 2, 128);  // with s / 64 >= 2 query tiles: 128 blocks
    EXPECT_GE(top(gpu.row_rows), 8192);
    EXPECT_GE(top(gpu.row_cols), 16384);
    EXPECT_GE(top(gpu.elements), 32.0 * (1 << 20));
    EXPECT_GE(top(gpu.comm_bytes), 64.0 * (1 << 20));
    EXPECT_LE(top(cpu.gemm_dims), 1024);
    EXPECT_EQ(cpu.attention_heads, 4);
  }
}

// FillFromPool copies the pool's values on the backend, in pieces of at most its length, the
// offsets inside it; bf16 targets get them rounded. Anything but an fp32 pool is refused.
TEST(Microbench, FillFromPoolCopiesThePoolsValues) {
  CpuBackend be;
  const std::vector<float> values = {0.1f,  -0.2f, 0.3f,  -0.4f, 0.5f,
                                     -0.6f, 0.7f,  -0.8f, 0.9f,  -1.0f};
  Tensor pool = *be.Alloc({10}, DType::kF32);
  ASSERT_TRUE(be.CopyFromHost(values.data(), pool).ok());
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int64_t n : {1, 7, 10, 25}) {
      SCOPED_TRACE(std::to_string(n));
      Tensor t = *be.Alloc({n}, dt);
      ASSERT_TRUE(FillFromPool(be, pool, 3, t).ok());
      std::vector<float> got(static_cast<size_t>(n));
      ASSERT_TRUE(be.CopyToHost(t, got.data()).ok());
      for (int64_t off = 0; off < n; off += 10) {
        // Each piece is a run of consecutive pool values.
        const auto first = std::find_if(values.begin(), values.end(), [&](float v) {
          return std::fabs(v - got[size_t(off)]) <= 0.01f;
        });
        ASSERT_NE(first, values.end());
        const size_t start = size_t(first - values.begin());
        for (int64_t i = off; i < std::min(n, off + 10); ++i) {
          ASSERT_LT(start + size_t(i - off), values.size());
          EXPECT_NEAR(got[size_t(i)], values[start + size_t(i - off)],
                      dt == DType::kF32 ? 0.0 : 0.005);
        }
      }
    }
  }
  Tensor f = *be.Alloc({4}, DType::kF32);
  Tensor ints = *be.Alloc({10}, DType::kI32);
  EXPECT_FALSE(FillFromPool(be, ints, 0, f).ok());
  EXPECT_FALSE(FillFromPool(be, pool, 0, ints).ok());
}

// The device's way of filling operands, on the CPU backend: every table measured as with the
// host's streams.
TEST(Microbench, DeviceOperandsFromPoolsMeasureEveryOpTable) {
  MicrobenchOptions opt = Tiny();
  opt.device = true;
  opt.ops_only = true;
  opt.grids->attention_heads = 2;
  auto m = RunMicrobenchmarks(CpuWorld, opt, nullptr);
  ASSERT_TRUE(m.ok()) << m.status().message();
  for (const char* op : {"gemm_nt", "gemm_tn", "attention_forward", "attention_block_backward",
                         "layernorm_backward", "bias_residual_layernorm", "gelu_forward",
                         "gelu_backward", "adamw", "alloc"}) {
    ASSERT_NE(m->Table(op), nullptr) << op;
    for (double s : m->Table(op)->seconds()) EXPECT_GT(s, 0) << op;
  }
}

// A bf16 run's calibration (MicrobenchOptions::act, as `calibrate --backend cuda` for bf16
// plans): every table filled with the ops on bf16 tensors (the CPU backend widens them), and the
// model told that activations take 2 bytes.
TEST(Microbench, TimesTheOpsOnBf16TensorsForBf16Runs) {
  MicrobenchOptions opt = Tiny();
  opt.act = DType::kBF16;
  auto m = RunMicrobenchmarks(CpuWorld, opt, nullptr);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_TRUE(m->CheckComplete("test").ok());
  for (const auto& [name, t] : m->tables)
    for (double s : t.seconds()) EXPECT_GT(s, 0) << name;
  EXPECT_DOUBLE_EQ(m->element_bytes, 2);
}

// The ops run on a one-rank world, the collectives on one world per group size of the grid; each
// world is prepared with the benchmark's groups before any rank asks for them (NCCL makes them
// collectively there), and each rank takes its own backend once.
TEST(Microbench, WorldsComeWithTheirRanksBackends) {
  MicrobenchOptions opt = Tiny();
  opt.grids->comm_ranks = {2, 4};
  std::mutex mu;
  std::vector<int> sizes;                    // of the worlds asked for, in order
  std::vector<std::vector<int>> taken;       // backends taken, per world
  std::vector<std::shared_ptr<RecordingWorld>> worlds;
  auto make = [&](int ranks) -> Result<BenchWorld> {
    std::lock_guard<std::mutex> lk(mu);
    const size_t w = sizes.size();
    sizes.push_back(ranks);
    taken.emplace_back();
    worlds.push_back(std::make_shared<RecordingWorld>(ranks));
    BenchWorld bw;
    bw.comms = worlds.back();
    bw.backends = [&, w](int rank) -> std::unique_ptr<Backend> {
      std::lock_guard<std::mutex> lk2(mu);
      taken[w].push_back(rank);
      return std::make_unique<CpuBackend>();
    };
    return bw;
  };
  auto m = RunMicrobenchmarks(make, opt, {});
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(sizes, (std::vector<int>{1, 2, 4}));
  ASSERT_EQ(taken.size(), 3u);
  EXPECT_EQ(taken[0], std::vector<int>{0});
  for (size_t w = 1; w < 3; ++w) {
    std::sort(taken[w].begin(), taken[w].end());
    std::vector<int> all(size_t(sizes[w]));
    for (int r = 0; r < sizes[w]; ++r) all[size_t(r)] = r;
    EXPECT_EQ(taken[w], all) << "world of " << sizes[w];
    EXPECT_FALSE(worlds[w]->unprepared()) << "world of " << sizes[w];
  }
  EXPECT_EQ(m->Table("all_reduce")->axis_values()[0], (std::vector<double>{2, 4}));
}

// A world that cannot be made (no GPU, too few GPUs) fails the run with its reason and the group
// size; so does a world that hands out no backend.
TEST(Microbench, ReportsWhyAWorldCouldNotBeMade) {
  auto m = RunMicrobenchmarks(
      [](int ranks) -> Result<BenchWorld> {
        if (ranks == 1) return CpuWorld(1);
        return Status::Error("the plan has 2 ranks but 1 GPUs are visible");
      },
      Tiny(), {});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("collectives over 2 ranks"), std::string::npos)
      << m.status().message();
  EXPECT_NE(m.status().message().find("1 GPUs are visible"), std::string::npos)
      << m.status().message();
  m = RunMicrobenchmarks(
      [](int ranks) -> Result<BenchWorld> { return Status::Error("--backend cuda: no CUDA GPU"); },
      Tiny(), {});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(), "--backend cuda: no CUDA GPU");
  m = RunMicrobenchmarks(
      [](int ranks) -> Result<BenchWorld> {
        BenchWorld w = *CpuWorld(ranks);
        w.backends = [](int) { return std::unique_ptr<Backend>(); };
        return w;
      },
      Tiny(), {});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("no backend"), std::string::npos) << m.status().message();
}

TEST(Microbench, RefusesBadOptions) {
  MicrobenchOptions opt = Tiny();
  opt.batches = 0;
  auto m = RunMicrobenchmarks(CpuWorld, opt, {});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("batches"), std::string::npos);
  opt = Tiny();
  opt.passes = 0;
  m = RunMicrobenchmarks(CpuWorld, opt, {});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("passes"), std::string::npos);
}

// A CPU backend whose GEMMs take 20 ms more while `slow` is set: the host in a slow spell.
class SpellBackend : public ForwardingBackend {
 public:
  SpellBackend(std::shared_ptr<std::atomic<bool>> slow)
      : ForwardingBackend(std::make_unique<CpuBackend>()), slow_(std::move(slow)) {}
  void Matmul(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, float alpha,
              float beta) override {
    if (slow_->load()) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
      while (std::chrono::steady_clock::now() < until) {
      }
    }
    inner().Matmul(a, ta, b, tb, c, alpha, beta);
  }

 private:
  std::shared_ptr<std::atomic<bool>> slow_;
};

// With passes, a point's batches lie in different sweeps over the grids, and its time is the
// median over the sweeps: a spell that slows the whole first sweep moves none of the points;
// with one sweep (its batches back to back) the spell is the point's time. The later sweeps keep
// the first one's batch size (one call, the spell's), so a batch there is a single ~1 us GEMM
// that one descheduling of the 2-core CI can stretch past 5 ms: three batches a sweep, whose
// median such a stall does not move.
TEST(Microbench, ASlowSpellOverOneSweepMovesNoPoint) {
  for (int passes : {3, 1}) {
    auto slow = std::make_shared<std::atomic<bool>>(true);
    MicrobenchReport report;
    MicrobenchOptions opt;
    opt.min_batch_s = 1e-4;
    opt.batches = 3;
    opt.passes = passes;
    opt.ops_only = true;
    MicrobenchGrids g;
    g.gemm_dims = {16};  // one point; the other tables are left out
    opt.grids = g;
    auto m = RunMicrobenchmarks(
        OneRankWorld([slow] { return std::make_unique<SpellBackend>(slow); }), opt,
        // The spell ends with the first sweep (the point is a third of the work with 3 sweeps).
        [&](double fraction, const std::string&) { *slow = fraction < 1.0 / passes - 1e-9; },
        &report);
    ASSERT_TRUE(m.ok()) << m.status().message();
    // The report shows the spell: the first sweep far slower than the medians, the others at them.
    ASSERT_EQ(report.sweep_time.size(), passes > 1 ? size_t(passes) : 0u);
    if (passes > 1) {
      EXPECT_GT(report.sweep_time[0], 4.0);
      EXPECT_GT(report.Drift(), 3.0);
    } else {
      EXPECT_EQ(report.Drift(), 0.0);
    }
    ASSERT_NE(m->Table("gemm_nt"), nullptr);
    EXPECT_EQ(m->Table("layernorm_forward"), nullptr);
    for (const char* t : {"gemm_nt", "gemm_nn", "gemm_tn"}) {
      const double s = m->Table(t)->Seconds(16, 16, 16);
      if (passes > 1)
        // ~1 us unslowed; 5 ms leaves room for a preemption of the 2-core CI in either other sweep.
        EXPECT_LT(s, 5e-3) << t << ": the spell's sweep is out-voted";
      else
        EXPECT_GE(s, 20e-3) << t << ": one sweep is what the spell made it";
    }
  }
}

// A CPU backend that says it runs a GEMM's bias and GeLU in the GEMM's kernel on bf16 tensors
// (as CUDA's cuBLASLt epilogues), counting the fused calls.
class EpilogueBackend : public ForwardingBackend {
 public:
  explicit EpilogueBackend(std::shared_ptr<std::atomic<int>> calls)
      : ForwardingBackend(std::make_unique<CpuBackend>()), calls_(std::move(calls)) {}
  bool FusesGemmEpilogues(DType act) const override { return act == DType::kBF16; }
  void MatmulBias(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& bias,
                  Tensor& c) override {
    ++*calls_;
    inner().MatmulBias(a, ta, b, tb, bias, c);
  }
  void MatmulBiasGelu(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& bias,
                      Tensor& pre, Tensor& act) override {
    ++*calls_;
    inner().MatmulBiasGelu(a, ta, b, tb, bias, pre, act);
  }
  void MatmulGeluBackward(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& pre,
                          Tensor& dx) override {
    ++*calls_;
    inner().MatmulGeluBackward(a, ta, b, tb, pre, dx);
  }

 private:
  std::shared_ptr<std::atomic<int>> calls_;
};

// Where the backend fuses them, the epilogue GEMMs are timed over the GEMM grid as the runtime
// calls them (the cost model then prices QKV, FC1 and FC2's dgrad by them); elsewhere not at all.
TEST(Microbench, TimesTheGemmEpiloguesWhereTheBackendFusesThem) {
  for (DType act : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(act == DType::kBF16 ? "bf16" : "fp32");
    auto calls = std::make_shared<std::atomic<int>>(0);
    MicrobenchOptions opt;
    opt.min_batch_s = 1e-4;
    opt.batches = 1;
    opt.passes = 1;
    opt.ops_only = true;
    opt.act = act;
    MicrobenchGrids g;
    g.gemm_dims = {16, 32};  // the other tables are left out
    opt.grids = g;
    auto m = RunMicrobenchmarks(
        OneRankWorld([calls] { return std::make_unique<EpilogueBackend>(calls); }), opt, nullptr);
    ASSERT_TRUE(m.ok()) << m.status().message();
    const bool fused = act == DType::kBF16;
    for (const char* t : {"gemm_nt_bias", "gemm_nt_bias_gelu", "gemm_nn_dgelu"}) {
      ASSERT_EQ(m->Table(t) != nullptr, fused) << t;
      if (!fused) continue;
      EXPECT_EQ(m->Table(t)->axis_values()[2], (std::vector<double>{16, 32})) << t;
      EXPECT_GT(m->Table(t)->Seconds(32, 32, 32), 0) << t;
    }
    EXPECT_EQ(*calls > 0, fused);
  }
}

}  // namespace
}  // namespace ptdp::rt
