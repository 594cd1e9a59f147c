// A per-rank flight recorder (docs/runtime.md, "Faults"): which op each
// stream of an MPI rank is running, kept in a small file mapped into the
// process (MAP_SHARED), so the record survives the process being killed
// (SIGKILL, a crash, the OOM killer). concerto_mpi_run writes one per rank
// (--status-dir); `concerto run` reads them after a failed job and names the
// rank that died and the op it died in, and the op every survivor was in.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "concerto/ir/ir.h"
#include "concerto/util/status.h"

namespace concerto {

/// A rank's life cycle as recorded.
enum class RankState : int32_t {
  kStarting = 1,    // the recorder exists, the steps have not started
  kRunning = 2,     // running steps
  kDone = 3,        // every step finished
  kFailed = 4,      // a clean error (printed by the rank itself)
  kTerminated = 5,  // SIGTERM arrived (mpirun stopping the job after another rank died)
};

class FlightRecorder {
 public:
  /// Creates (truncates) `path`, maps it and records kStarting for `rank`.
  /// Errors: the file cannot be created or mapped; more than kMaxStreams.
  static Result<std::unique_ptr<FlightRecorder>> Create(const std::string& path, int rank, int streams);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  static constexpr int kMaxStreams = 64;

  /// Stream `stream` starts op `op_index` / has no op in flight. Lock-free
  /// stores into the mapping; each stream thread writes only its own slot.
  void Begin(int stream, int op_index);
  void End(int stream);
  void SetState(RankState state);

  /// Installs a SIGTERM handler that records kTerminated in this recorder
  /// and then dies of SIGTERM as before (async-signal-safe). One recorder
  /// per process.
  void RecordTermination();

  struct Layout;

 private:
  FlightRecorder(Layout* layout, int fd);
  Layout* layout_;
  int fd_;
};

/// What a recorder file holds.
struct RankFlightRecord {
  int rank = -1;
  RankState state = RankState::kStarting;
  std::vector<std::pair<int, int>> in_flight;  // (stream, op index)
};

/// Reads a recorder file. Errors: missing, truncated, or not a recorder file.
Result<RankFlightRecord> ReadFlightRecord(const std::string& path);

/// `dir`/rank-R.flight: where rank R's recorder lives.
std::string FlightRecordPath(const std::string& dir, int rank);

/// One paragraph about a failed job, from every rank's record (a rank
/// without a file is said to have died before it started): the ranks that
/// died (recorded as starting or running, never told to stop) and the op
/// each was in, the ranks that failed with their own error, and the ops the
/// ranks stopped by mpirun were in, e.g. "rank 1 died in op 12 'L0.mlp.fc1'
/// (stream compute); rank 0 was stopped by mpirun in op 57
/// 'L1.grad.all_reduce' (stream comm)".
std::string DescribeFailedJob(const Program& program, const std::vector<Result<RankFlightRecord>>& records);

}  // namespace concerto
