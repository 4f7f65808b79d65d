// Every empirical constant of the cost model, in one table with its unit and source. The
// defaults were fitted on the A100 rows of ../shared/calibration (`ptdp validate --fit A100`,
// docs/cost-model.md "Calibration"): 1,440 vTrain single-node runs of Megatron-DeepSpeed and
// Korthikanti 2022's single-layer timings, each source weighing the same (2026-12-02, issue 13:
// the constants of the per-kernel laws of core/layer_ops.h); fitted values that sit on a bound
// of the fit are marked as such in docs/cost-model.md. A cluster
// YAML may override any of them by name under `calibration:` (what `ptdp calibrate` writes and
// what the shipped H100/H200 files do with the values fitted on ../shared/calibration).
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "core/status.h"
#include "topology/cluster.h"

namespace ptdp {

struct CostConstants {
  // GEMMs (issue 13: from the GPU's structure): the output's tiles (128x128, 128x256 or 256x128,
  // whichever finishes first, as cuBLAS's heuristics pick) run in waves over the GPU's SMs, each
  // wave one tile's k-loop at the per-SM peak times gemm_eff_max * k / (k + gemm_half_dim);
  // wave and tile quantization follow. Without `sms` for the GPU, 2mnk / (peak * eff).
  double gemm_eff_max = 0.9;
  // The same for fp8 GEMMs, as a fraction of the fp8 peak (scaling and casts cost more).
  double gemm_eff_max_fp8 = 0.60;
  // The same for fp4 (NVFP4) GEMMs, as a fraction of the fp4 peak: block scales and casts.
  double gemm_eff_max_fp4 = 0.60;
  // The reduction length k at which a tile's k-loop reaches half of gemm_eff_max (prologue and
  // epilogue amortised over k / tile_k main-loop steps).
  double gemm_half_dim = 1093;
  // Attention core (QK^T, softmax, AV): fraction of the 16-bit peak reached on the FLOPs the
  // kernel executes (flash attention: the causal share only).
  double attention_eff = 0.6302;
  // Bytes moved per attention score (softmax in/out, dropout mask) when attention is not fused
  // (0 for flash/fused attention, which never writes the s x s scores to HBM).
  double softmax_bytes_per_score = 5.955;
  // Memory-bound ops: fraction of HBM bandwidth reached.
  double hbm_eff = 0.70;
  // Multipliers on the bytes of the memory-bound kernels of core/layer_ops.h: norms, dropout
  // and residual adds; activation, rotary and the rest (1: the bytes the kernel must move).
  double elementwise_replicated = 1.29;
  double elementwise_tp_split = 1.768;
  // GPU time of every kernel beyond its law: launch latency, ramp-up and tail (seconds).
  double kernel_overhead_s = 2e-6;
  // Host time to dispatch one kernel (framework, Python, launch call). A layer's forward or
  // backward takes max(its GPU time, its kernels x this): small layers are host-bound.
  double host_kernel_s = 7.748e-05;
  // Host time to issue one collective (torch.distributed call, NCCL enqueue, its events); the
  // group's ranks meet there, so a host-bound layer pays it on every rank.
  double host_collective_s = 2.589e-05;
  // Host time of one model chunk's forward or backward call per micro-batch (schedule step,
  // p2p posting, loss bookkeeping), on top of the kernels.
  double microbatch_overhead_s = 0;
  // Collectives: fraction of the link bandwidth NCCL reaches for large messages.
  double nccl_intra_eff = 1;
  // Fixed cost of one NCCL collective or p2p call (launch, proxy, synchronisation), seconds.
  double collective_overhead_s = 0.0001328;
  double nccl_inter_eff = 0.90;
  // Share of a communication hidden under a kernel that still costs time: NCCL and userbuffer
  // kernels take SMs and HBM bandwidth from the GEMM they overlap (TP async/overlap, CP ring,
  // DP buckets under the backward).
  double overlap_interference = 0;
  // Mixture of Experts: NCCL all-to-all (point-to-point sends to every peer) against the bus
  // bandwidth a ring reaches, and the load of the most loaded expert rank over the mean T k / E
  // in a dropless run (the slowest rank sets the pace; force-balanced benchmarks run at 1,
  // capacity-factor runs at the factor). No measured dropless run is in the calibration data:
  // 1.2 stands for a router trained with a balancing loss (docs/cost-model.md).
  double all_to_all_eff = 0.6;
  // Routed experts' grouped GEMMs (Transformer Engine GroupedLinear) against the dense GEMM law
  // of the same shape: per-expert launches or grouped kernels, the permuted operands.
  double grouped_gemm_eff = 0.85;
  double moe_dropless_load = 1.2;
  // Hybrid models: the Mamba-2 mixer's conv1d + SSD chunked scan + gated norm (Triton kernels)
  // on its FLOPs, as a fraction of the 16-bit peak; its time is that plus its bytes at
  // hbm_eff (a chain of kernels, some memory-bound, some not: core/layer_ops.cc MambaForward).
  // Default: ~50 TFLOP/s on an H100, what the Blackwell fits reach in absolute terms (30-70).
  double ssm_scan_eff = 0.05;
  // Share of pipeline p2p time left exposed on the critical path.
  double pp_exposed = 1.0;
  // Optimizer: bytes of HBM traffic per parameter updated (AdamW on fp32 master weights:
  // read grad, master, m, v; write master, m, v, 16-bit weight).
  double optimizer_bytes_per_param = 10;
  // Fixed per step (data loader, loss reduction, logging).
  double step_overhead_s = 0.001553;
  // Memory allowance: CUDA context + cuBLAS workspace + NCCL buffers, and allocator
  // fragmentation as a fraction of the rest.
  double workspace_bytes = 1.5 * 1073741824.0;
  double fragmentation = 0.05;
};

// Constants that existed before issue 13 and were replaced by a mechanism; a cluster YAML
// naming one gets an error that says what replaced it.
struct RetiredConstant {
  const char* name;
  const char* replaced_by;
};
const std::vector<RetiredConstant>& RetiredConstants();

// One row of the table, for docs, `ptdp calibrate` and validation of overrides.
// A constant's legal values: [lo, hi], or (lo, hi] when lo_open. Efficiencies divide a time
// (0 would make it infinite) and are fractions of a datasheet figure (above 1 would beat it).
struct ConstantRange {
  double lo = 0;
  bool lo_open = false;
  double hi = std::numeric_limits<double>::infinity();
  bool Contains(double v) const { return (lo_open ? v > lo : v >= lo) && v <= hi; }
  std::string Describe() const;  // "in (0, 1]", "non-negative"
};
struct ConstantInfo {
  const char* name;
  double CostConstants::*field;
  const char* unit;
  const char* source;
  ConstantRange range = {};
};
const std::vector<ConstantInfo>& ConstantTable();

// Defaults overridden by cluster.calibration; an unknown name is an error naming the file.
Result<CostConstants> ConstantsFor(const ClusterSpec& cluster);

}  // namespace ptdp
