// --stall-rounds: the search stops after that many rounds in a row without a
// gain. The rounds before the stop are exactly those of a search that runs
// every round (the search is deterministic), so running every round is never
// worse, and a stop is only reported after a round that left the best
// makespan where it was.
#include <gtest/gtest.h>

#include "concerto/cost/cluster.h"
#include "concerto/cost/cost_model.h"
#include "concerto/lower/gpt.h"
#include "concerto/schedule/concerto_scheduler.h"

namespace concerto {
namespace {

struct StallRun {
  Result<ScheduledProgram> sp = Status::Error("not run");
  ConcertoReport report;
};

StallRun RunWithStall(int stall_rounds) {
  AnalyticCostModel cost(LoadCluster("a800-4x8").value());
  Program p = LowerGpt(GptPreset("gpt-tiny").value(), {2, 2}).value();
  ConcertoOptions o;
  o.block_ops = 20;
  o.rounds = 6;
  o.stall_rounds = stall_rounds;
  StallRun run;
  run.sp = RunConcerto(p, cost, o, &run.report);
  return run;
}

TEST(ConcertoStall, StopsOnlyAfterARoundWithoutAGainAndEveryRoundIsNeverWorse) {
  const StallRun all = RunWithStall(0);
  const StallRun stall = RunWithStall(1);
  ASSERT_TRUE(all.sp.ok()) << all.sp.status().message();
  ASSERT_TRUE(stall.sp.ok()) << stall.sp.status().message();
  EXPECT_FALSE(all.report.stopped_on_stall);
  EXPECT_TRUE(all.report.rounds_run == 6 || all.report.reached_lower_bound);
  // The rounds both ran are the same rounds.
  const auto& a = all.report.makespan_after_round_us;
  const auto& s = stall.report.makespan_after_round_us;
  ASSERT_LE(s.size(), a.size());
  for (size_t k = 0; k < s.size(); ++k) EXPECT_EQ(s[k], a[k]) << "round " << k + 1;
  if (stall.report.stopped_on_stall) {
    // The last round run left the best where the round before it had it
    // (after round 1: where the search started, not recorded per round).
    ASSERT_FALSE(s.empty());
    if (s.size() >= 2) {
      EXPECT_EQ(s.back(), s[s.size() - 2]);
    }
    EXPECT_LT(stall.report.rounds_run, 6);
  } else {
    EXPECT_EQ(s.size(), a.size());
  }
  EXPECT_LE(all.report.final_makespan_us, stall.report.final_makespan_us);
  // This workload does stall (gpt-tiny dp=2,tp=2 in blocks of 20: a round
  // gains nothing before the 6th), so the test sees a real stop.
  EXPECT_TRUE(stall.report.stopped_on_stall);
  EXPECT_GT(all.report.rounds_run, stall.report.rounds_run);
}

TEST(ConcertoStall, NegativeStallRoundsIsRejected) {
  AnalyticCostModel cost(LoadCluster("a800-4x8").value());
  Program p = LowerGpt(GptPreset("gpt-tiny").value(), {2, 2}).value();
  ConcertoOptions o;
  o.stall_rounds = -1;
  Result<ScheduledProgram> sp = RunConcerto(p, cost, o, nullptr);
  ASSERT_FALSE(sp.ok());
  EXPECT_NE(sp.status().message().find("--stall-rounds"), std::string::npos) << sp.status().message();
}

}  // namespace
}  // namespace concerto
