// MpiCommunicator: the Communicator interface over MPI, one process per
// rank. The only file of the project that includes mpi.h. Collectives start
// a nonblocking MPI collective on the group's communicator (issued under the
// group's mutex, so concurrent stream threads issue in a defined order) and
// poll it until done, a timeout, or a local abort. Send/recv use a
// duplicate of MPI_COMM_WORLD with the program's tags; SendBytes/RecvBytes
// another duplicate.
#include "concerto/runtime/mpi_communicator.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wcast-function-type"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include <mpi.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

namespace concerto {

namespace {

using Clock = std::chrono::steady_clock;

/// The text of an MPI error code.
std::string MpiErrorString(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(buf, len);
}

/// FNV-1a over a list of groups (the CreateGroups agreement check).
uint64_t HashGroups(const std::vector<std::vector<int>>& groups) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](int64_t v) {
    for (int b = 0; b < 8; ++b) {
      h ^= static_cast<uint64_t>((v >> (8 * b)) & 0xff);
      h *= 1099511628211ull;
    }
  };
  mix(static_cast<int64_t>(groups.size()));
  for (const auto& g : groups) {
    mix(static_cast<int64_t>(g.size()));
    for (int r : g) mix(r);
  }
  return h;
}

/// One group's communicator and the mutex its calls are issued under.
struct GroupComm {
  MPI_Comm comm = MPI_COMM_NULL;
  std::mutex mu;
};

}  // namespace

struct MpiCommunicator::Impl {
  MpiOptions options;
  int rank = 0;
  int size = 1;
  int tag_ub = 32767;
  bool initialized_here = false;
  std::atomic<bool> aborted{false};
  std::atomic<bool> request_leaked{false};  // a timed-out request is still pending
  MPI_Comm p2p = MPI_COMM_NULL;    // the program's send/recv
  MPI_Comm bytes = MPI_COMM_NULL;  // SendBytes/RecvBytes
  std::map<std::vector<int>, std::unique_ptr<GroupComm>> groups;  // fixed after CreateGroups

  /// "rank R: <what>: <msg>".
  Status Error(const std::string& what, const std::string& msg) const {
    return Status::Error("rank " + std::to_string(rank) + ": " + what + ": " + msg);
  }

  /// Polls `req` until it completes, the timeout passes, or this rank aborts.
  Status Wait(MPI_Request* req, const std::string& what, MPI_Status* status = nullptr) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(options.timeout_s));
    MPI_Status local;
    MPI_Status* st = status ? status : &local;
    for (int spins = 0;; ++spins) {
      int flag = 0;
      const int rc = MPI_Test(req, &flag, st);
      if (rc != MPI_SUCCESS) return Error(what, MpiErrorString(rc));
      if (flag) return Status::Ok();
      if (aborted) {
        request_leaked = true;
        return Error(what, "aborted");
      }
      if (Clock::now() > deadline) {
        request_leaked = true;
        std::ostringstream s;
        s << "timed out after " << options.timeout_s << " s";
        return Error(what, s.str());
      }
      if (spins < 200) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(spins < 2000 ? 20 : 200));
      }
    }
  }

  /// The communicator of `group` (created by CreateGroups), checking that
  /// the group holds this rank.
  Result<GroupComm*> Find(const std::vector<int>& group, const std::string& what) {
    if (std::find(group.begin(), group.end(), rank) == group.end())
      return Error(what, "invalid group " + GroupString(group) + " (does not hold the calling rank)");
    auto it = groups.find(group);
    if (it == groups.end() || it->second->comm == MPI_COMM_NULL)
      return Error(what, "group " + GroupString(group) +
                             " has no MPI communicator (not in the list given to CreateGroups)");
    return it->second.get();
  }

  /// Runs one collective: checks sizes, copies an aliased input aside,
  /// issues `start` under the group's mutex, waits outside it.
  Status Collective(const std::vector<int>& group, const std::string& what, const float* in,
                    int64_t in_count, float* out, int64_t out_count,
                    const std::function<int(const float*, MPI_Comm, MPI_Request*)>& start) {
    if (aborted) return Error(what, "aborted");
    if (in_count > INT_MAX || out_count > INT_MAX || in_count < 0 || out_count < 0)
      return Error(what, "count out of MPI's int range");
    Result<GroupComm*> gc = Find(group, what);
    if (!gc.ok()) return gc.status();
    std::vector<float> copy;
    const float* src = in;
    if (in_count > 0 && in < out + out_count && out < in + in_count) {  // overlapping buffers
      copy.assign(in, in + in_count);
      src = copy.data();
    }
    MPI_Request req = MPI_REQUEST_NULL;
    {
      std::lock_guard<std::mutex> lock((*gc)->mu);
      const int rc = start(src, (*gc)->comm, &req);
      if (rc != MPI_SUCCESS) return Error(what, MpiErrorString(rc));
    }
    return Wait(&req, what);
  }
};

/// "all_reduce (sum) of 128 floats on group [0, 1]".
static std::string Describe(const char* kind, const std::vector<int>& group, int64_t count,
                            const ReduceOp* op = nullptr) {
  std::string s = kind;
  if (op) s += std::string(" (") + std::string(ToString(*op)) + ")";
  return s + " of " + std::to_string(count) + " floats on group " + GroupString(group);
}

Result<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Create(int* argc, char*** argv,
                                                                 MpiOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = 0;
  if (!initialized) {
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      return Status::Error("MPI_Init_thread failed");
    impl->initialized_here = true;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    if (impl->initialized_here) MPI_Finalize();
    return Status::Error("MPI provides thread level " + std::to_string(provided) +
                         ", the runtime needs MPI_THREAD_MULTIPLE (" +
                         std::to_string(MPI_THREAD_MULTIPLE) + ")");
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &impl->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &impl->size);
  int* ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &found);
  if (found && ub) impl->tag_ub = *ub;
  MPI_Comm_dup(MPI_COMM_WORLD, &impl->p2p);
  MPI_Comm_dup(MPI_COMM_WORLD, &impl->bytes);
  MPI_Comm_set_errhandler(impl->p2p, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(impl->bytes, MPI_ERRORS_RETURN);
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(std::move(impl)));
}

MpiCommunicator::MpiCommunicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MpiCommunicator::~MpiCommunicator() {
  if (impl_->aborted || impl_->request_leaked) return;  // MPI cannot be shut down cleanly
  for (auto& [group, gc] : impl_->groups)
    if (gc->comm != MPI_COMM_NULL) MPI_Comm_free(&gc->comm);
  MPI_Comm_free(&impl_->p2p);
  MPI_Comm_free(&impl_->bytes);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (impl_->initialized_here && !finalized) MPI_Finalize();
}

Status MpiCommunicator::CreateGroups(const std::vector<std::vector<int>>& groups) {
  Impl& s = *impl_;
  // Every rank must create the same communicators in the same order.
  const uint64_t h = HashGroups(groups);
  uint64_t lo = h, hi = h;
  if (MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS ||
      MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS)
    return s.Error("create groups", "MPI_Allreduce failed");
  if (lo != hi)
    return s.Error("create groups", "ranks disagree on the list of groups (different programs?)");
  for (const auto& group : groups) {
    const bool sorted = std::adjacent_find(group.begin(), group.end(),
                                           [](int a, int b) { return a >= b; }) == group.end();
    if (group.empty() || !sorted || group.front() < 0 || group.back() >= s.size)
      return s.Error("create groups", "invalid group " + GroupString(group) +
                                          " (must be ascending and in [0, " +
                                          std::to_string(s.size) + "))");
    const bool member = std::binary_search(group.begin(), group.end(), s.rank);
    MPI_Comm comm = MPI_COMM_NULL;
    // key = global rank: the communicator's ranks are the group's order.
    const int rc = MPI_Comm_split(MPI_COMM_WORLD, member ? 0 : MPI_UNDEFINED, s.rank, &comm);
    if (rc != MPI_SUCCESS)
      return s.Error("create group " + GroupString(group), MpiErrorString(rc));
    if (!member) continue;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    auto& slot = s.groups[group];
    if (!slot) slot = std::make_unique<GroupComm>();
    if (slot->comm != MPI_COMM_NULL) MPI_Comm_free(&slot->comm);  // listed twice
    slot->comm = comm;
  }
  return Status::Ok();
}

void MpiCommunicator::SetTimeout(double timeout_s) { impl_->options.timeout_s = timeout_s; }

int MpiCommunicator::rank() const { return impl_->rank; }
int MpiCommunicator::size() const { return impl_->size; }

Status MpiCommunicator::AllReduce(const std::vector<int>& group, ReduceOp op, const float* in,
                                  float* out, int64_t count) {
  const MPI_Op mop = op == ReduceOp::kSum ? MPI_SUM : MPI_MAX;
  return impl_->Collective(group, Describe("all_reduce", group, count, &op), in, count, out, count,
                           [&](const float* src, MPI_Comm comm, MPI_Request* req) {
                             return MPI_Iallreduce(src, out, static_cast<int>(count), MPI_FLOAT,
                                                   mop, comm, req);
                           });
}

Status MpiCommunicator::AllGather(const std::vector<int>& group, const float* in, float* out,
                                  int64_t count) {
  const int64_t n = static_cast<int64_t>(group.size());
  return impl_->Collective(group, Describe("all_gather", group, count), in, count, out, n * count,
                           [&](const float* src, MPI_Comm comm, MPI_Request* req) {
                             return MPI_Iallgather(src, static_cast<int>(count), MPI_FLOAT, out,
                                                   static_cast<int>(count), MPI_FLOAT, comm, req);
                           });
}

Status MpiCommunicator::ReduceScatter(const std::vector<int>& group, ReduceOp op, const float* in,
                                      float* out, int64_t count) {
  const int64_t n = static_cast<int64_t>(group.size());
  const MPI_Op mop = op == ReduceOp::kSum ? MPI_SUM : MPI_MAX;
  return impl_->Collective(group, Describe("reduce_scatter", group, count, &op), in, n * count, out,
                           count, [&](const float* src, MPI_Comm comm, MPI_Request* req) {
                             return MPI_Ireduce_scatter_block(src, out, static_cast<int>(count),
                                                              MPI_FLOAT, mop, comm, req);
                           });
}

Status MpiCommunicator::AllToAll(const std::vector<int>& group, const float* in, float* out,
                                 int64_t chunk) {
  const int64_t n = static_cast<int64_t>(group.size());
  return impl_->Collective(group, Describe("all_to_all", group, chunk), in, n * chunk, out,
                           n * chunk, [&](const float* src, MPI_Comm comm, MPI_Request* req) {
                             return MPI_Ialltoall(src, static_cast<int>(chunk), MPI_FLOAT, out,
                                                  static_cast<int>(chunk), MPI_FLOAT, comm, req);
                           });
}

Status MpiCommunicator::Broadcast(const std::vector<int>& group, const float* in, float* out,
                                  int64_t count) {
  const bool root = !group.empty() && group.front() == impl_->rank;
  return impl_->Collective(group, Describe("broadcast", group, count), in, count, out, count,
                           [&](const float* src, MPI_Comm comm, MPI_Request* req) {
                             if (root && src != out)
                               std::memcpy(out, src, sizeof(float) * count);
                             return MPI_Ibcast(out, static_cast<int>(count), MPI_FLOAT, 0, comm,
                                               req);
                           });
}

Status MpiCommunicator::Send(const float* data, int64_t count, int peer, int tag) {
  Impl& s = *impl_;
  const std::string what = "send of " + std::to_string(count) + " floats to rank " +
                           std::to_string(peer) + " tag " + std::to_string(tag);
  if (peer < 0 || peer >= s.size || peer == s.rank) return s.Error(what, "invalid peer");
  if (tag < 0 || tag > s.tag_ub) return s.Error(what, "tag outside MPI's [0, " + std::to_string(s.tag_ub) + "]");
  if (count < 0 || count > INT_MAX) return s.Error(what, "count out of MPI's int range");
  if (s.aborted) return s.Error(what, "aborted");
  MPI_Request req = MPI_REQUEST_NULL;
  const int rc = MPI_Issend(data, static_cast<int>(count), MPI_FLOAT, peer, tag, s.p2p, &req);
  if (rc != MPI_SUCCESS) return s.Error(what, MpiErrorString(rc));
  return s.Wait(&req, what);
}

Status MpiCommunicator::Recv(float* data, int64_t count, int peer, int tag) {
  Impl& s = *impl_;
  const std::string what = "recv of " + std::to_string(count) + " floats from rank " +
                           std::to_string(peer) + " tag " + std::to_string(tag);
  if (peer < 0 || peer >= s.size || peer == s.rank) return s.Error(what, "invalid peer");
  if (tag < 0 || tag > s.tag_ub) return s.Error(what, "tag outside MPI's [0, " + std::to_string(s.tag_ub) + "]");
  if (count < 0 || count > INT_MAX) return s.Error(what, "count out of MPI's int range");
  if (s.aborted) return s.Error(what, "aborted");
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = MPI_Irecv(data, static_cast<int>(count), MPI_FLOAT, peer, tag, s.p2p, &req);
  if (rc != MPI_SUCCESS) return s.Error(what, MpiErrorString(rc));
  MPI_Status status;
  Status st = s.Wait(&req, what, &status);
  if (!st.ok()) return st;
  int got = 0;
  MPI_Get_count(&status, MPI_FLOAT, &got);
  if (got != count)
    return s.Error(what, "size mismatch: the send has " + std::to_string(got) +
                             " floats, the recv expects " + std::to_string(count));
  return Status::Ok();
}

void MpiCommunicator::Abort(const std::string& reason) {
  impl_->aborted = true;
  std::fprintf(stderr, "rank %d aborts the MPI job: %s\n", impl_->rank, reason.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

bool MpiCommunicator::aborted() const { return impl_->aborted; }

Status MpiCommunicator::SendBytes(const std::string& bytes, int peer, int tag) {
  Impl& s = *impl_;
  const std::string what = "send of " + std::to_string(bytes.size()) + " bytes to rank " +
                           std::to_string(peer);
  if (peer < 0 || peer >= s.size || peer == s.rank) return s.Error(what, "invalid peer");
  if (bytes.size() > static_cast<size_t>(INT_MAX)) return s.Error(what, "message too large");
  MPI_Request req = MPI_REQUEST_NULL;
  const int rc = MPI_Isend(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, peer, tag,
                           s.bytes, &req);
  if (rc != MPI_SUCCESS) return s.Error(what, MpiErrorString(rc));
  return s.Wait(&req, what);
}

Result<std::string> MpiCommunicator::RecvBytes(int peer, int tag) {
  Impl& s = *impl_;
  const std::string what = "recv of bytes from rank " + std::to_string(peer);
  if (peer < 0 || peer >= s.size || peer == s.rank) return s.Error(what, "invalid peer");
  // Poll for the message (MPI_Iprobe) under the same timeout as every call.
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(s.options.timeout_s));
  MPI_Status status;
  for (;;) {
    int flag = 0;
    const int rc = MPI_Iprobe(peer, tag, s.bytes, &flag, &status);
    if (rc != MPI_SUCCESS) return s.Error(what, MpiErrorString(rc));
    if (flag) break;
    if (Clock::now() > deadline) return s.Error(what, "timed out");
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  int n = 0;
  MPI_Get_count(&status, MPI_BYTE, &n);
  std::string bytes(static_cast<size_t>(n), '\0');
  MPI_Request req = MPI_REQUEST_NULL;
  const int rc = MPI_Irecv(bytes.data(), n, MPI_BYTE, peer, tag, s.bytes, &req);
  if (rc != MPI_SUCCESS) return s.Error(what, MpiErrorString(rc));
  Status st = s.Wait(&req, what);
  if (!st.ok()) return st;
  return bytes;
}

std::vector<std::vector<int>> CollectAllGroups(const Program& program) {
  std::set<std::vector<int>> groups;
  std::vector<int> world(program.mesh.NumRanks());
  for (int r = 0; r < static_cast<int>(world.size()); ++r) world[r] = r;
  groups.insert(world);
  for (const Role& role : program.roles) {
    const Graph& graph = program.GraphOf(role);
    for (const Op& op : graph.ops) {
      if (op.kind != OpKind::kCollective) continue;
      for (int r : role.ranks) {
        std::vector<int> g = GroupRanks(program.mesh, op.group, r);
        if (!g.empty()) groups.insert(std::move(g));
      }
    }
  }
  return {groups.begin(), groups.end()};
}

}  // namespace concerto
