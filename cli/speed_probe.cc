// The host speed probe (speed_probe.h).
#include "cli/speed_probe.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <thread>
#include <vector>

#include "cli/launch.h"
#include "core/limits.h"

namespace ptdp::cli {
namespace {

std::string Count(size_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

// The sum of the logs of every time a probe took, and how many there were.
double LogTotal(const MeasuredPrimitives& m, size_t* points = nullptr) {
  double sum = 0;
  size_t n = 0;
  for (const auto& [name, table] : m.tables)
    for (double t : table.seconds()) sum += std::log(t), ++n;
  if (points) *points = n;
  return sum;
}

}  // namespace

rt::MakeWorld BenchWorlds(const std::string& backend, Precision precision) {
  return [backend, precision](int ranks) -> Result<rt::BenchWorld> {
    Layout l;
    l.dp = ranks;
    l.precision = precision;  // fp32 plans run fp32 GEMMs on CUDA, the others bf16 ones
    LaunchOptions o;
    o.backend = backend;
    PTDP_ASSIGN_OR_RETURN(Launch run, MakeLaunch(l, o));
    return rt::BenchWorld{run.comms, run.backends, run.keep_alive};
  };
}

rt::MicrobenchOptions CalibrationOptions(const std::string& backend, bool quick, rt::DType act) {
  rt::MicrobenchOptions opt;
  opt.quick = quick;
  // Short batches (0.5 ms) on the CPU in both modes: at identical shapes, 2 ms batches timed the
  // GEMMs 21-25% faster (gemm_nt/nn/tn at 0.79/0.93/0.75 of the 0.5 ms figure) while element-wise
  // ops did not move, and training, which calls each GEMM once between other ops, runs at the
  // short-batch speed: with 2 ms batches the full calibration predicted every layout of `make
  // demo` 7-16% too fast, the quick one within +-7% (2-core VM, 2026-12-04). GPUs keep 2 ms
  // (launch and synchronization costs weigh more in short batches).
  if (quick || backend == "cpu") opt.min_batch_s = 5e-4;
  // Each point's batches spread over the calibration (MicrobenchOptions::passes): one batch a
  // sweep, the median of 3 sweeps (quick) or 5 (full). Back to back (the median of 3 batches
  // within ~2 ms), a spell of the VM's host that covered part of a quick calibration timed those
  // tables 1.3-2.4x slow: two calibrations two minutes apart predicted cp 2 at 13.3 and 18.4 ms,
  // which measured 13.7 ms both times (2-core VM, 2026-12-06). With 3 batches (full) one cell
  // timed while the host was busy moved a layout's prediction by up to 8%.
  opt.batches = 1;
  opt.passes = quick ? 3 : 5;
  // CUDA bf16 (the default): `ptdp train` runs bf16 plans with bf16 activations and weights
  // (TrainerConfig::bf16), so the ops are timed on bf16 tensors.
  opt.act = act;
  // A GPU's grids reach a training step's sizes, its operands filled on the device.
  opt.device = backend != "cpu";
  return opt;
}

Result<MeasuredPrimitives> RunSpeedProbe(const std::string& backend, rt::DType act, int threads) {
  if (threads < 1) return Status::Error("speed probe: threads must be >= 1");
  if (threads > 1 && backend != "cpu")
    return Status::Error("speed probe: several threads only on the CPU backend");
  rt::MicrobenchOptions opt = CalibrationOptions(backend, /*quick=*/false, act);
  opt.grids = rt::SpeedProbeGrids(opt.device);
  opt.ops_only = true;
  const Precision gemms = act == rt::DType::kBF16 ? Precision::kBf16 : Precision::kFp32;
  std::vector<Result<MeasuredPrimitives>> runs(size_t(threads), Status::Error("not run"));
  {
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t)
      pool.emplace_back([&, t] {
        runs[size_t(t)] = rt::RunMicrobenchmarks(BenchWorlds(backend, gemms), opt, nullptr);
      });
    runs[0] = rt::RunMicrobenchmarks(BenchWorlds(backend, gemms), opt, nullptr);
    for (std::thread& th : pool) th.join();
  }
  for (const auto& r : runs)
    if (!r.ok()) return r.status();
  // The slowest thread's whole probe (the largest geometric mean over the points), not the
  // slowest time of each point: the maximum of N noisy timings of a point is biased up by the
  // noise, and it would mix cores; a synchronous step waits for the slowest core.
  size_t slowest = 0;
  double most = LogTotal(*runs[0]);
  for (size_t t = 1; t < runs.size(); ++t)
    if (const double x = LogTotal(*runs[t]); x > most) most = x, slowest = t;
  return std::move(*runs[slowest]);
}

Result<double> MeasureBusyCoresSlowdown(rt::DType act, int cores) {
  if (cores < 2) return Status::Error("busy-cores slowdown: needs at least 2 cores");
  double log_ratio = 0;
  for (int round = 0; round < 2; ++round) {
    double logs[2] = {0, 0};
    size_t points = 0;
    for (int k = 0; k < 2; ++k) {
      PTDP_ASSIGN_OR_RETURN(const MeasuredPrimitives m,
                            RunSpeedProbe("cpu", act, k == 0 ? 1 : cores));
      logs[k] = LogTotal(m, &points);
    }
    if (points == 0) return Status::Error("busy-cores slowdown: the probe timed no point");
    log_ratio += (logs[1] - logs[0]) / double(points);
  }
  return std::max(1.0, std::exp(log_ratio / 2));
}

nlohmann::json SpeedProbeJson(const std::string& backend, int threads,
                              const MeasuredPrimitives& before, const MeasuredPrimitives& after) {
  nlohmann::json points = nlohmann::json::array();
  for (const auto& [name, table] : before.tables) {
    const MeasuredTable* later = after.Table(name);
    if (!later) continue;
    for (const std::vector<double>& row : table.Rows()) {
      const std::vector<double> at(row.begin(), row.end() - 1);
      points.push_back({{"table", name}, {"at", at}, {"before_s", row.back()},
                        {"after_s", later->Seconds(at)}});
    }
  }
  return {{"backend", backend}, {"threads", threads}, {"points", points}};
}

Result<MeasuredPrimitives> SpeedProbeFromJson(const nlohmann::json& j, const std::string& file,
                                              double* drift_within) {
  const std::string where = file + ": speed_probe";
  if (!j.is_object() || !j.contains("points") || !j["points"].is_array())
    return Status::Error(where + ": expected an object with a points array");
  std::map<std::string, std::vector<std::vector<double>>> rows;
  double log_within = 0;
  int n = 0;
  for (const nlohmann::json& p : j["points"]) {
    const std::string at_point = where + " point " + std::to_string(n + 1);
    if (!p.is_object() || !p.contains("table") || !p["table"].is_string() || !p.contains("at") ||
        !p["at"].is_array() || !p.contains("before_s") || !p["before_s"].is_number() ||
        !p.contains("after_s") || !p["after_s"].is_number())
      return Status::Error(at_point + ": expected {table, at, before_s, after_s}");
    const std::string name = p["table"].get<std::string>();
    const TableKind* kind = FindTableKind(name);
    if (!kind) return Status::Error(at_point + ": unknown table '" + name + "'");
    if (p["at"].size() != kind->axes.size())
      return Status::Error(at_point + ": table " + name + " has " +
                           Count(kind->axes.size(), "axis", "axes") + ", 'at' " +
                           Count(p["at"].size(), "value", "values"));
    std::vector<double> row;
    for (const nlohmann::json& v : p["at"]) {
      if (!v.is_number()) return Status::Error(at_point + ": 'at' holds a non-number");
      row.push_back(v.get<double>());
    }
    const double before = p["before_s"].get<double>(), after = p["after_s"].get<double>();
    for (double t : {before, after})
      if (Status st = CheckRange(t, limits::kMeasuredSeconds); !st.ok())
        return st.Prefixed(at_point);
    row.push_back(std::sqrt(before * after));
    rows[name].push_back(std::move(row));
    log_within += std::log(after / before);
    ++n;
  }
  if (n == 0) return Status::Error(where + ": no points");
  MeasuredPrimitives m;
  for (const auto& [name, r] : rows) {
    const std::vector<double> exponents = FindTableKind(name)->Exponents();
    PTDP_ASSIGN_OR_RETURN(m.tables[name],
                          MeasuredTable::FromRows(r, exponents, where + " " + name));
  }
  if (drift_within) *drift_within = std::exp(log_within / n);
  return m;
}

}  // namespace ptdp::cli
