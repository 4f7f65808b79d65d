// libFuzzer target: the CLI's layout flags (cli/common.h AddLayoutFlags, LayoutFromFlags,
// SpaceFromFlags). The input is a command line, one argument per line; it is parsed by CLI11
// as `ptdp simulate` would, then turned into one layout and into a search space against a fixed
// world (configs/clusters/dgx-a100.yaml, configs/models/gpt3-13b.yaml, resized by --nodes,
// --gpus, --seq-len as LoadWorld does). Any input must give a layout or an error.
#include <CLI/CLI.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cli/common.h"
#include "fuzz/fuzz_util.h"

namespace {

const std::string kCluster = std::string(PTDP_SOURCE_DIR) + "/configs/clusters/dgx-a100.yaml";
const std::string kModel = std::string(PTDP_SOURCE_DIR) + "/configs/models/gpt3-13b.yaml";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ptdp;
  if (size > 4096) return 0;  // a command line, not a file
  std::vector<std::string> args;  // CLI11 wants them last first
  std::string cur;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == '\n') {
      args.push_back(cur);
      cur.clear();
    } else {
      cur += char(data[i]);
    }
  }
  if (!cur.empty()) args.push_back(cur);
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  CLI::App app{"fuzz"};
  cli::LayoutFlags f;
  cli::AddLayoutFlags(&app, &f, false);
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError&) {
    return 0;
  }
  // Bigger worlds are valid but only cost time to build (the graph has a node per GPU).
  if (f.nodes && (*f.nodes < 0 || *f.nodes > 64)) return 0;
  auto w = cli::LoadWorld(kCluster, kModel, f.nodes, f.gpus, f.seq_len);
  if (!w.ok()) return 0;
  auto layout = cli::LayoutFromFlags(f, *w);
  if (layout.ok() && layout->world() != w->gpus && !f.dp)
    fuzz::Broken("LayoutFromFlags gave " + std::to_string(layout->world()) + " ranks for " +
                 std::to_string(w->gpus) + " GPUs");
  (void)cli::SpaceFromFlags(f, *w);
  return 0;
}
