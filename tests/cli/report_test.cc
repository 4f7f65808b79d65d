// `ptdp report` end to end: the built binary writes the HTML page, then headless Chromium
// renders it (a screenshot of real size) and dumps its DOM (every section, the Gantt's SVG
// boxes, one row per pipeline rank, no script errors). Chromium is installed by
// scripts/setup.sh; without it this test fails and says so.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>

#include "tests/fakes/shell.h"

namespace {

using ptdp::testing::FreshDir;
using ptdp::testing::Count;

namespace fs = std::filesystem;

const std::string kSrc = PTDP_SOURCE_DIR;
const std::string kBin = std::string(PTDP_BINARY_DIR) + "/ptdp";
const std::string kChromium = "/usr/bin/chromium";
const std::string kFlags = "--cluster " + kSrc + "/configs/clusters/dgx-a100.yaml --model " + kSrc +
                           "/configs/models/gpt3-13b.yaml --nodes 4 --global-batch 256";

using ptdp::testing::CmdResult;
using ptdp::testing::Shell;

// Headless Chromium, never hanging (timeout), offline, with its own profile directory.
std::string Chromium(const std::string& args) {
  return "timeout 60 " + kChromium +
         " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run"
         " --disable-background-networking --disable-component-update --disable-sync"
         " --disable-dev-shm-usage --user-data-dir=" + FreshDir("chromium-profile") + " " + args;
}

TEST(Report, HelpHasAnExample) {
  const CmdResult r = Shell(kBin + " report --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("Example"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--html"), std::string::npos) << r.out;
}

TEST(Report, HtmlIsRequired) {
  const CmdResult r = Shell(kBin + " report " + kFlags);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_EQ(r.out, "ptdp: --html is required: the file to write the report to\n");
}

TEST(Report, UnwritablePathIsNamed) {
  const CmdResult r = Shell(kBin + " report " + kFlags + " --html /nonexistent-dir/report.html");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("/nonexistent-dir/report.html"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << "more than one line: " << r.out;
  EXPECT_EQ(r.out.rfind("ptdp:", 0), 0u) << r.out;
}

TEST(Report, FromPlanFile) {
  const std::string dir = FreshDir("report-plan");
  const std::string plan = dir + "/plan.yaml", html = dir + "/report.html";
  ASSERT_EQ(Shell(kBin + " plan " + kFlags + " --top 3 --out " + plan).code, 0);
  const CmdResult r = Shell(kBin + " report " + plan + " --html " + html);
  ASSERT_EQ(r.code, 0) << r.out;
  std::stringstream text;
  text << std::ifstream(html).rdbuf();
  const std::string page = text.str();
  EXPECT_NE(page.find("one plan, read from a plan file"), std::string::npos);
  EXPECT_EQ(Count(page, "<tr class=\"chosen\">"), 1u);
  EXPECT_NE(page.find("<section id=\"gantt\">"), std::string::npos);
}

TEST(Report, RendersInHeadlessChromium) {
  ASSERT_TRUE(fs::exists(kChromium))
      << kChromium << " is missing: run scripts/setup.sh (it installs chromium for this test)";
  const std::string dir = FreshDir("report");
  ASSERT_FALSE(dir.empty());
  const std::string html = dir + "/report.html", png = dir + "/report.png";
  const CmdResult made = Shell(kBin + " report " + kFlags + " --json --html " + html, false);
  ASSERT_EQ(made.code, 0) << made.out;
  const nlohmann::json j = nlohmann::json::parse(made.out);
  const int pp = j["layout"]["pp"];
  ASSERT_TRUE(fs::exists(html));

  // (a) A screenshot of the page: a real picture, not an error page of a few hundred bytes.
  const CmdResult shot = Shell(Chromium("--screenshot=" + png + " --window-size=1400,2400 file://" + html));
  ASSERT_EQ(shot.code, 0) << shot.out;
  ASSERT_TRUE(fs::exists(png)) << shot.out;
  EXPECT_GT(fs::file_size(png), 20000u);
  std::ifstream in(png, std::ios::binary);
  std::string magic(8, '\0');
  in.read(magic.data(), 8);
  EXPECT_EQ(magic, "\x89PNG\r\n\x1a\n");

  // (b) The DOM after parsing and layout: every section, the Gantt's SVG boxes, one row per
  // pipeline rank, and no script error recorded.
  const CmdResult dom = Shell(Chromium("--dump-dom file://" + html), false);
  ASSERT_EQ(dom.code, 0);
  for (const char* id : {"ranking", "breakdown", "memory", "gantt", "rejected", "why"})
    EXPECT_NE(dom.out.find(std::string("<section id=\"") + id + "\">"), std::string::npos) << id;
  EXPECT_NE(dom.out.find("data-script-errors=\"0\""), std::string::npos);
  const size_t gantt = dom.out.find("<section id=\"gantt\">");
  ASSERT_NE(gantt, std::string::npos);
  const std::string chart = dom.out.substr(gantt, dom.out.find("</section>", gantt) - gantt);
  EXPECT_NE(chart.find("<svg"), std::string::npos);
  EXPECT_GT(Count(chart, "<rect"), size_t(4 * pp));
  EXPECT_GT(Count(chart, "class=\"ev\""), size_t(2 * pp));
  EXPECT_EQ(Count(chart, "<g class=\"rank\""), size_t(pp));
}

// A measured run in the page: `--measured` adds #compare, and Chromium lays it out with a row
// per rank in the measured timeline and a row per pipeline rank in the simulated one.
TEST(Report, PredictedAgainstMeasuredInHeadlessChromium) {
  ASSERT_TRUE(fs::exists(kChromium)) << kChromium << " is missing: run scripts/setup.sh";
  const std::string dir = FreshDir("report-measured");
  ASSERT_FALSE(dir.empty());
  const std::string plan = dir + "/plan.yaml", measured = dir + "/measured.json",
                    html = dir + "/report.html";
  ASSERT_EQ(Shell(kBin + " plan --cluster " + kSrc + "/configs/clusters/local-cpu.yaml --model " +
                  kSrc + "/configs/models/gpt-tiny.yaml --gpus 2 --global-batch 8 --pp 2 "
                  "--refine 0 --out " + plan).code, 0);
  ASSERT_EQ(Shell(kBin + " train " + plan + " --steps 3 --no-speed-probe --out " + measured).code, 0);
  const CmdResult made = Shell(kBin + " report " + plan + " --measured " + measured +
                               " --json --html " + html, false);
  ASSERT_EQ(made.code, 0) << made.out;
  EXPECT_TRUE(nlohmann::json::parse(made.out).contains("step_time_error_pct"));
  const CmdResult dom = Shell(Chromium("--dump-dom file://" + html), false);
  ASSERT_EQ(dom.code, 0);
  const size_t at = dom.out.find("<section id=\"compare\">");
  ASSERT_NE(at, std::string::npos);
  const std::string section = dom.out.substr(at, dom.out.find("</section>", at) - at);
  EXPECT_EQ(Count(section, "<g class=\"meas-rank\""), 2u);
  EXPECT_EQ(Count(section, "<g class=\"sim-rank\""), 2u);
  EXPECT_EQ(Count(section, "<g class=\"cmp-rank\""), 2u);
  EXPECT_GE(Count(section, "class=\"mev\""), 8u);  // 4 forwards + 4 backwards per rank at least
  // --measured needs the plan that was trained.
  const CmdResult bad = Shell(kBin + " report " + kFlags + " --measured " + measured + " --html " + html);
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.out.find("--measured needs the plan.yaml"), std::string::npos) << bad.out;
}

// The page at a window `width` px wide, 900 high, as Chromium lays it out: a copy of it with
// a script that writes into the DOM the document's scroll width and client width (the window
// less its scrollbar), the number of SVG charts and how many charts and tables stick out of
// their container ("data-fit", four numbers).
struct Fit {
  int scroll_width = -1, client_width = -1, charts = -1, sticking_out = -1;
};
Fit MeasureFit(const std::string& html, int width) {
  std::stringstream text;
  text << std::ifstream(html).rdbuf();
  std::string page = text.str();
  const std::string script = R"(<script>
var d = document.documentElement, charts = 0, out = 0;
document.querySelectorAll('svg, table').forEach(function (e) {
  var r = e.getBoundingClientRect(), p = e.parentElement.getBoundingClientRect();
  if (e.tagName.toLowerCase() == 'svg') ++charts;
  if (r.left < p.left - 0.5 || r.right > p.right + 0.5) ++out;
});
document.body.setAttribute('data-fit', [d.scrollWidth, d.clientWidth, charts, out].join(' '));
</script>)";
  const size_t end = page.rfind("</body>");
  if (end == std::string::npos) return {};
  page.insert(end, script);
  const std::string measured = html + ".fit.html";
  std::ofstream(measured) << page;
  const CmdResult dom = Shell(Chromium("--window-size=" + std::to_string(width) +
                                       ",900 --dump-dom file://" + measured), false);
  const size_t at = dom.out.find("data-fit=\"");
  Fit f;
  if (dom.code != 0 || at == std::string::npos) return f;
  std::istringstream(dom.out.substr(at + 10)) >> f.scroll_width >> f.client_width >> f.charts >>
      f.sticking_out;
  return f;
}

// From 800 px up the page never scrolls sideways and every chart and table fits its section:
// the SVGs scale down (before: 1200 px wide whatever the window, a 1216 px page at 800 px),
// and the ranking's names wrap. Checked on the demo's 175B search (the widest ranking:
// tp8 pp4 dp32 vp12 rows) and on a measured CPU run (six charts, the busy warning).
TEST(Report, FitsTheWindowFrom800PxInHeadlessChromium) {
  if (!fs::exists(kChromium)) GTEST_SKIP() << kChromium << " is missing: run scripts/setup.sh";
  const std::string dir = FreshDir("report-fit");
  ASSERT_FALSE(dir.empty());
  const std::string search = dir + "/search.html", measured_page = dir + "/measured.html";
  const std::string plan = dir + "/plan.yaml", measured = dir + "/measured.json";
  ASSERT_EQ(Shell(kBin + " report --cluster " + kSrc + "/configs/clusters/dgx-a100.yaml --model " +
                  kSrc + "/configs/models/gpt3-175b.yaml --global-batch 1536 --html " + search).code, 0);
  ASSERT_EQ(Shell(kBin + " plan --cluster " + kSrc + "/configs/clusters/local-cpu.yaml --model " +
                  kSrc + "/configs/models/gpt-tiny.yaml --gpus 2 --global-batch 8 --pp 2 "
                  "--refine 0 --out " + plan).code, 0);
  ASSERT_EQ(Shell(kBin + " train " + plan + " --steps 3 --no-speed-probe --out " + measured).code, 0);
  ASSERT_EQ(Shell(kBin + " report " + plan + " --measured " + measured + " --html " +
                  measured_page).code, 0);
  for (const auto& [page, charts] : {std::pair{search, 3}, std::pair{measured_page, 6}})
    for (int width : {800, 1400}) {
      SCOPED_TRACE(page + " at " + std::to_string(width) + " px");
      const Fit f = MeasureFit(page, width);
      ASSERT_GT(f.client_width, 0) << "no measurement from Chromium";
      EXPECT_GT(f.client_width, width - 30);  // the window less a vertical scrollbar
      EXPECT_LE(f.scroll_width, f.client_width);
      EXPECT_EQ(f.charts, charts);
      EXPECT_EQ(f.sticking_out, 0);
    }
}

// A plan for the CPU runtime is fp32 (local-cpu has no 16-bit peak: the runtime computes fp32),
// and its throughput is a few GFLOP/s per rank slot, not "0.0 TFLOP/s".
TEST(Report, CpuPlanIsFp32InGflops) {
  const std::string dir = FreshDir("report-cpu");
  const std::string html = dir + "/report.html";
  const std::string cpu = "--cluster " + kSrc + "/configs/clusters/local-cpu.yaml --model " + kSrc +
                          "/configs/models/gpt-tiny.yaml --gpus 2 --global-batch 8";
  const CmdResult made = Shell(kBin + " report " + cpu + " --json --html " + html, false);
  ASSERT_EQ(made.code, 0) << made.out;
  EXPECT_EQ(nlohmann::json::parse(made.out)["layout"]["precision"], "fp32");
  std::stringstream text;
  text << std::ifstream(html).rdbuf();
  const std::string page = text.str();
  EXPECT_NE(page.find(", fp32, "), std::string::npos);
  EXPECT_EQ(page.find("bf16"), std::string::npos);
  EXPECT_NE(page.find(" GFLOP/s</div>"), std::string::npos);
  EXPECT_EQ(page.find("TFLOP/s"), std::string::npos);
  // The same default without a search, and the GPU clusters keep bf16.
  const CmdResult sim = Shell(kBin + " simulate " + cpu + " --pp 2 --json", false);
  ASSERT_EQ(sim.code, 0) << sim.out;
  EXPECT_EQ(nlohmann::json::parse(sim.out)["layout"]["precision"], "fp32");
  const CmdResult gpu = Shell(kBin + " simulate " + kFlags + " --tp 8 --json", false);
  ASSERT_EQ(gpu.code, 0) << gpu.out;
  EXPECT_EQ(nlohmann::json::parse(gpu.out)["layout"]["precision"], "bf16");
}

}  // namespace
