// `ptdp checkpoint`: verifies a checkpoint (a whole file, or a sharded one's manifest with every
// shard) as `ptdp train --resume` would read it, says what it holds, and with --to writes it as
// one whole-tensor file (a multi-process run's sharded checkpoint for one machine, a tool, or
// an archive). File formats: runtime/checkpoint.h.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "runtime/checkpoint.h"

namespace ptdp::cli {
namespace {

struct CheckpointCmdFlags {
  std::string path;  // a checkpoint file, a manifest, or a checkpoint folder (its newest)
  std::string to;    // write a whole-tensor copy here
  bool json = false;
};

// The newest checkpoint of a folder, or `path` itself.
Result<std::string> Resolve(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return path;
  PTDP_ASSIGN_OR_RETURN(std::vector<std::string> all, rt::ListCheckpoints(path));
  if (all.empty()) return Status::Error(path + ": no checkpoint (step-NNNNNNNN.ckpt) in this folder");
  return all.back();
}

int RunCheckpoint(const CheckpointCmdFlags& f) {
  auto path = Resolve(f.path);
  if (!path.ok()) return Fail(path.status().message());
  if (!f.to.empty()) {
    if (Status st = CheckWritableFile("--to", f.to); !st.ok()) return Fail(st.message());
    std::error_code ec;
    if (std::filesystem::equivalent(f.to, *path, ec))
      return Fail("--to " + f.to + " is the checkpoint being read");
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto c = rt::ReadCheckpoint(*path);
  if (!c.ok()) return Fail(c.status().message());
  const double read_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t elements = 0, params = 0;  // params: "param/" tensors (the moments add twice that)
  for (const rt::NamedTensor& t : c->state.tensors) {
    elements += int64_t(t.data.size());
    if (t.name.rfind("param/", 0) == 0) params += int64_t(t.data.size());
  }
  nlohmann::json j = {{"path", *path},
                      {"format", c->shards > 0 ? "sharded" : "whole"},
                      {"shards", c->shards},
                      {"bytes", c->read_bytes},
                      {"step", c->state.step},
                      {"optimizer_steps", c->state.optimizer_steps},
                      {"consumed_samples", c->state.consumed_samples},
                      {"seed", c->seed},
                      {"global_batch", c->global_batch},
                      {"layout", c->layout},
                      {"model", c->model.name},
                      {"tensors", c->state.tensors.size()},
                      {"elements", elements},
                      {"parameters", params},
                      {"optimizer", c->optimizer},
                      {"verified", true},
                      {"read_s", read_s},
                      {"written_to", nullptr}};
  if (!f.to.empty()) {
    if (Status st = rt::WriteCheckpoint(f.to, *c); !st.ok()) return Fail(st.message());
    j["written_to"] = f.to;
  }
  if (f.json) {
    std::cout << DumpJson(j) << "\n";
    return 0;
  }
  std::printf("%s: verified (%s, %.1f MB read in %.2f s)\n", path->c_str(),
              c->shards > 0 ? ("sharded: the manifest and " + std::to_string(c->shards) +
                               (c->shards == 1 ? " shard" : " shards")).c_str()
                            : "one whole-tensor file",
              double(c->read_bytes) / 1e6, read_s);
  std::printf("step %lld (%lld optimizer updates, %lld samples consumed), seed %llu, global "
              "batch %lld\n",
              static_cast<long long>(c->state.step),
              static_cast<long long>(c->state.optimizer_steps),
              static_cast<long long>(c->state.consumed_samples),
              static_cast<unsigned long long>(c->seed), static_cast<long long>(c->global_batch));
  std::printf("model %s, written by %s: %zu tensors, %lld parameters (with AdamW's m and v: %lld "
              "elements)\n",
              c->model.name.c_str(), c->layout.c_str(), c->state.tensors.size(),
              static_cast<long long>(params), static_cast<long long>(elements));
  if (!f.to.empty()) std::printf("wrote %s (one whole-tensor file)\n", f.to.c_str());
  return 0;
}

}  // namespace

Runner SetupCheckpoint(CLI::App* sub) {
  auto f = std::make_shared<CheckpointCmdFlags>();
  sub->add_option("path", f->path,
                  "a checkpoint: step-NNNNNNNN.ckpt (a whole file or a sharded manifest), or a "
                  "--checkpoint-dir folder (its newest)")
      ->required();
  sub->add_option("--to", f->to,
                  "also write it as one whole-tensor file (e.g. a sharded checkpoint for one "
                  "machine); any layout resumes either");
  sub->add_flag("--json", f->json, "machine-readable output");
  return [f] { return RunCheckpoint(*f); };
}

}  // namespace ptdp::cli
