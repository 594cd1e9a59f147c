// Placing a plan on the cluster: the plan key `order` (mesh axes innermost
// first, docs/frontends.md "Placement") changes which ranks form each group
// and nothing else in the graphs; the cost model then prices a tp group that
// spans nodes over the inter-node links; and a real run under a non-default
// order still matches the unsharded model (the runtime finds shards by axis
// name, not by axis position).
#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "concerto/cost/cluster.h"
#include "concerto/cost/cost_model.h"
#include "concerto/ir/verifier.h"
#include "concerto/lower/frontend.h"
#include "concerto/lower/plan.h"
#include "concerto/lower/transformer.h"
#include "concerto/runtime/executor.h"
#include "concerto/runtime/reference.h"
#include "concerto/schedule/scheduler.h"
#include "concerto/sim/simulator.h"

namespace concerto {
namespace {

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

Program Lower(const ModelConfig& m, const std::string& plan) {
  Result<ParallelPlan> p = ParsePlan(plan);
  EXPECT_TRUE(p.ok()) << p.status().message();
  if (!p.ok()) return Program{};
  Result<Program> program = LowerTransformer(m, *p);
  EXPECT_TRUE(program.ok()) << plan << ": " << program.status().message();
  return program.ok() ? *program : Program{};
}

ModelConfig Preset(const std::string& name) { return ModelPreset(name).value(); }

/// Every op of every graph as "graph/name kind group-axes peer", in order:
/// equal strings mean the same ops with the same groups by axis name.
std::string OpSignature(const Program& p) {
  std::string s;
  for (const Graph& g : p.graphs)
    for (const Op& op : g.ops) {
      s += g.name + "/" + op.name + " " + std::to_string(static_cast<int>(op.kind));
      for (const std::string& a : op.group.axes) s += " " + a;
      if (!op.peer.axis.empty()) s += " peer " + op.peer.axis + std::to_string(op.peer.offset);
      s += ' ';
      s += std::to_string(op.message_bytes);
      s += '\n';
    }
  return s;
}

/// The first op of graph `g` called `name`.
const Op& FindOp(const Graph& g, const std::string& name) {
  for (const Op& op : g.ops)
    if (op.name == name) return op;
  ADD_FAILURE() << "no op " << name;
  return g.ops.front();
}

// gpt-tiny dp=2, tp=2 on 4 ranks. Default mesh {dp, tp}: rank = 2 c_dp + c_tp,
// so rank 0's tp group is {0, 1} and its dp group {0, 2}. order=dp-tp puts dp
// innermost: mesh {tp, dp}, rank = 2 c_tp + c_dp, tp group {0, 2}, dp group
// {0, 1}. The ops, their names, group axes and bytes are identical.
TEST(Placement, SameOpsDifferentRanks) {
  const Program a = Lower(Preset("gpt-tiny"), "dp=2,tp=2");
  const Program b = Lower(Preset("gpt-tiny"), "dp=2,tp=2,order=dp-tp");
  ASSERT_EQ(b.mesh.axes.size(), 2u);
  EXPECT_EQ(b.mesh.axes[0].name, "tp");
  EXPECT_EQ(b.mesh.axes[1].name, "dp");
  EXPECT_EQ(b.name, "gpt-tiny.dp2.tp2.order-dp-tp");
  EXPECT_EQ(OpSignature(a), OpSignature(b));
  EXPECT_TRUE(VerifyProgram(b).empty());
  const Op& tp_ar = FindOp(a.graphs[0], "L0.attn.proj.ar");
  const Op& dp_ar = FindOp(a.graphs[0], "L0.mlp.fc1.w.grad.ar");
  ASSERT_EQ(tp_ar.group.axes, (std::vector<std::string>{"tp"}));
  ASSERT_EQ(dp_ar.group.axes, (std::vector<std::string>{"dp"}));
  EXPECT_EQ(GroupRanks(a.mesh, tp_ar.group, 0), (std::vector<int>{0, 1}));
  EXPECT_EQ(GroupRanks(a.mesh, dp_ar.group, 0), (std::vector<int>{0, 2}));
  EXPECT_EQ(GroupRanks(b.mesh, tp_ar.group, 0), (std::vector<int>{0, 2}));
  EXPECT_EQ(GroupRanks(b.mesh, dp_ar.group, 0), (std::vector<int>{0, 1}));
  EXPECT_EQ(GroupRanks(b.mesh, tp_ar.group, 3), (std::vector<int>{1, 3}));
}

// gpt-tiny pp=2, dp=2, m=2 with pp innermost (order=pp-tp-dp, tp=1): mesh
// {dp, tp, pp}, rank = 2 c_dp + c_pp, so stage 0 is ranks {0, 2} and stage 1
// {1, 3}; a send with peer offset +1 on pp goes from rank 0 to rank 1. The
// stage graphs are those of the default order; fifo simulates it.
TEST(Placement, PipelineStagesFollowThePpCoordinate) {
  const Program a = Lower(Preset("gpt-tiny"), "pp=2,dp=2,microbatches=2");
  const Program b = Lower(Preset("gpt-tiny"), "pp=2,dp=2,microbatches=2,order=pp-tp-dp");
  ASSERT_EQ(b.roles.size(), 2u);
  EXPECT_EQ(a.roles[0].ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(b.roles[0].ranks, (std::vector<int>{0, 2}));
  EXPECT_EQ(b.roles[1].ranks, (std::vector<int>{1, 3}));
  EXPECT_EQ(OpSignature(a), OpSignature(b));
  const Op& send = FindOp(b.graphs[0], "pp.fwd.send.mb0");
  EXPECT_EQ(PeerRank(b.mesh, send.peer, 0), 1);
  EXPECT_EQ(PeerRank(b.mesh, send.peer, 2), 3);
  std::vector<std::string> errors = VerifyProgram(b);
  EXPECT_TRUE(errors.empty()) << errors.front();
  AnalyticCostModel cost(LoadCluster("a800-4x8").value());
  Result<ScheduledProgram> sp = RunBaseline("fifo", b, cost);
  ASSERT_TRUE(sp.ok()) << sp.status().message();
  for (bool all_ranks : {false, true}) {
    SimOptions options;
    options.all_ranks = all_ranks;
    Result<Timeline> t = Simulate(*sp, cost, options);
    ASSERT_TRUE(t.ok()) << t.status().message();
  }
}

// gpt-1.3b dp=4, tp=8 on a800-4x8 (4 nodes x 8): by default each tp group
// is one node (NVLink); with order=dp-tp a tp group strides over dp (ranks
// 0, 4, 8, ..., 28: 2 per node on all 4 nodes), so every tp all-reduce of
// the forward and backward crosses the 11.25 GB/s inter-node links, while
// the dp groups (4 consecutive ranks) move inside a node. The simulated
// fifo step gets slower (docs/frontends.md has both makespans).
TEST(Placement, TensorParallelAcrossNodesIsPricedSlower) {
  AnalyticCostModel cost(LoadCluster("a800-4x8").value());
  double makespan_us[2] = {0, 0};
  const char* plans[2] = {"dp=4,tp=8", "dp=4,tp=8,order=dp-tp"};
  for (int i = 0; i < 2; ++i) {
    const Program p = Lower(Preset("gpt-1.3b"), plans[i]);
    Result<ScheduledProgram> sp = RunBaseline("fifo", p, cost);
    ASSERT_TRUE(sp.ok()) << sp.status().message();
    Result<Timeline> t = Simulate(*sp, cost);
    ASSERT_TRUE(t.ok()) << t.status().message();
    makespan_us[i] = t->makespan_us;
    std::printf("gpt-1.3b %-24s fifo %10.3f ms\n", plans[i], makespan_us[i] / 1000);
  }
  EXPECT_GT(makespan_us[1], 1.5 * makespan_us[0]);
  // One tp all-reduce alone: the same message, priced inside a node vs across 4.
  const Program a = Lower(Preset("gpt-1.3b"), plans[0]);
  const Program b = Lower(Preset("gpt-1.3b"), plans[1]);
  const Op& ar = FindOp(a.graphs[0], "L0.attn.proj.ar");
  EXPECT_LT(cost.CollectiveUs(ar.collective, ar.message_bytes, GroupRanks(a.mesh, ar.group, 0)),
            cost.CollectiveUs(ar.collective, ar.message_bytes, GroupRanks(b.mesh, ar.group, 0)));
}

// A real run under order=dp-tp (fp32 CPU kernels, threads as ranks, fifo)
// reproduces the unsharded gpt-tiny step on the same global batch (dp x
// batch = 4 sequences): loss, every gradient, every updated parameter.
TEST(Placement, NonDefaultOrderMatchesTheUnshardedRun) {
  const ModelConfig m = Preset("gpt-tiny");
  AnalyticCostModel cost(LoadCluster("a800-4x8").value());
  const Program p = Lower(m, "dp=2,tp=2,order=dp-tp");
  ModelConfig ref_model = m;
  ref_model.batch = m.batch * 2;
  const Program ref = Lower(ref_model, "dp=1,tp=1");
  RunOptions options;
  options.init.layouts = {FusedQkvLayout(m.hidden, int64_t{m.kv_heads} * (m.hidden / m.heads))};
  Result<ScheduledProgram> ref_sp = RunBaseline("fifo", ref, cost);
  Result<ScheduledProgram> sp = RunBaseline("fifo", p, cost);
  ASSERT_TRUE(ref_sp.ok() && sp.ok());
  Result<ExecutionResult> ref_run = RunInProcess(*ref_sp, options);
  ASSERT_TRUE(ref_run.ok()) << ref_run.status().message();
  Result<ExecutionResult> run = RunInProcess(*sp, options);
  ASSERT_TRUE(run.ok()) << run.status().message();
  Result<ReferenceReport> report =
      CompareToReference(*ref_sp, *ref_run, *sp, *run, Tolerance{}, options.init.layouts);
  ASSERT_TRUE(report.ok()) << report.status().message();
  std::printf("gpt-tiny dp=2,tp=2,order=dp-tp: %s\n", report->Summary().c_str());
}

// Plan files take the order as text or as a YAML list, and vstages.
TEST(Placement, PlanFilesCarryTheOrder) {
  Result<ParallelPlan> list = ParsePlanFile("dp: 4\ntp: 8\norder: [dp, tp]\n", "p.yaml");
  ASSERT_TRUE(list.ok()) << list.status().message();
  EXPECT_EQ(PlanToString(*list), "dp=4,tp=8,order=dp-tp");
  Result<ParallelPlan> text = ParsePlanFile("{\"dp\": 4, \"tp\": 8, \"order\": \"dp-tp\"}", "p.json");
  ASSERT_TRUE(text.ok()) << text.status().message();
  EXPECT_EQ(PlanToString(*text), "dp=4,tp=8,order=dp-tp");
  Result<ParallelPlan> bad = ParsePlanFile("dp: 4\norder: dp-xp\n", "p.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_HAS(bad.status().message(), "p.yaml: ");
  EXPECT_HAS(bad.status().message(), "order 'dp-xp': unknown axis 'xp'");
  Result<ParallelPlan> vs = ParsePlanFile("pp: 2\nvstages: 2\nmicrobatches: 4\n", "v.yaml");
  ASSERT_TRUE(vs.ok()) << vs.status().message();
  EXPECT_EQ(vs->vstages, 2);
}

// The Evoformer frontend (mesh {dp, dap}) takes no order and no vstages.
TEST(Placement, EvoformerRefusesTheKeys) {
  Result<Program> p = LowerModelPlan("evoformer-tiny", "dp=2,order=dp-tp");
  ASSERT_FALSE(p.ok());
  EXPECT_HAS(p.status().message(), "key 'order' is not supported by the Evoformer frontend");
  EXPECT_TRUE(LowerModelPlan("evoformer-tiny", "dp=2,dap=2").ok());
  Result<Program> rc = LowerModelPlan("evoformer-tiny", "dp=2,recompute=full");
  ASSERT_FALSE(rc.ok());
  EXPECT_HAS(rc.status().message(), "the Evoformer frontend takes dp and dap only");
}

}  // namespace
}  // namespace concerto
