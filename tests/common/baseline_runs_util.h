// Tests only: every baseline on small lowered workloads, on both clusters,
// simulated, with a check per run (the bound tests hold every run to their
// bound).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "concerto/cost/cluster.h"
#include "concerto/cost/cost_model.h"
#include "concerto/lower/frontend.h"
#include "concerto/schedule/scheduler.h"
#include "concerto/sim/simulator.h"

namespace concerto::testing {

using Workloads = std::vector<std::pair<std::string, std::string>>;  // (model, plan)

/// On a800-4x8 and commodity-4x8, each workload lowered, every baseline
/// scheduled and simulated: `check(baseline name, scheduled program, its
/// timeline, cost model)` per run, then `after(program, cost model)` once per
/// workload when given.
inline void ForEachBaselineRun(
    const Workloads& workloads,
    const std::function<void(const std::string&, const ScheduledProgram&, const Timeline&, const CostModel&)>& check,
    const std::function<void(const Program&, const CostModel&)>& after = nullptr) {
  for (const std::string cluster : {"a800-4x8", "commodity-4x8"}) {
    AnalyticCostModel cost(LoadCluster(cluster).value());
    for (const auto& [model, plan] : workloads) {
      SCOPED_TRACE(model + " " + plan + " on " + cluster);
      Result<Program> p = LowerModelPlan(model, plan);
      ASSERT_TRUE(p.ok()) << p.status().message();
      for (const std::string& name : BaselineNames()) {
        Result<ScheduledProgram> sp = RunBaseline(name, *p, cost);
        ASSERT_TRUE(sp.ok()) << name << ": " << sp.status().message();
        Result<Timeline> t = Simulate(*sp, cost);
        ASSERT_TRUE(t.ok()) << name << ": " << t.status().message();
        check(name, *sp, *t, cost);
      }
      if (after) after(*p, cost);
    }
  }
}

}  // namespace concerto::testing
