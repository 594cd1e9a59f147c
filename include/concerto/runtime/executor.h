// The executor: runs a ScheduledProgram for real. Per rank one thread per
// stream; each stream runs its ops in the schedule's order; an op starts
// when its data and control predecessors on the rank have finished;
// collectives and send/recv go through a Communicator. Every op's measured
// start and end go into the simulator's Timeline type, so report/ (summary,
// Chrome trace) works on measured runs. docs/runtime.md.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "concerto/runtime/communicator.h"
#include "concerto/runtime/init.h"
#include "concerto/schedule/schedule.h"
#include "concerto/sim/simulator.h"
#include "concerto/util/status.h"

namespace concerto {

struct RunOptions {
  InitOptions init;
  /// Seconds a collective or send/recv waits for its peers before failing.
  double timeout_s = 30;
  /// OpenBLAS threads per process (RunInProcess: shared by all ranks).
  int blas_threads = 1;
  /// Fault injection for tests: the op named `fail_op` on rank `fail_rank`
  /// fails ("injected failure") instead of running.
  std::string fail_op;
  int fail_rank = -1;
  /// Called by a stream thread just before op `op_index` of `rank` runs
  /// (after its waits). Tools use it for fault injection that must not be
  /// a clean error, e.g. concerto_mpi_run --kill-op ends the process here.
  std::function<void(int rank, int op_index, const Op& op)> before_op;
  /// Called by a stream thread just after op `op_index` of `rank` ran
  /// (`ok`: it succeeded), before a failure aborts the job. Tools record
  /// the ops in flight with the two hooks (FlightRecorder).
  std::function<void(int rank, int op_index, const Op& op, bool ok)> after_op;
  /// Host memory the run may use, in bytes; 0: what /proc/meminfo calls
  /// MemAvailable (HostMemoryAvailableBytes). Tests give a figure.
  int64_t host_memory_bytes = 0;
};

/// A lower bound of the host memory rank `rank` of `program` holds at once in
/// the runtime (floats in fp32, as it computes): its graph's inputs
/// (parameters, optimizer state, data; alive for the whole step) and, for the
/// op that needs the most, the other tensors it reads and writes.
double RuntimeMemoryLowerBoundBytes(const Program& program, int rank);

/// MemAvailable from /proc/meminfo (else the free physical pages), in bytes.
int64_t HostMemoryAvailableBytes();

/// An error naming the figures when `ranks` of `program` run in this host's
/// memory (`available_bytes`; 0: HostMemoryAvailableBytes()) cannot fit even
/// their lower bounds: checked before anything is allocated.
Status CheckHostMemory(const Program& program, const std::vector<int>& ranks, int64_t available_bytes = 0);

/// The most ranks one host runs at once: 32 per core, at least 64. Every rank
/// is a process (MPI) or a thread (in process) that the others wait for at
/// each collective; past this a step crawls and the host stops answering.
int MaxRanksPerHost(int cores);

/// An error naming the figures when `ranks` ranks of `program` would run on
/// one host of `cores` cores (0: this host's) past MaxRanksPerHost: checked
/// before any rank starts.
Status CheckHostRanks(const Program& program, int ranks, int cores = 0);

/// One rank's tensors after the step (fp32, by tensor name).
struct RankTensors {
  int rank = 0;
  std::string role;
  std::map<std::string, std::vector<float>> values;

  /// The values of tensor `name`, or nullptr when this rank has none.
  const std::vector<float>* Find(const std::string& name) const;
};

/// What one rank's execution measured and computed.
struct RankRun {
  std::vector<OpRecord> records;  // one per op, times in us since the epoch
  RankTensors tensors;
  /// The most bytes the rank's allocation ledger held (RankSession::PeakMemoryBytes).
  int64_t peak_memory_bytes = 0;
};

/// A whole run: the measured timeline of every rank and every rank's tensors
/// (the driver's RunResult, driver/driver.h, is a simulated scheduler run).
struct ExecutionResult {
  Timeline timeline;
  std::vector<RankTensors> ranks;  // indexed by rank
  /// Per rank, the most bytes its allocation ledger held in any step
  /// (RankSession::PeakMemoryBytes).
  std::vector<int64_t> peak_memory_bytes;

  /// The tensors of `rank` (asserts it was run).
  const RankTensors& Rank(int rank) const;
};

/// Everything that must hold before a run starts: the program verifies,
/// the schedule verifies against it (VerifySchedule), and every compute op
/// is one the runtime can execute (CheckKernel). Lists the first problems.
Status CheckRunnable(const ScheduledProgram& sp);

/// Executes the ops of `comm.rank()`'s role: initialises its graph inputs,
/// meets every other rank in a barrier (an all_reduce over the whole world;
/// time zero of its records is the moment it leaves it), runs one thread per
/// stream, and returns its timeline records and its tensors. On an op
/// failure it aborts the communicator and returns "rank R: op N 'name': ..."
/// naming the op. Call CheckRunnable first (RunInProcess does). An MPI
/// launcher calls this once per process with its MPI communicator.
Result<RankRun> RunRank(const ScheduledProgram& sp, Communicator& comm, const RunOptions& options);

/// One rank's executor kept across steps, so that iterations reuse their
/// buffers: Create resolves the rank's role and schedule and allocates and
/// initialises every tensor once; each Step runs the whole step again on
/// the same buffers (start barrier, one thread per stream). No op writes a
/// graph input (Adam writes `<param>.next`, not the parameter) and every
/// kernel overwrites its outputs whole, so every step computes the same
/// values as the first (tested bit for bit in process).
class RankSession {
 public:
  /// Errors (after aborting `comm`, so the other ranks stop): the rank has
  /// no role or schedule, an input cannot be initialised.
  static Result<std::unique_ptr<RankSession>> Create(const ScheduledProgram& sp, Communicator& comm,
                                                     const RunOptions& options);
  ~RankSession();
  RankSession(const RankSession&) = delete;
  RankSession& operator=(const RankSession&) = delete;

  /// Runs one step: its records, in microseconds since this rank left the
  /// step's start barrier. On an op failure the communicator is aborted and
  /// the error names rank and op; the session cannot step again.
  Result<std::vector<OpRecord>> Step();
  /// A copy of the rank's tensors as they are now.
  RankTensors Tensors() const;
  /// The most bytes the rank's device would have held in the last step, in
  /// its real op order: each tensor (elements x the IR dtype's size) from
  /// its producer's start to the end of its last consumer, graph inputs from
  /// the start, tensors nothing reads to the end (the simulator's rule,
  /// sim/memory.h, on the events as they happened on the stream threads).
  /// The CPU buffers stay allocated, in fp32, for the reference check.
  int64_t PeakMemoryBytes() const;
  /// The tensors moved out; the session must not Step afterwards.
  RankTensors TakeTensors();

  class Impl;

 private:
  explicit RankSession(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Runs every rank of `sp` in this process, one thread group per rank over a
/// FakeWorld. Refuses a program or schedule that CheckRunnable rejects.
/// The error of a failed run is the first failure (not the aborts it caused).
Result<ExecutionResult> RunInProcess(const ScheduledProgram& sp, const RunOptions& options = {});

/// RunInProcess `steps` times on buffers initialised once (a RankSession
/// per rank). `per_step` (optional) gets every step's records ([step][rank]).
/// The result holds the last step's timeline and the tensors as they were
/// after the FIRST step (copied then when steps > 1): what a reference
/// check compares. Errors: steps < 1, and those of RunInProcess.
Result<ExecutionResult> RunInProcessSteps(const ScheduledProgram& sp, const RunOptions& options, int steps,
                                    std::vector<std::vector<std::vector<OpRecord>>>* per_step = nullptr);

/// Assembles per-rank records into a Timeline (ranks, makespan, per-stream
/// busy time; no critical path).
Timeline MakeMeasuredTimeline(const Program& program, const std::vector<std::vector<OpRecord>>& per_rank);

}  // namespace concerto
