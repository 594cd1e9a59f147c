// Parallel plans: parsing, canonical text, and the constraints ValidatePlan
// checks against a model (each rejection names the constraint).
#include "concerto/lower/plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "concerto/lower/transformer.h"

namespace concerto {
namespace {

/// ParsePlan that must succeed.
ParallelPlan ParsePlanOk(const std::string& text) {
  Result<ParallelPlan> p = ParsePlan(text);
  EXPECT_TRUE(p.ok()) << text << ": " << p.status().message();
  return p.ok() ? *p : ParallelPlan{};
}

/// The error message of ParsePlan on `text` (the test fails if it parses).
std::string PlanParseError(const std::string& text) {
  Result<ParallelPlan> p = ParsePlan(text);
  EXPECT_FALSE(p.ok()) << text << " should not parse";
  return p.ok() ? std::string() : p.status().message();
}

ModelConfig Model(const std::string& name) {
  Result<ModelConfig> m = ModelPreset(name);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? *m : ModelConfig{};
}

/// The error message of ValidatePlan (the test fails if the plan is accepted).
std::string PlanRejection(const ModelConfig& m, const std::string& plan, int world_size = 0) {
  Status s = ValidatePlan(m, ParsePlanOk(plan), world_size);
  EXPECT_FALSE(s.ok()) << plan << " should be rejected for " << m.name;
  return s.ok() ? std::string() : s.message();
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST(PlanParse, TheIssueExamples) {
  ParallelPlan a = ParsePlanOk("dp=4,tp=8");
  EXPECT_EQ(a.dp, 4);
  EXPECT_EQ(a.tp, 8);
  EXPECT_EQ(a.pp, 1);
  EXPECT_FALSE(a.sp);
  EXPECT_EQ(a.zero, 0);

  ParallelPlan b = ParsePlanOk("pp=4,tp=8,dp=1,sp,microbatches=8");
  EXPECT_EQ(b.pp, 4);
  EXPECT_EQ(b.tp, 8);
  EXPECT_EQ(b.dp, 1);
  EXPECT_TRUE(b.sp);
  EXPECT_EQ(b.microbatches, 8);

  ParallelPlan c = ParsePlanOk("zero=3,dp=32");
  EXPECT_EQ(c.zero, 3);
  EXPECT_EQ(c.dp, 32);
  EXPECT_EQ(c.tp, 1);
}

TEST(PlanParse, DefaultsSpacesFlagsAndEmptyItems) {
  ParallelPlan d = ParsePlanOk("");
  EXPECT_EQ(PlanToString(d), "dp=1,tp=1");
  ParallelPlan s = ParsePlanOk(" dp = 2 , tp=4,, sp=1 ,ep=2,dap=4 ");
  EXPECT_EQ(s.dp, 2);
  EXPECT_EQ(s.tp, 4);
  EXPECT_TRUE(s.sp);
  EXPECT_EQ(s.ep, 2);
  EXPECT_EQ(s.dap, 4);
  EXPECT_FALSE(ParsePlanOk("sp=0").sp);
  EXPECT_EQ(ParsePlanOk("zero=0,dp=2").zero, 0);
}

TEST(PlanParse, CanonicalTextRoundTrips) {
  for (const char* text : {"dp=4,tp=8", "dp=1,tp=8,pp=4,sp,microbatches=8", "dp=32,tp=1,zero=3",
                           "dp=2,tp=2,ep=2,zero=1,dap=2", "dp=2,tp=2,sp,recompute=full",
                           "dp=8,tp=1,recompute=selective"}) {
    EXPECT_EQ(PlanToString(ParsePlanOk(text)), text);
    EXPECT_EQ(PlanToString(ParsePlanOk(PlanToString(ParsePlanOk(text)))), text);
  }
  EXPECT_EQ(PlanToString(ParsePlanOk("sp,tp=2")), "dp=1,tp=2,sp");
}

TEST(PlanParse, ErrorsNameTheItem) {
  std::string e = PlanParseError("dp=4,xp=2");
  EXPECT_HAS(e, "item 'xp=2'");
  EXPECT_HAS(e, "unknown key 'xp'");
  EXPECT_HAS(e, "microbatches");  // lists the known keys
  EXPECT_HAS(PlanParseError("dp=2,tp=2,dp=4"), "key 'dp' is given twice");
  EXPECT_HAS(PlanParseError("sp,tp=2,sp"), "key 'sp' is given twice");
  e = PlanParseError("dp=four");
  EXPECT_HAS(e, "item 'dp=four'");
  EXPECT_HAS(e, "dp must be an integer from 1");
  EXPECT_HAS(PlanParseError("tp=2.5"), "got '2.5'");
  EXPECT_HAS(PlanParseError("dp=0"), "dp must be an integer from 1");
  EXPECT_HAS(PlanParseError("tp=-2"), "tp must be an integer from 1");
  EXPECT_HAS(PlanParseError("dp=99999999999"), "got '99999999999'");
  EXPECT_HAS(PlanParseError("microbatches="), "microbatches must be");
  EXPECT_HAS(PlanParseError("zero=4,dp=2"), "zero must be 0, 1, 2 or 3, got '4'");
  EXPECT_HAS(PlanParseError("zero=-1,dp=2"), "zero must be 0, 1, 2 or 3");
  EXPECT_HAS(PlanParseError("dp"), "'dp' needs a value (dp=N)");
  EXPECT_HAS(PlanParseError("tp=2,sp=yes"), "'sp' is a flag");
  EXPECT_HAS(PlanParseError("dp=2,recompute=partial"), "recompute must be none, selective or full, got 'partial'");
  EXPECT_HAS(PlanParseError("recompute"), "recompute must be none, selective or full, got ''");
}

TEST(PlanParse, Recompute) {
  EXPECT_EQ(ParsePlanOk("dp=2").recompute, Recompute::kNone);
  EXPECT_EQ(ParsePlanOk("dp=2,recompute=selective").recompute, Recompute::kSelective);
  EXPECT_EQ(ParsePlanOk("recompute=full").recompute, Recompute::kFull);
  EXPECT_EQ(PlanToString(ParsePlanOk("recompute=none")), "dp=1,tp=1");  // the default is not written
  Result<ParallelPlan> file = ParsePlanFile("dp: 2\nrecompute: full\n", "p.yaml");
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ(file->recompute, Recompute::kFull);
  EXPECT_HAS(ParsePlanFile("recompute: some\n", "p.yaml").status().message(),
             "recompute must be none, selective or full, got 'some'");
}

TEST(PlanParse, SequenceParallelNeedsTensorParallel) {
  EXPECT_HAS(PlanParseError("sp"), "needs tp > 1");
  EXPECT_HAS(PlanParseError("dp=8,tp=1,sp"), "needs tp > 1, got tp=1");
  EXPECT_TRUE(ParsePlanOk("tp=2,sp").sp);
}

TEST(PlanParse, DpTpEntryPointTakesOnlyDpAndTp) {
  Result<DpTpPlan> p = ParseDpTpPlan("dp=4,tp=8");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->dp, 4);
  EXPECT_EQ(p->tp, 8);
  Result<DpTpPlan> sp = ParseDpTpPlan("dp=4,tp=8,sp");
  ASSERT_FALSE(sp.ok());
  EXPECT_HAS(sp.status().message(), "dp and tp only");
  Result<DpTpPlan> bad = ParseDpTpPlan("dp=4,xx=1");
  ASSERT_FALSE(bad.ok());
  EXPECT_HAS(bad.status().message(), "unknown key 'xx'");
  EXPECT_EQ(PlanToString(ToParallelPlan({3, 2})), "dp=3,tp=2");
}

TEST(PlanValidate, AcceptsPlansThatFit) {
  EXPECT_TRUE(ValidatePlan(Model("gpt-1.3b"), ParsePlanOk("dp=4,tp=8"), 32).ok());
  EXPECT_TRUE(ValidatePlan(Model("gpt-1.3b"), ParsePlanOk("dp=4,tp=8,sp")).ok());
  EXPECT_TRUE(ValidatePlan(Model("gpt-13b"), ParsePlanOk("zero=3,dp=32"), 32).ok());
  EXPECT_TRUE(ValidatePlan(Model("llama-70b"), ParsePlanOk("pp=4,tp=8,dp=1,sp,microbatches=8"), 32).ok());
  EXPECT_TRUE(ValidatePlan(Model("llama-70b"), ParsePlanOk("tp=8,sp")).ok());
}

// Degrees against the world size: tp*pp must divide it, dp*tp*pp equal it.
TEST(PlanValidate, WorldSize) {
  const ModelConfig m = Model("gpt-1.3b");
  EXPECT_HAS(PlanRejection(m, "dp=4,tp=8", 64), "dp x tp x pp (32) must equal the world size (64)");
  EXPECT_HAS(PlanRejection(m, "dp=4,tp=8", 64), "dp=8 would");
  EXPECT_HAS(PlanRejection(m, "tp=8,pp=3,microbatches=3", 64),
             "tp x pp (24) must divide the world size (64)");
}

TEST(PlanValidate, TensorParallelMustDivideHeadsKvHeadsVocabFfn) {
  // gpt-tiny: 4 heads; llama-tiny: 8 heads, 2 kv heads, ffn 512, vocab 512.
  EXPECT_HAS(PlanRejection(Model("gpt-tiny"), "tp=8"), "tp (8) must divide heads (4)");
  EXPECT_HAS(PlanRejection(Model("llama-tiny"), "tp=4"), "tp (4) must divide kv_heads (2)");
  EXPECT_HAS(PlanRejection(Model("llama-70b"), "tp=16"), "tp (16) must divide kv_heads (8)");
  ModelConfig odd_vocab = Model("llama-tiny");
  odd_vocab.vocab = 511;
  EXPECT_HAS(PlanRejection(odd_vocab, "tp=2"), "tp (2) must divide vocab (511)");
  ModelConfig odd_ffn = Model("llama-tiny");
  odd_ffn.ffn_hidden = 513;
  EXPECT_HAS(PlanRejection(odd_ffn, "tp=2"), "tp (2) must divide ffn_hidden (513)");
  ModelConfig odd_seq = Model("llama-tiny");
  odd_seq.seq = 63;
  EXPECT_TRUE(ValidatePlan(odd_seq, ParsePlanOk("tp=2")).ok());
  EXPECT_HAS(PlanRejection(odd_seq, "tp=2,sp"), "tp (sequence parallel) (2) must divide seq (63)");
}

TEST(PlanValidate, PipelineMustDivideLayersAndHaveEnoughMicrobatches) {
  EXPECT_HAS(PlanRejection(Model("llama-tiny"), "pp=3,microbatches=3"), "pp (3) must divide layers (2)");
  EXPECT_HAS(PlanRejection(Model("llama-7b"), "pp=4,microbatches=2"),
             "1F1B needs microbatches >= pp, got microbatches=2 < pp=4");
  EXPECT_HAS(PlanRejection(Model("llama-7b"), "pp=4"), "microbatches=1 < pp=4");
}

TEST(PlanValidate, ExpertsZeroAndDap) {
  EXPECT_HAS(PlanRejection(Model("gpt-tiny"), "dp=2,ep=2"), "ep (2) must divide the number of experts");
  EXPECT_HAS(PlanRejection(Model("gpt-tiny"), "zero=2"), "zero=2 shards over dp and needs dp > 1");
  // gpt-tiny: hidden 256 is not a multiple of 3.
  EXPECT_HAS(PlanRejection(Model("gpt-tiny"), "zero=1,dp=3"), "(3) must divide hidden (256)");
  // gpt-tiny at tp=2: fc2/proj rows hidden/tp = 128 not a multiple of 256.
  EXPECT_HAS(PlanRejection(Model("gpt-tiny"), "zero=3,dp=256,tp=2"), "must divide hidden/tp (128)");
  std::string dap = PlanRejection(Model("llama-7b"), "dap=2");
  EXPECT_HAS(dap, "dap (dynamic axial parallelism) needs an Evoformer model");
  EXPECT_HAS(dap, "'llama-7b' is a llama decoder");
  // Messages name the plan and the model.
  EXPECT_HAS(dap, "plan 'dp=1,tp=1,dap=2' for model 'llama-7b'");
}

// ---- order: where the axes go on the cluster ------------------------------------

// order lists the axes innermost first (Megatron's "tp-dp-pp"); the mesh is
// its reverse, outermost first: order=dp-tp gives {tp, dp}, so dp is the
// fastest axis (inside a node) and a tp group strides over dp.
TEST(PlanOrder, ParsesAndPlacesTheMeshAxes) {
  ParallelPlan p = ParsePlanOk("dp=4,tp=8,order=dp-tp");
  ASSERT_EQ(p.order, (std::vector<std::string>{"dp", "tp"}));
  std::vector<MeshAxis> mesh = PlanMeshAxes(p);
  ASSERT_EQ(mesh.size(), 2u);
  EXPECT_EQ(mesh[0].name, "tp");
  EXPECT_EQ(mesh[0].size, 8);
  EXPECT_EQ(mesh[1].name, "dp");
  EXPECT_EQ(mesh[1].size, 4);
  // Default: {pp, dp, tp}; pp only when > 1; ep right inside dp.
  auto names = [](const ParallelPlan& plan) {
    std::string s;
    for (const MeshAxis& a : PlanMeshAxes(plan)) s += a.name + "=" + std::to_string(a.size) + " ";
    return s;
  };
  EXPECT_EQ(names(ParsePlanOk("dp=4,tp=8")), "dp=4 tp=8 ");
  EXPECT_EQ(names(ParsePlanOk("pp=2,dp=2,tp=2,microbatches=2")), "pp=2 dp=2 tp=2 ");
  EXPECT_EQ(names(ParsePlanOk("dp=4,ep=2,tp=2")), "dp=2 ep=2 tp=2 ");
  EXPECT_EQ(names(ParsePlanOk("pp=2,dp=2,tp=2,order=pp-tp-dp")), "dp=2 tp=2 pp=2 ");
  EXPECT_EQ(names(ParsePlanOk("pp=2,dp=4,ep=2,tp=2,order=dp-pp-tp")), "tp=2 pp=2 dp=2 ep=2 ");
  // pp may be listed with pp = 1 (it is then left out of the mesh).
  EXPECT_EQ(names(ParsePlanOk("dp=2,tp=2,order=tp-pp-dp")), "dp=2 tp=2 ");
}

TEST(PlanOrder, RoundTripsAndDropsTheDefault) {
  for (const char* text : {"dp=4,tp=8,order=dp-tp", "dp=2,tp=2,pp=2,microbatches=2,order=pp-tp-dp",
                           "dp=1,tp=8,pp=4,microbatches=8,vstages=2",
                           "dp=2,tp=4,pp=4,microbatches=8,vstages=2,order=tp-pp-dp"}) {
    EXPECT_EQ(PlanToString(ParsePlanOk(text)), text);
    EXPECT_EQ(PlanToString(ParsePlanOk(PlanToString(ParsePlanOk(text)))), text);
  }
  // An order that equals the default is not kept (pp=1: tp-dp-pp is tp-dp).
  EXPECT_TRUE(ParsePlanOk("dp=4,tp=8,order=tp-dp").order.empty());
  EXPECT_TRUE(ParsePlanOk("dp=4,tp=8,order=tp-dp-pp").order.empty());
  EXPECT_EQ(PlanToString(ParsePlanOk("order = tp-dp-pp , pp=2, microbatches=2")), "dp=1,tp=1,pp=2,microbatches=2");
  // Keys may come in any order: the order is checked once every item is read.
  EXPECT_EQ(PlanToString(ParsePlanOk("order=dp-tp-pp,pp=2,microbatches=2")),
            "dp=1,tp=1,pp=2,microbatches=2,order=dp-tp-pp");
}

TEST(PlanOrder, BadOrdersNameTheKey) {
  std::string e = PlanParseError("dp=2,tp=2,order=dp-xp");
  EXPECT_HAS(e, "order 'dp-xp': unknown axis 'xp'");
  EXPECT_HAS(PlanParseError("dp=2,tp=2,order=dp-tp-dp"), "order 'dp-tp-dp': axis 'dp' is listed twice");
  EXPECT_HAS(PlanParseError("dp=2,tp=2,order=dp"), "order 'dp': must list tp");
  EXPECT_HAS(PlanParseError("pp=2,microbatches=2,order=dp-tp"), "order 'dp-tp': must list pp when pp > 1");
  EXPECT_HAS(PlanParseError("dp=4,ep=2,order=ep-dp-tp"), "ep is not placed on its own");
  EXPECT_HAS(PlanParseError("order"), "'order' needs the mesh axes innermost first");
  EXPECT_HAS(PlanParseError("dp=2,order=dp--tp"), "unknown axis ''");
  // A plan built by hand is checked by ValidatePlan, naming plan, model and key.
  ParallelPlan p;
  p.order = {"tp", "tp"};
  Status s = ValidatePlan(Model("gpt-tiny"), p);
  ASSERT_FALSE(s.ok());
  EXPECT_HAS(s.message(), "for model 'gpt-tiny': order 'tp-tp': axis 'tp' is listed twice");
}

// ---- vstages: interleaved 1F1B -----------------------------------------------------

TEST(PlanValidate, InterleavedStagesNeedPipelineLayersAndMicrobatches) {
  // gpt-1.3b: 24 layers. pp=4 x vstages=2 = 8 divides 24; pp=4 x vstages=4 = 16 does not.
  EXPECT_TRUE(ValidatePlan(Model("gpt-1.3b"), ParsePlanOk("pp=4,vstages=2,microbatches=8")).ok());
  EXPECT_HAS(PlanRejection(Model("gpt-1.3b"), "pp=4,vstages=4,microbatches=8"),
             "pp x vstages (16) must divide layers (24)");
  EXPECT_HAS(PlanRejection(Model("gpt-1.3b"), "vstages=2"),
             "vstages (2, interleaved 1F1B) needs pipeline stages, got pp=1");
  EXPECT_HAS(PlanRejection(Model("gpt-1.3b"), "pp=4,vstages=2,microbatches=6"),
             "needs microbatches to be a multiple of pp, got microbatches=6 with pp=4");
  EXPECT_HAS(PlanParseError("vstages=0"), "vstages must be an integer from 1");
}

TEST(PlanValidate, DegreesBuiltByHandAreChecked) {
  ParallelPlan p;
  p.tp = 0;
  Status s = ValidatePlan(Model("gpt-tiny"), p);
  ASSERT_FALSE(s.ok());
  EXPECT_HAS(s.message(), "tp must be >= 1, got 0");
  p = ParallelPlan{};
  p.zero = 5;
  p.dp = 2;
  s = ValidatePlan(Model("gpt-tiny"), p);
  ASSERT_FALSE(s.ok());
  EXPECT_HAS(s.message(), "zero must be 0, 1, 2 or 3, got 5");
  p = ParallelPlan{};
  p.sp = true;
  s = ValidatePlan(Model("gpt-tiny"), p);
  ASSERT_FALSE(s.ok());
  EXPECT_HAS(s.message(), "sp (sequence parallelism) needs tp > 1");
}

}  // namespace
}  // namespace concerto
