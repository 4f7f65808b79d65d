// Saving a checkpoint from a job whose ranks are spread over several processes (mpirun, srun:
// one process per GPU), each process writing only what its own ranks hold (Megatron's
// distributed checkpoint, --ckpt-format torch_dist, does the same). The files are
// runtime/checkpoint.h's shards and manifest; ReadCheckpoint reads them back as whole tensors,
// so any layout and any split into processes resumes them.
//
//   every process:  ExportShard, write step-N.rankRRRRR.shard (atomic)
//        | AllGatherWords: written?, size, CRC32C, the tensors it holds
//   process 0:      write step-N.ckpt (the manifest), delete stale shards of step N, prune
//        | AllGatherWords: did process 0 succeed?
//   every process:  the same result
//
// Every process returns the same success or failure: a process whose write failed reports its
// own error, the others name it, so that no process goes on to the next step alone and waits
// there until the communicator's timeout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/checkpoint.h"
#include "runtime/trainer.h"

namespace ptdp::rt {

struct ShardedSave {
  std::string dir;         // the checkpoint folder (exists; the owner holds its lock)
  bool owner = true;       // this process writes the manifest and cleans the folder
  int keep = 0;            // the owner keeps the newest `keep` checkpoints (0: deletes none)
  PartialWriteHook hook;   // this process's shard write (test hook, see WriteCheckpoint)
  // A file this process must see before it writes (empty: none). ptdp train passes the owner's
  // lock file to the other processes: a folder on a disk of each host's own (not one file
  // system shared by all processes) fails here, by every process, naming the folder.
  std::string must_see;
};

struct SavedCheckpoint {
  std::string path;                 // the manifest, DIR/step-NNNNNNNN.ckpt
  uint64_t bytes = 0;               // the shards and the manifest together
  int shards = 0;                   // shard files (one per process)
  std::vector<std::string> pruned;  // older checkpoints the owner deleted
};

// Saves the trainer's state as a sharded checkpoint: called on every Trainer of the job,
// concurrently, like Step (it communicates over WORLD twice). `info` gives the model, seed,
// global batch, layout and optimizer settings (its state is not used). On success every
// process has the checkpoint's path. On failure every process fails: the one that could not
// write with its error, the others naming the rank whose process failed.
Result<SavedCheckpoint> SaveShardedCheckpoint(Trainer& trainer, const Checkpoint& info,
                                              const ShardedSave& how);

// Every process's `mine` agreed on over WORLD (a collective like Step): `mine` when it failed;
// else, when a process failed, "<what> failed in the process of rank R (its own output says
// why)"; else OK.
Status AgreeAcrossProcesses(Trainer& trainer, const Status& mine, const std::string& what);

}  // namespace ptdp::rt
