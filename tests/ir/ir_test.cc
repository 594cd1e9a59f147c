// Tests of the IR: JSON reading and writing, defaults, round trips, the
// verifier and the shape rule of every compute type and collective.
#include "concerto/ir/ir.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "concerto/ir/graph_index.h"
#include "concerto/ir/json_io.h"
#include "concerto/ir/verifier.h"

namespace concerto {
namespace {

const std::string kExamples[] = {"dp_matmul_allreduce.json", "pipeline_2stage.json",
                                 "two_comm_streams.json"};

std::string ExamplePath(const std::string& name) {
  return std::string(CONCERTO_SOURCE_DIR) + "/examples/ir/" + name;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// --- field-by-field comparison ------------------------------------------------

void ExpectTensorsEqual(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.shape, b.shape) << a.name;
  EXPECT_EQ(a.dtype, b.dtype) << a.name;
  EXPECT_EQ(a.sharding, b.sharding) << a.name;
  EXPECT_EQ(a.partial, b.partial) << a.name;
}

void ExpectOpsEqual(const Op& a, const Op& b) {
  const std::string label = OpLabel(a);
  EXPECT_EQ(a.id, b.id) << label;
  EXPECT_EQ(a.name, b.name) << label;
  EXPECT_EQ(a.kind, b.kind) << label;
  EXPECT_EQ(a.stream, b.stream) << label;
  EXPECT_EQ(a.inputs, b.inputs) << label;
  EXPECT_EQ(a.outputs, b.outputs) << label;
  EXPECT_EQ(a.control_deps, b.control_deps) << label;
  EXPECT_EQ(a.compute_type, b.compute_type) << label;
  EXPECT_EQ(a.attrs, b.attrs) << label;
  EXPECT_EQ(a.flops, b.flops) << label;
  EXPECT_EQ(a.bytes, b.bytes) << label;
  EXPECT_EQ(a.collective, b.collective) << label;
  EXPECT_EQ(a.reduce, b.reduce) << label;
  EXPECT_EQ(a.group.axes, b.group.axes) << label;
  EXPECT_EQ(a.group.ranks, b.group.ranks) << label;
  EXPECT_EQ(a.peer.axis, b.peer.axis) << label;
  EXPECT_EQ(a.peer.offset, b.peer.offset) << label;
  EXPECT_EQ(a.peer.rank, b.peer.rank) << label;
  EXPECT_EQ(a.tag, b.tag) << label;
  EXPECT_EQ(a.message_bytes, b.message_bytes) << label;
  EXPECT_EQ(a.duration_us, b.duration_us) << label;
  EXPECT_EQ(a.tags.phase, b.tags.phase) << label;
  EXPECT_EQ(a.tags.layer, b.tags.layer) << label;
  EXPECT_EQ(a.tags.microbatch, b.tags.microbatch) << label;
  EXPECT_EQ(a.tags.purpose, b.tags.purpose) << label;
  EXPECT_EQ(a.fused_from, b.fused_from) << label;
}

void ExpectProgramsEqual(const Program& a, const Program& b) {
  EXPECT_EQ(a.name, b.name);
  ASSERT_EQ(a.mesh.axes.size(), b.mesh.axes.size());
  for (size_t i = 0; i < a.mesh.axes.size(); ++i) {
    EXPECT_EQ(a.mesh.axes[i].name, b.mesh.axes[i].name);
    EXPECT_EQ(a.mesh.axes[i].size, b.mesh.axes[i].size);
  }
  ASSERT_EQ(a.graphs.size(), b.graphs.size());
  for (size_t g = 0; g < a.graphs.size(); ++g) {
    const Graph& ga = a.graphs[g];
    const Graph& gb = b.graphs[g];
    EXPECT_EQ(ga.name, gb.name);
    EXPECT_EQ(ga.streams, gb.streams);
    ASSERT_EQ(ga.tensors.size(), gb.tensors.size());
    for (size_t t = 0; t < ga.tensors.size(); ++t) ExpectTensorsEqual(ga.tensors[t], gb.tensors[t]);
    ASSERT_EQ(ga.ops.size(), gb.ops.size());
    for (size_t o = 0; o < ga.ops.size(); ++o) ExpectOpsEqual(ga.ops[o], gb.ops[o]);
  }
  ASSERT_EQ(a.roles.size(), b.roles.size());
  for (size_t r = 0; r < a.roles.size(); ++r) {
    EXPECT_EQ(a.roles[r].name, b.roles[r].name);
    EXPECT_EQ(a.roles[r].graph, b.roles[r].graph);
    EXPECT_EQ(a.roles[r].ranks, b.roles[r].ranks);
  }
}

/// write(read(write(p))) == write(p) and read(write(p)) == p.
void ExpectRoundTrip(const Program& p) {
  std::string text = WriteProgram(p);
  Result<Program> back = ParseProgram(text, "roundtrip.json");
  ASSERT_TRUE(back.ok()) << back.status().message() << "\n" << text;
  ExpectProgramsEqual(p, *back);
  EXPECT_EQ(WriteProgram(*back), text);
}

// --- a generated program that uses every op kind and compute type -----------

/// Builds one graph op by op.
class GraphBuilder {
 public:
  explicit GraphBuilder(std::string name) { g_.name = std::move(name); }

  void AddTensor(const std::string& name, std::vector<int64_t> shape, DType dtype = DType::kF32) {
    Tensor t;
    t.name = name;
    t.shape = std::move(shape);
    t.dtype = dtype;
    t.sharding.assign(t.shape.size(), {});
    g_.tensors.push_back(t);
  }

  Op& AddCompute(ComputeType type, std::vector<std::string> in, std::vector<std::string> out,
                 std::map<std::string, double> attrs = {}) {
    Op& op = NewOp(OpKind::kCompute, std::string(ToString(type)), std::move(in), std::move(out));
    op.compute_type = type;
    op.attrs = std::move(attrs);
    op.flops = 1000.5 * op.id;
    op.bytes = 64.0 * op.id;
    op.tags.phase = Phase::kForward;
    op.tags.layer = op.id % 3;
    return op;
  }

  Op& AddCollective(CollectiveType type, Group group, std::vector<std::string> in,
                    std::vector<std::string> out, const std::string& stream = "comm") {
    Op& op = NewOp(OpKind::kCollective, std::string(ToString(type)), std::move(in), std::move(out));
    op.collective = type;
    op.group = std::move(group);
    op.stream = stream;
    op.message_bytes = 4096;
    op.tags.purpose = "grad_sync";
    op.tags.phase = Phase::kBackward;
    return op;
  }

  Op& NewOp(OpKind kind, const std::string& name, std::vector<std::string> in,
            std::vector<std::string> out) {
    Op op;
    op.id = static_cast<int>(g_.ops.size()) * 2 + 1;  // ids need not be dense
    op.name = name + "." + std::to_string(g_.ops.size());
    op.kind = kind;
    op.stream = op.IsComm() ? "comm" : "compute";
    op.inputs = std::move(in);
    op.outputs = std::move(out);
    g_.ops.push_back(op);
    return g_.ops.back();
  }

  Graph& graph() { return g_; }

 private:
  Graph g_;
};

/// One graph exercising every compute type with valid shapes.
Graph ComputeZoo() {
  GraphBuilder b("zoo");
  b.AddTensor("a", {2, 3, 4, 5});
  b.AddTensor("b2", {5, 6});
  b.AddTensor("mm1", {2, 3, 4, 6});
  b.AddCompute(ComputeType::kMatmul, {"a", "b2"}, {"mm1"});
  b.AddTensor("bt", {2, 3, 6, 4});
  b.AddTensor("mm2", {2, 3, 5, 6});
  b.AddCompute(ComputeType::kMatmul, {"a", "bt"}, {"mm2"},
               {{"transpose_a", 1}, {"transpose_b", 1}});
  b.AddTensor("x", {2, 4, 8});
  b.AddTensor("bias", {8});
  b.AddTensor("x_add", {2, 4, 8});
  b.AddCompute(ComputeType::kAdd, {"x", "bias"}, {"x_add"});
  const char* unary_names[] = {"x_mul",       "x_scale",  "x_gelu",    "x_gelu_grad",    "x_silu",
                               "x_silu_grad", "x_swiglu", "x_softmax", "x_softmax_grad", "x_cast"};
  for (const char* n : unary_names) b.AddTensor(n, {2, 4, 8});
  b.AddCompute(ComputeType::kMul, {"x", "x_add"}, {"x_mul"});
  b.AddCompute(ComputeType::kScale, {"x"}, {"x_scale"}, {{"scale", 0.125}});
  b.AddCompute(ComputeType::kGelu, {"x"}, {"x_gelu"});
  b.AddCompute(ComputeType::kGeluGrad, {"x_gelu", "x"}, {"x_gelu_grad"});
  b.AddCompute(ComputeType::kSilu, {"x"}, {"x_silu"});
  b.AddCompute(ComputeType::kSiluGrad, {"x_silu", "x"}, {"x_silu_grad"});
  b.AddCompute(ComputeType::kSwiglu, {"x", "x_add"}, {"x_swiglu"});
  b.AddTensor("dgate", {2, 4, 8});
  b.AddTensor("dup", {2, 4, 8});
  b.AddCompute(ComputeType::kSwigluGrad, {"x_swiglu", "x", "x_add"}, {"dgate", "dup"});
  b.AddCompute(ComputeType::kSoftmax, {"x"}, {"x_softmax"});
  b.AddCompute(ComputeType::kSoftmaxGrad, {"x", "x_softmax"}, {"x_softmax_grad"});
  b.AddTensor("x_bf16", {2, 4, 8}, DType::kBF16);
  b.AddCompute(ComputeType::kCast, {"x"}, {"x_bf16"});
  b.AddTensor("gamma", {8});
  b.AddTensor("beta", {8});
  b.AddTensor("ln", {2, 4, 8});
  b.AddCompute(ComputeType::kLayerNorm, {"x", "gamma", "beta"}, {"ln"}, {{"eps", 1e-5}});
  b.AddTensor("ln_dx", {2, 4, 8});
  b.AddTensor("ln_dgamma", {8});
  b.AddTensor("ln_dbeta", {8});
  b.AddCompute(ComputeType::kLayerNormGrad, {"ln", "x", "gamma"},
               {"ln_dx", "ln_dgamma", "ln_dbeta"});
  b.AddTensor("rms", {2, 4, 8});
  b.AddCompute(ComputeType::kRmsNorm, {"x", "gamma"}, {"rms"});
  b.AddTensor("rms_dx", {2, 4, 8});
  b.AddTensor("rms_dgamma", {8});
  b.AddCompute(ComputeType::kRmsNormGrad, {"rms", "x", "gamma"}, {"rms_dx", "rms_dgamma"});
  b.AddTensor("q", {2, 4, 16});
  b.AddTensor("k", {2, 4, 8});
  b.AddTensor("v", {2, 4, 8});
  b.AddTensor("o", {2, 4, 16});
  b.AddCompute(ComputeType::kAttention, {"q", "k", "v"}, {"o"},
               {{"heads", 4}, {"kv_heads", 2}, {"causal", 1}});
  b.AddTensor("dq", {2, 4, 16});
  b.AddTensor("dk", {2, 4, 8});
  b.AddTensor("dv", {2, 4, 8});
  b.AddCompute(ComputeType::kAttentionGrad, {"o", "q", "k", "v"}, {"dq", "dk", "dv"},
               {{"heads", 4}, {"kv_heads", 2}, {"causal", 1}});
  b.AddTensor("table", {32, 8});
  b.AddTensor("ids", {2, 4}, DType::kI32);
  b.AddTensor("emb", {2, 4, 8});
  b.AddCompute(ComputeType::kEmbedding, {"table", "ids"}, {"emb"});
  b.AddTensor("dtable", {32, 8});
  b.AddCompute(ComputeType::kEmbeddingGrad, {"emb", "ids"}, {"dtable"});
  b.AddTensor("logits", {2, 4, 32});
  b.AddTensor("labels", {2, 4}, DType::kI64);
  b.AddTensor("m", {2, 4});
  b.AddTensor("z", {2, 4});
  b.AddTensor("target", {2, 4});
  b.AddTensor("loss", {});
  b.AddTensor("dlogits", {2, 4, 32});
  b.AddCompute(ComputeType::kReduceMax, {"logits"}, {"m"});
  b.AddCompute(ComputeType::kSumExp, {"logits", "m"}, {"z"});
  b.AddCompute(ComputeType::kGatherTarget, {"logits", "labels"}, {"target"});
  b.AddCompute(ComputeType::kCrossEntropy, {"m", "z", "target"}, {"loss"});
  b.AddCompute(ComputeType::kCrossEntropyGrad, {"logits", "m", "z", "labels"}, {"dlogits"});
  const char* adam_names[] = {"p", "dp_", "am", "av", "p2", "am2", "av2"};
  for (const char* n : adam_names) b.AddTensor(n, {8, 8});
  b.AddCompute(ComputeType::kAdam, {"p", "dp_", "am", "av"}, {"p2", "am2", "av2"},
               {{"lr", 3e-4}, {"beta1", 0.9}, {"beta2", 0.95}, {"eps", 1e-8}, {"step", 7}});
  b.AddTensor("sl", {2, 3, 8});
  b.AddCompute(ComputeType::kSlice, {"x"}, {"sl"}, {{"axis", 1}, {"start", 1}});
  b.AddTensor("cat", {2, 7, 8});
  b.AddCompute(ComputeType::kConcat, {"x", "sl"}, {"cat"}, {{"axis", 1}});
  b.AddTensor("flat", {64});
  b.AddCompute(ComputeType::kIdentity, {"x"}, {"flat"});
  // Mixture of experts: x [G=2, n=4, h=8] routed top-2 over 4 experts with
  // capacity 3 per group: buffers [4, 2*3, 8].
  b.AddTensor("gates", {2, 4, 2});
  b.AddTensor("eids", {2, 4, 2}, DType::kI32);
  b.AddTensor("router_p", {2, 4, 4});
  b.AddCompute(ComputeType::kTopK, {"router_p"}, {"gates", "eids"}, {{"k", 2}, {"normalize", 1}});
  b.AddTensor("drouter_p", {2, 4, 4});
  b.AddCompute(ComputeType::kTopKGrad, {"gates", "eids", "router_p"}, {"drouter_p"}, {{"normalize", 1}});
  b.AddTensor("ebuf", {4, 6, 8});
  b.AddCompute(ComputeType::kMoeDispatch, {"x", "eids"}, {"ebuf"});
  b.AddTensor("ex_grad", {2, 4, 8});
  b.AddCompute(ComputeType::kMoeDispatchGrad, {"ebuf", "eids"}, {"ex_grad"});
  b.AddTensor("ecomb", {2, 4, 8});
  b.AddCompute(ComputeType::kMoeCombine, {"ebuf", "eids", "gates"}, {"ecomb"});
  b.AddTensor("debuf", {4, 6, 8});
  b.AddTensor("dgates", {2, 4, 2});
  b.AddCompute(ComputeType::kMoeCombineGrad, {"ecomb", "ebuf", "eids", "gates"}, {"debuf", "dgates"});
  b.AddTensor("ebuf_t", {6, 4, 8});
  b.AddCompute(ComputeType::kTranspose, {"ebuf"}, {"ebuf_t"}, {{"axis0", 0}, {"axis1", 1}});
  // Convolutional: img [2, 3, 6, 5] * filt [4, 3, 3, 2], stride 2, padding 1
  // -> [2, 4, 3, 3]; relu; max_pool2d kernel 2 (stride 2) -> [2, 4, 1, 1].
  b.AddTensor("img", {2, 3, 6, 5});
  b.AddTensor("filt", {4, 3, 3, 2});
  b.AddTensor("conv", {2, 4, 3, 3});
  b.AddCompute(ComputeType::kConv2d, {"img", "filt"}, {"conv"}, {{"stride", 2}, {"padding", 1}});
  b.AddTensor("dimg", {2, 3, 6, 5});
  b.AddTensor("dfilt", {4, 3, 3, 2});
  b.AddCompute(ComputeType::kConv2dGrad, {"conv", "img", "filt"}, {"dimg", "dfilt"}, {{"stride", 2}, {"padding", 1}});
  b.AddTensor("act", {2, 4, 3, 3});
  b.AddCompute(ComputeType::kRelu, {"conv"}, {"act"});
  b.AddTensor("dact", {2, 4, 3, 3});
  b.AddCompute(ComputeType::kReluGrad, {"act", "conv"}, {"dact"});
  b.AddTensor("pooled", {2, 4, 1, 1});
  b.AddCompute(ComputeType::kMaxPool2d, {"act"}, {"pooled"}, {{"kernel", 2}});
  b.AddTensor("dpool", {2, 4, 3, 3});
  b.AddCompute(ComputeType::kMaxPool2dGrad, {"pooled", "act"}, {"dpool"}, {{"kernel", 2}});
  b.AddTensor("bn_g", {4});
  b.AddTensor("bn_b", {4});
  b.AddTensor("bn", {2, 4, 3, 3});
  b.AddTensor("bn_mean", {4});
  b.AddTensor("bn_invstd", {4});
  b.AddCompute(ComputeType::kBatchNorm, {"conv", "bn_g", "bn_b"}, {"bn", "bn_mean", "bn_invstd"}, {{"eps", 1e-5}});
  b.AddTensor("bn_dx", {2, 4, 3, 3});
  b.AddTensor("bn_dg", {4});
  b.AddTensor("bn_db", {4});
  b.AddCompute(ComputeType::kBatchNormGrad, {"bn", "conv", "bn_g", "bn_mean", "bn_invstd"}, {"bn_dx", "bn_dg", "bn_db"},
               {{"eps", 1e-5}});
  // Synchronised batch norm: the sum and squared deviations, the forward and
  // backward reading them.
  b.AddTensor("bn_sum", {1, 4});
  b.AddCompute(ComputeType::kBatchNormStats, {"conv"}, {"bn_sum"});
  b.AddTensor("bn_sqdev", {1, 4});
  b.AddCompute(ComputeType::kBatchNormStats, {"conv", "bn_sum"}, {"bn_sqdev"}, {{"count", 18}});
  b.AddTensor("sbn", {2, 4, 3, 3});
  b.AddTensor("sbn_mean", {4});
  b.AddTensor("sbn_invstd", {4});
  b.AddCompute(ComputeType::kBatchNorm, {"conv", "bn_g", "bn_b", "bn_sum", "bn_sqdev"},
               {"sbn", "sbn_mean", "sbn_invstd"}, {{"eps", 1e-5}, {"count", 18}});
  b.AddTensor("sbn_gsums", {2, 4});
  b.AddCompute(ComputeType::kBatchNormGradStats, {"sbn", "conv", "sbn_mean", "sbn_invstd"}, {"sbn_gsums"});
  b.AddTensor("sbn_dx", {2, 4, 3, 3});
  b.AddTensor("sbn_dg", {4});
  b.AddTensor("sbn_db", {4});
  b.AddCompute(ComputeType::kBatchNormGrad, {"sbn", "conv", "bn_g", "sbn_mean", "sbn_invstd", "sbn_gsums"},
               {"sbn_dx", "sbn_dg", "sbn_db"}, {{"eps", 1e-5}, {"count", 18}});
  return b.graph();
}

/// Comm ops on a dp=2 x tp=2 mesh: every collective, fused, explicit groups,
/// copy, send/recv, control deps, durations, fused_from, a third stream.
Graph CommZoo(const std::string& name, int tp_offset) {
  GraphBuilder b(name);
  b.graph().streams = {"compute", "comm", "comm_dp"};
  b.AddTensor("g", {8, 4});
  b.AddTensor("g_sum", {8, 4});
  b.AddTensor("h", {6});
  b.AddTensor("h_sum", {6});
  b.AddCollective(CollectiveType::kAllReduce, {{"dp"}, {}}, {"g", "h"}, {"g_sum", "h_sum"},
                  "comm_dp")
      .fused_from = {100, 101};
  b.AddTensor("ag", {8, 16});
  b.AddCollective(CollectiveType::kAllGather, {{"dp", "tp"}, {}}, {"g"}, {"ag"});
  b.AddTensor("rs", {2, 4});
  b.AddCollective(CollectiveType::kReduceScatter, {{"tp", "dp"}, {}}, {"g"}, {"rs"}).reduce =
      ReduceOp::kMax;
  b.AddTensor("a2a", {4, 8});
  b.AddCollective(CollectiveType::kAllToAll, {{"tp"}, {}}, {"g"}, {"a2a"});
  b.AddTensor("bc", {8, 4});
  b.AddCollective(CollectiveType::kBroadcast, {{}, {0, 1, 2, 3}}, {"g"}, {"bc"});
  b.AddTensor("g_copy", {8, 4});
  Op& copy = b.NewOp(OpKind::kCopy, "offload", {"g"}, {"g_copy"});
  copy.bytes = 128;
  copy.duration_us = 3.25;
  Op& send = b.NewOp(OpKind::kSend, "send", {"g_copy"}, {});
  send.peer = {"tp", tp_offset, -1};
  send.tag = 7;
  send.message_bytes = 128;
  b.AddTensor("r", {8, 4});
  Op& recv = b.NewOp(OpKind::kRecv, "recv", {}, {"r"});
  recv.peer = {"tp", tp_offset, -1};
  recv.tag = 7;
  recv.message_bytes = 128;
  recv.control_deps = {send.id};
  recv.tags = {Phase::kOptimizer, 5, 2, "pipeline"};
  return b.graph();
}

/// A 4-rank program: ranks 0 and 1 run the compute zoo, ranks 2 and 3 (one
/// tp pair) exchange messages, each with its own graph.
Program GeneratedProgram() {
  Program p;
  p.name = "generated";
  p.mesh.axes = {{"dp", 2}, {"tp", 2}};
  p.graphs = {ComputeZoo(), CommZoo("comm_a", 1), CommZoo("comm_b", -1)};
  p.roles = {{"compute", "zoo", {1, 0}}, {"left", "comm_a", {2}}, {"right", "comm_b", {3}}};
  return p;
}

// --- examples and round trips -------------------------------------------------

TEST(IrJson, ExamplesParseAndRoundTrip) {
  for (const auto& name : kExamples) {
    SCOPED_TRACE(name);
    Result<Program> p = ReadProgramFile(ExamplePath(name));
    ASSERT_TRUE(p.ok()) << p.status().message();
    ExpectRoundTrip(*p);
  }
}

TEST(IrJson, DocumentationExampleParsesAndNamesEveryComputeType) {
  const std::string doc = ReadText(std::string(CONCERTO_SOURCE_DIR) + "/docs/ir.md");
  size_t begin = doc.find("```json\n");
  ASSERT_NE(begin, std::string::npos);
  begin += 8;
  size_t end = doc.find("```", begin);
  ASSERT_NE(end, std::string::npos);
  Result<Program> p = ParseProgram(doc.substr(begin, end - begin), "docs/ir.md");
  ASSERT_TRUE(p.ok()) << p.status().message();
  ExpectRoundTrip(*p);
  for (std::string_view type : AllComputeTypeNames())
    EXPECT_NE(doc.find("| `" + std::string(type) + "` |"), std::string::npos) << type;
}

TEST(IrJson, GeneratedProgramVerifiesAndRoundTrips) {
  Program p = GeneratedProgram();
  std::vector<std::string> violations = VerifyProgram(p);
  for (const auto& v : violations) ADD_FAILURE() << v;
  ExpectRoundTrip(p);
}

TEST(IrJson, ComputeZooCoversEveryComputeType) {
  std::set<ComputeType> seen;
  for (const Op& op : ComputeZoo().ops) seen.insert(op.compute_type);
  EXPECT_EQ(seen.size(), AllComputeTypeNames().size());
}

TEST(IrJson, DefaultsApplyToOmittedFields) {
  const std::string text = R"({
    "format": "concerto-ir", "version": 1,
    "mesh": {"axes": [{"name": "dp", "size": 2}]},
    "graphs": [{"name": "g",
      "tensors": [{"name": "a", "shape": [2, 3], "dtype": "f32"},
                  {"name": "b", "shape": [2, 3], "dtype": "f32"},
                  {"name": "c", "shape": [2, 3], "dtype": "f32"}],
      "ops": [{"id": 0, "kind": "compute", "type": "gelu", "inputs": ["a"], "outputs": ["b"]},
              {"id": 1, "kind": "collective", "collective": "all_reduce",
               "group": {"axes": ["dp"]}, "inputs": ["b"], "outputs": ["c"]}]}]})";
  Result<Program> p = ParseProgram(text, "defaults.json");
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->name, "");
  const Graph& g = p->graphs[0];
  EXPECT_EQ(g.streams, (std::vector<std::string>{"compute", "comm"}));
  EXPECT_EQ(g.tensors[0].sharding, (std::vector<std::vector<std::string>>{{}, {}}));
  EXPECT_TRUE(g.tensors[0].partial.empty());
  const Op& gelu = g.ops[0];
  EXPECT_EQ(gelu.name, "");
  EXPECT_EQ(gelu.stream, "compute");
  EXPECT_TRUE(gelu.attrs.empty());
  EXPECT_EQ(gelu.flops, 0);
  EXPECT_EQ(gelu.bytes, 0);
  EXPECT_FALSE(gelu.duration_us.has_value());
  EXPECT_EQ(gelu.tags.phase, Phase::kNone);
  EXPECT_EQ(gelu.tags.layer, -1);
  EXPECT_EQ(gelu.tags.microbatch, -1);
  EXPECT_EQ(gelu.tags.purpose, "");
  const Op& ar = g.ops[1];
  EXPECT_EQ(ar.stream, "comm");
  EXPECT_EQ(ar.reduce, ReduceOp::kSum);
  EXPECT_EQ(ar.message_bytes, 2 * 3 * 4);  // derived from the input tensor
  ASSERT_EQ(p->roles.size(), 1u);
  EXPECT_EQ(p->roles[0].name, "g");
  EXPECT_EQ(p->roles[0].graph, "g");
  EXPECT_EQ(p->roles[0].ranks, (std::vector<int>{0, 1}));
}

TEST(IrJson, WriterWritesIntegralDoublesAsIntegersAndEveryField) {
  Result<Program> p = ReadProgramFile(ExamplePath("dp_matmul_allreduce.json"));
  ASSERT_TRUE(p.ok()) << p.status().message();
  p->graphs[0].ops[0].flops = 1.0e9;
  p->graphs[0].ops[0].bytes = 0.5;
  std::string text = WriteProgram(*p);
  EXPECT_NE(text.find("\"flops\": 1000000000,"), std::string::npos) << text;
  EXPECT_NE(text.find("\"bytes\": 0.5,"), std::string::npos);
  EXPECT_NE(text.find("\"duration_us\": null"), std::string::npos);
  EXPECT_NE(text.find("\"duration_us\": 2.5"), std::string::npos);
  EXPECT_NE(text.find("\"fused_from\": []"), std::string::npos);
  EXPECT_NE(text.find("\"streams\": [\"compute\", \"comm\"]"), std::string::npos);
  EXPECT_EQ(text.find("1e+09"), std::string::npos);
  EXPECT_EQ(text.rfind("{\n  \"format\": \"concerto-ir\",\n  \"version\": 1,", 0), 0u);
}

// The writer converts one tensor or op at a time (a document tree of the
// whole program cost about 3 KB an op) and must still lay the text out as the
// document writer does: containers within 100 columns on one line, the rest
// one member per line. tests/golden/writer/: NAME.json in, NAME.expected.json
// out. send_recv: each graph's single tensor fits on its line inside a graph
// that spans lines (an op never fits); idle_graph: a graph without ops (its
// tensors on one line) beside one whose two tensors do not fit.
TEST(IrJson, WriterLayoutMatchesTheGoldenFiles) {
  for (const std::string name : {"send_recv", "idle_graph"}) {
    const std::string dir = std::string(CONCERTO_SOURCE_DIR) + "/tests/golden/writer/";
    Result<Program> p = ReadProgramFile(dir + name + ".json");
    ASSERT_TRUE(p.ok()) << p.status().message();
    EXPECT_EQ(WriteProgram(*p), ReadText(dir + name + ".expected.json")) << name;
  }
}

TEST(IrJson, IntegralFloatsAreAcceptedForIntegerFields) {
  std::string text = ReadText(ExamplePath("dp_matmul_allreduce.json"));
  size_t at = text.find("\"size\": 2");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 9, "\"size\": 2.0");
  Result<Program> p = ParseProgram(text, "float_int.json");
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->mesh.axes[0].size, 2);
}

TEST(IrJson, MissingFileIsAnError) {
  Result<Program> p = ReadProgramFile("/no/such/dir/prog.json");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("/no/such/dir/prog.json"), std::string::npos);
}

// --- robustness -----------------------------------------------------------------

TEST(IrJson, EveryTruncationIsRejectedWithoutCrashing) {
  std::string text = WriteProgram(GeneratedProgram());
  size_t end = text.find_last_not_of(" \n") + 1;
  for (size_t len = 0; len < end; len += 13) {
    Result<Program> p = ParseProgram(text.substr(0, len), "cut.json");
    ASSERT_FALSE(p.ok()) << len;
    EXPECT_EQ(p.status().message().rfind("cut.json", 0), 0u) << p.status().message();
  }
}

TEST(IrJson, RandomMutationsNeverCrash) {
  const std::string text = WriteProgram(GeneratedProgram());
  std::mt19937 rng(1234);
  const std::string alphabet = "{}[]\",:0123456789-+.eE abcxyz\\";
  int rejected = 0;
  for (int round = 0; round < 1500; ++round) {
    std::string t = text;
    for (int k = 0; k < 3; ++k) t[rng() % t.size()] = alphabet[rng() % alphabet.size()];
    Result<Program> p = ParseProgram(t, "mut.json");
    if (!p.ok()) {
      ++rejected;
      EXPECT_EQ(p.status().message().rfind("mut.json", 0), 0u) << p.status().message();
    }
  }
  EXPECT_GT(rejected, 0);
}

TEST(IrJson, DeepNestingIsRejectedWithoutCrashing) {
  std::string deep = "{\"format\": " + std::string(200000, '[') + std::string(200000, ']') + "}";
  EXPECT_FALSE(ParseProgram(deep, "deep.json").ok());
  std::string unclosed(300000, '{');
  EXPECT_FALSE(ParseProgram(unclosed, "deep.json").ok());
}

TEST(IrJson, MalformedJsonReportsLineAndColumn) {
  Result<Program> p =
      ParseProgram("{\n  \"format\": \"concerto-ir\",\n  \"version\": 1,,\n}", "m.json");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("m.json:3:16: malformed JSON"), std::string::npos)
      << p.status().message();
}

TEST(IrJson, OverflowingNumberNamesItsField) {
  std::string text = ReadText(ExamplePath("dp_matmul_allreduce.json"));
  size_t at = text.find("\"flops\": 1024");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 13, "\"flops\": -1e999");
  Result<Program> p = ParseProgram(text, "inf.json");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("op 0 'fc.fwd': field 'flops': non-finite number '-1e999'"),
            std::string::npos)
      << p.status().message();
}

TEST(IrJson, OverflowingNumberInAnUnreadPlaceIsStillRejected) {
  std::string text = ReadText(ExamplePath("dp_matmul_allreduce.json"));
  size_t at = text.find("\"name\": \"dp2_linear\"");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 20, "\"name\": 1e400");
  Result<Program> p = ParseProgram(text, "inf2.json");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("non-finite number '1e400'"), std::string::npos)
      << p.status().message();
}

// --- scale --------------------------------------------------------------------------

/// A chain of `n` add ops with control deps, on one rank.
Program Chain(int n) {
  Program p;
  p.name = "chain";
  p.mesh.axes = {{"dp", 1}};
  GraphBuilder b("main");
  b.AddTensor("t0", {16, 16});
  b.AddTensor("bias", {16});
  std::string prev = "t0";
  for (int i = 0; i < n; ++i) {
    std::string next = std::string("t").append(std::to_string(i + 1));
    b.AddTensor(next, {16, 16});
    Op& op = b.AddCompute(ComputeType::kAdd, {prev, "bias"}, {next});
    prev = next;
    if (i > 0) op.control_deps = {op.id - 2};
  }
  p.graphs = {b.graph()};
  p.roles = {{"main", "main", {0}}};
  return p;
}

// A 100k-op program round-trips (the times are printed, not asserted: a
// test's answer never depends on the machine's speed; bench/ measures them).
TEST(IrJson, HundredThousandOpsRoundTrip) {
  Program p = Chain(100000);
  auto t0 = std::chrono::steady_clock::now();
  std::string text = WriteProgram(p);
  auto t1 = std::chrono::steady_clock::now();
  Result<Program> back = ParseProgram(text, "big.json");
  auto t2 = std::chrono::steady_clock::now();
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->graphs[0].ops.size(), 100000u);
  double write_s = std::chrono::duration<double>(t1 - t0).count();
  double read_s = std::chrono::duration<double>(t2 - t1).count();
  std::printf("100k ops: %.1f MB, write %.2f s, read+verify %.2f s\n", text.size() / 1e6, write_s,
              read_s);
  EXPECT_EQ(WriteProgram(*back), text);
}

TEST(IrVerifier, LongCycleIsFoundIterativelyAndAbbreviated) {
  Program p = Chain(100000);
  Graph& g = p.graphs[0];
  g.ops[0].control_deps = {g.ops.back().id};
  std::vector<std::string> v = VerifyGraph(g, p.mesh);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_NE(v[0].find("cycle through op 1 'add.0' -> "), std::string::npos) << v[0];
  EXPECT_NE(v[0].find("more)"), std::string::npos);
  EXPECT_LT(v[0].size(), 1000u);
}

// --- the verifier ------------------------------------------------------------------

Program Example(const std::string& name) {
  Result<Program> p = ReadProgramFile(ExamplePath(name));
  EXPECT_TRUE(p.ok()) << p.status().message();
  return p.ok() ? *p : Program{};
}

bool AnyContains(const std::vector<std::string>& lines, const std::string& needle) {
  for (const auto& l : lines)
    if (l.find(needle) != std::string::npos) return true;
  return false;
}

TEST(IrVerifier, ListsEveryViolationNamingGraphAndOp) {
  Program p = Example("two_comm_streams.json");
  Graph& g = p.graphs[0];
  g.ops[1].stream = "nowhere";
  g.ops[2].inputs = {"ghost"};
  g.ops[3].control_deps = {999};
  g.ops[4].group.axes = {"ep"};
  g.ops[5].flops = -1;
  g.tensors[0].sharding = {{"dp"}};
  std::vector<std::string> v = VerifyProgram(p);
  EXPECT_TRUE(
      AnyContains(v, "graph 'main': op 1 'fc1.fwd': field 'stream': unknown stream 'nowhere'"));
  EXPECT_TRUE(AnyContains(
      v, "graph 'main': op 2 'gelu.fwd': field 'inputs': dangling tensor reference 'ghost'"));
  EXPECT_TRUE(AnyContains(
      v, "graph 'main': op 3 'fc2.fwd': field 'control_deps': dangling control dep 999"));
  EXPECT_TRUE(
      AnyContains(v, "graph 'main': op 4 'fc2.all_reduce': field 'group': unknown mesh axis 'ep'"));
  EXPECT_TRUE(AnyContains(v, "graph 'main': op 5 'fc2.dw': field 'flops': negative value -1"));
  EXPECT_TRUE(AnyContains(v, "graph 'main': tensor 'x': field 'sharding': has 1 entries"));
  EXPECT_EQ(v.size(), 6u);
  Status st = CheckProgram(p, "prog.json");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message().rfind("prog.json: ", 0), 0u);
}

TEST(IrVerifier, AcceptsEmptyShardingAsReplicated) {
  Program p = Example("dp_matmul_allreduce.json");
  for (Tensor& t : p.graphs[0].tensors) t.sharding.clear();
  EXPECT_TRUE(VerifyProgram(p).empty());
}

TEST(IrVerifier, NonFiniteValuesFromPassesAreCaught) {
  Program p = Example("dp_matmul_allreduce.json");
  p.graphs[0].ops[0].duration_us = std::numeric_limits<double>::infinity();
  p.graphs[0].ops[1].bytes = std::nan("");
  std::vector<std::string> v = VerifyProgram(p);
  EXPECT_TRUE(AnyContains(v, "op 0 'fc.fwd': field 'duration_us': non-finite"));
  EXPECT_TRUE(AnyContains(v, "op 1 'fc.dw': field 'bytes': non-finite"));
}

TEST(IrVerifier, SelfDependenceIsACycle) {
  Program p = Example("dp_matmul_allreduce.json");
  p.graphs[0].ops[1].control_deps = {1};
  std::vector<std::string> v = VerifyProgram(p);
  EXPECT_TRUE(AnyContains(v, "cycle through op 1 'fc.dw' -> op 1 'fc.dw'"));
}

TEST(IrVerifier, ThreeOpCycleIsPrintedInDependenceOrder) {
  Program p = Example("two_comm_streams.json");
  // gelu (2) reads h from fc1 (1); make fc1 wait on fc2 (3), which reads gelu's g.
  p.graphs[0].ops[1].control_deps = {3};
  std::vector<std::string> v = VerifyProgram(p);
  EXPECT_TRUE(AnyContains(
      v, "cycle through op 1 'fc1.fwd' -> op 2 'gelu.fwd' -> op 3 'fc2.fwd' -> op 1 'fc1.fwd'"))
      << (v.empty() ? "" : v[0]);
}

TEST(IrVerifier, MeshWithZeroAxisSizeDoesNotCrash) {
  Program p = Example("two_comm_streams.json");
  p.mesh.axes[1].size = 0;
  std::vector<std::string> v = VerifyProgram(p);
  EXPECT_TRUE(AnyContains(v, "mesh: axis 1 'tp': field 'size': must be >= 1, got 0"));
}

TEST(IrVerifier, SendRecvMustPair) {
  Program p = Example("pipeline_2stage.json");
  p.graphs[1].ops[0].message_bytes = 100;  // recv.h expects 100 bytes, send.h sends 256
  std::vector<std::string> v = VerifyProgram(p);
  EXPECT_TRUE(AnyContains(v, "send/recv mismatch from rank 0 to rank 1 tag 0: message 0"));
  p = Example("pipeline_2stage.json");
  p.graphs[0].ops[1].tag = 5;
  v = VerifyProgram(p);
  EXPECT_TRUE(
      AnyContains(v, "send/recv mismatch from rank 0 to rank 1 tag 5: 1 send(s) but 0 recv(s)"));
}

TEST(IrVerifier, ExplicitGroupMustContainTheRanksThatRunIt) {
  Program p = Example("two_comm_streams.json");
  p.graphs[0].ops[4].group = {{}, {0, 1}};
  std::vector<std::string> v = VerifyProgram(p);
  EXPECT_TRUE(AnyContains(v,
                          "role 'spmd' rank 2: graph 'main': op 4 'fc2.all_reduce': group [0, 1] "
                          "does not contain the rank"));
}

// --- shape rules --------------------------------------------------------------------

/// The resolved operands of one op in `g`.
struct Operands {
  std::vector<const Tensor*> in, out;
};

Operands Resolve(const Graph& g, const Op& op) {
  GraphIndex index = GraphIndex::Build(g);
  Operands o;
  for (const auto& n : op.inputs) o.in.push_back(&g.tensors[index.tensor.at(n)]);
  for (const auto& n : op.outputs) o.out.push_back(&g.tensors[index.tensor.at(n)]);
  return o;
}

TEST(IrShapes, EveryComputeTypeRejectsAWrongOutputShape) {
  const Graph zoo = ComputeZoo();
  for (const Op& op : zoo.ops) {
    Graph g = zoo;
    GraphIndex index = GraphIndex::Build(g);
    Operands ok = Resolve(g, op);
    EXPECT_EQ(CheckComputeShapes(op, ok.in, ok.out), "") << OpLabel(op);
    g.tensors[index.tensor.at(op.outputs[0])].shape.push_back(2);
    Operands bad = Resolve(g, op);
    EXPECT_NE(CheckComputeShapes(op, bad.in, bad.out), "") << OpLabel(op);
  }
}

TEST(IrShapes, EveryComputeTypeChecksItsOperandCounts) {
  const Graph zoo = ComputeZoo();
  for (const Op& op : zoo.ops) {
    Operands o = Resolve(zoo, op);
    o.out.push_back(o.out[0]);
    EXPECT_NE(CheckComputeShapes(op, o.in, o.out), "") << OpLabel(op);
  }
}

/// Finds the op of `type` in the zoo, applies `edit` to the graph and returns
/// the shape check message.
template <typename Edit>
std::string ZooCheck(ComputeType type, Edit edit) {
  Graph g = ComputeZoo();
  auto& ops = g.ops;
  auto it =
      std::find_if(ops.begin(), ops.end(), [&](const Op& op) { return op.compute_type == type; });
  EXPECT_NE(it, ops.end());
  GraphIndex index = GraphIndex::Build(g);
  auto tensor = [&](const std::string& name) -> Tensor& {
    return g.tensors[index.tensor.at(name)];
  };
  edit(*it, tensor);
  Operands o = Resolve(g, *it);
  return CheckComputeShapes(*it, o.in, o.out);
}

using TensorRef = std::function<Tensor&(const std::string&)>;

TEST(IrShapes, InputRules) {
  EXPECT_NE(ZooCheck(ComputeType::kMatmul,
                     [](Op&, TensorRef t) {
                       t("b2").shape = {4, 6};
                     })
                .find("inner dimensions differ"),
            std::string::npos);
  EXPECT_NE(ZooCheck(ComputeType::kMatmul, [](Op& op, TensorRef) { op.attrs["transpose_b"] = 1; }),
            "");
  EXPECT_NE(ZooCheck(ComputeType::kMatmul,
                     [](Op&, TensorRef t) {
                       t("b2").shape = {3, 5, 6};
                     })
                .find("batch dimensions differ"),
            std::string::npos);
  EXPECT_NE(ZooCheck(ComputeType::kAdd, [](Op&, TensorRef t) { t("bias").shape = {4}; }), "");
  EXPECT_EQ(ZooCheck(ComputeType::kAdd, [](Op&, TensorRef t) { t("bias").shape = {4, 8}; }), "");
  EXPECT_NE(ZooCheck(ComputeType::kMul, [](Op&, TensorRef t) { t("x_add").shape = {8}; }), "");
  EXPECT_NE(ZooCheck(ComputeType::kLayerNorm, [](Op&, TensorRef t) { t("beta").shape = {4}; }), "");
  EXPECT_NE(ZooCheck(ComputeType::kRmsNorm,
                     [](Op&, TensorRef t) {
                       t("gamma").shape = {2, 8};
                     }),
            "");
  EXPECT_NE(ZooCheck(ComputeType::kAttention, [](Op& op, TensorRef) { op.attrs["heads"] = 3; }),
            "");
  EXPECT_NE(ZooCheck(ComputeType::kAttention, [](Op& op, TensorRef) { op.attrs.erase("heads"); })
                .find("missing attribute 'heads'"),
            std::string::npos);
  EXPECT_NE(ZooCheck(ComputeType::kAttention, [](Op& op, TensorRef) { op.attrs["kv_heads"] = 4; }),
            "");
  EXPECT_EQ(ZooCheck(ComputeType::kAttention,
                     [](Op& op, TensorRef t) {
                       op.attrs["kv_heads"] = 4;
                       t("k").shape = {2, 4, 16};
                       t("v").shape = {2, 4, 16};
                     }),
            "");
  EXPECT_NE(
      ZooCheck(ComputeType::kEmbedding, [](Op&, TensorRef t) { t("ids").dtype = DType::kF32; })
          .find("integer dtype"),
      std::string::npos);
  EXPECT_NE(ZooCheck(ComputeType::kGatherTarget, [](Op&, TensorRef t) { t("labels").shape = {2}; }),
            "");
  EXPECT_NE(ZooCheck(ComputeType::kSumExp, [](Op&, TensorRef t) { t("m").shape = {2, 4, 1}; }), "");
  EXPECT_NE(ZooCheck(ComputeType::kSlice, [](Op& op, TensorRef) { op.attrs["start"] = 2; }), "");
  EXPECT_NE(ZooCheck(ComputeType::kSlice, [](Op& op, TensorRef) { op.attrs["axis"] = 3; }), "");
  EXPECT_NE(ZooCheck(ComputeType::kSlice, [](Op& op, TensorRef) { op.attrs["axis"] = 0.5; })
                .find("must be an integer"),
            std::string::npos);
  EXPECT_NE(ZooCheck(ComputeType::kConcat,
                     [](Op&, TensorRef t) {
                       t("sl").shape = {2, 3, 9};
                     }),
            "");
  EXPECT_NE(ZooCheck(ComputeType::kAdam, [](Op&, TensorRef t) { t("av").shape = {8}; }), "");
  EXPECT_NE(ZooCheck(ComputeType::kEmbeddingGrad,
                     [](Op&, TensorRef t) {
                       t("dtable").shape = {32, 4};
                     }),
            "");
  EXPECT_NE(ZooCheck(ComputeType::kCrossEntropyGrad, [](Op&, TensorRef t) { t("z").shape = {2}; }),
            "");
  EXPECT_EQ(ZooCheck(ComputeType::kCrossEntropy, [](Op&, TensorRef t) { t("loss").shape = {1}; }),
            "");
}

TEST(IrShapes, CollectiveRules) {
  Tensor a{"a", {8, 4}, DType::kF32, {}, {}};
  Tensor a_bf{"a_bf", {8, 4}, DType::kBF16, {}, {}};
  Tensor rows4{"rows4", {32, 4}, DType::kF32, {}, {}};
  Tensor cols4{"cols4", {8, 16}, DType::kF32, {}, {}};
  Tensor quarter{"quarter", {2, 4}, DType::kF32, {}, {}};
  Tensor flat{"flat", {32}, DType::kF32, {}, {}};
  Op op;
  op.kind = OpKind::kCollective;
  auto check = [&](CollectiveType type, std::vector<const Tensor*> in,
                   std::vector<const Tensor*> out, int group_size) {
    op.collective = type;
    return CheckCollectiveShapes(op, in, out, group_size);
  };
  using C = CollectiveType;
  EXPECT_EQ(check(C::kAllReduce, {&a}, {&a}, 4), "");
  EXPECT_NE(check(C::kAllReduce, {&a}, {&rows4}, 4), "");
  EXPECT_NE(check(C::kAllReduce, {&a}, {&a_bf}, 4).find("dtype"), std::string::npos);
  EXPECT_EQ(check(C::kAllReduce, {&a, &flat}, {&a, &flat}, 4), "");  // fused
  EXPECT_NE(check(C::kAllReduce, {&a, &flat}, {&a, &a}, 4), "");
  EXPECT_NE(check(C::kAllReduce, {}, {}, 4).find("at least one input"), std::string::npos);
  EXPECT_NE(check(C::kAllReduce, {&a}, {}, 4), "");
  EXPECT_EQ(check(C::kAllGather, {&a}, {&rows4}, 4), "");
  EXPECT_EQ(check(C::kAllGather, {&a}, {&cols4}, 4), "");
  EXPECT_NE(check(C::kAllGather, {&a}, {&cols4}, 2), "");
  EXPECT_EQ(check(C::kAllGather, {&a}, {&a}, 1), "");
  EXPECT_EQ(check(C::kReduceScatter, {&a}, {&quarter}, 4), "");
  EXPECT_NE(check(C::kReduceScatter, {&a}, {&quarter}, 2), "");
  EXPECT_EQ(check(C::kAllToAll, {&a}, {&flat}, 4), "");
  EXPECT_NE(check(C::kAllToAll, {&a}, {&quarter}, 4), "");
  EXPECT_NE(check(C::kAllToAll, {&a}, {&flat}, 3).find("equal chunks"), std::string::npos);
  EXPECT_EQ(check(C::kBroadcast, {&a}, {&a}, 4), "");
  EXPECT_NE(check(C::kBroadcast, {&a}, {&flat}, 4), "");
}

TEST(IrShapes, GroupRankCountIsTheProductOfAxesOrTheRankCount) {
  Mesh mesh;
  mesh.axes = {{"dp", 2}, {"tp", 4}, {"pp", 3}};
  EXPECT_EQ(GroupRankCount(mesh, {{"dp", "pp"}, {}}), 6);
  EXPECT_EQ(GroupRankCount(mesh, {{}, {3, 5, 7}}), 3);
  EXPECT_EQ(GroupRankCount(mesh, {{}, {}}), 1);
  EXPECT_EQ(GroupRankCount(mesh, {{"ep"}, {}}), 0);
  EXPECT_EQ(GroupRanks(mesh, {{"dp", "pp"}, {}}, 5).size(), 6u);
}

}  // namespace
}  // namespace concerto
