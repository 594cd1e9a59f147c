// Transformer frontend: model presets and spec files, LLaMA (RMSNorm, SwiGLU,
// grouped-query attention), sequence parallelism and ZeRO 1/2/3, checked
// against closed-form arithmetic (REFERENCES.md, "Transformer arithmetic").
#include "concerto/lower/transformer.h"
#include "concerto/ir/comm_streams.h"

#include <gtest/gtest.h>

#include "lowering_test_util.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "concerto/ir/graph_index.h"
#include "concerto/ir/json_io.h"
#include "concerto/ir/verifier.h"
#include "concerto/lower/plan.h"

namespace concerto {
namespace {

using Sharding = std::vector<std::vector<std::string>>;
using Shape = std::vector<int64_t>;

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

ModelConfig Preset(const std::string& name) {
  Result<ModelConfig> m = ModelPreset(name);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? *m : ModelConfig{};
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

const Graph& Main(const Program& p) { return p.graphs.at(0); }

std::map<std::string, const Tensor*> Tensors(const Graph& g) {
  std::map<std::string, const Tensor*> t;
  for (const Tensor& x : g.tensors) t[x.name] = &x;
  return t;
}

using testing_util::IsMatmulOrAttention;
using testing_util::LayerAttentionFlops;
using testing_util::LayerFlops;

/// Collectives of `type` in `layer` and `phase` over group {axis} with `purpose`.
std::vector<const Op*> Collectives(const Graph& g, int layer, Phase phase, CollectiveType type,
                                   const std::string& axis, const std::string& purpose) {
  std::vector<const Op*> out;
  for (const Op& op : g.ops)
    if (op.kind == OpKind::kCollective && op.tags.layer == layer && op.tags.phase == phase &&
        op.collective == type && op.group.axes == std::vector<std::string>{axis} &&
        op.tags.purpose == purpose)
      out.push_back(&op);
  return out;
}

/// Every collective of `type` with `purpose`, any layer and phase.
std::vector<const Op*> AllCollectives(const Graph& g, CollectiveType type,
                                      const std::string& purpose) {
  std::vector<const Op*> out;
  for (const Op& op : g.ops)
    if (op.kind == OpKind::kCollective && op.collective == type && op.tags.purpose == purpose)
      out.push_back(&op);
  return out;
}

/// The Adam ops (one per parameter).
std::vector<const Op*> AdamOps(const Graph& g) {
  std::vector<const Op*> out;
  for (const Op& op : g.ops)
    if (op.kind == OpKind::kCompute && op.compute_type == ComputeType::kAdam) out.push_back(&op);
  return out;
}

/// The parameter an Adam op updates, without the ".shard" suffix.
std::string ParamOf(const Op& adam) {
  std::string name = adam.inputs[0];
  const std::string suffix = ".shard";
  if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
    name.resize(name.size() - suffix.size());
  return name;
}

int CountComm(const Graph& g) {
  int n = 0;
  for (const Op& op : g.ops) n += op.IsComm();
  return n;
}

std::string FirstError(const std::vector<std::string>& errors) {
  return errors.empty() ? "" : errors.front();
}

// ---- models -----------------------------------------------------------------

TEST(Models, PresetsLoadAndValidate) {
  const std::vector<std::string> names = ModelPresetNames();
  for (const char* want : {"gpt-tiny", "gpt-1.3b", "gpt-2.7b", "gpt-6.7b", "gpt-13b", "gpt-39b",
                           "llama-tiny", "llama-7b", "llama-70b"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  for (const std::string& name : names) {
    ModelConfig m = Preset(name);
    EXPECT_EQ(m.name, name);
    EXPECT_TRUE(ValidateModel(m).ok()) << name;
    EXPECT_GE(m.batch, 1);
    EXPECT_LE(m.batch, 8);
  }
  const ModelConfig l70 = Preset("llama-70b");
  EXPECT_EQ(l70.family, ModelFamily::kLlama);
  EXPECT_EQ(l70.layers, 80);
  EXPECT_EQ(l70.hidden, 8192);
  EXPECT_EQ(l70.heads, 64);
  EXPECT_EQ(l70.kv_heads, 8);
  EXPECT_EQ(l70.ffn_hidden, 28672);
  Result<ModelConfig> bad = ModelPreset("llama-9000b");
  ASSERT_FALSE(bad.ok());
  EXPECT_HAS(bad.status().message(), "llama-7b");  // lists the known names
}

TEST(Models, SpecFilesMatchThePresets) {
  for (const char* name : {"gpt-1.3b", "llama-7b"}) {
    const std::string path =
        std::string(CONCERTO_SOURCE_DIR) + "/examples/models/" + name + ".yaml";
    Result<ModelConfig> file = LoadModel(path);
    ASSERT_TRUE(file.ok()) << file.status().message();
    const ModelConfig preset = Preset(name);
    EXPECT_EQ(file->name, preset.name);
    EXPECT_EQ(file->family, preset.family);
    EXPECT_EQ(file->layers, preset.layers);
    EXPECT_EQ(file->hidden, preset.hidden);
    EXPECT_EQ(file->heads, preset.heads);
    EXPECT_EQ(file->kv_heads, preset.kv_heads);
    EXPECT_EQ(file->ffn_hidden, preset.ffn_hidden);
    EXPECT_EQ(file->seq, preset.seq);
    EXPECT_EQ(file->vocab, preset.vocab);
    EXPECT_EQ(file->batch, preset.batch);
    EXPECT_EQ(file->dtype, preset.dtype);
  }
  Result<ModelConfig> by_name = LoadModel("llama-70b");
  ASSERT_TRUE(by_name.ok());
  EXPECT_EQ(by_name->kv_heads, 8);
}

TEST(Models, SpecDefaultsAndJson) {
  Result<ModelConfig> m = ParseModelSpec(
      R"({"family": "gpt", "layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 128})",
      "tiny.json", "tiny");
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->name, "tiny");
  EXPECT_EQ(m->kv_heads, 4);
  EXPECT_EQ(m->ffn_hidden, 256);  // 4 * hidden
  EXPECT_EQ(m->batch, 1);
  EXPECT_EQ(m->dtype, DType::kBF16);
  Result<ModelConfig> l = ParseModelSpec(
      "family: llama\nlayers: 2\nhidden: 64\nheads: 4\nkv_heads: 2\nffn_hidden: 96\nseq: 16\n"
      "vocab: 128\ndtype: f32\n",
      "l.yaml", "l");
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_EQ(l->dtype, DType::kF32);
  EXPECT_EQ(l->kv_heads, 2);
  EXPECT_TRUE(LowerTransformer(*l, Plan("dp=2,tp=2,sp,zero=3")).ok());
}

// `attention: unfused` marks every attention op (forward, backward, a
// selective recomputation) fused = 0 for the cost model; the default (flash)
// writes no attribute, so existing programs are unchanged.
TEST(Models, UnfusedAttentionMarksTheAttentionOps) {
  const std::string base = "family: gpt\nlayers: 2\nhidden: 64\nheads: 4\nseq: 16\nvocab: 128\n";
  Result<ModelConfig> flash = ParseModelSpec(base, "f.yaml", "f");
  Result<ModelConfig> unfused = ParseModelSpec(base + "attention: unfused\n", "u.yaml", "u");
  ASSERT_TRUE(flash.ok() && unfused.ok());
  EXPECT_TRUE(flash->fused_attention);
  EXPECT_FALSE(unfused->fused_attention);
  auto attention_ops = [](const ModelConfig& m, double* fused_attr) {
    Result<Program> p = LowerTransformer(m, Plan("dp=1,tp=2,recompute=selective"));
    EXPECT_TRUE(p.ok()) << p.status().message();
    int n = 0;
    for (const Op& op : p->graphs[0].ops)
      if (op.compute_type == ComputeType::kAttention || op.compute_type == ComputeType::kAttentionGrad) {
        ++n;
        *fused_attr = op.Attr("fused", -1);
      }
    return n;
  };
  double attr = 0;
  EXPECT_EQ(attention_ops(*flash, &attr), 6);  // 2 layers: forward, recomputed forward, backward
  EXPECT_EQ(attr, -1);
  EXPECT_EQ(attention_ops(*unfused, &attr), 6);
  EXPECT_EQ(attr, 0);
  Result<ModelConfig> bad = ParseModelSpec(base + "attention: sparse\n", "b.yaml", "b");
  ASSERT_FALSE(bad.ok());
  EXPECT_HAS(bad.status().message(), "b.yaml: field 'attention': must be flash or unfused, got 'sparse'");
}

TEST(Models, SpecErrorsNameFileAndField) {
  auto error = [](const std::string& text) {
    Result<ModelConfig> m = ParseModelSpec(text, "m.yaml", "m");
    EXPECT_FALSE(m.ok()) << text;
    return m.ok() ? std::string() : m.status().message();
  };
  const std::string base = "family: gpt\nlayers: 2\nhidden: 64\nheads: 4\nseq: 16\nvocab: 128\n";
  EXPECT_HAS(error(base + "colour: red\n"), "m.yaml: field 'colour': unknown field");
  EXPECT_HAS(error(base + "batch: two\n"), "m.yaml: field 'batch': must be a positive integer");
  EXPECT_HAS(error(base + "batch: 0\n"), "field 'batch': must be a positive integer");
  EXPECT_HAS(error(base + "batch: \"4\"\n"), "field 'batch'");  // a string, not a number
  EXPECT_HAS(error(base + "dtype: i32\n"), "field 'dtype': must be bf16, f16 or f32");
  EXPECT_HAS(error("layers: 2\nhidden: 64\nheads: 4\nseq: 16\nvocab: 128\n"),
             "field 'family': missing");
  EXPECT_HAS(error("family: bert\n"), "field 'family': must be gpt or llama (vision models: vit, wide-resnet), got 'bert'");
  EXPECT_HAS(error("family: llama\nlayers: 2\nhidden: 64\nheads: 4\nseq: 16\nvocab: 128\n"),
             "field 'ffn_hidden': missing (required for family llama)");
  EXPECT_HAS(error(base + "kv_heads: 3\n"), "m.yaml: model 'm': kv_heads (3) must divide heads (4)");
  EXPECT_HAS(error("family: gpt\nlayers: [1, 2\n"), "m.yaml: line");
  EXPECT_HAS(error("- 1\n- 2\n"), "top level must be a map");
  Result<ModelConfig> missing = LoadModel("no-such-model");
  ASSERT_FALSE(missing.ok());
  EXPECT_HAS(missing.status().message(), "not a preset (gpt-tiny,");
  Result<ModelConfig> unreadable = LoadModelFile("/nonexistent/model.yaml");
  ASSERT_FALSE(unreadable.ok());
  EXPECT_HAS(unreadable.status().message(), "/nonexistent/model.yaml: no such model spec file");
}

TEST(Models, ValidateModelNamesTheConstraint) {
  ModelConfig m = Preset("llama-tiny");
  m.hidden = 0;
  EXPECT_HAS(ValidateModel(m).message(), "model 'llama-tiny': hidden must be positive, got 0");
  m = Preset("llama-tiny");
  m.heads = 7;
  EXPECT_HAS(ValidateModel(m).message(), "heads (7) must divide hidden (256)");
  Result<Program> p = LowerTransformer(m, Plan("dp=2"));
  ASSERT_FALSE(p.ok());
  EXPECT_HAS(p.status().message(), "heads (7) must divide hidden");
}

// LLaMA parameters by hand (d = h/a, f = ffn_hidden): per layer q and o h^2
// each, k and v h*kv*d each, gate/up/down h*f each, two RMSNorms h each; plus
// the word embedding V*h, the untied head V*h and the final RMSNorm h.
// llama-7b: 32*(2*4096^2 + 2*4096*4096 + 3*4096*11008 + 2*4096) + 2*32000*4096 + 4096
//         = 32*202,383,360 + 262,144,000 + 4,096 = 6,738,415,616 (~6.74e9).
// llama-70b (kv*d = 8*128 = 1024):
//   80*(2*8192^2 + 2*8192*1024 + 3*8192*28672 + 2*8192) + 2*32000*8192 + 8192
//   = 80*855,654,400 + 524,288,000 + 8,192 = 68,976,648,192 (~6.9e10).
// gpt-1.3b (GPT formula, unchanged): 24*(12*2048^2 + 4*2048) + 51200*2048 + 2048^2 + 2*2048
//         = 1,317,212,160.
TEST(Models, ParameterCounts) {
  EXPECT_EQ(ModelParameterCount(Preset("llama-7b")), 6738415616LL);
  EXPECT_EQ(ModelParameterCount(Preset("llama-70b")), 68976648192LL);
  EXPECT_EQ(ModelParameterCount(Preset("gpt-1.3b")), 1317212160LL);
  // llama-tiny: 2*(2*256^2 + 2*256*64 + 3*256*512 + 512) + 2*512*256 + 256 = 1,377,536.
  EXPECT_EQ(ModelParameterCount(Preset("llama-tiny")), 1377536LL);
  // The unsharded programs hold every parameter once (sum over the Adam ops).
  for (const char* name : {"llama-tiny", "llama-7b", "gpt-tiny"}) {
    const ModelConfig m = Preset(name);
    Program p = Lower(m, "dp=1,tp=1");
    std::map<std::string, const Tensor*> t = Tensors(Main(p));
    int64_t total = 0;
    for (const Op* adam : AdamOps(Main(p))) total += t.at(adam->inputs[0])->NumElements();
    EXPECT_EQ(total, ModelParameterCount(m)) << name;
  }
}

// ---- LLaMA --------------------------------------------------------------------

/// Forward matmul + attention flops of one LLaMA layer (d = h/a, f = ffn):
/// q 2Bsh^2 + k and v 2*2Bsh*kv*d + o 2Bsh^2 + gate/up/down 3*2Bsh*f
/// + attention 4Bs^2h (scores and AV over all query heads), all over tp.
double LlamaForwardLayerFlops(const ModelConfig& m, int tp) {
  const double b = m.batch, s = m.seq, h = m.hidden, f = m.ffn_hidden;
  const double kvd = static_cast<double>(m.kv_heads) * (m.hidden / m.heads);
  return (2 * b * s * h * h + 2 * 2 * b * s * h * kvd + 2 * b * s * h * h + 3 * 2 * b * s * h * f +
          4 * b * s * s * h) /
         tp;
}

// llama-tiny (B 2, s 64, h 256, kv*d = 2*32 = 64, f 512): Bsh = 32,768;
//   q+o 2*2*32,768*256 = 33,554,432 + k+v 2*2*32,768*64 = 8,388,608
//   + MLP 6*32,768*512 = 100,663,296 + attention 4*2*64^2*256 = 8,388,608
//   = 150,994,944 at tp=1 (75,497,472 at tp=2).
// llama-7b tp=8 (B 4, s 4096, h 4096, kv*d 4096, f 11008): Bsh = 67,108,864;
//   q+o 1,099,511,627,776 + k+v 1,099,511,627,776 + MLP 4,432,406,249,472
//   + attention 1,099,511,627,776 = 7,730,941,132,800; / 8 = 966,367,641,600.
// llama-70b tp=8 sp (B 1, s 4096, h 8192, kv*d 1024, f 28672): Bsh = 33,554,432;
//   q+o 1,099,511,627,776 + k+v 137,438,953,472 + MLP 5,772,436,045,824
//   + attention 549,755,813,888 = 7,559,142,440,960; / 8 = 944,892,805,120.
TEST(Llama, ForwardLayerFlopsMatchArithmetic) {
  const ModelConfig tiny = Preset("llama-tiny");
  EXPECT_EQ(LlamaForwardLayerFlops(tiny, 1), 150994944.0);
  for (int tp : {1, 2}) {
    Program p = Lower(tiny, "tp=" + std::to_string(tp));
    for (int l = 0; l < tiny.layers; ++l)
      EXPECT_EQ(LayerFlops(Main(p), l, Phase::kForward), LlamaForwardLayerFlops(tiny, tp));
  }
  const ModelConfig l7 = Preset("llama-7b");
  EXPECT_EQ(LlamaForwardLayerFlops(l7, 8), 966367641600.0);
  Program p7 = Lower(l7, "tp=8,dp=4");
  for (int l = 0; l < l7.layers; ++l)
    EXPECT_EQ(LayerFlops(Main(p7), l, Phase::kForward), 966367641600.0) << l;
  const ModelConfig l70 = Preset("llama-70b");
  EXPECT_EQ(LlamaForwardLayerFlops(l70, 8), 944892805120.0);
  Program p70 = Lower(l70, "tp=8,sp");
  for (int l : {0, 41, 79})
    EXPECT_EQ(LayerFlops(Main(p70), l, Phase::kForward), 944892805120.0) << l;
}

// Backward = dX + dW per matmul (2x) and attention_grad = 2.5x attention
// (kAttentionGradFlops).
TEST(Llama, BackwardLayerFlopsAreTwiceForwardPlusTheRecomputedScores) {
  for (const char* plan : {"tp=2", "dp=2,tp=2,sp,zero=3"}) {
    Program p = Lower(Preset("llama-tiny"), plan);
    for (int l = 0; l < 2; ++l)
      EXPECT_EQ(LayerFlops(Main(p), l, Phase::kBackward),
                2 * LayerFlops(Main(p), l, Phase::kForward) + 0.5 * LayerAttentionFlops(Main(p), l))
          << plan;
  }
}

// llama-tiny at tp=2: h 256, 8 heads (d 32), 2 kv heads -> per rank 4 query
// heads and 1 kv head; q [256, 128], k and v [256, 2*32/2 = 32], o [128, 256],
// gate/up [256, 256], down [256, 256]; untied head [512/2, 256].
TEST(Llama, GroupedQueryAttentionSwigluAndRmsNormShapes) {
  Program p = Lower(Preset("llama-tiny"), "tp=2");
  std::map<std::string, const Tensor*> t = Tensors(Main(p));
  EXPECT_EQ(t.at("L0.attn.q.w")->shape, (Shape{256, 128}));
  EXPECT_EQ(t.at("L0.attn.k.w")->shape, (Shape{256, 32}));
  EXPECT_EQ(t.at("L0.attn.v.w")->shape, (Shape{256, 32}));
  EXPECT_EQ(t.at("L0.attn.k.w")->sharding, (Sharding{{}, {"tp"}}));
  EXPECT_EQ(t.at("L0.attn.o.w")->shape, (Shape{128, 256}));
  EXPECT_EQ(t.at("L0.attn.o.w")->sharding, (Sharding{{"tp"}, {}}));
  EXPECT_EQ(t.at("L0.mlp.gate.w")->shape, (Shape{256, 256}));
  EXPECT_EQ(t.at("L0.mlp.down.w")->shape, (Shape{256, 256}));
  EXPECT_EQ(t.at("head.w")->shape, (Shape{256, 256}));
  EXPECT_EQ(t.count("embed.pos.table"), 0u);  // no position table (RoPE is not modelled)
  EXPECT_EQ(t.count("L0.ln1.beta"), 0u);      // RMSNorm has no beta
  std::map<ComputeType, int> types;
  for (const Op& op : Main(p).ops) {
    if (op.kind != OpKind::kCompute) continue;
    ++types[op.compute_type];
    if (op.compute_type == ComputeType::kAttention) {
      EXPECT_EQ(op.Attr("heads", 0), 4);
      EXPECT_EQ(op.Attr("kv_heads", 0), 1);
    }
  }
  EXPECT_EQ(types[ComputeType::kRmsNorm], 5);  // 2 per layer + final
  EXPECT_EQ(types[ComputeType::kRmsNormGrad], 5);
  EXPECT_EQ(types[ComputeType::kSwiglu], 2);
  EXPECT_EQ(types[ComputeType::kSwigluGrad], 2);
  EXPECT_EQ(types[ComputeType::kLayerNorm], 0);
  EXPECT_EQ(types[ComputeType::kGelu], 0);
}

// Megatron TP in LLaMA is the same as in GPT: per layer 2 forward (o, down)
// and 2 backward (q/k/v dX sum, gate/up dX sum) all-reduces of 2Bsh bytes.
// llama-7b: 2*4*4096*4096 = 134,217,728 bytes each.
TEST(Llama, TwoForwardAndTwoBackwardTpAllReducesPerLayer) {
  const ModelConfig m = Preset("llama-7b");
  Program p = Lower(m, "tp=8,dp=4");
  for (int l = 0; l < m.layers; ++l)
    for (Phase phase : {Phase::kForward, Phase::kBackward}) {
      auto ars = Collectives(Main(p), l, phase, CollectiveType::kAllReduce, "tp", "activation");
      ASSERT_EQ(ars.size(), 2u);
      for (const Op* op : ars) EXPECT_EQ(op->message_bytes, 134217728LL) << op->name;
    }
}

// ---- sequence parallelism -----------------------------------------------------

// Megatron-SP per layer: forward all-gather (tp) before QKV and before fc1,
// reduce-scatter (tp) after proj and after fc2; backward mirrors them
// (all-gather of dy before proj.dX / fc2.dX, reduce-scatter of the qkv and
// fc1 input grads) and all-gathers the two norm outputs again for the qkv
// and fc1 weight grads (Megatron's sequence-parallel linear saves its input
// shard, not the gathered input: 4 all-gathers per layer in the backward). Shapes: an all-gather takes this rank's sequence shard
// [B, s/tp, h] (message 2*B*(s/tp)*h bytes in bf16) and gives [B, s, h]; a
// reduce-scatter takes the partial [B, s, h] (message 2Bsh bytes) and gives
// [B, s/tp, h]. Per rank on a ring the pair moves (tp-1)/tp * 2Bsh bytes
// each, together 2(tp-1)/tp * 2Bsh: exactly one all-reduce of 2Bsh.
// gpt-1.3b tp=8 (B 8, s 2048, h 2048): reduce-scatter message 67,108,864,
// all-gather message 67,108,864 / 8 = 8,388,608 bytes.
TEST(SequenceParallel, TwoAllGathersAndTwoReduceScattersPerLayerEachWay) {
  const ModelConfig m = Preset("gpt-1.3b");
  Program p = Lower(m, "tp=8,sp,dp=4");
  const int64_t rs_bytes = 2LL * m.batch * m.seq * m.hidden;
  const int64_t ag_bytes = rs_bytes / 8;
  EXPECT_EQ(rs_bytes, 67108864LL);
  EXPECT_EQ(ag_bytes, 8388608LL);
  std::map<std::string, const Tensor*> t = Tensors(Main(p));
  for (int l = 0; l < m.layers; ++l)
    for (Phase phase : {Phase::kForward, Phase::kBackward}) {
      auto ags = Collectives(Main(p), l, phase, CollectiveType::kAllGather, "tp", "activation");
      auto rss = Collectives(Main(p), l, phase, CollectiveType::kReduceScatter, "tp", "activation");
      auto ars = Collectives(Main(p), l, phase, CollectiveType::kAllReduce, "tp", "activation");
      ASSERT_EQ(ags.size(), phase == Phase::kForward ? 2u : 4u) << l;
      ASSERT_EQ(rss.size(), 2u) << l;
      EXPECT_EQ(ars.size(), 0u) << l;
      for (const Op* op : ags) {
        EXPECT_EQ(op->message_bytes, ag_bytes) << op->name;
        EXPECT_EQ(t.at(op->outputs[0])->shape, (Shape{8, 2048, 2048}));
      }
      for (const Op* op : rss) {
        EXPECT_EQ(op->message_bytes, rs_bytes) << op->name;
        EXPECT_EQ(t.at(op->outputs[0])->shape, (Shape{8, 256, 2048}));
        EXPECT_EQ(t.at(op->outputs[0])->sharding, (Sharding{{"dp"}, {"tp"}, {}}));
      }
    }
  // Placement: ln1.ag feeds qkv, proj.rs follows proj; fc1.dX.rs after fc1.dX.
  std::map<std::string, const Op*> by_name;
  for (const Op& op : Main(p).ops) by_name[op.name] = &op;
  EXPECT_EQ(by_name.at("L3.ln1.ag")->collective, CollectiveType::kAllGather);
  EXPECT_EQ(by_name.at("L3.attn.qkv")->inputs[0], by_name.at("L3.ln1.ag")->outputs[0]);
  EXPECT_EQ(by_name.at("L3.attn.proj.rs")->inputs[0], by_name.at("L3.attn.proj")->outputs[0]);
  EXPECT_EQ(by_name.at("L3.mlp.fc2.rs")->inputs[0], by_name.at("L3.mlp.fc2")->outputs[0]);
  EXPECT_EQ(by_name.at("L3.mlp.fc2.dX")->inputs[0], by_name.at("L3.mlp.dy.ag")->outputs[0]);
  EXPECT_EQ(by_name.at("L3.mlp.fc1.dX.rs")->inputs[0], by_name.at("L3.mlp.fc1.dX")->outputs[0]);
  EXPECT_EQ(by_name.at("L3.attn.qkv.dX.rs")->inputs[0], by_name.at("L3.attn.qkv.dX")->outputs[0]);
  // The weight grads read the regathered norm outputs, gathered from the shard the forward kept.
  EXPECT_EQ(by_name.at("L3.ln1.bwd.ag")->inputs[0], by_name.at("L3.ln1")->outputs[0]);
  EXPECT_EQ(by_name.at("L3.attn.qkv.dW.view")->inputs[0], by_name.at("L3.ln1.bwd.ag")->outputs[0]);
  EXPECT_EQ(by_name.at("L3.mlp.fc1.dW.view")->inputs[0], by_name.at("L3.ln2.bwd.ag")->outputs[0]);
}

// Outside the blocks: embedding reduce-scatter (forward) and its mirror
// all-gather of dx before the word-embedding grad; the final norm's output is
// all-gathered before the LM head and head.dX reduce-scattered. The three
// vocab-parallel loss all-reduces stay (f32 [B, s]: 4Bs bytes each).
// Norms run on the sequence shard [B, s/tp, h]; their gamma (and beta, and
// gpt's position table) grads are partial over tp and all-reduced over tp
// (purpose grad_sync, 2h bytes each) before the dp all-reduce.
TEST(SequenceParallel, NormsOnTheShardAndTheirGradsAllReducedOverTp) {
  const ModelConfig m = Preset("gpt-1.3b");
  Program p = Lower(m, "tp=8,sp,dp=4");
  const Graph& g = Main(p);
  std::map<std::string, const Tensor*> t = Tensors(g);
  EXPECT_EQ(AllCollectives(g, CollectiveType::kAllGather, "activation").size(), 2u * 3 * 24 + 2);
  EXPECT_EQ(AllCollectives(g, CollectiveType::kReduceScatter, "activation").size(), 2u * 2 * 24 + 2);
  auto loss_ars = AllCollectives(g, CollectiveType::kAllReduce, "activation");
  ASSERT_EQ(loss_ars.size(), 3u);
  for (const Op* op : loss_ars) EXPECT_EQ(op->message_bytes, 4LL * 8 * 2048) << op->name;
  for (const Op& op : g.ops) {
    if (op.kind == OpKind::kCompute && op.compute_type == ComputeType::kLayerNorm) {
      EXPECT_EQ(t.at(op.inputs[0])->shape, (Shape{8, 256, 2048})) << op.name;
    }
  }
  EXPECT_EQ(t.at("L0.ln1.gamma.grad")->partial, (std::vector<std::string>{"dp", "tp"}));
  EXPECT_EQ(t.at("positions")->shape, (Shape{8, 256}));
  // One tp grad_sync per LayerNorm parameter (2 per norm, 2 norms per layer,
  // plus the final norm) and the position table; all others have none.
  std::set<std::string> tp_synced;
  for (const Op* op : AllCollectives(g, CollectiveType::kAllReduce, "grad_sync")) {
    if (op->group.axes != std::vector<std::string>{"tp"}) continue;
    tp_synced.insert(op->name);
    const bool pos = op->name == "embed.pos.table.grad.tp_ar";
    EXPECT_EQ(op->message_bytes, pos ? 2LL * 2048 * 2048 : 2LL * 2048) << op->name;
  }
  EXPECT_EQ(tp_synced.size(), 4u * 24 + 2 + 1);
  EXPECT_TRUE(tp_synced.count("L5.ln2.beta.grad.tp_ar"));
  EXPECT_TRUE(tp_synced.count("final_ln.gamma.grad.tp_ar"));
  // The dp all-reduce follows the tp one for those parameters.
  EXPECT_EQ(AllCollectives(g, CollectiveType::kAllReduce, "grad_sync").size(), 99u + 196u);
}

// SP changes where collectives go, not the math: same matmul/attention flops.
TEST(SequenceParallel, SameLayerFlopsAsPlainTensorParallel) {
  for (const char* name : {"gpt-tiny", "llama-tiny"}) {
    Program plain = Lower(Preset(name), "tp=2");
    Program sp = Lower(Preset(name), "tp=2,sp");
    for (Phase phase : {Phase::kForward, Phase::kBackward})
      EXPECT_EQ(LayerFlops(Main(sp), 1, phase), LayerFlops(Main(plain), 1, phase)) << name;
  }
}

// ---- ZeRO ----------------------------------------------------------------------

/// Parameters whose backward reads the parameter itself (so ZeRO-3
/// all-gathers them a second time): every weight, every norm gamma and the
/// LM head's weight; not LayerNorm betas, the position table, or (llama) the
/// word table, whose grads do not read them.
bool BackwardReads(const std::string& param, ModelFamily family) {
  auto ends_with = [&](const std::string& s) {
    return param.size() >= s.size() && param.compare(param.size() - s.size(), s.size(), s) == 0;
  };
  if (ends_with(".beta") || param == "embed.pos.table") return false;
  if (param == "embed.word.table") return family == ModelFamily::kGpt;  // gpt's tied head
  return true;
}

// ZeRO-3, per parameter: one all-gather over dp before its first forward use
// (phase fwd), one before its backward use (phase bwd) when backward reads
// it, and one reduce-scatter of its gradient (phase bwd, grad_sync). Adam
// runs on the shard; there is no all-gather after the step.
// gpt-13b, dp=32, tp=1: 8*40 + 4 = 324 parameters; backward reads 6 per layer
// (qkv, proj, fc1, fc2, ln1.gamma, ln2.gamma) + final gamma + tied table = 242.
// Bytes: forward all-gathers send each shard once: sum = parameter bytes / dp
// = 2 * 12,856,371,200 / 32 = 803,523,200 (the same as the parameter memory
// per rank, the sum of the .shard tensors); reduce-scatters send the whole
// local gradient: 2 * 12,856,371,200 = 25,712,742,400.
TEST(Zero, Stage3GathersEachParameterTwiceAndReduceScattersItsGradient) {
  const ModelConfig m = Preset("gpt-13b");
  Program p = Lower(m, "zero=3,dp=32");
  const Graph& g = Main(p);
  std::map<std::string, const Tensor*> t = Tensors(g);
  std::map<std::string, const Op*> by_name;
  for (const Op& op : g.ops) by_name[op.name] = &op;
  int64_t fwd_bytes = 0, rs_bytes = 0, shard_bytes = 0, adam_state_bytes = 0;
  int bwd_gathers = 0;
  const auto adams = AdamOps(g);
  ASSERT_EQ(adams.size(), 324u);
  for (const Op* adam : adams) {
    const std::string param = ParamOf(*adam);
    EXPECT_EQ(adam->inputs[0], param + ".shard");
    const Op* fwd = by_name.at(param + ".ag.fwd");
    EXPECT_EQ(fwd->collective, CollectiveType::kAllGather);
    EXPECT_EQ(fwd->tags.phase, Phase::kForward);
    EXPECT_EQ(fwd->tags.purpose, "param_gather");
    EXPECT_EQ(fwd->group.axes, std::vector<std::string>{"dp"});
    EXPECT_EQ(fwd->outputs[0], param);
    fwd_bytes += fwd->message_bytes;
    const bool reads = BackwardReads(param, m.family);
    EXPECT_EQ(by_name.count(param + ".ag.bwd"), reads ? 1u : 0u) << param;
    if (reads) {
      EXPECT_EQ(by_name.at(param + ".ag.bwd")->tags.phase, Phase::kBackward);
      ++bwd_gathers;
    }
    const Op* rs = by_name.at(param + ".grad.rs");
    EXPECT_EQ(rs->collective, CollectiveType::kReduceScatter);
    EXPECT_EQ(rs->tags.purpose, "grad_sync");
    EXPECT_EQ(adam->inputs[1], rs->outputs[0]);
    rs_bytes += rs->message_bytes;
    shard_bytes += t.at(param + ".shard")->Bytes();
    adam_state_bytes += t.at(adam->inputs[2])->Bytes() + t.at(adam->inputs[3])->Bytes();
  }
  EXPECT_EQ(bwd_gathers, 242);
  EXPECT_EQ(AllCollectives(g, CollectiveType::kAllGather, "param_gather").size(), 324u + 242u);
  EXPECT_EQ(AllCollectives(g, CollectiveType::kReduceScatter, "grad_sync").size(), 324u);
  EXPECT_EQ(fwd_bytes, 803523200LL);
  EXPECT_EQ(shard_bytes, 803523200LL);
  EXPECT_EQ(rs_bytes, 25712742400LL);
  EXPECT_EQ(adam_state_bytes, 8 * 803523200LL / 2);  // m and v in f32: 8 bytes per element
  // The forward copy is what forward ops read; backward ops read the .bwd copy.
  EXPECT_EQ(by_name.at("L7.mlp.fc1")->inputs[1], "L7.mlp.fc1.w");
  EXPECT_EQ(by_name.at("L7.mlp.fc1.dX")->inputs[1], "L7.mlp.fc1.w.bwd");
  EXPECT_LT(by_name.at("L7.mlp.fc1.w.ag.fwd")->id, by_name.at("L7.mlp.fc1")->id);
}

// With tp, the shard splits the tp shard again: dim 0 sharded over
// ["tp", "dp"] (row-parallel) or ["dp"] with columns on tp (column-parallel).
// llama-tiny tp=2 dp=2: o.w [128, 256] -> shard [64, 256]; q.w [256, 128] ->
// [128, 128]. Per rank the forward all-gathers total (local parameters) / dp
// = 2 * (sharded/tp + replicated) / 2 bytes, with sharded = 2*(2*256^2 +
// 2*256*64 + 3*256*512) + 2*512*256 = 1,376,256 and replicated = 5*256 = 1280.
TEST(Zero, Stage3WithTensorAndSequenceParallel) {
  const ModelConfig m = Preset("llama-tiny");
  Program p = Lower(m, "zero=3,dp=2,tp=2,sp");
  const Graph& g = Main(p);
  std::map<std::string, const Tensor*> t = Tensors(g);
  EXPECT_EQ(t.at("L0.attn.o.w.shard")->shape, (Shape{64, 256}));
  EXPECT_EQ(t.at("L0.attn.o.w.shard")->sharding, (Sharding{{"tp", "dp"}, {}}));
  EXPECT_EQ(t.at("L0.attn.q.w.shard")->shape, (Shape{128, 128}));
  EXPECT_EQ(t.at("L0.attn.q.w.shard")->sharding, (Sharding{{"dp"}, {"tp"}}));
  EXPECT_EQ(t.at("L0.attn.o.w")->shape, (Shape{128, 256}));
  EXPECT_EQ(t.at("L0.ln1.gamma.grad.rs")->shape, (Shape{128}));
  int64_t fwd_bytes = 0;
  for (const Op* op : AllCollectives(g, CollectiveType::kAllGather, "param_gather"))
    if (op->tags.phase == Phase::kForward) fwd_bytes += op->message_bytes;
  EXPECT_EQ(fwd_bytes, 2 * (1376256 / 2 + 1280) / 2);
  // 9 parameters per layer + word table, final gamma and head: 21; backward
  // reads all but the word table: 20.
  EXPECT_EQ(AllCollectives(g, CollectiveType::kReduceScatter, "grad_sync").size(), 21u);
  EXPECT_EQ(AllCollectives(g, CollectiveType::kAllGather, "param_gather").size(), 21u + 20u);
  // Norm grads: tp all-reduce (sp) first, then the dp reduce-scatter.
  std::map<std::string, const Op*> by_name;
  for (const Op& op : g.ops) by_name[op.name] = &op;
  EXPECT_EQ(by_name.at("L1.ln2.gamma.grad.rs")->inputs[0],
            by_name.at("L1.ln2.gamma.grad.tp_ar")->outputs[0]);
}

// ZeRO-1/2, per parameter: one reduce-scatter of the gradient over dp
// (grad_sync, phase bwd), Adam on the 1/dp shard, one all-gather of the
// updated shard (param_gather, phase opt) into "<p>.next".
// gpt-2.7b dp=32: 8*32 + 4 = 260 parameters; all-gather messages sum to
// 2 * 2,653,230,080 / 32 = 165,826,880 bytes.
TEST(Zero, Stages1And2ReduceScatterThenAllGatherPerParameter) {
  const ModelConfig m = Preset("gpt-2.7b");
  Program p = Lower(m, "zero=2,dp=32");
  const Graph& g = Main(p);
  std::map<std::string, const Tensor*> t = Tensors(g);
  std::map<std::string, const Op*> producer, by_name;
  for (const Op& op : g.ops) {
    by_name[op.name] = &op;
    for (const std::string& out : op.outputs) producer[out] = &op;
  }
  const auto adams = AdamOps(g);
  ASSERT_EQ(adams.size(), 260u);
  int64_t ag_bytes = 0;
  for (const Op* adam : adams) {
    const std::string param = ParamOf(*adam);
    EXPECT_EQ(adam->inputs[0], param + ".shard");
    EXPECT_EQ(t.at(param + ".shard")->shape[0] * 32, t.at(param)->shape[0]) << param;
    const Op* rs = producer.at(adam->inputs[1]);
    EXPECT_EQ(rs->collective, CollectiveType::kReduceScatter);
    EXPECT_EQ(rs->tags.purpose, "grad_sync");
    EXPECT_EQ(rs->tags.phase, Phase::kBackward);
    const Op* ag = by_name.at(param + ".ag.opt");
    EXPECT_EQ(ag->collective, CollectiveType::kAllGather);
    EXPECT_EQ(ag->tags.phase, Phase::kOptimizer);
    EXPECT_EQ(ag->tags.purpose, "param_gather");
    EXPECT_EQ(ag->inputs[0], adam->outputs[0]);
    EXPECT_EQ(ag->outputs[0], param + ".next");
    EXPECT_EQ(t.at(param + ".next")->shape, t.at(param)->shape);
    ag_bytes += ag->message_bytes;
  }
  EXPECT_EQ(AllCollectives(g, CollectiveType::kAllGather, "param_gather").size(), 260u);
  EXPECT_EQ(AllCollectives(g, CollectiveType::kReduceScatter, "grad_sync").size(), 260u);
  EXPECT_EQ(AllCollectives(g, CollectiveType::kAllReduce, "grad_sync").size(), 0u);
  EXPECT_EQ(ag_bytes, 165826880LL);
  // Gradient sharding: the reduced gradient is this rank's dp shard (inside
  // the row-parallel weight's tp shard; the tp axis has size 1 here).
  EXPECT_EQ(t.at("L0.mlp.fc2.w.grad.rs")->shape, (Shape{10240 / 32, 2560}));
  EXPECT_EQ(t.at("L0.mlp.fc2.w.grad.rs")->sharding, (Sharding{{"tp", "dp"}, {}}));
  EXPECT_EQ(t.at("L0.mlp.fc1.w.grad.rs")->sharding, (Sharding{{"dp"}, {"tp"}}));
  EXPECT_EQ(t.at("L0.mlp.fc2.w.grad")->partial, std::vector<std::string>{"dp"});
}

// Stage 1 and 2 issue the same collectives on the same shapes; they differ
// in gradient memory, which one micro-batch cannot show (docs/frontends.md).
TEST(Zero, Stages1And2LowerToTheSameOps) {
  Program one = Lower(Preset("llama-tiny"), "zero=1,dp=2,tp=2");
  Program two = Lower(Preset("llama-tiny"), "zero=2,dp=2,tp=2");
  EXPECT_EQ(one.name, "llama-tiny.dp2.tp2.zero1");
  EXPECT_EQ(two.name, "llama-tiny.dp2.tp2.zero2");
  one.name = two.name;
  EXPECT_EQ(WriteProgram(one), WriteProgram(two));
}

// ---- every preset under its plans -------------------------------------------

struct PresetPlan {
  const char* model;
  const char* plan;
  size_t ops;
  int collectives;
};

// Op counts (per block, dp > 1, tp > 1, no sp/zero): gpt 52, llama 65 =
// forward 15 (norm, q, k, v, attention, o, all-reduce, add, norm, gate, up,
// swiglu, down, all-reduce, add) + backward 41 + Adam 9. Collectives:
//  gpt-1.3b dp4 tp8: 4*24 tp + 5 (embedding, head.dX, 3 loss) + 196 dp = 297.
//  gpt-1.3b tp8 sp dp4: (4+6)*24 + 4 activation AG/RS (the backward gathers
//    both norm outputs again) + 3 loss + 99 tp grad + 196 dp = 542; ops: 1476
//    before those 2*24 regathers, 1524 with them.
//  gpt-2.7b zero2 dp32: 260 reduce-scatters + 260 all-gathers = 520.
//  gpt-13b zero3 dp32: 324 reduce-scatters + 324 + 242 all-gathers = 890.
//  llama-7b tp8 dp4: 4*32 + 5 tp + (9*32 + 3) dp = 424.
//  llama-70b tp8 sp: (4+6)*80 + 4 + 3 + (2*80 + 1) tp grad = 968.
const PresetPlan kPresetPlans[] = {
    {"gpt-1.3b", "dp=4,tp=8", 1279, 297},         {"gpt-1.3b", "tp=8,sp,dp=4", 1524, 542},
    {"gpt-2.7b", "zero=2,dp=32", 1822, 520},      {"gpt-13b", "zero=3,dp=32", 2512, 890},
    {"llama-7b", "tp=8,dp=4", 2105, 424},         {"llama-70b", "tp=8,sp", 5144, 968},
};

TEST(Presets, EveryPresetPlanPassesTheVerifier) {
  for (const PresetPlan& pp : kPresetPlans) {
    const ModelConfig m = Preset(pp.model);
    ASSERT_TRUE(ValidatePlan(m, Plan(pp.plan)).ok()) << pp.model << " " << pp.plan;
    Program p = Lower(m, pp.plan);
    std::vector<std::string> errors = VerifyProgram(p);
    EXPECT_TRUE(errors.empty()) << pp.model << " " << pp.plan << ": " << FirstError(errors);
    EXPECT_EQ(Main(p).ops.size(), pp.ops) << pp.model << " " << pp.plan;
    EXPECT_EQ(CountComm(Main(p)), pp.collectives) << pp.model << " " << pp.plan;
    std::printf("%-10s %-14s %5zu ops, %4d collectives, %5zu tensors\n", pp.model, pp.plan,
                Main(p).ops.size(), CountComm(Main(p)), Main(p).tensors.size());
  }
}

// Every combination of dp, tp, sp and ZeRO stage that fits the tiny presets.
TEST(Presets, TinyModelsUnderEveryPlanThatFits) {
  int lowered = 0;
  for (const char* name : {"gpt-tiny", "llama-tiny"}) {
    const ModelConfig m = Preset(name);
    for (int dp : {1, 2, 4})
      for (int tp : {1, 2})
        for (bool sp : {false, true})
          for (int zero = 0; zero <= 3; ++zero) {
            ParallelPlan plan;
            plan.dp = dp;
            plan.tp = tp;
            plan.sp = sp;
            plan.zero = zero;
            if (!ValidatePlan(m, plan).ok()) continue;
            Result<Program> p = LowerTransformer(m, plan);
            ASSERT_TRUE(p.ok()) << name << " " << PlanToString(plan) << ": " << p.status().message();
            std::vector<std::string> errors = VerifyProgram(*p);
            EXPECT_TRUE(errors.empty()) << name << " " << PlanToString(plan) << ": "
                                        << FirstError(errors);
            ++lowered;
          }
  }
  // Per model: 3 dp x (tp 1, tp 2, tp 2 + sp) = 9 plans without ZeRO, and 2
  // dp > 1 x 3 x 3 stages = 18 with: 27 each.
  EXPECT_EQ(lowered, 54);
}

// Every tensor an op reads is declared and produced at most once, before it
// is read (program order is a topological order); ids are 0..n-1.
TEST(Presets, DataflowInProgramOrder) {
  for (const char* plan : {"dp=2,tp=2,sp,zero=3", "dp=2,zero=1", "tp=2,sp"}) {
    for (const char* name : {"gpt-tiny", "llama-tiny"}) {
      Program p = Lower(Preset(name), plan);
      const Graph& g = Main(p);
      std::set<std::string> declared, produced, read_as_input;
      for (const Tensor& t : g.tensors) EXPECT_TRUE(declared.insert(t.name).second) << t.name;
      std::set<std::string> names;
      for (size_t i = 0; i < g.ops.size(); ++i) {
        const Op& op = g.ops[i];
        EXPECT_EQ(op.id, static_cast<int>(i));
        EXPECT_TRUE(names.insert(op.name).second) << op.name;
        EXPECT_EQ(op.stream, op.IsComm() ? CommunicatorStream(op) : "compute");
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

TEST(Presets, JsonRoundTrip) {
  for (const char* name : {"gpt-tiny", "llama-tiny"}) {
    Program p = Lower(Preset(name), "zero=3,dp=2,tp=2,sp");
    const std::string text = WriteProgram(p);
    Result<Program> back = ParseProgram(text, std::string(name) + ".json");
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_EQ(WriteProgram(*back), text);
  }
}

// ep and dap are parsed and validated, not lowered by this frontend; pp and
// micro-batches are lowered (tests/lower/pipeline_lowering_test.cc).
TEST(Presets, UnimplementedPlansSaySo) {
  auto message = [](const std::string& model, const std::string& plan) {
    Result<Program> p = LowerTransformer(Preset(model), Plan(plan));
    EXPECT_FALSE(p.ok()) << plan;
    return p.ok() ? std::string() : p.status().message();
  };
  EXPECT_TRUE(LowerTransformer(Preset("llama-70b"), Plan("pp=4,tp=8,dp=1,sp,microbatches=8")).ok());
  EXPECT_TRUE(LowerTransformer(Preset("gpt-tiny"), Plan("dp=2,microbatches=4")).ok());
  // ep and dap fail validation first on these dense decoders.
  EXPECT_HAS(message("gpt-tiny", "dp=2,ep=2"), "must divide the number of experts");
  EXPECT_HAS(message("gpt-tiny", "dap=2"), "needs an Evoformer model");
}

// Lowering is linear in the layers: llama-70b (80 layers) takes milliseconds.
TEST(Presets, TimeLoweringLlama70bTp8Sp) {
  auto start = std::chrono::steady_clock::now();
  Result<Program> p = LowerTransformer(Preset("llama-70b"), Plan("tp=8,sp,zero=3,dp=4"));
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(p.ok()) << p.status().message();
  std::printf("llama-70b tp8 sp zero3 dp4: %zu ops (%d collectives), lowered in %.1f ms\n",
              Main(*p).ops.size(), CountComm(Main(*p)), ms);
}

// ---- activation recomputation ---------------------------------------------------

namespace recompute_test {

/// Names of the forward-phase tensors (outputs of forward ops) that a
/// backward-phase op reads, for layer `layer`'s backward ops.
std::set<std::string> KeptFromForward(const Graph& g, int layer) {
  std::set<std::string> forward_out;
  for (const Op& op : g.ops)
    if (op.tags.phase == Phase::kForward)
      for (const std::string& t : op.outputs) forward_out.insert(t);
  std::set<std::string> kept;
  for (const Op& op : g.ops)
    if (op.tags.phase == Phase::kBackward && op.tags.layer == layer)
      for (const std::string& t : op.inputs)
        if (forward_out.count(t)) kept.insert(t);
  return kept;
}

/// True when op `to` depends (through data or control edges) on op `from`.
bool DependsOn(const Graph& g, int from, int to) {
  const GraphIndex index = GraphIndex::Build(g);
  std::vector<char> seen(g.ops.size(), 0);
  std::vector<int> stack = {to};
  while (!stack.empty()) {
    const int v = stack.back();
    stack.pop_back();
    if (v == from) return true;
    for (int p : index.preds[v])
      if (!seen[p]) {
        seen[p] = 1;
        stack.push_back(p);
      }
  }
  return false;
}

}  // namespace recompute_test

// Full recomputation keeps only each layer's input: layer 1's backward reads
// one forward tensor, L0.mlp.res.out (its input, layer 0's output), and re-runs
// its forward as "L1.recompute.*" ops in the backward phase, through the
// activation (gelu) and no further (the second MLP matmul, its tp reduction
// and the residual add make nothing the backward reads). The recomputed
// forward repeats its tp all-reduce (attention output); parameter reads go
// through the backward's copy.
TEST(Recompute, FullKeepsTheLayerInputAndRerunsTheForwardInTheBackward) {
  const ModelConfig m = Preset("gpt-tiny");
  const Graph none = Main(Lower(m, "tp=2"));
  const Graph full = Main(Lower(m, "tp=2,recompute=full"));
  EXPECT_EQ(recompute_test::KeptFromForward(full, 1), (std::set<std::string>{"L0.mlp.res.out"}));
  EXPECT_GT(recompute_test::KeptFromForward(none, 1).size(), 8u);
  std::map<std::string, const Op*> by_name;
  for (const Op& op : full.ops) by_name[op.name] = &op;
  for (const char* name : {"L1.recompute.ln1", "L1.recompute.attn.qkv", "L1.recompute.attn.core",
                           "L1.recompute.attn.proj", "L1.recompute.attn.proj.ar", "L1.recompute.ln2",
                           "L1.recompute.mlp.fc1", "L1.recompute.mlp.gelu"}) {
    ASSERT_TRUE(by_name.count(name)) << name;
    EXPECT_EQ(by_name.at(name)->tags.phase, Phase::kBackward) << name;
    EXPECT_EQ(by_name.at(name)->tags.layer, 1) << name;
  }
  for (const char* absent : {"L1.recompute.mlp.fc2", "L1.recompute.mlp.fc2.ar", "L1.recompute.mlp.res"})
    EXPECT_FALSE(by_name.count(absent)) << absent;
  EXPECT_EQ(by_name.at("L1.recompute.attn.qkv")->inputs[1], "L1.attn.qkv.w");  // the forward's parameter
  // Recomputed before the layer's backward: the recompute ops precede L1.mlp.fc2.dX.
  EXPECT_LT(by_name.at("L1.recompute.mlp.gelu")->id, by_name.at("L1.mlp.fc2.dX")->id);
  EXPECT_EQ(by_name.at("L1.mlp.gelu.grad")->inputs[1], "L1.recompute.mlp.fc1.out");
  // One more forward's worth of compute per layer, minus the MLP's second matmul.
  EXPECT_GT(full.ops.size(), none.ops.size());
}

// Selective recomputation: the attention core is re-run right before its
// grad, which reads the recomputed output; everything else is as without.
TEST(Recompute, SelectiveRerunsTheAttentionCoreBeforeItsGrad) {
  const ModelConfig m = Preset("llama-tiny");
  const Graph none = Main(Lower(m, "tp=2"));
  const Graph sel = Main(Lower(m, "tp=2,recompute=selective"));
  EXPECT_EQ(sel.ops.size(), none.ops.size() + m.layers);
  std::map<std::string, const Op*> by_name;
  for (const Op& op : sel.ops) by_name[op.name] = &op;
  const Op* rc = by_name.at("L0.recompute.attn.core");
  EXPECT_EQ(rc->compute_type, ComputeType::kAttention);
  EXPECT_EQ(rc->inputs, (std::vector<std::string>{"L0.attn.q.out", "L0.attn.k.out", "L0.attn.v.out"}));
  const Op* grad = by_name.at("L0.attn.core.grad");
  ASSERT_EQ(grad->inputs.size(), 5u);
  EXPECT_EQ(grad->inputs[4], rc->outputs[0]);
  EXPECT_EQ(rc->id + 1, grad->id);
  // Without recomputation the grad reads the forward's output.
  for (const Op& op : none.ops)
    if (op.name == "L0.attn.core.grad") {
      EXPECT_EQ(op.inputs[4], "L0.attn.core.out");
    }
}

// A recomputed forward starts when the backward reaches its block, as
// PyTorch's checkpoint and Megatron's recompute run it: its first op waits
// (a control edge) for the op that makes d(block output), so no schedule can
// run it ahead and keep its activations live (xla-lhs used to hoist every
// layer's recomputation to the start of the backward). gpt-tiny has two
// layers: d(L1 output) comes from final_ln.grad, d(L0 output) from
// L1.attn.res.grad; selective recomputation waits for d(attention core).
TEST(Recompute, RecomputationWaitsForTheGradientOfItsBlock) {
  const Graph full = Main(Lower(Preset("gpt-tiny"), "tp=2,recompute=full"));
  std::map<std::string, int> id;
  for (const Op& op : full.ops) id[op.name] = op.id;
  EXPECT_EQ(full.ops[id.at("L1.recompute.ln1")].control_deps, (std::vector<int>{id.at("final_ln.grad")}));
  EXPECT_EQ(full.ops[id.at("L0.recompute.ln1")].control_deps, (std::vector<int>{id.at("L1.attn.res.grad")}));
  for (const char* name : {"L0.recompute.attn.qkv", "L0.recompute.mlp.gelu"})
    EXPECT_TRUE(recompute_test::DependsOn(full, id.at("L1.attn.res.grad"), id.at(name))) << name;
  // The recomputed forward's tp all-reduce is not gated itself (it reads the
  // gated ops' output); the forward's ops are not gated at all.
  EXPECT_TRUE(full.ops[id.at("L0.recompute.attn.proj.ar")].control_deps.empty());
  EXPECT_TRUE(full.ops[id.at("L0.ln1")].control_deps.empty());

  const Graph sel = Main(Lower(Preset("llama-tiny"), "tp=2,recompute=selective"));
  std::map<std::string, const Op*> by_name;
  for (const Op& op : sel.ops) by_name[op.name] = &op;
  const Op* rc = by_name.at("L0.recompute.attn.core");
  const Op* grad = by_name.at("L0.attn.core.grad");
  ASSERT_EQ(rc->control_deps.size(), 1u);
  EXPECT_EQ(sel.ops[rc->control_deps[0]].outputs, (std::vector<std::string>{grad->inputs[0]}));
  // Without recomputation nothing is gated.
  const Program plain = Lower(Preset("gpt-tiny"), "tp=2");  // kept: Main returns a reference into it
  for (const Op& op : Main(plain).ops) EXPECT_TRUE(op.control_deps.empty()) << op.name;
}

}  // namespace
}  // namespace concerto
