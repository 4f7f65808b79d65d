// `ptdp report`: one self-contained HTML page for a plan: the planner's ranking (from flags)
// or a single plan (from a plan.yaml), the chosen plan's breakdown and memory, and a Gantt
// chart of its simulated step. Gathers ReportData; report_html.cc renders it.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/report_html.h"
#include "cost_model/simulator.h"

namespace ptdp::cli {
namespace {

struct ReportFlags {
  LayoutFlags layout;
  std::string plan_file;
  std::string html;
  std::string measured;  // measured.json of the plan (`ptdp train --out`), for #compare
  int top = 10;
  int refine = 16;  // as `ptdp plan`, so both pick the same rank 1
};

ReportPlanRow RowFromEstimate(const RankedLayout& r) {
  const Estimate& e = r.estimate;
  ReportPlanRow row;
  row.layout = r.layout;
  row.step_time_s = e.step_time_s;
  row.tflops_per_gpu = e.model_flops / e.step_time_s / r.layout.world() / 1e12;
  row.mfu = e.mfu;
  row.bubble_fraction = e.bubble_fraction;
  row.memory_total_bytes = e.memory.total;
  row.fits = e.fits;
  row.source = r.simulated ? "simulated" : "analytic";
  return row;
}

ReportPlanRow RowFromPrediction(const Layout& l, const Prediction& p) {
  ReportPlanRow row;
  row.layout = l;
  row.step_time_s = p.step_time_s;
  row.tflops_per_gpu = p.tflops_per_gpu;
  row.mfu = p.mfu;
  row.bubble_fraction = p.bubble_fraction;
  row.memory_total_bytes = p.memory.total;
  row.fits = p.fits;
  row.source = p.source;
  return row;
}

// Search from the flags: the ranking, rejections and explanation; the chosen layout is
// d->plans[0].layout.
Status FillFromSearch(const ReportFlags& f, const World& w, ReportData* d) {
  PTDP_ASSIGN_OR_RETURN(SearchSpace space, SpaceFromFlags(f.layout, w));
  PTDP_ASSIGN_OR_RETURN(PlanResult r, RunPlanner(w, space, f.top, f.refine));
  if (r.top.empty()) {
    if (r.legal == 0) return Status::Error("no legal layout: see `ptdp plan` for the rejected counts");
    return Status::Error("no legal layout fits in GPU memory; try --recompute full, --dist-opt on, "
                         "more GPUs (--nodes) or a smaller --micro-batch");
  }
  d->searched = true;
  d->evaluated = r.evaluated;
  d->legal = r.legal;
  d->fitting = r.fitting;
  for (const RankedLayout& row : r.top) d->plans.push_back(RowFromEstimate(row));
  for (int i = 1; i < kNumRejections; ++i)
    if (r.rejected[i]) d->rejected.emplace_back(RejectionKey(Rejection(i)), r.rejected[i]);
  if (r.top.size() >= 2) d->explanation = ExplainChoice(r.top[0], r.top[1]);
  return Status::Ok();
}

Result<ReportData> Gather(const ReportFlags& f) {
  ReportData d;
  World w;
  Layout chosen;
  if (!f.plan_file.empty()) {
    PTDP_ASSIGN_OR_RETURN(Plan plan, LoadPlanFile(f.plan_file));
    PTDP_ASSIGN_OR_RETURN(w, WorldForPlan(plan, f.layout.cluster));
    chosen = plan.layout;
    if (!f.measured.empty()) {
      PTDP_ASSIGN_OR_RETURN(d.comparison, ComparePlan(plan, f.measured, f.layout.cluster));
      d.has_comparison = true;
    }
  } else {
    if (!f.measured.empty())
      return Status::Error("--measured needs the plan.yaml that was trained, not a search");
    if (f.layout.cluster.empty() || f.layout.model.empty())
      return Status::Error("give a plan.yaml, or --cluster, --model and --global-batch");
    PTDP_ASSIGN_OR_RETURN(w, LoadWorld(f.layout.cluster, f.layout.model, f.layout.nodes,
                                       f.layout.gpus, f.layout.seq_len));
    PTDP_RETURN_IF_ERROR(FillFromSearch(f, w, &d));
    chosen = d.plans[0].layout;
  }
  d.model_name = w.model.name;
  d.model = w.model;
  d.cluster_name = w.cluster.name;
  d.gpus = chosen.world();
  d.global_batch = chosen.global_batch;
  d.title = "ptdp report: " + w.model.name + " on " + w.cluster.name;
  d.chosen = w.cost->Predict(chosen);
  SimOptions opt;
  opt.record_events = true;
  PTDP_ASSIGN_OR_RETURN(d.sim, SimulateStep(*w.cost, chosen, opt));
  d.has_sim = true;
  // A plan file: the ranking is just that plan, with its simulated figures.
  if (!d.searched) d.plans.push_back(RowFromPrediction(chosen, SimulatedPrediction(*w.cost, chosen, d.sim)));
  return d;
}

int RunReport(const ReportFlags& f) {
  if (f.html.empty()) return Fail("--html is required: the file to write the report to");
  auto d = Gather(f);
  if (!d.ok()) return Fail(d.status().message());
  const std::string html = RenderReportHtml(*d);
  std::ofstream out(f.html, std::ios::binary);
  out << html;
  out.close();
  if (!out) return Fail(f.html + ": cannot write the report");
  const ReportPlanRow& c = d->plans[0];
  if (f.layout.json) {
    nlohmann::json j;
    j["html"] = f.html;
    j["bytes"] = html.size();
    j["model"] = d->model_name;
    j["cluster"] = d->cluster_name;
    j["layout"] = LayoutJson(c.layout, d->model);
    j["step_time_s"] = d->sim.step_time_s;
    j["analytic_step_time_s"] = d->chosen.step_time_s;
    j["plans"] = d->plans.size();
    j["events"] = d->sim.events.size();
    if (d->has_comparison) {
      j["step_time_error_pct"] =
          ErrorPct(d->comparison.predicted_step_s, d->comparison.measured_step_s);
      j["measured_step_time_s"] = d->comparison.measured_step_s;
    }
    std::cout << DumpJson(j) << "\n";
    return 0;
  }
  std::printf("ptdp report: %s on %s (%d GPUs), global batch %lld\n", d->model_name.c_str(),
              d->cluster_name.c_str(), d->gpus, static_cast<long long>(d->global_batch));
  std::printf("chosen: %s [%s], %.4f s per step simulated (%.4f s analytic), %zu events\n",
              c.layout.ShortName().c_str(), c.layout.Knobs().c_str(), d->sim.step_time_s,
              d->chosen.step_time_s, d->sim.events.size());
  if (d->has_comparison)
    std::printf("measured %.4f s per step (median), predicted %.4f s: %+.1f%%\n",
                d->comparison.measured_step_s, d->comparison.predicted_step_s,
                ErrorPct(d->comparison.predicted_step_s, d->comparison.measured_step_s));
  if (d->has_comparison && d->comparison.busy()) std::printf("%s\n", LoadNote(d->comparison).c_str());
  std::printf("wrote %s (%.0f KiB)\n", f.html.c_str(), html.size() / 1024.0);
  return 0;
}

}  // namespace

Runner SetupReport(CLI::App* sub) {
  auto f = std::make_shared<ReportFlags>();
  sub->add_option("plan", f->plan_file, "plan.yaml written by `ptdp plan --out` (instead of a search)");
  AddLayoutFlags(sub, &f->layout, /*need_cluster_model=*/false);
  sub->add_option("--top", f->top, "rows of the ranking (default 10)");
  sub->add_option("--refine", f->refine,
                  "re-score the best K analytic layouts with the event simulator (default 16, 0 = off)");
  sub->add_option("--html", f->html, "the HTML file to write (required)");
  sub->add_option("--measured", f->measured,
                  "measured.json of the plan (`ptdp train --out`): adds predicted against measured");
  return [f] { return RunReport(*f); };
}

}  // namespace ptdp::cli
