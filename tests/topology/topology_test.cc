// Topology: graph size, bandwidth/latency between ranks, group shapes, collective times. Every
// expected number is derived by hand in the comment next to it.
#include "topology/topology.h"

#include <gtest/gtest.h>

#include "tests/fakes/test_cluster.h"

#include <string>
#include <vector>

namespace ptdp {
namespace {

ClusterSpec Load(const std::string& name) {
  auto c = LoadClusterFile(std::string(PTDP_SOURCE_DIR) + "/configs/clusters/" + name + ".yaml");
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? *c : ClusterSpec{};
}

Topology Build(const ClusterSpec& c) {
  auto t = Topology::Build(c);
  EXPECT_TRUE(t.ok()) << t.status().message();
  return std::move(t).value();
}

// A one-node cluster with the given fabric, for the intra-node cases.
ClusterSpec OneNode(IntraFabric fabric, int gpus, double bw, double latency_s) {
  ClusterSpec c;
  c.name = "test";
  c.nodes = 1;
  c.gpus_per_node = gpus;
  c.gpu.name = "G";
  c.gpu.memory_bytes = 1e9;
  c.gpu.hbm_bw_bytes_per_s = 1000e9;
  c.gpu.peak_bf16 = 100e12;
  c.intra = {fabric, bw, latency_s, 0};
  return c;
}

std::vector<int> Ranks(int first, int count, int stride = 1) {
  std::vector<int> v;
  for (int i = 0; i < count; ++i) v.push_back(first + i * stride);
  return v;
}

TEST(BusFactor, NcclTestsFactors) {
  EXPECT_DOUBLE_EQ(BusFactor(Collective::kAllReduce, 8), 1.75);      // 2 * 7 / 8
  EXPECT_DOUBLE_EQ(BusFactor(Collective::kAllGather, 4), 0.75);      // 3 / 4
  EXPECT_DOUBLE_EQ(BusFactor(Collective::kReduceScatter, 2), 0.5);   // 1 / 2
  EXPECT_DOUBLE_EQ(BusFactor(Collective::kAllToAll, 8), 0.875);      // 7 / 8
  EXPECT_DOUBLE_EQ(BusFactor(Collective::kBroadcast, 8), 1.0);
  EXPECT_DOUBLE_EQ(BusFactor(Collective::kSendRecv, 2), 1.0);
  EXPECT_DOUBLE_EQ(BusFactor(Collective::kAllReduce, 1), 0.0);       // 2 * 0 / 1
}

TEST(Collective, Names) {
  EXPECT_STREQ(ToString(Collective::kAllReduce), "all-reduce");
  EXPECT_STREQ(ToString(Collective::kSendRecv), "send-recv");
}

TEST(Topology, ShippedClustersBuild) {
  for (const char* name : {"dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200", "dgx-b300",
                           "gb200-nvl72", "gb300-nvl72", "workstation-pcie4", "local-cpu"}) {
    SCOPED_TRACE(name);
    const ClusterSpec c = Load(name);
    auto t = Topology::Build(c);
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_EQ(t->world(), c.world());
  }
}

// dgx-a100 on 2 nodes: per node 8 GPUs + 1 NVSwitch + 8 NICs = 17 vertices, plus one fabric:
// 35. Edges per node: 8 GPU-NVSwitch + 8 GPU-NIC = 16; 16 NIC-fabric: 2 * 16 + 16 = 48.
// At 128 nodes: 128 * 17 + 1 = 2177 vertices, 128 * 16 + 1024 = 3072 edges.
TEST(Topology, GraphSize) {
  ClusterSpec c = Load("dgx-a100");
  c.nodes = 2;
  Topology two = Build(c);
  EXPECT_EQ(two.NumVertices(), 35);
  EXPECT_EQ(two.NumEdges(), 48);
  Topology full = Build(Load("dgx-a100"));
  EXPECT_EQ(full.NumVertices(), 2177);
  EXPECT_EQ(full.NumEdges(), 3072);
  // workstation: 4 GPUs + 1 PCIe switch, 4 edges, no network.
  Topology ws = Build(Load("workstation-pcie4"));
  EXPECT_EQ(ws.NumVertices(), 5);
  EXPECT_EQ(ws.NumEdges(), 4);
}

// dgx-a100: same node via NVSwitch: 300 GB/s, 1.5 + 1.5 us. Across nodes: min(NIC 25 GB/s,
// NIC->fabric 25 / 1) = 25 GB/s; latency 5 us (inter) + 3 us (two GPU-NIC half hops).
TEST(Topology, DgxA100PairBandwidthAndLatency) {
  Topology t = Build(Load("dgx-a100"));
  EXPECT_DOUBLE_EQ(t.Bandwidth(0, 1), 300e9);
  EXPECT_DOUBLE_EQ(t.Bandwidth(3, 7), 300e9);
  EXPECT_DOUBLE_EQ(t.Latency(0, 1), 3e-6);
  EXPECT_DOUBLE_EQ(t.Bandwidth(0, 8), 25e9);
  EXPECT_DOUBLE_EQ(t.Bandwidth(5, 1023), 25e9);
  EXPECT_DOUBLE_EQ(t.Latency(0, 8), 8e-6);
  EXPECT_DOUBLE_EQ(t.Bandwidth(4, 4), 2039e9);  // a == b: HBM
  EXPECT_DOUBLE_EQ(t.Latency(4, 4), 0);
  EXPECT_EQ(t.NodeOf(15), 1);
  // Point to point: 1 GB across nodes = 8 us + 1e9 / 25e9 s = 0.040008 s.
  EXPECT_DOUBLE_EQ(t.SendRecvTime(0, 8, 1e9), 8e-6 + 0.04);
}

TEST(Topology, CrossesNodes) {
  Topology t = Build(Load("dgx-a100"));
  EXPECT_FALSE(t.CrossesNodes(Ranks(0, 8)));
  EXPECT_TRUE(t.CrossesNodes({7, 8}));
  EXPECT_FALSE(t.CrossesNodes({9}));
}

// All-reduce of 1 GB over the 8 GPUs of one dgx-a100 node: 2 * 7 steps * 3 us +
// 1.75 * 1e9 / 300e9 s = 42 us + 5.8333 ms.
TEST(Topology, AllReduceInsideOneDgxA100Node) {
  Topology t = Build(Load("dgx-a100"));
  const double expected = 14 * 3e-6 + 1.75 * 1e9 / 300e9;
  EXPECT_DOUBLE_EQ(t.CollectiveTime(Collective::kAllReduce, Ranks(0, 8), 1e9), expected);
  const GroupShape g = t.ShapeOf(Ranks(0, 8));
  EXPECT_EQ(g.size, 8);
  EXPECT_EQ(g.per_node, 8);
  EXPECT_EQ(g.nodes, 1);
  EXPECT_EQ(g.sharing, 1);
  EXPECT_DOUBLE_EQ(t.BusBandwidth(g), 300e9);
  EXPECT_DOUBLE_EQ(t.CollectiveTime(Collective::kAllReduce, g, 1e9), expected);
  // Zero bytes: the latency terms alone.
  EXPECT_DOUBLE_EQ(t.CollectiveTime(Collective::kAllReduce, g, 0), 14 * 3e-6);
}

// Other collectives over 4 GPUs of a node, 1 GB: all-gather and reduce-scatter 3 steps * 3 us
// + 0.75 * 1e9 / 300e9; all-to-all the same; broadcast 3 * 3 us + 1e9 / 300e9.
TEST(Topology, OtherCollectivesInsideANode) {
  Topology t = Build(Load("dgx-a100"));
  const std::vector<int> g = Ranks(0, 4);
  const double ag = 3 * 3e-6 + 0.75 * 1e9 / 300e9;
  EXPECT_DOUBLE_EQ(t.CollectiveTime(Collective::kAllGather, g, 1e9), ag);
  EXPECT_DOUBLE_EQ(t.CollectiveTime(Collective::kReduceScatter, g, 1e9), ag);
  EXPECT_DOUBLE_EQ(t.CollectiveTime(Collective::kAllToAll, g, 1e9), ag);
  EXPECT_DOUBLE_EQ(t.CollectiveTime(Collective::kBroadcast, g, 1e9), 3 * 3e-6 + 1e9 / 300e9);
  EXPECT_DOUBLE_EQ(t.CollectiveTime(Collective::kSendRecv, std::vector<int>{0, 1}, 1e9), 3e-6 + 1e9 / 300e9);
}

// DP group with tp = 8 on dgx-a100, 16 nodes: ranks 0, 8, ..., 120; one rank per node, and the
// node's 8 DP groups share its 8 x 25 GB/s NICs: 200e9 / 8 = 25 GB/s. All-reduce of 1 GB:
// 2 * 15 steps * 5 us (inter latency) + 2 * 15 / 16 * 1e9 / 25e9 s = 150 us + 75 ms.
TEST(Topology, DataParallelGroupAcrossNodes) {
  Topology t = Build(Load("dgx-a100"));
  const std::vector<int> dp = Ranks(0, 16, 8);
  const GroupShape g = t.ShapeOf(dp);
  EXPECT_EQ(g.size, 16);
  EXPECT_EQ(g.per_node, 1);
  EXPECT_EQ(g.nodes, 16);
  EXPECT_EQ(g.sharing, 8);
  EXPECT_DOUBLE_EQ(t.BusBandwidth(g), 25e9);
  const double expected = 30 * 5e-6 + 30.0 / 16 * 1e9 / 25e9;
  EXPECT_DOUBLE_EQ(t.CollectiveTime(Collective::kAllReduce, dp, 1e9), expected);
  EXPECT_DOUBLE_EQ(t.CollectiveTime(Collective::kAllReduce, g, 1e9), expected);
}

// tp = 2: the DP group 0, 2, 4, ... has 4 ranks per node and 2 such groups per node:
// min(NVSwitch 300, 200 / 2) = 100 GB/s. 16 consecutive ranks (2 full nodes, one group):
// min(300, 200 / 1) = 200 GB/s.
TEST(Topology, GroupsWithSeveralRanksPerNode) {
  Topology t = Build(Load("dgx-a100"));
  const GroupShape dp = t.ShapeOf(Ranks(0, 8, 2));
  EXPECT_EQ(dp.per_node, 4);
  EXPECT_EQ(dp.nodes, 2);
  EXPECT_EQ(dp.sharing, 2);
  EXPECT_DOUBLE_EQ(t.BusBandwidth(dp), 100e9);
  const GroupShape two_nodes = t.ShapeOf(Ranks(0, 16));
  EXPECT_EQ(two_nodes.sharing, 1);
  EXPECT_DOUBLE_EQ(t.BusBandwidth(two_nodes), 200e9);
  // Irregular: 3 ranks on node 0, 1 on node 1; 3 does not divide 8, so sharing 1.
  const GroupShape odd = t.ShapeOf({0, 1, 2, 8});
  EXPECT_EQ(odd.per_node, 3);
  EXPECT_EQ(odd.nodes, 2);
  EXPECT_EQ(odd.sharing, 1);
}

// Pipeline send/recv between nodes as a group: 1 step * 5 us (inter latency) + 1e9 / 25e9.
// SendRecvTime(0, 8) above also pays the GPU-NIC intra hop (8 us).
TEST(Topology, SendRecvAcrossNodesAsAGroup) {
  Topology t = Build(Load("dgx-a100"));
  EXPECT_DOUBLE_EQ(t.CollectiveTime(Collective::kSendRecv, std::vector<int>{0, 8}, 1e9), 5e-6 + 0.04);
}

TEST(Topology, SingleRankCostsNothing) {
  Topology t = Build(Load("dgx-a100"));
  for (Collective c : {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter,
                       Collective::kAllToAll, Collective::kBroadcast, Collective::kSendRecv}) {
    EXPECT_EQ(t.CollectiveTime(c, std::vector<int>{5}, 1e9), 0);
    EXPECT_EQ(t.CollectiveTime(c, GroupShape{}, 1e9), 0);
  }
}

// Oversubscription 2: a single cross-node pair gets 25 / 2 = 12.5 GB/s, and the tp = 8 DP
// group 8 * 25 / 2 / 8 = 12.5 GB/s.
TEST(Topology, Oversubscription) {
  ClusterSpec c = Load("dgx-a100");
  c.inter.oversubscription = 2;
  Topology t = Build(c);
  EXPECT_DOUBLE_EQ(t.Bandwidth(0, 8), 12.5e9);
  EXPECT_DOUBLE_EQ(t.BusBandwidth(t.ShapeOf(Ranks(0, 4, 8))), 12.5e9);
}

// Fewer NICs than GPUs: 8 GPUs on 4 x 25 GB/s; GPU i uses NIC i / 2. A pair still sees 25 GB/s;
// the tp = 8 DP group 4 * 25 / 8 = 12.5 GB/s.
TEST(Topology, FewerNicsThanGpus) {
  ClusterSpec c = Load("dgx-a100");
  c.nodes = 2;
  c.inter.nics_per_node = 4;
  Topology t = Build(c);
  EXPECT_EQ(t.NumVertices(), 2 * (8 + 1 + 4) + 1);
  EXPECT_DOUBLE_EQ(t.Bandwidth(7, 15), 25e9);
  EXPECT_DOUBLE_EQ(t.BusBandwidth(t.ShapeOf({0, 8})), 12.5e9);
}

// workstation-pcie4: every pair through the PCIe switch, 25 GB/s, 5 + 5 us. All-reduce of 1 GB
// over 4: 6 steps * 10 us + 1.5 * 1e9 / 25e9 = 60 us + 60 ms.
TEST(Topology, PcieWorkstation) {
  Topology t = Build(Load("workstation-pcie4"));
  EXPECT_DOUBLE_EQ(t.Bandwidth(0, 3), 25e9);
  EXPECT_DOUBLE_EQ(t.Latency(0, 3), 10e-6);
  EXPECT_DOUBLE_EQ(t.CollectiveTime(Collective::kAllReduce, Ranks(0, 4), 1e9), 60e-6 + 0.06);
  EXPECT_DOUBLE_EQ(t.BusBandwidth(t.ShapeOf(Ranks(0, 4))), 25e9);
}

// local-cpu: shared memory hub, 5 GB/s and 5 + 5 us between any two slots.
TEST(Topology, LocalCpuSlots) {
  Topology t = Build(Load("local-cpu"));
  EXPECT_DOUBLE_EQ(t.Bandwidth(0, 7), 5e9);
  EXPECT_DOUBLE_EQ(t.Latency(0, 7), 10e-6);
}

// nvlink_pairs, 4 GPUs: 0-1 and 2-3 bridged at 100 GB/s (2 us); others over PCIe at 25 GB/s
// (1 + 1 us). Ring 0-1-2-3-0 crosses PCIe: 25 GB/s. Pair {0,1}: 2 steps * 2 us + 1 * 1e9 / 100e9.
TEST(Topology, NvLinkPairs) {
  ClusterSpec c = OneNode(IntraFabric::kNvLinkPairs, 4, 100e9, 2e-6);
  c.intra.pcie_bw_bytes_per_s = 25e9;
  Topology t = Build(c);
  EXPECT_EQ(t.NumVertices(), 5);   // 4 GPUs + PCIe switch
  EXPECT_EQ(t.NumEdges(), 6);      // 2 bridges + 4 PCIe
  EXPECT_DOUBLE_EQ(t.Bandwidth(0, 1), 100e9);
  EXPECT_DOUBLE_EQ(t.Latency(0, 1), 2e-6);
  EXPECT_DOUBLE_EQ(t.Bandwidth(1, 2), 25e9);
  EXPECT_DOUBLE_EQ(t.Latency(1, 2), 2e-6);
  EXPECT_DOUBLE_EQ(t.CollectiveTime(Collective::kAllReduce, std::vector<int>{0, 1}, 1e9), 4e-6 + 0.01);
  EXPECT_DOUBLE_EQ(t.BusBandwidth(t.ShapeOf(Ranks(0, 4))), 25e9);
  // A strided pair known by its ranks crosses PCIe: 2 * 2 us + 1e9 / 25e9.
  EXPECT_DOUBLE_EQ(t.CollectiveTime(Collective::kAllReduce, std::vector<int>{0, 2}, 1e9), 4e-6 + 0.04);
  // Build rejects nvlink_pairs without a PCIe bandwidth.
  c.intra.pcie_bw_bytes_per_s = 0;
  EXPECT_FALSE(Topology::Build(c).ok());
}

// nvlink_mesh, 4 GPUs at 300 GB/s per GPU: each of the 6 links 100 GB/s. A ring of all 4 runs
// 3 rings at once: 3 * 100 = 300 GB/s; a pair uses its one link: 100 GB/s.
TEST(Topology, NvLinkMesh) {
  Topology t = Build(OneNode(IntraFabric::kNvLinkMesh, 4, 300e9, 2e-6));
  EXPECT_EQ(t.NumVertices(), 4);
  EXPECT_EQ(t.NumEdges(), 6);
  EXPECT_DOUBLE_EQ(t.Bandwidth(0, 3), 100e9);
  EXPECT_DOUBLE_EQ(t.Latency(0, 3), 2e-6);
  EXPECT_DOUBLE_EQ(t.BusBandwidth(t.ShapeOf(Ranks(0, 4))), 300e9);
  EXPECT_DOUBLE_EQ(t.BusBandwidth(t.ShapeOf({0, 1})), 100e9);
}

// Explicit links over a PCIe fallback (10 GB/s, 5 + 5 us): chain 0-1-2-3 at 100 GB/s, 1 us
// each. 0 -> 3: widest path is the chain (100 GB/s, 3 us), not PCIe (10 GB/s, 10 us).
TEST(Topology, ExplicitLinksWidestPath) {
  ClusterSpec c = OneNode(IntraFabric::kPcie, 4, 10e9, 10e-6);
  c.links = {{0, 1, 100e9, 1e-6}, {1, 2, 100e9, 1e-6}, {2, 3, 100e9, 1e-6}};
  Topology t = Build(c);
  EXPECT_DOUBLE_EQ(t.Bandwidth(0, 3), 100e9);
  EXPECT_DOUBLE_EQ(t.Latency(0, 3), 3e-6);
  EXPECT_DOUBLE_EQ(t.Bandwidth(0, 1), 100e9);
}

// Two equally wide routes 0 -> 3: via 1 (1 + 1 us) and via 2 (5 + 5 us); the faster wins.
TEST(Topology, ExplicitLinksFastestAmongWidest) {
  ClusterSpec c = OneNode(IntraFabric::kNvSwitch, 4, 300e9, 3e-6);
  c.links = {{0, 1, 100e9, 1e-6}, {1, 3, 100e9, 1e-6}, {0, 2, 100e9, 5e-6}, {2, 3, 100e9, 5e-6}};
  Topology t = Build(c);
  EXPECT_EQ(t.NumVertices(), 4);  // the links replace the NVSwitch
  EXPECT_DOUBLE_EQ(t.Bandwidth(0, 3), 100e9);
  EXPECT_DOUBLE_EQ(t.Latency(0, 3), 2e-6);
}

TEST(Topology, BuildErrors) {
  // Explicit links replacing an NVSwitch that leave GPU 2 unreachable.
  ClusterSpec islands = OneNode(IntraFabric::kNvSwitch, 4, 300e9, 3e-6);
  islands.file = "islands.yaml";
  islands.links = {{0, 1, 100e9, 1e-6}, {1, 3, 100e9, 1e-6}};
  auto r = Topology::Build(islands);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("islands.yaml"), std::string::npos);
  EXPECT_NE(r.status().message().find("GPU 0 cannot reach GPU 2"), std::string::npos)
      << r.status().message();
  // A link index past the node.
  ClusterSpec bad_link = OneNode(IntraFabric::kPcie, 4, 10e9, 1e-6);
  bad_link.links = {{0, 4, 100e9, 1e-6}};
  EXPECT_FALSE(Topology::Build(bad_link).ok());
  // Several nodes without a network (e.g. --nodes on the workstation file).
  ClusterSpec ws = Load("workstation-pcie4");
  ws.nodes = 2;
  auto w = Topology::Build(ws);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("inter_node"), std::string::npos) << w.status().message();
}

// --- NVLink domains larger than a node (GB200 NVL72: 18 trays of 4 GPUs per rack) ---

// Two NVL72-like racks (tests/fakes/test_cluster.h): per rack 72 GPUs + 1 NVSwitch hub + 72 NICs
// = 145 vertices, plus the fabric: 291. Edges per rack: 72 GPU-hub + 72 GPU-NIC = 144; 144
// NIC-fabric: 2 * 144 + 144 = 432.
TEST(Nvl72, OneHubPerRack) {
  Topology t = Build(testing::Nvl72Like(2));
  EXPECT_EQ(t.world(), 144);
  EXPECT_EQ(t.NumVertices(), 291);
  EXPECT_EQ(t.NumEdges(), 432);
  EXPECT_EQ(t.spec().nvlink_domain_gpus(), 72);
  EXPECT_EQ(t.NodeOf(4), 1);     // tray 1
  EXPECT_EQ(t.DomainOf(71), 0);  // tray 17, still rack 0
  EXPECT_EQ(t.DomainOf(72), 1);
}

// GPUs on two trays of a rack meet at the NVLink switch: 900 GB/s, 1.5 + 1.5 us, as inside a
// tray. Two racks: the NIC's 50 GB/s and 5 us (inter) + 1.5 + 1.5 us (GPU-NIC half hops).
TEST(Nvl72, TraysOfARackTalkOverNvlinkRacksOverTheNics) {
  Topology t = Build(testing::Nvl72Like(2));
  EXPECT_DOUBLE_EQ(t.Bandwidth(0, 1), 900e9);    // same tray
  EXPECT_DOUBLE_EQ(t.Bandwidth(0, 4), 900e9);    // tray 0 -> tray 1
  EXPECT_DOUBLE_EQ(t.Bandwidth(3, 71), 900e9);   // tray 0 -> tray 17
  EXPECT_DOUBLE_EQ(t.Latency(0, 4), 3e-6);
  EXPECT_DOUBLE_EQ(t.Bandwidth(0, 72), 50e9);    // rack 0 -> rack 1
  EXPECT_DOUBLE_EQ(t.Bandwidth(71, 72), 50e9);
  EXPECT_DOUBLE_EQ(t.Latency(0, 72), 8e-6);
  EXPECT_TRUE(t.CrossesNodes({0, 4}));
  EXPECT_FALSE(t.CrossesDomains({0, 4, 71}));
  EXPECT_TRUE(t.CrossesDomains({71, 72}));
}

// A rack's 72 ranks are one NVLink group: per_node 72, one domain, ring at 900 GB/s. All-reduce
// of 1 GB: 2 * 71 steps * 3 us + 2 * 71 / 72 * 1e9 / 900e9 s (both overloads agree).
TEST(Nvl72, RackWideGroupIsAnNvlinkGroup) {
  Topology t = Build(testing::Nvl72Like(2));
  const GroupShape g = t.ShapeOf(Ranks(0, 72));
  EXPECT_EQ(g.per_node, 72);
  EXPECT_EQ(g.nodes, 1);
  EXPECT_EQ(g.sharing, 1);
  EXPECT_DOUBLE_EQ(t.BusBandwidth(g), 900e9);
  const double expected = 142 * 3e-6 + 142.0 / 72 * 1e9 / 900e9;
  EXPECT_DOUBLE_EQ(t.CollectiveTime(Collective::kAllReduce, g, 1e9), expected);
  EXPECT_DOUBLE_EQ(t.CollectiveTime(Collective::kAllReduce, Ranks(0, 72), 1e9), expected);
  // Eight ranks on two trays (a TP 8 group): the same NVLink ring.
  EXPECT_DOUBLE_EQ(t.BusBandwidth(t.ShapeOf(Ranks(0, 8))), 900e9);
}

// Groups across racks share the rack's 72 NICs (72 x 50 GB/s = 3600 GB/s): the tp 8 DP group
// 0, 8, ..., 136 has 9 ranks per rack and 72 / 9 = 8 such groups per rack: min(900, 3600 / 8)
// = 450 GB/s; one rank per rack (stride 72): 72 groups share them, 3600 / 72 = 50 GB/s.
TEST(Nvl72, GroupsAcrossRacksShareTheRacksNics) {
  Topology t = Build(testing::Nvl72Like(2));
  const GroupShape dp = t.ShapeOf(Ranks(0, 18, 8));
  EXPECT_EQ(dp.per_node, 9);
  EXPECT_EQ(dp.nodes, 2);
  EXPECT_EQ(dp.sharing, 8);
  EXPECT_DOUBLE_EQ(t.BusBandwidth(dp), 450e9);
  const GroupShape one_per_rack = t.ShapeOf({5, 77});
  EXPECT_EQ(one_per_rack.sharing, 72);
  EXPECT_DOUBLE_EQ(t.BusBandwidth(one_per_rack), 50e9);
}

// 72 ranks: one NVL72 rack against 9 DGX B200-like nodes (8 x 50 GB/s NICs each). The rack:
// 900 GB/s, 3 us per step. The nodes: min(900, 8 x 50 / 1) = 400 GB/s, and each step waits for
// the network's 5 us. All-reduce of 1 GB: 142 * 3 us + 1.972 GB / 900 GB/s = 2.62 ms against
// 142 * 5 us + 1.972 GB / 400 GB/s = 5.64 ms.
TEST(Nvl72, RackAllReduceBeatsNineDgxNodes) {
  Topology rack = Build(testing::Nvl72Like(1));
  Topology nodes = Build(testing::DgxB200Like(9));
  const std::vector<int> all = Ranks(0, 72);
  const double on_rack = rack.CollectiveTime(Collective::kAllReduce, all, 1e9);
  const double on_nodes = nodes.CollectiveTime(Collective::kAllReduce, all, 1e9);
  EXPECT_DOUBLE_EQ(on_rack, 142 * 3e-6 + 142.0 / 72 * 1e9 / 900e9);
  EXPECT_DOUBLE_EQ(on_nodes, 142 * 5e-6 + 142.0 / 72 * 1e9 / 400e9);
  EXPECT_LT(on_rack, on_nodes);
}

// The shipped gb200-nvl72: 8 racks. Tray to tray in a rack at NVLink's 900 GB/s; rack to rack
// at one ConnectX-7's 50 GB/s (gb300-nvl72: ConnectX-8, 100 GB/s).
TEST(Nvl72, ShippedRacks) {
  Topology gb200 = Build(Load("gb200-nvl72"));
  EXPECT_EQ(gb200.world(), 576);
  EXPECT_EQ(gb200.DomainOf(575), 7);
  EXPECT_DOUBLE_EQ(gb200.Bandwidth(0, 68), 900e9);  // tray 0 -> tray 17
  EXPECT_DOUBLE_EQ(gb200.Bandwidth(0, 72), 50e9);   // rack 0 -> rack 1
  Topology gb300 = Build(Load("gb300-nvl72"));
  EXPECT_DOUBLE_EQ(gb300.Bandwidth(0, 68), 900e9);
  EXPECT_DOUBLE_EQ(gb300.Bandwidth(0, 72), 100e9);
}

// A cluster is whole racks, NVSwitch only: specs built in code (or cut with --nodes) that are
// not are refused, naming both numbers.
TEST(Nvl72, BuildErrors) {
  ClusterSpec partial = testing::Nvl72Like(1);
  partial.nodes = 20;
  auto r = Topology::Build(partial);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("test-nvl72.yaml: nodes 20 is not a whole number of NVLink "
                                      "domains (nodes_per_nvlink_domain: 18)"),
            std::string::npos)
      << r.status().message();
  ClusterSpec pcie = testing::Nvl72Like(1);
  pcie.intra.fabric = IntraFabric::kPcie;
  r = Topology::Build(pcie);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("needs intra_node.fabric nvswitch"), std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace ptdp
