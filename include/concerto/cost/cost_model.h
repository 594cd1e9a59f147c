// The cost model: how long an op takes on a given rank. Swappable: the
// simulator and schedulers see only the CostModel interface.
#pragma once

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

struct PricedOp {
  double duration_us = 0;
  CostSource source = CostSource::kAnalytic;
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
  explicit AnalyticCostModel(ClusterSpec cluster) : cluster_(std::move(cluster)) {}
  PricedOp Price(const Op& op, const PriceContext& ctx) const override;
  const ClusterSpec& cluster() const override { return cluster_; }

  /// Roofline: max(flops / achieved peak, bytes / achieved bandwidth) + launch.
  double ComputeUs(const Op& op, const PriceContext& ctx) const;
  /// Alpha-beta time of a collective over `group_ranks` moving `bytes` per rank.
  double CollectiveUs(CollectiveType type, int64_t bytes, const std::vector<int>& group_ranks) const;
  /// a + S/B between two ranks (intra- or inter-node link).
  double SendRecvUs(int64_t bytes, int from_rank, int to_rank) const;

 private:
  ClusterSpec cluster_;
};

/// Measured durations keyed by op signature and device name.
class ProfileDb {
 public:
  /// "matmul|bf16|[8,2048,2048]x[2048,8192]|ta=0,tb=0" style key; collectives
  /// "all_reduce|bf16|bytes=...|n=8|intra". See docs/cost-model.md.
  static std::string Signature(const Op& op, const PriceContext& ctx, const ClusterSpec& cluster);
  void Add(const std::string& device, const std::string& signature, double duration_us);
  /// Duration, or negative when absent.
  double Lookup(const std::string& device, const std::string& signature) const;
  size_t size() const { return entries_.size(); }

  static Result<ProfileDb> Read(const std::string& path);
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

}  // namespace concerto
