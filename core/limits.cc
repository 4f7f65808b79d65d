// Range checks of the limits table; see limits.h.
#include "core/limits.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>

namespace ptdp {
namespace {

// A bound with the largest prefix that keeps the number >= 1 ("1 PB/s", "1 MiB", "60 s").
std::string Bound(double v, const std::optional<Dimension>& dim) {
  struct Prefix {
    const char* name;
    double factor;
  };
  static constexpr Prefix kDecimal[] = {{"E", 1e18}, {"P", 1e15}, {"T", 1e12}, {"G", 1e9},
                                        {"M", 1e6},  {"k", 1e3},  {"", 1}};
  static constexpr Prefix kBinary[] = {{"Ei", 1152921504606846976.0}, {"Pi", 1125899906842624.0},
                                       {"Ti", 1099511627776.0}, {"Gi", 1073741824.0},
                                       {"Mi", 1048576.0}, {"Ki", 1024.0}, {"", 1}};
  static constexpr Prefix kSeconds[] = {{"", 1}, {"m", 1e-3}, {"u", 1e-6}, {"n", 1e-9}};
  char buf[64];
  if (!dim) {
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
  }
  const char* unit = "";
  const Prefix* table = kDecimal;
  size_t n = std::size(kDecimal);
  switch (*dim) {
    case Dimension::kBytes: unit = "B"; table = kBinary; n = std::size(kBinary); break;
    case Dimension::kBandwidth: unit = "B/s"; break;
    case Dimension::kDuration: unit = "s"; table = kSeconds; n = std::size(kSeconds); break;
    case Dimension::kFlopRate: unit = "FLOP/s"; break;
  }
  if (v == 0 || v >= 1e21 || v < 1e-9) {  // past the prefixes: "1e+30 s", "1e-12 s", "0 B"
    std::snprintf(buf, sizeof buf, "%g %s", v, unit);
    return buf;
  }
  size_t i = 0;
  while (i + 1 < n && v / table[i].factor < 1) ++i;
  std::snprintf(buf, sizeof buf, "%g %s%s", v / table[i].factor, table[i].name, unit);
  return buf;
}

}  // namespace

std::string RangeText(const Range& r) {
  std::string s = r.zero_ok && r.min > 0 ? "0 or " : "";
  s += Bound(r.min, r.dim) + ".." + Bound(r.max, r.dim);
  if (r.max_excluded) s += " (" + Bound(r.max, r.dim) + " excluded)";
  return s;
}

bool InRange(double v, const Range& r) {
  if (!std::isfinite(v)) return false;
  if (v == 0 && r.zero_ok) return true;
  return v >= r.min && (r.max_excluded ? v < r.max : v <= r.max);
}

Status CheckRange(double v, const Range& r, std::string_view text) {
  if (InRange(v, r)) return Status::Ok();
  char buf[40];
  for (int digits = 1; digits <= 17; ++digits) {  // the shortest that reads back to v
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v || !std::isfinite(v)) break;
  }
  const std::string shown = text.empty() ? std::string(buf) : std::string(text);
  return Status::Error(shown + " is outside " + RangeText(r));
}

Status CheckCount(int64_t v, int64_t min, int64_t max) {
  if (v >= min && v <= max) return Status::Ok();
  return Status::Error(std::to_string(v) + " is outside " + std::to_string(min) + ".." +
                       std::to_string(max));
}

namespace {

// Length of the well-formed UTF-8 sequence at s[i], or 0 (Unicode 15, table 3-7).
size_t Utf8Length(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c >= 0xE0 && c <= 0xEF) { n = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
  else if (c >= 0xF0 && c <= 0xF4) { n = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
  else return 0;
  if (i + n > s.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  return n;
}

}  // namespace

bool IsUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8Length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string EscapeBytes(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8Length(s, i);
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (n == 0 || (n == 1 && ((c < 0x20 && c != '\t') || c == 0x7F))) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

}  // namespace ptdp
