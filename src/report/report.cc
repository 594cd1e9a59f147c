#include "concerto/report/report.h"
#include "concerto/util/json_text.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "concerto/ir/graph_index.h"
#include "concerto/sim/memory.h"

namespace concerto {

using nlohmann::json;

namespace {

using Interval = std::pair<double, double>;

/// Sorted, disjoint union of intervals.
std::vector<Interval> Union(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const auto& iv : v) {
    if (iv.second <= iv.first) continue;
    if (!out.empty() && iv.first <= out.back().second)
      out.back().second = std::max(out.back().second, iv.second);
    else
      out.push_back(iv);
  }
  return out;
}

double Length(const std::vector<Interval>& v) {
  double t = 0;
  for (const auto& iv : v) t += iv.second - iv.first;
  return t;
}

/// Length of [a, b) not covered by the sorted disjoint `cover`.
double Uncovered(double a, double b, const std::vector<Interval>& cover) {
  double covered = 0;
  auto it = std::lower_bound(cover.begin(), cover.end(), Interval{a, a},
                             [](const Interval& x, const Interval& y) { return x.second < y.first; });
  for (; it != cover.end() && it->first < b; ++it)
    covered += std::max(0.0, std::min(b, it->second) - std::max(a, it->first));
  return (b - a) - covered;
}

const Op& OpOfRecord(const Program& p, const OpRecord& r) {
  return p.GraphOf(p.roles[p.RoleOfRank(r.rank)]).ops[r.op_index];
}

}  // namespace

std::map<std::string, std::map<int, double>> ExposedCommByOp(const ScheduledProgram& sp, const Timeline& timeline) {
  const Program& p = sp.program;
  std::map<int, std::vector<Interval>> compute;
  for (const OpRecord& r : timeline.records)
    if (!OpOfRecord(p, r).IsComm()) compute[r.rank].push_back({r.start_us, r.end_us});
  std::map<int, std::vector<Interval>> covers;
  for (auto& [rank, intervals] : compute) covers[rank] = Union(intervals);
  std::map<std::string, std::map<int, double>> exposed;
  for (const OpRecord& r : timeline.records) {
    const Op& op = OpOfRecord(p, r);
    if (!op.IsComm()) continue;
    const std::string& graph = p.roles[p.RoleOfRank(r.rank)].graph;
    double& e = exposed[graph][op.id];
    e = std::max(e, Uncovered(r.start_us, r.end_us, covers[r.rank]));
  }
  return exposed;
}

Summary Summarize(const ScheduledProgram& sp, const Timeline& timeline, const CostModel& cost, double interference) {
  const Program& p = sp.program;
  Summary s;
  s.scheduler = sp.schedule.scheduler;
  s.makespan_us = timeline.makespan_us;
  s.bound = ComputeLowerBound(p, cost, interference);
  s.ranks_simulated = static_cast<int>(timeline.ranks.size());
  s.representative = timeline.representative;
  s.costs = SummarizeCosts(p, cost);
  s.busy = timeline.busy;
  for (const auto& role : p.roles) s.num_ops += static_cast<int>(p.GraphOf(role).ops.size());

  std::map<int, std::vector<Interval>> compute, comm;
  std::map<int, std::vector<int>> comm_records;
  for (size_t k = 0; k < timeline.records.size(); ++k) {
    const OpRecord& r = timeline.records[k];
    if (OpOfRecord(p, r).IsComm()) {
      comm[r.rank].push_back({r.start_us, r.end_us});
      comm_records[r.rank].push_back(static_cast<int>(k));
    } else {
      compute[r.rank].push_back({r.start_us, r.end_us});
    }
  }
  bool first = true;
  for (int rank : timeline.ranks) {
    auto cu = Union(compute[rank]);
    auto mu = Union(comm[rank]);
    double exposed = 0;
    for (const auto& iv : mu) exposed += Uncovered(iv.first, iv.second, cu);
    if (first || exposed > s.exposed_comm_us) {
      first = false;
      s.report_rank = rank;
      s.exposed_comm_us = exposed;
      s.compute_busy_us = Length(cu);
      s.comm_busy_us = Length(mu);
    }
  }
  s.overlap_ratio = s.comm_busy_us > 0 ? 1.0 - s.exposed_comm_us / s.comm_busy_us : 1.0;
  s.link_sharing_delay_us = timeline.link_sharing_delay_us;
  MemoryPeak peak = PeakMemory(p, timeline);
  s.peak_memory_bytes = peak.peak_bytes;
  s.peak_memory_rank = peak.rank;
  s.peak_memory_time_us = peak.time_us;
  s.peak_memory_op = peak.op;
  s.peak_live = peak.top_live;
  auto cu = Union(compute[s.report_rank]);
  for (int k : comm_records[s.report_rank]) {
    const OpRecord& r = timeline.records[k];
    const Op& op = OpOfRecord(p, r);
    s.top_exposed.push_back({r.rank, op.id, op.name, r.end_us - r.start_us, Uncovered(r.start_us, r.end_us, cu)});
  }
  std::stable_sort(s.top_exposed.begin(), s.top_exposed.end(),
                   [](const auto& a, const auto& b) { return a.exposed_us > b.exposed_us; });
  if (s.top_exposed.size() > 10) s.top_exposed.resize(10);
  s.critical_path_ops = static_cast<int>(timeline.critical_path.size());
  for (size_t k = 0; k < timeline.critical_path.size() && k < 50; ++k) {
    const OpRecord& r = timeline.records[timeline.critical_path[k]];
    s.critical_path.push_back("rank " + std::to_string(r.rank) + ": " + OpOfRecord(p, r).name);
  }
  return s;
}

json SummaryJson(const Summary& s) {
  json j;
  j["scheduler"] = s.scheduler;
  j["makespan_us"] = s.makespan_us;
  j["lower_bound_us"] = s.bound.lower_bound_us;
  j["lower_bound_critical_path_us"] = s.bound.critical_path_us;
  j["lower_bound_stream_load_us"] = s.bound.stream_load_us;
  j["lower_bound_busiest_stream"] = s.bound.busiest_stream;
  j["lower_bound_plain_us"] = s.bound.PlainUs();
  j["lower_bound_propagation_us"] = s.bound.propagation_us;
  j["lower_bound_interference_us"] = s.bound.interference_us;
  j["lower_bound_binding"] = s.bound.BindingTerm();
  j["ratio_to_lower_bound"] = s.bound.lower_bound_us > 0 ? s.makespan_us / s.bound.lower_bound_us : 0.0;
  j["exposed_comm_us"] = s.exposed_comm_us;
  j["compute_busy_us"] = s.compute_busy_us;
  j["comm_busy_us"] = s.comm_busy_us;
  j["overlap_ratio"] = s.overlap_ratio;
  j["link_sharing_delay_us"] = s.link_sharing_delay_us;
  j["peak_memory_bytes"] = s.peak_memory_bytes;
  j["memory_budget_bytes"] = s.memory_budget_bytes;
  j["fits_memory"] = s.fits_memory;
  j["peak_memory_rank"] = s.peak_memory_rank;
  j["peak_memory_time_us"] = s.peak_memory_time_us;
  j["peak_memory_op"] = s.peak_memory_op;
  j["peak_live_tensors"] = json::array();
  for (const LiveTensor& t : s.peak_live)
    j["peak_live_tensors"].push_back({{"name", t.name}, {"bytes", t.bytes}, {"producer", t.producer}});
  j["report_rank"] = s.report_rank;
  j["num_ops"] = s.num_ops;
  j["ranks_simulated"] = s.ranks_simulated;
  j["representative_ranks"] = s.representative;
  j["ops_priced_explicit"] = s.costs.explicit_ops;
  j["ops_priced_profile"] = s.costs.profiled_ops;
  j["ops_priced_analytic"] = s.costs.analytic_ops;
  j["busy_us"] = json::array();
  for (const auto& b : s.busy) j["busy_us"].push_back({{"rank", b.rank}, {"stream", b.stream}, {"busy_us", b.busy_us}});
  j["top_exposed_collectives"] = json::array();
  for (const auto& c : s.top_exposed)
    j["top_exposed_collectives"].push_back({{"rank", c.rank}, {"op_id", c.op_id}, {"name", c.name},
                                            {"duration_us", c.duration_us}, {"exposed_us", c.exposed_us}});
  j["critical_path_ops"] = s.critical_path_ops;
  j["critical_path"] = s.critical_path;
  return j;
}

namespace {

/// Flow arrows (Chrome "s"/"t"/"f" events) from each send to the recv it
/// meets (the k-th of a (source, destination, tag) in program order on both
/// ends) and through the members of each collective (the same op name, the
/// k-th time on that group, one arrow through the members in rank order).
/// Only simulated ranks have records: with one rank per role, arrows join
/// roles; --all-ranks shows every member.
std::vector<json> FlowEvents(const Program& p, const Timeline& timeline) {
  std::map<std::tuple<int, int, int>, std::vector<std::pair<int, int>>> sends, recvs;  // (op index, record)
  std::map<std::pair<std::vector<int>, std::string>, std::vector<std::pair<int, int>>> members;  // (rank, record)
  std::map<std::tuple<int, std::vector<int>, std::string>, int> seen;  // occurrences per (rank, group, name)
  for (size_t k = 0; k < timeline.records.size(); ++k) {
    const OpRecord& r = timeline.records[k];
    const Op& op = OpOfRecord(p, r);
    if (op.kind == OpKind::kSend) {
      sends[{r.rank, PeerRank(p.mesh, op.peer, r.rank), op.tag}].push_back({r.op_index, static_cast<int>(k)});
    } else if (op.kind == OpKind::kRecv) {
      recvs[{PeerRank(p.mesh, op.peer, r.rank), r.rank, op.tag}].push_back({r.op_index, static_cast<int>(k)});
    } else if (op.kind == OpKind::kCollective) {
      std::vector<int> group = GroupRanks(p.mesh, op.group, r.rank);
      if (group.size() < 2) continue;
      const int nth = seen[{r.rank, group, op.name}]++;
      members[{group, op.name + "#" + std::to_string(nth)}].push_back({r.rank, static_cast<int>(k)});
    }
  }
  std::vector<json> out;
  int id = 0;
  auto point = [&](const char* ph, int record, const std::string& name, const char* cat) {
    const OpRecord& r = timeline.records[record];
    json e = {{"name", name}, {"cat", cat}, {"ph", ph}, {"id", id}, {"pid", r.rank}, {"tid", r.stream},
              {"ts", r.start_us}};
    if (std::string(ph) != "s") e["bp"] = "e";
    out.push_back(std::move(e));
  };
  for (auto& [key, s] : sends) {
    auto it = recvs.find(key);
    if (it == recvs.end()) continue;
    std::vector<std::pair<int, int>>& r = it->second;
    std::sort(s.begin(), s.end());
    std::sort(r.begin(), r.end());
    for (size_t k = 0; k < std::min(s.size(), r.size()); ++k, ++id) {
      point("s", s[k].second, "send -> recv", "p2p");
      point("f", r[k].second, "send -> recv", "p2p");
    }
  }
  for (auto& [key, m] : members) {
    if (m.size() < 2) continue;
    std::sort(m.begin(), m.end());
    const std::string name = "collective " + key.second.substr(0, key.second.rfind('#'));
    for (size_t k = 0; k < m.size(); ++k)
      point(k == 0 ? "s" : k + 1 == m.size() ? "f" : "t", m[k].second, name, "collective");
    ++id;
  }
  return out;
}

}  // namespace

std::string ChromeTrace(const ScheduledProgram& sp, const Timeline& timeline) {
  const Program& p = sp.program;
  json events = json::array();
  for (int rank : timeline.ranks) {
    const Role& role = p.roles[p.RoleOfRank(rank)];
    const Graph& g = p.GraphOf(role);
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank},
                      {"args", {{"name", "rank " + std::to_string(rank) + " (" + role.name + ")"}}}});
    for (size_t s = 0; s < g.streams.size(); ++s)
      events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank}, {"tid", s},
                        {"args", {{"name", g.streams[s]}}}});
  }
  // Per rank, when compute runs (communication outside it is exposed), and
  // the records on the critical path.
  std::map<int, std::vector<Interval>> compute_cover;
  for (const auto& r : timeline.records)
    if (!OpOfRecord(p, r).IsComm()) compute_cover[r.rank].push_back({r.start_us, r.end_us});
  for (auto& [rank, intervals] : compute_cover) intervals = Union(std::move(intervals));
  std::vector<bool> critical(timeline.records.size(), false);
  for (int k : timeline.critical_path) critical[k] = true;
  for (size_t k = 0; k < timeline.records.size(); ++k) {
    const OpRecord& r = timeline.records[k];
    const Op& op = OpOfRecord(p, r);
    json args = {{"id", op.id}, {"kind", ToString(op.kind)}, {"phase", ToString(op.tags.phase)}};
    if (op.tags.layer >= 0) args["layer"] = op.tags.layer;
    if (op.tags.microbatch >= 0) args["microbatch"] = op.tags.microbatch;
    if (op.kind == OpKind::kCompute) {
      args["type"] = ToString(op.compute_type);
      args["flops"] = op.flops;
      args["bytes"] = op.bytes;
    } else if (op.IsComm()) {
      if (op.kind == OpKind::kCollective) args["collective"] = ToString(op.collective);
      args["bytes"] = op.message_bytes;
      if (!op.tags.purpose.empty()) args["purpose"] = op.tags.purpose;
      if (!op.fused_from.empty()) args["fused_ops"] = op.fused_from.size();
    }
    // Colours (Chrome's reserved names): exposed communication red,
    // other critical-path ops yellow.
    std::string colour;
    if (op.IsComm()) {
      const double exposed = Uncovered(r.start_us, r.end_us, compute_cover[r.rank]);
      args["exposed_us"] = exposed;
      if (exposed > 1e-9) colour = "terrible";
    }
    if (critical[k]) {
      args["critical_path"] = true;
      if (colour.empty()) colour = "yellow";
    }
    json event = {{"name", op.name}, {"cat", ToString(op.kind)}, {"ph", "X"}, {"pid", r.rank}, {"tid", r.stream},
                  {"ts", r.start_us}, {"dur", r.end_us - r.start_us}, {"args", args}};
    if (!colour.empty()) event["cname"] = colour;
    events.push_back(std::move(event));
  }
  for (json& flow : FlowEvents(p, timeline)) events.push_back(std::move(flow));
  // A memory counter track per rank (live bytes over time, sim/memory.h).
  for (const MemoryCurve& c : MemoryCurves(p, timeline))
    for (const auto& [t, bytes] : c.points)
      events.push_back({{"name", "memory"}, {"ph", "C"}, {"pid", c.rank}, {"ts", t},
                        {"args", {{"live GiB", bytes / double(1 << 30)}}}});
  json trace = {{"traceEvents", events}, {"displayTimeUnit", "ms"},
                {"otherData", {{"scheduler", sp.schedule.scheduler}, {"makespan_us", timeline.makespan_us}}}};
  return DumpJson(trace) + "\n";
}

}  // namespace concerto
