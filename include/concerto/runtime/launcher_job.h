// A run job: which program, which schedule (a file, a baseline, or the
// Concerto scheduler), how many measured iterations; and the figures of a
// measured run (median iteration, its timeline). Shared by `concerto run`
// and concerto_mpi_run, so that both prepare and report a job the same way.
// This header does not include executor.h (the driver has its own
// RunResult type); launcher_check.h has the executor-facing parts.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "concerto/cost/cost_model.h"
#include "concerto/schedule/schedule.h"
#include "concerto/sim/simulator.h"
#include "concerto/util/status.h"

namespace concerto {

/// Where the program and its schedule come from.
struct JobSpec {
  std::string program_file;   // a lowered program (IR JSON), or
  std::string model, plan;    // a model (preset or spec file) lowered under a plan
  std::string schedule_file;  // a schedule for the program (verified), or
  std::string scheduler = "fifo";  // a baseline name or "concerto"
  /// The cost model the scheduler plans with: a cluster preset or file,
  /// plus an optional profile database.
  std::string cluster = "a800-4x8";
  std::string profile;
  /// Concerto scheduler settings (see docs/concerto.md).
  int concerto_block_ops = 125;
  int concerto_rounds = 4;
  double concerto_time_budget_s = 60;
};

/// The cost model of `cluster` (preset or file) and optional `profile`.
Result<std::unique_ptr<CostModel>> MakeJobCostModel(const std::string& cluster, const std::string& profile);

/// Loads or lowers the program, makes or reads its schedule and checks that
/// the runtime can run the pair (CheckRunnable: the program verifies, the
/// schedule passes the verifier, every compute op has a kernel). A schedule
/// that fails verification is refused here, before anything is launched,
/// with the verifier's message. `progress` gets one line per step.
Result<ScheduledProgram> PrepareJob(const JobSpec& spec,
                                    const std::function<void(const std::string&)>& progress = nullptr);

/// A measured run: every measured iteration's time, and the timeline of the
/// median one (times since each rank left the start barrier).
struct MeasuredJob {
  std::vector<double> iteration_us;  // measured iterations, in order
  double median_iteration_us = 0;
  int median_iteration = 0;          // index into iteration_us
  int warmup = 0;                    // iterations run before, not measured
  Timeline timeline;                 // of the median iteration, every rank
  std::string check;                 // the reference check's summary, if run
};

/// The iteration time of one step: the latest end of any op on any rank.
double IterationTimeUs(const std::vector<std::vector<OpRecord>>& per_rank);

/// Builds a MeasuredJob from the per-rank records of each measured
/// iteration (records[i][r]: iteration i, rank r). The median of an even
/// count is the lower middle value (an iteration that really ran).
/// Errors: no iterations.
Result<MeasuredJob> SummarizeMeasuredJob(const Program& program,
                                         const std::vector<std::vector<std::vector<OpRecord>>>& records,
                                         int warmup);

/// One JSON object: the scheduler, ranks, iteration_us, median/min/max
/// iteration_us, and the figures of the median iteration on the rank with
/// most exposed communication (compute/comm busy, exposed comm, overlap).
nlohmann::json MeasuredJobJson(const ScheduledProgram& sp, const MeasuredJob& job, const CostModel& cost);
/// The same as a few lines of text.
std::string MeasuredJobText(const ScheduledProgram& sp, const MeasuredJob& job, const CostModel& cost);

/// A run in this process (threads as ranks over FakeWorld).
struct LocalJobOptions {
  int iterations = 1;
  int warmup = 0;
  double timeout_s = 30;
  bool check = false;         // compare the first step with the unsharded reference
  std::string model, plan;    // the reference's model and plan (check), and init layouts
  std::string fail_op;        // fault injection: this op fails on fail_rank
  int fail_rank = -1;
};
/// Runs `sp` warmup + iterations times in process (buffers initialised
/// once) and measures the last `iterations`; with check, job.check holds the reference's summary (a
/// mismatch is an error naming the first diverging tensor).
Result<MeasuredJob> RunLocalJob(const ScheduledProgram& sp, const LocalJobOptions& options);

/// Serialises a scheduled program (program and schedule JSON) for sending
/// to other ranks, and reads it back (verified again by the reader).
std::string PackScheduledProgram(const ScheduledProgram& sp);
Result<ScheduledProgram> UnpackScheduledProgram(const std::string& bytes, const std::string& source);

}  // namespace concerto
