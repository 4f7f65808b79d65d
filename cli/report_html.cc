// RenderReportHtml: the `ptdp report` page as one string. Inline CSS and SVG only (no
// xmlns attribute either: the page must not name any http(s) address). Charts are drawn in
// the pixel coordinates of a 1200 px canvas that the CSS scales down to the window; every box
// carries an SVG <title> as its hover text.
#include "cli/report_html.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdarg>
#include <cstdio>

#include "core/rank_grid.h"
#include "core/units.h"

namespace ptdp::cli {

std::string HtmlEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

__attribute__((format(printf, 1, 2))) std::string Fmt(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n < 0) return "";
  if (n < int(sizeof buf)) return std::string(buf, n);
  std::string big(n + 1, '\0');
  va_start(ap, fmt);
  std::vsnprintf(big.data(), big.size(), fmt, ap);
  va_end(ap);
  big.resize(n);
  return big;
}

std::string E(const std::string& s) { return HtmlEscape(s); }

// Palette (Tableau 10): readable on white, distinguishable in print.
constexpr const char* kBlue = "#4e79a7";
constexpr const char* kOrange = "#f28e2b";
constexpr const char* kRed = "#e15759";
constexpr const char* kTeal = "#76b7b2";
constexpr const char* kGreen = "#59a14f";
constexpr const char* kPurple = "#b07aa1";
constexpr const char* kBrown = "#9c755f";
constexpr const char* kGray = "#bab0ac";
constexpr const char* kDark = "#7f7f7f";

constexpr const char* kCss = R"(
body{font-family:"DejaVu Sans",Arial,Helvetica,sans-serif;margin:24px auto;max-width:1240px;
 color:#222;background:#fff;font-size:14px;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:14px;margin:16px 0 6px}
.sub{color:#555;margin:0 0 12px}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:130px}
.card .k{color:#666;font-size:12px}.card .v{font-size:18px;font-weight:bold}
table{border-collapse:collapse;font-size:13px}
th,td{padding:3px 9px;border-bottom:1px solid #eee;text-align:right}
td{white-space:nowrap}
th{background:#f5f5f5;border-bottom:1px solid #ccc}
td.l,th.l{text-align:left}
td.l{white-space:normal}
.nw{white-space:nowrap}
@media (max-width:1000px){th,td{padding:3px 5px}}
tr.chosen td{background:#eef4fb;font-weight:bold}
.no{color:#c0392b;font-weight:bold}
.note{color:#555;font-size:12px;margin:6px 0}
.warn{background:#fdf2e9;border-left:4px solid #e67e22;padding:6px 10px;margin:8px 0}
.bar{display:inline-block;height:10px;background:#bab0ac;vertical-align:middle}
pre.why{background:#f8f8f8;border:1px solid #eee;padding:10px;font-size:13px;white-space:pre-wrap}
svg{display:block;max-width:100%;height:auto}
svg text{font-family:"DejaVu Sans",Arial,Helvetica,sans-serif}
)";

// "12.3 ms" / "1.234 s" with a unit picked once per chart.
struct TimeUnit {
  double scale;      // seconds -> unit
  const char* name;  // "ms" or "s"
};
TimeUnit PickUnit(double span_s) { return span_s < 1.0 ? TimeUnit{1e3, "ms"} : TimeUnit{1, "s"}; }

std::string Sec(double s) { return Fmt("%.4f s", s); }
std::string Pct(double f) { return Fmt("%.1f%%", 100 * f); }

// A tick spacing of 1, 2 or 5 times a power of ten giving about `target` ticks over `span`.
double NiceStep(double span, int target) {
  if (span <= 0) return 1;
  const double raw = span / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double f : {1.0, 2.0, 5.0})
    if (raw <= f * mag) return f * mag;
  return 10 * mag;
}

std::string Rect(double x, double y, double w, double h, const char* fill, const std::string& title,
                 const char* extra = "") {
  return Fmt("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"%s>", x, y,
             std::max(w, 0.0), h, fill, extra) +
         (title.empty() ? "" : "<title>" + title + "</title>") + "</rect>\n";
}

std::string Text(double x, double y, const std::string& escaped, const char* extra = "") {
  return Fmt("<text x=\"%.1f\" y=\"%.1f\"%s>", x, y, extra) + escaped + "</text>\n";
}

// Charts are drawn on a kChartW-wide canvas; the CSS scales them down to narrower windows
// (max-width 100%, the height following the viewBox), so no page scrolls sideways.
constexpr double kChartW = 1200;

std::string SvgOpen(double h, const char* cls = "") {
  return Fmt("<svg width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" role=\"img\"%s%s%s>\n",
             kChartW, h, kChartW, h, *cls ? " class=\"" : "", cls, *cls ? "\"" : "");
}

// Approximate width of a 10-11 px label, for "does it fit in the box" decisions.
double LabelWidth(const std::string& s, double font_px) { return 0.62 * font_px * s.size(); }

// A row of colored squares with names, at (x, y), wrapping is not needed at our widths.
std::string Legend(double x, double y, const std::vector<std::pair<std::string, const char*>>& items) {
  std::string o;
  for (const auto& [name, color] : items) {
    o += Rect(x, y - 10, 12, 12, color, "");
    o += Text(x + 16, y, E(name), " font-size=\"12\"");
    x += 16 + LabelWidth(name, 12) + 22;
  }
  return o;
}

// ---- header -------------------------------------------------------------------------------

std::string Card(const std::string& key, const std::string& value_escaped) {
  return "<div class=\"card\"><div class=\"k\">" + E(key) + "</div><div class=\"v\">" +
         value_escaped + "</div></div>\n";
}

std::string Header(const ReportData& d) {
  std::string o = "<h1>" + E(d.title) + "</h1>\n<p class=\"sub\">" + E(d.model_name) + " on " +
                  E(d.cluster_name) + Fmt(", %d GPUs, global batch %lld", d.gpus,
                                          static_cast<long long>(d.global_batch));
  if (!d.plans.empty()) {
    const Layout& l = d.plans[0].layout;
    o += "<br>chosen: <b>" + E(l.ShortName()) + "</b> [" + E(l.Knobs()) + "], " +
         E(ToString(l.schedule)) + ", " + E(ToString(l.precision)) +
         Fmt(", %lld micro-batches", static_cast<long long>(l.num_microbatches()));
  }
  o += "</p>\n<div class=\"cards\">\n";
  const Prediction& p = d.chosen;
  o += Card("step time (analytic)", E(Sec(p.step_time_s)));
  if (d.has_sim) {
    const double diff = p.step_time_s > 0 ? d.sim.step_time_s / p.step_time_s - 1 : 0;
    o += Card("step time (simulated)", E(Sec(d.sim.step_time_s)) +
                                           Fmt(" <small>(%+.1f%%)</small>", 100 * diff));
  }
  // The simulated step does the same FLOPs in a different time.
  const double speed = d.has_sim && d.sim.step_time_s > 0 ? p.step_time_s / d.sim.step_time_s : 1;
  const std::string src = d.has_sim ? " (simulated)" : " (analytic)";
  o += Card("model FLOP/s per GPU" + src, E(FormatFlopRate(p.tflops_per_gpu * 1e12 * speed)));
  o += Card("MFU" + src, E(Pct(p.mfu * speed)));
  o += Card("bubble" + src, E(Pct(d.has_sim ? d.sim.bubble_fraction : p.bubble_fraction)));
  o += Card("memory / GPU", E(FormatBytes(p.memory.total)) + " <small>of " +
                                E(FormatBytes(p.memory.capacity)) + "</small>" +
                                (p.fits ? "" : " <span class=\"no\">does not fit</span>"));
  return o + "</div>\n";
}

// ---- ranking ------------------------------------------------------------------------------

// "tp8 pp4 dp32" escaped, each word kept whole ("rc-sel" does not break at its hyphen) while
// the cell may wrap between them in a narrow window.
std::string Words(const std::string& s) {
  std::string o;
  for (size_t a = 0; a <= s.size();) {
    size_t b = s.find(' ', a);
    if (b == std::string::npos) b = s.size();
    if (b > a) o += (o.empty() ? "" : " ") + ("<span class=\"nw\">" + E(s.substr(a, b - a)) + "</span>");
    a = b + 1;
  }
  return o;
}

std::string Ranking(const ReportData& d) {
  std::string o = "<section id=\"ranking\">\n<h2>Ranking</h2>\n";
  if (d.searched)
    o += Fmt("<p class=\"note\">evaluated %lld layouts: %lld legal, %lld fit in memory; the "
             "best %zu by predicted step time. Rank 1 is the chosen plan.</p>\n",
             static_cast<long long>(d.evaluated), static_cast<long long>(d.legal),
             static_cast<long long>(d.fitting), d.plans.size());
  else
    o += "<p class=\"note\">one plan, read from a plan file (no search).</p>\n";
  if (d.plans.empty()) return o + "<p>no plan.</p>\n</section>\n";
  o += "<table>\n<tr><th>rank</th><th class=\"l\">layout</th><th class=\"l\">knobs</th>"
       "<th>step (s)</th><th>FLOP/s per GPU</th><th>MFU</th><th>bubble</th><th>mem/GPU</th>"
       "<th>fits</th><th class=\"l\">source</th></tr>\n";
  for (size_t i = 0; i < d.plans.size(); ++i) {
    const ReportPlanRow& r = d.plans[i];
    o += i == 0 ? "<tr class=\"chosen\">" : "<tr>";
    o += Fmt("<td>%zu</td>", i + 1) + "<td class=\"l\">" + Words(r.layout.ShortName()) +
         "</td><td class=\"l\">" + Words(r.layout.Knobs()) + "</td>" +
         Fmt("<td>%.3f</td>", r.step_time_s) + "<td>" + E(FormatFlopRate(r.tflops_per_gpu * 1e12)) +
         Fmt("</td><td>%.1f%%</td><td>%.1f%%</td>", 100 * r.mfu, 100 * r.bubble_fraction) +
         "<td>" + E(FormatBytes(r.memory_total_bytes)) + "</td>" +
         (r.fits ? "<td>yes</td>" : "<td class=\"no\">no</td>") + "<td class=\"l\">" +
         E(r.source) + "</td></tr>\n";
  }
  return o + "</table>\n</section>\n";
}

// ---- breakdown ----------------------------------------------------------------------------

struct Part {
  const char* name;
  const char* color;
  double (*get)(const Breakdown&);
};
const Part kParts[] = {
    {"compute", kBlue, [](const Breakdown& b) { return b.compute_s; }},
    {"tp_comm", kOrange, [](const Breakdown& b) { return b.tp_comm_s; }},
    {"pp_comm", kRed, [](const Breakdown& b) { return b.pp_comm_s; }},
    {"dp_comm", kTeal, [](const Breakdown& b) { return b.dp_comm_s; }},
    {"bubble", kGray, [](const Breakdown& b) { return b.bubble_s; }},
    {"optimizer", kGreen, [](const Breakdown& b) { return b.optimizer_s; }},
};

// One stacked bar of a breakdown at row y; x0/width in px; `scale_s` seconds span the width.
std::string BreakdownBar(const std::string& label, const Breakdown& b, double y, double x0,
                         double width, double scale_s) {
  constexpr double kH = 26;
  std::string o = Text(x0 - 8, y + 17, E(label), " font-size=\"12\" text-anchor=\"end\"");
  const double total = b.total();
  double x = x0;
  for (const Part& p : kParts) {
    const double v = p.get(b);
    const double w = scale_s > 0 ? width * v / scale_s : 0;
    if (w <= 0) continue;
    const double frac = total > 0 ? v / total : 0;
    o += Rect(x, y, w, kH, p.color, E(std::string(p.name) + ": " + Sec(v) + " (" + Pct(frac) + ")"));
    const std::string pct = Pct(frac);
    if (w >= LabelWidth(pct, 11) + 6)
      o += Text(x + w / 2, y + 17, E(pct), " font-size=\"11\" fill=\"#fff\" text-anchor=\"middle\"");
    x += w;
  }
  o += Text(x + 6, y + 17, E(Sec(total)), " font-size=\"12\"");
  return o;
}

std::string BreakdownSection(const ReportData& d) {
  std::string o = "<section id=\"breakdown\">\n<h2>Step-time breakdown</h2>\n"
                  "<p class=\"note\">exposed time on the critical path of one step; the parts "
                  "add up to the step time.</p>\n";
  constexpr double kX0 = 90, kBarW = 1000;
  const Breakdown& a = d.chosen.breakdown;
  const double scale = std::max(a.total(), d.has_sim ? d.sim.breakdown.total() : 0.0);
  const int bars = d.has_sim ? 2 : 1;
  const double h = 40 + 36 * bars;
  o += SvgOpen(h);
  std::vector<std::pair<std::string, const char*>> legend;
  for (const Part& p : kParts) legend.emplace_back(p.name, p.color);
  o += Legend(kX0, 16, legend);
  o += BreakdownBar("analytic", a, 30, kX0, kBarW, scale);
  if (d.has_sim) o += BreakdownBar("simulated", d.sim.breakdown, 66, kX0, kBarW, scale);
  o += "</svg>\n<table>\n<tr><th class=\"l\">part</th><th>analytic</th><th>share</th>";
  if (d.has_sim) o += "<th>simulated</th><th>share</th>";
  o += "</tr>\n";
  const double st = d.has_sim ? d.sim.breakdown.total() : 0;
  for (const Part& p : kParts) {
    o += Fmt("<tr><td class=\"l\"><span class=\"bar\" style=\"width:10px;background:%s\"></span> ",
             p.color) +
         E(p.name) + "</td><td>" + E(Sec(p.get(a))) + "</td><td>" +
         E(Pct(a.total() > 0 ? p.get(a) / a.total() : 0)) + "</td>";
    if (d.has_sim)
      o += "<td>" + E(Sec(p.get(d.sim.breakdown))) + "</td><td>" +
           E(Pct(st > 0 ? p.get(d.sim.breakdown) / st : 0)) + "</td>";
    o += "</tr>\n";
  }
  o += "<tr><td class=\"l\"><b>step</b></td><td><b>" + E(Sec(a.total())) + "</b></td><td></td>";
  if (d.has_sim) o += "<td><b>" + E(Sec(st)) + "</b></td><td></td>";
  return o + "</tr>\n</table>\n</section>\n";
}

// ---- memory -------------------------------------------------------------------------------

struct MemoryGeom {
  double x0 = 90, bar_w = 900, row = 22, top = 34;
  double scale = 0;  // px per byte
  double capacity_x = 0;  // 0 when the capacity is unknown
};

// One stage's bar at row r: split by kind when `kinds` is given (the most loaded stage),
// one color otherwise; its label after the bar, or after the capacity line if it would cross.
std::string StageBar(const MemoryGeom& g, size_t r, const std::string& name, double bytes,
                     double capacity, const std::vector<std::pair<std::string, double>>* kinds) {
  static const char* const kKindColors[] = {kBlue, kOrange, kGreen, kRed, kGray};
  const double y = g.top + g.row * r;
  std::string o = Text(g.x0 - 8, y + 13, E(name), " font-size=\"12\" text-anchor=\"end\"");
  double x = g.x0;
  if (kinds) {
    for (size_t k = 0; k < kinds->size(); ++k) {
      const auto& [kind, v] = (*kinds)[k];
      o += Rect(x, y, v * g.scale, g.row - 6, kKindColors[k % 5],
                E(name + " " + kind + ": " + FormatBytes(v)));
      x += v * g.scale;
    }
  } else {
    o += Rect(x, y, bytes * g.scale, g.row - 6, kPurple, E(name + ": " + FormatBytes(bytes)));
  }
  x = std::max(x, g.x0 + bytes * g.scale);
  const std::string label = FormatBytes(bytes) + " (" + Pct(capacity > 0 ? bytes / capacity : 0) + ")";
  double lx = x + 6;
  if (g.capacity_x > 0 && x < g.capacity_x && lx + LabelWidth(label, 12) > g.capacity_x - 2)
    lx = g.capacity_x + 6;
  return o + Text(lx, y + 13, E(label), " font-size=\"12\"");
}

std::string MemorySection(const ReportData& d) {
  std::string o = "<section id=\"memory\">\n<h2>Memory per pipeline stage</h2>\n";
  const Prediction& p = d.chosen;
  std::vector<double> stages = p.stage_memory_bytes;
  const bool per_stage = !stages.empty();
  if (!per_stage) stages.push_back(p.memory.total);
  const size_t hot = std::max_element(stages.begin(), stages.end()) - stages.begin();
  o += "<p class=\"note\">one GPU of each stage; the most loaded stage (" +
       (per_stage ? Fmt("stage %zu", hot) : std::string("the only one given")) +
       ") is split by kind. The dashed line is the GPU's capacity.</p>\n";
  MemoryGeom g;
  const double top = std::max(p.memory.capacity, stages[hot]);
  g.scale = top > 0 ? g.bar_w / (1.08 * top) : 0;
  g.capacity_x = p.memory.capacity > 0 ? g.x0 + p.memory.capacity * g.scale : 0;
  const double h = g.top + g.row * stages.size() + 24;
  o += SvgOpen(h);
  const std::vector<std::pair<std::string, double>> kinds = {
      {"weights", p.memory.weights},     {"grads", p.memory.grads},
      {"optimizer", p.memory.optimizer}, {"activations", p.memory.activations},
      {"other", p.memory.other}};
  o += Legend(g.x0, 16, {{"weights", kBlue}, {"grads", kOrange}, {"optimizer", kGreen},
                         {"activations", kRed}, {"other", kGray},
                         {"total (other stages)", kPurple}});
  for (size_t r = 0; r < stages.size(); ++r)
    o += StageBar(g, r, per_stage ? Fmt("stage %zu", r) : "most loaded", stages[r],
                  p.memory.capacity, r == hot ? &kinds : nullptr);
  if (g.capacity_x > 0) {
    o += Fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#c0392b\" "
             "stroke-width=\"2\" stroke-dasharray=\"6,4\"/>\n",
             g.capacity_x, g.top - 6, g.capacity_x, h - 18);
    o += Text(g.capacity_x, h - 4, E("capacity " + FormatBytes(p.memory.capacity)),
              " font-size=\"12\" fill=\"#c0392b\" text-anchor=\"middle\"");
  }
  return o + "</svg>\n</section>\n";
}

// ---- gantt --------------------------------------------------------------------------------

const char* EventColor(OpKind k) {
  switch (k) {
    case OpKind::kForward: return kBlue;
    case OpKind::kBackward: return kOrange;
    case OpKind::kSendActivation:
    case OpKind::kRecvActivation: return kTeal;
    case OpKind::kSendGradient:
    case OpKind::kRecvGradient: return kRed;
    case OpKind::kReduceGradients: return kPurple;
    case OpKind::kReduceEmbedding: return kBrown;
    case OpKind::kOptimizerStep: return kGreen;
  }
  return kDark;
}

// Box label "F3.1" (micro-batch 3, chunk 1), or "F3" when the layout has one chunk per rank;
// hover titles use SimEvent::Name().
std::string ComputeLabel(const SimEvent& e, bool chunks) {
  std::string s = e.kind == OpKind::kForward ? "F" : "B";
  s += std::to_string(e.microbatch);
  if (chunks) s += "." + std::to_string(e.chunk);
  return s;
}

struct GanttGeom {
  double x0 = 80, width = 1100;  // plot area, px
  double top = 34;               // first row
  double compute_h = 22, comm_h = 8, pitch = 40;
  double t_end = 1;              // seconds spanning `width`
  TimeUnit unit{1e3, "ms"};
  double X(double t) const { return x0 + width * t / t_end; }
};

std::string When(const GanttGeom& g, double a, double b) {
  return Fmt("%.3f-%.3f %s (%.3f %s)", a * g.unit.scale, b * g.unit.scale, g.unit.name,
             (b - a) * g.unit.scale, g.unit.name);
}

// Events narrower than this merge with their close neighbours into one box ("N ops").
constexpr double kMinPx = 2.0;

// The run of narrow events that starts at the narrow ev[i]: the following events narrower than
// kMinPx that start within kMinPx of the run's end. `next` is one past the run.
struct NarrowRun {
  size_t next;
  double end_s;
  bool same_kind;  // every event of the run has ev[i]'s kind
};
template <class Event>
NarrowRun MergeNarrow(const GanttGeom& g, const std::vector<const Event*>& ev, size_t i) {
  NarrowRun r{i + 1, ev[i]->end_s, true};
  while (r.next < ev.size() && g.X(ev[r.next]->end_s) - g.X(ev[r.next]->start_s) < kMinPx &&
         g.X(ev[r.next]->start_s) - g.X(r.end_s) < kMinPx) {
    r.same_kind = r.same_kind && ev[r.next]->kind == ev[i]->kind;
    r.end_s = std::max(r.end_s, ev[r.next]->end_s);
    ++r.next;
  }
  return r;
}

// The boxes of one rank's track. Events narrower than kMinPx that follow each other closely
// are drawn as one box ("N ops"), so a step of 100k ops still renders as a few thousand rects.
std::string TrackBoxes(const GanttGeom& g, std::vector<const SimEvent*> ev, double y, double h,
                       bool chunks, bool labels) {
  std::sort(ev.begin(), ev.end(), [](auto* a, auto* b) { return a->start_s < b->start_s; });
  std::string o;
  for (size_t i = 0; i < ev.size();) {
    const SimEvent& e = *ev[i];
    const double x = g.X(e.start_s), w = g.X(e.end_s) - x;
    if (w >= kMinPx) {
      const bool fb = e.kind == OpKind::kForward || e.kind == OpKind::kBackward;
      const std::string name = fb ? ComputeLabel(e, chunks) : e.Name();
      o += Rect(x, y, w, h, EventColor(e.kind),
                E(Fmt("rank %d: ", e.rank) + e.Name() + ", " + When(g, e.start_s, e.end_s)),
                " stroke=\"#fff\" stroke-width=\"0.5\" class=\"ev\"");
      if (labels && e.track == SimTrack::kCompute && w >= LabelWidth(name, 10) + 4)
        o += Text(x + w / 2, y + h / 2 + 3.5, E(name),
                  " font-size=\"10\" fill=\"#fff\" text-anchor=\"middle\" pointer-events=\"none\"");
      ++i;
      continue;
    }
    const auto [j, end, same] = MergeNarrow(g, ev, i);
    const std::string title = j - i == 1 ? e.Name()
                                         : Fmt("%zu ops from ", j - i) + e.Name() + " to " +
                                               ev[j - 1]->Name();
    o += Rect(x, y, std::max(g.X(end) - x, 1.0), h, same ? EventColor(e.kind) : kDark,
              E(Fmt("rank %d: ", e.rank) + title + ", " + When(g, e.start_s, end)), " class=\"ev\"");
    i = j;
  }
  return o;
}

std::string TimeAxis(const GanttGeom& g, double y_top, double y_axis) {
  std::string o = Fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n",
                      g.x0, y_axis, g.x0 + g.width, y_axis);
  const double span = g.t_end * g.unit.scale;
  const double step = NiceStep(span, 10);
  for (int i = 0; i * step <= span * (1 + 1e-9); ++i) {
    const double t = i * step, x = g.x0 + g.width * t / span;
    o += Fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n", x,
             y_top, x, y_axis);
    o += Fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", x,
             y_axis, x, y_axis + 4);
    o += Text(x, y_axis + 16, E(Fmt("%g", t)), " font-size=\"11\" text-anchor=\"middle\"");
  }
  o += Text(g.x0 + g.width, y_axis + 30, E(std::string("time (") + g.unit.name + ")"),
            " font-size=\"12\" text-anchor=\"end\"");
  return o;
}

std::string RankStatsTable(const ReportData& d, const TimeUnit& u) {
  std::string o = "<table>\n<tr><th>rank</th>" +
                  Fmt("<th>compute (%s)</th><th>p2p wait (%s)</th><th>bubble (%s)</th>"
                      "<th>pipeline end (%s)</th><th>end (%s)</th>",
                      u.name, u.name, u.name, u.name, u.name) +
                  "<th>peak in flight</th><th>peak memory</th></tr>\n";
  for (size_t r = 0; r < d.sim.ranks.size(); ++r) {
    const SimRankStats& s = d.sim.ranks[r];
    o += Fmt("<tr><td>%zu</td><td>%.3f</td><td>%.3f</td><td>%.3f</td><td>%.3f</td><td>%.3f</td>"
             "<td>%d</td>",
             r, s.compute_s * u.scale, s.p2p_wait_s * u.scale, s.bubble_s * u.scale,
             s.pipeline_end_s * u.scale, s.end_s * u.scale, s.peak_inflight) +
         "<td>" + E(FormatBytes(s.peak_memory_bytes)) + "</td></tr>\n";
  }
  return o + "</table>\n";
}

std::string GanttSection(const ReportData& d) {
  std::string o = "<section id=\"gantt\">\n<h2>Simulated step</h2>\n";
  if (!d.has_sim) return o + "<p>no simulation.</p>\n</section>\n";
  const SimResult& s = d.sim;
  int ranks = int(s.ranks.size());
  double t_end = s.step_time_s;
  bool chunks = false;
  for (const SimEvent& e : s.events) {
    ranks = std::max(ranks, e.rank + 1);
    t_end = std::max(t_end, e.end_s);
    chunks = chunks || e.chunk > 0;
  }
  GanttGeom g;
  g.t_end = t_end > 0 ? t_end : 1;
  g.unit = PickUnit(g.t_end);
  o += "<p class=\"note\">one row per pipeline rank (its TP and DP replicas behave the same): "
       "the compute stream (Fm.c = forward of micro-batch m, model chunk c; B = backward) and, "
       "below it, the thin communication stream. Hover a box for its name and times. " +
       E(Fmt("Step %.3f %s, bubble %.1f%%, %lld events.", s.step_time_s * g.unit.scale,
             g.unit.name, 100 * s.bubble_fraction, static_cast<long long>(s.events.size()))) +
       "</p>\n";
  const double axis_y = g.top + g.pitch * ranks + 2;
  const double h = axis_y + 40;
  o += SvgOpen(h);
  o += Legend(g.x0, 16, {{"forward", kBlue}, {"backward", kOrange}, {"p2p activation", kTeal},
                         {"p2p gradient", kRed}, {"DP reduce", kPurple},
                         {"embedding reduce", kBrown}, {"optimizer", kGreen}, {"merged", kDark}});
  o += TimeAxis(g, g.top - 4, axis_y);
  std::vector<std::vector<const SimEvent*>> compute(ranks), comm(ranks);
  for (const SimEvent& e : s.events)
    (e.track == SimTrack::kCompute ? compute : comm)[e.rank].push_back(&e);
  for (int r = 0; r < ranks; ++r) {
    const double y = g.top + g.pitch * r;
    o += Fmt("<g class=\"rank\" data-rank=\"%d\">\n", r);
    o += Rect(g.x0, y, g.width, g.compute_h + g.comm_h + 2, "#eeeeee", "", " fill-opacity=\"0.5\"");
    o += Text(g.x0 - 8, y + 15, E(Fmt("rank %d", r)), " font-size=\"12\" text-anchor=\"end\"");
    o += TrackBoxes(g, compute[r], y, g.compute_h, chunks, true);
    o += TrackBoxes(g, comm[r], y + g.compute_h + 2, g.comm_h, chunks, false);
    o += "</g>\n";
  }
  o += "</svg>\n";
  if (!s.ranks.empty()) o += RankStatsTable(d, g.unit);
  return o + "</section>\n";
}

// ---- predicted against measured -------------------------------------------------------------

const char* const kComponentColors[kNumComponents] = {kBlue, kOrange, kRed, kTeal, kGreen, kGray};

std::string ErrCell(double predicted, double measured) {
  const double e = ErrorPct(predicted, measured);
  return std::isfinite(e) ? Fmt("%+.1f%%", e) : std::string("n/a");
}

// One horizontal bar per (component, side): the predicted one solid, the measured one lighter
// with an outline, both on one scale.
std::string ComponentBars(const Comparison& c, const TimeUnit& u) {
  constexpr double kX0 = 120, kW = 900, kRow = 20, kTop = 30;
  const Parts p = c.PredictedMean(), m = c.MeasuredMean();
  double top = 0;
  for (int k = 0; k < kNumComponents; ++k) top = std::max({top, p[k], m[k]});
  const double scale = top > 0 ? kW / (1.05 * top) : 0;
  const double h = kTop + kNumComponents * (2 * kRow + 8) + 10;
  std::string o = SvgOpen(h, "components");
  o += Legend(kX0, 16, {{"predicted (solid)", kDark}, {"measured (light, outlined)", kGray}});
  for (int k = 0; k < kNumComponents; ++k) {
    const double y = kTop + k * (2 * kRow + 8);
    o += Text(kX0 - 8, y + kRow + 4, E(ComponentName(k)), " font-size=\"12\" text-anchor=\"end\"");
    const std::string name = ComponentName(k);
    o += Rect(kX0, y, p[k] * scale, kRow - 3, kComponentColors[k],
              E(name + " predicted: " + Fmt("%.3f %s", p[k] * u.scale, u.name)), " class=\"pred\"");
    o += Text(kX0 + p[k] * scale + 6, y + 13, E(Fmt("%.2f %s", p[k] * u.scale, u.name)),
              " font-size=\"11\"");
    o += Rect(kX0, y + kRow, m[k] * scale, kRow - 3, kComponentColors[k],
              E(name + " measured: " + Fmt("%.3f %s", m[k] * u.scale, u.name)),
              " fill-opacity=\"0.45\" stroke=\"#333\" stroke-width=\"0.8\" class=\"meas\"");
    o += Text(kX0 + m[k] * scale + 6, y + kRow + 13,
              E(Fmt("%.2f %s (%s)", m[k] * u.scale, u.name, ErrCell(p[k], m[k]).c_str())),
              " font-size=\"11\"");
  }
  return o + "</svg>\n";
}

// Per rank: a stacked bar of its parts, predicted then measured.
std::string RankBars(const Comparison& c, const TimeUnit& u) {
  constexpr double kX0 = 150, kW = 900, kRow = 18, kTop = 30;
  double top = 0;
  for (const RankComparison& r : c.ranks) {
    double a = 0, b = 0;
    for (int k = 0; k < kNumComponents; ++k) a += r.predicted[k], b += r.measured[k];
    top = std::max({top, a, b});
  }
  const double scale = top > 0 ? kW / (1.05 * top) : 0;
  const double h = kTop + c.ranks.size() * (2 * kRow + 10) + 10;
  std::string o = SvgOpen(h, "ranks");
  std::vector<std::pair<std::string, const char*>> legend;
  for (int k = 0; k < kNumComponents; ++k) legend.emplace_back(ComponentName(k), kComponentColors[k]);
  o += Legend(kX0, 16, legend);
  for (size_t i = 0; i < c.ranks.size(); ++i) {
    const RankComparison& r = c.ranks[i];
    const double y = kTop + i * (2 * kRow + 10);
    o += Fmt("<g class=\"cmp-rank\" data-rank=\"%d\">\n", r.rank);
    for (int side = 0; side < 2; ++side) {
      const Parts& parts = side == 0 ? r.predicted : r.measured;
      const double yy = y + side * kRow;
      o += Text(kX0 - 8, yy + 12,
                E(Fmt("rank %d %s", r.rank, side == 0 ? "predicted" : "measured")),
                " font-size=\"11\" text-anchor=\"end\"");
      double x = kX0, total = 0;
      for (int k = 0; k < kNumComponents; ++k) {
        const double w = parts[k] * scale;
        total += parts[k];
        if (w <= 0) continue;
        o += Rect(x, yy, w, kRow - 3, kComponentColors[k],
                  E(Fmt("rank %d %s ", r.rank, side == 0 ? "predicted" : "measured") +
                    ComponentName(k) + Fmt(": %.3f %s", parts[k] * u.scale, u.name)),
                  side == 0 ? "" : " fill-opacity=\"0.45\" stroke=\"#333\" stroke-width=\"0.6\"");
        x += w;
      }
      o += Text(x + 6, yy + 12, E(Fmt("%.2f %s", total * u.scale, u.name)), " font-size=\"11\"");
    }
    o += "</g>\n";
  }
  return o + "</svg>\n";
}

const char* MeasuredColor(const std::string& kind) {
  if (kind == "forward") return kBlue;
  if (kind == "backward") return kOrange;
  if (kind == "p2p") return kTeal;
  if (kind == "tp") return kRed;
  if (kind == "dp") return kPurple;
  if (kind == "embedding") return kBrown;
  if (kind == "optimizer") return kGreen;
  return kDark;
}

// One track of measured events; narrow neighbours merge as in TrackBoxes.
std::string MeasuredBoxes(const GanttGeom& g, const std::vector<const MeasuredEvent*>& ev, int rank,
                          double y, double h, bool labels) {
  auto name = [](const MeasuredEvent& e) {
    if (e.kind == "forward" || e.kind == "backward")
      return std::string(e.kind == "forward" ? "F" : "B") + std::to_string(e.microbatch) +
             (e.chunk > 0 ? "." + std::to_string(e.chunk) : "");
    if (e.kind == "p2p") return "p2p " + std::to_string(e.microbatch);
    return e.kind;
  };
  std::string o;
  for (size_t i = 0; i < ev.size();) {
    const MeasuredEvent& e = *ev[i];
    const double x = g.X(e.start_s), w = g.X(e.end_s) - x;
    if (w >= kMinPx) {
      const std::string label = name(e);
      o += Rect(x, y, w, h, MeasuredColor(e.kind),
                E(Fmt("rank %d: ", rank) + label + " (" + e.kind + "), " + When(g, e.start_s, e.end_s)),
                " stroke=\"#fff\" stroke-width=\"0.5\" class=\"mev\"");
      if (labels && w >= LabelWidth(label, 10) + 4)
        o += Text(x + w / 2, y + h / 2 + 3.5, E(label),
                  " font-size=\"10\" fill=\"#fff\" text-anchor=\"middle\" pointer-events=\"none\"");
      ++i;
      continue;
    }
    const auto [j, end, same] = MergeNarrow(g, ev, i);
    o += Rect(x, y, std::max(g.X(end) - x, 1.0), h, same ? MeasuredColor(e.kind) : kDark,
              E(Fmt("rank %d: %zu ops from ", rank, j - i) + name(e) + " to " + name(*ev[j - 1]) +
                ", " + When(g, e.start_s, end)),
              " class=\"mev\"");
    i = j;
  }
  return o;
}

// The simulated step (one row per pipeline rank) above the measured one (one row per rank), on
// one time axis.
std::string Timelines(const Comparison& c) {
  const SimResult& s = c.sim;
  double t_end = std::max(s.step_time_s, c.timeline_step_s);
  for (const auto& rank : c.timeline)
    for (const MeasuredEvent& e : rank) t_end = std::max(t_end, e.end_s);
  GanttGeom g;
  g.x0 = 130;
  g.width = 1050;
  g.t_end = t_end > 0 ? t_end : 1;
  g.unit = PickUnit(g.t_end);
  const int sim_rows = int(s.ranks.size()), meas_rows = int(c.timeline.size());
  const double gap = 26;
  const double meas_top = g.top + g.pitch * sim_rows + gap;
  const double axis_y = meas_top + g.pitch * meas_rows + 2;
  const double h = axis_y + 40;
  std::string o = SvgOpen(h, "timelines");
  o += Legend(g.x0, 16, {{"forward", kBlue}, {"backward", kOrange}, {"p2p", kTeal},
                         {"TP collective", kRed}, {"DP reduce", kPurple},
                         {"embedding", kBrown}, {"optimizer", kGreen}, {"merged", kDark}});
  o += TimeAxis(g, g.top - 4, axis_y);
  bool chunks = false;
  for (const SimEvent& e : s.events) chunks = chunks || e.chunk > 0;
  std::vector<std::vector<const SimEvent*>> compute(sim_rows), comm(sim_rows);
  for (const SimEvent& e : s.events)
    if (e.rank < sim_rows) (e.track == SimTrack::kCompute ? compute : comm)[e.rank].push_back(&e);
  for (int r = 0; r < sim_rows; ++r) {
    const double y = g.top + g.pitch * r;
    o += Fmt("<g class=\"sim-rank\" data-rank=\"%d\">\n", r);
    o += Rect(g.x0, y, g.width, g.compute_h + g.comm_h + 2, "#eeeeee", "", " fill-opacity=\"0.5\"");
    o += Text(g.x0 - 8, y + 15, E(Fmt("simulated %d", r)), " font-size=\"12\" text-anchor=\"end\"");
    o += TrackBoxes(g, compute[r], y, g.compute_h, chunks, true);
    o += TrackBoxes(g, comm[r], y + g.compute_h + 2, g.comm_h, chunks, false);
    o += "</g>\n";
  }
  o += Fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#999\" "
           "stroke-dasharray=\"4,3\"/>\n", 10.0, meas_top - gap / 2, kChartW - 10, meas_top - gap / 2);
  const RankGrid grid(c.plan.layout.tp, c.plan.layout.cp, c.plan.layout.dp, c.plan.layout.pp, 1, 1);
  for (int r = 0; r < meas_rows; ++r) {
    const double y = meas_top + g.pitch * r;
    std::vector<const MeasuredEvent*> top, bottom;
    for (const MeasuredEvent& e : c.timeline[size_t(r)])
      (e.kind == "forward" || e.kind == "backward" || e.kind == "optimizer" ? top : bottom).push_back(&e);
    auto by_start = [](const MeasuredEvent* a, const MeasuredEvent* b) { return a->start_s < b->start_s; };
    std::sort(top.begin(), top.end(), by_start);
    std::sort(bottom.begin(), bottom.end(), by_start);
    o += Fmt("<g class=\"meas-rank\" data-rank=\"%d\">\n", r);
    o += Rect(g.x0, y, g.width, g.compute_h + g.comm_h + 2, "#f4efe6", "", " fill-opacity=\"0.7\"");
    o += Text(g.x0 - 8, y + 15, E(Fmt("measured %d (pp %d)", r, grid.Coord(r).pp)),
              " font-size=\"12\" text-anchor=\"end\"");
    o += MeasuredBoxes(g, top, r, y, g.compute_h, true);
    o += MeasuredBoxes(g, bottom, r, y + g.compute_h + 2, g.comm_h, false);
    o += "</g>\n";
  }
  return o + "</svg>\n";
}

std::string CompareSection(const ReportData& d) {
  if (!d.has_comparison) return "";
  const Comparison& c = d.comparison;
  const TimeUnit u = PickUnit(std::max(c.measured_step_s, c.predicted_step_s));
  std::string o = "<section id=\"compare\">\n<h2>Predicted against measured</h2>\n";
  o += "<p class=\"note\">" +
       E(c.measured_file + ": " + c.backend + " backend on " + c.host +
         Fmt(", median of %d steps after %d warm-up (%.2f to %.2f %s). Predicted on ",
             c.timed_steps, c.warmup_steps, c.measured_step_min_s * u.scale,
             c.measured_step_max_s * u.scale, u.name) +
         c.cluster_name +
         ". Errors are (predicted - measured) / measured. pp_bubble is the time blocked in "
         "pipeline sends and receives, the wait for the peer included.") +
       "</p>\n";
  // The load on the machine decides how far the measured times are its own: said where the
  // errors are, as `ptdp compare` says it.
  std::string load = LoadNote(c);
  if (!load.empty()) {
    load[0] = char(std::toupper(static_cast<unsigned char>(load[0])));
    o += std::string(c.busy() ? "<p class=\"warn\">" : "<p class=\"note\">") + E(load) + ".</p>\n";
  }
  if (c.backend == "cpu" && c.plan.layout.precision != Precision::kFp32)
    o += "<p class=\"note\">" +
         E(std::string("The CPU backend computed in fp32: the plan's ") +
           ToString(c.plan.layout.precision) + " sets its memory and time on GPUs only.") +
         "</p>\n";
  o += "<div class=\"cards\">\n";
  o += Card("step time predicted", E(Fmt("%.2f %s", c.predicted_step_s * u.scale, u.name)));
  o += Card("step time measured", E(Fmt("%.2f %s", c.measured_step_s * u.scale, u.name)));
  o += Card("step-time error", E(ErrCell(c.predicted_step_s, c.measured_step_s)) +
                                   (c.busy() ? " <span class=\"no\">machine busy</span>" : ""));
  o += Card("peak memory predicted / measured",
            E(FormatBytes(c.PredictedMemoryMax()) + " / " + FormatBytes(c.MeasuredMemoryMax())));
  o += Card("memory error", E(ErrCell(c.PredictedMemoryMax(), c.MeasuredMemoryMax())));
  o += "</div>\n<h3>Per component, mean over the ranks</h3>\n" + ComponentBars(c, u);
  o += "<table>\n<tr><th class=\"l\">part</th>" +
       Fmt("<th>predicted (%s)</th><th>measured (%s)</th>", u.name, u.name) +
       "<th>error</th></tr>\n";
  const Parts p = c.PredictedMean(), m = c.MeasuredMean();
  for (int k = 0; k < kNumComponents; ++k)
    o += "<tr><td class=\"l\">" + E(ComponentName(k)) + "</td>" +
         Fmt("<td>%.3f</td><td>%.3f</td>", p[k] * u.scale, m[k] * u.scale) + "<td>" +
         E(ErrCell(p[k], m[k])) + "</td></tr>\n";
  o += "<tr><td class=\"l\"><b>step</b></td>" +
       Fmt("<td><b>%.3f</b></td><td><b>%.3f</b></td>", c.predicted_step_s * u.scale,
           c.measured_step_s * u.scale) +
       "<td><b>" + E(ErrCell(c.predicted_step_s, c.measured_step_s)) + "</b></td></tr>\n</table>\n";
  o += "<h3>Per rank</h3>\n" + RankBars(c, u);
  o += "<table>\n<tr><th>rank</th><th>stage</th><th>memory predicted</th><th>measured</th>"
       "<th>error</th></tr>\n";
  for (const RankComparison& r : c.ranks)
    o += Fmt("<tr><td>%d</td><td>%d</td>", r.rank, r.stage) + "<td>" +
         E(FormatBytes(r.predicted_memory_bytes)) + "</td><td>" +
         E(FormatBytes(r.measured_memory_bytes)) + "</td><td>" +
         E(ErrCell(r.predicted_memory_bytes, r.measured_memory_bytes)) + "</td></tr>\n";
  o += "</table>\n<h3>Timeline: the simulated step above the measured one</h3>\n";
  if (c.timeline.empty())
    return o + "<p>no measured timeline in " + E(c.measured_file) +
           " (written by `ptdp train --out` since issue 6).</p>\n</section>\n";
  o += "<p class=\"note\">" +
       E(Fmt("Simulated: one row per pipeline rank. Measured: every rank, the step of median "
             "time (%.2f %s); TP collectives on the thin track under the compute they sit in.",
             c.timeline_step_s * u.scale, u.name)) +
       "</p>\n";
  return o + Timelines(c) + "</section>\n";
}

// ---- rejected, why ------------------------------------------------------------------------

std::string RejectedSection(const ReportData& d) {
  std::string o = "<section id=\"rejected\">\n<h2>Rejected layouts</h2>\n";
  if (!d.searched) return o + "<p>not searched: the plan came from a plan file.</p>\n</section>\n";
  if (d.rejected.empty()) return o + "<p>none rejected.</p>\n</section>\n";
  int64_t most = 1;
  for (const auto& [reason, n] : d.rejected) most = std::max(most, n);
  o += "<table>\n<tr><th class=\"l\">reason</th><th>layouts</th><th class=\"l\"></th></tr>\n";
  for (const auto& [reason, n] : d.rejected)
    o += "<tr><td class=\"l\">" + E(reason) + Fmt("</td><td>%lld</td>", static_cast<long long>(n)) +
         Fmt("<td class=\"l\"><span class=\"bar\" style=\"width:%.0fpx\"></span></td></tr>\n",
             std::max(1.0, 300.0 * n / most));
  return o + "</table>\n</section>\n";
}

std::string WhySection(const ReportData& d) {
  std::string o = "<section id=\"why\">\n<h2>Why this plan</h2>\n";
  if (d.explanation.empty()) {
    o += d.plans.size() < 2 ? "<p>one plan only: nothing to compare it with.</p>\n"
                            : "<p>no explanation given.</p>\n";
  } else {
    o += "<pre class=\"why\">";
    for (const std::string& line : d.explanation) o += E(line) + "\n";
    o += "</pre>\n";
  }
  if (d.has_sim && d.chosen.step_time_s > 0)
    o += "<p class=\"note\">" +
         E(Fmt("The event simulation of the schedule gives %.4f s per step against the analytic "
               "%.4f s (%+.1f%%).",
               d.sim.step_time_s, d.chosen.step_time_s,
               100 * (d.sim.step_time_s / d.chosen.step_time_s - 1))) +
         "</p>\n";
  return o + "</section>\n";
}

}  // namespace

std::string RenderReportHtml(const ReportData& d) {
  std::string o = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" +
                  E(d.title) + "</title>\n<style>" + kCss + "</style>\n</head>\n"
                  "<body data-script-errors=\"0\">\n";
  o += Header(d);
  o += Ranking(d);
  o += BreakdownSection(d);
  o += MemorySection(d);
  o += GanttSection(d);
  o += CompareSection(d);
  o += RejectedSection(d);
  o += WhySection(d);
  o += "<p class=\"note\">generated by ptdp report</p>\n</body>\n</html>\n";
  return o;
}

}  // namespace ptdp::cli
