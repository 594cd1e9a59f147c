// Window solver backends against an exhaustive search, the hint guarantee,
// infeasible and invalid problems, determinism, and the verifier.
#include "concerto/schedule/window_solver.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace concerto {
namespace {

constexpr int64_t kFarDeadline = 1'000'000'000;

/// Exact optimum by depth-first search over schedules built task by task,
/// each task appended to its resource as early as it can go, in nondecreasing
/// start order (every left-shifted schedule arises this way, and some
/// optimum is left-shifted). Prunes by the work left per resource.
class BruteForce {
 public:
  explicit BruteForce(const WindowProblem& p) : p_(p), n_(static_cast<int>(p.tasks.size())) {
    preds_.resize(n_);
    for (const auto& [a, b] : p.precedences) preds_[b].push_back(a);
    end_.assign(n_, 0);
    placed_.assign(n_, 0);
    free_.assign(p.num_resources, std::numeric_limits<int64_t>::min());
    left_.assign(p.num_resources, 0);
    for (const WindowTask& t : p.tasks) left_[t.resource] += t.duration;
  }

  /// The optimum, or nullopt when no schedule meets the deadlines.
  std::optional<int64_t> Optimum() {
    best_ = std::numeric_limits<int64_t>::max();
    Dfs(0, std::numeric_limits<int64_t>::min(), 0);
    if (best_ == std::numeric_limits<int64_t>::max()) return std::nullopt;
    return best_;
  }

 private:
  /// Earliest start of unplaced task i after what is placed.
  int64_t EarliestStart(int i) const {
    int64_t s = p_.tasks[i].release;
    for (int q : preds_[i]) s = std::max(s, end_[q]);
    if (p_.tasks[i].duration > 0) s = std::max(s, free_[p_.tasks[i].resource]);
    return s;
  }
  /// Whether every predecessor of i is placed.
  bool Ready(int i) const {
    for (int q : preds_[i])
      if (!placed_[q]) return false;
    return true;
  }
  /// Lower bound on any completion of the current partial schedule.
  int64_t Bound(int64_t makespan) const {
    for (int r = 0; r < p_.num_resources; ++r)
      if (left_[r] > 0) makespan = std::max(makespan, free_[r] + left_[r]);
    return makespan;
  }
  /// Places every ready task that keeps the start order, recursing.
  void Dfs(int count, int64_t last_start, int64_t makespan) {
    if (count == n_) {
      best_ = std::min(best_, makespan);
      return;
    }
    if (Bound(makespan) >= best_) return;
    for (int i = 0; i < n_; ++i) {
      if (placed_[i] || !Ready(i)) continue;
      const WindowTask& t = p_.tasks[i];
      const int64_t s = EarliestStart(i);
      if (s < last_start || s + t.duration > t.deadline) continue;
      const int64_t saved_free = free_[t.resource];
      placed_[i] = 1;
      end_[i] = s + t.duration;
      if (t.duration > 0) free_[t.resource] = s + t.duration;
      left_[t.resource] -= t.duration;
      Dfs(count + 1, s, std::max(makespan, s + t.duration));
      left_[t.resource] += t.duration;
      free_[t.resource] = saved_free;
      placed_[i] = 0;
    }
  }

  const WindowProblem& p_;
  int n_;
  std::vector<std::vector<int>> preds_;
  std::vector<int64_t> end_, free_, left_;
  std::vector<char> placed_;
  int64_t best_ = 0;
};

/// Random problem: n tasks on `resources` streams, precedence i -> j (i < j)
/// with probability density, durations in [min_dur, max_dur], releases in
/// [0, max_release], far deadlines.
WindowProblem RandomProblem(std::mt19937_64& rng, int n, int resources, double density, int64_t min_dur,
                            int64_t max_dur, int64_t max_release) {
  WindowProblem p;
  p.num_resources = resources;
  std::uniform_int_distribution<int64_t> dur(min_dur, max_dur), rel(0, max_release);
  std::uniform_int_distribution<int> res(0, resources - 1);
  std::bernoulli_distribution edge(std::min(1.0, density));
  for (int i = 0; i < n; ++i) {
    WindowTask t;
    t.duration = dur(rng);
    t.resource = res(rng);
    t.release = rel(rng);
    t.deadline = kFarDeadline;
    p.tasks.push_back(t);
  }
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j)
      if (edge(rng)) p.precedences.push_back({i, j});
  return p;
}

/// A feasible schedule: tasks in index order (a topological order of the
/// generated precedences), each appended to its resource.
std::vector<int64_t> IndexOrderSchedule(const WindowProblem& p) {
  std::vector<int64_t> start(p.tasks.size()), free(p.num_resources, 0);
  std::vector<std::vector<int>> preds(p.tasks.size());
  for (const auto& [a, b] : p.precedences) preds[b].push_back(a);
  for (size_t i = 0; i < p.tasks.size(); ++i) {
    int64_t s = std::max(p.tasks[i].release, free[p.tasks[i].resource]);
    for (int q : preds[i]) s = std::max(s, start[q] + p.tasks[q].duration);
    start[i] = s;
    free[p.tasks[i].resource] = s + p.tasks[i].duration;
  }
  return start;
}

/// max(start + duration).
int64_t Finish(const WindowProblem& p, const std::vector<int64_t>& start) {
  int64_t f = 0;
  for (size_t i = 0; i < start.size(); ++i) f = std::max(f, start[i] + p.tasks[i].duration);
  return f;
}

/// Joins verifier lines for a failure message.
std::string Join(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

/// Solves with the named backend; the call itself must succeed.
/// `limit_s`: the wall-clock safety net; the default (an hour) never fires on
/// these problems, so an answer depends on the work the solver does, not on
/// how loaded the machine is (a 10 s limit made CBC miss optimal at load 7).
WindowSolution SolveWith(const std::string& backend, const WindowProblem& p, double limit_s = 3600) {
  auto solver = MakeWindowSolver(backend);
  EXPECT_TRUE(solver.ok()) << solver.status().message();
  SolverOptions o;
  o.time_limit_s = limit_s;
  Result<WindowSolution> s = (*solver)->Solve(p, o);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? *s : WindowSolution{};
}

TEST(WindowSolverTest, FactoryKnowsBothBackends) {
  EXPECT_EQ(WindowSolverNames(), (std::vector<std::string>{"gecode", "cbc"}));
  for (const std::string& name : WindowSolverNames()) {
    auto solver = MakeWindowSolver(name);
    ASSERT_TRUE(solver.ok());
    EXPECT_EQ((*solver)->name(), name);
  }
}

TEST(WindowSolverTest, FactoryRejectsUnknownName) {
  auto solver = MakeWindowSolver("cplex");
  ASSERT_FALSE(solver.ok());
  EXPECT_NE(solver.status().message().find("cplex"), std::string::npos);
  EXPECT_NE(solver.status().message().find("gecode, cbc"), std::string::npos);
}

TEST(WindowSolverTest, StatusNames) {
  EXPECT_EQ(ToString(SolveStatus::kOptimal), "optimal");
  EXPECT_EQ(ToString(SolveStatus::kFeasible), "feasible");
  EXPECT_EQ(ToString(SolveStatus::kInfeasible), "infeasible");
  EXPECT_EQ(ToString(SolveStatus::kNoSolution), "no-solution");
}

TEST(WindowLowerBoundTest, HandExample) {
  // a(4, r0) -> b(3, r1), and c(5, r0). The path a, b is 7; r0 carries 9.
  WindowProblem p;
  p.num_resources = 2;
  p.tasks = {{4, 0, 0, 100}, {3, 1, 0, 100}, {5, 0, 0, 100}};
  p.precedences = {{0, 1}};
  EXPECT_EQ(WindowLowerBound(p), 9);
  p.tasks[2].release = 6;  // c cannot start before 6: 6 + 5 = 11
  EXPECT_EQ(WindowLowerBound(p), 11);
}

TEST(WindowLowerBoundTest, CountsTheTasksWithLongTailsTogether) {
  // r0 runs x1, x2 and y (5 each); x1 -> t1 (10, r1) and x2 -> t2 (10, r2), so x1 and x2 each have
  // a tail of 10. Whatever the order on r0, the second of x1, x2 ends at 10 at the earliest and its
  // tail follows: 0 + (5 + 5) + 10 = 20, the optimum (x1 0-5, x2 5-10, t1 5-15, t2 10-20, y 10-15).
  // The suffix bound alone (every task of r0 from 0 plus the smallest tail, 0) says 15, as do the
  // paths (5 + 10) and r1's and r2's loads (5 + 10).
  WindowProblem p;
  p.num_resources = 3;
  p.tasks = {{5, 0, 0, 100}, {5, 0, 0, 100}, {5, 0, 0, 100}, {10, 1, 0, 100}, {10, 2, 0, 100}};
  p.precedences = {{0, 3}, {1, 4}};
  EXPECT_EQ(WindowLowerBound(p), 20);
  EXPECT_EQ(BruteForce(p).Optimum(), 20);
}

TEST(WindowLowerBoundTest, NeverAboveTheOptimum) {
  std::mt19937_64 rng(7);
  for (int k = 0; k < 40; ++k) {
    WindowProblem p = RandomProblem(rng, 2 + k % 9, 2, 0.3, 1, 20, k % 2 ? 30 : 0);
    std::optional<int64_t> opt = BruteForce(p).Optimum();
    ASSERT_TRUE(opt.has_value());
    EXPECT_LE(WindowLowerBound(p), *opt) << "problem " << k;
  }
}

TEST(LeftShiftTest, KeepsOrderAndNeverStartsLater) {
  WindowProblem p;
  p.num_resources = 1;
  p.tasks = {{2, 0, 0, 100}, {3, 0, 0, 100}, {0, 0, 5, 100}};
  std::vector<int64_t> shifted = LeftShiftStarts(p, {10, 4, 50});
  EXPECT_EQ(shifted, (std::vector<int64_t>{3, 0, 5}));
}

/// The backends, run through the same tests.
class BackendTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BackendTest, MatchesBruteForceOnRandomSmallProblems) {
  std::mt19937_64 rng(2024);
  int above_bound = 0;  // problems the lower bound alone does not settle
  // 60 problems, then more until at least 5 that the lower bound alone does not settle (Carlier's
  // one-machine bound settles most small ones; the search is what is tested here).
  for (int k = 0; k < 60 || (above_bound < 5 && k < 600); ++k) {
    const int n = 2 + k % 11;
    WindowProblem p = RandomProblem(rng, n, 2, 3.0 / n, 1, 20, 0);
    const int64_t opt = BruteForce(p).Optimum().value();
    above_bound += opt > WindowLowerBound(p);
    WindowSolution s = SolveWith(GetParam(), p);
    ASSERT_EQ(s.status, SolveStatus::kOptimal) << "problem " << k;
    EXPECT_EQ(s.objective, opt) << "problem " << k << " n=" << n;
    EXPECT_EQ(s.bound, s.objective);
    EXPECT_EQ(s.gap, 0.0);
    EXPECT_TRUE(VerifyWindowSolution(p, s).empty()) << Join(VerifyWindowSolution(p, s));
  }
  EXPECT_GE(above_bound, 5) << "the random problems are too easy to test the search";
}

TEST_P(BackendTest, MatchesBruteForceWithReleasesDeadlinesAndZeroDurations) {
  std::mt19937_64 rng(99);
  int infeasible = 0;
  for (int k = 0; k < 60; ++k) {
    const int n = 2 + k % 10;
    WindowProblem p = RandomProblem(rng, n, 1 + k % 3, 3.0 / n, 0, 15, 30);
    // Deadlines around a feasible schedule's finishes: some are too tight.
    std::vector<int64_t> start = IndexOrderSchedule(p);
    std::uniform_int_distribution<int64_t> slack(-8, 25);
    for (size_t i = 0; i < p.tasks.size(); ++i) {
      WindowTask& t = p.tasks[i];
      t.deadline = std::max(t.release + t.duration, start[i] + t.duration + slack(rng));
    }
    std::optional<int64_t> opt = BruteForce(p).Optimum();
    WindowSolution s = SolveWith(GetParam(), p);
    if (!opt) {
      ++infeasible;
      EXPECT_EQ(s.status, SolveStatus::kInfeasible) << "problem " << k;
      EXPECT_TRUE(s.start.empty());
      continue;
    }
    ASSERT_EQ(s.status, SolveStatus::kOptimal) << "problem " << k;
    EXPECT_EQ(s.objective, *opt) << "problem " << k;
    EXPECT_TRUE(VerifyWindowSolution(p, s).empty()) << Join(VerifyWindowSolution(p, s));
  }
  EXPECT_GT(infeasible, 3);
  EXPECT_LT(infeasible, 57);
}

TEST_P(BackendTest, HintWithTinyTimeLimitIsNeverWorse) {
  std::mt19937_64 rng(5);
  for (int k = 0; k < 6; ++k) {
    WindowProblem p = RandomProblem(rng, 120 + 20 * k, 2, 3.0 / 120, 1, 20, 0);
    p.hint = IndexOrderSchedule(p);
    const int64_t hint_objective = Finish(p, p.hint);
    WindowSolution s = SolveWith(GetParam(), p, 0.001);
    ASSERT_TRUE(s.status == SolveStatus::kOptimal || s.status == SolveStatus::kFeasible) << ToString(s.status);
    EXPECT_LE(s.objective, hint_objective);
    EXPECT_LE(s.bound, s.objective);
    EXPECT_TRUE(VerifyWindowSolution(p, s).empty()) << Join(VerifyWindowSolution(p, s));
  }
}

TEST_P(BackendTest, HintAtTheLowerBoundIsOptimalAtOnce) {
  WindowProblem p;
  p.num_resources = 2;
  p.tasks = {{5, 0, 0, kFarDeadline}, {5, 0, 0, kFarDeadline}, {3, 1, 0, kFarDeadline}};
  p.hint = {0, 5, 0};
  WindowSolution s = SolveWith(GetParam(), p);
  EXPECT_EQ(s.status, SolveStatus::kOptimal);
  EXPECT_EQ(s.objective, 10);
  EXPECT_EQ(s.start, p.hint);
}

TEST_P(BackendTest, TightDeadlinesAreInfeasibleNotErrors) {
  WindowProblem overload;  // 20 ticks of work on one resource by time 15
  overload.num_resources = 1;
  overload.tasks = {{10, 0, 0, 15}, {10, 0, 0, 15}};
  EXPECT_EQ(SolveWith(GetParam(), overload).status, SolveStatus::kInfeasible);

  WindowProblem chain = overload;  // 0 -> 1 needs 20 ticks, 1 is due at 18
  chain.tasks = {{10, 0, 0, 30}, {10, 1, 0, 18}};
  chain.num_resources = 2;
  chain.precedences = {{0, 1}};
  EXPECT_EQ(SolveWith(GetParam(), chain).status, SolveStatus::kInfeasible);

  // Needs search: a(5, r0) -> b(5, r1) -> c(5, r0, due 15) forces a into
  // [0, 5], but d(5, r0) is fixed at [3, 8]. No time window is empty and the
  // lower bound (15) fits the horizon, so only the search can tell.
  WindowProblem window;
  window.num_resources = 2;
  window.tasks = {{5, 0, 0, 20}, {5, 1, 0, 20}, {5, 0, 0, 15}, {5, 0, 3, 8}};
  window.precedences = {{0, 1}, {1, 2}};
  ASSERT_TRUE(PrepareWindow(window).ok());
  EXPECT_FALSE(PrepareWindow(window)->infeasible);
  WindowSolution s = SolveWith(GetParam(), window);
  EXPECT_EQ(s.status, SolveStatus::kInfeasible);
  EXPECT_TRUE(s.start.empty());
  window.tasks[3] = {5, 0, 5, 10};  // d at [5, 10] leaves room: a, d, c with b in between
  s = SolveWith(GetParam(), window);
  EXPECT_EQ(s.status, SolveStatus::kOptimal);
  EXPECT_EQ(s.objective, 15);
}

TEST_P(BackendTest, InvalidProblemsAreErrors) {
  auto solver = MakeWindowSolver(GetParam());
  ASSERT_TRUE(solver.ok());
  WindowProblem good;
  good.num_resources = 2;
  good.tasks = {{3, 0, 0, 100}, {4, 1, 0, 100}};
  good.precedences = {{0, 1}};
  struct Case {
    std::string what;
    void (*edit)(WindowProblem&);
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"negative duration", [](WindowProblem& p) { p.tasks[1].duration = -1; }, "task 1: duration -1"},
      {"bad resource", [](WindowProblem& p) { p.tasks[0].resource = 2; }, "task 0: resource 2"},
      {"negative resource", [](WindowProblem& p) { p.tasks[0].resource = -1; }, "task 0: resource -1"},
      {"precedence out of range", [](WindowProblem& p) { p.precedences.push_back({1, 5}); }, "task index 5"},
      {"self precedence", [](WindowProblem& p) { p.precedences.push_back({1, 1}); }, "precedes itself"},
      {"cycle", [](WindowProblem& p) { p.precedences.push_back({1, 0}); }, "cycle: 0 -> 1 -> 0"},
      {"window", [](WindowProblem& p) { p.tasks[0].deadline = 2; }, "task 0: release 0 + duration 3 exceeds"},
      {"hint size", [](WindowProblem& p) { p.hint = {0}; }, "hint has 1 start times for 2 tasks"},
      {"hint infeasible", [](WindowProblem& p) { p.hint = {0, 1}; }, "hint is not a feasible schedule"},
  };
  SolverOptions o;
  for (const Case& c : cases) {
    WindowProblem p = good;
    c.edit(p);
    Result<WindowSolution> s = (*solver)->Solve(p, o);
    ASSERT_FALSE(s.ok()) << c.what;
    EXPECT_NE(s.status().message().find(c.expect), std::string::npos) << c.what << ": " << s.status().message();
  }
  o.time_limit_s = 0;
  EXPECT_FALSE((*solver)->Solve(good, o).ok());
}

TEST_P(BackendTest, SameProblemSameAnswer) {
  // Sizes each backend solves to optimality well within the limit (CBC's
  // big-M model stalls from about 40 tasks; see docs/solvers.md).
  const std::vector<int> sizes = GetParam() == "cbc" ? std::vector<int>{16} : std::vector<int>{16, 200};
  std::mt19937_64 rng(11);
  for (int n : sizes) {
    WindowProblem p = RandomProblem(rng, n, 2, 3.0 / n, 1, 20, 10);
    WindowSolution a = SolveWith(GetParam(), p), b = SolveWith(GetParam(), p);
    EXPECT_EQ(a.status, SolveStatus::kOptimal);
    EXPECT_EQ(a.status, b.status);
    EXPECT_EQ(a.start, b.start);
    EXPECT_EQ(a.objective, b.objective);
    EXPECT_TRUE(VerifyWindowSolution(p, a).empty()) << Join(VerifyWindowSolution(p, a));
  }
}

TEST_P(BackendTest, EmptyProblemIsOptimal) {
  WindowProblem p;
  p.num_resources = 1;
  WindowSolution s = SolveWith(GetParam(), p);
  EXPECT_EQ(s.status, SolveStatus::kOptimal);
  EXPECT_EQ(s.objective, 0);
  EXPECT_TRUE(s.start.empty());
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendTest, ::testing::Values("gecode", "cbc"),
                         [](const auto& info) { return info.param; });

/// Two tasks on r0 and one on r1 after task 0, with a correct schedule.
struct VerifierFixture : ::testing::Test {
  VerifierFixture() {
    p.num_resources = 2;
    p.tasks = {{3, 0, 1, 20}, {4, 0, 0, 20}, {2, 1, 0, 20}};
    p.precedences = {{0, 2}};
    good.status = SolveStatus::kOptimal;
    good.start = {1, 4, 4};
    good.objective = 8;
    good.bound = 8;
  }
  /// The only violation of `s`, or a failure when not exactly one.
  std::string OnlyViolation(const WindowSolution& s) {
    std::vector<std::string> v = VerifyWindowSolution(p, s);
    EXPECT_EQ(v.size(), 1u) << Join(v);
    return v.empty() ? "" : v.front();
  }
  WindowProblem p;
  WindowSolution good;
};

TEST_F(VerifierFixture, AcceptsAFeasibleSchedule) { EXPECT_TRUE(VerifyWindowSolution(p, good).empty()); }

TEST_F(VerifierFixture, FlagsStartBeforeRelease) {
  WindowSolution s = good;
  s.start = {0, 4, 4};  // r0: [0,3) [4,8); release of 0 is 1
  EXPECT_NE(OnlyViolation(s).find("task 0 starts at 0 before its release 1"), std::string::npos);
}

TEST_F(VerifierFixture, FlagsFinishAfterDeadline) {
  WindowSolution s = good;
  s.start = {1, 4, 19};
  s.objective = 21;
  s.bound = 8;
  EXPECT_NE(OnlyViolation(s).find("task 2 finishes at 21 after its deadline 20"), std::string::npos);
}

TEST_F(VerifierFixture, FlagsBrokenPrecedence) {
  WindowSolution s = good;
  s.start = {1, 4, 3};
  EXPECT_NE(OnlyViolation(s).find("precedence 0 -> 2"), std::string::npos);
}

TEST_F(VerifierFixture, FlagsOverlapOnAResource) {
  WindowSolution s = good;
  s.start = {1, 3, 4};  // [1,4) and [3,7) on r0
  s.objective = 7;
  s.bound = 7;
  EXPECT_NE(OnlyViolation(s).find("tasks 0 and 1 overlap on resource 0"), std::string::npos);
}

TEST_F(VerifierFixture, FlagsWrongObjective) {
  WindowSolution s = good;
  s.objective = 9;
  EXPECT_NE(OnlyViolation(s).find("objective 9 is not the latest finish 8"), std::string::npos);
}

TEST_F(VerifierFixture, FlagsWrongSize) {
  WindowSolution s = good;
  s.start = {1, 4};
  EXPECT_NE(OnlyViolation(s).find("start has 2 entries for 3 tasks"), std::string::npos);
}

TEST_F(VerifierFixture, FlagsBoundAboveObjective) {
  WindowSolution s = good;
  s.bound = 9;
  EXPECT_NE(OnlyViolation(s).find("bound 9 exceeds objective 8"), std::string::npos);
}

TEST_F(VerifierFixture, ListsEveryViolation) {
  WindowSolution s = good;
  s.start = {0, 0, 0};  // release of 0, overlap 0/1, precedence 0 -> 2
  s.objective = 4;
  s.bound = 4;
  EXPECT_EQ(VerifyWindowSolution(p, s).size(), 3u) << Join(VerifyWindowSolution(p, s));
}

TEST_F(VerifierFixture, NoAnswerHasNothingToCheck) {
  WindowSolution s;
  s.status = SolveStatus::kInfeasible;
  EXPECT_TRUE(VerifyWindowSolution(p, s).empty());
}

}  // namespace
}  // namespace concerto

namespace concerto {
namespace {

/// Memory as a cumulative resource. Tasks: X (r0, 10) -> G (r1, 30), and
/// P (r0, 10) -> C (r0, 10). Buffer x (1 unit) lives from X's start to G's
/// end, buffer p (2 units) from P's start to C's end.
///
///   unconstrained optimum, 40 ticks, peak 3 at t = 10 (x and p held):
///     r0 |X.........|P.........|C.........|
///     r1            |G.............................|
///   capacity 2: p may not overlap x, so P and C run before X or after G:
///     r0 |P.........|C.........|X.........|
///     r1                                  |G.............................|  60 ticks
WindowProblem MemoryExample(int64_t capacity) {
  WindowProblem p;
  p.num_resources = 2;
  p.tasks = {{10, 0, 0, kFarDeadline}, {30, 1, 0, kFarDeadline}, {10, 0, 0, kFarDeadline}, {10, 0, 0, kFarDeadline}};
  p.precedences = {{0, 1}, {2, 3}};
  p.buffers = {{1, 0, 0, {1}, 0}, {2, 2, 0, {3}, 0}};
  p.memory_capacity = capacity;
  return p;
}

TEST(WindowMemoryTest, PeakOfTheUnconstrainedOptimum) {
  WindowProblem p = MemoryExample(-1);
  // X [0,10) G [10,40) P [10,20) C [20,30): x on [0,40), p on [10,30) -> 3 at t = 10.
  WindowMemoryPeak peak = PeakWindowMemory(p, {0, 10, 10, 20});
  EXPECT_EQ(peak.units, 3);
  EXPECT_EQ(peak.time, 10);
  // P [0,10) C [10,20) X [20,30) G [30,60): p on [0,20), x on [20,60); a
  // release at 20 comes before the allocation at 20 -> peak 2.
  EXPECT_EQ(PeakWindowMemory(p, {20, 30, 0, 10}).units, 2);
}

TEST(WindowMemoryTest, VerifierFlagsMemoryOverCapacity) {
  WindowProblem p = MemoryExample(2);
  WindowSolution s;
  s.status = SolveStatus::kFeasible;
  s.start = {0, 10, 10, 20};
  s.objective = 40;
  std::vector<std::string> v = VerifyWindowSolution(p, s);
  ASSERT_EQ(v.size(), 1u) << Join(v);
  EXPECT_EQ(v[0], "memory: 3 units held at time 10 exceed the capacity 2");
}

TEST(WindowMemoryTest, InvalidBuffersAreErrors) {
  WindowProblem p = MemoryExample(2);
  p.buffers[1].consumers = {7};
  Status s = ValidateWindowProblem(p);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "buffer 1: consumer 7 is out of range [0, 4)");
  p = MemoryExample(2);
  p.buffers[0].units = -1;
  EXPECT_EQ(ValidateWindowProblem(p).message(), "buffer 0: units -1 is outside [0, 2^52]");
}

TEST(WindowMemoryTest, GecodeKeepsMemoryUnderTheCapacity) {
  WindowSolution free = SolveWith("gecode", MemoryExample(-1));
  EXPECT_EQ(free.status, SolveStatus::kOptimal);
  EXPECT_EQ(free.objective, 40);
  EXPECT_EQ(PeakWindowMemory(MemoryExample(-1), free.start).units, 3);

  WindowProblem p = MemoryExample(2);
  WindowSolution s = SolveWith("gecode", p);
  EXPECT_EQ(s.status, SolveStatus::kOptimal);
  EXPECT_EQ(s.objective, 60);
  EXPECT_LE(PeakWindowMemory(p, s.start).units, 2);
  EXPECT_TRUE(VerifyWindowSolution(p, s).empty()) << Join(VerifyWindowSolution(p, s));

  // With a hint at 60 the search proves it optimal (nothing under 60 fits).
  p.hint = {20, 30, 0, 10};
  s = SolveWith("gecode", p);
  EXPECT_EQ(s.status, SolveStatus::kOptimal);
  EXPECT_EQ(s.objective, 60);
}

TEST(WindowMemoryTest, NoScheduleFitsACapacityBelowOneBuffer) {
  // p alone needs 2 units.
  EXPECT_EQ(SolveWith("gecode", MemoryExample(1)).status, SolveStatus::kInfeasible);
}

TEST(WindowMemoryTest, CbcDropsAnswersOverTheCapacity) {
  // The ILP leaves memory out: its 40-tick answer holds 3 units, so the
  // hint (60 ticks, peak 2) stands, and nothing is proven.
  WindowProblem p = MemoryExample(2);
  p.hint = {20, 30, 0, 10};
  WindowSolution s = SolveWith("cbc", p);
  EXPECT_EQ(s.status, SolveStatus::kFeasible);
  EXPECT_EQ(s.objective, 60);
  EXPECT_TRUE(VerifyWindowSolution(p, s).empty()) << Join(VerifyWindowSolution(p, s));
}

TEST(WindowMemoryTest, LeftShiftKeepsMemoryFeasible) {
  // X at 0, G after it; P and C delayed until G ends (60): left-shifting would
  // move P to 10, where it overlaps x.
  WindowProblem p = MemoryExample(2);
  std::vector<int64_t> delayed = {0, 10, 40, 50};
  EXPECT_EQ(LeftShiftStarts(p, delayed), (std::vector<int64_t>{0, 10, 10, 20}));
  EXPECT_EQ(LeftShiftWithinMemory(p, delayed), delayed);
}

}  // namespace
}  // namespace concerto
