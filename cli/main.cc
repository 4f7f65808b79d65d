// ptdp: plan, simulate and run Megatron-style training layouts. main() parses, dispatches,
// and turns a failure into a one-line message and a non-zero exit code.
#include <cstdio>
#include <iostream>

#include "cli/commands.h"

namespace ptdp::cli {

int Fail(const std::string& message) {
  // What went to stdout first (a --json document) ends before the message starts, also when
  // both streams go to one pipe.
  std::cout.flush();
  std::fflush(stdout);
  std::fprintf(stderr, "ptdp: %s\n", message.c_str());
  return 1;
}

namespace {

// Examples are whole command lines, one per line (never joined with '|', which a shell would
// read as a pipe); shipped configs by name, so that they run from any folder.
const Command kCommands[] = {
    {"plan", "enumerate every legal layout, predict each, rank them and pick the best",
     "ptdp plan --cluster dgx-a100 --model gpt3-175b --global-batch 1536\n"
     "ptdp plan --cluster my-cluster.yaml --model hf:path/to/config.json --global-batch 512 "
     "--out plan.yaml",
     SetupPlan},
    {"schedule", "show a pipeline schedule's op order per rank (GPipe, 1F1B, interleaved), checked",
     "ptdp schedule --pp 4 --vp 2 --microbatches 8", SetupSchedule},
    {"simulate", "predict one layout in detail: step-time breakdown and memory per stage",
     "ptdp simulate --cluster dgx-a100 --model gpt3-175b --global-batch 1536 --tp 8 --pp 16 "
     "--vp 3\n"
     "ptdp simulate plan.yaml --trace trace.json",
     SetupSimulate},
    {"topo", "show a cluster: bandwidth/latency table and a picture of one node",
     "ptdp topo --cluster dgx-a100", SetupTopo},
    {"validate", "prediction error of the cost model on published measured runs",
     "ptdp validate\n"
     "ptdp validate --data ../shared/calibration   # adds vTrain's CSV where you have it",
     SetupValidate},
    {"report", "one self-contained HTML page: ranking, breakdown, memory, Gantt of the step",
     "ptdp report --cluster dgx-a100 --model gpt3-13b --nodes 4 --global-batch 256 "
     "--html report.html\n"
     "ptdp report plan.yaml --measured measured.json --html report.html",
     SetupReport},
    {"train", "train the plan's GPT with exactly its layout (CPU: ranks as threads)",
     "ptdp train plan.yaml --backend cpu --steps 20 --out measured.json", SetupTrain},
    {"calibrate", "measure this machine's primitives and write a calibrated cluster YAML",
     "ptdp calibrate --backend cpu --out calibrated.yaml", SetupCalibrate},
    {"compare", "predicted against measured: step time, breakdown and memory per rank",
     "ptdp compare plan.yaml measured.json --max-error 10", SetupCompare},
    {"checkpoint", "verify a checkpoint (whole or sharded), say what it holds, convert it",
     "ptdp checkpoint ckpts/\n"
     "ptdp checkpoint ckpts/step-00000100.ckpt --to whole-step-100.ckpt", SetupCheckpoint},
    {"info", "what this binary can run: backends, CUDA/NCCL/MPI, visible GPUs",
     "ptdp info --json", SetupInfo},
};

}  // namespace
}  // namespace ptdp::cli

int main(int argc, char** argv) {
  using namespace ptdp::cli;
  CLI::App app{"ptdp: plan, simulate and run Megatron-style TP x PP x DP training layouts"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "ptdp 0.1.0");
  std::vector<std::pair<CLI::App*, Runner>> runners;
  for (const Command& c : kCommands) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    std::string examples = c.example, indented = "  ";
    for (char ch : examples) indented += ch == '\n' ? std::string("\n  ") : std::string(1, ch);
    const bool several = examples.find('\n') != std::string::npos;
    sub->footer(std::string(several ? "Examples:\n" : "Example:\n") + indented);
    runners.emplace_back(sub, c.setup(sub));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "ptdp: %s (see ptdp --help)\n", e.what());
    return 2;
  }
  for (auto& [sub, run] : runners)
    if (sub->parsed()) {
      try {
        return run();
      } catch (const std::exception& e) {  // a bug, not user error: still one line, non-zero
        return Fail(std::string("internal error: ") + e.what());
      }
    }
  return 2;
}
