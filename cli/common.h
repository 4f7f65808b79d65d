// Shared pieces of the ptdp commands: the layout flags every planning command takes, loading
// cluster and model with the --nodes/--gpus overrides, and JSON/table rendering helpers.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <array>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "cli/paths.h"
#include "core/file_io.h"
#include "core/layout.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/status.h"
#include "cost_model/analytic.h"
#include "planner/planner.h"
#include "topology/cluster.h"
#include "topology/topology.h"

namespace ptdp::cli {

// Flags shared by plan and simulate.
// Megatron-LM's pipeline split flags (plan, simulate, report, schedule).
struct SplitFlags {
  std::optional<int> first_stage_layers, last_stage_layers;
  bool embedding_in_split = false, loss_in_split = false;
  std::optional<std::string> pipeline_layout;
  bool any() const {
    return first_stage_layers || last_stage_layers || embedding_in_split || loss_in_split ||
           pipeline_layout;
  }
};
void AddSplitFlags(CLI::App* app, SplitFlags* f);
// The split flags into `l` (first/last counts, accounting, layout string), each checked; true
// when any is given.
Result<bool> ApplySplit(const SplitFlags& f, Layout* l);

struct LayoutFlags {
  std::string cluster, model;
  std::optional<int> nodes, gpus;
  // Sizes: one value fixes the knob, a comma-separated list (--tp 4,8) searches those (plan).
  std::vector<int> tp, pp, dp, vp, cp, micro_batch;
  // Expert parallelism (MoE models): --expert-model-parallel-size (--ep) and
  // --expert-tensor-parallel-size (--etp; unset: tp, Megatron's default).
  std::vector<int> ep, etp;
  std::optional<int64_t> global_batch;
  // Megatron's --recompute-modules (names, by spaces or commas): selective recompute of those.
  std::vector<std::string> recompute_modules;
  std::optional<std::string> sp, recompute, dist_opt, precision, tp_overlap, grad_overlap,
      p2p_overlap;
  std::optional<int> seq_len;
  SplitFlags split;
  std::optional<double> memory_headroom;
  // Megatron's --data-parallel-sharding-strategy: no_shard | optim | optim_grads.
  std::optional<std::string> dp_sharding;
  std::optional<int64_t> ddp_bucket_size;  // Megatron's --ddp-bucket-size (parameters)
  std::optional<int> cpu_offload_layers;   // Megatron's --cpu-offloading-num-layers
  // Megatron's --moe-token-dispatcher-type (alltoall | flex) and
  // --overlap-moe-expert-parallel-comm (on | off here); unset: plan chooses, simulate: off.
  std::optional<std::string> moe_dispatcher, moe_a2a_overlap;
  // Megatron's --cross-entropy-loss-fusion (on | off here) and --cross-entropy-fusion-impl
  // (native | te); unset: plan takes te, simulate Megatron's default (no fusion).
  std::optional<std::string> ce_fusion, ce_impl;
  std::optional<std::string> param_gather_overlap;  // Megatron's --overlap-param-gather (on|off)
  std::optional<std::string> train_tokens;  // --train-tokens 15T: days and GPU-hours
  bool allow_tp_across_nodes = false;
  bool grad_reduce_in_bf16 = false;  // Megatron's --grad-reduce-in-bf16 (bf16 gradient buffers)
  bool accumulate_grads_in_fp32 = false;  // --accumulate-allreduce-grads-in-fp32 (fp16 runs)
  bool precision_aware_optimizer = false;  // Megatron's --use-precision-aware-optimizer
  // Its dtype flags, in OptimizerDtypeFields() order (--main-params-dtype, --exp-avg-dtype, ...).
  std::array<std::optional<std::string>, kOptimizerDtypeCount> optimizer_dtypes;
  bool json = false;
};
// The default of --memory-headroom: the share of HBM a plan leaves free on top of the cost
// model's per-GPU reserve (workspace_bytes: CUDA context, cuBLAS workspace, NCCL buffers).
constexpr double kDefaultMemoryHeadroom = 0.05;
void AddLayoutFlags(CLI::App* app, LayoutFlags* f, bool need_cluster_model);

// A --model value: "hf:path" (a Hugging Face config.json, or a folder holding one), a shipped
// model's name ("gpt3-175b", cli/paths.h), or a model YAML file.
Result<ModelSpec> LoadModelByName(const std::string& spec);

// The loaded world: cluster (after --nodes), topology, model (after --seq-len), cost model.
struct World {
  ClusterSpec cluster;
  std::unique_ptr<Topology> topo;
  ModelSpec model;
  std::unique_ptr<AnalyticModel> cost;
  int gpus = 0;  // world size used (--gpus, default every GPU)
};
Result<World> LoadWorld(const std::string& cluster_path, const std::string& model_spec,
                        std::optional<int> nodes, std::optional<int> gpus,
                        std::optional<int> seq_len);

// The world a plan.yaml was made for: its cluster file (or `cluster_override`), resized to the
// plan's nodes, and its inline model.
Result<World> WorldForPlan(const Plan& plan, const std::string& cluster_override);

// The search space of the flags (unset knobs searched).
Result<SearchSpace> SpaceFromFlags(const LayoutFlags& f, const World& w);
// One layout from the flags; unset knobs take Megatron's defaults (tp=pp=1, dp = rest,
// mb=1, no SP, no recompute, no distributed optimizer, bf16). Validated.
Result<Layout> LayoutFromFlags(const LayoutFlags& f, const World& w);

// The planner as `plan` and `report` run it: search, re-score the best `refine` layouts with the
// event simulator, keep the best `top`. Checks top (1..10000) and refine (0..10000).
Result<PlanResult> RunPlanner(const World& w, const SearchSpace& space, int top, int refine);

// JSON text of `j` for --json output and files: a string that is not UTF-8 (a name from a
// file read before the check, a path) has its bad bytes replaced by U+FFFD instead of throwing,
// so no --json output can fail. indent < 0: one line.
std::string DumpJson(const nlohmann::json& j, int indent = 2);

// The layout's keys as plan.yaml writes them, with `stage_layers` (layers per virtual stage, in
// layer order) for `model`.
nlohmann::json LayoutJson(const Layout& l, const ModelSpec& model);
nlohmann::json PredictionJson(const Prediction& p);
nlohmann::json EstimateJson(const Layout& l, const ModelSpec& model, const Estimate& e);

// The FLOP/s unit that suits a figure: TFLOP/s from 1e12 up (GPUs), GFLOP/s below (CPU ranks),
// MFLOP/s below 1e9. A table takes the unit of its largest figure, so its column reads as one.
struct FlopUnit {
  double per_s = 1e12;        // FLOP/s in one unit
  const char* name = "TFLOP/s";
};
FlopUnit FlopUnitFor(double flops_per_s);

// "on"/"off" flag values.
Result<bool> ParseOnOff(const std::string& flag, const std::string& v);
// One line naming the measured primitives a cluster's cost model composes times from, or "" for
// a cluster without `measured:` (plan's and simulate's output).
// "llama3-405b (405.9B parameters, 405.9B active per token), sequence 8192".
std::string ModelSummary(const ModelSpec& m);
// Adds model, params_total, params_active and seq_len to a --json object.
void AddModelJson(const ModelSpec& m, nlohmann::json* j);
// --train-tokens: "15T", "300B", "2e12" (K, M, B or G, T are powers of 1000).
Result<double> ParseTokenCount(const std::string& text);
struct TrainingTime {
  double tokens = 0, steps = 0, seconds = 0, gpu_hours = 0;
};
// Steps (whole ones), wall time and GPU-hours to train `tokens` at `step_s` per step.
TrainingTime TimeToTrain(const Layout& l, const ModelSpec& m, double step_s, double tokens);
std::string TrainingLine(const TrainingTime& t, int gpus);
nlohmann::json TrainingJson(const TrainingTime& t);
std::string MeasuredNote(const ClusterSpec& c);
// Human-readable breakdown of a prediction (simulate's output).
std::string RenderPrediction(const Plan& plan);

// ---- Files a command writes: checked at start, written whole or not at all.

// Makes sure files can be written into `dir` later: creates it when missing, checks that it is
// a folder and that a file can be created and removed in it (a probe "DIR/.ptdp-probe-XXXXXX").
// The message names `flag` (e.g. "--checkpoint-dir"), the folder and the system's reason.
Status CheckWritableFolder(const std::string& flag, const std::string& dir);
// The same for the folder of the file `path` ("." when it names none), and `path` must not be a
// folder itself.
Status CheckWritableFile(const std::string& flag, const std::string& path);

// WriteFileAtomically (core/file_io.h) writes them.

// A text bar of round(cells) '#', at most max_cells; empty for a negative count or a NaN. A
// length computed from such a figure would otherwise ask std::string for ~2^64 characters
// (the "internal error: basic_string::_M_create" of issue 12).
std::string Bar(double cells, int max_cells);

// How much of the machine other processes used over an interval: their CPU seconds (every
// process's, from /proc/stat, minus this process's) over the interval's wall seconds times the
// cores. Timings taken above ~10% are the machine under load: rank threads sleeping in a
// collective wake up late, and other cgroups take their share of the cores.
class OtherLoad {
 public:
  OtherLoad() { Start(); }
  void Start();
  // The share in [0, 1] since Start(), or -1 when /proc/stat cannot be read.
  double Share() const;

 private:
  double busy0_ = -1, own0_ = 0;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace ptdp::cli
