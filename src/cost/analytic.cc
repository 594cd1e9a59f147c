// The analytic cost model: roofline compute and alpha-beta collectives.
// Formulas and their sources: docs/cost-model.md.
#include <unordered_map>
#include <mutex>
#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>
#include <map>
#include <optional>

#include "concerto/ir/op_registry.h"
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

/// Compute types priced at matmul_efficiency (tensor-core kernels, op registry).
bool UsesMatmulEfficiency(ComputeType type) { return OpInfo(type).kernel_class == KernelClass::kTensorCore; }

/// How a group sits on the cluster's nodes.
using GroupLayout = AnalyticCostModel::GroupLayout;

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

/// A transfer of `us` microseconds on the intra-node (or inter-node) link.
CommTime OnLink(double latency_us, double us, bool intra) {
  CommTime t;
  t.latency_us = latency_us;
  (intra ? t.intra_us : t.inter_us) = us;
  return t;
}

/// Phases run one after the other.
CommTime Then(const CommTime& a, const CommTime& b) {
  CommTime t;
  t.latency_us = a.latency_us + b.latency_us;
  t.intra_us = a.intra_us + b.intra_us;
  t.inter_us = a.inter_us + b.inter_us;
  assert(!a.parallel && !b.parallel && "only ring phases are chained");
  return t;
}

/// Ring (or, for broadcast, pipelined chain) time of `type` over `n` ranks on
/// `link`, with `bytes` the per-rank input buffer. nccl-tests bus-bandwidth
/// factors. `intra`: which link class `link` is.
CommTime RingTime(CollectiveType type, int n, double bytes, const LinkSpec& link, bool intra) {
  if (n <= 1) return {};
  const double a = link.latency_us;
  const double steps = n - 1;
  switch (type) {
    case CollectiveType::kAllReduce:
      return OnLink(2 * steps * a, TransferUs(2 * steps / n * bytes, link.bandwidth_gbps), intra);
    case CollectiveType::kReduceScatter:
    case CollectiveType::kAllToAll:
      return OnLink(steps * a, TransferUs(steps / n * bytes, link.bandwidth_gbps), intra);
    case CollectiveType::kAllGather:  // output = n x input; each rank receives n-1 inputs
      return OnLink(steps * a, TransferUs(steps * bytes, link.bandwidth_gbps), intra);
    case CollectiveType::kBroadcast:
      return OnLink(steps * a, TransferUs(bytes, link.bandwidth_gbps), intra);
  }
  return {};
}

/// Tree all-reduce: reduce up and broadcast down a binary tree, pipelined:
/// 2 ceil(log2 n) alpha + 2 S / B.
CommTime TreeAllReduceTime(int n, double bytes, const LinkSpec& link, bool intra) {
  if (n <= 1) return {};
  const double depth = std::ceil(std::log2(static_cast<double>(n)));
  return OnLink(2 * depth * link.latency_us, TransferUs(2 * bytes, link.bandwidth_gbps), intra);
}

/// Two-level time of `type` for a group spanning several nodes with several
/// ranks on some of them (docs/cost-model.md, "Hierarchical").
CommTime HierarchicalTime(CollectiveType type, const GroupLayout& g, double bytes,
                          const ClusterSpec& cluster, const LinkSpec& intra) {
  const LinkSpec& inter = cluster.inter_node;
  const int local = g.max_local;                   // intra phases: the fullest node
  const double shard = bytes / std::max(1, g.min_local);  // inter phase: the largest shard
  switch (type) {
    case CollectiveType::kAllReduce:
      return Then(Then(RingTime(CollectiveType::kReduceScatter, local, bytes, intra, true),
                       RingTime(CollectiveType::kAllReduce, g.nodes, shard, inter, false)),
                  RingTime(CollectiveType::kAllGather, local, bytes / local, intra, true));
    case CollectiveType::kReduceScatter:
      return Then(RingTime(CollectiveType::kReduceScatter, local, bytes, intra, true),
                  RingTime(CollectiveType::kReduceScatter, g.nodes, shard, inter, false));
    case CollectiveType::kAllGather:
      return Then(RingTime(CollectiveType::kAllGather, g.nodes, bytes, inter, false),
                  RingTime(CollectiveType::kAllGather, local, bytes * g.nodes, intra, true));
    case CollectiveType::kAllToAll: {
      // Each rank sends bytes/n to every peer; local and remote peers are
      // served at once over separate links, so the slower part decides
      // (latency and transfer of each part: the part with the larger total).
      const double n = g.ranks;
      const double intra_lat = (local - 1) * intra.latency_us;
      const double intra_us = TransferUs((local - 1) / n * bytes, intra.bandwidth_gbps);
      const double remote = g.ranks - g.min_local;
      const double inter_lat = remote * inter.latency_us;
      const double inter_us = TransferUs(remote / n * bytes, inter.bandwidth_gbps);
      CommTime t;
      t.parallel = true;
      const bool inter_decides = inter_lat + inter_us >= intra_lat + intra_us;
      t.latency_us = inter_decides ? inter_lat : intra_lat;
      // The transfer that decides runs the whole transfer time; the other
      // fits beside it (its share of the time is its own transfer's).
      const double total = std::max(intra_lat + intra_us, inter_lat + inter_us);
      t.intra_us = inter_decides ? std::min(intra_us, total - t.latency_us) : total - t.latency_us;
      t.inter_us = inter_decides ? total - t.latency_us : std::min(inter_us, total - t.latency_us);
      return t;
    }
    case CollectiveType::kBroadcast:
      return Then(RingTime(CollectiveType::kBroadcast, g.nodes, bytes, inter, false),
                  RingTime(CollectiveType::kBroadcast, local, bytes, intra, true));
  }
  return {};
}

/// The shape of a matmul as cuBLAS sees it: (batch, m, n, k). A 2-D right
/// operand folds every leading dim of the left one into m. nullopt when a
/// tensor does not resolve or the shapes do not fit together.
std::optional<std::array<int64_t, 4>> GemmShape(const Op& op, const PriceContext& ctx) {
  if (op.inputs.size() < 2 || op.outputs.empty()) return std::nullopt;
  auto tensor = [&](const std::string& name) -> const Tensor* {
    auto it = ctx.index.tensor.find(name);
    if (it == ctx.index.tensor.end() || it->second < 0 ||
        it->second >= static_cast<int>(ctx.graph.tensors.size()))
      return nullptr;
    return &ctx.graph.tensors[it->second];
  };
  const Tensor* a = tensor(op.inputs[0]);
  const Tensor* b = tensor(op.inputs[1]);
  const Tensor* c = tensor(op.outputs[0]);
  if (!a || !b || !c || a->shape.size() < 2 || b->shape.size() < 2 || c->shape.size() < 2) return std::nullopt;
  const bool ta = op.Attr("transpose_a", 0) != 0;
  const int64_t k = ta ? a->shape[a->shape.size() - 2] : a->shape.back();
  const int64_t n = c->shape.back();
  int64_t batch = 1, m = 1;
  for (size_t d = 0; d + 1 < c->shape.size(); ++d) {
    if (b->shape.size() == 2 || d + 2 == c->shape.size()) m *= c->shape[d];
    else batch *= c->shape[d];
  }
  if (batch < 1 || m < 1 || n < 1 || k < 1) return std::nullopt;
  return std::array<int64_t, 4>{batch, m, n, k};
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
  if (auto us = ExplicitUs(op))
    return {*us, CostSource::kExplicit, op.IsComm() ? LoadOf(CommTimeOf(op, ctx), *us) : LinkLoad{}};
  double us = 0;
  switch (op.kind) {
    case OpKind::kCompute:
    case OpKind::kCopy:
      us = ComputeUs(op, ctx);
      break;
    case OpKind::kCollective:
    case OpKind::kSend:
    case OpKind::kRecv: {
      const CommTime t = CommTimeOf(op, ctx);
      us = t.TotalUs();
      assert(std::isfinite(us) && us >= 0 && "analytic duration must be finite and non-negative");
      return {us, CostSource::kAnalytic, LoadOf(t, us)};
    }
  }
  assert(std::isfinite(us) && us >= 0 && "analytic duration must be finite and non-negative");
  return {us, CostSource::kAnalytic, {}};
}

struct AnalyticCostModel::LayoutCache {
  std::mutex mu;
  std::unordered_map<std::string, GroupLayout> layouts;
};

AnalyticCostModel::AnalyticCostModel(ClusterSpec cluster)
    : cluster_(std::move(cluster)), layouts_(std::make_shared<LayoutCache>()) {}

AnalyticCostModel::GroupLayout AnalyticCostModel::LayoutOf(const Op& op, const PriceContext& ctx) const {
  // Keyed by the group (its leader), not by the rank asking: a group of n
  // ranks is enumerated once, not n times (dp=16384 listed 16,384 members for
  // each rank's all-reduce: quadratic in the ranks).
  std::string key;
  for (const MeshAxis& a : ctx.mesh.axes) key += a.name + ":" + std::to_string(a.size) + ",";
  key += "|" + GroupSpecKey(op.group) + "|" + std::to_string(GroupLeader(ctx.mesh, op.group, ctx.rank));
  {
    std::lock_guard<std::mutex> lock(layouts_->mu);
    auto it = layouts_->layouts.find(key);
    if (it != layouts_->layouts.end()) return it->second;
  }
  const GroupLayout g = Layout(cluster_, GroupRanks(ctx.mesh, op.group, ctx.rank));
  std::lock_guard<std::mutex> lock(layouts_->mu);
  layouts_->layouts.emplace(std::move(key), g);
  return g;
}

CommTime AnalyticCostModel::CommTimeOf(const Op& op, const PriceContext& ctx) const {
  if (op.kind == OpKind::kCollective) return CollectiveTimeOf(op.collective, op.message_bytes, LayoutOf(op, ctx));
  assert((op.kind == OpKind::kSend || op.kind == OpKind::kRecv) && "not a communication op");
  return SendRecvTime(op.message_bytes, ctx.rank, PeerRank(ctx.mesh, op.peer, ctx.rank));
}

LinkLoad AnalyticCostModel::LoadOf(const CommTime& t, double duration_us) const {
  LinkLoad load;
  const double transfer = t.TransferUs();
  if (!(transfer > 0) || !(duration_us > 0)) return load;  // latency only: loads no link
  load.latency_us = std::min(t.latency_us, duration_us);
  load.intra = std::min(1.0, t.intra_us / transfer);
  load.inter = std::min(1.0, t.inter_us / transfer);
  if (cluster_.topology.network_crosses_intra_link && load.inter > 0)
    load.intra = std::min(1.0, load.intra + load.inter * cluster_.inter_node.bandwidth_gbps /
                                                cluster_.intra_node.bandwidth_gbps);
  return load;
}

double AnalyticCostModel::GemmShapeFactor(int64_t batch, int64_t m, int64_t n, int64_t k) const {
  const DeviceSpec& d = cluster_.device;
  if (d.sm_count <= 0) return 1;
  // CTA tiles cuBLAS chooses among, with each tile's throughput relative to
  // the largest (smaller tiles reuse each loaded byte less); inferred, see
  // docs/cost-model.md.
  struct Tile {
    int64_t m, n;
    double relative;
  };
  static constexpr Tile kTiles[] = {{256, 128, 1.0}, {128, 256, 1.0}, {128, 128, 0.9}, {128, 64, 0.8}, {64, 64, 0.65}};
  auto raw = [&](double bt, double mm, double nn, double kk) {
    double best = 0;
    for (const Tile& t : kTiles) {
      const double tm = std::ceil(mm / t.m), tn = std::ceil(nn / t.n);
      const double tiles = bt * tm * tn;
      const double waves = std::ceil(tiles / d.sm_count);
      const double wave_eff = tiles / (waves * d.sm_count);
      const double pad_eff = (mm * nn) / (tm * t.m * tn * t.n);
      best = std::max(best, t.relative * wave_eff * pad_eff);
    }
    return best * kk / (kk + d.gemm_ramp_k);
  };
  // Normalised so that the large square GEMM matmul_efficiency was measured on is 1.
  static constexpr double kRef = 8192;
  const double f = raw(static_cast<double>(batch), static_cast<double>(m), static_cast<double>(n),
                       static_cast<double>(k)) /
                   raw(1, kRef, kRef, kRef);
  return std::clamp(f, 1e-3, 1.0);
}

double AnalyticCostModel::AttentionUs(const Op& op, const PriceContext& ctx) const {
  const DeviceSpec& d = cluster_.device;
  const bool grad = op.compute_type == ComputeType::kAttentionGrad;
  const double flops = Amount(op.flops);
  const double peak = PeakTflops(d, PricingDType(op, ctx));
  const double memory_gbps = d.memory_bandwidth_gbps * d.memory_efficiency;
  // q: the first input of attention, the second of attention_grad ([b, s, heads * d]).
  const size_t q_at = grad ? 1 : 0;
  const Tensor* q = nullptr;
  if (op.inputs.size() > q_at)
    if (auto it = ctx.index.tensor.find(op.inputs[q_at]); it != ctx.index.tensor.end() && it->second >= 0 &&
                                                          it->second < static_cast<int>(ctx.graph.tensors.size()))
      q = &ctx.graph.tensors[it->second];
  const double heads = op.Attr("heads", 1);
  if (op.Attr("fused", 1) != 0 || !q || q->shape.size() != 3 || heads < 1) {
    // A fused kernel skips the score blocks a causal mask removes: half the
    // flops the op counts (FlashAttention's benchmark counts them so, and
    // attention_efficiency is measured with that count).
    const double run_flops = op.Attr("causal", 0) != 0 ? 0.5 * flops : flops;
    const double eff = d.attention_efficiency > 0 ? d.attention_efficiency : d.matmul_efficiency;
    return std::max(FlopsUs(run_flops, peak * eff), TransferUs(Amount(op.bytes), memory_gbps)) +
           d.launch_overhead_us;
  }
  // Unfused (Megatron before FlashAttention): the forward runs scores = Q K^T
  // (per head: s x s, depth d) and P V (s x d, depth s) as batched GEMMs around
  // a fused scale-mask-softmax and a dropout over the materialised scores; the
  // backward runs four GEMMs (dV, dP, dQ, dK) around the dropout and softmax
  // gradients. Passes over the b * heads * s^2 scores, in elements (a 1-byte
  // dropout mask is half of one): forward scores write 1, softmax 2, dropout
  // 2.5, P V read 1 = 6.5; backward dP write 1, dropout 2.5, softmax 3, dS read
  // twice 2, P read once 1 = 9.5.
  const int64_t b = q->shape[0], s = q->shape[1];
  const int64_t hd = std::max<int64_t>(1, q->shape[2] / static_cast<int64_t>(heads));
  const int64_t batch = b * static_cast<int64_t>(heads);
  const double scores = static_cast<double>(batch) * static_cast<double>(s) * static_cast<double>(s);
  const double elem = DTypeBytes(q->dtype);
  const double gemm_peak = peak * d.matmul_efficiency;
  auto gemm_us = [&](int64_t m, int64_t n, int64_t k) {
    const double f = 2.0 * static_cast<double>(batch) * static_cast<double>(m) * static_cast<double>(n) *
                     static_cast<double>(k);
    return FlopsUs(f, gemm_peak * GemmShapeFactor(batch, m, n, k)) + d.launch_overhead_us;
  };
  double us = 0;
  if (!grad) {
    us = gemm_us(s, s, hd) + gemm_us(s, hd, s) + TransferUs(6.5 * scores * elem, memory_gbps) + 2 * d.launch_overhead_us;
  } else {
    us = gemm_us(s, hd, s) + gemm_us(s, s, hd) + gemm_us(s, hd, s) + gemm_us(s, hd, s) +
         TransferUs(9.5 * scores * elem, memory_gbps) + 2 * d.launch_overhead_us;
  }
  return us;
}

double AnalyticCostModel::ComputeUs(const Op& op, const PriceContext& ctx) const {
  const DeviceSpec& d = cluster_.device;
  if (op.kind == OpKind::kCompute &&
      (op.compute_type == ComputeType::kAttention || op.compute_type == ComputeType::kAttentionGrad))
    return AttentionUs(op, ctx);
  const double flops = op.kind == OpKind::kCopy ? 0 : Amount(op.flops);
  const double bytes = Amount(op.bytes);
  if (flops == 0 && bytes == 0) return 0;  // no kernel runs (a marker, a view)
  double eff = UsesMatmulEfficiency(op.compute_type) && op.kind == OpKind::kCompute
                   ? d.matmul_efficiency
                   : d.vector_efficiency;
  if (op.kind == OpKind::kCompute && op.compute_type == ComputeType::kMatmul)
    if (auto s = GemmShape(op, ctx)) eff *= GemmShapeFactor((*s)[0], (*s)[1], (*s)[2], (*s)[3]);
  const double flops_us = FlopsUs(flops, PeakTflops(d, PricingDType(op, ctx)) * eff);
  const double memory_us = TransferUs(bytes, d.memory_bandwidth_gbps * d.memory_efficiency);
  return std::max(flops_us, memory_us) + d.launch_overhead_us;
}

CommTime AnalyticCostModel::CollectiveTime(CollectiveType type, int64_t bytes,
                                           const std::vector<int>& group_ranks) const {
  return CollectiveTimeOf(type, bytes, Layout(cluster_, group_ranks));
}

CommTime AnalyticCostModel::CollectiveTimeOf(CollectiveType type, int64_t bytes, const GroupLayout& g) const {
  if (g.ranks <= 1) return {cluster_.device.launch_overhead_us, 0, 0, false};  // a local copy at most
  const double s = static_cast<double>(std::max<int64_t>(bytes, 0));
  const std::string& algo = cluster_.collective_algorithm;
  assert((algo == "auto" || algo == "ring" || algo == "tree" || algo == "hierarchical") &&
         "collective_algorithm not validated (ValidateCluster)");
  const bool one_node = g.nodes == 1;
  // A bus: the group's ranks on one node send at once through the node's one
  // medium, each at its share.
  LinkSpec intra = cluster_.intra_node;
  if (cluster_.topology.IsBus()) intra.bandwidth_gbps /= RingSenders(type, g.max_local);
  LinkSpec link = one_node ? intra : cluster_.inter_node;
  if (!one_node && cluster_.topology.IsBus() && g.max_local > 1)
    link.bandwidth_gbps = std::min(link.bandwidth_gbps, intra.bandwidth_gbps);  // a ring's hops inside a node
  if (algo == "tree" && type == CollectiveType::kAllReduce) return TreeAllReduceTime(g.ranks, s, link, one_node);
  if (one_node && type == CollectiveType::kAllReduce && algo == "auto" && cluster_.topology.nvls_algbw_gbps > 0) {
    // NVLS: the switch reduces; each rank sends and receives the buffer once
    // at the NVLS algorithm bandwidth. NCCL picks it when it is faster.
    const CommTime ring = RingTime(type, g.ranks, s, link, true);
    const CommTime nvls = OnLink(ring.latency_us, TransferUs(s, cluster_.topology.nvls_algbw_gbps), true);
    return nvls.TotalUs() < ring.TotalUs() ? nvls : ring;
  }
  if (algo == "ring" || algo == "tree" || one_node || g.max_local == 1) return RingTime(type, g.ranks, s, link, one_node);
  return HierarchicalTime(type, g, s, cluster_, intra);  // auto, hierarchical
}

CommTime AnalyticCostModel::SendRecvTime(int64_t bytes, int from_rank, int to_rank) const {
  // A peer off the mesh (to_rank < 0) is priced over the slower inter-node link.
  const bool same_node =
      from_rank >= 0 && to_rank >= 0 && cluster_.NodeOf(from_rank) == cluster_.NodeOf(to_rank);
  const LinkSpec& link = same_node ? cluster_.intra_node : cluster_.inter_node;
  return OnLink(link.latency_us, TransferUs(static_cast<double>(std::max<int64_t>(bytes, 0)), link.bandwidth_gbps),
                same_node);
}

int RingSenders(CollectiveType type, int ranks) {
  return std::max(1, type == CollectiveType::kBroadcast ? ranks - 1 : ranks);
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
