// The calibration readers on the shared data (../shared/calibration, beside the repository).
#include "cost_model/calibration_data.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace ptdp {
namespace {

const std::string kData = std::string(PTDP_SHARED_DIR) + "/calibration";

TEST(CalibrationData, ReadsMeasuredRuns) {
  ASSERT_TRUE(std::filesystem::exists(kData)) << kData << " missing: shared/ must sit beside the repo";
  auto set = LoadMeasuredRuns(kData + "/measured_runs.yaml");
  ASSERT_TRUE(set.ok()) << set.status().message();
  EXPECT_GT(set->runs.size(), 50u);
  bool found = false;
  for (const auto& r : set->runs)
    if (r.id == "dgxc_gpt3_175b_bf16_128gpu") {
      found = true;
      EXPECT_EQ(r.layout.tp, 4);
      EXPECT_EQ(r.layout.pp, 8);
      EXPECT_EQ(r.layout.vp, 12);
      EXPECT_TRUE(r.layout.distributed_optimizer);
      EXPECT_DOUBLE_EQ(r.measured_s, 8.91);
    }
  EXPECT_TRUE(found);
}

TEST(CalibrationData, ReadsVtrainCsv) {
  ASSERT_TRUE(std::filesystem::exists(kData)) << kData << " missing: shared/ must sit beside the repo";
  auto set = LoadVtrainCsv(kData + "/vtrain_single_node/measured.csv");
  ASSERT_TRUE(set.ok()) << set.status().message();
  EXPECT_EQ(set->runs.size() + set->skipped.size(), 1440u);
  // First row: 2 GPUs, B 16, b 8, h 1024, a 16, L 24, s 1024, t 1, d 1, p 2, 372.16 ms.
  const MeasuredRun& r = set->runs.front();
  EXPECT_EQ(r.layout.pp, 2);
  EXPECT_EQ(r.model.hidden, 1024);
  EXPECT_NEAR(r.measured_s, 0.372160408, 1e-9);
}

TEST(CalibrationData, MissingFileNamesIt) {
  auto set = LoadVtrainCsv("/nonexistent/measured.csv");
  ASSERT_FALSE(set.ok());
  EXPECT_NE(set.status().message().find("/nonexistent/measured.csv"), std::string::npos);
}

}  // namespace
}  // namespace ptdp
