// Simulator properties beyond the golden timelines: representatives equal a
// full simulation, lower bound below makespan, critical path well-formed,
// deadlocks reported (never a hang), exposure arithmetic.
#include <gtest/gtest.h>

#include "concerto/cost/cluster.h"
#include "concerto/cost/cost_model.h"
#include "concerto/lower/synthetic.h"
#include "concerto/report/report.h"
#include "concerto/sim/memory.h"
#include "concerto/schedule/scheduler.h"
#include "concerto/sim/simulator.h"
#include "concerto/sim/jitter.h"
#include "test_ops_util.h"

namespace concerto {
namespace {

AnalyticCostModel SimCost() { return AnalyticCostModel(LoadCluster("a800-4x8").value()); }

TEST(Simulator, RepresentativeEqualsAllRanks) {
  SyntheticSpec spec;
  spec.num_ops = 400;
  spec.ranks = 4;
  ScheduledProgram sp{SyntheticProgram(spec), {}};
  sp.schedule = ProgramOrderSchedule(sp.program, "fifo");
  AnalyticCostModel cost = SimCost();
  Result<Timeline> rep = Simulate(sp, cost);
  SimOptions all;
  all.all_ranks = true;
  Result<Timeline> full = Simulate(sp, cost, all);
  ASSERT_TRUE(rep.ok()) << rep.status().message();
  ASSERT_TRUE(full.ok()) << full.status().message();
  EXPECT_TRUE(rep->representative);
  EXPECT_EQ(rep->ranks.size(), 1u);
  EXPECT_EQ(full->ranks.size(), 4u);
  EXPECT_DOUBLE_EQ(rep->makespan_us, full->makespan_us);
}

TEST(Simulator, LowerBoundBelowMakespanForEveryBaseline) {
  SyntheticSpec spec;
  spec.num_ops = 300;
  spec.ranks = 8;
  Program p = SyntheticProgram(spec);
  AnalyticCostModel cost = SimCost();
  LowerBound lb = ComputeLowerBound(p, cost);
  EXPECT_GT(lb.lower_bound_us, 0);
  for (const auto& name : BaselineNames()) {
    SCOPED_TRACE(name);
    Result<ScheduledProgram> sp = RunBaseline(name, p, cost);
    ASSERT_TRUE(sp.ok()) << sp.status().message();
    ASSERT_TRUE(VerifySchedule(sp->program, sp->schedule).empty());
    Result<Timeline> t = Simulate(*sp, cost);
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_GE(t->makespan_us + 1e-6, lb.lower_bound_us);
    Summary s = Summarize(*sp, *t, cost);
    EXPECT_GE(s.exposed_comm_us, 0);
    EXPECT_LE(s.exposed_comm_us, s.comm_busy_us + 1e-6);
  }
}

TEST(Simulator, CriticalPathIsAChainEndingAtMakespan) {
  SyntheticSpec spec;
  spec.num_ops = 200;
  spec.ranks = 2;
  ScheduledProgram sp{SyntheticProgram(spec), {}};
  sp.schedule = ProgramOrderSchedule(sp.program, "fifo");
  AnalyticCostModel cost = SimCost();
  Result<Timeline> t = Simulate(sp, cost);
  ASSERT_TRUE(t.ok());
  ASSERT_FALSE(t->critical_path.empty());
  const auto& recs = t->records;
  EXPECT_DOUBLE_EQ(recs[t->critical_path.back()].end_us, t->makespan_us);
  EXPECT_DOUBLE_EQ(recs[t->critical_path.front()].start_us, 0);
  // Each op on the path starts when the previous one ends (no gap): the path
  // explains the whole makespan.
  for (size_t k = 1; k < t->critical_path.size(); ++k)
    EXPECT_NEAR(recs[t->critical_path[k]].start_us, recs[t->critical_path[k - 1]].end_us, 1e-6);
}

TEST(Simulator, MismatchedCollectivesAcrossRolesAreAnError) {
  // Rank 0 issues an all-reduce of 16 bytes where rank 1 issues one of 64.
  Program p;
  p.mesh.axes = {{"dp", 2}};
  for (int r = 0; r < 2; ++r) {
    Graph g;
    g.name = "g" + std::to_string(r);
    g.tensors = {Tensor{"x", {4}, DType::kF32, {{}}, {}}, Tensor{"y", {4}, DType::kF32, {{}}, {}}};
    Op op;
    op.id = 0;
    op.name = "ar";
    op.kind = OpKind::kCollective;
    op.stream = "comm";
    op.group.axes = {"dp"};
    op.inputs = {"x"};
    op.outputs = {"y"};
    op.message_bytes = r == 0 ? 16 : 64;
    op.duration_us = 1;
    g.ops = {op};
    p.graphs.push_back(g);
    p.roles.push_back({g.name, g.name, {r}});
  }
  ScheduledProgram sp{p, ProgramOrderSchedule(p, "fifo")};
  AnalyticCostModel cost = SimCost();
  Result<Timeline> t = Simulate(sp, cost);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("mismatched communication"), std::string::npos) << t.status().message();
}

TEST(Simulator, ExposedCommArithmetic) {
  // compute |a 0-10|          |c 30-35|
  // comm           |ar 10-30|
  // b is absent: the all-reduce is fully exposed, 20 of 20 us.
  Program p;
  p.mesh.axes = {{"dp", 2}};
  Graph g;
  g.name = "main";
  for (const char* n : {"x", "g", "s", "o"}) g.tensors.push_back(Tensor{n, {4}, DType::kF32, {{}}, {}});
  Op a;
  a.id = 0, a.name = "a", a.stream = "compute", a.compute_type = ComputeType::kScale;
  a.inputs = {"x"}, a.outputs = {"g"}, a.duration_us = 10;
  Op ar;
  ar.id = 1, ar.name = "ar", ar.kind = OpKind::kCollective, ar.stream = "comm", ar.group.axes = {"dp"};
  ar.inputs = {"g"}, ar.outputs = {"s"}, ar.duration_us = 20;
  Op c;
  c.id = 2, c.name = "c", c.stream = "compute", c.compute_type = ComputeType::kScale;
  c.inputs = {"s"}, c.outputs = {"o"}, c.duration_us = 5;
  g.ops = {a, ar, c};
  p.graphs = {g};
  p.roles = {{"spmd", "main", {0, 1}}};
  ScheduledProgram sp{p, ProgramOrderSchedule(p, "fifo")};
  AnalyticCostModel cost = SimCost();
  SimOptions opts;
  opts.interference = 0;
  Result<Timeline> t = Simulate(sp, cost, opts);
  ASSERT_TRUE(t.ok());
  Summary s = Summarize(sp, *t, cost);
  EXPECT_DOUBLE_EQ(s.makespan_us, 35);
  EXPECT_DOUBLE_EQ(s.exposed_comm_us, 20);
  EXPECT_DOUBLE_EQ(s.overlap_ratio, 0);
  EXPECT_DOUBLE_EQ(s.bound.lower_bound_us, 35);  // critical path a -> ar -> c
  ASSERT_EQ(s.top_exposed.size(), 1u);
  EXPECT_EQ(s.top_exposed[0].name, "ar");
  // Memory, each tensor [4] f32 = 16 bytes, held from its producer's start to
  // its last consumer's end (inputs from 0, unconsumed outputs to the end):
  //   x [0, 10)   g [0, 30)   s [10, 35)   o [30, 35)
  // t=0: x+g = 32; t=10: x freed, s allocated = 32; t=30: g freed, o = 32.
  // Frees come first at equal times, so the peak is 32 bytes, first at t=0.
  EXPECT_EQ(s.peak_memory_bytes, 32);
}

TEST(SimulatorTest, DurationsThatOverflowAreAnErrorNotAnInfiniteIteration) {
  // Two ops of 1e308 us each, one after the other: each finite, the sum not.
  using testing::MakeOp;
  using testing::T;
  Program p = testing::OneRoleProgram({{"dp", 1}}, {"compute", "comm"}, {T("x"), T("y"), T("z")},
                                      {MakeOp(0, "a", OpKind::kCompute, "compute", {"x"}, {"y"}, 1e308),
                                       MakeOp(1, "b", OpKind::kCompute, "compute", {"y"}, {"z"}, 1e308)});
  AnalyticCostModel cost = SimCost();
  Result<Timeline> t = Simulate(RunBaseline("fifo", p, cost).value(), cost);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("overflows"), std::string::npos) << t.status().message();
  EXPECT_NE(t.status().message().find("op 0 'a'"), std::string::npos) << t.status().message();
}

// ClusterSpec::compute_jitter: the expected last arrival at a rendezvous.
TEST(Jitter, LargestOfStandardNormals) {
  EXPECT_DOUBLE_EQ(StandardNormalMaxMoments(1).mean, 0);
  EXPECT_DOUBLE_EQ(StandardNormalMaxMoments(1).sd, 1);
  // E max of two: 1 / sqrt(pi); variance 1 - 1 / pi.
  EXPECT_NEAR(StandardNormalMaxMoments(2).mean, 1 / std::sqrt(M_PI), 1e-6);
  EXPECT_NEAR(StandardNormalMaxMoments(2).sd, std::sqrt(1 - 1 / M_PI), 1e-6);
  // n = 3 in closed form; n = 4 and 8 as tabulated (Tippett 1925).
  EXPECT_NEAR(StandardNormalMaxMoments(4).mean, 1.029375, 1e-5);
  EXPECT_NEAR(StandardNormalMaxMoments(8).mean, 1.423600, 1e-5);
  EXPECT_NEAR(StandardNormalMaxMoments(3).mean, 3 / (2 * std::sqrt(M_PI)), 1e-6);
}

TEST(Jitter, ExpectedLastArrival) {
  EXPECT_EQ(ExpectedLastArrival({}), 0);
  // One rank: its own arrival, whatever its spread.
  EXPECT_EQ(ExpectedLastArrival({{100, 10, 1}}), 100);
  // No spread: the latest.
  EXPECT_EQ(ExpectedLastArrival({{100, 0, 1}, {140, 0, 1}}), 140);
  // Two alike: mean + sd / sqrt(pi); one member standing for two the same.
  EXPECT_NEAR(ExpectedLastArrival({{100, 10, 1}, {100, 10, 1}}), 100 + 10 / std::sqrt(M_PI), 1e-9);
  EXPECT_NEAR(ExpectedLastArrival({{100, 10, 2}}), 100 + 10 / std::sqrt(M_PI), 1e-6);
  // Far apart: the later one.
  EXPECT_NEAR(ExpectedLastArrival({{0, 1, 1}, {100, 1, 1}}), 100, 1e-9);
  // Clark's formula, exact for two: N(100, 10^2) and N(90, 9^2).
  EXPECT_NEAR(ExpectedLastArrival({{90, 9, 1}, {100, 10, 1}}), 101.7852075, 1e-6);
  // Never before the latest mean; grows with the members.
  const double four = ExpectedLastArrival({{100, 10, 4}});
  EXPECT_NEAR(four, 100 + 10 * 1.029375, 1e-4);
  EXPECT_GT(four, ExpectedLastArrival({{100, 10, 2}}));
  // Four alike as four members: Clark's approximation, within 2% of the
  // exact largest of four.
  EXPECT_NEAR(ExpectedLastArrival({{100, 10, 1}, {100, 10, 1}, {100, 10, 1}, {100, 10, 1}}), four, 0.2);
}

}  // namespace
}  // namespace concerto
