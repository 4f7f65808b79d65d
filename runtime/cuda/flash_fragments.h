// Which element of a tile each lane of a warp gives or holds in the register-resident flash
// kernels (flash_attention.cu, FlashVariant::kMma): PTX's mma.sync.aligned.m16n8k16 (bf16
// inputs, fp32 accumulators) and ldmatrix.sync.aligned.m8n8.x4 (PTX ISA, "Warp-level matrix
// fragments for mma.m16n8k16 with floating point type" and "ldmatrix"). Plain C++ (host and
// device), so that tests/runtime/flash_fragments_test.cc checks these very functions on any
// machine against an emulation of the two instructions, as PTX defines them.
//
// The PTX facts used: lane l = 4g + t (g = l / 4, t = l % 4)
// - holds accumulator elements (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1) of a 16 x 8 tile;
// - gives for the A operand (16 x 16) the pairs (g, 2t..), (g+8, 2t..), (g, 8+2t..), (g+8, 8+2t..)
//   in its four registers, and for the B operand (16 x 8, k x n) (2t.., g), (8+2t.., g);
// - ldmatrix.x4: lane l gives the address of row l % 8 of 8x8 matrix l / 8 (8 consecutive
//   16-bit elements); register i of lane 4g + t receives matrix i's (g, 2t), (g, 2t+1), or with
//   .trans (2t, g), (2t+1, g).
#pragma once

#if defined(__CUDACC__)
#define PTDP_FRAGMENT_FN __host__ __device__ __forceinline__ constexpr
#else
#define PTDP_FRAGMENT_FN inline constexpr
#endif

namespace ptdp::rt::cuda::fragments {

// ldmatrix.x4 of the A operand (16 x 16, row-major in shared memory): the row and the first
// column of the 8 elements whose address lane l gives. Matrices 0..3 are rows 0-7 / 8-15 of
// columns 0-7, then of columns 8-15: registers 0..3 are the A fragment as mma.sync takes it.
PTDP_FRAGMENT_FN int ARow(int lane) { return lane % 8 + 8 * ((lane / 8) % 2); }
PTDP_FRAGMENT_FN int ACol(int lane) { return 8 * (lane / 16); }

// ldmatrix.x4 of two B operands (k 16 x n 8 each) from a row-major b (n rows, k columns), i.e.
// B = b^T (S = Q K^T reads K this way): the row (n) and first column (k) lane l addresses.
// Registers 0, 1 are b0, b1 of the n-tile of rows 0-7; registers 2, 3 those of rows 8-15.
PTDP_FRAGMENT_FN int BtRow(int lane) { return 8 * (lane / 16) + lane % 8; }
PTDP_FRAGMENT_FN int BtCol(int lane) { return 8 * ((lane / 8) % 2); }

// ldmatrix.x4.trans of two B operands from a row-major b of k rows and n columns, i.e. B = b
// (P V reads V this way): the row (k) and first column (n) lane l addresses. Registers 0, 1 are
// b0, b1 of the n-tile of columns 0-7; registers 2, 3 those of columns 8-15.
PTDP_FRAGMENT_FN int BRow(int lane) { return lane % 8 + 8 * ((lane / 8) % 2); }
PTDP_FRAGMENT_FN int BCol(int lane) { return 8 * (lane / 16); }

// Element e (0..3) of lane l's accumulator registers of a 16 x 8 tile: its row and column.
PTDP_FRAGMENT_FN int CRow(int lane, int e) { return lane / 4 + 8 * (e / 2); }
PTDP_FRAGMENT_FN int CCol(int lane, int e) { return 2 * (lane % 4) + e % 2; }

// The A fragment of k-step kk of a product whose A is a 16 x 64 accumulator (P V, dS K, ...):
// register r (0..3) packs elements 2 (r % 2) and 2 (r % 2) + 1 of accumulator tile
// AccTileOfReg(kk, r): tiles 2kk and 2kk+1 are columns 16kk .. 16kk + 15.
PTDP_FRAGMENT_FN int AccTileOfReg(int kk, int r) { return 2 * kk + r / 2; }
PTDP_FRAGMENT_FN int AccElemOfReg(int r) { return 2 * (r % 2); }

}  // namespace ptdp::rt::cuda::fragments

#undef PTDP_FRAGMENT_FN
