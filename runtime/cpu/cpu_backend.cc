// The CPU Backend: the GEMMs, GeLU and AdamW through the kernel level it was given
// (runtime/cpu/cpu_kernels.h), plain loops for the rest. Letters as in runtime/backend.h.
// Reductions over a row accumulate in double (cheap next to the GEMMs, and it keeps layouts that
// split a row differently within fp32 rounding of each other).
#include "runtime/cpu/cpu_backend.h"

#include "runtime/bf16.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>

namespace ptdp::rt {
namespace {

constexpr size_t kAlignBytes = 64;

// The block size the allocator's cache keys on: small blocks (up to 4 KiB) exactly, larger ones
// rounded up to 1, 1.25, 1.5 or 1.75 times a power of two, so that tensors whose size changes a
// little from step to step (MoE's rows per expert) reuse cached blocks instead of new pages
// (at most 25% of a block unused; the tracked bytes are the tensor's own).
// CpuBackendOptions::cache_bytes: a cached block serves an Alloc up to this many times its size.
constexpr size_t kMaxReuseWaste = 2;

size_t SizeClass(size_t bytes) {
  if (bytes <= 4096) return bytes;
  size_t p = 4096;
  while (p * 2 <= bytes) p *= 2;
  for (size_t quarter = 0; quarter <= 4; ++quarter) {
    const size_t c = p + p / 4 * quarter;
    if (c >= bytes) return c;
  }
  return 2 * p;
}

// op(X) of a row-major (rows, cols) matrix as GEMM strides: element (i, p) at i * rs + p * cs.
struct Strides {
  int64_t rs, cs;
};
Strides Op(int64_t cols, bool trans) { return trans ? Strides{1, cols} : Strides{cols, 1}; }

// Where one head's rows of a (b, s, W) or (s, b, W) activation start and how far apart they lie.
struct RowLayout {
  int64_t base;    // floats from the start to row t = 0 of batch bi
  int64_t stride;  // floats between rows t and t + 1
};
RowLayout HeadRows(TokenOrder order, int64_t bi, int64_t b, int64_t s, int64_t width) {
  if (order == TokenOrder::kBatchFirst) return {bi * s * width, width};
  return {bi * width, b * width};
}

// sum over i < n of term(i) in double, as four interleaved partial sums (i mod 4) added in a
// fixed order at the end: the same bits every run, and four chains of dependent adds instead of
// one (a double add waits ~4 cycles for the previous one; LayerNorm's and the gradient norm's
// reductions were latency-bound).
template <typename Term>
double SumInDouble(int64_t n, Term term) {
  double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += term(i);
    s1 += term(i + 1);
    s2 += term(i + 2);
    s3 += term(i + 3);
  }
  for (; i < n; ++i) s0 += term(i);
  return (s0 + s1) + (s2 + s3);
}

// C (m, n) at c, rows ldc apart, = op(A) op(B) (beta 0) for one head's blocks.
GemmArgs HeadGemm(int64_t m, int64_t n, int64_t k, const float* a, Strides sa, const float* b,
                  Strides sb, float* c, int64_t ldc, Triangle a_tri, bool c_lower) {
  GemmArgs g;
  g.m = m, g.n = n, g.k = k;
  g.a = a, g.a_rs = sa.rs, g.a_cs = sa.cs;
  g.b = b, g.b_rs = sb.rs, g.b_cs = sb.cs;
  g.c = c, g.ldc = ldc;
  g.a_tri = a_tri, g.c_lower = c_lower;
  return g;
}

// (b, s) of a rank-3 activation in `order`.
void BatchSeq(const Tensor& t, TokenOrder order, int64_t* b, int64_t* s) {
  assert(t.shape().rank() == 3);
  *b = order == TokenOrder::kBatchFirst ? t.shape()[0] : t.shape()[1];
  *s = order == TokenOrder::kBatchFirst ? t.shape()[1] : t.shape()[0];
}

}  // namespace

// ---- bf16 tensors: fp32 kernels on widened copies ---------------------------------------------

// One argument of an op run by Widened: tensors become their fp32 copies (written back into a
// bf16 tensor after the op when the op may write them: a non-const Tensor&); anything else
// passes as it is.
template <typename T>
struct WideArg {
  T v;
  WideArg(T x, CpuBackend&) : v(x) {}
  T get() { return v; }
  void Narrow(CpuBackend&) {}
};
template <>
struct WideArg<const Tensor&> {
  Tensor w;
  WideArg(const Tensor& t, CpuBackend& be) : w(be.Widen(t)) {}
  const Tensor& get() { return w; }
  void Narrow(CpuBackend&) {}
};
template <>
struct WideArg<Tensor&> {
  Tensor* original;
  Tensor w;
  WideArg(Tensor& t, CpuBackend& be) : original(&t), w(be.Widen(t)) {}
  Tensor& get() { return w; }
  void Narrow(CpuBackend& be) {
    if (original->defined() && original->dtype() == DType::kBF16) be.Copy(w, *original);
  }
};

namespace {
bool IsBf16(const Tensor& t) { return t.defined() && t.dtype() == DType::kBF16; }
// backend.h's dtype rules, asserted here because widening would take any mix: a model that runs
// on the CPU then runs on CUDA, whose kernels take one storage type per call.
template <typename... T>
bool SameDType(const Tensor& a, const T&... rest) {
  return ((rest.dtype() == a.dtype()) && ...);
}
template <typename... T>
bool AllF32(const T&... t) {
  return ((t.dtype() == DType::kF32) && ...);
}
template <typename T>
bool IsBf16(const T&) {
  return false;
}
}  // namespace

Tensor CpuBackend::Widen(const Tensor& t) {
  if (!IsBf16(t)) return t;
  if (wide_used_ == wide_.size()) wide_.emplace_back();
  std::vector<float>& w = wide_[wide_used_++];
  if (w.size() < size_t(t.numel())) w.resize(size_t(t.numel()));
  Tensor out(std::make_shared<Buffer>(w.data(), size_t(t.numel()) * sizeof(float), nullptr),
             t.shape(), DType::kF32);
  Copy(t, out);
  return out;
}

template <typename... P, typename... A>
bool CpuBackend::Widened(void (CpuBackend::*op)(P...), A&&... args) {
  if (!(IsBf16(args) || ...)) return false;
  wide_used_ = 0;
  std::tuple<WideArg<P>...> w(WideArg<P>(std::forward<A>(args), *this)...);
  std::apply([this, op](auto&... x) { (this->*op)(x.get()...); }, w);
  std::apply([this](auto&... x) { (x.Narrow(*this), ...); }, w);
  return true;
}

// ---- memory ---------------------------------------------------------------------------------

CpuBackend::CpuBackend(CpuBackendOptions options)
    : options_(options),
      kernels_(options.kernels != nullptr ? options.kernels : ChosenCpuKernels().kernels),
      counters_(std::make_shared<Counters>()) {
  assert(CpuSupports(kernels_->level));
}

Result<Tensor> CpuBackend::Allocate(const Shape& shape, DType dtype, bool zero) {
  for (int64_t d : shape.dims) {
    if (d < 0) return Status::Error("Alloc: negative dimension in shape " + shape.ToString());
  }
  const size_t bytes = size_t(shape.numel()) * DTypeBytes(dtype);
  const std::string what = std::string("Alloc ") + shape.ToString() + " " + ToString(dtype);
  const size_t now = counters_->current.fetch_add(bytes) + bytes;
  if (options_.capacity_bytes != 0 && now > options_.capacity_bytes) {
    counters_->current.fetch_sub(bytes);
    return Status::Error(what + ": " + std::to_string(bytes) + " bytes do not fit (" +
                         std::to_string(now - bytes) + " in use of a " +
                         std::to_string(options_.capacity_bytes) + "-byte capacity)");
  }
  const size_t aligned =
      std::max(kAlignBytes, (bytes + kAlignBytes - 1) / kAlignBytes * kAlignBytes);
  size_t rounded = SizeClass(aligned);
  void* data = nullptr;
  {
    std::lock_guard<std::mutex> lk(counters_->mu);
    // The smallest cached block that holds it, wasting at most as much again.
    auto it = counters_->cache.lower_bound(rounded);
    if (it != counters_->cache.end() && it->first <= kMaxReuseWaste * rounded) {
      data = it->second.back();
      it->second.pop_back();
      rounded = it->first;
      counters_->cached -= rounded;
      if (it->second.empty()) counters_->cache.erase(it);
    }
  }
  if (data == nullptr) data = std::aligned_alloc(kAlignBytes, rounded);
  if (data == nullptr) {  // out of host memory: give the cached blocks back and try once more
    {
      std::lock_guard<std::mutex> lk(counters_->mu);
      counters_->FreeCache();
    }
    data = std::aligned_alloc(kAlignBytes, rounded);
  }
  if (data == nullptr) {
    counters_->current.fetch_sub(bytes);
    return Status::Error(what + ": out of host memory for " + std::to_string(bytes) + " bytes");
  }
  if (zero) {
    std::memset(data, 0, aligned);
  } else if (options_.poison_uninit) {  // a quiet NaN as float (both halves as bf16), a huge id
    const uint32_t nan_bits = dtype == DType::kBF16 ? 0x7fc07fc0u : 0x7fc00000u;  // as i32
    uint32_t* w = static_cast<uint32_t*>(data);
    std::fill(w, w + aligned / sizeof(uint32_t), nan_bits);
  }
  size_t peak = counters_->peak.load();
  while (now > peak && !counters_->peak.compare_exchange_weak(peak, now)) {
  }
  std::shared_ptr<Counters> counters = counters_;
  const size_t limit = options_.cache_bytes;
  // A full cache makes room for the block just freed: the blocks of the largest sizes go back
  // to malloc first, the oldest of a size first. The newest blocks are the ones the next Allocs
  // ask for (a step repeats the last one's sizes); keeping the old ones instead sent every later
  // size to fresh pages, page faults and all, once other sizes had filled the cache.
  auto release = [counters, rounded, limit](void* p, size_t n) {
    counters->current.fetch_sub(n);
    if (rounded > limit) return std::free(p);
    std::vector<void*> evicted;
    {
      std::lock_guard<std::mutex> lk(counters->mu);
      while (counters->cached + rounded > limit) {
        auto largest = std::prev(counters->cache.end());
        std::vector<void*>& blocks = largest->second;
        evicted.push_back(blocks.front());
        blocks.erase(blocks.begin());
        counters->cached -= largest->first;
        if (blocks.empty()) counters->cache.erase(largest);
      }
      counters->cache[rounded].push_back(p);
      counters->cached += rounded;
    }
    for (void* q : evicted) std::free(q);
  };
  return Tensor(std::make_shared<Buffer>(data, bytes, release), shape, dtype);
}

void CpuBackend::Counters::FreeCache() {
  for (auto& [size, blocks] : cache)
    for (void* p : blocks) std::free(p);
  cache.clear();
  cached = 0;
}

CpuBackend::Counters::~Counters() { FreeCache(); }

size_t CpuBackend::CurrentBytes() const { return counters_->current.load(); }
size_t CpuBackend::PeakBytes() const { return counters_->peak.load(); }
void CpuBackend::ResetPeak() { counters_->peak.store(counters_->current.load()); }

// ---- host transfer --------------------------------------------------------------------------

Status CpuBackend::CopyFromHost(const float* src, Tensor& dst) {
  if (dst.dtype() == DType::kBF16) {
    Bf16BitsOf(src, dst.data_as<uint16_t>(), dst.numel());
    return Status::Ok();
  }
  std::memcpy(MutF32(dst), src, dst.bytes());
  return Status::Ok();
}

Status CpuBackend::CopyFromHost(const int32_t* src, Tensor& dst) {
  assert(dst.dtype() == DType::kI32);
  std::memcpy(dst.data(), src, dst.bytes());
  return Status::Ok();
}

Status CpuBackend::CopyToHost(const Tensor& src, float* dst) {
  if (src.dtype() == DType::kBF16) {
    FloatsOfBf16(src.data_as<const uint16_t>(), dst, src.numel());
    return Status::Ok();
  }
  std::memcpy(dst, F32(src), src.bytes());
  return Status::Ok();
}

Status CpuBackend::CopyToHost(const Tensor& src, int32_t* dst) {
  std::memcpy(dst, I32(src), src.bytes());
  return Status::Ok();
}

// ---- GEMM -----------------------------------------------------------------------------------

void CpuBackend::Gemm(const GemmArgs& g) {
  const size_t floats = kernels_->gemm_pack_floats(g.m, g.n, g.k) + kAlignBytes / sizeof(float);
  if (pack_.size() < floats) pack_.resize(floats);
  const uintptr_t at = reinterpret_cast<uintptr_t>(pack_.data());
  const uintptr_t aligned = (at + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
  kernels_->gemm(g, pack_.data() + (aligned - at) / sizeof(float));
}

// c (M, P) = alpha op(a) op(b) + beta c, with a stored (ar, ac) and b stored (br, bc).
void CpuBackend::Matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
                        float alpha, float beta) {
  assert(a.dtype() == b.dtype() && (AllF32(c) || SameDType(a, c)));
  if (Widened(&CpuBackend::Matmul, a, trans_a, b, trans_b, c, alpha, beta)) return;
  assert(Rows(c) == (trans_a ? Cols(a) : Rows(a)) && Cols(c) == (trans_b ? Rows(b) : Cols(b)));
  assert((trans_a ? Rows(a) : Cols(a)) == (trans_b ? Cols(b) : Rows(b)));  // K agrees
  const Strides sa = Op(Cols(a), trans_a), sb = Op(Cols(b), trans_b);
  GemmArgs g;
  g.m = Rows(c);
  g.n = Cols(c);
  g.k = trans_a ? Rows(a) : Cols(a);
  g.a = F32(a), g.a_rs = sa.rs, g.a_cs = sa.cs;
  g.b = F32(b), g.b_rs = sb.rs, g.b_cs = sb.cs;
  g.c = MutF32(c), g.ldc = g.n;
  g.alpha = alpha, g.beta = beta;
  if (options_.on_matmul) options_.on_matmul(g.m, g.n, g.k);
  Gemm(g);
}

void CpuBackend::MatmulBatched(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                               Tensor& c, float alpha, float beta) {
  assert(a.dtype() == b.dtype() && (AllF32(c) || SameDType(a, c)));
  if (Widened(&CpuBackend::MatmulBatched, a, trans_a, b, trans_b, c, alpha, beta)) return;
  assert(a.shape().rank() == 3 && b.shape().rank() == 3 && c.shape().rank() == 3);
  assert(a.shape()[0] == b.shape()[0] && a.shape()[0] == c.shape()[0]);
  const int64_t L = a.shape()[0];
  const int64_t ar = a.shape()[1], ac = a.shape()[2], br = b.shape()[1], bc = b.shape()[2];
  assert(c.shape()[1] == (trans_a ? ac : ar) && c.shape()[2] == (trans_b ? br : bc));
  assert((trans_a ? ar : ac) == (trans_b ? bc : br));  // K agrees
  const Strides sa = Op(ac, trans_a), sb = Op(bc, trans_b);
  GemmArgs g;
  g.m = c.shape()[1];
  g.n = c.shape()[2];
  g.k = trans_a ? ar : ac;
  g.a_rs = sa.rs, g.a_cs = sa.cs, g.b_rs = sb.rs, g.b_cs = sb.cs, g.ldc = g.n;
  g.alpha = alpha, g.beta = beta;
  for (int64_t l = 0; l < L; ++l) {
    g.a = F32(a) + l * ar * ac;
    g.b = F32(b) + l * br * bc;
    g.c = MutF32(c) + l * g.m * g.n;
    Gemm(g);
  }
}

void CpuBackend::MatmulBias(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                            const Tensor& bias, Tensor& c) {
  assert(SameDType(a, b, bias, c));
  if (Widened(&CpuBackend::MatmulBias, a, trans_a, b, trans_b, bias, c)) return;
  Matmul(a, trans_a, b, trans_b, c);
  AddBias(c, bias);
}

void CpuBackend::MatmulBiasGelu(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                                const Tensor& bias, Tensor& pre, Tensor& act) {
  assert(SameDType(a, b, bias, pre, act));
  if (Widened(&CpuBackend::MatmulBiasGelu, a, trans_a, b, trans_b, bias, pre, act)) return;
  MatmulBias(a, trans_a, b, trans_b, bias, pre);
  GeluForward(pre, act);
}

void CpuBackend::MatmulGeluBackward(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                                    const Tensor& pre, Tensor& dx) {
  assert(SameDType(a, b, pre, dx) && pre.numel() == dx.numel());
  if (Widened(&CpuBackend::MatmulGeluBackward, a, trans_a, b, trans_b, pre, dx)) return;
  Matmul(a, trans_a, b, trans_b, dx);
  GeluBackward(dx, pre, dx);
}

// ---- bias -----------------------------------------------------------------------------------

void CpuBackend::AddBiasResidual(Tensor& x, const Tensor& bias, const Tensor& residual) {
  assert(SameDType(x, bias, residual) && residual.numel() == x.numel());
  if (Widened(&CpuBackend::AddBiasResidual, x, bias, residual)) return;
  AddBias(x, bias);
  Add(x, residual, x);
}

void CpuBackend::AddBias(Tensor& y, const Tensor& bias) {
  assert(SameDType(y, bias));
  if (Widened(&CpuBackend::AddBias, y, bias)) return;
  const int64_t N = Rows(y), C = Cols(y);
  assert(bias.numel() == C);
  float* out = MutF32(y);
  const float* bb = F32(bias);
  for (int64_t n = 0; n < N; ++n) {
    float* row = out + n * C;
    for (int64_t i = 0; i < C; ++i) row[i] += bb[i];
  }
}

void CpuBackend::BiasGrad(const Tensor& dy, Tensor& dbias) {
  assert(AllF32(dbias));
  if (Widened(&CpuBackend::BiasGrad, dy, dbias)) return;
  const int64_t N = Rows(dy), C = Cols(dy);
  assert(dbias.numel() == C);
  const float* g = F32(dy);
  float* db = MutF32(dbias);
  for (int64_t n = 0; n < N; ++n) {
    const float* row = g + n * C;
    for (int64_t i = 0; i < C; ++i) db[i] += row[i];
  }
}

// ---- LayerNorm ------------------------------------------------------------------------------

void CpuBackend::LayerNormForward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                  float eps, Tensor& y, Tensor& mean, Tensor& rstd) {
  assert(SameDType(x, gamma, beta, y) && AllF32(mean, rstd));
  if (Widened(&CpuBackend::LayerNormForward, x, gamma, beta, eps, y, mean, rstd)) return;
  const int64_t N = Rows(x), C = Cols(x);
  assert(y.numel() == x.numel() && gamma.numel() == C && beta.numel() == C);
  assert(mean.numel() == N && rstd.numel() == N);
  const float* in = F32(x);
  const float* w = F32(gamma);
  const float* bb = F32(beta);
  float* out = MutF32(y);
  float* mu = MutF32(mean);
  float* rs = MutF32(rstd);
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = in + n * C;  // (C)
    const double sum = SumInDouble(C, [xr](int64_t i) { return double(xr[i]); });
    const float m = float(sum / double(C));
    const double var = SumInDouble(C, [xr, m](int64_t i) {
      const double dx = double(xr[i] - m);
      return dx * dx;
    });
    const float s = 1.0f / std::sqrt(float(var / double(C)) + eps);
    float* yr = out + n * C;  // written after xr is read: y may alias x
    for (int64_t i = 0; i < C; ++i) yr[i] = (xr[i] - m) * s * w[i] + bb[i];
    mu[n] = m;
    rs[n] = s;
  }
}

void CpuBackend::LayerNormBackward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                   const Tensor& mean, const Tensor& rstd, Tensor& dx,
                                   Tensor& dgamma, Tensor& dbeta) {
  assert(SameDType(dy, x, gamma, dx) && AllF32(mean, rstd, dgamma, dbeta));
  if (Widened(&CpuBackend::LayerNormBackward, dy, x, gamma, mean, rstd, dx, dgamma, dbeta)) return;
  const int64_t N = Rows(x), C = Cols(x);
  assert(dy.numel() == x.numel() && dx.numel() == x.numel());
  assert(gamma.numel() == C && dgamma.numel() == C && dbeta.numel() == C);
  assert(mean.numel() == N && rstd.numel() == N);
  const float* g = F32(dy);
  const float* in = F32(x);
  const float* w = F32(gamma);
  const float* mu = F32(mean);
  const float* rs = F32(rstd);
  float* dinp = MutF32(dx);
  float* dw = MutF32(dgamma);
  float* db = MutF32(dbeta);
  for (int64_t n = 0; n < N; ++n) {
    const float* gr = g + n * C;
    const float* xr = in + n * C;
    float* dr = dinp + n * C;
    const float m = mu[n], s = rs[n];
    // The two reductions of the LN backward: mean(w * dy) and mean(w * dy * xhat).
    const double dnorm_sum = SumInDouble(C, [w, gr](int64_t i) { return double(w[i] * gr[i]); });
    const double dnorm_norm_sum = SumInDouble(C, [w, gr, xr, m, s](int64_t i) {
      const float xhat = (xr[i] - m) * s;
      return double(w[i] * gr[i]) * xhat;
    });
    const float dnorm_mean = float(dnorm_sum / double(C));
    const float dnorm_norm_mean = float(dnorm_norm_sum / double(C));
    for (int64_t i = 0; i < C; ++i) {
      const float xhat = (xr[i] - m) * s;
      const float dnorm = w[i] * gr[i];
      db[i] += gr[i];
      dw[i] += xhat * gr[i];
      dr[i] += (dnorm - dnorm_mean - xhat * dnorm_norm_mean) * s;
    }
  }
}

// ---- GeLU -----------------------------------------------------------------------------------

void CpuBackend::GeluForward(const Tensor& x, Tensor& y) {
  assert(SameDType(x, y));
  if (Widened(&CpuBackend::GeluForward, x, y)) return;
  assert(y.numel() == x.numel());
  kernels_->gelu_forward(F32(x), MutF32(y), x.numel());
}

void CpuBackend::GeluBackward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  assert(SameDType(dy, x, dx));
  if (Widened(&CpuBackend::GeluBackward, dy, x, dx)) return;
  assert(dy.numel() == x.numel() && dx.numel() == x.numel());
  kernels_->gelu_backward(F32(dy), F32(x), MutF32(dx), x.numel());
}

// ---- attention ------------------------------------------------------------------------------

Shape CpuBackend::AttentionSavedShape(int64_t b, int64_t s, int64_t nh, int64_t /*d*/) const {
  return Shape{b, nh, s, s};
}

// Per batch bi and head j, with Q, K, V the (s, d) blocks of qkv (rows `stride` floats apart)
// and P a (s, s) slice of saved:
//   P = softmax(Q K^T / sqrt(d)), causal (P = 0 above the diagonal);  O = P V.
void CpuBackend::AttentionForward(const Tensor& qkv, int64_t nh, TokenOrder order, Tensor& out,
                                  Tensor& saved) {
  assert(SameDType(qkv, out) && AllF32(saved));
  if (Widened(&CpuBackend::AttentionForward, qkv, nh, order, out, saved)) return;
  int64_t b = 0, s = 0;
  BatchSeq(qkv, order, &b, &s);
  const int64_t A = Cols(qkv) / 3, d = A / nh;
  assert(Cols(qkv) == 3 * A && A == nh * d && out.numel() == b * s * A);
  assert(saved.shape() == AttentionSavedShape(b, s, nh, d));
  const float scale = 1.0f / std::sqrt(float(d));
  const float* in = F32(qkv);
  float* o = MutF32(out);
  float* att = MutF32(saved);
  for (int64_t bi = 0; bi < b; ++bi) {
    const RowLayout lin = HeadRows(order, bi, b, s, 3 * A);
    const RowLayout lout = HeadRows(order, bi, b, s, A);
    const Strides rows_in{lin.stride, 1}, cols_in{1, lin.stride};  // X and X^T of a head block
    for (int64_t j = 0; j < nh; ++j) {
      const float* q = in + lin.base + j * d;
      float* P = att + (bi * nh + j) * s * s;
      // (s, s) pre-softmax scores, unscaled; only the lower triangle is computed.
      Gemm(HeadGemm(s, s, d, q, rows_in, q + A, cols_in, P, s, Triangle::kNone, true));
      for (int64_t t = 0; t < s; ++t) {
        float* p = P + t * s;  // row t sees positions 0..t
        float maxv = -std::numeric_limits<float>::infinity();
        for (int64_t u = 0; u <= t; ++u) maxv = std::max(maxv, p[u] * scale);
        double sum = 0.0;
        for (int64_t u = 0; u <= t; ++u) {
          p[u] = std::exp(p[u] * scale - maxv);
          sum += p[u];
        }
        const float inv = float(1.0 / sum);
        for (int64_t u = 0; u <= t; ++u) p[u] *= inv;
        for (int64_t u = t + 1; u < s; ++u) p[u] = 0.0f;
      }
      Gemm(HeadGemm(s, d, s, P, Strides{s, 1}, q + 2 * A, rows_in, o + lout.base + j * d,
                    lout.stride, Triangle::kLower, false));
    }
  }
}

// With dO the (s, d) gradient of O:
//   dV = P^T dO;  dP = dO V^T;  dS = P * (dP - rowsum(P * dP)) / sqrt(d);
//   dQ = dS K;  dK = dS^T Q   (dS lower-triangular, like P; its upper part in scratch_ is junk).
void CpuBackend::AttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                   const Tensor& saved, int64_t nh, TokenOrder order,
                                   Tensor& dqkv) {
  assert(SameDType(dout, qkv, out, dqkv) && AllF32(saved));
  if (Widened(&CpuBackend::AttentionBackward, dout, qkv, out, saved, nh, order, dqkv)) return;
  int64_t b = 0, s = 0;
  BatchSeq(qkv, order, &b, &s);
  const int64_t A = Cols(qkv) / 3, d = A / nh;
  assert(A == nh * d && dout.numel() == b * s * A && dqkv.shape() == qkv.shape());
  assert(saved.shape() == AttentionSavedShape(b, s, nh, d));
  const float scale = 1.0f / std::sqrt(float(d));
  const float* in = F32(qkv);
  const float* g = F32(dout);
  const float* att = F32(saved);
  float* dinp = MutF32(dqkv);
  scratch_.resize(size_t(s * s));
  float* dP = scratch_.data();
  const Strides sq{s, 1}, sq_t{1, s};  // an (s, s) matrix and its transpose
  for (int64_t bi = 0; bi < b; ++bi) {
    const RowLayout lin = HeadRows(order, bi, b, s, 3 * A);
    const RowLayout lout = HeadRows(order, bi, b, s, A);
    const Strides rows_in{lin.stride, 1}, cols_in{1, lin.stride}, rows_out{lout.stride, 1};
    for (int64_t j = 0; j < nh; ++j) {
      const float* q = in + lin.base + j * d;
      float* dq = dinp + lin.base + j * d;
      const float* dO = g + lout.base + j * d;
      const float* P = att + (bi * nh + j) * s * s;
      Gemm(HeadGemm(s, d, s, P, sq_t, dO, rows_out, dq + 2 * A, lin.stride, Triangle::kUpper,
                    false));                                                           // dV
      Gemm(HeadGemm(s, s, d, dO, rows_out, q + 2 * A, cols_in, dP, s, Triangle::kNone, true));
      for (int64_t t = 0; t < s; ++t) {
        const float* p = P + t * s;
        float* dp = dP + t * s;  // becomes dS in place
        double dot = 0.0;
        for (int64_t u = 0; u <= t; ++u) dot += double(p[u]) * dp[u];
        const float fdot = float(dot);
        for (int64_t u = 0; u <= t; ++u) dp[u] = p[u] * (dp[u] - fdot) * scale;
      }
      Gemm(HeadGemm(s, d, s, dP, sq, q + A, rows_in, dq, lin.stride, Triangle::kLower, false));
      Gemm(HeadGemm(s, d, s, dP, sq_t, q, rows_in, dq + A, lin.stride, Triangle::kUpper, false));
    }
  }
}

// ---- context-parallel attention blocks ------------------------------------------------------

namespace {

// How the keys of one chunk pair (Lq query rows from position qs, Lk key rows from ks) are seen.
enum class PairKind { kHidden, kAll, kDiagonal, kPartial };
PairKind Classify(int64_t qs, int64_t lq, int64_t ks, int64_t lk) {
  if (ks > qs + lq - 1) return PairKind::kHidden;  // every key after every query
  if (ks + lk - 1 <= qs) return PairKind::kAll;    // every key before every query
  if (ks == qs && lk == lq) return PairKind::kDiagonal;
  return PairKind::kPartial;
}

// One (batch, head) view of the CP block operands, seq-first: chunk c's row r of a tensor of
// width W lies at base + (c * len * b + r * b) * W.
struct BlockView {
  int64_t b, width, len;
  int64_t Row(int64_t chunk, int64_t r) const { return (chunk * len + r) * b * width; }
  int64_t stride() const { return b * width; }
};

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

}  // namespace

// Per batch bi and head j: the (2Lq, 2Lk) scores of this block, chunk pair by chunk pair (hidden
// pairs skipped, the diagonal pair as a triangle), a row softmax with its log-sum-exp, the
// block's output P V, then the online-softmax merge into out and lse.
void CpuBackend::AttentionBlockForward(const Tensor& qkv, const SeqBlock& qpos, const Tensor& kv,
                                       const SeqBlock& kpos, int64_t nh, bool first, Tensor& out,
                                       Tensor& lse) {
  assert(SameDType(qkv, kv) && AllF32(out, lse));
  if (Widened(&CpuBackend::AttentionBlockForward, qkv, qpos, kv, kpos, nh, first, out, lse)) return;
  assert(qkv.shape().rank() == 3 && kv.shape().rank() == 3);
  const int64_t b = qkv.shape()[1], A = Cols(qkv) / 3, d = A / nh;
  const int64_t lq = qpos.len, lk = kpos.len, nq = 2 * lq, nk = 2 * lk;
  assert(qkv.shape()[0] == nq && kv.shape()[0] == nk && kv.shape()[1] == b && Cols(kv) == 2 * A);
  assert(out.numel() == nq * b * A && lse.numel() == b * nh * nq && A == nh * d);
  const float scale = 1.0f / std::sqrt(float(d));
  const BlockView vq{b, 3 * A, lq}, vk{b, 2 * A, lk};
  block_.resize(size_t(nq * nk + nq * d + nq));
  float* S = block_.data();  // (nq, nk) scores, then probabilities
  float* Ob = S + nq * nk;   // (nq, d) this block's output
  float* Lb = Ob + nq * d;   // (nq) this block's log-sum-exp
  const float* in = F32(qkv);
  const float* kvp = F32(kv);
  float* o = MutF32(out);
  float* L = MutF32(lse);
  const int64_t qstart[2] = {qpos.first0, qpos.first1}, kstart[2] = {kpos.first0, kpos.first1};
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t j = 0; j < nh; ++j) {
      const float* q = in + bi * 3 * A + j * d;
      const float* k = kvp + bi * 2 * A + j * d;
      for (int qa = 0; qa < 2; ++qa) {
        for (int kb = 0; kb < 2; ++kb) {
          float* Sb = S + qa * lq * nk + kb * lk;
          const PairKind kind = Classify(qstart[qa], lq, kstart[kb], lk);
          if (kind != PairKind::kHidden)
            Gemm(HeadGemm(lq, lk, d, q + vq.Row(qa, 0), Strides{vq.stride(), 1}, k + vk.Row(kb, 0),
                          Strides{1, vk.stride()}, Sb, nk, Triangle::kNone,
                          kind == PairKind::kDiagonal));
          for (int64_t r = 0; r < lq; ++r)
            for (int64_t c = 0; c < lk; ++c)
              if (kstart[kb] + c > qstart[qa] + r) Sb[r * nk + c] = kNegInf;
        }
      }
      for (int64_t u = 0; u < nq; ++u) {
        float* p = S + u * nk;
        float m = kNegInf;
        for (int64_t v = 0; v < nk; ++v) m = std::max(m, p[v] * scale);
        float lse_b = kNegInf;
        if (m == kNegInf) {
          std::fill(p, p + nk, 0.0f);
        } else {
          double sum = 0.0;
          for (int64_t v = 0; v < nk; ++v) {
            p[v] = p[v] == kNegInf ? 0.0f : std::exp(p[v] * scale - m);
            sum += p[v];
          }
          const float inv = float(1.0 / sum);
          for (int64_t v = 0; v < nk; ++v) p[v] *= inv;
          lse_b = m + float(std::log(sum));
        }
        Lb[u] = lse_b;
      }
      for (int qa = 0; qa < 2; ++qa) {
        float* Oq = Ob + qa * lq * d;
        bool any = false;
        for (int kb = 0; kb < 2; ++kb) {
          const PairKind kind = Classify(qstart[qa], lq, kstart[kb], lk);
          if (kind == PairKind::kHidden) continue;
          GemmArgs g = HeadGemm(lq, d, lk, S + qa * lq * nk + kb * lk, Strides{nk, 1},
                                k + A + vk.Row(kb, 0), Strides{vk.stride(), 1}, Oq, d,
                                kind == PairKind::kDiagonal ? Triangle::kLower : Triangle::kNone,
                                false);
          g.beta = any ? 1.0f : 0.0f;
          Gemm(g);
          any = true;
        }
        if (!any) std::fill(Oq, Oq + lq * d, 0.0f);
      }
      float* Lrow = L + (bi * nh + j) * nq;
      for (int64_t u = 0; u < nq; ++u) {
        float* orow = o + (u * b + bi) * A + j * d;
        const float* brow = Ob + u * d;
        const float lb = Lb[u], lo = Lrow[u];
        if (first || (lo == kNegInf && lb != kNegInf)) {
          std::copy(brow, brow + d, orow);
          Lrow[u] = lb;
        } else if (lb != kNegInf) {
          const float mx = std::max(lo, lb);
          const float ln = mx + std::log(std::exp(lo - mx) + std::exp(lb - mx));
          const float wo = std::exp(lo - ln), wb = std::exp(lb - ln);
          for (int64_t c = 0; c < d; ++c) orow[c] = orow[c] * wo + brow[c] * wb;
          Lrow[u] = ln;
        }
      }
    }
  }
}

// With P = exp(scores / sqrt(d) - lse) (this block's share of the final probabilities),
// D = rowsum(dO * O) over the final output:
//   dV += P^T dO;  dP = dO V^T;  dS = P * (dP - D) / sqrt(d);  dQ += dS K;  dK += dS^T Q.
void CpuBackend::AttentionBlockBackward(const Tensor& dout, const Tensor& qkv, const SeqBlock& qpos,
                                        const Tensor& kv, const SeqBlock& kpos, const Tensor& out,
                                        const Tensor& lse, int64_t nh, Tensor& dqkv, Tensor& dkv) {
  assert(SameDType(dout, qkv, kv, out) && AllF32(lse, dqkv, dkv));
  if (Widened(&CpuBackend::AttentionBlockBackward, dout, qkv, qpos, kv, kpos, out, lse, nh, dqkv,
               dkv))
    return;
  assert(qkv.shape().rank() == 3 && kv.shape().rank() == 3);
  const int64_t b = qkv.shape()[1], A = Cols(qkv) / 3, d = A / nh;
  const int64_t lq = qpos.len, lk = kpos.len, nq = 2 * lq, nk = 2 * lk;
  assert(qkv.shape()[0] == nq && kv.shape()[0] == nk && Cols(kv) == 2 * A);
  assert(dout.numel() == out.numel() && out.numel() == nq * b * A && lse.numel() == b * nh * nq);
  assert(dqkv.shape() == qkv.shape() && dkv.shape() == kv.shape());
  const float scale = 1.0f / std::sqrt(float(d));
  const BlockView vq{b, 3 * A, lq}, vk{b, 2 * A, lk}, vo{b, A, lq};
  block_.resize(size_t(2 * nq * nk + nq));
  float* P = block_.data();
  float* dP = P + nq * nk;
  float* D = dP + nq * nk;
  const float* in = F32(qkv);
  const float* kvp = F32(kv);
  const float* g = F32(dout);
  const float* o = F32(out);
  const float* L = F32(lse);
  float* dq_all = MutF32(dqkv);
  float* dkv_all = MutF32(dkv);
  const int64_t qstart[2] = {qpos.first0, qpos.first1}, kstart[2] = {kpos.first0, kpos.first1};
  auto accumulate = [](GemmArgs a) {
    a.beta = 1.0f;
    return a;
  };
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t j = 0; j < nh; ++j) {
      const float* q = in + bi * 3 * A + j * d;
      const float* k = kvp + bi * 2 * A + j * d;
      const float* dO = g + bi * A + j * d;
      float* dq = dq_all + bi * 3 * A + j * d;
      float* dk = dkv_all + bi * 2 * A + j * d;
      const float* Lrow = L + (bi * nh + j) * nq;
      for (int64_t u = 0; u < nq; ++u) {
        const float* gr = dO + u * b * A;
        const float* orow = o + (u * b + bi) * A + j * d;
        D[u] = float(SumInDouble(d, [&](int64_t c) { return double(gr[c]) * orow[c]; }));
      }
      for (int qa = 0; qa < 2; ++qa) {
        for (int kb = 0; kb < 2; ++kb) {
          const PairKind kind = Classify(qstart[qa], lq, kstart[kb], lk);
          if (kind == PairKind::kHidden) continue;
          const bool diag = kind == PairKind::kDiagonal;
          float* Pb = P + qa * lq * nk + kb * lk;
          float* dPb = dP + qa * lq * nk + kb * lk;
          const float* qa_rows = q + vq.Row(qa, 0);
          const float* k_rows = k + vk.Row(kb, 0);
          const float* v_rows = k + A + vk.Row(kb, 0);
          const float* dO_rows = dO + vo.Row(qa, 0);
          Gemm(HeadGemm(lq, lk, d, qa_rows, Strides{vq.stride(), 1}, k_rows,
                        Strides{1, vk.stride()}, Pb, nk, Triangle::kNone, diag));
          Gemm(HeadGemm(lq, lk, d, dO_rows, Strides{vo.stride(), 1}, v_rows,
                        Strides{1, vk.stride()}, dPb, nk, Triangle::kNone, diag));
          for (int64_t r = 0; r < lq; ++r) {
            const float lr = Lrow[qa * lq + r], dr = D[qa * lq + r];
            for (int64_t c = 0; c < lk; ++c) {
              float& p = Pb[r * nk + c];
              float& ds = dPb[r * nk + c];
              if (kstart[kb] + c > qstart[qa] + r || lr == kNegInf) {
                p = 0.0f;
                ds = 0.0f;
              } else {
                p = std::exp(p * scale - lr);
                ds = p * (ds - dr) * scale;
              }
            }
          }
          const Triangle lower = diag ? Triangle::kLower : Triangle::kNone;
          const Triangle upper = diag ? Triangle::kUpper : Triangle::kNone;
          Gemm(accumulate(HeadGemm(lk, d, lq, Pb, Strides{1, nk}, dO_rows,
                                   Strides{vo.stride(), 1}, dk + A + vk.Row(kb, 0), vk.stride(),
                                   upper, false)));  // dV
          Gemm(accumulate(HeadGemm(lq, d, lk, dPb, Strides{nk, 1}, k_rows,
                                   Strides{vk.stride(), 1}, dq + vq.Row(qa, 0), vq.stride(), lower,
                                   false)));  // dQ
          Gemm(accumulate(HeadGemm(lk, d, lq, dPb, Strides{1, nk}, qa_rows,
                                   Strides{vq.stride(), 1}, dk + vk.Row(kb, 0), vk.stride(), upper,
                                   false)));  // dK
        }
      }
    }
  }
}

void CpuBackend::CopyColumns(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col,
                             int64_t ncols) {
  assert(SameDType(src, dst));
  if (Widened(&CpuBackend::CopyColumns, src, src_col, dst, dst_col, ncols)) return;
  const int64_t rows = Rows(src), ws = Cols(src), wd = Cols(dst);
  assert(Rows(dst) == rows && src_col + ncols <= ws && dst_col + ncols <= wd);
  const float* a = F32(src);
  float* c = MutF32(dst);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(c + r * wd + dst_col, a + r * ws + src_col, size_t(ncols) * sizeof(float));
}

// ---- vocab-parallel embedding ---------------------------------------------------------------

void CpuBackend::EmbeddingForward(const Tensor& tokens, const Tensor& table, int64_t vocab_start,
                                  Tensor& out) {
  assert(SameDType(table, out));
  if (Widened(&CpuBackend::EmbeddingForward, tokens, table, vocab_start, out)) return;
  const int64_t N = tokens.numel(), V = Rows(table), h = Cols(table);
  assert(out.numel() == N * h);
  const int32_t* tok = I32(tokens);
  const float* w = F32(table);
  float* o = MutF32(out);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t row = int64_t(tok[n]) - vocab_start;
    float* orow = o + n * h;
    if (row >= 0 && row < V) {
      std::memcpy(orow, w + row * h, size_t(h) * sizeof(float));
    } else {
      std::fill(orow, orow + h, 0.0f);
    }
  }
}

void CpuBackend::EmbeddingBackward(const Tensor& dout, const Tensor& tokens, int64_t vocab_start,
                                   Tensor& dtable) {
  assert(AllF32(dtable));
  if (Widened(&CpuBackend::EmbeddingBackward, dout, tokens, vocab_start, dtable)) return;
  const int64_t N = tokens.numel(), V = Rows(dtable), h = Cols(dtable);
  assert(dout.numel() == N * h);
  const int32_t* tok = I32(tokens);
  const float* g = F32(dout);
  float* dw = MutF32(dtable);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t row = int64_t(tok[n]) - vocab_start;
    if (row < 0 || row >= V) continue;
    const float* grow = g + n * h;
    float* drow = dw + row * h;
    for (int64_t i = 0; i < h; ++i) drow[i] += grow[i];
  }
}

// ---- vocab-parallel cross entropy -----------------------------------------------------------

void CpuBackend::CrossEntropyMax(const Tensor& logits, Tensor& row_max) {
  assert(AllF32(row_max));
  if (Widened(&CpuBackend::CrossEntropyMax, logits, row_max)) return;
  const int64_t N = Rows(logits), V = Cols(logits);
  assert(row_max.numel() == N);
  const float* l = F32(logits);
  float* mx = MutF32(row_max);
  for (int64_t n = 0; n < N; ++n) {
    const float* lr = l + n * V;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t v = 0; v < V; ++v) m = std::max(m, lr[v]);
    mx[n] = m;
  }
}

void CpuBackend::CrossEntropySumExp(const Tensor& logits, const Tensor& row_max, Tensor& sum_exp) {
  assert(AllF32(row_max, sum_exp));
  if (Widened(&CpuBackend::CrossEntropySumExp, logits, row_max, sum_exp)) return;
  const int64_t N = Rows(logits), V = Cols(logits);
  assert(row_max.numel() == N && sum_exp.numel() == N);
  const float* l = F32(logits);
  const float* mx = F32(row_max);
  float* se = MutF32(sum_exp);
  for (int64_t n = 0; n < N; ++n) {
    const float* lr = l + n * V;
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(lr[v] - mx[n]);
    se[n] = float(sum);
  }
}

void CpuBackend::CrossEntropyTarget(const Tensor& logits, const Tensor& targets,
                                    int64_t vocab_start, Tensor& target_logit) {
  assert(AllF32(target_logit));
  if (Widened(&CpuBackend::CrossEntropyTarget, logits, targets, vocab_start, target_logit)) return;
  const int64_t N = Rows(logits), V = Cols(logits);
  assert(targets.numel() == N && target_logit.numel() == N);
  const float* l = F32(logits);
  const int32_t* tgt = I32(targets);
  float* z = MutF32(target_logit);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t v = int64_t(tgt[n]) - vocab_start;
    z[n] = (v >= 0 && v < V) ? l[n * V + v] : 0.0f;
  }
}

void CpuBackend::CrossEntropyLoss(const Tensor& row_max, const Tensor& sum_exp,
                                  const Tensor& target_logit, Tensor& loss) {
  assert(AllF32(row_max, sum_exp, target_logit, loss));
  if (Widened(&CpuBackend::CrossEntropyLoss, row_max, sum_exp, target_logit, loss)) return;
  const int64_t N = row_max.numel();
  assert(sum_exp.numel() == N && target_logit.numel() == N && loss.numel() == N);
  const float* mx = F32(row_max);
  const float* se = F32(sum_exp);
  const float* z = F32(target_logit);
  float* out = MutF32(loss);
  for (int64_t n = 0; n < N; ++n) out[n] = std::log(se[n]) + mx[n] - z[n];
}

void CpuBackend::CrossEntropyBackward(const Tensor& logits, const Tensor& targets,
                                      int64_t vocab_start, const Tensor& row_max,
                                      const Tensor& sum_exp, float scale, Tensor& dlogits) {
  assert(SameDType(logits, dlogits) && AllF32(row_max, sum_exp));
  if (Widened(&CpuBackend::CrossEntropyBackward, logits, targets, vocab_start, row_max, sum_exp,
               scale, dlogits))
    return;
  const int64_t N = Rows(logits), V = Cols(logits);
  assert(targets.numel() == N && row_max.numel() == N && sum_exp.numel() == N);
  assert(dlogits.numel() == logits.numel());
  const float* l = F32(logits);
  const int32_t* tgt = I32(targets);
  const float* mx = F32(row_max);
  const float* se = F32(sum_exp);
  float* dl = MutF32(dlogits);
  for (int64_t n = 0; n < N; ++n) {
    const float* lr = l + n * V;
    float* dr = dl + n * V;  // element v is read before it is written: may alias
    const float inv = 1.0f / se[n];
    const int64_t target = int64_t(tgt[n]) - vocab_start;
    for (int64_t v = 0; v < V; ++v) {
      const float p = std::exp(lr[v] - mx[n]) * inv;
      dr[v] = (p - (v == target ? 1.0f : 0.0f)) * scale;
    }
  }
}

// ---- element-wise and reductions ------------------------------------------------------------

void CpuBackend::Add(const Tensor& a, const Tensor& b, Tensor& out) {
  if (Widened(&CpuBackend::Add, a, b, out)) return;
  assert(a.numel() == out.numel() && b.numel() == out.numel());
  const float* pa = F32(a);
  const float* pb = F32(b);
  float* o = MutF32(out);
  for (int64_t i = 0, n = out.numel(); i < n; ++i) o[i] = pa[i] + pb[i];
}

void CpuBackend::Axpy(float alpha, const Tensor& x, Tensor& y) {
  if (Widened(&CpuBackend::Axpy, alpha, x, y)) return;
  assert(x.numel() == y.numel());
  const float* px = F32(x);
  float* py = MutF32(y);
  for (int64_t i = 0, n = y.numel(); i < n; ++i) py[i] += alpha * px[i];
}

void CpuBackend::Scale(float alpha, Tensor& x) {
  if (Widened(&CpuBackend::Scale, alpha, x)) return;
  float* p = MutF32(x);
  for (int64_t i = 0, n = x.numel(); i < n; ++i) p[i] *= alpha;
}

void CpuBackend::Fill(float value, Tensor& x) {
  if (Widened(&CpuBackend::Fill, value, x)) return;
  float* p = MutF32(x);
  std::fill(p, p + x.numel(), value);
}

void CpuBackend::ScaleRows(const Tensor& x, const Tensor& scale, Tensor& out) {
  assert(AllF32(scale));
  if (Widened(&CpuBackend::ScaleRows, x, scale, out)) return;
  const int64_t n = Rows(x), c = Cols(x);
  assert(scale.numel() == n && out.numel() == x.numel());
  const float* in = F32(x);
  const float* s = F32(scale);
  float* o = MutF32(out);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < c; ++j) o[r * c + j] = in[r * c + j] * s[r];
}

void CpuBackend::RowDot(const Tensor& a, const Tensor& b, Tensor& out) {
  assert(AllF32(out));
  if (Widened(&CpuBackend::RowDot, a, b, out)) return;
  const int64_t n = Rows(a), c = Cols(a);
  assert(b.numel() == a.numel() && out.numel() == n);
  const float* x = F32(a);
  const float* y = F32(b);
  float* o = MutF32(out);
  for (int64_t r = 0; r < n; ++r)
    o[r] = float(SumInDouble(c, [&](int64_t j) { return double(x[r * c + j]) * y[r * c + j]; }));
}

void CpuBackend::Copy(const Tensor& src, Tensor& dst) {
  const int64_t n = src.numel();
  assert(n == dst.numel());
  if (src.dtype() == dst.dtype()) {
    std::memmove(dst.data(), src.data(), src.bytes());
  } else if (src.dtype() == DType::kF32 && dst.dtype() == DType::kBF16) {
    Bf16BitsOf(F32(src), dst.data_as<uint16_t>(), n);
  } else {
    assert(src.dtype() == DType::kBF16 && dst.dtype() == DType::kF32);
    FloatsOfBf16(src.data_as<const uint16_t>(), MutF32(dst), n);
  }
}

void CpuBackend::SumSquares(const Tensor& x, Tensor& out) {
  assert(AllF32(out));
  if (Widened(&CpuBackend::SumSquares, x, out)) return;
  assert(out.numel() == 1);
  const float* p = F32(x);
  MutF32(out)[0] += float(SumInDouble(x.numel(), [p](int64_t i) { return double(p[i]) * p[i]; }));
}

void CpuBackend::Sum(const Tensor& x, Tensor& out) {
  assert(AllF32(out));
  if (Widened(&CpuBackend::Sum, x, out)) return;
  assert(out.numel() == 1);
  const float* p = F32(x);
  MutF32(out)[0] += float(SumInDouble(x.numel(), [p](int64_t i) { return double(p[i]); }));
}

// ---- optimizer ------------------------------------------------------------------------------

void CpuBackend::AdamW(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                       const AdamWConfig& cfg) {
  assert(AllF32(param, grad, m, v));
  if (Widened(&CpuBackend::AdamW, param, grad, m, v, cfg)) return;
  assert(grad.numel() == param.numel() && m.numel() == param.numel() &&
         v.numel() == param.numel() && cfg.step >= 1);
  const float bc1 = 1.0f - std::pow(cfg.beta1, float(cfg.step));
  const float bc2 = 1.0f - std::pow(cfg.beta2, float(cfg.step));
  kernels_->adamw(MutF32(param), F32(grad), MutF32(m), MutF32(v), param.numel(), cfg.lr,
                  cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, cfg.grad_scale, bc1, bc2);
}

}  // namespace ptdp::rt
