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

/// Shape rule of one compute op (or copy op: pairwise same shape and dtype);
/// empty string when the shapes fit, "" for other kinds.
std::string CheckComputeShapes(const Op& op, const std::vector<const Tensor*>& inputs,
                               const std::vector<const Tensor*>& outputs);
/// Shape rule of one collective over `group_size` ranks: at least one input,
/// inputs and outputs pairwise (fused collectives), same dtype per pair;
/// empty string when the shapes fit.
std::string CheckCollectiveShapes(const Op& op, const std::vector<const Tensor*>& inputs,
                                  const std::vector<const Tensor*>& outputs, int group_size);
/// Number of ranks in `group` (product of the axes' sizes, or the explicit
/// ranks); 0 when the group names an unknown axis.
int GroupRankCount(const Mesh& mesh, const Group& group);
/// Mesh problems (empty or duplicate axis names, size < 1, too many ranks);
/// empty when the mesh is usable. Other checks rely on a usable mesh.
std::vector<std::string> VerifyMesh(const Mesh& mesh);
/// The largest mesh the verifier accepts (ranks).
inline constexpr int kMaxMeshRanks = 1 << 20;
/// The most streams a graph declares (schedulers and the simulator keep
/// per-stream state and look streams up by name).
inline constexpr int kMaxStreamsPerGraph = 256;

}  // namespace concerto
