// The driver's passes (driver/pass.h): read, decompose, schedule.
#include "concerto/driver/pass.h"

#include <fmt/format.h>

#include "concerto/driver/driver.h"
#include "concerto/schedule/scheduler.h"

namespace concerto {

const std::vector<GraphIndex>& AnalysisCache::Indexes(const Program& program) {
  if (!indexes_) {
    indexes_.emplace();
    indexes_->reserve(program.graphs.size());
    for (const Graph& g : program.graphs) indexes_->push_back(GraphIndex::Build(g));
  }
  return *indexes_;
}

namespace {

/// The program as read or lowered (a pass that changes nothing, so that
/// --dump-after read shows the input).
class ReadPass : public Pass {
 public:
  std::string_view Name() const override { return "read"; }
  Result<PassChange> Run(PassContext&) override { return PassChange{}; }
};

/// Decomposes matmuls around the activation collectives that nothing hides,
/// where the cost model says it pays and fifo gets faster
/// (DecomposeWherePays, docs/decompose.md).
class DecomposePass : public Pass {
 public:
  std::string_view Name() const override { return "decompose"; }
  Result<PassChange> Run(PassContext& c) override {
    DecomposeReport report;
    Result<Program> out = DecomposeWherePays(c.program, *c.cost, *c.options, &report);
    if (!out.ok()) return out.status();
    PassChange change;
    change.program_changed = !report.rewrites.empty() && !report.rejected;
    if (!report.rewrites.empty())
      change.summary = fmt::format("decompose: {} of {} candidate collectives chunked; fifo {:.3f} -> {:.3f} ms{}",
                                   report.rewrites.size(), report.candidates, report.fifo_before_us / 1e3,
                                   report.fifo_after_us / 1e3,
                                   report.rejected ? ": rejected (" + report.rejected_reason + ")" : "");
    if (change.program_changed) {
      c.before_decompose = std::move(c.program);
      c.program = std::move(out).value();
    }
    c.decompose = std::move(report);
    return change;
  }
};

/// Total ops and control edges: what a schedule's rewrite (bucketing,
/// fusion, ordering edges) changes.
std::pair<size_t, size_t> Size(const Program& p) {
  size_t ops = 0, edges = 0;
  for (const Graph& g : p.graphs) {
    ops += g.ops.size();
    for (const Op& op : g.ops) edges += op.control_deps.size();
  }
  return {ops, edges};
}

/// Makes the schedule: a baseline's policy, or concerto's search (with the
/// memory budget; when nothing fits the device's default budget, the fastest
/// schedule, marked OOM by the evaluation).
class SchedulePass : public Pass {
 public:
  explicit SchedulePass(std::string scheduler) : scheduler_(std::move(scheduler)) {}
  std::string_view Name() const override { return "schedule"; }
  Result<PassChange> Run(PassContext& c) override {
    const auto before = Size(c.program);
    Result<ScheduledProgram> sp = Schedule(c);
    if (!sp.ok()) return sp.status();
    c.program = std::move(sp->program);
    c.schedule = std::move(sp->schedule);
    return PassChange{Size(c.program) != before, ""};
  }

 private:
  Result<ScheduledProgram> Schedule(PassContext& c) const {
    if (scheduler_ != "concerto") return RunBaseline(scheduler_, c.program, *c.cost, ToBaselineOptions(*c.options));
    ConcertoReport report;
    ConcertoOptions co = ToConcertoOptions(*c.options, c.cost->cluster());
    if (c.before_decompose) co.undecomposed = &*c.before_decompose;
    Result<ScheduledProgram> sp = RunConcerto(c.program, *c.cost, co, &report, c.progress);
    if (!sp.ok() && report.memory_infeasible && c.options->memory_budget < 0) {
      // Nothing fits the device's default budget: say so, and show the
      // fastest schedule, marked over the budget (an explicit budget that
      // nothing meets stays an error).
      if (c.progress)
        c.progress("no schedule fits the device's memory (" + sp.status().message() +
                   "); the fastest schedule follows, marked OOM");
      co.memory_budget_bytes = 0;
      report = ConcertoReport{};
      sp = RunConcerto(c.program, *c.cost, co, &report, c.progress);
    }
    if (sp.ok() && report.undecomposed && c.decompose) {
      c.decompose->superseded = true;
      if (c.progress) c.progress("decompose: superseded; the schedule is of the program before decomposition");
    }
    if (sp.ok()) c.concerto = std::move(report);
    return sp;
  }

  std::string scheduler_;
};

}  // namespace

const std::vector<PassInfo>& RegisteredPasses() {
  static const std::vector<PassInfo> passes = {
      {"read", "the program as read or lowered"},
      {"decompose", "concerto only: chunk matmuls around exposed activation collectives where it pays"},
      {"schedule", "the scheduler's rewrite and order (buckets, fused collectives, ordering edges)"},
  };
  return passes;
}

Result<std::unique_ptr<Pass>> MakePass(const std::string& name, const std::string& scheduler) {
  if (name == "read") return std::unique_ptr<Pass>(new ReadPass());
  if (name == "decompose") return std::unique_ptr<Pass>(new DecomposePass());
  if (name == "schedule") return std::unique_ptr<Pass>(new SchedulePass(scheduler));
  return Status::Error("no pass named '" + name + "'");
}

Status RunPasses(const std::vector<std::unique_ptr<Pass>>& passes, PassContext& context,
                 const std::function<void(const std::string&, const Program&)>& hook) {
  for (const std::unique_ptr<Pass>& pass : passes) {
    Result<PassChange> change = pass->Run(context);
    if (!change.ok()) return change.status();
    if (change->program_changed) context.analyses.Invalidate();
    if (context.progress && !change->summary.empty()) context.progress(change->summary);
    if (hook) hook(std::string(pass->Name()), context.program);
  }
  return Status::Ok();
}

}  // namespace concerto
