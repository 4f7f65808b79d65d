// Megatron's legality rules (megatron/training/arguments.py validate_args;
// megatron/core/parallel_state.py; ../shared/reference/megatron-reference.md section 1).
#include "core/layout.h"

#include <atomic>
#include <numeric>
#include <sstream>

namespace ptdp {

const char* ToString(Recompute r) {
  switch (r) {
    case Recompute::kNone: return "none";
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
  }
  return "?";
}
const char* ToString(Precision p) {
  switch (p) {
    case Precision::kBf16: return "bf16";
    case Precision::kFp16: return "fp16";
    case Precision::kFp8: return "fp8";
    case Precision::kFp4: return "fp4";
    case Precision::kFp32: return "fp32";
  }
  return "?";
}
const char* ToString(StateDtype d) {
  switch (d) {
    case StateDtype::kFp32: return "fp32";
    case StateDtype::kFp16: return "fp16";
    case StateDtype::kBf16: return "bf16";
    case StateDtype::kFp8: return "fp8";
  }
  return "?";
}
double StateDtypeBytes(StateDtype d) {
  switch (d) {
    case StateDtype::kFp32: return 4;
    case StateDtype::kFp16:
    case StateDtype::kBf16: return 2;
    case StateDtype::kFp8: return 1;
  }
  return 4;
}
Result<StateDtype> ParseStateDtype(const std::string& flag, const std::string& s,
                                   const std::vector<StateDtype>& allowed) {
  std::string names;
  for (StateDtype d : allowed) {
    if (s == ToString(d)) return d;
    names += std::string(names.empty() ? "" : ", ") + ToString(d);
  }
  return Status::Error(flag + " '" + s + "' is not one of: " + names);
}
const std::array<OptimizerDtypeField, kOptimizerDtypeCount>& OptimizerDtypeFields() {
  using D = StateDtype;
  static const std::array<OptimizerDtypeField, kOptimizerDtypeCount> fields = {{
      {"main_params_dtype", "--main-params-dtype", "main", "the master weights",
       &OptimizerState::main_params,
       {D::kFp32, D::kFp16}},
      {"exp_avg_dtype", "--exp-avg-dtype", "m", "Adam's first moment",
       &OptimizerState::exp_avg,
       {D::kFp32, D::kFp16, D::kBf16, D::kFp8}},
      {"exp_avg_sq_dtype", "--exp-avg-sq-dtype", "v", "Adam's second moment",
       &OptimizerState::exp_avg_sq,
       {D::kFp32, D::kFp16, D::kBf16, D::kFp8}},
      {"main_grads_dtype", "--main-grads-dtype", "grad",
       "the gradient buffers (bf16 as --grad-reduce-in-bf16)", &OptimizerState::main_grads,
       {D::kFp32, D::kBf16}},
  }};
  return fields;
}
const char* ToString(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::kGPipe: return "gpipe";
    case ScheduleKind::kOneFOneB: return "1f1b";
    case ScheduleKind::kInterleaved: return "interleaved";
  }
  return "?";
}

Result<Recompute> ParseRecompute(const std::string& s) {
  if (s == "none") return Recompute::kNone;
  if (s == "selective") return Recompute::kSelective;
  if (s == "full") return Recompute::kFull;
  return Status::Error("recompute '" + s + "' is not one of: none, selective, full");
}
namespace {
constexpr const char* kRecomputeModuleNames[] = {"core_attn", "mla_up_proj", "layernorm", "mlp",
                                                 "moe", "moe_act", "shared_experts"};
}  // namespace

std::string RecomputeModulesString(uint8_t modules) {
  if (modules == 0) modules = kRecomputeCoreAttn;
  std::string s;
  for (int i = 0; i < 7; ++i)
    if (modules & (1u << i)) s += std::string(s.empty() ? "" : ",") + kRecomputeModuleNames[i];
  return s;
}

Result<uint8_t> ParseRecomputeModules(const std::string& text) {
  uint8_t bits = 0;
  std::string name;
  auto flush = [&]() -> Status {
    if (name.empty()) return Status::Ok();
    for (int i = 0; i < 7; ++i)
      if (name == kRecomputeModuleNames[i]) {
        bits |= uint8_t(1u << i);
        name.clear();
        return Status::Ok();
      }
    return Status::Error("recompute module '" + name + "' is not one of: " +
                         RecomputeModulesString(kAllRecomputeModules) + " (Megatron's "
                         "--recompute-modules)");
  };
  for (char c : text) {
    if (c == ',' || c == ' ') {
      PTDP_RETURN_IF_ERROR(flush());
    } else {
      name += c;
    }
  }
  PTDP_RETURN_IF_ERROR(flush());
  if (bits == 0) return Status::Error("recompute modules '" + text + "': none named");
  return bits;
}

Result<Precision> ParsePrecision(const std::string& s) {
  if (s == "bf16") return Precision::kBf16;
  if (s == "fp16") return Precision::kFp16;
  if (s == "fp8") return Precision::kFp8;
  if (s == "fp4") return Precision::kFp4;
  if (s == "fp32") return Precision::kFp32;
  return Status::Error("precision '" + s + "' is not one of: bf16, fp16, fp8, fp4, fp32");
}
const char* ToString(CrossEntropyFusion c) {
  switch (c) {
    case CrossEntropyFusion::kNone: return "none";
    case CrossEntropyFusion::kNative: return "native";
    case CrossEntropyFusion::kTe: return "te";
  }
  return "?";
}

Result<CrossEntropyFusion> ParseCrossEntropyFusion(const std::string& s) {
  if (s == "none") return CrossEntropyFusion::kNone;
  if (s == "native") return CrossEntropyFusion::kNative;
  if (s == "te") return CrossEntropyFusion::kTe;
  return Status::Error("cross-entropy fusion '" + s + "' is not one of: none, native, te");
}

Result<ScheduleKind> ParseScheduleKind(const std::string& s) {
  if (s == "gpipe") return ScheduleKind::kGPipe;
  if (s == "1f1b") return ScheduleKind::kOneFOneB;
  if (s == "interleaved") return ScheduleKind::kInterleaved;
  return Status::Error("schedule '" + s + "' is not one of: gpipe, 1f1b, interleaved");
}

std::string Layout::ShortName() const {
  std::ostringstream o;
  o << "tp" << tp;
  if (cp > 1) o << " cp" << cp;
  o << " pp" << pp << " dp" << dp;
  if (ep > 1) o << " ep" << ep;
  if (etp > 0 && etp != tp) o << " etp" << etp;
  if (vp > 1) o << " vp" << vp;
  o << " mb" << micro_batch;
  return o.str();
}

std::string Layout::Knobs() const {
  std::string s;
  if (sequence_parallel) s += "sp ";
  if (tp_comm_overlap) s += "tp-overlap ";
  if (recompute == Recompute::kSelective)
    s += recompute_modules && recompute_modules != kRecomputeCoreAttn
             ? "rc-sel(" + RecomputeModulesString(recompute_modules) + ") "
             : std::string("rc-sel ");
  if (recompute == Recompute::kFull) s += "rc-full ";
  if (distributed_optimizer) s += shard_params ? "zero3 " : shard_gradients ? "zero2 " : "dopt ";
  if (cpu_offload_layers > 0) s += "offload" + std::to_string(cpu_offload_layers) + " ";
  if (grad_reduce_in_bf16) s += "grad-bf16 ";
  if (optimizer_state.precision_aware) {  // pa-opt(m=bf16,v=bf16): the dtypes not fp32
    std::string d;
    for (const OptimizerDtypeField& f : OptimizerDtypeFields())
      if (const StateDtype dt = optimizer_state.*f.field; dt != StateDtype::kFp32)
        d += std::string(d.empty() ? "" : ",") + f.knob + "=" + ToString(dt);
    s += "pa-opt" + (d.empty() ? std::string() : "(" + d + ")") + " ";
  }
  if (accumulate_grads_in_fp32 && precision == Precision::kFp16) s += "grad-fp32 ";
  if (precision != Precision::kBf16) s += std::string(ToString(precision)) + " ";
  if (first_stage_layers > 0) s += "first" + std::to_string(first_stage_layers) + " ";
  if (last_stage_layers > 0) s += "last" + std::to_string(last_stage_layers) + " ";
  if (embedding_in_split) s += "emb-split ";
  if (loss_in_split) s += "loss-split ";
  if (pipeline_layout) s += "pp-layout ";
  if (!overlap_p2p && vp > 1) s += "no-p2p-overlap ";
  if (!overlap_param_gather && overlap_grad_reduce && distributed_optimizer && !shard_params)
    s += "no-ag-overlap ";
  if (moe_a2a_overlap) s += "a2a-overlap ";
  if (moe_flex_dispatcher) s += "flex ";
  if (cross_entropy != CrossEntropyFusion::kNone) s += std::string("ce-") + ToString(cross_entropy) + " ";
  if (!s.empty()) s.pop_back();
  return s.empty() ? "-" : s;
}

std::string Layout::SplitName() const {
  if (pipeline_layout) return "layout " + pipeline_layout->text;
  std::string s;
  if (first_stage_layers > 0) s += "first " + std::to_string(first_stage_layers);
  if (last_stage_layers > 0) s += std::string(s.empty() ? "" : " ") + "last " + std::to_string(last_stage_layers);
  if (embedding_in_split || loss_in_split)
    s += std::string(s.empty() ? "" : " ") +
         (embedding_in_split && loss_in_split ? "embedding+loss" : embedding_in_split ? "embedding" : "loss") +
         " in split";
  return s.empty() ? "even" : s;
}

// megatron/core/transformer/pipeline_parallel_layer_layout.py parse_str_to_list: commas are
// cosmetic, "(X)*n" and "x*n" repeat, "|" separates stages, E/t/m/L are the layers.
Result<PipelineLayout> ParsePipelineLayout(const std::string& text) {
  const std::string where = "pipeline layout '" + text + "'";
  constexpr size_t kMaxChars = size_t(1) << 20;  // unrolled; far above any real layout
  std::string s;
  for (char ch : text)
    if (ch != ',' && ch != ' ') s += ch;
  // Unroll the innermost "(X)*n" until none is left, then "x*n".
  auto read_count = [&](size_t at, size_t* end) -> Result<int64_t> {
    size_t j = at;
    int64_t n = 0;
    while (j < s.size() && s[j] >= '0' && s[j] <= '9' && n <= kMaxLayers) n = n * 10 + (s[j++] - '0');
    if (j == at) return Status::Error(where + ": '*' must be followed by a count");
    if (n > kMaxLayers) return Status::Error(where + ": repeat count above " + std::to_string(kMaxLayers));
    *end = j;
    return n;
  };
  for (;;) {
    const size_t close = s.find(')');
    if (close == std::string::npos) break;
    const size_t open = s.rfind('(', close);
    if (open == std::string::npos) return Status::Error(where + ": ')' without '('");
    if (close + 1 >= s.size() || s[close + 1] != '*')
      return Status::Error(where + ": '(...)' must be followed by '*n'");
    size_t end = 0;
    PTDP_ASSIGN_OR_RETURN(const int64_t n, read_count(close + 2, &end));
    const std::string body = s.substr(open + 1, close - open - 1);
    if (body.size() * size_t(n) + s.size() > kMaxChars)
      return Status::Error(where + ": unrolls to more than " + std::to_string(kMaxChars) + " characters");
    std::string rep;
    for (int64_t i = 0; i < n; ++i) rep += body;
    s = s.substr(0, open) + rep + s.substr(end);
  }
  if (s.find('(') != std::string::npos) return Status::Error(where + ": '(' without ')'");
  for (size_t star; (star = s.find('*')) != std::string::npos;) {
    if (star == 0 || s[star - 1] == '|')
      return Status::Error(where + ": '*' must follow a layer letter");
    size_t end = 0;
    PTDP_ASSIGN_OR_RETURN(const int64_t n, read_count(star + 1, &end));
    if (size_t(n) + s.size() > kMaxChars)
      return Status::Error(where + ": unrolls to more than " + std::to_string(kMaxChars) + " characters");
    s = s.substr(0, star - 1) + std::string(size_t(n), s[star - 1]) + s.substr(end);
  }
  PipelineLayout pl;
  pl.text = text;
  pl.layers.push_back(0);
  int embeddings = 0, losses = 0;
  bool seen_mtp = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char ch = s[i];
    const bool last_char = i + 1 == s.size();
    switch (ch) {
      case '|': pl.layers.push_back(0); break;
      case 't':
        if (seen_mtp) return Status::Error(where + ": transformer layers ('t') must come before MTP layers ('m')");
        ++pl.layers.back();
        break;
      case 'm': seen_mtp = true; ++pl.mtp_layers; break;
      case 'E':
        if (i != 0) return Status::Error(where + ": the embedding 'E' must open the first stage, and only it");
        ++embeddings;
        break;
      case 'L':
        if (!last_char) return Status::Error(where + ": the loss 'L' must close the last stage, and only it");
        ++losses;
        break;
      default:
        return Status::Error(where + ": '" + std::string(1, ch) +
                             "' is not a layer (E embedding, t transformer, m MTP, L loss, | stage "
                             "boundary, (...)*n repeat)");
    }
    if (int64_t(pl.layers.size()) > kMaxLayers)
      return Status::Error(where + ": more than " + std::to_string(kMaxLayers) + " stages");
  }
  if (embeddings != 1 || losses != 1)
    return Status::Error(where + ": needs exactly one 'E' (first) and one 'L' (last), as Megatron asserts");
  static std::atomic<uint64_t> next_serial{0};
  pl.serial = ++next_serial;
  pl.first.resize(pl.layers.size());
  for (size_t j = 0, n = 0; j < pl.layers.size(); n += size_t(pl.layers[j]), ++j)
    pl.first[j] = int(n);
  return pl;
}

namespace {

// Megatron's num_layers_per_pipeline_rank for rank r (before the vp split and the embedding /
// loss slots are taken out): F or G on the first / last rank with first/last counts, the
// middle ranks' share of the rest; (L + e + l)/p with the accounting flags.
int64_t SlotsOfRank(const ModelSpec& m, const Layout& l, int r) {
  const int p = l.pp, F = l.first_stage_layers, G = l.last_stage_layers;
  if (F > 0 || G > 0) {
    const int64_t mid_stages = p - (F > 0) - (G > 0);
    int64_t per_rank = mid_stages > 0 ? (m.layers - F - G) / mid_stages : 0;
    if (r == 0 && F > 0) per_rank = F;
    if (r == p - 1 && G > 0) per_rank = G;  // Megatron: the last rank's count wins at p 1
    return per_rank;
  }
  return (m.layers + l.embedding_in_split + l.loss_in_split) / p;
}

}  // namespace

int ChunkLayers(const ModelSpec& m, const Layout& l, int r, int c) {
  const int p = l.pp, v = l.vp;
  if (l.pipeline_layout) return l.pipeline_layout->layers[size_t(c) * p + r];
  int n = int(SlotsOfRank(m, l, r) / v);
  if (l.embedding_in_split && r == 0 && c == 0) --n;
  if (l.loss_in_split && r == p - 1 && c == v - 1) --n;
  return n;
}

// The planner's hot path asks for it several times per layout: O(1) but for a layout string.
int RankLayers(const ModelSpec& m, const Layout& l, int r) {
  if (l.pipeline_layout) {
    int n = 0;
    for (int c = 0; c < l.vp; ++c) n += ChunkLayers(m, l, r, c);
    return n;
  }
  return int(SlotsOfRank(m, l, r) - (l.embedding_in_split && r == 0) -
             (l.loss_in_split && r == l.pp - 1));
}

int ChunkFirstLayer(const ModelSpec& m, const Layout& l, int r, int c) {
  const int p = l.pp, v = l.vp;
  if (l.pipeline_layout) {
    const PipelineLayout& pl = *l.pipeline_layout;
    const size_t j = size_t(c) * p + r;
    if (pl.first.size() == pl.layers.size()) return pl.first[j];
    int n = 0;
    for (size_t i = 0; i < j; ++i) n += pl.layers[i];
    return n;
  }
  // Slots per chunk of the first rank, a middle one and the last; a round of chunks (one per
  // rank) holds all three kinds, less the embedding's slot on chunk 0 of rank 0.
  const int64_t first = SlotsOfRank(m, l, 0) / v;
  const int64_t mid = p > 2 ? SlotsOfRank(m, l, 1) / v : 0;
  const int64_t last = p > 1 ? SlotsOfRank(m, l, p - 1) / v : 0;
  const int64_t round = first + (p > 2 ? (p - 2) * mid : 0) + last;
  int64_t before = int64_t(c) * round + (r > 0 ? first : 0) + (r > 1 ? int64_t(r - 1) * mid : 0);
  if (l.embedding_in_split && (c > 0 || r > 0)) --before;
  return int(before);
}

int ChunkMoeLayers(const ModelSpec& m, const Layout& l, int r, int c) {
  if (!m.moe()) return 0;
  return int(m.moe_layers_in(ChunkFirstLayer(m, l, r, c), ChunkLayers(m, l, r, c)));
}

int RankMoeLayers(const ModelSpec& m, const Layout& l, int r) {
  if (!m.moe()) return 0;
  int n = 0;
  for (int c = 0; c < l.vp; ++c) n += ChunkMoeLayers(m, l, r, c);
  return n;
}

std::vector<int> StageLayers(const ModelSpec& m, const Layout& l) {
  std::vector<int> out;
  out.reserve(size_t(l.pp) * l.vp);
  for (int c = 0; c < l.vp; ++c)
    for (int r = 0; r < l.pp; ++r) out.push_back(ChunkLayers(m, l, r, c));
  return out;
}

namespace {

// What is wrong with an uneven split or a layout string, in Megatron's terms (its checks in
// megatron/core/transformer/transformer_config.py __post_init__), or "" when nothing is.
std::string SplitProblem(const ModelSpec& m, const Layout& l) {
  const int p = l.pp, v = l.vp;
  const int F = l.first_stage_layers, G = l.last_stage_layers;
  std::ostringstream o;
  if (l.pipeline_layout) {
    const PipelineLayout& pl = *l.pipeline_layout;
    const int64_t stages = int64_t(pl.layers.size());
    const int64_t layers = std::accumulate(pl.layers.begin(), pl.layers.end(), int64_t(0));
    if (F > 0 || G > 0 || l.embedding_in_split || l.loss_in_split)
      o << "--pipeline-model-parallel-layout cannot be combined with the first/last-stage or "
           "embedding/loss-accounting flags";
    else if (stages % p != 0)
      o << "pipeline layout '" << pl.text << "' has " << stages << " stages, not a multiple of pp " << p;
    else if (stages / p != v)
      o << "pipeline layout '" << pl.text << "' has " << stages << " stages = " << stages / p
        << " virtual stages per rank at pp " << p << ", not vp " << v;
    else if (layers != m.layers)
      o << "pipeline layout '" << pl.text << "' places " << layers << " transformer layers, the model has "
        << m.layers;
    else if (pl.mtp_layers != m.mtp_layers)  // pipeline_parallel_layer_layout.py asserts it
      o << "pipeline layout '" << pl.text << "' places " << pl.mtp_layers
        << " MTP layers ('m'); the model has " << m.mtp_layers;
    return o.str();
  }
  if (F > 0 || G > 0) {
    if (l.embedding_in_split || l.loss_in_split) {
      o << "--decoder-first/last-pipeline-num-layers cannot be combined with "
           "--account-for-embedding/loss-in-pipeline-split";
      return o.str();
    }
    if ((F > 0 && F % v) || (G > 0 && G % v)) {
      o << "first/last stage layers " << F << "/" << G << " must be divisible by vp " << v;
      return o.str();
    }
    const int64_t mid = m.layers - F - G, stages = p - (F > 0) - (G > 0);
    if (mid < 0 || (mid != 0) != (stages != 0))
      o << mid << " middle layers remaining (layers " << m.layers << " - first " << F << " - last " << G
        << ") but " << stages << " middle pipeline stages";
    else if (stages > 0 && mid % stages)
      o << "middle layers " << mid << " % middle stages " << stages << " != 0";
    else if (stages > 0 && (mid / stages) % v)
      o << "layers per middle stage " << mid / stages << " % vp " << v << " != 0";
  }
  return o.str();
}

}  // namespace

const char* RejectionKey(Rejection r) {
  switch (r) {
    case Rejection::kOk: return "ok";
    case Rejection::kWorldSize: return "world_size_mismatch";
    case Rejection::kHeadsTp: return "heads_not_divisible_by_tp";
    case Rejection::kKvHeadsTp: return "kv_heads_incompatible_with_tp";
    case Rejection::kLayersPp: return "layers_not_divisible_by_pp";
    case Rejection::kLayersVp: return "stage_layers_not_divisible_by_vp";
    case Rejection::kUnevenSplit: return "uneven_split_illegal";
    case Rejection::kPipelineLayout: return "pipeline_layout_mismatch";
    case Rejection::kInterleavePp: return "interleaving_pp_too_small";
    case Rejection::kInterleaveMicrobatches: return "interleaving_microbatch_rule";
    case Rejection::kBatch: return "global_batch_not_divisible_by_mb_x_dp";
    case Rejection::kSpNeedsTp: return "sequence_parallel_needs_tp";
    case Rejection::kTpCommOverlapNeedsSp: return "tp_comm_overlap_needs_sequence_parallel";
    case Rejection::kEpWithoutMoe: return "expert_parallel_without_experts";
    case Rejection::kExpertsEp: return "experts_not_divisible_by_ep";
    case Rejection::kExpertGrid: return "expert_grid_does_not_fold";
    case Rejection::kExpertTpFfn: return "expert_ffn_not_divisible_by_etp";
    case Rejection::kEpTpNeedsSp: return "moe_with_tp_needs_sequence_parallel";
    case Rejection::kA2aOverlap: return "moe_a2a_overlap_illegal";
    case Rejection::kOptimizerDtypes: return "optimizer_dtypes_illegal";
    case Rejection::kRecomputeModules: return "recompute_modules_illegal";
    case Rejection::kFlexNeedsEp: return "flex_dispatcher_needs_ep";
    case Rejection::kGradShardingNeedsDistOpt: return "grad_sharding_needs_distributed_optimizer";
    case Rejection::kGradReduceDtype: return "grad_reduce_dtype_illegal";
    case Rejection::kSeqCp: return "seq_len_not_divisible_by_2cp";
    case Rejection::kHybrid: return "hybrid_model_rule";
    case Rejection::kCpuOffloading: return "cpu_offloading_illegal";
    case Rejection::kScheduleMismatch: return "schedule_mismatch";
    case Rejection::kTpCrossesNode: return "tp_crosses_node";
    case Rejection::kPrecisionUnsupported: return "precision_unsupported_by_gpu";
    case Rejection::kMemory: return "out_of_memory";
    case Rejection::kCount: break;
  }
  return "?";
}

// A hybrid model's layout rules, "" when none is broken: megatron/core/ssm/mamba_mixer.py
// (mamba heads and groups % t), mamba_context_parallel.py (heads/t % c; groups/t and c, one
// divides the other), hybrid_layer_allocation.py select_pipeline_segment (a pattern without
// '|' separators: no virtual stages; uneven splits by first/last-stage counts only) and
// arguments.py (no --pipeline-model-parallel-layout with --hybrid-layer-pattern); no EP
// all-to-all overlap (combined 1F1B needs GPTModel's build_schedule_plan).
std::string HybridLayoutProblem(const ModelSpec& m, const Layout& l) {
  if (!m.hybrid()) return "";
  const std::string n = std::to_string(m.mamba_num_heads), g = std::to_string(m.mamba_num_groups);
  if (l.pipeline_layout)
    return "a hybrid model's pipeline split is its pattern's (--hybrid-layer-pattern '|'), "
           "not a --pipeline-model-parallel-layout string";
  if (l.vp > 1)
    return "virtual pipeline stages (vp " + std::to_string(l.vp) + ") need '|' stage separators "
           "in the hybrid pattern, which ptdp does not model";
  if (l.embedding_in_split || l.loss_in_split)
    return "a hybrid model splits its pattern's layers only (no embedding/loss in the split)";
  // combined_1f1b.py runs the model's build_schedule_plan, which GPTModel has and HybridModel
  // (megatron/core/models/hybrid/hybrid_model.py) has not.
  if (l.moe_a2a_overlap)
    return "--overlap-moe-expert-parallel-comm needs the model's build_schedule_plan, which "
           "Megatron's HybridModel lacks";
  if (m.mamba_num_heads == 0) return "";
  if (m.mamba_num_heads % l.tp != 0 || m.mamba_num_groups % l.tp != 0)
    return "mamba_num_heads " + n + " and mamba_num_groups " + g + " must be multiples of tp " +
           std::to_string(l.tp);
  if (l.cp > 1) {
    const int64_t heads = m.mamba_num_heads / l.tp, groups = m.mamba_num_groups / l.tp;
    if (heads % l.cp != 0)
      return "mamba_num_heads " + n + " must be a multiple of tp*cp " + std::to_string(l.tp * l.cp);
    if (groups % l.cp != 0 && l.cp % groups != 0)
      return "mamba_num_groups/tp " + std::to_string(groups) + " and cp " + std::to_string(l.cp) +
             ": neither divides the other";
  }
  return "";
}

// Megatron's rules for --recompute-modules (transformer_config.py __post_init__): with
// --recompute-granularity selective only; mla_up_proj needs MLA; moe, moe_act and
// shared_experts an MoE model (shared_experts its shared experts); moe not with
// --overlap-moe-expert-parallel-comm.
std::string RecomputeModulesProblem(const ModelSpec& m, const Layout& l) {
  const uint8_t mods = l.recompute_modules;
  if (mods == 0) return "";
  const std::string named = "recompute modules " + RecomputeModulesString(mods);
  if (l.recompute != Recompute::kSelective)
    return named + " need selective recompute (--recompute-granularity selective), not " +
           ToString(l.recompute);
  if ((mods & kRecomputeMlaUpProj) && !m.mla())
    return named + ": mla_up_proj needs multi-latent attention (kv_lora_rank)";
  if ((mods & (kRecomputeMoe | kRecomputeMoeAct | kRecomputeSharedExperts)) && !m.moe())
    return named + ": moe, moe_act and shared_experts need an MoE model";
  if ((mods & kRecomputeSharedExperts) && m.moe_shared_ffn_hidden == 0)
    return named + ": shared_experts needs shared experts (moe_shared_ffn_hidden)";
  if ((mods & kRecomputeMoe) && l.moe_a2a_overlap)
    return named + ": moe cannot be recomputed with --overlap-moe-expert-parallel-comm";
  return "";
}

std::string ExplainRejection(Rejection r, const ModelSpec& m, const Layout& l) {
  std::ostringstream o;
  const int64_t mb = l.num_microbatches();
  switch (r) {
    case Rejection::kOk: o << "legal"; break;
    case Rejection::kWorldSize:
      o << "tp*cp*pp*dp = " << l.tp << "*" << l.cp << "*" << l.pp << "*" << l.dp << " = " << l.world()
        << " does not match the number of GPUs";
      break;
    case Rejection::kHeadsTp: o << "heads " << m.heads << " % tp " << l.tp << " != 0"; break;
    case Rejection::kKvHeadsTp:
      o << "kv_heads " << m.kv_heads << " and tp " << l.tp << ": neither divides the other";
      break;
    case Rejection::kLayersPp: {
      const int64_t n = m.layers + l.embedding_in_split + l.loss_in_split;
      o << "layers " << m.layers;
      if (n != m.layers) o << " + " << n - m.layers << " (embedding/loss in the split)";
      o << " % pp " << l.pp << " != 0";
      break;
    }
    case Rejection::kLayersVp:
      o << "layers per pipeline stage "
        << (m.layers + l.embedding_in_split + l.loss_in_split) / l.pp << " % vp " << l.vp << " != 0";
      break;
    case Rejection::kUnevenSplit:
    case Rejection::kPipelineLayout: {
      const std::string why = SplitProblem(m, l);
      o << (why.empty() ? "the pipeline split (" + l.SplitName() + ") is not one Megatron accepts" : why);
      break;
    }
    case Rejection::kInterleavePp:
      o << "interleaved schedule (vp " << l.vp << ") needs pp > 1 with p2p overlap, pp > 2 without"
        << " (--overlap-p2p-communication " << (l.overlap_p2p ? "on" : "off") << "), got pp " << l.pp;
      break;
    case Rejection::kInterleaveMicrobatches:
      o << "interleaving needs pp <= g <= m and (m % g == 0 or m % g >= pp): pp " << l.pp
        << ", g " << l.group_size() << ", m " << mb;
      break;
    case Rejection::kBatch:
      o << "global batch " << l.global_batch << " % (micro batch " << l.micro_batch << " * dp "
        << l.dp << ") != 0";
      break;
    case Rejection::kSpNeedsTp: o << "sequence parallelism needs tp > 1"; break;
    case Rejection::kTpCommOverlapNeedsSp:
      o << "--tp-comm-overlap needs --sequence-parallel (megatron/training/arguments.py asserts it)";
      break;
    case Rejection::kEpWithoutMoe:
      o << "ep " << l.ep << (l.etp > 0 ? " / etp " + std::to_string(l.etp) : std::string())
        << " on a model without experts (num_experts 0)";
      break;
    case Rejection::kExpertsEp:
      o << "num_experts " << m.num_experts << " % ep " << l.ep << " != 0";
      break;
    case Rejection::kExpertGrid:
      o << "etp " << l.expert_tp() << " * ep " << l.ep << " does not divide tp*cp*dp = " << l.tp
        << "*" << l.cp << "*" << l.dp << " (the expert grid etp x ep x edp folds over it)";
      break;
    case Rejection::kExpertTpFfn:
      o << "moe_ffn_hidden " << m.moe_ffn_hidden << " % etp " << l.expert_tp() << " != 0";
      break;
    case Rejection::kEpTpNeedsSp:
      o << "a MoE model with tp " << l.tp
        << " needs sequence parallelism (megatron/core/transformer/moe/moe_layer.py raises "
           "\"performance may degrade if MoE and tensor parallelism are enabled without also "
           "enabling sequence parallelism\" when training)";
      break;
    case Rejection::kFlexNeedsEp:
      o << "--moe-token-dispatcher-type flex needs experts and ep > 1 (ep " << l.ep << ")";
      break;
    case Rejection::kOptimizerDtypes: {
      const std::string why = PrecisionAwareProblem(l);
      o << (why.empty() ? std::string("optimizer dtypes (none illegal for this layout)") : why);
      break;
    }
    case Rejection::kA2aOverlap:
      o << "--overlap-moe-expert-parallel-comm needs ep > 1 (ep " << l.ep
        << "), virtual stages when pp > 1 (pp " << l.pp << ", vp " << l.vp
        << ") and no full recompute (transformer_config.py)";
      break;
    case Rejection::kRecomputeModules: {
      const std::string why = RecomputeModulesProblem(m, l);
      o << (why.empty() ? "recompute modules " + RecomputeModulesString(l.recompute_modules) +
                              " (none illegal for this model and layout)"
                        : why);
      break;
    }
    case Rejection::kGradShardingNeedsDistOpt:
      if (l.shard_params && !l.shard_gradients)
        o << "weight sharding (optim_grads_params) shards the gradients too (shard_gradients)";
      else
        o << "gradient sharding (optim_grads) needs the distributed optimizer (Megatron-FSDP "
             "sets it)";
      break;
    case Rejection::kGradReduceDtype:
      if (l.accumulate_grads_in_fp32)
        o << "--grad-reduce-in-bf16 and --accumulate-allreduce-grads-in-fp32 ask for bf16 and fp32 "
             "gradient buffers (megatron/training/arguments.py lets the first win silently)";
      else
        o << "--grad-reduce-in-bf16 needs bf16 weights (precision bf16, fp8 or fp4), got "
          << ToString(l.precision) << " (megatron/training/arguments.py reads it under --bf16 only)";
      break;
    case Rejection::kSeqCp:
      o << "seq_len " << m.seq_len << " % (2 * cp " << l.cp << ") != 0";
      break;
    case Rejection::kHybrid: {
      const std::string why = HybridLayoutProblem(m, l);
      o << (why.empty() ? "a hybrid model's layout rule (none broken by this model and layout)"
                        : why);
      break;
    }
    case Rejection::kCpuOffloading:
      o << "--cpu-offloading-num-layers " << l.cpu_offload_layers
        << ": Megatron offloads 0 < N < layers (" << m.layers << ") without pipeline parallelism "
        << "(pp " << l.pp << ") or recompute (" << ToString(l.recompute) << ")";
      break;
    case Rejection::kScheduleMismatch:
      o << "schedule " << ToString(l.schedule) << " with vp " << l.vp
        << ": interleaved needs vp > 1 and vp > 1 needs interleaved";
      break;
    case Rejection::kTpCrossesNode:
      o << "tp " << l.tp << " spans NVLink domains (every layer's all-reduces would cross the network)";
      break;
    case Rejection::kPrecisionUnsupported:
      o << "precision " << ToString(l.precision) << " has no peak rate on this GPU";
      break;
    case Rejection::kMemory: o << "does not fit in GPU memory"; break;
    case Rejection::kCount: break;
  }
  return o.str();
}

bool GradReduceDtypeIllegal(const Layout& l) {
  return l.grad_reduce_in_bf16 && (l.precision == Precision::kFp16 ||
                                   l.precision == Precision::kFp32 || l.accumulate_grads_in_fp32);
}

std::string PrecisionAwareProblem(const Layout& l) {
  const OptimizerState& o = l.optimizer_state;
  if (!o.precision_aware) {
    for (const OptimizerDtypeField& f : OptimizerDtypeFields())
      if (const StateDtype d = o.*f.field; d != StateDtype::kFp32)
        return std::string(f.flag) + " " + ToString(d) +
               " needs --use-precision-aware-optimizer (optimizer_config.py: fp32 without it)";
    return "";
  }
  // megatron/core/optimizer/__init__.py: "only supported with distributed optimizer".
  if (!l.distributed_optimizer)
    return "--use-precision-aware-optimizer needs the distributed optimizer (--dist-opt on)";
  if (l.shard_gradients)
    return "--use-precision-aware-optimizer with Megatron-FSDP is not modelled (its own "
           "--megatron-fsdp-main-params-dtype and --megatron-fsdp-main-grads-dtype; "
           "Megatron-Bridge turns it off under FSDP)";
  if (o.main_grads == StateDtype::kBf16) {
    if (l.accumulate_grads_in_fp32)
      return "--main-grads-dtype bf16 with --accumulate-allreduce-grads-in-fp32 (Megatron "
             "asserts fp32 main gradients there)";
    if (l.precision == Precision::kFp16 || l.precision == Precision::kFp32)
      return std::string("--main-grads-dtype bf16 needs bf16 weights (--bf16, also under fp8 and "
                         "fp4), not ") + ToString(l.precision);
  }
  return "";
}

Rejection CheckLayout(const ModelSpec& m, const Layout& l) {
  if (m.heads % l.tp != 0) return Rejection::kHeadsTp;
  if (m.kv_heads % l.tp != 0 && l.tp % m.kv_heads != 0) return Rejection::kKvHeadsTp;
  if (m.hybrid() && !HybridLayoutProblem(m, l).empty()) return Rejection::kHybrid;
  // transformer_config.py: 0 <= N < num_layers, no pipeline parallelism, no recompute.
  if (l.cpu_offload_layers != 0 &&
      (l.cpu_offload_layers < 0 || l.cpu_offload_layers >= m.layers || l.pp > 1 ||
       l.recompute != Recompute::kNone))
    return Rejection::kCpuOffloading;
  if (l.pipeline_layout) {
    if (!SplitProblem(m, l).empty()) return Rejection::kPipelineLayout;
  } else if (l.first_stage_layers > 0 || l.last_stage_layers > 0) {
    if (!SplitProblem(m, l).empty()) return Rejection::kUnevenSplit;
  } else {
    const int64_t n = m.layers + l.embedding_in_split + l.loss_in_split;
    if (n % l.pp != 0) return Rejection::kLayersPp;
    if ((n / l.pp) % l.vp != 0) return Rejection::kLayersVp;
  }
  if (l.sequence_parallel && l.tp == 1) return Rejection::kSpNeedsTp;
  if (l.tp_comm_overlap && !l.sequence_parallel) return Rejection::kTpCommOverlapNeedsSp;
  if (!m.moe()) {
    if (l.ep != 1 || l.etp > 0) return Rejection::kEpWithoutMoe;
  } else {
    // megatron/training/arguments.py (num_experts % ep), parallel_state.py (the expert grid
    // etp x ep x edp x pp over the world), layers.py (the expert FFN split over etp).
    if (m.num_experts % l.ep != 0) return Rejection::kExpertsEp;
    if (l.expert_dp() == 0) return Rejection::kExpertGrid;
    if (m.moe_ffn_hidden % l.expert_tp() != 0 ||
        (m.moe_shared_ffn_hidden % l.tp) != 0)
      return Rejection::kExpertTpFfn;
    // Any MoE model, ep 1 included: MoELayer.forward checks the attention TP group's size.
    if (l.tp > 1 && !l.sequence_parallel) return Rejection::kEpTpNeedsSp;
  }
  if (l.moe_a2a_overlap && (!m.moe() || l.ep < 2 || (l.pp > 1 && l.vp < 2) ||
                            l.recompute == Recompute::kFull))
    return Rejection::kA2aOverlap;
  if (l.moe_flex_dispatcher && (!m.moe() || l.ep < 2)) return Rejection::kFlexNeedsEp;
  if (!RecomputeModulesProblem(m, l).empty()) return Rejection::kRecomputeModules;
  if ((l.shard_gradients && !l.distributed_optimizer) || (l.shard_params && !l.shard_gradients))
    return Rejection::kGradShardingNeedsDistOpt;
  if (GradReduceDtypeIllegal(l)) return Rejection::kGradReduceDtype;
  if (!PrecisionAwareProblem(l).empty()) return Rejection::kOptimizerDtypes;
  if (l.cp > 1 && m.seq_len % (2 * l.cp) != 0) return Rejection::kSeqCp;
  if (l.global_batch % (int64_t(l.micro_batch) * l.dp) != 0) return Rejection::kBatch;
  const bool interleaved = l.schedule == ScheduleKind::kInterleaved;
  if (interleaved != (l.vp > 1)) return Rejection::kScheduleMismatch;
  if (l.vp > 1) {
    // megatron/training/arguments.py: p > 1 with --overlap-p2p-communication (the default for
    // interleaved schedules), p > 2 without it.
    if (l.pp < 2 || (!l.overlap_p2p && l.pp < 3)) return Rejection::kInterleavePp;
    const int64_t mb = l.num_microbatches(), g = l.group_size();
    if (!(l.pp <= g && g <= mb && (mb % g == 0 || mb % g >= l.pp)))
      return Rejection::kInterleaveMicrobatches;
  }
  return Rejection::kOk;
}

Status ValidateLayout(const ModelSpec& m, const Layout& l, int world, int gpus_per_node,
                      bool allow_tp_across_nodes) {
  if (l.tp <= 0 || l.pp <= 0 || l.dp <= 0 || l.vp <= 0 || l.cp <= 0 || l.micro_batch <= 0 ||
      l.global_batch <= 0 || l.ep <= 0 || l.etp < 0)
    return Status::Error("layout " + l.ShortName() + ": sizes must be positive");
  // Before l.world(): the product of four ints could overflow.
  if (double(l.tp) * l.cp * l.pp * l.dp > double(kMaxWorldSize) || l.vp > kMaxLayers ||
      l.micro_batch > kMaxGlobalBatch)
    return Status::Error("layout " + l.ShortName() + ": tp*cp*pp*dp is above the " +
                         std::to_string(kMaxWorldSize) + "-rank limit, or vp or the micro-batch "
                         "is above its limit (" + std::to_string(kMaxLayers) + ", " +
                         std::to_string(kMaxGlobalBatch) + ")");
  if (l.global_batch > kMaxGlobalBatch)
    return Status::Error("layout " + l.ShortName() + ": global batch " +
                         std::to_string(l.global_batch) + " is above " +
                         std::to_string(kMaxGlobalBatch));
  if (l.world() != world)
    return Status::Error("illegal layout " + l.ShortName() + ": " +
                         ExplainRejection(Rejection::kWorldSize, m, l) + " (" +
                         std::to_string(world) + ")");
  Rejection r = CheckLayout(m, l);
  if (r == Rejection::kOk && !allow_tp_across_nodes && l.tp > 1 &&
      (l.tp > gpus_per_node || gpus_per_node % l.tp != 0))
    r = Rejection::kTpCrossesNode;
  if (r != Rejection::kOk)
    return Status::Error("illegal layout " + l.ShortName() + ": " + ExplainRejection(r, m, l));
  return Status::Ok();
}

}  // namespace ptdp
