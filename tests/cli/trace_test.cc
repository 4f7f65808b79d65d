// ChromeTraceJson against the Trace Event Format as Perfetto imports it: the complete events of
// every thread nest (here: never overlap), and every pipeline send has a flow ("s" in it, "f"
// with "bp":"e" in the matching receive on the peer rank). Checked on simulated steps of the
// shipped configs (the demo's plan, interleaved, pp 2, tp 1, GPipe with dp > 1, no pipeline)
// and on a hand-made step whose receives overlap.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "cli/common.h"
#include "cli/trace.h"

namespace ptdp::cli {
namespace {

using nlohmann::json;

const std::string kSrc = PTDP_SOURCE_DIR;

// Perfetto turns a microsecond "ts" or "dur" into nanoseconds with llround(us * 1000).
int64_t Ns(const json& us) { return std::llround(us.get<double>() * 1000.0); }

struct Slice {
  int64_t a, b;  // [a, b) ns
  std::string name;
};

using Thread = std::pair<int, int>;  // (pid, tid)

struct TraceCheck {
  int slices = 0, sends = 0, receives = 0, flows = 0;
  std::map<Thread, std::string> thread_names;
};

// The slice of `thread` that holds `ts` (a <= ts <= b), or nullptr.
const Slice* At(const std::map<Thread, std::vector<Slice>>& slices, Thread thread, int64_t ts) {
  auto it = slices.find(thread);
  if (it == slices.end()) return nullptr;
  for (const Slice& s : it->second)
    if (s.a <= ts && ts <= s.b) return &s;
  return nullptr;
}

// Fails the test for every pair of overlapping complete events on a thread, every send
// without exactly one flow and every flow whose ends are not a send and its receive.
TraceCheck CheckTrace(const json& trace) {
  TraceCheck c;
  std::map<Thread, std::vector<Slice>> slices;
  std::map<int64_t, std::vector<json>> flows;  // id -> its "s" and "f"
  for (const json& e : trace.at("traceEvents")) {
    const std::string ph = e.at("ph");
    if (ph == "M" && e["name"] == "thread_name")
      c.thread_names[{e["pid"], e["tid"]}] = e["args"]["name"];
    if (ph == "X") {
      const int64_t a = Ns(e["ts"]);
      slices[{e["pid"], e["tid"]}].push_back({a, a + Ns(e["dur"]), e["name"]});
      ++c.slices;
    }
    if (ph == "s" || ph == "f") flows[e.at("id").get<int64_t>()].push_back(e);
  }
  for (auto& [thread, list] : slices) {
    EXPECT_TRUE(c.thread_names.count(thread)) << "thread " << thread.second << " has no name";
    std::sort(list.begin(), list.end(), [](auto& x, auto& y) { return std::tie(x.a, x.b) < std::tie(y.a, y.b); });
    for (size_t i = 1; i < list.size(); ++i)
      EXPECT_LE(list[i - 1].b, list[i].a)
          << "pid " << thread.first << " tid " << thread.second << ": " << list[i - 1].name
          << " [" << list[i - 1].a << ", " << list[i - 1].b << ") overlaps " << list[i].name
          << " [" << list[i].a << ", " << list[i].b << ")";
    for (const Slice& s : list) {
      c.sends += s.name.rfind("send ", 0) == 0;
      c.receives += s.name.rfind("recv ", 0) == 0;
    }
  }
  std::map<std::pair<Thread, int64_t>, int> flows_from;  // (thread, send start) -> flows
  for (const auto& [id, ends] : flows) {
    EXPECT_EQ(ends.size(), 2u) << "flow " << id;
    if (ends.size() != 2) continue;
    const json& s = ends[0]["ph"] == "s" ? ends[0] : ends[1];
    const json& f = ends[0]["ph"] == "s" ? ends[1] : ends[0];
    EXPECT_EQ(s["ph"], "s") << id;
    EXPECT_EQ(f["ph"], "f") << id;
    EXPECT_EQ(s["cat"], f["cat"]) << id;
    EXPECT_EQ(s["name"], f["name"]) << id;
    EXPECT_EQ(f.value("bp", ""), "e") << id;
    const Slice* snd = At(slices, {s["pid"], s["tid"]}, Ns(s["ts"]));
    const Slice* rcv = At(slices, {f["pid"], f["tid"]}, Ns(f["ts"]));
    EXPECT_TRUE(snd && rcv) << "flow " << id << " binds to no slice";
    if (!snd || !rcv) continue;
    EXPECT_EQ(snd->name.rfind("send ", 0), 0u) << snd->name;
    EXPECT_EQ(rcv->name.rfind("recv ", 0), 0u) << rcv->name;
    // "send act F3.1 -> 2" on rank 1 goes with "recv act ... <- 1" on rank 2.
    const int to = std::stoi(snd->name.substr(snd->name.rfind(' ') + 1));
    const int from = std::stoi(rcv->name.substr(rcv->name.rfind(' ') + 1));
    EXPECT_EQ(f["pid"].get<int>(), to) << snd->name << " / " << rcv->name;
    EXPECT_EQ(s["pid"].get<int>(), from) << snd->name << " / " << rcv->name;
    EXPECT_EQ(snd->name.substr(5, 4), rcv->name.substr(5, 4)) << snd->name << " / " << rcv->name;
    ++flows_from[{{s["pid"], s["tid"]}, snd->a}];
    ++c.flows;
  }
  for (const auto& [thread, list] : slices)
    for (const Slice& s : list) {
      if (s.name.rfind("send ", 0) != 0) continue;
      EXPECT_EQ((flows_from[{thread, s.a}]), 1) << "pid " << thread.first << ": " << s.name;
    }
  return c;
}

struct Case {
  const char* what;
  const char* cluster;
  const char* model;
  int nodes;
  Layout layout;
  int expected_sends;  // 2 m (v p - 1): each micro-batch crosses v p - 1 boundaries, both ways
};

Layout L(int tp, int pp, int dp, int vp, int mb, int64_t gb) {
  Layout l;
  l.tp = tp; l.pp = pp; l.dp = dp; l.vp = vp; l.micro_batch = mb; l.global_batch = gb;
  l.schedule = vp > 1 ? ScheduleKind::kInterleaved : ScheduleKind::kOneFOneB;
  return l;
}

std::vector<Case> Cases() {
  Layout demo = L(8, 4, 32, 12, 3, 1536);  // `ptdp plan` rank 1 of scripts/demo.sh
  demo.sequence_parallel = true;
  demo.recompute = Recompute::kSelective;
  demo.distributed_optimizer = true;
  Layout gpipe = L(2, 2, 2, 1, 1, 16);
  gpipe.schedule = ScheduleKind::kGPipe;
  gpipe.overlap_grad_reduce = false;
  // Sends: demo m = 1536 / (3 x 32) = 16, 2 x 16 x 47; tp8 pp4 vp2 m 64, 2 x 64 x 7; pp 2 vp 2
  // m 16, 2 x 16 x 3; pp 8 m 32, 2 x 32 x 7; GPipe m = 16 / 2 = 8, 2 x 8 x 1; pp 1: none.
  return {{"demo tp8 pp4 dp32 vp12", "dgx-a100", "gpt3-175b", 128, demo, 2 * 16 * 47},
          {"tp8 pp4 vp2 (cli_test)", "dgx-a100", "gpt3-175b", 4, L(8, 4, 1, 2, 1, 64), 2 * 64 * 7},
          {"pp2 vp2: both ends wrap", "dgx-a100", "gpt3-13b", 1, L(4, 2, 1, 2, 1, 16), 2 * 16 * 3},
          {"tp1 pp8 1f1b", "dgx-a100", "gpt3-13b", 1, L(1, 8, 1, 1, 1, 32), 2 * 32 * 7},
          {"gpipe dp2, reduce after", "dgx-a100", "gpt3-13b", 1, gpipe, 2 * 8 * 1},
          {"pp1 dp8", "dgx-a100", "gpt3-13b", 1, L(1, 1, 8, 1, 1, 64), 0}};
}

TEST(ChromeTrace, NestsOnEveryThreadAndEverySendHasItsFlow) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.what);
    auto w = LoadWorld(kSrc + "/configs/clusters/" + c.cluster + ".yaml",
                       kSrc + "/configs/models/" + c.model + ".yaml", c.nodes, std::nullopt,
                       std::nullopt);
    ASSERT_TRUE(w.ok()) << w.status().message();
    auto sim = SimulateStep(*w->cost, c.layout, SimOptions{});
    ASSERT_TRUE(sim.ok()) << sim.status().message();
    Plan plan;
    plan.layout = c.layout;
    plan.model = w->model;
    const TraceCheck t = CheckTrace(json::parse(ChromeTraceJson(plan, *sim)));
    EXPECT_EQ(t.slices, int(sim->events.size()));
    EXPECT_EQ(t.sends, c.expected_sends);
    EXPECT_EQ(t.receives, c.expected_sends);
    EXPECT_EQ(t.flows, c.expected_sends);
    // No thread beyond the seven kinds: the simulator never overlaps two events of a kind.
    for (const auto& [thread, name] : t.thread_names)
      EXPECT_LT(thread.second, 7) << name;
  }
}

SimEvent Ev(int rank, OpKind kind, int mb, int peer, int transfer, double start_s, double end_s) {
  SimEvent e;
  e.rank = rank;
  e.track = peer >= 0 ? SimTrack::kComm : SimTrack::kCompute;
  e.kind = kind;
  e.microbatch = mb;
  e.chunk = 0;
  e.peer = peer;
  e.transfer = transfer;
  e.start_s = start_s;
  e.end_s = end_s;
  return e;
}

// Rank 1 receives micro-batches 0 and 1 from rank 0 over [0, 2) ms and [1, 3) ms (two links,
// say): the second receive cannot share a thread with the first, so it goes to "recv
// activations 2"; each send still has its arrow. Back-to-back forwards whose bounds are not
// exact in binary (0.1 + 0.2 s) meet exactly in whole nanoseconds.
TEST(ChromeTrace, OverlappingEventsOfAKindGetASecondThread) {
  SimResult sim;
  sim.ranks.resize(2);
  sim.step_time_s = 0.6;
  sim.events = {Ev(0, OpKind::kSendActivation, 0, 1, 0, 0.000, 0.002),
                Ev(1, OpKind::kRecvActivation, 0, 0, 0, 0.000, 0.002),
                Ev(0, OpKind::kSendActivation, 1, 1, 1, 0.002, 0.004),
                Ev(1, OpKind::kRecvActivation, 1, 0, 1, 0.001, 0.003),
                Ev(1, OpKind::kForward, 0, -1, -1, 0.1, 0.1 + 0.2),
                Ev(1, OpKind::kForward, 1, -1, -1, 0.1 + 0.2, 0.6)};
  const Plan plan;
  const TraceCheck t = CheckTrace(json::parse(ChromeTraceJson(plan, sim)));
  EXPECT_EQ(t.flows, 2);
  std::vector<std::string> rank1;
  for (const auto& [thread, name] : t.thread_names)
    if (thread.first == 1) rank1.push_back(name);
  EXPECT_EQ(rank1, (std::vector<std::string>{"compute", "recv activations", "recv activations 2"}));
}

// Issue 12: a NaN or negative figure reached the text output's bar lengths, and
// std::string(int(NaN), '#') died with "basic_string::_M_create". Bars of such figures are
// empty; a bar is never longer than its column.
TEST(TextOutput, BarsOfFiguresThatAreNotNumbersAreEmpty) {
  EXPECT_EQ(Bar(2.6, 40), "###");
  EXPECT_EQ(Bar(0.4, 40), "");
  EXPECT_EQ(Bar(1e30, 40), std::string(40, '#'));
  EXPECT_EQ(Bar(INFINITY, 40), std::string(40, '#'));
  EXPECT_EQ(Bar(-3, 40), "");
  EXPECT_EQ(Bar(std::nan(""), 40), "");
  Plan plan;
  plan.model.name = "m";
  plan.layout.global_batch = 8;
  Prediction& p = plan.prediction;
  p.step_time_s = std::nan("");
  p.breakdown.compute_s = 1;
  p.breakdown.dp_comm_s = -INFINITY;
  p.memory.capacity = 0;  // 0/0 for the stage bars
  p.stage_memory_bytes = {0, std::nan(""), -1, 1e9};
  const std::string text = RenderPrediction(plan);
  EXPECT_NE(text.find("memory per pipeline stage"), std::string::npos) << text;
}

TEST(TextOutput, TimelineOfAStepThatIsNotANumber) {
  SimResult sim;
  sim.ranks.resize(1);
  sim.step_time_s = std::nan("");
  sim.events = {Ev(0, OpKind::kForward, 0, -1, -1, 0, std::nan("")),
                Ev(0, OpKind::kBackward, 0, -1, -1, -1, INFINITY)};
  const std::string chart = AsciiTimeline(sim, 1, 20);
  EXPECT_NE(chart.find("rank 0"), std::string::npos) << chart;
}

}  // namespace
}  // namespace ptdp::cli
