// The Concerto scheduler end to end (the driver's path: decomposition, the
// list schedules of the input and of the best baseline's program, in order
// on pipelines, windows, fusion) on every tiny preset under every 8-rank
// plan that lowers, on both a800-4x8 and commodity-4x8: every schedule is
// verified (the driver rejects one that fails), and concerto is never slower
// than the best baseline (its guarantee) nor below the run's lower bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "concerto/cost/cluster.h"
#include "concerto/cost/cost_model.h"
#include "concerto/driver/driver.h"
#include "concerto/driver/options.h"
#include "concerto/lower/frontend.h"

namespace concerto {
namespace {

TEST(ConcertoSweep, NeverSlowerThanTheBestBaselineOnEveryTinyPresetAndPlan) {
  const std::vector<std::string> models = {"gpt-tiny", "llama-tiny", "mixtral-tiny", "evoformer-tiny"};
  const std::vector<std::string> plans = {
      "dp=8",          "dp=2,tp=2,microbatches=2", "dp=4,tp=2,sp", "dp=8,zero=1", "dp=8,zero=3",
      "pp=2,dp=2,tp=2,microbatches=4", "pp=2,dp=2,tp=2,microbatches=4,vstages=2",
      "dp=4,tp=2,order=dp-tp", "dp=4,ep=2", "dp=2,dap=4",
  };
  Options options;
  int runs = 0, pipelines = 0, strictly_better = 0;
  for (const std::string cluster : {"a800-4x8", "commodity-4x8"}) {
    AnalyticCostModel cost(LoadCluster(cluster).value());
    for (const std::string& model : models)
      for (const std::string& plan : plans) {
        Result<Program> p = LowerModelPlan(model, plan);
        if (!p.ok()) continue;  // the preset/plan sweep checks the rejections
        SCOPED_TRACE(model + " " + plan + " on " + cluster);
        Result<std::vector<RunResult>> all = Compare(*p, SchedulerNames(), cost, options);
        ASSERT_TRUE(all.ok()) << all.status().message();
        double best_baseline = 0;
        const RunResult* concerto = nullptr;
        for (const RunResult& r : *all) {
          if (r.summary.scheduler == "concerto") {
            concerto = &r;
          } else if (best_baseline == 0 || r.summary.makespan_us < best_baseline) {
            best_baseline = r.summary.makespan_us;
          }
        }
        ASSERT_NE(concerto, nullptr);
        EXPECT_LE(concerto->summary.makespan_us, best_baseline * (1 + 1e-9));
        EXPECT_GE(concerto->summary.makespan_us, concerto->summary.bound.lower_bound_us * (1 - 1e-9));
        strictly_better += concerto->summary.makespan_us < best_baseline * (1 - 1e-6);
        pipelines += p->roles.size() > 1;
        ++runs;
      }
  }
  std::printf("  %d runs (%d pipelines); concerto strictly faster than the best baseline on %d\n", runs, pipelines,
              strictly_better);
  EXPECT_GE(runs, 30);  // the sweep is not vacuous
  EXPECT_GE(pipelines, 4);
}

}  // namespace
}  // namespace concerto
