// The trainer times its phases on the backend's marks (Backend::Mark), not the host clock, so
// that on an asynchronous backend (CUDA events) measured.json holds the device's time. Proven
// with a backend whose "device" is a virtual clock: every GEMM takes exactly 1 ms of it and
// nothing else takes any. The step's forward and backward time must then be exactly the GEMMs'
// count in ms (the host took a different, irregular time), every other phase 0, and the
// timeline's events must lie on the virtual clock.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/thread_communicator.h"
#include "runtime/forwarding_backend.h"
#include "runtime/trainer.h"
#include "tests/fakes/tiny_training.h"

namespace ptdp::rt {
namespace {

class VirtualClockBackend final : public ForwardingBackend {
 public:
  VirtualClockBackend() : ForwardingBackend(std::make_unique<CpuBackend>()) {}
  void Matmul(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, float alpha,
              float beta) override {
    inner().Matmul(a, ta, b, tb, c, alpha, beta);
    now_ += 1e-3;
    ++gemms;
  }
  int Mark() override {
    marks_.push_back(now_);
    return int(marks_.size()) - 1;
  }
  double MarkSeconds(int a, int b) override { return marks_.at(size_t(b)) - marks_.at(size_t(a)); }
  void ClearMarks() override { marks_.clear(); }
  int64_t gemms = 0;

 private:
  double now_ = 0;
  std::vector<double> marks_;
};

using Spec = testing::TinyLayoutSpec;

TEST(PhaseTiming, PhasesAreTheBackendsTimeNotTheHosts) {
  Spec s;
  s.tp = 2, s.sp = true;
  TrainerConfig cfg;
  cfg.model = testing::TinyGpt(4);
  cfg.layout = testing::TinyLayout(s);
  cfg.train_tokens = &testing::Shakespeare().train;
  cfg.record_timeline = true;
  std::vector<VirtualClockBackend*> backends;
  BackendFactory factory = [&](int) {
    auto be = std::make_unique<VirtualClockBackend>();
    backends.push_back(be.get());
    return std::unique_ptr<Backend>(std::move(be));
  };
  ThreadWorld world(cfg.layout.world(), 30.0);
  auto tr = Trainer::Create(cfg, factory, world);
  ASSERT_TRUE(tr.ok()) << tr.status().message();
  ASSERT_EQ(backends.size(), 2u);
  for (VirtualClockBackend* be : backends) be->gemms = 0;  // init's GEMMs (none) aside
  auto r = (*tr)->Step();
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->ranks.size(), 2u);
  for (size_t g = 0; g < 2; ++g) {
    const RankTimes& t = r->ranks[g];
    const double gemm_s = double(backends[g]->gemms) * 1e-3;
    EXPECT_GT(backends[g]->gemms, 10);
    EXPECT_NEAR(t.forward_s + t.backward_s, gemm_s, 1e-9) << "rank " << g;
    EXPECT_NEAR(t.forward_s * 1e3, std::round(t.forward_s * 1e3), 1e-6);  // whole GEMMs
    EXPECT_NEAR(t.tp_comm_s, 0.0, 1e-12);   // the collectives take no virtual time
    EXPECT_NEAR(t.optimizer_s, 0.0, 1e-12);
    EXPECT_NEAR(t.idle_s, 0.0, 1e-9);
    ASSERT_FALSE(t.events.empty());
    for (const StepEvent& e : t.events) {
      EXPECT_NEAR(e.start_s * 1e3, std::round(e.start_s * 1e3), 1e-6) << ToString(e.kind);
      EXPECT_LE(e.end_s, gemm_s + 1e-9);
    }
  }
}

}  // namespace
}  // namespace ptdp::rt
