// `ptdp info`: what this binary can run (backends, CUDA/NCCL/MPI support, visible GPUs).
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "cli/common.h"
#include "runtime/cpu/cpu_kernels.h"
#if PTDP_HAVE_CUDA
#include "runtime/cuda/cuda_backend.h"
#endif

namespace ptdp::cli {
namespace {

struct InfoFlags {
  bool json = false;
};

// 22805 -> "2.28.5" (NCCL's and our cuBLAS encoding: major*10000 + minor*100 + patch).
std::string Version(int v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

int RunInfo(const InfoFlags& f) {
  const unsigned threads = std::thread::hardware_concurrency();
#if PTDP_HAVE_CUDA
  const rt::cuda::CudaInfo cuda = rt::cuda::ProbeCuda();
  const bool compiled = true;
#else
  const bool compiled = false;
#endif
#if PTDP_HAVE_MPI
  const bool mpi = true;
#else
  const bool mpi = false;
#endif
  nlohmann::json j = {{"version", "0.1.0"},       {"cuda_compiled", compiled},
                      {"gpus_visible", 0},        {"nccl_version", nullptr},
                      {"cublas_version", nullptr}, {"mpi", mpi},
                      {"backends", {"cpu"}},      {"cpu_threads", threads}};
  const rt::CpuKernelChoice& kernels = rt::ChosenCpuKernels();
  j["cpu_kernels"] = kernels.kernels->name;
#if PTDP_HAVE_CUDA
  j["gpus_visible"] = cuda.gpus_visible;
  if (cuda.nccl_version > 0) j["nccl_version"] = Version(cuda.nccl_version);
  if (cuda.cublas_version > 0) j["cublas_version"] = Version(cuda.cublas_version);
  j["cuda_runtime_version"] = cuda.runtime_version;
  j["cuda_driver_version"] = cuda.driver_version;
  // The CUDA backend is listed once it can run: compiled in and at least one GPU visible.
  if (cuda.gpus_visible > 0) {
    j["backends"].push_back("cuda");
    j["gpu"] = {{"name", cuda.device_name}, {"memory_bytes", cuda.device_memory_bytes}};
  } else {
    j["why_no_gpu"] = cuda.why_none;
  }
#endif
  if (f.json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("ptdp 0.1.0\n");
  std::printf("backends:      %s\n", j["backends"].size() > 1 ? "cpu, cuda" : "cpu");
  std::printf("cpu:           Eigen, ranks as threads; %u hardware threads\n", threads);
  std::printf("cpu kernels:   %s (%s)\n", kernels.kernels->name, kernels.why.c_str());
#if PTDP_HAVE_CUDA
  if (cuda.gpus_visible > 0)
    std::printf("cuda:          %d GPU(s) visible; device 0: %s, %.1f GiB\n", cuda.gpus_visible,
                cuda.device_name.c_str(), double(cuda.device_memory_bytes) / (1 << 30));
  else
    std::printf("cuda:          compiled in, but no GPU is usable: %s\n", cuda.why_none.c_str());
  std::printf("nccl, cublas:  %s, %s\n", j["nccl_version"].is_null() ? "-" : Version(cuda.nccl_version).c_str(),
              j["cublas_version"].is_null() ? "-" : Version(cuda.cublas_version).c_str());
#else
  std::printf("cuda:          not compiled in (configure with the CUDA toolkit: -DPTDP_CUDA=ON)\n");
  std::printf("nccl, cublas:  -\n");
#endif
  std::printf("mpi:           %s\n", mpi ? "yes (mpirun/srun launches several processes)" : "no");
  return 0;
}

}  // namespace

Runner SetupInfo(CLI::App* sub) {
  auto f = std::make_shared<InfoFlags>();
  sub->add_flag("--json", f->json, "machine-readable output");
  return [f] { return RunInfo(*f); };
}

}  // namespace ptdp::cli
