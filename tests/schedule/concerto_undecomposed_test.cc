// The program before decomposition as a starting point
// (ConcertoOptions::undecomposed, docs/concerto.md step 1): chunking keeps
// chunk buffers alive longer, so a decomposed program's free list schedule
// can go over the memory budget where the undecomposed one fits.
#include <gtest/gtest.h>

#include <string>

#include "concerto/cost/cluster.h"
#include "concerto/cost/cost_model.h"
#include "concerto/decompose/decompose.h"
#include "concerto/lower/frontend.h"
#include "concerto/schedule/concerto_scheduler.h"

namespace concerto {
namespace {

size_t TotalOps(const Program& p) {
  size_t n = 0;
  for (const Graph& g : p.graphs) n += g.ops.size();
  return n;
}

/// gpt-tiny under pp=2, tp=2 with 4 micro-batches, and the same with every
/// tp collective chunked in two (36 rewrites).
struct Programs {
  Program plain, chunked;
};
Programs PlainAndChunked(const CostModel& cost) {
  Programs p{LowerModelPlan("gpt-tiny", "pp=2,tp=2,microbatches=4").value(), {}};
  p.chunked = p.plain;
  DecomposeOptions d;
  d.force_chunks = 2;
  Result<DecomposeReport> dr = DecomposeCollectives(p.chunked, cost, d);
  EXPECT_TRUE(dr.ok() && !dr->rewrites.empty());
  return p;
}

/// On a800-4x8 the plain program's free list schedule peaks at 10,261,504 B
/// per rank, the chunked one's at 10,228,736 B (11,539,456 B until the
/// decomposition stopped leaving its replaced tensors in the graph, held all
/// step). Under a budget of 10,200,000 B neither free list schedule fits, so
/// the undecomposed program's memory-capped starts join the race, and one
/// of them starts the search.
TEST(ConcertoUndecomposed, StartsFromTheUndecomposedProgramWhenTheDecomposedOneDoesNotFit) {
  AnalyticCostModel cost(LoadCluster("a800-4x8").value());
  const auto [plain, chunked] = PlainAndChunked(cost);
  ASSERT_GT(TotalOps(chunked), TotalOps(plain));

  ConcertoOptions o;
  o.memory_budget_bytes = 10'200'000;
  o.rounds = 1;
  ConcertoReport without_report, with_report;
  Result<ScheduledProgram> without = RunConcerto(chunked, cost, o, &without_report);
  o.undecomposed = &plain;
  Result<ScheduledProgram> with = RunConcerto(chunked, cost, o, &with_report);
  ASSERT_TRUE(without.ok()) << without.status().message();
  ASSERT_TRUE(with.ok()) << with.status().message();
  EXPECT_EQ(without_report.start.find("undecomposed"), std::string::npos) << without_report.start;
  EXPECT_EQ(with_report.start.rfind("list-undecomposed", 0), 0u) << with_report.start;
  EXPECT_TRUE(with_report.undecomposed);
  EXPECT_FALSE(without_report.undecomposed);
  // The schedule returned is of the undecomposed program, within the budget.
  EXPECT_EQ(TotalOps(with->program), TotalOps(plain));
  EXPECT_LE(with_report.peak_memory_bytes, o.memory_budget_bytes);
}

/// Where the decomposed program's free list schedule fits, the undecomposed
/// one is not tried (it can win the start and still end slower).
TEST(ConcertoUndecomposed, NotTriedWhereTheDecomposedListScheduleFits) {
  AnalyticCostModel cost(LoadCluster("a800-4x8").value());
  const auto [plain, chunked] = PlainAndChunked(cost);
  ConcertoOptions o;
  o.memory_budget_bytes = 0;  // none: every list schedule fits
  o.rounds = 1;
  o.undecomposed = &plain;
  ConcertoReport report;
  Result<ScheduledProgram> sp = RunConcerto(chunked, cost, o, &report);
  ASSERT_TRUE(sp.ok()) << sp.status().message();
  EXPECT_EQ(report.start.find("undecomposed"), std::string::npos) << report.start;
}

}  // namespace
}  // namespace concerto
