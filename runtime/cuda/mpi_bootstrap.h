// MpiSession: how the processes of a multi-process GPU job (mpirun, or Slurm's srun) find their
// place and share rank 0's NCCL id. MPI is only the bootstrap: no tensor ever travels over it;
// the NCCL communicators (NcclWorld) carry everything once they exist.
//
//   auto mpi = MpiSession::Init(&argc, &argv);                 // MPI_Init_thread
//   auto place = (*mpi)->Place(/*gpus_per_process=*/1, ProbeCuda().gpus_visible);
//   auto id = (*mpi)->ShareNcclId();                           // rank 0's, to every process
//   NcclWorldOptions o{place->world_size, place->local_ranks, place->devices, *id, 300, stream_of};
//   auto world = NcclWorld::Create(o);                          // collective over the processes
//
// Placement. Process p (MPI_COMM_WORLD rank) drives the k = gpus_per_process global ranks
// [p*k, (p+1)*k). mpirun and srun number the processes of a node consecutively, so the ranks of a
// node are consecutive and RankGrid's TP groups (innermost) stay inside a node. Devices: when
// the process sees exactly k GPUs (srun --gpus-per-task=k, or CUDA_VISIBLE_DEVICES set per
// process), rank p*k + j uses device j; when it sees the node's GPUs, device node_rank*k + j,
// where node_rank is the process's index on its node (MPI_Comm_split_type SHARED).
// Launch lines: docs/gpus.md.
#pragma once

#include <memory>
#include <vector>

#include "core/status.h"
#include "runtime/cuda/nccl_world.h"

namespace ptdp::rt::cuda {

struct Placement {
  int process_rank = 0;          // MPI_COMM_WORLD rank
  int process_count = 1;         // MPI_COMM_WORLD size
  int node_rank = 0;             // index of this process on its node
  int node_size = 1;             // processes on this node
  int world_size = 1;            // global ranks: process_count * gpus_per_process
  std::vector<int> local_ranks;  // the global ranks this process drives
  std::vector<int> devices;      // their CUDA devices
};

class MpiSession {
 public:
  // Initializes MPI (MPI_THREAD_FUNNELED: only the calling thread uses MPI) unless it already
  // is, sets MPI_ERRORS_RETURN so that failures come back as Statuses, and finds this process's
  // rank on its node. Fails naming the MPI call and MPI's error text.
  static Result<std::unique_ptr<MpiSession>> Init(int* argc, char*** argv);
  // Finalizes MPI if Init initialized it.
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int node_rank() const { return node_rank_; }
  int node_size() const { return node_size_; }

  // This process's ranks and devices (see the file comment). Errors: gpus_per_process < 1, or
  // fewer visible GPUs than the placement needs (naming the counts).
  Result<Placement> Place(int gpus_per_process, int gpus_visible) const;

  // Rank 0 makes an NCCL id (NewNcclId) and every process receives it (MPI_Bcast). A failure on
  // rank 0 reaches every process as an error (the id's success travels with it).
  Result<NcclId> ShareNcclId() const;

  // True on every process when `ok` is true on every process (MPI_Allreduce, logical and): lets
  // all processes stop together when one of them failed to set up.
  Result<bool> AllOk(bool ok) const;

 private:
  MpiSession() = default;
  bool finalize_ = false;
  int rank_ = 0, size_ = 1, node_rank_ = 0, node_size_ = 1;
};

// Where process `process_rank` of a node (index node_rank of node_size) with `gpus_visible`
// GPUs puts its k ranks; Place without MPI, for tests.
Result<Placement> PlaceRanks(int process_rank, int process_count, int node_rank, int node_size,
                             int gpus_per_process, int gpus_visible);

}  // namespace ptdp::rt::cuda
