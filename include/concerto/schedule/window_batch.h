// Solving many windows at once: the windows of one odd or even pass, built
// from the same start ticks, are independent problems (docs/concerto.md,
// "Parallel window solving"). A WindowBatchSolver answers a batch of them on
// local threads or on remote workers (MPI processes, tools/concerto_mpi);
// answers come back in the problems' order and depend only on the problems
// and the options (deterministic solves), never on how many workers took
// part or which solved what.
//
// Remote workers are reached through a WindowWorkerLink (bytes to and from a
// numbered worker), so the protocol runs in one process in the tests with a
// fake link; the MPI link is a few lines over MpiCommunicator.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "concerto/schedule/window_solver.h"
#include "concerto/util/status.h"

namespace concerto {

/// Answers a batch of window problems; answer i is for problem i.
class WindowBatchSolver {
 public:
  virtual ~WindowBatchSolver() = default;
  /// How the batch is solved, e.g. "2 threads", "1 thread + 3 workers".
  virtual std::string name() const = 0;
  /// Solvers working at once.
  virtual int parallelism() const = 0;
  virtual std::vector<Result<WindowSolution>> SolveAll(const std::vector<const WindowProblem*>& problems,
                                                       const SolverOptions& options) = 0;
};

/// Solves batches on `threads` local threads, one `solver_name` backend each
/// (a backend that is not thread-safe, CBC, gets one thread). Problems are
/// taken in order by whichever thread is free.
Result<std::unique_ptr<WindowBatchSolver>> NewThreadBatchSolver(const std::string& solver_name, int threads);

/// The scheduler's side of the channel to remote window workers 1..workers().
class WindowWorkerLink {
 public:
  virtual ~WindowWorkerLink() = default;
  virtual int workers() const = 0;
  virtual Status Send(int worker, const std::string& bytes) = 0;
  virtual Result<std::string> Receive(int worker) = 0;
};

/// A batch solver over remote workers: problem i goes to share i mod
/// (workers + 1); share 0 is solved here by `local` while the workers solve
/// theirs. Call Shutdown() once at the end: it tells every worker to return
/// from ServeWindowBatches.
class DistributedBatchSolver : public WindowBatchSolver {
 public:
  DistributedBatchSolver(WindowWorkerLink& link, std::unique_ptr<WindowSolver> local);
  std::string name() const override;
  int parallelism() const override { return link_.workers() + 1; }
  std::vector<Result<WindowSolution>> SolveAll(const std::vector<const WindowProblem*>& problems,
                                               const SolverOptions& options) override;
  /// Sends the stop message to every worker (idempotent).
  Status Shutdown();
  /// Batches sent to workers so far, and problems they answered.
  int batches_sent() const { return batches_sent_; }
  int problems_remote() const { return problems_remote_; }

 private:
  WindowWorkerLink& link_;
  std::unique_ptr<WindowSolver> local_;
  bool shut_down_ = false;
  int batches_sent_ = 0;
  int problems_remote_ = 0;
};

/// A worker's loop: receives batches, solves them with `solver` and sends
/// the answers back, until the stop message. An error when a message cannot
/// be read or sent (the scheduler's side then fails its batch too).
Status ServeWindowBatches(const std::function<Result<std::string>()>& receive,
                          const std::function<Status(const std::string&)>& send, WindowSolver& solver);

// ---- The wire format (CBOR through nlohmann-json), exposed for tests ----

std::string EncodeWindowBatch(const std::vector<const WindowProblem*>& problems, const SolverOptions& options);
struct DecodedWindowBatch {
  bool stop = false;  // the stop message (no problems)
  std::vector<WindowProblem> problems;
  SolverOptions options;
};
/// An error naming the field when the bytes are not a batch or stop message.
Result<DecodedWindowBatch> DecodeWindowBatch(const std::string& bytes);
std::string EncodeWindowStop();
std::string EncodeWindowAnswers(const std::vector<Result<WindowSolution>>& answers);
Result<std::vector<Result<WindowSolution>>> DecodeWindowAnswers(const std::string& bytes);

}  // namespace concerto
