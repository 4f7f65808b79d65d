// ModelSpec counts and loaders.
#include "core/model.h"

#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "core/file_io.h"
#include "core/yaml_reader.h"

namespace ptdp {

const char* ToString(Activation a) {
  switch (a) {
    case Activation::kGelu: return "gelu";
    case Activation::kSwiglu: return "swiglu";
    case Activation::kSquaredRelu: return "squared_relu";
  }
  return "?";
}
const char* ToString(Norm n) { return n == Norm::kLayerNorm ? "layernorm" : "rmsnorm"; }
const char* ToString(PositionEmbedding p) {
  switch (p) {
    case PositionEmbedding::kLearned: return "learned";
    case PositionEmbedding::kRope: return "rope";
    case PositionEmbedding::kAlibi: return "alibi";
  }
  return "?";
}

int64_t ModelSpec::padded_vocab(int64_t tp) const {
  const int64_t multiple = 128 * tp;
  return (vocab + multiple - 1) / multiple * multiple;
}

int64_t ModelSpec::linear_params_per_layer() const {
  const int64_t kv = kv_heads * head_dim();
  const int64_t attn = hidden * (hidden + 2 * kv) + hidden * hidden;  // QKV + output
  const int64_t mlp_mats = activation == Activation::kSwiglu ? 3 : 2;
  return attn + mlp_mats * hidden * ffn_hidden;
}

int64_t ModelSpec::params_per_layer() const {
  const int64_t kv = kv_heads * head_dim();
  const int64_t norm_params = norm == Norm::kLayerNorm ? 2 * hidden : hidden;  // gamma (+beta)
  int64_t biases = 0;
  if (bias) {
    const int64_t mlp_in = activation == Activation::kSwiglu ? 2 * ffn_hidden : ffn_hidden;
    biases = (hidden + 2 * kv) + hidden + mlp_in + hidden;
  }
  return linear_params_per_layer() + 2 * norm_params + biases;
}

int64_t ModelSpec::embedding_params(int64_t tp) const {
  const int64_t pos = position == PositionEmbedding::kLearned ? seq_len * hidden : 0;
  return padded_vocab(tp) * hidden + pos;
}

int64_t ModelSpec::output_params(int64_t tp) const {
  const int64_t final_norm = norm == Norm::kLayerNorm ? 2 * hidden : hidden;
  return (tied_embeddings ? 0 : padded_vocab(tp) * hidden) + final_norm;
}

int64_t ModelSpec::total_params() const {
  const int64_t pos = position == PositionEmbedding::kLearned ? seq_len * hidden : 0;
  const int64_t final_norm = norm == Norm::kLayerNorm ? 2 * hidden : hidden;
  return layers * params_per_layer() + vocab * hidden * (tied_embeddings ? 1 : 2) + pos +
         final_norm;
}

namespace {
// (key, value, limit) of every size with a limit.
struct SizeLimit {
  const char* name;
  int64_t value, limit;
};
std::vector<SizeLimit> SizeLimits(const ModelSpec& m) {
  return {{"layers", m.layers, kMaxLayers},     {"hidden", m.hidden, kMaxHidden},
          {"ffn_hidden", m.ffn_hidden, kMaxFfnHidden}, {"seq_len", m.seq_len, kMaxSeqLen},
          {"vocab", m.vocab, kMaxVocab}};
}
// 4h, the default MLP width, without overflowing for an h past the limit (refused later).
int64_t DefaultFfn(int64_t hidden) { return hidden <= kMaxHidden ? 4 * hidden : hidden; }
}  // namespace

Status ValidateModel(const ModelSpec& m, const std::string& where) {
  auto err = [&](const std::string& s) { return Status::Error(where + ": " + s); };
  if (m.layers <= 0 || m.hidden <= 0 || m.heads <= 0 || m.kv_heads <= 0 || m.ffn_hidden <= 0 ||
      m.seq_len <= 0 || m.vocab <= 0)
    return err("layers, hidden, heads, kv_heads, ffn_hidden, seq_len and vocab must be positive");
  for (const auto& [name, value, limit] : SizeLimits(m))
    if (value > limit)
      return err(std::string(name) + " " + std::to_string(value) + " is larger than the limit " +
                 std::to_string(limit));
  if (m.hidden % m.heads != 0)
    return err("hidden " + std::to_string(m.hidden) + " is not divisible by heads " +
               std::to_string(m.heads));
  if (m.kv_heads > m.heads || m.heads % m.kv_heads != 0)
    return err("heads " + std::to_string(m.heads) + " is not a multiple of kv_heads " +
               std::to_string(m.kv_heads));
  return Status::Ok();
}

Result<ModelSpec> ModelFromYaml(const YAML::Node& node, const std::string& file,
                                const std::string& path) {
  YamlReader r(node, file, path);
  ModelSpec m;
  m.name = r.String("name", "model");
  r.String("description", "");  // free text, ignored
  m.layers = r.PositiveInt("layers");
  m.hidden = r.PositiveInt("hidden");
  m.heads = r.PositiveInt("heads");
  m.kv_heads = r.PositiveInt("kv_heads", m.heads);
  m.ffn_hidden = r.PositiveInt("ffn_hidden", DefaultFfn(m.hidden));
  m.seq_len = r.PositiveInt("seq_len");
  m.vocab = r.PositiveInt("vocab");
  const std::string act = r.Enum("activation", {"gelu", "swiglu", "squared_relu"}, "gelu");
  m.activation = act == "swiglu" ? Activation::kSwiglu
                 : act == "squared_relu" ? Activation::kSquaredRelu : Activation::kGelu;
  m.norm = r.Enum("norm", {"layernorm", "rmsnorm"}, "layernorm") == "rmsnorm" ? Norm::kRmsNorm
                                                                             : Norm::kLayerNorm;
  const std::string pos = r.Enum("position_embedding", {"learned", "rope", "alibi"}, "learned");
  m.position = pos == "rope"    ? PositionEmbedding::kRope
               : pos == "alibi" ? PositionEmbedding::kAlibi
                                : PositionEmbedding::kLearned;
  m.tied_embeddings = r.Bool("tied_embeddings", true);
  m.bias = r.Bool("bias", true);
  m.dropout = r.Bool("dropout", true);
  // A size past its limit first: it explains any rule it breaks below.
  for (const auto& [name, value, limit] : SizeLimits(m))
    if (value > limit)
      r.Fail(name, "'" + std::to_string(value) + "' is larger than the limit " +
                       std::to_string(limit));
  if (r.Has("hidden") && r.Has("heads") && m.hidden % m.heads != 0)
    r.Fail("heads", "'" + std::to_string(m.heads) + "' does not divide hidden " +
                        std::to_string(m.hidden));
  if (m.heads % m.kv_heads != 0)
    r.Fail("kv_heads", "'" + std::to_string(m.kv_heads) + "' does not divide heads " +
                           std::to_string(m.heads));
  PTDP_RETURN_IF_ERROR(r.Finish());
  return m;
}

Result<ModelSpec> LoadModelFile(const std::string& path) {
  PTDP_ASSIGN_OR_RETURN(YAML::Node node, LoadYamlFile(path, "a model YAML"));
  return ModelFromYaml(node, path, "");
}

namespace {

// A JSON value for a message (never throws: strings are UTF-8 after parsing, but be safe).
std::string Dump(const nlohmann::json& v) {
  return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Reads a positive integer field of a HF config; `key` is required unless fallback > 0.
Result<int64_t> JsonInt(const nlohmann::json& j, const std::string& file,
                        const std::string& key, int64_t fallback) {
  if (!j.contains(key) || j[key].is_null()) {
    if (fallback > 0) return fallback;
    return Status::Error(file + ": missing key '" + key + "'");
  }
  const auto& v = j[key];
  if (!v.is_number_integer() || v.get<int64_t>() <= 0)
    return Status::Error(file + ": key '" + key + "' = " + Dump(v) +
                         " must be a positive integer");
  return v.get<int64_t>();
}

}  // namespace

namespace {
Result<ModelSpec> ImportHfJson(const nlohmann::json& j, const std::string& path);
// Optional typed fields: absent or null gives the fallback; a wrong type is an error naming
// the key.
Result<bool> JsonBool(const nlohmann::json& j, const std::string& file, const std::string& key,
                      bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean())
    return Status::Error(file + ": key '" + key + "' = " + Dump(j[key]) + " is not a boolean");
  return j[key].get<bool>();
}
Result<std::string> JsonString(const nlohmann::json& j, const std::string& file,
                               const std::string& key, const std::string& fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_string())
    return Status::Error(file + ": key '" + key + "' = " + Dump(j[key]) + " is not a string");
  return j[key].get<std::string>();
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
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // nlohmann quotes the bytes it read last: a non-UTF-8 string is shown escaped (\xff).
    return Status::Error(path + ": malformed JSON: " + EscapeBytes(e.what()));
  }
  if (!j.is_object()) return Status::Error(path + ": top level is not a JSON object");
  try {
    return ImportHfJson(j, path);
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong type
    return Status::Error(path + ": a field has the wrong type: " + EscapeBytes(e.what()));
  }
}

namespace {
Result<ModelSpec> ImportHfJson(const nlohmann::json& j, const std::string& path) {
  ModelSpec m;
  // Dropout from the config's probabilities (GPT-2: resid_pdrop, attn_pdrop; Llama-style:
  // attention_dropout, hidden_dropout), none when it names none.
  m.dropout = false;
  for (const char* key : {"resid_pdrop", "attn_pdrop", "attention_dropout", "hidden_dropout"})
    if (j.contains(key) && j[key].is_number() && j[key].get<double>() > 0) m.dropout = true;
  PTDP_ASSIGN_OR_RETURN(const std::string type, JsonString(j, path, "model_type", ""));
  PTDP_ASSIGN_OR_RETURN(m.name, JsonString(j, path, "_name_or_path",
                                           type.empty() ? std::string("hf-model") : type));
  if (j.contains("n_layer") || type == "gpt2") {  // GPT-2 family
    PTDP_ASSIGN_OR_RETURN(m.layers, JsonInt(j, path, "n_layer", 0));
    PTDP_ASSIGN_OR_RETURN(m.hidden, JsonInt(j, path, "n_embd", 0));
    PTDP_ASSIGN_OR_RETURN(m.heads, JsonInt(j, path, "n_head", 0));
    PTDP_ASSIGN_OR_RETURN(m.ffn_hidden, JsonInt(j, path, "n_inner", DefaultFfn(m.hidden)));
    PTDP_ASSIGN_OR_RETURN(m.seq_len, JsonInt(j, path, "n_positions", 1024));
    PTDP_ASSIGN_OR_RETURN(m.vocab, JsonInt(j, path, "vocab_size", 0));
    m.kv_heads = m.heads;
    m.activation = Activation::kGelu;
    m.norm = Norm::kLayerNorm;
    m.position = PositionEmbedding::kLearned;
    PTDP_ASSIGN_OR_RETURN(m.tied_embeddings, JsonBool(j, path, "tie_word_embeddings", true));
    m.bias = true;
  } else {  // Llama, Mistral, Qwen2 family
    PTDP_ASSIGN_OR_RETURN(m.layers, JsonInt(j, path, "num_hidden_layers", 0));
    PTDP_ASSIGN_OR_RETURN(m.hidden, JsonInt(j, path, "hidden_size", 0));
    PTDP_ASSIGN_OR_RETURN(m.heads, JsonInt(j, path, "num_attention_heads", 0));
    PTDP_ASSIGN_OR_RETURN(m.kv_heads, JsonInt(j, path, "num_key_value_heads", m.heads));
    PTDP_ASSIGN_OR_RETURN(m.ffn_hidden, JsonInt(j, path, "intermediate_size", DefaultFfn(m.hidden)));
    PTDP_ASSIGN_OR_RETURN(m.seq_len, JsonInt(j, path, "max_position_embeddings", 0));
    PTDP_ASSIGN_OR_RETURN(m.vocab, JsonInt(j, path, "vocab_size", 0));
    PTDP_ASSIGN_OR_RETURN(const std::string act, JsonString(j, path, "hidden_act", "silu"));
    if (act == "silu" || act == "swish") m.activation = Activation::kSwiglu;
    else if (act.rfind("gelu", 0) == 0) m.activation = Activation::kGelu;
    else if (act == "relu2") m.activation = Activation::kSquaredRelu;
    else return Status::Error(path + ": key 'hidden_act' = \"" + act +
                              "\" is not supported (silu, gelu, relu2)");
    m.norm = j.contains("rms_norm_eps") ? Norm::kRmsNorm : Norm::kLayerNorm;
    m.position = PositionEmbedding::kRope;
    PTDP_ASSIGN_OR_RETURN(m.tied_embeddings, JsonBool(j, path, "tie_word_embeddings", false));
    PTDP_ASSIGN_OR_RETURN(m.bias, JsonBool(j, path, "attention_bias", false));
  }
  PTDP_RETURN_IF_ERROR(ValidateModel(m, path));
  return m;
}
}  // namespace

Result<ModelSpec> LoadModel(const std::string& spec) {
  if (spec.rfind("hf:", 0) == 0) return ImportHfConfig(spec.substr(3));
  return LoadModelFile(spec);
}

std::string ModelToYaml(const ModelSpec& m, const std::string& in) {
  std::ostringstream o;
  o << in << "name: " << YamlQuote(m.name) << "\n"
    << in << "layers: " << m.layers << "\n"
    << in << "hidden: " << m.hidden << "\n"
    << in << "heads: " << m.heads << "\n"
    << in << "kv_heads: " << m.kv_heads << "\n"
    << in << "ffn_hidden: " << m.ffn_hidden << "\n"
    << in << "seq_len: " << m.seq_len << "\n"
    << in << "vocab: " << m.vocab << "\n"
    << in << "activation: " << ToString(m.activation) << "\n"
    << in << "norm: " << ToString(m.norm) << "\n"
    << in << "position_embedding: " << ToString(m.position) << "\n"
    << in << "tied_embeddings: " << (m.tied_embeddings ? "true" : "false") << "\n"
    << in << "bias: " << (m.bias ? "true" : "false") << "\n"
    << in << "dropout: " << (m.dropout ? "true" : "false") << "\n";
  return o.str();
}

Status CheckGptShaped(const ModelSpec& m) {
  if (m.activation != Activation::kGelu || m.norm != Norm::kLayerNorm ||
      m.position != PositionEmbedding::kLearned || !m.tied_embeddings || !m.bias ||
      m.kv_heads != m.heads)
    return Status::Error("model " + m.name +
                         ": the runtime trains GPT shapes only (gelu, layernorm, learned "
                         "positions, tied embeddings, biases, kv_heads == heads)");
  return Status::Ok();
}

}  // namespace ptdp
