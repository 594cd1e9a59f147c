// The odd-even window search of the Concerto scheduler (see the header and
// docs/concerto.md). Times inside the search are integer ticks; the
// invariant is that `t` (start tick per op) is always a feasible schedule of
// nominal durations: every window solve keeps it feasible, so the per-stream
// orders decoded from it are deadlock-free.
#include "concerto/schedule/concerto_scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fmt/format.h>
#include <deque>
#include <future>
#include <memory>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>

#include "concerto/ir/graph_index.h"
#include "concerto/ir/graph_order.h"
#include "concerto/schedule/fusion_pass.h"
#include "concerto/schedule/list_schedule.h"
#include "concerto/sim/lower_bound.h"
#include "concerto/sim/memory.h"
#include "search_start_points.h"
#include "search_state.h"
#include "window_builder.h"
#include "window_solve_cache.h"

namespace concerto {
namespace {

using namespace search;  // the search's parts: start points, per-role state, window builder

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// A scheduled program with its simulated makespan and peak memory.
struct Candidate {
  ScheduledProgram sp;
  double makespan_us = 0;
  std::string name;
  int64_t peak_bytes = 0;
};

/// What one simulation of a candidate says.
struct Measured {
  double makespan_us = 0;
  int64_t peak_bytes = 0;
};

/// BetterSchedule against a candidate slot (any schedule beats an empty one).
bool Beats(double makespan_us, int64_t peak_bytes, const Candidate& incumbent) {
  return incumbent.name.empty() ||
         BetterSchedule(makespan_us, peak_bytes, incumbent.makespan_us, incumbent.peak_bytes);
}
bool Beats(const Measured& m, const Candidate& incumbent) { return Beats(m.makespan_us, m.peak_bytes, incumbent); }

/// Verifies and simulates `sp` with `indexes` (one per graph of sp.program),
/// shared by the verifier, the simulation and the memory sweep.
Result<Measured> Measure(const ScheduledProgram& sp, const std::vector<GraphIndex>& indexes, const CostModel& cost,
                         const SimOptions& sim) {
  std::vector<std::string> v = VerifySchedule(sp.program, sp.schedule, indexes);
  if (!v.empty()) return Status::Error("schedule fails verification: " + v[0]);
  Result<Timeline> t = Simulate(sp, cost, sim, indexes);
  if (!t.ok()) return t.status();
  return Measured{t->makespan_us, PeakMemory(sp.program, *t, indexes).peak_bytes};
}

/// Indexes every graph of `program` (in graph order).
std::vector<GraphIndex> IndexGraphs(const Program& program) {
  std::vector<GraphIndex> indexes;
  indexes.reserve(program.graphs.size());
  for (const Graph& g : program.graphs) indexes.push_back(GraphIndex::Build(g));
  return indexes;
}

/// Measure, indexing sp's graphs first.
Result<Measured> Measure(const ScheduledProgram& sp, const CostModel& cost, const SimOptions& sim) {
  return Measure(sp, IndexGraphs(sp.program), cost, sim);
}


class Search {
 public:
  Search(const Program& program, const CostModel& cost, const ConcertoOptions& options, ConcertoReport* report,
         const ProgressFn& progress)
      : program_(program), cost_(cost), opts_(options), report_(report), progress_(progress) {}

  Result<ScheduledProgram> Run() {
    t0_ = Clock::now();
    Result<std::unique_ptr<WindowSolver>> solver = MakeWindowSolver(opts_.solver);
    if (!solver.ok()) return solver.status();
    solver_ = std::move(solver).value();
    const bool batch = opts_.batch_windows || (opts_.batch_windows_from_ops > 0 &&
                                               LargestGraphOps(program_) >= static_cast<size_t>(opts_.batch_windows_from_ops));
    if (batch) {
      batch_ = opts_.batch_solver;
      if (!batch_) {
        Result<std::unique_ptr<WindowBatchSolver>> local = NewThreadBatchSolver(opts_.solver, opts_.threads);
        if (!local.ok()) return local.status();
        own_batch_ = std::move(local).value();
        batch_ = own_batch_.get();
      }
      report_->batch_solver = batch_->name();
    } else if (opts_.threads > 1 && solver_->thread_safe()) {
      speculation_ = std::make_unique<SpeculationExecutor>(MakeWindowSolver(opts_.solver).value());
    }
    report_->solver = opts_.solver;
    CONCERTO_RETURN_IF_ERROR(PickIncumbent());
    report_->lower_bound_us = LowerBoundUs(best_.sp.program);
    CONCERTO_RETURN_IF_ERROR(InitRoles());
    // The stop rule's unit is a round, or a pass once the rule applies by
    // the window count: a pass of a program that large is itself hundreds of
    // windows (the 100k-op training program: 400), so the rule is checked
    // after each pass.
    int stalled = 0;
    double unit_before_us = best_.makespan_us;
    int unit_passes = 0;
    // Whether the search stops on the unit that ends here (after `pass` of `round`).
    // Whether the rule applies by the window count (and its unit is a pass).
    auto by_window_count = [&] {
      return opts_.gain_rule_after_windows > 0 &&
             report_->windows.size() >= static_cast<size_t>(opts_.gain_rule_after_windows);
    };
    auto unit_stalls = [&](int round, int pass) {
      const bool by_windows = by_window_count();
      const double gain = unit_before_us > 0 ? (unit_before_us - best_.makespan_us) / unit_before_us : 0;
      const char* unit = unit_passes == 1 && by_windows ? "pass(es)" : "round(s)";
      unit_before_us = best_.makespan_us;
      unit_passes = 0;
      const bool gain_rule = round + 1 > opts_.gain_rule_after || by_windows;
      stalled = gain <= 0 || (gain_rule && gain < opts_.min_round_gain) ? stalled + 1 : 0;
      const bool more = pass == 0 || round + 1 < opts_.rounds;
      if (opts_.stall_rounds <= 0 || stalled < opts_.stall_rounds || !more) return false;
      report_->stopped_on_stall = true;
      Say(gain_rule ? fmt::format("stopping: {} {} in a row gained less than {:g}% (--min-round-gain){}", stalled, unit,
                                  100 * opts_.min_round_gain,
                                  round + 1 > opts_.gain_rule_after
                                      ? ""
                                      : fmt::format(", after {} windows (--gain-rule-after-windows)",
                                                    report_->windows.size()))
                    : fmt::format("stopping: {} {} in a row without a gain (--stall-rounds)", stalled, unit));
      return true;
    };
    bool stop = false;
    for (int round = 0; round < opts_.rounds && !Done() && !stop; ++round) {
      CONCERTO_RETURN_IF_ERROR(RunPass(round, 0));
      ++unit_passes;
      // Past the window count the odd pass is a unit of its own.
      if (by_window_count()) stop = unit_stalls(round, 0);
      if (!stop && !Done()) {
        CONCERTO_RETURN_IF_ERROR(RunPass(round, 1));
        ++unit_passes;
      }
      report_->rounds_run = round + 1;
      report_->makespan_after_round_us.push_back(best_.makespan_us);
      if (!stop && unit_passes > 0) stop = unit_stalls(round, 1);
    }
    TakeBackBest();
    if (opts_.fuse && program_.roles.size() == 1) CONCERTO_RETURN_IF_ERROR(Fuse());
    const bool fell_back = Beats(fallback_.makespan_us, fallback_.peak_bytes, best_);
    if (fell_back) best_ = std::move(fallback_);
    report_->undecomposed = !fell_back && report_->start.rfind("list-undecomposed", 0) == 0;
    // Fusion and the fallback change the program (fused collectives, no
    // split streams), and the bound is a property of the program: report the
    // bound of the one returned.
    if (fell_back || report_->fused_collectives > 0) report_->lower_bound_us = LowerBoundUs(best_.sp.program);
    best_.sp.schedule.scheduler = "concerto";
    report_->final_makespan_us = best_.makespan_us;
    report_->memory_budget_bytes = opts_.memory_budget_bytes;
    report_->peak_memory_bytes = best_.peak_bytes;
    report_->gap = best_.makespan_us > 0 ? (best_.makespan_us - report_->lower_bound_us) / best_.makespan_us : 0;
    report_->reached_lower_bound = best_.makespan_us <= report_->lower_bound_us * (1 + 1e-9);
    report_->seconds = Since(t0_);
    return std::move(best_.sp);
  }

 private:
  double LowerBoundUs(const Program& p) {
    // The plain bound and the (linear-time) interference bound of the
    // simulation the search measures with; the propagation bound is left to
    // the driver's summary (up to a second per run).
    const double f = EffectiveInterference(opts_.sim.interference, cost_.cluster());
    return ComputeLowerBound(p, cost_, f).lower_bound_us;
  }

  /// Every baseline, simulated as it is (the fallback: never return worse)
  /// and with its ordering edges stripped (the starting point).
  /// Under the memory budget (always, when there is none).
  bool Fits(int64_t peak_bytes) const {
    return opts_.memory_budget_bytes <= 0 || peak_bytes <= opts_.memory_budget_bytes;
  }

  /// One baseline scheduled and measured as it is and without the ordering
  /// edges it added (stripped_sp empty: it added none, the figures are the same).
  struct BaselineRun {
    Result<ScheduledProgram> as_is_sp = Status::Error("not run");
    Result<Measured> as_is = Status::Error("not run");
    std::optional<ScheduledProgram> stripped_sp;
    Result<Measured> stripped = Status::Error("not run");
  };
  BaselineRun RunAndMeasure(const std::string& name) const {
    BaselineRun run;
    BaselineOptions options = opts_.baselines;
    std::string baseline = name;
    if (name.rfind("ddp@", 0) == 0) {  // a start of the DDP bucket sweep (StartNames)
      options.ddp_bucket_bytes = std::stoll(name.substr(4)) << 20;
      baseline = "ddp";
    }
    run.as_is_sp = RunBaseline(baseline, program_, cost_, options);
    if (!run.as_is_sp.ok()) return run;
    run.as_is = Measure(*run.as_is_sp, cost_, opts_.sim);
    if (!run.as_is.ok()) return run;
    // Copied (a sizeable cost at 10k ops) only when there are edges to strip.
    if (!StripSchedulerEdges(program_, run.as_is_sp->program, /*dry_run=*/true)) {
      run.stripped = run.as_is;
      return run;
    }
    ScheduledProgram stripped = *run.as_is_sp;
    StripSchedulerEdges(program_, stripped.program);
    run.stripped = Measure(stripped, cost_, opts_.sim);
    run.stripped_sp = std::move(stripped);
    return run;
  }

  /// The baselines, and (ddp_bucket_sweep) DDP at the bucket sizes a careful user tries besides the configured one
  /// ("ddp@1MiB", "ddp@5MiB": PyTorch's bucket_cap_mb; on a slow link small buckets start the
  /// gradient all-reduces early in the backward, and torch's own DDP at 1 MiB beat the 25 MiB
  /// default by 1.35x on the torch testbed at 1 Gbit/s: docs/results.md).
  std::vector<std::string> StartNames() const {
    std::vector<std::string> names = BaselineNames();
    // Without an all-reduce there is nothing for DDP to bucket: the sweep would repeat ddp.
    bool all_reduces = false;
    for (const Graph& g : program_.graphs)
      for (const Op& op : g.ops)
        all_reduces = all_reduces || (op.kind == OpKind::kCollective && op.collective == CollectiveType::kAllReduce);
    if (opts_.ddp_bucket_sweep && all_reduces)
      for (int64_t mib : {1, 5})
        if (opts_.baselines.ddp_bucket_bytes != (mib << 20)) names.push_back("ddp@" + std::to_string(mib) + "MiB");
    return names;
  }

  /// Every start (StartNames), simulated as it is (the fallback: never return worse)
  /// and with its ordering edges stripped (the starting point). Only
  /// schedules under the memory budget qualify.
  Status PickIncumbent() {
    int64_t lowest_peak = -1;
    std::string lowest_name;
    // Whether a measured schedule replaces what `slot` holds (and notes the
    // lowest peak of all). Programs are moved into the slots, copied only
    // when one program goes to both (at 100k ops a copy takes seconds).
    auto better = [&](const Measured& m, const std::string& name, const Candidate& slot) {
      if (lowest_peak < 0 || m.peak_bytes < lowest_peak) lowest_peak = m.peak_bytes, lowest_name = name;
      return Fits(m.peak_bytes) && Beats(m, slot);
    };
    // Baselines are scheduled and measured opts_.threads at a time (they are
    // independent) and considered in their fixed order, as one at a time.
    const std::vector<std::string> names = StartNames();
    const size_t at_once = static_cast<size_t>(std::max(1, opts_.threads));
    for (size_t first = 0; first < names.size(); first += at_once) {
      std::vector<std::future<BaselineRun>> runs;
      for (size_t k = first; k < std::min(names.size(), first + at_once); ++k)
        runs.push_back(std::async(k == first ? std::launch::deferred : std::launch::async,
                                  [this, &name = names[k]] { return RunAndMeasure(name); }));
      for (size_t k = 0; k < runs.size(); ++k) {
        const std::string& name = names[first + k];
        BaselineRun run = runs[k].get();
        if (!run.as_is_sp.ok()) return Status::Error("baseline '" + name + "': " + run.as_is_sp.status().message());
        if (!run.as_is.ok()) return Status::Error("baseline '" + name + "': " + run.as_is.status().message());
        const bool to_fallback = better(*run.as_is, name, fallback_);
        const bool to_best = run.stripped.ok() && better(*run.stripped, name, best_);
        if (to_best) {
          ScheduledProgram& sp = run.stripped_sp ? *run.stripped_sp : *run.as_is_sp;
          best_ = {to_fallback && !run.stripped_sp ? sp : std::move(sp), run.stripped->makespan_us, name,
                   run.stripped->peak_bytes};
        }
        if (to_fallback) fallback_ = {std::move(*run.as_is_sp), run.as_is->makespan_us, name, run.as_is->peak_bytes};
      }
    }
    if (fallback_.name.empty() && best_.name.empty()) {
      report_->memory_infeasible = true;
      return Status::Error(fmt::format(
          "memory budget of {} bytes per rank is infeasible: the lowest peak any starting schedule reaches is {} "
          "bytes ({:.2f} GiB, baseline '{}')",
          opts_.memory_budget_bytes, lowest_peak, lowest_peak / double(1 << 30), lowest_name));
    }
    if (fallback_.name.empty()) fallback_ = best_;
    if (best_.name.empty()) best_ = fallback_;
    TryListSchedule();
    TrySplitStreams();
    TryMergeStreams();
    report_->incumbent = fallback_.name;
    report_->incumbent_makespan_us = fallback_.makespan_us;
    report_->incumbent_peak_memory_bytes = fallback_.peak_bytes;
    report_->start = best_.name;
    report_->start_makespan_us = best_.makespan_us;
    Say(fmt::format("incumbent: best baseline '{}' {:.3f} ms; search starts from '{}' without its ordering edges "
                    "({:.3f} ms)",
                    fallback_.name, fallback_.makespan_us / 1e3, best_.name, best_.makespan_us / 1e3));
    return Status::Ok();
  }

  /// The critical-path list schedule over the joined graph of all roles
  /// (CriticalPathListSchedule) as a further starting point, of the input
  /// program and, when the best stripped baseline rewrote it (bucketing
  /// changes the op count), of that baseline's program too, and of the
  /// program before decomposition when there is one: each replaces the
  /// starting point when it simulates faster and fits. Never the fallback,
  /// which stays a baseline. Dropped when it deadlocks.
  void TryListSchedule() {
    if (!opts_.list_schedule) return;
    if (TotalOps(best_.sp.program) != TotalOps(program_))
      TryListScheduleOf(best_.sp.program, "list+" + best_.name, "the program of '" + best_.name + "'");
    const bool free_fits = TryListScheduleOf(program_, "list", "the input program");
    // Only where the decomposition may have cost the fit: where the free list
    // schedule of the decomposed program fits, starting from the undecomposed
    // one was tried and ended slower (llama-7b dp=4,tp=8,sp on a800-4x8:
    // 617.3 -> 627.3 ms; the chunks hide what the search later overlaps).
    if (opts_.undecomposed && !free_fits)
      TryListScheduleOf(*opts_.undecomposed, "list-undecomposed", "the program before decomposition");
  }
  static size_t TotalOps(const Program& p) {
    size_t n = 0;
    for (const Graph& g : p.graphs) n += g.ops.size();
    return n;
  }
  static size_t LargestGraphOps(const Program& p) {
    size_t n = 0;
    for (const Graph& g : p.graphs) n = std::max(n, g.ops.size());
    return n;
  }
  /// The list schedule of `program` as a starting point (named `name`); with
  /// several roles also in order (ListScheduleOptions::in_order: 1F1B's
  /// order and memory on a pipeline), each kept when it simulates faster and
  /// fits. One over the memory budget is tried again within a window over
  /// the program order (ListScheduleOptions::max_ahead_ops): halved from
  /// half the largest graph (not below 16 ops) until one fits. (Bisecting
  /// between the last window over and the first that fits was tried: on
  /// gpt-6.7b pp=4 on commodity-4x8 the windows in between were 3% slower,
  /// not faster; makespan is not monotone in the window.)
  /// The halvings are computed opts_.threads at a time (each is independent
  /// of the others' outcome) and considered in order, as one at a time:
  /// the same starting point, the same lines.
  bool TryListScheduleOf(const Program& program, const std::string& name, const std::string& of) {
    bool free_fits = false;
    const size_t largest = LargestGraphOps(program);
    // One list schedule, simulated (no decision: that is `consider`'s).
    struct Attempt {
      int ahead = 0;
      Status error;  // the list schedule or its simulation failed
      bool scheduled = false;
      std::optional<ScheduledProgram> sp;
      Measured m;
    };
    for (const bool in_order : {false, true}) {
      if (in_order && program.roles.size() < 2) break;  // one role: the same schedule
      auto compute = [&, in_order](int ahead) {
        Attempt at;
        at.ahead = ahead;
        Result<Schedule> s = CriticalPathListSchedule(program, cost_, ListScheduleOptions{in_order, ahead});
        if (!s.ok()) return at.error = s.status(), at;
        at.scheduled = true;
        at.sp.emplace(ScheduledProgram{program, std::move(s).value()});
        Result<Measured> m = Measure(*at.sp, cost_, opts_.sim);
        if (!m.ok()) return at.error = m.status(), at;
        at.m = *m;
        return at;
      };
      // Returns whether the list schedule fits (nullopt: none to measure).
      auto consider = [&](Attempt at) -> std::optional<bool> {
        const std::string label = (in_order ? of + ", in order" : of) +
                                  (at.ahead == 0 ? "" : fmt::format(", at most {} ops ahead", at.ahead));
        const std::string named = (in_order ? name + "-in-order" : name) + (at.ahead == 0 ? "" : "-window");
        if (!at.error.ok()) {
          Say((at.scheduled ? "list schedule of " + label + " dropped: " : "list schedule of " + label + ": ") +
              at.error.message() + (at.scheduled ? "" : " (not a starting point)"));
          return std::nullopt;
        }
        const Measured& m = at.m;
        const bool fits = Fits(m.peak_bytes);
        const bool keep = Beats(m, best_) && fits;
        Say(fmt::format("list schedule (critical path over the joined graph) of {}: {:.3f} ms, peak {:.2f} GiB{}",
                        label, m.makespan_us / 1e3, m.peak_bytes / double(1 << 30),
                        keep  ? ""
                        : fits ? fmt::format(" (not kept: '{}' is {:.3f} ms)", best_.name, best_.makespan_us / 1e3)
                               : std::string(" (not kept: over the memory budget)")));
        if (keep) best_ = {std::move(*at.sp), m.makespan_us, named, m.peak_bytes};
        return fits;
      };
      std::optional<bool> fits = consider(compute(0));
      if (!in_order) free_fits = fits.value_or(false);
      if (!fits || *fits || opts_.memory_budget_bytes <= 0) continue;
      std::vector<int> aheads;
      for (int ahead = static_cast<int>(largest / 2); ahead >= 16; ahead /= 2) aheads.push_back(ahead);
      const size_t at_once = static_cast<size_t>(std::max(1, opts_.threads));
      bool done = false;
      for (size_t first = 0; first < aheads.size() && !done; first += at_once) {
        std::vector<std::future<Attempt>> runs;
        for (size_t k = first; k < std::min(aheads.size(), first + at_once); ++k)
          runs.push_back(std::async(k == first ? std::launch::deferred : std::launch::async, compute, aheads[k]));
        for (auto& run : runs) {
          if (done) {
            run.wait();  // computed for nothing: a smaller window before it fit
            continue;
          }
          fits = consider(run.get());
          done = !fits || *fits;  // a smaller window only holds less
        }
      }
    }
    return free_fits;
  }

  /// Keeps `sp`, a stream rewrite of the starting point described by `what`,
  /// when it simulates faster and fits (the name gains `suffix`). Returns
  /// whether it was kept.
  bool KeepStreamRewrite(ScheduledProgram sp, const std::string& what, const std::string& suffix) {
    Result<Measured> m = Measure(sp, cost_, opts_.sim);
    const bool keep = m.ok() && Beats(*m, best_) && Fits(m->peak_bytes);
    Say(fmt::format("{}: {}", what,
                    !m.ok() ? m.status().message()
                            : fmt::format("{:.3f} ms -> {:.3f} ms{}", best_.makespan_us / 1e3, m->makespan_us / 1e3,
                                          keep ? "" : " (not kept)")));
    if (keep) best_ = {std::move(sp), m->makespan_us, best_.name + suffix, m->peak_bytes};
    return keep;
  }

  /// The starting point with inter-node collectives on a stream of their own
  /// (SplitInterNodeStreams), kept when it simulates faster and fits.
  void TrySplitStreams() {
    ScheduledProgram split = best_.sp;
    const int moved = SplitInterNodeStreams(split, cost_.cluster());
    if (moved == 0) return;
    if (KeepStreamRewrite(std::move(split), fmt::format("{} inter-node collectives on a stream of their own", moved),
                          "+streams"))
      report_->inter_node_stream_ops = moved;
  }

  /// The starting point with every communicator of a rank on one stream
  /// (MergeCommStreams), kept when it simulates faster and fits: concerto
  /// chooses the mapping of groups to streams.
  void TryMergeStreams() {
    const bool several = std::any_of(best_.sp.program.graphs.begin(), best_.sp.program.graphs.end(), [](const Graph& g) {
      std::set<std::string> comm;
      for (const Op& op : g.ops)
        if (op.IsComm()) comm.insert(op.stream);
      return comm.size() > 1;
    });
    if (!several) return;  // nothing to merge: no simulation, no copy
    Result<Timeline> tl = Simulate(best_.sp, cost_, opts_.sim);
    if (!tl.ok()) return;
    ScheduledProgram merged = best_.sp;
    const int moved = MergeCommStreams(merged, *tl);
    if (KeepStreamRewrite(std::move(merged), fmt::format("every communicator on one stream ({} ops moved)", moved),
                          "+one-comm-stream"))
      report_->comm_streams_merged = moved;
  }

  Status InitRoles() {
    // The search's program is the incumbent's, moved (not copied) into
    // search_program_: moving keeps each Graph where it is, so the indexes
    // built here stay valid and the roles can point into it. best_ borrows
    // it back (best_in_search_) until TakeBackBest.
    search_indexes_ = IndexGraphs(best_.sp.program);
    Result<Timeline> tl = Simulate(best_.sp, cost_, opts_.sim, search_indexes_);
    if (!tl.ok()) return tl.status();
    tick_us_ = std::max(1e-3, tl->makespan_us / 2e6);
    // Memory units: about 2^24 of them make up the budget (Gecode's usages
    // are 32-bit); sizes round up and the budget down, so units never
    // under-count.
    mem_unit_bytes_ = std::max<int64_t>(1, (opts_.memory_budget_bytes + (1 << 24) - 1) >> 24);
    budget_units_ = opts_.memory_budget_bytes > 0 ? opts_.memory_budget_bytes / mem_unit_bytes_ : 0;
    search_program_ = std::move(best_.sp.program);  // roles point into it
    best_in_search_ = true;
    start_fusion_groups_ = best_.sp.schedule.fusion_groups;
    const Program& p = search_program_;
    roles_.clear();
    for (size_t ri = 0; ri < p.roles.size(); ++ri) {
      RoleSearch r;
      r.role = static_cast<int>(ri);
      r.rank = *std::min_element(p.roles[ri].ranks.begin(), p.roles[ri].ranks.end());
      r.graph = &p.GraphOf(p.roles[ri]);
      r.index = &search_indexes_[p.GraphIndex(p.roles[ri].graph)];
      const int n = static_cast<int>(r.graph->ops.size());
      PriceContext ctx{*r.graph, *r.index, p.mesh, r.rank};
      for (const Op& op : r.graph->ops)
        r.dur.push_back(static_cast<int64_t>(std::llround(cost_.Price(op, ctx).duration_us / tick_us_)));
      r.stream.assign(n, 0);
      for (int i = 0; i < n; ++i) {
        const auto& st = r.graph->streams;
        r.stream[i] = static_cast<int>(std::find(st.begin(), st.end(), r.graph->ops[i].stream) - st.begin());
      }
      r.topo.assign(n, 0);
      std::vector<int> topo = TopologicalOrder(*r.graph, *r.index);
      for (size_t k = 0; k < topo.size(); ++k) r.topo[topo[k]] = static_cast<int>(k);
      // Start from the incumbent's orders, compacted to nominal durations.
      const RoleSchedule* rs = best_.sp.schedule.ForRole(p.roles[ri].name);
      r.order.assign(r.graph->streams.size(), {});
      for (const auto& so : rs->streams) {
        int s = static_cast<int>(std::find(r.graph->streams.begin(), r.graph->streams.end(), so.stream) -
                                 r.graph->streams.begin());
        for (int id : so.op_ids) r.order[s].push_back(r.index->op.at(id));
      }
      r.pos.assign(n, -1);
      for (size_t s = 0; s < r.order.size(); ++s) RenumberStream(r, s);
      Compact(r);
      if (opts_.memory_budget_bytes > 0)
        for (const Tensor& tensor : r.graph->tensors)
          r.tensor_units.push_back((tensor.Bytes() + mem_unit_bytes_ - 1) / mem_unit_bytes_);
      roles_.push_back(std::move(r));
    }
    // Several roles: start ticks from the joined timeline, so the windows
    // see when each recv's data arrives (the pipeline's bubbles).
    partner_.clear();
    if (roles_.size() > 1) {
      partner_ = PairSendRecv(p);
      if (!JoinedCompact(roles_, partner_)) partner_.clear();
    }
    return Status::Ok();
  }

  /// As-soon-as-possible start ticks of every role for the current orders:
  /// the joined timeline when the program has several roles, else each role
  /// alone. False when the orders deadlock across roles.
  bool CompactAll() {
    if (!partner_.empty()) return JoinedCompact(roles_, partner_);
    for (RoleSearch& r : roles_) Compact(r);
    return true;
  }

  bool Done() {
    if (best_.makespan_us <= report_->lower_bound_us * (1 + 1e-9)) return true;
    if (Since(t0_) > opts_.time_budget_s) {
      report_->hit_time_budget = true;
      return true;
    }
    return false;
  }

  /// Ends the search: best_ gets its program back from search_program_
  /// when it borrowed it (the roles must not be used after this).
  void TakeBackBest() {
    if (best_in_search_) best_.sp.program = std::move(search_program_);
    best_in_search_ = false;
    roles_.clear();
  }

  /// One odd (pass 0) or even (pass 1) sweep over every role, then decode
  /// and simulate; the result replaces the best when it is faster.
  Status RunPass(int round, int pass) {
    std::vector<std::vector<int64_t>> saved;
    for (const RoleSearch& r : roles_) saved.push_back(r.t);
    for (RoleSearch& r : roles_) {
      SortStreams(r);
      if (!partner_.empty() && r.role > 0) {
        // Earlier roles' windows moved their ops: refresh the joined
        // timeline (and so the arrival ticks) this role's windows see.
        for (RoleSearch& q : roles_) SortStreams(q);
        if (JoinedCompact(roles_, partner_))
          for (RoleSearch& q : roles_) SortStreams(q);
      }
      std::vector<int> global(r.graph->ops.size());
      std::iota(global.begin(), global.end(), 0);
      std::sort(global.begin(), global.end(),
                [&](int a, int b) { return std::tie(r.t[a], r.topo[a]) < std::tie(r.t[b], r.topo[b]); });
      const int b = opts_.block_ops;
      const int blocks = (static_cast<int>(global.size()) + b - 1) / b;
      int64_t horizon = 0;
      for (size_t i = 0; i < r.t.size(); ++i) horizon = std::max(horizon, r.t[i] + r.dur[i]);
      auto members_of = [&](int k) {
        return std::vector<int>(global.begin() + k * b,
                                global.begin() + std::min<size_t>(global.size(), static_cast<size_t>((k + 2) * b)));
      };
      if (batch_) {
        SolveBatch(r, members_of, horizon, pass, blocks, round);
        continue;
      }
      std::deque<Speculation> ahead;  // windows solved ahead, in pass order
      for (int k = pass; k < blocks; k += 2) {
        if (Done()) break;
        Window w = BuildWindow(r, members_of(k), horizon, program_.roles.size() > 1, budget_units_);
        const Place place{r.role, pass, k};
        std::optional<Result<WindowSolution>> answer;
        bool reused = false;
        while (!ahead.empty() && ahead.front().first_block < k) ahead.pop_front();
        if (!ahead.empty() && ahead.front().first_block == k) {
          // A guess for another problem (an earlier window moved this one's
          // context) is not waited for: the main thread solves at once.
          if (ahead.front().problem == w.problem) answer = ahead.front().answer.get(), report_->windows_speculated++;
          ahead.pop_front();
        }
        if (!answer)
          if (const WindowSolution* known = cache_.Find(place, w.problem)) answer = *known, reused = true;
        if (!answer) {
          if (speculation_ && ahead.empty() && speculation_->Idle())
            ahead = SolveAhead(r, members_of, horizon, pass, k, blocks);
          answer = solver_->Solve(w.problem, WindowSolverOptions());
        }
        ApplyWindow(r, w, *answer, reused, place, round);
      }
      if (speculation_) speculation_->Wait();
    }
    for (RoleSearch& r : roles_) SortStreams(r);
    if (!CompactAll()) {
      // The windows solve one role at a time; orders that deadlock across
      // roles are dropped (the pass is undone).
      for (size_t k = 0; k < roles_.size(); ++k) {
        roles_[k].t = saved[k];
        SortStreams(roles_[k]);
      }
      const bool ok = CompactAll();
      assert(ok && "the orders before the pass deadlock");
      (void)ok;
      for (RoleSearch& r : roles_) SortStreams(r);
      Say(fmt::format("round {} {} pass undone: its orders deadlock across roles", round + 1,
                      pass == 0 ? "odd" : "even"));
      return Status::Ok();
    }
    for (RoleSearch& r : roles_) SortStreams(r);
    // The program is lent to the candidate and taken back (a move keeps the
    // graphs, so the roles' pointers and search_indexes_ stay valid): no copy.
    Schedule decoded = Decode(search_program_, roles_, "concerto");
    decoded.fusion_groups = start_fusion_groups_;
    ScheduledProgram cand{std::move(search_program_), std::move(decoded)};
    Result<Measured> m = Measure(cand, search_indexes_, cost_, opts_.sim);
    search_program_ = std::move(cand.program);
    if (!m.ok()) return Status::Error("decoded schedule: " + m.status().message());
    if (Beats(*m, best_) && Fits(m->peak_bytes)) {
      best_ = {ScheduledProgram{Program{}, std::move(cand.schedule)}, m->makespan_us, "concerto", m->peak_bytes};
      best_in_search_ = true;
    }
    if (!Fits(m->peak_bytes)) {
      // The machine runs each stream's order as soon as it can, so delays the
      // windows chose to save memory are not kept; undo a pass that ends over
      // the budget.
      report_->passes_over_memory++;
      for (size_t k = 0; k < roles_.size(); ++k) {
        roles_[k].t = saved[k];
        SortStreams(roles_[k]);
      }
      if (!partner_.empty() && JoinedCompact(roles_, partner_))
        for (RoleSearch& r : roles_) SortStreams(r);
    }
    Say(fmt::format("round {} {} pass: {} windows so far, pass makespan {:.3f} ms{}, best {:.3f} ms (LB {:.3f} ms)",
                    round + 1, pass == 0 ? "odd" : "even", report_->windows.size(), m->makespan_us / 1e3,
                    Fits(m->peak_bytes) ? "" : " (over the memory budget)", best_.makespan_us / 1e3,
                    report_->lower_bound_us / 1e3));
    return Status::Ok();
  }

  /// The windows of one pass over role `r` as one batch (batch_windows):
  /// each built from the start ticks before the pass, those the cache does
  /// not answer solved together by batch_, then applied in pass order. When
  /// its turn comes a window is built again (earlier windows may have moved
  /// its context): an unchanged problem takes its batch answer; a changed
  /// one takes it when it verifies on the new problem (same tasks, still
  /// feasible), else is solved again here. Which answer each window gets
  /// depends only on the problems, so not on how the batch was solved.
  template <typename MembersOf>
  void SolveBatch(RoleSearch& r, const MembersOf& members_of, int64_t horizon, int pass, int blocks, int round) {
    struct Item {
      int k = 0;
      Window w;
      std::optional<Result<WindowSolution>> answer;
      bool reused = false;
    };
    std::vector<Item> items;
    std::vector<const WindowProblem*> problems;
    std::vector<size_t> solved_item;
    for (int k = pass; k < blocks; k += 2) {
      Item it;
      it.k = k;
      it.w = BuildWindow(r, members_of(k), horizon, program_.roles.size() > 1, budget_units_);
      if (const WindowSolution* known = cache_.Find({r.role, pass, k}, it.w.problem)) it.answer = *known, it.reused = true;
      items.push_back(std::move(it));
    }
    for (size_t i = 0; i < items.size(); ++i)
      if (!items[i].answer) problems.push_back(&items[i].w.problem), solved_item.push_back(i);
    if (Done()) return;
    std::vector<Result<WindowSolution>> answers = batch_->SolveAll(problems, WindowSolverOptions());
    for (size_t q = 0; q < answers.size(); ++q) items[solved_item[q]].answer = std::move(answers[q]);
    for (size_t i = 0; i < items.size(); ++i) {
      if (Done()) break;
      Item& it = items[i];
      const Place place{r.role, pass, it.k};
      if (i == 0) {  // nothing moved before the first window
        ApplyWindow(r, it.w, *it.answer, it.reused, place, round);
        if (!it.reused) report_->windows_batch_as_solved++;
        continue;
      }
      Window now = BuildWindow(r, members_of(it.k), horizon, program_.roles.size() > 1, budget_units_);
      if (now.problem == it.w.problem) {
        ApplyWindow(r, now, *it.answer, it.reused, place, round);
        if (!it.reused) report_->windows_batch_as_solved++;
        continue;
      }
      const Result<WindowSolution>& old = *it.answer;
      const bool answered =
          old.ok() && (old->status == SolveStatus::kOptimal || old->status == SolveStatus::kFeasible);
      if (answered && now.ops == it.w.ops && VerifyWindowSolution(now.problem, *old).empty()) {
        // Feasible as it is; remembered for the problem it was solved for.
        ApplyWindow(r, now, old, /*reused=*/false, place, round, &it.w.problem);
        report_->windows_batch_verified++;
        continue;
      }
      const Result<WindowSolution>* known = nullptr;
      Result<WindowSolution> fresh = Status::Error("not solved");
      if (const WindowSolution* c = cache_.Find(place, now.problem)) {
        fresh = *c;
        known = &fresh;
      }
      if (!known) {
        fresh = solver_->Solve(now.problem, WindowSolverOptions());
        report_->windows_batch_resolved++;
      }
      ApplyWindow(r, now, fresh, known != nullptr, place, round);
    }
  }

  /// How many windows one batch solves ahead. A new batch starts only once
  /// the helper finished the last one (its answers taken or found to be for
  /// a stale problem), so how many windows are solved ahead
  /// (windows_speculated) depends on timing; the schedule does not (a
  /// deterministic solve gives a speculated problem the answer the main
  /// thread would). 3 was no faster than 1 on this 2-core machine under load.
  static constexpr size_t kSolveAhead = 1;

  /// Options of one window solve: the fail limit, and the wall-clock safety
  /// net capped by what is left of the time budget.
  SolverOptions WindowSolverOptions() const {
    SolverOptions so;
    so.fail_limit = opts_.window_fail_limit;
    so.search = opts_.window_search == 1 ? SolverOptions::Search::kRank : SolverOptions::Search::kDive;
    so.time_limit_s = std::min(opts_.window_time_limit_s, std::max(0.01, opts_.time_budget_s - Since(t0_)));
    return so;
  }

  /// Builds the next windows of the pass after the one at `first_block`
  /// from the current start ticks (up to kSolveAhead whose answers are not
  /// remembered) and solves them one after another on the helper thread.
  template <typename MembersOf>
  std::deque<Speculation> SolveAhead(const RoleSearch& r, const MembersOf& members_of, int64_t horizon, int pass,
                                     int first_block, int blocks) {
    std::vector<std::pair<int, WindowProblem>> problems;
    for (int k = first_block + 2; k < blocks && problems.size() < kSolveAhead; k += 2) {
      Window w = BuildWindow(r, members_of(k), horizon, program_.roles.size() > 1, budget_units_);
      if (cache_.Find({r.role, pass, k}, w.problem)) continue;
      problems.emplace_back(k, std::move(w.problem));
    }
    return speculation_->Start(std::move(problems), WindowSolverOptions());
  }

  /// Takes a window's answer: a verified solution replaces the window's
  /// start ticks; the report records it; a deterministic answer is
  /// remembered for the next solve at the same place.
  void ApplyWindow(RoleSearch& r, const Window& w, const Result<WindowSolution>& sol, bool reused, const Place& place,
                   int round, const WindowProblem* solved_for = nullptr) {
    WindowReport wr;
    wr.round = round;
    wr.pass = std::get<1>(place);
    wr.first_block = std::get<2>(place);
    wr.tasks = static_cast<int>(w.ops.size());
    wr.memory = w.problem.memory_capacity >= 0;
    wr.reused = reused;
    if (sol.ok() && sol->hit_time_limit) {
      wr.hit_time_limit = true;
      report_->windows_hit_time_limit++;
    }
    if (sol.ok() && !sol->hit_time_limit && !reused && opts_.reuse_windows)
      cache_.Remember(place, solved_for ? *solved_for : w.problem, *sol);
    if (reused) report_->windows_reused++;
    if (!sol.ok() || (sol->status != SolveStatus::kOptimal && sol->status != SolveStatus::kFeasible)) {
      wr.status = sol.ok() ? sol->status : SolveStatus::kNoSolution;
      if (!sol.ok()) Say(fmt::format("window at block {} (round {}, {} tasks) kept its order: {}", wr.first_block,
                                     round + 1, wr.tasks, sol.status().message()));
      report_->windows_unsolved++;
      report_->windows.push_back(wr);
      return;
    }
    std::vector<std::string> violations = VerifyWindowSolution(w.problem, *sol);
    assert(violations.empty() && "window solver returned an answer its verifier rejects");
    if (!violations.empty()) {
      report_->windows_unsolved++;
      report_->windows.push_back(wr);
      return;
    }
    std::vector<int> changed;
    for (int tk = 0; tk < w.free_tasks; ++tk) {
      if (r.t[w.ops[tk]] != sol->start[tk]) changed.push_back(w.ops[tk]);
      r.t[w.ops[tk]] = sol->start[tk];
    }
    ResortChanged(r, changed);
    wr.status = sol->status;
    wr.objective_us = sol->objective * tick_us_;
    wr.bound_us = sol->bound * tick_us_;
    wr.gap = sol->gap;
    wr.seconds = reused ? 0 : sol->seconds;
    report_->windows_solved++;
    (sol->status == SolveStatus::kOptimal ? report_->windows_optimal : report_->windows_feasible)++;
    report_->windows.push_back(wr);
  }

  /// The fusion pass on the best schedule; kept only when it simulates faster.
  Status Fuse() {
    Result<Timeline> tl = Simulate(best_.sp, cost_, opts_.sim);
    if (!tl.ok()) return tl.status();
    Candidate cand = best_;
    Result<int> fused = FuseWhereItPays(cand.sp, *tl, cost_);
    if (!fused.ok()) return fused.status();
    if (*fused == 0) return Status::Ok();
    Result<Measured> m = Measure(cand.sp, cost_, opts_.sim);
    if (!m.ok()) return Status::Error("fusion pass: " + m.status().message());
    const bool keep = Beats(*m, best_) && Fits(m->peak_bytes);
    Say(fmt::format("fusion: {} collectives merged, {:.3f} ms -> {:.3f} ms{}", *fused, best_.makespan_us / 1e3,
                    m->makespan_us / 1e3, keep ? "" : " (not kept)"));
    if (keep) {
      report_->fused_collectives = *fused;
      report_->fusion_gain_us = best_.makespan_us - m->makespan_us;
      best_ = {std::move(cand.sp), m->makespan_us, "concerto", m->peak_bytes};
    }
    return Status::Ok();
  }

  void Say(const std::string& line) {
    if (progress_) progress_(line);
  }

  const Program& program_;
  const CostModel& cost_;
  const ConcertoOptions& opts_;
  ConcertoReport* report_;
  ProgressFn progress_;
  Clock::time_point t0_;
  std::unique_ptr<WindowSolver> solver_;
  std::unique_ptr<SpeculationExecutor> speculation_;  // the windows solved ahead (null: none)
  WindowBatchSolver* batch_ = nullptr;                // batch_windows: solves each pass's windows
  std::unique_ptr<WindowBatchSolver> own_batch_;      // the local threads, when no batch_solver is given
  WindowSolveCache cache_;                            // the last solve at each place
  Candidate best_, fallback_;
  /// best_'s program is search_program_ (empty in best_ until TakeBackBest).
  bool best_in_search_ = false;
  std::vector<GraphIndex> search_indexes_;  // one per graph of search_program_
  Program search_program_;  // the program the windows reorder (the incumbent's)
  std::vector<FusionGroup> start_fusion_groups_;
  std::vector<RoleSearch> roles_;
  /// Per role and op: the op a send or recv meets (PairSendRecv); empty for
  /// one role, or when the incumbent's orders cannot be joined.
  std::vector<std::vector<RoleOp>> partner_;
  double tick_us_ = 1;
  int64_t mem_unit_bytes_ = 1;
  int64_t budget_units_ = 0;  // 0: no memory in the windows
};

}  // namespace

bool BetterSchedule(double makespan_us, int64_t peak_bytes, double incumbent_makespan_us,
                    int64_t incumbent_peak_bytes) {
  const double tol = 1e-9 * std::max(1.0, std::abs(incumbent_makespan_us));
  if (makespan_us < incumbent_makespan_us - tol) return true;
  return makespan_us <= incumbent_makespan_us + tol && peak_bytes < incumbent_peak_bytes;
}

Result<ScheduledProgram> RunConcerto(const Program& program, const CostModel& cost, const ConcertoOptions& options,
                                     ConcertoReport* report, const ProgressFn& progress) {
  if (options.block_ops < 1) return Status::Error("option --block: must be at least 1 op");
  if (options.rounds < 0) return Status::Error("option --rounds: must not be negative");
  if (options.stall_rounds < 0) return Status::Error("option --stall-rounds: must not be negative");
  if (options.gain_rule_after < 0) return Status::Error("option --gain-rule-after: must not be negative");
  if (!(options.min_round_gain >= 0 && options.min_round_gain <= 1))
    return Status::Error("option --min-round-gain: must be a fraction in [0, 1]");
  if (options.gain_rule_after_windows < 0)
    return Status::Error("option --gain-rule-after-windows: must not be negative");
  if (options.batch_windows_from_ops < 0) return Status::Error("option --batch-windows-from: must not be negative");
  if (options.memory_budget_bytes < 0) return Status::Error("option --memory-budget: must not be negative");
  ConcertoReport local;
  Search search(program, cost, options, report ? report : &local, progress);
  return search.Run();
}

const std::vector<OptionRecord<ConcertoOptions>>& ConcertoOptionRecords() {
  static const std::vector<OptionRecord<ConcertoOptions>> records = {
      {"block", "ops", 2, 1e6, "concerto: ops per block; each window solves two adjacent blocks",
       &ConcertoOptions::block_ops},
      {"rounds", "rounds", 0, 1000,
       "concerto: at most this many odd-even rounds (each an odd and an even pass); the gain rule usually stops "
       "earlier",
       &ConcertoOptions::rounds},
      {"min-round-gain", "fraction", 0, 1,
       "concerto: after --gain-rule-after rounds, a round that improves the best makespan by less than this "
       "fraction of it stalls (a round without any gain always does)",
       &ConcertoOptions::min_round_gain},
      {"gain-rule-after", "rounds", 0, 1000,
       "concerto: rounds before --min-round-gain applies (until then only a round without any gain stalls)",
       &ConcertoOptions::gain_rule_after},
      {"gain-rule-after-windows", "windows", 0, 1e9,
       "concerto: --min-round-gain also applies once the search has solved this many windows, and from then on "
       "after every pass (a pass of a large program solves hundreds; 0: only after --gain-rule-after rounds)",
       &ConcertoOptions::gain_rule_after_windows},
      {"stall-rounds", "rounds", 0, 1000,
       "concerto: stop after this many stalled rounds in a row (see --min-round-gain; 0: run all --rounds)",
       &ConcertoOptions::stall_rounds},
      {"window-fail-limit", "fails", 1, 1e9,
       "concerto: failed search nodes per window solve (deterministic; CBC: branch-and-bound nodes)",
       &ConcertoOptions::window_fail_limit},
      {"window-search", "mode", 0, 1,
       "concerto: the window solves' Gecode search: dive (0: start times, branch and bound) or rank (1: the order of "
       "each pair of tasks on a stream, with restarts; proves hard multi-stream windows, costly on long ones)",
       &ConcertoOptions::window_search, 1, {{"dive", 0}, {"rank", 1}}},
      {"window-time-limit", "s", 0.01, 3600,
       "concerto: wall-clock safety net per window solve (reported when it fires; results then depend on load)",
       &ConcertoOptions::window_time_limit_s},
      {"time-budget", "s", 0.1, 86400, "concerto: wall-clock safety net for the whole search (reported when it fires)",
       &ConcertoOptions::time_budget_s},
      {"list-schedule", "0/1", 0, 1,
       "concerto: also start from critical-path list schedules (pipelines: free and in program order); 0: from "
       "the baselines only",
       &ConcertoOptions::list_schedule},
      {"ddp-bucket-sweep", "0/1", 0, 1,
       "concerto: also start from DDP with 1 and 5 MiB buckets besides --ddp-bucket (the sizes a careful user "
       "tries); 0: the baselines as configured only",
       &ConcertoOptions::ddp_bucket_sweep},
      {"threads", "threads", 1, 256,
       "concerto: baselines measured this many at a time; with --batch-windows 1 the threads that solve each "
       "batch, else 2 solves the next window ahead on a second thread (speed only: the schedule is the same)",
       &ConcertoOptions::threads},
      {"batch-windows", "0/1", 0, 1,
       "concerto: solve each pass's windows as one batch built from the same start ticks, in parallel (--threads, "
       "or MPI workers under concerto_mpi_run), then apply them in order; 0: one after another",
       &ConcertoOptions::batch_windows},
      {"batch-windows-from", "ops", 0, 1e9,
       "concerto: batches as --batch-windows 1 does when a role's graph has at least this many ops (0: only with "
       "--batch-windows 1)",
       &ConcertoOptions::batch_windows_from_ops},
      {"reuse-windows", "0/1", 0, 1,
       "concerto: answer a window from an identical earlier solve at the same place (speed only)",
       &ConcertoOptions::reuse_windows},
      {"fuse", "0/1", 0, 1, "concerto: the fusion pass after decoding (merges adjacent collectives where it pays)",
       &ConcertoOptions::fuse},
  };
  return records;
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
                      {"batch_solver", r.batch_solver},
                      {"windows_batch_as_solved", r.windows_batch_as_solved},
                      {"windows_batch_verified", r.windows_batch_verified},
                      {"windows_batch_resolved", r.windows_batch_resolved},
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
                      {"undecomposed", r.undecomposed},
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

}  // namespace concerto
