// The host speed probe's pieces (cli/speed_probe.h): measured.json's speed_probe written and read
// back (each point the geometric mean of its two probes, the drift between them), malformed
// probes refused naming the file, and the probe run on several CPU threads at once (one world of
// its own each), refused where it cannot run so. `ptdp train`/`compare` end to end:
// compare_test.cc, Compare.HoldsTheHostSpeedAgainstTheCalibration.
#include "cli/speed_probe.h"

#include <gtest/gtest.h>

#include <cmath>

namespace ptdp::cli {
namespace {

MeasuredPrimitives Probe(double scale) {
  MeasuredPrimitives m;
  m.tables["gemm_nt"] = *MeasuredTable::FromRows(
      {{64, 64, 64, 1e-5 * scale}, {64, 64, 256, 4e-5 * scale}}, {1, 1, 1}, "gemm_nt");
  m.tables["copy"] = *MeasuredTable::FromRows({{262144, 2e-5 * scale}}, {1}, "copy");
  return m;
}

TEST(SpeedProbe, WrittenAndReadBackAsTheGeometricMeanOfItsTwoProbes) {
  const nlohmann::json j = SpeedProbeJson("cpu", 2, Probe(1), Probe(4));
  EXPECT_EQ(j["backend"], "cpu");
  EXPECT_EQ(j["threads"], 2);
  ASSERT_EQ(j["points"].size(), 3u);
  double within = 0;
  auto back = SpeedProbeFromJson(j, "m.json", &within);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_NEAR(within, 4.0, 1e-12);
  EXPECT_NEAR(back->Table("gemm_nt")->Seconds(64, 64, 256), 2 * 4e-5, 1e-15);
  EXPECT_NEAR(back->Table("copy")->Seconds(262144), 2 * 2e-5, 1e-15);
  // Malformed: one line naming the file, the point and what is wrong.
  auto refused = [](nlohmann::json bad, const std::string& what) {
    auto r = SpeedProbeFromJson(bad, "m.json", nullptr);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_NE(r.status().message().find("m.json: speed_probe"), std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().message();
  };
  nlohmann::json bad = j;
  bad["points"][1]["table"] = "gemm_xx";
  refused(bad, "unknown table 'gemm_xx'");
  bad = j;
  bad["points"][0]["at"] = {64, 64};
  refused(bad, "point 1: table copy has 1 axis, 'at' 2 values");
  bad = j;
  bad["points"][2]["before_s"] = 0;
  refused(bad, "point 3");
  bad = j;
  bad["points"] = nlohmann::json::array();
  refused(bad, "no points");
  refused(nlohmann::json::array(), "expected an object with a points array");
}

TEST(SpeedProbe, RunsOnSeveralCpuThreadsAtOnce) {
  auto two = RunSpeedProbe("cpu", rt::DType::kF32, 2);
  ASSERT_TRUE(two.ok()) << two.status().message();
  EXPECT_NE(two->Table("gemm_nt"), nullptr);
  EXPECT_EQ(two->Table("all_reduce"), nullptr);
  for (const auto& [name, table] : two->tables)
    for (double s : table.seconds()) EXPECT_GT(s, 0) << name;
  EXPECT_FALSE(RunSpeedProbe("cpu", rt::DType::kF32, 0).ok());
  auto gpu = RunSpeedProbe("cuda", rt::DType::kBF16, 2);
  ASSERT_FALSE(gpu.ok());
  EXPECT_NE(gpu.status().message().find("only on the CPU backend"), std::string::npos);
}

}  // namespace
}  // namespace ptdp::cli
