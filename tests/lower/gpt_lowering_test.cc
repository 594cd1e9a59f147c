// GPT lowering: structure, shapes, flops and collective volumes checked
// against the transformer arithmetic of REFERENCES.md.
#include "concerto/lower/gpt.h"
#include "concerto/ir/comm_streams.h"

#include <gtest/gtest.h>

#include "lowering_test_util.h"

#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "concerto/ir/json_io.h"
#include "concerto/ir/verifier.h"

namespace concerto {
namespace {

/// Preset by name (the test fails if it is missing).
GptConfig Preset(const std::string& name) {
  Result<GptConfig> c = GptPreset(name);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? *c : GptConfig{};
}

/// LowerGpt that must succeed.
Program Lower(const GptConfig& c, DpTpPlan plan) {
  Result<Program> p = LowerGpt(c, plan);
  EXPECT_TRUE(p.ok()) << p.status().message();
  return p.ok() ? *p : Program{};
}

const Graph& Main(const Program& p) { return p.graphs.at(0); }

using testing_util::IsMatmulOrAttention;
using testing_util::LayerAttentionFlops;
using testing_util::LayerFlops;

/// Collectives of `layer` in `phase` over group axes {axis}.
std::vector<const Op*> Collectives(const Graph& g, int layer, Phase phase,
                                   const std::string& axis) {
  std::vector<const Op*> out;
  for (const Op& op : g.ops)
    if (op.kind == OpKind::kCollective && op.tags.layer == layer && op.tags.phase == phase &&
        op.group.axes == std::vector<std::string>{axis})
      out.push_back(&op);
  return out;
}

/// Forward matmul+attention flops of one layer, REFERENCES.md:
/// QKV 6Bsh^2 + scores 2Bs^2h + AV 2Bs^2h + proj 2Bsh^2 + MLP 16Bsh^2, over tp.
double ExpectedForwardLayerFlops(const GptConfig& c, int tp) {
  const double b = c.batch, s = c.seq, h = c.hidden;
  return (24 * b * s * h * h + 4 * b * s * s * h) / tp;
}

const std::vector<DpTpPlan> kTinyPlans = {{1, 1}, {2, 1}, {1, 2}, {2, 2}, {1, 4}, {4, 4}};

TEST(GptLowering, PresetsLoadAndUnknownNameIsRejected) {
  for (const std::string& name : GptPresetNames()) {
    Result<GptConfig> c = GptPreset(name);
    ASSERT_TRUE(c.ok()) << name;
    EXPECT_EQ(c->name, name);
    EXPECT_TRUE(ValidateGpt(*c, {}).ok()) << name;
  }
  Result<GptConfig> bad = GptPreset("gpt-9000b");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("gpt-1.3b"), std::string::npos);  // lists known names
}

TEST(GptLowering, PassesVerifier) {
  for (const DpTpPlan& plan : kTinyPlans) {
    Program p = Lower(Preset("gpt-tiny"), plan);
    std::vector<std::string> errors = VerifyProgram(p);
    EXPECT_TRUE(errors.empty()) << "dp" << plan.dp << " tp" << plan.tp << ": "
                                << (errors.empty() ? "" : errors.front());
  }
  Program big = Lower(Preset("gpt-1.3b"), {4, 8});
  std::vector<std::string> errors = VerifyProgram(big);
  EXPECT_TRUE(errors.empty()) << (errors.empty() ? "" : errors.front());
}

// The text form keeps everything: write, parse (which verifies), write again.
TEST(GptLowering, JsonRoundTrip) {
  Program p = Lower(Preset("gpt-tiny"), {2, 2});
  const std::string text = WriteProgram(p);
  Result<Program> back = ParseProgram(text, "gpt-tiny.json");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(WriteProgram(*back), text);
}

TEST(GptLowering, MeshRolesAndStreams) {
  Program p = Lower(Preset("gpt-tiny"), {2, 4});
  ASSERT_EQ(p.mesh.axes.size(), 2u);
  EXPECT_EQ(p.mesh.axes[0].name, "dp");
  EXPECT_EQ(p.mesh.axes[0].size, 2);
  EXPECT_EQ(p.mesh.axes[1].name, "tp");  // last axis = fastest = inside a node
  EXPECT_EQ(p.mesh.axes[1].size, 4);
  ASSERT_EQ(p.graphs.size(), 1u);
  EXPECT_EQ(Main(p).name, "main");
  ASSERT_EQ(p.roles.size(), 1u);
  EXPECT_EQ(p.roles[0].name, "spmd");
  EXPECT_EQ(p.roles[0].ranks.size(), 8u);
  // Each communicator on its own stream, as NCCL runs it.
  for (const Op& op : Main(p).ops) EXPECT_EQ(op.stream, op.IsComm() ? CommunicatorStream(op) : "compute");
  EXPECT_EQ(Main(p).streams, (std::vector<std::string>{"compute", "comm.tp", "comm.dp"}));
}

// Ids are 0..n-1 in program order, names are unique, and every tensor an op
// reads is a graph input or was produced by an earlier op (exactly once).
TEST(GptLowering, IdsInProgramOrderAndDataflowForward) {
  Program p = Lower(Preset("gpt-tiny"), {2, 2});
  const Graph& g = Main(p);
  std::set<std::string> names, produced, declared;
  for (const Tensor& t : g.tensors) EXPECT_TRUE(declared.insert(t.name).second) << t.name;
  std::set<std::string> consumed_first;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    EXPECT_EQ(op.id, static_cast<int>(i));
    EXPECT_TRUE(names.insert(op.name).second) << "duplicate name " << op.name;
    EXPECT_EQ(op.tags.microbatch, 0) << op.name;
    for (const std::string& in : op.inputs) {
      EXPECT_TRUE(declared.count(in)) << op.name << " reads undeclared " << in;
      if (!produced.count(in)) consumed_first.insert(in);
    }
    for (const std::string& out : op.outputs) {
      EXPECT_TRUE(declared.count(out)) << op.name << " writes undeclared " << out;
      EXPECT_FALSE(consumed_first.count(out)) << out << " read before " << op.name;
      EXPECT_TRUE(produced.insert(out).second) << out << " produced twice";
    }
  }
}

// gpt-tiny: B=2, s=64, h=256 -> 24*2*64*256^2 + 4*2*64^2*256 = 201,326,592 + 8,388,608
// = 209,715,200 flops per layer at tp=1 (104,857,600 at tp=2).
// gpt-1.3b tp=8: B=8, s=2048, h=2048 -> (24*8*2048*2048^2 + 4*8*2048^2*2048)/8
// = (1,649,267,441,664 + 274,877,906,944)/8 = 240,518,168,576 flops per layer.
TEST(GptLowering, ForwardLayerFlopsMatchTransformerArithmetic) {
  const GptConfig tiny = Preset("gpt-tiny");
  EXPECT_EQ(ExpectedForwardLayerFlops(tiny, 1), 209715200.0);
  for (int tp : {1, 2, 4}) {
    Program p = Lower(tiny, {1, tp});
    for (int l = 0; l < tiny.layers; ++l)
      EXPECT_EQ(LayerFlops(Main(p), l, Phase::kForward), ExpectedForwardLayerFlops(tiny, tp))
          << "tp" << tp << " layer " << l;
  }
  const GptConfig big = Preset("gpt-1.3b");
  EXPECT_EQ(ExpectedForwardLayerFlops(big, 8), 240518168576.0);
  Program p = Lower(big, {4, 8});
  for (int l = 0; l < big.layers; ++l)
    EXPECT_EQ(LayerFlops(Main(p), l, Phase::kForward), 240518168576.0) << "layer " << l;
}

// Backward = dX + dW per matmul (2x) and attention_grad = 2.5x attention
// (FlashAttention's backward recomputes the scores: kAttentionGradFlops).
TEST(GptLowering, BackwardLayerFlopsAreTwiceForwardPlusTheRecomputedScores) {
  for (const char* name : {"gpt-tiny", "gpt-1.3b"}) {
    const GptConfig c = Preset(name);
    Program p = Lower(c, {2, c.layers > 2 ? 8 : 2});
    for (int l = 0; l < c.layers; ++l) {
      ASSERT_GT(LayerAttentionFlops(Main(p), l), 0) << name;
      EXPECT_EQ(LayerFlops(Main(p), l, Phase::kBackward),
                2 * LayerFlops(Main(p), l, Phase::kForward) + 0.5 * LayerAttentionFlops(Main(p), l))
          << name << " layer " << l;
    }
  }
}

// Megatron: per layer 2 forward (proj, fc2) and 2 backward (qkv dX, fc1 dX)
// all-reduces over tp of B*s*h bf16 values = 2*B*s*h bytes.
// gpt-1.3b: 2*8*2048*2048 = 67,108,864 bytes (64 MiB) each.
TEST(GptLowering, TwoForwardAndTwoBackwardTpAllReducesPerLayer) {
  for (const char* name : {"gpt-tiny", "gpt-1.3b"}) {
    const GptConfig c = Preset(name);
    Program p = Lower(c, {2, 4});
    const int64_t bytes = 2LL * c.batch * c.seq * c.hidden;
    for (int l = 0; l < c.layers; ++l) {
      for (Phase phase : {Phase::kForward, Phase::kBackward}) {
        std::vector<const Op*> ars = Collectives(Main(p), l, phase, "tp");
        ASSERT_EQ(ars.size(), 2u) << name << " layer " << l;
        for (const Op* op : ars) {
          EXPECT_EQ(op->collective, CollectiveType::kAllReduce);
          EXPECT_EQ(op->message_bytes, bytes) << op->name;
          EXPECT_EQ(op->tags.purpose, "activation");
        }
      }
    }
  }
  EXPECT_EQ(2LL * 8 * 2048 * 2048, 67108864LL);
}

TEST(GptLowering, NoTpCollectivesWithoutTpAndNoDpWithoutDp) {
  Program p = Lower(Preset("gpt-tiny"), {1, 1});
  for (const Op& op : Main(p).ops) EXPECT_FALSE(op.IsComm()) << op.name;
  Program tp_only = Lower(Preset("gpt-tiny"), {1, 2});
  for (const Op& op : Main(tp_only).ops) {
    if (op.IsComm()) {
      EXPECT_EQ(op.group.axes, std::vector<std::string>{"tp"}) << op.name;
    }
  }
}

// Parameters by hand: per layer qkv 3h^2 + proj h^2 + fc1 4h^2 + fc2 4h^2 = 12h^2,
// plus two LayerNorms 4h; plus word embedding V*h (tied with the LM head),
// positions s*h and the final LayerNorm 2h. No linear biases.
// gpt-1.3b: 24*(12*2048^2 + 4*2048) + 51200*2048 + 2048*2048 + 2*2048
//         = 1,208,156,160 + 104,857,600 + 4,194,304 + 4,096 = 1,317,212,160.
TEST(GptLowering, ParameterCountOfGpt13b) {
  const GptConfig c = Preset("gpt-1.3b");
  EXPECT_EQ(GptParameterCount(c), 1317212160LL);
  // The tp=1 program holds every parameter once: sum the adam ops' params.
  Program p = Lower(c, {1, 1});
  std::map<std::string, int64_t> elems;
  for (const Tensor& t : Main(p).tensors) elems[t.name] = t.NumElements();
  int64_t total = 0;
  for (const Op& op : Main(p).ops)
    if (op.compute_type == ComputeType::kAdam && op.kind == OpKind::kCompute)
      total += elems.at(op.inputs[0]);
  EXPECT_EQ(total, 1317212160LL);
}

// dp>1: one grad_sync all-reduce per parameter; bytes sum to 2 * (parameters
// held by one rank) = 2 * (sharded/tp + replicated). Sharded over tp: 12h^2
// per layer + V*h; replicated: 4h per layer + s*h + 2h.
// gpt-1.3b tp=8: 2 * ((24*12*2048^2 + 51200*2048)/8 + 24*4*2048 + 2048^2 + 2*2048)
//              = 2 * (164,102,144 + 196,608 + 4,194,304 + 4,096) = 336,994,304 bytes.
TEST(GptLowering, OneGradAllReducePerParameter) {
  for (const char* name : {"gpt-tiny", "gpt-1.3b"}) {
    const GptConfig c = Preset(name);
    const int tp = c.layers > 2 ? 8 : 2;
    Program p = Lower(c, {4, tp});
    const Graph& g = Main(p);
    std::map<std::string, int> producer;
    for (const Op& op : g.ops)
      for (const std::string& out : op.outputs) producer[out] = op.id;
    int adams = 0;
    int grad_syncs = 0;
    int64_t bytes = 0;
    for (const Op& op : g.ops) {
      if (op.kind == OpKind::kCollective && op.tags.purpose == "grad_sync") {
        ++grad_syncs;
        bytes += op.message_bytes;
        EXPECT_EQ(op.group.axes, std::vector<std::string>{"dp"});
        EXPECT_EQ(op.tags.phase, Phase::kBackward);
        // Emitted right after the op that produced the gradient (modulo other syncs).
        const Op& src = g.ops[producer.at(op.inputs[0])];
        for (int id = src.id + 1; id < op.id; ++id)
          EXPECT_EQ(g.ops[id].tags.purpose, "grad_sync") << op.name;
      }
      if (op.kind == OpKind::kCompute && op.compute_type == ComputeType::kAdam) {
        ++adams;
        EXPECT_EQ(op.tags.phase, Phase::kOptimizer);
        const Op& grad_src = g.ops[producer.at(op.inputs[1])];
        EXPECT_EQ(grad_src.tags.purpose, "grad_sync") << op.name;
      }
    }
    const int64_t h = c.hidden;
    const int64_t sharded = c.layers * 12 * h * h + int64_t{c.vocab} * h;
    const int64_t replicated = c.layers * 4 * h + int64_t{c.seq} * h + 2 * h;
    // Per layer 4 weights + 2 LayerNorms x (gamma, beta); plus word and position
    // tables and the final LayerNorm's gamma and beta.
    EXPECT_EQ(adams, 8 * c.layers + 4) << name;
    EXPECT_EQ(grad_syncs, adams) << name;
    EXPECT_EQ(bytes, 2 * (sharded / tp + replicated)) << name;
    if (c.layers == 24) {
      EXPECT_EQ(bytes, 336994304LL);
    }
  }
}

TEST(GptLowering, ShardingAndPartialSpecs) {
  Program p = Lower(Preset("gpt-tiny"), {2, 2});
  std::map<std::string, const Tensor*> t;
  for (const Tensor& x : Main(p).tensors) t[x.name] = &x;
  const Tensor& qkv_w = *t.at("L0.attn.qkv.w");
  EXPECT_EQ(qkv_w.shape, (std::vector<int64_t>{256, 3 * 128}));
  EXPECT_EQ(qkv_w.sharding, (std::vector<std::vector<std::string>>{{}, {"tp"}}));
  const Tensor& proj_w = *t.at("L0.attn.proj.w");
  EXPECT_EQ(proj_w.shape, (std::vector<int64_t>{128, 256}));
  EXPECT_EQ(t.at("L0.attn.proj.out")->partial, std::vector<std::string>{"tp"});
  EXPECT_TRUE(t.at("L0.attn.proj.ar.out")->partial.empty());
  EXPECT_EQ(t.at("embed.word.table")->shape, (std::vector<int64_t>{256, 256}));
  EXPECT_EQ(t.at("head.logits")->shape, (std::vector<int64_t>{2, 64, 256}));
  EXPECT_EQ(t.at("L0.mlp.fc1.w.grad")->partial, std::vector<std::string>{"dp"});
  EXPECT_EQ(t.at("L0.mlp.fc1.w.adam_m")->dtype, DType::kF32);
}

TEST(GptLowering, AttentionAttrsArePerRank) {
  Program p = Lower(Preset("gpt-tiny"), {1, 2});
  int seen = 0;
  for (const Op& op : Main(p).ops) {
    if (op.compute_type != ComputeType::kAttention || op.kind != OpKind::kCompute) continue;
    ++seen;
    EXPECT_EQ(op.Attr("heads", 0), 2);
    EXPECT_EQ(op.Attr("kv_heads", 0), 2);
    EXPECT_EQ(op.Attr("causal", 0), 1);
  }
  EXPECT_EQ(seen, 2);
}

TEST(GptLowering, InvalidPlansAreRejectedNamingTheConstraint) {
  const GptConfig tiny = Preset("gpt-tiny");  // heads 4, vocab 512, hidden 256
  auto message = [&](GptConfig c, DpTpPlan plan) {
    Result<Program> p = LowerGpt(c, plan);
    EXPECT_FALSE(p.ok());
    return p.ok() ? std::string() : p.status().message();
  };
  EXPECT_NE(message(tiny, {1, 3}).find("must divide heads"), std::string::npos);
  EXPECT_NE(message(tiny, {1, 0}).find("tp must be positive"), std::string::npos);
  EXPECT_NE(message(tiny, {0, 1}).find("dp must be positive"), std::string::npos);
  GptConfig odd_vocab = tiny;
  odd_vocab.vocab = 510;
  EXPECT_NE(message(odd_vocab, {1, 4}).find("must divide vocab"), std::string::npos);
  GptConfig zero = tiny;
  zero.hidden = 0;
  EXPECT_NE(message(zero, {}).find("hidden must be positive"), std::string::npos);
  GptConfig neg = tiny;
  neg.batch = -1;
  EXPECT_NE(message(neg, {}).find("batch must be positive"), std::string::npos);
  GptConfig bad_heads = tiny;
  bad_heads.heads = 3;
  EXPECT_NE(message(bad_heads, {}).find("heads (3) must divide hidden"), std::string::npos);
}

// Not an assertion: how long lowering the largest common plan takes.
TEST(GptLowering, TimeLoweringGpt13bDp4Tp8) {
  const GptConfig c = Preset("gpt-1.3b");
  auto start = std::chrono::steady_clock::now();
  Result<Program> p = LowerGpt(c, {4, 8});
  auto end = std::chrono::steady_clock::now();
  ASSERT_TRUE(p.ok());
  int comm = 0;
  for (const Op& op : Main(*p).ops) comm += op.IsComm();
  std::printf("gpt-1.3b dp4 tp8: %zu ops (%d collectives), %zu tensors, lowered in %.2f ms\n",
              Main(*p).ops.size(), comm, Main(*p).tensors.size(),
              std::chrono::duration<double, std::milli>(end - start).count());
}

}  // namespace
}  // namespace concerto
