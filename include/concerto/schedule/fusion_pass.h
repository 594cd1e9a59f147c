// The Concerto fusion pass: merge adjacent collectives on one stream where
// the simulated timeline says the merged one finishes no later (launch
// latency saved outweighs the later start), not by a fixed byte cap.
#pragma once

#include "concerto/cost/cost_model.h"
#include "concerto/schedule/schedule.h"
#include "concerto/sim/simulator.h"
#include "concerto/util/status.h"

namespace concerto {

/// Rewrites `sp` (program and schedule) in place using `timeline` (a
/// simulation of `sp`): runs of adjacent collectives of one type, reduce op
/// and group on one stream are fused when, for each added member c, the
/// fused op would start at max(start of the run, when c's inputs are ready)
/// and, priced by `cost`, end no later than c ended and no later than any
/// member's consumer started. Only groups inside one role are fused. Returns
/// the number of collectives merged away.
Result<int> FuseWhereItPays(ScheduledProgram& sp, const Timeline& timeline, const CostModel& cost);

}  // namespace concerto
