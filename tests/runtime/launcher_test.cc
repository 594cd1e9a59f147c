// The launcher of `concerto run`: the mpirun command line (through a fake
// process runner), packing a scheduled program for other ranks, the
// measured-iteration summary and flight records. Job preparation (the
// driver's pipeline) is tested in job_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "concerto/ir/json_io.h"
#include "concerto/runtime/flight_recorder.h"
#include "concerto/runtime/launcher.h"
#include "concerto/runtime/launcher_job.h"

namespace concerto {
namespace {

const std::string kExample = std::string(CONCERTO_SOURCE_DIR) + "/examples/ir/dp_matmul_allreduce.json";

/// Records the command lines it is asked to run; answers with `code`.
class FakeRunner : public ProcessRunner {
 public:
  explicit FakeRunner(int code) : code_(code) {}
  Result<int> Run(const std::vector<std::string>& argv) override {
    commands.push_back(argv);
    return code_;
  }
  std::vector<std::vector<std::string>> commands;

 private:
  int code_;
};

/// Index of `flag` in `argv`, or -1.
int IndexOf(const std::vector<std::string>& argv, const std::string& flag) {
  auto it = std::find(argv.begin(), argv.end(), flag);
  return it == argv.end() ? -1 : static_cast<int>(it - argv.begin());
}

TEST(MpirunCommand, HasTheRuntimeFlagsThenTheWorker) {
  MpirunSpec spec;
  spec.ranks = 4;
  spec.worker = "/opt/bin/concerto_mpi_run";
  spec.worker_args = {"--program", "p.json"};
  Result<std::vector<std::string>> argv = MpirunCommand(spec);
  ASSERT_TRUE(argv.ok()) << argv.status().message();
  const std::string line = ShellJoin(*argv);
  EXPECT_EQ(line,
            "mpirun --oversubscribe -n 4 --mca btl tcp,self --mca btl_tcp_if_include lo "
            "--mca oob_tcp_if_include lo --mca mpi_yield_when_idle 1 "
            "-x MALLOC_MMAP_THRESHOLD_=2000000000 -x MALLOC_TRIM_THRESHOLD_=4000000000 "
            "/opt/bin/concerto_mpi_run --program p.json");
  EXPECT_EQ(IndexOf(*argv, "--allow-run-as-root"), -1);
  spec.as_root = true;
  EXPECT_EQ(IndexOf(*MpirunCommand(spec), "--allow-run-as-root"), 1);
}

TEST(TorchrunCommand, StartsTheTrainerOncePerRank) {
  TorchrunSpec spec;
  spec.python = "/venv/bin/python";
  spec.ranks = 4;
  spec.program_file = "/tmp/r/program.json";
  spec.schedule_file = "/tmp/r/schedule.json";
  spec.steps = 3;
  EXPECT_EQ(ShellJoin(TorchrunCommand(spec)),
            "/venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 4 -m concerto.train "
            "--program /tmp/r/program.json --schedule /tmp/r/schedule.json --steps 3");
  spec.model = "gpt-tiny";
  spec.device = "cuda";
  spec.json = true;
  EXPECT_EQ(ShellJoin(TorchrunCommand(spec)),
            "/venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 4 -m concerto.train "
            "--program /tmp/r/program.json --schedule /tmp/r/schedule.json --steps 3 --model-layouts gpt-tiny "
            "--device cuda --json");
}

TEST(MpirunCommand, RejectsNoRanksAndNoWorker) {
  MpirunSpec spec;
  spec.worker = "w";
  spec.ranks = 0;
  EXPECT_NE(MpirunCommand(spec).status().message().find("at least 1 rank"), std::string::npos);
  spec.ranks = 2;
  spec.worker.clear();
  EXPECT_NE(MpirunCommand(spec).status().message().find("no worker"), std::string::npos);
}

TEST(ShellJoin, QuotesWhatTheShellWouldSplit) {
  EXPECT_EQ(ShellJoin({"a", "b c", "it's", ""}), "a 'b c' 'it'\\''s' ''");
}

TEST(LaunchWorker, PassesTheJobAndForwardsTheExitCode) {
  FakeRunner runner(137);  // a rank killed by SIGKILL: mpirun exits 128 + 9
  MpirunSpec spec;
  spec.ranks = 2;
  spec.worker = "concerto_mpi_run";
  WorkerRequest request;
  request.program_file = "/tmp/x/program.json";
  request.schedule_file = "/tmp/x/schedule.json";
  request.check = true;
  request.model = "gpt-tiny";
  request.plan = "dp=2";
  request.iterations = 5;
  request.warmup = 2;
  request.trace = "t.json";
  request.json = true;
  request.timeout_s = 7.5;
  request.kill_op = "L0.mlp.fc1";
  request.kill_rank = 1;
  Result<int> code = LaunchWorker(spec, request, runner);
  ASSERT_TRUE(code.ok()) << code.status().message();
  EXPECT_EQ(*code, 137);
  ASSERT_EQ(runner.commands.size(), 1u);
  const std::vector<std::string>& argv = runner.commands[0];
  const int worker = IndexOf(argv, "concerto_mpi_run");
  ASSERT_GT(worker, 0);
  const std::vector<std::string> args(argv.begin() + worker + 1, argv.end());
  EXPECT_EQ(ShellJoin(args),
            "--program /tmp/x/program.json --schedule /tmp/x/schedule.json --model gpt-tiny --plan dp=2 --check "
            "--iterations 5 --warmup 2 --trace t.json --json --timeout 7.5 --kill-op L0.mlp.fc1 --kill-rank 1");
}

TEST(LaunchWorker, NeedsProgramAndSchedule) {
  FakeRunner runner(0);
  MpirunSpec spec;
  spec.worker = "w";
  EXPECT_FALSE(LaunchWorker(spec, WorkerRequest{}, runner).ok());
  EXPECT_TRUE(runner.commands.empty());  // nothing launched
}

TEST(FindMpiWorker, NamesTheMissingPath) {
  Result<std::string> w = FindMpiWorker("/nonexistent-dir");
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("/nonexistent-dir/concerto_mpi_run"), std::string::npos);
}

TEST(SummarizeMeasuredJob, TakesTheLowerMedianIterationAndItsTimeline) {
  Result<Program> program = ReadProgramFile(kExample);
  ASSERT_TRUE(program.ok()) << program.status().message();
  Result<ScheduledProgram> sp = UnpackScheduledProgram(
      PackScheduledProgram(ScheduledProgram{*program, ProgramOrderSchedule(*program, "fifo")}), "test");
  ASSERT_TRUE(sp.ok()) << sp.status().message();
  // Four iterations on 2 ranks; an iteration's time is its latest end on
  // any rank: max(30, 50) = 50, max(90, 10) = 90, 20, 70. Sorted 20, 50,
  // 70, 90: the lower middle is 50 (iteration 0).
  auto rec = [](int rank, double end) { return OpRecord{rank, 0, 0, 0, end}; };
  std::vector<std::vector<std::vector<OpRecord>>> records = {
      {{rec(0, 30)}, {rec(1, 50)}}, {{rec(0, 90)}, {rec(1, 10)}}, {{rec(0, 20)}, {rec(1, 5)}},
      {{rec(0, 70)}, {rec(1, 70)}}};
  Result<MeasuredJob> job = SummarizeMeasuredJob(sp->program, records, 1);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->iteration_us, (std::vector<double>{50, 90, 20, 70}));
  EXPECT_EQ(job->median_iteration, 0);
  EXPECT_DOUBLE_EQ(job->median_iteration_us, 50);
  EXPECT_DOUBLE_EQ(job->timeline.makespan_us, 50);
  EXPECT_EQ(job->warmup, 1);
  EXPECT_FALSE(SummarizeMeasuredJob(sp->program, {}, 0).ok());
}

TEST(FlightRecorder, NamesTheRankThatDiedAndTheOpsInFlight) {
  // dp2_linear: ops 0 fc.fwd, 1 fc.dw (stream 0, compute), 2
  // fc.dw.all_reduce (stream 1, comm), 3 fc.adam.
  Result<Program> program = ReadProgramFile(kExample);
  ASSERT_TRUE(program.ok()) << program.status().message();
  const std::string dir = testing::TempDir();
  {
    // Rank 1 dies (its recorder is destroyed without a final state, as a
    // SIGKILLed process leaves it) while running fc.dw; rank 0 waits in the
    // all_reduce and is then stopped by mpirun (SIGTERM).
    Result<std::unique_ptr<FlightRecorder>> r0 = FlightRecorder::Create(FlightRecordPath(dir, 0), 0, 2);
    Result<std::unique_ptr<FlightRecorder>> r1 = FlightRecorder::Create(FlightRecordPath(dir, 1), 1, 2);
    ASSERT_TRUE(r0.ok() && r1.ok());
    (*r0)->SetState(RankState::kRunning);
    (*r0)->Begin(0, 1);
    (*r0)->End(0);
    (*r0)->Begin(1, 2);
    (*r0)->SetState(RankState::kTerminated);
    (*r1)->SetState(RankState::kRunning);
    (*r1)->Begin(0, 1);
  }
  std::vector<Result<RankFlightRecord>> records = {ReadFlightRecord(FlightRecordPath(dir, 0)),
                                                   ReadFlightRecord(FlightRecordPath(dir, 1))};
  ASSERT_TRUE(records[0].ok()) << records[0].status().message();
  EXPECT_EQ(records[0]->rank, 0);
  EXPECT_EQ(records[0]->state, RankState::kTerminated);
  EXPECT_EQ(records[0]->in_flight, (std::vector<std::pair<int, int>>{{1, 2}}));
  EXPECT_EQ(DescribeFailedJob(*program, records),
            "rank 1 died in op 1 'fc.dw' (stream compute) (it was running and was not stopped by mpirun); "
            "rank 0 was stopped by mpirun in op 2 'fc.dw.all_reduce' (stream comm)");
  // A rank without a record, one that failed cleanly, and one that finished.
  {
    Result<std::unique_ptr<FlightRecorder>> r1 = FlightRecorder::Create(FlightRecordPath(dir, 1), 1, 2);
    ASSERT_TRUE(r1.ok());
    (*r1)->SetState(RankState::kFailed);
  }
  records = {Status::Error("no flight record"), ReadFlightRecord(FlightRecordPath(dir, 1))};
  EXPECT_EQ(DescribeFailedJob(*program, records),
            "rank 0 left no flight record (died before it started?); rank 1 failed no op in flight (between ops or "
            "waiting for an op's inputs)");
  EXPECT_FALSE(ReadFlightRecord(kExample).ok());  // not a flight record
}

}  // namespace
}  // namespace concerto
