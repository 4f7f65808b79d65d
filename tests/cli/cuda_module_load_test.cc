// The CUDA module as the ptdp binary uses it (cli/cuda_module.h): found from this test binary's
// folder (build/tests/cli -> build/lib/ptdp), opened once, and every piece of its interface
// (runtime/cuda/module.h) answers across the boundary: strings, Status, Result, objects made on
// one side and used or destroyed on the other. Without a GPU the answers are CUDA's reasons; the
// MPI test runs under mpirun (ctest: cuda_module_mpi_2proc), as a launcher started by it would.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "cli/cuda_module.h"
#include "runtime/cuda/module.h"

namespace ptdp::cli {
namespace {

const rt::cuda::CudaModule& Module() {
  auto m = LoadCudaModule();
  EXPECT_TRUE(m.ok()) << m.status().message();
  return **m;
}

TEST(CudaModuleLoad, OpensOnceFromTheBuildTree) {
  auto path = CudaModulePath();
  ASSERT_TRUE(path.ok()) << path.status().message();
  EXPECT_NE(path->find("/lib/ptdp/libptdp_cuda.so"), std::string::npos) << *path;
  auto a = LoadCudaModule(), b = LoadCudaModule();
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(*a, *b);
}

TEST(CudaModuleLoad, ProbeAndMpiLibraryAnswer) {
  const rt::cuda::CudaInfo info = Module().Probe();
  EXPECT_GT(info.runtime_version, 0);
  EXPECT_GT(info.cublas_version, 0);
  EXPECT_GT(info.nccl_version, 0);
  if (info.gpus_visible == 0) {
    EXPECT_FALSE(info.why_none.empty());
  }
#if PTDP_HAVE_MPI
  EXPECT_FALSE(Module().MpiLibrary().empty());
#else
  EXPECT_TRUE(Module().MpiLibrary().empty());
#endif
}

TEST(CudaModuleLoad, FailuresComeBackAsStatuses) {
  const rt::cuda::CudaModule& m = Module();
  // A device that no machine has: CudaBackend::Create names it.
  rt::cuda::CudaBackendOptions o;
  o.device = 4096;
  auto b = m.NewBackend(o);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("CUDA device 4096"), std::string::npos)
      << b.status().message();
  // NcclWorld's option checks run before any CUDA call.
  rt::cuda::NcclWorldOptions w;
  w.world_size = 0;
  auto nccl = m.NewNcclWorld(w);
  ASSERT_FALSE(nccl.ok());
  EXPECT_NE(nccl.status().message().find("world size must be positive"), std::string::npos)
      << nccl.status().message();
}

// A DeviceWorld made by the module, used and destroyed here: its rendezvous (the module's own
// copy of runtime/rendezvous.cc) checks a group's ranks before any device work.
TEST(CudaModuleLoad, DeviceWorldCrossesTheBoundary) {
  auto world = Module().NewDeviceWorld(2, 1.0, 0, [](int) { return nullptr; });
  ASSERT_NE(world, nullptr);
  EXPECT_EQ(world->world_size(), 2);
  auto g = world->Group(0, {0, 5}, "TP");
  ASSERT_FALSE(g.ok());
  EXPECT_FALSE(g.status().message().empty());
}

TEST(CudaModuleLoad, MpiThroughTheModule) {
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (size == nullptr) GTEST_SKIP() << "not started by mpirun (ctest runs cuda_module_mpi_2proc)";
  auto job = Module().InitMpi();
#if PTDP_HAVE_MPI
  ASSERT_TRUE(job.ok()) << job.status().message();
  EXPECT_EQ((*job)->size(), std::atoi(size));
  auto place = (*job)->Place(1, (*job)->size());  // as if the node had a GPU per process
  ASSERT_TRUE(place.ok()) << place.status().message();
  EXPECT_EQ(place->local_ranks, std::vector<int>{(*job)->rank()});
  auto all = (*job)->AllOk((*job)->rank() != 0);  // rank 0 says no: everyone hears it
  ASSERT_TRUE(all.ok()) << all.status().message();
  EXPECT_FALSE(*all);
#else
  ASSERT_FALSE(job.ok());
  EXPECT_NE(job.status().message().find("without MPI"), std::string::npos);
#endif
}

}  // namespace
}  // namespace ptdp::cli
