// The host speed probe: `ptdp train --out` times a few points of the calibration's op tables
// (rt::SpeedProbeGrids, through the calibration's own measurement code and options) before its
// first step and after its last, and writes them to measured.json (`speed_probe`); `ptdp
// compare` holds them against the calibrated tables (core/measured.h, HostSpeed) to tell the
// host's drift since calibration from the cost model's error.
//
//   auto before = RunSpeedProbe("cpu", rt::DType::kF32, 2);  // ~0.5 s on the 2-core dev VM
//   ... train ...
//   auto after = RunSpeedProbe("cpu", rt::DType::kF32, 2);
//   j["speed_probe"] = SpeedProbeJson("cpu", 2, *before, *after);
//   auto probe = SpeedProbeFromJson(j["speed_probe"], "measured.json");  // back, in compare
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/layout.h"
#include "core/measured.h"
#include "core/status.h"
#include "runtime/microbench.h"

namespace ptdp::cli {

// The worlds `ptdp calibrate` measures in: `ranks` ranks placed by MakeLaunch as `ptdp train`
// places a plan of that size (precision: the CUDA GEMMs').
rt::MakeWorld BenchWorlds(const std::string& backend, Precision precision);

// The microbenchmark options `ptdp calibrate` times with (the batches, their length and the
// dtype the ops run on), which the speed probe shares so that its figures and the calibration's
// are the same statistic. `act`: the dtype a run stores activations in (bf16 only on CUDA).
rt::MicrobenchOptions CalibrationOptions(const std::string& backend, bool quick, rt::DType act);

// The probe (SpeedProbeGrids, ops only) on `threads` threads at once, each on rank 0 of a
// one-rank world of its own; the slowest thread's probe comes back: a run of several ranks on
// the CPU keeps that many cores busy at once, and a synchronous step waits for its slowest rank
// (two busy vCPUs ran 1.2-1.35x apart within a run on the dev VM). threads > 1 only for the CPU
// backend (ranks on one GPU take turns; the cost model counts that already). Fails as the
// microbenchmarks do (no GPU, an allocation), or on threads < 1.
Result<MeasuredPrimitives> RunSpeedProbe(const std::string& backend, rt::DType act,
                                         int threads = 1);

// MeasuredPrimitives::busy_cores_slowdown for `calibrate`: the probe on one thread and on
// `cores` threads at once (the slowest), twice each in turn (1, cores, 1, cores) so that a
// drift of the host over the four does not read as a slowdown; the geometric mean over the
// points of the busy probes over the lone ones, at least 1. CPU backend, cores >= 2.
Result<double> MeasureBusyCoresSlowdown(rt::DType act, int cores);

// measured.json's `speed_probe`: {backend, threads, points: [{table, at, before_s, after_s}]}.
// Precondition: before and after come from RunSpeedProbe on the same backend (the same points).
nlohmann::json SpeedProbeJson(const std::string& backend, int threads,
                              const MeasuredPrimitives& before, const MeasuredPrimitives& after);

// The probe read back: each point's time the geometric mean of before_s and after_s (the
// host's speed over the run); `drift_within` (may be null) gets the geometric mean of
// after_s / before_s (how much the host's speed moved during the run). Fails naming `file` on
// a malformed object, an unknown table or a non-positive time.
Result<MeasuredPrimitives> SpeedProbeFromJson(const nlohmann::json& j, const std::string& file,
                                              double* drift_within);

}  // namespace ptdp::cli
