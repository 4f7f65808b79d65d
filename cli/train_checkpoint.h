// Checkpointing for `ptdp train`: its flags, resuming from the newest checkpoint of a folder
// (into the plan's layout, whatever layout wrote it) and saving every N steps. The file format
// is runtime/checkpoint.h; what a checkpoint restores is docs/reliability.md.
#pragma once

#include <CLI/CLI.hpp>

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "core/status.h"
#include "runtime/checkpoint.h"
#include "runtime/trainer.h"

namespace ptdp::cli {

struct CheckpointFlags {
  std::string dir;      // --checkpoint-dir: where step-NNNNNNNN.ckpt files go; empty: none
  int save_every = 0;   // --save-every N: after every N-th step (0: only after the last step)
  int keep = 3;         // --keep K: the newest K checkpoints stay, older ones are deleted
  bool resume = false;  // --resume: continue from the newest checkpoint in dir (if any)
  std::string on_nan = "stop";  // --on-nan skip|stop
  // --ckpt-format whole|sharded|auto: one file of whole tensors, or a shard per process plus a
  // manifest (runtime/sharded_checkpoint.h); auto (the default): whole for a run in one
  // process, sharded over several. ResolveCheckpointFormat turns auto into one of the two.
  std::string format = "auto";
};
void AddCheckpointFlags(CLI::App* app, CheckpointFlags* f);
// Range checks of the flags (the message names the flag).
Status CheckCheckpointFlags(const CheckpointFlags& f);

// f->format once the launch is known: auto becomes sharded when this process drives only some
// of the ranks (mpirun, srun), else whole.
void ResolveCheckpointFormat(CheckpointFlags* f, bool several_processes);

// The optimizer settings as a checkpoint stores them, by name; and back.
std::map<std::string, double> OptimizerSettings(const rt::OptimizerConfig& o);
Result<rt::OptimizerConfig> OptimizerFromSettings(const std::map<std::string, double>& s,
                                                  const std::string& file);

// Creates the folder, checks that files can be created and removed in it, takes its lock (one
// run per folder: a second is refused naming the holder, see rt::CheckpointFolderLock),
// removes the temporary files of writes that never finished (printing them) and, with
// --resume, reads the newest checkpoint (resume is nullopt when the folder has none). A
// damaged newest checkpoint is an error naming it (older ones are not tried silently).
// Without --checkpoint-dir: no lock, no resume. A run over several processes: process 0 is the
// folder's `owner` (all of the above); the others only read the newest checkpoint with --resume.
// A sharded checkpoint is read in two parts: its manifest here (the model, counters, seed and
// settings; no tensors), and the tensors this process's ranks need by LoadShards once the
// trainer exists, so that each process reads its own part of the state, not all of it.
struct ResumePoint {
  std::string path;
  rt::Checkpoint ckpt;
  bool tensors_pending = false;  // a sharded checkpoint: call LoadShards before ImportState
};
struct CheckpointFolder {
  std::unique_ptr<rt::CheckpointFolderLock> lock;  // hold it until the run ends
  std::optional<ResumePoint> resume;
};
Result<CheckpointFolder> PrepareCheckpoints(const CheckpointFlags& f, bool owner = true);

// The tensors of a sharded resume point that `trainer`'s ranks need, read into from->ckpt
// (printing what was read); a no-op for a whole file.
Status LoadShards(ResumePoint* from, const rt::Trainer& trainer);

// Takes the checkpoint's seed and optimizer settings into `cfg` (printing those that differ
// from the flags), after checking that its model and global batch are the plan's.
Status ApplyCheckpoint(const ResumePoint& from, rt::TrainerConfig* cfg);

// Writes the trainer's state as <dir>/step-NNNNNNNN.ckpt (NNNNNNNN = steps done; with
// --ckpt-format sharded that is the manifest, and each process writes its own
// step-NNNNNNNN.rankRRRRR.shard), prints the size and time, and deletes all but the newest
// --keep. Test hook: with the environment variable PTDP_TEST_PAUSE_CHECKPOINT_WRITE=<steps>, the
// write of that checkpoint (or shard) pauses for 10 minutes halfway through the data, after
// printing "checkpoint write paused: <tmp path>" on stderr (tests kill -9 the process there).
// Over several processes every process calls it (both formats communicate over WORLD) and
// process 0, the `owner`, writes the whole file or the manifest; every process returns the
// same success or failure (a failed write anywhere stops every process, none waits alone).
// f.format must be resolved (not auto).
Status SaveCheckpoint(const CheckpointFlags& f, rt::Trainer& trainer, const rt::TrainerConfig& cfg,
                      bool owner = true);

}  // namespace ptdp::cli
