// `ptdp train plan.yaml --backend cpu`: trains the plan's GPT with exactly its layout (ranks as
// threads on the CPU backend), prints a progress line per step and writes measured.json.
//
// Exit codes: 0 every step done; 1 an error (one line "ptdp: ..." on stderr; bad flags are found
// before training starts, unwritable folders included); 2 bad usage; 128 + the signal number
// (143 SIGTERM, 130 SIGINT, 129 SIGHUP, as a shell reports a process killed by it) when a
// signal stopped the run: it stopped at a step boundary, saved a checkpoint (with
// --checkpoint-dir), wrote measured.json for the steps done and printed one line saying so.
// A second signal ends the process at once.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/launch.h"
#include "cli/speed_probe.h"
#include "cli/train_checkpoint.h"
#include "core/units.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/thread_communicator.h"
#include "runtime/data.h"
#include "runtime/trainer.h"

namespace ptdp::cli {
namespace {

struct TrainFlags {
  std::string plan_file;
  std::string backend = "cpu";
  int steps = 10;
  uint64_t seed = 1234;
  std::string out;
  std::string corpus;  // default: the shipped tinyshakespeare (share/ptdp/data)
  double lr = 1e-3;
  int warmup = 2;
  int eval_windows = 16;
  int max_ranks = 64;
  double timeout_s = 120;
  bool one_gpu = false;
  bool fp32_activations = false;  // --fp32-activations
  int timing_warmup = 1;  // steps left out of the timing medians
  bool no_speed_probe = false;  // --no-speed-probe
  CheckpointFlags ckpt;
};

// The timeline of at most this many timed steps is kept (the median one is written).
constexpr size_t kTimelineSteps = 32;

// --timeout's upper bound: a week. The communicators turn it into a deadline in nanoseconds,
// where 1e300 s would overflow, and no collective of a healthy run waits that long.
constexpr double kMaxTimeoutS = 7 * 24 * 3600.0;

// ---- Stopping on a signal: SIGTERM (a scheduler ending the job), SIGINT (Ctrl-C), SIGHUP (the
// terminal closed). The first asks the run to stop at the next step boundary; every rank polls
// the flag at the end of its step (TrainerConfig::stop_requested) and the job's answer travels
// with the step reports, so every process stops after the same step and none is left waiting in
// a collective. The handler then restores the default action: a second signal ends the process
// at once. A signal ignored when ptdp starts (SIGHUP under nohup) stays ignored.

constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGHUP};
std::atomic<int> g_stop_signal{0};  // the first stop signal received; 0 before
static_assert(std::atomic<int>::is_always_lock_free, "set in a signal handler");
volatile std::sig_atomic_t g_installed[3] = {0, 0, 0};  // by index into kStopSignals

const char* SignalName(int signo) {
  switch (signo) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
    default: return "a signal";
  }
}

// Async-signal-safe: an atomic store, signal() and write() only; errno kept.
extern "C" void OnStopSignal(int signo) {
  const int saved_errno = errno;
  int none = 0;
  g_stop_signal.compare_exchange_strong(none, signo);
  for (int i = 0; i < 3; ++i)
    if (g_installed[i]) ::signal(kStopSignals[i], SIG_DFL);
#define PTDP_STOP_LINE(name) \
  "ptdp: " name " received: stopping after this step; another signal stops at once\n"
  static const char kTerm[] = PTDP_STOP_LINE("SIGTERM");
  static const char kInt[] = PTDP_STOP_LINE("SIGINT");
  static const char kHup[] = PTDP_STOP_LINE("SIGHUP");
#undef PTDP_STOP_LINE
  const char* msg = signo == SIGTERM ? kTerm : signo == SIGINT ? kInt : kHup;
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, msg, std::strlen(msg));
  errno = saved_errno;
}

// Installs OnStopSignal for the run; the previous actions come back when it ends.
class StopOnSignals {
 public:
  StopOnSignals() {
    g_stop_signal = 0;
    for (int i = 0; i < 3; ++i) {
      struct sigaction now{};
      if (::sigaction(kStopSignals[i], nullptr, &old_[i]) != 0 || old_[i].sa_handler == SIG_IGN)
        continue;
      now.sa_handler = OnStopSignal;
      now.sa_flags = SA_RESTART;
      sigemptyset(&now.sa_mask);
      for (int s : kStopSignals) sigaddset(&now.sa_mask, s);
      g_installed[i] = 1;
      if (::sigaction(kStopSignals[i], &now, nullptr) != 0) g_installed[i] = 0;
    }
  }
  ~StopOnSignals() {
    for (int i = 0; i < 3; ++i)
      if (g_installed[i]) {
        g_installed[i] = 0;
        ::sigaction(kStopSignals[i], &old_[i], nullptr);
      }
  }
  StopOnSignals(const StopOnSignals&) = delete;
  StopOnSignals& operator=(const StopOnSignals&) = delete;

 private:
  struct sigaction old_[3] = {};
};

// What this machine is, for measured.json.
nlohmann::json MachineJson(const std::string& backend) {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  std::string cpu;
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);)
    if (line.rfind("model name", 0) == 0) { cpu = line.substr(line.find(':') + 2); break; }
  return {{"hostname", host}, {"cpu", cpu}, {"cores", std::thread::hardware_concurrency()},
          {"backend", backend}};
}

nlohmann::json StepJson(const rt::StepResult& s) {
  nlohmann::json j = {{"step", s.step}, {"loss", s.loss}, {"grad_norm", s.grad_norm},
                      {"lr", s.lr}, {"skipped", s.skipped}, {"step_time_s", s.step_time_s},
                      {"tokens_per_s", s.tokens_per_s}};
  double load = 0;  // MoE: the step's largest measured expert load over the ranks
  for (const rt::RankTimes& r : s.ranks) load = std::max(load, r.expert_load);
  if (load > 0) j["expert_load"] = load;
  return j;
}

// Mean per-rank times over the steps after the first (which pays for warm-up), or over all
// steps when there is only one.
nlohmann::json RanksJson(const std::vector<rt::StepResult>& steps) {
  const size_t first = steps.size() > 1 ? 1 : 0;
  const size_t n = steps.size() - first;
  nlohmann::json ranks = nlohmann::json::array();
  for (size_t r = 0; r < steps[0].ranks.size(); ++r) {
    rt::RankTimes sum;
    double peak = 0;
    for (size_t i = first; i < steps.size(); ++i) {
      const rt::RankTimes& t = steps[i].ranks[r];
      sum.forward_s += t.forward_s; sum.backward_s += t.backward_s; sum.tp_comm_s += t.tp_comm_s;
      sum.pp_wait_s += t.pp_wait_s; sum.dp_comm_s += t.dp_comm_s;
      sum.optimizer_s += t.optimizer_s; sum.idle_s += t.idle_s;
    }
    for (const auto& s : steps) peak = std::max(peak, s.ranks[r].peak_memory_bytes);
    ranks.push_back({{"rank", r}, {"forward_s", sum.forward_s / n}, {"backward_s", sum.backward_s / n},
                     {"tp_comm_s", sum.tp_comm_s / n}, {"pp_wait_s", sum.pp_wait_s / n},
                     {"dp_comm_s", sum.dp_comm_s / n}, {"optimizer_s", sum.optimizer_s / n},
                     {"idle_s", sum.idle_s / n}, {"peak_memory_bytes", peak}});
  }
  return ranks;
}

// Throughput of the run: the median step after the first (which pays for warm-up), model FLOPs
// as the cost model counts them (Korthikanti et al. 2022: no recompute), and MFU against the
// peak of the plan's cluster GPU at the plan's precision, on the devices the run used (one GPU
// shared by every rank counts once; the CPU backend counts each rank slot).
nlohmann::json SummaryJson(const Plan& plan, const std::vector<rt::StepResult>& steps, int devices) {
  std::vector<double> t;
  for (size_t i = steps.size() > 1 ? 1 : 0; i < steps.size(); ++i) t.push_back(steps[i].step_time_s);
  std::sort(t.begin(), t.end());
  const double median_s = t[t.size() / 2];
  double peak_bytes = 0;
  for (const auto& s : steps)
    for (const auto& r : s.ranks) peak_bytes = std::max(peak_bytes, r.peak_memory_bytes);
  const double tokens = double(plan.layout.global_batch) * double(plan.model.seq_len);
  nlohmann::json j = {{"median_step_time_s", median_s}, {"tokens_per_s", tokens / median_s},
                      {"peak_memory_bytes", peak_bytes}, {"devices", devices}};
  auto w = WorldForPlan(plan, "");
  if (!w.ok()) return j;  // MFU needs the plan's cluster; the rest stands without it
  const double flops = w->cost->ModelFlops(plan.layout);
  const int n = devices > 0 ? devices : plan.layout.world();
  const double per_device = flops / median_s / n;
  j["model_flops_per_step"] = flops;
  j["model_tflops_per_s_per_device"] = per_device / 1e12;
  j["mfu"] = per_device / w->cost->PeakFlops(plan.layout.precision);
  j["mfu_against"] = w->cluster.name + " " + w->cluster.gpu.name;
  return j;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The steps the timing figures use: after the warm-up ones, or all when there are no others.
size_t FirstTimed(const std::vector<rt::StepResult>& steps, int warmup) {
  return steps.size() > size_t(warmup) ? size_t(warmup) : 0;
}

// Medians over the timed steps: the step time and each rank's parts (each part's own median).
nlohmann::json TimingJson(const std::vector<rt::StepResult>& steps, int warmup,
                          double other_cpu_share) {
  const size_t first = FirstTimed(steps, warmup);
  std::vector<double> step_times;
  for (size_t i = first; i < steps.size(); ++i) step_times.push_back(steps[i].step_time_s);
  using Field = double rt::RankTimes::*;
  const std::pair<const char*, Field> fields[] = {
      {"forward_s", &rt::RankTimes::forward_s},     {"backward_s", &rt::RankTimes::backward_s},
      {"tp_comm_s", &rt::RankTimes::tp_comm_s},     {"pp_wait_s", &rt::RankTimes::pp_wait_s},
      {"dp_comm_s", &rt::RankTimes::dp_comm_s},     {"optimizer_s", &rt::RankTimes::optimizer_s},
      {"idle_s", &rt::RankTimes::idle_s}, {"peak_memory_bytes", &rt::RankTimes::peak_memory_bytes}};
  nlohmann::json ranks = nlohmann::json::array();
  for (size_t r = 0; r < steps[0].ranks.size(); ++r) {
    nlohmann::json j = {{"rank", r}};
    for (const auto& [name, field] : fields) {
      std::vector<double> v;
      for (size_t i = first; i < steps.size(); ++i) v.push_back(steps[i].ranks[r].*field);
      j[name] = Median(v);
    }
    // MoE: the measured expert load (RankTimes::expert_load), on ranks with MoE layers.
    std::vector<double> load;
    for (size_t i = first; i < steps.size(); ++i) load.push_back(steps[i].ranks[r].expert_load);
    if (Median(load) > 0) j["expert_load"] = Median(load);
    ranks.push_back(j);
  }
  return {{"warmup_steps", first}, {"timed_steps", step_times.size()},
          {"step_time_median_s", Median(step_times)},
          {"step_time_min_s", *std::min_element(step_times.begin(), step_times.end())},
          {"step_time_max_s", *std::max_element(step_times.begin(), step_times.end())},
          {"other_cpu_share", other_cpu_share >= 0 ? nlohmann::json(other_cpu_share) : nullptr},
          {"ranks", ranks}};
}

// Every rank's events of the timed step (among those that kept their timeline) whose time is
// the median.
nlohmann::json TimelineJson(const std::vector<rt::StepResult>& steps, int warmup) {
  std::vector<size_t> kept;
  for (size_t i = FirstTimed(steps, warmup); i < steps.size(); ++i)
    if (!steps[i].ranks.empty() && !steps[i].ranks[0].events.empty()) kept.push_back(i);
  if (kept.empty()) return nullptr;
  std::sort(kept.begin(), kept.end(),
            [&](size_t a, size_t b) { return steps[a].step_time_s < steps[b].step_time_s; });
  const rt::StepResult& s = steps[kept[(kept.size() - 1) / 2]];
  nlohmann::json ranks = nlohmann::json::array();
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    nlohmann::json events = nlohmann::json::array();
    for (const rt::StepEvent& e : s.ranks[r].events)
      events.push_back({{"kind", rt::ToString(e.kind)}, {"microbatch", e.microbatch},
                        {"chunk", e.chunk}, {"start_s", e.start_s}, {"end_s", e.end_s}});
    ranks.push_back({{"rank", r}, {"events", events}});
  }
  return {{"step", s.step}, {"step_time_s", s.step_time_s}, {"ranks", ranks}};
}

// The one line a run stopped by `signo` ends with (on stderr, as errors are).
std::string StoppedLine(int signo, bool here, int64_t done, int steps, const std::string& saved) {
  std::string line = std::string("ptdp: ") + SignalName(signo) + (here ? "" : " (in another process)");
  if (done >= steps)
    return line + ": received after the last step; the run is complete (exit " +
           std::to_string(128 + signo) + ")";
  line += ": stopped after step " + std::to_string(done) + " of " + std::to_string(steps);
  line += saved.empty() ? " (no --checkpoint-dir: no checkpoint saved)"
                        : "; saved " + saved + ", --resume continues from it";
  return line + " (exit " + std::to_string(128 + signo) + ")";
}

int RunTrain(const TrainFlags& f) {
  if (f.backend != "cpu" && f.backend != "cuda")
    return Fail("--backend '" + f.backend + "': expected cpu or cuda");
  if (f.steps <= 0 || f.steps > 1000000) return Fail("--steps " + std::to_string(f.steps) + " must be in 1..1000000");
  if (!(f.lr > 0 && f.lr < 1)) return Fail("--lr " + std::to_string(f.lr) + " must be in (0, 1)");
  if (f.warmup < 0) return Fail("--warmup must not be negative");
  if (f.timing_warmup < 0) return Fail("--timing-warmup must not be negative");
  if (!(std::isfinite(f.timeout_s) && f.timeout_s > 0 && f.timeout_s <= kMaxTimeoutS)) {
    char v[64];
    std::snprintf(v, sizeof v, "%g", f.timeout_s);
    return Fail(std::string("--timeout ") + v + ": must be a number of seconds above 0 and at "
                "most 604800 (7 days)");
  }
  if (Status st = CheckCheckpointFlags(f.ckpt); !st.ok()) return Fail(st.message());
  if (!f.out.empty())
    if (Status st = CheckWritableFile("--out", f.out); !st.ok()) return Fail(st.message());
  auto plan = LoadPlanFile(f.plan_file);
  if (!plan.ok()) return Fail(plan.status().message());
  const Layout& l = plan->layout;
  if (l.world() > f.max_ranks)
    return Fail(f.plan_file + ": " + std::to_string(l.world()) + " ranks is more than --max-ranks " +
                std::to_string(f.max_ranks) + " threads");
  auto corpus_file = f.corpus.empty() ? ShippedData("tinyshakespeare/input.txt")
                                      : Result<std::string>(f.corpus);
  if (!corpus_file.ok()) return Fail(corpus_file.status().message());
  auto corpus = rt::LoadCorpus(*corpus_file, 0.1, plan->model.seq_len + 1);
  if (!corpus.ok()) return Fail(corpus.status().message());
  // Byte ids 0..255 must be valid tokens; a larger vocabulary is fine (unused rows).
  if (plan->model.vocab < rt::ByteTokenizer::kVocab)
    return Fail(f.plan_file + ": model.vocab " + std::to_string(plan->model.vocab) +
                " is below the byte tokenizer's 256");

  rt::TrainerConfig cfg;
  cfg.model = plan->model;
  cfg.layout = l;
  cfg.seed = f.seed;
  cfg.train_tokens = &corpus->train;
  cfg.record_timeline = !f.out.empty();
  // Megatron's --bf16 mixed precision (TrainerConfig::bf16): bf16 activations and weights,
  // fp32 main weights, gradients and optimizer state, on either backend. --fp32-activations
  // keeps everything fp32 (the CUDA GEMMs of a bf16 plan still multiply in bf16).
  if (f.fp32_activations && l.precision != Precision::kBf16)
    return Fail("--fp32-activations: " + f.plan_file + " has precision " +
                ToString(l.precision) + ": its activations are fp32 already");
  cfg.bf16 = l.precision == Precision::kBf16 && !f.fp32_activations;
  cfg.optimizer.lr = f.lr;
  cfg.optimizer.min_lr = f.lr / 10;
  cfg.optimizer.warmup_steps = f.warmup;
  cfg.optimizer.decay_steps = std::max(1, f.steps - f.warmup);
  if (Status st = rt::ValidateOptimizer(cfg.optimizer, "--lr/--warmup"); !st.ok()) return Fail(st.message());
  cfg.on_nan = f.ckpt.on_nan == "skip" ? rt::NanPolicy::kSkip : rt::NanPolicy::kStop;
  cfg.stop_requested = [] { return g_stop_signal.load(std::memory_order_relaxed); };
  LaunchOptions lo;
  lo.backend = f.backend;
  lo.timeout_s = f.timeout_s;
  lo.one_gpu = f.one_gpu;
  auto launch = MakeLaunch(l, lo);
  if (!launch.ok()) return Fail(f.plan_file + ": " + launch.status().message());
  cfg.local_ranks = launch->local_ranks;
  CheckpointFlags ckpt = f.ckpt;
  ResolveCheckpointFormat(&ckpt, !launch->local_ranks.empty() &&
                                     int(launch->local_ranks.size()) < l.world());
  // Over several processes (mpirun, srun) process 0 owns the folder (its lock, cleaning, the
  // manifest or whole file); every process reads the checkpoint it resumes from, and saving is
  // a collective (each process writes its own shard by default: --ckpt-format sharded).
  auto folder = PrepareCheckpoints(f.ckpt, launch->main_process);  // holds the lock until we return
  if (!folder.ok()) return Fail(folder.status().message());
  std::optional<ResumePoint>* resume = &folder->resume;
  if (*resume) {
    if (Status st = ApplyCheckpoint(**resume, &cfg); !st.ok()) return Fail(st.message());
    if ((*resume)->ckpt.state.step >= f.steps)
      return Fail((*resume)->path + " is at step " + std::to_string((*resume)->ckpt.state.step) +
                  " already: --steps " + std::to_string(f.steps) + " counts from step 0");
  }
  auto trainer = rt::Trainer::Create(cfg, launch->backends, *launch->comms);
  if (!trainer.ok()) return Fail(f.plan_file + ": " + trainer.status().message());
  // Under mpirun every process holds the same results; process 0 prints and writes files.
  if (!launch->main_process) std::freopen("/dev/null", "w", stdout);
  if (*resume) {
    if (Status st = LoadShards(&**resume, **trainer); !st.ok()) return Fail(st.message());
    if (Status st = (*trainer)->ImportState((*resume)->ckpt.state); !st.ok())
      return Fail((*resume)->path + ": " + st.message());
    resume->reset();  // the tensors are in the ranks now
  }

  std::printf("training %s with %s [%s], %s, on %s, B %lld x s %lld, %d steps\n",
              plan->model.name.c_str(), l.ShortName().c_str(), l.Knobs().c_str(),
              ToString(l.schedule), launch->where.c_str(), static_cast<long long>(l.global_batch),
              static_cast<long long>(plan->model.seq_len), f.steps);
  // With --grad-reduce-in-bf16 the gradients are accumulated and reduced in bf16.
  const char* grads = l.grad_reduce_in_bf16
                          ? "fp32 main weights and optimizer state; gradients accumulated over "
                            "the micro-batches and reduced in bf16 (--grad-reduce-in-bf16)"
                          : "fp32 main weights, gradients and optimizer state";
  if (f.backend == "cuda" && cfg.bf16)
    std::printf("(CUDA: bf16 mixed precision: bf16 activations and weights, bf16 GEMMs and "
                "flash attention on tensor cores with fp32 accumulation; %s)\n", grads);
  else if (f.backend == "cuda")
    std::printf("(CUDA: %s GEMMs on tensor cores with fp32 accumulation; fp32 master weights, "
                "optimizer state and activations)\n",
                l.precision == Precision::kFp32 ? "fp32" : "bf16");
  else if (cfg.bf16)
    std::printf("(CPU: bf16 mixed precision: activations and weights stored in bf16, computed "
                "in fp32 and rounded on each store; %s; a CPU calibration times fp32 tensors, so "
                "compare's figures are for an fp32 run)\n", grads);
  else if (l.precision != Precision::kFp32)
    std::printf("(the CPU backend computes in fp32; the plan's %s changes memory and time on "
                "GPUs, not the results)\n",
                ToString(l.precision));
  if (l.overlap_grad_reduce && l.dp * l.cp > 1 && !(*trainer)->overlaps_grad_reduce())
    std::printf("(--overlap-grad-reduce: the DP reduction runs after the backward here: %s)\n",
                f.backend == "cuda" ? "every rank on one GPU shares its stream"
                                    : "each rank and its reducer thread need a core of their own");
  // The host speed probe (cli/speed_probe.h), for compare: with --out, in a run of one process
  // (the others would wait in their first collective meanwhile), before the first step and
  // after the last, while the ranks are idle. A failed probe is a warning: the run goes on.
  const bool single_process =
      launch->local_ranks.empty() || int(launch->local_ranks.size()) == l.world();
  const bool probe = !f.no_speed_probe && !f.out.empty() && single_process;
  const rt::DType probe_act = f.backend == "cuda" && cfg.bf16 ? rt::DType::kBF16 : rt::DType::kF32;
  std::optional<MeasuredPrimitives> probe_before, probe_after;
  // CPU: on as many threads at once as the run keeps cores busy (speed_probe.h).
  const int probe_threads =
      f.backend == "cpu"
          ? std::max(1, std::min(l.world(), int(std::thread::hardware_concurrency())))
          : 1;
  auto run_probe = [&](std::optional<MeasuredPrimitives>* into) {
    auto p = RunSpeedProbe(f.backend, probe_act, probe_threads);
    if (p.ok())
      *into = std::move(*p);
    else
      std::fprintf(stderr, "warning: speed probe: %s (compare will not see the host's speed)\n",
                   p.status().message().c_str());
  };
  if (probe) run_probe(&probe_before);
  const std::vector<int32_t> val = rt::ValidationWindows(corpus->val, int(plan->model.seq_len), f.eval_windows);
  std::vector<rt::StepResult> steps;
  OtherLoad load;  // over the timed steps
  const int64_t first_step = (*trainer)->steps_done();
  StopOnSignals stop_on_signals;
  int stopped_by = 0;  // the signal the job stopped on, the same in every process; 0: none
  std::string saved;   // the last checkpoint written
  for (int64_t i = first_step; i < f.steps && !stopped_by; ++i) {
    if (i - first_step == f.timing_warmup) load.Start();
    auto s = (*trainer)->Step();
    if (!s.ok()) {
      const bool nan = s.status().message().find("not finite") != std::string::npos;
      return Fail(s.status().message() + (nan ? " (--on-nan stop; --on-nan skip skips such steps)" : ""));
    }
    if (s->skipped)
      std::printf("step %4lld/%d | skipped: loss %.4f, grad norm %.3f not finite (--on-nan skip)\n",
                  static_cast<long long>(s->step + 1), f.steps, s->loss, s->grad_norm);
    else
      std::printf("step %4lld/%d | loss %.4f | lr %.2e | grad norm %.3f | %8.1f ms | %8.0f tok/s\n",
                  static_cast<long long>(s->step + 1), f.steps, s->loss, s->lr, s->grad_norm,
                  s->step_time_s * 1e3, s->tokens_per_s);
    std::fflush(stdout);
    steps.push_back(*s);
    if (steps.size() > size_t(f.timing_warmup) + kTimelineSteps)  // keep memory bounded
      for (rt::RankTimes& rk : steps.back().ranks) rk.events = {};
    stopped_by = s->stop;
    const bool last = i + 1 == f.steps;
    if (!f.ckpt.dir.empty() &&
        (last || stopped_by || (f.ckpt.save_every > 0 && (i + 1) % f.ckpt.save_every == 0))) {
      if (Status st = SaveCheckpoint(ckpt, **trainer, cfg, launch->main_process); !st.ok())
        return Fail(st.message());
      saved = f.ckpt.dir + "/" + rt::CheckpointFileName((*trainer)->steps_done());
    }
  }
  const double other_share = load.Share();
  if (probe && probe_before) run_probe(&probe_after);
  // A stopped run skips validation (every process alike: stopped_by is the job's decision), so
  // that it ends within a scheduler's grace period.
  nlohmann::json val_json = nullptr;
  if (!stopped_by) {
    const int windows = int(val.size() / size_t(plan->model.seq_len + 1));
    auto val_loss = (*trainer)->Evaluate(val, windows);
    if (!val_loss.ok()) return Fail("validation: " + val_loss.status().message());
    std::printf("validation loss %.4f over %d windows of %lld tokens\n", *val_loss, windows,
                static_cast<long long>(plan->model.seq_len));
    val_json = *val_loss;
  }
  const nlohmann::json summary = SummaryJson(*plan, steps, launch->devices);
  std::printf("throughput: %.0f tok/s (median step %.1f ms), peak memory %s per rank",
              summary["tokens_per_s"].get<double>(), summary["median_step_time_s"].get<double>() * 1e3,
              FormatBytes(summary["peak_memory_bytes"].get<double>()).c_str());
  if (summary.contains("mfu"))
    std::printf(", %s of model FLOPs per %s, MFU %.1f%% (against %s)",
                FormatFlopRate(summary["model_tflops_per_s_per_device"].get<double>() * 1e12).c_str(),
                launch->devices > 0 ? "GPU" : "rank", 100 * summary["mfu"].get<double>(),
                summary["mfu_against"].get<std::string>().c_str());
  std::printf("\n");

  if (!f.out.empty()) {
    nlohmann::json j;
    j["tool"] = "ptdp train";
    j["plan"] = f.plan_file;
    j["model"] = plan->model.name;
    j["layout"] = LayoutJson(l, plan->model);
    j["machine"] = MachineJson(f.backend);
    j["seed"] = cfg.seed;
    j["first_step"] = first_step;
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& s : steps) arr.push_back(StepJson(s));
    j["steps"] = arr;
    j["ranks"] = RanksJson(steps);
    j["timing"] = TimingJson(steps, f.timing_warmup, other_share);
    j["timeline"] = TimelineJson(steps, f.timing_warmup);
    if (probe_before && probe_after)
      j["speed_probe"] = SpeedProbeJson(f.backend, probe_threads, *probe_before, *probe_after);
    j["validation_loss"] = val_json;
    j["summary"] = summary;
    j["interrupted"] = nullptr;
    if (stopped_by)
      j["interrupted"] = {{"signal", SignalName(stopped_by)}, {"signo", stopped_by},
                          {"steps_done", (*trainer)->steps_done()}, {"steps_requested", f.steps},
                          {"checkpoint", saved.empty() ? nlohmann::json(nullptr) : nlohmann::json(saved)}};
    // Serialised whole before the file is touched; strings from the inputs (paths, names, the
    // host) may hold bytes that are not UTF-8: those become U+FFFD instead of a throw.
    const std::string text = DumpJson(j) + "\n";
    if (Status st = WriteFileAtomically(f.out, text); !st.ok())
      return Fail(st.message() + " (measured.json not written)");
    std::printf("wrote %s\n", f.out.c_str());
  }
  std::fflush(stdout);
  const int here = g_stop_signal.load();
  const int signo = stopped_by ? stopped_by : here;
  if (signo == 0) return 0;
  if (launch->main_process)
    std::fprintf(stderr, "%s\n",
                 StoppedLine(signo, here == signo, (*trainer)->steps_done(), f.steps, saved).c_str());
  return 128 + signo;
}

}  // namespace

Runner SetupTrain(CLI::App* sub) {
  auto f = std::make_shared<TrainFlags>();
  sub->footer(sub->get_footer() +
              "\n\nExit codes: 0 every step done; 1 an error; 2 bad usage; 128 + the signal's "
              "number when SIGTERM, SIGINT or SIGHUP stopped the run at a step boundary (143, "
              "130, 129: a checkpoint is saved when --checkpoint-dir is given, and --out written "
              "for the steps done); a second signal ends the run at once.");
  sub->add_option("plan", f->plan_file, "plan.yaml written by `ptdp plan --out`")->required();
  sub->add_option("--backend", f->backend, "cpu (ranks as threads) or cuda (default cpu)");
  sub->add_option("--steps", f->steps, "training steps (default 10)");
  sub->add_option("--seed", f->seed, "initialisation and data-order seed (default 1234)");
  sub->add_option("--out", f->out, "write measured.json (per-step and per-rank figures)");
  sub->add_option("--corpus", f->corpus, "text file to train on (default: the shipped tinyshakespeare)");
  sub->add_option("--lr", f->lr, "peak learning rate (default 1e-3; warmup then cosine to lr/10)");
  sub->add_option("--warmup", f->warmup, "warmup steps (default 2)");
  sub->add_option("--max-ranks", f->max_ranks, "refuse plans with more ranks than this (default 64)");
  sub->add_option("--timeout", f->timeout_s,
                  "seconds a rank may wait in a collective (default 120; above 0, at most 604800)");
  sub->add_flag("--one-gpu", f->one_gpu, "cuda: run every rank on GPU 0 (device copies), even with more GPUs");
  sub->add_flag("--fp32-activations", f->fp32_activations,
                "bf16 plans: keep activations and weights in fp32 (CUDA still multiplies in bf16 "
                "on tensor cores; the pre-bf16-storage path, to compare against)");
  sub->add_flag("--no-speed-probe", f->no_speed_probe,
                "with --out: skip timing a few of calibrate's ops before the first step and after "
                "the last (about 1 s; compare holds them against the calibration to tell the "
                "host's drift from the model's error)");
  sub->add_option("--timing-warmup", f->timing_warmup,
                  "steps left out of measured.json's timing medians (default 1)");
  AddCheckpointFlags(sub, &f->ckpt);
  return [f] { return RunTrain(*f); };
}

}  // namespace ptdp::cli
