// libFuzzer target: the model YAML reader (core/model.h). Any text must give a model or an
// error; an accepted model must pass ValidateModel, give its derived counts without overflow
// (UBSan would report one) and write back (ModelToYaml) to text that reads to the same model.
#include <cstddef>
#include <cstdint>

#include "core/model.h"
#include "core/yaml_reader.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ptdp;
  auto node = ParseYamlText(fuzz::Text(data, size), "fuzz.yaml");
  if (!node.ok()) return 0;
  auto m = ModelFromYaml(*node, "fuzz.yaml", "");
  if (!m.ok()) return 0;
  Status v = ValidateModel(*m, "fuzz.yaml");
  if (!v.ok()) fuzz::Broken("ModelFromYaml accepted a model ValidateModel refuses: " + v.message());
  (void)m->total_params();
  (void)m->embedding_params(8);
  (void)m->output_params(8);
  (void)m->linear_params_per_layer();
  auto node2 = ParseYamlText(ModelToYaml(*m, ""), "again.yaml");
  if (!node2.ok()) fuzz::Broken("ModelToYaml wrote unparsable YAML: " + node2.status().message());
  auto m2 = ModelFromYaml(*node2, "again.yaml", "");
  if (!m2.ok()) fuzz::Broken("ModelToYaml output refused: " + m2.status().message());
  if (ModelToYaml(*m2, "") != ModelToYaml(*m, "")) fuzz::Broken("model round trip changed it");
  return 0;
}
