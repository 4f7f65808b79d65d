// `ptdp calibrate --backend cpu|cuda --out calibrated.yaml`: measures this machine's primitives
// through the runtime's Backend and CommunicatorFactory (runtime/microbench.h), with the ranks
// placed as `ptdp train` places them (cli/launch.h), and writes a cluster YAML: the base cluster
// with a `measured:` block of curves that `plan`, `simulate` and `compare` then use (on the CPU
// also its peak, bandwidths and latency replaced by measured ones; a GPU keeps its datasheet's).
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
#include "cli/launch.h"
#include "cli/speed_probe.h"
#include "core/units.h"
#include "runtime/microbench.h"

namespace ptdp::cli {
namespace {

// Above this share of the cores used by other processes, the measurement is the machine under
// load (as in `ptdp compare`).
constexpr double kBusyShare = 0.1;
// The host's speed moved more than this between the sweeps over the op grids (the slowest
// sweep's time over the fastest's, less 1): calibrate warns and its --json says `host_unsteady`. Each point is the sweeps'
// median, which a spell over one sweep does not move; a host slow for most of the calibration
// still shows in every figure. Quiet calibrations on the 2-core dev VM drift 2-8%.
constexpr double kUnsteadyDrift = 0.15;


struct CalibrateFlags {
  std::string backend = "cpu";
  std::string cluster;    // empty: local-cpu.yaml, or for cuda the shipped cluster of the GPU
  std::string out;
  std::string precision;  // cuda: the GEMMs' precision, bf16 (default) or fp32
  bool quick = false;
  int max_ranks = 0;  // 0: the base cluster's ranks per node, at most 8 (and the GPUs, with NCCL)
  bool json = false;
};

// Where the benchmarks run: `ptdp train`'s placement (cli/launch.h) of a world of any size.
//   cpu:                 ranks as threads, CpuBackends, ThreadWorld
//   cuda, 1 GPU:         ranks as threads on GPU 0, DeviceWorld (as `train --one-gpu`)
//   cuda, N >= 2 GPUs:   rank r on GPU r, NcclWorld: collectives of at most N ranks
struct Placement {
  rt::MakeWorld make_world;
  Precision precision = Precision::kBf16;  // of the CUDA GEMMs
  int gpus = 0;                            // visible (0 on the CPU)
  std::string gpu_name;
  std::string communicator;  // measured.communicator: threads, device or nccl
  // measured.cores: ranks that compute at once at full speed. CPU: the cores. CUDA: the GPUs,
  // since `ptdp train` gives each rank a GPU of its own while there are enough of them (ranks
  // sharing GPU 0 take turns on it, as threads take turns on a CPU core).
  int cores = 1;
};

Result<Placement> Place(const CalibrateFlags& f) {
  if (f.backend != "cpu" && f.backend != "cuda")
    return Status::Error("--backend '" + f.backend + "': expected cpu or cuda");
  Placement p;
  if (f.backend == "cpu") {
    if (!f.precision.empty())
      return Status::Error("--precision " + f.precision + ": only for --backend cuda (the CPU "
                           "backend computes everything in fp32)");
    p.communicator = "threads";
    p.cores = int(std::max(1u, std::thread::hardware_concurrency()));
  } else {
    if (!f.precision.empty() && f.precision != "bf16" && f.precision != "fp32")
      return Status::Error("--precision '" + f.precision + "': expected bf16 or fp32");
    if (f.precision == "fp32") p.precision = Precision::kFp32;
    // Every rank of a collective benchmark is a thread of this process: no MPI placement.
    if (UnderMpi())
      return Status::Error("--backend cuda: calibrate drives every GPU from one process; run it "
                           "without mpirun/srun");
    PTDP_ASSIGN_OR_RETURN(const UsableGpus gpus, ProbeUsableGpus());
    p.gpus = gpus.visible;
    p.gpu_name = gpus.name;
    p.communicator = gpus.visible == 1 ? "device" : "nccl";
    p.cores = gpus.visible;
  }
  p.make_world = BenchWorlds(f.backend, p.precision);
  return p;
}

// The base cluster: --cluster, else local-cpu.yaml for the CPU, else the shipped cluster of the
// GPU's model (its memory, node size and datasheet figures stay in the calibrated file).
Result<std::string> BaseCluster(const CalibrateFlags& f, const Placement& p) {
  if (!f.cluster.empty()) return ResolveConfig("clusters", f.cluster);
  if (f.backend == "cpu") return ResolveConfig("clusters", "local-cpu");
  const std::pair<const char*, const char*> kShipped[] = {
      {"A100", "dgx-a100"}, {"H100", "dgx-h100"}, {"H200", "dgx-h200"}};
  for (const auto& [model, name] : kShipped)
    if (p.gpu_name.find(model) != std::string::npos) return ResolveConfig("clusters", name);
  return Status::Error("--backend cuda: no shipped cluster describes '" + p.gpu_name +
                       "': give --cluster (a cluster YAML with this GPU's memory and GPUs per "
                       "node; configs/clusters/ has examples)");
}

// The largest collective group: --max-ranks, else the base's ranks per node, at most 8; NCCL
// places one rank per GPU, so at most the GPUs there.
Result<int> MaxRanks(const CalibrateFlags& f, const Placement& p, const ClusterSpec& base) {
  int n = f.max_ranks > 0 ? f.max_ranks : std::min(8, base.gpus_per_node);
  if (p.communicator == "nccl") {
    if (f.max_ranks > p.gpus)
      return Status::Error("--max-ranks " + std::to_string(f.max_ranks) + ": only " +
                           std::to_string(p.gpus) + " GPUs are visible (one rank per GPU)");
    n = std::min(n, p.gpus);
  }
  if (n < 2 || n > 64) return Status::Error("--max-ranks " + std::to_string(n) + ": expected 2..64");
  return n;
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
  // Read + write of the largest copy, of element_bytes each (2 for a bf16 calibration).
  d.copy_bw = 2.0 * m.element_bytes * copy.back()[0] / copy.back()[1];
  const auto p2p = m.Table("send_recv")->Rows();
  d.p2p_latency_s = p2p.front()[1];
  // Bandwidth from the largest message's time less the smallest's (the latency). Both are
  // medians of noisy samples: on a loaded machine the difference can be tiny or negative, which
  // made a bandwidth of bytes / 1e-12 that the cluster reader refuses (above 1 PB/s). The
  // transfer takes at least half the largest message's time: the bandwidth is at most twice
  // what that message alone shows.
  d.p2p_bw = p2p.back()[0] / std::max(p2p.back()[1] - d.p2p_latency_s, 0.5 * p2p.back()[1]);
  for (double* v : {&d.peak_flops, &d.copy_bw, &d.p2p_bw, &d.p2p_latency_s}) *v = Round3(*v);
  return d;
}

// The base cluster with the measured curves in place; `calibration:` keeps the base's entries.
// On the CPU the peak, HBM and intra-node figures become the measured ones. A GPU keeps its
// datasheet's: MFU is stated against the datasheet peak, and with one GPU the "p2p" is a device
// copy, not the NVLink the base describes.
ClusterSpec Calibrated(const ClusterSpec& base, const MeasuredPrimitives& m, const Derived& d) {
  ClusterSpec c = base;
  c.name = base.name + "-calibrated";
  c.measured = m;
  if (m.backend == "cpu") {
    for (double* peak : {&c.gpu.peak_bf16, &c.gpu.peak_fp16, &c.gpu.peak_fp32, &c.gpu.peak_tf32})
      if (*peak > 0) *peak = d.peak_flops;
    if (c.gpu.peak_fp32 <= 0) c.gpu.peak_fp32 = d.peak_flops;
    c.gpu.hbm_bw_bytes_per_s = d.copy_bw;
    c.intra.bw_bytes_per_s = d.p2p_bw;
    c.intra.latency_s = d.p2p_latency_s;
  }
  // Both backends' capacity and tracked peak (what `ptdp train` reports and `compare` checks)
  // count the bytes of live tensors exactly: no runtime workspace, no allocator slack. (On a GPU
  // the CUDA context, cuBLAS's workspace and NCCL's buffers come on top, about 1 GiB per GPU.)
  c.calibration["workspace_bytes"] = 0;
  c.calibration["fragmentation"] = 0;
  return c;
}

// "1 GPU (NVIDIA H200), bf16 GEMMs, collectives by device copies on it" and the like.
std::string Describe(const Placement& p) {
  if (p.communicator == "threads") return "";
  const std::string gemm = p.precision == Precision::kFp32 ? "fp32" : "bf16";
  const std::string gpus = std::to_string(p.gpus) + (p.gpus == 1 ? " GPU (" : " GPUs (") + p.gpu_name + ")";
  return gpus + ", " + gemm + " GEMMs, collectives " +
         (p.communicator == "device" ? "by device copies on GPU 0" : "by NCCL, one GPU per rank");
}

void PrintSummary(const MeasuredPrimitives& m, const Placement& p, const Derived& d,
                  const ClusterSpec& c, double elapsed_s) {
  if (p.communicator == "threads")
    std::printf("measured in %.1f s on %s (%s backend, %d cores)\n", elapsed_s, m.host.c_str(),
                m.backend.c_str(), m.cores);
  else
    std::printf("measured in %.1f s on %s (%s backend, %s)\n", elapsed_s, m.host.c_str(),
                m.backend.c_str(), Describe(p).c_str());
  // GFLOP/s on a CPU, TFLOP/s on a GPU.
  const bool gpu = p.communicator != "threads";
  const double unit = gpu ? 1e12 : 1e9;
  std::printf("GEMM (C = A B^T) throughput, %s:\n", gpu ? "TFLOP/s" : "GFLOP/s");
  const MeasuredTable& g = *m.Table("gemm_nt");
  const std::vector<double> dims =
      gpu ? std::vector<double>{64, 256, 1024, 4096, 8192} : std::vector<double>{16, 64, 256, 1024};
  for (double dim : dims) {
    const double s = g.Seconds(dim, dim, dim);
    std::printf("  %5.0f^3  %8.2f\n", dim, 2 * dim * dim * dim / s / unit);
  }
  if (gpu)
    std::printf("  best     %8.2f (the cluster keeps its datasheet peak, %.0f TFLOP/s %s)\n",
                d.peak_flops / unit, c.gpu.PeakFlops(p.precision) / unit,
                p.precision == Precision::kFp32 ? "fp32" : "bf16");
  else
    std::printf("  best     %8.2f (the cluster's peak)\n", d.peak_flops / unit);
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

// Writes the calibrated cluster, with a header saying where it comes from, and reads it back.
Status WriteCalibrated(const CalibrateFlags& f, const std::string& base_file, const Placement& p,
                       const ClusterSpec& c) {
  const MeasuredPrimitives& m = c.measured;
  std::ofstream out(f.out);
  out << "# " << c.name << ": " << base_file << " calibrated by `ptdp calibrate --backend "
      << f.backend << (f.quick ? " --quick" : "") << "` on " << m.host << ", " << m.date << ".\n";
  if (p.communicator == "threads")
    out << "# gpu.peak, gpu.hbm_bandwidth and intra_node bandwidth/latency are measured (best GEMM,\n"
        << "# copy, p2p); the `measured:` curves below are what the cost model composes times from.\n";
  else
    out << "# Measured on " << Describe(p) << ".\n"
        << "# gpu.peak, gpu.hbm_bandwidth and intra_node are the base's datasheet figures; the\n"
        << "# `measured:` curves below are what the cost model composes times from.\n";
  out << ClusterToYaml(c);
  out.close();
  if (!out) return Status::Error(f.out + ": cannot write the calibrated cluster");
  // Read it back: what we wrote must load as a cluster the cost model accepts.
  auto check = LoadClusterFile(f.out);
  if (!check.ok())
    return Status::Error("internal error: the written file does not load: " + check.status().message());
  return Status::Ok();
}

// "1.00x 1.12x 0.98x": each sweep's time against the points' medians.
std::string SweepTimes(const rt::MicrobenchReport& r) {
  std::string s;
  for (double v : r.sweep_time) {
    char b[32];
    std::snprintf(b, sizeof b, "%s%.2fx", s.empty() ? "" : " ", v);
    s += b;
  }
  return s;
}

nlohmann::json SummaryJson(const CalibrateFlags& f, const MeasuredPrimitives& m, const Derived& d,
                           double elapsed_s, double others, const rt::MicrobenchReport& r) {
  return {{"out", f.out},
          {"backend", m.backend},
          {"communicator", m.communicator},
          {"host", m.host},
          {"cores", m.cores},
          {"elapsed_s", elapsed_s},
          {"peak_flop_per_s", d.peak_flops},
          {"copy_bytes_per_s", d.copy_bw},
          {"p2p_bytes_per_s", d.p2p_bw},
          {"p2p_latency_s", d.p2p_latency_s},
          {"tables", m.tables.size()},
          {"other_cpu_share", others >= 0 ? nlohmann::json(others) : nullptr},
          {"machine_busy", others > kBusyShare},
          {"sweep_times", r.sweep_time},
          {"busy_cores_slowdown", m.busy_cores_slowdown},
          {"host_drift", r.Drift()},
          {"host_unsteady", r.Drift() > kUnsteadyDrift}};
}

int RunCalibrate(const CalibrateFlags& f) {
  if (f.out.empty()) return Fail("--out is required: the calibrated cluster YAML to write");
  auto place = Place(f);
  if (!place.ok()) return Fail(place.status().message());
  const Placement& p = *place;
  auto base_file = BaseCluster(f, p);
  if (!base_file.ok()) return Fail(base_file.status().message());
  auto base = LoadClusterFile(*base_file);
  if (!base.ok()) return Fail(base.status().message());
  auto max_ranks = MaxRanks(f, p, *base);
  if (!max_ranks.ok()) return Fail(max_ranks.status().message());
  // CUDA bf16 (the default): `ptdp train` runs bf16 plans with bf16 activations and weights
  // (TrainerConfig::bf16), so the ops are timed on bf16 tensors.
  rt::MicrobenchOptions opt = CalibrationOptions(
      f.backend, f.quick,
      f.backend == "cuda" && p.precision == Precision::kBf16 ? rt::DType::kBF16 : rt::DType::kF32);
  opt.max_ranks = *max_ranks;
  if (!f.json)
    std::printf("ptdp calibrate: %s backend, %s grids, collectives up to %d ranks%s (base %s)\n",
                f.backend.c_str(), f.quick ? "quick" : "full", *max_ranks,
                p.communicator == "threads" ? "" : (" on " + Describe(p)).c_str(), base_file->c_str());
  std::fflush(stdout);
  ProgressBar bar;
  OtherLoad load;
  const auto t0 = std::chrono::steady_clock::now();
  rt::MicrobenchReport report;
  auto measured = rt::RunMicrobenchmarks(
      p.make_world, opt, [&](double frac, const std::string& what) { bar(frac, what); }, &report);
  if (!measured.ok()) return Fail("calibrate: " + measured.status().message());
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MeasuredPrimitives& m = *measured;
  m.backend = f.backend;
  m.communicator = p.communicator;
  m.host = HostName();
  m.date = Today();
  m.cores = p.cores;
  // The CPU's cores computing at once run slower than one alone (the tables are timed on one):
  // the speed probe on one thread and on every core (cli/speed_probe.h), ~2 s on 2 cores.
  const bool busy_cores = p.communicator == "threads" && p.cores > 1;
  if (busy_cores) {
    auto busy = MeasureBusyCoresSlowdown(opt.act, p.cores);
    if (!busy.ok()) return Fail("calibrate: " + busy.status().message());
    m.busy_cores_slowdown = *busy;
  }
  const double others = load.Share();
  char note[160];
  std::snprintf(note, sizeof note, "%s grids;%s other processes used %.0f%% of the cores meanwhile",
                f.quick ? "quick" : "full",
                p.communicator == "threads" ? "" : p.precision == Precision::kFp32 ? " fp32 GEMMs;" : " bf16 GEMMs;",
                100 * std::max(0.0, others));
  m.note = note;
  if (!report.sweep_time.empty())
    m.note += "; the sweeps took " + SweepTimes(report) + " the points' median times";
  const Derived d = Derive(m);
  const ClusterSpec c = Calibrated(*base, m, d);
  if (Status st = WriteCalibrated(f, *base_file, p, c); !st.ok()) return Fail(st.message());
  if (f.json) {
    std::cout << DumpJson(SummaryJson(f, m, d, elapsed, others, report)) << "\n";
    return 0;
  }
  PrintSummary(m, p, d, c, elapsed);
  if (!report.sweep_time.empty())
    std::printf("the %zu sweeps over the op grids took %s the points' median times (each figure "
                "is the median)\n",
                report.sweep_time.size(), SweepTimes(report).c_str());
  if (busy_cores)
    std::printf("with all %d cores busy each op took %.2fx as long as on one core alone "
                "(busy_cores_slowdown: layouts of several ranks are predicted at that speed)\n",
                m.cores, m.busy_cores_slowdown);
  if (report.Drift() > kUnsteadyDrift)
    std::printf("warning: the host's speed moved %.0f%% between the sweeps: a spell over one sweep "
                "does not move the medians, but the figures are less steady than usual; run "
                "calibrate again when the host is quiet\n",
                100 * report.Drift());
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
  sub->add_option("--backend", f->backend,
                  "cpu (own kernels, ranks as threads) or cuda (GPU 0; collectives on GPU 0 by device "
                  "copies with 1 GPU, by NCCL over one GPU per rank with more) (default cpu)");
  sub->add_option("--cluster", f->cluster,
                  "base cluster YAML to calibrate (default configs/clusters/local-cpu.yaml; cuda: "
                  "dgx-a100/h100/h200.yaml after the GPU's name)");
  sub->add_option("--out", f->out, "the calibrated cluster YAML to write (required)");
  sub->add_option("--precision", f->precision,
                  "cuda: the GEMMs' precision, bf16 (default, as `ptdp train` runs bf16 plans) or "
                  "fp32 (as it runs fp32 plans)");
  sub->add_flag("--quick", f->quick, "coarser grids and shorter timings (a few seconds)");
  sub->add_option("--max-ranks", f->max_ranks,
                  "largest collective group to measure (default: ranks per node, at most 8; with "
                  "NCCL at most the GPUs)");
  sub->add_flag("--json", f->json, "machine-readable summary");
  return [f] { return RunCalibrate(*f); };
}

}  // namespace ptdp::cli
