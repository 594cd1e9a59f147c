// The lower bound: a hand-drawn two-stage pipeline where the joined bound
// counts fill and drain, and on the frontends' workloads no baseline and no
// concerto schedule ever beats it.
#include "concerto/sim/lower_bound.h"

#include <gtest/gtest.h>

#include "concerto/cost/cluster.h"
#include "concerto/lower/frontend.h"
#include "concerto/schedule/concerto_scheduler.h"
#include "concerto/schedule/scheduler.h"
#include "concerto/sim/simulator.h"
#include "baseline_runs_util.h"
#include "test_ops_util.h"

namespace concerto {
namespace {

AnalyticCostModel Cost(const std::string& name = "a800-4x8") { return AnalyticCostModel(LoadCluster(name).value()); }

/// Two stages (ranks 0 and 1, one role each), explicit durations:
///   stage0: A (compute, 10) -> S (send a to rank 1, comm, 5)
///   stage1: R (recv from rank 0, comm, 5) -> B (compute, 10), and an
///           independent C (compute, 10) first in program order
/// Unjoined, stage 1 could start R at 0: critical path 15, busiest stream 20.
/// Joined, R starts with S, at 10 at the earliest, so B ends at 25:
///   stage0 compute |A.........|
///   stage0 comm               |S....|
///   stage1 comm               |R....|
///   stage1 compute |C.........|     |B.........|   -> 25 = critical path
Program TwoStagePipeline() {
  Program p;
  p.mesh.axes = {{"pp", 2}};
  using testing::MakeOp;
  using testing::T;
  Graph g0;
  g0.name = "stage0";
  g0.tensors = {T("x"), T("a")};
  g0.ops = {MakeOp(0, "A", OpKind::kCompute, "compute", {"x"}, {"a"}, 10),
            MakeOp(1, "S", OpKind::kSend, "comm", {"a"}, {}, 5)};
  g0.ops[1].peer.axis = "pp";
  g0.ops[1].peer.offset = 1;
  Graph g1;
  g1.name = "stage1";
  g1.tensors = {T("y"), T("r"), T("b"), T("c")};
  g1.ops = {MakeOp(0, "R", OpKind::kRecv, "comm", {}, {"r"}, 5),
            MakeOp(1, "C", OpKind::kCompute, "compute", {"y"}, {"c"}, 10),
            MakeOp(2, "B", OpKind::kCompute, "compute", {"r"}, {"b"}, 10)};
  g1.ops[0].peer.axis = "pp";
  g1.ops[0].peer.offset = -1;
  p.graphs = {g0, g1};
  p.roles = {{"stage0", "stage0", {0}}, {"stage1", "stage1", {1}}};
  return p;
}

TEST(LowerBoundTest, JoinsSendAndRecvAcrossStages) {
  AnalyticCostModel cost = Cost();
  Program p = TwoStagePipeline();
  LowerBound lb = ComputeLowerBound(p, cost);
  EXPECT_EQ(lb.send_recv_pairs_joined, 1);
  EXPECT_DOUBLE_EQ(lb.critical_path_us, 25);
  EXPECT_DOUBLE_EQ(lb.stream_load_us, 20);
  EXPECT_DOUBLE_EQ(lb.lower_bound_us, 25);
  // The fifo schedule reaches it.
  Result<ScheduledProgram> sp = RunBaseline("fifo", p, cost);
  ASSERT_TRUE(sp.ok()) << sp.status().message();
  SimOptions o;
  o.interference = 0;
  Result<Timeline> t = Simulate(*sp, cost, o);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_DOUBLE_EQ(t->makespan_us, 25);
}

/// Every baseline and a short concerto run on each workload: the simulated
/// makespan is never below the bound of the program that was run.
TEST(LowerBoundTest, NoScheduleBeatsItOnTheFrontendsWorkloads) {
  const std::vector<std::pair<std::string, std::string>> workloads = {
      {"gpt-tiny", "dp=2,tp=2"},          {"gpt-tiny", "pp=2,dp=2,microbatches=4"},
      {"gpt-tiny", "pp=2,microbatches=6"}, {"gpt-tiny", "zero=3,dp=4"},
      {"llama-tiny", "dp=2,tp=2,sp"},     {"llama-tiny", "pp=2,tp=2,microbatches=3"},
      {"evoformer-tiny", "dp=2,dap=2"},
  };
  testing::ForEachBaselineRun(
      workloads,
      [](const std::string& name, const ScheduledProgram& sp, const Timeline& t, const CostModel& cost) {
        EXPECT_GE(t.makespan_us, ComputeLowerBound(sp.program, cost).lower_bound_us * (1 - 1e-9)) << name;
        EXPECT_GE(t.makespan_us, ComputeLowerBound(sp.program, cost, false).lower_bound_us * (1 - 1e-9)) << name;
      },
      [](const Program& p, const CostModel& cost) {
        ConcertoOptions o;
        o.rounds = 1;
        o.block_ops = 60;
        o.window_fail_limit = 20;
        ConcertoReport report;
        Result<ScheduledProgram> sp = RunConcerto(p, cost, o, &report);
        ASSERT_TRUE(sp.ok()) << sp.status().message();
        Result<Timeline> t = Simulate(*sp, cost);
        ASSERT_TRUE(t.ok());
        EXPECT_GE(t->makespan_us, ComputeLowerBound(sp->program, cost).lower_bound_us * (1 - 1e-9)) << "concerto";
      });
}

}  // namespace
}  // namespace concerto
