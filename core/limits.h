// The physical range of every number ptdp reads (config files, plans, measured.json,
// checkpoint metadata, flags), in one table. A value outside its range is refused at input with
// a message naming the file, the key, the value as written and the range:
//   configs/clusters/x.yaml:7: gpu.hbm_bandwidth: "4.9e-324 GB/s" is outside 1 MB/s..1 PB/s
// so that no inf, NaN, denormal or absurd figure reaches the cost model, the planner or the
// trainer. The ranges are generous: every real GPU, CPU rank, network and model fits with
// orders of magnitude to spare (NVL72 racks, 16k+ GPU runs, Blackwell peaks, 1T-10T parameter
// models, 1M-token sequences, CPU ranks at a few GFLOP/s).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"
#include "core/units.h"

namespace ptdp {

// ---- Integer sizes ---------------------------------------------------------------------------

// Upper bound on the global batch (sequences) ptdp accepts: far above any real run (the largest
// published ones are ~10^4), low enough that enumerating its divisors and simulating its
// micro-batches stays fast and exact.
constexpr int64_t kMaxGlobalBatch = 1000000;

// Upper bound on every parallel size and on the world size (ranks, GPUs): 16x the biggest
// published training runs. Within it tp*cp*pp*dp and nodes*gpus_per_node fit an int.
constexpr int64_t kMaxWorldSize = 262144;

// The largest model sizes ptdp accepts, far above any published model (Megatron-1T: h 25600, f
// 102400, L 128; Llama 3 405B: V 128256). Within them every derived count (total_params(),
// FLOPs) fits int64 exactly: L * f * h * 3 <= 2^16 * 2^22 * 2^20 * 3 < 2^60, and
// L * h * h * 4 <= 2^58.
constexpr int64_t kMaxLayers = int64_t(1) << 16;
constexpr int64_t kMaxHidden = int64_t(1) << 20;
constexpr int64_t kMaxFfnHidden = int64_t(1) << 22;
constexpr int64_t kMaxSeqLen = int64_t(1) << 24;
constexpr int64_t kMaxVocab = int64_t(1) << 24;
// Routed experts of an MoE layer (DeepSeek-V3 256, Kimi K2 384; Megatron has no limit).
constexpr int64_t kMaxExperts = int64_t(1) << 14;
// Head sizes and MLA ranks (kv_channels, q/kv LoRA ranks, qk/v head dims).
constexpr int64_t kMaxHeadDim = int64_t(1) << 16;

// CPU cores of one machine (measured.cores); kept in an int.
constexpr int64_t kMaxCores = int64_t(1) << 20;
// Training steps (checkpoint step counts, warmup and decay lengths); kept in an int.
constexpr int64_t kMaxSteps = 1000000000;

// ---- Quantities ------------------------------------------------------------------------------

// The accepted values of one kind of quantity, SI units (bytes, bytes/s, seconds, FLOP/s) or a
// plain number. A value is accepted when it is finite and min <= v <= max (v < max when
// max_excluded), or when it is exactly 0 and zero_ok. A positive min keeps denormals and other
// near-zero values out of quantities that divide (bandwidths, rates, times per step).
struct Range {
  const char* what;             // for docs and tests: "GPU memory"
  double min, max;              // inclusive bounds (max excluded when max_excluded)
  std::optional<Dimension> dim; // how the bounds are written ("1 MiB"); none: a plain number
  bool zero_ok = false;         // 0 also accepted (an absent latency, an unused constant)
  bool max_excluded = false;    // [min, max): beta1, beta2
};

namespace limits {
// clang-format off
// Cluster YAML (topology/cluster.cc).
inline constexpr Range kGpuMemory{"GPU memory", 1048576.0, 1125899906842624.0, Dimension::kBytes};  // 1 MiB..1 PiB
inline constexpr Range kBandwidth{"bandwidth", 1e6, 1e15, Dimension::kBandwidth};                  // 1 MB/s..1 PB/s
inline constexpr Range kLatency{"latency", 1e-9, 1.0, Dimension::kDuration, /*zero_ok=*/true};     // 0 or 1 ns..1 s
inline constexpr Range kPeakFlops{"peak FLOP/s", 1e6, 1e18, Dimension::kFlopRate};                 // 1 MFLOP/s..1 EFLOP/s
inline constexpr Range kOversubscription{"oversubscription", 1, 1000, std::nullopt};
// Calibrated constants by their name's suffix: *_s seconds, *_bytes* bytes, others fractions,
// multipliers or element counts.
inline constexpr Range kCalibrationSeconds{"calibrated seconds", 1e-12, 60, Dimension::kDuration, true};
inline constexpr Range kCalibrationBytes{"calibrated bytes", 1e-6, 1125899906842624.0, Dimension::kBytes, true};
inline constexpr Range kCalibrationNumber{"calibrated constant", 1e-9, 1e9, std::nullopt, true};
// Measured primitives (`measured:` of a calibrated cluster, core/measured.cc).
inline constexpr Range kElementBytes{"bytes per element", 1, 64, std::nullopt};
inline constexpr Range kAttentionSaved{"saved elements", 0, 1e9, std::nullopt};
inline constexpr Range kBusyCoresSlowdown{"busy-cores slowdown", 1, 100, std::nullopt};
inline constexpr Range kTableAxis{"table axis value", 1e-9, 1e18, std::nullopt};
inline constexpr Range kMeasuredSeconds{"measured time", 1e-12, 1e6, Dimension::kDuration};       // a primitive's time
// Plan predictions (core/plan.cc): outputs of the cost model, so only what any plan it writes
// can hold (a 10T-parameter model on CPU ranks takes centuries): finite, not negative.
inline constexpr Range kPredictedStepTime{"predicted step time", 1e-12, 1e30, Dimension::kDuration};
inline constexpr Range kPredictedSeconds{"predicted seconds", 0, 1e30, Dimension::kDuration};
inline constexpr Range kPredictedBytes{"predicted bytes", 0, 1e30, Dimension::kBytes};
inline constexpr Range kPredictedTflops{"predicted TFLOP/s", 0, 1e12, std::nullopt};
inline constexpr Range kPredictedMfu{"predicted MFU", 0, 1e6, std::nullopt};
inline constexpr Range kFraction{"fraction", 0, 1, std::nullopt};
// measured.json of `ptdp train` (cli/compare.cc).
inline constexpr Range kRunStepTime{"measured step time", 1e-9, 1e9, Dimension::kDuration};
inline constexpr Range kRunSeconds{"measured seconds", 0, 1e9, Dimension::kDuration};
inline constexpr Range kRunBytes{"measured bytes", 0, 1152921504606846976.0, Dimension::kBytes};  // 0..1 EiB
inline constexpr Range kRunSteps{"steps", 0, 1e9, std::nullopt};
// The most loaded EP rank's routed rows over the mean (at most ep, the whole load on one rank).
inline constexpr Range kRunExpertLoad{"measured expert load", 1, 1e6, std::nullopt};
inline constexpr Range kMoeCapacityFactor{"MoE capacity factor", 0, 1000, std::nullopt, true};
inline constexpr Range kMoeAuxLossCoeff{"MoE auxiliary loss coefficient", 0, 1, std::nullopt, true};
inline constexpr Range kMachineCores{"machine cores", 0, double(kMaxCores), std::nullopt};
inline constexpr Range kCpuShare{"share of the cores", 0, 1000, std::nullopt};
// Optimizer settings (flags of `ptdp train` and checkpoint metadata; runtime/trainer.h).
inline constexpr Range kLearningRate{"learning rate", 1e-12, 1, std::nullopt};
inline constexpr Range kMinLearningRate{"minimum learning rate", 0, 1, std::nullopt};
inline constexpr Range kAdamBeta{"Adam beta", 0, 1, std::nullopt, false, /*max_excluded=*/true};
inline constexpr Range kAdamEps{"Adam epsilon", 1e-30, 1, std::nullopt};
inline constexpr Range kWeightDecay{"weight decay", 0, 100, std::nullopt};
inline constexpr Range kClipGrad{"gradient clipping norm", 0, 1e9, std::nullopt};
// clang-format on
}  // namespace limits

// "1 MB/s..1 PB/s", "0 or 1 ns..1 s", "0..1 (1 excluded)".
std::string RangeText(const Range& r);

// Whether `v` is finite and inside `r`.
bool InRange(double v, const Range& r);

// OK when `v` is in `r`; else an error "<text> is outside <range>", where `text` is the value
// as the user wrote it (empty: `v` formatted). Callers prefix the file and key.
Status CheckRange(double v, const Range& r, std::string_view text = {});

// Same for an integer of a count kept in an int or int64: "<v> is outside <min>..<max>".
Status CheckCount(int64_t v, int64_t min, int64_t max);

// ---- Text -----------------------------------------------------------------------------------

// Whether `s` is well-formed UTF-8 (no stray continuation byte, truncated sequence, overlong
// form, surrogate or code point past U+10FFFF). Every string ptdp reads must be: its --json
// outputs carry names and descriptions.
bool IsUtf8(std::string_view s);

// `s` with every byte that is not part of well-formed UTF-8, and every control character but
// tab, written as \xNN ("\xffA100"), so a message quoting bad input is itself printable.
std::string EscapeBytes(std::string_view s);

}  // namespace ptdp
