// The CUDA backend op by op against the CPU backend (the reference, style.md habit 10) on random
// inputs, with the tolerance of each comparison stated where it is used; GEMMs and attention in
// both GEMM precisions; determinism (the same inputs twice give bit-identical outputs); memory
// accounting; the first-error contract. Tests that need a GPU skip with "no CUDA GPU visible:
// <why>" when ProbeCuda() finds none; ProbeCuda and the failing Create run everywhere.
//
// Tolerances, for inputs of size <= 1:
//  - fp32 GEMMs (CUBLAS_COMPUTE_32F): both backends round each of the K products and sums to
//    fp32 in different orders: |err| <= 1e-5 sqrt(K) max|a| max|b| (a rounding error of ~6e-8
//    per operation, grown like a random walk over K terms, with a wide margin).
//  - bf16 GEMMs (CUBLAS_COMPUTE_32F_FAST_16BF): each operand is rounded to bf16 (8 significant
//    bits: round-to-nearest has relative error <= 2^-8, standard deviation ~0.41 * 2^-8 over
//    the mantissas), so a product a_k b_k is off by a relative ~0.58 * 2^-8 (std); the K
//    products are summed in fp32. Independent errors add like a random walk: the sum's std is
//    ~0.58 * 2^-8 sqrt(sum_k (a_k b_k)^2) <= 0.58 * 2^-8 sqrt(K) max|a| max|b|, and ~0.19 * 2^-8
//    sqrt(K) for uniform inputs in [-1, 1] (E[a^2 b^2] = 1/9). The bound 2^-7 sqrt(K) max|a|
//    max|b| is 3.4 such deviations at worst and ~10 for these tests' uniform inputs: rounding
//    this file's GEMM inputs to bf16 on the host (round to nearest even, exact sums) gives
//    errors of at most 0.36 of it. cuBLAS does not document how FAST_16BF rounds: truncation
//    doubles the error (host emulation: up to 1.0 of 2^-7), so the tests use 2^-6. A wrong
//    transpose or offset gives errors of order sqrt(K)/3, still ~20x above it.
//  - kernels: the same fp32 formula as the CPU backend; element-wise ops are exact or within an
//    ulp (tanhf/expf vs std::tanh/std::exp, fused multiply-adds), reductions differ by the
//    order of their fp32 additions.
#include "runtime/cuda/cuda_backend.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "runtime/cpu/cpu_backend.h"

namespace ptdp::rt::cuda {

// gtest prints test parameters with PrintTo, found by argument-dependent lookup.
void PrintTo(GemmPrecision p, std::ostream* os) {
  *os << (p == GemmPrecision::kBf16 ? "bf16" : "fp32");
}

namespace {

using ::testing::HasSubstr;

constexpr double kBf16Unit = 1.0 / 64.0;  // 2^-6: see the bf16 GEMM tolerance above

std::vector<float> Random(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

std::vector<int32_t> RandomIds(size_t n, uint32_t seed, int32_t lo, int32_t hi) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(lo, hi - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = dist(gen);
  return v;
}

double MaxAbs(const std::vector<float>& v) {
  double m = 0.0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

std::string Name(GemmPrecision p) { return p == GemmPrecision::kBf16 ? "bf16" : "fp32"; }

// Expects |got - want| <= abs_tol + rel_tol |want| element by element; reports the first few
// failures and the largest error.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double abs_tol,
                 double rel_tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - double(want[i]));
    worst = std::max(worst, err);
    if (!(err <= abs_tol + rel_tol * std::fabs(want[i])) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs CPU " << want[i];
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size()
                    << " elements out of tolerance, largest error " << worst;
}

void ExpectBitIdentical(const std::vector<float>& a, const std::vector<float>& b,
                        const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << what;
}

// A CUDA backend on device 0 (or a skip) and the CPU reference, with tensors holding the same
// values on both.
class CudaTest : public ::testing::Test {
 protected:
  struct Both {
    Tensor c;  // on the CPU backend
    Tensor g;  // on the CUDA backend
  };

  void SetUp() override { Open(GemmPrecision::kFp32); }

  void Open(GemmPrecision precision, size_t capacity_bytes = 0,
            AttentionKernel attention = AttentionKernel::kFlash) {
    const CudaInfo info = ProbeCuda();
    if (info.gpus_visible == 0) GTEST_SKIP() << "no CUDA GPU visible: " << info.why_none;
    CudaBackendOptions o;
    o.gemm = precision;
    o.capacity_bytes = capacity_bytes;
    o.attention = attention;
    auto be = CudaBackend::Create(o);
    ASSERT_TRUE(be.ok()) << be.status().message();
    gpu = std::move(be).value();
  }

  Tensor GpuF(const Shape& shape, const std::vector<float>& v = {}) {
    Result<Tensor> t = gpu->Alloc(shape, DType::kF32);
    EXPECT_TRUE(t.ok()) << t.status().message();
    if (!v.empty()) {
      EXPECT_TRUE(gpu->CopyFromHost(v.data(), *t).ok());
    }
    return *t;
  }
  Both F(const Shape& shape, const std::vector<float>& v = {}) {
    Both b{*cpu.Alloc(shape, DType::kF32), GpuF(shape, v)};
    if (!v.empty()) {
      EXPECT_TRUE(cpu.CopyFromHost(v.data(), b.c).ok());
    }
    return b;
  }
  Both I(const Shape& shape, const std::vector<int32_t>& v) {
    Both b{*cpu.Alloc(shape, DType::kI32), *gpu->Alloc(shape, DType::kI32)};
    EXPECT_TRUE(cpu.CopyFromHost(v.data(), b.c).ok());
    EXPECT_TRUE(gpu->CopyFromHost(v.data(), b.g).ok());
    return b;
  }
  std::vector<float> GpuHost(const Tensor& t) {
    std::vector<float> v(size_t(t.numel()));
    Status s = gpu->CopyToHost(t, v.data());
    EXPECT_TRUE(s.ok()) << s.message();
    return v;
  }
  std::vector<float> CpuHost(const Tensor& t) {
    std::vector<float> v(size_t(t.numel()));
    EXPECT_TRUE(cpu.CopyToHost(t, v.data()).ok());
    return v;
  }
  void ExpectNear(const Both& t, double abs_tol, double rel_tol, const std::string& what) {
    ExpectClose(GpuHost(t.g), CpuHost(t.c), abs_tol, rel_tol, what);
  }
  void ExpectEqual(const Both& t, const std::string& what) {
    ExpectBitIdentical(GpuHost(t.g), CpuHost(t.c), what);
  }

  CpuBackend cpu;
  std::unique_ptr<CudaBackend> gpu;
};

// The same, with the GEMM precision as the test parameter.
class CudaGemmTest : public CudaTest, public ::testing::WithParamInterface<GemmPrecision> {
 protected:
  void SetUp() override { Open(GetParam()); }
  // The tolerance of a K-term dot product of inputs bounded by amax, bmax (file comment).
  double GemmTol(int64_t k, double amax, double bmax) const {
    const double unit = GetParam() == GemmPrecision::kBf16 ? kBf16Unit : 1e-5;
    return unit * std::sqrt(double(k)) * amax * bmax;
  }
};
INSTANTIATE_TEST_SUITE_P(Cuda, CudaGemmTest,
                         ::testing::Values(GemmPrecision::kFp32, GemmPrecision::kBf16),
                         [](const ::testing::TestParamInfo<GemmPrecision>& i) {
                           return Name(i.param);
                         });

// ---- without a GPU ------------------------------------------------------------------------------

TEST(CudaProbe, NeverFailsAndSaysWhyNone) {
  const CudaInfo info = ProbeCuda();
  EXPECT_GE(info.gpus_visible, 0);
  EXPECT_GT(info.runtime_version, 0);  // the runtime library answers without a driver
  EXPECT_GT(info.cublas_version, 0);
  EXPECT_GT(info.nccl_version, 0);
  if (info.gpus_visible == 0) {
    EXPECT_FALSE(info.why_none.empty());
    EXPECT_TRUE(info.device_name.empty());
    EXPECT_EQ(info.device_memory_bytes, 0u);
  } else {
    EXPECT_TRUE(info.why_none.empty()) << info.why_none;
    EXPECT_FALSE(info.device_name.empty());
    EXPECT_GT(info.device_memory_bytes, 0u);
  }
}

TEST(CudaCreate, FailsNamingTheDeviceAndTheReason) {
  const CudaInfo info = ProbeCuda();
  // Without GPUs device 0 does not exist; with GPUs, the first ordinal past them.
  const int missing = info.gpus_visible;
  CudaBackendOptions o;
  o.device = missing;
  auto be = CudaBackend::Create(o);
  ASSERT_FALSE(be.ok());
  const std::string m = be.status().message();
  EXPECT_THAT(m, HasSubstr("CUDA device " + std::to_string(missing) + ": "));
  EXPECT_THAT(m, HasSubstr("`ptdp info`"));
  if (info.gpus_visible == 0) {
    EXPECT_THAT(m, HasSubstr(info.why_none));  // e.g. "no CUDA-capable device is detected (...)"
  } else {
    EXPECT_THAT(m, HasSubstr("no such device"));
  }
  o.device = -1;
  EXPECT_FALSE(CudaBackend::Create(o).ok());
}

// ---- memory ---------------------------------------------------------------------------------------

TEST_F(CudaTest, AllocIsZeroedCountedAndPeakResets) {
  const size_t base = gpu->CurrentBytes();
  EXPECT_EQ(base, 0u);
  {
    Tensor dirty = GpuF({2, 3});
    gpu->Fill(7.0f, dirty);
    ASSERT_TRUE(gpu->Synchronize().ok());
  }  // back to the pool: the next allocation of this size likely reuses it, and must be zeroed
  Tensor a = GpuF({2, 3});  // 24 bytes
  EXPECT_EQ(GpuHost(a), std::vector<float>(6, 0.0f));
  Tensor ids = *gpu->Alloc(Shape{10}, DType::kI32);  // 40 bytes
  std::vector<int32_t> host(10, -1);
  ASSERT_TRUE(gpu->CopyToHost(ids, host.data()).ok());
  EXPECT_EQ(host, std::vector<int32_t>(10, 0));
  EXPECT_EQ(gpu->CurrentBytes(), 64u);
  Tensor view = a.View(Shape{3}, 3);  // a view costs nothing
  EXPECT_EQ(gpu->CurrentBytes(), 64u);
  Tensor empty = *gpu->Alloc(Shape{0, 4}, DType::kF32);  // empty tensors are fine
  EXPECT_EQ(empty.numel(), 0);
  ids = Tensor();
  EXPECT_EQ(gpu->CurrentBytes(), 24u);
  EXPECT_EQ(gpu->PeakBytes(), 64u);
  gpu->ResetPeak();
  EXPECT_EQ(gpu->PeakBytes(), 24u);
  EXPECT_FALSE(gpu->Alloc(Shape{2, -1}, DType::kF32).ok());
  EXPECT_TRUE(gpu->Synchronize().ok());
}

TEST_F(CudaTest, AllocPastCapacityFailsNamingShapeBytesAndDevice) {
  Open(GemmPrecision::kFp32, /*capacity_bytes=*/100);
  Tensor a = GpuF({20});                                   // 80 of 100 bytes
  Result<Tensor> b = gpu->Alloc(Shape{2, 3}, DType::kF32);  // 24 more: 104 > 100
  ASSERT_FALSE(b.ok());
  const std::string m = b.status().message();
  EXPECT_THAT(m, HasSubstr("(2, 3) f32"));
  EXPECT_THAT(m, HasSubstr("24 bytes do not fit (80 in use of a 100-byte capacity)"));
  EXPECT_THAT(m, HasSubstr("CUDA device 0"));
  EXPECT_EQ(gpu->CurrentBytes(), 80u);  // the failed request is not counted
  EXPECT_TRUE(gpu->Alloc(Shape{5}, DType::kF32).ok());  // exactly 100
}

TEST_F(CudaTest, AllocBeyondTheDeviceFailsWithCudasReason) {
  // 2^50 bytes (a petabyte) exceed every GPU: cudaMallocAsync's own error, not a crash.
  Result<Tensor> huge = gpu->Alloc(Shape{int64_t(1) << 48}, DType::kF32);
  ASSERT_FALSE(huge.ok());
  EXPECT_THAT(huge.status().message(), HasSubstr("1125899906842624 bytes"));
  EXPECT_THAT(huge.status().message(), HasSubstr("cudaMallocAsync"));
  EXPECT_EQ(gpu->CurrentBytes(), 0u);
  EXPECT_TRUE(gpu->Synchronize().ok());  // an allocation failure is not a pending op failure
  EXPECT_TRUE(GpuF({4}).defined());      // and the backend still works
}

TEST_F(CudaTest, TensorMayOutliveItsBackend) {
  Tensor t = GpuF({1024});
  gpu->Fill(1.0f, t);
  gpu.reset();  // synchronizes and destroys the stream
  t = Tensor();  // freed synchronously through the shared state
}

TEST_F(CudaTest, ScratchCountsInPeakBytes) {
  const int64_t b = 2, s = 64, nh = 2, d = 16, a = nh * d;
  Tensor qkv = GpuF({b, s, 3 * a}, Random(size_t(b * s * 3 * a), 1));
  Tensor out = GpuF({b, s, a}), saved = GpuF(gpu->AttentionSavedShape(b, s, nh, d));
  const size_t live = gpu->CurrentBytes();
  gpu->ResetPeak();
  gpu->AttentionForward(qkv, nh, TokenOrder::kBatchFirst, out, saved);
  ASSERT_TRUE(gpu->Synchronize().ok());
  // Unpacked q, k, v (3X) and the per-head output (X), X = b*nh*s*d floats.
  const size_t scratch = size_t(4 * b * nh * s * d) * sizeof(float);
  EXPECT_EQ(gpu->PeakBytes(), live + scratch);
  EXPECT_EQ(gpu->CurrentBytes(), live);  // freed at the end of the op
}

// ---- errors ---------------------------------------------------------------------------------------

TEST_F(CudaTest, FirstFailureIsReturnedOnceAndLaterOpsAreSkipped) {
  // A capacity that holds the attention's tensors but not its scratch: the op fails inside.
  const int64_t b = 1, s = 4, nh = 1, d = 2, a = nh * d;
  const size_t tensors = size_t(b * s * 3 * a + b * s * a + b * nh * s * s + 4) * sizeof(float);
  Open(GemmPrecision::kFp32, tensors);
  Tensor qkv = GpuF({b, s, 3 * a}, Random(size_t(b * s * 3 * a), 2));
  Tensor out = GpuF({b, s, a}), saved = GpuF(gpu->AttentionSavedShape(b, s, nh, d)), x = GpuF({4});
  ASSERT_EQ(gpu->CurrentBytes(), tensors);

  gpu->AttentionForward(qkv, nh, TokenOrder::kBatchFirst, out, saved);
  gpu->Fill(1.0f, x);  // skipped: a failure is pending
  Status first = gpu->Synchronize();
  ASSERT_FALSE(first.ok());
  EXPECT_THAT(first.message(), HasSubstr("AttentionForward scratch: Alloc (3, 1, 4, 2) f32"));
  EXPECT_THAT(first.message(), HasSubstr("do not fit"));
  EXPECT_TRUE(gpu->Synchronize().ok());  // returned once
  EXPECT_EQ(GpuHost(x), std::vector<float>(4, 0.0f));

  // CopyToHost returns a pending failure too, and the backend works again afterwards.
  gpu->AttentionForward(qkv, nh, TokenOrder::kBatchFirst, out, saved);
  std::vector<float> host(4, -1.0f);
  Status again = gpu->CopyToHost(x, host.data());
  EXPECT_THAT(again.message(), HasSubstr("AttentionForward scratch"));
  gpu->Fill(1.0f, x);
  EXPECT_EQ(GpuHost(x), std::vector<float>(4, 1.0f));
  EXPECT_TRUE(gpu->Synchronize().ok());
}

// ---- GEMM -----------------------------------------------------------------------------------------

TEST_P(CudaGemmTest, AllTransposesAgainstCpu) {
  // Odd sizes, so that no dimension is a multiple of a tensor-core tile.
  const int64_t M = 37, K = 129, P = 61;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? P : K, bc = tb ? K : P;
      Both a = F({ar, ac}, Random(size_t(M * K), 3)), b = F({br, bc}, Random(size_t(K * P), 4));
      Both c = F({M, P});
      cpu.Matmul(a.c, ta, b.c, tb, c.c);
      gpu->Matmul(a.g, ta, b.g, tb, c.g);
      ExpectNear(c, GemmTol(K, 1, 1), 0, "c ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
    }
  }
  EXPECT_TRUE(gpu->Synchronize().ok());
}

TEST_P(CudaGemmTest, AlphaBetaRank3AndUnreadOutput) {
  // x (2, 5, 33) read as 10 rows: y = x @ w^T with w (7, 33); y starts as NaN (beta 0: not read).
  const int64_t K = 33;
  Both x = F({2, 5, K}, Random(size_t(10 * K), 5)), w = F({7, K}, Random(size_t(7 * K), 6));
  Both y = F({2, 5, 7}, std::vector<float>(70, std::numeric_limits<float>::quiet_NaN()));
  cpu.Fill(0.0f, y.c);
  cpu.Matmul(x.c, false, w.c, true, y.c);
  gpu->Matmul(x.g, false, w.g, true, y.g);
  ExpectNear(y, GemmTol(K, 1, 1), 0, "y");
  // y = 0.5 x w^T + 2 y: the accumulation of dW += dy^T x with other alpha, beta.
  cpu.Matmul(x.c, false, w.c, true, y.c, 0.5f, 2.0f);
  gpu->Matmul(x.g, false, w.g, true, y.g, 0.5f, 2.0f);
  ExpectNear(y, 3 * GemmTol(K, 1, 1), 0, "y, alpha 0.5 beta 2");
}

TEST_P(CudaGemmTest, BatchedAgainstCpu) {
  // The attention shapes: L = 6 of (s, d) @ (s, d)^T and (s, s)^T @ (s, d).
  const int64_t L = 6, s = 45, d = 24;
  Both q = F({L, s, d}, Random(size_t(L * s * d), 7)), k = F({L, s, d}, Random(size_t(L * s * d), 8));
  Both scores = F({L, s, s});
  cpu.MatmulBatched(q.c, false, k.c, true, scores.c, 0.25f);
  gpu->MatmulBatched(q.g, false, k.g, true, scores.g, 0.25f);
  ExpectNear(scores, 0.25 * GemmTol(d, 1, 1), 0, "q k^T / 4");
  Both p = F({L, s, s}, Random(size_t(L * s * s), 9, 0, 1)), dv = F({L, s, d});
  cpu.MatmulBatched(p.c, true, q.c, false, dv.c);
  gpu->MatmulBatched(p.g, true, q.g, false, dv.g);
  ExpectNear(dv, GemmTol(s, 1, 1), 0, "p^T q");
}

TEST_P(CudaGemmTest, EmptySumScalesTheOutput) {
  // K = 0 (a stored (K, M) = (0, 3) and transposed; a (3, 0) would read as 0 rows): c = beta c,
  // without asking cuBLAS.
  Both a = F({0, 3}), b = F({0, 2}), c = F({3, 2}, {1, 2, 3, 4, 5, 6});
  gpu->Matmul(a.g, true, b.g, false, c.g, 1.0f, 0.5f);
  EXPECT_EQ(GpuHost(c.g), (std::vector<float>{0.5f, 1, 1.5f, 2, 2.5f, 3}));
  gpu->Matmul(a.g, true, b.g, false, c.g);
  EXPECT_EQ(GpuHost(c.g), std::vector<float>(6, 0.0f));
}

TEST_F(CudaTest, Bf16GemmRoundsItsInputsAndFp32DoesNot) {
  // a = 1 + 2^-10 everywhere, b = 1: each dot over K = 128 is 128 (1 + 2^-10) = 128.125 in fp32
  // (exact); bf16 keeps 8 significant bits, so a rounds to 1 and the dot is 128.
  const int64_t n = 128;
  const float one_plus = 1.0f + 1.0f / 1024.0f;
  Tensor a = GpuF({n, n}, std::vector<float>(size_t(n * n), one_plus));
  Tensor b = GpuF({n, n}, std::vector<float>(size_t(n * n), 1.0f)), c = GpuF({n, n});
  gpu->Matmul(a, false, b, false, c);
  EXPECT_EQ(GpuHost(c), std::vector<float>(size_t(n * n), 128.125f));
  Open(GemmPrecision::kBf16);
  a = GpuF({n, n}, std::vector<float>(size_t(n * n), one_plus));
  b = GpuF({n, n}, std::vector<float>(size_t(n * n), 1.0f));
  c = GpuF({n, n});
  gpu->Matmul(a, false, b, false, c);
  EXPECT_EQ(GpuHost(c), std::vector<float>(size_t(n * n), 128.0f));
}

// ---- bias, LayerNorm, GeLU ---------------------------------------------------------------------

TEST_F(CudaTest, AddBiasAndBiasGrad) {
  const int64_t N = 300, C = 70;
  Both y = F({N, C}, Random(size_t(N * C), 10)), bias = F({C}, Random(size_t(C), 11));
  cpu.AddBias(y.c, bias.c);
  gpu->AddBias(y.g, bias.g);
  ExpectEqual(y, "y + bias");  // one fp32 add: exact
  // A position embedding: (b, s*h) += wpe (s*h).
  Both x = F({2, 3 * 5}, Random(30, 12)), wpe = F({3 * 5}, Random(15, 13));
  cpu.AddBias(x.c, wpe.c);
  gpu->AddBias(x.g, wpe.g);
  ExpectEqual(x, "x + wpe");
  // dbias adds the column sums of 300 values in [-2, 2] (y + bias: sums up to ~300). The two
  // backends add in different orders: each of the 300 adds rounds by up to half an ulp of the
  // partial sum (1.5e-5 at 256), a random walk of ~2.6e-4 at worst columns; 3e-6 relative (8e-4
  // at 270) is ~3 of those deviations, 1e-4 absolute for the small sums.
  Both db = F({C}, Random(size_t(C), 14));
  cpu.BiasGrad(y.c, db.c);
  gpu->BiasGrad(y.g, db.g);
  ExpectNear(db, 1e-4, 3e-6, "dbias");
  // 1024 columns: 8 a thread with 16-byte loads (C = 70 above: one).
  Both y8 = F({N, 1024}, Random(size_t(N * 1024), 15)), db8 = F({1024}, Random(1024, 16));
  cpu.BiasGrad(y8.c, db8.c);
  gpu->BiasGrad(y8.g, db8.g);
  ExpectNear(db8, 1e-4, 3e-6, "dbias, 1024 columns");
}

TEST_F(CudaTest, BiasGradOverManyChunksIsExact) {
  // 8.5M rows of ones (more than 65535 chunks of 128 rows: the chunks grow) in 3 columns: every
  // partial sum is an integer below 2^24, so fp32 adds it exactly: dbias = 1 + 8.5M.
  const int64_t N = 8500000, C = 3;
  Tensor dy = GpuF({N, C}), db = GpuF({C}, {1, 1, 1});
  gpu->Fill(1.0f, dy);
  gpu->BiasGrad(dy, db);
  EXPECT_EQ(GpuHost(db), std::vector<float>(3, 8500001.0f));
}

TEST_F(CudaTest, LayerNormForwardAndBackward) {
  // C = 3 (fewer columns than a warp's lanes), C = 1031 (each lane loops) and C = 1024 (8
  // columns a lane with 16-byte loads, the kernels' vector path), N = 300 rows.
  for (int64_t C : {int64_t(3), int64_t(1031), int64_t(1024)}) {
    const int64_t N = 300;
    const std::string at = " at C = " + std::to_string(C);
    Both x = F({N, C}, Random(size_t(N * C), 15, -2, 3)), gamma = F({C}, Random(size_t(C), 16));
    Both beta = F({C}, Random(size_t(C), 17)), y = F({N, C}), mean = F({N}), rstd = F({N});
    cpu.LayerNormForward(x.c, gamma.c, beta.c, 1e-5f, y.c, mean.c, rstd.c);
    gpu->LayerNormForward(x.g, gamma.g, beta.g, 1e-5f, y.g, mean.g, rstd.g);
    // |xhat| <= sqrt(C): fp32 mean/variance in another order, ~1e-6 relative.
    ExpectNear(y, 2e-5, 1e-5, "y" + at);
    ExpectNear(mean, 1e-6, 1e-5, "mean" + at);
    ExpectNear(rstd, 0, 1e-5, "rstd" + at);
    // Backward adds to dx, dgamma, dbeta (all start random).
    Both dy = F({N, C}, Random(size_t(N * C), 18)), dx = F({N, C}, Random(size_t(N * C), 19));
    Both dg = F({C}, Random(size_t(C), 20)), db = F({C}, Random(size_t(C), 21));
    cpu.LayerNormBackward(dy.c, x.c, gamma.c, mean.c, rstd.c, dx.c, dg.c, db.c);
    gpu->LayerNormBackward(dy.g, x.g, gamma.g, mean.g, rstd.g, dx.g, dg.g, db.g);
    ExpectNear(dx, 5e-5, 1e-5, "dx" + at);
    // Sums of 300 terms of size ~1: fp32 in another order (and the CPU sums in fp32 too).
    ExpectNear(dg, 2e-4, 1e-5, "dgamma" + at);
    ExpectNear(db, 2e-4, 1e-5, "dbeta" + at);
    // In place: y aliases x.
    gpu->LayerNormForward(x.g, gamma.g, beta.g, 1e-5f, x.g, mean.g, rstd.g);
    ExpectClose(GpuHost(x.g), CpuHost(y.c), 2e-5, 1e-5, "y in place" + at);
  }
}

TEST_F(CudaTest, GeluForwardAndBackward) {
  const int64_t n = 100003;
  Both x = F({n}, Random(size_t(n), 22, -6, 6)), y = F({n});
  cpu.GeluForward(x.c, y.c);
  gpu->GeluForward(x.g, y.g);
  ExpectNear(y, 1e-6, 1e-6, "gelu");  // tanhf vs std::tanh: an ulp or two
  Both d = F({n}, Random(size_t(n), 23));
  cpu.GeluBackward(d.c, x.c, d.c);  // in place: dx aliases dy
  gpu->GeluBackward(d.g, x.g, d.g);
  // The derivative uses sech^2 = 1 - tanh^2: tanhf's <= 2 ulp (1.2e-7) become 2.4e-7 absolute,
  // times 0.5 |x| sqrt(2/pi) (1 + 0.134 x^2) <= 14 at |x| = 6: 3.3e-6.
  ExpectNear(d, 1e-5, 1e-6, "dgelu");
  gpu->GeluForward(x.g, x.g);  // y aliases x
  ExpectClose(GpuHost(x.g), CpuHost(y.c), 1e-6, 1e-6, "gelu in place");
}

// ---- attention -------------------------------------------------------------------------------------

struct AttnCase {
  GemmPrecision precision;
  TokenOrder order;
  AttentionKernel kernel = AttentionKernel::kFlash;  // bf16 only: fp32 is always unfused
  int64_t b = 2, s = 67, nh = 3, d = 16;
};

std::string KernelName(AttentionKernel k) {
  return k == AttentionKernel::kFlash ? "flash" : k == AttentionKernel::kFlashMma ? "flash_mma"
                                                                                  : "unfused";
}

std::string CaseName(const AttnCase& c) {
  std::string n = Name(c.precision);
  if (c.precision == GemmPrecision::kBf16) n += "_" + KernelName(c.kernel);
  n += c.order == TokenOrder::kBatchFirst ? "_batch_first" : "_seq_first";
  return n + "_b" + std::to_string(c.b) + "_s" + std::to_string(c.s) + "_nh" +
         std::to_string(c.nh) + "_d" + std::to_string(c.d);
}

void PrintTo(const AttnCase& c, std::ostream* os) { *os << CaseName(c); }

class CudaAttentionTest : public CudaTest, public ::testing::WithParamInterface<AttnCase> {
 protected:
  void SetUp() override { Open(GetParam().precision, 0, GetParam().kernel); }
};
// s = 67: rows longer than a warp and not a multiple of it or of the flash tiles (64); nh = 3
// heads of d = 16 (padded to 64 by the flash kernels). Then the flash kernels' real head sizes
// (64: GPT-2; 128: Llama; 80 and 96 padded to 128) over several tiles, and a one-token sequence;
// each for both flash variants (FlashVariant: WMMA, and the register-resident mma.sync kernels).
std::vector<AttnCase> AttentionCases() {
  std::vector<AttnCase> cases = {
      AttnCase{GemmPrecision::kFp32, TokenOrder::kBatchFirst},
      AttnCase{GemmPrecision::kFp32, TokenOrder::kSeqFirst},
      AttnCase{GemmPrecision::kBf16, TokenOrder::kBatchFirst, AttentionKernel::kUnfused},
      AttnCase{GemmPrecision::kBf16, TokenOrder::kSeqFirst, AttentionKernel::kUnfused}};
  for (AttentionKernel k : {AttentionKernel::kFlash, AttentionKernel::kFlashMma}) {
    cases.push_back(AttnCase{GemmPrecision::kBf16, TokenOrder::kBatchFirst, k});
    cases.push_back(AttnCase{GemmPrecision::kBf16, TokenOrder::kSeqFirst, k});
    cases.push_back(AttnCase{GemmPrecision::kBf16, TokenOrder::kSeqFirst, k, 1, 130, 2, 64});
    cases.push_back(AttnCase{GemmPrecision::kBf16, TokenOrder::kBatchFirst, k, 2, 200, 2, 128});
    cases.push_back(AttnCase{GemmPrecision::kBf16, TokenOrder::kSeqFirst, k, 3, 129, 2, 96});
    cases.push_back(AttnCase{GemmPrecision::kBf16, TokenOrder::kBatchFirst, k, 2, 1, 2, 80});
  }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Cuda, CudaAttentionTest, ::testing::ValuesIn(AttentionCases()),
                         [](const ::testing::TestParamInfo<AttnCase>& i) {
                           return CaseName(i.param);
                         });

TEST_P(CudaAttentionTest, ForwardAndBackwardAgainstCpu) {
  const AttnCase& c = GetParam();
  const int64_t b = c.b, s = c.s, nh = c.nh, d = c.d, a = nh * d;
  const bool bf16 = c.precision == GemmPrecision::kBf16;
  const bool flash = bf16 && c.kernel != AttentionKernel::kUnfused;
  const TokenOrder order = c.order;
  // Every GPU this is built for (sm_80, sm_90) runs the flash kernels: a silent fallback to the
  // unfused path would test the wrong kernel.
  ASSERT_EQ(gpu->UsesFlashAttention(d), flash);
  const Shape in_shape = order == TokenOrder::kBatchFirst ? Shape{b, s, 3 * a} : Shape{s, b, 3 * a};
  const Shape out_shape = order == TokenOrder::kBatchFirst ? Shape{b, s, a} : Shape{s, b, a};
  Both qkv = F(in_shape, Random(size_t(b * s * 3 * a), 24));
  Both out = F(out_shape);
  // The flash kernels keep the log-sum-exp per query, the unfused path P as the CPU.
  Both saved{*cpu.Alloc(cpu.AttentionSavedShape(b, s, nh, d), DType::kF32),
             GpuF(gpu->AttentionSavedShape(b, s, nh, d))};
  const Shape want_saved = flash ? Shape{b, nh, s} : cpu.AttentionSavedShape(b, s, nh, d);
  EXPECT_EQ(gpu->AttentionSavedShape(b, s, nh, d), want_saved);
  cpu.AttentionForward(qkv.c, nh, order, out.c, saved.c);
  gpu->AttentionForward(qkv.g, nh, order, out.g, saved.g);
  // fp32: sums of <= 67 terms of size <= 1 in another order. bf16 (inputs in [-1, 1]): a
  // score's error has std ~0.19 * 2^-8 sqrt(d) (file comment), ~0.19 * 2^-8 = 0.0007 after the
  // 1/sqrt(d) scale whatever d, so <= 0.004 (5 std); each P is then within a relative 2 * 0.004
  // (a softmax moves by at most twice the largest change of its inputs); P v adds <= 2^-7
  // (sum_u P = 1, |v| <= 1, each product within 2^-7 relative): |out error| <= 0.016 < 0.02.
  // The flash kernels round P to bf16 before P v as cuBLAS does in the unfused path. (Host
  // emulations with bf16-rounded operands: P within 0.0005, out within 0.0031 unfused; the
  // flash tiling, 64 x 64 tiles and the online softmax in base 2: out within 0.0025 of its
  // largest element, dqkv within 0.0045, at the shapes above.)
  if (!flash) ExpectNear(saved, bf16 ? 0.01 : 3e-6, 0, "P");
  ExpectNear(out, bf16 ? 0.02 : 1e-5, 0, "out");
  Both dout = F(out_shape, Random(size_t(b * s * a), 25)), dqkv = F(in_shape);
  cpu.AttentionBackward(dout.c, qkv.c, out.c, saved.c, nh, order, dqkv.c);
  // The GPU's backward from the GPU's forward (its own out and P or lse), as in training.
  gpu->AttentionBackward(dout.g, qkv.g, out.g, saved.g, nh, order, dqkv.g);
  // bf16: four chained GEMMs on rounded operands, each within ~2^-8 relative of its terms,
  // and the softmax backward's subtraction: 5% of the largest gradient.
  const std::vector<float> want = CpuHost(dqkv.c);
  ExpectClose(GpuHost(dqkv.g), want, (bf16 ? 5e-2 : 1e-4) * MaxAbs(want), 0, "dqkv");
  if (flash) {
    // No atomics: the same inputs again give bit-identical out, lse and dqkv.
    Tensor out2 = GpuF(out_shape), saved2 = GpuF(gpu->AttentionSavedShape(b, s, nh, d));
    Tensor dqkv2 = GpuF(in_shape);
    gpu->AttentionForward(qkv.g, nh, order, out2, saved2);
    gpu->AttentionBackward(dout.g, qkv.g, out2, saved2, nh, order, dqkv2);
    ExpectBitIdentical(GpuHost(out2), GpuHost(out.g), "out again");
    ExpectBitIdentical(GpuHost(saved2), GpuHost(saved.g), "lse again");
    ExpectBitIdentical(GpuHost(dqkv2), GpuHost(dqkv.g), "dqkv again");
  }
  EXPECT_TRUE(gpu->Synchronize().ok());
}

// ---- embedding -------------------------------------------------------------------------------------

TEST_F(CudaTest, EmbeddingShardForwardAndBackwardAreExact) {
  // A shard of V = 50 rows starting at global row 30 of a 100-token vocabulary: tokens below 30
  // and from 80 on are other shards'. 2500 tokens (more than one 1024-token round of the
  // backward) with many repeats. h = 1100: 35 column blocks and several row groups.
  const int64_t V = 50, h = 1100, n = 2500, start = 30;
  Both table = F({V, h}, Random(size_t(V * h), 26)), tokens = I({n}, RandomIds(size_t(n), 27, 0, 100));
  Both out = F({n, h});
  cpu.EmbeddingForward(tokens.c, table.c, start, out.c);
  gpu->EmbeddingForward(tokens.g, table.g, start, out.g);
  ExpectEqual(out, "lookup");
  // The backward adds token by token in row order on both backends: bit-identical.
  Both dout = F({n, h}, Random(size_t(n * h), 28)), dtable = F({V, h}, Random(size_t(V * h), 29));
  cpu.EmbeddingBackward(dout.c, tokens.c, start, dtable.c);
  gpu->EmbeddingBackward(dout.g, tokens.g, start, dtable.g);
  ExpectEqual(dtable, "dtable");
  // Small h (one column block, the most row groups) and position ids.
  Both pos = F({8, 4}, Random(32, 30)), ids = I({6}, {0, 7, 7, 3, 0, 7}), dpos = F({8, 4});
  Both g = F({6, 4}, Random(24, 31));
  cpu.EmbeddingBackward(g.c, ids.c, 0, dpos.c);
  gpu->EmbeddingBackward(g.g, ids.g, 0, dpos.g);
  ExpectEqual(dpos, "dposition");
}

// ---- cross entropy ---------------------------------------------------------------------------------

TEST_F(CudaTest, CrossEntropyFiveOpsAgainstCpu) {
  // GPT-2's padded vocabulary in one shard (rows far longer than any shared-memory buffer),
  // logits in [-8, 8], one row with masked entries as the model writes them (-1e30).
  const int64_t N = 6, V = 50304, start = 1000;
  std::vector<float> lv = Random(size_t(N * V), 32, -8, 8);
  for (int64_t v = V - 100; v < V; ++v) lv[size_t(3 * V + v)] = -1e30f;  // not a target
  // Targets in the shard [1000, 51304) and outside it (below and above).
  Both logits = F({N, V}, lv), targets = I({N}, {1000, 5, 51303, 20000, 60000, 1001});
  Both mx = F({N}), se = F({N}), z = F({N}), loss = F({N});
  cpu.CrossEntropyMax(logits.c, mx.c);
  gpu->CrossEntropyMax(logits.g, mx.g);
  ExpectEqual(mx, "row_max");
  // From here both backends get the CPU's pieces, so that each op is compared alone.
  Both gmx = F({N}, CpuHost(mx.c));
  cpu.CrossEntropySumExp(logits.c, gmx.c, se.c);
  gpu->CrossEntropySumExp(logits.g, gmx.g, se.g);
  ExpectNear(se, 0, 2e-6, "sum_exp");  // both sum in double; expf vs std::exp
  cpu.CrossEntropyTarget(logits.c, targets.c, start, z.c);
  gpu->CrossEntropyTarget(logits.g, targets.g, start, z.g);
  ExpectEqual(z, "target_logit");
  Both gse = F({N}, CpuHost(se.c));
  cpu.CrossEntropyLoss(gmx.c, gse.c, z.c, loss.c);
  gpu->CrossEntropyLoss(gmx.g, gse.g, z.g, loss.g);
  ExpectNear(loss, 1e-6, 1e-6, "loss");
  // In place, scaled by 1 / N: each element is (p - onehot) / 6, p < 1.
  cpu.CrossEntropyBackward(logits.c, targets.c, start, gmx.c, gse.c, 1.0f / N, logits.c);
  gpu->CrossEntropyBackward(logits.g, targets.g, start, gmx.g, gse.g, 1.0f / N, logits.g);
  ExpectNear(logits, 1e-9, 1e-5, "dlogits");
}

// ---- element-wise and sums -----------------------------------------------------------------------

TEST_F(CudaTest, ElementWiseOps) {
  const int64_t n = 70001;
  Both a = F({n}, Random(size_t(n), 33)), b = F({n}, Random(size_t(n), 34)), c = F({n});
  cpu.Add(a.c, b.c, c.c);
  gpu->Add(a.g, b.g, c.g);
  ExpectEqual(c, "a + b");
  cpu.Add(c.c, a.c, c.c);  // out aliases an input
  gpu->Add(c.g, a.g, c.g);
  ExpectEqual(c, "c + a in place");
  cpu.Axpy(-0.3f, a.c, c.c);
  gpu->Axpy(-0.3f, a.g, c.g);
  ExpectNear(c, 1e-7, 1e-6, "c - 0.3 a");  // the GPU may fuse the multiply-add
  cpu.Scale(0.5f, c.c);
  gpu->Scale(0.5f, c.g);
  ExpectNear(c, 1e-7, 1e-6, "c / 2");
  gpu->Fill(-2.5f, c.g);
  EXPECT_EQ(GpuHost(c.g), std::vector<float>(size_t(n), -2.5f));
}

// The CP ring's attention blocks (issue 16) against the CPU backend: the rank's own block then
// another rank's merged into it (cp 2, rank 1: positions L.., 2L..; rank 0's keys at 0.., 3L..),
// the backward of both blocks; and CopyColumns. fp32 throughout (the blocks use no GEMMs).
TEST_F(CudaTest, AttentionBlocksAgainstCpu) {
  const int64_t b = 2, L = 37, n = 2 * L, nh = 3, d = 16, a = nh * d;
  const SeqBlock mine{L, 2 * L, L}, other{0, 3 * L, L};
  Both qkv = F({n, b, 3 * a}, Random(size_t(n * b * 3 * a), 71));
  Both kv_own = F({n, b, 2 * a}), kv = F({n, b, 2 * a}, Random(size_t(n * b * 2 * a), 72));
  cpu.CopyColumns(qkv.c, a, kv_own.c, 0, 2 * a);
  gpu->CopyColumns(qkv.g, a, kv_own.g, 0, 2 * a);
  ExpectEqual(kv_own, "CopyColumns");
  Both out = F({n, b, a}), lse = F({b, nh, n});
  cpu.AttentionBlockForward(qkv.c, mine, kv_own.c, mine, nh, true, out.c, lse.c);
  gpu->AttentionBlockForward(qkv.g, mine, kv_own.g, mine, nh, true, out.g, lse.g);
  cpu.AttentionBlockForward(qkv.c, mine, kv.c, other, nh, false, out.c, lse.c);
  gpu->AttentionBlockForward(qkv.g, mine, kv.g, other, nh, false, out.g, lse.g);
  ExpectNear(out, 1e-5, 1e-5, "block out");
  ExpectNear(lse, 1e-5, 1e-5, "block lse");
  Both dout = F({n, b, a}, Random(size_t(n * b * a), 73));
  Both dqkv = F({n, b, 3 * a}), dkv_own = F({n, b, 2 * a}), dkv = F({n, b, 2 * a});
  cpu.AttentionBlockBackward(dout.c, qkv.c, mine, kv_own.c, mine, out.c, lse.c, nh, dqkv.c,
                             dkv_own.c);
  gpu->AttentionBlockBackward(dout.g, qkv.g, mine, kv_own.g, mine, out.g, lse.g, nh, dqkv.g,
                              dkv_own.g);
  cpu.AttentionBlockBackward(dout.c, qkv.c, mine, kv.c, other, out.c, lse.c, nh, dqkv.c, dkv.c);
  gpu->AttentionBlockBackward(dout.g, qkv.g, mine, kv.g, other, out.g, lse.g, nh, dqkv.g, dkv.g);
  ExpectNear(dqkv, 1e-4, 1e-4, "block dqkv");
  ExpectNear(dkv_own, 1e-4, 1e-4, "block dkv (own)");
  ExpectNear(dkv, 1e-4, 1e-4, "block dkv (other)");
  EXPECT_TRUE(gpu->Synchronize().ok());
}

// The MoE combine's ops (issue 16): per-row scaling (in place too) and per-row dot products.
TEST_F(CudaTest, ScaleRowsAndRowDotAgainstCpu) {
  const int64_t rows = 301, cols = 70;
  Both x = F({rows, cols}, Random(size_t(rows * cols), 74));
  Both y = F({rows, cols}, Random(size_t(rows * cols), 75));
  Both w = F({rows}, Random(size_t(rows), 76)), out = F({rows, cols}), dot = F({rows});
  cpu.ScaleRows(x.c, w.c, out.c);
  gpu->ScaleRows(x.g, w.g, out.g);
  ExpectEqual(out, "ScaleRows");
  cpu.ScaleRows(out.c, w.c, out.c);
  gpu->ScaleRows(out.g, w.g, out.g);
  ExpectEqual(out, "ScaleRows in place");
  cpu.RowDot(x.c, y.c, dot.c);
  gpu->RowDot(x.g, y.g, dot.g);
  ExpectNear(dot, 1e-6, 1e-6, "RowDot");  // both in double, summed in another order
}

// bf16 storage (issue 17): Copy fp32 -> bf16 (CUDA's __float2bfloat16_rn) against the host's
// Bf16Round, bit for bit, on random values and on ties, carries, Inf, NaN, -0.0 and overflow;
// bf16 -> fp32 back exactly; CopyFromHost into bf16 rounds the same way.
TEST_F(CudaTest, Bf16ConversionMatchesTheCpuBitForBit) {
  std::vector<float> v = Random(100003, 77);
  for (float& x : v) x *= 1000.0f;
  const float ulp = std::ldexp(1.0f, -7);
  for (float x : {1.0f + ulp / 2, 1.0f + 1.5f * ulp, 2.0f - ulp / 4, -0.0f, 0.0f, 1e-40f,
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::quiet_NaN()})
    v.push_back(x);
  const Shape shape{int64_t(v.size())};
  Both x = F(shape, v), back = F(shape);
  Both half{*cpu.Alloc(shape, DType::kBF16), *gpu->Alloc(shape, DType::kBF16)};
  cpu.Copy(x.c, half.c);
  gpu->Copy(x.g, half.g);
  cpu.Copy(half.c, back.c);
  gpu->Copy(half.g, back.g);
  Tensor uploaded = *gpu->Alloc(shape, DType::kBF16);
  ASSERT_TRUE(gpu->CopyFromHost(v.data(), uploaded).ok());
  std::vector<float> c(v.size()), up(v.size());
  ASSERT_TRUE(cpu.CopyToHost(back.c, c.data()).ok());
  ASSERT_TRUE(gpu->CopyToHost(uploaded, up.data()).ok());
  const std::vector<float> g = GpuHost(back.g);
  ASSERT_EQ(g.size(), c.size());
  for (size_t i = 0; i < c.size(); ++i) {
    if (std::isnan(c[i])) {
      EXPECT_TRUE(std::isnan(g[i]) && std::isnan(up[i])) << i;
      continue;
    }
    uint32_t a, b, u;
    std::memcpy(&a, &c[i], 4);
    std::memcpy(&b, &g[i], 4);
    std::memcpy(&u, &up[i], 4);
    EXPECT_EQ(a, b) << "element " << i << " (" << v[i] << ")";
    EXPECT_EQ(a, u) << "CopyFromHost, element " << i << " (" << v[i] << ")";
  }
}

TEST_F(CudaTest, CopyReshapesAnyDtype) {
  Both ids = I({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor flat = *gpu->Alloc(Shape{6}, DType::kI32);
  gpu->Copy(ids.g, flat);
  std::vector<int32_t> out(6);
  ASSERT_TRUE(gpu->CopyToHost(flat, out.data()).ok());
  EXPECT_EQ(out, (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
  Tensor a = GpuF({3, 2}, {1, 2, 3, 4, 5, 6}), b = GpuF({6});
  Tensor tail = b.View(Shape{2}, 4);
  gpu->Copy(a.View(Shape{2}, 2), tail);  // views at offsets
  EXPECT_EQ(GpuHost(b), (std::vector<float>{0, 0, 0, 0, 3, 4}));
}

TEST_F(CudaTest, SumsAddToTheirOutput) {
  // By hand, then 3M values (many blocks) against the CPU: both sum in double.
  Tensor small = GpuF({3}, {1, 2, 3}), acc = GpuF({1}, {10});
  gpu->SumSquares(small, acc);  // 10 + 1 + 4 + 9
  EXPECT_EQ(GpuHost(acc)[0], 24.0f);
  gpu->Sum(small, acc);  // + 6
  EXPECT_EQ(GpuHost(acc)[0], 30.0f);
  const int64_t n = 3000017;
  Both x = F({n}, Random(size_t(n), 35)), s = F({1}, {0.5f}), sq = F({1}, {0.5f});
  cpu.Sum(x.c, s.c);
  gpu->Sum(x.g, s.g);
  ExpectNear(s, 1e-6, 1e-6, "sum");
  cpu.SumSquares(x.c, sq.c);
  gpu->SumSquares(x.g, sq.g);
  ExpectNear(sq, 0, 1e-6, "sum of squares");  // ~1e6: double sums, one fp32 rounding each
}

TEST_F(CudaTest, AdamWThreeStepsAgainstCpu) {
  const int64_t n = 5003;  // 625 groups of 8 (16-byte loads) and a tail of 3
  Both p = F({n}, Random(size_t(n), 36)), m = F({n}), v = F({n}), g = F({n});
  AdamWConfig cfg;
  cfg.lr = 0.01f;
  cfg.weight_decay = 0.1f;
  for (int64_t step = 1; step <= 3; ++step) {
    const std::vector<float> gv = Random(size_t(n), uint32_t(37 + step));
    ASSERT_TRUE(cpu.CopyFromHost(gv.data(), g.c).ok());
    ASSERT_TRUE(gpu->CopyFromHost(gv.data(), g.g).ok());
    cfg.step = step;
    cfg.grad_scale = 0.5f * float(step);
    cpu.AdamW(p.c, g.c, m.c, v.c, cfg);
    gpu->AdamW(p.g, g.g, m.g, v.g, cfg);
  }
  // The same fp32 formula (the GPU may fuse multiply-adds): params ~1 moved by ~3 lr.
  ExpectNear(p, 1e-6, 1e-6, "param");
  ExpectNear(m, 1e-7, 1e-5, "m");
  ExpectNear(v, 1e-8, 1e-5, "v");
}

// ---- bf16 tensors (Megatron --bf16 storage: runtime/backend.h's dtype rules) -----------------------
// Both backends get the same bf16 inputs (CopyFromHost rounds on the host for both), compute the
// op's fp32 formula and round each bf16 output once. So a bf16 output agrees with the CPU's
// within the op's fp32 tolerance plus one bf16 step where the two fp32 results straddle a
// rounding boundary (a step is 2^-8..2^-7 of the value: kBf16Step relative), and an fp32 output
// (statistics, parameter gradients, accumulators) within the op's fp32 tolerance.
constexpr double kBf16Step = 1.0 / 128;

class CudaBf16Test : public CudaTest {
 protected:
  Both B(const Shape& shape, const std::vector<float>& v = {}) {
    Both b{*cpu.Alloc(shape, DType::kBF16), *gpu->Alloc(shape, DType::kBF16)};
    if (!v.empty()) {
      EXPECT_TRUE(cpu.CopyFromHost(v.data(), b.c).ok());
      EXPECT_TRUE(gpu->CopyFromHost(v.data(), b.g).ok());
    }
    return b;
  }
};

// bf16 operands on tensor cores with fp32 accumulation: into a bf16 output (rounded once) and
// into an fp32 weight gradient accumulated twice (beta 1, never rounded). The products of bf16
// values are exact in fp32 on both backends; only the order of the K additions differs.
TEST_F(CudaBf16Test, GemmsIntoBf16AndFp32Outputs) {
  const int64_t M = 70, K = 300, P = 90;
  Both a = B({M, K}, Random(size_t(M * K), 80)), w = B({P, K}, Random(size_t(P * K), 81));
  Both y = B({M, P});
  cpu.Matmul(a.c, false, w.c, true, y.c);
  gpu->Matmul(a.g, false, w.g, true, y.g);
  ExpectNear(y, 1e-5 * std::sqrt(double(K)), kBf16Step, "y = a w^T in bf16");
  Both dy = B({M, P}, Random(size_t(M * P), 82)), dw = F({P, K}, Random(size_t(P * K), 83));
  for (int i = 0; i < 2; ++i) {
    cpu.Matmul(dy.c, true, a.c, false, dw.c, 1.0f, 1.0f);
    gpu->Matmul(dy.g, true, a.g, false, dw.g, 1.0f, 1.0f);
  }
  ExpectNear(dw, 2e-5 * std::sqrt(double(M)), 0, "dw += dy^T a, twice, fp32");
  EXPECT_TRUE(gpu->Synchronize().ok());
}

// The epilogue GEMMs (cuBLASLt's BIAS and GELU_AUX_BIAS) against the CPU's fused reference:
// each bf16 output the fp32 sum (and its GeLU) rounded once; the qkv and FC1 shapes of a layer
// (p a multiple of 8, as the GeLU's aux output needs) and one that is not (the fallback).
TEST_F(CudaBf16Test, EpilogueGemmsAgainstTheCpu) {
  for (const int64_t p : {int64_t(192), int64_t(100)}) {
    SCOPED_TRACE("p = " + std::to_string(p));
    const int64_t M = 70, K = 64;
    Both a = B({M, K}, Random(size_t(M * K), 180)), w = B({p, K}, Random(size_t(p * K), 181));
    Both bias = B({p}, Random(size_t(p), 182));
    Both c = B({M, p}), pre = B({M, p}), act = B({M, p});
    cpu.MatmulBias(a.c, false, w.c, true, bias.c, c.c);
    gpu->MatmulBias(a.g, false, w.g, true, bias.g, c.g);
    ExpectNear(c, 1e-5 * std::sqrt(double(K)), kBf16Step, "a w^T + bias");
    cpu.MatmulBiasGelu(a.c, false, w.c, true, bias.c, pre.c, act.c);
    gpu->MatmulBiasGelu(a.g, false, w.g, true, bias.g, pre.g, act.g);
    ExpectNear(pre, 1e-5 * std::sqrt(double(K)), kBf16Step, "pre-activation");
    if (p % 8 == 0) {
      ExpectNear(act, 1e-5 * std::sqrt(double(K)), kBf16Step, "gelu(a w^T + bias)");
    } else {
      // The fallback (MatmulBias, then GeluForward of the stored pre): the GeLU of the rounded
      // pre-activation, off the fused reference by up to |gelu'| 2^-9 |pre| (0.016 at |pre| 3,
      // far above a bf16 step of small outputs): compared with the CPU's GeLU of that pre.
      Tensor want = *cpu.Alloc({M, p}, DType::kBF16);
      cpu.GeluForward(pre.c, want);
      ExpectClose(GpuHost(act.g), CpuHost(want), 1e-6, kBf16Step, "gelu(stored pre), fallback");
    }
    // FC2's dgrad through the GeLU (DGELU epilogue; p = 100 falls back to Matmul and
    // GeluBackward, which round dx twice: within the same step).
    Both wkn = B({K, p}, Random(size_t(K * p), 183)), at = B({M, p}, Random(size_t(M * p), 184, -3, 3));
    Both dx = B({M, p});
    cpu.MatmulGeluBackward(a.c, false, wkn.c, false, at.c, dx.c);
    gpu->MatmulGeluBackward(a.g, false, wkn.g, false, at.g, dx.g);
    ExpectNear(dx, 1e-5 * std::sqrt(double(K)), kBf16Step, "gelu'(pre) * (a w)");
  }
  EXPECT_TRUE(gpu->Synchronize().ok());
}

// The residual connection and the fused residual + LayerNorm kernel against the CPU's reference
// (the fp32 sum rounded once; the norm of the stored sum).
TEST_F(CudaBf16Test, ResidualAndLayerNormAgainstTheCpu) {
  // c = 1100: one element a lane at a time; c = 1024: 8 with 16-byte loads (the vector path).
  for (const int64_t c : {int64_t(1100), int64_t(1024)}) {
    SCOPED_TRACE("c = " + std::to_string(c));
    const int64_t n = 37;
    Both x = B({n, c}, Random(size_t(n * c), 190, -2, 2)), r = B({n, c}, Random(size_t(n * c), 191));
    Both bias = B({c}, Random(size_t(c), 192)), gamma = B({c}, Random(size_t(c), 193));
    Both beta = B({c}, Random(size_t(c), 194));
    Both x2 = B({n, c}, CpuHost(x.c)), y = B({n, c}), mean = F({n}), rstd = F({n});
    cpu.AddBiasResidual(x.c, bias.c, r.c);
    gpu->AddBiasResidual(x.g, bias.g, r.g);
    ExpectNear(x, 1e-6, kBf16Step, "x + bias + residual");
    cpu.AddBiasResidualLayerNorm(x2.c, bias.c, r.c, gamma.c, beta.c, 1e-5f, y.c, mean.c, rstd.c);
    gpu->AddBiasResidualLayerNorm(x2.g, bias.g, r.g, gamma.g, beta.g, 1e-5f, y.g, mean.g,
                                  rstd.g);
    ExpectNear(x2, 1e-6, kBf16Step, "the residual stream");
    ExpectNear(y, 2e-5, kBf16Step, "its LayerNorm");
    ExpectNear(mean, 1e-6, 1e-5, "mean (fp32)");
    ExpectNear(rstd, 0, 1e-5, "rstd (fp32)");
  }
  EXPECT_TRUE(gpu->Synchronize().ok());
}

TEST_F(CudaBf16Test, FusedOpsStoreBf16AndKeepStatisticsFp32) {
  const int64_t n = 37, c = 1100;
  Both x = B({n, c}, Random(size_t(n * c), 84, -2, 2)), gamma = B({c}, Random(size_t(c), 85));
  Both beta = B({c}, Random(size_t(c), 86)), bias = B({c}, Random(size_t(c), 87));
  Both y = B({n, c}), mean = F({n}), rstd = F({n});
  cpu.LayerNormForward(x.c, gamma.c, beta.c, 1e-5f, y.c, mean.c, rstd.c);
  gpu->LayerNormForward(x.g, gamma.g, beta.g, 1e-5f, y.g, mean.g, rstd.g);
  ExpectNear(y, 2e-5, kBf16Step, "LayerNorm y");
  ExpectNear(mean, 1e-6, 1e-5, "LayerNorm mean (fp32)");
  ExpectNear(rstd, 0, 1e-5, "LayerNorm rstd (fp32)");
  Both dy = B({n, c}, Random(size_t(n * c), 88)), dx = B({n, c}, Random(size_t(n * c), 89));
  Both dg = F({c}), db = F({c});
  cpu.LayerNormBackward(dy.c, x.c, gamma.c, mean.c, rstd.c, dx.c, dg.c, db.c);
  gpu->LayerNormBackward(dy.g, x.g, gamma.g, mean.g, rstd.g, dx.g, dg.g, db.g);
  ExpectNear(dx, 5e-5, kBf16Step, "LayerNorm dx (adds, bf16)");
  ExpectNear(dg, 2e-4, 1e-5, "LayerNorm dgamma (fp32)");
  ExpectNear(db, 2e-4, 1e-5, "LayerNorm dbeta (fp32)");
  cpu.AddBias(y.c, bias.c);
  gpu->AddBias(y.g, bias.g);
  ExpectNear(y, 2e-5, kBf16Step, "y + bias");
  Both dbias = F({c});
  cpu.BiasGrad(dy.c, dbias.c);
  gpu->BiasGrad(dy.g, dbias.g);
  ExpectNear(dbias, 1e-4, 0, "dbias (fp32)");
  Both g = B({n, c}), dgelu = B({n, c});
  cpu.GeluForward(x.c, g.c);
  gpu->GeluForward(x.g, g.g);
  ExpectNear(g, 1e-6, kBf16Step, "gelu");
  cpu.GeluBackward(dy.c, x.c, dgelu.c);
  gpu->GeluBackward(dy.g, x.g, dgelu.g);
  ExpectNear(dgelu, 1e-5, kBf16Step, "dgelu");
  EXPECT_TRUE(gpu->Synchronize().ok());
}

// The flat element-wise kernels move 8 elements a thread with 16-byte loads where every operand
// is 16-byte aligned, one at a time elsewhere and for the tail (kernels.cu, kVec): views at
// offsets that break the alignment and sizes around multiples of 8 take each path and the
// switch between them; every element is the CPU's bits either way (the same fp32 formula,
// rounded once).
TEST_F(CudaBf16Test, ElementWiseOpsOnViewsOfAnyAlignmentAndLength) {
  for (int64_t offset : {0, 1, 3, 8}) {
    for (int64_t n : {1, 7, 8, 9, 1003}) {
      SCOPED_TRACE("offset " + std::to_string(offset) + ", n " + std::to_string(n));
      const int64_t whole = n + 16;
      auto view = [&](const Both& t) { return Both{t.c.View({n}, offset), t.g.View({n}, offset)}; };
      Both xs = B({whole}, Random(size_t(whole), 120, -3, 3)), ys = B({whole});
      Both dys = B({whole}, Random(size_t(whole), 121)), accs = F({whole}, Random(size_t(whole), 122));
      Both x = view(xs), y = view(ys), dy = view(dys), acc = view(accs);
      cpu.GeluForward(x.c, y.c);
      gpu->GeluForward(x.g, y.g);
      ExpectNear(y, 1e-6, kBf16Step, "gelu");
      cpu.GeluBackward(dy.c, x.c, dy.c);
      gpu->GeluBackward(dy.g, x.g, dy.g);
      ExpectNear(dy, 1e-5, kBf16Step, "dgelu in place");
      cpu.Add(x.c, y.c, y.c);
      gpu->Add(x.g, y.g, y.g);
      ExpectNear(y, 1e-6, kBf16Step, "bf16 + bf16");
      cpu.Add(acc.c, x.c, acc.c);
      gpu->Add(acc.g, x.g, acc.g);
      ExpectEqual(acc, "fp32 += bf16");
      cpu.Axpy(-0.3f, x.c, acc.c);
      gpu->Axpy(-0.3f, x.g, acc.g);
      ExpectNear(acc, 1e-7, 1e-6, "fp32 - 0.3 bf16");
      cpu.Scale(0.5f, x.c);
      gpu->Scale(0.5f, x.g);
      ExpectEqual(x, "bf16 / 2");
      cpu.Fill(-2.5f, y.c);
      gpu->Fill(-2.5f, y.g);
      ExpectEqual(y, "fill");
      ExpectEqual(xs, "Scale's whole buffer: nothing outside the view written");
      ExpectEqual(ys, "Fill's whole buffer: nothing outside the view written");
    }
  }
  // The bias kernels take 8 columns a thread where c % 8 == 0 and every operand is aligned.
  for (int64_t offset : {0, 1}) {
    for (int64_t c : {7, 8, 24, 1000}) {
      SCOPED_TRACE("offset " + std::to_string(offset) + ", c " + std::to_string(c));
      const int64_t n = 5, whole = n * c + 16;
      auto rows = [&](const Both& t) {
        return Both{t.c.View({n, c}, offset), t.g.View({n, c}, offset)};
      };
      Both xs = B({whole}, Random(size_t(whole), 123)), rs = B({whole}, Random(size_t(whole), 124));
      Both bias = B({c + 8}, Random(size_t(c + 8), 125));
      Both x = rows(xs), res = rows(rs), b = {bias.c.View({c}, offset), bias.g.View({c}, offset)};
      cpu.AddBias(x.c, b.c);
      gpu->AddBias(x.g, b.g);
      ExpectEqual(xs, "x + bias (the whole buffer)");
      cpu.AddBiasResidual(x.c, b.c, res.c);
      gpu->AddBiasResidual(x.g, b.g, res.g);
      ExpectEqual(xs, "(x + bias) + residual (the whole buffer)");
    }
  }
}

TEST_F(CudaBf16Test, EmbeddingCrossEntropyAndElementWise) {
  // Lookups copy bf16 rows; the backward adds them into an fp32 table in row order on both.
  const int64_t V = 50, h = 300, n = 1500, start = 30;
  Both table = B({V, h}, Random(size_t(V * h), 90));
  Both tokens = I({n}, RandomIds(size_t(n), 91, 0, 100)), out = B({n, h});
  cpu.EmbeddingForward(tokens.c, table.c, start, out.c);
  gpu->EmbeddingForward(tokens.g, table.g, start, out.g);
  ExpectEqual(out, "lookup (bf16)");
  Both dout = B({n, h}, Random(size_t(n * h), 92)), dtable = F({V, h});
  cpu.EmbeddingBackward(dout.c, tokens.c, start, dtable.c);
  gpu->EmbeddingBackward(dout.g, tokens.g, start, dtable.g);
  ExpectEqual(dtable, "dtable (fp32)");
  // Cross entropy of bf16 logits: fp32 row figures, bf16 logit gradients in place. A shard
  // width that is a multiple of 8 (the kernels' 16-byte loads) and one that is not (one element
  // at a time).
  for (const int64_t Vl : {int64_t(4000), int64_t(4001)}) {
    const int64_t N = 5;
    const std::string w = " (shard of " + std::to_string(Vl) + ")";
    Both logits = B({N, Vl}, Random(size_t(N * Vl), 93, -8, 8));
    Both targets = I({N}, {1000, 5, 4999, 2000, 1001}), mx = F({N}), se = F({N}), z = F({N});
    cpu.CrossEntropyMax(logits.c, mx.c);
    gpu->CrossEntropyMax(logits.g, mx.g);
    ExpectEqual(mx, "row_max" + w);
    cpu.CrossEntropySumExp(logits.c, mx.c, se.c);
    gpu->CrossEntropySumExp(logits.g, mx.g, se.g);  // row_max is bit-identical (above)
    ExpectNear(se, 0, 2e-6, "sum_exp" + w);
    cpu.CrossEntropyTarget(logits.c, targets.c, 1000, z.c);
    gpu->CrossEntropyTarget(logits.g, targets.g, 1000, z.g);
    ExpectEqual(z, "target_logit" + w);
    Both gmx = F({N}, CpuHost(mx.c)), gse = F({N}, CpuHost(se.c));
    cpu.CrossEntropyBackward(logits.c, targets.c, 1000, gmx.c, gse.c, 1.0f / N, logits.c);
    gpu->CrossEntropyBackward(logits.g, targets.g, 1000, gmx.g, gse.g, 1.0f / N, logits.g);
    ExpectNear(logits, 1e-9, kBf16Step, "dlogits in place (bf16)" + w);
  }
  // Element-wise ops in every dtype mix the model uses: bf16 + bf16 -> bf16 (the residual),
  // fp32 + bf16 -> fp32 (the MoE combine's accumulator), in place; each one fp32 add.
  const int64_t e = 70001;
  Both a16 = B({e}, Random(size_t(e), 94)), b16 = B({e}, Random(size_t(e), 95)), c16 = B({e});
  Both a32 = F({e}, Random(size_t(e), 96));
  cpu.Add(a16.c, b16.c, c16.c);
  gpu->Add(a16.g, b16.g, c16.g);
  ExpectEqual(c16, "bf16 + bf16");
  cpu.Add(a32.c, b16.c, a32.c);
  gpu->Add(a32.g, b16.g, a32.g);
  ExpectEqual(a32, "fp32 += bf16");
  cpu.Axpy(-0.3f, c16.c, a32.c);
  gpu->Axpy(-0.3f, c16.g, a32.g);
  ExpectNear(a32, 1e-7, 1e-6, "fp32 - 0.3 bf16");
  cpu.Scale(0.5f, c16.c);
  gpu->Scale(0.5f, c16.g);
  ExpectEqual(c16, "bf16 / 2");  // exact in fp32, the same rounding
  Both w = F({e / 7}, Random(size_t(e / 7), 97)), rows = B({e / 7, 7}), dot = F({e / 7});
  Tensor c7 = c16.c.View({e / 7, 7}), g7 = c16.g.View({e / 7, 7});
  cpu.ScaleRows(c7, w.c, rows.c);
  gpu->ScaleRows(g7, w.g, rows.g);
  ExpectEqual(rows, "ScaleRows bf16");
  cpu.RowDot(c7, rows.c, dot.c);
  gpu->RowDot(g7, rows.g, dot.g);
  ExpectNear(dot, 1e-6, 1e-6, "RowDot of bf16 rows");
  Both sum = F({1}, {0.5f}), sq = F({1}, {0.5f});
  cpu.Sum(b16.c, sum.c);
  gpu->Sum(b16.g, sum.g);
  ExpectNear(sum, 1e-6, 1e-6, "sum of bf16");
  cpu.SumSquares(b16.c, sq.c);
  gpu->SumSquares(b16.g, sq.g);
  ExpectNear(sq, 0, 1e-6, "sum of squares of bf16");
  Both cols = B({e / 7, 3});
  cpu.CopyColumns(c7, 2, cols.c, 0, 3);
  gpu->CopyColumns(g7, 2, cols.g, 0, 3);
  ExpectEqual(cols, "CopyColumns bf16");
  gpu->Fill(-2.5f, c16.g);
  EXPECT_EQ(GpuHost(c16.g), std::vector<float>(size_t(e), -2.5f));
  EXPECT_TRUE(gpu->Synchronize().ok());
}

// Attention on bf16 token rows, flash and unfused: the bf16 error budget of
// CudaAttentionTest (the kernels round the same operands), with out and dqkv stored in bf16.
TEST_F(CudaBf16Test, AttentionOnBf16Rows) {
  struct Case {
    AttentionKernel kernel;
    TokenOrder order;
    int64_t b, s, nh, d;
  };
  for (const Case& c : {Case{AttentionKernel::kFlash, TokenOrder::kSeqFirst, 2, 67, 3, 16},
                        Case{AttentionKernel::kFlash, TokenOrder::kBatchFirst, 2, 200, 2, 128},
                        Case{AttentionKernel::kFlashMma, TokenOrder::kSeqFirst, 2, 67, 3, 16},
                        Case{AttentionKernel::kFlashMma, TokenOrder::kBatchFirst, 2, 200, 2, 128},
                        Case{AttentionKernel::kUnfused, TokenOrder::kSeqFirst, 2, 67, 3, 16}}) {
    Open(GemmPrecision::kBf16, 0, c.kernel);
    const int64_t a = c.nh * c.d;
    const std::string what = KernelName(c.kernel) + " d " + std::to_string(c.d);
    ASSERT_EQ(gpu->UsesFlashAttention(c.d), c.kernel != AttentionKernel::kUnfused) << what;
    const bool bf = c.order == TokenOrder::kBatchFirst;
    const Shape in = bf ? Shape{c.b, c.s, 3 * a} : Shape{c.s, c.b, 3 * a};
    const Shape os = bf ? Shape{c.b, c.s, a} : Shape{c.s, c.b, a};
    Both qkv = B(in, Random(size_t(c.b * c.s * 3 * a), 98)), out = B(os);
    Both saved{*cpu.Alloc(cpu.AttentionSavedShape(c.b, c.s, c.nh, c.d), DType::kF32),
               GpuF(gpu->AttentionSavedShape(c.b, c.s, c.nh, c.d))};
    cpu.AttentionForward(qkv.c, c.nh, c.order, out.c, saved.c);
    gpu->AttentionForward(qkv.g, c.nh, c.order, out.g, saved.g);
    ExpectNear(out, 0.02, 0, what + " out");
    Both dout = B(os, Random(size_t(c.b * c.s * a), 99)), dqkv = B(in);
    cpu.AttentionBackward(dout.c, qkv.c, out.c, saved.c, c.nh, c.order, dqkv.c);
    gpu->AttentionBackward(dout.g, qkv.g, out.g, saved.g, c.nh, c.order, dqkv.g);
    const std::vector<float> want = CpuHost(dqkv.c);
    ExpectClose(GpuHost(dqkv.g), want, 5e-2 * MaxAbs(want), 0, what + " dqkv");
    EXPECT_TRUE(gpu->Synchronize().ok()) << what;
  }
}

// The CP ring's blocks on bf16 qkv / K-V / dout / out with fp32 out, lse, dqkv, dkv (the
// accumulators a bf16 run keeps in fp32): the fp32 tolerances of AttentionBlocksAgainstCpu.
TEST_F(CudaBf16Test, AttentionBlocksOnBf16Rows) {
  const int64_t b = 2, L = 37, n = 2 * L, nh = 3, d = 16, a = nh * d;
  const SeqBlock mine{L, 2 * L, L}, other{0, 3 * L, L};
  Both qkv = B({n, b, 3 * a}, Random(size_t(n * b * 3 * a), 100));
  Both kv = B({n, b, 2 * a}, Random(size_t(n * b * 2 * a), 101));
  Both out = F({n, b, a}), lse = F({b, nh, n});
  cpu.AttentionBlockForward(qkv.c, mine, kv.c, other, nh, true, out.c, lse.c);
  gpu->AttentionBlockForward(qkv.g, mine, kv.g, other, nh, true, out.g, lse.g);
  ExpectNear(out, 1e-5, 1e-5, "block out (fp32)");
  ExpectNear(lse, 1e-5, 1e-5, "block lse");
  Both out16 = B({n, b, a}, CpuHost(out.c));  // the stored output, as the model keeps it
  Both dout = B({n, b, a}, Random(size_t(n * b * a), 102));
  Both dqkv = F({n, b, 3 * a}), dkv = F({n, b, 2 * a});
  Both glse = F({b, nh, n}, CpuHost(lse.c));
  cpu.AttentionBlockBackward(dout.c, qkv.c, mine, kv.c, other, out16.c, glse.c, nh, dqkv.c, dkv.c);
  gpu->AttentionBlockBackward(dout.g, qkv.g, mine, kv.g, other, out16.g, glse.g, nh, dqkv.g,
                              dkv.g);
  ExpectNear(dqkv, 1e-4, 1e-4, "block dqkv (fp32)");
  ExpectNear(dkv, 1e-4, 1e-4, "block dkv (fp32)");
  EXPECT_TRUE(gpu->Synchronize().ok());
}

// ---- determinism -----------------------------------------------------------------------------------

TEST_F(CudaTest, SameInputsGiveBitIdenticalOutputs) {
  // Every op with a reduction, twice on fresh outputs, in the default bf16 GEMM precision.
  Open(GemmPrecision::kBf16);
  const int64_t N = 4096, C = 96, b = 2, s = 128, nh = 4, d = 16, a = nh * d, V = 1000;
  Tensor x = GpuF({N, C}, Random(size_t(N * C), 40)), w = GpuF({C, C}, Random(size_t(C * C), 41));
  Tensor gamma = GpuF({C}, Random(size_t(C), 42)), beta = GpuF({C}, Random(size_t(C), 43));
  Tensor qkv = GpuF({s, b, 3 * a}, Random(size_t(s * b * 3 * a), 44));
  Tensor dout = GpuF({s, b, a}, Random(size_t(s * b * a), 45));
  Tensor logits = GpuF({N, V}, Random(size_t(N * V), 46, -4, 4));
  Tensor ids = *gpu->Alloc(Shape{N}, DType::kI32);
  const std::vector<int32_t> idv = RandomIds(size_t(N), 47, 0, V);
  ASSERT_TRUE(gpu->CopyFromHost(idv.data(), ids).ok());
  std::vector<std::vector<float>> first;
  for (int rep = 0; rep < 2; ++rep) {
    std::vector<Tensor> outs;
    Tensor y = GpuF({N, C}), mean = GpuF({N}), rstd = GpuF({N});
    gpu->LayerNormForward(x, gamma, beta, 1e-5f, y, mean, rstd);
    Tensor dx = GpuF({N, C}), dg = GpuF({C}), db = GpuF({C}), dw = GpuF({C, C});
    gpu->LayerNormBackward(x, y, gamma, mean, rstd, dx, dg, db);
    gpu->Matmul(dx, true, y, false, dw, 1.0f, 1.0f);
    Tensor bias_grad = GpuF({C});
    gpu->BiasGrad(dx, bias_grad);
    Tensor out = GpuF({s, b, a}), saved = GpuF(gpu->AttentionSavedShape(b, s, nh, d));
    Tensor dqkv = GpuF({s, b, 3 * a});
    gpu->AttentionForward(qkv, nh, TokenOrder::kSeqFirst, out, saved);  // flash (bf16)
    gpu->AttentionBackward(dout, qkv, out, saved, nh, TokenOrder::kSeqFirst, dqkv);
    Tensor dtable = GpuF({V, C});
    gpu->EmbeddingBackward(x, ids, 0, dtable);
    Tensor mx = GpuF({N}), se = GpuF({N}), z = GpuF({N}), loss = GpuF({N}), total = GpuF({1});
    gpu->CrossEntropyMax(logits, mx);
    gpu->CrossEntropySumExp(logits, mx, se);
    gpu->CrossEntropyTarget(logits, ids, 0, z);
    gpu->CrossEntropyLoss(mx, se, z, loss);
    gpu->Sum(loss, total);
    gpu->SumSquares(dx, total);
    outs = {y, mean, rstd, dx, dg, db, dw, bias_grad, out, dqkv, dtable, se, loss, total};
    for (size_t i = 0; i < outs.size(); ++i) {
      if (rep == 0) first.push_back(GpuHost(outs[i]));
      else ExpectBitIdentical(GpuHost(outs[i]), first[i], "output " + std::to_string(i));
    }
  }
  EXPECT_TRUE(gpu->Synchronize().ok());
}

}  // namespace
}  // namespace ptdp::rt::cuda
