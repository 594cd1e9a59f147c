// Run jobs: preparing a scheduled program from files, presets and
// schedulers; measuring iterations; the reference check; and the figures of
// a measured run.
#include "concerto/runtime/launcher_job.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fmt/format.h>

#include "concerto/cost/cluster.h"
#include "concerto/ir/json_io.h"
#include "concerto/lower/frontend.h"
#include "concerto/lower/plan.h"
#include "concerto/lower/transformer.h"
#include "concerto/report/report.h"
#include "concerto/runtime/launcher_check.h"
#include "concerto/runtime/reference.h"
#include "concerto/schedule/concerto_scheduler.h"
#include "concerto/schedule/scheduler.h"

namespace concerto {

Result<std::unique_ptr<CostModel>> MakeJobCostModel(const std::string& cluster, const std::string& profile) {
  Result<ClusterSpec> spec = LoadCluster(cluster);
  if (!spec.ok()) return spec.status();
  if (profile.empty()) return std::unique_ptr<CostModel>(new AnalyticCostModel(*spec));
  Result<ProfileDb> db = ProfileDb::Read(profile);
  if (!db.ok()) return db.status();
  return std::unique_ptr<CostModel>(new ProfiledCostModel(std::move(db).value(), *spec));
}

namespace {

/// The program of a job: read from its file or lowered from model and plan.
Result<Program> JobProgram(const JobSpec& spec) {
  if (!spec.program_file.empty()) return ReadProgramFile(spec.program_file);
  if (spec.model.empty() || spec.plan.empty())
    return Status::Error("give a program file or a model and a plan");
  return LowerModelPlan(spec.model, spec.plan);
}

/// The job's schedule: read from its file, or made by a baseline or by Concerto.
Result<ScheduledProgram> JobSchedule(const JobSpec& spec, Program program, const CostModel& cost,
                                     const std::function<void(const std::string&)>& progress) {
  if (!spec.schedule_file.empty()) {
    Result<Schedule> schedule = ReadScheduleFile(spec.schedule_file);
    if (!schedule.ok()) return schedule.status();
    return ScheduledProgram{std::move(program), std::move(schedule).value()};
  }
  if (spec.scheduler != "concerto") return RunBaseline(spec.scheduler, program, cost);
  ConcertoOptions options;
  options.block_ops = spec.concerto_block_ops;
  options.rounds = spec.concerto_rounds;
  options.time_budget_s = spec.concerto_time_budget_s;
  ConcertoReport report;
  return RunConcerto(program, cost, options, &report, progress);
}

}  // namespace

Result<ScheduledProgram> PrepareJob(const JobSpec& spec,
                                    const std::function<void(const std::string&)>& progress) {
  auto say = [&](const std::string& line) {
    if (progress) progress(line);
  };
  Result<Program> program = JobProgram(spec);
  if (!program.ok()) return program.status();
  Result<std::unique_ptr<CostModel>> cost = MakeJobCostModel(spec.cluster, spec.profile);
  if (!cost.ok()) return cost.status();
  say(spec.schedule_file.empty() ? "scheduling with '" + spec.scheduler + "' on " + (*cost)->cluster().name
                                  : "reading schedule " + spec.schedule_file);
  Result<ScheduledProgram> sp = JobSchedule(spec, std::move(program).value(), **cost, progress);
  if (!sp.ok()) return sp.status();
  Status runnable = CheckRunnable(*sp);
  if (!runnable.ok() && !spec.schedule_file.empty())
    return Status::Error(spec.schedule_file + ": " + runnable.message() +
                         "\n(a schedule written by `concerto schedule` belongs to the program it writes beside "
                         "it, OUTPUT.program.json)");
  if (!runnable.ok()) return runnable;
  return sp;
}

double IterationTimeUs(const std::vector<std::vector<OpRecord>>& per_rank) {
  double t = 0;
  for (const auto& records : per_rank)
    for (const OpRecord& r : records) t = std::max(t, r.end_us);
  return t;
}

Result<MeasuredJob> SummarizeMeasuredJob(const Program& program,
                                         const std::vector<std::vector<std::vector<OpRecord>>>& records,
                                         int warmup) {
  if (records.empty()) return Status::Error("no measured iterations");
  MeasuredJob job;
  job.warmup = warmup;
  for (const auto& per_rank : records) job.iteration_us.push_back(IterationTimeUs(per_rank));
  std::vector<int> order(job.iteration_us.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return job.iteration_us[a] < job.iteration_us[b]; });
  job.median_iteration = order[(order.size() - 1) / 2];
  job.median_iteration_us = job.iteration_us[job.median_iteration];
  job.timeline = MakeMeasuredTimeline(program, records[job.median_iteration]);
  return job;
}

nlohmann::json MeasuredJobJson(const ScheduledProgram& sp, const MeasuredJob& job, const CostModel& cost) {
  const Summary s = Summarize(sp, job.timeline, cost);
  nlohmann::json j;
  j["program"] = sp.program.name;
  j["scheduler"] = sp.schedule.scheduler;
  j["ranks"] = sp.program.mesh.NumRanks();
  j["warmup_iterations"] = job.warmup;
  j["iterations"] = job.iteration_us.size();
  j["iteration_us"] = job.iteration_us;
  j["median_iteration_us"] = job.median_iteration_us;
  j["min_iteration_us"] = *std::min_element(job.iteration_us.begin(), job.iteration_us.end());
  j["max_iteration_us"] = *std::max_element(job.iteration_us.begin(), job.iteration_us.end());
  j["median_iteration_index"] = job.median_iteration;
  j["report_rank"] = s.report_rank;
  j["compute_busy_us"] = s.compute_busy_us;
  j["comm_busy_us"] = s.comm_busy_us;
  j["exposed_comm_us"] = s.exposed_comm_us;
  j["overlap_ratio"] = s.overlap_ratio;
  nlohmann::json busy = nlohmann::json::array();
  for (const RankStreamStats& b : job.timeline.busy)
    busy.push_back({{"rank", b.rank}, {"stream", b.stream}, {"busy_us", b.busy_us}});
  j["busy"] = busy;
  if (!job.check.empty()) j["check"] = job.check;
  return j;
}

std::string MeasuredJobText(const ScheduledProgram& sp, const MeasuredJob& job, const CostModel& cost) {
  const Summary s = Summarize(sp, job.timeline, cost);
  std::string out = fmt::format(
      "measured {} on {} ranks: median iteration {:.3f} ms over {} iterations (after {} warm-up; min {:.3f}, max "
      "{:.3f} ms)\n"
      "rank {} (median iteration): compute busy {:.3f} ms, comm busy {:.3f} ms, exposed comm {:.3f} ms, overlap "
      "{:.1f}%\n",
      sp.schedule.scheduler, sp.program.mesh.NumRanks(), job.median_iteration_us / 1e3, job.iteration_us.size(),
      job.warmup, *std::min_element(job.iteration_us.begin(), job.iteration_us.end()) / 1e3,
      *std::max_element(job.iteration_us.begin(), job.iteration_us.end()) / 1e3, s.report_rank,
      s.compute_busy_us / 1e3, s.comm_busy_us / 1e3, s.exposed_comm_us / 1e3, 100 * s.overlap_ratio);
  if (!job.check.empty()) out += "reference check passed: " + job.check + "\n";
  return out;
}

std::string PackScheduledProgram(const ScheduledProgram& sp) {
  const std::string program = WriteProgram(sp.program);
  const std::string schedule = WriteSchedule(sp.schedule);
  std::string out;
  const uint64_t n = program.size();
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  out += program;
  out += schedule;
  return out;
}

Result<ScheduledProgram> UnpackScheduledProgram(const std::string& bytes, const std::string& source) {
  uint64_t n = 0;
  if (bytes.size() < sizeof n) return Status::Error(source + ": truncated scheduled program");
  std::memcpy(&n, bytes.data(), sizeof n);
  if (bytes.size() - sizeof n < n) return Status::Error(source + ": truncated scheduled program");
  Result<Program> program = ParseProgram(bytes.substr(sizeof n, n), source + " (program)");
  if (!program.ok()) return program.status();
  Result<Schedule> schedule = ParseSchedule(bytes.substr(sizeof n + n), source + " (schedule)");
  if (!schedule.ok()) return schedule.status();
  return ScheduledProgram{std::move(program).value(), std::move(schedule).value()};
}

Result<MeasuredJob> RunLocalJob(const ScheduledProgram& sp, const LocalJobOptions& local) {
  Result<RunOptions> options = JobRunOptions(local.model);
  if (!options.ok()) return options.status();
  options->timeout_s = local.timeout_s;
  options->fail_op = local.fail_op;
  options->fail_rank = local.fail_rank;
  RunResult first;
  Result<MeasuredJob> job = RunJobInProcess(sp, *options, local.iterations, local.warmup, &first);
  if (!job.ok() || !local.check) return job;
  Result<std::string> check = CheckAgainstReference(local.model, local.plan, sp, first, *options);
  if (!check.ok()) return Status::Error("check failed: " + check.status().message());
  job->check = *check;
  return job;
}

// ---- launcher_check.h ----

Result<RunOptions> JobRunOptions(const std::string& model) {
  RunOptions options;
  if (model.empty()) return options;
  Result<ModelConfig> m = LoadModel(model);
  if (!m.ok()) return options;  // not a decoder (e.g. Evoformer): no fused layouts
  const int64_t d = m->hidden / m->heads;
  options.init.layouts = {FusedQkvLayout(m->hidden, int64_t{m->kv_heads} * d)};
  return options;
}

Result<MeasuredJob> RunJobInProcess(const ScheduledProgram& sp, const RunOptions& options, int iterations,
                                    int warmup, RunResult* first) {
  if (iterations < 1) return Status::Error("--iterations must be at least 1");
  if (warmup < 0) return Status::Error("--warmup must be at least 0");
  // Buffers are allocated and initialised once; every step computes the
  // same values, and `first` gets the tensors after the first step.
  std::vector<std::vector<std::vector<OpRecord>>> steps;
  Result<RunResult> run = RunInProcessSteps(sp, options, warmup + iterations, &steps);
  if (!run.ok()) return run.status();
  std::vector<std::vector<std::vector<OpRecord>>> measured(std::make_move_iterator(steps.begin() + warmup),
                                                           std::make_move_iterator(steps.end()));
  if (first) *first = std::move(run).value();
  return SummarizeMeasuredJob(sp.program, measured, warmup);
}

Result<std::string> CheckAgainstReference(const std::string& model_name, const std::string& plan_text,
                                          const ScheduledProgram& sp, const RunResult& run,
                                          const RunOptions& options) {
  Result<ModelConfig> model = LoadModel(model_name);
  if (!model.ok()) return Status::Error("--check needs a decoder model (" + model.status().message() + ")");
  Result<ParallelPlan> plan = LoadPlan(plan_text);  // a plan string or a plan file
  if (!plan.ok()) return plan.status();
  ModelConfig ref_model = *model;
  ref_model.batch = model->batch * plan->dp;
  ParallelPlan ref_plan;
  ref_plan.microbatches = plan->microbatches;
  Result<Program> ref_program = LowerTransformer(ref_model, ref_plan);
  if (!ref_program.ok()) return Status::Error("reference: " + ref_program.status().message());
  Result<ClusterSpec> cluster = LoadCluster("a800-4x8");
  if (!cluster.ok()) return cluster.status();
  const AnalyticCostModel cost(*cluster);
  Result<ScheduledProgram> ref_sp = RunBaseline("fifo", *ref_program, cost);
  if (!ref_sp.ok()) return Status::Error("reference: " + ref_sp.status().message());
  RunOptions ref_options = options;
  ref_options.fail_op.clear();
  ref_options.fail_rank = -1;
  ref_options.before_op = nullptr;
  ref_options.after_op = nullptr;
  Result<RunResult> ref_run = RunInProcess(*ref_sp, ref_options);
  if (!ref_run.ok()) return Status::Error("reference run: " + ref_run.status().message());
  Result<ReferenceReport> report =
      CompareToReference(*ref_sp, *ref_run, sp, run, Tolerance{}, options.init.layouts);
  if (!report.ok()) return report.status();
  return report->Summary();
}

}  // namespace concerto
