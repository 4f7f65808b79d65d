// The CUDA module (runtime/cuda/module.h), opened on first use by the commands that run on GPUs
// (`train --backend cuda`, `calibrate --backend cuda`, `info`); every other command never loads
// it, nor the CUDA, NCCL and MPI libraries it links.
//
// Where: $PTDP_CUDA_MODULE when set (a file's path), else lib/ptdp/libptdp_cuda.so at or above
// the binary's folder (FindShipped, cli/paths.h): build/lib/ptdp beside build/ptdp,
// PREFIX/lib/ptdp beside PREFIX/bin/ptdp.
#pragma once

#include <string>

#include "core/status.h"

namespace ptdp::rt::cuda {
class CudaModule;
}

namespace ptdp::cli {

// Whether this ptdp was built with the CUDA module (PTDP_CUDA found the toolkit).
bool CudaModuleBuilt();

// The path the module is (or would be) loaded from; fails as LoadCudaModule does when it is not
// found, or when this ptdp was built without CUDA.
Result<std::string> CudaModulePath();

// The module, loaded once (later calls return the first call's result; thread-safe). One-line
// errors, without a "--backend cuda: " prefix:
//   built without CUDA:     "this ptdp was built without the CUDA backend (...)"
//   not found:              "the CUDA module is missing: no lib/ptdp/libptdp_cuda.so at or above
//                            the binary's folder DIR (...)" or "PTDP_CUDA_MODULE 'F': no such file"
//   dlopen failed:          "cannot load the CUDA module F: <dlerror's text>"
//   not a module:           "F is not a ptdp CUDA module: <dlerror's text>"
//   from other sources:     "the CUDA module F was built from other sources (interface X; this
//                            ptdp expects Y): rebuild both"
Result<const rt::cuda::CudaModule*> LoadCudaModule();

}  // namespace ptdp::cli
