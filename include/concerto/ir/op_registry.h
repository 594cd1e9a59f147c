// The op registry: one entry per compute type with what the IR itself knows
// about it: its spelling in IR files, its operands, how many flops it does
// per unit of work (the frontends multiply; the cost model prices op.flops)
// and its shape rule (the verifier applies it). The IR's names
// (ToString/ParseComputeType), every frontend's flop counts and the
// verifier's shape checks come from here; there is no second copy. The table
// is defined in src/ir/shapes.cc, beside the shape rules it points at.
//
// The other facets of a compute type still live with the layer that owns
// them, each a switch over ComputeType (the compiler's -Wswitch names a
// missing case): the CPU kernel (runtime/kernels.cc), the sharding rule
// (lower/partitioner.cc) and the backward (the frontends). The cost model's
// and the profiler's kernel class is in the entry (kernel_class). docs/architecture.md "How to add an op" walks
// through all of them; moving them into this entry is the open part of the
// redesign (issue 14's notes).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "concerto/ir/ir.h"

namespace concerto {

/// A shape rule: "" when the op's inputs and outputs have the shapes, dtypes
/// and attributes its type requires, else the message (naming the operand).
using ShapeRule = std::string (*)(const Op& op, const std::vector<const Tensor*>& inputs,
                                  const std::vector<const Tensor*>& outputs);

/// How a kernel of the type spends its time, for the cost model and the
/// profiler: tensor-core kernels are priced at the device's matmul
/// efficiency; streaming kernels (a few flops per element) are bound by the
/// bytes they move and fit the memory bandwidth when profiled; vector
/// kernels (transcendentals, row reductions, gathers) are the rest.
enum class KernelClass { kTensorCore, kStreaming, kVector };

struct OpTypeInfo {
  ComputeType type;
  std::string_view name;       // the IR's spelling ("layer_norm")
  std::string_view signature;  // operands and result, for docs and messages
  /// Flops per `flops_per` (an output element unless it says otherwise); 0
  /// when the frontend computes a formula instead (matmul: 2 m n k).
  double flops;
  std::string_view flops_per;
  /// The shape rule the verifier applies (CheckComputeShapes).
  ShapeRule shape_rule;
  KernelClass kernel_class;
};

/// Every compute type, in enum order.
const std::vector<OpTypeInfo>& OpRegistry();
/// The entry of `type`.
const OpTypeInfo& OpInfo(ComputeType type);
/// OpInfo(type).flops: the flops per unit the frontends multiply by.
double FlopsPerUnit(ComputeType type);

}  // namespace concerto
