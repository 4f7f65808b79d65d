// NcclWorld: the CommunicatorFactory over NCCL, one rank per GPU, any number of processes (one
// process may drive every GPU of a node, one thread per rank at step time, or a single GPU).
//
// Creation. NCCL communicators are created collectively: every rank of the parent must take part
// in each ncclCommSplit, yet Trainer::Create asks for groups one rank after another from ONE
// thread (rank 0's TP, PP, DP, EMB, WORLD; then rank 1's ...), and a collective call made for
// rank 0 would wait for rank 1, which that thread has not reached. So:
//  1. NcclWorld::Create makes each local rank's world communicator: ncclCommInitRankConfig for
//     every local rank inside one ncclGroupStart/End (the NCCL rule for one thread driving
//     several GPUs), with the ncclUniqueId that every process got from rank 0 (MpiBootstrap).
//  2. Prepare(sets), called once by Trainer::Create with every group of the layout, does one
//     ncclCommSplit per label for every local rank inside one ncclGroupStart/End: color = the
//     index of the rank's group in the label's set (NCCL_SPLIT_NOCOLOR when in none, e.g. EMB
//     for middle stages), key = the rank's position in its group, so NCCL's rank order in the
//     new communicator is the group-rank order. Every process calls it with the same sets.
//  3. Group() only hands out what Prepare made; it never blocks, and asking for a group that was
//     not prepared is an error naming it.
//
// Operations are enqueued on a stream of each handle's own, after the work the rank's stream
// (StreamOf, the rank's CudaBackend::stream(), asked for at Group() time) holds when they are
// called (an event), and each returns when this rank's result is complete, as communicator.h
// asks: the calling thread waits for that stream. Waiting is not overlap for the calling thread,
// but a thread beside the rank's (the trainer's GradReducer, --overlap-grad-reduce) waits for
// its buckets only while the rank's stream runs the backward; and it keeps the contract every
// implementation shares (a tensor handed back is ready, the host may
// read what an all-reduce produced) and gives the watchdog a place to stand. Point-to-point
// operations inside GroupStart()/GroupEnd() are posted together at the outermost GroupEnd() in
// one ncclGroupStart/End on the same communicator, on both peers alike. Reductions take f32 and
// bf16; gathers, broadcasts and p2p copy f32, bf16 and i32.
//
// Timeouts (the watchdog). Every communicator is non-blocking (ncclConfig_t.blocking = 0), so no
// NCCL call hangs the calling thread: the thread polls ncclCommGetAsyncError (until the
// operation is enqueued) and cudaStreamQuery (until it completed), and past timeout_s, or on an
// asynchronous NCCL error (a peer died, a network error), it calls ncclCommAbort, which makes the
// stuck kernel return. The error names the group, the operation and its number, the calling
// rank, and what this process's other members of the group are doing (members in other
// processes are named as such: only their own process knows). Init and split are watched the
// same way. After a failure the group is unusable for every local rank: they abort their own
// communicator of it at their next poll or call, and later calls are refused, as with
// ThreadWorld.
//
// What NCCL does not give: determinism across layouts (NCCL's ring/tree order is not group-rank
// order; runs are repeatable for one configuration, and all ranks get the same all-reduce
// result, but not bit-identical to ThreadWorld), NaN propagation by max, and detection of
// mismatched calls (they show up as a timeout, or as wrong numbers).
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/cuda/device_world.h"  // StreamOf

namespace ptdp::rt::cuda {

// NCCL's unique id (ncclUniqueId, NCCL_UNIQUE_ID_BYTES = 128), as bytes so that this header needs
// no NCCL header. Made by one process (NewNcclId on rank 0), sent to every other.
struct NcclId {
  std::array<char, 128> bytes{};
};
Result<NcclId> NewNcclId();

// The ncclCommSplit arguments of one rank for one GroupSet.
struct SplitArgs {
  int color = -1;  // index of the rank's group in the set; -1 (NCCL_SPLIT_NOCOLOR): in none
  int key = 0;     // the rank's position in its group (its group rank)
};
// For each of `ranks` (global), its split arguments for `set`. Errors (naming the label and the
// rank): a group that is empty, a rank outside [0, world_size), a rank in two groups of the set
// or twice in one.
Result<std::vector<SplitArgs>> PlanSplit(const GroupSet& set, int world_size,
                                         const std::vector<int>& ranks);

struct NcclWorldOptions {
  int world_size = 1;            // global ranks in the whole job (every process)
  std::vector<int> local_ranks;  // the global ranks this process drives, one per GPU
  std::vector<int> devices;      // the CUDA device of each local rank (same length, distinct)
  NcclId id;                     // the same on every process (rank 0's NewNcclId)
  double timeout_s = 300;        // for init, each split and every operation
  StreamOf stream_of;            // stream of each local rank, called at Group() time
};

class NcclWorld final : public CommunicatorFactory {
 public:
  // Makes the world communicator of every local rank (collective over every process of the job:
  // each calls Create with the same world_size and id). Fails, naming the reason, on bad options
  // (sizes, ranks, devices that do not exist or repeat), a failed or timed-out init (every
  // communicator made so far is aborted).
  static Result<std::unique_ptr<NcclWorld>> Create(NcclWorldOptions options);
  // Group handles keep the world's state alive and may outlive this object; the last of them
  // destroys every communicator (finalize, then destroy; abort if that does not finish in time,
  // or if it failed). Prepare() must not run concurrently with Group() (Trainer::Create calls
  // both from one thread); Group() calls may run concurrently with each other.
  ~NcclWorld() override;
  NcclWorld(const NcclWorld&) = delete;
  NcclWorld& operator=(const NcclWorld&) = delete;

  int world_size() const override;
  const std::vector<int>& local_ranks() const;

  // Splits the world communicator once per set, in order (collective over every process; see
  // the file comment). A label may be prepared once. After a failure (bad sets, a failed or
  // timed-out split) the world is unusable: later Prepare and Group calls say why.
  Status Prepare(const std::vector<GroupSet>& sets) override;

  // The prepared communicator of local rank `global_rank` on (ranks, label). Errors: the
  // CommunicatorFactory ones, a rank this process does not drive, a group Prepare did not make.
  Result<std::unique_ptr<Communicator>> Group(int global_rank, const std::vector<int>& ranks,
                                              const std::string& label) override;

  struct State;  // defined in the .cc

 private:
  explicit NcclWorld(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

}  // namespace ptdp::rt::cuda
