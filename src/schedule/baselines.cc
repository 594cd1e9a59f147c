// Baseline dispatcher and the helpers shared by every baseline (see
// baseline_internal.h); the sequential and fifo baselines. The policies
// themselves are described in docs/schedulers.md.
#include <algorithm>
#include <cassert>
#include <climits>
#include <map>
#include <numeric>
#include <optional>
#include <queue>
#include <set>
#include <unordered_map>
#include <utility>

#include "baseline_internal.h"
#include "concerto/ir/graph_order.h"
#include "concerto/decompose/decompose.h"
#include "concerto/schedule/fusion.h"
#include "concerto/schedule/scheduler.h"

namespace concerto {
namespace baseline {

Result<std::vector<int>> ProgramPositions(const Graph& graph, const GraphIndex& index) {
  std::vector<int> order = TopologicalOrder(graph, index);
  if (order.size() != graph.ops.size())
    return Status::Error("graph '" + graph.name + "' has a dependency cycle");
  std::vector<int> pos(order.size());
  for (size_t p = 0; p < order.size(); ++p) pos[order[p]] = static_cast<int>(p);
  return pos;
}

namespace {

/// `succs` plus an edge from each send or recv to the next one on its stream
/// in `order` (op indices).
std::vector<std::vector<int>> ChainP2p(const Graph& graph, std::vector<std::vector<int>> succs,
                                       const std::vector<int>& order) {
  std::map<std::string, int> last;  // stream -> its last send/recv so far
  for (int i : order) {
    const Op& op = graph.ops[i];
    if (op.kind != OpKind::kSend && op.kind != OpKind::kRecv) continue;
    auto [it, first] = last.emplace(op.stream, i);
    if (!first) succs[it->second].push_back(i), it->second = i;
  }
  return succs;
}

}  // namespace

std::vector<int> PriorityOrder(const Graph& graph, const GraphIndex& index, const std::vector<LaunchKey>& keys) {
  // The sends and recvs of one stream keep the program's order: a recv has
  // no local predecessor, so the keys alone could take it (and the ops after
  // it on its stream) ahead of a send that the peer needs first, and a
  // pipeline would deadlock across ranks. Program order is the ops' order in
  // the graph (a fused collective is appended, but sends and recvs are never
  // fused); should that close a cycle, a topological order's.
  std::vector<int> program(graph.ops.size());
  std::iota(program.begin(), program.end(), 0);
  std::vector<std::vector<int>> succs = ChainP2p(graph, index.succs, program);
  if (KahnOrderBy(succs).size() != graph.ops.size())
    succs = ChainP2p(graph, index.succs, TopologicalOrder(graph, index));
  // The smallest (key, index) among the ready ops first.
  std::vector<int> order = KahnOrderBy(succs, [&keys](int a, int b) {
    if (keys[a] < keys[b]) return true;
    if (keys[b] < keys[a]) return false;
    return a < b;
  });
  assert(order.size() == keys.size() && "PriorityOrder on a cyclic graph");
  return order;
}

int LatestPredPos(const GraphIndex& index, const std::vector<int>& pos, int i) {
  int latest = -1;
  for (int p : index.preds[i]) latest = std::max(latest, pos[p]);
  return latest;
}

std::vector<std::string> OwnStreams(const Graph& graph) {
  std::vector<std::string> streams;
  streams.reserve(graph.ops.size());
  for (const Op& op : graph.ops) streams.push_back(op.stream);
  return streams;
}

std::vector<int> CollectivesWithPurpose(const Graph& graph, const std::string& purpose,
                                        const std::vector<CollectiveType>& types) {
  std::vector<int> out;
  for (int i = 0; i < static_cast<int>(graph.ops.size()); ++i) {
    const Op& op = graph.ops[i];
    if (op.kind != OpKind::kCollective || op.tags.purpose != purpose) continue;
    if (std::find(types.begin(), types.end(), op.collective) != types.end()) out.push_back(i);
  }
  return out;
}

void SortByReadiness(std::vector<int>& ops, const GraphIndex& index, const std::vector<int>& pos) {
  std::vector<std::pair<std::pair<int, int>, int>> keyed;
  keyed.reserve(ops.size());
  for (int i : ops) keyed.push_back({{LatestPredPos(index, pos, i), pos[i]}, i});
  std::sort(keyed.begin(), keyed.end());
  for (size_t k = 0; k < ops.size(); ++k) ops[k] = keyed[k].second;
}

/// Byte width of the first input tensor of `op`, or 1 when it has none.
static int FirstInputWidth(const Op& op, const Graph& graph, const GraphIndex& index) {
  if (op.inputs.empty()) return 1;
  auto it = index.tensor.find(op.inputs.front());
  if (it == index.tensor.end()) return 1;
  return std::max(1, DTypeBytes(graph.tensors[it->second].dtype));
}

int64_t MessageElements(const Op& op, const Graph& graph, const GraphIndex& index) {
  return op.message_bytes / FirstInputWidth(op, graph, index);
}

int GroupSize(const Mesh& mesh, const Group& group) {
  if (!group.ranks.empty()) return static_cast<int>(group.ranks.size());
  int n = 1;
  for (const auto& axis : group.axes) {
    int a = mesh.AxisIndex(axis);
    if (a >= 0) n *= mesh.axes[a].size;
  }
  return n;
}

namespace {

/// The open bucket of one class of compatible collectives.
struct OpenBucket {
  std::vector<int> members;  // op indices
  int64_t size = 0;
  int64_t cap = 0;
  int closed = 0;           // buckets of this class closed so far
  int min_pos = INT_MAX;    // earliest member position
  int min_succ = INT_MAX;   // earliest position of a member's successor
};

/// Most ops one exact dependency search may visit before it gives up and
/// assumes the worst (keeps bucketing O(n log n) on any graph).
constexpr int kSearchBudget = 4096;

/// Splits collectives into buckets, flushing any open bucket that a newcomer
/// depends on, so that no fused op can end up waiting for itself.
class Bucketer {
 public:
  Bucketer(const Graph& graph, const GraphIndex& index, const std::vector<int>& pos,
           const BucketRule& rule)
      : graph_(graph), index_(index), pos_(pos), rule_(rule),
        open_of_(graph.ops.size(), -1), stamp_(graph.ops.size(), 0) {}

  /// Adds op index `i` (arrival order must respect dependencies).
  void Add(int i) {
    const Op& op = graph_.ops[i];
    const int c = ClassId(op);
    for (int d : OpenDependencies(i)) Close(d);
    OpenBucket& b = open_[c];
    const int64_t size = rule_.size(op);
    if (!rule_.close_when_reached && !b.members.empty() && b.size + size > b.cap) Close(c);
    if (b.members.empty()) b.cap = b.closed == 0 ? rule_.first_cap(op) : rule_.cap(op);
    b.members.push_back(i);
    b.size += size;
    b.min_pos = std::min(b.min_pos, pos_[i]);
    for (int s : index_.succs[i]) b.min_succ = std::min(b.min_succ, pos_[s]);
    open_of_[i] = c;
    if (rule_.close_when_reached && b.size >= b.cap) Close(c);
  }

  /// Closes the partial buckets, the class seen first first; returns all
  /// buckets (op ids) in closing order.
  std::vector<std::vector<int>> Finish() {
    for (int c = 0; c < static_cast<int>(open_.size()); ++c)
      if (!open_[c].members.empty()) Close(c);
    return std::move(closed_);
  }

 private:
  /// Dense id of the op's bucket class (same kind, type, reduce, stream,
  /// group and first-input dtype), in order of first appearance.
  int ClassId(const Op& op) {
    std::string key = std::string(ToString(op.kind)) + "|" + std::string(ToString(op.collective)) +
                      "|" + std::string(ToString(op.reduce)) + "|" + op.stream + "|";
    for (const auto& a : op.group.axes) key += a + ",";
    key += "|";
    for (int r : op.group.ranks) key += std::to_string(r) + ",";
    key += "|";
    if (!op.inputs.empty()) {
      auto it = index_.tensor.find(op.inputs.front());
      if (it != index_.tensor.end()) key += std::string(ToString(graph_.tensors[it->second].dtype));
    }
    auto [it, fresh] = class_id_.emplace(key, static_cast<int>(open_.size()));
    if (fresh) open_.emplace_back();
    return it->second;
  }

  void Close(int c) {
    OpenBucket& b = open_[c];
    if (b.members.empty()) return;
    std::vector<int> ids;
    for (int i : b.members) {
      ids.push_back(graph_.ops[i].id);
      open_of_[i] = -1;
    }
    closed_.push_back(std::move(ids));
    b = OpenBucket{{}, 0, 0, b.closed + 1, INT_MAX, INT_MAX};
  }

  /// Classes whose open bucket holds an op that op `i` depends on. A cheap
  /// position test clears most ops; otherwise a bounded backward search
  /// decides, and when it runs out of budget every bucket that might be an
  /// ancestor is reported.
  std::vector<int> OpenDependencies(int i) {
    int floor = INT_MAX, threshold = INT_MAX;
    for (const OpenBucket& b : open_) {
      if (b.members.empty()) continue;
      floor = std::min(floor, b.min_pos);
      threshold = std::min(threshold, b.min_succ);
    }
    const int latest = LatestPredPos(index_, pos_, i);
    if (latest < threshold) return {};
    std::vector<int> hit;
    if (!SearchAncestors(i, floor, hit)) {
      hit.clear();
      for (int c = 0; c < static_cast<int>(open_.size()); ++c)
        if (!open_[c].members.empty() && open_[c].min_succ <= latest) hit.push_back(c);
    }
    std::sort(hit.begin(), hit.end());
    hit.erase(std::unique(hit.begin(), hit.end()), hit.end());
    return hit;
  }

  /// Walks the ancestors of op `i` at positions >= `floor`, recording the
  /// classes of open members met. False when the budget ran out.
  bool SearchAncestors(int i, int floor, std::vector<int>& hit) {
    ++current_stamp_;
    std::vector<int> stack(index_.preds[i].begin(), index_.preds[i].end());
    int visited = 0;
    while (!stack.empty()) {
      int v = stack.back();
      stack.pop_back();
      if (pos_[v] < floor || stamp_[v] == current_stamp_) continue;
      stamp_[v] = current_stamp_;
      if (++visited > kSearchBudget) return false;
      if (open_of_[v] >= 0) hit.push_back(open_of_[v]);
      for (int p : index_.preds[v]) stack.push_back(p);
    }
    return true;
  }

  const Graph& graph_;
  const GraphIndex& index_;
  const std::vector<int>& pos_;
  const BucketRule& rule_;
  std::map<std::string, int> class_id_;
  std::vector<OpenBucket> open_;
  std::vector<int> open_of_;  // per op index: class of its open bucket, or -1
  std::vector<int> stamp_;
  int current_stamp_ = 0;
  std::vector<std::vector<int>> closed_;
};

}  // namespace

std::vector<std::vector<int>> MakeBuckets(const Graph& graph, const GraphIndex& index,
                                          const std::vector<int>& pos,
                                          const std::vector<int>& ordered, const BucketRule& rule) {
  Bucketer bucketer(graph, index, pos, rule);
  for (int i : ordered) bucketer.Add(i);
  return bucketer.Finish();
}

Result<std::vector<int>> FuseBuckets(Graph& graph, const std::vector<std::vector<int>>& buckets,
                                     std::vector<FusedBucket>& fused) {
  std::vector<std::vector<int>> groups;
  std::vector<int> stand_in(buckets.size());
  std::vector<size_t> group_bucket;
  for (size_t b = 0; b < buckets.size(); ++b) {
    assert(!buckets[b].empty());
    stand_in[b] = buckets[b].front();
    if (buckets[b].size() < 2) continue;
    groups.push_back(buckets[b]);
    group_bucket.push_back(b);
  }
  Result<std::vector<int>> ids = FuseCollectives(graph, groups);
  if (!ids.ok()) return ids.status();
  for (size_t g = 0; g < groups.size(); ++g) {
    stand_in[group_bucket[g]] = (*ids)[g];
    fused.push_back({(*ids)[g], groups[g]});
  }
  return stand_in;
}

void FinishPlan(GraphPlan& plan, const GraphIndex& index, const std::vector<LaunchKey>& keys,
                const std::function<bool(const Op&)>& sync) {
  plan.sequence = PriorityOrder(plan.graph, index, keys);
  plan.stream = OwnStreams(plan.graph);
  for (size_t i = 0; i < plan.graph.ops.size(); ++i) {
    const Op& op = plan.graph.ops[i];
    if (op.IsComm() && sync && sync(op)) plan.stream[i] = plan.graph.streams.front();
  }
  assert(IsLaunchOrder(plan, index) && "baseline produced a non-topological order");
}

Result<GraphPlan> PlanBucketed(const Graph& graph, std::vector<int> ops, const BucketRule& rule,
                               const std::function<bool(const Op&)>& sync, const GraphIndex* graph_index) {
  GraphPlan plan{graph, {}, {}, {}};
  {
    std::optional<GraphIndex> built;
    if (!graph_index) graph_index = &built.emplace(GraphIndex::Build(graph));
    const GraphIndex& index = *graph_index;
    Result<std::vector<int>> pos = ProgramPositions(graph, index);
    if (!pos.ok()) return pos.status();
    SortByReadiness(ops, index, *pos);
    Result<std::vector<int>> stand_in =
        FuseBuckets(plan.graph, MakeBuckets(graph, index, *pos, ops, rule), plan.fused);
    if (!stand_in.ok()) return stand_in.status();
    ops = std::move(*stand_in);  // now: one op id per bucket, in bucket order
  }
  const GraphIndex index = GraphIndex::Build(plan.graph);
  Result<std::vector<int>> pos = ProgramPositions(plan.graph, index);
  if (!pos.ok()) return pos.status();
  std::vector<LaunchKey> keys(plan.graph.ops.size());
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = KeepKey((*pos)[i]);
  for (size_t b = 0; b < ops.size(); ++b) {
    int i = index.op.at(ops[b]);
    keys[i] = AfterKey(LatestPredPos(index, *pos, i), static_cast<int64_t>(b));
  }
  FinishPlan(plan, index, keys, sync);
  return plan;
}

/// Every op at its program position; comm ops synchronous (on the graph's
/// first stream) when `sync_comm`, else on their own stream. Other ops keep
/// their stream (only a comm op may change stream).
static Result<GraphPlan> PlanProgramOrder(const Graph& graph, bool sync_comm) {
  GraphPlan plan{graph, {}, {}, {}};
  const GraphIndex index = GraphIndex::Build(graph);
  Result<std::vector<int>> pos = ProgramPositions(graph, index);
  if (!pos.ok()) return pos.status();
  std::vector<LaunchKey> keys(graph.ops.size());
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = KeepKey((*pos)[i]);
  auto sync = [sync_comm](const Op&) { return sync_comm; };
  FinishPlan(plan, index, keys, sync);
  return plan;
}

Result<GraphPlan> PlanSequential(const Graph& graph) { return PlanProgramOrder(graph, true); }

Result<GraphPlan> PlanFifo(const Graph& graph) { return PlanProgramOrder(graph, false); }

/// The per-stream orders of `plan`, one entry per stream of its graph.
static RoleSchedule ToRoleSchedule(const GraphPlan& plan, const std::string& role) {
  RoleSchedule rs;
  rs.role = role;
  std::map<std::string, size_t> slot;
  for (const auto& s : plan.graph.streams) {
    slot.emplace(s, rs.streams.size());
    rs.streams.push_back({s, {}});
  }
  for (int i : plan.sequence) {
    auto it = slot.find(plan.stream[i]);
    assert(it != slot.end() && "op listed on a stream its graph does not declare");
    rs.streams[it->second].op_ids.push_back(plan.graph.ops[i].id);
  }
  return rs;
}

/// True when every control edge of `plan.graph` follows `plan.sequence`
/// (MakeSyncExplicit adds only control edges, so after IsLaunchOrder held
/// this is all that can break; it needs no GraphIndex).
static bool ControlEdgesFollowLaunchOrder(const GraphPlan& plan) {
  std::unordered_map<int, int> at;  // op id -> launch position
  at.reserve(plan.sequence.size());
  for (size_t k = 0; k < plan.sequence.size(); ++k) at.emplace(plan.graph.ops[plan.sequence[k]].id, static_cast<int>(k));
  for (const Op& op : plan.graph.ops)
    for (int dep : op.control_deps)
      if (auto d = at.find(dep); d != at.end() && d->second > at.at(op.id)) return false;
  return true;
}

bool IsLaunchOrder(const GraphPlan& plan, const GraphIndex& index) {
  const size_t n = plan.graph.ops.size();
  if (plan.sequence.size() != n || plan.stream.size() != n) return false;
  std::vector<int> at(n, -1);
  for (size_t k = 0; k < n; ++k) {
    int i = plan.sequence[k];
    if (i < 0 || static_cast<size_t>(i) >= n || at[i] >= 0) return false;
    at[i] = static_cast<int>(k);
  }
  for (size_t i = 0; i < n; ++i)
    for (int p : index.preds[i])
      if (at[p] > at[i]) return false;
  return true;
}

/// Turns each comm op that a plan listed on the graph's first (compute)
/// stream into a synchronous collective expressed as control edges: it stays
/// on its own stream (the link it uses stays busy, so the lower bound holds),
/// waits for the op before it on the compute lane and holds back the op after
/// it. Every edge follows the launch order, so no cycle can form. Returns the
/// number of ops made synchronous.
static int MakeSyncExplicit(GraphPlan& plan) {
  const std::string& lane = plan.graph.streams.front();
  int changed = 0;
  int last = -1;  // op index of the last op on the compute lane
  auto add_dep = [&](int to, int from) {
    auto& deps = plan.graph.ops[to].control_deps;
    const int id = plan.graph.ops[from].id;
    if (std::find(deps.begin(), deps.end(), id) == deps.end()) deps.push_back(id);
  };
  for (int i : plan.sequence) {
    Op& op = plan.graph.ops[i];
    if (plan.stream[i] != lane) continue;
    const bool moved = op.stream != lane;
    if (last >= 0 && (moved || plan.graph.ops[last].stream != lane)) add_dep(i, last);
    if (moved) {
      plan.stream[i] = op.stream;
      ++changed;
    }
    last = i;
  }
  return changed;
}

/// Runs the baseline `name` on one graph; `multi_graph`: the program's
/// roles run more than one distinct graph.
static Result<GraphPlan> PlanGraph(const std::string& name, const Graph& graph, const Mesh& mesh,
                                   const BaselineOptions& options, bool multi_graph) {
  if (graph.streams.empty())
    return Status::Error("graph '" + graph.name + "' declares no streams");
  if (name == "sequential") return PlanSequential(graph);
  if (name == "fifo") return PlanFifo(graph);
  if (name == "ddp") return PlanDdp(graph, options);
  if (name == "megatron") return PlanMegatron(graph, mesh, options);
  if (name == "megatron-tp-overlap") return PlanMegatron(graph, mesh, options, /*tp_overlap=*/true);
  if (name == "zb-h1") return PlanZeroBubbleH1(graph, mesh, options);
  if (name == "zero") return PlanZero(graph, mesh, options);
  if (name == "deepspeed-overlap") return PlanZero(graph, mesh, options, /*overlap_comm=*/true);
  assert(name == "xla-lhs");
  return PlanXlaLhs(graph, multi_graph);
}

}  // namespace baseline

std::vector<std::string> BaselineNames() {
  return {"sequential", "fifo", "ddp", "megatron", "megatron-tp-overlap", "zb-h1", "zero", "deepspeed-overlap",
          "xla-lhs"};
}

Result<ScheduledProgram> RunBaseline(const std::string& name, const Program& program_in,
                                     const CostModel& cost, const BaselineOptions& options) {
  const std::vector<std::string> names = BaselineNames();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    std::string known;
    for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
    return Status::Error("unknown baseline scheduler '" + name + "' (known: " + known + ")");
  }
  // megatron-tp-overlap: TransformerEngine chunks every tensor-parallel
  // all-gather / reduce-scatter with its GEMM into te_overlap_chunks, whatever
  // it costs (a fixed configuration, not a cost-model decision).
  std::optional<Program> chunked;
  if (name == "megatron-tp-overlap") {
    chunked = program_in;
    DecomposeOptions d;
    d.force_chunks = options.te_overlap_chunks;
    d.max_chunks = options.te_overlap_chunks;
    d.gather_scatter_only = true;
    d.force_at_most = true;
    Result<DecomposeReport> r = DecomposeCollectives(*chunked, cost, d);
    if (!r.ok()) return Status::Error(name + ": " + r.status().message());
  }
  const Program& program = chunked ? *chunked : program_in;
  ScheduledProgram out;
  out.schedule.scheduler = name;
  // The program with each planned graph moved in from its plan: the graphs
  // roles run are not copied first only to be overwritten (at 10k ops a
  // graph copy is a sizeable part of a baseline's time).
  out.program.name = program.name;
  out.program.mesh = program.mesh;
  out.program.roles = program.roles;
  out.program.graphs.resize(program.graphs.size());
  struct Planned {
    RoleSchedule orders;  // for any role running the graph (its name set per role)
    std::vector<baseline::FusedBucket> fused;
  };
  std::map<int, Planned> plans;  // graph index -> its plan's orders, each graph once
  std::set<std::string> graphs_used;
  for (const Role& role : program.roles) graphs_used.insert(role.graph);
  const bool multi_graph = graphs_used.size() > 1;
  for (const Role& role : program.roles) {
    int g = program.GraphIndex(role.graph);
    if (g < 0) return Status::Error("role '" + role.name + "' names unknown graph '" + role.graph + "'");
    auto it = plans.find(g);
    if (it == plans.end()) {
      Result<baseline::GraphPlan> plan =
          baseline::PlanGraph(name, program.graphs[g], program.mesh, options, multi_graph);
      if (!plan.ok()) return Status::Error(name + ": " + plan.status().message());
      // Each planner asserted IsLaunchOrder with its own index.
      baseline::MakeSyncExplicit(*plan);
      assert(baseline::ControlEdgesFollowLaunchOrder(*plan) && "synchronous edges broke the launch order");
      Planned planned{baseline::ToRoleSchedule(*plan, role.name), std::move(plan->fused)};
      out.program.graphs[g] = std::move(plan->graph);
      it = plans.emplace(g, std::move(planned)).first;
    }
    RoleSchedule rs = it->second.orders;
    rs.role = role.name;
    out.schedule.roles.push_back(std::move(rs));
    for (const auto& f : it->second.fused)
      out.schedule.fusion_groups.push_back({role.name, f.fused_op, f.members});
  }
  for (size_t g = 0; g < program.graphs.size(); ++g)
    if (!plans.count(static_cast<int>(g))) out.program.graphs[g] = program.graphs[g];  // no role runs it
  return out;
}

const std::vector<OptionRecord<BaselineOptions>>& BaselineOptionRecords() {
  static const std::vector<OptionRecord<BaselineOptions>> records = {
      {"ddp-first-bucket", "MiB", 0.001, 1 << 20, "DDP: size of the first gradient bucket",
       &BaselineOptions::ddp_first_bucket_bytes, 1 << 20},
      {"ddp-bucket", "MiB", 0.001, 1 << 20, "DDP: size of later gradient buckets", &BaselineOptions::ddp_bucket_bytes,
       1 << 20},
      {"megatron-bucket", "parameters", 1, 1e12, "Megatron: minimum gradient bucket (the bucket is max(this, 1e6 x dp))",
       &BaselineOptions::megatron_bucket_min_params},
      {"zero-reduce-bucket", "elements", 1, 1e13, "ZeRO: reduce-scatter bucket size",
       &BaselineOptions::zero_reduce_bucket_elements},
      {"zero-prefetch-bucket", "elements", 1, 1e13, "ZeRO: all-gather prefetch bucket size",
       &BaselineOptions::zero_prefetch_bucket_elements},
      {"te-overlap-chunks", "chunks", 2, 64,
       "megatron-tp-overlap: chunks per all-gather / reduce-scatter and its GEMM (TransformerEngine's num_splits)",
       &BaselineOptions::te_overlap_chunks},
  };
  return records;
}

}  // namespace concerto
