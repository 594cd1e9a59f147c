// Benchmarks (make bench): simulator speed on large graphs, lowering speed,
// and every scheduler on the demo workload. Figures go to docs/results.md.
#include <benchmark/benchmark.h>

#include "concerto/cost/cluster.h"
#include "concerto/cost/cost_model.h"
#include "concerto/lower/frontend.h"
#include "concerto/lower/gpt.h"
#include "concerto/lower/synthetic.h"
#include "concerto/schedule/concerto_scheduler.h"
#include "concerto/schedule/schedule.h"
#include "concerto/schedule/scheduler.h"
#include "concerto/sim/simulator.h"

namespace concerto {
namespace {

AnalyticCostModel A800() { return AnalyticCostModel(LoadCluster("a800-4x8").value()); }

/// Simulates a synthetic graph of state.range(0) ops on 8 ranks, every rank
/// simulated (no representative shortcut).
void BM_SimulateSynthetic8Ranks(benchmark::State& state) {
  SyntheticSpec spec;
  spec.num_ops = static_cast<int>(state.range(0));
  spec.ranks = 8;
  ScheduledProgram sp{SyntheticProgram(spec), {}};
  sp.schedule = ProgramOrderSchedule(sp.program, "fifo");
  AnalyticCostModel cost = A800();
  SimOptions opts;
  opts.all_ranks = true;
  for (auto _ : state) {
    Result<Timeline> t = Simulate(sp, cost, opts);
    if (!t.ok()) state.SkipWithError(t.status().message().c_str());
    benchmark::DoNotOptimize(t);
  }
  state.counters["ops"] = static_cast<double>(spec.num_ops);
  state.counters["op_events_per_s"] =
      benchmark::Counter(static_cast<double>(spec.num_ops) * spec.ranks, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_SimulateSynthetic8Ranks)->Arg(1000)->Arg(10000)->Arg(100000)->Unit(benchmark::kMillisecond);

void BM_LowerGpt13bDp4Tp8(benchmark::State& state) {
  GptConfig config = GptPreset("gpt-1.3b").value();
  for (auto _ : state) {
    Result<Program> p = LowerGpt(config, {4, 8});
    benchmark::DoNotOptimize(p);
  }
}
BENCHMARK(BM_LowerGpt13bDp4Tp8)->Unit(benchmark::kMillisecond);

void BM_BaselineOnGpt(benchmark::State& state, const std::string& name) {
  Program p = LowerGpt(GptPreset("gpt-1.3b").value(), {4, 8}).value();
  AnalyticCostModel cost = A800();
  double makespan = 0;
  for (auto _ : state) {
    Result<ScheduledProgram> sp = RunBaseline(name, p, cost);
    if (!sp.ok()) {
      state.SkipWithError(sp.status().message().c_str());
      break;
    }
    Result<Timeline> t = Simulate(*sp, cost);
    if (!t.ok()) {
      state.SkipWithError(t.status().message().c_str());
      break;
    }
    makespan = t->makespan_us;
  }
  state.counters["makespan_us"] = makespan;
}
BENCHMARK_CAPTURE(BM_BaselineOnGpt, sequential, std::string("sequential"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_BaselineOnGpt, fifo, std::string("fifo"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_BaselineOnGpt, ddp, std::string("ddp"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_BaselineOnGpt, megatron, std::string("megatron"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_BaselineOnGpt, zero, std::string("zero"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_BaselineOnGpt, xla_lhs, std::string("xla-lhs"))->Unit(benchmark::kMillisecond);

/// Times RunConcerto on `p` and sets the makespan counters every Concerto
/// benchmark reports; returns the last run's report.
ConcertoReport TimeConcerto(benchmark::State& state, const Program& p, const CostModel& cost,
                            const ConcertoOptions& options) {
  ConcertoReport report;
  for (auto _ : state) {
    Result<ScheduledProgram> sp = RunConcerto(p, cost, options, &report);
    if (!sp.ok()) state.SkipWithError(sp.status().message().c_str());
  }
  state.counters["incumbent_us"] = report.incumbent_makespan_us;
  state.counters["concerto_us"] = report.final_makespan_us;
  state.counters["lower_bound_us"] = report.lower_bound_us;
  return report;
}

/// The Concerto scheduler with default options on a synthetic graph of
/// state.range(0) ops (8 ranks): search time and quality against the best
/// baseline and the lower bound.
void BM_ConcertoSynthetic(benchmark::State& state) {
  SyntheticSpec spec;
  spec.num_ops = static_cast<int>(state.range(0));
  spec.ranks = 8;
  Program p = SyntheticProgram(spec);
  AnalyticCostModel cost = A800();
  ConcertoOptions options;
  options.time_budget_s = 120;
  const ConcertoReport report = TimeConcerto(state, p, cost, options);
  state.counters["T_over_LB"] = report.final_makespan_us / report.lower_bound_us;
  state.counters["windows"] = static_cast<double>(report.windows.size());
  state.counters["rounds"] = report.rounds_run;
}
BENCHMARK(BM_ConcertoSynthetic)->Arg(1000)->Arg(10000)->Iterations(1)->Unit(benchmark::kSecond);

/// Concerto with default options on gpt-1.3b dp4 tp8 (a800-4x8).
void BM_ConcertoGpt13b(benchmark::State& state) {
  Program p = LowerGpt(GptPreset("gpt-1.3b").value(), {4, 8}).value();
  AnalyticCostModel cost = A800();
  const ConcertoReport report = TimeConcerto(state, p, cost, ConcertoOptions{});
  state.counters["improvement"] = report.incumbent_makespan_us / report.final_makespan_us;
}
BENCHMARK(BM_ConcertoGpt13b)->Iterations(1)->Unit(benchmark::kSecond);

/// Scheduling time vs graph size on a real workload, default options:
/// gpt-1.3b dp=4,tp=8 with state.range(0) micro-batches (1: 1,279 ops,
/// 10: 11,026, 92: 99,832; the rows of `concerto_quality --scaling`,
/// docs/results.md, "Scheduling speed").
void BM_ConcertoScalingGpt13b(benchmark::State& state) {
  const int microbatches = static_cast<int>(state.range(0));
  Result<Program> p = LowerModelPlan("gpt-1.3b", "dp=4,tp=8,microbatches=" + std::to_string(microbatches));
  if (!p.ok()) return state.SkipWithError(p.status().message().c_str());
  AnalyticCostModel cost = A800();
  ConcertoOptions options;
  ConcertoReport report;
  for (auto _ : state) {
    Result<ScheduledProgram> sp = RunConcerto(*p, cost, options, &report);
    if (!sp.ok()) state.SkipWithError(sp.status().message().c_str());
  }
  state.counters["ops"] = static_cast<double>(p->graphs[0].ops.size());
  state.counters["search_s"] = report.seconds;
  state.counters["windows"] = static_cast<double>(report.windows.size());
  state.counters["T_over_LB"] = report.final_makespan_us / report.lower_bound_us;
}
BENCHMARK(BM_ConcertoScalingGpt13b)->Arg(1)->Arg(10)->Arg(92)->Iterations(1)->Unit(benchmark::kSecond);

}  // namespace
}  // namespace concerto

BENCHMARK_MAIN();
