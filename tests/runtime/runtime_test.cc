// The runtime: the in-process communicator (every collective, rendezvous,
// timeouts, mismatches), the executor (fused collectives, send/recv,
// refusal of bad schedules, measured timelines and their Chrome trace) and
// the reference check: gpt-tiny and llama-tiny under dp, tp, sp, ZeRO 1-3
// and pp, and the mixture of experts mixtral-tiny under dp, ep, ep with tp
// and pp, and ZeRO-3, and the Evoformer (with its distogram and masked-MSA
// losses) under dap, dp and both, each under the fifo schedule and
// rewritten ones, reproduce the unsharded run's loss, gradients and updated
// parameters (docs/runtime.md); the initializer's Evoformer constants.
#include <gtest/gtest.h>

#include <ostream>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "concerto/cost/cluster.h"
#include "concerto/cost/cost_model.h"
#include "concerto/ir/graph_index.h"
#include "concerto/ir/verifier.h"
#include "concerto/lower/evoformer.h"
#include "concerto/lower/plan.h"
#include "concerto/lower/transformer.h"
#include "concerto/report/report.h"
#include "concerto/runtime/communicator.h"
#include "concerto/runtime/executor.h"
#include "concerto/runtime/reference.h"
#include "concerto/schedule/concerto_scheduler.h"
#include "concerto/schedule/scheduler.h"
#include "concerto/sim/memory.h"
#include "concerto/sim/simulator.h"

namespace concerto {
namespace {

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

// ---- the in-process communicator --------------------------------------------

/// Runs fn(rank, endpoint) on every rank of `world`, one thread each.
void OnAllRanks(FakeWorld& world, const std::function<void(int, Communicator&)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world.size(); ++r)
    threads.emplace_back([&, r] { fn(r, world.endpoint(r)); });
  for (std::thread& t : threads) t.join();
}

/// The value rank r contributes at element i in the collective tests.
float Input(int r, int i) { return static_cast<float>(10 * r + i) + 0.25f; }

TEST(FakeCommunicator, EveryCollectiveOnSubgroups) {
  FakeWorld world(3);
  const std::vector<int> all = {0, 1, 2}, pair = {0, 2};
  OnAllRanks(world, [&](int r, Communicator& c) {
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.size(), 3);
    std::vector<float> in(6), out(18);
    for (int i = 0; i < 6; ++i) in[i] = Input(r, i);
    ASSERT_TRUE(c.AllReduce(all, ReduceOp::kSum, in.data(), out.data(), 6).ok());
    for (int i = 0; i < 6; ++i) EXPECT_EQ(out[i], Input(0, i) + Input(1, i) + Input(2, i));
    ASSERT_TRUE(c.AllReduce(all, ReduceOp::kMax, in.data(), out.data(), 6).ok());
    for (int i = 0; i < 6; ++i) EXPECT_EQ(out[i], Input(2, i));
    ASSERT_TRUE(c.AllGather(all, in.data(), out.data(), 6).ok());
    for (int m = 0; m < 3; ++m)
      for (int i = 0; i < 6; ++i) EXPECT_EQ(out[m * 6 + i], Input(m, i));
    ASSERT_TRUE(c.ReduceScatter(all, ReduceOp::kSum, in.data(), out.data(), 2).ok());
    for (int i = 0; i < 2; ++i)
      EXPECT_EQ(out[i], Input(0, 2 * r + i) + Input(1, 2 * r + i) + Input(2, 2 * r + i));
    ASSERT_TRUE(c.AllToAll(all, in.data(), out.data(), 2).ok());
    for (int m = 0; m < 3; ++m)
      for (int i = 0; i < 2; ++i) EXPECT_EQ(out[m * 2 + i], Input(m, 2 * r + i));
    ASSERT_TRUE(c.Broadcast(all, in.data(), out.data(), 6).ok());
    for (int i = 0; i < 6; ++i) EXPECT_EQ(out[i], Input(0, i));
    if (r != 1) {  // a subgroup; in place; its root is rank 0
      std::vector<float> buf = in;
      ASSERT_TRUE(c.AllReduce(pair, ReduceOp::kSum, buf.data(), buf.data(), 6).ok());
      for (int i = 0; i < 6; ++i) EXPECT_EQ(buf[i], Input(0, i) + Input(2, i));
    }
  });
}

TEST(FakeCommunicator, SendRecvPairByTagInOrder) {
  FakeWorld world(2);
  OnAllRanks(world, [&](int r, Communicator& c) {
    if (r == 0) {
      const float a[2] = {1, 2}, b[2] = {3, 4}, d[1] = {5};
      ASSERT_TRUE(c.Send(a, 2, 1, 7).ok());
      ASSERT_TRUE(c.Send(b, 2, 1, 7).ok());
      ASSERT_TRUE(c.Send(d, 1, 1, 0).ok());
    } else {
      float x[2], y[2], z[1];
      ASSERT_TRUE(c.Recv(x, 2, 0, 7).ok());
      ASSERT_TRUE(c.Recv(y, 2, 0, 7).ok());
      ASSERT_TRUE(c.Recv(z, 1, 0, 0).ok());
      EXPECT_EQ(x[1], 2);
      EXPECT_EQ(y[0], 3);
      EXPECT_EQ(z[0], 5);
    }
  });
}

TEST(FakeCommunicator, MissingMemberTimesOutNamingRankAndOp) {
  FakeWorldOptions options;
  options.timeout_s = 0.2;
  FakeWorld world(2, options);
  float x = 1;
  Status st = world.endpoint(0).AllReduce({0, 1}, ReduceOp::kSum, &x, &x, 1);
  ASSERT_FALSE(st.ok());
  EXPECT_HAS(st.message(), "rank 0: all_reduce (sum) of 1 floats on group [0, 1]");
  EXPECT_HAS(st.message(), "timed out after 0.2 s waiting for rank(s) [1]");
  Status recv = world.endpoint(1).Recv(&x, 1, 0, 3);
  ASSERT_FALSE(recv.ok());
  EXPECT_HAS(recv.message(), "rank 1: recv of 1 floats from rank 0 tag 3: timed out");
}

TEST(FakeCommunicator, MembersThatDisagreeFail) {
  FakeWorld world(2);
  std::vector<Status> results(2);
  OnAllRanks(world, [&](int r, Communicator& c) {
    std::vector<float> buf(5, 1.0f);
    results[r] = r == 0 ? c.AllReduce({0, 1}, ReduceOp::kSum, buf.data(), buf.data(), 4)
                        : c.AllGather({0, 1}, buf.data(), buf.data(), 2);
  });
  for (const Status& st : results) {
    ASSERT_FALSE(st.ok());
    EXPECT_HAS(st.message(), "members disagree: rank 0 issued all_reduce (sum) of 4 floats, "
                             "rank 1 issued all_gather of 2 floats");
  }
}

TEST(FakeCommunicator, AbortWakesWaitingRanks) {
  FakeWorld world(2);
  // The waiter's status names the abort: a rank left waiting would report a timeout instead.
  std::thread waiter([&] {
    float x = 0;
    Status st = world.endpoint(0).AllReduce({0, 1}, ReduceOp::kSum, &x, &x, 1);
    EXPECT_HAS(st.message(), "aborted (rank 1 failed)");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  world.endpoint(1).Abort("rank 1 failed");
  waiter.join();
  EXPECT_EQ(world.abort_reason(), "rank 1 failed");
  EXPECT_TRUE(world.endpoint(0).aborted());
}

// ---- the executor on hand-built programs ---------------------------------------

/// A float tensor `name` of local `shape` with `sharding`.
Tensor F32(const std::string& name, std::vector<int64_t> shape,
           std::vector<std::vector<std::string>> sharding = {}) {
  Tensor t;
  t.name = name;
  t.shape = std::move(shape);
  t.dtype = DType::kF32;
  t.sharding = sharding.empty() ? std::vector<std::vector<std::string>>(t.shape.size()) : sharding;
  return t;
}

/// A collective op over `group` from `inputs` to `outputs`.
Op Coll(int id, const std::string& name, CollectiveType type, Group group,
        std::vector<std::string> inputs, std::vector<std::string> outputs,
        ReduceOp reduce = ReduceOp::kSum) {
  Op op;
  op.id = id;
  op.name = name;
  op.kind = OpKind::kCollective;
  op.stream = "comm";
  op.collective = type;
  op.reduce = reduce;
  op.group = std::move(group);
  op.inputs = std::move(inputs);
  op.outputs = std::move(outputs);
  op.message_bytes = 4;
  return op;
}

/// Mesh {a: 2, b: 2}; fused collectives of every type, each pair differing
/// on its own dimension.
Program FusedCollectiveProgram() {
  Program p;
  p.name = "fused";
  p.mesh.axes = {{"a", 2}, {"b", 2}};
  Graph g;
  g.name = "main";
  const std::vector<std::vector<std::string>> ab = {{"a"}, {"b"}};
  g.tensors = {F32("p0", {2, 3}, ab), F32("p1", {4}, {{"a", "b"}}), F32("ar0", {2, 3}), F32("ar1", {4}),
               F32("g0", {2, 3}, ab), F32("g1", {3, 2}, {{"b"}, {"a"}}), F32("ag0", {2, 6}), F32("ag1", {6, 2}),
               F32("r0", {4, 2}, ab), F32("r1", {3, 4}, ab), F32("rs0", {2, 2}), F32("rs1", {3, 2}),
               F32("x0", {4}, {{"a", "b"}}), F32("x1", {2, 4}, ab), F32("a2a0", {4}), F32("a2a1", {2, 4}),
               F32("y0", {3}, {{"b"}}), F32("y1", {2}, {{"a"}}), F32("bc0", {3}), F32("bc1", {2}),
               F32("mx", {5}, {{"b"}})};
  g.tensors.push_back(F32("mx.out", {5}));
  g.ops = {Coll(0, "ar", CollectiveType::kAllReduce, {{"a", "b"}, {}}, {"p0", "p1"}, {"ar0", "ar1"}),
           Coll(1, "ag", CollectiveType::kAllGather, {{"b"}, {}}, {"g0", "g1"}, {"ag0", "ag1"}),
           Coll(2, "rs", CollectiveType::kReduceScatter, {{"b"}, {}}, {"r0", "r1"}, {"rs0", "rs1"}),
           Coll(3, "a2a", CollectiveType::kAllToAll, {{"a"}, {}}, {"x0", "x1"}, {"a2a0", "a2a1"}),
           Coll(4, "bc", CollectiveType::kBroadcast, {{}, {0, 1, 2, 3}}, {"y0", "y1"}, {"bc0", "bc1"}),
           Coll(5, "max", CollectiveType::kAllReduce, {{"b"}, {}}, {"mx"}, {"mx.out"}, ReduceOp::kMax)};
  p.graphs.push_back(std::move(g));
  p.roles.push_back({"spmd", "main", {0, 1, 2, 3}});
  return p;
}

/// Tensor `name` on `rank` after the run.
const std::vector<float>& Val(const ExecutionResult& run, int rank, const std::string& name) {
  const std::vector<float>* v = run.Rank(rank).Find(name);
  EXPECT_NE(v, nullptr) << name;
  static const std::vector<float> empty;
  return v ? *v : empty;
}

TEST(Executor, FusedCollectivesOfEveryType) {
  Program p = FusedCollectiveProgram();
  ASSERT_TRUE(CheckProgram(p, "fused").ok()) << CheckProgram(p, "fused").message();
  ScheduledProgram sp{p, ProgramOrderSchedule(p, "fifo")};
  Result<ExecutionResult> run = RunInProcess(sp);
  ASSERT_TRUE(run.ok()) << run.status().message();
  for (int r = 0; r < 4; ++r) {
    const int b_peer = r ^ 1, a_peer = r ^ 2;  // rank = 2 c_a + c_b
    const std::vector<int> b_group = {std::min(r, b_peer), std::max(r, b_peer)};
    const std::vector<int> a_group = {std::min(r, a_peer), std::max(r, a_peer)};
    for (int i = 0; i < 6; ++i)
      EXPECT_EQ(Val(*run, r, "ar0")[i], ((Val(*run, 0, "p0")[i] + Val(*run, 1, "p0")[i]) +
                                         Val(*run, 2, "p0")[i]) + Val(*run, 3, "p0")[i]);
    for (int i = 0; i < 2; ++i)
      for (int m = 0; m < 2; ++m)
        for (int j = 0; j < 3; ++j) {  // ag0 [2, 6]: dim 1 gathered
          EXPECT_EQ(Val(*run, r, "ag0")[i * 6 + m * 3 + j], Val(*run, b_group[m], "g0")[i * 3 + j]);
          EXPECT_EQ(Val(*run, r, "ag1")[(m * 3 + j) * 2 + i], Val(*run, b_group[m], "g1")[j * 2 + i]);
        }
    const int me_b = r & 1;
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j)  // rs0: rows [2 me_b, 2 me_b + 2) of r0 [4, 2]
        EXPECT_EQ(Val(*run, r, "rs0")[i * 2 + j],
                  Val(*run, b_group[0], "r0")[(2 * me_b + i) * 2 + j] + Val(*run, b_group[1], "r0")[(2 * me_b + i) * 2 + j]);
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 2; ++j)  // rs1: columns [2 me_b, 2 me_b + 2) of r1 [3, 4]
        EXPECT_EQ(Val(*run, r, "rs1")[i * 2 + j],
                  Val(*run, b_group[0], "r1")[i * 4 + 2 * me_b + j] + Val(*run, b_group[1], "r1")[i * 4 + 2 * me_b + j]);
    const int me_a = r >> 1;
    for (int m = 0; m < 2; ++m) {  // chunk me_a of member m, at position m
      for (int j = 0; j < 2; ++j) EXPECT_EQ(Val(*run, r, "a2a0")[m * 2 + j], Val(*run, a_group[m], "x0")[me_a * 2 + j]);
      for (int j = 0; j < 4; ++j) EXPECT_EQ(Val(*run, r, "a2a1")[m * 4 + j], Val(*run, a_group[m], "x1")[me_a * 4 + j]);
    }
    EXPECT_EQ(Val(*run, r, "bc0"), Val(*run, 0, "y0"));
    EXPECT_EQ(Val(*run, r, "bc1"), Val(*run, 0, "y1"));
    for (int i = 0; i < 5; ++i)
      EXPECT_EQ(Val(*run, r, "mx.out")[i], std::max(Val(*run, b_group[0], "mx")[i], Val(*run, b_group[1], "mx")[i]));
  }
}

TEST(Executor, FusedSendRecvBetweenStages) {
  Program p;
  p.name = "p2p";
  p.mesh.axes = {{"pp", 2}};
  Graph s0, s1;
  s0.name = "s0";
  s1.name = "s1";
  s0.tensors = {F32("u", {3}), F32("w", {2, 2})};
  s1.tensors = {F32("u.in", {3}), F32("w.in", {2, 2})};
  Op send;
  send.id = 0;
  send.name = "send";
  send.kind = OpKind::kSend;
  send.stream = "comm";
  send.inputs = {"u", "w"};
  send.peer.axis = "pp";
  send.peer.offset = 1;
  send.tag = 5;
  send.message_bytes = 28;
  Op recv = send;
  recv.name = "recv";
  recv.kind = OpKind::kRecv;
  recv.inputs = {};
  recv.outputs = {"u.in", "w.in"};
  recv.peer.offset = -1;
  s0.ops = {send};
  s1.ops = {recv};
  p.graphs = {s0, s1};
  p.roles = {{"stage0", "s0", {0}}, {"stage1", "s1", {1}}};
  ScheduledProgram sp{p, ProgramOrderSchedule(p, "fifo")};
  Result<ExecutionResult> run = RunInProcess(sp);
  ASSERT_TRUE(run.ok()) << run.status().message();
  EXPECT_EQ(Val(*run, 1, "u.in"), Val(*run, 0, "u"));
  EXPECT_EQ(Val(*run, 1, "w.in"), Val(*run, 0, "w"));
}

// ---- reference equivalence ---------------------------------------------------

/// The analytic cost model the schedulers plan with.
const CostModel& Cost() {
  static const AnalyticCostModel* cost = [] {
    Result<ClusterSpec> c = LoadCluster("a800-4x8");
    EXPECT_TRUE(c.ok());
    return new AnalyticCostModel(c.value());
  }();
  return *cost;
}

/// One parallel configuration to check against the reference.
struct Case {
  std::string model;  // preset
  std::string plan;
  std::string scheduler;  // a baseline name, or "concerto"
};

/// How ctest and gtest print a case (instead of its raw bytes).
void PrintTo(const Case& c, std::ostream* os) { *os << c.model << " " << c.plan << " " << c.scheduler; }

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  std::string s = info.param.model + "_" + info.param.plan + "_" + info.param.scheduler;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

/// The model and plan of a case, and the unsharded reference of the same
/// global data: dp=1, tp=1, batch = dp x batch, the same micro-batches.
struct Lowered {
  ModelConfig model;
  ParallelPlan plan;
  Program program;
  Program reference;
};

Lowered Lower(const Case& c) {
  Lowered l;
  l.model = ModelPreset(c.model).value();
  l.plan = ParsePlan(c.plan).value();
  Result<Program> p = LowerTransformer(l.model, l.plan);
  EXPECT_TRUE(p.ok()) << p.status().message();
  l.program = p.ok() ? *p : Program{};
  ModelConfig ref_model = l.model;
  ref_model.batch = l.model.batch * l.plan.dp;
  ParallelPlan ref_plan;
  ref_plan.microbatches = l.plan.microbatches;
  Result<Program> r = LowerTransformer(ref_model, ref_plan);
  EXPECT_TRUE(r.ok()) << r.status().message();
  l.reference = r.ok() ? *r : Program{};
  return l;
}

/// The layouts of the decoder frontend's fused tensors for `model`.
std::vector<SegmentedLayout> Layouts(const ModelConfig& m) {
  const int64_t d = m.hidden / m.heads;
  return {FusedQkvLayout(m.hidden, int64_t{m.kv_heads} * d)};
}

/// Schedules `program` with `scheduler`.
ScheduledProgram Schedule(const Program& program, const std::string& scheduler) {
  if (scheduler == "concerto") {
    ConcertoOptions o;
    o.block_ops = 40;
    o.rounds = 1;
    o.window_time_limit_s = 0.2;
    o.time_budget_s = 2;
    ConcertoReport report;
    Result<ScheduledProgram> sp = RunConcerto(program, Cost(), o, &report);
    EXPECT_TRUE(sp.ok()) << sp.status().message();
    return sp.ok() ? *sp : ScheduledProgram{};
  }
  Result<ScheduledProgram> sp = RunBaseline(scheduler, program, Cost());
  EXPECT_TRUE(sp.ok()) << sp.status().message();
  return sp.ok() ? *sp : ScheduledProgram{};
}

/// The reference run of a (model, micro-batches, dp) combination, cached.
struct ReferenceRun {
  ScheduledProgram sp;
  ExecutionResult run;
};

const ReferenceRun& Reference(const Lowered& l, const RunOptions& options) {
  static std::map<std::string, ReferenceRun> cache;
  const std::string key = l.reference.name + ".batch" + std::to_string(l.model.batch * l.plan.dp);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  ReferenceRun rr;
  rr.sp = Schedule(l.reference, "fifo");
  Result<ExecutionResult> run = RunInProcess(rr.sp, options);
  EXPECT_TRUE(run.ok()) << run.status().message();
  if (run.ok()) rr.run = std::move(run).value();
  return cache.emplace(key, std::move(rr)).first->second;
}

class ReferenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(ReferenceTest, MatchesUnshardedRun) {
  const Case& c = GetParam();
  const Lowered l = Lower(c);
  RunOptions options;
  options.init.layouts = Layouts(l.model);
  const ReferenceRun& ref = Reference(l, options);
  const ScheduledProgram sp = Schedule(l.program, c.scheduler);
  Result<ExecutionResult> run = RunInProcess(sp, options);
  ASSERT_TRUE(run.ok()) << run.status().message();
  Result<ReferenceReport> report =
      CompareToReference(ref.sp, ref.run, sp, *run, Tolerance{}, options.init.layouts);
  ASSERT_TRUE(report.ok()) << report.status().message();
  std::printf("  %s %s %s: %s\n", c.model.c_str(), c.plan.c_str(), c.scheduler.c_str(),
              report->Summary().c_str());
}

/// The plans every model runs under.
const std::vector<std::string>& Plans() {
  static const std::vector<std::string> plans = {"dp=2",        "tp=2",        "dp=2,tp=2",
                                                 "tp=2,sp",     "dp=2,zero=1", "dp=2,zero=2",
                                                 "dp=2,zero=3", "pp=2,microbatches=2",
                                                 // activation recomputation (docs/frontends.md)
                                                 "dp=2,tp=2,recompute=selective", "tp=2,sp,recompute=full",
                                                 "dp=2,zero=3,recompute=full",
                                                 "pp=2,microbatches=2,recompute=full"};
  return plans;
}

/// Every plan with fifo, plus the rewritten schedules that change something
/// on that plan (fused buckets, control edges, reordering; checked on
/// these tiny models): ddp buckets the dp gradient all-reduces, zero the
/// reduce-scatters and all-gathers, megatron makes tp collectives
/// synchronous, sequential serializes everything, xla-lhs and concerto
/// reorder (concerto also fuses ZeRO-3's all-gathers). With
/// CONCERTO_RUNTIME_FULL=1 in the environment: every plan x every scheduler.
std::vector<Case> Cases() {
  const bool full = std::getenv("CONCERTO_RUNTIME_FULL") != nullptr;
  const std::map<std::string, std::vector<std::string>> rewritten = {
      {"dp=2", {"ddp", "xla-lhs", "concerto"}},
      {"tp=2", {"megatron", "sequential"}},
      {"dp=2,tp=2", {"ddp", "megatron", "concerto"}},
      {"tp=2,sp", {"ddp", "xla-lhs", "megatron-tp-overlap"}},
      {"dp=2,zero=1", {"zero"}},
      {"dp=2,zero=2", {"zero", "deepspeed-overlap"}},
      {"dp=2,zero=3", {"zero", "concerto"}},
      {"pp=2,microbatches=2", {"sequential", "xla-lhs", "zb-h1", "concerto"}},
      {"dp=2,tp=2,recompute=selective", {"megatron"}},
      {"tp=2,sp,recompute=full", {"megatron-tp-overlap", "concerto"}},
      {"dp=2,zero=3,recompute=full", {"zero"}},
      {"pp=2,microbatches=2,recompute=full", {"xla-lhs"}}};
  const std::vector<std::string> all = {"sequential", "ddp",      "megatron", "megatron-tp-overlap", "zb-h1",
                                        "zero",       "deepspeed-overlap", "xla-lhs",  "concerto"};
  std::vector<Case> cases;
  for (const std::string model : {"gpt-tiny", "llama-tiny"})
    for (const std::string& plan : Plans()) {
      cases.push_back({model, plan, "fifo"});
      for (const std::string& sched : full ? all : rewritten.at(plan)) cases.push_back({model, plan, sched});
    }
  // The mixture of experts (mixtral-tiny: 4 experts, top-2, capacity 32 slots
  // per expert and sequence, so tokens are dropped): dp without ep; ep=2 (the
  // dispatch and combine all-to-alls; ddp fuses the gradient all-reduces,
  // xla-lhs and concerto reorder); more dp than ep (expert gradients synced
  // over dp); ep with tp (the experts' tp all-reduces); ep with pp; ZeRO-3.
  const std::vector<std::pair<std::string, std::vector<std::string>>> moe = {
      {"dp=2", {"ddp"}},
      {"dp=2,ep=2", {"ddp", "xla-lhs", "concerto"}},
      {"dp=4,ep=2", {"ddp"}},
      {"dp=2,ep=2,tp=2", {"megatron"}},
      {"pp=2,dp=2,ep=2,microbatches=2", {"xla-lhs"}},
      {"dp=2,zero=3", {"zero"}},
      {"dp=2,ep=2,recompute=full", {"ddp"}}};
  for (const auto& [plan, scheds] : moe) {
    cases.push_back({"mixtral-tiny", plan, "fifo"});
    for (const std::string& sched : full ? all : scheds) cases.push_back({"mixtral-tiny", plan, sched});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Runtime, ReferenceTest, ::testing::ValuesIn(Cases()), CaseName);

// The runtime's allocation ledger (RankSession::PeakMemoryBytes) against the
// simulator's peak on the same schedule: the two apply one rule (a tensor
// lives from its producer's start to its last consumer's end) to different
// event orders, the measured one on this machine's stream threads and the
// cost model's. Within 10% on the tiny models, each recomputation mode.
TEST(RuntimeMemory, MeasuredPeakAgreesWithTheSimulatorWithin10Percent) {
  for (const std::string model : {"gpt-tiny", "llama-tiny"})
    for (const std::string plan : {"dp=2", "tp=2,sp", "pp=2,microbatches=2", "dp=2,tp=2,recompute=full",
                                   "tp=2,recompute=selective"}) {
      const Lowered l = Lower({model, plan, "fifo"});
      const ScheduledProgram sp = Schedule(l.program, "fifo");
      RunOptions options;
      options.init.layouts = Layouts(l.model);
      Result<ExecutionResult> run = RunInProcess(sp, options);
      ASSERT_TRUE(run.ok()) << run.status().message();
      ASSERT_EQ(run->peak_memory_bytes.size(), static_cast<size_t>(l.program.mesh.NumRanks()));
      const int64_t measured = *std::max_element(run->peak_memory_bytes.begin(), run->peak_memory_bytes.end());
      SimOptions all;
      all.all_ranks = true;
      Result<Timeline> timeline = Simulate(sp, Cost(), all);
      ASSERT_TRUE(timeline.ok()) << timeline.status().message();
      const int64_t simulated = PeakMemory(sp.program, *timeline).peak_bytes;
      std::printf("  %s %s: runtime %.3f MiB, simulator %.3f MiB\n", model.c_str(), plan.c_str(),
                  measured / 1048576.0, simulated / 1048576.0);
      EXPECT_GT(measured, 0);
      EXPECT_NEAR(static_cast<double>(measured) / simulated, 1.0, 0.10) << model << " " << plan;
    }
}


// ---- the reference check has teeth -------------------------------------------

TEST(Reference, WrongGradientScaleIsCaughtAndNamed) {
  // A dp=2 program whose loss-gradient scale forgets the 1/dp: Adam's first
  // step hides the factor in the parameters, the gradients do not.
  const Lowered l = Lower({"llama-tiny", "dp=2", "fifo"});
  RunOptions options;
  const ReferenceRun& ref = Reference(l, options);
  Program broken = l.program;
  for (Op& op : broken.graphs[0].ops)
    if (op.name == "loss.grad_scale") op.attrs["scale"] = 1.0;
  ScheduledProgram sp = Schedule(broken, "fifo");
  Result<ExecutionResult> run = RunInProcess(sp, options);
  ASSERT_TRUE(run.ok()) << run.status().message();
  Result<ReferenceReport> report = CompareToReference(ref.sp, ref.run, sp, *run, Tolerance{}, {});
  ASSERT_FALSE(report.ok());
  EXPECT_HAS(report.status().message(), "diverges from the reference: first diverging tensor: gradient of '");
  EXPECT_HAS(report.status().message(), "max error");
}

TEST(Reference, FusedQkvNeedsItsLayout) {
  // Without the segmented layout the tp=2 shards of gpt's fused QKV weight
  // are a different global tensor than the unsharded one: another model.
  const Lowered l = Lower({"gpt-tiny", "tp=2", "fifo"});
  RunOptions plain;
  ScheduledProgram ref_sp = Schedule(l.reference, "fifo");
  Result<ExecutionResult> ref = RunInProcess(ref_sp, plain);
  ASSERT_TRUE(ref.ok());
  ScheduledProgram sp = Schedule(l.program, "fifo");
  Result<ExecutionResult> run = RunInProcess(sp, plain);
  ASSERT_TRUE(run.ok());
  Result<ReferenceReport> report = CompareToReference(ref_sp, *ref, sp, *run, Tolerance{}, {});
  ASSERT_FALSE(report.ok());
  EXPECT_HAS(report.status().message(), "first diverging tensor: loss");
}

TEST(Reference, SchedulesOfOneProgramAgreeBitForBit) {
  // Reordering and fusion change no arithmetic: every schedule of one plan
  // gives the same bits (sums in ascending rank order, fused or not).
  const Lowered l = Lower({"gpt-tiny", "dp=2,tp=2", "fifo"});
  RunOptions options;
  options.init.layouts = Layouts(l.model);
  const ScheduledProgram fifo = Schedule(l.program, "fifo");
  Result<ExecutionResult> base = RunInProcess(fifo, options);
  ASSERT_TRUE(base.ok()) << base.status().message();
  const Tolerance exact{0, 0, 0};
  for (const std::string sched : {"fifo", "ddp", "xla-lhs"}) {
    const ScheduledProgram sp = Schedule(l.program, sched);
    Result<ExecutionResult> run = RunInProcess(sp, options);
    ASSERT_TRUE(run.ok()) << run.status().message();
    Result<ReferenceReport> report = CompareToReference(fifo, *base, sp, *run, exact, options.init.layouts);
    EXPECT_TRUE(report.ok()) << sched << ": " << report.status().message();
  }
}

TEST(Reference, MoeDropsTokensYetShardedRunsMatch) {
  // Capacity is per sequence (GShard groups = sequences): a rank routes its
  // own sequences exactly as the unsharded run routes them, so the dropped
  // (token, choice) pairs are the same. Check that mixtral-tiny does drop:
  // some expert gets more than C = 32 of a sequence's 64 x 2 choices.
  const Lowered l = Lower({"mixtral-tiny", "dp=2,ep=2", "fifo"});
  RunOptions options;
  const ReferenceRun& ref = Reference(l, options);
  const std::vector<float>* ids = ref.run.Rank(0).Find("L0.moe.top_k.ids");
  ASSERT_NE(ids, nullptr);
  const int64_t seq_choices = 64 * 2, capacity = 32;
  ASSERT_EQ(ids->size() % seq_choices, 0u);
  int64_t dropped = 0;
  for (size_t begin = 0; begin < ids->size(); begin += seq_choices) {
    std::vector<int64_t> per_expert(4, 0);
    for (size_t i = begin; i < begin + seq_choices; ++i) ++per_expert[static_cast<int>((*ids)[i])];
    for (int64_t n : per_expert) dropped += std::max<int64_t>(0, n - capacity);
  }
  EXPECT_GT(dropped, 0);
  std::printf("  mixtral-tiny reference, layer 0: %lld of %zu routing choices dropped\n",
              static_cast<long long>(dropped), ids->size());
}

TEST(Reference, MoeWithoutTheExpertTransposeIsCaught) {
  // ep=2 with 2 experts per rank: the all-to-all's output [ep, E/ep, B*C, h]
  // and the experts' [E/ep, ep, B*C, h] have the same shape, so a transpose
  // that swaps nothing still verifies, but feeds each expert the wrong rows.
  const Lowered l = Lower({"mixtral-tiny", "dp=2,ep=2", "fifo"});
  RunOptions options;
  const ReferenceRun& ref = Reference(l, options);
  Program broken = l.program;
  int changed = 0;
  for (Op& op : broken.graphs[0].ops)
    if (op.kind == OpKind::kCompute && op.compute_type == ComputeType::kTranspose) {
      op.attrs["axis1"] = 0;
      ++changed;
    }
  EXPECT_EQ(changed, 8);  // 2 layers x (2 forward + 2 backward)
  ScheduledProgram sp = Schedule(broken, "fifo");
  Result<ExecutionResult> run = RunInProcess(sp, options);
  ASSERT_TRUE(run.ok()) << run.status().message();
  Result<ReferenceReport> report = CompareToReference(ref.sp, ref.run, sp, *run, Tolerance{}, {});
  ASSERT_FALSE(report.ok());
  EXPECT_HAS(report.status().message(), "diverges from the reference: first diverging tensor: loss");
}

// ---- the Evoformer under dap and dp -------------------------------------------
//
// evoformer-tiny (1 block, s = 8, r = 16, c_m = 16, c_z = 8, 2x4 heads) with
// its distogram and masked-MSA losses against the unsharded run (dp = 1,
// dap = 1, fifo). The Evoformer has no batch dim, so each dp rank holds one
// sample; the initializer fills the data inputs (evo.msa, evo.pair, the
// labels) by global identity and they are not sharded over dp, so every dp
// rank holds the SAME sample. The mean over dp of identical samples'
// gradients is the one sample's gradient: the dp runs must equal the
// unsharded run exactly as the dap runs must. This checks the 1/dp in the
// loss-gradient denominators and the grad_sync all-reduce over {dp, dap}; it
// cannot tell apart a run that drops both the 1/dp and the dp all-reduce
// (evoformer_lowering_test checks one grad_sync over {dp, dap} per
// parameter). docs/evoformer.md, "Reference check".

/// One Evoformer plan and scheduler.
struct EvoCase {
  int dp = 1, dap = 1;
  std::string scheduler;
};

void PrintTo(const EvoCase& c, std::ostream* os) {
  *os << "dp=" << c.dp << ",dap=" << c.dap << " " << c.scheduler;
}

std::string EvoCaseName(const ::testing::TestParamInfo<EvoCase>& info) {
  std::string s = "dp" + std::to_string(info.param.dp) + "_dap" + std::to_string(info.param.dap) +
                  "_" + info.param.scheduler;
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

/// evoformer-tiny lowered under dp x dap (must succeed).
Program LowerEvo(int dp, int dap) {
  Result<EvoformerConfig> c = EvoformerPreset("evoformer-tiny");
  EXPECT_TRUE(c.ok());
  Result<Program> p = c.ok() ? LowerEvoformer(*c, dp, dap) : Result<Program>(c.status());
  EXPECT_TRUE(p.ok()) << p.status().message();
  return p.ok() ? *p : Program{};
}

/// The unsharded evoformer-tiny run (fifo), run once.
const ReferenceRun& EvoReference() {
  static const ReferenceRun* ref = [] {
    auto* rr = new ReferenceRun;
    rr->sp = Schedule(LowerEvo(1, 1), "fifo");
    Result<ExecutionResult> run = RunInProcess(rr->sp, RunOptions{});
    EXPECT_TRUE(run.ok()) << run.status().message();
    if (run.ok()) rr->run = std::move(run).value();
    return rr;
  }();
  return *ref;
}

/// The default tolerances plus an absolute gradient floor of 1e-13: the
/// gradient of b0.msa_row.ln_z.beta is zero in exact arithmetic (beta adds a
/// per-head constant to every score of a softmax row; measured max |ref|
/// 2.4e-15, dap=2 differs by 8.1e-15), while the largest gradient is 4.2e-3
/// (head.masked_msa.w) and the smallest nonzero one 1.8e-8
/// (b0.tri_att_end.k.w, whose relative bound 1.8e-12 the floor barely moves).
Tolerance EvoTolerance() {
  Tolerance t;
  t.grad_abs = 1e-13;
  return t;
}

class EvoformerReferenceTest : public ::testing::TestWithParam<EvoCase> {};

TEST_P(EvoformerReferenceTest, MatchesUnshardedRun) {
  const EvoCase& c = GetParam();
  const ReferenceRun& ref = EvoReference();
  const ScheduledProgram sp = Schedule(LowerEvo(c.dp, c.dap), c.scheduler);
  Result<ExecutionResult> run = RunInProcess(sp, RunOptions{});
  ASSERT_TRUE(run.ok()) << run.status().message();
  Result<ReferenceReport> report = CompareToReference(ref.sp, ref.run, sp, *run, EvoTolerance(), {});
  ASSERT_TRUE(report.ok()) << report.status().message();
  // The summary's worst relative gradient error is the zero gradient's
  // noise; also print the worst over gradients well above the floor.
  double worst = 0;
  std::string worst_name;
  for (const TensorCheck& t : report->checks)
    if (t.what.rfind("gradient", 0) == 0 && t.scale > 1e3 * EvoTolerance().grad_abs &&
        t.max_error / t.scale >= worst)
      worst = t.max_error / t.scale, worst_name = t.what;
  std::printf("  evoformer-tiny dp=%d,dap=%d %s: %s; nonzero gradients: worst relative error %.3g (%s)\n",
              c.dp, c.dap, c.scheduler.c_str(), report->Summary().c_str(), worst, worst_name.c_str());
}

/// dap = 2 (every DAP all-gather, reduce-scatter and all-to-all, the
/// distogram's mirror all-to-all), dp = 2, and both on 4 ranks, each with
/// fifo and rewritten schedules: ddp buckets the gradient all-reduces,
/// xla-lhs and concerto reorder.
std::vector<EvoCase> EvoCases() {
  return {{1, 2, "fifo"}, {1, 2, "ddp"},     {1, 2, "concerto"}, {2, 1, "fifo"},
          {2, 1, "ddp"},  {2, 2, "fifo"},    {2, 2, "ddp"},      {2, 2, "xla-lhs"}};
}

INSTANTIATE_TEST_SUITE_P(Evoformer, EvoformerReferenceTest, ::testing::ValuesIn(EvoCases()),
                         EvoCaseName);

TEST(Reference, EvoformerLossIsTheMeanOfBothHeads) {
  // StepLoss averages every cross_entropy output: (distogram + masked MSA) / 2
  // on the unsharded run. Tiny weights (0.05 u) make the logits nearly flat,
  // so each head's loss is close to log(classes): log 64 = 4.159, log 23 =
  // 3.135, mean 3.647.
  const ReferenceRun& ref = EvoReference();
  const std::vector<float>* dist = ref.run.Rank(0).Find("loss.distogram");
  const std::vector<float>* msa = ref.run.Rank(0).Find("loss.masked_msa");
  ASSERT_TRUE(dist && msa);
  EXPECT_NEAR((*dist)[0], std::log(64.0), 0.05);
  EXPECT_NEAR((*msa)[0], std::log(23.0), 0.05);
  Result<double> loss = StepLoss(ref.sp, ref.run);
  ASSERT_TRUE(loss.ok());
  EXPECT_NEAR(*loss, ((*dist)[0] + (*msa)[0]) / 2, 1e-6);
}

TEST(Reference, EvoformerDapWithoutTheGlobalDenominatorIsCaught) {
  // dap = 2 whose distogram gradient is divided by the rank's own label
  // count (8 x 16 = 128) instead of the global one (16 x 16 = 256): every
  // gradient reaching the stack through the distogram doubles.
  const ReferenceRun& ref = EvoReference();
  Program broken = LowerEvo(1, 2);
  int changed = 0;
  for (Op& op : broken.graphs[0].ops)
    if (op.name == "loss.distogram.cross_entropy.grad") {
      EXPECT_EQ(op.attrs.at("denominator"), 256);
      op.attrs["denominator"] = 128;
      ++changed;
    }
  ASSERT_EQ(changed, 1);
  const ScheduledProgram sp = Schedule(broken, "fifo");
  Result<ExecutionResult> run = RunInProcess(sp, RunOptions{});
  ASSERT_TRUE(run.ok()) << run.status().message();
  Result<ReferenceReport> report = CompareToReference(ref.sp, ref.run, sp, *run, EvoTolerance(), {});
  ASSERT_FALSE(report.ok());
  EXPECT_HAS(report.status().message(), "first diverging tensor: gradient of '");
}

TEST(Init, EvoformerConstantsFollowTheirNames) {
  // Mesh {dap: 2}; table t [3, 4] on each rank, sharded on its rows (global
  // [6, 4]: rank 1 holds rows 3..5, so its gather's row0 is 3).
  // const.perm.1x3x4.p102.i3x1: keeps the last dim, rows_shape [1, 3],
  // perm' [1, 0]: arange(3).reshape(1, 3).T = [[0], [1], [2]] -> 0, 1, 2.
  // const.perm.2x3x1.p102.i3x2 (h = 1 table u [6, 1], replicated): rows
  // [2, 3] (the last dim stays, perm' [1, 0]): arange(6).reshape(2, 3).T =
  // [[0, 3], [1, 4], [2, 5]] -> 0, 3, 1, 4, 2, 5, row0 0.
  // const.perm.2x3.p10.i3x2 (the last dim moves: rows_shape [2, 3], perm'
  // [1, 0]): the same six ids.
  Graph g;
  g.name = "main";
  g.streams = {"compute"};
  g.tensors = {F32("t", {3, 4}, {{"dap"}, {}}), F32("u", {6, 1}), F32("const.ones.5", {1, 5})};
  auto ids = [&](const std::string& name, std::vector<int64_t> shape) {
    Tensor t = F32(name, std::move(shape));
    t.dtype = DType::kI32;
    g.tensors.push_back(t);
  };
  ids("const.perm.1x3x4.p102.i3x1", {3, 1});
  ids("const.perm.2x3x1.p102.i3x2", {3, 2});
  ids("const.perm.2x3.p10.i3x2", {3, 2});
  ids("const.perm.2x3x1.p102.i2x2", {2, 2});  // 4 ids for 6 rows
  ids("const.perm.2x3x1.p112.i3x2", {3, 2});  // not a permutation
  int id = 0;
  auto gather = [&](const std::string& table, const std::string& idx, std::vector<int64_t> out) {
    g.tensors.push_back(F32("y" + std::to_string(id), std::move(out)));
    Op op;
    op.id = id;
    op.name = "gather" + std::to_string(id);
    op.kind = OpKind::kCompute;
    op.compute_type = ComputeType::kEmbedding;
    op.stream = "compute";
    op.inputs = {table, idx};
    op.outputs = {"y" + std::to_string(id++)};
    g.ops.push_back(op);
  };
  gather("t", "const.perm.1x3x4.p102.i3x1", {3, 1, 4});
  gather("u", "const.perm.2x3x1.p102.i3x2", {3, 2, 1});
  gather("u", "const.perm.2x3.p10.i3x2", {3, 2, 1});
  gather("u", "const.perm.2x3x1.p102.i2x2", {2, 2, 1});
  gather("u", "const.perm.2x3x1.p112.i3x2", {3, 2, 1});
  Mesh mesh;
  mesh.axes = {{"dap", 2}};
  const GraphIndex index = GraphIndex::Build(g);
  auto fill = [&](const std::string& name, int rank) -> Result<std::vector<float>> {
    const int ti = index.tensor.at(name);
    std::vector<float> out(g.tensors[ti].NumElements());
    Status st = FillGraphInput(g, index, ti, mesh, rank, InitOptions{}, out.data());
    if (!st.ok()) return st;
    return out;
  };
  EXPECT_EQ(fill("const.ones.5", 0).value(), std::vector<float>(5, 1.0f));
  EXPECT_EQ(fill("const.perm.1x3x4.p102.i3x1", 0).value(), (std::vector<float>{0, 1, 2}));
  EXPECT_EQ(fill("const.perm.1x3x4.p102.i3x1", 1).value(), (std::vector<float>{3, 4, 5}));
  const std::vector<float> swapped = {0, 3, 1, 4, 2, 5};
  EXPECT_EQ(fill("const.perm.2x3x1.p102.i3x2", 1).value(), swapped);
  EXPECT_EQ(fill("const.perm.2x3.p10.i3x2", 1).value(), swapped);
  Result<std::vector<float>> shape = fill("const.perm.2x3x1.p102.i2x2", 0);
  ASSERT_FALSE(shape.ok());
  EXPECT_HAS(shape.status().message(), "tensor 'const.perm.2x3x1.p102.i2x2': constant permutation "
                                       "input: <ids> must be the tensor's local shape");
  Result<std::vector<float>> perm = fill("const.perm.2x3x1.p112.i3x2", 0);
  ASSERT_FALSE(perm.ok());
  EXPECT_HAS(perm.status().message(), "p112 is not a permutation");
}

// ---- refusal, faults, measured timelines ----------------------------------------

TEST(Executor, RefusesAScheduleThatFailsVerification) {
  const Lowered l = Lower({"gpt-tiny", "dp=2", "fifo"});
  ScheduledProgram sp = Schedule(l.program, "fifo");
  for (StreamOrder& order : sp.schedule.roles[0].streams)
    if (order.stream == "compute") order.op_ids.pop_back();
  Result<ExecutionResult> run = RunInProcess(sp);
  ASSERT_FALSE(run.ok());
  EXPECT_HAS(run.status().message(), "schedule 'fifo' is refused: it fails verification");
}

// Host memory is checked before anything is allocated: gpt-tiny dp=2 needs at least its two ranks'
// inputs and largest op (RuntimeMemoryLowerBoundBytes), so a host with less is refused naming the
// figures, and one with more runs.
TEST(Executor, RefusesARunWhoseMemoryCannotFitTheHost) {
  const Lowered l = Lower({"gpt-tiny", "dp=2", "fifo"});
  ScheduledProgram sp = Schedule(l.program, "fifo");
  const double rank0 = RuntimeMemoryLowerBoundBytes(sp.program, 0);
  EXPECT_GT(rank0, 0);
  EXPECT_EQ(RuntimeMemoryLowerBoundBytes(sp.program, 1), rank0);  // dp ranks are alike
  RunOptions small;
  small.host_memory_bytes = static_cast<int64_t>(rank0);  // one rank fits, two do not
  Result<ExecutionResult> run = RunInProcess(sp, small);
  ASSERT_FALSE(run.ok());
  EXPECT_HAS(run.status().message(), "2 rank(s) on this host need at least");
  EXPECT_HAS(run.status().message(), "run fewer ranks per host");
  RunOptions enough;
  enough.host_memory_bytes = static_cast<int64_t>(4 * rank0);
  EXPECT_TRUE(RunInProcess(sp, enough).ok());
  // A valid program far larger than any host: a 2^17 x 2^17 matmul (64 GiB per operand).
  Program big;
  big.name = "big";
  Graph g;
  g.name = "main";
  for (const char* name : {"a", "b", "c"}) {
    Tensor t;
    t.name = name;
    t.shape = {1 << 17, 1 << 17};
    g.tensors.push_back(t);
  }
  Op mm;
  mm.id = 0;
  mm.name = "mm";
  mm.kind = OpKind::kCompute;
  mm.compute_type = ComputeType::kMatmul;
  mm.inputs = {"a", "b"};
  mm.outputs = {"c"};
  g.ops.push_back(mm);
  big.graphs.push_back(g);
  big.roles.push_back({"main", "main", {0}});
  EXPECT_GT(RuntimeMemoryLowerBoundBytes(big, 0), 3 * 64.0 * (1 << 30) - 1);
  Status host = CheckHostMemory(big, {0}, int64_t{24} << 30);
  ASSERT_FALSE(host.ok());
  EXPECT_HAS(host.message(), "need at least 192.00 GiB");
}

TEST(Executor, RefusesAnInvalidProgram) {
  Program p = FusedCollectiveProgram();
  p.graphs[0].tensors[2].shape = {3, 3};  // ar0 no longer matches p0
  ScheduledProgram sp{p, ProgramOrderSchedule(p, "fifo")};
  Result<ExecutionResult> run = RunInProcess(sp);
  ASSERT_FALSE(run.ok());
  EXPECT_HAS(run.status().message(), "op 0 'ar'");
}

TEST(Executor, AFailingRankStopsTheJobNamingRankAndOp) {
  const Lowered l = Lower({"gpt-tiny", "dp=2,tp=2", "fifo"});
  RunOptions options;
  options.fail_op = "L0.mlp.fc1";
  options.fail_rank = 3;
  const auto start = std::chrono::steady_clock::now();
  Result<ExecutionResult> run = RunInProcess(Schedule(l.program, "fifo"), options);
  ASSERT_FALSE(run.ok());
  EXPECT_HAS(run.status().message(), "rank 3: op ");
  EXPECT_HAS(run.status().message(), "'L0.mlp.fc1': injected failure");
  // The other ranks were aborted, not left to time out (a hang guard 10x above the run's time).
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(Executor, ARankThatNeverStartsTimesOut) {
  const Lowered l = Lower({"llama-tiny", "tp=2", "fifo"});
  const ScheduledProgram sp = Schedule(l.program, "fifo");
  ASSERT_TRUE(CheckRunnable(sp).ok());
  FakeWorldOptions wo;
  wo.timeout_s = 0.3;
  FakeWorld world(2, wo);
  Result<RankRun> run = RunRank(sp, world.endpoint(0), RunOptions{});
  ASSERT_FALSE(run.ok());
  EXPECT_HAS(run.status().message(), "start barrier: rank 0: all_reduce");
  EXPECT_HAS(run.status().message(), "timed out after 0.3 s waiting for rank(s) [1]");
}

TEST(Executor, MeasuredTimelineFollowsTheMachineModelAndTraces) {
  const Lowered l = Lower({"llama-tiny", "pp=2,microbatches=2", "fifo"});
  const ScheduledProgram sp = Schedule(l.program, "xla-lhs");
  Result<ExecutionResult> run = RunInProcess(sp);
  ASSERT_TRUE(run.ok()) << run.status().message();
  const Timeline& tl = run->timeline;
  EXPECT_EQ(tl.ranks, (std::vector<int>{0, 1}));
  size_t ops = 0;
  for (int r : tl.ranks) ops += sp.program.GraphOf(sp.program.roles[sp.program.RoleOfRank(r)]).ops.size();
  ASSERT_EQ(tl.records.size(), ops);
  std::map<std::pair<int, int>, const OpRecord*> by_op;
  auto rec = [&](int rank, int op_index) { return by_op.at(std::make_pair(rank, op_index)); };
  for (const OpRecord& r : tl.records) {
    EXPECT_LE(r.start_us, r.end_us);
    EXPECT_LE(r.end_us, tl.makespan_us);
    by_op[std::make_pair(r.rank, r.op_index)] = &r;
  }
  for (int r : tl.ranks) {
    const Role& role = sp.program.roles[sp.program.RoleOfRank(r)];
    const Graph& g = sp.program.GraphOf(role);
    const GraphIndex index = GraphIndex::Build(g);
    for (size_t i = 0; i < g.ops.size(); ++i)  // an op starts after its predecessors end
      for (int pred : index.preds[i])
        EXPECT_GE(rec(r, static_cast<int>(i))->start_us, rec(r, pred)->end_us) << g.ops[i].name;
    for (const StreamOrder& order : sp.schedule.ForRole(role.name)->streams)
      for (size_t k = 1; k < order.op_ids.size(); ++k)  // one at a time, in schedule order
        EXPECT_GE(rec(r, index.op.at(order.op_ids[k]))->start_us,
                  rec(r, index.op.at(order.op_ids[k - 1]))->end_us);
  }
  const nlohmann::json trace = nlohmann::json::parse(ChromeTrace(sp, tl));
  size_t spans = 0;
  for (const auto& e : trace["traceEvents"]) spans += e["ph"] == "X";
  EXPECT_EQ(spans, ops);
  const Summary summary = Summarize(sp, tl, Cost());
  EXPECT_GT(summary.makespan_us, 0);
  EXPECT_GT(summary.comm_busy_us, 0);
}

}  // namespace
}  // namespace concerto
