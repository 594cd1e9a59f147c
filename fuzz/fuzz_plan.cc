// Fuzz target: plan strings (ParsePlan) and plan files (ParsePlanFile), the
// first byte choosing which; an accepted plan's canonical text reads back to
// the same plan (ParsePlan(PlanToString(p)) == p) and is validated against
// a small model.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "concerto/lower/plan.h"
#include "concerto/lower/transformer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  concerto::Result<concerto::ParallelPlan> plan =
      data[0] & 1 ? concerto::ParsePlanFile(text, "fuzz.yaml") : concerto::ParsePlan(text);
  if (!plan.ok()) return 0;
  const std::string canonical = concerto::PlanToString(*plan);
  concerto::Result<concerto::ParallelPlan> again = concerto::ParsePlan(canonical);
  if (!again.ok() || concerto::PlanToString(*again) != canonical) {
    std::fprintf(stderr, "plan round trip failed for '%s'\n", canonical.c_str());
    std::abort();
  }
  static const concerto::ModelConfig model = concerto::ModelPreset("gpt-tiny").value();
  (void)concerto::ValidatePlan(model, *plan);
  return 0;
}
