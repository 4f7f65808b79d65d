// The Megatron-LM command line of a plan (`ptdp plan --emit megatron`).
#include "cli/megatron_command.h"

#include <algorithm>
#include <sstream>

namespace ptdp::cli {

std::string MegatronCommand(const Plan& plan) {
  const Layout& l = plan.layout;
  const ModelSpec& m = plan.model;
  std::ostringstream o;
  const int nodes = (l.world() + plan.gpus_per_node - 1) / plan.gpus_per_node;
  o << "torchrun --nproc_per_node=" << std::min(plan.gpus_per_node, l.world())
    << " --nnodes=" << nodes << " pretrain_gpt.py \\\n"
    << "  --tensor-model-parallel-size " << l.tp << " \\\n"
    << "  --pipeline-model-parallel-size " << l.pp << " \\\n";
  // The pipeline split as Megatron-LM takes it (megatron/training/arguments.py): a layout
  // string sets vp itself; first/last counts need vp as virtual stages per rank.
  if (l.pipeline_layout) {
    o << "  --pipeline-model-parallel-layout '" << l.pipeline_layout->text << "' \\\n";
  } else {
    if (l.first_stage_layers > 0)
      o << "  --decoder-first-pipeline-num-layers " << l.first_stage_layers << " \\\n";
    if (l.last_stage_layers > 0)
      o << "  --decoder-last-pipeline-num-layers " << l.last_stage_layers << " \\\n";
    if (l.embedding_in_split) o << "  --account-for-embedding-in-pipeline-split \\\n";
    if (l.loss_in_split) o << "  --account-for-loss-in-pipeline-split \\\n";
    if (l.vp > 1 && l.uneven())
      o << "  --num-virtual-stages-per-pipeline-rank " << l.vp << " \\\n";
    else if (l.vp > 1)
      o << "  --num-layers-per-virtual-pipeline-stage " << m.layers / (l.pp * l.vp) << " \\\n";
  }
  if (l.vp > 1 && !l.overlap_p2p) o << "  --no-overlap-p2p-communication \\\n";
  if (l.cp > 1) o << "  --context-parallel-size " << l.cp << " \\\n";
  if (l.sequence_parallel) o << "  --sequence-parallel \\\n";
  if (l.recompute == Recompute::kSelective) o << "  --recompute-activations \\\n";
  if (l.recompute == Recompute::kFull)
    o << "  --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 \\\n";
  if (l.distributed_optimizer) o << "  --use-distributed-optimizer \\\n";
  if (l.shard_gradients)  // Megatron-FSDP v1 (with the distributed optimizer): ZeRO-2
    o << "  --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads \\\n";
  if (l.overlap_grad_reduce) o << "  --overlap-grad-reduce \\\n";
  if (l.overlap_grad_reduce && l.distributed_optimizer) o << "  --overlap-param-gather \\\n";
  if (l.tp_comm_overlap) o << "  --tp-comm-overlap \\\n";
  o << "  --num-layers " << m.layers << " --hidden-size " << m.hidden
    << " --num-attention-heads " << m.heads << " \\\n";
  if (m.kv_heads != m.heads)
    o << "  --group-query-attention --num-query-groups " << m.kv_heads << " \\\n";
  if (m.ffn_hidden != 4 * m.hidden) o << "  --ffn-hidden-size " << m.ffn_hidden << " \\\n";
  if (m.activation == Activation::kSwiglu) o << "  --swiglu \\\n";
  if (m.activation == Activation::kSquaredRelu) o << "  --squared-relu \\\n";
  if (m.norm == Norm::kRmsNorm) o << "  --normalization RMSNorm \\\n";
  if (m.position == PositionEmbedding::kRope) o << "  --position-embedding-type rope \\\n";
  if (m.position == PositionEmbedding::kAlibi)  // not silently a model with other positions
    o << "  `# ALiBi: Megatron-LM has no ALiBi position bias (BLOOM trained with Megatron-DeepSpeed); "
         "this command builds no position embedding in its place` \\\n"
      << "  --position-embedding-type none \\\n";
  if (!m.tied_embeddings) o << "  --untie-embeddings-and-output-weights \\\n";
  if (!m.bias) o << "  --disable-bias-linear \\\n";
  o << "  --seq-length " << m.seq_len << " --max-position-embeddings " << m.seq_len << " \\\n"
    << "  --micro-batch-size " << l.micro_batch << " --global-batch-size " << l.global_batch
    << " \\\n";
  if (l.precision == Precision::kBf16) o << "  --bf16";
  else if (l.precision == Precision::kFp16) o << "  --fp16";
  else if (l.precision == Precision::kFp8) o << "  --bf16 --fp8-format hybrid";
  // NVFP4 through Transformer Engine: TransformerConfig.fp4 ('e2m1', --fp4-format) and
  // fp4_recipe ('nvfp4' or 'custom', --fp4-recipe), megatron/core/transformer/
  // transformer_config.py of NVIDIA/Megatron-LM at d98e8a6 (2026-08-22); bf16 stays the
  // parameters' and activations' type.
  else if (l.precision == Precision::kFp4) o << "  --bf16 --fp4-format e2m1 --fp4-recipe nvfp4";
  o << "\n";
  return o.str();
}

}  // namespace ptdp::cli
