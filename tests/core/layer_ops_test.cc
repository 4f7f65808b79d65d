// core/layer_ops.h: the layer as Megatron-Core's kernels, checked against the closed forms
// (Korthikanti 2022's FLOP counts, megatron-reference.md section 4's TP communication) and
// against Megatron's overlap structure. tests/runtime/layer_ops_runtime_test.cc checks the same
// lists against the GEMMs ptdp's runtime executes.
#include "core/layer_ops.h"

#include <gtest/gtest.h>

#include <array>
#include <map>
#include <set>
#include <string>
#include <utility>

namespace ptdp {
namespace {

ModelSpec Gpt(int64_t h = 1024, int64_t a = 16) {
  ModelSpec m;
  m.layers = 24;
  m.hidden = h;
  m.heads = a;
  m.kv_heads = a;
  m.ffn_hidden = 4 * h;
  m.seq_len = 2048;
  m.vocab = 50257;
  return m;
}

ModelSpec Llama() {
  ModelSpec m = Gpt(4096, 32);
  m.kv_heads = 8;
  m.ffn_hidden = 14336;
  m.activation = Activation::kSwiglu;
  m.norm = Norm::kRmsNorm;
  m.position = PositionEmbedding::kRope;
  m.bias = false;
  m.tied_embeddings = false;
  return m;
}

Layout L(int tp, bool sp, int mb = 2) {
  Layout l;
  l.tp = tp;
  l.sequence_parallel = sp;
  l.micro_batch = mb;
  return l;
}

int Count(const LayerOpList& l, LayerOpKind kind) {
  int n = 0;
  for (const LayerOp& op : l) n += op.kind == kind;
  return n;
}

double AttentionFlops(const LayerOpList& l) {
  double f = 0;
  for (const LayerOp& op : l)
    if (op.kind == LayerOpKind::kAttention) f += op.flops;
  return f;
}

TEST(LayerOps, GemmFlopsAreTheLinearWeightsTwicePerToken) {
  for (const ModelSpec& m : {Gpt(), Llama()})
    for (int tp : {1, 2, 8}) {
      LayerOps ops;
      BuildLayerOps(m, ShapeOf(L(tp, tp > 1), 0), &ops);
      const double T = 2.0 * m.seq_len;
      // Forward: 2 T W_lin / t (GQA's replicated K/V heads only once t > kv heads).
      EXPECT_NEAR(ops.forward.GemmFlops(), 2 * T * m.linear_params_per_layer() / tp,
                  1e-9 * ops.forward.GemmFlops())
          << m.name << " tp " << tp;
      // Backward: dgrad and wgrad, each the forward's FLOPs.
      EXPECT_NEAR(ops.backward.GemmFlops(), 2 * ops.forward.GemmFlops(),
                  1e-9 * ops.backward.GemmFlops());
      EXPECT_EQ(ops.forward.Gemms(), 4);
      EXPECT_EQ(ops.backward.Gemms(), 8);
      EXPECT_EQ(ops.recompute.size, 0);
    }
}

TEST(LayerOps, AttentionFlopsFlashCausalUnfusedFull) {
  const ModelSpec m = Gpt();
  const double b = 2, s = m.seq_len, h = m.hidden;
  LayerOps flash, unfused;
  BuildLayerOps(m, ShapeOf(L(2, true), 0), &flash);
  BuildLayerOps(m, ShapeOf(L(2, true), 6.0), &unfused);
  // Narayanan's 4 b s^2 h per layer forward, over t.
  EXPECT_DOUBLE_EQ(AttentionFlops(unfused.forward), 4 * b * s * s * h / 2);
  EXPECT_DOUBLE_EQ(AttentionFlops(flash.forward), 4 * b * s * s * h / 2 * CausalShare(s));
  EXPECT_NEAR(CausalShare(2048), 0.5 * (1 + 128.0 / 2048), 1e-15);
  EXPECT_DOUBLE_EQ(AttentionFlops(flash.backward), 2.5 * AttentionFlops(flash.forward));
  EXPECT_DOUBLE_EQ(AttentionFlops(unfused.backward), 2 * AttentionFlops(unfused.forward));
  // Unfused attention moves its scores through HBM; flash never writes them.
  int softmax = 0;
  for (const LayerOp& op : unfused.forward) softmax += op.kernel == MemoryKernel::kSoftmax;
  EXPECT_EQ(softmax, 1);
  for (const LayerOp& op : flash.forward) EXPECT_NE(op.kernel, MemoryKernel::kSoftmax);
}

// megatron-reference.md section 4: without SP 2 all-reduces of T h forward (after the row-
// parallel proj and FC2, blocking unless --tp-comm-overlap) and 2 backward (of the column-
// parallel QKV and FC1 input gradients, async under their wgrad). With SP all-gathers before
// the column-parallel GEMMs and reduce-scatters after the row-parallel ones; backward
// all-gathers the row-parallel output gradients, re-gathers the column-parallel inputs for
// wgrad (async under dgrad) and reduce-scatters their input gradients (async under wgrad).
TEST(LayerOps, TpCommunicationAsMegatronSchedulesIt) {
  const ModelSpec m = Gpt();
  const double bytes = 2.0 * m.seq_len * m.hidden * 2;  // T h e, b = 2, bf16
  auto check = [&](bool sp, const LayerOpList& list, int ar, int ag, int rs, int async) {
    int n_ar = 0, n_ag = 0, n_rs = 0, n_async = 0;
    for (const LayerOp& op : list) {
      if (op.kind != LayerOpKind::kComm) continue;
      EXPECT_DOUBLE_EQ(op.bytes, bytes) << op.name;
      ASSERT_GE(op.with, 0) << op.name;
      ASSERT_LT(op.with, list.size);
      EXPECT_EQ(list[op.with].kind, LayerOpKind::kGemm) << op.name << " overlaps " << list[op.with].name;
      n_ar += op.comm == CommKind::kAllReduce;
      n_ag += op.comm == CommKind::kAllGather;
      n_rs += op.comm == CommKind::kReduceScatter;
      n_async += op.overlap == CommOverlap::kAsync;
      if (op.overlap == CommOverlap::kAsync) {
        EXPECT_NE(list[op.with].pass, GemmPass::kFprop) << op.name;
      }
    }
    EXPECT_EQ(n_ar, ar) << "sp " << sp;
    EXPECT_EQ(n_ag, ag) << "sp " << sp;
    EXPECT_EQ(n_rs, rs) << "sp " << sp;
    EXPECT_EQ(n_async, async) << "sp " << sp;
  };
  LayerOps tp, sp;
  BuildLayerOps(m, ShapeOf(L(4, false), 0), &tp);
  BuildLayerOps(m, ShapeOf(L(4, true), 0), &sp);
  check(false, tp.forward, 2, 0, 0, 0);
  check(false, tp.backward, 2, 0, 0, 2);
  check(true, sp.forward, 0, 2, 2, 0);
  check(true, sp.backward, 0, 4, 2, 4);
  // tp 1: no communication at all.
  LayerOps one;
  BuildLayerOps(m, ShapeOf(L(1, false), 0), &one);
  EXPECT_EQ(Count(one.forward, LayerOpKind::kComm) + Count(one.backward, LayerOpKind::kComm), 0);
}

TEST(LayerOps, RecomputeRerunsTheForwardOrTheAttentionCore) {
  const ModelSpec m = Gpt();
  Layout l = L(2, true);
  l.recompute = Recompute::kFull;
  LayerOps full;
  BuildLayerOps(m, ShapeOf(l, 6.0), &full);
  ASSERT_EQ(full.recompute.size, full.forward.size);
  for (int i = 0; i < full.forward.size; ++i) {
    EXPECT_EQ(full.recompute[i].kind, full.forward[i].kind);
    EXPECT_DOUBLE_EQ(full.recompute[i].flops, full.forward[i].flops);
  }
  l.recompute = Recompute::kSelective;
  LayerOps sel;
  BuildLayerOps(m, ShapeOf(l, 6.0), &sel);
  ASSERT_EQ(sel.recompute.size, 2);  // the attention core and its unfused softmax
  EXPECT_EQ(sel.recompute[0].kind, LayerOpKind::kAttention);
  EXPECT_DOUBLE_EQ(sel.recompute[0].flops, AttentionFlops(sel.forward));
  EXPECT_EQ(sel.recompute[1].kernel, MemoryKernel::kSoftmax);
}

TEST(LayerOps, Fp8CastsTheFpropAndDgradOperandsOnly) {
  const ModelSpec m = Llama();
  Layout l = L(2, true, 1);
  l.precision = Precision::kFp8;
  LayerOps ops;
  BuildLayerOps(m, ShapeOf(l, 0), &ops);
  auto casts = [](const LayerOpList& list) {
    int n = 0;
    for (int i = 0; i < list.size; ++i) {
      if (list[i].kernel != MemoryKernel::kFp8Cast) continue;
      ++n;
      // The cast is of the next GEMM's (m x k) operand.
      int g = i + 1;
      while (g < list.size && list[g].kind != LayerOpKind::kGemm) ++g;
      EXPECT_LT(g, list.size);
      if (g < list.size) {
        EXPECT_NE(list[g].pass, GemmPass::kWgrad);
        const double el = list[g].m * list[g].k;
        EXPECT_TRUE(list[i].bytes == 2 * el || list[i].bytes == 4 * el) << list[g].name;
      }
    }
    return n;
  };
  EXPECT_EQ(casts(ops.forward), 4);
  EXPECT_EQ(casts(ops.backward), 4);
  LayerOps bf16;
  BuildLayerOps(m, ShapeOf(L(2, true, 1), 0), &bf16);
  EXPECT_EQ(casts(bf16.forward) + casts(bf16.backward), 0);
  // The layer's GEMMs are quantized; the output layer's are not (Megatron-Core's output layer
  // is outside Transformer Engine's fp8 autocast): no casts, 16-bit GEMMs.
  for (const LayerOpList* list : {&ops.forward, &ops.backward})
    for (const LayerOp& op : *list)
      if (op.kind == LayerOpKind::kGemm) {
        EXPECT_TRUE(op.quantized) << op.name;
      }
  LayerOpList f, b;
  BuildOutputOps(m, ShapeOf(l, 0), &f, &b);
  EXPECT_EQ(casts(f) + casts(b), 0);
  EXPECT_EQ(f.Gemms() + b.Gemms(), 3);
  for (const LayerOpList* list : {&f, &b})
    for (const LayerOp& op : *list)
      if (op.kind == LayerOpKind::kGemm) {
        EXPECT_FALSE(op.quantized) << op.name;
      }
}

TEST(LayerOps, TheLongestListsFit) {
  // Everything on: CP, SP, rotary, unfused attention, fp8, full recompute.
  ModelSpec m = Llama();
  Layout l = L(8, true, 4);
  l.cp = 4;
  l.precision = Precision::kFp8;
  l.recompute = Recompute::kFull;
  LayerOps ops;
  BuildLayerOps(m, ShapeOf(l, 6.0), &ops);
  for (const LayerOpList* list : {&ops.forward, &ops.backward, &ops.recompute}) {
    EXPECT_LT(list->size, LayerOpList::kMax);
    for (const LayerOp& op : *list) EXPECT_FALSE(std::string(op.name).empty());
  }
  // The CP ring is overlapped with the attention it feeds.
  int rings = 0;
  for (const LayerOp& op : ops.forward)
    if (op.overlap == CommOverlap::kRing) {
      ++rings;
      EXPECT_EQ(ops.forward[op.with].kind, LayerOpKind::kAttention);
      EXPECT_EQ(op.group, CommGroup::kCp);
    }
  EXPECT_EQ(rings, 1);
}

TEST(LayerOps, OutputLayerIsTheLogitsGemmAndCrossEntropy) {
  const ModelSpec m = Gpt();
  LayerOpList f, b;
  BuildOutputOps(m, ShapeOf(L(4, false), 0), &f, &b);
  const double T = 2.0 * m.seq_len, Vl = double(m.padded_vocab(4)) / 4;
  EXPECT_DOUBLE_EQ(f.GemmFlops(), 2 * T * Vl * m.hidden);
  EXPECT_DOUBLE_EQ(b.GemmFlops(), 2 * f.GemmFlops());
  EXPECT_EQ(Count(f, LayerOpKind::kComm), 3);  // max, sum, target logit over TP
  LayerOpList ef, eb;
  BuildEmbeddingOps(m, ShapeOf(L(4, false), 0), &ef, &eb);
  EXPECT_EQ(ef.Gemms() + eb.Gemms(), 0);
  EXPECT_EQ(Count(ef, LayerOpKind::kComm), 1);  // the vocab-parallel all-reduce
}

// The runtime's flavour (OpShape::runtime): the same GEMMs and TP collectives as Megatron's
// list, every collective blocking, no re-gather of the SP input for wgrad, no Megatron-only
// fused kernel, and what the runtime adds: its biases and residual adds as its backend's calls,
// allocations.
TEST(LayerOps, TheRuntimeFlavourRunsTheSameGemmsAsItsOwnKernels) {
  const ModelSpec m = Gpt(256, 4);
  for (const bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "sp" : "no sp");
    Layout l = L(4, sp, 2);
    l.precision = Precision::kFp32;
    OpShape meg = ShapeOf(l, 0), rt = meg;
    rt.runtime = true;
    rt.saved_per_score = 1;
    LayerOps a, b;
    BuildLayerOps(m, meg, &a);
    BuildLayerOps(m, rt, &b);
    for (const auto& [x, y] : {std::pair{&a.forward, &b.forward}, std::pair{&a.backward, &b.backward}}) {
      std::multiset<std::array<double, 4>> gx, gy;
      for (const LayerOp& op : *x)
        if (op.kind == LayerOpKind::kGemm) gx.insert({op.m, op.n, op.k, double(op.pass)});
      for (const LayerOp& op : *y)
        if (op.kind == LayerOpKind::kGemm) gy.insert({op.m, op.n, op.k, double(op.pass)});
      EXPECT_EQ(gx, gy);
      EXPECT_LT(y->size, LayerOpList::kMax);
      int allocs = 0;
      for (const LayerOp& op : *y) {
        if (op.kind == LayerOpKind::kComm) {
          EXPECT_EQ(op.overlap, CommOverlap::kBlocking) << op.name;
        }
        if (op.kind != LayerOpKind::kMemory) continue;
        allocs += op.kernel == MemoryKernel::kAlloc;
        for (MemoryKernel k : {MemoryKernel::kBiasDropoutAdd, MemoryKernel::kBiasDropoutAddBackward,
                               MemoryKernel::kRotary, MemoryKernel::kSoftmax, MemoryKernel::kFp8Cast})
          EXPECT_NE(op.kernel, k) << op.name;
      }
      EXPECT_GT(allocs, 0);
    }
    // Megatron re-gathers the SP input of QKV and FC1 for their wgrad; the runtime kept it.
    EXPECT_EQ(Count(a.backward, LayerOpKind::kComm) - Count(b.backward, LayerOpKind::kComm),
              sp ? 2 : 0);
    // Forward, as runtime/gpt.cc calls its backend: QKV with its bias in the GEMM's epilogue
    // (MatmulBias), FC1 with its bias and GeLU (MatmulBiasGelu), the projection's bias and
    // residual in norm2's kernel (AddBiasResidualLayerNorm, in place of the plain norm), FC2's in
    // one (AddBiasResidual); no bias, add or GeLU kernel of its own.
    std::map<std::string, GemmEpilogue> epilogues;
    std::multiset<MemoryKernel> kernels;
    for (const LayerOp& op : b.forward) {
      if (op.kind == LayerOpKind::kGemm) epilogues[op.name] = op.epilogue;
      if (op.kind == LayerOpKind::kMemory && op.kernel != MemoryKernel::kAlloc)
        kernels.insert(op.kernel);
    }
    EXPECT_EQ(epilogues, (std::map<std::string, GemmEpilogue>{
                             {"qkv", GemmEpilogue::kBias},
                             {"proj", GemmEpilogue::kNone},
                             {"fc1", GemmEpilogue::kBiasGelu},
                             {"fc2", GemmEpilogue::kNone}}));
    EXPECT_EQ(kernels, (std::multiset<MemoryKernel>{
                           MemoryKernel::kNorm, MemoryKernel::kBiasResidualNorm,
                           MemoryKernel::kBiasResidual}));
    // Megatron's list: no epilogue marked (its bias-GeLU is a kernel of the list).
    for (const LayerOp& op : a.forward) EXPECT_EQ(op.epilogue, GemmEpilogue::kNone) << op.name;
    // The dense layer's new tensors are all overwritten: none is zeroed.
    for (const LayerOpList* list : {&b.forward, &b.backward})
      for (const LayerOp& op : *list) EXPECT_NE(op.kernel, MemoryKernel::kFill) << op.name;
  }
  // With CP the runtime's attention backward adds each block's gradients into dQKV and the
  // travelling dK/dV accumulator: both zeroed when allocated (the fill of their bytes).
  {
    Layout l = L(1, false);
    l.cp = 2;
    l.precision = Precision::kFp32;
    OpShape rt = ShapeOf(l, 0);
    rt.runtime = true;
    LayerOps ops;
    BuildLayerOps(m, rt, &ops);
    std::vector<double> zeroed;
    for (int i = 0; i < ops.backward.size; ++i) {
      const LayerOp& op = ops.backward.ops[i];
      if (op.kind != LayerOpKind::kMemory || op.kernel != MemoryKernel::kFill) continue;
      ASSERT_GT(i, 0);
      EXPECT_EQ(ops.backward.ops[i - 1].kernel, MemoryKernel::kAlloc);  // right after its alloc
      EXPECT_EQ(ops.backward.ops[i - 1].bytes, op.bytes);
      zeroed.push_back(op.bytes);
    }
    const double T = double(l.micro_batch) * m.seq_len / 2, h = m.hidden;  // this rank's tokens
    EXPECT_EQ(zeroed, (std::vector<double>{T * 3 * h * 4, T * 2 * h * 4}));  // dQKV, dK/dV
    for (const LayerOp& op : ops.forward) EXPECT_NE(op.kernel, MemoryKernel::kFill) << op.name;
  }
  // The stage input: Megatron computes on the received buffer, the runtime copies it.
  LayerOpList f, b;
  OpShape s = ShapeOf(L(1, false), 0);
  BuildStageInputOps(m, s, &f, &b);
  EXPECT_EQ(f.size + b.size, 0);
  s.runtime = true;
  BuildStageInputOps(m, s, &f, &b);
  EXPECT_EQ(f.size, 2);
}

}  // namespace
}  // namespace ptdp
