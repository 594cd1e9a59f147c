// Helpers shared by the lowering tests.
#pragma once

#include "concerto/ir/ir.h"

namespace concerto::testing_util {

/// Matmul and attention ops: the flops the closed-form formulas count.
inline bool IsMatmulOrAttention(const Op& op) {
  return op.kind == OpKind::kCompute &&
         (op.compute_type == ComputeType::kMatmul || op.compute_type == ComputeType::kAttention ||
          op.compute_type == ComputeType::kAttentionGrad);
}

/// Sum of matmul + attention flops of `layer` in `phase`.
inline double LayerFlops(const Graph& g, int layer, Phase phase) {
  double total = 0;
  for (const Op& op : g.ops)
    if (op.tags.layer == layer && op.tags.phase == phase && IsMatmulOrAttention(op)) total += op.flops;
  return total;
}

/// Flops of the attention ops of `layer`'s forward.
inline double LayerAttentionFlops(const Graph& g, int layer) {
  double total = 0;
  for (const Op& op : g.ops)
    if (op.tags.layer == layer && op.tags.phase == Phase::kForward && op.kind == OpKind::kCompute &&
        op.compute_type == ComputeType::kAttention)
      total += op.flops;
  return total;
}

}  // namespace concerto::testing_util
