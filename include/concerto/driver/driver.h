// The driver: the passes in a straight line (read, schedule, verify,
// simulate, report), each callable alone, with the IR dumpable after any.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "concerto/cost/cost_model.h"
#include "concerto/decompose/decompose.h"
#include "concerto/driver/options.h"
#include "concerto/report/report.h"
#include "concerto/schedule/schedule.h"
#include "concerto/schedule/concerto_scheduler.h"
#include "concerto/schedule/scheduler.h"
#include "concerto/sim/simulator.h"

namespace concerto {

/// Pass names accepted by --dump-after.
std::vector<std::string> PassNames();

/// Called with (pass name, program) after each pass; the CLI uses it to dump IR.
using PassHook = std::function<void(const std::string&, const Program&)>;

/// Every scheduler the driver can run, baselines first.
std::vector<std::string> SchedulerNames();

/// BaselineOptions filled from the option table.
BaselineOptions ToBaselineOptions(const Options& options);

/// DecomposeOptions filled from the option table.
DecomposeOptions ToDecomposeOptions(const Options& options);

/// The decomposition pass as the driver runs it before the concerto
/// scheduler: simulates the fifo schedule of `program` to find which
/// activation collectives are exposed, decomposes those where the cost
/// model says it pays (DecomposeCollectives), and keeps the result only when
/// its own fifo schedule simulates faster; otherwise returns `program`
/// unchanged with report->rejected set.
Result<Program> DecomposeWherePays(const Program& program, const CostModel& cost, const Options& options,
                                   DecomposeReport* report);

/// ConcertoOptions filled from the option table.
ConcertoOptions ToConcertoOptions(const Options& options);
/// The same with the memory budget resolved against `cluster` ("device":
/// its memory minus its reserve).
ConcertoOptions ToConcertoOptions(const Options& options, const ClusterSpec& cluster);
/// The memory budget per rank the options ask for on `cluster`, bytes (0: none).
int64_t MemoryBudgetBytes(const Options& options, const ClusterSpec& cluster);

/// One scheduler run end to end on one cost model.
struct RunResult {
  ScheduledProgram scheduled;
  Timeline timeline;
  Summary summary;
  std::optional<ConcertoReport> concerto;    // set for the concerto scheduler
  std::optional<DecomposeReport> decompose;  // set for the concerto scheduler
};

/// Schedules with `scheduler`, checks the schedule with the independent
/// verifier (a violation is an error listing them), simulates and summarizes.
Result<RunResult> RunScheduler(const Program& program, const std::string& scheduler, const CostModel& cost,
                               const Options& options, const PassHook& hook = nullptr,
                               const ProgressFn& progress = nullptr);

/// The figures of one baseline's schedule that a plan search needs.
struct StepFigures {
  double makespan_us = 0;
  int64_t peak_memory_bytes = 0;
  bool fits_memory = true;  // against the options' budget on the cost model's cluster
  int num_ops = 0;          // ops per simulated rank, summed over roles
};
/// RunScheduler for a baseline without the summary (its bounds, critical
/// path and exposure take longer than the simulation): schedule, verify,
/// simulate, peak memory.
Result<StepFigures> SimulateBaselineStep(const Program& program, const std::string& baseline, const CostModel& cost,
                                         const Options& options);

/// Simulates a given schedule (after verifying it).
Result<RunResult> RunGivenSchedule(const Program& program, const Schedule& schedule, const CostModel& cost,
                                   const Options& options);

/// Runs every scheduler in `schedulers`; progress lines go to `progress` when set.
Result<std::vector<RunResult>> Compare(const Program& program, const std::vector<std::string>& schedulers,
                                       const CostModel& cost, const Options& options,
                                       const std::function<void(const std::string&)>& progress = nullptr);

/// The row AddEqualMemoryRun adds to a comparison.
inline constexpr const char* kEqualMemoryRow = "concerto-eqmem";

/// Concerto held to the fastest baseline's memory: when `runs` (a Compare's)
/// hold a concerto run whose peak is above the peak of the fastest baseline
/// that fits the budget, schedules concerto again with that peak as its
/// memory budget and appends the run as kEqualMemoryRow (a gain bought with
/// memory is no gain to a user who needs that memory for a larger batch).
/// Nothing is added when concerto already fits it, when no baseline fits, or
/// when `options`' own budget is already at or under it; a budget concerto
/// cannot meet is not an error: the row is then missing and the reason is
/// returned in `why_not` (when set).
void AddEqualMemoryRun(const Program& program, const CostModel& cost, const Options& options,
                         std::vector<RunResult>* runs, const ProgressFn& progress = nullptr,
                         std::string* why_not = nullptr);

/// A fixed-width comparison table (one row per scheduler); `input_bound` is
/// the lower bound of the program before any scheduler rewrote it.
std::string CompareTable(const std::vector<RunResult>& runs, const LowerBound& input_bound,
                         const std::string& title);
/// The comparison as one JSON object.
nlohmann::json CompareJson(const std::vector<RunResult>& runs, const LowerBound& input_bound,
                           const std::string& cluster);

}  // namespace concerto
