// A compute type's sharding rule, as the op registry holds it: the op's
// operand dimensions written as labels (an einsum signature). Operand
// dimensions with the same label must be sharded alike; a label an output
// lacks is contracted (that output is a pending partial sum over the label's
// axes); some labels must stay whole (a norm's hidden dim, attention's
// sequence). The SPMD partitioner (lower/sharding_plan.h) turns a signature
// and its inputs' current shardings into an assignment and the collectives
// that reshard; docs/frontends.md ("Per-op sharding plans") states the rules.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "concerto/ir/ir.h"
#include "concerto/util/status.h"

namespace concerto {

/// How one dimension of a tensor is split over mesh axes. `segments` (global
/// sizes, summing to the dimension) makes it a segmented dimension: each
/// segment is split over `axes` on its own and a rank holds block c of every
/// segment, in order (Megatron's fused QKV weight [q | k | v]).
struct DimSharding {
  std::vector<std::string> axes;
  std::vector<int64_t> segments;
  bool operator==(const DimSharding&) const = default;
};

/// One op's rule: a label per operand dimension, and what the labels allow.
struct ShardingSignature {
  std::vector<std::vector<int>> in, out;  // per operand, per dimension: its label
  int labels = 0;
  std::vector<bool> whole;   // per label: must not be sharded
  std::vector<bool> lookup;  // per label: not part of the iteration space (flops)
  /// How partial inputs may pass through: none; all inputs with the same
  /// partial axes (a sum); at most one (a product); each input to its paired output.
  enum class Linear { kNone, kSame, kOne, kPairwise } linear = Linear::kNone;
  bool contract_max = false;          // reduce_max: contracted labels give a pending max
  bool no_output_partial = false;     // cross_entropy: the loss is this rank's mean
  std::map<int, DimSharding> forced;  // labels fixed before anything else (may share axes)
  std::set<int> renamed;              // labels an output lacks without a sum (slice and concat axes)
  std::map<int, DimSharding> hints;   // for labels no operand or annotation sets
  int head_label = -1;                // attention: heads and kv_heads split by its axes

  /// Per label: its independent group (the input/output pair of a multi-pair
  /// identity or copy); an axis shards at most one label per group.
  std::vector<int> group;
  int current_group = 0;

  int NewLabel(bool is_whole = false) {
    group.push_back(current_group);
    whole.push_back(is_whole);
    lookup.push_back(false);
    return labels++;
  }
};

/// What a rule may ask of the partitioner about the unsharded graph: the
/// global tensor of a name and how an input is sharded now.
class ShardingRuleContext {
 public:
  virtual ~ShardingRuleContext() = default;
  /// The unsharded graph.
  virtual const Graph& graph() const = 0;
  /// The global (unsharded) tensor `name`.
  virtual const Tensor& Global(const std::string& name) const = 0;
  /// Dimension `dim` of input `name`'s current sharding.
  virtual const DimSharding& CurrentDim(const std::string& name, size_t dim) const = 0;
};

/// A compute type's sharding rule: the signature of `op` given its inputs'
/// current shardings, or an error naming what does not fit.
using ShardingSignatureRule = Result<ShardingSignature> (*)(const Op& op, const ShardingRuleContext& ctx);

/// The rule of a copy op (pairwise, every dimension free).
Result<ShardingSignature> CopyShardingSignature(const Op& op, const ShardingRuleContext& ctx);

}  // namespace concerto
