// The "megatron" baseline: Megatron-LM's overlapped data-parallel gradient
// buckets with synchronous tensor-parallel collectives.
#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "baseline_internal.h"

namespace concerto::baseline {

/// Data-parallel gradient collectives (purpose "grad_sync", all-reduce or
/// reduce-scatter) bucketed by parameter count: a bucket closes once it
/// holds max(options.megatron_bucket_min_params, 1e6 x dp) elements, where
/// dp is the size of the collective's group and elements are message bytes
/// over the byte width of its first input. Buckets run async on their
/// group's stream, launched when full. Tensor/sequence-parallel collectives
/// of the forward pass are synchronous (Megatron's mappings.py calls them
/// without async_op, so they block the compute stream); those of the
/// backward pass run async on the tp stream, each overlapping the compute
/// that follows until its result is used (LinearWithGradAccumulationAnd-
/// AsyncCommunication issues the input-gradient all-reduce / reduce-scatter
/// and the sequence-parallel all-gather with async_op=True beside the
/// weight-gradient GEMM). Pipeline sends and recvs of the interleaved
/// schedule run async on their peer streams (Megatron's overlap_p2p_comm:
/// isend/irecv issued ahead, waited on where the data is used; the training
/// scripts' default for the interleaved schedule, forced off for the plain
/// one). Every other comm op (plain 1F1B send/recv, expert all-to-all) is
/// synchronous, except collectives on a group that also carries gradient
/// buckets. Sources: docs/schedulers.md, "Streams".
/// Whether `name` is a chunk the decomposition pass made ("<name>.c<k>").
bool IsChunkName(const std::string& name) {
  const size_t dot = name.rfind(".c");
  if (dot == std::string::npos || dot + 2 == name.size()) return false;
  return std::all_of(name.begin() + static_cast<long>(dot) + 2, name.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

/// Whether `graph` is a stage of an interleaved 1F1B pipeline: the decoder
/// frontend names its sends and recvs "pp.chunk<c>.*" then (plain 1F1B: "pp.*").
bool IsInterleavedPipeline(const Graph& graph) {
  return std::any_of(graph.ops.begin(), graph.ops.end(), [](const Op& op) {
    return (op.kind == OpKind::kSend || op.kind == OpKind::kRecv) && op.name.rfind("pp.chunk", 0) == 0;
  });
}

Result<GraphPlan> PlanMegatron(const Graph& graph, const Mesh& mesh, const BaselineOptions& options, bool tp_overlap,
                               bool async_p2p) {
  const GraphIndex index = GraphIndex::Build(graph);
  BucketRule rule;
  rule.size = [&](const Op& op) { return MessageElements(op, graph, index); };
  rule.cap = [&](const Op& op) {
    return std::max<int64_t>(options.megatron_bucket_min_params,
                             int64_t{1000000} * GroupSize(mesh, op.group));
  };
  rule.first_cap = rule.cap;
  rule.close_when_reached = true;
  std::vector<int> grads = CollectivesWithPurpose(
      graph, "grad_sync", {CollectiveType::kAllReduce, CollectiveType::kReduceScatter});
  // A group's collectives must all run on one stream (else ranks may issue
  // them in different orders), so a collective sharing its group with the
  // overlapped gradient buckets (e.g. a distributed optimizer's parameter
  // all-gather over dp) stays async on the comm stream too.
  std::set<std::string> async_groups;
  for (int i : grads) async_groups.insert(GroupSpecKey(graph.ops[i].group));
  const bool overlap_p2p = async_p2p || IsInterleavedPipeline(graph);
  auto sync = [async_groups, tp_overlap, overlap_p2p](const Op& op) {
    if (op.tags.purpose == "grad_sync") return false;
    if (overlap_p2p && (op.kind == OpKind::kSend || op.kind == OpKind::kRecv)) return false;  // overlap_p2p_comm
    if (tp_overlap && op.kind == OpKind::kCollective && op.tags.purpose == "activation" &&
        (op.collective == CollectiveType::kAllGather || op.collective == CollectiveType::kReduceScatter) &&
        IsChunkName(op.name))
      return false;  // userbuffers: chunk k communicates while GEMM chunk k+1 computes
    if (op.kind == OpKind::kCollective && op.tags.phase == Phase::kBackward && op.tags.purpose == "activation" &&
        op.group.axes == std::vector<std::string>{"tp"})
      return false;  // the backward's tensor-parallel collectives overlap the weight-gradient GEMM
    return op.kind != OpKind::kCollective || !async_groups.count(GroupSpecKey(op.group));
  };
  return PlanBucketed(graph, std::move(grads), rule, sync, &index);
}

/// The weight-gradient ops of each micro-batch's backward (ZB's W): compute
/// ops of the backward of micro-batch j whose every output is read only by
/// other W ops of j or by ops outside j's backward (the next micro-batch's
/// gradient accumulation, the optimizer, the gradient reduction). What the
/// previous stage waits for (the input gradient and its send) is B. Marked
/// per op index.
std::vector<char> WeightGradientOps(const Graph& graph, const GraphIndex& index, const std::vector<int>& order) {
  std::vector<char> w(graph.ops.size(), 0);
  auto in_backward_of = [&](const Op& op, int mb) { return op.tags.phase == Phase::kBackward && op.tags.microbatch == mb; };
  for (auto it = order.rbegin(); it != order.rend(); ++it) {  // consumers before producers
    const Op& op = graph.ops[static_cast<size_t>(*it)];
    if (op.kind != OpKind::kCompute || op.tags.phase != Phase::kBackward || op.tags.microbatch < 0 ||
        !op.tags.purpose.empty() || op.outputs.empty())
      continue;
    bool all = true;
    for (const std::string& out : op.outputs) {
      for (int c : index.consumers[static_cast<size_t>(index.tensor.at(out))])
        if (in_backward_of(graph.ops[static_cast<size_t>(c)], op.tags.microbatch) && !w[static_cast<size_t>(c)])
          all = false;
    }
    w[static_cast<size_t>(*it)] = all;
  }
  return w;
}

Result<GraphPlan> PlanZeroBubbleH1(const Graph& graph, const Mesh& mesh, const BaselineOptions& options) {
  const GraphIndex index = GraphIndex::Build(graph);
  Result<std::vector<int>> pos = ProgramPositions(graph, index);
  if (!pos.ok()) return pos.status();
  std::vector<int> order(graph.ops.size());
  for (size_t i = 0; i < order.size(); ++i) order[static_cast<size_t>((*pos)[i])] = static_cast<int>(i);
  // The stage's place in the pipeline, from its 1F1B warm-up: stage r of p
  // runs p - 1 - r forwards before its first backward (one more with the
  // first backward's own forward).
  const int pp_axis = mesh.AxisIndex("pp");
  const int p = pp_axis < 0 ? 1 : mesh.axes[static_cast<size_t>(pp_axis)].size;
  std::set<int> forwards_before;
  for (int i : order) {
    const Op& op = graph.ops[static_cast<size_t>(i)];
    if (op.tags.phase == Phase::kBackward) break;
    if (op.tags.phase == Phase::kForward && op.tags.microbatch >= 0) forwards_before.insert(op.tags.microbatch);
  }
  const int delay = std::max(0, p - static_cast<int>(forwards_before.size()));
  if (p <= 1 || delay == 0 || IsInterleavedPipeline(graph)) return PlanMegatron(graph, mesh, options);
  // W of micro-batch j runs right after the B of micro-batch j + delay (the
  // last ones after the last B), each stage thus keeping p micro-batches'
  // activations at most, as 1F1B's first stage does.
  const std::vector<char> w = WeightGradientOps(graph, index, order);
  std::map<int, int> last_b;  // micro-batch -> program position of its backward's last B op
  int last_b_any = -1;
  for (size_t i = 0; i < graph.ops.size(); ++i) {
    const Op& op = graph.ops[i];
    if (op.tags.phase != Phase::kBackward || op.tags.microbatch < 0 || w[i]) continue;
    last_b[op.tags.microbatch] = std::max(last_b[op.tags.microbatch], (*pos)[i]);
    last_b_any = std::max(last_b_any, (*pos)[i]);
  }
  std::vector<LaunchKey> keys(graph.ops.size());
  for (size_t i = 0; i < graph.ops.size(); ++i) {
    keys[i] = KeepKey((*pos)[i]);
    if (!w[i]) continue;
    auto at = last_b.find(graph.ops[i].tags.microbatch + delay);
    keys[i] = AfterKey(at != last_b.end() ? at->second : last_b_any, (*pos)[i]);
  }
  Graph reordered = graph;
  reordered.ops.clear();
  for (int i : PriorityOrder(graph, index, keys)) reordered.ops.push_back(graph.ops[static_cast<size_t>(i)]);
  // The zero-bubble runtime issues its sends and recvs as batched isend/irecv and waits where the
  // data is used (as Megatron's overlap_p2p_comm does for the interleaved schedule).
  return PlanMegatron(reordered, mesh, options, /*tp_overlap=*/false, /*async_p2p=*/true);
}

}  // namespace concerto::baseline
