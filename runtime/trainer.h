// Trainer: runs training steps of a GPT model with exactly a plan's layout. Every rank owns its
// model chunks (v per pipeline rank: chunk c of rank r holds virtual stage c*p + r), walks its
// core/ Schedule (forwards, backwards and the p2p groups exactly as listed), then finalizes the
// gradients in Megatron's order (DP all-reduce, or reduce-scatter with the distributed
// optimizer; SP LayerNorm grads over TP; the tied embedding over the embedding group), clips by
// the global gradient norm and applies AdamW (warmup, then cosine decay), all-gathering the
// updated shards with the distributed optimizer. Written against Backend and CommunicatorFactory
// only: the CPU runtime passes CpuBackends and a ThreadWorld (ranks as threads).
//
// A training step reads like llm.c's loop (per rank):
//   for op in schedule[r]: F -> chunk.Forward, B -> chunk.Backward, p2p -> pp group
//   finalize grads; norm; clip; AdamW; (dist-opt all-gather)
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/layout.h"
#include "core/limits.h"
#include "core/model.h"
#include "core/status.h"
#include "runtime/backend.h"
#include "runtime/checkpoint.h"
#include "runtime/communicator.h"

namespace ptdp::rt {

struct OptimizerConfig {
  double lr = 1e-3;            // peak learning rate
  double min_lr = 1e-4;        // cosine decays to this
  int warmup_steps = 2;        // linear warmup from lr/warmup to lr
  int decay_steps = 100;       // cosine over these steps after warmup (then min_lr)
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0.1;   // on 2-D weights only (not biases, LN, positions), as Megatron
  double clip_grad = 1.0;      // global L2 norm clipping; 0 disables
  // Learning rate at `step` (0-based).
  double LearningRate(int64_t step) const;
};

// Checks every setting against its range (core/limits.h): 0 < lr <= 1, 0 <= min_lr <= lr,
// warmup_steps and decay_steps 0..kMaxSteps, beta1 and beta2 in [0, 1), eps > 0,
// weight_decay >= 0, clip_grad >= 0, all finite. The one check for the flags of `ptdp train`
// and the settings a checkpoint carries; `where` prefixes the message
// ("ckpt/step-00000004.ckpt: optimizer.min_lr: -0.0001 is outside 0..1").
Status ValidateOptimizer(const OptimizerConfig& o, const std::string& where);

// What a step does when the global gradient norm (or the loss) is NaN or Inf. The decision is
// taken on the all-reduced norm, which is the same on every rank, so all ranks agree.
enum class NanPolicy {
  kStop,  // Step() fails (naming the step and the norm) before any parameter changes
  kSkip,  // no rank updates its parameters; the step counts (its data is consumed) but the
          // optimizer's step count and the learning-rate schedule do not advance (Megatron)
};

struct TrainerConfig {
  ModelSpec model;             // a GPT shape (the runtime's model; see runtime/gpt.h)
  Layout layout;               // legal for the model; tp*cp*pp*dp ranks
  OptimizerConfig optimizer;
  uint64_t seed = 1234;        // parameter init and data order
  NanPolicy on_nan = NanPolicy::kStop;
  const std::vector<int32_t>* train_tokens = nullptr;  // must outlive the trainer
  // The global ranks this trainer (this process) drives; empty: all of them. With several
  // processes (one per GPU, or per node) each creates a Trainer for its own ranks over a shared
  // CommunicatorFactory world (NcclWorld); every Trainer's results are still the whole job's.
  std::vector<int> local_ranks;
  bool record_timeline = false;  // fill RankTimes::events every step (the measured timeline)
  // Polled by every local rank at the end of each step (from the rank threads, so it must be
  // thread-safe; ptdp train reads an atomic its signal handler sets): 0 to go on, else a code
  // the caller chooses (ptdp train: the signal number). The job's largest code comes back in
  // StepResult::stop of every Trainer, so all processes decide to stop at the same step.
  std::function<int()> stop_requested;
  // Megatron's --bf16 mixed precision on any backend (backend.h's dtype rules): activations,
  // their gradients and the weights stored in bf16 (TP, SP, CP, EP and pipeline exchanges of
  // them too), the weights bf16 copies of fp32 main weights that AdamW updates (sliced like the
  // moments under the distributed optimizer); weight gradients, their reductions, statistics
  // and optimizer state fp32. Checkpoints hold the main weights. Off: everything fp32 (the CUDA
  // backend's GEMMs still round their inputs to bf16 when the layout's precision is bf16).
  bool bf16 = false;
};

// What one interval of a rank's step was (the measured timeline of `ptdp compare`/`report`).
enum class StepEventKind {
  kForward,    // a chunk's forward of a micro-batch (its TP collectives nest inside)
  kBackward,   // a chunk's backward
  kP2p,        // a p2p group: its sends and receives, waiting for the peer included
  kTpComm,     // one TP (or SP) collective
  kCpComm,     // one CP ring exchange of K/V blocks (counted in RankTimes::tp_comm_s)
  kEpComm,     // one MoE exchange: EP all-to-all, expert-TP gather / reduce, aux-loss counts
               // (counted in RankTimes::tp_comm_s)
  kDpComm,     // the DP gradient reduction, the dist-opt all-gather, the loss all-reduce
  kEmbedding,  // the tied embedding's all-reduce between the first and last stage
  kOptimizer,  // grad norm, clipping and AdamW
};
const char* ToString(StepEventKind k);  // "forward", "backward", "p2p", "tp", "dp", ...

struct StepEvent {
  StepEventKind kind = StepEventKind::kForward;
  int microbatch = -1, chunk = -1;  // of the forward/backward, or the p2p group's first op
  double start_s = 0, end_s = 0;    // seconds since the step started (all ranks share the origin)
};

// Seconds one rank spent in each part of a step (the measured side of `ptdp compare`).
struct RankTimes {
  double forward_s = 0;      // chunk forwards, TP collectives inside them excluded
  double backward_s = 0;     // chunk backwards, TP collectives inside them excluded
  double tp_comm_s = 0;      // TP (and SP) collectives, the CP ring and the MoE exchanges
  double pp_wait_s = 0;      // p2p groups: sends, receives and waiting for the peer
  double dp_comm_s = 0;      // DP and embedding-group reductions, dist-opt all-gather
  double optimizer_s = 0;    // grad norm, clipping, AdamW
  double idle_s = 0;         // step time minus all the above
  double peak_memory_bytes = 0;  // the rank's backend peak during the step
  // MoE: over the step's MoE layer forwards, the EP group's most loaded rank's routed rows
  // over the mean (the cost model's expert load, moe_dropless_load): 1 at ep 1, 0 on a rank
  // without MoE layers (and for dense models).
  double expert_load = 0;
  std::vector<StepEvent> events;  // in start order, when TrainerConfig::record_timeline
};

struct StepResult {
  int64_t step = 0;          // 0-based
  double loss = 0;           // mean loss over the global batch
  double grad_norm = 0;      // global L2 norm before clipping
  double lr = 0;              // of this step's update (the schedule at optimizer_steps)
  bool skipped = false;        // non-finite gradients under NanPolicy::kSkip: no update
  double step_time_s = 0;    // wall time of the step
  double tokens_per_s = 0;
  std::vector<RankTimes> ranks;  // by global rank
  // The largest TrainerConfig::stop_requested code any rank of the job read at the end of this
  // step (0: none asked to stop); the same in every Trainer of the job.
  int stop = 0;
};

// Makes one Backend per rank (called once per rank at creation).
using BackendFactory = std::function<std::unique_ptr<Backend>(int global_rank)>;

// Several processes (or several Trainers of one process, as the tests do) each drive some of the
// ranks: Step, Evaluate and GatherParameters must then be called on every Trainer of the job,
// concurrently, the same number of times in the same order (they communicate). Their results
// are complete and equal on every Trainer: whatever a process reports (loss, grad norm, every
// rank's RankTimes, the evaluation loss, the parameters) travels through the communicators'
// WORLD group, never a side channel.
class Trainer {
 public:
  // Builds the chunks, communicators (TP, PP, DP, embedding groups of core/RankGrid, a WORLD
  // group of all ranks, and with cp > 1 the CP and DP x CP groups) and optimizer state of
  // every rank in cfg.local_ranks (all when empty);
  // first calls comms.Prepare() with every group of the layout. Fails, naming the reason, when
  // the layout is illegal for the model or the runtime cannot honour it (more ranks
  // than `comms` has, a non-GPT model, a local rank outside the layout or listed twice).
  static Result<std::unique_ptr<Trainer>> Create(const TrainerConfig& cfg, BackendFactory backends,
                                                 CommunicatorFactory& comms);
  ~Trainer();

  // One training step on every local rank (one thread per rank). Errors from any local rank (a
  // timeout, a NaN) come back as a Status naming the rank; a rank of another process that
  // failed is named too (its own process reports why).
  Result<StepResult> Step();

  // Mean loss over `windows` (count, s + 1) of held-out tokens, forward only.
  Result<double> Evaluate(const std::vector<int32_t>& windows, int count);

  // Every parameter gathered to its full (global) shape by name, for layout-invariance checks:
  // each shard is broadcast over WORLD from the rank that holds it.
  Result<std::map<std::string, std::vector<float>>> GatherParameters();

  int64_t steps_done() const;
  int64_t optimizer_steps() const;
  // Whether the DP reduction runs beside the backward (--overlap-grad-reduce where the
  // communicators can: CommunicatorFactory::CollectivesBesideCompute; and something to reduce),
  // and with the distributed optimizer the parameters' all-gather beside the next forward.
  bool overlaps_grad_reduce() const;

  // The whole training state, gathered from the ranks (parameters from DP replica 0, moments
  // from every DP rank that owns a slice). With ranks in several processes (local_ranks) it is
  // a collective over WORLD, called on every Trainer of the job like Step, and each returns the
  // whole state, bit for bit. Fails only when a backend copy or the collective fails.
  Result<TrainingState> ExportState();
  // What this Trainer's ranks hold of the training state (local, no communication): each
  // element of the whole state is in exactly one Trainer's shard of the job, so the shards of
  // all Trainers together are ExportState's tensors, bit for bit (a sharded checkpoint:
  // runtime/sharded_checkpoint.h). Fails only when a backend copy fails.
  Result<StateShard> ExportShard();
  // A collective over WORLD, called on every Trainer of the job like Step: each Trainer passes
  // `words` (the same count on every Trainer, for all its ranks) and gets every rank's, by
  // global rank. For the job's small agreements (did every process write its shard?).
  Result<std::vector<std::vector<int64_t>>> AllGatherWords(const std::vector<int64_t>& words);
  // The tensors of the whole state ("param/...", "adam_m/...", "adam_v/...") that this
  // Trainer's ranks hold a part of: what ImportState needs (ReadCheckpoint's filter).
  std::set<std::string> LocalStateTensors() const;
  // Loads a state exported by a trainer of the same model in any layout (with the same global
  // batch): shards every tensor into this layout's local ranks and sets the counters, so the
  // next Step() continues that run; over several processes each passes the same state, or at
  // least the tensors of LocalStateTensors (no communication). Fails, changing nothing, naming
  // the tensor that is missing or has the wrong shape, or when the data position does not
  // match this global batch.
  Status ImportState(const TrainingState& state);

 private:
  struct Impl;
  explicit Trainer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ptdp::rt
