// Fuzz target: model spec files (ParseModelSpec, which validates); an accepted
// model's parameter count is computed (the sizes are bounded, so it cannot
// overflow).
#include <cstdint>
#include <string>

#include "concerto/lower/transformer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  concerto::Result<concerto::ModelConfig> model = concerto::ParseModelSpec(text, "fuzz.yaml", "fuzz");
  if (model.ok()) (void)concerto::ModelParameterCount(*model);
  return 0;
}
