// The reduction kernel of DeviceWorld's data plane (device_reduce.cu): n device buffers combined
// element by element in group-rank order on one stream. Internal to runtime/cuda.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "runtime/communicator.h"
#include "runtime/tensor.h"

typedef struct CUstream_st* cudaStream_t;

namespace ptdp::rt::cuda {

// Enqueues on `stream` (of the current device): dst[e] = ((in[0][e] op in[1][e]) op in[2][e]) ...
// for e < count.
//  - f32: each step rounds to f32, exactly as the host plane does, so results are bit-identical
//    to ThreadWorld's.
//  - bf16: the terms are widened to f32 and accumulated in f32 in the same order; the result is
//    rounded to bf16 once (round to nearest even). Groups of more than kMaxReduceInputs ranks
//    reduce in stages of kMaxReduceInputs - 1 further inputs, rounding to bf16 between stages.
//  - max: NaN propagates (a NaN in any input gives NaN), as on the host.
// dst must not overlap any input; every pointer is device memory of the current device.
// Returns the launch error, if any (the kernel's own faults show at the next synchronize).
Status LaunchReduce(void* dst, const std::vector<const void*>& in, int64_t count, DType dtype,
                    ReduceOp op, cudaStream_t stream);

// Inputs one kernel launch takes (the pointers travel as a kernel argument).
constexpr int kMaxReduceInputs = 32;

}  // namespace ptdp::rt::cuda
