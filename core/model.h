// ModelSpec: the shape of a GPT-style decoder (GPT-2/3, Megatron, Llama, Mistral), read from a
// model YAML file or imported from a Hugging Face config.json, and the counts derived from it.
// Letters used in comments: L layers, h hidden, a heads, k kv heads, f ffn hidden, s sequence,
// V vocabulary, t tensor-parallel size.
#pragma once

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
// Learned absolute positions (GPT: s*h parameters), rotary (Llama), or ALiBi's per-head linear
// bias (BLOOM: no parameters, no rotary kernel; flash attention applies it in the kernel).
enum class PositionEmbedding { kLearned, kRope, kAlibi };

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

  bool moe() const { return num_experts > 0; }
  bool mla() const { return kv_lora_rank > 0; }
  bool gated() const { return activation == Activation::kSwiglu || activation == Activation::kGeglu; }
  int64_t head_dim() const { return kv_channels > 0 ? kv_channels : hidden / heads; }
  // Whether layer i (0-based) has an MoE MLP, and how many of layers [first, first+n) do.
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
  int64_t expert_params() const { return moe_ffn_hidden * hidden * (gated() ? 3 : 2); }  // one
  // Weights of one MTP module (its layer, projection and norms).
  int64_t mtp_params() const;
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
// v_head_dim, mtp_layers, sliding_window, global_attention_every). Unknown or missing keys and bad values are errors naming file:line,
// key and value.
Result<ModelSpec> ModelFromYaml(const YAML::Node& node, const std::string& file,
                                const std::string& path);
// Loads a model YAML file.
Result<ModelSpec> LoadModelFile(const std::string& path);
// Imports a Hugging Face config.json (core/hf_import.cc): Llama, Mistral, Mixtral, Qwen2,
// Qwen2-MoE, Qwen3 (dense and MoE), DeepSeek-V2/V3, Kimi K2, Gemma 2/3, Phi-3, GPT-OSS, Falcon,
// GPT-NeoX and GPT-2, each by its model_type's reader; layers ptdp does not model (Mamba,
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
