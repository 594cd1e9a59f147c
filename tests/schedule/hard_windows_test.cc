// Hard windows (issue 16): generated job shops and multi-resource projects of
// 50-150 tasks whose optima the rank search proved (SolverOptions::Search::
// kRank, exhausted, stored below). The rank search must prove each again
// under a work limit (failed nodes; no wall clock decides anything here),
// and no search may ever beat a stored optimum. Timings are in
// docs/solvers.md ("Hard windows"; `concerto_quality --hard-windows`).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include "concerto/cost/cluster.h"
#include "concerto/cost/cost_model.h"
#include "concerto/schedule/concerto_scheduler.h"
#include "concerto/schedule/window_batch.h"
#include "concerto/schedule/window_instances.h"
#include "test_ops_util.h"

namespace concerto {
namespace {

struct Stored {
  const char* kind;  // "job-shop" (jobs x machines) or "project" (tasks on resources, up to 2 predecessors)
  int a, b;
  uint32_t seed;
  int64_t optimum;
};

// Proven by the rank search without limits (each under 2 s here).
const Stored kStored[] = {
    {"job-shop", 10, 10, 1, 798}, {"job-shop", 10, 10, 2, 834}, {"job-shop", 10, 10, 3, 893},
    {"job-shop", 5, 10, 1, 674},  {"job-shop", 10, 5, 1, 661},  {"project", 50, 10, 1, 562},
    {"project", 100, 10, 1, 777}, {"project", 150, 10, 1, 1151},
};

WindowProblem Make(const Stored& s) {
  return std::string(s.kind) == "job-shop" ? JobShopWindow(s.a, s.b, s.seed) : RandomUnaryWindow(s.a, s.b, 2, s.seed);
}

SolverOptions WorkLimited(SolverOptions::Search search, int64_t fails) {
  SolverOptions o;
  o.search = search;
  o.fail_limit = fails;
  o.fails_before_answer = 0;
  o.time_limit_s = 3600;  // never the stop: the fail limit is
  return o;
}

std::string Name(const Stored& s) {
  return std::string(s.kind) + " " + std::to_string(s.a) + "x" + std::to_string(s.b) + " seed " +
         std::to_string(s.seed);
}

TEST(HardWindows, TheGeneratorsAreWhatTheirCommentsSay) {
  // Job shop: every job visits every machine once, in a chain.
  WindowProblem js = JobShopWindow(4, 3, 9);
  ASSERT_EQ(js.tasks.size(), 12u);
  EXPECT_EQ(js.precedences.size(), 4u * 2);
  int64_t total = 0;
  for (int j = 0; j < 4; ++j) {
    std::vector<bool> seen(3, false);
    for (int k = 0; k < 3; ++k) {
      const WindowTask& t = js.tasks[j * 3 + k];
      EXPECT_GE(t.duration, 1);
      EXPECT_LE(t.duration, 99);
      seen[t.resource] = true;
      total += t.duration;
    }
    EXPECT_EQ(seen, std::vector<bool>(3, true)) << "job " << j;
  }
  EXPECT_EQ(js.tasks[0].deadline, total);
  EXPECT_TRUE(ValidateWindowProblem(js).ok());
  // The same seed gives the same instance; another seed another.
  EXPECT_TRUE(JobShopWindow(4, 3, 9) == js);
  EXPECT_FALSE(JobShopWindow(4, 3, 10) == js);
  // Projects: predecessors come earlier, at most max_preds each.
  WindowProblem pr = RandomUnaryWindow(40, 5, 2, 3);
  std::vector<int> preds(40, 0);
  for (const auto& [b, a] : pr.precedences) {
    EXPECT_LT(b, a);
    preds[a]++;
  }
  for (int n : preds) EXPECT_LE(n, 2);
  EXPECT_TRUE(ValidateWindowProblem(pr).ok());
}

TEST(HardWindows, TheRankSearchProvesEveryStoredOptimumUnderAWorkLimit) {
  std::unique_ptr<WindowSolver> gecode = MakeWindowSolver("gecode").value();
  for (const Stored& s : kStored) {
    const WindowProblem p = Make(s);
    Result<WindowSolution> r = gecode->Solve(p, WorkLimited(SolverOptions::Search::kRank, 1'000'000));
    ASSERT_TRUE(r.ok()) << Name(s) << ": " << r.status().message();
    EXPECT_FALSE(r->hit_time_limit) << Name(s);
    EXPECT_EQ(r->status, SolveStatus::kOptimal) << Name(s);
    EXPECT_EQ(r->objective, s.optimum) << Name(s);
    EXPECT_EQ(r->bound, s.optimum) << Name(s);
    EXPECT_TRUE(VerifyWindowSolution(p, *r).empty()) << Name(s);
  }
}

TEST(HardWindows, NoSearchBeatsAStoredOptimumAndTheDiveProvesLess) {
  // The dive (the scheduler's default search) on the 10x10 job shops: it
  // stops at the fail limit above the optimum, its bound below it.
  std::unique_ptr<WindowSolver> gecode = MakeWindowSolver("gecode").value();
  int proven = 0;
  for (const Stored& s : kStored) {
    const WindowProblem p = Make(s);
    Result<WindowSolution> r = gecode->Solve(p, WorkLimited(SolverOptions::Search::kDive, 5'000));
    ASSERT_TRUE(r.ok()) << Name(s) << ": " << r.status().message();
    EXPECT_GE(r->objective, s.optimum) << Name(s);
    EXPECT_LE(r->bound, s.optimum) << Name(s);
    proven += r->status == SolveStatus::kOptimal;
    if (s.a == 10 && s.b == 10) EXPECT_EQ(r->status, SolveStatus::kFeasible) << Name(s);
  }
  EXPECT_LT(proven, static_cast<int>(std::size(kStored)));
}

TEST(HardWindows, TheRankSearchRefusesWindowsWithTooManyOrders) {
  // 700 tasks on one resource: 700 * 699 / 2 = 244650 order variables.
  WindowProblem p = RandomUnaryWindow(700, 1, 0, 1);
  Result<WindowSolution> r =
      MakeWindowSolver("gecode").value()->Solve(p, WorkLimited(SolverOptions::Search::kRank, 10));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "gecode: the rank search needs 244650 order variables for this window, more than 200000; use the dive "
            "search or smaller windows");
}

/// The job shop as a program: one rank, a stream per machine, each task an
/// op of its duration (us) reading its job's previous task's output.
Program JobShopProgram(const WindowProblem& js, int machines) {
  std::vector<std::string> streams;
  for (int m = 0; m < machines; ++m) streams.push_back("m" + std::to_string(m));
  std::vector<Tensor> tensors;
  std::vector<Op> ops;
  for (size_t i = 0; i < js.tasks.size(); ++i) {
    const bool first = i % machines == 0;
    const std::string in = first ? "in" + std::to_string(i) : "t" + std::to_string(i - 1);
    if (first) tensors.push_back(testing::T(in));
    tensors.push_back(testing::T("t" + std::to_string(i)));
    ops.push_back(testing::MakeOp(static_cast<int>(i), "task" + std::to_string(i), OpKind::kCompute,
                                  streams[js.tasks[i].resource], {in}, {"t" + std::to_string(i)},
                                  static_cast<double>(js.tasks[i].duration)));
  }
  return testing::OneRoleProgram({{"dp", 1}}, streams, tensors, ops);
}

TEST(HardWindows, ConcertoWithTheRankSearchReachesAJobShopsOptimum) {
  // The case: a 100-op program on 10 one-op-at-a-time streams.
  // One window holds every op (two blocks of 50); the rank search proves
  // the stored optimum, 798 us, in the scheduler as in the solver.
  const Program p = JobShopProgram(JobShopWindow(10, 10, 1), 10);
  AnalyticCostModel cost(LoadCluster("a800-4x8").value());
  ConcertoOptions o;
  o.block_ops = 50;
  o.window_search = 1;
  o.window_fail_limit = 1'000'000;
  o.window_time_limit_s = 3600;
  o.fuse = false;
  ConcertoReport report;
  Result<ScheduledProgram> sp = RunConcerto(p, cost, o, &report);
  ASSERT_TRUE(sp.ok()) << sp.status().message();
  EXPECT_NEAR(report.final_makespan_us, 798, 1e-6);
  ASSERT_FALSE(report.windows.empty());
  EXPECT_EQ(report.windows[0].tasks, 100);
  EXPECT_EQ(report.windows[0].status, SolveStatus::kOptimal);
  // The default search (dive, 50 failures per window) on the same windows
  // stays above.
  o.window_search = 0;
  o.window_fail_limit = ConcertoOptions{}.window_fail_limit;
  ConcertoReport dive;
  ASSERT_TRUE(RunConcerto(p, cost, o, &dive).ok());
  EXPECT_GT(dive.final_makespan_us, 798 + 1) << "the dive reached the optimum; the case shows nothing";
  std::printf("job shop 10x10 #1 in the scheduler: rank %.0f us, dive %.0f us (incumbent %s at %.0f us)\n",
              report.final_makespan_us, dive.final_makespan_us, report.incumbent.c_str(),
              report.incumbent_makespan_us);
}

TEST(HardWindows, MemoryOfManyBuffersIsCoarsenedNotRefused) {
  // A two-machine flow shop of 300 jobs (a_j on stream 0, then b_j on
  // stream 1; durations 1..1000), the hint in a bad order (longest a first),
  // each a_j's output a 2^20-unit buffer held until b_j ends, capacity 2^29.
  // Gecode's cumulative refuses to post when capacity x (sum of the start
  // domains' widths) x tasks overflows 64 bits: about 2^29 x (300 x 3e5) x
  // 300 = 1.4e19 here. Such windows used to fail ("cumulative: Number out of
  // limits") and keep their order; the solver now coarsens the units and
  // searches, without claiming a proof.
  std::mt19937 rng(5);
  WindowProblem p;
  p.num_resources = 2;
  std::vector<std::pair<int64_t, int64_t>> jobs;
  for (int j = 0; j < 300; ++j) jobs.push_back({1 + rng() % 1000, 1 + rng() % 1000});
  std::sort(jobs.begin(), jobs.end(), [](auto x, auto y) { return x.first > y.first; });
  int64_t t0 = 0, t1 = 0;
  for (int j = 0; j < 300; ++j) {
    const int a = static_cast<int>(p.tasks.size());
    p.tasks.push_back({jobs[j].first, 0, 0, 0, false});
    p.tasks.push_back({jobs[j].second, 1, 0, 0, false});
    p.precedences.push_back({a, a + 1});
    p.hint.push_back(t0);
    t0 += jobs[j].first;
    t1 = std::max(t1, t0);
    p.hint.push_back(t1);
    t1 += jobs[j].second;
    p.buffers.push_back({int64_t{1} << 20, a, 0, {a + 1}, 0});
  }
  for (WindowTask& t : p.tasks) t.deadline = 2 * t1;
  p.memory_capacity = int64_t{1} << 29;
  Result<WindowSolution> r =
      MakeWindowSolver("gecode").value()->Solve(p, WorkLimited(SolverOptions::Search::kDive, 50));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_LT(r->objective, t1) << "the search did not improve on the hint";
  EXPECT_NE(r->status, SolveStatus::kOptimal) << "a coarsened model proves nothing";
  EXPECT_TRUE(VerifyWindowSolution(p, *r).empty());
}

TEST(HardWindows, TheWireFormatCarriesTheSearch) {
  WindowProblem p = JobShopWindow(2, 2, 1);
  Result<DecodedWindowBatch> d = DecodeWindowBatch(EncodeWindowBatch({&p}, WorkLimited(SolverOptions::Search::kRank, 5)));
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->options.search, SolverOptions::Search::kRank);
  d = DecodeWindowBatch(EncodeWindowBatch({&p}, WorkLimited(SolverOptions::Search::kDive, 5)));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->options.search, SolverOptions::Search::kDive);
}

}  // namespace
}  // namespace concerto
