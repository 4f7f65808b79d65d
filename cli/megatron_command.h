// The Megatron-LM command line of a plan (`ptdp plan --emit megatron`).
#pragma once

#include <string>

#include "core/plan.h"

namespace ptdp::cli {

// The Megatron-LM command line for a plan.
std::string MegatronCommand(const Plan& plan);

}  // namespace ptdp::cli
