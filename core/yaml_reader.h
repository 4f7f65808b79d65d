// Strict reading of one YAML mapping: every key is consumed exactly once, unknown keys are
// errors, and every error names file:line, the key path and the value. Only config-loading
// code includes this header (it pulls in yaml-cpp); the rest of core/ is std-only.
//
//   YamlReader r(node, "configs/models/gpt3-175b.yaml", "model");
//   spec.layers = r.PositiveInt("layers");
//   spec.kv_heads = r.PositiveInt("kv_heads", spec.heads);   // optional, with default
//   PTDP_RETURN_IF_ERROR(r.Finish());                        // first error or unknown key
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/file_io.h"
#include "core/limits.h"
#include "core/status.h"
#include "core/units.h"

namespace ptdp {

// A double-quoted YAML scalar with backslashes and quotes escaped, for writers.
std::string YamlQuote(const std::string& s);

// Loads a YAML file; the error names the file (missing, unreadable, malformed with line).
// `what` names the file's role in messages ("a cluster YAML"), as ReadFileText's.
Result<YAML::Node> LoadYamlFile(const std::string& path, const std::string& what = "",
                                uint64_t max_bytes = kMaxConfigBytes);

// Parses YAML text; `name` stands for the file in messages. Every scalar (keys and values)
// must be well-formed UTF-8: else the error names the file, line and key path and shows the
// bad bytes escaped ("name: '\xffA100' is not valid UTF-8").
Result<YAML::Node> ParseYamlText(const std::string& text, const std::string& name);

class YamlReader {
 public:
  // `node` must be a map (else Finish() reports it); `path` is the key path ("cluster.gpu").
  YamlReader(const YAML::Node& node, std::string file, std::string path);

  bool Has(const std::string& key) const;
  // Required values: a missing key is an error. Optional ones take `fallback` when absent.
  int64_t PositiveInt(const std::string& key);
  int64_t PositiveInt(const std::string& key, int64_t fallback);
  int64_t NonNegativeInt(const std::string& key, int64_t fallback);
  // A positive integer no larger than `max` (<= INT_MAX): sizes kept in an int. A value above
  // `max` is an error naming the limit (never truncated).
  int PositiveIntAtMost(const std::string& key, int64_t max);
  int PositiveIntAtMost(const std::string& key, int64_t max, int fallback);
  int NonNegativeIntAtMost(const std::string& key, int64_t max, int fallback);
  // A finite number > 0.
  double PositiveNumber(const std::string& key, double fallback);
  // A plain number inside `range` (core/limits.h); the message names the value and the range.
  double Number(const std::string& key, const Range& range, double fallback);
  // A quantity with a unit of `range.dim` (which must be set), inside `range` once converted
  // to SI units ("4.9e-324 GB/s" is outside 1 MB/s..1 PB/s); zero only where range.zero_ok.
  double Quantity(const std::string& key, const Range& range);
  double Quantity(const std::string& key, const Range& range, double fallback);
  std::string String(const std::string& key);
  std::string String(const std::string& key, const std::string& fallback);
  bool Bool(const std::string& key, bool fallback);
  // One of `allowed`; the message lists them.
  std::string Enum(const std::string& key, const std::vector<std::string>& allowed,
                   const std::string& fallback);
  // A nested map or sequence, marked as consumed; null node when absent.
  YAML::Node Child(const std::string& key);

  // Records an error found by the caller at `key` (e.g. a cross-field rule).
  void Fail(const std::string& key, const std::string& what);
  // Location prefix "file:line" of `key` (or of the map when absent).
  std::string Where(const std::string& key) const;

  // The first error, or a key given twice, or an unknown key, or OK.
  Status Finish() const;
  const std::string& file() const { return file_; }
  std::string KeyPath(const std::string& key) const;

 private:
  std::optional<YAML::Node> Take(const std::string& key, bool required);
  std::string Value(const YAML::Node& n) const;

  YAML::Node node_;
  std::string file_;
  std::string path_;
  std::vector<std::string> consumed_;
  Status first_error_;
};

}  // namespace ptdp
