// `ptdp plan`: search every layout, print the ranking, the rejections and why the winner won.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/megatron_command.h"
#include "core/units.h"

namespace ptdp::cli {
namespace {

struct PlanFlags {
  LayoutFlags layout;
  int top = 10;
  int refine = 16;
  std::string out;
  std::string emit;
  std::string options = "on";  // --options-left-off: try the Megatron options left off
};

Plan MakePlan(const World& w, const LayoutFlags& f, const RankedLayout& row) {
  const Layout& l = row.layout;
  Plan plan;
  plan.model = w.model;
  plan.layout = l;
  plan.cluster_file = ConfigReference(f.cluster);
  plan.cluster_name = w.cluster.name;
  plan.nodes = w.cluster.nodes;
  plan.gpus_per_node = w.cluster.gpus_per_node;
  plan.nodes_per_nvlink_domain = w.cluster.nodes_per_nvlink_domain;
  plan.allow_tp_across_nodes = f.allow_tp_across_nodes;
  plan.has_prediction = true;
  plan.prediction = w.cost->Predict(l);
  if (row.simulated) {  // the simulator's step time and breakdown, the analytic memory
    const Estimate& e = row.estimate;
    Prediction& p = plan.prediction;
    p.source = "simulated";
    p.step_time_s = e.step_time_s;
    p.breakdown = e.breakdown;
    p.bubble_fraction = e.bubble_fraction;
    p.mfu = e.mfu;
    p.tflops_per_gpu = e.model_flops / e.step_time_s / l.world() / 1e12;
    p.hw_tflops_per_gpu = e.hw_flops / e.step_time_s / l.world() / 1e12;
  }
  return plan;
}

// Megatron's --grad-reduce-in-bf16 on a layout that does not fit: what the layout would need
// with bf16 gradient buffers, as advice ("" where it does not apply or saves nothing).
std::string GradBf16Advice(const World& w, const RankedLayout& row) {
  Layout l = row.layout;
  if (l.grad_reduce_in_bf16 || l.shard_gradients) return "";  // (ZeRO-3 too: shard_params needs it)
  l.grad_reduce_in_bf16 = true;
  if (CheckLayout(w.model, l) != Rejection::kOk) return "";
  const Estimate e = w.cost->Evaluate(l);
  if (e.memory.total >= row.estimate.memory.total) return "";
  return "--grad-reduce-in-bf16 (Megatron's bf16 gradient buffers) would bring it to " +
         FormatBytes(e.memory.total) + (e.fits ? ", which fits" : "");
}

// A Megatron option the search left at Megatron's default (off) and the fastest layout it
// makes possible (`best` empty where it makes none).
struct OptionRow {
  std::string flags;  // ptdp's (and Megatron-LM's) flags that turn it on
  std::optional<RankedLayout> best;
};

// Megatron-LM leaves these off unless asked, and so does the search: TE's TP communication
// overlap, bf16 gradient buffers, CPU activation offloading (the fewest layers that make a
// pp-1 layout fit), Megatron-FSDP's optim_grads_params and the precision-aware optimizer with
// bf16 moments. Each the user did not set is tried on its own, then all of them together
// (Megatron-FSDP and the precision-aware optimizer exclude each other: FSDP goes in); the rows
// are what each would buy.
Result<std::vector<OptionRow>> OptionsOffByDefault(const World& w, const LayoutFlags& lf,
                                                   const SearchSpace& s, int refine) {
  std::vector<OptionRow> rows;
  if (s.runtime_layouts) return rows;  // plans for ptdp's runtime: none of these apply there
  std::vector<std::pair<std::string, std::function<void(SearchSpace*)>>> options;
  if (!lf.tp_overlap)
    options.push_back({"--tp-comm-overlap on", [](SearchSpace* x) { x->tp_comm_overlap = true; }});
  if (!lf.grad_reduce_in_bf16 && !lf.accumulate_grads_in_fp32 &&
      (s.precision == Precision::kBf16 || s.precision == Precision::kFp8 ||
       s.precision == Precision::kFp4))
    options.push_back(
        {"--grad-reduce-in-bf16", [](SearchSpace* x) { x->grad_reduce_in_bf16 = true; }});
  // (Megatron offloads only without recompute.)
  if (!lf.cpu_offload_layers && w.cluster.gpu.host_bw_bytes_per_s > 0 &&
      s.recompute.Allows(Recompute::kNone))
    options.push_back({"--cpu-offloading-num-layers N",
                       [](SearchSpace* x) { x->search_cpu_offload = true; }});
  // Transformer Engine's precision-aware Adam with bf16 moments (Megatron-Bridge's DeepSeek-V3
  // recipes; its bf16 runs turn the flag on): 8 bytes of state a parameter instead of 12 (a
  // bf16 model's masters as 16-bit remainders). It needs the distributed optimizer and refuses
  // Megatron-FSDP, so it is tried on its own, and together only when FSDP is not.
  bool given_dtype = false;
  for (const auto& d : lf.optimizer_dtypes) given_dtype |= bool(d);
  const bool pa_opt = !lf.precision_aware_optimizer && !given_dtype &&
                      (!lf.dp_sharding || *lf.dp_sharding == "optim") &&
                      !(lf.dist_opt && *lf.dist_opt == "off") &&
                      s.precision != Precision::kFp32 && s.precision != Precision::kFp16;
  const std::pair<std::string, std::function<void(SearchSpace*)>> pa_opt_option = {
      "--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16",
      [](SearchSpace* x) {
        x->optimizer_state.precision_aware = true;
        x->optimizer_state.exp_avg = StateDtype::kBf16;
        x->optimizer_state.exp_avg_sq = StateDtype::kBf16;
        x->distributed_optimizer = true;
      }};
  const bool fsdp = !lf.dp_sharding && !(lf.dist_opt && *lf.dist_opt == "off");
  if (fsdp)
    options.push_back({"--data-parallel-sharding-strategy optim_grads_params",
                       [](SearchSpace* x) {
                         x->distributed_optimizer = true;
                         x->shard_gradients = true;
                         x->shard_params = true;
                       }});
  if (pa_opt && !fsdp) options.push_back(pa_opt_option);  // in "together" too
  if (options.size() > 1) {
    std::string all;
    for (const auto& o : options) all += (all.empty() ? "" : " ") + o.first;
    auto together = options;
    const bool free_dopt = !lf.dist_opt;
    options.push_back({all, [together, fsdp, free_dopt](SearchSpace* x) {
                         for (const auto& o : together) o.second(x);
                         // Together, Megatron-FSDP is a choice beside the distributed optimizer
                         // (on its own above, it is forced: its best layout is the point).
                         if (fsdp) {
                           if (free_dopt) x->distributed_optimizer = {};
                           x->shard_gradients = Choice<bool>({false, true});
                           x->shard_params = Choice<bool>({false, true});
                         }
                       }});
  }
  if (pa_opt && fsdp) options.push_back(pa_opt_option);  // on its own only
  for (const auto& [flags, apply] : options) {
    SearchSpace o = s;
    apply(&o);
    PTDP_ASSIGN_OR_RETURN(PlanResult r, RunPlanner(w, o, 1, refine));
    OptionRow row{flags, std::nullopt};
    if (!r.top.empty()) row.best = r.top.front();
    rows.push_back(row);
  }
  return rows;
}

// The flags of the options a row's layout uses (what to add to the command line), or the
// row's flags where it found no layout.
std::string OptionFlags(const OptionRow& row, const SearchSpace& s) {
  if (!row.best) return row.flags;
  const Layout& l = row.best->layout;
  std::string f;
  if (l.tp_comm_overlap && !s.tp_comm_overlap) f += " --tp-comm-overlap on";
  if (l.grad_reduce_in_bf16 && !s.grad_reduce_in_bf16) f += " --grad-reduce-in-bf16";
  if (l.cpu_offload_layers > 0 && !s.cpu_offload_layers)
    f += " --cpu-offloading-num-layers " + std::to_string(l.cpu_offload_layers);
  if (l.shard_gradients && !s.shard_gradients)
    f += std::string(" --data-parallel-sharding-strategy ") +
         (l.shard_params ? "optim_grads_params" : "optim_grads");
  if (l.optimizer_state.precision_aware && !s.optimizer_state.precision_aware) {
    f += " --use-precision-aware-optimizer";
    for (const OptimizerDtypeField& d : OptimizerDtypeFields())
      if (const StateDtype dt = l.optimizer_state.*d.field; dt != StateDtype::kFp32)
        f += std::string(" ") + d.flag + " " + ToString(dt);
  }
  return f.empty() ? row.flags : f.substr(1);
}

// Rows that beat the plan's pick by at least 1%.
constexpr double kOptionGain = 0.01;
bool OptionHelps(const OptionRow& row, const RankedLayout& pick) {
  return row.best && row.best->estimate.step_time_s < (1 - kOptionGain) * pick.estimate.step_time_s;
}

void PrintOptions(const std::vector<OptionRow>& rows, const SearchSpace& s,
                  const RankedLayout& pick) {
  if (rows.empty()) return;
  std::printf("\nMegatron options left off (Megatron's defaults), each tried on its own, then "
              "together:\n");
  bool any = false;
  std::vector<std::string> shown;
  for (const OptionRow& row : rows) {
    if (!OptionHelps(row, pick)) continue;
    const std::string flags = OptionFlags(row, s);
    // "Together" may pick what one option alone did.
    if (std::find(shown.begin(), shown.end(), flags) != shown.end()) continue;
    shown.push_back(flags);
    any = true;
    const RankedLayout& b = *row.best;
    std::printf("  %s\n      %-30s %-28s %8.3f s  %+.1f%%  %s\n", flags.c_str(),
                b.layout.ShortName().c_str(), b.layout.Knobs().c_str(), b.estimate.step_time_s,
                100 * (b.estimate.step_time_s / pick.estimate.step_time_s - 1),
                FormatBytes(b.estimate.memory.total).c_str());
  }
  if (!any) std::printf("  none makes a layout 1%% faster than rank 1\n");
}

nlohmann::json OptionsJson(const World& w, const std::vector<OptionRow>& rows,
                           const SearchSpace& s, const RankedLayout& pick) {
  nlohmann::json a = nlohmann::json::array();
  for (const OptionRow& row : rows) {
    nlohmann::json j = {{"tried", row.flags}, {"flags", OptionFlags(row, s)},
                        {"faster", OptionHelps(row, pick)}};
    if (row.best) {
      j["plan"] = EstimateJson(row.best->layout, w.model, row.best->estimate);
      j["step_time_change"] = row.best->estimate.step_time_s / pick.estimate.step_time_s - 1;
    }
    a.push_back(j);
  }
  return a;
}

// The rejection keys with their counts, largest first.
std::vector<std::pair<std::string, int64_t>> RejectionsByCount(const PlanResult& r) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (int i = 1; i < kNumRejections; ++i)
    if (r.rejected[i]) out.emplace_back(RejectionKey(Rejection(i)), r.rejected[i]);
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

void PrintTable(const World& w, const PlanFlags& f, const PlanResult& r) {
  std::printf("ptdp plan: %s\non %s (%d of %d nodes x %d GPUs), global batch %lld (%.3g tokens)\n",
              ModelSummary(w.model).c_str(), w.cluster.name.c_str(), w.gpus, w.cluster.nodes,
              w.cluster.gpus_per_node, static_cast<long long>(*f.layout.global_batch),
              double(*f.layout.global_batch) * w.model.seq_len);
  std::printf("%s", MeasuredNote(w.cluster).c_str());
  std::printf("evaluated %lld layouts in %.3f s: %lld legal, %lld fit in %s (%s less %.0f%% "
              "headroom)\n\n",
              static_cast<long long>(r.evaluated), r.elapsed_s, static_cast<long long>(r.legal),
              static_cast<long long>(r.fitting),
              FormatBytes(w.cluster.gpu.memory_bytes * (1 - w.cost->memory_headroom())).c_str(),
              FormatBytes(w.cluster.gpu.memory_bytes).c_str(), 100 * w.cost->memory_headroom());
  const auto& rows = r.top.empty() ? r.unfitting : r.top;
  if (rows.empty()) {  // nothing legal: the reasons are the answer
    std::printf("no layout is legal; the rules they break, most often first:\n");
    for (const auto& [key, count] : RejectionsByCount(r))
      std::printf("  %-40s %lld\n", key.c_str(), static_cast<long long>(count));
    return;
  }
  if (r.top.empty())
    std::printf("no layout fits in memory; the %zu smallest are:\n", rows.size());
  auto rate = [](const RankedLayout& row) {  // model FLOP/s per GPU
    return row.estimate.model_flops / row.estimate.step_time_s / row.layout.world();
  };
  double best = 0;
  for (const RankedLayout& row : rows) best = std::max(best, rate(row));
  const FlopUnit unit = FlopUnitFor(best);
  std::printf("%-4s %-30s %-28s %10s %10s %9s %6s %7s %10s %5s %s\n", "rank", "layout", "knobs",
              "step (s)", "tokens/s", unit.name, "MFU", "bubble", "mem/GPU", "fits", "source");
  int rank = 1;
  for (const RankedLayout& row : rows) {
    const Estimate& e = row.estimate;
    const double tf = rate(row) / unit.per_s;
    const double tokens = double(row.layout.global_batch) * w.model.seq_len / e.step_time_s;
    std::printf("%-4d %-30s %-28s %10.3f %10.4g %9.3g %5.1f%% %6.1f%% %10s %5s %s\n", rank++,
                row.layout.ShortName().c_str(), row.layout.Knobs().c_str(), e.step_time_s, tokens, tf,
                100 * e.mfu, 100 * e.bubble_fraction, FormatBytes(e.memory.total).c_str(),
                e.fits ? "yes" : "no", row.simulated ? "simulated" : "analytic");
  }
  std::printf("\nrejected:");
  bool any = false;
  for (int i = 1; i < kNumRejections; ++i)
    if (r.rejected[i]) {
      std::printf("%s %s %lld", any ? "," : "", RejectionKey(Rejection(i)),
                  static_cast<long long>(r.rejected[i]));
      any = true;
    }
  std::printf("%s\n", any ? "" : " none");
  if (r.top.size() >= 2) {
    std::printf("\nwhy rank 1:\n");
    for (const auto& line : ExplainChoice(r.top[0], r.top[1])) std::printf("%s\n", line.c_str());
  }
}

nlohmann::json ResultJson(const World& w, const PlanResult& r, const Plan* chosen) {
  nlohmann::json j = chosen ? PredictionJson(chosen->prediction) : nlohmann::json::object();
  if (chosen) j["layout"] = LayoutJson(chosen->layout, w.model);
  j["evaluated"] = r.evaluated;
  j["legal"] = r.legal;
  j["fitting"] = r.fitting;
  j["elapsed_s"] = r.elapsed_s;
  nlohmann::json rej = nlohmann::json::object();
  for (int i = 1; i < kNumRejections; ++i)
    if (r.rejected[i]) rej[RejectionKey(Rejection(i))] = r.rejected[i];
  j["rejected"] = rej;
  nlohmann::json plans = nlohmann::json::array();
  for (const auto& row : r.top.empty() ? r.unfitting : r.top) {
    nlohmann::json p = EstimateJson(row.layout, w.model, row.estimate);
    p["source"] = row.simulated ? "simulated" : "analytic";
    p["analytic_step_time_s"] = row.analytic_step_time_s;
    plans.push_back(p);
  }
  j["plans"] = plans;
  AddModelJson(w.model, &j);
  j["cluster"] = w.cluster.name;
  j["gpus"] = w.gpus;
  if (r.top.size() >= 2) j["explanation"] = ExplainChoice(r.top[0], r.top[1]);
  return j;
}

int RunPlan(const PlanFlags& f) {
  auto w = LoadWorld(f.layout.cluster, f.layout.model, f.layout.nodes, f.layout.gpus,
                     f.layout.seq_len);
  if (!w.ok()) return Fail(w.status().message());
  std::optional<double> train_tokens;
  if (f.layout.train_tokens) {
    auto t = ParseTokenCount(*f.layout.train_tokens);
    if (!t.ok()) return Fail(t.status().message());
    train_tokens = *t;
  }
  auto space = SpaceFromFlags(f.layout, *w);
  if (!space.ok()) return Fail(space.status().message());
  auto planned = RunPlanner(*w, *space, f.top, f.refine);
  if (!planned.ok()) return Fail(planned.status().message());
  const PlanResult& r = *planned;
  std::unique_ptr<Plan> chosen;
  if (!r.top.empty()) chosen = std::make_unique<Plan>(MakePlan(*w, f.layout, r.top[0]));
  auto advise = ParseOnOff("--options-left-off", f.options);
  if (!advise.ok()) return Fail(advise.status().message());
  std::vector<OptionRow> options;
  if (chosen && *advise) {
    auto o = OptionsOffByDefault(*w, f.layout, *space, f.refine);
    if (!o.ok()) return Fail(o.status().message());
    options = std::move(*o);
  }
  if (f.layout.json) {
    nlohmann::json j = ResultJson(*w, r, chosen.get());
    if (chosen && *advise) j["options_left_off"] = OptionsJson(*w, options, *space, r.top.front());
    if (chosen && f.emit == "megatron")
      j["megatron_command"] = MegatronCommand(*chosen, {train_tokens});
    if (chosen && train_tokens)
      j["training"] = TrainingJson(TimeToTrain(chosen->layout, w->model,
                                               chosen->prediction.step_time_s, *train_tokens));
    std::cout << DumpJson(j) << "\n";
  } else {
    PrintTable(*w, f, r);
    if (chosen && *advise) PrintOptions(options, *space, r.top.front());
    if (chosen && train_tokens)
      std::printf("\n%s", TrainingLine(TimeToTrain(chosen->layout, w->model,
                                                   chosen->prediction.step_time_s, *train_tokens),
                                       chosen->layout.world()).c_str());
  }
  if (!chosen) {
    if (r.legal == 0) {
      std::string top;
      for (const auto& [key, count] : RejectionsByCount(r))
        if (top.size() < 160) top += (top.empty() ? "" : ", ") + key + " " + std::to_string(count);
      // A world with an odd factor (576 = 2^6 x 9 on 8 NVL72 racks) divides few model shapes:
      // the largest power of two below it is the usual way out.
      std::string hint;
      const int64_t shape = r.rejected[int(Rejection::kHeadsTp)] +
                            r.rejected[int(Rejection::kKvHeadsTp)] +
                            r.rejected[int(Rejection::kLayersPp)] +
                            r.rejected[int(Rejection::kUnevenSplit)];
      if (!f.layout.gpus && shape > 0 && (w->gpus & (w->gpus - 1)) != 0) {
        int pow2 = 1;
        while (pow2 * 2 <= w->gpus) pow2 *= 2;
        hint = "; " + std::to_string(w->gpus) + " GPUs is not a power of two: try --gpus " +
               std::to_string(pow2);
      }
      return Fail("no legal layout among " + std::to_string(r.evaluated) + " (" + top + ")" + hint);
    }
    // What the smallest needs and the knobs the user fixed: the advice follows from them.
    std::string fixed;
    const LayoutFlags& lf = f.layout;
    if (lf.recompute && *lf.recompute != "full") fixed += " --recompute " + *lf.recompute;
    if (lf.dist_opt && *lf.dist_opt == "off") fixed += " --dist-opt off";
    if (!lf.micro_batch.empty()) fixed += " --micro-batch";
    if (!lf.tp.empty()) fixed += " --tp";
    if (!lf.pp.empty()) fixed += " --pp";
    if (!lf.cp.empty()) fixed += " --cp";
    const double need = r.unfitting.empty() ? 0 : r.unfitting.front().estimate.memory.total;
    std::string bf16 = r.unfitting.empty() ? "" : GradBf16Advice(*w, r.unfitting.front());
    // The options Megatron leaves off may make a layout fit: the fastest they find, if any.
    if (*advise) {
      auto o = OptionsOffByDefault(*w, lf, *space, f.refine);
      if (!o.ok()) return Fail(o.status().message());
      const OptionRow* fastest = nullptr;
      for (const OptionRow& row : *o)
        if (row.best && (!fastest || row.best->estimate.step_time_s <
                                         fastest->best->estimate.step_time_s))
          fastest = &row;
      if (fastest)
        bf16 += std::string(bf16.empty() ? "" : "; ") + "with " +
                OptionFlags(*fastest, *space) + " (options Megatron leaves off), " +
                fastest->best->layout.ShortName() + " [" + fastest->best->layout.Knobs() +
                "] fits in " + FormatBytes(fastest->best->estimate.memory.total) + " at " +
                FormatSeconds(fastest->best->estimate.step_time_s) + " per step";
    }
    return Fail("no legal layout fits in GPU memory: the smallest needs " + FormatBytes(need) +
                " of " + FormatBytes(w->cluster.gpu.memory_bytes * (1 - w->cost->memory_headroom())) +
                " usable" + (fixed.empty() ? "; more GPUs (--nodes) or a smaller global batch"
                                           : "; relax what is fixed (" + fixed.substr(1) +
                                                 "), or use more GPUs (--nodes)") +
                (bf16.empty() ? "" : "; " + bf16));
  }
  if (!f.out.empty()) {
    Status st = WritePlanFile(*chosen, f.out);
    if (!st.ok()) return Fail(st.message());
    if (!f.layout.json) std::printf("\nwrote %s\n", f.out.c_str());
  }
  if (f.emit == "megatron" && !f.layout.json)
    std::printf("\n%s", MegatronCommand(*chosen, {train_tokens}).c_str());
  return 0;
}

}  // namespace

Runner SetupPlan(CLI::App* sub) {
  auto f = std::make_shared<PlanFlags>();
  AddLayoutFlags(sub, &f->layout, /*need_cluster_model=*/true);
  sub->add_option("--top", f->top, "rows of the ranking to show (default 10)");
  sub->add_option("--refine", f->refine,
                  "re-score the best K analytic layouts with the event simulator (default 16, 0 = off)");
  sub->add_option("--out", f->out, "write the chosen plan to this plan.yaml");
  sub->add_option("--options-left-off", f->options,
                  "on|off: after the ranking, try each Megatron option the search leaves off "
                  "(TP overlap, bf16 gradients, CPU offloading, Megatron-FSDP) and show what it "
                  "would buy (default on; each is one more search)");
  AddEmitOption(sub, &f->emit);
  return [f] { return RunPlan(*f); };
}

}  // namespace ptdp::cli
