// The discrete-event simulator: runs a ScheduledProgram on a cost model with
// the machine model of docs/architecture.md (streams in order, cross-stream
// waits, collective rendezvous, send/recv pairing, optional interference).
#pragma once

#include <string>
#include <vector>

#include "concerto/cost/cost_model.h"
#include "concerto/ir/graph_index.h"
#include "concerto/schedule/schedule.h"
#include "concerto/util/option_record.h"
#include "concerto/util/status.h"

namespace concerto {

struct SimOptions {
  /// Compute slowdown while a collective is in flight on the same rank;
  /// negative means "take the cluster's value".
  double interference = -1;
  /// Simulate every rank even when one representative per role is exact.
  bool all_ranks = false;
  /// Shared links (docs/cost-model.md, "Shared links"): -1 takes the
  /// cluster's topology.share_links, 0 prices every transfer alone, 1 shares.
  int share_links = -1;
};
/// The option records of SimOptions (util/option_record.h): interference, share-links.
const std::vector<OptionRecord<SimOptions>>& SimOptionRecords();

struct OpRecord {
  int rank = 0;
  int op_index = 0;  // index into the rank's graph ops
  int stream = 0;    // index into the graph's streams
  double start_us = 0;
  double end_us = 0;
};

struct RankStreamStats {
  int rank = 0;
  std::string stream;
  double busy_us = 0;
};

struct Timeline {
  std::vector<int> ranks;  // the ranks simulated
  bool representative = false;  // one rank per role stood for its role
  std::vector<OpRecord> records;  // one per (simulated rank, op)
  double makespan_us = 0;
  std::vector<RankStreamStats> busy;
  /// Ops on the critical path, first to last, as indices into records.
  std::vector<int> critical_path;
  /// Time communication ops of the simulated ranks ran longer than their
  /// priced duration because transfers in flight together shared links.
  double link_sharing_delay_us = 0;
};

/// Simulates `sp` (whose schedule must pass VerifySchedule). Returns an error
/// naming the stuck ops when the run deadlocks (a mismatched collective
/// order, an unmatched send).
Result<Timeline> Simulate(const ScheduledProgram& sp, const CostModel& cost,
                          const SimOptions& options = {});

/// The same with the index of every graph of the program already built (one
/// per graph, in the program's order), for callers that simulate one program
/// several times or also need the indexes themselves.
Result<Timeline> Simulate(const ScheduledProgram& sp, const CostModel& cost, const SimOptions& options,
                          const std::vector<GraphIndex>& indexes);

}  // namespace concerto
