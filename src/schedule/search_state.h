// The concerto search's state of one role: durations, start ticks (always a
// feasible schedule at nominal durations), per-stream orders, and the
// compaction and decoding over it. Internal to src/schedule/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "concerto/ir/graph_index.h"
#include "concerto/schedule/schedule.h"
#include "concerto/sim/lower_bound.h"

namespace concerto::search {

/// The state of one role during the search.
struct RoleSearch {
  int role = 0;
  int rank = 0;
  const Graph* graph = nullptr;
  const GraphIndex* index = nullptr;  // of *graph, owned by the search (shared with Measure)
  std::vector<int64_t> dur;       // nominal duration, ticks
  std::vector<int> stream;        // per op: stream index
  std::vector<int64_t> t;         // start tick per op (feasible)
  std::vector<int> topo;          // per op: position in a topological order
  std::vector<std::vector<int>> order;  // per stream: op indices sorted by (t, topo)
  std::vector<int> pos;                 // per op: its position in order[stream], kept with order
  /// Per op: its task in the window being built, else -1 (BuildWindow's
  /// scratch, all -1 between windows, so a window costs its size, not n).
  mutable std::vector<int> task_of;
  std::vector<int64_t> tensor_units;    // per tensor: size in memory units (budget only)
  /// Per op: the start tick of the op a send or recv meets in the joined
  /// timeline (JoinedCompact), or -1; empty for a program of one role.
  std::vector<int64_t> meet;
};

/// Sets r.pos for the ops of stream `s` from r.order[s].
void RenumberStream(RoleSearch& r, size_t s);

/// The order of a stream: by start tick; at equal ticks ops of zero ticks
/// first (they end where they start, so the other op is not delayed, while
/// after it they would wait for it to end: the windows do not count them on
/// their stream), then topological position.
bool StreamBefore(const RoleSearch& r, int a, int b);

/// Sorts each stream's ops by StreamBefore.
void SortStreams(RoleSearch& r);

/// SortStreams after only the ops in `changed` got new start ticks, in time
/// linear in the part of each stream that moves: the other ops keep their
/// relative order, so the ops before the first changed one whose key is
/// below every new key (and those after the last one, above) stay where they
/// are, and the span between is the merge of its unchanged ops and the
/// changed ops sorted by the same key (the same order SortStreams gives).
void ResortChanged(RoleSearch& r, const std::vector<int>& changed);

/// As-soon-as-possible start ticks for the current per-stream orders.
void Compact(RoleSearch& r);

/// As-soon-as-possible start ticks of every role at once for the current
/// per-stream orders, under the machine model at nominal durations: an op
/// starts when its stream's previous op and its predecessors have ended, and
/// a send starts together with the recv it meets (`partner`, PairSendRecv)
/// once both could. So a recv starts when its data can arrive and the
/// pipeline's fill, bubbles and drain show. Sets each role's `t` and `meet`.
/// Returns false, changing nothing, when the orders deadlock across roles.
bool JoinedCompact(std::vector<RoleSearch>& roles, const std::vector<std::vector<RoleOp>>& partner);

/// The per-stream orders of every role as a Schedule named `name`.
Schedule Decode(const Program& program, const std::vector<RoleSearch>& roles, const std::string& name);

}  // namespace concerto::search
