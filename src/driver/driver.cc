#include "concerto/driver/driver.h"

#include <algorithm>
#include <cassert>
#include <fmt/format.h>

#include "concerto/ir/graph_index.h"
#include "concerto/sim/memory.h"
#include "concerto/schedule/propagation_bound.h"
#include "concerto/schedule/scheduler.h"

namespace concerto {

std::vector<std::string> PassNames() { return {"read", "decompose", "schedule"}; }

std::vector<std::string> SchedulerNames() {
  std::vector<std::string> names = BaselineNames();
  names.push_back("concerto");
  return names;
}

int64_t MemoryBudgetBytes(const Options& options, const ClusterSpec& cluster) {
  const double v = options.memory_budget;
  return v < 0 ? cluster.DeviceBudgetBytes() : static_cast<int64_t>(v);
}

ConcertoOptions ToConcertoOptions(const Options& options, const ClusterSpec& cluster) {
  ConcertoOptions c = ToConcertoOptions(options);
  c.memory_budget_bytes = MemoryBudgetBytes(options, cluster);
  return c;
}

ConcertoOptions ToConcertoOptions(const Options& options) {
  ConcertoOptions c = options.concerto;
  c.sim.all_ranks = false;  // candidates are simulated one representative per role where exact
  c.memory_budget_bytes = std::max<int64_t>(0, static_cast<int64_t>(options.memory_budget));
  return c;
}

nlohmann::json ConcertoReportJson(const ConcertoReport& r) {
  nlohmann::json j = {{"solver", r.solver},
                      {"incumbent", r.incumbent},
                      {"incumbent_makespan_us", r.incumbent_makespan_us},
                      {"start", r.start},
                      {"start_makespan_us", r.start_makespan_us},
                      {"final_makespan_us", r.final_makespan_us},
                      {"lower_bound_us", r.lower_bound_us},
                      {"gap", r.gap},
                      {"rounds_run", r.rounds_run},
                      {"windows_solved", r.windows_solved},
                      {"windows_optimal", r.windows_optimal},
                      {"windows_feasible_at_limit", r.windows_feasible},
                      {"windows_unsolved", r.windows_unsolved},
                      {"windows_hit_time_limit", r.windows_hit_time_limit},
                      {"windows_reused", r.windows_reused},
                      {"windows_speculated", r.windows_speculated},
                      {"passes_over_memory_budget", r.passes_over_memory},
                      {"inter_node_stream_ops", r.inter_node_stream_ops},
                      {"comm_streams_merged_ops", r.comm_streams_merged},
                      {"incumbent_peak_memory_bytes", r.incumbent_peak_memory_bytes},
                      {"fused_collectives", r.fused_collectives},
                      {"fusion_gain_us", r.fusion_gain_us},
                      {"search_seconds", r.seconds},
                      {"reached_lower_bound", r.reached_lower_bound},
                      {"hit_time_budget", r.hit_time_budget},
                      {"stopped_on_stall", r.stopped_on_stall},
                      {"memory_budget_bytes", r.memory_budget_bytes},
                      {"peak_memory_bytes", r.peak_memory_bytes},
                      {"makespan_after_round_us", r.makespan_after_round_us}};
  nlohmann::json windows = nlohmann::json::array();
  for (const WindowReport& w : r.windows)
    windows.push_back({{"round", w.round},
                       {"pass", w.pass == 0 ? "odd" : "even"},
                       {"first_block", w.first_block},
                       {"tasks", w.tasks},
                       {"status", std::string(ToString(w.status))},
                       {"hit_time_limit", w.hit_time_limit},
                       {"memory", w.memory},
                       {"reused", w.reused},
                       {"objective_us", w.objective_us},
                       {"bound_us", w.bound_us},
                       {"gap", w.gap},
                       {"seconds", w.seconds}});
  j["windows"] = windows;
  return j;
}

DecomposeOptions ToDecomposeOptions(const Options& options) {
  DecomposeOptions d = options.decompose;
  d.interference = options.concerto.sim.interference;
  return d;
}

nlohmann::json DecomposeReportJson(const DecomposeReport& r) {
  nlohmann::json rewrites = nlohmann::json::array();
  for (const Decomposition& d : r.rewrites)
    rewrites.push_back({{"graph", d.graph},
                        {"collective", d.collective},
                        {"side", d.side},
                        {"chunks", d.chunks},
                        {"dim", d.dim},
                        {"estimated_before_us", d.estimated_before_us},
                        {"estimated_after_us", d.estimated_after_us},
                        {"exposed_us", d.exposed_us}});
  return {{"candidates", r.candidates},
          {"rewrites", rewrites},
          {"fifo_before_us", r.fifo_before_us},
          {"fifo_after_us", r.fifo_after_us},
          {"rejected", r.rejected},
          {"rejected_reason", r.rejected_reason}};
}

BaselineOptions ToBaselineOptions(const Options& options) { return options.concerto.baselines; }

namespace {

SimOptions ToSimOptions(const Options& options) {
  SimOptions s = options.concerto.sim;
  s.all_ranks = options.all_ranks;
  return s;
}

/// Raises the summary's bound (plain and interference terms, from
/// Summarize) to the propagation bound of `program`
/// (schedule/propagation_bound.h, searched up to the run's makespan). A
/// makespan below the bound is a broken invariant: every term is proven.
Status AddPropagationBound(const Program& program, const CostModel& cost, Summary* summary) {
  PropagationBoundOptions o;
  o.upper_bound_us = summary->makespan_us;
  Result<PropagationBound> b = ComputePropagationBound(program, cost, o);
  if (!b.ok()) return b.status();
  summary->bound.propagation_us = b->bound_us;
  summary->bound.lower_bound_us = std::max(summary->bound.lower_bound_us, b->bound_us);
  assert(summary->makespan_us >= summary->bound.lower_bound_us * (1 - 1e-9) && "a schedule beats the lower bound");
  return Status::Ok();
}

/// Verifies, simulates and summarizes a scheduled program.
Result<RunResult> Evaluate(ScheduledProgram sp, const CostModel& cost, const Options& options) {
  // One index per graph, shared by the verifier and the simulation (at 100k
  // ops one GraphIndex::Build costs about a second).
  std::vector<GraphIndex> indexes;
  indexes.reserve(sp.program.graphs.size());
  for (const Graph& g : sp.program.graphs) indexes.push_back(GraphIndex::Build(g));
  std::vector<std::string> violations = VerifySchedule(sp.program, sp.schedule, indexes);
  if (!violations.empty()) {
    std::string msg = "schedule '" + sp.schedule.scheduler + "' fails verification (" +
                      std::to_string(violations.size()) + " violations):";
    for (size_t i = 0; i < violations.size() && i < 10; ++i) msg += "\n  " + violations[i];
    return Status::Error(msg);
  }
  Result<Timeline> timeline = Simulate(sp, cost, ToSimOptions(options), indexes);
  if (!timeline.ok()) return timeline.status();
  RunResult run{std::move(sp), std::move(timeline).value(), {}, std::nullopt, std::nullopt};
  run.summary = Summarize(run.scheduled, run.timeline, cost,
                          EffectiveInterference(options.concerto.sim.interference, cost.cluster()));
  run.summary.memory_budget_bytes = MemoryBudgetBytes(options, cost.cluster());
  run.summary.fits_memory =
      run.summary.memory_budget_bytes <= 0 || run.summary.peak_memory_bytes <= run.summary.memory_budget_bytes;
  CONCERTO_RETURN_IF_ERROR(AddPropagationBound(run.scheduled.program, cost, &run.summary));
  return run;
}

/// The fifo schedule of `program`, simulated.
Result<std::pair<ScheduledProgram, Timeline>> SimulateFifo(const Program& program, const CostModel& cost,
                                                           const Options& options) {
  Result<ScheduledProgram> sp = RunBaseline("fifo", program, cost, ToBaselineOptions(options));
  if (!sp.ok()) return sp.status();
  Result<Timeline> t = Simulate(*sp, cost, ToSimOptions(options));
  if (!t.ok()) return t.status();
  return std::make_pair(std::move(sp).value(), std::move(t).value());
}

}  // namespace

Result<Program> DecomposeWherePays(const Program& program, const CostModel& cost, const Options& options,
                                   DecomposeReport* report) {
  *report = DecomposeReport{};
  const DecomposeOptions d = ToDecomposeOptions(options);
  if (d.max_chunks < 2) return program;
  Result<std::pair<ScheduledProgram, Timeline>> before = SimulateFifo(program, cost, options);
  if (!before.ok()) return before.status();
  const ExposureMap exposed = ExposedCommByOp(before->first, before->second);
  Program out = program;
  Result<DecomposeReport> r = DecomposeCollectives(out, cost, d, &exposed);
  if (!r.ok()) return r.status();
  *report = std::move(r).value();
  if (report->rewrites.empty()) return program;
  Result<std::pair<ScheduledProgram, Timeline>> after = SimulateFifo(out, cost, options);
  if (!after.ok()) return after.status();
  report->fifo_before_us = before->second.makespan_us;
  report->fifo_after_us = after->second.makespan_us;
  // The chunks' slices and joins live longer: a decomposition that takes the
  // program over the memory budget where it fitted is not taken (the search
  // starts from baselines of the program it gets).
  const int64_t budget = MemoryBudgetBytes(options, cost.cluster());
  const auto fits = [budget](const std::pair<ScheduledProgram, Timeline>& run) {
    return budget <= 0 || PeakMemory(run.first.program, run.second).peak_bytes <= budget;
  };
  if (fits(*before) && !fits(*after)) {
    report->rejected = true;
    report->rejected_reason = "over the memory budget";
    return program;
  }
  if (after->second.makespan_us < before->second.makespan_us) return out;
  report->rejected = true;
  report->rejected_reason = "fifo is not faster";
  return program;
}

Result<RunResult> RunScheduler(const Program& program, const std::string& scheduler, const CostModel& cost,
                               const Options& options, const PassHook& hook, const ProgressFn& progress) {
  if (hook) hook("read", program);
  if (scheduler == "concerto") {
    Result<DecomposeReport> decomposed = DecomposeReport{};
    Result<Program> input = DecomposeWherePays(program, cost, options, &*decomposed);
    if (!input.ok()) return input.status();
    if (hook) hook("decompose", *input);
    if (progress && !decomposed->rewrites.empty())
      progress(fmt::format("decompose: {} of {} candidate collectives chunked; fifo {:.3f} -> {:.3f} ms{}",
                           decomposed->rewrites.size(), decomposed->candidates, decomposed->fifo_before_us / 1e3,
                           decomposed->fifo_after_us / 1e3,
                           decomposed->rejected ? ": rejected (" + decomposed->rejected_reason + ")" : ""));
    ConcertoReport report;
    ConcertoOptions co = ToConcertoOptions(options, cost.cluster());
    Result<ScheduledProgram> sp = RunConcerto(*input, cost, co, &report, progress);
    if (!sp.ok() && report.memory_infeasible && options.memory_budget < 0) {
      // Nothing fits the device's default budget: say so, and show the
      // fastest schedule, marked over the budget (an explicit budget that
      // nothing meets stays an error).
      if (progress)
        progress("no schedule fits the device's memory (" + sp.status().message() +
                 "); the fastest schedule follows, marked OOM");
      co.memory_budget_bytes = 0;
      report = ConcertoReport{};
      sp = RunConcerto(*input, cost, co, &report, progress);
    }
    if (!sp.ok()) return sp.status();
    if (hook) hook("schedule", sp->program);
    Result<RunResult> run = Evaluate(std::move(sp).value(), cost, options);
    if (run.ok()) {
      run->concerto = report;
      run->decompose = std::move(decomposed).value();
    }
    return run;
  }
  Result<ScheduledProgram> sp = RunBaseline(scheduler, program, cost, ToBaselineOptions(options));
  if (!sp.ok()) return sp.status();
  if (hook) hook("schedule", sp->program);
  return Evaluate(std::move(sp).value(), cost, options);
}

Result<RunResult> RunGivenSchedule(const Program& program, const Schedule& schedule, const CostModel& cost,
                                   const Options& options) {
  return Evaluate(ScheduledProgram{program, schedule}, cost, options);
}


Result<std::vector<RunResult>> Compare(const Program& program, const std::vector<std::string>& schedulers,
                                       const CostModel& cost, const Options& options,
                                       const std::function<void(const std::string&)>& progress) {
  std::vector<RunResult> runs;
  for (const auto& name : schedulers) {
    if (progress) progress("scheduling and simulating with '" + name + "'");
    Result<RunResult> run = RunScheduler(program, name, cost, options, nullptr, progress);
    if (!run.ok()) return Status::Error("scheduler '" + name + "': " + run.status().message());
    runs.push_back(std::move(run).value());
  }
  return runs;
}

std::string CompareTable(const std::vector<RunResult>& runs, const LowerBound& lb, const std::string& title) {
  std::string out = title + "\n";
  out += fmt::format("{:<20} {:>14} {:>12} {:>14} {:>9} {:>8} {:>10} {:>10} {:>12}\n", "scheduler", "iteration_ms",
                     "vs_best", "exposed_comm_ms", "overlap", "T/LB", "LB_ms", "fused_ops", "peak_mem_GiB");
  // vs_best: against the fastest run that fits the memory budget (all runs
  // when none does); a run over the budget is marked OOM.
  double best = 0;
  bool any_fits = false;
  for (const auto& r : runs) any_fits = any_fits || r.summary.fits_memory;
  for (const auto& r : runs)
    if ((r.summary.fits_memory || !any_fits) && (best == 0 || r.summary.makespan_us < best))
      best = r.summary.makespan_us;
  for (const auto& r : runs) {
    const Summary& s = r.summary;
    out += fmt::format("{:<20} {:>14.3f} {:>11.3f}x {:>14.3f} {:>8.1f}% {:>8.3f} {:>10.3f} {:>10} {:>12.2f}{}\n",
                       s.scheduler, s.makespan_us / 1e3, s.makespan_us / best, s.exposed_comm_us / 1e3,
                       100 * s.overlap_ratio, s.bound.lower_bound_us > 0 ? s.makespan_us / s.bound.lower_bound_us : 0.0,
                       s.bound.lower_bound_us / 1e3, r.scheduled.schedule.fusion_groups.size(),
                       s.peak_memory_bytes / double(1 << 30), s.fits_memory ? "" : " OOM");
  }
  const int64_t budget = runs.empty() ? 0 : runs.front().summary.memory_budget_bytes;
  if (budget > 0)
    out += fmt::format("memory budget {:.2f} GiB per rank (the device's memory minus its reserve unless "
                       "--memory-budget says otherwise){}\n",
                       budget / double(1 << 30), any_fits ? "; OOM: over it, not counted as best" : "; nothing fits it");
  out += fmt::format(
      "LB_ms: lower bound of each run's own program, max(critical path, stream load, fill + work + drain,\n"
      "propagation, interference) (bucketing, chunking and stream splits change the work); plain bound\n"
      "of the input program as lowered: {:.3f} ms = max(critical path {:.3f} ms, busiest stream '{}' {:.3f} ms{})\n",
      lb.lower_bound_us / 1e3, lb.critical_path_us / 1e3, lb.busiest_stream, lb.stream_load_us / 1e3,
      lb.fill_drain_us > std::max(lb.critical_path_us, lb.stream_load_us)
          ? fmt::format(", fill + work + drain of '{}' {:.3f} ms", lb.fill_drain_stream, lb.fill_drain_us / 1e3)
          : std::string());
  return out;
}

nlohmann::json CompareJson(const std::vector<RunResult>& runs, const LowerBound& lb, const std::string& cluster) {
  nlohmann::json j;
  j["cluster"] = cluster;
  j["results"] = nlohmann::json::array();
  double best = 0;
  std::string best_name;
  for (const auto& r : runs) {
    nlohmann::json s = SummaryJson(r.summary);
    s.erase("critical_path");
    s.erase("busy_us");
    if (r.concerto) s["concerto"] = ConcertoReportJson(*r.concerto);
    if (r.decompose) s["decompose"] = DecomposeReportJson(*r.decompose);
    j["results"].push_back(s);
  }
  bool any_fits = false;
  for (const auto& r : runs) any_fits = any_fits || r.summary.fits_memory;
  for (const auto& r : runs)
    if ((r.summary.fits_memory || !any_fits) && (best == 0 || r.summary.makespan_us < best))
      best = r.summary.makespan_us, best_name = r.summary.scheduler;
  j["best_scheduler"] = best_name;
  j["any_fits_memory"] = any_fits;
  j["best_makespan_us"] = best;
  j["lower_bound_us"] = lb.lower_bound_us;
  j["lower_bound_critical_path_us"] = lb.critical_path_us;
  j["lower_bound_stream_load_us"] = lb.stream_load_us;
  j["lower_bound_fill_drain_us"] = lb.fill_drain_us;
  return j;
}

}  // namespace concerto
