// Property: every estimate the planner ranks is a number. For every shipped cluster x every
// shipped model (the folders listed at run time), at a few GPU counts, each legal layout the
// planner scores has a finite, positive step time, finite non-negative breakdown parts and
// finite memory with a positive total; a deterministic sample of them (the best and the
// worst by analytic step time) is re-run through the event simulator under the same checks.
// Issue 12: 120 of 282 layouts of gpt-tiny on local-cpu came out NaN/inf (a one-node cluster
// asked for its absent network's bandwidth). About 560k layouts and 2.5k simulations: ~2 s in
// Release on 2 cores, one test per cluster.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "cost_model/simulator.h"
#include "planner/planner.h"

namespace ptdp {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> ShippedYaml(const std::string& folder) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(std::string(PTDP_SOURCE_DIR) + "/configs/" + folder))
    if (e.path().extension() == ".yaml") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());  // a fixed order, whatever the file system's
  return out;
}

// What is wrong with an estimate, or "" when every figure is a number in range.
std::string Problem(const Estimate& e) {
  auto bad = [](double v) { return !std::isfinite(v) || v < 0; };
  if (!std::isfinite(e.step_time_s) || e.step_time_s <= 0) return "step_time_s";
  const Breakdown& b = e.breakdown;
  const std::pair<const char*, double> parts[] = {
      {"compute_s", b.compute_s}, {"tp_comm_s", b.tp_comm_s}, {"pp_comm_s", b.pp_comm_s},
      {"dp_comm_s", b.dp_comm_s}, {"bubble_s", b.bubble_s}, {"optimizer_s", b.optimizer_s},
      {"bubble_fraction", e.bubble_fraction}, {"mfu", e.mfu},
      {"memory.weights", e.memory.weights}, {"memory.grads", e.memory.grads},
      {"memory.optimizer", e.memory.optimizer}, {"memory.activations", e.memory.activations},
      {"memory.other", e.memory.other}};
  for (const auto& [name, v] : parts)
    if (bad(v)) return name;
  if (!std::isfinite(e.memory.total) || e.memory.total <= 0) return "memory.total";
  return "";
}

std::string Describe(const Estimate& e) {
  const Breakdown& b = e.breakdown;
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "step %g (compute %g tp %g pp %g dp %g bubble %g optimizer %g), memory %g",
                e.step_time_s, b.compute_s, b.tp_comm_s, b.pp_comm_s, b.dp_comm_s, b.bubble_s,
                b.optimizer_s, e.memory.total);
  return buf;
}

// The planner's estimator, recording every layout it is asked to score.
class Recorder : public Estimator {
 public:
  explicit Recorder(const AnalyticModel& cost) : cost_(cost) {}
  Estimate Evaluate(const Layout& l) const override {
    const Estimate e = cost_.Evaluate(l);
    seen.push_back({l, e});
    return e;
  }
  mutable std::vector<std::pair<Layout, Estimate>> seen;

 private:
  const AnalyticModel& cost_;
};

// GPU counts that fit the cluster: two GPUs; three quarters of a node (a DP or PP stride that
// does not divide the node); one node; three nodes (DP 3 across nodes); eight nodes; three
// NVLink domains where a domain is more than a node (NVL72: DP 3 across racks); the whole
// cluster. Every count the cluster has room for, deduplicated.
std::vector<int> GpuCounts(const ClusterSpec& c) {
  const int g = c.gpus_per_node;
  std::vector<int> v = {2, 3 * g / 4, g, 3 * g, 8 * g, 3 * c.nvlink_domain_gpus(), c.world()};
  v.erase(std::remove_if(v.begin(), v.end(), [&](int n) { return n < 1 || n > c.world(); }),
          v.end());
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

// The sample re-run through the simulator, per (model, GPU count): the planner's best fitting
// layouts, which `plan --refine` simulates, and the slowest by analytic step time, where the
// extremes hide (deep pipelines, many micro-batches). Deterministic: the enumeration order is
// fixed and the slowest are taken by a stable sort.
constexpr int kSimulatedBest = 3;
constexpr int kSimulatedWorst = 2;

// Checks every layout of one model at one GPU count; returns (layouts, simulated).
std::pair<int64_t, int64_t> CheckModel(const ClusterSpec& cluster, const ModelSpec& model,
                                       const AnalyticModel& cost, int gpus) {
  SearchSpace s;
  s.world = gpus;
  s.global_batch = 4 * gpus;  // m up to 4 * dp: several micro-batches per pipeline
  s.precision = cluster.gpu.DefaultPrecision();
  EXPECT_TRUE(CheckSearchSpace(model, cluster, s).ok());
  Recorder rec(cost);
  auto plan = SearchLayouts(rec, model, cluster, s, kSimulatedBest);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  int bad = 0;
  for (const auto& [l, e] : rec.seen) {
    const std::string what = Problem(e);
    if (what.empty()) continue;
    if (++bad <= 3)
      ADD_FAILURE() << l.ShortName() << " [" << l.Knobs() << "]: " << what
                    << " is out of range: " << Describe(e);
  }
  EXPECT_EQ(bad, 0) << "of " << rec.seen.size() << " layouts";
  std::vector<Layout> sample;
  if (plan.ok())
    for (const RankedLayout& r : plan->top) sample.push_back(r.layout);
  std::stable_sort(rec.seen.begin(), rec.seen.end(), [](const auto& a, const auto& b) {
    return a.second.step_time_s > b.second.step_time_s;
  });
  for (int i = 0; i < kSimulatedWorst && i < int(rec.seen.size()); ++i)
    sample.push_back(rec.seen[i].first);
  SimOptions opt;
  opt.record_events = false;
  for (const Layout& l : sample) {
    auto sim = SimulateStep(cost, l, opt);
    if (!sim.ok()) {
      ADD_FAILURE() << sim.status().message();
      continue;
    }
    Estimate e = cost.Evaluate(l);  // memory and FLOPs; the times from the simulation
    e.step_time_s = sim->step_time_s;
    e.breakdown = sim->breakdown;
    e.bubble_fraction = sim->bubble_fraction;
    EXPECT_EQ(Problem(e), "") << "simulated " << l.ShortName() << " [" << l.Knobs()
                              << "]: " << Describe(e);
    for (size_t r = 0; r < sim->ranks.size(); ++r) {
      const SimRankStats& rs = sim->ranks[r];
      EXPECT_TRUE(std::isfinite(rs.end_s) && rs.end_s > 0 && std::isfinite(rs.bubble_s) &&
                  std::isfinite(rs.peak_memory_bytes) && rs.peak_memory_bytes > 0)
          << "simulated " << l.ShortName() << " [" << l.Knobs() << "] rank " << r << ": end "
          << rs.end_s << ", bubble " << rs.bubble_s << ", peak memory " << rs.peak_memory_bytes;
    }
  }
  return {int64_t(rec.seen.size()), int64_t(sample.size())};
}

// One test per shipped cluster (ctest runs them side by side), every shipped model on it.
class FiniteEstimates : public ::testing::TestWithParam<std::string> {};

TEST_P(FiniteEstimates, EveryShippedModel) {
  const auto start = std::chrono::steady_clock::now();
  auto cluster = LoadClusterFile(GetParam());
  ASSERT_TRUE(cluster.ok()) << cluster.status().message();
  auto topo = Topology::Build(*cluster);
  ASSERT_TRUE(topo.ok()) << topo.status().message();
  int models = 0;
  int64_t layouts = 0, simulated = 0;
  for (const std::string& model_file : ShippedYaml("models")) {
    auto model = LoadModelFile(model_file);
    ASSERT_TRUE(model.ok()) << model.status().message();
    auto cost = AnalyticModel::Create(*model, *topo);
    ASSERT_TRUE(cost.ok()) << cost.status().message();
    ++models;
    for (int gpus : GpuCounts(*cluster)) {
      SCOPED_TRACE(cluster->name + " x " + model->name + " on " + std::to_string(gpus) + " GPUs");
      const auto [n, sims] = CheckModel(*cluster, *model, *cost, gpus);
      layouts += n;
      simulated += sims;
    }
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s: %d models, %lld layouts checked, %lld simulated, %.1f s\n",
              cluster->name.c_str(), models, static_cast<long long>(layouts),
              static_cast<long long>(simulated), elapsed);
  EXPECT_GE(models, 20);  // the shipped models were found
}

INSTANTIATE_TEST_SUITE_P(ShippedClusters, FiniteEstimates,
                         ::testing::ValuesIn(ShippedYaml("clusters")),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = fs::path(info.param).stem().string();
                           for (char& ch : name)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name;
                         });

}  // namespace
}  // namespace ptdp
