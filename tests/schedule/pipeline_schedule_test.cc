// Pipelines (programs of several roles) in the Concerto scheduler: the
// critical-path list schedule over the joined graph of all stages, the
// send/recv pairing it and the windows use, and the search on a tiny 2-stage
// pipeline against a brute-force optimum over every role's stream orders.
#include <gtest/gtest.h>

#include <map>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "concerto/cost/cluster.h"
#include "concerto/ir/comm_streams.h"
#include "concerto/cost/cost_model.h"
#include "concerto/ir/graph_index.h"
#include "concerto/ir/json_io.h"
#include "concerto/lower/frontend.h"
#include "concerto/schedule/concerto_scheduler.h"
#include "concerto/schedule/list_schedule.h"
#include "concerto/schedule/scheduler.h"
#include "concerto/sim/memory.h"
#include "concerto/sim/simulator.h"
#include "brute_force_util.h"

namespace concerto {
namespace {

AnalyticCostModel Cost() { return AnalyticCostModel(LoadCluster("a800-4x8").value()); }

SimOptions Nominal() {
  SimOptions o;
  o.interference = 0;
  return o;
}

/// Two stages, two micro-batches, explicit durations (us; p2p ops 1 us).
/// Stage 0 runs the forwards F1, F2 and the backwards B1, B2 (weight
/// gradients included); stage 1, the last, runs FB (forward and activation
/// gradient) and the weight gradient W of each micro-batch. Program order is
/// 1F1B as a frontend lowers it: stage 0 sends S1, then waits for the
/// gradient R1 before it sends S2; stage 1 runs FB1 s1 W1 before r2.
const char* kTinyPipeline = R"({"format": "concerto-ir", "version": 1, "name": "tiny-pipeline",
 "mesh": {"axes": [{"name": "pp", "size": 2}]},
 "graphs": [
  {"name": "stage0", "streams": ["compute", "comm"],
   "tensors": [{"name": "x1", "shape": [4], "dtype": "f32"}, {"name": "x2", "shape": [4], "dtype": "f32"},
               {"name": "h1", "shape": [4], "dtype": "f32"}, {"name": "h2", "shape": [4], "dtype": "f32"},
               {"name": "g1", "shape": [4], "dtype": "f32"}, {"name": "g2", "shape": [4], "dtype": "f32"},
               {"name": "d1", "shape": [4], "dtype": "f32"}, {"name": "d2", "shape": [4], "dtype": "f32"}],
   "ops": [
    {"id": 0, "name": "F1", "kind": "compute", "type": "scale", "inputs": ["x1"], "outputs": ["h1"], "duration_us": 1},
    {"id": 1, "name": "S1", "kind": "send", "peer": {"axis": "pp", "offset": 1}, "inputs": ["h1"], "outputs": [], "duration_us": 1},
    {"id": 2, "name": "R1", "kind": "recv", "peer": {"axis": "pp", "offset": 1}, "inputs": [], "outputs": ["g1"], "duration_us": 1},
    {"id": 3, "name": "F2", "kind": "compute", "type": "scale", "inputs": ["x2"], "outputs": ["h2"], "duration_us": 1},
    {"id": 4, "name": "S2", "kind": "send", "peer": {"axis": "pp", "offset": 1}, "inputs": ["h2"], "outputs": [], "duration_us": 1},
    {"id": 5, "name": "B1", "kind": "compute", "type": "scale", "inputs": ["g1"], "outputs": ["d1"], "duration_us": 2},
    {"id": 6, "name": "R2", "kind": "recv", "peer": {"axis": "pp", "offset": 1}, "inputs": [], "outputs": ["g2"], "duration_us": 1},
    {"id": 7, "name": "B2", "kind": "compute", "type": "scale", "inputs": ["g2"], "outputs": ["d2"], "duration_us": 2}]},
  {"name": "stage1", "streams": ["compute", "comm"],
   "tensors": [{"name": "h1", "shape": [4], "dtype": "f32"}, {"name": "h2", "shape": [4], "dtype": "f32"},
               {"name": "g1", "shape": [4], "dtype": "f32"}, {"name": "g2", "shape": [4], "dtype": "f32"},
               {"name": "w1", "shape": [4], "dtype": "f32"}, {"name": "w2", "shape": [4], "dtype": "f32"}],
   "ops": [
    {"id": 0, "name": "r1", "kind": "recv", "peer": {"axis": "pp", "offset": -1}, "inputs": [], "outputs": ["h1"], "duration_us": 1},
    {"id": 1, "name": "FB1", "kind": "compute", "type": "scale", "inputs": ["h1"], "outputs": ["g1"], "duration_us": 2},
    {"id": 2, "name": "s1", "kind": "send", "peer": {"axis": "pp", "offset": -1}, "inputs": ["g1"], "outputs": [], "duration_us": 1},
    {"id": 3, "name": "W1", "kind": "compute", "type": "scale", "inputs": ["g1"], "outputs": ["w1"], "duration_us": 3},
    {"id": 4, "name": "r2", "kind": "recv", "peer": {"axis": "pp", "offset": -1}, "inputs": [], "outputs": ["h2"], "duration_us": 1},
    {"id": 5, "name": "FB2", "kind": "compute", "type": "scale", "inputs": ["h2"], "outputs": ["g2"], "duration_us": 2},
    {"id": 6, "name": "s2", "kind": "send", "peer": {"axis": "pp", "offset": -1}, "inputs": ["g2"], "outputs": [], "duration_us": 1},
    {"id": 7, "name": "W2", "kind": "compute", "type": "scale", "inputs": ["g2"], "outputs": ["w2"], "duration_us": 1}]}],
 "roles": [{"name": "stage0", "graph": "stage0", "ranks": [0]}, {"name": "stage1", "graph": "stage1", "ranks": [1]}]})";

Program TinyPipeline() { return ParseProgram(kTinyPipeline, "tiny-pipeline").value(); }

/// A role's stream order as op names.
std::vector<std::string> Names(const Program& p, const Schedule& s, const std::string& role, const std::string& stream) {
  const Role& r = p.roles[p.roles[0].name == role ? 0 : 1];
  const Graph& g = p.GraphOf(r);
  std::vector<std::string> out;
  for (const StreamOrder& so : s.ForRole(role)->streams)
    if (so.stream == stream)
      for (int id : so.op_ids)
        for (const Op& op : g.ops)
          if (op.id == id) out.push_back(op.name);
  return out;
}

TEST(PipelineSchedule, PairsTheKthSendOfAKeyWithTheKthRecv) {
  Program p = TinyPipeline();
  std::vector<std::vector<RoleOp>> partner = PairSendRecv(p);
  ASSERT_EQ(partner.size(), 2u);
  // Stage 0's S1 (op 1) and S2 (op 4) meet stage 1's r1 (op 0) and r2 (op
  // 4); stage 1's s1 (op 2) and s2 (op 6) meet R1 (op 2) and R2 (op 6).
  EXPECT_EQ(partner[0][1], (RoleOp{1, 0}));
  EXPECT_EQ(partner[0][4], (RoleOp{1, 4}));
  EXPECT_EQ(partner[1][2], (RoleOp{0, 2}));
  EXPECT_EQ(partner[1][6], (RoleOp{0, 6}));
  EXPECT_EQ(partner[0][0], (RoleOp{}));  // F1 is no send/recv
  EXPECT_EQ(partner[1][3], (RoleOp{}));
}

// The 1F1B program order (fifo), every p2p op 1 us and pairing as it must:
//
//   stage0 compute |F1 0-1|F2 1-2|       |B1 5-7|        |B2 10-12|
//   stage0 comm           |S1 1-2|  |R1 4-5|S2 5-6|   |R2 9-10|
//   stage1 comm           |r1 1-2|  |s1 4-5|r2 5-6|   |s2 9-10|
//   stage1 compute             |FB1 2-4|W1 4-7|FB2 7-9|W2 9-10|
//
// S2 waits behind R1 on stage 0's comm stream and r2 behind s1 on stage 1's
// (r2 ends at 6), and W1 holds stage 1's compute until 7, so FB2 runs 7-9,
// s2/R2 9-10 and B2 10-12: makespan 12. Every baseline ends at 12 or later,
// and so did concerto before the list schedule: its windows keep each
// stream's send/recv order as in the starting point, and W1 before FB2
// costs nothing as long as r2 arrives at 6.
//
// The list schedule, and the optimum (brute_force_util.h over 24 x 24 x 6 x
// 6 = 20736 combinations of stream orders: stage 0's four compute ops and four
// p2p ops are unordered by data, stage 1 has r1 < s1, r2 < s2, FB1 < W1 and
// FB2 < W2): stage 0 sends S2 as soon as F2 ends, before it waits for R1;
// stage 1 receives r2 before it sends s1 and defers W1 (nothing on stage 0
// waits for it) behind FB2, as zero-bubble pipelines do:
//
//   stage0 compute |F1 0-1|F2 1-2|       |B1 5-7|B2 7-9|
//   stage0 comm           |S1 1-2|S2 2-3|R1 4-5|R2 6-7|
//   stage1 comm           |r1 1-2|r2 2-3|s1 4-5|s2 6-7|
//   stage1 compute             |FB1 2-4|FB2 4-6|W1 6-9|W2 9-10|
//
// Stage 1's compute cannot start before 2 (F1, then S1/r1) and runs
// 2+2+3+1 = 8 us without a gap: 10.
TEST(PipelineSchedule, TinyPipelineReachesTheBruteForceOptimum) {
  Program p = TinyPipeline();
  AnalyticCostModel cost = Cost();
  EXPECT_DOUBLE_EQ(testing::BruteForceOptimum(p, cost), 10.0);

  BaselineOptions bo;
  for (const std::string& name : BaselineNames()) {
    Result<ScheduledProgram> b = RunBaseline(name, p, cost, bo);
    ASSERT_TRUE(b.ok()) << name << ": " << b.status().message();
    Result<Timeline> t = Simulate(*b, cost, Nominal());
    ASSERT_TRUE(t.ok()) << name;
    EXPECT_GE(t->makespan_us, 12.0) << name;
    if (name == "fifo") {
      EXPECT_DOUBLE_EQ(t->makespan_us, 12.0);
    }
  }

  Result<Schedule> list = CriticalPathListSchedule(p, cost);
  ASSERT_TRUE(list.ok()) << list.status().message();
  EXPECT_TRUE(VerifySchedule(p, *list).empty());
  EXPECT_EQ(Names(p, *list, "stage0", "compute"), (std::vector<std::string>{"F1", "F2", "B1", "B2"}));
  EXPECT_EQ(Names(p, *list, "stage0", "comm"), (std::vector<std::string>{"S1", "S2", "R1", "R2"}));
  EXPECT_EQ(Names(p, *list, "stage1", "comm"), (std::vector<std::string>{"r1", "r2", "s1", "s2"}));
  EXPECT_EQ(Names(p, *list, "stage1", "compute"), (std::vector<std::string>{"FB1", "FB2", "W1", "W2"}));
  Result<Timeline> lt = Simulate({p, *list}, cost, Nominal());
  ASSERT_TRUE(lt.ok());
  EXPECT_DOUBLE_EQ(lt->makespan_us, 10.0);

  ConcertoOptions o;
  o.sim.interference = 0;
  o.fuse = false;
  ConcertoReport report;
  std::vector<std::string> progress;
  Result<ScheduledProgram> c = RunConcerto(p, cost, o, &report, [&](const std::string& l) { progress.push_back(l); });
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(VerifySchedule(c->program, c->schedule).empty());
  EXPECT_DOUBLE_EQ(report.incumbent_makespan_us, 12.0);  // the best baseline, the fallback
  EXPECT_DOUBLE_EQ(report.final_makespan_us, 10.0);
  Result<Timeline> ct = Simulate(*c, cost, Nominal());
  ASSERT_TRUE(ct.ok());
  EXPECT_DOUBLE_EQ(ct->makespan_us, 10.0);
  // The progress says which starting point won.
  EXPECT_TRUE(std::any_of(progress.begin(), progress.end(),
                          [](const std::string& l) { return l.find("search starts from 'list'") != std::string::npos; }));
}

// With blocks of 2 ops, several windows per stage, each solved against the
// joined timeline: the result verifies, is no slower than the optimum found
// from the list schedule, and the same input gives the same schedule.
TEST(PipelineSchedule, SameInputSameScheduleAndVerified) {
  Program p = TinyPipeline();
  AnalyticCostModel cost = Cost();
  ConcertoOptions o;
  o.block_ops = 2;  // several windows per stage
  o.sim.interference = 0;
  ConcertoReport report;
  Result<ScheduledProgram> a = RunConcerto(p, cost, o, &report);
  Result<ScheduledProgram> b = RunConcerto(p, cost, o, nullptr);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_DOUBLE_EQ(report.final_makespan_us, 10.0);
  EXPECT_TRUE(VerifySchedule(a->program, a->schedule).empty());
  EXPECT_EQ(WriteSchedule(a->schedule), WriteSchedule(b->schedule));
}

/// Pipeline plans over 8 ranks (plain and interleaved 1F1B).
const std::vector<std::string>& PipelinePlans() {
  static const std::vector<std::string> plans = {
      "pp=2,tp=4,microbatches=2",
      "pp=2,dp=2,tp=2,microbatches=4,vstages=2",
      "pp=4,dp=2,microbatches=4",
      "pp=8,microbatches=8",
  };
  return plans;
}

// The list schedule (free and in order) of every preset under every plan
// that lowers to a pipeline passes the schedule verifier (sends and recvs pair, SPMD ranks of
// a stage share one order) and runs to the end without deadlock.
TEST(PipelineSchedule, ListScheduleVerifiesOnEveryPipelinePlan) {
  AnalyticCostModel cost = Cost();
  int pipelines = 0;
  for (const std::string& model : AllModelPresetNames()) {
    for (const std::string& plan : PipelinePlans()) {
      Result<Program> p = LowerModelPlan(model, plan);
      if (!p.ok() || p->roles.size() < 2) continue;
      SCOPED_TRACE(model + " " + plan);
      ++pipelines;
      for (const bool in_order : {false, true}) {
        SCOPED_TRACE(in_order ? "in order" : "free");
        Result<Schedule> list = CriticalPathListSchedule(*p, cost, ListScheduleOptions{in_order});
        ASSERT_TRUE(list.ok()) << list.status().message();
        const std::vector<std::string> v = VerifySchedule(*p, *list);
        EXPECT_TRUE(v.empty()) << v.front();
        Result<Timeline> t = Simulate({*p, *list}, cost);
        EXPECT_TRUE(t.ok()) << t.status().message();
      }
    }
  }
  EXPECT_GE(pipelines, 8);  // the sweep is not vacuous
}

// The in-order list schedule (ListScheduleOptions::in_order) on gpt-6.7b
// pp=4 with 8 micro-batches (no tp or dp: 4 one-rank stages): every stage
// issues its sends and recvs in program order (1F1B's order of transfers),
// where the free list schedule does not; it verifies and is no slower than
// fifo (1F1B as lowered). Memory is printed, not asserted: the order of
// transfers does not bound it by itself (here 169 GB in order, 173 GB
// free, 92 GB for fifo: stage 0 runs its next forward before the backward a
// recv released; with tp=4,dp=2 the in-order peak is 1F1B's,
// docs/concerto.md).
TEST(PipelineSchedule, InOrderListScheduleIssuesTransfersInProgramOrder) {
  AnalyticCostModel cost = Cost();
  Program p = LowerModelPlan("gpt-6.7b", "pp=4,microbatches=8").value();
  auto run = [&](const Schedule& s) {
    EXPECT_TRUE(VerifySchedule(p, s).empty());
    Result<Timeline> t = Simulate({p, s}, cost);
    EXPECT_TRUE(t.ok()) << t.status().message();
    return *t;
  };
  const Schedule fifo = RunBaseline("fifo", p, cost).value().schedule;
  const Schedule free = CriticalPathListSchedule(p, cost).value();
  const Schedule in_order = CriticalPathListSchedule(p, cost, ListScheduleOptions{true}).value();
  const Timeline tf = run(fifo), tl = run(free), to = run(in_order);
  // Sends and recvs of each stage's representative that start out of
  // program order (after a later one) on their stream: each peer pair has
  // its own stream (p2p.pp+1, p2p.pp-1), carrying both directions.
  auto out_of_order = [&](const Timeline& t) {
    int count = 0;
    for (const Role& role : p.roles) {
      const int rep = *std::min_element(role.ranks.begin(), role.ranks.end());
      std::map<std::string, std::vector<std::pair<double, int>>> p2p;  // stream -> (start, op index)
      for (const OpRecord& r : t.records) {
        const Op& op = p.GraphOf(role).ops[r.op_index];
        if (r.rank == rep && (op.kind == OpKind::kSend || op.kind == OpKind::kRecv))
          p2p[op.stream].push_back({r.start_us, r.op_index});
      }
      size_t total = 0;
      for (auto& [stream, ops] : p2p) {
        total += ops.size();
        std::stable_sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        for (size_t k = 1; k < ops.size(); ++k) count += ops[k - 1].second > ops[k].second;
      }
      EXPECT_GT(total, 8u) << role.name;
    }
    return count;
  };
  EXPECT_EQ(out_of_order(to), 0);
  EXPECT_GT(out_of_order(tl), 0) << "the free list schedule reorders transfers; the test would not test much";
  const int64_t peak_fifo = PeakMemory(p, tf).peak_bytes, peak_free = PeakMemory(p, tl).peak_bytes,
                peak_in_order = PeakMemory(p, to).peak_bytes;
  std::printf("gpt-6.7b pp=4 mb=8: fifo %.1f us %lld B, list %.1f us %lld B, in order %.1f us %lld B\n",
              tf.makespan_us, static_cast<long long>(peak_fifo), tl.makespan_us, static_cast<long long>(peak_free),
              to.makespan_us, static_cast<long long>(peak_in_order));
  EXPECT_LE(to.makespan_us, tf.makespan_us);
}

}  // namespace
}  // namespace concerto
