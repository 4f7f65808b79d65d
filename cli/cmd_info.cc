// `ptdp info`: what this binary can run (backends, CUDA/NCCL/MPI support, visible GPUs).
#include <cstdio>
#include <iostream>
#include <memory>
#include <thread>

#include "cli/commands.h"
#include "cli/common.h"

namespace ptdp::cli {
namespace {

struct InfoFlags {
  bool json = false;
};

int RunInfo(const InfoFlags& f) {
  // This build has no CUDA backend yet (issue 5): nothing GPU-related is compiled in, so there
  // is nothing to probe. When runtime/cuda lands these come from cudaGetDeviceCount,
  // ncclGetVersion and cublasGetVersion.
  nlohmann::json j = {{"version", "0.1.0"},
                      {"cuda_compiled", false},
                      {"gpus_visible", 0},
                      {"nccl_version", nullptr},
                      {"cublas_version", nullptr},
                      {"mpi", false},
                      {"backends", {"cpu"}},
                      {"cpu_threads", std::thread::hardware_concurrency()}};
  if (f.json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("ptdp 0.1.0\n");
  std::printf("backends:      cpu (Eigen, ranks as threads; %u hardware threads)\n",
              std::thread::hardware_concurrency());
  std::printf("cuda:          not compiled in (the CUDA backend is issue 5)\n");
  std::printf("nccl, cublas:  -\n");
  std::printf("mpi:           no\n");
  return 0;
}

}  // namespace

Runner SetupInfo(CLI::App* sub) {
  auto f = std::make_shared<InfoFlags>();
  sub->add_flag("--json", f->json, "machine-readable output");
  return [f] { return RunInfo(*f); };
}

}  // namespace ptdp::cli
