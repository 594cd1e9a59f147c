// The constraint-programming backend: one Gecode model per window. A start
// variable per task, one unary resource constraint per stream, precedences as
// linear constraints, and the window's finish minimised by branch and bound.
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include <gecode/int.hh>
#include <gecode/minimodel.hh>
#include <gecode/search.hh>
#pragma GCC diagnostic pop

#include "concerto/schedule/window_solver.h"

namespace concerto {
namespace {

/// Search nodes after which a solve stops even within its time limit (a
/// safety net; the time limit is the intended stop).
constexpr unsigned long kNodeLimit = 50'000'000;

/// Stops the search when either the time or the node limit is reached.
class TimeOrNodeStop : public Gecode::Search::Stop {
 public:
  TimeOrNodeStop(unsigned long ms, unsigned long nodes) : time_(ms), nodes_(nodes) {}
  /// True once either limit is reached.
  bool stop(const Gecode::Search::Statistics& s, const Gecode::Search::Options& o) override {
    return time_.stop(s, o) || nodes_.stop(s, o);
  }

 private:
  Gecode::Search::TimeStop time_;
  Gecode::Search::NodeStop nodes_;
};

/// The window as a Gecode space. Times are shifted by `offset` (the earliest
/// head) so that they fit Gecode's 32-bit domains.
class WindowSpace : public Gecode::IntMinimizeSpace {
 public:
  WindowSpace(const WindowProblem& problem, const WindowPreparation& prep, int64_t offset)
      : start_(*this, static_cast<int>(problem.tasks.size())) {
    PostStarts(problem, prep, offset);
    PostResources(problem);
    PostPrecedences(problem);
    PostMakespan(problem, prep, offset);
    PostBranching(problem, prep);
  }
  WindowSpace(WindowSpace& other) : Gecode::IntMinimizeSpace(other) {
    start_.update(*this, other.start_);
    makespan_.update(*this, other.makespan_);
  }
  /// Gecode's cloning hook.
  Gecode::Space* copy() override { return new WindowSpace(*this); }
  /// The objective: the window's finish.
  Gecode::IntVar cost() const override { return makespan_; }
  /// The assigned start times, shifted back by `offset`.
  std::vector<int64_t> Starts(int64_t offset) const {
    std::vector<int64_t> start(start_.size());
    for (int i = 0; i < start_.size(); ++i) start[i] = offset + start_[i].val();
    return start;
  }

 private:
  /// Start domains [earliest start, latest start].
  void PostStarts(const WindowProblem& problem, const WindowPreparation& prep, int64_t offset) {
    for (size_t i = 0; i < problem.tasks.size(); ++i)
      start_[i] = Gecode::IntVar(*this, static_cast<int>(prep.earliest_start[i] - offset),
                                 static_cast<int>(prep.latest_start[i] - offset));
  }
  /// One unary constraint per resource over its tasks of positive duration.
  void PostResources(const WindowProblem& problem) {
    std::vector<Gecode::IntVarArgs> starts(problem.num_resources);
    std::vector<Gecode::IntArgs> durations(problem.num_resources);
    for (size_t i = 0; i < problem.tasks.size(); ++i) {
      const WindowTask& t = problem.tasks[i];
      if (t.duration == 0) continue;
      starts[t.resource] << start_[i];
      durations[t.resource] << static_cast<int>(t.duration);
    }
    for (int r = 0; r < problem.num_resources; ++r)
      if (starts[r].size() > 1) Gecode::unary(*this, starts[r], durations[r]);
  }
  /// start[after] >= start[before] + duration[before].
  void PostPrecedences(const WindowProblem& problem) {
    for (const auto& [before, after] : problem.precedences)
      Gecode::rel(*this, start_[before] + static_cast<int>(problem.tasks[before].duration) <= start_[after]);
  }
  /// makespan >= every finish, within [lower bound, hint - 1] (strictly better
  /// than the hint) or [lower bound, horizon] without one.
  void PostMakespan(const WindowProblem& problem, const WindowPreparation& prep, int64_t offset) {
    const int64_t upper = prep.hint.empty() ? prep.horizon : prep.hint_objective - 1;
    makespan_ = Gecode::IntVar(*this, static_cast<int>(prep.lower_bound - offset), static_cast<int>(upper - offset));
    for (size_t i = 0; i < problem.tasks.size(); ++i)
      Gecode::rel(*this, start_[i] + static_cast<int>(problem.tasks[i].duration) <= makespan_);
  }
  /// Smallest earliest start first, at that value; ties go to the earlier
  /// task in the hint, then the smaller index. Then the makespan at its min.
  void PostBranching(const WindowProblem& problem, const WindowPreparation& prep) {
    std::vector<int> order(problem.tasks.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    if (!prep.hint.empty())
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return prep.hint[a] < prep.hint[b]; });
    Gecode::IntVarArgs vars;
    for (int i : order) vars << start_[i];
    Gecode::branch(*this, vars, Gecode::INT_VAR_MIN_MIN(), Gecode::INT_VAL_MIN());
    Gecode::branch(*this, makespan_, Gecode::INT_VAL_MIN());
  }

  Gecode::IntVarArray start_;
  Gecode::IntVar makespan_;
};

/// Checks that every shifted time fits Gecode's domains.
Status CheckRange(const WindowPreparation& prep, int64_t offset) {
  const int64_t span = prep.horizon - offset;
  if (span > Gecode::Int::Limits::max / 2)
    return Status::Error("gecode: the window spans " + std::to_string(span) +
                         " ticks, more than Gecode's 32-bit domains hold; use a coarser time unit");
  return Status::Ok();
}

/// Runs branch and bound on the model and reports the best schedule found.
WindowSearchOutcome Search(const WindowProblem& problem, const WindowPreparation& prep, int64_t offset,
                           const SolverOptions& options) {
  WindowSearchOutcome outcome;
  auto root = std::make_unique<WindowSpace>(problem, prep, offset);
  const double ms = std::max(1.0, options.time_limit_s * 1e3);
  TimeOrNodeStop stop(static_cast<unsigned long>(std::min(ms, 1e12)), kNodeLimit);
  Gecode::Search::Options o;
  o.threads = 1;
  o.stop = &stop;
  Gecode::BAB<WindowSpace> engine(root.get(), o);
  std::unique_ptr<WindowSpace> best;
  while (WindowSpace* s = engine.next()) best.reset(s);
  outcome.exhausted = !engine.stopped();
  outcome.nodes = static_cast<int64_t>(engine.statistics().node);
  if (best) outcome.start = best->Starts(offset);
  return outcome;
}

/// The Gecode backend.
class GecodeWindowSolver : public WindowSolver {
 public:
  std::string name() const override { return "gecode"; }

  /// Solves the window; Gecode exceptions become errors.
  Result<WindowSolution> Solve(const WindowProblem& problem, const SolverOptions& options) override {
    const auto t0 = std::chrono::steady_clock::now();
    if (!(options.time_limit_s > 0)) return Status::Error("gecode: time_limit_s must be positive");
    Result<WindowPreparation> prep = PrepareWindow(problem);
    if (!prep.ok()) return prep.status();
    WindowSearchOutcome outcome;
    outcome.exhausted = prep->infeasible;
    if (!prep->infeasible && !ProvenByHint(*prep)) {
      Result<WindowSearchOutcome> searched = GuardedSearch(problem, *prep, options);
      if (!searched.ok()) return searched.status();
      outcome = std::move(searched).value();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return FinishWindowSolution(problem, *prep, outcome, seconds);
  }

 private:
  /// The hint already meets the lower bound: nothing to search.
  static bool ProvenByHint(const WindowPreparation& prep) {
    return !prep.hint.empty() && prep.hint_objective <= prep.lower_bound;
  }

  /// Search with the range check, converting Gecode exceptions to errors.
  static Result<WindowSearchOutcome> GuardedSearch(const WindowProblem& problem, const WindowPreparation& prep,
                                                   const SolverOptions& options) {
    int64_t offset = 0;
    for (size_t i = 0; i < problem.tasks.size(); ++i)
      offset = i == 0 ? prep.earliest_start[i] : std::min(offset, prep.earliest_start[i]);
    CONCERTO_RETURN_IF_ERROR(CheckRange(prep, offset));
    try {
      return Search(problem, prep, offset, options);
    } catch (const Gecode::Exception& e) {
      return Status::Error(std::string("gecode: ") + e.what());
    } catch (const std::exception& e) {
      return Status::Error(std::string("gecode: ") + e.what());
    }
  }
};

}  // namespace

std::unique_ptr<WindowSolver> NewGecodeWindowSolver() { return std::make_unique<GecodeWindowSolver>(); }

}  // namespace concerto
