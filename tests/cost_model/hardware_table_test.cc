// The constants table: overrides by name, unknown names refused.
#include "cost_model/hardware_table.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "tests/fakes/test_cluster.h"

namespace ptdp {
namespace {

TEST(HardwareTable, EveryConstantHasUnitAndSource) {
  for (const auto& row : ConstantTable()) {
    EXPECT_GT(std::string(row.unit).size(), 0u) << row.name;
    EXPECT_GT(std::string(row.source).size(), 10u) << row.name;
  }
}

TEST(HardwareTable, ClusterCalibrationOverridesByName) {
  ClusterSpec c = testing::DgxA100Like(1);
  c.calibration["gemm_eff_max"] = 0.5;
  auto k = ConstantsFor(c);
  ASSERT_TRUE(k.ok()) << k.status().message();
  EXPECT_DOUBLE_EQ(k->gemm_eff_max, 0.5);
  EXPECT_DOUBLE_EQ(k->hbm_eff, CostConstants{}.hbm_eff);
}

TEST(HardwareTable, UnknownOrNegativeConstantIsAnError) {
  ClusterSpec c = testing::DgxA100Like(1);
  c.calibration["gemm_speed"] = 1;
  auto k = ConstantsFor(c);
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("test-a100.yaml"), std::string::npos);
  EXPECT_NE(k.status().message().find("gemm_speed"), std::string::npos);
  c.calibration.clear();
  c.calibration["hbm_eff"] = -1;
  EXPECT_FALSE(ConstantsFor(c).ok());
}

// An efficiency divides a time (0 makes it infinite: the cluster fuzzer's finding) and scales
// a datasheet figure (above 1 beats it): both refused with the file, key, value and range.
TEST(HardwareTable, EfficienciesAndFractionsKeepTheirRange) {
  for (const auto& [name, value] : std::vector<std::pair<std::string, double>>{
           {"gemm_eff_max", 0}, {"attention_eff", 1.5}, {"hbm_eff", 0}, {"nccl_inter_eff", 0},
           {"overlap_interference", 2}, {"fragmentation", 1}}) {
    ClusterSpec c = testing::DgxA100Like(1);
    c.calibration[name] = value;
    auto k = ConstantsFor(c);
    ASSERT_FALSE(k.ok()) << name << " = " << value;
    EXPECT_NE(k.status().message().find("test-a100.yaml: calibration." + name), std::string::npos)
        << k.status().message();
    EXPECT_NE(k.status().message().find("must be in"), std::string::npos) << k.status().message();
  }
  ClusterSpec c = testing::DgxA100Like(1);
  c.calibration["gemm_eff_max"] = 1;
  c.calibration["overlap_interference"] = 0;
  EXPECT_TRUE(ConstantsFor(c).ok());
}

}  // namespace
}  // namespace ptdp
