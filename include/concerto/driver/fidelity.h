// Fidelity against published measurements (docs/validation.md): a table of
// figures other people measured on real clusters (nccl-tests bus bandwidths,
// GEMM throughputs, end-to-end training throughputs), each with the machine
// and configuration it was measured on, and the model's prediction of each.
// `concerto fidelity` prints the table; validation_test checks that no
// prediction moved from what docs/validation.md says.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "concerto/driver/driver.h"
#include "concerto/ir/ir.h"
#include "concerto/util/status.h"

namespace concerto {

/// What a row measured.
enum class PublishedKind { kCollective, kGemm, kTraining };
/// "collective", "gemm", "training".
std::string_view ToString(PublishedKind kind);

/// One published figure and the configuration it was measured on.
struct PublishedRow {
  std::string id;      // unique in the table
  PublishedKind kind = PublishedKind::kCollective;
  std::string origin;  // short name of the source (distinct sources are counted by it)
  std::string source;  // where it was published: URL, table, what the figure is
  std::string cluster; // preset or cluster file (relative to the table's folder)
  int nodes = 0;       // > 0: the cluster scaled to this many nodes
  /// busbw_gbps or time_us (collective); tflops (gemm); tflops_per_gpu
  /// (training, Megatron's flop count 96 B s l h^2 (1 + s/6h + V/16lh), which
  /// assumes full recomputation), tokens_per_s_per_gpu or step_time_s (training).
  std::string metric;
  double published = 0;
  std::string note;    // what the measured run did that the model does not, or other context
  // collective: nccl-tests' "size" (all_reduce, reduce_scatter: the input;
  // all_gather: the output; all_to_all: the send buffer) over the first `ranks` ranks
  CollectiveType collective = CollectiveType::kAllReduce;
  int ranks = 0;
  int64_t bytes = 0;
  // gemm: C[m,n] = A[m,k] B[k,n]
  int64_t m = 0, n = 0, k = 0;
  DType dtype = DType::kBF16;
  // training: a model (preset or file relative to the table) under a plan,
  // scheduled with a baseline (the system the run used)
  std::string model;
  int64_t micro_batch = 0;  // > 0: the model's batch (sequences per micro-batch and rank) replaced
  std::string plan;
  std::string scheduler;
  int64_t global_batch = 0;  // sequences per step, checked against the model and plan
};

/// A row with the model's prediction.
struct FidelityRow {
  PublishedRow row;
  double predicted = 0;     // in row.metric's unit
  double error = 0;         // predicted / published - 1
  double step_us = 0;       // the simulated step (training) or op (collective, gemm) time
  bool fits_memory = true;  // training: the schedule's peak fits the device's memory budget
  int64_t peak_memory_bytes = 0;
  int gpus = 0;             // training: ranks of the program
};

/// The table's rows with predictions, and the summary figures.
struct FidelityReport {
  std::vector<FidelityRow> rows;
  int sources = 0;               // distinct origins
  double median_abs_error = 0;   // over all rows, |error|
  double max_abs_error = 0;
  std::string max_error_row;
  int over_memory = 0;           // training rows whose schedule does not fit (each counts as a miss)
};

/// Reads a table of published rows (YAML: `rows:` a list of maps). Errors name
/// the file, the row (its id or index) and the field: an unknown kind, metric,
/// collective or field, a missing field, a duplicate id, a non-positive size.
/// Relative cluster and model paths resolve against the table's folder.
Result<std::vector<PublishedRow>> LoadPublishedTable(const std::string& path);
/// The same from text; `source` names it in errors, `dir` resolves paths.
Result<std::vector<PublishedRow>> ParsePublishedTable(const std::string& text, const std::string& source,
                                                      const std::string& dir);

/// Predicts one row on the analytic cost model of its cluster: a collective's
/// time over the first `ranks` ranks (nccl-tests' bus bandwidth factors), a
/// GEMM's time, or a training step lowered from the model and plan, scheduled
/// by the row's baseline and simulated (memory included).
Result<FidelityRow> PredictPublished(const PublishedRow& row);

/// Every row predicted, with the summary; `progress` gets one line per row.
Result<FidelityReport> PredictPublishedTable(const std::vector<PublishedRow>& rows,
                                             const ProgressFn& progress = nullptr);

/// `concerto fidelity --json`: rows (id, kind, origin, metric, published,
/// predicted, error_percent, ...) and the summary.
nlohmann::json FidelityReportJson(const FidelityReport& report);
/// The rows as the Markdown table of docs/validation.md.
std::string FidelityMarkdown(const FidelityReport& report);

}  // namespace concerto
