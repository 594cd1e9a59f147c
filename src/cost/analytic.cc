// The analytic cost model: roofline compute and alpha-beta collectives.
// Formulas and their sources: docs/cost-model.md.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <map>
#include <optional>

#include "concerto/cost/cost_model.h"

namespace concerto {
namespace {

/// Microseconds to move `bytes` at `gbps` GB/s (1e9 bytes/s); 0 for no bytes.
double TransferUs(double bytes, double gbps) {
  if (!(bytes > 0)) return 0;
  assert(std::isfinite(gbps) && gbps > 0 && "cluster bandwidth not validated (ValidateCluster)");
  return bytes / (gbps * 1e3);
}

/// Microseconds to execute `flops` at `tflops` TFLOP/s; 0 for no flops.
double FlopsUs(double flops, double tflops) {
  if (!(flops > 0)) return 0;
  assert(std::isfinite(tflops) && tflops > 0 && "device peak not validated (ValidateCluster)");
  return flops / (tflops * 1e6);
}

/// `x` when it is a finite positive amount, else 0 (bad amounts are the verifier's job).
double Amount(double x) { return std::isfinite(x) && x > 0 ? x : 0; }

/// The dtype an op is priced in: its first output tensor's, else its first
/// input's, else bf16.
DType PricingDType(const Op& op, const PriceContext& ctx) {
  auto dtype_of = [&](const std::string& name) -> std::optional<DType> {
    auto it = ctx.index.tensor.find(name);
    if (it == ctx.index.tensor.end() || it->second < 0 ||
        it->second >= static_cast<int>(ctx.graph.tensors.size()))
      return std::nullopt;
    return ctx.graph.tensors[it->second].dtype;
  };
  if (!op.outputs.empty())
    if (auto d = dtype_of(op.outputs.front())) return *d;
  if (!op.inputs.empty())
    if (auto d = dtype_of(op.inputs.front())) return *d;
  return DType::kBF16;
}

/// Dense peak TFLOP/s of `device` in `dtype`; integers are priced as fp32.
double PeakTflops(const DeviceSpec& device, DType dtype) {
  switch (dtype) {
    case DType::kBF16: return device.peak_tflops_bf16;
    case DType::kF16: return device.peak_tflops_fp16;
    case DType::kF32:
    case DType::kI32:
    case DType::kI64: return device.peak_tflops_fp32;
  }
  return device.peak_tflops_fp32;
}

/// Compute types priced at matmul_efficiency (tensor-core kernels).
bool UsesMatmulEfficiency(ComputeType type) {
  return type == ComputeType::kMatmul || type == ComputeType::kAttention ||
         type == ComputeType::kAttentionGrad;
}

/// How a group sits on the cluster's nodes.
struct GroupLayout {
  int ranks = 0;      // group size
  int nodes = 0;      // distinct nodes spanned
  int max_local = 0;  // most group ranks on one node
  int min_local = 0;  // fewest group ranks on a spanned node
};

/// Counts ranks per node for `group_ranks`.
GroupLayout Layout(const ClusterSpec& cluster, const std::vector<int>& group_ranks) {
  std::map<int, int> per_node;
  for (int r : group_ranks) ++per_node[cluster.NodeOf(r)];
  GroupLayout g;
  g.ranks = static_cast<int>(group_ranks.size());
  g.nodes = static_cast<int>(per_node.size());
  g.min_local = per_node.empty() ? 0 : g.ranks;
  for (const auto& [node, count] : per_node) {
    g.max_local = std::max(g.max_local, count);
    g.min_local = std::min(g.min_local, count);
  }
  return g;
}

/// Ring (or, for broadcast, pipelined chain) time of `type` over `n` ranks on
/// `link`, with `bytes` the per-rank input buffer. nccl-tests bus-bandwidth factors.
double RingUs(CollectiveType type, int n, double bytes, const LinkSpec& link) {
  if (n <= 1) return 0;
  const double a = link.latency_us;
  const double steps = n - 1;
  switch (type) {
    case CollectiveType::kAllReduce:
      return 2 * steps * a + TransferUs(2 * steps / n * bytes, link.bandwidth_gbps);
    case CollectiveType::kReduceScatter:
    case CollectiveType::kAllToAll:
      return steps * a + TransferUs(steps / n * bytes, link.bandwidth_gbps);
    case CollectiveType::kAllGather:  // output = n x input; each rank receives n-1 inputs
      return steps * a + TransferUs(steps * bytes, link.bandwidth_gbps);
    case CollectiveType::kBroadcast:
      return steps * a + TransferUs(bytes, link.bandwidth_gbps);
  }
  return 0;
}

/// Tree all-reduce: reduce up and broadcast down a binary tree, pipelined:
/// 2 ceil(log2 n) alpha + 2 S / B.
double TreeAllReduceUs(int n, double bytes, const LinkSpec& link) {
  if (n <= 1) return 0;
  const double depth = std::ceil(std::log2(static_cast<double>(n)));
  return 2 * depth * link.latency_us + TransferUs(2 * bytes, link.bandwidth_gbps);
}

/// Two-level time of `type` for a group spanning several nodes with several
/// ranks on some of them (docs/cost-model.md, "Hierarchical").
double HierarchicalUs(CollectiveType type, const GroupLayout& g, double bytes,
                      const ClusterSpec& cluster) {
  const LinkSpec& intra = cluster.intra_node;
  const LinkSpec& inter = cluster.inter_node;
  const int local = g.max_local;                   // intra phases: the fullest node
  const double shard = bytes / std::max(1, g.min_local);  // inter phase: the largest shard
  switch (type) {
    case CollectiveType::kAllReduce:
      return RingUs(CollectiveType::kReduceScatter, local, bytes, intra) +
             RingUs(CollectiveType::kAllReduce, g.nodes, shard, inter) +
             RingUs(CollectiveType::kAllGather, local, bytes / local, intra);
    case CollectiveType::kReduceScatter:
      return RingUs(CollectiveType::kReduceScatter, local, bytes, intra) +
             RingUs(CollectiveType::kReduceScatter, g.nodes, shard, inter);
    case CollectiveType::kAllGather:
      return RingUs(CollectiveType::kAllGather, g.nodes, bytes, inter) +
             RingUs(CollectiveType::kAllGather, local, bytes * g.nodes, intra);
    case CollectiveType::kAllToAll: {
      // Each rank sends bytes/n to every peer; local and remote peers are
      // served at once over separate links, so the slower part decides.
      const double n = g.ranks;
      const double intra_us =
          (local - 1) * intra.latency_us + TransferUs((local - 1) / n * bytes, intra.bandwidth_gbps);
      const double remote = g.ranks - g.min_local;
      const double inter_us =
          remote * inter.latency_us + TransferUs(remote / n * bytes, inter.bandwidth_gbps);
      return std::max(intra_us, inter_us);
    }
    case CollectiveType::kBroadcast:
      return RingUs(CollectiveType::kBroadcast, g.nodes, bytes, inter) +
             RingUs(CollectiveType::kBroadcast, local, bytes, intra);
  }
  return 0;
}

/// The op's explicit duration when it is usable (finite, non-negative).
std::optional<double> ExplicitUs(const Op& op) {
  if (op.duration_us && std::isfinite(*op.duration_us) && *op.duration_us >= 0)
    return *op.duration_us;
  return std::nullopt;
}

}  // namespace

std::string_view ToString(CostSource source) {
  switch (source) {
    case CostSource::kExplicit: return "explicit";
    case CostSource::kProfile: return "profile";
    case CostSource::kAnalytic: return "analytic";
  }
  return "?";
}

PricedOp AnalyticCostModel::Price(const Op& op, const PriceContext& ctx) const {
  if (auto us = ExplicitUs(op)) return {*us, CostSource::kExplicit};
  double us = 0;
  switch (op.kind) {
    case OpKind::kCompute:
    case OpKind::kCopy:
      us = ComputeUs(op, ctx);
      break;
    case OpKind::kCollective:
      us = CollectiveUs(op.collective, op.message_bytes, GroupRanks(ctx.mesh, op.group, ctx.rank));
      break;
    case OpKind::kSend:
    case OpKind::kRecv:
      us = SendRecvUs(op.message_bytes, ctx.rank, PeerRank(ctx.mesh, op.peer, ctx.rank));
      break;
  }
  assert(std::isfinite(us) && us >= 0 && "analytic duration must be finite and non-negative");
  return {us, CostSource::kAnalytic};
}

double AnalyticCostModel::ComputeUs(const Op& op, const PriceContext& ctx) const {
  const DeviceSpec& d = cluster_.device;
  const double flops = op.kind == OpKind::kCopy ? 0 : Amount(op.flops);
  const double bytes = Amount(op.bytes);
  if (flops == 0 && bytes == 0) return 0;  // no kernel runs (a marker, a view)
  const double eff = UsesMatmulEfficiency(op.compute_type) && op.kind == OpKind::kCompute
                         ? d.matmul_efficiency
                         : d.vector_efficiency;
  const double flops_us = FlopsUs(flops, PeakTflops(d, PricingDType(op, ctx)) * eff);
  const double memory_us = TransferUs(bytes, d.memory_bandwidth_gbps * d.memory_efficiency);
  return std::max(flops_us, memory_us) + d.launch_overhead_us;
}

double AnalyticCostModel::CollectiveUs(CollectiveType type, int64_t bytes,
                                       const std::vector<int>& group_ranks) const {
  const GroupLayout g = Layout(cluster_, group_ranks);
  if (g.ranks <= 1) return cluster_.device.launch_overhead_us;  // a local copy at most
  const double s = static_cast<double>(std::max<int64_t>(bytes, 0));
  const std::string& algo = cluster_.collective_algorithm;
  assert((algo == "auto" || algo == "ring" || algo == "tree" || algo == "hierarchical") &&
         "collective_algorithm not validated (ValidateCluster)");
  const bool one_node = g.nodes == 1;
  const LinkSpec& link = one_node ? cluster_.intra_node : cluster_.inter_node;
  if (algo == "tree" && type == CollectiveType::kAllReduce) return TreeAllReduceUs(g.ranks, s, link);
  if (algo == "ring" || algo == "tree" || one_node || g.max_local == 1)
    return RingUs(type, g.ranks, s, link);
  return HierarchicalUs(type, g, s, cluster_);  // auto, hierarchical
}

double AnalyticCostModel::SendRecvUs(int64_t bytes, int from_rank, int to_rank) const {
  // A peer off the mesh (to_rank < 0) is priced over the slower inter-node link.
  const bool same_node =
      from_rank >= 0 && to_rank >= 0 && cluster_.NodeOf(from_rank) == cluster_.NodeOf(to_rank);
  const LinkSpec& link = same_node ? cluster_.intra_node : cluster_.inter_node;
  return link.latency_us + TransferUs(static_cast<double>(std::max<int64_t>(bytes, 0)),
                                      link.bandwidth_gbps);
}

Status CheckMeshFitsCluster(const Mesh& mesh, const ClusterSpec& cluster) {
  if (mesh.NumRanks() > cluster.NumDevices())
    return Status::Error("mesh has " + std::to_string(mesh.NumRanks()) + " ranks but cluster '" +
                         cluster.name + "' has only " + std::to_string(cluster.NumDevices()) +
                         " devices (" + std::to_string(cluster.nodes) + " nodes x " +
                         std::to_string(cluster.devices_per_node) + ")");
  return Status::Ok();
}

}  // namespace concerto
