// libFuzzer target: the cluster YAML reader (topology/cluster.h). Any text must give a cluster
// or an error, never a crash, hang or sanitizer report; a cluster it accepts must write back
// (ClusterToYaml) to text it accepts again, and small ones must build a Topology.
#include <cstddef>
#include <cstdint>

#include "core/yaml_reader.h"
#include "fuzz/fuzz_util.h"
#include "topology/cluster.h"
#include "topology/topology.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ptdp;
  auto node = ParseYamlText(fuzz::Text(data, size), "fuzz.yaml");
  if (!node.ok()) return 0;
  auto cluster = ClusterFromYaml(*node, "fuzz.yaml");
  if (!cluster.ok()) return 0;
  const std::string again = ClusterToYaml(*cluster);
  auto node2 = ParseYamlText(again, "again.yaml");
  if (!node2.ok()) fuzz::Broken("ClusterToYaml wrote unparsable YAML: " + node2.status().message());
  auto cluster2 = ClusterFromYaml(*node2, "again.yaml");
  if (!cluster2.ok()) fuzz::Broken("ClusterToYaml output refused: " + cluster2.status().message());
  // Graphs of up to a few thousand GPUs build in milliseconds; bigger ones only cost time.
  if (cluster->world() <= 4096) (void)Topology::Build(*cluster);
  return 0;
}
