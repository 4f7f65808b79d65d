// The fuzz targets' bodies; see targets.h.
#include "fuzz/targets.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <unistd.h>
#include <memory>
#include <utility>
#include <vector>

#include "cli/common.h"
#include "cli/paths.h"
#include "core/model.h"
#include "core/plan.h"
#include "core/yaml_reader.h"
#include "cost_model/analytic.h"
#include "cost_model/hardware_table.h"
#include "cost_model/simulator.h"
#include "planner/planner.h"
#include "runtime/checkpoint.h"
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

// Steps of more pipeline slots than this are not simulated: they are valid, and only cost time.
constexpr int64_t kMaxSimulatedSlots = 4096;

// An estimate of an accepted input is a number in range (CheckEstimate), and so is the
// simulation of its layout when that is quick.
void CheckLayoutEstimates(const AnalyticModel& cost, const Layout& l) {
  const Status st = CheckEstimate(l, cost.Evaluate(l));
  if (!st.ok()) Broken("accepted input, estimate out of range: " + st.message());
  if (int64_t(l.pp) * l.vp * l.num_microbatches() > kMaxSimulatedSlots) return;
  SimOptions opt;
  opt.record_events = false;
  auto sim = SimulateStep(cost, l, opt);
  if (!sim.ok()) Broken("accepted input, simulation failed: " + sim.status().message());
}

// The planner's search of `model` on `gpus` GPUs of the cluster (global batch 4 per GPU, the
// cluster's precision): every layout it scores must have an estimate in range (SearchLayouts
// fails otherwise), and its best layout simulates. Searches the runtime model would refuse to
// set up (CheckSearchSpace, the cluster's calibration) are skipped: they are the readers' to
// report.
void CheckPlannerEstimates(const ModelSpec& model, const ClusterSpec& cluster,
                           const Topology& topo, int gpus) {
  auto cost = AnalyticModel::Create(model, topo);
  if (!cost.ok()) return;
  SearchSpace s;
  s.world = gpus;
  s.global_batch = 4 * int64_t(gpus);
  s.precision = cluster.gpu.DefaultPrecision();
  s.max_micro_batch = 4;  // fewer candidates per call; the shapes that matter are t, p, d, v
  if (!CheckSearchSpace(model, cluster, s).ok()) return;
  auto plan = SearchLayouts(*cost, model, cluster, s, 1);
  if (!plan.ok()) Broken("accepted input, planner: " + plan.status().message());
  if (!plan->top.empty()) CheckLayoutEstimates(*cost, plan->top.front().layout);
}

// A shipped config by name (share/ptdp/configs beside the binary, as `ptdp` finds them: no
// path of the checkout is compiled in).
std::string ShippedConfig(const std::string& kind, const std::string& name) {
  auto p = cli::ResolveConfig(kind, name);
  if (!p.ok()) Broken(p.status().message());
  return *p;
}

// The shipped gpt-tiny (8 layers, 4 heads: tp 1-4, pp 1-8, interleaving) for fuzzed clusters.
const ModelSpec& TinyModel() {
  static const ModelSpec m = [] {
    auto r = LoadModelFile(ShippedConfig("models", "gpt-tiny"));
    if (!r.ok()) Broken("configs/models/gpt-tiny.yaml: " + r.status().message());
    return *r;
  }();
  return m;
}

// Shipped clusters for fuzzed models: local-cpu (one node, no network: issue 12's NaNs) and
// dgx-a100 cut to 2 nodes (groups across the network).
struct ShippedCluster {
  ClusterSpec spec;
  std::unique_ptr<Topology> topo;
};
const std::vector<ShippedCluster>& ModelClusters() {
  static const std::vector<ShippedCluster> clusters = [] {
    std::vector<ShippedCluster> v;
    for (const auto& [name, nodes] : {std::pair{"local-cpu", 1}, std::pair{"dgx-a100", 2}}) {
      auto c = LoadClusterFile(ShippedConfig("clusters", name));
      if (!c.ok()) Broken(std::string(name) + ": " + c.status().message());
      c->nodes = nodes;
      auto t = Topology::Build(*c);
      if (!t.ok()) Broken(std::string(name) + ": " + t.status().message());
      v.push_back({*c, std::make_unique<Topology>(std::move(*t))});
    }
    return v;
  }();
  return clusters;
}

void CheckModelEstimates(const ModelSpec& m) {
  for (const ShippedCluster& c : ModelClusters())
    CheckPlannerEstimates(m, c.spec, *c.topo, c.spec.world());
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
  if (cluster.world() > 4096) return Status::Ok();
  PTDP_ASSIGN_OR_RETURN(Topology topo, Topology::Build(cluster));
  // The calibration's constants, each in its range (the cost model refuses the cluster otherwise).
  PTDP_RETURN_IF_ERROR(ConstantsFor(cluster).status());
  // gpt-tiny on up to a node's worth and up to 64 GPUs of it: every estimate a number.
  CheckPlannerEstimates(TinyModel(), cluster, topo, std::min(cluster.world(), 8));
  if (cluster.world() > 8)
    CheckPlannerEstimates(TinyModel(), cluster, topo, std::min(cluster.world(), 64));
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
  CheckModelEstimates(m);
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
  CheckModelEstimates(m);
  return Status::Ok();
}

Status FuzzLayoutFlags(const std::string& text) {
  static const std::string cluster = ShippedConfig("clusters", "dgx-a100");
  static const std::string model = ShippedConfig("models", "gpt3-13b");
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
  PTDP_ASSIGN_OR_RETURN(cli::World w, cli::LoadWorld(cluster, model, f.nodes, f.gpus, f.seq_len));
  auto layout = cli::LayoutFromFlags(f, w);
  if (layout.ok() && f.dp.empty() && layout->world() != w.gpus)
    Broken("LayoutFromFlags gave " + std::to_string(layout->world()) + " ranks for " +
           std::to_string(w.gpus) + " GPUs");
  if (layout.ok()) CheckLayoutEstimates(*w.cost, *layout);
  auto space = cli::SpaceFromFlags(f, w);
  PTDP_RETURN_IF_ERROR(space.status());
  if (space->world <= 64) {  // bigger searches are valid, and only cost time
    auto plan = SearchLayouts(*w.cost, w.model, w.cluster, *space, 1);
    if (!plan.ok()) Broken("accepted flags, planner: " + plan.status().message());
  }
  return layout.status();
}

namespace {

// The part of `text` after the line `mark` up to the next "\n=== " line (or the end); "" and
// false when there is no such line. `text` is cut at the first mark line.
bool Cut(std::string* text, const std::string& mark, std::string* part) {
  const std::string line = "\n=== " + mark + "\n";
  const size_t at = text->find(line);
  if (at == std::string::npos) return false;
  *part = text->substr(at + line.size());
  text->resize(at);
  return true;
}

// Every occurrence of `from` in *s replaced by `to`.
void ReplaceAll(std::string* s, const std::string& from, const std::string& to) {
  for (size_t at = s->find(from); at != std::string::npos; at = s->find(from, at + to.size()))
    s->replace(at, from.size(), to);
}

}  // namespace

Status FuzzCheckpoint(const std::string& input) {
  if (input.size() > (size_t(1) << 20)) return Status::Error("an input of at most 1 MiB");
  static const std::string dir = [] {
    const std::string d = (std::filesystem::temp_directory_path() /
                           ("ptdp-fuzz-checkpoint-" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(d);
    return d;
  }();
  for (const auto& e : std::filesystem::directory_iterator(dir)) std::filesystem::remove(e.path());
  std::string text = input, data, shard;
  Cut(&text, "data", &data);  // the data part ends the input
  const bool sharded = Cut(&text, "shard", &shard);
  const std::string path = dir + "/step-00000001.ckpt";
  if (sharded) {
    // The shard under each plain name the manifest lists, then the manifest with its record.
    std::vector<std::string> names;
    if (auto root = ParseYamlText(text, "fuzz manifest"); root.ok() && root->IsMap() &&
                                                           (*root)["shards"].IsSequence())
      for (const auto& item : (*root)["shards"])
        if (item.IsMap() && item["file"] && item["file"].IsScalar() && names.size() < 4) {
          const std::string name = item["file"].Scalar();
          if (!name.empty() && name.size() < 100 && name.find('/') == std::string::npos &&
              name[0] != '.' && name.find('\0') == std::string::npos)
            names.push_back(name);
        }
    rt::ShardRecord rec;
    for (const std::string& name : names) {
      auto r = rt::WriteCheckpointContainer(dir + "/" + name, 2, shard, data);
      if (!r.ok()) Broken("cannot write the fuzz shard: " + r.status().message());
      rec = *r;
    }
    char crc[16];
    std::snprintf(crc, sizeof crc, "0x%08x", rec.crc32c);
    ReplaceAll(&text, "BYTES", std::to_string(rec.bytes));
    ReplaceAll(&text, "CRC", crc);
    data.clear();
  }
  auto w = rt::WriteCheckpointContainer(path, sharded ? 2 : 1, text, data);
  if (!w.ok()) Broken("cannot write the fuzz checkpoint: " + w.status().message());
  PTDP_ASSIGN_OR_RETURN(rt::Checkpoint c, rt::ReadCheckpoint(path));
  for (const rt::NamedTensor& t : c.state.tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    if (int64_t(t.data.size()) != n) Broken("accepted tensor '" + t.name + "' with the wrong size");
  }
  if (c.read_shards > c.shards) Broken("read more shards than the manifest lists");
  // Every other tensor: the filtered read must give exactly those, with the same bits.
  size_t k = 0;
  auto half = rt::ReadCheckpoint(path, [&k](const std::string&) { return k++ % 2 == 0; });
  if (!half.ok()) Broken("the whole read worked, the filtered one not: " + half.status().message());
  if (half->state.tensors.size() != (c.state.tensors.size() + 1) / 2)
    Broken("the filtered read kept " + std::to_string(half->state.tensors.size()) + " of " +
           std::to_string(c.state.tensors.size()) + " tensors");
  for (size_t i = 0; i < half->state.tensors.size(); ++i) {
    const rt::NamedTensor &a = half->state.tensors[i], &b = c.state.tensors[2 * i];
    if (a.name != b.name || a.data.size() != b.data.size() ||
        std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(float)) != 0)
      Broken("the filtered read's '" + a.name + "' differs from the whole read's");
  }
  return Status::Ok();
}

}  // namespace ptdp::fuzz
