// plan.yaml writer and strict reader. Predictions are outputs: plain numbers whose unit is in
// the key name (step_time_s, memory_bytes) so that a round trip is exact.
#include "core/plan.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/file_io.h"
#include "core/limits.h"
#include "core/yaml_reader.h"

namespace ptdp {
namespace {

std::string Num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

const char* Bool(bool b) { return b ? "true" : "false"; }

// Predictions are outputs of the cost model: plain numbers inside their range (core/limits.h).
double ParseNumber(YamlReader& r, const std::string& key, const YAML::Node& n, const Range& range) {
  const std::string text = n.IsScalar() ? n.Scalar() : "";
  double v = 0;
  if (!ParsePlainNumber(text, &v)) {
    r.Fail(key, "'" + text + "' is not a number");
    return 0;
  }
  if (Status st = CheckRange(v, range, "'" + text + "'"); !st.ok()) r.Fail(key, st.message());
  return v;
}

double ReadDouble(YamlReader& r, const std::string& key, const Range& range) {
  if (!r.Has(key)) { r.Fail(key, "missing required key"); return 0; }
  return ParseNumber(r, key, r.Child(key), range);
}

Status ReadPrediction(const YAML::Node& node, const std::string& file, Prediction* p) {
  YamlReader r(node, file, "prediction");
  p->source = r.Enum("source", {"analytic", "simulated"}, "analytic");
  p->step_time_s = ReadDouble(r, "step_time_s", limits::kPredictedStepTime);
  p->tflops_per_gpu = ReadDouble(r, "tflops_per_gpu", limits::kPredictedTflops);
  p->hw_tflops_per_gpu = ReadDouble(r, "hw_tflops_per_gpu", limits::kPredictedTflops);
  p->mfu = ReadDouble(r, "mfu", limits::kPredictedMfu);
  p->bubble_fraction = ReadDouble(r, "bubble_fraction", limits::kFraction);
  p->fits = r.Bool("fits", false);
  YamlReader b(r.Child("breakdown_s"), file, "prediction.breakdown_s");
  p->breakdown.compute_s = ReadDouble(b, "compute", limits::kPredictedSeconds);
  p->breakdown.tp_comm_s = ReadDouble(b, "tp_comm", limits::kPredictedSeconds);
  p->breakdown.pp_comm_s = ReadDouble(b, "pp_comm", limits::kPredictedSeconds);
  p->breakdown.dp_comm_s = ReadDouble(b, "dp_comm", limits::kPredictedSeconds);
  p->breakdown.bubble_s = ReadDouble(b, "bubble", limits::kPredictedSeconds);
  p->breakdown.optimizer_s = ReadDouble(b, "optimizer", limits::kPredictedSeconds);
  PTDP_RETURN_IF_ERROR(b.Finish());
  YamlReader m(r.Child("memory_bytes"), file, "prediction.memory_bytes");
  p->memory.weights = ReadDouble(m, "weights", limits::kPredictedBytes);
  p->memory.grads = ReadDouble(m, "grads", limits::kPredictedBytes);
  p->memory.optimizer = ReadDouble(m, "optimizer", limits::kPredictedBytes);
  p->memory.activations = ReadDouble(m, "activations", limits::kPredictedBytes);
  p->memory.other = ReadDouble(m, "other", limits::kPredictedBytes);
  p->memory.total = ReadDouble(m, "total", limits::kPredictedBytes);
  p->memory.capacity = ReadDouble(m, "capacity", limits::kPredictedBytes);
  if (m.Has("usable")) p->memory.usable = ReadDouble(m, "usable", limits::kPredictedBytes);
  if (m.Has("host")) p->memory.host = ReadDouble(m, "host", limits::kPredictedBytes);
  if (m.Has("host_usable"))
    p->memory.host_usable = ReadDouble(m, "host_usable", limits::kPredictedBytes);
  PTDP_RETURN_IF_ERROR(m.Finish());
  YAML::Node stages = r.Child("stage_memory_bytes");
  if (stages && !stages.IsSequence()) r.Fail("stage_memory_bytes", "must be a list of numbers");
  if (stages && stages.IsSequence())
    for (const auto& s : stages)
      p->stage_memory_bytes.push_back(ParseNumber(r, "stage_memory_bytes", s, limits::kPredictedBytes));
  return r.Finish();
}

}  // namespace

namespace {

std::string JoinInts(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

Result<Layout> LayoutFromYaml(const YAML::Node& node, const std::string& file,
                              const std::string& path, const ModelSpec& model) {
  YamlReader l(node, file, path);
  Layout lay;
  lay.tp = l.PositiveIntAtMost("tp", kMaxWorldSize);
  lay.pp = l.PositiveIntAtMost("pp", kMaxWorldSize);
  lay.dp = l.PositiveIntAtMost("dp", kMaxWorldSize);
  lay.vp = l.PositiveIntAtMost("vp", kMaxLayers, 1);
  lay.cp = l.PositiveIntAtMost("cp", kMaxWorldSize, 1);
  // Expert parallelism (older plans have neither key: ep 1, etp = tp); CheckLayout, through the
  // caller's ValidateLayout, checks them against the model (experts, the folded expert grid).
  lay.ep = l.PositiveIntAtMost("ep", kMaxWorldSize, 1);
  lay.etp = l.NonNegativeIntAtMost("etp", kMaxWorldSize, 0);
  lay.micro_batch = l.PositiveIntAtMost("micro_batch", kMaxGlobalBatch);
  lay.global_batch = l.PositiveInt("global_batch");
  const int64_t m_written = l.PositiveInt("num_microbatches", 0 + 1);
  lay.microbatch_group = l.NonNegativeIntAtMost("microbatch_group", kMaxGlobalBatch, 0);
  lay.sequence_parallel = l.Bool("sequence_parallel", false);
  lay.recompute = *ParseRecompute(l.Enum("recompute", {"none", "selective", "full"}, "none"));
  if (l.Has("recompute_modules")) {  // Megatron's --recompute-modules, with selective recompute
    const std::string mods = l.String("recompute_modules", "");
    const Result<uint8_t> bits = ParseRecomputeModules(mods);
    if (!bits.ok()) l.Fail("recompute_modules", bits.status().message());
    else if (lay.recompute != Recompute::kSelective)
      l.Fail("recompute_modules", "needs recompute: selective");
    else
      lay.recompute_modules = *bits;
  }
  lay.distributed_optimizer = l.Bool("distributed_optimizer", false);
  lay.shard_gradients = l.Bool("shard_gradients", false);
  lay.shard_params = l.Bool("shard_params", false);
  lay.cpu_offload_layers = int(l.NonNegativeInt("cpu_offloading_num_layers", 0));
  lay.grad_reduce_in_bf16 = l.Bool("grad_reduce_in_bf16", false);
  lay.accumulate_grads_in_fp32 = l.Bool("accumulate_allreduce_grads_in_fp32", false);
  // Megatron's --use-precision-aware-optimizer and its dtypes (CheckLayout checks the rules).
  lay.optimizer_state.precision_aware = l.Bool("use_precision_aware_optimizer", false);
  for (const OptimizerDtypeField& f : OptimizerDtypeFields()) {
    if (!l.Has(f.key)) continue;
    const Result<StateDtype> d = ParseStateDtype("value", l.String(f.key, "fp32"), f.allowed);
    if (d.ok()) lay.optimizer_state.*f.field = *d;
    else l.Fail(f.key, d.status().message());
  }
  lay.precision = *ParsePrecision(l.Enum("precision", {"bf16", "fp16", "fp8", "fp4", "fp32"}, "bf16"));
  lay.schedule = *ParseScheduleKind(
      l.Enum("schedule", {"gpipe", "1f1b", "interleaved"}, lay.vp > 1 ? "interleaved" : "1f1b"));
  lay.overlap_grad_reduce = l.Bool("overlap_grad_reduce", true);
  lay.overlap_param_gather = l.Bool("overlap_param_gather", true);
  lay.ddp_bucket_size = l.NonNegativeInt("ddp_bucket_size", 0);
  lay.tp_comm_overlap = l.Bool("tp_comm_overlap", false);
  lay.overlap_p2p = l.Bool("overlap_p2p", true);
  lay.moe_a2a_overlap = l.Bool("moe_a2a_overlap", false);
  lay.moe_flex_dispatcher = l.Bool("moe_flex_dispatcher", false);
  lay.cross_entropy = *ParseCrossEntropyFusion(
      l.Enum("cross_entropy_fusion", {"none", "native", "te"}, "none"));
  lay.first_stage_layers = l.NonNegativeIntAtMost("first_stage_layers", kMaxLayers, 0);
  lay.last_stage_layers = l.NonNegativeIntAtMost("last_stage_layers", kMaxLayers, 0);
  lay.embedding_in_split = l.Bool("embedding_in_split", false);
  lay.loss_in_split = l.Bool("loss_in_split", false);
  if (l.Has("pipeline_layout")) {
    auto pl = ParsePipelineLayout(l.String("pipeline_layout"));
    if (!pl.ok()) l.Fail("pipeline_layout", pl.status().message());
    else lay.pipeline_layout = std::make_shared<const PipelineLayout>(std::move(*pl));
  }
  std::vector<int> written;
  const bool has_stage_layers = l.Has("stage_layers");
  if (has_stage_layers) {
    const YAML::Node n = l.Child("stage_layers");
    if (!n.IsSequence()) {
      l.Fail("stage_layers", "must be a list of layer counts, one per virtual stage");
    } else {
      for (const auto& x : n) {
        int64_t v = -1;
        try { v = x.as<int64_t>(); } catch (const YAML::Exception&) {}
        if (v < 0 || v > kMaxLayers) {
          l.Fail("stage_layers", "must be a list of layer counts in 0.." + std::to_string(kMaxLayers));
          break;
        }
        written.push_back(int(v));
      }
    }
  }
  // The split's own counts, once the layout is one Megatron accepts (else the caller names
  // the broken rule).
  if (has_stage_layers && lay.tp > 0 && lay.pp > 0 && lay.vp > 0 && lay.dp > 0 && lay.micro_batch > 0 &&
      lay.cp > 0 && lay.ep > 0 &&
      CheckLayout(model, lay) == Rejection::kOk) {
    const std::vector<int> derived = StageLayers(model, lay);
    if (derived != written)
      l.Fail("stage_layers", JoinInts(written) + " disagrees with the split (" + lay.SplitName() +
                                 ") of " + std::to_string(model.layers) + " layers over pp " +
                                 std::to_string(lay.pp) + " x vp " + std::to_string(lay.vp) + ": " +
                                 JoinInts(derived) + " (correct the key or remove it)");
  }
  if (l.Has("num_microbatches") && lay.global_batch % (int64_t(lay.micro_batch) * lay.dp) == 0 &&
      m_written != lay.num_microbatches())
    l.Fail("num_microbatches", "'" + std::to_string(m_written) + "' disagrees with B/(b*dp) = " +
                                   std::to_string(lay.num_microbatches()));
  PTDP_RETURN_IF_ERROR(l.Finish());
  return lay;
}

std::string PlanToYaml(const Plan& plan) {
  const Layout& l = plan.layout;
  std::ostringstream o;
  o << "# ptdp plan: the chosen layout, its inputs and its predicted figures.\n"
    << "# Read by `ptdp simulate`, `ptdp train` and `ptdp compare`.\n"
    << "ptdp_plan_version: 1\n"
    << "cluster:\n"
    << "  file: " << YamlQuote(plan.cluster_file) << "\n"
    << "  name: " << YamlQuote(plan.cluster_name) << "\n"
    << "  nodes: " << plan.nodes << "\n"
    << "  gpus_per_node: " << plan.gpus_per_node << "\n";
  if (plan.nodes_per_nvlink_domain != 1)
    o << "  nodes_per_nvlink_domain: " << plan.nodes_per_nvlink_domain << "\n";
  o << "  allow_tp_across_nodes: " << Bool(plan.allow_tp_across_nodes) << "\n"
    << "model:\n" << ModelToYaml(plan.model, "  ")
    << "layout:\n"
    << "  tp: " << l.tp << "\n"
    << "  pp: " << l.pp << "\n"
    << "  dp: " << l.dp << "\n"
    << "  vp: " << l.vp << "\n"
    << "  cp: " << l.cp << "\n";
  if (plan.model.moe() || l.ep != 1 || l.etp != 0)
    o << "  ep: " << l.ep << "  # expert-parallel size\n"
      << "  etp: " << l.etp << "  # expert tensor-parallel size; 0 = tp (Megatron default)\n";
  o
    << "  micro_batch: " << l.micro_batch << "\n"
    << "  global_batch: " << l.global_batch << "\n"
    << "  num_microbatches: " << l.num_microbatches() << "  # derived: B / (b * dp)\n"
    << "  microbatch_group: " << l.microbatch_group << "  # 0 = pp (Megatron default)\n"
    << "  sequence_parallel: " << Bool(l.sequence_parallel) << "\n"
    << "  recompute: " << ToString(l.recompute) << "\n"
    << (l.recompute == Recompute::kSelective && l.recompute_modules
            ? "  recompute_modules: \"" + RecomputeModulesString(l.recompute_modules) +
                  "\"  # Megatron's --recompute-modules\n"
            : std::string())
    << "  distributed_optimizer: " << Bool(l.distributed_optimizer) << "\n"
    << "  shard_gradients: " << Bool(l.shard_gradients) << "  # Megatron-FSDP optim_grads (ZeRO-2)\n"
    << "  shard_params: " << Bool(l.shard_params) << "  # Megatron-FSDP optim_grads_params (ZeRO-3)\n"
    << "  precision: " << ToString(l.precision) << "\n"
    << "  schedule: " << ToString(l.schedule) << "\n"
    << "  overlap_grad_reduce: " << Bool(l.overlap_grad_reduce) << "\n"
    << "  overlap_param_gather: " << Bool(l.overlap_param_gather)
    << "  # with the distributed optimizer and overlap_grad_reduce\n"
    << "  tp_comm_overlap: " << Bool(l.tp_comm_overlap) << "\n"
    << "  overlap_p2p: " << Bool(l.overlap_p2p) << "  # interleaved schedules only\n";
  if (l.ddp_bucket_size > 0) o << "  ddp_bucket_size: " << l.ddp_bucket_size << "  # --ddp-bucket-size\n";
  if (l.cpu_offload_layers > 0)
    o << "  cpu_offloading_num_layers: " << l.cpu_offload_layers
      << "  # --cpu-offloading-num-layers\n";
  if (l.grad_reduce_in_bf16) o << "  grad_reduce_in_bf16: true  # --grad-reduce-in-bf16\n";
  if (l.accumulate_grads_in_fp32)
    o << "  accumulate_allreduce_grads_in_fp32: true  # --accumulate-allreduce-grads-in-fp32\n";
  if (l.optimizer_state.precision_aware) {
    o << "  use_precision_aware_optimizer: true  # --use-precision-aware-optimizer\n";
    for (const OptimizerDtypeField& f : OptimizerDtypeFields())
      if (const StateDtype d = l.optimizer_state.*f.field; d != StateDtype::kFp32)
        o << "  " << f.key << ": " << ToString(d) << "\n";
  }
  if (l.moe_a2a_overlap) o << "  moe_a2a_overlap: true  # --overlap-moe-expert-parallel-comm\n";
  if (l.moe_flex_dispatcher) o << "  moe_flex_dispatcher: true  # --moe-token-dispatcher-type flex\n";
  if (l.cross_entropy != CrossEntropyFusion::kNone)
    o << "  cross_entropy_fusion: " << ToString(l.cross_entropy)
      << "  # --cross-entropy-loss-fusion --cross-entropy-fusion-impl " << ToString(l.cross_entropy)
      << "\n";
  // The pipeline split as Megatron's flags give it, then what it places (checked on reading).
  if (l.first_stage_layers > 0) o << "  first_stage_layers: " << l.first_stage_layers << "\n";
  if (l.last_stage_layers > 0) o << "  last_stage_layers: " << l.last_stage_layers << "\n";
  if (l.embedding_in_split) o << "  embedding_in_split: true\n";
  if (l.loss_in_split) o << "  loss_in_split: true\n";
  if (l.pipeline_layout) o << "  pipeline_layout: " << YamlQuote(l.pipeline_layout->text) << "\n";
  if (CheckLayout(plan.model, l) == Rejection::kOk)
    o << "  stage_layers: " << JoinInts(StageLayers(plan.model, l))
      << "  # layers per virtual stage, in layer order\n";
  if (plan.has_prediction) {
    const Prediction& p = plan.prediction;
    o << "prediction:\n"
      << "  source: " << p.source << "\n"
      << "  step_time_s: " << Num(p.step_time_s) << "\n"
      << "  tflops_per_gpu: " << Num(p.tflops_per_gpu) << "\n"
      << "  hw_tflops_per_gpu: " << Num(p.hw_tflops_per_gpu) << "\n"
      << "  mfu: " << Num(p.mfu) << "\n"
      << "  bubble_fraction: " << Num(p.bubble_fraction) << "\n"
      << "  fits: " << Bool(p.fits) << "\n"
      << "  breakdown_s:\n"
      << "    compute: " << Num(p.breakdown.compute_s) << "\n"
      << "    tp_comm: " << Num(p.breakdown.tp_comm_s) << "\n"
      << "    pp_comm: " << Num(p.breakdown.pp_comm_s) << "\n"
      << "    dp_comm: " << Num(p.breakdown.dp_comm_s) << "\n"
      << "    bubble: " << Num(p.breakdown.bubble_s) << "\n"
      << "    optimizer: " << Num(p.breakdown.optimizer_s) << "\n"
      << "  memory_bytes:\n"
      << "    weights: " << Num(p.memory.weights) << "\n"
      << "    grads: " << Num(p.memory.grads) << "\n"
      << "    optimizer: " << Num(p.memory.optimizer) << "\n"
      << "    activations: " << Num(p.memory.activations) << "\n"
      << "    other: " << Num(p.memory.other) << "\n"
      << "    total: " << Num(p.memory.total) << "\n"
      << "    capacity: " << Num(p.memory.capacity) << "\n"
      << "    usable: " << Num(p.memory.limit()) << "  # capacity less the memory headroom\n";
    if (p.memory.host > 0)
      o << "    host: " << Num(p.memory.host) << "  # activations offloaded to host memory\n"
        << "    host_usable: " << Num(p.memory.host_usable) << "\n";
    o << "  stage_memory_bytes: [";
    for (size_t i = 0; i < p.stage_memory_bytes.size(); ++i)
      o << (i ? ", " : "") << Num(p.stage_memory_bytes[i]);
    o << "]\n";
  }
  return o.str();
}

Result<Plan> PlanFromYamlText(const std::string& text, const std::string& name) {
  PTDP_ASSIGN_OR_RETURN(YAML::Node root, ParseYamlText(text, name));
  YamlReader r(root, name, "");
  Plan plan;
  if (r.PositiveInt("ptdp_plan_version") != 1)
    r.Fail("ptdp_plan_version", "only version 1 is understood");
  YamlReader c(r.Child("cluster"), name, "cluster");
  plan.cluster_file = c.String("file");
  plan.cluster_name = c.String("name", "");
  plan.nodes = c.PositiveIntAtMost("nodes", kMaxWorldSize);
  plan.gpus_per_node = c.PositiveIntAtMost("gpus_per_node", kMaxWorldSize);
  if (int64_t(plan.nodes) * plan.gpus_per_node > kMaxWorldSize)
    c.Fail("gpus_per_node", std::to_string(plan.nodes) + " nodes x " +
                                std::to_string(plan.gpus_per_node) + " GPUs is above the " +
                                std::to_string(kMaxWorldSize) + "-GPU limit");
  plan.nodes_per_nvlink_domain = c.PositiveIntAtMost("nodes_per_nvlink_domain", kMaxWorldSize, 1);
  if (plan.nodes % plan.nodes_per_nvlink_domain != 0)
    c.Fail("nodes_per_nvlink_domain",
           "'" + std::to_string(plan.nodes_per_nvlink_domain) + "' does not divide nodes '" +
               std::to_string(plan.nodes) + "'");
  plan.allow_tp_across_nodes = c.Bool("allow_tp_across_nodes", false);
  PTDP_RETURN_IF_ERROR(c.Finish());
  if (!r.Has("model")) return Status::Error(name + ": missing required key 'model'");
  PTDP_ASSIGN_OR_RETURN(plan.model, ModelFromYaml(r.Child("model"), name, "model"));
  PTDP_ASSIGN_OR_RETURN(plan.layout, LayoutFromYaml(r.Child("layout"), name, "layout", plan.model));
  const Layout& lay = plan.layout;
  if (r.Has("prediction")) {
    plan.has_prediction = true;
    PTDP_RETURN_IF_ERROR(ReadPrediction(r.Child("prediction"), name, &plan.prediction));
  }
  PTDP_RETURN_IF_ERROR(r.Finish());
  const int world = plan.nodes * plan.gpus_per_node;
  // lay.world() below multiplies four ints: refuse products past the limit first.
  if (double(lay.tp) * lay.cp * lay.pp * lay.dp > double(kMaxWorldSize))
    return Status::Error(name + ": layout " + lay.ShortName() + ": tp*cp*pp*dp is above the " +
                         std::to_string(kMaxWorldSize) + "-rank limit");
  // TP stays inside an NVLink domain: the node's GPUs, or the rack's.
  PTDP_RETURN_IF_ERROR(ValidateLayout(plan.model, lay, lay.world(),
                                      plan.gpus_per_node * plan.nodes_per_nvlink_domain,
                                      plan.allow_tp_across_nodes)
                           .Prefixed(name));
  if (lay.world() > world)
    return Status::Error(name + ": layout needs " + std::to_string(lay.world()) +
                         " GPUs but the cluster has " + std::to_string(world));
  return plan;
}

Status WritePlanFile(const Plan& plan, const std::string& path) {
  std::ofstream out(path);
  if (!out) return Status::Error(path + ": cannot open for writing");
  out << PlanToYaml(plan);
  out.close();
  if (!out) return Status::Error(path + ": write failed");
  return Status::Ok();
}

Result<Plan> LoadPlanFile(const std::string& path) {
  PTDP_ASSIGN_OR_RETURN(const std::string text, ReadFileText(path, "a plan.yaml"));
  return PlanFromYamlText(text, path);
}

}  // namespace ptdp
