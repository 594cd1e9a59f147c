#include "concerto/driver/driver.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <fmt/format.h>

#include "concerto/driver/pass.h"
#include "concerto/ir/graph_index.h"
#include "concerto/sim/memory.h"
#include "concerto/schedule/propagation_bound.h"
#include "concerto/schedule/scheduler.h"

namespace concerto {

std::vector<std::string> PassNames() {
  std::vector<std::string> names;
  for (const PassInfo& p : RegisteredPasses()) names.push_back(p.name);
  return names;
}

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

DecomposeOptions ToDecomposeOptions(const Options& options) {
  DecomposeOptions d = options.decompose;
  d.interference = options.concerto.sim.interference;
  return d;
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

/// Verifies, simulates and summarizes a scheduled program, with the indexes
/// of `analyses` (built here when the passes left none).
Result<RunResult> Evaluate(ScheduledProgram sp, const CostModel& cost, const Options& options,
                           AnalysisCache* analyses) {
  // One index per graph, shared by the verifier and the simulation (at 100k
  // ops one GraphIndex::Build costs about a second).
  AnalysisCache own;
  const std::vector<GraphIndex>& indexes = (analyses ? analyses : &own)->Indexes(sp.program);
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
  // The pipeline, in a straight line: read, decompose (concerto), schedule.
  std::vector<std::unique_ptr<Pass>> passes;
  for (const std::string name : {"read", "decompose", "schedule"}) {
    if (name == "decompose" && scheduler != "concerto") continue;
    Result<std::unique_ptr<Pass>> pass = MakePass(name, scheduler);
    assert(pass.ok() && "the driver's passes are registered");
    passes.push_back(std::move(pass).value());
  }
  PassContext context{program, std::nullopt, &cost, &options, progress, {}, std::nullopt, std::nullopt, std::nullopt};
  CONCERTO_RETURN_IF_ERROR(RunPasses(passes, context, hook));
  assert(context.schedule && "the schedule pass sets the schedule");
  Result<RunResult> run =
      Evaluate(ScheduledProgram{std::move(context.program), std::move(*context.schedule)}, cost, options,
               &context.analyses);
  if (run.ok()) {
    run->concerto = std::move(context.concerto);
    run->decompose = std::move(context.decompose);
  }
  return run;
}

Result<StepFigures> SimulateBaselineStep(const Program& program, const std::string& baseline, const CostModel& cost,
                                         const Options& options) {
  Result<ScheduledProgram> sp = RunBaseline(baseline, program, cost, ToBaselineOptions(options));
  if (!sp.ok()) return sp.status();
  std::vector<GraphIndex> indexes;
  for (const Graph& g : sp->program.graphs) indexes.push_back(GraphIndex::Build(g));
  std::vector<std::string> violations = VerifySchedule(sp->program, sp->schedule, indexes);
  if (!violations.empty())
    return Status::Error("schedule '" + baseline + "' fails verification: " + violations.front());
  Result<Timeline> timeline = Simulate(*sp, cost, ToSimOptions(options), indexes);
  if (!timeline.ok()) return timeline.status();
  StepFigures f;
  f.makespan_us = timeline->makespan_us;
  f.peak_memory_bytes = PeakMemory(sp->program, *timeline, indexes).peak_bytes;
  const int64_t budget = MemoryBudgetBytes(options, cost.cluster());
  f.fits_memory = budget <= 0 || f.peak_memory_bytes <= budget;
  for (const Role& role : sp->program.roles)
    if (!role.ranks.empty()) f.num_ops += static_cast<int>(sp->program.GraphOf(role).ops.size());
  return f;
}

Result<RunResult> RunGivenSchedule(const Program& program, const Schedule& schedule, const CostModel& cost,
                                   const Options& options) {
  return Evaluate(ScheduledProgram{program, schedule}, cost, options, nullptr);
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

namespace {

bool IsBaselineRow(const std::string& scheduler) {
  return scheduler != "concerto" && scheduler != kEqualMemoryRow && scheduler != "sequential";
}

/// The fastest baseline that fits its memory budget, or null.
const Summary* FastestFittingBaseline(const std::vector<RunResult>& runs) {
  const Summary* best = nullptr;
  for (const RunResult& r : runs)
    if (IsBaselineRow(r.summary.scheduler) && r.summary.fits_memory &&
        (!best || r.summary.makespan_us < best->makespan_us))
      best = &r.summary;
  return best;
}

const Summary* Row(const std::vector<RunResult>& runs, const std::string& scheduler) {
  for (const RunResult& r : runs)
    if (r.summary.scheduler == scheduler) return &r.summary;
  return nullptr;
}

}  // namespace

void AddEqualMemoryRun(const Program& program, const CostModel& cost, const Options& options,
                       std::vector<RunResult>* runs, const ProgressFn& progress, std::string* why_not) {
  const Summary* concerto = Row(*runs, "concerto");
  const Summary* baseline = FastestFittingBaseline(*runs);
  if (!concerto || !baseline || concerto->peak_memory_bytes <= baseline->peak_memory_bytes) return;
  const int64_t budget = baseline->peak_memory_bytes;
  const int64_t own = MemoryBudgetBytes(options, cost.cluster());
  if (own > 0 && own <= budget) return;
  const std::string base_name = baseline->scheduler;
  if (progress)
    progress(fmt::format("scheduling with 'concerto' again under {}'s peak memory ({:.2f} GiB)", base_name,
                         budget / double(1 << 30)));
  Options held = options;
  held.memory_budget = static_cast<double>(budget);
  Result<RunResult> run = RunScheduler(program, "concerto", cost, held, nullptr, progress);
  if (!run.ok()) {
    if (why_not)
      *why_not = fmt::format("concerto under {}'s peak memory ({:.2f} GiB): {}", base_name,
                             budget / double(1 << 30), run.status().message());
    return;
  }
  run->summary.scheduler = kEqualMemoryRow;
  runs->push_back(std::move(run).value());
}

namespace {

/// Why scheduler `b` can give exactly `a`'s schedule (the pairs whose policies coincide on some
/// programs), or "" for a pair with no known reason.
std::string WhyEqual(const std::string& a, const std::string& b) {
  auto is = [&](const char* x, const char* y) { return (a == x && b == y) || (a == y && b == x); };
  if (is("megatron", "megatron-tp-overlap"))
    return "megatron-tp-overlap chunks a tensor-parallel GEMM with its collective along the micro-batch's "
           "leading dimension, and found nothing to chunk here (no such collective, or a micro-batch of 1)";
  if (is("megatron", "zb-h1"))
    return "zb-h1 defers weight gradients only on a plain 1F1B pipeline (every stage but the first); "
           "the plan has none, or its pipeline is interleaved";
  if (is("zero", "deepspeed-overlap"))
    return "deepspeed-overlap changes only how ZeRO's gradient and parameter collectives overlap; the plan "
           "has no ZeRO sharding, or its collectives were already overlapped";
  return "";
}

/// Notes under the table: rows that are the same schedule (and why, where the policies are known
/// to coincide), and a concerto row whose peak memory differs from every baseline's.
std::string TableNotes(const std::vector<RunResult>& runs) {
  std::string out;
  // One note per row that repeats an earlier one: the earlier row with a known reason, else the first.
  for (size_t j = 1; j < runs.size(); ++j) {
    const Summary& b = runs[j].summary;
    const Summary* same = nullptr;
    std::string why;
    for (size_t i = 0; i < j && why.empty(); ++i) {
      const Summary& a = runs[i].summary;
      if (std::abs(a.makespan_us - b.makespan_us) > 1e-9 * std::max(1.0, a.makespan_us) ||
          a.peak_memory_bytes != b.peak_memory_bytes)
        continue;
      if (!same) same = &a;
      if (std::string w = WhyEqual(a.scheduler, b.scheduler); !w.empty()) same = &a, why = w;
    }
    if (same) out += fmt::format("note: {} = {} here{}{}\n", b.scheduler, same->scheduler, why.empty() ? "" : ": ", why);
  }
  double baseline_peak = 0;
  const Summary* concerto = nullptr;
  const Summary* held = nullptr;
  for (const auto& r : runs) {
    if (r.summary.scheduler == "concerto") concerto = &r.summary;
    else if (r.summary.scheduler == kEqualMemoryRow) held = &r.summary;
    else if (IsBaselineRow(r.summary.scheduler)) baseline_peak = std::max(baseline_peak, double(r.summary.peak_memory_bytes));
  }
  if (const Summary* base = FastestFittingBaseline(runs); held && base && concerto)
    out += fmt::format("note: {} is concerto held to the peak memory of the fastest baseline that fits, {} "
                       "({:.2f} GiB), what a user who needs that memory gets: {:.3f}x over {} (free concerto "
                       "{:.3f}x at {:.2f} GiB)\n",
                       kEqualMemoryRow, base->scheduler, base->peak_memory_bytes / double(1 << 30),
                       base->makespan_us / held->makespan_us, base->scheduler,
                       base->makespan_us / concerto->makespan_us, concerto->peak_memory_bytes / double(1 << 30));
  if (concerto && baseline_peak > 0 && concerto->peak_memory_bytes > 1.05 * baseline_peak)
    out += fmt::format(
        "note: concerto's schedule holds {:.2f} GiB at peak, {:.0f}% more than the most any baseline holds "
        "({:.2f} GiB): its order keeps more activations, gradients or chunk buffers alive at once (what "
        "overlapping costs); {}\n",
        concerto->peak_memory_bytes / double(1 << 30), 100 * (concerto->peak_memory_bytes / baseline_peak - 1),
        baseline_peak / double(1 << 30),
        concerto->fits_memory ? "within the memory budget (a lower --memory-budget holds concerto to it)"
                              : "over the memory budget");
  return out;
}

}  // namespace

std::string CompareTable(const std::vector<RunResult>& runs, const LowerBound& lb, const std::string& title) {
  std::string out = title + "\n";
  out += fmt::format("{:<20} {:>14} {:>12} {:>14} {:>9} {:>8} {:>10} {:>10} {:>12}\n", "scheduler", "step_ms",
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
  out += TableNotes(runs);
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
  // Concerto against the fastest baseline that fits: free, and held to that
  // baseline's peak memory (the kEqualMemoryRow run, when compare made one).
  const Summary* base = FastestFittingBaseline(runs);
  const Summary* free = Row(runs, "concerto");
  const Summary* held = Row(runs, kEqualMemoryRow);
  if (base && free) {
    nlohmann::json g;
    g["baseline"] = base->scheduler;
    g["baseline_makespan_us"] = base->makespan_us;
    g["baseline_peak_memory_bytes"] = base->peak_memory_bytes;
    g["free_speedup"] = base->makespan_us / free->makespan_us;
    g["free_peak_memory_bytes"] = free->peak_memory_bytes;
    // Equal memory: concerto's own run when it already fits the baseline's peak.
    const Summary* at_equal = free->peak_memory_bytes <= base->peak_memory_bytes ? free : held;
    g["equal_memory_speedup"] = at_equal ? nlohmann::json(base->makespan_us / at_equal->makespan_us) : nlohmann::json();
    g["equal_memory_scheduler"] = at_equal ? nlohmann::json(at_equal->scheduler) : nlohmann::json();
    j["concerto_vs_best_baseline"] = g;
  }
  j["best_scheduler"] = best_name;
  j["any_fits_memory"] = any_fits;
  j["best_makespan_us"] = best;
  // The input program's plain bound, named apart from each result's
  // `lower_bound_us` (the bound of that run's own, possibly rewritten,
  // program: bucketing, chunking and stream splits change the work).
  j["input_lower_bound_us"] = lb.lower_bound_us;
  j["input_lower_bound_critical_path_us"] = lb.critical_path_us;
  j["input_lower_bound_stream_load_us"] = lb.stream_load_us;
  j["input_lower_bound_fill_drain_us"] = lb.fill_drain_us;
  return j;
}

}  // namespace concerto
