// Checkpoint files: the layout-independent state of a training run, written atomically with a
// CRC32C, and the folder of numbered checkpoints `ptdp train` keeps. A checkpoint is either one
// whole-tensor file (version 1: tensors whole, by name, with global shapes) or, for a run over
// several processes, a manifest plus one shard file per process (version 2: each process writes
// the elements its ranks hold, like Megatron's distributed checkpoints, --ckpt-format torch_dist).
// Either way a reader gets whole tensors, so any TP x CP x PP x DP x EP layout of the same model
// can load what any other layout wrote. Depends on core/ only.
//
// File layout, all three kinds (little-endian; fixed 48-byte header, YAML metadata, data,
// 8-byte trailer):
//
//   offset  bytes  field
//   0       8      magic "PTDPCKPT"
//   8       4      u32 format version: 1 whole-tensor file; 2 sharded manifest or shard
//   12      4      u32 reserved, 0
//   16      8      u64 file bytes F (the whole file, trailer included)
//   24      8      u64 metadata bytes M
//   32      8      u64 data offset D (48 + M rounded up to a multiple of 64)
//   40      8      u64 data bytes (F - 8 - D)
//   48      M      metadata, YAML text; zero padding up to D
//   D       ...    data (64-aligned sections at the offsets the metadata gives, relative to D)
//   F - 8   4      u32 CRC32C (Castagnoli) of bytes [0, F - 8)
//   F - 4   4      "END1"
//
// Metadata by kind (see CheckpointMetadataYaml and the writers):
//   whole (v1)     format: ptdp-checkpoint; model, step, optimizer settings, data position,
//                  seed, and the tensor table (name, shape, offset); data: each tensor, fp32
//                  row-major.
//   manifest (v2)  format: ptdp-checkpoint; the same keys, the tensor table without offsets,
//                  world (ranks), and `shards`: each shard file's name, first rank, bytes,
//                  CRC32C and the tensors it has pieces of (index ranges into the table); no
//                  data. Written by process 0 after every shard is in place: a
//                  checkpoint exists when its manifest does.
//   shard (v2)     format: ptdp-checkpoint-shard; step, counters, world, the global ranks whose
//                  state it holds, and `pieces`: tensor name, whole shape, runs, elements and two
//                  offsets; data: per piece, a run table (u64 start, u64 length: flat element
//                  ranges of the whole tensor, increasing) then the elements, fp32, in run order.
//
// Writing goes to "<path>.tmp" in the same folder, is fsync'ed, renamed over <path>, and the
// folder is fsync'ed: a reader sees the old file or the whole new one, never a part. Reading
// checks, in order: a regular file (a FIFO is never waited on), size, magic, version, recorded
// size (truncation), metadata size (at most 64 MiB), trailer, the CRC32C of the whole file
// (alteration), and only then parses the metadata and the tables (a second pass, whose CRC must
// match again); each refusal names the file. A manifest's shards must also have the size and
// CRC32C the manifest records, its step and world, and tile every tensor exactly once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/model.h"
#include "core/status.h"

namespace ptdp::rt {

// CRC32C (Castagnoli, reflected polynomial 0x82F63B78) of `bytes` bytes at `data`, continuing
// from `crc` (0 to start). Crc32c(0, "123456789", 9) == 0xE3069283. Uses the CPU's crc32
// instruction where there is one (x86 SSE4.2), else Crc32cPortable; both give the same value.
uint32_t Crc32c(uint32_t crc, const void* data, size_t bytes);
// The same from 8 tables of 256 entries built from the polynomial ("slicing-by-8"), any CPU.
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t bytes);

// A whole tensor, fp32, global shape, row-major.
struct NamedTensor {
  std::string name;             // "param/layers.0.attn.qkv.weight", "adam_m/...", "adam_v/..."
  std::vector<int64_t> shape;   // global shape; numel = product (1 for an empty shape)
  std::vector<float> data;      // numel elements
};

// What a checkpoint holds of a trainer (Trainer::ExportState / ImportState): the counters and
// every tensor whole, so that any layout of the same model can import it.
struct TrainingState {
  int64_t step = 0;              // steps completed: the next step is step `step`
  int64_t optimizer_steps = 0;   // AdamW updates applied (steps minus skipped ones)
  // The data position: sequences of the sample stream consumed (step * global batch). The
  // data-order generator is counter-based (splitmix64 keyed by seed and epoch, runtime/data.h),
  // so (seed, consumed_samples) is its whole state: there is no other RNG state to save.
  int64_t consumed_samples = 0;
  // "param/<name>" for every parameter, then "adam_m/<name>" and "adam_v/<name>" (the AdamW
  // moments), in GptParams order.
  std::vector<NamedTensor> tensors;
};

// ---- Shards: the part of the state one process's ranks hold.

// `length` consecutive elements of a whole tensor, from flat (row-major) index `start`.
struct ElementRun {
  int64_t start = 0;
  int64_t length = 0;
};

// What one rank holds of one whole tensor: its elements in increasing whole index, as runs.
struct TensorPiece {
  std::string name;              // as in NamedTensor
  std::vector<int64_t> shape;    // the whole tensor's shape
  std::vector<ElementRun> runs;  // increasing, disjoint
  std::vector<float> data;       // the runs' elements in order: sum of the lengths
};

// What the ranks of one process hold of the training state (Trainer::ExportShard): every
// element of the whole state is in exactly one process's shard.
struct StateShard {
  int64_t step = 0, optimizer_steps = 0, consumed_samples = 0;  // as in TrainingState
  int world = 0;                     // ranks of the layout
  std::vector<int> ranks;            // the global ranks whose state this is, increasing
  std::vector<NamedTensor> tensors;  // every tensor of the whole state: name and shape, no data
  std::vector<TensorPiece> pieces;
};

struct Checkpoint {
  ModelSpec model;               // the model the tensors belong to
  uint64_t seed = 0;             // parameter init and data-order seed
  int64_t global_batch = 0;      // sequences per step
  std::string layout;            // the layout that wrote it (informational: any layout loads it)
  std::map<std::string, double> optimizer;  // optimizer settings by name (lr, warmup_steps, ...)
  TrainingState state;
  // Set by ReadCheckpoint, not written: the bytes read (a manifest and its shards together),
  // the shard files read, and the shard files the manifest lists (both 0: a whole-tensor file).
  uint64_t read_bytes = 0;
  int read_shards = 0;
  int shards = 0;
};

// Test hook: called once while writing, after about half the tensor data is in the temporary
// file (flushed to the OS, not fsync'ed), with the temporary file's path.
using PartialWriteHook = std::function<void(const std::string& tmp_path)>;

// Writes `ckpt` to `path` atomically (see above). Fails, naming the file and the system error,
// when the folder is not writable or the disk is full; then `path` is untouched and the
// temporary file removed. Precondition: every tensor's data has the numel of its shape.
Status WriteCheckpoint(const std::string& path, const Checkpoint& ckpt,
                       const PartialWriteHook& hook = nullptr);

// Which tensors a reader wants, by name (nullptr: all).
using TensorFilter = std::function<bool(const std::string& name)>;

// Reads and verifies a checkpoint: a whole-tensor file, or a manifest with its shard files
// (read from the manifest's folder and assembled into whole tensors). Fails with "<path>: <what
// is wrong>" on a missing or unreadable file, a truncated one, a wrong magic or version, a
// checksum mismatch, or bad metadata (naming the key); for a sharded checkpoint also a missing
// shard, one whose size or CRC32C is not the manifest's (replaced by another run's), one of
// another step or world, ranks in no shard or in two, and elements of a tensor in no shard or
// in two (naming the tensor and the range).
// With `wanted`, state.tensors holds only the tensors it accepts (in table order) and only the
// shards holding pieces of them are opened (the manifest records which tensors each shard
// has): a process of a large job reads its own ranks' part, not the whole state. Every file it
// opens is still verified whole; that no rank is in two shards is checked among those read,
// that every rank is in one only without a filter (when every shard is read).
Result<Checkpoint> ReadCheckpoint(const std::string& path, const TensorFilter& wanted = nullptr);

// Whether `path` is the manifest of a sharded checkpoint (its header's version is 2), from its
// first 12 bytes; ReadCheckpoint verifies the rest. Fails when it cannot be read.
Result<bool> IsShardedCheckpoint(const std::string& path);

// ---- Sharded checkpoints.

// How the manifest records one shard file.
struct ShardRecord {
  std::string file;     // the name in the checkpoint's folder: ShardFileName(step, first_rank)
  int first_rank = 0;   // the shard's first global rank
  uint64_t bytes = 0;   // file size
  uint32_t crc32c = 0;  // the CRC32C its trailer holds
  // The tensors it has pieces of, as ranges [first, last) of indices into the manifest's tensor
  // table (the checkpoint's state.tensors order), increasing: what a reader with a filter uses
  // to open only the shards it needs.
  std::vector<std::pair<int64_t, int64_t>> tensors;
};

// The ranges of ShardRecord::tensors for a shard's pieces, against its table (every piece's
// tensor must be in shard.tensors).
std::vector<std::pair<int64_t, int64_t>> TensorRanges(const StateShard& shard);

// "step-%08lld.rank%05d.shard": the shard of the process whose first rank is `first_rank`.
std::string ShardFileName(int64_t step, int first_rank);

// Writes one process's shard to `path` atomically (as WriteCheckpoint; the hook is called
// halfway through its data) and returns its record. Precondition: every piece's data has the
// elements its runs count.
Result<ShardRecord> WriteCheckpointShard(const std::string& path, const StateShard& shard,
                                         const PartialWriteHook& hook = nullptr);

// Writes `meta` and `data` in the container every checkpoint file has (the header with
// `version`, the metadata, the data section, the CRC32C trailer), atomically, whatever they
// say, and returns its record (file name, bytes, CRC32C): for tests and the fuzz target of the
// readers, which must refuse what does not make sense.
Result<ShardRecord> WriteCheckpointContainer(const std::string& path, uint32_t version,
                                             const std::string& meta, const std::string& data);

// Writes the manifest of a sharded checkpoint to `path` atomically: `ckpt` without tensor data
// (its state's tensors give the names and shapes; their data is not used), the world and the
// shards, sorted by first rank. Call it after every shard is in place.
Status WriteCheckpointManifest(const std::string& path, const Checkpoint& ckpt, int world,
                               std::vector<ShardRecord> shards);

// The metadata YAML of `ckpt` with tensor offsets, as stored in the file (for docs and tests).
std::string CheckpointMetadataYaml(const Checkpoint& ckpt);

// ---- The checkpoint folder of a run: "step-00000012.ckpt" files, newest = highest step.

// The file name of the checkpoint after `step` completed steps: "step-%08lld.ckpt".
std::string CheckpointFileName(int64_t step);

// Checkpoint files in `dir` (whole files and manifests; not the temporary ones, not the
// shards), sorted by step, oldest first. Fails when `dir` cannot be listed.
Result<std::vector<std::string>> ListCheckpoints(const std::string& dir);

// Removes what writes that never finished (a killed run) left: "*.ckpt.tmp" and "*.shard.tmp"
// files, and shard files of a step that has no checkpoint file (a run killed between its
// shards and its manifest); returns their names. Only while no run writes to `dir`.
Result<std::vector<std::string>> RemoveIncompleteCheckpoints(const std::string& dir);

// Deletes all but the newest `keep` checkpoints (keep >= 1), each with the shard files of its
// step (the manifest first: a checkpoint is never seen without its shards), and returns the
// deleted checkpoint file names.
Result<std::vector<std::string>> PruneCheckpoints(const std::string& dir, int keep);

// Deletes the shard files of `step` that `keep` (file names) does not list: those another run,
// with other ranks per process, wrote for the same step. Returns their names.
Result<std::vector<std::string>> RemoveStaleShards(const std::string& dir, int64_t step,
                                                   const std::vector<std::string>& keep);

// ---- One run per folder: two runs writing one folder would replace each other's checkpoints
// (and, writing the same step-N.ckpt.tmp, mix their bytes).

// The lock file in a checkpoint folder.
inline constexpr const char* kCheckpointLockName = ".ptdp-lock";

// An exclusive lock on a checkpoint folder, held by one run from start to end: flock(LOCK_EX)
// on DIR/.ptdp-lock, which records the holder ("pid 1234, host vm, since
// 2026-11-29T10:00:00Z"). The kernel drops a process's flock when it dies, so a lock file a
// killed run (kill -9) left behind is simply taken over. flock works across the processes of one
// machine and, on Linux, on NFS (as a POSIX lock); not on every other network file system.
class CheckpointFolderLock {
 public:
  // Takes the lock of `dir` (an existing folder) without waiting, creating the lock file if
  // needed. Fails with "DIR: in use by another run (pid P, host H, since T; lock file
  // DIR/.ptdp-lock): wait for it to end or use another folder" when another process (or another
  // lock object of this one) holds it, or naming the lock file and the system error (e.g. a
  // folder that is not writable).
  static Result<std::unique_ptr<CheckpointFolderLock>> Acquire(const std::string& dir);
  // Removes the lock file, then releases the lock.
  ~CheckpointFolderLock();
  CheckpointFolderLock(const CheckpointFolderLock&) = delete;
  CheckpointFolderLock& operator=(const CheckpointFolderLock&) = delete;

  const std::string& path() const { return path_; }  // DIR/.ptdp-lock

 private:
  CheckpointFolderLock(int fd, std::string path);
  int fd_;
  std::string path_;
};

}  // namespace ptdp::rt
