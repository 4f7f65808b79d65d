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

// A DGX B200-like cluster: 8 GPUs per node on NVSwitch (NVLink 5: 900 GB/s per direction, 3 us),
// 8 x 50 GB/s NICs per node (400 Gb/s, 5 us), 180 GB, 2.25 PFLOP/s bf16, 8 TB/s HBM.
inline ClusterSpec DgxB200Like(int nodes) {
  ClusterSpec c = DgxA100Like(nodes);
  c.name = "test-b200";
  c.file = "test-b200.yaml";
  c.gpu.name = "B200";
  c.gpu.memory_bytes = 180e9;
  c.gpu.hbm_bw_bytes_per_s = 8e12;
  c.gpu.peak_bf16 = c.gpu.peak_fp16 = 2.25e15;
  c.gpu.peak_fp8 = 4.5e15;
  c.intra.bw_bytes_per_s = 900e9;
  c.inter.nic_bw_bytes_per_s = 50e9;
  return c;
}

// A GB200 NVL72-like cluster: `racks` racks of 18 trays x 4 GPUs, each rack one NVLink domain
// (NVSwitch, 900 GB/s per GPU per direction, 3 us per hop), one 50 GB/s NIC per GPU (5 us).
inline ClusterSpec Nvl72Like(int racks) {
  ClusterSpec c = DgxB200Like(18 * racks);
  c.name = "test-nvl72";
  c.file = "test-nvl72.yaml";
  c.gpus_per_node = 4;
  c.nodes_per_nvlink_domain = 18;
  c.gpu.name = "GB200";
  c.gpu.memory_bytes = 186e9;
  c.gpu.peak_bf16 = c.gpu.peak_fp16 = 2.5e15;
  c.gpu.peak_fp8 = 5e15;
  c.inter.nics_per_node = 4;
  return c;
}

}  // namespace ptdp::testing
