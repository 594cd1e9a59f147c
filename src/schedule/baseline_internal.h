// Shared pieces of the baseline schedulers (private to src/schedule/). Every
// baseline works on one graph at a time and produces a GraphPlan: the graph
// (possibly rewritten), a launch sequence that is a topological order of it,
// and the stream each op is listed on. baselines.cc turns plans into a
// Schedule for every role that runs the graph.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "concerto/ir/graph_index.h"
#include "concerto/ir/ir.h"
#include "concerto/schedule/scheduler.h"
#include "concerto/util/status.h"

namespace concerto::baseline {

/// One fused bucket: the fused op's id and the ids it replaced.
struct FusedBucket {
  int fused_op = 0;
  std::vector<int> members;
};

struct GraphPlan {
  Graph graph;                      // the graph after any rewrite
  std::vector<int> sequence;        // op indices in launch order (topological)
  std::vector<std::string> stream;  // per op index: the stream it is listed on
  std::vector<FusedBucket> fused;
};

/// Per op index: its position in TopologicalOrder (program order when that
/// is already topological). Error when the graph has a cycle.
Result<std::vector<int>> ProgramPositions(const Graph& graph, const GraphIndex& index);

/// A launch priority: smaller runs first among ops whose predecessors are placed.
struct LaunchKey {
  int64_t major = 0;
  int64_t minor = 0;
  bool operator<(const LaunchKey& o) const {
    return major != o.major ? major < o.major : minor < o.minor;
  }
};

/// Kahn's algorithm choosing the smallest (key, index) among ready ops:
/// the topological order closest to `keys`, in which the sends and recvs of
/// each stream keep their topological order (a recv, free of local
/// predecessors, never goes ahead of an earlier send on its stream: that
/// deadlocks a pipeline across ranks). Asserts the graph is acyclic.
std::vector<int> PriorityOrder(const Graph& graph, const GraphIndex& index, const std::vector<LaunchKey>& keys);

/// Key of an op that keeps its program position `pos`.
inline LaunchKey KeepKey(int pos) { return {2 * static_cast<int64_t>(pos), 0}; }
/// Key of an op launched right after the op at program position `pos`
/// (-1: at the very start); `rank` orders ops launched at the same point.
inline LaunchKey AfterKey(int pos, int64_t rank) { return {2 * static_cast<int64_t>(pos) + 1, rank}; }

/// Program position of the latest predecessor of op `i`, or -1.
int LatestPredPos(const GraphIndex& index, const std::vector<int>& pos, int i);

/// Per op index: op.stream (comm ops async on their own stream).
std::vector<std::string> OwnStreams(const Graph& graph);

/// How a bucketing policy measures and closes buckets.
struct BucketRule {
  /// Size of one op in the policy's unit (bytes, elements).
  std::function<int64_t(const Op&)> size;
  /// Cap of the first bucket of each compatible class, and of later ones.
  std::function<int64_t(const Op&)> first_cap;
  std::function<int64_t(const Op&)> cap;
  /// true: a bucket closes once its size reaches the cap (DDP, Megatron).
  /// false: an op that would push the bucket past the cap starts a new one
  /// (DeepSpeed: a bucket never exceeds the cap unless one op alone does).
  bool close_when_reached = true;
};

/// Splits `ordered` (op indices, in the order they become ready; an op must
/// come after every candidate it depends on) into buckets of compatible
/// collectives (same kind, type, reduce op, group, stream and first-input
/// dtype), by `rule`. An op that depends on a member of an open bucket (of
/// any class) first closes that bucket, so fusing the buckets never creates
/// a cycle. `pos`: program positions. Returns op ids per bucket, in the
/// order the buckets close (the partial ones at the end, by class first seen).
std::vector<std::vector<int>> MakeBuckets(const Graph& graph, const GraphIndex& index,
                                          const std::vector<int>& pos,
                                          const std::vector<int>& ordered, const BucketRule& rule);

/// Fuses every bucket with two or more members (FuseCollectives). Returns,
/// per bucket, the id of the op that now stands for it (the fused op, or
/// the single member), and records fused buckets in `fused`.
Result<std::vector<int>> FuseBuckets(Graph& graph, const std::vector<std::vector<int>>& buckets,
                                     std::vector<FusedBucket>& fused);

/// Op indices of collectives with tags.purpose == `purpose` (of any listed
/// collective type), in program order.
std::vector<int> CollectivesWithPurpose(const Graph& graph, const std::string& purpose,
                                        const std::vector<CollectiveType>& types);

/// Sorts `ops` into gradient-ready order: by the program position of the
/// latest predecessor (when the gradient exists), then by own position.
void SortByReadiness(std::vector<int>& ops, const GraphIndex& index, const std::vector<int>& pos);

/// Number of elements in a collective's per-rank payload: message_bytes
/// over the byte width of its first input tensor (1 when unknown).
int64_t MessageElements(const Op& op, const Graph& graph, const GraphIndex& index);

/// Number of ranks in `group` (explicit ranks, or the product of its axes).
int GroupSize(const Mesh& mesh, const Group& group);

/// Buckets `ops` (gradient-ready order is applied here) by `rule`, fuses the
/// buckets, and plans the graph: bucket ops launched right after their latest
/// producer in bucket order, every other op at its program position; comm
/// ops for which `sync` is true listed on the graph's first stream.
/// `graph_index`: graph's index when the caller has it (else built here).
Result<GraphPlan> PlanBucketed(const Graph& graph, std::vector<int> ops, const BucketRule& rule,
                               const std::function<bool(const Op&)>& sync, const GraphIndex* graph_index = nullptr);

/// Launch sequence and streams for `plan.graph` from per-op keys (`index`:
/// plan.graph's); asserts IsLaunchOrder.
void FinishPlan(GraphPlan& plan, const GraphIndex& index, const std::vector<LaunchKey>& keys,
                const std::function<bool(const Op&)>& sync);

/// True when `plan.sequence` lists every op of `plan.graph` once, each after
/// its predecessors (`index`: plan.graph's). Every planner asserts it with
/// the index it already has.
bool IsLaunchOrder(const GraphPlan& plan, const GraphIndex& index);

// The baselines, one graph at a time.
Result<GraphPlan> PlanSequential(const Graph& graph);
Result<GraphPlan> PlanFifo(const Graph& graph);
Result<GraphPlan> PlanDdp(const Graph& graph, const BaselineOptions& options);
/// `tp_overlap`: the graph's tensor-parallel all-gathers and reduce-scatters
/// were chunked with their GEMMs (TransformerEngine's userbuffers overlap):
/// the chunks (ops named "<collective>.c<k>") run async beside the GEMM chunks.
/// `async_p2p`: pipeline sends and recvs async on their peer streams (always so
/// on an interleaved pipeline: Megatron's overlap_p2p_comm).
Result<GraphPlan> PlanMegatron(const Graph& graph, const Mesh& mesh, const BaselineOptions& options,
                               bool tp_overlap = false, bool async_p2p = false);
/// Megatron's policy on a zero-bubble ZB-H1 order (Qi et al., ICLR 2024): on
/// a plain 1F1B pipeline stage r defers each micro-batch's weight-gradient
/// ops (W) until after the input-gradient ops (B) of the micro-batch r later
/// (the last ones to the end), so the previous stage gets its gradient
/// sooner and the W fill the tail; same as megatron on other graphs.
Result<GraphPlan> PlanZeroBubbleH1(const Graph& graph, const Mesh& mesh, const BaselineOptions& options);
/// `overlap_comm`: DeepSpeed's overlap_comm for the gradient buckets: a
/// bucket's reduction is issued on the reduction stream only after the
/// compute stream waited for the previous bucket's (two ipg buffers, one
/// filling while the other reduces).
Result<GraphPlan> PlanZero(const Graph& graph, const Mesh& mesh, const BaselineOptions& options,
                           bool overlap_comm = false);
/// `keep_comm_order`: start comm ops in program order (needed when ranks
/// run different graphs, so that their collective and send/recv orders
/// still match); otherwise comm ops may be reordered.
Result<GraphPlan> PlanXlaLhs(const Graph& graph, bool keep_comm_order);

}  // namespace concerto::baseline
