// FuseCollectives: merges groups of compatible collectives into one op each.
// Semantics of a fused op: flatten every member input, concatenate, run one
// collective, split the result back into the member outputs (in member order).
#include "concerto/ir/graph_order.h"
#include "concerto/schedule/fusion.h"

#include <algorithm>
#include <cassert>
#include <queue>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "concerto/ir/graph_index.h"

namespace concerto {
namespace {

/// "[3, 7, 9]" for error messages.
std::string IdList(const std::vector<int>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

/// True when `a` and `b` can be one collective: same kind, type, reduce op,
/// group and stream.
bool Compatible(const Op& a, const Op& b) {
  return a.kind == b.kind && a.collective == b.collective && a.reduce == b.reduce &&
         a.group.axes == b.group.axes && a.group.ranks == b.group.ranks && a.stream == b.stream;
}

/// Checks one group's shape: at least two distinct existing collectives, all
/// compatible with the first, none already claimed by an earlier group.
Status CheckGroup(const Graph& graph, const GraphIndex& index, const std::vector<int>& group,
                  std::unordered_map<int, int>& claimed, int group_no) {
  const std::string where = "fusion group " + std::to_string(group_no) + " " + IdList(group);
  if (group.size() < 2) return Status::Error(where + ": needs at least 2 ops");
  const Op* first = nullptr;
  for (int id : group) {
    auto it = index.op.find(id);
    if (it == index.op.end()) return Status::Error(where + ": no op with id " + std::to_string(id));
    const Op& op = graph.ops[it->second];
    if (op.kind != OpKind::kCollective)
      return Status::Error(where + ": " + OpLabel(op) + " is a " + std::string(ToString(op.kind)) +
                           ", not a collective");
    if (!claimed.emplace(id, group_no).second)
      return Status::Error(where + ": " + OpLabel(op) + " is already in fusion group " +
                           std::to_string(claimed[id]));
    if (first == nullptr) {
      first = &op;
    } else if (!Compatible(*first, op)) {
      return Status::Error(where + ": " + OpLabel(op) +
                           " differs from " + OpLabel(*first) +
                           " in collective type, reduce op, group or stream");
    }
  }
  return Status::Ok();
}

/// Node of the contracted graph: a group number for members, else
/// groups.size() + op index.
int NodeOf(int op_index, const std::vector<int>& group_of, int n_groups) {
  return group_of[op_index] >= 0 ? group_of[op_index] : n_groups + op_index;
}

/// True when op index `to` reads a tensor that op index `from` produces.
bool DataEdge(const Graph& graph, const GraphIndex& index, int from, int to) {
  for (const auto& name : graph.ops[to].inputs) {
    auto it = index.tensor.find(name);
    if (it != index.tensor.end() && index.producer[it->second] == from) return true;
  }
  return false;
}

/// Looks for a path from one member of `group` to another (the reason a
/// fusion would create a cycle). Fills `from`/`to` with op ids when found. A
/// direct control dep between two members is no such path: fusion drops it.
bool FindMemberPath(const Graph& graph, const GraphIndex& index, const std::vector<int>& group,
                    int& from, int& to) {
  std::set<int> members;
  for (int id : group) members.insert(index.op.at(id));
  for (int start : members) {
    std::vector<char> seen(graph.ops.size(), 0);
    std::vector<int> stack;
    for (int s : index.succs[start])
      if (!members.count(s) || DataEdge(graph, index, start, s)) stack.push_back(s);
    while (!stack.empty()) {
      int v = stack.back();
      stack.pop_back();
      if (seen[v]) continue;
      seen[v] = 1;
      if (members.count(v)) {
        from = graph.ops[start].id;
        to = graph.ops[v].id;
        return true;
      }
      for (int s : index.succs[v]) stack.push_back(s);
    }
  }
  return false;
}

/// Error for group `k` that would close a cycle, naming the member path
/// when one exists (only computed on this error path: it costs a graph walk
/// per member).
Status CycleError(const Graph& graph, const GraphIndex& index,
                  const std::vector<std::vector<int>>& groups, int k) {
  const std::string where = "fusion group " + std::to_string(k) + " " + IdList(groups[k]);
  int from = 0, to = 0;
  if (FindMemberPath(graph, index, groups[k], from, to))
    return Status::Error(where + " would create a cycle: op " + std::to_string(to) +
                         " depends on the output of op " + std::to_string(from));
  return Status::Error(where + " would create a cycle together with another fusion group");
}

/// Rejects the rewrite when contracting every group into one node leaves a
/// cycle (Kahn's algorithm on the contracted graph, O(ops + edges)).
Status CheckAcyclicAfterFusion(const Graph& graph, const GraphIndex& index,
                               const std::vector<std::vector<int>>& groups,
                               const std::vector<int>& group_of) {
  const int n = static_cast<int>(graph.ops.size());
  const int g = static_cast<int>(groups.size());
  std::vector<std::vector<int>> succ(g + n);  // a member has none: it stands in its group node
  for (int i = 0; i < n; ++i) {
    for (int s : index.succs[i]) {
      int a = NodeOf(i, group_of, g), b = NodeOf(s, group_of, g);
      if (a == b) {
        if (DataEdge(graph, index, i, s)) return CycleError(graph, index, groups, a);
        continue;  // a control dep between two members: dropped by the fusion
      }
      succ[a].push_back(b);
    }
  }
  const std::vector<int> order = KahnOrderBy(succ);
  if (order.size() == succ.size()) return Status::Ok();
  std::vector<char> taken(succ.size(), 0);
  for (int v : order) taken[v] = 1;
  int stuck = -1;  // a group left in the cycle; prefer one with a member path
  for (int k = 0; k < g; ++k) {
    if (taken[k]) continue;
    int from = 0, to = 0;
    if (FindMemberPath(graph, index, groups[k], from, to)) return CycleError(graph, index, groups, k);
    if (stuck < 0) stuck = k;
  }
  if (stuck >= 0) return CycleError(graph, index, groups, stuck);
  return Status::Error("fusing the groups would create a cycle");
}

/// Builds the fused op of `members` (ops in member order) with id `id`.
Op MakeFusedOp(const std::vector<const Op*>& members, int id) {
  const Op& first = *members.front();
  const Op& last = *members.back();
  Op fused;
  fused.id = id;
  fused.name = "fused." + first.name + "+" + std::to_string(members.size() - 1);
  fused.kind = first.kind;
  fused.stream = first.stream;
  fused.collective = first.collective;
  fused.reduce = first.reduce;
  fused.group = first.group;
  fused.tags = last.tags;
  std::set<int> member_ids;
  for (const Op* m : members) member_ids.insert(m->id);
  std::set<int> deps_seen;
  for (const Op* m : members) {
    fused.inputs.insert(fused.inputs.end(), m->inputs.begin(), m->inputs.end());
    fused.outputs.insert(fused.outputs.end(), m->outputs.begin(), m->outputs.end());
    fused.message_bytes += m->message_bytes;
    fused.fused_from.push_back(m->id);
    for (int d : m->control_deps)
      if (!member_ids.count(d) && deps_seen.insert(d).second) fused.control_deps.push_back(d);
  }
  // Measured durations are kept, not dropped: when every member has one, the
  // fused op gets their sum (an upper bound: one launch and one latency
  // instead of several); with some unmeasured the cost model prices it whole.
  double sum_us = 0;
  bool all_explicit = true;
  for (const Op* m : members) {
    all_explicit = all_explicit && m->duration_us.has_value();
    if (m->duration_us) sum_us += *m->duration_us;
  }
  if (all_explicit) fused.duration_us = sum_us;
  return fused;
}

/// Replaces control deps on fused members by the fused op id, keeping the
/// first occurrence of each id.
void RedirectControlDeps(Op& op, const std::unordered_map<int, int>& fused_id_of) {
  std::vector<int> deps;
  std::set<int> seen;
  for (int d : op.control_deps) {
    auto it = fused_id_of.find(d);
    int target = it == fused_id_of.end() ? d : it->second;
    if (target != op.id && seen.insert(target).second) deps.push_back(target);
  }
  op.control_deps = std::move(deps);
}

}  // namespace

Result<std::vector<int>> FuseCollectives(Graph& graph, const std::vector<std::vector<int>>& groups) {
  if (groups.empty()) return std::vector<int>{};
  const GraphIndex index = GraphIndex::Build(graph);
  std::unordered_map<int, int> claimed;  // op id -> group number
  for (size_t k = 0; k < groups.size(); ++k)
    CONCERTO_RETURN_IF_ERROR(CheckGroup(graph, index, groups[k], claimed, static_cast<int>(k)));
  const int n = static_cast<int>(graph.ops.size());
  std::vector<int> group_of(n, -1);
  std::vector<int> last_pos(groups.size(), -1);
  for (const auto& [id, k] : claimed) {
    int i = index.op.at(id);
    group_of[i] = k;
    last_pos[k] = std::max(last_pos[k], i);
  }
  CONCERTO_RETURN_IF_ERROR(CheckAcyclicAfterFusion(graph, index, groups, group_of));

  int max_id = 0;
  for (const Op& op : graph.ops) max_id = std::max(max_id, op.id);
  std::vector<int> fused_ids;
  std::vector<Op> fused_ops;
  std::unordered_map<int, int> fused_id_of;  // member id -> fused op id
  for (size_t k = 0; k < groups.size(); ++k) {
    std::vector<const Op*> members;
    for (int id : groups[k]) members.push_back(&graph.ops[index.op.at(id)]);
    fused_ops.push_back(MakeFusedOp(members, max_id + 1 + static_cast<int>(k)));
    fused_ids.push_back(fused_ops.back().id);
    for (int id : groups[k]) fused_id_of[id] = fused_ids.back();
  }
  std::vector<int> group_at(n, -1);  // op index -> group whose fused op goes here
  for (size_t k = 0; k < groups.size(); ++k) group_at[last_pos[k]] = static_cast<int>(k);

  std::vector<Op> ops;
  ops.reserve(n - claimed.size() + groups.size());
  for (int i = 0; i < n; ++i) {
    if (group_at[i] >= 0) ops.push_back(std::move(fused_ops[group_at[i]]));
    else if (group_of[i] < 0) ops.push_back(std::move(graph.ops[i]));
    else continue;
    RedirectControlDeps(ops.back(), fused_id_of);
  }
  graph.ops = std::move(ops);
  return fused_ids;
}

}  // namespace concerto
