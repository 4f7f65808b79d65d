// The whole GPT chunk (runtime/gpt.h: embedding, 2 layers, final LN, tied output, vocab-parallel
// cross entropy) on the CUDA backend against the CPU backend: the first step's loss and every
// parameter gradient, in both GEMM precisions, and the CUDA step run twice bit for bit.
//
// Setup: one chunk holding the whole model at tp 1 without sequence parallelism, with a
// ThreadWorld of size 1 as its TP communicator. That communicator is host-only (it would read
// device pointers as host memory), which is valid here because at tp 1 the chunk calls no
// collective at all: GatherSeq/ReduceSeq return their input, the cross entropy's all-reduces and
// FinalizeTpGrads are skipped when tp == 1 (runtime/gpt.cc).
//
// Model: L 2, h 128, heads 4 (d 32), f 512, s 64, vocabulary 200 (padded to 256: 56 masked
// rows), micro-batch 4, so GEMMs have K up to 512 and softmax rows are 64 long.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/thread_communicator.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/gpt.h"

namespace ptdp::rt::cuda {
namespace {

constexpr int64_t kB = 4;
constexpr int64_t kSeq = 64;
constexpr int64_t kVocab = 200;
constexpr uint64_t kSeed = 4321;
constexpr double kTimeoutS = 10.0;

ModelSpec Small() {
  ModelSpec m;
  m.name = "small";
  m.layers = 2;
  m.hidden = 128;
  m.heads = 4;
  m.kv_heads = 4;
  m.ffn_hidden = 512;
  m.seq_len = kSeq;
  m.vocab = kVocab;
  return m;
}

struct StepResult {
  double loss = 0.0;
  std::map<std::string, std::vector<float>> grads;  // by parameter name
  std::map<std::string, ParamSpec> specs;
};

// Forward + backward of one fixed micro-batch on `be`; the grads start at zero.
StepResult OneStep(Backend& be) {
  StepResult r;
  ThreadWorld world(1, kTimeoutS);
  auto comm = world.Group(0, {0}, "TP");
  EXPECT_TRUE(comm.ok()) << comm.status().message();
  if (!comm.ok()) return r;
  GptChunkConfig cfg;
  cfg.model = Small();
  cfg.n_layers = 2;
  cfg.has_embedding = true;
  cfg.has_output = true;
  cfg.seed = kSeed;
  auto chunk = GptChunk::Create(cfg, be, **comm);
  EXPECT_TRUE(chunk.ok()) << chunk.status().message();
  if (!chunk.ok()) return r;

  std::mt19937 gen(7);
  std::uniform_int_distribution<int32_t> id(0, int32_t(kVocab) - 1);
  std::vector<int32_t> window(size_t(kB * (kSeq + 1)));
  for (int32_t& t : window) t = id(gen);
  std::vector<int32_t> in, tg;  // (b, s): inputs and next tokens
  for (int64_t bi = 0; bi < kB; ++bi)
    for (int64_t t = 0; t < kSeq; ++t) {
      in.push_back(window[size_t(bi * (kSeq + 1) + t)]);
      tg.push_back(window[size_t(bi * (kSeq + 1) + t + 1)]);
    }
  Tensor tokens = *be.Alloc({kB, kSeq}, DType::kI32), targets = *be.Alloc({kB, kSeq}, DType::kI32);
  EXPECT_TRUE(be.CopyFromHost(in.data(), tokens).ok());
  EXPECT_TRUE(be.CopyFromHost(tg.data(), targets).ok());

  auto loss = (*chunk)->Forward(0, tokens, targets, 1.0f);
  EXPECT_TRUE(loss.ok()) << loss.status().message();
  if (!loss.ok()) return r;
  auto dx = (*chunk)->Backward(0, Tensor());
  EXPECT_TRUE(dx.ok()) << dx.status().message();
  Status synced = be.Synchronize();
  EXPECT_TRUE(synced.ok()) << synced.message();
  float host_loss = 0.0f;
  EXPECT_TRUE(be.CopyToHost(*loss, &host_loss).ok());
  r.loss = host_loss;
  for (const ChunkParam& p : (*chunk)->params()) {
    std::vector<float> g(size_t(p.grad.numel()));
    EXPECT_TRUE(be.CopyToHost(p.grad, g.data()).ok());
    r.grads[p.spec.name] = std::move(g);
    r.specs[p.spec.name] = p.spec;
  }
  return r;
}

const StepResult& CpuReference() {
  static const StepResult ref = [] {
    CpuBackend be;
    return OneStep(be);
  }();
  return ref;
}

std::unique_ptr<CudaBackend> OpenGpu(GemmPrecision precision) {
  CudaBackendOptions o;
  o.gemm = precision;
  auto be = CudaBackend::Create(o);
  EXPECT_TRUE(be.ok()) << be.status().message();
  return be.ok() ? std::move(be).value() : nullptr;
}

// Every gradient tensor: max |gpu - cpu| <= rel_tol * max |cpu| (a per-tensor scale, since
// single elements near zero carry only rounding noise); the padded vocabulary rows of the word
// embedding are exactly zero on the GPU too (masked logits give zero probabilities).
void ExpectGradsNear(const StepResult& got, const StepResult& want, double rel_tol) {
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (const auto& [name, w] : want.grads) {
    ASSERT_TRUE(got.grads.count(name)) << name;
    const std::vector<float>& g = got.grads.at(name);
    ASSERT_EQ(g.size(), w.size()) << name;
    double scale = 0.0, worst = 0.0;
    for (size_t i = 0; i < w.size(); ++i) {
      scale = std::max(scale, double(std::fabs(w[i])));
      worst = std::max(worst, std::fabs(double(g[i]) - double(w[i])));
    }
    EXPECT_GT(scale, 0.0) << name << ": a zero gradient checks nothing";
    EXPECT_LE(worst, rel_tol * scale) << name << ": largest error " << worst << " against "
                                      << scale << " the largest |grad|";
  }
  const std::vector<float>& word = got.grads.at("embedding.word");
  const int64_t h = Small().hidden;
  for (int64_t row = kVocab; row < Small().padded_vocab(1); ++row)
    for (int64_t i = 0; i < h; ++i)
      ASSERT_EQ(word[size_t(row * h + i)], 0.0f) << "padded row " << row;
}

class CudaGpt : public ::testing::Test {
 protected:
  void SetUp() override {
    const CudaInfo info = ProbeCuda();
    if (info.gpus_visible == 0) GTEST_SKIP() << "no CUDA GPU visible: " << info.why_none;
  }
};

// The reference itself, without a GPU: the harness drives a whole step, the loss at init is
// near log(200) = 5.30 (weights ~N(0, 0.02^2): logits of std ~0.02 sqrt(h) ~ 0.2, a nearly
// uniform softmax over the 200 real rows; padding masked), and no gradient is zero.
TEST(CudaGptReference, CpuStepIsSane) {
  const StepResult& ref = CpuReference();
  EXPECT_NEAR(ref.loss, std::log(double(kVocab)), 0.05);
  EXPECT_EQ(ref.grads.size(), 2 + 2 * 12 + 2u);  // embeddings, 12 per layer, final LN
  for (const auto& [name, g] : ref.grads) {
    double norm = 0.0;
    for (float v : g) norm += double(v) * v;
    EXPECT_GT(norm, 0.0) << name;
  }
}

TEST_F(CudaGpt, Fp32StepMatchesCpu) {
  // Exact fp32 GEMMs: the backends differ only in the order of fp32 additions (and the CPU's
  // double row sums), ~1e-6 relative per op; 1e-4 of the largest gradient leaves a wide margin
  // and still fails on any real error (a wrong index moves gradients by O(1) of their scale).
  const StepResult& ref = CpuReference();
  auto gpu = OpenGpu(GemmPrecision::kFp32);
  ASSERT_NE(gpu, nullptr);
  const StepResult got = OneStep(*gpu);
  EXPECT_NEAR(got.loss, ref.loss, 1e-5 * ref.loss);
  ExpectGradsNear(got, ref, 1e-4);
}

TEST_F(CudaGpt, Bf16StepMatchesCpuWithinBf16Rounding) {
  // bf16 GEMM inputs (<= 2^-8 relative rounding per operand, fp32 sums): a GEMM's output is off
  // by ~2^-8 * 0.6 ~ 0.2% of its magnitude (std), and a gradient passes through up to ~10 GEMMs
  // from the loss, so ~0.5% typical and a few times that at the worst element of a tensor:
  // 5% of the largest |grad| per tensor. The loss (~log 200 = 5.3) moves by the average logit
  // error, ~1e-4 here: 1e-2 absolute.
  const StepResult& ref = CpuReference();
  auto gpu = OpenGpu(GemmPrecision::kBf16);
  ASSERT_NE(gpu, nullptr);
  const StepResult got = OneStep(*gpu);
  EXPECT_NEAR(got.loss, ref.loss, 1e-2);
  ExpectGradsNear(got, ref, 5e-2);
}

TEST_F(CudaGpt, StepIsBitIdenticalRunToRun) {
  auto gpu = OpenGpu(GemmPrecision::kBf16);
  ASSERT_NE(gpu, nullptr);
  const StepResult a = OneStep(*gpu);
  const StepResult b = OneStep(*gpu);
  EXPECT_EQ(0, std::memcmp(&a.loss, &b.loss, sizeof(double)));
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (const auto& [name, g] : a.grads) {
    const std::vector<float>& h = b.grads.at(name);
    ASSERT_EQ(g.size(), h.size());
    EXPECT_EQ(0, std::memcmp(g.data(), h.data(), g.size() * sizeof(float))) << name;
  }
  EXPECT_EQ(gpu->CurrentBytes(), 0u);  // chunks and batches gone: nothing leaked
}

}  // namespace
}  // namespace ptdp::rt::cuda
