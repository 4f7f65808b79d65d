// Megatron's legality rules (megatron/training/arguments.py validate_args;
// megatron/core/parallel_state.py; ../shared/reference/megatron-reference.md section 1).
#include "core/layout.h"

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
Result<Precision> ParsePrecision(const std::string& s) {
  if (s == "bf16") return Precision::kBf16;
  if (s == "fp16") return Precision::kFp16;
  if (s == "fp8") return Precision::kFp8;
  if (s == "fp4") return Precision::kFp4;
  if (s == "fp32") return Precision::kFp32;
  return Status::Error("precision '" + s + "' is not one of: bf16, fp16, fp8, fp4, fp32");
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
  if (vp > 1) o << " vp" << vp;
  o << " mb" << micro_batch;
  return o.str();
}

std::string Layout::Knobs() const {
  std::string s;
  if (sequence_parallel) s += "sp ";
  if (recompute == Recompute::kSelective) s += "rc-sel ";
  if (recompute == Recompute::kFull) s += "rc-full ";
  if (distributed_optimizer) s += "dopt ";
  if (precision != Precision::kBf16) s += std::string(ToString(precision)) + " ";
  if (!s.empty()) s.pop_back();
  return s.empty() ? "-" : s;
}

const char* RejectionKey(Rejection r) {
  switch (r) {
    case Rejection::kOk: return "ok";
    case Rejection::kWorldSize: return "world_size_mismatch";
    case Rejection::kHeadsTp: return "heads_not_divisible_by_tp";
    case Rejection::kKvHeadsTp: return "kv_heads_incompatible_with_tp";
    case Rejection::kLayersPp: return "layers_not_divisible_by_pp";
    case Rejection::kLayersVp: return "stage_layers_not_divisible_by_vp";
    case Rejection::kInterleavePp: return "interleaving_needs_pp_above_2";
    case Rejection::kInterleaveMicrobatches: return "interleaving_microbatch_rule";
    case Rejection::kBatch: return "global_batch_not_divisible_by_mb_x_dp";
    case Rejection::kSpNeedsTp: return "sequence_parallel_needs_tp";
    case Rejection::kSeqCp: return "seq_len_not_divisible_by_2cp";
    case Rejection::kScheduleMismatch: return "schedule_mismatch";
    case Rejection::kTpCrossesNode: return "tp_crosses_node";
    case Rejection::kPrecisionUnsupported: return "precision_unsupported_by_gpu";
    case Rejection::kMemory: return "out_of_memory";
    case Rejection::kCount: break;
  }
  return "?";
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
    case Rejection::kLayersPp: o << "layers " << m.layers << " % pp " << l.pp << " != 0"; break;
    case Rejection::kLayersVp:
      o << "layers per pipeline stage " << m.layers / l.pp << " % vp " << l.vp << " != 0";
      break;
    case Rejection::kInterleavePp:
      o << "interleaved schedule (vp " << l.vp << ") needs pp > 2, got pp " << l.pp;
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
    case Rejection::kSeqCp:
      o << "seq_len " << m.seq_len << " % (2 * cp " << l.cp << ") != 0";
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

Rejection CheckLayout(const ModelSpec& m, const Layout& l) {
  if (m.heads % l.tp != 0) return Rejection::kHeadsTp;
  if (m.kv_heads % l.tp != 0 && l.tp % m.kv_heads != 0) return Rejection::kKvHeadsTp;
  if (m.layers % l.pp != 0) return Rejection::kLayersPp;
  if ((m.layers / l.pp) % l.vp != 0) return Rejection::kLayersVp;
  if (l.sequence_parallel && l.tp == 1) return Rejection::kSpNeedsTp;
  if (l.cp > 1 && m.seq_len % (2 * l.cp) != 0) return Rejection::kSeqCp;
  if (l.global_batch % (int64_t(l.micro_batch) * l.dp) != 0) return Rejection::kBatch;
  const bool interleaved = l.schedule == ScheduleKind::kInterleaved;
  if (interleaved != (l.vp > 1)) return Rejection::kScheduleMismatch;
  if (l.vp > 1) {
    if (l.pp <= 2) return Rejection::kInterleavePp;
    const int64_t mb = l.num_microbatches(), g = l.group_size();
    if (!(l.pp <= g && g <= mb && (mb % g == 0 || mb % g >= l.pp)))
      return Rejection::kInterleaveMicrobatches;
  }
  return Rejection::kOk;
}

Status ValidateLayout(const ModelSpec& m, const Layout& l, int world, int gpus_per_node,
                      bool allow_tp_across_nodes) {
  if (l.tp <= 0 || l.pp <= 0 || l.dp <= 0 || l.vp <= 0 || l.cp <= 0 || l.micro_batch <= 0 ||
      l.global_batch <= 0)
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
