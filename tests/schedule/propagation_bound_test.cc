// The propagation bound: never above the brute-force optimum of small random
// programs (one role with two or three streams, and two roles joined by
// send/recv), higher than the plain bound where streams interact, and never
// above any schedule's makespan on the frontends' workloads. The
// interference bound (sim/lower_bound.h): a hand example, and never above
// the brute-force optimum with interference on.
#include "concerto/schedule/propagation_bound.h"

#include <gtest/gtest.h>

#include <random>

#include "baseline_runs_util.h"
#include "brute_force_util.h"
#include "test_ops_util.h"
#include "concerto/cost/cluster.h"
#include "concerto/ir/verifier.h"
#include "concerto/lower/frontend.h"
#include "concerto/schedule/scheduler.h"
#include "concerto/sim/lower_bound.h"
#include "concerto/sim/simulator.h"

namespace concerto {
namespace {

using testing::BruteForceOptimum;

AnalyticCostModel Cost(const std::string& name = "a800-4x8") { return AnalyticCostModel(LoadCluster(name).value()); }

using testing::MakeOp;
using testing::T;

/// A random duration: mostly whole microseconds, some fractional (the model
/// rounds down to ticks), a few zero.
double RandomDuration(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0, 1);
  const double c = u(rng);
  if (c < 0.08) return 0;
  if (c < 0.4) return 0.5 + 19.5 * u(rng);
  return static_cast<double>(1 + static_cast<int>(20 * u(rng)));
}

/// One role (a 2 x 2 mesh) running a random DAG of `n` ops; collectives go
/// at random onto the comm streams ("comm" over dp, and with three streams
/// "comm2" over tp: one group per stream, so the collective issue order of a
/// group is its stream's order). Each op reads one or two earlier tensors.
Program RandomOneRole(int n, int streams, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  Program p;
  p.mesh.axes = {{"dp", 2}, {"tp", 2}};
  Graph g;
  g.name = "main";
  g.streams = {"compute", "comm"};
  if (streams == 3) g.streams.push_back("comm2");
  g.tensors = {T("x")};
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> ins;
    for (int j = 0; j < i; ++j)
      if (u(rng) < 3.0 / n) ins.push_back("t" + std::to_string(j));
    if (ins.empty()) ins.push_back("x");
    const bool comm = u(rng) < 0.55;
    if (ins.size() > (comm ? 1u : 2u)) ins.resize(comm ? 1 : 2);
    const std::string stream = !comm ? "compute" : (streams == 3 && u(rng) < 0.5 ? "comm2" : "comm");
    g.tensors.push_back(T("t" + std::to_string(i)));
    g.ops.push_back(MakeOp(i, "op" + std::to_string(i), comm ? OpKind::kCollective : OpKind::kCompute, stream, ins,
                           {"t" + std::to_string(i)}, RandomDuration(rng)));
    if (stream == "comm2") g.ops.back().group.axes = {"tp"};
  }
  p.graphs = {g};
  p.roles = {{"spmd", "main", {0, 1, 2, 3}}};
  return p;
}

/// Two stages (ranks 0 and 1). Stage 0 computes a random DAG and sends some
/// of its tensors to stage 1 (same tag twice at times: the k-th send meets
/// the k-th recv); stage 1 receives them, computes, and may send one result
/// back to stage 0, which receives it and computes once more.
Program RandomTwoStages(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  auto pick = [&](const std::vector<std::string>& v) { return v[static_cast<size_t>(u(rng) * v.size())]; };
  Program p;
  p.mesh.axes = {{"pp", 2}};
  Graph g0, g1;
  g0.name = "stage0";
  g1.name = "stage1";
  g0.tensors = {T("x0")};
  g1.tensors = {T("x1")};
  std::vector<std::string> made0 = {"x0"}, made1 = {"x1"};
  auto add = [&](Graph& g, std::vector<std::string>& made, OpKind kind, const std::string& stream,
                 std::vector<std::string> in, bool output, int peer_offset, int tag) {
    const int id = static_cast<int>(g.ops.size());
    std::vector<std::string> out;
    if (output) {
      out.push_back(g.name + "_t" + std::to_string(id));
      g.tensors.push_back(T(out[0]));
      made.push_back(out[0]);
    }
    Op o = MakeOp(id, g.name + "_op" + std::to_string(id), kind, stream, in, out, RandomDuration(rng));
    if (kind == OpKind::kSend || kind == OpKind::kRecv) {
      o.peer.axis = "pp";
      o.peer.offset = peer_offset;
      o.tag = tag;
    }
    g.ops.push_back(o);
  };
  const int computes0 = 2 + static_cast<int>(u(rng) * 2);  // 2-3
  for (int i = 0; i < computes0; ++i) add(g0, made0, OpKind::kCompute, "compute", {pick(made0)}, true, 0, 0);
  const int sends = 1 + static_cast<int>(u(rng) * 2);  // 1-2
  const bool same_tag = u(rng) < 0.5;
  for (int k = 0; k < sends; ++k) {
    add(g0, made0, OpKind::kSend, "comm", {made0[1 + static_cast<size_t>(u(rng) * computes0)]}, false, 1,
        same_tag ? 0 : k);
    add(g1, made1, OpKind::kRecv, "comm", {}, true, -1, same_tag ? 0 : k);
  }
  const int computes1 = 1 + static_cast<int>(u(rng) * 2);  // 1-2
  for (int i = 0; i < computes1; ++i) add(g1, made1, OpKind::kCompute, "compute", {pick(made1)}, true, 0, 0);
  if (u(rng) < 0.6) {  // a result back to stage 0
    add(g1, made1, OpKind::kSend, "comm", {made1.back()}, false, -1, 7);
    add(g0, made0, OpKind::kRecv, "comm", {}, true, 1, 7);
    add(g0, made0, OpKind::kCompute, "compute", {made0.back()}, true, 0, 0);
  }
  p.graphs = {g0, g1};
  p.roles = {{"stage0", "stage0", {0}}, {"stage1", "stage1", {1}}};
  return p;
}

/// One graph ("main", tensors by name) run by both ranks of a dp=2 mesh.
Program OneGraphOnTwoRanks(const std::vector<std::string>& tensors, std::vector<Op> ops) {
  Program p;
  p.mesh.axes = {{"dp", 2}};
  Graph g;
  g.name = "main";
  for (const std::string& t : tensors) g.tensors.push_back(T(t));
  g.ops = std::move(ops);
  p.graphs = {g};
  p.roles = {{"spmd", "main", {0, 1}}};
  return p;
}

/// The hand example: all-reduces A (10 us) and B (1 us) on the comm stream;
/// compute D (13 us) reads A's result, compute E (5 us) reads B's. Whichever
/// all-reduce goes second delays the compute it feeds, and only reasoning
/// over both streams at once sees it.
///
///   plain bound: critical path A -> D = 10 + 13 = 23. Comm: A (head 0,
///   tail 13) and B (head 0, tail 5): A alone 0 + 10 + 13 = 23, both
///   0 + 11 + 5 = 16. Compute: E (head 1), D (head 10), no tails: from
///   h = 1, 1 + 18 = 19; from h = 10, 10 + 13 = 23. So 23.
///   propagation at T = 23: D's latest start is 23 - 13 = 10 and D follows
///   A (ends >= 10), so D runs over [10, 23) and A over [0, 10); B comes after
///   A on comm (>= 10), so E starts at 11 or later and cannot fit beside D
///   on compute: T = 23 fails, and so does every T < 24 (bisection converges
///   on 24 up to 1e-4 relative).
///   optimum 24 (A first would give 28):
///     comm    |B|A.........|
///     compute   |E....|    |D............|   B 0-1, E 1-6, A 1-11, D 11-24
Program HandExample() {
  return OneGraphOnTwoRanks({"x", "a", "b", "d", "e"},
                            {MakeOp(0, "A", OpKind::kCollective, "comm", {"x"}, {"a"}, 10),
                             MakeOp(1, "B", OpKind::kCollective, "comm", {"x"}, {"b"}, 1),
                             MakeOp(2, "D", OpKind::kCompute, "compute", {"a"}, {"d"}, 13),
                             MakeOp(3, "E", OpKind::kCompute, "compute", {"b"}, {"e"}, 5)});
}

/// Carlier's one-machine bound in the plain bound: all-reduces A (10 us)
/// and B (1 us) on comm, C (2 us) after A; compute D (13 us) reads A's result
/// and, through two zero-duration reshapes Z1 -> Z2, B's.
///
///   critical path A -> D = 10 + 13 = 23. Comm from h = 0 with the smallest
///   tail of A, B, C (C's, 0): 0 + 13 + 0 = 13; but A and B both have tail
///   >= 13 (D after each): 0 + 11 + 13 = 24, the optimum:
///     comm    |B|A.........|C.|
///     compute   ...........|D............|   B 0-1, Z1 Z2 at 1, A 1-11, D 11-24
Program PairedExample() {
  return OneGraphOnTwoRanks({"x", "a", "b", "c", "z1", "z2", "d"},
                            {MakeOp(0, "A", OpKind::kCollective, "comm", {"x"}, {"a"}, 10),
                             MakeOp(1, "B", OpKind::kCollective, "comm", {"x"}, {"b"}, 1),
                             MakeOp(2, "C", OpKind::kCollective, "comm", {"a"}, {"c"}, 2),
                             MakeOp(3, "Z1", OpKind::kCompute, "compute", {"b"}, {"z1"}, 0),
                             MakeOp(4, "Z2", OpKind::kCompute, "compute", {"z1"}, {"z2"}, 0),
                             MakeOp(5, "D", OpKind::kCompute, "compute", {"a", "z2"}, {"d"}, 13)});
}

/// The serial rule of the plain bound: D (13 us) reads the results of A
/// (10 us) and B (1 us), both on the comm stream, so D cannot start before
/// both ran one after the other.
///
///   critical path alone: A -> D = 10 + 13 = 23.
///   serial rule: D's head >= min(head A, head B) + 10 + 1 = 11, so 24:
///     comm    |B|A.........|
///     compute              |D............|   A, B 0-11, D 11-24 = optimum
Program SerialExample() {
  return OneGraphOnTwoRanks({"x", "a", "b", "d"}, {MakeOp(0, "A", OpKind::kCollective, "comm", {"x"}, {"a"}, 10),
                                                   MakeOp(1, "B", OpKind::kCollective, "comm", {"x"}, {"b"}, 1),
                                                   MakeOp(2, "D", OpKind::kCompute, "compute", {"a", "b"}, {"d"}, 13)});
}

PropagationBound MustBound(const Program& p, const CostModel& cost, PropagationBoundOptions o = {}) {
  Result<PropagationBound> b = ComputePropagationBound(p, cost, o);
  EXPECT_TRUE(b.ok()) << b.status().message();
  return b.ok() ? *b : PropagationBound{};
}

/// The property: bound <= the brute-force optimum, on every program;
/// `stronger` counts programs where it beats the plain bound.
void CheckNeverAboveOptimum(const Program& p, const CostModel& cost, int* stronger, int* exact) {
  ASSERT_TRUE(VerifyProgram(p).empty()) << VerifyProgram(p)[0];
  const double optimum = BruteForceOptimum(p, cost);
  ASSERT_GT(optimum, 0);
  for (int64_t fails : {-1, 0, 1000}) {  // -1: no search, overload checking and time-tabling only
    PropagationBoundOptions o;
    o.probe_fail_limit = std::max<int64_t>(0, fails);
    if (fails < 0) o.edge_finding_max_ops = 0;
    o.time_budget_s = 30;  // never the stop here: the test must not depend on time
    o.probe_time_limit_s = 30;
    for (double upper : {0.0, optimum}) {
      o.upper_bound_us = upper;
      PropagationBound b = MustBound(p, cost, o);
      EXPECT_FALSE(b.skipped) << b.skip_reason;
      EXPECT_FALSE(b.hit_time_budget);
      EXPECT_LE(b.bound_us, optimum * (1 + 1e-9)) << "fail limit " << fails << ", upper " << upper;
      EXPECT_LE(b.plain_us, optimum * (1 + 1e-9));
      if (fails == 0 && upper == 0) *stronger += b.bound_us > b.plain_us * (1 + 1e-6);
      if (fails > 0 && upper > 0) *exact += std::max(b.bound_us, b.plain_us) > optimum * (1 - 1e-3);
    }
  }
}

TEST(PropagationBoundTest, HandExampleBeatsThePlainBound) {
  AnalyticCostModel cost = Cost();
  Program p = HandExample();
  ASSERT_TRUE(VerifyProgram(p).empty()) << VerifyProgram(p)[0];
  LowerBound plain = ComputeLowerBound(p, cost);
  EXPECT_DOUBLE_EQ(plain.critical_path_us, 23);
  EXPECT_DOUBLE_EQ(plain.stream_load_us, 18);
  EXPECT_DOUBLE_EQ(plain.lower_bound_us, 23);
  PropagationBound b = MustBound(p, cost);
  EXPECT_DOUBLE_EQ(b.plain_us, 23);
  EXPECT_FALSE(b.skipped);
  EXPECT_LE(b.bound_us, 24);
  EXPECT_GE(b.bound_us, 24 * (1 - 2e-4));
  EXPECT_GT(b.probes_infeasible, 0);
  EXPECT_DOUBLE_EQ(BruteForceOptimum(p, cost), 24);
}

TEST(PlainBoundTest, PairedFillDrainDropsTheSmallTails) {
  AnalyticCostModel cost = Cost();
  Program p = PairedExample();
  ASSERT_TRUE(VerifyProgram(p).empty()) << VerifyProgram(p)[0];
  LowerBound plain = ComputeLowerBound(p, cost);
  EXPECT_DOUBLE_EQ(plain.critical_path_us, 23);
  EXPECT_DOUBLE_EQ(plain.stream_load_us, 13);
  EXPECT_DOUBLE_EQ(plain.fill_drain_us, 24);
  EXPECT_DOUBLE_EQ(plain.lower_bound_us, 24);
  EXPECT_EQ(plain.BindingTerm(), "fill+drain");
  EXPECT_DOUBLE_EQ(BruteForceOptimum(p, cost), 24);
}

TEST(PlainBoundTest, SerialRuleCountsPredecessorsOnOneStream) {
  AnalyticCostModel cost = Cost();
  Program p = SerialExample();
  ASSERT_TRUE(VerifyProgram(p).empty()) << VerifyProgram(p)[0];
  LowerBound plain = ComputeLowerBound(p, cost);
  EXPECT_DOUBLE_EQ(plain.critical_path_us, 24);
  EXPECT_DOUBLE_EQ(plain.lower_bound_us, 24);
  EXPECT_DOUBLE_EQ(BruteForceOptimum(p, cost), 24);
}

TEST(PropagationBoundTest, SkipsAboveTheOpCapAndStopsAtTheTimeBudget) {
  AnalyticCostModel cost = Cost();
  Program p = HandExample();
  PropagationBoundOptions o;
  o.max_ops = 3;  // the program has 4
  PropagationBound b = MustBound(p, cost, o);
  EXPECT_TRUE(b.skipped);
  EXPECT_EQ(b.skip_reason, "4 ops, more than max_ops 3");
  EXPECT_EQ(b.probes, 0);
  o = {};
  o.time_budget_s = 0;  // only the root propagation runs
  b = MustBound(p, cost, o);
  EXPECT_TRUE(b.hit_time_budget);
  EXPECT_EQ(b.probes, 1);
  EXPECT_DOUBLE_EQ(b.bound_us, 23);  // nothing proven beyond the plain bound
}

TEST(PropagationBoundTest, RejectsBadOptions) {
  AnalyticCostModel cost = Cost();
  PropagationBoundOptions o;
  o.relative_precision = 0;
  Result<PropagationBound> b = ComputePropagationBound(HandExample(), cost, o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().message(), "propagation bound: relative_precision must be in (0, 1)");
  o = {};
  o.probe_fail_limit = -1;
  b = ComputePropagationBound(HandExample(), cost, o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().message(), "propagation bound: probe_fail_limit must be >= 0");
}

TEST(PropagationBoundTest, NeverAboveTheBruteForceOptimumOneRole) {
  AnalyticCostModel cost = Cost();
  int stronger = 0, exact = 0, cases = 0;
  for (uint64_t seed = 1; seed <= 150; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Program p = RandomOneRole(6 + static_cast<int>(seed % 5), 2 + static_cast<int>(seed % 2), seed);  // 6..10 ops
    CheckNeverAboveOptimum(p, cost, &stronger, &exact);
    ++cases;
  }
  // Not vacuous: propagation beats the plain bound on some programs, and
  // with a search that exhausts it reaches the optimum on most.
  EXPECT_GT(stronger, 0);
  EXPECT_GT(exact, cases / 2);
  std::printf("one role: %d programs, propagation above the plain bound on %d, exact with search on %d\n", cases,
              stronger, exact);
}

/// A decomposed collective, as the decomposition pass writes it: compute X,
/// then k = 2..3 chunks (a compute chunk reading X, its all-reduce chunk on
/// "comm" or, at random, "comm2"), a join adding the all-reduced chunks (a
/// second add for the third),
/// and one or two other ops (a collective on X, a compute op on X or the
/// join) that compete for the streams. Random durations.
Program RandomChunked(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  Program p;
  p.mesh.axes = {{"dp", 2}, {"tp", 2}};
  Graph g;
  g.name = "main";
  g.streams = {"compute", "comm", "comm2"};
  g.tensors = {T("in"), T("x"), T("y")};
  g.ops.push_back(MakeOp(0, "X", OpKind::kCompute, "compute", {"in"}, {"x"}, RandomDuration(rng)));
  const int chunks = 2 + static_cast<int>(u(rng) * 2);
  for (int c = 0; c < chunks; ++c) {
    const std::string k = std::to_string(c);
    g.tensors.push_back(T("m" + k));
    g.tensors.push_back(T("r" + k));
    g.ops.push_back(MakeOp(static_cast<int>(g.ops.size()), "M" + k, OpKind::kCompute, "compute", {"x"}, {"m" + k},
                           RandomDuration(rng)));
    const bool second = u(rng) < 0.25;
    g.ops.push_back(MakeOp(static_cast<int>(g.ops.size()), "R" + k, OpKind::kCollective, second ? "comm2" : "comm",
                           {"m" + k}, {"r" + k}, RandomDuration(rng)));
    if (second) g.ops.back().group.axes = {"tp"};
  }
  // The join: y = r0 + r1 (+ r2 in a second add, two edges from R0 and R1).
  const bool three = chunks == 3;
  if (three) g.tensors.push_back(T("y01"));
  g.ops.push_back(MakeOp(static_cast<int>(g.ops.size()), "J", OpKind::kCompute, "compute", {"r0", "r1"},
                         {three ? "y01" : "y"}, RandomDuration(rng)));
  if (three)
    g.ops.push_back(MakeOp(static_cast<int>(g.ops.size()), "J2", OpKind::kCompute, "compute", {"y01", "r2"}, {"y"},
                           RandomDuration(rng)));
  const int extra = 1 + static_cast<int>(u(rng) * 2);
  for (int e = 0; e < extra; ++e) {
    const std::string k = std::to_string(e);
    const bool comm = u(rng) < 0.5;
    g.tensors.push_back(T("e" + k));
    g.ops.push_back(MakeOp(static_cast<int>(g.ops.size()), "E" + k, comm ? OpKind::kCollective : OpKind::kCompute,
                           comm ? "comm" : "compute", {u(rng) < 0.5 ? "x" : "y"}, {"e" + k}, RandomDuration(rng)));
  }
  p.graphs = {g};
  p.roles = {{"spmd", "main", {0, 1, 2, 3}}};
  return p;
}

/// The longest chain of durations, without any resource reasoning.
double LongestPathUs(const Program& p, const CostModel& cost) {
  const JoinedGraph j = BuildJoinedGraph(p, cost);
  std::vector<double> end(j.dur.size(), 0);
  for (size_t round = 0; round < j.dur.size(); ++round)
    for (size_t i = 0; i < j.dur.size(); ++i) {
      double start = 0;
      for (int q : j.preds[i]) start = std::max(start, end[q]);
      end[i] = start + j.dur[i];
    }
  return *std::max_element(end.begin(), end.end());
}

/// The plain bound's serial rule (a join waits for its chunks to run one
/// after the other on their stream, and mirrored for tails) never goes above
/// the brute-force optimum, without or with interference; and it reaches the
/// optimum on some programs where the critical path alone does not.
TEST(PlainBoundTest, SerialRuleNeverAboveTheBruteForceOptimumOnChunkedCollectives) {
  AnalyticCostModel cost = Cost();
  int tight = 0;
  for (uint64_t seed = 1; seed <= 120; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Program p = RandomChunked(seed);
    ASSERT_TRUE(VerifyProgram(p).empty()) << VerifyProgram(p)[0];
    const double optimum = BruteForceOptimum(p, cost);
    ASSERT_GT(optimum, 0);
    const LowerBound lb = ComputeLowerBound(p, cost);
    EXPECT_LE(lb.lower_bound_us, optimum * (1 + 1e-9));
    tight += lb.lower_bound_us > optimum * (1 - 1e-9) && LongestPathUs(p, cost) < optimum * (1 - 1e-9);
    const double f = seed % 2 == 0 ? 0.5 : 0.2;
    EXPECT_LE(InterferenceBoundUs(p, cost, f), BruteForceOptimum(p, cost, f) * (1 + 1e-9)) << "interference " << f;
  }
  EXPECT_GT(tight, 0);
  std::printf("chunked collectives: the plain bound is the optimum on %d of 120 where the longest path is not\n", tight);
}

TEST(PropagationBoundTest, NeverAboveTheBruteForceOptimumTwoStages) {
  AnalyticCostModel cost = Cost();
  int stronger = 0, exact = 0, cases = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Program p = RandomTwoStages(seed);
    CheckNeverAboveOptimum(p, cost, &stronger, &exact);
    ++cases;
  }
  EXPECT_GT(exact, cases / 2);
  std::printf("two stages: %d programs, propagation above the plain bound on %d, exact with search on %d\n", cases,
              stronger, exact);
}

}  // namespace
}  // namespace concerto

namespace concerto {
namespace {

/// Every baseline on small lowered workloads (pipelines with send/recv
/// included): the simulated makespan is never below the propagation bound
/// (with and without the run's makespan as the top of its search) nor the
/// interference bound of the program that was run.
TEST(PropagationBoundTest, NoScheduleBeatsItOnTheFrontendsWorkloads) {
  const std::vector<std::pair<std::string, std::string>> workloads = {
      {"gpt-tiny", "dp=2,tp=2"},           {"gpt-tiny", "pp=2,dp=2,microbatches=4"},
      {"gpt-tiny", "pp=2,microbatches=6"}, {"gpt-tiny", "zero=3,dp=4"},
      {"llama-tiny", "dp=2,tp=2,sp"},      {"evoformer-tiny", "dp=2,dap=2"},
  };
  testing::ForEachBaselineRun(workloads, [](const std::string& name, const ScheduledProgram& sp, const Timeline& t,
                                             const CostModel& cost) {
    PropagationBoundOptions o;
    o.time_budget_s = 60;  // not the stop: the result must not depend on time
    PropagationBound b = MustBound(sp.program, cost, o);
    EXPECT_FALSE(b.skipped);
    EXPECT_GE(t.makespan_us, b.bound_us * (1 - 1e-9)) << name;
    o.upper_bound_us = t.makespan_us;
    EXPECT_GE(t.makespan_us, MustBound(sp.program, cost, o).bound_us * (1 - 1e-9)) << name;
    EXPECT_GE(t.makespan_us, InterferenceBoundUs(sp.program, cost, cost.cluster().interference) * (1 - 1e-9))
        << name;
  });
}

}  // namespace
}  // namespace concerto

namespace concerto {
namespace {

/// Compute X (10 us) and all-reduce Y (6 us), independent, interference 0.2:
///   bound = 10 + 6 x 0.2 / 1.2 = 11 (plain: the compute stream's 10).
///   Both start at 0; X runs at 1/1.2 while Y is in flight, so by 6 it has
///   done 5 us of work, and the other 5 end it at 11:
///     comm    |Y.....|
///     compute |X(slow)|X....|   -> 11
TEST(InterferenceBoundTest, HandExample) {
  AnalyticCostModel cost = Cost();
  Program p;
  p.mesh.axes = {{"dp", 2}};
  Graph g;
  g.name = "main";
  g.tensors = {T("x"), T("a"), T("b")};
  g.ops = {MakeOp(0, "X", OpKind::kCompute, "compute", {"x"}, {"a"}, 10),
           MakeOp(1, "Y", OpKind::kCollective, "comm", {"x"}, {"b"}, 6)};
  p.graphs = {g};
  p.roles = {{"spmd", "main", {0, 1}}};
  ASSERT_TRUE(VerifyProgram(p).empty()) << VerifyProgram(p)[0];
  EXPECT_DOUBLE_EQ(ComputeLowerBound(p, cost).lower_bound_us, 10);
  std::string role;
  EXPECT_NEAR(InterferenceBoundUs(p, cost, 0.2, &role), 11, 1e-9);
  EXPECT_EQ(role, "spmd");
  EXPECT_DOUBLE_EQ(InterferenceBoundUs(p, cost, 0), 0);
  EXPECT_NEAR(BruteForceOptimum(p, cost, 0.2), 11, 1e-9);
}

/// The threshold and the tail, interference 0.2: compute P (4) feeds
/// compute X (10) and all-reduce Y (6); all-reduce Z (3) reads X.
///   heads P 0, X 4, Y 4, Z 14; tails P 13, X 3 (Z), Y 0, Z 0.
///   plain: critical path P -> X -> Z = 17, compute fill + work + drain
///   4 + 10 + 3 = 17.
///   interference at h = 4: C = 10 (X), A = 6 + 3 (Y, Z on comm), q = 3:
///   4 + 10 + (0.2 x 9 + 3) / 1.2 = 18.
///   optimum 18: X runs slow under Y (4-10: 5 of its 10), ends at 15, Z 15-18.
///     comm        |Y.....|     |Z..|
///     compute |P...|X(slow)|X....|
TEST(InterferenceBoundTest, HandExampleWithThresholdAndTail) {
  AnalyticCostModel cost = Cost();
  Program p;
  p.mesh.axes = {{"dp", 2}};
  Graph g;
  g.name = "main";
  g.tensors = {T("x"), T("p"), T("a"), T("b"), T("c")};
  g.ops = {MakeOp(0, "P", OpKind::kCompute, "compute", {"x"}, {"p"}, 4),
           MakeOp(1, "X", OpKind::kCompute, "compute", {"p"}, {"a"}, 10),
           MakeOp(2, "Y", OpKind::kCollective, "comm", {"p"}, {"b"}, 6),
           MakeOp(3, "Z", OpKind::kCollective, "comm", {"a"}, {"c"}, 3)};
  p.graphs = {g};
  p.roles = {{"spmd", "main", {0, 1}}};
  ASSERT_TRUE(VerifyProgram(p).empty()) << VerifyProgram(p)[0];
  EXPECT_DOUBLE_EQ(ComputeLowerBound(p, cost).lower_bound_us, 17);
  EXPECT_NEAR(InterferenceBoundUs(p, cost, 0.2), 18, 1e-9);
  EXPECT_NEAR(BruteForceOptimum(p, cost, 0.2), 18, 1e-9);
}

TEST(InterferenceBoundTest, NeverAboveTheBruteForceOptimum) {
  AnalyticCostModel cost = Cost();
  int above_plain = 0;
  for (uint64_t seed = 1; seed <= 160; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Program p = seed % 2 == 0 ? RandomOneRole(5 + static_cast<int>(seed % 4), 2 + static_cast<int>(seed % 4 == 0), seed)
                              : RandomTwoStages(seed);
    const double f = seed % 3 == 0 ? 1.0 : seed % 3 == 1 ? 0.2 : 0.5;
    const double optimum = BruteForceOptimum(p, cost, f);
    ASSERT_GT(optimum, 0);
    const double bound = InterferenceBoundUs(p, cost, f);
    EXPECT_LE(bound, optimum * (1 + 1e-9)) << "interference " << f;
    above_plain += bound > ComputeLowerBound(p, cost).lower_bound_us * (1 + 1e-9);
  }
  EXPECT_GT(above_plain, 0);
  std::printf("interference bound above the plain bound on %d of 160 programs\n", above_plain);
}

}  // namespace
}  // namespace concerto
