// The Gecode backend's two deterministic work limits: the overall fail
// limit, and the shorter one that applies while no answer better than the
// hint has been found (SolverOptions::fails_before_answer).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "concerto/schedule/window_solver.h"

namespace concerto {
namespace {

constexpr int64_t kFar = int64_t{1} << 40;
constexpr int N = 80;  // tasks per problem in AHintNothingBeatsStopsTheSearchEarly

/// n tasks on 2 resources with random durations, releases in [0, 5n) and
/// forward precedences.
WindowProblem Random(std::mt19937_64& rng, int n) {
  WindowProblem p;
  p.num_resources = 2;
  std::uniform_int_distribution<int64_t> dur(1, 20), rel(0, 5 * n - 1);
  std::uniform_int_distribution<int> res(0, 1);
  std::bernoulli_distribution edge(3.0 / n);
  for (int i = 0; i < n; ++i) p.tasks.push_back({dur(rng), res(rng), rel(rng), kFar, false});
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j)
      if (edge(rng)) p.precedences.push_back({i, j});
  return p;
}

/// Tasks one at a time in index order (a topological order), each at its
/// release at the earliest: feasible.
std::vector<int64_t> IndexOrder(const WindowProblem& p) {
  std::vector<int64_t> start(p.tasks.size());
  int64_t t = 0;
  for (size_t i = 0; i < p.tasks.size(); ++i) start[i] = t = std::max(t, p.tasks[i].release), t += p.tasks[i].duration;
  return start;
}

/// max(start + duration).
int64_t Finish(const WindowProblem& p, const std::vector<int64_t>& start) {
  int64_t f = 0;
  for (size_t i = 0; i < start.size(); ++i) f = std::max(f, start[i] + p.tasks[i].duration);
  return f;
}

/// One Gecode solve with the two work limits (0: none).
WindowSolution Solve(const WindowProblem& p, int64_t fail_limit, int64_t before_answer) {
  auto solver = MakeWindowSolver("gecode");
  EXPECT_TRUE(solver.ok());
  SolverOptions o;
  o.time_limit_s = 60;
  o.fail_limit = fail_limit;
  o.fails_before_answer = before_answer;
  Result<WindowSolution> s = (*solver)->Solve(p, o);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? *s : WindowSolution{};
}

TEST(WindowFailLimits, AHintNothingBeatsStopsTheSearchEarly) {
  // The best answer of a 100-failure search as the hint: where a 400-failure
  // search cannot beat it either, it only fails, and with fails_before_answer
  // 2 it stops after 3 failures instead of 400, with the same answer (the
  // hint, left-shifted).
  std::mt19937_64 rng(3);
  int early = 0;
  for (int k = 0; k < 10; ++k) {
    WindowProblem p = Random(rng, N);
    p.hint = Solve(p, 100, 0).start;
    ASSERT_FALSE(p.hint.empty());
    WindowSolution full = Solve(p, 400, 0), cut = Solve(p, 400, 2);
    if (full.objective < Finish(p, p.hint)) continue;  // the longer search found better: not this case
    EXPECT_EQ(cut.start, full.start);
    EXPECT_LE(cut.nodes, full.nodes);
    if (cut.nodes < full.nodes) ++early;
  }
  EXPECT_GT(early, 0) << "no search needed more than 2 failures to give up: the test proves nothing";
}

TEST(WindowFailLimits, OnceAnAnswerIsFoundOnlyTheFailLimitApplies) {
  // A poor hint (one task at a time, which left-shifting turns into the
  // index-order list schedule): where the search beats it, it found an answer
  // and from then on searched exactly as without the early limit.
  std::mt19937_64 rng(4);
  int beaten = 0;
  for (int k = 0; k < 12; ++k) {
    WindowProblem p = Random(rng, 80);
    p.hint = IndexOrder(p);
    WindowSolution a = Solve(p, 50, 1), b = Solve(p, 50, 0);
    if (a.objective >= Finish(p, LeftShiftStarts(p, p.hint))) continue;
    ++beaten;
    EXPECT_EQ(a.start, b.start);
    EXPECT_EQ(a.nodes, b.nodes);
  }
  EXPECT_GT(beaten, 0) << "the search never beat the hint: the test proves nothing";
}

TEST(WindowFailLimits, WithoutAHintOrAFailLimitItDoesNotApply) {
  // Nothing to fall back on (no hint), or a proof asked for (no fail
  // limit): the search runs as if the limit were 0.
  std::mt19937_64 rng(5);
  WindowProblem p = Random(rng, 40);
  WindowSolution a = Solve(p, 50, 1), b = Solve(p, 50, 0);
  EXPECT_EQ(a.start, b.start);
  EXPECT_EQ(a.nodes, b.nodes);
  p.hint = IndexOrder(p);
  WindowSolution c = Solve(p, 0, 1), d = Solve(p, 0, 0);
  EXPECT_EQ(c.start, d.start);
  EXPECT_EQ(c.status, d.status);
}

TEST(WindowFailLimits, BothPropagationLevelsProveTheSameOptimum) {
  // Without a work limit the search is complete at either level: the same
  // optimal finish, both proven (the basic level may need more nodes).
  std::mt19937_64 rng(6);
  for (int k = 0; k < 10; ++k) {
    WindowProblem p = Random(rng, 12);
    auto solver = MakeWindowSolver("gecode");
    ASSERT_TRUE(solver.ok());
    SolverOptions strong, basic;
    basic.edge_finding = false;
    Result<WindowSolution> a = (*solver)->Solve(p, strong), b = (*solver)->Solve(p, basic);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->status, SolveStatus::kOptimal);
    EXPECT_EQ(b->status, SolveStatus::kOptimal);
    EXPECT_EQ(a->objective, b->objective);
    EXPECT_TRUE(VerifyWindowSolution(p, *b).empty());
  }
}

}  // namespace
}  // namespace concerto
