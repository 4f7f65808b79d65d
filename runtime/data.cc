// Byte tokenizer, corpus split and deterministic batches; see data.h.
#include "runtime/data.h"

#include <cassert>
#include <fstream>
#include <sstream>

#include "core/file_io.h"

namespace ptdp::rt {

std::vector<int32_t> ByteTokenizer::Encode(const std::string& text) {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::Decode(const std::vector<int32_t>& tokens) {
  std::string s(tokens.size(), '?');
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] >= 0 && tokens[i] < kVocab) s[i] = char(tokens[i]);
  return s;
}

Result<TokenCorpus> LoadCorpus(const std::string& path, double val_fraction, int64_t min_tokens) {
  PTDP_ASSIGN_OR_RETURN(const std::string text, ReadFileText(path, "a corpus", kMaxCorpusBytes));
  if (!(val_fraction > 0 && val_fraction < 1))
    return Status::Error("validation fraction " + std::to_string(val_fraction) + " must be in (0, 1)");
  const std::vector<int32_t> all = ByteTokenizer::Encode(text);
  const size_t split = size_t(double(all.size()) * (1 - val_fraction));
  TokenCorpus c;
  c.train.assign(all.begin(), all.begin() + split);
  c.val.assign(all.begin() + split, all.end());
  if (int64_t(c.train.size()) < min_tokens || int64_t(c.val.size()) < min_tokens)
    return Status::Error(path + ": " + std::to_string(all.size()) +
                         " bytes is too short for a split with " + std::to_string(min_tokens) +
                         " tokens on each side");
  return c;
}

DataLoader::DataLoader(const std::vector<int32_t>* tokens, int seq_len, int64_t global_batch,
                       uint64_t seed)
    : tokens_(tokens), seq_len_(seq_len), global_batch_(global_batch), seed_(seed) {
  assert(seq_len > 0 && global_batch > 0 && int64_t(tokens->size()) > seq_len);
  windows_ = (int64_t(tokens->size()) - 1) / seq_len;
}

namespace {

// splitmix64: a fixed, portable generator (std::shuffle's algorithm is not specified).
uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

int64_t DataLoader::SampleOffset(int64_t i) const {
  const int64_t epoch = i / windows_;
  if (epoch != perm_epoch_) {  // Fisher-Yates with a seeded splitmix64
    perm_.resize(size_t(windows_));
    for (int64_t w = 0; w < windows_; ++w) perm_[size_t(w)] = w;
    uint64_t state = seed_ * 0x100000001b3ULL + uint64_t(epoch);
    for (int64_t w = windows_ - 1; w > 0; --w) {
      const int64_t j = int64_t(SplitMix(state) % uint64_t(w + 1));
      std::swap(perm_[size_t(w)], perm_[size_t(j)]);
    }
    perm_epoch_ = epoch;
  }
  return perm_[size_t(i % windows_)] * seq_len_;
}

void DataLoader::MicroBatch(int64_t step, int dp_rank, int dp, int micro_batch, int mb_index,
                            int32_t* out) const {
  assert(global_batch_ % (int64_t(dp) * micro_batch) == 0);
  const int64_t per_rank = global_batch_ / dp;
  const int64_t first = step * global_batch_ + dp_rank * per_rank + int64_t(mb_index) * micro_batch;
  for (int r = 0; r < micro_batch; ++r) {
    const int64_t off = SampleOffset(first + r);
    for (int t = 0; t <= seq_len_; ++t) out[int64_t(r) * (seq_len_ + 1) + t] = (*tokens_)[size_t(off + t)];
  }
}

std::vector<int32_t> ValidationWindows(const std::vector<int32_t>& tokens, int seq_len, int count) {
  std::vector<int32_t> out;
  for (int64_t w = 0; w < count && (w + 1) * seq_len < int64_t(tokens.size()); ++w)
    out.insert(out.end(), tokens.begin() + w * seq_len, tokens.begin() + w * seq_len + seq_len + 1);
  return out;
}

}  // namespace ptdp::rt
