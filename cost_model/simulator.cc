// Event-driven step simulation; see simulator.h. Ranks advance in global time order (a heap of
// (time, rank)); compute ops take their analytic duration; p2p groups block until every op of
// the group has met its peer (rendezvous) and the transfer crossed the sender's outbound link,
// which serialises the sender's transfers (contention).
#include "cost_model/simulator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <queue>
#include <unordered_map>

namespace ptdp {

std::string SimEvent::Name() const {
  char buf[96];
  switch (kind) {
    case OpKind::kForward: std::snprintf(buf, sizeof buf, "F%d.%d", microbatch, chunk); break;
    case OpKind::kBackward: std::snprintf(buf, sizeof buf, "B%d.%d", microbatch, chunk); break;
    case OpKind::kSendActivation:
      std::snprintf(buf, sizeof buf, "send act F%d.%d -> %d", microbatch, chunk, peer); break;
    case OpKind::kRecvActivation:
      std::snprintf(buf, sizeof buf, "recv act F%d.%d <- %d", microbatch, chunk, peer); break;
    case OpKind::kSendGradient:
      std::snprintf(buf, sizeof buf, "send grad B%d.%d -> %d", microbatch, chunk, peer); break;
    case OpKind::kRecvGradient:
      std::snprintf(buf, sizeof buf, "recv grad B%d.%d <- %d", microbatch, chunk, peer); break;
    case OpKind::kReduceGradients:
      if (chunk >= 0) std::snprintf(buf, sizeof buf, "dp reduce chunk %d", chunk);
      else std::snprintf(buf, sizeof buf, "dp reduce");
      break;
    case OpKind::kReduceEmbedding: std::snprintf(buf, sizeof buf, "embedding all-reduce"); break;
    case OpKind::kOptimizerStep: std::snprintf(buf, sizeof buf, "optimizer"); break;
  }
  return buf;
}

namespace {

struct OpRef {
  int rank = -1, index = -1;
};

// Per-rank state of the execution.
struct RankState {
  size_t pc = 0;               // next op
  double t = 0;                // when the rank is free to issue its next op
  int pending = 0;             // unmatched ops of the posted p2p group
  size_t group_end_pc = 0;     // first op after the posted group
  double group_post = 0;       // when the group was posted
  double group_end = 0;        // latest completion among its ops
  double group_transfer = 0;   // transfer time of its ops (for the comm/bubble split)
  double comm_free = 0;        // the rank's communication stream (DP reductions)
  double link_free = 0;        // the rank's outbound p2p link
  int inflight = 0;
  double act_bytes = 0;
  bool waiting_embedding = false;
  double embedding_post = 0;
  double dp_start = -1;        // when the rank reached its ReduceGradients op
};

class Sim {
 public:
  Sim(const AnalyticModel& cost, const Layout& l, const SimOptions& opt, const Schedule& s)
      : cost_(cost), l_(l), opt_(opt), s_(s), p_(l.pp), v_(l.vp) {}

  SimResult Run();

 private:
  void Prepare();
  void Step(int r);
  void Compute(int r, const ScheduleOp& op);
  void PostGroup(int r);
  void Transfer(OpRef a, OpRef b);
  void FinishGroupIfDone(int r, bool push);
  void ReduceGradients(int r, const ScheduleOp& op);
  void ReduceEmbedding(int r);
  void Record(int r, SimTrack track, const ScheduleOp& op, double start, double end, int chunk,
              int transfer = -1);
  void Memory(int r, double t, double delta);
  int VirtualStage(int r, int c) const { return c * p_ + r; }

  const AnalyticModel& cost_;
  const Layout& l_;
  const SimOptions& opt_;
  const Schedule& s_;
  const int p_, v_;

  std::vector<RankState> st_;
  std::vector<std::vector<OpRef>> match_;       // p2p op -> its peer op
  std::vector<std::vector<double>> posted_;     // p2p op -> post time (-1: not posted)
  std::vector<std::vector<double>> fwd_, bwd_;  // [r][c] duration incl. exposed TP
  std::vector<std::vector<double>> fwd_pure_, bwd_pure_;  // compute only
  std::vector<std::vector<int>> last_backward_; // [r][c] op index of the chunk's last B
  std::vector<std::vector<double>> dp_chunk_;   // [r][c] DP reduction seconds
  std::vector<std::vector<double>> dp_buckets_; // [r][c] its gradient buckets
  std::vector<std::vector<double>> shard_rs_;   // [r][c] ZeRO-2 reduce-scatter after a backward
  double p2p_ = 0, emb_ = 0;
  int transfers_ = 0;                            // p2p transfers so far
  std::vector<double> opt_time_, static_mem_;
  std::vector<double> gather_time_;  // [r] after the optimizer: the runtime's dist-opt all-gather
  std::vector<std::vector<double>> act_chunk_;  // [r][c] activation bytes per micro-batch
  std::priority_queue<std::pair<double, int>, std::vector<std::pair<double, int>>,
                      std::greater<>> ready_;
  SimResult res_;
};

void Sim::Prepare() {
  st_.assign(p_, RankState{});
  res_.ranks.assign(p_, SimRankStats{});
  const LayerTimes lt = cost_.Layer(l_);
  fwd_.assign(p_, std::vector<double>(v_));
  bwd_ = fwd_pure_ = bwd_pure_ = dp_chunk_ = dp_buckets_ = shard_rs_ = fwd_;
  for (int r = 0; r < p_; ++r)
    for (int c = 0; c < v_; ++c) {
      // Stage -1 / chunk -1 is a chunk of layers with neither embedding nor output.
      StageTimes ch = opt_.uniform_stages ? cost_.Chunk(l_, -1, -1, lt)
                                          : cost_.Chunk(l_, r, c, lt);
      double f_tp = opt_.free_communication ? 0 : lt.fwd_tp_s * ch.tp_s /
                                                      std::max(1e-300, lt.fwd_tp_s + lt.bwd_tp_s);
      // Split the chunk's compute into forward and backward as the layer does.
      const double f_share = lt.fwd_compute_s / (lt.fwd_compute_s + lt.bwd_compute_s);
      fwd_pure_[r][c] = ch.compute_s * f_share;
      if (cost_.runtime()) {  // the runtime model knows each chunk's split exactly
        f_tp = opt_.free_communication ? 0 : ch.fwd_tp_s;
        fwd_pure_[r][c] = ch.fwd_s - ch.fwd_tp_s;
      }
      const double b_tp = opt_.free_communication ? 0 : ch.tp_s - f_tp;
      bwd_pure_[r][c] = ch.compute_s - fwd_pure_[r][c];
      fwd_[r][c] = fwd_pure_[r][c] + f_tp;
      bwd_[r][c] = bwd_pure_[r][c] + b_tp;
      dp_chunk_[r][c] = opt_.free_communication ? 0 : cost_.ChunkDpTime(l_, r, c);
      dp_buckets_[r][c] = cost_.ChunkDpBuckets(l_, r, c);
      shard_rs_[r][c] = opt_.free_communication ? 0 : cost_.ChunkGradShardTime(l_, r, c);
    }
  p2p_ = opt_.free_communication ? 0 : cost_.P2pTime(l_);
  emb_ = opt_.free_communication ? 0 : cost_.EmbeddingReduceTime(l_);
  act_chunk_.assign(p_, std::vector<double>(v_));
  for (int r = 0; r < p_; ++r)
    for (int c = 0; c < v_; ++c)
      act_chunk_[r][c] = opt_.uniform_stages ? cost_.ChunkActivationBytes(l_, -1, -1)
                                             : cost_.ChunkActivationBytes(l_, r, c);
  for (int r = 0; r < p_; ++r) {
    opt_time_.push_back(cost_.StageOptimizerTime(l_, r));
    // The measured runtime's dist-opt all-gather: after AdamW, or with the overlap what the
    // stage's next forward of a micro-batch does not hide, shown after the optimizer.
    double fwd = 0;
    for (int c = 0; c < v_; ++c) fwd += fwd_[r][c];
    gather_time_.push_back(opt_.free_communication ? 0 : cost_.StageDpGatherTime(l_, r, fwd));
    static_mem_.push_back(cost_.StaticMemory(l_, r));
  }
  // Match every send with its receive: key (receiving virtual stage, is-gradient, microbatch).
  match_.resize(p_);
  posted_.resize(p_);
  last_backward_.assign(p_, std::vector<int>(v_, -1));
  std::unordered_map<int64_t, OpRef> sends;
  auto key = [&](int vstage, bool grad, int mb) {
    return (int64_t(vstage) * 2 + grad) * int64_t(s_.microbatches + 1) + mb;
  };
  for (int r = 0; r < p_; ++r) {
    const auto& ops = s_.ranks[r];
    match_[r].assign(ops.size(), OpRef{});
    posted_[r].assign(ops.size(), -1.0);
    for (int i = 0; i < int(ops.size()); ++i) {
      const ScheduleOp& op = ops[i];
      if (op.kind == OpKind::kBackward) last_backward_[r][op.chunk] = i;
      const int vs = VirtualStage(r, op.chunk);
      if (op.kind == OpKind::kSendActivation) sends[key(vs + 1, false, op.microbatch)] = {r, i};
      if (op.kind == OpKind::kSendGradient) sends[key(vs - 1, true, op.microbatch)] = {r, i};
    }
  }
  for (int r = 0; r < p_; ++r)
    for (int i = 0; i < int(s_.ranks[r].size()); ++i) {
      const ScheduleOp& op = s_.ranks[r][i];
      if (op.kind != OpKind::kRecvActivation && op.kind != OpKind::kRecvGradient) continue;
      auto it = sends.find(key(VirtualStage(r, op.chunk), op.kind == OpKind::kRecvGradient,
                               op.microbatch));
      if (it == sends.end()) continue;  // CheckSchedule guarantees a match
      match_[r][i] = it->second;
      match_[it->second.rank][it->second.index] = {r, i};
    }
}

void Sim::Record(int r, SimTrack track, const ScheduleOp& op, double start, double end, int chunk,
                 int transfer) {
  ++res_.num_events;
  if (!opt_.record_events) return;
  SimEvent e;
  e.rank = r;
  e.track = track;
  e.kind = op.kind;
  e.microbatch = op.microbatch;
  e.chunk = chunk;
  e.peer = op.peer;
  e.transfer = transfer;
  e.start_s = start;
  e.end_s = end;
  res_.events.push_back(e);
}

void Sim::Memory(int r, double t, double delta) {
  RankState& st = st_[r];
  st.act_bytes += delta;
  SimRankStats& rs = res_.ranks[r];
  const double total = static_mem_[r] + st.act_bytes;
  rs.peak_memory_bytes = std::max(rs.peak_memory_bytes, total);
  if (opt_.record_events) rs.memory_timeline.emplace_back(t, total);
}

void Sim::Compute(int r, const ScheduleOp& op) {
  RankState& st = st_[r];
  SimRankStats& rs = res_.ranks[r];
  const bool fwd = op.kind == OpKind::kForward;
  const double dur = fwd ? fwd_[r][op.chunk] : bwd_[r][op.chunk];
  const double start = st.t;
  if (fwd) {
    rs.peak_inflight = std::max(rs.peak_inflight, ++st.inflight);
    Memory(r, start, act_chunk_[r][op.chunk]);
  }
  Record(r, SimTrack::kCompute, op, start, start + dur, op.chunk);
  st.t = start + dur;
  rs.compute_s += dur;
  rs.tp_s += dur - (fwd ? fwd_pure_[r][op.chunk] : bwd_pure_[r][op.chunk]);
  if (!fwd) {
    --st.inflight;
    Memory(r, st.t, -act_chunk_[r][op.chunk]);
    // --overlap-grad-reduce: the chunk's gradient buckets go out during its last backward.
    // Bucket j of nb is ready at j/nb of the backward (the last layers' first); they run one
    // after another, the last no earlier than the backward's end plus one bucket.
    // ZeRO-2 (gradient sharding): every other backward of the chunk reduce-scatters its
    // gradients the same way, into the sharded accumulation buffer.
    const double shard_rs = shard_rs_[r][op.chunk];
    if (shard_rs > 0 && last_backward_[r][op.chunk] != int(st.pc)) {
      const double nb = dp_buckets_[r][op.chunk];
      const double s = std::max(start + dur / nb, st.comm_free);
      st.comm_free = std::max(s + shard_rs, st.t + shard_rs / nb);
      ScheduleOp red{OpKind::kReduceGradients, -1, op.chunk};
      Record(r, SimTrack::kComm, red, s, st.comm_free, op.chunk);
    }
    if (l_.overlap_grad_reduce && last_backward_[r][op.chunk] == int(st.pc) && dp_chunk_[r][op.chunk] > 0) {
      const double nb = dp_buckets_[r][op.chunk];
      const double s = std::max(start + dur / nb, st.comm_free);
      st.comm_free = std::max(s + dp_chunk_[r][op.chunk], st.t + dp_chunk_[r][op.chunk] / nb);
      ScheduleOp red{OpKind::kReduceGradients, -1, op.chunk};
      Record(r, SimTrack::kComm, red, s, st.comm_free, op.chunk);
    }
  }
  ++st.pc;
}

void Sim::Transfer(OpRef a, OpRef b) {
  const ScheduleOp& oa = s_.ranks[a.rank][a.index];
  const bool a_sends = oa.kind == OpKind::kSendActivation || oa.kind == OpKind::kSendGradient;
  const OpRef snd = a_sends ? a : b, rcv = a_sends ? b : a;
  RankState& sender = st_[snd.rank];
  const double start = std::max({posted_[a.rank][a.index], posted_[b.rank][b.index],
                                 p2p_ > 0 ? sender.link_free : 0.0});
  const double end = start + p2p_;
  if (p2p_ > 0) sender.link_free = end;
  const int id = transfers_++;
  Record(snd.rank, SimTrack::kComm, s_.ranks[snd.rank][snd.index], start, end,
         s_.ranks[snd.rank][snd.index].chunk, id);
  Record(rcv.rank, SimTrack::kComm, s_.ranks[rcv.rank][rcv.index], start, end,
         s_.ranks[rcv.rank][rcv.index].chunk, id);
  for (OpRef x : {a, b}) {
    RankState& st = st_[x.rank];
    st.group_end = std::max(st.group_end, end);
    st.group_transfer += end - start;
    --st.pending;
  }
}

void Sim::FinishGroupIfDone(int r, bool push) {
  RankState& st = st_[r];
  if (st.pending > 0) return;
  SimRankStats& rs = res_.ranks[r];
  const double blocked = st.group_end - st.group_post;
  rs.p2p_wait_s += std::min(blocked, st.group_transfer);
  rs.p2p_blocked_s += blocked;
  st.pc = st.group_end_pc;
  st.t = std::max(st.t, st.group_end);
  if (push) ready_.push({st.t, r});
}

void Sim::PostGroup(int r) {
  RankState& st = st_[r];
  const auto& ops = s_.ranks[r];
  const int group = ops[st.pc].group;
  size_t j = st.pc;
  st.pending = 0;
  st.group_post = st.t;
  st.group_end = st.t;
  st.group_transfer = 0;
  while (j < ops.size() && ops[j].is_p2p() && ops[j].group == group) {
    posted_[r][j] = st.t;
    ++st.pending;
    ++j;
  }
  st.group_end_pc = j;
  for (size_t i = st.pc; i < j; ++i) {
    const OpRef peer = match_[r][i];
    if (peer.rank < 0 || posted_[peer.rank][peer.index] < 0) continue;
    Transfer({r, int(i)}, peer);
    if (peer.rank != r) FinishGroupIfDone(peer.rank, /*push=*/true);
  }
  FinishGroupIfDone(r, /*push=*/true);
}

void Sim::ReduceGradients(int r, const ScheduleOp& op) {
  RankState& st = st_[r];
  SimRankStats& rs = res_.ranks[r];
  rs.pipeline_end_s = st.t;
  st.dp_start = st.t;
  if (!l_.overlap_grad_reduce) {
    for (int c = v_ - 1; c >= 0; --c) {
      if (dp_chunk_[r][c] <= 0) continue;
      const double s = std::max(st.t, st.comm_free);
      st.comm_free = s + dp_chunk_[r][c];
      ScheduleOp red{OpKind::kReduceGradients, -1, c};
      Record(r, SimTrack::kComm, red, s, st.comm_free, c);
    }
  }
  st.t = std::max(st.t, st.comm_free);
  ++st.pc;
  (void)op;
}

void Sim::ReduceEmbedding(int r) {
  // A 2-rank collective between the first and last stage: both must arrive.
  RankState& st = st_[r];
  const int other = r == 0 ? p_ - 1 : 0;
  RankState& ot = st_[other];
  if (!ot.waiting_embedding) {
    st.waiting_embedding = true;
    st.embedding_post = st.t;
    return;  // resumed by the other side
  }
  const double start = std::max(st.t, ot.embedding_post);
  const double end = start + emb_;
  ScheduleOp op{OpKind::kReduceEmbedding};
  Record(r, SimTrack::kComm, op, start, end, -1);
  Record(other, SimTrack::kComm, op, start, end, -1);
  ot.waiting_embedding = false;
  st.t = ot.t = end;
  ++st.pc;
  ++ot.pc;
  ready_.push({ot.t, other});
  ready_.push({st.t, r});
}

void Sim::Step(int r) {
  RankState& st = st_[r];
  const auto& ops = s_.ranks[r];
  if (st.pc >= ops.size() || st.pending > 0 || st.waiting_embedding) return;
  const ScheduleOp& op = ops[st.pc];
  switch (op.kind) {
    case OpKind::kForward:
    case OpKind::kBackward:
      Compute(r, op);
      ready_.push({st.t, r});
      return;
    case OpKind::kReduceGradients:
      ReduceGradients(r, op);
      ready_.push({st.t, r});
      return;
    case OpKind::kReduceEmbedding:
      ReduceEmbedding(r);
      return;
    case OpKind::kOptimizerStep: {
      const double start = st.t;
      st.t += opt_time_[r];
      Record(r, SimTrack::kCompute, op, start, st.t, -1);
      if (gather_time_[r] > 0) {  // counted as DP time (step end - pipeline end - optimizer)
        ScheduleOp ag{OpKind::kReduceGradients, -1, -1};
        Record(r, SimTrack::kComm, ag, st.t, st.t + gather_time_[r], -1);
        st.t += gather_time_[r];
      }
      ++st.pc;
      res_.ranks[r].end_s = st.t;
      res_.ranks[r].optimizer_s = opt_time_[r];
      if (st.dp_start >= 0) res_.ranks[r].dp_s = start - st.dp_start;
      return;
    }
    default:
      PostGroup(r);
      return;
  }
}

SimResult Sim::Run() {
  Prepare();
  for (int r = 0; r < p_; ++r) ready_.push({0.0, r});
  while (!ready_.empty()) {
    const auto [t, r] = ready_.top();
    ready_.pop();
    if (t < st_[r].t) continue;  // stale
    Step(r);
  }
  // Results: the rank that ends last defines the step and its breakdown.
  int crit = 0;
  double pipeline_end = 0;
  for (int r = 0; r < p_; ++r) {
    SimRankStats& rs = res_.ranks[r];
    if (rs.end_s == 0) rs.end_s = st_[r].t;  // defensive: a schedule without an optimizer op
    pipeline_end = std::max(pipeline_end, rs.pipeline_end_s);
    if (rs.end_s > res_.ranks[crit].end_s) crit = r;
  }
  // A rank's bubble: idle time until the whole pipeline has drained.
  for (auto& rs : res_.ranks) rs.bubble_s = std::max(0.0, pipeline_end - rs.compute_s - rs.p2p_wait_s);
  const SimRankStats& c = res_.ranks[crit];
  const double crit_bubble = std::max(0.0, c.pipeline_end_s - c.compute_s - c.p2p_wait_s);
  res_.step_time_s = c.end_s;
  double pure = 0;
  for (int ch = 0; ch < v_; ++ch) pure += fwd_pure_[crit][ch] + bwd_pure_[crit][ch];
  const double m = double(l_.num_microbatches());
  Breakdown& br = res_.breakdown;
  br.compute_s = m * pure;
  br.tp_comm_s = std::max(0.0, c.compute_s - br.compute_s);
  br.pp_comm_s = c.p2p_wait_s;
  br.bubble_s = crit_bubble;
  br.optimizer_s = opt_time_[crit];
  br.dp_comm_s = std::max(0.0, c.end_s - c.pipeline_end_s - br.optimizer_s);
  res_.bubble_s = crit_bubble;
  res_.bubble_fraction = res_.bubble_s / res_.step_time_s;
  return res_;
}

// Ok when the step's figures are numbers in range (as CheckEstimate for the analytic ones),
// else an error naming the layout, the rank and the figure.
Status CheckSimResult(const Layout& l, const SimResult& r) {
  struct Term { std::string name; double v; bool positive; };
  const Breakdown& b = r.breakdown;
  std::vector<Term> terms = {
      {"compute_s", b.compute_s, false},     {"tp_comm_s", b.tp_comm_s, false},
      {"pp_comm_s", b.pp_comm_s, false},     {"dp_comm_s", b.dp_comm_s, false},
      {"bubble_s", b.bubble_s, false},       {"optimizer_s", b.optimizer_s, false},
      {"step_time_s", r.step_time_s, true},  {"bubble_fraction", r.bubble_fraction, false}};
  for (size_t i = 0; i < r.ranks.size(); ++i) {
    const SimRankStats& rs = r.ranks[i];
    const std::string rank = "rank " + std::to_string(i) + " ";
    terms.push_back({rank + "compute_s", rs.compute_s, false});
    terms.push_back({rank + "p2p_wait_s", rs.p2p_wait_s, false});
    terms.push_back({rank + "bubble_s", rs.bubble_s, false});
    terms.push_back({rank + "end_s", rs.end_s, false});
    terms.push_back({rank + "peak_memory_bytes", rs.peak_memory_bytes, false});
  }
  for (const Term& t : terms) {
    if (std::isfinite(t.v) && (t.positive ? t.v > 0 : t.v >= 0)) continue;
    char buf[64];
    std::snprintf(buf, sizeof buf, " is %g (step_time_s %g)", t.v, r.step_time_s);
    return Status::Error("simulator: " + l.ShortName() + " [" + l.Knobs() + "]: " + t.name +
                         buf + ": not a finite, " + (t.positive ? "positive" : "non-negative") +
                         " figure");
  }
  return Status::Ok();
}

}  // namespace

Result<SimResult> SimulateStep(const AnalyticModel& cost, const Layout& layout,
                               const SimOptions& opt) {
  // The durations come from the analytic model: a figure of it out of range is named as such.
  PTDP_RETURN_IF_ERROR(CheckEstimate(layout, cost.Evaluate(layout)));
  const Layout l = cost.Executed(layout);  // as the machine runs it (a measured runtime)
  PTDP_ASSIGN_OR_RETURN(Schedule s, BuildSchedule(l.schedule, l.pp, l.vp,
                                                  int(l.num_microbatches()), l.microbatch_group,
                                                  l.moe_a2a_overlap));
  Sim sim(cost, l, opt, s);
  SimResult r = sim.Run();
  for (int i = 0; i < l.pp; ++i)
    if (r.ranks[i].end_s <= 0 && !s.ranks[i].empty())
      return Status::Error("simulation of " + l.ShortName() + " did not finish on rank " +
                           std::to_string(i) + " (schedule deadlock)");
  PTDP_RETURN_IF_ERROR(CheckSimResult(l, r));
  return r;
}

Prediction SimulatedPrediction(const AnalyticModel& cost, const Layout& l, const SimResult& sim) {
  Prediction p = cost.Predict(l);
  p.source = "simulated";
  p.step_time_s = sim.step_time_s;
  p.breakdown = sim.breakdown;
  p.bubble_fraction = sim.bubble_fraction;
  p.tflops_per_gpu = cost.ModelFlops(l) / sim.step_time_s / l.world() / 1e12;
  p.hw_tflops_per_gpu = cost.HardwareFlops(l) / sim.step_time_s / l.world() / 1e12;
  p.mfu = cost.ModelFlops(l) / (sim.step_time_s * l.world() * cost.MfuPeak(l.precision));
  return p;
}

}  // namespace ptdp
