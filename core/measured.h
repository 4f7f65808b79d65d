// MeasuredPrimitives: what `ptdp calibrate` measured on one machine through the runtime's
// Backend and Communicator: seconds of GEMMs over (m, n, k), of the attention core over (s, d),
// of the element-wise and row-wise ops over their sizes, of each collective over (ranks, bytes)
// and of p2p transfers, plus how the measured backend stores tensors. A cluster YAML carries it
// under `measured:`; the cost model then composes a layer's time from these primitives
// (cost_model/runtime_model.h) instead of from peak FLOP/s and efficiency constants.
//
// Every table is a full grid of positive axis values with one time per point, read and written
// as rows `[axis values..., seconds]`. Between grid points the time is interpolated linearly in
// log(axis) of log(seconds) (multilinear over the axes); below the grid the smallest point's time
// is a floor (small ops cost their fixed overhead); above it the time scales with the axis to
// the table's exponent (e.g. a GEMM's time grows linearly in m past the largest m measured).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/status.h"

namespace YAML { class Node; }

namespace ptdp {

// One axis of a table kind: its name and how time scales with it past the largest value.
struct TableAxis {
  const char* name;
  double exponent;  // seconds ~ value^exponent above the grid
};

// A kind of table: its name under `measured.tables`, axes and what one time means.
struct TableKind {
  const char* name;
  std::vector<TableAxis> axes;
  const char* what;  // one line for the YAML comment and docs
  // A calibration may lack it: the backend does not fuse what it times (the GEMM epilogues on
  // the CPU), or the file predates it; the cost model then sums the separate ops' tables.
  bool optional = false;
  // The axes' exponents, in order (MeasuredTable::FromRows's `exponents`).
  std::vector<double> Exponents() const;
};

// Every table kind the cost model reads, in the order calibrate writes them.
const std::vector<TableKind>& MeasuredTableKinds();
// The kind named `name`, or nullptr.
const TableKind* FindTableKind(const std::string& name);

class MeasuredTable {
 public:
  MeasuredTable() = default;
  // A full grid: `axis_values[i]` ascending and positive for axis i, `seconds` row-major with the
  // last axis fastest. Precondition: seconds.size() == product of the axis sizes, all > 0.
  MeasuredTable(std::vector<std::vector<double>> axis_values, std::vector<double> seconds,
                std::vector<double> exponents);

  // Builds the grid from rows [axis values..., seconds] in any order. Fails (naming `where`) on
  // a row of the wrong length, a non-positive value, a duplicate point or a missing one.
  static Result<MeasuredTable> FromRows(const std::vector<std::vector<double>>& rows,
                                        const std::vector<double>& exponents,
                                        const std::string& where);

  // Interpolated seconds at `at` (one value per axis, each > 0). No allocation: the cost
  // model calls this a few dozen times per layout it evaluates.
  double Seconds(const double* at) const;
  double Seconds(const std::vector<double>& at) const { return Seconds(at.data()); }
  double Seconds(double a) const { return Seconds(&a); }
  double Seconds(double a, double b) const {
    const double at[2] = {a, b};
    return Seconds(at);
  }
  double Seconds(double a, double b, double c) const {
    const double at[3] = {a, b, c};
    return Seconds(at);
  }

  static constexpr size_t kMaxDims = 3;  // tables have 1 to 3 axes

  // The rows, axis values then seconds, in grid order (for writing).
  std::vector<std::vector<double>> Rows() const;
  size_t dims() const { return axes_.size(); }
  const std::vector<std::vector<double>>& axis_values() const { return axes_; }
  const std::vector<double>& seconds() const { return seconds_; }
  // The same grid with every time multiplied by `factor` (> 0).
  MeasuredTable Scaled(double factor) const;

 private:
  std::vector<std::vector<double>> axes_;
  std::vector<double> log_seconds_;  // log of seconds_, for interpolation
  std::vector<double> seconds_;
  std::vector<double> exponents_;
};

struct MeasuredPrimitives {
  std::string backend;             // runtime backend measured: "cpu" or "cuda"
  // The communicator the collectives went through: "threads" (ThreadWorld, CPU), "device"
  // (DeviceWorld: every rank on one GPU, device copies) or "nccl" (NcclWorld, a GPU per rank);
  // empty when not recorded (files from before the key).
  std::string communicator;
  std::string host;                // hostname of the machine
  std::string date;                // when, YYYY-MM-DD
  std::string note;                // free text (e.g. the machine's load), may be empty
  // Ranks that compute at once at full speed: the CPU's cores; on CUDA the GPUs calibrate saw
  // (one rank per GPU, as `ptdp train` places them; 1 when every rank shares GPU 0). More ranks
  // than this on a node share them: their compute takes ranks / cores times longer.
  int cores = 1;
  // Bytes per element of the tensors the runtime keeps (activations, weights, gradients and
  // AdamW state): 4 for the fp32 runtime.
  double element_bytes = 4;
  // Elements the backend's attention saves for the backward per (batch, head): a per score
  // (s x s) term and a per token (s) term (1 and 0 when it saves the probabilities P; 0 and a
  // few for a flash-style kernel that keeps only row statistics). Absent in the YAML: 0.
  double attention_saved_per_score = 0;
  double attention_saved_per_token = 0;
  // How much longer an op takes on each core while every one of the `cores` computes than on
  // one core alone (shared caches and memory bandwidth; a VM's vCPUs sharing physical cores):
  // calibrate's speed probe on `cores` threads at once (the slowest) over the probe on one, CPU
  // only. The tables are timed on one core. 1: not measured, or nothing shared (a GPU a rank).
  double busy_cores_slowdown = 1;
  std::map<std::string, MeasuredTable> tables;  // by TableKind name

  // The slowdown of `busy` ranks computing at once: 1 for one, busy_cores_slowdown with every
  // core busy, in proportion to the busy cores beyond the first in between.
  double BusyCoresFactor(double busy) const;

  bool empty() const { return tables.empty(); }
  // The table named `name`; nullptr when absent.
  const MeasuredTable* Table(const std::string& name) const;
  // Fails naming `file` when a table the cost model needs is missing.
  Status CheckComplete(const std::string& file) const;
};

// How fast a host ran the op tables' primitives at one moment against a calibration of it:
// `ptdp train` times a few points of the op tables (SpeedProbeGrids in runtime/microbench.h,
// the calibration's own measurement code) before and after its steps, and `ptdp compare` holds
// them against the calibrated tables at the same points. A ratio above 1: the host ran slower
// than when it was calibrated. On a virtual machine the same ops drift by 10-30% within minutes
// (a neighbour's load, invisible from inside); on a GPU, clocks and temperature do the same.
struct HostSpeed {
  std::map<std::string, double> by_table;  // geometric mean of probe / calibrated per table
  double overall = 0;                      // geometric mean over every point
  int points = 0;                          // points compared
};
// Fails, naming the table, when `probe` holds a table `calibrated` lacks, or holds no point.
// A probe that ran on `threads` threads at once (as many as the run kept cores busy) is held
// against the calibration times calibrated.BusyCoresFactor(threads): the slowdown of busy cores
// that the runtime model already applies is not the host's drift.
Result<HostSpeed> CompareHostSpeed(const MeasuredPrimitives& calibrated,
                                   const MeasuredPrimitives& probe, int threads = 1);
// `calibrated` as the host ran during the probe: each table of speed.by_table scaled by its
// ratio; the tables the probe did not time (collectives, p2p) as they are.
MeasuredPrimitives AtHostSpeed(const MeasuredPrimitives& calibrated, const HostSpeed& speed);

// Reads a `measured:` map strictly (unknown keys and tables are errors naming file:line).
Result<MeasuredPrimitives> MeasuredFromYaml(const YAML::Node& node, const std::string& file);
// The `measured:` block as YAML text (the key line included), readable back by
// MeasuredFromYaml to the same values.
std::string MeasuredToYaml(const MeasuredPrimitives& m);

}  // namespace ptdp
