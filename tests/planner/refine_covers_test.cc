// Issue 13's target: the planner's pick is within 2% of the best layout by the model's own
// simulation. The default refinement re-scores the analytic top 16 with the event simulator;
// here the top 96 are simulated too and the best of them must not beat the pick by more than
// 2%: the analytic ranking must bring the layouts that can win into the refined set. Shipped
// clusters and models, a few problems small enough to simulate in about a second.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <string>

#include "cost_model/simulator.h"
#include "planner/planner.h"

namespace ptdp {
namespace {

struct Problem {
  const char* cluster;
  const char* model;
  int gpus;
  int64_t global_batch;
};

class RefineCovers : public ::testing::TestWithParam<Problem> {};

TEST_P(RefineCovers, PickWithinTwoPercentOfTheBestSimulated) {
  const Problem p = GetParam();
  const std::string src = PTDP_SOURCE_DIR;
  auto cluster = LoadClusterFile(src + "/configs/clusters/" + p.cluster + ".yaml");
  ASSERT_TRUE(cluster.ok()) << cluster.status().message();
  cluster->nodes = std::max(cluster->nodes, (p.gpus + cluster->gpus_per_node - 1) / cluster->gpus_per_node);
  auto topo = Topology::Build(*cluster);
  ASSERT_TRUE(topo.ok()) << topo.status().message();
  auto model = LoadModelFile(src + "/configs/models/" + p.model + ".yaml");
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto cost = AnalyticModel::Create(*model, *topo);
  ASSERT_TRUE(cost.ok()) << cost.status().message();
  SearchSpace s;
  s.world = p.gpus;
  s.global_batch = p.global_batch;
  constexpr int kWide = 96;
  auto wide = SearchLayouts(*cost, *model, *cluster, s, kWide);
  ASSERT_TRUE(wide.ok()) << wide.status().message();
  ASSERT_FALSE(wide->top.empty());
  PlanResult narrow = *wide;
  narrow.top.resize(std::min<size_t>(narrow.top.size(), 16));
  ASSERT_TRUE(RefineWithSimulator(*cost, 16, &narrow).ok());
  ASSERT_TRUE(RefineWithSimulator(*cost, kWide, &*wide).ok());
  const double pick = narrow.top.front().estimate.step_time_s;
  const double best = wide->top.front().estimate.step_time_s;
  EXPECT_LE(pick, best * 1.02) << p.model << " on " << p.gpus << " " << p.cluster << ": pick "
                               << narrow.top.front().layout.ShortName() << " " << pick
                               << " s, best of " << kWide << " simulated "
                               << wide->top.front().layout.ShortName() << " " << best << " s";
}

INSTANTIATE_TEST_SUITE_P(Shipped, RefineCovers,
                         ::testing::Values(Problem{"dgx-h100", "llama3-8b", 64, 256},
                                           Problem{"dgx-a100", "gpt3-13b", 128, 1024},
                                           Problem{"dgx-h100", "llama3-70b", 256, 512}),
                         [](const ::testing::TestParamInfo<Problem>& i) {
                           std::string n = std::string(i.param.model) + "_" + std::to_string(i.param.gpus);
                           for (char& c : n) if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

}  // namespace
}  // namespace ptdp
