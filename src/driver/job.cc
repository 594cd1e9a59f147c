// The job pipeline (driver/job.h): program source, cost model, scheduler,
// simulation; and the parts of a measured run that need lowering.
#include "concerto/driver/job.h"

#include <algorithm>
#include <fmt/format.h>

#include "concerto/cost/cluster.h"
#include "concerto/ir/json_io.h"
#include "concerto/lower/frontend.h"
#include "concerto/lower/plan.h"
#include "concerto/lower/sharding_plan.h"
#include "concerto/lower/transformer.h"
#include "concerto/report/report.h"
#include "concerto/runtime/launcher_job.h"
#include "concerto/decompose/decompose.h"
#include "concerto/runtime/reference.h"
#include "concerto/schedule/concerto_scheduler.h"
#include "concerto/schedule/scheduler.h"

namespace concerto {

Result<ClusterSpec> LoadClusterNodes(const std::string& cluster, int nodes) {
  Result<ClusterSpec> spec = LoadCluster(cluster);
  if (!spec.ok()) return spec.status();
  if (nodes < 0 || nodes > (1 << 20))
    return Status::Error(fmt::format("nodes: expected 1..{} (0 keeps cluster '{}''s {}), got {}", 1 << 20,
                                     spec->name, spec->nodes, nodes));
  if (nodes > 0 && static_cast<int64_t>(nodes) * spec->devices_per_node > (1 << 24))  // the reader's limit
    return Status::Error(fmt::format("--nodes {}: {} nodes x {} devices per node of cluster '{}' is {} devices, more "
                                     "than the {} a cluster may have",
                                     nodes, nodes, spec->devices_per_node, spec->name,
                                     static_cast<int64_t>(nodes) * spec->devices_per_node, 1 << 24));
  if (nodes > 0 && nodes != spec->nodes) {
    spec->nodes = nodes;
    spec->name += fmt::format(" x{}", nodes);
  }
  return spec;
}

Result<std::unique_ptr<CostModel>> MakeCostModel(const std::string& cluster, const std::string& profile, int nodes) {
  Result<ClusterSpec> spec = LoadClusterNodes(cluster, nodes);
  if (!spec.ok()) return spec.status();
  if (profile.empty()) return std::unique_ptr<CostModel>(new AnalyticCostModel(*spec));
  Result<ProfileDb> db = ProfileDb::Read(profile);
  if (!db.ok()) return db.status();
  return std::unique_ptr<CostModel>(new ProfiledCostModel(std::move(db).value(), *spec));
}

Result<JobProgram> LoadJobProgram(const JobSpec& spec, const ProgressFn& progress) {
  if (spec.program) return JobProgram{*spec.program, spec.program->name};
  if (!spec.program_file.empty()) {
    Result<Program> p = ReadProgramFile(spec.program_file);
    if (!p.ok()) return p.status();
    return JobProgram{std::move(p).value(), spec.program_file};
  }
  if (spec.model.empty()) return Status::Error("give a program file or a model (with a plan or a sharding file)");
  JobProgram out;
  if (!spec.sharding.empty()) {
    Result<ShardingPlan> plan = LoadShardingPlan(spec.sharding);
    if (!plan.ok()) return plan.status();
    out.label = spec.model + " (sharding " + spec.sharding + ")";
    if (progress) progress("lowering " + out.label);
    Result<Program> p = LowerModelSharding(spec.model, *plan);
    if (!p.ok()) return p.status();
    out.program = std::move(p).value();
    return out;
  }
  Result<ParallelPlan> plan = LoadPlan(spec.plan);
  if (!plan.ok()) return plan.status();
  out.label = spec.model + " (" + PlanToString(*plan) + ")";
  if (progress) progress("lowering " + out.label);
  Result<Program> p = LowerModelPlan(spec.model, spec.plan);
  if (!p.ok()) return p.status();
  out.program = std::move(p).value();
  return out;
}

Status CheckProgramFitsCluster(const Program& program, const ClusterSpec& c, const ProgressFn& progress) {
  const int ranks = program.mesh.NumRanks();
  if (ranks > c.NumDevices())
    return Status::Error(fmt::format(
        "program needs {} ranks but cluster '{}' has {} devices ({} nodes x {}): a plan's degrees (dp x tp x pp "
        "x ...) must multiply to at most {}, or name a larger cluster (concerto clusters)",
        ranks, c.name, c.NumDevices(), c.nodes, c.devices_per_node, c.NumDevices()));
  // Fewer ranks than devices is allowed (a program may use part of a
  // cluster) but never silent: dp=3,tp=8 on 32 devices leaves 8 idle.
  if (ranks < c.NumDevices() && progress)
    progress(fmt::format("note: the program uses {} of cluster '{}''s {} devices; the other {} stay idle", ranks,
                         c.name, c.NumDevices(), c.NumDevices() - ranks));
  return Status::Ok();
}

namespace {

/// The program and cost model of a job, checked against each other.
Status LoadProgramAndCost(const JobSpec& spec, const ProgressFn& progress, JobProgram* program,
                          std::unique_ptr<CostModel>* cost) {
  Result<JobProgram> p = LoadJobProgram(spec, progress);
  if (!p.ok()) return p.status();
  *program = std::move(p).value();
  Result<std::unique_ptr<CostModel>> c = MakeCostModel(spec.cluster, spec.profile, spec.nodes);
  if (!c.ok()) return c.status();
  *cost = std::move(c).value();
  return CheckProgramFitsCluster(program->program, (*cost)->cluster(), progress);
}

}  // namespace

Result<JobResult> RunJob(const JobSpec& spec, const PassHook& hook, const ProgressFn& progress) {
  JobProgram program;
  JobResult out;
  CONCERTO_RETURN_IF_ERROR(LoadProgramAndCost(spec, progress, &program, &out.cost));
  out.label = program.label;
  Result<RunResult> run = Status::Error("unreachable");
  if (!spec.schedule_file.empty()) {
    Result<Schedule> schedule = ReadScheduleFile(spec.schedule_file);
    if (!schedule.ok()) return schedule.status();
    if (hook) hook("read", program.program);
    if (progress) progress("reading schedule " + spec.schedule_file + " and simulating");
    run = RunGivenSchedule(program.program, *schedule, *out.cost, spec.options);
    if (!run.ok()) return Status::Error(spec.schedule_file + ": " + run.status().message());
  } else {
    if (progress)
      progress("scheduling with '" + spec.scheduler + "' on " + out.cost->cluster().name + " and simulating");
    run = RunScheduler(program.program, spec.scheduler, *out.cost, spec.options, hook, progress);
    if (!run.ok()) return run.status();
  }
  out.run = std::move(run).value();
  return out;
}

Result<CompareResult> CompareJob(const JobSpec& spec, const std::vector<std::string>& schedulers,
                                 const ProgressFn& progress) {
  JobProgram program;
  CompareResult out;
  CONCERTO_RETURN_IF_ERROR(LoadProgramAndCost(spec, progress, &program, &out.cost));
  out.label = program.label;
  out.input_bound = ComputeLowerBound(program.program, *out.cost);
  Result<std::vector<RunResult>> runs = Compare(program.program, schedulers, *out.cost, spec.options, progress);
  if (!runs.ok()) return runs.status();
  out.runs = std::move(runs).value();
  AddEqualMemoryRun(program.program, *out.cost, spec.options, &out.runs, progress, &out.equal_memory_missing);
  return out;
}

Result<JobResult> PrepareJob(const JobSpec& spec, const ProgressFn& progress) {
  Result<JobResult> job = RunJob(spec, nullptr, progress);
  if (!job.ok()) return job.status();
  Status runnable = CheckRunnable(job->run.scheduled);
  if (!runnable.ok() && !spec.schedule_file.empty())
    return Status::Error(spec.schedule_file + ": " + runnable.message() +
                         "\n(a schedule written by `concerto schedule` belongs to the program it writes beside "
                         "it, OUTPUT.program.json)");
  if (!runnable.ok()) return runnable;
  return job;
}

// ---- measured runs ----

Result<RunOptions> JobRunOptions(const std::string& model) {
  RunOptions options;
  if (model.empty()) return options;
  Result<ModelConfig> m = LoadModel(model);
  if (!m.ok()) return options;  // not a decoder (e.g. Evoformer): no fused layouts
  const int64_t d = m->hidden / m->heads;
  options.init.layouts = {FusedQkvLayout(m->hidden, int64_t{m->kv_heads} * d)};
  return options;
}

Result<std::string> CheckAgainstReference(const std::string& model_name, const std::string& plan_text,
                                          const ScheduledProgram& sp, const ExecutionResult& run,
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
  Result<ExecutionResult> ref_run = RunInProcess(*ref_sp, ref_options);
  if (!ref_run.ok()) return Status::Error("reference run: " + ref_run.status().message());
  Result<ReferenceReport> report =
      CompareToReference(*ref_sp, *ref_run, sp, run, Tolerance{}, options.init.layouts);
  if (!report.ok()) return report.status();
  return report->Summary();
}

Result<MeasuredJob> RunLocalJob(const ScheduledProgram& sp, const LocalJobOptions& local) {
  Result<RunOptions> options = JobRunOptions(local.model);
  if (!options.ok()) return options.status();
  options->timeout_s = local.timeout_s;
  options->fail_op = local.fail_op;
  options->fail_rank = local.fail_rank;
  ExecutionResult first;
  Result<MeasuredJob> job = RunJobInProcess(sp, *options, local.iterations, local.warmup, &first);
  if (!job.ok() || !local.check) return job;
  Result<std::string> check = CheckAgainstReference(local.model, local.plan, sp, first, *options);
  if (!check.ok()) return Status::Error("check failed: " + check.status().message());
  job->check = *check;
  return job;
}

nlohmann::json MeasuredJobJson(const ScheduledProgram& sp, const MeasuredJob& job, const CostModel& cost,
                               const Summary* predicted) {
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
  if (predicted) {
    j["predicted_iteration_us"] = predicted->makespan_us;
    j["predicted_cluster"] = cost.cluster().name;
  }
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

std::string MeasuredJobText(const ScheduledProgram& sp, const MeasuredJob& job, const CostModel& cost,
                            const Summary* predicted) {
  const Summary s = Summarize(sp, job.timeline, cost);
  std::string out = fmt::format(
      "measured {} on {} ranks: median iteration {:.3f} ms over {} iterations (after {} warm-up; min {:.3f}, max "
      "{:.3f} ms)\n",
      sp.schedule.scheduler, sp.program.mesh.NumRanks(), job.median_iteration_us / 1e3, job.iteration_us.size(),
      job.warmup, *std::min_element(job.iteration_us.begin(), job.iteration_us.end()) / 1e3,
      *std::max_element(job.iteration_us.begin(), job.iteration_us.end()) / 1e3);
  if (predicted)
    out += fmt::format("predicted {:.3f} ms on {} (the simulator, same schedule)\n", predicted->makespan_us / 1e3,
                       cost.cluster().name);
  out += fmt::format(
      "rank {} (median iteration): compute busy {:.3f} ms, comm busy {:.3f} ms, exposed comm {:.3f} ms, overlap "
      "{:.1f}%\n",
      s.report_rank, s.compute_busy_us / 1e3, s.comm_busy_us / 1e3, s.exposed_comm_us / 1e3, 100 * s.overlap_ratio);
  if (!job.check.empty()) out += "reference check passed: " + job.check + "\n";
  return out;
}

nlohmann::json JobResultJson(const JobSpec& spec, const JobResult& job) {
  const RunResult& run = job.run;
  nlohmann::json j = SummaryJson(run.summary);
  j["cluster"] = job.cost->cluster().name;
  j["options"] = OptionsJson(spec.options);
  if (run.concerto) j["concerto"] = ConcertoReportJson(*run.concerto);
  if (run.decompose) j["decompose"] = DecomposeReportJson(*run.decompose);
  return j;
}

nlohmann::json CompareResultJson(const JobSpec& spec, const CompareResult& compared) {
  nlohmann::json j = CompareJson(compared.runs, compared.input_bound, compared.cost->cluster().name);
  j["program"] = compared.label;
  j["options"] = OptionsJson(spec.options);
  if (!compared.equal_memory_missing.empty() && j.contains("concerto_vs_best_baseline"))
    j["concerto_vs_best_baseline"]["equal_memory_missing"] = compared.equal_memory_missing;
  return j;
}

}  // namespace concerto
