// MpiSession: MPI as the bootstrap of a multi-process NCCL job (see mpi_bootstrap.h).
#include "runtime/cuda/mpi_bootstrap.h"

#include <mpi.h>

#include <array>
#include <cstring>
#include <string>

namespace ptdp::rt::cuda {
namespace {

// "MPI_Bcast failed: <MPI's text> (error 5)"; Ok on MPI_SUCCESS.
Status MpiStatus(int code, const char* call) {
  if (code == MPI_SUCCESS) return Status::Ok();
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) std::strcpy(text, "unknown MPI error");
  return Status::Error(std::string("mpi: ") + call + " failed: " + text + " (error " +
                       std::to_string(code) + ")");
}

#define PTDP_MPI_RETURN_IF_ERROR(call)                              \
  do {                                                              \
    ::ptdp::Status ptdp_mpi_s_ = MpiStatus((call), #call);           \
    if (!ptdp_mpi_s_.ok()) return ptdp_mpi_s_;                      \
  } while (0)

}  // namespace

Result<Placement> PlaceRanks(int process_rank, int process_count, int node_rank, int node_size,
                             int gpus_per_process, int gpus_visible) {
  const int k = gpus_per_process;
  if (k < 1) return Status::Error("placement: gpus per process must be at least 1, got " + std::to_string(k));
  Placement p;
  p.process_rank = process_rank;
  p.process_count = process_count;
  p.node_rank = node_rank;
  p.node_size = node_size;
  p.world_size = process_count * k;
  // Each process sees exactly its own GPUs, or every GPU of the node.
  int first_device = 0;
  if (gpus_visible == k) {
    first_device = 0;
  } else if (gpus_visible >= node_size * k) {
    first_device = node_rank * k;
  } else {
    return Status::Error("placement: " + std::to_string(node_size) + " processes on this node with " +
                         std::to_string(k) + " GPU(s) each need " + std::to_string(node_size * k) +
                         " GPUs (or " + std::to_string(k) + " visible per process), but " +
                         std::to_string(gpus_visible) + " are visible");
  }
  for (int j = 0; j < k; ++j) {
    p.local_ranks.push_back(process_rank * k + j);
    p.devices.push_back(first_device + j);
  }
  return p;
}

Result<std::unique_ptr<MpiSession>> MpiSession::Init(int* argc, char*** argv) {
  std::unique_ptr<MpiSession> s(new MpiSession());
  int initialized = 0;
  PTDP_MPI_RETURN_IF_ERROR(MPI_Initialized(&initialized));
  if (!initialized) {
    int provided = 0;
    PTDP_MPI_RETURN_IF_ERROR(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
    s->finalize_ = true;
    if (provided < MPI_THREAD_FUNNELED)
      return Status::Error("mpi: MPI_Init_thread gave thread level " + std::to_string(provided) +
                           ", below MPI_THREAD_FUNNELED");
  }
  PTDP_MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  PTDP_MPI_RETURN_IF_ERROR(MPI_Comm_rank(MPI_COMM_WORLD, &s->rank_));
  PTDP_MPI_RETURN_IF_ERROR(MPI_Comm_size(MPI_COMM_WORLD, &s->size_));
  MPI_Comm node = MPI_COMM_NULL;
  PTDP_MPI_RETURN_IF_ERROR(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, s->rank_, MPI_INFO_NULL, &node));
  Status st = MpiStatus(MPI_Comm_rank(node, &s->node_rank_), "MPI_Comm_rank(node)");
  if (st.ok()) st = MpiStatus(MPI_Comm_size(node, &s->node_size_), "MPI_Comm_size(node)");
  MPI_Comm_free(&node);
  if (!st.ok()) return st;
  return s;
}

MpiSession::~MpiSession() {
  if (finalize_) MPI_Finalize();
}

Result<Placement> MpiSession::Place(int gpus_per_process, int gpus_visible) const {
  return PlaceRanks(rank_, size_, node_rank_, node_size_, gpus_per_process, gpus_visible);
}

Result<NcclId> MpiSession::ShareNcclId() const {
  // [0]: 1 when rank 0 made the id; [1, 129): the id.
  std::array<char, 1 + sizeof(NcclId::bytes)> msg{};
  std::string why;
  if (rank_ == 0) {
    Result<NcclId> id = NewNcclId();
    if (id.ok()) {
      msg[0] = 1;
      std::memcpy(msg.data() + 1, id->bytes.data(), id->bytes.size());
    } else {
      why = id.status().message();
    }
  }
  PTDP_MPI_RETURN_IF_ERROR(MPI_Bcast(msg.data(), int(msg.size()), MPI_CHAR, 0, MPI_COMM_WORLD));
  if (msg[0] != 1)
    return Status::Error("mpi: rank 0 could not make the NCCL id" + (why.empty() ? "" : ": " + why));
  NcclId out;
  std::memcpy(out.bytes.data(), msg.data() + 1, out.bytes.size());
  return out;
}

Result<bool> MpiSession::AllOk(bool ok) const {
  int mine = ok ? 1 : 0, all = 0;
  PTDP_MPI_RETURN_IF_ERROR(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD));
  return all != 0;
}

}  // namespace ptdp::rt::cuda
