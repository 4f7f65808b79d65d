// Quantities with units, parsed strictly from config text ("300 GB/s", "80 GiB", "5 us",
// "312 TFLOP/s") into SI values (bytes, bytes/s, seconds, FLOP/s), and formatted back.
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"

namespace ptdp {

// What a quantity measures; decides which units are accepted.
enum class Dimension {
  kBytes,      // B, kB, MB, GB, TB (powers of 1000), KiB, MiB, GiB, TiB (powers of 1024)
  kBandwidth,  // bytes/s: B/s, kB/s, MB/s, GB/s, TB/s, GiB/s; bits/s: b/s, kb/s, Mb/s, Gb/s, Tb/s
  kDuration,   // s, ms, us, ns
  kFlopRate,   // FLOP/s, GFLOP/s, TFLOP/s, PFLOP/s
};

// Name of a dimension for messages ("a size such as \"80 GiB\"").
const char* DimensionExample(Dimension dim);

// Parses "<number> <unit>" (space optional). Returns the value in SI units (bytes, bytes/s,
// seconds, FLOP/s). Fails on a bare number, an unknown unit, a unit of another dimension,
// a non-finite, zero or negative value, or one that overflows once converted; the message
// quotes the text and lists valid units. Physical ranges are the caller's (core/limits.h).
Result<double> ParseQuantity(std::string_view text, Dimension dim);

// A plain decimal number, the whole of `text` ("12", "-0.5", "4.9e-324"): strtod would also
// take "inf", "nan" and hex ("0x10"), which no config writes. False when it is not one.
bool ParsePlainNumber(std::string_view text, double* out);

// Same, but zero is accepted (latencies, overheads that may be absent).
Result<double> ParseQuantityAllowZero(std::string_view text, Dimension dim);

// Human-readable output: "80 GiB", "1.50 GB/s", "12.3 ms", "312 TFLOP/s".
std::string FormatBytes(double bytes);          // binary prefixes
std::string FormatBandwidth(double bytes_per_s);  // decimal prefixes, bytes/s
std::string FormatSeconds(double seconds);
std::string FormatFlopRate(double flop_per_s);   // MFLOP/s, GFLOP/s, TFLOP/s, ... by magnitude

// Canonical config spelling that ParseQuantity reads back to the same value (round trip).
std::string QuantityToConfig(double value_si, Dimension dim);

}  // namespace ptdp
