// Pipeline parallelism (1F1B) and micro-batches in the transformer frontend,
// checked against closed-form arithmetic (REFERENCES.md, "Transformer
// arithmetic": pipeline 1F1B sends B_micro x s x h per micro-batch per stage
// boundary in each direction). Conventions: docs/frontends.md ("pp").
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "concerto/cost/cluster.h"
#include "concerto/ir/comm_streams.h"
#include "concerto/cost/cost_model.h"
#include "concerto/ir/verifier.h"
#include "concerto/lower/plan.h"
#include "concerto/lower/transformer.h"
#include "concerto/schedule/scheduler.h"
#include "concerto/sim/simulator.h"

namespace concerto {
namespace {

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

ModelConfig Preset(const std::string& name) {
  Result<ModelConfig> m = ModelPreset(name);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? *m : ModelConfig{};
}

/// A tiny preset with `layers` layers (so that pp up to 8 divides them).
ModelConfig Deep(const std::string& preset, int layers) {
  ModelConfig m = Preset(preset);
  m.name = preset + "-" + std::to_string(layers) + "l";
  m.layers = layers;
  return m;
}

ParallelPlan Plan(const std::string& text) {
  Result<ParallelPlan> p = ParsePlan(text);
  EXPECT_TRUE(p.ok()) << p.status().message();
  return p.ok() ? *p : ParallelPlan{};
}

/// LowerTransformer that must succeed.
Program Lower(const ModelConfig& m, const std::string& plan) {
  Result<Program> p = LowerTransformer(m, Plan(plan));
  EXPECT_TRUE(p.ok()) << m.name << " " << plan << ": " << p.status().message();
  return p.ok() ? *p : Program{};
}

std::string FirstError(const std::vector<std::string>& errors) {
  return errors.empty() ? "" : errors.front();
}

/// Sends (or recvs) of `g` with `tag` to the peer `offset` stages away.
std::vector<const Op*> P2P(const Graph& g, OpKind kind, int tag, int offset) {
  std::vector<const Op*> out;
  for (const Op& op : g.ops)
    if (op.kind == kind && op.tag == tag && op.peer.axis == "pp" && op.peer.offset == offset)
      out.push_back(&op);
  return out;
}

/// The layer tags >= 0 that ops of `g` carry.
std::set<int> Layers(const Graph& g) {
  std::set<int> layers;
  for (const Op& op : g.ops)
    if (op.tags.layer >= 0) layers.insert(op.tags.layer);
  return layers;
}

bool HasOp(const Graph& g, const std::string& name) {
  for (const Op& op : g.ops)
    if (op.name == name) return true;
  return false;
}

/// The 1F1B order a stage's compute ops follow: "F0 F1 B0 ..." (runs of
/// forward/backward compute ops of one micro-batch, in program order).
std::string ComputeOrder(const Graph& g) {
  std::string out;
  Phase phase = Phase::kNone;
  int mb = -2;
  for (const Op& op : g.ops) {
    if (op.kind != OpKind::kCompute || op.tags.microbatch < 0) continue;
    if (op.tags.phase != Phase::kForward && op.tags.phase != Phase::kBackward) continue;
    if (op.tags.phase == phase && op.tags.microbatch == mb) continue;
    phase = op.tags.phase;
    mb = op.tags.microbatch;
    if (!out.empty()) out += ' ';
    out += phase == Phase::kForward ? 'F' : 'B';
    out += std::to_string(mb);
  }
  return out;
}

/// The pipeline sends and recvs of `g` toward the peer `offset` stages away,
/// in program order, as seen from the other end: "S" for a send, "R" for a
/// recv, then tag and micro-batch. `flip` swaps S and R, so that the two
/// ends of a boundary give equal strings when they pair in order.
std::string PeerOrder(const Graph& g, int offset, bool flip) {
  std::string out;
  for (const Op& op : g.ops) {
    if ((op.kind != OpKind::kSend && op.kind != OpKind::kRecv) || op.peer.offset != offset)
      continue;
    const bool send = (op.kind == OpKind::kSend) != flip;
    out += std::string(send ? "S" : "R") + std::to_string(op.tag) + "." +
           std::to_string(op.tags.microbatch) + " ";
  }
  return out;
}

/// Sum of compute flops of `g` in `phase`, skipping ops whose name contains
/// any of `skip`.
double Flops(const Graph& g, Phase phase, const std::vector<std::string>& skip = {}) {
  double total = 0;
  for (const Op& op : g.ops) {
    if (op.kind != OpKind::kCompute || op.tags.phase != phase) continue;
    bool skipped = false;
    for (const std::string& s : skip) skipped |= op.name.find(s) != std::string::npos;
    if (!skipped) total += op.flops;
  }
  return total;
}

/// Flops of every graph of `p` in `phase`, each graph once.
double ProgramFlops(const Program& p, Phase phase, const std::vector<std::string>& skip = {}) {
  double total = 0;
  for (const Graph& g : p.graphs) total += Flops(g, phase, skip);
  return total;
}

int CountName(const Graph& g, const std::string& part) {
  int n = 0;
  for (const Op& op : g.ops) n += op.name.find(part) != std::string::npos;
  return n;
}

int CountCollectives(const Graph& g, CollectiveType type, const std::string& purpose) {
  int n = 0;
  for (const Op& op : g.ops)
    n += op.kind == OpKind::kCollective && op.collective == type && op.tags.purpose == purpose;
  return n;
}

int CountAdam(const Graph& g) {
  int n = 0;
  for (const Op& op : g.ops)
    n += op.kind == OpKind::kCompute && op.compute_type == ComputeType::kAdam;
  return n;
}

// ---- program shape ----------------------------------------------------------

// gpt-6.7b (32 layers) on 32 ranks: pp=4 stages of 32/4 = 8 layers, each
// stage on dp x tp = 2 x 4 = 8 contiguous ranks (pp is the outermost axis).
TEST(Pipeline, MeshRolesAndLayersPerStage) {
  Program p = Lower(Preset("gpt-6.7b"), "pp=4,tp=4,dp=2,microbatches=8");
  ASSERT_EQ(p.mesh.axes.size(), 3u);
  EXPECT_EQ(p.mesh.axes[0].name, "pp");
  EXPECT_EQ(p.mesh.axes[1].name, "dp");
  EXPECT_EQ(p.mesh.axes[2].name, "tp");
  EXPECT_EQ(p.mesh.NumRanks(), 32);
  ASSERT_EQ(p.graphs.size(), 4u);
  ASSERT_EQ(p.roles.size(), 4u);
  EXPECT_EQ(p.name, "gpt-6.7b.dp2.tp4.pp4.mb8");
  for (int i = 0; i < 4; ++i) {
    const std::string name = "stage" + std::to_string(i);
    EXPECT_EQ(p.graphs[i].name, name);
    EXPECT_EQ(p.roles[i].name, name);
    EXPECT_EQ(p.roles[i].graph, name);
    std::vector<int> ranks;
    for (int r = 8 * i; r < 8 * i + 8; ++r) ranks.push_back(r);
    EXPECT_EQ(p.roles[i].ranks, ranks);
    for (int r : ranks) EXPECT_EQ(p.mesh.Coords(r)[0], i);
    std::set<int> layers;
    for (int l = 8 * i; l < 8 * i + 8; ++l) layers.insert(l);
    EXPECT_EQ(Layers(p.graphs[i]), layers) << name;
    // The embedding on stage 0 only; the final norm, head and loss on the last.
    EXPECT_EQ(HasOp(p.graphs[i], "embed.word.mb0"), i == 0) << name;
    EXPECT_EQ(HasOp(p.graphs[i], "head.mb0"), i == 3) << name;
    EXPECT_EQ(HasOp(p.graphs[i], "final_ln.mb0"), i == 3) << name;
    EXPECT_EQ(HasOp(p.graphs[i], "loss.cross_entropy.mb7"), i == 3) << name;
  }
}

// Per stage boundary and direction exactly m send/recv pairs of
// B_micro * s * h * 2 bytes, micro-batches 0..m-1 in order, purpose "pipeline".
//  gpt-6.7b pp=4 tp=4 dp=2 m=8: B_micro = 8 (the preset's batch is per micro-batch),
//    8 * 2048 * 4096 * 2 = 134,217,728 bytes, 8 per boundary per direction.
//  gpt-tiny pp=2 m=4: 2 * 64 * 256 * 2 = 65,536 bytes.
//  llama-70b pp=8 tp=8 sp m=16: the residual stream is sequence-sharded,
//    1 * (4096 / 8) * 8192 * 2 = 8,388,608 bytes per tp rank.
TEST(Pipeline, MSendRecvPairsPerBoundaryPerDirection) {
  struct Case {
    const char* model;
    const char* plan;
    int pp, m;
    int64_t bytes;
  };
  const Case cases[] = {
      {"gpt-6.7b", "pp=4,tp=4,dp=2,microbatches=8", 4, 8, 134217728},
      {"gpt-tiny", "pp=2,microbatches=4", 2, 4, 65536},
      {"llama-70b", "pp=8,tp=8,sp,microbatches=16", 8, 16, 8388608},
  };
  for (const Case& c : cases) {
    Program p = Lower(Preset(c.model), c.plan);
    ASSERT_EQ(static_cast<int>(p.graphs.size()), c.pp);
    for (int i = 0; i + 1 < c.pp; ++i) {
      const Graph& lo = p.graphs[i];
      const Graph& hi = p.graphs[i + 1];
      const std::vector<std::vector<const Op*>> ends = {
          P2P(lo, OpKind::kSend, 0, +1), P2P(hi, OpKind::kRecv, 0, -1),   // activations up
          P2P(hi, OpKind::kSend, 1, -1), P2P(lo, OpKind::kRecv, 1, +1)};  // their grads down
      for (const auto& ops : ends) {
        ASSERT_EQ(static_cast<int>(ops.size()), c.m) << c.plan << " boundary " << i;
        for (int k = 0; k < c.m; ++k) {
          EXPECT_EQ(ops[k]->message_bytes, c.bytes) << c.plan << " " << ops[k]->name;
          EXPECT_EQ(ops[k]->tags.microbatch, k) << ops[k]->name;
          EXPECT_EQ(ops[k]->tags.purpose, "pipeline");
          EXPECT_EQ(ops[k]->stream, ops[k]->peer.offset > 0 ? "p2p.pp+1" : "p2p.pp-1");  // per peer pair
        }
      }
    }
    // No stage talks to the stage before the first or after the last.
    EXPECT_TRUE(P2P(p.graphs[0], OpKind::kRecv, 0, -1).empty());
    EXPECT_TRUE(P2P(p.graphs[c.pp - 1], OpKind::kSend, 0, +1).empty());
  }
}

// ---- every program verifies; fifo simulates without deadlock ------------------

struct PlanCase {
  ModelConfig model;
  const char* plan;
};

std::vector<PlanCase> SmallPlans() {
  return {
      {Preset("gpt-tiny"), "pp=2,microbatches=4"},
      {Preset("gpt-tiny"), "pp=2,microbatches=2"},
      {Preset("llama-tiny"), "pp=2,tp=2,dp=2,microbatches=2"},
      {Preset("llama-tiny"), "pp=2,tp=2,dp=2,sp,microbatches=3"},
      {Preset("gpt-tiny"), "pp=2,tp=2,sp,dp=2,zero=1,microbatches=4"},
      {Preset("gpt-tiny"), "pp=2,dp=2,zero=2,microbatches=2"},
      {Preset("gpt-tiny"), "pp=2,dp=2,tp=2,zero=3,microbatches=3"},
      {Preset("llama-tiny"), "pp=2,dp=2,zero=3,microbatches=2"},
      {Preset("gpt-tiny"), "dp=2,microbatches=4"},  // gradient accumulation, no pp
      {Preset("llama-tiny"), "tp=2,sp,zero=2,dp=2,microbatches=3"},
      {Deep("gpt-tiny", 4), "pp=4,microbatches=4"},
      {Deep("gpt-tiny", 6), "pp=3,dp=2,microbatches=5"},
      {Deep("llama-tiny", 8), "pp=8,microbatches=8"},
      {Deep("llama-tiny", 8), "pp=4,tp=2,microbatches=11"},
      {Deep("gpt-tiny", 8), "pp=8,tp=2,sp,microbatches=9"},
  };
}

TEST(Pipeline, EveryProgramPassesTheVerifier) {
  std::vector<PlanCase> cases = SmallPlans();
  cases.push_back({Preset("gpt-6.7b"), "pp=4,tp=4,dp=2,microbatches=8"});
  cases.push_back({Preset("llama-70b"), "pp=8,tp=8,microbatches=16"});
  cases.push_back({Preset("gpt-13b"), "pp=4,tp=8,sp,zero=1,dp=2,microbatches=4"});
  for (const PlanCase& c : cases) {
    Program p = Lower(c.model, c.plan);
    std::vector<std::string> errors = VerifyProgram(p);
    EXPECT_TRUE(errors.empty()) << c.model.name << " " << c.plan << ": " << FirstError(errors);
  }
}

// In every stage graph: ids are 0..n-1, op and tensor names unique, and
// every tensor an op reads is a graph input or produced earlier (program
// order is a topological order); a send reads, a recv writes, one tensor.
TEST(Pipeline, ProgramOrderIsADataflowOrder) {
  for (const PlanCase& c : SmallPlans()) {
    Program p = Lower(c.model, c.plan);
    for (const Graph& g : p.graphs) {
      std::set<std::string> declared, produced, read_as_input, names;
      for (const Tensor& t : g.tensors) EXPECT_TRUE(declared.insert(t.name).second) << t.name;
      for (size_t i = 0; i < g.ops.size(); ++i) {
        const Op& op = g.ops[i];
        EXPECT_EQ(op.id, static_cast<int>(i));
        EXPECT_TRUE(names.insert(op.name).second) << c.plan << " " << g.name << " " << op.name;
        EXPECT_EQ(op.stream, op.IsComm() ? CommunicatorStream(op) : "compute");
        if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv) {
          EXPECT_EQ(op.inputs.size() + op.outputs.size(), 1u) << op.name;
        }
        for (const std::string& in : op.inputs) {
          EXPECT_TRUE(declared.count(in)) << op.name << " reads " << in;
          if (!produced.count(in)) read_as_input.insert(in);
        }
        for (const std::string& out : op.outputs) {
          EXPECT_FALSE(read_as_input.count(out)) << out << " read before " << op.name;
          EXPECT_TRUE(produced.insert(out).second) << out << " produced twice";
        }
      }
    }
  }
}

// The fifo baseline keeps program order on every stream; the simulator treats
// a send and its recv as a rendezvous, so a bad order of sends and recvs
// across stages would deadlock here.
TEST(Pipeline, FifoScheduleSimulatesWithoutDeadlock) {
  AnalyticCostModel cost(LoadCluster("a800-4x8").value());
  for (const PlanCase& c : SmallPlans()) {
    Program p = Lower(c.model, c.plan);
    Result<ScheduledProgram> sp = RunBaseline("fifo", p, cost);
    ASSERT_TRUE(sp.ok()) << c.plan << ": " << sp.status().message();
    for (bool all_ranks : {false, true}) {
      SimOptions options;
      options.all_ranks = all_ranks;
      Result<Timeline> t = Simulate(*sp, cost, options);
      ASSERT_TRUE(t.ok()) << c.model.name << " " << c.plan << ": " << t.status().message();
      EXPECT_GT(t->makespan_us, 0);
    }
  }
}

// The control: stage 1 of gpt-tiny pp=2 m=4 issues its first activation-grad
// send (grad 0) before the recv of activation 1, while stage 0 sends
// activation 1 before it receives grad 0. Both sends wait for a recv the
// other stage has not reached: the simulator reports the deadlock.
TEST(Pipeline, SendBeforeRecvOnTheLowerEndDeadlocks) {
  AnalyticCostModel cost(LoadCluster("a800-4x8").value());
  Program p = Lower(Preset("gpt-tiny"), "pp=2,microbatches=4");
  std::vector<Op>& ops = p.graphs[1].ops;
  size_t recv = 0;
  while (recv < ops.size() && ops[recv].name != "pp.fwd.recv.mb1") ++recv;
  ASSERT_LT(recv + 1, ops.size());
  ASSERT_EQ(ops[recv + 1].name, "pp.bwd.send.mb0");  // the deferred send comes right after
  std::swap(ops[recv], ops[recv + 1]);
  std::swap(ops[recv].id, ops[recv + 1].id);  // ids stay 0..n-1 in program order
  Result<ScheduledProgram> sp = RunBaseline("fifo", p, cost);
  ASSERT_TRUE(sp.ok()) << sp.status().message();
  Result<Timeline> t = Simulate(*sp, cost);
  ASSERT_FALSE(t.ok());
  EXPECT_HAS(t.status().message(), "deadlock");
}

// Every baseline schedules and simulates the two plans the brief names.
TEST(Pipeline, EveryBaselineSimulates) {
  AnalyticCostModel cost(LoadCluster("a800-4x8").value());
  const PlanCase cases[] = {{Preset("gpt-tiny"), "pp=2,microbatches=4"},
                            {Preset("llama-tiny"), "pp=2,tp=2,dp=2,microbatches=2"}};
  for (const PlanCase& c : cases) {
    Program p = Lower(c.model, c.plan);
    for (const std::string& name : BaselineNames()) {
      Result<ScheduledProgram> sp = RunBaseline(name, p, cost);
      ASSERT_TRUE(sp.ok()) << name << " " << c.plan << ": " << sp.status().message();
      Result<Timeline> t = Simulate(*sp, cost);
      EXPECT_TRUE(t.ok()) << name << " " << c.plan << ": " << t.status().message();
      if (t.ok()) {
        std::printf("%-10s %-32s %-10s %10.1f us\n", c.model.name.c_str(), c.plan, name.c_str(),
                    t->makespan_us);
      }
    }
  }
}

// ---- 1F1B order --------------------------------------------------------------

// pp=4, m=6: stage i runs pp - i - 1 warm-up forwards, then alternates one
// forward and one backward, then the cool-down backwards. The last stage's
// first backward comes right after its first forward.
TEST(Pipeline, ComputeFollowsOneFOneB) {
  Program p = Lower(Deep("llama-tiny", 4), "pp=4,microbatches=6");
  ASSERT_EQ(p.graphs.size(), 4u);
  EXPECT_EQ(ComputeOrder(p.graphs[0]), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(ComputeOrder(p.graphs[1]), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
  EXPECT_EQ(ComputeOrder(p.graphs[2]), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  EXPECT_EQ(ComputeOrder(p.graphs[3]), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  // m = pp: no steady state beyond one F/B pair on stage 0.
  Program q = Lower(Preset("gpt-tiny"), "pp=2,microbatches=2");
  EXPECT_EQ(ComputeOrder(q.graphs[0]), "F0 F1 B0 B1");
  EXPECT_EQ(ComputeOrder(q.graphs[1]), "F0 B0 F1 B1");
  // Gradient accumulation without pp: F0 B0 F1 B1 ...
  Program r = Lower(Preset("gpt-tiny"), "dp=2,microbatches=3");
  EXPECT_EQ(ComputeOrder(r.graphs[0]), "F0 B0 F1 B1 F2 B2");
}

// On each boundary the two ends list their sends and recvs in the same
// order (a send on one end meets the recv at the same position on the
// other). pp=2, m=4 (as "S|R tag.microbatch"): stage 0 sends activations 0
// and 1 (warm-up + first steady forward) before it receives grad 0; stage 1
// receives activation 1 before it sends grad 0 (its send waits past the
// next forward's recv). Last, gpt's tied-table exchange (tag 2, per step).
TEST(Pipeline, SendsAndRecvsPairInOrderOnEveryBoundary) {
  Program two = Lower(Preset("gpt-tiny"), "pp=2,microbatches=4");
  EXPECT_EQ(PeerOrder(two.graphs[0], +1, false),
            "S0.0 S0.1 R1.0 S0.2 R1.1 S0.3 R1.2 R1.3 S2.-1 R2.-1 ");
  EXPECT_EQ(PeerOrder(two.graphs[1], -1, true), PeerOrder(two.graphs[0], +1, false));
  for (const char* plan : {"pp=4,microbatches=4", "pp=4,microbatches=7", "pp=8,microbatches=8",
                           "pp=8,microbatches=13", "pp=2,microbatches=5"}) {
    Program p = Lower(Deep("llama-tiny", 8), plan);
    for (size_t i = 0; i + 1 < p.graphs.size(); ++i)
      EXPECT_EQ(PeerOrder(p.graphs[i], +1, false), PeerOrder(p.graphs[i + 1], -1, true))
          << plan << " boundary " << i;
  }
}

// ---- arithmetic: flops, gradient accumulation, ZeRO ----------------------------

// The micro-batch is the preset's batch (B_micro = model.batch), so a step
// of m micro-batches does m times the forward and backward work of one
// unpipelined step, spread over the stages: forward flops sum to exactly
// m x; backward flops too once the per-step bookkeeping is left out (the
// gradient accumulation adds, the loss scale by 1/(dp*m), gpt's tied-table
// adds); the optimizer runs once per step, over the same parameters.
TEST(Pipeline, FlopsOverStagesAreMTimesTheUnpipelinedStep) {
  const std::vector<std::string> bookkeeping = {".grad.acc", "loss.grad_scale", "tied_add"};
  for (const char* model : {"llama-tiny", "gpt-tiny"}) {
    const ModelConfig m = Deep(model, 4);
    Program ref = Lower(m, "tp=2");
    for (const char* plan : {"pp=2,tp=2,microbatches=4", "pp=4,tp=2,microbatches=4",
                             "tp=2,microbatches=4"}) {
      Program p = Lower(m, plan);
      EXPECT_DOUBLE_EQ(ProgramFlops(p, Phase::kForward), 4 * ProgramFlops(ref, Phase::kForward))
          << model << " " << plan;
      EXPECT_DOUBLE_EQ(ProgramFlops(p, Phase::kBackward, bookkeeping),
                       4 * ProgramFlops(ref, Phase::kBackward, bookkeeping))
          << model << " " << plan;
      // gpt's tied table has a copy on the first and the last stage: its Adam
      // runs twice, V/tp * h * 10 more flops. llama: equal.
      double extra = 0;
      if (std::string(model) == "gpt-tiny" && p.graphs.size() > 1)
        extra = 10.0 * (m.vocab / 2) * m.hidden;
      EXPECT_DOUBLE_EQ(ProgramFlops(p, Phase::kOptimizer),
                       ProgramFlops(ref, Phase::kOptimizer) + extra)
          << model << " " << plan;
    }
  }
}

// Gradient accumulation, llama-tiny (2 layers x 9 parameters + word table,
// final norm, head = 21 parameters), dp=2, m=4: every parameter gets m - 1 =
// 3 accumulation adds, then one all-reduce over dp after the last
// micro-batch, and one Adam. 21 * 3 = 63 adds, 21 all-reduces.
TEST(Pipeline, GradientAccumulationSyncsOncePerStep) {
  Program p = Lower(Preset("llama-tiny"), "dp=2,microbatches=4");
  ASSERT_EQ(p.graphs.size(), 1u);
  const Graph& g = p.graphs[0];
  EXPECT_EQ(g.name, "main");
  EXPECT_EQ(p.roles[0].name, "spmd");
  EXPECT_EQ(CountAdam(g), 21);
  EXPECT_EQ(CountName(g, ".grad.acc"), 63);
  EXPECT_EQ(CountCollectives(g, CollectiveType::kAllReduce, "grad_sync"), 21);
  // The sync reads the summed gradient and runs after the last micro-batch's
  // weight grad; the loss gradient is scaled by 1/(dp*m) = 1/8.
  for (const Op& op : g.ops) {
    if (op.kind == OpKind::kCollective && op.tags.purpose == "grad_sync") {
      EXPECT_EQ(op.tags.microbatch, -1) << op.name;
      EXPECT_NE(op.inputs[0].find(".grad.acc.mb3"), std::string::npos) << op.name;
    }
    if (op.name.rfind("loss.grad_scale", 0) == 0) {
      EXPECT_DOUBLE_EQ(op.Attr("scale", 0), 1.0 / 8);
    }
  }
}

// ZeRO with m = 3 micro-batches, llama-tiny dp=2 (21 parameters):
//  zero=1: gradients summed in full, one reduce-scatter per parameter (21).
//  zero=2: DeepSpeed reduce-scatters every micro-batch: 3 * 21 = 63, and the
//    shards are summed (2 adds per parameter = 42).
//  zero=3: parameters gathered per micro-batch: forward 3 * 21 = 63, backward
//    3 * (21 - 1 word table, whose grad does not read it) = 60; 63 reduce-scatters.
TEST(Pipeline, ZeroWithMicrobatches) {
  const ModelConfig m = Preset("llama-tiny");
  const Graph z1 = Lower(m, "dp=2,zero=1,microbatches=3").graphs[0];
  EXPECT_EQ(CountCollectives(z1, CollectiveType::kReduceScatter, "grad_sync"), 21);
  EXPECT_EQ(CountName(z1, ".grad.acc"), 42);
  const Graph z2 = Lower(m, "dp=2,zero=2,microbatches=3").graphs[0];
  EXPECT_EQ(CountCollectives(z2, CollectiveType::kReduceScatter, "grad_sync"), 63);
  EXPECT_EQ(CountName(z2, ".grad.acc"), 42);
  const Graph z3 = Lower(m, "dp=2,zero=3,microbatches=3").graphs[0];
  EXPECT_EQ(CountName(z3, ".ag.fwd"), 63);
  EXPECT_EQ(CountName(z3, ".ag.bwd"), 60);
  EXPECT_EQ(CountCollectives(z3, CollectiveType::kReduceScatter, "grad_sync"), 63);
}

// gpt ties the LM head to the word table. With pp the first stage (embedding)
// and the last (head) each hold a copy; after the last backward they
// exchange their accumulated table gradients (tag 2, purpose grad_sync,
// V/tp * h * 2 = 512/2 * 256 * 2 = 131,072 bytes with tp=2), add them, and
// then sync over dp as usual. Middle stages hold no table.
TEST(Pipeline, TiedEmbeddingGradientsSummedAcrossFirstAndLastStage) {
  Program p = Lower(Deep("gpt-tiny", 4), "pp=4,tp=2,dp=2,microbatches=4");
  ASSERT_EQ(p.graphs.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const Graph& g = p.graphs[i];
    const bool end = i == 0 || i == 3;
    const int offset = i == 0 ? 3 : -3;
    std::vector<const Op*> sends = P2P(g, OpKind::kSend, 2, offset);
    std::vector<const Op*> recvs = P2P(g, OpKind::kRecv, 2, offset);
    ASSERT_EQ(sends.size(), end ? 1u : 0u) << g.name;
    ASSERT_EQ(recvs.size(), end ? 1u : 0u) << g.name;
    EXPECT_EQ(HasOp(g, "embed.word.table.adam"), end) << g.name;
    if (!end) continue;
    EXPECT_EQ(sends[0]->message_bytes, 131072);
    EXPECT_EQ(sends[0]->tags.purpose, "grad_sync");
    // First stage sends first; the last receives first (rendezvous order).
    EXPECT_EQ(sends[0]->id < recvs[0]->id, i == 0) << g.name;
    EXPECT_TRUE(HasOp(g, "embed.word.table.grad.tied_add"));
    EXPECT_TRUE(HasOp(g, "embed.word.table.grad.ar"));
  }
  // llama's head is untied: no exchange.
  Program q = Lower(Deep("llama-tiny", 4), "pp=2,microbatches=2");
  for (const Graph& g : q.graphs) EXPECT_TRUE(P2P(g, OpKind::kSend, 2, 1).empty());
}

// ---- plans that do not fit ------------------------------------------------------

TEST(Pipeline, RejectedPlansSayWhy) {
  auto message = [](const ModelConfig& m, const std::string& plan) {
    Result<Program> p = LowerTransformer(m, Plan(plan));
    EXPECT_FALSE(p.ok()) << plan;
    return p.ok() ? std::string() : p.status().message();
  };
  EXPECT_HAS(message(Preset("gpt-tiny"), "pp=2"), "1F1B needs microbatches >= pp");
  EXPECT_HAS(message(Preset("gpt-tiny"), "pp=3,microbatches=3"), "pp (3) must divide layers (2)");
  // Interleaved stages are the key vstages (tests/lower/interleaved_pipeline_test.cc);
  // "interleave" is not a key, and the message lists the known ones.
  Result<ParallelPlan> interleaved = ParsePlan("pp=2,microbatches=4,interleave=2");
  ASSERT_FALSE(interleaved.ok());
  EXPECT_HAS(interleaved.status().message(), "unknown key 'interleave'");
  EXPECT_HAS(interleaved.status().message(), "vstages");
  EXPECT_HAS(message(Preset("gpt-tiny"), "pp=2,vstages=2,microbatches=2"),
             "pp x vstages (4) must divide layers (2)");
  EXPECT_HAS(message(Deep("gpt-tiny", 4), "pp=2,vstages=2,microbatches=3"),
             "needs microbatches to be a multiple of pp");
}

// ---- speed ------------------------------------------------------------------------

// The issue asks for llama-70b pp=8 tp=8 m=16 in under 2 s; recorded, not asserted.
TEST(Pipeline, TimeLoweringLlama70bPp8Tp8M16) {
  auto start = std::chrono::steady_clock::now();
  Result<Program> p = LowerTransformer(Preset("llama-70b"), Plan("pp=8,tp=8,microbatches=16"));
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(p.ok()) << p.status().message();
  size_t ops = 0, comm = 0, p2p = 0;
  for (const Graph& g : p->graphs) {
    ops += g.ops.size();
    for (const Op& op : g.ops) {
      comm += op.IsComm();
      p2p += op.kind == OpKind::kSend || op.kind == OpKind::kRecv;
    }
    std::printf("  %s: %zu ops\n", g.name.c_str(), g.ops.size());
  }
  std::printf("llama-70b pp8 tp8 m16: %zu graphs, %zu ops (%zu comm, %zu send/recv), lowered in "
              "%.1f ms\n",
              p->graphs.size(), ops, comm, p2p, ms);
}

}  // namespace
}  // namespace concerto
