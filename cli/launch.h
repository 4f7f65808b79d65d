// How `ptdp train` (and `ptdp calibrate`) get their ranks running: the backend of each rank and the
// communicator factory over them, for `--backend cpu` (CpuBackends, ranks as threads of one
// ThreadWorld) or `--backend cuda`:
//
//   one process, plan of 1 rank, 1 GPU visible or --one-gpu:  every rank a thread on GPU 0,
//                                                          DeviceWorld (device copies)
//   one process, >= world GPUs visible:                    rank r on GPU r, NcclWorld
//   under mpirun / srun (several processes):               each process its share of the ranks,
//                                                          one GPU each, NcclWorld (MPI bootstrap)
//
// `--backend cuda` runs through the CUDA module (cli/cuda_module.h), loaded here on first use:
// nothing else of ptdp loads the CUDA, NCCL or MPI libraries.
//
// Errors (a Status naming the reason): CUDA not compiled in, the module missing, unloadable or
// from other sources, no GPU usable, too few GPUs for the plan, a failed MPI or NCCL set-up.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/layout.h"
#include "core/status.h"
#include "runtime/communicator.h"
#include "runtime/trainer.h"

namespace ptdp::cli {

struct LaunchOptions {
  std::string backend = "cpu";  // cpu or cuda
  double timeout_s = 120;       // a rank's wait in a collective before it fails
  bool one_gpu = false;         // cuda: every rank on GPU 0 even when more GPUs are visible
};

struct Launch {
  std::shared_ptr<rt::CommunicatorFactory> comms;
  rt::BackendFactory backends;       // hands out the backend of each local rank once
  std::vector<int> local_ranks;      // the ranks this process drives; empty: all
  bool main_process = true;          // prints progress and writes files
  int devices = 0;                   // GPUs the whole job uses (0 on the CPU backend)
  std::string where;                 // "4 CPU rank threads", "2 ranks on GPU 0 (NVIDIA H200)"
  std::shared_ptr<void> keep_alive;  // the MPI session and backends, until the run ends
};

Result<Launch> MakeLaunch(const Layout& layout, const LaunchOptions& options);

// The GPUs `--backend cuda` can use in this process, as MakeLaunch places ranks on them.
struct UsableGpus {
  int visible = 0;          // >= 1
  std::string name;         // of device 0, e.g. "NVIDIA H200"
};
// Fails, in the words MakeLaunch uses ("--backend cuda: ..."), when CUDA is not compiled in, the
// CUDA module cannot be loaded (LoadCudaModule's reason) or no GPU is usable (CUDA's reason).
Result<UsableGpus> ProbeUsableGpus();

// Whether mpirun or srun started this process among several (MakeLaunch then places each
// process's share of the ranks over MPI).
bool UnderMpi();

}  // namespace ptdp::cli
