// Quantities with units: strict parsing into SI, formatting, and the config round trip.
#include "core/units.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
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

}  // namespace
}  // namespace ptdp
