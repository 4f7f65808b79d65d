// Layout: one way of laying a model over GPUs (tp x pp x dp, virtual stages, micro-batching,
// sequence parallelism, recompute, distributed optimizer, precision), and Megatron's rules
// for which layouts are legal (see ../shared/reference/megatron-reference.md section 1).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/limits.h"
#include "core/model.h"
#include "core/status.h"

namespace ptdp {

enum class Recompute { kNone, kSelective, kFull };
// kFp4: NVFP4/MXFP4 GEMMs on Blackwell (Transformer Engine); activations and weights stay
// 16-bit, as with kFp8. Appended last so that the other values keep their numbers.
enum class Precision { kBf16, kFp16, kFp8, kFp32, kFp4 };
enum class ScheduleKind { kGPipe, kOneFOneB, kInterleaved };
// The dtype of a piece of optimizer state under Megatron's --use-precision-aware-optimizer
// (--main-params-dtype, --exp-avg-dtype, --exp-avg-sq-dtype, --main-grads-dtype: fp32 unless set).
enum class StateDtype { kFp32, kFp16, kBf16, kFp8 };

// Megatron's --cross-entropy-loss-fusion with --cross-entropy-fusion-impl: the loss over the
// vocabulary as separate PyTorch ops on an fp32 copy of the logits (kNone, Megatron's default;
// tensor_parallel/cross_entropy.py), the same math jit-fused (kNative; fusions/
// fused_cross_entropy.py), both keeping fp32 exp(logits) for the backward, or Transformer
// Engine's Triton kernel (kTe; te_parallel_cross_entropy), which reads the 16-bit logits and
// writes the gradient into them in place during the forward: 2 bytes a logit kept, not 4.
enum class CrossEntropyFusion { kNone, kNative, kTe };

const char* ToString(Recompute r);
const char* ToString(StateDtype d);
const char* ToString(CrossEntropyFusion c);  // "none", "native", "te"
Result<CrossEntropyFusion> ParseCrossEntropyFusion(const std::string& s);
double StateDtypeBytes(StateDtype d);  // 4, 2, 2, 1
// "fp32", "fp16", "bf16" or "fp8", among `allowed` (Megatron's choices for `flag`).
Result<StateDtype> ParseStateDtype(const std::string& flag, const std::string& s,
                                   const std::vector<StateDtype>& allowed);

// Megatron --use-precision-aware-optimizer (Transformer Engine's FusedAdam; needs the
// distributed optimizer): the optimizer's state in the dtypes below, each fp32 unless set and
// each fp32 without the flag (optimizer_config.py asserts so). The master weights of a bf16
// model keep only their low 16 bits (TE >= 2.1's store_param_remainders, on by default: 2
// bytes a parameter; distrib_optimizer.py), not under fp8 or fp4, whose fp32 masters Megatron
// keeps itself for the current-scaling and MX recipes. --main-grads-dtype bf16: bf16 gradient
// buffers, as --grad-reduce-in-bf16 (training/arguments.py).
struct OptimizerState {
  bool precision_aware = false;
  StateDtype main_params = StateDtype::kFp32;   // fp32 | fp16
  StateDtype exp_avg = StateDtype::kFp32;       // fp32 | fp16 | bf16 | fp8
  StateDtype exp_avg_sq = StateDtype::kFp32;    // fp32 | fp16 | bf16 | fp8
  StateDtype main_grads = StateDtype::kFp32;    // fp32 | bf16
};
// Each dtype of OptimizerState once, for everything that names them: its plan.yaml key,
// Megatron's flag, the knob's short name, the field, and Megatron's choices for it
// (training/arguments.py).
struct OptimizerDtypeField {
  const char* key;   // "exp_avg_dtype"
  const char* flag;  // "--exp-avg-dtype"
  const char* knob;  // "m"
  const char* what;  // "Adam's first moment"
  StateDtype OptimizerState::*field;
  std::vector<StateDtype> allowed;
};
inline constexpr size_t kOptimizerDtypeCount = 4;
const std::array<OptimizerDtypeField, kOptimizerDtypeCount>& OptimizerDtypeFields();
const char* ToString(Precision p);
const char* ToString(ScheduleKind k);
Result<Recompute> ParseRecompute(const std::string& s);
Result<Precision> ParsePrecision(const std::string& s);
Result<ScheduleKind> ParseScheduleKind(const std::string& s);

// Megatron-LM's --pipeline-model-parallel-layout, parsed: the layers of each virtual stage in
// layer order (megatron/core/transformer/pipeline_parallel_layer_layout.py: virtual stage i is
// chunk i / p of pipeline rank i % p). E (embedding) opens virtual stage 0 and L (loss) closes
// the last one, as Megatron asserts.
struct PipelineLayout {
  std::string text;             // as the user wrote it, e.g. "Et|(tt|)*30mL"
  std::vector<int> layers;      // transformer layers ('t') per virtual stage
  std::vector<int> first;       // the first layer of each virtual stage (prefix sums of layers)
  // Unique per parse (never reused in a process): memos key a layout string by it.
  uint64_t serial = 0;
  int mtp_layers = 0;           // 'm' (multi-token prediction layers), counted apart
};

// Parses a layout string: "E", "t", "m", "L" and "|" between stages; "(...)*n" and "x*n"
// repeat; commas are cosmetic. Errors name the string and the character.
Result<PipelineLayout> ParsePipelineLayout(const std::string& text);

// Megatron's --recompute-modules (with --recompute-granularity selective, transformer_config.py
// recompute_modules): the parts of each layer the backward reruns instead of keeping their
// activations. A bit set; none set is Megatron's default, core_attn.
enum RecomputeModule : uint8_t {
  kRecomputeCoreAttn = 1,        // core_attn: the attention core (flash: its output kept)
  kRecomputeMlaUpProj = 2,       // mla_up_proj: MLA's q and kv up projections
  kRecomputeLayernorm = 4,       // layernorm: the input and pre-MLP norms
  kRecomputeMlp = 8,             // mlp: the dense MLP (FC1, activation, FC2)
  kRecomputeMoe = 16,            // moe: the whole MoE block (router to combine, shared experts)
  kRecomputeMoeAct = 32,         // moe_act: the routed experts' activation
  kRecomputeSharedExperts = 64,  // shared_experts: the shared experts' MLP
};
inline constexpr uint8_t kAllRecomputeModules = 127;
// "core_attn,moe_act" (Megatron's names, in bit order) of a set; "core_attn" for 0.
std::string RecomputeModulesString(uint8_t modules);
// Parses names separated by commas or spaces; an unknown name is an error naming it and the list.
Result<uint8_t> ParseRecomputeModules(const std::string& s);

struct Layout {
  int tp = 1;                       // tensor-parallel size t
  int pp = 1;                       // pipeline-parallel size p
  int dp = 1;                       // data-parallel size d
  int vp = 1;                       // model chunks (virtual stages) per pipeline rank v
  int cp = 1;                       // context-parallel size c (sequence split over c ranks)
  // Expert parallelism (MoE models only): the experts' own grid folded over the same ranks of a
  // pipeline stage as (tp, cp, dp) ("parallel folding", megatron/core/parallel_state.py): etp x
  // ep x edp = tp x cp x dp, order tp-ep-dp-pp; see expert_dp().
  int ep = 1;                       // expert-parallel size (--expert-model-parallel-size)
  int etp = 0;                      // expert tensor-parallel size; 0: tp (Megatron's default)
  int micro_batch = 1;              // b, sequences per micro-batch
  int64_t global_batch = 1;         // B, sequences per step
  int microbatch_group = 0;         // interleaving group size g; 0 means p (Megatron default)
  bool sequence_parallel = false;   // Korthikanti SP (needs t > 1)
  Recompute recompute = Recompute::kNone;
  // With selective recompute: the modules it reruns (RecomputeModule bits; 0: core_attn,
  // Megatron's default). 0 with none or full recompute.
  uint8_t recompute_modules = 0;
  // The modules selective recompute reruns (core_attn when none are named); 0 without it.
  uint8_t RecomputedModules() const {
    return recompute != Recompute::kSelective ? 0
           : recompute_modules ? recompute_modules : uint8_t(kRecomputeCoreAttn);
  }
  bool distributed_optimizer = false;  // ZeRO-1 style sharded optimizer over DP
  // Megatron-FSDP's --data-parallel-sharding-strategy optim_grads (ZeRO-2): the fp32 gradients
  // are sharded over dp x cp too, reduce-scattered after every micro-batch's backward
  // (docs/user-guide/features/megatron_fsdp.md); needs the distributed optimizer.
  bool shard_gradients = false;
  // Megatron-FSDP's optim_grads_params (ZeRO-3; Megatron's default sharding strategy): the
  // weights too are sharded over dp x cp; each FSDP unit (a layer) is all-gathered before its
  // forward and again before its backward, every micro-batch, and freed after; needs
  // shard_gradients.
  bool shard_params = false;
  // Megatron's CPU activation offloading (--cpu-offloading-num-layers N, transformer_config.py:
  // 0 < N < layers, pp 1, no recompute): N layers' activations go to host memory during the
  // forward and come back for the backward, over the GPU's host link (ClusterSpec gpu
  // host_bandwidth). 0: none.
  int cpu_offload_layers = 0;
  // Megatron --grad-reduce-in-bf16 (bf16 training: --bf16, also under fp8 and fp4): the DDP
  // gradient buffers hold bf16, not fp32, so the micro-batches' gradients accumulate in bf16 and
  // the DP reduction (all-reduce, or the distributed optimizer's reduce-scatter) moves 2 bytes a
  // gradient; the optimizer reads them into fp32. Megatron: training/arguments.py (with --bf16,
  // accumulate_allreduce_grads_in_fp32 is forced on unless this flag is set), training.py
  // (grad_reduce_in_fp32 = accumulate_allreduce_grads_in_fp32), core/distributed/
  // param_and_grad_buffer.py (grad_dtype = fp32 if grad_reduce_in_fp32 else param.dtype).
  bool grad_reduce_in_bf16 = false;
  // Megatron --accumulate-allreduce-grads-in-fp32: fp32 gradient buffers. --bf16 turns it on by
  // itself (unless --grad-reduce-in-bf16); under --fp16 it is off by default, so an fp16 run's
  // gradients are fp16 (grad_dtype = param.dtype) unless this is set.
  bool accumulate_grads_in_fp32 = false;
  // Megatron --use-precision-aware-optimizer and its dtypes (OptimizerState).
  OptimizerState optimizer_state;
  Precision precision = Precision::kBf16;
  ScheduleKind schedule = ScheduleKind::kOneFOneB;  // interleaved iff vp > 1
  // Megatron --overlap-grad-reduce: DP collectives run under the last micro-batch's backward.
  bool overlap_grad_reduce = true;
  // Megatron --overlap-param-gather: with the distributed optimizer and --overlap-grad-reduce
  // (Megatron asserts both), the all-gather of the updated parameters runs under the next
  // step's first forward, bucket by bucket; off, it follows the optimizer step exposed.
  bool overlap_param_gather = true;
  bool param_gather_overlapped() const {
    return overlap_param_gather && overlap_grad_reduce && distributed_optimizer;
  }
  // Megatron --ddp-bucket-size: the most parameters in one gradient bucket with
  // --overlap-grad-reduce (a bucket closes once it reaches this size); 0 is Megatron's default,
  // max(40,000,000, 1,000,000 x the DP x CP size). Without the overlap: one bucket per group.
  int64_t ddp_bucket_size = 0;
  // Megatron/TE --tp-comm-overlap: TP collectives split and overlapped with the GEMMs.
  bool tp_comm_overlap = false;
  // Megatron --overlap-p2p-communication (on by default, interleaved schedules only): the
  // pipeline's sends and receives run asynchronously under the next chunk's compute.
  bool overlap_p2p = true;
  // Megatron --overlap-moe-expert-parallel-comm (MoE, ep > 1): the 1F1B schedule pairs one
  // micro-batch's forward with another's backward layer by layer, so each one's EP all-to-alls
  // run under the other's compute (transformer_config.py: needs ep > 1, vp with pp > 1, no full
  // recompute).
  bool moe_a2a_overlap = false;
  // Megatron --moe-token-dispatcher-type flex (DeepEP on Hopper, HybridEP on Blackwell) instead
  // of alltoall: a token's hidden state crosses the network once per remote NVLink domain its
  // experts are in and fans out there over NVLink, not once per expert.
  bool moe_flex_dispatcher = false;
  // Megatron --cross-entropy-loss-fusion / --cross-entropy-fusion-impl (CrossEntropyFusion).
  CrossEntropyFusion cross_entropy = CrossEntropyFusion::kNone;
  // How the L layers are split over the p*v virtual stages (Megatron-LM's flags; all unset is
  // the even split L/(p v)); see ChunkLayers.
  int first_stage_layers = 0;          // --decoder-first-pipeline-num-layers (0: unset)
  int last_stage_layers = 0;           // --decoder-last-pipeline-num-layers (0: unset)
  bool embedding_in_split = false;     // --account-for-embedding-in-pipeline-split
  bool loss_in_split = false;          // --account-for-loss-in-pipeline-split
  std::shared_ptr<const PipelineLayout> pipeline_layout;  // --pipeline-model-parallel-layout

  int world() const { return tp * cp * pp * dp; }
  // The parameters of one gradient bucket with --overlap-grad-reduce: --ddp-bucket-size, else
  // megatron/core/distributed/distributed_data_parallel.py's max(40,000,000, 1,000,000 x the
  // DP x CP size); a bucket closes once it holds at least this many.
  int64_t GradBucketParams() const {
    return ddp_bucket_size > 0 ? ddp_bucket_size
                               : std::max<int64_t>(40'000'000, 1'000'000 * int64_t(dp) * cp);
  }
  int expert_tp() const { return etp > 0 ? etp : tp; }
  // edp = t c d / (etp ep): the group the experts' gradients are reduced over (0 when the grids
  // do not fold: CheckLayout rejects it).
  int expert_dp() const {
    const int64_t a = int64_t(tp) * cp * dp, e = int64_t(expert_tp()) * ep;
    return e > 0 && a % e == 0 ? int(a / e) : 0;
  }
  // m = B / (b d); meaningful only when legal.
  int64_t num_microbatches() const { return global_batch / (int64_t(micro_batch) * dp); }
  int group_size() const { return microbatch_group > 0 ? microbatch_group : pp; }
  // "tp4 pp8 dp4 vp12 mb1" style short name (cp shown when > 1).
  std::string ShortName() const;
  // The on/off knobs in short: "sp rc-sel dopt", or "-" when none is on.
  std::string Knobs() const;
  // True when the split is not the even L/(p v) form (any of the split flags set).
  bool uneven() const {
    return first_stage_layers > 0 || last_stage_layers > 0 || embedding_in_split ||
           loss_in_split || pipeline_layout != nullptr;
  }
  // The split in Megatron's words: "even", "first 7 last 7", "embedding+loss in split",
  // "layout Et|(tt|)*30mL".
  std::string SplitName() const;
};

// Transformer layers of chunk c of pipeline rank r (megatron/core/transformer/transformer_block.py
// get_num_layers_to_build): the layout string's count; or with first/last counts F, G the
// first rank F/v per chunk, the last G/v, the others (L - F - G)/(p - k)/v; or with embedding
// and loss accounted ((L + e + l)/p)/v, less one on the first chunk of rank 0 (e) and the last
// chunk of rank p-1 (l). Meaningful only for a legal layout (CheckLayout).
int ChunkLayers(const ModelSpec& m, const Layout& l, int r, int c);
// Layers of pipeline rank r (all its chunks).
int RankLayers(const ModelSpec& m, const Layout& l, int r);
// The index of the first transformer layer of chunk c of rank r (virtual stage c p + r holds
// layers [ChunkFirstLayer, ChunkFirstLayer + ChunkLayers)); O(1) but for a layout string.
int ChunkFirstLayer(const ModelSpec& m, const Layout& l, int r, int c);
// MoE layers of chunk c of rank r, and of rank r (0 for a dense model).
int ChunkMoeLayers(const ModelSpec& m, const Layout& l, int r, int c);
int RankMoeLayers(const ModelSpec& m, const Layout& l, int r);
// Layers per virtual stage in layer order (virtual stage c*p + r), p*v entries.
std::vector<int> StageLayers(const ModelSpec& m, const Layout& l);

// kMaxGlobalBatch and kMaxWorldSize are in core/limits.h with every other range.

// Why a layout is illegal. The names are stable: they key `rejected` in plan --json.
enum class Rejection {
  kOk = 0,
  kWorldSize,          // t*p*d != world
  kHeadsTp,            // a % t != 0
  kKvHeadsTp,          // k % t != 0 and t % k != 0
  kLayersPp,           // (L + e + l) % p != 0 (the even split)
  kLayersVp,           // ((L + e + l)/p) % v != 0
  kUnevenSplit,        // first/last stage counts Megatron refuses
  kPipelineLayout,     // a --pipeline-model-parallel-layout that does not fit the model or p
  kInterleavePp,       // v > 1 needs p > 1 with p2p overlap, p > 2 without
  kInterleaveMicrobatches,  // group rule: p <= g <= m and (m % g == 0 or m % g >= p)
  kBatch,              // B % (b d) != 0
  kSpNeedsTp,          // SP with t == 1
  kTpCommOverlapNeedsSp,  // --tp-comm-overlap without SP (Megatron asserts)
  kEpWithoutMoe,       // ep > 1 or etp set on a dense model
  kExpertsEp,          // E % ep != 0
  kExpertGrid,         // etp x ep does not divide t x c x d (parallel folding)
  kExpertTpFfn,        // expert FFN % etp != 0
  kEpTpNeedsSp,        // a MoE model with t > 1 and no SP (Megatron's MoELayer refuses to train)
  kA2aOverlap,         // --overlap-moe-expert-parallel-comm without ep > 1, or pp > 1 without vp, or full recompute
  kRecomputeModules,   // --recompute-modules without selective recompute, or naming a part the model lacks
  kFlexNeedsEp,        // the flex dispatcher on a dense model or with ep 1
  kGradShardingNeedsDistOpt,  // shard_gradients (or shard_params) without what they need
  kGradReduceDtype,    // --grad-reduce-in-bf16 with fp16/fp32 weights or with fp32 accumulation
  kOptimizerDtypes,    // --use-precision-aware-optimizer's rules (PrecisionAwareProblem)
  kSeqCp,              // s % (2c) != 0 with c > 1 (Megatron's load-balanced CP split)
  kHybrid,             // a hybrid model's rules: Mamba heads/groups over t and c, no vp or layout string
  kCpuOffloading,      // --cpu-offloading-num-layers with pp > 1, recompute, or N >= layers
  kScheduleMismatch,   // interleaved schedule iff v > 1
  kTpCrossesNode,      // TP group spans NVLink domains (legal for Megatron; planner rejects unless forced)
  kPrecisionUnsupported,  // e.g. fp8 on a GPU without an fp8 peak
  kMemory,             // does not fit in GPU memory
  kCount,
};
constexpr int kNumRejections = static_cast<int>(Rejection::kCount);

// Stable short key, e.g. "heads_not_divisible_by_tp".
const char* RejectionKey(Rejection r);
// One-line explanation with the offending values.
std::string ExplainRejection(Rejection r, const ModelSpec& m, const Layout& l);

// Why Megatron refuses the layout's optimizer dtypes ("" if it does not): a dtype other than
// fp32 without --use-precision-aware-optimizer, the flag without the distributed optimizer or
// with Megatron-FSDP (its own --megatron-fsdp-* dtypes, not modelled), bf16 main gradients with
// fp32 accumulation or without bf16 weights.
std::string PrecisionAwareProblem(const Layout& l);

// --grad-reduce-in-bf16 where Megatron would not honour it: fp16 or fp32 weights (it is read
// under --bf16 only), or beside --accumulate-allreduce-grads-in-fp32 (Rejection::kGradReduceDtype).
bool GradReduceDtypeIllegal(const Layout& l);
// What a hybrid model (ModelSpec::hybrid_pattern) forbids in this layout (Rejection::kHybrid),
// or "" when nothing.
std::string HybridLayoutProblem(const ModelSpec& m, const Layout& l);
// What Megatron refuses in the layout's --recompute-modules (Rejection::kRecomputeModules), or "".
std::string RecomputeModulesProblem(const ModelSpec& m, const Layout& l);

// Megatron's legality rules, cheapest first; returns the first broken one. Does not check
// world size, node boundaries, precision or memory (callers know those).
Rejection CheckLayout(const ModelSpec& m, const Layout& l);

// Validates a layout against a world size and node size for a user-given layout: a Status
// naming the broken rule. `gpus_per_node` is the NVLink domain's GPU count (a node's, or an NVL72
// rack's: ClusterSpec::nvlink_domain_gpus); a TP group crossing it is allowed here only if
// `allow_tp_across_nodes`.
Status ValidateLayout(const ModelSpec& m, const Layout& l, int world, int gpus_per_node,
                      bool allow_tp_across_nodes);

}  // namespace ptdp
