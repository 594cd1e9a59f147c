// Derived lookups over a Graph: op and tensor by name/id, producers,
// consumers, predecessors. Build once after the graph stops changing.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "concerto/ir/ir.h"

namespace concerto {

struct GraphIndex {
  /// name -> index in graph.tensors. The keys view `names` (not the graph),
  /// so the index stays valid when the graph moves or changes.
  std::unordered_map<std::string_view, int> tensor;
  std::unordered_map<int, int> op;              // id -> index in graph.ops
  std::vector<int> producer;                    // per tensor: op index, or -1 (a graph input)
  std::vector<std::vector<int>> consumers;      // per tensor: op indices
  std::vector<std::vector<int>> preds;          // per op: op indices (data + control), unique
  std::vector<std::vector<int>> succs;          // per op: op indices, unique
  /// Every tensor name, back to back, in one allocation (copies of the
  /// index share it): one string per tensor cost an allocation each.
  std::shared_ptr<const std::string> names;

  /// Assumes references resolve (run after the reader or VerifyGraph); a
  /// dangling reference is skipped, not indexed.
  static GraphIndex Build(const Graph& graph);
};

/// Kahn's algorithm over adjacency lists, smallest ready index first
/// (deterministic; KahnOrderBy of graph_order.h). Shorter than preds.size()
/// when there is a cycle.
std::vector<int> KahnOrder(const std::vector<std::vector<int>>& preds, const std::vector<std::vector<int>>& succs);

/// Op indices in a topological order that keeps program order where it can
/// (KahnOrder over the graph's edges). Shorter than ops.size() if cyclic.
std::vector<int> TopologicalOrder(const Graph& graph, const GraphIndex& index);

}  // namespace concerto
