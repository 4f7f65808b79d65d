// Quantities with units: strict parsing into SI, formatting, and the config round trip.
#include "core/units.h"
#include "core/limits.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

namespace ptdp {
namespace {

using ::testing::HasSubstr;

struct Good {
  const char* text;
  Dimension dim;
  double si;  // expected SI value, derived by hand
};

TEST(ParseQuantityTest, GoodCases) {
  const Good cases[] = {
      {"300 GB/s", Dimension::kBandwidth, 3e11},          // 300 * 1e9 bytes/s
      {"200 Gb/s", Dimension::kBandwidth, 2.5e10},        // 200e9 bits/s / 8 bits per byte
      {"100 Gbps", Dimension::kBandwidth, 1.25e10},       // 100e9 / 8
      {"300GB/s", Dimension::kBandwidth, 3e11},           // space optional
      {"  25 GB/s  ", Dimension::kBandwidth, 2.5e10},     // surrounding blanks trimmed
      {"80 GiB", Dimension::kBytes, 80.0 * 1073741824},   // 80 * 2^30
      {"80 GB", Dimension::kBytes, 8e10},                 // decimal prefix
      {"4 KiB", Dimension::kBytes, 4096},                 // 4 * 2^10
      {"1 TiB", Dimension::kBytes, 1099511627776.0},      // 2^40
      {"5 us", Dimension::kDuration, 5e-6},
      {"1.5 ms", Dimension::kDuration, 1.5e-3},
      {"2 s", Dimension::kDuration, 2},
      {"700 ns", Dimension::kDuration, 7e-7},
      {"312 TFLOP/s", Dimension::kFlopRate, 3.12e14},     // A100 bf16 dense peak
      {"989 TFLOPS", Dimension::kFlopRate, 9.89e14},      // H100 SXM bf16 dense peak
      {"1.5 PFLOP/s", Dimension::kFlopRate, 1.5e15},
      {"1e3 GB/s", Dimension::kBandwidth, 1e12},          // exponent notation
  };
  for (const Good& c : cases) {
    SCOPED_TRACE(c.text);
    Result<double> r = ParseQuantity(c.text, c.dim);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_DOUBLE_EQ(*r, c.si);
  }
}

struct Bad {
  const char* text;
  Dimension dim;
  const char* in_message;  // a piece the error must contain
};

TEST(ParseQuantityTest, BadCases) {
  const Bad cases[] = {
      {"300", Dimension::kBandwidth, "has no unit"},         // a bare number is never bytes/s
      {"300 GX/s", Dimension::kBandwidth, "unknown unit \"GX/s\""},
      {"-5 us", Dimension::kDuration, "negative"},
      {"0 GB", Dimension::kBytes, "zero"},
      {"abc", Dimension::kBytes, "does not start with a number"},
      {"", Dimension::kBytes, "empty"},
      {"   ", Dimension::kDuration, "empty"},
      {"5 us", Dimension::kBandwidth, "unknown unit \"us\""},  // a duration is no bandwidth
      {"80 GiB", Dimension::kDuration, "unknown unit \"GiB\""},
      {"300 GB/s", Dimension::kBytes, "unknown unit \"GB/s\""},
      {"312 TFLOP/s", Dimension::kBandwidth, "unknown unit"},
      {"300 gb/s", Dimension::kBandwidth, "unknown unit"},     // units are case-sensitive
      {"inf GB", Dimension::kBytes, "not a finite number"},
      {"nan GB", Dimension::kBytes, "not a finite number"},
      {"5 us extra", Dimension::kDuration, "unknown unit"},
  };
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.text);
    Result<double> r = ParseQuantity(c.text, c.dim);
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r.status().message(), HasSubstr(c.in_message));
  }
}

TEST(ParseQuantityTest, ErrorQuotesTextAndListsUnits) {
  Result<double> r = ParseQuantity("300 GX/s", Dimension::kBandwidth);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("\"300 GX/s\""));
  EXPECT_THAT(r.status().message(), HasSubstr("GB/s"));
  EXPECT_THAT(r.status().message(), HasSubstr("Gb/s"));
  // A bare number's message says what was expected.
  r = ParseQuantity("300", Dimension::kBandwidth);
  EXPECT_THAT(r.status().message(), HasSubstr("300 GB/s"));
}

TEST(ParseQuantityTest, AllowZeroAcceptsZeroButNotNegative) {
  Result<double> r = ParseQuantityAllowZero("0 us", Dimension::kDuration);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, 0.0);
  EXPECT_FALSE(ParseQuantityAllowZero("-1 us", Dimension::kDuration).ok());
  EXPECT_FALSE(ParseQuantityAllowZero("0", Dimension::kDuration).ok());  // still needs a unit
}

TEST(QuantityToConfigTest, RoundTripIsExact) {
  struct Case {
    double si;
    Dimension dim;
  };
  const Case cases[] = {
      {3e11, Dimension::kBandwidth},       {2.5e10, Dimension::kBandwidth},
      {1.0 / 3.0 * 1e9, Dimension::kBandwidth},  // not representable in few digits
      {80.0 * 1073741824, Dimension::kBytes},     {1, Dimension::kBytes},
      {5e-6, Dimension::kDuration},        {1.5e-3, Dimension::kDuration},
      {0.1, Dimension::kDuration},         {3.12e14, Dimension::kFlopRate},
      {9.89e14, Dimension::kFlopRate},
  };
  for (const Case& c : cases) {
    const std::string text = QuantityToConfig(c.si, c.dim);
    SCOPED_TRACE(text);
    Result<double> back = ParseQuantity(text, c.dim);
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_EQ(*back, c.si);  // bit-exact: %.17g round-trips a double
  }
}

TEST(FormatTest, HumanReadableOutputs) {
  // Whole values print without decimals; below 10 two decimals, below 100 one.
  EXPECT_EQ(FormatBytes(80.0 * 1073741824), "80 GiB");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1.5 * 1048576), "1.50 MiB");
  EXPECT_EQ(FormatBandwidth(1.5e9), "1.50 GB/s");
  EXPECT_EQ(FormatBandwidth(3e11), "300 GB/s");
  EXPECT_EQ(FormatBandwidth(2.5e10), "25 GB/s");
  EXPECT_EQ(FormatSeconds(0.0123), "12.3 ms");   // 12.3 ms, one decimal between 10 and 100
  EXPECT_EQ(FormatSeconds(2), "2 s");
  EXPECT_EQ(FormatSeconds(250e-6), "250 us");
  EXPECT_EQ(FormatSeconds(40e-9), "40 ns");
  EXPECT_EQ(FormatFlopRate(3.12e14), "312 TFLOP/s");
  EXPECT_EQ(FormatFlopRate(1.5e15), "1.50 PFLOP/s");
  EXPECT_EQ(FormatFlopRate(5e10), "50 GFLOP/s");
  // The prefix suits the magnitude: a CPU rank slot's 15.8 GFLOP/s is not "0.0 TFLOP/s".
  EXPECT_EQ(FormatFlopRate(1.58e10), "15.8 GFLOP/s");
  EXPECT_EQ(FormatFlopRate(8.66e9), "8.66 GFLOP/s");
  EXPECT_EQ(FormatFlopRate(2.5e8), "250 MFLOP/s");
  EXPECT_EQ(FormatFlopRate(1.79e14), "179 TFLOP/s");
  // 999.7 GFLOP/s rounds to 1000 in three figures: it prints as the next unit.
  EXPECT_EQ(FormatFlopRate(9.997e11), "1.00 TFLOP/s");
  EXPECT_EQ(FormatFlopRate(0), "0 FLOP/s");
}

TEST(FormatTest, DimensionExampleNamesAUnit) {
  EXPECT_THAT(DimensionExample(Dimension::kBytes), HasSubstr("GiB"));
  EXPECT_THAT(DimensionExample(Dimension::kBandwidth), HasSubstr("GB/s"));
  EXPECT_THAT(DimensionExample(Dimension::kDuration), HasSubstr("us"));
  EXPECT_THAT(DimensionExample(Dimension::kFlopRate), HasSubstr("TFLOP/s"));
}

// "1e308 GiB" is a finite number as written, but 1e308 * 2^30 bytes is not.
TEST(ParseQuantityTest, RefusesAValueThatOverflowsOnceConverted) {
  auto r = ParseQuantity("1e308 GiB", Dimension::kBytes);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("\"1e308 GiB\" overflows"));
  EXPECT_FALSE(ParseQuantity("1e308 TFLOP/s", Dimension::kFlopRate).ok());
  EXPECT_TRUE(ParseQuantity("1e290 GiB", Dimension::kBytes).ok());  // 1.07e299: finite (the range is the caller's)
}

// The range text of every row names its bounds with a unit a reader knows.
TEST(LimitsTest, RangeTextNamesTheBoundsWithUnits) {
  EXPECT_EQ(RangeText(limits::kGpuMemory), "1 MiB..1 PiB");
  EXPECT_EQ(RangeText(limits::kBandwidth), "1 MB/s..1 PB/s");
  EXPECT_EQ(RangeText(limits::kLatency), "0 or 1 ns..1 s");
  EXPECT_EQ(RangeText(limits::kPeakFlops), "1 MFLOP/s..1 EFLOP/s");
  EXPECT_EQ(RangeText(limits::kOversubscription), "1..1000");
  EXPECT_EQ(RangeText(limits::kAdamBeta), "0..1 (1 excluded)");
}

// One case per kind of extreme value, against the bandwidth row (1e6..1e15 bytes/s).
TEST(LimitsTest, RefusesEveryExtremeValue) {
  struct Case {
    double v;
    bool ok;
  };
  const Case cases[] = {
      {1e6, true},    {1e15, true},   {3e11, true},     // the bounds and an A100's NVLink
      {0, false},     {-0.0, false},  {-3e11, false},   // zero, negative zero, negative
      {4.9e-324, false},                                // the smallest denormal
      {1e308, false}, {std::numeric_limits<double>::infinity(), false},
      {-std::numeric_limits<double>::infinity(), false},
      {std::numeric_limits<double>::quiet_NaN(), false},
  };
  for (const Case& c : cases) EXPECT_EQ(InRange(c.v, limits::kBandwidth), c.ok) << c.v;
  // zero_ok: a latency may be 0 (absent) but not 0.5 ns; beta may be 0 but not 1.
  EXPECT_TRUE(InRange(0, limits::kLatency));
  EXPECT_FALSE(InRange(0.5e-9, limits::kLatency));
  EXPECT_TRUE(InRange(0, limits::kAdamBeta));
  EXPECT_FALSE(InRange(1, limits::kAdamBeta));
  EXPECT_TRUE(InRange(0.999, limits::kAdamBeta));
}

TEST(LimitsTest, MessageNamesTheValueAsWrittenAndTheRange) {
  EXPECT_EQ(CheckRange(4.9e-324, limits::kBandwidth, "'4.9e-324 GB/s'").message(),
            "'4.9e-324 GB/s' is outside 1 MB/s..1 PB/s");
  // Without the text, the shortest spelling of the value.
  EXPECT_EQ(CheckRange(-0.1, limits::kMinLearningRate).message(), "-0.1 is outside 0..1");
  EXPECT_EQ(CheckRange(std::nan(""), limits::kOversubscription).message(),
            "nan is outside 1..1000");
  EXPECT_EQ(CheckCount(9223372036854775807, 0, kMaxSteps).message(),
            "9223372036854775807 is outside 0..1000000000");
}

// Every row admits real hardware (by hand: the shipped configs and a few known extremes).
TEST(LimitsTest, RangesAdmitRealHardware) {
  EXPECT_TRUE(InRange(2 * 1073741824.0, limits::kGpuMemory));        // a local-cpu rank slot
  EXPECT_TRUE(InRange(192 * 1073741824.0, limits::kGpuMemory));      // B200
  EXPECT_TRUE(InRange(13.5e12 * 1.0, limits::kGpuMemory));           // a whole NVL72 rack's HBM
  EXPECT_TRUE(InRange(8e12, limits::kBandwidth));                    // B200 HBM3e
  EXPECT_TRUE(InRange(130e12, limits::kBandwidth));                  // NVL72 NVLink domain
  EXPECT_TRUE(InRange(12.5e6, limits::kBandwidth));                  // 100 Mb/s Ethernet
  EXPECT_TRUE(InRange(4.5e15, limits::kPeakFlops));                  // B200 fp8 dense
  EXPECT_TRUE(InRange(2e9, limits::kPeakFlops));                     // a slow CPU rank
  EXPECT_TRUE(InRange(100e-9, limits::kLatency));                    // RDMA
  EXPECT_TRUE(InRange(0.05, limits::kLatency));                      // a WAN hop
}

TEST(Utf8Test, AcceptsWellFormedAndRefusesEveryMalformedKind) {
  EXPECT_TRUE(IsUtf8(""));
  EXPECT_TRUE(IsUtf8("A100-SXM4-80GB"));
  EXPECT_TRUE(IsUtf8("Gr\xc3\xa4" "fe \xe2\x82\xac \xf0\x9f\x9a\x80"));  // ae, euro, rocket
  for (const char* bad : {"\xff", "A\x80", "\xc3", "\xc0\xaf",   // stray, truncated, overlong
                          "\xed\xa0\x80",                        // a UTF-16 surrogate
                          "\xf4\x90\x80\x80",                   // past U+10FFFF
                          "\xe0\x80\xaf"})                       // overlong 3-byte
    EXPECT_FALSE(IsUtf8(bad)) << EscapeBytes(bad);
}

TEST(Utf8Test, EscapeBytesShowsBadBytesAndControlCharacters) {
  EXPECT_EQ(EscapeBytes("\xff" "A100"), "\\xffA100");
  EXPECT_EQ(EscapeBytes("a\x01" "b\tc"), "a\\x01b\tc");
  EXPECT_EQ(EscapeBytes("\xc3\xa4"), "\xc3\xa4");  // well-formed stays as it is
}

}  // namespace
}  // namespace ptdp
