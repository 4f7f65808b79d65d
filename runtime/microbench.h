// Microbenchmarks of the runtime's primitives, for `ptdp calibrate`: every op the GPT model
// calls, timed through the Backend interface over grids of shapes (GEMMs over (m, n, k), the
// attention core over (s, d), row-wise ops over (rows, cols), element-wise ops over sizes,
// allocation), and every collective and p2p transfer through the CommunicatorFactory over
// (ranks, bytes). The backends and the communicators are whatever one factory makes, a world of
// `ranks` ranks with each rank's backend (CPU backends + ThreadWorld; CudaBackends + DeviceWorld
// on one GPU or NcclWorld on one GPU per rank: cli/launch.h places them): the measurement code
// does not know which. The ops are timed on rank 0 of a one-rank world.
//
// Timing: one warm-up call, then `batches` batches, each repeating the call until
// `min_batch_s` has passed; the time of a call is the median batch's mean; with `passes` > 1
// the grids are swept that many times and a point's time is the median over the sweeps. The median, not the
// fastest: `ptdp train` reports the median step, and on a virtual machine the speed of a vCPU
// drifts with its host's load even when no other process of this machine runs (on the 2-core
// dev VM the same 1x1x1 step took 75 ms one hour and 80-98 ms the next, with no steal time
// shown); the fastest of a few 2 ms batches catches a lucky moment and predicted every layout
// 6-12% fast on such a host, the median 0-6%. On a quiet host the two agree. Other processes of
// this machine show in `ptdp train`'s measurements (timing.other_cpu_share).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/measured.h"
#include "core/status.h"
#include "runtime/backend.h"
#include "runtime/communicator.h"

namespace ptdp::rt {

// The grids a run measures (quick or full), exposed for tests and docs.
struct MicrobenchGrids {
  std::vector<double> gemm_dims;        // m, n and k each take these values
  std::vector<double> attention_s, attention_d;
  // Heads of batch 1 an attention call is timed with (its time / heads is the table's figure, one
  // (batch, head)): a few on a CPU, where heads run one after another; enough on a GPU that its
  // blocks (heads x query tiles) fill the device, as a training step's batch x heads do.
  int attention_heads = 4;
  std::vector<double> row_rows, row_cols;
  std::vector<double> elements;         // element-wise ops
  std::vector<double> gelu_sigma;       // standard deviations of GeLU's normal inputs
  std::vector<double> alloc_bytes;
  std::vector<double> comm_ranks, comm_bytes;  // bytes: multiples of 4 x the largest rank count
};

struct MicrobenchOptions {
  bool quick = false;         // coarser, smaller grids (tests, `make demo`): a few seconds
  int max_ranks = 8;          // largest collective group measured (>= 2)
  double min_batch_s = 2e-3;  // each batch repeats a call for at least this long
  int batches = 3;            // per pass, the median of this many batches
  // The ops' grids are swept this many times, one after the other, and each point's time is the
  // median over the sweeps (of each sweep's median batch): a point's batches are spread over the
  // whole calibration instead of a few milliseconds, so a slow spell of the host that covers part
  // of it (a VM's neighbours; on a GPU, a clock dip) moves one sweep's figure, not the point's.
  // Later sweeps reuse the first one's calls per batch (no second search). The collectives are
  // measured once, after the first sweep.
  int passes = 1;
  std::optional<MicrobenchGrids> grids;  // instead of the quick or full ones (tests)
  // Bytes of operands each op cycles through, so that a call finds its operands beyond the
  // nearest caches as in training (microbench.cc, kMinVariants); 0: ColdBytesOfThisHost().
  double cold_bytes = 0;
  // The dtype the runtime stores activations and weights in (GptChunk::act_dtype: kBF16 for
  // bf16 plans): the ops are timed on tensors of it, statistics, weight gradients and the
  // optimizer's tensors in fp32 as the runtime keeps them (backend.h's dtype rules), and
  // MeasuredPrimitives::element_bytes is its size.
  DType act = DType::kF32;
  // Only the ops on rank 0 (GEMMs, attention, row-wise, element-wise, allocation): no world of
  // several ranks, no collective tables (the speed probe of `ptdp train`).
  bool ops_only = false;
  // The backend is a GPU: the grids reach a training step's sizes (a GPU's efficiency still
  // climbs past the CPU grids' largest points: a 512^3 GEMM runs at a fraction of the rate of a
  // 8192 x 4096 x 1024 one, which a table extrapolated from 512 would charge at the small one's
  // rate), attention is timed with attention_heads enough to fill the device, and the operands
  // are copied from pools of random values on the device (FillFromPool) rather than from the
  // host, which for those grids would move tens of GB a sweep.
  bool device = false;
};
// Four times this host's largest per-core cache below the shared one (L2, from
// /sys/devices/system/cpu/cpu0/cache), at least 8 MiB; 8 MiB when sysfs does not say.
double ColdBytesOfThisHost();
MicrobenchGrids GridsFor(const MicrobenchOptions& opt);
// The speed probe's grids: one or two points of each op table, each a point of both the quick
// and the full grids (so that the calibration measured it rather than interpolating), some
// fifty timings in all (about half a second on the 2-core dev VM). `ptdp train` runs them with
// ops_only before and after its steps; `ptdp compare` holds them against the calibration
// (core/measured.h, HostSpeed).
MicrobenchGrids SpeedProbeGrids(bool device = false);

// Fills t (fp32 or bf16, contiguous) with values of `pool` (1-D, fp32, on t's backend), copied
// on the backend in pieces of at most the pool's length, each from an offset that depends on
// `seed` and on the piece (fp32 to bf16 rounded as Backend::Copy rounds).
Status FillFromPool(Backend& be, const Tensor& pool, uint32_t seed, Tensor& t);

// A world of ranks made together with their backends: a GPU communicator needs each rank's
// stream, i.e. its backend, so the two come from one factory (cli/launch.h's MakeLaunch).
struct BenchWorld {
  std::shared_ptr<CommunicatorFactory> comms;  // over every rank of the world
  // Rank r's backend, asked for once per rank, from rank r's thread; nullptr is an error.
  std::function<std::unique_ptr<Backend>(int rank)> backends;
  std::shared_ptr<void> keep_alive;  // what comms and backends need, until the world is done
};
// Makes a fresh world of `ranks` ranks, all driven by threads of this process; fails with the
// reason (no GPU, too few GPUs, a failed communicator set-up).
using MakeWorld = std::function<Result<BenchWorld>(int ranks)>;
// Called after each measured point: fraction done in [0, 1] and what was just measured.
using MicrobenchProgress = std::function<void(double fraction, const std::string& what)>;

// How the host ran while it was measured: with passes > 1, each sweep's time against the
// medians, the geometric mean over the op points of the sweep's time over the point's median (1:
// as the median; 1.3: a spell that made that sweep 30% slower). Empty with one pass.
struct MicrobenchReport {
  std::vector<double> sweep_time;
  // max / min of sweep_time, less 1 (0 with fewer than two sweeps): how far the host's speed
  // moved during the measurement.
  double Drift() const;
};

// Measures every table of MeasuredTableKinds() and the backend's attention storage: the ops on
// rank 0 of make_world(1), the collectives on make_world(r) for each r of the grid's comm_ranks
// (a world's communicators get Prepare()d with the benchmark's groups first, as NCCL needs).
// Fills `tables`, `attention_saved_per_*` and `element_bytes`; the caller sets backend, host,
// date, cores and communicator. Fails when a world cannot be made, the backend cannot allocate
// or a collective fails (naming it).
// `report`, when given, receives the sweeps' speeds.
Result<MeasuredPrimitives> RunMicrobenchmarks(const MakeWorld& make_world,
                                              const MicrobenchOptions& opt,
                                              const MicrobenchProgress& progress,
                                              MicrobenchReport* report = nullptr);

}  // namespace ptdp::rt
