// GptChunk on a tiny GPT (L 2, h 16, a 4, f 64, s 8, V 40, b 2): the loss at init against
// log(V), parameter gradients against central finite differences, TP (2, 4; SP off and on) and
// a hand-run two-stage pipeline against the single-rank chunk, element by element.
#include "runtime/gpt.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/thread_communicator.h"

namespace ptdp::rt {
namespace {

constexpr int64_t kB = 2;  // micro-batch
constexpr uint64_t kSeed = 1234;
constexpr double kTimeoutS = 10.0;
// Every backend here fills its uninitialised outputs with NaN: a read before a write shows.
CpuBackendOptions Poisoned() {
  CpuBackendOptions o;
  o.poison_uninit = true;
  return o;
}

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

// A fixed (b, s + 1) token window; inputs [:, :s], targets [:, 1:]. The 40 real rows all lie in
// TP rank 0's vocabulary shard (V_pad / t >= 64): the other ranks' shards are padding only, so
// the padding mask decides whether their logits change the loss.
std::vector<int32_t> Window() {
  std::vector<int32_t> w;
  for (int64_t i = 0; i < kB * 9; ++i) w.push_back(int32_t((i * 7 + 3) % 40));
  return w;
}

struct Batch {
  Tensor tokens, targets;  // (b, s) i32
};

Batch MakeBatch(Backend& be) {
  const std::vector<int32_t> w = Window();
  std::vector<int32_t> in, tg;
  for (int64_t bi = 0; bi < kB; ++bi)
    for (int64_t t = 0; t < 8; ++t) {
      in.push_back(w[size_t(bi * 9 + t)]);
      tg.push_back(w[size_t(bi * 9 + t + 1)]);
    }
  Batch b{*be.Alloc({kB, 8}, DType::kI32), *be.Alloc({kB, 8}, DType::kI32)};
  EXPECT_TRUE(be.CopyFromHost(in.data(), b.tokens).ok());
  EXPECT_TRUE(be.CopyFromHost(tg.data(), b.targets).ok());
  return b;
}

std::vector<float> Host(Backend& be, const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  EXPECT_TRUE(be.CopyToHost(t, v.data()).ok());
  return v;
}

std::unique_ptr<Communicator> Solo(ThreadWorld& w) { return std::move(w.Group(0, {0}, "TP")).value(); }

std::unique_ptr<GptChunk> MakeChunk(Backend& be, Communicator& comm, int first, int n, bool emb,
                                    bool out, int tp = 1, int rank = 0, bool sp = false) {
  GptChunkConfig c;
  c.model = Tiny();
  c.first_layer = first;
  c.n_layers = n;
  c.has_embedding = emb;
  c.has_output = out;
  c.tp = tp;
  c.tp_rank = rank;
  c.sequence_parallel = sp;
  c.seed = kSeed;
  auto r = GptChunk::Create(c, be, comm);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(r).value() : nullptr;
}

// Loss of one forward (slot released), as a double.
double Loss(GptChunk& c, Backend& be, const Batch& b) {
  auto loss = c.Forward(0, b.tokens, b.targets, 1.0f);
  EXPECT_TRUE(loss.ok()) << loss.status().message();
  c.Release(0);
  return double(Host(be, *loss)[0]);
}

// Forward + backward of one micro-batch; returns the loss.
double Step(GptChunk& c, Backend& be, const Batch& b) {
  auto loss = c.Forward(0, b.tokens, b.targets, 1.0f);
  EXPECT_TRUE(loss.ok()) << loss.status().message();
  auto dx = c.Backward(0, Tensor());
  EXPECT_TRUE(dx.ok()) << dx.status().message();
  EXPECT_FALSE(dx->defined());
  return double(Host(be, *loss)[0]);
}

// The single-rank chunk's loss and grads by name (global = local at t 1).
struct Reference {
  double loss = 0;
  std::map<std::string, std::vector<float>> grads;
  std::map<std::string, ParamSpec> specs;
};

const Reference& SingleRank() {
  static const Reference ref = [] {
    Reference r;
    CpuBackend be(Poisoned());
    ThreadWorld world(1, kTimeoutS);
    auto comm = Solo(world);
    auto c = MakeChunk(be, *comm, 0, 2, true, true);
    Batch b = MakeBatch(be);
    r.loss = Step(*c, be, b);
    EXPECT_TRUE(c->FinalizeTpGrads().ok());
    for (const ChunkParam& p : c->params()) {
      r.grads[p.spec.name] = Host(be, p.grad);
      r.specs[p.spec.name] = p.spec;
    }
    return r;
  }();
  return ref;
}

// Central differences on the 3 largest-|grad| elements of parameter `name` of chunk c:
// |fd - grad| <= abs_tol + rel_tol |grad|, each |grad| above min_grad (else it checks nothing).
void ExpectFiniteDifferences(GptChunk& c, Backend& be, const Batch& b, const char* name,
                             double eps, double abs_tol, double rel_tol, double min_grad) {
  ChunkParam* p = c.Find(name);
  ASSERT_NE(p, nullptr) << name;
  std::vector<float> w = Host(be, p->value), g = Host(be, p->grad);
  std::vector<size_t> idx(g.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::partial_sort(idx.begin(), idx.begin() + 3, idx.end(),
                    [&](size_t x, size_t y) { return std::fabs(g[x]) > std::fabs(g[y]); });
  for (int k = 0; k < 3; ++k) {
    const size_t i = idx[size_t(k)];
    const float keep = w[i];
    w[i] = float(keep + eps);
    ASSERT_TRUE(be.CopyFromHost(w.data(), p->value).ok());
    const double plus = Loss(c, be, b);
    w[i] = float(keep - eps);
    ASSERT_TRUE(be.CopyFromHost(w.data(), p->value).ok());
    const double minus = Loss(c, be, b);
    w[i] = keep;
    ASSERT_TRUE(be.CopyFromHost(w.data(), p->value).ok());
    const double fd = (plus - minus) / (2 * eps);
    EXPECT_NEAR(fd, g[i], abs_tol + rel_tol * std::fabs(g[i])) << name << "[" << i << "]";
    EXPECT_GT(std::fabs(g[i]), min_grad) << name << ": a vanishing gradient checks nothing";
  }
}

TEST(GptChunk, LossAtInitIsNearLogVocab) {
  // Weights ~N(0, 0.02^2) give logits of std ~0.02 * sqrt(h) ~ 0.08 over 40 real entries: the
  // softmax is nearly uniform, loss ~ log 40 = 3.689 (+ about var/2 ~ 0.003).
  const Reference& ref = SingleRank();
  EXPECT_TRUE(std::isfinite(ref.loss));
  EXPECT_NEAR(ref.loss, std::log(40.0), 0.05);
}

TEST(GptChunk, GradientsMatchFiniteDifferences) {
  // Central differences with eps = 1e-2 on the fp32 forward: fp32 rounding of a loss ~3.7 is
  // ~3e-7, / (2 eps) ~ 2e-5 (hence the absolute term). The O(eps^2) truncation dominates for
  // the embeddings: at init the residual stream is ~0.03 in size, so a 1e-2 step is far from
  // infinitesimal for LN1 (observed up to 8e-3 relative on embedding.position; 1e-3 or less
  // elsewhere). Checked on the 3 largest-|grad| elements of each kind of parameter:
  // |fd - grad| <= 5e-5 + 2e-2 |grad|; a 5% error in one grad fails it.
  CpuBackend be(Poisoned());
  ThreadWorld world(1, kTimeoutS);
  auto comm = Solo(world);
  auto c = MakeChunk(be, *comm, 0, 2, true, true);
  Batch b = MakeBatch(be);
  Step(*c, be, b);
  const char* names[] = {"embedding.word",         "embedding.position",
                         "layers.0.attn.qkv.weight", "layers.1.attn.qkv.bias",
                         "layers.0.attn.proj.weight", "layers.1.mlp.fc1.weight",
                         "layers.0.mlp.fc2.weight",  "layers.1.ln1.weight",
                         "layers.0.ln2.bias",        "final_ln.weight"};
  for (const char* name : names) ExpectFiniteDifferences(*c, be, b, name, 1e-2, 5e-5, 2e-2, 1e-4);
}

// The MoE MLP (runtime/moe.cc) on layer 1 of the tiny GPT: 4 experts of 32, top-2, a shared
// expert of 16, softmax and sigmoid routers. Without the auxiliary loss the gradients of the
// router, the experts and the shared expert against central differences (eps 3e-3: small
// enough that no token's top-2 changes, fp32 noise ~1e-4 on the difference quotient). The
// auxiliary loss adds to the router's gradient only.
ModelSpec TinyMoe(MoeRouter router, double aux) {
  ModelSpec m = Tiny();
  m.num_experts = 4;
  m.moe_topk = 2;
  m.moe_ffn_hidden = 32;
  m.moe_shared_ffn_hidden = 16;
  m.moe_dense_layers_first = 1;
  m.moe_router = router;
  m.moe_aux_loss_coeff = aux;
  return m;
}

std::unique_ptr<GptChunk> MakeMoeChunk(Backend& be, Communicator& comm, const ModelSpec& m) {
  GptChunkConfig c;
  c.model = m;
  c.first_layer = 0;
  c.n_layers = 2;
  c.has_embedding = c.has_output = true;
  c.seed = kSeed;
  auto r = GptChunk::Create(c, be, comm);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(r).value() : nullptr;
}

TEST(GptChunk, MoeGradientsMatchFiniteDifferences) {
  for (MoeRouter router : {MoeRouter::kSoftmax, MoeRouter::kSigmoid}) {
    SCOPED_TRACE(router == MoeRouter::kSoftmax ? "softmax" : "sigmoid");
    CpuBackend be(Poisoned());
    ThreadWorld world(1, kTimeoutS);
    auto comm = Solo(world);
    auto c = MakeMoeChunk(be, *comm, TinyMoe(router, 0.0));
    ASSERT_NE(c, nullptr);
    Batch b = MakeBatch(be);
    Step(*c, be, b);
    const char* names[] = {"layers.1.moe.router.weight", "layers.1.moe.experts.0.fc1.weight",
                           "layers.1.moe.experts.3.fc2.weight", "layers.1.moe.shared.fc1.weight",
                           "layers.1.moe.shared.fc2.weight", "layers.1.ln2.weight",
                           "layers.0.mlp.fc1.weight"};
    for (const char* name : names) ExpectFiniteDifferences(*c, be, b, name, 3e-3, 1e-4, 3e-2, 3e-4);
  }
}

// The values and gradients are views of one buffer each (GptChunk::value_buffer, grad_buffer)
// at the same offsets: no gap, no overlap, by BufferOrder (replicated, other dense, routed
// experts; decayed first), params() order within; ZeroGrads clears the whole grad buffer.
TEST(GptChunk, ParametersTileOneBufferInTheirOrder) {
  CpuBackend be(Poisoned());
  ThreadWorld world(1, kTimeoutS);
  auto comm = Solo(world);
  auto c = MakeMoeChunk(be, *comm, TinyMoe(MoeRouter::kSoftmax, 0.0));
  ASSERT_NE(c, nullptr);
  const Tensor& grads = c->grad_buffer();
  const Tensor& values = c->value_buffer();
  int64_t at = 0;
  std::set<int> orders;
  for (int order = 0; order < GptChunk::kBufferOrders; ++order)
    for (const ChunkParam& p : c->params()) {
      if (GptChunk::BufferOrder(p.spec) != order) continue;
      SCOPED_TRACE(p.spec.name);
      EXPECT_EQ(p.offset, at);
      EXPECT_EQ(p.grad.buffer(), grads.buffer());
      EXPECT_EQ(p.value.buffer(), values.buffer());
      EXPECT_EQ(p.grad.data_as<float>(), grads.data_as<float>() + at);
      EXPECT_EQ(p.value.data_as<float>(), values.data_as<float>() + at);  // fp32 chunk
      EXPECT_EQ(p.grad.shape(), p.value.shape());
      EXPECT_EQ(order / 2 == 2, p.spec.expert >= 0);
      EXPECT_EQ(order % 2 == 0, DecaysWeight(p.spec));
      orders.insert(order);
      at += p.grad.numel();
    }
  EXPECT_EQ(at, grads.numel());
  EXPECT_EQ(at, values.numel());
  // router (0), LNs and biases (1), weights (2), column biases (3), experts (4); no 5
  EXPECT_EQ(orders, (std::set<int>{0, 1, 2, 3, 4}));
  Step(*c, be, MakeBatch(be));
  const std::vector<float> before = Host(be, grads);
  EXPECT_GT(std::count_if(before.begin(), before.end(), [](float g) { return g != 0; }), 0);
  c->ZeroGrads();
  for (float g : Host(be, grads)) ASSERT_EQ(g, 0.0f);
}

TEST(GptChunk, MoeAuxiliaryLossMovesOnlyTheRouter) {
  std::map<std::string, std::vector<float>> grads[2];
  for (int with = 0; with < 2; ++with) {
    CpuBackend be(Poisoned());
    ThreadWorld world(1, kTimeoutS);
    auto comm = Solo(world);
    auto c = MakeMoeChunk(be, *comm, TinyMoe(MoeRouter::kSoftmax, with ? 0.1 : 0.0));
    ASSERT_NE(c, nullptr);
    Batch b = MakeBatch(be);
    Step(*c, be, b);
    for (const ChunkParam& p : c->params()) grads[with][p.spec.name] = Host(be, p.grad);
  }
  EXPECT_NE(grads[0]["layers.1.moe.router.weight"], grads[1]["layers.1.moe.router.weight"]);
  EXPECT_EQ(grads[0]["layers.1.moe.experts.2.fc1.weight"],
            grads[1]["layers.1.moe.experts.2.fc1.weight"]);
  EXPECT_EQ(grads[0]["layers.1.moe.shared.fc2.weight"], grads[1]["layers.1.moe.shared.fc2.weight"]);
}

// Expects the TP shard `local` of parameter `p` (at tp, rank) to equal the slice of the
// single-rank gradient: |a - r| <= 1e-6 + 1e-5 |r|; padded vocabulary rows must be 0.
void ExpectShard(const ParamSpec& p, int tp, int rank, const std::vector<float>& local,
                 const Reference& ref, const std::string& what) {
  const std::vector<float>& full = ref.grads.at(p.name);
  const std::vector<int64_t> ls = LocalShape(p, tp);
  const int64_t lcols = ls.size() > 1 ? ls[1] : 1, cols = p.shape.size() > 1 ? p.shape[1] : 1;
  const int64_t col0 = p.shard == ShardKind::kColumns ? rank * lcols : 0;
  int bad = 0;
  for (int64_t i = 0; i < ls[0]; ++i)
    for (int64_t j = 0; j < lcols; ++j) {
      const int64_t gi = GlobalRow(p, tp, rank, i);
      const float got = local[size_t(i * lcols + j)];
      if (p.valid_rows >= 0 && gi >= p.valid_rows) {
        if (got != 0.0f && bad++ < 3) ADD_FAILURE() << what << " padded row " << gi;
        continue;
      }
      const float want = full[size_t(gi * cols + col0 + j)];
      if (std::fabs(got - want) > 1e-6 + 1e-5 * std::fabs(want) && bad++ < 3)
        ADD_FAILURE() << what << " " << p.name << "[" << gi << ", " << col0 + j << "]: " << got
                      << " vs single-rank " << want;
    }
}

struct TpCase {
  int tp;
  bool sp;
};

class GptTp : public ::testing::TestWithParam<TpCase> {};
INSTANTIATE_TEST_SUITE_P(Gpt, GptTp,
                         ::testing::Values(TpCase{2, false}, TpCase{2, true}, TpCase{4, false},
                                           TpCase{4, true}),
                         [](const ::testing::TestParamInfo<TpCase>& i) {
                           return "tp" + std::to_string(i.param.tp) + (i.param.sp ? "_sp" : "");
                         });

TEST_P(GptTp, LossAndGradsEqualSingleRank) {
  const Reference& ref = SingleRank();
  const int tp = GetParam().tp;
  const bool sp = GetParam().sp;
  ThreadWorld world(tp, kTimeoutS);
  std::vector<double> loss(static_cast<size_t>(tp));
  std::vector<std::vector<std::pair<ParamSpec, std::vector<float>>>> grads(static_cast<size_t>(tp));
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r)
    threads.emplace_back([&, r] {
      CpuBackend be(Poisoned());
      std::vector<int> all;
      for (int q = 0; q < tp; ++q) all.push_back(q);
      auto comm = world.Group(r, all, "TP");
      ASSERT_TRUE(comm.ok()) << comm.status().message();
      auto c = MakeChunk(be, **comm, 0, 2, true, true, tp, r, sp);
      ASSERT_NE(c, nullptr);
      Batch b = MakeBatch(be);
      loss[size_t(r)] = Step(*c, be, b);
      ASSERT_TRUE(c->FinalizeTpGrads().ok());
      for (const ChunkParam& p : c->params()) grads[size_t(r)].push_back({p.spec, Host(be, p.grad)});
    });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < tp; ++r) {
    EXPECT_NEAR(loss[size_t(r)], ref.loss, 1e-5 * ref.loss) << "rank " << r;
    ASSERT_EQ(grads[size_t(r)].size(), ref.grads.size());
    for (const auto& [spec, g] : grads[size_t(r)])
      ExpectShard(spec, tp, r, g, ref, "rank " + std::to_string(r));
  }
}

TEST(GptChunk, TwoStagePipelineEqualsOneChunk) {
  // Stage A: embedding + layer 0; stage B: layer 1 + final LN + output (its own copy of the
  // tied word embedding). A's and B's word grads sum to the single chunk's.
  const Reference& ref = SingleRank();
  CpuBackend be(Poisoned());
  ThreadWorld world(1, kTimeoutS);
  auto comm = Solo(world);
  auto a = MakeChunk(be, *comm, 0, 1, true, false);
  auto bc = MakeChunk(be, *comm, 1, 1, false, true);
  Batch b = MakeBatch(be);
  auto h = a->Forward(3, b.tokens, Tensor(), 1.0f);
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(h->shape(), Shape({8, kB, 16}));
  auto loss = bc->Forward(3, *h, b.targets, 1.0f);
  ASSERT_TRUE(loss.ok()) << loss.status().message();
  EXPECT_NEAR(Host(be, *loss)[0], ref.loss, 1e-6 * ref.loss);
  auto dh = bc->Backward(3, Tensor());
  ASSERT_TRUE(dh.ok()) << dh.status().message();
  auto none = a->Backward(3, *dh);
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_FALSE(none->defined());
  EXPECT_EQ(a->in_flight() + bc->in_flight(), 0u);

  std::map<std::string, std::vector<float>> got;
  for (GptChunk* c : {a.get(), bc.get()})
    for (const ChunkParam& p : c->params()) {
      std::vector<float> g = Host(be, p.grad);
      auto [it, fresh] = got.emplace(p.spec.name, g);
      if (!fresh)
        for (size_t i = 0; i < g.size(); ++i) it->second[i] += g[i];  // the tied embedding
    }
  ASSERT_EQ(got.size(), ref.grads.size());
  for (const auto& [name, g] : got) ExpectShard(ref.specs.at(name), 1, 0, g, ref, "pipeline");
  EXPECT_EQ(a->Find("final_ln.weight"), nullptr);
  EXPECT_EQ(bc->Find("embedding.position"), nullptr);
}

TEST(GptChunk, SlotsInFlightAccumulateAndAreChecked) {
  // Two micro-batches forward, then backward in reverse order: grads are twice one step's
  // (the same batch), each loss is the reference's times its scale.
  const Reference& ref = SingleRank();
  CpuBackend be(Poisoned());
  ThreadWorld world(1, kTimeoutS);
  auto comm = Solo(world);
  auto c = MakeChunk(be, *comm, 0, 2, true, true);
  Batch b = MakeBatch(be);
  auto l0 = c->Forward(0, b.tokens, b.targets, 0.5f);
  auto l1 = c->Forward(1, b.tokens, b.targets, 0.5f);
  ASSERT_TRUE(l0.ok() && l1.ok());
  EXPECT_FALSE(c->Forward(1, b.tokens, b.targets, 0.5f).ok());  // slot 1 in flight
  EXPECT_NEAR(Host(be, *l1)[0], 0.5 * ref.loss, 1e-6);
  ASSERT_TRUE(c->Backward(1, Tensor()).ok());
  ASSERT_TRUE(c->Backward(0, Tensor()).ok());
  EXPECT_FALSE(c->Backward(0, Tensor()).ok());  // already done
  // 0.5 + 0.5 of the same gradient = the reference's.
  for (const ChunkParam& p : c->params())
    ExpectShard(p.spec, 1, 0, Host(be, p.grad), ref, "two slots");
  c->ZeroGrads();
  for (const ChunkParam& p : c->params())
    for (float v : Host(be, p.grad)) ASSERT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace ptdp::rt
