// The mpirun launcher of `concerto run` and `concerto profile`: builds the
// mpirun command line the runtime needs (TCP over loopback, yielding while
// idle, glibc malloc thresholds; docs/runtime.md "Launching") and runs it
// through a ProcessRunner, so the command line is unit-tested with a fake
// runner and only the caller decides to start real processes.
#pragma once

#include <string>
#include <vector>

#include "concerto/util/status.h"

namespace concerto {

/// What to launch: `ranks` copies of `worker` with `worker_args`.
struct MpirunSpec {
  std::string mpirun = "mpirun";
  int ranks = 2;
  /// Adds --allow-run-as-root (OpenMPI refuses root otherwise).
  bool as_root = false;
  /// Network interface for MPI's TCP traffic and its out-of-band channel.
  std::string interface = "lo";
  std::string worker;  // path of concerto_mpi_run
  std::vector<std::string> worker_args;
};

/// The full argv: mpirun --oversubscribe -n N, btl tcp,self over
/// `interface`, mpi_yield_when_idle 1 (OpenMPI busy-polls otherwise and
/// steals the core from computation), MALLOC_MMAP_THRESHOLD_ and
/// MALLOC_TRIM_THRESHOLD_ exported (OpenMPI's allreduce reallocates its
/// temporary buffer every call; with glibc's default thresholds each
/// allocation is a fresh mmap, about 10x slower for 64 MB), then the worker
/// and its arguments. Errors: ranks < 1, empty worker.
Result<std::vector<std::string>> MpirunCommand(const MpirunSpec& spec);

/// `argv` as one shell-quoted line (for messages and --dry-run).
std::string ShellJoin(const std::vector<std::string>& argv);

/// Starts processes. A fake records the command lines in tests.
class ProcessRunner {
 public:
  virtual ~ProcessRunner() = default;
  /// Runs argv[0] (searched on PATH) with stdin/stdout/stderr inherited and
  /// waits for it. Returns its exit code; a child killed by signal S gives
  /// 128 + S. An error only when it could not be started.
  virtual Result<int> Run(const std::vector<std::string>& argv) = 0;
};

/// fork + execvp + waitpid. The child runs in its own process group; a SIGTERM, SIGINT or SIGHUP
/// the launcher gets meanwhile is passed on to that whole group (SIGKILL after 10 s), and Run
/// returns 128 + that signal once the child is gone, so the caller can clean up and exit.
class SubprocessRunner : public ProcessRunner {
 public:
  Result<int> Run(const std::vector<std::string>& argv) override;
};

/// The arguments of one concerto_mpi_run job (see its usage line).
struct WorkerRequest {
  std::string program_file;   // required
  std::string schedule_file;  // required
  std::string model, plan;    // with check: name the unsharded reference
  bool check = false;
  std::string cluster;        // cost model for the measured summary ("" = worker default)
  std::string profile;
  int iterations = 1;
  int warmup = 0;
  std::string trace;
  bool json = false;
  double timeout_s = 60;
  std::string fail_op, kill_op;  // fault injection (empty: none)
  int fail_rank = -1, kill_rank = -1;
  /// Where each rank keeps its flight record (FlightRecorder; empty: none).
  std::string status_dir;
};

/// concerto_mpi_run's argv (after the binary) for `request`.
std::vector<std::string> WorkerArgs(const WorkerRequest& request);

/// Builds the mpirun command for `request` on `spec` (whose worker_args are
/// replaced), runs it through `runner` and returns mpirun's exit code
/// (non-zero when any rank failed or died).
Result<int> LaunchWorker(MpirunSpec spec, const WorkerRequest& request, ProcessRunner& runner);

/// One torch-engine job (`concerto run --engine torch`): torchrun starting
/// `python -m concerto.train` once per rank on a scheduled program.
struct TorchrunSpec {
  std::string python;         // the interpreter with torch 2.x (FindTorchPython)
  int ranks = 1;              // processes on this machine (--nproc-per-node)
  std::string program_file;   // the scheduled program and its schedule
  std::string schedule_file;
  std::string model;          // the preset or model file it was lowered from ("" = none; its fused layouts)
  int steps = 1;
  std::string device;         // "" = the engine's default (cuda when present)
  bool json = false;
};

/// The command line of `spec`: PYTHON -m torch.distributed.run --standalone
/// --nproc-per-node N -m concerto.train --program P --schedule S --steps K ...
std::vector<std::string> TorchrunCommand(const TorchrunSpec& spec);

/// The interpreter the torch engine runs on: $CONCERTO_TORCH_PYTHON when
/// set, else the venv scripts/setup_torch.sh makes ($HOME/.cache/concerto/
/// torch-venv/bin/python) when it exists, else an error saying how to get one.
Result<std::string> FindTorchPython();

/// The directory of the running executable (readlink /proc/self/exe).
Result<std::string> SelfExeDir();

/// `dir`/concerto_mpi_run when it exists and is executable; otherwise an
/// error naming the path (and that the build found no MPI).
Result<std::string> FindMpiWorker(const std::string& dir);

/// Whether this process runs as root (mpirun then needs --allow-run-as-root).
bool RunningAsRoot();

}  // namespace concerto
