// The "ddp" baseline: PyTorch DistributedDataParallel's gradient bucketing.
#include "baseline_internal.h"

namespace concerto::baseline {

/// Gradient all-reduces (purpose "grad_sync") bucketed by bytes in
/// gradient-ready order: the first bucket closes at options.ddp_first_bucket_bytes,
/// later ones at options.ddp_bucket_bytes, the last partial one at the end.
/// Each bucket is one fused all-reduce launched on its comm stream right
/// after its last gradient is produced; everything else as fifo.
Result<GraphPlan> PlanDdp(const Graph& graph, const BaselineOptions& options) {
  BucketRule rule;
  rule.size = [](const Op& op) { return op.message_bytes; };
  rule.first_cap = [&](const Op&) { return options.ddp_first_bucket_bytes; };
  rule.cap = [&](const Op&) { return options.ddp_bucket_bytes; };
  rule.close_when_reached = true;
  std::vector<int> grads =
      CollectivesWithPurpose(graph, "grad_sync", {CollectiveType::kAllReduce});
  return PlanBucketed(graph, std::move(grads), rule, nullptr);
}

}  // namespace concerto::baseline
