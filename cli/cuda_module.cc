// Finding, opening and checking the CUDA module; see cuda_module.h.
#include "cli/cuda_module.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "cli/paths.h"
#ifndef PTDP_WITH_CUDA_MODULE
#define PTDP_WITH_CUDA_MODULE 0  // set by cli/CMakeLists.txt in CUDA builds
#endif
#if PTDP_WITH_CUDA_MODULE
#include "runtime/cuda/module.h"
#include "runtime/cuda/ptdp_cuda_abi.h"  // generated: PTDP_CUDA_MODULE_ABI
#endif

namespace ptdp::cli {
namespace {

constexpr const char* kModule = "lib/ptdp/libptdp_cuda.so";

#if PTDP_WITH_CUDA_MODULE
Result<const rt::cuda::CudaModule*> Open() {
  PTDP_ASSIGN_OR_RETURN(const std::string path, CudaModulePath());
  // RTLD_GLOBAL puts the module's libraries in the global scope: the plugins libmpi opens itself
  // find libmpi's symbols only there in Open MPI builds that do not link them against it (why
  // mpi4py opens libmpi so; Debian's Open MPI 4.1 works either way). The module itself exports
  // nothing but its entry point.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!handle) return Status::Error("cannot load the CUDA module " + path + ": " + dlerror());
  using Entry = rt::cuda::CudaModule* (*)(const char*, const char**);
  auto entry = reinterpret_cast<Entry>(dlsym(handle, "ptdp_cuda_module"));
  if (!entry) return Status::Error(path + " is not a ptdp CUDA module: " + dlerror());
  const char* theirs = "";
  rt::cuda::CudaModule* module = entry(PTDP_CUDA_MODULE_ABI, &theirs);
  if (!module)
    return Status::Error("the CUDA module " + path + " was built from other sources (interface " +
                         theirs + "; this ptdp expects " + PTDP_CUDA_MODULE_ABI +
                         "): rebuild both (cmake --build <build folder>)");
  return module;  // never closed: what it hands out runs its code until the process exits
}
#endif

}  // namespace

bool CudaModuleBuilt() { return PTDP_WITH_CUDA_MODULE != 0; }

Result<std::string> CudaModulePath() {
  if (!CudaModuleBuilt())
    return Status::Error("this ptdp was built without the CUDA backend (configure with the CUDA "
                         "toolkit; `ptdp info` says what it can run)");
  if (const char* env = std::getenv("PTDP_CUDA_MODULE"); env && *env) {
    std::error_code ec;
    if (!std::filesystem::exists(env, ec))
      return Status::Error("PTDP_CUDA_MODULE '" + std::string(env) + "': no such file");
    // Absolute, so that dlopen opens this file rather than searching its library path.
    return std::filesystem::absolute(env, ec).string();
  }
  auto found = FindShipped(kModule);
  if (!found.ok())
    return Status::Error("the CUDA module is missing: " + found.status().message() +
                         " (build it: cmake --build <build folder> --target ptdp_cuda; or set "
                         "PTDP_CUDA_MODULE to its path)");
  return found;
}

Result<const rt::cuda::CudaModule*> LoadCudaModule() {
#if PTDP_WITH_CUDA_MODULE
  static const Result<const rt::cuda::CudaModule*> loaded = Open();
  return loaded;
#else
  return CudaModulePath().status();
#endif
}

}  // namespace ptdp::cli
