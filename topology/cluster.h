// ClusterSpec: what a cluster YAML file describes (GPU model, nodes, intra-node fabric,
// inter-node network, optional explicit links and calibrated constants), read strictly.
//
//   node 0                              node 1
//   +--------------------------+        +--------------------------+
//   | GPU0 GPU1 ... GPU7       |        | GPU0 ... GPU7            |
//   |   \   |       /          |        |                          |
//   |    [NVSwitch] (intra)    |        |    [NVSwitch]            |
//   |   NIC0 ... NIC7          |        |   NIC0 ... NIC7          |
//   +-----|--------------------+        +-----|--------------------+
//         +------------[ IB fabric (inter, oversubscription) ]-----+
//
// A rack-scale NVLink domain (GB200/GB300 NVL72: `nodes_per_nvlink_domain: 18` trays of
// `gpus_per_node: 4`) puts the NVSwitch outside the trays: every GPU of the domain reaches every
// other over NVLink, and only traffic between domains takes the NICs.
//
//   domain 0 (rack: 18 trays x 4 GPUs)                  domain 1
//   +-----------------------------------------------+    +---------------+
//   | tray 0: GPU0..GPU3   ...  tray 17: GPU0..GPU3 |    | tray 0 ...    |
//   |    |  |  |  |                 |  |  |  |      |    |   |  |  |  |  |
//   |  [ NVLink switch trays: one NVSwitch domain ] |    |  [NVSwitch]   |
//   |   NIC0..NIC3 per tray (one per GPU)           |    |               |
//   +-----|-----------------------------------------+    +-----|---------+
//         +-------------[ IB / Ethernet fabric ]----------------+
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/layout.h"
#include "core/measured.h"
#include "core/status.h"

namespace YAML { class Node; }

namespace ptdp {

struct GpuSpec {
  std::string name;                 // "A100-SXM4-80GB"
  double memory_bytes = 0;          // HBM capacity
  double hbm_bw_bytes_per_s = 0;    // HBM bandwidth
  // GPU to host memory, per direction (PCIe, or NVLink-C2C to a Grace CPU): what Megatron's CPU
  // activation offloading (--cpu-offloading-num-layers) moves over. 0: not given (offloading
  // is then refused for the cluster).
  double host_bw_bytes_per_s = 0;
  // Host (CPU) memory per GPU: the node's over its GPUs (DGX H100 2 TB / 8; a Grace's 480 GB
  // LPDDR5X / its 2 GPUs), what offloaded activations may fill. 0: not given, not checked.
  double host_memory_bytes = 0;
  // Dense peak per precision, FLOP/s; 0 means the GPU has no such tensor-core path.
  double peak_bf16 = 0, peak_fp16 = 0, peak_fp8 = 0, peak_tf32 = 0, peak_fp32 = 0;
  double peak_fp4 = 0;              // NVFP4/MXFP4 tensor cores (Blackwell on); 0 before
  // Streaming multiprocessors (datasheet: A100 108, H100/H200 SXM 132); the cost model runs
  // GEMM tiles over them in waves. 0: not given, GEMMs are timed without wave quantization.
  int sms = 0;
  // Peak for a training precision (fp32 training uses the tf32 tensor cores if present).
  double PeakFlops(Precision p) const;
  // The precision plans train in when none is asked for: bf16 (Megatron's default) where there
  // is a bf16 peak, else fp16, else fp32 (local-cpu's rank slots: the CPU runtime computes fp32).
  Precision DefaultPrecision() const;
};

enum class IntraFabric {
  kNvSwitch,     // every GPU reaches every other at full per-GPU bandwidth
  kNvLinkMesh,   // direct links between every pair; bandwidth split over the peers
  kNvLinkPairs,  // NVLink bridges between pairs (0-1, 2-3, ...); other pairs over PCIe
  kPcie,         // all traffic through the PCIe switch / host
  kSharedMemory, // CPU ranks of one host sharing memory (local-cpu)
};
const char* ToString(IntraFabric f);

struct IntraNodeSpec {
  IntraFabric fabric = IntraFabric::kNvSwitch;
  double bw_bytes_per_s = 0;       // per GPU, per direction (NVSwitch: 300 GB/s on A100)
  double latency_s = 0;            // one hop
  double pcie_bw_bytes_per_s = 0;  // for kNvLinkPairs: bandwidth of the non-bridged pairs
};

struct InterNodeSpec {
  int nics_per_node = 0;           // compute NICs per node (0 allowed only for nodes == 1)
  double nic_bw_bytes_per_s = 0;   // per NIC, per direction (200 Gb/s HDR = 25 GB/s)
  double latency_s = 0;            // one network hop, end to end
  double oversubscription = 1;     // >= 1; fabric bandwidth divides by this across nodes
};

// An explicit link between two GPUs of a node (local indices), for irregular machines;
// when any are given, they replace the fabric's implied links inside a node.
struct LinkSpec {
  int a = 0, b = 0;
  double bw_bytes_per_s = 0;       // per direction
  double latency_s = 0;
};

// Largest cluster ptdp builds a graph for (GPUs): 16x the biggest published training runs, small
// enough that a graph and a plan stay fast.
constexpr int64_t kMaxClusterGpus = kMaxWorldSize;

struct ClusterSpec {
  std::string name;
  std::string file;                // where it was read from ("" if built in code)
  int nodes = 1;
  int gpus_per_node = 1;
  // Nodes (trays) that share one NVLink domain: 1 for a DGX/HGX node (its own NVSwitch), 18 for
  // a GB200/GB300 NVL72 rack of 4-GPU trays. `nodes` is a whole number of domains.
  int nodes_per_nvlink_domain = 1;
  GpuSpec gpu;
  IntraNodeSpec intra;
  InterNodeSpec inter;
  std::vector<LinkSpec> links;
  // Calibrated constants by name (cost_model/hardware_table names), overriding the defaults.
  // Written by `ptdp calibrate`; optional `calibration:` map of name -> number.
  std::map<std::string, double> calibration;
  // Measured primitives (`measured:`, written by `ptdp calibrate`): when present, the cost model
  // composes times from them instead of from peaks and efficiency constants. Empty otherwise.
  MeasuredPrimitives measured;

  int world() const { return nodes * gpus_per_node; }
  // GPUs that reach each other over NVLink: a node's, or a rack's (NVL72: 72).
  int nvlink_domain_gpus() const { return nodes_per_nvlink_domain * gpus_per_node; }
  int nvlink_domains() const { return nodes / nodes_per_nvlink_domain; }
};

// Reads a cluster from a YAML map (see configs/clusters/*.yaml for the keys).
Result<ClusterSpec> ClusterFromYaml(const YAML::Node& node, const std::string& file);
// Loads a cluster YAML file. Errors name file:line, key and value.
Result<ClusterSpec> LoadClusterFile(const std::string& path);
// YAML text that ClusterFromYaml reads back to the same spec (round trip).
std::string ClusterToYaml(const ClusterSpec& c);

}  // namespace ptdp
