// Plan: the contract between planning and execution. The planner writes it (`ptdp plan --out
// plan.yaml`); simulate, train and compare read it. It carries the inputs (model shape, cluster
// file and size), the chosen layout and the predicted figures, so later commands need neither
// the planner nor the model file.
#pragma once

#include <string>
#include <vector>

#include "core/layout.h"
#include "core/model.h"
#include "core/status.h"

namespace ptdp {

// Step time split into where it goes; exposed (non-overlapped) times, seconds. They add up to
// the step time.
struct Breakdown {
  double compute_s = 0;    // forward + backward (+ recompute) of the busiest stage, all micro-batches
  double tp_comm_s = 0;    // exposed TP/SP collectives
  double pp_comm_s = 0;    // exposed pipeline send/receive
  double dp_comm_s = 0;    // exposed DP gradient reduction (+ dist-opt all-gather, tied embedding)
  double bubble_s = 0;     // pipeline fill and drain
  double optimizer_s = 0;  // optimizer step (+ grad-norm)
  double total() const {
    return compute_s + tp_comm_s + pp_comm_s + dp_comm_s + bubble_s + optimizer_s;
  }
};

// Memory of one GPU, bytes.
struct MemoryBytes {
  double weights = 0;      // low-precision model weights
  double grads = 0;        // gradient buffers
  double optimizer = 0;    // fp32 master weights + Adam moments (sharded with dist-opt)
  double activations = 0;  // stored activations of in-flight micro-batches
  double other = 0;        // logits/loss, workspace, allocator fragmentation allowance
  double total = 0;        // sum of the above
  double capacity = 0;     // GPU memory
  // What a layout may use: capacity less the memory headroom (--memory-headroom); a layout
  // fits when total <= usable. 0 when not known (an older plan.yaml): capacity then.
  double usable = 0;
  double limit() const { return usable > 0 ? usable : capacity; }
  // CPU activation offloading: the activations this GPU keeps in host memory at the peak, and
  // what it may use there (the cluster's gpu.host_memory less the same headroom; 0: not
  // stated, not checked).
  double host = 0, host_usable = 0;
  bool host_fits() const { return host_usable <= 0 || host <= host_usable; }
  bool fits() const { return total <= limit() && host_fits(); }
};

struct Prediction {
  double step_time_s = 0;
  double tflops_per_gpu = 0;     // model FLOPs (no recompute) per second per GPU, TFLOP/s
  double hw_tflops_per_gpu = 0;  // hardware FLOPs (with recompute), TFLOP/s
  double mfu = 0;                // model FLOPs utilisation, 0..1
  double bubble_fraction = 0;    // bubble / step time
  Breakdown breakdown;
  MemoryBytes memory;            // the most loaded GPU
  std::vector<double> stage_memory_bytes;  // total per pipeline stage
  bool fits = false;
  std::string source = "analytic";  // "analytic" or "simulated"
};

struct Plan {
  ModelSpec model;
  Layout layout;
  std::string cluster_file;      // path as given to `ptdp plan`
  std::string cluster_name;
  int nodes = 1;                 // nodes of the cluster used
  int gpus_per_node = 1;
  int nodes_per_nvlink_domain = 1;  // > 1 on rack-scale NVLink (NVL72: 18 trays of 4 GPUs)
  bool allow_tp_across_nodes = false;
  bool has_prediction = false;
  Prediction prediction;
};

// Reads a layout from a YAML map in plan.yaml's `layout:` keys (tp, pp, dp, vp, cp, ep, etp,
// micro_batch, global_batch, num_microbatches, microbatch_group, sequence_parallel, recompute,
// distributed_optimizer, shard_gradients, grad_reduce_in_bf16,
// accumulate_allreduce_grads_in_fp32, use_precision_aware_optimizer, main_params_dtype,
// exp_avg_dtype, exp_avg_sq_dtype, main_grads_dtype, precision, schedule,
// overlap_grad_reduce, ddp_bucket_size, tp_comm_overlap, overlap_p2p, moe_a2a_overlap,
// moe_flex_dispatcher, and the pipeline split: first_stage_layers, last_stage_layers,
// embedding_in_split, loss_in_split, pipeline_layout, stage_layers). Strict: unknown keys and
// bad values are errors naming file:line, key and value. `stage_layers` (layers per virtual
// stage, written by PlanToYaml) must agree with the split the other keys give for `model`.
// Legality against a model and a world is the caller's (ValidateLayout).
Result<Layout> LayoutFromYaml(const YAML::Node& node, const std::string& file,
                              const std::string& path, const ModelSpec& model);

// YAML text of a plan (a commented, human-readable file).
std::string PlanToYaml(const Plan& plan);
// Parses a plan; `name` is the file name for messages. Strict like every config reader.
Result<Plan> PlanFromYamlText(const std::string& text, const std::string& name);
Status WritePlanFile(const Plan& plan, const std::string& path);
Result<Plan> LoadPlanFile(const std::string& path);

}  // namespace ptdp
