// Shared flag handling and rendering for the ptdp commands.
#include "cli/common.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <sstream>
#include <thread>
#include <tuple>

#include "cli/paths.h"
#include "core/units.h"

namespace ptdp::cli {

void AddSplitFlags(CLI::App* app, SplitFlags* f) {
  app->add_option("--decoder-first-pipeline-num-layers", f->first_stage_layers,
                  "transformer layers on the first pipeline stage (Megatron-LM's flag)");
  app->add_option("--decoder-last-pipeline-num-layers", f->last_stage_layers,
                  "transformer layers on the last pipeline stage (Megatron-LM's flag)");
  app->add_flag("--account-for-embedding-in-pipeline-split", f->embedding_in_split,
                "the embedding takes one layer's slot on the first stage (Megatron-LM's flag)");
  app->add_flag("--account-for-loss-in-pipeline-split", f->loss_in_split,
                "the loss takes one layer's slot on the last stage (Megatron-LM's flag)");
  app->add_option("--pipeline-model-parallel-layout", f->pipeline_layout,
                  "layers per virtual stage as Megatron-LM writes it, e.g. 'Et|(tt|)*30L' (E "
                  "embedding, t layer, L loss, | stage boundary, (..)*n repeat; sets vp)");
}

Result<bool> ApplySplit(const SplitFlags& f, Layout* l) {
  for (const auto& [flag, v, out] :
       {std::tuple{"--decoder-first-pipeline-num-layers", f.first_stage_layers, &l->first_stage_layers},
        std::tuple{"--decoder-last-pipeline-num-layers", f.last_stage_layers, &l->last_stage_layers}}) {
    if (!v) continue;
    if (*v <= 0 || *v > kMaxLayers)
      return Status::Error(std::string(flag) + " " + std::to_string(*v) + " must be in 1.." +
                           std::to_string(kMaxLayers));
    *out = *v;
  }
  l->embedding_in_split = f.embedding_in_split;
  l->loss_in_split = f.loss_in_split;
  if (f.pipeline_layout) {
    auto pl = ParsePipelineLayout(*f.pipeline_layout);
    if (!pl.ok()) return pl.status().Prefixed("--pipeline-model-parallel-layout");
    l->pipeline_layout = std::make_shared<const PipelineLayout>(std::move(*pl));
  }
  return f.any();
}

void AddLayoutFlags(CLI::App* app, LayoutFlags* f, bool need_cluster_model) {
  auto* c = app->add_option("--cluster", f->cluster, "cluster YAML (configs/clusters/*.yaml)");
  auto* m = app->add_option("--model", f->model,
                            "model YAML (configs/models/*.yaml) or hf:path/config.json");
  if (need_cluster_model) { c->required(); m->required(); }
  app->add_option("--nodes", f->nodes, "override the cluster's node count");
  app->add_option("--gpus", f->gpus, "world size tp*cp*pp*dp (default: every GPU)");
  app->add_option("--global-batch", f->global_batch, "global batch B in sequences");
  app->add_option("--seq-len", f->seq_len, "override the model's sequence length");
  app->add_option("--tp", f->tp, "tensor-parallel size (plan: a list such as 4,8 searches those)")
      ->delimiter(',');
  app->add_option("--pp", f->pp, "pipeline-parallel size (or a list)")->delimiter(',');
  app->add_option("--dp", f->dp, "data-parallel size (or a list)")->delimiter(',');
  app->add_option("--vp", f->vp,
                  "model chunks per pipeline rank, Megatron's --num-virtual-stages-per-pipeline-rank "
                  "(interleaved 1F1B when > 1; or a list)")
      ->delimiter(',');
  app->add_option("--cp", f->cp, "context-parallel size (or a list; plan searches it by default)")
      ->delimiter(',');
  app->add_option("--micro-batch", f->micro_batch, "micro-batch size b (or a list)")->delimiter(',');
  app->add_option("--expert-model-parallel-size,--ep", f->ep,
                  "expert-parallel size of an MoE model (Megatron-LM's flag; or a list)")
      ->delimiter(',');
  app->add_option("--expert-tensor-parallel-size,--etp", f->etp,
                  "tensor-parallel size of the experts (Megatron-LM's flag; default: tp; or a list)")
      ->delimiter(',');
  AddSplitFlags(app, &f->split);
  app->add_option("--overlap-p2p-communication", f->p2p_overlap,
                  "interleaved schedule: overlap the pipeline's sends and receives with compute "
                  "on|off (default on; off needs pp > 2)");
  app->add_option("--train-tokens", f->train_tokens,
                  "tokens to train (e.g. 15T): prints the steps, days and GPU-hours");
  app->add_option("--memory-headroom", f->memory_headroom,
                  "share of GPU memory left free on top of the per-GPU reserve (default 0.05)");
  app->add_option("--sp", f->sp, "sequence parallelism on|off");
  app->add_option("--recompute", f->recompute, "activation recompute none|selective|full");
  app->add_option("--recompute-modules", f->recompute_modules,
                  "Megatron's: what selective recompute reruns, any of core_attn (its "
                  "default), mla_up_proj, layernorm, mlp, moe, moe_act, shared_experts (implies "
                  "--recompute selective)");
  app->add_option("--dist-opt", f->dist_opt, "distributed optimizer on|off");
  app->add_option("--data-parallel-sharding-strategy", f->dp_sharding,
                  "Megatron's: no_shard (no distributed optimizer), optim (the distributed "
                  "optimizer), optim_grads (Megatron-FSDP ZeRO-2: gradients sharded too), "
                  "optim_grads_params (ZeRO-3: weights too, gathered per layer)");
  app->add_option("--precision", f->precision, "bf16|fp16|fp8|fp4|fp32 (default bf16; fp32 without a 16-bit peak, as on local-cpu)");
  app->add_option("--tp-comm-overlap", f->tp_overlap, "TE TP communication overlap on|off (default off)");
  app->add_option("--overlap-grad-reduce", f->grad_overlap, "overlap DP reduction with backward on|off (default on)");
  app->add_option("--overlap-param-gather", f->param_gather_overlap,
                  "Megatron's: on|off, the distributed optimizer's all-gather of the updated "
                  "parameters under the next step's first forward (default on; needs the "
                  "distributed optimizer and --overlap-grad-reduce, as Megatron asserts)");
  app->add_flag("--grad-reduce-in-bf16", f->grad_reduce_in_bf16,
                "Megatron's: keep the gradient buffers in bf16, so that micro-batches accumulate "
                "and DP reduces 2-byte gradients (default: fp32, --bf16's "
                "accumulate-allreduce-grads-in-fp32); needs bf16, fp8 or fp4");
  app->add_flag("--accumulate-allreduce-grads-in-fp32", f->accumulate_grads_in_fp32,
                "Megatron's: fp32 gradient buffers under --precision fp16 (whose gradients are "
                "fp16 without it); bf16 training has them already");
  app->add_flag("--use-precision-aware-optimizer", f->precision_aware_optimizer,
                "Megatron's: Transformer Engine's FusedAdam keeps the optimizer state in the "
                "dtypes below (needs the distributed optimizer; a bf16 model's fp32 masters take "
                "2 bytes: TE's param remainders)");
  for (size_t i = 0; i < OptimizerDtypeFields().size(); ++i) {
    const OptimizerDtypeField& d = OptimizerDtypeFields()[i];
    std::string choices;
    for (StateDtype c : d.allowed) choices += std::string(choices.empty() ? "" : "|") + ToString(c);
    app->add_option(d.flag, f->optimizer_dtypes[i],
                    std::string("Megatron's, with --use-precision-aware-optimizer: ") + d.what +
                        " in " + choices + " (default fp32)");
  }
  app->add_option("--cpu-offloading-num-layers", f->cpu_offload_layers,
                  "Megatron's CPU activation offloading: this many layers' activations go to "
                  "host memory in the forward and come back for the backward (pp 1, no "
                  "recompute; over the cluster's gpu host_bandwidth)");
  app->add_option("--ddp-bucket-size", f->ddp_bucket_size,
                  "parameters per gradient bucket with --overlap-grad-reduce (default Megatron's: "
                  "max(40M, 1M x DP x CP))");
  app->add_option("--moe-token-dispatcher-type", f->moe_dispatcher,
                  "Megatron's, MoE models: alltoall, or flex (DeepEP; HybridEP on rack-scale "
                  "NVLink: a token crosses the network once per remote NVLink domain holding its "
                  "experts). plan's default: flex where the EP group leaves the NVLink domain, "
                  "alltoall inside; simulate's: alltoall (allgather, Megatron's own default, is "
                  "not modelled)");
  app->add_option("--overlap-moe-expert-parallel-comm", f->moe_a2a_overlap,
                  "Megatron's, MoE models: on|off, run one micro-batch's forward with another's "
                  "backward so the all-to-alls hide under compute (ep > 1, vp when pp > 1, no "
                  "full recompute). plan's default: on wherever legal; simulate's: off");
  app->add_option("--cross-entropy-loss-fusion", f->ce_fusion,
                  "Megatron's: on|off, the loss over the vocabulary fused (plan's default: on, "
                  "with te, as Megatron-Bridge's recipes run it; simulate's: off, Megatron's)");
  app->add_option("--cross-entropy-fusion-impl", f->ce_impl,
                  "Megatron's: native (jit-fused PyTorch on fp32 logits, Megatron's default) or "
                  "te (Transformer Engine's kernel on the 16-bit logits, the gradient written "
                  "in place: half the bytes kept, a third of the traffic); turns the fusion on");
  app->add_flag("--allow-tp-across-nodes", f->allow_tp_across_nodes,
                "let TP groups span NVLink domains: nodes, or NVL72 racks (rejected by default)");
  app->add_flag("--json", f->json, "machine-readable output");
}

FlopUnit FlopUnitFor(double flops_per_s) {
  if (flops_per_s >= 1e12) return {1e12, "TFLOP/s"};
  if (flops_per_s >= 1e9) return {1e9, "GFLOP/s"};
  return {1e6, "MFLOP/s"};
}

Result<bool> ParseOnOff(const std::string& flag, const std::string& v) {
  if (v == "on" || v == "true" || v == "1") return true;
  if (v == "off" || v == "false" || v == "0") return false;
  return Status::Error(flag + " '" + v + "': expected on or off");
}

Result<ModelSpec> LoadModelByName(const std::string& spec) {
  if (spec.rfind("hf:", 0) == 0) return LoadModel(spec);
  PTDP_ASSIGN_OR_RETURN(const std::string file, ResolveConfig("models", spec));
  return LoadModel(file);
}

Result<World> LoadWorld(const std::string& cluster_path, const std::string& model_spec,
                        std::optional<int> nodes, std::optional<int> gpus,
                        std::optional<int> seq_len) {
  World w;
  PTDP_ASSIGN_OR_RETURN(const std::string cluster_file,
                        ResolveConfig("clusters", cluster_path));
  PTDP_ASSIGN_OR_RETURN(w.cluster, LoadClusterFile(cluster_file));
  if (nodes) {
    if (*nodes <= 0) return Status::Error("--nodes " + std::to_string(*nodes) + " must be positive");
    if (int64_t(*nodes) * w.cluster.gpus_per_node > kMaxClusterGpus)
      return Status::Error("--nodes " + std::to_string(*nodes) + " x " +
                           std::to_string(w.cluster.gpus_per_node) + " GPUs is above the " +
                           std::to_string(kMaxClusterGpus) + "-GPU limit");
    if (*nodes > 1 && w.cluster.inter.nics_per_node <= 0)
      return Status::Error("--nodes " + std::to_string(*nodes) + ": " + cluster_path +
                           " has no inter_node network");
    if (*nodes % w.cluster.nodes_per_nvlink_domain != 0)
      return Status::Error("--nodes " + std::to_string(*nodes) + ": " + cluster_path + " has " +
                           std::to_string(w.cluster.nodes_per_nvlink_domain) +
                           " nodes per NVLink domain; give a multiple of it");
    w.cluster.nodes = *nodes;
  }
  PTDP_ASSIGN_OR_RETURN(Topology topo, Topology::Build(w.cluster));
  w.topo = std::make_unique<Topology>(std::move(topo));
  PTDP_ASSIGN_OR_RETURN(w.model, LoadModelByName(model_spec));
  if (seq_len) {
    if (*seq_len <= 0) return Status::Error("--seq-len " + std::to_string(*seq_len) + " must be positive");
    w.model.seq_len = *seq_len;
    w.model.seq_len_note.clear();  // the flag's value, not the import's default
  }
  w.gpus = gpus ? *gpus : w.cluster.world();
  if (w.gpus <= 0 || w.gpus > w.cluster.world())
    return Status::Error("--gpus " + std::to_string(w.gpus) + ": " + cluster_path + " has " +
                         std::to_string(w.cluster.world()) + " GPUs (" +
                         std::to_string(w.cluster.nodes) + " nodes x " +
                         std::to_string(w.cluster.gpus_per_node) + "); use --nodes to grow it");
  PTDP_ASSIGN_OR_RETURN(AnalyticModel cost, AnalyticModel::Create(w.model, *w.topo));
  w.cost = std::make_unique<AnalyticModel>(std::move(cost));
  return w;
}

Result<World> WorldForPlan(const Plan& plan, const std::string& cluster_override) {
  World w;
  auto file = ResolveConfig("clusters",
                            cluster_override.empty() ? plan.cluster_file : cluster_override);
  if (!file.ok()) return file.status().Prefixed("cluster of the plan");
  auto c = LoadClusterFile(*file);
  if (!c.ok()) return c.status().Prefixed("cluster of the plan");
  w.cluster = *c;
  w.cluster.nodes = plan.nodes;
  PTDP_ASSIGN_OR_RETURN(Topology topo, Topology::Build(w.cluster));
  w.topo = std::make_unique<Topology>(std::move(topo));
  w.model = plan.model;
  w.gpus = plan.layout.world();
  PTDP_ASSIGN_OR_RETURN(AnalyticModel cost, AnalyticModel::Create(w.model, *w.topo));
  w.cost = std::make_unique<AnalyticModel>(std::move(cost));
  w.cost->set_memory_headroom(kDefaultMemoryHeadroom);
  return w;
}

namespace {

// --ddp-bucket-size: a positive parameter count (Megatron's flag), or unset (0: the default).
Result<int64_t> BucketSizeFlag(const LayoutFlags& f) {
  if (!f.ddp_bucket_size) return int64_t(0);
  if (*f.ddp_bucket_size <= 0)
    return Status::Error("--ddp-bucket-size " + std::to_string(*f.ddp_bucket_size) +
                         " must be a positive number of parameters");
  return *f.ddp_bucket_size;
}

// --cpu-offloading-num-layers: a positive layer count on a cluster whose GPUs state their host
// link (gpu host_bandwidth), or unset (0).
Result<int> OffloadFlag(const LayoutFlags& f, const ClusterSpec& c) {
  if (!f.cpu_offload_layers) return 0;
  const int n = *f.cpu_offload_layers;
  if (n <= 0)
    return Status::Error("--cpu-offloading-num-layers " + std::to_string(n) +
                         " must be a positive number of layers");
  if (c.gpu.host_bw_bytes_per_s <= 0)
    return Status::Error("--cpu-offloading-num-layers " + std::to_string(n) + ": cluster " +
                         c.file + " gives no gpu host_bandwidth (the GPU-to-host link the "
                         "activations cross)");
  return n;
}

// --recompute-modules as Layout::recompute_modules bits (0 when not given).
Result<uint8_t> RecomputeModulesFlag(const LayoutFlags& f) {
  if (f.recompute_modules.empty()) return uint8_t(0);
  std::string joined;
  for (const std::string& v : f.recompute_modules) joined += v + " ";
  auto m = ParseRecomputeModules(joined);
  if (!m.ok()) return m.status().Prefixed("--recompute-modules");
  return *m;
}

Status ApplyKnobs(const LayoutFlags& f, std::optional<bool>* sp, std::optional<bool>* dopt,
                  std::optional<Recompute>* rc, Precision* prec, bool* tpo, bool* gro,
                  bool* pgo, bool* p2p, std::optional<bool>* shard,
                  std::optional<bool>* zero3) {
  if (f.sp) { PTDP_ASSIGN_OR_RETURN(bool v, ParseOnOff("--sp", *f.sp)); *sp = v; }
  if (f.dist_opt) { PTDP_ASSIGN_OR_RETURN(bool v, ParseOnOff("--dist-opt", *f.dist_opt)); *dopt = v; }
  if (f.recompute) {
    auto r = ParseRecompute(*f.recompute);
    if (!r.ok()) return r.status().Prefixed("--recompute");
    *rc = *r;
  }
  if (!f.recompute_modules.empty()) {  // Megatron: with --recompute-granularity selective only
    if (rc->has_value() && **rc != Recompute::kSelective)
      return Status::Error("--recompute-modules needs --recompute selective, not --recompute " +
                           std::string(ToString(**rc)));
    *rc = Recompute::kSelective;
  }
  if (f.precision) {
    auto p = ParsePrecision(*f.precision);
    if (!p.ok()) return p.status().Prefixed("--precision");
    *prec = *p;
  }
  if (f.tp_overlap) { PTDP_ASSIGN_OR_RETURN(*tpo, ParseOnOff("--tp-comm-overlap", *f.tp_overlap)); }
  if (f.grad_overlap) { PTDP_ASSIGN_OR_RETURN(*gro, ParseOnOff("--overlap-grad-reduce", *f.grad_overlap)); }
  if (f.param_gather_overlap) {
    PTDP_ASSIGN_OR_RETURN(*pgo, ParseOnOff("--overlap-param-gather", *f.param_gather_overlap));
    if (*pgo && f.grad_overlap && !*gro)
      return Status::Error("--overlap-param-gather on needs --overlap-grad-reduce on (Megatron "
                           "asserts it), not off");
    if (*pgo && dopt->has_value() && !**dopt)
      return Status::Error("--overlap-param-gather on needs the distributed optimizer (Megatron "
                           "asserts it), not --dist-opt off");
  }
  if (f.p2p_overlap) {
    PTDP_ASSIGN_OR_RETURN(*p2p, ParseOnOff("--overlap-p2p-communication", *f.p2p_overlap));
  }
  if (f.dp_sharding) {
    const std::string& v = *f.dp_sharding;
    if (v != "no_shard" && v != "optim" && v != "optim_grads" && v != "optim_grads_params")
      return Status::Error("--data-parallel-sharding-strategy '" + v +
                           "' is not one of: no_shard, optim, optim_grads, optim_grads_params");
    const bool want_dopt = v != "no_shard";
    if (*dopt && **dopt != want_dopt)
      return Status::Error("--data-parallel-sharding-strategy " + v + " contradicts --dist-opt " +
                           (**dopt ? "on" : "off"));
    *dopt = want_dopt;
    *shard = v == "optim_grads" || v == "optim_grads_params";
    *zero3 = v == "optim_grads_params";
  }
  return Status::Ok();
}

// --ep / --etp values: positive, within the world limit, and only for a model with experts.
Status CheckExpertSizes(const LayoutFlags& f, const ModelSpec& m) {
  for (const auto& [flag, values] :
       {std::pair{"--expert-model-parallel-size", &f.ep},
        std::pair{"--expert-tensor-parallel-size", &f.etp}}) {
    for (int v : *values)
      if (v <= 0 || v > kMaxWorldSize)
        return Status::Error(std::string(flag) + " " + std::to_string(v) + " must be in 1.." +
                             std::to_string(kMaxWorldSize));
    if (!values->empty() && !m.moe() && (*values != std::vector<int>{1} || values == &f.etp))
      return Status::Error(std::string(flag) + ": " + m.name +
                           " has no experts (num_experts 0)");
  }
  return Status::Ok();
}

// --moe-token-dispatcher-type and --overlap-moe-expert-parallel-comm: each unset, or on/off
// (flex/alltoall), for a model with experts only.
struct MoeKnobs {
  std::optional<bool> flex, a2a_overlap;
};
Result<MoeKnobs> MoeKnobsFlag(const LayoutFlags& f, const ModelSpec& m) {
  MoeKnobs k;
  if (f.moe_dispatcher) {
    const std::string& v = *f.moe_dispatcher;
    if (v == "allgather")
      return Status::Error("--moe-token-dispatcher-type allgather: not modelled (ptdp times the "
                           "alltoall and flex dispatchers)");
    if (v != "alltoall" && v != "flex")
      return Status::Error("--moe-token-dispatcher-type '" + v + "': expected alltoall or flex");
    k.flex = v == "flex";
  }
  if (f.moe_a2a_overlap) {
    PTDP_ASSIGN_OR_RETURN(const bool v, ParseOnOff("--overlap-moe-expert-parallel-comm",
                                                   *f.moe_a2a_overlap));
    k.a2a_overlap = v;
  }
  for (const auto& [flag, given] : {std::pair{"--moe-token-dispatcher-type", bool(f.moe_dispatcher)},
                                    std::pair{"--overlap-moe-expert-parallel-comm",
                                              bool(f.moe_a2a_overlap)}})
    if (given && !m.moe())
      return Status::Error(std::string(flag) + ": " + m.name + " has no experts (num_experts 0)");
  return k;
}

// --cross-entropy-loss-fusion on|off and --cross-entropy-fusion-impl native|te: unset when
// neither is given; the impl alone turns the fusion on, as Megatron's default impl is native.
Result<std::optional<CrossEntropyFusion>> CrossEntropyFlags(const LayoutFlags& f) {
  std::optional<bool> fused;
  if (f.ce_fusion) {
    PTDP_ASSIGN_OR_RETURN(fused, ParseOnOff("--cross-entropy-loss-fusion", *f.ce_fusion));
  }
  if (f.ce_impl) {
    const Result<CrossEntropyFusion> impl = ParseCrossEntropyFusion(*f.ce_impl);
    if (!impl.ok() || *impl == CrossEntropyFusion::kNone)
      return Status::Error("--cross-entropy-fusion-impl '" + *f.ce_impl +
                           "': expected native or te");
    if (fused && !*fused)
      return Status::Error("--cross-entropy-fusion-impl " + *f.ce_impl +
                           " needs --cross-entropy-loss-fusion on, not off");
    return std::optional<CrossEntropyFusion>(*impl);
  }
  if (!fused) return std::optional<CrossEntropyFusion>();
  return std::optional<CrossEntropyFusion>(*fused ? CrossEntropyFusion::kNative
                                                  : CrossEntropyFusion::kNone);
}

// --use-precision-aware-optimizer and its dtype flags (Megatron's choices per flag).
Result<OptimizerState> OptimizerStateFlags(const LayoutFlags& f) {
  OptimizerState o;
  o.precision_aware = f.precision_aware_optimizer;
  for (size_t i = 0; i < OptimizerDtypeFields().size(); ++i) {
    const OptimizerDtypeField& d = OptimizerDtypeFields()[i];
    if (!f.optimizer_dtypes[i]) continue;
    PTDP_ASSIGN_OR_RETURN(o.*d.field, ParseStateDtype(d.flag, *f.optimizer_dtypes[i], d.allowed));
  }
  return o;
}

// The one value of a size flag `simulate` and `train` take.
Result<int> OneValue(const char* flag, const std::vector<int>& v, int fallback) {
  if (v.empty()) return fallback;
  if (v.size() > 1)
    return Status::Error(std::string(flag) + " takes one value here (lists are for `ptdp plan`)");
  return v[0];
}

}  // namespace

std::string Shortest(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

Status CheckHeadroom(double h) {
  if (!(h >= 0 && h < 1))
    return Status::Error("--memory-headroom " + Shortest(h) + " must be a fraction in [0, 1)");
  return Status::Ok();
}

Result<SearchSpace> SpaceFromFlags(const LayoutFlags& f, const World& w) {
  SearchSpace s;
  s.world = w.gpus;
  if (!f.global_batch) return Status::Error("--global-batch is required");
  s.global_batch = *f.global_batch;
  s.tp = f.tp; s.pp = f.pp; s.dp = f.dp; s.vp = f.vp; s.micro_batch = f.micro_batch; s.cp = f.cp;
  PTDP_RETURN_IF_ERROR(CheckExpertSizes(f, w.model));
  s.ep = f.ep;
  s.etp = f.etp;
  PTDP_ASSIGN_OR_RETURN(const MoeKnobs moe, MoeKnobsFlag(f, w.model));
  s.moe_flex_dispatcher = moe.flex;
  s.moe_a2a_overlap = moe.a2a_overlap;
  PTDP_ASSIGN_OR_RETURN(s.cross_entropy, CrossEntropyFlags(f));
  bool wide_tp = false;
  for (int tp : f.tp) wide_tp = wide_tp || tp > w.cluster.nvlink_domain_gpus();
  s.allow_tp_across_nodes = f.allow_tp_across_nodes || wide_tp;
  s.precision = w.cluster.gpu.DefaultPrecision();
  std::optional<bool> sp, dopt, shard, zero3;
  std::optional<Recompute> rc;
  PTDP_RETURN_IF_ERROR(ApplyKnobs(f, &sp, &dopt, &rc, &s.precision, &s.tp_comm_overlap,
                                  &s.overlap_grad_reduce, &s.overlap_param_gather, &s.overlap_p2p,
                                  &shard, &zero3));
  PTDP_ASSIGN_OR_RETURN(s.ddp_bucket_size, BucketSizeFlag(f));
  PTDP_ASSIGN_OR_RETURN(s.cpu_offload_layers, OffloadFlag(f, w.cluster));
  s.grad_reduce_in_bf16 = f.grad_reduce_in_bf16;
  s.accumulate_grads_in_fp32 = f.accumulate_grads_in_fp32;
  // The gradient buffer flags hold for every layout alike: refused once, as CheckLayout would.
  Layout grads;
  grads.precision = s.precision;
  grads.grad_reduce_in_bf16 = s.grad_reduce_in_bf16;
  grads.accumulate_grads_in_fp32 = s.accumulate_grads_in_fp32;
  if (GradReduceDtypeIllegal(grads))
    return Status::Error(ExplainRejection(Rejection::kGradReduceDtype, w.model, grads));
  // So are the optimizer's dtypes; they need the distributed optimizer, which the search then
  // keeps on (Megatron refuses them without it).
  PTDP_ASSIGN_OR_RETURN(grads.optimizer_state, OptimizerStateFlags(f));
  if (grads.optimizer_state.precision_aware) {
    if (dopt && !*dopt)
      return Status::Error("--use-precision-aware-optimizer needs the distributed optimizer, "
                           "not --dist-opt off");
    dopt = true;
  }
  grads.distributed_optimizer = true;
  grads.shard_gradients = shard.value_or(false);  // Megatron-FSDP, if asked for
  if (const std::string why = PrecisionAwareProblem(grads); !why.empty())
    return Status::Error(why);
  s.optimizer_state = grads.optimizer_state;
  s.sequence_parallel = sp;
  s.distributed_optimizer = dopt;
  s.shard_gradients = shard;
  s.shard_params = zero3;
  s.recompute = rc;
  PTDP_ASSIGN_OR_RETURN(s.recompute_modules, RecomputeModulesFlag(f));
  PTDP_ASSIGN_OR_RETURN(const bool split, ApplySplit(f.split, &s.split));
  if (split) s.split_search = SplitSearch::kFixed;
  s.memory_headroom = f.memory_headroom.value_or(kDefaultMemoryHeadroom);
  PTDP_RETURN_IF_ERROR(CheckHeadroom(s.memory_headroom));
  w.cost->set_memory_headroom(s.memory_headroom);
  s.runtime_layouts = w.cluster.intra.fabric == IntraFabric::kSharedMemory || !w.cluster.measured.empty();
  PTDP_RETURN_IF_ERROR(CheckSearchSpace(w.model, w.cluster, s));
  return s;
}

Result<Layout> LayoutFromFlags(const LayoutFlags& f, const World& w) {
  Layout l;
  if (!f.global_batch) return Status::Error("--global-batch is required");
  l.global_batch = *f.global_batch;
  PTDP_ASSIGN_OR_RETURN(l.tp, OneValue("--tp", f.tp, 1));
  PTDP_ASSIGN_OR_RETURN(l.pp, OneValue("--pp", f.pp, 1));
  PTDP_ASSIGN_OR_RETURN(l.cp, OneValue("--cp", f.cp, 1));
  PTDP_ASSIGN_OR_RETURN(l.vp, OneValue("--vp", f.vp, 1));
  PTDP_ASSIGN_OR_RETURN(l.micro_batch, OneValue("--micro-batch", f.micro_batch, 1));
  PTDP_RETURN_IF_ERROR(CheckExpertSizes(f, w.model));
  PTDP_ASSIGN_OR_RETURN(l.ep, OneValue("--expert-model-parallel-size", f.ep, 1));
  PTDP_ASSIGN_OR_RETURN(l.etp, OneValue("--expert-tensor-parallel-size", f.etp, 0));
  PTDP_ASSIGN_OR_RETURN(const MoeKnobs moe, MoeKnobsFlag(f, w.model));
  l.moe_flex_dispatcher = moe.flex.value_or(false);
  l.moe_a2a_overlap = moe.a2a_overlap.value_or(false);
  PTDP_ASSIGN_OR_RETURN(const std::optional<CrossEntropyFusion> ce, CrossEntropyFlags(f));
  l.cross_entropy = ce.value_or(CrossEntropyFusion::kNone);
  std::optional<int> dp_flag;
  if (!f.dp.empty()) {
    PTDP_ASSIGN_OR_RETURN(const int v, OneValue("--dp", f.dp, 1));
    dp_flag = v;
  }
  PTDP_RETURN_IF_ERROR(ApplySplit(f.split, &l).status());
  // A layout string sets vp (its stages / pp), as Megatron derives it.
  if (l.pipeline_layout && f.vp.empty() && l.pp > 0 && l.pipeline_layout->layers.size() % size_t(l.pp) == 0)
    l.vp = int(l.pipeline_layout->layers.size() / size_t(l.pp));
  if (l.tp <= 0 || l.pp <= 0 || l.cp <= 0 || l.vp <= 0 || l.micro_batch <= 0 || l.global_batch <= 0)
    return Status::Error("--tp, --pp, --cp, --vp, --micro-batch and --global-batch must be positive");
  if (l.global_batch > kMaxGlobalBatch)
    return Status::Error("--global-batch " + std::to_string(l.global_batch) + " must be at most " +
                         std::to_string(kMaxGlobalBatch));
  // In 64 bits: three flags up to INT_MAX could overflow an int product.
  const int64_t model_ranks = int64_t(l.tp) * l.pp * l.cp;
  if (model_ranks > kMaxWorldSize)
    return Status::Error("tp*cp*pp = " + std::to_string(model_ranks) + " is above the " +
                         std::to_string(kMaxWorldSize) + "-rank limit");
  if (dp_flag) {
    l.dp = *dp_flag;
  } else {
    if (w.gpus % model_ranks != 0)
      return Status::Error("tp*cp*pp = " + std::to_string(model_ranks) +
                           " does not divide the world size " + std::to_string(w.gpus));
    l.dp = int(w.gpus / model_ranks);
  }
  std::optional<bool> sp, dopt, shard, zero3;
  std::optional<Recompute> rc;
  l.precision = w.cluster.gpu.DefaultPrecision();
  PTDP_RETURN_IF_ERROR(ApplyKnobs(f, &sp, &dopt, &rc, &l.precision, &l.tp_comm_overlap,
                                  &l.overlap_grad_reduce, &l.overlap_param_gather, &l.overlap_p2p,
                                  &shard, &zero3));
  PTDP_ASSIGN_OR_RETURN(l.ddp_bucket_size, BucketSizeFlag(f));
  PTDP_ASSIGN_OR_RETURN(l.cpu_offload_layers, OffloadFlag(f, w.cluster));
  l.shard_gradients = shard.value_or(false);
  l.shard_params = zero3.value_or(false);
  l.grad_reduce_in_bf16 = f.grad_reduce_in_bf16;
  l.accumulate_grads_in_fp32 = f.accumulate_grads_in_fp32;
  PTDP_ASSIGN_OR_RETURN(l.optimizer_state, OptimizerStateFlags(f));
  const double headroom = f.memory_headroom.value_or(kDefaultMemoryHeadroom);
  PTDP_RETURN_IF_ERROR(CheckHeadroom(headroom));
  w.cost->set_memory_headroom(headroom);
  l.sequence_parallel = sp.value_or(false);
  l.distributed_optimizer = dopt.value_or(false);
  l.recompute = rc.value_or(Recompute::kNone);
  PTDP_ASSIGN_OR_RETURN(l.recompute_modules, RecomputeModulesFlag(f));
  l.schedule = l.vp > 1 ? ScheduleKind::kInterleaved : ScheduleKind::kOneFOneB;
  PTDP_RETURN_IF_ERROR(ValidateLayout(w.model, l, w.gpus, w.cluster.nvlink_domain_gpus(),
                                      f.allow_tp_across_nodes));
  if (w.cluster.gpu.PeakFlops(l.precision) <= 0)
    return Status::Error("--precision " + std::string(ToString(l.precision)) + ": GPU " +
                         w.cluster.gpu.name + " has no peak rate for it");
  return l;
}

Result<PlanResult> RunPlanner(const World& w, const SearchSpace& space, int top, int refine) {
  if (top <= 0 || top > 10000)
    return Status::Error("--top " + std::to_string(top) + " must be in 1..10000");
  if (refine < 0 || refine > 10000)
    return Status::Error("--refine " + std::to_string(refine) + " must be in 0..10000");
  PTDP_ASSIGN_OR_RETURN(PlanResult r,
                        SearchLayouts(*w.cost, w.model, w.cluster, space, std::max(top, refine)));
  PTDP_RETURN_IF_ERROR(RefineWithSimulator(*w.cost, refine, &r));
  if (int(r.top.size()) > top) r.top.resize(top);
  return r;
}

std::string DumpJson(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::json LayoutJson(const Layout& l, const ModelSpec& model) {
  nlohmann::json j = {{"tp", l.tp}, {"pp", l.pp}, {"dp", l.dp}, {"vp", l.vp}, {"cp", l.cp},
          {"micro_batch", l.micro_batch}, {"global_batch", l.global_batch},
          {"num_microbatches", l.num_microbatches()},
          {"sequence_parallel", l.sequence_parallel}, {"recompute", ToString(l.recompute)},
          {"recompute_modules", l.recompute == Recompute::kSelective
                                    ? RecomputeModulesString(l.recompute_modules)
                                    : std::string()},
          {"distributed_optimizer", l.distributed_optimizer},
          {"shard_gradients", l.shard_gradients}, {"shard_params", l.shard_params},
          {"cpu_offloading_num_layers", l.cpu_offload_layers},
          {"grad_reduce_in_bf16", l.grad_reduce_in_bf16},
          {"accumulate_allreduce_grads_in_fp32", l.accumulate_grads_in_fp32},
          {"use_precision_aware_optimizer", l.optimizer_state.precision_aware},
          {"precision", ToString(l.precision)}, {"schedule", ToString(l.schedule)},
          {"overlap_grad_reduce", l.overlap_grad_reduce},
          {"overlap_param_gather", l.overlap_param_gather}, {"tp_comm_overlap", l.tp_comm_overlap},
          {"overlap_p2p", l.overlap_p2p}, {"pipeline_split", l.SplitName()},
          {"ep", l.ep}, {"etp", l.expert_tp()}};
  if (l.first_stage_layers > 0) j["first_stage_layers"] = l.first_stage_layers;
  if (l.last_stage_layers > 0) j["last_stage_layers"] = l.last_stage_layers;
  if (l.embedding_in_split) j["embedding_in_split"] = true;
  if (l.loss_in_split) j["loss_in_split"] = true;
  if (l.pipeline_layout) j["pipeline_layout"] = l.pipeline_layout->text;
  for (const OptimizerDtypeField& d : OptimizerDtypeFields())
    j[d.key] = ToString(l.optimizer_state.*d.field);
  j["cross_entropy_fusion"] = ToString(l.cross_entropy);
  if (model.moe()) {  // plan.yaml's keys
    j["moe_flex_dispatcher"] = l.moe_flex_dispatcher;
    j["moe_a2a_overlap"] = l.moe_a2a_overlap;
  }
  if (CheckLayout(model, l) == Rejection::kOk) j["stage_layers"] = StageLayers(model, l);
  return j;
}

namespace {
nlohmann::json BreakdownJson(const Breakdown& b) {
  return {{"compute", b.compute_s}, {"tp_comm", b.tp_comm_s}, {"pp_comm", b.pp_comm_s},
          {"dp_comm", b.dp_comm_s}, {"bubble", b.bubble_s}, {"optimizer", b.optimizer_s}};
}
nlohmann::json MemoryJson(const MemoryBytes& m) {
  return {{"weights", m.weights}, {"grads", m.grads}, {"optimizer", m.optimizer},
          {"activations", m.activations}, {"other", m.other}, {"total", m.total},
          {"capacity", m.capacity}, {"usable", m.limit()}, {"host", m.host},
          {"host_usable", m.host_usable}};
}
}  // namespace

nlohmann::json PredictionJson(const Prediction& p) {
  return {{"step_time_s", p.step_time_s}, {"tflops_per_gpu", p.tflops_per_gpu},
          {"hw_tflops_per_gpu", p.hw_tflops_per_gpu}, {"mfu", p.mfu},
          {"bubble_fraction", p.bubble_fraction}, {"breakdown_s", BreakdownJson(p.breakdown)},
          {"memory_bytes", MemoryJson(p.memory)}, {"stage_memory_bytes", p.stage_memory_bytes},
          {"fits", p.fits}, {"source", p.source}};
}

nlohmann::json EstimateJson(const Layout& l, const ModelSpec& model, const Estimate& e) {
  const double tf = e.model_flops / e.step_time_s / l.world() / 1e12;
  const double hw = e.hw_flops / e.step_time_s / l.world() / 1e12;
  return {{"layout", LayoutJson(l, model)}, {"step_time_s", e.step_time_s}, {"tflops_per_gpu", tf},
          {"hw_tflops_per_gpu", hw}, {"mfu", e.mfu}, {"bubble_fraction", e.bubble_fraction},
          {"breakdown_s", BreakdownJson(e.breakdown)}, {"memory_bytes", MemoryJson(e.memory)},
          {"fits", e.fits}, {"source", "analytic"}};
}

std::string ModelSummary(const ModelSpec& m) {
  char buf[160];
  if (!ValidateModel(m, m.name).ok()) return m.name;  // counts of a shape that is not one
  std::snprintf(buf, sizeof buf, "%s (%.1fB parameters, %.1fB active per token), sequence %lld",
                m.name.c_str(), m.total_params() / 1e9, m.active_params() / 1e9,
                static_cast<long long>(m.seq_len));
  // An imported config's sequence is a default or the config's pre-training context: say which.
  return m.seq_len_note.empty() ? std::string(buf) : std::string(buf) + " (" + m.seq_len_note + ")";
}

void AddModelJson(const ModelSpec& m, nlohmann::json* j) {
  (*j)["model"] = m.name;
  if (!ValidateModel(m, m.name).ok()) return;
  (*j)["params_total"] = m.total_params();
  (*j)["params_active"] = m.active_params();
  (*j)["seq_len"] = m.seq_len;
  if (!m.seq_len_note.empty()) (*j)["seq_len_note"] = m.seq_len_note;
}

Result<double> ParseTokenCount(const std::string& text) {
  const std::string where = "--train-tokens '" + text + "'";
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return Status::Error(where + ": expected a number of tokens such as 15T, 300B or 2e12");
  }
  std::string unit = text.substr(used);
  double scale = 1;
  if (unit == "K" || unit == "k") scale = 1e3;
  else if (unit == "M") scale = 1e6;
  else if (unit == "B" || unit == "G") scale = 1e9;
  else if (unit == "T") scale = 1e12;
  else if (!unit.empty())
    return Status::Error(where + ": unknown suffix '" + unit + "' (K, M, B or G, T)");
  v *= scale;
  if (!std::isfinite(v) || v < 1 || v > 1e18)
    return Status::Error(where + ": must be between 1 and 1e18 tokens");
  return v;
}

TrainingTime TimeToTrain(const Layout& l, const ModelSpec& m, double step_s, double tokens) {
  TrainingTime t;
  t.tokens = tokens;
  const double per_step = double(l.global_batch) * m.seq_len;
  t.steps = std::ceil(tokens / per_step);
  t.seconds = t.steps * step_s;
  t.gpu_hours = t.seconds * l.world() / 3600;
  return t;
}

std::string TrainingLine(const TrainingTime& t, int gpus) {
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "training %.4g tokens: %.0f steps, %.1f days on %d GPUs, %.3g GPU-hours "
                "(no failures, restarts or checkpoints)\n",
                t.tokens, t.steps, t.seconds / 86400, gpus, t.gpu_hours);
  return buf;
}

nlohmann::json TrainingJson(const TrainingTime& t) {
  return {{"tokens", t.tokens}, {"steps", t.steps}, {"days", t.seconds / 86400},
          {"gpu_hours", t.gpu_hours}};
}

std::string MeasuredNote(const ClusterSpec& c) {
  const MeasuredPrimitives& m = c.measured;
  if (m.empty()) return "";
  return "cost model: " + m.backend + " primitives measured by `ptdp calibrate`" +
         (m.host.empty() ? "" : " on " + m.host) + (m.date.empty() ? "" : ", " + m.date) +
         "; layouts as ptdp's runtime runs them (fp32, no overlap)\n";
}

std::string Bar(double cells, int max_cells) {
  if (!(cells >= 0.5)) return "";  // also a NaN
  return std::string(size_t(std::min(cells + 0.5, double(max_cells))), '#');
}

std::string RenderPrediction(const Plan& plan) {
  const Prediction& p = plan.prediction;
  const Layout& l = plan.layout;
  std::ostringstream o;
  char buf[200];
  o << ModelSummary(plan.model) << "\non " << plan.cluster_name << ", " << l.world() << " GPUs: "
    << l.ShortName() << " [" << l.Knobs() << "], " << ToString(l.schedule) << ", "
    << ToString(l.precision) << ", B " << l.global_batch << ", m " << l.num_microbatches()
    << " micro-batches, pipeline split " << l.SplitName() << "\n\n";
  std::snprintf(buf, sizeof buf, "step time     %10.4f s   (%s)\n", p.step_time_s, p.source.c_str());
  o << buf;
  const FlopUnit u = FlopUnitFor(p.hw_tflops_per_gpu * 1e12);
  const double k = 1e12 / u.per_s;
  std::snprintf(buf, sizeof buf, "throughput    %10.1f %s per GPU (model), %.1f hardware, MFU %.1f%%\n",
                p.tflops_per_gpu * k, u.name, p.hw_tflops_per_gpu * k, 100 * p.mfu);
  o << buf;
  const double tok = double(l.global_batch) * plan.model.seq_len / p.step_time_s;
  std::snprintf(buf, sizeof buf, "tokens/s      %10.0f (%.0f per GPU)\n\n", tok, tok / l.world());
  o << buf << "breakdown (exposed time on the critical path):\n";
  const Breakdown& b = p.breakdown;
  const std::pair<const char*, double> parts[] = {
      {"compute", b.compute_s}, {"tp_comm", b.tp_comm_s}, {"pp_comm", b.pp_comm_s},
      {"dp_comm", b.dp_comm_s}, {"bubble", b.bubble_s}, {"optimizer", b.optimizer_s}};
  for (const auto& [name, v] : parts) {
    std::snprintf(buf, sizeof buf, "  %-10s %10.4f s %5.1f%%  %s\n", name, v,
                  100 * v / p.step_time_s, Bar(40 * v / p.step_time_s, 40).c_str());
    o << buf;
  }
  o << "\nmemory per GPU (most loaded stage):\n";
  const MemoryBytes& m = p.memory;
  const std::pair<const char*, double> mem[] = {
      {"weights", m.weights}, {"grads", m.grads}, {"optimizer", m.optimizer},
      {"activations", m.activations}, {"other", m.other}, {"total", m.total}};
  for (const auto& [name, v] : mem) {
    std::snprintf(buf, sizeof buf, "  %-12s %12s\n", name, FormatBytes(v).c_str());
    o << buf;
  }
  std::snprintf(buf, sizeof buf, "  %-12s %12s   usable %s (%.0f%% headroom) -> %s\n", "capacity",
                FormatBytes(m.capacity).c_str(), FormatBytes(m.limit()).c_str(),
                m.capacity > 0 ? 100 * (1 - m.limit() / m.capacity) : 0.0,
                p.memory.total <= m.limit() ? "fits" : "DOES NOT FIT");
  o << buf;
  if (m.host > 0) {  // CPU activation offloading
    std::snprintf(buf, sizeof buf, "  %-12s %12s   in host memory%s\n", "offloaded",
                  FormatBytes(m.host).c_str(),
                  m.host_usable > 0 ? (" of " + FormatBytes(m.host_usable) + " usable -> " +
                                       (m.host_fits() ? "fits" : "DOES NOT FIT"))
                                          .c_str()
                                    : " (the cluster states no gpu.host_memory)");
    o << buf;
  }
  o << "\nmemory per pipeline stage:\n";
  for (size_t r = 0; r < p.stage_memory_bytes.size(); ++r) {
    const double v = p.stage_memory_bytes[r];
    std::snprintf(buf, sizeof buf, "  stage %-3zu %12s  %5.1f%% |%s\n", r, FormatBytes(v).c_str(),
                  100 * v / m.capacity, Bar(30 * v / m.capacity, 45).c_str());  // up to 150%
    o << buf;
  }
  return o.str();
}

namespace {

// CPU seconds every process of the machine has used (user, system, irq and a hypervisor's steal
// time, /proc/stat); < 0 when unknown.
double MachineBusySeconds() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  in >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  if (!in || cpu != "cpu") return -1;
  return (user + nice + system + irq + softirq + steal) / double(sysconf(_SC_CLK_TCK));
}

// CPU seconds this process has used.
double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

}  // namespace

void OtherLoad::Start() {
  busy0_ = MachineBusySeconds();
  own0_ = ProcessCpuSeconds();
  t0_ = std::chrono::steady_clock::now();
}

double OtherLoad::Share() const {
  const double busy = MachineBusySeconds();
  if (busy0_ < 0 || busy < 0) return -1;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  const double others = (busy - busy0_) - (ProcessCpuSeconds() - own0_);
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  return std::clamp(others / std::max(1e-9, wall * cores), 0.0, 1.0);
}

// ---- Output files

namespace {

// "<what>: <the system's words for err>"; err is errno copied right after the failed call.


// CheckWritableFolder, with `where` opening the messages.
Status CheckFolder(const std::string& where, const std::string& dir) {
  std::error_code ec;
  if (std::filesystem::exists(dir, ec) && !std::filesystem::is_directory(dir, ec))
    return Status::Error(where + ": is not a folder");
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::Error(where + ": cannot create the folder: " + ec.message());
  std::string probe = dir + "/.ptdp-probe-XXXXXX";
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) {
    const int err = errno;
    return SysError(where + ": cannot create a file in the folder", err);
  }
  ::close(fd);
  if (::unlink(probe.c_str()) != 0) {
    const int err = errno;
    return SysError(where + ": cannot remove the probe file " + probe, err);
  }
  return Status::Ok();
}

}  // namespace

Status CheckWritableFolder(const std::string& flag, const std::string& dir) {
  return CheckFolder(flag + " " + dir, dir);
}

Status CheckWritableFile(const std::string& flag, const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return Status::Error(flag + " " + path + ": is a folder, not a file");
  return CheckFolder(flag + " " + path + ": the folder " + FolderOf(path), FolderOf(path));
}


}  // namespace ptdp::cli
