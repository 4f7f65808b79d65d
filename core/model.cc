// ModelSpec counts and the model YAML reader and writer (the Hugging Face import is in
// core/hf_import.cc).
#include "core/model.h"

#include <algorithm>
#include <charconv>
#include <sstream>
#include <tuple>
#include <vector>

#include "core/yaml_reader.h"

namespace ptdp {

const char* ToString(Activation a) {
  switch (a) {
    case Activation::kGelu: return "gelu";
    case Activation::kSwiglu: return "swiglu";
    case Activation::kSquaredRelu: return "squared_relu";
    case Activation::kGeglu: return "geglu";
  }
  return "?";
}
const char* ToString(Norm n) { return n == Norm::kLayerNorm ? "layernorm" : "rmsnorm"; }
const char* ToString(PositionEmbedding p) {
  switch (p) {
    case PositionEmbedding::kLearned: return "learned";
    case PositionEmbedding::kRope: return "rope";
    case PositionEmbedding::kAlibi: return "alibi";
    case PositionEmbedding::kNone: return "none";
  }
  return "?";
}

const char* ToString(MoeRouter r) { return r == MoeRouter::kSigmoid ? "sigmoid" : "softmax"; }
const char* ToString(MoeRouting r) {
  switch (r) {
    case MoeRouting::kDropless: return "dropless";
    case MoeRouting::kBalanced: return "balanced";
    case MoeRouting::kCapacity: return "capacity";
  }
  return "?";
}

const char* ToString(LayerKind k) {
  switch (k) {
    case LayerKind::kDense: return "dense";
    case LayerKind::kMoe: return "moe";
    case LayerKind::kMamba: return "mamba";
    case LayerKind::kAttention: return "attention";
    case LayerKind::kMlp: return "mlp";
    case LayerKind::kMoeMlp: return "moe-mlp";
  }
  return "?";
}

double LayerCounts::total() const {
  double t = 0;
  for (double v : n) t += v;
  return t;
}

double LayerCounts::attention() const {
  return (*this)[LayerKind::kDense] + (*this)[LayerKind::kMoe] + (*this)[LayerKind::kAttention];
}

LayerCounts LayerCounts::Scaled(double f) const {
  LayerCounts c = *this;
  for (double& v : c.n) v *= f;
  return c;
}

namespace {
LayerKind KindOfSymbol(char c) {
  switch (c) {
    case 'M': return LayerKind::kMamba;
    case '-': return LayerKind::kMlp;
    case 'E': return LayerKind::kMoeMlp;
    default: return LayerKind::kAttention;
  }
}
}  // namespace

LayerKind ModelSpec::layer_kind(int64_t i) const {
  if (hybrid())
    return KindOfSymbol(i >= 0 && i < int64_t(hybrid_pattern.size()) ? hybrid_pattern[size_t(i)]
                                                                     : '*');
  return is_moe_layer(i) ? LayerKind::kMoe : LayerKind::kDense;
}

LayerCounts ModelSpec::mtp_layer_counts() const {
  LayerCounts c;
  if (mtp_layers <= 0) return c;
  if (hybrid() && !mtp_pattern.empty()) {
    for (char ch : mtp_pattern) c[KindOfSymbol(ch)] += 1;
  } else {
    c[layer_kind(layers - 1)] = 1;
  }
  return c;
}

std::string ModelSpec::unified_hybrid_pattern() const {
  std::string p = hybrid_pattern;
  for (int64_t d = 0; d < mtp_layers && !mtp_pattern.empty(); ++d) p += "/" + mtp_pattern;
  return p;
}

Status SplitHybridPattern(const std::string& unified, std::string* main, std::string* mtp,
                          int64_t* depths) {
  const size_t slash = unified.find('/');
  *main = unified.substr(0, slash);
  mtp->clear();
  *depths = 0;
  if (slash == std::string::npos) return Status::Ok();
  size_t at = slash;
  while (at != std::string::npos) {
    const size_t next = unified.find('/', at + 1);
    const std::string part =
        unified.substr(at + 1, next == std::string::npos ? std::string::npos : next - at - 1);
    if (part.empty())
      return Status::Error("'" + unified + "': an MTP depth after '/' is empty");
    if (*depths > 0 && part != *mtp)
      return Status::Error("'" + unified + "': MTP depth " + std::to_string(*depths + 1) + " is '" +
                           part + "' but depth 1 is '" + *mtp +
                           "' (Megatron requires every depth the same)");
    *mtp = part;
    ++*depths;
    at = next;
  }
  return Status::Ok();
}

LayerCounts ModelSpec::layer_counts(int64_t first, int64_t n) const {
  LayerCounts c;
  if (n <= 0) return c;
  if (hybrid()) {
    for (int64_t i = first; i < first + n; ++i) c[layer_kind(i)] += 1;
    return c;
  }
  const int64_t e = moe_layers_in(first, n);
  c[LayerKind::kMoe] = double(e);
  c[LayerKind::kDense] = double(n - e);
  return c;
}

bool ModelSpec::is_moe_layer(int64_t i) const {
  if (hybrid())
    return i >= 0 && i < int64_t(hybrid_pattern.size()) && hybrid_pattern[size_t(i)] == 'E';
  if (!moe() || i < moe_dense_layers_first) return false;
  const int64_t step = moe_layer_step > 0 ? moe_layer_step : 1;
  return (i - moe_dense_layers_first) % step == step - 1;
}

int64_t ModelSpec::windowed_layers() const {
  if (sliding_window <= 0) return 0;
  if (global_attention_every <= 0) return layers;
  return layers - layers / global_attention_every;
}

int64_t ModelSpec::moe_layers_in(int64_t first, int64_t n) const {
  if (hybrid()) {
    int64_t e = 0;
    for (int64_t i = std::max<int64_t>(0, first); i < first + n; ++i) e += is_moe_layer(i);
    return e;
  }
  if (!moe() || n <= 0) return 0;
  const int64_t step = moe_layer_step > 0 ? moe_layer_step : 1;
  // MoE layers among [0, x): those j = D + q*step + step-1 < x, q >= 0.
  auto upto = [&](int64_t x) -> int64_t {
    const int64_t y = x - moe_dense_layers_first - (step - 1);
    return y <= 0 ? 0 : (y - 1) / step + 1;
  };
  return upto(first + n) - upto(first);
}

namespace {
int64_t NormParams(const ModelSpec& m, int64_t width) {
  return m.norm == Norm::kLayerNorm ? 2 * width : width;  // gamma (+ beta)
}
}  // namespace

int64_t ModelSpec::attention_linear_params() const {
  if (mla()) {
    // DeepSeek-V2 section 2.1 (eqs. 9-14), Megatron-Core multi_latent_attention.py: q down
    // (h x q_lora) and up (q_lora x a(qk + qk_pos)) or one h x a(qk + qk_pos); kv down
    // (h x (kv_lora + qk_pos)) and up (kv_lora x a(qk + v)); output (a v x h).
    const int64_t qk = qk_head_dim + qk_pos_head_dim;
    const int64_t q = q_lora_rank > 0 ? hidden * q_lora_rank + q_lora_rank * heads * qk
                                      : hidden * heads * qk;
    const int64_t kv = hidden * (kv_lora_rank + qk_pos_head_dim) +
                       kv_lora_rank * heads * (qk_head_dim + v_head_dim);
    return q + kv + heads * v_head_dim * hidden;
  }
  const int64_t d = head_dim();
  return hidden * (heads + 2 * kv_heads) * d + heads * d * hidden;  // QKV + output
}

int64_t ModelSpec::dense_mlp_linear_params() const {
  return (gated() ? 3 : 2) * hidden * ffn_hidden;
}

int64_t ModelSpec::moe_mlp_active_linear_params() const {
  const int64_t shared = (gated() ? 3 : 2) * hidden * moe_shared_ffn_hidden;
  // router + k experts + latent projections + shared
  return hidden * num_experts + moe_topk * expert_params() + 2 * hidden * moe_latent_size +
         shared;
}

int64_t ModelSpec::attention_params() const {
  int64_t p = attention_linear_params() + NormParams(*this, hidden);
  if (mla()) {
    p += NormParams(*this, kv_lora_rank) + (q_lora_rank > 0 ? NormParams(*this, q_lora_rank) : 0);
  } else if (bias) {
    p += (heads + 2 * kv_heads) * head_dim() + hidden;  // QKV and output biases
  }
  return p;
}

int64_t ModelSpec::dense_mlp_params() const {
  int64_t p = dense_mlp_linear_params() + NormParams(*this, hidden);
  if (bias) p += (gated() ? 2 * ffn_hidden : ffn_hidden) + hidden;
  return p;
}

int64_t ModelSpec::routed_expert_params() const {
  int64_t one = expert_params();
  if (bias) one += (gated() ? 2 * moe_ffn_hidden : moe_ffn_hidden) + moe_width();
  return num_experts * one;
}

int64_t ModelSpec::latent_params() const {
  if (moe_latent_size <= 0) return 0;
  return 2 * hidden * moe_latent_size + (bias ? moe_latent_size + hidden : 0);
}

int64_t ModelSpec::moe_mlp_params() const {
  int64_t shared = (gated() ? 3 : 2) * hidden * moe_shared_ffn_hidden;
  if (bias && moe_shared_ffn_hidden > 0)
    shared += (gated() ? 2 : 1) * moe_shared_ffn_hidden + hidden;
  return hidden * num_experts + routed_expert_params() + latent_params() + shared +
         NormParams(*this, hidden);
}

int64_t ModelSpec::mamba_params() const {
  // megatron/core/ssm/mamba_mixer.py: in_proj (no bias), conv1d weight [channels, 1, 4] and
  // bias, A_log, D and dt_bias per head, the gated RMSNorm over d_inner, out_proj (no bias);
  // the layer's pre-norm (MambaLayer).
  return NormParams(*this, hidden) + mamba_linear_params() +
         mamba_conv_channels() * (kMambaConvKernel + 1) + 3 * mamba_num_heads + mamba_inner();
}

int64_t ModelSpec::kind_params(LayerKind k) const {
  switch (k) {
    case LayerKind::kDense: return attention_params() + dense_mlp_params();
    case LayerKind::kMoe: return attention_params() + moe_mlp_params();
    case LayerKind::kMamba: return mamba_params();
    case LayerKind::kAttention: return attention_params();
    case LayerKind::kMlp: return dense_mlp_params();
    case LayerKind::kMoeMlp: return moe_mlp_params();
  }
  return 0;
}

int64_t ModelSpec::kind_active_linear_params(LayerKind k) const {
  switch (k) {
    case LayerKind::kDense: return attention_linear_params() + dense_mlp_linear_params();
    case LayerKind::kMoe: return attention_linear_params() + moe_mlp_active_linear_params();
    case LayerKind::kMamba: return mamba_linear_params();
    case LayerKind::kAttention: return attention_linear_params();
    case LayerKind::kMlp: return dense_mlp_linear_params();
    case LayerKind::kMoeMlp: return moe_mlp_active_linear_params();
  }
  return 0;
}

int64_t ModelSpec::layer_params(int64_t first, int64_t n) const {
  if (hybrid()) {
    int64_t p = 0;
    for (int64_t i = first; i < first + n; ++i) p += kind_params(layer_kind(i));
    return p;
  }
  const int64_t e = moe_layers_in(first, n);
  return n * attention_params() + (n - e) * dense_mlp_params() + e * moe_mlp_params();
}

int64_t ModelSpec::routed_params(int64_t first, int64_t n) const {
  return moe_layers_in(first, n) * routed_expert_params();
}

int64_t ModelSpec::mtp_params() const {
  // DeepSeek-V3 section 2.2: norms of the hidden state and of the next token's embedding, a
  // 2h x h projection, one transformer layer (the MLP of the last layer's kind), or a hybrid
  // model's depth pattern (multi_token_prediction.py: the same enorm, hnorm, eh_proj).
  const LayerCounts c = mtp_layer_counts();
  int64_t layers_p = 0;
  for (int k = 0; k < kLayerKinds; ++k)
    layers_p += int64_t(c.n[size_t(k)]) * kind_params(LayerKind(k));
  return 2 * NormParams(*this, hidden) + 2 * hidden * hidden + layers_p;
}

int64_t ModelSpec::mtp_routed_params() const {
  return moe() ? int64_t(mtp_layer_counts().moe()) * routed_expert_params() : 0;
}

int64_t ModelSpec::padded_vocab(int64_t tp) const {
  const int64_t multiple = 128 * tp;
  return (vocab + multiple - 1) / multiple * multiple;
}

int64_t ModelSpec::linear_params_per_layer() const {
  return attention_linear_params() + dense_mlp_linear_params();
}

int64_t ModelSpec::params_per_layer() const { return attention_params() + dense_mlp_params(); }

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
  return layer_params(0, layers) + vocab * hidden * (tied_embeddings ? 1 : 2) + pos +
         NormParams(*this, hidden);
}

int64_t ModelSpec::active_params() const {
  const int64_t skipped = num_experts > moe_topk ? (num_experts - moe_topk) : 0;
  const int64_t per_expert = num_experts > 0 ? routed_expert_params() / num_experts : 0;
  return total_params() - moe_layers() * skipped * per_expert;
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

// The first broken rule among the head, MoE, MLA and RoPE fields: the key it is about and
// what is wrong ("" when none). Shared by ValidateModel and the YAML reader.
struct Problem {
  std::string key, what;
};
// A hybrid pattern's rules (megatron/core/models/hybrid/hybrid_layer_allocation.py and
// megatron/core/ssm/mamba_mixer.py's asserts), and the Mamba sizes.
Problem HybridProblem(const ModelSpec& m) {
  auto n = [](int64_t v) { return std::to_string(v); };
  const std::string& p = m.hybrid_pattern;
  int64_t mamba = 0, experts = 0;
  for (char c : p) {
    if (c == '|')
      return {"hybrid_pattern", "'" + p + "': pipeline separators '|' are not modelled (the "
                                "planner chooses the split; give the plan's pipeline sizes)"};
    if (c == '/')
      return {"hybrid_pattern", "'" + p + "': the MTP depths after '/' belong in mtp_pattern"};
    if (c == 'G' || c == 'D' || c == '+')
      return {"hybrid_pattern", "'" + p + "': layer symbol '" + std::string(1, c) +
                                "' (gated delta net, DeepSeek sparse attention, MLA) is not "
                                "modelled; M, *, - and E are"};
    if (!IsLayerSymbol(c))
      return {"hybrid_pattern", "'" + p + "': '" + std::string(1, c) +
                                "' is not a layer symbol (M Mamba, * attention, - MLP, E MoE)"};
    mamba += c == 'M';
    experts += c == 'E';
  }
  const bool mamba_set = m.mamba_state_dim || m.mamba_head_dim || m.mamba_num_groups ||
                         m.mamba_num_heads;
  // The MTP depth pattern: Megatron's MTP symbols (no pipeline separators), on a hybrid model
  // with mtp_layers depths.
  for (char c : m.mtp_pattern) {
    if (!IsLayerSymbol(c))
      return {"hybrid_pattern", "MTP depth '" + m.mtp_pattern + "': '" + std::string(1, c) +
                                "' is not a layer symbol ptdp models in an MTP depth (M, *, "
                                "-, E)"};
    mamba += c == 'M';
    experts += c == 'E';
  }
  if (!m.mtp_pattern.empty() && (p.empty() || m.mtp_layers < 1))
    return {"hybrid_pattern", p.empty() ? "MTP depth '" + m.mtp_pattern +
                                              "' needs a main pattern before the '/'"
                                        : "MTP depth '" + m.mtp_pattern + "' with mtp_layers 0"};
  if (!p.empty() && m.mtp_layers > 0 && m.mtp_pattern.empty())
    return {"mtp_layers", "'" + n(m.mtp_layers) + "' on a hybrid model needs its depths in "
                          "hybrid_pattern ('MAIN/DEPTH/...', e.g. '.../*E/*E' for two)"};
  if (p.empty()) {
    if (mamba_set)
      return {m.mamba_state_dim ? "mamba_state_dim" : m.mamba_head_dim ? "mamba_head_dim"
              : m.mamba_num_groups ? "mamba_num_groups" : "mamba_num_heads",
              "is set but hybrid_pattern is empty (no Mamba layers)"};
    return {};
  }
  if (int64_t(p.size()) != m.layers)
    return {"hybrid_pattern", "has " + n(int64_t(p.size())) + " layer symbols but layers is " +
                              n(m.layers)};
  if ((experts > 0) != m.moe())
    return {"hybrid_pattern", experts > 0 ? "has E (MoE) layers but num_experts is 0"
                                          : "has no E layer but num_experts is set"};
  if (m.moe() && (m.moe_dense_layers_first != 0 || m.moe_layer_step != 1))
    return {m.moe_dense_layers_first ? "moe_dense_layers_first" : "moe_layer_step",
            "is set, but a hybrid_pattern places the MoE layers (E)"};
  const char* feature = m.mla() ? "kv_lora_rank (MLA layers, '+')"
                        : m.sliding_window ? "sliding_window"
                        : m.parallel_attn_mlp ? "parallel_attn_mlp" : nullptr;
  if (feature)
    return {feature, "is not modelled with a hybrid_pattern"};
  if (mamba == 0) {
    if (mamba_set)
      return {"hybrid_pattern", "has no M (Mamba) layer but the mamba_* sizes are set"};
    return {};
  }
  for (const auto& [key, v, limit] : std::vector<std::tuple<const char*, int64_t, int64_t>>{
           {"mamba_state_dim", m.mamba_state_dim, 1024},
           {"mamba_head_dim", m.mamba_head_dim, kMaxHeadDim},
           {"mamba_num_groups", m.mamba_num_groups, kMaxHidden},
           {"mamba_num_heads", m.mamba_num_heads, kMaxHidden}})
    if (v < 1 || v > limit)
      return {key, "'" + n(v) + "' must be within 1.." + n(limit) + " (hybrid_pattern has M layers)"};
  if (m.mamba_num_heads % m.mamba_num_groups != 0)
    return {"mamba_num_groups", "'" + n(m.mamba_num_groups) + "' does not divide mamba_num_heads " +
                                    n(m.mamba_num_heads)};
  if (m.mamba_inner() > kMaxFfnHidden)
    return {"mamba_num_heads", "mamba_num_heads x mamba_head_dim " + n(m.mamba_inner()) +
                                   " is larger than the limit " + n(kMaxFfnHidden)};
  return {};
}

Problem FeatureProblem(const ModelSpec& m) {
  auto n = [](int64_t v) { return std::to_string(v); };
  for (const auto& [key, v] : std::vector<std::pair<const char*, int64_t>>{
           {"kv_channels", m.kv_channels}, {"q_lora_rank", m.q_lora_rank},
           {"kv_lora_rank", m.kv_lora_rank}, {"qk_head_dim", m.qk_head_dim},
           {"qk_pos_head_dim", m.qk_pos_head_dim}, {"v_head_dim", m.v_head_dim}})
    if (v < 0 || v > kMaxHeadDim)
      return {key, "'" + n(v) + "' must be within 0.." + n(kMaxHeadDim)};
  if (m.kv_channels == 0 && m.heads > 0 && m.hidden % m.heads != 0)
    return {"heads", "'" + n(m.heads) + "' does not divide hidden " + n(m.hidden) +
                         " (set kv_channels for another head size)"};
  if (!(m.rotary_base > 0) || m.rotary_base > 1e12)
    return {"rotary_base", "must be a number within (0, 1e12]"};
  if (!(m.rotary_percent > 0 && m.rotary_percent <= 1))
    return {"rotary_percent", "must be within (0, 1]"};
  if (m.num_experts < 0 || m.num_experts > kMaxExperts)
    return {"num_experts", "'" + n(m.num_experts) + "' must be within 0.." + n(kMaxExperts)};
  if (m.num_experts == 0) {
    for (const auto& [key, v] : std::vector<std::pair<const char*, int64_t>>{
             {"moe_topk", m.moe_topk}, {"moe_ffn_hidden", m.moe_ffn_hidden},
             {"moe_shared_ffn_hidden", m.moe_shared_ffn_hidden},
             {"moe_dense_layers_first", m.moe_dense_layers_first}})
      if (v != 0) return {key, "is set but num_experts is 0 (a dense model)"};
  } else {
    if (m.moe_topk < 1 || m.moe_topk > m.num_experts)
      return {"moe_topk", "'" + n(m.moe_topk) + "' must be within 1..num_experts " +
                              n(m.num_experts)};
    if (m.moe_ffn_hidden < 1 || m.moe_ffn_hidden > kMaxFfnHidden)
      return {"moe_ffn_hidden", "'" + n(m.moe_ffn_hidden) + "' must be within 1.." +
                                    n(kMaxFfnHidden)};
    if (m.moe_shared_ffn_hidden < 0 || m.moe_shared_ffn_hidden > kMaxFfnHidden)
      return {"moe_shared_ffn_hidden", "'" + n(m.moe_shared_ffn_hidden) + "' must be within 0.." +
                                           n(kMaxFfnHidden)};
    if (m.moe_layer_step < 1 || m.moe_layer_step > m.layers)
      return {"moe_layer_step", "'" + n(m.moe_layer_step) + "' must be within 1..layers " +
                                    n(m.layers)};
    if (m.moe_dense_layers_first < 0 || m.moe_layers() == 0)
      return {"moe_dense_layers_first", "'" + n(m.moe_dense_layers_first) +
                                            "' leaves no MoE layer among the " + n(m.layers)};
    if ((m.moe_routing == MoeRouting::kCapacity) != (m.moe_capacity_factor > 0))
      return {"moe_capacity_factor",
              "must be > 0 exactly when moe_routing is capacity (token dropping)"};
    if (m.moe_capacity_factor < 0 || m.moe_capacity_factor > 1000)
      return {"moe_capacity_factor", "must be within 0..1000"};
  }
  if (m.mla()) {
    if (m.qk_head_dim < 1 || m.qk_pos_head_dim < 1 || m.v_head_dim < 1)
      return {"kv_lora_rank", "multi-latent attention needs qk_head_dim, qk_pos_head_dim and "
                              "v_head_dim > 0"};
    if (m.kv_heads != m.heads)
      return {"kv_heads", "'" + n(m.kv_heads) + "' must equal heads " + n(m.heads) +
                              " with multi-latent attention"};
  } else if (m.q_lora_rank || m.qk_head_dim || m.qk_pos_head_dim || m.v_head_dim) {
    return {m.q_lora_rank ? "q_lora_rank" : m.qk_head_dim ? "qk_head_dim"
            : m.qk_pos_head_dim ? "qk_pos_head_dim" : "v_head_dim",
            "is set but kv_lora_rank is 0 (no multi-latent attention)"};
  }
  if (m.sliding_window < 0 || m.sliding_window > kMaxSeqLen)
    return {"sliding_window", "'" + n(m.sliding_window) + "' must be within 0.." + n(kMaxSeqLen)};
  if (m.global_attention_every < 0 || m.global_attention_every > m.layers ||
      (m.global_attention_every > 0 && m.sliding_window == 0))
    return {"global_attention_every", "'" + n(m.global_attention_every) +
                                          "' must be within 0..layers and needs sliding_window"};
  if (m.mtp_layers < 0 || m.mtp_layers > 16)
    return {"mtp_layers", "'" + n(m.mtp_layers) + "' must be within 0..16"};
  if (m.mtp_repeated && m.mtp_layers == 0)
    return {"mtp_repeated_layer", "is true but the model has no MTP layers"};
  // arguments.py: a positive latent size, on an MoE model.
  if (m.moe_latent_size < 0 || m.moe_latent_size > kMaxHidden)
    return {"moe_latent_size", "'" + n(m.moe_latent_size) + "' must be within 0.." +
                                   n(kMaxHidden)};
  if (m.moe_latent_size > 0 && !m.moe())
    return {"moe_latent_size", "is set but num_experts is 0 (latent projections are for MoE "
                               "layers)"};
  return HybridProblem(m);
}
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
  if (const Problem p = FeatureProblem(m); !p.key.empty()) return err(p.key + " " + p.what);
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
  const std::string act =
      r.Enum("activation", {"gelu", "swiglu", "squared_relu", "geglu"}, "gelu");
  m.activation = act == "swiglu"         ? Activation::kSwiglu
                 : act == "squared_relu" ? Activation::kSquaredRelu
                 : act == "geglu"        ? Activation::kGeglu
                                         : Activation::kGelu;
  m.norm = r.Enum("norm", {"layernorm", "rmsnorm"}, "layernorm") == "rmsnorm" ? Norm::kRmsNorm
                                                                             : Norm::kLayerNorm;
  const std::string pos =
      r.Enum("position_embedding", {"learned", "rope", "alibi", "none"}, "learned");
  m.position = pos == "rope"    ? PositionEmbedding::kRope
               : pos == "alibi" ? PositionEmbedding::kAlibi
               : pos == "none"  ? PositionEmbedding::kNone
                                : PositionEmbedding::kLearned;
  m.tied_embeddings = r.Bool("tied_embeddings", true);
  m.bias = r.Bool("bias", true);
  m.dropout = r.Bool("dropout", true);
  m.kv_channels = r.NonNegativeInt("kv_channels", 0);
  m.rotary_base = r.PositiveNumber("rotary_base", 10000);
  m.rotary_percent = r.PositiveNumber("rotary_percent", 1.0);
  m.parallel_attn_mlp = r.Bool("parallel_attn_mlp", false);
  m.sliding_window = r.NonNegativeInt("sliding_window", 0);
  m.global_attention_every = r.NonNegativeInt("global_attention_every", 0);
  m.num_experts = r.NonNegativeInt("num_experts", 0);
  m.moe_topk = r.NonNegativeInt("moe_topk", 0);
  m.moe_ffn_hidden = r.NonNegativeInt("moe_ffn_hidden", 0);
  m.moe_shared_ffn_hidden = r.NonNegativeInt("moe_shared_ffn_hidden", 0);
  m.moe_dense_layers_first = r.NonNegativeInt("moe_dense_layers_first", 0);
  m.moe_layer_step = r.PositiveInt("moe_layer_step", 1);
  m.moe_router =
      r.Enum("moe_router", {"softmax", "sigmoid"}, "softmax") == "sigmoid" ? MoeRouter::kSigmoid
                                                                           : MoeRouter::kSoftmax;
  const std::string routing =
      r.Enum("moe_routing", {"dropless", "balanced", "capacity"}, "dropless");
  m.moe_routing = routing == "balanced"   ? MoeRouting::kBalanced
                  : routing == "capacity" ? MoeRouting::kCapacity
                                          : MoeRouting::kDropless;
  m.moe_capacity_factor = r.Number("moe_capacity_factor", limits::kMoeCapacityFactor, 0);
  m.moe_aux_loss_coeff = r.Number("moe_aux_loss_coeff", limits::kMoeAuxLossCoeff, 1e-2);
  m.q_lora_rank = r.NonNegativeInt("q_lora_rank", 0);
  m.kv_lora_rank = r.NonNegativeInt("kv_lora_rank", 0);
  m.qk_head_dim = r.NonNegativeInt("qk_head_dim", 0);
  m.qk_pos_head_dim = r.NonNegativeInt("qk_pos_head_dim", 0);
  m.v_head_dim = r.NonNegativeInt("v_head_dim", 0);
  m.mtp_layers = r.NonNegativeInt("mtp_layers", 0);
  m.mtp_repeated = r.Bool("mtp_repeated_layer", false);
  m.moe_latent_size = r.NonNegativeInt("moe_latent_size", 0);
  {
    // Megatron's unified pattern: the MTP depths after '/' set mtp_layers (arguments.py infers
    // --mtp-num-layers from it; a different one given is refused here, not overridden).
    const std::string unified = r.String("hybrid_pattern", "");
    int64_t depths = 0;
    if (Status st = SplitHybridPattern(unified, &m.hybrid_pattern, &m.mtp_pattern, &depths);
        !st.ok()) {
      r.Fail("hybrid_pattern", st.message());
    } else if (depths > 0) {
      if (r.Has("mtp_layers") && m.mtp_layers != depths)
        r.Fail("mtp_layers", "'" + std::to_string(m.mtp_layers) + "' but hybrid_pattern has " +
                                 std::to_string(depths) + " MTP depths after '/'");
      m.mtp_layers = depths;
    }
  }
  // Megatron's defaults (arguments.py: --mamba-state-dim 128, --mamba-head-dim 64,
  // --mamba-num-groups 8; heads: MambaMixer's expand 2, i.e. 2 h / head_dim) when the pattern
  // has M layers and the key is absent.
  const bool mamba = m.hybrid_pattern.find('M') != std::string::npos;
  m.mamba_state_dim = r.NonNegativeInt("mamba_state_dim", mamba ? 128 : 0);
  m.mamba_head_dim = r.NonNegativeInt("mamba_head_dim", mamba ? 64 : 0);
  m.mamba_num_groups = r.NonNegativeInt("mamba_num_groups", mamba ? 8 : 0);
  m.mamba_num_heads = r.NonNegativeInt(
      "mamba_num_heads", mamba && m.mamba_head_dim > 0 ? 2 * m.hidden / m.mamba_head_dim : 0);
  // A size past its limit first: it explains any rule it breaks below.
  for (const auto& [name, value, limit] : SizeLimits(m))
    if (value > limit)
      r.Fail(name, "'" + std::to_string(value) + "' is larger than the limit " +
                       std::to_string(limit));
  if (r.Has("hidden") && r.Has("heads"))
    if (const Problem p = FeatureProblem(m); !p.key.empty()) r.Fail(p.key, p.what);
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

Result<ModelSpec> LoadModel(const std::string& spec) {
  if (spec.rfind("hf:", 0) == 0) return ImportHfConfig(spec.substr(3));
  return LoadModelFile(spec);
}

namespace {
// The shortest text that reads back as `v` (std::to_chars round-trips).
std::string YamlNumber(double v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}
}  // namespace

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
  // The other features only when set, so that a dense GPT's YAML stays as it was.
  if (m.kv_channels) o << in << "kv_channels: " << m.kv_channels << "\n";
  if (m.rotary_base != 10000) o << in << "rotary_base: " << YamlNumber(m.rotary_base) << "\n";
  if (m.rotary_percent != 1) o << in << "rotary_percent: " << YamlNumber(m.rotary_percent) << "\n";
  if (m.parallel_attn_mlp) o << in << "parallel_attn_mlp: true\n";
  if (m.sliding_window) o << in << "sliding_window: " << m.sliding_window << "\n";
  if (m.global_attention_every)
    o << in << "global_attention_every: " << m.global_attention_every << "\n";
  if (m.moe()) {
    o << in << "num_experts: " << m.num_experts << "\n"
      << in << "moe_topk: " << m.moe_topk << "\n"
      << in << "moe_ffn_hidden: " << m.moe_ffn_hidden << "\n";
    if (m.moe_shared_ffn_hidden)
      o << in << "moe_shared_ffn_hidden: " << m.moe_shared_ffn_hidden << "\n";
    if (m.moe_dense_layers_first)
      o << in << "moe_dense_layers_first: " << m.moe_dense_layers_first << "\n";
    if (m.moe_layer_step != 1) o << in << "moe_layer_step: " << m.moe_layer_step << "\n";
    o << in << "moe_router: " << ToString(m.moe_router) << "\n"
      << in << "moe_routing: " << ToString(m.moe_routing) << "\n";
    if (m.moe_capacity_factor > 0)
      o << in << "moe_capacity_factor: " << YamlNumber(m.moe_capacity_factor) << "\n";
    if (m.moe_aux_loss_coeff != 1e-2)
      o << in << "moe_aux_loss_coeff: " << YamlNumber(m.moe_aux_loss_coeff) << "\n";
  }
  if (m.mla())
    o << in << "q_lora_rank: " << m.q_lora_rank << "\n"
      << in << "kv_lora_rank: " << m.kv_lora_rank << "\n"
      << in << "qk_head_dim: " << m.qk_head_dim << "\n"
      << in << "qk_pos_head_dim: " << m.qk_pos_head_dim << "\n"
      << in << "v_head_dim: " << m.v_head_dim << "\n";
  if (m.moe_latent_size) o << in << "moe_latent_size: " << m.moe_latent_size << "\n";
  if (m.mtp_layers) o << in << "mtp_layers: " << m.mtp_layers << "\n";
  if (m.mtp_repeated) o << in << "mtp_repeated_layer: true\n";
  if (m.hybrid()) o << in << "hybrid_pattern: " << YamlQuote(m.unified_hybrid_pattern()) << "\n";
  if (m.mamba_num_heads)
    o << in << "mamba_state_dim: " << m.mamba_state_dim << "\n"
      << in << "mamba_head_dim: " << m.mamba_head_dim << "\n"
      << in << "mamba_num_groups: " << m.mamba_num_groups << "\n"
      << in << "mamba_num_heads: " << m.mamba_num_heads << "\n";
  return o.str();
}

Status CheckGptShaped(const ModelSpec& m) {
  if (m.activation != Activation::kGelu || m.norm != Norm::kLayerNorm ||
      m.position != PositionEmbedding::kLearned || !m.tied_embeddings || !m.bias ||
      m.kv_heads != m.heads)
    return Status::Error("model " + m.name +
                         ": the runtime trains GPT shapes only (gelu, layernorm, learned "
                         "positions, tied embeddings, biases, kv_heads == heads)");
  // Features the runtime does not implement: refused by name, never trained as the model they
  // are not. MoE: dropless top-k routing only (a capacity drops tokens depending on the
  // layout's split, force-balancing routes at random).
  const char* feature =
      m.moe() && m.moe_routing != MoeRouting::kDropless
          ? (m.moe_routing == MoeRouting::kCapacity ? "MoE token dropping (moe_routing capacity)"
                                                    : "forced MoE load balancing (moe_routing balanced)")
                        : m.hybrid() ? "hybrid layer patterns (hybrid_pattern: Mamba, attention-only and MLP-only layers)"
                        : m.mla() ? "multi-latent attention (kv_lora_rank)"
                        : m.moe_latent_size > 0 ? "LatentMoE projections (moe_latent_size)"
                        : m.mtp_layers > 0 ? "multi-token prediction (mtp_layers)"
                        : m.kv_channels > 0 && m.kv_channels * m.heads != m.hidden
                            ? "a head size other than hidden/heads (kv_channels)"
                        : m.sliding_window > 0 ? "sliding-window attention (sliding_window)"
                        : m.parallel_attn_mlp ? "parallel attention and MLP (parallel_attn_mlp)"
                                              : nullptr;
  if (feature)
    return Status::Error("model " + m.name + ": the runtime does not train " + feature +
                         " yet; plan and simulate model it");
  return Status::Ok();
}

}  // namespace ptdp
