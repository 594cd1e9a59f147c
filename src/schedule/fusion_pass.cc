#include "concerto/schedule/fusion_pass.h"

#include <algorithm>
#include <limits>

#include "concerto/ir/graph_index.h"
#include "concerto/schedule/fusion.h"

namespace concerto {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

/// Timing facts of one role's representative rank, per op index.
struct Times {
  std::vector<double> start, end, ready, first_use;
};

Times TimesOf(const Timeline& tl, int rank, const GraphIndex& index, size_t n) {
  Times t{std::vector<double>(n, 0), std::vector<double>(n, 0), std::vector<double>(n, 0),
          std::vector<double>(n, kInf)};
  for (const auto& r : tl.records)
    if (r.rank == rank) t.start[r.op_index] = r.start_us, t.end[r.op_index] = r.end_us;
  for (size_t i = 0; i < n; ++i) {
    for (int p : index.preds[i]) t.ready[i] = std::max(t.ready[i], t.end[p]);
    for (int s : index.succs[i]) t.first_use[i] = std::min(t.first_use[i], t.start[s]);
  }
  return t;
}

bool Compatible(const Op& a, const Op& b) {
  return a.kind == OpKind::kCollective && b.kind == OpKind::kCollective && a.collective == b.collective &&
         a.reduce == b.reduce && a.group.axes == b.group.axes && a.group.ranks == b.group.ranks;
}

/// True when op `c` depends on an op in `run`. Every descendant of a run
/// member starts after it ends, at or after `since`, so the backward search
/// stops at ops that ended before `since`.
bool DependsOnRun(const GraphIndex& index, const Times& t, int c, const std::vector<int>& run, double since) {
  std::vector<char> seen(index.preds.size(), 0);
  std::vector<int> stack(index.preds[c].begin(), index.preds[c].end());
  while (!stack.empty()) {
    int v = stack.back();
    stack.pop_back();
    if (seen[v] || t.end[v] <= since) continue;
    seen[v] = 1;
    if (std::find(run.begin(), run.end(), v) != run.end()) return true;
    stack.insert(stack.end(), index.preds[v].begin(), index.preds[v].end());
  }
  return false;
}

/// Runs of adjacent collectives on each stream worth fusing (op indices).
std::vector<std::vector<int>> PickRuns(const Graph& g, const GraphIndex& index, const RoleSchedule& rs,
                                       const Times& t, const PriceContext& ctx, const CostModel& cost) {
  std::vector<std::vector<int>> runs;
  for (const auto& so : rs.streams) {
    std::vector<int> run;
    Op merged;
    double run_start = 0, run_first_use = kInf;
    auto close = [&]() {
      if (run.size() >= 2) runs.push_back(run);
      run.clear();
    };
    for (int id : so.op_ids) {
      int i = index.op.at(id);
      const Op& op = g.ops[i];
      if (!run.empty() && Compatible(merged, op)) {
        Op trial = merged;
        trial.message_bytes += op.message_bytes;
        trial.inputs.insert(trial.inputs.end(), op.inputs.begin(), op.inputs.end());
        trial.outputs.insert(trial.outputs.end(), op.outputs.begin(), op.outputs.end());
        double fused_end = std::max(run_start, t.ready[i]) + cost.Price(trial, ctx).duration_us;
        double first_use = std::min(run_first_use, t.first_use[i]);
        if (fused_end <= t.end[i] && fused_end <= first_use && !DependsOnRun(index, t, i, run, run_start)) {
          run.push_back(i);
          merged = std::move(trial);
          run_first_use = first_use;
          continue;
        }
      }
      close();
      if (op.kind != OpKind::kCollective) continue;
      run = {i};
      merged = op;
      merged.duration_us.reset();
      run_start = t.start[i];
      run_first_use = t.first_use[i];
    }
    close();
  }
  return runs;
}

}  // namespace

Result<int> FuseWhereItPays(ScheduledProgram& sp, const Timeline& timeline, const CostModel& cost) {
  Program& p = sp.program;
  int merged = 0;
  for (const Role& role : p.roles) {
    // A graph shared by several roles would need one rewrite for all of
    // them; such graphs are left alone.
    int sharing = 0;
    for (const Role& other : p.roles) sharing += other.graph == role.graph;
    if (sharing != 1) continue;
    Graph& g = p.GraphOf(role);
    const int rank = *std::min_element(role.ranks.begin(), role.ranks.end());
    RoleSchedule* rs = nullptr;
    for (auto& r : sp.schedule.roles)
      if (r.role == role.name) rs = &r;
    if (!rs) return Status::Error("fusion: role '" + role.name + "' has no schedule");
    GraphIndex index = GraphIndex::Build(g);
    Times t = TimesOf(timeline, rank, index, g.ops.size());
    PriceContext ctx{g, index, p.mesh, rank};
    std::vector<std::vector<int>> groups;
    for (const auto& run : PickRuns(g, index, *rs, t, ctx, cost)) {
      std::vector<int> ids;
      for (int i : run) ids.push_back(g.ops[i].id);
      groups.push_back(std::move(ids));
    }
    if (groups.empty()) continue;
    Result<std::vector<int>> fused = FuseCollectives(g, groups);
    if (!fused.ok()) return Status::Error("fusion: " + fused.status().message());
    // Each fused op takes the stream slot of its group's first member.
    for (size_t k = 0; k < groups.size(); ++k) {
      const std::vector<int>& members = groups[k];
      for (auto& so : rs->streams) {
        auto first = std::find(so.op_ids.begin(), so.op_ids.end(), members[0]);
        if (first == so.op_ids.end()) continue;
        *first = (*fused)[k];
        so.op_ids.erase(std::remove_if(so.op_ids.begin(), so.op_ids.end(),
                                       [&](int id) {
                                         return std::find(members.begin() + 1, members.end(), id) != members.end();
                                       }),
                        so.op_ids.end());
      }
      sp.schedule.fusion_groups.push_back({role.name, (*fused)[k], members});
      merged += static_cast<int>(members.size()) - 1;
    }
  }
  return merged;
}

}  // namespace concerto
