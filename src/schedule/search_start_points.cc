// The concerto search's starting points (search_start_points.h).
#include "search_start_points.h"

#include <algorithm>
#include <cassert>
#include <map>
#include <set>
#include <unordered_map>

#include "concerto/ir/graph_index.h"

namespace concerto::search {

/// Drops the control edges a baseline added (synchronous collectives,
/// serialization), keeping those of the input program and those pointing at
/// ops the baseline created (fused buckets). Returns whether any was dropped;
/// with `dry_run` only says so and changes nothing.
bool StripSchedulerEdges(const Program& input, Program& scheduled, bool dry_run) {
  bool dropped = false;
  for (size_t g = 0; g < scheduled.graphs.size(); ++g) {
    const Graph& in = input.graphs[g];
    std::unordered_map<int, const Op*> input_ops;
    for (const Op& op : in.ops) input_ops.emplace(op.id, &op);
    for (Op& op : scheduled.graphs[g].ops) {
      auto it = input_ops.find(op.id);
      if (it == input_ops.end()) continue;
      const auto& original = it->second->control_deps;
      std::vector<int> kept;
      for (int d : op.control_deps)
        if (!input_ops.count(d) || std::find(original.begin(), original.end(), d) != original.end())
          kept.push_back(d);
      dropped = dropped || kept.size() != op.control_deps.size();
      if (dry_run && dropped) return true;
      if (!dry_run) op.control_deps = std::move(kept);
    }
  }
  return dropped;
}

namespace {

/// Where a collective's group sits, for every rank of every role running
/// `graph_name`: true when every member shares the rank's node (NVLink only),
/// false when every member is on a different node (network only: each
/// member's share of its node's NICs, no NVLink), nullopt when ranks disagree
/// or the group mixes both (a hierarchical collective uses NVLink in its
/// intra-node phases, so it would contend with the intra-node collectives).
std::optional<bool> IntraNode(const Program& p, const std::string& graph_name, const Op& op, const ClusterSpec& c) {
  std::optional<bool> intra;
  for (const Role& role : p.roles) {
    if (role.graph != graph_name) continue;
    for (int rank : role.ranks) {
      const std::vector<int> members = GroupRanks(p.mesh, op.group, rank);
      std::set<int> nodes;
      for (int m : members) nodes.insert(c.NodeOf(m));
      bool one_node = nodes.size() == 1;
      bool network_only = nodes.size() == members.size() && members.size() > 1;
      if (!one_node && !network_only) return std::nullopt;
      if (intra && *intra != one_node) return std::nullopt;
      intra = one_node;
    }
  }
  return intra;
}

}  // namespace

/// Moves the collectives whose groups cross nodes off a communication stream
/// that also carries collectives inside a node, onto a new stream
/// "<stream>.inter" when each of their members sits on its own node (they use
/// only the network, which is separate from NVLink, so both kinds can be in
/// flight at once; a group with several members on one node crosses nodes
/// hierarchically and uses NVLink too, so then nothing moves). A graph rewrite: the new stream is
/// declared in the graph and each role's order keeps the moved ops'
/// relative order. Returns how many ops moved.
int SplitInterNodeStreams(ScheduledProgram& sp, const ClusterSpec& cluster) {
  int moved = 0;
  for (Graph& g : sp.program.graphs) {
    std::map<std::string, std::vector<int>> inter, intra;  // stream -> op ids
    std::set<std::string> mixed_groups;
    for (const Op& op : g.ops) {
      if (op.kind != OpKind::kCollective) continue;
      std::optional<bool> in = IntraNode(sp.program, g.name, op, cluster);
      if (!in) return moved;
      (*in ? intra : inter)[op.stream].push_back(op.id);
    }
    for (const auto& [stream, ids] : inter) {
      if (!intra.count(stream)) continue;
      std::string name = stream + ".inter";
      if (std::find(g.streams.begin(), g.streams.end(), name) != g.streams.end()) continue;
      g.streams.push_back(name);
      std::set<int> ids_set(ids.begin(), ids.end());
      for (Op& op : g.ops)
        if (ids_set.count(op.id)) op.stream = name;
      for (const Role& role : sp.program.roles) {
        if (role.graph != g.name) continue;
        for (RoleSchedule& rs : sp.schedule.roles) {
          if (rs.role != role.name) continue;
          StreamOrder split{name, {}};
          for (StreamOrder& so : rs.streams) {
            if (so.stream != stream) continue;
            std::vector<int> kept;
            for (int id : so.op_ids) (ids_set.count(id) ? split.op_ids : kept).push_back(id);
            so.op_ids = std::move(kept);
          }
          rs.streams.push_back(std::move(split));
        }
      }
      moved += static_cast<int>(ids.size());
    }
  }
  return moved;
}

/// The paper's two-stream mapping: every communication op of a graph with
/// several communication streams moves onto one stream "comm", each role's
/// order on it the order in which `t` started them on the role's lowest rank
/// (ties: the old streams' order). Fewer transfers in flight at once share no
/// link and slow compute less, at the price of queueing. A graph rewrite;
/// returns how many ops moved (0: nothing to merge). The result may deadlock
/// across roles (a caller simulates it before keeping it).
int MergeCommStreams(ScheduledProgram& sp, const Timeline& t) {
  int moved = 0;
  const Program& p = sp.program;
  std::map<std::pair<int, int>, double> start;  // (rank, op index) -> start
  for (const OpRecord& r : t.records) start[{r.rank, r.op_index}] = r.start_us;
  for (Graph& g : sp.program.graphs) {
    std::set<std::string> comm;
    for (const Op& op : g.ops)
      if (op.IsComm()) comm.insert(op.stream);
    if (comm.size() < 2) continue;
    std::map<int, int> index_of;  // op id -> index
    for (size_t i = 0; i < g.ops.size(); ++i) index_of[g.ops[i].id] = static_cast<int>(i);
    for (const Role& role : p.roles) {
      if (role.graph != g.name) continue;
      const int rep = *std::min_element(role.ranks.begin(), role.ranks.end());
      for (RoleSchedule& rs : sp.schedule.roles) {
        if (rs.role != role.name) continue;
        std::vector<std::tuple<double, int, int>> keyed;  // (start, position, id)
        std::vector<StreamOrder> kept;
        for (StreamOrder& so : rs.streams) {
          if (!comm.count(so.stream)) {
            kept.push_back(std::move(so));
            continue;
          }
          for (size_t k = 0; k < so.op_ids.size(); ++k) {
            auto it = start.find({rep, index_of.at(so.op_ids[k])});
            keyed.push_back({it == start.end() ? 0.0 : it->second, static_cast<int>(k), so.op_ids[k]});
          }
        }
        std::stable_sort(keyed.begin(), keyed.end());
        StreamOrder merged{"comm", {}};
        for (const auto& [s, k, id] : keyed) merged.op_ids.push_back(id);
        kept.push_back(std::move(merged));
        rs.streams = std::move(kept);
      }
    }
    for (Op& op : g.ops)
      if (op.IsComm()) {
        moved += op.stream != "comm";
        op.stream = "comm";
      }
    std::vector<std::string> streams;
    for (const std::string& s : g.streams)
      if (!comm.count(s) && s != "comm") streams.push_back(s);
    streams.push_back("comm");
    g.streams = std::move(streams);
  }
  return moved;
}

}  // namespace concerto::search
