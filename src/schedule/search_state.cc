// The concerto search's per-role state (search_state.h).
#include "search_state.h"

#include <algorithm>
#include <cassert>

#include "concerto/ir/graph_order.h"

namespace concerto::search {

/// Sets r.pos for the ops of stream `s` from r.order[s].
void RenumberStream(RoleSearch& r, size_t s) {
  const auto& o = r.order[s];
  for (size_t k = 0; k < o.size(); ++k) r.pos[o[k]] = static_cast<int>(k);
}

/// The order of a stream: by start tick; at equal ticks ops of zero ticks
/// first (they end where they start, so the other op is not delayed, while
/// after it they would wait for it to end: the windows do not count them on
/// their stream), then topological position.
bool StreamBefore(const RoleSearch& r, int a, int b) {
  return std::make_tuple(r.t[a], r.dur[a] > 0, r.topo[a]) < std::make_tuple(r.t[b], r.dur[b] > 0, r.topo[b]);
}

/// Sorts each stream's ops by StreamBefore.
void SortStreams(RoleSearch& r) {
  r.order.assign(r.graph->streams.size(), {});
  r.pos.assign(r.graph->ops.size(), -1);
  for (size_t i = 0; i < r.graph->ops.size(); ++i) r.order[r.stream[i]].push_back(static_cast<int>(i));
  for (auto& o : r.order) std::sort(o.begin(), o.end(), [&](int a, int b) { return StreamBefore(r, a, b); });
  for (size_t s = 0; s < r.order.size(); ++s) RenumberStream(r, s);
}

/// SortStreams after only the ops in `changed` got new start ticks, in time
/// linear in the part of each stream that moves: the other ops keep their
/// relative order, so the ops before the first changed one whose key is
/// below every new key (and those after the last one, above) stay where they
/// are, and the span between is the merge of its unchanged ops and the
/// changed ops sorted by the same key (the same order SortStreams gives).
void ResortChanged(RoleSearch& r, const std::vector<int>& changed) {
  auto before = [&](int a, int b) { return StreamBefore(r, a, b); };
  std::vector<std::vector<int>> moved(r.order.size());
  for (int i : changed) moved[r.stream[i]].push_back(i);
  for (size_t s = 0; s < r.order.size(); ++s) {
    if (moved[s].empty()) continue;
    auto& o = r.order[s];
    std::sort(moved[s].begin(), moved[s].end(), before);
    int lo = static_cast<int>(o.size()), hi = -1;  // old positions of the changed ops
    for (int i : moved[s]) lo = std::min(lo, r.pos[i]), hi = std::max(hi, r.pos[i]);
    // Outside [lo, hi] every op is unchanged, so sorted: search there.
    const int a = static_cast<int>(std::lower_bound(o.begin(), o.begin() + lo, moved[s].front(), before) - o.begin());
    const int b = static_cast<int>(std::upper_bound(o.begin() + hi + 1, o.end(), moved[s].back(), before) - o.begin());
    for (int i : moved[s]) r.pos[i] = -1;  // marks the changed ops
    std::vector<int> kept;
    kept.reserve(b - a);
    for (int k = a; k < b; ++k)
      if (r.pos[o[k]] >= 0) kept.push_back(o[k]);
    std::merge(kept.begin(), kept.end(), moved[s].begin(), moved[s].end(), o.begin() + a, before);
    for (int k = a; k < b; ++k) r.pos[o[k]] = k;
  }
}

/// As-soon-as-possible start ticks for the current per-stream orders.
void Compact(RoleSearch& r) {
  const int n = static_cast<int>(r.graph->ops.size());
  AsapResult<int64_t> asap = AsapStarts(
      n, [&](int i, auto&& fn) { for (int s : r.index->succs[i]) fn(s); }, StreamSuccessors(n, r.order), {}, r.dur);
  assert(asap.complete() && "stream orders form a cycle");
  r.t = std::move(asap.start);
}

/// As-soon-as-possible start ticks of every role at once for the current
/// per-stream orders, under the machine model at nominal durations: an op
/// starts when its stream's previous op and its predecessors have ended, and
/// a send starts together with the recv it meets (`partner`, PairSendRecv)
/// once both could. So a recv starts when its data can arrive and the
/// pipeline's fill, bubbles and drain show. Sets each role's `t` and `meet`.
/// Returns false, changing nothing, when the orders deadlock across roles.
bool JoinedCompact(std::vector<RoleSearch>& roles, const std::vector<std::vector<RoleOp>>& partner) {
  // One node per op of every role (role k's ops from base[k]), joined at
  // each send/recv pair.
  std::vector<int> base;
  int n = 0;
  for (const RoleSearch& r : roles) base.push_back(n), n += static_cast<int>(r.graph->ops.size());
  std::vector<int> other(n, -1), next(n, -1);  // partner node, next op on the stream
  std::vector<int64_t> dur(n, 0);
  for (size_t k = 0; k < roles.size(); ++k) {
    const RoleSearch& r = roles[k];
    assert(r.role == static_cast<int>(k) && "one RoleSearch per program role, in order");
    for (const auto& o : r.order)
      for (size_t q = 0; q + 1 < o.size(); ++q) next[base[k] + o[q]] = base[k] + o[q + 1];
    for (size_t i = 0; i < r.graph->ops.size(); ++i) {
      dur[base[k] + i] = r.dur[i];
      if (const RoleOp p = partner[r.role][i]; p.role >= 0) other[base[k] + i] = base[p.role] + p.op;
    }
  }
  auto role_of = [&](int v) { return static_cast<int>(std::upper_bound(base.begin(), base.end(), v) - base.begin()) - 1; };
  const AsapResult<int64_t> asap = AsapStarts(
      n,
      [&](int v, auto&& fn) {
        const int k = role_of(v);
        for (int s : roles[k].index->succs[v - base[k]]) fn(base[k] + s);
      },
      next, other, dur);
  if (!asap.complete()) return false;
  const std::vector<int64_t>& t = asap.start;
  for (size_t k = 0; k < roles.size(); ++k) {
    RoleSearch& r = roles[k];
    const int ops = static_cast<int>(r.graph->ops.size());
    r.t.assign(t.begin() + base[k], t.begin() + base[k] + ops);
    r.meet.assign(ops, -1);
    for (int i = 0; i < ops; ++i)
      if (other[base[k] + i] >= 0) r.meet[i] = t[other[base[k] + i]];
  }
  return true;
}

Schedule Decode(const Program& program, const std::vector<RoleSearch>& roles, const std::string& name) {
  Schedule s;
  s.scheduler = name;
  for (const RoleSearch& r : roles) {
    RoleSchedule rs;
    rs.role = program.roles[r.role].name;
    for (size_t k = 0; k < r.graph->streams.size(); ++k) {
      StreamOrder so{r.graph->streams[k], {}};
      for (int i : r.order[k]) so.op_ids.push_back(r.graph->ops[i].id);
      rs.streams.push_back(std::move(so));
    }
    s.roles.push_back(std::move(rs));
  }
  return s;
}

}  // namespace concerto::search
