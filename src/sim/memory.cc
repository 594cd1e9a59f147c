#include "concerto/sim/memory.h"

#include <algorithm>
#include <cassert>
#include <map>
#include <vector>

#include "concerto/ir/graph_index.h"

namespace concerto {
namespace {

/// Peak of one rank: sweep allocation (+) and release (-) events in time
/// order, releases first at equal times (a buffer freed at t can be reused at t).
MemoryPeak RankPeak(const Graph& g, const GraphIndex& index, const std::vector<const OpRecord*>& rec, int rank,
                    double makespan_us) {
  std::vector<std::pair<double, int64_t>> events;
  events.reserve(2 * g.tensors.size());
  for (size_t t = 0; t < g.tensors.size(); ++t) {
    const int64_t bytes = g.tensors[t].Bytes();
    const int producer = index.producer[t];
    const double alloc = producer >= 0 && rec[producer] ? rec[producer]->start_us : 0;
    double release = alloc;
    for (int c : index.consumers[t])
      if (rec[c]) release = std::max(release, rec[c]->end_us);
    if (index.consumers[t].empty()) release = makespan_us;
    events.push_back({alloc, bytes});
    events.push_back({release, -bytes});
  }
  std::sort(events.begin(), events.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second < b.second;
  });
  MemoryPeak peak{0, rank, 0};
  int64_t live = 0;
  for (const auto& [time_us, delta] : events) {
    live += delta;
    if (live > peak.peak_bytes) peak = {live, rank, time_us};
  }
  return peak;
}

}  // namespace

MemoryPeak PeakMemory(const Program& program, const Timeline& timeline) {
  std::vector<GraphIndex> indexes;
  indexes.reserve(program.graphs.size());
  for (const Graph& g : program.graphs) indexes.push_back(GraphIndex::Build(g));
  return PeakMemory(program, timeline, indexes);
}

MemoryPeak PeakMemory(const Program& program, const Timeline& timeline, const std::vector<GraphIndex>& indexes) {
  assert(indexes.size() == program.graphs.size() && "one index per graph");
  std::map<int, std::vector<const OpRecord*>> by_rank;
  for (const auto& r : timeline.records) {
    auto& v = by_rank[r.rank];
    if (v.empty()) {
      const Graph& g = program.GraphOf(program.roles[program.RoleOfRank(r.rank)]);
      v.assign(g.ops.size(), nullptr);
    }
    v[r.op_index] = &r;
  }
  MemoryPeak best;
  for (const auto& [rank, recs] : by_rank) {
    const int gi = program.GraphIndex(program.roles[program.RoleOfRank(rank)].graph);
    MemoryPeak p = RankPeak(program.graphs[gi], indexes[gi], recs, rank, timeline.makespan_us);
    if (p.peak_bytes > best.peak_bytes) best = p;
  }
  return best;
}

}  // namespace concerto
