// Issue 12, bounded inputs end to end: the ptdp binary refuses, in one line and at once, a
// device or a FIFO where a file is expected and a file over its kind's size limit. Every
// command runs under `timeout 60`, so a read that would block or never end fails the test
// (exit 124) instead of hanging the suite.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "tests/fakes/shell.h"

namespace {

using ptdp::testing::CmdResult;
using ptdp::testing::ExpectOneLineError;
using ptdp::testing::FreshDir;
using ptdp::testing::Shell;

const std::string kBin = "timeout 60 " + std::string(PTDP_BINARY_DIR) + "/ptdp";

TEST(BoundedInputs, ADeviceAsAConfigIsRefused) {
  ExpectOneLineError(Shell(kBin + " plan --cluster /dev/zero --model gpt-tiny --global-batch 8"),
                     "/dev/zero: is not a regular file (a FIFO, socket or device), not a cluster YAML", 1);
  ExpectOneLineError(Shell(kBin + " plan --cluster local-cpu --model /dev/urandom --global-batch 8"),
                     "/dev/urandom: is not a regular file (a FIFO, socket or device), not a model YAML", 1);
}

TEST(BoundedInputs, AHugePlanIsRefusedFromItsSize) {
  const std::string dir = FreshDir("bounded-plan");
  const std::string plan = dir + "/plan.yaml";
  ASSERT_EQ(Shell("truncate -s 200M " + plan).code, 0);  // sparse: nothing is written
  for (const std::string& cmd : {std::string(" simulate "), std::string(" train "),
                                 " report --html " + dir + "/r.html "})
    ExpectOneLineError(Shell(kBin + cmd + plan),
                       plan + ": 200 MiB, more than the 16 MiB a plan.yaml may have", 1);
}

TEST(BoundedInputs, AFifoWhereAFileIsExpectedIsRefusedAtOnce) {
  const std::string dir = FreshDir("bounded-fifo");
  const std::string plan = dir + "/plan.yaml";
  CmdResult r = Shell(kBin + " plan --cluster local-cpu --model gpt-tiny --gpus 1 --global-batch 4"
                             " --recompute none --top 1 --out " + plan);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string fifo = dir + "/measured.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ExpectOneLineError(Shell(kBin + " compare " + plan + " " + fifo),
                     fifo + ": is not a regular file", 1);

  // A FIFO named like the newest checkpoint: `--resume` refuses it by name, never waits on it.
  const std::string ckpt = dir + "/ckpt";
  ASSERT_EQ(::mkdir(ckpt.c_str(), 0755), 0);
  const std::string newest = ckpt + "/step-00000004.ckpt";
  ASSERT_EQ(::mkfifo(newest.c_str(), 0600), 0);
  r = Shell(kBin + " train " + plan + " --steps 6 --checkpoint-dir " + ckpt + " --resume");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find(newest + ": is not a regular file"), std::string::npos) << r.out;
}

}  // namespace
