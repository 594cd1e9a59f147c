// The concerto search's window answers: the cache of the last solve at each
// place (a deterministic solve gives an identical problem the same answer),
// and the speculation executor that solves the next windows of a pass on a
// helper thread while the main thread solves the current one. Speed only:
// neither changes a schedule (tests/schedule/concerto_speed_test.cc).
// Internal to src/schedule/.
#pragma once

#include <deque>
#include <future>
#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "concerto/schedule/window_solver.h"

namespace concerto::search {

/// Where a window sits: role, pass, first block.
using Place = std::tuple<int, int, int>;

/// The last solve at each place, answered again when the problem there is
/// identical field by field.
class WindowSolveCache {
 public:
  /// The remembered answer at `place` when its problem equals `problem`, else null.
  const WindowSolution* Find(const Place& place, const WindowProblem& problem) const;
  void Remember(const Place& place, const WindowProblem& problem, const WindowSolution& solution);

 private:
  std::map<Place, std::pair<WindowProblem, WindowSolution>> memo_;
};

/// A window solved ahead on the helper thread.
struct Speculation {
  int first_block = 0;
  WindowProblem problem;
  std::shared_future<Result<WindowSolution>> answer;
};

/// Runs batches of window solves on one helper thread with a solver of its
/// own. A new batch starts only once the last one finished, so how many
/// windows are solved ahead depends on timing; what a deterministic solve
/// answers does not.
class SpeculationExecutor {
 public:
  /// `solver` null: never speculates (enabled() is false).
  explicit SpeculationExecutor(std::unique_ptr<WindowSolver> solver) : solver_(std::move(solver)) {}
  ~SpeculationExecutor() { Wait(); }
  SpeculationExecutor(const SpeculationExecutor&) = delete;
  SpeculationExecutor& operator=(const SpeculationExecutor&) = delete;

  bool enabled() const { return solver_ != nullptr; }
  /// No batch is running.
  bool Idle() const;
  /// Starts solving `problems` ((first block, problem) in order) on the
  /// helper thread with `options`; returns one Speculation per problem whose
  /// answer becomes ready as the helper gets to it. Requires Idle().
  std::deque<Speculation> Start(std::vector<std::pair<int, WindowProblem>> problems, const SolverOptions& options);
  /// Waits for the running batch, if any.
  void Wait();

 private:
  std::unique_ptr<WindowSolver> solver_;
  std::future<void> run_;
};

}  // namespace concerto::search
