// The constants table: overrides by name, unknown names refused.
#include "cost_model/hardware_table.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace ptdp
