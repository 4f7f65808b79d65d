// The microbenchmarks on the CPU backend and thread communicator, on tiny grids: every table is
// measured with positive times, bigger work takes longer, and what the backend's attention saves
// is read from AttentionSavedShape (P, s x s per head, on the CPU).
#include "runtime/microbench.h"

#include <gtest/gtest.h>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/thread_communicator.h"

namespace ptdp::rt {
namespace {

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
      [] { return std::make_unique<CpuBackend>(); },
      [](int ranks) { return std::make_unique<ThreadWorld>(ranks, 30.0); }, Tiny(),
      [&](double fraction, const std::string& what) {
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
  // 128^3 is 512x the FLOPs of 16^3: far slower whatever the noise.
  const MeasuredTable& g = *m->Table("gemm_nt");
  EXPECT_GT(g.Seconds(128, 128, 128), 20 * g.Seconds(16, 16, 16));
  const MeasuredTable& c = *m->Table("copy");
  EXPECT_GT(c.Seconds(65536), c.Seconds(64));
  // The CPU backend saves the probabilities: one element per score, none per token.
  EXPECT_DOUBLE_EQ(m->attention_saved_per_score, 1);
  EXPECT_DOUBLE_EQ(m->attention_saved_per_token, 0);
  EXPECT_DOUBLE_EQ(m->element_bytes, 4);
  EXPECT_EQ(m->Table("all_reduce")->axis_values()[0], std::vector<double>{2});
}

TEST(Microbench, RefusesBadOptions) {
  MicrobenchOptions opt = Tiny();
  opt.batches = 0;
  auto m = RunMicrobenchmarks([] { return std::make_unique<CpuBackend>(); },
                              [](int r) { return std::make_unique<ThreadWorld>(r, 30.0); }, opt, {});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("batches"), std::string::npos);
}

}  // namespace
}  // namespace ptdp::rt
