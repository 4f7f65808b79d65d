// Chrome trace and ASCII Gantt of a simulated step; see trace.h.
#include "cli/trace.h"

#include "cli/common.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <set>
#include <tuple>
#include <vector>

namespace ptdp::cli {
namespace {

using nlohmann::json;

// A pipeline rank's process has a thread per kind of work, so that the complete events of a
// thread never overlap (the Trace Event Format wants those of a thread to nest): compute ops
// run one at a time; a rank's sends share its outbound link, which the simulator serialises;
// activations arrive from the previous rank only and gradients from the next, whose links
// serialise them; DP reductions queue on the communication stream; the embedding all-reduce
// comes once. Were two events of a kind still to overlap, the later would go to a second
// thread of that kind ("recv activations 2").
constexpr const char* kThreadNames[] = {"compute",        "send activations", "recv activations",
                                        "send gradients", "recv gradients",   "dp reduce",
                                        "embedding all-reduce"};
constexpr int kThreadKinds = 7;

int ThreadKind(OpKind k) {
  switch (k) {
    case OpKind::kForward:
    case OpKind::kBackward:
    case OpKind::kOptimizerStep: return 0;
    case OpKind::kSendActivation: return 1;
    case OpKind::kRecvActivation: return 2;
    case OpKind::kSendGradient: return 3;
    case OpKind::kRecvGradient: return 4;
    case OpKind::kReduceGradients: return 5;
    case OpKind::kReduceEmbedding: return 6;
  }
  return 0;
}

// Times are written in whole nanoseconds (as microseconds with three decimals), so that an
// event ending where the next begins ends exactly there after Perfetto's import too.
int64_t Ns(double s) { return std::llround(s * 1e9); }
double Us(int64_t ns) { return double(ns) / 1e3; }

// The tid of every event: its kind + kThreadKinds * lane, on the first lane of its kind and rank
// that is free when it starts.
std::vector<int> AssignThreads(const std::vector<SimEvent>& ev) {
  std::vector<size_t> order(ev.size());
  for (size_t i = 0; i < ev.size(); ++i) order[i] = i;
  auto key = [&](size_t i) {
    return std::make_tuple(ev[i].rank, ThreadKind(ev[i].kind), Ns(ev[i].start_s), i);
  };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
  std::vector<int> tid(ev.size());
  std::vector<int64_t> lane_end;  // of the current (rank, kind)
  for (size_t n = 0; n < order.size(); ++n) {
    const SimEvent& e = ev[order[n]];
    const int kind = ThreadKind(e.kind);
    if (n == 0 || e.rank != ev[order[n - 1]].rank || kind != ThreadKind(ev[order[n - 1]].kind))
      lane_end.clear();
    size_t lane = 0;
    while (lane < lane_end.size() && lane_end[lane] > Ns(e.start_s)) ++lane;
    if (lane == lane_end.size()) lane_end.push_back(0);
    lane_end[lane] = Ns(e.end_s);
    tid[order[n]] = kind + kThreadKinds * int(lane);
  }
  return tid;
}

std::string ThreadName(int tid) {
  const int lane = tid / kThreadKinds;
  return kThreadNames[tid % kThreadKinds] + (lane > 0 ? " " + std::to_string(lane + 1) : "");
}

json CompleteEvent(const SimEvent& e, int tid) {
  const char* cat = e.kind == OpKind::kForward    ? "forward"
                    : e.kind == OpKind::kBackward ? "backward"
                    : e.track == SimTrack::kComm  ? "communication"
                                                  : "optimizer";
  const int64_t a = Ns(e.start_s), b = Ns(e.end_s);
  json ev = {{"ph", "X"}, {"pid", e.rank}, {"tid", tid}, {"name", e.Name()},
             {"cat", cat}, {"ts", Us(a)}, {"dur", Us(b - a)}};
  if (e.microbatch >= 0) ev["args"] = {{"microbatch", e.microbatch}, {"chunk", e.chunk}};
  return ev;
}

// A flow event ("s" at the send, "f" at the receive) in the middle of the slice it binds to.
json FlowEvent(const char* ph, const SimEvent& e, int tid) {
  const bool act = e.kind == OpKind::kSendActivation || e.kind == OpKind::kRecvActivation;
  json f = {{"ph", ph}, {"id", e.transfer}, {"cat", "p2p"}, {"name", act ? "activation" : "gradient"},
            {"pid", e.rank}, {"tid", tid}, {"ts", Us((Ns(e.start_s) + Ns(e.end_s)) / 2)}};
  if (ph[0] == 'f') f["bp"] = "e";  // bind to the enclosing slice, the receive
  return f;
}

}  // namespace

std::string ChromeTraceJson(const Plan& plan, const SimResult& sim) {
  json events = json::array();
  const int pp = int(sim.ranks.size());
  for (int r = 0; r < pp; ++r) {
    events.push_back({{"ph", "M"}, {"pid", r}, {"name", "process_name"},
                      {"args", {{"name", "pipeline rank " + std::to_string(r)}}}});
    events.push_back({{"ph", "M"}, {"pid", r}, {"name", "process_sort_index"},
                      {"args", {{"sort_index", r}}}});
  }
  const std::vector<int> tid = AssignThreads(sim.events);
  std::set<std::pair<int, int>> threads;  // (pid, tid) with events
  struct End {
    const SimEvent* event = nullptr;
    int tid = 0;
  };
  std::vector<std::array<End, 2>> transfers(sim.events.size());  // by number: {send, receive}
  for (size_t i = 0; i < sim.events.size(); ++i) {
    const SimEvent& e = sim.events[i];
    threads.insert({e.rank, tid[i]});
    events.push_back(CompleteEvent(e, tid[i]));
    if (e.transfer >= 0 && size_t(e.transfer) < transfers.size()) {
      const bool sends = e.kind == OpKind::kSendActivation || e.kind == OpKind::kSendGradient;
      transfers[size_t(e.transfer)][sends ? 0 : 1] = {&e, tid[i]};
    }
  }
  for (const auto& [pid, t] : threads) {
    events.push_back({{"ph", "M"}, {"pid", pid}, {"tid", t}, {"name", "thread_name"},
                      {"args", {{"name", ThreadName(t)}}}});
    events.push_back({{"ph", "M"}, {"pid", pid}, {"tid", t}, {"name", "thread_sort_index"},
                      {"args", {{"sort_index", t % kThreadKinds * 16 + t / kThreadKinds}}}});
  }
  // An arrow from each send to its receive on the peer rank.
  for (const auto& [snd, rcv] : transfers)
    if (snd.event && rcv.event) {
      events.push_back(FlowEvent("s", *snd.event, snd.tid));
      events.push_back(FlowEvent("f", *rcv.event, rcv.tid));
    }
  for (int r = 0; r < pp; ++r)
    for (const auto& [t, bytes] : sim.ranks[r].memory_timeline)
      events.push_back({{"ph", "C"}, {"pid", r}, {"name", "memory GiB"}, {"ts", t * 1e6},
                        {"args", {{"GiB", bytes / 1073741824.0}}}});
  json out = {{"traceEvents", events},
              {"displayTimeUnit", "ms"},
              {"otherData",
               {{"tool", "ptdp simulate"},
                {"model", plan.model.name},
                {"cluster", plan.cluster_name},
                {"layout", plan.layout.ShortName() + " [" + plan.layout.Knobs() + "]"},
                {"schedule", ToString(plan.layout.schedule)},
                {"step_time_s", sim.step_time_s}}}};
  return DumpJson(out, -1) + "\n";
}

namespace {

// x clamped to lo..hi in double, then made an int: a NaN or huge x never reaches int() (UB).
int ClampedColumn(double x, int lo, int hi) {
  if (!(x > lo)) return lo;
  return x < hi ? int(x) : hi;
}

}  // namespace

std::string AsciiTimeline(const SimResult& sim, int pp, int width) {
  const double scale =
      std::isfinite(sim.step_time_s) && sim.step_time_s > 0 ? width / sim.step_time_s : 0;
  std::vector<std::string> rows(pp, std::string(width, '.'));
  for (const SimEvent& e : sim.events) {
    if (e.track != SimTrack::kCompute) continue;
    char c = '=';
    if (e.kind == OpKind::kForward) c = char('0' + e.microbatch % 10);
    if (e.kind == OpKind::kBackward) c = char('A' + e.microbatch % 26);
    const int a = ClampedColumn(std::floor(e.start_s * scale), 0, width - 1);
    const int b = ClampedColumn(std::ceil(e.end_s * scale), a + 1, width);
    for (int i = a; i < b; ++i) rows[e.rank][i] = c;
  }
  std::string out;
  char buf[64];
  for (int r = 0; r < pp; ++r) {
    std::snprintf(buf, sizeof buf, "rank %-3d |", r);
    out += buf + rows[r] + "|\n";
  }
  // Time axis: "0" under the first column, the step time right-aligned under the last.
  const std::string end = std::to_string(sim.step_time_s * 1e3).substr(0, 8) + " ms";
  std::string axis = "          0" + std::string(std::max<int>(1, width + 1 - int(end.size())), ' ');
  out += axis + end + "\n";
  out += "digits: forward of micro-batch n (mod 10); letters: backward (A = 0); "
         "'.': idle or waiting; '=': dp reduce / optimizer\n";
  return out;
}

}  // namespace ptdp::cli
