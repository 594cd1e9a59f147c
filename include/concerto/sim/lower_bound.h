// A lower bound on the makespan of any schedule of a program.
#pragma once

#include <string>

#include "concerto/cost/cost_model.h"

namespace concerto {

/// LB = max(critical path of the dependency graph, busiest stream's total
/// work), over each role's lowest rank, from undelayed op durations. With
/// `control_deps` false only data edges count: a relaxation, so still a
/// bound, that ignores the ordering edges a scheduler added.
struct LowerBound {
  double critical_path_us = 0;
  double stream_load_us = 0;
  std::string busiest_stream;
  double lower_bound_us = 0;
};
LowerBound ComputeLowerBound(const Program& program, const CostModel& cost, bool control_deps = true);

}  // namespace concerto
