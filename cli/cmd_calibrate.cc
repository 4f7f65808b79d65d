// `ptdp calibrate --backend cpu --out calibrated.yaml`: measures this machine's primitives
// through the runtime's Backend and CommunicatorFactory (runtime/microbench.h) and writes a
// cluster YAML: the base cluster with its peak, bandwidths and latency replaced by measured ones
// and a `measured:` block of curves that `plan`, `simulate` and `compare` then use.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <memory>
#include <thread>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/units.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/thread_communicator.h"
#include "runtime/microbench.h"

namespace ptdp::cli {
namespace {

// Above this share of the cores used by other processes, the measurement is the machine under
// load (as in `ptdp compare`).
constexpr double kBusyShare = 0.1;

struct CalibrateFlags {
  std::string backend = "cpu";
  std::string cluster = std::string(PTDP_SOURCE_DIR) + "/configs/clusters/local-cpu.yaml";
  std::string out;
  bool quick = false;
  int max_ranks = 0;  // 0: the base cluster's ranks per node, at most 8
  bool json = false;
};

// The factories of one backend: what the benchmarks run on. The CUDA backend plugs in here.
struct BackendChoice {
  rt::MakeBackend make_backend;
  rt::MakeWorld make_world;
  int cores = 1;  // ranks that compute at once at full speed
};

Result<BackendChoice> ChooseBackend(const std::string& name) {
  if (name == "cpu") {
    BackendChoice c;
    c.make_backend = [] { return std::make_unique<rt::CpuBackend>(); };
    c.make_world = [](int ranks) -> std::unique_ptr<rt::CommunicatorFactory> {
      return std::make_unique<rt::ThreadWorld>(ranks, /*timeout_s=*/120.0);
    };
    c.cores = int(std::max(1u, std::thread::hardware_concurrency()));
    return c;
  }
  if (name == "cuda")
    // The microbenchmarks make backends and worlds separately; DeviceWorld/NcclWorld need each
    // rank's stream at Group() time, which this interface does not pass yet.
    return Status::Error("--backend cuda: calibrating on GPUs is not implemented yet; "
                         "bench/gemm_bench and bench/comm_bench measure the GEMM and collective "
                         "figures (docs/gpus.md)");
  return Status::Error("--backend '" + name + "': expected cpu or cuda");
}

std::string Today() {
  const std::time_t now = std::time(nullptr);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::localtime(&now));
  return buf;
}

std::string HostName() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return host;
}

// A progress bar on stderr: redrawn in place on a terminal, a line per tenth otherwise.
class ProgressBar {
 public:
  ProgressBar() : tty_(isatty(STDERR_FILENO)) {}
  void operator()(double fraction, const std::string& what) {
    const int tenth = int(fraction * 10);
    if (!tty_) {
      if (tenth > last_tenth_) std::fprintf(stderr, "calibrate: %3.0f%% %s\n", 100 * fraction, what.c_str());
      last_tenth_ = tenth;
      return;
    }
    constexpr int kWidth = 40;
    const int filled = int(fraction * kWidth + 0.5);
    std::fprintf(stderr, "\r[%s%s] %3.0f%% %-36.36s", std::string(size_t(filled), '#').c_str(),
                 std::string(size_t(kWidth - filled), ' ').c_str(), 100 * fraction, what.c_str());
    if (fraction >= 1) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  bool tty_;
  int last_tenth_ = -1;
};

// Derived scalars for the cluster file (so `ptdp topo` and the Megatron formulas see this
// machine too): the best GEMM rate, the copy bandwidth, p2p bandwidth and latency.
struct Derived {
  double peak_flops = 0, copy_bw = 0, p2p_bw = 0, p2p_latency_s = 0;
};

// Three significant digits: what a measurement supports, and a readable cluster file.
double Round3(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return std::strtod(buf, nullptr);
}

Derived Derive(const MeasuredPrimitives& m) {
  Derived d;
  for (const auto& row : m.Table("gemm_nt")->Rows())
    d.peak_flops = std::max(d.peak_flops, 2.0 * row[0] * row[1] * row[2] / row[3]);
  const auto copy = m.Table("copy")->Rows();
  d.copy_bw = 2.0 * 4 * copy.back()[0] / copy.back()[1];  // read + write
  const auto p2p = m.Table("send_recv")->Rows();
  d.p2p_latency_s = p2p.front()[1];
  d.p2p_bw = p2p.back()[0] / std::max(1e-12, p2p.back()[1] - d.p2p_latency_s);
  for (double* v : {&d.peak_flops, &d.copy_bw, &d.p2p_bw, &d.p2p_latency_s}) *v = Round3(*v);
  return d;
}

// The base cluster with the measured figures in place; `calibration:` keeps the base's entries.
ClusterSpec Calibrated(const ClusterSpec& base, const MeasuredPrimitives& m, const Derived& d) {
  ClusterSpec c = base;
  c.name = base.name + "-calibrated";
  c.measured = m;
  for (double* peak : {&c.gpu.peak_bf16, &c.gpu.peak_fp16, &c.gpu.peak_fp32, &c.gpu.peak_tf32})
    if (*peak > 0) *peak = d.peak_flops;
  if (c.gpu.peak_fp32 <= 0) c.gpu.peak_fp32 = d.peak_flops;
  c.gpu.hbm_bw_bytes_per_s = d.copy_bw;
  c.intra.bw_bytes_per_s = d.p2p_bw;
  c.intra.latency_s = d.p2p_latency_s;
  if (m.backend == "cpu") {
    // The CPU backend's capacity and tracked peak count the bytes of live tensors exactly: no
    // runtime workspace, no allocator slack.
    c.calibration["workspace_bytes"] = 0;
    c.calibration["fragmentation"] = 0;
  }
  return c;
}

void PrintSummary(const MeasuredPrimitives& m, const Derived& d, double elapsed_s) {
  std::printf("measured in %.1f s on %s (%s backend, %d cores)\n", elapsed_s, m.host.c_str(),
              m.backend.c_str(), m.cores);
  std::printf("GEMM (C = A B^T) throughput, GFLOP/s:\n");
  const MeasuredTable& g = *m.Table("gemm_nt");
  for (double dim : {16.0, 64.0, 256.0, 1024.0}) {
    const double s = g.Seconds(dim, dim, dim);
    std::printf("  %5.0f^3  %8.2f\n", dim, 2 * dim * dim * dim / s / 1e9);
  }
  std::printf("  best     %8.2f (the cluster's peak)\n", d.peak_flops / 1e9);
  std::printf("copy bandwidth %s; p2p %s, latency %s\n", FormatBandwidth(d.copy_bw).c_str(),
              FormatBandwidth(d.p2p_bw).c_str(), FormatSeconds(d.p2p_latency_s).c_str());
  std::printf("collective bus bandwidth (nccl-tests busbw) at the largest size:\n");
  const MeasuredTable& ar = *m.Table("all_reduce");
  const MeasuredTable& ag = *m.Table("all_gather");
  const double bytes = ar.axis_values()[1].back();
  for (double n : ar.axis_values()[0]) {
    const double ar_s = ar.Seconds(n, bytes), ag_s = ag.Seconds(n, bytes);
    std::printf("  %2.0f ranks  all-reduce %s (%s for 4 bytes), all-gather %s\n", n,
                FormatBandwidth(bytes / ar_s * 2 * (n - 1) / n).c_str(),
                FormatSeconds(ar.Seconds(n, 4.0)).c_str(),
                FormatBandwidth(bytes / ag_s * (n - 1) / n).c_str());
  }
}

int RunCalibrate(const CalibrateFlags& f) {
  if (f.out.empty()) return Fail("--out is required: the calibrated cluster YAML to write");
  auto choice = ChooseBackend(f.backend);
  if (!choice.ok()) return Fail(choice.status().message());
  auto base = LoadClusterFile(f.cluster);
  if (!base.ok()) return Fail(base.status().message());
  const int max_ranks = f.max_ranks > 0 ? f.max_ranks : std::min(8, base->gpus_per_node);
  if (max_ranks < 2 || max_ranks > 64)
    return Fail("--max-ranks " + std::to_string(max_ranks) + ": expected 2..64");
  rt::MicrobenchOptions opt;
  opt.quick = f.quick;
  opt.max_ranks = max_ranks;
  if (f.quick) opt.min_batch_s = 5e-4;
  if (!f.json)
    std::printf("ptdp calibrate: %s backend, %s grids, collectives up to %d ranks (base %s)\n",
                f.backend.c_str(), f.quick ? "quick" : "full", max_ranks, f.cluster.c_str());
  std::fflush(stdout);
  ProgressBar bar;
  OtherLoad load;
  const auto t0 = std::chrono::steady_clock::now();
  auto measured = rt::RunMicrobenchmarks(choice->make_backend, choice->make_world, opt,
                                         [&](double frac, const std::string& what) { bar(frac, what); });
  if (!measured.ok()) return Fail("calibrate: " + measured.status().message());
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MeasuredPrimitives& m = *measured;
  m.backend = f.backend;
  m.host = HostName();
  m.date = Today();
  m.cores = choice->cores;
  const double others = load.Share();
  char note[128];
  std::snprintf(note, sizeof note, "%s grids; other processes used %.0f%% of the cores meanwhile",
                f.quick ? "quick" : "full", 100 * std::max(0.0, others));
  m.note = note;
  const Derived d = Derive(m);
  const ClusterSpec c = Calibrated(*base, m, d);
  std::ofstream out(f.out);
  out << "# " << c.name << ": " << f.cluster << " calibrated by `ptdp calibrate --backend "
      << f.backend << (f.quick ? " --quick" : "") << "` on " << m.host << ", " << m.date << ".\n"
      << "# gpu.peak, gpu.hbm_bandwidth and intra_node bandwidth/latency are measured (best GEMM,\n"
      << "# copy, p2p); the `measured:` curves below are what the cost model composes times from.\n"
      << ClusterToYaml(c);
  out.close();
  if (!out) return Fail(f.out + ": cannot write the calibrated cluster");
  // Read it back: what we wrote must load as a cluster the cost model accepts.
  auto check = LoadClusterFile(f.out);
  if (!check.ok()) return Fail("internal error: the written file does not load: " + check.status().message());
  if (f.json) {
    nlohmann::json j = {{"out", f.out},
                        {"backend", m.backend},
                        {"host", m.host},
                        {"cores", m.cores},
                        {"elapsed_s", elapsed},
                        {"peak_flop_per_s", d.peak_flops},
                        {"copy_bytes_per_s", d.copy_bw},
                        {"p2p_bytes_per_s", d.p2p_bw},
                        {"p2p_latency_s", d.p2p_latency_s},
                        {"tables", m.tables.size()},
                        {"other_cpu_share", others >= 0 ? nlohmann::json(others) : nullptr},
                        {"machine_busy", others > kBusyShare}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  PrintSummary(m, d, elapsed);
  if (others > kBusyShare)
    std::printf("warning: other processes used %.0f%% of the cores while measuring: some figures "
                "may be slower than this machine's own; run calibrate again when it is quiet\n",
                100 * others);
  std::printf("wrote %s\n", f.out.c_str());
  return 0;
}

}  // namespace

Runner SetupCalibrate(CLI::App* sub) {
  auto f = std::make_shared<CalibrateFlags>();
  sub->add_option("--backend", f->backend, "cpu (Eigen, ranks as threads) or cuda (default cpu)");
  sub->add_option("--cluster", f->cluster,
                  "base cluster YAML to calibrate (default configs/clusters/local-cpu.yaml)");
  sub->add_option("--out", f->out, "the calibrated cluster YAML to write (required)");
  sub->add_flag("--quick", f->quick, "coarser grids and shorter timings (a few seconds)");
  sub->add_option("--max-ranks", f->max_ranks,
                  "largest collective group to measure (default: ranks per node, at most 8)");
  sub->add_flag("--json", f->json, "machine-readable summary");
  return [f] { return RunCalibrate(*f); };
}

}  // namespace ptdp::cli
