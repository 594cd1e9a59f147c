#include "concerto/schedule/schedule.h"
#include "concerto/ir/json_io.h"
#include "concerto/util/input_file.h"
#include "concerto/util/json_text.h"

#include <algorithm>
#include <cassert>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unordered_map>

#include "concerto/ir/graph_index.h"
#include "concerto/ir/graph_order.h"

namespace concerto {

using nlohmann::json;

const RoleSchedule* Schedule::ForRole(const std::string& role) const {
  for (const auto& r : roles)
    if (r.role == role) return &r;
  return nullptr;
}

Schedule ProgramOrderSchedule(const Program& program, const std::string& scheduler_name) {
  Schedule s;
  s.scheduler = scheduler_name;
  for (const auto& role : program.roles) {
    const Graph& g = program.GraphOf(role);
    RoleSchedule rs;
    rs.role = role.name;
    for (const auto& stream : g.streams) rs.streams.push_back({stream, {}});
    std::unordered_map<std::string, size_t> slot;
    for (size_t i = 0; i < g.streams.size(); ++i) slot[g.streams[i]] = i;
    for (const auto& op : g.ops) {
      auto it = slot.find(op.stream);
      assert(it != slot.end() && "op on a stream the graph does not declare");
      rs.streams[it->second].op_ids.push_back(op.id);
    }
    s.roles.push_back(std::move(rs));
  }
  return s;
}

std::string WriteSchedule(const Schedule& schedule) {
  json j;
  j["format"] = "concerto-schedule";
  j["version"] = 1;
  j["scheduler"] = schedule.scheduler;
  j["roles"] = json::array();
  for (const auto& r : schedule.roles) {
    json jr;
    jr["role"] = r.role;
    jr["streams"] = json::array();
    for (const auto& s : r.streams) jr["streams"].push_back({{"stream", s.stream}, {"ops", s.op_ids}});
    j["roles"].push_back(std::move(jr));
  }
  j["fusion_groups"] = json::array();
  for (const auto& f : schedule.fusion_groups)
    j["fusion_groups"].push_back({{"role", f.role}, {"fused_op", f.fused_op}, {"members", f.members}});
  return DumpJson(j, 1) + "\n";
}

namespace {

/// Reads `key` of object `j` as T, or fails naming `where` and the field.
template <typename T>
Status Field(const json& j, const char* key, const std::string& where, T* out) {
  if (!j.is_object() || !j.contains(key)) return Status::Error(where + ": missing field '" + key + "'");
  try {
    *out = j.at(key).get<T>();
  } catch (const json::exception&) {
    return Status::Error(where + ": field '" + key + "' has the wrong type");
  }
  return Status::Ok();
}

/// A JSON number that is a whole number in int's range (an op id): 1.5,
/// 4294967297 or "3" are errors, not silently truncated.
Status IntValue(const json& v, const std::string& what, int* out) {
  if (!v.is_number_integer() ||
      (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int>::max())
                              : v.get<int64_t>() < std::numeric_limits<int>::min() ||
                                    v.get<int64_t>() > std::numeric_limits<int>::max()))
    return Status::Error(what + " must be a whole number in [" + std::to_string(std::numeric_limits<int>::min()) +
                         ", " + std::to_string(std::numeric_limits<int>::max()) + "], got " + DescribeJson(v));
  *out = static_cast<int>(v.get<int64_t>());
  return Status::Ok();
}

template <>
Status Field<int>(const json& j, const char* key, const std::string& where, int* out) {
  if (!j.is_object() || !j.contains(key)) return Status::Error(where + ": missing field '" + key + "'");
  return IntValue(j.at(key), where + ": field '" + key + "'", out);
}

template <>
Status Field<std::vector<int>>(const json& j, const char* key, const std::string& where, std::vector<int>* out) {
  if (!j.is_object() || !j.contains(key)) return Status::Error(where + ": missing field '" + key + "'");
  const json& v = j.at(key);
  if (!v.is_array())
    return Status::Error(where + ": field '" + key + "' must be a list of op ids, got " + DescribeJson(v));
  out->clear();
  for (size_t i = 0; i < v.size(); ++i) {
    int x = 0;
    CONCERTO_RETURN_IF_ERROR(IntValue(v[i], where + ": field '" + key + "'[" + std::to_string(i) + "]", &x));
    out->push_back(x);
  }
  return Status::Ok();
}

}  // namespace

Result<Schedule> ParseSchedule(const std::string& text, const std::string& source) {
  Result<json> parsed = ParseJsonDocument<json>(text, source);
  if (!parsed.ok()) return parsed.status();
  const json& j = *parsed;
  Schedule s;
  std::string format;
  CONCERTO_RETURN_IF_ERROR(Field(j, "format", source, &format));
  if (format != "concerto-schedule")
    return Status::Error(source + ": field 'format': expected 'concerto-schedule', got '" + format + "'");
  CONCERTO_RETURN_IF_ERROR(Field(j, "scheduler", source, &s.scheduler));
  if (!j.contains("roles") || !j["roles"].is_array())
    return Status::Error(source + ": missing field 'roles' (an array)");
  for (size_t i = 0; i < j["roles"].size(); ++i) {
    const json& jr = j["roles"][i];
    std::string where = source + ": roles[" + std::to_string(i) + "]";
    RoleSchedule rs;
    CONCERTO_RETURN_IF_ERROR(Field(jr, "role", where, &rs.role));
    if (!jr.contains("streams") || !jr["streams"].is_array())
      return Status::Error(where + ": missing field 'streams' (an array)");
    for (size_t k = 0; k < jr["streams"].size(); ++k) {
      std::string w2 = where + ".streams[" + std::to_string(k) + "]";
      StreamOrder so;
      CONCERTO_RETURN_IF_ERROR(Field(jr["streams"][k], "stream", w2, &so.stream));
      CONCERTO_RETURN_IF_ERROR(Field(jr["streams"][k], "ops", w2, &so.op_ids));
      rs.streams.push_back(std::move(so));
    }
    s.roles.push_back(std::move(rs));
  }
  if (j.contains("fusion_groups")) {
    if (!j["fusion_groups"].is_array())
      return Status::Error(source + ": field 'fusion_groups' must be a list, got " + DescribeJson(j["fusion_groups"]));
    for (size_t i = 0; i < j["fusion_groups"].size(); ++i) {
      const json& jf = j["fusion_groups"][i];
      std::string where = source + ": fusion_groups[" + std::to_string(i) + "]";
      FusionGroup f;
      CONCERTO_RETURN_IF_ERROR(Field(jf, "role", where, &f.role));
      CONCERTO_RETURN_IF_ERROR(Field(jf, "fused_op", where, &f.fused_op));
      CONCERTO_RETURN_IF_ERROR(Field(jf, "members", where, &f.members));
      s.fusion_groups.push_back(std::move(f));
    }
  }
  return s;
}

Result<Schedule> ReadScheduleFile(const std::string& path) {
  Result<std::string> text = ReadInputFile(path, "schedule file", kMaxLargeInputBytes);
  if (!text.ok()) return text.status();
  return ParseSchedule(*text, path);
}

namespace {

/// Per-role facts the checks below share.
struct RoleView {
  const Role* role;
  const Graph* graph;
  const GraphIndex* index;     // of *graph
  std::vector<int> stream_of;  // per op index: index into graph->streams, or -1
  std::vector<int> position;   // per op index: position on its stream
  std::vector<std::vector<int>> orders;  // per stream: op indices
};

std::string GroupKey(const std::vector<int>& ranks) {
  std::string k;
  for (int r : ranks) k += std::to_string(r) + ",";
  return k;
}

/// Checks membership: every op once, known streams, legal stream choice.
void CheckMembership(const RoleSchedule& rs, RoleView& v, std::vector<std::string>& out) {
  const Graph& g = *v.graph;
  const std::string where = "role '" + rs.role + "'";
  v.stream_of.assign(g.ops.size(), -1);
  v.position.assign(g.ops.size(), -1);
  v.orders.assign(g.streams.size(), {});
  for (const auto& so : rs.streams) {
    auto sit = std::find(g.streams.begin(), g.streams.end(), so.stream);
    if (sit == g.streams.end()) {
      out.push_back(where + ": unknown stream '" + so.stream + "' (graph '" + g.name + "')");
      continue;
    }
    int s = static_cast<int>(sit - g.streams.begin());
    for (int id : so.op_ids) {
      auto it = v.index->op.find(id);
      if (it == v.index->op.end()) {
        out.push_back(where + ": stream '" + so.stream + "' lists unknown op id " + std::to_string(id));
        continue;
      }
      int i = it->second;
      const Op& op = g.ops[i];
      if (v.stream_of[i] >= 0) {
        out.push_back(where + ": " + OpLabel(op) + " is listed twice");
        continue;
      }
      if (so.stream != op.stream) {
        out.push_back(where + ": " + OpLabel(op) + " belongs on stream '" + op.stream +
                      "', not '" + so.stream + "'");
      }
      v.stream_of[i] = s;
      v.position[i] = static_cast<int>(v.orders[s].size());
      v.orders[s].push_back(i);
    }
  }
  for (size_t i = 0; i < g.ops.size(); ++i)
    if (v.stream_of[i] < 0) out.push_back(where + ": " + OpLabel(g.ops[i]) + " is missing from the schedule");
}

/// A dependency listed later on the same stream, then any cycle through
/// dependencies and stream order (a deadlock inside one rank).
void CheckOrder(const RoleView& v, const std::string& where, std::vector<std::string>& out) {
  const Graph& g = *v.graph;
  const int n = static_cast<int>(g.ops.size());
  size_t before = out.size();
  for (int i = 0; i < n; ++i) {
    for (int p : v.index->preds[i]) {
      if (v.stream_of[p] == v.stream_of[i] && v.stream_of[i] >= 0 && v.position[p] > v.position[i])
        out.push_back(where + ": " + OpLabel(g.ops[i]) + " runs before its dependency " +
                      OpLabel(g.ops[p]) + " on stream '" + g.streams[v.stream_of[i]] + "'");
    }
  }
  if (out.size() != before) return;
  // The ASAP walk over data/control edges plus stream order: an op it
  // never starts waits in a cycle.
  const AsapResult<int> asap = AsapStarts(
      n, [&](int i, auto&& fn) { for (int s : v.index->succs[i]) fn(s); }, StreamSuccessors(n, v.orders), {},
      std::vector<int>(n, 0));
  if (asap.complete()) return;
  for (int i = 0; i < n; ++i) {
    if (!asap.started[i]) {
      out.push_back(where + ": deadlock: " + OpLabel(g.ops[i]) + " waits in a cycle of dependencies and stream order (" +
                    std::to_string(n - asap.count) + " ops stuck)");
      break;
    }
  }
}

/// One collective or p2p op as issued by one rank.
struct Issued {
  int role;
  int op_index;
  int stream;
};

}  // namespace

std::vector<std::string> VerifySchedule(const Program& program, const Schedule& schedule) {
  std::vector<GraphIndex> indexes(program.graphs.size());
  std::vector<char> built(program.graphs.size(), 0);
  for (const Role& role : program.roles) {
    const int g = program.GraphIndex(role.graph);
    if (g >= 0 && !built[g]) indexes[g] = GraphIndex::Build(program.graphs[g]), built[g] = 1;
  }
  return VerifySchedule(program, schedule, indexes);
}

std::vector<std::string> VerifySchedule(const Program& program, const Schedule& schedule,
                                        const std::vector<GraphIndex>& indexes) {
  assert(indexes.size() == program.graphs.size() && "one index per graph");
  std::vector<std::string> out;
  std::vector<RoleView> views;
  for (const auto& rs : schedule.roles) {
    bool known = std::any_of(program.roles.begin(), program.roles.end(),
                             [&](const Role& r) { return r.name == rs.role; });
    if (!known) out.push_back("schedule names unknown role '" + rs.role + "'");
  }
  for (const auto& role : program.roles) {
    const RoleSchedule* rs = schedule.ForRole(role.name);
    if (!rs) {
      out.push_back("role '" + role.name + "' has no schedule");
      continue;
    }
    RoleView v;
    v.role = &role;
    v.graph = &program.GraphOf(role);
    v.index = &indexes[v.graph - program.graphs.data()];
    CheckMembership(*rs, v, out);
    CheckOrder(v, "role '" + role.name + "'", out);
    views.push_back(std::move(v));
  }
  if (!out.empty()) return out;

  // Collective issue order per (group, rank) and send/recv order per (src, dst, tag).
  std::vector<int> role_of_rank(program.mesh.NumRanks(), -1);
  for (size_t r = 0; r < program.roles.size(); ++r)
    for (int rank : program.roles[r].ranks)
      if (rank >= 0 && rank < program.mesh.NumRanks()) role_of_rank[rank] = static_cast<int>(r);
  std::map<std::string, std::map<int, std::vector<Issued>>> by_group;
  std::map<std::tuple<int, int, int>, std::vector<Issued>> sends, recvs;
  std::map<std::tuple<int, int, int>, std::set<int>> p2p_streams, recv_streams;
  for (size_t vr = 0; vr < views.size(); ++vr) {
    const RoleView& v = views[vr];
    const Graph& g = *v.graph;
    const int role_index = program.RoleOfRank(v.role->ranks.empty() ? -1 : v.role->ranks[0]);
    // Distinct group specs of this graph, so each is resolved once per rank.
    std::map<std::string, int> spec_id;
    std::vector<int> spec_of(g.ops.size(), -1);
    std::vector<const Group*> specs;
    for (size_t i = 0; i < g.ops.size(); ++i) {
      if (g.ops[i].kind != OpKind::kCollective) continue;
      auto [it, inserted] = spec_id.emplace(GroupSpecKey(g.ops[i].group), static_cast<int>(specs.size()));
      if (inserted) specs.push_back(&g.ops[i].group);
      spec_of[i] = it->second;
    }
    // Per (spec, group leader): whether the group reaches other roles, and its
    // key; each group's members are listed once, not once per member.
    std::map<std::pair<size_t, int>, std::pair<bool, std::string>> groups;
    for (int rank : v.role->ranks) {
      // Groups that stay inside this role see the same schedule on every
      // member, so only groups reaching other roles are recorded.
      std::vector<std::string> crossing(specs.size());
      for (size_t k = 0; k < specs.size(); ++k) {
        auto [at, fresh] = groups.try_emplace({k, GroupLeader(program.mesh, *specs[k], rank)});
        if (fresh) {
          const std::vector<int> members = GroupRanks(program.mesh, *specs[k], rank);
          at->second.first = std::any_of(members.begin(), members.end(), [&](int m) {
            return m < 0 || m >= static_cast<int>(role_of_rank.size()) || role_of_rank[m] != role_index;
          });
          at->second.second = GroupKey(members);
        }
        if (at->second.first || rank == v.role->ranks[0]) crossing[k] = at->second.second;
      }
      for (int s = 0; s < static_cast<int>(v.orders.size()); ++s) {
        for (int i : v.orders[s]) {
          const Op& op = g.ops[i];
          if (op.kind == OpKind::kCollective) {
            const std::string& key = crossing[spec_of[i]];
            if (!key.empty()) by_group[key][rank].push_back({static_cast<int>(vr), i, s});
          } else if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv) {
            int peer = PeerRank(program.mesh, op.peer, rank);
            if (op.kind == OpKind::kSend) {
              sends[{rank, peer, op.tag}].push_back({static_cast<int>(vr), i, s});
              p2p_streams[{rank, peer, op.tag}].insert(s);
            } else {
              recvs[{peer, rank, op.tag}].push_back({static_cast<int>(vr), i, s});
              recv_streams[{peer, rank, op.tag}].insert(s);
            }
          }
        }
      }
    }
  }
  auto op_of = [&](const Issued& x) -> const Op& { return views[x.role].graph->ops[x.op_index]; };
  for (const auto& [key, per_rank] : by_group) {
    // Within a rank: one group on two streams has no fixed issue order.
    for (const auto& [rank, seq] : per_rank) {
      std::set<int> streams;
      for (const auto& x : seq) streams.insert(x.stream);
      if (streams.size() > 1) {
        out.push_back("rank " + std::to_string(rank) + ": collectives on group {" + key +
                      "} are issued on " + std::to_string(streams.size()) +
                      " streams, so their order is not fixed (first: " + OpLabel(op_of(seq[0])) + ")");
        break;
      }
    }
    // Across ranks: the k-th collective must match.
    const auto& [rank0, seq0] = *per_rank.begin();
    for (const auto& [rank, seq] : per_rank) {
      size_t n = std::min(seq.size(), seq0.size());
      for (size_t k = 0; k < n; ++k) {
        const Op& a = op_of(seq0[k]);
        const Op& b = op_of(seq[k]);
        if (a.collective != b.collective || a.message_bytes != b.message_bytes) {
          out.push_back("collective order differs on group {" + key + "}: rank " +
                        std::to_string(rank0) + " issues " + OpLabel(a) + " (" +
                        std::string(ToString(a.collective)) + ") where rank " + std::to_string(rank) +
                        " issues " + OpLabel(b) + " (" + std::string(ToString(b.collective)) +
                        "); a real run would hang");
          break;
        }
        if (a.name != b.name) {
          // Same type and size, different ops: a real run would combine
          // different tensors. A collective's name is its identity across
          // ranks (docs/ir.md, "Collective identity").
          out.push_back("collectives on group {" + key + "} do not match: rank " + std::to_string(rank0) +
                        " issues " + OpLabel(a) + " as its collective " + std::to_string(k + 1) + " where rank " +
                        std::to_string(rank) + " issues " + OpLabel(b) +
                        "; collectives that meet must carry the same name, or a real run would combine different "
                        "tensors");
          break;
        }
      }
      if (seq.size() != seq0.size())
        out.push_back("group {" + key + "}: rank " + std::to_string(rank0) + " issues " +
                      std::to_string(seq0.size()) + " collectives but rank " + std::to_string(rank) +
                      " issues " + std::to_string(seq.size()));
    }
  }
  for (const auto& [key, streams] : p2p_streams)
    if (streams.size() > 1)
      out.push_back("rank " + std::to_string(std::get<0>(key)) + ": sends to rank " +
                    std::to_string(std::get<1>(key)) + " with tag " + std::to_string(std::get<2>(key)) +
                    " are issued on several streams, so their order is not fixed");
  for (const auto& [key, streams] : recv_streams)
    if (streams.size() > 1)
      out.push_back("rank " + std::to_string(std::get<1>(key)) + ": recvs from rank " +
                    std::to_string(std::get<0>(key)) + " with tag " + std::to_string(std::get<2>(key)) +
                    " are issued on several streams, so their order is not fixed");
  // The position of each issued op among its key's ops in program order.
  auto program_ranks = [](const std::vector<Issued>& issued) {
    std::vector<int> sorted;
    for (const Issued& x : issued) sorted.push_back(x.op_index);
    std::sort(sorted.begin(), sorted.end());
    std::vector<int> ranks;
    for (const Issued& x : issued)
      ranks.push_back(static_cast<int>(std::lower_bound(sorted.begin(), sorted.end(), x.op_index) - sorted.begin()));
    return ranks;
  };
  std::set<std::tuple<int, int, int>> keys;
  for (const auto& [k, _] : sends) keys.insert(k);
  for (const auto& [k, _] : recvs) keys.insert(k);
  for (const auto& k : keys) {
    size_t ns = sends.count(k) ? sends[k].size() : 0;
    size_t nr = recvs.count(k) ? recvs[k].size() : 0;
    if (ns == nr && ns > 0) {
      // The k-th send issued meets the k-th recv issued; the program pairs
      // the k-th send in program order with the k-th recv in program order.
      // Both ends must therefore permute their ops alike, or data would go
      // to the wrong op (a wrong answer, not a hang).
      const std::vector<int> s_ranks = program_ranks(sends[k]);
      const std::vector<int> r_ranks = program_ranks(recvs[k]);
      for (size_t m = 0; m < ns; ++m) {
        if (s_ranks[m] == r_ranks[m]) continue;
        out.push_back("send/recv order differs: rank " + std::to_string(std::get<0>(k)) + " issues " +
                      OpLabel(op_of(sends[k][m])) + " (its send #" + std::to_string(s_ranks[m]) +
                      " to rank " + std::to_string(std::get<1>(k)) + ", tag " + std::to_string(std::get<2>(k)) +
                      ", in program order) as message " + std::to_string(m) + ", which rank " +
                      std::to_string(std::get<1>(k)) + " receives in " + OpLabel(op_of(recvs[k][m])) +
                      " (its recv #" + std::to_string(r_ranks[m]) + "); the data would reach the wrong op");
        break;
      }
    }
    if (ns != nr) {
      const Issued& x = ns > nr ? sends[k][nr] : recvs[k][ns];
      out.push_back("unmatched " + std::string(ns > nr ? "send" : "recv") + " " + OpLabel(op_of(x)) +
                    ": rank " + std::to_string(std::get<0>(k)) + " sends " + std::to_string(ns) +
                    " messages to rank " + std::to_string(std::get<1>(k)) + " (tag " +
                    std::to_string(std::get<2>(k)) + ") and it receives " + std::to_string(nr));
    }
  }
  return out;
}

}  // namespace concerto
