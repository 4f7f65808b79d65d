// Microbenchmarks of the runtime's primitives; see microbench.h.
#include "runtime/microbench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <utility>

namespace ptdp::rt {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The median (the upper one of an even count).
double Median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + ptrdiff_t(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// Powers of `factor` from `lo` to `hi` (both included when on the progression).
std::vector<double> Geometric(double lo, double hi, double factor) {
  std::vector<double> v;
  for (double x = lo; x <= hi * (1 + 1e-9); x *= factor) v.push_back(x);
  return v;
}

// Pseudo-random values in [-1, 1] (xorshift), the same on every run, so every run measures the
// same data. One stream, grown as needed, that a seed enters at its own offset: filling every
// point's operands from a fresh stream took a quarter of a calibration's time.
// Where a seed's values start in a stream: seeds 1031 values apart.
size_t SeedOffset(uint32_t seed) { return size_t(seed % 64) * 1031; }

class NoiseStream {
 public:
  // n values for `seed`: valid until the next call.
  const float* At(int64_t n, uint32_t seed) {
    const size_t offset = SeedOffset(seed), end = offset + size_t(std::max<int64_t>(n, 0));
    while (v_.size() < end) {
      x_ ^= x_ << 13;
      x_ ^= x_ >> 17;
      x_ ^= x_ << 5;
      v_.push_back(float(x_) / 2147483648.0f - 1.0f);
    }
    return v_.data() + offset;
  }

 private:
  std::vector<float> v_;
  uint32_t x_ = 2654435761u;
};

// N(0, 1) values (Box-Muller over the xorshift stream of NoiseStream), one stream as there.
class NormalStream {
 public:
  // n values for `seed`: valid until the next call.
  const float* At(int64_t n, uint32_t seed) {
    const size_t offset = SeedOffset(seed), end = offset + size_t(std::max<int64_t>(n, 0));
    if (v_.size() < end) {
      const size_t have = v_.size();
      const float* u = uniform_.At(int64_t(2 * end), 0);
      for (size_t i = have; i < end; ++i) {
        const double u1 = 0.5 * (double(u[2 * i]) + 1.0) + 1e-12;
        const double u2 = 0.5 * (double(u[2 * i + 1]) + 1.0);
        v_.push_back(float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2)));
      }
    }
    return v_.data() + offset;
  }

 private:
  NoiseStream uniform_;
  std::vector<float> v_;
};

constexpr int kMaxCallsPerBatch = 1 << 22;

// The labels of the collective benchmarks' two groups, both over the whole world: one for the
// collectives, one for the send/receive (as the trainer's p2p runs on PP groups of its own).
const char* const kGroup = "calibrate";
const char* const kPairGroup = "calibrate p2p";

// Every op reads a different set of operands on each call, as in training, where every call sees
// new data that another op touched last, long before: on the same input over and over the branch
// predictor learns an op's data-dependent branches (libm's tanh in GeLU runs 40% faster on the
// same 16K inputs repeated than on fresh ones), and the operands stay in the nearest cache. A
// training step streams through far more than a core's L2 (gpt-tiny at micro-batch 8: 12 MiB of
// activations against 2 MiB of L2 on the dev VM), so its ops find their operands beyond it; with
// the CPU backend's AVX-512 GEMM a weight gradient took 25% longer in training than on four
// L2-resident variants. So each op cycles through at least kMinVariants sets of its inputs
// (activations, weights, the accumulators it adds to), and through as many as make them add up
// to MicrobenchOptions::cold_bytes. An output that training writes into a fresh buffer (zeroed
// by the Alloc just before, so in cache; the Alloc's table pays the zeroing) is one tensor.
constexpr size_t kMinVariants = 4;
constexpr size_t kMaxVariants = size_t(1) << 20;

double ColdBytes(const MicrobenchOptions& opt) {
  return opt.cold_bytes > 0 ? opt.cold_bytes : ColdBytesOfThisHost();
}

// n tensors of `shape` as views of one buffer of `be` (thousands of small tensors would be
// thousands of allocations), each starting on a 64-byte boundary as the backend's own tensors
// do; `all` receives the buffer: zeroed, or left for the caller to fill at once (`filled`:
// reused memory holds whatever it held, denormals included, which slow a reduction 100x).
Result<std::vector<Tensor>> Slices(Backend& be, const Shape& shape, DType dtype, size_t n,
                                   Tensor* all, bool filled = false) {
  const int64_t per_line = int64_t(64 / DTypeBytes(dtype));
  const int64_t stride = (shape.numel() + per_line - 1) / per_line * per_line;
  const Shape whole({stride * int64_t(n)});
  PTDP_ASSIGN_OR_RETURN(*all, filled ? be.AllocUninit(whole, dtype) : be.Alloc(whole, dtype));
  std::vector<Tensor> v;
  for (size_t i = 0; i < n; ++i) v.push_back(all->View(shape, int64_t(i) * stride));
  return v;
}

class Bench {
 public:
  Bench(const MakeWorld& make_world, const MicrobenchOptions& opt,
        const MicrobenchProgress& progress)
      : make_world_(make_world), opt_(opt), progress_(progress), grids_(GridsFor(opt)) {}

  Result<MeasuredPrimitives> Run();
  const MicrobenchReport& report() const { return report_; }

 private:
  // Seconds of one call of fn: the median batch's mean (see the header).
  double TimeCall(const std::function<void()>& fn);
  // The ops of one sweep over the grids (every table but the collectives').
  Status OpsPass();
  // rows_ after `passes` sweeps: each point's rows (the same leading values) made one, its time
  // the median over the sweeps.
  void MedianOverPasses();
  // Tensors of act_ (activations, weights) unless the dtype says otherwise (fp32 statistics,
  // weight gradients, optimizer state).
  Result<Tensor> Random(const Shape& shape, uint32_t seed) { return Random(shape, seed, act_); }
  Result<Tensor> Random(const Shape& shape, uint32_t seed, DType dtype);
  // How many operand sets of `elements` each (one call's operands, `e` bytes an element; act_'s
  // when 0) an op cycles through: at least kMinVariants, enough to add up to cold_bytes_ (see
  // kMinVariants).
  size_t Variants(double elements, double e = 0) const;
  // n tensors of `shape` with different values (Slices of one buffer): uniform in [-1, 1], or
  // N(0, sigma^2) when sigma > 0.
  Result<std::vector<Tensor>> Randoms(const Shape& shape, uint32_t seed, size_t n,
                                      double sigma = 0) {
    return Randoms(shape, seed, n, sigma, act_);
  }
  Result<std::vector<Tensor>> Randoms(const Shape& shape, uint32_t seed, size_t n, double sigma,
                                      DType dtype);
  // t's values: uniform in [-1, 1], or N(0, sigma^2) when sigma > 0; from the host's streams, or
  // on a device from its pools (MicrobenchOptions::device).
  Status Fill(Tensor& t, uint32_t seed, double sigma);
  void Done(const std::string& what);
  void Add(const char* table, std::vector<double> row) { rows_[table].push_back(std::move(row)); }

  Status Gemms();
  Status Attention();
  Status AttentionBlocks();
  Status RowOps();
  Status ElementOps();
  Status Allocs();
  Status Collectives();
  Status CollectiveRank(int rank, const std::vector<int>& all, BenchWorld& world,
                        std::atomic<int>& decide, std::vector<std::vector<double>>& seconds);
  void AttentionStorage(MeasuredPrimitives* m) const;

  const MakeWorld& make_world_;
  const MicrobenchOptions opt_;
  const DType act_ = opt_.act;
  const double e_ = double(DTypeBytes(act_));  // bytes of an activation element
  bool fused_epilogues_ = false;  // be_->FusesGemmEpilogues(act_), once it exists
  const MicrobenchProgress& progress_;
  const MicrobenchGrids grids_;
  const double cold_bytes_ = ColdBytes(opt_);
  BenchWorld ops_world_;         // the one-rank world whose rank 0 times the ops
  std::unique_ptr<Backend> be_;  // its backend (released before the world)
  // On a device: kDevicePool fp32 values of noise_ and of normal_ there (released before be_).
  Tensor uniform_pool_, normal_pool_;
  std::map<std::string, std::vector<std::vector<double>>> rows_;
  MicrobenchReport report_;
  NoiseStream noise_;    // the operands' values
  NormalStream normal_;  // GeLU's normal inputs
  double done_ = 0, total_ = 1;
  Status failed_;                  // the backend's first failure while timing
  std::vector<int> calls_;         // calls a batch of each timed point (the first sweep's)
  size_t point_ = 0;               // the timed point of this sweep
};

double Bench::TimeCall(const std::function<void()>& fn) {
  // Synchronize() ends each batch: a device backend runs ops asynchronously.
  auto run = [&](int calls) {
    const Clock::time_point t0 = Clock::now();
    for (int i = 0; i < calls; ++i) fn();
    const Status st = be_->Synchronize();
    if (!st.ok() && failed_.ok()) failed_ = st;  // reported when the run ends
    return Since(t0);
  };
  run(1);  // warm-up: caches, first-touch of the buffers
  std::vector<double> means;
  const size_t point = point_++;
  if (point < calls_.size()) {  // a later sweep: the first one's batch size
    const int calls = calls_[point];
    for (int b = 0; b < opt_.batches; ++b) means.push_back(run(calls) / calls);
    return Median(means);
  }
  int calls = 1;
  double elapsed = 0;
  for (;;) {  // the first batch finds how many calls fill min_batch_s
    elapsed = run(calls);
    if (elapsed >= opt_.min_batch_s || calls >= kMaxCallsPerBatch) break;
    calls *= 2;
  }
  calls_.push_back(calls);
  means.push_back(elapsed / calls);
  for (int b = 1; b < opt_.batches; ++b) means.push_back(run(calls) / calls);
  return Median(means);
}

Result<Tensor> Bench::Random(const Shape& shape, uint32_t seed, DType dtype) {
  PTDP_ASSIGN_OR_RETURN(Tensor t, be_->AllocUninit(shape, dtype));
  PTDP_RETURN_IF_ERROR(Fill(t, seed, 0));
  return t;
}

// A device's pools: 4M fp32 values each (16 MiB), copied once from the host's streams.
constexpr int64_t kDevicePool = int64_t(1) << 22;

Status Bench::Fill(Tensor& t, uint32_t seed, double sigma) {
  const bool normal = sigma > 0;
  if (opt_.device) {
    Tensor& pool = normal ? normal_pool_ : uniform_pool_;
    if (!pool.defined()) {
      PTDP_ASSIGN_OR_RETURN(pool, be_->AllocUninit({kDevicePool}, DType::kF32));
      PTDP_RETURN_IF_ERROR(be_->CopyFromHost(
          normal ? normal_.At(kDevicePool, 0) : noise_.At(kDevicePool, 0), pool));
    }
    PTDP_RETURN_IF_ERROR(FillFromPool(*be_, pool, seed, t));
    if (normal) be_->Scale(float(sigma), t);
    return Status::Ok();
  }
  if (!normal) return be_->CopyFromHost(noise_.At(t.numel(), seed), t);
  const float* z = normal_.At(t.numel(), seed);
  std::vector<float> values(size_t(t.numel()));
  for (size_t i = 0; i < values.size(); ++i) values[i] = float(sigma * double(z[i]));
  return be_->CopyFromHost(values.data(), t);
}

size_t Bench::Variants(double elements, double e) const {
  const double bytes = elements * (e > 0 ? e : e_);
  const double n = std::ceil(cold_bytes_ / std::max(bytes, 1.0));
  return size_t(std::clamp(n, double(kMinVariants), double(kMaxVariants)));
}

Result<std::vector<Tensor>> Bench::Randoms(const Shape& shape, uint32_t seed, size_t n,
                                           double sigma, DType dtype) {
  Tensor all;
  PTDP_ASSIGN_OR_RETURN(std::vector<Tensor> v, Slices(*be_, shape, dtype, n, &all, true));
  PTDP_RETURN_IF_ERROR(Fill(all, seed, sigma));
  return v;
}

void Bench::Done(const std::string& what) {
  done_ += 1;
  if (progress_) progress_(std::min(1.0, done_ / total_), what);
}

std::string Dims(std::initializer_list<double> d) {
  std::string s;
  for (double x : d) s += (s.empty() ? "" : "x") + std::to_string(int64_t(x));
  return s;
}

Status Bench::Gemms() {
  const std::vector<double>& g = grids_.gemm_dims;
  for (double m : g)
    for (double n : g)
      for (double k : g) {
        const int64_t M = int64_t(m), N = int64_t(n), K = int64_t(k);
        // The forms as the model calls them: y = x w^T (nt), dx = dy w (nn), dw += dy^T x (tn,
        // beta 1). Every input, the weight and the accumulated dw included, is new each call:
        // between two uses of a layer's weight a step passes the other layers' data. The output
        // of nt and nn is a fresh buffer in training, allocated just before: one here.
        const size_t nv = Variants(m * k + n * k);
        const size_t nv_tn = Variants((m * k + n * k) * e_ + m * n * 4, 1);
        PTDP_ASSIGN_OR_RETURN(auto a_mk, Randoms({M, K}, 1, nv));
        PTDP_ASSIGN_OR_RETURN(auto w_nk, Randoms({N, K}, 2, nv));
        PTDP_ASSIGN_OR_RETURN(auto w_kn, Randoms({K, N}, 3, nv));
        PTDP_ASSIGN_OR_RETURN(Tensor c, Random({M, N}, 5));
        PTDP_ASSIGN_OR_RETURN(auto a_km, Randoms({K, M}, 4, nv_tn));
        PTDP_ASSIGN_OR_RETURN(auto b_kn, Randoms({K, N}, 6, nv_tn));
        PTDP_ASSIGN_OR_RETURN(auto dw, Randoms({M, N}, 7, nv_tn, 0, DType::kF32));  // main_grad
        size_t i = 0;
        Add("gemm_nt", {m, n, k, TimeCall([&] {
              const size_t v = i++ % nv;
              be_->Matmul(a_mk[v], false, w_nk[v], true, c);
            })});
        Add("gemm_nn", {m, n, k, TimeCall([&] {
              const size_t v = i++ % nv;
              be_->Matmul(a_mk[v], false, w_kn[v], false, c);
            })});
        Add("gemm_tn", {m, n, k, TimeCall([&] {
              const size_t v = i++ % nv_tn;
              be_->Matmul(a_km[v], true, b_kn[v], false, dw[v], 1, 1);
            })});
        if (fused_epilogues_) {  // QKV's and FC1's forward, FC2's dgrad as the runtime calls them
          PTDP_ASSIGN_OR_RETURN(Tensor bias, Random({N}, 8));
          PTDP_ASSIGN_OR_RETURN(Tensor act, Random({M, N}, 9));
          PTDP_ASSIGN_OR_RETURN(Tensor pre, Random({M, N}, 10));
          Add("gemm_nt_bias", {m, n, k, TimeCall([&] {
                const size_t v = i++ % nv;
                be_->MatmulBias(a_mk[v], false, w_nk[v], true, bias, c);
              })});
          Add("gemm_nt_bias_gelu", {m, n, k, TimeCall([&] {
                const size_t v = i++ % nv;
                be_->MatmulBiasGelu(a_mk[v], false, w_nk[v], true, bias, c, act);
              })});
          Add("gemm_nn_dgelu", {m, n, k, TimeCall([&] {
                const size_t v = i++ % nv;
                be_->MatmulGeluBackward(a_mk[v], false, w_kn[v], false, pre, c);
              })});
        }
        Done("gemm " + Dims({m, n, k}));
      }
  return Status::Ok();
}

// One (batch, head) of the attention core: measured with the grids' attention_heads heads of
// batch 1 (seq-first, as the model calls it), divided by their number.
Status Bench::Attention() {
  const int64_t heads = grids_.attention_heads;
  for (double s : grids_.attention_s)
    for (double d : grids_.attention_d) {
      const int64_t S = int64_t(s), A = heads * int64_t(d);
      const Shape saved_shape = be_->AttentionSavedShape(1, S, heads, int64_t(d));
      const size_t nv =
          Variants(e_ * double(S) * 4 * A + 4 * double(Shape(saved_shape).numel()), 1);
      PTDP_ASSIGN_OR_RETURN(auto qkv, Randoms({S, 1, 3 * A}, 6, nv));
      PTDP_ASSIGN_OR_RETURN(auto dout, Randoms({S, 1, A}, 8, nv));
      PTDP_ASSIGN_OR_RETURN(Tensor out, Random({S, 1, A}, 7));
      PTDP_ASSIGN_OR_RETURN(Tensor dqkv, Random({S, 1, 3 * A}, 9));
      std::vector<Tensor> saved;
      for (size_t k = 0; k < nv; ++k) {
        PTDP_ASSIGN_OR_RETURN(Tensor t, be_->Alloc(saved_shape, DType::kF32));
        be_->AttentionForward(qkv[k], heads, TokenOrder::kSeqFirst, out, t);
        saved.push_back(std::move(t));
      }
      size_t k = 0;
      const double fwd = TimeCall([&] {
        const size_t i = k++ % nv;
        be_->AttentionForward(qkv[i], heads, TokenOrder::kSeqFirst, out, saved[i]);
      });
      const double bwd = TimeCall([&] {
        const size_t i = k++ % nv;
        be_->AttentionBackward(dout[i], qkv[i], out, saved[i], heads, TokenOrder::kSeqFirst,
                               dqkv);
      });
      Add("attention_forward", {s, d, fwd / heads});
      Add("attention_backward", {s, d, bwd / heads});
      Done("attention s " + Dims({s}) + " d " + Dims({d}));
    }
  return Status::Ok();
}

// The CP ring's attention blocks, one (batch, head) as Attention(): s local rows (two chunks of
// L = s/2) of attention_heads heads, as rank 0 of cp 2 against its own block (positions 0.. and
// 3L..) and as rank 1 (positions L.. and 2L..) against rank 0's, merged into an output (first =
// false).
Status Bench::AttentionBlocks() {
  const int64_t heads = grids_.attention_heads;
  for (double s : grids_.attention_s)
    for (double d : grids_.attention_d) {
      const int64_t S = int64_t(s), A = heads * int64_t(d), L = S / 2;
      const SeqBlock own{0, 3 * L, L}, other_q{L, 2 * L, L};
      const size_t nv = Variants(double(S) * 8 * A);
      const DType f32 = DType::kF32;  // the ring's merged output, lse and gradient accumulators
      PTDP_ASSIGN_OR_RETURN(auto qkv, Randoms({S, 1, 3 * A}, 21, nv));
      PTDP_ASSIGN_OR_RETURN(auto kv, Randoms({S, 1, 2 * A}, 22, nv));
      PTDP_ASSIGN_OR_RETURN(auto dout, Randoms({S, 1, A}, 23, nv));
      PTDP_ASSIGN_OR_RETURN(Tensor merged, Random({S, 1, A}, 24, f32));
      PTDP_ASSIGN_OR_RETURN(Tensor out, Random({S, 1, A}, 24));  // as stored, for the backward
      PTDP_ASSIGN_OR_RETURN(Tensor lse, Random({1, heads, S}, 25, f32));
      PTDP_ASSIGN_OR_RETURN(Tensor dqkv, Random({S, 1, 3 * A}, 26, f32));
      PTDP_ASSIGN_OR_RETURN(Tensor dkv, Random({S, 1, 2 * A}, 27, f32));
      for (int diagonal = 1; diagonal >= 0; --diagonal) {
        const SeqBlock& q = diagonal ? own : other_q;
        // A consistent output and log-sum-exp for the backward: the block merged into the
        // rank's own (the diagonal case: its own only).
        be_->AttentionBlockForward(qkv[0], q, kv[0], diagonal ? own : q, heads, true, merged,
                                   lse);
        if (!diagonal)
          be_->AttentionBlockForward(qkv[0], q, kv[0], own, heads, false, merged, lse);
        be_->Copy(merged, out);
        size_t k = 0;
        PTDP_ASSIGN_OR_RETURN(Tensor out_f, Random({S, 1, A}, 28, f32));
        PTDP_ASSIGN_OR_RETURN(Tensor lse_f, Random({1, heads, S}, 29, f32));
        be_->AttentionBlockForward(qkv[0], q, kv[0], q, heads, true, out_f, lse_f);
        const double fwd = TimeCall([&] {
          const size_t i = k++ % nv;
          be_->AttentionBlockForward(qkv[i], q, kv[i], own, heads, false, out_f, lse_f);
        });
        const double bwd = TimeCall([&] {
          const size_t i = k++ % nv;
          be_->AttentionBlockBackward(dout[i], qkv[i], q, kv[i], own, out, lse, heads, dqkv, dkv);
        });
        Add(diagonal ? "attention_block_diagonal_forward" : "attention_block_forward",
            {s, d, fwd / heads});
        Add(diagonal ? "attention_block_diagonal_backward" : "attention_block_backward",
            {s, d, bwd / heads});
      }
      Done("attention blocks s " + Dims({s}) + " d " + Dims({d}));
    }
  return Status::Ok();
}

Status Bench::RowOps() {
  constexpr int64_t kVocab = 1024;  // embedding table rows
  for (double rows : grids_.row_rows)
    for (double cols : grids_.row_cols) {
      const int64_t N = int64_t(rows), C = int64_t(cols);
      const size_t nv = Variants(3 * rows * cols);
      const DType f32 = DType::kF32;  // LayerNorm statistics, parameter gradients, CE's figures
      PTDP_ASSIGN_OR_RETURN(auto x, Randoms({N, C}, 10, nv));
      PTDP_ASSIGN_OR_RETURN(auto dy, Randoms({N, C}, 11, nv));
      PTDP_ASSIGN_OR_RETURN(Tensor y, Random({N, C}, 11));
      PTDP_ASSIGN_OR_RETURN(auto dx, Randoms({N, C}, 12, nv));
      PTDP_ASSIGN_OR_RETURN(Tensor gamma, Random({C}, 13));
      PTDP_ASSIGN_OR_RETURN(Tensor beta, Random({C}, 14));
      PTDP_ASSIGN_OR_RETURN(Tensor dgamma, Random({C}, 15, f32));
      PTDP_ASSIGN_OR_RETURN(Tensor dbeta, Random({C}, 16, f32));
      PTDP_ASSIGN_OR_RETURN(auto mean, Randoms({N}, 17, nv, 0, f32));
      PTDP_ASSIGN_OR_RETURN(auto rstd, Randoms({N}, 18, nv, 0, f32));
      for (size_t i = 0; i < nv; ++i)  // valid statistics for the backward
        be_->LayerNormForward(x[i], gamma, beta, 1e-5f, y, mean[i], rstd[i]);
      size_t k = 0;
      Add("layernorm_forward", {rows, cols, TimeCall([&] {
            const size_t i = k++ % nv;
            be_->LayerNormForward(x[i], gamma, beta, 1e-5f, y, mean[i], rstd[i]);
          })});
      Add("layernorm_backward", {rows, cols, TimeCall([&] {
            const size_t i = k++ % nv;
            be_->LayerNormBackward(dy[i], x[i], gamma, mean[i], rstd[i], dx[i], dgamma, dbeta);
          })});
      Add("bias_add", {rows, cols, TimeCall([&] { be_->AddBias(dy[k++ % nv], gamma); })});
      Add("bias_grad", {rows, cols, TimeCall([&] { be_->BiasGrad(dy[k++ % nv], dgamma); })});
      // The residual kernels (FC2's output; the projection's into norm2) add into x: they
      // accumulate over the calls, the sums staying far from overflow.
      Add("bias_residual", {rows, cols, TimeCall([&] {
            const size_t i = k++ % nv;
            be_->AddBiasResidual(dx[i], gamma, x[i]);
          })});
      Add("bias_residual_layernorm", {rows, cols, TimeCall([&] {
            const size_t i = k++ % nv;
            be_->AddBiasResidualLayerNorm(dx[i], beta, x[i], gamma, beta, 1e-5f, y, mean[i],
                                          rstd[i]);
          })});
      // Token ids (rows) into a kVocab x cols table; cross entropy over (rows, cols) logits with
      // targets inside the shard.
      std::vector<int32_t> ids(static_cast<size_t>(N));
      for (int64_t i = 0; i < N; ++i) ids[size_t(i)] = int32_t((i * 7919) % kVocab);
      PTDP_ASSIGN_OR_RETURN(Tensor tokens, be_->Alloc({N}, DType::kI32));
      PTDP_RETURN_IF_ERROR(be_->CopyFromHost(ids.data(), tokens));
      PTDP_ASSIGN_OR_RETURN(Tensor table, Random({kVocab, C}, 19));
      PTDP_ASSIGN_OR_RETURN(Tensor dtable, Random({kVocab, C}, 19, f32));
      Add("embedding_forward", {rows, cols, TimeCall([&] {
            be_->EmbeddingForward(tokens, table, 0, y);
          })});
      Add("embedding_backward", {rows, cols, TimeCall([&] {
            be_->EmbeddingBackward(dy[k++ % nv], tokens, 0, dtable);
          })});
      for (int64_t i = 0; i < N; ++i) ids[size_t(i)] = int32_t((i * 7919) % C);
      PTDP_ASSIGN_OR_RETURN(Tensor targets, be_->Alloc({N}, DType::kI32));
      PTDP_RETURN_IF_ERROR(be_->CopyFromHost(ids.data(), targets));
      PTDP_ASSIGN_OR_RETURN(Tensor row_max, Random({N}, 20, f32));
      PTDP_ASSIGN_OR_RETURN(Tensor sum_exp, Random({N}, 21, f32));
      PTDP_ASSIGN_OR_RETURN(Tensor target_logit, Random({N}, 22, f32));
      PTDP_ASSIGN_OR_RETURN(Tensor loss, Random({N}, 23, f32));
      Add("cross_entropy_forward", {rows, cols, TimeCall([&] {
            const Tensor& logits = x[k++ % nv];
            be_->CrossEntropyMax(logits, row_max);
            be_->CrossEntropySumExp(logits, row_max, sum_exp);
            be_->CrossEntropyTarget(logits, targets, 0, target_logit);
            be_->CrossEntropyLoss(row_max, sum_exp, target_logit, loss);
          })});
      Add("cross_entropy_backward", {rows, cols, TimeCall([&] {
            be_->CrossEntropyBackward(x[k++ % nv], targets, 0, row_max, sum_exp,
                                      1.0f / float(N), y);
          })});
      Done("row ops " + Dims({rows, cols}));
    }
  return Status::Ok();
}

Status Bench::ElementOps() {
  for (double e : grids_.elements) {
    const int64_t n = int64_t(e);
    // AdamW reads and writes four tensors, each last touched a step before: they cycle too.
    // Its tensors and the gradient norm's (sum of squares) are fp32, the others act_.
    const DType f32 = DType::kF32;
    const size_t nv = Variants(4 * 4 * e, 1);
    PTDP_ASSIGN_OR_RETURN(auto a, Randoms({n}, 30, nv));
    PTDP_ASSIGN_OR_RETURN(auto b, Randoms({n}, 31, nv));
    PTDP_ASSIGN_OR_RETURN(Tensor c, Random({n}, 32));
    PTDP_ASSIGN_OR_RETURN(auto g, Randoms({n}, 30, nv, 0, f32));
    PTDP_ASSIGN_OR_RETURN(auto p, Randoms({n}, 32, nv, 0, f32));
    PTDP_ASSIGN_OR_RETURN(auto m, Randoms({n}, 33, nv, 0, f32));
    PTDP_ASSIGN_OR_RETURN(auto v, Randoms({n}, 34, nv, 0, f32));
    PTDP_ASSIGN_OR_RETURN(Tensor one, Random({1}, 35, f32));
    for (Tensor& t : v) be_->Fill(0.01f, t);  // AdamW's second moment must be non-negative
    size_t k = 0;
    for (double sigma : grids_.gelu_sigma) {
      PTDP_ASSIGN_OR_RETURN(auto x, Randoms({n}, 36, nv, sigma));
      Add("gelu_forward", {e, sigma, TimeCall([&] { be_->GeluForward(x[k++ % nv], c); })});
      Add("gelu_backward", {e, sigma, TimeCall([&] {
            const size_t i = k++ % nv;
            be_->GeluBackward(b[i], x[i], c);
          })});
    }
    Add("add", {e, TimeCall([&] {
          const size_t i = k++ % nv;
          be_->Add(a[i], b[i], c);
        })});
    Add("copy", {e, TimeCall([&] { be_->Copy(a[k++ % nv], c); })});
    Add("scale", {e, TimeCall([&] { be_->Scale(1.0f, c); })});
    Add("fill", {e, TimeCall([&] { be_->Fill(0.0f, c); })});
    Add("sum_squares", {e, TimeCall([&] { be_->SumSquares(g[k++ % nv], one); })});
    AdamWConfig cfg;
    cfg.lr = 1e-6f;
    Add("adamw", {e, TimeCall([&] {
          const size_t i = k++ % nv;
          be_->AdamW(p[i], g[i], m[i], v[i], cfg);
        })});
    Done("element-wise " + Dims({e}));
  }
  return Status::Ok();
}

Status Bench::Allocs() {
  for (double bytes : grids_.alloc_bytes) {
    const int64_t n = std::max<int64_t>(1, int64_t(bytes) / 4);
    // A training step's allocations get back blocks freed before (the backend's cache): each
    // call here replaces the oldest of nv live tensors. Uninitialised, as the runtime allocates
    // what an op then overwrites (GptChunk::Out); the few tensors it zeroes pay the fill table
    // on top (core/layer_ops.cc, AllocZeroed). Timing the zeroed Alloc charged a memset of
    // blocks last touched nv calls ago to every output: 13 us for 128 KiB on the dev VM, or
    // page faults (16 ms for 8 MiB) when the cache had no room, where the runtime pays ~0.5 us.
    const size_t nv = std::min<size_t>(Variants(bytes, 1), 4096);
    std::vector<Tensor> live(nv);
    size_t k = 0;
    Status failed;
    const double s = TimeCall([&] {
      Tensor& slot = live[k++ % nv];
      slot = Tensor();
      auto t = be_->AllocUninit({n}, DType::kF32);
      if (!t.ok()) failed = t.status();
      else slot = std::move(*t);
    });
    PTDP_RETURN_IF_ERROR(failed);
    Add("alloc", {bytes, s});
    Done("alloc " + Dims({bytes}) + " B");
  }
  return Status::Ok();
}

// One rank of the collective benchmarks: every collective over every size, with the group's
// ranks agreeing on the number of calls per batch (rank 0 decides, a barrier publishes it).
// seconds[kind][size] is filled by rank 0. `all`: the world's ranks, 0..ranks-1.
Status Bench::CollectiveRank(int rank, const std::vector<int>& all, BenchWorld& world,
                             std::atomic<int>& decide, std::vector<std::vector<double>>& seconds) {
  const int ranks = int(all.size());
  // Measured once (not in each sweep): as many batches of a size as an op gets over the sweeps.
  const int comm_batches = opt_.batches * opt_.passes;
  std::unique_ptr<Backend> be = world.backends(rank);
  if (!be) return Status::Error("the world gave no backend");
  PTDP_ASSIGN_OR_RETURN(auto comm, world.comms->Group(rank, all, kGroup));
  PTDP_ASSIGN_OR_RETURN(auto pair, world.comms->Group(rank, all, kPairGroup));
  Communicator& c = *comm;
  const std::vector<double>& sizes = grids_.comm_bytes;
  for (size_t kind = 0; kind < seconds.size(); ++kind) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (kind == 3 && ranks != 2) break;  // send/recv: between two ranks
      // Elements: bytes / 4, a multiple of the ranks (the grids' sizes are multiples of 32 B).
      const int64_t n = std::max<int64_t>(ranks, int64_t(sizes[i]) / 4 / ranks * ranks);
      // New buffers each call, as in training (kMinVariants): an activation or a gradient the
      // backward wrote a while before, not the one the last call left in every cache. Every
      // rank cycles in step (the same count on each: it depends on n only).
      const size_t nv = Variants(4.0 * double(n + n / ranks), 1);
      Tensor full_buf, part_buf, recv_buf;
      PTDP_ASSIGN_OR_RETURN(auto full, Slices(*be, {n}, DType::kF32, nv, &full_buf));
      PTDP_ASSIGN_OR_RETURN(auto part, Slices(*be, {n / ranks}, DType::kF32, nv, &part_buf));
      size_t v = 0;
      std::function<Status()> call;
      if (kind == 0) call = [&] { return c.AllReduce(full[v++ % nv], ReduceOp::kSum); };
      if (kind == 1) call = [&] { const size_t i = v++ % nv; return c.AllGather(part[i], full[i]); };
      if (kind == 2)
        call = [&] {
          const size_t i = v++ % nv;
          return c.ReduceScatter(full[i], part[i], ReduceOp::kSum);
        };
      if (kind == 3)
        call = [&] {
          Tensor& f = full[v++ % nv];
          PTDP_RETURN_IF_ERROR(pair->GroupStart());
          PTDP_RETURN_IF_ERROR(rank == 0 ? pair->Send(f, 1) : pair->Recv(f, 0));
          return pair->GroupEnd();
        };
      std::vector<Tensor> recv;
      // The all-to-all sends what its rank has just written, as the MoE dispatch sends the rows
      // it gathered the moment before (the peers then read lines from another core's cache:
      // 44 us against 31 us for 128 KiB between two threads here); the writing is timed alone
      // too and taken off (`write_only`).
      bool write_only = false;
      if (kind == 5) {  // equal blocks of n / ranks to every rank (its own included)
        PTDP_ASSIGN_OR_RETURN(recv, Slices(*be, {n}, DType::kF32, nv, &recv_buf));
        const std::vector<int64_t> blocks(size_t(ranks), n / ranks);
        call = [&, blocks] {
          const size_t i = v++ % nv;
          be->Fill(float(v), full[i]);
          if (write_only) return Status::Ok();
          return c.AllToAll(full[i], blocks, recv[i], blocks);
        };
      }
      if (kind == 4) {
        PTDP_ASSIGN_OR_RETURN(recv, Slices(*be, {n}, DType::kF32, nv, &recv_buf));
        call = [&] {  // the CP ring's step: to the next rank, from the previous one
          const size_t i = v++ % nv;
          PTDP_RETURN_IF_ERROR(pair->GroupStart());
          PTDP_RETURN_IF_ERROR(pair->Send(full[i], (rank + 1) % ranks));
          PTDP_RETURN_IF_ERROR(pair->Recv(recv[i], (rank + ranks - 1) % ranks));
          return pair->GroupEnd();
        };
      }
      PTDP_RETURN_IF_ERROR(call());  // warm-up
      auto batch = [&](int calls, double* elapsed) -> Status {
        PTDP_RETURN_IF_ERROR(c.Barrier());
        const Clock::time_point t0 = Clock::now();
        for (int k = 0; k < calls; ++k) PTDP_RETURN_IF_ERROR(call());
        PTDP_RETURN_IF_ERROR(be->Synchronize());
        PTDP_RETURN_IF_ERROR(c.Barrier());
        *elapsed = Since(t0);
        return Status::Ok();
      };
      int calls = 1;
      double elapsed = 0;
      for (;;) {
        PTDP_RETURN_IF_ERROR(batch(calls, &elapsed));
        if (rank == 0) decide = elapsed >= opt_.min_batch_s || calls >= (1 << 16) ? 1 : 0;
        PTDP_RETURN_IF_ERROR(c.Barrier());
        if (decide.load()) break;
        calls *= 2;
      }
      std::vector<double> means = {elapsed / calls};
      for (int b = 1; b < comm_batches; ++b) {
        PTDP_RETURN_IF_ERROR(batch(calls, &elapsed));
        means.push_back(elapsed / calls);
      }
      double written = 0;  // the writes' share (kind 5), measured the same way
      if (kind == 5) {
        write_only = true;
        std::vector<double> w;
        for (int b = 0; b < comm_batches; ++b) {
          PTDP_RETURN_IF_ERROR(batch(calls, &elapsed));
          w.push_back(elapsed / calls);
        }
        write_only = false;
        written = Median(w);
      }
      if (rank == 0) seconds[kind][i] = std::max(Median(means) - written, 1e-9);
      PTDP_RETURN_IF_ERROR(c.Barrier());  // rank 0's write before the next size's decision
    }
  }
  return Status::Ok();
}

Status Bench::Collectives() {
  static const char* const kNames[] = {"all_reduce", "all_gather", "reduce_scatter", "send_recv",
                                       "ring_exchange", "all_to_all"};
  constexpr size_t kKinds = std::size(kNames);
  const std::vector<double>& sizes = grids_.comm_bytes;
  for (double r : grids_.comm_ranks) {
    const int ranks = int(r);
    const std::string where = "collectives over " + std::to_string(ranks) + " ranks";
    auto made = make_world_(ranks);
    if (!made.ok()) return made.status().Prefixed(where);
    BenchWorld& world = *made;
    if (!world.comms || !world.backends) return Status::Error(where + ": the world is incomplete");
    std::vector<int> all(static_cast<size_t>(ranks));
    for (int k = 0; k < ranks; ++k) all[size_t(k)] = k;
    // NCCL makes its groups collectively, here, before the rank threads ask for them.
    PTDP_RETURN_IF_ERROR(world.comms->Prepare({{kGroup, {all}}, {kPairGroup, {all}}}).Prefixed(where));
    std::atomic<int> decide{0};
    std::vector<std::vector<double>> seconds(kKinds, std::vector<double>(sizes.size(), 0.0));
    std::vector<Status> status(static_cast<size_t>(ranks));
    std::vector<std::thread> threads;
    for (int k = 0; k < ranks; ++k)
      threads.emplace_back([&, k] {
        status[size_t(k)] = CollectiveRank(k, all, world, decide, seconds);
      });
    for (std::thread& t : threads) t.join();
    for (int k = 0; k < ranks; ++k)
      if (!status[size_t(k)].ok())
        return status[size_t(k)].Prefixed(where + ", rank " + std::to_string(k));
    for (size_t kind = 0; kind < kKinds; ++kind)
      for (size_t i = 0; i < sizes.size(); ++i) {
        if (kind == 3) {
          if (ranks == 2) Add(kNames[kind], {sizes[i], seconds[kind][i]});
          continue;
        }
        Add(kNames[kind], {r, sizes[i], seconds[kind][i]});
      }
    for (size_t i = 0; i < kKinds; ++i) Done(where);
  }
  return Status::Ok();
}

// Elements saved per (batch, head) = per_score s^2 + per_token s, from two sequence lengths, at
// head dimension 64 (GPT-2, GPT-3 small): the CUDA backend's flash kernels keep per_token 1 for
// d <= 128, its unfused path (larger heads, fp32 GEMMs) per_score 1 as the CPU.
void Bench::AttentionStorage(MeasuredPrimitives* m) const {
  constexpr int64_t kHeadDim = 64;
  const double f16 = double(be_->AttentionSavedShape(1, 16, 1, kHeadDim).numel());
  const double f32 = double(be_->AttentionSavedShape(1, 32, 1, kHeadDim).numel());
  m->attention_saved_per_score = (f32 / 32 - f16 / 16) / 16;
  m->attention_saved_per_token = f16 / 16 - 16 * m->attention_saved_per_score;
}

Status Bench::OpsPass() {
  PTDP_RETURN_IF_ERROR(Gemms().Prefixed("GEMMs"));
  PTDP_RETURN_IF_ERROR(Attention().Prefixed("attention"));
  PTDP_RETURN_IF_ERROR(AttentionBlocks().Prefixed("attention blocks"));
  PTDP_RETURN_IF_ERROR(RowOps().Prefixed("row-wise ops"));
  PTDP_RETURN_IF_ERROR(ElementOps().Prefixed("element-wise ops"));
  return Allocs().Prefixed("allocation");
}

void Bench::MedianOverPasses() {
  if (opt_.passes <= 1) return;
  std::vector<double> log_ratio(size_t(opt_.passes), 0.0);  // per sweep, over the op points
  double points = 0;
  for (auto& [name, rows] : rows_) {
    std::map<std::vector<double>, size_t> index;  // a point's leading values -> merged row
    std::vector<std::vector<double>> merged, times;  // times[k]: point k's time in each sweep
    for (const std::vector<double>& row : rows) {
      const auto [it, first] =
          index.emplace(std::vector<double>(row.begin(), row.end() - 1), merged.size());
      if (first) merged.push_back(row), times.emplace_back();  // the table's order
      times[it->second].push_back(row.back());
    }
    for (size_t k = 0; k < merged.size(); ++k) {
      const std::vector<double>& t = times[k];
      const double median = merged[k].back() = Median(t);
      if (t.size() != size_t(opt_.passes) || !(median > 0)) continue;  // a collective's
      for (size_t s = 0; s < t.size(); ++s)
        log_ratio[s] += std::log(std::max(t[s], 1e-15) / median);
      points += 1;
    }
    rows = std::move(merged);
  }
  if (points > 0)
    for (double l : log_ratio) report_.sweep_time.push_back(std::exp(l / points));
}

Result<MeasuredPrimitives> Bench::Run() {
  auto ops = make_world_(1);
  if (!ops.ok()) return ops.status();
  ops_world_ = std::move(*ops);
  if (ops_world_.backends) be_ = ops_world_.backends(0);
  if (!be_) return Status::Error("the one-rank world gave no backend");
  fused_epilogues_ = be_->FusesGemmEpilogues(act_);
  const MicrobenchGrids& g = grids_;
  const double gd = double(g.gemm_dims.size());
  const double per_pass = gd * gd * gd + double(g.attention_s.size() * g.attention_d.size()) +
                     double(g.row_rows.size() * g.row_cols.size()) + double(g.elements.size()) +
                     double(g.alloc_bytes.size()) +
                     double(g.attention_s.size() * g.attention_d.size());
  total_ = per_pass * opt_.passes + (opt_.ops_only ? 0.0 : 6.0 * double(g.comm_ranks.size()));
  for (int pass = 0; pass < opt_.passes; ++pass) {
    point_ = 0;
    PTDP_RETURN_IF_ERROR(OpsPass());
    // The collectives once, between the first sweep and the others (a spell of the host that
    // slows them then is not also in the ops' median).
    if (pass == 0 && !opt_.ops_only) PTDP_RETURN_IF_ERROR(Collectives());
  }
  MedianOverPasses();
  PTDP_RETURN_IF_ERROR(be_->Synchronize().Prefixed("the backend"));
  PTDP_RETURN_IF_ERROR(failed_.Prefixed("the backend"));
  MeasuredPrimitives m;
  m.element_bytes = e_;
  AttentionStorage(&m);
  for (const TableKind& kind : MeasuredTableKinds()) {
    // A collective's (ops only), or a fused call the backend does not have.
    if ((opt_.ops_only || kind.optional) && rows_[kind.name].empty()) continue;
    PTDP_ASSIGN_OR_RETURN(m.tables[kind.name],
                          MeasuredTable::FromRows(rows_[kind.name], kind.Exponents(), kind.name));
  }
  return m;
}

}  // namespace

double ColdBytesOfThisHost() {
  constexpr double kFloor = 8.0 * (1 << 20);
  double l2 = 0;
  for (int i = 0; i < 8; ++i) {  // cpu0's caches: index0..3 are L1d, L1i, L2, L3 on x86
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream level(dir + "level"), size(dir + "size");
    int lv = 0;
    std::string text;
    if (!(level >> lv) || !(size >> text) || lv != 2 || text.empty()) continue;
    const char unit = text.back();
    const double v = std::atof(text.c_str());
    l2 = std::max(l2, unit == 'K' ? v * 1024 : unit == 'M' ? v * 1024 * 1024 : v);
  }
  return std::max(kFloor, 4 * l2);
}

// A GPU's attention calls: 64 heads x s/64 query tiles of the flash kernels fill an H100's 132
// SMs from s 256 (GPT-2 medium at micro-batch 8 runs 128 (batch, head)s a layer).
constexpr int kDeviceAttentionHeads = 64;

// Each axis of a grid: the powers of `factor` from lo to hi.
struct Axis {
  double lo, hi, factor;
};
// A kind of grid; the collectives' ranks run from 2 to max_ranks (the machine's, if fewer).
struct GridSpec {
  Axis gemm, attention_s, attention_d, rows, cols, elements, alloc, comm_bytes;
  double max_ranks;
};
// The CPU's (one core reaches its rate from a few hundred) and a GPU's: up to a training step's
// sizes (GPT-2 medium at micro-batch 8: GEMMs of 8192 tokens, attention over s 1024 of 128
// (batch, head)s, (8192, 50304) logits), where its efficiency levels off, so that what lies
// beyond scales as the axes' exponents say; each grid's largest operands stay at a few GiB of
// device memory.
// Each spec: gemm, attention s, attention d, rows; cols, elements, alloc, comm bytes; max ranks.
constexpr GridSpec kCpuQuick{{16, 512, 2}, {16, 256, 2}, {16, 64, 2}, {16, 1024, 4},
                             {16, 256, 4}, {64, 2097152, 8}, {256, 8388608, 8}, {32, 2097152, 16},
                             4};
constexpr GridSpec kCpuFull{{16, 1024, 2}, {16, 1024, 2}, {16, 128, 2}, {16, 4096, 4},
                            {16, 1024, 4}, {64, 4194304, 4}, {256, 16777216, 4}, {32, 8388608, 4},
                            8};
constexpr GridSpec kDeviceQuick{{64, 8192, 2}, {128, 4096, 2}, {64, 128, 2}, {256, 16384, 4},
                                {64, 16384, 4}, {1024, 33554432, 8}, {256, 536870912, 8},
                                {32, 67108864, 8}, 4};
constexpr GridSpec kDeviceFull{{32, 16384, 2}, {64, 16384, 2}, {32, 128, 2}, {64, 16384, 4},
                               {16, 16384, 4}, {256, 134217728, 4}, {256, 1073741824, 4},
                               {32, 268435456, 4}, 8};

MicrobenchGrids GridsFor(const MicrobenchOptions& opt) {
  if (opt.grids) return *opt.grids;
  const GridSpec& k = opt.device ? (opt.quick ? kDeviceQuick : kDeviceFull)
                                 : (opt.quick ? kCpuQuick : kCpuFull);
  auto axis = [](const Axis& a) { return Geometric(a.lo, a.hi, a.factor); };
  MicrobenchGrids g;
  g.gemm_dims = axis(k.gemm);
  g.attention_s = axis(k.attention_s);
  g.attention_d = axis(k.attention_d);
  if (opt.device) g.attention_heads = kDeviceAttentionHeads;
  g.row_rows = axis(k.rows);
  g.row_cols = axis(k.cols);
  g.elements = axis(k.elements);
  g.gelu_sigma = Geometric(0.0625, 4, 4);
  g.alloc_bytes = axis(k.alloc);
  g.comm_ranks = Geometric(2, std::min(k.max_ranks, double(std::max(2, opt.max_ranks))), 2);
  g.comm_bytes = axis(k.comm_bytes);
  return g;
}

MicrobenchGrids SpeedProbeGrids(bool device) {
  MicrobenchGrids g;
  g.gelu_sigma = {0.25};
  g.alloc_bytes = {1048576};
  // A device's points lie on its quick and full grids, the GPU filled as there.
  if (device) g.attention_heads = kDeviceAttentionHeads;
  g.gemm_dims = device ? std::vector<double>{256, 2048} : std::vector<double>{64, 256};
  g.attention_s = {device ? 1024.0 : 128.0};
  g.attention_d = {device ? 64.0 : 32.0};
  g.row_rows = {device ? 1024.0 : 256.0};
  g.row_cols = {device ? 1024.0 : 64.0};
  g.elements = {device ? 4194304.0 : 262144.0};
  return g;
}

Status FillFromPool(Backend& be, const Tensor& pool, uint32_t seed, Tensor& t) {
  const int64_t p = pool.numel(), n = t.numel();
  if (p < 1 || pool.dtype() != DType::kF32)
    return Status::Error("FillFromPool: the pool must hold fp32 values");
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16)
    return Status::Error("FillFromPool: fills fp32 or bf16 tensors");
  const Tensor flat = t.View({n});
  for (int64_t off = 0, piece = 0; off < n; off += p, ++piece) {
    const int64_t len = std::min(p, n - off);
    const size_t start = (SeedOffset(seed) + size_t(piece) * 7919) % size_t(p - len + 1);
    Tensor dst = flat.View({len}, off);
    be.Copy(pool.View({len}, int64_t(start)), dst);
  }
  return Status::Ok();
}

double MicrobenchReport::Drift() const {
  if (sweep_time.size() < 2) return 0;
  const auto [lo, hi] = std::minmax_element(sweep_time.begin(), sweep_time.end());
  return *hi / *lo - 1;
}

Result<MeasuredPrimitives> RunMicrobenchmarks(const MakeWorld& make_world,
                                              const MicrobenchOptions& opt,
                                              const MicrobenchProgress& progress,
                                              MicrobenchReport* report) {
  if (opt.batches < 1 || opt.passes < 1 || !(opt.min_batch_s > 0))
    return Status::Error(
        "microbenchmarks: batches and passes must be >= 1 and min_batch_s > 0");
  Bench bench(make_world, opt, progress);
  auto m = bench.Run();
  if (report) *report = bench.report();
  return m;
}

}  // namespace ptdp::rt
