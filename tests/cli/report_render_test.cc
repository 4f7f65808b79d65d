// RenderReportHtml on synthetic data (no browser, no simulator): every section is there, text
// is escaped, the page is self-contained, and the Gantt chart has one row per pipeline rank.
#include <gtest/gtest.h>

#include <string>

#include "cli/report_html.h"
#include "tests/fakes/shell.h"

namespace ptdp::cli {
namespace {

using ptdp::testing::Count;

SimEvent Ev(int rank, SimTrack track, OpKind kind, int mb, int chunk, double start_s,
            double end_s, int peer = -1) {
  SimEvent e;
  e.rank = rank;
  e.track = track;
  e.kind = kind;
  e.microbatch = mb;
  e.chunk = chunk;
  e.peer = peer;
  e.start_s = start_s;
  e.end_s = end_s;
  return e;
}

// 4 pipeline ranks, 2 chunks of 4 micro-batches. Forwards take 10 ms, except micro-batch 3's
// 40 ms; backwards 20 ms; rank r starts 10 ms after rank r-1; the optimizer ends the step at
// 1 s. The plot is 1100 px wide, so 1 ms is 1.1 px: a 10 ms forward (11 px) is too narrow for
// the label "F0.0" (4 x 6.2 px + 4 = 28.8 px), a 40 ms one (44 px) is labelled.
ReportData Synthetic() {
  ReportData d;
  d.title = "ptdp report: test";
  d.model_name = "gpt-test";
  d.cluster_name = "dgx-test";
  d.gpus = 32;
  d.global_batch = 64;
  d.searched = true;
  d.evaluated = 100;
  d.legal = 40;
  d.fitting = 10;
  Layout l;
  l.tp = 2; l.pp = 4; l.dp = 4; l.vp = 2; l.micro_batch = 4; l.global_batch = 64;
  l.schedule = ScheduleKind::kInterleaved;
  ReportPlanRow row{l, 1.0, 150.0, 0.48, 0.2, 60e9, true, "analytic"};
  d.plans = {row, row};
  d.plans[1].layout.vp = 1;
  d.plans[1].step_time_s = 1.1;
  // Breakdown 6 + 1 + 0.5 + 0.25 + 2 + 0.25 = 10 s: compute is 60.0%.
  Breakdown& b = d.chosen.breakdown;
  b.compute_s = 6; b.tp_comm_s = 1; b.pp_comm_s = 0.5; b.dp_comm_s = 0.25; b.bubble_s = 2;
  b.optimizer_s = 0.25;
  d.chosen.step_time_s = 10;
  d.chosen.memory = {10e9, 20e9, 5e9, 20e9, 5e9, 60e9, 80e9};
  d.chosen.stage_memory_bytes = {60e9, 55e9, 50e9, 45e9};
  d.chosen.fits = true;
  d.rejected = {{"heads_not_divisible_by_tp", 50}, {"out_of_memory", 30}};
  d.explanation = {"tp2 pp4 dp4 vp2 mb4 beats tp2 pp4 dp4 vp1 mb4 by 0.1 s", "  bubble: less"};
  d.has_sim = true;
  d.sim.step_time_s = 1.0;
  d.sim.breakdown = b;
  d.sim.ranks.resize(4);
  for (int r = 0; r < 4; ++r) {
    double t = 0.01 * r;
    for (int c = 0; c < 2; ++c)
      for (int m = 0; m < 4; ++m) {
        const double len = m == 3 ? 0.04 : 0.01;
        d.sim.events.push_back(Ev(r, SimTrack::kCompute, OpKind::kForward, m, c, t, t + len));
        if (r < 3)
          d.sim.events.push_back(
              Ev(r, SimTrack::kComm, OpKind::kSendActivation, m, c, t + len, t + len + 0.002, r + 1));
        t += len;
      }
    for (int c = 1; c >= 0; --c)
      for (int m = 0; m < 4; ++m) {
        d.sim.events.push_back(Ev(r, SimTrack::kCompute, OpKind::kBackward, m, c, t, t + 0.02));
        t += 0.02;
      }
    d.sim.events.push_back(Ev(r, SimTrack::kComm, OpKind::kReduceGradients, -1, -1, t, t + 0.05));
    d.sim.events.push_back(Ev(r, SimTrack::kCompute, OpKind::kOptimizerStep, -1, -1, 0.95, 1.0));
  }
  return d;
}

TEST(ReportRender, HasEverySection) {
  const std::string html = RenderReportHtml(Synthetic());
  for (const char* id : {"ranking", "breakdown", "memory", "gantt", "rejected", "why"})
    EXPECT_NE(html.find(std::string("<section id=\"") + id + "\">"), std::string::npos) << id;
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("<body data-script-errors=\"0\">"), std::string::npos);
  EXPECT_NE(html.find("</html>"), std::string::npos);
}

TEST(ReportRender, EscapesText) {
  ReportData d = Synthetic();
  d.model_name = "gpt<script>alert('x')</script>&co";
  d.explanation.push_back("a \"quoted\" <b>line</b>");
  d.rejected.emplace_back("<img src=x>", 1);
  const std::string html = RenderReportHtml(d);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<img"), std::string::npos);
  EXPECT_EQ(html.find("<b>line"), std::string::npos);
  EXPECT_NE(html.find("gpt&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;co"), std::string::npos);
  EXPECT_NE(html.find("a &quot;quoted&quot; &lt;b&gt;line&lt;/b&gt;"), std::string::npos);
  EXPECT_EQ(HtmlEscape("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&#39;");
}

TEST(ReportRender, SelfContained) {
  const std::string html = RenderReportHtml(Synthetic());
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("@import"), std::string::npos);
  EXPECT_EQ(html.find("url("), std::string::npos);
}

TEST(ReportRender, GanttHasOneRowPerRank) {
  ReportData d = Synthetic();
  std::string html = RenderReportHtml(d);
  EXPECT_EQ(Count(html, "<g class=\"rank\""), 4u);
  for (int r = 0; r < 4; ++r)
    EXPECT_NE(html.find("data-rank=\"" + std::to_string(r) + "\""), std::string::npos) << r;
  // Without per-rank stats the rows come from the events (ranks 0..3).
  d.sim.ranks.clear();
  html = RenderReportHtml(d);
  EXPECT_EQ(Count(html, "<g class=\"rank\""), 4u);
}

TEST(ReportRender, GanttBoxesLabelsAndAxis) {
  const std::string html = RenderReportHtml(Synthetic());
  // 4 ranks x (8 forwards + 8 backwards + 1 optimizer) compute boxes + 3 x 8 sends + 4 DP
  // reductions = 68 + 24 + 4 = 96 event boxes, all at least 2 px wide (none merged).
  EXPECT_EQ(Count(html, "class=\"ev\""), 96u);
  // Micro-batch 3's forwards are 44 px wide: labelled; micro-batch 0's (11 px) are not.
  EXPECT_NE(html.find(">F3.1</text>"), std::string::npos);
  EXPECT_EQ(html.find(">F0.0</text>"), std::string::npos);
  EXPECT_NE(html.find("rank 1: send act F2.0 -&gt; 2"), std::string::npos);
  // Step 1 s: the axis is in seconds, ticks every 0.1 s; a 0.5 s step would be in ms.
  EXPECT_NE(html.find("time (s)"), std::string::npos);
  EXPECT_NE(html.find(">0.5</text>"), std::string::npos);
  ReportData d = Synthetic();
  d.sim.step_time_s = 0.5;
  for (SimEvent& e : d.sim.events) { e.start_s /= 2; e.end_s /= 2; }
  const std::string half = RenderReportHtml(d);
  EXPECT_NE(half.find("time (ms)"), std::string::npos);
  EXPECT_NE(half.find(">250</text>"), std::string::npos);
}

TEST(ReportRender, NarrowEventsAreMerged) {
  ReportData d = Synthetic();
  d.sim.events.clear();
  // 100,000 forwards of 10 us each on one rank over 1 s: 0.011 px each, merged into one box.
  for (int i = 0; i < 100000; ++i)
    d.sim.events.push_back(
        Ev(0, SimTrack::kCompute, OpKind::kForward, i, 0, i * 1e-5, (i + 1) * 1e-5));
  const std::string html = RenderReportHtml(d);
  EXPECT_EQ(Count(html, "class=\"ev\""), 1u);
  EXPECT_NE(html.find("100000 ops from F0.0 to F99999.0"), std::string::npos);
  EXPECT_LT(html.size(), 200000u);
}

TEST(ReportRender, BreakdownAndMemoryFigures) {
  const std::string html = RenderReportHtml(Synthetic());
  EXPECT_NE(html.find("compute: 6.0000 s (60.0%)"), std::string::npos);
  EXPECT_NE(html.find("bubble: 2.0000 s (20.0%)"), std::string::npos);
  // Stage 0 holds 60e9 B of 80e9 B capacity: 75.0%.
  EXPECT_NE(html.find("(75.0%)"), std::string::npos);
  EXPECT_NE(html.find("capacity "), std::string::npos);
  EXPECT_NE(html.find("heads_not_divisible_by_tp"), std::string::npos);
}

// A measured run of a pp 2 plan: predicted 50 ms against measured 40 ms (+25.0%), two ranks,
// each measured rank a 20 ms forward and a 20 ms backward (the 1100 px plot spans 50 ms: 440 px
// boxes, labelled).
ReportData WithComparison() {
  ReportData d = Synthetic();
  d.has_comparison = true;
  Comparison& c = d.comparison;
  c.plan.layout.pp = 2;
  c.plan.layout.global_batch = 2;
  c.measured_file = "m.json";
  c.backend = "cpu";
  c.host = "box";
  c.cluster_name = "calibrated";
  c.timed_steps = 5;
  c.warmup_steps = 1;
  c.predicted_step_s = 0.05;
  c.measured_step_s = 0.04;
  c.timeline_step_s = 0.04;
  c.sim.step_time_s = 0.05;
  c.sim.ranks.resize(2);
  for (int r = 0; r < 2; ++r) {
    c.sim.events.push_back(Ev(r, SimTrack::kCompute, OpKind::kForward, 0, 0, 0, 0.02));
    c.sim.events.push_back(Ev(r, SimTrack::kCompute, OpKind::kBackward, 0, 0, 0.02, 0.05));
    RankComparison rc;
    rc.rank = r;
    rc.stage = r;
    rc.predicted = {0.03, 0, 0.01, 0.005, 0.004, 0.001};
    rc.measured = {0.025, 0, 0.008, 0.004, 0.002, 0.001};
    rc.predicted_memory_bytes = 6e6;
    rc.measured_memory_bytes = 6e6;
    c.ranks.push_back(rc);
    c.timeline.push_back({{"forward", 0, 0, 0.0, 0.02}, {"backward", 0, 0, 0.02, 0.04},
                          {"p2p", 0, 0, 0.02, 0.021}});
  }
  return d;
}

TEST(ReportRender, ComparisonSection) {
  EXPECT_EQ(RenderReportHtml(Synthetic()).find("id=\"compare\""), std::string::npos);
  const std::string html = RenderReportHtml(WithComparison());
  ASSERT_NE(html.find("<section id=\"compare\">"), std::string::npos);
  EXPECT_NE(html.find("+25.0%"), std::string::npos);  // (50 - 40) / 40
  EXPECT_EQ(Count(html, "<g class=\"cmp-rank\""), 2u);
  EXPECT_EQ(Count(html, "<g class=\"sim-rank\""), 2u);
  EXPECT_EQ(Count(html, "<g class=\"meas-rank\""), 2u);
  // 2 ranks x 3 measured events, none merged; the 440 px forward and backward are labelled.
  EXPECT_EQ(Count(html, "class=\"mev\""), 6u);
  EXPECT_NE(html.find(">B0</text>"), std::string::npos);
  EXPECT_NE(html.find("rank 1: B0 (backward)"), std::string::npos);
  EXPECT_NE(html.find("pp_bubble measured: 8.000 ms"), std::string::npos);
  // Without a timeline the section says so.
  ReportData d = WithComparison();
  d.comparison.timeline.clear();
  EXPECT_NE(RenderReportHtml(d).find("no measured timeline"), std::string::npos);
}

// Every chart is an SVG with a viewBox on a 1200 px canvas that the CSS lets shrink to its
// container (max-width 100%, height from the viewBox); report_test measures it in Chromium.
TEST(ReportRender, ChartsScaleToTheWindow) {
  const std::string html = RenderReportHtml(WithComparison());
  // breakdown, memory, gantt; components, ranks, timelines.
  EXPECT_EQ(Count(html, "<svg "), 6u);
  EXPECT_EQ(Count(html, "<svg width=\"1200\" height=\""), 6u);
  EXPECT_EQ(Count(html, " viewBox=\"0 0 1200 "), 6u);
  EXPECT_NE(html.find("svg{display:block;max-width:100%;height:auto}"), std::string::npos);
  // Table cells that hold names may wrap between words, so a table fits an 800 px window.
  EXPECT_NE(html.find("td.l{white-space:normal}"), std::string::npos);
  EXPECT_NE(html.find("<td class=\"l\"><span class=\"nw\">tp2</span> <span class=\"nw\">pp4</span> "
                      "<span class=\"nw\">dp4</span> <span class=\"nw\">vp2</span> "
                      "<span class=\"nw\">mb4</span></td>"),
            std::string::npos);
}

// Throughput in the unit that suits it: the synthetic ranking's 150 TFLOP/s per GPU, and a CPU
// rank slot's 0.0158 TFLOP/s as 15.8 GFLOP/s (not "0.0"). The header card shows the
// simulated figure: the analytic prediction's 0.0158 TFLOP/s at a 10 s analytic step
// simulated in 1 s is ten times faster, 158 GFLOP/s.
TEST(ReportRender, ThroughputUnitsSuitTheFigure) {
  ReportData d = Synthetic();
  EXPECT_NE(RenderReportHtml(d).find("<td>150 TFLOP/s</td>"), std::string::npos);
  d.plans[0].tflops_per_gpu = 0.0158;
  d.chosen.tflops_per_gpu = 0.0158;
  const std::string html = RenderReportHtml(d);
  EXPECT_NE(html.find("<td>15.8 GFLOP/s</td>"), std::string::npos);
  EXPECT_NE(html.find("<div class=\"v\">158 GFLOP/s</div>"), std::string::npos);
  EXPECT_EQ(html.find("0.0 TFLOP/s"), std::string::npos);
}

// The measured section says what `ptdp compare` says about the load on the machine, next to
// the errors it explains. Two ranks on 2 cores leave none spare: others using 51% of the cores
// (1.02 cores) is more than 0 + a tenth of the machine (0.2): busy. 2% (0.04 cores) is not.
TEST(ReportRender, MeasuredSectionSaysWhenTheMachineWasBusy) {
  ReportData d = WithComparison();
  d.comparison.machine_cores = 2;
  d.comparison.other_cpu_share = 0.51;
  std::string html = RenderReportHtml(d);
  EXPECT_NE(html.find("<p class=\"warn\">Other processes used 51% of the cores during the timed "
                      "steps: the machine was busy (they took cores the ranks needed), so the "
                      "measured times are not this machine&#39;s own.</p>"),
            std::string::npos);
  EXPECT_NE(html.find("+25.0% <span class=\"no\">machine busy</span>"), std::string::npos);
  d.comparison.other_cpu_share = 0.02;
  html = RenderReportHtml(d);
  EXPECT_NE(html.find("<p class=\"note\">Other processes used 2% of the cores during the timed "
                      "steps.</p>"),
            std::string::npos);
  EXPECT_EQ(html.find("machine busy"), std::string::npos);
  EXPECT_EQ(html.find("class=\"warn\""), std::string::npos);
  d.comparison.other_cpu_share = -1;  // not recorded: nothing said
  EXPECT_EQ(RenderReportHtml(d).find("Other processes"), std::string::npos);
}

// The chosen layout's precision is the plan's; a bf16 plan measured on the CPU backend says
// that the run computed in fp32.
TEST(ReportRender, PrecisionIsThePlans) {
  ReportData d = WithComparison();
  d.plans[0].layout.precision = Precision::kFp32;
  d.comparison.plan.layout.precision = Precision::kBf16;
  std::string html = RenderReportHtml(d);
  EXPECT_NE(html.find("interleaved, fp32, "), std::string::npos);
  EXPECT_NE(html.find("The CPU backend computed in fp32: the plan&#39;s bf16"), std::string::npos);
  d.comparison.plan.layout.precision = Precision::kFp32;
  EXPECT_EQ(RenderReportHtml(d).find("The CPU backend computed in fp32"), std::string::npos);
}

TEST(ReportRender, MissingPiecesRenderNotes) {
  ReportData d;
  d.title = "empty";
  const std::string html = RenderReportHtml(d);
  for (const char* id : {"ranking", "breakdown", "memory", "gantt", "rejected", "why"})
    EXPECT_NE(html.find(std::string("<section id=\"") + id + "\">"), std::string::npos) << id;
  EXPECT_NE(html.find("no simulation"), std::string::npos);
}

}  // namespace
}  // namespace ptdp::cli
