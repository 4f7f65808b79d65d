// Topology: the cluster as a Boost.Graph, widest paths between the GPUs of a node, and the
// ring-collective time model of megatron-reference.md section 5 / nccl-tests PERFORMANCE.md.
//
// One node, by fabric (g = gpus_per_node; every edge: bandwidth per direction, latency):
//   nvswitch, shared_memory   GPU --(bw, lat/2)-- [hub] --(bw, lat/2)-- GPU
//   nvlink_mesh               GPU --(bw/(g-1), lat)-- GPU, for every pair
//   nvlink_pairs              GPU0 ==(bw, lat)== GPU1, GPU2 == GPU3, ...; and every GPU
//                             --(pcie_bw, lat/2)-- [PCIe switch] for the other pairs
//   pcie                      GPU --(bw, lat/2)-- [PCIe switch] --(bw, lat/2)-- GPU
//   explicit links:           replace the NVLink part above (hub, mesh or pairs); a PCIe
//                             switch (pcie, nvlink_pairs) stays as the fallback path.
// Across nodes (rail of NIC i*nics/g for GPU i):
//   GPU --(nic_bw, intra lat/2)-- NIC --(nic_bw/oversub, inter lat/2)-- [fabric] -- NIC -- GPU
// so a GPU pair on two nodes sees nic_bw/oversub and inter latency + one intra hop (the
// GPU-NIC PCIe hops, or NCCL's PXN forwarding over NVLink to the rail's GPU).
// An NVLink domain of several nodes (nodes_per_nvlink_domain > 1; nvswitch, no links: GB200
// NVL72's 18 trays behind its NVLink switch trays) has one hub for all its GPUs in place of one
// per node, so two GPUs on different trays of it see the NVLink path, GPU -- [hub] -- GPU, and
// only GPUs of two domains go through the NICs above.
#include "topology/topology.h"

#include <boost/graph/adjacency_list.hpp>

#include <algorithm>
#include <cassert>
#include <limits>
#include <map>
#include <queue>
#include <utility>

namespace ptdp {

const char* ToString(Collective c) {
  switch (c) {
    case Collective::kAllReduce: return "all-reduce";
    case Collective::kAllGather: return "all-gather";
    case Collective::kReduceScatter: return "reduce-scatter";
    case Collective::kAllToAll: return "all-to-all";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kSendRecv: return "send-recv";
  }
  return "?";
}

double BusFactor(Collective c, int n) {
  if (n <= 0) return 0;
  switch (c) {
    case Collective::kAllReduce: return 2.0 * (n - 1) / n;
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kAllToAll: return double(n - 1) / n;
    case Collective::kBroadcast:
    case Collective::kSendRecv: return 1.0;
  }
  return 1.0;
}

namespace {

enum class VertexKind { kGpu, kHub, kPcieSwitch, kNic, kFabric };

struct VertexProps {
  VertexKind kind = VertexKind::kGpu;
  int node = -1;   // -1 for the network fabric
  int index = 0;   // local GPU or NIC index
};

struct EdgeProps {
  double bw_bytes_per_s = 0;  // per direction
  double latency_s = 0;
};

using BoostGraph = boost::adjacency_list<boost::vecS, boost::vecS, boost::undirectedS,
                                         VertexProps, EdgeProps>;
using Vertex = BoostGraph::vertex_descriptor;

// A path's bottleneck bandwidth and summed latency.
struct Path {
  double bw_bytes_per_s = 0;
  double latency_s = 0;
};

constexpr double kInf = std::numeric_limits<double>::infinity();

}  // namespace

struct Topology::Graph {
  BoostGraph g;
  std::vector<Vertex> gpu;    // by rank
  std::vector<Vertex> nic;    // by node * nics_per_node + local NIC
  std::vector<Vertex> hub;    // by NVLink domain, when its nodes share one (else empty)
  Vertex node0_end = 0;       // node 0's vertices are [0, node0_end)
  Vertex domain0_end = 0;     // NVLink domain 0's are [0, domain0_end)
  std::vector<Path> uplink;   // local GPU -> its NIC -> fabric (empty without a network)
};

namespace {

std::string Where(const ClusterSpec& s) {
  return s.file.empty() ? "cluster '" + s.name + "'" : s.file;
}

// What Build needs beyond what the YAML reader checks (specs can be built or edited in code).
Status Validate(const ClusterSpec& s) {
  auto err = [&](const std::string& what) { return Status::Error(Where(s) + ": " + what); };
  if (s.nodes < 1 || s.gpus_per_node < 1) return err("nodes and gpus_per_node must be positive");
  if (int64_t(s.nodes) * s.gpus_per_node > kMaxClusterGpus)
    return err(std::to_string(s.nodes) + " nodes x " + std::to_string(s.gpus_per_node) +
               " GPUs is above the " + std::to_string(kMaxClusterGpus) + "-GPU limit");
  const int npd = s.nodes_per_nvlink_domain;
  if (npd < 1 || s.nodes % npd != 0)
    return err("nodes " + std::to_string(s.nodes) + " is not a whole number of NVLink domains "
               "(nodes_per_nvlink_domain: " + std::to_string(npd) + ")");
  if (npd > 1 && (s.intra.fabric != IntraFabric::kNvSwitch || !s.links.empty()))
    return err("nodes_per_nvlink_domain " + std::to_string(npd) +
               " needs intra_node.fabric nvswitch and no links");
  if (!(s.intra.bw_bytes_per_s > 0)) return err("intra_node.bandwidth must be positive");
  if (s.intra.fabric == IntraFabric::kNvLinkPairs && !(s.intra.pcie_bw_bytes_per_s > 0))
    return err("intra_node.pcie_bandwidth is required for fabric nvlink_pairs");
  if (s.nodes > 1 && s.inter.nics_per_node < 1)
    return err(std::to_string(s.nodes) + " nodes but no inter_node network (nics_per_node)");
  if (s.inter.nics_per_node > 0 &&
      (!(s.inter.nic_bw_bytes_per_s > 0) || !(s.inter.oversubscription >= 1)))
    return err("inter_node.nic_bandwidth must be positive and oversubscription >= 1");
  for (const LinkSpec& l : s.links) {
    if (l.a < 0 || l.b < 0 || l.a >= s.gpus_per_node || l.b >= s.gpus_per_node || l.a == l.b)
      return err("link " + std::to_string(l.a) + "-" + std::to_string(l.b) +
                 " is not between two distinct GPUs of a node (gpus_per_node: " +
                 std::to_string(s.gpus_per_node) + ")");
    if (!(l.bw_bytes_per_s > 0)) return err("link bandwidth must be positive");
  }
  return Status::Ok();
}

// Adds every GPU of `gpus` to a new switch-like vertex of `kind` (NVSwitch, host memory, PCIe
// switch); half the hop latency on each side so GPU-switch-GPU is one hop.
void AddStar(BoostGraph* g, const std::vector<Vertex>& gpus, VertexKind kind, int node,
             double bw, double latency_s) {
  const Vertex hub = boost::add_vertex(VertexProps{kind, node, 0}, *g);
  for (Vertex v : gpus) boost::add_edge(v, hub, EdgeProps{bw, latency_s / 2}, *g);
}

// The GPU-GPU part of one node, as drawn at the top of this file.
void AddIntraLinks(const ClusterSpec& s, int node, const std::vector<Vertex>& gpus,
                   BoostGraph* g) {
  const IntraNodeSpec& in = s.intra;
  const int n = s.gpus_per_node;
  const bool nvlink = s.links.empty();  // explicit links replace the fabric's NVLink part
  auto link = [&](int a, int b, double bw, double lat) {
    boost::add_edge(gpus[a], gpus[b], EdgeProps{bw, lat}, *g);
  };
  switch (in.fabric) {
    case IntraFabric::kNvSwitch:
    case IntraFabric::kSharedMemory:
      if (nvlink) AddStar(g, gpus, VertexKind::kHub, node, in.bw_bytes_per_s, in.latency_s);
      break;
    case IntraFabric::kNvLinkMesh:  // a GPU's links are split evenly over its g-1 peers
      for (int a = 0; nvlink && a < n; ++a)
        for (int b = a + 1; b < n; ++b) link(a, b, in.bw_bytes_per_s / (n - 1), in.latency_s);
      break;
    case IntraFabric::kNvLinkPairs:
      for (int a = 0; nvlink && a + 1 < n; a += 2) link(a, a + 1, in.bw_bytes_per_s, in.latency_s);
      AddStar(g, gpus, VertexKind::kPcieSwitch, node, in.pcie_bw_bytes_per_s, in.latency_s);
      break;
    case IntraFabric::kPcie:
      AddStar(g, gpus, VertexKind::kPcieSwitch, node, in.bw_bytes_per_s, in.latency_s);
      break;
  }
  for (const LinkSpec& l : s.links) link(l.a, l.b, l.bw_bytes_per_s, l.latency_s);
}

// A node of a multi-node NVLink domain: its GPUs join the domain's hub, which the domain's
// first node adds (so domain 0's hub is among node 0's vertices).
void JoinDomainHub(const ClusterSpec& s, int node, const std::vector<Vertex>& gpus,
                   Topology::Graph* G) {
  if (node % s.nodes_per_nvlink_domain == 0)
    G->hub.push_back(boost::add_vertex(VertexProps{VertexKind::kHub, node, 0}, G->g));
  for (Vertex v : gpus)
    boost::add_edge(v, G->hub.back(), EdgeProps{s.intra.bw_bytes_per_s, s.intra.latency_s / 2},
                    G->g);
}

// One node: its GPUs, fabric and NICs; GPU i uses NIC i * nics / g (its rail).
void AddNode(const ClusterSpec& s, int node, Topology::Graph* G) {
  std::vector<Vertex> gpus;
  for (int i = 0; i < s.gpus_per_node; ++i)
    gpus.push_back(boost::add_vertex(VertexProps{VertexKind::kGpu, node, i}, G->g));
  G->gpu.insert(G->gpu.end(), gpus.begin(), gpus.end());
  if (s.nodes_per_nvlink_domain > 1) JoinDomainHub(s, node, gpus, G);
  else AddIntraLinks(s, node, gpus, &G->g);
  const int nics = s.inter.nics_per_node;
  for (int k = 0; k < nics; ++k)
    G->nic.push_back(boost::add_vertex(VertexProps{VertexKind::kNic, node, k}, G->g));
  for (int i = 0; nics > 0 && i < s.gpus_per_node; ++i)
    boost::add_edge(gpus[i], G->nic[node * nics + i * nics / s.gpus_per_node],
                    EdgeProps{s.inter.nic_bw_bytes_per_s, s.intra.latency_s / 2}, G->g);
}

// The edge between two adjacent vertices (precondition: they are adjacent).
const EdgeProps& EdgeBetween(const BoostGraph& g, Vertex a, Vertex b) {
  auto [e, found] = boost::edge(a, b, g);
  assert(found);
  return g[e];
}

std::shared_ptr<Topology::Graph> BuildGraph(const ClusterSpec& s) {
  auto G = std::make_shared<Topology::Graph>();
  for (int node = 0; node < s.nodes; ++node) {
    AddNode(s, node, G.get());
    if (node == 0) G->node0_end = boost::num_vertices(G->g);
    if (node == s.nodes_per_nvlink_domain - 1) G->domain0_end = boost::num_vertices(G->g);
  }
  if (s.inter.nics_per_node == 0) return G;
  const InterNodeSpec& net = s.inter;
  const Vertex fabric = boost::add_vertex(VertexProps{VertexKind::kFabric, -1, 0}, G->g);
  for (Vertex nic : G->nic)
    boost::add_edge(nic, fabric,
                    EdgeProps{net.nic_bw_bytes_per_s / net.oversubscription, net.latency_s / 2},
                    G->g);
  for (int i = 0; i < s.gpus_per_node; ++i) {
    const Vertex gpu = G->gpu[i], nic = G->nic[i * net.nics_per_node / s.gpus_per_node];
    const EdgeProps &a = EdgeBetween(G->g, gpu, nic), &b = EdgeBetween(G->g, nic, fabric);
    G->uplink.push_back({std::min(a.bw_bytes_per_s, b.bw_bytes_per_s), a.latency_s + b.latency_s});
  }
  return G;
}

// Vertices a path inside node 0 (end = node0_end) or NVLink domain 0 (end = domain0_end) may
// use: GPUs and switches, never NICs or the network.
bool Inside(const Topology::Graph& G, Vertex v, Vertex end) {
  if (v >= end) return false;
  const VertexKind k = G.g[v].kind;
  return k == VertexKind::kGpu || k == VertexKind::kHub || k == VertexKind::kPcieSwitch;
}

// Widest path (largest bottleneck bandwidth) from `src` to every vertex below `end` (node 0 or
// domain 0): Dijkstra with max-min in place of min-plus.
std::vector<double> WidestFrom(const Topology::Graph& G, Vertex src, Vertex end) {
  std::vector<double> bw(end, 0.0);
  std::priority_queue<std::pair<double, Vertex>> q;  // largest bandwidth first
  bw[src] = kInf;
  q.push({kInf, src});
  while (!q.empty()) {
    auto [b, u] = q.top();
    q.pop();
    if (b < bw[u]) continue;
    for (auto e : boost::make_iterator_range(boost::out_edges(u, G.g))) {
      const Vertex v = boost::target(e, G.g);
      const double nb = std::min(b, G.g[e].bw_bytes_per_s);
      if (Inside(G, v, end) && nb > bw[v]) { bw[v] = nb; q.push({nb, v}); }
    }
  }
  return bw;
}

// Lowest summed latency from `src` over edges of at least `min_bw` (plain Dijkstra): among
// the widest paths, the fastest.
std::vector<double> FastestFrom(const Topology::Graph& G, Vertex src, double min_bw, Vertex end) {
  std::vector<double> lat(end, kInf);
  using Item = std::pair<double, Vertex>;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> q;  // smallest first
  lat[src] = 0;
  q.push({0.0, src});
  while (!q.empty()) {
    auto [l, u] = q.top();
    q.pop();
    if (l > lat[u]) continue;
    for (auto e : boost::make_iterator_range(boost::out_edges(u, G.g))) {
      const Vertex v = boost::target(e, G.g);
      const double nl = l + G.g[e].latency_s;
      if (Inside(G, v, end) && G.g[e].bw_bytes_per_s >= min_bw && nl < lat[v]) {
        lat[v] = nl;
        q.push({nl, v});
      }
    }
  }
  return lat;
}

// Pairwise (g x g, row-major) bottleneck bandwidth and latency from the GPUs of node 0 to
// those of node `to` (0: inside node 0, every node being the same, the diagonal HBM bandwidth
// and zero latency; 1: to the next tray of an NVLink domain, over paths inside domain 0).
void FillPairTables(const Topology::Graph& G, const ClusterSpec& s, int to,
                    std::vector<double>* bw, std::vector<double>* lat) {
  const int g = s.gpus_per_node;
  const Vertex end = to == 0 ? G.node0_end : G.domain0_end;
  bw->assign(size_t(g) * g, 0.0);
  lat->assign(size_t(g) * g, 0.0);
  for (int i = 0; i < g; ++i) {
    const std::vector<double> widest = WidestFrom(G, G.gpu[i], end);
    std::map<double, std::vector<double>> fastest;  // by bandwidth threshold
    for (int j = 0; j < g; ++j) {
      const size_t ij = size_t(i) * g + j;
      if (to == 0 && i == j) { (*bw)[ij] = s.gpu.hbm_bw_bytes_per_s; continue; }
      const Vertex dst = G.gpu[size_t(to) * g + j];
      const double w = widest[dst];
      if (w <= 0) continue;  // unreachable: reported by CheckConnected
      if (!fastest.count(w)) fastest[w] = FastestFrom(G, G.gpu[i], w, end);
      (*bw)[ij] = w;
      (*lat)[ij] = fastest[w][dst];
    }
  }
}

Status CheckConnected(const ClusterSpec& s, const std::vector<double>& bw, const char* where) {
  const int g = s.gpus_per_node;
  for (int i = 0; i < g && !bw.empty(); ++i)
    for (int j = 0; j < g; ++j)
      if (!(bw[size_t(i) * g + j] > 0))
        return Status::Error(Where(s) + ": links: GPU " + std::to_string(i) +
                             " cannot reach GPU " + std::to_string(j) + " " + where +
                             " (add links, or use fabric pcie or nvlink_pairs for a PCIe path)");
  return Status::Ok();
}

// Ring steps, each paying one hop latency: all-reduce 2(n-1) (reduce-scatter + all-gather),
// all-gather / reduce-scatter / all-to-all n-1, broadcast n-1 (pipelined chain), send/recv 1.
int Steps(Collective c, int n) {
  switch (c) {
    case Collective::kAllReduce: return 2 * (n - 1);
    case Collective::kSendRecv: return 1;
    default: return n - 1;
  }
}

// time = steps * hop latency + busbw factor * bytes / bus bandwidth (reference section 5).
double RingTime(Collective c, int n, double hop_s, double bus_bw, double bytes) {
  // No bytes take no transfer time, whatever the bandwidth (0/0 was a NaN on a path with none).
  const double transfer = bytes > 0 ? BusFactor(c, n) * bytes / bus_bw : 0.0;
  return Steps(c, n) * hop_s + transfer;
}

// A ring through local GPUs `locals` (in order, closing back to the first) on one node: the
// slowest link it crosses and its slowest hop's latency. On a full NVLink mesh, NCCL runs
// k-1 rings at once, one per peer link, so k GPUs reach (k-1) links' bandwidth.
Path LocalRing(const ClusterSpec& s, const std::vector<double>& bw,
               const std::vector<double>& lat, const std::vector<int>& locals) {
  const int g = s.gpus_per_node, k = static_cast<int>(locals.size());
  Path ring{kInf, 0};
  for (int i = 0; i < k; ++i) {
    const size_t ij = size_t(locals[i]) * g + locals[(i + 1) % k];
    ring.bw_bytes_per_s = std::min(ring.bw_bytes_per_s, bw[ij]);
    ring.latency_s = std::max(ring.latency_s, lat[ij]);
  }
  if (s.intra.fabric == IntraFabric::kNvLinkMesh && s.links.empty() && k > 1)
    ring.bw_bytes_per_s *= (k - 1);
  return ring;
}

// Ranks of the group in one NVLink domain (a one-domain group has them all, whatever per_node
// says).
int RanksPerDomain(const GroupShape& g, int domain_gpus) {
  return std::min(g.nodes <= 1 ? g.size : g.per_node, domain_gpus);
}

std::vector<int> FirstLocals(int k) {
  std::vector<int> v(k);
  for (int i = 0; i < k; ++i) v[i] = i;
  return v;
}

// Two GPUs on different nodes: up one's rail and down the other's (no network: unreachable,
// zero bandwidth, which only a GroupShape inconsistent with the cluster can ask for).
Path CrossNode(const Topology::Graph& G, int local_a, int local_b) {
  if (G.uplink.empty()) return {0, kInf};
  const Path &a = G.uplink[local_a], &b = G.uplink[local_b];
  return {std::min(a.bw_bytes_per_s, b.bw_bytes_per_s), a.latency_s + b.latency_s};
}

}  // namespace

Topology::Topology(ClusterSpec spec) : spec_(std::move(spec)) {}

Result<Topology> Topology::Build(const ClusterSpec& spec) {
  PTDP_RETURN_IF_ERROR(Validate(spec));
  Topology t(spec);
  auto graph = BuildGraph(spec);
  FillPairTables(*graph, spec, 0, &t.local_bw_, &t.local_lat_);
  PTDP_RETURN_IF_ERROR(CheckConnected(spec, t.local_bw_, "inside a node"));
  if (spec.nodes_per_nvlink_domain > 1) {
    FillPairTables(*graph, spec, 1, &t.tray_bw_, &t.tray_lat_);
    PTDP_RETURN_IF_ERROR(CheckConnected(spec, t.tray_bw_, "on another node of its NVLink domain"));
  }
  t.graph_ = std::move(graph);
  const int g = spec.gpus_per_node, d = spec.nvlink_domain_gpus();
  t.first_ring_bw_.assign(size_t(d) + 1, kInf);
  t.first_ring_lat_.assign(size_t(d) + 1, 0);
  for (int k = 2; k <= g; ++k) {
    const Path ring = LocalRing(spec, t.local_bw_, t.local_lat_, FirstLocals(k));
    t.first_ring_bw_[size_t(k)] = ring.bw_bytes_per_s;
    t.first_ring_lat_[size_t(k)] = ring.latency_s;
  }
  // Past a node, the ring 0 -> 1 -> ... -> k-1 -> 0 of the domain's ranks: the chain's slowest
  // hop so far, and the hop from k-1 back to rank 0 (on another tray).
  Path chain{kInf, 0};
  for (int k = 2; k <= d; ++k) {
    chain.bw_bytes_per_s = std::min(chain.bw_bytes_per_s, t.Bandwidth(k - 2, k - 1));
    chain.latency_s = std::max(chain.latency_s, t.Latency(k - 2, k - 1));
    if (k <= g) continue;
    t.first_ring_bw_[size_t(k)] = std::min(chain.bw_bytes_per_s, t.Bandwidth(k - 1, 0));
    t.first_ring_lat_[size_t(k)] = std::max(chain.latency_s, t.Latency(k - 1, 0));
  }
  return t;
}

double Topology::Bandwidth(int a, int b) const {
  assert(a >= 0 && b >= 0 && a < world() && b < world());
  const int g = spec_.gpus_per_node;
  if (a == b) return spec_.gpu.hbm_bw_bytes_per_s;
  if (NodeOf(a) == NodeOf(b)) return local_bw_[size_t(a % g) * g + b % g];
  if (DomainOf(a) == DomainOf(b)) return tray_bw_[size_t(a % g) * g + b % g];
  return CrossNode(*graph_, a % g, b % g).bw_bytes_per_s;
}

double Topology::Latency(int a, int b) const {
  assert(a >= 0 && b >= 0 && a < world() && b < world());
  const int g = spec_.gpus_per_node;
  if (a == b) return 0;
  if (NodeOf(a) == NodeOf(b)) return local_lat_[size_t(a % g) * g + b % g];
  if (DomainOf(a) == DomainOf(b)) return tray_lat_[size_t(a % g) * g + b % g];
  return CrossNode(*graph_, a % g, b % g).latency_s;
}

bool Topology::CrossesNodes(const std::vector<int>& group) const {
  for (int r : group)
    if (NodeOf(r) != NodeOf(group.front())) return true;
  return false;
}

bool Topology::CrossesDomains(const std::vector<int>& group) const {
  for (int r : group)
    if (DomainOf(r) != DomainOf(group.front())) return true;
  return false;
}

GroupShape Topology::ShapeOf(const std::vector<int>& group) const {
  std::map<int, int> per_domain;  // NVLink domain -> ranks of the group in it
  for (int r : group) ++per_domain[DomainOf(r)];
  GroupShape s;
  s.size = static_cast<int>(group.size());
  s.nodes = std::max<int>(1, per_domain.size());
  for (const auto& [domain, count] : per_domain) s.per_node = std::max(s.per_node, count);
  // Regular Megatron groups: domain_gpus / per_node groups of this kind use each domain's
  // NICs at once. A single-domain group uses no NIC.
  const int d = spec_.nvlink_domain_gpus();
  if (s.nodes > 1 && d % s.per_node == 0) s.sharing = d / s.per_node;
  return s;
}

// Bus bandwidth: inside an NVLink domain, the slowest link of a ring through its ranks 0..k-1
// (k = per_node; exact for TP groups, optimistic for strided groups on nvlink_pairs). Across
// domains each domain's NICs (nics_per_node * nodes_per_nvlink_domain * nic_bw /
// oversubscription) are shared by `sharing` concurrent groups; the ring gets min(domain ring,
// domain NIC bandwidth / sharing).
double Topology::BusBandwidth(const GroupShape& g) const {
  if (g.size <= 1) return spec_.gpu.hbm_bw_bytes_per_s;
  const int k = RanksPerDomain(g, spec_.nvlink_domain_gpus());
  double bw = k > 1 ? first_ring_bw_[size_t(k)] : kInf;
  if (g.nodes > 1) {
    const InterNodeSpec& net = spec_.inter;
    const double domain_nic_bw = double(net.nics_per_node) * spec_.nodes_per_nvlink_domain *
                                 net.nic_bw_bytes_per_s / net.oversubscription;
    bw = std::min(bw, domain_nic_bw / std::max(1, g.sharing));
  }
  return bw;
}

double Topology::CollectiveTime(Collective c, const GroupShape& g, double bytes) const {
  if (g.size <= 1) return 0;
  const int k = RanksPerDomain(g, spec_.nvlink_domain_gpus());
  // Across domains the slowest step is the network one: inter_node.latency ("one network hop,
  // end to end"). A lone transfer, Latency(a, b), also pays the GPU-NIC intra hop.
  const double intra_s = k > 1 ? first_ring_lat_[size_t(k)] : 0;
  const double hop_s = g.nodes > 1 ? std::max(spec_.inter.latency_s, intra_s) : intra_s;
  return RingTime(c, g.size, hop_s, BusBandwidth(g), bytes);
}

double Topology::CollectiveTime(Collective c, const std::vector<int>& group,
                                double bytes) const {
  if (group.size() <= 1) return 0;
  if (CrossesDomains(group)) return CollectiveTime(c, ShapeOf(group), bytes);
  const int n = static_cast<int>(group.size());
  if (CrossesNodes(group)) {  // trays of one NVLink domain: the ring in the group's order
    Path ring{kInf, 0};
    for (int i = 0; i < n; ++i) {
      const int a = group[size_t(i)], b = group[size_t((i + 1) % n)];
      ring.bw_bytes_per_s = std::min(ring.bw_bytes_per_s, Bandwidth(a, b));
      ring.latency_s = std::max(ring.latency_s, Latency(a, b));
    }
    return RingTime(c, n, ring.latency_s, ring.bw_bytes_per_s, bytes);
  }
  // Inside one node: the ring in the group's own order, on the exact local links.
  std::vector<int> locals;
  for (int r : group) locals.push_back(r % spec_.gpus_per_node);
  const Path ring = LocalRing(spec_, local_bw_, local_lat_, locals);
  return RingTime(c, static_cast<int>(group.size()), ring.latency_s, ring.bw_bytes_per_s, bytes);
}

double Topology::SendRecvTime(int a, int b, double bytes) const {
  return Latency(a, b) + bytes / Bandwidth(a, b);
}

int Topology::NumVertices() const { return static_cast<int>(boost::num_vertices(graph_->g)); }
int Topology::NumEdges() const { return static_cast<int>(boost::num_edges(graph_->g)); }

}  // namespace ptdp
