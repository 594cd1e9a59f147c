// The mpirun command line and the process runner behind it.
#include "concerto/runtime/launcher.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <climits>
#include <cstring>

namespace concerto {

Result<std::vector<std::string>> MpirunCommand(const MpirunSpec& spec) {
  if (spec.ranks < 1) return Status::Error("mpirun: need at least 1 rank, got " + std::to_string(spec.ranks));
  if (spec.worker.empty()) return Status::Error("mpirun: no worker binary given");
  std::vector<std::string> argv = {spec.mpirun};
  if (spec.as_root) argv.push_back("--allow-run-as-root");
  const std::vector<std::string> fixed = {
      "--oversubscribe", "-n", std::to_string(spec.ranks),
      "--mca", "btl", "tcp,self",
      "--mca", "btl_tcp_if_include", spec.interface,
      "--mca", "oob_tcp_if_include", spec.interface,
      "--mca", "mpi_yield_when_idle", "1",
      "-x", "MALLOC_MMAP_THRESHOLD_=2000000000",
      "-x", "MALLOC_TRIM_THRESHOLD_=4000000000"};
  argv.insert(argv.end(), fixed.begin(), fixed.end());
  argv.push_back(spec.worker);
  argv.insert(argv.end(), spec.worker_args.begin(), spec.worker_args.end());
  return argv;
}

std::string ShellJoin(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& a : argv) {
    if (!out.empty()) out += ' ';
    const bool plain = !a.empty() && a.find_first_not_of(
                                         "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                         "0123456789_-./=,:+@%") == std::string::npos;
    if (plain) {
      out += a;
      continue;
    }
    out += '\'';
    for (char c : a) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    out += '\'';
  }
  return out;
}

std::vector<std::string> WorkerArgs(const WorkerRequest& r) {
  std::vector<std::string> a = {"--program", r.program_file, "--schedule", r.schedule_file};
  if (r.check) a.insert(a.end(), {"--model", r.model, "--plan", r.plan, "--check"});
  if (!r.cluster.empty()) a.insert(a.end(), {"--cluster", r.cluster});
  if (!r.profile.empty()) a.insert(a.end(), {"--profile", r.profile});
  a.insert(a.end(), {"--iterations", std::to_string(r.iterations), "--warmup", std::to_string(r.warmup)});
  if (!r.trace.empty()) a.insert(a.end(), {"--trace", r.trace});
  if (r.json) a.push_back("--json");
  char timeout[32];
  std::snprintf(timeout, sizeof timeout, "%g", r.timeout_s);
  a.insert(a.end(), {"--timeout", timeout});
  if (!r.fail_op.empty()) a.insert(a.end(), {"--fail-op", r.fail_op, "--fail-rank", std::to_string(r.fail_rank)});
  if (!r.kill_op.empty()) a.insert(a.end(), {"--kill-op", r.kill_op, "--kill-rank", std::to_string(r.kill_rank)});
  if (!r.status_dir.empty()) a.insert(a.end(), {"--status-dir", r.status_dir});
  return a;
}

Result<int> LaunchWorker(MpirunSpec spec, const WorkerRequest& request, ProcessRunner& runner) {
  if (request.program_file.empty() || request.schedule_file.empty())
    return Status::Error("launch: the worker needs a program file and a schedule file");
  spec.worker_args = WorkerArgs(request);
  Result<std::vector<std::string>> argv = MpirunCommand(spec);
  if (!argv.ok()) return argv.status();
  return runner.Run(*argv);
}

namespace {

// The running child's process group, and the signal the launcher was asked to stop with (the
// handlers below; one child at a time).
volatile sig_atomic_t g_child_group = 0;
volatile sig_atomic_t g_stop_signal = 0;

/// SIGTERM/SIGINT/SIGHUP while a child runs: passed on to the child's whole process group
/// (mpirun or torchrun and the ranks they started), so stopping the launcher stops the job.
void ForwardStop(int sig) {
  g_stop_signal = sig;
  if (g_child_group > 0) kill(-static_cast<pid_t>(g_child_group), sig);
}

}  // namespace

Result<int> SubprocessRunner::Run(const std::vector<std::string>& argv) {
  if (argv.empty()) return Status::Error("no command to run");
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return Status::Error("cannot start '" + argv[0] + "': " + std::strerror(errno));
  if (pid == 0) {
    setpgid(0, 0);  // its own process group: the launcher stops all of it at once
    execvp(args[0], args.data());
    // Only reached when exec failed; 127 is the shell's "command not found".
    const std::string msg = "cannot run '" + argv[0] + "': " + std::strerror(errno) + "\n";
    (void)!write(2, msg.data(), msg.size());
    _exit(127);
  }
  setpgid(pid, pid);  // also here: whichever runs first, the group exists before a signal is passed on
  g_stop_signal = 0;
  g_child_group = pid;
  struct sigaction forward {}, old_term {}, old_int {}, old_hup {};
  forward.sa_handler = ForwardStop;
  sigemptyset(&forward.sa_mask);
  sigaction(SIGTERM, &forward, &old_term);
  sigaction(SIGINT, &forward, &old_int);
  sigaction(SIGHUP, &forward, &old_hup);
  int status = 0;
  int waited_ms = 0;
  Status failed = Status::Ok();
  for (;;) {
    // Once asked to stop, the group gets 10 s to end (mpirun passes SIGTERM on to its ranks),
    // then SIGKILL.
    const pid_t r = waitpid(pid, &status, g_stop_signal ? WNOHANG : 0);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) {
      failed = Status::Error("waiting for '" + argv[0] + "': " + std::strerror(errno));
      break;
    }
    if (g_stop_signal && r == 0) {
      if (waited_ms >= 10000) kill(-pid, SIGKILL);
      usleep(100 * 1000);
      waited_ms += 100;
    }
  }
  g_child_group = 0;
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGHUP, &old_hup, nullptr);
  if (!failed.ok()) return failed;
  if (g_stop_signal) return 128 + g_stop_signal;  // the caller cleans up and exits with it
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

Result<std::string> SelfExeDir() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return Status::Error(std::string("cannot read /proc/self/exe: ") + std::strerror(errno));
  std::string path(buf, n);
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

Result<std::string> FindMpiWorker(const std::string& dir) {
  const std::string path = dir + "/concerto_mpi_run";
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || access(path.c_str(), X_OK) != 0)
    return Status::Error(path +
                         ": not found or not executable (it is built next to `concerto` only when "
                         "CMake finds MPI; use --in-process to run without MPI)");
  return path;
}

bool RunningAsRoot() { return geteuid() == 0; }

std::vector<std::string> TorchrunCommand(const TorchrunSpec& spec) {
  std::vector<std::string> argv = {spec.python, "-m", "torch.distributed.run", "--standalone",
                                   "--nproc-per-node", std::to_string(spec.ranks), "-m", "concerto.train",
                                   "--program", spec.program_file, "--schedule", spec.schedule_file,
                                   "--steps", std::to_string(spec.steps)};
  if (!spec.model.empty()) argv.insert(argv.end(), {"--model-layouts", spec.model});
  if (!spec.device.empty()) argv.insert(argv.end(), {"--device", spec.device});
  if (spec.json) argv.push_back("--json");
  return argv;
}

Result<std::string> FindTorchPython() {
  if (const char* env = std::getenv("CONCERTO_TORCH_PYTHON"); env != nullptr && *env != '\0') {
    if (access(env, X_OK) != 0)
      return Status::Error(std::string("CONCERTO_TORCH_PYTHON=") + env + " is not an executable interpreter");
    return std::string(env);
  }
  const char* home = std::getenv("HOME");
  const std::string venv = std::string(home ? home : "") + "/.cache/concerto/torch-venv/bin/python";
  if (home != nullptr && access(venv.c_str(), X_OK) == 0) return venv;
  return Status::Error("--engine torch needs Python with torch 2.x: run scripts/setup_torch.sh (it makes " + venv +
                       ") or set CONCERTO_TORCH_PYTHON to an interpreter that has torch");
}

}  // namespace concerto
