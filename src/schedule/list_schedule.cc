// The joined graph of every role's representative and the critical-path list
// schedule over it (see the header).
#include "concerto/schedule/list_schedule.h"

#include <algorithm>
#include <cassert>
#include <limits>
#include <map>
#include <queue>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "concerto/ir/graph_index.h"

namespace concerto {
namespace {

/// Every representative's ops as one node list: durations, streams (one id
/// per role and stream), edges inside each role, the partner of each send
/// and recv, and per send/recv the previous op of its key on its rank (so
/// the keys are issued in program order).
struct Joined {
  std::vector<int> base;         // per role: node of its op 0 (-1: no ranks)
  std::vector<int> stream_base;  // per role: stream id of its stream 0
  std::vector<RoleOp> at;        // per node
  std::vector<double> dur_us;
  std::vector<int> stream;
  std::vector<std::vector<int>> preds, succs;
  std::vector<int> partner;      // node or -1
  std::vector<char> is_send;
  std::vector<int> key_prev, key_next;  // node or -1
  int num_streams = 0;
};

/// Durations, edges (data and control) and partners come from the lower
/// bound's joined graph (sim/lower_bound.h), whose nodes are in the same
/// order: representatives by rank, each role's ops in program order.
Joined BuildJoined(const Program& program, const CostModel& cost) {
  Joined j;
  JoinedGraph jg = BuildJoinedGraph(program, cost);
  j.dur_us = std::move(jg.dur);
  j.preds = std::move(jg.preds);
  j.succs = std::move(jg.succs);
  j.partner = std::move(jg.partner);
  j.base.assign(program.roles.size(), -1);
  j.stream_base.assign(program.roles.size(), 0);
  for (const auto& [rep, r] : RepresentativeRoles(program)) {
    const Graph& g = program.GraphOf(program.roles[r]);
    const int base = static_cast<int>(j.at.size());
    j.base[r] = base;
    j.stream_base[r] = j.num_streams;
    j.num_streams += static_cast<int>(g.streams.size());
    std::map<std::tuple<OpKind, int, int>, int> last_of_key;  // (kind, peer, tag) -> node
    for (size_t i = 0; i < g.ops.size(); ++i) {
      const Op& op = g.ops[i];
      const int node = base + static_cast<int>(i);
      j.at.push_back({r, static_cast<int>(i)});
      const auto s = std::find(g.streams.begin(), g.streams.end(), op.stream) - g.streams.begin();
      j.stream.push_back(j.stream_base[r] + static_cast<int>(s));
      j.key_prev.push_back(-1);
      j.key_next.push_back(-1);
      j.is_send.push_back(op.kind == OpKind::kSend);
      if (op.kind != OpKind::kSend && op.kind != OpKind::kRecv) continue;
      auto [it, first] = last_of_key.emplace(std::make_tuple(op.kind, PeerRank(program.mesh, op.peer, rep), op.tag), node);
      if (first) continue;
      j.key_prev[node] = it->second;
      j.key_next[it->second] = node;
      it->second = node;
    }
  }
  assert(j.at.size() == j.dur_us.size() && "the joined graph's nodes are the representatives' ops");
  return j;
}

/// Per node: the longest chain of durations from its end to the end of the
/// program, and whether another role waits for it (a send to another role
/// follows it in its own graph).
struct Priorities {
  std::vector<double> tail_us;
  std::vector<char> feeds_other_role;
};

/// A send and its recv start together, so they are one node of a merged
/// graph whose chain from its start is the largest of its members'
/// (duration + chain of their successors). An error on a cycle of the merged
/// graph (the program could never run).
Result<Priorities> ComputePriorities(const Joined& j) {
  const int n = static_cast<int>(j.at.size());
  auto unit = [&](int i) { return j.partner[i] >= 0 ? std::min(i, j.partner[i]) : i; };
  std::vector<std::vector<int>> mpreds(n), msuccs(n);
  for (int i = 0; i < n; ++i)
    for (int s : j.succs[i]) {
      msuccs[unit(i)].push_back(unit(s));
      mpreds[unit(s)].push_back(unit(i));
    }
  std::vector<int> order = KahnOrder(mpreds, msuccs);  // includes non-unit nodes with no edges
  std::vector<char> is_unit(n, 0);
  int units = 0;
  for (int i = 0; i < n; ++i) units += is_unit[i] = unit(i) == i;
  int placed = 0;
  for (int i : order) placed += is_unit[i];
  if (placed != units) return Status::Error("list schedule: the roles' graphs joined at send/recv have a cycle");
  std::vector<double> from_start(n, 0);
  Priorities pr;
  pr.tail_us.assign(n, 0);
  pr.feeds_other_role.assign(n, 0);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const int u = *it;
    if (!is_unit[u]) continue;
    double v = 0;
    for (int m : {u, j.partner[u]}) {
      if (m < 0) continue;
      double after = 0;
      char feeds = j.partner[m] >= 0 && j.is_send[m];
      for (int s : j.succs[m]) {
        after = std::max(after, from_start[unit(s)]);
        feeds = feeds || pr.feeds_other_role[s];
      }
      v = std::max(v, j.dur_us[m] + after);
      pr.feeds_other_role[m] = feeds;
    }
    from_start[u] = v;
  }
  for (int i = 0; i < n; ++i) pr.tail_us[i] = from_start[unit(i)] - j.dur_us[i];
  return pr;
}

}  // namespace

Result<Schedule> CriticalPathListSchedule(const Program& program, const CostModel& cost,
                                          const ListScheduleOptions& options) {
  const Joined j = BuildJoined(program, cost);
  Result<Priorities> pr = ComputePriorities(j);
  if (!pr.ok()) return pr.status();
  const std::vector<double>& tail = pr->tail_us;
  // Highest priority first: ops another role waits for, in program order
  // (the pipeline's forward and backward as lowered); then the rest
  // (weight gradients, optimizer; everything of a one-role program) by
  // their chain to the end, longest first, so short tails fill idle time.
  using Entry = std::tuple<int, double, int>;  // (class, key, node): smallest first
  auto entry = [&](int i) {
    return pr->feeds_other_role[i] ? Entry{0, static_cast<double>(j.at[i].op), i} : Entry{1, -tail[i], i};
  };
  const int n = static_cast<int>(j.at.size());
  std::vector<int> waiting(n);  // predecessors not finished
  for (int i = 0; i < n; ++i) waiting[i] = static_cast<int>(j.preds[i].size());
  std::vector<char> issued(n, 0);
  // Per stream: ops whose predecessors finished and whose key's earlier ops
  // were issued, highest priority first (ties: lower op index).
  std::vector<std::set<Entry>> ready(j.num_streams);
  // With `in_order`, the ops another role waits for and every send and recv
  // start in program order per role (a chain through them).
  std::vector<int> chain_prev(n, -1), chain_next(n, -1);
  if (options.in_order) {
    std::vector<int> last(program.roles.size(), -1);
    for (int i = 0; i < n; ++i) {  // nodes are in program order within a role
      if (!pr->feeds_other_role[i] && j.partner[i] < 0) continue;
      const int r = j.at[i].role;
      if (last[r] >= 0) chain_prev[i] = last[r], chain_next[last[r]] = i;
      last[r] = i;
    }
  }
  // With `max_ahead_ops`, an op starts only within that many ops (program
  // order) of its role's first unfinished op: horizon[r] is the first index
  // beyond, first_open[r] that op, done[i] whether node i finished.
  const int ahead = options.max_ahead_ops;
  std::vector<int> role_ops(program.roles.size(), 0), first_open(program.roles.size(), 0),
      horizon(program.roles.size(), std::numeric_limits<int>::max());
  for (int i = 0; i < n; ++i) ++role_ops[j.at[i].role];
  if (ahead > 0)
    for (size_t r = 0; r < horizon.size(); ++r) horizon[r] = ahead;
  std::vector<char> done(n, 0);
  auto eligible = [&](int i) {
    return !issued[i] && waiting[i] == 0 && (j.key_prev[i] < 0 || issued[j.key_prev[i]]) &&
           (chain_prev[i] < 0 || issued[chain_prev[i]]) && j.at[i].op < horizon[j.at[i].role];
  };
  auto offer = [&](int i) {
    if (i >= 0 && eligible(i)) ready[j.stream[i]].insert(entry(i));
  };
  for (int i = 0; i < n; ++i) offer(i);
  std::vector<char> busy(j.num_streams, 0);
  // A stream whose best op is a send or recv whose partner is ready but whose
  // partner's stream is running an op waits for it (as the machine does once
  // the op is issued): waiting_on[s] is that stream, reserved_for[that
  // stream] the partner, which starts there next. Only running streams are
  // waited for, and each by one stream, so the waits cannot form a cycle.
  std::vector<int> waiting_on(j.num_streams, -1), reserved_for(j.num_streams, -1);
  std::vector<std::vector<int>> order(j.num_streams);
  using Running = std::pair<double, int>;  // (end, node)
  std::priority_queue<Running, std::vector<Running>, std::greater<>> running;
  double now = 0;
  int finished = 0;
  auto start = [&](int i) {
    issued[i] = 1;
    busy[j.stream[i]] = 1;
    ready[j.stream[i]].erase(entry(i));
    order[j.stream[i]].push_back(i);
    running.push({now + j.dur_us[i], i});
    offer(j.key_next[i]);
    offer(chain_next[i]);
  };
  while (finished < n) {
    for (bool started = true; started;) {
      started = false;
      for (int s = 0; s < j.num_streams; ++s) {
        if (busy[s] || waiting_on[s] >= 0) continue;
        if (const int p = reserved_for[s]; p >= 0) {  // a stream waits for this one: the rendezvous first
          reserved_for[s] = -1;
          waiting_on[j.stream[j.partner[p]]] = -1;
          start(p);
          start(j.partner[p]);
          started = true;
          continue;
        }
        for (const auto& [cls, key, i] : ready[s]) {
          const int p = j.partner[i];
          if (p < 0) {
            start(i);
            started = true;
            break;
          }
          if (!eligible(p)) continue;  // the op it meets is not ready: a later one may go first
          const int ps = j.stream[p];
          if (!busy[ps] && waiting_on[ps] < 0 && reserved_for[ps] < 0) {
            start(i);
            start(p);
            started = true;
            break;
          }
          if (busy[ps] && reserved_for[ps] < 0) {  // both ready: wait for the partner's stream
            waiting_on[s] = ps;
            reserved_for[ps] = p;
            break;
          }
        }
      }
    }
    if (running.empty()) {
      int stuck = 0;
      while (issued[stuck]) ++stuck;
      const Role& role = program.roles[j.at[stuck].role];
      return Status::Error(fmt::format("list schedule: nothing can start at {:.3f} us with {} ops left (role '{}' {})",
                                       now, n - finished, role.name,
                                       OpLabel(program.GraphOf(role).ops[j.at[stuck].op])));
    }
    now = running.top().first;
    while (!running.empty() && running.top().first == now) {
      const int i = running.top().second;
      running.pop();
      ++finished;
      busy[j.stream[i]] = 0;
      if (ahead > 0) {  // the role's window slides past its finished ops
        const int r = j.at[i].role;
        done[i] = 1;
        const int was = horizon[r];
        while (first_open[r] < role_ops[r] && done[j.base[r] + first_open[r]]) ++first_open[r];
        horizon[r] = first_open[r] + ahead;
        for (int k = was; k < std::min(horizon[r], role_ops[r]); ++k) offer(j.base[r] + k);
      }
      for (int s : j.succs[i]) {
        --waiting[s];
        offer(s);
      }
    }
  }
  Schedule schedule;
  schedule.scheduler = "list";
  for (size_t r = 0; r < program.roles.size(); ++r) {
    const Graph& g = program.GraphOf(program.roles[r]);
    RoleSchedule rs{program.roles[r].name, {}};
    for (size_t s = 0; s < g.streams.size(); ++s) {
      StreamOrder so{g.streams[s], {}};
      if (j.base[r] < 0) {  // no ranks: program order
        for (const Op& op : g.ops)
          if (op.stream == g.streams[s]) so.op_ids.push_back(op.id);
      } else {
        for (int i : order[j.stream_base[r] + static_cast<int>(s)]) so.op_ids.push_back(g.ops[j.at[i].op].id);
      }
      rs.streams.push_back(std::move(so));
    }
    schedule.roles.push_back(std::move(rs));
  }
  return schedule;
}

}  // namespace concerto
