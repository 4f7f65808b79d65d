// The GEMMs core/layer_ops.h says a layer, the embedding and the output layer run are the GEMMs
// ptdp's runtime executes: one forward and backward of a GptChunk on the CPU backend, every
// Matmul's (m, n, k) recorded, compared as multisets with the op lists' GEMMs (fprop, dgrad
// and wgrad), at tp 1 and at tp 2 with and without sequence parallelism. The analytic model
// times these lists, so the two cannot disagree about what a layer is.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <iterator>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/layer_ops.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/thread_communicator.h"
#include "runtime/forwarding_backend.h"
#include "runtime/gpt.h"

namespace ptdp::rt {
namespace {

using Shape3 = std::array<int64_t, 3>;

ModelSpec Tiny() {
  ModelSpec m;
  m.name = "tiny";
  m.layers = 2;
  m.hidden = 16;
  m.heads = 4;
  m.kv_heads = 4;
  m.ffn_hidden = 64;
  m.seq_len = 8;
  m.vocab = 40;
  return m;
}

constexpr int64_t kB = 2;

std::multiset<Shape3> GemmsOf(const LayerOpList& l) {
  std::multiset<Shape3> out;
  for (const LayerOp& op : l)
    if (op.kind == LayerOpKind::kGemm) out.insert({int64_t(op.m), int64_t(op.n), int64_t(op.k)});
  return out;
}

// What the op lists say one rank runs for `layers` layers (+ embedding and output).
std::multiset<Shape3> Expected(const ModelSpec& m, int tp, bool sp, int layers, bool ends) {
  Layout l;
  l.tp = tp;
  l.micro_batch = int(kB);
  l.sequence_parallel = sp;
  l.precision = Precision::kFp32;
  const OpShape s = ShapeOf(l, 0);
  LayerOps ops;
  BuildLayerOps(m, s, &ops);
  std::multiset<Shape3> out;
  for (int i = 0; i < layers; ++i)
    for (const LayerOpList* list : {&ops.forward, &ops.backward})
      for (const Shape3& g : GemmsOf(*list)) out.insert(g);
  if (ends) {
    LayerOpList f, b;
    BuildEmbeddingOps(m, s, &f, &b);
    EXPECT_EQ(f.Gemms() + b.Gemms(), 0);  // a lookup, no GEMM
    BuildOutputOps(m, s, &f, &b);
    for (const LayerOpList* list : {&f, &b})
      for (const Shape3& g : GemmsOf(*list)) out.insert(g);
  }
  return out;
}

// Runs one micro-batch forward and backward of a chunk on each of `tp` rank threads and returns
// the GEMM shapes each rank executed.
std::vector<std::multiset<Shape3>> Executed(const ModelSpec& m, int tp, bool sp, int layers,
                                            bool ends) {
  ThreadWorld world(tp, 10.0);
  std::vector<std::multiset<Shape3>> seen(static_cast<size_t>(tp));
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r) {
    threads.emplace_back([&, r] {
      CpuBackendOptions opt;
      opt.on_matmul = [&seen, r](int64_t mm, int64_t n, int64_t k) {
        seen[size_t(r)].insert({mm, n, k});
      };
      CpuBackend be(opt);
      std::vector<int> members;
      for (int i = 0; i < tp; ++i) members.push_back(i);
      auto comm = world.Group(r, members, "TP");
      ASSERT_TRUE(comm.ok()) << comm.status().message();
      GptChunkConfig c;
      c.model = m;
      c.n_layers = layers;
      c.has_embedding = c.has_output = ends;
      c.tp = tp;
      c.tp_rank = r;
      c.sequence_parallel = sp;
      c.seed = 7;
      auto chunk = GptChunk::Create(c, be, **comm);
      ASSERT_TRUE(chunk.ok()) << chunk.status().message();
      seen[size_t(r)].clear();  // initialisation runs no GEMM, but be sure
      const int64_t s = m.seq_len, sl = sp ? s / tp : s;
      Tensor input, targets, grad;
      if (ends) {
        std::vector<int32_t> ids(size_t(kB * s));
        for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 7 + 3) % m.vocab);
        input = *be.Alloc({kB, s}, DType::kI32);
        targets = *be.Alloc({kB, s}, DType::kI32);
        ASSERT_TRUE(be.CopyFromHost(ids.data(), input).ok());
        ASSERT_TRUE(be.CopyFromHost(ids.data(), targets).ok());
      } else {
        std::vector<float> x(size_t(sl * kB * m.hidden));
        for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 13) - 6) * 0.05f;
        input = *be.Alloc({sl, kB, m.hidden}, DType::kF32);
        grad = *be.Alloc({sl, kB, m.hidden}, DType::kF32);
        ASSERT_TRUE(be.CopyFromHost(x.data(), input).ok());
        ASSERT_TRUE(be.CopyFromHost(x.data(), grad).ok());
      }
      auto out = (*chunk)->Forward(0, input, targets, 1.0f);
      ASSERT_TRUE(out.ok()) << out.status().message();
      auto back = (*chunk)->Backward(0, grad);
      ASSERT_TRUE(back.ok()) << back.status().message();
    });
  }
  for (auto& t : threads) t.join();
  return seen;
}

struct Case {
  int tp;
  bool sp;
  int layers;
  bool ends;
};

class LayerOpsRuntime : public ::testing::TestWithParam<Case> {};

TEST_P(LayerOpsRuntime, TheRuntimeRunsTheListedGemms) {
  const Case c = GetParam();
  const ModelSpec m = Tiny();
  const auto want = Expected(m, c.tp, c.sp, c.layers, c.ends);
  ASSERT_FALSE(want.empty());
  const auto got = Executed(m, c.tp, c.sp, c.layers, c.ends);
  for (size_t r = 0; r < got.size(); ++r) {
    std::vector<Shape3> missing, extra;
    std::set_difference(want.begin(), want.end(), got[r].begin(), got[r].end(),
                        std::back_inserter(missing));
    std::set_difference(got[r].begin(), got[r].end(), want.begin(), want.end(),
                        std::back_inserter(extra));
    std::string msg;
    for (const Shape3& s : missing)
      msg += " listed-not-run(" + std::to_string(s[0]) + "," + std::to_string(s[1]) + "," +
             std::to_string(s[2]) + ")";
    for (const Shape3& s : extra)
      msg += " run-not-listed(" + std::to_string(s[0]) + "," + std::to_string(s[1]) + "," +
             std::to_string(s[2]) + ")";
    EXPECT_TRUE(missing.empty() && extra.empty()) << "rank " << r << ":" << msg;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, LayerOpsRuntime,
                         ::testing::Values(Case{1, false, 1, false}, Case{1, false, 2, true},
                                           Case{2, false, 1, false}, Case{2, true, 1, false},
                                           Case{2, true, 1, true}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return "tp" + std::to_string(i.param.tp) + (i.param.sp ? "_sp" : "") +
                                  "_layers" + std::to_string(i.param.layers) +
                                  (i.param.ends ? "_ends" : "");
                         });

// A CPU backend counting the calls of a layer's forward that the op list names one by one.
class CallCounter final : public ForwardingBackend {
 public:
  CallCounter() : ForwardingBackend(std::make_unique<CpuBackend>()) {}
  std::map<std::string, int> calls;
  void MatmulBias(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& bias,
                  Tensor& c) override {
    ++calls["MatmulBias"];
    inner().MatmulBias(a, ta, b, tb, bias, c);
  }
  void MatmulBiasGelu(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& bias,
                      Tensor& pre, Tensor& act) override {
    ++calls["MatmulBiasGelu"];
    inner().MatmulBiasGelu(a, ta, b, tb, bias, pre, act);
  }
  void AddBias(Tensor& y, const Tensor& bias) override {
    ++calls["AddBias"];
    inner().AddBias(y, bias);
  }
  void AddBiasResidual(Tensor& x, const Tensor& bias, const Tensor& residual) override {
    ++calls["AddBiasResidual"];
    inner().AddBiasResidual(x, bias, residual);
  }
  void AddBiasResidualLayerNorm(Tensor& x, const Tensor& bias, const Tensor& residual,
                                const Tensor& g, const Tensor& b, float eps, Tensor& y,
                                Tensor& mean, Tensor& rstd) override {
    ++calls["AddBiasResidualLayerNorm"];
    inner().AddBiasResidualLayerNorm(x, bias, residual, g, b, eps, y, mean, rstd);
  }
  void LayerNormForward(const Tensor& x, const Tensor& g, const Tensor& b, float eps, Tensor& y,
                        Tensor& mean, Tensor& rstd) override {
    ++calls["LayerNormForward"];
    inner().LayerNormForward(x, g, b, eps, y, mean, rstd);
  }
  void GeluForward(const Tensor& x, Tensor& y) override {
    ++calls["GeluForward"];
    inner().GeluForward(x, y);
  }
  void MatmulGeluBackward(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& pre,
                          Tensor& dx) override {
    ++calls["MatmulGeluBackward"];
    inner().MatmulGeluBackward(a, ta, b, tb, pre, dx);
  }
  void GeluBackward(const Tensor& dy, const Tensor& x, Tensor& dx) override {
    ++calls["GeluBackward"];
    inner().GeluBackward(dy, x, dx);
  }
  void Add(const Tensor& a, const Tensor& b, Tensor& out) override {
    ++calls["Add"];
    inner().Add(a, b, out);
  }
};

// The calls that fuse a bias, GeLU, residual or norm into one (GEMM epilogues, the residual
// kernels) are the ones the runtime's op list prices as one: a forward of two layers with the
// embedding and the output layer calls each as often as their lists name it, and no separate
// bias or GeLU; the backward runs GeLU's gradient inside FC2's dgrad, as listed.
TEST(LayerOpsRuntimeCalls, TheFusedCallsAreTheListed) {
  const ModelSpec m = Tiny();
  constexpr int kLayers = 2;
  Layout l;
  l.micro_batch = int(kB);
  l.precision = Precision::kFp32;
  OpShape shape = ShapeOf(l, 0);
  shape.runtime = true;
  LayerOps ops;
  BuildLayerOps(m, shape, &ops);
  LayerOpList embedding, output, unused;
  BuildEmbeddingOps(m, shape, &embedding, &unused);
  BuildOutputOps(m, shape, &output, &unused);
  std::map<std::string, int> listed;
  for (const auto& [list, times] : {std::pair{&ops.forward, kLayers}, std::pair{&embedding, 1},
                                    std::pair{&output, 1}}) {
    for (const LayerOp& op : *list) {
      if (op.kind == LayerOpKind::kGemm)
        listed[op.epilogue == GemmEpilogue::kBias       ? "MatmulBias"
               : op.epilogue == GemmEpilogue::kBiasGelu ? "MatmulBiasGelu"
                                                        : "Matmul"] += times;
      if (op.kind != LayerOpKind::kMemory) continue;
      const char* call = op.kernel == MemoryKernel::kBiasAdd            ? "AddBias"
                         : op.kernel == MemoryKernel::kBiasResidual     ? "AddBiasResidual"
                         : op.kernel == MemoryKernel::kBiasResidualNorm ? "AddBiasResidualLayerNorm"
                         : op.kernel == MemoryKernel::kNorm             ? "LayerNormForward"
                         : op.kernel == MemoryKernel::kActivation       ? "GeluForward"
                         : op.kernel == MemoryKernel::kAdd              ? "Add"
                                                                        : nullptr;
      if (call) listed[call] += times;
    }
  }
  listed.erase("Matmul");  // the plain GEMMs: TheRuntimeRunsTheListedGemms

  ThreadWorld world(1, 10.0);
  auto comm = world.Group(0, {0}, "TP");
  ASSERT_TRUE(comm.ok()) << comm.status().message();
  CallCounter be;
  GptChunkConfig c;
  c.model = m;
  c.n_layers = kLayers;
  c.has_embedding = c.has_output = true;
  c.seed = 7;
  auto chunk = GptChunk::Create(c, be, **comm);
  ASSERT_TRUE(chunk.ok()) << chunk.status().message();
  std::vector<int32_t> ids(size_t(kB * m.seq_len));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 7 + 3) % m.vocab);
  Tensor input = *be.Alloc({kB, m.seq_len}, DType::kI32);
  Tensor targets = *be.Alloc({kB, m.seq_len}, DType::kI32);
  ASSERT_TRUE(be.CopyFromHost(ids.data(), input).ok());
  ASSERT_TRUE(be.CopyFromHost(ids.data(), targets).ok());
  be.calls.clear();
  auto out = (*chunk)->Forward(0, input, targets, 1.0f);
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(be.calls, listed);
  EXPECT_EQ(listed["MatmulBias"], kLayers + 1);  // QKV's, and the logits' vocabulary mask
  EXPECT_EQ(listed.count("AddBias"), 0u);
  EXPECT_EQ(listed["MatmulBiasGelu"], kLayers);
  EXPECT_EQ(listed["AddBiasResidualLayerNorm"], kLayers);
  EXPECT_EQ(listed["AddBiasResidual"], kLayers);

  // The backward: FC2's dgrad takes GeLU's gradient in its call, as the list prices it.
  int listed_dgelu = 0, listed_gelu_backward = 0;
  for (const LayerOp& op : ops.backward) {
    listed_dgelu += op.kind == LayerOpKind::kGemm && op.epilogue == GemmEpilogue::kGeluBackward;
    listed_gelu_backward +=
        op.kind == LayerOpKind::kMemory && op.kernel == MemoryKernel::kActivationBackward;
  }
  EXPECT_EQ(listed_dgelu, 1);
  EXPECT_EQ(listed_gelu_backward, 0);
  Tensor grad = *be.Alloc({kB, m.seq_len, m.hidden}, DType::kF32);
  be.calls.clear();
  auto back = (*chunk)->Backward(0, grad);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(be.calls["MatmulGeluBackward"], kLayers * listed_dgelu);
  EXPECT_EQ(be.calls.count("GeluBackward"), 0u);
}

}  // namespace
}  // namespace ptdp::rt
