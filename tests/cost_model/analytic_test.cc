// Cost-model formulas against hand-derived values (Narayanan 2021 eq. 2-3, Korthikanti 2022
// table 2, megatron-reference.md sections 5-7).
#include "cost_model/analytic.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/fakes/test_cluster.h"

namespace ptdp {
namespace {

ModelSpec Gpt3_175b() {
  ModelSpec m;
  m.name = "gpt3-175b";
  m.layers = 96; m.hidden = 12288; m.heads = 96; m.kv_heads = 96; m.ffn_hidden = 4 * 12288;
  m.seq_len = 2048; m.vocab = 51200;
  return m;
}

Layout MakeLayout(int tp, int pp, int dp, int vp, int mb, int64_t gb) {
  Layout l;
  l.tp = tp; l.pp = pp; l.dp = dp; l.vp = vp; l.micro_batch = mb; l.global_batch = gb;
  l.schedule = vp > 1 ? ScheduleKind::kInterleaved : ScheduleKind::kOneFOneB;
  return l;
}

class AnalyticTest : public ::testing::Test {
 protected:
  AnalyticTest()
      : topo_(*Topology::Build(testing::DgxA100Like(128))),
        model_(Gpt3_175b()),
        cost_(model_, topo_, CostConstants{}) {}
  Topology topo_;
  ModelSpec model_;
  AnalyticModel cost_;
};

TEST_F(AnalyticTest, ModelFlopsMatchKorthikanti) {
  // 72 B L s h^2 (1 + s/(6h) + V/(12 h L)), B = 1536.
  const double B = 1536, L = 96, s = 2048, h = 12288, V = 51200;
  const double expected = 72 * B * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L));
  const Layout l = MakeLayout(8, 16, 8, 1, 1, 1536);
  EXPECT_NEAR(cost_.ModelFlops(l) / expected, 1.0, 1e-12);
}

TEST_F(AnalyticTest, FullRecomputeHardwareFlopsMatchNarayananEq3) {
  // F = 96 B s L h^2 (1 + s/(6h) + V/(16 L h)).
  const double B = 1536, L = 96, s = 2048, h = 12288, V = 51200;
  const double expected = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h));
  Layout l = MakeLayout(8, 16, 8, 1, 1, 1536);
  l.recompute = Recompute::kFull;
  EXPECT_NEAR(cost_.HardwareFlops(l) / expected, 1.0, 1e-12);
  l.recompute = Recompute::kNone;
  EXPECT_DOUBLE_EQ(cost_.HardwareFlops(l), cost_.ModelFlops(l));
}

TEST_F(AnalyticTest, SelectiveRecomputeHardwareFlopsUseSOver3h) {
  // Korthikanti: 72 B L s h^2 (1 + s/(3h) + V/(12 h L)).
  const double B = 64, L = 96, s = 2048, h = 12288, V = 51200;
  Layout l = MakeLayout(8, 8, 1, 1, 1, 64);
  l.recompute = Recompute::kSelective;
  const double expected = 72 * B * L * s * h * h * (1 + s / (3 * h) + V / (12 * h * L));
  EXPECT_NEAR(cost_.HardwareFlops(l) / expected, 1.0, 1e-12);
}

TEST_F(AnalyticTest, ActivationsFollowKorthikantiTable2) {
  // Unfused attention keeps the 5as/h score term. s=2048, b=1, h=12288, a=96, t=8.
  CostConstants k;
  k.softmax_bytes_per_score = 5;
  AnalyticModel cost(model_, topo_, k);
  const double s = 2048, b = 1, h = 12288, a = 96, t = 8, sbh = s * b * h;
  Layout l = MakeLayout(8, 16, 8, 1, 1, 1536);
  EXPECT_NEAR(cost.LayerActivationBytes(l), sbh * (10 + 24 / t + 5 * a * s / (h * t)), 1);
  l.sequence_parallel = true;
  EXPECT_NEAR(cost.LayerActivationBytes(l), sbh / t * (34 + 5 * a * s / h), 1);
  l.recompute = Recompute::kSelective;
  EXPECT_NEAR(cost.LayerActivationBytes(l), 34 * sbh / t, 1);
  l.sequence_parallel = false;
  EXPECT_NEAR(cost.LayerActivationBytes(l), sbh * (10 + 24 / t), 1);
  l.recompute = Recompute::kFull;
  EXPECT_NEAR(cost.LayerActivationBytes(l), 2 * sbh, 1);
  // No parallelism: sbh (34 + 5as/h).
  Layout one = MakeLayout(1, 1, 1024, 1, 1, 1024);
  EXPECT_NEAR(cost.LayerActivationBytes(one), sbh * (34 + 5 * a * s / h), 1);
}

// Under fp8 Transformer Engine keeps the GEMM inputs it quantized for the weight gradient at
// 1 byte: GPT-3's 34 s b h become 29 (the two norm outputs and FC2's input, -1, -1, -4; the
// projection's quantized copy of the attention output, +1); NVFP4's 4 bits and scales less.
// --cpu-offloading-num-layers N (pp 1): N of the L layers' activations wait in host memory
// (Transformer Engine's schedule keeps L - N on the GPU at the forward's end); their bytes cross the host link beside the compute, and what the
// compute cannot cover adds to the step. A cluster without a host link offloads nothing.
TEST(AnalyticOffload, ActivationsLeaveTheGpuAndTheLinkCanBeTheBottleneck) {
  ClusterSpec c = testing::DgxA100Like(16);
  c.gpu.host_bw_bytes_per_s = 32e9;
  const Topology topo = *Topology::Build(c);
  const ModelSpec m = Gpt3_175b();
  const AnalyticModel cost(m, topo, CostConstants{});
  Layout l = MakeLayout(8, 1, 16, 1, 1, 64);
  l.sequence_parallel = true;
  const Estimate none = cost.Evaluate(l);
  l.cpu_offload_layers = 48;
  ASSERT_EQ(CheckLayout(m, l), Rejection::kOk);
  const Estimate half = cost.Evaluate(l);
  EXPECT_NEAR(half.memory.activations, none.memory.activations * (96 - 48) / 96,
              0.05 * none.memory.activations);
  EXPECT_NEAR(half.memory.host, none.memory.activations * 48 / 96, 0.05 * none.memory.activations);
  EXPECT_EQ(none.memory.host, 0);
  EXPECT_GE(half.step_time_s, none.step_time_s);
  // The offloaded bytes must fit the host memory a GPU has (gpu.host_memory; unstated, not
  // checked).
  EXPECT_EQ(half.memory.host_usable, 0);
  ClusterSpec tight = c;
  tight.gpu.host_memory_bytes = 0.5 * half.memory.host;
  const Topology tt = *Topology::Build(tight);
  const Estimate over = AnalyticModel(m, tt, CostConstants{}).Evaluate(l);
  EXPECT_FALSE(over.memory.host_fits());
  EXPECT_FALSE(over.fits);
  // A slow link cannot hide the copies.
  ClusterSpec slow = c;
  slow.gpu.host_bw_bytes_per_s = 1e9;
  const Topology st = *Topology::Build(slow);
  EXPECT_GT(AnalyticModel(m, st, CostConstants{}).Evaluate(l).step_time_s,
            1.2 * none.step_time_s);
  ClusterSpec nolink = c;
  nolink.gpu.host_bw_bytes_per_s = 0;
  const Topology nt = *Topology::Build(nolink);
  const AnalyticModel nc(m, nt, CostConstants{});
  Layout plain = l;
  plain.cpu_offload_layers = 0;
  EXPECT_DOUBLE_EQ(nc.Evaluate(l).memory.activations, nc.Evaluate(plain).memory.activations);
  // Megatron's rules: no pipeline parallelism, no recompute, N < layers.
  l.recompute = Recompute::kSelective;
  EXPECT_EQ(CheckLayout(m, l), Rejection::kCpuOffloading);
  l.recompute = Recompute::kNone;
  l.cpu_offload_layers = 96;
  EXPECT_EQ(CheckLayout(m, l), Rejection::kCpuOffloading);
  EXPECT_EQ(RejectionKey(Rejection::kCpuOffloading), std::string("cpu_offloading_illegal"));
}

// fp8 speeds up the transformer layers' GEMMs, not the output layer's: Megatron-Core keeps it
// out of Transformer Engine's fp8 autocast, so its logits GEMMs take the same time either way.
TEST(AnalyticFp8, TheOutputLayerStaysSixteenBit) {
  const ClusterSpec c = testing::DgxB200Like(1);
  ASSERT_GT(c.gpu.peak_fp8, c.gpu.peak_bf16);
  const Topology topo = *Topology::Build(c);
  const AnalyticModel cost(Gpt3_175b(), topo, CostConstants{});
  Layout l = MakeLayout(8, 1, 1, 1, 1, 8);
  l.sequence_parallel = true;
  const LayerTimes bf16 = cost.Layer(l);
  l.precision = Precision::kFp8;
  const LayerTimes fp8 = cost.Layer(l);
  EXPECT_NE(fp8.fwd_compute_s, bf16.fwd_compute_s);  // the layer's GEMMs and casts
  EXPECT_NEAR(fp8.output.fwd_compute_s, bf16.output.fwd_compute_s, 1e-12);
  EXPECT_NEAR(fp8.output.bwd_compute_s, bf16.output.bwd_compute_s, 1e-12);
}

TEST_F(AnalyticTest, Fp8KeepsTheQuantizedGemmInputs) {
  const double s = 2048, b = 1, h = 12288, t = 8, sbh = s * b * h;
  Layout l = MakeLayout(8, 16, 8, 1, 1, 1536);
  l.sequence_parallel = true;
  l.recompute = Recompute::kSelective;
  ASSERT_NEAR(cost_.LayerActivationBytes(l), 34 * sbh / t, 1);
  l.precision = Precision::kFp8;
  EXPECT_NEAR(cost_.LayerActivationBytes(l), 29 * sbh / t, 1);
  l.precision = Precision::kFp4;
  EXPECT_LT(cost_.LayerActivationBytes(l), 29 * sbh / t);
  EXPECT_GT(cost_.LayerActivationBytes(l), 24 * sbh / t);
  // Full recompute keeps the layer input only, in 16 bits whatever the GEMMs run in.
  l.recompute = Recompute::kFull;
  EXPECT_NEAR(cost_.LayerActivationBytes(l), 2 * sbh / t, 1);
}

TEST_F(AnalyticTest, WeightsGradsOptimizerAre18BytesPerParam) {
  Layout l = MakeLayout(8, 16, 8, 1, 1, 1536);
  const MemoryBytes m = cost_.StageMemory(l, 5);  // a middle stage: layers only
  const double params = cost_.ParamsOnStage(l, 5);
  EXPECT_NEAR(params, 96.0 / 16 * model_.params_per_layer() / 8, 1);
  EXPECT_NEAR((m.weights + m.grads + m.optimizer) / params, 18.0, 1e-9);
  l.distributed_optimizer = true;  // 6 + 12/d
  const MemoryBytes d = cost_.StageMemory(l, 5);
  EXPECT_NEAR((d.weights + d.grads + d.optimizer) / params, 6.0 + 12.0 / 8, 1e-9);
}

// --grad-reduce-in-bf16: bf16 gradient buffers, 2 bytes instead of 4 (16 bytes a parameter,
// 4 + 12/d with the distributed optimizer).
TEST_F(AnalyticTest, GradReduceInBf16HalvesTheGradients) {
  Layout l = MakeLayout(8, 16, 8, 1, 1, 1536);
  l.grad_reduce_in_bf16 = true;
  const MemoryBytes m = cost_.StageMemory(l, 5);
  const double params = cost_.ParamsOnStage(l, 5);
  EXPECT_NEAR(m.grads / params, 2.0, 1e-9);
  EXPECT_NEAR((m.weights + m.grads + m.optimizer) / params, 16.0, 1e-9);
  l.distributed_optimizer = true;
  const MemoryBytes d = cost_.StageMemory(l, 5);
  EXPECT_NEAR((d.weights + d.grads + d.optimizer) / params, 4.0 + 12.0 / 8, 1e-9);
}

// --use-precision-aware-optimizer: a bf16 model's fp32 masters as TE's 16-bit remainders (2
// bytes), the moments in their dtypes, bf16 main gradients as --grad-reduce-in-bf16; fp8 keeps
// fp32 masters; an fp32 model has none. The update streams proportionally fewer bytes.
TEST_F(AnalyticTest, PrecisionAwareOptimizerShrinksTheOptimizerState) {
  Layout l = MakeLayout(8, 16, 8, 1, 1, 1536);
  l.distributed_optimizer = true;
  const double params = cost_.ParamsOnStage(l, 5);
  const double plain_s = cost_.OptimizerTime(l, 1e9);
  EXPECT_EQ(AnalyticModel::OptimizerStateBytes(l), 12.0);
  l.optimizer_state.precision_aware = true;
  EXPECT_EQ(AnalyticModel::OptimizerStateBytes(l), 2.0 + 4 + 4);
  l.optimizer_state.exp_avg = l.optimizer_state.exp_avg_sq = StateDtype::kBf16;
  l.optimizer_state.main_grads = StateDtype::kBf16;
  const MemoryBytes m = cost_.StageMemory(l, 5);
  EXPECT_NEAR(m.optimizer / params, 6.0 / 8, 1e-9);
  EXPECT_NEAR(m.grads / params, 2.0, 1e-9);
  EXPECT_GT(cost_.OptimizerTime(l, 1e9), 0);
  EXPECT_LT(cost_.OptimizerTime(l, 1e9), plain_s);
  l.precision = Precision::kFp8;  // Megatron's own fp32 masters
  EXPECT_EQ(AnalyticModel::OptimizerStateBytes(l), 4.0 + 2 + 2);
  l.optimizer_state.main_params = StateDtype::kFp16;
  EXPECT_EQ(AnalyticModel::OptimizerStateBytes(l), 2.0 + 2 + 2);
  l.precision = Precision::kFp32;
  l.optimizer_state.exp_avg_sq = StateDtype::kFp8;
  EXPECT_EQ(AnalyticModel::OptimizerStateBytes(l), 2.0 + 1);
}

// --overlap-moe-expert-parallel-comm runs one more warm-up forward: at pp 1 two micro-batches'
// activations are in flight, not one; interleaved, one more chunk's.
TEST(AnalyticMoeMemory, AllToAllOverlapHoldsOneMoreMicrobatch) {
  const Topology topo = *Topology::Build(testing::DgxA100Like(16));
  const ModelSpec m = *LoadModel(std::string(PTDP_SOURCE_DIR) + "/configs/models/mixtral-8x7b.yaml");
  const AnalyticModel cost(m, topo, CostConstants{});
  Layout l;
  l.tp = 1; l.pp = 1; l.dp = 8; l.ep = 8; l.micro_batch = 1; l.global_batch = 64;
  l.distributed_optimizer = true;
  const double one = cost.StageMemory(l, 0).activations;
  l.moe_a2a_overlap = true;
  ASSERT_EQ(CheckLayout(m, l), Rejection::kOk);
  // The layers' activations twice (the output layer's logits and loss stay once).
  const double two = cost.StageMemory(l, 0).activations;
  EXPECT_GT(two, 1.95 * one);
  EXPECT_LT(two, 2 * one);
  l.tp = 1; l.pp = 4; l.vp = 2; l.dp = 2; l.ep = 2;
  l.schedule = ScheduleKind::kInterleaved;
  ASSERT_EQ(CheckLayout(m, l), Rejection::kOk);
  const double with = cost.StageMemory(l, 0).activations;
  l.moe_a2a_overlap = false;
  const double without = cost.StageMemory(l, 0).activations;
  // Rank 0 of pp 4, vp 2, m 32: 11 chunks in flight without, 12 with.
  EXPECT_NEAR(with / without, 12.0 / 11.0, 0.02);
}

// --fp16: Megatron keeps the gradient buffers in the parameters' dtype unless
// --accumulate-allreduce-grads-in-fp32 (which --bf16 turns on by itself).
TEST_F(AnalyticTest, Fp16GradientsAreFp16UnlessAccumulatedInFp32) {
  Layout l = MakeLayout(8, 16, 8, 1, 1, 1536);
  l.precision = Precision::kFp16;
  const double params = cost_.ParamsOnStage(l, 5);
  EXPECT_NEAR(cost_.StageMemory(l, 5).grads / params, 2.0, 1e-9);
  const double fp16_dp = cost_.DpTime(l, 1e9);
  l.accumulate_grads_in_fp32 = true;
  EXPECT_NEAR(cost_.StageMemory(l, 5).grads / params, 4.0, 1e-9);
  EXPECT_GT(cost_.DpTime(l, 1e9), 1.8 * fp16_dp);
  l.precision = Precision::kBf16;  // on by default there
  l.accumulate_grads_in_fp32 = false;
  EXPECT_NEAR(cost_.StageMemory(l, 5).grads / params, 4.0, 1e-9);
}

TEST_F(AnalyticTest, FirstStageHoldsPMicroBatchesUnder1F1B) {
  // Stage r keeps min(p - r, m) micro-batches of L/p layers in flight: stage 0 has p = 16 of
  // them, stage 15 one. Layer activations with SP and selective: 34 sbh / t.
  Layout l = MakeLayout(8, 16, 8, 1, 1, 1536);
  l.sequence_parallel = true;
  l.recompute = Recompute::kSelective;
  const double per_layer = cost_.LayerActivationBytes(l);
  const double sbh = 2048.0 * 12288;
  const double stage0 = cost_.StageMemory(l, 0).activations;
  // 16 micro-batches * 6 layers + embedding output (3 sbh / t per micro-batch in flight).
  EXPECT_NEAR(stage0, 16 * 6 * per_layer + 16 * 3 * sbh / 8, 1);
  const double mid = cost_.StageMemory(l, 8).activations;
  EXPECT_NEAR(mid, 8 * 6 * per_layer, 1);
}

TEST_F(AnalyticTest, InterleavingMultipliesFirstStageActivations) {
  // Interleaved: first stage holds L layers' worth times (1 + (p-1)/(p v)).
  Layout l = MakeLayout(8, 16, 8, 2, 1, 1536);
  l.sequence_parallel = true;
  l.recompute = Recompute::kSelective;
  const double per_layer = cost_.LayerActivationBytes(l);
  const double sbh = 2048.0 * 12288;
  const double expected_layers = 96.0 * (1 + 15.0 / (16 * 2));
  // The embedding's 3 sbh/t for each micro-batch whose chunk 0 the 2*15 + 16 + 1 = 47 forwards
  // hold: chunk 0 of micro-batches 0-15, chunk 1 of them, chunk 0 of 16-30 (groups of p).
  const double emb = (16 + 15) * 3 * sbh / 8;
  EXPECT_NEAR(cost_.StageMemory(l, 0).activations, expected_layers * per_layer + emb, 1);
}

TEST_F(AnalyticTest, DataParallelAllReduceTime) {
  // tp 8, pp 16, dp 8: one DP rank per node, 8 groups share the node's 8 x 25 GB/s NICs:
  // bus bandwidth 25 GB/s, times NCCL inter efficiency 0.9. All-reduce of 4 bytes/param:
  // 2 (d-1)/d * bytes / (25e9 * 0.9) + 2 (d-1) * 5 us.
  Layout l = MakeLayout(8, 16, 8, 1, 1, 1536);
  const double params = 1e9;
  const double bytes = 4e9;
  const double expected = 2.0 * 7 / 8 * bytes / (25e9 * 0.9) + 2 * 7 * 5e-6;
  EXPECT_NEAR(cost_.DpTime(l, params) / expected, 1.0, 0.02);
  // --grad-reduce-in-bf16: 2 bytes a gradient.
  l.grad_reduce_in_bf16 = true;
  const double half = 2.0 * 7 / 8 * bytes / 2 / (25e9 * 0.9) + 2 * 7 * 5e-6;
  EXPECT_NEAR(cost_.DpTime(l, params) / half, 1.0, 0.02);
}

// --overlap-param-gather off (the distributed optimizer with --overlap-grad-reduce): the
// all-gather of the updated parameters no longer hides under the next forward; every bucket's
// is exposed, so the DP figure grows by at most the all-gathers' whole time and at least what
// the forward hid. Megatron's command then leaves the flag out.
TEST_F(AnalyticTest, ParamGatherExposedWithoutItsOverlap) {
  Layout l = MakeLayout(8, 8, 16, 1, 1, 1536);
  l.sequence_parallel = true;
  l.distributed_optimizer = true;
  ASSERT_TRUE(l.param_gather_overlapped());
  const double params = 2e9, fwd = 0.05, bwd = 0.1;
  const double on = cost_.DpExposed(l, params, 0, bwd, fwd);
  l.overlap_param_gather = false;
  EXPECT_FALSE(l.param_gather_overlapped());
  const double off = cost_.DpExposed(l, params, 0, bwd, fwd);
  EXPECT_GT(off, on);
  // The all-gather of 2 bytes a parameter over dp 16 (one bucket's worth at a time): what
  // `off` adds is no more than the whole all-gather.
  Layout whole = l;
  whole.overlap_grad_reduce = false;  // one blocking reduce-scatter and all-gather
  EXPECT_LE(off - on, cost_.DpExposed(whole, params, 0, bwd, fwd) + 1e-9);
  // The step: slower by the exposed all-gather, all of it in dp_comm.
  const Estimate e_off = cost_.Evaluate(l);
  l.overlap_param_gather = true;
  const Estimate e_on = cost_.Evaluate(l);
  EXPECT_GT(e_off.breakdown.dp_comm_s, e_on.breakdown.dp_comm_s);
  EXPECT_NEAR(e_off.step_time_s - e_on.step_time_s,
              e_off.breakdown.dp_comm_s - e_on.breakdown.dp_comm_s, 1e-9);
}

TEST_F(AnalyticTest, BubbleFollowsNarayanan) {
  // Uniform stages (tiny vocabulary and free communication): bubble = (p-1)/(v m) of the
  // ideal time m * t_stage.
  ModelSpec m = model_;
  m.vocab = 1;
  ClusterSpec c = testing::DgxA100Like(128);
  c.intra.latency_s = 0;
  c.inter.latency_s = 0;
  c.intra.bw_bytes_per_s = 1e30;
  c.inter.nic_bw_bytes_per_s = 1e30;
  Topology topo = *Topology::Build(c);
  CostConstants k;
  // Free communication, no fixed cost per call either, and no per-kernel costs: the first and
  // last stages' extra kernels (embedding, output layer) would otherwise make them longer.
  k.collective_overhead_s = k.host_collective_s = k.host_kernel_s = k.kernel_overhead_s = 0;
  AnalyticModel cost(m, topo, k);
  for (int vp : {1, 2, 3}) {
    Layout l = MakeLayout(8, 16, 8, vp, 1, 1536);
    const Estimate e = cost.Evaluate(l);
    const double ideal = e.breakdown.compute_s + e.breakdown.tp_comm_s;
    const double mbs = 1536 / 8;
    // Within 1%: stage 0 still does the embedding lookup and stage p-1 the final norm, so the
    // stages are not exactly uniform.
    EXPECT_NEAR(e.breakdown.bubble_s / ideal, 15.0 / (vp * mbs), 0.01 * 15.0 / (vp * mbs))
        << "vp " << vp;
  }
}

TEST_F(AnalyticTest, MfuBelowOneAndBreakdownAddsUp) {
  for (int tp : {1, 2, 4, 8})
    for (int pp : {1, 2, 4, 8, 16}) {
      Layout l = MakeLayout(tp, pp, 1024 / (tp * pp), 1, 1, 2048);
      l.recompute = Recompute::kFull;
      const Estimate e = cost_.Evaluate(l);
      EXPECT_GT(e.mfu, 0);
      EXPECT_LT(e.mfu, 1) << l.ShortName();
      EXPECT_NEAR(e.breakdown.total(), e.step_time_s, 1e-12);
    }
}

TEST_F(AnalyticTest, PredictFindsTheMostLoadedStage) {
  Layout l = MakeLayout(8, 16, 8, 1, 1, 1536);
  const Prediction p = cost_.Predict(l);
  ASSERT_EQ(p.stage_memory_bytes.size(), 16u);
  for (double v : p.stage_memory_bytes) EXPECT_LE(v, p.memory.total + 1);
  EXPECT_EQ(p.fits, p.memory.total <= p.memory.capacity);
}

TEST(RegularGroupShape, MegatronGroups) {
  // TP 8 on 8-GPU nodes: one node, no sharing.
  GroupShape tp = RegularGroupShape(1, 8, 8);
  EXPECT_EQ(tp.per_node, 8);
  EXPECT_EQ(tp.nodes, 1);
  // DP of 8 with stride 8: one rank per node, 8 nodes, 8 groups share each node's NICs.
  GroupShape dp = RegularGroupShape(8, 8, 8);
  EXPECT_EQ(dp.per_node, 1);
  EXPECT_EQ(dp.nodes, 8);
  EXPECT_EQ(dp.sharing, 8);
  // DP of 16 with stride 2: 4 per node over 4 nodes, 2 groups per node.
  GroupShape dp2 = RegularGroupShape(2, 16, 8);
  EXPECT_EQ(dp2.per_node, 4);
  EXPECT_EQ(dp2.nodes, 4);
  EXPECT_EQ(dp2.sharing, 2);
  // Strides that do not divide the node count the span: the tied-embedding group of pp 4 x dp 2
  // is ranks 0 and 6 (stride 6), one node; ranks 0, 3, 6 (stride 3) too.
  GroupShape emb = RegularGroupShape(6, 2, 8);
  EXPECT_EQ(emb.per_node, 2);
  EXPECT_EQ(emb.nodes, 1);
  EXPECT_EQ(emb.sharing, 1);
  GroupShape three = RegularGroupShape(3, 3, 8);
  EXPECT_EQ(three.per_node, 3);
  EXPECT_EQ(three.nodes, 1);
  // Ranks 0, 6, 12: 0 and 6 on node 0 (ceil(8/6) = 2), 12 on node 1; 8/2 = 4 groups share NICs.
  GroupShape wide = RegularGroupShape(6, 3, 8);
  EXPECT_EQ(wide.per_node, 2);
  EXPECT_EQ(wide.nodes, 2);
  EXPECT_EQ(wide.sharing, 4);
  // Ranks 0 and 12: a stride over a node puts each member on its own node (not 12/8 + 1 = 2
  // by luck: 0 and 24 at stride 24 are 2 nodes too, not 4).
  GroupShape far = RegularGroupShape(24, 2, 8);
  EXPECT_EQ(far.per_node, 1);
  EXPECT_EQ(far.nodes, 2);
}

TEST(CheckEstimate, NamesTheLayoutAndTheTerm) {
  Layout l = MakeLayout(1, 4, 2, 1, 1, 8);
  l.precision = Precision::kFp32;
  Estimate e;
  e.breakdown.compute_s = 1;
  e.step_time_s = 1;
  e.memory.weights = e.memory.total = 1e9;
  EXPECT_TRUE(CheckEstimate(l, e).ok());
  // The breakdown part is named before the step time it made infinite.
  e.breakdown.dp_comm_s = INFINITY;
  e.step_time_s = e.breakdown.total();
  EXPECT_EQ(CheckEstimate(l, e).message(),
            "cost model: tp1 pp4 dp2 mb1 [fp32]: dp_comm_s is inf (step_time_s inf): not a "
            "finite, non-negative figure");
  e.breakdown.dp_comm_s = 0;
  e.step_time_s = 0;  // finite but not a time a step can take
  EXPECT_EQ(CheckEstimate(l, e).message(),
            "cost model: tp1 pp4 dp2 mb1 [fp32]: step_time_s is 0 (step_time_s 0): not a "
            "finite, positive figure");
  e.step_time_s = 1;
  e.memory.activations = -1;
  EXPECT_NE(CheckEstimate(l, e).message().find("memory.activations is -1"), std::string::npos);
  e.memory.activations = 0;
  e.memory.total = std::nan("");
  EXPECT_NE(CheckEstimate(l, e).message().find("memory.total is nan"), std::string::npos);
}

// Issue 12: on a one-node cluster (no network) the tied-embedding all-reduce of pp 4 x dp 2 runs
// on the node's links. Before, its group was taken for two nodes and timed on the missing
// network's 0 B/s: an infinite time, and 0/0 = NaN for its latency part.
TEST(AnalyticOneNode, EmbeddingReduceStaysOnTheNode) {
  ClusterSpec c;
  c.name = "one-node";
  c.nodes = 1;
  c.gpus_per_node = 8;
  c.gpu.name = "G";
  c.gpu.memory_bytes = 80.0 * 1073741824.0;
  c.gpu.hbm_bw_bytes_per_s = 2e12;
  c.gpu.peak_bf16 = 312e12;
  c.intra.fabric = IntraFabric::kNvSwitch;
  c.intra.bw_bytes_per_s = 100e9;
  c.intra.latency_s = 2e-6;
  const Topology topo = *Topology::Build(c);
  ModelSpec m;
  m.name = "tiny";
  m.layers = 8; m.hidden = 64; m.heads = 4; m.kv_heads = 4; m.ffn_hidden = 256;
  m.seq_len = 64; m.vocab = 256;
  m.tied_embeddings = true;
  const CostConstants k;
  const AnalyticModel cost(m, topo, k);
  const Layout l = MakeLayout(1, 4, 2, 1, 1, 8);
  // All-reduce of the fp32 word-embedding gradient, V h 4 = 256 * 64 * 4 = 65536 B, over 2
  // ranks: 2 (n-1) = 2 hops of 2 us and 2 (n-1)/n = 1 times the bytes at 100 GB/s, plus the
  // per-collective overhead.
  const double expected = k.collective_overhead_s + 2 * 2e-6 + 65536 / 100e9 / k.nccl_intra_eff;
  EXPECT_NEAR(cost.EmbeddingReduceTime(l), expected, 1e-12);
  const Estimate e = cost.Evaluate(l);
  EXPECT_TRUE(std::isfinite(e.step_time_s));
  EXPECT_GT(e.step_time_s, 0);
  EXPECT_NEAR(e.step_time_s, e.breakdown.total(), 1e-12);
}

// GB200 NVL72: a rack's 72 GPUs are one NVLink domain, so tp 8 x dp 9 on one rack reduces its
// gradients over NVLink, where on 9 DGX B200-like nodes (same GPUs, NVLink and NICs per GPU) the
// DP group has one rank per node and 8 groups share each node's 8 x 50 GB/s NICs. All-reduce of
// 4 bytes/param, 1e9 params, 9 ranks: 2 * 8 hops and 2 * 8 / 9 * 4e9 bytes, at 900 GB/s and
// 3 us (NCCL intra efficiency) against 50 GB/s and 5 us (inter efficiency).
TEST(AnalyticNvl72, DataParallelInsideARackRunsOnNvlink) {
  const Topology rack = *Topology::Build(testing::Nvl72Like(1));
  const Topology nodes = *Topology::Build(testing::DgxB200Like(9));
  const CostConstants k;
  const AnalyticModel on_rack(Gpt3_175b(), rack, k), on_nodes(Gpt3_175b(), nodes, k);
  const Layout l = MakeLayout(8, 1, 9, 1, 1, 72);
  const double bytes = 16.0 / 9 * 4e9;
  EXPECT_NEAR(on_rack.DpTime(l, 1e9),
              k.collective_overhead_s + 16 * 3e-6 + bytes / 900e9 / k.nccl_intra_eff, 1e-12);
  EXPECT_NEAR(on_nodes.DpTime(l, 1e9),
              k.collective_overhead_s + 16 * 5e-6 + bytes / 50e9 / k.nccl_inter_eff, 1e-12);
  // The TP group (8 ranks on two trays, or one node) is the same NVLink ring on both.
  EXPECT_EQ(RegularGroupShape(1, 8, rack.spec().nvlink_domain_gpus()).nodes, 1);
}

}  // namespace
}  // namespace ptdp
