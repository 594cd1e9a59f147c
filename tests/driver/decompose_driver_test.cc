// The driver's decomposition pass (DecomposeWherePays): decisions from the
// exposure in a simulated fifo schedule, kept only when the whole program's
// fifo schedule simulates faster.
#include <gtest/gtest.h>

#include "concerto/cost/cluster.h"
#include "concerto/decompose/decompose.h"
#include "concerto/driver/driver.h"
#include "concerto/lower/plan.h"
#include "concerto/lower/transformer.h"

namespace concerto {
namespace {

TEST(DecomposeTest, DriverKeepsItOnlyWhereTheWholeProgramGetsFaster) {
  // gpt-1.3b with tp=8 on a800-4x8: the forward all-reduces after attn.proj
  // and mlp.fc2 are exposed under fifo (nothing else is ready), so chunking
  // them pays; the driver checks the whole program's fifo schedule (a
  // simulated figure, not a timing) before keeping the rewrites.
  const Program program = LowerTransformer(ModelPreset("gpt-1.3b").value(), ParsePlan("tp=8").value()).value();
  AnalyticCostModel cost(LoadCluster("a800-4x8").value());
  Options options;
  DecomposeReport report;
  Result<Program> out = DecomposeWherePays(program, cost, options, &report);
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_FALSE(report.rejected);
  EXPECT_GT(report.rewrites.size(), 0u);
  EXPECT_LT(report.fifo_after_us, report.fifo_before_us);
  EXPECT_GT(out->graphs[0].ops.size(), program.graphs[0].ops.size());
  for (const auto& d : report.rewrites) {
    EXPECT_GT(d.exposed_us, 0) << d.collective;
    EXPECT_LT(d.estimated_after_us, d.estimated_before_us) << d.collective;
  }

  // Off: the program comes back unchanged.
  ASSERT_TRUE(options.Set("decompose", 0).ok());
  Result<Program> same = DecomposeWherePays(program, cost, options, &report);
  ASSERT_TRUE(same.ok());
  EXPECT_TRUE(report.rewrites.empty());
  EXPECT_EQ(same->graphs[0].ops.size(), program.graphs[0].ops.size());
}

}  // namespace
}  // namespace concerto
