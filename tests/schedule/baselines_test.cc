// The baseline schedulers on small hand-built graphs: stream placement,
// bucket boundaries (arithmetic in the comments), ZeRO's prefetch window,
// the XLA-style order, determinism, and simulated makespans on a fake cost
// model. Every schedule must pass VerifySchedule.
#include "concerto/schedule/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "../../src/schedule/baseline_internal.h"
#include "concerto/cost/cluster.h"
#include "concerto/ir/verifier.h"
#include "concerto/lower/frontend.h"
#include "concerto/lower/gpt.h"
#include "concerto/lower/synthetic.h"
#include "concerto/lower/plan.h"
#include "concerto/lower/transformer.h"
#include "concerto/schedule/schedule.h"
#include "concerto/sim/simulator.h"

namespace concerto {
namespace {

constexpr int64_t kMiB = 1 << 20;

/// Fixed durations per op kind: matmul (and any other compute) 10 us, Adam
/// 2 us, every comm op 40 us + 10 us per MiB (so fusing saves launch cost).
class FakeCost : public CostModel {
 public:
  PricedOp Price(const Op& op, const PriceContext&) const override {
    if (op.IsComm()) return {40.0 + 10.0 * static_cast<double>(op.message_bytes) / kMiB};
    if (op.compute_type == ComputeType::kAdam) return {2.0};
    return {10.0};
  }
  const ClusterSpec& cluster() const override { return cluster_; }

 private:
  ClusterSpec cluster_;  // interference 0
};

/// Builds a one-graph, one-role program op by op.
class Builder {
 public:
  explicit Builder(std::vector<MeshAxis> axes) {
    p_.name = "test";
    p_.mesh.axes = std::move(axes);
    p_.graphs.push_back(Graph{});
    p_.graphs[0].name = "main";
    Role role{"spmd", "main", {}};
    for (int r = 0; r < p_.mesh.NumRanks(); ++r) role.ranks.push_back(r);
    p_.roles.push_back(role);
  }
  Graph& g() { return p_.graphs[0]; }
  void T(const std::string& name, std::vector<int64_t> shape, DType dtype = DType::kF32) {
    Tensor t;
    t.name = name;
    t.shape = std::move(shape);
    t.dtype = dtype;
    g().tensors.push_back(t);
  }
  Op& Add(Op op, Phase phase, int layer) {
    op.id = static_cast<int>(g().ops.size());
    op.tags.phase = phase;
    op.tags.layer = layer;
    g().ops.push_back(std::move(op));
    return g().ops.back();
  }
  Op& Compute(const std::string& name, ComputeType type, std::vector<std::string> in,
              std::vector<std::string> out, Phase phase, int layer) {
    Op op;
    op.name = name;
    op.stream = "compute";
    op.compute_type = type;
    op.inputs = std::move(in);
    op.outputs = std::move(out);
    return Add(op, phase, layer);
  }
  Op& Matmul(const std::string& name, const std::string& a, const std::string& b,
             const std::string& c, bool ta, bool tb, Phase phase, int layer) {
    Op& op = Compute(name, ComputeType::kMatmul, {a, b}, {c}, phase, layer);
    op.attrs["transpose_a"] = ta;
    op.attrs["transpose_b"] = tb;
    return op;
  }
  Op& Coll(const std::string& name, CollectiveType type, const std::string& in,
           const std::string& out, const std::string& axis, const std::string& purpose,
           Phase phase, int layer) {
    Op op;
    op.name = name;
    op.kind = OpKind::kCollective;
    op.stream = "comm";
    op.collective = type;
    op.group.axes = {axis};
    op.inputs = {in};
    op.outputs = {out};
    for (const auto& t : g().tensors)
      if (t.name == in) op.message_bytes = t.Bytes();
    op.tags.purpose = purpose;
    return Add(op, phase, layer);
  }
  Program Take() { return std::move(p_); }

 private:
  Program p_;
};

std::string L(const std::string& base, int l) { return base + std::to_string(l); }

/// An MLP of len(dims)-1 matmul layers, data parallel over "dp" (and, with
/// `tp`, each matmul followed by an "activation" all-reduce over "tp").
/// Program order: forward; backward from the last layer (dw, its grad_sync
/// all-reduce, dx); Adam per layer.
Program Mlp(const std::vector<int64_t>& d, int64_t batch, DType dtype, std::vector<MeshAxis> mesh,
            bool tp) {
  Builder b(std::move(mesh));
  const int n = static_cast<int>(d.size()) - 1;
  b.T("h0", {batch, d[0]}, dtype);
  b.T(L("dh", n), {batch, d[n]}, dtype);
  for (int l = 0; l < n; ++l) {
    for (const char* w : {"w", "dw", "dws", "m", "v", "w_new", "m_new", "v_new"})
      b.T(L(w, l), {d[l], d[l + 1]}, dtype);
    b.T(L("h", l + 1), {batch, d[l + 1]}, dtype);
    b.T(L("hp", l + 1), {batch, d[l + 1]}, dtype);
    if (l > 0) {
      b.T(L("dh", l), {batch, d[l]}, dtype);
      b.T(L("dhp", l), {batch, d[l]}, dtype);
    }
  }
  for (int l = 0; l < n; ++l) {
    std::string out = tp ? L("hp", l + 1) : L("h", l + 1);
    b.Matmul(L("fwd.", l), L("h", l), L("w", l), out, false, false, Phase::kForward, l);
    if (tp)
      b.Coll(L("act_ar.fwd.", l), CollectiveType::kAllReduce, out, L("h", l + 1), "tp",
             "activation", Phase::kForward, l);
  }
  for (int l = n - 1; l >= 0; --l) {
    b.Matmul(L("bwd.dw.", l), L("h", l), L("dh", l + 1), L("dw", l), true, false,
             Phase::kBackward, l);
    b.Coll(L("grad_ar.", l), CollectiveType::kAllReduce, L("dw", l), L("dws", l), "dp",
           "grad_sync", Phase::kBackward, l);
    if (l == 0) continue;
    std::string out = tp ? L("dhp", l) : L("dh", l);
    b.Matmul(L("bwd.dx.", l), L("dh", l + 1), L("w", l), out, false, true, Phase::kBackward, l);
    if (tp)
      b.Coll(L("act_ar.bwd.", l), CollectiveType::kAllReduce, out, L("dh", l), "tp",
             "activation", Phase::kBackward, l);
  }
  for (int l = 0; l < n; ++l)
    b.Compute(L("adam.", l), ComputeType::kAdam, {L("w", l), L("dws", l), L("m", l), L("v", l)},
              {L("w_new", l), L("m_new", l), L("v_new", l)}, Phase::kOptimizer, l);
  return b.Take();
}

/// A ZeRO-3 MLP of `n` square layers (width `d`, f32) over dp = 2: each layer
/// all-gathers its weight shard before the forward matmul and again before
/// the backward dx matmul (purpose "param_gather"), reduce-scatters its
/// weight gradient (purpose "grad_sync"), and runs Adam on its shard.
Program Zero3Mlp(int n, int64_t d, int64_t batch) {
  Builder b({{"dp", 2}});
  b.T("h0", {batch, d});
  b.T(L("dh", n), {batch, d});
  for (int l = 0; l < n; ++l) {
    for (const char* s : {"ws", "dws", "m", "v", "ws_new", "m_new", "v_new"}) b.T(L(s, l), {d / 2, d});
    for (const char* f : {"wf", "wb", "dw"}) b.T(L(f, l), {d, d});
    b.T(L("h", l + 1), {batch, d});
    if (l > 0) b.T(L("dh", l), {batch, d});
  }
  for (int l = 0; l < n; ++l) {
    b.Coll(L("ag.fwd.", l), CollectiveType::kAllGather, L("ws", l), L("wf", l), "dp",
           "param_gather", Phase::kForward, l);
    b.Matmul(L("fwd.", l), L("h", l), L("wf", l), L("h", l + 1), false, false, Phase::kForward, l);
  }
  for (int l = n - 1; l >= 0; --l) {
    if (l > 0)
      b.Coll(L("ag.bwd.", l), CollectiveType::kAllGather, L("ws", l), L("wb", l), "dp",
             "param_gather", Phase::kBackward, l);
    b.Matmul(L("bwd.dw.", l), L("h", l), L("dh", l + 1), L("dw", l), true, false,
             Phase::kBackward, l);
    if (l > 0)
      b.Matmul(L("bwd.dx.", l), L("dh", l + 1), L("wb", l), L("dh", l), false, true,
               Phase::kBackward, l);
    b.Coll(L("grad_rs.", l), CollectiveType::kReduceScatter, L("dw", l), L("dws", l), "dp",
           "grad_sync", Phase::kBackward, l);
  }
  for (int l = 0; l < n; ++l)
    b.Compute(L("adam.", l), ComputeType::kAdam, {L("ws", l), L("dws", l), L("m", l), L("v", l)},
              {L("ws_new", l), L("m_new", l), L("v_new", l)}, Phase::kOptimizer, l);
  return b.Take();
}

/// The op of graph 0 called `name` (asserts it exists).
const Op& OpNamed(const Program& p, const std::string& name) {
  for (const Op& op : p.graphs[0].ops)
    if (op.name == name) return op;
  ADD_FAILURE() << "no op named " << name;
  static Op none;
  return none;
}
int IdOf(const Program& p, const std::string& name) { return OpNamed(p, name).id; }
const Op& OpWithId(const Program& p, int id) {
  for (const Op& op : p.graphs[0].ops)
    if (op.id == id) return op;
  ADD_FAILURE() << "no op with id " << id;
  static Op none;
  return none;
}

/// Ids listed on `stream` for the only role.
std::vector<int> StreamIds(const ScheduledProgram& sp, const std::string& stream) {
  for (const auto& so : sp.schedule.roles.at(0).streams)
    if (so.stream == stream) return so.op_ids;
  return {};
}
/// Names listed on `stream`.
std::vector<std::string> StreamNames(const ScheduledProgram& sp, const std::string& stream) {
  std::vector<std::string> names;
  for (int id : StreamIds(sp, stream)) names.push_back(OpWithId(sp.program, id).name);
  return names;
}

/// Runs baseline `name` and checks the result: ok, verifier-clean, a valid
/// program, tagged with the scheduler's name.
ScheduledProgram RunChecked(const std::string& name, const Program& p, const BaselineOptions& o = {}) {
  FakeCost cost;
  Result<ScheduledProgram> sp = RunBaseline(name, p, cost, o);
  EXPECT_TRUE(sp.ok()) << name << ": " << sp.status().message();
  if (!sp.ok()) return {};
  EXPECT_EQ(sp->schedule.scheduler, name);
  std::vector<std::string> problems = VerifySchedule(sp->program, sp->schedule);
  EXPECT_TRUE(problems.empty()) << name << ": " << problems.front();
  std::vector<std::string> ir = VerifyProgram(sp->program);
  EXPECT_TRUE(ir.empty()) << name << ": " << ir.front();
  return std::move(*sp);
}

/// The 4-layer DP MLP whose weight gradients are, in backward order,
/// 629,268 B (123 x 1279 f32), 629,760 B (1280 x 123), 10 MiB (2048 x 1280)
/// and 20 MiB (2560 x 2048).
Program DdpMlp() { return Mlp({2560, 2048, 1280, 123, 1279}, 8, DType::kF32, {{"dp", 2}}, false); }

TEST(BaselinesTest, NamesAndUnknownName) {
  EXPECT_EQ(BaselineNames(),
            (std::vector<std::string>{"sequential", "fifo", "ddp", "megatron", "megatron-tp-overlap", "zb-h1",
                                      "zero", "deepspeed-overlap", "xla-lhs"}));
  FakeCost cost;
  Result<ScheduledProgram> sp = RunBaseline("nope", DdpMlp(), cost);
  ASSERT_FALSE(sp.ok());
  EXPECT_NE(sp.status().message().find("known: sequential, fifo"), std::string::npos);
}

/// True when op `before` is among the control deps of op `after`.
bool ControlDep(const ScheduledProgram& sp, const std::string& after, const std::string& before) {
  const Graph& g = sp.program.graphs[0];
  int before_id = IdOf(sp.program, before);
  for (const Op& op : g.ops)
    if (op.name == after)
      return std::find(op.control_deps.begin(), op.control_deps.end(), before_id) != op.control_deps.end();
  return false;
}

/// Every compute op 10 us, every send and recv free: the pipeline arithmetic alone.
class UnitCost : public CostModel {
 public:
  PricedOp Price(const Op& op, const PriceContext&) const override { return {op.IsComm() ? 0.0 : 10.0}; }
  const ClusterSpec& cluster() const override { return cluster_; }

 private:
  ClusterSpec cluster_;  // interference 0
};

/// A p-stage pipeline of m micro-batches in 1F1B program order, as the
/// frontends lower it: per micro-batch j a stage runs F (forward), B (the
/// input gradient, sent to the previous stage) and W (the weight gradient,
/// read by nothing the previous stage waits for), each one compute op.
Program OneFOneBPipeline(int p, int m) {
  Program prog;
  prog.name = "zb";
  prog.mesh.axes = {MeshAxis{"pp", p}};
  for (int r = 0; r < p; ++r) {
    Graph g;
    g.name = "stage" + std::to_string(r);
    g.streams = {"compute", "p2p.pp-1", "p2p.pp+1"};  // the frontends' streams
    int id = 0;
    auto tensor = [&](const std::string& name) {
      Tensor t;
      t.name = name;
      t.shape = {4};
      t.dtype = DType::kF32;
      t.sharding = {{}};
      g.tensors.push_back(std::move(t));
    };
    auto add = [&](OpKind kind, const std::string& name, Phase phase, int mb, std::vector<std::string> in,
                   std::vector<std::string> out, int peer_offset = 0, int tag = 0) {
      Op op;
      op.id = id++;
      op.name = name;
      op.kind = kind;
      op.stream = "compute";
      op.compute_type = in.size() == 2 ? ComputeType::kAdd : ComputeType::kScale;
      op.inputs = std::move(in);
      op.outputs = std::move(out);
      op.tags.phase = phase;
      op.tags.microbatch = mb;
      if (kind != OpKind::kCompute) {
        op.stream = peer_offset < 0 ? "p2p.pp-1" : "p2p.pp+1";
        op.peer.axis = "pp";
        op.peer.offset = peer_offset;
        op.tag = tag;
        op.message_bytes = 16;
        op.tags.purpose = "pipeline";
      }
      g.ops.push_back(std::move(op));
    };
    // Tensors first, then the ops in the frontends' 1F1B order (docs/workloads.md): in the steady
    // state F(k) send(k) recv-grad(j) B(j) W(j) recv(k + 1) send-grad(j), which pairs every
    // rendezvous across stages without a deadlock.
    for (int j = 0; j < m; ++j)
      for (const char* t : {"x", "h", "g", "d", "w"}) tensor(t + std::to_string(j));
    auto recv_forward = [&](int j) {
      if (r > 0) add(OpKind::kRecv, "rf" + std::to_string(j), Phase::kForward, j, {}, {"x" + std::to_string(j)}, -1, j);
    };
    auto forward = [&](int j) {
      const std::string js = std::to_string(j);
      add(OpKind::kCompute, "F" + js, Phase::kForward, j, {"x" + js}, {"h" + js});
      if (r < p - 1) add(OpKind::kSend, "sf" + js, Phase::kForward, j, {"h" + js}, {}, 1, j);
    };
    auto backward = [&](int j, int next_forward) {
      const std::string js = std::to_string(j);
      const std::string gin = r < p - 1 ? "g" + js : "h" + js;
      if (r < p - 1) add(OpKind::kRecv, "rb" + js, Phase::kBackward, j, {}, {gin}, 1, m + j);
      add(OpKind::kCompute, "B" + js, Phase::kBackward, j, {gin}, {"d" + js});
      add(OpKind::kCompute, "W" + js, Phase::kBackward, j, {"x" + js, gin}, {"w" + js});
      if (next_forward >= 0) recv_forward(next_forward);
      if (r > 0) add(OpKind::kSend, "sb" + js, Phase::kBackward, j, {"d" + js}, {}, -1, m + j);
    };
    const int warmup = std::min(m, p - 1 - r);
    for (int j = 0; j < warmup; ++j) {
      recv_forward(j);
      forward(j);
    }
    if (warmup < m) recv_forward(warmup);
    for (int j = 0; j < m - warmup; ++j) {
      forward(j + warmup);
      backward(j, j + warmup + 1 < m ? j + warmup + 1 : -1);
    }
    for (int j = m - warmup; j < m; ++j) backward(j, -1);
    prog.graphs.push_back(std::move(g));
    prog.roles.push_back({"stage" + std::to_string(r), "stage" + std::to_string(r), {r}});
  }
  return prog;
}

// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, section 2.1): with
// T_F = T_B = T_W = T, 1F1B idles (p - 1)(T_F + T_B + T_W) per stage and ZB-H1 a third of it,
// (p - 1)(T_F + T_B - T_W), at no more memory. p = 4, m = 8, T = 10 us:
//   1F1B:  m (T_F + T_B + T_W) + (p - 1)(T_F + T_B + T_W) = 240 + 90 = 330 us
//   ZB-H1: m (T_F + T_B + T_W) + (p - 1)(T_F + T_B - T_W) = 240 + 30 = 270 us
// Stage 3 (the last) of ZB-H1, one letter per 10 us, W deferred by 3 micro-batches:
//   ...F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 ... B7 W4 W5 W6 W7
TEST(BaselinesTest, ZeroBubbleH1CutsThe1F1BBubbleToAThird) {
  const UnitCost cost;
  SimOptions nominal;
  nominal.interference = 0;
  const Program program = OneFOneBPipeline(4, 8);
  ASSERT_TRUE(VerifyProgram(program).empty()) << VerifyProgram(program)[0];
  const ScheduledProgram one_f_one_b = RunBaseline("megatron", program, cost).value();
  const ScheduledProgram zb = RunBaseline("zb-h1", program, cost).value();
  EXPECT_TRUE(VerifySchedule(zb.program, zb.schedule).empty());
  Result<Timeline> base_run = Simulate(one_f_one_b, cost, nominal);
  ASSERT_TRUE(base_run.ok()) << base_run.status().message();
  EXPECT_DOUBLE_EQ(base_run->makespan_us, 330.0);
  const Timeline zb_run = Simulate(zb, cost, nominal).value();
  EXPECT_DOUBLE_EQ(zb_run.makespan_us, 270.0);
  // Stage 0 keeps 1F1B's order (no deferral: the gradients reach it last).
  auto compute_order = [](const ScheduledProgram& sp, int stage) {
    std::vector<std::string> names;
    for (const StreamOrder& so : sp.schedule.roles[static_cast<size_t>(stage)].streams)
      if (so.stream == "compute")
        for (int id : so.op_ids)
          for (const Op& op : sp.program.graphs[static_cast<size_t>(stage)].ops)
            if (op.id == id && op.kind == OpKind::kCompute) names.push_back(op.name);
    return names;
  };
  EXPECT_EQ(compute_order(zb, 0), compute_order(one_f_one_b, 0));
  // Stage 3 runs W0 after B3.
  const std::vector<std::string> names = compute_order(zb, 3);
  ASSERT_GE(names.size(), 9u);
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + 9),
            (std::vector<std::string>{"F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3", "W0"}));
}

TEST(BaselinesTest, SequentialSerializesEverythingInProgramOrder) {
  // Every op stays on its own stream; each comm op waits for the compute op
  // before it and holds back the one after it (control edges), so the
  // program runs one op at a time in program order.
  Program p = DdpMlp();
  ScheduledProgram sp = RunChecked("sequential", p);
  Schedule fifo = ProgramOrderSchedule(p, "sequential");
  EXPECT_EQ(WriteSchedule(sp.schedule), WriteSchedule(fifo));
  const Graph& g = sp.program.graphs[0];
  for (size_t i = 1; i < g.ops.size(); ++i) {
    if (!g.ops[i].IsComm() && !g.ops[i - 1].IsComm()) continue;  // same stream: ordered already
    EXPECT_TRUE(ControlDep(sp, g.ops[i].name, g.ops[i - 1].name)) << g.ops[i].name;
  }
  EXPECT_TRUE(sp.schedule.fusion_groups.empty());
}

TEST(BaselinesTest, FifoIsProgramOrderOnOwnStreams) {
  Program p = DdpMlp();
  ScheduledProgram sp = RunChecked("fifo", p);
  Schedule expected = ProgramOrderSchedule(p, "fifo");
  EXPECT_EQ(WriteSchedule(sp.schedule), WriteSchedule(expected));
  EXPECT_EQ(StreamNames(sp, "comm"),
            (std::vector<std::string>{"grad_ar.3", "grad_ar.2", "grad_ar.1", "grad_ar.0"}));
}

TEST(BaselinesTest, DdpBucketsByBytesInGradientReadyOrder) {
  // Gradient-ready order is layer 3, 2, 1, 0.
  // Bucket 1 (cap 1 MiB = 1,048,576 B): 629,268 < cap; + 629,760 = 1,259,028 >= cap: close.
  // Bucket 2 (cap 25 MiB = 26,214,400 B): 10,485,760 < cap; + 20,971,520 = 31,457,280 >= cap: close.
  Program p = DdpMlp();
  ScheduledProgram sp = RunChecked("ddp", p);
  ASSERT_EQ(sp.schedule.fusion_groups.size(), 2u);
  const FusionGroup& b1 = sp.schedule.fusion_groups[0];
  const FusionGroup& b2 = sp.schedule.fusion_groups[1];
  EXPECT_EQ(b1.role, "spmd");
  EXPECT_EQ(b1.members, (std::vector<int>{IdOf(p, "grad_ar.3"), IdOf(p, "grad_ar.2")}));
  EXPECT_EQ(b2.members, (std::vector<int>{IdOf(p, "grad_ar.1"), IdOf(p, "grad_ar.0")}));
  EXPECT_EQ(OpWithId(sp.program, b1.fused_op).message_bytes, 1259028);
  EXPECT_EQ(OpWithId(sp.program, b2.fused_op).message_bytes, 31457280);
  EXPECT_EQ(StreamIds(sp, "comm"), (std::vector<int>{b1.fused_op, b2.fused_op}));
  // The fused op replaced its members in the program.
  EXPECT_EQ(sp.program.graphs[0].ops.size(), p.graphs[0].ops.size() - 2);
  for (const std::string& s : StreamNames(sp, "compute")) EXPECT_EQ(s.find("grad_ar"), std::string::npos);
}

TEST(BaselinesTest, DdpClosesTheLastPartialBucketAtTheEnd) {
  // First cap 2 MiB = 2,097,152 B: 629,268 + 629,760 = 1,259,028 < cap;
  // + 10,485,760 = 11,744,788 >= cap: close {3, 2, 1}.
  // Then 20,971,520 < 25 MiB: still open at the end; closed alone, not fused.
  Program p = DdpMlp();
  BaselineOptions o;
  o.ddp_first_bucket_bytes = 2 * kMiB;
  ScheduledProgram sp = RunChecked("ddp", p, o);
  ASSERT_EQ(sp.schedule.fusion_groups.size(), 1u);
  EXPECT_EQ(sp.schedule.fusion_groups[0].members,
            (std::vector<int>{IdOf(p, "grad_ar.3"), IdOf(p, "grad_ar.2"), IdOf(p, "grad_ar.1")}));
  std::vector<int> grads;
  for (int id : StreamIds(sp, "comm"))
    for (const Op& op : sp.program.graphs[0].ops)
      if (op.id == id && op.tags.purpose == "grad_sync") grads.push_back(id);
  EXPECT_EQ(grads, (std::vector<int>{sp.schedule.fusion_groups[0].fused_op, IdOf(p, "grad_ar.0")}));
}

TEST(BaselinesTest, DdpLaunchesABucketRightAfterItsLastGradient) {
  // With 1-byte caps every gradient is its own bucket: launched right after
  // its producer. Program order lists all grad all-reduces after the
  // backward, but the launch sequence (visible through the internal plan)
  // moves each next to its gradient.
  Builder b({{"dp", 2}});
  for (const char* t : {"x", "g1", "g2", "s1", "s2", "y1", "y2"}) b.T(t, {4, 4});
  b.Compute("grad1", ComputeType::kScale, {"x"}, {"g1"}, Phase::kBackward, 1);
  b.Compute("grad2", ComputeType::kScale, {"x"}, {"g2"}, Phase::kBackward, 0);
  b.Coll("ar1", CollectiveType::kAllReduce, "g1", "s1", "dp", "grad_sync", Phase::kBackward, 1);
  b.Coll("ar2", CollectiveType::kAllReduce, "g2", "s2", "dp", "grad_sync", Phase::kBackward, 0);
  b.Compute("use1", ComputeType::kScale, {"s1"}, {"y1"}, Phase::kOptimizer, 1);
  b.Compute("use2", ComputeType::kScale, {"s2"}, {"y2"}, Phase::kOptimizer, 0);
  Program p = b.Take();
  BaselineOptions o;
  o.ddp_first_bucket_bytes = o.ddp_bucket_bytes = 1;
  Result<baseline::GraphPlan> plan = baseline::PlanDdp(p.graphs[0], o);
  ASSERT_TRUE(plan.ok());
  std::vector<std::string> seq;
  for (int i : plan->sequence) seq.push_back(plan->graph.ops[i].name);
  EXPECT_EQ(seq, (std::vector<std::string>{"grad1", "ar1", "grad2", "ar2", "use1", "use2"}));
  RunChecked("ddp", p, o);
}

TEST(BaselinesTest, DdpClosesABucketThatANewGradientDependsOn) {
  // Program: grad1 ar1 use1 grad3 ar3 grad2 ar2, all 1 KiB (one 1 MiB bucket
  // by size). use1 reads ar1's output before grad3 is produced, but grad3
  // does not depend on it: the exact ancestor check lets ar3 join ar1's
  // bucket. grad2 reads ar1's output, so ar2 cannot join (the fused op would
  // wait for itself): the bucket {ar1, ar3} closes first; ar2 is left alone.
  Builder b({{"dp", 2}});
  for (const char* t : {"x", "g1", "s1", "u1", "g3", "s3", "g2", "s2"}) b.T(t, {16, 16});
  b.Compute("grad1", ComputeType::kScale, {"x"}, {"g1"}, Phase::kBackward, 2);
  b.Coll("ar1", CollectiveType::kAllReduce, "g1", "s1", "dp", "grad_sync", Phase::kBackward, 2);
  b.Compute("use1", ComputeType::kScale, {"s1"}, {"u1"}, Phase::kBackward, 2);
  b.Compute("grad3", ComputeType::kScale, {"x"}, {"g3"}, Phase::kBackward, 1);
  b.Coll("ar3", CollectiveType::kAllReduce, "g3", "s3", "dp", "grad_sync", Phase::kBackward, 1);
  b.Compute("grad2", ComputeType::kScale, {"s1"}, {"g2"}, Phase::kBackward, 0);
  b.Coll("ar2", CollectiveType::kAllReduce, "g2", "s2", "dp", "grad_sync", Phase::kBackward, 0);
  Program p = b.Take();
  ScheduledProgram sp = RunChecked("ddp", p);
  ASSERT_EQ(sp.schedule.fusion_groups.size(), 1u);
  EXPECT_EQ(sp.schedule.fusion_groups[0].members,
            (std::vector<int>{IdOf(p, "ar1"), IdOf(p, "ar3")}));
  EXPECT_EQ(StreamIds(sp, "comm"),
            (std::vector<int>{sp.schedule.fusion_groups[0].fused_op, IdOf(p, "ar2")}));
}

TEST(BaselinesTest, MegatronMakesActivationCollectivesSynchronous) {
  // 3 layers of 1024 x 1024 bf16 weights: each gradient all-reduce carries
  // 2 MiB = 1,048,576 elements. dp = 2, tp = 2.
  Program p = Mlp({1024, 1024, 1024, 1024}, 8, DType::kBF16, {{"dp", 2}, {"tp", 2}}, true);
  BaselineOptions o;
  o.megatron_bucket_min_params = 1;  // bucket = max(1, 1e6 x 2) = 2,000,000 elements
  ScheduledProgram sp = RunChecked("megatron", p, o);
  // Synchronous in the forward: each activation all-reduce stays on the comm
  // stream but the next compute op in launch order waits for it (a control
  // edge). In the backward they are async (Megatron's
  // LinearWithGradAccumulationAndAsyncCommunication overlaps the input-gradient
  // all-reduce with the weight-gradient GEMM): nothing waits but their users.
  const Graph& g = sp.program.graphs[0];
  auto held = [&](const char* a) {
    bool h = false;
    for (const Op& op : g.ops) h |= !op.IsComm() && ControlDep(sp, op.name, a);
    return h;
  };
  for (const char* a : {"act_ar.fwd.0", "act_ar.fwd.2"}) EXPECT_TRUE(held(a)) << a;
  for (const char* a : {"act_ar.bwd.1", "act_ar.bwd.2"}) EXPECT_FALSE(held(a)) << a;
  // Layer 2 then 1: 1,048,576 < 2e6; + 1,048,576 = 2,097,152 >= 2e6: close.
  // Layer 0 alone stays open to the end (not fused).
  ASSERT_EQ(sp.schedule.fusion_groups.size(), 1u);
  EXPECT_EQ(sp.schedule.fusion_groups[0].members,
            (std::vector<int>{IdOf(p, "grad_ar.2"), IdOf(p, "grad_ar.1")}));
  std::vector<int> grads;
  for (int id : StreamIds(sp, "comm"))
    for (const Op& op : sp.program.graphs[0].ops)
      if (op.id == id && op.tags.purpose == "grad_sync") grads.push_back(id);
  EXPECT_EQ(grads, (std::vector<int>{sp.schedule.fusion_groups[0].fused_op, IdOf(p, "grad_ar.0")}));
}

TEST(BaselinesTest, MegatronBucketGrowsWithDataParallelSize) {
  // dp = 4: bucket = max(1, 1e6 x 4) = 4,000,000 elements; all three
  // gradients (3,145,728 elements) fit in one bucket, closed at the end.
  Program p = Mlp({1024, 1024, 1024, 1024}, 8, DType::kBF16, {{"dp", 4}, {"tp", 2}}, true);
  BaselineOptions o;
  o.megatron_bucket_min_params = 1;
  ScheduledProgram sp = RunChecked("megatron", p, o);
  ASSERT_EQ(sp.schedule.fusion_groups.size(), 1u);
  EXPECT_EQ(sp.schedule.fusion_groups[0].members.size(), 3u);
  // With the default minimum of 4e7 parameters the same holds.
  sp = RunChecked("megatron", p);
  ASSERT_EQ(sp.schedule.fusion_groups.size(), 1u);
}

TEST(BaselinesTest, ZeroBucketsGathersAndAddsThePrefetchWindow) {
  // 4 layers of 64 x 64 f32. Gathers in order of use: fwd 0, 1, 2, 3, then
  // bwd 3, 2, 1 (layer 0 needs no dx), each 2,048 shard elements x dp 2 =
  // 4,096 parameters. Prefetch cap 8,192: two per bucket:
  //   G0 {ag.fwd.0, ag.fwd.1}, G1 {ag.fwd.2, ag.fwd.3}, G2 {ag.bwd.3, ag.bwd.2}, G3 {ag.bwd.1}.
  // Reduce-scatters in gradient-ready order 3, 2, 1, 0, each 4,096 elements,
  // cap 8,192 never exceeded: R0 {3, 2} (8,192), R1 {1, 0}.
  // Window: G2 waits for fwd.0 (first consumer of G0), G3 for fwd.2 (of G1).
  Program p = Zero3Mlp(4, 64, 8);
  BaselineOptions o;
  o.zero_prefetch_bucket_elements = 8192;
  o.zero_reduce_bucket_elements = 8192;
  ScheduledProgram sp = RunChecked("zero", p, o);
  const auto& fg = sp.schedule.fusion_groups;
  ASSERT_EQ(fg.size(), 5u);
  EXPECT_EQ(fg[0].members, (std::vector<int>{IdOf(p, "grad_rs.3"), IdOf(p, "grad_rs.2")}));
  EXPECT_EQ(fg[1].members, (std::vector<int>{IdOf(p, "grad_rs.1"), IdOf(p, "grad_rs.0")}));
  EXPECT_EQ(fg[2].members, (std::vector<int>{IdOf(p, "ag.fwd.0"), IdOf(p, "ag.fwd.1")}));
  EXPECT_EQ(fg[3].members, (std::vector<int>{IdOf(p, "ag.fwd.2"), IdOf(p, "ag.fwd.3")}));
  EXPECT_EQ(fg[4].members, (std::vector<int>{IdOf(p, "ag.bwd.3"), IdOf(p, "ag.bwd.2")}));
  const int g0 = fg[2].fused_op, g1 = fg[3].fused_op, g2 = fg[4].fused_op;
  const int g3 = IdOf(p, "ag.bwd.1");
  EXPECT_TRUE(OpWithId(sp.program, g0).control_deps.empty());
  EXPECT_TRUE(OpWithId(sp.program, g1).control_deps.empty());
  EXPECT_EQ(OpWithId(sp.program, g2).control_deps, std::vector<int>{IdOf(p, "fwd.0")});
  EXPECT_EQ(OpWithId(sp.program, g3).control_deps, std::vector<int>{IdOf(p, "fwd.2")});
  // Comm order: G0 and G1 at the start, G2 after fwd.0, G3 after fwd.2,
  // then the gradient buckets as their last gradients appear.
  EXPECT_EQ(StreamIds(sp, "comm"),
            (std::vector<int>{g0, g1, g2, g3, fg[0].fused_op, fg[1].fused_op}));
}

TEST(BaselinesTest, ZeroWithoutGathersBucketsGradientAllReduces) {
  // Elements in gradient-ready order: 157,317; 157,440; 2,621,440; 5,242,880.
  // Cap 3,000,000 never exceeded: 157,317 + 157,440 + 2,621,440 = 2,936,197;
  // adding 5,242,880 would pass the cap, so layer 0 starts a new bucket.
  Program p = DdpMlp();
  BaselineOptions o;
  o.zero_reduce_bucket_elements = 3000000;
  ScheduledProgram sp = RunChecked("zero", p, o);
  ASSERT_EQ(sp.schedule.fusion_groups.size(), 1u);
  EXPECT_EQ(sp.schedule.fusion_groups[0].members,
            (std::vector<int>{IdOf(p, "grad_ar.3"), IdOf(p, "grad_ar.2"), IdOf(p, "grad_ar.1")}));
  EXPECT_EQ(StreamIds(sp, "comm").size(), 2u);
}

TEST(BaselinesTest, DeepSpeedOverlapCommDoubleBuffersTheReduceBuckets) {
  // Elements in gradient-ready order: grad_ar.3 157,317; .2 157,440; .1
  // 2,621,440; .0 5,242,880. Cap 200,000: each gradient is a bucket of its
  // own. With overlap_comm, issuing bucket k makes the compute stream wait
  // for bucket k-1 (DeepSpeed's average_tensor: current_stream waits for the
  // reduction stream before the next reduction is enqueued), so the first
  // compute op after bucket k's producer waits for bucket k-1:
  //   bucket .2 is issued after bwd.dw.2 -> bwd.dx.2 waits for grad_ar.3
  //   bucket .1 after bwd.dw.1           -> bwd.dx.1 waits for grad_ar.2
  //   bucket .0 after bwd.dw.0           -> adam.0 (layer 0 has no dx) waits for grad_ar.1
  Program p = DdpMlp();
  BaselineOptions o;
  o.zero_reduce_bucket_elements = 200000;
  ScheduledProgram overlap = RunChecked("deepspeed-overlap", p, o);
  ScheduledProgram plain = RunChecked("zero", p, o);
  EXPECT_TRUE(overlap.schedule.fusion_groups.empty());
  const std::vector<std::pair<std::string, std::string>> waits = {
      {"bwd.dx.2", "grad_ar.3"}, {"bwd.dx.1", "grad_ar.2"}, {"adam.0", "grad_ar.1"}};
  for (const auto& [after, before] : waits) {
    EXPECT_TRUE(ControlDep(overlap, after, before)) << after << " <- " << before;
    EXPECT_FALSE(ControlDep(plain, after, before)) << after << " <- " << before;
  }
  // Simulated, the waits cost time only when a reduction outlasts the next
  // bucket's compute; never less than zero's makespan.
  FakeCost cost;
  EXPECT_GE(Simulate(overlap, cost).value().makespan_us, Simulate(plain, cost).value().makespan_us);
}

TEST(BaselinesTest, MegatronTpOverlapChunksSequenceParallelCollectivesAsync) {
  // llama-tiny tp=2 with sequence parallelism: every all-gather before a
  // column-parallel GEMM and every reduce-scatter after a row-parallel one is
  // chunked with its GEMM (4 chunks, TransformerEngine's pipeline default),
  // and the chunks run async (no compute op waits for one but its users);
  // the remaining collectives follow megatron (forward ones synchronous).
  Program p = LowerModelPlan("llama-tiny", "tp=2,sp").value();
  AnalyticCostModel cost(LoadCluster("a800-4x8").value());
  Result<ScheduledProgram> sp = RunBaseline("megatron-tp-overlap", p, cost);
  ASSERT_TRUE(sp.ok()) << sp.status().message();
  EXPECT_TRUE(VerifySchedule(sp->program, sp->schedule).empty());
  EXPECT_TRUE(VerifyProgram(sp->program).empty());
  const Graph& g = sp->program.graphs[0];
  std::set<int> chunk_ids;
  int gathers = 0, scatters = 0;
  for (const Op& op : g.ops) {
    if (op.kind != OpKind::kCollective || op.name.find(".c") == std::string::npos) continue;
    chunk_ids.insert(op.id);
    gathers += op.collective == CollectiveType::kAllGather;
    scatters += op.collective == CollectiveType::kReduceScatter;
  }
  EXPECT_GT(gathers, 0);
  EXPECT_GT(scatters, 0);
  EXPECT_EQ(chunk_ids.size() % 4, 0u);
  for (const Op& op : g.ops)
    for (int d : op.control_deps) EXPECT_FALSE(chunk_ids.count(d)) << op.name << " is held by a chunk";
  // Without sequence parallelism nothing is chunked: the same as megatron.
  Program q = LowerModelPlan("llama-tiny", "tp=2").value();
  const Schedule a = RunBaseline("megatron-tp-overlap", q, cost).value().schedule;
  const Schedule b = RunBaseline("megatron", q, cost).value().schedule;
  ASSERT_EQ(a.roles.size(), b.roles.size());
  for (size_t r = 0; r < a.roles.size(); ++r) {
    ASSERT_EQ(a.roles[r].streams.size(), b.roles[r].streams.size());
    for (size_t k = 0; k < a.roles[r].streams.size(); ++k)
      EXPECT_EQ(a.roles[r].streams[k].op_ids, b.roles[r].streams[k].op_ids) << a.roles[r].streams[k].stream;
  }
  Result<Timeline> t = Simulate(*sp, cost);
  ASSERT_TRUE(t.ok()) << t.status().message();
}

TEST(BaselinesTest, XlaMovesIndependentComputeBetweenCollectiveAndConsumer) {
  // Program: a -> ar -> c, and an independent chain i1 -> i2 after c.
  // Bottom-up: c (a collective's user first), ar's done; i2 and i1 fill the
  // latency; nothing else is ready, so ar starts; then a. Reversed:
  // a, ar, i1, i2, c: the chain now runs while ar is in flight.
  Builder b({{"dp", 2}});
  for (const char* t : {"x", "ya", "r", "yc", "y1", "y2"}) b.T(t, {4, 4});
  b.Compute("a", ComputeType::kScale, {"x"}, {"ya"}, Phase::kForward, 0);
  b.Coll("ar", CollectiveType::kAllReduce, "ya", "r", "dp", "activation", Phase::kForward, 0);
  b.Compute("c", ComputeType::kScale, {"r"}, {"yc"}, Phase::kForward, 0);
  b.Compute("i1", ComputeType::kScale, {"x"}, {"y1"}, Phase::kForward, 1);
  b.Compute("i2", ComputeType::kScale, {"y1"}, {"y2"}, Phase::kForward, 1);
  ScheduledProgram sp = RunChecked("xla-lhs", b.Take());
  EXPECT_EQ(StreamNames(sp, "compute"), (std::vector<std::string>{"a", "i1", "i2", "c"}));
  EXPECT_EQ(StreamNames(sp, "comm"), std::vector<std::string>{"ar"});
}

TEST(BaselinesTest, XlaKeepsOneCollectivePerTypeInFlight) {
  // Two independent all-reduces A (pA -> A -> cA) and B (pB -> B -> cB) and
  // a chain q0 -> ... -> q5999 of unit-cost ops. Bottom-up: cB (t=1), B's
  // done at t=1, cA (t=2; A's done must wait: B holds the all-reduce
  // resource), q5999 .. q1001 (t=5001) cover B's latency, B starts, A's done
  // at t=5001; q1000 .. q0 and pB (t=6003) cannot cover A's 5,000 units, so
  // A starts when nothing else is ready, then pA. Reversed: pA, A, pB,
  // q0 .. q1000, B: A and B are 1,003 positions apart. With both in flight
  // at once, A would have started right after B (1 unit later).
  Builder b({{"dp", 2}});
  for (const char* t : {"x", "a", "ra", "ya", "bb", "rb", "yb"}) b.T(t, {4, 4});
  b.Compute("pA", ComputeType::kScale, {"x"}, {"a"}, Phase::kForward, 0);
  b.Compute("pB", ComputeType::kScale, {"x"}, {"bb"}, Phase::kForward, 0);
  b.Coll("A", CollectiveType::kAllReduce, "a", "ra", "dp", "activation", Phase::kForward, 0);
  b.Coll("B", CollectiveType::kAllReduce, "bb", "rb", "dp", "activation", Phase::kForward, 0);
  std::string prev = "x";
  for (int k = 0; k < 6000; ++k) {
    b.T(L("q", k), {4, 4});
    b.Compute(L("q", k), ComputeType::kScale, {prev}, {L("q", k)}, Phase::kForward, 1);
    prev = L("q", k);
  }
  b.Compute("cA", ComputeType::kScale, {"ra"}, {"ya"}, Phase::kForward, 0);
  b.Compute("cB", ComputeType::kScale, {"rb"}, {"yb"}, Phase::kForward, 0);
  Program p = b.Take();
  Result<baseline::GraphPlan> plan = baseline::PlanXlaLhs(p.graphs[0], false);
  ASSERT_TRUE(plan.ok());
  std::map<std::string, int> at;
  for (size_t k = 0; k < plan->sequence.size(); ++k) at[p.graphs[0].ops[plan->sequence[k]].name] = k;
  EXPECT_EQ(at["pA"], 0);
  EXPECT_EQ(at["A"], 1);
  EXPECT_EQ(at["pB"], 2);
  EXPECT_EQ(at["B"] - at["A"], 1003);
  EXPECT_EQ(at["q1000"] + 1, at["B"]);
  RunChecked("xla-lhs", p);
}

/// A p2p op of `kind` over mesh axis "pp" towards `offset`, carrying `t`.
Op P2p(int id, const std::string& name, OpKind kind, const Tensor& t, int offset) {
  Op op;
  op.id = id;
  op.name = name;
  op.kind = kind;
  op.stream = "comm";
  op.peer.axis = "pp";
  op.peer.offset = offset;
  op.message_bytes = t.Bytes();
  (kind == OpKind::kSend ? op.inputs : op.outputs).push_back(t.name);
  op.tags.purpose = "pipeline";
  return op;
}

TEST(BaselinesTest, XlaKeepsCommOrderWhenRanksRunDifferentGraphs) {
  // Stage 0 sends x (64 B) then y (256 B); stage 1 receives them in that
  // order. c1 (after send1) comes after c2 (after send2) in program order,
  // so bottom-up send1's done is ready first and, free to reorder, the
  // scheduler would issue send2 before send1: the receiver would get 256 B
  // where it expects 64 B. With two graphs the comm order is kept.
  Program p;
  p.name = "pipe";
  p.mesh.axes = {{"pp", 2}};
  Graph g0, g1;
  g0.name = "stage0";
  g1.name = "stage1";
  Tensor x{"x", {4, 4}, DType::kF32, {}, {}}, y{"y", {8, 8}, DType::kF32, {}, {}};
  g0.tensors = {x, y, {"z1", {4, 4}, DType::kF32, {}, {}}, {"z2", {4, 4}, DType::kF32, {}, {}}};
  g0.ops.push_back(P2p(0, "send1", OpKind::kSend, x, +1));
  g0.ops.push_back(P2p(1, "send2", OpKind::kSend, y, +1));
  for (auto [id, name, out, dep] : {std::tuple{2, "c2", "z2", 1}, std::tuple{3, "c1", "z1", 0}}) {
    Op c;
    c.id = id;
    c.name = name;
    c.stream = "compute";
    c.compute_type = ComputeType::kScale;
    c.inputs = {"x"};
    c.outputs = {out};
    c.control_deps = {dep};
    g0.ops.push_back(c);
  }
  g1.tensors = {x, y};
  g1.ops.push_back(P2p(0, "recv1", OpKind::kRecv, x, -1));
  g1.ops.push_back(P2p(1, "recv2", OpKind::kRecv, y, -1));
  p.graphs = {g0, g1};
  p.roles = {{"s0", "stage0", {0}}, {"s1", "stage1", {1}}};
  Result<baseline::GraphPlan> free_order = baseline::PlanXlaLhs(p.graphs[0], false);
  ASSERT_TRUE(free_order.ok());
  std::vector<std::string> sends;
  for (int i : free_order->sequence)
    if (free_order->graph.ops[i].IsComm()) sends.push_back(free_order->graph.ops[i].name);
  EXPECT_EQ(sends, (std::vector<std::string>{"send2", "send1"}));
  ScheduledProgram sp = RunChecked("xla-lhs", p);
  EXPECT_EQ(StreamNames(sp, "comm"), (std::vector<std::string>{"send1", "send2"}));
  FakeCost cost;
  EXPECT_TRUE(Simulate(sp, cost).ok());
}

TEST(BaselinesTest, EveryBaselineIsDeterministicAndVerifies) {
  std::vector<Program> programs = {
      DdpMlp(), Mlp({1024, 1024, 1024, 1024}, 8, DType::kBF16, {{"dp", 2}, {"tp", 2}}, true),
      Zero3Mlp(4, 64, 8)};
  BaselineOptions o;
  o.zero_prefetch_bucket_elements = 8192;
  o.zero_reduce_bucket_elements = 8192;
  for (const Program& p : programs) {
    for (const std::string& name : BaselineNames()) {
      ScheduledProgram first = RunChecked(name, p, o);
      ScheduledProgram second = RunChecked(name, p, o);
      EXPECT_EQ(WriteSchedule(first.schedule), WriteSchedule(second.schedule)) << name;
      EXPECT_EQ(first.program.graphs[0].ops.size(), second.program.graphs[0].ops.size());
    }
  }
}

TEST(BaselinesTest, RolesSharingAGraphGetTheSameSchedule) {
  Program p = DdpMlp();
  p.roles = {{"even", "main", {0}}, {"odd", "main", {1}}};
  ScheduledProgram sp = RunChecked("ddp", p);
  ASSERT_EQ(sp.schedule.roles.size(), 2u);
  EXPECT_EQ(sp.schedule.roles[0].role, "even");
  EXPECT_EQ(sp.schedule.roles[1].role, "odd");
  EXPECT_EQ(sp.schedule.roles[0].streams[1].op_ids, sp.schedule.roles[1].streams[1].op_ids);
  EXPECT_EQ(sp.schedule.fusion_groups.size(), 4u);  // two buckets, listed for each role
}

TEST(BaselinesTest, GptTinyUnderEveryBaseline) {
  Result<Program> p = LowerGpt(*GptPreset("gpt-tiny"), DpTpPlan{2, 2});
  ASSERT_TRUE(p.ok()) << p.status().message();
  FakeCost cost;
  for (const std::string& name : BaselineNames()) {
    ScheduledProgram sp = RunChecked(name, *p);
    Result<Timeline> t = Simulate(sp, cost);
    EXPECT_TRUE(t.ok()) << name << ": " << t.status().message();
  }
}

// Every baseline schedules and verifies a 100k-op program (the seconds are
// printed, not asserted: bench/ measures speed).
TEST(BaselinesTest, HundredThousandOpsScheduleAndVerify) {
  SyntheticSpec spec;
  spec.num_ops = 100000;
  Program p = SyntheticProgram(spec);
  BaselineOptions o;
  o.zero_reduce_bucket_elements = 4 << 20;
  for (const std::string& name : BaselineNames()) {
    auto t0 = std::chrono::steady_clock::now();
    FakeCost cost;
    Result<ScheduledProgram> sp = RunBaseline(name, p, cost, o);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(sp.ok()) << name << ": " << sp.status().message();
    EXPECT_TRUE(VerifySchedule(sp->program, sp->schedule).empty()) << name;
    std::printf("%s: %.2f s on 100k ops\n", name.c_str(), s);
  }
}

// ---- Simulated makespans on the fake cost model ---------------------------
// Graph: Mlp({256, 512, 256}): two layers, each weight gradient 0.5 MiB f32.
// Program order: fwd.0 fwd.1 | bwd.dw.1 grad_ar.1 bwd.dx.1 bwd.dw.0 grad_ar.0 | adam.0 adam.1.
// Durations: matmul 10, Adam 2, all-reduce 40 + 10 x 0.5 = 45 (a fused 1 MiB one: 50).

Program SimMlp() { return Mlp({256, 512, 256}, 8, DType::kF32, {{"dp", 2}}, false); }

double Makespan(const std::string& name) {
  FakeCost cost;
  ScheduledProgram sp = RunChecked(name, SimMlp());
  Result<Timeline> t = Simulate(sp, cost);
  EXPECT_TRUE(t.ok()) << t.status().message();
  return t.ok() ? t->makespan_us : -1;
}

TEST(BaselinesTest, SimulatedSequential) {
  // Every op waits for the one before it (ar1, ar0 run on the comm stream):
  // compute: f0 0-10 | f1 10-20 | dw1 20-30 |           | dx1 75-85 | dw0 85-95 |            | adam0 140-142 | adam1 142-144
  // comm:                                   | ar1 30-75 |                       | ar0 95-140 |
  EXPECT_DOUBLE_EQ(Makespan("sequential"), 144);
}

TEST(BaselinesTest, SimulatedFifo) {
  // compute: f0 0-10 | f1 10-20 | dw1 20-30 | dx1 30-40 | dw0 40-50 | .......... | adam0 120-122 | adam1 122-124
  // comm:                          ar1 30-75 (after dw1)  | ar0 75-120 (stream busy until 75)
  EXPECT_DOUBLE_EQ(Makespan("fifo"), 124);
}

TEST(BaselinesTest, SimulatedDdp) {
  // One bucket: 0.5 MiB < 1 MiB; + 0.5 MiB = 1 MiB >= 1 MiB: fused, 40 + 10 = 50,
  // launched after dw0 (its last gradient).
  // compute: f0 0-10 | f1 10-20 | dw1 20-30 | dx1 30-40 | dw0 40-50 | ......... | adam0 100-102 | adam1 102-104
  // comm:                                                 fused 50-100
  EXPECT_DOUBLE_EQ(Makespan("ddp"), 104);
}

// Megatron runs the sends and recvs of the interleaved schedule async on
// their peer streams (overlap_p2p_comm, its scripts' default there) and those
// of plain 1F1B synchronously, on the compute stream (docs/schedulers.md).
TEST(BaselinesTest, MegatronOverlapsInterleavedPipelineSendsOnly) {
  // How many sends and recvs of pp rank 0 are tied into the compute lane by
  // control edges (a synchronous op waits for the op before it on the lane
  // and holds back the one after it; MakeSyncExplicit), of how many.
  auto synchronous_p2p = [](const std::string& plan_text) {
    ModelConfig m = ModelPreset("gpt-tiny").value();
    m.layers = 4;  // pp 2 x 2 chunks
    Result<Program> p = LowerTransformer(m, ParsePlan(plan_text).value());
    EXPECT_TRUE(p.ok()) << p.status().message();
    ScheduledProgram sp = RunChecked("megatron", *p);
    const Graph& g = sp.program.GraphOf(sp.program.roles[sp.program.RoleOfRank(0)]);
    std::set<int> tied;
    for (const Op& op : g.ops)
      for (int dep : op.control_deps) {
        tied.insert(dep);
        tied.insert(op.id);
      }
    int p2p = 0, sync = 0;
    for (const Op& op : g.ops)
      if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv) {
        ++p2p;
        sync += tied.count(op.id) > 0;
      }
    EXPECT_GT(p2p, 0);
    return std::make_pair(sync, p2p);
  };
  const auto plain = synchronous_p2p("pp=2,microbatches=4");
  // Every pipeline send and recv is synchronous: 8 of 10; the other two are the
  // tied embedding's gradient exchange at the end of the step, with no lane op after it.
  EXPECT_EQ(plain.first, plain.second - 2);
  EXPECT_EQ(synchronous_p2p("pp=2,microbatches=4,vstages=2").first, 0);
}

}  // namespace
}  // namespace concerto
