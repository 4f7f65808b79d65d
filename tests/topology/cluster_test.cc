// ClusterSpec: the shipped cluster files, strict errors (file:line, key, value), round trip.
#include "topology/cluster.h"
// Before gtest: <signal.h> (via gtest) defines a macro `si_value`, a parameter name in
// core/units.h.
#include "core/yaml_reader.h"

#include <gtest/gtest.h>

#include <cmath>

#include <string>

namespace ptdp {
namespace {

std::string ClusterPath(const std::string& name) {
  return std::string(PTDP_SOURCE_DIR) + "/configs/clusters/" + name + ".yaml";
}

Result<ClusterSpec> FromText(const std::string& text) {
  auto node = ParseYamlText(text, "c.yaml");
  if (!node.ok()) return node.status();
  return ClusterFromYaml(*node, "c.yaml");
}

// Exact equality of every field (the file name aside).
void ExpectSame(const ClusterSpec& a, const ClusterSpec& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.nodes, b.nodes);
  EXPECT_EQ(a.gpus_per_node, b.gpus_per_node);
  EXPECT_EQ(a.nodes_per_nvlink_domain, b.nodes_per_nvlink_domain);
  EXPECT_EQ(a.gpu.name, b.gpu.name);
  EXPECT_EQ(a.gpu.memory_bytes, b.gpu.memory_bytes);
  EXPECT_EQ(a.gpu.hbm_bw_bytes_per_s, b.gpu.hbm_bw_bytes_per_s);
  EXPECT_EQ(a.gpu.peak_bf16, b.gpu.peak_bf16);
  EXPECT_EQ(a.gpu.peak_fp16, b.gpu.peak_fp16);
  EXPECT_EQ(a.gpu.peak_fp8, b.gpu.peak_fp8);
  EXPECT_EQ(a.gpu.peak_fp4, b.gpu.peak_fp4);
  EXPECT_EQ(a.gpu.peak_tf32, b.gpu.peak_tf32);
  EXPECT_EQ(a.gpu.peak_fp32, b.gpu.peak_fp32);
  EXPECT_EQ(a.intra.fabric, b.intra.fabric);
  EXPECT_EQ(a.intra.bw_bytes_per_s, b.intra.bw_bytes_per_s);
  EXPECT_EQ(a.intra.latency_s, b.intra.latency_s);
  EXPECT_EQ(a.intra.pcie_bw_bytes_per_s, b.intra.pcie_bw_bytes_per_s);
  EXPECT_EQ(a.inter.nics_per_node, b.inter.nics_per_node);
  EXPECT_EQ(a.inter.nic_bw_bytes_per_s, b.inter.nic_bw_bytes_per_s);
  EXPECT_EQ(a.inter.latency_s, b.inter.latency_s);
  EXPECT_EQ(a.inter.oversubscription, b.inter.oversubscription);
  ASSERT_EQ(a.links.size(), b.links.size());
  for (size_t i = 0; i < a.links.size(); ++i) {
    EXPECT_EQ(a.links[i].a, b.links[i].a);
    EXPECT_EQ(a.links[i].b, b.links[i].b);
    EXPECT_EQ(a.links[i].bw_bytes_per_s, b.links[i].bw_bytes_per_s);
    EXPECT_EQ(a.links[i].latency_s, b.links[i].latency_s);
  }
  EXPECT_EQ(a.calibration, b.calibration);
  EXPECT_EQ(a.measured.backend, b.measured.backend);
  ASSERT_EQ(a.measured.tables.size(), b.measured.tables.size());
  for (const auto& [name, t] : a.measured.tables)
    EXPECT_EQ(t.Rows(), b.measured.Table(name)->Rows()) << name;
}

void ExpectRoundTrip(const ClusterSpec& c) {
  const std::string text = ClusterToYaml(c);
  auto back = FromText(text);
  ASSERT_TRUE(back.ok()) << back.status().message() << "\n" << text;
  ExpectSame(c, *back);
  EXPECT_EQ(ClusterToYaml(*back), text);
}

struct Shipped {
  const char* name;
  int world;
};

// World sizes: dgx-a100 and dgx-h100 128 nodes x 8; dgx-h200, dgx-b200 and dgx-b300 32 x 8;
// gb200-nvl72 and gb300-nvl72 8 racks of 18 trays x 4 = 576; the workstation 1 x 4; local-cpu
// 1 x 8 rank slots.
TEST(ClusterFiles, EveryShippedFileLoadsAndRoundTrips) {
  for (const Shipped s : {Shipped{"dgx-a100", 1024}, Shipped{"dgx-h100", 1024},
                          Shipped{"dgx-h200", 256}, Shipped{"dgx-b200", 256},
                          Shipped{"dgx-b300", 256}, Shipped{"gb200-nvl72", 576},
                          Shipped{"gb300-nvl72", 576}, Shipped{"workstation-pcie4", 4},
                          Shipped{"local-cpu", 8}}) {
    SCOPED_TRACE(s.name);
    auto c = LoadClusterFile(ClusterPath(s.name));
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_EQ(c->name, s.name);
    EXPECT_EQ(c->world(), s.world);
    EXPECT_EQ(c->file, ClusterPath(s.name));
    ExpectRoundTrip(*c);
  }
}

TEST(ClusterFiles, DgxA100Values) {
  auto c = LoadClusterFile(ClusterPath("dgx-a100"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->gpu.memory_bytes, 80.0 * 1024 * 1024 * 1024);
  EXPECT_EQ(c->gpu.hbm_bw_bytes_per_s, 2039e9);
  EXPECT_EQ(c->intra.fabric, IntraFabric::kNvSwitch);
  EXPECT_EQ(c->intra.bw_bytes_per_s, 300e9);
  EXPECT_DOUBLE_EQ(c->intra.latency_s, 3e-6);
  EXPECT_EQ(c->inter.nics_per_node, 8);
  EXPECT_EQ(c->inter.nic_bw_bytes_per_s, 25e9);  // 200 Gb/s / 8 bits
  EXPECT_EQ(c->inter.oversubscription, 1.0);
}

TEST(ClusterFiles, H200MemoryIsDecimalGigabytes) {
  auto c = LoadClusterFile(ClusterPath("dgx-h200"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->gpu.memory_bytes, 141e9);
  EXPECT_EQ(c->gpu.peak_fp8, 1979e12);
}

// The Blackwell files: datasheet figures (decimal GB, dense peaks), the GPU names of the rows
// of ../shared/calibration/megatron_recipes/runs.yaml, NVL72 racks as 18 trays of 4 GPUs.
TEST(ClusterFiles, BlackwellValues) {
  struct Want {
    const char* file;
    const char* gpu;
    double memory, bf16, fp8, fp4, nic_bw;
    int gpus_per_node, nodes_per_domain;
  };
  for (const Want& w : {Want{"dgx-b200", "B200", 180e9, 2.25e15, 4.5e15, 9e15, 50e9, 8, 1},
                        Want{"dgx-b300", "B300", 288e9, 2.25e15, 4.5e15, 13.125e15, 100e9, 8, 1},
                        Want{"gb200-nvl72", "GB200 (NVL72)", 186e9, 2.5e15, 5e15, 10e15, 50e9, 4, 18},
                        Want{"gb300-nvl72", "GB300 (NVL72)", 288e9, 2.5e15, 5e15, 15e15, 100e9, 4, 18}}) {
    SCOPED_TRACE(w.file);
    auto c = LoadClusterFile(ClusterPath(w.file));
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_EQ(c->gpu.name, w.gpu);
    EXPECT_EQ(c->gpu.memory_bytes, w.memory);
    EXPECT_EQ(c->gpu.hbm_bw_bytes_per_s, 8e12);
    EXPECT_EQ(c->gpu.PeakFlops(Precision::kBf16), w.bf16);
    EXPECT_EQ(c->gpu.PeakFlops(Precision::kFp8), w.fp8);
    EXPECT_EQ(c->gpu.PeakFlops(Precision::kFp4), w.fp4);
    EXPECT_EQ(c->intra.fabric, IntraFabric::kNvSwitch);
    EXPECT_EQ(c->intra.bw_bytes_per_s, 900e9);  // NVLink 5, per direction
    EXPECT_EQ(c->inter.nic_bw_bytes_per_s, w.nic_bw);
    EXPECT_EQ(c->inter.nics_per_node, c->gpus_per_node);  // one NIC per GPU
    EXPECT_EQ(c->gpus_per_node, w.gpus_per_node);
    EXPECT_EQ(c->nodes_per_nvlink_domain, w.nodes_per_domain);
    EXPECT_EQ(c->nvlink_domain_gpus(), w.nodes_per_domain == 1 ? 8 : 72);
    EXPECT_EQ(c->calibration.at("softmax_bytes_per_score"), 0);  // fused attention only
  }
}

TEST(GpuSpec, PeakFlopsPerPrecision) {
  auto a100 = LoadClusterFile(ClusterPath("dgx-a100"));
  ASSERT_TRUE(a100.ok()) << a100.status().message();
  EXPECT_EQ(a100->gpu.PeakFlops(Precision::kBf16), 312e12);
  EXPECT_EQ(a100->gpu.PeakFlops(Precision::kFp16), 312e12);
  EXPECT_EQ(a100->gpu.PeakFlops(Precision::kFp8), 0);         // no fp8 on A100
  EXPECT_EQ(a100->gpu.PeakFlops(Precision::kFp4), 0);         // nor fp4 (Blackwell on)
  EXPECT_EQ(a100->gpu.PeakFlops(Precision::kFp32), 156e12);   // tf32 tensor cores
  auto cpu = LoadClusterFile(ClusterPath("local-cpu"));
  ASSERT_TRUE(cpu.ok()) << cpu.status().message();
  EXPECT_EQ(cpu->gpu.PeakFlops(Precision::kFp32), 50e9);      // no tf32: the fp32 peak
  EXPECT_EQ(cpu->gpu.PeakFlops(Precision::kBf16), 0);         // the CPU runtime computes fp32
}

// Plans default to bf16 where the GPU has a bf16 peak, else fp16, else fp32 (CPU rank slots).
TEST(GpuSpec, DefaultPrecisionIsTheBest16BitPathElseFp32) {
  auto a100 = LoadClusterFile(ClusterPath("dgx-a100"));
  auto cpu = LoadClusterFile(ClusterPath("local-cpu"));
  ASSERT_TRUE(a100.ok() && cpu.ok());
  EXPECT_EQ(a100->gpu.DefaultPrecision(), Precision::kBf16);
  EXPECT_EQ(cpu->gpu.DefaultPrecision(), Precision::kFp32);
  GpuSpec v100;  // fp16 tensor cores, no bf16
  v100.peak_fp16 = 125e12;
  v100.peak_fp32 = 15.7e12;
  EXPECT_EQ(v100.DefaultPrecision(), Precision::kFp16);
}

TEST(IntraFabric, Names) {
  EXPECT_STREQ(ToString(IntraFabric::kNvSwitch), "nvswitch");
  EXPECT_STREQ(ToString(IntraFabric::kNvLinkMesh), "nvlink_mesh");
  EXPECT_STREQ(ToString(IntraFabric::kNvLinkPairs), "nvlink_pairs");
  EXPECT_STREQ(ToString(IntraFabric::kPcie), "pcie");
  EXPECT_STREQ(ToString(IntraFabric::kSharedMemory), "shared_memory");
}

// Line numbers of kBase are those the error cases expect.
const char* kBase =
    "name: test\n"                   // 1
    "nodes: 2\n"                     // 2
    "gpus_per_node: 4\n"             // 3
    "gpu:\n"                         // 4
    "  name: G\n"                    // 5
    "  memory: 80 GiB\n"             // 6
    "  hbm_bandwidth: 2000 GB/s\n"   // 7
    "  peak:\n"                      // 8
    "    bf16: 312 TFLOP/s\n"        // 9
    "intra_node:\n"                  // 10
    "  fabric: nvswitch\n"           // 11
    "  bandwidth: 300 GB/s\n"        // 12
    "  latency: 3 us\n"              // 13
    "inter_node:\n"                  // 14
    "  nics_per_node: 4\n"           // 15
    "  nic_bandwidth: 200 Gb/s\n"    // 16
    "  latency: 5 us\n";             // 17

TEST(ClusterYaml, BaseIsValid) {
  auto c = FromText(kBase);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->world(), 8);
  EXPECT_EQ(c->inter.oversubscription, 1.0);  // default
}

struct ErrorCase {
  const char* what;
  const char* from;    // text of kBase to replace ("" appends `to`)
  const char* to;
  const char* where;   // expected "file:line"
  const char* key;     // expected key path
  const char* value;   // expected quoted value (or other detail)
};

std::string Edit(const ErrorCase& e) {
  std::string text = kBase;
  if (std::string(e.from).empty()) return text + e.to;
  const size_t at = text.find(e.from);
  EXPECT_NE(at, std::string::npos) << e.from;
  return text.replace(at, std::string(e.from).size(), e.to);
}

TEST(ClusterYaml, ErrorsNameFileLineKeyAndValue) {
  const ErrorCase cases[] = {
      {"bare number", "bandwidth: 300 GB/s", "bandwidth: 300", "c.yaml:12:",
       "intra_node.bandwidth", "\"300\" has no unit"},
      {"unknown unit", "300 GB/s", "300 GX/s", "c.yaml:12:", "intra_node.bandwidth", "GX/s"},
      {"bare memory", "80 GiB", "80", "c.yaml:6:", "gpu.memory", "\"80\""},
      {"unknown key", "  hbm_bandwidth: 2000 GB/s\n", "  hbm_bandwidth: 2000 GB/s\n  colour: red\n",
       "c.yaml:8:", "gpu.colour", "unknown key"},
      {"unknown top key", "", "racks: 3\n", "c.yaml:18:", "racks", "unknown key"},
      // An absent key is located at its map (the gpu map starts on line 5).
      {"missing key", "  memory: 80 GiB\n", "", "c.yaml:5:", "gpu.memory", "missing"},
      {"negative memory", "80 GiB", "-80 GiB", "c.yaml:6:", "gpu.memory", "\"-80 GiB\""},
      {"zero memory", "80 GiB", "0 GiB", "c.yaml:6:", "gpu.memory", "\"0 GiB\" is zero"},
      {"nodes 0", "nodes: 2", "nodes: 0", "c.yaml:2:", "nodes", "'0'"},
      {"nodes not a number", "nodes: 2", "nodes: two", "c.yaml:2:", "nodes", "'two'"},
      {"unknown fabric", "nvswitch", "nvlink9", "c.yaml:11:", "intra_node.fabric", "'nvlink9'"},
      {"missing latency", "  latency: 3 us\n", "", "c.yaml:11:", "intra_node.latency", "missing"},
      {"pairs need pcie", "nvswitch", "nvlink_pairs", "c.yaml:11:", "intra_node.pcie_bandwidth",
       "missing"},
      {"no training peak", "bf16: 312", "fp8: 312", "c.yaml:9:", "gpu.peak.bf16", "fp32"},
      {"multi-node without network",
       "inter_node:\n  nics_per_node: 4\n  nic_bandwidth: 200 Gb/s\n  latency: 5 us\n", "",
       "c.yaml:1:", "inter_node", "nodes > 1"},
      {"zero nics", "nics_per_node: 4", "nics_per_node: 0", "c.yaml:15:",
       "inter_node.nics_per_node", "'0'"},
      {"oversubscription below 1", "", "  oversubscription: 0.5\n", "c.yaml:18:",
       "inter_node.oversubscription", "0.5"},
      {"link index out of range", "",
       "links:\n  - {a: 0, b: 1, bandwidth: 100 GB/s, latency: 2 us}\n"
       "  - {a: 0, b: 4, bandwidth: 100 GB/s, latency: 2 us}\n",
       "c.yaml:20:", "links[1].b", "'4'"},
      {"link to itself", "", "links:\n  - {a: 2, b: 2, bandwidth: 100 GB/s, latency: 2 us}\n",
       "c.yaml:19:", "links[0].b", "itself"},
      {"link bare bandwidth", "", "links:\n  - {a: 0, b: 1, bandwidth: 100, latency: 2 us}\n",
       "c.yaml:19:", "links[0].bandwidth", "\"100\""},
      {"calibration not a number", "", "calibration:\n  gemm_eff_max: high\n", "c.yaml:19:",
       "calibration.gemm_eff_max", "'high'"},
      // NVLink domains of several nodes: whole domains only, positive, NVSwitch only.
      {"domain does not divide nodes", "gpus_per_node: 4\n",
       "gpus_per_node: 4\nnodes_per_nvlink_domain: 3\n", "c.yaml:4:", "nodes_per_nvlink_domain",
       "'3' does not divide nodes '2'"},
      {"domain of zero nodes", "gpus_per_node: 4\n", "gpus_per_node: 4\nnodes_per_nvlink_domain: 0\n",
       "c.yaml:4:", "nodes_per_nvlink_domain", "'0'"},
      {"domain not a number", "gpus_per_node: 4\n",
       "gpus_per_node: 4\nnodes_per_nvlink_domain: rack\n", "c.yaml:4:", "nodes_per_nvlink_domain",
       "'rack'"},
      {"domain over links", "",
       "nodes_per_nvlink_domain: 2\nlinks:\n  - {a: 0, b: 1, bandwidth: 100 GB/s, latency: 2 us}\n",
       "c.yaml:18:", "nodes_per_nvlink_domain", "with links"},
  };
  for (const ErrorCase& e : cases) {
    SCOPED_TRACE(e.what);
    auto c = FromText(Edit(e));
    ASSERT_FALSE(c.ok());
    const std::string msg = c.status().message();
    EXPECT_NE(msg.find(e.where), std::string::npos) << msg;
    EXPECT_NE(msg.find(e.key), std::string::npos) << msg;
    EXPECT_NE(msg.find(e.value), std::string::npos) << msg;
  }
}

// Every kind of quantity with an extreme value: refused at its line, naming the key, the
// value as written and the range of core/limits.h. Numbers a YAML writer might produce for
// inf and NaN (.inf, .nan) are not numbers with a unit at all.
TEST(ClusterYaml, ExtremeQuantitiesAreRefusedNamingKeyValueAndRange) {
  const ErrorCase cases[] = {
      {"memory overflows to inf once in bytes", "80 GiB", "1e308 GiB", "c.yaml:6:", "gpu.memory",
       "\"1e308 GiB\" overflows"},
      {"memory too small", "80 GiB", "512 KiB", "c.yaml:6:", "gpu.memory",
       "'512 KiB' is outside 1 MiB..1 PiB"},
      {"memory too large", "80 GiB", "2000 TB", "c.yaml:6:", "gpu.memory",
       "'2000 TB' is outside 1 MiB..1 PiB"},
      {"denormal bandwidth", "2000 GB/s", "4.9e-324 GB/s", "c.yaml:7:", "gpu.hbm_bandwidth",
       "'4.9e-324 GB/s' is outside 1 MB/s..1 PB/s"},
      {"1e-320 bandwidth", "300 GB/s", "1e-320 GB/s", "c.yaml:12:", "intra_node.bandwidth",
       "'1e-320 GB/s' is outside 1 MB/s..1 PB/s"},
      {"inf bandwidth", "300 GB/s", "inf GB/s", "c.yaml:12:", "intra_node.bandwidth",
       "\"inf GB/s\" is not a finite number"},
      {"nan bandwidth", "300 GB/s", "nan GB/s", "c.yaml:12:", "intra_node.bandwidth",
       "\"nan GB/s\" is not a finite number"},
      {"huge nic bandwidth", "200 Gb/s", "1e300 Gb/s", "c.yaml:16:", "inter_node.nic_bandwidth",
       "'1e300 Gb/s' is outside 1 MB/s..1 PB/s"},
      {"negative latency", "latency: 3 us", "latency: -3 us", "c.yaml:13:", "intra_node.latency",
       "\"-3 us\" is negative"},
      {"latency of a day", "latency: 5 us", "latency: 86400 s", "c.yaml:17:",
       "inter_node.latency", "'86400 s' is outside 0 or 1 ns..1 s"},
      {"denormal latency", "latency: 5 us", "latency: 4.9e-324 s", "c.yaml:17:",
       "inter_node.latency", "'4.9e-324 s' is outside 0 or 1 ns..1 s"},
      {"peak of 1e308", "312 TFLOP/s", "1e200 TFLOP/s", "c.yaml:9:", "gpu.peak.bf16",
       "'1e200 TFLOP/s' is outside 1 MFLOP/s..1 EFLOP/s"},
      {"peak of 1 FLOP/s", "312 TFLOP/s", "1 FLOP/s", "c.yaml:9:", "gpu.peak.bf16",
       "'1 FLOP/s' is outside 1 MFLOP/s..1 EFLOP/s"},
      {"inf oversubscription", "", "  oversubscription: inf\n", "c.yaml:18:",
       "inter_node.oversubscription", "'inf' is not a number"},
      {".inf oversubscription", "", "  oversubscription: .inf\n", "c.yaml:18:",
       "inter_node.oversubscription", "'.inf' is not a number"},
      {".nan oversubscription", "", "  oversubscription: .nan\n", "c.yaml:18:",
       "inter_node.oversubscription", "'.nan' is not a number"},
      {"1e308 oversubscription", "", "  oversubscription: 1e308\n", "c.yaml:18:",
       "inter_node.oversubscription", "'1e308' is outside 1..1000"},
      {"-0 oversubscription", "", "  oversubscription: -0\n", "c.yaml:18:",
       "inter_node.oversubscription", "'-0' is outside 1..1000"},
      {"nodes of int64 max", "nodes: 2", "nodes: 9223372036854775807", "c.yaml:2:", "nodes",
       "'9223372036854775807' is larger than the limit 262144"},
      {"hex nodes", "nodes: 2", "nodes: 0x7fffffff", "c.yaml:2:", "nodes",
       "'0x7fffffff' is not an integer"},
      {"negative SM count", "2000 GB/s\n", "2000 GB/s\n  sms: -4\n", "c.yaml:8:", "gpu.sms", "-4"},
      {"SM count of a million", "2000 GB/s\n", "2000 GB/s\n  sms: 1000000\n", "c.yaml:8:",
       "gpu.sms", "1000000"},
      {"calibrated seconds of 1e308", "", "calibration:\n  host_kernel_s: 1e308\n", "c.yaml:19:",
       "calibration.host_kernel_s", "'1e308' is outside 0 or 1e-12 s..60 s"},
      {"denormal calibrated fraction", "", "calibration:\n  hbm_eff: 4.9e-324\n", "c.yaml:19:",
       "calibration.hbm_eff", "'4.9e-324' is outside 0 or 1e-09..1e+09"},
      {"negative calibrated bytes", "", "calibration:\n  workspace_bytes: -1\n", "c.yaml:19:",
       "calibration.workspace_bytes", "'-1' is outside 0 or 1e-06 B..1 PiB"},
  };
  for (const ErrorCase& e : cases) {
    SCOPED_TRACE(e.what);
    auto c = FromText(Edit(e));
    ASSERT_FALSE(c.ok());
    const std::string msg = c.status().message();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_EQ(msg.rfind(e.where, 0), 0u) << msg;  // starts with the file and line
    EXPECT_NE(msg.find(std::string(e.key) + ": "), std::string::npos) << msg;
    EXPECT_NE(msg.find(e.value), std::string::npos) << msg;
  }
}

// A GPU or cluster name that is not UTF-8 would make every --json output fail: refused at
// input, naming the file, line and key, with the bad byte escaped.
TEST(ClusterYaml, NonUtf8NamesAreRefusedNamingTheKey) {
  std::string gpu = kBase;
  gpu.replace(gpu.find("  name: G"), 9, "  name: G\xff");
  auto c = FromText(gpu);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "c.yaml:5: gpu.name: 'G\\xff' is not valid UTF-8");
  std::string top = kBase;
  top.replace(0, 10, "name: \xc3(\n");
  c = FromText(top);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "c.yaml:1: name: '\\xc3(' is not valid UTF-8");
  // A description, and a key, too.
  c = FromText(std::string(kBase) + "description: \"caf\xe9\"\n");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "c.yaml:18: description: 'caf\\xe9' is not valid UTF-8");
  c = FromText(std::string(kBase) + "\xfe: 1\n");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "c.yaml:18: \\xfe: '\\xfe' is not valid UTF-8");
  // Well-formed UTF-8 is welcome.
  std::string ok = kBase;
  ok.replace(0, 10, "name: \"Gr\xc3\xa4" "fe \xe2\x82\xac\"\n");
  EXPECT_TRUE(FromText(ok).ok());
}

TEST(ClusterYaml, MissingFileNamesIt) {
  auto c = LoadClusterFile("/nonexistent/cluster.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("/nonexistent/cluster.yaml"), std::string::npos);
}

TEST(ClusterYaml, SingleNodeNeedsNoNetwork) {
  auto c = FromText(
      "name: one\nnodes: 1\ngpus_per_node: 2\n"
      "gpu: {name: G, memory: 16 GiB, hbm_bandwidth: 900 GB/s, peak: {fp32: 15 TFLOP/s}}\n"
      "intra_node: {fabric: pcie, bandwidth: 12 GB/s, latency: 0 us}\n");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->inter.nics_per_node, 0);
  EXPECT_EQ(c->intra.latency_s, 0);
}

TEST(ClusterYaml, RoundTripWithEveryOptionalPart) {
  auto c = FromText(std::string(kBase) +
                    "  oversubscription: 2.5\n"
                    "links:\n"
                    "  - {a: 0, b: 1, bandwidth: 100 GB/s, latency: 2 us}\n"
                    "  - {a: 2, b: 3, bandwidth: 37.5 Gb/s, latency: 0 us}\n"
                    "calibration:\n"
                    "  gemm_eff_max: 0.8\n"
                    "  host_kernel_s: 4.2e-05\n");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->inter.oversubscription, 2.5);
  ASSERT_EQ(c->links.size(), 2u);
  EXPECT_EQ(c->links[1].bw_bytes_per_s, 37.5e9 / 8);
  EXPECT_EQ(c->calibration.at("gemm_eff_max"), 0.8);
  ExpectRoundTrip(*c);
  // Quantities are written in readable units, not raw SI numbers.
  const std::string text = ClusterToYaml(*c);
  EXPECT_NE(text.find("memory: 80 GiB"), std::string::npos) << text;
  EXPECT_NE(text.find("bandwidth: 300 GB/s"), std::string::npos) << text;
  EXPECT_NE(text.find("latency: 3 us"), std::string::npos) << text;
  EXPECT_NE(text.find("gemm_eff_max: 0.8\n"), std::string::npos) << text;
}

// nodes_per_nvlink_domain: absent is 1 (and not written); 2 nodes of 4 GPUs in one domain give
// an 8-GPU NVLink domain, written back and read again.
TEST(ClusterYaml, NvlinkDomainRoundTrips) {
  auto plain = FromText(kBase);
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_EQ(plain->nodes_per_nvlink_domain, 1);
  EXPECT_EQ(plain->nvlink_domain_gpus(), 4);
  EXPECT_EQ(ClusterToYaml(*plain).find("nodes_per_nvlink_domain"), std::string::npos);
  auto c = FromText(std::string(kBase) + "nodes_per_nvlink_domain: 2\n");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->nodes_per_nvlink_domain, 2);
  EXPECT_EQ(c->nvlink_domain_gpus(), 8);
  EXPECT_EQ(c->nvlink_domains(), 1);
  ExpectRoundTrip(*c);
  EXPECT_NE(ClusterToYaml(*c).find("nodes_per_nvlink_domain: 2\n"), std::string::npos);
}

// peak.fp4 (NVFP4 on Blackwell): read, written back, PeakFlops(kFp4).
TEST(ClusterYaml, Fp4PeakRoundTrips) {
  std::string text = kBase;
  text.replace(text.find("    bf16: 312 TFLOP/s\n"), 22, "    bf16: 2.5 PFLOP/s\n    fp4: 10 PFLOP/s\n");
  auto c = FromText(text);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->gpu.peak_fp4, 10e15);
  EXPECT_EQ(c->gpu.PeakFlops(Precision::kFp4), 10e15);
  ExpectRoundTrip(*c);
  text.replace(text.find("fp4: 10 PFLOP/s"), 15, "fp4: 10");
  c = FromText(text);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("c.yaml:10: gpu.peak.fp4"), std::string::npos)
      << c.status().message();
}

// A domain of several nodes needs NVLink switches between them: another fabric is refused at
// the key, naming the fabric.
TEST(ClusterYaml, NvlinkDomainNeedsNvswitch) {
  std::string text = std::string(kBase) + "nodes_per_nvlink_domain: 2\n";
  text.replace(text.find("fabric: nvswitch"), 16, "fabric: pcie");
  auto c = FromText(text);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            "c.yaml:18: nodes_per_nvlink_domain: '2' needs intra_node.fabric nvswitch and no links "
            "(NVLink switches join the domain's nodes), not fabric 'pcie'");
}

// `measured:` (ptdp calibrate) rides along: read, written back, read again to the same tables.
TEST(ClusterYaml, RoundTripWithMeasuredPrimitives) {
  auto c = FromText(std::string(kBase) +
                    "measured:\n"
                    "  backend: cpu\n"
                    "  cores: 2\n"
                    "  tables:\n"
                    "    copy:\n"
                    "      - [64, 1e-07]\n"
                    "      - [4096, 2.5e-06]\n"
                    "    send_recv:\n"
                    "      - [32, 1e-05]\n");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->measured.cores, 2);
  ASSERT_NE(c->measured.Table("copy"), nullptr);
  EXPECT_NEAR(c->measured.Table("copy")->Seconds(512), 1e-7 * std::pow(25.0, 0.5), 1e-15);
  ExpectRoundTrip(*c);
  auto bad = FromText(std::string(kBase) + "measured:\n  tables:\n    copy: 3\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("measured.tables.copy"), std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace ptdp
