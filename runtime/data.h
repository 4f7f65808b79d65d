// Training data for the runtime: a byte-level tokenizer over a text corpus, a train/validation
// split, and deterministic batches split the way Megatron splits them. The sample order depends
// only on the seed and the step, never on the layout, so runs in different layouts see the same
// tokens (the layout-invariance proof relies on it).
//
//   step k's global batch: B sequences, samples k*B .. k*B + B-1 of an endless stream
//   sample i: window perm_e[i mod W] of epoch e = i / W (W windows of s+1 tokens, stride s)
//   DP rank d of D takes sequences [d*B/D, (d+1)*B/D); its micro-batch j the next b of those
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace ptdp::rt {

// Bytes are tokens: vocabulary 256, no unknown token, lossless.
struct ByteTokenizer {
  static constexpr int kVocab = 256;
  static std::vector<int32_t> Encode(const std::string& text);
  static std::string Decode(const std::vector<int32_t>& tokens);  // ids outside 0..255 -> '?'
};

struct TokenCorpus {
  std::vector<int32_t> train;  // the first (1 - val_fraction) of the file
  std::vector<int32_t> val;    // the rest
};

// Reads and tokenizes a text file. Fails (naming the file) when it cannot be read, or when
// either split is shorter than `min_tokens` (one sequence plus its shifted target).
Result<TokenCorpus> LoadCorpus(const std::string& path, double val_fraction, int64_t min_tokens);

class DataLoader {
 public:
  // `tokens` must outlive the loader and hold at least seq_len + 1 tokens.
  // Precondition: seq_len > 0, global_batch > 0.
  DataLoader(const std::vector<int32_t>* tokens, int seq_len, int64_t global_batch, uint64_t seed);

  int seq_len() const { return seq_len_; }
  int64_t windows() const { return windows_; }  // W, sequences per epoch

  // Writes micro-batch `mb_index` (of size `micro_batch`) of DP rank `dp_rank` of `dp` at
  // `step`: (micro_batch, seq_len + 1) tokens, row-major; inputs are [:, :s], targets [:, 1:].
  // Precondition: global_batch % (dp * micro_batch) == 0, mb_index < global_batch/(dp*micro_batch).
  void MicroBatch(int64_t step, int dp_rank, int dp, int micro_batch, int mb_index,
                  int32_t* out) const;
  // The token offset where sample `i` of the stream starts.
  int64_t SampleOffset(int64_t i) const;

 private:
  const std::vector<int32_t>* tokens_;
  int seq_len_;
  int64_t global_batch_;
  uint64_t seed_;
  int64_t windows_;
  // Permutation of the current epoch, computed on demand (one loader per rank thread: it is
  // not shared between threads).
  mutable int64_t perm_epoch_ = -1;
  mutable std::vector<int64_t> perm_;
};

// The validation set: the first `count` windows of `tokens` in order, each seq_len + 1 tokens
// (fewer if the split is short). Row-major (count, seq_len + 1).
std::vector<int32_t> ValidationWindows(const std::vector<int32_t>& tokens, int seq_len, int count);

}  // namespace ptdp::rt
