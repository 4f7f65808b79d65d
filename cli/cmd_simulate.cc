// `ptdp simulate`: one layout in detail, from flags or from a plan.yaml: the event-driven
// simulation of one step (breakdown, memory per stage), the analytic figure beside it, and on
// request a Perfetto trace and an ASCII timeline.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/trace.h"
#include "core/units.h"
#include "cost_model/simulator.h"

namespace ptdp::cli {
namespace {

struct SimFlags {
  LayoutFlags layout;
  std::string plan_file;
  std::string trace;   // Chrome trace-event JSON output
  bool timeline = false;
  int width = 100;
};

// The plan and its world, from a plan.yaml or from the flags.
Result<std::pair<Plan, World>> Load(const SimFlags& f) {
  Plan plan;
  if (!f.plan_file.empty()) {
    PTDP_ASSIGN_OR_RETURN(plan, LoadPlanFile(f.plan_file));
    PTDP_ASSIGN_OR_RETURN(World w, WorldForPlan(plan, f.layout.cluster));
    plan.cluster_name = w.cluster.name;
    return std::make_pair(std::move(plan), std::move(w));
  }
  if (f.layout.cluster.empty() || f.layout.model.empty())
    return Status::Error("give a plan.yaml, or --cluster and --model with the layout flags");
  PTDP_ASSIGN_OR_RETURN(World w, LoadWorld(f.layout.cluster, f.layout.model, f.layout.nodes,
                                           f.layout.gpus, f.layout.seq_len));
  PTDP_ASSIGN_OR_RETURN(plan.layout, LayoutFromFlags(f.layout, w));
  plan.model = w.model;
  plan.cluster_file = ConfigReference(f.layout.cluster);
  plan.cluster_name = w.cluster.name;
  plan.nodes = w.cluster.nodes;
  plan.gpus_per_node = w.cluster.gpus_per_node;
  plan.allow_tp_across_nodes = f.layout.allow_tp_across_nodes;
  return std::make_pair(std::move(plan), std::move(w));
}

int RunSimulate(const SimFlags& f) {
  if (f.width < 20 || f.width > 1000) return Fail("--width " + std::to_string(f.width) + ": 20..1000");
  auto loaded = Load(f);
  if (!loaded.ok()) return Fail(loaded.status().message());
  auto& [plan, world] = *loaded;
  SimOptions opt;
  opt.record_events = !f.trace.empty() || f.timeline;
  auto sim = SimulateStep(*world.cost, plan.layout, opt);
  if (!sim.ok()) return Fail(sim.status().message());
  const double analytic = world.cost->Evaluate(plan.layout).step_time_s;
  plan.prediction = SimulatedPrediction(*world.cost, plan.layout, *sim);
  plan.has_prediction = true;
  if (!f.trace.empty()) {
    std::ofstream out(f.trace);
    out << ChromeTraceJson(plan, *sim);
    if (!out) return Fail(f.trace + ": cannot write the trace");
  }
  if (f.layout.json) {
    nlohmann::json j = PredictionJson(plan.prediction);
    j["layout"] = LayoutJson(plan.layout);
    j["model"] = plan.model.name;
    j["cluster"] = plan.cluster_name;
    j["analytic_step_time_s"] = analytic;
    j["simulated_events"] = sim->num_events;
    nlohmann::json ranks = nlohmann::json::array();
    for (const auto& r : sim->ranks)
      ranks.push_back({{"compute_s", r.compute_s}, {"p2p_wait_s", r.p2p_wait_s},
                       {"bubble_s", r.bubble_s}, {"end_s", r.end_s},
                       {"peak_inflight", r.peak_inflight},
                       {"peak_memory_bytes", r.peak_memory_bytes}});
    j["ranks"] = ranks;
    std::cout << DumpJson(j) << "\n";
    return 0;
  }
  std::cout << MeasuredNote(world.cluster) << RenderPrediction(plan);
  std::printf("\nanalytic model: %.4f s (the simulation is %+.1f%% from it)\n", analytic,
              100 * (sim->step_time_s - analytic) / analytic);
  std::printf("\nper pipeline rank (simulated):\n  rank  compute (s)  p2p (s)  bubble (s)  "
              "in flight  peak memory\n");
  for (size_t r = 0; r < sim->ranks.size(); ++r) {
    const SimRankStats& rs = sim->ranks[r];
    std::printf("  %-4zu %11.4f %8.4f %11.4f %10d  %s\n", r, rs.compute_s, rs.p2p_wait_s,
                rs.bubble_s, rs.peak_inflight, FormatBytes(rs.peak_memory_bytes).c_str());
  }
  if (f.timeline) {
    const int64_t cells = int64_t(plan.layout.pp) * plan.layout.num_microbatches() * plan.layout.vp;
    if (cells > 512)
      std::printf("\n(--timeline: %lld micro-batch slots are too many to draw; use --trace)\n",
                  static_cast<long long>(cells));
    else
      std::printf("\n%s", AsciiTimeline(*sim, plan.layout.pp, f.width).c_str());
  }
  if (!f.trace.empty()) std::printf("\nwrote %s (open it in https://ui.perfetto.dev)\n", f.trace.c_str());
  return 0;
}

}  // namespace

Runner SetupSimulate(CLI::App* sub) {
  auto f = std::make_shared<SimFlags>();
  sub->add_option("plan", f->plan_file, "plan.yaml written by `ptdp plan --out`");
  AddLayoutFlags(sub, &f->layout, /*need_cluster_model=*/false);
  sub->add_option("--trace", f->trace, "write the simulated step as Chrome trace-event JSON");
  sub->add_flag("--timeline", f->timeline, "print an ASCII Gantt chart of the step");
  sub->add_option("--width", f->width, "columns of the --timeline chart (default 100)");
  return [f] { return RunSimulate(*f); };
}

}  // namespace ptdp::cli
