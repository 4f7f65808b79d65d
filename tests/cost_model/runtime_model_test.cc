// RuntimeModel: the op-by-op composition checked by hand on primitives that cost exactly 1 ns
// per unit of work, the memory formula checked against the CPU runtime's own tracked peak (which
// is deterministic: bytes requested), and the hand-over from AnalyticModel.
#include "cost_model/runtime_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "core/rank_grid.h"
#include "cost_model/analytic.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/thread_communicator.h"
#include "runtime/data.h"
#include "runtime/trainer.h"
#include "tests/fakes/beside_world.h"
#include "tests/fakes/test_cluster.h"
#include "tests/fakes/tiny_training.h"

namespace ptdp {
namespace {

// A table whose time is exactly `ns` x the product of its axis values (times 2 for GEMMs,
// 2mnk FLOPs at 1 GFLOP/s): a power law, which log-log interpolation reproduces exactly.
MeasuredTable PowerLaw(const TableKind& kind, double ns, std::vector<double> powers = {}) {
  std::vector<std::vector<double>> rows;
  const size_t dims = kind.axes.size();
  std::vector<double> exponents;
  for (const TableAxis& a : kind.axes) exponents.push_back(a.exponent);
  for (size_t corner = 0; corner < (size_t(1) << dims); ++corner) {
    std::vector<double> row;
    double s = ns * 1e-9;
    for (size_t a = 0; a < dims; ++a) {
      const double v = (corner >> a) & 1 ? 65536.0 : 1.0;
      row.push_back(v);
      s *= std::pow(v, powers.empty() ? kind.axes[a].exponent : powers[a]);
    }
    row.push_back(s);
    rows.push_back(row);
  }
  return *MeasuredTable::FromRows(rows, exponents, kind.name);
}

// Every primitive costs 1 ns per unit: per element, per byte, per (s^2 d) of attention, per
// rank-byte of a collective, 2 mnk for a GEMM.
MeasuredPrimitives UnitPrimitives() {
  MeasuredPrimitives m;
  m.backend = "cpu";
  m.cores = 64;
  m.element_bytes = 4;
  m.attention_saved_per_score = 1;
  for (const TableKind& k : MeasuredTableKinds())
    m.tables[k.name] = PowerLaw(k, std::string(k.name).rfind("gemm", 0) == 0 ? 2.0 : 1.0);
  return m;
}

// L 1, h 2, a 1 (head dim 2), f 4, s 2, V 128: T = b s = 2 tokens at b = 1.
ModelSpec Micro(int heads = 1) {
  ModelSpec m;
  m.name = "micro";
  m.layers = 1;
  m.hidden = 2;
  m.heads = heads;
  m.kv_heads = heads;
  m.ffn_hidden = 4;
  m.seq_len = 2;
  m.vocab = 128;
  return m;
}

TEST(RuntimeModelTest, LayerIsTheSumOfItsOpsByHand) {
  const RuntimeModel rm(Micro(), UnitPrimitives(), 8);
  Layout l;
  l.global_batch = 1;
  const RuntimeLayerTimes lt = rm.Layer(l);
  // T = Tl = 2, h = 2, A = 2, Q = 6, F = 4, e = 4 bytes; ns per op (alloc = bytes):
  // forward: LN block 16 + 2x8 + 4 = 36; QKV with its bias 48 + 2*2*6*2 = 96; attention saved
  // P (1 head x 2x2 x 4 B) 16 + output 16 + core s^2 d = 8 -> 40; projection 16 + 16 = 32;
  // bias + residual + LN block 16 + 2x8 + 4 = 36; fc1 with bias and GeLU 32 + 32 = 64; the
  // GeLU's output 32; fc2 16 + 32 = 48; bias + residual 4. Sum 388.
  EXPECT_NEAR(lt.fwd_compute_s, 388e-9, 1e-15);
  // backward: grad buffer 16 + copy 4; bias grad 4; fc2 wgrad 32; dgrad with GeLU's gradient
  // 32 + 32; bias grad 8; fc1 wgrad 32; dgrad 16 + 32; LN' 4; bias grad 4; proj wgrad 16; dgrad
  // 16 + 16; attention' 48 + 8; bias grad 12; QKV wgrad 48; dgrad 16 + 48; LN' 4. Sum 448.
  EXPECT_NEAR(lt.bwd_compute_s, 448e-9, 1e-15);
  EXPECT_EQ(lt.fwd_tp_s, 0);
  EXPECT_EQ(lt.bwd_tp_s, 0);
}

// A calibration without the fused calls' tables (a backend that runs them as separate kernels
// and did not time them, or a file from before them) prices each call as its parts (backward
// below): QKV's bias
// 12 more; the projection's bias 4, residual add 4 and LN 4 for its fused 4; FC1's bias 8 and
// GeLU 8; FC2's bias 4 and add 4 for its 4. 388 + 12 + 8 + 16 + 4 = 428 ns.
TEST(RuntimeModelTest, FusedCallsWithoutTheirTablesAreTheirParts) {
  MeasuredPrimitives m = UnitPrimitives();
  for (const TableKind& k : MeasuredTableKinds())
    if (k.optional) m.tables.erase(k.name);
  ASSERT_TRUE(m.CheckComplete("unit").ok());
  Layout l;
  l.global_batch = 1;
  EXPECT_NEAR(RuntimeModel(Micro(), m, 8).Layer(l).fwd_compute_s, 428e-9, 1e-15);
  // FC2's dgrad through GeLU's gradient as gemm_nn + gelu_backward: 448 + GeLU' 8 = 456 ns.
  EXPECT_NEAR(RuntimeModel(Micro(), m, 8).Layer(l).bwd_compute_s, 456e-9, 1e-15);
  // With bias_residual but not its LayerNorm form: that plus the LN.
  m.tables["bias_residual"] = PowerLaw(*FindTableKind("bias_residual"), 3.0);
  // FC2's bias and add 8 -> 12, the projection's 12 -> 12 + LN 4: 428 + 4 + 4 = 436.
  EXPECT_NEAR(RuntimeModel(Micro(), m, 8).Layer(l).fwd_compute_s, 436e-9, 1e-15);
}

TEST(RuntimeModelTest, TensorParallelCollectivesByHand) {
  const RuntimeModel rm(Micro(2), UnitPrimitives(), 8);
  Layout l;
  l.tp = 2;
  l.global_batch = 1;
  // Without SP: 2 all-reduces of T h e = 16 bytes forward and 2 backward, each 2 ranks x 16 B.
  RuntimeLayerTimes lt = rm.Layer(l);
  EXPECT_NEAR(lt.fwd_tp_s, 2 * 32e-9, 1e-15);
  EXPECT_NEAR(lt.bwd_tp_s, 2 * 32e-9, 1e-15);
  // With SP: all-gather + reduce-scatter of the same 16 bytes, twice each way.
  l.sequence_parallel = true;
  lt = rm.Layer(l);
  EXPECT_NEAR(lt.fwd_tp_s, 4 * 32e-9, 1e-15);
  EXPECT_NEAR(lt.bwd_tp_s, 4 * 32e-9, 1e-15);
}

TEST(RuntimeModelTest, DataParallelReducesEveryTensor) {
  const ModelSpec m = Micro();
  const RuntimeModel rm(m, UnitPrimitives(), 8);
  Layout l;
  l.dp = 2;
  l.global_batch = 2;
  // One chunk holding everything: word (128 x 2), positions (2 x 2), 12 layer tensors, final
  // LN (2 tensors); an all-reduce of 2 ranks x 4n bytes plus a scale of n, over all of them.
  double expected = 0;
  for (const RuntimeTensor& t : rm.ChunkTensors(l, 0, 0)) expected += 2 * 4 * t.numel + t.numel;
  EXPECT_EQ(rm.ChunkTensors(l, 0, 0).size(), 16u);
  double params = 0;
  for (const RuntimeTensor& t : rm.ChunkTensors(l, 0, 0)) params += t.numel;
  EXPECT_EQ(params, double(m.total_params()));  // V is already a multiple of 128
  EXPECT_NEAR(rm.ChunkDp(l, 0, 0), expected * 1e-9, 1e-15);
  // --grad-reduce-in-bf16: each bucket rounded into the bf16 mirror (a copy), scaled there, a
  // 2-byte all-reduce, copied back; without peers (dp 1) only the two copies.
  l.grad_reduce_in_bf16 = true;
  EXPECT_NEAR(rm.ChunkDp(l, 0, 0), (params + params + 2 * 2 * params + params) * 1e-9, 1e-15);
  l.dp = 1;
  EXPECT_NEAR(rm.ChunkDp(l, 0, 0), 2 * params * 1e-9, 1e-15);
  // After each backward but the last (m 4: three), the gradients rounded: two copies.
  l.global_batch = 4;
  EXPECT_NEAR(rm.Optimizer(l, 0).round_s, 3 * 2 * params * 1e-9, 1e-15);
  l.grad_reduce_in_bf16 = false;
  EXPECT_EQ(rm.Optimizer(l, 0).round_s, 0);
}

// The distributed optimizer over dp 3: per tensor a reduce-scatter (3 ranks x 4 bytes x the
// padded size) and a scale of the slice, plus, where 3 does not divide the tensor, the padded
// copy (alloc of its bytes, copy of the tensor); after AdamW (ChunkDpGather) the all-gather of
// the padded slices, its buffer and the copies in and out. Micro's tensors: word 256, positions
// 4, 4 LN tensors of 2, QKV 12 + 6, projection 4 + 2, fc1 8 + 4, fc2 8 + 2, final LN 2 x 2.
TEST(RuntimeModelTest, DistributedOptimizerScattersEachTensorAndGathersAfterAdamW) {
  const RuntimeModel rm(Micro(), UnitPrimitives(), 8);
  Layout l;
  l.dp = 3;
  l.global_batch = 3;
  l.distributed_optimizer = true;
  double scatter = 0, gather = 0;
  int copies = 0;
  for (const RuntimeTensor& t : rm.ChunkTensors(l, 0, 0)) {
    const double ks = std::ceil(t.numel / 3), padded = 3 * ks;
    scatter += 3 * 4 * padded + ks;
    gather += 3 * 4 * padded;
    if (padded != t.numel) {
      scatter += 4 * padded + t.numel;
      gather += 4 * padded + ks + t.numel;
      ++copies;
    }
  }
  EXPECT_EQ(copies, 14);  // all 16 but QKV's weight (12) and bias (6)
  EXPECT_NEAR(rm.ChunkDp(l, 0, 0), scatter * 1e-9, 1e-15);
  // --grad-reduce-in-bf16: the gradient rounded and scaled into the bf16 mirror, padded in
  // bf16, 2-byte elements scattered, the slice copied back into fp32 (instead of its scale).
  double bf16 = 0;
  for (const RuntimeTensor& t : rm.ChunkTensors(l, 0, 0)) {
    const double ks = std::ceil(t.numel / 3), padded = 3 * ks;
    bf16 += 2 * t.numel + 3 * 2 * padded + ks;
    if (padded != t.numel) bf16 += 2 * padded + t.numel;
  }
  l.grad_reduce_in_bf16 = true;
  EXPECT_NEAR(rm.ChunkDp(l, 0, 0), bf16 * 1e-9, 1e-15);
  l.grad_reduce_in_bf16 = false;
  EXPECT_NEAR(rm.ChunkDpGather(l, 0, 0), gather * 1e-9, 1e-15);
  EXPECT_EQ(rm.ChunkDpBuckets(l, 0, 0).size(), rm.ChunkTensors(l, 0, 0).size());
  // Beside the next forward (--overlap-param-gather), its parts wait: the embedding, each
  // layer, the output.
  EXPECT_EQ(rm.ChunkDpGatherParts(l, 0, 0), 1 + 2);
  l.distributed_optimizer = false;
  EXPECT_EQ(rm.ChunkDpGather(l, 0, 0), 0);
  EXPECT_EQ(rm.ChunkDpGatherParts(l, 0, 0), 0);
}

// The runtime reduces a chunk's gradients in one bucket per reduction group (the contiguous
// grad buffer of GptChunk), and with SP sums the replicated ones over TP in one all-reduce:
// with collectives that cost sqrt(bytes) (a per-call cost) one call of all the bytes is
// cheaper than a call per tensor, so the figures say how many calls the model counts.
TEST(RuntimeModelTest, GradientsAreReducedInOneBucketPerGroup) {
  const ModelSpec m = Micro(2);
  MeasuredPrimitives p = UnitPrimitives();
  p.tables["all_reduce"] = PowerLaw(*FindTableKind("all_reduce"), 1.0, {1.0, 0.5});
  const RuntimeModel rm(m, p, 8);
  Layout l;
  l.dp = 2;
  l.global_batch = 2;
  double params = 0, replicated = 0, per_tensor = 0;
  for (const RuntimeTensor& t : rm.ChunkTensors(l, 0, 0)) {
    params += t.numel;
    per_tensor += 2 * std::sqrt(4 * t.numel) * 1e-9;
  }
  const double one_bucket = 2 * std::sqrt(4 * params) * 1e-9;
  ASSERT_LT(one_bucket, 0.5 * per_tensor);
  EXPECT_NEAR(rm.ChunkDp(l, 0, 0), one_bucket + params * 1e-9, 1e-15);  // + the scale

  // tp 2 with SP: the replicated tensors (LN, row-parallel bias, positions) in one TP call;
  // the grad buffer zeroed by one fill.
  l.dp = 1;
  l.tp = 2;
  l.sequence_parallel = true;
  l.global_batch = 1;
  params = 0;
  for (const RuntimeTensor& t : rm.ChunkTensors(l, 0, 0)) {
    params += t.numel;
    if (t.replicated) replicated += t.numel;
  }
  ASSERT_GT(replicated, 0);
  const RuntimeOptimizerTimes o = rm.Optimizer(l, 0);
  EXPECT_NEAR(o.tp_s, 2 * std::sqrt(4 * replicated) * 1e-9, 1e-15);
  EXPECT_NEAR(o.fill_s, params * 1e-9, 1e-15);
  EXPECT_EQ(rm.ChunkDp(l, 0, 0), 0);  // dp 1, cp 1: nothing to reduce or average
}

// The optimizer runs over a chunk's whole parameters in runs of its buffers' order (replicated,
// other dense; decayed first in each), one sum_squares and one adamw per run, one fill of the
// grad buffer. Micro: replicated, not decayed: positions 4, the four LN tensors 8, the
// row-parallel biases 2 + 2, the final LN 4 = 20; decayed weights: word 256, QKV 12,
// projection 4, fc1 8, fc2 8 = 288; other biases: QKV 6, fc1 4 = 10. With per-call costs of
// sqrt(elements) ns the figure says which runs the model counts.
TEST(RuntimeModelTest, OptimizerRunsOverTheBufferOrder) {
  const ModelSpec m = Micro();
  MeasuredPrimitives p = UnitPrimitives();
  p.tables["sum_squares"] = PowerLaw(*FindTableKind("sum_squares"), 1.0, {0.5});
  p.tables["adamw"] = PowerLaw(*FindTableKind("adamw"), 1.0, {0.5});
  const RuntimeModel rm(m, p, 8);
  Layout l;
  l.global_batch = 1;
  ASSERT_EQ(m.total_params(), 318);
  const RuntimeOptimizerTimes o = rm.Optimizer(l, 0);
  const double runs = std::sqrt(20.0) + std::sqrt(288.0) + std::sqrt(10.0);
  EXPECT_NEAR(o.fill_s, 318e-9, 1e-15);
  EXPECT_NEAR(o.total_s, (4 + 2 * runs + 318) * 1e-9, 1e-15);  // + the norm's 4-byte alloc
}

TEST(RuntimeModelTest, ExecutedLayoutIsWhatTheRuntimeRuns) {
  const RuntimeModel rm(Micro(), UnitPrimitives(), 8);
  Layout l;
  l.recompute = Recompute::kFull;
  l.precision = Precision::kBf16;
  l.overlap_grad_reduce = true;
  l.tp_comm_overlap = true;
  const Layout x = rm.Executed(l);
  EXPECT_EQ(x.recompute, Recompute::kFull);  // the runtime recomputes as Megatron does
  EXPECT_EQ(x.precision, Precision::kFp32);
  EXPECT_TRUE(x.overlap_grad_reduce);  // its buckets go beside the backward (64 cores)
  EXPECT_FALSE(x.tp_comm_overlap);
  l.distributed_optimizer = true;  // so do its reduce-scatters, and its all-gathers beside the next forward
  EXPECT_TRUE(rm.Executed(l).overlap_grad_reduce);
  l.overlap_grad_reduce = false;
  EXPECT_FALSE(rm.Executed(l).overlap_grad_reduce);
  // Where the communicators cannot run beside compute: CPU threads with 2 x ranks above the
  // cores (8 ranks, 8 cores), every rank on one GPU (DeviceWorld); NCCL can.
  l.overlap_grad_reduce = true;
  l.dp = 8;
  MeasuredPrimitives p = UnitPrimitives();
  p.communicator = "threads";
  p.cores = 8;
  EXPECT_FALSE(RuntimeModel(Micro(), p, 8).Executed(l).overlap_grad_reduce);
  p.cores = 16;
  EXPECT_TRUE(RuntimeModel(Micro(), p, 8).Executed(l).overlap_grad_reduce);
  p.backend = "cuda";
  p.communicator = "device";
  EXPECT_FALSE(RuntimeModel(Micro(), p, 8).Executed(l).overlap_grad_reduce);
  p.communicator = "nccl";
  p.cores = 8;
  EXPECT_TRUE(RuntimeModel(Micro(), p, 8).Executed(l).overlap_grad_reduce);
}

TEST(RuntimeModelTest, RanksBeyondTheCoresShareThem) {
  MeasuredPrimitives p = UnitPrimitives();
  p.cores = 2;
  const RuntimeModel rm(Micro(2), p, 8);
  Layout one, four;
  one.global_batch = 4;
  four.dp = 4;
  four.global_batch = 4;
  // 4 ranks on 2 cores: every op of a rank takes twice as long.
  EXPECT_NEAR(rm.Layer(four).fwd_compute_s, 2 * rm.Layer(one).fwd_compute_s, 1e-15);
  // With both cores busy each runs 1.2x slower than one alone (calibrate's busy_cores_slowdown):
  // 2 ranks' ops take 1.2x, 4 ranks' (both cores busy, taking turns) 2 x 1.2x; one rank's none.
  p.busy_cores_slowdown = 1.2;
  const RuntimeModel busy(Micro(2), p, 8);
  Layout two;
  two.dp = 2;
  two.global_batch = 4;
  EXPECT_NEAR(busy.Layer(one).fwd_compute_s, rm.Layer(one).fwd_compute_s, 1e-15);
  EXPECT_NEAR(busy.Layer(two).fwd_compute_s, 1.2 * rm.Layer(two).fwd_compute_s, 1e-15);
  EXPECT_NEAR(busy.Layer(four).fwd_compute_s, 2.4 * rm.Layer(one).fwd_compute_s, 1e-15);
}

TEST(RuntimeModelTest, AnalyticModelUsesItOnlyWithMeasuredPrimitives) {
  ClusterSpec c = testing::DgxA100Like(1);
  const Topology plain = *Topology::Build(c);
  c.measured = UnitPrimitives();
  const Topology measured = *Topology::Build(c);
  const ModelSpec m = Micro();
  auto a = AnalyticModel::Create(m, plain);
  auto b = AnalyticModel::Create(m, measured);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->runtime(), nullptr);
  ASSERT_NE(b->runtime(), nullptr);
  Layout l;
  l.global_batch = 1;
  EXPECT_DOUBLE_EQ(b->Layer(l).fwd_compute_s, b->runtime()->Layer(l).fwd_compute_s);
  EXPECT_NE(a->Layer(l).fwd_compute_s, b->Layer(l).fwd_compute_s);
  // An incomplete measured block is refused, naming what is missing.
  c.measured.tables.erase("adamw");
  const Topology partial = *Topology::Build(c);
  auto bad = AnalyticModel::Create(m, partial);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("adamw"), std::string::npos) << bad.status().message();
}

// The dist-opt all-gather the step waits for: all of it after AdamW; with
// --overlap-param-gather what the next forward of W seconds does not hide over its n parts
// (embedding, layer, output): max(total / n, total - W (1 - 1/n)).
TEST(RuntimeModelTest, ParamGatherBesideTheForwardHidesAllButItsFirstPart) {
  ClusterSpec c = testing::DgxA100Like(1);
  c.measured = UnitPrimitives();
  const Topology measured = *Topology::Build(c);
  auto a = AnalyticModel::Create(Micro(), measured);
  ASSERT_TRUE(a.ok()) << a.status().message();
  Layout l;
  l.dp = 3;
  l.global_batch = 3;
  l.distributed_optimizer = true;
  l.overlap_grad_reduce = false;
  const double total = a->runtime()->ChunkDpGather(l, 0, 0);
  ASSERT_GT(total, 0);
  EXPECT_DOUBLE_EQ(a->StageDpGatherTime(l, 0, 1.0), total);  // after AdamW
  l.overlap_grad_reduce = true;
  ASSERT_TRUE(a->Executed(l).overlap_grad_reduce);
  EXPECT_DOUBLE_EQ(a->StageDpGatherTime(l, 0, 0), total);  // nothing to hide under
  EXPECT_DOUBLE_EQ(a->StageDpGatherTime(l, 0, 1.0), total / 3);  // a long forward: the first part
  const double w = 0.75 * total;
  EXPECT_DOUBLE_EQ(a->StageDpGatherTime(l, 0, w), std::max(total / 3, total - w * 2 / 3));
  l.distributed_optimizer = false;
  EXPECT_EQ(a->StageDpGatherTime(l, 0, 1.0), 0);
}

// ---- memory against the CPU runtime ----------------------------------------------------------

struct MemCase {
  int tp, pp, dp, vp, b;
  bool sp, dopt;
  ScheduleKind schedule;
  bool grad_bf16 = false;  // --grad-reduce-in-bf16 (bf16 runs)
};

// Trains one step of `l` on the CPU runtime (`beside`: its communicators say they run beside
// compute, so that --overlap-grad-reduce's reducer runs on any machine).
Result<rt::StepResult> OneStep(const ModelSpec& m, const Layout& l, bool bf16, bool timeline,
                               bool beside = false) {
  rt::TrainerConfig cfg;
  cfg.model = m;
  cfg.layout = l;
  cfg.bf16 = bf16;
  cfg.record_timeline = timeline;
  cfg.train_tokens = &testing::Shakespeare().train;
  rt::ThreadWorld world(l.world(), 30.0);
  testing::BesideWorld overlapping(world);
  PTDP_ASSIGN_OR_RETURN(auto trainer,
                        rt::Trainer::Create(cfg, testing::CpuBackends(),
                                            beside ? static_cast<rt::CommunicatorFactory&>(overlapping)
                                                   : world));
  return trainer->Step();
}

// Trains one step and returns each rank's tracked peak (bytes of live tensors).
std::vector<double> MeasuredPeaks(const ModelSpec& m, const Layout& l, bool bf16 = false) {
  auto step = OneStep(m, l, bf16, /*timeline=*/false);
  EXPECT_TRUE(step.ok()) << step.status().message();
  std::vector<double> peaks;
  if (step.ok())
    for (const rt::RankTimes& r : step->ranks) peaks.push_back(r.peak_memory_bytes);
  return peaks;
}

// Each case trained one step on the CPU runtime (fp32, or bf16 storage); every rank's predicted
// stage memory within 0.5% of its tracked peak. Byte-exact in most cases; the rest are small
// tensors (interleaving's stage 0: 160 bytes, 0.02%) and dist-opt slices of other sizes on DP
// ranks > 0.
void ExpectMemoryMatchesTheCpuRuntime(const std::vector<MemCase>& cases, bool bf16) {
  MeasuredPrimitives p;  // memory needs only how the backend stores tensors
  p.element_bytes = bf16 ? 2 : 4;
  p.attention_saved_per_score = 1;  // the CPU backend keeps P (b, a/t, s, s)
  const ModelSpec m = testing::TinyGpt();
  const RuntimeModel rm(m, p, 8);
  for (const MemCase& c : cases) {
    Layout l;
    l.tp = c.tp, l.pp = c.pp, l.dp = c.dp, l.vp = c.vp, l.micro_batch = c.b;
    l.global_batch = 8;
    l.sequence_parallel = c.sp;
    l.distributed_optimizer = c.dopt;
    l.schedule = c.schedule;
    l.grad_reduce_in_bf16 = c.grad_bf16;
    const std::vector<double> peaks = MeasuredPeaks(m, l, bf16);
    ASSERT_EQ(peaks.size(), size_t(l.world())) << l.ShortName();
    const RankGrid grid(l.tp, l.dp, l.pp);
    for (int g = 0; g < l.world(); ++g) {
      const double predicted = rm.StageMemory(l, grid.Coord(g).pp, 0, 0, 0).total;
      EXPECT_NEAR(predicted / peaks[size_t(g)], 1.0, 0.005)
          << (bf16 ? "bf16 " : "") << l.ShortName() << " " << l.Knobs() << " "
          << ToString(l.schedule) << " rank " << g << ": predicted " << predicted
          << ", measured " << peaks[size_t(g)];
    }
  }
}

// --overlap-grad-reduce: the runtime model's gradient buckets are the trainer's. Each layout
// trains one step with --ddp-bucket-size 2000 and its timeline (the reducer's buckets, and with
// the distributed optimizer each tensor's reduce-scatter, are DP events of a chunk); every rank
// ran as many as ChunkDpBuckets lists for its chunks, and the model's buckets hold every reduced
// element once. Without the overlap: one bucket per group (a tensor each with dist-opt).
TEST(RuntimeModelTest, GradientBucketsAreTheTrainers) {
  struct Case {
    testing::TinyLayoutSpec spec;
    bool moe = false;
  };
  auto spec = [](int tp, int pp, int dp, bool sp, int cp = 1, int ep = 1, bool dopt = false) {
    testing::TinyLayoutSpec s;
    s.tp = tp, s.pp = pp, s.dp = dp, s.sp = sp, s.cp = cp, s.ep = ep, s.dopt = dopt;
    return s;
  };
  const Case cases[] = {{spec(1, 1, 2, false)},
                        {spec(2, 1, 2, true)},
                        {spec(1, 2, 2, false)},
                        {spec(1, 1, 2, false, 2)},
                        {spec(1, 1, 4, false, 1, 2), true},
                        {spec(1, 1, 2, false, 1, 1, true)},
                        {spec(2, 1, 2, true, 1, 1, true)},
                        {spec(1, 1, 4, false, 1, 2, true), true}};
  MeasuredPrimitives p;
  p.element_bytes = 4;
  for (const Case& c : cases) {
    const ModelSpec m = c.moe ? testing::TinyMoe() : testing::TinyGpt();
    const RuntimeModel rm(m, p, 8);
    Layout l = testing::TinyLayout(c.spec);
    l.ddp_bucket_size = 2000;
    SCOPED_TRACE(l.ShortName() + " " + l.Knobs());
    auto step = OneStep(m, l, /*bf16=*/false, /*timeline=*/true, /*beside=*/true);
    ASSERT_TRUE(step.ok()) << step.status().message();
    const RankGrid grid(l.tp, l.cp, l.dp, l.pp, l.expert_tp(), l.ep);
    for (int g = 0; g < l.world(); ++g) {
      int ran = 0;
      for (const rt::StepEvent& e : step->ranks[size_t(g)].events)
        ran += e.kind == rt::StepEventKind::kDpComm && e.chunk >= 0;
      size_t listed = 0;
      for (int ch = 0; ch < l.vp; ++ch) listed += rm.ChunkDpBuckets(l, grid.Coord(g).pp, ch).size();
      EXPECT_EQ(size_t(ran), listed) << "rank " << g;
      EXPECT_GT(listed, 8u);
    }
    double split = 0, whole = 0;
    for (const RuntimeModel::DpBucket& b : rm.ChunkDpBuckets(l, 0, 0)) split += b.numel;
    const size_t listed = rm.ChunkDpBuckets(l, 0, 0).size();
    l.overlap_grad_reduce = false;
    const std::vector<RuntimeModel::DpBucket> one = rm.ChunkDpBuckets(l, 0, 0);
    // Dense, and the experts' over expert DP; the distributed optimizer: a tensor each anyway.
    EXPECT_EQ(one.size(), c.spec.dopt ? listed : c.moe ? 2u : 1u);
    for (const RuntimeModel::DpBucket& b : one) {
      whole += b.numel;
      EXPECT_FALSE(b.overlapped);
    }
    EXPECT_EQ(split, whole);
  }
}

TEST(RuntimeModelTest, MemoryMatchesTheCpuRuntimesTrackedPeak) {
  ExpectMemoryMatchesTheCpuRuntime({{1, 1, 1, 1, 1, false, false, ScheduleKind::kOneFOneB},
                                    {1, 1, 1, 1, 4, false, false, ScheduleKind::kOneFOneB},
                                    {2, 1, 1, 1, 2, false, false, ScheduleKind::kOneFOneB},
                                    {2, 1, 1, 1, 2, true, false, ScheduleKind::kOneFOneB},
                                    {1, 2, 1, 1, 1, false, false, ScheduleKind::kOneFOneB},
                                    {1, 2, 1, 1, 2, false, false, ScheduleKind::kGPipe},
                                    {1, 4, 1, 2, 1, false, false, ScheduleKind::kInterleaved},
                                    {1, 1, 2, 1, 1, false, false, ScheduleKind::kOneFOneB},
                                    {1, 1, 2, 1, 2, false, true, ScheduleKind::kOneFOneB},
                                    {2, 2, 2, 1, 1, true, true, ScheduleKind::kOneFOneB}},
                                   /*bf16=*/false);
}

// bf16 (TrainerConfig::bf16): activations and weights of 2 bytes, fp32 gradients, moments and
// main weights, fp32 statistics among the activations (measured: within 0.12% in every case).
TEST(RuntimeModelTest, Bf16MemoryMatchesTheCpuRuntimesTrackedPeak) {
  ExpectMemoryMatchesTheCpuRuntime({{1, 1, 1, 1, 1, false, false, ScheduleKind::kOneFOneB},
                                    {2, 1, 1, 1, 2, true, false, ScheduleKind::kOneFOneB},
                                    {1, 2, 1, 1, 2, false, false, ScheduleKind::kGPipe},
                                    {1, 4, 1, 2, 1, false, false, ScheduleKind::kInterleaved},
                                    {1, 1, 2, 1, 2, false, true, ScheduleKind::kOneFOneB},
                                    {2, 2, 2, 1, 1, true, true, ScheduleKind::kOneFOneB}},
                                   /*bf16=*/true);
}

// --grad-reduce-in-bf16: the bf16 mirror of the gradients (and of each dist-opt slice).
TEST(RuntimeModelTest, Bf16GradientsMemoryMatchesTheCpuRuntimesTrackedPeak) {
  ExpectMemoryMatchesTheCpuRuntime(
      {{1, 1, 1, 1, 1, false, false, ScheduleKind::kOneFOneB, true},
       {1, 2, 1, 1, 2, false, false, ScheduleKind::kOneFOneB, true},
       {1, 1, 2, 1, 2, false, false, ScheduleKind::kOneFOneB, true},
       {1, 1, 2, 1, 2, false, true, ScheduleKind::kOneFOneB, true},
       {2, 2, 2, 1, 1, true, true, ScheduleKind::kOneFOneB, true}},
      /*bf16=*/true);
}

}  // namespace
}  // namespace ptdp
