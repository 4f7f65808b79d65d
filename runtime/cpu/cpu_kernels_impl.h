// The kernels of runtime/cpu/cpu_kernels.h, written once over a SIMD type. cpu_kernels.cc
// includes this file once per level, inside that level's own namespace (itself inside an
// anonymous one), after defining
//   PTDP_KFN     the attributes of every function here: `static`, the level's target("...")
//   PTDP_KINLINE the same plus always_inline (the small helpers)
//   struct Isa   the vector type V and its operations, and the GEMM blocking (kW, kMr, kKc, ...).
// No include guard: it is meant to be included three times.
//
// Why it is safe to build one binary from three ISAs (docs/runtime.md, "CPU kernels"): every
// function here is internal to cpu_kernels.cc and carries its level's target attribute, and it
// calls nothing out of line but other functions of its own level (no std:: templates, no Eigen):
// code with AVX instructions can only run after the dispatcher chose its level.
// tests/runtime/cpu_isa_check.sh proves it on the linked ptdp binary.
//
// Letters: the GEMM's C (m, n) = op(A) (m, k) op(B) (k, n); i rows, j columns, p the k index.
//
// GEMM: the BLIS loop order. B is packed per (kKc x kNc) block into kNr-wide column panels,
// A per (kMc x kKc) block into kMr-high row panels, and a kMr x kNr micro-kernel keeps the tile
// of C in registers while it runs over k, one broadcast of A times kNr/kW vectors of B per step.
// The summation order of every C element is fixed by the shapes and the level: deterministic.

// ---- small helpers ------------------------------------------------------------------------------

constexpr int kW = Isa::kW;    // floats per vector
constexpr int kMr = Isa::kMr;  // micro-tile rows
constexpr int kNr = 2 * kW;    // micro-tile columns: two vectors
constexpr int64_t kKc = Isa::kKc;
constexpr int64_t kMc = Isa::kMc;  // a multiple of kMr
constexpr int64_t kNc = Isa::kNc;  // a multiple of kNr
static_assert(kMc % kMr == 0 && kNc % kNr == 0, "blocks are whole micro-tiles");
// With kSplatA, packed A holds each element kW times (a whole vector), so that the micro-kernel
// loads it instead of broadcasting it: SSE2 has no broadcast load, and its shuffle would take an
// FP port from the multiplies and adds.
constexpr int kSplat = Isa::kSplatA ? kW : 1;
using V = typename Isa::V;

PTDP_KINLINE int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }
PTDP_KINLINE int64_t Max64(int64_t a, int64_t b) { return a < b ? b : a; }
PTDP_KINLINE int64_t RoundUp(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// ---- GEMM ---------------------------------------------------------------------------------------

PTDP_KFN size_t GemmPackFloats(int64_t m, int64_t n, int64_t k) {
  const int64_t kc = Min64(kKc, k);
  return size_t(kc * (RoundUp(Min64(kNc, n), kNr) + RoundUp(Min64(kMc, m), kMr) * kSplat));
}

// dst[q * ldd + r] = src[r * ld + q] for r < rows, q < kc: a transposing copy, 4 x 4 blocks at
// a time (Isa::Transpose4).
PTDP_KFN void TransposeCopy(const float* src, int64_t ld, int64_t rows, int64_t kc, float* dst,
                            int64_t ldd) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    int64_t q = 0;
    for (; q + 4 <= kc; q += 4) Isa::Transpose4(src + r * ld + q, ld, dst + q * ldd + r, ldd);
    for (; q < kc; ++q)
      for (int64_t t = 0; t < 4; ++t) dst[q * ldd + r + t] = src[(r + t) * ld + q];
  }
  for (; r < rows; ++r)
    for (int64_t q = 0; q < kc; ++q) dst[q * ldd + r] = src[r * ld + q];
}

// The k range [*q0, *q1) of a (kc)-deep block starting at p0 that the micro-tile of rows
// [i0, i0 + kMr) reads: all of it, or the part a triangular A is not zero in.
PTDP_KINLINE void TileKRange(const GemmArgs& g, int64_t i0, int64_t p0, int64_t kc, int64_t* q0,
                             int64_t* q1) {
  *q0 = 0, *q1 = kc;
  if (g.a_tri == Triangle::kLower) *q1 = Max64(0, Min64(kc, i0 + kMr - p0));  // p <= i0 + kMr - 1
  if (g.a_tri == Triangle::kUpper) *q0 = Min64(kc, Max64(0, i0 - p0));        // p >= i0
}

// dst[q * kMr + r] = op(A)(i0 + r, p0 + q) for r < kMr and q in the tile's k range (TileKRange;
// the rest of dst is not written): rows past m and entries outside a_tri are 0.
PTDP_KFN void PackA(const GemmArgs& g, int64_t i0, int64_t p0, int64_t kc, float* dst) {
  const int64_t rows = Min64(kMr, g.m - i0);
  int64_t q0 = 0, q1 = 0;
  TileKRange(g, i0, p0, kc, &q0, &q1);
  const int64_t n = q1 - q0;
  if (n <= 0) return;
  float* d = dst + q0 * kMr;
  if (g.a_cs == 1) {  // A stored row-major: each row is contiguous along p
    TransposeCopy(g.a + i0 * g.a_rs + p0 + q0, g.a_rs, rows, n, d, kMr);
  } else if (g.a_rs == 1 && rows == kMr) {  // stored transposed: kMr contiguous floats per p
    for (int64_t q = 0; q < n; ++q) {
      const float* src = g.a + (p0 + q0 + q) * g.a_cs + i0;
#pragma GCC unroll 16
      for (int r = 0; r < kMr; ++r) d[q * kMr + r] = src[r];
    }
  } else {
    for (int64_t q = 0; q < n; ++q) {
      const float* src = g.a + (p0 + q0 + q) * g.a_cs + i0 * g.a_rs;
      for (int64_t r = 0; r < rows; ++r) d[q * kMr + r] = src[r * g.a_rs];
    }
  }
  for (int64_t r = rows; r < kMr; ++r)
    for (int64_t q = 0; q < n; ++q) d[q * kMr + r] = 0.0f;
  if (g.a_tri == Triangle::kNone) return;
  // Inside the range only a band along the diagonal is outside the triangle.
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;  // kLower keeps p <= i, kUpper keeps p >= i
    const int64_t lo = g.a_tri == Triangle::kLower ? Max64(q0, i + 1 - p0) : q0;
    const int64_t hi = g.a_tri == Triangle::kLower ? q1 : Min64(q1, Max64(q0, i - p0));
    for (int64_t q = lo; q < hi; ++q) dst[q * kMr + r] = 0.0f;
  }
}

PTDP_KFN void PackAPanel(const GemmArgs& g, int64_t i0, int64_t p0, int64_t kc, float* dst) {
  PackA(g, i0, p0, kc, dst);
  if (kSplat == 1) return;
  int64_t q0 = 0, q1 = 0;
  TileKRange(g, i0, p0, kc, &q0, &q1);
  for (int64_t e = q1 * kMr; e-- > q0 * kMr;)
    Isa::Store(dst + e * kSplat, Isa::Set(dst[e]));  // in place, from the end
}

// dst[q * kNr + c] = op(B)(p0 + q, j0 + c) for q < kc, c < kNr; columns past n are 0.
PTDP_KFN void PackB(const GemmArgs& g, int64_t p0, int64_t kc, int64_t j0, float* dst) {
  const int64_t cols = Min64(kNr, g.n - j0);
  if (g.b_cs == 1) {  // B stored row-major: kNr contiguous floats per p
    for (int64_t q = 0; q < kc; ++q) {
      const float* src = g.b + (p0 + q) * g.b_rs + j0;
      float* d = dst + q * kNr;
      if (cols == kNr) {
        Isa::Store(d, Isa::Load(src));
        Isa::Store(d + kW, Isa::Load(src + kW));
      } else {
        for (int64_t c = 0; c < cols; ++c) d[c] = src[c];
        for (int64_t c = cols; c < kNr; ++c) d[c] = 0.0f;
      }
    }
    return;
  }
  if (g.b_rs == 1) {  // B stored transposed: each column contiguous along p
    TransposeCopy(g.b + p0 + j0 * g.b_cs, g.b_cs, cols, kc, dst, kNr);
  } else {
    for (int64_t c = 0; c < cols; ++c) {
      const float* src = g.b + p0 * g.b_rs + (j0 + c) * g.b_cs;
      for (int64_t q = 0; q < kc; ++q) dst[q * kNr + c] = src[q * g.b_rs];
    }
  }
  for (int64_t c = cols; c < kNr; ++c)
    for (int64_t q = 0; q < kc; ++q) dst[q * kNr + c] = 0.0f;
}

// C tile (rows x cols of it are real, rows ldc apart) = alpha * a b (+ the tile unless
// `overwrite`), where a is a packed (kc, kMr) panel of A and b a packed (kc, kNr) panel of B.
PTDP_KFN void MicroKernel(int64_t kc, const float* a, const float* b, float alpha, bool overwrite,
                          float* c, int64_t ldc, int64_t rows, int64_t cols) {
  V acc0[kMr], acc1[kMr];
#pragma GCC unroll 16
  for (int r = 0; r < kMr; ++r) acc0[r] = acc1[r] = Isa::Zero();
  for (int64_t q = 0; q < kc; ++q) {
    const V b0 = Isa::Load(b + q * kNr);
    const V b1 = Isa::Load(b + q * kNr + kW);
#pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r) {
      const V ar = kSplat == 1 ? Isa::Set(a[q * kMr + r]) : Isa::Load(a + (q * kMr + r) * kSplat);
      acc0[r] = Isa::Fma(ar, b0, acc0[r]);
      acc1[r] = Isa::Fma(ar, b1, acc1[r]);
    }
  }
  const V va = Isa::Set(alpha);
  if (rows == kMr && cols == kNr && overwrite) {
#pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r) {
      Isa::Store(c + r * ldc, Isa::Mul(va, acc0[r]));
      Isa::Store(c + r * ldc + kW, Isa::Mul(va, acc1[r]));
    }
    return;
  }
  if (rows == kMr && cols == kNr) {
#pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r) {
      float* cr = c + r * ldc;
      Isa::Store(cr, Isa::Add(Isa::Load(cr), Isa::Mul(va, acc0[r])));
      Isa::Store(cr + kW, Isa::Add(Isa::Load(cr + kW), Isa::Mul(va, acc1[r])));
    }
    return;
  }
  alignas(64) float tile[kMr * kNr];
  for (int r = 0; r < kMr; ++r) {
    Isa::Store(tile + r * kNr, Isa::Mul(va, acc0[r]));
    Isa::Store(tile + r * kNr + kW, Isa::Mul(va, acc1[r]));
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      c[r * ldc + j] = overwrite ? tile[r * kNr + j] : c[r * ldc + j] + tile[r * kNr + j];
    }
  }
}

// C = alpha op(A) op(B) + beta C, one (kKc x kNc) block of B and (kMc x kKc) block of A at a
// time: the first k block overwrites C when beta is 0 (so C is never read), the others add to it.
// `pack` holds GemmPackFloats(m, n, k) floats.
PTDP_KFN void Gemm(const GemmArgs& g, float* pack) {
  if (g.beta != 0.0f && g.beta != 1.0f) {
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) g.c[i * g.ldc + j] *= g.beta;
  }
  if (g.k == 0) {
    if (g.beta == 0.0f)
      for (int64_t i = 0; i < g.m; ++i)
        for (int64_t j = 0; j < g.n; ++j) g.c[i * g.ldc + j] = 0.0f;
    return;
  }
  float* bp = pack;  // (kc, RoundUp(nc, kNr)) as kNr-wide panels
  float* ap = pack + Min64(kKc, g.k) * RoundUp(Min64(kNc, g.n), kNr);
  for (int64_t jc = 0; jc < g.n; jc += kNc) {
    const int64_t nc = Min64(kNc, g.n - jc);
    for (int64_t pc = 0; pc < g.k; pc += kKc) {
      const int64_t kc = Min64(kKc, g.k - pc);
      const bool overwrite = pc == 0 && g.beta == 0.0f;
      for (int64_t jr = 0; jr < nc; jr += kNr) PackB(g, pc, kc, jc + jr, bp + jr * kc);
      for (int64_t ic = 0; ic < g.m; ic += kMc) {
        const int64_t mc = Min64(kMc, g.m - ic);
        for (int64_t ir = 0; ir < mc; ir += kMr)
          PackAPanel(g, ic + ir, pc, kc, ap + ir * kc * kSplat);
        for (int64_t jr = 0; jr < nc; jr += kNr) {
          for (int64_t ir = 0; ir < mc; ir += kMr) {
            const int64_t i0 = ic + ir, j0 = jc + jr;
            if (g.c_lower && j0 > i0 + kMr - 1) continue;  // the whole tile is above the diagonal
            // An empty k range (a triangular A's zeros) still runs, with kc 0, when it has to
            // write the tile's zeros.
            int64_t q0 = 0, q1 = 0;
            TileKRange(g, i0, pc, kc, &q0, &q1);
            if (q1 <= q0 && !overwrite) continue;
            MicroKernel(Max64(0, q1 - q0), ap + (ir * kc + q0 * kMr) * kSplat,
                        bp + jr * kc + q0 * kNr, g.alpha, overwrite, g.c + i0 * g.ldc + j0, g.ldc,
                        Min64(kMr, g.m - i0), Min64(kNr, g.n - j0));
          }
        }
      }
    }
  }
}

// ---- tanh and GeLU ------------------------------------------------------------------------------
// tanh(x) = x + x^3 P(x^2) for |x| < 0.5, P the degree-4 Chebyshev fit of (tanh(x) - x) / x^3 on
// x^2 in [0, 0.25] (mpmath.chebyfit; the fit's own error is 7e-10 on tanh), and
// sign(x) (1 - 2 / (exp(2|x|) + 1)) above, with |x| clamped to 10 (tanh(10) rounds to 1 in fp32).
// exp(y), y in [1, 20]: y = n ln2 + r (Cody-Waite, ln2 split in a 9-bit head and a tail, so n
// ln2_hi is exact), e^r by its Taylor polynomial to r^7 (|r| <= ln2/2: truncation 5e-9 relative),
// times 2^n through the exponent bits. Against std::tanh in double on [-12, 12]: at most 8.6e-8
// absolute and 1.7e-7 relative, about 2 ulp (tests/runtime/cpu_kernels_test.cc).

PTDP_KINLINE V ExpV(V y) {  // y in [0, 20]
  const V n = Isa::Round(Isa::Mul(y, Isa::Set(1.44269504088896341f)));
  V r = Isa::Sub(y, Isa::Mul(n, Isa::Set(0.693359375f)));
  r = Isa::Sub(r, Isa::Mul(n, Isa::Set(-2.12194440e-4f)));
  V p = Isa::Set(1.0f / 5040.0f);
  p = Isa::Fma(p, r, Isa::Set(1.0f / 720.0f));
  p = Isa::Fma(p, r, Isa::Set(1.0f / 120.0f));
  p = Isa::Fma(p, r, Isa::Set(1.0f / 24.0f));
  p = Isa::Fma(p, r, Isa::Set(1.0f / 6.0f));
  p = Isa::Fma(p, r, Isa::Set(0.5f));
  p = Isa::Fma(p, r, Isa::Set(1.0f));
  p = Isa::Fma(p, r, Isa::Set(1.0f));
  return Isa::Mul(p, Isa::Pow2(n));
}

PTDP_KINLINE V TanhV(V x) {
  const V ax = Isa::Abs(x);
  const V t = Isa::Mul(x, x);
  V p = Isa::Set(-0.00694294175042f);
  p = Isa::Fma(p, t, Isa::Set(0.0214706830253f));
  p = Isa::Fma(p, t, Isa::Set(-0.053933469146f));
  p = Isa::Fma(p, t, Isa::Set(0.133332257755f));
  p = Isa::Fma(p, t, Isa::Set(-0.333333327966f));
  const V small = Isa::Fma(Isa::Mul(x, t), p, x);
  // Min(10, ax) returns ax when it is NaN, so NaN stays NaN.
  const V y = Isa::Mul(Isa::Min(Isa::Set(10.0f), ax), Isa::Set(2.0f));
  const V big =
      Isa::Sub(Isa::Set(1.0f), Isa::Div(Isa::Set(2.0f), Isa::Add(ExpV(y), Isa::Set(1.0f))));
  return Isa::Select(Isa::Less(ax, Isa::Set(0.5f)), small, Isa::CopySign(big, x));
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCube = 0.044715f;

PTDP_KINLINE V GeluV(V v) {
  const V cube = Isa::Mul(Isa::Mul(Isa::Mul(Isa::Set(kGeluCube), v), v), v);
  const V t = TanhV(Isa::Mul(Isa::Set(kGeluScale), Isa::Add(v, cube)));
  return Isa::Mul(Isa::Mul(Isa::Set(0.5f), v), Isa::Add(Isa::Set(1.0f), t));
}

// gelu'(v) = 0.5 (1 + t) + 0.5 v (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 v^2), t = tanh(...).
PTDP_KINLINE V GeluGradV(V v) {
  const V cube = Isa::Mul(Isa::Mul(Isa::Mul(Isa::Set(kGeluCube), v), v), v);
  const V t = TanhV(Isa::Mul(Isa::Set(kGeluScale), Isa::Add(v, cube)));
  const V sech2 = Isa::Sub(Isa::Set(1.0f), Isa::Mul(t, t));
  const V inner = Isa::Add(Isa::Set(1.0f), Isa::Mul(Isa::Mul(Isa::Set(3.0f * kGeluCube), v), v));
  const V half = Isa::Set(0.5f);
  return Isa::Add(
      Isa::Mul(half, Isa::Add(Isa::Set(1.0f), t)),
      Isa::Mul(Isa::Mul(Isa::Mul(Isa::Mul(half, v), sech2), Isa::Set(kGeluScale)), inner));
}

PTDP_KINLINE V Tanh1(V x, V) { return TanhV(x); }
PTDP_KINLINE V Gelu1(V x, V) { return GeluV(x); }
PTDP_KINLINE V GeluGradTimes(V x, V dy) { return Isa::Mul(GeluGradV(x), dy); }

// out[i] = F(x[i], z[i]) (z may be null when F ignores it; out may alias x or z). The last
// n % kW elements go through the same vector code on a zero-padded copy, so that an element's
// result never depends on where it sits.
template <V (*F)(V, V)>
PTDP_KFN void Map(const float* x, const float* z, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + kW <= n; i += kW)
    Isa::Store(out + i, F(Isa::Load(x + i), Isa::Load(z ? z + i : x + i)));
  if (i == n) return;
  alignas(64) float bx[kW] = {}, bz[kW] = {};
  for (int64_t j = i; j < n; ++j) bx[j - i] = x[j], bz[j - i] = z ? z[j] : 0.0f;
  Isa::Store(bx, F(Isa::Load(bx), Isa::Load(bz)));
  for (int64_t j = i; j < n; ++j) out[j] = bx[j - i];
}

PTDP_KFN void Tanh(const float* x, float* y, int64_t n) { Map<Tanh1>(x, nullptr, y, n); }
PTDP_KFN void GeluForward(const float* x, float* y, int64_t n) { Map<Gelu1>(x, nullptr, y, n); }
PTDP_KFN void GeluBackward(const float* dy, const float* x, float* dx, int64_t n) {
  Map<GeluGradTimes>(x, dy, dx, n);
}

// ---- AdamW --------------------------------------------------------------------------------------
// The scalar formula's operations in its order, one IEEE rounding each (no FMA; sqrt and division
// are exact-rounded in SIMD too): every level gives the same bits as the formula in
// runtime/backend.h. The tail goes through the same code on zero-padded copies.

struct AdamWConsts {
  V b1, b2, one_minus_b1, one_minus_b2, bc1, bc2, lr, eps, wd, gs;
};

PTDP_KINLINE void AdamWV(const AdamWConsts& c, float* p, const float* g, float* m, float* v) {
  const V gi = Isa::Mul(Isa::Load(g), c.gs);
  const V mi = Isa::Add(Isa::Mul(c.b1, Isa::Load(m)), Isa::Mul(c.one_minus_b1, gi));
  const V vi = Isa::Add(Isa::Mul(c.b2, Isa::Load(v)), Isa::Mul(Isa::Mul(c.one_minus_b2, gi), gi));
  Isa::Store(m, mi);
  Isa::Store(v, vi);
  const V m_hat = Isa::Div(mi, c.bc1);
  const V v_hat = Isa::Div(vi, c.bc2);
  const V pi = Isa::Load(p);
  const V step = Isa::Add(Isa::Div(m_hat, Isa::Add(Isa::Sqrt(v_hat), c.eps)), Isa::Mul(c.wd, pi));
  Isa::Store(p, Isa::Sub(pi, Isa::Mul(c.lr, step)));
}

PTDP_KFN void AdamW(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                    float beta2, float eps, float weight_decay, float grad_scale, float bc1,
                    float bc2) {
  const AdamWConsts c = {Isa::Set(beta1),        Isa::Set(beta2), Isa::Set(1.0f - beta1),
                         Isa::Set(1.0f - beta2), Isa::Set(bc1),   Isa::Set(bc2),
                         Isa::Set(lr),           Isa::Set(eps),   Isa::Set(weight_decay),
                         Isa::Set(grad_scale)};
  int64_t i = 0;
  for (; i + kW <= n; i += kW) AdamWV(c, p + i, g + i, m + i, v + i);
  if (i == n) return;
  alignas(64) float bp[kW] = {}, bg[kW] = {}, bm[kW] = {}, bv[kW] = {};
  for (int64_t j = i; j < n; ++j)
    bp[j - i] = p[j], bg[j - i] = g[j], bm[j - i] = m[j], bv[j - i] = v[j];
  AdamWV(c, bp, bg, bm, bv);
  for (int64_t j = i; j < n; ++j) p[j] = bp[j - i], m[j] = bm[j - i], v[j] = bv[j - i];
}

constexpr CpuKernels kKernels = {Isa::kLevel, Isa::kName,  GemmPackFloats, Gemm,
                                 Tanh,        GeluForward, GeluBackward,   AdamW};
