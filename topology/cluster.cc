// Cluster YAML reading (strict, every error names file:line, key and value) and writing.
#include "topology/cluster.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>
#include <utility>

#include "core/limits.h"
#include "core/yaml_reader.h"

namespace ptdp {

double GpuSpec::PeakFlops(Precision p) const {
  switch (p) {
    case Precision::kBf16: return peak_bf16;
    case Precision::kFp16: return peak_fp16;
    case Precision::kFp8: return peak_fp8;
    case Precision::kFp4: return peak_fp4;
    case Precision::kFp32: return peak_tf32 > 0 ? peak_tf32 : peak_fp32;  // TF32 tensor cores
  }
  return 0;
}

Precision GpuSpec::DefaultPrecision() const {
  if (peak_bf16 > 0) return Precision::kBf16;
  if (peak_fp16 > 0) return Precision::kFp16;
  return Precision::kFp32;
}

const char* ToString(IntraFabric f) {
  switch (f) {
    case IntraFabric::kNvSwitch: return "nvswitch";
    case IntraFabric::kNvLinkMesh: return "nvlink_mesh";
    case IntraFabric::kNvLinkPairs: return "nvlink_pairs";
    case IntraFabric::kPcie: return "pcie";
    case IntraFabric::kSharedMemory: return "shared_memory";
  }
  return "?";
}

namespace {

constexpr IntraFabric kFabrics[] = {IntraFabric::kNvSwitch, IntraFabric::kNvLinkMesh,
                                    IntraFabric::kNvLinkPairs, IntraFabric::kPcie,
                                    IntraFabric::kSharedMemory};

// The shortest plain number that reads back exactly ("0.8", not "0.80000000000000004").
std::string Number(double v) {
  char buf[64];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

// The first failed status of a reading sequence, or OK.
Status FirstError(std::initializer_list<Status> all) {
  for (const Status& s : all)
    if (!s.ok()) return s;
  return Status::Ok();
}

// A required latency: present (zero allowed) or an error naming the key.
double RequiredLatency(YamlReader& r, const std::string& key) {
  return r.Quantity(key, limits::kLatency);
}

Status ReadGpu(const YAML::Node& node, const std::string& file, GpuSpec* gpu) {
  YamlReader r(node, file, "gpu");
  gpu->name = r.String("name");
  gpu->memory_bytes = r.Quantity("memory", limits::kGpuMemory);
  gpu->hbm_bw_bytes_per_s = r.Quantity("hbm_bandwidth", limits::kBandwidth);
  gpu->host_bw_bytes_per_s = r.Quantity("host_bandwidth", limits::kBandwidth, 0);
  gpu->host_memory_bytes = r.Quantity("host_memory", limits::kGpuMemory, 0);
  gpu->sms = r.NonNegativeIntAtMost("sms", 4096, 0);
  if (!r.Has("peak")) r.Fail("peak", "missing required key");
  const YAML::Node peak_node = r.Child("peak");
  PTDP_RETURN_IF_ERROR(r.Finish());
  // Dense tensor-core peaks; an absent precision is unsupported (0).
  YamlReader p(peak_node, file, "gpu.peak");
  gpu->peak_bf16 = p.Quantity("bf16", limits::kPeakFlops, 0);
  gpu->peak_fp16 = p.Quantity("fp16", limits::kPeakFlops, 0);
  gpu->peak_fp8 = p.Quantity("fp8", limits::kPeakFlops, 0);
  gpu->peak_fp4 = p.Quantity("fp4", limits::kPeakFlops, 0);
  gpu->peak_tf32 = p.Quantity("tf32", limits::kPeakFlops, 0);
  gpu->peak_fp32 = p.Quantity("fp32", limits::kPeakFlops, 0);
  if (gpu->peak_bf16 <= 0 && gpu->peak_fp16 <= 0 && gpu->peak_fp32 <= 0)
    p.Fail("bf16", "no training peak: give at least one of bf16, fp16 or fp32");
  return p.Finish();
}

Status ReadIntra(const YAML::Node& node, const std::string& file, IntraNodeSpec* intra) {
  YamlReader r(node, file, "intra_node");
  std::vector<std::string> names;
  for (IntraFabric f : kFabrics) names.push_back(ToString(f));
  if (!r.Has("fabric")) r.Fail("fabric", "missing required key");
  const std::string fabric = r.Enum("fabric", names, ToString(IntraFabric::kNvSwitch));
  for (IntraFabric f : kFabrics)
    if (fabric == ToString(f)) intra->fabric = f;
  intra->bw_bytes_per_s = r.Quantity("bandwidth", limits::kBandwidth);
  intra->latency_s = RequiredLatency(r, "latency");
  if (intra->fabric == IntraFabric::kNvLinkPairs && !r.Has("pcie_bandwidth"))
    r.Fail("pcie_bandwidth", "missing: required for fabric nvlink_pairs (the non-bridged pairs)");
  intra->pcie_bw_bytes_per_s = r.Quantity("pcie_bandwidth", limits::kBandwidth, 0);
  return r.Finish();
}

Status ReadInter(const YAML::Node& node, const std::string& file, InterNodeSpec* inter) {
  YamlReader r(node, file, "inter_node");
  inter->nics_per_node = r.PositiveIntAtMost("nics_per_node", kMaxClusterGpus);
  inter->nic_bw_bytes_per_s = r.Quantity("nic_bandwidth", limits::kBandwidth);
  inter->latency_s = RequiredLatency(r, "latency");
  inter->oversubscription = r.Number("oversubscription", limits::kOversubscription, 1);
  return r.Finish();
}

// A required non-negative integer (GPU index of a link).
int RequiredIndex(YamlReader& r, const std::string& key) {
  if (!r.Has(key)) r.Fail(key, "missing required key");
  return r.NonNegativeIntAtMost(key, kMaxClusterGpus, 0);
}

Status ReadLinks(const YAML::Node& node, const std::string& file, int gpus_per_node,
                 std::vector<LinkSpec>* links) {
  if (!node.IsSequence()) {
    return Status::Error(file + ":" + std::to_string(node.Mark().line + 1) +
                         ": links: expected a list of {a, b, bandwidth, latency}");
  }
  std::set<std::pair<int, int>> seen;
  for (size_t i = 0; i < node.size(); ++i) {
    YamlReader r(node[i], file, "links[" + std::to_string(i) + "]");
    LinkSpec l;
    l.a = RequiredIndex(r, "a");
    l.b = RequiredIndex(r, "b");
    l.bw_bytes_per_s = r.Quantity("bandwidth", limits::kBandwidth);
    l.latency_s = RequiredLatency(r, "latency");
    const std::string range = " is not a GPU of the node (gpus_per_node: " +
                              std::to_string(gpus_per_node) + ")";
    if (l.a >= gpus_per_node) r.Fail("a", "'" + std::to_string(l.a) + "'" + range);
    if (l.b >= gpus_per_node) r.Fail("b", "'" + std::to_string(l.b) + "'" + range);
    if (l.a == l.b) r.Fail("b", "'" + std::to_string(l.b) + "' links GPU " + std::to_string(l.a) +
                                     " to itself");
    if (!seen.insert({std::min(l.a, l.b), std::max(l.a, l.b)}).second)
      r.Fail("b", "'" + std::to_string(l.b) + "': GPUs " + std::to_string(l.a) + " and " +
                      std::to_string(l.b) + " are already linked");
    PTDP_RETURN_IF_ERROR(r.Finish());
    links->push_back(l);
  }
  return Status::Ok();
}

// The range of a calibrated constant, by its name's suffix (cost_model/hardware_table.cc names
// them with their unit: host_kernel_s, workspace_bytes, optimizer_bytes_per_param).
const Range& CalibrationRange(const std::string& key) {
  const auto ends = [&](const char* suffix) {
    const std::string s(suffix);
    return key.size() >= s.size() && key.compare(key.size() - s.size(), s.size(), s) == 0;
  };
  if (ends("_s")) return limits::kCalibrationSeconds;
  if (key.find("_bytes") != std::string::npos) return limits::kCalibrationBytes;
  return limits::kCalibrationNumber;
}

// `calibration:` map of constant name -> plain number (the cost model checks the names).
Status ReadCalibration(const YAML::Node& node, const std::string& file,
                       std::map<std::string, double>* out) {
  const std::string where = file + ":" + std::to_string(node.Mark().line + 1);
  if (!node.IsMap()) return Status::Error(where + ": calibration: expected a map of name: number");
  for (auto it = node.begin(); it != node.end(); ++it) {
    const std::string key = it->first.Scalar();
    const std::string at = file + ":" + std::to_string(it->first.Mark().line + 1) +
                           ": calibration." + key;
    // Constants are named in lower case, digits and '_' (cost_model/hardware_table.cc).
    const bool name_ok = !key.empty() && std::all_of(key.begin(), key.end(), [](char ch) {
      return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_';
    });
    if (!name_ok)
      return Status::Error(file + ":" + std::to_string(it->first.Mark().line + 1) +
                           ": calibration: '" + EscapeBytes(key) +
                           "' is not a constant's name (lower case, digits, '_')");
    const std::string text = it->second.IsScalar() ? it->second.Scalar() : "";
    double v = 0;
    if (!ParsePlainNumber(text, &v)) return Status::Error(at + ": '" + text + "' is not a plain number");
    PTDP_RETURN_IF_ERROR(CheckRange(v, CalibrationRange(key), "'" + text + "'").Prefixed(at));
    (*out)[key] = v;
  }
  return Status::Ok();
}

}  // namespace

Result<ClusterSpec> ClusterFromYaml(const YAML::Node& node, const std::string& file) {
  YamlReader r(node, file, "");
  ClusterSpec c;
  c.file = file;
  c.name = r.String("name");
  r.String("description", "");  // free text, ignored
  c.nodes = r.PositiveIntAtMost("nodes", kMaxClusterGpus);
  c.gpus_per_node = r.PositiveIntAtMost("gpus_per_node", kMaxClusterGpus);
  if (int64_t(c.nodes) * c.gpus_per_node > kMaxClusterGpus)
    r.Fail("gpus_per_node", std::to_string(c.nodes) + " nodes x " +
                                std::to_string(c.gpus_per_node) + " GPUs is above the " +
                                std::to_string(kMaxClusterGpus) + "-GPU limit");
  // Rack-scale NVLink (GB200 NVL72: 18 trays of 4); the cluster is whole domains (racks): a
  // partial last rack would be a smaller NVLink domain, which one number cannot describe.
  c.nodes_per_nvlink_domain = r.PositiveIntAtMost("nodes_per_nvlink_domain", kMaxClusterGpus, 1);
  if (c.nodes % c.nodes_per_nvlink_domain != 0)
    r.Fail("nodes_per_nvlink_domain",
           "'" + std::to_string(c.nodes_per_nvlink_domain) + "' does not divide nodes '" +
               std::to_string(c.nodes) + "' (the cluster is a whole number of NVLink domains)");
  for (const char* key : {"gpu", "intra_node"})
    if (!r.Has(key)) r.Fail(key, "missing required key");
  if (c.nodes > 1 && !r.Has("inter_node"))
    r.Fail("inter_node", "missing: required when nodes > 1 (nodes: " + std::to_string(c.nodes) +
                             ")");
  const YAML::Node gpu = r.Child("gpu"), intra = r.Child("intra_node"),
                   inter = r.Child("inter_node"), links = r.Child("links"),
                   calibration = r.Child("calibration"), measured = r.Child("measured");
  PTDP_RETURN_IF_ERROR(r.Finish());
  PTDP_RETURN_IF_ERROR(FirstError({
      ReadGpu(gpu, file, &c.gpu),
      ReadIntra(intra, file, &c.intra),
      inter.IsDefined() && !inter.IsNull() ? ReadInter(inter, file, &c.inter) : Status::Ok(),
      links.IsDefined() && !links.IsNull() ? ReadLinks(links, file, c.gpus_per_node, &c.links)
                                           : Status::Ok(),
      calibration.IsDefined() && !calibration.IsNull()
          ? ReadCalibration(calibration, file, &c.calibration)
          : Status::Ok(),
  }));
  if (c.nodes_per_nvlink_domain > 1 &&
      (c.intra.fabric != IntraFabric::kNvSwitch || !c.links.empty()))
    return Status::Error(r.Where("nodes_per_nvlink_domain") + ": nodes_per_nvlink_domain: '" +
                         std::to_string(c.nodes_per_nvlink_domain) +
                         "' needs intra_node.fabric nvswitch and no links (NVLink switches join "
                         "the domain's nodes), not fabric '" + ToString(c.intra.fabric) + "'" +
                         (c.links.empty() ? "" : " with links"));
  if (measured.IsDefined() && !measured.IsNull()) {
    PTDP_ASSIGN_OR_RETURN(c.measured, MeasuredFromYaml(measured, file));
  }
  return c;
}

Result<ClusterSpec> LoadClusterFile(const std::string& path) {
  PTDP_ASSIGN_OR_RETURN(YAML::Node node, LoadYamlFile(path, "a cluster YAML"));
  return ClusterFromYaml(node, path);
}

namespace {

// Units tried when writing a quantity, in order of preference (names as core/units.cc reads).
std::vector<std::pair<const char*, double>> WriteUnits(Dimension dim) {
  switch (dim) {
    case Dimension::kBytes: return {{"GiB", 1073741824.0}, {"GB", 1e9}, {"MiB", 1048576.0},
                                    {"MB", 1e6}, {"TB", 1e12}, {"B", 1}};
    case Dimension::kBandwidth: return {{"GB/s", 1e9}, {"Gb/s", 1e9 / 8}, {"TB/s", 1e12},
                                        {"MB/s", 1e6}, {"B/s", 1}};
    case Dimension::kDuration: return {{"us", 1e-6}, {"ms", 1e-3}, {"ns", 1e-9}, {"s", 1}};
    case Dimension::kFlopRate: return {{"TFLOP/s", 1e12}, {"GFLOP/s", 1e9}, {"PFLOP/s", 1e15},
                                       {"FLOP/s", 1}};
  }
  return {};
}

// The shortest spelling, in a unit where the number is >= 1 and in plain decimals, that
// ParseQuantity reads back to exactly `v` ("80 GiB", "19.5 TFLOP/s", "200 Gb/s"); ties go to
// the earlier unit of WriteUnits. Else core's canonical QuantityToConfig spelling.
std::string Spell(double v, Dimension dim) {
  if (v == 0) return "0 " + std::string(WriteUnits(dim).front().first);
  std::string best;
  for (const auto& [unit, factor] : WriteUnits(dim)) {
    if (v / factor < 1) continue;
    for (int decimals = 0; decimals <= 9; ++decimals) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.*f %s", decimals, v / factor, unit);
      auto back = ParseQuantityAllowZero(buf, dim);
      if (back.ok() && *back == v) {
        if (best.empty() || std::string(buf).size() < best.size()) best = buf;
        break;
      }
    }
  }
  return best.empty() ? QuantityToConfig(v, dim) : best;
}

}  // namespace

std::string ClusterToYaml(const ClusterSpec& c) {
  std::ostringstream o;
  const GpuSpec& g = c.gpu;
  o << "name: " << YamlQuote(c.name) << "\n"
    << "nodes: " << c.nodes << "\n"
    << "gpus_per_node: " << c.gpus_per_node << "\n";
  if (c.nodes_per_nvlink_domain != 1)
    o << "nodes_per_nvlink_domain: " << c.nodes_per_nvlink_domain << "\n";
  o << "gpu:\n"
    << "  name: " << YamlQuote(g.name) << "\n"
    << "  memory: " << Spell(g.memory_bytes, Dimension::kBytes) << "\n"
    << "  hbm_bandwidth: " << Spell(g.hbm_bw_bytes_per_s, Dimension::kBandwidth) << "\n";
  if (g.host_bw_bytes_per_s > 0)
    o << "  host_bandwidth: " << Spell(g.host_bw_bytes_per_s, Dimension::kBandwidth) << "\n";
  if (g.host_memory_bytes > 0)
    o << "  host_memory: " << Spell(g.host_memory_bytes, Dimension::kBytes) << "\n";
  if (g.sms > 0) o << "  sms: " << g.sms << "\n";
  o << "  peak:\n";
  const std::pair<const char*, double> peaks[] = {{"bf16", g.peak_bf16}, {"fp16", g.peak_fp16},
                                                  {"fp8", g.peak_fp8}, {"fp4", g.peak_fp4},
                                                  {"tf32", g.peak_tf32}, {"fp32", g.peak_fp32}};
  for (const auto& [key, v] : peaks)
    if (v > 0) o << "    " << key << ": " << Spell(v, Dimension::kFlopRate) << "\n";
  o << "intra_node:\n"
    << "  fabric: " << ToString(c.intra.fabric) << "\n"
    << "  bandwidth: " << Spell(c.intra.bw_bytes_per_s, Dimension::kBandwidth) << "\n"
    << "  latency: " << Spell(c.intra.latency_s, Dimension::kDuration) << "\n";
  if (c.intra.pcie_bw_bytes_per_s > 0)
    o << "  pcie_bandwidth: " << Spell(c.intra.pcie_bw_bytes_per_s, Dimension::kBandwidth) << "\n";
  if (c.inter.nics_per_node > 0)
    o << "inter_node:\n"
      << "  nics_per_node: " << c.inter.nics_per_node << "\n"
      << "  nic_bandwidth: " << Spell(c.inter.nic_bw_bytes_per_s, Dimension::kBandwidth) << "\n"
      << "  latency: " << Spell(c.inter.latency_s, Dimension::kDuration) << "\n"
      << "  oversubscription: " << Number(c.inter.oversubscription) << "\n";
  if (!c.links.empty()) o << "links:\n";
  for (const LinkSpec& l : c.links)
    o << "  - {a: " << l.a << ", b: " << l.b
      << ", bandwidth: " << Spell(l.bw_bytes_per_s, Dimension::kBandwidth)
      << ", latency: " << Spell(l.latency_s, Dimension::kDuration) << "}\n";
  if (!c.calibration.empty()) o << "calibration:\n";
  for (const auto& [name, v] : c.calibration) o << "  " << name << ": " << Number(v) << "\n";
  if (!c.measured.empty()) o << MeasuredToYaml(c.measured);
  return o.str();
}

}  // namespace ptdp
