// One entry point over every frontend: a model (preset or spec file) and a
// plan string to a Program.
#pragma once

#include <string>
#include <vector>

#include "concerto/ir/ir.h"
#include "concerto/util/status.h"

namespace concerto {

/// Lowers `model` (any frontend's preset, or a model spec file) under
/// `plan` (e.g. "dp=4,tp=8", "zero=3,dp=32", "dp=4,dap=8"), or the plan file
/// (YAML/JSON) at path `plan` when it names an existing file (LoadPlan).
Result<Program> LowerModelPlan(const std::string& model, const std::string& plan);
/// Every frontend's presets.
std::vector<std::string> AllModelPresetNames();

}  // namespace concerto
