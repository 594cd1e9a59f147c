// Collective fusion as a graph rewrite: several collectives of one type and
// group become one op that carries all their inputs and outputs (flatten,
// concatenate, one collective, split). Used by bucketing baselines and by
// the Concerto scheduler's fusion pass.
#pragma once

#include <vector>

#include "concerto/ir/ir.h"
#include "concerto/util/status.h"

namespace concerto {

/// Replaces each group of op ids in `groups` (each at least 2 collectives of
/// the same kind, type, reduce op and group) by one fused op placed at the
/// position of the group's last member, with a fresh id, name
/// "fused.<first member name>+N", fused_from = members, message_bytes = sum.
/// Control deps on members are redirected to the fused op. Returns the new
/// op ids, one per group, or an error naming an op that cannot be fused.
Result<std::vector<int>> FuseCollectives(Graph& graph, const std::vector<std::vector<int>>& groups);

}  // namespace concerto
