// Schedule: builds each pipeline rank's op list for GPipe, 1F1B and interleaved 1F1B in
// Megatron-LM's order (megatron/core/pipeline_parallel/schedules.py), and proves a schedule
// sound by matching every send with its receive and executing all ranks under blocking,
// grouped p2p semantics. Letters: p pipeline ranks, v chunks per rank, m micro-batches,
// g interleaving group size, T = m*v virtual micro-batches, W warmup, R = T - W steady.
//
//   virtual stage s = c*p + r; chunk c of rank p-1 feeds chunk c+1 of rank 0 (v = 2 here):
//
//              rank0       rank1     ...   rank p-1
//     chunk0   s=0    -->  s=1    --> ...  s=p-1   --+   activations follow the arrows,
//     chunk1   s=p    -->  s=p+1  --> ...  s=2p-1    |   gradients go back against them
//               ^----------------------------------<-+
#include "core/schedule.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <unordered_set>
#include <vector>

namespace ptdp {

const char* ToString(OpKind k) {
  switch (k) {
    case OpKind::kForward: return "forward";
    case OpKind::kBackward: return "backward";
    case OpKind::kSendActivation: return "send-activation";
    case OpKind::kRecvActivation: return "recv-activation";
    case OpKind::kSendGradient: return "send-gradient";
    case OpKind::kRecvGradient: return "recv-gradient";
    case OpKind::kReduceGradients: return "reduce-gradients";
    case OpKind::kReduceEmbedding: return "reduce-embedding";
    case OpKind::kOptimizerStep: return "optimizer-step";
  }
  return "?";
}

namespace {

bool IsP2pKind(OpKind k) {
  return k == OpKind::kSendActivation || k == OpKind::kRecvActivation ||
         k == OpKind::kSendGradient || k == OpKind::kRecvGradient;
}

// "F3" (v == 1) or "F3.1": the compute op a tensor belongs to. Gradients name the backward.
std::string ComputeLabel(bool backward, int mb, int chunk, int vp) {
  std::string s = (backward ? "B" : "F") + std::to_string(mb);
  if (vp > 1) s += "." + std::to_string(chunk);
  return s;
}

// "F3.1", "recv-activation F3.1 from rank 1", "send-gradient B2 to rank 0", "optimizer-step".
std::string OpLabel(const ScheduleOp& op, int vp) {
  switch (op.kind) {
    case OpKind::kForward:
    case OpKind::kBackward:
      return ComputeLabel(op.kind == OpKind::kBackward, op.microbatch, op.chunk, vp);
    case OpKind::kSendActivation:
    case OpKind::kRecvActivation:
    case OpKind::kSendGradient:
    case OpKind::kRecvGradient: {
      const bool send = op.kind == OpKind::kSendActivation || op.kind == OpKind::kSendGradient;
      const bool grad = op.kind == OpKind::kSendGradient || op.kind == OpKind::kRecvGradient;
      return std::string(ToString(op.kind)) + " " +
             ComputeLabel(grad, op.microbatch, op.chunk, vp) + (send ? " to rank " : " from rank ") +
             std::to_string(op.peer);
    }
    default: return ToString(op.kind);
  }
}

// ---------------------------------------------------------------------------------------------
// Building

// One (micro-batch, chunk) pair; `valid` false for "nothing" (Megatron's recv_prev = False).
struct Slot {
  int mb = -1;
  int chunk = -1;
  bool valid = true;
};
constexpr Slot kNone{-1, -1, false};

// A p2p op before boundary filtering: kind and the local (micro-batch, chunk) of its tensor.
struct P2p {
  OpKind kind;
  Slot slot;
};

// Appends one rank's ops, numbering its p2p groups 0, 1, 2, ... in order.
class RankBuilder {
 public:
  RankBuilder(int p, int v, int r, std::vector<ScheduleOp>* out) : p_(p), v_(v), r_(r), out_(out) {}

  void Forward(Slot s) { out_->push_back({OpKind::kForward, s.mb, s.chunk, -1, -1}); }
  void Backward(Slot s) { out_->push_back({OpKind::kBackward, s.mb, s.chunk, -1, -1}); }

  // Posts `ops` as one group, dropping those that do not exist: no slot, or a tensor that
  // would leave the model (activation out of the last virtual stage, gradient out of the
  // first) or come from outside it. Posts nothing when every op dropped.
  void Post(std::initializer_list<P2p> ops) {
    bool any = false;
    for (const P2p& o : ops) {
      if (!o.slot.valid) continue;
      const int s = o.slot.chunk * p_ + r_;  // virtual stage of this rank's chunk
      const bool to_next = o.kind == OpKind::kSendActivation || o.kind == OpKind::kRecvGradient;
      const int other = to_next ? s + 1 : s - 1;
      if (other < 0 || other >= p_ * v_) continue;
      out_->push_back({o.kind, o.slot.mb, o.slot.chunk, other % p_, next_group_});
      any = true;
    }
    if (any) ++next_group_;
  }

  // kReduceGradients, kReduceEmbedding on the first and last rank (p > 1), kOptimizerStep.
  void EndOfStep() {
    out_->push_back({OpKind::kReduceGradients, -1, -1, -1, -1});
    if (p_ > 1 && (r_ == 0 || r_ == p_ - 1))
      out_->push_back({OpKind::kReduceEmbedding, -1, -1, -1, -1});
    out_->push_back({OpKind::kOptimizerStep, -1, -1, -1, -1});
  }

 private:
  int p_, v_, r_;
  std::vector<ScheduleOp>* out_;
  int next_group_ = 0;
};

P2p SendAct(Slot s) { return {OpKind::kSendActivation, s}; }
P2p RecvAct(Slot s) { return {OpKind::kRecvActivation, s}; }
P2p SendGrad(Slot s) { return {OpKind::kSendGradient, s}; }
P2p RecvGrad(Slot s) { return {OpKind::kRecvGradient, s}; }

// GPipe: every forward (receive, compute, send), then every backward in the same order.
void BuildGPipe(int p, int m, int r, std::vector<ScheduleOp>* out) {
  RankBuilder b(p, 1, r, out);
  for (int i = 0; i < m; ++i) {
    b.Post({RecvAct({i, 0})});
    b.Forward({i, 0});
    b.Post({SendAct({i, 0})});
  }
  for (int i = 0; i < m; ++i) {
    b.Post({RecvGrad({i, 0})});
    b.Backward({i, 0});
    b.Post({SendGrad({i, 0})});
  }
  b.EndOfStep();
}

}  // namespace

int64_t WarmupForwards(ScheduleKind kind, int64_t p, int64_t v, int64_t m, int64_t g, int64_t r,
                       bool a2a_overlap) {
  const int64_t total = m * v, extra = a2a_overlap ? 1 : 0;
  switch (kind) {
    case ScheduleKind::kGPipe: return total;
    case ScheduleKind::kOneFOneB: return std::min(p - r - 1 + extra, total);
    case ScheduleKind::kInterleaved:
      return std::min((p - r - 1) * 2 + (v - 1) * (g > 0 ? g : p) + extra, total);
  }
  return 0;
}

int64_t ForwardsOfChunk(int64_t m, int64_t v, int64_t g, int64_t n, int64_t c) {
  n = std::clamp<int64_t>(n, 0, m * v);
  const int64_t full = m / g;                     // groups of g micro-batches
  const int64_t rounds = std::min(n / (g * v), full);
  const int64_t rest = n - rounds * g * v;        // into the next group, chunk by chunk
  const int64_t size = rounds < full ? g : m % g;  // that group's micro-batches
  return rounds * g + std::clamp<int64_t>(rest - c * size, 0, size);
}

namespace {

// Sum of kept[] (or of the mirrored chunk's, for backwards) over a rank's first n forwards.
double KeptByForwards(int64_t m, int64_t v, int64_t g, int64_t n, bool mirror,
                      const std::vector<double>& kept) {
  double s = 0;
  for (int64_t c = 0; c < v; ++c)
    s += double(ForwardsOfChunk(m, v, g, n, c)) * kept[size_t(mirror ? v - 1 - c : c)];
  return s;
}

bool ChunksAlike(int64_t v, const std::vector<double>& kept) {
  for (int64_t c = 1; c < v; ++c)
    if (kept[size_t(c)] != kept[0]) return false;
  return true;
}

}  // namespace

double HeldAfterWarmup(ScheduleKind kind, int64_t p, int64_t v, int64_t m, int64_t g, int64_t r,
                       bool a2a_overlap, const std::vector<double>& kept) {
  if (kind != ScheduleKind::kInterleaved) v = 1, g = 1;
  if (g <= 0) g = p;
  const int64_t n = std::min(WarmupForwards(kind, p, v, m, g, r, a2a_overlap) + 1, m * v);
  return ChunksAlike(v, kept) ? double(n) * kept[0] : KeptByForwards(m, v, g, n, false, kept);
}

double PeakInFlight(ScheduleKind kind, int64_t p, int64_t v, int64_t m, int64_t g, int64_t r,
                    bool a2a_overlap, const std::vector<double>& kept) {
  const double first = HeldAfterWarmup(kind, p, v, m, g, r, a2a_overlap, kept);
  if (kind != ScheduleKind::kInterleaved || ChunksAlike(v, kept)) return first;
  if (g <= 0) g = p;
  const int64_t total = m * v, w = WarmupForwards(kind, p, v, m, g, r, a2a_overlap);
  const int64_t steps = total - w;  // steady iterations i: forward w + i, then backward i
  if (steps <= 1) return first;
  // Forward k's chunk (get_schedule_table's order).
  const int64_t full = m / g, period = g * v;
  auto chunk = [&](int64_t k) {
    return k < full * period ? (k % period) / g : (k - full * period) / (m - full * g);
  };
  // Held after forward w + i: forwards 0..w+i less backwards 0..i-1; periodic in i (period
  // g v) until the last group's forwards, so the first period and, when the last group is
  // partial, the last two suffice.
  double peak = first;
  const int64_t in_full = full * period;
  auto walk = [&](int64_t from, int64_t to) {
    double held = KeptByForwards(m, v, g, w + from + 1, false, kept) -
                  KeptByForwards(m, v, g, from, true, kept);
    // Positions of forward w + i + 1 and backward i in their period (no division per step
    // while both are in the full groups).
    int64_t f = (w + from + 1) % period, b = from % period;
    for (int64_t i = from;; ++i) {
      peak = std::max(peak, held);
      if (i + 1 >= to) break;
      const int64_t kf = w + i + 1;
      const int64_t cf = kf < in_full ? f / g : chunk(kf), cb = i < in_full ? b / g : chunk(i);
      held += kept[size_t(cf)] - kept[size_t(v - 1 - cb)];
      if (++f == period) f = 0;
      if (++b == period) b = 0;
    }
  };
  const int64_t head = std::min(steps, period + 1);
  walk(0, head);
  // With every group full the whole steady state repeats: the first period is all of it.
  if (steps > head && m % g != 0) walk(std::max(head, steps - 2 * period - 2), steps);
  return peak;
}

namespace {

// Megatron forward_backward_pipelining_without_interleaving, p2p helper by helper.
// a2a_overlap: --overlap-moe-expert-parallel-comm, whose combined 1F1B runs one more
// forward first so that each step's forward and backward are independent (schedules.py
// combined_1f1b_schedule_for_no_pipelining at pp 1: F0, then F(i+1) with B(i)).
void BuildOneFOneB(int p, int m, int r, bool a2a_overlap, std::vector<ScheduleOp>* out) {
  RankBuilder b(p, 1, r, out);
  const int warmup = int(WarmupForwards(ScheduleKind::kOneFOneB, p, 1, m, 0, r, a2a_overlap));
  const int steady = m - warmup;
  for (int i = 0; i < warmup; ++i) {
    b.Post({RecvAct({i, 0})});   // recv_forward
    b.Forward({i, 0});
    b.Post({SendAct({i, 0})});   // send_forward
  }
  if (steady > 0) b.Post({RecvAct({warmup, 0})});
  for (int i = 0; i < steady; ++i) {
    const int f = warmup + i;
    b.Forward({f, 0});
    b.Post({SendAct({f, 0}), RecvGrad({i, 0})});  // send_forward_recv_backward
    b.Backward({i, 0});
    if (i == steady - 1)
      b.Post({SendGrad({i, 0})});                     // send_backward
    else
      b.Post({SendGrad({i, 0}), RecvAct({f + 1, 0})});  // send_backward_recv_forward
  }
  for (int i = steady; i < m; ++i) {
    b.Post({RecvGrad({i, 0})});  // recv_backward
    b.Backward({i, 0});
    b.Post({SendGrad({i, 0})});  // send_backward
  }
  b.EndOfStep();
}

// Megatron get_schedule_table: for each group of g micro-batches (the last one takes the
// rest), chunk 0 of every micro-batch in the group, then chunk 1, ...
std::vector<Slot> ScheduleTable(int m, int v, int g) {
  std::vector<Slot> t;
  for (int lo = 0; lo < m; lo += g) {
    const int hi = lo + g >= m ? m : lo + g;
    for (int c = 0; c < v; ++c)
      for (int mb = lo; mb < hi; ++mb) t.push_back({mb, c});
  }
  return t;
}

// Megatron forward_backward_pipelining_with_interleaving, non-overlapped p2p path
// (batch_p2p_comm, no overlap_p2p_comm): one group per iteration that sends what this
// iteration produced and receives what a later iteration consumes.
class InterleavedBuilder {
 public:
  InterleavedBuilder(int p, int v, int m, int g, int r, bool a2a_overlap)
      : p_(p), v_(v), r_(r), t_(ScheduleTable(m, v, g)), total_(m * v),
        warmup_(int(WarmupForwards(ScheduleKind::kInterleaved, p, v, m, g, r, a2a_overlap))) {}

  void Build(std::vector<ScheduleOp>* out) const {
    RankBuilder b(p_, v_, r_, out);
    const int steady = total_ - warmup_;
    b.Post({RecvAct(ActRecvAt(-1))});  // recv_forward before the warmup loop
    for (int k = 0; k < warmup_; ++k) {
      b.Forward(Fwd(k));
      if (k == warmup_ - 1 && steady > 0)  // send_forward_backward_recv_forward_backward
        b.Post({SendAct(Fwd(k)), RecvAct(ActRecvAt(k)), RecvGrad(GradRecvAt(-1))});
      else  // send_forward_recv_forward
        b.Post({SendAct(Fwd(k)), RecvAct(ActRecvAt(k))});
    }
    for (int k = 0; k < steady; ++k) {
      const int f = warmup_ + k;
      b.Forward(Fwd(f));
      b.Backward(Bwd(k));
      // send_forward_backward_recv_forward_backward
      b.Post({SendAct(Fwd(f)), SendGrad(Bwd(k)), RecvAct(ActRecvAt(f)), RecvGrad(GradRecvAt(k))});
    }
    if (steady == 0) b.Post({RecvGrad(GradRecvAt(-1))});  // recv_backward
    for (int k = steady; k < total_; ++k) {
      b.Backward(Bwd(k));
      b.Post({SendGrad(Bwd(k)), RecvGrad(GradRecvAt(k))});  // send_backward_recv_backward
    }
    b.EndOfStep();
  }

 private:
  // Forward k runs table[k]; backward k the same micro-batch, chunk v-1-table[k].chunk.
  Slot Fwd(int k) const { return t_[k]; }
  Slot Bwd(int k) const { return {t_[k].mb, v_ - 1 - t_[k].chunk}; }

  // What this rank receives in forward iteration k (k = -1: before the loop), after Megatron's
  // recv_tensor_from_previous_stage. Ranks > 0 receive the input of forward k + 1. Rank 0
  // (the leading stage) receives what rank p-1 produced p-1 iterations earlier, which feeds
  // the next chunk of that micro-batch: nothing while rank p-1 has produced nothing, nothing
  // out of the last chunk. The group rule (g >= p) makes it arrive before it is needed.
  Slot ActRecvAt(int k) const {
    if (k + 1 >= total_) return kNone;
    if (r_ > 0) return Fwd(k + 1);
    if (k < p_ - 1) return kNone;
    const Slot s = Fwd(k - (p_ - 1));
    return s.chunk == v_ - 1 ? kNone : Slot{s.mb, s.chunk + 1};
  }
  // The mirror image for gradients: rank p-1 leads the backward pass.
  Slot GradRecvAt(int k) const {
    if (k + 1 >= total_) return kNone;
    if (r_ < p_ - 1) return Bwd(k + 1);
    if (k < p_ - 1) return kNone;
    const Slot s = Bwd(k - (p_ - 1));
    return s.chunk == 0 ? kNone : Slot{s.mb, s.chunk - 1};
  }

  int p_, v_, r_;
  std::vector<Slot> t_;  // Megatron's schedule table, indexed by virtual micro-batch
  int total_;            // T = m*v
  int warmup_;           // W
};

// ---------------------------------------------------------------------------------------------
// Checking

// Validates one schedule in three passes: fields and compute counts, send/recv matching,
// then execution. Tensors are keyed by (activation or gradient, micro-batch, virtual stage of
// the sender), so each pass is linear in the number of ops.
class Checker {
 public:
  explicit Checker(const Schedule& s) : s_(s), p_(s.pp), v_(s.vp), m_(s.microbatches) {}

  Status Run() {
    PTDP_RETURN_IF_ERROR(CheckFields());
    PTDP_RETURN_IF_ERROR(CheckCompute());
    PTDP_RETURN_IF_ERROR(CheckMatching());
    return Execute();
  }

 private:
  // The op with global id `id` (ranks laid end to end) and its rank.
  const ScheduleOp& Op(int id) const { return s_.ranks[rank_of_[id]][id - first_[rank_of_[id]]]; }
  std::string Where(int id) const {
    return "rank " + std::to_string(rank_of_[id]) + ": " + OpLabel(Op(id), v_);
  }
  int Stage(int rank, int chunk) const { return chunk * p_ + rank; }
  int SlotIndex(int mb, int chunk) const { return mb * v_ + chunk; }
  int RankSlot(int r, int mb, int chunk) const { return r * m_ * v_ + SlotIndex(mb, chunk); }
  // Tensor key of a p2p op: (gradient?, micro-batch, sender's virtual stage).
  int Key(int id) const {
    const ScheduleOp& op = Op(id);
    const int s = Stage(rank_of_[id], op.chunk);
    switch (op.kind) {
      case OpKind::kSendActivation: return ((0 * m_ + op.microbatch) * p_ * v_) + s;
      case OpKind::kRecvActivation: return ((0 * m_ + op.microbatch) * p_ * v_) + s - 1;
      case OpKind::kSendGradient: return ((1 * m_ + op.microbatch) * p_ * v_) + s;
      default: return ((1 * m_ + op.microbatch) * p_ * v_) + s + 1;  // kRecvGradient
    }
  }

  // Sizes, ranges, peers, and contiguous groups; numbers the ops and their groups.
  Status CheckFields() {
    if (p_ < 1 || v_ < 1 || m_ < 1)
      return Status::Error("schedule sizes must be >= 1 (pp " + std::to_string(p_) + ", vp " +
                           std::to_string(v_) + ", microbatches " + std::to_string(m_) + ")");
    if (static_cast<int>(s_.ranks.size()) != p_)
      return Status::Error("schedule has " + std::to_string(s_.ranks.size()) +
                           " op lists for pp " + std::to_string(p_));
    for (int r = 0; r < p_; ++r) {
      first_.push_back(static_cast<int>(rank_of_.size()));
      std::unordered_set<int> seen_groups;
      for (size_t i = 0; i < s_.ranks[r].size(); ++i) {
        const ScheduleOp& op = s_.ranks[r][i];
        const int id = static_cast<int>(rank_of_.size());
        rank_of_.push_back(r);
        group_end_.push_back(id + 1);
        const std::string at = "rank " + std::to_string(r) + " op " + std::to_string(i) + " (" +
                               ToString(op.kind) + ")";
        if (!IsP2pKind(op.kind) && op.peer != -1)
          return Status::Error(at + ": has peer " + std::to_string(op.peer) + " but is not p2p");
        if (!op.is_compute() && !IsP2pKind(op.kind)) continue;  // end of step
        if (op.microbatch < 0 || op.microbatch >= m_ || op.chunk < 0 || op.chunk >= v_)
          return Status::Error(at + ": micro-batch " + std::to_string(op.microbatch) +
                               ", chunk " + std::to_string(op.chunk) + " out of range");
        if (op.is_compute()) continue;
        const bool to_next = op.kind == OpKind::kSendActivation || op.kind == OpKind::kRecvGradient;
        const int other = Stage(r, op.chunk) + (to_next ? 1 : -1);
        if (other < 0 || other >= p_ * v_)
          return Status::Error("rank " + std::to_string(r) + ": " + OpLabel(op, v_) +
                               " crosses the end of the model");
        if (op.peer != other % p_)
          return Status::Error("rank " + std::to_string(r) + ": " + OpLabel(op, v_) +
                               " names the wrong peer (the other side is rank " +
                               std::to_string(other % p_) + ")");
        // A group is a run of consecutive p2p ops with one id (-1: the op alone).
        if (op.group < 0) continue;
        const bool continues = i > 0 && s_.ranks[r][i - 1].is_p2p() &&
                               s_.ranks[r][i - 1].group == op.group;
        if (continues) {
          for (int j = id - 1; j >= first_[r] && group_end_[j] == id; --j) group_end_[j] = id + 1;
        } else if (!seen_groups.insert(op.group).second) {
          return Status::Error("rank " + std::to_string(r) + ": group " +
                               std::to_string(op.group) + " is split by other ops");
        }
      }
    }
    first_.push_back(static_cast<int>(rank_of_.size()));
    return Status::Ok();
  }

  // (a) exactly one forward and one backward of each (micro-batch, chunk) per rank, F first.
  Status CheckCompute() const {
    for (int r = 0; r < p_; ++r) {
      std::vector<int> fwd(m_ * v_, 0), bwd(m_ * v_, 0);
      for (const ScheduleOp& op : s_.ranks[r]) {
        if (!op.is_compute()) continue;
        const std::string at = "rank " + std::to_string(r) + ": " + OpLabel(op, v_);
        const int slot = SlotIndex(op.microbatch, op.chunk);
        if (op.kind == OpKind::kForward && ++fwd[slot] > 1) return Status::Error(at + " appears twice");
        if (op.kind == OpKind::kBackward) {
          if (++bwd[slot] > 1) return Status::Error(at + " appears twice");
          if (fwd[slot] == 0) return Status::Error(at + " comes before its forward");
        }
      }
      for (int mb = 0; mb < m_; ++mb)
        for (int c = 0; c < v_; ++c)
          if (fwd[SlotIndex(mb, c)] == 0 || bwd[SlotIndex(mb, c)] == 0)
            return Status::Error("rank " + std::to_string(r) + ": " +
                                 ComputeLabel(fwd[SlotIndex(mb, c)] != 0, mb, c, v_) + " is missing");
    }
    return Status::Ok();
  }

  // (b) every send has exactly one receive on its peer and the reverse. Also: sends and
  // receives between two ranks pair up in the same order (per tensor kind), so a communicator
  // that matches in order, as NCCL does, delivers each tensor to the op that expects it.
  Status CheckMatching() {
    const int n = static_cast<int>(rank_of_.size());
    const int keys = 2 * m_ * p_ * v_;
    send_of_.assign(keys, -1);
    recv_of_.assign(keys, -1);
    partner_.assign(n, -1);
    for (int id = 0; id < n; ++id) {
      if (!Op(id).is_p2p()) continue;
      const bool send = Op(id).kind == OpKind::kSendActivation || Op(id).kind == OpKind::kSendGradient;
      int& slot = (send ? send_of_ : recv_of_)[Key(id)];
      if (slot >= 0) return Status::Error(Where(id) + " appears twice");
      slot = id;
    }
    // Order within each (from, to, kind) channel.
    std::vector<int> sent(2 * p_ * p_, 0), received(2 * p_ * p_, 0), seq(n, -1);
    for (int id = 0; id < n; ++id) {
      const ScheduleOp& op = Op(id);
      if (!op.is_p2p()) continue;
      const bool grad = op.kind == OpKind::kSendGradient || op.kind == OpKind::kRecvGradient;
      if (op.kind == OpKind::kSendActivation || op.kind == OpKind::kSendGradient) {
        const int recv = recv_of_[Key(id)];
        if (recv < 0) return Status::Error(Where(id) + " has no matching receive on rank " +
                                           std::to_string(op.peer));
        partner_[id] = recv;
        partner_[recv] = id;
        seq[id] = sent[(grad * p_ + rank_of_[id]) * p_ + op.peer]++;
      } else {
        if (send_of_[Key(id)] < 0) return Status::Error(Where(id) + " has no matching send on rank " +
                                                        std::to_string(op.peer));
        seq[id] = received[(grad * p_ + op.peer) * p_ + rank_of_[id]]++;
      }
    }
    for (int id = 0; id < n; ++id)
      if (partner_[id] >= 0 && seq[id] != seq[partner_[id]])
        return Status::Error(Where(id) + " pairs with " + Where(partner_[id]) +
                             ", but not in the same order among the tensors between the two ranks");
    return Status::Ok();
  }

  // (c) all ranks run their ops in order. Compute needs its inputs already received; a group
  // posts all its ops at once and completes when every op's partner has been posted (the peer
  // is blocked in a group holding it, or went past it): NCCL's rendezvous for large messages.
  Status Execute() {
    const int n = static_cast<int>(rank_of_.size());
    posted_.assign(n, 0);
    done_.assign(n, 0);
    f_ran_.assign(p_ * m_ * v_, 0);
    b_ran_.assign(p_ * m_ * v_, 0);
    pc_.assign(p_, 0);
    waiting_.assign(p_, 0);
    blocked_.assign(p_, 0);
    std::vector<int> runnable;
    for (int r = 0; r < p_; ++r) runnable.push_back(r);
    while (!runnable.empty()) {
      const int r = runnable.back();
      runnable.pop_back();
      blocked_[r] = 0;
      PTDP_RETURN_IF_ERROR(Advance(r, &runnable));
    }
    std::string msg;
    for (int r = 0; r < p_; ++r) {
      if (!blocked_[r]) continue;
      const int start = first_[r] + pc_[r];
      msg += std::string(msg.empty() ? "deadlock: " : "; ") + "rank " + std::to_string(r) +
             " blocks in group " + std::to_string(Op(start).group) + " (";
      bool any = false;
      for (int id = start; id < group_end_[start]; ++id)
        if (!posted_[partner_[id]]) {
          msg += std::string(any ? ", " : "") + OpLabel(Op(id), v_);
          any = true;
        }
      msg += ")";
    }
    if (!msg.empty()) return Status::Error(msg + " forever");
    return Status::Ok();
  }

  // Runs rank r until it finishes or blocks in a group; wakes the ranks whose groups it
  // completes.
  Status Advance(int r, std::vector<int>* runnable) {
    const int end = first_[r + 1];
    while (first_[r] + pc_[r] < end) {
      const int id = first_[r] + pc_[r];
      const ScheduleOp& op = Op(id);
      if (op.is_compute()) {
        PTDP_RETURN_IF_ERROR(InputsReady(id));
        done_[id] = 1;
        (op.kind == OpKind::kForward ? f_ran_ : b_ran_)[RankSlot(r, op.microbatch, op.chunk)] = 1;
        ++pc_[r];
        continue;
      }
      if (!op.is_p2p()) {  // end of step
        ++pc_[r];
        continue;
      }
      const int group_end = group_end_[id];
      if (!posted_[id]) {
        for (int o = id; o < group_end; ++o) {
          PTDP_RETURN_IF_ERROR(SendReady(o));
          posted_[o] = 1;
          const int q = partner_[o];
          if (!posted_[q]) {
            ++waiting_[r];
          } else if (q < first_[r] || q >= end) {  // the peer's group was waiting for o
            const int peer = rank_of_[q];
            if (--waiting_[peer] == 0 && blocked_[peer]) runnable->push_back(peer);
          } else {
            --waiting_[r];  // partner on this rank, posted earlier in this group
          }
        }
      }
      if (waiting_[r] > 0) {
        blocked_[r] = 1;
        return Status::Ok();
      }
      for (int o = id; o < group_end; ++o) done_[o] = 1;
      pc_[r] = group_end - first_[r];
    }
    return Status::Ok();
  }

  // The compute op `id` may run: its input tensor arrived (its receive completed earlier on
  // this rank), and a backward's forward ran.
  Status InputsReady(int id) const {
    const ScheduleOp& op = Op(id);
    const int r = rank_of_[id], s = Stage(r, op.chunk);
    const bool fwd = op.kind == OpKind::kForward;
    const bool needs_recv = fwd ? s > 0 : s < p_ * v_ - 1;
    if (!needs_recv) return Status::Ok();
    const int key = ((fwd ? 0 : 1) * m_ + op.microbatch) * p_ * v_ + (fwd ? s - 1 : s + 1);
    const int recv = recv_of_[key];
    if (recv < 0 || rank_of_[recv] != r || !done_[recv])
      return Status::Error(Where(id) + " runs before its " +
                           std::string(fwd ? "recv-activation" : "recv-gradient") + " completed");
    return Status::Ok();
  }

  // A send may be posted only after the compute that produced its tensor.
  Status SendReady(int id) const {
    const ScheduleOp& op = Op(id);
    if (op.kind != OpKind::kSendActivation && op.kind != OpKind::kSendGradient) return Status::Ok();
    const bool fwd = op.kind == OpKind::kSendActivation;
    if ((fwd ? f_ran_ : b_ran_)[RankSlot(rank_of_[id], op.microbatch, op.chunk)]) return Status::Ok();
    return Status::Error(Where(id) + " is posted before its " + (fwd ? "forward" : "backward") +
                         " ran");
  }

  const Schedule& s_;
  const int p_, v_, m_;
  std::vector<int> first_;       // first_[r] = global id of rank r's first op; first_[p] = n
  std::vector<int> rank_of_;     // global op id -> rank
  std::vector<int> group_end_;   // global op id -> one past the last op of its group
  std::vector<int> send_of_, recv_of_;  // tensor key -> global op id, -1
  std::vector<int> partner_;     // p2p op -> its matching op
  std::vector<char> posted_, done_;
  std::vector<char> f_ran_, b_ran_;  // per (rank, micro-batch, chunk): its forward/backward ran
  std::vector<int> pc_;          // per rank: index of the next op
  std::vector<int> waiting_;     // per rank: ops of its current group whose partner is not posted
  std::vector<char> blocked_;    // per rank: stopped in a group
};

}  // namespace

Result<Schedule> BuildSchedule(ScheduleKind kind, int pp, int vp, int microbatches,
                               int group_size, bool a2a_overlap) {
  const std::string sizes = "pp " + std::to_string(pp) + ", vp " + std::to_string(vp) +
                            ", microbatches " + std::to_string(microbatches);
  if (pp < 1 || vp < 1 || microbatches < 1)
    return Status::Error("schedule sizes must be >= 1 (" + sizes + ")");
  if (group_size < 0)
    return Status::Error("micro-batch group size must be >= 0 (got " + std::to_string(group_size) + ")");
  // Keeps op counts and tensor keys far from int overflow.
  if (int64_t(pp) * vp * microbatches > 50'000'000)
    return Status::Error("schedule too large: pp*vp*microbatches above 50 million (" + sizes + ")");
  Schedule s;
  s.kind = kind;
  s.pp = pp;
  s.vp = vp;
  s.microbatches = microbatches;
  s.a2a_overlap = a2a_overlap;
  s.ranks.resize(pp);
  if (kind != ScheduleKind::kInterleaved) {
    if (vp != 1)
      return Status::Error(std::string("schedule ") + ToString(kind) + " needs vp == 1 (got vp " +
                           std::to_string(vp) + "); vp > 1 is the interleaved schedule");
    if (a2a_overlap && (kind != ScheduleKind::kOneFOneB || pp > 1))
      return Status::Error("the EP all-to-all overlap's schedule needs virtual stages with pp > 1 "
                           "(" + sizes + ")");
    for (int r = 0; r < pp; ++r) {
      if (kind == ScheduleKind::kGPipe) BuildGPipe(pp, microbatches, r, &s.ranks[r]);
      else BuildOneFOneB(pp, microbatches, r, a2a_overlap, &s.ranks[r]);
    }
    return s;
  }
  if (vp < 2) return Status::Error("interleaved schedule needs vp > 1 (" + sizes + ")");
  if (pp < 2) return Status::Error("interleaved schedule needs pp >= 2 (" + sizes + ")");
  const int g = group_size > 0 ? group_size : pp;
  const int m = microbatches;
  if (!(pp <= g && g <= m && (m % g == 0 || m % g >= pp)))
    return Status::Error("interleaved schedule breaks the micro-batch group rule p <= g <= m and "
                         "(m % g == 0 or m % g >= p): p " + std::to_string(pp) + ", g " +
                         std::to_string(g) + ", m " + std::to_string(m) + " (m % g = " +
                         std::to_string(m % g) + ")");
  s.group_size = g;
  for (int r = 0; r < pp; ++r)
    InterleavedBuilder(pp, vp, m, g, r, a2a_overlap).Build(&s.ranks[r]);
  return s;
}

std::string Schedule::Notation(int rank) const {
  std::string out;
  if (rank < 0 || rank >= static_cast<int>(ranks.size())) return out;
  for (const ScheduleOp& op : ranks[rank]) {
    if (!op.is_compute()) continue;
    if (!out.empty()) out += ' ';
    out += ComputeLabel(op.kind == OpKind::kBackward, op.microbatch, op.chunk, vp);
  }
  return out;
}

Status CheckSchedule(const Schedule& s) { return Checker(s).Run(); }

}  // namespace ptdp
