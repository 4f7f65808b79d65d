// `ptdp topo`: what the cluster file describes, as the cost model sees it.
#include <cstdio>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/units.h"

namespace ptdp::cli {
namespace {

struct TopoFlags {
  std::string cluster;
  std::optional<int> nodes;
  bool json = false;
};

void PrintNodePicture(const ClusterSpec& c) {
  const int g = c.gpus_per_node;
  std::string gpus;
  for (int i = 0; i < g; ++i) gpus += "[GPU" + std::to_string(i) + "]";
  std::printf("one node:\n  %s\n", gpus.c_str());
  std::string bar(gpus.size(), '-');
  std::printf("  %s\n", bar.c_str());
  std::printf("  %s: %s per GPU per direction, %s per hop\n", ToString(c.intra.fabric),
              FormatBandwidth(c.intra.bw_bytes_per_s).c_str(),
              FormatSeconds(c.intra.latency_s).c_str());
  if (c.inter.nics_per_node > 0) {
    std::string nics;
    for (int i = 0; i < c.inter.nics_per_node; ++i) nics += "[NIC" + std::to_string(i) + "]";
    std::printf("  %s\n  %d x %s to the fabric (oversubscription %.2g), %s\n", nics.c_str(),
                c.inter.nics_per_node, FormatBandwidth(c.inter.nic_bw_bytes_per_s).c_str(),
                c.inter.oversubscription, FormatSeconds(c.inter.latency_s).c_str());
  }
  if (c.nodes_per_nvlink_domain > 1)
    std::printf("  NVLink domain: %d nodes x %d GPUs = %d GPUs on one NVSwitch fabric (%d domains);\n"
                "  the NICs carry only what crosses domains\n",
                c.nodes_per_nvlink_domain, g, c.nvlink_domain_gpus(), c.nvlink_domains());
}

// How rank 0 reaches `b`: its node, another node of its NVLink domain, or another domain.
const char* PeerNote(const ClusterSpec& c, int b) {
  if (b >= c.nvlink_domain_gpus()) return c.nodes_per_nvlink_domain > 1 ? "  (next NVLink domain)"
                                                                        : "  (next node)";
  if (b >= c.gpus_per_node) return "  (next node, same NVLink domain)";
  return "";
}

int RunTopo(const TopoFlags& f) {
  auto file = ResolveConfig("clusters", f.cluster);
  if (!file.ok()) return Fail(file.status().Prefixed("--cluster").message());
  auto spec = LoadClusterFile(*file);
  if (!spec.ok()) return Fail(spec.status().message());
  ClusterSpec c = *spec;
  if (f.nodes) {
    if (*f.nodes <= 0) return Fail("--nodes " + std::to_string(*f.nodes) + " must be positive");
    c.nodes = *f.nodes;
  }
  auto topo = Topology::Build(c);
  if (!topo.ok()) return Fail(topo.status().message());
  const int g = c.gpus_per_node, domain = c.nvlink_domain_gpus();
  std::vector<int> peers;
  for (int i = 1; i < g; ++i) peers.push_back(i);
  if (c.nodes > 1) peers.push_back(g);  // first GPU of the next node
  if (domain > g && c.nodes > c.nodes_per_nvlink_domain) peers.push_back(domain);  // next domain
  if (f.json) {
    nlohmann::json j = {{"name", c.name}, {"nodes", c.nodes}, {"gpus_per_node", g},
                        {"nodes_per_nvlink_domain", c.nodes_per_nvlink_domain},
                        {"nvlink_domain_gpus", domain},
                        {"world", c.world()}, {"gpu", c.gpu.name},
                        {"memory_bytes", c.gpu.memory_bytes},
                        {"vertices", topo->NumVertices()}, {"edges", topo->NumEdges()}};
    nlohmann::json rows = nlohmann::json::array();
    for (int b : peers)
      rows.push_back({{"from", 0}, {"to", b}, {"bw_bytes_per_s", topo->Bandwidth(0, b)},
                      {"latency_s", topo->Latency(0, b)}});
    j["pairs"] = rows;
    std::cout << DumpJson(j) << "\n";
    return 0;
  }
  std::printf("%s: %d nodes x %d %s (%s, %s HBM), %d GPUs\n", c.name.c_str(), c.nodes, g,
              c.gpu.name.c_str(), FormatBytes(c.gpu.memory_bytes).c_str(),
              FormatBandwidth(c.gpu.hbm_bw_bytes_per_s).c_str(), c.world());
  std::printf("peak: bf16 %s, fp8 %s, fp4 %s, fp32 training %s\n",
              FormatFlopRate(c.gpu.peak_bf16).c_str(),
              c.gpu.peak_fp8 > 0 ? FormatFlopRate(c.gpu.peak_fp8).c_str() : "-",
              c.gpu.peak_fp4 > 0 ? FormatFlopRate(c.gpu.peak_fp4).c_str() : "-",
              FormatFlopRate(c.gpu.PeakFlops(Precision::kFp32)).c_str());
  std::printf("graph: %d vertices, %d edges\n\n", topo->NumVertices(), topo->NumEdges());
  PrintNodePicture(c);
  std::printf("\n%-8s %-8s %14s %12s\n", "from", "to", "bandwidth", "latency");
  for (int b : peers)
    std::printf("rank 0   rank %-3d %14s %12s%s\n", b, FormatBandwidth(topo->Bandwidth(0, b)).c_str(),
                FormatSeconds(topo->Latency(0, b)).c_str(), PeerNote(c, b));
  std::printf("\ncollective bus bandwidth (nccl-tests busbw, before NCCL efficiency):\n");
  for (int n = 2; n <= c.world(); n *= 2) {
    const GroupShape sh = RegularGroupShape(1, n, domain);
    std::printf("  %5d consecutive ranks: %12s   all-reduce of 1 GiB: %s\n", n,
                FormatBandwidth(topo->BusBandwidth(sh)).c_str(),
                FormatSeconds(topo->CollectiveTime(Collective::kAllReduce, sh, 1073741824.0)).c_str());
    if (n >= 4 * domain) break;
  }
  return 0;
}

}  // namespace

Runner SetupTopo(CLI::App* sub) {
  auto f = std::make_shared<TopoFlags>();
  sub->add_option("--cluster", f->cluster, "cluster YAML")->required();
  sub->add_option("--nodes", f->nodes, "override the node count");
  sub->add_flag("--json", f->json, "machine-readable output");
  return [f] { return RunTopo(*f); };
}

}  // namespace ptdp::cli
