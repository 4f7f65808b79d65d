// The MPI bootstrap's placement (which global ranks and devices a process drives) from table
// cases, without MPI; and, when run under mpirun (ctest does, with 2 processes), a real session:
// every process agrees on the world, and rank 0's NCCL id reaches every process when a GPU is
// visible.
#include "runtime/cuda/mpi_bootstrap.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "tests/runtime/cuda/gpu_test_util.h"

namespace ptdp::rt::cuda {
namespace {

TEST(Placement, ProcessesTakeConsecutiveRanksAndTheirDevices) {
  struct Case {
    int process, processes, node_rank, node_size, k, visible;
    std::vector<int> ranks, devices;
  } cases[] = {
      // 8 processes on 1 node of 8 GPUs, 1 GPU each: process 5 -> rank 5 on device 5.
      {5, 8, 5, 8, 1, 8, {5}, {5}},
      // 2 nodes x 4 processes, the second node's process 6 (node rank 2) -> device 2.
      {6, 8, 2, 4, 1, 4, {6}, {2}},
      // srun --gpus-per-task=1: each process sees only its GPU -> device 0.
      {6, 8, 2, 4, 1, 1, {6}, {0}},
      // 2 processes (one per node) driving 4 GPUs each: process 1 -> ranks 4..7 on 0..3.
      {1, 2, 0, 1, 4, 4, {4, 5, 6, 7}, {0, 1, 2, 3}},
      // 2 processes on one node with 2 GPUs each: process 1 -> ranks 2, 3 on devices 2, 3.
      {1, 2, 1, 2, 2, 4, {2, 3}, {2, 3}},
  };
  for (const Case& c : cases) {
    auto p = PlaceRanks(c.process, c.processes, c.node_rank, c.node_size, c.k, c.visible);
    ASSERT_TRUE(p.ok()) << p.status().message();
    EXPECT_EQ(p->world_size, c.processes * c.k);
    EXPECT_EQ(p->local_ranks, c.ranks) << "process " << c.process;
    EXPECT_EQ(p->devices, c.devices) << "process " << c.process;
  }
}

TEST(Placement, TooFewGpusAreAnErrorWithTheCounts) {
  auto p = PlaceRanks(0, 4, 0, 4, 1, 2);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("4 processes on this node with 1 GPU(s) each need 4 GPUs "
                                      "(or 1 visible per process), but 2 are visible"),
            std::string::npos)
      << p.status().message();
  EXPECT_FALSE(PlaceRanks(0, 1, 0, 1, 0, 8).ok());
}

// Only under mpirun (OMPI_COMM_WORLD_SIZE is set): a singleton MPI_Init would need the MPI
// runtime's daemon, which containers may not allow.
TEST(MpiSession, ProcessesAgreeOnTheWorldAndShareRank0sNcclId) {
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (size == nullptr) GTEST_SKIP() << "not started by mpirun (ctest runs mpi_bootstrap_2proc)";
  int argc = 0;
  char** argv = nullptr;
  auto mpi = MpiSession::Init(&argc, &argv);
  ASSERT_TRUE(mpi.ok()) << mpi.status().message();
  EXPECT_EQ((*mpi)->size(), std::atoi(size));
  auto place = (*mpi)->Place(1, (*mpi)->node_size());  // as if the node had one GPU per process
  ASSERT_TRUE(place.ok()) << place.status().message();
  EXPECT_EQ(place->world_size, (*mpi)->size());
  EXPECT_EQ(place->local_ranks, (std::vector<int>{(*mpi)->rank()}));
  auto all = (*mpi)->AllOk(true);
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(*all);
  auto not_all = (*mpi)->AllOk((*mpi)->rank() != 0);  // rank 0 says no: everyone hears it
  ASSERT_TRUE(not_all.ok());
  EXPECT_FALSE(*not_all);
  if (!NoGpuReason().empty()) return;  // making an NCCL id needs the CUDA runtime
  auto id = (*mpi)->ShareNcclId();
  ASSERT_TRUE(id.ok()) << id.status().message();
  // Every process holds rank 0's id: the byte sum each computes equals rank 0's.
  long sum = 0;
  for (char c : id->bytes) sum += static_cast<unsigned char>(c);
  long rank0_sum = sum;
  ASSERT_EQ(MPI_Bcast(&rank0_sum, 1, MPI_LONG, 0, MPI_COMM_WORLD), MPI_SUCCESS);
  EXPECT_GT(sum, 0);
  EXPECT_EQ(sum, rank0_sum);
}

}  // namespace
}  // namespace ptdp::rt::cuda
