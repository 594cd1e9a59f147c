// Tests only: tiny hand-built ops and tensors with explicit durations, for
// programs whose timelines a test draws and works out by hand.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "concerto/ir/ir.h"

namespace concerto::testing {

/// A 4-element f32 tensor, replicated.
inline Tensor T(const std::string& name) { return Tensor{name, {4}, DType::kF32, {{}}, {}}; }

/// An op with an explicit duration (us): compute ops add two inputs or
/// scale one; collectives run over "dp"; communication moves 16 bytes.
inline Op MakeOp(int id, const std::string& name, OpKind kind, const std::string& stream, std::vector<std::string> in,
                 std::vector<std::string> out, double us) {
  Op o;
  o.id = id;
  o.name = name;
  o.kind = kind;
  o.stream = stream;
  o.inputs = std::move(in);
  o.outputs = std::move(out);
  o.duration_us = us;
  if (kind == OpKind::kCompute) o.compute_type = o.inputs.size() == 2 ? ComputeType::kAdd : ComputeType::kScale;
  if (kind == OpKind::kCollective) o.group.axes = {"dp"};
  if (kind != OpKind::kCompute) o.message_bytes = 16;
  return o;
}

}  // namespace concerto::testing
