// concerto_mpi_run: executes one rank of a lowered, scheduled program per MPI
// process. Usage:
//   mpirun -n N concerto_mpi_run --model gpt-tiny --plan dp=2 [--scheduler fifo]
//          [--check] [--timeout SECONDS]
// Every rank lowers and schedules the same program, creates the MPI
// communicators of all its groups up front, and runs its rank through the
// executor. With --check (decoder presets only) the ranks send their tensors
// to rank 0, which runs the unsharded reference in-process and compares the
// loss, the gradients and the updated parameters (CompareToReference).
// Exit code 0 on success, 1 on any error (printed with the rank).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "concerto/cost/cluster.h"
#include "concerto/cost/cost_model.h"
#include "concerto/lower/frontend.h"
#include "concerto/lower/plan.h"
#include "concerto/lower/transformer.h"
#include "concerto/runtime/executor.h"
#include "concerto/runtime/mpi_communicator.h"
#include "concerto/runtime/reference.h"
#include "concerto/schedule/scheduler.h"

namespace concerto {
namespace {

constexpr int kTensorsTag = 7;

struct Flags {
  std::string model;
  std::string plan;
  std::string scheduler = "fifo";
  bool check = false;
  double timeout_s = 60;
};

/// Parses the command line; an error names the bad argument.
Result<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](std::string* out) -> Status {
      if (i + 1 >= argc) return Status::Error("missing value after " + a);
      *out = argv[++i];
      return Status::Ok();
    };
    if (a == "--model") {
      CONCERTO_RETURN_IF_ERROR(value(&f.model));
    } else if (a == "--plan") {
      CONCERTO_RETURN_IF_ERROR(value(&f.plan));
    } else if (a == "--scheduler") {
      CONCERTO_RETURN_IF_ERROR(value(&f.scheduler));
    } else if (a == "--check") {
      f.check = true;
    } else if (a == "--timeout") {
      std::string t;
      CONCERTO_RETURN_IF_ERROR(value(&t));
      f.timeout_s = std::atof(t.c_str());
      if (f.timeout_s <= 0) return Status::Error("--timeout needs a positive number of seconds");
    } else {
      return Status::Error("unknown argument '" + a +
                           "' (usage: concerto_mpi_run --model M --plan P [--scheduler S] "
                           "[--check] [--timeout SECONDS])");
    }
  }
  if (f.model.empty() || f.plan.empty()) return Status::Error("--model and --plan are required");
  return f;
}

/// Appends a value's raw bytes.
template <typename T>
void Put(std::string* s, const T& v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

/// Serialises a rank's tensors (role, then name/values pairs).
std::string Pack(const RankTensors& t) {
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

/// Reads back what Pack wrote; an error on truncated input.
Result<RankTensors> Unpack(const std::string& s, int rank) {
  RankTensors t;
  t.rank = rank;
  size_t pos = 0;
  auto get = [&](void* out, size_t n) -> bool {
    if (pos + n > s.size()) return false;
    std::memcpy(out, s.data() + pos, n);
    pos += n;
    return true;
  };
  auto get_string = [&](std::string* out) -> bool {
    int64_t n = 0;
    if (!get(&n, sizeof n) || n < 0 || pos + n > s.size()) return false;
    out->assign(s.data() + pos, n);
    pos += n;
    return true;
  };
  int64_t count = 0;
  if (!get_string(&t.role) || !get(&count, sizeof count))
    return Status::Error("truncated tensors from rank " + std::to_string(rank));
  for (int64_t i = 0; i < count; ++i) {
    std::string name;
    int64_t n = 0;
    if (!get_string(&name) || !get(&n, sizeof n) || n < 0)
      return Status::Error("truncated tensors from rank " + std::to_string(rank));
    std::vector<float> v(n);
    if (!get(v.data(), sizeof(float) * n))
      return Status::Error("truncated tensors from rank " + std::to_string(rank));
    t.values.emplace(std::move(name), std::move(v));
  }
  return t;
}

/// The layouts of the decoder frontend's fused tensors for `m`.
std::vector<SegmentedLayout> Layouts(const ModelConfig& m) {
  const int64_t d = m.hidden / m.heads;
  return {FusedQkvLayout(m.hidden, int64_t{m.kv_heads} * d)};
}

/// On rank 0: gathers every rank's tensors, runs the unsharded reference in
/// this process and compares. Other ranks send their tensors and return Ok.
Result<std::string> Check(MpiCommunicator& comm, const Flags& flags, const ModelConfig& model,
                          const ScheduledProgram& sp, const CostModel& cost,
                          const RunOptions& options, RankTensors mine) {
  if (comm.rank() != 0) {
    CONCERTO_RETURN_IF_ERROR(comm.SendBytes(Pack(mine), 0, kTensorsTag));
    return std::string();
  }
  RunResult run;
  run.ranks.resize(comm.size());
  run.ranks[0] = std::move(mine);
  for (int r = 1; r < comm.size(); ++r) {
    Result<std::string> bytes = comm.RecvBytes(r, kTensorsTag);
    if (!bytes.ok()) return bytes.status();
    Result<RankTensors> t = Unpack(*bytes, r);
    if (!t.ok()) return t.status();
    run.ranks[r] = std::move(t).value();
  }
  Result<ParallelPlan> plan = ParsePlan(flags.plan);
  if (!plan.ok()) return plan.status();
  ModelConfig ref_model = model;
  ref_model.batch = model.batch * plan->dp;
  ParallelPlan ref_plan;
  ref_plan.microbatches = plan->microbatches;
  Result<Program> ref_program = LowerTransformer(ref_model, ref_plan);
  if (!ref_program.ok()) return Status::Error("reference: " + ref_program.status().message());
  Result<ScheduledProgram> ref_sp = RunBaseline("fifo", *ref_program, cost);
  if (!ref_sp.ok()) return Status::Error("reference: " + ref_sp.status().message());
  Result<RunResult> ref_run = RunInProcess(*ref_sp, options);
  if (!ref_run.ok()) return Status::Error("reference run: " + ref_run.status().message());
  Result<ReferenceReport> report =
      CompareToReference(*ref_sp, *ref_run, sp, run, Tolerance{}, options.init.layouts);
  if (!report.ok()) return report.status();
  return report->Summary();
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
  if (!flags.ok()) return fail(flags.status().message());
  Result<Program> program = LowerModelPlan(flags->model, flags->plan);
  if (!program.ok()) return fail(program.status().message());
  if (program->mesh.NumRanks() != comm.size())
    return fail("the plan '" + flags->plan + "' needs " + std::to_string(program->mesh.NumRanks()) +
                " ranks, mpirun started " + std::to_string(comm.size()));
  Result<ClusterSpec> cluster = LoadCluster("a800-4x8");
  if (!cluster.ok()) return fail(cluster.status().message());
  const AnalyticCostModel cost(*cluster);
  Result<ScheduledProgram> sp = RunBaseline(flags->scheduler, *program, cost);
  if (!sp.ok()) return fail(sp.status().message());
  if (Status st = CheckRunnable(*sp); !st.ok()) return fail(st.message());

  RunOptions options;
  options.timeout_s = flags->timeout_s;
  Result<ModelConfig> model = ModelPreset(flags->model);
  if (model.ok()) options.init.layouts = Layouts(*model);
  if (flags->check && !model.ok())
    return fail("--check needs a decoder preset (" + model.status().message() + ")");

  if (Status st = comm.CreateGroups(CollectAllGroups(*program)); !st.ok()) return fail(st.message());
  Result<RankRun> run = RunRank(*sp, comm, options);
  if (!run.ok()) return fail(run.status().message());
  if (!flags->check) {
    if (rank == 0)
      std::printf("mpi run done: %s %s %s on %d ranks\n", flags->model.c_str(), flags->plan.c_str(),
                  flags->scheduler.c_str(), comm.size());
    return 0;
  }
  Result<std::string> summary =
      Check(comm, *flags, *model, *sp, cost, options, std::move(run->tensors));
  if (!summary.ok()) return fail("mpi check failed: " + summary.status().message());
  if (rank == 0)
    std::printf("mpi check passed: %s %s %s on %d ranks: %s\n", flags->model.c_str(),
                flags->plan.c_str(), flags->scheduler.c_str(), comm.size(), summary->c_str());
  return 0;
}

}  // namespace
}  // namespace concerto

int main(int argc, char** argv) { return concerto::Main(argc, argv); }
