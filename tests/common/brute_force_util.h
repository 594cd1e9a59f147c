// Tests only: the best makespan of a small program over every schedule, by
// enumeration, for any
// number of roles and streams: each (role, stream)'s order is a linear
// extension of its graph's DAG; every combination the schedule verifier
// accepts (no cross-stream deadlock, sends and recvs permuted alike) is
// simulated (without interference unless asked), and the smallest makespan
// wins.
#pragma once

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "concerto/cost/cost_model.h"
#include "concerto/ir/graph_index.h"
#include "concerto/schedule/schedule.h"
#include "concerto/sim/simulator.h"

namespace concerto::testing {

/// Every order of `ops` that never puts an op before one it depends on
/// (transitively, per `reach`).
inline std::vector<std::vector<int>> LinearExtensions(std::vector<int> ops,
                                                      const std::vector<std::vector<char>>& reach) {
  std::vector<std::vector<int>> out;
  std::sort(ops.begin(), ops.end());
  do {
    bool ok = true;
    for (size_t a = 0; a < ops.size() && ok; ++a)
      for (size_t b = a + 1; b < ops.size() && ok; ++b) ok = !reach[ops[b]][ops[a]];
    if (ok) out.push_back(ops);
  } while (std::next_permutation(ops.begin(), ops.end()));
  return out;
}

/// The smallest simulated makespan over every valid schedule of `p`
/// (interference off unless given), or a negative number if no schedule is
/// valid.
inline double BruteForceOptimum(const Program& p, const CostModel& cost, double interference = 0) {
  struct Slot {
    size_t role;
    std::string stream;
    std::vector<std::vector<int>> orders;  // op ids
  };
  std::vector<Slot> slots;
  for (size_t r = 0; r < p.roles.size(); ++r) {
    const Graph& g = p.GraphOf(p.roles[r]);
    GraphIndex index = GraphIndex::Build(g);
    const size_t n = g.ops.size();
    std::vector<std::vector<char>> reach(n, std::vector<char>(n, 0));
    for (int i : TopologicalOrder(g, index))
      for (int q : index.preds[i]) {
        reach[q][i] = 1;
        for (size_t k = 0; k < n; ++k)
          if (reach[k][q]) reach[k][i] = 1;
      }
    for (const std::string& stream : g.streams) {
      std::vector<int> ops;
      for (size_t i = 0; i < n; ++i)
        if (g.ops[i].stream == stream) ops.push_back(static_cast<int>(i));
      Slot slot{r, stream, {}};
      for (const auto& order : LinearExtensions(ops, reach)) {
        std::vector<int> ids;
        for (int i : order) ids.push_back(g.ops[i].id);
        slot.orders.push_back(ids);
      }
      slots.push_back(std::move(slot));
    }
  }
  double best = -1;
  SimOptions opts;
  opts.interference = interference;
  std::vector<size_t> pick(slots.size(), 0);
  std::function<void(size_t)> visit = [&](size_t k) {
    if (k < slots.size()) {
      for (pick[k] = 0; pick[k] < slots[k].orders.size(); ++pick[k]) visit(k + 1);
      return;
    }
    ScheduledProgram sp{p, {}};
    sp.schedule.scheduler = "brute";
    for (const Role& role : p.roles) sp.schedule.roles.push_back({role.name, {}});
    for (size_t s = 0; s < slots.size(); ++s)
      sp.schedule.roles[slots[s].role].streams.push_back({slots[s].stream, slots[s].orders[pick[s]]});
    if (!VerifySchedule(sp.program, sp.schedule).empty()) return;  // deadlock or mismatched send/recv order
    Result<Timeline> t = Simulate(sp, cost, opts);
    if (t.ok() && (best < 0 || t->makespan_us < best)) best = t->makespan_us;
  };
  visit(0);
  return best;
}

}  // namespace concerto::testing
