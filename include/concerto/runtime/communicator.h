// The runtime's communication interface: blocking collectives and
// point-to-point messages on fp32 buffers, called by a rank's stream threads.
// An MPI backend (src/runtime/mpi_communicator.cc, the only file that will
// include mpi.h) or a CUDA-stream + NCCL backend implements the same
// interface; FakeWorld is an in-process world of N ranks (threads) for tests
// and single-machine runs. docs/runtime.md describes the semantics.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "concerto/ir/ir.h"
#include "concerto/util/status.h"

namespace concerto {

/// One rank's endpoint. Every collective takes the group as an explicit list
/// of global ranks, ascending and containing the caller (GroupRanks in
/// ir.h); the k-th call a rank makes on a group meets the k-th call of every
/// other member (docs/architecture.md, the machine model). Calls block until
/// the operation is complete on this rank; they may be made concurrently by
/// several threads of one rank, on different groups or peers. Input and
/// output buffers may be the same (in place) unless stated otherwise. Every
/// call returns an error (never hangs forever) when a member does not arrive
/// in time, when members disagree on the operation or size, or after Abort.
class Communicator {
 public:
  virtual ~Communicator() = default;

  /// This endpoint's global rank.
  virtual int rank() const = 0;
  /// Number of ranks in the world.
  virtual int size() const = 0;

  /// out = the elementwise `op` of every member's `in` (count floats each).
  /// Sums are taken in ascending rank order, so every member gets the same bits.
  virtual Status AllReduce(const std::vector<int>& group, ReduceOp op, const float* in, float* out,
                           int64_t count) = 0;
  /// out (n * count floats) = the members' `in` (count floats each)
  /// concatenated in group order.
  virtual Status AllGather(const std::vector<int>& group, const float* in, float* out,
                           int64_t count) = 0;
  /// The elementwise `op` of the members' `in` (n * count floats each) is cut
  /// into n blocks of count floats; member i gets block i in `out`.
  virtual Status ReduceScatter(const std::vector<int>& group, ReduceOp op, const float* in,
                               float* out, int64_t count) = 0;
  /// `in` (n * chunk floats) is cut into n chunks; chunk j goes to member j;
  /// `out` (n * chunk floats) holds the chunks from members 0..n-1 in order.
  virtual Status AllToAll(const std::vector<int>& group, const float* in, float* out,
                          int64_t chunk) = 0;
  /// out = the `in` of the group's lowest rank (the root), count floats.
  virtual Status Broadcast(const std::vector<int>& group, const float* in, float* out,
                           int64_t count) = 0;
  /// Sends count floats to `peer`; returns when the matching Recv (same
  /// source, destination and tag, k-th with k-th) has taken them.
  virtual Status Send(const float* data, int64_t count, int peer, int tag) = 0;
  /// Receives count floats from `peer` with `tag`.
  virtual Status Recv(float* data, int64_t count, int peer, int tag) = 0;

  /// Stops the whole job: every pending and later call on every rank returns
  /// an error carrying `reason` (an MPI backend calls MPI_Abort).
  virtual void Abort(const std::string& reason) = 0;
  /// Whether Abort was called on any rank of the world (best effort).
  virtual bool aborted() const = 0;
};

struct FakeWorldOptions {
  /// How long a rank waits for the other members of a collective (or the
  /// other end of a send/recv) before the call fails, naming rank and op.
  double timeout_s = 30;
};

/// An in-process world of `size` ranks whose endpoints are used by threads
/// of one process. Collectives rendezvous per (group, k-th call on that
/// group); sends rendezvous with their recv. Results are deterministic:
/// reductions run in ascending rank order on every member.
class FakeWorld {
 public:
  explicit FakeWorld(int size, FakeWorldOptions options = {});
  ~FakeWorld();
  FakeWorld(const FakeWorld&) = delete;
  FakeWorld& operator=(const FakeWorld&) = delete;

  int size() const;
  /// The endpoint of `rank` (owned by the world; 0 <= rank < size).
  Communicator& endpoint(int rank);
  /// The reason given to the first Abort, or "" when none.
  std::string abort_reason() const;

  struct State;  // shared rendezvous state (src/runtime/fake_communicator.cc)

 private:
  std::unique_ptr<State> state_;
  std::vector<std::unique_ptr<Communicator>> endpoints_;
};

/// "[0, 1, 4]": a group as written in messages.
std::string GroupString(const std::vector<int>& group);

}  // namespace concerto
