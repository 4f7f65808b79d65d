// `ptdp compare plan.yaml measured.json`: the plan's prediction against what `ptdp train`
// measured, per component and per rank, with the error of each; --max-error turns a step-time
// error above a bound into exit code 3 (for scripts and CI).
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/compare.h"
#include "core/units.h"

namespace ptdp::cli {
namespace {

struct CompareFlags {
  std::string plan_file, measured_file, cluster;
  bool json = false;
  double max_error_pct = -1;  // < 0: no bound
};

// Exit code when the step-time error is above --max-error (1 is a failure, 2 a usage error).
constexpr int kAboveMaxError = 3;

std::string Pct(double e) {
  if (!std::isfinite(e)) return "    n/a";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+6.1f%%", e);
  return buf;
}

struct Unit {
  double scale;
  const char* name;
};

void PrintTable(const Comparison& c, const Unit& u) {
  std::printf("\n%-22s %12s %12s %9s\n", "", "predicted", "measured", "error");
  std::printf("%-22s %9.2f %-2s %9.2f %-2s %9s\n", "step time", c.predicted_step_s * u.scale,
              u.name, c.measured_step_s * u.scale, u.name,
              Pct(ErrorPct(c.predicted_step_s, c.measured_step_s)).c_str());
  std::printf("mean over the %zu ranks:\n", c.ranks.size());
  const Parts p = c.PredictedMean(), m = c.MeasuredMean();
  for (int k = 0; k < kNumComponents; ++k) {
    // A part under 2% of the step on both sides: its relative error is noise, not shown.
    const bool small = std::max(p[k], m[k]) < 0.02 * c.measured_step_s;
    std::printf("  %-20s %9.2f %-2s %9.2f %-2s %9s\n", ComponentName(k), p[k] * u.scale, u.name,
                m[k] * u.scale, u.name, small ? "      -" : Pct(ErrorPct(p[k], m[k])).c_str());
  }
  std::printf("%-22s %12s %12s %9s\n", "peak memory (max rank)",
              FormatBytes(c.PredictedMemoryMax()).c_str(), FormatBytes(c.MeasuredMemoryMax()).c_str(),
              Pct(ErrorPct(c.PredictedMemoryMax(), c.MeasuredMemoryMax())).c_str());
}

void PrintRanks(const Comparison& c, const Unit& u) {
  std::printf("\nper rank, predicted / measured (%s):\n%-5s %-5s", u.name, "rank", "stage");
  for (int k = 0; k < kNumComponents; ++k) std::printf(" %15s", ComponentName(k));
  std::printf(" %23s %8s\n", "peak memory", "error");
  for (const RankComparison& r : c.ranks) {
    std::printf("%-5d %-5d", r.rank, r.stage);
    for (int k = 0; k < kNumComponents; ++k) {
      char cell[40];
      std::snprintf(cell, sizeof cell, "%.2f/%.2f", r.predicted[k] * u.scale, r.measured[k] * u.scale);
      std::printf(" %15s", cell);
    }
    const std::string mem = FormatBytes(r.predicted_memory_bytes) + " / " + FormatBytes(r.measured_memory_bytes);
    std::printf(" %23s %8s\n", mem.c_str(),
                Pct(ErrorPct(r.predicted_memory_bytes, r.measured_memory_bytes)).c_str());
  }
}

int RunCompare(const CompareFlags& f) {
  auto plan = LoadPlanFile(f.plan_file);
  if (!plan.ok()) return Fail(plan.status().message());
  auto cmp = ComparePlan(*plan, f.measured_file, f.cluster);
  if (!cmp.ok()) return Fail(cmp.status().message());
  const Comparison& c = *cmp;
  const double step_err = ErrorPct(c.predicted_step_s, c.measured_step_s);
  const double mem_err = ErrorPct(c.PredictedMemoryMax(), c.MeasuredMemoryMax());
  const Layout& l = plan->layout;
  if (f.json) {
    std::cout << DumpJson(ComparisonJson(c)) << "\n";
  } else {
    const Unit u = c.measured_step_s < 1 ? Unit{1e3, "ms"} : Unit{1, "s"};
    std::printf("ptdp compare: %s %s [%s] on %s, %d ranks\n", plan->model.name.c_str(),
                l.ShortName().c_str(), l.Knobs().c_str(), c.cluster_name.c_str(), l.world());
    std::printf("measured: %s (%s backend on %s): median of %d steps after %d warm-up (%.2f to "
                "%.2f %s)\n",
                f.measured_file.c_str(), c.backend.c_str(), c.host.c_str(), c.timed_steps,
                c.warmup_steps, c.measured_step_min_s * u.scale, c.measured_step_max_s * u.scale,
                u.name);
    if (c.other_cpu_share >= 0) std::printf("%s\n", LoadNote(c).c_str());
    if (const std::string spread = SpreadNote(c); !spread.empty())
      std::printf("%s\n", spread.c_str());
    if (!c.calibrated)
      std::printf("note: %s has no measured primitives, so this is its Megatron-on-GPU model; for "
                  "ptdp's runtime on this machine run `ptdp calibrate` and pass --cluster\n",
                  c.cluster_name.c_str());
    PrintTable(c, u);
    PrintRanks(c, u);
    if (c.predicted_step_at_measured_load_s > 0)
      std::printf("\nexpert load (the most loaded EP rank's routed rows / the mean): predicted "
                  "%.2f (moe_dropless_load), measured %.2f; at the measured load the predicted "
                  "step is %.2f %s (%s)\n",
                  c.predicted_expert_load, c.measured_expert_load,
                  c.predicted_step_at_measured_load_s * u.scale, u.name,
                  Pct(ErrorPct(c.predicted_step_at_measured_load_s, c.measured_step_s)).c_str());
    if (c.host_speed.points > 0) {
      double lo = c.host_speed.overall, hi = c.host_speed.overall;  // within the tables' range
      for (const auto& [name, ratio] : c.host_speed.by_table) {
        lo = std::min(lo, ratio);
        hi = std::max(hi, ratio);
      }
      const std::string threads =
          c.host_probe_threads > 1
              ? " on the slowest of " + std::to_string(c.host_probe_threads) + " cores busy at once"
              : "";
      std::printf("\nhost speed: the calibrated ops took %.2fx their calibrated time during this "
                  "run%s (%.2fx to %.2fx over %zu tables; %s from the probe before the steps to "
                  "the one after); at that speed%s the predicted step is %.2f %s (%s)\n",
                  c.host_speed.overall, threads.c_str(), lo, hi, c.host_speed.by_table.size(),
                  Pct(100 * (c.host_drift_within_run - 1)).c_str(),
                  c.predicted_step_at_measured_load_s > 0 ? " and the measured expert load" : "",
                  c.predicted_step_at_host_speed_s * u.scale, u.name,
                  Pct(ErrorPct(c.predicted_step_at_host_speed_s, c.measured_step_s)).c_str());
    }
    std::printf("\nerrors are (predicted - measured) / measured; pp_bubble is the time blocked in "
                "pipeline sends and receives, waiting for the peer included\n");
    std::printf("summary: %s step time %s (predicted %.2f %s, measured %.2f %s), peak memory %s\n",
                l.ShortName().c_str(), Pct(step_err).c_str(), c.predicted_step_s * u.scale, u.name,
                c.measured_step_s * u.scale, u.name, Pct(mem_err).c_str());
  }
  if (f.max_error_pct >= 0 && !(std::fabs(step_err) <= f.max_error_pct)) {
    std::fprintf(stderr, "ptdp: step-time error %.1f%% is above --max-error %g%%\n", step_err,
                 f.max_error_pct);
    return kAboveMaxError;
  }
  return 0;
}

}  // namespace

Runner SetupCompare(CLI::App* sub) {
  auto f = std::make_shared<CompareFlags>();
  sub->add_option("plan", f->plan_file, "plan.yaml written by `ptdp plan --out`")->required();
  sub->add_option("measured", f->measured_file, "measured.json written by `ptdp train --out`")
      ->required();
  sub->add_option("--cluster", f->cluster,
                  "predict on this cluster YAML instead of the plan's (e.g. a calibrated one)");
  sub->add_option("--max-error", f->max_error_pct,
                  "exit with code 3 when |step-time error| is above this many percent");
  sub->add_flag("--json", f->json, "machine-readable output (step_time_error_pct at the top)");
  return [f] { return RunCompare(*f); };
}

}  // namespace ptdp::cli
