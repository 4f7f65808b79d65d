// The lane-to-element functions of the register-resident flash kernels
// (runtime/cuda/flash_fragments.h), checked on the host: ldmatrix.x4 and mma.sync.m16n8k16 are
// emulated here as PTX ISA defines them (the fragment tables quoted at each function), and the
// kernels' two products (MmaScores: S = A B^T; MmaAccumulate: O += P V with P taken from S's
// accumulator registers) are composed from the header's functions exactly as
// flash_attention.cu composes them, then compared with the products computed directly. A wrong
// row or column in the header gives a wrong product here, with no GPU. What this cannot check:
// that the PTX tables are transcribed right (they are the instructions' documented contract;
// the GPU tests of tests/runtime/cuda check the kernels themselves).
#include "runtime/cuda/flash_fragments.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace ptdp::rt::cuda {
namespace {

namespace f = fragments;
using Pair = std::array<double, 2>;  // a 32-bit register of two 16-bit elements, low first
using Regs = std::array<std::array<Pair, 4>, 32>;  // four registers of each of 32 lanes

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane l gives the address of row l % 8 of
// matrix l / 8 (8 consecutive elements); register i of lane 4g + t receives matrix i's elements
// (row g, columns 2t and 2t+1), or with .trans (rows 2t and 2t+1, column g).
Regs LdMatrixX4(const std::vector<double>& smem, const std::array<int, 32>& addr, bool trans) {
  Regs r{};
  for (int i = 0; i < 4; ++i)
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, t = lane % 4;
      for (int e = 0; e < 2; ++e) {
        const int row = trans ? 2 * t + e : g, col = trans ? g : 2 * t + e;
        r[size_t(lane)][size_t(i)][size_t(e)] = smem[size_t(addr[size_t(8 * i + row)] + col)];
      }
    }
  return r;
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, d = a b + c, for lane 4g + t:
// a: {a0, a1} (g, 2t..2t+1), {a2, a3} (g+8, 2t..), {a4, a5} (g, 2t+8..), {a6, a7} (g+8, 2t+8..);
// b: {b0, b1} (k 2t..2t+1, n g), {b2, b3} (k 2t+8.., n g);
// c, d: c0, c1 (g, 2t..2t+1), c2, c3 (g+8, 2t..2t+1).
using Acc = std::array<std::array<double, 4>, 32>;
void Mma(Acc& c, const std::array<std::array<Pair, 4>, 32>& a,
         const std::array<std::array<Pair, 2>, 32>& b) {
  double A[16][16] = {}, B[16][8] = {};
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    const auto& ra = a[size_t(lane)];
    const auto& rb = b[size_t(lane)];
    for (int e = 0; e < 2; ++e) {
      A[g][2 * t + e] = ra[0][size_t(e)];
      A[g + 8][2 * t + e] = ra[1][size_t(e)];
      A[g][2 * t + 8 + e] = ra[2][size_t(e)];
      A[g + 8][2 * t + 8 + e] = ra[3][size_t(e)];
      B[2 * t + e][g] = rb[0][size_t(e)];
      B[2 * t + 8 + e][g] = rb[1][size_t(e)];
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
      double sum = 0;
      for (int k = 0; k < 16; ++k) sum += A[row][k] * B[k][col];
      c[size_t(lane)][size_t(e)] += sum;
    }
  }
}

std::array<std::array<Pair, 2>, 32> BOperand(const Regs& r, int first) {
  std::array<std::array<Pair, 2>, 32> b{};
  for (int lane = 0; lane < 32; ++lane)
    b[size_t(lane)] = {r[size_t(lane)][size_t(first)], r[size_t(lane)][size_t(first + 1)]};
  return b;
}

// A row-major tile of `rows` x `cols` in "shared memory" with row length ld, and its values.
struct Tile {
  int rows, cols, ld, base;
  std::vector<std::vector<double>> v;
};

constexpr int kD = 64, kLd = kD + 8;  // the kernels' padded row length for D = 64

// MmaScores as flash_attention.cu composes it: s (eight 16 x 8 tiles) = a (16 x D rows from
// a.base) times b^T (b: 64 x D).
std::array<Acc, 8> Scores(const std::vector<double>& smem, const Tile& a, const Tile& b) {
  std::array<Acc, 8> s{};
  for (int kk = 0; kk < kD / 16; ++kk) {
    std::array<int, 32> addr_a{};
    for (int lane = 0; lane < 32; ++lane)
      addr_a[size_t(lane)] = a.base + f::ARow(lane) * kLd + 16 * kk + f::ACol(lane);
    const Regs fa = LdMatrixX4(smem, addr_a, false);
    for (int np = 0; np < 4; ++np) {
      std::array<int, 32> addr_b{};
      for (int lane = 0; lane < 32; ++lane)
        addr_b[size_t(lane)] =
            b.base + (16 * np + f::BtRow(lane)) * kLd + 16 * kk + f::BtCol(lane);
      const Regs fb = LdMatrixX4(smem, addr_b, false);
      Mma(s[size_t(2 * np)], fa, BOperand(fb, 0));
      Mma(s[size_t(2 * np + 1)], fa, BOperand(fb, 2));
    }
  }
  return s;
}

// MmaAccumulate: acc (D/8 tiles) += p (the accumulator tiles of Scores) times b (64 x D).
void Accumulate(const std::vector<double>& smem, const std::array<Acc, 8>& p, const Tile& b,
                std::array<Acc, kD / 8>& acc) {
  for (int kk = 0; kk < 4; ++kk) {
    std::array<std::array<Pair, 4>, 32> fa{};
    for (int lane = 0; lane < 32; ++lane)
      for (int r = 0; r < 4; ++r) {
        const auto& tile = p[size_t(f::AccTileOfReg(kk, r))][size_t(lane)];
        fa[size_t(lane)][size_t(r)] = {tile[size_t(f::AccElemOfReg(r))],
                                       tile[size_t(f::AccElemOfReg(r) + 1)]};
      }
    for (int np = 0; np < kD / 16; ++np) {
      std::array<int, 32> addr{};
      for (int lane = 0; lane < 32; ++lane)
        addr[size_t(lane)] = b.base + (16 * kk + f::BRow(lane)) * kLd + 16 * np + f::BCol(lane);
      const Regs fb = LdMatrixX4(smem, addr, true);
      Mma(acc[size_t(2 * np)], fa, BOperand(fb, 0));
      Mma(acc[size_t(2 * np + 1)], fa, BOperand(fb, 2));
    }
  }
}

// The 16 x (8 tiles) matrix lane registers hold, through CRow/CCol.
template <size_t N>
std::vector<std::vector<double>> Gather(const std::array<Acc, N>& tiles) {
  std::vector<std::vector<double>> m(16, std::vector<double>(8 * N, NAN));
  for (size_t n = 0; n < N; ++n)
    for (int lane = 0; lane < 32; ++lane)
      for (int e = 0; e < 4; ++e)
        m[size_t(f::CRow(lane, e))][8 * n + size_t(f::CCol(lane, e))] = tiles[n][size_t(lane)][size_t(e)];
  return m;
}

Tile Place(std::vector<double>& smem, int base, int rows, std::mt19937& rng) {
  std::uniform_int_distribution<int> small(-8, 8);  // exact products and sums in double
  Tile t{rows, kD, kLd, base, std::vector<std::vector<double>>(size_t(rows), std::vector<double>(kD))};
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < kD; ++c) smem[size_t(base + r * kLd + c)] = t.v[size_t(r)][size_t(c)] = small(rng);
  for (int r = 0; r < rows; ++r)  // the padding columns hold garbage the kernels never read
    for (int c = kD; c < kLd; ++c) smem[size_t(base + r * kLd + c)] = 1e9;
  return t;
}

TEST(FlashFragments, TheKernelsProductsAreTheMatrixProducts) {
  std::mt19937 rng(7);
  std::vector<double> smem(size_t(3 * 64 * kLd), NAN);
  const Tile q = Place(smem, 0, 64, rng), k = Place(smem, 64 * kLd, 64, rng),
             v = Place(smem, 2 * 64 * kLd, 64, rng);
  for (int warp = 0; warp < 4; ++warp) {
    Tile a = q;
    a.base = 16 * warp * kLd;  // the warp's 16 rows, as the kernels pass qs + 16 warp ld
    const std::array<Acc, 8> s = Scores(smem, a, k);
    const auto got_s = Gather(s);
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 64; ++j) {
        double want = 0;
        for (int c = 0; c < kD; ++c) want += q.v[size_t(16 * warp + i)][size_t(c)] * k.v[size_t(j)][size_t(c)];
        ASSERT_EQ(got_s[size_t(i)][size_t(j)], want) << "S = Q K^T, warp " << warp << " (" << i << ", " << j << ")";
      }
    std::array<Acc, kD / 8> o{};
    Accumulate(smem, s, v, o);
    const auto got_o = Gather(o);
    for (int i = 0; i < 16; ++i)
      for (int c = 0; c < kD; ++c) {
        double want = 0;
        for (int j = 0; j < 64; ++j) want += got_s[size_t(i)][size_t(j)] * v.v[size_t(j)][size_t(c)];
        ASSERT_EQ(got_o[size_t(i)][size_t(c)], want) << "O = S V, warp " << warp << " (" << i << ", " << c << ")";
      }
  }
}

TEST(FlashFragments, EachLaneHoldsEachAccumulatorElementOnce) {
  // CRow/CCol cover a 16 x 8 tile exactly once over 32 lanes x 4 registers; the ldmatrix
  // addresses of one x4 load are 32 distinct 8-element rows; each register's pair of an A
  // fragment taken from accumulators is two adjacent columns of one row.
  int seen[16][8] = {};
  for (int lane = 0; lane < 32; ++lane)
    for (int e = 0; e < 4; ++e) ++seen[f::CRow(lane, e)][f::CCol(lane, e)];
  for (auto& row : seen)
    for (int x : row) EXPECT_EQ(x, 1);
  using Fn = int (*)(int);
  for (auto [row_of, col_of] : {std::pair<Fn, Fn>{f::ARow, f::ACol},
                                std::pair<Fn, Fn>{f::BtRow, f::BtCol},
                                std::pair<Fn, Fn>{f::BRow, f::BCol}}) {
    int starts[16][2] = {};
    for (int lane = 0; lane < 32; ++lane) ++starts[row_of(lane)][col_of(lane) / 8];
    for (auto& r : starts) EXPECT_TRUE(r[0] == 1 && r[1] == 1);
  }
  for (int r = 0; r < 4; ++r)
    for (int lane = 0; lane < 32; ++lane)
      EXPECT_EQ(f::CCol(lane, f::AccElemOfReg(r) + 1), f::CCol(lane, f::AccElemOfReg(r)) + 1);
}

}  // namespace
}  // namespace ptdp::rt::cuda
