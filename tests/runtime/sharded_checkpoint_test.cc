// Sharded checkpoints (runtime/sharded_checkpoint.h): a job split over several Trainers (as
// processes: one ThreadWorld, each Trainer driving some ranks from its own thread) saves one
// shard per Trainer plus a manifest. Read back, the shards are the whole state of one Trainer
// driving every rank, bit for bit; resumed in another split (or another layout) the run goes
// on as if never stopped. Damaged, missing, foreign or overlapping shards are refused naming
// the file; a process whose write fails makes every process fail, none waits alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "runtime/checkpoint.h"
#include "runtime/sharded_checkpoint.h"
#include "runtime/trainer.h"
#include "tests/fakes/split_job.h"
#include "tests/fakes/tiny_training.h"

namespace ptdp::rt {
namespace {

constexpr double kTimeoutS = 30.0;

// A fresh, empty folder under the test temp dir.
std::string FreshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/sharded_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

using testing::ExpectSameState;  // tests/fakes/split_job.h

Checkpoint Info(const TrainerConfig& cfg) {
  Checkpoint c;
  c.model = cfg.model;
  c.seed = cfg.seed;
  c.global_batch = cfg.layout.global_batch;
  c.layout = cfg.layout.ShortName();
  c.optimizer = {{"lr", cfg.optimizer.lr}};
  return c;
}

using testing::SplitJob;  // tests/fakes/split_job.h
using testing::StepsOf;

// How a Trainer of the tests saves: into `dir`, keeping 3.
ShardedSave How(const std::string& dir, bool owner) {
  ShardedSave how;
  how.dir = dir;
  how.owner = owner;
  how.keep = 3;
  return how;
}

struct SplitCase {
  const char* name;
  testing::TinyLayoutSpec layout;
  std::vector<std::vector<int>> parts;  // the ranks of each Trainer
  bool moe = false, bf16 = false;
};

TrainerConfig Config(const SplitCase& k) {
  TrainerConfig c;
  c.model = k.moe ? testing::TinyMoe() : testing::TinyGpt(4);
  c.layout = testing::TinyLayout(k.layout);
  c.bf16 = k.bf16;
  if (k.bf16) c.layout.precision = Precision::kBf16;
  c.train_tokens = &testing::Shakespeare().train;
  return c;
}

class ShardedCheckpoint : public ::testing::TestWithParam<SplitCase> {};

INSTANTIATE_TEST_SUITE_P(
    Runtime, ShardedCheckpoint,
    ::testing::Values(
        // RankGrid(tp 2, dp 1, pp 2): stage 0 = ranks 0, 1; stage 1 = ranks 2, 3.
        SplitCase{"tp2_pp2_by_stage", {.tp = 2, .pp = 2, .sp = true}, {{0, 1}, {2, 3}}},
        // One Trainer per rank, the moments in distributed-optimizer slices.
        SplitCase{"dp2_pp2_dopt_per_rank", {.pp = 2, .dp = 2, .dopt = true}, {{0}, {1}, {2}, {3}}},
        SplitCase{"tp2_cp2_three_trainers", {.tp = 2, .sp = true, .cp = 2}, {{3}, {0, 2}, {1}}},
        SplitCase{"moe_ep2_dp2", {.dp = 2, .ep = 2}, {{0}, {1}}, /*moe=*/true},
        SplitCase{"bf16_dp2_dopt", {.dp = 2, .dopt = true}, {{1}, {0}}, false, /*bf16=*/true}),
    [](const ::testing::TestParamInfo<SplitCase>& i) { return std::string(i.param.name); });

// 2 steps in the split job, a sharded save, then one Trainer (every rank) resumes it: the
// shards read back are one Trainer's ExportState bit for bit, and the resumed third step and
// state equal an uninterrupted run's.
TEST_P(ShardedCheckpoint, SplitJobSavesAndResumesBitForBit) {
  const SplitCase& k = GetParam();
  const TrainerConfig cfg = Config(k);
  std::vector<double> ref_losses;
  TrainingState ref2, ref3;
  SplitJob(cfg, {{}}, [&](size_t, Trainer& t) {
    StepsOf(t, 2, &ref_losses);
    auto a = t.ExportState();
    ASSERT_TRUE(a.ok()) << a.status().message();
    ref2 = *a;
    StepsOf(t, 1, &ref_losses);
    auto b = t.ExportState();
    ASSERT_TRUE(b.ok()) << b.status().message();
    ref3 = *b;
  });
  ASSERT_EQ(ref_losses.size(), 3u);

  const std::string dir = FreshDir(k.name);
  std::vector<Result<SavedCheckpoint>> saved(k.parts.size(), Status::Error("not run"));
  SplitJob(cfg, k.parts, [&](size_t i, Trainer& t) {
    std::vector<double> losses;
    StepsOf(t, 2, &losses);
    EXPECT_EQ(losses[1], ref_losses[1]) << "trainer " << i;
    saved[i] = SaveShardedCheckpoint(t, Info(cfg), How(dir, i == 0));
  });
  for (size_t i = 0; i < saved.size(); ++i) {
    ASSERT_TRUE(saved[i].ok()) << "trainer " << i << ": " << saved[i].status().message();
    EXPECT_EQ(saved[i]->path, dir + "/step-00000002.ckpt");
    EXPECT_EQ(saved[i]->shards, int(k.parts.size()));
  }
  // One shard per Trainer, named by its first rank, and the manifest.
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    ++files;
    (void)e;
  }
  EXPECT_EQ(files, k.parts.size() + 1);
  for (const std::vector<int>& part : k.parts)
    EXPECT_TRUE(std::filesystem::exists(dir + "/" + ShardFileName(2, *std::min_element(part.begin(), part.end()))));

  auto back = ReadCheckpoint(dir + "/step-00000002.ckpt");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->read_shards, int(k.parts.size()));
  EXPECT_EQ(back->layout, cfg.layout.ShortName());
  ExpectSameState(back->state, ref2, "the shards read back");

  // Resumed by one Trainer driving every rank, and by the split job once more.
  for (const auto& parts : {std::vector<std::vector<int>>{{}}, k.parts}) {
    std::vector<TrainingState> end(parts.size());
    SplitJob(cfg, parts, [&](size_t i, Trainer& t) {
      ASSERT_TRUE(t.ImportState(back->state).ok());
      std::vector<double> losses;
      StepsOf(t, 1, &losses);
      EXPECT_EQ(losses[0], ref_losses[2]) << "trainer " << i;
      auto st = t.ExportState();
      ASSERT_TRUE(st.ok()) << st.status().message();
      end[i] = *st;
    });
    for (size_t i = 0; i < end.size(); ++i)
      ExpectSameState(end[i], ref3, "resumed trainer " + std::to_string(i));
  }
}

// Each process reads only the shards its ranks need (ReadCheckpoint's filter from
// LocalStateTensors): in a pp 4 job with a Trainer per stage, stage 1 and 2 read their own
// shard alone, stage 3 also stage 0's (it holds a copy of the tied word embedding); each then
// imports what it read and the next step equals an uninterrupted run's.
TEST(ShardedCheckpointFilter, EachProcessReadsOnlyTheShardsItsRanksNeed) {
  const TrainerConfig cfg = Config({"pp4", {.pp = 4}, {}});
  std::vector<double> ref;
  SplitJob(cfg, {{}}, [&](size_t, Trainer& t) { StepsOf(t, 3, &ref); });
  ASSERT_EQ(ref.size(), 3u);
  const std::string dir = FreshDir("filter");
  const std::vector<std::vector<int>> parts = {{0}, {1}, {2}, {3}};
  SplitJob(cfg, parts, [&](size_t i, Trainer& t) {
    std::vector<double> losses;
    StepsOf(t, 2, &losses);
    auto s = SaveShardedCheckpoint(t, Info(cfg), How(dir, i == 0));
    ASSERT_TRUE(s.ok()) << s.status().message();
  });
  std::vector<int> read(parts.size(), -1);
  std::vector<double> next(parts.size(), 0);
  SplitJob(cfg, parts, [&](size_t i, Trainer& t) {
    const std::set<std::string> needed = t.LocalStateTensors();
    auto c = ReadCheckpoint(dir + "/step-00000002.ckpt",
                            [&](const std::string& n) { return needed.count(n) > 0; });
    ASSERT_TRUE(c.ok()) << c.status().message();
    read[i] = c->read_shards;
    EXPECT_EQ(c->shards, 4);
    EXPECT_EQ(c->state.tensors.size(), needed.size());
    ASSERT_TRUE(t.ImportState(c->state).ok());
    std::vector<double> losses;
    StepsOf(t, 1, &losses);
    next[i] = losses[0];
  });
  EXPECT_EQ(read, (std::vector<int>{1, 1, 1, 2}));
  for (size_t i = 0; i < parts.size(); ++i) EXPECT_EQ(next[i], ref[2]) << "trainer " << i;
}

// A sharded checkpoint of tp 2 x pp 2 loads into dp 2 x pp 2 with the distributed optimizer
// (resharding): exported again there, it is the checkpoint's state bit for bit.
TEST(ShardedCheckpointReshard, LoadsIntoAnotherLayoutLosslessly) {
  const TrainerConfig a = Config({"a", {.tp = 2, .pp = 2, .sp = true}, {}});
  const std::string dir = FreshDir("reshard");
  SplitJob(a, {{0, 2}, {1, 3}}, [&](size_t i, Trainer& t) {
    std::vector<double> losses;
    StepsOf(t, 1, &losses);
    auto s = SaveShardedCheckpoint(t, Info(a), How(dir, i == 0));
    ASSERT_TRUE(s.ok()) << s.status().message();
  });
  auto back = ReadCheckpoint(dir + "/step-00000001.ckpt");
  ASSERT_TRUE(back.ok()) << back.status().message();
  const TrainerConfig b = Config({"b", {.pp = 2, .dp = 2, .dopt = true}, {}});
  SplitJob(b, {{0, 1}, {2, 3}}, [&](size_t, Trainer& t) {
    ASSERT_TRUE(t.ImportState(back->state).ok());
    auto st = t.ExportState();
    ASSERT_TRUE(st.ok()) << st.status().message();
    ExpectSameState(*st, back->state, "exported again in dp2 pp2");
  });
}

// A process that cannot write its shard (here: its folder does not exist, or it does not see
// the file process 0 made there) makes every process of the job fail, the others naming its
// rank; a manifest that cannot be written (a folder in its place) does the same from process 0.
// Nothing waits for the communicator's timeout.
TEST(ShardedCheckpointFailure, EveryProcessFailsWithTheOneThatCouldNot) {
  const TrainerConfig cfg = Config({"f", {.dp = 2}, {}});
  const std::string dir = FreshDir("failure");
  std::vector<Status> got(2);
  const auto t0 = std::chrono::steady_clock::now();
  SplitJob(cfg, {{0}, {1}}, [&](size_t i, Trainer& t) {
    std::vector<double> losses;
    StepsOf(t, 1, &losses);
    const std::string where = i == 1 ? dir + "/missing" : dir;
    got[i] = SaveShardedCheckpoint(t, Info(cfg), How(where, i == 0)).status();
  });
  ASSERT_FALSE(got[1].ok());
  EXPECT_NE(got[1].message().find("missing/step-00000001.rank00001.shard.tmp: cannot create"),
            std::string::npos) << got[1].message();
  ASSERT_FALSE(got[0].ok());
  EXPECT_NE(got[0].message().find("the process of rank 1 could not write its shard"),
            std::string::npos) << got[0].message();
  EXPECT_FALSE(std::filesystem::exists(dir + "/step-00000001.ckpt"));

  // A folder each process sees a different one of (node-local disks): the file process 0's
  // side holds is not there for process 1, and both fail before any shard is written.
  SplitJob(cfg, {{0}, {1}}, [&](size_t i, Trainer& t) {
    std::vector<double> losses;
    StepsOf(t, 1, &losses);
    ShardedSave how = How(dir, i == 0);
    if (i == 1) how.must_see = dir + "/.ptdp-lock";
    got[i] = SaveShardedCheckpoint(t, Info(cfg), how).status();
  });
  ASSERT_FALSE(got[1].ok());
  EXPECT_NE(got[1].message().find("is not visible to this process: the checkpoint folder must "
                                  "be on a file system every process shares"),
            std::string::npos) << got[1].message();
  ASSERT_FALSE(got[0].ok());
  EXPECT_NE(got[0].message().find("the process of rank 1 could not write its shard"),
            std::string::npos) << got[0].message();
  std::filesystem::create_directories(dir + "/step-00000002.ckpt");  // the manifest's name
  SplitJob(cfg, {{0}, {1}}, [&](size_t i, Trainer& t) {
    std::vector<double> losses;
    StepsOf(t, 2, &losses);
    got[i] = SaveShardedCheckpoint(t, Info(cfg), How(dir, i == 0)).status();
  });
  ASSERT_FALSE(got[0].ok());
  EXPECT_NE(got[0].message().find("step-00000002.ckpt"), std::string::npos) << got[0].message();
  ASSERT_FALSE(got[1].ok());
  EXPECT_NE(got[1].message().find("(the manifest) failed in the process of rank 0"),
            std::string::npos) << got[1].message();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
            kTimeoutS);
}

// ---- The files themselves, with hand-made shards of one tensor "t" of shape [4, 3] (12
// elements): rank 0's shard holds elements 0..5, rank 1's 6..11 (as runs (start, length)), each
// element's value 100 + its index, so an element put in the wrong place shows.

struct HandMade {
  std::string dir, manifest;
  std::vector<ShardRecord> records;
};

StateShard Shard(int rank, std::vector<ElementRun> runs, int world = 2, int64_t step = 5) {
  StateShard s;
  s.step = step;
  s.optimizer_steps = step;
  s.consumed_samples = step * 8;
  s.world = world;
  s.ranks = {rank};
  s.tensors = {{"t", {4, 3}, {}}};
  TensorPiece p{"t", {4, 3}, runs, {}};
  for (const ElementRun& r : runs)
    for (int64_t e = r.start; e < r.start + r.length; ++e) p.data.push_back(100.0f + float(e));
  s.pieces.push_back(p);
  return s;
}

// Writes shards a and b and a manifest listing them (world 2 unless given).
HandMade Write(const std::string& name, const StateShard& a, const StateShard& b, int world = 2) {
  HandMade h;
  h.dir = FreshDir(name);
  for (const StateShard* s : {&a, &b}) {
    auto rec = WriteCheckpointShard(h.dir + "/" + ShardFileName(5, s->ranks.front()), *s);
    EXPECT_TRUE(rec.ok()) << rec.status().message();
    if (rec.ok()) h.records.push_back(*rec);
  }
  Checkpoint c = Info(Config({"x", {}, {}}));
  c.state.step = 5;
  c.state.optimizer_steps = 5;
  c.state.consumed_samples = 40;
  c.state.tensors = {{"t", {4, 3}, {}}};
  h.manifest = h.dir + "/step-00000005.ckpt";
  Status st = WriteCheckpointManifest(h.manifest, c, world, h.records);
  EXPECT_TRUE(st.ok()) << st.message();
  return h;
}

TEST(ShardedCheckpointFiles, AssemblesHandMadeShards) {
  const HandMade h = Write("handmade", Shard(1, {{6, 6}}), Shard(0, {{0, 2}, {2, 4}}));
  auto r = ReadCheckpoint(h.manifest);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->state.tensors.size(), 1u);
  const NamedTensor& t = r->state.tensors[0];
  EXPECT_EQ(t.shape, (std::vector<int64_t>{4, 3}));
  for (int e = 0; e < 12; ++e) EXPECT_EQ(t.data[size_t(e)], 100.0f + float(e)) << e;
  EXPECT_EQ(r->state.step, 5);
  EXPECT_EQ(r->read_shards, 2);
  // The manifest lists the shards by first rank, whatever order they were given in.
  std::ifstream in(h.manifest, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_LT(text.find("step-00000005.rank00000.shard"), text.find("step-00000005.rank00001.shard"));
  // Reading a shard alone is refused, pointing at the manifest.
  auto alone = ReadCheckpoint(h.dir + "/" + ShardFileName(5, 0));
  ASSERT_FALSE(alone.ok());
  EXPECT_NE(alone.status().message().find("is one shard of a sharded checkpoint"), std::string::npos);
}

// With a filter, a shard holding none of the wanted tensors is not opened: rank 1's shard of
// tensor "b" may even be gone when only "a" is wanted.
TEST(ShardedCheckpointFiles, AFilterOpensOnlyTheShardsItNeeds) {
  const std::string dir = FreshDir("filter_files");
  std::vector<ShardRecord> records;
  for (int rank : {0, 1}) {
    StateShard s = Shard(rank, {{0, 12}});
    s.tensors = {{"a", {4, 3}, {}}, {"b", {4, 3}, {}}};
    s.pieces[0].name = rank == 0 ? "a" : "b";
    auto rec = WriteCheckpointShard(dir + "/" + ShardFileName(5, rank), s);
    ASSERT_TRUE(rec.ok()) << rec.status().message();
    EXPECT_EQ(rec->tensors, (std::vector<std::pair<int64_t, int64_t>>{{rank, rank + 1}}));
    records.push_back(*rec);
  }
  Checkpoint c = Info(Config({"x", {}, {}}));
  c.state.step = 5;
  c.state.optimizer_steps = 5;
  c.state.consumed_samples = 40;
  c.state.tensors = {{"a", {4, 3}, {}}, {"b", {4, 3}, {}}};
  ASSERT_TRUE(WriteCheckpointManifest(dir + "/step-00000005.ckpt", c, 2, records).ok());
  auto all = ReadCheckpoint(dir + "/step-00000005.ckpt");
  ASSERT_TRUE(all.ok()) << all.status().message();
  EXPECT_EQ(all->read_shards, 2);
  std::filesystem::remove(dir + "/" + ShardFileName(5, 1));
  auto a = ReadCheckpoint(dir + "/step-00000005.ckpt", [](const std::string& n) { return n == "a"; });
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_EQ(a->state.tensors.size(), 1u);
  EXPECT_EQ(a->state.tensors[0].name, "a");
  EXPECT_EQ(a->state.tensors[0].data[11], 111.0f);
  EXPECT_EQ(a->read_shards, 1);
  EXPECT_EQ(a->shards, 2);
  auto b = ReadCheckpoint(dir + "/step-00000005.ckpt", [](const std::string& n) { return n == "b"; });
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find(ShardFileName(5, 1) + ": a shard of checkpoint"),
            std::string::npos) << b.status().message();
}

TEST(ShardedCheckpointFiles, RefusesMissingForeignAndOverlappingShardsNamingThem) {
  struct Case {
    const char* name;
    std::function<HandMade()> make;
    const char* error;
  };
  const std::string b1 = ShardFileName(5, 1);
  const std::vector<Case> cases = {
      {"missing", [&] {
         HandMade h = Write("missing", Shard(0, {{0, 6}}), Shard(1, {{6, 6}}));
         std::filesystem::remove(h.dir + "/" + b1);
         return h;
       }, "a shard of checkpoint"},
      // Another save of step 5 replaced shard 1 (same size, other values): the CRC differs.
      {"foreign", [&] {
         HandMade h = Write("foreign", Shard(0, {{0, 6}}), Shard(1, {{6, 6}}));
         StateShard other = Shard(1, {{6, 6}});
         other.pieces[0].data[0] = -1.0f;
         EXPECT_TRUE(WriteCheckpointShard(h.dir + "/" + b1, other).ok());
         return h;
       }, "a shard of another run or another save of this step"},
      {"truncated", [&] {
         HandMade h = Write("truncated", Shard(0, {{0, 6}}), Shard(1, {{6, 6}}));
         std::filesystem::resize_file(h.dir + "/" + b1, 100);
         return h;
       }, "bytes, the manifest"},
      {"overlap", [&] { return Write("overlap", Shard(0, {{0, 7}}), Shard(1, {{6, 6}})); },
       "tensor 't': elements 6..6 are in two shards"},
      {"gap", [&] { return Write("gap", Shard(0, {{0, 5}}), Shard(1, {{6, 6}})); },
       "tensor 't': elements 5..5 are in no shard"},
      {"rank_missing", [&] {
         return Write("rank_missing", Shard(0, {{0, 6}}, 3), Shard(1, {{6, 6}}, 3), 3);
       }, "rank 2 of 3 is in none of its 2 shards"},
      {"other_step", [&] {
         return Write("other_step", Shard(0, {{0, 6}}), Shard(1, {{6, 6}}, 2, /*step=*/6));
       }, "step 6 of a world of 2 ranks, but the manifest"},
      {"other_world", [&] { return Write("other_world", Shard(0, {{0, 6}}), Shard(1, {{6, 6}}, 4)); },
       "step 5 of a world of 4 ranks"},
  };
  for (const Case& c : cases) {
    const HandMade h = c.make();
    auto r = ReadCheckpoint(h.manifest);
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_NE(r.status().message().find(c.error), std::string::npos)
        << c.name << ": " << r.status().message();
    EXPECT_NE(r.status().message().find(h.dir), std::string::npos)
        << c.name << " does not name the file: " << r.status().message();
  }
}

// The folder: shards of a step without a manifest (a run killed between them) and temporary
// shards are removed at start; pruning deletes a checkpoint's shards with its manifest; shards
// of the step another split wrote are deleted after the new manifest.
TEST(ShardedCheckpointFiles, FolderCleansOrphansPrunesShardsAndStaleOnes) {
  const std::string dir = FreshDir("folder");
  auto touch = [&](const std::string& name) { std::ofstream(dir + "/" + name) << "x"; };
  for (int step : {2, 4, 6}) {
    touch(CheckpointFileName(step));
    touch(ShardFileName(step, 0));
    touch(ShardFileName(step, 4));
  }
  touch(ShardFileName(8, 0));  // step 8's manifest never came
  touch(ShardFileName(8, 4) + ".tmp");
  touch("notes.shard");
  auto removed = RemoveIncompleteCheckpoints(dir);
  ASSERT_TRUE(removed.ok()) << removed.status().message();
  EXPECT_EQ(*removed, (std::vector<std::string>{dir + "/" + ShardFileName(8, 0),
                                                dir + "/" + ShardFileName(8, 4) + ".tmp"}));
  auto pruned = PruneCheckpoints(dir, 2);
  ASSERT_TRUE(pruned.ok()) << pruned.status().message();
  EXPECT_EQ(*pruned, (std::vector<std::string>{dir + "/" + CheckpointFileName(2)}));
  EXPECT_FALSE(std::filesystem::exists(dir + "/" + ShardFileName(2, 0)));
  EXPECT_FALSE(std::filesystem::exists(dir + "/" + ShardFileName(2, 4)));
  EXPECT_TRUE(std::filesystem::exists(dir + "/" + ShardFileName(4, 4)));
  auto stale = RemoveStaleShards(dir, 6, {ShardFileName(6, 0)});
  ASSERT_TRUE(stale.ok()) << stale.status().message();
  EXPECT_EQ(*stale, (std::vector<std::string>{dir + "/" + ShardFileName(6, 4)}));
  EXPECT_TRUE(std::filesystem::exists(dir + "/notes.shard"));
  auto list = ListCheckpoints(dir);
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 2u);  // shards are not checkpoints
}

}  // namespace
}  // namespace ptdp::rt
