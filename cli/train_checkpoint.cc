// `ptdp train` checkpoint flags, resume and save; see train_checkpoint.h.
#include "cli/train_checkpoint.h"

#include <cassert>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <thread>

#include "cli/common.h"
#include "runtime/sharded_checkpoint.h"

namespace ptdp::cli {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

void AddCheckpointFlags(CLI::App* app, CheckpointFlags* f) {
  app->add_option("--checkpoint-dir", f->dir,
                  "save checkpoints (step-NNNNNNNN.ckpt) in this folder, created if missing");
  app->add_option("--save-every", f->save_every,
                  "checkpoint after every N-th step (default 0: only after the last step)");
  app->add_option("--keep", f->keep, "keep the newest K checkpoints (default 3)");
  app->add_flag("--resume", f->resume,
                "continue from the newest checkpoint in --checkpoint-dir (any layout may have "
                "written it); starts from step 0 when there is none");
  app->add_option("--ckpt-format", f->format,
                  "whole: one file of whole tensors (process 0 writes it); sharded: each process "
                  "writes its own ranks' shard plus a manifest, like Megatron's --ckpt-format "
                  "torch_dist; auto (default): whole in one process, sharded over several. Any "
                  "layout resumes either");
  app->add_option("--on-nan", f->on_nan,
                  "a NaN/Inf loss or gradient: stop (default, before any update) or skip the "
                  "step's update on every rank");
}

Status CheckCheckpointFlags(const CheckpointFlags& f) {
  if (f.save_every < 0) return Status::Error("--save-every " + std::to_string(f.save_every) + " must not be negative");
  if (f.keep < 1) return Status::Error("--keep " + std::to_string(f.keep) + " must be at least 1");
  if (f.dir.empty() && (f.resume || f.save_every > 0))
    return Status::Error(std::string(f.resume ? "--resume" : "--save-every") + " needs --checkpoint-dir");
  if (f.on_nan != "stop" && f.on_nan != "skip")
    return Status::Error("--on-nan '" + f.on_nan + "': expected stop or skip");
  if (f.format != "auto" && f.format != "whole" && f.format != "sharded")
    return Status::Error("--ckpt-format '" + f.format + "': expected whole, sharded or auto");
  return Status::Ok();
}

void ResolveCheckpointFormat(CheckpointFlags* f, bool several_processes) {
  if (f->format == "auto") f->format = several_processes ? "sharded" : "whole";
}

std::map<std::string, double> OptimizerSettings(const rt::OptimizerConfig& o) {
  return {{"lr", o.lr},         {"min_lr", o.min_lr},
          {"warmup_steps", o.warmup_steps}, {"decay_steps", o.decay_steps},
          {"beta1", o.beta1},   {"beta2", o.beta2},
          {"eps", o.eps},       {"weight_decay", o.weight_decay},
          {"clip_grad", o.clip_grad}};
}

Result<rt::OptimizerConfig> OptimizerFromSettings(const std::map<std::string, double>& s,
                                                  const std::string& file) {
  rt::OptimizerConfig o;
  for (const auto& [key, value] : OptimizerSettings(o))
    if (!s.count(key)) return Status::Error(file + ": no optimizer setting '" + key + "'");
  for (const auto& [key, value] : s)
    if (!OptimizerSettings(o).count(key))
      return Status::Error(file + ": unknown optimizer setting '" + key + "'");
  const double warmup = s.at("warmup_steps"), decay = s.at("decay_steps");
  if (warmup < 0 || warmup > 1e9 || warmup != int(warmup) || decay < 0 || decay > 1e9 ||
      decay != int(decay))
    return Status::Error(file + ": warmup_steps and decay_steps must be whole numbers");
  o.lr = s.at("lr");
  o.min_lr = s.at("min_lr");
  o.warmup_steps = int(warmup);
  o.decay_steps = int(decay);
  o.beta1 = s.at("beta1");
  o.beta2 = s.at("beta2");
  o.eps = s.at("eps");
  o.weight_decay = s.at("weight_decay");
  o.clip_grad = s.at("clip_grad");
  PTDP_RETURN_IF_ERROR(rt::ValidateOptimizer(o, file));  // a crafted file: no negative min_lr
  return o;
}

Result<CheckpointFolder> PrepareCheckpoints(const CheckpointFlags& f, bool owner) {
  CheckpointFolder folder;
  if (f.dir.empty()) return folder;
  if (owner) {
    PTDP_RETURN_IF_ERROR(CheckWritableFolder("--checkpoint-dir", f.dir));
    auto lock = rt::CheckpointFolderLock::Acquire(f.dir);
    if (!lock.ok()) return Status::Error("--checkpoint-dir " + lock.status().message());
    folder.lock = std::move(lock).value();
    PTDP_ASSIGN_OR_RETURN(std::vector<std::string> removed, rt::RemoveIncompleteCheckpoints(f.dir));
    for (const std::string& r : removed)
      std::printf("removed %s: a checkpoint write that never finished\n", r.c_str());
  }
  if (!f.resume) return folder;
  std::error_code exists_ec;
  if (!owner && !std::filesystem::exists(f.dir, exists_ec)) return folder;  // the owner makes it
  PTDP_ASSIGN_OR_RETURN(std::vector<std::string> all, rt::ListCheckpoints(f.dir));
  if (all.empty()) {
    std::printf("no checkpoint in %s: starting from step 0\n", f.dir.c_str());
    return folder;
  }
  const Clock::time_point t0 = Clock::now();
  auto sharded = rt::IsShardedCheckpoint(all.back());
  if (!sharded.ok()) return sharded.status();
  // A sharded checkpoint: only its manifest now (no tensor wanted), the tensors in LoadShards.
  const rt::TensorFilter nothing = [](const std::string&) { return false; };
  auto ckpt = rt::ReadCheckpoint(all.back(), *sharded ? nothing : rt::TensorFilter());
  if (!ckpt.ok())
    return Status::Error(ckpt.status().message() +
                         " (cannot resume; move the file away to resume from an older checkpoint)");
  if (*sharded)
    std::printf("found %s: step %lld, written by %s, in %d shard%s\n", all.back().c_str(),
                static_cast<long long>(ckpt->state.step), ckpt->layout.c_str(), ckpt->shards,
                ckpt->shards == 1 ? "" : "s");
  else
    std::printf("loaded %s: step %lld, written by %s (%.1f MB in %.2f s)\n", all.back().c_str(),
                static_cast<long long>(ckpt->state.step), ckpt->layout.c_str(),
                double(ckpt->read_bytes) / 1e6, Since(t0));
  folder.resume = ResumePoint{all.back(), std::move(ckpt).value(), *sharded};
  return folder;
}

Status LoadShards(ResumePoint* from, const rt::Trainer& trainer) {
  if (!from->tensors_pending) return Status::Ok();
  const Clock::time_point t0 = Clock::now();
  const std::set<std::string> needed = trainer.LocalStateTensors();
  auto ckpt = rt::ReadCheckpoint(
      from->path, [&](const std::string& name) { return needed.count(name) > 0; });
  if (!ckpt.ok())
    return Status::Error(ckpt.status().message() +
                         " (cannot resume; move the file away to resume from an older checkpoint)");
  if (ckpt->state.step != from->ckpt.state.step)  // the folder is locked: cannot happen
    return Status::Error(from->path + ": changed while this run resumed from it");
  std::printf("loaded %s: %d of its %d shards, the tensors of this process's ranks (%.1f MB in "
              "%.2f s)\n", from->path.c_str(), ckpt->read_shards, ckpt->shards,
              double(ckpt->read_bytes) / 1e6, Since(t0));
  from->ckpt.state.tensors = std::move(ckpt->state.tensors);
  from->tensors_pending = false;
  return Status::Ok();
}

Status ApplyCheckpoint(const ResumePoint& from, rt::TrainerConfig* cfg) {
  const rt::Checkpoint& c = from.ckpt;
  ModelSpec a = c.model, b = cfg->model;
  a.name = b.name = "";  // the name is free text
  if (ModelToYaml(a, "") != ModelToYaml(b, ""))
    return Status::Error(from.path + ": holds a different model than the plan's:\n" +
                         ModelToYaml(c.model, "  ") + "plan:\n" + ModelToYaml(cfg->model, "  "));
  if (c.global_batch != cfg->layout.global_batch)
    return Status::Error(from.path + ": written with global batch " +
                         std::to_string(c.global_batch) + ", the plan has " +
                         std::to_string(cfg->layout.global_batch) +
                         " (the data position counts sequences of that batch)");
  PTDP_ASSIGN_OR_RETURN(rt::OptimizerConfig o, OptimizerFromSettings(c.optimizer, from.path));
  if (OptimizerSettings(o) != OptimizerSettings(cfg->optimizer))
    std::printf("using the checkpoint's optimizer settings (lr %g, warmup %d, decay over %d "
                "steps), not the flags'\n", o.lr, o.warmup_steps, o.decay_steps);
  if (c.seed != cfg->seed)
    std::printf("using the checkpoint's seed %llu for the data order, not %llu\n",
                static_cast<unsigned long long>(c.seed), static_cast<unsigned long long>(cfg->seed));
  if (c.layout != cfg->layout.ShortName())
    std::printf("resharding: the checkpoint was written by %s, this run is %s\n", c.layout.c_str(),
                cfg->layout.ShortName().c_str());
  cfg->optimizer = o;
  cfg->seed = c.seed;
  return Status::Ok();
}

Status SaveCheckpoint(const CheckpointFlags& f, rt::Trainer& trainer, const rt::TrainerConfig& cfg,
                      bool owner) {
  const Clock::time_point t0 = Clock::now();
  rt::Checkpoint c;
  c.model = cfg.model;
  c.seed = cfg.seed;
  c.global_batch = cfg.layout.global_batch;
  c.layout = cfg.layout.ShortName();
  c.optimizer = OptimizerSettings(cfg.optimizer);
  const int64_t step = trainer.steps_done();
  const std::string path = f.dir + "/" + rt::CheckpointFileName(step);
  rt::PartialWriteHook hook;
  const char* pause = std::getenv("PTDP_TEST_PAUSE_CHECKPOINT_WRITE");
  if (pause && std::to_string(step) == pause)
    hook = [](const std::string& tmp) {
      std::fprintf(stderr, "checkpoint write paused: %s\n", tmp.c_str());
      std::fflush(stderr);
      std::this_thread::sleep_for(std::chrono::minutes(10));
    };
  double mb = 0;
  std::string shards;
  std::vector<std::string> pruned;
  if (f.format == "sharded") {
    // Process 0 holds the folder's lock file; the others must see it (one shared folder).
    const std::string lock = owner ? "" : f.dir + "/" + rt::kCheckpointLockName;
    PTDP_ASSIGN_OR_RETURN(rt::SavedCheckpoint saved,
                          rt::SaveShardedCheckpoint(trainer, c, {.dir = f.dir, .owner = owner,
                                                                 .keep = f.keep, .hook = hook,
                                                                 .must_see = lock}));
    mb = double(saved.bytes) / 1e6;
    shards = ", " + std::to_string(saved.shards) + (saved.shards == 1 ? " shard" : " shards");
    pruned = saved.pruned;
  } else {
    assert(f.format == "whole");
    PTDP_ASSIGN_OR_RETURN(c.state, trainer.ExportState());  // every process: a collective
    Status st = owner ? rt::WriteCheckpoint(path, c, hook) : Status::Ok();
    if (owner && st.ok()) {
      auto p = rt::PruneCheckpoints(f.dir, f.keep);
      st = p.status();
      if (p.ok()) pruned = *p;
    }
    PTDP_RETURN_IF_ERROR(rt::AgreeAcrossProcesses(
        trainer, st, "saving checkpoint step " + std::to_string(step)));
    std::error_code ec;
    const uintmax_t bytes = std::filesystem::file_size(path, ec);
    mb = ec ? 0.0 : double(bytes) / 1e6;
  }
  std::printf("saved %s (%.1f MB%s in %.2f s)%s\n", path.c_str(), mb, shards.c_str(), Since(t0),
              pruned.empty() ? "" : (", deleted " + std::to_string(pruned.size()) + " older").c_str());
  std::fflush(stdout);
  return Status::Ok();
}

}  // namespace ptdp::cli
