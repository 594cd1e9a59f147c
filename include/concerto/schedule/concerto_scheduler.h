// The Concerto scheduler: start from the best baseline, then improve the
// schedule by solving overlapping windows of it exactly (the odd-even
// method), decode solved start times to per-stream orders, and fuse
// adjacent collectives where the timeline says it pays. Anytime: it never
// returns a schedule worse than its starting point.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "concerto/cost/cost_model.h"
#include "concerto/schedule/schedule.h"
#include "concerto/schedule/scheduler.h"
#include "concerto/schedule/window_batch.h"
#include "concerto/schedule/window_solver.h"
#include "concerto/sim/simulator.h"

namespace concerto {

struct ConcertoOptions {
  std::string solver = "gecode";
  int block_ops = 125;               // b: ops per block; a window is two blocks
  /// R: at most this many rounds, each an odd and an even pass; the search
  /// usually stops earlier, on the gain rule below.
  int rounds = 50;
  /// The gain rule: a round "stalls" when it leaves the best makespan where
  /// it was or, after the first `gain_rule_after` rounds, when it improves it
  /// by less than `min_round_gain` of it. The search stops after
  /// `stall_rounds` stalled rounds in a row (0: never, run all `rounds`), at
  /// the lower bound, or at the time budget. (Before the rule: at most 4
  /// rounds, a stall only without any gain; the first 4 rounds still stop
  /// that way, so no schedule is worse than it was then.) The rule also
  /// applies once the search has solved `gain_rule_after_windows` windows,
  /// and from then on after every pass (odd or even) rather than every
  /// round: a pass of a large program solves hundreds of windows (the
  /// 100k-op training program: 400), so its rule-free rounds would cost
  /// minutes.
  double min_round_gain = 0.0005;
  int gain_rule_after = 4;
  int gain_rule_after_windows = 300;
  int stall_rounds = 1;
  /// Per window solve: a deterministic work limit (Gecode failed nodes, CBC
  /// nodes) and a wall-clock safety net, reported when it fires.
  int64_t window_fail_limit = 50;
  /// The window solves' Gecode search: 0 dive (SolverOptions::Search::kDive),
  /// 1 rank (kRank: proves hard multi-resource windows, far costlier per
  /// window on the scheduler's long two-stream windows).
  int window_search = 0;
  double window_time_limit_s = 10.0;
  double time_budget_s = 600;        // all rounds together (wall-clock safety net)
  /// Speed only: neither changes the schedule, the report's windows or
  /// anything but seconds (tests/schedule/concerto_speed_test.cc).
  /// Reuse the answer of the last solve at the same place (role, pass, first
  /// block) when the window's problem is identical field by field.
  bool reuse_windows = true;
  /// 2: the baselines are scheduled and measured two at a time, and while a
  /// window is solved the next window of the pass is solved on a second
  /// thread against the start ticks before it; that answer is used when the
  /// next window's problem turns out identical (else it is solved again).
  /// 1: everything one at a time. Only thread-safe backends (Gecode)
  /// speculate. With batch_windows: the threads that solve each batch (and
  /// no speculation).
  int threads = 2;
  /// How a pass solves its windows. false: one after another, each built
  /// from the start ticks the previous one left (the odd-even method as
  /// published). true: as one batch, every window of the pass built from the
  /// start ticks before it, solved at once (on `threads` threads or
  /// `batch_solver`), then applied in pass order; a window whose problem an
  /// earlier one changed keeps its batch answer when that answer verifies on
  /// the new problem, else is solved again. The schedule does not depend on
  /// how many threads or workers solve the batches (docs/concerto.md,
  /// "Parallel window solving").
  bool batch_windows = false;
  /// Batches also (as batch_windows) where a role's graph has at least this
  /// many ops (0: only with batch_windows): there a pass has hundreds of
  /// windows and the one-after-another search leaves the second core mostly
  /// idle. A property of the program, so the schedule still depends on
  /// nothing but the program and the options.
  int batch_windows_from_ops = 50000;
  /// With batch_windows: who solves the batches (not owned), e.g. MPI
  /// workers (DistributedBatchSolver); null: `threads` local threads.
  WindowBatchSolver* batch_solver = nullptr;
  /// The program before the decomposition pass rewrote it (not owned; null
  /// when it did not): its list schedules are starting points too, so a
  /// decomposition that fifo liked but that costs the list schedule its fit
  /// in memory (chunk buffers live longer) does not bind the search.
  const Program* undecomposed = nullptr;
  bool fuse = true;                  // the fusion pass after decoding
  /// Consider the critical-path list schedule over the joined graph of all
  /// roles (CriticalPathListSchedule) as a starting point besides the
  /// stripped baselines (docs/concerto.md, step 1).
  bool list_schedule = true;
  /// Also start from DDP with 1 and 5 MiB gradient buckets besides the configured
  /// size (ConcertoScheduler's StartNames).
  bool ddp_bucket_sweep = true;
  int64_t memory_budget_bytes = 0;   // peak memory per rank to stay under; 0: none
  SimOptions sim;                    // how candidates are simulated
  BaselineOptions baselines;         // for the incumbent
};

/// The option records of ConcertoOptions (util/option_record.h): block,
/// rounds, min-round-gain, gain-rule-after, stall-rounds, window-fail-limit, window-time-limit, time-budget,
/// list-schedule, threads, reuse-windows, fuse. (Its solver, memory budget,
/// simulation and baselines are set through their own records and the driver.)
const std::vector<OptionRecord<ConcertoOptions>>& ConcertoOptionRecords();

struct WindowReport {
  int round = 0;
  int pass = 0;         // 0: odd pass (0,1),(2,3)...; 1: even pass (1,2),(3,4)...
  int first_block = 0;
  int tasks = 0;        // ops in the window (plus fixed blockers)
  SolveStatus status = SolveStatus::kNoSolution;
  bool hit_time_limit = false;  // stopped by the wall clock (not deterministic)
  bool memory = false;          // the window carried the memory budget
  bool reused = false;          // the answer of an identical earlier solve at this place
  double objective_us = 0;
  double bound_us = 0;
  double gap = 0;
  double seconds = 0;
};

struct ConcertoReport {
  /// No starting schedule fits the memory budget (RunConcerto then fails).
  bool memory_infeasible = false;
  std::string solver;
  std::string incumbent;          // the best baseline (the fallback: never return worse)
  double incumbent_makespan_us = 0;
  /// Where the window search started: a baseline without its ordering edges
  /// ("ddp"), "list" (the list schedule of the input program) or "list+ddp"
  /// (of that baseline's rewritten program), "+streams" when inter-node
  /// collectives moved to a stream of their own.
  std::string start;
  double start_makespan_us = 0;
  double final_makespan_us = 0;
  double lower_bound_us = 0;
  double gap = 0;                 // (final - LB) / final
  int rounds_run = 0;
  int windows_solved = 0;
  int windows_optimal = 0;
  int windows_feasible = 0;       // feasible at the time limit
  int windows_unsolved = 0;       // no answer in time (the window kept its order)
  int windows_hit_time_limit = 0; // stopped by the wall-clock safety net
  int windows_reused = 0;         // answered by an identical earlier solve (ConcertoOptions::reuse_windows)
  int windows_speculated = 0;     // solved ahead on the second thread and used (ConcertoOptions::threads)
  /// ConcertoOptions::batch_windows: who solved the batches, and what became
  /// of their answers: applied as solved (the window's problem unchanged
  /// when its turn came), applied after verifying on the changed problem,
  /// or solved again.
  std::string batch_solver;
  int windows_batch_as_solved = 0;
  int windows_batch_verified = 0;
  int windows_batch_resolved = 0;
  int passes_over_memory = 0;     // decoded passes over the budget, undone
  int inter_node_stream_ops = 0;  // collectives moved to an inter-node stream (0: not split)
  int comm_streams_merged = 0;    // comm ops moved onto one "comm" stream (0: a stream per communicator)
  int fused_collectives = 0;      // collectives merged by the fusion pass
  double fusion_gain_us = 0;
  double seconds = 0;
  bool reached_lower_bound = false;
  bool hit_time_budget = false;
  bool stopped_on_stall = false;  // ConcertoOptions::stall_rounds rounds without a gain
  /// The schedule returned is of ConcertoOptions::undecomposed (the search
  /// started from one of its list schedules and did not fall back).
  bool undecomposed = false;
  int64_t memory_budget_bytes = 0;
  int64_t peak_memory_bytes = 0;  // of the returned schedule
  int64_t incumbent_peak_memory_bytes = 0;
  std::vector<double> makespan_after_round_us;
  std::vector<WindowReport> windows;
};

/// Whether a schedule of `makespan_us` peaking at `peak_bytes` is better than
/// an incumbent of `incumbent_makespan_us` and `incumbent_peak_bytes`: faster,
/// or as fast (within a relative 1e-9, the simulator's rounding) and lower in
/// memory. Every choice between candidates in RunConcerto (starting points,
/// passes, stream rewrites, fusion, the fallback) goes through it, so ties in
/// makespan go to lower memory.
bool BetterSchedule(double makespan_us, int64_t peak_bytes, double incumbent_makespan_us,
                    int64_t incumbent_peak_bytes);

/// The report as one JSON object (the `concerto` object of `--json`).
nlohmann::json ConcertoReportJson(const ConcertoReport& report);

/// Progress: one line per pass (round, windows, best makespan).
using ProgressFn = std::function<void(const std::string&)>;

/// Runs the Concerto scheduler on `program`.
Result<ScheduledProgram> RunConcerto(const Program& program, const CostModel& cost, const ConcertoOptions& options,
                                     ConcertoReport* report, const ProgressFn& progress = nullptr);

}  // namespace concerto
