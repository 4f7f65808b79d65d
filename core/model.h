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

enum class Activation { kGelu, kSwiglu, kSquaredRelu };
enum class Norm { kLayerNorm, kRmsNorm };
// Learned absolute positions (GPT: s*h parameters), rotary (Llama), or ALiBi's per-head linear
// bias (BLOOM: no parameters, no rotary kernel; flash attention applies it in the kernel).
enum class PositionEmbedding { kLearned, kRope, kAlibi };

const char* ToString(Activation a);
const char* ToString(Norm n);
const char* ToString(PositionEmbedding p);

struct ModelSpec {
  std::string name = "model";      // free text shown in tables
  int64_t layers = 0;              // L, transformer layers
  int64_t hidden = 0;              // h
  int64_t heads = 0;               // a, attention heads
  int64_t kv_heads = 0;            // k, key/value heads (GQA); == a for multi-head attention
  int64_t ffn_hidden = 0;          // f, MLP inner size (4h for GPT)
  int64_t seq_len = 0;             // s, training sequence length
  int64_t vocab = 0;               // V, unpadded vocabulary
  Activation activation = Activation::kGelu;  // swiglu has three MLP matrices
  Norm norm = Norm::kLayerNorm;
  PositionEmbedding position = PositionEmbedding::kLearned;  // learned adds s*h parameters
  bool tied_embeddings = true;     // output layer shares the input embedding
  bool bias = true;                // linear layers carry biases (GPT yes, Llama no)
  // Hidden and attention dropout in training (Megatron's default 0.1: a 1-byte mask per element
  // is kept after attention and after the MLP); Llama-style recipes train with none.
  bool dropout = true;

  int64_t head_dim() const { return hidden / heads; }
  // Vocabulary padded to a multiple of 128*t, as Megatron does (--make-vocab-size-divisible-by
  // 128 times t; megatron/training/tokenizer _vocab_size_with_padding).
  int64_t padded_vocab(int64_t tp) const;
  // Weights of one transformer layer (attention + MLP + 2 norms, with biases if any).
  int64_t params_per_layer() const;
  // Weights of one layer's linear layers only (the GEMM operands), for FLOP counts.
  int64_t linear_params_per_layer() const;
  // Input embedding (V*h, padded vocab at t) plus learned positions (s*h).
  int64_t embedding_params(int64_t tp) const;
  // Output projection if untied (V*h), else 0; the final norm is counted here too.
  int64_t output_params(int64_t tp) const;
  // Everything, unpadded vocabulary (Narayanan eq. 2 for GPT shapes).
  int64_t total_params() const;
  // Weights one token passes through, embeddings included: every weight of a dense model (the
  // Mixture-of-Experts issue makes it the routed experts' share).
  int64_t active_params() const { return total_params(); }
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
// seq_len, vocab, activation, norm, position_embedding, tied_embeddings, bias, dropout). Unknown or
// missing keys and bad values are errors naming file:line, key and value.
Result<ModelSpec> ModelFromYaml(const YAML::Node& node, const std::string& file,
                                const std::string& path);
// Loads a model YAML file.
Result<ModelSpec> LoadModelFile(const std::string& path);
// Imports a Hugging Face config.json (GPT-2, Llama, Mistral, Qwen2 style); a folder reads its
// config.json, as from_pretrained(folder) does.
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
