// Strict YAML map reader; see yaml_reader.h.
#include "core/yaml_reader.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "core/file_io.h"

namespace ptdp {

std::string YamlQuote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') { out += "\\n"; continue; }
    out += c;
  }
  return out + "\"";
}

namespace {
// The first scalar of `n` (a key or a value, at any depth) that is not well-formed UTF-8.
Status CheckUtf8(const YAML::Node& n, const std::string& name, const std::string& path) {
  auto bad = [&](const YAML::Node& at, const std::string& where) {
    const std::string line = at.Mark().is_null() ? "" : ":" + std::to_string(at.Mark().line + 1);
    return Status::Error(name + line + ": " + (where.empty() ? "the top level" : where) + ": '" +
                         EscapeBytes(at.Scalar()) + "' is not valid UTF-8");
  };
  if (n.IsScalar()) return IsUtf8(n.Scalar()) ? Status::Ok() : bad(n, path);
  if (n.IsSequence()) {
    for (size_t i = 0; i < n.size(); ++i)
      PTDP_RETURN_IF_ERROR(CheckUtf8(n[i], name, path + "[" + std::to_string(i) + "]"));
  } else if (n.IsMap()) {
    for (auto it = n.begin(); it != n.end(); ++it) {
      const std::string key = it->first.IsScalar() ? it->first.Scalar() : "?";
      const std::string child = path.empty() ? EscapeBytes(key) : path + "." + EscapeBytes(key);
      PTDP_RETURN_IF_ERROR(CheckUtf8(it->first, name, child));
      PTDP_RETURN_IF_ERROR(CheckUtf8(it->second, name, child));
    }
  }
  return Status::Ok();
}
}  // namespace

Result<YAML::Node> ParseYamlText(const std::string& text, const std::string& name) {
  try {
    YAML::Node n = YAML::Load(text);
    if (!n.IsDefined() || n.IsNull()) return Status::Error(name + ": file is empty");
    PTDP_RETURN_IF_ERROR(CheckUtf8(n, name, ""));
    return n;
  } catch (const YAML::Exception& e) {
    return Status::Error(name + ":" + std::to_string(e.mark.line + 1) +
                         ": malformed YAML: " + e.msg);
  }
}

Result<YAML::Node> LoadYamlFile(const std::string& path, const std::string& what,
                                uint64_t max_bytes) {
  PTDP_ASSIGN_OR_RETURN(const std::string text, ReadFileText(path, what, max_bytes));
  return ParseYamlText(text, path);
}

YamlReader::YamlReader(const YAML::Node& node, std::string file, std::string path)
    : node_(node), file_(std::move(file)), path_(std::move(path)) {
  if (!node_.IsMap()) {
    std::string line = node_.Mark().is_null() ? "" : ":" + std::to_string(node_.Mark().line + 1);
    first_error_ = Status::Error(file_ + line + ": " + (path_.empty() ? "the top level" : "'" + path_ + "'") +
                                 " must be a mapping of keys");
  }
}

std::string YamlReader::KeyPath(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

std::string YamlReader::Where(const std::string& key) const {
  YAML::Mark m = node_.Mark();
  if (node_.IsMap()) {
    for (auto it = node_.begin(); it != node_.end(); ++it)
      if (it->first.Scalar() == key) { m = it->first.Mark(); break; }
  }
  return m.is_null() ? file_ : file_ + ":" + std::to_string(m.line + 1);
}

void YamlReader::Fail(const std::string& key, const std::string& what) {
  if (!first_error_.ok()) return;
  first_error_ = Status::Error(Where(key) + ": " + KeyPath(key) + ": " + what);
}

bool YamlReader::Has(const std::string& key) const {
  return node_.IsMap() && node_[key].IsDefined() && !node_[key].IsNull();
}

std::optional<YAML::Node> YamlReader::Take(const std::string& key, bool required) {
  if (!node_.IsMap()) return std::nullopt;
  consumed_.push_back(key);
  YAML::Node n = node_[key];
  if (!n.IsDefined() || n.IsNull()) {
    if (required) Fail(key, "missing required key");
    return std::nullopt;
  }
  return n;
}

std::string YamlReader::Value(const YAML::Node& n) const {
  if (n.IsScalar()) return "'" + n.Scalar() + "'";
  return n.IsMap() ? "a mapping" : "a list";
}

namespace {
bool ParseInt(const YAML::Node& n, int64_t* out) {
  if (!n.IsScalar()) return false;
  const std::string& s = n.Scalar();
  if (s.empty()) return false;
  size_t pos = 0;
  try {
    long long v = std::stoll(s, &pos, 10);
    if (pos != s.size()) return false;
    *out = v;
    return true;
  } catch (...) {
    return false;
  }
}
}  // namespace

int64_t YamlReader::PositiveInt(const std::string& key) {
  auto n = Take(key, true);
  if (!n) return 1;
  int64_t v = 0;
  if (!ParseInt(*n, &v)) { Fail(key, Value(*n) + " is not an integer"); return 1; }
  if (v <= 0) { Fail(key, Value(*n) + " must be positive"); return 1; }
  return v;
}

int64_t YamlReader::PositiveInt(const std::string& key, int64_t fallback) {
  if (!Has(key)) { consumed_.push_back(key); return fallback; }
  return PositiveInt(key);
}

int64_t YamlReader::NonNegativeInt(const std::string& key, int64_t fallback) {
  auto n = Take(key, false);
  if (!n) return fallback;
  int64_t v = 0;
  if (!ParseInt(*n, &v)) { Fail(key, Value(*n) + " is not an integer"); return fallback; }
  if (v < 0) { Fail(key, Value(*n) + " must not be negative"); return fallback; }
  return v;
}

namespace {
std::string Limit(int64_t v, int64_t max) {
  return "'" + std::to_string(v) + "' is larger than the limit " + std::to_string(max);
}
}  // namespace

int YamlReader::PositiveIntAtMost(const std::string& key, int64_t max) {
  const int64_t v = PositiveInt(key);
  if (v > max) { Fail(key, Limit(v, max)); return 1; }
  return int(v);
}

int YamlReader::PositiveIntAtMost(const std::string& key, int64_t max, int fallback) {
  if (!Has(key)) { consumed_.push_back(key); return fallback; }
  return PositiveIntAtMost(key, max);
}

int YamlReader::NonNegativeIntAtMost(const std::string& key, int64_t max, int fallback) {
  const int64_t v = NonNegativeInt(key, fallback);
  if (v > max) { Fail(key, Limit(v, max)); return fallback; }
  return int(v);
}

namespace {
bool ParseNumber(const YAML::Node& n, double* out) {
  return n.IsScalar() && ParsePlainNumber(n.Scalar(), out);
}
}  // namespace

double YamlReader::PositiveNumber(const std::string& key, double fallback) {
  auto n = Take(key, false);
  if (!n) return fallback;
  double v = 0;
  if (!ParseNumber(*n, &v)) { Fail(key, Value(*n) + " is not a number"); return fallback; }
  if (!std::isfinite(v)) { Fail(key, Value(*n) + " is not finite"); return fallback; }
  if (!(v > 0)) { Fail(key, Value(*n) + " must be positive"); return fallback; }
  return v;
}

double YamlReader::Number(const std::string& key, const Range& range, double fallback) {
  auto n = Take(key, false);
  if (!n) return fallback;
  double v = 0;
  if (!ParseNumber(*n, &v)) { Fail(key, Value(*n) + " is not a number"); return fallback; }
  if (Status st = CheckRange(v, range, Value(*n)); !st.ok()) {
    Fail(key, st.message());
    return fallback;
  }
  return v;
}

double YamlReader::Quantity(const std::string& key, const Range& range) {
  const Dimension dim = range.dim.value_or(Dimension::kBytes);
  auto n = Take(key, true);
  if (!n) return range.min;
  if (!n->IsScalar()) { Fail(key, Value(*n) + " is not " + DimensionExample(dim)); return range.min; }
  auto r = range.zero_ok ? ParseQuantityAllowZero(n->Scalar(), dim) : ParseQuantity(n->Scalar(), dim);
  if (!r.ok()) { Fail(key, r.status().message()); return range.min; }
  if (Status st = CheckRange(*r, range, Value(*n)); !st.ok()) {
    Fail(key, st.message());
    return range.min;
  }
  return *r;
}

double YamlReader::Quantity(const std::string& key, const Range& range, double fallback) {
  if (!Has(key)) { consumed_.push_back(key); return fallback; }
  return Quantity(key, range);
}

std::string YamlReader::String(const std::string& key) {
  auto n = Take(key, true);
  if (!n) return "";
  if (!n->IsScalar()) { Fail(key, Value(*n) + " is not a string"); return ""; }
  return n->Scalar();
}

std::string YamlReader::String(const std::string& key, const std::string& fallback) {
  if (!Has(key)) { consumed_.push_back(key); return fallback; }
  return String(key);
}

bool YamlReader::Bool(const std::string& key, bool fallback) {
  auto n = Take(key, false);
  if (!n) return fallback;
  const std::string s = n->IsScalar() ? n->Scalar() : "";
  if (s == "true" || s == "on" || s == "yes") return true;
  if (s == "false" || s == "off" || s == "no") return false;
  Fail(key, Value(*n) + " is not a boolean (true/false)");
  return fallback;
}

std::string YamlReader::Enum(const std::string& key, const std::vector<std::string>& allowed,
                             const std::string& fallback) {
  auto n = Take(key, false);
  if (!n) return fallback;
  const std::string s = n->IsScalar() ? n->Scalar() : "";
  if (std::find(allowed.begin(), allowed.end(), s) != allowed.end()) return s;
  std::string list;
  for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
  Fail(key, Value(*n) + " is not one of: " + list);
  return fallback;
}

YAML::Node YamlReader::Child(const std::string& key) {
  auto n = Take(key, false);
  return n ? *n : YAML::Node();
}

Status YamlReader::Finish() const {
  if (!first_error_.ok()) return first_error_;
  // A key given twice: yaml-cpp would silently use one of the values. One pass with a hash
  // set of the keys seen (a pairwise check took minutes on a crafted file of 100k keys).
  std::unordered_map<std::string, int> first_line;
  first_line.reserve(node_.size());
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    const auto [at, fresh] = first_line.emplace(it->first.Scalar(), it->first.Mark().line + 1);
    if (!fresh)
      return Status::Error(file_ + ":" + std::to_string(it->first.Mark().line + 1) +
                           ": duplicate key '" + KeyPath(it->first.Scalar()) +
                           "' (first at line " + std::to_string(at->second) + ")");
  }
  const std::unordered_set<std::string> consumed(consumed_.begin(), consumed_.end());
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    const std::string k = it->first.Scalar();
    if (!consumed.count(k)) {
      std::string valid;
      for (const auto& c : consumed_)
        if (valid.find(c) == std::string::npos) valid += (valid.empty() ? "" : ", ") + c;
      return Status::Error(file_ + ":" + std::to_string(it->first.Mark().line + 1) +
                           ": unknown key '" + KeyPath(k) + "' (valid keys: " + valid + ")");
    }
  }
  return Status::Ok();
}

}  // namespace ptdp
