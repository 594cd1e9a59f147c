// The figures of a measured run (every iteration's time, the timeline of the
// median one), running a scheduled program in process for several
// iterations, and packing a scheduled program for other ranks. Shared by
// `concerto run` and concerto_mpi_run; the job that produces the scheduled
// program is the driver's (driver/job.h).
#pragma once

#include <string>
#include <vector>

#include "concerto/runtime/executor.h"
#include "concerto/schedule/schedule.h"
#include "concerto/sim/simulator.h"
#include "concerto/util/status.h"

namespace concerto {

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

/// Runs `sp` in this process (threads as ranks) `warmup + iterations` times
/// on buffers initialised once (RunInProcessSteps) and measures the last
/// `iterations`; `first` (when not null) gets the tensors after the first
/// step, for the reference check.
Result<MeasuredJob> RunJobInProcess(const ScheduledProgram& sp, const RunOptions& options, int iterations,
                                    int warmup, ExecutionResult* first = nullptr);

/// Serialises a scheduled program (program and schedule JSON) for sending
/// to other ranks, and reads it back (verified again by the reader).
std::string PackScheduledProgram(const ScheduledProgram& sp);
Result<ScheduledProgram> UnpackScheduledProgram(const std::string& bytes, const std::string& source);

}  // namespace concerto
