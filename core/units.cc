// Strict unit parsing: a value without a unit is an error, so "300" can never silently mean
// 300 bytes where 300 GB/s was meant.
#include "core/units.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace ptdp {

bool ParsePlainNumber(std::string_view text, double* out) {
  if (text.empty() || text.find_first_not_of("0123456789.eE+-") != std::string_view::npos)
    return false;
  const std::string s(text);
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

namespace {

struct UnitEntry {
  const char* name;   // as written in config files (case-sensitive: Gb/s is bits, GB/s bytes)
  double factor;      // multiply the number by this to get SI
};

// clang-format off
constexpr UnitEntry kBytesUnits[] = {
  {"B", 1}, {"kB", 1e3}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
  {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
};
constexpr UnitEntry kBandwidthUnits[] = {
  {"B/s", 1}, {"kB/s", 1e3}, {"KB/s", 1e3}, {"MB/s", 1e6}, {"GB/s", 1e9}, {"TB/s", 1e12},
  {"KiB/s", 1024.0}, {"MiB/s", 1048576.0}, {"GiB/s", 1073741824.0},
  {"b/s", 1.0 / 8}, {"kb/s", 1e3 / 8}, {"Kb/s", 1e3 / 8}, {"Mb/s", 1e6 / 8}, {"Gb/s", 1e9 / 8},
  {"Tb/s", 1e12 / 8}, {"Gbps", 1e9 / 8}, {"Mbps", 1e6 / 8},
};
constexpr UnitEntry kDurationUnits[] = {
  {"s", 1}, {"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9},
};
constexpr UnitEntry kFlopUnits[] = {
  {"FLOP/s", 1}, {"GFLOP/s", 1e9}, {"TFLOP/s", 1e12}, {"PFLOP/s", 1e15},
  {"GFLOPS", 1e9}, {"TFLOPS", 1e12}, {"PFLOPS", 1e15},
};
// clang-format on

template <size_t N>
std::string UnitList(const UnitEntry (&units)[N]) {
  std::string out;
  for (size_t i = 0; i < N; ++i) {
    if (i) out += ", ";
    out += units[i].name;
  }
  return out;
}

template <size_t N>
const UnitEntry* FindUnit(const UnitEntry (&units)[N], std::string_view name) {
  for (const auto& u : units)
    if (name == u.name) return &u;
  return nullptr;
}


Result<double> Parse(std::string_view text, Dimension dim, bool allow_zero) {
  const std::string quoted = "\"" + std::string(text) + "\"";
  std::string s(text);
  // Trim.
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  if (b == std::string::npos)
    return Status::Error("empty value, expected " + std::string(DimensionExample(dim)));
  s = s.substr(b, e - b + 1);
  const char* begin = s.c_str();
  char* end = nullptr;
  double number = std::strtod(begin, &end);
  if (end == begin)
    return Status::Error(quoted + " does not start with a number, expected " +
                         DimensionExample(dim));
  if (!std::isfinite(number)) return Status::Error(quoted + " is not a finite number");
  // Plain decimal numbers only: strtod also takes hex ("0x10").
  double plain = 0;
  const bool decimal = ParsePlainNumber(std::string_view(begin, size_t(end - begin)), &plain);
  if (!decimal)
    return Status::Error(quoted + " does not start with a number in decimal, expected " +
                         DimensionExample(dim));
  std::string unit(end);
  size_t ub = unit.find_first_not_of(" \t");
  unit = ub == std::string::npos ? "" : unit.substr(ub);
  if (unit.empty())
    return Status::Error(quoted + " has no unit, expected " + DimensionExample(dim));
  const UnitEntry* u = nullptr;
  std::string valid;
  switch (dim) {
    case Dimension::kBytes: u = FindUnit(kBytesUnits, unit); valid = UnitList(kBytesUnits); break;
    case Dimension::kBandwidth:
      u = FindUnit(kBandwidthUnits, unit); valid = UnitList(kBandwidthUnits); break;
    case Dimension::kDuration:
      u = FindUnit(kDurationUnits, unit); valid = UnitList(kDurationUnits); break;
    case Dimension::kFlopRate: u = FindUnit(kFlopUnits, unit); valid = UnitList(kFlopUnits); break;
  }
  if (!u)
    return Status::Error(quoted + ": unknown unit \"" + unit + "\" (valid: " + valid + ")");
  if (number < 0) return Status::Error(quoted + " is negative");
  if (number == 0 && !allow_zero) return Status::Error(quoted + " is zero");
  // "1e308 GiB" is finite as written but not once converted to bytes.
  const double si = number * u->factor;
  if (!std::isfinite(si)) return Status::Error(quoted + " overflows once converted to SI units");
  return si;
}

std::string Fmt(double v, const char* unit) {
  char buf[64];
  if (v >= 100 || v == std::floor(v))
    std::snprintf(buf, sizeof buf, "%.0f %s", v, unit);
  else if (v >= 10)
    std::snprintf(buf, sizeof buf, "%.1f %s", v, unit);
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, unit);
  return buf;
}

}  // namespace

const char* DimensionExample(Dimension dim) {
  switch (dim) {
    case Dimension::kBytes: return "a size such as \"80 GiB\"";
    case Dimension::kBandwidth: return "a bandwidth such as \"300 GB/s\" or \"200 Gb/s\"";
    case Dimension::kDuration: return "a duration such as \"5 us\"";
    case Dimension::kFlopRate: return "a rate such as \"312 TFLOP/s\"";
  }
  return "a quantity with a unit";
}

Result<double> ParseQuantity(std::string_view text, Dimension dim) {
  return Parse(text, dim, /*allow_zero=*/false);
}
Result<double> ParseQuantityAllowZero(std::string_view text, Dimension dim) {
  return Parse(text, dim, /*allow_zero=*/true);
}

std::string FormatBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int i = 0;
  while (bytes >= 1023.5 && i < 5) { bytes /= 1024; ++i; }
  return Fmt(bytes, units[i]);
}
std::string FormatBandwidth(double bps) {
  const char* units[] = {"B/s", "kB/s", "MB/s", "GB/s", "TB/s"};
  int i = 0;
  while (bps >= 999.5 && i < 4) { bps /= 1000; ++i; }
  return Fmt(bps, units[i]);
}
std::string FormatSeconds(double s) {
  if (s >= 0.9995) return Fmt(s, "s");
  if (s >= 0.9995e-3) return Fmt(s * 1e3, "ms");
  if (s >= 0.9995e-6) return Fmt(s * 1e6, "us");
  return Fmt(s * 1e9, "ns");
}
std::string FormatFlopRate(double f) {
  const char* units[] = {"FLOP/s", "kFLOP/s", "MFLOP/s", "GFLOP/s", "TFLOP/s", "PFLOP/s"};
  int i = 0;
  while (f >= 999.5 && i < 5) { f /= 1000; ++i; }
  return Fmt(f, units[i]);
}

std::string QuantityToConfig(double v, Dimension dim) {
  char buf[64];
  const char* unit = "B";
  switch (dim) {
    case Dimension::kBytes: unit = "B"; break;
    case Dimension::kBandwidth: unit = "B/s"; break;
    case Dimension::kDuration: unit = "s"; break;
    case Dimension::kFlopRate: unit = "FLOP/s"; break;
  }
  std::snprintf(buf, sizeof buf, "%.17g %s", v, unit);
  return buf;
}

}  // namespace ptdp
