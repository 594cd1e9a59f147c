// The MPI backend of the Communicator interface: one process per rank,
// launched by mpirun. Only src/runtime/mpi_communicator.cc includes mpi.h;
// this header is plain C++ so that code which never touches MPI can include
// it. docs/runtime.md ("Running over MPI") describes launch and semantics.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "concerto/ir/ir.h"
#include "concerto/runtime/communicator.h"
#include "concerto/util/status.h"

namespace concerto {

struct MpiOptions {
  /// How long a collective or send/recv waits for its peers before it
  /// fails (the request is polled; MPI itself has no timeouts).
  double timeout_s = 30;
};

/// One process's endpoint of the MPI world (MPI_COMM_WORLD ranks are the
/// program's global ranks).
///
/// Sub-communicators: one per group, created up front by CreateGroups,
/// which every rank calls with the same list (CollectAllGroups of the same
/// program). A collective on a group that was not created is an error.
///
/// Matching: the k-th collective a rank issues on a group meets the k-th of
/// every other member, as in FakeWorld. Several stream threads may use one
/// group: each call starts its nonblocking MPI collective while holding
/// that group's mutex (so issue order on the communicator is well defined,
/// as MPI requires) and then waits for it outside the mutex. Different
/// groups and send/recv run fully concurrently (MPI_THREAD_MULTIPLE).
///
/// Differences from FakeWorld: sums are MPI's (MPI_SUM on MPI_FLOAT; Open
/// MPI gives every member the same bits, but the order of additions is
/// MPI's, not necessarily ascending rank order); members that disagree on
/// the operation or size are not diagnosed by name (MPI reports a
/// truncation error or the call times out); after a timeout the MPI request
/// stays pending, so the caller must Abort (the executor does). Abort calls
/// MPI_Abort, which ends every process of the job.
class MpiCommunicator : public Communicator {
 public:
  /// Initialises MPI with MPI_THREAD_MULTIPLE (unless it already is) and
  /// returns this process's endpoint. Errors: MPI was initialised with or
  /// only provides a lower thread level.
  static Result<std::unique_ptr<MpiCommunicator>> Create(int* argc, char*** argv,
                                                         MpiOptions options = {});
  /// Frees the communicators and finalises MPI if Create initialised it
  /// (not after Abort or a timed-out request).
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  /// Creates one communicator per group in `groups` (each ascending and in
  /// range), collectively over the whole world: every rank must call it
  /// with the same list (checked with a hash; a difference is an error on
  /// every rank). Groups this rank is not in cost one MPI_Comm_split each.
  Status CreateGroups(const std::vector<std::vector<int>>& groups);

  /// Changes how long later calls wait for their peers (MpiOptions::timeout_s;
  /// tools parse their flags after MPI_Init). Call before any stream runs.
  void SetTimeout(double timeout_s);

  int rank() const override;
  int size() const override;

  Status AllReduce(const std::vector<int>& group, ReduceOp op, const float* in, float* out,
                   int64_t count) override;
  Status AllGather(const std::vector<int>& group, const float* in, float* out,
                   int64_t count) override;
  Status ReduceScatter(const std::vector<int>& group, ReduceOp op, const float* in, float* out,
                       int64_t count) override;
  Status AllToAll(const std::vector<int>& group, const float* in, float* out,
                  int64_t chunk) override;
  Status Broadcast(const std::vector<int>& group, const float* in, float* out,
                   int64_t count) override;
  /// A synchronous send (MPI_Issend): returns once the matching recv started.
  Status Send(const float* data, int64_t count, int peer, int tag) override;
  Status Recv(float* data, int64_t count, int peer, int tag) override;

  /// Prints "rank R aborts the MPI job: <reason>" to stderr and calls
  /// MPI_Abort on the world (does not return).
  void Abort(const std::string& reason) override;
  /// Whether this process called Abort (other ranks' aborts end this process).
  bool aborted() const override;

  /// Sends an arbitrary byte string to `peer` on a communicator of its own
  /// (no interference with the program's tags); for tools, e.g. gathering
  /// results on rank 0 after a run.
  Status SendBytes(const std::string& bytes, int peer, int tag);
  /// Receives a byte string sent with SendBytes from `peer` with `tag`.
  Result<std::string> RecvBytes(int peer, int tag);

  struct Impl;  // MPI handles (src/runtime/mpi_communicator.cc)

 private:
  explicit MpiCommunicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Every group any rank of `program` uses: the groups of every collective of
/// every role's graph as each of the role's ranks sees them (GroupRanks),
/// plus the whole world (the executor's start barrier); deduplicated and
/// sorted, so every rank computes the same list.
std::vector<std::vector<int>> CollectAllGroups(const Program& program);

}  // namespace concerto
