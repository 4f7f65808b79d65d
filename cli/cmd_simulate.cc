// `ptdp simulate`: one layout in detail, from flags or from a plan.yaml: the event-driven
// simulation of one step (breakdown, memory per stage), the analytic figure beside it, and on
// request a Perfetto trace and an ASCII timeline.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <memory>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/megatron_command.h"
#include "cli/trace.h"
#include "core/units.h"
#include "core/layer_ops.h"
#include "cost_model/simulator.h"

namespace ptdp::cli {
namespace {

struct SimFlags {
  LayoutFlags layout;
  std::string plan_file;
  std::string trace;   // Chrome trace-event JSON output
  bool timeline = false;
  bool ops = false;    // print the layer's kernels with their times
  int width = 100;
  std::string emit;    // --emit megatron: the layout's Megatron-LM launch
};

// The lists --ops prints: one layer forward, the recompute the backward reruns, the layer
// backward, and the first / last stage's embedding and output layer.
struct NamedList {
  const char* name;
  LayerOpList ops;
  LayerOpList before;  // issued just before (the recompute, ahead of the backward)
};

std::vector<NamedList> OpLists(const AnalyticModel& cost, const Layout& l) {
  const LayerOps layer = cost.Ops(l);
  std::vector<NamedList> out;
  const ModelSpec& m = cost.model();
  const OpShape shape = cost.Shape(l);
  if (m.hybrid()) {  // each kind of layer the pattern has: "mamba layer forward", ...
    const LayerCounts n = m.layer_counts(0, m.layers);
    for (int k = 0; k < kLayerKinds; ++k) {
      if (n.n[size_t(k)] <= 0) continue;
      LayerOps ops;
      BuildLayerOps(m, shape, &ops, LayerKind(k));
      static const char* const kNames[kLayerKinds][3] = {
          {"layer forward", "layer recompute", "layer backward"},
          {"moe layer forward", "moe layer recompute", "moe layer backward"},
          {"mamba layer forward", "mamba layer recompute", "mamba layer backward"},
          {"attention layer forward", "attention layer recompute", "attention layer backward"},
          {"mlp layer forward", "mlp layer recompute", "mlp layer backward"},
          {"moe-mlp layer forward", "moe-mlp layer recompute", "moe-mlp layer backward"}};
      const char* const* name = kNames[k];
      out.push_back({name[0], ops.forward, {}});
      if (ops.recompute.size > 0) out.push_back({name[1], ops.recompute, {}});
      out.push_back({name[2], ops.backward, ops.recompute});
    }
  }
  // An MoE model: its dense layers (if any) and its MoE layers, each their own lists.
  const bool dense = !m.hybrid() && m.moe_layers() < m.layers;
  if (dense) {
    out.push_back({"layer forward", layer.forward, {}});
    if (layer.recompute.size > 0) out.push_back({"layer recompute", layer.recompute, {}});
    out.push_back({"layer backward", layer.backward, layer.recompute});
  }
  if (m.moe() && !m.hybrid()) {
    LayerOps moe;
    BuildLayerOps(m, shape, &moe, /*moe=*/true);
    out.push_back({"moe layer forward", moe.forward, {}});
    if (moe.recompute.size > 0) out.push_back({"moe layer recompute", moe.recompute, {}});
    out.push_back({"moe layer backward", moe.backward, moe.recompute});
  }
  NamedList ef{"embedding forward", {}, {}}, eb{"embedding backward", {}, {}};
  BuildEmbeddingOps(cost.model(), shape, &ef.ops, &eb.ops);
  NamedList of{"output forward", {}, {}}, ob{"output backward", {}, {}};
  BuildOutputOps(cost.model(), shape, &of.ops, &ob.ops);
  for (NamedList* n : {&ef, &eb, &of, &ob}) out.push_back(*n);
  return out;
}

// One list timed as the analytic model times it, its figures net of what ran before it.
struct TimedList {
  NamedList list;
  OpTimes each{};
  OpListTimes before, after;
  double start() const { return before.busy_s; }
};

std::vector<TimedList> TimedLists(const AnalyticModel& cost, const Layout& l) {
  std::vector<TimedList> out;
  for (NamedList& n : OpLists(cost, l)) {
    TimedList t;
    t.list = n;
    t.before = cost.TimeOps(l, n.before);
    t.after = cost.TimeOps(l, n.ops, t.before, &t.each);
    out.push_back(t);
  }
  return out;
}

std::string OpShapeText(const LayerOp& op) {
  char buf[96];
  switch (op.kind) {
    case LayerOpKind::kGemm:
      std::snprintf(buf, sizeof buf, "%.0f x %.0f x %.0f", op.m, op.n, op.k);
      break;
    case LayerOpKind::kAttention:
      std::snprintf(buf, sizeof buf, "%.0f x %.0fq x %.0fk x d%.0f", op.m, op.n, op.k, op.head_dim);
      break;
    case LayerOpKind::kMemory:
    case LayerOpKind::kComm:
      std::snprintf(buf, sizeof buf, "%s", FormatBytes(op.bytes).c_str());
      break;
  }
  return buf;
}

const char* OverlapText(const LayerOp& op) {
  if (op.kind != LayerOpKind::kComm) return "";
  switch (op.overlap) {
    case CommOverlap::kBlocking: return "blocking";
    case CommOverlap::kAsync: return "async";
    case CommOverlap::kTpOverlap: return "tp-overlap";
    case CommOverlap::kRing: return "ring";
  }
  return "";
}

// What a GEMM of ptdp's runtime adds in its epilogue (the call's bias, GeLU, GeLU's gradient),
// as a suffix of its name; "" for a plain one.
const char* EpilogueText(const LayerOp& op) {
  switch (op.epilogue) {
    case GemmEpilogue::kNone: return "";
    case GemmEpilogue::kBias: return "+bias";
    case GemmEpilogue::kBiasGelu: return "+bias+gelu";
    case GemmEpilogue::kGeluBackward: return "+gelu.backward";
  }
  return "";
}

nlohmann::json OpsJson(const AnalyticModel& cost, const Layout& l) {
  nlohmann::json lists = nlohmann::json::array();
  for (const TimedList& t : TimedLists(cost, l)) {
    const LayerOpList& ops = t.list.ops;
    nlohmann::json js = nlohmann::json::array();
    for (int i = 0; i < ops.size; ++i) {
      const LayerOp& op = ops[i];
      nlohmann::json o = {{"name", op.name}, {"kind", ToString(op.kind)},
                          {"flops", op.flops}, {"bytes", op.bytes}, {"kernels", op.kernels},
                          {"gpu_s", t.each[i].gpu_s}, {"host_s", t.each[i].host_s},
                          {"end_s", t.each[i].end_s - t.start()}};
      if (op.kind == LayerOpKind::kGemm || op.kind == LayerOpKind::kAttention)
        o["shape"] = {op.m, op.n, op.k};
      if (op.epilogue != GemmEpilogue::kNone)
        o["epilogue"] = op.epilogue == GemmEpilogue::kBias ? "bias" : "bias_gelu";
      if (op.kind == LayerOpKind::kComm) {
        o["collective"] = ToString(op.comm);
        o["group"] = op.group == CommGroup::kTp ? "tp" : "cp";
        o["overlap"] = OverlapText(op);
        if (op.with >= 0) o["overlaps"] = ops[op.with].name;
        o["comm_s"] = t.each[i].comm_s;
        o["exposed_s"] = t.each[i].exposed_s;
      }
      js.push_back(o);
    }
    lists.push_back({{"list", t.list.name}, {"ops", js},
                     {"compute_s", t.after.compute_s - t.before.compute_s},
                     {"exposed_comm_s", t.after.exposed_s - t.before.exposed_s},
                     {"host_s", t.after.host_s - t.before.host_s},
                     {"time_s", t.after.busy() - t.before.busy()}});
  }
  return lists;
}

void PrintOps(const AnalyticModel& cost, const Layout& l) {
  if (cost.runtime())
    std::printf("\n(--ops: this cluster carries measured primitives: the lists as ptdp's runtime "
                "executes them, each op by its measured table)\n");
  for (const TimedList& t : TimedLists(cost, l)) {
    const LayerOpList& ops = t.list.ops;
    std::printf("\n%s, one micro-batch: %s (compute %s, exposed communication %s, host %s)\n",
                t.list.name, FormatSeconds(t.after.busy() - t.before.busy()).c_str(),
                FormatSeconds(t.after.compute_s - t.before.compute_s).c_str(),
                FormatSeconds(t.after.exposed_s - t.before.exposed_s).c_str(),
                FormatSeconds(t.after.host_s - t.before.host_s).c_str());
    std::printf("  %-30s %-9s %-26s %10s %10s %10s  %s\n", "op", "kind", "shape / bytes",
                "time (us)", "exposed", "end (us)", "overlap");
    for (int i = 0; i < ops.size; ++i) {
      const LayerOp& op = ops[i];
      const bool comm = op.kind == LayerOpKind::kComm;
      std::string overlap = OverlapText(op);
      if (comm && op.with >= 0) overlap += std::string(" under ") + ops[op.with].name;
      const std::string name = std::string(op.name) + EpilogueText(op);
      std::printf("  %-30s %-9s %-26s %10.1f %10s %10.1f  %s\n", name.c_str(), ToString(op.kind),
                  OpShapeText(op).c_str(), 1e6 * (comm ? t.each[i].comm_s : t.each[i].gpu_s),
                  comm ? std::to_string(int(1e6 * t.each[i].exposed_s + 0.5)).c_str() : "",
                  1e6 * (t.each[i].end_s - t.start()), overlap.c_str());
    }
  }
}

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
  plan.nodes_per_nvlink_domain = w.cluster.nodes_per_nvlink_domain;
  plan.allow_tp_across_nodes = f.layout.allow_tp_across_nodes;
  return std::make_pair(std::move(plan), std::move(w));
}

int RunSimulate(const SimFlags& f) {
  if (f.width < 20 || f.width > 1000) return Fail("--width " + std::to_string(f.width) + ": 20..1000");
  auto loaded = Load(f);
  if (!loaded.ok()) return Fail(loaded.status().message());
  auto& [plan, world] = *loaded;
  std::optional<double> train_tokens;
  if (f.layout.train_tokens) {
    auto t = ParseTokenCount(*f.layout.train_tokens);
    if (!t.ok()) return Fail(t.status().message());
    train_tokens = *t;
  }
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
    j["layout"] = LayoutJson(plan.layout, plan.model);
    AddModelJson(plan.model, &j);
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
    if (f.ops) j["layer_ops"] = OpsJson(*world.cost, world.cost->Executed(plan.layout));
    if (train_tokens)
      j["training"] = TrainingJson(
          TimeToTrain(plan.layout, plan.model, plan.prediction.step_time_s, *train_tokens));
    if (f.emit == "megatron") j["megatron_command"] = MegatronCommand(plan, {train_tokens});
    std::cout << DumpJson(j) << "\n";
    return 0;
  }
  std::cout << MeasuredNote(world.cluster) << RenderPrediction(plan);
  std::printf("\nanalytic model: %.4f s (the simulation is %+.1f%% from it)\n", analytic,
              100 * (sim->step_time_s - analytic) / analytic);
  if (train_tokens)
    std::printf("%s", TrainingLine(TimeToTrain(plan.layout, plan.model, plan.prediction.step_time_s,
                                               *train_tokens),
                                   plan.layout.world()).c_str());
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
  if (f.ops) PrintOps(*world.cost, world.cost->Executed(plan.layout));
  if (!f.trace.empty()) std::printf("\nwrote %s (open it in https://ui.perfetto.dev)\n", f.trace.c_str());
  if (f.emit == "megatron") std::printf("\n%s", MegatronCommand(plan, {train_tokens}).c_str());
  return 0;
}

}  // namespace

Runner SetupSimulate(CLI::App* sub) {
  auto f = std::make_shared<SimFlags>();
  sub->add_option("plan", f->plan_file, "plan.yaml written by `ptdp plan --out`");
  AddLayoutFlags(sub, &f->layout, /*need_cluster_model=*/false);
  sub->add_option("--trace", f->trace, "write the simulated step as Chrome trace-event JSON");
  sub->add_flag("--timeline", f->timeline, "print an ASCII Gantt chart of the step");
  sub->add_flag("--ops", f->ops,
                "print one layer's kernels (and the embedding's and output layer's), each with "
                "its shape, time and exposed communication (core/layer_ops.h)");
  sub->add_option("--width", f->width, "columns of the --timeline chart (default 100)");
  AddEmitOption(sub, &f->emit);
  return [f] { return RunSimulate(*f); };
}

}  // namespace ptdp::cli
