// Chrome trace and ASCII Gantt of a simulated step; see trace.h.
#include "cli/trace.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace ptdp::cli {

std::string ChromeTraceJson(const Plan& plan, const SimResult& sim) {
  using nlohmann::json;
  json events = json::array();
  const int pp = int(sim.ranks.size());
  for (int r = 0; r < pp; ++r) {
    events.push_back({{"ph", "M"}, {"pid", r}, {"name", "process_name"},
                      {"args", {{"name", "pipeline rank " + std::to_string(r)}}}});
    events.push_back({{"ph", "M"}, {"pid", r}, {"name", "process_sort_index"},
                      {"args", {{"sort_index", r}}}});
    events.push_back({{"ph", "M"}, {"pid", r}, {"tid", 0}, {"name", "thread_name"},
                      {"args", {{"name", "compute"}}}});
    events.push_back({{"ph", "M"}, {"pid", r}, {"tid", 1}, {"name", "thread_name"},
                      {"args", {{"name", "communication"}}}});
  }
  for (const SimEvent& e : sim.events) {
    const char* cat = e.kind == OpKind::kForward    ? "forward"
                      : e.kind == OpKind::kBackward ? "backward"
                      : e.track == SimTrack::kComm  ? "communication"
                                                    : "optimizer";
    json ev = {{"ph", "X"}, {"pid", e.rank}, {"tid", int(e.track)}, {"name", e.Name()},
               {"cat", cat}, {"ts", e.start_s * 1e6}, {"dur", (e.end_s - e.start_s) * 1e6}};
    if (e.microbatch >= 0) ev["args"] = {{"microbatch", e.microbatch}, {"chunk", e.chunk}};
    events.push_back(ev);
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
  return out.dump() + "\n";
}

std::string AsciiTimeline(const SimResult& sim, int pp, int width) {
  const double scale = width / std::max(1e-300, sim.step_time_s);
  std::vector<std::string> rows(pp, std::string(width, '.'));
  for (const SimEvent& e : sim.events) {
    if (e.track != SimTrack::kCompute) continue;
    char c = '=';
    if (e.kind == OpKind::kForward) c = char('0' + e.microbatch % 10);
    if (e.kind == OpKind::kBackward) c = char('A' + e.microbatch % 26);
    const int a = std::clamp(int(std::floor(e.start_s * scale)), 0, width - 1);
    const int b = std::clamp(int(std::ceil(e.end_s * scale)), a + 1, width);
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
