#include "concerto/lower/frontend.h"

#include "concerto/lower/plan.h"
#include "concerto/lower/transformer.h"

namespace concerto {

Result<Program> LowerModelPlan(const std::string& model, const std::string& plan_text) {
  Result<ParallelPlan> plan = ParsePlan(plan_text);
  if (!plan.ok()) return plan.status();
  Result<ModelConfig> config = LoadModel(model);
  if (!config.ok()) return config.status();
  return LowerTransformer(*config, *plan);
}

std::vector<std::string> AllModelPresetNames() { return ModelPresetNames(); }

}  // namespace concerto
