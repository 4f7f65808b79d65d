// `ptdp train plan.yaml --backend cpu`: trains the plan's GPT with exactly its layout (ranks as
// threads on the CPU backend), prints a progress line per step and writes measured.json.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <thread>

#include "cli/commands.h"
#include "cli/common.h"
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
  std::string corpus = std::string(PTDP_SOURCE_DIR) + "/data/tinyshakespeare/input.txt";
  double lr = 1e-3;
  int warmup = 2;
  int eval_windows = 16;
  int max_ranks = 64;
  double timeout_s = 120;
  CheckpointFlags ckpt;
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
  return {{"step", s.step}, {"loss", s.loss}, {"grad_norm", s.grad_norm}, {"lr", s.lr},
          {"skipped", s.skipped}, {"step_time_s", s.step_time_s}, {"tokens_per_s", s.tokens_per_s}};
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

int RunTrain(const TrainFlags& f) {
  if (f.backend == "cuda")
    return Fail("--backend cuda: this ptdp was built without the CUDA backend (see `ptdp info`)");
  if (f.backend != "cpu") return Fail("--backend '" + f.backend + "': expected cpu or cuda");
  if (f.steps <= 0 || f.steps > 1000000) return Fail("--steps " + std::to_string(f.steps) + " must be in 1..1000000");
  if (!(f.lr > 0 && f.lr < 1)) return Fail("--lr " + std::to_string(f.lr) + " must be in (0, 1)");
  if (f.warmup < 0) return Fail("--warmup must not be negative");
  if (Status st = CheckCheckpointFlags(f.ckpt); !st.ok()) return Fail(st.message());
  auto plan = LoadPlanFile(f.plan_file);
  if (!plan.ok()) return Fail(plan.status().message());
  const Layout& l = plan->layout;
  if (l.world() > f.max_ranks)
    return Fail(f.plan_file + ": " + std::to_string(l.world()) + " ranks is more than --max-ranks " +
                std::to_string(f.max_ranks) + " threads");
  auto corpus = rt::LoadCorpus(f.corpus, 0.1, plan->model.seq_len + 1);
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
  cfg.optimizer.lr = f.lr;
  cfg.optimizer.min_lr = f.lr / 10;
  cfg.optimizer.warmup_steps = f.warmup;
  cfg.optimizer.decay_steps = std::max(1, f.steps - f.warmup);
  cfg.on_nan = f.ckpt.on_nan == "skip" ? rt::NanPolicy::kSkip : rt::NanPolicy::kStop;
  auto resume = PrepareCheckpoints(f.ckpt);
  if (!resume.ok()) return Fail(resume.status().message());
  if (*resume) {
    if (Status st = ApplyCheckpoint(**resume, &cfg); !st.ok()) return Fail(st.message());
    if ((*resume)->ckpt.state.step >= f.steps)
      return Fail((*resume)->path + " is at step " + std::to_string((*resume)->ckpt.state.step) +
                  " already: --steps " + std::to_string(f.steps) + " counts from step 0");
  }
  rt::ThreadWorld world(l.world(), f.timeout_s);
  auto trainer = rt::Trainer::Create(
      cfg, [](int) { return std::make_unique<rt::CpuBackend>(); }, world);
  if (!trainer.ok()) return Fail(f.plan_file + ": " + trainer.status().message());
  if (*resume) {
    if (Status st = (*trainer)->ImportState((*resume)->ckpt.state); !st.ok())
      return Fail((*resume)->path + ": " + st.message());
    resume->reset();  // the tensors are in the ranks now
  }

  std::printf("training %s with %s [%s], %s, on %d CPU rank threads, B %lld x s %lld, %d steps\n",
              plan->model.name.c_str(), l.ShortName().c_str(), l.Knobs().c_str(),
              ToString(l.schedule), l.world(), static_cast<long long>(l.global_batch),
              static_cast<long long>(plan->model.seq_len), f.steps);
  if (l.precision != Precision::kFp32 || l.recompute != Recompute::kNone)
    std::printf("(the CPU backend computes in fp32 without recompute; the plan's %s%s changes "
                "memory and time on GPUs, not the results)\n",
                ToString(l.precision), l.recompute != Recompute::kNone
                                           ? (std::string(" and ") + ToString(l.recompute) + " recompute").c_str()
                                           : "");
  const std::vector<int32_t> val = rt::ValidationWindows(corpus->val, int(plan->model.seq_len), f.eval_windows);
  std::vector<rt::StepResult> steps;
  const int64_t first_step = (*trainer)->steps_done();
  for (int64_t i = first_step; i < f.steps; ++i) {
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
    const bool last = i + 1 == f.steps;
    if (!f.ckpt.dir.empty() && (last || (f.ckpt.save_every > 0 && (i + 1) % f.ckpt.save_every == 0)))
      if (Status st = SaveCheckpoint(f.ckpt, **trainer, cfg); !st.ok()) return Fail(st.message());
  }
  const int windows = int(val.size() / size_t(plan->model.seq_len + 1));
  auto val_loss = (*trainer)->Evaluate(val, windows);
  if (!val_loss.ok()) return Fail("validation: " + val_loss.status().message());
  std::printf("validation loss %.4f over %d windows of %lld tokens\n", *val_loss, windows,
              static_cast<long long>(plan->model.seq_len));

  if (!f.out.empty()) {
    nlohmann::json j;
    j["tool"] = "ptdp train";
    j["plan"] = f.plan_file;
    j["model"] = plan->model.name;
    j["layout"] = LayoutJson(l);
    j["machine"] = MachineJson(f.backend);
    j["seed"] = cfg.seed;
    j["first_step"] = first_step;
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& s : steps) arr.push_back(StepJson(s));
    j["steps"] = arr;
    j["ranks"] = RanksJson(steps);
    j["validation_loss"] = *val_loss;
    std::ofstream out(f.out);
    out << j.dump(2) << "\n";
    if (!out) return Fail(f.out + ": cannot write measured.json");
    std::printf("wrote %s\n", f.out.c_str());
  }
  return 0;
}

}  // namespace

Runner SetupTrain(CLI::App* sub) {
  auto f = std::make_shared<TrainFlags>();
  sub->add_option("plan", f->plan_file, "plan.yaml written by `ptdp plan --out`")->required();
  sub->add_option("--backend", f->backend, "cpu (ranks as threads) or cuda (default cpu)");
  sub->add_option("--steps", f->steps, "training steps (default 10)");
  sub->add_option("--seed", f->seed, "initialisation and data-order seed (default 1234)");
  sub->add_option("--out", f->out, "write measured.json (per-step and per-rank figures)");
  sub->add_option("--corpus", f->corpus, "text file to train on (default: the shipped tinyshakespeare)");
  sub->add_option("--lr", f->lr, "peak learning rate (default 1e-3; warmup then cosine to lr/10)");
  sub->add_option("--warmup", f->warmup, "warmup steps (default 2)");
  sub->add_option("--max-ranks", f->max_ranks, "refuse plans with more ranks than this (default 64)");
  sub->add_option("--timeout", f->timeout_s, "seconds a rank may wait in a collective (default 120)");
  AddCheckpointFlags(sub, &f->ckpt);
  return [f] { return RunTrain(*f); };
}

}  // namespace ptdp::cli
