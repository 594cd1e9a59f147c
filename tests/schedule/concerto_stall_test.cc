// The stop rule: the search stops after --stall-rounds rounds in a row that
// stall: that leave the best makespan where it was or, after
// --gain-rule-after rounds, gain less than --min-round-gain of it. The rounds
// before the stop are exactly those of a search that runs every round (the
// search is deterministic), so running every round is never worse.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

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

/// Concerto on `p` with rounds = 6 and the stop rule's options.
StallRun RunStopRule(const Program& p, const char* cluster, int block_ops, int stall_rounds, double min_round_gain,
                     int gain_rule_after, int gain_rule_after_windows = 0) {
  AnalyticCostModel cost(LoadCluster(cluster).value());
  ConcertoOptions o;
  // The starts these tests were drawn for (DDP's bucket sweep starts gpt-tiny dp=2,tp=2 so close
  // to the end that no round after the first gains, and the stop rule has nothing to stop).
  o.ddp_bucket_sweep = false;
  o.block_ops = block_ops;
  o.rounds = 6;
  o.stall_rounds = stall_rounds;
  o.min_round_gain = min_round_gain;
  o.gain_rule_after = gain_rule_after;
  o.gain_rule_after_windows = gain_rule_after_windows;
  StallRun run;
  run.sp = RunConcerto(p, cost, o, &run.report);
  return run;
}

/// gpt-tiny under dp=2, tp=2 on a800-4x8 in blocks of 20.
StallRun RunWithStall(int stall_rounds, double min_round_gain = 0, int gain_rule_after = 0) {
  return RunStopRule(LowerGpt(GptPreset("gpt-tiny").value(), {2, 2}).value(), "a800-4x8", 20, stall_rounds,
                     min_round_gain, gain_rule_after);
}

/// Two layers of gpt-1.3b under dp=4, tp=8 on commodity-4x8 in blocks of
/// 125: its rounds gain 0.3%, then about 0.001%, then nothing (a later round
/// that gains a little, which the gain rule must tell from a real gain).
StallRun RunGainRule(int stall_rounds, double min_round_gain = 0, int gain_rule_after = 0,
                     int gain_rule_after_windows = 0) {
  GptConfig config = GptPreset("gpt-1.3b").value();
  config.layers = 2;
  return RunStopRule(LowerGpt(config, {4, 8}).value(), "commodity-4x8", 125, stall_rounds, min_round_gain,
                     gain_rule_after, gain_rule_after_windows);
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

TEST(ConcertoStall, TheGainRuleStopsAtTheFirstRoundThatGainsTooLittle) {
  // From the every-round trace a[k] (best makespan after round k+1; the
  // starting point before round 1) take the rounds' relative gains; with the gain
  // rule from round 2 and a threshold just above the smallest positive gain
  // of rounds 2..6, the search must stop right after the first round from 2
  // on whose gain is below the threshold, having run the same rounds.
  const StallRun all = RunGainRule(0);
  ASSERT_TRUE(all.sp.ok()) << all.sp.status().message();
  const auto& a = all.report.makespan_after_round_us;
  ASSERT_GE(a.size(), 3u);
  std::vector<double> gain;
  double before = all.report.start_makespan_us;  // the best before round 1
  for (double m : a) gain.push_back((before - m) / before), before = m;
  double smallest = 1;
  for (size_t k = 1; k < gain.size(); ++k)
    if (gain[k] > 0) smallest = std::min(smallest, gain[k]);
  ASSERT_LT(smallest, 1) << "no round after the first gains: the test would see no gain-rule stop";
  const double threshold = smallest * 1.5;
  size_t expected = gain[0] <= 0 ? 1 : a.size();  // rounds run
  for (size_t k = 1; k < gain.size() && expected == a.size(); ++k)
    if (gain[k] < threshold) {
      expected = k + 1;
      break;
    }
  const StallRun rule = RunGainRule(1, threshold, 1);
  ASSERT_TRUE(rule.sp.ok()) << rule.sp.status().message();
  EXPECT_EQ(static_cast<size_t>(rule.report.rounds_run), expected);
  EXPECT_EQ(rule.report.stopped_on_stall, expected < a.size());
  for (size_t k = 0; k < rule.report.makespan_after_round_us.size(); ++k)
    EXPECT_EQ(rule.report.makespan_after_round_us[k], a[k]) << "round " << k + 1;
  // Without the threshold (a stall only without any gain) it runs at least as long.
  const StallRun plain = RunGainRule(1);
  ASSERT_TRUE(plain.sp.ok());
  EXPECT_GT(plain.report.rounds_run, rule.report.rounds_run);  // this program: the rule stops a round earlier
  EXPECT_LE(plain.report.final_makespan_us, rule.report.final_makespan_us);
}

TEST(ConcertoStall, TheGainRuleAlsoAppliesAfterEnoughWindows) {
  // The same trace; the rule by rounds is off (gain_rule_after 6 of 6
  // rounds). With the window count reached within round 2's even pass,
  // round 2 ends as one unit under the threshold, exactly as
  // gain_rule_after = 1 does.
  const StallRun all = RunGainRule(0);
  ASSERT_TRUE(all.sp.ok()) << all.sp.status().message();
  const auto& a = all.report.makespan_after_round_us;
  ASSERT_GE(a.size(), 3u);
  int before_even2 = 0, even2 = 0;  // windows before round 2's even pass, and in it
  for (const WindowReport& w : all.report.windows) {
    before_even2 += w.round == 0 || (w.round == 1 && w.pass == 0);
    even2 += w.round == 1 && w.pass == 1;
  }
  ASSERT_GT(even2, 0);
  const double gain2 = (a[0] - a[1]) / a[0];
  ASSERT_GT(gain2, 0) << "round 2 gains nothing: every rule stops there";
  const double threshold = gain2 * 1.5;  // round 2 gains too little for it
  const StallRun by_rounds = RunGainRule(1, threshold, 1);
  const StallRun by_windows = RunGainRule(1, threshold, 6, before_even2 + 1);
  ASSERT_TRUE(by_rounds.sp.ok() && by_windows.sp.ok());
  EXPECT_EQ(by_windows.report.rounds_run, by_rounds.report.rounds_run);
  EXPECT_EQ(by_windows.report.final_makespan_us, by_rounds.report.final_makespan_us);
  EXPECT_EQ(by_windows.report.stopped_on_stall, by_rounds.report.stopped_on_stall);
  EXPECT_EQ(by_windows.report.windows.size(), by_rounds.report.windows.size());
}

TEST(ConcertoStall, PastTheWindowCountEveryPassIsAUnitOfTheRule) {
  // Once the count is reached, the rule is checked after each pass: with
  // the count reached by round 1's odd pass and a threshold no pass can
  // meet (100%), the search stops after that odd pass, never solving an
  // even window; counted in rounds it would have run the even pass too.
  const StallRun all = RunGainRule(0);
  ASSERT_TRUE(all.sp.ok()) << all.sp.status().message();
  int odd_windows = 0;
  for (const WindowReport& w : all.report.windows) odd_windows += w.round == 0 && w.pass == 0;
  ASSERT_GT(odd_windows, 0);
  const StallRun by_pass = RunGainRule(1, 1.0, 6, odd_windows);
  ASSERT_TRUE(by_pass.sp.ok()) << by_pass.sp.status().message();
  EXPECT_TRUE(by_pass.report.stopped_on_stall);
  EXPECT_EQ(by_pass.report.rounds_run, 1);
  EXPECT_EQ(static_cast<int>(by_pass.report.windows.size()), odd_windows);
  for (const WindowReport& w : by_pass.report.windows) EXPECT_EQ(w.pass, 0);
  // One window short of the count: round 1 is one unit (both passes).
  const StallRun by_round = RunGainRule(1, 1.0, 6, odd_windows + 1);
  ASSERT_TRUE(by_round.sp.ok());
  EXPECT_EQ(by_round.report.rounds_run, 1);
  EXPECT_GT(by_round.report.windows.size(), by_pass.report.windows.size());
  EXPECT_LE(by_round.report.final_makespan_us, by_pass.report.final_makespan_us);
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
