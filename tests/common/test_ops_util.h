// Tests only: tiny hand-built ops and tensors with explicit durations, for
// programs whose timelines a test draws and works out by hand.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "concerto/ir/ir.h"

namespace concerto::testing {

/// A 4-element f32 tensor, replicated.
inline Tensor T(const std::string& name) { return Tensor{name, {4}, DType::kF32, {{}}, {}, {}}; }

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

/// A program of one role, "spmd", running graph "main" (`streams`,
/// `tensors`, `ops`) on every rank of a mesh of `axes`.
inline Program OneRoleProgram(std::vector<MeshAxis> axes, std::vector<std::string> streams,
                              std::vector<Tensor> tensors, std::vector<Op> ops) {
  Program p;
  p.name = "test";
  p.mesh.axes = std::move(axes);
  Graph g;
  g.name = "main";
  g.streams = std::move(streams);
  g.tensors = std::move(tensors);
  g.ops = std::move(ops);
  p.graphs.push_back(std::move(g));
  Role role{"spmd", "main", {}};
  for (int r = 0; r < p.mesh.NumRanks(); ++r) role.ranks.push_back(r);
  p.roles.push_back(std::move(role));
  return p;
}

}  // namespace concerto::testing
