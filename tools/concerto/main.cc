// The concerto command-line tool: flags and I/O only. Library calls return a
// Status; this file alone turns them into exit codes (0 ok, 1 bad input, 2
// bad arguments).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fmt/format.h>
#include <fstream>
#include <iostream>

#include "concerto/cost/cluster.h"
#include "concerto/cost/cost_model.h"
#include "concerto/driver/driver.h"
#include "concerto/driver/options.h"
#include "concerto/ir/json_io.h"
#include "concerto/lower/frontend.h"
#include "concerto/lower/gpt.h"
#include "concerto/lower/plan.h"
#include "concerto/lower/transformer.h"
#include "concerto/report/report.h"
#include "concerto/schedule/window_solver.h"

namespace {

using namespace concerto;

constexpr int kExitInput = 1;
constexpr int kExitUsage = 2;

/// Flags shared by the commands that price and simulate.
struct CommonFlags {
  std::string cluster = "a800-4x8";
  std::string solver = "gecode";
  std::string profile;
  bool json = false;
  std::map<std::string, double> numeric;  // from OptionTable, only those given
};

void AddNumericOptions(CLI::App* cmd, CommonFlags& flags) {
  for (const auto& spec : OptionTable()) {
    cmd->add_option_function<double>(
           "--" + spec.name, [&flags, name = spec.name](double v) { flags.numeric[name] = v; },
           fmt::format("{} [{}] (default {}, range {}..{})", spec.help, spec.unit, spec.default_value,
                       spec.min_value, spec.max_value))
        ->type_name("NUM");
  }
}

void AddCommonFlags(CLI::App* cmd, CommonFlags& flags) {
  cmd->add_option("--cluster", flags.cluster,
                  "cluster preset (" + fmt::format("{}", fmt::join(ClusterPresetNames(), ", ")) +
                      ") or a .yaml/.json cluster file")
      ->capture_default_str();
  cmd->add_option("--profile", flags.profile, "profile database (JSON) of measured op durations");
  cmd->add_flag("--json", flags.json, "print one JSON object instead of tables");
  cmd->add_option("--solver", flags.solver, "concerto: window solver backend (gecode, cbc)")
      ->capture_default_str()
      ->check(CLI::IsMember(WindowSolverNames()));
  AddNumericOptions(cmd, flags);
}

/// Prints a library error and returns the exit code for bad input.
int Fail(const Status& status) {
  std::fprintf(stderr, "concerto: error: %s\n", status.message().c_str());
  return kExitInput;
}

Result<Options> BuildOptions(const CommonFlags& flags) {
  Options options;
  for (const auto& [name, value] : flags.numeric) CONCERTO_RETURN_IF_ERROR(options.Set(name, value));
  options.solver = flags.solver;
  return options;
}

Result<std::unique_ptr<CostModel>> BuildCostModel(const CommonFlags& flags) {
  Result<ClusterSpec> cluster = LoadCluster(flags.cluster);
  if (!cluster.ok()) return cluster.status();
  if (flags.profile.empty()) return std::unique_ptr<CostModel>(new AnalyticCostModel(*cluster));
  Result<ProfileDb> db = ProfileDb::Read(flags.profile);
  if (!db.ok()) return db.status();
  return std::unique_ptr<CostModel>(new ProfiledCostModel(std::move(db).value(), *cluster));
}

Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  if (!out) return Status::Error(path + ": cannot open for writing");
  out << text;
  if (!out) return Status::Error(path + ": write failed");
  return Status::Ok();
}

void Progress(const std::string& line) { std::fprintf(stderr, "concerto: %s\n", line.c_str()); }

Status CheckProgramFitsCluster(const Program& program, const CostModel& cost) {
  const ClusterSpec& c = cost.cluster();
  if (program.mesh.NumRanks() > c.NumDevices())
    return Status::Error(fmt::format("program needs {} ranks but cluster '{}' has {} devices",
                                     program.mesh.NumRanks(), c.name, c.NumDevices()));
  return Status::Ok();
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
    std::cout << j.dump(2) << "\n";
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
  Result<Program> program = ReadProgramFile(sf.file);
  if (!program.ok()) return Fail(program.status());
  Result<Options> options = BuildOptions(flags);
  if (!options.ok()) return Fail(options.status());
  options->all_ranks = sf.all_ranks;
  Result<std::unique_ptr<CostModel>> cost = BuildCostModel(flags);
  if (!cost.ok()) return Fail(cost.status());
  if (Status s = CheckProgramFitsCluster(*program, **cost); !s.ok()) return Fail(s);
  PassHook hook = [&](const std::string& pass, const Program& p) {
    if (pass != sf.dump_after) return;
    std::string path = "concerto." + pass + ".json";
    if (Status s = WriteFile(path, WriteProgram(p)); !s.ok()) Progress(s.message());
    Progress("IR after pass '" + pass + "' written to " + path);
  };
  Result<RunResult> run = Status::Error("unreachable");
  if (!sf.schedule_file.empty()) {
    Result<Schedule> schedule = ReadScheduleFile(sf.schedule_file);
    if (!schedule.ok()) return Fail(schedule.status());
    hook("read", *program);
    run = RunGivenSchedule(*program, *schedule, **cost, *options);
  } else {
    Progress("scheduling with '" + sf.scheduler + "' and simulating");
    run = RunScheduler(*program, sf.scheduler, **cost, *options, hook);
  }
  if (!run.ok()) return Fail(run.status());
  if (!sf.trace.empty()) {
    if (Status s = WriteFile(sf.trace, ChromeTrace(run->scheduled, run->timeline)); !s.ok()) return Fail(s);
    Progress("trace written to " + sf.trace + " (open in ui.perfetto.dev or chrome://tracing)");
  }
  if (!sf.write_schedule.empty())
    if (Status s = WriteFile(sf.write_schedule, WriteSchedule(run->scheduled.schedule)); !s.ok()) return Fail(s);
  if (!sf.write_program.empty())
    if (Status s = WriteFile(sf.write_program, WriteProgram(run->scheduled.program)); !s.ok()) return Fail(s);
  const Summary& s = run->summary;
  if (flags.json) {
    nlohmann::json j = SummaryJson(s);
    j["cluster"] = (*cost)->cluster().name;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << fmt::format(
      "scheduler {} on {}: iteration {:.3f} ms, lower bound {:.3f} ms (T/LB {:.3f})\n"
      "rank {}: compute busy {:.3f} ms, comm busy {:.3f} ms, exposed comm {:.3f} ms, overlap {:.1f}%\n"
      "{} ranks simulated{}; ops priced: {} explicit, {} profile, {} analytic\n",
      s.scheduler, (*cost)->cluster().name, s.makespan_us / 1e3, s.bound.lower_bound_us / 1e3,
      s.bound.lower_bound_us > 0 ? s.makespan_us / s.bound.lower_bound_us : 0.0, s.report_rank,
      s.compute_busy_us / 1e3, s.comm_busy_us / 1e3, s.exposed_comm_us / 1e3, 100 * s.overlap_ratio,
      s.ranks_simulated, s.representative ? " (one per role, exact)" : "", s.costs.explicit_ops,
      s.costs.profiled_ops, s.costs.analytic_ops);
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
};

int CmdSchedule(const ScheduleFlags& sf, const CommonFlags& flags) {
  Result<Program> program = ReadProgramFile(sf.file);
  if (!program.ok()) return Fail(program.status());
  Result<Options> options = BuildOptions(flags);
  if (!options.ok()) return Fail(options.status());
  Result<std::unique_ptr<CostModel>> cost = BuildCostModel(flags);
  if (!cost.ok()) return Fail(cost.status());
  if (Status s = CheckProgramFitsCluster(*program, **cost); !s.ok()) return Fail(s);
  Result<RunResult> run = RunScheduler(*program, sf.scheduler, **cost, *options, nullptr, Progress);
  if (!run.ok()) return Fail(run.status());
  if (Status s = WriteFile(sf.output, WriteSchedule(run->scheduled.schedule)); !s.ok()) return Fail(s);
  // The schedule may name ops a rewrite created (fused collectives): write the
  // program it belongs to as well.
  std::string program_path = sf.write_program.empty() ? sf.output + ".program.json" : sf.write_program;
  if (Status s = WriteFile(program_path, WriteProgram(run->scheduled.program)); !s.ok()) return Fail(s);
  const Summary& s = run->summary;
  if (flags.json) {
    nlohmann::json j = SummaryJson(s);
    j.erase("critical_path");
    j["cluster"] = (*cost)->cluster().name;
    j["schedule_file"] = sf.output;
    j["program_file"] = program_path;
    if (run->concerto) j["concerto"] = ConcertoReportJson(*run->concerto);
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << fmt::format("{} on {}: iteration {:.3f} ms, lower bound {:.3f} ms (T/LB {:.3f})\n", s.scheduler,
                           (*cost)->cluster().name, s.makespan_us / 1e3, s.bound.lower_bound_us / 1e3,
                           s.bound.lower_bound_us > 0 ? s.makespan_us / s.bound.lower_bound_us : 0.0);
  if (run->concerto) {
    const ConcertoReport& r = *run->concerto;
    std::cout << fmt::format(
        "started from '{}' at {:.3f} ms; {} rounds, {} windows ({} optimal, {} feasible at the limit, {} unsolved) "
        "with {}; {} collectives fused; gap to the bound {:.1f}%; {:.1f} s{}\n",
        r.incumbent, r.incumbent_makespan_us / 1e3, r.rounds_run, r.windows.size(), r.windows_optimal,
        r.windows_feasible, r.windows_unsolved, r.solver, r.fused_collectives, 100 * r.gap, r.seconds,
        r.hit_time_budget ? " (time budget reached)" : "");
  }
  std::cout << fmt::format("schedule written to {}, program to {}\n", sf.output, program_path);
  return 0;
}

// ---- compare ----
Status RunCompare(const Program& program, const CommonFlags& flags, const std::vector<std::string>& schedulers,
                  std::vector<RunResult>* runs, LowerBound* bound, std::string* cluster_name) {
  Result<Options> options = BuildOptions(flags);
  if (!options.ok()) return options.status();
  Result<std::unique_ptr<CostModel>> cost = BuildCostModel(flags);
  if (!cost.ok()) return cost.status();
  CONCERTO_RETURN_IF_ERROR(CheckProgramFitsCluster(program, **cost));
  *cluster_name = (*cost)->cluster().name;
  *bound = ComputeLowerBound(program, **cost);
  Result<std::vector<RunResult>> r = Compare(program, schedulers, **cost, *options, Progress);
  if (!r.ok()) return r.status();
  *runs = std::move(r).value();
  return Status::Ok();
}

/// The program named by FILE, or lowered from --model/--plan when FILE is empty.
Result<Program> ProgramFromArgs(const std::string& file, const std::string& model, const std::string& plan_text,
                                std::string* label) {
  if (!file.empty()) {
    *label = file;
    return ReadProgramFile(file);
  }
  if (model.empty()) return Status::Error("give a program FILE or --model (and --plan)");
  Result<ParallelPlan> plan = ParsePlan(plan_text);
  if (!plan.ok()) return plan.status();
  *label = model + " (" + PlanToString(*plan) + ")";
  Progress("lowering " + *label);
  return LowerModelPlan(model, plan_text);
}

int CmdCompare(const std::string& file, const std::string& model, const std::string& plan_text,
               const CommonFlags& flags, std::vector<std::string> schedulers) {
  std::string label;
  Result<Program> program = ProgramFromArgs(file, model, plan_text, &label);
  if (!program.ok()) return Fail(program.status());
  if (schedulers.empty()) schedulers = SchedulerNames();
  std::vector<RunResult> runs;
  LowerBound bound;
  std::string cluster;
  if (Status s = RunCompare(*program, flags, schedulers, &runs, &bound, &cluster); !s.ok()) return Fail(s);
  if (flags.json) {
    nlohmann::json j = CompareJson(runs, bound, cluster);
    j["program"] = label;
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << CompareTable(runs, bound, label + " on " + cluster);
  }
  return 0;
}

// ---- lower ----
int CmdLower(const std::string& model, const std::string& plan_text, const std::string& out, bool json) {
  Result<ParallelPlan> plan = ParsePlan(plan_text);
  if (!plan.ok()) return Fail(plan.status());
  auto t0 = std::chrono::steady_clock::now();
  Result<Program> program = LowerModelPlan(model, plan_text);
  if (!program.ok()) return Fail(program.status());
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (Status s = WriteFile(out, WriteProgram(*program)); !s.ok()) return Fail(s);
  size_t ops = 0, comm = 0;
  for (const auto& g : program->graphs) {
    ops += g.ops.size();
    for (const auto& op : g.ops) comm += op.IsComm();
  }
  if (json)
    std::cout << nlohmann::json({{"model", model}, {"plan", PlanToString(*plan)}, {"ranks", program->mesh.NumRanks()},
                                 {"ops", ops}, {"comm_ops", comm}, {"lower_ms", ms}, {"output", out}})
                     .dump(2)
              << "\n";
  else
    std::cout << fmt::format("{} under {}: {} ranks, {} ops ({} communication) in {:.1f} ms, written to {}\n", model,
                             PlanToString(*plan), program->mesh.NumRanks(), ops, comm, ms, out);
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
    CommonFlags flags;
    flags.cluster = cluster;
    // Keep the demo short: the search stops after 8 s per cluster.
    flags.numeric["time-budget"] = 8;
    flags.numeric["window-time-limit"] = 0.25;
    std::vector<RunResult> runs;
    LowerBound bound;
    std::string name;
    if (Status s = RunCompare(*program, flags, SchedulerNames(), &runs, &bound, &name); !s.ok()) return Fail(s);
    if (json) {
      all["clusters"].push_back(CompareJson(runs, bound, name));
    } else {
      std::cout << CompareTable(runs, bound, fmt::format("{} ({}) on {}", model, plan_text, name)) << "\n";
    }
    if (cluster == "a800-4x8" && !trace.empty()) {
      const RunResult* best = &runs[0];
      for (const auto& r : runs)
        if (r.summary.makespan_us < best->summary.makespan_us) best = &r;
      if (Status s = WriteFile(trace, ChromeTrace(best->scheduled, best->timeline)); !s.ok()) return Fail(s);
      Progress("trace of '" + best->summary.scheduler + "' on " + name + " written to " + trace);
    }
  }
  if (json) std::cout << all.dump(2) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "concerto: hides communication behind computation in distributed training.\n"
      "Lowers a parallel plan to one graph of compute and communication ops, schedules it,\n"
      "simulates it on a cost model and compares it with the policies of DDP, Megatron,\n"
      "ZeRO and XLA. Exit codes: 0 ok, 1 bad input file, 2 bad arguments."};
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
  schedule->add_option("--write-program", schedf.write_program,
                       "where to write the program the schedule belongs to (default: OUTPUT.program.json)");
  AddCommonFlags(schedule, flags);

  std::string compare_file;
  std::vector<std::string> compare_schedulers;
  auto* compare = app.add_subcommand("compare", "every scheduler side by side on one program");
  std::string compare_model, compare_plan = "dp=1";
  compare->add_option("FILE", compare_file, "program in the IR's JSON form (or use --model and --plan)");
  compare->add_option("--model", compare_model, "lower this model preset or spec file instead of reading FILE");
  compare->add_option("--plan", compare_plan, "parallel plan for --model, e.g. dp=4,tp=8")->capture_default_str();
  compare->add_option("--schedulers", compare_schedulers, "schedulers to run (default: all)")
      ->delimiter(',')
      ->check(CLI::IsMember(SchedulerNames()));
  AddCommonFlags(compare, flags);

  std::string lower_model = "gpt-1.3b", lower_plan = "dp=4,tp=8", lower_out;
  bool lower_json = false;
  auto* lower = app.add_subcommand("lower", "lower a model preset under a parallel plan to an IR file");
  lower->add_option("--model", lower_model,
                    "model preset (" + fmt::format("{}", fmt::join(AllModelPresetNames(), ", ")) + ") or a .yaml/.json model spec")
      ->capture_default_str();
  lower->add_option("--plan", lower_plan, "parallel plan: dp=N,tp=N,sp,zero=0..3 (e.g. dp=4,tp=8,sp or zero=3,dp=32)")
      ->capture_default_str();
  lower->add_option("-o,--output", lower_out, "where to write the program")->required();
  lower->add_flag("--json", lower_json, "print one JSON object");

  std::string demo_trace = "concerto_demo_trace.json";
  bool demo_json = false;
  auto* demo = app.add_subcommand(
      "demo", "GPT-1.3B (dp=4, tp=8) on a800-4x8 and commodity-4x8, every scheduler including concerto");
  demo->add_option("--trace", demo_trace, "write the best a800-4x8 schedule's Chrome trace here")->capture_default_str();
  demo->add_flag("--json", demo_json, "print one JSON object");

  auto* clusters = app.add_subcommand("clusters", "list the built-in cluster presets");
  auto* models = app.add_subcommand("models", "list the built-in model presets");
  auto* schedulers = app.add_subcommand("schedulers", "list the schedulers");

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
    return CmdCompare(compare_file, compare_model, compare_plan, flags, compare_schedulers);
  }
  if (*schedule) return CmdSchedule(schedf, flags);
  if (*lower) return CmdLower(lower_model, lower_plan, lower_out, lower_json);
  if (*demo) return CmdDemo(demo_trace, demo_json);
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
      std::cout << fmt::format("{:<14} {:<6} {:>3} layers, hidden {:>5}, {:>3} heads ({} kv), seq {}, vocab {}, "
                               "batch {}, {:.2f}B parameters\n",
                               name, ToString(m->family), m->layers, m->hidden, m->heads, m->kv_heads, m->seq,
                               m->vocab, m->batch, ModelParameterCount(*m) / 1e9);
    }
    return 0;
  }
  if (*schedulers) {
    for (const auto& name : SchedulerNames()) std::cout << name << "\n";
    return 0;
  }
  return kExitUsage;
}
