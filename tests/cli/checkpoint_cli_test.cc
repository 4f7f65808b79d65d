// `ptdp train` checkpoints end to end on the real binary: resuming gives the losses of a run
// never interrupted, to the last bit (measured.json keeps doubles exactly); kill -9 during a
// step and during a checkpoint write leave the last complete checkpoint intact and resumable;
// a damaged newest checkpoint is refused naming it; resuming into another layout continues
// within fp32 tolerance; SIGTERM, SIGINT and SIGHUP stop at a step boundary, save and write
// measured.json, and the run resumes bit for bit; a second run on a folder is refused naming the
// holder; unwritable folders are refused before training. gpt-tiny (s 64), global batch 8, 12
// steps, a checkpoint every 4.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/checkpoint.h"
#include "tests/fakes/process.h"
#include "tests/fakes/shell.h"

namespace {

namespace fs = std::filesystem;
using ptdp::testing::CmdResult;

const std::string kSrc = PTDP_SOURCE_DIR;
const std::string kBin = std::string(PTDP_BINARY_DIR) + "/ptdp";
const std::string kCpu = kSrc + "/configs/clusters/local-cpu.yaml";
const std::string kTiny = kSrc + "/configs/models/gpt-tiny.yaml";
// Per process: ctest runs each test of this file as its own process, in parallel.
const std::string kTmp = ::testing::TempDir() + "/ckpt_cli_" + std::to_string(getpid());

// Removes this process's folder (checkpoints of a few MB each) when the tests end.
struct RemoveTmpAtExit {
  ~RemoveTmpAtExit() { fs::remove_all(kTmp); }
} remove_tmp_at_exit;

CmdResult Ptdp(const std::string& args) { return ptdp::testing::Shell(kBin + " " + args); }

std::string MakePlan(const std::string& name, const std::string& layout_flags, int gpus,
                     int global_batch = 8) {
  fs::create_directories(kTmp);
  const std::string path = kTmp + "/" + name + ".plan.yaml";
  const CmdResult r = Ptdp("plan --cluster " + kCpu + " --model " + kTiny + " --gpus " +
                           std::to_string(gpus) + " --global-batch " +
                           std::to_string(global_batch) + " " + layout_flags +
                           " --refine 0 --out " + path);
  EXPECT_EQ(r.code, 0) << r.out;
  return path;
}

std::string FreshDir(const std::string& name) {
  const std::string dir = kTmp + "/" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// "step" -> loss, grad norm of measured.json.
struct Losses {
  std::vector<int64_t> step;
  std::vector<double> loss, grad_norm;
};
Losses ReadLosses(const std::string& path) {
  Losses l;
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "no " << path;
    return l;
  }
  const auto j = nlohmann::json::parse(in);
  for (const auto& s : j["steps"]) {
    l.step.push_back(s["step"].get<int64_t>());
    l.loss.push_back(s["loss"].get<double>());
    l.grad_norm.push_back(s["grad_norm"].get<double>());
  }
  return l;
}

const std::string& Plan() {
  static const std::string plan = MakePlan("tp2pp2", "--tp 2 --pp 2 --micro-batch 2", 4);
  return plan;
}

std::string TrainArgs(const std::string& plan, const std::string& dir, const std::string& out) {
  return "train " + plan + " --steps 12 --save-every 4 --checkpoint-dir " + dir +
         " --no-speed-probe --out " + out;  // the probe is compare_test's
}

// The uninterrupted run every interrupted one is compared with (12 steps, tp2 pp2).
const Losses& Whole() {
  static const Losses whole = [] {
    const std::string dir = FreshDir("whole");
    const CmdResult r = Ptdp(TrainArgs(Plan(), dir, dir + "/measured.json"));
    EXPECT_EQ(r.code, 0) << r.out;
    return ReadLosses(dir + "/measured.json");
  }();
  return whole;
}

// The resumed run's steps must be the uninterrupted run's steps from `from` on, bit for bit.
void ExpectContinues(const Losses& resumed, int64_t from) {
  const Losses& whole = Whole();
  ASSERT_EQ(whole.step.size(), 12u);
  ASSERT_EQ(resumed.step.size(), size_t(12 - from));
  for (size_t i = 0; i < resumed.step.size(); ++i) {
    EXPECT_EQ(resumed.step[i], from + int64_t(i));
    EXPECT_EQ(resumed.loss[i], whole.loss[size_t(from) + i]) << "step " << resumed.step[i];
    EXPECT_EQ(resumed.grad_norm[i], whole.grad_norm[size_t(from) + i]) << "step " << resumed.step[i];
  }
}

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(TrainCheckpoint, ResumeGivesTheSameLossesBitForBit) {
  const std::string dir = FreshDir("resume");
  CmdResult r = Ptdp(TrainArgs(Plan(), dir, dir + "/first.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("saved " + dir + "/step-00000004.ckpt"), std::string::npos) << r.out;
  // --keep 3 (default): steps 4, 8, 12. Drop the last two, as if the run had died after step 5.
  EXPECT_EQ(Names(dir), (std::vector<std::string>{"first.json", "step-00000004.ckpt",
                                                  "step-00000008.ckpt", "step-00000012.ckpt"}));
  fs::remove(dir + "/step-00000008.ckpt");
  fs::remove(dir + "/step-00000012.ckpt");
  r = Ptdp(TrainArgs(Plan(), dir, dir + "/resumed.json") + " --resume");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("loaded " + dir + "/step-00000004.ckpt: step 4"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step    4/12"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step    5/12"), std::string::npos) << r.out;
  ExpectContinues(ReadLosses(dir + "/resumed.json"), 4);
  // The first run's own losses are the uninterrupted ones too (the same command).
  EXPECT_EQ(ReadLosses(dir + "/first.json").loss, Whole().loss);
}

TEST(TrainCheckpoint, Kill9DuringAStepResumesFromTheLastCheckpoint) {
  const std::string dir = FreshDir("kill_step");
  ASSERT_EQ(Whole().step.size(), 12u);
  std::string line;
  {
    ptdp::testing::Child child(kBin + " " + TrainArgs(Plan(), dir, dir + "/killed.json"));
    ASSERT_TRUE(child.started());
    ASSERT_TRUE(child.WaitForLine("step    6/12", 120, &line)) << child.output();
    // Half a step after step 6's line: inside step 7 (nothing else runs between the lines).
    const double ms = std::stod(line.substr(line.find(" ms") - 8, 8));
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms / 2));
    child.Signal(SIGKILL);
    const int status = child.Wait();
    ASSERT_TRUE(WIFSIGNALED(status)) << child.output();
    EXPECT_EQ(WTERMSIG(status), SIGKILL);
    // It died inside step 7 or 8: step 8's line (and so its checkpoint) never came.
    EXPECT_EQ(child.output().find("step    8/12"), std::string::npos) << child.output();
  }
  // The lock file stays (nothing ran its release), its flock died with the process.
  EXPECT_EQ(Names(dir), (std::vector<std::string>{".ptdp-lock", "step-00000004.ckpt"}));
  const CmdResult r = Ptdp(TrainArgs(Plan(), dir, dir + "/resumed.json") + " --resume");
  ASSERT_EQ(r.code, 0) << r.out;
  ExpectContinues(ReadLosses(dir + "/resumed.json"), 4);
  EXPECT_FALSE(fs::exists(dir + "/.ptdp-lock"));  // taken over, then released
}

TEST(TrainCheckpoint, Kill9DuringACheckpointWriteLeavesThePreviousOne) {
  const std::string dir = FreshDir("kill_write");
  ASSERT_EQ(Whole().step.size(), 12u);
  std::string line;
  {
    ptdp::testing::Child child("env PTDP_TEST_PAUSE_CHECKPOINT_WRITE=8 " + kBin + " " +
                               TrainArgs(Plan(), dir, dir + "/killed.json"));
    ASSERT_TRUE(child.started());
    ASSERT_TRUE(child.WaitForLine("checkpoint write paused: ", 120, &line)) << child.output();
    EXPECT_NE(line.find(dir + "/step-00000008.ckpt.tmp"), std::string::npos) << line;
    child.Signal(SIGKILL);
    const int status = child.Wait();
    ASSERT_TRUE(WIFSIGNALED(status)) << child.output();
  }
  // The half-written file is there under its temporary name, refused as truncated; the
  // previous checkpoint is whole.
  EXPECT_EQ(Names(dir), (std::vector<std::string>{".ptdp-lock", "step-00000004.ckpt",
                                                  "step-00000008.ckpt.tmp"}));
  auto partial = ptdp::rt::ReadCheckpoint(dir + "/step-00000008.ckpt.tmp");
  ASSERT_FALSE(partial.ok());
  EXPECT_NE(partial.status().message().find("truncated"), std::string::npos) << partial.status().message();
  auto prev = ptdp::rt::ReadCheckpoint(dir + "/step-00000004.ckpt");
  ASSERT_TRUE(prev.ok()) << prev.status().message();
  EXPECT_EQ(prev->state.step, 4);
  const CmdResult r = Ptdp(TrainArgs(Plan(), dir, dir + "/resumed.json") + " --resume");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("removed " + dir + "/step-00000008.ckpt.tmp"), std::string::npos) << r.out;
  ExpectContinues(ReadLosses(dir + "/resumed.json"), 4);
}

// The same with --ckpt-format sharded: killed halfway through step 8's shard, the folder holds
// step 4's manifest and shard and step 8's partial shard under its temporary name; --resume
// removes it and continues from step 4 with the uninterrupted run's losses.
TEST(TrainCheckpoint, Kill9DuringAShardWriteLeavesThePreviousCheckpoint) {
  const std::string dir = FreshDir("kill_shard");
  ASSERT_EQ(Whole().step.size(), 12u);
  const std::string sharded = " --ckpt-format sharded";
  std::string line;
  {
    ptdp::testing::Child child("env PTDP_TEST_PAUSE_CHECKPOINT_WRITE=8 " + kBin + " " +
                               TrainArgs(Plan(), dir, dir + "/killed.json") + sharded);
    ASSERT_TRUE(child.started());
    ASSERT_TRUE(child.WaitForLine("checkpoint write paused: ", 120, &line)) << child.output();
    EXPECT_NE(line.find(dir + "/step-00000008.rank00000.shard.tmp"), std::string::npos) << line;
    child.Signal(SIGKILL);
    const int status = child.Wait();
    ASSERT_TRUE(WIFSIGNALED(status)) << child.output();
  }
  EXPECT_EQ(Names(dir), (std::vector<std::string>{".ptdp-lock", "step-00000004.ckpt",
                                                  "step-00000004.rank00000.shard",
                                                  "step-00000008.rank00000.shard.tmp"}));
  const CmdResult r = Ptdp(TrainArgs(Plan(), dir, dir + "/resumed.json") + sharded + " --resume");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("removed " + dir + "/step-00000008.rank00000.shard.tmp"), std::string::npos)
      << r.out;
  ExpectContinues(ReadLosses(dir + "/resumed.json"), 4);
}

TEST(TrainCheckpoint, RefusesADamagedNewestCheckpointNamingIt) {
  const std::string dir = FreshDir("damaged");
  CmdResult r = Ptdp("train " + Plan() + " --steps 2 --checkpoint-dir " + dir);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string path = dir + "/step-00000002.ckpt";
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_GT(bytes.size(), 1000u);
  struct Case {
    std::string bytes, expect;
  };
  std::string altered = bytes;
  altered[bytes.size() / 2] ^= 0x10;
  for (const Case& c : {Case{altered, "checksum mismatch"},
                        Case{bytes.substr(0, bytes.size() - 100), "truncated"}}) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << c.bytes;
    r = Ptdp("train " + Plan() + " --steps 4 --checkpoint-dir " + dir + " --resume");
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("ptdp: " + path + ": " + c.expect), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("step    3/4"), std::string::npos) << r.out;
  }
}

TEST(TrainCheckpoint, ResumesIntoAnotherLayoutWithinFp32Tolerance) {
  const std::string dir = FreshDir("reshard");
  CmdResult r = Ptdp(TrainArgs(Plan(), dir, dir + "/first.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  fs::remove(dir + "/step-00000008.ckpt");
  fs::remove(dir + "/step-00000012.ckpt");
  const std::string dp2 = MakePlan("dp2dopt", "--dp 2 --micro-batch 2 --dist-opt on", 2);
  r = Ptdp(TrainArgs(dp2, dir, dir + "/resumed.json") + " --resume");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("resharding: the checkpoint was written by tp2 pp2 dp1"), std::string::npos)
      << r.out;
  const Losses got = ReadLosses(dir + "/resumed.json");
  ASSERT_EQ(got.step.size(), 8u);
  for (size_t i = 0; i < got.step.size(); ++i)
    EXPECT_NEAR(got.loss[i], Whole().loss[4 + i], 1e-5 * Whole().loss[4 + i]) << got.step[i];
}

// --ckpt-format sharded in one process: a shard (all four ranks) plus the manifest per save;
// pruning takes the shards with the manifests; --resume from step 4's manifest continues with
// the uninterrupted (whole-file) run's losses bit for bit.
TEST(TrainCheckpoint, ShardedFormatResumesBitForBit) {
  const std::string dir = FreshDir("sharded");
  CmdResult r = Ptdp(TrainArgs(Plan(), dir, dir + "/first.json") + " --ckpt-format sharded");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("saved " + dir + "/step-00000004.ckpt ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(", 1 shard in "), std::string::npos) << r.out;
  EXPECT_EQ(Names(dir), (std::vector<std::string>{
                            "first.json", "step-00000004.ckpt", "step-00000004.rank00000.shard",
                            "step-00000008.ckpt", "step-00000008.rank00000.shard",
                            "step-00000012.ckpt", "step-00000012.rank00000.shard"}));
  EXPECT_EQ(ReadLosses(dir + "/first.json").loss, Whole().loss);
  // As if the run had died after step 5: step 8's manifest never came (its shard stays, an
  // orphan the next run removes), step 12 never happened.
  fs::remove(dir + "/step-00000008.ckpt");
  fs::remove(dir + "/step-00000012.ckpt");
  fs::remove(dir + "/step-00000012.rank00000.shard");
  r = Ptdp(TrainArgs(Plan(), dir, dir + "/resumed.json") + " --resume");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("removed " + dir + "/step-00000008.rank00000.shard"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("found " + dir + "/step-00000004.ckpt: step 4, written by tp2 pp2"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find(", in 1 shard\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("loaded " + dir + "/step-00000004.ckpt: 1 of its 1 shards"),
            std::string::npos) << r.out;
  ExpectContinues(ReadLosses(dir + "/resumed.json"), 4);
  r = Ptdp("train " + Plan() + " --steps 1 --ckpt-format torch_dist");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--ckpt-format 'torch_dist': expected whole, sharded or auto"),
            std::string::npos) << r.out;
}

// `ptdp checkpoint`: verifies the newest checkpoint of a folder and says what it holds;
// --to converts a sharded checkpoint into one whole file, from which a run resumes with the
// same losses; one altered byte of a shard: exit 1 naming the shard.
TEST(CheckpointCommand, VerifiesDescribesConvertsAndRefusesDamage) {
  const std::string dir = FreshDir("command");
  CmdResult r = Ptdp(TrainArgs(Plan(), dir, dir + "/first.json") + " --ckpt-format sharded");
  ASSERT_EQ(r.code, 0) << r.out;
  fs::remove(dir + "/step-00000008.ckpt");  // keep step 4 newest: the resume below continues
  fs::remove(dir + "/step-00000012.ckpt");
  r = Ptdp("checkpoint " + dir);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(dir + "/step-00000004.ckpt: verified (sharded: the manifest and 1 shard"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step 4 (4 optimizer updates, 32 samples consumed)"), std::string::npos) << r.out;
  const std::string whole = FreshDir("command_whole");
  r = Ptdp("checkpoint " + dir + "/step-00000004.ckpt --json --to " + whole + "/step-00000004.ckpt");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["format"], "sharded");
  EXPECT_EQ(j["step"], 4);
  EXPECT_EQ(j["verified"], true);
  r = Ptdp("checkpoint " + whole + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["format"], "whole");
  r = Ptdp(TrainArgs(Plan(), whole, whole + "/resumed.json") + " --resume");
  ASSERT_EQ(r.code, 0) << r.out;
  ExpectContinues(ReadLosses(whole + "/resumed.json"), 4);
  // One byte of the shard's data altered.
  const std::string shard = dir + "/step-00000004.rank00000.shard";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-100, std::ios::end);
    f.put('\x7f');
  }
  r = Ptdp("checkpoint " + dir);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find(shard + ": checksum mismatch"), std::string::npos) << r.out;
}

TEST(TrainCheckpoint, RefusesWhatCannotContinue) {
  const std::string dir = FreshDir("refuse");
  CmdResult r = Ptdp("train " + Plan() + " --steps 2 --checkpoint-dir " + dir);
  ASSERT_EQ(r.code, 0) << r.out;
  // Another global batch: the data position would mean other samples.
  const std::string b16 = MakePlan("b16", "--tp 2 --pp 2 --micro-batch 2", 4, 16);
  r = Ptdp("train " + b16 + " --steps 4 --checkpoint-dir " + dir + " --resume");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find(dir + "/step-00000002.ckpt: written with global batch 8, the plan has 16"),
            std::string::npos)
      << r.out;
  // Already there.
  r = Ptdp("train " + Plan() + " --steps 2 --checkpoint-dir " + dir + " --resume");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("is at step 2 already"), std::string::npos) << r.out;
  // Flags.
  r = Ptdp("train " + Plan() + " --steps 2 --resume");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--resume needs --checkpoint-dir"), std::string::npos) << r.out;
  r = Ptdp("train " + Plan() + " --steps 2 --on-nan maybe");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--on-nan 'maybe': expected stop or skip"), std::string::npos) << r.out;
  r = Ptdp("train " + Plan() + " --steps 2 --checkpoint-dir " + dir + " --keep 0");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--keep 0"), std::string::npos) << r.out;
  // An empty folder: --resume starts from step 0 (the same command works before and after a crash).
  const std::string empty = FreshDir("empty");
  r = Ptdp("train " + Plan() + " --steps 1 --checkpoint-dir " + empty + " --resume");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("no checkpoint in " + empty + ": starting from step 0"), std::string::npos) << r.out;
}

// The run's output after a signal: one line saying which signal stopped it after how many steps,
// exit 128 + signo, measured.json with those steps and "interrupted", and the checkpoint of the
// last step done even with --save-every 0; `--resume` then continues with the losses of a run
// never interrupted.
TEST(TrainCheckpoint, SignalsStopAtAStepBoundarySaveAndResumeBitForBit) {
  ASSERT_EQ(Whole().step.size(), 12u);
  // The children inherit these; ctest or a shell may have left SIGINT/SIGHUP ignored.
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGHUP, SIG_DFL);
  const std::pair<int, std::string> signals[] = {{SIGTERM, "SIGTERM"}, {SIGINT, "SIGINT"}, {SIGHUP, "SIGHUP"}};
  for (const auto& [sig, name] : signals) {
    SCOPED_TRACE(name);
    const std::string dir = FreshDir("signal_" + name);
    const std::string args = "train " + Plan() + " --steps 12 --checkpoint-dir " + dir;  // no --save-every
    int status = 0;
    std::string out;
    {
      ptdp::testing::Child child(kBin + " " + args + " --out " + dir + "/stopped.json");
      ASSERT_TRUE(child.started());
      ASSERT_TRUE(child.WaitForLine("step    2/12", 120)) << child.output();
      child.Signal(sig);
      status = child.Wait();
      out = child.output();
    }
    ASSERT_TRUE(WIFEXITED(status)) << out;
    EXPECT_EQ(WEXITSTATUS(status), 128 + sig) << out;
    EXPECT_NE(out.find("ptdp: " + name + " received: stopping after this step"), std::string::npos) << out;
    std::ifstream in(dir + "/stopped.json");
    ASSERT_TRUE(in) << out;
    const auto j = nlohmann::json::parse(in);
    const int64_t done = j["interrupted"]["steps_done"].get<int64_t>();
    ASSERT_GE(done, 2);
    ASSERT_LT(done, 12) << "the signal came too late to stop the run early";
    EXPECT_EQ(j["interrupted"]["signal"], name);
    EXPECT_EQ(j["interrupted"]["signo"], sig);
    EXPECT_EQ(j["interrupted"]["steps_requested"], 12);
    const std::string ckpt = dir + "/" + ptdp::rt::CheckpointFileName(done);
    EXPECT_EQ(j["interrupted"]["checkpoint"], ckpt);
    EXPECT_TRUE(j["validation_loss"].is_null());  // skipped: a stopped run ends promptly
    const Losses stopped = ReadLosses(dir + "/stopped.json");
    ASSERT_EQ(stopped.step.size(), size_t(done));
    for (size_t i = 0; i < stopped.loss.size(); ++i) EXPECT_EQ(stopped.loss[i], Whole().loss[i]);
    EXPECT_NE(out.find("ptdp: " + name + ": stopped after step " + std::to_string(done) +
                       " of 12; saved " + ckpt + ", --resume continues from it (exit " +
                       std::to_string(128 + sig) + ")\n"),
              std::string::npos) << out;
    EXPECT_EQ(Names(dir), (std::vector<std::string>{ptdp::rt::CheckpointFileName(done), "stopped.json"}));
    const CmdResult r = Ptdp(args + " --resume --out " + dir + "/resumed.json");
    ASSERT_EQ(r.code, 0) << r.out;
    ExpectContinues(ReadLosses(dir + "/resumed.json"), done);
  }
}

// The first signal is handled (its line is printed, the paused checkpoint write goes on); a
// second one takes the default action at once: killed by SIGTERM long before the 10-minute pause
// ends. The lock dies with the process: the next run takes it.
TEST(TrainCheckpoint, ASecondSignalEndsTheRunAtOnce) {
  const std::string dir = FreshDir("second_signal");
  const auto t0 = std::chrono::steady_clock::now();
  {
    ptdp::testing::Child child("env PTDP_TEST_PAUSE_CHECKPOINT_WRITE=4 " + kBin + " " +
                               TrainArgs(Plan(), dir, dir + "/killed.json"));
    ASSERT_TRUE(child.started());
    ASSERT_TRUE(child.WaitForLine("checkpoint write paused: ", 120)) << child.output();
    child.Signal(SIGTERM);
    ASSERT_TRUE(child.WaitForLine("ptdp: SIGTERM received: stopping after this step", 30)) << child.output();
    child.Signal(SIGTERM);
    const int status = child.Wait();
    ASSERT_TRUE(WIFSIGNALED(status)) << child.output();
    EXPECT_EQ(WTERMSIG(status), SIGTERM);
    EXPECT_EQ(child.output().find("wrote "), std::string::npos) << child.output();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 120);
  EXPECT_EQ(Names(dir), (std::vector<std::string>{".ptdp-lock", "step-00000004.ckpt.tmp"}));
  const CmdResult r = Ptdp("train " + Plan() + " --steps 1 --checkpoint-dir " + dir);
  EXPECT_EQ(r.code, 0) << r.out;
}

// Run A holds the folder (paused in the write of step 8, after saving steps 2, 4 and 6); run B
// on the same folder is refused at start with one line naming the folder and A (pid, host,
// since when) and changes nothing; A's checkpoints are whole; after kill -9 of A, run C takes
// the lock and resumes from step 6 bit for bit.
TEST(TrainCheckpoint, ASecondRunOnTheFolderIsRefusedNamingTheHolder) {
  ASSERT_EQ(Whole().step.size(), 12u);
  const std::string dir = FreshDir("two_runs");
  const std::string args = "train " + Plan() + " --steps 12 --save-every 2 --checkpoint-dir " + dir;
  const std::vector<std::string> a_files = {".ptdp-lock", "step-00000002.ckpt", "step-00000004.ckpt",
                                            "step-00000006.ckpt", "step-00000008.ckpt.tmp"};
  {
    // sh prints its pid, then becomes ptdp (exec keeps the pid).
    ptdp::testing::Child a("sh -c 'echo holder $$; exec env PTDP_TEST_PAUSE_CHECKPOINT_WRITE=8 " +
                           kBin + " " + args + "'");
    ASSERT_TRUE(a.started());
    std::string holder;
    ASSERT_TRUE(a.WaitForLine("holder ", 30, &holder)) << a.output();
    const std::string pid = holder.substr(holder.find(' ') + 1);
    ASSERT_TRUE(a.WaitForLine("checkpoint write paused: ", 120)) << a.output();
    ASSERT_EQ(Names(dir), a_files);
    const CmdResult b = Ptdp(args + " --out " + dir + "/b.json");
    ptdp::testing::ExpectOneLineError(b, "ptdp: --checkpoint-dir " + dir + ": in use by another run (pid " + pid + ", host ", 1);
    EXPECT_NE(b.out.find(", since 20"), std::string::npos) << b.out;
    EXPECT_NE(b.out.find("lock file " + dir + "/.ptdp-lock"), std::string::npos) << b.out;
    EXPECT_EQ(Names(dir), a_files);  // B wrote nothing, not even its measured.json
    for (int step : {2, 4, 6}) {
      auto c = ptdp::rt::ReadCheckpoint(dir + "/" + ptdp::rt::CheckpointFileName(step));
      ASSERT_TRUE(c.ok()) << c.status().message();
      EXPECT_EQ(c->state.step, step);
    }
    a.Signal(SIGKILL);
    a.Wait();
  }
  const CmdResult c = Ptdp(args + " --resume --out " + dir + "/c.json");
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("loaded " + dir + "/step-00000006.ckpt: step 6"), std::string::npos) << c.out;
  ExpectContinues(ReadLosses(dir + "/c.json"), 6);
}

// Folders that cannot take a file are found before the first step, not at the first save.
TEST(TrainCheckpoint, RefusesUnwritableFoldersBeforeTraining) {
  const std::string dir = FreshDir("unwritable");
  std::ofstream(dir + "/file") << "a file";
  struct Case {
    std::string flags, error;
  };
  const Case cases[] = {
      // /proc takes no new files or folders, even from root.
      {"--checkpoint-dir /proc/ptdp-test",
       "--checkpoint-dir /proc/ptdp-test: cannot create the folder: "},
      {"--checkpoint-dir /proc", "--checkpoint-dir /proc: cannot create a file in the folder: "},
      {"--checkpoint-dir " + dir + "/file", "--checkpoint-dir " + dir + "/file: is not a folder"},
      {"--out /proc/measured.json",
       "--out /proc/measured.json: the folder /proc: cannot create a file in the folder: "},
      {"--out " + dir, "--out " + dir + ": is a folder, not a file"},
      {"--out " + dir + "/file/measured.json", "the folder " + dir + "/file: is not a folder"}};
  for (const Case& c : cases) {
    const CmdResult r = Ptdp("train " + Plan() + " --steps 30 " + c.flags);
    ptdp::testing::ExpectOneLineError(r, c.error, 1);
  }
}

TEST(TrainCheckpoint, RefusesReadOnlyFoldersBeforeTraining) {
  if (::geteuid() == 0) GTEST_SKIP() << "running as root, which ignores folder permissions";
  const std::string ro = FreshDir("read_only");
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
  const std::string denied = ": Permission denied";
  const std::pair<std::string, std::string> cases[] = {
      {"--checkpoint-dir " + ro, "--checkpoint-dir " + ro + ": cannot create a file in the folder" + denied},
      {"--checkpoint-dir " + ro + "/sub", "--checkpoint-dir " + ro + "/sub: cannot create the folder" + denied},
      {"--out " + ro + "/m.json",
       "--out " + ro + "/m.json: the folder " + ro + ": cannot create a file in the folder" + denied}};
  for (const auto& [flags, error] : cases) {
    const CmdResult r = Ptdp("train " + Plan() + " --steps 30 " + flags);
    ptdp::testing::ExpectOneLineError(r, error, 1);
  }
  fs::permissions(ro, fs::perms::owner_all);
}

}  // namespace
