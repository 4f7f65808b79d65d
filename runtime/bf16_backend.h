// Megatron's --bf16 mixed precision, emulated on any backend: the wrapped backend computes in
// fp32 (fp32 accumulation, as tensor cores accumulate bf16 products) and this decorator rounds
// to bf16 (Backend::RoundToBf16, nearest even) every tensor a bf16 run stores in bf16:
//
//   rounded (bf16 storage)                         kept fp32
//   GEMM outputs written fresh (beta 0): logits,   GEMMs accumulating (beta != 0): the weight
//     QKV, projections, fc1/fc2, their input         gradients (Megatron's main_grad, fp32 with
//     gradients (dgrad)                              --accumulate-allreduce-grads-in-fp32)
//   bias adds, residual adds, LayerNorm outputs    LayerNorm mean / rstd and its weight grads,
//     and input gradients, GeLU and its gradient     bias gradients (BiasGrad), embedding grads
//   attention output and its QKV gradient          attention statistics (lse, probabilities:
//   ScaleRows (MoE combine weights applied)          a fused kernel keeps them in fp32)
//   the logits' gradient (CrossEntropyBackward)    cross entropy's max / sum / loss, reductions
//                                                  AdamW and its state, gradient scaling
//
// The weights are bf16 copies of fp32 main weights: the trainer keeps the main weights, runs
// AdamW on them and rounds the copies (runtime/trainer.cc, TrainerConfig::bf16). The GEMM
// inputs are then bf16 values, so an fp32 GEMM on them is a bf16 GEMM with fp32 accumulation.
// Not rounded: the context-parallel ring's per-block outputs and gradients (merged in fp32, as
// Transformer Engine's CP does) and embedding row gathers / scatters (they move rounded values).
// The CPU backend under this decorator is the reference of a native bf16 CUDA path: the same
// rounding points, so the two agree to fp32 summation order plus, rarely, one bf16 step where an
// element lands on a rounding boundary.
#pragma once

#include <memory>
#include <utility>

#include "runtime/forwarding_backend.h"

namespace ptdp::rt {

class Bf16Backend final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;

  void Matmul(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, float alpha,
              float beta) override {
    inner().Matmul(a, ta, b, tb, c, alpha, beta);
    if (beta == 0.0f) inner().RoundToBf16(c);
  }
  void MatmulBatched(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, float alpha,
                     float beta) override {
    inner().MatmulBatched(a, ta, b, tb, c, alpha, beta);
    if (beta == 0.0f) inner().RoundToBf16(c);
  }
  void AddBias(Tensor& y, const Tensor& bias) override {
    inner().AddBias(y, bias);
    inner().RoundToBf16(y);
  }
  void LayerNormForward(const Tensor& x, const Tensor& g, const Tensor& b, float eps, Tensor& y,
                        Tensor& mean, Tensor& rstd) override {
    inner().LayerNormForward(x, g, b, eps, y, mean, rstd);
    inner().RoundToBf16(y);
  }
  void LayerNormBackward(const Tensor& dy, const Tensor& x, const Tensor& g, const Tensor& mean,
                         const Tensor& rstd, Tensor& dx, Tensor& dg, Tensor& db) override {
    inner().LayerNormBackward(dy, x, g, mean, rstd, dx, dg, db);
    inner().RoundToBf16(dx);
  }
  void GeluForward(const Tensor& x, Tensor& y) override {
    inner().GeluForward(x, y);
    inner().RoundToBf16(y);
  }
  void GeluBackward(const Tensor& dy, const Tensor& x, Tensor& dx) override {
    inner().GeluBackward(dy, x, dx);
    inner().RoundToBf16(dx);
  }
  void AttentionForward(const Tensor& qkv, int64_t nh, TokenOrder o, Tensor& out,
                        Tensor& saved) override {
    inner().AttentionForward(qkv, nh, o, out, saved);
    inner().RoundToBf16(out);
  }
  void AttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                         const Tensor& saved, int64_t nh, TokenOrder o, Tensor& dqkv) override {
    inner().AttentionBackward(dout, qkv, out, saved, nh, o, dqkv);
    inner().RoundToBf16(dqkv);
  }
  void ScaleRows(const Tensor& x, const Tensor& s, Tensor& out) override {
    inner().ScaleRows(x, s, out);
    inner().RoundToBf16(out);
  }
  void CrossEntropyBackward(const Tensor& logits, const Tensor& targets, int64_t start,
                            const Tensor& row_max, const Tensor& sum_exp, float scale,
                            Tensor& dlogits) override {
    inner().CrossEntropyBackward(logits, targets, start, row_max, sum_exp, scale, dlogits);
    inner().RoundToBf16(dlogits);
  }
  void Add(const Tensor& a, const Tensor& b, Tensor& out) override {
    inner().Add(a, b, out);
    inner().RoundToBf16(out);
  }
};

}  // namespace ptdp::rt
