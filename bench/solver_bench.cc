// Window solver backends side by side (docs/solvers.md): random 2-stream
// windows of N tasks, precedence density 3/N, durations 1..100 ticks, solved
// by Gecode and by CBC with a 10 s limit. Modes: 0 cold (releases 0, no
// hint), 1 warm (releases 0, the list schedule in topological order as the
// hint), 2 warm with random releases in [0, 25 N] (about half a stream's
// work, so the lower bound is less often tight). One iteration each.
//   ./build/concerto_bench --benchmark_filter=Solver
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "concerto/schedule/window_solver.h"

namespace concerto {
namespace {

/// The benchmark window of n tasks in `mode` (seeded by n and mode, so every
/// backend sees the same one).
WindowProblem SolverBenchWindow(int n, int mode) {
  std::mt19937_64 rng(1000 * mode + n);
  std::uniform_int_distribution<int64_t> duration(1, 100), release(0, 25 * int64_t{n});
  std::uniform_int_distribution<int> stream(0, 1);
  std::bernoulli_distribution edge(3.0 / n);
  WindowProblem p;
  p.num_resources = 2;
  for (int i = 0; i < n; ++i) {
    const int64_t d = duration(rng);
    const int s = stream(rng);
    p.tasks.push_back({d, s, mode == 2 ? release(rng) : 0, int64_t{1} << 40});
  }
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j)
      if (edge(rng)) p.precedences.push_back({i, j});
  if (mode > 0) p.hint = LeftShiftStarts(p, std::vector<int64_t>(n, 0));
  return p;
}

/// Solves the window of state.range(0) tasks in mode state.range(1) with
/// `backend`; counters: seconds, objective, bound, gap, status (0 optimal,
/// 1 feasible, 2 infeasible, 3 no solution; also the label), nodes, the
/// lower bound and the hint's objective (0 when cold).
void BM_SolverWindow(benchmark::State& state, const std::string& backend) {
  const int n = static_cast<int>(state.range(0));
  const int mode = static_cast<int>(state.range(1));
  const WindowProblem p = SolverBenchWindow(n, mode);
  Result<std::unique_ptr<WindowSolver>> solver = MakeWindowSolver(backend);
  if (!solver.ok()) {
    state.SkipWithError(solver.status().message().c_str());
    return;
  }
  SolverOptions options;
  options.time_limit_s = 10;
  WindowSolution last;
  for (auto _ : state) {
    Result<WindowSolution> s = (*solver)->Solve(p, options);
    if (!s.ok()) {
      state.SkipWithError(s.status().message().c_str());
      return;
    }
    last = std::move(s).value();
  }
  state.counters["tasks"] = n;
  state.counters["seconds"] = last.seconds;
  state.counters["objective"] = static_cast<double>(last.objective);
  state.counters["bound"] = static_cast<double>(last.bound);
  state.counters["gap"] = last.gap;
  state.counters["status"] = static_cast<double>(static_cast<int>(last.status));
  state.counters["nodes"] = static_cast<double>(last.nodes);
  state.counters["lower_bound"] = static_cast<double>(WindowLowerBound(p));
  int64_t hint_objective = 0;
  for (size_t i = 0; i < p.hint.size(); ++i) hint_objective = std::max(hint_objective, p.hint[i] + p.tasks[i].duration);
  state.counters["hint"] = static_cast<double>(hint_objective);
  state.SetLabel(std::string(ToString(last.status)) + (mode == 0 ? " cold" : mode == 1 ? " warm" : " warm+release"));
}

BENCHMARK_CAPTURE(BM_SolverWindow, gecode, std::string("gecode"))
    ->ArgsProduct({{20, 60, 100, 250, 400}, {0, 1, 2}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_SolverWindow, cbc, std::string("cbc"))
    ->ArgsProduct({{20, 60, 100, 250, 400}, {0, 1, 2}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

/// A harder family, where the lower bound is often not tight: n tasks on
/// `streams` streams, precedence probability 0.1 per pair, durations
/// 1..100, releases 0, the list schedule as the hint; seeds 0..count-1.
WindowProblem SolverHardWindow(int n, int streams, int seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> duration(1, 100);
  std::uniform_int_distribution<int> stream(0, streams - 1);
  std::bernoulli_distribution edge(0.1);
  WindowProblem p;
  p.num_resources = streams;
  for (int i = 0; i < n; ++i) {
    const int64_t d = duration(rng);
    const int s = stream(rng);
    p.tasks.push_back({d, s, 0, int64_t{1} << 40});
  }
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j)
      if (edge(rng)) p.precedences.push_back({i, j});
  p.hint = LeftShiftStarts(p, std::vector<int64_t>(n, 0));
  return p;
}

/// Solves state.range(2) hard windows of state.range(0) tasks on
/// state.range(1) streams with a 2 s limit each; counters: how many were
/// proved optimal, mean and max gap, mean objective / lower bound, max seconds.
void BM_SolverHardWindows(benchmark::State& state, const std::string& backend) {
  const int n = static_cast<int>(state.range(0)), streams = static_cast<int>(state.range(1));
  const int count = static_cast<int>(state.range(2));
  Result<std::unique_ptr<WindowSolver>> solver = MakeWindowSolver(backend);
  if (!solver.ok()) {
    state.SkipWithError(solver.status().message().c_str());
    return;
  }
  SolverOptions options;
  options.time_limit_s = 2;
  int optimal = 0;
  double gap_sum = 0, gap_max = 0, ratio_sum = 0, seconds_max = 0;
  for (auto _ : state) {
    for (int seed = 0; seed < count; ++seed) {
      const WindowProblem p = SolverHardWindow(n, streams, seed);
      Result<WindowSolution> s = (*solver)->Solve(p, options);
      if (!s.ok()) {
        state.SkipWithError(s.status().message().c_str());
        return;
      }
      optimal += s->status == SolveStatus::kOptimal;
      gap_sum += s->gap;
      gap_max = std::max(gap_max, s->gap);
      ratio_sum += static_cast<double>(s->objective) / static_cast<double>(WindowLowerBound(p));
      seconds_max = std::max(seconds_max, s->seconds);
    }
  }
  state.counters["windows"] = count;
  state.counters["optimal"] = optimal;
  state.counters["mean_gap"] = gap_sum / count;
  state.counters["max_gap"] = gap_max;
  state.counters["mean_obj_over_lb"] = ratio_sum / count;
  state.counters["max_seconds"] = seconds_max;
}

BENCHMARK_CAPTURE(BM_SolverHardWindows, gecode, std::string("gecode"))
    ->Args({30, 2, 20})
    ->Args({60, 3, 12})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_SolverHardWindows, cbc, std::string("cbc"))
    ->Args({30, 2, 20})
    ->Args({60, 3, 12})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace concerto
