// The "megatron" baseline: Megatron-LM's overlapped data-parallel gradient
// buckets with synchronous tensor-parallel collectives.
#include <algorithm>
#include <set>
#include <string>

#include "baseline_internal.h"

namespace concerto::baseline {

/// Data-parallel gradient collectives (purpose "grad_sync", all-reduce or
/// reduce-scatter) bucketed by parameter count: a bucket closes once it
/// holds max(options.megatron_bucket_min_params, 1e6 x dp) elements, where
/// dp is the size of the collective's group and elements are message bytes
/// over the byte width of its first input. Buckets run async on the comm
/// stream, launched when full; every other comm op (tensor/sequence parallel
/// activations, pipeline send/recv) is synchronous: listed on the compute
/// stream, except collectives on a group that also carries gradient buckets.
Result<GraphPlan> PlanMegatron(const Graph& graph, const Mesh& mesh, const BaselineOptions& options) {
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
  auto sync = [async_groups](const Op& op) {
    if (op.tags.purpose == "grad_sync") return false;
    return op.kind != OpKind::kCollective || !async_groups.count(GroupSpecKey(op.group));
  };
  return PlanBucketed(graph, std::move(grads), rule, sync, &index);
}

}  // namespace concerto::baseline
