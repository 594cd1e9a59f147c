// A job, and the one pipeline every command runs it through.
//
// A job names where its program comes from (a program in memory, an IR file,
// or a model lowered under a plan or a sharding file), the machine model it is
// priced on (a cluster and an optional profile database), how it is scheduled
// (a schedule file, a baseline or concerto) and the option table's values.
// RunJob turns it into a scheduled, verified and simulated program with
// RunScheduler (driver.h): `concerto simulate`, `schedule`, `run` and
// concerto_mpi_run call RunJob, `compare` and `demo` call CompareJob (the same
// RunScheduler once per scheduler). So one command line gives one schedule,
// whichever command runs it: `run --scheduler concerto` executes the schedule
// `simulate --scheduler concerto` simulates (tests/driver/job_test.cc).
//
// The runtime receives the ScheduledProgram and nothing else; the parts of a
// measured run that need lowering (the unsharded reference of --check, the
// fused-QKV init layouts of a model) live here, not in runtime/.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "concerto/cost/cost_model.h"
#include "concerto/driver/driver.h"
#include "concerto/driver/options.h"
#include "concerto/runtime/executor.h"
#include "concerto/runtime/launcher_job.h"
#include "concerto/sim/lower_bound.h"
#include "concerto/util/status.h"

namespace concerto {

/// What to schedule, on which machine model, with which scheduler.
struct JobSpec {
  /// The program: `program` when set, else `program_file` (IR JSON), else
  /// `model` (a preset or a model file) lowered under `sharding` (a per-op
  /// sharding file) when given, else under `plan` (a plan string or file).
  std::optional<Program> program;
  std::string program_file;
  std::string model;
  std::string plan = "dp=1";
  std::string sharding;
  /// The schedule: read from `schedule_file` (verified), else made by
  /// `scheduler` (a baseline name or "concerto").
  std::string schedule_file;
  std::string scheduler = "fifo";
  /// The cost model: a cluster preset or file, plus an optional profile database.
  std::string cluster = "a800-4x8";
  std::string profile;
  /// > 0: the cluster scaled to this many nodes (same nodes, links and
  /// devices; `--nodes`). 0: the cluster's own node count.
  int nodes = 0;
  /// The option table's values (concerto's search, the baselines' buckets,
  /// the simulation, the memory budget).
  Options options;
};

/// The cost model of `cluster` (preset or file; scaled to `nodes` nodes when
/// > 0) and optional `profile`: an AnalyticCostModel, or a ProfiledCostModel
/// over the database.
Result<std::unique_ptr<CostModel>> MakeCostModel(const std::string& cluster, const std::string& profile,
                                                 int nodes = 0);
/// A cluster preset or file scaled to `nodes` nodes (0: as it is); the name
/// gets "xN" ("a100-dgx x16") when scaled. Errors name the cluster.
Result<ClusterSpec> LoadClusterNodes(const std::string& cluster, int nodes);

/// A job's program and how to name it in reports ("FILE", "MODEL (PLAN)").
struct JobProgram {
  Program program;
  std::string label;
};
/// Loads or lowers the job's program; errors name the file, model or plan.
Result<JobProgram> LoadJobProgram(const JobSpec& spec, const ProgressFn& progress = nullptr);

/// An error when `program` needs more ranks than `cluster` has devices (with
/// the fix); a note through `progress` when it uses only part of it.
Status CheckProgramFitsCluster(const Program& program, const ClusterSpec& cluster,
                               const ProgressFn& progress = nullptr);

/// A job run: its program's label, the cost model it was priced on, and the
/// scheduler's run (scheduled program, simulated timeline, summary, reports).
struct JobResult {
  std::string label;
  std::unique_ptr<CostModel> cost;
  RunResult run;
};

/// The pipeline: program, cost model, the cluster check, then the schedule
/// (read and verified, or RunScheduler: decomposition and concerto's search,
/// or a baseline), simulated and summarised. `hook` sees the IR after each
/// pass (PassNames()).
Result<JobResult> RunJob(const JobSpec& spec, const PassHook& hook = nullptr, const ProgressFn& progress = nullptr);

/// Every scheduler in `schedulers` on the job's program (spec.scheduler and
/// spec.schedule_file are ignored), through the same RunScheduler as RunJob.
struct CompareResult {
  std::string label;
  std::unique_ptr<CostModel> cost;
  LowerBound input_bound;  // of the program as given, before any rewrite
  std::vector<RunResult> runs;  // one per scheduler, then kEqualMemoryRow when AddEqualMemoryRun made it
  std::string equal_memory_missing;  // why concerto could not be held to the best baseline's memory
};
Result<CompareResult> CompareJob(const JobSpec& spec, const std::vector<std::string>& schedulers,
                                 const ProgressFn& progress = nullptr);

/// The `--json` report of a job run (`concerto simulate --json`): the
/// summary, the cluster, the option table's values and the passes' reports.
nlohmann::json JobResultJson(const JobSpec& spec, const JobResult& job);
/// The `--json` report of a comparison (`concerto compare --json`).
nlohmann::json CompareResultJson(const JobSpec& spec, const CompareResult& compared);

/// RunJob for execution: the job's run, refused before anything is launched
/// unless the runtime can run it (CheckRunnable: the program and schedule
/// verify, every compute op has a kernel); a schedule file that fails names
/// itself.
Result<JobResult> PrepareJob(const JobSpec& spec, const ProgressFn& progress = nullptr);

// ---- measured runs ----

/// The options of a model's run: the fused-QKV layout of decoder presets and
/// model files (InitOptions::layouts), so that the run and the unsharded
/// reference hold the same global values. Empty model, or one that is not a
/// decoder: the defaults.
Result<RunOptions> JobRunOptions(const std::string& model);

/// Lowers `model` unsharded (dp = tp = 1, batch x dp, the plan's
/// micro-batches; `plan` is a plan string or a plan file), runs it in process
/// with the fifo schedule, and compares `run` of `sp` with it
/// (CompareToReference). Returns the report's summary line, or an error naming
/// the first diverging tensor.
Result<std::string> CheckAgainstReference(const std::string& model, const std::string& plan,
                                          const ScheduledProgram& sp, const ExecutionResult& run,
                                          const RunOptions& options);

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
/// Runs `sp` warmup + iterations times in process (buffers initialised once)
/// and measures the last `iterations`; with check, job.check holds the
/// reference's summary (a mismatch is an error naming the first diverging
/// tensor).
Result<MeasuredJob> RunLocalJob(const ScheduledProgram& sp, const LocalJobOptions& options);

/// One JSON object: the scheduler, ranks, iteration_us, median/min/max
/// iteration_us, the figures of the median iteration on the rank with most
/// exposed communication (compute/comm busy, exposed comm, overlap), and
/// `predicted_iteration_us` when `predicted` (the simulated run of the same
/// schedule) is given.
nlohmann::json MeasuredJobJson(const ScheduledProgram& sp, const MeasuredJob& job, const CostModel& cost,
                               const Summary* predicted = nullptr);
/// The same as a few lines of text.
std::string MeasuredJobText(const ScheduledProgram& sp, const MeasuredJob& job, const CostModel& cost,
                            const Summary* predicted = nullptr);

}  // namespace concerto
