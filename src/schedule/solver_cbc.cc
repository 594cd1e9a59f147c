// The integer-linear-programming backend: the window as a disjunctive big-M
// model, solved by COIN-OR CBC (CbcModel over OsiClpSolverInterface).
// Continuous start times, a makespan variable, one ordering binary per pair of
// tasks on the same resource that nothing orders already.
#include <algorithm>
#include <cassert>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wdeprecated-copy"
#include <coin/CbcModel.hpp>
#include <coin/CbcStrategy.hpp>
#include <coin/CoinError.hpp>
#include <coin/CoinPackedMatrix.hpp>
#include <coin/OsiClpSolverInterface.hpp>
#pragma GCC diagnostic pop

#include "concerto/schedule/window_solver.h"
#include "concerto/util/stopwatch.h"

namespace concerto {
namespace {

/// CBC keeps global state in places; one solve at a time in this process.
std::mutex& CbcMutex() {
  static std::mutex mutex;
  return mutex;
}

/// reach[a] has bit b set when a path of precedences leads from a to b.
class Reachability {
 public:
  Reachability(const WindowProblem& problem, const std::vector<int>& topo)
      : words_((problem.tasks.size() + 63) / 64), bits_(problem.tasks.size() * words_, 0) {
    std::vector<std::vector<int>> succs(problem.tasks.size());
    for (const auto& [before, after] : problem.precedences) succs[before].push_back(after);
    for (auto it = topo.rbegin(); it != topo.rend(); ++it)
      for (int s : succs[*it]) {
        Set(*it, s);
        for (size_t w = 0; w < words_; ++w) bits_[*it * words_ + w] |= bits_[s * words_ + w];
      }
  }
  /// Whether a path leads from a to b.
  bool Reaches(int a, int b) const { return (bits_[a * words_ + b / 64] >> (b % 64)) & 1; }

 private:
  void Set(int a, int b) { bits_[a * words_ + b / 64] |= uint64_t{1} << (b % 64); }
  size_t words_;
  std::vector<uint64_t> bits_;
};

/// An ordering binary: y = 1 means `first` runs before `second`.
struct OrderingPair {
  int first = 0;
  int second = 0;
};

/// The ILP in COIN's column/row form.
struct Ilp {
  int makespan_col = 0;
  std::vector<OrderingPair> pairs;  // pair k is column makespan_col + 1 + k
  std::vector<double> col_lower, col_upper, objective;
  std::vector<int> entry_row, entry_col;  // the constraint matrix as triplets
  std::vector<double> entry_value;
  std::vector<double> row_lower;
};

/// Appends the row sum(coef * col) >= rhs.
void AddRow(Ilp* ilp, const std::vector<int>& cols, const std::vector<double>& coefs, double rhs) {
  assert(cols.size() == coefs.size());
  const int row = static_cast<int>(ilp->row_lower.size());
  for (size_t k = 0; k < cols.size(); ++k) {
    ilp->entry_row.push_back(row);
    ilp->entry_col.push_back(cols[k]);
    ilp->entry_value.push_back(coefs[k]);
  }
  ilp->row_lower.push_back(rhs);
}

/// Adds a column with bounds and objective coefficient; returns its index.
int AddColumn(Ilp* ilp, double lower, double upper, double cost) {
  ilp->col_lower.push_back(lower);
  ilp->col_upper.push_back(upper);
  ilp->objective.push_back(cost);
  return static_cast<int>(ilp->col_lower.size()) - 1;
}

/// Start columns (bounded by the time windows) and the makespan column
/// (bounded below by the lower bound, which contains the per-resource load
/// cut, and above by the hint or the horizon).
void AddTimeColumns(const WindowProblem& problem, const WindowPreparation& prep, Ilp* ilp) {
  for (size_t i = 0; i < problem.tasks.size(); ++i)
    AddColumn(ilp, static_cast<double>(prep.earliest_start[i]), static_cast<double>(prep.latest_start[i]), 0.0);
  const int64_t upper = prep.hint.empty() ? prep.horizon : prep.hint_objective;
  ilp->makespan_col =
      AddColumn(ilp, static_cast<double>(prep.lower_bound), static_cast<double>(upper), 1.0);
}

/// Precedences, and makespan >= finish of every task without successors.
void AddPrecedenceRows(const WindowProblem& problem, Ilp* ilp) {
  std::vector<char> has_succ(problem.tasks.size(), 0);
  for (const auto& [before, after] : problem.precedences) {
    has_succ[before] = 1;
    AddRow(ilp, {after, before}, {1.0, -1.0}, static_cast<double>(problem.tasks[before].duration));
  }
  for (size_t i = 0; i < problem.tasks.size(); ++i)
    if (!has_succ[i])
      AddRow(ilp, {ilp->makespan_col, static_cast<int>(i)}, {1.0, -1.0},
             static_cast<double>(problem.tasks[i].duration));
}

/// The disjunction of one pair a, b with y = 1 for "a first":
///   s_b - s_a - M1 y >= p_a - M1   and   s_a - s_b + M2 y >= p_b,
/// with M1 = p_a + lst_a - est_b and M2 = p_b + lst_b - est_a, the smallest
/// big-Ms that leave the relaxed side free (never more than the horizon).
/// Pairs the time windows already order get no binary.
void AddPair(const WindowProblem& problem, const WindowPreparation& prep, int a, int b, Ilp* ilp) {
  const double pa = static_cast<double>(problem.tasks[a].duration), pb = static_cast<double>(problem.tasks[b].duration);
  const double m1 = pa + static_cast<double>(prep.latest_start[a] - prep.earliest_start[b]);
  const double m2 = pb + static_cast<double>(prep.latest_start[b] - prep.earliest_start[a]);
  if (m1 <= 0 || m2 <= 0) return;
  const int y = AddColumn(ilp, 0.0, 1.0, 0.0);
  ilp->pairs.push_back({a, b});
  AddRow(ilp, {b, a, y}, {1.0, -1.0, -m1}, pa - m1);
  AddRow(ilp, {a, b, y}, {1.0, -1.0, m2}, pb);
}

/// Builds the whole ILP.
Ilp BuildIlp(const WindowProblem& problem, const WindowPreparation& prep) {
  Ilp ilp;
  AddTimeColumns(problem, prep, &ilp);
  AddPrecedenceRows(problem, &ilp);
  Reachability reach(problem, prep.topo_order);
  std::vector<std::vector<int>> on(problem.num_resources);
  for (size_t i = 0; i < problem.tasks.size(); ++i)
    if (problem.tasks[i].duration > 0) on[problem.tasks[i].resource].push_back(static_cast<int>(i));
  for (const auto& tasks : on)
    for (size_t x = 0; x < tasks.size(); ++x)
      for (size_t y = x + 1; y < tasks.size(); ++y) {
        const int a = tasks[x], b = tasks[y];
        if (!reach.Reaches(a, b) && !reach.Reaches(b, a)) AddPair(problem, prep, a, b, &ilp);
      }
  return ilp;
}

/// The hint as a full column vector (starts, makespan, orderings).
std::vector<double> HintColumns(const WindowPreparation& prep, const Ilp& ilp) {
  std::vector<double> cols(ilp.col_lower.size(), 0.0);
  for (size_t i = 0; i < prep.hint.size(); ++i) cols[i] = static_cast<double>(prep.hint[i]);
  cols[ilp.makespan_col] = static_cast<double>(prep.hint_objective);
  for (size_t k = 0; k < ilp.pairs.size(); ++k)
    cols[ilp.makespan_col + 1 + k] = prep.hint[ilp.pairs[k].first] < prep.hint[ilp.pairs[k].second] ? 1.0 : 0.0;
  return cols;
}

/// Loads the ILP into a quiet Clp interface with the binaries marked.
void LoadSolver(const Ilp& ilp, OsiClpSolverInterface* solver) {
  std::vector<double> row_upper(ilp.row_lower.size(), solver->getInfinity());
  CoinPackedMatrix rows(false, ilp.entry_row.data(), ilp.entry_col.data(), ilp.entry_value.data(),
                        static_cast<int>(ilp.entry_value.size()));
  rows.setDimensions(static_cast<int>(ilp.row_lower.size()), static_cast<int>(ilp.col_lower.size()));
  solver->loadProblem(rows, ilp.col_lower.data(), ilp.col_upper.data(), ilp.objective.data(),
                      ilp.row_lower.data(), row_upper.data());
  for (size_t k = 0; k < ilp.pairs.size(); ++k) solver->setInteger(ilp.makespan_col + 1 + static_cast<int>(k));
  solver->messageHandler()->setLogLevel(0);
  solver->setHintParam(OsiDoReducePrint, true, OsiHintTry);
}

/// Reads the outcome of a finished branch and bound.
WindowSearchOutcome ReadOutcome(const CbcModel& model, size_t num_tasks) {
  WindowSearchOutcome outcome;
  outcome.exhausted = !model.isAbandoned() && (model.isProvenOptimal() || model.isProvenInfeasible());
  outcome.nodes = model.getNodeCount();
  const double best_possible = model.getBestPossibleObjValue();
  if (std::isfinite(best_possible) && best_possible > 0 && best_possible < 1e15)
    outcome.bound = static_cast<int64_t>(std::ceil(best_possible - 1e-6));
  if (const double* sol = model.bestSolution()) {
    outcome.start.resize(num_tasks);
    for (size_t i = 0; i < num_tasks; ++i) outcome.start[i] = std::llround(sol[i]);
  }
  return outcome;
}

/// Binaries above which CBC's root work is cut down (see ConfigureSearch).
constexpr size_t kLargeIlpPairs = 1000;

/// CBC's default cut generators and heuristics (CbcStrategyDefault). Strong
/// branching and the root cut loop re-solve the LP many times and do not look
/// at the time limit; on large models (more than kLargeIlpPairs binaries,
/// about 60 tasks on two streams) they alone ran to 30-90 s under a 10 s
/// limit, so there branching uses pseudo-costs only and the root gets one
/// cut pass.
void ConfigureSearch(const Ilp& ilp, CbcModel* model) {
  const bool large = ilp.pairs.size() > kLargeIlpPairs;
  CbcStrategyDefault strategy(/*cutsOnlyAtRoot=*/1, /*numberStrong=*/large ? 0 : 5,
                              /*numberBeforeTrust=*/large ? 0 : 5, /*printLevel=*/0);
  model->setStrategy(strategy);
  if (large) model->setMaximumCutPassesAtRoot(1);
}

using Clock = std::chrono::steady_clock;

/// Builds and solves the ILP under the CBC lock. The root LP goes through
/// initialSolve (presolve; several times faster than the dual simplex that
/// branchAndBound starts with on these degenerate big-M LPs) and cannot be
/// interrupted; branch and bound gets what is left of the limit since `t0`.
/// (Clp's own LP time limit is not used: CBC reads an LP stopped on time as
/// infeasible, which would turn the hint into a false optimum.)
WindowSearchOutcome Search(const WindowProblem& problem, const WindowPreparation& prep, const SolverOptions& options,
                           Clock::time_point t0) {
  std::lock_guard<std::mutex> lock(CbcMutex());
  Ilp ilp = BuildIlp(problem, prep);
  OsiClpSolverInterface solver;
  LoadSolver(ilp, &solver);
  CbcModel model(solver);
  model.setLogLevel(0);
  model.messageHandler()->setLogLevel(0);
  model.setUseElapsedTime(true);
  model.setRandomSeed(static_cast<int>(options.seed % 1000000007));
  model.setNumberThreads(0);
  ConfigureSearch(ilp, &model);
  if (!prep.hint.empty()) {
    std::vector<double> cols = HintColumns(prep, ilp);
    model.setBestSolution(cols.data(), static_cast<int>(cols.size()), static_cast<double>(prep.hint_objective), true);
  }
  model.initialSolve();
  model.setMaximumSeconds(std::max(1e-3, options.time_limit_s - SecondsSince(t0)));
  if (options.fail_limit > 0) model.setMaximumNodes(static_cast<int>(std::min<int64_t>(options.fail_limit, 1 << 30)));
  model.branchAndBound();
  WindowSearchOutcome outcome = ReadOutcome(model, problem.tasks.size());
  outcome.hit_time_limit = model.isSecondsLimitReached();
  return outcome;
}

/// The ILP leaves memory out (a relaxation): an answer over the memory
/// capacity is dropped (the hint stands) and nothing is proven optimal.
void KeepWithinMemory(const WindowProblem& problem, WindowSearchOutcome* outcome) {
  if (problem.memory_capacity < 0 || outcome->start.empty()) return;
  if (PeakWindowMemory(problem, LeftShiftWithinMemory(problem, outcome->start)).units <= problem.memory_capacity)
    return;
  outcome->start.clear();
  outcome->exhausted = false;
}

/// The CBC backend.
class CbcWindowSolver : public WindowSolver {
 public:
  std::string name() const override { return "cbc"; }

  /// Solves the window; CBC errors become error results.
  Result<WindowSolution> Solve(const WindowProblem& problem, const SolverOptions& options) override {
    const Clock::time_point t0 = Clock::now();
    if (!(options.time_limit_s > 0)) return Status::Error("cbc: time_limit_s must be positive");
    Result<WindowPreparation> prep = PrepareWindow(problem);
    if (!prep.ok()) return prep.status();
    WindowSearchOutcome outcome;
    outcome.exhausted = prep->infeasible;
    const bool proven_by_hint = !prep->hint.empty() && prep->hint_objective <= prep->lower_bound;
    if (!prep->infeasible && !proven_by_hint && !problem.tasks.empty()) {
      Result<WindowSearchOutcome> searched = GuardedSearch(problem, *prep, options, t0);
      if (!searched.ok()) return searched.status();
      outcome = std::move(searched).value();
      KeepWithinMemory(problem, &outcome);
    }
    return FinishWindowSolution(problem, *prep, outcome, SecondsSince(t0));
  }

 private:
  /// Search, converting COIN exceptions to errors.
  static Result<WindowSearchOutcome> GuardedSearch(const WindowProblem& problem, const WindowPreparation& prep,
                                                   const SolverOptions& options, Clock::time_point t0) {
    try {
      return Search(problem, prep, options, t0);
    } catch (const CoinError& e) {
      return Status::Error("cbc: " + e.message() + " in " + e.methodName());
    } catch (const std::exception& e) {
      return Status::Error(std::string("cbc: ") + e.what());
    }
  }
};

}  // namespace

std::unique_ptr<WindowSolver> NewCbcWindowSolver() { return std::make_unique<CbcWindowSolver>(); }

}  // namespace concerto
