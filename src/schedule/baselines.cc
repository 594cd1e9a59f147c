// Baseline dispatcher and the helpers shared by every baseline (see
// baseline_internal.h); the sequential and fifo baselines. The policies
// themselves are described in docs/schedulers.md.
#include <algorithm>
#include <cassert>
#include <map>
#include <queue>
#include <set>
#include <utility>

#include "baseline_internal.h"
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

std::vector<int> PriorityOrder(const GraphIndex& index, const std::vector<LaunchKey>& keys) {
  const int n = static_cast<int>(keys.size());
  using Entry = std::pair<LaunchKey, int>;
  auto later = [](const Entry& a, const Entry& b) {
    if (b.first < a.first) return true;
    if (a.first < b.first) return false;
    return a.second > b.second;
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(later)> ready(later);
  std::vector<int> indegree(n);
  for (int i = 0; i < n; ++i) {
    indegree[i] = static_cast<int>(index.preds[i].size());
    if (indegree[i] == 0) ready.push({keys[i], i});
  }
  std::vector<int> order;
  order.reserve(n);
  while (!ready.empty()) {
    int i = ready.top().second;
    ready.pop();
    order.push_back(i);
    for (int s : index.succs[i])
      if (--indegree[s] == 0) ready.push({keys[s], s});
  }
  assert(static_cast<int>(order.size()) == n && "PriorityOrder on a cyclic graph");
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

/// The class of collectives that may share a bucket, as a sortable string.
static std::string BucketClass(const Op& op, const Graph& graph, const GraphIndex& index) {
  std::string key = std::string(ToString(op.kind)) + "|" + std::string(ToString(op.collective)) +
                    "|" + std::string(ToString(op.reduce)) + "|" + op.stream + "|";
  for (const auto& a : op.group.axes) key += a + ",";
  key += "|";
  for (int r : op.group.ranks) key += std::to_string(r) + ",";
  key += "|";
  if (!op.inputs.empty()) {
    auto it = index.tensor.find(op.inputs.front());
    if (it != index.tensor.end()) key += std::string(ToString(graph.tensors[it->second].dtype));
  }
  return key;
}

std::vector<std::vector<int>> MakeBuckets(const Graph& graph, const GraphIndex& index,
                                          const std::vector<int>& ordered, const BucketRule& rule) {
  struct Open {
    std::vector<int> ids;
    int64_t size = 0;
    int64_t cap = 0;
    int closed = 0;  // buckets of this class closed so far
  };
  std::map<std::string, Open> open;
  std::vector<std::vector<int>> closed;
  auto close = [&](Open& b) {
    closed.push_back(std::move(b.ids));
    b.ids.clear();
    b.size = 0;
    ++b.closed;
  };
  std::map<std::string, int> first_seen;  // class -> sequence number, for the final flush
  for (int i : ordered) {
    const Op& op = graph.ops[i];
    const std::string cls = BucketClass(op, graph, index);
    first_seen.emplace(cls, static_cast<int>(first_seen.size()));
    Open& b = open[cls];
    const int64_t size = rule.size(op);
    if (!rule.close_when_reached && !b.ids.empty() && b.size + size > b.cap) close(b);
    if (b.ids.empty()) b.cap = b.closed == 0 ? rule.first_cap(op) : rule.cap(op);
    b.ids.push_back(op.id);
    b.size += size;
    if (rule.close_when_reached && b.size >= b.cap) close(b);
  }
  // Close the partial buckets at the end, the class seen first first.
  std::vector<std::pair<int, std::string>> rest;
  for (const auto& [cls, b] : open)
    if (!b.ids.empty()) rest.push_back({first_seen[cls], cls});
  std::sort(rest.begin(), rest.end());
  for (const auto& [seq, cls] : rest) close(open[cls]);
  return closed;
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
  plan.sequence = PriorityOrder(index, keys);
  plan.stream = OwnStreams(plan.graph);
  for (size_t i = 0; i < plan.graph.ops.size(); ++i) {
    const Op& op = plan.graph.ops[i];
    if (op.IsComm() && sync && sync(op)) plan.stream[i] = plan.graph.streams.front();
  }
}

Result<GraphPlan> PlanBucketed(const Graph& graph, std::vector<int> ops, const BucketRule& rule,
                               const std::function<bool(const Op&)>& sync) {
  GraphPlan plan{graph, {}, {}, {}};
  {
    const GraphIndex index = GraphIndex::Build(graph);
    Result<std::vector<int>> pos = ProgramPositions(graph, index);
    if (!pos.ok()) return pos.status();
    SortByReadiness(ops, index, *pos);
    Result<std::vector<int>> stand_in =
        FuseBuckets(plan.graph, MakeBuckets(graph, index, ops, rule), plan.fused);
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

/// Every op at its program position, on `stream` when not empty, else its own.
static Result<GraphPlan> PlanProgramOrder(const Graph& graph, bool all_on_first_stream) {
  GraphPlan plan{graph, {}, {}, {}};
  const GraphIndex index = GraphIndex::Build(graph);
  Result<std::vector<int>> pos = ProgramPositions(graph, index);
  if (!pos.ok()) return pos.status();
  std::vector<LaunchKey> keys(graph.ops.size());
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = KeepKey((*pos)[i]);
  FinishPlan(plan, index, keys, nullptr);
  if (all_on_first_stream)
    std::fill(plan.stream.begin(), plan.stream.end(), graph.streams.front());
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

/// True when `plan.sequence` lists every op once, each after its predecessors.
static bool IsLaunchOrder(const GraphPlan& plan) {
  const GraphIndex index = GraphIndex::Build(plan.graph);
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

/// Runs the baseline `name` on one graph.
static Result<GraphPlan> PlanGraph(const std::string& name, const Graph& graph, const Mesh& mesh,
                                   const BaselineOptions& options) {
  if (graph.streams.empty())
    return Status::Error("graph '" + graph.name + "' declares no streams");
  if (name == "sequential") return PlanSequential(graph);
  if (name == "fifo") return PlanFifo(graph);
  if (name == "ddp") return PlanDdp(graph, options);
  if (name == "megatron") return PlanMegatron(graph, mesh, options);
  if (name == "zero") return PlanZero(graph, mesh, options);
  assert(name == "xla-lhs");
  return PlanXlaLhs(graph);
}

}  // namespace baseline

std::vector<std::string> BaselineNames() {
  return {"sequential", "fifo", "ddp", "megatron", "zero", "xla-lhs"};
}

Result<ScheduledProgram> RunBaseline(const std::string& name, const Program& program,
                                     const CostModel& /*cost*/, const BaselineOptions& options) {
  const std::vector<std::string> names = BaselineNames();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    std::string known;
    for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
    return Status::Error("unknown baseline scheduler '" + name + "' (known: " + known + ")");
  }
  ScheduledProgram out{program, {}};
  out.schedule.scheduler = name;
  std::map<std::string, baseline::GraphPlan> plans;  // graph name -> plan, each graph once
  for (const Role& role : program.roles) {
    int g = program.GraphIndex(role.graph);
    if (g < 0) return Status::Error("role '" + role.name + "' names unknown graph '" + role.graph + "'");
    auto it = plans.find(role.graph);
    if (it == plans.end()) {
      Result<baseline::GraphPlan> plan =
          baseline::PlanGraph(name, program.graphs[g], program.mesh, options);
      if (!plan.ok()) return Status::Error(name + ": " + plan.status().message());
      assert(baseline::IsLaunchOrder(*plan) && "baseline produced a non-topological order");
      out.program.graphs[g] = plan->graph;
      it = plans.emplace(role.graph, std::move(*plan)).first;
    }
    out.schedule.roles.push_back(baseline::ToRoleSchedule(it->second, role.name));
    for (const auto& f : it->second.fused)
      out.schedule.fusion_groups.push_back({role.name, f.fused_op, f.members});
  }
  return out;
}

}  // namespace concerto
