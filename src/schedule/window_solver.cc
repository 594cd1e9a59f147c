// The solver-independent half of window solving: the backend registry,
// problem validation, the lower bound, left-shifting, the preparation every
// backend starts from, and the independent verifier. No solver headers here.
#include "concerto/schedule/window_solver.h"

#include "concerto/ir/graph_index.h"

#include <algorithm>
#include <cassert>
#include <functional>
#include <limits>
#include <queue>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace concerto {
namespace {

/// Times, durations and their sums stay within this magnitude, so that int64
/// arithmetic cannot overflow and doubles (the ILP) represent them exactly.
constexpr int64_t kMaxTime = int64_t{1} << 52;

/// Predecessor and successor lists of the precedence graph.
struct PrecedenceGraph {
  std::vector<std::vector<int>> preds;
  std::vector<std::vector<int>> succs;
};

/// Builds the graph; precedence indices must be in range.
PrecedenceGraph BuildGraph(const WindowProblem& problem) {
  PrecedenceGraph g;
  g.preds.resize(problem.tasks.size());
  g.succs.resize(problem.tasks.size());
  for (const auto& [before, after] : problem.precedences) {
    g.succs[before].push_back(after);
    g.preds[after].push_back(before);
  }
  return g;
}

/// Kahn's algorithm, smallest ready index first (deterministic). Shorter than
/// the task count when the precedences have a cycle.
std::vector<int> TopologicalOrder(const PrecedenceGraph& g) { return KahnOrder(g.preds, g.succs); }

/// A cycle among the tasks left out of a partial topological order, as
/// "a -> b -> a". Every left-out task has a left-out predecessor, so walking
/// predecessors long enough ends on a cycle.
std::string DescribeCycle(const PrecedenceGraph& g, const std::vector<int>& order) {
  const int n = static_cast<int>(g.preds.size());
  std::vector<char> placed(n, 0);
  for (int i : order) placed[i] = 1;
  int at = 0;
  while (placed[at]) ++at;
  auto step_back = [&](int i) {
    for (int p : g.preds[i])
      if (!placed[p]) return p;
    assert(false && "a left-out task has no left-out predecessor");
    return i;
  };
  for (int k = 0; k < n; ++k) at = step_back(at);
  std::vector<int> cycle{at};
  for (int i = step_back(at); i != at; i = step_back(i)) cycle.push_back(i);
  std::reverse(cycle.begin(), cycle.end());
  std::rotate(cycle.begin(), std::min_element(cycle.begin(), cycle.end()), cycle.end());
  std::string text;
  for (int i : cycle) text += std::to_string(i) + " -> ";
  return text + std::to_string(cycle.front());
}

/// Errors in one task's fields, or Ok.
Status ValidateTask(const WindowTask& t, int index, int num_resources) {
  const std::string who = "task " + std::to_string(index) + ": ";
  if (t.duration < 0) return Status::Error(who + "duration " + std::to_string(t.duration) + " is negative");
  if (t.duration > kMaxTime) return Status::Error(who + "duration " + std::to_string(t.duration) + " exceeds 2^52");
  if (t.resource < 0 || t.resource >= num_resources)
    return Status::Error(who + "resource " + std::to_string(t.resource) + " is out of range [0, " +
                         std::to_string(num_resources) + ")");
  if (t.release < -kMaxTime || t.release > kMaxTime)
    return Status::Error(who + "release " + std::to_string(t.release) + " is outside +-2^52");
  if (t.deadline < -kMaxTime || t.deadline > kMaxTime)
    return Status::Error(who + "deadline " + std::to_string(t.deadline) + " is outside +-2^52");
  if (t.release + t.duration > t.deadline)
    return Status::Error(who + "release " + std::to_string(t.release) + " + duration " + std::to_string(t.duration) +
                         " exceeds deadline " + std::to_string(t.deadline));
  return Status::Ok();
}

/// Errors in one buffer's fields (size, task indices, times), or Ok.
Status ValidateBuffer(const WindowBuffer& b, int index, int num_tasks) {
  const std::string who = "buffer " + std::to_string(index) + ": ";
  if (b.units < 0 || b.units > kMaxTime)
    return Status::Error(who + "units " + std::to_string(b.units) + " is outside [0, 2^52]");
  auto in_range = [&](int i) { return i >= 0 && i < num_tasks; };
  if (b.producer != -1 && !in_range(b.producer))
    return Status::Error(who + "producer " + std::to_string(b.producer) + " is out of range [-1, " +
                         std::to_string(num_tasks) + ")");
  for (int c : b.consumers)
    if (!in_range(c))
      return Status::Error(who + "consumer " + std::to_string(c) + " is out of range [0, " +
                           std::to_string(num_tasks) + ")");
  for (int64_t v : {b.start, b.end})
    if (v < -kMaxTime || v > kMaxTime) return Status::Error(who + "time " + std::to_string(v) + " is outside +-2^52");
  return Status::Ok();
}

/// Errors in the memory part of a problem, or Ok.
Status ValidateMemory(const WindowProblem& problem) {
  if (problem.memory_capacity > kMaxTime)
    return Status::Error("memory_capacity " + std::to_string(problem.memory_capacity) + " exceeds 2^52");
  int64_t total = 0;
  for (size_t k = 0; k < problem.buffers.size(); ++k) {
    CONCERTO_RETURN_IF_ERROR(
        ValidateBuffer(problem.buffers[k], static_cast<int>(k), static_cast<int>(problem.tasks.size())));
    total += problem.buffers[k].units;
    if (total > kMaxTime) return Status::Error("total buffer units exceed 2^52 at buffer " + std::to_string(k));
  }
  return Status::Ok();
}

/// True when the problem constrains memory.
bool HasMemory(const WindowProblem& problem) { return problem.memory_capacity >= 0; }

/// Errors in the precedence list (indices, self loops, cycles), or Ok.
Status ValidatePrecedences(const WindowProblem& problem) {
  const int n = static_cast<int>(problem.tasks.size());
  for (size_t k = 0; k < problem.precedences.size(); ++k) {
    const auto [before, after] = problem.precedences[k];
    const std::string who = "precedence " + std::to_string(k) + " (" + std::to_string(before) + ", " +
                            std::to_string(after) + "): ";
    for (int i : {before, after})
      if (i < 0 || i >= n)
        return Status::Error(who + "task index " + std::to_string(i) + " is out of range [0, " + std::to_string(n) +
                             ")");
    if (before == after) return Status::Error(who + "task " + std::to_string(before) + " precedes itself");
  }
  PrecedenceGraph g = BuildGraph(problem);
  std::vector<int> order = TopologicalOrder(g);
  if (static_cast<int>(order.size()) < n) return Status::Error("precedences form a cycle: " + DescribeCycle(g, order));
  return Status::Ok();
}

/// Heads: release pushed forward along precedences (earliest starts).
std::vector<int64_t> Heads(const WindowProblem& problem, const PrecedenceGraph& g, const std::vector<int>& topo) {
  std::vector<int64_t> head(problem.tasks.size());
  for (int i : topo) {
    head[i] = problem.tasks[i].release;
    for (int p : g.preds[i]) head[i] = std::max(head[i], head[p] + problem.tasks[p].duration);
  }
  return head;
}

/// Tails: the longest chain of work that must follow each task's end.
std::vector<int64_t> Tails(const WindowProblem& problem, const PrecedenceGraph& g, const std::vector<int>& topo) {
  std::vector<int64_t> tail(problem.tasks.size(), 0);
  for (auto it = topo.rbegin(); it != topo.rend(); ++it)
    for (int s : g.succs[*it]) tail[*it] = std::max(tail[*it], problem.tasks[s].duration + tail[s]);
  return tail;
}

/// On one resource: for each pair of thresholds, h (a head) and q (a tail),
/// the tasks with head >= h and tail >= q run one after another from h at
/// the earliest, and the last of them still has at least q to go: h + their
/// work + q (Carlier's one-machine bound over every such set; with q the
/// smallest tail of the tasks with head >= h it is the suffix bound). O(n^2)
/// for n tasks. Tasks of zero duration do not occupy the resource and are
/// skipped.
int64_t ResourceBound(const WindowProblem& problem, const std::vector<int>& tasks, const std::vector<int64_t>& head,
                      const std::vector<int64_t>& tail) {
  std::vector<int> by_tail = tasks;  // largest tail first
  std::sort(by_tail.begin(), by_tail.end(), [&](int a, int b) { return tail[a] > tail[b]; });
  std::vector<int64_t> heads;
  for (int i : tasks) heads.push_back(head[i]);
  std::sort(heads.begin(), heads.end());
  heads.erase(std::unique(heads.begin(), heads.end()), heads.end());
  int64_t bound = 0;
  for (const int64_t h : heads) {
    int64_t work = 0;
    for (int i : by_tail) {
      if (head[i] < h) continue;
      work += problem.tasks[i].duration;
      bound = std::max(bound, h + work + tail[i]);
    }
  }
  return bound;
}

/// The lower bound from heads, tails and resources (see WindowLowerBound).
int64_t LowerBound(const WindowProblem& problem, const std::vector<int64_t>& head, const std::vector<int64_t>& tail) {
  const int n = static_cast<int>(problem.tasks.size());
  int64_t bound = 0;
  std::vector<std::vector<int>> on(std::max(problem.num_resources, 0));
  for (int i = 0; i < n; ++i) {
    bound = std::max(bound, head[i] + problem.tasks[i].duration + tail[i]);
    if (problem.tasks[i].duration > 0) on[problem.tasks[i].resource].push_back(i);
  }
  for (const auto& tasks : on)
    if (!tasks.empty()) bound = std::max(bound, ResourceBound(problem, tasks, head, tail));
  return bound;
}

/// max(start + duration) over tasks; 0 for no tasks.
int64_t MaxFinish(const WindowProblem& problem, const std::vector<int64_t>& start) {
  assert(start.size() == problem.tasks.size());
  int64_t finish = 0;
  for (size_t i = 0; i < start.size(); ++i)
    finish = i == 0 ? start[i] + problem.tasks[i].duration : std::max(finish, start[i] + problem.tasks[i].duration);
  return finish;
}

/// A solution object holding `start` and its true objective (for verifying).
WindowSolution AsSolution(const WindowProblem& problem, std::vector<int64_t> start, SolveStatus status) {
  WindowSolution s;
  s.status = status;
  s.objective = start.size() == problem.tasks.size() ? MaxFinish(problem, start) : 0;
  s.bound = 0;
  s.start = std::move(start);
  return s;
}

/// The first violation and how many more, for error messages.
std::string Summarize(const std::vector<std::string>& violations) {
  assert(!violations.empty());
  std::string text = violations.front();
  if (violations.size() > 1) text += " (and " + std::to_string(violations.size() - 1) + " more)";
  return text;
}

/// Latest starts: deadline (capped at the horizon) pulled back along
/// precedences.
std::vector<int64_t> LatestStarts(const WindowProblem& problem, const PrecedenceGraph& g, const std::vector<int>& topo,
                                  int64_t horizon) {
  std::vector<int64_t> latest_finish(problem.tasks.size());
  for (auto it = topo.rbegin(); it != topo.rend(); ++it) {
    int i = *it;
    latest_finish[i] = std::min(problem.tasks[i].deadline, horizon);
    for (int s : g.succs[i]) latest_finish[i] = std::min(latest_finish[i], latest_finish[s] - problem.tasks[s].duration);
  }
  std::vector<int64_t> latest_start(problem.tasks.size());
  for (size_t i = 0; i < latest_start.size(); ++i) latest_start[i] = latest_finish[i] - problem.tasks[i].duration;
  return latest_start;
}

/// The horizon: a left-shifted schedule starts each task at a release or at
/// another task's end, so it finishes by max release + total duration; it
/// also finishes by the latest deadline.
int64_t Horizon(const WindowProblem& problem) {
  if (problem.tasks.empty()) return 0;
  // With memory, left-shifting can raise the peak, but after every release
  // and every fixed buffer time T0 the profile only depends on the order of
  // starts and ends, so collapsing every stretch in which no task runs keeps
  // a schedule feasible: some optimum finishes by T0 + total duration.
  if (HasMemory(problem)) {
    int64_t t0 = problem.tasks.front().release, max_deadline = problem.tasks.front().deadline, work = 0;
    for (const WindowTask& t : problem.tasks) {
      t0 = std::max(t0, t.release);
      max_deadline = std::max(max_deadline, t.deadline);
      work += t.duration;
    }
    for (const WindowBuffer& b : problem.buffers) t0 = std::max({t0, b.start, b.end});
    return std::min(max_deadline, t0 + work);
  }
  int64_t max_release = problem.tasks.front().release, max_deadline = problem.tasks.front().deadline, work = 0;
  for (const WindowTask& t : problem.tasks) {
    max_release = std::max(max_release, t.release);
    max_deadline = std::max(max_deadline, t.deadline);
    work += t.duration;
  }
  return std::min(max_deadline, max_release + work);
}

/// Violations of one task's time window and of the precedences.
void CheckTimes(const WindowProblem& problem, const std::vector<int64_t>& start, std::vector<std::string>* out) {
  const int n = static_cast<int>(problem.tasks.size());
  for (int i = 0; i < n; ++i) {
    const WindowTask& t = problem.tasks[i];
    if (start[i] < t.release)
      out->push_back("task " + std::to_string(i) + " starts at " + std::to_string(start[i]) + " before its release " +
                     std::to_string(t.release));
    if (start[i] + t.duration > t.deadline)
      out->push_back("task " + std::to_string(i) + " finishes at " + std::to_string(start[i] + t.duration) +
                     " after its deadline " + std::to_string(t.deadline));
  }
  for (const auto& [a, b] : problem.precedences) {
    if (a < 0 || a >= n || b < 0 || b >= n) {
      out->push_back("precedence (" + std::to_string(a) + ", " + std::to_string(b) + ") names a task out of range");
      continue;
    }
    const int64_t end_a = start[a] + problem.tasks[a].duration;
    if (start[b] < end_a)
      out->push_back("precedence " + std::to_string(a) + " -> " + std::to_string(b) + ": task " + std::to_string(b) +
                     " starts at " + std::to_string(start[b]) + " before task " + std::to_string(a) + " ends at " +
                     std::to_string(end_a));
  }
}

/// Every pair of tasks overlapping on one resource (positive-length overlap).
void CheckOverlaps(const WindowProblem& problem, const std::vector<int64_t>& start, std::vector<std::string>* out) {
  const int n = static_cast<int>(problem.tasks.size());
  std::vector<int> order;
  for (int i = 0; i < n; ++i) {
    if (problem.tasks[i].duration > 0) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const WindowTask &ta = problem.tasks[a], &tb = problem.tasks[b];
    return std::tie(ta.resource, start[a], a) < std::tie(tb.resource, start[b], b);
  });
  for (size_t x = 0; x < order.size(); ++x) {
    const int a = order[x];
    const int64_t end_a = start[a] + problem.tasks[a].duration;
    for (size_t y = x + 1; y < order.size(); ++y) {
      const int b = order[y];
      if (problem.tasks[b].resource != problem.tasks[a].resource || start[b] >= end_a) break;
      out->push_back("tasks " + std::to_string(a) + " and " + std::to_string(b) + " overlap on resource " +
                     std::to_string(problem.tasks[a].resource) + ": [" + std::to_string(start[a]) + ", " +
                     std::to_string(end_a) + ") and [" + std::to_string(start[b]) + ", " +
                     std::to_string(start[b] + problem.tasks[b].duration) + ")");
    }
  }
}

/// Picks the status from whether an answer exists and the search finished.
SolveStatus StatusOf(bool has_answer, bool exhausted) {
  if (has_answer) return exhausted ? SolveStatus::kOptimal : SolveStatus::kFeasible;
  return exhausted ? SolveStatus::kInfeasible : SolveStatus::kNoSolution;
}

}  // namespace

std::string_view ToString(SolveStatus status) {
  switch (status) {
    case SolveStatus::kOptimal: return "optimal";
    case SolveStatus::kFeasible: return "feasible";
    case SolveStatus::kInfeasible: return "infeasible";
    case SolveStatus::kNoSolution: return "no-solution";
  }
  return "unknown";
}

// CBC is optional (CMake: CONCERTO_WITH_CBC); Gecode is always built.
#ifdef CONCERTO_WITH_CBC
std::vector<std::string> WindowSolverNames() { return {"gecode", "cbc"}; }
#else
std::vector<std::string> WindowSolverNames() { return {"gecode"}; }
#endif

Result<std::unique_ptr<WindowSolver>> MakeWindowSolver(const std::string& name) {
  if (name == "gecode") return NewGecodeWindowSolver();
#ifdef CONCERTO_WITH_CBC
  if (name == "cbc") return NewCbcWindowSolver();
#endif
  std::string known;
  for (const std::string& n : WindowSolverNames()) known += (known.empty() ? "" : ", ") + n;
  return Status::Error("unknown window solver '" + name + "' (known: " + known + ")");
}

Status ValidateWindowProblem(const WindowProblem& problem) {
  if (problem.num_resources < 0)
    return Status::Error("num_resources " + std::to_string(problem.num_resources) + " is negative");
  int64_t work = 0;
  for (size_t i = 0; i < problem.tasks.size(); ++i) {
    CONCERTO_RETURN_IF_ERROR(ValidateTask(problem.tasks[i], static_cast<int>(i), problem.num_resources));
    work += problem.tasks[i].duration;
    if (work > kMaxTime) return Status::Error("total duration exceeds 2^52 at task " + std::to_string(i));
  }
  CONCERTO_RETURN_IF_ERROR(ValidatePrecedences(problem));
  CONCERTO_RETURN_IF_ERROR(ValidateMemory(problem));
  if (!problem.hint.empty() && problem.hint.size() != problem.tasks.size())
    return Status::Error("hint has " + std::to_string(problem.hint.size()) + " start times for " +
                         std::to_string(problem.tasks.size()) + " tasks");
  for (size_t i = 0; i < problem.hint.size(); ++i)
    if (problem.hint[i] < -kMaxTime || problem.hint[i] > kMaxTime)
      return Status::Error("hint: task " + std::to_string(i) + " start " + std::to_string(problem.hint[i]) +
                           " is outside +-2^52");
  return Status::Ok();
}

int64_t WindowLowerBound(const WindowProblem& problem) {
  PrecedenceGraph g = BuildGraph(problem);
  std::vector<int> topo = TopologicalOrder(g);
  assert(topo.size() == problem.tasks.size() && "WindowLowerBound needs an acyclic problem");
  return LowerBound(problem, Heads(problem, g, topo), Tails(problem, g, topo));
}

std::vector<int64_t> LeftShiftStarts(const WindowProblem& problem, const std::vector<int64_t>& start) {
  const int n = static_cast<int>(problem.tasks.size());
  assert(static_cast<int>(start.size()) == n);
  PrecedenceGraph g = BuildGraph(problem);
  std::vector<int> topo = TopologicalOrder(g);
  assert(static_cast<int>(topo.size()) == n && "LeftShiftStarts needs an acyclic problem");
  std::vector<int> rank(n);
  for (int k = 0; k < n; ++k) rank[topo[k]] = k;
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return std::tie(start[a], rank[a]) < std::tie(start[b], rank[b]); });
  constexpr int64_t kUnplaced = std::numeric_limits<int64_t>::min();
  std::vector<int64_t> shifted(n, kUnplaced);
  std::vector<int64_t> resource_free(std::max(problem.num_resources, 0), kUnplaced);
  for (int i : order) {
    const WindowTask& t = problem.tasks[i];
    int64_t s = t.release;
    for (int p : g.preds[i])
      if (shifted[p] != kUnplaced) s = std::max(s, shifted[p] + problem.tasks[p].duration);
    if (t.duration > 0) {
      s = std::max(s, resource_free[t.resource]);
      resource_free[t.resource] = s + t.duration;
    }
    shifted[i] = s;
  }
  return shifted;
}

WindowMemoryPeak PeakWindowMemory(const WindowProblem& problem, const std::vector<int64_t>& start) {
  assert(start.size() == problem.tasks.size());
  std::vector<std::pair<int64_t, int64_t>> events;  // (time, +units at allocation / -units at release)
  events.reserve(2 * problem.buffers.size());
  for (const WindowBuffer& b : problem.buffers) {
    const int64_t alloc = b.producer >= 0 ? start[b.producer] : b.start;
    int64_t release = std::max(alloc, b.end);
    for (int c : b.consumers) release = std::max(release, start[c] + problem.tasks[c].duration);
    if (release == alloc || b.units == 0) continue;
    events.push_back({alloc, b.units});
    events.push_back({release, -b.units});
  }
  std::sort(events.begin(), events.end());  // at equal times releases (negative) first
  WindowMemoryPeak peak;
  int64_t live = 0;
  for (const auto& [time, delta] : events) {
    live += delta;
    if (live > peak.units) peak = {live, time};
  }
  return peak;
}

std::vector<int64_t> LeftShiftWithinMemory(const WindowProblem& problem, const std::vector<int64_t>& start) {
  std::vector<int64_t> shifted = LeftShiftStarts(problem, start);
  if (!HasMemory(problem) || PeakWindowMemory(problem, shifted).units <= problem.memory_capacity) return shifted;
  return start;
}

Result<WindowPreparation> PrepareWindow(const WindowProblem& problem) {
  CONCERTO_RETURN_IF_ERROR(ValidateWindowProblem(problem));
  WindowPreparation prep;
  PrecedenceGraph g = BuildGraph(problem);
  prep.topo_order = TopologicalOrder(g);
  prep.earliest_start = Heads(problem, g, prep.topo_order);
  prep.lower_bound = LowerBound(problem, prep.earliest_start, Tails(problem, g, prep.topo_order));
  prep.horizon = Horizon(problem);
  prep.latest_start = LatestStarts(problem, g, prep.topo_order, prep.horizon);
  prep.infeasible = prep.lower_bound > prep.horizon;
  for (size_t i = 0; i < problem.tasks.size(); ++i)
    prep.infeasible = prep.infeasible || prep.earliest_start[i] > prep.latest_start[i];
  if (problem.hint.empty()) return prep;
  std::vector<std::string> bad = VerifyWindowSolution(problem, AsSolution(problem, problem.hint, SolveStatus::kFeasible));
  if (!bad.empty()) return Status::Error("hint is not a feasible schedule: " + Summarize(bad));
  assert(!prep.infeasible && "a feasible hint contradicts the infeasibility proof");
  prep.hint = LeftShiftWithinMemory(problem, problem.hint);
  prep.hint_objective = MaxFinish(problem, prep.hint);
  return prep;
}

Result<WindowSolution> FinishWindowSolution(const WindowProblem& problem, const WindowPreparation& prep,
                                            const WindowSearchOutcome& outcome, double seconds) {
  std::vector<int64_t> best = prep.hint;
  double found_s = 0;  // the hint's
  if (!outcome.start.empty()) {
    if (outcome.start.size() != problem.tasks.size()) return Status::Error("solver returned a start vector of wrong size");
    std::vector<int64_t> found = LeftShiftWithinMemory(problem, outcome.start);
    std::vector<std::string> bad = VerifyWindowSolution(problem, AsSolution(problem, found, SolveStatus::kFeasible));
    if (!bad.empty()) return Status::Error("solver returned an infeasible schedule: " + Summarize(bad));
    if (best.empty() || MaxFinish(problem, found) < prep.hint_objective) {
      best = std::move(found);
      found_s = outcome.found_s >= 0 ? outcome.found_s : seconds;
    }
  }
  const bool answered = !best.empty() || problem.tasks.empty();
  WindowSolution s = AsSolution(problem, std::move(best), StatusOf(false, outcome.exhausted));
  s.seconds = seconds;
  s.found_s = found_s;
  s.nodes = outcome.nodes;
  s.hit_time_limit = outcome.hit_time_limit;
  s.bound = std::max(prep.lower_bound, outcome.bound);
  if (!answered) {
    s.objective = 0;
    s.gap = s.status == SolveStatus::kNoSolution ? 1.0 : 0.0;
    return s;
  }
  s.bound = std::min(s.bound, s.objective);
  s.status = StatusOf(true, outcome.exhausted || s.bound == s.objective);
  if (s.status == SolveStatus::kOptimal) s.bound = s.objective;
  s.gap = s.objective > 0 ? static_cast<double>(s.objective - s.bound) / static_cast<double>(s.objective) : 0.0;
  return s;
}

std::vector<std::string> VerifyWindowSolution(const WindowProblem& problem, const WindowSolution& solution) {
  std::vector<std::string> out;
  const bool answered = solution.status == SolveStatus::kOptimal || solution.status == SolveStatus::kFeasible;
  if (!answered && solution.start.empty()) return out;
  if (solution.start.size() != problem.tasks.size()) {
    out.push_back("start has " + std::to_string(solution.start.size()) + " entries for " +
                  std::to_string(problem.tasks.size()) + " tasks");
    return out;
  }
  for (size_t i = 0; i < problem.tasks.size(); ++i) {
    const int r = problem.tasks[i].resource;
    if (r < 0 || r >= problem.num_resources) {
      out.push_back("task " + std::to_string(i) + " names resource " + std::to_string(r) + " out of range");
      return out;
    }
  }
  CheckTimes(problem, solution.start, &out);
  CheckOverlaps(problem, solution.start, &out);
  if (HasMemory(problem)) {
    WindowMemoryPeak peak = PeakWindowMemory(problem, solution.start);
    if (peak.units > problem.memory_capacity)
      out.push_back("memory: " + std::to_string(peak.units) + " units held at time " + std::to_string(peak.time) +
                    " exceed the capacity " + std::to_string(problem.memory_capacity));
  }
  const int64_t finish = MaxFinish(problem, solution.start);
  if (solution.objective != finish)
    out.push_back("objective " + std::to_string(solution.objective) + " is not the latest finish " +
                  std::to_string(finish));
  if (answered && solution.bound > solution.objective)
    out.push_back("bound " + std::to_string(solution.bound) + " exceeds objective " +
                  std::to_string(solution.objective));
  return out;
}

}  // namespace concerto
