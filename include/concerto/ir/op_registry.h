// The op registry: one entry per compute type with what the IR itself knows
// about it: its spelling in IR files, its operands, and how many flops it does
// per unit of work (the frontends multiply; the cost model prices op.flops).
// The IR's names (ToString/ParseComputeType) and every frontend's flop
// counts come from here; there is no second copy.
//
// The other facets of a compute type still live with the layer that owns
// them, each a switch over ComputeType (the compiler's -Wswitch names a
// missing case): the shape rule (ir/shapes.cc, CheckComputeType), the CPU
// kernel (runtime/kernels.cc), the sharding rule (lower/partitioner.cc) and
// the backward (the frontends). docs/architecture.md "How to add an op" walks
// through all of them; moving them into this entry is the open part of the
// redesign (issue 14's notes).
#pragma once

#include <string_view>
#include <vector>

#include "concerto/ir/ir.h"

namespace concerto {

struct OpTypeInfo {
  ComputeType type;
  std::string_view name;       // the IR's spelling ("layer_norm")
  std::string_view signature;  // operands and result, for docs and messages
  /// Flops per `flops_per` (an output element unless it says otherwise); 0
  /// when the frontend computes a formula instead (matmul: 2 m n k).
  double flops;
  std::string_view flops_per;
};

/// Every compute type, in enum order.
const std::vector<OpTypeInfo>& OpRegistry();
/// The entry of `type`.
const OpTypeInfo& OpInfo(ComputeType type);
/// OpInfo(type).flops: the flops per unit the frontends multiply by.
double FlopsPerUnit(ComputeType type);

}  // namespace concerto
