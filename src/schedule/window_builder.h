// The window builder of the concerto search: the exact problem of one window
// (its ops free, everything else fixed at the current start ticks), with the
// memory budget as buffers when there is one. Side-effect free: it reads the
// role's state (its scratch `task_of` is restored before it returns).
// Internal to src/schedule/.
#pragma once

#include <cstdint>
#include <vector>

#include "concerto/schedule/window_solver.h"
#include "search_state.h"

namespace concerto::search {

/// One window: tasks (window ops and fixed blockers) and their op indices.
struct Window {
  WindowProblem problem;
  std::vector<int> ops;    // task -> op index
  int free_tasks = 0;      // the first free_tasks tasks are window ops, the rest blockers
};

/// Builds the problem of solving `members` with everything else fixed at r.t:
/// outside predecessors give release times, outside successors deadlines,
/// outside ops on the same stream between window ops become fixed blockers.
Window BuildWindow(const RoleSearch& r, const std::vector<int>& members, int64_t horizon, bool fix_comm_order,
                   int64_t budget_units);

}  // namespace concerto::search
