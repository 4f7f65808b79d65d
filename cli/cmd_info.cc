// `ptdp info`: what this binary can run (backends, CUDA/NCCL/MPI support, visible GPUs). The only
// command besides `--backend cuda` that loads the CUDA module (cli/cuda_module.h), to ask it.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/cuda_module.h"
#include "runtime/cpu/cpu_kernels.h"
#include "runtime/cuda/module.h"  // declarations only: the code is the module's

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

// The CUDA part of `info --json`: the module's path, the versions, the GPUs, or why none in the
// words `--backend cuda` fails with (not compiled in, the module not loadable, CUDA's reason).
void AddCuda(nlohmann::json& j) {
  j["cuda_compiled"] = CudaModuleBuilt();
  auto path = CudaModulePath();
  if (path.ok()) j["cuda_module"] = *path;
  auto cuda = LoadCudaModule();
  if (!cuda.ok()) {
    j["why_no_gpu"] = cuda.status().message();
    return;
  }
  const rt::cuda::CudaInfo info = (*cuda)->Probe();
  const std::string mpi = (*cuda)->MpiLibrary();
  j["gpus_visible"] = info.gpus_visible;
  if (info.nccl_version > 0) j["nccl_version"] = Version(info.nccl_version);
  if (info.cublas_version > 0) j["cublas_version"] = Version(info.cublas_version);
  j["cuda_runtime_version"] = info.runtime_version;
  j["cuda_driver_version"] = info.driver_version;
  j["mpi"] = !mpi.empty();
  if (!mpi.empty()) j["mpi_version"] = mpi;
  // The CUDA backend is listed once it can run: the module loaded and at least one GPU visible.
  if (info.gpus_visible > 0) {
    j["backends"].push_back("cuda");
    j["gpu"] = {{"name", info.device_name}, {"memory_bytes", info.device_memory_bytes}};
  } else {
    j["why_no_gpu"] = info.why_none;
  }
}

std::string Or(const nlohmann::json& v, const std::string& none) {
  return v.is_string() ? v.get<std::string>() : none;
}

int RunInfo(const InfoFlags& f) {
  const unsigned threads = std::thread::hardware_concurrency();
  nlohmann::json j = {{"version", "0.1.0"},       {"cuda_compiled", false},
                      {"cuda_module", nullptr},   {"gpus_visible", 0},
                      {"nccl_version", nullptr},  {"cublas_version", nullptr},
                      {"mpi", false},             {"backends", {"cpu"}},
                      {"cpu_threads", threads}};
  const rt::CpuKernelChoice& kernels = rt::ChosenCpuKernels();
  j["cpu_kernels"] = kernels.kernels->name;
  AddCuda(j);
  if (f.json) {
    std::cout << DumpJson(j) << "\n";
    return 0;
  }
  std::printf("ptdp 0.1.0\n");
  std::printf("backends:      %s\n", j["backends"].size() > 1 ? "cpu, cuda" : "cpu");
  std::printf("cpu:           own kernels, ranks as threads; %u hardware threads\n", threads);
  std::printf("cpu kernels:   %s (%s)\n", kernels.kernels->name, kernels.why.c_str());
  if (j["cuda_compiled"] != true)
    std::printf("cuda:          not compiled in (configure with the CUDA toolkit: -DPTDP_CUDA=ON)\n");
  else if (j["gpus_visible"].get<int>() > 0)
    std::printf("cuda:          %d GPU(s) visible; device 0: %s, %.1f GiB\n",
                j["gpus_visible"].get<int>(), j["gpu"]["name"].get<std::string>().c_str(),
                j["gpu"]["memory_bytes"].get<double>() / (1 << 30));
  else if (!j.contains("cuda_runtime_version"))  // the module did not load
    std::printf("cuda:          compiled in, but %s\n", j["why_no_gpu"].get<std::string>().c_str());
  else
    std::printf("cuda:          compiled in, but no GPU is usable: %s\n",
                j["why_no_gpu"].get<std::string>().c_str());
  std::printf("cuda module:   %s\n", Or(j["cuda_module"], "-").c_str());
  std::printf("nccl, cublas:  %s, %s\n", Or(j["nccl_version"], "-").c_str(),
              Or(j["cublas_version"], "-").c_str());
  std::printf("mpi:           %s\n", j["mpi"] == true
                                         ? ("yes (mpirun/srun launches several processes; " +
                                            j["mpi_version"].get<std::string>() + ")").c_str()
                                         : "no");
  return 0;
}

}  // namespace

Runner SetupInfo(CLI::App* sub) {
  auto f = std::make_shared<InfoFlags>();
  sub->add_flag("--json", f->json, "machine-readable output");
  return [f] { return RunInfo(*f); };
}

}  // namespace ptdp::cli
