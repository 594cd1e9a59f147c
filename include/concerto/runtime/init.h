// Deterministic initialisation of a program's graph inputs (parameters,
// optimizer state, token ids, labels, positions) from a seed and each
// tensor's GLOBAL identity, so that every parallel plan of a model and its
// unsharded program see the same global values. docs/runtime.md lists the
// keys and value ranges.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "concerto/ir/graph_index.h"
#include "concerto/ir/ir.h"
#include "concerto/util/status.h"

namespace concerto {

/// A dimension whose global tensor is several segments laid side by side,
/// each sharded on its own: rank block c holds block c of every segment, in
/// segment order (Megatron's fused QKV weight: [q | k | v] globally,
/// [q_c | k_c | v_c] on tp rank c). Without it the sharding spec alone says
/// the global tensor is the concatenation of the rank blocks, which is a
/// different layout. Applies to tensors whose key (InitKey) ends with
/// `name_suffix`.
struct SegmentedLayout {
  std::string name_suffix;
  int dim = 0;
  std::vector<int64_t> segments;  // global sizes, in order; they sum to the global dim
};

struct InitOptions {
  uint64_t seed = 20240601;
  /// Logical layouts of fused tensors (applied when initialising and when
  /// gathering shards into global tensors).
  std::vector<SegmentedLayout> layouts;
  /// Values given for graph inputs, by InitKey: the logical global tensor
  /// (row-major, GlobalShape's element count), used instead of generated
  /// values on every rank (each takes its elements). The Python bridge
  /// feeds a PyTorch module's parameters, buffers and data through it.
  std::map<std::string, std::vector<float>> values;
};

/// The global identity a tensor is initialised from: its name without a
/// trailing ".master" and then ".shard" (a ZeRO shard is a slice of the same
/// global tensor; an Adam master copy starts equal to its parameter).
std::string InitKey(const std::string& tensor_name);

/// For every local element of `tensor` on `rank` (row-major), its row-major
/// index in the logical global tensor of shape GlobalShape(tensor, mesh).
/// An error when a layout does not fit the tensor (a segment not divisible
/// by the number of blocks, sizes that do not add up).
Result<std::vector<int64_t>> LogicalGlobalIndices(const Tensor& tensor, const Mesh& mesh, int rank,
                                                  const std::vector<SegmentedLayout>& layouts);

/// Fills graph input `tensor_index` of `graph` (a tensor no op produces) as
/// rank `rank` holds it: NumElements() floats into `out`. Integer tensors
/// are ids in [0, range) with the range read from the ops that consume them
/// (the embedding table's global rows, the logits' global vocabulary), or
/// the global position along the last dim for a tensor keyed "positions";
/// ".adam_m"/".adam_v" optimizer states are 0; ".gamma" is 1 + 0.1 u,
/// ".beta" 0.1 u, every other float input 0.05 u with u uniform in [-1, 1)
/// from (seed, key, logical global index). A key in `options.values` takes
/// its elements from there instead (an error when the sizes differ).
Status FillGraphInput(const Graph& graph, const GraphIndex& index, int tensor_index,
                      const Mesh& mesh, int rank, const InitOptions& options, float* out);

}  // namespace concerto
