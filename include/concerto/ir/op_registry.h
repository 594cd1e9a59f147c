// The op registry: one entry per compute type with what the IR knows about
// it: its spelling in IR files, its operands, its attributes (which are
// integers, their bounds, which change the kernel's running time and so key
// the profile), how many flops it does per unit of work (the frontends
// multiply; the cost model prices op.flops), its kernel class (the cost
// model's and the profiler's), its shape rule (the verifier applies it) and
// its sharding rule (the SPMD partitioner applies it) and its backward rule
// (the autodiff pass applies it). There is no second copy of any of these.
// The table is defined in src/ir/shapes.cc, beside the shape rules; the
// sharding rules are in src/ir/sharding_rules.cc, the backward rules in
// src/ir/backward_rules.cc.
//
// A layer above ir/ owns one facet of a compute type, in its own table in
// enum order that a test checks against this one: the fp32 CPU kernel
// (runtime/kernels.h, CpuKernels()). docs/architecture.md "How to add an
// op" walks through a new op.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "concerto/ir/autodiff.h"
#include "concerto/ir/ir.h"
#include "concerto/ir/sharding_signature.h"

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

/// An attribute an op of the type reads (op.attrs). Integer attributes are
/// checked against [lo, hi] before a run (the runtime's CheckKernel); a
/// `timing` attribute changes the kernel's running time, so it is part of
/// the op's profile key (ProfileDb::Signature); the rest (eps, lr, scale)
/// do not and would only split the profile's keys.
struct AttrInfo {
  std::string_view name;
  bool required = false;
  bool integer = false;
  double lo = 0, hi = 0;  // integer attributes only
  bool timing = false;
};

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
  /// The attributes it reads.
  std::vector<AttrInfo> attrs;
  /// The partitioner's rule (ir/sharding_signature.h); null when the type
  /// cannot be partitioned from an unsharded program (MoE routing, top-k and
  /// transpose: the frontends emit them already sharded).
  ShardingSignatureRule sharding = nullptr;
  /// The autodiff's rule (ir/autodiff.h); null for types without one: the
  /// gradient ops themselves, the optimizer, and the loss chain's pieces
  /// (reduce_max, sum_exp, gather_target: cross_entropy's rule covers them).
  BackwardRule backward = nullptr;
};

/// Every compute type, in enum order.
const std::vector<OpTypeInfo>& OpRegistry();
/// The entry of `type`.
const OpTypeInfo& OpInfo(ComputeType type);
/// OpInfo(type).flops: the flops per unit the frontends multiply by.
double FlopsPerUnit(ComputeType type);
/// attention_grad's flops per flop of its attention: FlashAttention's
/// backward recomputes the scores, five matmuls to the forward's two
/// (Dao-AILab/flash-attention#1525; its benchmark counts the backward so).
inline constexpr double kAttentionGradFlops = 2.5;
/// The entry of `type`'s attribute `name`, or null when the type has none.
const AttrInfo* FindAttr(ComputeType type, std::string_view name);

}  // namespace concerto
