// Fuzz target: cluster files (ParseCluster), YAML or JSON by the first byte.
#include <cstdint>
#include <string>

#include "concerto/cost/cluster.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  (void)concerto::ParseCluster(text, "fuzz.cluster", data[0] & 1);
  return 0;
}
