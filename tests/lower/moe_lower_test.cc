// Mixture of experts and expert parallelism (ep) in the decoder frontend,
// checked against closed-form arithmetic: the presets and spec files, the
// all-to-alls per MoE layer and their bytes, expert parameter memory per
// rank, gradient-sync groups, router and expert flops, tp composition, and
// every rejected plan or model field with its message.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "concerto/ir/verifier.h"
#include "concerto/lower/frontend.h"
#include "concerto/lower/plan.h"
#include "concerto/lower/transformer.h"

namespace concerto {
namespace {

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

using Axes = std::vector<std::string>;

ModelConfig MoePreset(const std::string& name) {
  Result<ModelConfig> m = ModelPreset(name);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? *m : ModelConfig{};
}

/// LowerTransformer that must succeed and verify.
Program Lower(const std::string& model, const std::string& plan) {
  Result<ParallelPlan> p = ParsePlan(plan);
  EXPECT_TRUE(p.ok()) << p.status().message();
  Result<Program> program = LowerTransformer(MoePreset(model), p.ok() ? *p : ParallelPlan{});
  EXPECT_TRUE(program.ok()) << model << " " << plan << ": " << program.status().message();
  if (!program.ok()) return Program{};
  for (const std::string& v : VerifyProgram(*program)) ADD_FAILURE() << plan << ": " << v;
  return *program;
}

/// The message LowerTransformer rejects (model, plan) with.
std::string LoweringRejection(const ModelConfig& model, const std::string& plan) {
  Result<ParallelPlan> p = ParsePlan(plan);
  EXPECT_TRUE(p.ok()) << p.status().message();
  Result<Program> program = LowerTransformer(model, p.ok() ? *p : ParallelPlan{});
  EXPECT_FALSE(program.ok()) << plan;
  return program.ok() ? "" : program.status().message();
}

/// The message a model spec is rejected with.
std::string SpecRejection(const std::string& text) {
  Result<ModelConfig> m = ParseModelSpec(text, "m.yaml", "m");
  EXPECT_FALSE(m.ok()) << text;
  return m.ok() ? "" : m.status().message();
}

/// Collectives of `type` in `layer` and `phase` (any group).
std::vector<const Op*> Collectives(const Graph& g, int layer, Phase phase, CollectiveType type) {
  std::vector<const Op*> out;
  for (const Op& op : g.ops)
    if (op.kind == OpKind::kCollective && op.tags.layer == layer && op.tags.phase == phase &&
        op.collective == type)
      out.push_back(&op);
  return out;
}

/// The op called `name` (must exist).
const Op& FindOp(const Graph& g, const std::string& name) {
  for (const Op& op : g.ops)
    if (op.name == name) return op;
  ADD_FAILURE() << "no op " << name;
  static const Op none;
  return none;
}

/// The tensor called `name` (must exist).
const Tensor& FindTensor(const Graph& g, const std::string& name) {
  for (const Tensor& t : g.tensors)
    if (t.name == name) return t;
  ADD_FAILURE() << "no tensor " << name;
  static const Tensor none;
  return none;
}

/// Bytes of the parameters this rank stores (what its Adam ops update).
int64_t ParameterBytes(const Graph& g, const std::string& name_part = "") {
  int64_t bytes = 0;
  for (const Op& op : g.ops)
    if (op.kind == OpKind::kCompute && op.compute_type == ComputeType::kAdam &&
        op.name.find(name_part) != std::string::npos)
      bytes += FindTensor(g, op.inputs[0]).Bytes();
  return bytes;
}

/// Sum of the flops of compute ops whose name starts with `prefix` in `phase`.
double Flops(const Graph& g, const std::string& prefix, Phase phase, ComputeType type) {
  double total = 0;
  for (const Op& op : g.ops)
    if (op.kind == OpKind::kCompute && op.tags.phase == phase && op.compute_type == type &&
        op.name.rfind(prefix, 0) == 0)
      total += op.flops;
  return total;
}

// ---- models -------------------------------------------------------------------

TEST(MoeModels, PresetsAndParameterCounts) {
  const std::vector<std::string> names = AllModelPresetNames();
  for (const char* want : {"mixtral-tiny", "mixtral-8x7b"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  const ModelConfig m = MoePreset("mixtral-8x7b");
  EXPECT_TRUE(IsMoe(m));
  EXPECT_EQ(m.experts, 8);
  EXPECT_EQ(m.top_k, 2);
  EXPECT_EQ(m.kv_heads, 8);
  // Per layer: attention 2 h^2 + 2 h (8 x 128) = 33,554,432 + 8,388,608 =
  // 41,943,040; experts 8 x 3 x 4096 x 14336 = 1,409,286,144; router 4096 x 8
  // = 32,768; norms 2 x 4096 = 8,192: 1,451,270,144. x 32 layers =
  // 46,440,644,608, + embedding and head 2 x 32000 x 4096 = 262,144,000 +
  // final norm 4096 = 46,702,792,704 (Mixtral 8x7B: 46.7B).
  EXPECT_EQ(ModelParameterCount(m), 46702792704);
  // Capacity per sequence: ceil(1.25 x 4096 x 2 / 8) = 1280.
  EXPECT_EQ(MoeCapacity(m), 1280);
  // mixtral-tiny: attention 2 x 256^2 + 2 x 256 x 64 = 163,840; experts 4 x 3
  // x 256^2 = 786,432; router 1,024; norms 512: 951,808 per layer; x 2 +
  // 2 x 512 x 256 + 256 = 2,166,016. Capacity ceil(1.0 x 64 x 2 / 4) = 32.
  const ModelConfig tiny = MoePreset("mixtral-tiny");
  EXPECT_EQ(ModelParameterCount(tiny), 2166016);
  EXPECT_EQ(MoeCapacity(tiny), 32);
  EXPECT_EQ(MoeCapacity(MoePreset("llama-tiny")), 0);
}

TEST(MoeModels, SpecFilesMatchThePresets) {
  for (const std::string name : {"mixtral-tiny", "mixtral-8x7b"}) {
    Result<ModelConfig> file =
        LoadModelFile(std::string(CONCERTO_SOURCE_DIR) + "/examples/models/" + name + ".yaml");
    ASSERT_TRUE(file.ok()) << file.status().message();
    const ModelConfig preset = MoePreset(name);
    EXPECT_EQ(file->experts, preset.experts);
    EXPECT_EQ(file->top_k, preset.top_k);
    EXPECT_EQ(file->capacity_factor, preset.capacity_factor);
    EXPECT_EQ(file->ffn_hidden, preset.ffn_hidden);
    EXPECT_EQ(file->kv_heads, preset.kv_heads);
    EXPECT_EQ(ModelParameterCount(*file), ModelParameterCount(preset));
  }
  // top_k and capacity_factor default to 2 and 1.0.
  Result<ModelConfig> m = ParseModelSpec(
      "family: llama\nlayers: 1\nhidden: 8\nheads: 2\nffn_hidden: 8\nseq: 4\nvocab: 16\nexperts: 4\n",
      "m.yaml", "m");
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->top_k, 2);
  EXPECT_EQ(m->capacity_factor, 1.0);
}

TEST(MoeModels, BadFieldsAreRejectedNamingThem) {
  const std::string base = "family: llama\nlayers: 1\nhidden: 8\nheads: 2\nffn_hidden: 8\nseq: 4\nvocab: 16\n";
  EXPECT_HAS(SpecRejection(base + "experts: 4\ntop_k: 5\n"),
             "m.yaml: model 'm': top_k (5) must be in [1, experts (4)]");
  EXPECT_HAS(SpecRejection(base + "experts: 4\ncapacity_factor: 0\n"),
             "m.yaml: field 'capacity_factor': must be a number > 0, got '0'");
  EXPECT_HAS(SpecRejection(base + "experts: 4\ncapacity_factor: -1.5\n"),
             "field 'capacity_factor': must be a number > 0, got '-1.5'");
  EXPECT_HAS(SpecRejection(base + "experts: 4\ncapacity_factor: lots\n"),
             "field 'capacity_factor': must be a number > 0, got 'lots'");
  // 1e300 would overflow the slot count (it was cast to an integer: undefined behaviour).
  EXPECT_HAS(SpecRejection(base + "experts: 4\ncapacity_factor: 1e300\n"),
             "capacity_factor must be at most experts (4)");
  EXPECT_HAS(SpecRejection(base + "experts: 0\n"), "field 'experts': must be a positive integer");
  EXPECT_HAS(SpecRejection(base + "top_k: 2\n"), "field 'top_k': needs 'experts'");
  EXPECT_HAS(SpecRejection("family: gpt\nlayers: 1\nhidden: 8\nheads: 2\nseq: 4\nvocab: 16\nexperts: 2\n"),
             "experts need family llama");
}

// ---- plans ---------------------------------------------------------------------

TEST(MoePlans, ImpossiblePlansSayWhichConstraintFailed) {
  const ModelConfig tiny = MoePreset("mixtral-tiny");  // 4 experts
  EXPECT_HAS(LoweringRejection(tiny, "dp=3,ep=3"), "ep (3) must divide experts (4)");
  EXPECT_HAS(LoweringRejection(tiny, "dp=2,ep=4"),
             "ep (4) must divide dp (2): the expert-parallel group is carved out of the "
             "data-parallel ranks");
  EXPECT_HAS(LoweringRejection(MoePreset("llama-tiny"), "dp=2,ep=2"),
             "'llama-tiny' is a dense llama decoder with no experts");
  EXPECT_HAS(LoweringRejection(tiny, "dp=2,ep=2,zero=1"), "zero=1 with ep > 1 is not supported");
  EXPECT_HAS(LoweringRejection(tiny, "tp=2,sp"), "sp (sequence parallelism) is not supported with a "
                                         "mixture-of-experts model");
  EXPECT_HAS(LoweringRejection(tiny, "dp=8,zero=2"), "must divide experts (4)");
  Status world = ValidatePlan(tiny, ParsePlan("dp=4,ep=2,tp=2").value(), 4);
  EXPECT_HAS(world.message(), "dp x tp x pp (8) must equal the world size (4)");
}

TEST(MoePlans, EveryCompositionVerifies) {
  // dp, ep, tp, pp and ZeRO (without ep) on the tiny model; the mesh splits
  // dp into {dp: dp/ep, ep}.
  for (const std::string plan :
       {"dp=1", "dp=2", "dp=2,ep=2", "dp=4,ep=2", "dp=4,ep=4", "dp=2,ep=2,tp=2", "tp=2",
        "dp=2,ep=2,microbatches=2", "pp=2,dp=2,ep=2,microbatches=2", "pp=2,tp=2,microbatches=2",
        "dp=2,zero=1", "dp=2,zero=2", "dp=2,zero=3", "dp=2,tp=2,zero=3"}) {
    SCOPED_TRACE(plan);
    Program p = Lower("mixtral-tiny", plan);
    const ParallelPlan pl = ParsePlan(plan).value();
    EXPECT_EQ(p.mesh.NumRanks(), pl.dp * pl.tp * pl.pp);
    if (pl.ep > 1) {
      EXPECT_EQ(p.mesh.axes[p.mesh.AxisIndex("dp")].size, pl.dp / pl.ep);
      EXPECT_EQ(p.mesh.axes[p.mesh.AxisIndex("ep")].size, pl.ep);
    } else {
      EXPECT_EQ(p.mesh.AxisIndex("ep"), -1);
    }
  }
}

// ---- arithmetic ------------------------------------------------------------------

TEST(MoeArithmetic, TwoAllToAllsForwardAndTwoBackwardPerMoeLayer) {
  // mixtral-tiny, dp=2, ep=2: B = 2 sequences per rank, C = 32 slots per
  // expert and sequence, E = 4, h = 256, bf16. Each all-to-all moves this
  // rank's expert buffers [E, B*C, h]: 4 x (2 x 32) x 256 x 2 bytes = 131,072.
  const Program p = Lower("mixtral-tiny", "dp=2,ep=2");
  const Graph& g = p.graphs[0];
  const int64_t bytes = 4 * (2 * 32) * 256 * 2;
  EXPECT_EQ(bytes, 131072);
  for (int layer = 0; layer < 2; ++layer)
    for (Phase phase : {Phase::kForward, Phase::kBackward}) {
      std::vector<const Op*> a2a = Collectives(g, layer, phase, CollectiveType::kAllToAll);
      ASSERT_EQ(a2a.size(), 2u) << "layer " << layer;
      for (const Op* op : a2a) {
        EXPECT_EQ(op->group.axes, Axes{"ep"}) << op->name;
        EXPECT_EQ(op->message_bytes, bytes) << op->name;
        EXPECT_EQ(op->tags.purpose, "activation") << op->name;
      }
    }
  const std::string l0 = "L0.moe.";
  EXPECT_EQ(Collectives(g, 0, Phase::kForward, CollectiveType::kAllToAll)[0]->name, l0 + "dispatch.a2a");
  EXPECT_EQ(Collectives(g, 0, Phase::kForward, CollectiveType::kAllToAll)[1]->name, l0 + "combine.a2a");
  EXPECT_EQ(Collectives(g, 0, Phase::kBackward, CollectiveType::kAllToAll)[0]->name, l0 + "combine.grad.a2a");
  EXPECT_EQ(Collectives(g, 0, Phase::kBackward, CollectiveType::kAllToAll)[1]->name, l0 + "dispatch.grad.a2a");
  // Without ep there is nothing to exchange: no all-to-all at all.
  const Program dp_only = Lower("mixtral-tiny", "dp=2");
  for (const Op& op : dp_only.graphs[0].ops)
    EXPECT_FALSE(op.kind == OpKind::kCollective && op.collective == CollectiveType::kAllToAll);
  // Under tp the tokens are replicated over tp: the same all-to-alls per tp
  // rank, plus the experts' own tp all-reduces (below).
  const Program tp = Lower("mixtral-tiny", "dp=2,ep=2,tp=2");
  EXPECT_EQ(Collectives(tp.graphs[0], 1, Phase::kForward, CollectiveType::kAllToAll)[0]->message_bytes, bytes);
}

TEST(MoeArithmetic, ExpertParametersAreShardedOverEp) {
  // Expert weights per layer: gate and up [E/ep, h, f/tp], down [E/ep, f/tp, h].
  // ep=2: 3 x 2 x 256 x 256 x 2 bytes = 786,432 per layer, 1,572,864 for the
  // 2 layers; ep=1: twice that; ep=2, tp=2: half again.
  const Program ep2 = Lower("mixtral-tiny", "dp=2,ep=2");
  const Program ep1 = Lower("mixtral-tiny", "dp=2");
  const Program ep2tp2 = Lower("mixtral-tiny", "dp=2,ep=2,tp=2");
  EXPECT_EQ(ParameterBytes(ep2.graphs[0], ".moe.experts."), 1572864);
  EXPECT_EQ(ParameterBytes(ep1.graphs[0], ".moe.experts."), 2 * 1572864);
  EXPECT_EQ(ParameterBytes(ep2tp2.graphs[0], ".moe.experts."), 1572864 / 2);
  const Tensor& w = FindTensor(ep2.graphs[0], "L1.moe.experts.down.w");
  EXPECT_EQ(w.shape, (std::vector<int64_t>{2, 256, 256}));
  // Rows of down (its input width f) split over tp (a mesh axis of size 1 here).
  EXPECT_EQ(w.sharding, (std::vector<Axes>{{"ep"}, {"tp"}, {}}));
  EXPECT_EQ(FindTensor(ep2tp2.graphs[0], "L1.moe.experts.gate.w").shape,
            (std::vector<int64_t>{2, 256, 128}));
  EXPECT_EQ(FindTensor(ep2tp2.graphs[0], "L1.moe.experts.gate.w").sharding,
            (std::vector<Axes>{{"ep"}, {}, {"tp"}}));
  // Parameter memory per rank: all 2,166,016 parameters but the half of the
  // 2 x 786,432 expert parameters held by the other ep rank: 1,379,584 x 2 bytes.
  EXPECT_EQ(ParameterBytes(ep2.graphs[0]), (2166016 - 786432) * 2);
  EXPECT_EQ(ParameterBytes(ep1.graphs[0]), 2166016 * 2);
}

TEST(MoeArithmetic, GradientsSyncOverTheReplicasThatHoldThem) {
  // dp=4, ep=2: mesh {dp: 2, ep: 2}. A replicated parameter is held by all
  // 4 data ranks (all-reduce over {dp, ep}); an expert by the 2 ranks that
  // differ only along dp (all-reduce over {dp}).
  const Program p = Lower("mixtral-tiny", "dp=4,ep=2");
  const Graph& g = p.graphs[0];
  const Op& expert = FindOp(g, "L0.moe.experts.gate.w.grad.ar");
  EXPECT_EQ(expert.group.axes, Axes{"dp"});
  EXPECT_EQ(expert.message_bytes, 2 * 256 * 256 * 2);
  EXPECT_EQ(FindOp(g, "L0.moe.router.w.grad.ar").group.axes, (Axes{"dp", "ep"}));
  EXPECT_EQ(FindOp(g, "head.w.grad.ar").group.axes, (Axes{"dp", "ep"}));
  // dp=2, ep=2: every expert lives on one data rank: no expert gradient sync.
  const Program q = Lower("mixtral-tiny", "dp=2,ep=2");
  int expert_syncs = 0, syncs = 0;
  for (const Op& op : q.graphs[0].ops) {
    if (op.kind != OpKind::kCollective || op.tags.purpose != "grad_sync") continue;
    ++syncs;
    expert_syncs += op.name.find(".experts.") != std::string::npos;
  }
  EXPECT_EQ(expert_syncs, 0);
  // 2 layers x (q, k, v, o, router, 2 norms) + embedding, final norm, head = 17.
  EXPECT_EQ(syncs, 17);
}

TEST(MoeArithmetic, RouterAndExpertFlops) {
  // mixtral-tiny on one data rank: B s = 2 x 64 = 128 tokens, h = f = 256,
  // E = 4, k = 2, C = 32, so E C = 128 = s k: the experts compute exactly
  // tokens x k rows. Router: 2 x 128 x 256 x 4 = 262,144. Experts (gate, up,
  // down): 2 x tokens x k x 3 h f = 2 x 128 x 2 x 196,608 = 100,663,296.
  for (const std::string plan : {"dp=2", "dp=2,ep=2", "dp=4,ep=4"}) {
    SCOPED_TRACE(plan);
    const Program p = Lower("mixtral-tiny", plan);
    const Graph& g = p.graphs[0];
    EXPECT_EQ(Flops(g, "L0.moe.router", Phase::kForward, ComputeType::kMatmul), 262144);
    EXPECT_EQ(Flops(g, "L0.moe.experts.", Phase::kForward, ComputeType::kMatmul), 100663296);
    // Backward: dX and dW of each of the three: twice the forward.
    EXPECT_EQ(Flops(g, "L0.moe.experts.", Phase::kBackward, ComputeType::kMatmul), 2 * 100663296);
    EXPECT_EQ(Flops(g, "L0.moe.router", Phase::kBackward, ComputeType::kMatmul), 2 * 262144);
  }
  // tp=2 splits the expert width f: half the expert flops per rank.
  const Program tp_program = Lower("mixtral-tiny", "dp=2,ep=2,tp=2");
  const Graph& tp = tp_program.graphs[0];
  EXPECT_EQ(Flops(tp, "L1.moe.experts.", Phase::kForward, ComputeType::kMatmul), 100663296 / 2);
}

TEST(MoeArithmetic, TensorParallelExpertsAllReduceOncePerDirection) {
  // With tp the experts are Megatron MLPs (gate/up column-, down row-
  // parallel): one forward all-reduce of the down projection's partial
  // [E/ep, ep B C, h] (2 x 128 x 256 x 2 = 131,072 bytes) and one backward of
  // the summed gate/up input grads; the attention keeps its own two.
  const Program p = Lower("mixtral-tiny", "dp=2,ep=2,tp=2");
  const Graph& g = p.graphs[0];
  std::vector<std::string> fwd, bwd;
  for (const Op* op : Collectives(g, 0, Phase::kForward, CollectiveType::kAllReduce)) fwd.push_back(op->name);
  for (const Op* op : Collectives(g, 0, Phase::kBackward, CollectiveType::kAllReduce))
    if (op->tags.purpose == "activation") bwd.push_back(op->name);
  EXPECT_EQ(fwd, (std::vector<std::string>{"L0.attn.o.ar", "L0.moe.experts.down.ar"}));
  EXPECT_EQ(bwd, (std::vector<std::string>{"L0.moe.experts.gate_up.dX.ar", "L0.attn.qkv.dX.ar"}));
  EXPECT_EQ(FindOp(g, "L0.moe.experts.down.ar").message_bytes, 2 * 128 * 256 * 2);
  EXPECT_EQ(FindOp(g, "L0.moe.experts.down.ar").group.axes, Axes{"tp"});
}

TEST(MoeArithmetic, RoutingOpsAndTheirShapes) {
  // The MoE layer's vocabulary, forward and backward, with ep=2.
  const Program p = Lower("mixtral-tiny", "dp=2,ep=2");
  const Graph& g = p.graphs[0];
  std::set<ComputeType> types;
  for (const Op& op : g.ops)
    if (op.kind == OpKind::kCompute && op.tags.layer == 0) types.insert(op.compute_type);
  for (ComputeType t : {ComputeType::kTopK, ComputeType::kTopKGrad, ComputeType::kMoeDispatch,
                        ComputeType::kMoeDispatchGrad, ComputeType::kMoeCombine,
                        ComputeType::kMoeCombineGrad, ComputeType::kTranspose, ComputeType::kSoftmax,
                        ComputeType::kSoftmaxGrad})
    EXPECT_TRUE(types.count(t)) << ToString(t);
  EXPECT_EQ(FindOp(g, "L0.moe.top_k").attrs.at("k"), 2);
  // dispatch: [B, s, h] x ids [B, s, k] -> [E, B*C, h] = [4, 64, 256], the
  // slots sharded like the batch; after the all-to-all and the transpose the
  // 2 local experts' rows [2, ep x B*C, h] = [2, 128, 256].
  EXPECT_EQ(FindTensor(g, "L0.moe.dispatch.out").shape, (std::vector<int64_t>{4, 64, 256}));
  EXPECT_EQ(FindTensor(g, "L0.moe.dispatch.out").sharding, (std::vector<Axes>{{}, {"dp", "ep"}, {}}));
  EXPECT_EQ(FindTensor(g, "L0.moe.dispatch.rows").shape, (std::vector<int64_t>{2, 128, 256}));
  EXPECT_EQ(FindTensor(g, "L0.moe.top_k.ids").dtype, DType::kI32);
}

TEST(MoeCompare, Mixtral8x7bLowersOn32Gpus) {
  // The natural plan on a800-4x8: tp=8 inside a node, ep=4 across the 4
  // nodes (2 experts per rank), dp=4 (= ep: each expert on one data rank).
  const auto start = std::chrono::steady_clock::now();
  Result<Program> p = LowerModelPlan("mixtral-8x7b", "dp=4,ep=4,tp=8");
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->mesh.NumRanks(), 32);
  size_t ops = 0, a2a = 0;
  for (const Op& op : p->graphs[0].ops) {
    ++ops;
    a2a += op.kind == OpKind::kCollective && op.collective == CollectiveType::kAllToAll;
  }
  EXPECT_EQ(a2a, 32u * 4);  // 32 MoE layers x (2 forward + 2 backward)
  std::printf("  mixtral-8x7b dp=4,ep=4,tp=8: %zu ops, %zu all-to-alls, lowered in %.1f ms\n", ops,
              a2a, ms);
}

}  // namespace
}  // namespace concerto
