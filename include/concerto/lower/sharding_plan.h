// Per-op sharding plans ("auto-generated parallelism", as an Alpa-style
// auto-parallelizer hands its choice over): a JSON file that names a device
// mesh and assigns a sharding to tensors of the model by glob pattern, and
// the SPMD partitioner that turns the model's UNSHARDED program into the
// per-rank program of that assignment, deriving and inserting every
// resharding collective itself (as XLA's GSPMD does). File syntax, the op
// rules and the resharding table are in docs/frontends.md ("Per-op sharding
// plans").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "concerto/ir/ir.h"
#include "concerto/ir/sharding_signature.h"
#include "concerto/util/status.h"

namespace concerto {

// DimSharding (how one dimension is split over mesh axes) is the IR's: ir/sharding_signature.h.

/// One pattern of the file and the sharding it assigns. `replicated`: the
/// string "replicated", which fits a tensor of any rank; otherwise `dims`
/// has one entry per dimension of every tensor the pattern matches.
struct ShardingRule {
  std::string pattern;  // glob over tensor names: '*' any run of characters, '?' one
  bool replicated = false;
  std::vector<DimSharding> dims;
  bool exact = false;  // pattern is a tensor name, matched as it is (no glob)
  /// Gathered again where each phase reads it (ZeRO-3's parameters; the
  /// input of a sequence-parallel column linear, which Megatron gathers again
  /// for the weight gradient): a reshard made for the forward is not kept
  /// for the backward. Sharding files: "regather": [pattern, ...].
  bool regather = false;
};

/// A parsed sharding file.
struct ShardingPlan {
  std::string source;              // the file name, for messages
  Mesh mesh;                       // axes in file order (last fastest)
  std::vector<ShardingRule> rules;  // in file order; the first match wins
  /// Sequences per step; unset: the model's batch times the sizes of the
  /// axes that shard dim 0 of `tokens` (so {"tokens": [["dp"], []]} with
  /// dp=4 has the global batch of the plan string dp=4).
  std::optional<int64_t> global_batch;
};

/// Parses a sharding file (JSON): {"mesh": {"dp": 2, "tp": 2}, "default":
/// "replicated", "global_batch": N, "tensors": {"<glob>": "replicated" |
/// [dim, ...]}} where a dim is [] (replicated), "axis", ["axis", ...] or
/// {"axes": [...], "segments": [sizes]}. Errors name `source` (with
/// line:column for malformed JSON), the pattern and the field: unknown key,
/// unknown mesh axis, an axis used twice in one tensor, sizes < 1.
Result<ShardingPlan> ParseShardingPlan(const std::string& text, const std::string& source);
/// `plan` as sharding-file JSON text (ParseShardingPlan reads it back; an
/// exact rule's name is written as its pattern).
std::string ShardingPlanJson(const ShardingPlan& plan);
/// Reads and parses a sharding file.
Result<ShardingPlan> LoadShardingPlan(const std::string& path);
/// Ok when the mesh has exactly `world_size` ranks; otherwise an error
/// naming the file, the axis product and the world size.
Status CheckShardingWorld(const ShardingPlan& plan, int world_size);

/// A tensor of the partitioned program with a segmented dimension (the
/// runtime's SegmentedLayout for initialisation and the reference check).
struct SegmentedTensor {
  std::string tensor;
  int dim = 0;
  std::vector<int64_t> segments;  // global sizes
};

/// What the partitioner did.
struct PartitionReport {
  /// Inserted collectives by type name ("all_reduce", ...) and local
  /// slices ("slice"), summed over the graph.
  std::vector<std::pair<std::string, int>> inserted;
  std::vector<SegmentedTensor> segmented;
};

/// Partitions `unsharded` (one graph, one rank, no communication; e.g. a
/// decoder lowered with dp=1,tp=1) under `plan`: walks the ops in program
/// order, applies each compute type's sharding rule (which input shardings
/// it runs on locally, which output sharding and pending partial sum
/// results), rewrites local shapes and size-carrying attributes (attention
/// heads, slice start/len, cross-entropy denominators), and inserts the
/// resharding wherever a producer's sharding differs from what a consumer
/// needs or from the tensor's annotated sharding: all_reduce,
/// reduce_scatter, all_gather, all_to_all, or a local slice. Tensor names
/// keep their global identity. Errors name the file, the op, the tensor and
/// the shardings: a pattern that matches no tensor, a spec whose length is
/// not the tensor's rank, a dimension not divisible by its axes, an
/// op/sharding combination with no rule.
Result<Program> PartitionProgram(const Program& unsharded, const ShardingPlan& plan,
                                 PartitionReport* report = nullptr);

/// Lowers decoder `model` (preset or spec file) unsharded with the plan's
/// global batch (dp=1, tp=1) and partitions it under `plan`.
Result<Program> LowerModelSharding(const std::string& model, const ShardingPlan& plan,
                                   PartitionReport* report = nullptr);

}  // namespace concerto
