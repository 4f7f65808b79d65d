// Every empirical constant of the cost model, in one table with its unit and source. The
// defaults were fitted on the A100 rows of ../shared/calibration (`ptdp validate --fit A100`,
// docs/cost-model.md "Calibration"): 1,440 vTrain single-node runs of Megatron-DeepSpeed and
// Korthikanti 2022's single-layer timings; fitted values that sit on a bound of the fit are
// marked as such in docs/cost-model.md. A cluster
// YAML may override any of them by name under `calibration:` (what `ptdp calibrate` writes and
// what the shipped H100/H200 files do with the values fitted on ../shared/calibration).
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "topology/cluster.h"

namespace ptdp {

struct CostConstants {
  // GEMMs: time = flops / (peak * eff), eff = gemm_eff_max * d / (d + gemm_half_dim), d the
  // smallest of the GEMM's m, n, k (small GEMMs cannot fill the tensor cores).
  double gemm_eff_max = 0.867;
  // The same for fp8 GEMMs, as a fraction of the fp8 peak (scaling and casts cost more).
  double gemm_eff_max_fp8 = 0.60;
  double gemm_half_dim = 1041;
  // Attention core (QK^T, softmax, AV): fraction of the 16-bit peak reached.
  double attention_eff = 0.80;
  // Bytes moved per attention score (softmax in/out, dropout mask) when attention is not fused
  // (0 for flash/fused attention, which never writes the s x s scores to HBM).
  double softmax_bytes_per_score = 6.04;
  // Memory-bound ops: fraction of HBM bandwidth reached.
  double hbm_eff = 0.70;
  // Element-wise traffic of one layer's forward, in units of (tokens * h * activation bytes):
  // LN, dropout, residual (replicated over TP unless SP) and GeLU/bias (split over TP).
  double elementwise_replicated = 1;
  double elementwise_tp_split = 1;
  // Host dispatch time of one transformer layer's forward (kernel launches, framework); a layer
  // takes max(GPU work, this); backward twice this.
  double layer_overhead_s = 791e-6;
  // Collectives: fraction of the link bandwidth NCCL reaches for large messages.
  double nccl_intra_eff = 1.0;
  // Fixed cost of one NCCL collective or p2p call (launch, proxy, synchronisation), seconds.
  double collective_overhead_s = 24.4e-6;
  double nccl_inter_eff = 0.90;
  // Share of TP communication left exposed (1: none overlapped; --tp-comm-overlap lowers it
  // to tp_overlap_exposed).
  double tp_exposed = 1.0;
  double tp_overlap_exposed = 0.25;
  // Share of pipeline p2p time left exposed on the critical path.
  double pp_exposed = 1.0;
  // Share of the backward of one micro-batch that can hide DP gradient reduction
  // (--overlap-grad-reduce).
  double dp_overlap_window = 1.0;
  // Optimizer: bytes of HBM traffic per parameter updated (AdamW on fp32 master weights:
  // read grad, master, m, v; write master, m, v, 16-bit weight).
  double optimizer_bytes_per_param = 10;
  // Fixed per step (data loader, loss reduction, logging).
  double step_overhead_s = 0.0060;
  // Memory allowance: CUDA context + cuBLAS workspace + NCCL buffers, and allocator
  // fragmentation as a fraction of the rest.
  double workspace_bytes = 1.5 * 1073741824.0;
  double fragmentation = 0.05;
};

// One row of the table, for docs, `ptdp calibrate` and validation of overrides.
struct ConstantInfo {
  const char* name;
  double CostConstants::*field;
  const char* unit;
  const char* source;
};
const std::vector<ConstantInfo>& ConstantTable();

// Defaults overridden by cluster.calibration; an unknown name is an error naming the file.
Result<CostConstants> ConstantsFor(const ClusterSpec& cluster);

}  // namespace ptdp
