// The concerto command-line tool: flags and I/O only. Library calls return a
// Status; this file alone turns them into exit codes (0 ok, 1 bad input, 2
// bad arguments).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <cstdio>
#include <cstdlib>
#include <fmt/format.h>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include "concerto/cost/cluster.h"
#include "concerto/util/json_text.h"
#include "concerto/cost/cost_model.h"
#include "concerto/driver/driver.h"
#include "concerto/driver/fidelity.h"
#include "concerto/driver/job.h"
#include "concerto/driver/plan_search.h"
#include "concerto/driver/options.h"
#include "concerto/ir/json_io.h"
#include "concerto/lower/evoformer.h"
#include "concerto/lower/frontend.h"
#include "concerto/lower/gpt.h"
#include "concerto/lower/plan.h"
#include "concerto/lower/sharding_plan.h"
#include "concerto/lower/transformer.h"
#include "concerto/lower/vision.h"
#include "concerto/report/report.h"
#include "concerto/schedule/window_solver.h"
#include "concerto/runtime/executor.h"
#include "concerto/runtime/launcher.h"
#include "concerto/runtime/flight_recorder.h"
#include "concerto/profile/profile.h"
#include "concerto/util/input_file.h"
#include "../common/option_flags.h"

namespace {

/// --plan's help, the same for every subcommand: every key the plan parser takes
/// (docs/frontends.md, "Plans").
constexpr const char* kPlanHelp =
    "parallel plan for --model: comma-separated dp=N, tp=N, pp=N, sp, zero=0..3, ep=N (experts), dap=N "
    "(Evoformer), microbatches=N, vstages=N (interleaved 1F1B), order=tp-dp-pp (mesh axes on the cluster, "
    "innermost first), recompute=none|selective|full; e.g. dp=4,tp=8,sp or pp=4,tp=8,microbatches=8,vstages=2; "
    "or a plan file (YAML/JSON)";


using namespace concerto;

constexpr int kExitInput = 1;
constexpr int kExitUsage = 2;

/// Flags shared by the commands that price, schedule and simulate: the
/// job's cost model and scheduler options (the option table), and --json.
struct CommonFlags {
  JobSpec job;
  bool json = false;
};

/// A number in [lo, hi], finite: CLI11's Range and PositiveNumber let NaN through (every comparison
/// with it is false), and 1e308 seconds overflows the clocks it is added to.
CLI::Validator FiniteRange(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || *end != '\0' || !std::isfinite(v) || v < lo || v > hi)
          return fmt::format("'{}' is not a number in [{}, {}]", text, lo, hi);
        return "";
      },
      fmt::format("NUMBER in [{}, {}]", lo, hi));
}

void AddCommonFlags(CLI::App* cmd, CommonFlags& flags) {
  cmd->add_option("--cluster", flags.job.cluster,
                  "cluster preset (" + fmt::format("{}", fmt::join(ClusterPresetNames(), ", ")) +
                      ") or a .yaml/.json cluster file")
      ->capture_default_str();
  cmd->add_option("--nodes", flags.job.nodes,
                  "scale the cluster to this many nodes (its devices, links and node layout kept; 0: as given)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--profile", flags.job.profile, "profile database (JSON) of measured op durations");
  cmd->add_flag("--json", flags.json, "print one JSON object instead of tables");
  cmd->add_option("--solver", flags.job.options.concerto.solver, "concerto: window solver backend (gecode, cbc)")
      ->capture_default_str()
      ->check(CLI::IsMember(WindowSolverNames()));
  AddOptionFlags(cmd, &flags.job.options);
}

/// Prints a library error and returns the exit code for bad input.
int Fail(const Status& status) {
  std::fprintf(stderr, "concerto: error: %s\n", status.message().c_str());
  return kExitInput;
}

void Progress(const std::string& line) { std::fprintf(stderr, "concerto: %s\n", line.c_str()); }

// ---- fidelity ----
struct FidelityFlags {
  std::string table = "examples/validation/published.yaml";
  std::vector<std::string> only;
  bool json = false;
  bool markdown = false;
};

int CmdFidelity(const FidelityFlags& ff) {
  Result<std::vector<PublishedRow>> rows = LoadPublishedTable(ff.table);
  if (!rows.ok()) return Fail(rows.status());
  if (!ff.only.empty()) {
    std::vector<PublishedRow> kept;
    for (const std::string& id : ff.only) {
      auto it = std::find_if(rows->begin(), rows->end(), [&](const PublishedRow& r) { return r.id == id; });
      if (it == rows->end()) return Fail(Status::Error(ff.table + ": no row '" + id + "'"));
      kept.push_back(*it);
    }
    *rows = std::move(kept);
  }
  Result<FidelityReport> report = PredictPublishedTable(*rows, Progress);
  if (!report.ok()) return Fail(report.status());
  if (ff.json) {
    std::cout << DumpJson(FidelityReportJson(*report), 2) << "\n";
  } else if (ff.markdown) {
    std::cout << FidelityMarkdown(*report);
  } else {
    std::cout << fmt::format("{:<34} {:<14} {:>11} {:>11} {:>8}  {}\n", "row", "metric", "published", "predicted",
                             "error", "source");
    for (const FidelityRow& r : report->rows)
      std::cout << fmt::format("{:<34} {:<14} {:>11.4g} {:>11.4g} {:>+7.1f}%  {}{}\n", r.row.id, r.row.metric,
                               r.row.published, r.predicted, 100 * r.error, r.row.origin,
                               r.fits_memory ? "" : " (over memory: a miss)");
    std::cout << fmt::format("{} rows from {} sources: median |error| {:.1f}%, max {:.1f}% ({}); {} over memory\n",
                             report->rows.size(), report->sources, 100 * report->median_abs_error,
                             100 * report->max_abs_error, report->max_error_row, report->over_memory);
  }
  return 0;
}


// ---- plan ----
struct PlanFlags {
  std::string model;
  int64_t global_batch = 0;
  int seq = 0;
  int top = 10;
  bool explain = false;
  std::string objective = "overlap";
  PlanSearchOptions search;
};

int CmdPlan(PlanFlags& pf, const CommonFlags& flags) {
  Result<ModelConfig> model = LoadPlanSearchModel(pf.model);
  if (!model.ok()) return Fail(model.status());
  Result<std::unique_ptr<CostModel>> cost = MakeCostModel(flags.job.cluster, flags.job.profile, flags.job.nodes);
  if (!cost.ok()) return Fail(cost.status());
  PlanSearchOptions& o = pf.search;
  o.global_batch = pf.global_batch;
  o.seq = pf.seq;
  o.objective = pf.objective == "additive" ? PlanObjective::kAdditive : PlanObjective::kOverlap;
  o.options = flags.job.options;
  Result<PlanSearchResult> result = SearchPlans(*model, **cost, o, Progress);
  if (!result.ok()) return Fail(result.status());
  if (flags.json) {
    std::cout << DumpJson(PlanSearchJson(*result, pf.top, pf.explain), 2) << "\n";
  } else {
    std::cout << PlanSearchTable(*result, pf.top);
    if (pf.explain) std::cout << "every plan, and why it was kept or dropped:\n" << PlanSearchExplain(*result);
  }
  return 0;
}

// ---- validate ----
int CmdValidate(const std::string& path, bool json) {
  Result<Program> program = ReadProgramFile(path);
  if (!program.ok()) return Fail(program.status());
  size_t ops = 0, comm = 0, tensors = 0;
  for (const auto& g : program->graphs) {
    ops += g.ops.size();
    tensors += g.tensors.size();
    for (const auto& op : g.ops) comm += op.IsComm();
  }
  if (json) {
    nlohmann::json j = {{"file", path}, {"valid", true}, {"ranks", program->mesh.NumRanks()},
                        {"roles", program->roles.size()}, {"graphs", program->graphs.size()},
                        {"ops", ops}, {"comm_ops", comm}, {"tensors", tensors}};
    std::cout << DumpJson(j, 2) << "\n";
  } else {
    std::cout << fmt::format("{}: valid: {} ranks, {} roles, {} graphs, {} ops ({} communication), {} tensors\n",
                             path, program->mesh.NumRanks(), program->roles.size(), program->graphs.size(), ops,
                             comm, tensors);
  }
  return 0;
}

// ---- simulate ----
struct SimulateFlags {
  std::string file;
  std::string scheduler = "fifo";
  std::string schedule_file;
  std::string trace;
  std::string write_schedule;
  std::string write_program;
  std::string dump_after;
  bool all_ranks = false;
};

int CmdSimulate(const SimulateFlags& sf, const CommonFlags& flags) {
  JobSpec spec = flags.job;
  spec.program_file = sf.file;
  spec.schedule_file = sf.schedule_file;
  spec.scheduler = sf.scheduler;
  spec.options.all_ranks = sf.all_ranks;
  PassHook hook = [&](const std::string& pass, const Program& p) {
    if (pass != sf.dump_after) return;
    std::string path = "concerto." + pass + ".json";
    if (Status s = WriteTextFile(path, WriteProgram(p)); !s.ok()) Progress(s.message());
    Progress("IR after pass '" + pass + "' written to " + path);
  };
  Result<JobResult> job = RunJob(spec, hook, Progress);
  if (!job.ok()) return Fail(job.status());
  const RunResult* run = &job->run;
  const std::unique_ptr<CostModel>* cost = &job->cost;
  if (!sf.trace.empty()) {
    if (Status s = WriteTextFile(sf.trace, ChromeTrace(run->scheduled, run->timeline)); !s.ok()) return Fail(s);
    Progress("trace written to " + sf.trace + " (open in ui.perfetto.dev or chrome://tracing)");
  }
  if (!sf.write_schedule.empty())
    if (Status s = WriteTextFile(sf.write_schedule, WriteSchedule(run->scheduled.schedule)); !s.ok()) return Fail(s);
  if (!sf.write_program.empty())
    if (Status s = WriteTextFile(sf.write_program, WriteProgram(run->scheduled.program)); !s.ok()) return Fail(s);
  const Summary& s = run->summary;
  if (flags.json) {
    std::cout << DumpJson(JobResultJson(spec, *job), 2) << "\n";
    return 0;
  }
  std::cout << fmt::format(
      "scheduler {} on {}: iteration {:.3f} ms, lower bound {:.3f} ms ({}; T/LB {:.3f})\n"
      "rank {}: compute busy {:.3f} ms, comm busy {:.3f} ms, exposed comm {:.3f} ms, overlap {:.1f}%\n"
      "{} ranks simulated{}; ops priced: {} explicit, {} profile, {} analytic\n",
      s.scheduler, (*cost)->cluster().name, s.makespan_us / 1e3, s.bound.lower_bound_us / 1e3, s.bound.BindingTerm(),
      s.bound.lower_bound_us > 0 ? s.makespan_us / s.bound.lower_bound_us : 0.0, s.report_rank,
      s.compute_busy_us / 1e3, s.comm_busy_us / 1e3, s.exposed_comm_us / 1e3, 100 * s.overlap_ratio,
      s.ranks_simulated, s.representative ? " (one per role, exact)" : "", s.costs.explicit_ops,
      s.costs.profiled_ops, s.costs.analytic_ops);
  std::cout << fmt::format("peak memory {:.2f} GiB per rank (rank {}, at {:.3f} ms{}){}\n",
                           s.peak_memory_bytes / double(1 << 30), s.peak_memory_rank, s.peak_memory_time_us / 1e3,
                           s.peak_memory_op.empty() ? std::string() : ", when " + s.peak_memory_op + " starts",
                           s.memory_budget_bytes <= 0 ? std::string("; no memory budget")
                           : s.fits_memory
                               ? fmt::format(", within the {:.2f} GiB budget", s.memory_budget_bytes / double(1 << 30))
                               : fmt::format(" -- OOM: over the {:.2f} GiB budget; this schedule does not fit the device",
                                             s.memory_budget_bytes / double(1 << 30)));
  if (!s.peak_live.empty()) {
    std::cout << "largest tensors live at the peak:\n";
    for (const LiveTensor& t : s.peak_live)
      std::cout << fmt::format("  {:<40} {:>10.3f} GiB{}\n", t.name, t.bytes / double(1 << 30),
                               t.producer.empty() ? " (an input)" : " (from " + t.producer + ")");
  }
  if (!s.top_exposed.empty()) {
    std::cout << "most exposed collectives:\n";
    for (size_t i = 0; i < s.top_exposed.size() && i < 5; ++i)
      std::cout << fmt::format("  {:<40} {:>10.3f} ms of {:>10.3f} ms exposed\n", s.top_exposed[i].name,
                               s.top_exposed[i].exposed_us / 1e3, s.top_exposed[i].duration_us / 1e3);
  }
  std::cout << fmt::format("critical path: {} ops", s.critical_path_ops);
  if (!s.critical_path.empty())
    std::cout << fmt::format(" ({} ... {})", s.critical_path.front(), s.critical_path.back());
  std::cout << "\n";
  return 0;
}

// ---- schedule ----
struct ScheduleFlags {
  std::string file;
  std::string scheduler = "concerto";
  std::string output;
  std::string write_program;
  int mpi = 0;           // --mpi N: schedule on N MPI processes (rank 0 schedules, the others solve windows)
  bool dry_run = false;  // with --mpi: print the mpirun command
};

/// concerto_mpi_run's arguments for scheduling `sf` as `flags` say: the
/// program, cluster, profile, solver and every option that differs from its
/// default (as the word --help shows for it, when it has one).
std::vector<std::string> ScheduleWorkerArgs(const ScheduleFlags& sf, const CommonFlags& flags,
                                            const std::string& program_path) {
  const JobSpec& job = flags.job;
  std::vector<std::string> args = {"--program", sf.file, "--scheduler", sf.scheduler, "--cluster", job.cluster,
                                   "--solver", job.options.concerto.solver, "--schedule-only",
                                   "--write-schedule", sf.output, "--write-program", program_path};
  if (job.nodes > 0) args.insert(args.end(), {"--nodes", std::to_string(job.nodes)});
  if (!job.profile.empty()) args.insert(args.end(), {"--profile", job.profile});
  const Options defaults;
  for (const OptionSpec& spec : OptionTable()) {
    const double v = job.options.Get(spec.name);
    if (v == defaults.Get(spec.name)) continue;
    std::string text = fmt::format("{}", v);
    for (const auto& [word, value] : spec.words)
      if (value == v) text = word;
    args.insert(args.end(), {"--" + spec.name, text});
  }
  if (flags.json) args.push_back("--json");
  return args;
}

int CmdSchedule(const ScheduleFlags& sf, const CommonFlags& flags) {
  if (sf.mpi > 0) {
    // Rank 0 of concerto_mpi_run schedules; with concerto and
    // --batch-windows 1 the other ranks solve windows (docs/concerto.md).
    Result<std::string> dir = SelfExeDir();
    if (!dir.ok()) return Fail(dir.status());
    Result<std::string> worker = FindMpiWorker(*dir);
    if (!worker.ok() && !sf.dry_run) return Fail(worker.status());
    MpirunSpec mpirun;
    mpirun.ranks = sf.mpi;
    mpirun.as_root = RunningAsRoot();
    mpirun.worker = worker.ok() ? *worker : *dir + "/concerto_mpi_run";
    const std::string program_path = sf.write_program.empty() ? sf.output + ".program.json" : sf.write_program;
    mpirun.worker_args = ScheduleWorkerArgs(sf, flags, program_path);
    Result<std::vector<std::string>> argv = MpirunCommand(mpirun);
    if (!argv.ok()) return Fail(argv.status());
    if (sf.dry_run) {
      std::cout << ShellJoin(*argv) << "\n";
      return 0;
    }
    if (sf.scheduler != "concerto" || !flags.job.options.concerto.batch_windows)
      Progress("--mpi: only concerto with --batch-windows 1 spreads its work over the processes; rank 0 does it all");
    SubprocessRunner runner;
    Result<int> code = runner.Run(*argv);
    if (!code.ok()) return Fail(code.status());
    if (*code != 0) std::fprintf(stderr, "concerto: schedule failed: mpirun exited with code %d\n", *code);
    return *code;
  }
  JobSpec spec = flags.job;
  spec.program_file = sf.file;
  spec.scheduler = sf.scheduler;
  Result<JobResult> job = RunJob(spec, nullptr, Progress);
  if (!job.ok()) return Fail(job.status());
  const RunResult* run = &job->run;
  const std::unique_ptr<CostModel>* cost = &job->cost;
  if (Status s = WriteTextFile(sf.output, WriteSchedule(run->scheduled.schedule)); !s.ok()) return Fail(s);
  // The schedule may name ops a rewrite created (fused collectives): write the
  // program it belongs to as well.
  std::string program_path = sf.write_program.empty() ? sf.output + ".program.json" : sf.write_program;
  if (Status s = WriteTextFile(program_path, WriteProgram(run->scheduled.program)); !s.ok()) return Fail(s);
  const Summary& s = run->summary;
  if (flags.json) {
    nlohmann::json j = SummaryJson(s);
    j.erase("critical_path");
    j["cluster"] = (*cost)->cluster().name;
    j["schedule_file"] = sf.output;
    j["options"] = OptionsJson(spec.options);
    j["program_file"] = program_path;
    if (run->concerto) j["concerto"] = ConcertoReportJson(*run->concerto);
    std::cout << DumpJson(j, 2) << "\n";
    return 0;
  }
  std::cout << fmt::format("{} on {}: iteration {:.3f} ms, lower bound {:.3f} ms ({}; T/LB {:.3f})\n", s.scheduler,
                           (*cost)->cluster().name, s.makespan_us / 1e3, s.bound.lower_bound_us / 1e3,
                           s.bound.BindingTerm(),
                           s.bound.lower_bound_us > 0 ? s.makespan_us / s.bound.lower_bound_us : 0.0);
  if (run->concerto) {
    const ConcertoReport& r = *run->concerto;
    std::cout << fmt::format(
        "best baseline '{}' at {:.3f} ms; search from '{}' at {:.3f} ms; {} rounds, {} windows ({} optimal, {} "
        "feasible at the limit, {} unsolved) with {}; {} collectives fused; gap to the bound {:.1f}%; {:.1f} s{}\n",
        r.incumbent, r.incumbent_makespan_us / 1e3, r.start, r.start_makespan_us / 1e3, r.rounds_run, r.windows.size(), r.windows_optimal,
        r.windows_feasible, r.windows_unsolved, r.solver, r.fused_collectives, 100 * r.gap, r.seconds,
        r.hit_time_budget ? " (time budget reached)" : r.stopped_on_stall ? " (stopped: a stalled round, --min-round-gain)" : "");
    std::cout << fmt::format("makespan {:.3f} ms -> {:.3f} ms; peak memory {:.3f} GiB (incumbent {:.3f} GiB{})\n",
                             r.incumbent_makespan_us / 1e3, r.final_makespan_us / 1e3,
                             r.peak_memory_bytes / double(1 << 30), r.incumbent_peak_memory_bytes / double(1 << 30),
                             r.memory_budget_bytes > 0
                                 ? fmt::format(", budget {:.3f} GiB", r.memory_budget_bytes / double(1 << 30))
                                 : std::string());
    if (r.windows_hit_time_limit > 0)
      std::cout << fmt::format("{} windows stopped on the wall-clock limit: this result depends on machine load\n",
                               r.windows_hit_time_limit);
    // Per pass: how each window's solve ended.
    for (size_t k = 0; k < r.windows.size();) {
      const int round = r.windows[k].round, pass = r.windows[k].pass;
      std::map<std::string, int> count;
      size_t end = k;
      for (; end < r.windows.size() && r.windows[end].round == round && r.windows[end].pass == pass; ++end)
        count[std::string(ToString(r.windows[end].status))]++;
      std::string line = fmt::format("  round {} {} pass: {} windows", round + 1, pass == 0 ? "odd" : "even", end - k);
      for (const auto& [status, n] : count) line += fmt::format(", {} {}", n, status);
      std::cout << line << "\n";
      k = end;
    }
  }
  std::cout << fmt::format("schedule written to {}, program to {}\n", sf.output, program_path);
  return 0;
}

// ---- compare ----
/// One Chrome trace per run in `dir` (created if missing): DIR/<scheduler>.trace.json.
Status WriteTraces(const std::vector<RunResult>& runs, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::Error(dir + ": cannot create the trace directory: " + ec.message());
  for (const RunResult& r : runs) {
    const std::string path = (std::filesystem::path(dir) / (r.summary.scheduler + ".trace.json")).string();
    CONCERTO_RETURN_IF_ERROR(WriteTextFile(path, ChromeTrace(r.scheduled, r.timeline)));
  }
  Progress(fmt::format("{} traces written to {}/ (<scheduler>.trace.json; open in https://ui.perfetto.dev)",
                       runs.size(), dir));
  return Status::Ok();
}

int CmdCompare(const std::string& file, const std::string& model, const std::string& plan_text,
               const CommonFlags& flags, std::vector<std::string> schedulers, const std::string& sharding,
               const std::string& trace_dir) {
  JobSpec spec = flags.job;
  spec.program_file = file;
  spec.model = model;
  spec.plan = plan_text;
  spec.sharding = sharding;
  if (schedulers.empty()) schedulers = SchedulerNames();
  Result<CompareResult> compared = CompareJob(spec, schedulers, Progress);
  if (!compared.ok()) return Fail(compared.status());
  if (!trace_dir.empty())
    if (Status s = WriteTraces(compared->runs, trace_dir); !s.ok()) return Fail(s);
  const std::string& cluster = compared->cost->cluster().name;
  if (flags.json) {
    std::cout << DumpJson(CompareResultJson(spec, *compared), 2) << "\n";
  } else {
    std::cout << CompareTable(compared->runs, compared->input_bound, compared->label + " on " + cluster);
    if (!compared->equal_memory_missing.empty()) std::cout << "note: " << compared->equal_memory_missing << "\n";
  }
  return 0;
}

// ---- lower ----
int CmdLower(const std::string& model, const std::string& plan_text, const std::string& out, bool json,
             const std::string& sharding) {
  Result<ParallelPlan> plan = sharding.empty() ? LoadPlan(plan_text) : Result<ParallelPlan>(ParallelPlan{});
  if (!plan.ok()) return Fail(plan.status());
  auto t0 = std::chrono::steady_clock::now();
  JobSpec spec;
  spec.model = model;
  spec.plan = plan_text;
  spec.sharding = sharding;
  Result<JobProgram> lowered = LoadJobProgram(spec, sharding.empty() ? ProgressFn() : ProgressFn(Progress));
  if (!lowered.ok()) return Fail(lowered.status());
  const Program* program = &lowered->program;
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (Status s = WriteTextFile(out, WriteProgram(*program)); !s.ok()) return Fail(s);
  size_t ops = 0, comm = 0;
  for (const auto& g : program->graphs) {
    ops += g.ops.size();
    for (const auto& op : g.ops) comm += op.IsComm();
  }
  if (json)
    std::cout << DumpJson(nlohmann::json({{"model", model}, {"plan", sharding.empty() ? PlanToString(*plan) : "sharding " + sharding},
                                 {"ranks", program->mesh.NumRanks()},
                                 {"ops", ops}, {"comm_ops", comm}, {"lower_ms", ms}, {"output", out}}),
                          2)
              << "\n";
  else
    std::cout << fmt::format("{} under {}: {} ranks, {} ops ({} communication) in {:.1f} ms, written to {}\n", model,
                             sharding.empty() ? PlanToString(*plan) : "sharding " + sharding,
                             program->mesh.NumRanks(), ops, comm, ms, out);
  return 0;
}

// ---- demo ----
int CmdDemo(const std::string& trace, bool json) {
  const std::string model = "gpt-1.3b", plan_text = "dp=4,tp=8";
  Result<GptConfig> config = GptPreset(model);
  if (!config.ok()) return Fail(config.status());
  Result<DpTpPlan> plan = ParseDpTpPlan(plan_text);
  if (!plan.ok()) return Fail(plan.status());
  Progress("lowering " + model + " under " + plan_text);
  Result<Program> program = LowerGpt(*config, *plan);
  if (!program.ok()) return Fail(program.status());
  nlohmann::json all = {{"model", model}, {"plan", plan_text}, {"clusters", nlohmann::json::array()}};
  for (const std::string cluster : {"a800-4x8", "commodity-4x8"}) {
    JobSpec spec;
    spec.program = *program;
    spec.cluster = cluster;
    // Default options: the search stops at its fail limits (deterministic:
    // the same tables on any machine), a few seconds per cluster.
    Result<CompareResult> compared = CompareJob(spec, SchedulerNames(), Progress);
    if (!compared.ok()) return Fail(compared.status());
    const std::vector<RunResult>& runs = compared->runs;
    const LowerBound& bound = compared->input_bound;
    const std::string& name = compared->cost->cluster().name;
    if (json) {
      all["clusters"].push_back(CompareResultJson(spec, *compared));
    } else {
      std::cout << CompareTable(runs, bound, fmt::format("{} ({}) on {}", model, plan_text, name));
      if (!compared->equal_memory_missing.empty()) std::cout << "note: " << compared->equal_memory_missing << "\n";
      std::cout << "\n";
    }
    if (cluster == "a800-4x8" && !trace.empty()) {
      // The fastest run that fits the memory budget (any run when none does).
      const RunResult* best = nullptr;
      const bool any_fits = std::any_of(runs.begin(), runs.end(), [](const RunResult& r) { return r.summary.fits_memory; });
      for (const auto& r : runs)
        if ((r.summary.fits_memory || !any_fits) && (!best || r.summary.makespan_us < best->summary.makespan_us))
          best = &r;
      if (Status s = WriteTextFile(trace, ChromeTrace(best->scheduled, best->timeline)); !s.ok()) return Fail(s);
      Progress("trace of '" + best->summary.scheduler + "' on " + name + " written to " + trace +
               " (open it in https://ui.perfetto.dev or chrome://tracing)");
    }
  }
  if (json) {
    std::cout << DumpJson(all, 2) << "\n";
    return 0;
  }
  std::cout << "Times are predictions of Concerto's cost model for the named cluster (docs/cost-model.md), not\n"
               "measurements. Each row is one scheduler's policy on the same program; concerto is this tool.\n"
               "Columns: step_ms one training step; vs_best against the fastest run that fits memory; exposed_comm_ms\n"
               "communication nothing hides; overlap the share hidden; T/LB time over the lower bound (1.000: optimal).\n";
  std::cout << (trace.empty() ? std::string("No file was written (--trace FILE writes the best a800-4x8 schedule's trace).\n")
                              : "Trace of the best a800-4x8 schedule: " + trace + "\n");
  std::cout << "Next: concerto compare --model llama-7b --plan dp=4,tp=8 --cluster h100-8x8  (other models: concerto "
               "models;\n      clusters: concerto clusters; plans: concerto lower --help), or concerto --help.\n";
  return 0;
}

// ---- run ----
struct RunFlags {
  std::string file;
  std::string model, plan = "dp=1";  // the same default as lower and compare
  std::string schedule_file;
  std::string scheduler;
  int ranks = 0;  // 0: the program's
  bool in_process = false;
  std::string trace;
  bool check = false;
  int iterations = 1;
  int warmup = 0;
  double timeout_s = 60;
  std::string fail_op, kill_op;
  int fail_rank = -1, kill_rank = -1;
  bool dry_run = false;
  std::string write_schedule, write_program;  // the scheduled program that runs
  std::string engine = "runtime";             // runtime (ours: MPI or threads) or torch (torchrun)
  std::string device;                         // --engine torch: cpu or cuda ("" = cuda when present)
};

/// A fresh private directory for the files handed to the MPI ranks.
Result<std::string> MakeTempDir() {
  char tmpl[] = "/tmp/concerto-run-XXXXXX";
  if (!mkdtemp(tmpl)) return Status::Error(std::string("cannot create a temporary directory: ") + std::strerror(errno));
  return std::string(tmpl);
}

/// `concerto run --engine torch`: the scheduled program and its schedule trained by the torch
/// engine (python -m concerto.train) in one process per rank under torchrun.
int RunTorchEngine(const RunFlags& rf, const CommonFlags& flags, const ScheduledProgram& sp) {
  for (const auto& [given, what] : {std::pair{rf.in_process, "--in-process"}, {rf.check, "--check"},
                                    {!rf.trace.empty(), "--trace"}, {!rf.fail_op.empty(), "--fail-op"},
                                    {!rf.kill_op.empty(), "--kill-op"}})
    if (given)
      return Fail(Status::Error(std::string(what) + " is not available with --engine torch (python -m concerto.train "
                                "--check compares a torch module's training with torch's)"));
  Result<std::string> python = FindTorchPython();
  if (!python.ok() && !rf.dry_run) return Fail(python.status());
  Result<std::string> dir = SelfExeDir();
  if (!dir.ok()) return Fail(dir.status());
  Result<std::string> tmp = rf.dry_run ? Result<std::string>(std::string("/tmp/concerto-run-DRYRUN")) : MakeTempDir();
  if (!tmp.ok()) return Fail(tmp.status());
  TorchrunSpec spec;
  spec.python = python.ok() ? *python : "python3";
  spec.ranks = sp.program.mesh.NumRanks();
  spec.program_file = *tmp + "/program.json";
  spec.schedule_file = *tmp + "/schedule.json";
  spec.model = rf.model;
  spec.steps = rf.warmup + rf.iterations;
  spec.device = rf.device;
  spec.json = flags.json;
  const std::vector<std::string> argv = TorchrunCommand(spec);
  const char* old = std::getenv("PYTHONPATH");
  const std::string pythonpath = *dir + "/python" + (old && *old ? std::string(":") + old : "");
  if (rf.dry_run) {
    std::cout << "PYTHONPATH=" << ShellJoin({pythonpath}) << " " << ShellJoin(argv) << "\n";
    return 0;
  }
  Status written = WriteTextFile(spec.program_file, WriteProgram(sp.program));
  if (written.ok()) written = WriteTextFile(spec.schedule_file, WriteSchedule(sp.schedule));
  if (!written.ok()) return Fail(written);
  setenv("PYTHONPATH", pythonpath.c_str(), 1);
  Progress(fmt::format("launching {} torch engine ranks under torchrun ({} steps)", spec.ranks, spec.steps));
  SubprocessRunner runner;
  Result<int> code = runner.Run(argv);
  std::filesystem::remove_all(*tmp);
  if (!code.ok()) return Fail(code.status());
  if (*code != 0) std::fprintf(stderr, "concerto: run failed: torchrun exited with code %d\n", *code);
  return *code;
}

/// `concerto run`: prepares (and verifies) the job here, then runs it in
/// process or launches concerto_mpi_run through mpirun; returns the exit code.
int CmdRun(const RunFlags& rf, const CommonFlags& flags) {
  // The same job as `simulate` would run: RunJob's schedule is what executes.
  JobSpec spec = flags.job;
  spec.program_file = rf.file;
  if (rf.file.empty()) spec.model = rf.model, spec.plan = rf.plan;
  spec.schedule_file = rf.schedule_file;
  spec.scheduler = rf.scheduler.empty() ? "fifo" : rf.scheduler;
  Result<JobResult> prepared = PrepareJob(spec, Progress);
  if (!prepared.ok()) return Fail(prepared.status());
  const ScheduledProgram* sp = &prepared->run.scheduled;
  const Summary* predicted = &prepared->run.summary;
  const std::unique_ptr<CostModel>* cost = &prepared->cost;
  if (!rf.write_schedule.empty())
    if (Status s = WriteTextFile(rf.write_schedule, WriteSchedule(sp->schedule)); !s.ok()) return Fail(s);
  if (!rf.write_program.empty())
    if (Status s = WriteTextFile(rf.write_program, WriteProgram(sp->program)); !s.ok()) return Fail(s);
  const int ranks = sp->program.mesh.NumRanks();
  if (rf.ranks != 0 && rf.ranks != ranks)
    return Fail(Status::Error(fmt::format("-n {}: the program needs {} ranks", rf.ranks, ranks)));
  if (!rf.dry_run)  // every rank runs on this host: processes (MPI, torch) or threads (--in-process)
    if (Status s = CheckHostRanks(sp->program, ranks); !s.ok()) return Fail(s);
  if (rf.engine == "torch") return RunTorchEngine(rf, flags, *sp);
  if (!rf.device.empty()) return Fail(Status::Error("--device needs --engine torch (the runtime computes on the CPU)"));
  if (rf.in_process) {
    if (!rf.kill_op.empty()) return Fail(Status::Error("--kill-op needs MPI (it ends a process); use --fail-op"));
    LocalJobOptions local;
    local.iterations = rf.iterations;
    local.warmup = rf.warmup;
    local.timeout_s = rf.timeout_s;
    local.check = rf.check;
    local.model = rf.model;
    local.plan = rf.plan;
    local.fail_op = rf.fail_op;
    local.fail_rank = rf.fail_rank;
    Progress(fmt::format("running {} ranks in process ({} warm-up + {} measured iterations)", ranks, rf.warmup,
                         rf.iterations));
    Result<MeasuredJob> job = RunLocalJob(*sp, local);
    if (!job.ok()) return Fail(job.status());
    if (!rf.trace.empty()) {
      if (Status s = WriteTextFile(rf.trace, ChromeTrace(*sp, job->timeline)); !s.ok()) return Fail(s);
      Progress("trace of the median iteration written to " + rf.trace);
    }
    if (flags.json) {
      nlohmann::json j = MeasuredJobJson(*sp, *job, **cost, predicted);
      j["backend"] = "in-process";
      std::cout << DumpJson(j, 2) << "\n";
    } else {
      std::cout << MeasuredJobText(*sp, *job, **cost, predicted);
    }
    return 0;
  }
  if (!rf.dry_run) {  // every rank of the job runs on this host (mpirun's local launch)
    std::vector<int> all_ranks(ranks);
    for (int r = 0; r < ranks; ++r) all_ranks[r] = r;
    if (Status s = CheckHostMemory(sp->program, all_ranks); !s.ok()) return Fail(s);
  }
  Result<std::string> dir = SelfExeDir();
  if (!dir.ok()) return Fail(dir.status());
  Result<std::string> worker = FindMpiWorker(*dir);
  if (!worker.ok() && !rf.dry_run) return Fail(worker.status());
  Result<std::string> tmp = rf.dry_run ? Result<std::string>(std::string("/tmp/concerto-run-DRYRUN")) : MakeTempDir();
  if (!tmp.ok()) return Fail(tmp.status());
  WorkerRequest request;
  request.program_file = *tmp + "/program.json";
  request.schedule_file = *tmp + "/schedule.json";
  request.check = rf.check;
  request.model = rf.model;
  request.plan = rf.plan;
  request.cluster = flags.job.cluster;
  request.profile = flags.job.profile;
  request.iterations = rf.iterations;
  request.warmup = rf.warmup;
  request.trace = rf.trace;
  request.json = flags.json;
  request.timeout_s = rf.timeout_s;
  request.fail_op = rf.fail_op;
  request.fail_rank = rf.fail_rank;
  request.kill_op = rf.kill_op;
  request.kill_rank = rf.kill_rank;
  request.status_dir = *tmp;
  MpirunSpec mpirun;
  mpirun.ranks = ranks;
  mpirun.as_root = RunningAsRoot();
  mpirun.worker = worker.ok() ? *worker : *dir + "/concerto_mpi_run";
  if (rf.dry_run) {
    mpirun.worker_args = WorkerArgs(request);
    Result<std::vector<std::string>> argv = MpirunCommand(mpirun);
    if (!argv.ok()) return Fail(argv.status());
    std::cout << ShellJoin(*argv) << "\n";
    return 0;
  }
  Status written = WriteTextFile(request.program_file, WriteProgram(sp->program));
  if (written.ok()) written = WriteTextFile(request.schedule_file, WriteSchedule(sp->schedule));
  if (!written.ok()) return Fail(written);
  Progress(fmt::format("launching {} MPI ranks ({} warm-up + {} measured iterations)", ranks, rf.warmup,
                       rf.iterations));
  SubprocessRunner runner;
  Result<int> code = LaunchWorker(mpirun, request, runner);
  std::string what_happened;
  if (code.ok() && *code != 0) {  // every rank's flight record: who died, in which op
    std::vector<Result<RankFlightRecord>> records;
    for (int r = 0; r < ranks; ++r) records.push_back(ReadFlightRecord(FlightRecordPath(*tmp, r)));
    what_happened = DescribeFailedJob(sp->program, records);
  }
  std::filesystem::remove_all(*tmp);
  if (!code.ok()) return Fail(code.status());
  if (*code != 0)
    std::fprintf(stderr, "concerto: run failed: mpirun exited with code %d: %s\n", *code, what_happened.c_str());
  return *code;
}

// ---- profile ----
struct ProfileFlags {
  std::vector<std::string> programs;  // --program: one, or several with --kernels-only
  std::string from_trace;  // --from-trace: no measurement, the run's durations
  bool trace_collectives = false;  // --from-trace: also the collectives' spans
  std::string cluster;     // --from-trace: the cluster the run was scheduled on
  std::string base;        // --from-trace: the profile database it updates
  std::string out_dir = "profile";
  int ranks = 0;  // 0: the program's ranks, else 2
  bool in_process = false;
  int64_t max_bytes = 16 << 20;
  int reps = 5;
  int kernel_passes = 3;  // --kernel-passes: before the collectives, between them and the interference, after
  bool no_corun = false;  // --no-corun: the cluster's corun_slowdown 0 (measured and reported all the same)
  bool kernels_only = false;       // --kernels-only: the program's kernels, nothing else
  std::vector<std::string> merge;  // --merge: per-entry median of these databases
  bool json = false;
};

/// Measured durations written over --profile's entries (when given) into
/// OUT_DIR/profile.json: what --from-trace and --kernels-only produce.
struct ProfileUpdate {
  ProfileDb db;
  std::string path;  // the file written
  int replaced = 0, added = 0;
  nlohmann::json changes = nlohmann::json::array();  // per signature: measured_us, before_us
};

Result<ProfileUpdate> UpdateProfile(const ProfileFlags& pf, const std::string& device,
                                    const std::vector<TraceSample>& measured) {
  ProfileUpdate u;
  if (!pf.base.empty()) {
    Result<ProfileDb> base = ProfileDb::Read(pf.base);
    if (!base.ok()) return base.status();
    u.db = std::move(base).value();
  }
  for (const TraceSample& t : measured) {
    const double before = u.db.Lookup(device, t.signature);
    (before >= 0 ? u.replaced : u.added) += 1;
    u.changes.push_back({{"signature", t.signature}, {"measured_us", t.median_us}, {"ops", t.count},
                         {"before_us", before >= 0 ? nlohmann::json(before) : nlohmann::json(nullptr)}});
    u.db.Add(device, t.signature, t.median_us);
  }
  std::error_code ec;
  std::filesystem::create_directories(pf.out_dir, ec);
  if (ec) return Status::Error(pf.out_dir + ": " + ec.message());
  u.path = pf.out_dir + "/profile.json";
  if (Status st = WriteTextFile(u.path, u.db.Write()); !st.ok()) return st;
  return u;
}

/// The signature context of `concerto profile`: one node of `ranks` cpu-local devices.
ClusterSpec CpuLocalShape(int ranks) {
  ClusterSpec shape;
  shape.name = "cpu-local";
  shape.device.name = "cpu-local";
  shape.nodes = 1;
  shape.devices_per_node = ranks;
  return shape;
}

/// `concerto profile`: times kernels here and collectives over MPI (or
/// FakeWorld), fits the cpu-local cluster, writes both files.
/// `concerto profile --from-trace`: the compute durations a real run
/// measured (its --trace) written into a profile database, over `--profile`'s
/// entries when given (docs/runtime.md, "Closing the loop").
/// The most ranks `profile` times collectives over (threads or MPI processes of this host).
constexpr int kMaxProfileRanks = 1024;

int CmdProfileFromTrace(const ProfileFlags& pf) {
  if (pf.programs.size() != 1 || pf.cluster.empty()) {
    std::fprintf(stderr, "concerto profile --from-trace: needs --program (the program the run executed, "
                         "run --write-program) and --cluster (the cluster it was scheduled on)\n");
    return kExitUsage;
  }
  Result<Program> program = ReadProgramFile(pf.programs[0]);
  if (!program.ok()) return Fail(program.status());
  Result<ClusterSpec> cluster = LoadCluster(pf.cluster);
  if (!cluster.ok()) return Fail(cluster.status());
  Result<std::string> text = ReadInputFile(pf.from_trace, "trace", kMaxLargeInputBytes);
  if (!text.ok()) return Fail(text.status());
  Result<std::vector<TraceSample>> samples = DurationsFromTrace(*text, pf.from_trace, *program, *cluster,
                                                                pf.trace_collectives);
  if (!samples.ok()) return Fail(samples.status());
  Result<ProfileUpdate> u = UpdateProfile(pf, cluster->device.name, *samples);
  if (!u.ok()) return Fail(u.status());
  int ops = 0;
  for (const TraceSample& t : *samples) ops += t.count;
  if (pf.json) {
    std::cout << DumpJson(nlohmann::json{{"from_trace", pf.from_trace}, {"profile", u->path},
                                         {"device", cluster->device.name}, {"signatures", samples->size()},
                                         {"ops", ops}, {"replaced", u->replaced}, {"added", u->added},
                                         {"entries", u->db.size()}, {"changes", u->changes}},
                          2)
              << "\n";
  } else {
    std::cout << fmt::format("{}: {} compute ops in {} signatures measured inside the run; {} entries replaced, {} "
                             "added; {} written ({} entries for '{}')\n",
                             pf.from_trace, ops, samples->size(), u->replaced, u->added, u->path, u->db.size(),
                             cluster->device.name);
  }
  return 0;
}

/// `concerto profile --kernels-only`: the program's compute kernels timed
/// again (nothing else: no collectives, no fits, no cluster file), written
/// over --profile's entries. The testbed times them once per round between
/// its runs (docs/runtime.md, "The testbed").
int CmdProfileKernelsOnly(const ProfileFlags& pf) {
  if (pf.programs.empty()) {
    std::fprintf(stderr, "concerto profile --kernels-only: needs --program (the programs whose kernels to time)\n");
    return kExitUsage;
  }
  std::vector<TraceSample> measured;
  std::set<std::string> seen;  // a signature in several programs is timed once
  for (const std::string& path : pf.programs) {
    Result<Program> program = ReadProgramFile(path);
    if (!program.ok()) return Fail(program.status());
    Progress("timing the compute kernels of '" + program->name + "' (" + path + ")");
    Result<std::vector<KernelSample>> kernels =
        ProfileKernels(*program, CpuLocalShape(std::max(2, program->mesh.NumRanks())), {}, &seen);
    if (!kernels.ok()) return Fail(kernels.status());
    for (const KernelSample& k : *kernels) measured.push_back({k.signature, k.time_us, k.reps});
  }
  const std::string device = CpuLocalShape(2).device.name;
  Result<ProfileUpdate> u = UpdateProfile(pf, device, measured);
  if (!u.ok()) return Fail(u.status());
  if (pf.json) {
    std::cout << DumpJson(nlohmann::json{{"programs", pf.programs}, {"profile", u->path}, {"device", device},
                                         {"kernels", measured.size()}, {"replaced", u->replaced},
                                         {"added", u->added}, {"entries", u->db.size()}, {"changes", u->changes}},
                          2)
              << "\n";
  } else {
    std::cout << fmt::format("{} kernels of {} program(s) timed; {} entries replaced, {} added; {} written ({} "
                             "entries)\n",
                             measured.size(), pf.programs.size(), u->replaced, u->added, u->path, u->db.size());
  }
  return 0;
}

/// `concerto profile --merge A B ...`: one database, each entry the median
/// of the given databases (MergeProfiles), written over --profile's
/// entries when given, and how far apart the databases were.
int CmdProfileMerge(const ProfileFlags& pf) {
  std::vector<ProfileDb> dbs;
  for (const std::string& path : pf.merge) {
    Result<ProfileDb> db = ProfileDb::Read(path);
    if (!db.ok()) return Fail(db.status());
    dbs.push_back(std::move(db).value());
  }
  const MergedProfile merged = MergeProfiles(dbs);
  ProfileDb db;
  if (!pf.base.empty()) {
    Result<ProfileDb> base = ProfileDb::Read(pf.base);
    if (!base.ok()) return Fail(base.status());
    db = std::move(base).value();
  }
  int replaced = 0;
  for (const auto& [key, duration_us] : merged.db.entries()) {
    replaced += db.Lookup(key.first, key.second) >= 0;
    db.Add(key.first, key.second, duration_us);
  }
  std::error_code ec;
  std::filesystem::create_directories(pf.out_dir, ec);
  if (ec) return Fail(Status::Error(pf.out_dir + ": " + ec.message()));
  const std::string out = pf.out_dir + "/profile.json";
  if (Status st = WriteTextFile(out, db.Write()); !st.ok()) return Fail(st);
  if (pf.json) {
    std::cout << DumpJson(nlohmann::json{{"merged", pf.merge}, {"profile", out}, {"merged_entries", merged.db.size()},
                                         {"entries_in_all", merged.entries_in_all},
                                         {"median_spread", merged.median_spread},
                                         {"max_spread", merged.max_spread},
                                         {"max_spread_signature", merged.max_spread_signature},
                                         {"replaced", replaced}, {"entries", db.size()}},
                          2)
              << "\n";
  } else {
    std::cout << fmt::format("{} databases merged (per entry the median): {} entries, {} in every one; max/min "
                             "over the databases: median {:.3f}, largest {:.3f} ({}); {} replaced in the base; {} "
                             "written ({} entries)\n",
                             pf.merge.size(), merged.db.size(), merged.entries_in_all, merged.median_spread,
                             merged.max_spread,
                             merged.max_spread_signature.empty() ? "-" : merged.max_spread_signature, replaced, out,
                             db.size());
  }
  return 0;
}

int CmdProfile(const ProfileFlags& pf) {
  if (!pf.from_trace.empty()) return CmdProfileFromTrace(pf);
  if (pf.kernels_only) return CmdProfileKernelsOnly(pf);
  if (!pf.merge.empty()) return CmdProfileMerge(pf);
  if (pf.programs.size() > 1) {
    std::fprintf(stderr, "concerto profile: several --program only with --kernels-only (got %zu)\n",
                 pf.programs.size());
    return kExitUsage;
  }
  // The built-in shapes always run (they make the fits well posed); a
  // program's own kernels come first and get exact database entries.
  std::vector<Program> programs;
  std::unique_ptr<Program> program;
  if (!pf.programs.empty()) {
    Result<Program> p = ReadProgramFile(pf.programs[0]);
    if (!p.ok()) return Fail(p.status());
    program = std::make_unique<Program>(*p);
    programs.push_back(*p);
  }
  Result<std::vector<Program>> defaults = DefaultProfilePrograms();
  if (!defaults.ok()) return Fail(defaults.status());
  for (Program& p : *defaults) programs.push_back(std::move(p));
  if (pf.ranks == 0 && program && program->mesh.NumRanks() > kMaxProfileRanks)
    return Fail(Status::Error(fmt::format(
        "{}: the program has {} ranks, more than profile runs at once ({}); pass --ranks N (2 to {}): its "
        "collectives over groups of up to N ranks are profiled",
        pf.programs[0], program->mesh.NumRanks(), kMaxProfileRanks, kMaxProfileRanks)));
  const int ranks = pf.ranks > 0 ? pf.ranks : program ? program->mesh.NumRanks() : 2;
  if (ranks < 2) return Fail(Status::Error("profiling collectives needs at least 2 ranks (--ranks)"));
  const std::string device = "cpu-local";
  const ClusterSpec shape = CpuLocalShape(ranks);  // the signature context
  std::error_code ec;
  std::filesystem::create_directories(pf.out_dir, ec);
  if (ec) return Fail(Status::Error(pf.out_dir + ": " + ec.message()));

  // The kernels are timed in passes spread over the profile (before the
  // collectives, between them and the interference, after: --kernel-passes)
  // and each kernel's time is the median over the passes, so that a passing
  // phase of a shared machine in one pass does not set the profile.
  std::vector<std::vector<KernelSample>> passes;
  auto time_kernels = [&]() -> Status {
    std::vector<KernelSample> pass;
    for (const Program& p : programs) {
      Progress(fmt::format("timing the compute kernels of '{}' (pass {} of {})", p.name, passes.size() + 1,
                           pf.kernel_passes));
      Result<std::vector<KernelSample>> k = ProfileKernels(p, shape);
      if (!k.ok()) return k.status();
      pass.insert(pass.end(), k->begin(), k->end());
    }
    passes.push_back(std::move(pass));
    return Status::Ok();
  };
  if (Status st = time_kernels(); !st.ok()) return Fail(st);
  std::vector<CollectiveSpec> specs = DefaultCollectiveSpecs(ranks, pf.max_bytes);
  if (program)
    for (const CollectiveSpec& s : ProgramCollectiveSpecs(*program))
      if (s.group_size <= ranks) specs.push_back(s);
  Result<std::vector<CollectiveSample>> samples = Status::Error("unreachable");
  std::vector<OneWaySample> one_way;  // rank 0 -> 1 alone: ports or one medium
  Result<InterferenceMeasurement> interference = Status::Error("unreachable");
  InterferenceOptions interference_options;
  interference_options.comm_bytes = std::min<int64_t>(interference_options.comm_bytes, pf.max_bytes / 4 * 4);
  std::string comm_backend;
  if (pf.in_process) {
    comm_backend = "in-process (FakeWorld threads: memory copies, no network)";
    Progress(fmt::format("timing {} collectives in process over {} threads", specs.size(), ranks));
    samples = ProfileCollectivesInProcess(ranks, specs, pf.reps, &one_way, pf.max_bytes);
    if (pf.kernel_passes >= 3)
      if (Status st = time_kernels(); !st.ok()) return Fail(st);
    Progress("measuring interference (compute while an all_reduce is in flight) over threads");
    interference = MeasureInterferenceInProcess(ranks, interference_options);
  } else {
    comm_backend = "mpi (concerto_mpi_run over mpirun, TCP)";
    Result<std::string> dir = SelfExeDir();
    if (!dir.ok()) return Fail(dir.status());
    Result<std::string> worker = FindMpiWorker(*dir);
    if (!worker.ok()) return Fail(worker.status());
    MpirunSpec mpirun;
    mpirun.ranks = ranks;
    mpirun.as_root = RunningAsRoot();
    mpirun.worker = *worker;
    const std::string out = pf.out_dir + "/collectives.json";
    const std::string interference_out = pf.out_dir + "/interference.json";
    auto run_worker = [&](const std::vector<std::string>& args, const std::string& what) -> Status {
      mpirun.worker_args = args;
      Result<std::vector<std::string>> argv = MpirunCommand(mpirun);
      if (!argv.ok()) return argv.status();
      SubprocessRunner runner;
      Result<int> code = runner.Run(*argv);
      if (!code.ok()) return code.status();
      if (*code != 0) return Status::Error(fmt::format("{}: mpirun exited with code {}", what, *code));
      return Status::Ok();
    };
    Progress(fmt::format("timing {} collectives over MPI on {} ranks", specs.size(), ranks));
    if (Status st = run_worker({"--profile-comm", out, "--profile-specs", FormatCollectiveSpecs(specs),
                                "--profile-reps", std::to_string(pf.reps), "--profile-max-bytes",
                                std::to_string(pf.max_bytes)},
                               "collective profile");
        !st.ok())
      return Fail(st);
    samples = ReadCollectiveSamples(out, &one_way);
    if (pf.kernel_passes >= 3)
      if (Status st = time_kernels(); !st.ok()) return Fail(st);
    Progress(fmt::format("measuring interference over MPI on {} ranks (compute while an all_reduce is in flight, "
                         "co-running, the hold, the burst, the jitter)", ranks));
    if (Status st = run_worker({"--profile-interference", interference_out, "--profile-max-bytes",
                                std::to_string(pf.max_bytes)},
                               "interference profile");
        !st.ok())
      return Fail(st);
    interference = ReadInterference(interference_out);
  }
  if (pf.kernel_passes >= 2)
    if (Status st = time_kernels(); !st.ok()) return Fail(st);
  const KernelPasses merged_passes = MedianKernelPasses(passes);
  const std::vector<KernelSample>& kernels = merged_passes.kernels;
  if (!samples.ok()) return Fail(samples.status());
  if (!interference.ok()) return Fail(interference.status());
  const double corun = interference->corun;  // the cluster's corun_slowdown unless --no-corun
  Result<ComputeFit> compute = FitCompute(kernels);
  if (!compute.ok()) return Fail(compute.status());
  Result<CollectiveFit> comm = FitCollectives(*samples, one_way);
  if (!comm.ok()) return Fail(comm.status());
  const ClusterSpec cluster =
      MakeCpuLocalCluster(*compute, *comm, ranks, device, interference->interference, pf.no_corun ? 0 : corun,
                          pf.no_corun ? 0 : interference->corun_memory, pf.no_corun ? 0 : interference->comm_corun,
                          pf.no_corun ? 0 : interference->comm_corun_latency_us, interference->link_burst_us,
                          pf.no_corun ? 0 : interference->comm_corun_hold_us, interference->compute_jitter);
  const ProfileDb db = MakeProfileDb(device, kernels, *samples, program.get(), cluster);
  const std::string cluster_path = pf.out_dir + "/cpu-local.json", db_path = pf.out_dir + "/profile.json";
  if (Status s = WriteTextFile(cluster_path, ClusterToJson(cluster)); !s.ok()) return Fail(s);
  if (Status s = WriteTextFile(db_path, db.Write()); !s.ok()) return Fail(s);
  if (pf.json) {
    nlohmann::json j = {{"kernels", kernels.size()},
                        {"kernel_passes", passes.size()},
                        {"kernel_pass_totals_us", merged_passes.pass_totals_us},
                        {"kernel_pass_spread", merged_passes.spread},
                        {"collective_samples", samples->size()},
                        {"collective_backend", comm_backend},
                        {"ranks", ranks},
                        {"matmul_tflops", compute->matmul_tflops},
                        {"matmul_fit_r2", compute->matmul.r2},
                        {"memory_gbps", compute->memory_gbps},
                        {"memory_fit_r2", compute->memory.r2},
                        {"launch_overhead_us", compute->launch_overhead_us},
                        {"vector_efficiency", compute->vector_efficiency},
                        {"link_latency_us", comm->latency_us},
                        {"link_bandwidth_gbps", comm->bandwidth_gbps},
                        {"link_fit_max_rel_error", comm->max_rel_error},
                        {"link_medium", comm->intra_link},
                        {"link_ports_gbps", comm->ports_gbps},
                        {"link_bus_gbps", comm->bus_gbps},
                        {"one_way_gbps", comm->one_way_gbps},
                        {"one_way_samples", comm->one_way_points},
                        {"one_way_error_ports", comm->ports_one_way_error},
                        {"one_way_error_bus", comm->bus_one_way_error},
                        {"interference", interference->interference},
                        {"interference_comm_bytes", interference->comm_bytes},
                        {"interference_kernels", nlohmann::json::array()},
                        {"corun_slowdown", corun},
                        {"corun_round_factors", interference->corun_round_factors},
                        {"corun_slowdown_memory", interference->corun_memory},
                        {"corun_memory_round_factors", interference->corun_memory_round_factors},
                        {"comm_corun_slowdown", interference->comm_corun},
                        {"comm_corun_round_factors", interference->comm_corun_round_factors},
                        {"comm_corun_latency_us", interference->comm_corun_latency_us},
                        {"small_comm_alone_us", interference->small_comm_alone_us},
                        {"small_comm_computing_us", interference->small_comm_computing_us},
                        {"comm_corun_hold_us", interference->comm_corun_hold_us},
                        {"hold_round_us", interference->hold_round_us},
                        {"link_burst_us", interference->link_burst_us},
                        {"mid_comm_bytes", interference->mid_comm_bytes},
                        {"mid_back_to_back_us", interference->mid_back_to_back_us},
                        {"mid_idle_us", interference->mid_idle_us},
                        {"compute_jitter", interference->compute_jitter},
                        {"jitter_round", interference->jitter_round},
                        {"jitter_segment_us", interference->jitter_segment_us},
                        {"corun_in_cluster", !pf.no_corun},
                        {"profile_entries", db.size()},
                        {"profile_file", db_path},
                        {"cluster_file", cluster_path}};
    for (const InterferenceKernel& k : interference->kernels)
      j["interference_kernels"].push_back({{"kernel", k.kernel},
                                           {"solo_us", k.solo_us},
                                           {"alone_us", k.alone_us},
                                           {"overlapped_us", k.overlapped_us}});
    std::cout << DumpJson(j, 2) << "\n";
    return 0;
  }
  std::cout << fmt::format(
      "{} kernels timed in {} passes (their totals max/min {:.3f}; each kernel the median); {} collective samples "
      "({})\n"
      "fitted: matmul {:.4f} TFLOP/s (R^2 {:.3f}), memory {:.2f} GB/s (R^2 {:.3f}), launch {:.2f} us, vector "
      "efficiency {:.4f}\n"
      "fitted link: alpha {:.2f} us per step, {:.4f} GB/s {} (worst relative error {:.0f}%)\n"
      "{}"
      "interference: {:.3f} (compute at 1/(1+f) while an all_reduce of {} bytes is in flight)\n"
      "co-run slowdown: {:.3f} compute-bound, {:.3f} streaming kernels (kernels while every rank computes against "
      "rank 0 computing alone), {:.3f} communication (an all_reduce while every rank computes against one alone), "
      "{:.1f} us more per message (a small all_reduce likewise), of which a transfer moves nothing in the first "
      "{:.1f} us (an all_reduce of {} bytes beside matmuls, run by the executor); {}\n"
      "link burst: {:.1f} us (that all_reduce right after another against after an idle pause; in the cluster)\n"
      "compute jitter: {:.3f} (the spread of a rank's time for the same ~{:.0f} us of kernels, every rank at once: "
      "a rendezvous waits for its slowest member; in the cluster)\n"
      "profile database ({} entries) written to {}; cluster written to {}\n",
      kernels.size(), passes.size(), merged_passes.spread, samples->size(), comm_backend, compute->matmul_tflops,
      compute->matmul.r2, compute->memory_gbps, compute->memory.r2, compute->launch_overhead_us,
      compute->vector_efficiency,
      comm->latency_us, comm->bandwidth_gbps,
      comm->intra_link == "bus" ? "through one medium every transfer of the node crosses (bus)" : "per rank (ports)",
      100 * comm->max_rel_error,
      comm->one_way_points == 0
          ? std::string()
          : fmt::format("one-way transfers: {:.4f} GB/s at the largest size; priced as ports off by {:.0f}%, as a "
                        "bus by {:.0f}% (median)\n",
                        comm->one_way_gbps, 100 * std::expm1(comm->ports_one_way_error),
                        100 * std::expm1(comm->bus_one_way_error)),
      interference->interference,
      interference->comm_bytes, corun, interference->corun_memory, interference->comm_corun,
      interference->comm_corun_latency_us, interference->comm_corun_hold_us, interference->mid_comm_bytes,
      pf.no_corun ? "not in the cluster: --no-corun"
                  : "the cluster's corun_slowdown, corun_slowdown_memory, comm_corun_slowdown, comm_corun_latency_us "
                    "and comm_corun_hold_us",
      interference->link_burst_us, interference->compute_jitter, MedianFactor(interference->jitter_segment_us),
      db.size(), db_path, cluster_path);
  for (const InterferenceKernel& k : interference->kernels)
    std::cout << fmt::format("  {}: {:.1f} us on rank 0 alone, {:.1f} us while every rank computes, {:.1f} us with "
                             "the all_reduce in flight too (+{:.1f}%)\n",
                             k.kernel, k.solo_us, k.alone_us, k.overlapped_us, 100 * (k.overlapped_us / k.alone_us - 1));
  return 0;
}

/// The command line, parsed and run (main wraps it in the catch-all).
int RealMain(int argc, char** argv) {
  CLI::App app{
      "concerto: hides communication behind computation in distributed training.\n"
      "Lowers a parallel plan to one graph of compute and communication ops, schedules it,\n"
      "simulates it on a cost model and compares it with the policies of DDP, Megatron,\n"
      "ZeRO and XLA. Exit codes: 0 ok, 1 bad input file, 2 bad arguments, 3 internal error."};
  app.require_subcommand(1);
  CommonFlags flags;

  std::string validate_file;
  bool validate_json = false;
  auto* validate = app.add_subcommand("validate", "read and verify an IR file");
  validate->add_option("FILE", validate_file, "program in the IR's JSON form")->required();
  validate->add_flag("--json", validate_json, "print one JSON object");

  SimulateFlags sf;
  auto* simulate = app.add_subcommand("simulate", "schedule and simulate one program, print its figures");
  simulate->add_option("FILE", sf.file, "program in the IR's JSON form")->required();
  simulate->add_option("--scheduler", sf.scheduler, "scheduler: " + fmt::format("{}", fmt::join(SchedulerNames(), ", ")))
      ->capture_default_str()
      ->check(CLI::IsMember(SchedulerNames()));
  simulate->add_option("--schedule", sf.schedule_file, "simulate this schedule file instead of running a scheduler");
  simulate->add_option("--trace", sf.trace, "write a Chrome trace (Perfetto, chrome://tracing) here");
  simulate->add_option("--write-schedule", sf.write_schedule, "write the schedule (JSON) here");
  simulate->add_option("--write-program", sf.write_program, "write the scheduled (possibly rewritten) IR here");
  simulate->add_option("--dump-after", sf.dump_after, "write the IR after this pass to concerto.PASS.json")
      ->check(CLI::IsMember(PassNames()));
  simulate->add_flag("--all-ranks", sf.all_ranks, "simulate every rank, even where one per role is exact");
  AddCommonFlags(simulate, flags);

  ScheduleFlags schedf;
  auto* schedule = app.add_subcommand("schedule", "schedule a program (concerto by default) and write the schedule");
  schedule->add_option("FILE", schedf.file, "program in the IR's JSON form")->required();
  schedule->add_option("--scheduler", schedf.scheduler, "scheduler: " + fmt::format("{}", fmt::join(SchedulerNames(), ", ")))
      ->capture_default_str()
      ->check(CLI::IsMember(SchedulerNames()));
  schedule->add_option("-o,--output", schedf.output, "where to write the schedule (JSON)")->required();
  schedule->add_option("--mpi", schedf.mpi,
                       "schedule on this many MPI processes (concerto_mpi_run under mpirun): with --batch-windows 1 "
                       "rank 0 runs concerto and the others solve its window batches; the schedule is the same as "
                       "without --mpi")
      ->check(CLI::Range(1, 4096));
  schedule->add_flag("--dry-run", schedf.dry_run, "with --mpi: print the mpirun command instead of running it");
  schedule->add_option("--write-program", schedf.write_program,
                       "where to write the program the schedule belongs to (default: OUTPUT.program.json)");
  AddCommonFlags(schedule, flags);

  std::string compare_file;
  std::vector<std::string> compare_schedulers;
  auto* compare = app.add_subcommand(
      "compare",
      "every scheduler side by side on one program; when concerto's schedule holds more memory than the fastest "
      "baseline that fits, a second concerto run held to that baseline's peak (row concerto-eqmem)");
  std::string compare_model, compare_plan = "dp=1";
  compare->add_option("FILE", compare_file, "program in the IR's JSON form (or use --model and --plan)");
  compare->add_option("--model", compare_model, "lower this model preset or spec file instead of reading FILE");
  std::string compare_sharding;
  auto* compare_plan_opt =
      compare->add_option("--plan", compare_plan, kPlanHelp)
          ->capture_default_str();
  compare->add_option("--sharding", compare_sharding, "per-op sharding file (JSON) for --model, instead of --plan")
      ->excludes(compare_plan_opt);
  std::string compare_trace_dir;
  compare->add_option("--trace", compare_trace_dir,
                      "write one Chrome trace per scheduler into this directory (DIR/<scheduler>.trace.json)");
  compare->add_option("--schedulers", compare_schedulers, "schedulers to run (default: all)")
      ->delimiter(',')
      ->check(CLI::IsMember(SchedulerNames()));
  AddCommonFlags(compare, flags);

  // One default per option across commands: --plan is dp=1 in lower, compare
  // and run; --model has none (lower needs one, the others take FILE instead).
  std::string lower_model, lower_plan = "dp=1", lower_out;
  bool lower_json = false;
  auto* lower = app.add_subcommand("lower", "lower a model preset under a parallel plan to an IR file");
  lower->add_option("--model", lower_model,
                    "model preset (" + fmt::format("{}", fmt::join(AllModelPresetNames(), ", ")) + ") or a .yaml/.json model spec")
      ->required();
  std::string lower_sharding;
  auto* lower_plan_opt =
      lower->add_option("--plan", lower_plan,
                        kPlanHelp)
          ->capture_default_str();
  lower->add_option("--sharding", lower_sharding, "per-op sharding file (JSON), instead of --plan")
      ->excludes(lower_plan_opt);
  lower->add_option("-o,--output", lower_out, "where to write the program")->required();
  lower->add_flag("--json", lower_json, "print one JSON object");

  PlanFlags planf;
  auto* plan = app.add_subcommand(
      "plan", "search the parallel plans of a model on a cluster, with the overlap scheduler in the loop");
  plan->add_option("--model", planf.model,
                   "model preset (gpt and llama families) or a .yaml/.json model spec")
      ->required();
  plan->add_option("--global-batch", planf.global_batch, "sequences per training step (dp x micro-batch x micro-batches)")
      ->required()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  plan->add_option("--seq", planf.seq, "sequence length (default: the model's)")->check(CLI::Range(1, 1 << 24));
  plan->add_option("--top", planf.top, "ranked plans shown")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  plan->add_option("--search-top", planf.search.search_top,
                   "the concerto search runs on this many of the best plans by their baseline (0: none)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  plan->add_option("--max-micro-batch", planf.search.max_micro_batch, "largest micro-batch tried [sequences]")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  plan->add_flag("--all-micro-batch-sizes", planf.search.all_micro_batch_sizes,
                 "try every divisor of the per-replica batch as the micro-batch size (default: powers of two)");
  plan->add_flag("--zero-with-pp", planf.search.zero_with_pp,
                 "try ZeRO stages 2 and 3 with pipeline parallelism too (default: 0 or 1 with pp, what DeepSpeed's "
                 "pipeline engine and Megatron's distributed optimizer run)");
  plan->add_flag("--all-orders", planf.search.all_orders,
                 "try the mesh order tp-pp-dp too where there are dp and pp (default: Megatron's tp-dp-pp)");
  plan->add_option("--max-vstages", planf.search.max_vstages, "most virtual pipeline stages tried")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  plan->add_option("--max-tp", planf.search.max_tp, "most tensor-parallel ranks tried (0: a node's devices)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  plan->add_option("--baselines", planf.search.baselines,
                   "simulate each surviving plan with these schedulers (default: the plan's own system: zero for "
                   "ZeRO stages, megatron with tp or pp, ddp otherwise)")
      ->delimiter(',')
      ->check(CLI::IsMember(SchedulerNames()));
  plan->add_option("--objective", planf.objective,
                   "rank by the best simulated step (overlap) or by the sequential schedule's step, compute plus "
                   "every collective as if serial (additive: what an overlap-blind planner ranks by)")
      ->capture_default_str()
      ->check(CLI::IsMember({"overlap", "additive"}));
  plan->add_flag("--explain", planf.explain, "list every plan with why it was kept or dropped");
  plan->footer(
      "--time-budget bounds the whole search (plans not reached are listed as such); --memory-budget is the "
      "budget every plan must fit. Plans are pruned only when their graph inputs alone exceed the budget or a "
      "lower bound on any schedule of them reaches the best step found (docs/cli.md, 'concerto plan').");
  AddCommonFlags(plan, flags);

  std::string demo_trace;  // no file unless asked
  bool demo_json = false;
  auto* demo = app.add_subcommand(
      "demo", "GPT-1.3B (dp=4, tp=8) on a800-4x8 and commodity-4x8, every scheduler including concerto");
  demo->add_option("--trace", demo_trace,
                   "write the Chrome trace of the fastest a800-4x8 schedule that fits memory here (default: no file)");
  demo->add_flag("--json", demo_json, "print one JSON object");

  auto* clusters = app.add_subcommand("clusters", "list the built-in cluster presets");
  auto* models = app.add_subcommand("models", "list the built-in model presets");
  auto* schedulers = app.add_subcommand("schedulers", "list the schedulers");

  RunFlags rf;
  auto* run = app.add_subcommand("run", "execute a program with its schedule for real (MPI processes or threads)");
  run->add_option("FILE", rf.file, "program in the IR's JSON form (or use --model and --plan)");
  run->add_option("--model", rf.model, "lower this model preset or spec file (also names the --check reference)");
  run->add_option("--plan", rf.plan, kPlanHelp)
      ->capture_default_str();
  auto* run_schedule = run->add_option("--schedule", rf.schedule_file, "run this schedule file (it is verified first)");
  run->add_option("--scheduler", rf.scheduler, "make the schedule with this scheduler (default fifo)")
      ->check(CLI::IsMember(SchedulerNames()))
      ->excludes(run_schedule);
  run->add_option("-n,--ranks", rf.ranks, "number of ranks (must match the program; default: the program's)");
  run->add_flag("--in-process", rf.in_process, "run the ranks as threads of this process (no MPI)");
  run->add_option("--trace", rf.trace, "write the Chrome trace of the median iteration here");
  run->add_flag("--check", rf.check, "compare losses, gradients and parameters with the unsharded model (needs --model)");
  run->add_option("--iterations", rf.iterations, "measured iterations (median reported)")->capture_default_str()->check(CLI::Range(1, 1000000));
  run->add_option("--warmup", rf.warmup, "iterations run before measuring")->capture_default_str()->check(CLI::Range(0, 1000000));
  run->add_option("--timeout", rf.timeout_s, "seconds a collective waits for its peers before failing [s]")
      ->capture_default_str()
      ->check(FiniteRange(1e-3, 1e6));
  run->add_option("--write-schedule", rf.write_schedule, "write the schedule that runs (JSON) here");
  run->add_option("--write-program", rf.write_program, "write the program that runs (the scheduled IR) here");
  auto* fail_op = run->add_option("--fail-op", rf.fail_op, "fault injection: this op fails on --fail-rank");
  auto* fail_rank = run->add_option("--fail-rank", rf.fail_rank, "fault injection: the rank of --fail-op")->check(CLI::NonNegativeNumber);
  fail_op->needs(fail_rank);
  fail_rank->needs(fail_op);
  auto* kill_op = run->add_option("--kill-op", rf.kill_op, "fault injection: the process of --kill-rank dies (SIGKILL) at this op");
  auto* kill_rank = run->add_option("--kill-rank", rf.kill_rank, "fault injection: the rank of --kill-op")->check(CLI::NonNegativeNumber);
  kill_op->needs(kill_rank);
  kill_rank->needs(kill_op);
  run->add_flag("--dry-run", rf.dry_run, "print the mpirun (or torchrun) command instead of running it");
  run->add_option("--engine", rf.engine,
                  "runtime: our CPU runtime (MPI processes, or threads with --in-process); torch: the torch engine "
                  "(python -m concerto.train under torchrun: torch ops, gloo on CPU, CUDA streams and NCCL on GPUs; "
                  "runs warmup + iterations training steps; docs/python.md)")
      ->capture_default_str()
      ->check(CLI::IsMember({"runtime", "torch"}));
  run->add_option("--device", rf.device, "with --engine torch: cpu or cuda (default: cuda when present)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  // The scheduler's cost model and options, as simulate takes them: the same
  // command line makes the same schedule in both (driver/job.h).
  AddCommonFlags(run, flags);

  FidelityFlags ff;
  auto* fidelity = app.add_subcommand(
      "fidelity", "predict published measurements (nccl-tests, GEMMs, training runs) and report the error");
  fidelity->add_option("--table", ff.table, "table of published figures (YAML; docs/validation.md)")
      ->capture_default_str();
  fidelity->add_option("--only", ff.only, "predict only these rows (ids)");
  auto* fidelity_json = fidelity->add_flag("--json", ff.json, "print one JSON object");
  fidelity->add_flag("--markdown", ff.markdown, "print the table of docs/validation.md")->excludes(fidelity_json);

  ProfileFlags pf;
  auto* profile = app.add_subcommand("profile", "measure this machine's kernels and collectives; write a profile database and a cpu-local cluster");
  profile->add_option("--program", pf.programs,
                      "profile the ops of this program (default: a built-in set of shapes); several with "
                      "--kernels-only (each distinct kernel timed once)");
  profile->add_option("--out-dir", pf.out_dir, "where to write profile.json and cpu-local.json")->capture_default_str();
  profile->add_option("--ranks", pf.ranks, "ranks for the collectives (default: the program's, else 2)")->check(CLI::Range(2, kMaxProfileRanks));
  profile->add_flag("--in-process", pf.in_process, "time collectives over threads (FakeWorld) instead of MPI processes");
  profile->add_option("--max-bytes", pf.max_bytes, "largest collective size in the sweep, and of the one-way transfers that tell ports from a bus [bytes]")->capture_default_str()->check(CLI::Range(int64_t{4096}, int64_t{1} << 32));
  profile->add_option("--reps", pf.reps, "timed repetitions per collective")->capture_default_str()->check(CLI::Range(1, 1000));
  profile->add_option("--kernel-passes", pf.kernel_passes,
                      "time the kernels this many times over the profile (1: before the collectives; 2: and after "
                      "the interference; 3: and between them); each kernel's time is the median over the passes "
                      "[passes]")
      ->capture_default_str()
      ->check(CLI::Range(1, 3));
  auto* from_trace = profile->add_option(
      "--from-trace", pf.from_trace,
      "measure nothing: write the compute durations of a run's trace (concerto run --trace) into "
      "OUT_DIR/profile.json (needs --program, the program the run executed, and --cluster)");
  profile->add_flag("--collectives", pf.trace_collectives,
                    "--from-trace: also the collectives' spans (per instance the shortest over its ranks: the last "
                    "to arrive waited for nobody); best from a run of the sequential schedule")
      ->needs(from_trace);
  auto* kernels_only = profile->add_flag(
      "--kernels-only", pf.kernels_only,
      "time only the compute kernels of --program (no collectives, no fits, no cluster file) and write them into "
      "OUT_DIR/profile.json; the testbed does this between its runs");
  profile->add_option("--merge", pf.merge,
                      "measure nothing: write OUT_DIR/profile.json with each entry the median of these profile "
                      "databases (profiles of one machine taken at different times; over --profile's entries when "
                      "given) and report how far apart they were")
      ->excludes(from_trace)
      ->excludes(kernels_only);
  kernels_only->excludes(from_trace);
  profile->add_option("--cluster", pf.cluster, "--from-trace: the cluster preset or file the run was scheduled on");
  profile->add_option("--profile", pf.base,
                      "--from-trace, --kernels-only, --merge: the profile database to update (its other entries are kept)");
  profile->add_flag("--no-corun", pf.no_corun,
                    "write corun_slowdown, corun_slowdown_memory, comm_corun_slowdown, comm_corun_latency_us and comm_corun_hold_us 0 into the cluster "
                    "(default: as measured: the interference kernels' time while every rank computes over rank 0's "
                    "alone, per kernel class, and an all_reduce's time while every rank computes over its time "
                    "alone; the simulator applies them while other ranks of the node compute)");
  profile->add_flag("--json", pf.json, "print one JSON object");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    std::fprintf(stderr, "run 'concerto --help' or 'concerto COMMAND --help' for usage\n");
    return kExitUsage;
  }
  if (*validate) return CmdValidate(validate_file, validate_json);
  if (*simulate) return CmdSimulate(sf, flags);
  if (*compare) {
    if (compare_file.empty() == compare_model.empty()) {
      std::fprintf(stderr, "concerto compare: give either a program FILE or --model (with --plan)\n");
      return kExitUsage;
    }
    return CmdCompare(compare_file, compare_model, compare_plan, flags, compare_schedulers, compare_sharding,
                      compare_trace_dir);
  }
  if (*schedule) return CmdSchedule(schedf, flags);
  if (*lower) return CmdLower(lower_model, lower_plan, lower_out, lower_json, lower_sharding);
  if (*demo) return CmdDemo(demo_trace, demo_json);
  if (*plan) return CmdPlan(planf, flags);
  if (*clusters) {
    for (const auto& name : ClusterPresetNames()) {
      Result<ClusterSpec> c = LoadCluster(name);
      std::cout << fmt::format("{:<16} {}\n", name, c.ok() ? c->description : c.status().message());
    }
    return 0;
  }
  if (*models) {
    for (const auto& name : ModelPresetNames()) {
      Result<ModelConfig> m = ModelPreset(name);
      if (!m.ok()) continue;
      // Parameters in B from 1e9 up, else in M (mixtral-tiny: 2.17M, not 0.00B).
      const double params = static_cast<double>(ModelParameterCount(*m));
      const std::string count = params >= 1e9 ? fmt::format("{:.2f}B", params / 1e9)
                                              : fmt::format("{:.2f}M", params / 1e6);
      const std::string experts =
          IsMoe(*m) ? fmt::format(", {} experts top-{} (capacity factor {:g})", m->experts, m->top_k,
                                  m->capacity_factor)
                    : "";
      std::cout << fmt::format("{:<14} {:<6} {:>3} layers, hidden {:>5}, {:>3} heads ({} kv), seq {}, vocab {}, "
                               "batch {}, {} parameters{}\n",
                               name, ToString(m->family), m->layers, m->hidden, m->heads, m->kv_heads, m->seq,
                               m->vocab, m->batch, count, experts);
    }
    for (const auto& name : EvoformerPresetNames()) {
      Result<EvoformerConfig> e = EvoformerPreset(name);
      if (!e.ok()) continue;
      const double params =
          static_cast<double>(e->blocks) * EvoformerBlockParameterCount(*e) + EvoformerHeadParameterCount(*e);
      std::cout << fmt::format("{:<14} {:<6} {:>3} blocks, msa {} x {} residues, c_m {}, c_z {}, {:.2f}M parameters "
                               "(plans: dp, dap)\n",
                               name, "evoformer", e->blocks, e->n_seq, e->n_res, e->c_m, e->c_z, params / 1e6);
    }
    for (const auto& name : VisionPresetNames()) {
      Result<VisionConfig> v = VisionPreset(name);
      Result<int64_t> count = v.ok() ? VisionParameterCount(*v) : Result<int64_t>(v.status());
      if (!count.ok()) continue;
      const bool vit = v->kind == VisionConfig::Kind::kVit;
      const std::string shape =
          vit ? fmt::format("{:>3} layers, hidden {:>5}, {:>3} heads, patch {}", v->layers, v->hidden, v->heads, v->patch)
              : fmt::format("blocks {}, width x{}", fmt::join(v->blocks, "-"), v->width_factor);
      std::cout << fmt::format("{:<14} {:<6} {}, image {}, batch {}, {:.2f}M parameters (plans: dp, zero{})\n", name,
                               vit ? "vit" : "resnet", shape, v->image, v->batch, static_cast<double>(*count) / 1e6,
                               vit ? ", tp" : "");
    }
    return 0;
  }
  if (*run) {
    if (rf.file.empty() == rf.model.empty()) {
      std::fprintf(stderr, "concerto run: give either a program FILE or --model (with --plan, default dp=1)\n");
      return kExitUsage;
    }
    if (rf.check && rf.model.empty()) {
      std::fprintf(stderr, "concerto run: --check needs --model (with --plan, they define the unsharded reference)\n");
      return kExitUsage;
    }
    return CmdRun(rf, flags);
  }
  if (*profile) return CmdProfile(pf);
  if (*fidelity) return CmdFidelity(ff);
  if (*schedulers) {
    for (const auto& name : SchedulerNames()) std::cout << name << "\n";
    return 0;
  }
  return kExitUsage;
}

}  // namespace

/// Every exception that escapes is a bug, reported as one: "internal error"
/// with what it said and exit code 3, never an abort (docs/cli.md).
int main(int argc, char** argv) {
  try {
    return RealMain(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "concerto: internal error: %s (please report it with the command line)\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "concerto: internal error: an unknown exception (please report it with the command line)\n");
  }
  return 3;
}
