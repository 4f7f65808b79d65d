// The Megatron-LM launch script of a plan. Every flag and value format below is Megatron-LM's
// at NVIDIA/Megatron-LM d98e8a6 (2026-08-22): megatron/training/arguments.py (explicit
// add_argument calls, and the dataclass fields of TransformerConfig, TrainingConfig,
// SchedulerConfig, TokenizerConfig, ... that ArgumentGroupFactory turns into flags) and the
// checks of validate_args and TransformerConfig.__post_init__ that can be read without running
// it. tests/cli/megatron_command_test.cc keeps every flag in tests/data/megatron_flags.txt
// (scripts/megatron-flags.py).
#include "cli/megatron_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <vector>

namespace ptdp::cli {
namespace {

std::string Num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// One continuation line of the command: "  <flags> \".
class Lines {
 public:
  void Add(const std::string& flags) { lines_.push_back(flags); }
  std::string Join() const {
    std::string s;
    for (size_t i = 0; i < lines_.size(); ++i)
      s += "  " + lines_[i] + (i + 1 < lines_.size() ? " \\\n" : "\n");
    return s;
  }

 private:
  std::vector<std::string> lines_;
};

// `text` as comment lines of at most ~100 columns: the first opens with `first`, the others
// with "#   ".
std::string CommentLines(const std::string& first, const std::string& text) {
  std::string out, line = first;
  std::istringstream words(text);
  for (std::string w; words >> w;) {
    if (line.size() + 1 + w.size() > 99 && line.size() > 4) {
      out += line + "\n";
      line = "#   ";
    }
    line += (line.back() == ' ' ? "" : " ") + w;
  }
  return out + line + "\n";
}

// The placeholders the script reads, each with what to put in it.
struct Placeholder {
  const char* name;
  std::string what;
};

}  // namespace

TorchrunGrid ChooseTorchrunGrid(int world, int tp, int gpus_per_node, int nodes,
                                int nodes_per_nvlink_domain) {
  TorchrunGrid best, fallback, any;
  bool have_best = false, have_fallback = false, have_any = false;
  for (int n = std::min(world, std::max(1, gpus_per_node)); n >= 1; --n) {
    if (world % n != 0) continue;
    const int nn = world / n;
    if (!have_any) { any = {n, nn}; have_any = true; }  // the largest divisor
    if (nn > nodes) continue;
    if (!have_fallback) { fallback = {n, nn}; have_fallback = true; }
    if (int64_t(n) * std::max(1, nodes_per_nvlink_domain) % std::max(1, tp) == 0) {
      best = {n, nn};
      have_best = true;
      break;
    }
  }
  if (have_best) return best;
  if (have_fallback) {
    fallback.tp_crosses_nvlink = true;
    return fallback;
  }
  any.too_few_nodes = true;
  any.tp_crosses_nvlink =
      int64_t(any.nproc_per_node) * std::max(1, nodes_per_nvlink_domain) % std::max(1, tp) != 0;
  return any;
}

std::string MoeLayerFreq(const ModelSpec& m) {
  // A hybrid model places its MoE layers by its pattern (E).
  if (!m.moe() || m.hybrid() || m.moe_layers() == m.layers) return "";
  const int64_t first = std::min(m.moe_dense_layers_first, m.layers);
  const int64_t step = std::max<int64_t>(1, m.moe_layer_step);
  const int64_t periods = (m.layers - first) / step;
  const int64_t tail = (m.layers - first) % step;
  std::vector<std::string> parts;
  if (first > 0) parts.push_back("[0]*" + std::to_string(first));
  if (periods > 0) {
    if (step == 1) {
      parts.push_back("[1]*" + std::to_string(periods));
    } else {
      std::string period = "[";
      for (int64_t i = 0; i + 1 < step; ++i) period += "0,";
      parts.push_back(period + "1]*" + std::to_string(periods));
    }
  }
  if (tail > 0) parts.push_back("[0]*" + std::to_string(tail));
  std::string s = "(";
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? "+" : "") + parts[i];
  return s + ")";
}

std::string MegatronCommand(const Plan& plan, const MegatronOptions& opt) {
  const Layout& l = plan.layout;
  const ModelSpec& m = plan.model;
  const int world = l.world();
  const TorchrunGrid grid = ChooseTorchrunGrid(world, l.tp, plan.gpus_per_node, plan.nodes,
                                               plan.nodes_per_nvlink_domain);
  std::vector<std::string> warnings;  // "# WARNING:" lines of the header
  std::vector<Placeholder> fill;
  fill.push_back({"TOKENIZER_MODEL", "the tokenizer: a Hugging Face name or folder (HuggingFaceTokenizer)"});
  fill.push_back({"DATA_PATH", "data prefix(es) from tools/preprocess_data.py, without .bin/.idx"});
  int64_t train_iters = 0;
  if (opt.train_tokens && l.global_batch > 0 && m.seq_len > 0)
    train_iters = int64_t(std::ceil(*opt.train_tokens / (double(l.global_batch) * m.seq_len)));
  if (train_iters <= 0)
    fill.push_back({"TRAIN_ITERS", "optimizer steps of " + std::to_string(l.global_batch) +
                                       " sequences (ptdp computes it with --train-tokens)"});
  fill.push_back({"LR", "peak learning rate (e.g. 3e-4)"});
  fill.push_back({"MIN_LR", "final learning rate of the cosine decay, at most LR"});
  fill.push_back({"LR_WARMUP_ITERS", "warm-up steps (e.g. 2000)"});
  if (grid.nnodes > 1) {
    fill.push_back({"NODE_RANK", "this node's index, 0.." + std::to_string(grid.nnodes - 1) +
                                     " (the script runs once on each node)"});
    fill.push_back({"MASTER_ADDR", "node 0's address, the same on every node"});
  }

  // ---- pretrain_gpt.py's flags, in groups.
  Lines a;
  // Parallel sizes. Megatron derives dp = world / (tp pp cp) from torchrun's world size.
  a.Add("--tensor-model-parallel-size " + std::to_string(l.tp) +
        " --pipeline-model-parallel-size " + std::to_string(l.pp));
  if (l.cp > 1) a.Add("--context-parallel-size " + std::to_string(l.cp));
  if (m.moe())
    a.Add("--expert-model-parallel-size " + std::to_string(l.ep) +
          " --expert-tensor-parallel-size " + std::to_string(l.expert_tp()));
  // The pipeline split (validate_args): a layout string sets vp itself; first/last counts need
  // vp as virtual stages per rank; at most one of the three vp forms.
  if (l.pipeline_layout) {
    a.Add("--pipeline-model-parallel-layout '" + l.pipeline_layout->text + "'");
  } else {
    std::string s;
    if (l.first_stage_layers > 0)
      s += " --decoder-first-pipeline-num-layers " + std::to_string(l.first_stage_layers);
    if (l.last_stage_layers > 0)
      s += " --decoder-last-pipeline-num-layers " + std::to_string(l.last_stage_layers);
    if (l.embedding_in_split) s += " --account-for-embedding-in-pipeline-split";
    if (l.loss_in_split) s += " --account-for-loss-in-pipeline-split";
    if (l.vp > 1 && l.uneven())
      s += " --num-virtual-stages-per-pipeline-rank " + std::to_string(l.vp);
    else if (l.vp > 1)
      s += " --num-layers-per-virtual-pipeline-stage " + std::to_string(m.layers / (l.pp * l.vp));
    if (!s.empty()) a.Add(s.substr(1));
  }
  if (l.vp > 1 && !l.overlap_p2p) a.Add("--no-overlap-p2p-communication");
  // validate_args: "Tensor parallel communication/GEMM overlap can happen only when sequence
  // parallelism is enabled" (and SP is switched off at tp 1).
  if (l.sequence_parallel && l.tp > 1) a.Add(l.tp_comm_overlap ? "--sequence-parallel --tp-comm-overlap"
                                                               : "--sequence-parallel");
  else if (l.tp_comm_overlap)
    warnings.push_back("the plan asks for TP communication overlap without sequence "
                       "parallelism; Megatron-LM refuses --tp-comm-overlap without "
                       "--sequence-parallel, so it is left out");
  // --recompute-activations is selective recompute of core_attn; other modules by name.
  if (l.recompute == Recompute::kSelective && (l.recompute_modules & ~kRecomputeCoreAttn)) {
    std::string mods = RecomputeModulesString(l.recompute_modules);
    std::replace(mods.begin(), mods.end(), ',', ' ');
    a.Add("--recompute-granularity selective --recompute-modules " + mods);
  } else if (l.recompute == Recompute::kSelective) {
    a.Add("--recompute-activations");
  }
  if (l.recompute == Recompute::kFull)
    a.Add("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1");
  {
    std::string s;
    if (l.distributed_optimizer) s += " --use-distributed-optimizer";
    // Megatron-FSDP v1 (with the distributed optimizer): ZeRO-2. validate_args asserts
    // --ckpt-format fsdp_dtensor with it.
    if (l.shard_gradients)
      s += std::string(" --use-megatron-fsdp --data-parallel-sharding-strategy ") +
           (l.shard_params ? "optim_grads_params" : "optim_grads") + " --ckpt-format fsdp_dtensor";
    if (l.overlap_grad_reduce) s += " --overlap-grad-reduce";
    // arguments.py turns cpu_offloading on with a layer count (it has no flag of its own).
    if (l.cpu_offload_layers > 0)
      s += " --cpu-offloading-num-layers " + std::to_string(l.cpu_offload_layers);
    if (l.overlap_grad_reduce && l.ddp_bucket_size > 0)
      s += " --ddp-bucket-size " + std::to_string(l.ddp_bucket_size);
    // validate_args: --overlap-param-gather needs the distributed optimizer and
    // --overlap-grad-reduce.
    if (l.param_gather_overlapped()) s += " --overlap-param-gather";
    if (!s.empty()) a.Add(s.substr(1));
  }

  // Model shape. --ffn-hidden-size always: Megatron's default is 4h, or 8h/3 rounded down to
  // a multiple of 64 with --swiglu.
  a.Add("--num-layers " + std::to_string(m.layers) + " --hidden-size " + std::to_string(m.hidden) +
        " --ffn-hidden-size " + std::to_string(m.ffn_hidden) + " --num-attention-heads " +
        std::to_string(m.heads));
  // A hybrid model (pretrain_hybrid.py): its pattern (arguments.py derives --num-layers from
  // it; the same count here) and the Mamba-2 mixer's sizes (TransformerConfig's mamba_* fields).
  if (m.hybrid()) {
    // The unified form: the MTP depths after '/' (arguments.py infers --mtp-num-layers).
    a.Add("--hybrid-layer-pattern '" + m.unified_hybrid_pattern() + "'");
    if (m.mamba_num_heads > 0)
      a.Add("--mamba-num-heads " + std::to_string(m.mamba_num_heads) + " --mamba-head-dim " +
            std::to_string(m.mamba_head_dim) + " --mamba-num-groups " +
            std::to_string(m.mamba_num_groups) + " --mamba-state-dim " +
            std::to_string(m.mamba_state_dim));
  }
  // Multi-latent attention excludes --group-query-attention (validate_args).
  if (m.kv_heads != m.heads && !m.mla())
    a.Add("--group-query-attention --num-query-groups " + std::to_string(m.kv_heads));
  if (m.kv_channels > 0) a.Add("--kv-channels " + std::to_string(m.kv_channels));
  a.Add("--seq-length " + std::to_string(m.seq_len) + " --max-position-embeddings " +
        std::to_string(m.seq_len));
  switch (m.position) {
    case PositionEmbedding::kLearned:
      a.Add("--position-embedding-type learned_absolute");
      break;
    case PositionEmbedding::kRope: {
      // --rotary-base is type=int in arguments.py.
      const double base = std::round(m.rotary_base);
      if (base != m.rotary_base)
        warnings.push_back("rotary base " + Num(m.rotary_base) +
                           " is not a whole number; Megatron-LM's --rotary-base takes an "
                           "integer: " + Num(base));
      char buf[48];
      std::snprintf(buf, sizeof buf, "%.0f", base);
      std::string s = "--position-embedding-type rope --rotary-base " + std::string(buf);
      if (m.rotary_percent != 1.0) s += " --rotary-percent " + Num(m.rotary_percent);
      a.Add(s);
      break;
    }
    case PositionEmbedding::kAlibi:  // not silently a model with other positions
      warnings.push_back("ALiBi: Megatron-LM has no ALiBi position bias (BLOOM trained with "
                         "Megatron-DeepSpeed); this command builds no position embedding in its "
                         "place (--position-embedding-type none)");
      a.Add("--position-embedding-type none");
      break;
    case PositionEmbedding::kNone:
      a.Add("--position-embedding-type none");
      break;
  }
  {
    std::string s;
    if (m.norm == Norm::kRmsNorm) s += " --normalization RMSNorm";
    switch (m.activation) {
      case Activation::kGelu: break;  // Megatron's default
      case Activation::kSwiglu: s += " --swiglu"; break;
      case Activation::kSquaredRelu:
        s += " --squared-relu";
        // The GeLU bias fusion (on with biases) takes gelu, swiglu or quick_geglu only
        // (TransformerConfig.__post_init__).
        if (m.bias) s += " --no-bias-gelu-fusion";
        break;
      case Activation::kGeglu:
        // Megatron-LM has no flag for an exact-GeLU gated unit (gated_linear_unit and
        // activation_func are set from Python only); --quick-geglu is the same gated MLP with
        // GeLU's sigmoid approximation x * sigmoid(1.702 x).
        s += " --quick-geglu";
        warnings.push_back("GeGLU: Megatron-LM has no flag for an exact-GeLU gated MLP; "
                           "--quick-geglu builds the same weights and FLOPs with quick GeLU "
                           "x*sigmoid(1.702x) in place of GeLU");
        break;
    }
    if (!m.bias) s += " --disable-bias-linear";
    if (!m.tied_embeddings) s += " --untie-embeddings-and-output-weights";
    if (!s.empty()) a.Add(s.substr(1));
    if (!m.dropout) a.Add("--attention-dropout 0 --hidden-dropout 0");  // Megatron's default 0.1
  }
  if (m.sliding_window > 0) {
    // TE's (left, right) window: a query sees itself and the sliding_window - 1 keys before it
    // (gpt-oss: 128 -> 127,0). Layer n (1-based) attends globally when n % G == 0.
    std::string s = "--window-size " + std::to_string(m.sliding_window - 1) + ",0";
    if (m.global_attention_every > 0)
      s += " --window-attn-skip-freq " + std::to_string(m.global_attention_every);
    a.Add(s);
  }
  if (m.parallel_attn_mlp)
    warnings.push_back("this model adds attention and MLP in parallel into one residual "
                       "(GPT-J, GPT-NeoX, Falcon); Megatron-Core has no parallel block: the "
                       "command builds the sequential block of the same weights and FLOPs");
  if (m.moe()) {
    a.Add("--num-experts " + std::to_string(m.num_experts) + " --moe-router-topk " +
          std::to_string(m.moe_topk) + " --moe-ffn-hidden-size " + std::to_string(m.moe_ffn_hidden));
    if (m.moe_shared_ffn_hidden > 0)  // all shared experts together
      a.Add("--moe-shared-expert-intermediate-size " + std::to_string(m.moe_shared_ffn_hidden));
    if (m.moe_latent_size > 0) a.Add("--moe-latent-size " + std::to_string(m.moe_latent_size));
    // An integer N puts MoE on layers 0, N, 2N, ...: a list says which layers exactly.
    const std::string freq = MoeLayerFreq(m);
    if (!freq.empty()) a.Add("--moe-layer-freq '" + freq + "'");
    // fp32 routing: TransformerConfig warns about many experts without it.
    // The flex dispatcher: DeepEP, or HybridEP on rack-scale NVLink (Megatron-Bridge's
    // DeepSeek-V3 presets: moe_flex_dispatcher_backend deepep on H100, hybridep on GB200/GB300).
    const bool blackwell = plan.nodes_per_nvlink_domain > 1;
    std::string s = l.moe_flex_dispatcher
                        ? std::string("--moe-grouped-gemm --moe-token-dispatcher-type flex "
                                      "--moe-flex-dispatcher-backend ") +
                              (blackwell ? "hybridep" : "deepep") + " --moe-router-dtype fp32"
                        : "--moe-grouped-gemm --moe-token-dispatcher-type alltoall --moe-router-dtype fp32";
    if (l.moe_a2a_overlap) s += " --overlap-moe-expert-parallel-comm";
    if (m.moe_router == MoeRouter::kSigmoid) s += " --moe-router-score-function sigmoid";
    a.Add(s);
    switch (m.moe_routing) {
      case MoeRouting::kDropless:
        a.Add(m.moe_aux_loss_coeff > 0
                  ? "--moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff " +
                        Num(m.moe_aux_loss_coeff)
                  : std::string("--moe-router-load-balancing-type none"));
        break;
      case MoeRouting::kBalanced:  // the benchmark setting: exactly T k / E tokens per expert
        a.Add("--moe-router-force-load-balancing");
        break;
      case MoeRouting::kCapacity:  // capacity works with aux_loss (TransformerConfig)
        a.Add("--moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff " +
              Num(m.moe_aux_loss_coeff) + " --moe-expert-capacity-factor " +
              Num(m.moe_capacity_factor) +
              " --moe-pad-expert-input-to-capacity");
        break;
    }
  }
  if (m.mla()) {
    std::string s = "--multi-latent-attention";
    if (m.q_lora_rank > 0) s += " --q-lora-rank " + std::to_string(m.q_lora_rank);  // else none
    s += " --kv-lora-rank " + std::to_string(m.kv_lora_rank) + " --qk-head-dim " +
         std::to_string(m.qk_head_dim) + " --qk-pos-emb-head-dim " +
         std::to_string(m.qk_pos_head_dim) + " --v-head-dim " + std::to_string(m.v_head_dim);
    a.Add(s);
    // The latent norms (q_layernorm, kv_layernorm of the MLA spec); plain RoPE as the model
    // has it (MLA's default rope type is YaRN), and MLA fuses only YaRN RoPE.
    a.Add("--qk-layernorm --rope-type rope --no-rope-fusion");
  }
  if (m.mtp_layers > 0)
    a.Add("--mtp-num-layers " + std::to_string(m.mtp_layers) +
          (m.mtp_repeated ? " --mtp-use-repeated-layer" : ""));

  a.Add("--micro-batch-size " + std::to_string(l.micro_batch) + " --global-batch-size " +
        std::to_string(l.global_batch));
  switch (l.precision) {
    case Precision::kBf16: a.Add("--bf16"); break;
    case Precision::kFp16: a.Add("--fp16"); break;
    case Precision::kFp8: {
      // transformer_config.py: delayed scaling (the default recipe) refuses moe_act and
      // layernorm recompute; per-tensor current scaling takes them.
      std::string s = "--bf16 --fp8-format hybrid";
      if (l.RecomputedModules() & (kRecomputeMoeAct | kRecomputeLayernorm)) {
        s += " --fp8-recipe tensorwise";
        warnings.push_back("moe_act / layernorm recompute with fp8: Megatron refuses them "
                           "with delayed scaling, so the command asks for --fp8-recipe "
                           "tensorwise (Transformer Engine >= 2.6)");
      }
      a.Add(s);
      break;
    }
    // NVFP4 through Transformer Engine: TransformerConfig.fp4 ('e2m1', --fp4-format) and
    // fp4_recipe ('nvfp4' or 'custom', --fp4-recipe); bf16 stays the parameters' and
    // activations' type.
    case Precision::kFp4: a.Add("--bf16 --fp4-format e2m1 --fp4-recipe nvfp4"); break;
    case Precision::kFp32: break;  // Megatron's default
  }
  // bf16 gradient buffers (accumulated and reduced in bf16): read under --bf16 only, which
  // every precision CheckLayout lets it take emits.
  if (l.grad_reduce_in_bf16) a.Add("--grad-reduce-in-bf16");
  if (l.accumulate_grads_in_fp32) a.Add("--accumulate-allreduce-grads-in-fp32");
  if (l.optimizer_state.precision_aware) {
    std::string o = "--use-precision-aware-optimizer";
    for (const OptimizerDtypeField& f : OptimizerDtypeFields())
      if (const StateDtype d = l.optimizer_state.*f.field; d != StateDtype::kFp32)
        o += std::string(" ") + f.flag + " " + ToString(d);
    a.Add(o);
  }
  // The loss over the vocabulary (TE's kernel: Megatron-Bridge's performance recipes).
  if (l.cross_entropy != CrossEntropyFusion::kNone)
    a.Add(std::string("--cross-entropy-loss-fusion --cross-entropy-fusion-impl ") +
          ToString(l.cross_entropy));
  // What the plan cannot know: placeholders.
  a.Add("--tokenizer-type HuggingFaceTokenizer --tokenizer-model ${TOKENIZER_MODEL}");
  a.Add("--data-path ${DATA_PATH}");
  a.Add("--train-iters " + (train_iters > 0 ? std::to_string(train_iters) : "${TRAIN_ITERS}"));
  a.Add("--lr ${LR} --min-lr ${MIN_LR} --lr-decay-style cosine --lr-warmup-iters ${LR_WARMUP_ITERS}");

  // ---- The script. Hybrid models train with pretrain_hybrid.py (its HybridModel builder).
  const char* script = m.hybrid() ? "pretrain_hybrid.py" : "pretrain_gpt.py";
  std::ostringstream o;
  o << CommentLines("# Megatron-LM launch of a ptdp plan:",
                    m.name + " on " + plan.cluster_name + ", " + std::to_string(world) +
                        " GPUs as " + l.ShortName() + " [" + l.Knobs() + "].")
    << "# Run it from a Megatron-LM checkout (" << script << ")"
    << (grid.nnodes > 1 ? ", once on each of the " + std::to_string(grid.nnodes) + " nodes" : "")
    << ".\n# Fill in first: the command reads these shell variables and stops if one is unset.\n";
  for (const Placeholder& p : fill) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "#   %-16s ", p.name);
    o << buf << p.what << "\n";
  }
  if (grid.nnodes > 1) o << "#   MASTER_PORT      a free port on node 0 (default 6000)\n";
  if (train_iters > 0)
    o << "# --train-iters " << train_iters << ": " << Num(*opt.train_tokens) << " tokens in steps of "
      << l.global_batch << " sequences x " << m.seq_len << " tokens.\n";
  o << "# torchrun starts the plan's world, " << grid.nproc_per_node << " processes per node x "
    << grid.nnodes << (grid.nnodes > 1 ? " nodes" : " node") << " = " << world
    << " ranks\n# (per node: the largest divisor of the world within a node's " << plan.gpus_per_node
    << " GPUs that keeps each TP group\n# of " << l.tp << " ranks in one NVLink domain).\n";
  if (grid.tp_crosses_nvlink)
    warnings.push_back("no node size that divides the world keeps the TP groups of " +
                       std::to_string(l.tp) + " inside one NVLink domain: TP traffic crosses "
                       "the network");
  if (grid.too_few_nodes)
    warnings.push_back(std::to_string(world) + " ranks in equal nodes of at most " +
                       std::to_string(plan.gpus_per_node) + " GPUs need " +
                       std::to_string(grid.nnodes) + " nodes; the cluster has " +
                       std::to_string(plan.nodes));
  for (const std::string& w : warnings) o << CommentLines("# WARNING:", w);
  for (const Placeholder& p : fill)
    o << ": \"${" << p.name << ":?fill in " << p.name << " (see above)}\"\n";
  if (l.shard_gradients)
    o << "unset CUDA_DEVICE_MAX_CONNECTIONS  # Megatron-FSDP refuses 1\n";
  else if (l.tp > 1 || l.cp > 1)
    o << "export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron-LM asserts it with TP or CP on GPUs "
         "before Blackwell\n";
  o << "torchrun --nproc_per_node=" << grid.nproc_per_node << " --nnodes=" << grid.nnodes;
  if (grid.nnodes > 1)
    o << " --node_rank=${NODE_RANK} --master_addr=${MASTER_ADDR} --master_port=${MASTER_PORT:-6000}";
  o << " " << script << " \\\n" << a.Join();
  return o.str();
}

void AddEmitOption(CLI::App* app, std::string* emit) {
  app->add_option("--emit", *emit,
                  "print the launch command of the plan: megatron (the only one; with --json, "
                  "the field megatron_command)")
      ->check(CLI::Validator(
          [](std::string& v) {
            return v == "megatron" ? std::string()
                                   : "'" + v + "' is not a launcher ptdp writes; expected: megatron";
          },
          "megatron", "launcher"));
}

}  // namespace ptdp::cli
