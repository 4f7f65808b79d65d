// Schedule: the ordered list of operations each pipeline rank executes in one training step,
// for GPipe, 1F1B and interleaved 1F1B, in Megatron-LM's exact order
// (megatron/core/pipeline_parallel/schedules.py; ../shared/reference/megatron-reference.md
// section 3). The contract shared by the event simulator (cost_model/) and the runtime.
//
//   rank0: F0 F1 F2 F3 B0 F4 B1 ...      Fm.c = forward of micro-batch m, model chunk c
//   rank3: F0 B0 F1 B1 F2 B2 ...         Bm.c = backward; p2p ops sit between them
//
// Point-to-point: every forward of (m, c) that is not the model's first stage receives its
// input from the previous virtual stage, and every one that is not the last sends its output
// to the next; backwards do the mirror image with gradients. Virtual stage of (rank r, chunk c)
// is c*p + r: chunk c of rank p-1 sends to chunk c+1 of rank 0. P2p ops that a rank posts
// together (Megatron's batch_isend_irecv, ncclGroupStart/End) share a `group` id; a group
// completes when all of its ops have matched and finished ("blocking, grouped semantics").
#pragma once

#include <string>
#include <vector>

#include "core/layout.h"
#include "core/status.h"

namespace ptdp {

enum class OpKind {
  kForward,        // forward of (microbatch, chunk)
  kBackward,       // backward of (microbatch, chunk)
  kSendActivation, // to the next virtual stage (peer rank), for (microbatch, chunk) = sender's
  kRecvActivation, // from the previous virtual stage, for the receiver's (microbatch, chunk)
  kSendGradient,   // to the previous virtual stage, for the sender's (microbatch, chunk)
  kRecvGradient,   // from the next virtual stage, for the receiver's (microbatch, chunk)
  kReduceGradients,         // end of step: DP gradient reduction (+ SP LayerNorm grads over TP)
  kReduceEmbedding,         // end of step, first and last pipeline rank only: tied embedding
  kOptimizerStep,           // end of step: grad norm, clip, AdamW (+ dist-opt all-gather)
};
const char* ToString(OpKind k);

struct ScheduleOp {
  OpKind kind = OpKind::kForward;
  int microbatch = -1;  // 0..m-1 for compute and p2p; -1 for end-of-step ops
  int chunk = -1;       // 0..v-1 (the chunk whose tensor this is, on this rank)
  int peer = -1;        // pipeline rank of the other side of a p2p op; -1 otherwise
  int group = -1;       // p2p ops of one rank with the same id are posted together; -1 otherwise
  bool is_compute() const { return kind == OpKind::kForward || kind == OpKind::kBackward; }
  bool is_p2p() const { return peer >= 0; }
};

struct Schedule {
  ScheduleKind kind = ScheduleKind::kOneFOneB;
  int pp = 1;             // p, pipeline ranks
  int vp = 1;             // v, model chunks per rank
  int microbatches = 1;   // m
  int group_size = 0;     // interleaving micro-batch group g (0 = p)
  bool a2a_overlap = false;  // --overlap-moe-expert-parallel-comm: one more warm-up forward
  std::vector<std::vector<ScheduleOp>> ranks;  // ranks[r] = rank r's ops in order

  // Rank r's compute order in the reference notation: "F0 F1 B0 ..." when v == 1,
  // "F0.0 F1.0 ... B0.1 ..." when v > 1 (p2p and end-of-step ops omitted).
  std::string Notation(int rank) const;
};

// Forwards rank r of p runs before its first backward (Megatron's warm-up,
// get_pp_rank_microbatches), capped at its m·v: gpipe every one; 1f1b p − r − 1; interleaved
// (p − r − 1)·2 + (v − 1)·g (g: the micro-batch group, p when 0); one more with the EP
// all-to-all overlap (`a2a_overlap`, BuildSchedule's). Its micro-batch chunks in flight are this
// plus one (gpipe: m·v).
int64_t WarmupForwards(ScheduleKind kind, int64_t p, int64_t v, int64_t m, int64_t g, int64_t r,
                       bool a2a_overlap);

// How many of a rank's first n forwards run model chunk c, in Megatron's interleaved order
// (get_schedule_table: per group of g micro-batches, the last taking the rest, chunk 0 of each,
// then chunk 1, ...; g > 0). O(1): what the warm-up holds per chunk when chunks differ in size.
int64_t ForwardsOfChunk(int64_t m, int64_t v, int64_t g, int64_t n, int64_t c);

// What rank r holds at the end of its warm-up, when its W + 1 forwards have run (GPipe: every
// forward), chunk c's forwards keeping kept[c] each (ForwardsOfChunk's order).
double HeldAfterWarmup(ScheduleKind kind, int64_t p, int64_t v, int64_t m, int64_t g, int64_t r,
                       bool a2a_overlap, const std::vector<double>& kept);

// The most rank r ever holds of what its forwards keep until their backwards, chunk c's
// forward keeping kept[c] (its activations): the warm-up's W + 1 forwards and then, forward by
// backward, the steady state, whose backwards free other chunks than its forwards fill (a heavy
// chunk 0 can pile up past the warm-up: Megatron's interleaved order). GPipe: every forward.
// O(v) when the chunks weigh the same, else O(g v): the steady state repeats every g v steps
// but for the last, partial group.
double PeakInFlight(ScheduleKind kind, int64_t p, int64_t v, int64_t m, int64_t g, int64_t r,
                    bool a2a_overlap, const std::vector<double>& kept);

// Builds the schedule. Errors (a Status naming the rule) when the kind and sizes are not a
// legal Megatron combination: p, v, m >= 1; gpipe and 1f1b need v == 1; interleaved needs
// v > 1 and the micro-batch group rule of megatron-reference.md section 1. `a2a_overlap`:
// Megatron's --overlap-moe-expert-parallel-comm, whose combined 1F1B runs one more warm-up
// forward on every rank (schedules.py get_pp_rank_microbatches; at pp 1, 1F1B with one forward
// ahead): one more micro-batch's activations in flight.
Result<Schedule> BuildSchedule(ScheduleKind kind, int pp, int vp, int microbatches,
                               int group_size = 0, bool a2a_overlap = false);

// Proves the schedule sound: every send has exactly one matching receive on its peer (same
// kind of tensor, micro-batch and virtual stage), every forward/backward appears exactly once
// per (microbatch, chunk) on each rank, data dependencies are respected, and executing all ranks
// under blocking, grouped semantics finishes (no deadlock). On failure the message names the
// rank, the op and why (e.g. "rank 2 blocks in group 7 (recv-activation F3.1 from rank 1)
// forever").
Status CheckSchedule(const Schedule& s);

}  // namespace ptdp
