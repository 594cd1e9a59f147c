// Batches of window solves (schedule/window_batch.h): the wire format keeps
// every field, and a batch gets the same answers as solving each problem
// alone, whether one thread, three threads or remote workers (in process:
// tests/common/fake_window_workers.h) solve it.
#include <gtest/gtest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "concerto/schedule/window_batch.h"
#include "fake_window_workers.h"

namespace concerto {
namespace {

/// A random 2-resource window of `n` tasks with a feasible hint (the tasks
/// back to back in index order) and sparse precedences forward in index.
WindowProblem RandomWindow(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  WindowProblem p;
  p.num_resources = 2;
  int64_t t = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t d = 1 + static_cast<int64_t>(rng() % 9);
    p.tasks.push_back({d, static_cast<int>(rng() % 2), 0, 0, rng() % 3 == 0});
    p.hint.push_back(t);
    t += d;
  }
  for (WindowTask& task : p.tasks) task.deadline = t;
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j)
      if (rng() % n < 2) p.precedences.push_back({i, j});
  return p;
}

SolverOptions Work() {
  SolverOptions o;
  o.fail_limit = 40;
  o.fails_before_answer = 0;
  o.time_limit_s = 3600;  // the work limit stops every solve
  return o;
}

std::string Fingerprint(const Result<WindowSolution>& a) {
  if (!a.ok()) return "error: " + a.status().message();
  std::string s = std::string(ToString(a->status)) + " " + std::to_string(a->objective) + " " +
                  std::to_string(a->bound) + " " + std::to_string(a->nodes) + ":";
  for (int64_t v : a->start) s += " " + std::to_string(v);
  return s;
}

TEST(WindowBatch, TheWireFormatKeepsEveryField) {
  WindowProblem p = RandomWindow(12, 7);
  p.buffers.push_back({5, 2, 0, {3, 4}, 17});
  p.buffers.push_back({2, -1, 4, {}, 9});
  p.memory_capacity = 6;
  WindowProblem q = RandomWindow(3, 8);
  SolverOptions o = Work();
  o.edge_finding = false;
  o.seed = 1ull << 40;
  Result<DecodedWindowBatch> d = DecodeWindowBatch(EncodeWindowBatch({&p, &q}, o));
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_FALSE(d->stop);
  ASSERT_EQ(d->problems.size(), 2u);
  EXPECT_TRUE(d->problems[0] == p);
  EXPECT_TRUE(d->problems[1] == q);
  EXPECT_EQ(d->options.fail_limit, 40);
  EXPECT_EQ(d->options.fails_before_answer, 0);
  EXPECT_FALSE(d->options.edge_finding);
  EXPECT_EQ(d->options.seed, 1ull << 40);
  EXPECT_EQ(d->options.time_limit_s, 3600);
  EXPECT_TRUE(DecodeWindowBatch(EncodeWindowStop())->stop);

  WindowSolution s;
  s.status = SolveStatus::kFeasible;
  s.start = {0, 5, 9};
  s.objective = 12;
  s.bound = 10;
  s.gap = 2.0 / 12;
  s.nodes = 77;
  s.hit_time_limit = true;
  Result<std::vector<Result<WindowSolution>>> a =
      DecodeWindowAnswers(EncodeWindowAnswers({s, Status::Error("bad hint")}));
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_EQ(a->size(), 2u);
  EXPECT_EQ(Fingerprint((*a)[0]), Fingerprint(s));
  EXPECT_EQ((*a)[0]->gap, s.gap);
  EXPECT_TRUE((*a)[0]->hit_time_limit);
  ASSERT_FALSE((*a)[1].ok());
  EXPECT_EQ((*a)[1].status().message(), "bad hint");
}

TEST(WindowBatch, BadMessagesAreErrorsNamingWhatIsWrong) {
  Result<DecodedWindowBatch> d = DecodeWindowBatch("not cbor at all");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().message(), "window batch: not a CBOR map");
  // A map without the problems.
  const std::vector<uint8_t> bytes = nlohmann::json::to_cbor(nlohmann::json{{"options", 1}});
  d = DecodeWindowBatch(std::string(bytes.begin(), bytes.end()));
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("problems"), std::string::npos) << d.status().message();
  Result<std::vector<Result<WindowSolution>>> a = DecodeWindowAnswers(EncodeWindowStop());
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("answers"), std::string::npos) << a.status().message();
}

TEST(WindowBatch, ThreadsAndWorkersAnswerAsSolvingAlone) {
  std::vector<WindowProblem> problems;
  for (int k = 0; k < 9; ++k) problems.push_back(RandomWindow(20 + 5 * k, 100 + k));
  std::vector<const WindowProblem*> ptrs;
  for (const WindowProblem& p : problems) ptrs.push_back(&p);
  std::unique_ptr<WindowSolver> alone = MakeWindowSolver("gecode").value();
  std::vector<std::string> expected;
  int improved = 0;
  for (const WindowProblem& p : problems) {
    Result<WindowSolution> a = alone->Solve(p, Work());
    ASSERT_TRUE(a.ok()) << a.status().message();
    improved += a->objective < p.hint.back() + p.tasks.back().duration;
    expected.push_back(Fingerprint(a));
  }
  EXPECT_GT(improved, 0) << "no window improved on its hint; the comparison would test little";
  for (int threads : {1, 3}) {
    std::unique_ptr<WindowBatchSolver> batch = NewThreadBatchSolver("gecode", threads).value();
    EXPECT_EQ(batch->parallelism(), threads);
    std::vector<Result<WindowSolution>> got = batch->SolveAll(ptrs, Work());
    ASSERT_EQ(got.size(), problems.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(Fingerprint(got[i]), expected[i]) << threads << " threads, " << i;
  }
  {
    testing::FakeWindowWorkers workers(2);
    DistributedBatchSolver batch(workers, MakeWindowSolver("gecode").value());
    EXPECT_EQ(batch.name(), "1 thread + 2 workers");
    std::vector<Result<WindowSolution>> got = batch.SolveAll(ptrs, Work());
    ASSERT_EQ(got.size(), problems.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(Fingerprint(got[i]), expected[i]) << "workers, " << i;
    // Problems 1, 4, 7 went to worker 1 and 2, 5, 8 to worker 2, one batch each.
    EXPECT_EQ(batch.problems_remote(), 6);
    EXPECT_EQ(batch.batches_sent(), 2);
    EXPECT_EQ(workers.served(1), 1);
    EXPECT_EQ(workers.served(2), 1);
    // A second batch smaller than the workers: nothing is sent to idle ones.
    got = batch.SolveAll({ptrs[0], ptrs[1]}, Work());
    EXPECT_EQ(Fingerprint(got[1]), expected[1]);
    EXPECT_EQ(batch.batches_sent(), 3);
    ASSERT_TRUE(batch.Shutdown().ok());
    // After the shutdown nothing reaches a worker: their shares are errors.
    got = batch.SolveAll(ptrs, Work());
    EXPECT_EQ(Fingerprint(got[0]), expected[0]);
    ASSERT_FALSE(got[1].ok());
    EXPECT_EQ(got[1].status().message(), "window workers were shut down");
  }
}

TEST(WindowBatch, CbcGetsOneThread) {
  Result<std::unique_ptr<WindowBatchSolver>> cbc = NewThreadBatchSolver("cbc", 4);
  if (!cbc.ok()) GTEST_SKIP() << "built without CBC";
  EXPECT_EQ((*cbc)->parallelism(), 1);
  EXPECT_EQ((*cbc)->name(), "1 thread");
  EXPECT_FALSE(NewThreadBatchSolver("gecode", 0).ok());
  EXPECT_FALSE(NewThreadBatchSolver("no-such-solver", 2).ok());
}

}  // namespace
}  // namespace concerto
