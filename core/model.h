// ModelSpec: the shape of a GPT-style decoder (GPT-2/3, Megatron, Llama, Mistral), read from a
// model YAML file or imported from a Hugging Face config.json, and the counts derived from it.
// Letters used in comments: L layers, h hidden, a heads, k kv heads, f ffn hidden, s sequence,
// V vocabulary, t tensor-parallel size.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/limits.h"
#include "core/status.h"

namespace YAML { class Node; }

namespace ptdp {

// Gated units (SwiGLU: SiLU gate, GeGLU: GeLU gate, Gemma) have three MLP matrices.
enum class Activation { kGelu, kSwiglu, kSquaredRelu, kGeglu };
// The Mixture-of-Experts router's score function (Megatron --moe-router-score-function).
enum class MoeRouter { kSoftmax, kSigmoid };
// How the router's choices are balanced over the experts, which sets how long the slowest
// expert rank waits (docs/cost-model.md): dropless (Megatron's default: every token goes to its
// top-k, the most loaded expert sets the pace), force-balanced (--moe-router-force-load-balancing,
// the benchmark setting: exactly T k / E tokens each), capacity (--moe-expert-capacity-factor
// C with --moe-pad-expert-input-to-capacity: every expert computes C T k / E tokens).
enum class MoeRouting { kDropless, kBalanced, kCapacity };
enum class Norm { kLayerNorm, kRmsNorm };
// Learned absolute positions (GPT: s*h parameters), rotary (Llama), ALiBi's per-head linear
// bias (BLOOM: no parameters, no rotary kernel; flash attention applies it in the kernel), or
// none (Megatron --position-embedding-type none: Nemotron-H's attention layers, NoPE).
enum class PositionEmbedding { kLearned, kRope, kAlibi, kNone };

// The kinds of layer a model is built from. A transformer layer: attention and a dense MLP
// (kDense) or an MoE MLP (kMoe). A hybrid model's layers (Megatron-Core's hybrid stack,
// --hybrid-layer-pattern; megatron/core/models/hybrid/hybrid_layer_allocation.py) are one
// block each, with its pre-norm and residual: a Mamba-2 mixer (symbol M), self-attention (*),
// a dense MLP (-) or an MoE MLP (E).
enum class LayerKind : uint8_t { kDense, kMoe, kMamba, kAttention, kMlp, kMoeMlp };
inline constexpr int kLayerKinds = 6;
const char* ToString(LayerKind k);
// Whether a layer of kind k has attention, an MoE MLP, a Mamba mixer.
inline bool HasAttention(LayerKind k) {
  return k == LayerKind::kDense || k == LayerKind::kMoe || k == LayerKind::kAttention;
}
inline bool HasMoe(LayerKind k) { return k == LayerKind::kMoe || k == LayerKind::kMoeMlp; }

// Layers of each kind in a range of layers (fractional for an average pipeline chunk).
struct LayerCounts {
  std::array<double, kLayerKinds> n{};
  double& operator[](LayerKind k) { return n[size_t(k)]; }
  double operator[](LayerKind k) const { return n[size_t(k)]; }
  double total() const;
  double moe() const { return (*this)[LayerKind::kMoe] + (*this)[LayerKind::kMoeMlp]; }
  double attention() const;  // layers with attention
  LayerCounts Scaled(double f) const;
};

const char* ToString(Activation a);
const char* ToString(Norm n);
const char* ToString(PositionEmbedding p);
const char* ToString(MoeRouter r);
const char* ToString(MoeRouting r);

struct ModelSpec {
  std::string name = "model";      // free text shown in tables
  int64_t layers = 0;              // L, transformer layers
  int64_t hidden = 0;              // h
  int64_t heads = 0;               // a, attention heads
  int64_t kv_heads = 0;            // k, key/value heads (GQA); == a for multi-head attention
  int64_t ffn_hidden = 0;          // f, MLP inner size (4h for GPT)
  int64_t seq_len = 0;             // s, training sequence length
  // How an import chose seq_len when the config states no training length ("default for an
  // imported config; max_position_embeddings 131072 is the context limit, not the training
  // length; --seq-len sets it"); empty for YAML models and after --seq-len. Not written to YAML.
  std::string seq_len_note;
  int64_t vocab = 0;               // V, unpadded vocabulary
  Activation activation = Activation::kGelu;  // swiglu has three MLP matrices
  Norm norm = Norm::kLayerNorm;
  PositionEmbedding position = PositionEmbedding::kLearned;  // learned adds s*h parameters
  bool tied_embeddings = true;     // output layer shares the input embedding
  bool bias = true;                // linear layers carry biases (GPT yes, Llama no)
  // Hidden and attention dropout in training (Megatron's default 0.1: a 1-byte mask per element
  // is kept after attention and after the MLP); Llama-style recipes train with none.
  bool dropout = true;
  // Explicit attention head size (Megatron --kv-channels; HF head_dim), 0: h / a. Gemma, Qwen3,
  // Llama 4 and Mistral variants set it apart from h / a.
  int64_t kv_channels = 0;
  double rotary_base = 10000;     // RoPE theta (Megatron --rotary-base)
  double rotary_percent = 1.0;    // share of the head dim rotated (GPT-NeoX rotary_pct)
  // Attention and MLP read the same normalised input and add into one residual (GPT-J,
  // GPT-NeoX use_parallel_residual, Falcon parallel_attn): the same weights and FLOPs, one
  // residual add fewer; Megatron-Core has no such block (the emitted command says so).
  bool parallel_attn_mlp = false;
  // Sliding-window attention (Mistral v0.1, Gemma 2/3, Phi-3, GPT-OSS): windowed layers attend
  // over the last `sliding_window` keys only; 0: none. With global_attention_every G > 0,
  // every G-th layer (layers G-1, 2G-1, ...) attends globally (Gemma 2: 2, Gemma 3: 6);
  // 0: every layer is windowed. Weights are unchanged; attention work shrinks to the window.
  int64_t sliding_window = 0;
  int64_t global_attention_every = 0;
  // Windowed layers among all layers, and the mean keys a query attends over in a layer of
  // sequence s (full causal attention: s; a window w < s: about w). Cost models use it.
  int64_t windowed_layers() const;

  // Mixture of Experts (0 experts: dense). Layer i (0-based) has an MoE MLP when i >=
  // moe_dense_layers_first and (i - moe_dense_layers_first) % moe_layer_step == moe_layer_step-1
  // (DeepSeek's first_k_dense_replace; Llama 4's interleave_moe_layer_step); the other layers
  // have the dense MLP of ffn_hidden.
  int64_t num_experts = 0;             // E routed experts (Megatron --num-experts)
  int64_t moe_topk = 0;                // k experts per token (--moe-router-topk)
  int64_t moe_ffn_hidden = 0;          // f_e, one expert's MLP width (--moe-ffn-hidden-size)
  int64_t moe_shared_ffn_hidden = 0;   // f_s, all shared experts together
                                       // (--moe-shared-expert-intermediate-size); 0: none
  int64_t moe_dense_layers_first = 0;
  int64_t moe_layer_step = 1;
  MoeRouter moe_router = MoeRouter::kSoftmax;
  MoeRouting moe_routing = MoeRouting::kDropless;
  double moe_capacity_factor = 0;      // with kCapacity
  // The load-balancing loss's weight (--moe-aux-loss-coeff with --moe-router-load-balancing-type
  // aux_loss; 0: none). 1e-2, what ptdp's Megatron command passes, unless the model says.
  double moe_aux_loss_coeff = 1e-2;
  // Multi-head latent attention (DeepSeek-V2/V3, Kimi K2; --multi-latent-attention) when
  // kv_lora_rank > 0: queries through a rank-q_lora_rank bottleneck (0: a full projection),
  // keys and values through a shared kv_lora_rank latent; each head's query/key is
  // qk_head_dim (no position) + qk_pos_head_dim (rotary, one key head shared), its value
  // v_head_dim.
  int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_head_dim = 0, qk_pos_head_dim = 0,
          v_head_dim = 0;
  // Multi-token prediction layers (DeepSeek-V3: 1) on the last pipeline stage: a transformer
  // layer each plus a 2h x h projection and two norms, sharing the embedding and output layer
  // (--mtp-num-layers). Not in total_params() (DeepSeek counts 671B without its 14B MTP).
  int64_t mtp_layers = 0;
  // A hybrid model's MTP depths are blocks of their own pattern (Megatron's unified
  // --hybrid-layer-pattern "MAIN/DEPTH/DEPTH...", hybrid_layer_allocation.parse_hybrid_pattern:
  // every depth the same symbols; Nemotron 3 Super "*E", attention then MoE): mtp_pattern is
  // one depth's symbols, mtp_layers the number of depths. Empty for a transformer, whose MTP
  // layer is one layer of its last layer's kind.
  std::string mtp_pattern;
  // One MTP depth's weights applied at every depth (Megatron --mtp-use-repeated-layer;
  // Nemotron 3 Super's recipes: 2 depths, one set of weights).
  bool mtp_repeated = false;
  // LatentMoE (Nemotron 3 Super and Ultra; Megatron --moe-latent-size, moe_layer.py): each MoE
  // layer projects its normalised input from h to moe_latent_size (fc1_latent_proj) before the
  // dispatch; the routed experts read and write that width, the combine returns it and
  // fc2_latent_proj projects it back to h. The router and the shared experts see h; the two
  // projections are replicated over TP (parallel_mode "duplicated"). 0: none.
  int64_t moe_latent_size = 0;
  // A hybrid model (Megatron-Core's HybridModel, pretrain_hybrid.py --hybrid-layer-pattern):
  // one symbol per layer, M a Mamba-2 mixer, * self-attention, - a dense MLP of ffn_hidden,
  // E an MoE MLP; layers is its length. Empty: a transformer (every layer attention + MLP,
  // MoE ones as moe_dense_layers_first and moe_layer_step say).
  std::string hybrid_pattern;
  // The Mamba-2 mixer (megatron/core/ssm/mamba_mixer.py; --mamba-state-dim, --mamba-head-dim,
  // --mamba-num-groups, --mamba-num-heads): mamba_num_heads heads of mamba_head_dim channels
  // (d_inner = heads x head_dim), B and C in mamba_num_groups groups of mamba_state_dim, a
  // 4-tap causal conv1d over x, B and C, the SSD scan in chunks of 128 tokens, a gated RMSNorm,
  // no linear biases. Set exactly when the pattern has an M.
  int64_t mamba_state_dim = 0, mamba_head_dim = 0, mamba_num_groups = 0, mamba_num_heads = 0;
  static constexpr int64_t kMambaConvKernel = 4;  // MambaMixer's d_conv
  static constexpr int64_t kMambaChunk = 128;     // MambaMixer's chunk_size

  bool moe() const { return num_experts > 0; }
  // The width the routed experts read and write, and the dispatch and combine carry: the
  // latent size with LatentMoE, else h.
  int64_t moe_width() const { return moe_latent_size > 0 ? moe_latent_size : hidden; }
  // One MoE layer's latent projections (h x latent each way, biases with `bias`); 0 without.
  int64_t latent_params() const;
  // One MTP depth's layers by kind (a hybrid model's mtp_pattern; a transformer's one layer of
  // its last layer's kind), and how many sets of MTP weights the model holds (1 when
  // repeated).
  LayerCounts mtp_layer_counts() const;
  int64_t mtp_weight_copies() const { return mtp_repeated ? 1 : mtp_layers; }
  // The pattern as Megatron's --hybrid-layer-pattern spells it: the main pattern, then "/" and
  // the MTP pattern once per depth.
  std::string unified_hybrid_pattern() const;
  bool hybrid() const { return !hybrid_pattern.empty(); }
  // The kind of layer i (0-based) and the counts of each kind among layers [first, first+n).
  LayerKind layer_kind(int64_t i) const;
  LayerCounts layer_counts(int64_t first, int64_t n) const;
  // Mamba-2 sizes: d_inner, the in_proj's outputs (z, x, B, C, dt: 2 d_inner + 2 g N +
  // heads) and the conv1d's channels (x, B, C: d_inner + 2 g N).
  int64_t mamba_inner() const { return mamba_num_heads * mamba_head_dim; }
  int64_t mamba_in_proj() const {
    return 2 * mamba_inner() + 2 * mamba_num_groups * mamba_state_dim + mamba_num_heads;
  }
  int64_t mamba_conv_channels() const { return mamba_inner() + 2 * mamba_num_groups * mamba_state_dim; }
  // One Mamba layer's weights (its pre-norm, in_proj, conv1d with bias, A, D, dt bias, the
  // gated norm, out_proj) and its linear weights alone (in_proj and out_proj).
  int64_t mamba_params() const;
  int64_t mamba_linear_params() const { return hidden * mamba_in_proj() + mamba_inner() * hidden; }
  // All weights of one layer of kind k (an MoE kind with all E routed experts), and the linear
  // weights one token meets in it (an MoE kind: the k routed experts, shared ones, router).
  int64_t kind_params(LayerKind k) const;
  int64_t kind_active_linear_params(LayerKind k) const;
  bool mla() const { return kv_lora_rank > 0; }
  bool gated() const { return activation == Activation::kSwiglu || activation == Activation::kGeglu; }
  int64_t head_dim() const { return kv_channels > 0 ? kv_channels : hidden / heads; }
  // Whether layer i (0-based) has an MoE MLP, and how many of layers [first, first+n) do
  // (a hybrid model's E layers).
  bool is_moe_layer(int64_t i) const;
  int64_t moe_layers_in(int64_t first, int64_t n) const;
  int64_t moe_layers() const { return moe_layers_in(0, layers); }
  // Per-layer pieces: the attention block with its norm, a dense MLP with its norm, an MoE
  // MLP with its norm (router, all E experts, shared experts), and the routed experts alone
  // (what EP x ETP shards; their gradients are reduced over expert-DP).
  int64_t attention_params() const;
  int64_t dense_mlp_params() const;
  int64_t moe_mlp_params() const;
  int64_t routed_expert_params() const;  // E experts of one MoE layer
  int64_t expert_params() const { return moe_ffn_hidden * moe_width() * (gated() ? 3 : 2); }  // one
  // Weights of one MTP module (its layers, projection and norms), and its routed experts.
  int64_t mtp_params() const;
  int64_t mtp_routed_params() const;
  // Linear (GEMM) weights one token meets in the attention and in a dense or MoE MLP (the
  // k routed experts, the shared ones and the router).
  int64_t attention_linear_params() const;
  int64_t dense_mlp_linear_params() const;
  int64_t moe_mlp_active_linear_params() const;
  // Vocabulary padded to a multiple of 128*t, as Megatron does (--make-vocab-size-divisible-by
  // 128 times t; megatron/training/tokenizer _vocab_size_with_padding).
  int64_t padded_vocab(int64_t tp) const;
  // Weights of one dense transformer layer (attention + MLP + 2 norms, with biases if any).
  int64_t params_per_layer() const;
  // Weights of layers [first, first+n): dense and MoE layers each with their own size.
  int64_t layer_params(int64_t first, int64_t n) const;
  // Routed-expert weights among layers [first, first+n) (sharded by ep x etp).
  int64_t routed_params(int64_t first, int64_t n) const;
  // Weights of one dense layer's linear layers only (the GEMM operands), for FLOP counts.
  int64_t linear_params_per_layer() const;
  // Input embedding (V*h, padded vocab at t) plus learned positions (s*h).
  int64_t embedding_params(int64_t tp) const;
  // Output projection if untied (V*h), else 0; the final norm is counted here too.
  int64_t output_params(int64_t tp) const;
  // Everything, unpadded vocabulary (Narayanan eq. 2 for GPT shapes), MTP modules excluded.
  int64_t total_params() const;
  // Weights one token passes through, embeddings included: a dense model's all, an MoE
  // model's without the E - k routed experts it skips in each MoE layer.
  int64_t active_params() const;
};

// The size limits (kMaxLayers, kMaxHidden, kMaxFfnHidden, kMaxSeqLen, kMaxVocab) are in
// core/limits.h with every other range.

// Whether c is a hybrid-pattern layer symbol ptdp models: M (Mamba-2), * (attention), - (MLP),
// E (MoE).
inline bool IsLayerSymbol(char c) { return c == 'M' || c == '*' || c == '-' || c == 'E'; }

// Splits Megatron's unified hybrid pattern "MAIN/DEPTH/DEPTH..." (parse_hybrid_pattern) into
// the main pattern, one MTP depth's pattern and the number of depths (0 and "" without '/');
// an error saying what is wrong when the depths differ or a '/' has no depth after it.
Status SplitHybridPattern(const std::string& unified, std::string* main, std::string* mtp,
                          int64_t* depths);

// Checks the cross-field rules (positive sizes within the limits above, h % a, a % k, ...).
// `where` prefixes messages.
Status ValidateModel(const ModelSpec& m, const std::string& where);

// OK when `m` is the shape ptdp's runtime (runtime/gpt.cc) implements: gelu, layernorm,
// learned positions, tied embeddings, biases, kv_heads == heads; otherwise an error naming
// the model. The runtime and the cost model of the runtime (cost_model/runtime_model.h) check it.
Status CheckGptShaped(const ModelSpec& m);

// Reads a model from a YAML map (keys: name, layers, hidden, heads, kv_heads, ffn_hidden,
// seq_len, vocab, activation, norm, position_embedding, tied_embeddings, bias, dropout,
// kv_channels, rotary_base, rotary_percent, parallel_attn_mlp, num_experts, moe_topk,
// moe_ffn_hidden, moe_shared_ffn_hidden, moe_dense_layers_first, moe_layer_step, moe_router,
// moe_routing, moe_capacity_factor, moe_aux_loss_coeff, q_lora_rank, kv_lora_rank, qk_head_dim, qk_pos_head_dim,
// v_head_dim, mtp_layers, mtp_repeated_layer, moe_latent_size, sliding_window,
// global_attention_every, hybrid_pattern (Megatron's unified form: "MAIN/DEPTH/..." gives the
// MTP depths), mamba_state_dim, mamba_head_dim, mamba_num_groups, mamba_num_heads). Unknown or missing keys and bad values are errors naming file:line,
// key and value.
Result<ModelSpec> ModelFromYaml(const YAML::Node& node, const std::string& file,
                                const std::string& path);
// Loads a model YAML file.
Result<ModelSpec> LoadModelFile(const std::string& path);
// Imports a Hugging Face config.json (core/hf_import.cc): Llama, Mistral, Mixtral, Qwen2,
// Qwen2-MoE, Qwen3 (dense and MoE), DeepSeek-V2/V3, Kimi K2, Gemma 2/3, Phi-3, GPT-OSS, Falcon,
// GPT-NeoX, GPT-2 and the Nemotron-H / Nemotron 3 hybrids (nemotron_h: Mamba-2, attention, MLP
// and MoE layers by hybrid_override_pattern), each by its model_type's reader; layers ptdp does not model (Mamba outside nemotron_h,
// linear attention) and keys it cannot express are refused with the file, key and value. A
// folder reads its config.json, as from_pretrained(folder) does. The name is _name_or_path,
// else the folder (DIR/config.json) or file name; seq_len is the pre-training context the
// config or its family's report gives, else 4096, never max_position_embeddings silently
// (seq_len_note says which).
Result<ModelSpec> ImportHfConfig(const std::string& path);
// The same from the JSON text; `name` stands for the file in messages.
Result<ModelSpec> ImportHfConfigText(const std::string& text, const std::string& name);
// Loads "hf:path/config.json" (or "hf:folder") through ImportHfConfig, anything else through
// LoadModelFile.
Result<ModelSpec> LoadModel(const std::string& spec);

// Writes the YAML body of a model (the keys ModelFromYaml reads), each line prefixed by
// `indent`.
std::string ModelToYaml(const ModelSpec& m, const std::string& indent);

}  // namespace ptdp
