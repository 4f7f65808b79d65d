// Issue 13's laws, each on its own: GEMM tiles in waves over the SMs, host-bound lists, TP
// communication hidden by what it overlaps (not by a constant), Megatron's DP buckets, fp8
// casts, and the retired constants' message.
#include <gtest/gtest.h>

#include <cmath>

#include "cost_model/analytic.h"
#include "cost_model/hardware_table.h"
#include "tests/fakes/test_cluster.h"

namespace ptdp {
namespace {

ModelSpec Gpt(int64_t h = 4096) {
  ModelSpec m;
  m.name = "gpt";
  m.layers = 32;
  m.hidden = h;
  m.heads = 32;
  m.kv_heads = 32;
  m.ffn_hidden = 4 * h;
  m.seq_len = 2048;
  m.vocab = 50257;
  return m;
}

struct Fixture {
  explicit Fixture(int sms, CostConstants k = CostConstants{}, int nodes = 4)
      : cluster(Cluster(sms, nodes)), topo(*Topology::Build(cluster)), cost(Gpt(), topo, k) {}
  static ClusterSpec Cluster(int sms, int nodes) {
    ClusterSpec c = testing::DgxA100Like(nodes);
    c.gpu.sms = sms;
    return c;
  }
  ClusterSpec cluster;
  Topology topo;
  AnalyticModel cost;
};

TEST(KernelLaws, GemmTilesRunInWaves) {
  Fixture f(108);
  const double k = 4096;
  // 108 tiles of 128 x 128 fill one wave; one more row of tiles needs a second wave.
  const double one = f.cost.Gemm(108 * 128, 128, k, Precision::kBf16);
  const double more = f.cost.Gemm(108 * 128 + 1, 128, k, Precision::kBf16);
  EXPECT_GT(more / one, 1.3);  // ~2x the time for 0.01% more work (smaller tiles soften it)
  // Whole waves: twice the tiles, twice the time.
  EXPECT_NEAR(f.cost.Gemm(2 * 108 * 128, 128, k, Precision::kBf16) / one, 2.0, 1e-9);
  // A full wave runs at the efficiency ceiling times the k-loop's k / (k + half).
  const CostConstants& c = f.cost.constants();
  const double ideal = 2.0 * 108 * 128 * 128 * k / (312e12 * c.gemm_eff_max * k / (k + c.gemm_half_dim));
  EXPECT_NEAR(one / ideal, 1.0, 1e-9);
  // Without the SM count: no quantization, the continuous law.
  Fixture none(0);
  EXPECT_NEAR(none.cost.Gemm(108 * 128 + 1, 128, k, Precision::kBf16) /
                  none.cost.Gemm(108 * 128, 128, k, Precision::kBf16),
              1.0, 1e-3);
}

TEST(KernelLaws, SmallLayersAreHostBound) {
  CostConstants k;
  k.host_kernel_s = 1e-3;  // a very slow host
  Fixture f(108, k);
  Layout l;
  l.micro_batch = 1;
  const LayerOps ops = f.cost.Ops(l);
  const OpListTimes t = f.cost.TimeOps(l, ops.forward);
  EXPECT_GT(t.host_s, t.busy_s);
  EXPECT_DOUBLE_EQ(t.busy(), t.host_s);
  EXPECT_DOUBLE_EQ(t.host_s, t.kernels * 1e-3);
  // Twice the micro-batch: the same host time, so the same layer time.
  Layout l2 = l;
  l2.micro_batch = 2;
  EXPECT_DOUBLE_EQ(f.cost.TimeOps(l2, f.cost.Ops(l2).forward).busy(), t.busy());
}

// One overlapped collective against one GEMM.
OpListTimes Pair(const AnalyticModel& cost, const Layout& l, double gemm_n, double bytes,
                 CommOverlap overlap, int chunks) {
  LayerOpList list;
  LayerOp& g = list.Add(LayerOpKind::kGemm, "gemm");
  g.m = 8192, g.n = gemm_n, g.k = 4096;
  LayerOp& c = list.Add(LayerOpKind::kComm, "comm");
  c.comm = CommKind::kAllGather;
  c.bytes = bytes;
  c.overlap = overlap;
  c.with = 0;
  c.chunks = chunks;
  return cost.TimeOps(l, list);
}

TEST(KernelLaws, TpOverlapHidesWhatTheGemmCovers) {
  CostConstants k;
  k.overlap_interference = 0.1;
  Fixture f(108, k);
  Layout l;
  l.tp = 8;
  l.sequence_parallel = true;
  // The GEMM op as TimeOps times it: its law plus the per-kernel overhead.
  const double gemm = f.cost.Gemm(8192, 4096, 4096, Precision::kBf16) + f.cost.constants().kernel_overhead_s;
  for (double bytes : {1e6, 1e8, 1e9}) {
    Layout blocking = l;
    const OpListTimes b = Pair(f.cost, blocking, 4096, bytes, CommOverlap::kTpOverlap, 8);
    const double c = b.exposed_s;  // without --tp-comm-overlap all of it is exposed
    EXPECT_DOUBLE_EQ(b.hidden_s, 0);
    Layout over = l;
    over.tp_comm_overlap = true;
    const OpListTimes o = Pair(f.cost, over, 4096, bytes, CommOverlap::kTpOverlap, 8);
    const double expect = std::max(0.0, c - gemm) + std::min(c, gemm) / 8 + 0.1 * std::min(c, gemm);
    EXPECT_NEAR(o.exposed_s, expect, 1e-12 + 1e-9 * expect) << bytes;
    EXPECT_LT(o.exposed_s, c);
    // The async rule (Megatron's dgrad all-reduce under wgrad) hides the same whatever the flag.
    const OpListTimes a = Pair(f.cost, l, 4096, bytes, CommOverlap::kAsync, 1);
    EXPECT_NEAR(a.exposed_s, std::max(0.0, c - gemm) + 0.1 * std::min(c, gemm), 1e-12);
  }
  // A longer GEMM hides more of the same collective.
  Layout over = l;
  over.tp_comm_overlap = true;
  EXPECT_LT(Pair(f.cost, over, 16384, 1e8, CommOverlap::kTpOverlap, 8).exposed_s,
            Pair(f.cost, over, 1024, 1e8, CommOverlap::kTpOverlap, 8).exposed_s);
}

TEST(KernelLaws, DpBucketsStartDuringTheLastBackward) {
  CostConstants k;
  k.overlap_interference = 0;
  Fixture f(108, k, 16);
  Layout l;
  l.tp = 8;
  l.dp = 16;
  l.global_batch = 256;
  l.distributed_optimizer = false;
  l.overlap_grad_reduce = true;
  const double bucket = f.cost.BucketParams(l);
  EXPECT_DOUBLE_EQ(bucket, 40e6);                      // max(40M, 1M x 16)
  l.dp = 64;
  EXPECT_DOUBLE_EQ(f.cost.BucketParams(l), 64e6);     // 1M x dp beyond 40 ranks
  l.dp = 16;
  // One bucket: it can start only when the backward is over; nothing hidden.
  const double one = f.cost.DpTime(l, 30e6);
  EXPECT_NEAR(f.cost.DpExposed(l, 30e6, 1.0, 1.0), one, 1e-12);
  // Ten buckets and a long backward: only the last bucket is exposed.
  const double tau = f.cost.DpTime(l, 40e6);
  EXPECT_NEAR(f.cost.DpExposed(l, 400e6, 100.0, 0), tau, 1e-12);
  // A short backward: all but (W - W/nb) of the total is exposed.
  const double W = 2 * tau;
  EXPECT_NEAR(f.cost.DpExposed(l, 400e6, W, 0), 10 * tau - W + W / 10, 1e-12);
  // Without --overlap-grad-reduce the whole reduction is exposed.
  l.overlap_grad_reduce = false;
  EXPECT_NEAR(f.cost.DpExposed(l, 400e6, 100.0, 0), f.cost.DpTime(l, 400e6), 1e-12);
}

TEST(KernelLaws, Fp8LayersPayForTheirCasts) {
  ClusterSpec c = Fixture::Cluster(132, 4);
  c.gpu.peak_fp8 = 2 * c.gpu.peak_bf16;
  Topology topo = *Topology::Build(c);
  AnalyticModel cost(Gpt(), topo, CostConstants{});
  Layout l;
  l.precision = Precision::kFp8;
  l.micro_batch = 2;
  const LayerOps ops = cost.Ops(l);
  double casts = 0, gemm = 0;
  for (const LayerOp& op : ops.forward) {
    if (op.kernel == MemoryKernel::kFp8Cast) casts += op.bytes;
    if (op.kind == LayerOpKind::kGemm) gemm += op.flops;
  }
  EXPECT_GT(casts, 0);
  // fp8 halves the GEMM time, not the layer's: casts and bf16 attention stay.
  Layout bf = l;
  bf.precision = Precision::kBf16;
  const double t8 = cost.TimeOps(l, ops.forward).busy(), t16 = cost.TimeOps(bf, cost.Ops(bf).forward).busy();
  EXPECT_LT(t8, t16);
  EXPECT_GT(t8, 0.5 * t16);
}

// fp4 (NVFP4, Blackwell): GEMMs at the fp4 peak with fp8's efficiency constant, the same operand
// casts as fp8, and MFU against the 16-bit peak. With the fp4 peak twice the fp8 one, a full
// wave of 132 tiles takes half the fp8 time.
TEST(KernelLaws, Fp4GemmsRunAtTheFp4PeakWithTheFp8Efficiency) {
  ClusterSpec c = Fixture::Cluster(132, 4);
  c.gpu.peak_fp8 = 2 * c.gpu.peak_bf16;
  c.gpu.peak_fp4 = 4 * c.gpu.peak_bf16;
  Topology topo = *Topology::Build(c);
  AnalyticModel cost(Gpt(), topo, CostConstants{});
  const double k = 8192;
  const double t8 = cost.Gemm(132 * 128, 128, k, Precision::kFp8);
  const double t4 = cost.Gemm(132 * 128, 128, k, Precision::kFp4);
  EXPECT_NEAR(t4 / t8, 0.5, 1e-12);
  const CostConstants& kc = cost.constants();
  const double ideal = 2.0 * 132 * 128 * 128 * k /
                       (c.gpu.peak_fp4 * kc.gemm_eff_max_fp8 * k / (k + kc.gemm_half_dim));
  EXPECT_NEAR(t4 / ideal, 1.0, 1e-9);
  EXPECT_EQ(cost.MfuPeak(Precision::kFp4), c.gpu.peak_bf16);
  EXPECT_EQ(cost.PeakFlops(Precision::kFp4), c.gpu.peak_fp4);
  Layout l;
  l.precision = Precision::kFp4;
  l.micro_batch = 2;
  double casts = 0;
  for (const LayerOp& op : cost.Ops(l).forward)
    if (op.kernel == MemoryKernel::kFp8Cast) casts += op.bytes;
  Layout l8 = l;
  l8.precision = Precision::kFp8;
  double casts8 = 0;
  for (const LayerOp& op : cost.Ops(l8).forward)
    if (op.kernel == MemoryKernel::kFp8Cast) casts8 += op.bytes;
  EXPECT_GT(casts, 0);
  EXPECT_EQ(casts, casts8);
  // Activations and weights stay 16-bit: the same memory as bf16.
  Layout bf = l;
  bf.precision = Precision::kBf16;
  EXPECT_EQ(cost.StageMemory(l, 0).total, cost.StageMemory(bf, 0).total);
}

TEST(KernelLaws, RetiredConstantsSayWhatReplacedThem) {
  ClusterSpec c = testing::DgxA100Like(1);
  for (const char* name : {"tp_overlap_exposed", "tp_exposed", "layer_overhead_s", "dp_overlap_window"}) {
    c.calibration.clear();
    c.calibration[name] = 0.5;
    const Result<CostConstants> k = ConstantsFor(c);
    ASSERT_FALSE(k.ok()) << name;
    EXPECT_NE(k.status().message().find(std::string("calibration.") + name + ": retired"), std::string::npos)
        << k.status().message();
    EXPECT_NE(k.status().message().find("replaced by"), std::string::npos);
    EXPECT_EQ(k.status().message().find('\n'), std::string::npos);
  }
}

}  // namespace
}  // namespace ptdp
