// Topology: the cluster as a Boost.Graph of GPUs, NVSwitches, NICs and the network, and the
// times of point-to-point transfers and collectives over groups of ranks on it.
// Rank r lives on node r / gpus_per_node, local GPU r % gpus_per_node, and in NVLink domain
// r / nvlink_domain_gpus (the node itself unless nodes_per_nvlink_domain > 1, as on an NVL72).
#pragma once

#include <memory>
#include <vector>

#include "core/status.h"
#include "topology/cluster.h"

namespace ptdp {

enum class Collective { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kBroadcast, kSendRecv };
const char* ToString(Collective c);

// nccl-tests bus-bandwidth factor (doc/PERFORMANCE.md): busbw = algbw * factor.
// all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all (n-1)/n; broadcast, send/recv 1.
double BusFactor(Collective c, int n);

// The shape of a group of ranks, enough to time collectives without walking the graph
// (the planner's hot path). Regular Megatron groups: `per_node` ranks on each of `nodes` nodes.
// "Node" here is the NVLink domain: a DGX node, or a whole NVL72 rack of trays, whose GPUs all
// talk over NVLink; only what crosses domains takes the NICs.
struct GroupShape {
  int size = 1;      // n, ranks in the group
  int per_node = 1;  // ranks of the group in one NVLink domain (max over domains)
  int nodes = 1;     // NVLink domains the group spans
  // Concurrent groups of the same kind sharing each domain's NICs (e.g. t DP groups per node).
  int sharing = 1;
};

class Topology {
 public:
  // Builds the graph. Fails if the spec is inconsistent (e.g. an explicit link to a GPU
  // index >= gpus_per_node, multi-node without NICs).
  static Result<Topology> Build(const ClusterSpec& spec);

  const ClusterSpec& spec() const { return spec_; }
  int world() const { return spec_.world(); }
  int NodeOf(int rank) const { return rank / spec_.gpus_per_node; }
  int DomainOf(int rank) const { return rank / spec_.nvlink_domain_gpus(); }

  // Bottleneck bandwidth (bytes/s, one direction) and summed latency (s) of the path from
  // rank a to rank b; a == b gives HBM bandwidth and zero latency. Two nodes of one NVLink
  // domain talk over the NVLink switches; two domains over the NICs.
  double Bandwidth(int a, int b) const;
  double Latency(int a, int b) const;
  bool CrossesNodes(const std::vector<int>& group) const;
  bool CrossesDomains(const std::vector<int>& group) const;
  // The group's shape counted in NVLink domains (see GroupShape).
  GroupShape ShapeOf(const std::vector<int>& group) const;

  // Time (s) of collective `c` over a group, for a buffer of `bytes` (the full, gathered size,
  // as nccl-tests counts it; for send/recv the message). Ring inside an NVLink domain; across
  // domains the bottleneck is the domain's NIC share (hierarchical), plus latency terms per
  // ring step.
  double CollectiveTime(Collective c, const GroupShape& g, double bytes) const;
  double CollectiveTime(Collective c, const std::vector<int>& group, double bytes) const;
  // Point-to-point transfer of `bytes` between two ranks: latency + bytes / bandwidth.
  double SendRecvTime(int a, int b, double bytes) const;

  // Effective bus bandwidth (bytes/s) a collective over shape g reaches for large messages.
  double BusBandwidth(const GroupShape& g) const;

  // Vertex and edge counts of the graph (for `ptdp topo` and tests).
  int NumVertices() const;
  int NumEdges() const;

  // Internal graph; defined in topology.cc. Public only so the implementation's helpers can
  // name it.
  struct Graph;

 private:
  explicit Topology(ClusterSpec spec);
  ClusterSpec spec_;
  std::shared_ptr<const Graph> graph_;
  // Pairwise bandwidth/latency between local GPUs of a node, precomputed on the graph.
  std::vector<double> local_bw_, local_lat_;
  // The same from local GPU i of a node to local GPU j of another node of its NVLink domain
  // (g x g; empty when each node is its own domain).
  std::vector<double> tray_bw_, tray_lat_;
  // The ring through ranks 0..k-1 of a domain for k = 0..nvlink_domain_gpus (LocalRing of
  // FirstLocals(k) inside a node, then across its trays), computed once: the cost model asks
  // for it millions of times a second.
  std::vector<double> first_ring_bw_, first_ring_lat_;
};

}  // namespace ptdp
