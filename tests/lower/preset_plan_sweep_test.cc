// Every model preset under every plan of a fixed list of 8-rank plans: the
// plan either lowers to a program the verifier accepts, or is rejected with
// a message naming the constraint. No plan may crash, hang or produce an
// invalid program. The tallies at the end make sure the sweep is not vacuous
// (each family lowers under the plans that fit it).
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "concerto/ir/verifier.h"
#include "concerto/lower/frontend.h"

namespace concerto {
namespace {

/// 8-rank plans covering every key: dp, tp, sp, zero 1-3, pp (plain and
/// interleaved), ep, dap, placement order, and their usual combinations.
const std::vector<std::string>& Plans() {
  static const std::vector<std::string> plans = {
      "dp=8",
      "tp=8",
      "dp=2,tp=4",
      "dp=2,tp=4,sp",
      "dp=8,zero=1",
      "dp=8,zero=2",
      "dp=8,zero=3",
      "pp=2,tp=4,microbatches=2",
      "pp=2,dp=2,tp=2,microbatches=4,vstages=2",
      "dp=4,tp=2,order=dp-tp",
      "dp=8,ep=2",
      "dp=4,ep=4,tp=2",
      "dp=8,dap=1",
      "dap=8",
      "dp=2,dap=4",
  };
  return plans;
}

TEST(PresetPlanSweep, EveryPresetUnderEveryPlanLowersOrIsRejected) {
  std::map<std::string, int> lowered;  // preset -> plans that lowered
  int rejected = 0;
  for (const std::string& model : AllModelPresetNames()) {
    for (const std::string& plan : Plans()) {
      Result<Program> p = LowerModelPlan(model, plan);
      if (!p.ok()) {
        // A rejection says which constraint failed; it never comes back empty.
        EXPECT_FALSE(p.status().message().empty()) << model << " " << plan;
        ++rejected;
        continue;
      }
      EXPECT_EQ(p->mesh.NumRanks(), 8) << model << " " << plan;
      const std::vector<std::string> errors = VerifyProgram(*p);
      EXPECT_TRUE(errors.empty()) << model << " " << plan << ": " << errors.front();
      ++lowered[model];
    }
  }
  for (const auto& [model, n] : lowered) std::printf("  %-14s %2d of %zu plans lower\n", model.c_str(), n, Plans().size());
  std::printf("  %d (preset, plan) pairs rejected\n", rejected);
  // The full-size dense decoders fit the 10 dp/tp/sp/zero/pp/order plans and
  // "dp=8,dap=1" (dap 1 is off); mixtral-8x7b takes those except sp (MoE
  // routes whole sequences) plus the two ep plans (12); the Evoformer takes dp=8, dp=8 with
  // dap=1, dap=8 and dp=2 with dap=4. The tiny presets have 2 kv heads (llama,
  // mixtral) or 4 heads (gpt), so tp=4 and tp=8 are rejected for them, and
  // mixtral-tiny's 4 experts do not divide over ZeRO's dp=8.
  for (const char* dense : {"gpt-1.3b", "gpt-39b", "llama-7b", "llama-70b"}) EXPECT_EQ(lowered[dense], 11) << dense;
  EXPECT_EQ(lowered["mixtral-8x7b"], 12);
  EXPECT_EQ(lowered["evoformer"], 4);
  EXPECT_EQ(lowered["evoformer-tiny"], 4);
  EXPECT_GE(lowered["mixtral-tiny"], 4);
  EXPECT_GE(lowered["gpt-tiny"], 6);
}

}  // namespace
}  // namespace concerto
