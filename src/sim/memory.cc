#include "concerto/sim/memory.h"

#include <algorithm>
#include <cassert>
#include <map>
#include <tuple>
#include <vector>

#include "concerto/ir/graph_index.h"

namespace concerto {
namespace {

/// One rank's allocation (+bytes) and release (-bytes) events of each
/// tensor, in time order, releases first at equal times (a buffer freed at t
/// can be reused at t).
struct RankEvents {
  std::vector<std::tuple<double, int64_t, int>> events;  // (time, delta, tensor)
};

RankEvents Events(const Graph& g, const GraphIndex& index, const std::vector<const OpRecord*>& rec,
                  double makespan_us) {
  RankEvents r;
  r.events.reserve(2 * g.tensors.size());
  for (size_t t = 0; t < g.tensors.size(); ++t) {
    const int64_t bytes = g.tensors[t].Bytes();
    const int producer = index.producer[t];
    const double alloc = producer >= 0 && rec[producer] ? rec[producer]->start_us : 0;
    double release = alloc;
    for (int c : index.consumers[t])
      if (rec[c]) release = std::max(release, rec[c]->end_us);
    if (index.consumers[t].empty()) release = makespan_us;
    r.events.push_back({alloc, bytes, static_cast<int>(t)});
    r.events.push_back({release, -bytes, static_cast<int>(t)});
  }
  std::sort(r.events.begin(), r.events.end(), [](const auto& a, const auto& b) {
    return std::get<0>(a) != std::get<0>(b) ? std::get<0>(a) < std::get<0>(b) : std::get<1>(a) < std::get<1>(b);
  });
  return r;
}

/// Peak of one rank, with the op that reached it and the largest tensors live then.
MemoryPeak RankPeak(const Graph& g, const GraphIndex& index, const std::vector<const OpRecord*>& rec, int rank,
                    double makespan_us) {
  const RankEvents r = Events(g, index, rec, makespan_us);
  MemoryPeak peak{0, rank, 0, "", {}};
  int64_t live = 0;
  size_t at = r.events.size();  // the event that set the peak
  for (size_t k = 0; k < r.events.size(); ++k) {
    live += std::get<1>(r.events[k]);
    if (live > peak.peak_bytes) peak.peak_bytes = live, peak.time_us = std::get<0>(r.events[k]), at = k;
  }
  if (at == r.events.size()) return peak;
  const int t = std::get<2>(r.events[at]);
  if (index.producer[t] >= 0 && rec[index.producer[t]]) peak.op = OpLabel(g.ops[index.producer[t]]);
  // Live at the peak: the tensors the sweep holds right after the peak's event.
  std::vector<char> alive(g.tensors.size(), 0);
  for (size_t k = 0; k <= at; ++k) alive[std::get<2>(r.events[k])] = std::get<1>(r.events[k]) > 0;
  std::vector<int> live_tensors;
  for (size_t x = 0; x < alive.size(); ++x)
    if (alive[x]) live_tensors.push_back(static_cast<int>(x));
  std::sort(live_tensors.begin(), live_tensors.end(), [&](int a, int b) {
    return g.tensors[a].Bytes() != g.tensors[b].Bytes() ? g.tensors[a].Bytes() > g.tensors[b].Bytes() : a < b;
  });
  for (size_t k = 0; k < live_tensors.size() && k < 5; ++k) {
    const int x = live_tensors[k];
    peak.top_live.push_back({g.tensors[x].name, g.tensors[x].Bytes(),
                             index.producer[x] >= 0 ? g.ops[index.producer[x]].name : std::string()});
  }
  return peak;
}

/// The records of every simulated rank, indexed by op.
std::map<int, std::vector<const OpRecord*>> ByRank(const Program& program, const Timeline& timeline) {
  std::map<int, std::vector<const OpRecord*>> by_rank;
  for (const auto& r : timeline.records) {
    auto& v = by_rank[r.rank];
    if (v.empty()) {
      const Graph& g = program.GraphOf(program.roles[program.RoleOfRank(r.rank)]);
      v.assign(g.ops.size(), nullptr);
    }
    v[r.op_index] = &r;
  }
  return by_rank;
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
  const std::map<int, std::vector<const OpRecord*>> by_rank = ByRank(program, timeline);
  MemoryPeak best;
  for (const auto& [rank, recs] : by_rank) {
    const int gi = program.GraphIndex(program.roles[program.RoleOfRank(rank)].graph);
    MemoryPeak p = RankPeak(program.graphs[gi], indexes[gi], recs, rank, timeline.makespan_us);
    if (p.peak_bytes > best.peak_bytes) best = p;
  }
  return best;
}

std::vector<MemoryCurve> MemoryCurves(const Program& program, const Timeline& timeline) {
  std::vector<MemoryCurve> curves;
  std::map<int, GraphIndex> indexes;  // per graph, built once (ranks of a role share their graph)
  for (const auto& [rank, recs] : ByRank(program, timeline)) {
    const int gi = program.GraphIndex(program.roles[program.RoleOfRank(rank)].graph);
    const Graph& g = program.graphs[gi];
    auto it = indexes.find(gi);
    if (it == indexes.end()) it = indexes.emplace(gi, GraphIndex::Build(g)).first;
    const RankEvents r = Events(g, it->second, recs, timeline.makespan_us);
    MemoryCurve c;
    c.rank = rank;
    int64_t live = 0;
    for (size_t k = 0; k < r.events.size(); ++k) {
      live += std::get<1>(r.events[k]);
      const double t = std::get<0>(r.events[k]);
      if (k + 1 < r.events.size() && std::get<0>(r.events[k + 1]) == t) continue;  // one point per time
      if (c.points.empty() || c.points.back().second != live) c.points.push_back({t, live});
    }
    curves.push_back(std::move(c));
  }
  return curves;
}

}  // namespace concerto
