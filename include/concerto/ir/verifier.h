// The IR verifier: usable on any graph after any pass. Lists every violation.
#pragma once

#include <string>
#include <vector>

#include "concerto/ir/ir.h"
#include "concerto/util/status.h"

namespace concerto {

/// Checks one graph against `mesh`: unique ids and names, known streams,
/// tensors with one producer, references that resolve, no cycle (naming an
/// op on it), valid groups and peers, finite non-negative sizes, shapes that
/// fit each op's semantics. Every violation is one line naming the op.
std::vector<std::string> VerifyGraph(const Graph& graph, const Mesh& mesh);
/// VerifyGraph on every graph, plus mesh, roles and rank coverage checks.
std::vector<std::string> VerifyProgram(const Program& program);
/// VerifyProgram as a Status: ok, or the first violations joined (prefixed with `source`).
Status CheckProgram(const Program& program, const std::string& source);

/// Shape rule of one compute op; empty string when the shapes fit.
std::string CheckComputeShapes(const Op& op, const std::vector<const Tensor*>& inputs,
                               const std::vector<const Tensor*>& outputs);

}  // namespace concerto
