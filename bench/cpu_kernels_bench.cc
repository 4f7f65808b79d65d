// The CPU backend's kernels on every level this CPU runs (runtime/cpu/cpu_kernels.h): the GEMMs
// of one layer of the compare-llmc.sh shapes (forward y = x W^T, input gradient dx = dy W, weight
// gradient dW += dy^T x) and GeLU. GFLOP/s = 2 m n k / wall time; Melem/s = elements / wall time.
// Figures go to docs/benchmarks.md.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "runtime/cpu/cpu_kernels.h"

namespace {

using ptdp::rt::CpuKernelLevel;
using ptdp::rt::CpuKernels;
using ptdp::rt::GemmArgs;

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// c (m, n) = op(a) op(b): "nt" a (m, k) times b stored (n, k) (the forward), "nn" b stored
// (k, n) (the input gradient), "tn" a stored (k, m) (the weight gradient, beta 1).
void BM_CpuGemm(benchmark::State& state, CpuKernelLevel level, std::string kind, int64_t m,
                int64_t n, int64_t k) {
  const CpuKernels& kern = ptdp::rt::KernelsFor(level);
  std::vector<float> a = Random(size_t(m * k), 1), b = Random(size_t(k * n), 2), c(size_t(m * n));
  std::vector<float> pack(kern.gemm_pack_floats(m, n, k) + 16);
  GemmArgs g;
  g.m = m, g.n = n, g.k = k;
  g.a = a.data(), g.b = b.data(), g.c = c.data(), g.ldc = n;
  g.a_rs = kind == "tn" ? 1 : k, g.a_cs = kind == "tn" ? m : 1;
  g.b_rs = kind == "nt" ? 1 : n, g.b_cs = kind == "nt" ? k : 1;
  g.beta = kind == "tn" ? 1.0f : 0.0f;
  for (auto _ : state) {
    kern.gemm(g, pack.data());
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * double(m * n * k) * double(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}

void BM_CpuGelu(benchmark::State& state, CpuKernelLevel level, bool backward) {
  const CpuKernels& kern = ptdp::rt::KernelsFor(level);
  const int64_t n = 512 * 1536;  // s2's fc1 output: b*s = 512 tokens, 4h = 1536
  std::vector<float> x = Random(size_t(n), 3), dy = Random(size_t(n), 4), y(x.size());
  for (auto _ : state) {
    if (backward) {
      kern.gelu_backward(dy.data(), x.data(), y.data(), n);
    } else {
      kern.gelu_forward(x.data(), y.data(), n);
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["Melem/s"] =
      benchmark::Counter(double(n) * double(state.iterations()) / 1e6, benchmark::Counter::kIsRate);
}

// One layer's GEMMs: tokens N = B T, hidden h, QKV 3h, MLP 4h.
struct GemmShape {
  const char* name;
  const char* kind;
  int64_t m, n, k;
};
constexpr GemmShape kShapes[] = {
    {"s1_qkv_fwd", "nt", 256, 384, 128},  {"s1_fc2_dx", "nn", 256, 512, 128},
    {"s1_fc1_dw", "tn", 512, 128, 256},   {"s2_qkv_fwd", "nt", 512, 1152, 384},
    {"s2_fc2_fwd", "nt", 512, 384, 1536}, {"s2_fc1_dx", "nn", 512, 384, 1536},
    {"s2_fc1_dw", "tn", 1536, 384, 512},
};

int Register() {
  for (CpuKernelLevel level : ptdp::rt::SupportedCpuKernelLevels()) {
    const std::string l = ptdp::rt::ToString(level);
    for (const GemmShape& s : kShapes) {
      benchmark::RegisterBenchmark(("BM_CpuGemm/" + l + "/" + s.name).c_str(), BM_CpuGemm, level,
                                   std::string(s.kind), s.m, s.n, s.k)
          ->Unit(benchmark::kMicrosecond);
    }
    benchmark::RegisterBenchmark(("BM_CpuGelu/" + l + "/forward").c_str(), BM_CpuGelu, level, false)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("BM_CpuGelu/" + l + "/backward").c_str(), BM_CpuGelu, level, true)
        ->Unit(benchmark::kMicrosecond);
  }
  return 0;
}
const int kRegistered = Register();

}  // namespace

BENCHMARK_MAIN();
