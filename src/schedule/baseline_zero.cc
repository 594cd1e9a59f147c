// The "zero" baseline: DeepSpeed ZeRO's bucketed gradient reduce-scatter and
// bucketed parameter all-gather prefetch with a bounded window.
#include <algorithm>
#include <climits>
#include <utility>

#include "baseline_internal.h"

namespace concerto::baseline {
namespace {

/// Gradient collectives ZeRO reduces: grad_sync reduce-scatters, or the
/// grad_sync all-reduces when the graph has no reduce-scatter (ZeRO-1 style).
std::vector<int> GradientOps(const Graph& graph) {
  std::vector<int> ops =
      CollectivesWithPurpose(graph, "grad_sync", {CollectiveType::kReduceScatter});
  if (ops.empty()) ops = CollectivesWithPurpose(graph, "grad_sync", {CollectiveType::kAllReduce});
  return ops;
}

/// Program position of the first op reading an output of op `i`, or -1.
int FirstUsePos(const Graph& graph, const GraphIndex& index, const std::vector<int>& pos, int i) {
  int first = INT_MAX;
  for (const auto& name : graph.ops[i].outputs) {
    auto it = index.tensor.find(name);
    if (it == index.tensor.end()) continue;
    for (int c : index.consumers[it->second]) first = std::min(first, pos[c]);
  }
  return first == INT_MAX ? -1 : first;
}

/// Sorts parameter gathers into order of use: by their first consumer's
/// position (own position when nothing reads them), then own position.
void SortByUse(std::vector<int>& ops, const Graph& graph, const GraphIndex& index,
               const std::vector<int>& pos) {
  std::vector<std::pair<std::pair<int, int>, int>> keyed;
  for (int i : ops) {
    int use = FirstUsePos(graph, index, pos, i);
    keyed.push_back({{use < 0 ? pos[i] : use, pos[i]}, i});
  }
  std::sort(keyed.begin(), keyed.end());
  for (size_t k = 0; k < ops.size(); ++k) ops[k] = keyed[k].second;
}

/// Program position of the earliest successor (data or control) of op `i`,
/// or INT_MAX when it has none.
int EarliestSuccPos(const GraphIndex& index, const std::vector<int>& pos, int i) {
  int first = INT_MAX;
  for (int s : index.succs[i]) first = std::min(first, pos[s]);
  return first;
}

/// The prefetch window: bucket k+1 (k >= 1) gets a control dep on the first
/// consumer of bucket k-1, so at most two gather buckets run ahead of the
/// compute that uses them. `buckets` are op ids in order of use. A dep is
/// skipped when that consumer is not strictly before every successor of
/// bucket k+1 (it could depend on the bucket: adding it might close a cycle).
/// `index` and `pos` (ProgramPositions) are those of `graph` as given.
void AddPrefetchWindow(Graph& graph, const std::vector<int>& buckets, const GraphIndex& index,
                       const std::vector<int>& pos) {
  std::vector<int> order(pos.size());
  for (size_t i = 0; i < pos.size(); ++i) order[pos[i]] = static_cast<int>(i);
  std::vector<std::pair<int, int>> deps;  // (op index of bucket, op id it waits for)
  for (size_t k = 1; k + 1 < buckets.size(); ++k) {
    int prev = index.op.at(buckets[k - 1]);
    int next = index.op.at(buckets[k + 1]);
    int use = FirstUsePos(graph, index, pos, prev);
    if (use < 0 || use >= EarliestSuccPos(index, pos, next)) continue;
    deps.push_back({next, graph.ops[order[use]].id});
  }
  for (const auto& [i, id] : deps) {
    auto& cd = graph.ops[i].control_deps;
    if (std::find(cd.begin(), cd.end(), id) == cd.end()) cd.push_back(id);
  }
}

/// DeepSpeed's overlap_comm (stage_1_and_2.py, average_tensor): before a
/// bucket's reduction is issued on the reduction stream, the compute stream
/// waits for that stream, i.e. for the previous bucket's reduction, so one
/// bucket reduces while the next fills its (second) ipg buffer. For bucket
/// k >= 1 (`buckets`: op ids in closing order), the first compute op after
/// bucket k's latest producer waits for bucket k-1. Each edge points forward
/// in a topological order, so no cycle forms. Returns the edges added.
int AddDoubleBuffer(Graph& graph, const std::vector<int>& buckets) {
  const GraphIndex index = GraphIndex::Build(graph);
  const std::vector<int> pos = *ProgramPositions(graph, index);
  std::vector<int> order(pos.size());
  for (size_t i = 0; i < pos.size(); ++i) order[pos[i]] = static_cast<int>(i);
  std::vector<std::pair<int, int>> deps;  // (op index, op id it waits for)
  for (size_t k = 1; k < buckets.size(); ++k) {
    const int prev = index.op.at(buckets[k - 1]);
    const int launch = LatestPredPos(index, pos, index.op.at(buckets[k]));
    if (LatestPredPos(index, pos, prev) > launch) continue;
    for (int q = launch + 1; q < static_cast<int>(order.size()); ++q) {
      const Op& op = graph.ops[order[q]];
      if (op.IsComm()) continue;
      deps.push_back({order[q], graph.ops[prev].id});
      break;
    }
  }
  int added = 0;
  for (const auto& [i, id] : deps) {
    auto& cd = graph.ops[i].control_deps;
    if (std::find(cd.begin(), cd.end(), id) == cd.end()) cd.push_back(id), ++added;
  }
  return added;
}

}  // namespace

/// Gradients: bucketed in gradient-ready order up to
/// options.zero_reduce_bucket_elements (a bucket never exceeds it unless one
/// gradient alone does), launched async when full. Parameter gathers
/// (purpose "param_gather" all-gathers): bucketed in order of use up to
/// options.zero_prefetch_bucket_elements full-parameter elements (message
/// elements x group size), launched as early as their inputs and the
/// prefetch window (AddPrefetchWindow) allow. Other ops as fifo.
Result<GraphPlan> PlanZero(const Graph& graph, const Mesh& mesh, const BaselineOptions& options, bool overlap_comm) {
  GraphPlan plan{graph, {}, {}, {}};
  std::vector<int> grad_ids, param_ids;  // stand-in op id per bucket
  {
    const GraphIndex index = GraphIndex::Build(graph);
    Result<std::vector<int>> pos = ProgramPositions(graph, index);
    if (!pos.ok()) return pos.status();
    std::vector<int> grads = GradientOps(graph);
    SortByReadiness(grads, index, *pos);
    std::vector<int> params =
        CollectivesWithPurpose(graph, "param_gather", {CollectiveType::kAllGather});
    SortByUse(params, graph, index, *pos);
    BucketRule reduce_rule;
    reduce_rule.size = [&](const Op& op) { return MessageElements(op, graph, index); };
    reduce_rule.cap = [&](const Op&) { return options.zero_reduce_bucket_elements; };
    reduce_rule.first_cap = reduce_rule.cap;
    reduce_rule.close_when_reached = false;
    BucketRule gather_rule = reduce_rule;
    gather_rule.size = [&](const Op& op) {
      return MessageElements(op, graph, index) * GroupSize(mesh, op.group);
    };
    gather_rule.cap = [&](const Op&) { return options.zero_prefetch_bucket_elements; };
    gather_rule.first_cap = gather_rule.cap;
    std::vector<std::vector<int>> buckets = MakeBuckets(graph, index, *pos, grads, reduce_rule);
    const size_t n_grad = buckets.size();
    for (auto& b : MakeBuckets(graph, index, *pos, params, gather_rule)) buckets.push_back(std::move(b));
    Result<std::vector<int>> stand_in = FuseBuckets(plan.graph, buckets, plan.fused);
    if (!stand_in.ok()) return stand_in.status();
    grad_ids.assign(stand_in->begin(), stand_in->begin() + n_grad);
    param_ids.assign(stand_in->begin() + n_grad, stand_in->end());
  }
  {
    const GraphIndex index = GraphIndex::Build(plan.graph);
    std::vector<int> pos = *ProgramPositions(plan.graph, index);
    std::vector<int> idx;
    for (int id : param_ids) idx.push_back(index.op.at(id));
    SortByUse(idx, plan.graph, index, pos);
    for (size_t k = 0; k < idx.size(); ++k) param_ids[k] = plan.graph.ops[idx[k]].id;
    AddPrefetchWindow(plan.graph, param_ids, index, pos);  // the graph as indexed: only control deps change
  }
  if (overlap_comm) AddDoubleBuffer(plan.graph, grad_ids);
  const GraphIndex index = GraphIndex::Build(plan.graph);
  std::vector<int> pos = *ProgramPositions(plan.graph, index);
  std::vector<LaunchKey> keys(plan.graph.ops.size());
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = KeepKey(pos[i]);
  int64_t rank = 0;
  for (const auto* ids : {&grad_ids, &param_ids})
    for (int id : *ids) {
      int i = index.op.at(id);
      keys[i] = AfterKey(LatestPredPos(index, pos, i), rank++);
    }
  FinishPlan(plan, index, keys, nullptr);
  return plan;
}

}  // namespace concerto::baseline
