// The lower bound: a hand-drawn two-stage pipeline where the joined bound
// counts fill and drain, and on the frontends' workloads no baseline and no
// concerto schedule ever beats it.
#include "concerto/sim/lower_bound.h"

#include <gtest/gtest.h>

#include <random>

#include "concerto/cost/cluster.h"
#include "concerto/lower/frontend.h"
#include "concerto/schedule/concerto_scheduler.h"
#include "concerto/schedule/propagation_bound.h"
#include "concerto/schedule/scheduler.h"
#include "concerto/sim/simulator.h"
#include "baseline_runs_util.h"
#include "brute_force_util.h"
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

/// Three ops on three streams, ordered only by control edges (no tensor
/// links them), each 10 us:
///   s0 |A.........|
///   s1            |B.........|
///   s2                       |C.........|   -> 30
/// Counting data edges alone the bound would be 10 (the longest op); the
/// machine model honours control edges, so every bound counts them.
Program ControlChain() {
  Program p;
  p.mesh.axes = {{"dp", 1}};
  using testing::MakeOp;
  using testing::T;
  Graph g;
  g.name = "main";
  g.streams = {"s0", "s1", "s2"};
  g.tensors = {T("x"), T("a"), T("y"), T("b"), T("z"), T("c")};
  g.ops = {MakeOp(0, "A", OpKind::kCompute, "s0", {"x"}, {"a"}, 10),
           MakeOp(1, "B", OpKind::kCompute, "s1", {"y"}, {"b"}, 10),
           MakeOp(2, "C", OpKind::kCompute, "s2", {"z"}, {"c"}, 10)};
  g.ops[1].control_deps = {0};
  g.ops[2].control_deps = {1};
  p.graphs = {g};
  p.roles = {{"main", "main", {0}}};
  return p;
}

TEST(LowerBoundTest, CountsControlEdgesLikeDataEdges) {
  AnalyticCostModel cost = Cost();
  const Program p = ControlChain();
  const LowerBound lb = ComputeLowerBound(p, cost);
  EXPECT_DOUBLE_EQ(lb.critical_path_us, 30);
  EXPECT_DOUBLE_EQ(lb.lower_bound_us, 30);
  // The interference overload and the simulated run agree: the makespan is
  // the bound.
  EXPECT_DOUBLE_EQ(ComputeLowerBound(p, cost, 0.0).lower_bound_us, 30);
  Result<ScheduledProgram> sp = RunBaseline("fifo", p, cost);
  ASSERT_TRUE(sp.ok()) << sp.status().message();
  Result<Timeline> t = Simulate(*sp, cost);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_DOUBLE_EQ(t->makespan_us, 30);
  // The propagation bound's model has the control edges too.
  PropagationBoundOptions o;
  o.upper_bound_us = 30;
  Result<PropagationBound> b = ComputePropagationBound(p, cost, o);
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_NEAR(b->bound_us, 30, 0.01);
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

/// Two groups of a {x: 2, y: 2} mesh on one node of the links-1x4 golden
/// cluster (zero latency): collectives over x and over y run on their own
/// streams (comm.x, comm.y) but share the device's NVLink port.
ClusterSpec OneNodeOfFour() {
  return LoadCluster(std::string(CONCERTO_SOURCE_DIR) + "/tests/golden/clusters/links-1x4.yaml").value();
}

/// A program on that mesh: one role on all 4 ranks, streams compute, comm.x, comm.y.
Program XYProgram(std::vector<Tensor> tensors, std::vector<Op> ops) {
  return testing::OneRoleProgram({{"x", 2}, {"y", 2}}, {"compute", "comm.x", "comm.y"}, std::move(tensors),
                                 std::move(ops));
}

TEST(LowerBoundTest, SharedLinkLoadIsABound) {
  // tests/golden/links_shared_nvlink: a (10) feeds two all-reduces of 20 and
  // 30 us on comm.x and comm.y (both only NVLink), c (5) joins them. Per
  // stream the bound is 10 + 30 + 5 = 45; the NVLink port must carry 20 + 30
  // = 50 us of transfer after 10 and before c: 10 + 50 + 5 = 65, the makespan
  // the simulator gives (they share the port at half rate each).
  using testing::MakeOp;
  using testing::T;
  std::vector<Op> ops = {MakeOp(0, "a", OpKind::kCompute, "compute", {"in"}, {"g"}, 10),
                         MakeOp(1, "ar1", OpKind::kCollective, "comm.x", {"g"}, {"g1"}, 20),
                         MakeOp(2, "ar2", OpKind::kCollective, "comm.y", {"g"}, {"g2"}, 30),
                         MakeOp(3, "c", OpKind::kCompute, "compute", {"g1", "g2"}, {"o"}, 5)};
  ops[1].group.axes = {"x"};
  ops[2].group.axes = {"y"};
  Program p = XYProgram({T("in"), T("g"), T("g1"), T("g2"), T("o")}, std::move(ops));
  AnalyticCostModel cost(OneNodeOfFour());
  const LowerBound lb = ComputeLowerBound(p, cost);
  EXPECT_DOUBLE_EQ(lb.stream_load_us, 50);
  EXPECT_EQ(lb.busiest_stream, "link:intra-link.out");
  EXPECT_DOUBLE_EQ(lb.fill_drain_us, 65);
  EXPECT_DOUBLE_EQ(lb.lower_bound_us, 65);
  EXPECT_DOUBLE_EQ(testing::BruteForceOptimum(p, cost), 65);
  // fifo's timeline: each all-reduce ran 20 us past its price (ar1 20 -> 40,
  // ar2 30 -> 50), and the timeline says so.
  Result<Timeline> t = Simulate(RunBaseline("fifo", p, cost).value(), cost);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_DOUBLE_EQ(t->makespan_us, 65);
  EXPECT_NEAR(t->link_sharing_delay_us, 40, 1e-9);
  // Without sharing (topology.share_links false) the bound has no link term
  // to add: the two transfers overlap for free, 10 + 30 + 5 = 45.
  ClusterSpec free_links = OneNodeOfFour();
  free_links.topology.share_links = false;
  AnalyticCostModel free_cost(free_links);
  EXPECT_DOUBLE_EQ(testing::BruteForceOptimum(p, free_cost), 45);
}

TEST(LowerBoundTest, NeverAboveTheOptimumWithSharedLinks) {
  // Random programs of 7 ops on the {x: 2, y: 2} mesh: compute ops and
  // all-reduces over x or y (each group on its own stream, both on NVLink),
  // random explicit durations and data edges. The bound (with its link
  // terms) never exceeds the brute-force optimum under link sharing, and on
  // some programs the link term is what binds.
  using testing::MakeOp;
  using testing::T;
  std::mt19937 rng(7);
  AnalyticCostModel cost(OneNodeOfFour());
  int link_binds = 0;
  for (int trial = 0; trial < 60; ++trial) {
    std::vector<Tensor> tensors = {T("in")};
    std::vector<Op> ops;
    for (int i = 0; i < 7; ++i) {
      const int kind = std::uniform_int_distribution<int>(0, 2)(rng);  // 0 compute, 1 over x, 2 over y
      const std::string out = "t" + std::to_string(i);
      tensors.push_back(T(out));
      std::vector<std::string> in = {"in"};
      if (i > 0) in = {"t" + std::to_string(std::uniform_int_distribution<int>(0, i - 1)(rng))};
      if (kind == 0 && i > 1 && rng() % 2) in.push_back("t" + std::to_string(std::uniform_int_distribution<int>(0, i - 1)(rng)));
      if (kind == 0 && in.size() == 2 && in[0] == in[1]) in.pop_back();
      const double us = std::uniform_int_distribution<int>(1, 20)(rng);
      Op op = MakeOp(i, "op" + std::to_string(i), kind == 0 ? OpKind::kCompute : OpKind::kCollective,
                     kind == 0 ? "compute" : kind == 1 ? "comm.x" : "comm.y", in, {out}, us);
      if (kind != 0) op.group.axes = {kind == 1 ? "x" : "y"};
      ops.push_back(op);
    }
    const Program p = XYProgram(std::move(tensors), std::move(ops));
    const LowerBound lb = ComputeLowerBound(p, cost);
    const double opt = testing::BruteForceOptimum(p, cost);
    ASSERT_GT(opt, 0) << trial;
    EXPECT_LE(lb.lower_bound_us, opt * (1 + 1e-9)) << "trial " << trial;
    link_binds += lb.busiest_stream.rfind("link:", 0) == 0 || lb.fill_drain_stream.rfind("link:", 0) == 0;
  }
  EXPECT_GT(link_binds, 5) << "the link terms never bind; the test would not test much";
}

}  // namespace
}  // namespace concerto
