// Fuzz target: per-op sharding files (ParseShardingPlan) and their mesh
// against the world size.
#include <cstdint>
#include <string>

#include "concerto/lower/sharding_plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  concerto::Result<concerto::ShardingPlan> plan = concerto::ParseShardingPlan(text, "fuzz.json");
  if (plan.ok()) (void)concerto::CheckShardingWorld(*plan, 4);
  return 0;
}
