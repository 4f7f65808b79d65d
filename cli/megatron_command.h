// The Megatron-LM launch of a plan (`ptdp plan --emit megatron`, `ptdp simulate --emit
// megatron`): a shell script that starts exactly the plan's world with torchrun and runs
// pretrain_gpt.py with Megatron-LM's own flag names and value formats
// (megatron/training/arguments.py and the config dataclasses it turns into flags, NVIDIA/
// Megatron-LM d98e8a6, 2026-08-22; tests/data/megatron_flags.txt lists them and the tests keep
// every emitted flag in that list). What a plan cannot know (tokenizer, data, learning rate,
// the node's rank and the first node's address) are shell variables named in the script's
// leading comment block, checked before torchrun starts.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <string>

#include "core/model.h"
#include "core/plan.h"

namespace ptdp::cli {

struct MegatronOptions {
  // Tokens to train (--train-tokens): --train-iters is computed from them (whole steps of
  // global_batch x seq_len tokens); without them it is the placeholder ${TRAIN_ITERS}.
  std::optional<double> train_tokens;
};

// The script: comment block, placeholder checks, environment, torchrun line.
std::string MegatronCommand(const Plan& plan, const MegatronOptions& opt = {});

// torchrun's grid for `world` ranks on nodes of `gpus_per_node` GPUs: nproc_per_node x nnodes
// == world always. nproc_per_node is the largest divisor of the world that is at most
// gpus_per_node and needs at most `nodes` nodes, preferring one that keeps every TP group of
// `tp` consecutive ranks inside one NVLink domain (nproc_per_node x nodes_per_nvlink_domain a
// multiple of tp; on DGX nodes: nproc_per_node a multiple of tp).
struct TorchrunGrid {
  int nproc_per_node = 1, nnodes = 1;
  bool tp_crosses_nvlink = false;  // no such divisor: TP groups span NVLink domains
  bool too_few_nodes = false;      // no divisor fits in `nodes` nodes
};
TorchrunGrid ChooseTorchrunGrid(int world, int tp, int gpus_per_node, int nodes,
                                int nodes_per_nvlink_domain);

// Megatron's --moe-layer-freq as its Python list expression (1 = MoE layer), e.g.
// "([0]*3+[1]*58)" (DeepSeek-V3) or "([0,1]*24)" (Llama 4 Maverick); "" when every layer is
// MoE (Megatron's default 1).
std::string MoeLayerFreq(const ModelSpec& m);

// --emit on a command: the launchers ptdp writes ("megatron"); any other value is a usage error
// in one line listing them.
void AddEmitOption(CLI::App* app, std::string* emit);

}  // namespace ptdp::cli
