// MeasuredTable interpolation by hand, grid checks, and the `measured:` YAML block read strictly
// and written back to the same values.
#include "core/measured.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/yaml_reader.h"

namespace ptdp {
namespace {

TEST(MeasuredTableTest, InterpolatesInLogLogAndExtrapolatesByTheExponent) {
  // 1 element: 1 s, 4 elements: 16 s (time ~ n^2 between the points).
  auto t = MeasuredTable::FromRows({{1, 1}, {4, 16}}, {1.0}, "t");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_DOUBLE_EQ(t->Seconds(1), 1);
  EXPECT_DOUBLE_EQ(t->Seconds(4), 16);
  EXPECT_NEAR(t->Seconds(2), 4, 1e-12);      // log-log line through both points: n^2
  EXPECT_DOUBLE_EQ(t->Seconds(0.5), 1);      // below the grid: the smallest point's time
  EXPECT_NEAR(t->Seconds(8), 32, 1e-12);     // above: 16 s x (8/4)^1
}

TEST(MeasuredTableTest, MultilinearOverTwoAxes) {
  // seconds = a * b^2 on {1, 2} x {1, 2}: a power law, reproduced exactly in between.
  auto t = MeasuredTable::FromRows({{2, 2, 8}, {1, 1, 1}, {1, 2, 4}, {2, 1, 2}}, {1.0, 2.0}, "t");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_NEAR(t->Seconds(std::sqrt(2.0), std::sqrt(2.0)), std::pow(2.0, 1.5), 1e-12);
  EXPECT_NEAR(t->Seconds(1.5, 1), 1.5, 1e-12);
  EXPECT_NEAR(t->Seconds(2, 4), 8 * 4, 1e-12);  // b past the grid: x (4/2)^2
  // Rows come back in grid order, last axis fastest.
  const auto rows = t->Rows();
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[1], (std::vector<double>{1, 2, 4}));
  EXPECT_EQ(rows[2], (std::vector<double>{2, 1, 2}));
}

TEST(MeasuredTableTest, RefusesGridsWithHolesOrBadRows) {
  auto hole = MeasuredTable::FromRows({{1, 1, 1}, {2, 2, 8}, {1, 2, 4}}, {1, 1}, "gemm");
  ASSERT_FALSE(hole.ok());
  EXPECT_NE(hole.status().message().find("do not fill the 4-point grid"), std::string::npos)
      << hole.status().message();
  auto twice = MeasuredTable::FromRows({{1, 1}, {1, 2}}, {1}, "t");
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("twice"), std::string::npos);
  auto shape = MeasuredTable::FromRows({{1, 1, 1}}, {1}, "t");
  ASSERT_FALSE(shape.ok());
  EXPECT_NE(shape.status().message().find("t row 1: expected 2 numbers, got 3"), std::string::npos)
      << shape.status().message();
  auto zero = MeasuredTable::FromRows({{1, 0}}, {1}, "t");
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("t row 1: seconds: 0 is outside 1e-12 s..1e+06 s"),
            std::string::npos)
      << zero.status().message();
}

MeasuredPrimitives Sample() {
  MeasuredPrimitives m;
  m.backend = "cpu";
  m.host = "box";
  m.date = "2026-11-29";
  m.cores = 2;
  m.attention_saved_per_score = 1;
  m.busy_cores_slowdown = 1.25;
  for (const TableKind& k : MeasuredTableKinds()) {
    std::vector<std::vector<double>> rows;
    std::vector<double> exponents;
    for (const TableAxis& a : k.axes) exponents.push_back(a.exponent);
    const size_t dims = k.axes.size();
    for (size_t corner = 0; corner < (size_t(1) << dims); ++corner) {
      std::vector<double> row;
      for (size_t a = 0; a < dims; ++a) row.push_back((corner >> a) & 1 ? 1048576 : 16);
      row.push_back(1.25e-6 * double(corner + 1));
      rows.push_back(row);
    }
    m.tables[k.name] = *MeasuredTable::FromRows(rows, exponents, k.name);
  }
  return m;
}

TEST(MeasuredYamlTest, RoundTrip) {
  const MeasuredPrimitives m = Sample();
  EXPECT_TRUE(m.CheckComplete("f").ok());
  const std::string text = MeasuredToYaml(m);
  auto node = ParseYamlText(text, "m.yaml");
  ASSERT_TRUE(node.ok()) << node.status().message();
  auto back = MeasuredFromYaml((*node)["measured"], "m.yaml");
  ASSERT_TRUE(back.ok()) << back.status().message() << "\n" << text;
  EXPECT_EQ(back->backend, "cpu");
  EXPECT_EQ(back->host, "box");
  EXPECT_EQ(back->cores, 2);
  EXPECT_EQ(back->attention_saved_per_score, 1);
  EXPECT_EQ(back->attention_saved_per_token, 0);
  EXPECT_EQ(back->busy_cores_slowdown, 1.25);
  ASSERT_EQ(back->tables.size(), m.tables.size());
  // Axis values come back exactly, times to the 6 digits written (measurements are noisier).
  for (const auto& [name, t] : m.tables) {
    ASSERT_NE(back->Table(name), nullptr) << name;
    const auto a = t.Rows(), b = back->Table(name)->Rows();
    ASSERT_EQ(a.size(), b.size()) << name;
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].size(), b[i].size());
      for (size_t j = 0; j + 1 < a[i].size(); ++j) EXPECT_EQ(a[i][j], b[i][j]) << name;
      EXPECT_NEAR(b[i].back() / a[i].back(), 1.0, 1e-6) << name;
    }
  }
  EXPECT_EQ(MeasuredToYaml(*back), text);  // and the text is a fixed point
}

TEST(MeasuredYamlTest, StrictReading) {
  auto read = [](const std::string& text) {
    auto node = ParseYamlText(text, "c.yaml");
    EXPECT_TRUE(node.ok());
    return MeasuredFromYaml((*node)["measured"], "c.yaml");
  };
  auto unknown = read("measured:\n  backend: cpu\n  tables:\n    gemm_xx:\n      - [1, 1, 1, 1]\n");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("c.yaml:4: measured.tables.gemm_xx: unknown table"),
            std::string::npos)
      << unknown.status().message();
  auto key = read("measured:\n  backend: cpu\n  colour: red\n  tables: {}\n");
  ASSERT_FALSE(key.ok());
  EXPECT_NE(key.status().message().find("colour"), std::string::npos) << key.status().message();
  auto backend = read("measured:\n  backend: tpu\n  tables: {}\n");
  ASSERT_FALSE(backend.ok());
  EXPECT_NE(backend.status().message().find("tpu"), std::string::npos);
  auto text = read("measured:\n  tables:\n    copy:\n      - [64, fast]\n");
  ASSERT_FALSE(text.ok());
  EXPECT_NE(text.status().message().find("'fast' is not a number"), std::string::npos)
      << text.status().message();
  auto partial = read("measured:\n  tables:\n    copy:\n      - [64, 1e-6]\n");
  ASSERT_TRUE(partial.ok()) << partial.status().message();
  const Status incomplete = partial->CheckComplete("c.yaml");
  ASSERT_FALSE(incomplete.ok());
  EXPECT_NE(incomplete.message().find("gemm_nt"), std::string::npos) << incomplete.message();
}

// Extreme numbers of a `measured:` block (a calibrated cluster): refused naming the file, line,
// key and range, never truncated (cores was cast to int) nor let through as inf.
TEST(MeasuredYamlTest, ExtremeNumbersAreRefusedNamingTheRange) {
  auto read = [](const std::string& body) {
    auto node = ParseYamlText("measured:\n" + body, "c.yaml");
    EXPECT_TRUE(node.ok()) << node.status().message();
    return MeasuredFromYaml((*node)["measured"], "c.yaml");
  };
  const std::string tables = "  tables:\n    copy:\n      - [64, 1e-6]\n";
  const std::pair<std::string, std::string> cases[] = {
      {"  cores: 4294967297\n" + tables, "c.yaml:2: measured.cores: '4294967297' is larger than the limit 1048576"},
      {"  element_bytes: .inf\n" + tables, "c.yaml:2: measured.element_bytes: '.inf' is not a number"},
      {"  element_bytes: 1e308\n" + tables, "c.yaml:2: measured.element_bytes: '1e308' is outside 1..64"},
      {"  element_bytes: 4.9e-324\n" + tables, "measured.element_bytes: '4.9e-324' is outside 1..64"},
      {"  attention_saved:\n    per_score: -1\n" + tables,
       "c.yaml:3: measured.attention_saved.per_score: '-1' is outside 0..1e+09"},
      {"  tables:\n    copy:\n      - [64, 4.9e-324]\n",
       "measured.tables.copy row 1: seconds: 5e-324 is outside 1e-12 s..1e+06 s"},
      {"  tables:\n    copy:\n      - [64, -1e-6]\n", "row 1: seconds: -1e-06 is outside"},
      {"  tables:\n    copy:\n      - [1e308, 1e-6]\n", "row 1: axis value: 1e+308 is outside 1e-09..1e+18"},
      {"  tables:\n    copy:\n      - [inf, 1e-6]\n", "row 1: axis value: inf is outside"},
      {"  host: \"h\xff\"\n" + tables, "c.yaml:2: measured.host: 'h\\xff' is not valid UTF-8"},
  };
  for (const auto& [body, message] : cases) {
    SCOPED_TRACE(body);
    auto node = ParseYamlText("measured:\n" + body, "c.yaml");
    const Status st = node.ok() ? read(body).status() : node.status();
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find(message), std::string::npos) << st.message();
  }
}

}  // namespace
// The host's speed against a calibration: per table the geometric mean of probe / calibrated
// over the probe's points (between grid points the calibration interpolates), overall over all
// points; AtHostSpeed scales those tables and leaves the others (collectives) alone.
TEST(HostSpeedTest, RatiosPerTableAndOverallAndTheRescaledCalibration) {
  const MeasuredPrimitives cal = Sample();
  MeasuredPrimitives probe;
  const MeasuredTable& nt = *cal.Table("gemm_nt");
  // Two points of gemm_nt at 2x and 0.5x (geometric mean 1), one of copy at 3x, off the grid.
  probe.tables["gemm_nt"] = *MeasuredTable::FromRows(
      {{16, 16, 16, 2 * nt.Seconds(16, 16, 16)}, {16, 16, 1048576, 0.5 * nt.Seconds(16, 16, 1048576)}},
      {1, 1, 1}, "gemm_nt");
  probe.tables["copy"] =
      *MeasuredTable::FromRows({{4096, 3 * cal.Table("copy")->Seconds(4096)}}, {1}, "copy");
  auto speed = CompareHostSpeed(cal, probe);
  ASSERT_TRUE(speed.ok()) << speed.status().message();
  EXPECT_EQ(speed->points, 3);
  EXPECT_NEAR(speed->by_table.at("gemm_nt"), 1.0, 1e-12);
  EXPECT_NEAR(speed->by_table.at("copy"), 3.0, 1e-12);
  EXPECT_NEAR(speed->overall, std::cbrt(2 * 0.5 * 3), 1e-12);
  const MeasuredPrimitives at = AtHostSpeed(cal, *speed);
  EXPECT_NEAR(at.Table("copy")->Seconds(4096), 3 * cal.Table("copy")->Seconds(4096), 1e-18);
  EXPECT_NEAR(at.Table("copy")->Seconds(1e9), 3 * cal.Table("copy")->Seconds(1e9), 1e-9);
  EXPECT_EQ(at.Table("all_reduce")->seconds(), cal.Table("all_reduce")->seconds());
  EXPECT_EQ(at.Table("gemm_tn")->seconds(), cal.Table("gemm_tn")->seconds());
  // A table the calibration lacks, or a probe of nothing, is an error naming it.
  MeasuredPrimitives thin = cal;
  thin.tables.erase("copy");
  auto missing = CompareHostSpeed(thin, probe);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("copy"), std::string::npos);
  EXPECT_FALSE(CompareHostSpeed(cal, MeasuredPrimitives{}).ok());
  // An optional table the calibration lacks (a CPU's GEMM epilogues, or a file from before the
  // table) is left out of the ratios: the model prices those calls by tables the probe holds.
  thin = cal;
  thin.tables.erase("bias_residual");
  ASSERT_TRUE(FindTableKind("bias_residual")->optional);
  MeasuredPrimitives newer = probe;
  newer.tables["bias_residual"] = *MeasuredTable::FromRows(
      {{16, 16, 5 * cal.Table("bias_residual")->Seconds(16, 16)}}, {1, 1}, "bias_residual");
  auto older = CompareHostSpeed(thin, newer);
  ASSERT_TRUE(older.ok()) << older.status().message();
  EXPECT_EQ(older->points, 3);
  EXPECT_EQ(older->by_table.count("bias_residual"), 0u);
  EXPECT_NEAR(older->overall, speed->overall, 1e-12);
}

// With every core busy each op runs busy_cores_slowdown times longer (in proportion to the busy
// cores beyond the first); a probe that ran on that many threads is held against the
// calibration at that speed, so the slowdown the model counts is not read as the host's drift.
TEST(HostSpeedTest, BusyCoresAreHeldAgainstTheCalibrationAtTheirSpeed) {
  MeasuredPrimitives cal = Sample();
  cal.cores = 4;
  cal.busy_cores_slowdown = 1.3;
  EXPECT_DOUBLE_EQ(cal.BusyCoresFactor(1), 1.0);
  EXPECT_DOUBLE_EQ(cal.BusyCoresFactor(2), 1.1);
  EXPECT_DOUBLE_EQ(cal.BusyCoresFactor(4), 1.3);
  EXPECT_DOUBLE_EQ(cal.BusyCoresFactor(16), 1.3);  // beyond the cores the ranks take turns
  MeasuredPrimitives probe;
  const MeasuredTable& nt = *cal.Table("gemm_nt");
  probe.tables["gemm_nt"] =
      *MeasuredTable::FromRows({{16, 16, 16, 1.3 * nt.Seconds(16, 16, 16)}}, {1, 1, 1}, "gemm_nt");
  auto alone = CompareHostSpeed(cal, probe), busy = CompareHostSpeed(cal, probe, 4);
  ASSERT_TRUE(alone.ok() && busy.ok());
  EXPECT_NEAR(alone->overall, 1.3, 1e-12);  // one thread: 1.3x slower than calibrated
  EXPECT_NEAR(busy->overall, 1.0, 1e-12);   // four: the calibrated busy speed
  cal.cores = 1;  // one core: nothing runs beside it
  EXPECT_DOUBLE_EQ(cal.BusyCoresFactor(2), 1.0);
}

}  // namespace ptdp
