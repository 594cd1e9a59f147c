// One window of the odd-even method as a resource-constrained project
// scheduling problem, and the solver interface that answers it. Nothing
// outside src/schedule/solver_*.cc includes a solver's headers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "concerto/util/status.h"

namespace concerto {

/// Times are integer ticks (the caller scales microseconds).
struct WindowTask {
  int64_t duration = 0;
  int resource = 0;        // index of the stream (a unary resource)
  int64_t release = 0;     // earliest start
  int64_t deadline = 0;    // latest finish (start + duration <= deadline)
  bool is_comm = false;    // decoding tie-break: communication first
  bool operator==(const WindowTask&) const = default;
};

/// A buffer held in memory over [allocation, release): allocated when its
/// producer task starts (or at the fixed `start` when `producer` is -1) and
/// released when the last of its consumer tasks ends, never before `end`
/// (consumers outside the window) nor before its allocation. Sizes are in
/// the caller's memory units.
struct WindowBuffer {
  int64_t units = 0;
  int producer = -1;
  int64_t start = 0;           // allocation time when producer is -1
  std::vector<int> consumers;  // tasks whose latest end releases it
  int64_t end = 0;             // released no earlier than this
  bool operator==(const WindowBuffer&) const = default;
};

struct WindowProblem {
  std::vector<WindowTask> tasks;
  std::vector<std::pair<int, int>> precedences;  // (before, after): after starts once before ends
  int num_resources = 0;
  /// A known feasible start time per task (the incumbent), or empty.
  std::vector<int64_t> hint;
  /// Memory: the buffers' total size at any time must stay <= capacity (a
  /// cumulative resource). capacity < 0: no memory constraint.
  std::vector<WindowBuffer> buffers;
  int64_t memory_capacity = -1;
  /// Field by field: equal problems get equal answers from a deterministic
  /// solve (the scheduler reuses answers on this).
  bool operator==(const WindowProblem&) const = default;
};

enum class SolveStatus { kOptimal, kFeasible, kInfeasible, kNoSolution };
std::string_view ToString(SolveStatus status);

/// A solver's answer. `status` says what the solver proved: optimal, a
/// feasible answer when the limit hit, infeasible, or nothing found in time.
/// Call failures (bad problem, solver error) are the Result's error instead.
struct WindowSolution {
  SolveStatus status = SolveStatus::kNoSolution;
  std::vector<int64_t> start;  // per task, when status is optimal or feasible
  int64_t objective = 0;       // the window's finish: max(start + duration)
  int64_t bound = 0;           // proven lower bound on the objective
  double gap = 0;              // (objective - bound) / objective
  double seconds = 0;
  /// When the returned answer was found, from the start of the solve (0: the
  /// hint; backends that do not track it report `seconds`).
  double found_s = 0;
  int64_t nodes = 0;           // search nodes explored
  /// The search stopped on the wall-clock limit (the safety net), not on its
  /// deterministic work limit: the answer may depend on machine load.
  bool hit_time_limit = false;
};

struct SolverOptions {
  double time_limit_s = 10;  // wall-clock safety net
  /// Deterministic work limit: Gecode stops after this many failed nodes,
  /// CBC after this many branch-and-bound nodes. 0: no work limit.
  int64_t fail_limit = 0;
  /// Gecode, with a work limit (fail_limit > 0) and a hint: stop after this
  /// many failed nodes while no answer better than the hint has been found
  /// (the hint is then the answer). Answers come early or not at all: on the
  /// quality workloads every window that improved found its first answer
  /// within 2 failures. 0: no such limit.
  int64_t fails_before_answer = 10;
  /// Gecode: the unary (stream) propagators at Gecode's advanced level
  /// (overload checking, detectable precedences, not-first/not-last, edge
  /// finding) or, false, at its basic level (overload checking and
  /// time-tabling): 3-5x cheaper per node on 250-task windows, but far
  /// weaker where deadlines are tight, so the Concerto scheduler keeps the
  /// advanced level (docs/concerto.md, "Speed").
  bool edge_finding = true;
  /// Gecode's search. kDive (the scheduler's default): branch on the start
  /// times (smallest earliest start first, at its minimum) with branch and
  /// bound; cheap per node and finds improvements on the first dive, but it
  /// rarely proves optimality where several resources interact. kRank: an
  /// order variable per pair of tasks on a resource (which goes first),
  /// branched by accumulated failure count with Luby restarts, then the
  /// start times; proves 100-task, 10-resource job-shop windows optimal in
  /// seconds (docs/solvers.md, "Hard windows") at O(k^2) variables for k
  /// tasks on a resource. CBC ignores it.
  enum class Search { kDive, kRank };
  Search search = Search::kDive;
  uint64_t seed = 1;
};

/// A solver backend (Gecode CP or CBC ILP).
class WindowSolver {
 public:
  virtual ~WindowSolver() = default;
  virtual std::string name() const = 0;
  /// Whether two instances may solve at the same time on two threads.
  virtual bool thread_safe() const { return false; }
  virtual Result<WindowSolution> Solve(const WindowProblem& problem, const SolverOptions& options) = 0;
};

/// "gecode" or "cbc"; an error naming the known backends otherwise.
Result<std::unique_ptr<WindowSolver>> MakeWindowSolver(const std::string& name);
std::vector<std::string> WindowSolverNames();

/// Independent check of an answer: every violated release, deadline,
/// precedence or resource overlap, one line each; also a wrong objective.
std::vector<std::string> VerifyWindowSolution(const WindowProblem& problem, const WindowSolution& solution);

/// The largest total size of buffers held at one time under `start` (0
/// without buffers), with the time it first occurs. Releases come before
/// allocations at equal times.
struct WindowMemoryPeak {
  int64_t units = 0;
  int64_t time = 0;
};
WindowMemoryPeak PeakWindowMemory(const WindowProblem& problem, const std::vector<int64_t>& start);

/// Checks a problem before solving: sizes, indices, non-negative durations,
/// release + duration <= deadline for every task, buffer fields.
Status ValidateWindowProblem(const WindowProblem& problem);

/// A lower bound on the objective of every feasible answer, independent of
/// any solver: heads (releases pushed along precedences) plus tails (work that
/// must follow along precedences), and per resource the largest
/// `h + work on it of the tasks with head >= h and tail >= q + q` over every
/// pair of thresholds (Carlier's one-machine bound).
/// Includes the per-resource load bound (min release + total duration).
/// Requires a valid problem.
int64_t WindowLowerBound(const WindowProblem& problem);

/// LeftShiftStarts when the result stays within the memory capacity, else
/// `start` unchanged (moving a producer earlier lengthens its buffer).
std::vector<int64_t> LeftShiftWithinMemory(const WindowProblem& problem, const std::vector<int64_t>& start);

/// The left-shifted schedule of `start`: tasks are taken in order of start
/// (ties in precedence order) and each starts as early as its release, its
/// predecessors and the previous task on its resource allow. When `start` is
/// feasible the result is feasible and no task starts later. Zero-duration
/// tasks do not occupy their resource. Requires a valid problem.
std::vector<int64_t> LeftShiftStarts(const WindowProblem& problem, const std::vector<int64_t>& start);

// ---- Shared by the backends (src/schedule/solver_*.cc) ----

/// What every backend computes before searching.
struct WindowPreparation {
  std::vector<int> topo_order;      // tasks, predecessors first (smallest index first)
  std::vector<int64_t> earliest_start;  // per task: release pushed along precedences
  std::vector<int64_t> latest_start;    // per task: deadline/horizon pulled back along precedences
  int64_t lower_bound = 0;          // WindowLowerBound
  int64_t horizon = 0;              // some optimal answer finishes every task by then
  bool infeasible = false;          // proven before search (a time window is empty)
  std::vector<int64_t> hint;        // the hint, left-shifted (empty when none)
  int64_t hint_objective = 0;       // its finish
};

/// Validates the problem and the hint (an infeasible hint is an error) and
/// computes the preparation.
Result<WindowPreparation> PrepareWindow(const WindowProblem& problem);

/// What a backend's search returned.
struct WindowSearchOutcome {
  std::vector<int64_t> start;  // the best schedule the search found, or empty
  bool exhausted = false;      // the search proved there is nothing better
  int64_t bound = 0;           // the search's own lower bound (0 when none)
  int64_t nodes = 0;
  bool hit_time_limit = false; // stopped by the wall clock, not the work limit
  double found_s = -1;         // when `start` was found (-1: not tracked)
};

/// Turns a search outcome into the answer: keeps the better of the found
/// schedule and the hint, left-shifts it, sets status, objective, bound and
/// gap, and verifies it (a schedule failing verification is an error).
Result<WindowSolution> FinishWindowSolution(const WindowProblem& problem, const WindowPreparation& prep,
                                            const WindowSearchOutcome& outcome, double seconds);

/// The backends behind MakeWindowSolver ("gecode", "cbc").
std::unique_ptr<WindowSolver> NewGecodeWindowSolver();
std::unique_ptr<WindowSolver> NewCbcWindowSolver();

}  // namespace concerto
