// Pass tests: a small IR text goes through one pass (driver/pass.h) and the
// IR that comes out is checked, in the style of MLIR's FileCheck tests; and
// the pipeline runs the registered passes in order, calling the hook after
// each.
#include <gtest/gtest.h>

#include "concerto/cost/cluster.h"
#include "concerto/driver/driver.h"
#include "concerto/driver/pass.h"
#include "concerto/ir/json_io.h"

namespace concerto {
namespace {

// Two layers' gradients (4 KiB each) all-reduced over dp=2, backward order.
const char* kTwoGradients = R"({"format": "concerto-ir", "version": 1, "name": "two_grads",
 "mesh": {"axes": [{"name": "dp", "size": 2}]},
 "graphs": [{"name": "main", "streams": ["compute", "comm.dp"],
  "tensors": [
   {"name": "x", "shape": [4, 16], "dtype": "f32", "sharding": [["dp"], []]},
   {"name": "dy", "shape": [4, 8], "dtype": "f32", "sharding": [["dp"], []]},
   {"name": "g1p", "shape": [16, 8], "dtype": "f32", "partial": ["dp"]},
   {"name": "g2p", "shape": [16, 8], "dtype": "f32", "partial": ["dp"]},
   {"name": "g1", "shape": [16, 8], "dtype": "f32"},
   {"name": "g2", "shape": [16, 8], "dtype": "f32"}],
  "ops": [
   {"id": 0, "name": "l1.dw", "kind": "compute", "type": "matmul", "attrs": {"transpose_a": 1}, "inputs": ["x", "dy"], "outputs": ["g1p"], "duration_us": 10, "tags": {"phase": "bwd", "layer": 1}},
   {"id": 1, "name": "l1.dw.all_reduce", "kind": "collective", "stream": "comm.dp", "collective": "all_reduce", "reduce": "sum", "group": {"axes": ["dp"]}, "inputs": ["g1p"], "outputs": ["g1"], "tags": {"phase": "bwd", "layer": 1, "purpose": "grad_sync"}},
   {"id": 2, "name": "l0.dw", "kind": "compute", "type": "matmul", "attrs": {"transpose_a": 1}, "inputs": ["x", "dy"], "outputs": ["g2p"], "duration_us": 10, "tags": {"phase": "bwd", "layer": 0}},
   {"id": 3, "name": "l0.dw.all_reduce", "kind": "collective", "stream": "comm.dp", "collective": "all_reduce", "reduce": "sum", "group": {"axes": ["dp"]}, "inputs": ["g2p"], "outputs": ["g2"], "tags": {"phase": "bwd", "layer": 0, "purpose": "grad_sync"}}]}]})";

AnalyticCostModel Commodity() {
  Result<ClusterSpec> c = LoadCluster("commodity-4x8");
  EXPECT_TRUE(c.ok());
  return AnalyticCostModel(*c);
}

/// The ops of the only graph as "name(inputs)->(outputs)" lines.
std::string OpLines(const Program& p) {
  std::string out;
  for (const Op& op : p.graphs[0].ops) {
    out += op.name + "(";
    for (size_t i = 0; i < op.inputs.size(); ++i) out += (i ? "," : "") + op.inputs[i];
    out += ")->(";
    for (size_t i = 0; i < op.outputs.size(); ++i) out += (i ? "," : "") + op.outputs[i];
    out += ")\n";
  }
  return out;
}

TEST(SchedulePass, DdpBucketsBothGradientsIntoOneAllReduce) {
  // DDP's first bucket is 1 MiB: both 4 KiB gradients land in it, so the
  // schedule pass rewrites the two all_reduces into one fused collective
  // over both tensors (PyTorch's reducer, docs/schedulers.md).
  Result<Program> in = ParseProgram(kTwoGradients, "two_grads");
  ASSERT_TRUE(in.ok()) << in.status().message();
  const AnalyticCostModel cost = Commodity();
  const Options options;
  PassContext context{*in, std::nullopt, &cost, &options, nullptr, {}, std::nullopt, std::nullopt, std::nullopt};
  Result<std::unique_ptr<Pass>> pass = MakePass("schedule", "ddp");
  ASSERT_TRUE(pass.ok());
  ASSERT_TRUE(RunPasses({}, context, nullptr).ok());  // nothing to run: nothing changes
  Result<PassChange> change = (*pass)->Run(context);
  ASSERT_TRUE(change.ok()) << change.status().message();
  EXPECT_TRUE(change->program_changed);
  // CHECK: the compute ops stay; one fused all_reduce replaces the two.
  EXPECT_EQ(OpLines(context.program),
            "l1.dw(x,dy)->(g1p)\n"
            "l0.dw(x,dy)->(g2p)\n"
            "fused.l1.dw.all_reduce+1(g1p,g2p)->(g1,g2)\n");
  ASSERT_TRUE(context.schedule.has_value());
  EXPECT_EQ(context.schedule->scheduler, "ddp");
}

TEST(SchedulePass, FifoKeepsTheProgram) {
  Result<Program> in = ParseProgram(kTwoGradients, "two_grads");
  ASSERT_TRUE(in.ok());
  const AnalyticCostModel cost = Commodity();
  const Options options;
  PassContext context{*in, std::nullopt, &cost, &options, nullptr, {}, std::nullopt, std::nullopt, std::nullopt};
  Result<std::unique_ptr<Pass>> pass = MakePass("schedule", "fifo");
  ASSERT_TRUE(pass.ok());
  Result<PassChange> change = (*pass)->Run(context);
  ASSERT_TRUE(change.ok());
  EXPECT_FALSE(change->program_changed);
  EXPECT_EQ(WriteProgram(context.program), WriteProgram(*in));
}

TEST(Pipeline, RunsTheRegisteredPassesInOrderWithTheHookAfterEach) {
  Result<Program> in = ParseProgram(kTwoGradients, "two_grads");
  ASSERT_TRUE(in.ok());
  const AnalyticCostModel cost = Commodity();
  std::vector<std::string> seen;
  Result<RunResult> run = RunScheduler(*in, "concerto", cost, Options{},
                                       [&](const std::string& pass, const Program&) { seen.push_back(pass); });
  ASSERT_TRUE(run.ok()) << run.status().message();
  EXPECT_EQ(seen, PassNames());  // read, decompose, schedule
  EXPECT_TRUE(run->decompose.has_value());
  EXPECT_TRUE(run->concerto.has_value());
  seen.clear();
  ASSERT_TRUE(RunScheduler(*in, "fifo", cost, Options{}, [&](const std::string& p, const Program&) {
                seen.push_back(p);
              }).ok());
  EXPECT_EQ(seen, (std::vector<std::string>{"read", "schedule"}));  // decompose is concerto's
  EXPECT_FALSE(MakePass("no-such-pass").ok());
}

}  // namespace
}  // namespace concerto
