// The cost model: how long an op takes on a given rank. Swappable: the
// simulator and schedulers see only the CostModel interface.
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "concerto/cost/cluster.h"
#include "concerto/ir/graph_index.h"
#include "concerto/ir/ir.h"
#include "concerto/util/status.h"

namespace concerto {

enum class CostSource { kExplicit, kProfile, kAnalytic };
/// "explicit", "profile", "analytic".
std::string_view ToString(CostSource source);

/// Where an op sits: its graph (with an index built once by the caller), the
/// mesh and the global rank that runs it.
struct PriceContext {
  const Graph& graph;
  const GraphIndex& index;
  const Mesh& mesh;
  int rank = 0;
};

/// How a communication op loads the links of a rank that runs it
/// (docs/cost-model.md, "Shared links"). Its duration is `latency_us`, which
/// no sharing slows, plus a transfer part during which it needs `intra` of
/// the rank's intra-node port and `inter` of its NIC share (fractions of each
/// link's capacity, per direction: a collective loads both directions, a send
/// the sender's outgoing and the receiver's incoming direction). All zero for
/// compute ops and for collectives that stay on one device.
struct LinkLoad {
  double latency_us = 0;
  double intra = 0;
  double inter = 0;

  bool Any() const { return intra > 0 || inter > 0; }
};

struct PricedOp {
  PricedOp() = default;
  PricedOp(double duration, CostSource from = CostSource::kAnalytic, LinkLoad link_load = {})
      : duration_us(duration), source(from), load(link_load) {}

  double duration_us = 0;
  CostSource source = CostSource::kAnalytic;
  LinkLoad load;  // communication ops only
};

/// The parts of an alpha-beta communication time: latency, and the transfer
/// time spent on each link class; `parallel` when the two transfers run at
/// once (the slower decides) rather than one after the other.
struct CommTime {
  double latency_us = 0;
  double intra_us = 0;
  double inter_us = 0;
  bool parallel = false;

  double TransferUs() const { return parallel ? std::max(intra_us, inter_us) : intra_us + inter_us; }
  double TotalUs() const { return latency_us + TransferUs(); }
};

class CostModel {
 public:
  virtual ~CostModel() = default;
  /// Duration of `op` when run by ctx.rank.
  /// An op's explicit duration_us always wins (source kExplicit).
  virtual PricedOp Price(const Op& op, const PriceContext& ctx) const = 0;
  /// The cluster this model prices for.
  virtual const ClusterSpec& cluster() const = 0;
};

/// Roofline compute plus alpha-beta collectives (docs/cost-model.md).
class AnalyticCostModel : public CostModel {
 public:
  explicit AnalyticCostModel(ClusterSpec cluster);
  PricedOp Price(const Op& op, const PriceContext& ctx) const override;
  const ClusterSpec& cluster() const override { return cluster_; }

  /// Roofline: max(flops / achieved peak, bytes / achieved bandwidth) + launch.
  double ComputeUs(const Op& op, const PriceContext& ctx) const;
  /// Alpha-beta time of a collective over `group_ranks` moving `bytes` per rank.
  double CollectiveUs(CollectiveType type, int64_t bytes, const std::vector<int>& group_ranks) const {
    return CollectiveTime(type, bytes, group_ranks).TotalUs();
  }
  /// The same, in parts (latency, transfer per link class).
  CommTime CollectiveTime(CollectiveType type, int64_t bytes, const std::vector<int>& group_ranks) const;
  /// a + S/B between two ranks (intra- or inter-node link).
  double SendRecvUs(int64_t bytes, int from_rank, int to_rank) const {
    return SendRecvTime(bytes, from_rank, to_rank).TotalUs();
  }
  CommTime SendRecvTime(int64_t bytes, int from_rank, int to_rank) const;
  /// The fraction of matmul_efficiency a matmul of this shape reaches (1 for
  /// a large GEMM; docs/cost-model.md, "GEMM shapes"): output tiles in waves
  /// over the SMs, tile padding, and the ramp in K. 1 when sm_count is 0.
  double GemmShapeFactor(int64_t batch, int64_t m, int64_t n, int64_t k) const;
  /// The link load of a communication op whose time has these parts and
  /// whose priced duration is `duration_us` (an explicit or profiled time
  /// keeps the analytic shares and latency, capped at the duration).
  LinkLoad LoadOf(const CommTime& t, double duration_us) const;
  /// The analytic time parts of a communication op on ctx.rank.
  CommTime CommTimeOf(const Op& op, const PriceContext& ctx) const;
  /// An attention or attention_grad op (docs/cost-model.md, "Attention"):
  /// fused at attention_efficiency; unfused (attribute fused = 0) as its
  /// batched GEMMs (shape-aware) plus the memory passes over the scores.
  double AttentionUs(const Op& op, const PriceContext& ctx) const;

  /// How a collective group sits on the nodes (its size, the nodes it spans,
  /// the most and fewest of its ranks on one of them): all a collective's
  /// price needs of its ranks.
  struct GroupLayout {
    int ranks = 0;
    int nodes = 0;
    int max_local = 0;
    int min_local = 0;
  };

 private:
  /// The layout of `op`'s group as seen from ctx.rank, remembered per (mesh,
  /// group, rank): listing a group of thousands of ranks for every op priced
  /// dominated whole searches (a dp group of 256 ranks: 25% of a simulation).
  GroupLayout LayoutOf(const Op& op, const PriceContext& ctx) const;
  CommTime CollectiveTimeOf(CollectiveType type, int64_t bytes, const GroupLayout& g) const;

  ClusterSpec cluster_;
  struct LayoutCache;
  std::shared_ptr<LayoutCache> layouts_;  // shared by copies; guarded by its mutex
};

/// The longest duration a profile holds (11.6 days): every reader refuses more, so sums over a
/// step's ops stay finite (docs/cost-model.md, "Profile database").
constexpr double kMaxProfiledUs = 1e12;

/// Measured durations keyed by op signature and device name.
class ProfileDb {
 public:
  /// "matmul|bf16|[8,2048,2048]x[2048,8192]|ta=0,tb=0" style key; collectives
  /// "all_reduce|bf16|bytes=...|n=8|intra". See docs/cost-model.md.
  static std::string Signature(const Op& op, const PriceContext& ctx, const ClusterSpec& cluster);
  /// duration_us must be in [0, kMaxProfiledUs] (an assert: readers check it).
  void Add(const std::string& device, const std::string& signature, double duration_us);
  /// Duration, or negative when absent.
  double Lookup(const std::string& device, const std::string& signature) const;
  size_t size() const { return entries_.size(); }
  /// Every entry, (device, signature) -> duration [us], in key order.
  const std::map<std::pair<std::string, std::string>, double>& entries() const { return entries_; }

  static Result<ProfileDb> Read(const std::string& path);
  /// A database's text (what Read reads from `source`), every entry checked.
  static Result<ProfileDb> Parse(const std::string& text, const std::string& source);
  std::string Write() const;

 private:
  std::map<std::pair<std::string, std::string>, double> entries_;
};

/// Looks ops up in a profile database first, then falls back to the analytic model.
class ProfiledCostModel : public CostModel {
 public:
  ProfiledCostModel(ProfileDb db, ClusterSpec cluster)
      : db_(std::move(db)), analytic_(std::move(cluster)) {}
  PricedOp Price(const Op& op, const PriceContext& ctx) const override;
  const ClusterSpec& cluster() const override { return analytic_.cluster(); }

 private:
  ProfileDb db_;
  AnalyticCostModel analytic_;
};

/// How many ops of a program were priced by each source (one count per op per role).
struct CostReport {
  int explicit_ops = 0;
  int profiled_ops = 0;
  int analytic_ops = 0;
};
CostReport SummarizeCosts(const Program& program, const CostModel& model);

/// Checks that every rank of `mesh` has a device in `cluster` (the cost model
/// maps rank r to node r / devices_per_node); names both sizes when not.
Status CheckMeshFitsCluster(const Mesh& mesh, const ClusterSpec& cluster);

/// How many of a ring's `ranks` send at once (all of them; a broadcast's
/// chain all but the last): on a bus (TopologySpec::intra_link "bus") each
/// gets the medium's bandwidth divided by this.
int RingSenders(CollectiveType type, int ranks);

}  // namespace concerto
