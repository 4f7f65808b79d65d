// Event-simulator throughput: one step of the Megatron paper's 1T row (Narayanan 2021 table 1:
// 128 layers, h 25600, 160 heads; tp 8, pp 64, 3072 A100s, batch 3072) with the interleaved
// schedule (v = 2: one layer per virtual stage), m = 512 micro-batches = 1024 slots per rank.
// Figures go to docs/benchmarks.md; events/s = simulated operations / wall time.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>

#include "core/model.h"
#include "cost_model/analytic.h"
#include "cost_model/simulator.h"
#include "bench/fixture.h"
#include "planner/planner.h"
#include "topology/topology.h"

namespace {

using namespace ptdp;

using ptdp::bench::Fixture;

void BM_Simulate1T(benchmark::State& state) {
  static Fixture f("dgx-a100.yaml", "megatron-1t.yaml", 384);
  Layout l;
  l.tp = 8; l.pp = 64; l.dp = 6; l.vp = 2; l.micro_batch = 1; l.global_batch = 3072;
  l.schedule = ScheduleKind::kInterleaved;
  l.recompute = Recompute::kFull;
  SimOptions opt;
  opt.record_events = state.range(0) != 0;
  int64_t events = 0;
  for (auto _ : state) {
    auto r = SimulateStep(*f.cost, l, opt);
    if (!r.ok()) { state.SkipWithError(r.status().message().c_str()); return; }
    events += r->num_events;
    benchmark::DoNotOptimize(r->step_time_s);
  }
  state.counters["events/s"] = benchmark::Counter(double(events), benchmark::Counter::kIsRate);
  state.counters["events/step"] = double(events) / state.iterations();
}
BENCHMARK(BM_Simulate1T)->Arg(0)->Arg(1)->ArgName("record")->Unit(benchmark::kMillisecond);

// The whole plan for GPT-3 175B on 1024 A100s, refining the top 16 with the simulator.
void BM_Plan175bRefine16(benchmark::State& state) {
  static Fixture f("dgx-a100.yaml", "gpt3-175b.yaml", 128);
  SearchSpace s;
  s.world = 1024;
  s.global_batch = 1536;
  for (auto _ : state) {
    PlanResult r = SearchLayouts(*f.cost, f.model, f.cluster, s, 16).value();
    Status st = RefineWithSimulator(*f.cost, 16, &r);
    if (!st.ok()) { state.SkipWithError(st.message().c_str()); return; }
    benchmark::DoNotOptimize(r.top.data());
  }
}
BENCHMARK(BM_Plan175bRefine16)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
