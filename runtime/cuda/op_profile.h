// Device time per backend op (PTDP_CUDA_PROFILE=1): the CUDA backend records an event on its
// stream before and after each op's kernels, reads them at each Synchronize (the end of a
// training step) and, when it is destroyed, prints the ops that took the device's time, the
// largest first, with the GEMMs and attention calls split by shape and their TFLOP/s. So the
// first minutes on a GPU say where a step's time goes (which kernel to make faster) without a
// profiler on the machine. Costs two event records an op: for a profile run, not a timed one.
//
// Between one op's end and the next op's start the stream runs what was enqueued between them
// (the communicators' copies and collectives on the same stream) or waits for the host to
// enqueue more: that time is reported as one line ("between ops").
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"

namespace ptdp::rt::cuda {

class OpProfile {
 public:
  OpProfile() = default;
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;
  ~OpProfile();

  // Whether PTDP_CUDA_PROFILE asks for it (set and not "0").
  static bool Requested();

  // An op starts / ends on `st`. Nested ops (a fallback calling other ops) count in the outer one.
  void Begin(const char* op, cudaStream_t st);
  void End(cudaStream_t st);
  // The running outermost op's shape ("mxpxk" for a GEMM) and floating-point operations; the
  // first call of an op counts (the op's own, before those of the GEMMs it runs).
  void Annotate(const std::string& shape, double flops);
  // Reads the recorded events (their stream synchronized) into the totals.
  Status Resolve();
  // The table: one line per op and shape, the largest total first; "" when nothing ran.
  std::string Table(const std::string& device) const;

  struct Total {
    int64_t calls = 0;
    double ms = 0, flops = 0;
  };
  const std::map<std::string, Total>& totals() const { return totals_; }

 private:
  struct Record {
    const char* op;
    std::string shape;
    double flops;
    cudaEvent_t start, end;
  };
  cudaEvent_t Take();

  int depth_ = 0;
  std::vector<Record> records_;
  std::vector<cudaEvent_t> pool_;
  std::map<std::string, Total> totals_;
  Total between_;  // between an op's end and the next op's start, within a step
};

}  // namespace ptdp::rt::cuda
