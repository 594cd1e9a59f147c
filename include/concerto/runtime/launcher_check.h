// The executor-facing half of a run job: running it in process over
// FakeWorld for several iterations, and the reference check of a decoder
// model's run. Separate from launcher_job.h because it includes
// executor.h, whose RunResult differs from the driver's.
#pragma once

#include <string>

#include "concerto/runtime/executor.h"
#include "concerto/runtime/launcher_job.h"

namespace concerto {

/// The options of a model's run: the fused-QKV layout of decoder presets
/// and spec files (InitOptions::layouts), so that the run and the
/// unsharded reference hold the same global values. Empty model: defaults.
Result<RunOptions> JobRunOptions(const std::string& model);

/// Runs `sp` in this process (threads as ranks) `warmup + iterations` times
/// on buffers initialised once (RunInProcessSteps) and measures the last
/// `iterations`; `first` (when not null) gets the tensors after the first
/// step, for the reference check.
Result<MeasuredJob> RunJobInProcess(const ScheduledProgram& sp, const RunOptions& options, int iterations,
                                    int warmup, RunResult* first = nullptr);

/// Lowers `model` unsharded (dp = tp = 1, batch x dp, the plan's
/// micro-batches; `plan` is a plan string or a plan file, LoadPlan), runs it in process with the fifo schedule, and compares
/// `run` of `sp` with it (CompareToReference). Returns the report's summary
/// line, or an error naming the first diverging tensor.
Result<std::string> CheckAgainstReference(const std::string& model, const std::string& plan,
                                          const ScheduledProgram& sp, const RunResult& run,
                                          const RunOptions& options);

}  // namespace concerto
