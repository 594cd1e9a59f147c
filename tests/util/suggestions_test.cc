// Errors suggest the fix where one is known (issue "Reliability", first use):
// did-you-mean for model, cluster and plan-key names, "no such plan file"
// for a path, the padded vocabulary that tp divides, a dp that ep divides.
#include <gtest/gtest.h>

#include <string>

#include "concerto/cost/cluster.h"
#include "concerto/lower/frontend.h"
#include "concerto/lower/plan.h"
#include "concerto/util/did_you_mean.h"

namespace concerto {
namespace {

std::string Message(const Status& s) { return s.ok() ? "(accepted)" : s.message(); }

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST(Suggestions, DidYouMeanPicksTheClosestNameOrNone) {
  const std::vector<std::string> names = {"gpt-1.3b", "gpt-13b", "llama-70b", "a800-4x8"};
  EXPECT_EQ(DidYouMean("gpt-13", names), " (did you mean 'gpt-13b'?)");  // one insertion
  EXPECT_EQ(DidYouMean("LLAMA-70B", names), " (did you mean 'llama-70b'?)");  // case only
  EXPECT_EQ(DidYouMean("a800", names), " (did you mean 'a800-4x8'?)");  // the only name it starts
  EXPECT_EQ(DidYouMean("gpt", names), "");  // starts two names: no single suggestion
  EXPECT_EQ(DidYouMean("resnet-50", names), "");  // nothing close
  EXPECT_EQ(DidYouMean("", names), "");
}

TEST(Suggestions, NamesOfModelsClustersAndPlanKeys) {
  EXPECT_HAS(Message(LowerModelPlan("gpt-13", "dp=2").status()), "model 'gpt-13' (did you mean 'gpt-13b'?)");
  EXPECT_HAS(Message(LowerModelPlan("evoformr", "dp=2").status()), "(did you mean 'evoformer'?)");
  // The list names every preset the frontends take, the Evoformer's too.
  EXPECT_HAS(Message(LowerModelPlan("nope", "dp=2").status()), "mixtral-8x7b, evoformer-tiny, evoformer)");
  EXPECT_HAS(Message(LoadCluster("a800").status()), "unknown cluster 'a800' (did you mean 'a800-4x8'?)");
  EXPECT_HAS(Message(LoadCluster("h100-8x4").status()), "(did you mean 'h100-8x8'?)");
  EXPECT_HAS(Message(ParsePlan("dp=2,tq=2").status()), "unknown key 'tq' (did you mean 'tp'?)");
  EXPECT_HAS(Message(ParsePlan("microbatch=4").status()), "(did you mean 'microbatches'?)");
}

TEST(Suggestions, APlanPathThatDoesNotExistIsAMissingFile) {
  // Before: "unknown key 'plans/dp4-tp8.yaml'".
  EXPECT_EQ(Message(LoadPlan("plans/dp4-tp8.yaml").status()), "plans/dp4-tp8.yaml: no such plan file");
  EXPECT_EQ(Message(LoadPlan("dp4.json").status()), "dp4.json: no such plan file");
  EXPECT_HAS(Message(LoadPlan("dp4").status()), "unknown key 'dp4'");  // not a path: a plan string
}

TEST(Suggestions, FixesForPlansThatDoNotDivide) {
  // gpt-tiny has vocab 512 (tp=8 divides it); a spec with GPT-2's 50257
  // gets Megatron's padded size for tp=8: a multiple of 1024.
  const std::string spec = ::testing::TempDir() + "/vocab.yaml";
  FILE* f = std::fopen(spec.c_str(), "w");
  std::fputs("family: gpt\nlayers: 2\nhidden: 256\nheads: 8\nseq: 64\nvocab: 50257\n", f);
  std::fclose(f);
  EXPECT_HAS(Message(LowerModelPlan(spec, "tp=8").status()),
             "tp (8) must divide vocab (50257): pad the vocabulary as Megatron does, to a multiple of 128 x tp, "
             "e.g. vocab: 51200 in the model spec");
  EXPECT_HAS(Message(LowerModelPlan("mixtral-tiny", "dp=2,ep=4").status()),
             "ep (4) must divide dp (2): the expert-parallel group is carved out of the data-parallel ranks; "
             "e.g. dp=4,ep=4 or ep=2");
}

}  // namespace
}  // namespace concerto
