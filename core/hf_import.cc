// Hugging Face config.json import (core/model.h ImportHfConfig): one reader per model family,
// chosen by model_type, reading every key that changes the shape or the cost (head size, tied
// embeddings, activation, biases, MoE layout, multi-latent attention, MTP, rotary base and
// share, sliding windows), and refusing with a one-line message naming the file, the key and
// its value whatever ModelSpec cannot express (state-space and linear-attention layers, MoE
// layer lists no (first dense, every k-th) pattern gives, unknown activations or model types).
// Nothing a config states is dropped silently; the sequence length is never taken from
// max_position_embeddings without saying so (ModelSpec::seq_len_note).
#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/file_io.h"
#include "core/limits.h"
#include "core/model.h"

namespace ptdp {
namespace {

using Json = nlohmann::json;

// A JSON value for a message (never throws: a bad UTF-8 byte is replaced).
std::string Dump(const Json& v) { return v.dump(-1, ' ', false, Json::error_handler_t::replace); }

// No model size comes near this; refusing larger integers at once keeps every product the
// readers form (experts x width, shared experts x width) inside int64 before ValidateModel
// checks the real limits.
constexpr int64_t kMaxKeyValue = int64_t(1) << 31;

// The pre-training context assumed when a config gives none (the DeepSeek, Qwen and Mixtral
// reports pre-train at 4,096 before extending the context; --seq-len sets another).
constexpr int64_t kDefaultSeqLen = 4096;

// Typed reads of one config object. The first problem is kept ("<file>: key 'k' = v ...") and
// later reads return their fallbacks, so a reader runs to its end and reports that one line.
class Reader {
 public:
  Reader(const Json& obj, std::string file, std::string prefix = "")
      : obj_(obj), file_(std::move(file)), prefix_(std::move(prefix)) {}

  const Json& json() const { return obj_; }
  const std::string& file() const { return file_; }
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  // The key as messages name it ("text_config.hidden_size" inside a multimodal config).
  std::string Name(const std::string& key) const { return prefix_ + key; }

  // The value of `key`; nullptr when absent or null (Hugging Face writes null for "unset").
  const Json* Get(const std::string& key) const {
    const auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  bool Has(const std::string& key) const { return Get(key) != nullptr; }

  void Fail(const std::string& key, const std::string& what) {
    if (!ok()) return;
    const Json* v = Get(key);
    status_ = Status::Error(file_ + ": key '" + Name(key) + "'" + (v ? " = " + Dump(*v) : "") +
                            " " + what);
  }
  void FailLine(const std::string& what) {
    if (ok()) status_ = Status::Error(file_ + ": " + what);
  }
  // Keeps the first problem of a nested object's reader.
  void Adopt(const Status& s) {
    if (ok() && !s.ok()) status_ = s;
  }

  // A required positive integer.
  int64_t Need(const std::string& key) {
    if (!Has(key)) {
      FailLine("missing key '" + Name(key) + "'");
      return 0;
    }
    return Int(key, 0);
  }
  // A positive integer, `fallback` when absent or null.
  int64_t Int(const std::string& key, int64_t fallback) {
    const Json* v = Get(key);
    if (!v) return fallback;
    if (!v->is_number_integer() || v->get<int64_t>() <= 0) {
      Fail(key, "must be a positive integer");
      return fallback;
    }
    if (v->get<int64_t>() > kMaxKeyValue) {
      Fail(key, "is larger than any model size (2^31)");
      return fallback;
    }
    return v->get<int64_t>();
  }
  // An integer >= 0, `fallback` when absent or null.
  int64_t Count(const std::string& key, int64_t fallback) {
    const Json* v = Get(key);
    if (!v) return fallback;
    if (v->is_number_integer() && v->get<int64_t>() == 0) return 0;
    return Int(key, fallback);
  }
  // A positive finite number.
  double Number(const std::string& key, double fallback) {
    const Json* v = Get(key);
    if (!v) return fallback;
    if (!v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() <= 0) {
      Fail(key, "must be a positive number");
      return fallback;
    }
    return v->get<double>();
  }
  bool Bool(const std::string& key, bool fallback) {
    const Json* v = Get(key);
    if (!v) return fallback;
    if (!v->is_boolean()) {
      Fail(key, "is not a boolean");
      return fallback;
    }
    return v->get<bool>();
  }
  std::string Str(const std::string& key, const std::string& fallback) {
    const Json* v = Get(key);
    if (!v) return fallback;
    if (!v->is_string()) {
      Fail(key, "is not a string");
      return fallback;
    }
    return v->get<std::string>();
  }

 private:
  const Json& obj_;
  std::string file_, prefix_;
  Status status_;
};

// ---- What ptdp does not model -----------------------------------------------------------------

struct Unmodelled {
  const char* type;
  const char* what;
};
// Model types whose layers are not attention + MLP blocks.
constexpr Unmodelled kUnmodelledTypes[] = {
    {"jamba", "Mamba (state-space) layers"},
    {"mamba", "Mamba (state-space) layers"},
    {"mamba2", "Mamba-2 (state-space) layers"},
    {"falcon_mamba", "Mamba (state-space) layers"},
    {"falcon_h1", "Mamba-2 (state-space) mixers"},
    {"zamba", "Mamba (state-space) layers"},
    {"zamba2", "Mamba-2 (state-space) layers"},
    {"bamba", "Mamba-2 (state-space) layers"},
    {"granitemoehybrid", "Mamba-2 (state-space) layers"},
    {"qwen3_next", "Gated DeltaNet (linear-attention) layers"},
    {"kimi_linear", "Kimi Delta Attention (linear-attention) layers"},
    {"minimax", "lightning (linear) attention layers"},
    {"minimax_m1", "lightning (linear) attention layers"},
    {"rwkv", "RWKV (recurrent) blocks"},
    {"rwkv5", "RWKV (recurrent) blocks"},
    {"rwkv6", "RWKV (recurrent) blocks"},
    {"rwkv7", "RWKV (recurrent) blocks"},
    {"recurrent_gemma", "RG-LRU (recurrent) layers"},
    {"xlstm", "xLSTM (recurrent) blocks"},
    {"lfm2", "short-convolution layers"},
};

// Refuses a config that has layers ptdp does not model, by its model_type or, whatever the
// type, by the keys that configure such layers.
Status RefuseUnmodelled(Reader& r) {
  const std::string type = r.Str("model_type", "");
  for (const Unmodelled& u : kUnmodelledTypes)
    if (type == u.type)
      return Status::Error(r.file() + ": key '" + r.Name("model_type") + "' = \"" + type +
                           "\": " + u.what + ", which ptdp does not model (it plans attention "
                           "+ MLP decoders and nemotron_h's Mamba-2 hybrids)");
  if (type == "nemotron_h") return Status::Ok();  // its reader reads the Mamba keys
  for (const auto& [key, value] : r.json().items()) {
    std::string what;
    if (key == "hybrid_override_pattern" || key == "layers_block_type")
      what = "lays out Mamba (state-space) layers beside attention";
    else if (key.rfind("mamba_", 0) == 0 || key.rfind("ssm_", 0) == 0)
      what = "configures Mamba (state-space) layers";
    else if (key.rfind("linear_attn", 0) == 0 || key.rfind("linear_num_", 0) == 0 ||
             key == "linear_key_head_dim" || key == "linear_value_head_dim")
      what = "configures linear-attention layers";
    else if (key == "attn_type_list")
      what = "lays out linear (lightning) attention layers";
    if (!what.empty())
      return Status::Error(r.file() + ": key '" + r.Name(key) + "' = " + Dump(value) + " " +
                           what + ", which ptdp does not model");
  }
  if (const Json* lt = r.Get("layer_types"); lt && lt->is_array())
    for (size_t i = 0; i < lt->size(); ++i) {
      const Json& e = (*lt)[i];
      if (!e.is_string() || (e != "full_attention" && e != "sliding_attention"))
        return Status::Error(r.file() + ": key '" + r.Name("layer_types") + "[" +
                             std::to_string(i) + "]' = " + Dump(e) +
                             ": ptdp models full_attention and sliding_attention layers only");
    }
  return Status::Ok();
}

// ---- Pieces shared by the readers -------------------------------------------------------------

bool GeluLike(const std::string& act) { return act.rfind("gelu", 0) == 0 || act == "quick_gelu"; }

// The MLP activation from `key`: a gated MLP (three matrices) takes silu/swish (SwiGLU) or a
// GeLU (GeGLU, Gemma); an ungated one a GeLU or relu2.
void ReadActivation(Reader& r, const std::string& key, const std::string& fallback, bool gated,
                    ModelSpec* m) {
  const std::string act = r.Str(key, fallback);
  if (!r.ok()) return;
  if (gated && (act == "silu" || act == "swish")) m->activation = Activation::kSwiglu;
  else if (gated && GeluLike(act)) m->activation = Activation::kGeglu;
  else if (!gated && GeluLike(act)) m->activation = Activation::kGelu;
  else if (!gated && act == "relu2") m->activation = Activation::kSquaredRelu;
  else
    r.Fail(key, gated ? "is not an activation ptdp models in a gated MLP (silu, swish, gelu*)"
                      : "is not an activation ptdp models (gelu*, relu2)");
}

// kv_channels from an explicit head size when it differs from hidden / heads.
void ReadHeadDim(Reader& r, const std::string& key, ModelSpec* m) {
  const int64_t d = r.Int(key, 0);
  if (d > 0 && m->heads > 0 && (m->hidden % m->heads != 0 || m->hidden / m->heads != d))
    m->kv_channels = d;
}

// RoPE: base (rope_theta, or rope_parameters.rope_theta in newer configs) and rotated share.
void ReadRope(Reader& r, const std::string& percent_key, double percent_default, ModelSpec* m) {
  m->position = PositionEmbedding::kRope;
  m->rotary_base = r.Number("rope_theta", 10000);
  if (!r.Has("rope_theta"))
    if (const Json* p = r.Get("rope_parameters"); p && p->is_object()) {
      Reader rp(*p, r.file(), r.Name("rope_parameters."));
      m->rotary_base = rp.Number("rope_theta", 10000);
      r.Adopt(rp.status());
    }
  m->rotary_percent = r.Number(percent_key, percent_default);
  if (m->rotary_percent > 1) r.Fail(percent_key, "must be within (0, 1]");
}

// Hidden and attention dropout from the config's probabilities; none when it names none.
bool ReadDropout(const Json& j) {
  for (const char* key : {"resid_pdrop", "attn_pdrop", "embd_pdrop", "attention_dropout",
                          "hidden_dropout"})
    if (j.contains(key) && j[key].is_number() && j[key].get<double>() > 0) return true;
  return false;
}

// Sliding windows from layer_types (Gemma 3, GPT-OSS, newer configs): all full, all windowed, or
// every G-th layer full (layers G-1, 2G-1, ...), which is what global_attention_every expresses.
// Returns false when the config has no layer_types.
bool ReadLayerTypes(Reader& r, ModelSpec* m) {
  const Json* lt = r.Get("layer_types");
  if (!lt) return false;
  if (!lt->is_array() || int64_t(lt->size()) != m->layers) {
    r.Fail("layer_types", "must list one type for each of the " + std::to_string(m->layers) +
                              " layers");
    return true;
  }
  std::vector<int64_t> full;
  for (size_t i = 0; i < lt->size(); ++i)
    if ((*lt)[i] == "full_attention") full.push_back(int64_t(i));
  if (int64_t(full.size()) == m->layers) return true;  // no window
  m->sliding_window = r.Need("sliding_window");
  if (full.empty()) return true;  // every layer windowed
  const int64_t every = full[0] + 1;
  bool regular = every >= 2 && int64_t(full.size()) == m->layers / every;
  for (size_t k = 0; regular && k < full.size(); ++k)
    regular = full[k] == int64_t(k + 1) * every - 1;
  if (!regular)
    r.Fail("layer_types", "puts full attention on layers no 'every G-th layer' pattern gives "
                          "(global_attention_every); ptdp cannot model that mix");
  else
    m->global_attention_every = every;
  return true;
}

// The routed experts under any of the names the families use ("" and 0 when dense).
std::pair<std::string, int64_t> ExpertCount(Reader& r) {
  for (const char* key : {"num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"}) {
    const Json* v = r.Get(key);
    if (!v) continue;
    if (!v->is_number_integer()) {
      r.Fail(key, "must be an integer (per-layer expert counts are not modelled)");
      return {key, 0};
    }
    if (v->get<int64_t>() > 0) return {key, r.Int(key, 0)};
  }
  return {"", 0};
}

// Mixture of Experts, whatever the family calls its keys: Mixtral and GPT-OSS
// (num_local_experts, experts as wide as intermediate_size), Qwen2/3-MoE (num_experts,
// moe_intermediate_size, shared_expert_intermediate_size, decoder_sparse_step,
// mlp_only_layers), DeepSeek and Kimi (n_routed_experts, n_shared_experts,
// first_k_dense_replace, moe_layer_freq, scoring_func), Llama 4 (interleave_moe_layer_step).
// The MoE layers the keys give are matched to ModelSpec's pattern (the first D dense, then
// every step-th layer) and refused when no pattern gives them.
void ReadMoe(Reader& r, ModelSpec* m) {
  const auto [experts_key, experts] = ExpertCount(r);
  if (experts == 0 || !r.ok()) return;
  m->num_experts = experts;
  // GPT-OSS writes experts_per_token beside num_experts_per_tok.
  m->moe_topk = r.Has("experts_per_token") && !r.Has("num_experts_per_tok")
                    ? r.Need("experts_per_token")
                    : r.Need("num_experts_per_tok");
  m->moe_ffn_hidden = r.Int("moe_intermediate_size", m->ffn_hidden);
  if (r.Has("shared_expert_intermediate_size"))
    m->moe_shared_ffn_hidden = r.Count("shared_expert_intermediate_size", 0);
  else
    m->moe_shared_ffn_hidden = r.Count("n_shared_experts", 0) * m->moe_ffn_hidden;
  const std::string scoring = r.Str("scoring_func", "softmax");
  if (scoring == "sigmoid") m->moe_router = MoeRouter::kSigmoid;
  else if (scoring != "softmax") r.Fail("scoring_func", "is not a router ptdp models (softmax, sigmoid)");
  m->moe_routing = MoeRouting::kDropless;
  // LatentMoE (Megatron-Bridge maps the HF key to --moe-latent-size).
  m->moe_latent_size = r.Count("moe_latent_size", 0);
  if (!r.ok() || m->layers <= 0 || m->layers > kMaxLayers) return;  // ValidateModel says why

  // Which layers are MoE, by each family's rule (all of them hold at once).
  const int64_t first_dense = r.Count("first_k_dense_replace", 0);
  const Json* freq_json = r.Get("moe_layer_freq");
  if (freq_json && !freq_json->is_number_integer())
    r.Fail("moe_layer_freq", "must be an integer (per-layer MoE lists are not modelled)");
  const int64_t freq = r.Int("moe_layer_freq", 1);
  const int64_t sparse_step = r.Int("decoder_sparse_step", 1);
  const int64_t interleave = r.Int("interleave_moe_layer_step", 1);
  std::vector<bool> dense_only(size_t(m->layers), false);
  if (const Json* mlp_only = r.Get("mlp_only_layers")) {
    if (!mlp_only->is_array()) r.Fail("mlp_only_layers", "must be a list of layer indices");
    else
      for (const Json& e : *mlp_only) {
        if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= m->layers) {
          r.Fail("mlp_only_layers", "must list layer indices below " + std::to_string(m->layers));
          break;
        }
        dense_only[size_t(e.get<int64_t>())] = true;
      }
  }
  if (!r.ok()) return;
  std::vector<bool> moe(size_t(m->layers));
  std::vector<int64_t> moe_at;
  for (int64_t i = 0; i < m->layers; ++i) {
    moe[size_t(i)] = i >= first_dense && i % freq == 0 && (i + 1) % sparse_step == 0 &&
                     (i + 1) % interleave == 0 && !dense_only[size_t(i)];
    if (moe[size_t(i)]) moe_at.push_back(i);
  }
  std::string keys;  // the keys that shaped the layout, for messages
  for (const char* k : {"first_k_dense_replace", "moe_layer_freq", "decoder_sparse_step",
                        "interleave_moe_layer_step", "mlp_only_layers"})
    if (r.Has(k)) keys += std::string(keys.empty() ? "" : ", ") + r.Name(k);
  if (moe_at.empty()) {
    r.FailLine("key '" + r.Name(experts_key) + "' = " + std::to_string(experts) +
               " but no layer is MoE (" + keys + ")");
    return;
  }
  // ModelSpec: layer i is MoE when i >= D and (i - D) % step == step - 1.
  int64_t step = moe_at.size() > 1 ? moe_at[1] - moe_at[0] : m->layers - moe_at[0];
  int64_t dense_first = moe_at[0] - (step - 1);
  if (dense_first < 0) step = 1, dense_first = moe_at[0];
  m->moe_layer_step = step;
  m->moe_dense_layers_first = dense_first;
  for (int64_t i = 0; i < m->layers; ++i)
    if (m->is_moe_layer(i) != moe[size_t(i)]) {
      r.FailLine("the MoE layers " + keys + " give (layer " + std::to_string(i) + " is " +
                 (moe[size_t(i)] ? "MoE" : "dense") + ") follow no 'first D dense, then every "
                 "k-th' pattern, which is what ptdp models");
      return;
    }
}

// Multi-head latent attention (DeepSeek-V2/V3, Kimi K2) when kv_lora_rank > 0; q_lora_rank null
// (V2-Lite) is a full query projection.
void ReadMla(Reader& r, ModelSpec* m) {
  if (r.Count("kv_lora_rank", 0) == 0) return;
  m->kv_lora_rank = r.Need("kv_lora_rank");
  m->q_lora_rank = r.Count("q_lora_rank", 0);
  m->qk_head_dim = r.Need("qk_nope_head_dim");
  m->qk_pos_head_dim = r.Need("qk_rope_head_dim");
  m->v_head_dim = r.Need("v_head_dim");
  m->kv_heads = m->heads;  // every head has its own key and value out of the latent
  m->kv_channels = 0;
}

// ---- Sequence length --------------------------------------------------------------------------

struct SeqLen {
  int64_t value = 0;
  std::string note;
};

const char* const kSeqFlag = "; --seq-len sets it";

// The training length the config states (the context before RoPE scaling), if any.
SeqLen StatedPretrainingContext(Reader& r) {
  const int64_t max_pos = r.Count("max_position_embeddings", 0);
  auto stated = [&](int64_t v, const std::string& key) -> SeqLen {
    std::string note = "the pre-training context, " + key;
    if (max_pos > v)
      note += "; max_position_embeddings " + std::to_string(max_pos) + " is the extended context";
    return {v, note};
  };
  if (const Json* rs = r.Get("rope_scaling"); rs && rs->is_object()) {
    Reader rr(*rs, r.file(), r.Name("rope_scaling."));
    const int64_t v = rr.Int("original_max_position_embeddings", 0);
    r.Adopt(rr.status());
    if (v > 0 && rr.ok()) return stated(v, r.Name("rope_scaling.original_max_position_embeddings"));
  }
  for (const char* key : {"original_max_position_embeddings", "initial_context_length"})
    if (const int64_t v = r.Int(key, 0); v > 0) return stated(v, r.Name(key));
  return {};
}

// The default when the config states no training length.
SeqLen DefaultSeqLen(Reader& r) {
  const int64_t max_pos = r.Count("max_position_embeddings", 0);
  if (max_pos > 0 && max_pos < kDefaultSeqLen)
    return {max_pos, "max_position_embeddings, below the 4096 default for an imported config"};
  return {kDefaultSeqLen,
          "default for an imported config" +
              (max_pos > 0 ? "; max_position_embeddings " + std::to_string(max_pos) +
                                 " is the context limit, not the training length"
                           : std::string())};
}

// ---- Llama-style decoders ---------------------------------------------------------------------

// How a family lays out sliding windows when the config has no layer_types.
enum class Windows {
  kNone,        // Llama, DeepSeek: no window
  kAll,         // Mistral, Mixtral, Phi-3: sliding_window on every layer (null: none)
  kQwen,        // Qwen2/3: only with use_sliding_window, on layers >= max_window_layers
  kEveryOther,  // Gemma 2: layers 0, 2, ... windowed, 1, 3, ... global
  kPattern,     // Gemma 3: every sliding_window_pattern-th layer global
};

// What differs between the Llama-style families (transformers' config-class defaults for the
// keys a config may leave out, and the family's published training length).
struct Family {
  bool tied = false;                         // tie_word_embeddings when absent
  const char* act_key = "hidden_act";        // the activation's key and default
  const char* act_default = "silu";
  const char* act_alt_key = nullptr;         // read first when present (Gemma hidden_activation)
  bool bias_keys = true;                     // attention_bias / mlp_bias set bias
  bool bias_default = false;
  Windows windows = Windows::kNone;  // when the config has no layer_types
  int64_t window_pattern = 0;                // kPattern's default sliding_window_pattern
  int64_t vocab_default = 0;                 // 0: vocab_size required
  // The published pre-training context when the config states none (0: the 4096 default),
  // and its source; llama_max_pos: Llama 1/2/3 pre-trained at max_position_embeddings (2048,
  // 4096, 8192: Touvron et al. 2023a/b, Llama 3 paper section 3.4).
  int64_t seq_figure = 0;
  const char* seq_source = "";
  bool llama_max_pos = false;
};

// The sizes every Llama-style config names alike (and NemotronH's).
void ReadSizes(Reader& r, ModelSpec* m) {
  m->layers = r.Need("num_hidden_layers");
  m->hidden = r.Need("hidden_size");
  m->heads = r.Need("num_attention_heads");
  m->kv_heads = r.Int("num_key_value_heads", m->heads);
  m->ffn_hidden = r.Need("intermediate_size");
}

Result<ModelSpec> ReadDecoder(Reader& r, const Family& f, SeqLen* seq) {
  ModelSpec m;
  ReadSizes(r, &m);
  m.vocab = f.vocab_default > 0 ? r.Int("vocab_size", f.vocab_default) : r.Need("vocab_size");
  ReadHeadDim(r, "head_dim", &m);
  if (f.act_alt_key && r.Has(f.act_alt_key))
    ReadActivation(r, f.act_alt_key, f.act_default, true, &m);
  else
    ReadActivation(r, f.act_key, f.act_default, true, &m);
  m.norm = Norm::kRmsNorm;
  ReadRope(r, "partial_rotary_factor", 1.0, &m);
  m.tied_embeddings = r.Bool("tie_word_embeddings", f.tied);
  m.bias = f.bias_default;
  if (f.bias_keys)
    m.bias = r.Bool("attention_bias", f.bias_default) || r.Bool("mlp_bias", false);
  m.dropout = ReadDropout(r.json());
  ReadMla(r, &m);
  ReadMoe(r, &m);
  m.mtp_layers = r.Count("num_nextn_predict_layers", 0);

  if (!ReadLayerTypes(r, &m)) {
    switch (f.windows) {
      case Windows::kNone:
        break;
      case Windows::kAll:
        m.sliding_window = r.Count("sliding_window", 0);
        break;
      case Windows::kQwen:
        if (r.Bool("use_sliding_window", false) && r.Count("sliding_window", 0) > 0) {
          const int64_t from = r.Count("max_window_layers", m.layers);
          if (from == 0) m.sliding_window = r.Need("sliding_window");
          else if (from < m.layers)
            r.Fail("max_window_layers", "windows only layers " + std::to_string(from) +
                                            " and up; ptdp models a window on every layer or "
                                            "every G-th layer global");
        }
        break;
      case Windows::kEveryOther:
        m.sliding_window = r.Count("sliding_window", 0);
        if (m.sliding_window > 0) m.global_attention_every = 2;
        break;
      case Windows::kPattern:
        m.sliding_window = r.Count("sliding_window", 0);
        if (m.sliding_window > 0) {
          m.global_attention_every = r.Int("sliding_window_pattern", f.window_pattern);
          if (m.global_attention_every == 1) m.sliding_window = 0, m.global_attention_every = 0;
        }
        break;
    }
  }

  *seq = StatedPretrainingContext(r);
  if (seq->value == 0) {
    const int64_t max_pos = r.Count("max_position_embeddings", 0);
    if (f.llama_max_pos && !r.Has("rope_scaling") && max_pos > 0 && max_pos <= 8192)
      *seq = {max_pos, "max_position_embeddings, the pre-training context of Llama 1/2/3: "
                       "2048/4096/8192"};
    else if (f.seq_figure > 0)
      *seq = {f.seq_figure, std::string("the pre-training context (") + f.seq_source + ")"};
    else
      *seq = DefaultSeqLen(r);
  }
  if (!r.ok()) return r.status();
  return m;
}

// ---- Other families ---------------------------------------------------------------------------

// Refuses expert keys in a family whose reader has no MoE layout (never drops them).
void RefuseExperts(Reader& r, const std::string& family) {
  const auto [key, experts] = ExpertCount(r);
  if (experts > 0) r.Fail(key, "gives experts, but ptdp imports " + family + " as a dense model");
}

// GPT-2 (n_layer, n_embd, n_head, learned positions, biases, tied embeddings).
Result<ModelSpec> ReadGpt2(Reader& r, SeqLen* seq) {
  ModelSpec m;
  m.layers = r.Need("n_layer");
  m.hidden = r.Need("n_embd");
  m.heads = r.Need("n_head");
  m.kv_heads = m.heads;
  m.ffn_hidden = r.Int("n_inner", m.hidden > 0 && m.hidden <= kMaxHidden ? 4 * m.hidden : 1);
  m.vocab = r.Need("vocab_size");
  ReadActivation(r, "activation_function", "gelu_new", false, &m);
  m.norm = Norm::kLayerNorm;
  m.position = PositionEmbedding::kLearned;
  m.tied_embeddings = r.Bool("tie_word_embeddings", true);
  m.bias = true;
  m.dropout = ReadDropout(r.json());
  RefuseExperts(r, "GPT-2");
  const int64_t positions = r.Int("n_positions", r.Int("n_ctx", 1024));
  *seq = {positions, "n_positions, the length of the learned position table"};
  if (!r.ok()) return r.status();
  return m;
}

// Falcon: the released 7B config (multi_query, parallel_attn, one LayerNorm, GeLU MLP of 4h, no
// biases) and new_decoder_architecture (40B/180B: num_kv_heads groups, two LayerNorms), in the
// transformers spelling (model_type falcon) or the original one (RefinedWebModel / RefinedWeb:
// n_layer, n_head, n_head_kv).
Result<ModelSpec> ReadFalcon(Reader& r, const std::string& type, SeqLen* seq) {
  ModelSpec m;
  const bool rw = type != "falcon";
  m.layers = r.Need(rw && !r.Has("num_hidden_layers") ? "n_layer" : "num_hidden_layers");
  m.heads = r.Need(rw && !r.Has("num_attention_heads") ? "n_head" : "num_attention_heads");
  m.hidden = r.Need("hidden_size");
  m.vocab = r.Need("vocab_size");
  const bool new_arch = r.Bool("new_decoder_architecture", type == "RefinedWeb");
  const bool multi_query = r.Bool("multi_query", true);  // FalconConfig's default
  const char* kv_key = r.Has("num_kv_heads") || !rw ? "num_kv_heads" : "n_head_kv";
  m.kv_heads = new_arch || !multi_query ? r.Int(kv_key, m.heads) : 1;
  ReadHeadDim(r, "head_dim", &m);
  m.ffn_hidden = r.Int("ffn_hidden_size", m.hidden > 0 && m.hidden <= kMaxHidden ? 4 * m.hidden : 1);
  ReadActivation(r, "activation", "gelu", false, &m);
  m.norm = Norm::kLayerNorm;
  if (r.Bool("alibi", false)) m.position = PositionEmbedding::kAlibi;
  else ReadRope(r, "partial_rotary_factor", 1.0, &m);
  m.tied_embeddings = r.Bool("tie_word_embeddings", true);  // lm_head shares word_embeddings
  m.bias = r.Bool("bias", false);
  m.parallel_attn_mlp = r.Bool("parallel_attn", true) || new_arch;
  m.dropout = ReadDropout(r.json());
  RefuseExperts(r, "Falcon");
  *seq = {2048, "the pre-training context (Falcon report, Almazrouei et al. 2023: 2,048-token "
                "sequences)"};
  if (!r.ok()) return r.status();
  return m;
}

// GPT-NeoX / Pythia: LayerNorm, biases, GeLU MLP, rotary on rotary_pct of each head, attention
// and MLP side by side (use_parallel_residual), untied embeddings.
Result<ModelSpec> ReadNeox(Reader& r, SeqLen* seq) {
  ModelSpec m;
  m.layers = r.Need("num_hidden_layers");
  m.hidden = r.Need("hidden_size");
  m.heads = r.Need("num_attention_heads");
  m.kv_heads = m.heads;
  m.ffn_hidden = r.Need("intermediate_size");
  m.vocab = r.Need("vocab_size");
  ReadActivation(r, "hidden_act", "gelu", false, &m);
  m.norm = Norm::kLayerNorm;
  m.position = PositionEmbedding::kRope;
  m.rotary_base = r.Number("rotary_emb_base", 10000);
  m.rotary_percent = r.Number("rotary_pct", 0.25);  // GPTNeoXConfig's default
  if (m.rotary_percent > 1) r.Fail("rotary_pct", "must be within (0, 1]");
  m.parallel_attn_mlp = r.Bool("use_parallel_residual", true);
  m.tied_embeddings = r.Bool("tie_word_embeddings", false);
  m.bias = r.Bool("attention_bias", true);  // the MLP always has biases
  m.dropout = ReadDropout(r.json());
  RefuseExperts(r, "GPT-NeoX");
  const int64_t max_pos = r.Count("max_position_embeddings", 0);
  if (max_pos > 0 && max_pos <= 2048)
    *seq = {max_pos, "the pre-training context: GPT-NeoX-20B and Pythia were pre-trained at "
                     "max_position_embeddings 2048"};
  else
    *seq = DefaultSeqLen(r);
  if (!r.ok()) return r.status();
  return m;
}

// Nemotron-H and Nemotron 3 (transformers' NemotronHConfig): Megatron-Core hybrids, one block per
// layer as hybrid_override_pattern says (M Mamba-2, * attention, - MLP, E MoE); squared-ReLU
// MLPs, RMSNorm, no position embedding, Mamba-2 mixers of mamba_num_heads x mamba_head_dim
// (else expand x hidden / head_dim), n_groups groups of ssm_state_size. What Megatron's
// MambaMixer cannot train is refused: a conv1d other than 4 taps, projection biases
// (use_bias), no conv bias. chunk_size is not read: Megatron's mixer scans in chunks of 128.
Result<ModelSpec> ReadNemotronH(Reader& r, SeqLen* seq) {
  ModelSpec m;
  ReadSizes(r, &m);
  m.vocab = r.Need("vocab_size");
  ReadHeadDim(r, r.Has("head_dim") ? "head_dim" : "attention_head_dim", &m);
  ReadActivation(r, "mlp_hidden_act", "relu2", /*gated=*/false, &m);
  m.norm = Norm::kRmsNorm;
  m.position = PositionEmbedding::kNone;
  m.tied_embeddings = r.Bool("tie_word_embeddings", false);
  m.bias = r.Bool("attention_bias", false) || r.Bool("mlp_bias", false);
  m.dropout = ReadDropout(r.json());
  m.hybrid_pattern = r.Str("hybrid_override_pattern", "");
  if (!r.ok()) return r.status();
  if (m.hybrid_pattern.empty()) r.Fail("hybrid_override_pattern", "is missing or empty");
  for (char c : m.hybrid_pattern)
    if (!IsLayerSymbol(c)) {
      r.Fail("hybrid_override_pattern", std::string("has '") + c + "', not a layer symbol ptdp "
                                        "models (M Mamba-2, * attention, - MLP, E MoE)");
      break;
    }
  if (r.ok() && int64_t(m.hybrid_pattern.size()) != m.layers)
    r.Fail("hybrid_override_pattern", "has " + std::to_string(m.hybrid_pattern.size()) +
                                          " layers but num_hidden_layers is " +
                                          std::to_string(m.layers));
  if (m.hybrid_pattern.find('M') != std::string::npos) {
    m.mamba_head_dim = r.Need("mamba_head_dim");
    m.mamba_state_dim = r.Need("ssm_state_size");
    m.mamba_num_groups = r.Int("n_groups", 8);
    if (r.Has("mamba_num_heads")) {
      m.mamba_num_heads = r.Need("mamba_num_heads");
    } else if (m.mamba_head_dim > 0) {
      const double expand = r.Number("expand", 2);
      m.mamba_num_heads = int64_t(expand * double(m.hidden)) / m.mamba_head_dim;
    }
    if (r.Int("conv_kernel", 4) != 4)
      r.Fail("conv_kernel", "is not 4: Megatron's MambaMixer convolves over 4 taps");
    if (r.Bool("use_bias", false))
      r.Fail("use_bias", "is true: Megatron's MambaMixer has no in_proj/out_proj biases");
    if (!r.Bool("use_conv_bias", true))
      r.Fail("use_conv_bias", "is false: Megatron's MambaMixer always has a conv1d bias");
  }
  if (m.hybrid_pattern.find('E') != std::string::npos) {
    const auto [key, experts] = ExpertCount(r);
    if (experts == 0 && r.ok())
      r.Fail("hybrid_override_pattern", "has E (MoE) layers but the config gives no experts "
                                        "(n_routed_experts)");
    m.num_experts = experts;
    m.moe_topk = r.Need("num_experts_per_tok");
    m.moe_ffn_hidden = r.Int("moe_intermediate_size", m.ffn_hidden);
    m.moe_shared_ffn_hidden =
        r.Count("moe_shared_expert_intermediate_size", 0) * r.Int("n_shared_experts", 1);
    // Nemotron 3 Super and Ultra: LatentMoE (nemotron_h_bridge.py maps moe_latent_size).
    m.moe_latent_size = r.Count("moe_latent_size", 0);
    // Nemotron 3's router scores with a sigmoid and a bias (Megatron-LM's Nemotron-3 Nano
    // example: --moe-router-score-function sigmoid --moe-router-enable-expert-bias).
    m.moe_router = MoeRouter::kSigmoid;
    m.moe_routing = MoeRouting::kDropless;
  } else {
    RefuseExperts(r, "a NemotronH pattern without E layers");
    if (r.Count("moe_latent_size", 0) > 0)
      r.Fail("moe_latent_size", "is set but the pattern has no E (MoE) layer");
  }
  // Multi-token prediction (Nemotron 3 Super, Ultra): num_nextn_predict_layers depths of
  // mtp_hybrid_override_pattern's layers (nemotron_h_bridge.py requires the pattern with it).
  m.mtp_layers = r.Count("num_nextn_predict_layers", 0);
  if (m.mtp_layers > 0) {
    m.mtp_pattern = r.Str("mtp_hybrid_override_pattern", "");
    if (r.ok() && m.mtp_pattern.empty())
      r.Fail("mtp_hybrid_override_pattern", "is missing: num_nextn_predict_layers " +
                                                std::to_string(m.mtp_layers) +
                                                " needs the MTP depth's layer pattern");
    for (char c : m.mtp_pattern)
      if (!IsLayerSymbol(c)) {
        r.Fail("mtp_hybrid_override_pattern",
               std::string("has '") + c + "', not a layer symbol ptdp models (M, *, -, E)");
        break;
      }
    if (r.ok() && m.mtp_pattern.find('E') != std::string::npos && !m.moe())
      r.Fail("mtp_hybrid_override_pattern", "has E (MoE) layers but the model has no experts");
  }
  *seq = StatedPretrainingContext(r);
  const int64_t max_pos = r.Count("max_position_embeddings", 0);
  if (seq->value == 0 && max_pos > 0 && max_pos <= 8192)
    *seq = {max_pos, "max_position_embeddings, the pre-training context of the Nemotron-H "
                     "models (8,192 tokens: Nemotron-H report, arXiv 2504.03624)"};
  else if (seq->value == 0)
    *seq = DefaultSeqLen(r);
  if (!r.ok()) return r.status();
  return m;
}

// ---- Dispatch ---------------------------------------------------------------------------------

const char* const kSupported =
    "llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, deepseek_v2, deepseek_v3, "
    "kimi_k2, gemma2, gemma3, gemma3_text, phi3, gpt_oss, falcon (RefinedWeb, "
    "RefinedWebModel), gpt_neox, gpt2, nemotron_h";

// The family of a Llama-style model_type; false when it is not one.
bool LlamaStyle(const std::string& type, Family* f) {
  *f = Family{};
  if (type == "llama") {
    f->llama_max_pos = true;
  } else if (type == "mistral" || type == "mixtral") {
    f->windows = Windows::kAll;
  } else if (type == "qwen2" || type == "qwen2_moe") {
    // q/k/v carry biases, o_proj and the MLP none: ModelSpec's bias is all or nothing, and the
    // q/k/v biases are (a + 2k) d per layer (0.002% of Qwen2.5-7B), so bias stays off.
    f->bias_keys = false;
    f->windows = Windows::kQwen;
  } else if (type == "qwen3" || type == "qwen3_moe") {
    f->windows = Windows::kQwen;
  } else if (type == "phi3") {
    f->windows = Windows::kAll;
  } else if (type == "deepseek_v2" || type == "deepseek_v3" || type == "kimi_k2") {
    // Kimi K2's config.json names its own type; the layers are DeepSeek-V3's.
  } else if (type == "gemma2") {
    f->tied = true;
    f->act_alt_key = "hidden_activation";
    f->act_default = "gelu_pytorch_tanh";
    f->windows = Windows::kEveryOther;
    f->seq_figure = 8192;
    f->seq_source = "Gemma 2 report: 8,192-token context";
  } else if (type == "gemma3_text") {
    // Gemma3TextConfig's defaults, which the released 4B-27B configs rely on (their
    // text_config leaves out vocab_size, hidden_activation and sliding_window_pattern).
    f->tied = true;
    f->act_alt_key = "hidden_activation";
    f->act_default = "gelu_pytorch_tanh";
    f->windows = Windows::kPattern;
    f->window_pattern = 6;
    f->vocab_default = 262208;
    f->seq_figure = 32768;
    f->seq_source = "Gemma 3 report: pre-trained on 32K sequences, then RoPE-scaled to 128K";
  } else if (type == "gpt_oss") {
    f->bias_default = true;  // attention, experts and router all carry biases
    f->windows = Windows::kEveryOther;  // GptOssConfig's default layer_types
  } else {
    return false;
  }
  return true;
}

// "DIR" for DIR/config.json (hf:DIR), else the file name without .json.
std::string NameFromPath(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.find_last_of('/');
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  if (base == "config.json" && slash != std::string::npos && slash > 0) {
    const std::string dir = path.substr(0, slash);
    const size_t s2 = dir.find_last_of('/');
    const std::string folder = s2 == std::string::npos ? dir : dir.substr(s2 + 1);
    if (!folder.empty() && folder != "." && folder != "..") return folder;
  }
  if (base.size() > 5 && base.compare(base.size() - 5, 5, ".json") == 0)
    base.resize(base.size() - 5);
  return base.empty() ? "hf-model" : base;
}

Result<ModelSpec> ImportHfJson(const Json& top, const std::string& file) {
  Reader tr(top, file);
  std::string type = tr.Str("model_type", "");
  const std::string given_name = tr.Str("_name_or_path", "");
  PTDP_RETURN_IF_ERROR(tr.status());
  PTDP_RETURN_IF_ERROR(RefuseUnmodelled(tr));

  // Gemma 3's multimodal config keeps the decoder in text_config (the vision tower is not
  // imported: ptdp plans the text decoder).
  const Json* body = &top;
  std::string prefix;
  if (type == "gemma3") {
    const Json* tc = tr.Get("text_config");
    if (!tc || !tc->is_object())
      return Status::Error(file + ": model_type \"gemma3\" needs a text_config object");
    body = tc;
    prefix = "text_config.";
    type = "gemma3_text";
  }
  Reader r(*body, file, prefix);
  if (body != &top) PTDP_RETURN_IF_ERROR(RefuseUnmodelled(r));

  SeqLen seq;
  Family family;
  Result<ModelSpec> read = Status::Error("unset");
  if (type == "gpt2" || (type.empty() && r.Has("n_layer") && r.Has("n_embd")))
    read = ReadGpt2(r, &seq);
  else if (type == "falcon" || type == "RefinedWeb" || type == "RefinedWebModel")
    read = ReadFalcon(r, type, &seq);
  else if (type == "gpt_neox")
    read = ReadNeox(r, &seq);
  else if (type == "nemotron_h")
    read = ReadNemotronH(r, &seq);
  else if (LlamaStyle(type, &family))
    read = ReadDecoder(r, family, &seq);
  else
    return Status::Error(file + ": " +
                         (type.empty() ? std::string("no key 'model_type'")
                                       : "key 'model_type' = " + Dump(top["model_type"]) +
                                             " is not a model type ptdp imports") +
                         " (supported: " + kSupported + ")");
  PTDP_RETURN_IF_ERROR(read.status());
  ModelSpec m = std::move(read).value();
  m.seq_len = seq.value;
  m.seq_len_note = seq.note + kSeqFlag;
  m.name = !given_name.empty() ? given_name : NameFromPath(file);
  PTDP_RETURN_IF_ERROR(ValidateModel(m, file));
  return m;
}

}  // namespace

Result<ModelSpec> ImportHfConfig(const std::string& path) {
  // hf:DIR reads DIR/config.json, as Hugging Face's from_pretrained(DIR) does.
  struct stat st {};
  const std::string file =
      ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)
          ? path + (path.empty() || path.back() != '/' ? "/" : "") + "config.json"
          : path;
  PTDP_ASSIGN_OR_RETURN(const std::string text, ReadFileText(file, "a Hugging Face config.json"));
  return ImportHfConfigText(text, file);
}

Result<ModelSpec> ImportHfConfigText(const std::string& text, const std::string& path) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    // nlohmann quotes the bytes it read last: a non-UTF-8 string is shown escaped (\xff).
    return Status::Error(path + ": malformed JSON: " + EscapeBytes(e.what()));
  }
  if (!j.is_object()) return Status::Error(path + ": top level is not a JSON object");
  try {
    return ImportHfJson(j, path);
  } catch (const Json::exception& e) {  // a field of a type no reader checked
    return Status::Error(path + ": a field has the wrong type: " + EscapeBytes(e.what()));
  }
}

}  // namespace ptdp
