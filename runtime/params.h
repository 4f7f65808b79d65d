// The parameters of the runtime's GPT model (pre-LN decoder, learned positions, GeLU MLP,
// multi-head attention, final LN, input and output embeddings tied), their global shapes, how
// tensor parallelism shards them, and a layout-independent initialisation: every element of
// every parameter gets the same value whatever tp, pp, dp or vp, so runs in different layouts
// are comparable element by element.
//
// Weights are stored (out_features, in_features), row-major. TP shards (Megatron):
//   column-parallel (QKV, MLP in): rows split, rank k holds rows [k*out/t, (k+1)*out/t)
//   row-parallel (attention out, MLP out): columns split, rank k holds [k*in/t, (k+1)*in/t)
//   vocab-parallel embedding: rows [k*V_pad/t, (k+1)*V_pad/t) of the (V_pad, h) table
//   QKV (column-parallel, 3 blocks): the global rows are [Q; K; V] (GPT-2's c_attn), each block
//     h rows ordered (head, d); rank k holds the rows of its heads a/t*k .. a/t*(k+1)-1 in each
//     block, stacked [q_local; k_local; v_local], so its output rows are [q | k | v] over its
//     own heads, the layout Backend::AttentionForward reads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/model.h"
#include "core/status.h"

namespace ptdp::rt {

enum class ShardKind {
  kReplicated,  // every TP rank holds all of it (LN, row-parallel bias)
  kRows,        // split along dim 0 (column-parallel weight and bias, vocab-parallel embedding)
  kColumns,     // split along dim 1 (row-parallel weight)
  kQkvRows,     // dim 0 is 3 blocks [Q; K; V]; each block split along rows (QKV weight and bias)
};

enum class InitKind {
  kNormal,        // N(0, 0.02^2) (GPT-2, Megatron --init-method-std 0.02)
  kScaledNormal,  // N(0, (0.02 / sqrt(2 L))^2) for the outputs of attention and MLP (GPT-2)
  kZeros,         // biases, LN beta
  kOnes,          // LN gamma
};

struct ParamSpec {
  std::string name;            // "layers.3.attn.qkv.weight", "embedding.word", ...
  std::vector<int64_t> shape;  // global shape (padded vocabulary for the embedding)
  ShardKind shard = ShardKind::kReplicated;
  InitKind init = InitKind::kNormal;
  int layer = -1;              // transformer layer, -1 for embeddings and the final LN
  int64_t valid_rows = -1;     // rows that hold real values (the unpadded vocabulary); -1 all
  int model_layers = 1;        // L of the model, for kScaledNormal
  // A routed expert's weight (MoE layers): its index e < E. Experts live on the expert grid
  // (core/rank_grid.h): EP rank e / (E/ep) holds expert e, sharded over the expert-TP group
  // (etp, not t, is the shard degree of kRows / kColumns); -1 for every other parameter.
  int expert = -1;
};

// AdamW's decoupled weight decay applies to p: the 2-D weights but the position table (as
// Megatron: no decay on biases, norms and position embeddings).
inline bool DecaysWeight(const ParamSpec& p) {
  return p.shape.size() == 2 && p.name != "embedding.position";
}

// How many ways `p` is split: etp for a routed expert's weight, else t.
inline int ShardDegree(const ParamSpec& p, int tp, int etp) { return p.expert >= 0 ? etp : tp; }

// CheckGptShaped (core/model.h): the shape the runtime's GPT implements.

// All parameters of `m` at TP size `tp` (which fixes the vocabulary padding), in a fixed order:
// embeddings, then each layer's, then the final LN. Precondition: ValidateModel ok, a % tp == 0.
// An MoE layer (ModelSpec::is_moe_layer) has, instead of mlp.*, moe.router.weight (E, h,
// replicated), moe.shared.fc1/fc2.weight (the shared experts, f_s wide, column / row parallel
// over t) when f_s > 0, and moe.experts.<e>.fc1/fc2.weight (f_e wide) for every expert e; the
// MoE MLPs have no biases (Megatron's grouped GEMM refuses them).
std::vector<ParamSpec> GptParams(const ModelSpec& m, int tp);

// Shape held by TP rank `tp_rank` of `tp` (for an expert: by expert-TP rank of etp = `tp`).
std::vector<int64_t> LocalShape(const ParamSpec& p, int tp);

// The global row of `local_row` of TP rank `tp_rank`'s shard (identity when not row-split).
int64_t GlobalRow(const ParamSpec& p, int tp, int tp_rank, int64_t local_row);

// Fills `out` (LocalShape elements, row-major) with TP rank `tp_rank`'s shard of parameter `p`:
// element (i, j) of the global tensor gets InitValue(seed, p, i * cols + j), padded rows 0.
void InitShard(const ParamSpec& p, uint64_t seed, int tp, int tp_rank, float* out);

// The initial value of global element `index` of `p` (a counter-based generator keyed by the
// seed, the parameter's name and the index: independent of layout and of call order).
float InitValue(uint64_t seed, const ParamSpec& p, int64_t index);

}  // namespace ptdp::rt
