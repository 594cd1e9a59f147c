// RankSession: iterations reuse one rank's buffers (allocated and
// initialised once), and every step computes exactly what the first did,
// because no op writes a graph input and every kernel overwrites its
// outputs. Checked bit for bit on models whose steps exercise every kernel
// family the frontends emit (GPT under tp, the mixture of experts under ep,
// a 1F1B pipeline).
#include <gtest/gtest.h>

#include <cctype>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "concerto/cost/cluster.h"
#include "concerto/cost/cost_model.h"
#include "concerto/lower/plan.h"
#include "concerto/lower/transformer.h"
#include "concerto/runtime/communicator.h"
#include "concerto/runtime/executor.h"
#include "concerto/schedule/scheduler.h"

namespace concerto {
namespace {

ScheduledProgram Scheduled(const std::string& model, const std::string& plan, const std::string& scheduler) {
  Result<ModelConfig> m = ModelPreset(model);
  EXPECT_TRUE(m.ok());
  Result<Program> p = LowerTransformer(*m, ParsePlan(plan).value());
  EXPECT_TRUE(p.ok()) << p.status().message();
  const AnalyticCostModel cost(LoadCluster("a800-4x8").value());
  Result<ScheduledProgram> sp = RunBaseline(scheduler, *p, cost);
  EXPECT_TRUE(sp.ok()) << sp.status().message();
  return *sp;
}

/// Names of tensors whose bits differ between `a` and `b` (both complete).
std::vector<std::string> Differences(const RankTensors& a, const RankTensors& b) {
  std::vector<std::string> out;
  EXPECT_EQ(a.values.size(), b.values.size());
  for (const auto& [name, values] : a.values) {
    const std::vector<float>* other = b.Find(name);
    if (!other || other->size() != values.size() ||
        std::memcmp(other->data(), values.data(), sizeof(float) * values.size()) != 0)
      out.push_back(name);
  }
  return out;
}

struct SessionCase {
  std::string model, plan, scheduler;
};

class RankSessionTest : public ::testing::TestWithParam<SessionCase> {};

TEST_P(RankSessionTest, EveryStepComputesTheFirstStepsValues) {
  const SessionCase& c = GetParam();
  const ScheduledProgram sp = Scheduled(c.model, c.plan, c.scheduler);
  const int n = sp.program.mesh.NumRanks();
  // A fresh single-step run: the reference bits.
  Result<ExecutionResult> fresh = RunInProcess(sp);
  ASSERT_TRUE(fresh.ok()) << fresh.status().message();
  // Three steps on one session per rank.
  FakeWorld world(n);
  std::vector<RankTensors> after_first(n), after_third(n);
  std::vector<std::string> errors(n);
  std::vector<size_t> records(n, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      Result<std::unique_ptr<RankSession>> s = RankSession::Create(sp, world.endpoint(r), RunOptions{});
      if (!s.ok()) {
        errors[r] = s.status().message();
        return;
      }
      for (int step = 0; step < 3; ++step) {
        Result<std::vector<OpRecord>> rec = (*s)->Step();
        if (!rec.ok()) {
          errors[r] = rec.status().message();
          return;
        }
        records[r] = rec->size();
        if (step == 0) after_first[r] = (*s)->Tensors();
      }
      after_third[r] = (*s)->TakeTensors();
    });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(records[r], sp.program.GraphOf(sp.program.roles[sp.program.RoleOfRank(r)]).ops.size());
    EXPECT_EQ(Differences(after_first[r], fresh->Rank(r)), std::vector<std::string>{}) << "rank " << r;
    EXPECT_EQ(Differences(after_third[r], after_first[r]), std::vector<std::string>{}) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, RankSessionTest,
                         ::testing::Values(SessionCase{"gpt-tiny", "tp=2,sp", "megatron"},
                                           SessionCase{"llama-tiny", "dp=2,zero=3", "zero"},
                                           SessionCase{"mixtral-tiny", "dp=2,ep=2", "fifo"},
                                           SessionCase{"gpt-tiny", "pp=2,microbatches=2", "fifo"}),
                         [](const ::testing::TestParamInfo<SessionCase>& info) {
                           std::string s = info.param.model + "_" + info.param.plan + "_" + info.param.scheduler;
                           for (char& ch : s)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

TEST(RunInProcessSteps, ReturnsEveryStepsRecordsAndTheFirstStepsTensors) {
  const ScheduledProgram sp = Scheduled("gpt-tiny", "dp=2", "fifo");
  std::vector<std::vector<std::vector<OpRecord>>> steps;
  Result<ExecutionResult> run = RunInProcessSteps(sp, RunOptions{}, 3, &steps);
  ASSERT_TRUE(run.ok()) << run.status().message();
  ASSERT_EQ(steps.size(), 3u);
  const size_t ops = sp.program.graphs[0].ops.size();
  for (const auto& per_rank : steps) {
    ASSERT_EQ(per_rank.size(), 2u);
    for (const auto& records : per_rank) EXPECT_EQ(records.size(), ops);
  }
  EXPECT_EQ(run->timeline.records.size(), 2 * ops);
  Result<ExecutionResult> fresh = RunInProcess(sp);
  ASSERT_TRUE(fresh.ok());
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(Differences(run->Rank(r), fresh->Rank(r)), std::vector<std::string>{}) << "rank " << r;
  Result<ExecutionResult> none = RunInProcessSteps(sp, RunOptions{}, 0);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("steps must be at least 1"), std::string::npos);
}

}  // namespace
}  // namespace concerto
