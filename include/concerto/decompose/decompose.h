// Decomposition: where a synchronous activation collective has nothing
// independent to hide behind (a tensor/sequence-parallel all-reduce,
// reduce-scatter or all-gather sitting between two matmuls), cut the matmul
// next to it and the collective into chunks along a dimension the collective
// leaves alone, so chunk i communicates while chunk i+1 computes. Applied only
// where the cost model says the chunked pipeline finishes earlier.
// docs/decompose.md.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "concerto/cost/cost_model.h"
#include "concerto/ir/ir.h"
#include "concerto/util/option_record.h"
#include "concerto/util/status.h"

namespace concerto {

struct DecomposeOptions {
  /// Largest number of chunks tried (2..max_chunks, dividing the chunked
  /// dimension); below 2 the pass does nothing.
  int max_chunks = 4;
  /// When > 0: chunk every eligible collective into exactly this many chunks,
  /// whatever the cost model says (tests; `--decompose-force`).
  int force_chunks = 0;
  /// A rewrite must save at least this much on its local estimate.
  double min_gain_us = 1.0;
  /// Compute slowdown while communication is in flight, for the estimate;
  /// negative: the cluster's value (as the simulator).
  double interference = -1;
  /// Only all-gathers and reduce-scatters (sequence parallelism), the
  /// collectives TransformerEngine's userbuffers overlap chunks.
  bool gather_scatter_only = false;
  /// With force_chunks: when it does not divide the dimension, the largest
  /// chunk count below it that does (down to 2) instead of skipping.
  bool force_at_most = false;
};
/// The option records of DecomposeOptions (util/option_record.h): decompose.
/// (Its interference is the simulation's, set by the driver.)
const std::vector<OptionRecord<DecomposeOptions>>& DecomposeOptionRecords();

/// One rewrite: collective `collective` of graph `graph` and the matmul(s)
/// next to it now run as `chunks` chunks along dimension `dim`.
struct Decomposition {
  std::string graph;
  std::string collective;  // the original collective's name
  std::string side;        // "producer" (matmul -> collective) or "consumer" (all_gather -> matmuls)
  int chunks = 0;
  int dim = 0;
  /// The cost model's estimate of the pair (matmul + exposed collective) on
  /// the graph's first rank, before and after.
  double estimated_before_us = 0;
  double estimated_after_us = 0;
  /// The collective's exposed time in the measured input schedule (when
  /// given); the gain counted is at most this.
  double exposed_us = -1;
};

/// Exposed time of communication ops per graph name and op id, from a
/// simulated schedule of the input (report/report.h ExposedCommByOp).
using ExposureMap = std::map<std::string, std::map<int, double>>;

struct DecomposeReport {
  int candidates = 0;  // collectives with an eligible shape
  std::vector<Decomposition> rewrites;
  /// Set by the driver's global check (DecomposeWherePays): the fifo
  /// schedule's simulated makespan before and after, and whether the
  /// rewrites were dropped because they did not pay in the whole program.
  double fifo_before_us = 0;
  double fifo_after_us = 0;
  bool rejected = false;
  /// Why: "fifo is not faster", or "over the memory budget" (the chunks'
  /// slices and joins took a program that fitted over it).
  std::string rejected_reason;
  /// Set by the driver: concerto's schedule is of the program before these
  /// rewrites (its search started there: the chunked program's free list
  /// schedule did not fit the memory budget; docs/concerto.md step 1).
  bool superseded = false;
};

/// Rewrites every graph of `program`: each activation collective (tags.purpose
/// "activation") that is
///   - an all_reduce or reduce_scatter whose input comes from a matmul feeding
///     nothing else (producer side: slice the matmul's left operand, k matmuls,
///     k collectives, concat), or
///   - an all_gather whose output feeds matmuls as their left operand (consumer
///     side: slice the gather's input, k all_gathers, k matmuls per consumer,
///     concat; other consumers read the concat of the gathered chunks),
/// is chunked along the lowest leading dimension that the matmul keeps and the
/// collective does not scatter or gather, when its size divides into k and
/// the cost model's two-stage pipeline estimate saves at least min_gain_us.
/// Decisions depend only on the ops and the cost model, so SPMD ranks and
/// roles with identical ops decide alike. With `exposed`, a collective that
/// the input's schedule already hides (exposed < min_gain_us) is left alone
/// and the gain counted is at most its exposed time: chunking a collective
/// that overlaps other work only adds latency. Returns what changed.
Result<DecomposeReport> DecomposeCollectives(Program& program, const CostModel& cost,
                                             const DecomposeOptions& options,
                                             const ExposureMap* exposed = nullptr);

/// The report as one JSON object (the `decompose` object of `--json`).
nlohmann::json DecomposeReportJson(const DecomposeReport& report);

}  // namespace concerto
