// Communicator bandwidth: all-reduce, all-gather, reduce-scatter and send/recv over message sizes
// and group sizes, for ThreadWorld (ranks as threads, host memory: runs everywhere) and, when a
// GPU is visible, DeviceWorld (ranks as threads on GPU 0) and NcclWorld (one rank per visible
// GPU, this process driving them all). Reports nccl-tests' figures (docs/gpus.md has the
// formulas): algbw = S / t and busbw = algbw * factor, with S the message size (the all-reduce
// buffer, the gathered output, the scattered input, the sent tensor) and factor 2(n-1)/n for
// all-reduce, (n-1)/n for all-gather and reduce-scatter, 1 for send/recv.
//
// Each benchmark runs this process's first rank in Google Benchmark's loop and its other ranks on
// threads doing the same number of operations (state.max_iterations), so the time of the loop is
// the time of n ranks completing the operation back to back. Every operation returns with its
// result complete (communicator.h), so on the GPU each includes a stream synchronization.
//
// Several processes (built with MPI; started by mpirun or srun, see docs/gpus.md): each process
// drives one GPU of an NcclWorld over all of them; the benchmarks run a fixed number of
// iterations (every process must make the same calls) and only process 0 prints.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/cpu/thread_communicator.h"
#ifdef PTDP_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda/device_world.h"
#include "runtime/cuda/nccl_world.h"
#endif
#ifdef PTDP_HAVE_MPI
#include "runtime/cuda/mpi_bootstrap.h"
#endif

namespace {

using namespace ptdp;
using namespace ptdp::rt;

constexpr double kTimeoutS = 120;

enum class Op { kAllReduce, kAllGather, kReduceScatter, kSendRecv };

const char* OpName(Op op) {
  switch (op) {
    case Op::kAllReduce: return "AllReduce";
    case Op::kAllGather: return "AllGather";
    case Op::kReduceScatter: return "ReduceScatter";
    case Op::kSendRecv: return "SendRecv";
  }
  return "?";
}

// nccl-tests' bus bandwidth factor (doc/PERFORMANCE.md): what each rank's links carry relative
// to the message size, so that busbw compares with the hardware's peak whatever n.
double BusFactor(Op op, int n) {
  switch (op) {
    case Op::kAllReduce: return 2.0 * (n - 1) / n;
    case Op::kAllGather:
    case Op::kReduceScatter: return double(n - 1) / n;
    case Op::kSendRecv: return 1.0;
  }
  return 1.0;
}

// A world of n ranks with one communicator per rank driven here (all of them, except with MPI)
// on the group [0, n).
struct Env {
  std::vector<std::unique_ptr<Communicator>> comms;  // this process's ranks
  // A tensor of `elems` f32 in rank r's memory (host, or its device).
  std::function<Tensor(int r, int64_t elems)> alloc;
  std::shared_ptr<void> keep;      // the world and whatever the communicators need
};

std::vector<int> Iota(int n) {
  std::vector<int> v;
  for (int r = 0; r < n; ++r) v.push_back(r);
  return v;
}

Tensor HostTensor(int64_t elems) {
  size_t bytes = size_t(elems) * sizeof(float);
  auto buf = std::make_shared<Buffer>(new float[size_t(elems)](), bytes,
                                      [](void* p, size_t) { delete[] static_cast<float*>(p); });
  return Tensor(buf, Shape({elems}), DType::kF32);
}

Result<std::unique_ptr<Env>> ThreadEnv(int n) {
  auto world = std::make_shared<ThreadWorld>(n, kTimeoutS);
  auto env = std::make_unique<Env>();
  for (int r = 0; r < n; ++r) {
    PTDP_ASSIGN_OR_RETURN(auto c, world->Group(r, Iota(n), "BENCH"));
    env->comms.push_back(std::move(c));
  }
  env->alloc = [](int, int64_t elems) { return HostTensor(elems); };
  env->keep = world;
  return env;
}

// Runs `op` on rank r's buffers: `big` holds S bytes, `small` S/n.
Status RunOp(Communicator& c, Op op, Tensor& big, Tensor& small) {
  switch (op) {
    case Op::kAllReduce: return c.AllReduce(big, ReduceOp::kSum);
    case Op::kAllGather: return c.AllGather(small, big);
    case Op::kReduceScatter: return c.ReduceScatter(big, small, ReduceOp::kSum);
    case Op::kSendRecv: return c.rank() == 0 ? c.Send(big, 1) : c.Recv(big, 0);
  }
  return Status::Ok();
}

void Drive(benchmark::State& state, Env& env, Op op, int64_t bytes) {
  const int n = env.comms[0]->size();
  const int local = int(env.comms.size());
  const int64_t elems = bytes / int64_t(sizeof(float));
  std::vector<Tensor> big, small;
  for (int r = 0; r < local; ++r) {
    big.push_back(env.alloc(r, elems));
    small.push_back(env.alloc(r, elems / n));
  }
  const int64_t iterations = int64_t(state.max_iterations);
  std::atomic<bool> failed{false};
  std::vector<std::thread> others;
  for (int r = 1; r < local; ++r)
    others.emplace_back([&, r] {
      for (int64_t i = 0; i < iterations && !failed; ++i)
        if (!RunOp(*env.comms[size_t(r)], op, big[size_t(r)], small[size_t(r)]).ok()) failed = true;
    });
  for (auto _ : state) {
    Status s = RunOp(*env.comms[0], op, big[0], small[0]);
    if (!s.ok()) {
      failed = true;
      state.SkipWithError(s.message().c_str());
      break;
    }
  }
  for (std::thread& t : others) t.join();
  using benchmark::Counter;
  state.counters["ranks"] = n;
  state.counters["bytes"] = double(bytes);
  // Bytes per second of real time, printed with SI prefixes (e.g. busbw=2.3G/s).
  state.counters["algbw"] = Counter(double(bytes), Counter::kIsIterationInvariantRate);
  state.counters["busbw"] =
      Counter(double(bytes) * BusFactor(op, n), Counter::kIsIterationInvariantRate);
}

// Registers op x sizes for a world maker; `cache` keeps worlds that are slow to make (NCCL) until
// main() clears them, before the CUDA runtime shuts down.
// With `iterations` > 0 every benchmark runs exactly that many (several processes).
using Maker = std::function<Result<std::unique_ptr<Env>>(int n)>;
using EnvCache = std::map<int, std::unique_ptr<Env>>;
std::vector<std::shared_ptr<EnvCache>> g_caches;

void Register(const std::string& world, const Maker& make, bool cache, const std::vector<int>& ns,
              const std::vector<int64_t>& sizes, int64_t iterations = 0) {
  auto envs = std::make_shared<EnvCache>();
  g_caches.push_back(envs);
  for (Op op : {Op::kAllReduce, Op::kAllGather, Op::kReduceScatter, Op::kSendRecv})
    for (int n : ns) {
      if (op == Op::kSendRecv && n != 2) continue;
      for (int64_t bytes : sizes) {
        const std::string name = std::string("BM_") + world + "_" + OpName(op) + "/ranks:" +
                                 std::to_string(n) + "/bytes:" + std::to_string(bytes);
        auto* b = benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& state) {
          std::unique_ptr<Env> fresh;
          Env* env = nullptr;
          if (cache && envs->count(n)) env = (*envs)[n].get();
          if (env == nullptr) {
            auto made = make(n);
            if (!made.ok()) {
              state.SkipWithError(made.status().message().c_str());
              return;
            }
            fresh = std::move(made).value();
            env = fresh.get();
            if (cache) (*envs)[n] = std::move(fresh);
          }
          Drive(state, *env, op, bytes);
        });
        b->UseRealTime()->Unit(benchmark::kMicrosecond);
        if (iterations > 0) b->Iterations(iterations);
      }
    }
}

#ifdef PTDP_HAVE_CUDA
int VisibleGpus() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

// Rank r's tensors on `device_of(r)`, freed with the last handle.
std::function<Tensor(int, int64_t)> DeviceAlloc(std::function<int(int)> device_of) {
  return [device_of](int r, int64_t elems) {
    const int device = device_of(r);
    cudaSetDevice(device);
    void* p = nullptr;
    size_t bytes = std::max<size_t>(size_t(elems) * sizeof(float), 4);
    if (cudaMalloc(&p, bytes) != cudaSuccess) return Tensor();
    cudaMemset(p, 0, bytes);
    cudaDeviceSynchronize();  // the legacy stream's memset before the ranks' non-blocking streams
    auto buf = std::make_shared<Buffer>(p, bytes, [device](void* q, size_t) {
      cudaSetDevice(device);
      cudaFree(q);
    });
    return Tensor(buf, Shape({elems}), DType::kF32);
  };
}

// One non-blocking stream per rank, destroyed last.
struct StreamSet {
  std::vector<int> devices;
  std::vector<cudaStream_t> s;
  explicit StreamSet(std::vector<int> devs) : devices(std::move(devs)), s(devices.size()) {
    for (size_t r = 0; r < s.size(); ++r) {
      cudaSetDevice(devices[r]);
      cudaStreamCreateWithFlags(&s[r], cudaStreamNonBlocking);
    }
  }
  ~StreamSet() {
    for (size_t r = 0; r < s.size(); ++r) {
      cudaSetDevice(devices[r]);
      cudaStreamDestroy(s[r]);
    }
  }
};

Result<std::unique_ptr<Env>> DeviceEnv(int n) {
  auto streams = std::make_shared<StreamSet>(std::vector<int>(size_t(n), 0));
  auto world = std::make_shared<cuda::DeviceWorld>(n, kTimeoutS, 0,
                                                   [streams](int g) { return streams->s[size_t(g)]; });
  auto env = std::make_unique<Env>();
  for (int r = 0; r < n; ++r) {
    PTDP_ASSIGN_OR_RETURN(auto c, world->Group(r, Iota(n), "BENCH"));
    env->comms.push_back(std::move(c));
  }
  env->alloc = DeviceAlloc([](int) { return 0; });
  env->keep = std::make_shared<std::pair<std::shared_ptr<void>, std::shared_ptr<void>>>(world, streams);
  return env;
}

Result<std::unique_ptr<Env>> NcclEnv(int n) {
  auto streams = std::make_shared<StreamSet>(Iota(n));
  PTDP_ASSIGN_OR_RETURN(cuda::NcclId id, cuda::NewNcclId());
  cuda::NcclWorldOptions o;
  o.world_size = n;
  o.local_ranks = Iota(n);
  o.devices = Iota(n);
  o.id = id;
  o.timeout_s = kTimeoutS;
  o.stream_of = [streams](int g) { return streams->s[size_t(g)]; };
  PTDP_ASSIGN_OR_RETURN(std::unique_ptr<cuda::NcclWorld> made, cuda::NcclWorld::Create(o));
  std::shared_ptr<cuda::NcclWorld> world = std::move(made);
  PTDP_RETURN_IF_ERROR(world->Prepare({{"BENCH", {Iota(n)}}}));
  auto env = std::make_unique<Env>();
  for (int r = 0; r < n; ++r) {
    PTDP_ASSIGN_OR_RETURN(auto c, world->Group(r, Iota(n), "BENCH"));
    env->comms.push_back(std::move(c));
  }
  env->alloc = DeviceAlloc([](int r) { return r; });
  env->keep = std::make_shared<std::pair<std::shared_ptr<void>, std::shared_ptr<void>>>(world, streams);
  return env;
}
#endif

#if defined(PTDP_HAVE_CUDA) && defined(PTDP_HAVE_MPI)
// Started by mpirun or srun: OpenMPI's, PMIx's or Slurm's variables are set.
bool UnderMpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

// Prints nothing: the reporter of every process but 0.
class QuietReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

// One GPU per process, an NcclWorld over all processes, the NCCL benchmarks only.
int RunUnderMpi(int argc, char** argv) {
  auto mpi = cuda::MpiSession::Init(&argc, &argv);
  if (!mpi.ok()) {
    std::fprintf(stderr, "comm_bench: %s\n", mpi.status().message().c_str());
    return 1;
  }
  const int n = (*mpi)->size();
  // Every process must reach the id broadcast, or none: they agree first.
  auto place = (*mpi)->Place(1, VisibleGpus());
  auto all = (*mpi)->AllOk(place.ok());
  if (!place.ok() || !all.ok() || !*all) {
    std::fprintf(stderr, "comm_bench: process %d: %s\n", (*mpi)->rank(),
                 !place.ok() ? place.status().message().c_str()
                 : !all.ok() ? all.status().message().c_str()
                             : "another process could not place its ranks");
    return 1;
  }
  auto id = (*mpi)->ShareNcclId();
  if (!id.ok()) {
    std::fprintf(stderr, "comm_bench: process %d: %s\n", (*mpi)->rank(), id.status().message().c_str());
    return 1;
  }
  const cuda::Placement p = *place;
  const cuda::NcclId nccl_id = *id;
  Maker make = [p, nccl_id](int) -> Result<std::unique_ptr<Env>> {
    auto streams = std::make_shared<StreamSet>(p.devices);
    cuda::NcclWorldOptions o;
    o.world_size = p.world_size;
    o.local_ranks = p.local_ranks;
    o.devices = p.devices;
    o.id = nccl_id;
    o.timeout_s = kTimeoutS;
    o.stream_of = [streams](int) { return streams->s[0]; };
    PTDP_ASSIGN_OR_RETURN(std::unique_ptr<cuda::NcclWorld> made, cuda::NcclWorld::Create(o));
    std::shared_ptr<cuda::NcclWorld> world = std::move(made);
    PTDP_RETURN_IF_ERROR(world->Prepare({{"BENCH", {Iota(p.world_size)}}}));
    auto env = std::make_unique<Env>();
    PTDP_ASSIGN_OR_RETURN(auto c, world->Group(p.local_ranks[0], Iota(p.world_size), "BENCH"));
    env->comms.push_back(std::move(c));
    env->alloc = DeviceAlloc([p](int) { return p.devices[0]; });
    env->keep =
        std::make_shared<std::pair<std::shared_ptr<void>, std::shared_ptr<void>>>(world, streams);
    return env;
  };
  Register("NcclWorld", make, true, {n}, {1 << 16, 1 << 20, 1 << 24, 1 << 28}, 20);
  benchmark::Initialize(&argc, argv);
  QuietReporter quiet;
  if ((*mpi)->rank() == 0)
    benchmark::RunSpecifiedBenchmarks();
  else
    benchmark::RunSpecifiedBenchmarks(&quiet);
  for (auto& cache : g_caches) cache->clear();
  benchmark::Shutdown();
  return 0;
}
#endif

}  // namespace

int main(int argc, char** argv) {
#if defined(PTDP_HAVE_CUDA) && defined(PTDP_HAVE_MPI)
  if (UnderMpi()) return RunUnderMpi(argc, argv);
#endif
  // Host threads on this machine's cores: 4 KiB (latency) to 16 MiB (memory bandwidth).
  Register("ThreadWorld", ThreadEnv, false, {2, 4, 8}, {1 << 12, 1 << 18, 1 << 24});
#ifdef PTDP_HAVE_CUDA
  const int gpus = VisibleGpus();
  if (gpus > 0) {
    Register("DeviceWorld", DeviceEnv, true, {2, 4, 8}, {1 << 16, 1 << 20, 1 << 24, 1 << 28});
    std::vector<int> ns = {gpus};
    if (gpus > 2) ns.insert(ns.begin(), 2);
    Register("NcclWorld", NcclEnv, true, ns, {1 << 16, 1 << 20, 1 << 24, 1 << 28});
  } else {
    std::fprintf(stderr, "comm_bench: no CUDA GPU visible: DeviceWorld and NcclWorld skipped\n");
  }
#endif
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  for (auto& cache : g_caches) cache->clear();
  benchmark::Shutdown();
  return 0;
}
