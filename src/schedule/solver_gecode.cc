// The constraint-programming backend: one Gecode model per window. A start
// variable per task, one unary resource constraint per stream, precedences as
// linear constraints, and the window's finish minimised by branch and bound.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
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

/// Failed nodes after which a solve stops when the caller sets no work limit
/// (the time limit then is the intended stop).
constexpr unsigned long kDefaultFailLimit = 50'000'000;

/// Stops the search at the deterministic fail limits (all failed nodes, and
/// those before the first answer better than the hint) or, as a safety net,
/// at the wall-clock limit; remembers which one fired.
class FailOrTimeStop : public Gecode::Search::Stop {
 public:
  FailOrTimeStop(unsigned long ms, unsigned long fails, unsigned long fails_before_answer)
      : time_(ms), fails_(fails), fails_before_answer_(fails_before_answer) {}
  /// True once a limit is reached.
  bool stop(const Gecode::Search::Statistics& s, const Gecode::Search::Options& o) override {
    if (fails_.stop(s, o)) return true;
    if (!answered_ && s.fail > fails_before_answer_) return true;
    if (time_.stop(s, o)) return time_fired_ = true;
    return false;
  }
  /// The search found an answer: from now on only the overall limits apply.
  void Answered() { answered_ = true; }
  bool time_fired() const { return time_fired_; }

 private:
  Gecode::Search::TimeStop time_;
  Gecode::Search::FailStop fails_;
  unsigned long fails_before_answer_;
  bool answered_ = false;
  bool time_fired_ = false;
};

/// The window as a Gecode space. Times are shifted by `offset` (the earliest
/// head) so that they fit Gecode's 32-bit domains.
class WindowSpace : public Gecode::IntMinimizeSpace {
 public:
  WindowSpace(const WindowProblem& problem, const WindowPreparation& prep, int64_t offset, const SolverOptions& options,
              int64_t memory_scale)
      : start_(*this, static_cast<int>(problem.tasks.size())) {
    PostStarts(problem, prep, offset);
    PostResources(problem, options.edge_finding);
    PostPrecedences(problem);
    PostMemory(problem, prep, offset, memory_scale);
    PostMakespan(problem, prep, offset);
    if (options.search == SolverOptions::Search::kRank) PostOrders(problem);
    PostBranching(problem, prep);
  }
  WindowSpace(WindowSpace& other) : Gecode::IntMinimizeSpace(other) {
    start_.update(*this, other.start_);
    order_.update(*this, other.order_);
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
  /// One unary constraint per resource over its tasks of positive duration,
  /// at Gecode's default (advanced) level (overload checking, detectable precedences,
  /// not-first/not-last, edge finding: four O(n log n) passes over every
  /// task of the stream, blockers included, at each propagation) or, without
  /// `edge_finding`, its basic level (overload checking, time-tabling).
  void PostResources(const WindowProblem& problem, bool edge_finding) {
    std::vector<Gecode::IntVarArgs> starts(problem.num_resources);
    std::vector<Gecode::IntArgs> durations(problem.num_resources);
    for (size_t i = 0; i < problem.tasks.size(); ++i) {
      const WindowTask& t = problem.tasks[i];
      if (t.duration == 0) continue;
      starts[t.resource] << start_[i];
      durations[t.resource] << static_cast<int>(t.duration);
    }
    for (int r = 0; r < problem.num_resources; ++r)
      if (starts[r].size() > 1)
        Gecode::unary(*this, starts[r], durations[r], edge_finding ? Gecode::IPL_DEF : Gecode::IPL_BASIC);
  }
  /// start[after] >= start[before] + duration[before].
  void PostPrecedences(const WindowProblem& problem) {
    for (const auto& [before, after] : problem.precedences)
      Gecode::rel(*this, start_[before] + static_cast<int>(problem.tasks[before].duration) <= start_[after]);
  }
  /// Memory as a cumulative resource of capacity `memory_capacity`: one task
  /// per buffer from its allocation (its producer's start, or fixed) to its
  /// release (the latest of its consumers' ends and its fixed end), a
  /// variable duration.
  /// `scale` memory units make one of the model's (usages rounded up, the
  /// capacity down; MemoryScale).
  void PostMemory(const WindowProblem& problem, const WindowPreparation& prep, int64_t offset, int64_t scale) {
    if (problem.memory_capacity < 0 || problem.buffers.empty()) return;
    const int lo = static_cast<int>(std::min<int64_t>(0, MinBufferTime(problem) - offset));
    const int hi = static_cast<int>(std::max<int64_t>(prep.horizon, MaxBufferTime(problem)) - offset);
    Gecode::IntVarArgs alloc, length, release;
    Gecode::IntArgs units;
    for (const WindowBuffer& b : problem.buffers) {
      if (b.units == 0) continue;
      Gecode::IntVar a = b.producer >= 0 ? start_[b.producer]
                                         : Gecode::IntVar(*this, static_cast<int>(b.start - offset),
                                                          static_cast<int>(b.start - offset));
      Gecode::IntVarArgs ends;
      ends << a << Gecode::IntVar(*this, static_cast<int>(b.end - offset), static_cast<int>(b.end - offset));
      for (int c : b.consumers) {
        Gecode::IntVar e(*this, lo, hi);
        Gecode::rel(*this, e == start_[c] + static_cast<int>(problem.tasks[c].duration));
        ends << e;
      }
      Gecode::IntVar r(*this, lo, hi);
      Gecode::max(*this, ends, r);
      alloc << a;
      length << Gecode::IntVar(*this, 0, hi - lo);
      release << r;
      units << static_cast<int>((b.units + scale - 1) / scale);
    }
    if (alloc.size() > 0)
      Gecode::cumulative(*this, static_cast<int>(problem.memory_capacity / scale), alloc, length, release, units);
  }
  static int64_t MinBufferTime(const WindowProblem& problem) {
    int64_t t = 0;
    for (const WindowBuffer& b : problem.buffers) t = std::min({t, b.start, b.end});
    return t;
  }
  static int64_t MaxBufferTime(const WindowProblem& problem) {
    int64_t t = 0;
    for (const WindowBuffer& b : problem.buffers) t = std::max({t, b.start, b.end});
    return t;
  }
  /// makespan >= every finish, within [lower bound, hint - 1] (strictly better
  /// than the hint) or [lower bound, horizon] without one.
  void PostMakespan(const WindowProblem& problem, const WindowPreparation& prep, int64_t offset) {
    const int64_t upper = prep.hint.empty() ? prep.horizon : prep.hint_objective - 1;
    makespan_ = Gecode::IntVar(*this, static_cast<int>(prep.lower_bound - offset), static_cast<int>(upper - offset));
    for (size_t i = 0; i < problem.tasks.size(); ++i)
      Gecode::rel(*this, start_[i] + static_cast<int>(problem.tasks[i].duration) <= makespan_);
  }
  /// The rank search's order variables: per resource and pair (i, j) of its
  /// tasks with work, o <=> i ends before j starts, !o <=> j ends before i
  /// starts (the unary constraint stays for its edge finding).
  void PostOrders(const WindowProblem& problem) {
    std::vector<std::vector<int>> on(problem.num_resources);
    for (size_t i = 0; i < problem.tasks.size(); ++i)
      if (problem.tasks[i].duration > 0) on[problem.tasks[i].resource].push_back(static_cast<int>(i));
    Gecode::BoolVarArgs orders;
    for (const std::vector<int>& tasks : on)
      for (size_t a = 0; a < tasks.size(); ++a)
        for (size_t b = a + 1; b < tasks.size(); ++b) {
          const int i = tasks[a], j = tasks[b];
          Gecode::BoolVar o(*this, 0, 1);
          Gecode::rel(*this, (start_[i] + static_cast<int>(problem.tasks[i].duration) <= start_[j]) == o);
          Gecode::rel(*this, (start_[j] + static_cast<int>(problem.tasks[j].duration) <= start_[i]) == !o);
          orders << o;
        }
    order_ = Gecode::BoolVarArray(*this, orders);
  }
  /// Rank search: first the order variables (largest accumulated failure
  /// count first, decay 0.99; i before j first). Then, as in the dive:
  /// smallest earliest start first, at that value; ties go to the earlier
  /// task in the hint, then the smaller index. Then the makespan at its min.
  void PostBranching(const WindowProblem& problem, const WindowPreparation& prep) {
    if (order_.size() > 0) Gecode::branch(*this, order_, Gecode::BOOL_VAR_AFC_MAX(0.99), Gecode::BOOL_VAL_MAX());
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
  Gecode::BoolVarArray order_;  // rank search only
  Gecode::IntVar makespan_;
};

/// Memory units per unit of the model's cumulative constraint. Gecode's
/// cumulative (the flexible-duration form) refuses to post, OutOfLimits,
/// when capacity x (sum of the start domains' widths) x (tasks) overflows 64
/// bits (its mul_check): a window of 1,646 buffers over 2 M ticks at 2^24
/// units (llama-7b dp=4,tp=8,sp on commodity-4x8) failed so, and every such
/// window kept its order. Past 2^62 the units are coarsened by the factor
/// that brings the product under it; usages round up and the capacity down,
/// so the coarse model is a restriction: a search on it proves nothing
/// (Search then never reports exhaustion).
int64_t MemoryScale(const WindowProblem& problem, const WindowPreparation& prep) {
  if (problem.memory_capacity < 0 || problem.buffers.empty()) return 1;
  long double widths = 0, tasks = 0;
  for (const WindowBuffer& b : problem.buffers) {
    if (b.units == 0) continue;
    tasks += 1;
    widths += b.producer >= 0 ? static_cast<long double>(prep.latest_start[b.producer] -
                                                         prep.earliest_start[b.producer] + 1)
                              : 1.0L;
  }
  const long double product = static_cast<long double>(std::max<int64_t>(1, problem.memory_capacity)) * widths * tasks;
  constexpr long double kMax = 4611686018427387904.0L;  // 2^62
  if (product <= kMax) return 1;
  return static_cast<int64_t>(std::ceil(product / kMax));
}

/// Order variables above this many make the rank search an error (memory).
constexpr int64_t kMaxOrderVariables = 200'000;

/// The rank search's order variables of `problem`: sum over resources of
/// k (k - 1) / 2 for its k tasks with work.
int64_t OrderVariables(const WindowProblem& problem) {
  std::vector<int64_t> k(problem.num_resources, 0);
  for (const WindowTask& t : problem.tasks)
    if (t.duration > 0) k[t.resource]++;
  int64_t n = 0;
  for (int64_t c : k) n += c * (c - 1) / 2;
  return n;
}

/// Luby restarts of the rank search: this many failures times the sequence.
constexpr unsigned long kRestartScale = 100;

/// Checks that every shifted time fits Gecode's domains.
Status CheckRange(const WindowProblem& problem, const WindowPreparation& prep, int64_t offset) {
  int64_t span = prep.horizon - offset;
  for (const WindowBuffer& b : problem.buffers)
    span = std::max({span, std::abs(b.start - offset), std::abs(b.end - offset)});
  if (span > Gecode::Int::Limits::max / 2)
    return Status::Error("gecode: the window spans " + std::to_string(span) +
                         " ticks, more than Gecode's 32-bit domains hold; use a coarser time unit");
  int64_t units = std::max<int64_t>(0, problem.memory_capacity);
  for (const WindowBuffer& b : problem.buffers) units = std::max(units, b.units);
  if (units > Gecode::Int::Limits::max / 2)
    return Status::Error("gecode: memory of " + std::to_string(units) +
                         " units does not fit Gecode's 32-bit domains; use a coarser memory unit");
  return Status::Ok();
}

/// Runs branch and bound on the model and reports the best schedule found.
WindowSearchOutcome Search(const WindowProblem& problem, const WindowPreparation& prep, int64_t offset,
                           const SolverOptions& options) {
  WindowSearchOutcome outcome;
  const int64_t memory_scale = MemoryScale(problem, prep);
  auto root = std::make_unique<WindowSpace>(problem, prep, offset, options, memory_scale);
  const double ms = std::max(1.0, options.time_limit_s * 1e3);
  const unsigned long fails = options.fail_limit > 0 ? static_cast<unsigned long>(options.fail_limit) : kDefaultFailLimit;
  // The limit before a first answer applies only under a work limit and
  // with a hint to fall back on.
  const bool early_out = options.fail_limit > 0 && options.fails_before_answer > 0 && !prep.hint.empty();
  const unsigned long before_answer = early_out ? static_cast<unsigned long>(options.fails_before_answer) : fails;
  FailOrTimeStop stop(static_cast<unsigned long>(std::min(ms, 1e12)), fails, before_answer);
  Gecode::Search::Options o;
  o.threads = 1;
  o.stop = &stop;
  const auto t0 = std::chrono::steady_clock::now();
  auto run = [&](auto& engine) {
    std::unique_ptr<WindowSpace> best;
    while (WindowSpace* s = engine.next()) {
      best.reset(s);
      stop.Answered();
      outcome.found_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    outcome.exhausted = !engine.stopped();
    outcome.hit_time_limit = engine.stopped() && stop.time_fired();
    outcome.nodes = static_cast<int64_t>(engine.statistics().node);
    if (best) outcome.start = best->Starts(offset);
  };
  if (options.search == SolverOptions::Search::kRank) {
    // Restarts keep the best answer's bound (Space::master constrains each
    // restart by the last solution).
    o.cutoff = Gecode::Search::Cutoff::luby(kRestartScale);
    Gecode::RBS<WindowSpace, Gecode::BAB> engine(root.get(), o);
    run(engine);
  } else {
    Gecode::BAB<WindowSpace> engine(root.get(), o);
    run(engine);
  }
  if (memory_scale > 1) outcome.exhausted = false;  // a restricted model proves nothing
  return outcome;
}

/// The Gecode backend.
class GecodeWindowSolver : public WindowSolver {
 public:
  std::string name() const override { return "gecode"; }
  /// Gecode spaces of separate instances share nothing.
  bool thread_safe() const override { return true; }

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
    CONCERTO_RETURN_IF_ERROR(CheckRange(problem, prep, offset));
    if (options.search == SolverOptions::Search::kRank && OrderVariables(problem) > kMaxOrderVariables)
      return Status::Error("gecode: the rank search needs " + std::to_string(OrderVariables(problem)) +
                           " order variables for this window, more than " + std::to_string(kMaxOrderVariables) +
                           "; use the dive search or smaller windows");
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
