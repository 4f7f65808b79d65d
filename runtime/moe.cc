// GptChunk's MoE MLP (Megatron-Core's MoELayer with the all-to-all token dispatcher,
// megatron/core/transformer/moe/: router.py, token_dispatcher.py, experts.py, shared_experts.py),
// dropless: every token goes to its top-k experts, whatever the layout, so the results do not
// depend on ep or etp.
//
// Forward, per rank (letters as gpt_internal.h's MoeSaved):
//   router    logits = x W_r^T (n, E) in fp32; top-k per token (ties: the lower expert);
//             softmax: probabilities = softmax over the k chosen logits (Megatron's default,
//             no pre-softmax); sigmoid: the chosen sigmoid scores normalised to sum 1 (k > 1)
//   aux loss  Switch Transformer's load balancing (switch_load_balancing_loss_func):
//             coeff E / (N^2 k) sum_e (sum_n P[n, e]) count_e over the micro-batch's N = b S
//             tokens (counts summed over TP x CP, the ranks holding them), P the softmax (or
//             normalised sigmoid) of all E logits; its gradient is formed here and added to the
//             router's in the backward, weighted as the micro-batch's LM loss (1/m)
//   dispatch  the n k assignments sorted by expert (so by EP rank, experts [i G, (i+1) G) on EP
//             rank i), their token rows all-to-all over EP with per-rank counts; with expert TP
//             every rank of the ETP group gathers the others' received rows (all-gather-v)
//   experts   rows regrouped expert by expert; per local expert fc1 (Fe = f_e/etp, column
//             parallel over ETP), GeLU, fc2 (row parallel): partial sums over ETP
//   combine   the partials summed over ETP (reduce-scatter-v, ranks in group order), all-to-all
//             back, each assignment's output times its probability, added per token in choice
//             order; plus the shared experts (a dense MLP over TP, no bias)
// The backward runs the same exchanges in reverse order (the dispatch's counts).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "runtime/gpt_internal.h"

namespace ptdp::rt {
namespace {

// The k largest of z[0..E), largest first, ties to the lower index (`order`: E scratch slots).
void TopK(const float* z, int64_t E, int64_t k, int32_t* idx, std::vector<int32_t>& order) {
  order.resize(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return z[a] > z[b] || (z[a] == z[b] && a < b);
  });
  std::copy(order.begin(), order.begin() + k, idx);
}

double Sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

std::vector<int64_t> Prefix(const std::vector<int64_t>& counts) {
  std::vector<int64_t> at(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) at[i + 1] = at[i] + counts[i];
  return at;
}

std::vector<int64_t> Times(std::vector<int64_t> v, int64_t f) {
  for (int64_t& x : v) x *= f;
  return v;
}

}  // namespace

Status GptChunk::AllGatherRows(Communicator& comm, const Tensor& mine,
                               const std::vector<int64_t>& counts, int64_t w, Tensor& out) {
  const int n = comm.size(), me = comm.rank();
  const std::vector<int64_t> at = Prefix(counts);
  const int64_t own = counts[size_t(me)] * w;
  if (own > 0) {
    Tensor dst = out.View(Shape({own}), at[size_t(me)] * w);
    be_.Copy(mine.View(Shape({own})), dst);
  }
  if (n == 1) return Status::Ok();
  PTDP_RETURN_IF_ERROR(comm.GroupStart());
  Status st;
  const Tensor flat = own > 0 ? mine.View(Shape({own})) : Tensor();
  for (int q = 0; q < n && st.ok(); ++q)
    if (q != me && own > 0) st = comm.Send(flat, q);
  for (int q = 0; q < n && st.ok(); ++q) {
    if (q == me || counts[size_t(q)] == 0) continue;
    Tensor block = out.View(Shape({counts[size_t(q)] * w}), at[size_t(q)] * w);
    st = comm.Recv(block, q);
  }
  const Status end = comm.GroupEnd();
  return st.ok() ? end : st;
}

Status GptChunk::ReduceScatterRows(Communicator& comm, const Tensor& all,
                                   const std::vector<int64_t>& counts, int64_t w, Tensor& out) {
  const int n = comm.size(), me = comm.rank();
  const std::vector<int64_t> at = Prefix(counts);
  const int64_t own = counts[size_t(me)] * w;
  std::vector<Tensor> parts(static_cast<size_t>(n));
  if (own > 0) parts[size_t(me)] = all.View(Shape({own}), at[size_t(me)] * w);
  if (n > 1) {
    for (int q = 0; q < n; ++q) {
      if (q == me || own == 0) continue;
      PTDP_ASSIGN_OR_RETURN(parts[size_t(q)], Out({own}));
    }
    PTDP_RETURN_IF_ERROR(comm.GroupStart());
    Status st;
    for (int q = 0; q < n && st.ok(); ++q)
      if (q != me && counts[size_t(q)] > 0)
        st = comm.Send(all.View(Shape({counts[size_t(q)] * w}), at[size_t(q)] * w), q);
    for (int q = 0; q < n && st.ok(); ++q)
      if (q != me && own > 0) st = comm.Recv(parts[size_t(q)], q);
    const Status end = comm.GroupEnd();
    PTDP_RETURN_IF_ERROR(st);
    PTDP_RETURN_IF_ERROR(end);
  }
  if (own == 0) return Status::Ok();
  Tensor dst = out.View(Shape({own}));
  be_.Copy(parts[0], dst);  // the ranks' partials in group order, the same on every rank
  for (int q = 1; q < n; ++q) be_.Add(dst, parts[size_t(q)], dst);
  return Status::Ok();
}

Result<Tensor> GptChunk::MoeRows(int64_t rows, int64_t cols) {
  PTDP_ASSIGN_OR_RETURN(Tensor t, Out({std::max<int64_t>(rows, 1), cols}));
  return t.View(Shape({rows, cols}));
}

Result<Tensor> GptChunk::MoeGather(const Tensor& src, const Tensor& idx, int64_t cols) {
  PTDP_ASSIGN_OR_RETURN(Tensor out, MoeRows(idx.numel(), cols));
  if (idx.numel() > 0) be_.EmbeddingForward(idx, src, 0, out);  // out[i] = src[idx[i]]
  return out;
}

Result<Tensor> GptChunk::MoeExchange(const Tensor& in, const std::vector<int64_t>& send,
                                     const std::vector<int64_t>& recv, int64_t out_rows,
                                     const char* what) {
  if (cfg_.ep == 1) return in;
  PTDP_ASSIGN_OR_RETURN(Tensor out, MoeRows(out_rows, h_));
  Tensor fin = in.View(Shape({in.numel()})), fout = out.View(Shape({out.numel()}));
  PTDP_RETURN_IF_ERROR(
      ep_comm_->AllToAll(fin, Times(send, h_), fout, Times(recv, h_)).Prefixed(what));
  return out;
}

Result<Tensor> GptChunk::MoeEtpGather(const Tensor& recv, const MoeSaved& sv, const char* what) {
  if (cfg_.etp == 1) return recv;
  const int64_t R = std::accumulate(sv.etp_rows.begin(), sv.etp_rows.end(), int64_t(0));
  PTDP_ASSIGN_OR_RETURN(Tensor gathered, MoeRows(R, h_));
  PTDP_RETURN_IF_ERROR(
      AllGatherRows(*etp_comm_, recv, sv.etp_rows, h_, gathered).Prefixed(what));
  return gathered;
}

Result<Tensor> GptChunk::MoeEtpReduce(const Tensor& gathered, const MoeSaved& sv,
                                      const char* what) {
  if (cfg_.etp == 1) return gathered;
  PTDP_ASSIGN_OR_RETURN(Tensor recv, MoeRows(sv.etp_rows[size_t(etp_comm_->rank())], h_));
  PTDP_RETURN_IF_ERROR(
      ReduceScatterRows(*etp_comm_, gathered, sv.etp_rows, h_, recv).Prefixed(what));
  return recv;
}

Result<Tensor> GptChunk::MoeForward(const LayerRefs& w, const Tensor& x, const Tensor& x_full,
                                    MoeSaved& sv) {
  const ModelSpec& m = cfg_.model;
  const int64_t n = Rows(x), E = m.num_experts, k = m.moe_topk, G = E / cfg_.ep;
  const int64_t fe = m.moe_ffn_hidden / cfg_.etp, nk = n * k;
  const int ep = cfg_.ep, etp = cfg_.etp;
  sv.x = x;
  sv.aux_scale = loss_scale_;
  // Router (fp32 logits, as Megatron's --moe-router-dtype fp32), top-k on the host.
  PTDP_ASSIGN_OR_RETURN(Tensor logits, Stat({n, E}));
  be_.Matmul(x, false, w.router->value, true, logits);
  std::vector<float> z(size_t(n * E));
  PTDP_RETURN_IF_ERROR(be_.CopyToHost(logits, z.data()));
  const bool sigmoid = m.moe_router == MoeRouter::kSigmoid;
  sv.choice.assign(size_t(nk), 0);
  sv.prob.assign(size_t(nk), 0.0f);
  sv.score.assign(sigmoid ? size_t(nk) : 0, 0.0f);
  std::vector<int64_t> count(size_t(E), 0);
  std::vector<int32_t> order_scratch;
  std::vector<double> v(static_cast<size_t>(k));  // the chosen experts' scores
  for (int64_t t = 0; t < n; ++t) {
    const float* zt = z.data() + t * E;
    int32_t* idx = sv.choice.data() + t * k;
    TopK(zt, E, k, idx, order_scratch);
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      v[size_t(j)] = sigmoid ? Sigmoid(zt[idx[j]]) : std::exp(double(zt[idx[j]]) - zt[idx[0]]);
      sum += v[size_t(j)];
      ++count[size_t(idx[j])];
    }
    for (int64_t j = 0; j < k; ++j) {
      if (sigmoid) sv.score[size_t(t * k + j)] = float(v[size_t(j)]);
      sv.prob[size_t(t * k + j)] =
          float(sigmoid && k == 1 ? v[0] : v[size_t(j)] / (sum + (sigmoid ? 1e-20 : 0.0)));
    }
  }
  // The auxiliary loss's gradient of the logits.
  sv.aux_dlogits.clear();
  if (m.moe_aux_loss_coeff > 0) {
    std::vector<float> cnt(count.begin(), count.end());
    int group = 1;
    if (tokens_comm_ && tokens_comm_->size() > 1) {
      PTDP_ASSIGN_OR_RETURN(Tensor c, Stat({E}));  // counts: fp32 holds them exactly
      PTDP_RETURN_IF_ERROR(be_.CopyFromHost(cnt.data(), c));
      PTDP_RETURN_IF_ERROR(tokens_comm_->AllReduce(c, ReduceOp::kSum).Prefixed("MoE aux loss"));
      PTDP_RETURN_IF_ERROR(be_.CopyToHost(c, cnt.data()));
      group = tokens_comm_->size();
    }
    const double N = double(n) * group;
    const double coef = m.moe_aux_loss_coeff * double(E) / (N * N * double(k)) * sv.aux_scale;
    sv.aux_dlogits.assign(size_t(n * E), 0.0);
    std::vector<double> p(static_cast<size_t>(E)), s(static_cast<size_t>(E));
    for (int64_t t = 0; t < n; ++t) {
      const float* zt = z.data() + t * E;
      double total = 0, mx = zt[0];
      for (int64_t e = 1; e < E; ++e) mx = std::max(mx, double(zt[e]));
      for (int64_t e = 0; e < E; ++e) {
        s[size_t(e)] = sigmoid ? Sigmoid(zt[e]) : std::exp(double(zt[e]) - mx);
        total += s[size_t(e)];
      }
      if (sigmoid) total += 1e-20;
      double dot = 0;  // sum_e P_e dP_e with dP_e = coef count_e
      for (int64_t e = 0; e < E; ++e) {
        p[size_t(e)] = s[size_t(e)] / total;
        dot += p[size_t(e)] * coef * cnt[size_t(e)];
      }
      double* dz = sv.aux_dlogits.data() + t * E;
      for (int64_t e = 0; e < E; ++e) {
        const double dp = coef * cnt[size_t(e)];
        // softmax: P (dP - P.dP); sigmoid: (dP - P.dP) / total, through s (1 - s).
        dz[e] = sigmoid ? (dp - dot) / total * s[size_t(e)] * (1 - s[size_t(e)])
                        : p[size_t(e)] * (dp - dot);
      }
    }
  }
  PTDP_ASSIGN_OR_RETURN(sv.prob_dev, F32({std::max<int64_t>(nk, 1)}));
  sv.prob_dev = sv.prob_dev.View(Shape({nk}));
  if (nk > 0) PTDP_RETURN_IF_ERROR(be_.CopyFromHost(sv.prob.data(), sv.prob_dev));

  // Dispatch order: assignments by expert (hence by EP rank), each expert's in assignment order.
  const size_t nks = static_cast<size_t>(nk);
  std::vector<int32_t> order(nks), send_of(nks), send_token(nks), a_token(nks);
  {
    std::vector<int64_t> next = Prefix(count);
    for (int64_t a = 0; a < nk; ++a)
      order[size_t(next[size_t(sv.choice[size_t(a)])]++)] = int32_t(a);
  }
  for (int64_t i = 0; i < nk; ++i) {
    send_of[size_t(order[size_t(i)])] = int32_t(i);
    send_token[size_t(i)] = int32_t(order[size_t(i)] / k);
    a_token[size_t(i)] = int32_t(i / k);
  }
  PTDP_ASSIGN_OR_RETURN(sv.send_assignment, I32(order));
  PTDP_ASSIGN_OR_RETURN(sv.send_of, I32(send_of));
  PTDP_ASSIGN_OR_RETURN(sv.send_token, I32(send_token));
  PTDP_ASSIGN_OR_RETURN(sv.assignment_token, I32(a_token));
  sv.send_rows.assign(size_t(ep), 0);
  for (int64_t e = 0; e < E; ++e) sv.send_rows[size_t(e / G)] += count[size_t(e)];
  // Each EP rank learns how many rows of each of its experts every other rank sends.
  std::vector<int32_t> mine_counts(count.begin(), count.end()), recv_counts(size_t(ep * G));
  if (ep > 1) {
    PTDP_ASSIGN_OR_RETURN(Tensor cin, I32(mine_counts));
    PTDP_ASSIGN_OR_RETURN(Tensor cout, I32(recv_counts));
    PTDP_RETURN_IF_ERROR(ep_comm_->AllToAll(cin, std::vector<int64_t>(size_t(ep), G), cout,
                                            std::vector<int64_t>(size_t(ep), G))
                             .Prefixed("MoE dispatch counts"));
    PTDP_RETURN_IF_ERROR(be_.CopyToHost(cout, recv_counts.data()));
  } else {
    recv_counts = mine_counts;
  }
  sv.recv_rows.assign(size_t(ep), 0);
  for (int r = 0; r < ep; ++r)
    for (int64_t g = 0; g < G; ++g) sv.recv_rows[size_t(r)] += recv_counts[size_t(r * G + g)];
  // Expert TP: every ETP rank's received counts, (q, r, g).
  std::vector<int32_t> all_counts = recv_counts;
  if (etp > 1) {
    all_counts.assign(size_t(etp * ep * G), 0);
    PTDP_ASSIGN_OR_RETURN(Tensor cin, I32(recv_counts));
    PTDP_ASSIGN_OR_RETURN(Tensor cout, I32(all_counts));
    PTDP_RETURN_IF_ERROR(etp_comm_->AllGather(cin, cout).Prefixed("MoE expert-TP counts"));
    PTDP_RETURN_IF_ERROR(be_.CopyToHost(cout, all_counts.data()));
  }
  sv.etp_rows.assign(size_t(etp), 0);
  for (int q = 0; q < etp; ++q)
    for (int64_t i = 0; i < ep * G; ++i)
      sv.etp_rows[size_t(q)] += all_counts[size_t(q * ep * G + i)];
  // Expert-major order of the gathered rows: for each local expert, its rows from (q, r).
  const int64_t R = std::accumulate(sv.etp_rows.begin(), sv.etp_rows.end(), int64_t(0));
  std::vector<int32_t> expert_order, gathered_order(static_cast<size_t>(R));
  expert_order.reserve(size_t(R));
  sv.expert_rows.assign(size_t(G), 0);
  {
    std::vector<int64_t> start(size_t(etp * ep * G) + 1, 0);  // gathered row of block (q, r, g)
    for (size_t i = 0; i + 1 < start.size(); ++i) start[i + 1] = start[i] + all_counts[i];
    for (int64_t g = 0; g < G; ++g)
      for (int q = 0; q < etp; ++q)
        for (int r = 0; r < ep; ++r) {
          const size_t blk = size_t((q * ep + r) * G + g);
          for (int64_t i = 0; i < all_counts[blk]; ++i) {
            gathered_order[size_t(start[blk] + i)] = int32_t(expert_order.size());
            expert_order.push_back(int32_t(start[blk] + i));
          }
          sv.expert_rows[size_t(g)] += all_counts[blk];
        }
  }
  PTDP_ASSIGN_OR_RETURN(sv.expert_order, I32(expert_order));
  PTDP_ASSIGN_OR_RETURN(sv.gathered_order, I32(gathered_order));

  // Token rows out, over EP, gathered over ETP, regrouped by expert.
  const int64_t R_ep = std::accumulate(sv.recv_rows.begin(), sv.recv_rows.end(), int64_t(0));
  PTDP_ASSIGN_OR_RETURN(Tensor x_send, MoeGather(x, sv.send_token, h_));
  PTDP_ASSIGN_OR_RETURN(Tensor x_recv,
                        MoeExchange(x_send, sv.send_rows, sv.recv_rows, R_ep,
                                    "MoE all-to-all"));
  PTDP_ASSIGN_OR_RETURN(Tensor x_gathered, MoeEtpGather(x_recv, sv, "MoE expert-TP all-gather"));
  PTDP_ASSIGN_OR_RETURN(sv.xe, MoeGather(x_gathered, sv.expert_order, h_));
  PTDP_ASSIGN_OR_RETURN(sv.ze, MoeRows(R, fe));
  PTDP_ASSIGN_OR_RETURN(sv.ae, MoeRows(R, fe));
  PTDP_ASSIGN_OR_RETURN(Tensor ye, MoeRows(R, h_));
  int64_t row0 = 0;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t r = sv.expert_rows[size_t(g)];
    if (r == 0) continue;
    Tensor xg = sv.xe.View(Shape({r, h_}), row0 * h_);
    Tensor zg = sv.ze.View(Shape({r, fe}), row0 * fe), ag = sv.ae.View(Shape({r, fe}), row0 * fe);
    Tensor yg = ye.View(Shape({r, h_}), row0 * h_);
    be_.Matmul(xg, false, w.expert_fc1[size_t(g)]->value, true, zg);
    be_.GeluForward(zg, ag);
    be_.Matmul(ag, false, w.expert_fc2[size_t(g)]->value, true, yg);
    row0 += r;
  }
  // Back: partial sums over ETP, over EP, to assignment order, weighted, added per token.
  PTDP_ASSIGN_OR_RETURN(Tensor y_gathered, MoeGather(ye, sv.gathered_order, h_));
  PTDP_ASSIGN_OR_RETURN(Tensor y_recv,
                        MoeEtpReduce(y_gathered, sv, "MoE expert-TP reduce-scatter"));
  PTDP_ASSIGN_OR_RETURN(Tensor y_send,
                        MoeExchange(y_recv, sv.recv_rows, sv.send_rows, nk,
                                    "MoE all-to-all"));
  PTDP_ASSIGN_OR_RETURN(sv.y, MoeGather(y_send, sv.send_of, h_));
  PTDP_ASSIGN_OR_RETURN(Tensor weighted, MoeRows(nk, h_));
  if (nk > 0) be_.ScaleRows(sv.y, sv.prob_dev, weighted);
  PTDP_ASSIGN_OR_RETURN(Tensor out, F32({n, h_}));  // zeroed
  if (nk > 0) be_.EmbeddingBackward(weighted, sv.assignment_token, 0, out);
  // Shared experts: a dense MLP over TP (column- then row-parallel), no bias.
  if (w.shared_fc1) {
    const int64_t nf = Rows(x_full), fs = w.shared_fc1->value.shape()[0];
    sv.x_full = x_full;
    PTDP_ASSIGN_OR_RETURN(sv.shared_z, Out({nf, fs}));
    PTDP_ASSIGN_OR_RETURN(sv.shared_a, Out({nf, fs}));
    be_.Matmul(x_full, false, w.shared_fc1->value, true, sv.shared_z);
    be_.GeluForward(sv.shared_z, sv.shared_a);
    PTDP_ASSIGN_OR_RETURN(Tensor partial, Out({nf, h_}));
    be_.Matmul(sv.shared_a, false, w.shared_fc2->value, true, partial);
    PTDP_ASSIGN_OR_RETURN(Tensor shared, ReduceSeq(partial));
    be_.Add(out, shared, out);
  }
  return ToAct(out);  // summed in fp32 over the choices and the shared experts
}

Result<Tensor> GptChunk::MoeBackward(const LayerRefs& w, const Tensor& dout,
                                     const MoeSaved& sv) {
  const ModelSpec& m = cfg_.model;
  const int64_t n = Rows(sv.x), E = m.num_experts, k = m.moe_topk, G = E / cfg_.ep;
  const int64_t fe = m.moe_ffn_hidden / cfg_.etp, nk = n * k;
  const int64_t R = std::accumulate(sv.etp_rows.begin(), sv.etp_rows.end(), int64_t(0));
  const int64_t R_ep = std::accumulate(sv.recv_rows.begin(), sv.recv_rows.end(), int64_t(0));
  PTDP_ASSIGN_OR_RETURN(Tensor dx, F32({n, h_}));  // zeroed; every part adds to it
  // Shared experts.
  if (w.shared_fc1) {
    const int64_t nf = Rows(sv.x_full), fs = w.shared_fc1->value.shape()[0];
    PTDP_ASSIGN_OR_RETURN(Tensor dfull, GatherSeq(dout));
    be_.Matmul(dfull, true, sv.shared_a, false, w.shared_fc2->grad, 1.0f, 1.0f);
    PTDP_ASSIGN_OR_RETURN(Tensor da, Out({nf, fs}));
    be_.Matmul(dfull, false, w.shared_fc2->value, false, da);
    be_.GeluBackward(da, sv.shared_z, da);
    be_.Matmul(da, true, sv.x_full, false, w.shared_fc1->grad, 1.0f, 1.0f);
    PTDP_ASSIGN_OR_RETURN(Tensor dxf, Out({nf, h_}));
    be_.Matmul(da, false, w.shared_fc1->value, false, dxf);
    PTDP_ASSIGN_OR_RETURN(Tensor dxs, ReduceSeq(dxf));
    be_.Add(dx, dxs, dx);
  }
  // The combine's backward: each assignment's output gradient, and its probability's.
  PTDP_ASSIGN_OR_RETURN(Tensor dy, MoeGather(dout, sv.assignment_token, h_));
  PTDP_ASSIGN_OR_RETURN(Tensor dprob, Stat({std::max<int64_t>(nk, 1)}));
  std::vector<float> dprob_host(size_t(nk), 0.0f);
  if (nk > 0) {
    Tensor dp = dprob.View(Shape({nk}));
    be_.RowDot(dy, sv.y, dp);
    PTDP_RETURN_IF_ERROR(be_.CopyToHost(dp, dprob_host.data()));
    be_.ScaleRows(dy, sv.prob_dev, dy);
  }
  // Out to the experts as in the forward, their backward, and back.
  PTDP_ASSIGN_OR_RETURN(Tensor dy_send, MoeGather(dy, sv.send_assignment, h_));
  PTDP_ASSIGN_OR_RETURN(Tensor dy_recv,
                        MoeExchange(dy_send, sv.send_rows, sv.recv_rows, R_ep,
                                    "MoE all-to-all (backward)"));
  PTDP_ASSIGN_OR_RETURN(Tensor dy_gathered,
                        MoeEtpGather(dy_recv, sv, "MoE expert-TP all-gather (backward)"));
  PTDP_ASSIGN_OR_RETURN(Tensor dye, MoeGather(dy_gathered, sv.expert_order, h_));
  PTDP_ASSIGN_OR_RETURN(Tensor dxe, MoeRows(R, h_));
  int64_t row0 = 0;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t r = sv.expert_rows[size_t(g)];
    if (r == 0) continue;
    ChunkParam& fc1 = *w.expert_fc1[size_t(g)];
    ChunkParam& fc2 = *w.expert_fc2[size_t(g)];
    const Tensor dyg = dye.View(Shape({r, h_}), row0 * h_);
    const Tensor xg = sv.xe.View(Shape({r, h_}), row0 * h_);
    const Tensor zg = sv.ze.View(Shape({r, fe}), row0 * fe);
    const Tensor ag = sv.ae.View(Shape({r, fe}), row0 * fe);
    be_.Matmul(dyg, true, ag, false, fc2.grad, 1.0f, 1.0f);
    PTDP_ASSIGN_OR_RETURN(Tensor da, Out({r, fe}));
    be_.Matmul(dyg, false, fc2.value, false, da);
    be_.GeluBackward(da, zg, da);
    be_.Matmul(da, true, xg, false, fc1.grad, 1.0f, 1.0f);
    Tensor dxg = dxe.View(Shape({r, h_}), row0 * h_);
    be_.Matmul(da, false, fc1.value, false, dxg);
    row0 += r;
  }
  PTDP_ASSIGN_OR_RETURN(Tensor dx_gathered, MoeGather(dxe, sv.gathered_order, h_));
  PTDP_ASSIGN_OR_RETURN(Tensor dx_recv,
                        MoeEtpReduce(dx_gathered, sv, "MoE expert-TP reduce-scatter (backward)"));
  PTDP_ASSIGN_OR_RETURN(Tensor dx_send,
                        MoeExchange(dx_recv, sv.recv_rows, sv.send_rows, nk,
                                    "MoE all-to-all (backward)"));
  PTDP_ASSIGN_OR_RETURN(Tensor dx_a, MoeGather(dx_send, sv.send_of, h_));
  if (nk > 0) be_.EmbeddingBackward(dx_a, sv.assignment_token, 0, dx);
  // The router: the top-k probabilities' backward (and the auxiliary loss's), then its GEMMs.
  const bool sigmoid = m.moe_router == MoeRouter::kSigmoid;
  std::vector<float> dz(size_t(n * E), 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    const float* p = sv.prob.data() + t * k;
    const float* dp = dprob_host.data() + t * k;
    const int32_t* idx = sv.choice.data() + t * k;
    double dot = 0;
    for (int64_t j = 0; j < k; ++j) dot += double(p[j]) * dp[j];
    double total = 0;
    if (sigmoid)
      for (int64_t j = 0; j < k; ++j) total += sv.score[size_t(t * k + j)];
    for (int64_t j = 0; j < k; ++j) {
      double g;
      if (!sigmoid) {
        g = p[j] * (dp[j] - dot);
      } else {
        const double s = sv.score[size_t(t * k + j)];
        const double ds = k == 1 ? dp[j] : (dp[j] - dot) / (total + 1e-20);
        g = ds * s * (1 - s);
      }
      dz[size_t(t * E + idx[j])] += float(g);
    }
    if (!sv.aux_dlogits.empty())
      for (int64_t e = 0; e < E; ++e)
        dz[size_t(t * E + e)] += float(sv.aux_dlogits[size_t(t * E + e)]);
  }
  PTDP_ASSIGN_OR_RETURN(Tensor dlogits, Out({n, E}));
  PTDP_RETURN_IF_ERROR(be_.CopyFromHost(dz.data(), dlogits));
  be_.Matmul(dlogits, true, sv.x, false, w.router->grad, 1.0f, 1.0f);
  be_.Matmul(dlogits, false, w.router->value, false, dx, 1.0f, 1.0f);
  return ToAct(dx);
}

}  // namespace ptdp::rt
