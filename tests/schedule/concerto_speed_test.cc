// The Concerto scheduler's speed-ups change nothing but time: reusing the
// answer of an identical earlier window solve (reuse_windows) and solving
// the next window of a pass ahead on a second thread (threads = 2)
// (threads = 2, which also runs the baselines two at a time) give the same
// schedule, program and window-by-window report as solving every window, one
// at a time. With batch_windows, the batches give the same schedule on one
// thread, two threads and remote workers (in process).
#include <gtest/gtest.h>

#include "concerto/cost/cluster.h"
#include "concerto/cost/cost_model.h"
#include "concerto/ir/json_io.h"
#include "concerto/lower/gpt.h"
#include "concerto/schedule/concerto_scheduler.h"
#include "concerto/sim/memory.h"
#include "fake_window_workers.h"

namespace concerto {
namespace {

/// Every figure of two reports but the seconds and the speed-up counters.
void ExpectSameReport(const ConcertoReport& a, const ConcertoReport& b) {
  EXPECT_EQ(a.incumbent, b.incumbent);
  EXPECT_EQ(a.final_makespan_us, b.final_makespan_us);
  EXPECT_EQ(a.rounds_run, b.rounds_run);
  EXPECT_EQ(a.windows_optimal, b.windows_optimal);
  EXPECT_EQ(a.windows_feasible, b.windows_feasible);
  EXPECT_EQ(a.windows_unsolved, b.windows_unsolved);
  EXPECT_EQ(a.fused_collectives, b.fused_collectives);
  EXPECT_EQ(a.peak_memory_bytes, b.peak_memory_bytes);
  EXPECT_EQ(a.passes_over_memory, b.passes_over_memory);
  EXPECT_EQ(a.makespan_after_round_us, b.makespan_after_round_us);
  ASSERT_EQ(a.windows.size(), b.windows.size());
  for (size_t k = 0; k < a.windows.size(); ++k) {
    const WindowReport& x = a.windows[k];
    const WindowReport& y = b.windows[k];
    EXPECT_EQ(std::tie(x.round, x.pass, x.first_block, x.tasks, x.status, x.memory),
              std::tie(y.round, y.pass, y.first_block, y.tasks, y.status, y.memory))
        << "window " << k;
    EXPECT_EQ(std::tie(x.objective_us, x.bound_us, x.gap), std::tie(y.objective_us, y.bound_us, y.gap))
        << "window " << k;
  }
}

/// gpt-tiny under dp=2, tp=2 in blocks of 20 ops, 3 rounds, most windows
/// stopped by the fail limit: every window is solved, one at a time, or
/// with both speed-ups on.
struct Runs {
  Result<ScheduledProgram> plain = Status::Error("not run");
  Result<ScheduledProgram> fast = Status::Error("not run");
  ConcertoReport plain_report, fast_report;
};

Runs RunBoth(int64_t memory_budget_bytes) {
  AnalyticCostModel cost(LoadCluster("a800-4x8").value());
  Program p = LowerGpt(GptPreset("gpt-tiny").value(), {2, 2}).value();
  ConcertoOptions o;
  o.block_ops = 20;
  o.rounds = 3;
  o.stall_rounds = 0;  // every round, so that later rounds meet earlier windows again
  o.window_fail_limit = 100;
  o.memory_budget_bytes = memory_budget_bytes;
  Runs runs;
  ConcertoOptions plain = o;
  plain.reuse_windows = false;
  plain.threads = 1;
  runs.plain = RunConcerto(p, cost, plain, &runs.plain_report);
  ConcertoOptions fast = o;
  fast.reuse_windows = true;
  fast.threads = 2;
  runs.fast = RunConcerto(p, cost, fast, &runs.fast_report);
  return runs;
}

TEST(ConcertoSpeed, ReuseAndSpeculationGiveTheSameSchedule) {
  Runs runs = RunBoth(0);
  ASSERT_TRUE(runs.plain.ok()) << runs.plain.status().message();
  ASSERT_TRUE(runs.fast.ok()) << runs.fast.status().message();
  ASSERT_EQ(runs.plain_report.windows_hit_time_limit, 0);
  ASSERT_EQ(runs.fast_report.windows_hit_time_limit, 0);
  EXPECT_GT(runs.plain_report.windows_feasible, 0) << "no window reached the fail limit; the test would not test much";
  // The speed-ups must have been used, or the comparison proves nothing.
  EXPECT_EQ(runs.plain_report.windows_reused, 0);
  EXPECT_EQ(runs.plain_report.windows_speculated, 0);
  EXPECT_GT(runs.fast_report.windows_reused, 0);
  EXPECT_GT(runs.fast_report.windows_speculated, 0);
  EXPECT_EQ(WriteSchedule(runs.plain->schedule), WriteSchedule(runs.fast->schedule));
  EXPECT_EQ(WriteProgram(runs.plain->program), WriteProgram(runs.fast->program));
  ExpectSameReport(runs.plain_report, runs.fast_report);
}

TEST(ConcertoSpeed, SameScheduleWithMemoryInTheWindows) {
  // A budget at the incumbent's peak: the windows around the peak carry
  // memory (a window that cannot reach the budget in any order carries none).
  Runs probe = RunBoth(0);
  ASSERT_TRUE(probe.plain.ok());
  const int64_t budget = probe.plain_report.incumbent_peak_memory_bytes;
  Runs runs = RunBoth(budget);
  ASSERT_TRUE(runs.plain.ok()) << runs.plain.status().message();
  ASSERT_TRUE(runs.fast.ok()) << runs.fast.status().message();
  int with_memory = 0;
  for (const WindowReport& w : runs.plain_report.windows) with_memory += w.memory;
  EXPECT_GT(with_memory, 0);
  EXPECT_GT(runs.fast_report.windows_reused + runs.fast_report.windows_speculated, 0);
  EXPECT_EQ(WriteSchedule(runs.plain->schedule), WriteSchedule(runs.fast->schedule));
  ExpectSameReport(runs.plain_report, runs.fast_report);
}

TEST(ConcertoSpeed, BatchesGiveTheSameScheduleOnThreadsAndWorkers) {
  AnalyticCostModel cost(LoadCluster("commodity-4x8").value());
  Program p = LowerGpt(GptPreset("gpt-tiny").value(), {2, 2}).value();
  ConcertoOptions o;
  o.block_ops = 20;
  o.rounds = 3;
  o.stall_rounds = 0;
  o.window_fail_limit = 100;
  o.batch_windows = true;
  ConcertoOptions one = o;
  one.threads = 1;
  one.reuse_windows = false;
  ConcertoReport one_report;
  Result<ScheduledProgram> serial = RunConcerto(p, cost, one, &one_report);
  ASSERT_TRUE(serial.ok()) << serial.status().message();
  ASSERT_EQ(one_report.windows_hit_time_limit, 0);
  EXPECT_EQ(one_report.batch_solver, "1 thread");
  EXPECT_GT(one_report.windows_batch_as_solved, 0);
  EXPECT_EQ(one_report.windows_speculated, 0);
  EXPECT_LT(serial->schedule.scheduler == "concerto" ? one_report.final_makespan_us : 0,
            one_report.incumbent_makespan_us)
      << "the search gained nothing; the comparison would test little";

  ConcertoOptions two = o;
  two.threads = 2;
  ConcertoReport two_report;
  Result<ScheduledProgram> threaded = RunConcerto(p, cost, two, &two_report);
  ASSERT_TRUE(threaded.ok()) << threaded.status().message();
  EXPECT_EQ(two_report.batch_solver, "2 threads");
  EXPECT_GT(two_report.windows_reused, 0);
  EXPECT_EQ(WriteSchedule(serial->schedule), WriteSchedule(threaded->schedule));
  EXPECT_EQ(WriteProgram(serial->program), WriteProgram(threaded->program));
  ExpectSameReport(one_report, two_report);

  testing::FakeWindowWorkers workers(2);
  DistributedBatchSolver remote(workers, MakeWindowSolver("gecode").value());
  ConcertoOptions distributed = o;
  distributed.batch_solver = &remote;
  ConcertoReport remote_report;
  Result<ScheduledProgram> far = RunConcerto(p, cost, distributed, &remote_report);
  ASSERT_TRUE(remote.Shutdown().ok());
  ASSERT_TRUE(far.ok()) << far.status().message();
  EXPECT_EQ(remote_report.batch_solver, "1 thread + 2 workers");
  EXPECT_GT(remote.problems_remote(), 0);
  EXPECT_EQ(WriteSchedule(serial->schedule), WriteSchedule(far->schedule));
  ExpectSameReport(one_report, remote_report);
}

TEST(ConcertoSpeed, WindowProblemsCompareFieldByField) {
  WindowProblem a;
  a.num_resources = 1;
  a.tasks = {{3, 0, 0, 10, false}, {2, 0, 0, 10, true}};
  a.precedences = {{0, 1}};
  a.hint = {0, 3};
  WindowProblem b = a;
  EXPECT_TRUE(a == b);
  b.tasks[1].deadline = 9;  // one field of one task
  EXPECT_FALSE(a == b);
  b = a;
  b.hint[1] = 4;
  EXPECT_FALSE(a == b);
  b = a;
  b.buffers.push_back({1, 0, 0, {1}, 0});
  EXPECT_FALSE(a == b);
}

}  // namespace
}  // namespace concerto
