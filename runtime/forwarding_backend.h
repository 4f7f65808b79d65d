// A Backend that passes every call to another one: the base of decorators at the Backend seam
// (test doubles, tests/fakes/poison_backend.h), which override the calls they change and reach
// the wrapped backend through inner().
#pragma once

#include <memory>
#include <utility>

#include "runtime/backend.h"

namespace ptdp::rt {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> inner) : in_(std::move(inner)) {}
  const char* Name() const override { return in_->Name(); }
  Result<Tensor> Alloc(const Shape& shape, DType dtype) override { return in_->Alloc(shape, dtype); }
  Result<Tensor> AllocUninit(const Shape& shape, DType dtype) override {
    return in_->AllocUninit(shape, dtype);
  }
  size_t CurrentBytes() const override { return in_->CurrentBytes(); }
  size_t PeakBytes() const override { return in_->PeakBytes(); }
  void ResetPeak() override { in_->ResetPeak(); }
  Status Synchronize() override { return in_->Synchronize(); }
  int Mark() override { return in_->Mark(); }
  double MarkSeconds(int a, int b) override { return in_->MarkSeconds(a, b); }
  void ClearMarks() override { in_->ClearMarks(); }
  Status CopyFromHost(const float* src, Tensor& dst) override { return in_->CopyFromHost(src, dst); }
  Status CopyFromHost(const int32_t* src, Tensor& dst) override { return in_->CopyFromHost(src, dst); }
  Status CopyToHost(const Tensor& src, float* dst) override { return in_->CopyToHost(src, dst); }
  Status CopyToHost(const Tensor& src, int32_t* dst) override { return in_->CopyToHost(src, dst); }
  void Matmul(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, float alpha,
              float beta) override {
    in_->Matmul(a, ta, b, tb, c, alpha, beta);
  }
  void MatmulBatched(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, float alpha,
                     float beta) override {
    in_->MatmulBatched(a, ta, b, tb, c, alpha, beta);
  }
  void MatmulBias(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& bias,
                  Tensor& c) override {
    in_->MatmulBias(a, ta, b, tb, bias, c);
  }
  void MatmulBiasGelu(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& bias,
                      Tensor& pre, Tensor& act) override {
    in_->MatmulBiasGelu(a, ta, b, tb, bias, pre, act);
  }
  void MatmulGeluBackward(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& pre,
                          Tensor& dx) override {
    in_->MatmulGeluBackward(a, ta, b, tb, pre, dx);
  }
  void AddBias(Tensor& y, const Tensor& bias) override { in_->AddBias(y, bias); }
  void AddBiasResidual(Tensor& x, const Tensor& bias, const Tensor& residual) override {
    in_->AddBiasResidual(x, bias, residual);
  }
  void AddBiasResidualLayerNorm(Tensor& x, const Tensor& bias, const Tensor& residual,
                                const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                Tensor& mean, Tensor& rstd) override {
    in_->AddBiasResidualLayerNorm(x, bias, residual, gamma, beta, eps, y, mean, rstd);
  }
  void BiasGrad(const Tensor& dy, Tensor& dbias) override { in_->BiasGrad(dy, dbias); }
  void LayerNormForward(const Tensor& x, const Tensor& g, const Tensor& b, float eps, Tensor& y,
                        Tensor& mean, Tensor& rstd) override {
    in_->LayerNormForward(x, g, b, eps, y, mean, rstd);
  }
  void LayerNormBackward(const Tensor& dy, const Tensor& x, const Tensor& g, const Tensor& mean,
                         const Tensor& rstd, Tensor& dx, Tensor& dg, Tensor& db) override {
    in_->LayerNormBackward(dy, x, g, mean, rstd, dx, dg, db);
  }
  void GeluForward(const Tensor& x, Tensor& y) override { in_->GeluForward(x, y); }
  void GeluBackward(const Tensor& dy, const Tensor& x, Tensor& dx) override {
    in_->GeluBackward(dy, x, dx);
  }
  Shape AttentionSavedShape(int64_t b, int64_t s, int64_t nh, int64_t d) const override {
    return in_->AttentionSavedShape(b, s, nh, d);
  }
  bool FusesGemmEpilogues(DType act) const override { return in_->FusesGemmEpilogues(act); }
  void AttentionForward(const Tensor& qkv, int64_t nh, TokenOrder o, Tensor& out,
                        Tensor& saved) override {
    in_->AttentionForward(qkv, nh, o, out, saved);
  }
  void AttentionBackward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                         const Tensor& saved, int64_t nh, TokenOrder o, Tensor& dqkv) override {
    in_->AttentionBackward(dout, qkv, out, saved, nh, o, dqkv);
  }
  void AttentionBlockForward(const Tensor& qkv, const SeqBlock& qp, const Tensor& kv,
                             const SeqBlock& kp, int64_t nh, bool first, Tensor& out,
                             Tensor& lse) override {
    in_->AttentionBlockForward(qkv, qp, kv, kp, nh, first, out, lse);
  }
  void AttentionBlockBackward(const Tensor& dout, const Tensor& qkv, const SeqBlock& qp,
                              const Tensor& kv, const SeqBlock& kp, const Tensor& out,
                              const Tensor& lse, int64_t nh, Tensor& dqkv, Tensor& dkv) override {
    in_->AttentionBlockBackward(dout, qkv, qp, kv, kp, out, lse, nh, dqkv, dkv);
  }
  void ScaleRows(const Tensor& x, const Tensor& s, Tensor& out) override {
    in_->ScaleRows(x, s, out);
  }
  void RowDot(const Tensor& a, const Tensor& b, Tensor& out) override { in_->RowDot(a, b, out); }
  void CopyColumns(const Tensor& src, int64_t sc, Tensor& dst, int64_t dc, int64_t n) override {
    in_->CopyColumns(src, sc, dst, dc, n);
  }
  void EmbeddingForward(const Tensor& tokens, const Tensor& table, int64_t start,
                        Tensor& out) override {
    in_->EmbeddingForward(tokens, table, start, out);
  }
  void EmbeddingBackward(const Tensor& dout, const Tensor& tokens, int64_t start,
                         Tensor& dtable) override {
    in_->EmbeddingBackward(dout, tokens, start, dtable);
  }
  void CrossEntropyMax(const Tensor& logits, Tensor& row_max) override {
    in_->CrossEntropyMax(logits, row_max);
  }
  void CrossEntropySumExp(const Tensor& logits, const Tensor& row_max, Tensor& sum_exp) override {
    in_->CrossEntropySumExp(logits, row_max, sum_exp);
  }
  void CrossEntropyTarget(const Tensor& logits, const Tensor& targets, int64_t start,
                          Tensor& target_logit) override {
    in_->CrossEntropyTarget(logits, targets, start, target_logit);
  }
  void CrossEntropyLoss(const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
                        Tensor& loss) override {
    in_->CrossEntropyLoss(row_max, sum_exp, target_logit, loss);
  }
  void CrossEntropyBackward(const Tensor& logits, const Tensor& targets, int64_t start,
                            const Tensor& row_max, const Tensor& sum_exp, float scale,
                            Tensor& dlogits) override {
    in_->CrossEntropyBackward(logits, targets, start, row_max, sum_exp, scale, dlogits);
  }
  void Add(const Tensor& a, const Tensor& b, Tensor& out) override { in_->Add(a, b, out); }
  void Axpy(float alpha, const Tensor& x, Tensor& y) override { in_->Axpy(alpha, x, y); }
  void Scale(float alpha, Tensor& x) override { in_->Scale(alpha, x); }
  void Fill(float value, Tensor& x) override { in_->Fill(value, x); }
  void Copy(const Tensor& src, Tensor& dst) override { in_->Copy(src, dst); }
  void SumSquares(const Tensor& x, Tensor& out) override { in_->SumSquares(x, out); }
  void Sum(const Tensor& x, Tensor& out) override { in_->Sum(x, out); }
  void AdamW(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
             const AdamWConfig& cfg) override {
    in_->AdamW(param, grad, m, v, cfg);
  }

 protected:
  Backend& inner() { return *in_; }

 private:
  std::unique_ptr<Backend> in_;
};

}  // namespace ptdp::rt
