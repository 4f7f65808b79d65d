// `ptdp simulate`: one layout in detail, from flags or from a plan.yaml.
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"

namespace ptdp::cli {
namespace {

struct SimFlags {
  LayoutFlags layout;
  std::string plan_file;
};

int RunSimulate(const SimFlags& f) {
  Plan plan;
  if (!f.plan_file.empty()) {
    auto p = LoadPlanFile(f.plan_file);
    if (!p.ok()) return Fail(p.status().message());
    plan = *p;
    const std::string cluster = f.layout.cluster.empty() ? plan.cluster_file : f.layout.cluster;
    auto c = LoadClusterFile(cluster);
    if (!c.ok()) return Fail(c.status().message() + " (cluster named by " + f.plan_file + ")");
    ClusterSpec spec = *c;
    spec.nodes = plan.nodes;
    auto topo = Topology::Build(spec);
    if (!topo.ok()) return Fail(topo.status().message());
    auto cost = AnalyticModel::Create(plan.model, *topo);
    if (!cost.ok()) return Fail(cost.status().message());
    plan.cluster_name = spec.name;
    plan.prediction = cost->Predict(plan.layout);
    plan.has_prediction = true;
  } else {
    if (f.layout.cluster.empty() || f.layout.model.empty())
      return Fail("give a plan.yaml, or --cluster and --model with the layout flags");
    auto w = LoadWorld(f.layout.cluster, f.layout.model, f.layout.nodes, f.layout.gpus,
                       f.layout.seq_len);
    if (!w.ok()) return Fail(w.status().message());
    auto l = LayoutFromFlags(f.layout, *w);
    if (!l.ok()) return Fail(l.status().message());
    plan.model = w->model;
    plan.layout = *l;
    plan.cluster_file = f.layout.cluster;
    plan.cluster_name = w->cluster.name;
    plan.nodes = w->cluster.nodes;
    plan.gpus_per_node = w->cluster.gpus_per_node;
    plan.has_prediction = true;
    plan.prediction = w->cost->Predict(*l);
  }
  if (f.layout.json) {
    nlohmann::json j = PredictionJson(plan.prediction);
    j["layout"] = LayoutJson(plan.layout);
    j["model"] = plan.model.name;
    j["cluster"] = plan.cluster_name;
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << RenderPrediction(plan);
  }
  return 0;
}

}  // namespace

Runner SetupSimulate(CLI::App* sub) {
  auto f = std::make_shared<SimFlags>();
  sub->add_option("plan", f->plan_file, "plan.yaml written by `ptdp plan --out`");
  AddLayoutFlags(sub, &f->layout, /*need_cluster_model=*/false);
  return [f] { return RunSimulate(*f); };
}

}  // namespace ptdp::cli
