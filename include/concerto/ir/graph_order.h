// The two graph walks every part of Concerto shares: a topological order
// (Kahn's algorithm, ready nodes taken in a given priority) and the
// as-soon-as-possible start of every op under dependencies plus stream order
// (ASAP compaction). The schedule verifier's deadlock check, the concerto
// search's compaction of one role or of all roles joined at send/recv, the
// baselines' launch orders, the fusion pass's cycle check, the list schedule
// and the solvers' orders all call these; there is no other copy.
#pragma once

#include <algorithm>
#include <cassert>
#include <functional>
#include <queue>
#include <vector>

namespace concerto {

/// Kahn's algorithm over successor lists: a node is ready when all its
/// predecessors are taken; among ready nodes the one `first(a, b)` puts first
/// is taken first (default: the smallest index, deterministic). Returns the
/// nodes taken, in order: shorter than succs.size() when there is a cycle
/// (the nodes left out are on it or after it).
template <typename First = std::less<int>>
std::vector<int> KahnOrderBy(const std::vector<std::vector<int>>& succs, First first = {}) {
  const int n = static_cast<int>(succs.size());
  std::vector<int> indegree(n, 0);
  for (const std::vector<int>& s : succs)
    for (int v : s) ++indegree[v];
  auto later = [&first](int a, int b) { return first(b, a); };
  std::priority_queue<int, std::vector<int>, decltype(later)> ready(later);
  for (int i = 0; i < n; ++i)
    if (indegree[i] == 0) ready.push(i);
  std::vector<int> order;
  order.reserve(n);
  while (!ready.empty()) {
    const int i = ready.top();
    ready.pop();
    order.push_back(i);
    for (int s : succs[i])
      if (--indegree[s] == 0) ready.push(s);
  }
  return order;
}

/// The result of AsapStarts: per node its start (0 for a node never
/// started), whether it started, and how many did (all of them unless the
/// edges and stream orders form a cycle: a deadlock).
template <typename Time>
struct AsapResult {
  std::vector<Time> start;
  std::vector<char> started;
  int count = 0;
  bool complete() const { return count == static_cast<int>(start.size()); }
};

/// As-soon-as-possible starts of `n` nodes with durations `dur`: a node
/// starts when each successor edge into it (`for_each_succ(v, fn)` calls
/// fn(s) for every dependency successor s of v) and its stream order
/// (`next[v]`: the node after v on v's stream, or -1) allow, that is when
/// its predecessors and the node before it on its stream have ended. A node
/// with a partner (`partner[v] >= 0`, symmetric; empty `partner`: none)
/// starts together with it, at the later of their two earliest starts (a
/// send and the recv it meets). Nodes on a cycle never start.
template <typename Time, typename ForEachSucc>
AsapResult<Time> AsapStarts(int n, ForEachSucc&& for_each_succ, const std::vector<int>& next,
                            const std::vector<int>& partner, const std::vector<Time>& dur) {
  assert(static_cast<int>(next.size()) == n && static_cast<int>(dur.size()) == n);
  assert(partner.empty() || static_cast<int>(partner.size()) == n);
  auto other = [&](int v) { return partner.empty() ? -1 : partner[v]; };
  // A node and its partner are one unit, named by the smaller index.
  auto unit = [&](int v) { return other(v) >= 0 ? std::min(v, other(v)) : v; };
  auto each_succ = [&](int v, auto&& fn) {
    for_each_succ(v, fn);
    if (next[v] >= 0) fn(next[v]);
  };
  std::vector<int> indeg(n, 0);
  for (int v = 0; v < n; ++v) each_succ(v, [&](int s) { indeg[unit(s)]++; });
  AsapResult<Time> out;
  out.start.assign(n, Time{});
  out.started.assign(n, 0);
  std::vector<Time> earliest(n, Time{});
  std::vector<int> stack;
  for (int v = 0; v < n; ++v)
    if (unit(v) == v && indeg[v] == 0) stack.push_back(v);
  while (!stack.empty()) {
    const int u = stack.back();
    stack.pop_back();
    const Time start = other(u) >= 0 ? std::max(earliest[u], earliest[other(u)]) : earliest[u];
    for (int m : {u, other(u)}) {
      if (m < 0) continue;
      ++out.count;
      out.started[m] = 1;
      out.start[m] = start;
      const Time end = start + dur[m];
      each_succ(m, [&](int s) {
        earliest[s] = std::max(earliest[s], end);
        if (--indeg[unit(s)] == 0) stack.push_back(unit(s));
      });
    }
  }
  return out;
}

/// `next` (the node after each on its stream, or -1) of per-stream orders.
inline std::vector<int> StreamSuccessors(int n, const std::vector<std::vector<int>>& orders) {
  std::vector<int> next(n, -1);
  for (const std::vector<int>& order : orders)
    for (size_t k = 0; k + 1 < order.size(); ++k) next[order[k]] = order[k + 1];
  return next;
}

}  // namespace concerto
