// libFuzzer target: the plan.yaml reader (core/plan.h). Any text must give a plan or an error;
// an accepted plan must write back (PlanToYaml) to text that reads to the same plan.
#include <cstddef>
#include <cstdint>

#include "core/plan.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ptdp;
  auto plan = PlanFromYamlText(fuzz::Text(data, size), "fuzz.plan.yaml");
  if (!plan.ok()) return 0;
  const std::string text = PlanToYaml(*plan);
  auto again = PlanFromYamlText(text, "again.plan.yaml");
  if (!again.ok()) fuzz::Broken("PlanToYaml output refused: " + again.status().message());
  if (PlanToYaml(*again) != text) fuzz::Broken("plan round trip changed it");
  return 0;
}
