// MakeLaunch: the rank placement rules of launch.h.
#include "cli/launch.h"

#include <cstdlib>
#include <mutex>

#include "cli/cuda_module.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/thread_communicator.h"
#include "runtime/cuda/module.h"  // declarations only: the code is the module's

namespace ptdp::cli {
namespace {

using std::to_string;

Launch CpuLaunch(const Layout& l, double timeout_s) {
  Launch run;
  run.comms = std::make_shared<rt::ThreadWorld>(l.world(), timeout_s);
  run.backends = [](int) { return std::make_unique<rt::CpuBackend>(); };
  run.where = to_string(l.world()) + " CPU rank thread" + (l.world() > 1 ? "s" : "");
  return run;
}

// The backends of the local ranks, created before the trainer so that a failure keeps its reason;
// the trainer takes each once, and the communicators find each rank's stream here.
struct CudaRanks {
  std::mutex mu;
  std::vector<std::unique_ptr<rt::Backend>> owned;  // by global rank, until taken
  std::vector<cudaStream_t> streams;                 // by global rank
};

// The CUDA backends' switches from the environment (runtime/cuda/cuda_backend.h), to compare
// paths or to fall back: PTDP_CUDA_ATTENTION=flash (the default: the WMMA flash kernels, heads
// of d <= 128), flash-mma (the register-resident flash kernels, not yet run on a GPU) or unfused
// (cuBLAS and a softmax kernel, P kept); PTDP_CUDA_EPILOGUE=on (the
// default: bias and GeLU in cuBLASLt's epilogues) or off (the separate ops).
struct CudaKnobs {
  rt::cuda::AttentionKernel attention = rt::cuda::AttentionKernel::kFlash;
  bool epilogues = true;
};
Result<CudaKnobs> CudaKnobsFromEnv() {
  CudaKnobs k;
  const char* env = std::getenv("PTDP_CUDA_ATTENTION");
  const std::string v = env ? env : "";
  if (v == "unfused")
    k.attention = rt::cuda::AttentionKernel::kUnfused;
  else if (v == "flash-mma")
    k.attention = rt::cuda::AttentionKernel::kFlashMma;
  else if (!v.empty() && v != "flash")
    return Status::Error("PTDP_CUDA_ATTENTION '" + v + "': expected flash, flash-mma or unfused");
  const char* epi = std::getenv("PTDP_CUDA_EPILOGUE");
  const std::string e = epi ? epi : "";
  if (e == "off")
    k.epilogues = false;
  else if (!e.empty() && e != "on")
    return Status::Error("PTDP_CUDA_EPILOGUE '" + e + "': expected on or off");
  return k;
}

Result<std::shared_ptr<CudaRanks>> MakeBackends(const rt::cuda::CudaModule& cuda, const Layout& l,
                                                const std::vector<int>& ranks,
                                                const std::vector<int>& devices,
                                                const CudaKnobs& knobs) {
  auto cr = std::make_shared<CudaRanks>();
  cr->owned.resize(size_t(l.world()));
  cr->streams.resize(size_t(l.world()), nullptr);
  for (size_t i = 0; i < ranks.size(); ++i) {
    rt::cuda::CudaBackendOptions o;
    o.device = devices[i];
    // fp32 plans run exact fp32 GEMMs; bf16/fp16 plans run bf16 tensor-core GEMMs.
    o.gemm = l.precision == Precision::kFp32 ? rt::cuda::GemmPrecision::kFp32
                                             : rt::cuda::GemmPrecision::kBf16;
    o.attention = knobs.attention;
    o.epilogues = knobs.epilogues;
    auto b = cuda.NewBackend(o);
    if (!b.ok()) return b.status().Prefixed("rank " + to_string(ranks[i]));
    cr->streams[size_t(ranks[i])] = b->stream;
    cr->owned[size_t(ranks[i])] = std::move(b->backend);
  }
  return cr;
}

void HandOut(Launch& run, const std::shared_ptr<CudaRanks>& cr) {
  run.backends = [cr](int g) -> std::unique_ptr<rt::Backend> {
    std::lock_guard<std::mutex> lk(cr->mu);
    return std::move(cr->owned[size_t(g)]);
  };
}

rt::cuda::StreamOf StreamsOf(const std::shared_ptr<CudaRanks>& cr) {
  return [cr](int g) {
    std::lock_guard<std::mutex> lk(cr->mu);
    return cr->streams[size_t(g)];
  };
}

Result<Launch> MpiLaunch(const rt::cuda::CudaModule& cuda, const Layout& l,
                         const LaunchOptions& o, int gpus, const CudaKnobs& knobs) {
  auto job = cuda.InitMpi();
  if (!job.ok()) return job.status().Prefixed("launched under mpirun/srun");
  std::shared_ptr<rt::cuda::MpiJob> mpi = std::move(*job);
  if (l.world() % mpi->size() != 0)
    return Status::Error("the plan's " + to_string(l.world()) + " ranks do not divide over " +
                         to_string(mpi->size()) + " MPI processes");
  auto place = mpi->Place(l.world() / mpi->size(), gpus);
  std::shared_ptr<CudaRanks> cr;
  Status set_up = place.status();
  if (set_up.ok()) {
    auto made = MakeBackends(cuda, l, place->local_ranks, place->devices, knobs);
    set_up = made.status();
    if (made.ok()) cr = *made;
  }
  // Every process stops together when one of them could not set up.
  PTDP_ASSIGN_OR_RETURN(bool all_ok, mpi->AllOk(set_up.ok()));
  if (!set_up.ok()) return set_up;
  if (!all_ok) return Status::Error("another MPI process failed to set up (see its message)");
  PTDP_ASSIGN_OR_RETURN(rt::cuda::NcclId id, mpi->ShareNcclId());
  rt::cuda::NcclWorldOptions w;
  w.world_size = l.world();
  w.local_ranks = place->local_ranks;
  w.devices = place->devices;
  w.id = id;
  w.timeout_s = o.timeout_s;
  w.stream_of = StreamsOf(cr);
  PTDP_ASSIGN_OR_RETURN(auto world, cuda.NewNcclWorld(w));
  Launch run;
  run.comms = std::move(world);
  HandOut(run, cr);
  run.local_ranks = place->local_ranks;
  run.main_process = mpi->rank() == 0;
  run.devices = l.world();
  run.where = to_string(l.world()) + " ranks on " + to_string(mpi->size()) +
              " MPI processes (NCCL), " + to_string(place->local_ranks.size()) + " here";
  run.keep_alive = std::make_shared<std::pair<std::shared_ptr<rt::cuda::MpiJob>,
                                              std::shared_ptr<CudaRanks>>>(std::move(mpi), cr);
  return run;
}

Result<Launch> CudaLaunch(const Layout& l, const LaunchOptions& o) {
  // Bad input first, GPU or not.
  PTDP_ASSIGN_OR_RETURN(const CudaKnobs knobs, CudaKnobsFromEnv());
  PTDP_ASSIGN_OR_RETURN(const UsableGpus gpus, ProbeUsableGpus());
  const rt::cuda::CudaModule& cuda = **LoadCudaModule();  // ProbeUsableGpus loaded it
  if (UnderMpi()) return MpiLaunch(cuda, l, o, gpus.visible, knobs);
  const int world = l.world();
  std::vector<int> ranks(static_cast<size_t>(world)), devices(static_cast<size_t>(world), 0);
  for (int r = 0; r < world; ++r) ranks[size_t(r)] = r;
  const bool shared_gpu = world == 1 || o.one_gpu || gpus.visible == 1;
  if (!shared_gpu && gpus.visible < world)
    return Status::Error("the plan has " + to_string(world) + " ranks but " +
                         to_string(gpus.visible) + " GPUs are visible: add --one-gpu to run " +
                         "every rank on GPU 0, or launch on " + to_string(world) +
                         " GPUs (mpirun/srun for several nodes: docs/gpus.md)");
  if (!shared_gpu)
    for (int r = 0; r < world; ++r) devices[size_t(r)] = r;
  PTDP_ASSIGN_OR_RETURN(auto cr, MakeBackends(cuda, l, ranks, devices, knobs));
  Launch run;
  HandOut(run, cr);
  run.keep_alive = cr;
  run.devices = shared_gpu ? 1 : world;
  if (shared_gpu) {
    run.comms = cuda.NewDeviceWorld(world, o.timeout_s, 0, StreamsOf(cr));
    run.where = to_string(world) + (world > 1 ? " ranks" : " rank") + " on GPU 0 (" +
                gpus.name + (world > 1 ? ", device copies)" : ")");
    return run;
  }
  rt::cuda::NcclWorldOptions w;
  w.world_size = world;
  w.local_ranks = ranks;
  w.devices = devices;
  PTDP_ASSIGN_OR_RETURN(w.id, cuda.NewNcclId());
  w.timeout_s = o.timeout_s;
  w.stream_of = StreamsOf(cr);
  PTDP_ASSIGN_OR_RETURN(auto nccl, cuda.NewNcclWorld(w));
  run.comms = std::move(nccl);
  run.where = to_string(world) + " GPUs (" + gpus.name + ", NCCL)";
  return run;
}

}  // namespace

bool UnderMpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_NTASKS"}) {
    const char* s = std::getenv(v);
    if (s && std::atoi(s) > 1) return true;
  }
  return false;
}

Result<UsableGpus> ProbeUsableGpus() {
  auto cuda = LoadCudaModule();
  if (!cuda.ok()) return cuda.status().Prefixed("--backend cuda");
  const rt::cuda::CudaInfo info = (*cuda)->Probe();
  if (info.gpus_visible == 0)
    return Status::Error("--backend cuda: no CUDA GPU is usable here: " + info.why_none +
                         " (`ptdp info` says what this binary can run)");
  return UsableGpus{info.gpus_visible, info.device_name};
}

Result<Launch> MakeLaunch(const Layout& layout, const LaunchOptions& options) {
  if (options.backend == "cpu") return CpuLaunch(layout, options.timeout_s);
  if (options.backend != "cuda")
    return Status::Error("--backend '" + options.backend + "': expected cpu or cuda");
  return CudaLaunch(layout, options);
}

}  // namespace ptdp::cli
