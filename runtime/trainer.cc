// Trainer: every rank a persistent thread walking its core/ Schedule over GptChunks, then
// Megatron's finalize-grads, global-norm clipping and AdamW; see trainer.h for the contract.
//
// Letters: t TP, c CP, p PP, d DP, v chunks per pipeline rank, m micro-batches, b micro-batch,
// s sequence, sc = s/c the positions a CP rank holds, sl = sc/t with SP else sc, h hidden,
// L layers, R = d*c the dense parameters' reduction group (DP x CP; DP when c = 1).
//
// Order of the end-of-step reductions (each rank issues them in this order, so no two groups
// wait on each other in a cycle):
//   TP  SP-partial grads (FinalizeTpGrads)      -- Megatron does this after the DP reduction;
//   DPCP all-reduce SUM / d of every grad          the two sums commute, so the result is the
//       (dist-opt: reduce-scatter of each flattened grad, padded to a multiple of R, / d)
//   EMB all-reduce SUM of embedding.word's grad (or its owned slice) between first and last stage
//   WORLD all-reduce of the squared-grad sums (each element counted by one rank) -> norm, clip,
//       AdamW
//   DPCP dist-opt: all-gather of the updated slices
//   DPCP loss (last stage): all-reduce SUM / d for the report
//   WORLD all-gather of every rank's report (loss, grad norm, times, stop request), so that
//         every process holds the whole job's figures (ranks may live in several processes:
//         local_ranks) and every process sees the same stop request
#include "runtime/trainer.h"

#include <algorithm>
#include <chrono>
#include <cassert>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <mutex>
#include <numbers>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>

#include "core/rank_grid.h"
#include "core/schedule.h"
#include "runtime/data.h"
#include "runtime/failures.h"
#include "runtime/gpt.h"
#include "runtime/grad_reducer.h"
#include "runtime/params.h"

namespace ptdp::rt {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string Str(int64_t v) { return std::to_string(v); }

// The order of a chunk's forward parts (GptChunk::ParamsNeeded's moments): the embedding, the
// layers, the output.
int ForwardOrder(int moment) {
  if (moment == GptChunk::kEmbeddingGrads) return std::numeric_limits<int>::min();
  if (moment == GptChunk::kOutputGrads) return std::numeric_limits<int>::max();
  return moment;
}

// A rank's phase timing over its backend's marks (Backend::Mark): each timed region of a step
// is an interval between two marks, resolved to seconds once the step's work is done, so that
// on an asynchronous backend (CUDA: events on the rank's stream) each phase is the device's time
// rather than the host's enqueueing, and on the CPU the host clock as before. A region's own
// time excludes the regions nested directly inside it (a forward's TP collectives).
class PhaseClock {
 public:
  struct Open {
    int mark = -1;      // -1: the clock is not running (Evaluate, GatherParameters)
    size_t inner = 0;   // the intervals recorded before this region began
  };
  // Starts a step on `be`: marks from 0, the step's origin first.
  void Begin(Backend& be) {
    be_ = &be;
    be.ClearMarks();
    origin_ = be.Mark();
    host_origin_ = Clock::now();
    intervals_.clear();
    host_events_.clear();
    depth_ = 0;
  }
  // Work another thread of the rank did beside it (GradReducer's jobs), timed on the host
  // clock: a timeline event only, its seconds in no field (the rank's own wait for it is).
  void AddHostEvent(StepEventKind kind, int chunk, Clock::time_point a, Clock::time_point b) {
    if (be_ == nullptr) return;
    // From the step's origin: a parameter all-gather handed over at the end of the previous
    // step shows from where this one begins.
    auto since = [&](Clock::time_point x) {
      return std::max(0.0, std::chrono::duration<double>(x - host_origin_).count());
    };
    host_events_.push_back({kind, -1, chunk, since(a), since(b)});
  }
  Open Start() {
    if (be_ == nullptr) return {};
    ++depth_;
    return {be_->Mark(), intervals_.size()};
  }
  // Ends the region opened by `o`: its time goes to `field` of RankTimes (and the timeline).
  void Stop(const Open& o, StepEventKind kind, int microbatch, int chunk,
            double RankTimes::*field) {
    if (be_ == nullptr || o.mark < 0) return;
    --depth_;
    intervals_.push_back({kind, microbatch, chunk, o.mark, be_->Mark(), field, o.inner, depth_});
  }
  // After the step's work completed: adds each region's own seconds to its field of `t`, the
  // events to t->events when `timeline`, and returns the seconds from the origin to now.
  double Resolve(RankTimes* t, bool timeline) {
    if (be_ == nullptr) return 0;
    std::vector<double> secs(intervals_.size());
    for (size_t i = 0; i < intervals_.size(); ++i)
      secs[i] = be_->MarkSeconds(intervals_[i].a, intervals_[i].b);
    for (size_t i = 0; i < intervals_.size(); ++i) {
      const Interval& v = intervals_[i];
      double own = secs[i];
      for (size_t j = v.inner; j < i; ++j)
        if (intervals_[j].depth == v.depth + 1) own -= secs[j];
      t->*(v.field) += std::max(0.0, own);
      if (timeline)
        t->events.push_back({v.kind, v.microbatch, v.chunk, be_->MarkSeconds(origin_, v.a),
                             be_->MarkSeconds(origin_, v.b)});
    }
    if (timeline) t->events.insert(t->events.end(), host_events_.begin(), host_events_.end());
    const double total = be_->MarkSeconds(origin_, be_->Mark());
    be_ = nullptr;  // until the next step
    return total;
  }

 private:
  struct Interval {
    StepEventKind kind;
    int microbatch, chunk;
    int a, b;                   // marks
    double RankTimes::*field;
    size_t inner;               // intervals [inner, this one) were recorded inside it
    int depth;                  // regions open around it
  };
  Backend* be_ = nullptr;
  int origin_ = 0;
  Clock::time_point host_origin_;
  int depth_ = 0;
  std::vector<Interval> intervals_;
  std::vector<StepEvent> host_events_;
};

// A Communicator that forwards to another and times each call on the rank's PhaseClock as TP
// time (RankTimes::tp_comm_s; the TP communicator handed to the chunks: TP time is measured
// inside forward and backward), an event of `kind` on the timeline.
class TimedCommunicator final : public Communicator {
 public:
  TimedCommunicator(std::unique_ptr<Communicator> inner, PhaseClock* clock,
                    StepEventKind kind = StepEventKind::kTpComm)
      : inner_(std::move(inner)), clock_(clock), kind_(kind) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::vector<int>& ranks() const override { return inner_->ranks(); }
  const std::string& label() const override { return inner_->label(); }
  Status AllReduce(Tensor& t, ReduceOp op) override {
    return Timed([&] { return inner_->AllReduce(t, op); });
  }
  Status AllGather(const Tensor& in, Tensor& out) override {
    return Timed([&] { return inner_->AllGather(in, out); });
  }
  Status ReduceScatter(const Tensor& in, Tensor& out, ReduceOp op) override {
    return Timed([&] { return inner_->ReduceScatter(in, out, op); });
  }
  Status Broadcast(Tensor& t, int root) override {
    return Timed([&] { return inner_->Broadcast(t, root); });
  }
  Status Barrier() override { return Timed([&] { return inner_->Barrier(); }); }
  Status Send(const Tensor& t, int peer) override {
    return Timed([&] { return inner_->Send(t, peer); });
  }
  Status Recv(Tensor& t, int peer) override {
    return Timed([&] { return inner_->Recv(t, peer); });
  }
  Status GroupStart() override { return inner_->GroupStart(); }
  // The wrapped communicator, for work that is not the step's (measurements).
  Communicator& inner() { return *inner_; }
  Status GroupEnd() override { return Timed([&] { return inner_->GroupEnd(); }); }
  Status AllToAll(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                  const std::vector<int64_t>& recv_counts) override {
    return Timed([&] { return inner_->AllToAll(in, send_counts, out, recv_counts); });
  }
  Result<std::shared_ptr<ReadyMark>> MarkReady() override { return inner_->MarkReady(); }
  void RunAfter(std::shared_ptr<ReadyMark> mark) override { inner_->RunAfter(std::move(mark)); }

 private:
  template <typename F>
  Status Timed(F f) {
    const PhaseClock::Open o = clock_->Start();
    Status st = f();
    clock_->Stop(o, kind_, -1, -1, &RankTimes::tp_comm_s);
    return st;
  }
  std::unique_ptr<Communicator> inner_;
  PhaseClock* clock_;
  StepEventKind kind_;
};

// AdamW state of one parameter: the part this rank updates. Its gradient is reduced over its
// reduction group of R ranks (the DP x CP group of a dense parameter, Megatron's "dp-cp"
// group; R = d*c). Without the distributed optimizer the rank updates the whole (flattened)
// tensor; with it, the rank at index j of that group owns elements [j*k, j*k + owned) of the
// parameter flattened and padded to R*k (k = ceil(numel / R)), owned = clamp(numel - j*k, 0, k).
struct ParamState {
  ChunkParam* param = nullptr;
  Communicator* group = nullptr;  // the reduction group (owned by the Rank)
  int slices = 1;                 // R with the distributed optimizer, else 1
  int slice = 0;                  // this rank's index j in the group (0 without dist-opt)
  int64_t numel = 0;
  int64_t k = 0;          // slice length (numel without the distributed optimizer)
  int64_t owned = 0;      // elements of the slice inside the parameter
  Tensor m, v;            // (owned) AdamW moments
  Tensor main;            // TrainerConfig::bf16: (owned) the fp32 main weights; value holds
                          // their bf16 rounding
  Tensor grad_slice;      // dist-opt: (k) this rank's reduce-scattered grad; else the grad
  Tensor wire_slice;      // dist-opt with --grad-reduce-in-bf16: (k) the bf16 reduce-scatter's
                          // output, copied into grad_slice
  bool decay = false;     // weight decay: 2-D weights but the position table
  // Counted in the global gradient norm by exactly one rank of the job: not a TP replica (tp
  // rank 0 only), not the last stage's tied word embedding, and (without dist-opt) index 0 of
  // the reduction group.
  bool counts_in_norm = false;
  // --overlap-grad-reduce with the distributed optimizer: the chunk holding the parameter, its
  // grad-ready moment (GptChunk::GradsDoneAt; kAtReduction: SP's TP-partial ones, after their
  // TP sum), and whether this step's reduce-scatter was handed to the reducer.
  static constexpr int kAtReduction = std::numeric_limits<int>::min();
  int chunk = 0;
  int moment = kAtReduction;
  bool launched = false;
  // The part of its chunk's forward that reads it (a GradsDoneAt moment, whatever the
  // reduction): --overlap-param-gather waits there for its all-gather.
  int part = 0;
  // The sliced state of checkpoint tensor `which` (1 m, 2 v, 0 the bf16 run's main weights).
  const Tensor& Sliced(int which) const { return which == 0 ? main : which == 1 ? m : v; }
};

// Keys of tensors waiting between p2p and compute: (micro-batch, chunk, is_gradient).
using Key = std::tuple<int, int, bool>;

// What a rank reports after a step, exchanged over the WORLD group so that every process holds
// every rank's: 13 doubles, sent bit for bit as 26 i32 (a gather copies any dtype exactly).
// RankTimes' figures as plain words; its event list stays with the rank's own process.
struct TimesWords {
  double forward_s = 0, backward_s = 0, tp_comm_s = 0, pp_wait_s = 0, dp_comm_s = 0,
         optimizer_s = 0, idle_s = 0, peak_memory_bytes = 0, expert_load = 0;
};
TimesWords ToWords(const RankTimes& t) {
  return {t.forward_s, t.backward_s, t.tp_comm_s, t.pp_wait_s,
          t.dp_comm_s, t.optimizer_s, t.idle_s,   t.peak_memory_bytes, t.expert_load};
}
RankTimes FromWords(const TimesWords& w) {
  RankTimes t;
  t.forward_s = w.forward_s, t.backward_s = w.backward_s, t.tp_comm_s = w.tp_comm_s;
  t.pp_wait_s = w.pp_wait_s, t.dp_comm_s = w.dp_comm_s, t.optimizer_s = w.optimizer_s;
  t.idle_s = w.idle_s, t.peak_memory_bytes = w.peak_memory_bytes;
  t.expert_load = w.expert_load;
  return t;
}

struct RankReport {
  double ok = 0;  // 1 when the rank's step succeeded
  double loss = 0, grad_norm = 0;
  TimesWords times;
  double stop = 0;  // TrainerConfig::stop_requested() at the end of the step (0 when unset)
};
static_assert(sizeof(RankReport) == 13 * sizeof(double) &&
                  std::is_trivially_copyable_v<RankReport>,
              "RankReport is sent as raw words");

// One parameter shard of the DP-0 replica and the rank that holds it (GatherParameters).
struct ShardSource {
  ParamSpec spec;
  int tp_rank = 0;
  int holder = 0;  // global rank
  int chunk = 0;   // the holder's chunk index
};

struct Rank {
  int global = 0;
  RankCoord coord;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Communicator> pp, dp, emb;
  std::unique_ptr<Communicator> dpcp;   // DP x CP (cp > 1 only): dense gradients, loss
  std::unique_ptr<TimedCommunicator> cp;  // the CP ring (cp > 1 only), timed as TP/CP time
  // MoE models: the expert grid's EP and expert-TP groups and the TP x CP group (the aux
  // loss's token counts), timed as TP time; expert-DP, the routed experts' reduction group.
  std::unique_ptr<TimedCommunicator> ep, etp, tpcp;
  std::unique_ptr<Communicator> edp;
  ExpertCoord expert;
  std::unique_ptr<Communicator> world;  // every rank of the layout, group rank = global rank
  std::unique_ptr<TimedCommunicator> tp;
  std::vector<std::unique_ptr<GptChunk>> chunks;  // by chunk index c
  std::vector<ParamState> state;
  // The gradients reduced whole (every ParamState with slices == 1): runs of parameters that
  // lie next to each other in a chunk's grad buffer and share a reduction group, each one
  // collective (Megatron's buckets: without --overlap-grad-reduce one per group; with it split
  // into buckets of at least --ddp-bucket-size parameters, from the buffer's end).
  struct GradBucket {
    Communicator* group = nullptr;
    Tensor grads;  // a view of the chunk's grad buffer
    Tensor wire;   // --grad-reduce-in-bf16: the same view of the chunk's bf16 mirror
    int chunk = 0;
    // With the overlap: the grad-ready moments (GptChunk::GradsDoneAt) of its parameters,
    // distinct; empty when it waits for the reduction itself (SP's TP-partial gradients, summed
    // over TP first by FinalizeTpGrads). `pending`: this step's moments not yet seen.
    std::vector<int> moments;
    size_t pending = 0;
    bool launched = false;
  };
  std::vector<GradBucket> buckets;
  // --overlap-param-gather (the distributed optimizer with the reducer): the all-gathers of the
  // updated slices handed over at the end of a step, in the next forward's order (state index,
  // the output, GatherOutput's, the reducer's ticket); the forward waits for each before the
  // part that reads it; `gathered` of them are in. Declared before the reducer, so that the
  // reducer (which finishes them) goes first.
  struct PendingGather {
    size_t state = 0;
    Tensor full;
    uint64_t ticket = 0;
  };
  std::vector<PendingGather> gathers;
  size_t gathered = 0;
  std::vector<size_t> gather_order;  // rk.state's sliced ones in forward order; empty: no overlap
  std::vector<Tensor> scatter_inputs;  // zero-padded copies handed over, kept until the wait
  // --overlap-grad-reduce (and something to reduce): runs the buckets' all-reduces beside the
  // backward; last_backward[c]: the index in this rank's schedule of chunk c's last backward.
  std::unique_ptr<GradReducer> reducer;
  std::vector<size_t> last_backward;
  // --grad-reduce-in-bf16: per chunk, a bf16 tensor the size of its grad buffer (Megatron's
  // bf16 gradient buffer; see Impl::bf16_grads).
  std::vector<Tensor> grad_wire;
  // The optimizer's calls over the whole parameters (BuildState): runs that lie next to each
  // other in a chunk's buffers and share weight decay and norm role, each one SumSquares and one
  // AdamW (Megatron's multi-tensor apply); views of the chunk's value and grad buffers and of
  // the flat AdamW state (m, v; the fp32 main weights of a bf16 run).
  struct OptimizerRun {
    Tensor value, grad, m, v, main;
    bool decay = false, counts_in_norm = false;
  };
  std::vector<OptimizerRun> runs;
  std::unique_ptr<DataLoader> data;
  RankTimes times;
  PhaseClock clock;  // this step's timed regions (the timed communicators' too)
  // The dense parameters' reduction group: DP x CP, which is DP without CP.
  Communicator& Reduction() const { return dpcp ? *dpcp : *dp; }
  // Step outputs.
  double loss = 0, grad_norm = 0;
  std::vector<RankReport> reports;  // after a step: every rank's, by global rank
  double eval_loss = 0;             // after Evaluate: the job's loss
  bool eval_root_ok = false;        // the rank that computed it succeeded
  bool skipped = false;  // non-finite norm or loss under NanPolicy::kSkip: no update
};

// One persistent thread per local rank but the first, which runs on the caller's thread.
// Starting a thread per rank for every step cost ~0.3 ms of each step on the CPU backend (the
// ranks began their work that late; see issue 16's note), which the runtime model never sees.
class RankThreads {
 public:
  explicit RankThreads(size_t n) {
    for (size_t i = 1; i < n; ++i) threads_.emplace_back([this, i] { Work(i); });
  }
  ~RankThreads() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    start_.notify_all();
    for (std::thread& th : threads_) th.join();
  }
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  // fn(i) for every i < 1 + workers, fn(0) on this thread; returns when all have returned.
  void Run(const std::function<void(size_t)>& fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      task_ = &fn;
      pending_ = threads_.size();
      ++generation_;
    }
    start_.notify_all();
    fn(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return pending_ == 0; });
    task_ = nullptr;
  }

 private:
  void Work(size_t i) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(size_t)>* task = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        start_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        task = task_;
      }
      (*task)(i);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable start_, done_;
  const std::function<void(size_t)>* task_ = nullptr;
  uint64_t generation_ = 0;
  size_t pending_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace

const char* ToString(StepEventKind k) {
  switch (k) {
    case StepEventKind::kForward: return "forward";
    case StepEventKind::kBackward: return "backward";
    case StepEventKind::kP2p: return "p2p";
    case StepEventKind::kTpComm: return "tp";
    case StepEventKind::kCpComm: return "cp";
    case StepEventKind::kEpComm: return "ep";
    case StepEventKind::kDpComm: return "dp";
    case StepEventKind::kEmbedding: return "embedding";
    case StepEventKind::kOptimizer: return "optimizer";
  }
  return "?";
}

double OptimizerConfig::LearningRate(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps) return lr * double(step + 1) / warmup_steps;
  const double t = decay_steps > 0 ? double(step - warmup_steps) / decay_steps : 1.0;
  if (t >= 1.0) return min_lr;
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(std::numbers::pi * t));
}

Status ValidateOptimizer(const OptimizerConfig& o, const std::string& where) {
  const struct {
    const char* key;
    double value;
    const Range& range;
  } settings[] = {{"lr", o.lr, limits::kLearningRate},
                  {"min_lr", o.min_lr, limits::kMinLearningRate},
                  {"beta1", o.beta1, limits::kAdamBeta},
                  {"beta2", o.beta2, limits::kAdamBeta},
                  {"eps", o.eps, limits::kAdamEps},
                  {"weight_decay", o.weight_decay, limits::kWeightDecay},
                  {"clip_grad", o.clip_grad, limits::kClipGrad}};
  const std::string at = where + ": optimizer.";
  for (const auto& s : settings)
    PTDP_RETURN_IF_ERROR(CheckRange(s.value, s.range).Prefixed(at + s.key));
  PTDP_RETURN_IF_ERROR(CheckCount(o.warmup_steps, 0, kMaxSteps).Prefixed(at + "warmup_steps"));
  PTDP_RETURN_IF_ERROR(CheckCount(o.decay_steps, 0, kMaxSteps).Prefixed(at + "decay_steps"));
  const Range up_to_lr{"minimum learning rate", 0, o.lr, std::nullopt};  // min_lr <= lr
  PTDP_RETURN_IF_ERROR(CheckRange(o.min_lr, up_to_lr).Prefixed(at + "min_lr (at most lr)"));
  return Status::Ok();
}

struct Trainer::Impl {
  TrainerConfig cfg;
  RankGrid grid{1, 1, 1};
  Schedule schedule;
  // s: the whole sequence; sc = s/c the rows a CP rank holds; sl = sc/t with SP else sc.
  int t = 1, c = 1, p = 1, d = 1, v = 1, m = 1, b = 1, s = 1, sc = 1, sl = 1, h = 1;
  int ep = 1, etp = 1;  // the expert grid (MoE models)
  bool moe = false;
  // --overlap-grad-reduce where the communicators can run beside compute
  // (CommunicatorFactory::CollectivesBesideCompute); else one bucket a group after the backward.
  bool overlap_grad = false;
  // Megatron's --grad-reduce-in-bf16 (Layout::grad_reduce_in_bf16, bf16 runs only): its
  // gradient buffers are bf16, so each micro-batch's gradients are added to bf16 sums and the
  // DP reduction runs on bf16. Here the backward still adds into the fp32 grad buffer (every
  // backend op's gradient output is fp32) and the rounding points are Megatron's: after each
  // micro-batch's backward but the chunk's last the buffer is rounded to bf16 in place (through
  // the bf16 mirror rk.grad_wire); at the reduction each bucket (each sliced parameter) is
  // rounded into the mirror, scaled by 1/d there (Megatron scales before the collective), reduced
  // in bf16 (the communicator sums in fp32 and rounds once, NCCL in its ring) and copied back
  // into fp32 for the optimizer, as Megatron's optimizer reads the bf16 grads into fp32.
  bool bf16_grads = false;
  // The shard degree of a parameter (etp for routed experts) and a rank's shard index of it.
  int Degree(const ParamSpec& ps) const { return ShardDegree(ps, t, etp); }
  int ShardOf(const ParamSpec& ps, int rank) const {
    return ps.expert >= 0 ? grid.Expert(rank).etp : grid.Coord(rank).tp;
  }
  std::vector<Rank> ranks;
  std::unique_ptr<RankThreads> threads;  // one per local rank, made by Build
  int64_t steps = 0;
  int64_t optimizer_steps = 0;  // AdamW updates applied: the LR schedule's and Adam's step

  // The dtype of the activations (and their gradients) the stages exchange (GptChunk::act_dtype).
  DType Act() const { return cfg.bf16 ? DType::kBF16 : DType::kF32; }
  int Stage(int r, int c) const { return c * p + r; }
  bool FirstStage(int r, int c) const { return Stage(r, c) == 0; }
  bool LastStage(int r, int c) const { return Stage(r, c) == p * v - 1; }

  Status Build(BackendFactory& backends, CommunicatorFactory& comms,
               const std::vector<int>& local);
  std::vector<GroupSet> GroupSets() const;
  Status BuildState(Rank& rk);
  Status RunStep(Rank& rk);
  Status RunOps(Rank& rk);
  Status RunGroup(Rank& rk, const std::vector<ScheduleOp>& ops, size_t begin, size_t end,
                  std::map<Key, Tensor>& received, std::map<Key, Tensor>& to_send);
  Status ReduceGradients(Rank& rk);
  Result<Tensor> ScatterInput(Rank& rk, const ParamState& ps);
  Status LaunchScatter(Rank& rk, size_t k);
  void LaunchBucket(Rank& rk, size_t k);
  // --grad-reduce-in-bf16: `grads` rounded into `wire` (bf16), scaled there by 1/d.
  void ToWire(Rank& rk, const Tensor& grads, Tensor& wire);
  // The same buffers' bf16 view of a parameter's gradient (flattened).
  Tensor WireOf(Rank& rk, const ParamState& ps) const;
  // --grad-reduce-in-bf16: chunk c's grad buffer rounded to bf16 values in place.
  void RoundGrads(Rank& rk, int c);
  Status ReduceEmbedding(Rank& rk);
  Status OptimizerStep(Rank& rk);
  Result<Tensor> GatherOutput(Rank& rk, const ParamState& ps);
  void PutGathered(Rank& rk, const ParamState& ps, const Tensor& full);
  Status GatherParams(Rank& rk);
  Status LaunchGathers(Rank& rk);
  Status AwaitGathers(Rank& rk, int chunk, int moment);
  Status AwaitAllGathers(Rank& rk) { return AwaitGathers(rk, -1, 0); }
  void AddReducerSpans(Rank& rk, const std::vector<GradReducer::Span>& spans);
  Status MeasureExpertLoad(Rank& rk);
  Result<Tensor> Tokens(Rank& rk, int64_t step, int mb, bool targets);
  // Row j < sc of this CP rank's part of a sequence: its position in the whole sequence
  // (Megatron's load balancing: chunks cp_rank and 2c-1-cp_rank of 2c).
  int CpPosition(int cp_rank, int j) const;
  Status EvaluateRank(Rank& rk, const std::vector<int32_t>& windows, int count, double* loss);
  Status AllGatherRaw(Rank& rk, const void* mine, size_t bytes, std::vector<int32_t>* all);
  Status ExchangeReports(Rank& rk, const RankReport& mine);
  Status BroadcastDoubles(Rank& rk, int root, double* values, int64_t n);
  std::vector<ShardSource> ShardSources() const;
  Status GatherShards(Rank& rk, const std::vector<ShardSource>& sources,
                      std::map<std::string, std::vector<float>>* out);
  // Checkpoint state (bottom of this file).
  // What ExportRank hands over, once per tensor of a parameter that rank rk writes: the
  // tensor's name, the parameter, the shard index (ShardOf), the rank's local copy of the tensor
  // (LocalShape, flat) and the local elements [begin, end) it is the writer of.
  using StateSink = std::function<void(const std::string& name, const ParamSpec& ps, int shard,
                                       const std::vector<float>& local, int64_t begin,
                                       int64_t end)>;
  Status ExportRank(Rank& rk, const StateSink& put);
  Status SumStateOverWorld(Rank& rk, TrainingState& st);
  Status ImportRank(Rank& rk, const std::map<std::string, const NamedTensor*>& by_name);
  std::vector<NamedTensor> StateTable(bool fill) const;
};

namespace {

// Runs fn(rank) for every local rank, each on its own thread of `threads`. On failure returns
// the failure that names the silent rank when one stopped answering (runtime/failures.h),
// prefixed with its rank.
Status OnEveryRank(RankThreads& threads, std::vector<Rank>& ranks,
                   const std::function<Status(Rank&)>& fn) {
  std::vector<Status> status(ranks.size());
  std::vector<Clock::time_point> done(ranks.size());
  threads.Run([&](size_t i) {
    status[i] = fn(ranks[i]);
    done[i] = Clock::now();
  });
  // By global rank (ranks of other processes count as OK here), for the root-cause search.
  size_t n = 0;
  for (const Rank& rk : ranks) n = std::max(n, size_t(rk.global) + 1);
  std::vector<Status> by_global(n);
  std::vector<Clock::time_point> when(n, Clock::now());
  for (size_t i = 0; i < ranks.size(); ++i) {
    by_global[size_t(ranks[i].global)] = status[i];
    when[size_t(ranks[i].global)] = done[i];
  }
  return ReportRankFailures(by_global, when);
}


}  // namespace

// Every group the layout uses, label by label in the order Build asks for them.
std::vector<GroupSet> Trainer::Impl::GroupSets() const {
  std::vector<GroupSet> sets = {{"TP", grid.AllTpGroups()},
                                {"PP", grid.AllPpGroups()},
                                {"DP", grid.AllDpGroups()},
                                {"EMB", {}},
                                {"WORLD", {}}};
  for (const std::vector<int>& pipeline : grid.AllPpGroups()) {
    if (p == 1) {  // a 1-rank embedding group per rank
      for (int g : pipeline) sets[3].groups.push_back(grid.EmbeddingGroup(g));
    } else {
      sets[3].groups.push_back(grid.EmbeddingGroup(pipeline.front()));
    }
  }
  std::vector<int> all(size_t(grid.world()));
  for (int g = 0; g < grid.world(); ++g) all[size_t(g)] = g;
  sets[4].groups.push_back(all);
  if (c > 1) {
    sets.push_back({"CP", grid.AllCpGroups()});
    sets.push_back({"DPCP", grid.AllDpCpGroups()});
  }
  if (moe) {
    sets.push_back({"EP", grid.AllEpGroups()});
    sets.push_back({"ETP", grid.AllEtpGroups()});
    sets.push_back({"EDP", grid.AllEdpGroups()});
    sets.push_back({"TPCP", grid.AllTpCpGroups()});
  }
  return sets;
}

Status Trainer::Impl::Build(BackendFactory& backends, CommunicatorFactory& comms,
                            const std::vector<int>& local) {
  const Layout& l = cfg.layout;
  t = l.tp, c = l.cp, p = l.pp, d = l.dp, v = l.vp, b = l.micro_batch;
  m = int(l.num_microbatches());
  s = int(cfg.model.seq_len), h = int(cfg.model.hidden);
  sc = s / c;
  sl = l.sequence_parallel ? sc / t : sc;
  moe = cfg.model.moe();
  ep = moe ? l.ep : 1;
  overlap_grad = l.overlap_grad_reduce && comms.CollectivesBesideCompute();
  bf16_grads = l.grad_reduce_in_bf16;
  etp = moe ? l.expert_tp() : 1;
  grid = RankGrid(t, c, d, p, etp, ep);
  PTDP_ASSIGN_OR_RETURN(schedule, BuildSchedule(l.schedule, p, v, m, l.microbatch_group));
  const std::vector<GroupSet> sets = GroupSets();
  PTDP_RETURN_IF_ERROR(comms.Prepare(sets).Prefixed("preparing the communicators"));
  ranks.resize(local.size());
  threads = std::make_unique<RankThreads>(ranks.size());
  for (size_t i = 0; i < local.size(); ++i) {
    const int g = local[i];
    Rank& rk = ranks[i];
    rk.global = g;
    rk.coord = grid.Coord(g);
    const std::string where = "rank " + Str(g);
    rk.backend = backends(g);
    if (!rk.backend) return Status::Error(where + ": the backend factory gave no backend");
    PTDP_ASSIGN_OR_RETURN(auto tp, comms.Group(g, grid.TpGroup(g), "TP"));
    rk.tp = std::make_unique<TimedCommunicator>(std::move(tp), &rk.clock);
    PTDP_ASSIGN_OR_RETURN(rk.pp, comms.Group(g, grid.PpGroup(g), "PP"));
    PTDP_ASSIGN_OR_RETURN(rk.dp, comms.Group(g, grid.DpGroup(g), "DP"));
    if (c > 1) {
      PTDP_ASSIGN_OR_RETURN(auto cpc, comms.Group(g, grid.CpGroup(g), "CP"));
      rk.cp = std::make_unique<TimedCommunicator>(std::move(cpc), &rk.clock,
                                                  StepEventKind::kCpComm);
      PTDP_ASSIGN_OR_RETURN(rk.dpcp, comms.Group(g, grid.DpCpGroup(g), "DPCP"));
    }
    rk.expert = grid.Expert(g);
    if (moe) {
      auto timed = [&](std::unique_ptr<Communicator> inner) {
        return std::make_unique<TimedCommunicator>(std::move(inner), &rk.clock,
                                                   StepEventKind::kEpComm);
      };
      PTDP_ASSIGN_OR_RETURN(auto epc, comms.Group(g, grid.EpGroup(g), "EP"));
      PTDP_ASSIGN_OR_RETURN(auto etpc, comms.Group(g, grid.EtpGroup(g), "ETP"));
      PTDP_ASSIGN_OR_RETURN(rk.edp, comms.Group(g, grid.EdpGroup(g), "EDP"));
      PTDP_ASSIGN_OR_RETURN(auto tpcpc, comms.Group(g, grid.TpCpGroup(g), "TPCP"));
      rk.ep = timed(std::move(epc));
      rk.etp = timed(std::move(etpc));
      rk.tpcp = timed(std::move(tpcpc));
    }
    if (rk.coord.pp == 0 || rk.coord.pp == p - 1) {
      PTDP_ASSIGN_OR_RETURN(rk.emb, comms.Group(g, grid.EmbeddingGroup(g), "EMB"));
    }
    PTDP_ASSIGN_OR_RETURN(rk.world, comms.Group(g, sets[4].groups[0], "WORLD"));
    for (int c = 0; c < v; ++c) {
      GptChunkConfig cc;
      cc.model = cfg.model;
      // The plan's split (Megatron's get_num_layers_to_build: even, first/last-stage counts,
      // embedding/loss accounting or a layout string; core/layout.h ChunkLayers).
      cc.first_layer = ChunkFirstLayer(cfg.model, l, rk.coord.pp, c);
      cc.n_layers = ChunkLayers(cfg.model, l, rk.coord.pp, c);
      cc.has_embedding = FirstStage(rk.coord.pp, c);
      cc.has_output = LastStage(rk.coord.pp, c);
      cc.tp = t;
      cc.tp_rank = rk.coord.tp;
      cc.sequence_parallel = l.sequence_parallel;
      cc.cp = l.cp;  // (c here is the chunk index)
      cc.cp_rank = rk.coord.cp;
      cc.recompute = l.recompute;
      cc.seed = cfg.seed;
      cc.bf16 = cfg.bf16;
      cc.ep = ep;
      cc.ep_rank = rk.expert.ep;
      cc.etp = etp;
      cc.etp_rank = rk.expert.etp;
      GptChunkComms cm;
      cm.tp = rk.tp.get();
      cm.cp = rk.cp.get();
      cm.ep = rk.ep.get();
      cm.etp = rk.etp.get();
      cm.tokens = rk.tpcp.get();
      auto chunk = GptChunk::Create(cc, *rk.backend, cm);
      if (!chunk.ok()) return chunk.status().Prefixed(where + " chunk " + Str(c));
      rk.chunks.push_back(std::move(chunk).value());
    }
    rk.data = std::make_unique<DataLoader>(cfg.train_tokens, s, l.global_batch, cfg.seed);
    PTDP_RETURN_IF_ERROR(BuildState(rk).Prefixed(where));
    // A bucket that waits for a backward and has peers, or a dist-opt slice (its reduce-scatter
    // and its all-gather go beside the compute).
    bool overlapped = false;
    for (const Rank::GradBucket& bucket : rk.buckets)
      overlapped = overlapped || (!bucket.moments.empty() && bucket.group->size() > 1);
    for (const ParamState& ps : rk.state) overlapped = overlapped || (overlap_grad && ps.slices > 1);
    const std::vector<ScheduleOp>& ops = schedule.ranks[size_t(rk.coord.pp)];
    rk.last_backward.assign(size_t(v), ops.size());
    for (size_t i = 0; i < ops.size(); ++i)
      if (ops[i].kind == OpKind::kBackward) rk.last_backward[size_t(ops[i].chunk)] = i;
    if (overlapped) {
      rk.reducer = std::make_unique<GradReducer>();
      // --overlap-param-gather: the sliced parameters in the order the forward reads them
      // (chunk by chunk, embedding, layers, output), once.
      // (Off: the all-gathers follow the optimizer step, as without the reducer.)
      for (size_t k = 0; k < rk.state.size() && l.overlap_param_gather; ++k)
        if (rk.state[k].slices > 1) rk.gather_order.push_back(k);
      std::stable_sort(rk.gather_order.begin(), rk.gather_order.end(), [&](size_t a, size_t b) {
        const ParamState &x = rk.state[a], &y = rk.state[b];
        return std::pair(x.chunk, ForwardOrder(x.part)) < std::pair(y.chunk, ForwardOrder(y.part));
      });
    }
    rk.backend->ResetPeak();
  }
  return Status::Ok();
}

namespace {

// A bf16 run's fp32 main weights: this rank's owned slice of the parameter's initial values
// (its value holds their bf16 rounding).
Status InitMainWeights(Backend& be, const GptChunk& chunk, ParamState& ps) {
  if (ps.owned == 0) return Status::Ok();
  std::vector<float> initial(size_t(ps.numel));
  chunk.InitialValue(*ps.param, initial.data());
  Tensor main = ps.main.View(Shape({ps.owned}));
  return be.CopyFromHost(initial.data() + ps.slice * ps.k, main);
}

}  // namespace

Status Trainer::Impl::BuildState(Rank& rk) {
  Backend& be = *rk.backend;
  const Layout& lay = cfg.layout;
  // With the overlap, SP's TP-partial gradients (FinalizeTpGrads sums them first) are reduced
  // after the backward, in buckets of their own.
  const bool tp_partial = overlap_grad && lay.sequence_parallel && t > 1;
  for (size_t ci = 0; ci < rk.chunks.size(); ++ci)
    for (const ChunkParam& cp : rk.chunks[ci]->params()) {
      const auto& chunk = rk.chunks[ci];
      ParamState ps;
      ps.param = chunk->Find(cp.spec.name);
      ps.chunk = int(ci);
      ps.part = chunk->GradsDoneAt(cp.spec);
      if (overlap_grad && !(tp_partial && cp.tp_partial_grad))
        ps.moment = ps.part;
      // Routed experts: reduced (and with dist-opt sliced) over expert DP.
      ps.group = cp.spec.expert >= 0 ? rk.edp.get() : &rk.Reduction();
      const int index = ps.group->rank();
      const bool sliced = cfg.layout.distributed_optimizer && ps.group->size() > 1;
      ps.slices = sliced ? ps.group->size() : 1;
      ps.slice = sliced ? index : 0;
      ps.numel = cp.value.numel();
      ps.k = (ps.numel + ps.slices - 1) / ps.slices;
      ps.owned = std::clamp<int64_t>(ps.numel - ps.slice * ps.k, 0, ps.k);
      ps.decay = DecaysWeight(cp.spec);
      const bool tied_copy = cp.spec.name == "embedding.word" && !chunk->config().has_embedding;
      ps.counts_in_norm = !tied_copy &&
                          (cp.spec.shard != ShardKind::kReplicated || rk.coord.tp == 0) &&
                          (sliced || index == 0);
      if (ps.slices > 1) {  // its own slice of state and of the reduced gradient
        const Shape slice({std::max<int64_t>(ps.owned, 1)});
        PTDP_ASSIGN_OR_RETURN(ps.m, be.Alloc(slice, DType::kF32));
        PTDP_ASSIGN_OR_RETURN(ps.v, be.Alloc(slice, DType::kF32));
        if (cfg.bf16) {
          PTDP_ASSIGN_OR_RETURN(ps.main, be.Alloc(slice, DType::kF32));
          PTDP_RETURN_IF_ERROR(InitMainWeights(be, *chunk, ps));
        }
        PTDP_ASSIGN_OR_RETURN(ps.grad_slice, be.Alloc({ps.k}, DType::kF32));
        if (bf16_grads) {
          PTDP_ASSIGN_OR_RETURN(ps.wire_slice, be.AllocUninit({ps.k}, DType::kBF16));
        }
      } else {
        ps.grad_slice = cp.grad.View(Shape({ps.numel}));
      }
      rk.state.push_back(std::move(ps));
    }
  // Per chunk, the whole (not sliced) parameters in buffer order: their AdamW state in flat
  // buffers of the same order (m, v, and the bf16 run's fp32 main weights), the DP buckets
  // (runs that lie next to each other and share a reduction group) and the optimizer's runs
  // (next to each other, same weight decay and norm role), each one call of SumSquares and of
  // AdamW. Every rank of a group has the same chunks and parameters, so they issue the same
  // collectives in the same order.
  if (bf16_grads)
    for (const auto& chunk : rk.chunks) {
      Tensor wire;
      PTDP_ASSIGN_OR_RETURN(wire, be.AllocUninit({chunk->grad_buffer().numel()}, DType::kBF16));
      rk.grad_wire.push_back(std::move(wire));
    }
  size_t i = 0;
  // Megatron's buckets (Layout::GradBucketParams), none (one per group) without
  // --overlap-grad-reduce; param_and_grad_buffer.py closes a bucket once it holds at least
  // bucket_size parameters, walking them in backward (reverse) order.
  const int64_t cap = overlap_grad ? lay.GradBucketParams() : std::numeric_limits<int64_t>::max();
  for (size_t ci = 0; ci < rk.chunks.size(); ++ci) {
    auto& chunk = rk.chunks[ci];
    std::vector<ParamState*> whole;
    for (size_t n = 0; n < chunk->params().size(); ++n, ++i)
      if (rk.state[i].slices == 1) whole.push_back(&rk.state[i]);
    std::sort(whole.begin(), whole.end(), [](const ParamState* a, const ParamState* b) {
      return a->param->offset < b->param->offset;
    });
    int64_t total = 0;
    for (const ParamState* ps : whole) total += ps->numel;
    if (total == 0) continue;
    Tensor m, v, main;
    PTDP_ASSIGN_OR_RETURN(m, be.Alloc({total}, DType::kF32));
    PTDP_ASSIGN_OR_RETURN(v, be.Alloc({total}, DType::kF32));
    if (cfg.bf16) {
      PTDP_ASSIGN_OR_RETURN(main, be.AllocUninit({total}, DType::kF32));
    }
    // Runs as [first, last] indices into `whole`, then views.
    struct Span { size_t first, last; int64_t at; };
    std::vector<Span> buckets, runs;
    int64_t at = 0;  // in the state buffers
    for (size_t j = 0; j < whole.size(); ++j) {
      ParamState& ps = *whole[j];
      const Shape shape({ps.numel});
      ps.m = m.View(shape, at);
      ps.v = v.View(shape, at);
      if (cfg.bf16) {
        ps.main = main.View(shape, at);
        PTDP_RETURN_IF_ERROR(InitMainWeights(be, *chunk, ps));
      }
      const ParamState* prev = j > 0 ? whole[j - 1] : nullptr;
      const bool next_to = prev && ps.param->offset == prev->param->offset + prev->numel;
      if (!next_to || ps.group != prev->group) buckets.push_back({j, j, at});
      if (!next_to || ps.decay != prev->decay || ps.counts_in_norm != prev->counts_in_norm)
        runs.push_back({j, j, at});
      buckets.back().last = runs.back().last = j;
      at += ps.numel;
    }
    auto numel = [&](const Span& sp) {
      return whole[sp.last]->param->offset + whole[sp.last]->numel - whole[sp.first]->param->offset;
    };
    // With the overlap, each group's run split from its end into buckets of at least `cap`
    // parameters, and apart where SP's TP-partial gradients begin or end.
    std::vector<Span> split;
    for (const Span& sp : buckets) {
      size_t last = sp.last;
      int64_t held = 0;
      for (size_t j = sp.last + 1; j-- > sp.first;) {
        held += whole[j]->numel;
        const bool edge = j == sp.first || held >= cap ||
                          (tp_partial && whole[j - 1]->param->tp_partial_grad !=
                                             whole[j]->param->tp_partial_grad);
        if (!edge) continue;
        split.push_back({j, last, 0});
        last = j - 1;
        held = 0;
      }
    }
    std::sort(split.begin(), split.end(), [](const Span& a, const Span& b) { return a.first < b.first; });
    for (const Span& sp : split) {
      Rank::GradBucket bucket;
      bucket.group = whole[sp.first]->group;
      bucket.grads = chunk->grad_buffer().View(Shape({numel(sp)}), whole[sp.first]->param->offset);
      if (bf16_grads)
        bucket.wire = rk.grad_wire[ci].View(Shape({numel(sp)}), whole[sp.first]->param->offset);
      bucket.chunk = int(ci);
      if (overlap_grad && !(tp_partial && whole[sp.first]->param->tp_partial_grad)) {
        for (size_t j = sp.first; j <= sp.last; ++j)
          bucket.moments.push_back(chunk->GradsDoneAt(whole[j]->param->spec));
        std::sort(bucket.moments.begin(), bucket.moments.end());
        bucket.moments.erase(std::unique(bucket.moments.begin(), bucket.moments.end()),
                             bucket.moments.end());
      }
      rk.buckets.push_back(std::move(bucket));
    }
    for (const Span& sp : runs) {
      const Shape shape({numel(sp)});
      const int64_t offset = whole[sp.first]->param->offset;
      Rank::OptimizerRun r;
      r.value = chunk->value_buffer().View(shape, offset);
      r.grad = chunk->grad_buffer().View(shape, offset);
      r.m = m.View(shape, sp.at);
      r.v = v.View(shape, sp.at);
      if (cfg.bf16) r.main = main.View(shape, sp.at);
      r.decay = whole[sp.first]->decay;
      r.counts_in_norm = whole[sp.first]->counts_in_norm;
      rk.runs.push_back(std::move(r));
    }
  }
  return Status::Ok();
}

int Trainer::Impl::CpPosition(int cp_rank, int j) const {
  return c == 1 ? j : int(LoadBalancedChunks(s, c, cp_rank).Position(j));
}

// (b, sc) token ids of micro-batch `mb` of this rank's DP share at `step`: the inputs [:, :s],
// or with `targets` the next tokens [:, 1:], at this CP rank's positions.
Result<Tensor> Trainer::Impl::Tokens(Rank& rk, int64_t step, int mb, bool targets) {
  std::vector<int32_t> window(size_t(b) * size_t(s + 1)), out(size_t(b) * size_t(sc));
  rk.data->MicroBatch(step, rk.coord.dp, d, b, mb, window.data());
  for (int i = 0; i < b; ++i)
    for (int j = 0; j < sc; ++j)
      out[size_t(i * sc + j)] =
          window[size_t(i * (s + 1) + CpPosition(rk.coord.cp, j) + (targets ? 1 : 0))];
  PTDP_ASSIGN_OR_RETURN(Tensor tk, rk.backend->Alloc({b, sc}, DType::kI32));
  PTDP_RETURN_IF_ERROR(rk.backend->CopyFromHost(out.data(), tk));
  return tk;
}

// One group of p2p ops [begin, end) of the schedule, posted together on the PP group.
Status Trainer::Impl::RunGroup(Rank& rk, const std::vector<ScheduleOp>& ops, size_t begin,
                               size_t end, std::map<Key, Tensor>& received,
                               std::map<Key, Tensor>& to_send) {
  const PhaseClock::Open t0 = rk.clock.Start();
  PTDP_RETURN_IF_ERROR(rk.pp->GroupStart());
  std::vector<Key> sent;
  Status st;
  for (size_t i = begin; i < end && st.ok(); ++i) {
    const ScheduleOp& op = ops[i];
    const bool grad = op.kind == OpKind::kSendGradient || op.kind == OpKind::kRecvGradient;
    const Key key{op.microbatch, op.chunk, grad};
    if (op.kind == OpKind::kSendActivation || op.kind == OpKind::kSendGradient) {
      auto it = to_send.find(key);
      if (it == to_send.end())
        st = Status::Error(std::string(ToString(op.kind)) + " of micro-batch " +
                           Str(op.microbatch) + " chunk " + Str(op.chunk) + ": nothing computed");
      else
        st = rk.pp->Send(it->second, op.peer);
      sent.push_back(key);
    } else {
      auto x = rk.backend->AllocUninit({sl, b, h}, Act());  // Recv overwrites it
      if (!x.ok()) {
        st = x.status();
      } else {
        received[key] = std::move(x).value();
        st = rk.pp->Recv(received[key], op.peer);
      }
    }
  }
  Status end_st = rk.pp->GroupEnd();
  for (const Key& k : sent) to_send.erase(k);
  rk.clock.Stop(t0, StepEventKind::kP2p, ops[begin].microbatch, ops[begin].chunk,
                &RankTimes::pp_wait_s);
  PTDP_RETURN_IF_ERROR(st);
  return end_st;
}

// Walks this rank's schedule: forwards, backwards, p2p groups and the end-of-step ops.
Status Trainer::Impl::RunOps(Rank& rk) {
  const int r = rk.coord.pp;
  const std::vector<ScheduleOp>& ops = schedule.ranks[size_t(r)];
  std::map<Key, Tensor> received, to_send;
  const float loss_scale = 1.0f / float(m);
  for (size_t i = 0; i < ops.size();) {
    const ScheduleOp& op = ops[i];
    if (op.is_p2p()) {
      size_t j = i + 1;
      while (op.group >= 0 && j < ops.size() && ops[j].is_p2p() && ops[j].group == op.group) ++j;
      PTDP_RETURN_IF_ERROR(RunGroup(rk, ops, i, j, received, to_send));
      i = j;
      continue;
    }
    const std::string what = std::string(ToString(op.kind)) + " of micro-batch " +
                             Str(op.microbatch) + " chunk " + Str(op.chunk);
    GptChunk* chunk = op.chunk >= 0 ? rk.chunks[size_t(op.chunk)].get() : nullptr;
    const bool compute = op.kind == OpKind::kForward || op.kind == OpKind::kBackward;
    const PhaseClock::Open t0 = compute ? rk.clock.Start() : PhaseClock::Open{};
    if (op.kind == OpKind::kForward) {
      Tensor input, targets;
      if (FirstStage(r, op.chunk)) {
        PTDP_ASSIGN_OR_RETURN(input, Tokens(rk, steps, op.microbatch, false));
      } else {
        auto it = received.find({op.microbatch, op.chunk, false});
        if (it == received.end()) return Status::Error(what + ": no activation received");
        input = std::move(it->second);
        received.erase(it);
      }
      if (LastStage(r, op.chunk)) {
        PTDP_ASSIGN_OR_RETURN(targets, Tokens(rk, steps, op.microbatch, true));
      }
      // --overlap-param-gather: each part of the forward waits for its parameters' all-gathers.
      GptChunk::ParamsNeeded need;
      if (rk.gathered < rk.gathers.size())
        need = [this, &rk, &op](int moment) { return AwaitGathers(rk, op.chunk, moment); };
      auto out = chunk->Forward(op.microbatch, input, targets, loss_scale, need);
      if (!out.ok()) return out.status().Prefixed(what);
      if (LastStage(r, op.chunk)) {
        float host = 0;
        PTDP_RETURN_IF_ERROR(rk.backend->CopyToHost(*out, &host));
        rk.loss += double(host);
      } else {
        to_send[{op.microbatch, op.chunk, false}] = std::move(out).value();
      }
      rk.clock.Stop(t0, StepEventKind::kForward, op.microbatch, op.chunk, &RankTimes::forward_s);
    } else if (op.kind == OpKind::kBackward) {
      Tensor grad_out;
      if (!LastStage(r, op.chunk)) {
        auto it = received.find({op.microbatch, op.chunk, true});
        if (it == received.end()) return Status::Error(what + ": no gradient received");
        grad_out = std::move(it->second);
        received.erase(it);
      }
      // --overlap-grad-reduce: the chunk's last backward of the step hands each bucket to the
      // reducer once its parameters' gradients are complete.
      GptChunk::GradsDone done;
      if (rk.reducer && rk.last_backward[size_t(op.chunk)] == i)
        done = [this, &rk, &op](int moment) -> Status {
          for (size_t k = 0; k < rk.buckets.size(); ++k) {
            Rank::GradBucket& bucket = rk.buckets[k];
            if (bucket.chunk != op.chunk || bucket.launched || bucket.group->size() == 1 ||
                !std::binary_search(bucket.moments.begin(), bucket.moments.end(), moment))
              continue;
            if (--bucket.pending > 0) continue;
            LaunchBucket(rk, k);
          }
          for (size_t k = 0; k < rk.state.size(); ++k) {
            ParamState& ps = rk.state[k];
            if (ps.slices > 1 && ps.chunk == op.chunk && ps.moment == moment)
              PTDP_RETURN_IF_ERROR(LaunchScatter(rk, k));
          }
          return Status::Ok();
        };
      auto dx = chunk->Backward(op.microbatch, grad_out, done);
      if (!dx.ok()) return dx.status().Prefixed(what);
      // --grad-reduce-in-bf16: the micro-batch's sums kept in bf16 (the last one's are rounded
      // on their way to the reduction).
      if (bf16_grads && rk.last_backward[size_t(op.chunk)] != i) RoundGrads(rk, op.chunk);
      if (!FirstStage(r, op.chunk)) to_send[{op.microbatch, op.chunk, true}] = std::move(dx).value();
      rk.clock.Stop(t0, StepEventKind::kBackward, op.microbatch, op.chunk, &RankTimes::backward_s);
    } else if (op.kind == OpKind::kReduceGradients) {
      PTDP_RETURN_IF_ERROR(ReduceGradients(rk).Prefixed("reduce gradients"));
    } else if (op.kind == OpKind::kReduceEmbedding) {
      PTDP_RETURN_IF_ERROR(ReduceEmbedding(rk).Prefixed("reduce embedding"));
    } else if (op.kind == OpKind::kOptimizerStep) {
      PTDP_RETURN_IF_ERROR(OptimizerStep(rk).Prefixed("optimizer step"));
    }
    ++i;
  }
  if (!received.empty() || !to_send.empty())
    return Status::Error("schedule of pipeline rank " + Str(r) + " left " +
                         Str(int64_t(received.size() + to_send.size())) + " tensors unused");
  return Status::Ok();
}

// TP (SP-partial grads), then each parameter's reduction group (DP x CP for dense ones):
// all-reduce SUM / d of each bucket (BuildState), or per parameter the dist-opt
// reduce-scatter. The CP ranks' gradients are partial sums
// over their tokens (each rank's loss is its tokens' share of the mean), so they add up; the
// DP replicas' are means, so they are averaged.
Status Trainer::Impl::ReduceGradients(Rank& rk) {
  PTDP_RETURN_IF_ERROR(AwaitAllGathers(rk));  // the forwards took them all; none may be left
  for (auto& chunk : rk.chunks) PTDP_RETURN_IF_ERROR(chunk->FinalizeTpGrads());
  const PhaseClock::Open t0 = rk.clock.Start();
  Backend& be = *rk.backend;
  const float inv_d = 1.0f / float(d);
  if (rk.reducer) {
    // --overlap-grad-reduce: what the backward did not hand over (SP's TP-partial gradients,
    // just summed over TP), then wait for all (Megatron's finish_grad_sync).
    for (size_t k = 0; k < rk.buckets.size(); ++k) {
      const Rank::GradBucket& bucket = rk.buckets[k];
      if (!bucket.launched && bucket.group->size() > 1) LaunchBucket(rk, k);
    }
    for (size_t k = 0; k < rk.state.size(); ++k)
      if (rk.state[k].slices > 1 && !rk.state[k].launched) PTDP_RETURN_IF_ERROR(LaunchScatter(rk, k));
    std::vector<GradReducer::Span> spans;
    const Status st = rk.reducer->Wait(&spans);
    rk.scatter_inputs.clear();
    AddReducerSpans(rk, spans);
    PTDP_RETURN_IF_ERROR(st);
  }
  for (Rank::GradBucket& bucket : rk.buckets) {
    // A group of 1: routed experts held once, which saw every replica's tokens.
    const bool peers = bucket.group->size() > 1;
    if (bf16_grads) {  // scaled before the reduction, in bf16 (ToWire)
      if (!(peers && rk.reducer)) {
        ToWire(rk, bucket.grads, bucket.wire);
        if (peers) PTDP_RETURN_IF_ERROR(bucket.group->AllReduce(bucket.wire, ReduceOp::kSum));
      }
      be.Copy(bucket.wire, bucket.grads);
      continue;
    }
    if (peers && !rk.reducer)
      PTDP_RETURN_IF_ERROR(bucket.group->AllReduce(bucket.grads, ReduceOp::kSum));
    if (d > 1) be.Scale(inv_d, bucket.grads);
  }
  for (ParamState& ps : rk.state) {
    if (ps.slices == 1) continue;  // in a bucket
    if (!rk.reducer) {
      PTDP_ASSIGN_OR_RETURN(const Tensor in, ScatterInput(rk, ps));
      PTDP_RETURN_IF_ERROR(ps.group->ReduceScatter(in, bf16_grads ? ps.wire_slice : ps.grad_slice,
                                                   ReduceOp::kSum));
    }
    if (bf16_grads)
      be.Copy(ps.wire_slice, ps.grad_slice);
    else
      be.Scale(inv_d, ps.grad_slice);
  }
  rk.clock.Stop(t0, StepEventKind::kDpComm, -1, -1, &RankTimes::dp_comm_s);
  return Status::Ok();
}

// The dist-opt reduce-scatter's input: the parameter's gradient flattened, zero-padded to R*k
// (each rank's block k elements) in a new tensor where R does not divide it.
// With --grad-reduce-in-bf16 the gradient goes rounded and scaled into its bf16 view (ToWire).
Result<Tensor> Trainer::Impl::ScatterInput(Rank& rk, const ParamState& ps) {
  Tensor grad = ps.param->grad.View(Shape({ps.numel}));
  if (bf16_grads) {
    Tensor wire = WireOf(rk, ps);
    ToWire(rk, grad, wire);
    grad = wire;
  }
  if (ps.numel == ps.slices * ps.k) return grad;
  PTDP_ASSIGN_OR_RETURN(Tensor padded, rk.backend->Alloc({ps.slices * ps.k}, grad.dtype()));
  Tensor head = padded.View(Shape({ps.numel}));
  rk.backend->Copy(grad, head);
  return padded;
}

// Hands rk.state[k]'s reduce-scatter to the reducer (its padded input kept until the wait).
Status Trainer::Impl::LaunchScatter(Rank& rk, size_t k) {
  ParamState& ps = rk.state[k];
  PTDP_ASSIGN_OR_RETURN(Tensor in, ScatterInput(rk, ps));
  ps.launched = true;
  rk.reducer->LaunchReduceScatter(ps.group, in, bf16_grads ? ps.wire_slice : ps.grad_slice,
                                  int(rk.buckets.size() + k));
  rk.scatter_inputs.push_back(std::move(in));
  return Status::Ok();
}

// Hands rk.buckets[k]'s all-reduce to the reducer (with --grad-reduce-in-bf16, of its bf16
// rounding, scaled first).
void Trainer::Impl::LaunchBucket(Rank& rk, size_t k) {
  Rank::GradBucket& bucket = rk.buckets[k];
  bucket.launched = true;
  if (bf16_grads) ToWire(rk, bucket.grads, bucket.wire);
  rk.reducer->Launch(bucket.group, bf16_grads ? bucket.wire : bucket.grads, int(k));
}

// Megatron scales the bf16 buffer by 1/d before its collective
// (distributed_data_parallel.py: gradient_scaling_factor; param_and_grad_buffer.py
// start_grad_sync: grad_data *= gradient_scaling_factor), each step rounding to bf16.
void Trainer::Impl::ToWire(Rank& rk, const Tensor& grads, Tensor& wire) {
  rk.backend->Copy(grads, wire);
  if (d > 1) rk.backend->Scale(1.0f / float(d), wire);
}

Tensor Trainer::Impl::WireOf(Rank& rk, const ParamState& ps) const {
  return rk.grad_wire[size_t(ps.chunk)].View(Shape({ps.numel}), ps.param->offset);
}

void Trainer::Impl::RoundGrads(Rank& rk, int c) {
  Tensor& wire = rk.grad_wire[size_t(c)];
  Tensor grads = rk.chunks[size_t(c)]->grad_buffer();
  rk.backend->Copy(grads, wire);
  rk.backend->Copy(wire, grads);
}

// The tied word embedding: first and last stage each hold a copy; sum their grads (or slices).
Status Trainer::Impl::ReduceEmbedding(Rank& rk) {
  if (p == 1 || !rk.emb) return Status::Ok();
  const PhaseClock::Open t0 = rk.clock.Start();
  for (ParamState& ps : rk.state) {
    if (ps.param->spec.name != "embedding.word") continue;
    if (!bf16_grads) {
      PTDP_RETURN_IF_ERROR(rk.emb->AllReduce(ps.grad_slice, ReduceOp::kSum));
      continue;
    }
    // --grad-reduce-in-bf16: finalize_model_grads sums the bf16 main grads.
    Tensor wire = ps.slices > 1 ? ps.wire_slice : WireOf(rk, ps);
    rk.backend->Copy(ps.grad_slice, wire);
    PTDP_RETURN_IF_ERROR(rk.emb->AllReduce(wire, ReduceOp::kSum));
    rk.backend->Copy(wire, ps.grad_slice);
  }
  rk.clock.Stop(t0, StepEventKind::kEmbedding, -1, -1, &RankTimes::dp_comm_s);
  return Status::Ok();
}

// Global grad norm (each element counted by one rank of the job, then one WORLD all-reduce),
// clipping, AdamW on what this rank owns, and the dist-opt all-gather of the updated slices.
Status Trainer::Impl::OptimizerStep(Rank& rk) {
  const PhaseClock::Open t0 = rk.clock.Start();
  Backend& be = *rk.backend;
  // sq[0]: squares of the grads that count in the norm; sq[1]: squares of the others (TP
  // replicas, the tied copy) plus a NaN if this rank's loss is not finite, so that a NaN or Inf
  // anywhere reaches every rank through the same all-reduces and all ranks decide alike.
  PTDP_ASSIGN_OR_RETURN(Tensor sq, be.Alloc({2}, DType::kF32));
  Tensor sq_norm = sq.View(Shape({1}), 0), sq_rest = sq.View(Shape({1}), 1);
  for (const Rank::OptimizerRun& run : rk.runs)
    be.SumSquares(run.grad, run.counts_in_norm ? sq_norm : sq_rest);
  for (ParamState& ps : rk.state)
    if (ps.slices > 1 && ps.owned > 0)
      be.SumSquares(ps.grad_slice.View(Shape({ps.owned})), ps.counts_in_norm ? sq_norm : sq_rest);
  if (!std::isfinite(rk.loss)) be.Fill(std::numeric_limits<float>::quiet_NaN(), sq_rest);
  if (grid.world() > 1) PTDP_RETURN_IF_ERROR(rk.world->AllReduce(sq, ReduceOp::kSum));
  float sq_host[2] = {0, 0};
  PTDP_RETURN_IF_ERROR(be.CopyToHost(sq, sq_host));
  rk.grad_norm = std::sqrt(double(sq_host[0]));
  if (!std::isfinite(sq_host[0] + sq_host[1])) {
    rk.clock.Stop(t0, StepEventKind::kOptimizer, -1, -1, &RankTimes::optimizer_s);
    if (cfg.on_nan == NanPolicy::kStop)
      return Status::Error("gradient norm " + std::to_string(rk.grad_norm) + " (or the loss) is "
                           "not finite: stopped before updating any parameter");
    rk.skipped = true;  // every rank sees the same sums, so every rank skips
    return Status::Ok();
  }
  const OptimizerConfig& oc = cfg.optimizer;
  AdamWConfig ac;
  ac.lr = float(oc.LearningRate(optimizer_steps));
  ac.beta1 = float(oc.beta1);
  ac.beta2 = float(oc.beta2);
  ac.eps = float(oc.eps);
  ac.grad_scale = oc.clip_grad > 0 ? float(std::min(1.0, oc.clip_grad / (rk.grad_norm + 1e-6))) : 1.0f;
  ac.step = optimizer_steps + 1;
  for (Rank::OptimizerRun& run : rk.runs) {
    ac.weight_decay = run.decay ? float(oc.weight_decay) : 0.0f;
    if (cfg.bf16) {  // AdamW on the fp32 main weights; the model's copy is their bf16 rounding
      be.AdamW(run.main, run.grad, run.m, run.v, ac);
      be.Copy(run.main, run.value);  // rounded to bf16
    } else {
      be.AdamW(run.value, run.grad, run.m, run.v, ac);
    }
  }
  for (ParamState& ps : rk.state) {
    if (ps.slices == 1 || ps.owned == 0) continue;  // whole ones: in the runs
    ac.weight_decay = ps.decay ? float(oc.weight_decay) : 0.0f;
    Tensor value = ps.param->value.View(Shape({ps.owned}), ps.slice * ps.k);
    Tensor grad = ps.grad_slice.View(Shape({ps.owned}));
    if (cfg.bf16) {  // AdamW on the fp32 main weights; the model's copy is their bf16 rounding
      Tensor main = ps.main.View(Shape({ps.owned}));
      be.AdamW(main, grad, ps.m, ps.v, ac);
      be.Copy(main, value);  // rounded to bf16
    } else {
      be.AdamW(value, grad, ps.m, ps.v, ac);
    }
  }
  rk.clock.Stop(t0, StepEventKind::kOptimizer, -1, -1, &RankTimes::optimizer_s);
  // Without the reducer (or --overlap-param-gather) the dist-opt all-gather follows at once;
  // with them, at the end of the step (RunStep: after the loss's reduction over the same
  // group), beside the next forward.
  return rk.gather_order.empty() ? GatherParams(rk) : Status::Ok();
}

// The dist-opt all-gather's output for a sliced parameter: the parameter itself where the
// group divides it (in place, as into Megatron's contiguous parameter buffer), else a buffer
// of R*k elements with this rank's block copied in (PutGathered copies it back).
Result<Tensor> Trainer::Impl::GatherOutput(Rank& rk, const ParamState& ps) {
  Tensor value = ps.param->value.View(Shape({ps.numel}));
  if (ps.numel == ps.slices * ps.k) return value;
  PTDP_ASSIGN_OR_RETURN(Tensor full,
                        rk.backend->AllocUninit({ps.slices * ps.k}, ps.param->value.dtype()));
  if (ps.owned > 0) {
    Tensor dst = full.View(Shape({ps.owned}), ps.slice * ps.k);
    rk.backend->Copy(value.View(Shape({ps.owned}), ps.slice * ps.k), dst);
  }
  return full;
}

void Trainer::Impl::PutGathered(Rank& rk, const ParamState& ps, const Tensor& full) {
  if (ps.numel == ps.slices * ps.k) return;  // gathered in place
  Tensor dst = ps.param->value.View(Shape({ps.numel}));
  rk.backend->Copy(full.View(Shape({ps.numel})), dst);
}

// The dist-opt all-gather of every sliced parameter's updated slices (this rank's block of
// GatherOutput to every rank's).
Status Trainer::Impl::GatherParams(Rank& rk) {
  const PhaseClock::Open g0 = rk.clock.Start();
  for (ParamState& ps : rk.state) {
    if (ps.slices == 1) continue;
    PTDP_ASSIGN_OR_RETURN(Tensor full, GatherOutput(rk, ps));
    PTDP_RETURN_IF_ERROR(ps.group->AllGather(full.View(Shape({ps.k}), ps.slice * ps.k), full));
    PutGathered(rk, ps, full);
  }
  rk.clock.Stop(g0, StepEventKind::kDpComm, -1, -1, &RankTimes::dp_comm_s);
  return Status::Ok();
}

// --overlap-param-gather: the same all-gathers handed to the reducer in the order the next
// forward reads them (chunk by chunk, embedding, layers, output), into GatherOutput (the
// parameter itself, or a buffer AwaitGathers copies in). Megatron dispatches the first bucket's
// all-gather ahead of the forward and each module's pre-hook waits for its own
// (param_and_grad_buffer.py: start_param_sync, finish_param_sync).
Status Trainer::Impl::LaunchGathers(Rank& rk) {
  const PhaseClock::Open g0 = rk.clock.Start();
  for (size_t k : rk.gather_order) {
    const ParamState& ps = rk.state[k];
    PTDP_ASSIGN_OR_RETURN(Tensor full, GatherOutput(rk, ps));
    Tensor mine = full.View(Shape({ps.k}), ps.slice * ps.k);
    const int tag = int(rk.buckets.size() + rk.state.size() + k);
    const uint64_t ticket = rk.reducer->LaunchAllGather(ps.group, mine, full, tag);
    rk.gathers.push_back({k, std::move(full), ticket});
  }
  rk.clock.Stop(g0, StepEventKind::kDpComm, -1, -1, &RankTimes::dp_comm_s);
  return Status::Ok();
}

// Waits for the pending all-gathers of every parameter that part `moment` of chunk `chunk`'s
// forward reads and of all handed over before them (chunk < 0: all of them), and copies them
// into their parameters; the wait is DP time inside the forward.
Status Trainer::Impl::AwaitGathers(Rank& rk, int chunk, int moment) {
  size_t upto = rk.gathered;
  for (size_t j = rk.gathered; j < rk.gathers.size(); ++j) {  // in forward order: a prefix
    const ParamState& ps = rk.state[rk.gathers[j].state];
    if (chunk >= 0 && (ps.chunk > chunk ||
                       (ps.chunk == chunk && ForwardOrder(ps.part) > ForwardOrder(moment))))
      break;
    upto = j + 1;
  }
  if (upto == rk.gathered) return Status::Ok();
  const PhaseClock::Open t0 = rk.clock.Start();
  std::vector<GradReducer::Span> spans;
  const Status st = rk.reducer->WaitFor(rk.gathers[upto - 1].ticket, &spans);
  AddReducerSpans(rk, spans);
  for (size_t j = rk.gathered; j < upto; ++j) {
    if (st.ok()) PutGathered(rk, rk.state[rk.gathers[j].state], rk.gathers[j].full);
    rk.gathers[j].full = Tensor();
  }
  rk.gathered = upto;
  if (rk.gathered == rk.gathers.size()) {
    rk.gathers.clear();
    rk.gathered = 0;
  }
  rk.clock.Stop(t0, StepEventKind::kDpComm, -1, -1, &RankTimes::dp_comm_s);  // the rank's wait
  return st;
}

// The reducer's jobs as `dp` events of their chunks on this step's timeline (tags: the
// buckets, then the dist-opt reduce-scatters by state index, then the all-gathers).
void Trainer::Impl::AddReducerSpans(Rank& rk, const std::vector<GradReducer::Span>& spans) {
  const size_t nb = rk.buckets.size(), ns = rk.state.size();
  for (const GradReducer::Span& sp : spans) {
    const size_t tag = size_t(sp.tag);
    const int chunk = tag < nb ? rk.buckets[tag].chunk : rk.state[(tag - nb) % ns].chunk;
    rk.clock.AddHostEvent(StepEventKind::kDpComm, chunk, sp.start, sp.end);
  }
}

// RankTimes::expert_load of this step: the EP group's routed-expert rows of each MoE layer
// forward (GptChunk::TakeExpertRows; the same calls in the same order on every rank of the group,
// which shares the pipeline rank), gathered over EP without timing (it is a measurement, not
// the step's work), then sum over the calls of the largest rank's rows over the sum of the
// mean: each exchange waits for the most loaded rank, the cost model's expert load
// (moe_dropless_load). 1 at ep 1; 0 on a rank without MoE layers.
Status Trainer::Impl::MeasureExpertLoad(Rank& rk) {
  std::vector<float> rows;
  for (auto& chunk : rk.chunks)
    for (int64_t r : chunk->TakeExpertRows()) rows.push_back(float(r));
  rk.times.expert_load = rows.empty() ? 0.0 : 1.0;
  if (rows.empty() || ep == 1) return Status::Ok();
  const int64_t n = int64_t(rows.size());
  Backend& be = *rk.backend;
  PTDP_ASSIGN_OR_RETURN(Tensor mine, be.Alloc({n}, DType::kF32));
  PTDP_ASSIGN_OR_RETURN(Tensor all, be.Alloc({n * ep}, DType::kF32));
  PTDP_RETURN_IF_ERROR(be.CopyFromHost(rows.data(), mine));
  PTDP_RETURN_IF_ERROR(rk.ep->inner().AllGather(mine, all).Prefixed("expert load"));
  std::vector<float> host(size_t(n * ep));
  PTDP_RETURN_IF_ERROR(be.CopyToHost(all, host.data()));
  double most = 0, mean = 0;
  for (int64_t i = 0; i < n; ++i) {
    double top = 0, sum = 0;
    for (int r = 0; r < ep; ++r) {
      const double x = host[size_t(r * n + i)];
      top = std::max(top, x);
      sum += x;
    }
    most += top;
    mean += sum / ep;
  }
  if (mean > 0) rk.times.expert_load = most / mean;
  return Status::Ok();
}

Status Trainer::Impl::RunStep(Rank& rk) {
  rk.times = RankTimes{};
  rk.clock.Begin(*rk.backend);
  rk.loss = 0;
  rk.grad_norm = 0;
  rk.skipped = false;
  rk.backend->ResetPeak();
  for (auto& chunk : rk.chunks) {
    chunk->ZeroGrads();
    (void)chunk->TakeExpertRows();  // an evaluation's forwards are not this step's
  }
  for (Rank::GradBucket& bucket : rk.buckets) {
    bucket.pending = bucket.moments.size();
    bucket.launched = false;
  }
  for (ParamState& ps : rk.state) ps.launched = false;
  if (Status st = RunOps(rk); !st.ok()) {
    // Jobs handed over still run (the peers' reducers wait for them); not past this step.
    if (rk.reducer) {
      (void)AwaitAllGathers(rk);
      (void)rk.reducer->Wait();
    }
    rk.gathers.clear();
    rk.gathered = 0;
    rk.scatter_inputs.clear();
    return st;
  }
  // The reported loss: mean over the global batch (the last stage holds sum_j loss_j / m, the
  // CP ranks each their tokens' share: summed over DP x CP, then / d).
  if (rk.coord.pp == p - 1 && d * c > 1) {
    const PhaseClock::Open l0 = rk.clock.Start();
    PTDP_ASSIGN_OR_RETURN(Tensor loss, rk.backend->Alloc({1}, DType::kF32));
    const float host = float(rk.loss);
    PTDP_RETURN_IF_ERROR(rk.backend->CopyFromHost(&host, loss));
    PTDP_RETURN_IF_ERROR(rk.Reduction().AllReduce(loss, ReduceOp::kSum));
    float sum = 0;
    PTDP_RETURN_IF_ERROR(rk.backend->CopyToHost(loss, &sum));
    rk.loss = double(sum) / d;
    rk.clock.Stop(l0, StepEventKind::kDpComm, -1, -1, &RankTimes::dp_comm_s);
  }
  PTDP_RETURN_IF_ERROR(MeasureExpertLoad(rk));
  // --overlap-param-gather: the updated slices' all-gathers go beside the next forward (after
  // the loss's all-reduce above: the reducer is the only user of their groups until then).
  if (!rk.gather_order.empty() && !rk.skipped) PTDP_RETURN_IF_ERROR(LaunchGathers(rk));
  PTDP_RETURN_IF_ERROR(rk.backend->Synchronize());
  const double total = rk.clock.Resolve(&rk.times, cfg.record_timeline);
  rk.times.peak_memory_bytes = double(rk.backend->PeakBytes());
  const RankTimes& x = rk.times;
  rk.times.idle_s = std::max(0.0, total - (x.forward_s + x.backward_s + x.tp_comm_s + x.pp_wait_s +
                                           x.dp_comm_s + x.optimizer_s));
  std::stable_sort(rk.times.events.begin(), rk.times.events.end(),
                   [](const StepEvent& a, const StepEvent& b) { return a.start_s < b.start_s; });
  return Status::Ok();
}

// Forward only, micro-batches of up to b windows through the virtual stages in order
// (ungrouped send/recv: stage order is a chain, so nothing waits in a cycle).
Status Trainer::Impl::EvaluateRank(Rank& rk, const std::vector<int32_t>& windows, int count,
                                   double* loss) {
  PTDP_RETURN_IF_ERROR(AwaitAllGathers(rk));
  Backend& be = *rk.backend;
  const int r = rk.coord.pp;
  double sum = 0;
  for (int first = 0; first < count; first += b) {
    const int bb = std::min(b, count - first);
    std::vector<int32_t> in(size_t(bb * sc)), tg(size_t(bb * sc));
    for (int i = 0; i < bb; ++i)
      for (int j = 0; j < sc; ++j) {
        const size_t w = size_t(first + i) * size_t(s + 1) + size_t(CpPosition(rk.coord.cp, j));
        in[size_t(i * sc + j)] = windows[w];
        tg[size_t(i * sc + j)] = windows[w + 1];
      }
    for (int c = 0; c < v; ++c) {
      Tensor input, targets;
      if (FirstStage(r, c)) {
        PTDP_ASSIGN_OR_RETURN(input, be.Alloc({bb, sc}, DType::kI32));
        PTDP_RETURN_IF_ERROR(be.CopyFromHost(in.data(), input));
      } else {
        PTDP_ASSIGN_OR_RETURN(input, be.Alloc({sl, bb, h}, Act()));
        PTDP_RETURN_IF_ERROR(rk.pp->Recv(input, (r + p - 1) % p));
      }
      if (LastStage(r, c)) {
        PTDP_ASSIGN_OR_RETURN(targets, be.Alloc({bb, sc}, DType::kI32));
        PTDP_RETURN_IF_ERROR(be.CopyFromHost(tg.data(), targets));
      }
      auto out = rk.chunks[size_t(c)]->Forward(0, input, targets, 1.0f);
      rk.chunks[size_t(c)]->Release(0);
      if (!out.ok()) return out.status().Prefixed("evaluate chunk " + Str(c));
      if (LastStage(r, c)) {
        if (rk.cp) PTDP_RETURN_IF_ERROR(rk.cp->AllReduce(*out, ReduceOp::kSum));  // CP shares
        float host = 0;
        PTDP_RETURN_IF_ERROR(be.CopyToHost(*out, &host));
        sum += double(host) * bb;
      } else {
        PTDP_RETURN_IF_ERROR(rk.pp->Send(*out, (r + 1) % p));
      }
    }
  }
  *loss = sum / count;
  return Status::Ok();
}

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;

int64_t Trainer::steps_done() const { return impl_->steps; }
int64_t Trainer::optimizer_steps() const { return impl_->optimizer_steps; }
bool Trainer::overlaps_grad_reduce() const {
  return !impl_->ranks.empty() && impl_->ranks.front().reducer != nullptr;
}

Result<std::unique_ptr<Trainer>> Trainer::Create(const TrainerConfig& cfg, BackendFactory backends,
                                                 CommunicatorFactory& comms) {
  const Layout& l = cfg.layout;
  const std::string where = "trainer, layout " + l.ShortName();
  PTDP_RETURN_IF_ERROR(ValidateModel(cfg.model, "trainer model").Prefixed(where));
  PTDP_RETURN_IF_ERROR(ValidateOptimizer(cfg.optimizer, "trainer").Prefixed(where));
  PTDP_RETURN_IF_ERROR(CheckGptShaped(cfg.model).Prefixed(where));
  if (l.tp <= 0 || l.pp <= 0 || l.dp <= 0 || l.vp <= 0 || l.cp <= 0 || l.micro_batch <= 0 ||
      l.global_batch <= 0)
    return Status::Error(where + ": sizes must be positive");
  const Rejection rej = CheckLayout(cfg.model, l);
  if (rej != Rejection::kOk)
    return Status::Error(where + ": illegal layout: " + ExplainRejection(rej, cfg.model, l));
  if (l.cpu_offload_layers > 0)
    return Status::Error(where + ": CPU activation offloading (--cpu-offloading-num-layers) is "
                         "not supported by the runtime");
  if (l.shard_gradients || l.shard_params)
    return Status::Error(where + ": " + (l.shard_params ? "weight" : "gradient") +
                         " sharding (Megatron-FSDP " +
                         (l.shard_params ? "optim_grads_params" : "optim_grads") +
                         ") is not supported by the runtime; plan with "
                         "--data-parallel-sharding-strategy optim");
  if (l.RecomputedModules() & ~uint8_t(kRecomputeCoreAttn))
    return Status::Error(where + ": recompute modules " +
                         RecomputeModulesString(l.recompute_modules) + ": the runtime's selective "
                         "recompute reruns the attention core only (core_attn)");
  if (l.grad_reduce_in_bf16 && !cfg.bf16)
    return Status::Error(where + ": grad_reduce_in_bf16 (--grad-reduce-in-bf16) needs bf16 "
                         "training (the plan's precision bf16, without --fp32-activations)");
  if (l.cp > 1 && cfg.model.seq_len % (2 * l.cp) != 0)
    return Status::Error(where + ": context parallelism needs seq_len " + Str(cfg.model.seq_len) +
                         " divisible by 2 * cp = " + Str(2 * l.cp) + " (load-balanced chunks)");
  if (l.sequence_parallel && (cfg.model.seq_len / l.cp) % l.tp != 0)
    return Status::Error(where + ": sequence parallelism needs seq_len / cp = " +
                         Str(cfg.model.seq_len / l.cp) + " divisible by tp " + Str(l.tp));
  if (l.world() > comms.world_size())
    return Status::Error(where + ": needs " + Str(l.world()) + " ranks but the communicator "
                         "world has " + Str(comms.world_size()));
  if (cfg.train_tokens == nullptr || int64_t(cfg.train_tokens->size()) < cfg.model.seq_len + 1)
    return Status::Error(where + ": needs at least seq_len + 1 = " +
                         Str(cfg.model.seq_len + 1) + " training tokens");
  std::vector<int> local = cfg.local_ranks;
  if (local.empty())
    for (int g = 0; g < l.world(); ++g) local.push_back(g);
  for (int g : local) {
    if (g < 0 || g >= l.world())
      return Status::Error(where + ": local rank " + Str(g) + " is outside the layout's " +
                           Str(l.world()) + " ranks");
    if (std::count(local.begin(), local.end(), g) > 1)
      return Status::Error(where + ": local rank " + Str(g) + " is listed twice");
  }
  auto impl = std::make_unique<Impl>();
  impl->cfg = cfg;
  PTDP_RETURN_IF_ERROR(impl->Build(backends, comms, local).Prefixed(where));
  return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
}

Result<StepResult> Trainer::Step() {
  Impl& im = *impl_;
  const Clock::time_point t0 = Clock::now();
  const std::string where = "step " + Str(im.steps);
  // A rank that failed still reports (ok = 0), so that the other processes learn of it.
  PTDP_RETURN_IF_ERROR(OnEveryRank(*im.threads, im.ranks, [&](Rank& rk) {
                         const Status st = im.RunStep(rk);
                         const double stop = im.cfg.stop_requested ? im.cfg.stop_requested() : 0;
                         const Status ex = im.ExchangeReports(
                             rk, {st.ok() ? 1.0 : 0.0, rk.loss, rk.grad_norm, ToWords(rk.times), stop});
                         return st.ok() ? ex : st;
                       }).Prefixed(where));
  const std::vector<RankReport>& all = im.ranks[0].reports;
  for (size_t g = 0; g < all.size(); ++g)
    if (all[g].ok != 1.0)
      return Status::Error(where + ": rank " + Str(int64_t(g)) +
                           " failed (its process reports why)");
  StepResult res;
  res.step_time_s = Since(t0);
  res.step = im.steps;
  res.lr = im.cfg.optimizer.LearningRate(im.optimizer_steps);
  // Every rank holds the same norm; the loss lives on the last stage (tp 0, dp 0).
  res.grad_norm = all[0].grad_norm;
  res.loss = all[size_t(im.grid.Rank({0, 0, im.p - 1}))].loss;
  res.skipped = im.ranks[0].skipped;  // every rank decides on the same all-reduced sums
  res.tokens_per_s = double(im.cfg.layout.global_batch) * im.s / std::max(res.step_time_s, 1e-12);
  for (const RankReport& r : all) {
    res.ranks.push_back(FromWords(r.times));
    res.stop = std::max(res.stop, int(r.stop));
  }
  for (const Rank& rk : im.ranks) {
    res.ranks[size_t(rk.global)].events = rk.times.events;
    if (rk.skipped != res.skipped)  // cannot happen: every rank decides on the same sums
      return Status::Error("step " + Str(im.steps) + ": ranks " + Str(im.ranks[0].global) +
                           " and " + Str(rk.global) + " disagree on skipping a non-finite step");
  }
  ++im.steps;
  if (!res.skipped) ++im.optimizer_steps;
  return res;
}

// Only the DP-0 replica evaluates (TP and PP groups never cross DP replicas, so the others
// simply sit out); the loss comes from its last stage, tp rank 0, which broadcasts it over
// WORLD with a success flag.
Result<double> Trainer::Evaluate(const std::vector<int32_t>& windows, int count) {
  Impl& im = *impl_;
  if (count <= 0 || int64_t(windows.size()) < int64_t(count) * (im.s + 1))
    return Status::Error("evaluate: " + Str(count) + " windows of " + Str(im.s + 1) +
                         " tokens need " + Str(int64_t(count) * (im.s + 1)) + " tokens, got " +
                         Str(int64_t(windows.size())));
  const int root = im.grid.Rank({0, 0, im.p - 1});
  PTDP_RETURN_IF_ERROR(OnEveryRank(*im.threads, im.ranks, [&](Rank& rk) {
    double loss = 0;
    // MoE: the expert groups cross DP replicas, so every replica runs the same windows.
    const Status st = rk.coord.dp == 0 || im.moe ? im.EvaluateRank(rk, windows, count, &loss)
                                                 : Status::Ok();
    double flag_and_loss[2] = {st.ok() ? 1.0 : 0.0, loss};
    const Status bc = im.BroadcastDoubles(rk, root, flag_and_loss, 2);
    rk.eval_root_ok = flag_and_loss[0] == 1.0;
    rk.eval_loss = flag_and_loss[1];
    return st.ok() ? bc : st;
  }).Prefixed("evaluate"));
  if (!im.ranks[0].eval_root_ok)
    return Status::Error("evaluate: rank " + Str(root) + " failed (its process reports why)");
  return im.ranks[0].eval_loss;
}

// From the DP-0 replica: each TP shard to its global rows/columns. Padded vocabulary rows are
// dropped (their number depends on t), so the result compares across layouts.
Result<std::map<std::string, std::vector<float>>> Trainer::GatherParameters() {
  Impl& im = *impl_;
  const std::vector<ShardSource> sources = im.ShardSources();
  std::map<std::string, std::vector<float>> out;
  const int collector = im.ranks[0].global;  // the local rank that fills `out`
  PTDP_RETURN_IF_ERROR(OnEveryRank(*im.threads, im.ranks, [&](Rank& rk) {
    return im.GatherShards(rk, sources, rk.global == collector ? &out : nullptr);
  }).Prefixed("gather parameters"));
  return out;
}

// Every shard of the DP-0 replica, in GptParams order: the first stage holds the embeddings,
// the last the final LayerNorm, layer l lives in the virtual stage whose layers hold it (the
// plan's split; chunk stage / p of pipeline rank stage % p); replicated parameters are taken
// from tp rank 0.
std::vector<ShardSource> Trainer::Impl::ShardSources() const {
  // The virtual stage of each layer, from the split (StageLayers: in layer order).
  std::vector<int> stage_of(size_t(cfg.model.layers), 0);
  {
    const std::vector<int> per = StageLayers(cfg.model, cfg.layout);
    size_t layer = 0;
    for (size_t st = 0; st < per.size(); ++st)
      for (int k = 0; k < per[st] && layer < stage_of.size(); ++k) stage_of[layer++] = int(st);
  }
  std::vector<ShardSource> out;
  for (const ParamSpec& ps : GptParams(cfg.model, t)) {
    int stage = 0;
    if (ps.layer >= 0) stage = stage_of[size_t(ps.layer)];
    else if (ps.name.rfind("final_ln.", 0) == 0) stage = p * v - 1;
    const int shards = ps.shard == ShardKind::kReplicated ? 1 : Degree(ps);
    for (int k = 0; k < shards; ++k) {
      int holder = grid.Rank({k, 0, stage % p});
      if (ps.expert >= 0) {  // expert-DP replica 0: q = etp_idx + etp * ep_idx (rank_grid.h)
        const int ep_idx = int(ps.expert / (cfg.model.num_experts / ep));
        holder = (stage % p) * grid.stage_size() + k + etp * ep_idx;
      }
      out.push_back({ps, k, holder, stage / p});
    }
  }
  return out;
}

// One WORLD broadcast per shard from its holder; `out` (one local rank's) places it.
Status Trainer::Impl::GatherShards(Rank& rk, const std::vector<ShardSource>& sources,
                                   std::map<std::string, std::vector<float>>* out) {
  PTDP_RETURN_IF_ERROR(AwaitAllGathers(rk));
  Backend& be = *rk.backend;
  for (const ShardSource& src : sources) {
    const ParamSpec& ps = src.spec;
    const int deg = Degree(ps);
    const std::vector<int64_t> ls = LocalShape(ps, deg);
    PTDP_ASSIGN_OR_RETURN(Tensor shard, be.Alloc(Shape(ls), DType::kF32));
    if (rk.global == src.holder) {
      const ChunkParam* cp = rk.chunks[size_t(src.chunk)]->Find(ps.name);
      if (cp == nullptr)
        return Status::Error("rank " + Str(rk.global) + " chunk " + Str(src.chunk) +
                             " does not hold " + ps.name);
      be.Copy(cp->value, shard);
    }
    PTDP_RETURN_IF_ERROR(rk.world->Broadcast(shard, src.holder).Prefixed(ps.name));
    if (out == nullptr) continue;
    const int64_t rows = ps.valid_rows >= 0 ? ps.valid_rows : ps.shape[0];
    const int64_t cols = ps.shape.size() > 1 ? ps.shape[1] : 1;
    std::vector<float>& g = (*out)[ps.name];
    g.resize(size_t(rows * cols));
    std::vector<float> local(size_t(shard.numel()));
    PTDP_RETURN_IF_ERROR(be.CopyToHost(shard, local.data()));
    const int64_t lcols = ls.size() > 1 ? ls[1] : 1;
    const int64_t col0 = ps.shard == ShardKind::kColumns ? src.tp_rank * lcols : 0;
    for (int64_t i = 0; i < ls[0]; ++i) {
      const int64_t gi = GlobalRow(ps, deg, src.tp_rank, i);
      if (gi >= rows) continue;
      for (int64_t j = 0; j < lcols; ++j)
        g[size_t(gi * cols + col0 + j)] = local[size_t(i * lcols + j)];
    }
  }
  return Status::Ok();
}

// Every rank's report to every rank: an all-gather over WORLD of the raw words.
// `bytes` (a multiple of 4) at `mine` from every rank, by global rank, into *all: an all-gather
// over WORLD of the raw i32 words (a gather copies any dtype exactly).
Status Trainer::Impl::AllGatherRaw(Rank& rk, const void* mine, size_t bytes,
                                   std::vector<int32_t>* all) {
  assert(bytes % sizeof(int32_t) == 0);
  const int64_t words = int64_t(bytes / sizeof(int32_t));
  Backend& be = *rk.backend;
  all->assign(size_t(words) * size_t(grid.world()), 0);
  std::memcpy(all->data(), mine, bytes);
  PTDP_ASSIGN_OR_RETURN(Tensor in, be.Alloc({words}, DType::kI32));
  PTDP_ASSIGN_OR_RETURN(Tensor out, be.Alloc({words * grid.world()}, DType::kI32));
  PTDP_RETURN_IF_ERROR(be.CopyFromHost(all->data(), in));
  PTDP_RETURN_IF_ERROR(rk.world->AllGather(in, out));
  return be.CopyToHost(out, all->data());
}

// Every rank's report to every rank.
Status Trainer::Impl::ExchangeReports(Rank& rk, const RankReport& mine) {
  std::vector<int32_t> words;
  PTDP_RETURN_IF_ERROR(AllGatherRaw(rk, &mine, sizeof(RankReport), &words)
                           .Prefixed("exchanging the step reports"));
  rk.reports.resize(size_t(grid.world()));
  std::memcpy(static_cast<void*>(rk.reports.data()), words.data(), words.size() * sizeof(int32_t));
  return Status::Ok();
}

// values[0, n) <- root's, bit for bit (as 2n i32 words).
Status Trainer::Impl::BroadcastDoubles(Rank& rk, int root, double* values, int64_t n) {
  Backend& be = *rk.backend;
  std::vector<int32_t> words(size_t(2 * n));
  std::memcpy(words.data(), values, size_t(n) * sizeof(double));
  PTDP_ASSIGN_OR_RETURN(Tensor t, be.Alloc({2 * n}, DType::kI32));
  PTDP_RETURN_IF_ERROR(be.CopyFromHost(words.data(), t));
  PTDP_RETURN_IF_ERROR(rk.world->Broadcast(t, root));
  PTDP_RETURN_IF_ERROR(be.CopyToHost(t, words.data()));
  std::memcpy(values, words.data(), size_t(n) * sizeof(double));
  return Status::Ok();
}

// ---- Checkpoint state: whole tensors <-> this layout's shards ---------------------------------
// `which` selects the tensor of a parameter: 0 its value, 1 AdamW m, 2 AdamW v.

namespace {

const char* const kStatePrefix[3] = {"param/", "adam_m/", "adam_v/"};

// The shape a checkpoint stores: the global shape without the padded vocabulary rows.
std::vector<int64_t> WholeShape(const ParamSpec& ps) {
  std::vector<int64_t> s = ps.shape;
  if (ps.valid_rows >= 0) s[0] = ps.valid_rows;
  return s;
}

// Calls f(local, whole) for each element of shard tp_rank of `t` shards of `ps` (TP, or expert
// TP for a routed expert) that is in the whole tensor (flat indices into LocalShape and
// WholeShape; padded rows have no whole index).
template <typename F>
void ForEachShardElement(const ParamSpec& ps, int t, int tp_rank, F f) {
  const std::vector<int64_t> ls = LocalShape(ps, t);
  const int64_t rows = ps.valid_rows >= 0 ? ps.valid_rows : ps.shape[0];
  const int64_t cols = ps.shape.size() > 1 ? ps.shape[1] : 1;
  const int64_t lcols = ls.size() > 1 ? ls[1] : 1;
  const int64_t col0 = ps.shard == ShardKind::kColumns ? tp_rank * lcols : 0;
  for (int64_t i = 0; i < ls[0]; ++i) {
    const int64_t gi = GlobalRow(ps, t, tp_rank, i);
    if (gi >= rows) continue;
    for (int64_t j = 0; j < lcols; ++j) f(i * lcols + j, gi * cols + col0 + j);
  }
}

}  // namespace

Status Trainer::Impl::ImportRank(Rank& rk,
                                 const std::map<std::string, const NamedTensor*>& by_name) {
  PTDP_RETURN_IF_ERROR(AwaitAllGathers(rk));  // or a late one would overwrite what comes in
  for (ParamState& ps : rk.state) {
    const ParamSpec& spec = ps.param->spec;
    for (int which = 0; which < 3; ++which) {
      const std::vector<float>& whole = by_name.at(kStatePrefix[which] + spec.name)->data;
      std::vector<float> local(size_t(ps.numel), 0.0f);  // padded rows stay 0
      ForEachShardElement(spec, Degree(spec), ShardOf(spec, rk.global),
                          [&](int64_t l, int64_t g) { local[size_t(l)] = whole[size_t(g)]; });
      if (which == 0) {
        // The model's copy (rounded to bf16 with cfg.bf16; main keeps the fp32 below).
        PTDP_RETURN_IF_ERROR(rk.backend->CopyFromHost(local.data(), ps.param->value));
        if (!cfg.bf16) continue;
      }
      if (ps.owned == 0) continue;
      Tensor dst = ps.Sliced(which).View(Shape({ps.owned}));
      PTDP_RETURN_IF_ERROR(
          rk.backend->CopyFromHost(local.data() + ps.slice * ps.k, dst));
    }
  }
  return Status::Ok();
}

// What rank rk holds of the whole state, written into `st` (zero-signed elsewhere: -0.0):
// every element of every tensor is written by exactly one rank of the job. A parameter's value
// by the first rank of its reduction group (DP x CP, expert DP for a routed expert), tp rank 0
// for a replicated one, the first stage's copy of the tied embedding; each AdamW moment element
// by the rank whose slice holds it (the distributed optimizer's slices over the group; without
// it, the group's first rank). With TrainerConfig::bf16 the parameters are the fp32 main
// weights, held (and written) like the moments.
Status Trainer::Impl::ExportRank(Rank& rk, const StateSink& put) {
  PTDP_RETURN_IF_ERROR(AwaitAllGathers(rk));
  size_t state_index = 0;
  for (const auto& chunk : rk.chunks)
    for (const ChunkParam& cp : chunk->params()) {
      const ParamSpec& ps = cp.spec;
      const ParamState& state = rk.state[state_index++];
      if (ps.name == "embedding.word" && !chunk->config().has_embedding) continue;
      if (ps.shard == ShardKind::kReplicated && rk.coord.tp != 0) continue;
      const int j = state.group->rank();
      for (int which = 0; which < 3; ++which) {
        int64_t begin = 0, end = state.numel;  // the local shard's elements this rank writes
        const bool sliced_state = which > 0 || cfg.bf16;  // moments, bf16's main weights
        if (!sliced_state && j != 0) continue;
        if (sliced_state) {
          if (j >= state.slices || state.owned == 0) continue;
          begin = state.slice * state.k;
          end = begin + state.owned;
        }
        std::vector<float> local(size_t(state.numel), 0.0f);
        if (which == 0 && !cfg.bf16) {
          PTDP_RETURN_IF_ERROR(rk.backend->CopyToHost(state.param->value, local.data()));
        } else {
          const Tensor slice = state.Sliced(which).View(Shape({state.owned}));
          PTDP_RETURN_IF_ERROR(rk.backend->CopyToHost(slice, local.data() + begin));
        }
        put(kStatePrefix[which] + ps.name, ps, ShardOf(ps, rk.global), local, begin, end);
      }
    }
  return Status::Ok();
}

// With ranks in other processes: every process's part of `st` summed over WORLD, in slices of
// kSliceFloats. Every element is written by one rank and is -0.0 elsewhere, and x + (-0.0) is x
// for every x (+0.0 and -0.0 included), so the sum is each element bit for bit, in any order.
// The process's first rank sends what its ranks wrote; the others send -0.0.
Status Trainer::Impl::SumStateOverWorld(Rank& rk, TrainingState& st) {
  constexpr int64_t kSliceFloats = int64_t(1) << 24;  // 64 MiB a reduction
  const bool sender = &rk == &ranks.front();
  int64_t total = 0;
  for (const NamedTensor& nt : st.tensors) total += int64_t(nt.data.size());
  // fn(p, len, k): the slice's next n elements, the tensors laid end to end, in pieces of len
  // elements at p that start at element k of the slice.
  size_t t = 0;  // where the next slice starts: tensor t, element `at` of it
  int64_t at = 0;
  auto each_piece = [&](int64_t n, const std::function<void(float*, int64_t, int64_t)>& fn) {
    for (int64_t k = 0; k < n;) {
      std::vector<float>& data = st.tensors[t].data;
      const int64_t take = std::min(n - k, int64_t(data.size()) - at);
      fn(data.data() + at, take, k);
      k += take;
      at += take;
      if (at == int64_t(data.size())) ++t, at = 0;
    }
  };
  std::vector<float> host;
  for (int64_t done = 0; done < total; done += kSliceFloats) {
    const int64_t n = std::min(kSliceFloats, total - done);
    host.assign(size_t(n), -0.0f);
    const size_t t0 = t;
    const int64_t at0 = at;
    if (sender) {
      each_piece(n, [&](float* p, int64_t len, int64_t k) {
        std::copy(p, p + len, host.begin() + k);
      });
    }
    PTDP_ASSIGN_OR_RETURN(Tensor dev, rk.backend->Alloc({n}, DType::kF32));
    PTDP_RETURN_IF_ERROR(rk.backend->CopyFromHost(host.data(), dev));
    PTDP_RETURN_IF_ERROR(rk.world->AllReduce(dev, ReduceOp::kSum).Prefixed("training state"));
    if (!sender) continue;
    PTDP_RETURN_IF_ERROR(rk.backend->CopyToHost(dev, host.data()));
    t = t0, at = at0;  // the same pieces again, now written back
    each_piece(n, [&](float* p, int64_t len, int64_t k) {
      std::copy(host.begin() + k, host.begin() + k + len, p);
    });
  }
  return Status::Ok();
}

// The whole state's tensors in checkpoint order ("param/", "adam_m/", "adam_v/", each in
// GptParams order), whole shapes; `fill`: their data, -0.0 everywhere (else empty).
std::vector<NamedTensor> Trainer::Impl::StateTable(bool fill) const {
  std::vector<NamedTensor> table;
  const std::vector<ParamSpec> specs = GptParams(cfg.model, t);
  for (int which = 0; which < 3; ++which)
    for (const ParamSpec& ps : specs) {
      NamedTensor nt{kStatePrefix[which] + ps.name, WholeShape(ps), {}};
      if (fill) {
        int64_t n = 1;
        for (int64_t x : nt.shape) n *= x;
        nt.data.assign(size_t(n), -0.0f);
      }
      table.push_back(std::move(nt));
    }
  return table;
}

Result<TrainingState> Trainer::ExportState() {
  Impl& im = *impl_;
  TrainingState st;
  st.step = im.steps;
  st.optimizer_steps = im.optimizer_steps;
  st.consumed_samples = im.steps * im.cfg.layout.global_batch;
  st.tensors = im.StateTable(/*fill=*/true);
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < st.tensors.size(); ++i) index[st.tensors[i].name] = i;
  // The ranks write disjoint elements of the same vectors, each from its own thread.
  PTDP_RETURN_IF_ERROR(OnEveryRank(*im.threads, im.ranks, [&](Rank& rk) {
    return im.ExportRank(rk, [&](const std::string& name, const ParamSpec& ps, int shard,
                                 const std::vector<float>& local, int64_t begin, int64_t end) {
      std::vector<float>& whole = st.tensors[index.at(name)].data;
      ForEachShardElement(ps, im.Degree(ps), shard, [&](int64_t l, int64_t g) {
        if (l >= begin && l < end) whole[size_t(g)] = local[size_t(l)];
      });
    });
  }).Prefixed("exporting the training state"));
  if (int(im.ranks.size()) < im.grid.world())
    PTDP_RETURN_IF_ERROR(OnEveryRank(*im.threads, im.ranks, [&](Rank& rk) {
      return im.SumStateOverWorld(rk, st);
    }).Prefixed("exporting the training state"));
  return st;
}

Result<StateShard> Trainer::ExportShard() {
  Impl& im = *impl_;
  StateShard sh;
  sh.step = im.steps;
  sh.optimizer_steps = im.optimizer_steps;
  sh.consumed_samples = im.steps * im.cfg.layout.global_batch;
  sh.world = im.grid.world();
  sh.tensors = im.StateTable(/*fill=*/false);
  // Each rank's pieces from its own thread, then in rank order.
  std::vector<std::vector<TensorPiece>> by_rank(im.ranks.size());
  PTDP_RETURN_IF_ERROR(OnEveryRank(*im.threads, im.ranks, [&](Rank& rk) {
    std::vector<TensorPiece>& out = by_rank[size_t(&rk - im.ranks.data())];
    return im.ExportRank(rk, [&](const std::string& name, const ParamSpec& ps, int shard,
                                 const std::vector<float>& local, int64_t begin, int64_t end) {
      TensorPiece p{name, WholeShape(ps), {}, {}};
      // Local order is whole order (ForEachShardElement is increasing in both), so the
      // elements fall into runs of consecutive whole indices.
      ForEachShardElement(ps, im.Degree(ps), shard, [&](int64_t l, int64_t g) {
        if (l < begin || l >= end) return;
        if (p.runs.empty() || p.runs.back().start + p.runs.back().length != g)
          p.runs.push_back({g, 0});
        ++p.runs.back().length;
        p.data.push_back(local[size_t(l)]);
      });
      if (!p.runs.empty()) out.push_back(std::move(p));
    });
  }).Prefixed("exporting the training state"));
  std::vector<size_t> order(im.ranks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return im.ranks[a].global < im.ranks[b].global; });
  for (size_t i : order) {
    sh.ranks.push_back(im.ranks[i].global);
    for (TensorPiece& p : by_rank[i]) sh.pieces.push_back(std::move(p));
  }
  return sh;
}

Result<std::vector<std::vector<int64_t>>> Trainer::AllGatherWords(const std::vector<int64_t>& words) {
  Impl& im = *impl_;
  const int64_t n = int64_t(words.size());
  const int world = im.grid.world();
  std::vector<int64_t> all(size_t(n) * size_t(world));
  PTDP_RETURN_IF_ERROR(OnEveryRank(*im.threads, im.ranks, [&](Rank& rk) -> Status {
    std::vector<int32_t> got;
    PTDP_RETURN_IF_ERROR(im.AllGatherRaw(rk, words.data(), words.size() * sizeof(int64_t), &got));
    if (&rk == &im.ranks.front()) std::memcpy(all.data(), got.data(), got.size() * sizeof(int32_t));
    return Status::Ok();
  }).Prefixed("exchanging words over WORLD"));
  std::vector<std::vector<int64_t>> by_rank(static_cast<size_t>(world));
  for (int g = 0; g < world; ++g)
    by_rank[size_t(g)].assign(all.begin() + ptrdiff_t(g * n), all.begin() + ptrdiff_t((g + 1) * n));
  return by_rank;
}

std::set<std::string> Trainer::LocalStateTensors() const {
  std::set<std::string> names;
  for (const Rank& rk : impl_->ranks)
    for (const ParamState& ps : rk.state)
      for (const char* prefix : kStatePrefix) names.insert(prefix + ps.param->spec.name);
  return names;
}

Status Trainer::ImportState(const TrainingState& st) {
  Impl& im = *impl_;
  const int64_t B = im.cfg.layout.global_batch;
  if (st.step < 0 || st.optimizer_steps < 0 || st.optimizer_steps > st.step)
    return Status::Error("training state: step " + Str(st.step) + " and optimizer steps " +
                         Str(st.optimizer_steps) + " are inconsistent");
  if (st.consumed_samples != st.step * B)
    return Status::Error("training state: " + Str(st.consumed_samples) + " samples consumed in " +
                         Str(st.step) + " steps do not match this run's global batch " + Str(B) +
                         " (resuming needs the same global batch)");
  std::map<std::string, const NamedTensor*> by_name;
  for (const NamedTensor& nt : st.tensors) by_name[nt.name] = &nt;
  const std::set<std::string> needed = LocalStateTensors();
  for (const ParamSpec& ps : GptParams(im.cfg.model, im.t))
    for (const char* prefix : kStatePrefix) {
      const std::string name = prefix + ps.name;
      auto it = by_name.find(name);
      if (it == by_name.end() && !needed.count(name)) continue;  // another process's
      if (it == by_name.end())
        return Status::Error("training state: no tensor '" + name + "'");
      const std::vector<int64_t> want = WholeShape(ps);
      int64_t n = 1;
      for (int64_t x : want) n *= x;
      if (it->second->shape != want || int64_t(it->second->data.size()) != n)
        return Status::Error("training state: tensor '" + name + "' has shape " +
                             Shape(it->second->shape).ToString() + ", this model needs " +
                             Shape(want).ToString());
    }
  for (Rank& rk : im.ranks) PTDP_RETURN_IF_ERROR(im.ImportRank(rk, by_name).Prefixed("rank " + Str(rk.global)));
  im.steps = st.step;
  im.optimizer_steps = st.optimizer_steps;
  return Status::Ok();
}

}  // namespace ptdp::rt
