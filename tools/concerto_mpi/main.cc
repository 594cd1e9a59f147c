// concerto_mpi_run: executes one rank of a scheduled program per MPI process
// (docs/runtime.md, "Running over MPI"). `concerto run` launches it through
// mpirun; it can also be started by hand:
//   mpirun -n N concerto_mpi_run (--program P.json [--schedule S.json] |
//          --model M --plan P) [--scheduler NAME|concerto] [--cluster C]
//          [--profile DB] [scheduler options: concerto --help] [--iterations N] [--warmup W] [--check]
//          [--trace FILE] [--json] [--timeout SECONDS]
//          [--fail-op NAME --fail-rank R] [--kill-op NAME --kill-rank R]
//          [--status-dir DIR]
//   mpirun -n N concerto_mpi_run (--program P.json | --model M --plan P) --scheduler concerto
//          --batch-windows 1 --schedule-only --write-schedule S.json [--write-program P2.json]
//          (`concerto schedule --mpi N`: rank 0 schedules, the other ranks solve window batches)
//   mpirun -n N concerto_mpi_run [--profile-comm OUT.json [--profile-specs SPECS]]
//          [--profile-interference OUT2.json]   (either or both)
//
// Rank 0 prepares the job through the driver's pipeline (driver/job.h, the
// same RunJob as `concerto simulate`: reads or lowers the program, reads or
// makes the schedule: any baseline, or the Concerto scheduler, which has
// time limits and so is run once, on rank 0), checks it, and sends
// the program and schedule to every other rank. Every rank then creates
// the MPI communicators of all groups and runs its rank warmup + iterations
// times. Rank 0 gathers every rank's op records, reports the median
// iteration (text or --json) and writes the Chrome trace of that
// iteration; with --check it also gathers the first step's tensors and
// compares them with the unsharded reference. Buffers are initialised once
// and reused by every iteration.
// Exit code 0 on success, 1 on any error (printed with the rank).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include "concerto/driver/job.h"
#include "concerto/ir/json_io.h"
#include "concerto/report/report.h"
#include "concerto/util/json_text.h"
#include "concerto/runtime/executor.h"
#include "concerto/runtime/flight_recorder.h"
#include "concerto/runtime/kernels.h"
#include "concerto/runtime/launcher_job.h"
#include "concerto/runtime/mpi_communicator.h"
#include "concerto/profile/profile.h"
#include "concerto/schedule/window_batch.h"
#include "concerto/util/input_file.h"
#include "../common/option_flags.h"

namespace concerto {
namespace {

constexpr int kJobTag = 5;
constexpr int kRecordsTag = 6;
constexpr int kTensorsTag = 7;
constexpr int kWindowBatchTag = 8;    // rank 0 -> window workers: a batch of window problems, or stop
constexpr int kWindowAnswersTag = 9;  // window worker -> rank 0: the batch's answers

struct Flags {
  JobSpec job;
  bool scheduler_given = false;
  int iterations = 1;
  int warmup = 0;
  bool check = false;
  bool json = false;
  std::string trace;
  double timeout_s = 60;
  std::string fail_op, kill_op;
  int fail_rank = -1, kill_rank = -1;
  std::string status_dir;     // per-rank flight records (FlightRecorder), for the launcher
  std::string profile_comm;   // output file of the collective profile mode
  std::string profile_specs;  // "type:n:bytes,..."; default sweep when empty
  std::string profile_interference;  // output file of the interference measurement (profile mode)
  int profile_reps = 5;
  int64_t profile_max_bytes = 16 << 20;
  bool schedule_only = false;   // schedule (with window workers), write, do not run
  std::string write_schedule;   // where to write the schedule
  std::string write_program;    // where to write the scheduled program
};

/// Parses the command line (CLI11; the scheduler's options from the option
/// table, as `concerto` takes them); an error names the bad argument.
Result<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  CLI::App app{"concerto_mpi_run: one rank of a scheduled program per MPI process (started by `concerto run`, "
               "or by hand under mpirun; docs/runtime.md)"};
  app.add_option("--program", f.job.program_file, "program in the IR's JSON form");
  app.add_option("--schedule", f.job.schedule_file, "run this schedule of --program (verified first)");
  app.add_option("--model", f.job.model, "lower this model preset or spec file (with --check: the reference)");
  app.add_option("--plan", f.job.plan, "parallel plan for --model, or a plan file");
  app.add_option("--scheduler", f.job.scheduler, "make the schedule with this scheduler")->capture_default_str();
  app.add_option("--cluster", f.job.cluster, "cluster preset or file the scheduler plans with")->capture_default_str();
  app.add_option("--profile", f.job.profile, "profile database for the scheduler's cost model");
  app.add_option("--nodes", f.job.nodes, "scale the cluster to this many nodes (0: as given)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--solver", f.job.options.concerto.solver, "concerto: window solver backend")->capture_default_str();
  AddOptionFlags(&app, &f.job.options);
  app.add_option("--iterations", f.iterations, "measured iterations")->check(CLI::Range(1, 1000000));
  app.add_option("--warmup", f.warmup, "iterations run before measuring")->check(CLI::Range(0, 1000000));
  app.add_flag("--check", f.check, "compare with the unsharded model (needs --model and --plan)");
  app.add_flag("--json", f.json, "print one JSON object");
  app.add_option("--trace", f.trace, "write the Chrome trace of the median iteration here");
  app.add_option("--timeout", f.timeout_s, "seconds an MPI call waits for its peers [s]")
      ->check(CLI::PositiveNumber);
  app.add_option("--fail-op", f.fail_op, "fault injection: this op fails on --fail-rank");
  app.add_option("--fail-rank", f.fail_rank, "fault injection: the rank of --fail-op")->check(CLI::NonNegativeNumber);
  app.add_option("--kill-op", f.kill_op, "fault injection: the process of --kill-rank dies (SIGKILL) at this op");
  app.add_option("--kill-rank", f.kill_rank, "fault injection: the rank of --kill-op")->check(CLI::NonNegativeNumber);
  app.add_option("--status-dir", f.status_dir, "per-rank flight records (for the launcher's message)");
  app.add_flag("--schedule-only", f.schedule_only,
               "make the schedule and stop (no run); with --scheduler concerto --batch-windows 1 the other ranks "
               "solve windows (docs/concerto.md, \"Parallel window solving\")");
  app.add_option("--write-schedule", f.write_schedule, "write the schedule (JSON) here");
  app.add_option("--write-program", f.write_program, "write the scheduled (possibly rewritten) program here");
  app.add_option("--profile-comm", f.profile_comm, "profile mode: time collectives, write the samples here");
  app.add_option("--profile-specs", f.profile_specs, "profile mode: TYPE:N:BYTES,... (default: a sweep)");
  app.add_option("--profile-interference", f.profile_interference,
                 "profile mode: measure interference and the co-run figures, write them here (after the "
                 "collectives when --profile-comm is given too)");
  app.add_option("--profile-reps", f.profile_reps, "profile mode: repetitions")->check(CLI::Range(1, 1000000));
  app.add_option("--profile-max-bytes", f.profile_max_bytes, "profile mode: largest size [bytes]")
      ->check(CLI::Range(int64_t{4096}, int64_t{1} << 40));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    return Status::Error(app.help());
  } catch (const CLI::ParseError& e) {
    return Status::Error(std::string(e.what()) + "\n" + app.help());
  }
  f.scheduler_given = app.count("--scheduler") > 0;
  if (!f.profile_comm.empty() || !f.profile_interference.empty()) return f;
  const bool file = !f.job.program_file.empty(), model = !f.job.model.empty();
  if (!file && !model) return Status::Error("give --program FILE or --model and --plan (--help for usage)");
  if (model && f.job.plan.empty()) return Status::Error("--model needs --plan");
  if (file && model && !f.check)
    return Status::Error("--program and --model together only with --check (the model names the reference)");
  if (!f.job.schedule_file.empty() && !file) return Status::Error("--schedule needs --program (the program it belongs to)");
  if (!f.job.schedule_file.empty() && f.scheduler_given)
    return Status::Error("give either --schedule FILE or --scheduler NAME, not both");
  if (f.check && !model) return Status::Error("--check needs --model and --plan (they define the unsharded reference)");
  if ((f.fail_rank >= 0) != !f.fail_op.empty()) return Status::Error("--fail-op and --fail-rank go together");
  if ((f.kill_rank >= 0) != !f.kill_op.empty()) return Status::Error("--kill-op and --kill-rank go together");
  return f;
}

/// Appends a value's raw bytes.
template <typename T>
void Put(std::string* s, const T& v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

/// Reads values written by Put, with bounds checks.
class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  template <typename T>
  bool Get(T* out) {
    if (pos_ + sizeof(T) > s_.size()) return false;
    std::memcpy(out, s_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool GetString(std::string* out) {
    int64_t n = 0;
    if (!Get(&n) || n < 0 || pos_ + n > s_.size()) return false;
    out->assign(s_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool GetFloats(std::vector<float>* out, int64_t n) {
    if (n < 0 || pos_ + sizeof(float) * n > s_.size()) return false;
    out->resize(n);
    std::memcpy(out->data(), s_.data() + pos_, sizeof(float) * n);
    pos_ += sizeof(float) * n;
    return true;
  }

 private:
  const std::string& s_;
  size_t pos_ = 0;
};

/// Serialises a rank's tensors (role, then name/values pairs).
std::string PackTensors(const RankTensors& t) {
  std::string s;
  Put(&s, static_cast<int64_t>(t.role.size()));
  s += t.role;
  Put(&s, static_cast<int64_t>(t.values.size()));
  for (const auto& [name, values] : t.values) {
    Put(&s, static_cast<int64_t>(name.size()));
    s += name;
    Put(&s, static_cast<int64_t>(values.size()));
    s.append(reinterpret_cast<const char*>(values.data()), sizeof(float) * values.size());
  }
  return s;
}

/// Reads back what PackTensors wrote; an error on truncated input.
Result<RankTensors> UnpackTensors(const std::string& s, int rank) {
  RankTensors t;
  t.rank = rank;
  Reader in(s);
  const Status truncated = Status::Error("truncated tensors from rank " + std::to_string(rank));
  int64_t count = 0;
  if (!in.GetString(&t.role) || !in.Get(&count)) return truncated;
  for (int64_t i = 0; i < count; ++i) {
    std::string name;
    int64_t n = 0;
    std::vector<float> v;
    if (!in.GetString(&name) || !in.Get(&n) || !in.GetFloats(&v, n)) return truncated;
    t.values.emplace(std::move(name), std::move(v));
  }
  return t;
}

/// Serialises one rank's records of every measured iteration.
std::string PackRecords(const std::vector<std::vector<OpRecord>>& per_iteration) {
  std::string s;
  Put(&s, static_cast<int64_t>(per_iteration.size()));
  for (const auto& records : per_iteration) {
    Put(&s, static_cast<int64_t>(records.size()));
    for (const OpRecord& r : records) Put(&s, r);
  }
  return s;
}

/// Reads back what PackRecords wrote.
Result<std::vector<std::vector<OpRecord>>> UnpackRecords(const std::string& s, int rank) {
  Reader in(s);
  const Status truncated = Status::Error("truncated records from rank " + std::to_string(rank));
  int64_t iterations = 0;
  if (!in.Get(&iterations) || iterations < 0) return truncated;
  std::vector<std::vector<OpRecord>> out(iterations);
  for (auto& records : out) {
    int64_t n = 0;
    if (!in.Get(&n) || n < 0) return truncated;
    records.resize(n);
    for (OpRecord& r : records)
      if (!in.Get(&r)) return truncated;
  }
  return out;
}

/// The window workers' link: worker w is MPI rank w.
class MpiWindowLink : public WindowWorkerLink {
 public:
  explicit MpiWindowLink(MpiCommunicator& comm) : comm_(comm) {}
  int workers() const override { return comm_.size() - 1; }
  Status Send(int worker, const std::string& bytes) override { return comm_.SendBytes(bytes, worker, kWindowBatchTag); }
  Result<std::string> Receive(int worker) override { return comm_.RecvBytes(worker, kWindowAnswersTag); }

 private:
  MpiCommunicator& comm_;
};

/// Whether the ranks other than 0 solve concerto's windows while rank 0
/// schedules: concerto with --batch-windows 1 on more than one process
/// (every rank decides the same from the same command line).
bool ServesWindows(const Flags& flags, int ranks) {
  return ranks > 1 && flags.job.schedule_file.empty() && flags.job.scheduler == "concerto" &&
         flags.job.options.concerto.batch_windows;
}

/// Rank 0 prepares the job (PrepareJob: scheduled and simulated, kept in
/// `prepared` for the report) and sends it to every rank ('E' + message on
/// failure, so that every rank stops); the others receive it. With
/// ServesWindows, the others first solve window batches until rank 0 has
/// its schedule.
Result<ScheduledProgram> ShareJob(MpiCommunicator& comm, const Flags& flags, JobResult* prepared) {
  const bool serve = ServesWindows(flags, comm.size());
  if (comm.rank() != 0 && serve) {
    Result<std::unique_ptr<WindowSolver>> solver = MakeWindowSolver(flags.job.options.concerto.solver);
    if (!solver.ok()) return solver.status();
    CONCERTO_RETURN_IF_ERROR(ServeWindowBatches([&] { return comm.RecvBytes(0, kWindowBatchTag); },
                                                [&](const std::string& bytes) {
                                                  return comm.SendBytes(bytes, 0, kWindowAnswersTag);
                                                },
                                                **solver));
  }
  if (comm.rank() != 0 && flags.schedule_only) return ScheduledProgram{};
  if (comm.rank() != 0) {
    Result<std::string> bytes = comm.RecvBytes(0, kJobTag);
    if (!bytes.ok()) return bytes.status();
    if (bytes->empty() || (*bytes)[0] == 'E') return Status::Error("rank 0 could not prepare the job");
    return UnpackScheduledProgram(bytes->substr(1), "job from rank 0");
  }
  MpiWindowLink link(comm);
  std::unique_ptr<DistributedBatchSolver> workers;
  JobSpec spec = flags.job;
  if (serve) {
    Result<std::unique_ptr<WindowSolver>> local = MakeWindowSolver(spec.options.concerto.solver);
    if (local.ok()) {
      workers = std::make_unique<DistributedBatchSolver>(link, std::move(local).value());
      spec.options.concerto.batch_solver = workers.get();
    }
  }
  Result<JobResult> job = PrepareJob(spec, [](const std::string& line) {
    std::fprintf(stderr, "concerto_mpi_run: %s\n", line.c_str());
  });
  if (serve) {
    if (workers) {
      std::fprintf(stderr, "concerto_mpi_run: %d window workers answered %d windows in %d batches\n",
                   comm.size() - 1, workers->problems_remote(), workers->batches_sent());
      CONCERTO_RETURN_IF_ERROR(workers->Shutdown());
    } else {
      for (int r = 1; r < comm.size(); ++r) CONCERTO_RETURN_IF_ERROR(comm.SendBytes(EncodeWindowStop(), r, kWindowBatchTag));
    }
  }
  if (flags.schedule_only) {
    if (!job.ok()) return job.status();
    *prepared = std::move(job).value();
    return prepared->run.scheduled;
  }
  const std::string message = job.ok() ? "P" + PackScheduledProgram(job->run.scheduled) : std::string("E");
  for (int r = 1; r < comm.size(); ++r) CONCERTO_RETURN_IF_ERROR(comm.SendBytes(message, r, kJobTag));
  if (!job.ok()) return job.status();
  *prepared = std::move(job).value();
  return prepared->run.scheduled;
}

/// --profile-comm: times collectives over MPI; rank 0 writes the samples.
/// --profile-interference: measures interference and the co-run figures
/// (after the collectives when both are given; `concerto profile` runs them
/// apart, timing its kernels between).
Status ProfileCommMode(MpiCommunicator& comm, const Flags& flags) {
  std::vector<int> world;
  for (int r = 0; r < comm.size(); ++r) world.push_back(r);
  if (!flags.profile_comm.empty()) {
    std::vector<CollectiveSpec> specs = DefaultCollectiveSpecs(comm.size(), flags.profile_max_bytes);
    if (!flags.profile_specs.empty()) {
      Result<std::vector<CollectiveSpec>> parsed = ParseCollectiveSpecs(flags.profile_specs);
      if (!parsed.ok()) return parsed.status();
      specs = *parsed;
    }
    std::vector<std::vector<int>> groups = CollectiveSpecGroups(specs, comm.size());
    if (std::find(groups.begin(), groups.end(), world) == groups.end()) groups.push_back(world);
    std::sort(groups.begin(), groups.end());
    CONCERTO_RETURN_IF_ERROR(comm.CreateGroups(groups));
    Result<std::vector<CollectiveSample>> samples = ProfileCollectives(comm, specs, flags.profile_reps);
    if (!samples.ok()) return samples.status();
    // One-way transfers: what the link is (ports or one medium; FitCollectives).
    Result<std::vector<OneWaySample>> one_way =
        ProfileOneWay(comm, DefaultOneWaySizes(flags.profile_max_bytes), flags.profile_reps);
    if (!one_way.ok()) return one_way.status();
    if (comm.rank() == 0)
      CONCERTO_RETURN_IF_ERROR(
          WriteTextFile(flags.profile_comm, WriteCollectiveSamples(*samples, comm.size(), *one_way)));
  } else {
    CONCERTO_RETURN_IF_ERROR(comm.CreateGroups({world}));
  }
  if (flags.profile_interference.empty()) return Status::Ok();
  // Compute slowed by an all_reduce in flight on a second thread of this
  // process, over MPI as in a run (over the world group).
  InterferenceOptions options;
  options.comm_bytes = std::min<int64_t>(options.comm_bytes, flags.profile_max_bytes / 4 * 4);
  Result<InterferenceMeasurement> m = MeasureInterference(comm, options);
  if (!m.ok()) return m.status();
  if (comm.rank() != 0) return Status::Ok();
  return WriteTextFile(flags.profile_interference, WriteInterference(*m));
}

/// The whole tool; returns the process exit code.
int Main(int argc, char** argv) {
  Result<std::unique_ptr<MpiCommunicator>> comm_or = MpiCommunicator::Create(&argc, &argv);
  if (!comm_or.ok()) {
    std::fprintf(stderr, "concerto_mpi_run: %s\n", comm_or.status().message().c_str());
    return 1;
  }
  MpiCommunicator& comm = **comm_or;
  const int rank = comm.rank();
  auto fail = [&](const std::string& msg) {
    std::fprintf(stderr, "concerto_mpi_run: rank %d: %s\n", rank, msg.c_str());
    return 1;
  };
  Result<Flags> flags = ParseFlags(argc, argv);
  if (!flags.ok()) return rank == 0 ? fail(flags.status().message()) : 1;
  comm.SetTimeout(flags->timeout_s);  // --timeout (60 s) for every MPI call, not MpiOptions' default
  if (!flags->profile_comm.empty() || !flags->profile_interference.empty()) {
    SetBlasThreads(1);  // as in a run (the interference kernels)
    Status st = ProfileCommMode(comm, *flags);
    return st.ok() ? 0 : fail(st.message());
  }
  JobResult prepared;  // rank 0: the job's cost model and simulated run
  Result<ScheduledProgram> sp = ShareJob(comm, *flags, &prepared);
  if (!sp.ok()) return rank == 0 ? fail(sp.status().message()) : 1;
  if (rank == 0) {
    if (!flags->write_schedule.empty())
      if (Status st = WriteTextFile(flags->write_schedule, WriteSchedule(sp->schedule)); !st.ok())
        return fail(st.message());
    if (!flags->write_program.empty())
      if (Status st = WriteTextFile(flags->write_program, WriteProgram(sp->program)); !st.ok())
        return fail(st.message());
  }
  if (flags->schedule_only) {
    if (rank != 0) return 0;
    const Summary& s = prepared.run.summary;
    if (flags->json) {
      nlohmann::json j = {{"scheduler", sp->schedule.scheduler},
                          {"makespan_us", s.makespan_us},
                          {"ranks", comm.size()}};
      if (prepared.run.concerto) j["concerto"] = ConcertoReportJson(*prepared.run.concerto);
      std::printf("%s\n", DumpJson(j, 2).c_str());
    } else {
      std::printf("%s: %.3f ms (simulated), scheduled on %d MPI processes\n", sp->schedule.scheduler.c_str(),
                  s.makespan_us / 1e3, comm.size());
    }
    return 0;
  }
  if (sp->program.mesh.NumRanks() != comm.size())
    return fail("the program needs " + std::to_string(sp->program.mesh.NumRanks()) + " ranks, mpirun started " +
                std::to_string(comm.size()));

  Result<RunOptions> options_or = JobRunOptions(flags->job.model);
  if (!options_or.ok()) return fail(options_or.status().message());
  RunOptions options = *options_or;
  options.timeout_s = flags->timeout_s;
  options.fail_op = flags->fail_op;
  options.fail_rank = flags->fail_rank;
  // --status-dir: a flight recorder (a mapped file that survives SIGKILL)
  // holds the op each stream runs, for the launcher's message about a
  // failed job; SIGTERM (mpirun stopping the job) is recorded too.
  std::unique_ptr<FlightRecorder> recorder;
  std::vector<int> stream_of_op;  // this rank's graph: op index -> stream index
  if (!flags->status_dir.empty()) {
    const Graph& graph = sp->program.GraphOf(sp->program.roles[sp->program.RoleOfRank(rank)]);
    for (const Op& op : graph.ops)
      stream_of_op.push_back(static_cast<int>(
          std::find(graph.streams.begin(), graph.streams.end(), op.stream) - graph.streams.begin()));
    Result<std::unique_ptr<FlightRecorder>> r =
        FlightRecorder::Create(FlightRecordPath(flags->status_dir, rank), rank, static_cast<int>(graph.streams.size()));
    if (!r.ok()) return fail(r.status().message());
    recorder = std::move(r).value();
    recorder->RecordTermination();
    options.after_op = [&recorder, &stream_of_op](int, int op_index, const Op&, bool ok) {
      if (ok) recorder->End(stream_of_op[op_index]);
      else recorder->SetState(RankState::kFailed);  // the op stays recorded; before the executor's MPI_Abort
    };
  }
  options.before_op = [&recorder, &stream_of_op, kill_op = flags->kill_op, kill_rank = flags->kill_rank](
                          int r, int op_index, const Op& op) {
    if (recorder) recorder->Begin(stream_of_op[op_index], op_index);
    if (r != kill_rank || op.name != kill_op) return;
    // The process ends abruptly (SIGKILL, no MPI_Abort, no clean-up): what a
    // crashed or OOM-killed rank looks like to mpirun and the other ranks.
    std::fprintf(stderr, "concerto_mpi_run: rank %d: killed at op %d '%s' (--kill-op fault injection)\n", r,
                 op_index, op.name.c_str());
    std::fflush(stderr);
    raise(SIGKILL);
  };

  if (Status st = comm.CreateGroups(CollectAllGroups(sp->program)); !st.ok()) return fail(st.message());
  // One OpenBLAS thread per process (RunOptions::blas_threads): the
  // pthreads build otherwise starts one spinning thread per core in every
  // rank, which takes the cores from the other ranks and from MPI.
  SetBlasThreads(options.blas_threads);
  // Buffers are allocated and initialised once; every iteration runs the
  // same step on them (RankSession). --check compares the first step's
  // tensors (a copy taken then).
  std::vector<std::vector<OpRecord>> measured;  // this rank, per measured iteration
  RankTensors first;
  auto failed = [&](const std::string& msg) {
    if (recorder) recorder->SetState(RankState::kFailed);
    return fail(msg);
  };
  if (recorder) recorder->SetState(RankState::kRunning);
  Result<std::unique_ptr<RankSession>> session = RankSession::Create(*sp, comm, options);
  if (!session.ok()) return failed(session.status().message());
  for (int i = 0; i < flags->warmup + flags->iterations; ++i) {
    Result<std::vector<OpRecord>> records = (*session)->Step();
    if (!records.ok()) return failed(records.status().message());
    if (i >= flags->warmup) measured.push_back(std::move(records).value());
    if (i == 0 && flags->check) first = (*session)->Tensors();
  }
  session->reset();
  if (recorder) recorder->SetState(RankState::kDone);

  // Gather the records on rank 0.
  if (rank != 0) {
    if (Status st = comm.SendBytes(PackRecords(measured), 0, kRecordsTag); !st.ok()) return fail(st.message());
  }
  std::vector<std::vector<std::vector<OpRecord>>> records(flags->iterations,
                                                          std::vector<std::vector<OpRecord>>(comm.size()));
  if (rank == 0) {
    for (int i = 0; i < flags->iterations; ++i) records[i][0] = measured[i];
    for (int r = 1; r < comm.size(); ++r) {
      Result<std::string> bytes = comm.RecvBytes(r, kRecordsTag);
      if (!bytes.ok()) return fail(bytes.status().message());
      Result<std::vector<std::vector<OpRecord>>> theirs = UnpackRecords(*bytes, r);
      if (!theirs.ok()) return fail(theirs.status().message());
      if (static_cast<int>(theirs->size()) != flags->iterations)
        return fail("rank " + std::to_string(r) + " sent " + std::to_string(theirs->size()) + " iterations");
      for (int i = 0; i < flags->iterations; ++i) records[i][r] = std::move((*theirs)[i]);
    }
  }

  std::string check_summary;
  if (flags->check) {
    if (rank != 0) {
      if (Status st = comm.SendBytes(PackTensors(first), 0, kTensorsTag); !st.ok()) return fail(st.message());
    } else {
      ExecutionResult run;
      run.ranks.resize(comm.size());
      run.ranks[0] = std::move(first);
      for (int r = 1; r < comm.size(); ++r) {
        Result<std::string> bytes = comm.RecvBytes(r, kTensorsTag);
        if (!bytes.ok()) return fail(bytes.status().message());
        Result<RankTensors> t = UnpackTensors(*bytes, r);
        if (!t.ok()) return fail(t.status().message());
        run.ranks[r] = std::move(t).value();
      }
      Result<std::string> summary = CheckAgainstReference(flags->job.model, flags->job.plan, *sp, run, options);
      if (!summary.ok()) return fail("mpi check failed: " + summary.status().message());
      check_summary = *summary;
    }
  }
  if (rank != 0) return 0;

  Result<MeasuredJob> job = SummarizeMeasuredJob(sp->program, records, flags->warmup);
  if (!job.ok()) return fail(job.status().message());
  job->check = check_summary;
  const CostModel& cost = *prepared.cost;
  const Summary* predicted = &prepared.run.summary;
  if (!flags->trace.empty()) {
    if (Status st = WriteTextFile(flags->trace, ChromeTrace(*sp, job->timeline)); !st.ok()) return fail(st.message());
    std::fprintf(stderr, "concerto_mpi_run: trace of the median iteration written to %s\n", flags->trace.c_str());
  }
  if (flags->json) {
    nlohmann::json j = MeasuredJobJson(*sp, *job, cost, predicted);
    j["backend"] = "mpi";
    std::printf("%s\n", DumpJson(j, 2).c_str());
  } else {
    std::printf("%s", MeasuredJobText(*sp, *job, cost, predicted).c_str());
    if (flags->check)
      std::printf("mpi check passed: %s on %d ranks: %s\n", sp->schedule.scheduler.c_str(), comm.size(),
                  check_summary.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace concerto

/// An exception that escapes is a bug: "internal error", exit code 3, not an abort.
int main(int argc, char** argv) {
  try {
    return concerto::Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "concerto_mpi_run: internal error: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "concerto_mpi_run: internal error: an unknown exception\n");
  }
  return 3;
}
