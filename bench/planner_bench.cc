// Planner throughput: layouts evaluated per second on one core, and the wall time of the whole
// GPT-3 175B plan on 128 DGX A100 nodes (1024 GPUs) at global batch 1536, and of the Llama 3
// 405B plan on 2048 DGX H100 nodes (16,384 GPUs) at global batch 2048 (issue 14: cp, uneven
// pipeline splits and interleaving at pp 2 in the space), Llama 3 70B at 32K tokens, and
// DeepSeek-V3 on 1024 H100s with expert parallelism searched (issue 15). Figures go to
// docs/benchmarks.md; formulas: layouts/s = candidates enumerated / wall time (one thread);
// estimates/s = cost-model evaluations (legal layouts) / wall time.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>

#include "core/model.h"
#include "cost_model/analytic.h"
#include "bench/fixture.h"
#include "planner/planner.h"
#include "topology/cluster.h"
#include "topology/topology.h"

namespace {

using namespace ptdp;

using ptdp::bench::Fixture;

Fixture& F() {
  static Fixture f("dgx-a100.yaml", "gpt3-175b.yaml", 128);
  return f;
}

// The whole plan of `f`'s model on `world` GPUs: enumerate, check legality, estimate, rank.
void PlanBench(benchmark::State& state, Fixture& f, int world, int64_t global_batch) {
  SearchSpace s;
  s.world = world;
  s.global_batch = global_batch;
  int64_t evaluated = 0, legal = 0;
  for (auto _ : state) {
    PlanResult r = SearchLayouts(*f.cost, f.model, f.cluster, s, 16).value();
    evaluated += r.evaluated;
    legal += r.legal;
    benchmark::DoNotOptimize(r.top.data());
  }
  state.counters["layouts/s"] = benchmark::Counter(double(evaluated), benchmark::Counter::kIsRate);
  state.counters["estimates/s"] = benchmark::Counter(double(legal), benchmark::Counter::kIsRate);
  state.counters["layouts/plan"] = double(evaluated) / state.iterations();
}

void BM_Plan175bOn1024(benchmark::State& state) { PlanBench(state, F(), 1024, 1536); }
BENCHMARK(BM_Plan175bOn1024)->Unit(benchmark::kMillisecond);

Fixture& F405() {
  static Fixture f("dgx-h100.yaml", "llama3-405b.yaml", 2048);
  return f;
}

void BM_Plan405bOn16384(benchmark::State& state) { PlanBench(state, F405(), 16384, 2048); }
BENCHMARK(BM_Plan405bOn16384)->Unit(benchmark::kMillisecond);

// The same with the refinement `ptdp plan` does (16 layouts simulated).
void BM_Plan405bOn16384Refined(benchmark::State& state) {
  Fixture& f = F405();
  SearchSpace s;
  s.world = 16384;
  s.global_batch = 2048;
  for (auto _ : state) {
    PlanResult r = SearchLayouts(*f.cost, f.model, f.cluster, s, 16).value();
    if (!RefineWithSimulator(*f.cost, 16, &r).ok()) state.SkipWithError("refine failed");
    benchmark::DoNotOptimize(r.top.data());
  }
}
BENCHMARK(BM_Plan405bOn16384Refined)->Unit(benchmark::kMillisecond);

// DeepSeek-V3 (MoE + MLA + MTP) on 128 DGX H100 nodes at its recipes' global batch 8192: the
// expert grid (ep over the divisors of 256 that fold with etp 1 or tp) in the space (issue 15:
// >= 1,000,000 layouts/s per core, the plan under 1 s), and refined as `ptdp plan` does.
Fixture& FDsv3() {
  static Fixture f("dgx-h100.yaml", "deepseek-v3.yaml", 128);
  return f;
}
void BM_PlanDeepSeekV3On1024(benchmark::State& state) { PlanBench(state, FDsv3(), 1024, 8192); }
BENCHMARK(BM_PlanDeepSeekV3On1024)->Unit(benchmark::kMillisecond);
void BM_PlanDeepSeekV3On1024Refined(benchmark::State& state) {
  Fixture& f = FDsv3();
  SearchSpace s;
  s.world = 1024;
  s.global_batch = 8192;
  for (auto _ : state) {
    PlanResult r = SearchLayouts(*f.cost, f.model, f.cluster, s, 16).value();
    if (!RefineWithSimulator(*f.cost, 16, &r).ok()) state.SkipWithError("refine failed");
    benchmark::DoNotOptimize(r.top.data());
  }
}
BENCHMARK(BM_PlanDeepSeekV3On1024Refined)->Unit(benchmark::kMillisecond);

// One cost-model evaluation of a legal layout (the inner loop).
void BM_EvaluateOneLayout(benchmark::State& state) {
  Fixture& f = F();
  Layout l;
  l.tp = 8; l.pp = 16; l.dp = 8; l.vp = 3; l.micro_batch = 1; l.global_batch = 1536;
  l.schedule = ScheduleKind::kInterleaved;
  l.sequence_parallel = true;
  l.recompute = Recompute::kSelective;
  l.distributed_optimizer = true;
  // Every call from scratch: ResetMemo() makes AnalyticModel::Layer's per-thread memo forget
  // the layers it timed, so this is the cold cost of one layout (its op lists built and timed);
  // the planner's own rate (BM_Plan175bOn1024, estimates/s) is what the memo makes of a search.
  AnalyticModel cost = *f.cost;
  for (auto _ : state) {
    cost.ResetMemo();
    Estimate e = cost.Evaluate(l);
    benchmark::DoNotOptimize(e);
    l.micro_batch = 1 + (l.micro_batch & 1);
  }
  state.counters["estimates/s"] =
      benchmark::Counter(double(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_EvaluateOneLayout);

}  // namespace

BENCHMARK_MAIN();
