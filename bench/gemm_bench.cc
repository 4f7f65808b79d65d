// cuBLAS GEMM throughput of the CUDA backend (CudaBackend::Matmul, as the model calls it) over
// the GEMMs of one GPT-2-medium (350M) layer and its output layer: h 1024, 3h, 4h, padded
// vocabulary 50304, b*s = 8192 tokens; forward, input-gradient (dgrad) and weight-gradient
// (wgrad) shapes: bf16 tensors as a bf16 run stores them (`bf16-tensors`: bf16 operands, a bf16
// output, the weight gradient an fp32 accumulator), and fp32 tensors in both GEMM precisions
// (`bf16`: cuBLAS rounds the fp32 operands, FAST_16BF; `fp32`). Then the causal attention core
// (AttentionForward, AttentionBackward) on bf16 token rows at GPT-2 medium's shape (b 8, s 1024,
// 16 heads of 64) and a Llama one (b 2, s 4096, 32 heads of 128), with both flash kernels
// (`flash`: WMMA; `flash-mma`: registers, FlashVariant::kMma) and the unfused path. Figures
// (docs/benchmarks.md):
//   TFLOP/s = 2 M N K per GEMM / wall seconds (10 GEMMs enqueued, then one Synchronize);
//             attention: the causal half of its products, as FlashAttention reports it:
//             forward 2 b nh s^2 d (q k^T and P v, each 2 s^2 d, halved), backward 2.5 times
//             that (dV, dP, dQ, dK and the recomputed scores);
//   of_peak = TFLOP/s / the device's dense peak for that precision (table below): the bf16
//             tensor-core peak for bf16 tensors and kBf16, the fp32 CUDA-core peak for kFp32.
// Without a GPU it says so and exits 0.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cuda/cuda_backend.h"

namespace {

using ptdp::Result;
using ptdp::Status;
using ptdp::rt::DType;
using ptdp::rt::Shape;
using ptdp::rt::Tensor;
using ptdp::rt::cuda::CudaBackend;
using ptdp::rt::cuda::CudaBackendOptions;
using ptdp::rt::cuda::AttentionKernel;
using ptdp::rt::cuda::GemmPrecision;
using ptdp::rt::TokenOrder;

constexpr int kGemmsPerIteration = 10;

// Dense peaks (no structured sparsity), TFLOP/s, from NVIDIA's datasheets: H100 Tensor Core GPU
// datasheet (SXM5 and PCIe columns; GH200 has the H100 SXM GPU), H200 datasheet (SXM and NVL),
// A100 datasheet (SXM and PCIe alike), L40S datasheet. The datasheets print the bf16 figure
// "with sparsity"; dense is half of it. First match of the device name wins: specific first.
struct DevicePeak {
  const char* name_contains;  // a substring of cudaDeviceProp::name
  double bf16_tflops;         // dense bf16 tensor cores
  double fp32_tflops;         // fp32 CUDA cores (no TF32)
};
constexpr DevicePeak kPeaks[] = {
    {"H100 PCIe", 756, 51}, {"H100 NVL", 835, 60}, {"H200 NVL", 835, 60},
    {"H100", 989, 67},      {"H200", 989, 67},     {"A100", 312, 19.5},
    {"L40S", 362, 91.6},
};

const DevicePeak* FindPeak(const std::string& device_name) {
  for (const DevicePeak& p : kPeaks)
    if (device_name.find(p.name_contains) != std::string::npos) return &p;
  return nullptr;
}

// One GEMM in Matmul's terms: c (m, n) = op(a) (m, k) @ op(b) (k, n).
struct GemmShape {
  const char* name;
  int64_t m, n, k;
  bool trans_a, trans_b;
};
// x (8192, h) tokens; a linear layer with weight W (out, in): forward y = x W^T, dgrad
// dx = dy W, wgrad dW += dy^T x.
constexpr GemmShape kShapes[] = {
    {"qkv_fwd", 8192, 3072, 1024, false, true},
    {"proj_fwd", 8192, 1024, 1024, false, true},
    {"fc1_fwd", 8192, 4096, 1024, false, true},
    {"fc2_fwd", 8192, 1024, 4096, false, true},
    {"fc1_dgrad", 8192, 1024, 4096, false, false},
    {"fc1_wgrad", 4096, 1024, 8192, true, false},
    {"qkv_wgrad", 3072, 1024, 8192, true, false},
    {"logits_fwd", 8192, 50304, 1024, false, true},
    {"logits_dgrad", 8192, 1024, 50304, false, false},
    {"logits_wgrad", 50304, 1024, 8192, true, false},
};

// One backend per precision and attention kernel, created on first use (nullptr when that fails).
CudaBackend* Backend(GemmPrecision p, AttentionKernel k = AttentionKernel::kFlash) {
  static std::unique_ptr<CudaBackend> backends[2][3];
  std::unique_ptr<CudaBackend>& be = backends[p == GemmPrecision::kBf16 ? 0 : 1][int(k)];
  if (!be) {
    CudaBackendOptions o;
    o.gemm = p;
    o.attention = k;
    Result<std::unique_ptr<CudaBackend>> r = CudaBackend::Create(o);
    if (!r.ok()) {
      std::fprintf(stderr, "gemm_bench: %s\n", r.status().message().c_str());
      return nullptr;
    }
    be = std::move(r).value();
  }
  return be.get();
}

// A tensor of `shape` holding values in [-0.5, 0.5) (not zeros: the tensor cores' power, and so
// their clocks, depend on the data): a 4 MiB pattern copied in over and over.
Result<Tensor> Operand(CudaBackend& be, const Shape& shape, DType dtype = DType::kF32) {
  static const std::vector<float> pattern = [] {
    std::vector<float> v(size_t(1) << 20);
    uint32_t x = 12345;
    for (float& f : v) {
      x = x * 1664525u + 1013904223u;  // LCG (Numerical Recipes)
      f = float(x >> 8) / float(1 << 24) - 0.5f;
    }
    return v;
  }();
  Result<Tensor> t = be.Alloc(shape, dtype);
  if (!t.ok()) return t;
  const int64_t n = t->numel(), chunk = int64_t(pattern.size());
  for (int64_t at = 0; at < n; at += chunk) {
    Tensor part = t->View(Shape{std::min(chunk, n - at)}, at);
    Status s = be.CopyFromHost(pattern.data(), part);
    if (!s.ok()) return s;
  }
  return t;
}

// dtype: of the operands (and of the output, but for a weight gradient, always fp32).
void BM_Gemm(benchmark::State& state, GemmShape g, GemmPrecision p, DType dtype,
             double peak_tflops) {
  CudaBackend* be = Backend(p);
  if (be == nullptr) {
    state.SkipWithError("no CUDA backend (see stderr)");
    return;
  }
  const bool wgrad = g.trans_a;  // dw = dy^T x, accumulated in fp32 (main_grad)
  Result<Tensor> a = Operand(*be, g.trans_a ? Shape{g.k, g.m} : Shape{g.m, g.k}, dtype);
  Result<Tensor> b = Operand(*be, g.trans_b ? Shape{g.n, g.k} : Shape{g.k, g.n}, dtype);
  Result<Tensor> c = be->Alloc(Shape{g.m, g.n}, wgrad ? DType::kF32 : dtype);
  for (const Status& s : {a.status(), b.status(), c.status()}) {
    if (!s.ok()) {
      state.SkipWithError(s.message().c_str());
      return;
    }
  }
  be->Matmul(*a, g.trans_a, *b, g.trans_b, *c);  // warm-up: cuBLAS picks and loads its kernel
  Status warm = be->Synchronize();
  if (!warm.ok()) {
    state.SkipWithError(warm.message().c_str());
    return;
  }
  for (auto _ : state) {
    for (int r = 0; r < kGemmsPerIteration; ++r) be->Matmul(*a, g.trans_a, *b, g.trans_b, *c);
    Status s = be->Synchronize();
    if (!s.ok()) {
      state.SkipWithError(s.message().c_str());
      break;
    }
  }
  const double flops = 2.0 * double(g.m) * double(g.n) * double(g.k) * kGemmsPerIteration;
  state.counters["TFLOP/s"] =
      benchmark::Counter(flops / 1e12, benchmark::Counter::kIsIterationInvariantRate);
  if (peak_tflops > 0)
    state.counters["of_peak"] = benchmark::Counter(flops / (peak_tflops * 1e12),
                                                   benchmark::Counter::kIsIterationInvariantRate);
}

// The attention core of one layer: qkv (s, b, 3 A) seq-first, as the model calls it.
struct AttentionShape {
  const char* name;
  int64_t b, s, nh, d;
};
constexpr AttentionShape kAttention[] = {
    {"gpt2_medium", 8, 1024, 16, 64},
    {"llama_d128", 2, 4096, 32, 128},
};

void BM_Attention(benchmark::State& state, AttentionShape g, AttentionKernel kernel,
                  bool backward, double peak_tflops) {
  CudaBackend* be = Backend(GemmPrecision::kBf16, kernel);
  if (be == nullptr) {
    state.SkipWithError("no CUDA backend (see stderr)");
    return;
  }
  if ((kernel != AttentionKernel::kUnfused) != be->UsesFlashAttention(g.d)) {
    state.SkipWithError("the flash kernels do not run this head size on this GPU");
    return;
  }
  const int64_t a = g.nh * g.d;
  const DType bf16 = DType::kBF16;  // the token rows of a bf16 run
  Result<Tensor> qkv = Operand(*be, Shape{g.s, g.b, 3 * a}, bf16);
  Result<Tensor> dout = Operand(*be, Shape{g.s, g.b, a}, bf16);
  Result<Tensor> out = be->Alloc(Shape{g.s, g.b, a}, bf16);
  Result<Tensor> dqkv = be->Alloc(Shape{g.s, g.b, 3 * a}, bf16);
  Result<Tensor> saved = be->Alloc(be->AttentionSavedShape(g.b, g.s, g.nh, g.d), DType::kF32);
  for (const Status& s : {qkv.status(), dout.status(), out.status(), dqkv.status(),
                          saved.status()}) {
    if (!s.ok()) {
      state.SkipWithError(s.message().c_str());
      return;
    }
  }
  auto run = [&] {
    if (backward)
      be->AttentionBackward(*dout, *qkv, *out, *saved, g.nh, TokenOrder::kSeqFirst, *dqkv);
    else
      be->AttentionForward(*qkv, g.nh, TokenOrder::kSeqFirst, *out, *saved);
  };
  be->AttentionForward(*qkv, g.nh, TokenOrder::kSeqFirst, *out, *saved);  // warm-up, and out
  run();
  Status warm = be->Synchronize();
  if (!warm.ok()) {
    state.SkipWithError(warm.message().c_str());
    return;
  }
  constexpr int kCalls = 5;
  for (auto _ : state) {
    for (int r = 0; r < kCalls; ++r) run();
    Status s = be->Synchronize();
    if (!s.ok()) {
      state.SkipWithError(s.message().c_str());
      break;
    }
  }
  const double fwd = 2.0 * double(g.b * g.nh) * double(g.s) * double(g.s) * double(g.d);
  const double flops = (backward ? 2.5 : 1.0) * fwd * kCalls;
  state.counters["TFLOP/s"] =
      benchmark::Counter(flops / 1e12, benchmark::Counter::kIsIterationInvariantRate);
  if (peak_tflops > 0)
    state.counters["of_peak"] = benchmark::Counter(flops / (peak_tflops * 1e12),
                                                   benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

int main(int argc, char** argv) {
  const ptdp::rt::cuda::CudaInfo info = ptdp::rt::cuda::ProbeCuda();
  if (info.gpus_visible == 0) {
    std::printf("gemm_bench: no CUDA GPU visible (%s); nothing to measure\n",
                info.why_none.c_str());
    return 0;
  }
  const DevicePeak* peak = FindPeak(info.device_name);
  std::printf("gemm_bench: %s; dense peaks %s\n", info.device_name.c_str(),
              peak ? (std::to_string(peak->bf16_tflops) + " bf16, " +
                      std::to_string(peak->fp32_tflops) + " fp32 TFLOP/s")
                         .c_str()
                   : "unknown (no of_peak column)");
  struct GemmKind {
    const char* name;
    GemmPrecision precision;
    DType dtype;
  };
  for (const GemmShape& g : kShapes) {
    for (const GemmKind& k : {GemmKind{"bf16-tensors", GemmPrecision::kBf16, DType::kBF16},
                              GemmKind{"bf16", GemmPrecision::kBf16, DType::kF32},
                              GemmKind{"fp32", GemmPrecision::kFp32, DType::kF32}}) {
      const bool bf16 = k.precision == GemmPrecision::kBf16;
      const double tflops = peak ? (bf16 ? peak->bf16_tflops : peak->fp32_tflops) : 0.0;
      const std::string name = std::string("gemm/") + g.name + "/" + k.name;
      benchmark::RegisterBenchmark(name.c_str(), BM_Gemm, g, k.precision, k.dtype, tflops)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (const AttentionShape& g : kAttention)
    for (AttentionKernel k :
         {AttentionKernel::kFlash, AttentionKernel::kFlashMma, AttentionKernel::kUnfused})
      for (bool backward : {false, true}) {
        const char* kernel = k == AttentionKernel::kFlash      ? "/flash"
                             : k == AttentionKernel::kFlashMma ? "/flash-mma"
                                                               : "/unfused";
        const std::string name = std::string("attention/") + g.name + kernel +
                                 (backward ? "/backward" : "/forward");
        benchmark::RegisterBenchmark(name.c_str(), BM_Attention, g, k, backward,
                                     peak ? peak->bf16_tflops : 0.0)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
