#include "concerto/lower/frontend.h"

#include <algorithm>

#include "concerto/lower/evoformer.h"
#include "concerto/lower/plan.h"
#include "concerto/lower/transformer.h"
#include "concerto/lower/vision.h"

namespace concerto {

Result<Program> LowerModelPlan(const std::string& model, const std::string& plan_text) {
  Result<ParallelPlan> plan = LoadPlan(plan_text);  // a plan string, or a plan file
  if (!plan.ok()) return plan.status();
  const std::vector<std::string> evo = EvoformerPresetNames();
  if (std::find(evo.begin(), evo.end(), model) != evo.end()) {
    if (plan->tp != 1 || plan->pp != 1 || plan->ep != 1 || plan->sp || plan->zero != 0 || plan->microbatches != 1 ||
        plan->vstages != 1 || plan->recompute != Recompute::kNone)
      return Status::Error("plan '" + plan_text + "' for model '" + model +
                           "': the Evoformer frontend takes dp and dap only (e.g. dp=4,dap=8)");
    if (!plan->order.empty())
      return Status::Error("plan '" + plan_text + "' for model '" + model +
                           "': key 'order' is not supported by the Evoformer frontend (its mesh is "
                           "{dp, dap}, dap innermost)");
    Result<EvoformerConfig> config = EvoformerPreset(model);
    if (!config.ok()) return config.status();
    return LowerEvoformer(*config, plan->dp, plan->dap);
  }
  const std::vector<std::string> vision = VisionPresetNames();
  if (std::find(vision.begin(), vision.end(), model) != vision.end()) {
    Result<VisionConfig> config = VisionPreset(model);
    if (!config.ok()) return config.status();
    return LowerVision(*config, *plan);
  }
  Result<std::optional<VisionConfig>> vision_spec = LoadVisionSpec(model);
  if (!vision_spec.ok()) return vision_spec.status();
  if (*vision_spec) return LowerVision(**vision_spec, *plan);
  Result<ModelConfig> config = LoadModel(model);
  if (!config.ok()) return config.status();
  return LowerTransformer(*config, *plan);
}

std::vector<std::string> AllModelPresetNames() {
  std::vector<std::string> names = ModelPresetNames();
  for (const auto& n : EvoformerPresetNames()) names.push_back(n);
  for (const auto& n : VisionPresetNames()) names.push_back(n);
  return names;
}

}  // namespace concerto
