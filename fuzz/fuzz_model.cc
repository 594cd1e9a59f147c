// Fuzz target: model spec files of every family, the first byte choosing the
// reader: even, the decoder reader (ParseModelSpec, which validates; an
// accepted model's parameter count is computed); odd, the vision reader
// (ParseVisionSpec: vit and wide-resnet; an accepted model's parameters are
// counted by building its forward). The sizes are bounded up front, so
// neither can overflow or grow without bound.
#include <cstdint>
#include <string>

#include "concerto/lower/transformer.h"
#include "concerto/lower/vision.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) {
    concerto::Result<std::optional<concerto::VisionConfig>> vision = concerto::ParseVisionSpec(text, "fuzz.yaml");
    if (vision.ok() && *vision) (void)concerto::VisionParameterCount(**vision);
    return 0;
  }
  concerto::Result<concerto::ModelConfig> model = concerto::ParseModelSpec(text, "fuzz.yaml", "fuzz");
  if (model.ok()) (void)concerto::ModelParameterCount(*model);
  return 0;
}
