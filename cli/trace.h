// Renderings of a simulated step: Chrome trace-event JSON (opens in Perfetto / chrome://tracing)
// and an ASCII Gantt chart for the terminal.
#pragma once

#include <string>

#include "core/plan.h"
#include "cost_model/simulator.h"

namespace ptdp::cli {

// Trace-event JSON: a process per pipeline rank ("pipeline rank r") with a thread per kind of
// work ("compute", "send activations", "recv activations", "send gradients", "recv
// gradients", "dp reduce", "embedding all-reduce"; only those with events), complete ("X")
// events named F3.1 / B0.0 / send ... / recv ... / dp reduce / optimizer that never overlap on
// a thread, a flow (an "s" in the send, an "f" with "bp":"e" in the receive, cat "p2p", id the
// transfer's number) from each send to its receive, and a memory counter per rank. Times in
// microseconds, whole nanoseconds.
std::string ChromeTraceJson(const Plan& plan, const SimResult& sim);

// One row per pipeline rank, `width` columns over the step: digits are forwards (micro-batch
// mod 10), letters backwards (A = micro-batch 0, mod 26), '.' idle, '=' end-of-step work.
std::string AsciiTimeline(const SimResult& sim, int pp, int width);

}  // namespace ptdp::cli
