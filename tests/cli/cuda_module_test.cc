// Planning must not load the GPU libraries (issue 11): the ptdp binary links none of cudart,
// cuBLAS, cuBLASLt, NCCL or MPI; `plan` and `simulate` load none of them and stay within the
// start-up budget (docs/benchmarks.md, "Whole-process start-up"); `info` and `--backend cuda`
// open the CUDA module lib/ptdp/libptdp_cuda.so (cli/cuda_module.h), and each way that can fail
// is one line naming the cause. Runs in every build; a build without CUDA checks its own
// messages instead.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/fakes/shell.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using ptdp::testing::CmdResult;

const std::string kSrc = PTDP_SOURCE_DIR;
const std::string kBin = std::string(PTDP_BINARY_DIR) + "/ptdp";
const std::string kA100 = kSrc + "/configs/clusters/dgx-a100.yaml";
const std::string kCorpus = kSrc + "/data/tinyshakespeare/input.txt";
// The two commands of the issue: GPT-3 175B on 1024 A100s, and one step of the Megatron paper's
// 1T row (tp 8, pp 64, dp 6, interleaved v 2: 391,362 simulated operations).
const std::vector<std::string> kPlan = {"plan", "--cluster", kA100, "--model",
                                        kSrc + "/configs/models/gpt3-175b.yaml",
                                        "--global-batch", "1536"};
const std::vector<std::string> kSimulate1T = {
    "simulate", "--cluster", kA100, "--model", kSrc + "/configs/models/megatron-1t.yaml",
    "--nodes", "384", "--global-batch", "3072", "--tp", "8", "--pp", "64", "--dp", "6",
    "--vp", "2", "--micro-batch", "1", "--recompute", "full"};
// The libraries a planning command must not load (libcuda also matches libcudart).
const char* const kGpuLibraries[] = {"libcuda", "libcublas", "libnccl", "libmpi", "libptdp_cuda"};

CmdResult Ptdp(const std::string& args, const std::string& env = "") {
  return ptdp::testing::Shell(env + " " + kBin + " " + args);
}

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& a : v) s += (s.empty() ? "" : " ") + a;
  return s;
}

nlohmann::json Info(const std::string& bin = kBin, const std::string& env = "") {
  const CmdResult r = ptdp::testing::Shell(env + " " + bin + " info --json", false);
  EXPECT_EQ(r.code, 0) << r.out;
  return nlohmann::json::parse(r.out);
}

// Every failure here: exit 1, one line starting with "ptdp:" and naming the cause.
using ptdp::testing::ExpectOneLineError;

// gpt-tiny on one CPU rank slot, for `train --backend cuda` to refuse.
std::string TinyPlan() {
  static const std::string path = [] {
    const std::string p = ::testing::TempDir() + "/cuda-module-tiny.plan.yaml";
    const CmdResult r = Ptdp("plan --cluster " + kSrc + "/configs/clusters/local-cpu.yaml --model " +
                             kSrc + "/configs/models/gpt-tiny.yaml --gpus 1 --global-batch 8 "
                             "--refine 0 --out " + p);
    EXPECT_EQ(r.code, 0) << r.out;
    return p;
  }();
  return path;
}

CmdResult TrainCuda(const std::string& env = "", const std::string& bin = kBin) {
  return ptdp::testing::Shell(env + " " + bin + " train " + TinyPlan() +
                              " --backend cuda --steps 1 --corpus " + kCorpus);
}

// The peak RSS of one run of ptdp, MiB, from wait4: an upper bound, as Linux counts the spawning
// process's RSS at the exec too (this test's few MiB).
double PeakRssMib(const std::vector<std::string>& args) {
  std::vector<std::string> argv_s = {kBin};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, kBin.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  EXPECT_EQ(rc, 0) << "cannot start " << kBin;
  if (rc != 0) return 0;
  int status = 0;
  struct rusage ru {};
  EXPECT_EQ(wait4(pid, &status, 0, &ru), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << Join(args);
  return double(ru.ru_maxrss) / 1024;  // ru_maxrss is in KiB on Linux
}

TEST(CudaModule, PtdpLinksNoGpuLibrary) {
  const CmdResult r = ptdp::testing::Shell("readelf -d " + kBin);
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_NE(r.out.find("(NEEDED)"), std::string::npos) << r.out;  // readelf saw the entries
  for (const char* lib : kGpuLibraries) EXPECT_EQ(r.out.find(lib), std::string::npos) << r.out;
}

// LD_DEBUG=libs: the dynamic loader names every library it loads, linked or dlopen'ed.
TEST(CudaModule, PlanAndSimulateLoadNoGpuLibrary) {
  for (const auto& cmd : {kPlan, kSimulate1T}) {
    const CmdResult r = Ptdp(Join(cmd), "LD_DEBUG=libs");
    ASSERT_EQ(r.code, 0) << r.out.substr(0, 2000);
    ASSERT_NE(r.out.find("libyaml-cpp"), std::string::npos) << "LD_DEBUG printed nothing";
    for (const char* lib : kGpuLibraries)
      EXPECT_EQ(r.out.find(lib), std::string::npos) << cmd[0] << " loads " << lib;
  }
  // ... while `info` does load them, where CUDA is built: the check above would see them.
  if (Info()["cuda_compiled"] == true) {
    const CmdResult r = Ptdp("info", "LD_DEBUG=libs");
    EXPECT_NE(r.out.find("libcublas"), std::string::npos) << r.out.substr(0, 2000);
    EXPECT_NE(r.out.find("libptdp_cuda.so"), std::string::npos);
  }
}

// The memory budget: `plan` <= 48 MiB whole process (221 MiB with the GPU libraries
// linked); the 1T simulation's 100 MiB bound is ours (4x what it takes now). Peak RSS is the
// part of the start-up cost that does not depend on the machine's load; the times (plan <= 30
// ms, the 1T simulation <= 100 ms) are a benchmark's, not a unit test's: scripts/startup.sh
// (`make bench`) measures their wall-time medians, docs/benchmarks.md has the figures. Under a
// sanitizer the binary is a Debug build with shadow memory: the budget is not its.
TEST(CudaModule, PlanAndSimulateFitTheMemoryBudget) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "built with AddressSanitizer: its shadow memory is not the release binary's RSS";
#endif
  struct Case {
    const std::vector<std::string>* args;
    double rss_mib;
  };
  for (const Case& c : {Case{&kPlan, 48}, Case{&kSimulate1T, 100}}) {
    double best = 1e9;
    for (int i = 0; i < 3; ++i) best = std::min(best, PeakRssMib(*c.args));
    EXPECT_LE(best, c.rss_mib) << (*c.args)[0];
    std::printf("%s: %.1f MiB peak RSS\n", (*c.args)[0].c_str(), best);
  }
}

TEST(CudaModule, InfoReportsTheModuleAndVersions) {
  const nlohmann::json j = Info();
  ASSERT_TRUE(j.contains("cuda_compiled"));
  if (j["cuda_compiled"] != true) {
    EXPECT_TRUE(j["cuda_module"].is_null());
    EXPECT_NE(j["why_no_gpu"].get<std::string>().find("built without the CUDA backend"),
              std::string::npos) << j.dump();
    EXPECT_EQ(j["backends"].size(), 1u);
    return;
  }
  const fs::path module = fs::path(PTDP_BINARY_DIR) / "lib/ptdp/libptdp_cuda.so";
  ASSERT_TRUE(j["cuda_module"].is_string()) << j.dump();
  EXPECT_TRUE(fs::equivalent(j["cuda_module"].get<std::string>(), module)) << j["cuda_module"];
  EXPECT_GT(j["cuda_runtime_version"].get<int>(), 0);  // the runtime answers without a driver
  EXPECT_TRUE(j["cublas_version"].is_string()) << j.dump();
  EXPECT_TRUE(j["nccl_version"].is_string()) << j.dump();
  if (j["mpi"] == true) {
    EXPECT_FALSE(j["mpi_version"].get<std::string>().empty());
  }
  if (j["gpus_visible"].get<int>() == 0) {
    EXPECT_FALSE(j["why_no_gpu"].get<std::string>().empty());  // CUDA's reason, e.g. no driver
  }
}

TEST(CudaModule, BackendCudaSaysWhyInOneLine) {
  const nlohmann::json j = Info();
  if (j["gpus_visible"].get<int>() > 0) GTEST_SKIP() << "a GPU is usable here";
  // why_no_gpu is --backend cuda's reason: CUDA's once the module loaded (it reports the CUDA
  // runtime), the build's or the loader's otherwise.
  const bool loaded = j.contains("cuda_runtime_version");
  const std::string why = (loaded ? "no CUDA GPU is usable here: " : "") +
                          j["why_no_gpu"].get<std::string>();
  ExpectOneLineError(TrainCuda(), "--backend cuda: " + why, 1);
  ExpectOneLineError(Ptdp("calibrate --backend cuda --quick --out " + ::testing::TempDir() +
                          "/never.yaml"),
                     "--backend cuda: " + why, 1);
}

TEST(CudaModule, UnknownAttentionKernelIsRefusedFirst) {
  // Checked before the module and the GPUs: the same line in every build, with or without one.
  ExpectOneLineError(TrainCuda("PTDP_CUDA_ATTENTION=fast"),
                     "PTDP_CUDA_ATTENTION 'fast': expected flash, flash-mma or unfused", 1);
  ExpectOneLineError(TrainCuda("PTDP_CUDA_EPILOGUE=maybe"),
                     "PTDP_CUDA_EPILOGUE 'maybe': expected on or off", 1);
}

TEST(CudaModule, MissingModuleSaysWhereItLooked) {
  if (Info()["cuda_compiled"] != true) {
    // Without CUDA there is no module to look for, whatever the environment says.
    ExpectOneLineError(TrainCuda("PTDP_CUDA_MODULE=/nonexistent/libptdp_cuda.so"),
                       "built without the CUDA backend", 1);
    return;
  }
  ExpectOneLineError(TrainCuda("PTDP_CUDA_MODULE=/nonexistent/libptdp_cuda.so"),
                     "--backend cuda: PTDP_CUDA_MODULE '/nonexistent/libptdp_cuda.so': no such file",
                     1);
  // A copy of the binary with no lib/ beside or above it.
  const std::string fresh = ptdp::testing::FreshDir("lonely");
  ASSERT_FALSE(fresh.empty());
  const std::string dir = fs::canonical(fresh).string();  // as /proc/self/exe names it
  fs::create_directory(dir + "/bin");
  fs::copy_file(kBin, dir + "/bin/ptdp");
  const std::string where = "no lib/ptdp/libptdp_cuda.so at or above the binary's folder " + dir + "/bin";
  ExpectOneLineError(TrainCuda("", dir + "/bin/ptdp"),
                     "--backend cuda: the CUDA module is missing: " + where, 1);
  const nlohmann::json j = Info(dir + "/bin/ptdp");
  EXPECT_TRUE(j["cuda_module"].is_null());
  EXPECT_NE(j["why_no_gpu"].get<std::string>().find(where), std::string::npos) << j.dump();
  EXPECT_EQ(j["backends"].size(), 1u);
  // Planning never needed it.
  const CmdResult plan = ptdp::testing::Shell(dir + "/bin/ptdp " + Join(kPlan) + " --top 1");
  EXPECT_EQ(plan.code, 0) << plan.out;
}

// `cmake --install` puts the module in PREFIX/lib/ptdp, where the installed binary finds it.
TEST(CudaModule, InstalledBinaryFindsItsModule) {
  const std::string fresh = ptdp::testing::FreshDir("prefix");
  ASSERT_FALSE(fresh.empty());
  const std::string prefix = fs::canonical(fresh).string();
  const CmdResult r = ptdp::testing::Shell(std::string(PTDP_CMAKE_COMMAND) + " --install " +
                                     PTDP_BINARY_DIR + " --prefix " + prefix);
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = Info(prefix + "/bin/ptdp");
  if (j["cuda_compiled"] == true) {
    EXPECT_EQ(j["cuda_module"], prefix + "/lib/ptdp/libptdp_cuda.so") << j.dump();
    EXPECT_TRUE(j["nccl_version"].is_string()) << j.dump();  // it loaded
  } else {
    EXPECT_FALSE(fs::exists(prefix + "/lib/ptdp"));
  }
}

#ifdef PTDP_FAKE_MODULE_OTHER_ABI
// Modules the loader must refuse (tests/fakes/fake_cuda_module.cc), and a file that is no
// shared object at all: each a line naming the file and dlopen's or the fingerprints' words.
TEST(CudaModule, UnusableModulesAreRefusedWithTheReason) {
  const std::string text = ::testing::TempDir() + "/not-elf.so";
  std::ofstream(text) << "not a shared object\n";
  const std::string other = PTDP_FAKE_MODULE_OTHER_ABI, no_entry = PTDP_FAKE_MODULE_NO_ENTRY,
                    missing = PTDP_FAKE_MODULE_MISSING_DEP;
  struct Case {
    std::string module, says;
  };
  for (const Case& c : {
           Case{text, "--backend cuda: cannot load the CUDA module " + text + ": " + text +
                          ": "},  // "file too short" or "invalid ELF header"
           Case{missing, "--backend cuda: cannot load the CUDA module " + missing +
                             ": libptdp_fake_dep.so: cannot open shared object file"},
           Case{no_entry, "--backend cuda: " + no_entry + " is not a ptdp CUDA module: "},
           Case{other, "--backend cuda: the CUDA module " + other +
                           " was built from other sources (interface 0123456789abcdef; this "
                           "ptdp expects "},
       }) {
    SCOPED_TRACE(c.module);
    ExpectOneLineError(TrainCuda("PTDP_CUDA_MODULE=" + c.module), c.says, 1);
    const nlohmann::json j = Info(kBin, "PTDP_CUDA_MODULE=" + c.module);
    EXPECT_EQ(j["cuda_module"], c.module);
    EXPECT_NE(j["why_no_gpu"].get<std::string>().find(c.says.substr(16)), std::string::npos)
        << j.dump();
    EXPECT_TRUE(j["nccl_version"].is_null());
  }
}
#endif

}  // namespace
