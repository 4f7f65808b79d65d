// The fuzz targets' bodies; see targets.h.
#include "fuzz/targets.h"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cli/common.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/yaml_reader.h"
#include "topology/cluster.h"
#include "topology/topology.h"

namespace ptdp::fuzz {
namespace {

// A property violated: print why and abort, so that libFuzzer records the input.
[[noreturn]] void Broken(const std::string& what) {
  std::fprintf(stderr, "fuzz property broken: %s\n", what.c_str());
  std::abort();
}

void Counts(const ModelSpec& m, const std::string& file) {
  Status v = ValidateModel(m, file);
  if (!v.ok()) Broken("accepted a model ValidateModel refuses: " + v.message());
  (void)m.total_params();
  (void)m.embedding_params(8);
  (void)m.output_params(8);
  (void)m.linear_params_per_layer();
}

}  // namespace

Status FuzzCluster(const std::string& text) {
  PTDP_ASSIGN_OR_RETURN(YAML::Node node, ParseYamlText(text, "fuzz.yaml"));
  PTDP_ASSIGN_OR_RETURN(ClusterSpec cluster, ClusterFromYaml(node, "fuzz.yaml"));
  auto node2 = ParseYamlText(ClusterToYaml(cluster), "again.yaml");
  if (!node2.ok()) Broken("ClusterToYaml wrote unparsable YAML: " + node2.status().message());
  auto cluster2 = ClusterFromYaml(*node2, "again.yaml");
  if (!cluster2.ok()) Broken("ClusterToYaml output refused: " + cluster2.status().message());
  // Graphs of up to a few thousand GPUs build in milliseconds; bigger ones only cost time.
  if (cluster.world() <= 4096) return Topology::Build(cluster).status();
  return Status::Ok();
}

Status FuzzModel(const std::string& text) {
  PTDP_ASSIGN_OR_RETURN(YAML::Node node, ParseYamlText(text, "fuzz.yaml"));
  PTDP_ASSIGN_OR_RETURN(ModelSpec m, ModelFromYaml(node, "fuzz.yaml", ""));
  Counts(m, "fuzz.yaml");
  auto node2 = ParseYamlText(ModelToYaml(m, ""), "again.yaml");
  if (!node2.ok()) Broken("ModelToYaml wrote unparsable YAML: " + node2.status().message());
  auto m2 = ModelFromYaml(*node2, "again.yaml", "");
  if (!m2.ok()) Broken("ModelToYaml output refused: " + m2.status().message());
  if (ModelToYaml(*m2, "") != ModelToYaml(m, "")) Broken("model round trip changed it");
  return Status::Ok();
}

Status FuzzPlan(const std::string& text) {
  PTDP_ASSIGN_OR_RETURN(Plan plan, PlanFromYamlText(text, "fuzz.plan.yaml"));
  const std::string again = PlanToYaml(plan);
  auto plan2 = PlanFromYamlText(again, "again.plan.yaml");
  if (!plan2.ok()) Broken("PlanToYaml output refused: " + plan2.status().message());
  if (PlanToYaml(*plan2) != again) Broken("plan round trip changed it");
  return Status::Ok();
}

Status FuzzHfConfig(const std::string& text) {
  PTDP_ASSIGN_OR_RETURN(ModelSpec m, ImportHfConfigText(text, "fuzz/config.json"));
  Counts(m, "fuzz/config.json");
  return Status::Ok();
}

Status FuzzLayoutFlags(const std::string& text) {
  static const std::string src = PTDP_SOURCE_DIR;
  if (text.size() > 4096) return Status::Error("a command line, not a file");
  std::vector<std::string> args;
  std::string cur;
  for (char c : text) {
    if (c == '\n') {
      args.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) args.push_back(cur);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
  CLI::App app{"fuzz"};
  cli::LayoutFlags f;
  cli::AddLayoutFlags(&app, &f, false);
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return Status::Error(std::string("flags: ") + e.what());
  }
  // Bigger worlds are valid but only cost time to build (the graph has a node per GPU).
  if (f.nodes && (*f.nodes < 0 || *f.nodes > 64)) return Status::Error("--nodes beyond 64");
  PTDP_ASSIGN_OR_RETURN(cli::World w, cli::LoadWorld(src + "/configs/clusters/dgx-a100.yaml",
                                                     src + "/configs/models/gpt3-13b.yaml",
                                                     f.nodes, f.gpus, f.seq_len));
  auto layout = cli::LayoutFromFlags(f, w);
  if (layout.ok() && !f.dp && layout->world() != w.gpus)
    Broken("LayoutFromFlags gave " + std::to_string(layout->world()) + " ranks for " +
           std::to_string(w.gpus) + " GPUs");
  PTDP_RETURN_IF_ERROR(cli::SpaceFromFlags(f, w).status());
  return layout.status();
}

}  // namespace ptdp::fuzz
