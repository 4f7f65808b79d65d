// Clusters built in code for tests: numbers chosen so that results can be checked by hand.
#pragma once

#include "topology/cluster.h"

namespace ptdp::testing {

// A DGX A100-like cluster: 8 GPUs per node on NVSwitch (300 GB/s per direction, 3 us),
// 8 x 25 GB/s NICs per node (5 us), 80 GiB, 312 TFLOP/s bf16, 2 TB/s HBM.
inline ClusterSpec DgxA100Like(int nodes) {
  ClusterSpec c;
  c.name = "test-a100";
  c.file = "test-a100.yaml";
  c.nodes = nodes;
  c.gpus_per_node = 8;
  c.gpu.name = "A100";
  c.gpu.memory_bytes = 80.0 * 1073741824.0;
  c.gpu.hbm_bw_bytes_per_s = 2e12;
  c.gpu.peak_bf16 = 312e12;
  c.gpu.peak_fp16 = 312e12;
  c.gpu.peak_tf32 = 156e12;
  c.gpu.peak_fp32 = 19.5e12;
  c.intra.fabric = IntraFabric::kNvSwitch;
  c.intra.bw_bytes_per_s = 300e9;
  c.intra.latency_s = 3e-6;
  c.inter.nics_per_node = 8;
  c.inter.nic_bw_bytes_per_s = 25e9;
  c.inter.latency_s = 5e-6;
  c.inter.oversubscription = 1;
  return c;
}

}  // namespace ptdp::testing
