// The constants table: defaults fitted on the A100 rows of ../shared/calibration (vTrain's
// 1,440 single-node runs and Korthikanti et al. 2022 Table 4); see docs/cost-model.md.
#include "cost_model/hardware_table.h"

#include <cmath>
#include <cstdio>

namespace ptdp {

std::string ConstantRange::Describe() const {
  if (lo == 0 && !lo_open && std::isinf(hi)) return "non-negative";
  char buf[64];
  std::snprintf(buf, sizeof buf, "in %c%g, %g]", lo_open ? '(' : '[', lo, hi);
  return buf;
}

namespace {
// An efficiency divides a time: never 0, never above the datasheet figure it scales.
constexpr ConstantRange kEfficiency{0, true, 1};
constexpr ConstantRange kFraction{0, false, 1};
constexpr ConstantRange kFragmentation{0, false, 0.9};
}  // namespace

const std::vector<ConstantInfo>& ConstantTable() {
  using C = CostConstants;
  static const std::vector<ConstantInfo> table = {
      {"gemm_eff_max", &C::gemm_eff_max, "fraction of peak",
       "cuBLAS large-GEMM efficiency; fitted on vTrain A100 runs (docs/cost-model.md)", kEfficiency},
      {"gemm_eff_max_fp8", &C::gemm_eff_max_fp8, "fraction of fp8 peak",
       "Transformer Engine fp8 GEMMs incl. casts; fitted on dgxc/NeMo H100 fp8 recipes", kEfficiency},
      {"gemm_eff_max_fp4", &C::gemm_eff_max_fp4, "fraction of fp4 peak",
       "Transformer Engine NVFP4 GEMMs incl. block scaling; fitted on Blackwell NVFP4 recipes",
       kEfficiency},
      {"gemm_half_dim", &C::gemm_half_dim, "elements",
       "reduction length k at half of gemm_eff_max (tile k-loop); fitted on vTrain A100 runs"},
      {"attention_eff", &C::attention_eff, "fraction of 16-bit peak",
       "on executed FLOPs (flash: causal share); fitted per GPU (data/published/fit.yaml)", kEfficiency},
      {"softmax_bytes_per_score", &C::softmax_bytes_per_score, "bytes",
       "unfused softmax+mask+dropout traffic per score (Korthikanti 2022 sec. 4: 5as/h term)"},
      {"hbm_eff", &C::hbm_eff, "fraction of HBM bandwidth", "STREAM-like kernels reach 70-90%", kEfficiency},
      {"elementwise_replicated", &C::elementwise_replicated, "x tokens*h*bytes",
       "LN + 2 dropout + 2 residual reads/writes (Korthikanti 2022 table 2 terms)"},
      {"elementwise_tp_split", &C::elementwise_tp_split, "x tokens*h*bytes",
       "GeLU on 4h and bias adds, split over TP"},
      {"kernel_overhead_s", &C::kernel_overhead_s, "s",
       "GPU launch latency + ramp/tail per kernel (~2-5 us on A100/H100)"},
      {"host_kernel_s", &C::host_kernel_s, "s",
       "host dispatch per kernel (PyTorch eager ~10-40 us); fitted per GPU"},
      {"host_collective_s", &C::host_collective_s, "s",
       "host cost to issue one collective (torch.distributed + NCCL enqueue); fitted per GPU"},
      {"microbatch_overhead_s", &C::microbatch_overhead_s, "s",
       "host work per chunk forward/backward call (schedule, p2p posting); fitted per GPU"},
      {"nccl_intra_eff", &C::nccl_intra_eff, "fraction of link",
       "nccl-tests all_reduce busbw on DGX A100 NVSwitch ~230-240 of 300 GB/s", kEfficiency},
      {"collective_overhead_s", &C::collective_overhead_s, "s",
       "NCCL launch + proxy cost per call (nccl-tests small-message times ~10-30 us)"},
      {"nccl_inter_eff", &C::nccl_inter_eff, "fraction of NIC",
       "nccl-tests inter-node busbw ~ 90% of InfiniBand line rate", kEfficiency},
      {"all_to_all_eff", &C::all_to_all_eff, "fraction of ring bus bandwidth",
       "NCCL all-to-all (EP dispatch/combine) against a ring collective's bus bandwidth; "
       "fitted on the MoE recipes (data/published/fit.yaml)", kEfficiency},
      {"grouped_gemm_eff", &C::grouped_gemm_eff, "fraction of the GEMM law",
       "routed experts' grouped GEMMs against a dense GEMM of the same tiles; fitted on the MoE "
       "recipes", kEfficiency},
      {"moe_dropless_load", &C::moe_dropless_load, "x mean tokens per expert",
       "most loaded expert rank in dropless routing (aux-loss balanced); not fitted",
       ConstantRange{1, false, 64}},
      {"ssm_scan_eff", &C::ssm_scan_eff, "fraction of 16-bit peak",
       "hybrid models' Mamba-2 conv1d + SSD chunked scan + gated norm (mamba_ssm Triton "
       "kernels) on their FLOPs; fitted on the hybrid recipes (data/published/fit.yaml)",
       kEfficiency},
      {"overlap_interference", &C::overlap_interference, "fraction",
       "hidden communication's cost to the kernel it overlaps (SMs, HBM); fitted per GPU", kFraction},
      {"pp_exposed", &C::pp_exposed, "fraction", "Megatron 1F1B p2p is blocking", kFraction},
      {"optimizer_bytes_per_param", &C::optimizer_bytes_per_param, "bytes",
       "AdamW: read 4+4+4+4, write 4+4+4+2 (fp32 master, m, v, grad; 16-bit weight)"},
      {"step_overhead_s", &C::step_overhead_s, "s", "loss reduction, logging, data loader"},
      {"workspace_bytes", &C::workspace_bytes, "bytes",
       "CUDA context (~0.5 GiB) + cuBLAS workspace + NCCL buffers (~1 GiB)"},
      {"fragmentation", &C::fragmentation, "fraction",
       "PyTorch caching allocator fragmentation, typically 5-10%", kFragmentation},
  };
  return table;
}

const std::vector<RetiredConstant>& RetiredConstants() {
  static const std::vector<RetiredConstant> retired = {
      {"layer_overhead_s", "host_kernel_s (host dispatch per kernel of core/layer_ops.h) and "
                           "microbatch_overhead_s"},
      {"tp_exposed", "the TP collectives' own overlap rules (core/layer_ops.h: blocking, async "
                     "under wgrad/dgrad, or split against their GEMM with --tp-comm-overlap)"},
      {"tp_overlap_exposed", "the split of each TP collective against the GEMM it overlaps "
                             "(what is hidden follows from both durations; "
                             "overlap_interference)"},
      {"dp_overlap_window", "Megatron's gradient buckets under the last backward (bucket "
                            "max(40M, 1M x dp) parameters)"},
  };
  return retired;
}

Result<CostConstants> ConstantsFor(const ClusterSpec& cluster) {
  CostConstants k;
  for (const auto& [name, value] : cluster.calibration) {
    for (const RetiredConstant& r : RetiredConstants())
      if (name == r.name)
        return Status::Error(cluster.file + ": calibration." + name +
                             ": retired (issue 13); replaced by " + r.replaced_by +
                             "; remove it, or run `ptdp validate --fit` / `ptdp calibrate` again");
    bool found = false;
    for (const auto& row : ConstantTable()) {
      if (name == row.name) {
        if (!row.range.Contains(value)) {
          char buf[64];
          std::snprintf(buf, sizeof buf, "%g", value);
          return Status::Error(cluster.file + ": calibration." + name + " = " + buf + ": must be " +
                               row.range.Describe() + " (" + row.unit + ")");
        }
        k.*(row.field) = value;
        found = true;
        break;
      }
    }
    if (!found) {
      std::string valid;
      for (const auto& row : ConstantTable()) valid += (valid.empty() ? "" : ", ") + std::string(row.name);
      return Status::Error(cluster.file + ": calibration: unknown constant '" + name +
                           "' (valid: " + valid + ")");
    }
  }
  return k;
}

}  // namespace ptdp
