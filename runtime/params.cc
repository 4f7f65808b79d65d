// GPT parameter list, TP shards and layout-independent initialisation; see params.h.
#include "runtime/params.h"

#include <cassert>
#include <cmath>

namespace ptdp::rt {
namespace {

// splitmix64 finaliser: a counter-based hash, the same on every platform.
uint64_t Mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t HashName(const std::string& s) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// Standard normal from two 53-bit uniforms (Box-Muller), a pure function of `key`.
double Normal(uint64_t key) {
  const double u1 = (double(Mix(key) >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = double(Mix(key ^ 0x5bd1e995ULL) >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

ParamSpec Spec(std::string name, std::vector<int64_t> shape, ShardKind shard, InitKind init,
               int layer, int model_layers) {
  ParamSpec p;
  p.model_layers = model_layers;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.shard = shard;
  p.init = init;
  p.layer = layer;
  return p;
}

}  // namespace


std::vector<ParamSpec> GptParams(const ModelSpec& m, int tp) {
  const int64_t h = m.hidden, f = m.ffn_hidden, V = m.padded_vocab(tp);
  std::vector<ParamSpec> ps;
  const int L = int(m.layers);
  ParamSpec word = Spec("embedding.word", {V, h}, ShardKind::kRows, InitKind::kNormal, -1, L);
  word.valid_rows = m.vocab;
  ps.push_back(word);
  ps.push_back(Spec("embedding.position", {m.seq_len, h}, ShardKind::kReplicated,
                    InitKind::kNormal, -1, L));
  for (int l = 0; l < int(m.layers); ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    ps.push_back(Spec(p + "ln1.weight", {h}, ShardKind::kReplicated, InitKind::kOnes, l, L));
    ps.push_back(Spec(p + "ln1.bias", {h}, ShardKind::kReplicated, InitKind::kZeros, l, L));
    ps.push_back(Spec(p + "attn.qkv.weight", {3 * h, h}, ShardKind::kQkvRows, InitKind::kNormal, l, L));
    ps.push_back(Spec(p + "attn.qkv.bias", {3 * h}, ShardKind::kQkvRows, InitKind::kZeros, l, L));
    ps.push_back(Spec(p + "attn.proj.weight", {h, h}, ShardKind::kColumns, InitKind::kScaledNormal, l, L));
    ps.push_back(Spec(p + "attn.proj.bias", {h}, ShardKind::kReplicated, InitKind::kZeros, l, L));
    ps.push_back(Spec(p + "ln2.weight", {h}, ShardKind::kReplicated, InitKind::kOnes, l, L));
    ps.push_back(Spec(p + "ln2.bias", {h}, ShardKind::kReplicated, InitKind::kZeros, l, L));
    if (m.is_moe_layer(l)) {
      const int64_t fe = m.moe_ffn_hidden, fs = m.moe_shared_ffn_hidden;
      ps.push_back(Spec(p + "moe.router.weight", {m.num_experts, h}, ShardKind::kReplicated,
                        InitKind::kNormal, l, L));
      if (fs > 0) {
        ps.push_back(Spec(p + "moe.shared.fc1.weight", {fs, h}, ShardKind::kRows,
                          InitKind::kNormal, l, L));
        ps.push_back(Spec(p + "moe.shared.fc2.weight", {h, fs}, ShardKind::kColumns,
                          InitKind::kScaledNormal, l, L));
      }
      for (int e = 0; e < int(m.num_experts); ++e) {
        const std::string x = p + "moe.experts." + std::to_string(e) + ".";
        ParamSpec fc1 = Spec(x + "fc1.weight", {fe, h}, ShardKind::kRows, InitKind::kNormal, l, L);
        ParamSpec fc2 =
            Spec(x + "fc2.weight", {h, fe}, ShardKind::kColumns, InitKind::kScaledNormal, l, L);
        fc1.expert = fc2.expert = e;
        ps.push_back(fc1);
        ps.push_back(fc2);
      }
      continue;
    }
    ps.push_back(Spec(p + "mlp.fc1.weight", {f, h}, ShardKind::kRows, InitKind::kNormal, l, L));
    ps.push_back(Spec(p + "mlp.fc1.bias", {f}, ShardKind::kRows, InitKind::kZeros, l, L));
    ps.push_back(Spec(p + "mlp.fc2.weight", {h, f}, ShardKind::kColumns, InitKind::kScaledNormal, l, L));
    ps.push_back(Spec(p + "mlp.fc2.bias", {h}, ShardKind::kReplicated, InitKind::kZeros, l, L));
  }
  ps.push_back(Spec("final_ln.weight", {h}, ShardKind::kReplicated, InitKind::kOnes, -1, L));
  ps.push_back(Spec("final_ln.bias", {h}, ShardKind::kReplicated, InitKind::kZeros, -1, L));
  return ps;
}

int64_t GlobalRow(const ParamSpec& p, int tp, int tp_rank, int64_t local_row) {
  const int64_t local_rows = p.shape[0] / tp;
  switch (p.shard) {
    case ShardKind::kRows: return tp_rank * local_rows + local_row;
    case ShardKind::kQkvRows: {
      const int64_t block = p.shape[0] / 3, per_rank = block / tp;  // h, h/t
      return (local_row / per_rank) * block + tp_rank * per_rank + local_row % per_rank;
    }
    default: return local_row;
  }
}

std::vector<int64_t> LocalShape(const ParamSpec& p, int tp) {
  std::vector<int64_t> s = p.shape;
  if (p.shard == ShardKind::kRows || p.shard == ShardKind::kQkvRows) s[0] /= tp;
  if (p.shard == ShardKind::kColumns) s[1] /= tp;
  return s;
}

float InitValue(uint64_t seed, const ParamSpec& p, int64_t index) {
  switch (p.init) {
    case InitKind::kZeros: return 0.0f;
    case InitKind::kOnes: return 1.0f;
    case InitKind::kNormal:
    case InitKind::kScaledNormal: {
      const double std =
          p.init == InitKind::kNormal ? 0.02 : 0.02 / std::sqrt(2.0 * p.model_layers);
      const uint64_t key = Mix(seed ^ Mix(HashName(p.name))) ^ uint64_t(index) * 0xd1342543de82ef95ULL;
      return float(std * Normal(key));
    }
  }
  return 0.0f;
}

void InitShard(const ParamSpec& p, uint64_t seed, int tp, int tp_rank, float* out) {
  const std::vector<int64_t> local = LocalShape(p, tp);
  const int64_t cols = p.shape.size() > 1 ? p.shape[1] : 1;
  const int64_t lrows = local[0], lcols = local.size() > 1 ? local[1] : 1;
  const int64_t col0 = p.shard == ShardKind::kColumns ? tp_rank * lcols : 0;
  for (int64_t i = 0; i < lrows; ++i)
    for (int64_t j = 0; j < lcols; ++j) {
      const int64_t gi = GlobalRow(p, tp, tp_rank, i), gj = col0 + j;
      const bool padded = p.valid_rows >= 0 && gi >= p.valid_rows;
      out[i * lcols + j] = padded ? 0.0f : InitValue(seed, p, gi * cols + gj);
    }
}

}  // namespace ptdp::rt
