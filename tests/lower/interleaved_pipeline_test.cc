// Interleaved 1F1B (plan key vstages, Megatron's virtual pipeline stages):
// each pp rank runs `vstages` model chunks; virtual stage s = chunk * pp +
// rank holds layers [s L/(pp v), (s+1) L/(pp v)). Checked here: the per-rank
// order of passes, the sends and recvs per virtual boundary (with the
// wrap-around from the last rank to the first), that both ends of every
// rank pair list their messages in the same order, the verifier, fifo
// simulation without deadlock, the smaller pipeline bubble, and a real run
// against the unsharded model (docs/frontends.md, "Interleaved 1F1B").
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "concerto/cost/cluster.h"
#include "concerto/ir/comm_streams.h"
#include "concerto/cost/cost_model.h"
#include "concerto/ir/verifier.h"
#include "concerto/lower/plan.h"
#include "concerto/lower/transformer.h"
#include "concerto/runtime/executor.h"
#include "concerto/runtime/reference.h"
#include "concerto/schedule/scheduler.h"
#include "concerto/sim/simulator.h"

namespace concerto {
namespace {

/// A tiny preset with `layers` layers.
ModelConfig Deep(const std::string& preset, int layers) {
  ModelConfig m = ModelPreset(preset).value();
  m.name = preset + "-" + std::to_string(layers) + "l";
  m.layers = layers;
  return m;
}

Program Lower(const ModelConfig& m, const std::string& plan) {
  Result<ParallelPlan> p = ParsePlan(plan);
  EXPECT_TRUE(p.ok()) << p.status().message();
  if (!p.ok()) return Program{};
  Result<Program> program = LowerTransformer(m, *p);
  EXPECT_TRUE(program.ok()) << m.name << " " << plan << ": " << program.status().message();
  return program.ok() ? *program : Program{};
}

/// The passes of a stage graph in program order, "F<mb>.<chunk>" or
/// "B<mb>.<chunk>": runs of forward/backward compute ops of one micro-batch
/// in one chunk (the chunk from the layer tag; ops outside the blocks do
/// not start a run).
std::string PassOrder(const Graph& g, int layers_per_chunk, int pp) {
  std::string out;
  Phase phase = Phase::kNone;
  int mb = -2, chunk = -1;
  for (const Op& op : g.ops) {
    if (op.kind != OpKind::kCompute || op.tags.microbatch < 0 || op.tags.layer < 0) continue;
    if (op.tags.phase != Phase::kForward && op.tags.phase != Phase::kBackward) continue;
    if (op.name.find(".grad.acc") != std::string::npos) continue;  // accumulation adds
    const int c = op.tags.layer / layers_per_chunk / pp;
    if (op.tags.phase == phase && op.tags.microbatch == mb && c == chunk) continue;
    phase = op.tags.phase;
    mb = op.tags.microbatch;
    chunk = c;
    if (!out.empty()) out += ' ';
    out += phase == Phase::kForward ? 'F' : 'B';
    out += std::to_string(mb);
    out += '.';
    out += std::to_string(c);
  }
  return out;
}

/// Sends or recvs of `g` with `tag` and peer offset `offset` on pp.
int CountP2P(const Graph& g, OpKind kind, int tag, int offset, int64_t bytes) {
  int n = 0;
  for (const Op& op : g.ops)
    if (op.kind == kind && op.tag == tag && op.peer.axis == "pp" && op.peer.offset == offset) {
      EXPECT_EQ(op.message_bytes, bytes) << op.name;
      EXPECT_EQ(op.stream, CommunicatorStream(op));
      ++n;
    }
  return n;
}

/// The messages of stage `from` toward stage `to` and back, in program
/// order, as "S|R tag.mb": `flip` swaps S and R, so that the two ends of a
/// rank pair give equal strings exactly when they pair in order.
std::string PairOrder(const Program& p, int from, int to, bool flip) {
  std::string out;
  for (const Op& op : p.graphs[from].ops) {
    if (op.kind != OpKind::kSend && op.kind != OpKind::kRecv) continue;
    if (op.peer.offset != to - from) continue;
    const bool send = (op.kind == OpKind::kSend) != flip;
    out += send ? 'S' : 'R';
    out += std::to_string(op.tag);
    out += '.';
    out += std::to_string(op.tags.microbatch);
    out += ' ';
  }
  return out;
}

// Megatron's interleaved order, pp=2, v=2, m=4 (8 passes per direction per
// rank). Forward pass k runs micro-batch (k / 4) * 2 + k % 2 in chunk
// (k / 2) % 2: (0,0) (1,0) (0,1) (1,1) (2,0) (3,0) (2,1) (3,1); backward
// pass k the same micro-batch in chunk 1 - (k / 2) % 2. Warm-up forwards:
// (pp - rank - 1) * 2 + (v - 1) * pp = 4 on rank 0, 2 on rank 1.
TEST(Interleaved, PassesFollowMegatronsOrder) {
  const Program p = Lower(Deep("gpt-tiny", 4), "pp=2,vstages=2,microbatches=4");
  ASSERT_EQ(p.graphs.size(), 2u);
  EXPECT_EQ(p.name, "gpt-tiny-4l.dp1.tp1.pp2.mb4.vs2");
  EXPECT_EQ(PassOrder(p.graphs[0], 1, 2),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(PassOrder(p.graphs[1], 1, 2),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  // Rank 0 holds layers 0 (chunk 0, with the embedding) and 2 (chunk 1);
  // rank 1 layers 1 and 3 (chunk 1 ends with the head and the loss).
  std::set<int> layers0, layers1;
  for (const Op& op : p.graphs[0].ops)
    if (op.tags.layer >= 0) layers0.insert(op.tags.layer);
  for (const Op& op : p.graphs[1].ops)
    if (op.tags.layer >= 0) layers1.insert(op.tags.layer);
  EXPECT_EQ(layers0, (std::set<int>{0, 2}));
  EXPECT_EQ(layers1, (std::set<int>{1, 3}));
}

// gpt-tiny, 4 layers, pp=2, v=2, m=4: virtual stages 0..3 on ranks 0 1 0 1.
// Forward boundaries 0->1 and 2->3 go from rank 0 to rank 1 (offset +1),
// 1->2 wraps from rank 1 to rank 0 (offset -(pp-1) = -1); backward mirrors.
// Each boundary carries m = 4 messages per direction of B x s x h x 2 =
// 2 x 64 x 256 x 2 = 65,536 bytes, so rank 0 sends 2 x 4 = 8 activations
// and 4 grads, rank 1 sends 4 activations and 8 grads: 2 directions x 3
// boundaries x 4 = 24 sends in all (and 24 recvs), against 2 x 1 x 4 = 8 of
// plain 1F1B. Everything else is the same as plain 1F1B on the same layers:
// the compute ops (by name) are the same set, 32 more send/recv ops.
TEST(Interleaved, SendsAndRecvsPerVirtualBoundary) {
  const ModelConfig m = Deep("gpt-tiny", 4);
  const Program p = Lower(m, "pp=2,vstages=2,microbatches=4");
  const Program plain = Lower(m, "pp=2,microbatches=4");
  const int64_t bytes = 65536;
  const Graph& r0 = p.graphs[0];
  const Graph& r1 = p.graphs[1];
  EXPECT_EQ(CountP2P(r0, OpKind::kSend, 0, +1, bytes), 8);
  EXPECT_EQ(CountP2P(r1, OpKind::kRecv, 0, -1, bytes), 8);
  EXPECT_EQ(CountP2P(r1, OpKind::kSend, 0, -1, bytes), 4);  // the wrap-around, chunk 0 -> 1
  EXPECT_EQ(CountP2P(r0, OpKind::kRecv, 0, +1, bytes), 4);
  EXPECT_EQ(CountP2P(r1, OpKind::kSend, 1, -1, bytes), 8);
  EXPECT_EQ(CountP2P(r0, OpKind::kRecv, 1, +1, bytes), 8);
  EXPECT_EQ(CountP2P(r0, OpKind::kSend, 1, +1, bytes), 4);
  EXPECT_EQ(CountP2P(r1, OpKind::kRecv, 1, -1, bytes), 4);
  size_t ops = 0, plain_ops = 0;
  std::multiset<std::string> compute, plain_compute;
  for (const Graph& g : p.graphs) {
    ops += g.ops.size();
    for (const Op& op : g.ops)
      if (!op.IsComm()) compute.insert(op.name);
  }
  for (const Graph& g : plain.graphs) {
    plain_ops += g.ops.size();
    for (const Op& op : g.ops)
      if (!op.IsComm()) plain_compute.insert(op.name);
  }
  EXPECT_EQ(compute, plain_compute);
  EXPECT_EQ(ops, plain_ops + 32);
  // The wrap-around recv on rank 0 feeds chunk 1 (layer 2).
  bool found = false;
  for (const Op& op : r0.ops) found |= op.name == "pp.chunk1.fwd.recv.mb0" && op.peer.offset == 1;
  EXPECT_TRUE(found);
}

// pp=4, v=2, m=8 (8 layers): per rank pair the two ends list their sends
// and recvs in the same order (tag.micro-batch), both for neighbours and
// for the wrap-around pair (rank 3 -> rank 0, offset -3 / +3).
TEST(Interleaved, BothEndsOfEveryPairListMessagesInTheSameOrder) {
  for (const char* plan : {"pp=4,vstages=2,microbatches=8", "pp=4,vstages=2,microbatches=4",
                           "pp=2,vstages=4,microbatches=6", "pp=4,vstages=2,microbatches=12"}) {
    const Program p = Lower(Deep("llama-tiny", 8), plan);
    const int pp = static_cast<int>(p.graphs.size());
    for (int a = 0; a < pp; ++a)
      for (int b = a + 1; b < pp; ++b)
        EXPECT_EQ(PairOrder(p, a, b, false), PairOrder(p, b, a, true)) << plan << " " << a << "-" << b;
    EXPECT_FALSE(PairOrder(p, pp - 1, 0, false).empty()) << plan;  // the wrap-around exists
  }
}

struct PlanCase {
  ModelConfig model;
  const char* plan;
};

std::vector<PlanCase> Cases() {
  return {
      {Deep("gpt-tiny", 4), "pp=2,vstages=2,microbatches=2"},
      {Deep("gpt-tiny", 4), "pp=2,vstages=2,microbatches=4"},
      {Deep("llama-tiny", 8), "pp=4,vstages=2,microbatches=8"},
      {Deep("llama-tiny", 8), "pp=2,vstages=4,microbatches=6"},
      {Deep("llama-tiny", 4), "pp=2,vstages=2,tp=2,dp=2,sp,microbatches=4"},
      {Deep("gpt-tiny", 4), "pp=2,vstages=2,dp=2,zero=1,microbatches=2"},
      {Deep("gpt-tiny", 4), "pp=2,vstages=2,dp=2,tp=2,zero=3,microbatches=4"},
      {Deep("gpt-tiny", 8), "pp=4,vstages=2,dp=2,microbatches=4,order=pp-tp-dp"},
      {Deep("mixtral-tiny", 4), "pp=2,vstages=2,dp=2,ep=2,microbatches=2"},
  };
}

// Every case verifies and simulates under fifo (program order on every
// stream, sends and recvs as rendezvous) without deadlock, with one
// representative per role and with every rank.
TEST(Interleaved, VerifiesAndSimulatesWithoutDeadlock) {
  AnalyticCostModel cost(LoadCluster("a800-4x8").value());
  for (const PlanCase& c : Cases()) {
    const Program p = Lower(c.model, c.plan);
    std::vector<std::string> errors = VerifyProgram(p);
    EXPECT_TRUE(errors.empty()) << c.plan << ": " << errors.front();
    Result<ScheduledProgram> sp = RunBaseline("fifo", p, cost);
    ASSERT_TRUE(sp.ok()) << c.plan << ": " << sp.status().message();
    for (bool all_ranks : {false, true}) {
      SimOptions options;
      options.all_ranks = all_ranks;
      Result<Timeline> t = Simulate(*sp, cost, options);
      ASSERT_TRUE(t.ok()) << c.model.name << " " << c.plan << ": " << t.status().message();
    }
  }
}

// The bubble: with communication made free (links of 1e6 GB/s, no latency,
// no interference), the step is compute plus pipeline bubble, and the
// bubble of 1F1B, (pp-1)/m of the ideal time, drops to (pp-1)/(m v) with v
// chunks. gpt-tiny with 16 layers, pp=4, m=8: v=2 beats v=1 and v=4 beats v=2.
TEST(Interleaved, BubbleShrinksWhenCommunicationIsFree) {
  ClusterSpec cluster = LoadCluster("a800-4x8").value();
  cluster.intra_node = {1e6, 0};
  cluster.inter_node = {1e6, 0};
  cluster.interference = 0;
  AnalyticCostModel cost(cluster);
  double makespan_us[3] = {0, 0, 0};
  const char* plans[3] = {"pp=4,microbatches=8", "pp=4,vstages=2,microbatches=8",
                          "pp=4,vstages=4,microbatches=8"};
  for (int i = 0; i < 3; ++i) {
    Result<ScheduledProgram> sp = RunBaseline("fifo", Lower(Deep("gpt-tiny", 16), plans[i]), cost);
    ASSERT_TRUE(sp.ok()) << sp.status().message();
    Result<Timeline> t = Simulate(*sp, cost);
    ASSERT_TRUE(t.ok()) << t.status().message();
    makespan_us[i] = t->makespan_us;
    std::printf("gpt-tiny-16l %-32s fifo, free links: %9.1f us\n", plans[i], makespan_us[i]);
  }
  EXPECT_LT(makespan_us[1], makespan_us[0]);
  EXPECT_LT(makespan_us[2], makespan_us[1]);
}

// Real runs (fp32 CPU kernels, threads as ranks, fifo order) reproduce the
// unsharded model on the same micro-batches: loss, every gradient, every
// updated parameter, including gpt's tied table summed across ranks 0 and 1.
TEST(Interleaved, MatchesTheUnshardedRun) {
  struct RunCase {
    ModelConfig model;
    const char* plan;
    int dp;
    int microbatches;
  };
  const RunCase cases[] = {{Deep("gpt-tiny", 4), "pp=2,vstages=2,microbatches=4", 1, 4},
                           {Deep("llama-tiny", 4), "pp=2,vstages=2,tp=2,dp=2,microbatches=2", 2, 2}};
  AnalyticCostModel cost(LoadCluster("a800-4x8").value());
  for (const RunCase& c : cases) {
    const Program p = Lower(c.model, c.plan);
    ModelConfig ref_model = c.model;
    ref_model.batch = c.model.batch * c.dp;
    const Program ref = Lower(ref_model, "microbatches=" + std::to_string(c.microbatches));
    RunOptions options;
    const int64_t d = c.model.hidden / c.model.heads;
    options.init.layouts = {FusedQkvLayout(c.model.hidden, int64_t{c.model.kv_heads} * d)};
    Result<ScheduledProgram> ref_sp = RunBaseline("fifo", ref, cost);
    Result<ScheduledProgram> sp = RunBaseline("fifo", p, cost);
    ASSERT_TRUE(ref_sp.ok() && sp.ok());
    Result<ExecutionResult> ref_run = RunInProcess(*ref_sp, options);
    ASSERT_TRUE(ref_run.ok()) << ref_run.status().message();
    Result<ExecutionResult> run = RunInProcess(*sp, options);
    ASSERT_TRUE(run.ok()) << c.plan << ": " << run.status().message();
    Result<ReferenceReport> report =
        CompareToReference(*ref_sp, *ref_run, *sp, *run, Tolerance{}, options.init.layouts);
    ASSERT_TRUE(report.ok()) << c.plan << ": " << report.status().message();
    std::printf("%s %s: %s\n", c.model.name.c_str(), c.plan, report->Summary().c_str());
  }
}

}  // namespace
}  // namespace concerto
