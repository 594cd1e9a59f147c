// A parallel plan string as sharding annotations on an unsharded training
// step: the few tensors whose layout Megatron-LM and DDP/ZeRO fix
// (parameters, data inputs, the residual stream under sequence parallelism),
// which the SPMD partitioner (sharding_plan.h) then carries through every op,
// inserting only the collectives that remain. docs/frontends.md, "Plans
// through the partitioner".
#pragma once

#include <string>
#include <vector>

#include "concerto/ir/ir.h"
#include "concerto/lower/plan.h"
#include "concerto/lower/sharding_plan.h"
#include "concerto/util/status.h"

namespace concerto {

/// Megatron's layout of `plan` on `unsharded` (one graph, one rank, no
/// communication, forward ops tagged phase fwd, an Adam op per parameter),
/// found from the graph's structure, not from names:
///  - dp: each of `data_inputs` split on dim 0; gradients then carry a
///    partial sum over dp (the partitioner all-reduces them); zero=1|2: each
///    Adam op's moments (and master copy) and gradient split on dim 0 over dp
///    (reduce-scatter, shard update, all-gather of the parameter); zero=3: each
///    parameter split so, gathered before the forward and again before the
///    backward (ShardingRule::regather), its gradient reduce-scattered.
///  - tp: walking the forward in program order, a matmul of a 2-D parameter
///    whose activation is not yet split is column-parallel (the weight split
///    on its output features; segmented when its output is sliced into equal
///    parts on the last dim, as a fused q/k/v is), one whose activation
///    descends from a column-parallel output is row-parallel (split on its
///    input features); a 1-D parameter added to a split output (a bias) is
///    split alike; a word embedding (table read with a data input's ids) is
///    split by vocabulary.
///  - sp: the input and output of every norm and the output of every
///    row-parallel matmul split on the token dim (rank - 2); the output of
///    every column-parallel matmul whole on it (so its input is gathered, and
///    gathered again in the backward for the weight gradient, as Megatron does).
/// Errors name the plan key or the tensor: a key this route does not lower
/// yet (pp, ep, cp, vstages, dap, microbatches > 1, recompute), a data
/// input that is missing or not a graph input, a dimension a degree does not
/// divide, a program with no Adam ops.
Result<ShardingPlan> ShardingFromPlan(const Program& unsharded, const ParallelPlan& plan,
                                      const std::vector<std::string>& data_inputs);

}  // namespace concerto
