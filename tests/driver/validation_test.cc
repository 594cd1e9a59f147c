// Fidelity against published measurements (driver/fidelity.h,
// docs/validation.md). The table of examples/validation/published.yaml is
// predicted again and every prediction compared with the one docs/validation.md
// states: a model change that moves a figure by more than 2% fails here, so the
// document is regenerated (`concerto fidelity --markdown`) and the move is seen.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "concerto/driver/fidelity.h"

namespace concerto {
namespace {

constexpr char kTable[] = "examples/validation/published.yaml";
constexpr char kDoc[] = "docs/validation.md";

/// The rows of docs/validation.md's table: id -> predicted.
std::map<std::string, double> DocPredictions(std::string* summary) {
  std::ifstream in(kDoc);
  std::map<std::string, double> out;
  std::string line;
  // | id | kind | metric | published | predicted | error | source |
  const std::regex row(R"(^\| ([a-z0-9.\-]+) \| (collective|gemm|training) \| [a-z_]+ \| [-0-9.e+]+ \| ([-0-9.e+]+) \|)");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, row)) out[m[1]] = std::stod(m[3]);
    if (line.find(" rows from ") != std::string::npos && line.find("median |error|") != std::string::npos)
      *summary = line;
  }
  return out;
}

TEST(Validation, DocsStateEveryPredictionWithinTwoPercent) {
  Result<std::vector<PublishedRow>> rows = LoadPublishedTable(kTable);
  ASSERT_TRUE(rows.ok()) << rows.status().message();
  Result<FidelityReport> report = PredictPublishedTable(*rows);
  ASSERT_TRUE(report.ok()) << report.status().message();
  std::string summary;
  const std::map<std::string, double> doc = DocPredictions(&summary);
  ASSERT_FALSE(doc.empty()) << kDoc << " has no table rows";
  for (const FidelityRow& r : report->rows) {
    auto it = doc.find(r.row.id);
    if (it == doc.end()) {
      ADD_FAILURE() << r.row.id << ": not in " << kDoc << " (regenerate: concerto fidelity --markdown)";
      continue;
    }
    EXPECT_NEAR(r.predicted / it->second, 1.0, 0.02)
        << r.row.id << ": predicted " << r.predicted << ", " << kDoc << " says " << it->second
        << " (regenerate the table: concerto fidelity --markdown)";
  }
  EXPECT_EQ(doc.size(), report->rows.size()) << kDoc << " lists rows the table does not have";
  // The acceptance's size: at least 15 rows from at least 4 sources.
  EXPECT_GE(report->rows.size(), 15u);
  EXPECT_GE(report->sources, 4);
  // The summary line states the same median and maximum (to 0.5 points).
  std::smatch m;
  ASSERT_TRUE(std::regex_search(summary, m, std::regex(R"(median \|error\| ([0-9.]+)%, max ([0-9.]+)%)")))
      << "no summary line in " << kDoc;
  EXPECT_NEAR(std::stod(m[1]), 100 * report->median_abs_error, 0.5);
  EXPECT_NEAR(std::stod(m[2]), 100 * report->max_abs_error, 0.5);
}

// One collective by hand. a100-dgx, 8 ranks in one node, ring all-reduce of
// S = 8 GiB: 2 (n-1) = 14 steps of alpha 3.4 us, transfer 2 (n-1)/n S / B =
// 1.75 x 8589934592 B / 216 GB/s = 69592.1 us; time 69639.7 us; algbw =
// S / time = 123.35 GB/s; nccl-tests busbw = algbw x 1.75 = 215.86 GB/s.
TEST(Validation, CollectiveBusBandwidthByHand) {
  Result<std::vector<PublishedRow>> rows = ParsePublishedTable(R"(rows:
  - id: ar
    kind: collective
    origin: test
    source: by hand
    cluster: a100-dgx
    nodes: 1
    collective: all_reduce
    ranks: 8
    bytes: 8589934592
    metric: busbw_gbps
    published: 230
)", "t.yaml", "");
  ASSERT_TRUE(rows.ok()) << rows.status().message();
  Result<FidelityRow> r = PredictPublished(rows->front());
  ASSERT_TRUE(r.ok()) << r.status().message();
  const double time_us = 14 * 3.4 + 1.75 * 8589934592.0 / 216e3;
  EXPECT_NEAR(r->step_us, time_us, 1e-6 * time_us);
  EXPECT_NEAR(r->predicted, 8589934592.0 / (time_us * 1e3) * 1.75, 1e-6);
  EXPECT_NEAR(r->error, r->predicted / 230 - 1, 1e-12);
}

// A GEMM by hand: a100-dgx, 8192^3 bf16, the shape its matmul_efficiency was
// measured on (shape factor 1): 2 x 8192^3 = 1.0995e12 flops at 312 x 0.87 =
// 271.44 TFLOP/s is 4050.7 us, + 4 us launch = 4054.7 us: 271.17 TFLOP/s.
TEST(Validation, GemmThroughputByHand) {
  Result<std::vector<PublishedRow>> rows = ParsePublishedTable(R"(rows:
  - {id: g, kind: gemm, origin: test, source: by hand, cluster: a100-dgx, m: 8192, n: 8192, k: 8192, dtype: bf16, metric: tflops, published: 250}
)", "t.yaml", "");
  ASSERT_TRUE(rows.ok()) << rows.status().message();
  Result<FidelityRow> r = PredictPublished(rows->front());
  ASSERT_TRUE(r.ok()) << r.status().message();
  const double flops = 2.0 * 8192.0 * 8192.0 * 8192.0;
  const double us = flops / (312 * 0.87 * 1e6) + 4;
  EXPECT_NEAR(r->step_us, us, 1e-6 * us);
  EXPECT_NEAR(r->predicted, flops / (us * 1e6), 1e-6);
}

// Bad tables are rejected with the file, the row and the field.
TEST(Validation, BadTablesNameRowAndField) {
  const std::string head = "rows:\n  - {id: x, origin: o, source: s, cluster: a100-dgx, ";
  const std::pair<std::string, std::string> cases[] = {
      {"rows: 3\n", "t.yaml: expected a map with 'rows:'"},
      {"rows: []\n", "t.yaml: 'rows' is empty"},
      {head + "kind: fft, metric: tflops, published: 1}\n", "t.yaml: row 0 (x): field 'kind': expected collective, gemm or training, got 'fft'"},
      {head + "kind: gemm, m: 1, n: 1, k: 1, metric: busbw_gbps, published: 1}\n", "field 'metric': 'busbw_gbps' is not a metric of a gemm row"},
      {head + "kind: gemm, m: 1, n: 1, metric: tflops, published: 1}\n", "t.yaml: row 0 (x): missing field 'k'"},
      {head + "kind: gemm, m: 1, n: 1, k: 0, metric: tflops, published: 1}\n", "field 'k': expected an integer in 1..16777216, got '0'"},
      {head + "kind: gemm, m: 1, n: 1, k: 1, ranks: 8, metric: tflops, published: 1}\n", "unknown field 'ranks' for a gemm row"},
      {head + "kind: gemm, m: 1, n: 1, k: 1, metric: tflops, published: -3}\n", "field 'published': expected a positive number, got '-3'"},
      {head + "kind: collective, collective: broadcast, ranks: 8, bytes: 8, metric: time_us, published: 1}\n",
       "field 'collective': expected all_reduce, all_gather, reduce_scatter or all_to_all, got 'broadcast'"},
      {head + "kind: training, model: gpt-tiny, plan: dp=2, scheduler: fast, global_batch: 4, metric: step_time_s, published: 1}\n",
       "field 'scheduler': unknown scheduler 'fast'"},
      {head + "kind: gemm, m: 1, n: 1, k: 1, metric: tflops, published: 1}\n  - {id: x, kind: gemm, origin: o, source: s, "
              "cluster: a100-dgx, m: 1, n: 1, k: 1, metric: tflops, published: 1}\n",
       "t.yaml: duplicate row id 'x'"},
  };
  for (const auto& [text, expected] : cases) {
    Result<std::vector<PublishedRow>> rows = ParsePublishedTable(text, "t.yaml", "");
    ASSERT_FALSE(rows.ok()) << text;
    EXPECT_NE(rows.status().message().find(expected), std::string::npos)
        << "got: " << rows.status().message() << "\nexpected: " << expected;
  }
}

// A training row whose global batch does not follow from its model and plan is
// an error naming both (a table typo would otherwise predict another run).
TEST(Validation, TrainingRowChecksItsGlobalBatch) {
  Result<std::vector<PublishedRow>> rows = ParsePublishedTable(R"(rows:
  - {id: t, kind: training, origin: o, source: s, cluster: a100-dgx, nodes: 1, model: gpt-tiny, micro_batch: 2,
     plan: "dp=2,microbatches=2", scheduler: megatron, global_batch: 16, metric: step_time_s, published: 1}
)", "t.yaml", "");
  ASSERT_TRUE(rows.ok()) << rows.status().message();
  Result<FidelityRow> r = PredictPublished(rows->front());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("row t: global_batch 16 but the model's batch 2 x microbatches 2 x dp 2 = 8"),
            std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace concerto
