// The scheduler quality table (make bench): every baseline and concerto on
// the frontends' workloads, on a800-4x8 and commodity-4x8. Prints a
// markdown table (docs/results.md) and, with --json, one JSON object.
//
//   concerto_quality [--time-budget S] [--set OPTION=VALUE]... [--json] [--only NAME]
//   concerto_quality --scaling [--only PLAN]   scheduling time vs graph size (1k, 10k, 100k ops)
//   concerto_quality --sweep     quality vs rounds and block size on two workloads
//   concerto_quality --bound-speed  the propagation bound's time vs graph size (fifo programs)
//   concerto_quality --stop-rule [--only MODEL]  the search's stop rules side by side: the old
//                fixed 4 rounds (stop on a round without gain) and the default gain rule, on
//                every quality row and on random training-like DAGs of 1k, 10k and 100k ops
//   concerto_quality --batch [--only MODEL]  the pass modes side by side on the same rows: windows
//                one after another, and batches (--batch-windows 1) on 1 and 2 threads
//   concerto_quality --hard-windows  generated job shops and projects (50-150 tasks) by Gecode's
//                dive and rank searches and CBC, 10 s each (docs/solvers.md, "Hard windows")
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fmt/format.h>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "concerto/cost/cluster.h"
#include "concerto/driver/driver.h"
#include "concerto/util/json_text.h"
#include "concerto/lower/frontend.h"
#include "concerto/lower/synthetic.h"
#include "concerto/schedule/propagation_bound.h"
#include "concerto/schedule/window_instances.h"

namespace {

using namespace concerto;

struct Workload {
  std::string model;
  std::string plan;
};

const std::vector<Workload>& Workloads() {
  static const std::vector<Workload> w = {
      {"gpt-1.3b", "dp=4,tp=8"},
      {"gpt-6.7b", "pp=4,tp=4,dp=2,microbatches=8"},
      {"gpt-13b", "zero=3,dp=32,recompute=full"},  // as real ZeRO-3 runs of 13B: without it nothing fits 80 GB
      {"gpt-2.7b", "zero=2,dp=32"},
      {"llama-7b", "dp=4,tp=8,sp"},
      {"evoformer", "dp=4,dap=8"},
      {"mixtral-8x7b", "dp=4,ep=4,tp=8"},
  };
  return w;
}

/// The vision presets (lower/vision.h), `--vision`: data parallel, ZeRO-3, and
/// the ViT with tensor parallelism inside the node.
const std::vector<Workload>& VisionWorkloads() {
  static const std::vector<Workload> w = {
      {"vit-b16", "dp=32"},         {"vit-b16", "zero=3,dp=32"},         {"vit-b16", "dp=16,tp=2"},
      {"vit-h14", "dp=4,tp=8"},     {"wide-resnet50-2", "dp=32"},       {"wide-resnet50-2", "zero=3,dp=32"},
  };
  return w;
}

/// Seconds since `t0`.
double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// One concerto run with `options` on a lowered workload: prints a table row
/// (ops, makespan, T/LB, windows, seconds).
Status ConcertoRow(const std::string& label, const Program& program, const CostModel& cost, const Options& options) {
  size_t ops = 0;
  for (const Graph& g : program.graphs) ops += g.ops.size();
  const auto t0 = std::chrono::steady_clock::now();
  // The scheduler's progress on stderr, stamped with the seconds since the start (where the time goes).
  auto progress = [&](const std::string& line) { std::fprintf(stderr, "  [%6.2f s] %s\n", Since(t0), line.c_str()); };
  Result<RunResult> run = RunScheduler(program, "concerto", cost, options, nullptr, progress);
  if (!run.ok()) return run.status();
  const double seconds = Since(t0);
  const ConcertoReport& r = *run->concerto;
  std::cout << fmt::format("| {} | {} | {:.1f} | {:.1f} | {:.3f} | {} ({} optimal, {} at the fail limit{}; {} reused, {} "
                           "solved ahead) | {:.1f} | {:.1f} |\n",
                           label, ops, r.incumbent_makespan_us / 1e3, r.final_makespan_us / 1e3,
                           r.final_makespan_us / run->summary.bound.lower_bound_us, r.windows.size(), r.windows_optimal,
                           r.windows_feasible,
                           r.windows_hit_time_limit ? fmt::format(", {} at the time limit", r.windows_hit_time_limit) : "",
                           r.windows_reused, r.windows_speculated,
                           r.seconds, seconds)
            << std::flush;
  return Status::Ok();
}

/// Scheduling time vs graph size on real workloads, default options: about
/// 1k, 10k and 100k ops (1,279 + 1,083 per extra micro-batch: 1,279, 11,026
/// and 99,832) on a800-4x8, and the 10k program again on commodity-4x8, where
/// every round of the search gains (on a800 its bound stops the search before
/// the first round). `only` (a plan, or empty for all) picks rows.
int Scaling(const Options& options, const std::string& only) {
  struct Row {
    Workload w;
    std::string cluster;
  };
  const std::vector<Row> rows = {{{"gpt-1.3b", "dp=4,tp=8"}, "a800-4x8"},
                                 {{"gpt-1.3b", "dp=4,tp=8,microbatches=10"}, "a800-4x8"},
                                 {{"gpt-1.3b", "dp=4,tp=8,microbatches=10"}, "commodity-4x8"},
                                 {{"gpt-1.3b", "dp=4,tp=8,microbatches=92"}, "a800-4x8"}};
  std::cout << "| workload | ops | best baseline ms | concerto ms | T/LB | windows | search s | total s |\n"
               "|---|---|---|---|---|---|---|---|\n";
  for (const auto& [w, cluster] : rows) {
    if (!only.empty() && only != w.plan) continue;
    std::fprintf(stderr, "scaling: %s %s on %s\n", w.model.c_str(), w.plan.c_str(), cluster.c_str());
    AnalyticCostModel cost(LoadCluster(cluster).value());
    Result<Program> program = LowerModelPlan(w.model, w.plan);
    if (!program.ok()) return std::fprintf(stderr, "%s\n", program.status().message().c_str()), 1;
    if (Status s = ConcertoRow(w.model + " " + w.plan + " on " + cluster, *program, cost, options); !s.ok())
      return std::fprintf(stderr, "%s\n", s.message().c_str()), 1;
  }
  return 0;
}

/// Quality vs rounds (block 125) and vs block size (4 rounds) on two workloads.
int Sweep(Options options) {
  const std::vector<Workload> workloads = {{"gpt-1.3b", "dp=4,tp=8"}, {"llama-7b", "dp=4,tp=8,sp"}};
  AnalyticCostModel cost(LoadCluster("a800-4x8").value());
  std::cout << "| workload (a800-4x8) | ops | best baseline ms | concerto ms | T/LB | windows | search s | total s |\n"
               "|---|---|---|---|---|---|---|---|\n";
  for (const auto& w : workloads) {
    Result<Program> program = LowerModelPlan(w.model, w.plan);
    if (!program.ok()) return std::fprintf(stderr, "%s\n", program.status().message().c_str()), 1;
    std::vector<std::pair<int, int>> settings = {{1, 125}, {2, 125}, {4, 125}, {8, 125}, {4, 50}, {4, 250}};
    for (const auto& [rounds, block] : settings) {
      std::fprintf(stderr, "sweep: %s %s rounds %d block %d\n", w.model.c_str(), w.plan.c_str(), rounds, block);
      Options o = options;
      (void)o.Set("rounds", rounds);
      (void)o.Set("block", block);
      (void)o.Set("stall-rounds", 0);  // every round: the sweep measures what rounds buy
      if (Status s = ConcertoRow(fmt::format("{} {}, rounds {}, block {}", w.model, w.plan, rounds, block), *program,
                                 cost, o);
          !s.ok())
        return std::fprintf(stderr, "%s\n", s.message().c_str()), 1;
    }
  }
  return 0;
}

/// One concerto run for the stop-rule table: final makespan, rounds, seconds.
struct StopRun {
  double makespan_us = 0, seconds = 0;
  int rounds = 0;
  bool stopped_on_stall = false, hit_budget = false;
};
Result<StopRun> RunForStopRule(const Program& program, const CostModel& cost, const Options& options) {
  Result<RunResult> run = RunScheduler(program, "concerto", cost, options, nullptr, nullptr);
  if (!run.ok()) return run.status();
  const ConcertoReport& r = *run->concerto;
  return StopRun{r.final_makespan_us, r.seconds, r.rounds_run, r.stopped_on_stall, r.hit_time_budget};
}

/// The stop rules side by side on one program: the fixed rule of before
/// (at most 4 rounds, stop on a round without any gain) and the defaults
/// (the gain rule, docs/concerto.md step 5).
Status StopRuleRow(const std::string& label, const Program& program, const CostModel& cost, const Options& options) {
  std::fprintf(stderr, "stop rule: %s\n", label.c_str());
  Options fixed = options;
  CONCERTO_RETURN_IF_ERROR(fixed.Set("rounds", 4));
  CONCERTO_RETURN_IF_ERROR(fixed.Set("min-round-gain", 0));
  CONCERTO_RETURN_IF_ERROR(fixed.Set("stall-rounds", 1));
  Result<StopRun> a = RunForStopRule(program, cost, fixed);
  if (!a.ok()) return a.status();
  Result<StopRun> b = RunForStopRule(program, cost, options);
  if (!b.ok()) return b.status();
  size_t ops = 0;
  for (const Graph& g : program.graphs) ops += g.ops.size();
  auto why = [](const StopRun& r) { return r.hit_budget ? " (budget)" : r.stopped_on_stall ? "" : " (cap)"; };
  std::cout << fmt::format("| {} | {} | {:.1f} | {}{} | {:.1f} | {:.1f} | {}{} | {:.1f} | {:+.3f}% | {:.2f}x |\n", label, ops,
                           a->makespan_us / 1e3, a->rounds, why(*a), a->seconds, b->makespan_us / 1e3, b->rounds,
                           why(*b), b->seconds, 100 * (b->makespan_us / a->makespan_us - 1),
                           a->seconds > 0 ? b->seconds / a->seconds : 0.0)
            << std::flush;
  return Status::Ok();
}

/// A side-by-side table over the quality rows (both clusters) and random
/// training-like DAGs of 1k, 10k and 100k ops: `header` (markdown), then
/// `row` per program; `only` keeps one model's rows ("random": the DAGs').
using SideBySideRow = Status (*)(const std::string& label, const Program& program, const CostModel& cost,
                                 const Options& options);
int SideBySide(const Options& options, const std::string& only, const char* header, SideBySideRow row) {
  std::cout << header;
  for (const auto& w : Workloads()) {
    if (!only.empty() && w.model != only) continue;
    Result<Program> program = LowerModelPlan(w.model, w.plan);
    if (!program.ok()) return std::fprintf(stderr, "%s\n", program.status().message().c_str()), 1;
    for (const std::string cluster : {"a800-4x8", "commodity-4x8"}) {
      AnalyticCostModel cost(LoadCluster(cluster).value());
      if (Status s = row(w.model + " " + w.plan + " on " + cluster, *program, cost, options); !s.ok())
        return std::fprintf(stderr, "%s\n", s.message().c_str()), 1;
    }
  }
  if (!only.empty() && only != "random") return 0;
  AnalyticCostModel cost(LoadCluster("a800-4x8").value());
  for (int n : {1000, 10000, 100000}) {
    SyntheticSpec spec;
    spec.num_ops = n;
    if (Status s = row(fmt::format("random DAG {} ops (8 ranks) on a800-4x8", n), SyntheticProgram(spec), cost, options);
        !s.ok())
      return std::fprintf(stderr, "%s\n", s.message().c_str()), 1;
  }
  return 0;
}

int StopRule(const Options& options, const std::string& only) {
  return SideBySide(options, only,
                    "| program | ops | fixed: ms | rounds | s | gain rule: ms | rounds | s | makespan change | time ratio |\n"
                    "|---|---|---|---|---|---|---|---|---|---|\n",
                    StopRuleRow);
}

/// The pass modes side by side on one program: one window after another
/// (the defaults: the next window solved ahead on a second thread) and
/// batches (--batch-windows 1) on one and on two threads, whose schedules
/// must be the same.
Status BatchRow(const std::string& label, const Program& program, const CostModel& cost, const Options& options) {
  std::fprintf(stderr, "batch windows: %s\n", label.c_str());
  Result<RunResult> seq = RunScheduler(program, "concerto", cost, options, nullptr, nullptr);
  if (!seq.ok()) return seq.status();
  std::vector<Result<RunResult>> batch;
  for (int threads : {1, 2}) {
    Options o = options;
    CONCERTO_RETURN_IF_ERROR(o.Set("batch-windows", 1));
    CONCERTO_RETURN_IF_ERROR(o.Set("threads", threads));
    batch.push_back(RunScheduler(program, "concerto", cost, o, nullptr, nullptr));
    if (!batch.back().ok()) return batch.back().status();
  }
  const ConcertoReport& a = *seq->concerto;
  const ConcertoReport& b1 = *batch[0]->concerto;
  const ConcertoReport& b2 = *batch[1]->concerto;
  if (WriteSchedule(batch[0]->scheduled.schedule) != WriteSchedule(batch[1]->scheduled.schedule))
    return Status::Error(label + ": batches on 1 and 2 threads gave different schedules");
  size_t ops = 0;
  for (const Graph& g : program.graphs) ops += g.ops.size();
  std::cout << fmt::format("| {} | {} | {:.1f} | {} | {:.1f} | {:.1f} | {} | {}/{}/{} | {:+.3f}% | {:.1f} | {:.1f} | {:.2f}x | "
                           "{:.2f}x |\n",
                           label, ops, a.final_makespan_us / 1e3, a.rounds_run, a.seconds, b1.final_makespan_us / 1e3,
                           b1.rounds_run, b1.windows_batch_as_solved, b1.windows_batch_verified,
                           b1.windows_batch_resolved, 100 * (b1.final_makespan_us / a.final_makespan_us - 1),
                           b1.seconds, b2.seconds, b2.seconds > 0 ? b1.seconds / b2.seconds : 0.0,
                           b2.seconds > 0 ? a.seconds / b2.seconds : 0.0)
            << std::flush;
  return Status::Ok();
}

int Batch(const Options& options, const std::string& only) {
  return SideBySide(options, only,
                    "| program | ops | one by one: ms | rounds | s | batches: ms | rounds | as solved/verified/solved "
                    "again | makespan change | s (1 thread) | s (2 threads) | speedup 1 -> 2 threads | vs one by one |\n"
                    "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
                    BatchRow);
}

/// The hard-window table (docs/solvers.md, "Hard windows"): generated job
/// shops and projects, each solved by Gecode's dive and rank searches and by
/// CBC with `limit_s` of wall clock and no work limit.
int HardWindows(double limit_s) {
  struct Instance {
    std::string name;
    WindowProblem problem;
  };
  std::vector<Instance> instances;
  for (uint32_t seed = 1; seed <= 5; ++seed)
    instances.push_back({fmt::format("job shop 10x10 #{}", seed), JobShopWindow(10, 10, seed)});
  for (auto [jobs, machines] : {std::pair{5, 10}, {10, 5}, {20, 5}, {15, 10}})
    instances.push_back({fmt::format("job shop {}x{} #1", jobs, machines), JobShopWindow(jobs, machines, 1)});
  for (int tasks : {50, 100, 150})
    for (uint32_t seed = 1; seed <= 2; ++seed)
      instances.push_back({fmt::format("project {} on 10 #{}", tasks, seed), RandomUnaryWindow(tasks, 10, 2, seed)});
  std::cout << "| instance | tasks | resources | backend | status | makespan | bound | gap | found (s) | proven (s) |\n"
               "|---|---|---|---|---|---|---|---|---|---|\n";
  for (const Instance& in : instances) {
    for (const std::string backend : {"gecode dive", "gecode rank", "cbc"}) {
      std::fprintf(stderr, "hard windows: %s, %s\n", in.name.c_str(), backend.c_str());
      Result<std::unique_ptr<WindowSolver>> solver = MakeWindowSolver(backend == "cbc" ? "cbc" : "gecode");
      if (!solver.ok()) continue;  // built without CBC
      SolverOptions o;
      o.time_limit_s = limit_s;
      o.fail_limit = 0;
      o.fails_before_answer = 0;
      o.search = backend == "gecode rank" ? SolverOptions::Search::kRank : SolverOptions::Search::kDive;
      Result<WindowSolution> r = (*solver)->Solve(in.problem, o);
      if (!r.ok()) {
        std::cout << fmt::format("| {} | {} | {} | {} | error: {} | | | | | |\n", in.name, in.problem.tasks.size(),
                                 in.problem.num_resources, backend, r.status().message());
        continue;
      }
      const bool answered = r->status == SolveStatus::kOptimal || r->status == SolveStatus::kFeasible;
      std::cout << fmt::format("| {} | {} | {} | {} | {} | {} | {} | {:.1f}% | {} | {} |\n", in.name,
                               in.problem.tasks.size(), in.problem.num_resources, backend, ToString(r->status),
                               answered ? std::to_string(r->objective) : "-", r->bound, 100 * r->gap,
                               answered ? fmt::format("{:.2f}", r->found_s) : "-",
                               r->status == SolveStatus::kOptimal ? fmt::format("{:.2f}", r->seconds) : "-")
                << std::flush;
    }
  }
  return 0;
}

/// The propagation bound (default options, searched up to fifo's makespan)
/// on the scaling sizes and the pipeline workload: time, probes, gain.
int BoundSpeed() {
  const std::vector<std::pair<Workload, std::string>> cases = {
      {{"gpt-1.3b", "dp=4,tp=8"}, "a800-4x8"},
      {{"gpt-1.3b", "dp=4,tp=8,microbatches=8"}, "a800-4x8"},
      {{"gpt-6.7b", "pp=4,tp=4,dp=2,microbatches=8"}, "a800-4x8"},
      {{"gpt-6.7b", "pp=4,tp=4,dp=2,microbatches=8"}, "commodity-4x8"},
      {{"evoformer", "dp=4,dap=8"}, "a800-4x8"},
      {{"gpt-1.3b", "dp=4,tp=8,microbatches=92"}, "a800-4x8"}};
  std::cout << "| workload | cluster | ops | fifo ms | plain LB ms | propagation LB ms | gain | probes (infeasible) | "
               "seconds |\n|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& [w, cluster] : cases) {
    std::fprintf(stderr, "bound speed: %s %s on %s\n", w.model.c_str(), w.plan.c_str(), cluster.c_str());
    Result<Program> program = LowerModelPlan(w.model, w.plan);
    if (!program.ok()) return std::fprintf(stderr, "%s\n", program.status().message().c_str()), 1;
    AnalyticCostModel cost(LoadCluster(cluster).value());
    Result<ScheduledProgram> fifo = RunBaseline("fifo", *program, cost);
    if (!fifo.ok()) return std::fprintf(stderr, "%s\n", fifo.status().message().c_str()), 1;
    Result<Timeline> timeline = Simulate(*fifo, cost);
    if (!timeline.ok()) return std::fprintf(stderr, "%s\n", timeline.status().message().c_str()), 1;
    PropagationBoundOptions o;
    o.upper_bound_us = timeline->makespan_us;
    Result<PropagationBound> b = ComputePropagationBound(fifo->program, cost, o);
    if (!b.ok()) return std::fprintf(stderr, "%s\n", b.status().message().c_str()), 1;
    std::cout << fmt::format("| {} {} | {} | {} | {:.1f} | {} | {} | {} | {} ({}) | {:.2f} |\n", w.model, w.plan, cluster,
                             b->ops, timeline->makespan_us / 1e3,
                             b->skipped ? "-" : fmt::format("{:.1f}", b->plain_us / 1e3),
                             b->skipped ? "skipped: " + b->skip_reason : fmt::format("{:.1f}", b->bound_us / 1e3),
                             b->skipped ? "-" : fmt::format("{:+.2f}%", 100 * (b->bound_us / b->plain_us - 1)),
                             b->probes, b->probes_infeasible, b->seconds)
              << std::flush;
  }
  return 0;
}

int Main(int argc, char** argv) {
  Options options;
  bool json = false;
  std::string only;
  std::string mode;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json")) {
      json = true;
    } else if (!std::strcmp(argv[i], "--time-budget") && i + 1 < argc) {
      Status s = options.Set("time-budget", std::atof(argv[++i]));
      if (!s.ok()) return std::fprintf(stderr, "%s\n", s.message().c_str()), 2;
    } else if (!std::strcmp(argv[i], "--set") && i + 1 < argc) {  // --set NAME=VALUE: any option of the table
      const std::string kv = argv[++i];
      const size_t eq = kv.find('=');
      Status s = eq == std::string::npos ? Status::Error("--set takes NAME=VALUE, got '" + kv + "'")
                                         : options.Set(kv.substr(0, eq), std::atof(kv.c_str() + eq + 1));
      if (!s.ok()) return std::fprintf(stderr, "%s\n", s.message().c_str()), 2;
    } else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) {
      only = argv[++i];
    } else if (!std::strcmp(argv[i], "--scaling") || !std::strcmp(argv[i], "--sweep") ||
               !std::strcmp(argv[i], "--bound-speed") || !std::strcmp(argv[i], "--stop-rule") ||
               !std::strcmp(argv[i], "--batch") || !std::strcmp(argv[i], "--hard-windows") ||
               !std::strcmp(argv[i], "--vision")) {
      mode = argv[i];
    } else {
      std::fprintf(stderr, "usage: concerto_quality [--time-budget S] [--set OPTION=VALUE]... [--json] [--only MODEL (with --scaling: PLAN)] [--scaling | --sweep | --bound-speed | --stop-rule | --batch | --hard-windows | --vision]\n");
      return 2;
    }
  }
  if (mode == "--scaling") return Scaling(options, only);
  if (mode == "--sweep") return Sweep(options);
  if (mode == "--bound-speed") return BoundSpeed();
  if (mode == "--stop-rule") return StopRule(options, only);
  if (mode == "--batch") return Batch(options, only);
  if (mode == "--hard-windows") return HardWindows(10);
  nlohmann::json all = nlohmann::json::array();
  std::cout << "| workload | cluster | best baseline | baseline ms | concerto ms | improvement | at its memory | T/LB "
               "| LB ms (term) | T/LB plain | overlap eff. | peak GiB | search s |\n"
               "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  double ratio_sum = 0, plain_ratio_sum = 0;
  int rows = 0;
  for (const auto& w : mode == "--vision" ? VisionWorkloads() : Workloads()) {
    if (!only.empty() && w.model != only) continue;
    Result<Program> program = LowerModelPlan(w.model, w.plan);
    if (!program.ok()) {
      std::cout << fmt::format("| {} {} | - | not available: {} |\n", w.model, w.plan, program.status().message())
              << std::flush;
      continue;
    }
    for (const std::string cluster : {"a800-4x8", "commodity-4x8"}) {
      std::fprintf(stderr, "quality: %s %s on %s\n", w.model.c_str(), w.plan.c_str(), cluster.c_str());
      AnalyticCostModel cost(LoadCluster(cluster).value());
      Result<std::vector<RunResult>> runs = Compare(*program, SchedulerNames(), cost, options);
      // Concerto held to the fastest fitting baseline's peak (compare's concerto-eqmem row).
      if (runs.ok()) AddEqualMemoryRun(*program, cost, options, &*runs);
      if (!runs.ok()) {
        std::cout << fmt::format("| {} {} | {} | error: {} |\n", w.model, w.plan, cluster, runs.status().message());
        continue;
      }
      LowerBound lb = ComputeLowerBound(*program, cost);
      const RunResult* best = nullptr;
      const RunResult* concerto = nullptr;
      double t_seq = 0;
      // The best baseline among those that fit the device's memory (all of
      // them when none fits).
      bool any_fits = false;
      auto is_concerto = [](const RunResult& r) {
        return r.summary.scheduler == "concerto" || r.summary.scheduler == kEqualMemoryRow;
      };
      for (const auto& r : *runs) any_fits = any_fits || (!is_concerto(r) && r.summary.fits_memory);
      for (const auto& r : *runs) {
        if (r.summary.scheduler == "concerto") concerto = &r;
        else if (!is_concerto(r) && (r.summary.fits_memory || !any_fits) &&
                 (!best || r.summary.makespan_us < best->summary.makespan_us))
          best = &r;
        if (r.summary.scheduler == "sequential") t_seq = r.summary.makespan_us;
      }
      const double t = concerto->summary.makespan_us;
      // The bound (max of the plain terms and the propagation bound) and the
      // plain one alone, both of concerto's own program.
      const LowerBound& cb = concerto->summary.bound;
      const double bound = cb.lower_bound_us;
      ratio_sum += t / bound, plain_ratio_sum += t / cb.PlainUs(), ++rows;
      // Overlap efficiency against the bound of concerto's own (possibly
      // fused) program, the same bound T/LB uses.
      const double eff = t_seq > bound ? (t_seq - t) / (t_seq - bound) : 1.0;
      // At the best baseline's memory, as compare reports it (concerto_vs_best_baseline).
      nlohmann::json j = CompareJson(*runs, lb, cluster);
      const nlohmann::json& vs = j["concerto_vs_best_baseline"];
      const std::string at_memory = vs.is_object() && vs["equal_memory_speedup"].is_number()
                                        ? fmt::format("{:.3f}x", vs["equal_memory_speedup"].get<double>())
                                        : std::string("-");
      std::cout << fmt::format("| {} {} | {} | {}{} | {:.1f} | {:.1f} | {:.3f}x | {} | {:.3f} | {:.1f} ({}) | {:.3f} | "
                               "{:.1f}% | {:.2f}{} | {:.1f} |\n",
                               w.model, w.plan, cluster, best->summary.scheduler, any_fits ? "" : " (OOM: none fits)",
                               best->summary.makespan_us / 1e3,
                               t / 1e3, best->summary.makespan_us / t, at_memory, t / bound, bound / 1e3, cb.BindingTerm(),
                               t / cb.PlainUs(), 100 * eff,
                               concerto->summary.peak_memory_bytes / double(1 << 30),
                               concerto->summary.fits_memory ? "" : " OOM",
                               concerto->concerto ? concerto->concerto->seconds : 0.0)
                << std::flush;
      j["model"] = w.model;
      j["plan"] = w.plan;
      all.push_back(j);
    }
  }
  if (rows > 0)
    std::cout << fmt::format("\nMean T/LB over {} rows: {:.3f} (with the plain bound alone: {:.3f})\n", rows,
                             ratio_sum / rows, plain_ratio_sum / rows);
  if (json) std::cout << DumpJson(all, 2) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Main(argc, argv); }
