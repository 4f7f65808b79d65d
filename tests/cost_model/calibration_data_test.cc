// The readers of published measured runs: the shipped data/published/runs.yaml (always), and
// the team's ../shared/calibration files it was carried over from (skipped, with a message
// naming the file, in a user's clone that has no ../shared).
#include "cost_model/calibration_data.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <cstdlib>
#include <iterator>
#include <map>

namespace ptdp {
namespace {

const std::string kShipped = std::string(PTDP_SOURCE_DIR) + "/data/published/runs.yaml";
const std::string kShared = std::string(PTDP_SHARED_DIR) + "/calibration";

// Skips the test when a third-party file of ../shared is absent (a user's clone).
#define SKIP_WITHOUT(file)                                                             \
  if (!std::filesystem::exists(file))                                                  \
  GTEST_SKIP() << (file) << " is not here: it is a file of the team's ../shared folder, " \
               << "not shipped with ptdp"

TEST(PublishedRuns, ReadsTheShippedFile) {
  auto set = LoadPublishedRuns(kShipped);
  ASSERT_TRUE(set.ok()) << set.status().message();
  EXPECT_EQ(set->runs.size(), 72u);
  EXPECT_EQ(set->skipped.size(), 11u);
  std::map<std::string, const MeasuredRun*> by_id;
  for (const auto& r : set->runs) by_id[r.id] = &r;
  // dgxc GPT-3 175B bf16 on 128 H100s: tp 4 pp 8 vp 12 (interleaved), distributed optimizer,
  // 8.91 s per step as published.
  ASSERT_TRUE(by_id.count("dgxc_gpt3_175b_bf16_128gpu"));
  const MeasuredRun& g = *by_id["dgxc_gpt3_175b_bf16_128gpu"];
  EXPECT_EQ(g.gpu, "H100");
  EXPECT_EQ(g.gpus, 128);
  EXPECT_EQ(g.layout.tp, 4);
  EXPECT_EQ(g.layout.pp, 8);
  EXPECT_EQ(g.layout.vp, 12);
  EXPECT_EQ(g.layout.schedule, ScheduleKind::kInterleaved);
  EXPECT_TRUE(g.layout.distributed_optimizer);
  EXPECT_DOUBLE_EQ(g.measured_s, 8.91);
  // Korthikanti Table 4: one 22B layer, forward 7.7 + backward 11.9 = 19.6 ms.
  const MeasuredRun& k = *by_id["korthikanti22_t4_22B_layer_baseline_no_recompute"];
  EXPECT_TRUE(k.per_layer);
  EXPECT_EQ(k.gpu, "A100");
  EXPECT_DOUBLE_EQ(k.measured_s, 0.0196);
  EXPECT_EQ(k.model.hidden, 6144);
}

const std::string kRecipes = std::string(PTDP_SOURCE_DIR) + "/data/published/megatron_recipes.yaml";

TEST(PublishedRuns, ReadsTheShippedRecipes) {
  auto set = LoadPublishedRuns(kRecipes);
  ASSERT_TRUE(set.ok()) << set.status().message();
  EXPECT_EQ(set->runs.size(), 142u);
  std::map<std::string, const MeasuredRun*> by_id;
  std::map<std::string, int> per_gpu;
  for (const auto& r : set->runs) {
    by_id[r.id] = &r;
    ++per_gpu[r.gpu];
    EXPECT_FALSE(r.source.empty()) << r.id;
  }
  EXPECT_EQ(per_gpu, (std::map<std::string, int>{{"B200", 6}, {"GB200", 40}, {"GB300", 29}, {"H100", 67}}));
  // Llama 3.1 405B (126 layers) at pp 8 x vp 8: embedding and loss in the split, as its
  // Megatron-Bridge recipe sets, 128 slots.
  ASSERT_TRUE(by_id.count("mb_2606_h100_fp8_llama31_405b_1024gpu"));
  const MeasuredRun& u = *by_id["mb_2606_h100_fp8_llama31_405b_1024gpu"];
  EXPECT_TRUE(u.layout.embedding_in_split && u.layout.loss_in_split);
  EXPECT_EQ(u.layout.cp, 2);
  EXPECT_EQ(CheckLayout(u.model, u.layout), Rejection::kOk);
  // Llama trains without dropout (Megatron-Bridge's LlamaBridge: hidden_dropout 0.0).
  EXPECT_FALSE(u.model.dropout);
  // 26.02.01's misprinted GB300 layouts are not carried; 25.09's alternate GB200 Llama 3 70B
  // configuration trains micro-batches of 1, as its GA of 16 says.
  EXPECT_FALSE(by_id.count("mb_260201_gb300_mxfp8_llama3_70b_64gpu"));
  EXPECT_FALSE(by_id.count("mb_260201_gb300_nvfp4_llama3_70b_64gpu"));
  ASSERT_TRUE(by_id.count("mb_2509_gb200_fp8mxfp832x32_llama3_70b_64gpu_alt"));
  EXPECT_EQ(by_id["mb_2509_gb200_fp8mxfp832x32_llama3_70b_64gpu_alt"]->layout.micro_batch, 1);
  // NVFP4 rows are fp4.
  ASSERT_TRUE(by_id.count("mb_2606_gb300_nvfp4_llama31_405b_256gpu"));
  EXPECT_EQ(by_id["mb_2606_gb300_nvfp4_llama31_405b_256gpu"]->layout.precision, Precision::kFp4);
  // dgxc v25.04, Llama 3.1 70B fp8 on 512 H100s: tp 4 pp 8 vp 5 dp 16, 10.07 s per step.
  ASSERT_TRUE(by_id.count("dgxc_v2504_llama3_70b_h100_fp8_512gpu_L80"));
  const MeasuredRun& g = *by_id["dgxc_v2504_llama3_70b_h100_fp8_512gpu_L80"];
  EXPECT_EQ(g.gpus, 512);
  EXPECT_EQ(g.layout.ShortName(), "tp4 pp8 dp16 vp5 mb1");
  EXPECT_EQ(g.layout.precision, Precision::kFp8);
  EXPECT_DOUBLE_EQ(g.measured_s, 10.07);
  EXPECT_EQ(g.model.layers, 80);
  EXPECT_EQ(g.model.kv_heads, 8);
  EXPECT_EQ(g.source, "NVIDIA/dgxc-benchmarking recipe README, Expected Performance; dgxc tags "
                      "v25.04,v25.04.01,v25.04.02");
  // A proxy run keeps the layers that ran: dgxc's 405B on 32 GPUs trains 8 layers.
  ASSERT_TRUE(by_id.count("dgxc_v2504_llama31_405b_h100_bf16_32gpu_L8"));
  EXPECT_EQ(by_id["dgxc_v2504_llama31_405b_h100_bf16_32gpu_L8"]->model.layers, 8);
}

// The shipped recipes file is what scripts/import-published.py makes of the team's
// megatron_recipes/runs.yaml (and runs.yaml, for duplicates), byte for byte.
TEST(PublishedRuns, TheShippedRecipesAreTheImportersOutput) {
  const std::string src = kShared + "/megatron_recipes/runs.yaml";
  SKIP_WITHOUT(src);
  if (std::system("python3 -c 'import yaml' 2>/dev/null") != 0)
    GTEST_SKIP() << "python3 with PyYAML (python3-yaml) is not installed";
  const std::string out = ::testing::TempDir() + "/recipes.yaml";
  const std::string cmd = "python3 " + std::string(PTDP_SOURCE_DIR) +
                          "/scripts/import-published.py --recipes " + src + " " + kShipped +
                          " > " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_TRUE(read(out) == read(kRecipes)) << "data/published/megatron_recipes.yaml differs from "
                                           << cmd << ": rerun it";
}

// The shipped rows say exactly what the team's source file says, read by the source's reader.
TEST(PublishedRuns, SameRowsAsTheSharedSource) {
  const std::string src = kShared + "/measured_runs.yaml";
  SKIP_WITHOUT(src);
  auto shipped = LoadPublishedRuns(kShipped);
  auto source = LoadMeasuredRuns(src);
  ASSERT_TRUE(shipped.ok()) << shipped.status().message();
  ASSERT_TRUE(source.ok()) << source.status().message();
  ASSERT_EQ(shipped->runs.size(), source->runs.size());
  ASSERT_EQ(shipped->skipped, source->skipped);
  for (size_t i = 0; i < shipped->runs.size(); ++i) {
    const MeasuredRun& a = shipped->runs[i];
    const MeasuredRun& b = source->runs[i];
    SCOPED_TRACE(b.id);
    EXPECT_EQ(a.id, b.id);
    EXPECT_EQ(a.gpu, b.gpu);
    EXPECT_EQ(a.gpus, b.gpus);
    EXPECT_EQ(a.per_layer, b.per_layer);
    EXPECT_DOUBLE_EQ(a.measured_s, b.measured_s);
    EXPECT_EQ(ModelToYaml(a.model, ""), ModelToYaml(b.model, ""));
    const Layout &l = a.layout, &m = b.layout;
    EXPECT_EQ(l.ShortName(), m.ShortName());
    EXPECT_EQ(l.global_batch, m.global_batch);
    EXPECT_EQ(l.sequence_parallel, m.sequence_parallel);
    EXPECT_EQ(l.recompute, m.recompute);
    EXPECT_EQ(l.precision, m.precision);
    EXPECT_EQ(l.schedule, m.schedule);
    EXPECT_EQ(l.distributed_optimizer, m.distributed_optimizer);
    EXPECT_EQ(l.overlap_grad_reduce, m.overlap_grad_reduce);
    EXPECT_EQ(l.tp_comm_overlap, m.tp_comm_overlap);
    EXPECT_EQ(l.grad_reduce_in_bf16, m.grad_reduce_in_bf16);
  }
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream(path) << text;
  return path;
}

const char* kRow =
    "ptdp_published_runs_version: 1\n"
    "runs:\n"
    "- id: r1\n"
    "  source: \"a paper; Table 1\"\n"
    "  gpu: A100-SXM4-80GB\n"
    "  gpus: GPUS\n"
    "  model: {layers: 2, hidden: 64, heads: 4, seq_len: 128, vocab: 1000}\n"
    "  layout: {tp: 2, pp: 1, dp: 2, micro_batch: 1, global_batch: 8}\n"
    "  TIME\n";

std::string Row(const std::string& gpus, const std::string& time) {
  std::string s = kRow;
  s.replace(s.find("GPUS"), 4, gpus);
  s.replace(s.find("TIME"), 4, time);
  return s;
}

TEST(PublishedRuns, ReadsAMinimalRow) {
  auto set = LoadPublishedRuns(WriteTemp("ptdp_pub_ok.yaml", Row("4", "step_time_s: 1.5")));
  ASSERT_TRUE(set.ok()) << set.status().message();
  ASSERT_EQ(set->runs.size(), 1u);
  EXPECT_EQ(set->runs[0].layout.world(), 4);
  EXPECT_DOUBLE_EQ(set->runs[0].measured_s, 1.5);
}

TEST(PublishedRuns, BadRowsNameFileKeyAndValue) {
  struct Case { std::string gpus, time, expect; };
  const Case cases[] = {
      {"8", "step_time_s: 1.5", "runs[0].gpus: '8' is not tp*cp*pp*dp = 4"},
      {"4", "step_time_s: -1", "runs[0].step_time_s"},
      {"4", "published: {}", "give exactly one of step_time_s and layer_fwd_bwd_ms"},
      {"4", "step_time_s: 1\n  colour: blue", "colour"},
  };
  for (const Case& c : cases) {
    const std::string path = WriteTemp("ptdp_pub_bad.yaml", Row(c.gpus, c.time));
    auto set = LoadPublishedRuns(path);
    ASSERT_FALSE(set.ok()) << c.time;
    EXPECT_NE(set.status().message().find(path), std::string::npos) << set.status().message();
    EXPECT_NE(set.status().message().find(c.expect), std::string::npos) << set.status().message();
  }
}

TEST(CalibrationData, ReadsMeasuredRuns) {
  const std::string src = kShared + "/measured_runs.yaml";
  SKIP_WITHOUT(src);
  auto set = LoadMeasuredRuns(src);
  ASSERT_TRUE(set.ok()) << set.status().message();
  EXPECT_GT(set->runs.size(), 50u);
}

TEST(CalibrationData, ReadsVtrainCsv) {
  const std::string csv = kShared + "/vtrain_single_node/measured.csv";
  SKIP_WITHOUT(csv);
  auto set = LoadVtrainCsv(csv);
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
  auto pub = LoadPublishedRuns("/nonexistent/runs.yaml");
  ASSERT_FALSE(pub.ok());
  EXPECT_NE(pub.status().message().find("/nonexistent/runs.yaml"), std::string::npos);
}

}  // namespace
}  // namespace ptdp
