// Parallel plans given as strings ("dp=4,tp=8").
#pragma once

#include <string>

#include "concerto/lower/gpt.h"
#include "concerto/util/status.h"

namespace concerto {

/// Parses "dp=N,tp=M" (either may be omitted: 1). Unknown keys, repeated
/// keys and values that are not positive integers are errors naming them.
Result<DpTpPlan> ParseDpTpPlan(const std::string& text);

}  // namespace concerto
