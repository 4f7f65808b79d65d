// Sharded checkpoints of a job over several processes; see sharded_checkpoint.h.
#include "runtime/sharded_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <map>

namespace ptdp::rt {

Status AgreeAcrossProcesses(Trainer& trainer, const Status& mine, const std::string& what) {
  PTDP_ASSIGN_OR_RETURN(auto all, trainer.AllGatherWords({mine.ok() ? 1 : 0}));
  if (!mine.ok()) return mine;
  for (size_t g = 0; g < all.size(); ++g)
    if (all[g][0] != 1)
      return Status::Error(what + " failed in the process of rank " + std::to_string(g) +
                           " (its own output says why)");
  return Status::Ok();
}

Result<SavedCheckpoint> SaveShardedCheckpoint(Trainer& trainer, const Checkpoint& info,
                                              const ShardedSave& how) {
  const int64_t step = trainer.steps_done();
  const std::string what = "saving checkpoint step " + std::to_string(step);
  // 1. This process's shard.
  Result<StateShard> shard = trainer.ExportShard();
  Status mine = shard.status();
  std::error_code ec;
  if (mine.ok() && !how.must_see.empty() && !std::filesystem::exists(how.must_see, ec))
    mine = Status::Error(how.dir + ": " + how.must_see + " is not visible to this process: the "
                         "checkpoint folder must be on a file system every process shares");
  ShardRecord rec;
  if (mine.ok()) {
    Result<ShardRecord> w = WriteCheckpointShard(
        how.dir + "/" + ShardFileName(step, shard->ranks.front()), *shard, how.hook);
    mine = w.status();
    if (w.ok()) rec = *w;
  }
  // 2. Every process's record: whether it wrote, its first rank, size, CRC and the count of
  // its tensor ranges; then the ranges, padded to the longest list.
  PTDP_ASSIGN_OR_RETURN(
      auto all, trainer.AllGatherWords({mine.ok() ? 1 : 0, rec.first_rank, int64_t(rec.bytes),
                                        int64_t(rec.crc32c), int64_t(rec.tensors.size())}));
  int64_t longest = 0;
  for (const std::vector<int64_t>& w : all) longest = std::max(longest, w[4]);
  std::vector<int64_t> mine_ranges(size_t(2 * longest), 0);
  for (size_t k = 0; k < rec.tensors.size(); ++k) {
    mine_ranges[2 * k] = rec.tensors[k].first;
    mine_ranges[2 * k + 1] = rec.tensors[k].second;
  }
  PTDP_ASSIGN_OR_RETURN(auto ranges, trainer.AllGatherWords(mine_ranges));
  if (!mine.ok()) return mine;
  std::map<int, ShardRecord> records;  // by first rank: every rank of a process sends the same
  for (size_t g = 0; g < all.size(); ++g) {
    const std::vector<int64_t>& w = all[g];
    if (w[0] != 1)
      return Status::Error(what + ": the process of rank " + std::to_string(g) +
                           " could not write its shard (its own output says why)");
    ShardRecord r;
    r.first_rank = int(w[1]);
    r.file = ShardFileName(step, r.first_rank);
    r.bytes = uint64_t(w[2]);
    r.crc32c = uint32_t(w[3]);
    for (int64_t k = 0; k < w[4]; ++k)
      r.tensors.emplace_back(ranges[g][size_t(2 * k)], ranges[g][size_t(2 * k + 1)]);
    records[r.first_rank] = r;
  }
  SavedCheckpoint saved;
  saved.path = how.dir + "/" + CheckpointFileName(step);
  saved.shards = int(records.size());
  std::vector<ShardRecord> list;
  std::vector<std::string> names;
  for (const auto& [first, r] : records) {
    list.push_back(r);
    names.push_back(r.file);
    saved.bytes += r.bytes;
  }
  // 3. The owner commits it (the manifest) and cleans the folder.
  Status owner_st = Status::Ok();
  if (how.owner) {
    Checkpoint c = info;
    c.state.step = shard->step;
    c.state.optimizer_steps = shard->optimizer_steps;
    c.state.consumed_samples = shard->consumed_samples;
    c.state.tensors = shard->tensors;  // names and shapes
    owner_st = WriteCheckpointManifest(saved.path, c, shard->world, list);
    if (owner_st.ok()) owner_st = RemoveStaleShards(how.dir, step, names).status();
    if (owner_st.ok() && how.keep > 0) {
      Result<std::vector<std::string>> pruned = PruneCheckpoints(how.dir, how.keep);
      owner_st = pruned.status();
      if (pruned.ok()) saved.pruned = *pruned;
    }
    const uintmax_t manifest_bytes = std::filesystem::file_size(saved.path, ec);
    if (!ec) saved.bytes += manifest_bytes;
  }
  // 4. Every process learns whether the owner did.
  PTDP_RETURN_IF_ERROR(AgreeAcrossProcesses(trainer, owner_st, what + " (the manifest)"));
  return saved;
}

}  // namespace ptdp::rt
