// Topology: the cluster as a Boost.Graph of GPUs, NVSwitches, NICs and the network, and the
// times of point-to-point transfers and collectives over groups of ranks on it.
// Rank r lives on node r / gpus_per_node, local GPU r % gpus_per_node.
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
struct GroupShape {
  int size = 1;      // n, ranks in the group
  int per_node = 1;  // ranks of the group on one node (max over nodes)
  int nodes = 1;     // nodes the group spans
  // Concurrent groups of the same kind sharing each node's NICs (e.g. t DP groups per node).
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

  // Bottleneck bandwidth (bytes/s, one direction) and summed latency (s) of the path from
  // rank a to rank b; a == b gives HBM bandwidth and zero latency.
  double Bandwidth(int a, int b) const;
  double Latency(int a, int b) const;
  bool CrossesNodes(const std::vector<int>& group) const;
  GroupShape ShapeOf(const std::vector<int>& group) const;

  // Time (s) of collective `c` over a group, for a buffer of `bytes` (the full, gathered size,
  // as nccl-tests counts it; for send/recv the message). Ring inside a node; across nodes the
  // bottleneck is the node's NIC share (hierarchical), plus latency terms per ring step.
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
  // The ring through local GPUs 0..k-1 for k = 0..gpus_per_node (LocalRing of FirstLocals(k)),
  // computed once: the cost model asks for it millions of times a second.
  std::vector<double> first_ring_bw_, first_ring_lat_;
};

}  // namespace ptdp
