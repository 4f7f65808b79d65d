// CPU training throughput of the runtime: tokens/s of full training steps (forward, backward,
// finalize, AdamW) of a small GPT on the CPU backend, 1x1x1 and with 2 rank threads (dp 2,
// tp 2). Shapes as in scripts/compare-llmc.sh: s1 = L4 C128 NH4 T64, s2 = L6 C384 NH6 T128,
// vocabulary 256, B 4. Figures go to docs/benchmarks.md; tokens/s = B * T / step time.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "bench/shipped.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/thread_communicator.h"
#include "runtime/data.h"
#include "runtime/trainer.h"

namespace {

using namespace ptdp;

const rt::TokenCorpus& Corpus() {
  static rt::TokenCorpus c = [] {
    auto r = rt::LoadCorpus(bench::Shipped("data/tinyshakespeare/input.txt"), 0.1, 129);
    if (!r.ok()) { std::fprintf(stderr, "train_bench: %s\n", r.status().message().c_str()); std::exit(1); }
    return *r;
  }();
  return c;
}

ModelSpec Shape(int which) {
  ModelSpec m;
  m.name = which == 1 ? "s1" : "s2";
  m.layers = which == 1 ? 4 : 6;
  m.hidden = which == 1 ? 128 : 384;
  m.heads = which == 1 ? 4 : 6;
  m.kv_heads = m.heads;
  m.ffn_hidden = 4 * m.hidden;
  m.seq_len = which == 1 ? 64 : 128;
  m.vocab = 256;
  return m;
}

// Arguments: shape (1 or 2), tp, dp.
void BM_TrainStep(benchmark::State& state) {
  const ModelSpec m = Shape(int(state.range(0)));
  Layout l;
  l.tp = int(state.range(1));
  l.dp = int(state.range(2));
  l.global_batch = 4;
  l.micro_batch = 4 / l.dp;
  rt::TrainerConfig cfg;
  cfg.model = m;
  cfg.layout = l;
  cfg.train_tokens = &Corpus().train;
  rt::ThreadWorld world(l.world(), 60);
  auto trainer = rt::Trainer::Create(
      cfg, [](int) { return std::make_unique<rt::CpuBackend>(); }, world);
  if (!trainer.ok()) { state.SkipWithError(trainer.status().message().c_str()); return; }
  if (!(*trainer)->Step().ok()) { state.SkipWithError("warm-up step failed"); return; }
  for (auto _ : state) {
    auto s = (*trainer)->Step();
    if (!s.ok()) { state.SkipWithError(s.status().message().c_str()); return; }
  }
  state.counters["tokens/s"] = benchmark::Counter(double(l.global_batch * m.seq_len) * state.iterations(),
                                                  benchmark::Counter::kIsRate);
}
BENCHMARK(BM_TrainStep)
    ->ArgNames({"shape", "tp", "dp"})
    ->Args({1, 1, 1})->Args({1, 1, 2})->Args({1, 2, 1})
    ->Args({2, 1, 1})->Args({2, 1, 2})->Args({2, 2, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
