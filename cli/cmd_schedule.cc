// `ptdp schedule`: the per-rank op order of a pipeline schedule (GPipe, 1F1B, interleaved
// 1F1B) in the reference notation, optionally with its p2p groups, proved sound by
// CheckSchedule before it is printed.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/layout.h"
#include "core/schedule.h"

namespace ptdp::cli {
namespace {

struct ScheduleFlags {
  int pp = 0;
  int vp = 1;
  int microbatches = 0;
  std::optional<std::string> kind;  // default: interleaved when vp > 1, else 1f1b
  int group = 0;                    // interleaving group size g; 0 = pp
  std::optional<std::string> a2a_overlap;  // --overlap-moe-expert-parallel-comm on|off
  bool p2p = false;
  bool json = false;
  // The layers of each virtual stage, when --layers is given (with Megatron's split flags).
  int layers = 0;
  SplitFlags split;
};

// Layers per virtual stage (c * pp + r) of the split the flags give, checked as Megatron does.
Result<std::vector<int>> SplitLayers(const ScheduleFlags& f, int vp) {
  if (f.layers <= 0 || f.layers > kMaxLayers)
    return Status::Error("--layers " + std::to_string(f.layers) + " must be in 1.." +
                         std::to_string(kMaxLayers));
  ModelSpec m;
  m.layers = f.layers;
  m.heads = m.kv_heads = 1;
  Layout l;
  l.pp = f.pp;
  l.vp = vp;
  l.global_batch = f.microbatches;
  l.microbatch_group = f.group;
  l.schedule = vp > 1 ? ScheduleKind::kInterleaved : ScheduleKind::kOneFOneB;
  PTDP_RETURN_IF_ERROR(ApplySplit(f.split, &l).status());
  const Rejection why = CheckLayout(m, l);
  if (why != Rejection::kOk && why != Rejection::kInterleaveMicrobatches)  // the schedule says
    return Status::Error("pipeline split: " + ExplainRejection(why, m, l));
  return StageLayers(m, l);
}

// Warmup forwards of rank r, Megatron's formulas (the ones core/schedule.cc builds with):
// GPipe every forward, 1F1B min(p-r-1, m), interleaved min((p-r-1)*2 + (v-1)*g, m*v).
int Warmup(const Schedule& s, int r) {
  return int(WarmupForwards(s.kind, s.pp, s.vp, s.microbatches, s.group_size, r, s.a2a_overlap));
}

// "F3" or "F3.1"; gradients are named after the backward that consumes or produces them.
std::string Compute(bool backward, int mb, int chunk, int vp) {
  std::string s = (backward ? "B" : "F") + std::to_string(mb);
  if (vp > 1) s += "." + std::to_string(chunk);
  return s;
}

std::string Label(const ScheduleOp& op, int vp) {
  const bool grad = op.kind == OpKind::kBackward || op.kind == OpKind::kSendGradient ||
                    op.kind == OpKind::kRecvGradient;
  if (op.is_compute()) return Compute(grad, op.microbatch, op.chunk, vp);
  if (!op.is_p2p()) return ToString(op.kind);
  const bool send = op.kind == OpKind::kSendActivation || op.kind == OpKind::kSendGradient;
  return std::string(ToString(op.kind)) + " " + Compute(grad, op.microbatch, op.chunk, vp) +
         (send ? " to rank " : " from rank ") + std::to_string(op.peer);
}

// "rank0 (warmup 10): F0.0 ... | <steady> | <cooldown>", empty phases left out.
std::string NotationLine(const Schedule& s, int r) {
  const int warmup = Warmup(s, r), total = s.microbatches * s.vp;
  std::vector<std::string> phases(3);
  int forwards = 0, backwards = 0;
  for (const ScheduleOp& op : s.ranks[r]) {
    if (!op.is_compute()) continue;
    const bool fwd = op.kind == OpKind::kForward;
    // Warmup: the first W forwards; cooldown: the last W backwards; steady: the pairs between.
    const int phase = fwd ? (forwards < warmup ? 0 : 1) : (backwards < total - warmup ? 1 : 2);
    (fwd ? forwards : backwards)++;
    if (!phases[phase].empty()) phases[phase] += ' ';
    phases[phase] += Label(op, s.vp);
  }
  std::string line = "rank" + std::to_string(r) + " (warmup " + std::to_string(warmup) + "):";
  bool first = true;
  for (const std::string& p : phases) {
    if (p.empty()) continue;
    line += (first ? " " : " | ") + p;
    first = false;
  }
  return line;
}

// Rank r's whole op list: one line per compute or end-of-step op, one per p2p group.
void PrintOps(const Schedule& s, int r) {
  std::printf("%s\n", ("rank" + std::to_string(r) + " (warmup " +
                       std::to_string(Warmup(s, r)) + "):").c_str());
  const std::vector<ScheduleOp>& ops = s.ranks[r];
  for (size_t i = 0; i < ops.size();) {
    if (!ops[i].is_p2p()) {
      std::printf("         %s\n", Label(ops[i++], s.vp).c_str());
      continue;
    }
    const int group = ops[i].group;
    std::string line = Label(ops[i++], s.vp);
    while (group >= 0 && i < ops.size() && ops[i].is_p2p() && ops[i].group == group)
      line += ", " + Label(ops[i++], s.vp);
    std::printf("  g%-5d %s\n", group, line.c_str());
  }
}

nlohmann::json ScheduleJson(const Schedule& s) {
  nlohmann::json ranks = nlohmann::json::array(), warmup = nlohmann::json::array();
  for (int r = 0; r < s.pp; ++r) {
    nlohmann::json ops = nlohmann::json::array();
    for (const ScheduleOp& op : s.ranks[r]) {
      nlohmann::json o;
      o["op"] = op.kind == OpKind::kForward    ? "F"
                : op.kind == OpKind::kBackward ? "B"
                                               : ToString(op.kind);
      if (op.is_compute() || op.is_p2p()) {
        o["microbatch"] = op.microbatch;
        o["chunk"] = op.chunk;
      }
      if (op.is_p2p()) {
        o["peer"] = op.peer;
        o["group"] = op.group;
      }
      ops.push_back(o);
    }
    ranks.push_back(ops);
    warmup.push_back(Warmup(s, r));
  }
  return {{"kind", ToString(s.kind)}, {"pp", s.pp}, {"vp", s.vp},
          {"microbatches", s.microbatches}, {"group_size", s.group_size},
          {"warmup", warmup}, {"checked", true}, {"ranks", ranks}};
}

int RunSchedule(const ScheduleFlags& f) {
  int vp = f.vp;
  if (f.split.pipeline_layout && f.pp > 0) {  // its stages / pp, as Megatron derives vp
    auto pl = ParsePipelineLayout(*f.split.pipeline_layout);
    if (!pl.ok()) return Fail(pl.status().Prefixed("--pipeline-model-parallel-layout").message());
    vp = std::max<int>(1, int(pl->layers.size() / size_t(f.pp)));
  }
  ScheduleKind kind = vp > 1 ? ScheduleKind::kInterleaved : ScheduleKind::kOneFOneB;
  if (f.kind) {
    auto parsed = ParseScheduleKind(*f.kind);
    if (!parsed.ok()) return Fail("--kind: " + parsed.status().message());
    kind = *parsed;
  }
  if (f.split.any() && f.layers == 0)
    return Fail("the split flags need --layers (the model's transformer layers)");
  bool a2a = false;
  if (f.a2a_overlap) {
    auto on = ParseOnOff("--overlap-moe-expert-parallel-comm", *f.a2a_overlap);
    if (!on.ok()) return Fail(on.status().message());
    a2a = *on;
  }
  auto built = BuildSchedule(kind, f.pp, vp, f.microbatches, f.group, a2a);
  if (!built.ok()) return Fail(built.status().message());
  const Schedule& s = *built;
  const Status checked = CheckSchedule(s);
  if (!checked.ok()) return Fail("schedule check failed: " + checked.message());
  std::vector<int> stage_layers;
  if (f.layers > 0) {
    auto split = SplitLayers(f, vp);
    if (!split.ok()) return Fail(split.status().message());
    stage_layers = *split;
  }
  // With the layers known: the layer-micro-batches each rank holds at its peak (PeakInFlight:
  // past the warm-up where its chunks differ) and at the warm-up's end.
  std::vector<double> peak, warm;
  for (int r = 0; r < s.pp && !stage_layers.empty(); ++r) {
    std::vector<double> kept(size_t(s.vp));
    for (int c = 0; c < s.vp; ++c) kept[size_t(c)] = stage_layers[size_t(c) * s.pp + r];
    peak.push_back(PeakInFlight(s.kind, s.pp, s.vp, s.microbatches, s.group_size, r,
                                s.a2a_overlap, kept));
    warm.push_back(HeldAfterWarmup(s.kind, s.pp, s.vp, s.microbatches, s.group_size, r,
                                   s.a2a_overlap, kept));
  }
  if (f.json) {
    nlohmann::json j = ScheduleJson(s);
    if (!stage_layers.empty()) {
      j["stage_layers"] = stage_layers;
      j["peak_layer_microbatches"] = peak;
      j["warmup_layer_microbatches"] = warm;
    }
    std::cout << DumpJson(j) << "\n";
    return 0;
  }
  std::printf("%s schedule: pp %d, vp %d, %d micro-batches", ToString(s.kind), s.pp, s.vp,
              s.microbatches);
  if (s.kind == ScheduleKind::kInterleaved) std::printf(", group %d", s.group_size);
  std::printf("\n");
  if (!stage_layers.empty()) {
    std::printf("layers per chunk (virtual stage c*pp + r):\n");
    for (int r = 0; r < s.pp; ++r) {
      std::string line;
      for (int c = 0; c < s.vp; ++c)
        line += (c ? " " : "") + std::to_string(stage_layers[size_t(c) * s.pp + r]);
      std::printf("  rank %-3d %s   holds %g layer-micro-batches at its peak (%g at the "
                  "warm-up's end)\n", r, line.c_str(), peak[size_t(r)], warm[size_t(r)]);
    }
  }
  for (int r = 0; r < s.pp; ++r) {
    if (f.p2p)
      PrintOps(s, r);
    else
      std::printf("%s\n", NotationLine(s, r).c_str());
  }
  std::printf("checked: every send matched, no deadlock\n");
  return 0;
}

}  // namespace

Runner SetupSchedule(CLI::App* sub) {
  auto f = std::make_shared<ScheduleFlags>();
  sub->add_option("--pp", f->pp, "pipeline ranks p")->required();
  sub->add_option("--vp", f->vp, "model chunks per rank v (default 1)");
  sub->add_option("--microbatches", f->microbatches, "micro-batches per step m")->required();
  sub->add_option("--kind", f->kind, "gpipe | 1f1b | interleaved (default: interleaved when "
                                     "--vp > 1, else 1f1b)");
  sub->add_option("--group", f->group, "interleaving micro-batch group g (default pp)");
  sub->add_option("--overlap-moe-expert-parallel-comm", f->a2a_overlap,
                  "on|off: Megatron's combined 1F1B of the EP all-to-all overlap, one more "
                  "warm-up forward (interleaved, or pp 1)");
  sub->add_flag("--p2p", f->p2p, "every op: sends and receives with their group ids");
  sub->add_flag("--json", f->json, "machine-readable output, every op");
  sub->add_option("--layers", f->layers,
                  "the model's transformer layers: print each chunk's (with the split flags below)");
  AddSplitFlags(sub, &f->split);
  return [f] { return RunSchedule(*f); };
}

}  // namespace ptdp::cli
