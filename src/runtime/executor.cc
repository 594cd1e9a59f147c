// The executor: per rank one thread per stream, ops in schedule order,
// cross-stream (and same-stream) dependencies as waits on per-op completion
// flags, collectives and send/recv through a Communicator, every op's
// measured start and end recorded into the simulator's Timeline type.
#include "concerto/runtime/executor.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <chrono>
#include <condition_variable>
#include <climits>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <unistd.h>

#include "concerto/ir/graph_index.h"
#include "concerto/ir/verifier.h"
#include "concerto/runtime/kernels.h"

namespace concerto {

namespace {

using Clock = std::chrono::steady_clock;

/// Product of shape[begin:end].
int64_t Product(const std::vector<int64_t>& shape, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= shape[i];
  return p;
}

/// How one input/output pair of a gather-like collective splits: the pair
/// differs on dimension d; `outer` = product of the dims before d, `inner`
/// the dims after it, `len` the smaller tensor's size along d.
struct SplitDims {
  int64_t outer = 1, len = 0, inner = 1;
};

/// SplitDims of `small` (the per-member block) inside `big` (n blocks along
/// the first dimension where the shapes differ; dim 0 when they are equal).
SplitDims BlockDims(const Tensor& small, const Tensor& big) {
  size_t d = 0;
  while (d < small.shape.size() && small.shape[d] == big.shape[d]) ++d;
  if (d == small.shape.size()) d = 0;
  SplitDims s;
  if (small.shape.empty()) {
    s.len = 1;
    return s;
  }
  s.outer = Product(small.shape, 0, d);
  s.len = small.shape[d];
  s.inner = Product(small.shape, d + 1, small.shape.size());
  return s;
}

/// One rank's run of its role's graph under the schedule.
class RankExecutor {
 public:
  RankExecutor(const ScheduledProgram& sp, Communicator& comm, const RunOptions& options)
      : sp_(sp), mesh_(sp.program.mesh), comm_(comm), options_(options), rank_(comm.rank()) {}

  /// Resolves role, graph and schedule, allocates and initialises every
  /// tensor (once per session). On failure aborts the communicator.
  Status Init() {
    Status prepared = Prepare();
    if (!prepared.ok()) Fail(prepared);
    return prepared;
  }

  /// One step on the buffers as they are: start barrier, every stream
  /// thread, the records of this step. Graph inputs are never written by
  /// an op and every op overwrites its outputs, so every step computes the
  /// same values.
  Result<std::vector<OpRecord>> Step() {
    if (failed_) return Status::Error(error_);
    std::fill(done_.begin(), done_.end(), 0);
    records_.assign(graph_->ops.size(), OpRecord());
    LedgerReset();
    Status synced = StartTogether();
    if (!synced.ok()) return synced;
    std::vector<std::thread> threads;
    for (size_t s = 0; s < stream_ops_.size(); ++s) threads.emplace_back([this, s] { StreamLoop(s); });
    for (std::thread& t : threads) t.join();
    if (failed_) return Status::Error(error_);
    return records_;
  }

  /// The tensors as they are now (copied, or moved out when `take`).
  RankTensors Tensors(bool take) {
    RankTensors t;
    t.rank = rank_;
    t.role = role_ ? role_->name : "";
    if (!graph_) return t;
    for (size_t i = 0; i < graph_->tensors.size() && i < buffers_.size(); ++i)
      t.values.emplace(graph_->tensors[i].name, take ? std::move(buffers_[i]) : buffers_[i]);
    return t;
  }

 private:
  /// A barrier over every rank of the world, then time zero of this rank's
  /// records: all ranks start their streams (and their clocks) together.
  Status StartTogether() {
    std::vector<int> world(comm_.size());
    for (int r = 0; r < comm_.size(); ++r) world[r] = r;
    float token = 0;
    Status st = comm_.AllReduce(world, ReduceOp::kSum, &token, &token, 1);
    if (!st.ok()) return Status::Error("start barrier: " + st.message());
    epoch_ = Clock::now();
    return Status::Ok();
  }

  /// Resolves role, graph, schedule; allocates and initialises tensors.
  Status Prepare() {
    const Program& p = sp_.program;
    const int role_index = p.RoleOfRank(rank_);
    if (role_index < 0) return Status::Error("rank " + std::to_string(rank_) + " has no role");
    role_ = &p.roles[role_index];
    graph_ = &p.GraphOf(*role_);
    index_ = GraphIndex::Build(*graph_);
    const RoleSchedule* schedule = sp_.schedule.ForRole(role_->name);
    if (!schedule) return Status::Error("role '" + role_->name + "' has no schedule");
    stream_ops_.assign(graph_->streams.size(), {});
    scratch_.assign(graph_->streams.size(), KernelScratch{});
    staging_.assign(graph_->ops.size(), {});
    for (const StreamOrder& order : schedule->streams) {
      auto it = std::find(graph_->streams.begin(), graph_->streams.end(), order.stream);
      assert(it != graph_->streams.end());
      auto& ops = stream_ops_[it - graph_->streams.begin()];
      for (int id : order.op_ids) ops.push_back(index_.op.at(id));
    }
    done_.assign(graph_->ops.size(), 0);
    return AllocateAndInit();
  }

  /// One fp32 buffer per tensor; graph inputs filled by the initializer.
  Status AllocateAndInit() {
    buffers_.resize(graph_->tensors.size());
    for (size_t t = 0; t < graph_->tensors.size(); ++t) {
      buffers_[t].assign(graph_->tensors[t].NumElements(), 0.0f);
      if (index_.producer[t] >= 0) continue;
      CONCERTO_RETURN_IF_ERROR(FillGraphInput(*graph_, index_, static_cast<int>(t), mesh_, rank_,
                                              options_.init, buffers_[t].data()));
    }
    return Status::Ok();
  }

  /// Runs the ops of stream `s` in schedule order until done or failed.
  void StreamLoop(size_t s) {
    for (int op_index : stream_ops_[s]) {
      if (!WaitForPreds(op_index)) return;
      const Op& op = graph_->ops[op_index];
      if (options_.before_op) options_.before_op(rank_, op_index, op);
      const double start = Micros();
      LedgerAllocate(op);
      Status st = Execute(op, s);
      const double end = Micros();
      LedgerRelease(op);
      if (options_.after_op) options_.after_op(rank_, op_index, op, st.ok());
      if (!st.ok()) {
        Fail(Status::Error("rank " + std::to_string(rank_) + ": " + OpLabel(op) + ": " + st.message()));
        return;
      }
      records_[op_index] = OpRecord{rank_, op_index, static_cast<int>(s), start, end};
      std::lock_guard<std::mutex> lock(mu_);
      done_[op_index] = 1;
      cv_.notify_all();
    }
  }

  // ---- the allocation ledger ----------------------------------------------
  // The bytes this rank's device would hold in this run's real op order: a
  // tensor is allocated (its elements x its IR dtype's size) when its
  // producer starts and released when the last of its consumers ends; graph
  // inputs are held from the start, tensors nothing reads to the end. The
  // simulator's rule (sim/memory.h), applied to the events as they happen on
  // the stream threads. (The CPU buffers themselves stay allocated in fp32
  // for the reference check.)

  /// Every graph input held; every consumer count full.
  void LedgerReset() {
    std::lock_guard<std::mutex> lock(ledger_mu_);
    pending_.assign(graph_->tensors.size(), 0);
    allocated_.assign(graph_->tensors.size(), 0);
    live_bytes_ = 0;
    for (size_t t = 0; t < graph_->tensors.size(); ++t) {
      pending_[t] = static_cast<int>(index_.consumers[t].size());
      if (index_.producer[t] < 0) {
        allocated_[t] = 1;
        live_bytes_ += graph_->tensors[t].Bytes();
      }
    }
    peak_bytes_ = live_bytes_;
  }
  /// `op` starts: its outputs are allocated.
  void LedgerAllocate(const Op& op) {
    std::lock_guard<std::mutex> lock(ledger_mu_);
    for (const std::string& name : op.outputs) {
      const int t = index_.tensor.at(name);
      if (allocated_[t]) continue;
      allocated_[t] = 1;
      live_bytes_ += graph_->tensors[t].Bytes();
    }
    peak_bytes_ = std::max(peak_bytes_, live_bytes_);
  }
  /// `op` ended: an input it was the last consumer of is released.
  void LedgerRelease(const Op& op) {
    std::lock_guard<std::mutex> lock(ledger_mu_);
    std::vector<int> seen;
    for (const std::string& name : op.inputs) {
      const int t = index_.tensor.at(name);
      if (std::find(seen.begin(), seen.end(), t) != seen.end()) continue;
      seen.push_back(t);
      if (--pending_[t] == 0 && allocated_[t]) live_bytes_ -= graph_->tensors[t].Bytes();
    }
  }

 public:
  /// The largest number of bytes the ledger held during the last step.
  int64_t PeakMemoryBytes() const {
    std::lock_guard<std::mutex> lock(ledger_mu_);
    return peak_bytes_;
  }

 private:
  /// Microseconds since the epoch.
  double Micros() const {
    return std::chrono::duration<double, std::micro>(Clock::now() - epoch_).count();
  }

  /// Blocks until every predecessor of `op_index` is done; false on failure
  /// or abort anywhere in the job.
  bool WaitForPreds(int op_index) {
    std::unique_lock<std::mutex> lock(mu_);
    const std::vector<int>& preds = index_.preds[op_index];
    while (true) {
      if (failed_) return false;
      const bool ready =
          std::all_of(preds.begin(), preds.end(), [&](int p) { return done_[p] != 0; });
      if (ready) return true;
      if (comm_.aborted()) return false;
      cv_.wait_for(lock, std::chrono::milliseconds(50));
    }
  }

  /// Records the first failure and aborts the job.
  void Fail(const Status& st) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed_) error_ = st.message();
      failed_ = true;
      cv_.notify_all();
    }
    comm_.Abort(st.message());
  }

  /// The buffer of tensor `name`.
  std::vector<float>& Buffer(const std::string& name) { return buffers_[index_.tensor.at(name)]; }
  /// The IR description of tensor `name`.
  const Tensor& Meta(const std::string& name) const {
    return graph_->tensors[index_.tensor.at(name)];
  }

  /// Runs one op of any kind on stream `s`.
  Status Execute(const Op& op, size_t s) {
    if (rank_ == options_.fail_rank && op.name == options_.fail_op)
      return Status::Error("injected failure");
    switch (op.kind) {
      case OpKind::kCompute: return ExecCompute(op, s);
      case OpKind::kCopy: return ExecCopy(op);
      case OpKind::kCollective: return ExecCollective(op);
      case OpKind::kSend: return ExecSend(op);
      case OpKind::kRecv: return ExecRecv(op);
    }
    return Status::Error("unknown op kind");
  }

  /// A compute op through its kernel, with stream `s`'s scratch.
  Status ExecCompute(const Op& op, size_t s) {
    std::vector<KernelArg> in, out;
    for (const std::string& t : op.inputs) in.push_back({&Meta(t), Buffer(t).data()});
    for (const std::string& t : op.outputs) out.push_back({&Meta(t), Buffer(t).data()});
    return RunKernel(op, in, out, KernelContext{&mesh_, rank_, &scratch_[s]});
  }

  /// A copy op: output i = input i.
  Status ExecCopy(const Op& op) {
    for (size_t i = 0; i < op.inputs.size(); ++i) Buffer(op.outputs[i]) = Buffer(op.inputs[i]);
    return Status::Ok();
  }

  /// The inputs of `op` concatenated (flattened) into one buffer.
  std::vector<float>& PackInputs(const Op& op) {
    size_t total = 0;
    for (const std::string& t : op.inputs) total += Buffer(t).size();
    std::vector<float>& buf = Staging(op, 0, total);
    size_t offset = 0;
    for (const std::string& t : op.inputs) {
      const std::vector<float>& b = Buffer(t);
      std::memcpy(buf.data() + offset, b.data(), sizeof(float) * b.size());
      offset += b.size();
    }
    return buf;
  }
  /// Staging buffer `slot` (0: what the op sends, 1: what it receives) of
  /// communication op `op`, resized to `n` floats and kept over the steps, as
  /// DDP's and Megatron's gradient buckets are: a fused bucket of 67 MB packed
  /// into a fresh, growing vector on every step, then copied again by the
  /// communicator for the in-place call, spent 130 ms of reallocations and
  /// copies inside the collective's span (1209 ms where the link's rate gives
  /// 1078; docs/runtime.md, "Executor"). Only the op's own stream thread
  /// touches them.
  std::vector<float>& Staging(const Op& op, int slot, size_t n) {
    std::vector<float>& b = staging_[static_cast<size_t>(index_.op.at(op.id))][static_cast<size_t>(slot)];
    b.resize(n);
    return b;
  }
  /// Splits `buf` into the outputs of `op` in order.
  void UnpackOutputs(const Op& op, const std::vector<float>& buf) {
    size_t offset = 0;
    for (const std::string& t : op.outputs) {
      std::vector<float>& b = Buffer(t);
      std::memcpy(b.data(), buf.data() + offset, sizeof(float) * b.size());
      offset += b.size();
    }
  }

  /// A (possibly fused) collective over the op's group as seen from this rank.
  Status ExecCollective(const Op& op) {
    const std::vector<int> group = GroupRanks(mesh_, op.group, rank_);
    switch (op.collective) {
      case CollectiveType::kAllReduce:
      case CollectiveType::kBroadcast: return FlatCollective(op, group);
      case CollectiveType::kAllGather: return AllGather(op, group);
      case CollectiveType::kReduceScatter: return ReduceScatter(op, group);
      case CollectiveType::kAllToAll: return AllToAll(op, group);
    }
    return Status::Error("unknown collective");
  }

  /// all_reduce / broadcast: elementwise over the flattened pairs.
  Status FlatCollective(const Op& op, const std::vector<int>& group) {
    const bool reduce = op.collective == CollectiveType::kAllReduce;
    if (op.inputs.size() == 1) {  // no packing needed
      const std::vector<float>& in = Buffer(op.inputs[0]);
      float* out = Buffer(op.outputs[0]).data();
      const int64_t n = static_cast<int64_t>(in.size());
      return reduce ? comm_.AllReduce(group, op.reduce, in.data(), out, n)
                    : comm_.Broadcast(group, in.data(), out, n);
    }
    const std::vector<float>& send = PackInputs(op);
    const int64_t n = static_cast<int64_t>(send.size());
    std::vector<float>& recv = Staging(op, 1, send.size());  // apart: an in-place call would copy
    CONCERTO_RETURN_IF_ERROR(reduce ? comm_.AllReduce(group, op.reduce, send.data(), recv.data(), n)
                                    : comm_.Broadcast(group, send.data(), recv.data(), n));
    UnpackOutputs(op, recv);
    return Status::Ok();
  }

  /// all_gather: one flat gather of the concatenated inputs, then each
  /// output assembled from the members' blocks along its gathered dim.
  Status AllGather(const Op& op, const std::vector<int>& group) {
    const int64_t n = static_cast<int64_t>(group.size());
    const std::vector<float>& send = PackInputs(op);
    const int64_t block = static_cast<int64_t>(send.size());
    std::vector<float>& recv = Staging(op, 1, static_cast<size_t>(block * n));
    CONCERTO_RETURN_IF_ERROR(comm_.AllGather(group, send.data(), recv.data(), block));
    int64_t offset = 0;
    for (size_t p = 0; p < op.inputs.size(); ++p) {
      const SplitDims s = BlockDims(Meta(op.inputs[p]), Meta(op.outputs[p]));
      float* out = Buffer(op.outputs[p]).data();
      const int64_t run = s.len * s.inner;
      for (int64_t a = 0; a < s.outer; ++a)
        for (int64_t m = 0; m < n; ++m)
          std::memcpy(out + (a * n + m) * run, recv.data() + m * block + offset + a * run,
                      sizeof(float) * run);
      offset += s.outer * run;
    }
    return Status::Ok();
  }

  /// reduce_scatter: inputs rearranged so member m's blocks of every pair
  /// are contiguous, one flat reduce-scatter, then split per pair.
  Status ReduceScatter(const Op& op, const std::vector<int>& group) {
    const int64_t n = static_cast<int64_t>(group.size());
    int64_t block = 0;
    for (const std::string& t : op.outputs) block += Meta(t).NumElements();
    std::vector<float>& send = Staging(op, 0, static_cast<size_t>(block * n));
    std::vector<float>& recv = Staging(op, 1, static_cast<size_t>(block));
    int64_t offset = 0;
    for (size_t p = 0; p < op.inputs.size(); ++p) {
      const SplitDims s = BlockDims(Meta(op.outputs[p]), Meta(op.inputs[p]));
      const float* in = Buffer(op.inputs[p]).data();
      const int64_t run = s.len * s.inner;
      for (int64_t m = 0; m < n; ++m)
        for (int64_t a = 0; a < s.outer; ++a)
          std::memcpy(send.data() + m * block + offset + a * run, in + (a * n + m) * run,
                      sizeof(float) * run);
      offset += s.outer * run;
    }
    CONCERTO_RETURN_IF_ERROR(comm_.ReduceScatter(group, op.reduce, send.data(), recv.data(), block));
    UnpackOutputs(op, recv);
    return Status::Ok();
  }

  /// all_to_all: chunk j of every pair goes to member j; out = the chunks
  /// from members 0..n-1 in order, per pair.
  Status AllToAll(const Op& op, const std::vector<int>& group) {
    const int64_t n = static_cast<int64_t>(group.size());
    int64_t chunk = 0;  // per member, all pairs
    for (const std::string& t : op.inputs) chunk += Meta(t).NumElements() / n;
    std::vector<float>& send = Staging(op, 0, static_cast<size_t>(chunk * n));
    std::vector<float>& recv = Staging(op, 1, static_cast<size_t>(chunk * n));
    int64_t offset = 0;
    for (const std::string& t : op.inputs) {
      const int64_t c = Meta(t).NumElements() / n;
      const float* in = Buffer(t).data();
      for (int64_t j = 0; j < n; ++j)
        std::memcpy(send.data() + j * chunk + offset, in + j * c, sizeof(float) * c);
      offset += c;
    }
    CONCERTO_RETURN_IF_ERROR(comm_.AllToAll(group, send.data(), recv.data(), chunk));
    offset = 0;
    for (const std::string& t : op.outputs) {
      const int64_t c = Meta(t).NumElements() / n;
      float* out = Buffer(t).data();
      for (int64_t m = 0; m < n; ++m)
        std::memcpy(out + m * c, recv.data() + m * chunk + offset, sizeof(float) * c);
      offset += c;
    }
    return Status::Ok();
  }

  /// A send of the op's inputs (concatenated) to its peer.
  Status ExecSend(const Op& op) {
    const int peer = PeerRank(mesh_, op.peer, rank_);
    if (op.inputs.size() == 1) {
      const std::vector<float>& b = Buffer(op.inputs[0]);
      return comm_.Send(b.data(), static_cast<int64_t>(b.size()), peer, op.tag);
    }
    const std::vector<float>& buf = PackInputs(op);
    return comm_.Send(buf.data(), static_cast<int64_t>(buf.size()), peer, op.tag);
  }

  /// A recv from the op's peer, split into its outputs.
  Status ExecRecv(const Op& op) {
    const int peer = PeerRank(mesh_, op.peer, rank_);
    int64_t total = 0;
    for (const std::string& t : op.outputs) total += Meta(t).NumElements();
    if (op.outputs.size() == 1)
      return comm_.Recv(Buffer(op.outputs[0]).data(), total, peer, op.tag);
    std::vector<float>& buf = Staging(op, 1, static_cast<size_t>(total));
    CONCERTO_RETURN_IF_ERROR(comm_.Recv(buf.data(), total, peer, op.tag));
    UnpackOutputs(op, buf);
    return Status::Ok();
  }

  const ScheduledProgram& sp_;
  const Mesh& mesh_;
  Communicator& comm_;
  const RunOptions options_;  // a copy: callers may pass a temporary (the stream threads outlive it)
  Clock::time_point epoch_;
  int rank_;
  const Role* role_ = nullptr;
  const Graph* graph_ = nullptr;
  GraphIndex index_;
  std::vector<std::vector<int>> stream_ops_;  // per graph stream: op indices in order
  std::vector<KernelScratch> scratch_;         // per graph stream: kept over the steps
  std::vector<std::array<std::vector<float>, 2>> staging_;  // per op: send and receive staging (Staging)
  std::vector<std::vector<float>> buffers_;   // per tensor index
  mutable std::mutex ledger_mu_;              // the allocation ledger (LedgerReset)
  std::vector<int> pending_;                  // per tensor: consumers not yet ended
  std::vector<char> allocated_;               // per tensor: held now or earlier this step
  int64_t live_bytes_ = 0, peak_bytes_ = 0;
  std::vector<OpRecord> records_;             // per op index
  std::vector<char> done_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool failed_ = false;
  std::string error_;
};

/// The first `limit` lines of `lines`, joined, with a count of the rest.
std::string JoinLines(const std::vector<std::string>& lines, size_t limit) {
  std::string s;
  for (size_t i = 0; i < lines.size() && i < limit; ++i) s += "\n  " + lines[i];
  if (lines.size() > limit) s += "\n  (" + std::to_string(lines.size() - limit) + " more)";
  return s;
}

}  // namespace

const std::vector<float>* RankTensors::Find(const std::string& name) const {
  auto it = values.find(name);
  return it == values.end() ? nullptr : &it->second;
}

const RankTensors& ExecutionResult::Rank(int rank) const {
  assert(rank >= 0 && rank < static_cast<int>(ranks.size()));
  return ranks[rank];
}

double RuntimeMemoryLowerBoundBytes(const Program& program, int rank) {
  const int role = program.RoleOfRank(rank);
  if (role < 0) return 0;  // a rank without a role holds nothing (CheckRunnable names it)
  const Graph& g = program.GraphOf(program.roles[static_cast<size_t>(role)]);
  const GraphIndex index = GraphIndex::Build(g);
  auto bytes = [&](const std::string& name) {
    auto it = index.tensor.find(name);
    if (it == index.tensor.end()) return 0.0;
    const Tensor& t = g.tensors[it->second];
    const double width = t.dtype == DType::kI64 ? 8 : 4;  // floats computed in fp32
    return width * static_cast<double>(t.NumElements());
  };
  std::set<std::string> produced;
  for (const Op& op : g.ops) produced.insert(op.outputs.begin(), op.outputs.end());
  double inputs = 0;
  for (const Tensor& t : g.tensors)
    if (!produced.count(t.name)) inputs += bytes(t.name);
  double largest_op = 0;
  for (const Op& op : g.ops) {
    double own = 0;
    for (const std::string& name : op.outputs) own += bytes(name);
    for (const std::string& name : op.inputs)
      if (produced.count(name)) own += bytes(name);
    largest_op = std::max(largest_op, own);
  }
  return inputs + largest_op;
}

int64_t HostMemoryAvailableBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (meminfo >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : INT64_MAX;
}

int MaxRanksPerHost(int cores) { return std::max(64, 32 * std::max(cores, 1)); }

Status CheckHostRanks(const Program& program, int ranks, int cores) {
  if (cores <= 0) cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int limit = MaxRanksPerHost(cores);
  if (ranks <= limit) return Status::Ok();
  return Status::Error(fmt::format(
      "program '{}': {} ranks on this host of {} core(s) is more than the limit of {} (32 per core, at least 64): "
      "every rank is a process or thread the others wait for at each collective; run it across hosts (MPI), or "
      "simulate it (`concerto simulate`), or lower a smaller plan",
      program.name, ranks, cores, limit));
}

Status CheckHostMemory(const Program& program, const std::vector<int>& ranks, int64_t available_bytes) {
  if (ranks.empty()) return Status::Ok();
  double need = 0, most = 0;
  std::map<int, double> per_role;  // a role's ranks hold alike: its graph is walked once
  for (int r : ranks) {
    auto [at, fresh] = per_role.try_emplace(program.RoleOfRank(r), 0.0);
    if (fresh) at->second = RuntimeMemoryLowerBoundBytes(program, r);
    need += at->second;
    most = std::max(most, at->second);
  }
  const int64_t available = available_bytes > 0 ? available_bytes : HostMemoryAvailableBytes();
  if (need <= static_cast<double>(available)) return Status::Ok();
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  return Status::Error(fmt::format(
      "program '{}': {} rank(s) on this host need at least {:.2f} GiB of memory ({:.2f} GiB for the largest: its "
      "inputs, parameters and optimizer state, and its largest op's operands, in fp32), but {:.2f} GiB is "
      "available; run fewer ranks per host (MPI across machines) or a smaller model",
      program.name, ranks.size(), need / kGiB, most / kGiB, available / kGiB));
}

Status CheckRunnable(const ScheduledProgram& sp) {
  CONCERTO_RETURN_IF_ERROR(CheckProgram(sp.program, "program '" + sp.program.name + "'"));
  const std::vector<std::string> violations = VerifySchedule(sp.program, sp.schedule);
  if (!violations.empty())
    return Status::Error("schedule '" + sp.schedule.scheduler + "' is refused: it fails verification:" +
                         JoinLines(violations, 10));
  std::vector<std::string> unsupported;
  for (const Graph& g : sp.program.graphs) {
    const GraphIndex index = GraphIndex::Build(g);
    for (const Op& op : g.ops) {
      if (op.kind != OpKind::kCompute) continue;
      std::vector<const Tensor*> in, out;
      for (const std::string& t : op.inputs) in.push_back(&g.tensors[index.tensor.at(t)]);
      for (const std::string& t : op.outputs) out.push_back(&g.tensors[index.tensor.at(t)]);
      Status st = CheckKernel(op, in, out);
      if (!st.ok()) unsupported.push_back("graph '" + g.name + "': " + st.message());
    }
  }
  if (!unsupported.empty())
    return Status::Error("the runtime cannot execute " + std::to_string(unsupported.size()) +
                         " op(s):" + JoinLines(unsupported, 10));
  return Status::Ok();
}

class RankSession::Impl {
 public:
  Impl(const ScheduledProgram& sp, Communicator& comm, const RunOptions& options) : exec(sp, comm, options) {}
  RankExecutor exec;
  bool taken = false;
};

RankSession::RankSession(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RankSession::~RankSession() = default;

Result<std::unique_ptr<RankSession>> RankSession::Create(const ScheduledProgram& sp, Communicator& comm,
                                                         const RunOptions& options) {
  auto impl = std::make_unique<Impl>(sp, comm, options);
  CONCERTO_RETURN_IF_ERROR(impl->exec.Init());
  return std::unique_ptr<RankSession>(new RankSession(std::move(impl)));
}

Result<std::vector<OpRecord>> RankSession::Step() {
  assert(!impl_->taken && "RankSession::Step after TakeTensors");
  return impl_->exec.Step();
}

RankTensors RankSession::Tensors() const { return impl_->exec.Tensors(false); }

int64_t RankSession::PeakMemoryBytes() const { return impl_->exec.PeakMemoryBytes(); }

RankTensors RankSession::TakeTensors() {
  impl_->taken = true;
  return impl_->exec.Tensors(true);
}

Result<RankRun> RunRank(const ScheduledProgram& sp, Communicator& comm, const RunOptions& options) {
  Result<std::unique_ptr<RankSession>> session = RankSession::Create(sp, comm, options);
  if (!session.ok()) return session.status();
  Result<std::vector<OpRecord>> records = (*session)->Step();
  if (!records.ok()) return records.status();
  RankRun run;
  run.records = std::move(records).value();
  run.peak_memory_bytes = (*session)->PeakMemoryBytes();
  run.tensors = (*session)->TakeTensors();
  return run;
}

Timeline MakeMeasuredTimeline(const Program& program,
                              const std::vector<std::vector<OpRecord>>& per_rank) {
  Timeline tl;
  tl.representative = false;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    tl.ranks.push_back(static_cast<int>(r));
    const Graph& g = program.GraphOf(program.roles[program.RoleOfRank(static_cast<int>(r))]);
    std::vector<double> busy(g.streams.size(), 0.0);
    for (const OpRecord& rec : per_rank[r]) {
      tl.records.push_back(rec);
      tl.makespan_us = std::max(tl.makespan_us, rec.end_us);
      busy[rec.stream] += rec.end_us - rec.start_us;
    }
    for (size_t s = 0; s < g.streams.size(); ++s)
      tl.busy.push_back({static_cast<int>(r), g.streams[s], busy[s]});
  }
  return tl;
}

Result<ExecutionResult> RunInProcess(const ScheduledProgram& sp, const RunOptions& options) {
  return RunInProcessSteps(sp, options, 1);
}

Result<ExecutionResult> RunInProcessSteps(const ScheduledProgram& sp, const RunOptions& options, int steps,
                                    std::vector<std::vector<std::vector<OpRecord>>>* per_step) {
  if (steps < 1) return Status::Error("steps must be at least 1, got " + std::to_string(steps));
  CONCERTO_RETURN_IF_ERROR(CheckRunnable(sp));
  const int n = sp.program.mesh.NumRanks();
  std::vector<int> all_ranks(n);
  for (int r = 0; r < n; ++r) all_ranks[r] = r;
  CONCERTO_RETURN_IF_ERROR(CheckHostRanks(sp.program, n));
  CONCERTO_RETURN_IF_ERROR(CheckHostMemory(sp.program, all_ranks, options.host_memory_bytes));
  SetBlasThreads(options.blas_threads);
  FakeWorldOptions world_options;
  world_options.timeout_s = options.timeout_s;
  FakeWorld world(n, world_options);
  // Per rank: every step's records, and the tensors after the first step.
  std::vector<Status> status(n, Status::Ok());
  std::vector<std::vector<std::vector<OpRecord>>> records(n);
  std::vector<RankTensors> tensors(n);
  std::vector<int64_t> peaks(n, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      // Past CheckHostMemory's lower bound the host can still run out (the bound is not the
      // peak): an allocation that fails ends the job with an error, not the process.
      try {
        Result<std::unique_ptr<RankSession>> session = RankSession::Create(sp, world.endpoint(r), options);
        if (!session.ok()) {
          status[r] = session.status();
          return;
        }
        for (int i = 0; i < steps; ++i) {
          Result<std::vector<OpRecord>> step = (*session)->Step();
          if (!step.ok()) {
            status[r] = step.status();
            return;
          }
          records[r].push_back(std::move(step).value());
          peaks[r] = std::max(peaks[r], (*session)->PeakMemoryBytes());
          if (i == 0) tensors[r] = steps == 1 ? (*session)->TakeTensors() : (*session)->Tensors();
        }
      } catch (const std::bad_alloc&) {
        const std::string why = "rank " + std::to_string(r) + " ran out of host memory (program '" +
                                sp.program.name + "'): run fewer ranks per host or a smaller model";
        world.endpoint(r).Abort(why);
        status[r] = Status::Error(why);
      }
    });
  for (std::thread& t : threads) t.join();
  const std::string reason = world.abort_reason();
  if (!reason.empty()) return Status::Error(reason);
  for (int r = 0; r < n; ++r)
    if (!status[r].ok()) return status[r];
  ExecutionResult out;
  out.ranks = std::move(tensors);
  out.peak_memory_bytes = std::move(peaks);
  std::vector<std::vector<OpRecord>> last(n);
  for (int r = 0; r < n; ++r) last[r] = records[r].back();
  out.timeline = MakeMeasuredTimeline(sp.program, last);
  if (per_step) {
    per_step->assign(steps, std::vector<std::vector<OpRecord>>(n));
    for (int i = 0; i < steps; ++i)
      for (int r = 0; r < n; ++r) (*per_step)[i][r] = std::move(records[r][i]);
  }
  return out;
}

}  // namespace concerto
