// The window builder of the concerto search (window_builder.h).
#include "window_builder.h"

#include <algorithm>
#include <cassert>
#include <climits>

namespace concerto::search {
namespace {

/// Steps a fixed memory profile is coarsened to (each the maximum of the
/// profile over its span, so the coarse profile never under-counts).
constexpr size_t kMaxFixedSteps = 128;

/// The memory of a window as buffers of the window problem. Only the
/// window's time span [lo, hi) matters: outside it no window task runs, so
/// what is held there does not depend on the solve. A tensor whose producer
/// or a consumer is a window task is a buffer with a variable interval (its
/// fixed ends clamped to the span); every other tensor is fixed at `r.t` and
/// goes into one step profile, coarsened to kMaxFixedSteps steps by their
/// maximum. The capacity is the budget, or the hint's own peak where the
/// incumbent is already above it (a window never makes memory worse). A
/// window that cannot exceed the budget whatever its order (the fixed peak
/// plus every variable buffer fits) gets no memory at all.
void AddMemory(const RoleSearch& r, const std::vector<int>& task_of, int64_t budget_units, Window& w) {
  WindowProblem& pb = w.problem;
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (int tk = 0; tk < w.free_tasks; ++tk) {
    lo = std::min(lo, pb.tasks[tk].release);
    hi = std::max(hi, pb.tasks[tk].deadline);
  }
  if (lo >= hi) return;
  int64_t end_of_step = 0;
  for (size_t i = 0; i < r.t.size(); ++i) end_of_step = std::max(end_of_step, r.t[i] + r.dur[i]);
  auto clamp = [&](int64_t v) { return std::clamp(v, lo, hi); };
  std::vector<std::pair<int64_t, int64_t>> fixed;  // (time, delta)
  for (size_t ti = 0; ti < r.tensor_units.size(); ++ti) {
    if (r.tensor_units[ti] == 0) continue;
    const int prod = r.index->producer[ti];
    const auto& cons = r.index->consumers[ti];
    bool variable = prod >= 0 && task_of[prod] >= 0;
    for (int c : cons) variable = variable || task_of[c] >= 0;
    const int64_t alloc = prod >= 0 ? r.t[prod] : 0;
    int64_t release = cons.empty() ? end_of_step : alloc;
    if (variable) {
      WindowBuffer b;
      b.units = r.tensor_units[ti];
      b.producer = prod >= 0 && task_of[prod] >= 0 ? task_of[prod] : -1;
      b.start = clamp(alloc);
      int64_t fixed_end = cons.empty() ? hi : lo;
      for (int c : cons)
        if (task_of[c] >= 0) b.consumers.push_back(task_of[c]);
        else fixed_end = std::max(fixed_end, clamp(r.t[c] + r.dur[c]));
      b.end = fixed_end;
      pb.buffers.push_back(std::move(b));
      continue;
    }
    for (int c : cons) release = std::max(release, r.t[c] + r.dur[c]);
    const int64_t a = clamp(alloc), e = clamp(release);
    if (a >= e) continue;
    fixed.push_back({a, r.tensor_units[ti]});
    fixed.push_back({e, -r.tensor_units[ti]});
  }
  // The fixed profile as steps [time_k, time_k+1) at level_k, then coarsened.
  std::sort(fixed.begin(), fixed.end());
  std::vector<std::pair<int64_t, int64_t>> steps;  // (start, level)
  int64_t level = 0, fixed_peak = 0;
  for (size_t k = 0; k < fixed.size(); ++k) {
    level += fixed[k].second;
    if (k + 1 < fixed.size() && fixed[k + 1].first == fixed[k].first) continue;
    steps.push_back({fixed[k].first, level});
    fixed_peak = std::max(fixed_peak, level);
  }
  // Every variable buffer held over the whole span on top of the fixed peak
  // still fits: no order of the window can exceed the budget, so the window
  // carries no memory (the constraint would prune nothing; it only costs).
  int64_t variable_units = 0;
  for (const WindowBuffer& b : pb.buffers) variable_units += b.units;
  if (fixed_peak + variable_units <= budget_units) {
    pb.buffers.clear();
    return;
  }
  const size_t per = (steps.size() + kMaxFixedSteps - 1) / kMaxFixedSteps;
  for (size_t k = 0; k + 1 < steps.size(); k += std::max<size_t>(per, 1)) {
    const size_t last = std::min(steps.size() - 1, k + std::max<size_t>(per, 1));
    int64_t peak = 0;
    for (size_t q = k; q < last; ++q) peak = std::max(peak, steps[q].second);
    if (peak > 0) pb.buffers.push_back({peak, -1, steps[k].first, {}, steps[last].first});
  }
  pb.memory_capacity = budget_units;
  pb.memory_capacity = std::max(budget_units, PeakWindowMemory(pb, pb.hint).units);
}

}  // namespace

/// Builds the problem of solving `members` with everything else fixed at r.t:
/// outside predecessors give release times, outside successors deadlines,
/// outside ops on the same stream between window ops become fixed blockers.
Window BuildWindow(const RoleSearch& r, const std::vector<int>& members, int64_t horizon, bool fix_comm_order,
                   int64_t budget_units) {
  std::vector<int>& task_of = r.task_of;
  if (task_of.size() != r.graph->ops.size()) task_of.assign(r.graph->ops.size(), -1);
  Window w;
  for (int i : members) {
    task_of[i] = static_cast<int>(w.ops.size());
    w.ops.push_back(i);
  }
  w.free_tasks = static_cast<int>(w.ops.size());
  std::vector<int64_t> release(w.ops.size(), 0), deadline(w.ops.size(), horizon);
  const std::vector<int>& pos = r.pos;
  // Per stream: the first and last position of a member (-1: none).
  std::vector<std::pair<int, int>> span(r.order.size(), {-1, -1});
  for (int i : members) {
    auto& [lo, hi] = span[r.stream[i]];
    lo = lo < 0 ? pos[i] : std::min(lo, pos[i]);
    hi = std::max(hi, pos[i]);
  }
  for (size_t s = 0; s < r.order.size(); ++s) {
    const auto& o = r.order[s];
    const auto [lo, hi] = span[s];
    if (lo < 0) continue;
    for (int k = lo; k <= hi; ++k)
      if (task_of[o[k]] < 0) {  // a blocker, fixed where it is
        task_of[o[k]] = static_cast<int>(w.ops.size());
        w.ops.push_back(o[k]);
        release.push_back(r.t[o[k]]);
        deadline.push_back(r.t[o[k]] + r.dur[o[k]]);
      }
    // The nearest ops with work before and after the window on this stream
    // (zero-duration ops occupy nothing and may share a start with others).
    int prev = lo - 1, next = hi + 1;
    while (prev >= 0 && r.dur[o[prev]] == 0) --prev;
    while (next < static_cast<int>(o.size()) && r.dur[o[next]] == 0) ++next;
    for (int k = lo; k <= hi; ++k) {
      int tk = task_of[o[k]];
      // Zero-duration ops occupy no stream in the window model, so a solve
      // may leave one inside a neighbour's run; only ops with work are
      // bounded by the stream's neighbours (decoding and compaction put
      // every op back in stream order).
      if (tk >= w.free_tasks || r.dur[o[k]] == 0) continue;
      if (prev >= 0) release[tk] = std::max(release[tk], r.t[o[prev]] + r.dur[o[prev]]);
      if (next < static_cast<int>(o.size())) deadline[tk] = std::min(deadline[tk], r.t[o[next]]);
    }
  }
  for (int tk = 0; tk < w.free_tasks; ++tk) {
    int i = w.ops[tk];
    for (int p : r.index->preds[i])
      if (task_of[p] < 0) release[tk] = std::max(release[tk], r.t[p] + r.dur[p]);
    for (int s : r.index->succs[i])
      if (task_of[s] < 0) deadline[tk] = std::min(deadline[tk], r.t[s]);
    // A send or recv cannot start before the op it meets in another role
    // (the joined timeline): its data is not there earlier.
    if (!r.meet.empty() && r.meet[i] >= 0) release[tk] = std::max(release[tk], r.meet[i]);
  }
  WindowProblem& pb = w.problem;
  pb.num_resources = static_cast<int>(r.graph->streams.size());
  for (size_t tk = 0; tk < w.ops.size(); ++tk) {
    int i = w.ops[tk];
    pb.tasks.push_back({r.dur[i], r.stream[i], release[tk], deadline[tk], r.graph->ops[i].IsComm()});
    pb.hint.push_back(r.t[i]);
    for (int p : r.index->preds[i])
      if (task_of[p] >= 0) pb.precedences.push_back({task_of[p], static_cast<int>(tk)});
  }
  if (fix_comm_order) {
    // Ranks of other roles rely on this role's communication order.
    for (const auto& o : r.order) {
      int last = -1;
      for (int i : o) {
        if (task_of[i] < 0 || !r.graph->ops[i].IsComm()) continue;
        if (last >= 0) pb.precedences.push_back({task_of[last], task_of[i]});
        last = i;
      }
    }
  }
  if (budget_units > 0) AddMemory(r, task_of, budget_units, w);
  for (int i : w.ops) task_of[i] = -1;  // the scratch is all -1 again
  return w;
}

}  // namespace concerto::search
