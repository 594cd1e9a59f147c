// Benchmarks (make bench): simulator speed on large graphs, lowering speed,
// and every scheduler on the demo workload. Figures go to docs/results.md.
#include <benchmark/benchmark.h>

#include "concerto/cost/cluster.h"
#include "concerto/cost/cost_model.h"
#include "concerto/lower/gpt.h"
#include "concerto/lower/synthetic.h"
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

}  // namespace
}  // namespace concerto

BENCHMARK_MAIN();
