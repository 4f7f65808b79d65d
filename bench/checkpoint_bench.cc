// Checkpoint save and load time of `ptdp train --checkpoint-dir` for gpt-tiny and GPT-3 350M
// (configs/models), one CPU rank: save = Trainer::ExportState + WriteCheckpoint (CRC32C,
// fsync, rename); load = ReadCheckpoint (verifying the CRC32C) + Trainer::ImportState, from
// disk ("cold": the file's pages are dropped from the page cache first) and from the page
// cache ("warm"); and the same as a sharded checkpoint of the one process (SaveSharded: shard +
// manifest + the exchanges; LoadShardedCold: the manifest and its shard read back into whole
// tensors, + ImportState). Figures go to docs/reliability.md; GB/s = file bytes / time.
// The 350M cases write a 4.3 GB file and need ~11 GB of memory: they run only with
// PTDP_BENCH_CHECKPOINT_350M=1. Files go to $PTDP_BENCH_DIR (default /tmp) and are deleted.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/shipped.h"
#include "runtime/checkpoint.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/thread_communicator.h"
#include "runtime/data.h"
#include "runtime/sharded_checkpoint.h"
#include "runtime/trainer.h"

namespace {

using namespace ptdp;

const rt::TokenCorpus& Corpus() {
  static rt::TokenCorpus c = [] {
    auto r = rt::LoadCorpus(bench::Shipped("data/tinyshakespeare/input.txt"), 0.1, 2049);
    if (!r.ok()) { std::fprintf(stderr, "checkpoint_bench: %s\n", r.status().message().c_str()); std::exit(1); }
    return *r;
  }();
  return c;
}

// One trainer per model, built once (the 350M one takes ~20 s to initialise).
struct Bench {
  rt::TrainerConfig cfg;
  std::unique_ptr<rt::ThreadWorld> world;
  std::unique_ptr<rt::Trainer> trainer;
  std::string path;
  std::string sharded;  // the manifest SaveSharded wrote
};

Bench& Get(const std::string& model_file) {
  static std::map<std::string, std::unique_ptr<Bench>> all;
  auto& b = all[model_file];
  if (b) return *b;
  b = std::make_unique<Bench>();
  auto m = LoadModelFile(bench::Shipped("configs/models/" + model_file));
  if (!m.ok()) { std::fprintf(stderr, "checkpoint_bench: %s\n", m.status().message().c_str()); std::exit(1); }
  b->cfg.model = *m;
  b->cfg.layout.global_batch = 1;
  b->cfg.layout.precision = Precision::kFp32;
  b->cfg.train_tokens = &Corpus().train;
  b->world = std::make_unique<rt::ThreadWorld>(1, 60);
  auto tr = rt::Trainer::Create(b->cfg, [](int) { return std::make_unique<rt::CpuBackend>(); }, *b->world);
  if (!tr.ok()) { std::fprintf(stderr, "checkpoint_bench: %s\n", tr.status().message().c_str()); std::exit(1); }
  b->trainer = std::move(tr).value();
  const char* dir = std::getenv("PTDP_BENCH_DIR");
  b->path = std::string(dir ? dir : "/tmp") + "/ptdp-checkpoint-bench-" + m->name + ".ckpt";
  return *b;
}

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Seconds spent in the two halves of a save or a load, summed over iterations.
struct Split {
  double trainer_s = 0;  // ExportState / ImportState
  double file_s = 0;     // WriteCheckpoint / ReadCheckpoint
};

Status Save(Bench& b, Split* split) {
  rt::Checkpoint c;
  c.model = b.cfg.model;
  c.global_batch = b.cfg.layout.global_batch;
  c.layout = b.cfg.layout.ShortName();
  Clock::time_point t0 = Clock::now();
  PTDP_ASSIGN_OR_RETURN(c.state, b.trainer->ExportState());
  split->trainer_s += Since(t0);
  t0 = Clock::now();
  Status st = rt::WriteCheckpoint(b.path, c);
  split->file_s += Since(t0);
  return st;
}

// The same state as a sharded checkpoint of the one process (runtime/sharded_checkpoint.h):
// ExportShard + the shard file, the manifest, and the two exchanges over WORLD.
Status SaveSharded(Bench& b, Split* split) {
  rt::Checkpoint c;
  c.model = b.cfg.model;
  c.global_batch = b.cfg.layout.global_batch;
  c.layout = b.cfg.layout.ShortName();
  const Clock::time_point t0 = Clock::now();
  const std::string dir = std::filesystem::path(b.path).parent_path().string();
  rt::ShardedSave how;
  how.dir = dir;
  PTDP_ASSIGN_OR_RETURN(rt::SavedCheckpoint saved, rt::SaveShardedCheckpoint(*b.trainer, c, how));
  split->file_s += Since(t0);
  b.sharded = saved.path;
  return Status::Ok();
}

Status Load(Bench& b, Split* split) {
  Clock::time_point t0 = Clock::now();
  PTDP_ASSIGN_OR_RETURN(rt::Checkpoint c, rt::ReadCheckpoint(b.sharded.empty() ? b.path : b.sharded));
  split->file_s += Since(t0);
  t0 = Clock::now();
  Status st = b.trainer->ImportState(c.state);
  split->trainer_s += Since(t0);
  return st;
}

// Evicts the file from the page cache (its pages are clean after the fsync).
void DropCache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void SetBytes(benchmark::State& state, const Bench& b, const Split& split) {
  const double bytes = double(std::filesystem::file_size(b.path));
  const double n = double(std::max<int64_t>(state.iterations(), 1));
  state.counters["file_MB"] = bytes / 1e6;
  state.counters["trainer_s"] = split.trainer_s / n;  // export or import
  state.counters["file_s"] = split.file_s / n;        // write (fsync) or read (verify)
  state.counters["GB/s"] = benchmark::Counter(bytes * double(state.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);
}

void BM_Save(benchmark::State& state, const std::string& model_file) {
  Bench& b = Get(model_file);
  Split split;
  for (auto _ : state)
    if (Status st = Save(b, &split); !st.ok()) { state.SkipWithError(st.message().c_str()); return; }
  SetBytes(state, b, split);
}

// The sharded checkpoint's files: the manifest and the shards beside it.
std::vector<std::string> ShardedFiles(const Bench& b) {
  std::vector<std::string> files = {b.sharded};
  const std::string stem = std::filesystem::path(b.sharded).stem().string();  // step-NNNNNNNN
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(b.sharded).parent_path()))
    if (e.path().filename().string().rfind(stem + ".rank", 0) == 0) files.push_back(e.path().string());
  return files;
}

void BM_SaveSharded(benchmark::State& state, const std::string& model_file) {
  Bench& b = Get(model_file);
  Split split;
  for (auto _ : state)
    if (Status st = SaveSharded(b, &split); !st.ok()) { state.SkipWithError(st.message().c_str()); return; }
  double bytes = 0;
  for (const std::string& f : ShardedFiles(b)) bytes += double(std::filesystem::file_size(f));
  state.counters["file_MB"] = bytes / 1e6;
  state.counters["GB/s"] = benchmark::Counter(bytes * double(state.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);
}

void BM_Load(benchmark::State& state, const std::string& model_file, bool cold, bool sharded) {
  Bench& b = Get(model_file);
  Split unused, split;
  b.sharded.clear();
  Status saved = sharded ? SaveSharded(b, &unused) : Save(b, &unused);
  if (!saved.ok()) { state.SkipWithError(saved.message().c_str()); return; }
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      if (sharded)
        for (const std::string& f : ShardedFiles(b)) DropCache(f);
      else
        DropCache(b.path);
      state.ResumeTiming();
    }
    if (Status st = Load(b, &split); !st.ok()) { state.SkipWithError(st.message().c_str()); return; }
  }
  if (sharded) {
    const double n = double(std::max<int64_t>(state.iterations(), 1));
    double bytes = 0;
    for (const std::string& f : ShardedFiles(b)) bytes += double(std::filesystem::file_size(f));
    state.counters["file_MB"] = bytes / 1e6;
    state.counters["trainer_s"] = split.trainer_s / n;
    state.counters["file_s"] = split.file_s / n;
    state.counters["GB/s"] = benchmark::Counter(bytes * double(state.iterations()) / 1e9,
                                                benchmark::Counter::kIsRate);
    for (const std::string& f : ShardedFiles(b)) std::filesystem::remove(f);
    b.sharded.clear();
    return;
  }
  SetBytes(state, b, split);
  std::filesystem::remove(b.path);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> models = {"gpt-tiny.yaml"};
  const char* big = std::getenv("PTDP_BENCH_CHECKPOINT_350M");
  if (big && std::string(big) == "1") models.push_back("gpt3-350m.yaml");
  for (const std::string& m : models) {
    const std::string name = m.substr(0, m.size() - 5);
    auto* save = benchmark::RegisterBenchmark(("BM_CheckpointSave/" + name).c_str(), BM_Save, m);
    auto* cold = benchmark::RegisterBenchmark(("BM_CheckpointLoadCold/" + name).c_str(), BM_Load, m, true, false);
    auto* warm = benchmark::RegisterBenchmark(("BM_CheckpointLoadWarm/" + name).c_str(), BM_Load, m, false, false);
    auto* ssave = benchmark::RegisterBenchmark(("BM_CheckpointSaveSharded/" + name).c_str(), BM_SaveSharded, m);
    auto* scold = benchmark::RegisterBenchmark(("BM_CheckpointLoadShardedCold/" + name).c_str(), BM_Load, m, true, true);
    for (auto* b : {save, cold, warm, ssave, scold}) {
      b->UseRealTime()->Unit(benchmark::kMillisecond);
      if (name != "gpt-tiny") b->Iterations(3);
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
