// libFuzzer target: the Hugging Face config.json importer (core/model.h ImportHfConfigText).
// Any text must give a model or an error; an imported model must pass ValidateModel and give
// its derived counts without overflow.
#include <cstddef>
#include <cstdint>

#include "core/model.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ptdp;
  auto m = ImportHfConfigText(fuzz::Text(data, size), "fuzz/config.json");
  if (!m.ok()) return 0;
  Status v = ValidateModel(*m, "fuzz/config.json");
  if (!v.ok()) fuzz::Broken("imported a model ValidateModel refuses: " + v.message());
  (void)m->total_params();
  (void)m->embedding_params(8);
  (void)m->output_params(8);
  return 0;
}
