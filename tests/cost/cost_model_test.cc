// Tests of the cost model: cluster presets and files, the analytic model
// (hand-computed values, arithmetic in the comments), the profile database,
// source precedence and SummarizeCosts.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "concerto/cost/cluster.h"
#include "concerto/cost/cost_model.h"
#include "concerto/ir/graph_index.h"
#include "concerto/ir/op_registry.h"
#include "concerto/ir/ir.h"

namespace concerto {
namespace {

constexpr int64_t kMiB = 1 << 20;
constexpr int64_t k256MiB = 256 * kMiB;  // 268,435,456 bytes

/// The a800-4x8 preset (asserts that it loads).
ClusterSpec A800() {
  Result<ClusterSpec> c = LoadCluster("a800-4x8");
  EXPECT_TRUE(c.ok()) << c.status().message();
  return *c;
}

/// dp=4 x tp=8: rank = 8 * dp + tp, so a tp group is one node of a800-4x8
/// and a dp group has one rank on each of the 4 nodes.
Mesh DpTpMesh() {
  Mesh m;
  m.axes = {{"dp", 4}, {"tp", 8}};
  return m;
}

/// Writes `text` to a fresh file under the test temp dir and returns its path.
std::string WriteTestFile(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream out(path, std::ios::binary);
  out << text;
  return path;
}

/// A graph with a few tensors and ops, plus its index; ops are appended by tests.
struct Fixture {
  Graph graph;
  GraphIndex index;
  Mesh mesh = DpTpMesh();

  void AddTensor(const std::string& name, std::vector<int64_t> shape, DType dtype = DType::kBF16) {
    Tensor t;
    t.name = name;
    t.shape = std::move(shape);
    t.dtype = dtype;
    graph.tensors.push_back(t);
  }
  void Reindex() { index = GraphIndex::Build(graph); }
  PriceContext Ctx(int rank = 0) const { return PriceContext{graph, index, mesh, rank}; }
};

/// A bf16 tensor.
Tensor MakeTensor(const std::string& name, std::vector<int64_t> shape) {
  Tensor t;
  t.name = name;
  t.shape = std::move(shape);
  return t;
}

Op ComputeOp(int id, ComputeType type, std::vector<std::string> in, std::vector<std::string> out,
             double flops, double bytes) {
  Op op;
  op.id = id;
  op.name = std::string(ToString(type)) + std::to_string(id);
  op.kind = OpKind::kCompute;
  op.stream = "compute";
  op.compute_type = type;
  op.inputs = std::move(in);
  op.outputs = std::move(out);
  op.flops = flops;
  op.bytes = bytes;
  return op;
}

Op CollectiveOp(int id, CollectiveType type, std::vector<std::string> axes, int64_t bytes) {
  Op op;
  op.id = id;
  op.name = std::string(ToString(type)) + std::to_string(id);
  op.kind = OpKind::kCollective;
  op.stream = "comm";
  op.collective = type;
  op.group.axes = std::move(axes);
  op.message_bytes = bytes;
  return op;
}

Op SendOp(int id, const std::string& axis, int offset, int64_t bytes) {
  Op op;
  op.id = id;
  op.name = "send" + std::to_string(id);
  op.kind = OpKind::kSend;
  op.stream = "comm";
  op.peer.axis = axis;
  op.peer.offset = offset;
  op.message_bytes = bytes;
  return op;
}

// ---------------------------------------------------------------------------
// Cluster presets and files.

TEST(CostClusterTest, PresetNamesLoadAndValidate) {
  EXPECT_EQ(ClusterPresetNames(), (std::vector<std::string>{"a800-4x8", "h100-8x8", "commodity-4x8", "a100-dgx"}));
  for (const std::string& name : ClusterPresetNames()) {
    Result<ClusterSpec> c = LoadCluster(name);
    ASSERT_TRUE(c.ok()) << name << ": " << c.status().message();
    EXPECT_EQ(c->name, name);
    EXPECT_TRUE(ValidateCluster(*c, name).ok());
  }
}

TEST(CostClusterTest, A800PresetValues) {
  ClusterSpec c = A800();
  EXPECT_EQ(c.nodes, 4);
  EXPECT_EQ(c.devices_per_node, 8);
  EXPECT_EQ(c.NumDevices(), 32);
  EXPECT_EQ(c.NodeOf(7), 0);
  EXPECT_EQ(c.NodeOf(8), 1);
  EXPECT_EQ(c.device.peak_tflops_bf16, 312);
  EXPECT_EQ(c.device.peak_tflops_fp32, 19.5);
  EXPECT_EQ(c.device.memory_bandwidth_gbps, 2039);
  EXPECT_EQ(c.intra_node.bandwidth_gbps, 185);    // inside the nccl-tests 155-215 GB/s busbw range
  EXPECT_EQ(c.inter_node.bandwidth_gbps, 11.25);  // 90 GB/s achieved per node / 8
  EXPECT_EQ(c.interference, 0.2);
  EXPECT_EQ(c.collective_algorithm, "auto");
}

TEST(CostClusterTest, ExampleYamlEqualsPreset) {
  Result<ClusterSpec> file = LoadCluster(std::string(CONCERTO_SOURCE_DIR) + "/examples/clusters/a800-4x8.yaml");
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_TRUE(*file == A800());
}

TEST(CostClusterTest, ExampleJsonLoads) {
  Result<ClusterSpec> file =
      LoadCluster(std::string(CONCERTO_SOURCE_DIR) + "/examples/clusters/a100-2x8-hdr.json");
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ(file->name, "a100-2x8-hdr");
  EXPECT_EQ(file->NumDevices(), 16);
  EXPECT_EQ(file->intra_node.bandwidth_gbps, 216);
}

TEST(CostClusterTest, JsonRoundTripOfEveryPreset) {
  for (const std::string& name : ClusterPresetNames()) {
    ClusterSpec preset = *LoadCluster(name);
    std::string path = WriteTestFile("roundtrip-" + name + ".json", ClusterToJson(preset));
    Result<ClusterSpec> back = LoadCluster(path);
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_TRUE(*back == preset) << name;
  }
}

TEST(CostClusterTest, BaseOverridesAndNameFromFileStem) {
  std::string path = WriteTestFile("half-a800.yaml", "base: a800-4x8\nnodes: 2\ninter_node:\n  latency_us: 6\n");
  Result<ClusterSpec> c = LoadCluster(path);
  ASSERT_TRUE(c.ok()) << c.status().message();
  ClusterSpec expected = A800();
  expected.name = "half-a800";
  expected.nodes = 2;
  expected.inter_node.latency_us = 6;
  EXPECT_TRUE(*c == expected);
}

TEST(CostClusterTest, BadFilesNameFileAndField) {
  struct Case {
    std::string file, text, expected;  // expected: a substring of the message
  };
  const std::vector<Case> cases = {
      {"neg.yaml", "base: a800-4x8\nintra_node:\n  bandwidth_gbps: -3\n",
       "neg.yaml: field 'intra_node.bandwidth_gbps': must be a positive finite number, got -3"},
      {"unknown.yaml", "base: a800-4x8\ndevice:\n  peak_tflops_bf8: 1\n",
       "unknown.yaml: field 'device.peak_tflops_bf8': unknown key"},
      {"unknown-top.yaml", "base: a800-4x8\ngpus: 8\n", "unknown-top.yaml: field 'gpus': unknown key"},
      {"word.yaml", "base: a800-4x8\nnodes: many\n", "word.yaml: field 'nodes': must be a number, got many"},
      {"frac.yaml", "base: a800-4x8\nnodes: 2.5\n", "frac.yaml: field 'nodes': must be a positive integer"},
      {"eff.yaml", "base: a800-4x8\ndevice: {matmul_efficiency: 1.5}\n",
       "eff.yaml: field 'device.matmul_efficiency': must be a fraction in (0, 1], got 1.5"},
      {"algo.yaml", "base: a800-4x8\ncollective_algorithm: magic\n",
       "algo.yaml: field 'collective_algorithm': must be one of auto, ring, tree, hierarchical"},
      {"notmap.yaml", "base: a800-4x8\ndevice: 3\n", "notmap.yaml: field 'device': must be a map, got 3"},
      {"missing.yaml", "nodes: 1\ndevices_per_node: 8\n",
       "missing.yaml: field 'device.name': missing (required unless 'base' names a preset)"},
      {"base.yaml", "base: b200-9x9\n", "base.yaml: field 'base': unknown preset 'b200-9x9'"},
      {"syntax.yaml", "nodes: [1, 2\n", "syntax.yaml: YAML parse error"},
      {"top.yaml", "- 1\n- 2\n", "top.yaml: top level must be a map"},
      {"str.json", "{\"base\": \"a800-4x8\", \"nodes\": \"4\"}",
       "str.json: field 'nodes': must be a number, got '4'"},
      {"inf.json", "{\"base\": \"a800-4x8\", \"inter_node\": {\"latency_us\": -1}}",
       "inf.json: field 'inter_node.latency_us': must be a non-negative finite number, got -1"},
      {"broken.json", "{\"nodes\": ", "broken.json: JSON parse error"},
  };
  for (const Case& c : cases) {
    std::string path = WriteTestFile(c.file, c.text);
    Result<ClusterSpec> r = LoadCluster(path);
    ASSERT_FALSE(r.ok()) << c.file;
    EXPECT_NE(r.status().message().find(c.expected), std::string::npos)
        << c.file << ": got '" << r.status().message() << "'";
    EXPECT_EQ(r.status().message().rfind(path, 0), 0u) << "message must start with the path";
  }
}

TEST(CostClusterTest, UnknownPresetAndMissingFile) {
  Result<ClusterSpec> r = LoadCluster("tpu-v9");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("unknown cluster 'tpu-v9'"), std::string::npos);
  EXPECT_NE(r.status().message().find("a800-4x8"), std::string::npos);
  r = LoadCluster("/no/such/dir/cluster.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "/no/such/dir/cluster.yaml: no such cluster file");
}

TEST(CostClusterTest, ValidateNamesField) {
  ClusterSpec c = A800();
  c.device.memory_bandwidth_gbps = 0;
  Status st = ValidateCluster(c, "my.yaml");
  EXPECT_EQ(st.message(),
            "my.yaml: field 'device.memory_bandwidth_gbps': must be a positive finite number, got 0");
  c = A800();
  c.devices_per_node = 0;
  EXPECT_NE(ValidateCluster(c, "x").message().find("field 'devices_per_node'"), std::string::npos);
  // The co-run slowdown is a fraction in [0, 10] like interference, and
  // survives the JSON round trip.
  c = A800();
  EXPECT_EQ(c.corun_slowdown, 0);  // GPUs share nothing across devices while computing
  c.corun_slowdown = -0.1;
  EXPECT_EQ(ValidateCluster(c, "my.yaml").message(),
            "my.yaml: field 'corun_slowdown': must be a slowdown fraction in [0, 10], got -0.1");
  c.corun_slowdown = 0.25;
  Result<ClusterSpec> back = ParseCluster(ClusterToJson(c), "c.json", /*json=*/true);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->corun_slowdown, 0.25);
  // Streaming kernels' co-run slowdown: as corun_slowdown unless given.
  EXPECT_EQ(back->corun_slowdown_memory, -1);
  EXPECT_EQ(back->CorunSlowdownMemory(), 0.25);
  c.corun_slowdown_memory = 0.6;
  ASSERT_TRUE(ValidateCluster(c, "my.yaml").ok());
  EXPECT_EQ(ParseCluster(ClusterToJson(c), "c.json", true)->CorunSlowdownMemory(), 0.6);
  EXPECT_EQ(c.comm_corun_slowdown, 0);
  c.comm_corun_slowdown = 0.3;
  EXPECT_EQ(ParseCluster(ClusterToJson(c), "c.json", true)->comm_corun_slowdown, 0.3);
  c.comm_corun_slowdown = -1;
  EXPECT_EQ(ValidateCluster(c, "my.yaml").message(),
            "my.yaml: field 'comm_corun_slowdown': must be a slowdown fraction in [0, 10], got -1");
  c.comm_corun_slowdown = 0;
  EXPECT_EQ(c.comm_corun_latency_us, 0);
  c.comm_corun_latency_us = 2500;
  EXPECT_EQ(ParseCluster(ClusterToJson(c), "c.json", true)->comm_corun_latency_us, 2500);
  c.comm_corun_latency_us = -5;
  EXPECT_EQ(ValidateCluster(c, "my.yaml").message(),
            "my.yaml: field 'comm_corun_latency_us': must be a latency in [0, 1e7] us, got -5");
  c.comm_corun_latency_us = 0;
  // The link's burst and the first part of the co-run wait, in which a
  // transfer moves nothing.
  EXPECT_EQ(c.link_burst_us, 0);
  EXPECT_EQ(c.comm_corun_hold_us, 0);
  c.link_burst_us = 1300;
  c.comm_corun_hold_us = 7000;
  EXPECT_EQ(ParseCluster(ClusterToJson(c), "c.json", true)->link_burst_us, 1300);
  EXPECT_EQ(ParseCluster(ClusterToJson(c), "c.json", true)->comm_corun_hold_us, 7000);
  c.link_burst_us = -1;
  EXPECT_EQ(ValidateCluster(c, "my.yaml").message(),
            "my.yaml: field 'link_burst_us': must be a time in [0, 1e7] us, got -1");
  c.link_burst_us = 0;
  c.comm_corun_hold_us = -2;
  EXPECT_EQ(ValidateCluster(c, "my.yaml").message(),
            "my.yaml: field 'comm_corun_hold_us': must be a time in [0, 1e7] us, got -2");
  c.comm_corun_hold_us = 0;
  // The spread of a rank's compute between synchronisations.
  EXPECT_EQ(c.compute_jitter, 0);
  EXPECT_EQ(ClusterToJson(c).find("compute_jitter"), std::string::npos);  // 0: not written
  c.compute_jitter = 0.07;
  EXPECT_EQ(ParseCluster(ClusterToJson(c), "c.json", true)->compute_jitter, 0.07);
  c.compute_jitter = 1.5;
  EXPECT_EQ(ValidateCluster(c, "my.yaml").message(),
            "my.yaml: field 'compute_jitter': must be a coefficient of variation in [0, 1], got 1.5");
  c.compute_jitter = 0;
  c.corun_slowdown_memory = 11;
  EXPECT_NE(ValidateCluster(c, "my.yaml").message().find("field 'corun_slowdown_memory': must be a slowdown fraction"),
            std::string::npos);
}

TEST(CostClusterTest, MeshMustFitCluster) {
  Mesh m;
  m.axes = {{"dp", 8}, {"tp", 8}};
  EXPECT_FALSE(CheckMeshFitsCluster(m, A800()).ok());
  EXPECT_TRUE(CheckMeshFitsCluster(DpTpMesh(), A800()).ok());
}

// ---------------------------------------------------------------------------
// Analytic compute.

TEST(CostAnalyticTest, LargeGemmIsComputeBound) {
  Fixture f;
  f.AddTensor("a", {8192, 8192});
  f.AddTensor("b", {8192, 8192});
  f.AddTensor("c", {8192, 8192});
  // flops = 2 * 8192^3 = 1,099,511,627,776; bytes = 3 * 8192^2 * 2 = 402,653,184.
  f.graph.ops.push_back(ComputeOp(0, ComputeType::kMatmul, {"a", "b"}, {"c"}, 2.0 * 8192 * 8192 * 8192,
                                  3.0 * 8192 * 8192 * 2));
  f.Reindex();
  AnalyticCostModel model(A800());
  // compute: 1.0995e12 / (312e12 * 0.87 = 271.44e12 FLOP/s) = 4050.66 us
  // memory:  4.0265e8 / (2039e9 * 0.85 = 1733.15e9 B/s)     =  232.32 us
  // max + launch 4 us = 4054.66 us
  PricedOp p = model.Price(f.graph.ops[0], f.Ctx());
  EXPECT_EQ(p.source, CostSource::kAnalytic);
  EXPECT_NEAR(p.duration_us, 4054.66, 0.01);
}

TEST(CostAnalyticTest, GemmShapeFactorWavesPaddingAndRamp) {
  // a800-4x8: 108 SMs, gemm_ramp_k 64. Per tile (m x n, relative throughput)
  // in {256x128 1.0, 128x256 1.0, 128x128 0.9, 128x64 0.8, 64x64 0.65}:
  // tiles = ceil(M/m) ceil(N/n), waves = ceil(tiles / 108), wave efficiency
  // tiles / (108 waves), padding M N / (tiled M x tiled N); the best tile's
  // product times K / (K + 64), over the same for 8192^3.
  // 8192^3: 256x128: 32 x 64 = 2048 tiles, 19 waves: 2048/2052 = 0.998051;
  //   x 8192/8256 = 0.992248 -> 0.990314 (the reference).
  // 16384 x 1024, K 2048: 256x128: 64 x 8 = 512 tiles, 5 waves: 512/540 = 0.948148
  //   (128x128: 1024 tiles, 10 waves, x 0.9 = 0.853); x 2048/2112 = 0.969697
  //   -> 0.919416 / 0.990314 = 0.928409.
  // 8192 x 1024 (that GEMM's half along M): 256x128: 256 tiles, 3 waves:
  //   256/324 = 0.790123; 128x128: 512 tiles, 5 waves: 0.948148 x 0.9 = 0.853333
  //   (the best); x 0.969697 -> 0.827475 / 0.990314 = 0.835568.
  // 1024^3: 128x128: 64 tiles, 1 wave: 64/108 x 0.9 = 0.533333; x 1024/1088
  //   = 0.941176 -> 0.501961 / 0.990314 = 0.506870.
  AnalyticCostModel model(A800());
  EXPECT_NEAR(model.GemmShapeFactor(1, 8192, 8192, 8192), 1.0, 1e-12);
  EXPECT_NEAR(model.GemmShapeFactor(1, 16384, 1024, 2048), 0.928409, 1e-6);
  EXPECT_NEAR(model.GemmShapeFactor(1, 8192, 1024, 2048), 0.835568, 1e-6);
  EXPECT_NEAR(model.GemmShapeFactor(1, 1024, 1024, 1024), 0.506870, 1e-6);
  // A batched GEMM spreads its batch's tiles over the same waves: 8 x 1024^3
  // fills 8 x 64 = 512 tiles of 128x128... and 256x128's 8 x 32 = 256 tiles
  // in 3 waves; 128x128: 512 tiles, 5 waves: 0.948148 x 0.9 x 0.941176 = 0.803137
  // / 0.990314 = 0.810993.
  EXPECT_NEAR(model.GemmShapeFactor(8, 1024, 1024, 1024), 0.810993, 1e-6);
  // sm_count 0: the size-blind roofline.
  ClusterSpec blind = A800();
  blind.device.sm_count = 0;
  EXPECT_EQ(AnalyticCostModel(blind).GemmShapeFactor(1, 64, 64, 64), 1.0);

  // Priced through a graph: [16384, 2048] x [2048, 1024] runs at 0.87 x
  // 0.928409 of 312 TFLOP/s; its half along M costs more than half of it.
  Fixture f;
  f.AddTensor("a", {16384, 2048});
  f.AddTensor("a2", {8192, 2048});
  f.AddTensor("b", {2048, 1024});
  f.AddTensor("c", {16384, 1024});
  f.AddTensor("c2", {8192, 1024});
  const double flops = 2.0 * 16384 * 1024 * 2048;  // 68,719,476,736
  f.graph.ops.push_back(ComputeOp(0, ComputeType::kMatmul, {"a", "b"}, {"c"}, flops, 0));
  f.graph.ops.push_back(ComputeOp(1, ComputeType::kMatmul, {"a2", "b"}, {"c2"}, flops / 2, 0));
  f.Reindex();
  // whole: 68,719,476,736 / (271.44e12 x 0.928409) = 272.69 us + 4 = 276.69 us
  // half:  34,359,738,368 / (271.44e12 x 0.835568) = 151.49 us + 4 = 155.49 us
  const double whole = model.Price(f.graph.ops[0], f.Ctx()).duration_us;
  const double half = model.Price(f.graph.ops[1], f.Ctx()).duration_us;
  EXPECT_NEAR(whole, 276.69, 0.01);
  EXPECT_NEAR(half, 155.49, 0.01);
  EXPECT_GT(half - 4, (whole - 4) / 2 * 1.1);  // 11% more than 1/2 of the whole, launch aside
}

TEST(CostAnalyticTest, LinkLoadOfCollectives) {
  Fixture f;
  f.Reindex();
  AnalyticCostModel model(A800());
  // The hierarchical all-reduce of 256 MiB over 32 ranks (HierarchicalAllReduceOn32Gpus):
  // latency 23.8 + 22.8 + 23.8 = 70.4 us; NVLink transfer 2 x 1269.63 = 2539.26 us,
  // network 4473.92 us: it needs 2539.26 / 7013.18 = 0.362069 of the NVLink
  // port and 4473.92 / 7013.18 = 0.637931 of the NIC share.
  Op ar = CollectiveOp(0, CollectiveType::kAllReduce, {"dp", "tp"}, k256MiB);
  PricedOp p = model.Price(ar, f.Ctx());
  EXPECT_NEAR(p.load.latency_us, 70.4, 1e-9);
  EXPECT_NEAR(p.load.intra, 0.362069, 1e-6);
  EXPECT_NEAR(p.load.inter, 0.637931, 1e-6);
  // A tp all-reduce (one node) loads only NVLink; a dp one (one rank per node) only the NICs.
  PricedOp tp = model.Price(CollectiveOp(1, CollectiveType::kAllReduce, {"tp"}, k256MiB), f.Ctx());
  EXPECT_EQ(tp.load.intra, 1.0);
  EXPECT_EQ(tp.load.inter, 0.0);
  PricedOp dp = model.Price(CollectiveOp(2, CollectiveType::kAllReduce, {"dp"}, k256MiB), f.Ctx());
  EXPECT_EQ(dp.load.intra, 0.0);
  EXPECT_EQ(dp.load.inter, 1.0);
  // An explicit duration keeps the shares, and the latency up to the duration.
  ar.duration_us = 10;
  PricedOp ex = model.Price(ar, f.Ctx());
  EXPECT_EQ(ex.duration_us, 10);
  EXPECT_NEAR(ex.load.latency_us, 10, 1e-12);
  EXPECT_NEAR(ex.load.inter, 0.637931, 1e-6);
  // On commodity-4x8 the NIC sits behind PCIe: a dp all-reduce also loads the
  // PCIe port by 0.3375 / 20 = 0.016875 of its capacity.
  AnalyticCostModel commodity(LoadCluster("commodity-4x8").value());
  PricedOp c = commodity.Price(CollectiveOp(3, CollectiveType::kAllReduce, {"dp"}, k256MiB), f.Ctx());
  EXPECT_EQ(c.load.inter, 1.0);
  EXPECT_NEAR(c.load.intra, 0.016875, 1e-12);
  // Compute loads no link.
  EXPECT_FALSE(model.Price(ComputeOp(4, ComputeType::kScale, {}, {}, 1e6, 0), f.Ctx()).load.Any());
}

TEST(CostAnalyticTest, ElementwiseIsMemoryBound) {
  Fixture f;
  f.AddTensor("x", {8, 2048, 4096});
  f.AddTensor("y", {8, 2048, 4096});
  // 67,108,864 elements; read x + write y in bf16 = 268,435,456 bytes; 8 flops each = 536,870,912.
  f.graph.ops.push_back(ComputeOp(0, ComputeType::kGelu, {"x"}, {"y"}, 8.0 * 67108864, 268435456.0));
  f.Reindex();
  AnalyticCostModel model(A800());
  // memory:  268,435,456 / 1733.15e9 B/s = 154.88 us
  // compute: 536,870,912 / (312e12 * 0.125 = 39e12) = 13.77 us  (vector efficiency)
  // 154.88 + 4 = 158.88 us
  EXPECT_NEAR(model.Price(f.graph.ops[0], f.Ctx()).duration_us, 158.88, 0.01);
}

TEST(CostAnalyticTest, DtypeChoosesPeak) {
  Fixture f;
  f.AddTensor("a", {1024, 1024}, DType::kF32);
  f.AddTensor("b", {1024, 1024}, DType::kF32);
  f.AddTensor("c", {1024, 1024}, DType::kF32);
  f.AddTensor("ids", {1024, 1024}, DType::kI32);
  // f32 matmul: 2 * 1024^3 = 2,147,483,648 flops at 19.5e12 * 0.87 = 16.965e12 -> 126.58 us;
  // bytes 3 * 1024^2 * 4 = 12,582,912 -> 7.26 us; + 4 = 130.58 us.
  f.graph.ops.push_back(ComputeOp(0, ComputeType::kMatmul, {"a", "b"}, {"c"}, 2.0 * 1024 * 1024 * 1024,
                                  3.0 * 1024 * 1024 * 4));
  // i32 output: priced at the fp32 peak: 1.95e9 flops / (19.5e12 * 0.125) = 800 us + 4.
  f.graph.ops.push_back(ComputeOp(1, ComputeType::kCast, {"c"}, {"ids"}, 1.95e9, 0));
  // No resolvable outputs: the first input's dtype (f32): same 804 us.
  f.graph.ops.push_back(ComputeOp(2, ComputeType::kScale, {"a"}, {"nowhere"}, 1.95e9, 0));
  // Nothing resolvable: bf16 peak: 1.95e9 / (312e12 * 0.125 = 39e12) = 50 us + 4.
  f.graph.ops.push_back(ComputeOp(3, ComputeType::kScale, {"nowhere"}, {}, 1.95e9, 0));
  f.Reindex();
  ClusterSpec blind = A800();
  blind.device.sm_count = 0;  // the size-blind roofline (GEMM shapes: GemmShapeFactor's tests)
  AnalyticCostModel model(blind);
  EXPECT_NEAR(model.Price(f.graph.ops[0], f.Ctx()).duration_us, 130.58, 0.01);
  EXPECT_NEAR(model.Price(f.graph.ops[1], f.Ctx()).duration_us, 804, 1e-9);
  EXPECT_NEAR(model.Price(f.graph.ops[2], f.Ctx()).duration_us, 804, 1e-9);
  EXPECT_NEAR(model.Price(f.graph.ops[3], f.Ctx()).duration_us, 54, 1e-9);
}

TEST(CostAnalyticTest, CopyMarkerAndExplicit) {
  Fixture f;
  Op copy;
  copy.kind = OpKind::kCopy;
  copy.bytes = 173315000;  // / 1733.15e9 B/s = 100 us, + 4 launch
  copy.flops = 1e15;       // ignored for copies
  Op marker = ComputeOp(1, ComputeType::kIdentity, {}, {}, 0, 0);  // no work: no kernel
  Op measured = ComputeOp(2, ComputeType::kMatmul, {}, {}, 1e15, 1e12);
  measured.duration_us = 123.5;
  f.Reindex();
  AnalyticCostModel model(A800());
  EXPECT_NEAR(model.Price(copy, f.Ctx()).duration_us, 104, 1e-9);
  EXPECT_EQ(model.Price(marker, f.Ctx()).duration_us, 0);
  PricedOp p = model.Price(measured, f.Ctx());
  EXPECT_EQ(p.duration_us, 123.5);
  EXPECT_EQ(p.source, CostSource::kExplicit);
  EXPECT_EQ(ToString(CostSource::kExplicit), "explicit");
  EXPECT_EQ(ToString(CostSource::kProfile), "profile");
  EXPECT_EQ(ToString(CostSource::kAnalytic), "analytic");
}

// ---------------------------------------------------------------------------
// Analytic collectives on a800-4x8 (intra: 185 GB/s, a = 3.4 us; inter: 11.25 GB/s, a = 3.8 us).

TEST(CostAnalyticTest, RingAllReduceOn8NvlinkGpus) {
  Fixture f;
  f.Reindex();
  AnalyticCostModel model(A800());
  Op op = CollectiveOp(0, CollectiveType::kAllReduce, {"tp"}, k256MiB);
  // tp group of rank 0 = ranks 0..7, all on node 0: ring over NVLink.
  // 2(n-1)a = 14 * 3.4 = 47.6 us; 2(n-1)/n * S/B = 1.75 * 268,435,456 / 185e9 = 2539.25 us
  // total 2586.85 us
  EXPECT_NEAR(model.Price(op, f.Ctx()).duration_us, 2586.85, 0.01);
  // Same on rank 13 (node 1): its tp group is ranks 8..15.
  EXPECT_NEAR(model.Price(op, f.Ctx(13)).duration_us, 2586.85, 0.01);
}

TEST(CostAnalyticTest, HierarchicalAllReduceOn32Gpus) {
  Fixture f;
  f.Reindex();
  Op op = CollectiveOp(0, CollectiveType::kAllReduce, {"dp", "tp"}, k256MiB);
  // 32 ranks over 4 nodes, 8 per node: hierarchical (auto).
  // intra reduce-scatter: 7 * 3.4 + 7/8 * S / 185e9                 = 23.8 + 1269.63 = 1293.43
  // inter all-reduce of S/8 = 33,554,432: 2*3*3.8 + 2*3/4 * S/8 / 11.25e9 = 22.8 + 4473.92 = 4496.72
  // intra all-gather of S/8: 7 * 3.4 + 7 * S/8 / 185e9               = 23.8 + 1269.63 = 1293.43
  // total 7083.58 us
  AnalyticCostModel model(A800());
  EXPECT_NEAR(model.Price(op, f.Ctx()).duration_us, 7083.58, 0.01);
  ClusterSpec hier = A800();
  hier.collective_algorithm = "hierarchical";
  EXPECT_NEAR(AnalyticCostModel(hier).Price(op, f.Ctx()).duration_us, 7083.58, 0.01);

  // Flat ring over the inter-node link: 2*31*3.8 + 2*31/32 * S / 11.25e9 = 235.6 + 46230.55
  ClusterSpec ring = A800();
  ring.collective_algorithm = "ring";
  EXPECT_NEAR(AnalyticCostModel(ring).Price(op, f.Ctx()).duration_us, 46466.15, 0.01);
  // Tree: 2 * ceil(log2 32) * 3.8 + 2 * S / 11.25e9 = 38 + 47721.86
  ClusterSpec tree = A800();
  tree.collective_algorithm = "tree";
  EXPECT_NEAR(AnalyticCostModel(tree).Price(op, f.Ctx()).duration_us, 47759.86, 0.01);
}

TEST(CostAnalyticTest, OneRankPerNodeUsesInterRing) {
  Fixture f;
  f.Reindex();
  AnalyticCostModel model(A800());
  // dp group of rank 0 = {0, 8, 16, 24}: one rank per node, ring over the network.
  // 2*3*3.8 + 2*3/4 * S / 11.25e9 = 22.8 + 35791.39 = 35814.19 us
  Op op = CollectiveOp(0, CollectiveType::kAllReduce, {"dp"}, k256MiB);
  EXPECT_NEAR(model.Price(op, f.Ctx()).duration_us, 35814.19, 0.01);
}

TEST(CostAnalyticTest, OtherCollectives) {
  Fixture f;
  f.Reindex();
  AnalyticCostModel model(A800());
  // all-gather over tp, 16 MiB input per rank (output 128 MiB):
  // 7 * 3.4 + 7 * 16,777,216 / 185e9 = 23.8 + 634.81 = 658.61 us
  EXPECT_NEAR(model.Price(CollectiveOp(0, CollectiveType::kAllGather, {"tp"}, 16 * kMiB), f.Ctx())
                  .duration_us,
              658.61, 0.01);
  // hierarchical all-gather over 32 ranks, 16 MiB input:
  // inter all-gather over 4 nodes: 3 * 3.8 + 3 * 16 MiB / 11.25e9 = 11.4 + 4473.92
  // intra all-gather of 4 * 16 MiB: 7 * 3.4 + 7 * 64 MiB / 185e9  = 23.8 + 2539.25
  // total 7048.38 us
  EXPECT_NEAR(
      model.Price(CollectiveOp(1, CollectiveType::kAllGather, {"dp", "tp"}, 16 * kMiB), f.Ctx())
          .duration_us,
      7048.38, 0.01);
  // reduce-scatter and all-to-all over tp, 256 MiB input: 23.8 + 7/8 * S / 185e9 = 1293.43 us
  EXPECT_NEAR(
      model.Price(CollectiveOp(2, CollectiveType::kReduceScatter, {"tp"}, k256MiB), f.Ctx()).duration_us,
      1293.43, 0.01);
  EXPECT_NEAR(
      model.Price(CollectiveOp(3, CollectiveType::kAllToAll, {"tp"}, k256MiB), f.Ctx()).duration_us,
      1293.43, 0.01);
  // broadcast over tp: 7 * 3.4 + S / 185e9 = 23.8 + 1451.00 = 1474.80 us
  EXPECT_NEAR(
      model.Price(CollectiveOp(4, CollectiveType::kBroadcast, {"tp"}, k256MiB), f.Ctx()).duration_us,
      1474.80, 0.01);
  // all-to-all over 32 ranks: intra part 7 * 3.4 + 7/32 * S / 185e9 = 341.2;
  // inter part (24 remote peers) 24 * 3.8 + 24/32 * S / 11.25e9 = 91.2 + 17895.70 = 17986.90;
  // the two run at once: max = 17986.90 us
  EXPECT_NEAR(
      model.Price(CollectiveOp(5, CollectiveType::kAllToAll, {"dp", "tp"}, k256MiB), f.Ctx())
          .duration_us,
      17986.90, 0.01);
  // A group of one rank: launch overhead only.
  Op single = CollectiveOp(6, CollectiveType::kAllReduce, {}, k256MiB);
  single.group.ranks = {5};
  EXPECT_EQ(model.Price(single, f.Ctx(5)).duration_us, 4);
  // Direct CollectiveUs with explicit ranks {0, 1}: 2*1*3.4 + 2*1/2 * 185e6 / 185e9 = 6.8 + 1000.
  EXPECT_NEAR(model.CollectiveUs(CollectiveType::kAllReduce, 185000000, {0, 1}), 1006.8, 1e-9);
}

TEST(CostAnalyticTest, SendRecvIntraAndInterNode) {
  Fixture f;
  f.Reindex();
  AnalyticCostModel model(A800());
  // rank 0 -> tp+1 = rank 1 (same node): 3.4 + 33,554,432 / 185e9 = 3.4 + 181.38 = 184.78 us
  EXPECT_NEAR(model.Price(SendOp(0, "tp", 1, 32 * kMiB), f.Ctx()).duration_us, 184.78, 0.01);
  // rank 0 -> dp+1 = rank 8 (node 1): 3.8 + 33,554,432 / 11.25e9 = 3.8 + 2982.62 = 2986.42 us
  EXPECT_NEAR(model.Price(SendOp(1, "dp", 1, 32 * kMiB), f.Ctx()).duration_us, 2986.42, 0.01);
  Op recv = SendOp(2, "dp", -1, 32 * kMiB);
  recv.kind = OpKind::kRecv;
  EXPECT_NEAR(model.Price(recv, f.Ctx(8)).duration_us, 2986.42, 0.01);  // rank 8 <- rank 0
  EXPECT_NEAR(model.SendRecvUs(32 * kMiB, 3, 4), 184.78, 0.01);
}

TEST(CostAnalyticTest, BusSharesOneMediumAmongTheRingsRanks) {
  // a800's links as one bus per node of 185 GB/s: a lone transfer gets all of
  // it, each of a ring's k ranks on the node B / k (they all send at once).
  ClusterSpec bus = A800();
  bus.topology.intra_link = "bus";
  ASSERT_TRUE(ValidateCluster(bus, "bus").ok());
  AnalyticCostModel model(bus);
  AnalyticCostModel ports(A800());
  // send 32 MiB to the node-mate: 3.4 + 33,554,432 / 185e9 = 184.78 us, as on ports.
  EXPECT_NEAR(model.SendRecvUs(32 * kMiB, 3, 4), 184.78, 0.01);
  // all-reduce of 185 MB on ranks {0, 1}: 2 x 1 x 3.4 + 2 x 1/2 x 185e6 / (185e9 / 2) = 6.8 + 2000
  EXPECT_NEAR(model.CollectiveUs(CollectiveType::kAllReduce, 185000000, {0, 1}), 2006.8, 1e-9);
  EXPECT_NEAR(ports.CollectiveUs(CollectiveType::kAllReduce, 185000000, {0, 1}), 1006.8, 1e-9);
  // on 4 ranks of the node: 2 x 3 x 3.4 + 2 x 3/4 x 185e6 / (185e9 / 4) = 20.4 + 6000
  EXPECT_NEAR(model.CollectiveUs(CollectiveType::kAllReduce, 185000000, {0, 1, 2, 3}), 6020.4, 1e-9);
  // Two ranks on each of two nodes (hierarchical): the intra-node phases,
  // a reduce-scatter and an all-gather of 92.5 MB each over 2 ranks, run at
  // 185 / 2 GB/s: 2 x 92.5e6 / 92.5e9 = 2000 us where the ports take 1000.
  EXPECT_NEAR(model.CollectiveUs(CollectiveType::kAllReduce, 185000000, {0, 1, 8, 9}) -
                  ports.CollectiveUs(CollectiveType::kAllReduce, 185000000, {0, 1, 8, 9}),
              1000, 1e-6);
  ClusterSpec bad = bus;
  bad.topology.intra_link = "ring";
  EXPECT_NE(ValidateCluster(bad, "f.yaml").message().find("topology.intra_link"), std::string::npos);
}

// ---------------------------------------------------------------------------
// Profile database and precedence.

/// A graph with a matmul, a gelu and a tp all-reduce, indexed.
Fixture ProfileFixture() {
  Fixture f;
  f.AddTensor("a", {4096, 1024});
  f.AddTensor("w", {1024, 4096});
  f.AddTensor("h", {4096, 4096});
  f.AddTensor("g", {4096, 4096});
  f.AddTensor("g32", {4096, 4096}, DType::kF32);
  Op mm = ComputeOp(0, ComputeType::kMatmul, {"a", "w"}, {"h"}, 2.0 * 4096 * 4096 * 1024, 4e7);
  mm.attrs = {{"transpose_a", 0}, {"transpose_b", 1}};
  Op gelu = ComputeOp(1, ComputeType::kGelu, {"h"}, {"g"}, 8.0 * 4096 * 4096, 6.7e7);
  Op cast = ComputeOp(2, ComputeType::kCast, {"g"}, {"g32"}, 0, 1e8);
  cast.attrs = {{"eps", 1e-5}};  // not a shape attribute: not in the signature
  f.graph.ops = {mm, gelu, cast, CollectiveOp(3, CollectiveType::kAllReduce, {"tp"}, 8 * kMiB),
                 CollectiveOp(4, CollectiveType::kAllReduce, {"dp", "tp"}, 8 * kMiB),
                 SendOp(5, "dp", 1, kMiB)};
  f.Reindex();
  return f;
}

TEST(CostProfileTest, SignatureScheme) {
  Fixture f = ProfileFixture();
  ClusterSpec c = A800();
  const auto& ops = f.graph.ops;
  EXPECT_EQ(ProfileDb::Signature(ops[0], f.Ctx(), c),
            "matmul|bf16|[4096,1024]x[1024,4096]->[4096,4096]|transpose_a=0,transpose_b=1");
  EXPECT_EQ(ProfileDb::Signature(ops[1], f.Ctx(), c), "gelu|bf16|[4096,4096]->[4096,4096]|");
  EXPECT_EQ(ProfileDb::Signature(ops[2], f.Ctx(), c), "cast|f32|bf16[4096,4096]->[4096,4096]|");
  EXPECT_EQ(ProfileDb::Signature(ops[3], f.Ctx(), c), "all_reduce|bf16|bytes=8388608|n=8|intra");
  EXPECT_EQ(ProfileDb::Signature(ops[4], f.Ctx(), c), "all_reduce|bf16|bytes=8388608|n=32|nodes=4");
  EXPECT_EQ(ProfileDb::Signature(ops[5], f.Ctx(), c), "send|bf16|bytes=1048576|inter");
}

TEST(CostProfileTest, WriteReadRoundTrip) {
  ProfileDb db;
  db.Add("A800-SXM4-80GB", "matmul|bf16|[2,3]x[3,4]->[2,4]|", 12.5);
  db.Add("A800-SXM4-80GB", "all_reduce|bf16|bytes=8|n=8|intra", 20);
  db.Add("H100-SXM5-80GB", "matmul|bf16|[2,3]x[3,4]->[2,4]|", 7.25);
  EXPECT_EQ(db.size(), 3u);
  std::string text = db.Write();
  EXPECT_NE(text.find("\"format\": \"concerto-profile\""), std::string::npos);
  Result<ProfileDb> back = ProfileDb::Read(WriteTestFile("profile.json", text));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->size(), 3u);
  EXPECT_EQ(back->Lookup("A800-SXM4-80GB", "matmul|bf16|[2,3]x[3,4]->[2,4]|"), 12.5);
  EXPECT_EQ(back->Lookup("H100-SXM5-80GB", "matmul|bf16|[2,3]x[3,4]->[2,4]|"), 7.25);
  EXPECT_EQ(back->Lookup("A800-SXM4-80GB", "all_reduce|bf16|bytes=8|n=8|intra"), 20);
  EXPECT_LT(back->Lookup("A800-SXM4-80GB", "gelu|bf16|[2]->[2]|"), 0);
  EXPECT_EQ(back->Write(), text);
}

TEST(CostProfileTest, PrecedenceExplicitProfileAnalytic) {
  Fixture f = ProfileFixture();
  ClusterSpec c = A800();
  ProfileDb db;
  db.Add(c.device.name, ProfileDb::Signature(f.graph.ops[0], f.Ctx(), c), 111);
  db.Add(c.device.name, ProfileDb::Signature(f.graph.ops[3], f.Ctx(), c), 33);
  db.Add("H100-SXM5-80GB", ProfileDb::Signature(f.graph.ops[1], f.Ctx(), c), 1);  // other device
  ProfiledCostModel profiled(db, c);
  AnalyticCostModel analytic(c);

  PricedOp p = profiled.Price(f.graph.ops[0], f.Ctx());
  EXPECT_EQ(p.source, CostSource::kProfile);
  EXPECT_EQ(p.duration_us, 111);
  EXPECT_EQ(profiled.Price(f.graph.ops[3], f.Ctx()).duration_us, 33);

  Op measured = f.graph.ops[0];
  measured.duration_us = 5;
  p = profiled.Price(measured, f.Ctx());
  EXPECT_EQ(p.source, CostSource::kExplicit);
  EXPECT_EQ(p.duration_us, 5);

  p = profiled.Price(f.graph.ops[1], f.Ctx());  // profiled only on another device
  EXPECT_EQ(p.source, CostSource::kAnalytic);
  EXPECT_EQ(p.duration_us, analytic.Price(f.graph.ops[1], f.Ctx()).duration_us);
  EXPECT_TRUE(profiled.cluster() == c);
}

TEST(CostProfileTest, BadFilesNameFileAndEntry) {
  struct Case {
    std::string file, text, expected;
  };
  const std::string head = "{\"format\": \"concerto-profile\", \"version\": 1, \"entries\": ";
  const std::string good = "{\"device\": \"d\", \"signature\": \"s\", \"duration_us\": 1}";
  const std::vector<Case> cases = {
      {"p1.json", head + "[" + good + ", {\"device\": \"d\", \"signature\": \"t\", \"duration_us\": -1}]}",
       "p1.json: entry 1: field 'duration_us': must be a number in [0, 1e12] us, got -1"},
      // Near DBL_MAX: refused where it is read (a sum over a step's ops must stay finite).
      {"p1b.json", head + "[{\"device\": \"d\", \"signature\": \"t\", \"duration_us\": 1.7e308}]}",
       "p1b.json: entry 0: field 'duration_us': must be a number in [0, 1e12] us, got 1.7e+308"},
      {"p2.json", head + "[{\"device\": \"d\", \"signature\": 3, \"duration_us\": 1}]}",
       "p2.json: entry 0: field 'signature': must be a non-empty string, got 3"},
      {"p3.json", head + "[{\"device\": \"d\", \"signature\": \"s\", \"duration_us\": 1, \"when\": 0}]}",
       "p3.json: entry 0: field 'when': unknown key"},
      {"p4.json", head + "[" + good + ", " + good + "]}",
       "p4.json: entry 1: duplicates entry 0 (same device and signature)"},
      {"p5.json", "{\"format\": \"other\", \"version\": 1, \"entries\": []}",
       "p5.json: field 'format': must be \"concerto-profile\""},
      {"p6.json", "{\"format\": \"concerto-profile\", \"version\": 2, \"entries\": []}",
       "p6.json: field 'version': this build reads version 1, got 2"},
      {"p7.json", head + "{}}", "p7.json: field 'entries': must be a list"},
      {"p8.json", head + "[3]}", "p8.json: entry 0: must be an object"},
      {"p9.json", "[1,", "p9.json: JSON parse error"},
      {"p10.json", head + "[], \"extra\": 1}", "p10.json: field 'extra': unknown key"},
  };
  for (const Case& c : cases) {
    Result<ProfileDb> r = ProfileDb::Read(WriteTestFile(c.file, c.text));
    ASSERT_FALSE(r.ok()) << c.file;
    EXPECT_NE(r.status().message().find(c.expected), std::string::npos)
        << c.file << ": got '" << r.status().message() << "'";
  }
  Result<ProfileDb> missing = ProfileDb::Read("/no/such/profile.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(), "/no/such/profile.json: no such profile database");
}

// ---------------------------------------------------------------------------
// SummarizeCosts.

TEST(CostSummaryTest, CountsPerOpPerRole) {
  // Mesh pp=3 x tp=8; stage graphs: s0 for ranks 0-7 and 16-23, s1 for ranks 8-15.
  Program program;
  program.mesh.axes = {{"pp", 3}, {"tp", 8}};
  Graph s0;
  s0.name = "s0";
  s0.tensors = {MakeTensor("x", {64, 64}), MakeTensor("y", {64, 64}), MakeTensor("z", {64, 64})};
  Op explicit_op = ComputeOp(0, ComputeType::kGelu, {"x"}, {"y"}, 1e6, 1e6);
  explicit_op.duration_us = 9;
  Op profiled_op = ComputeOp(1, ComputeType::kMatmul, {"x", "y"}, {"z"}, 2.0 * 64 * 64 * 64, 24576);
  Op analytic_op = CollectiveOp(2, CollectiveType::kAllReduce, {"tp"}, 8192);
  analytic_op.inputs = {"z"};
  s0.ops = {explicit_op, profiled_op, analytic_op};
  Graph s1;
  s1.name = "s1";
  s1.tensors = {MakeTensor("x", {32, 32}), MakeTensor("y", {32, 32})};
  Op s1_analytic = ComputeOp(0, ComputeType::kGelu, {"x"}, {"y"}, 1e3, 4096);
  Op s1_explicit = ComputeOp(1, ComputeType::kGelu, {"y"}, {"x"}, 1e3, 4096);
  s1_explicit.duration_us = 2;
  s1.ops = {s1_analytic, s1_explicit};
  program.graphs = {s0, s1};
  program.roles = {Role{"stage0", "s0", {0, 1, 2, 3, 4, 5, 6, 7}},
                   Role{"stage1", "s1", {8, 9, 10, 11, 12, 13, 14, 15}},
                   Role{"stage2", "s0", {16, 17, 18, 19, 20, 21, 22, 23}}};

  ClusterSpec c = A800();
  GraphIndex index = GraphIndex::Build(program.graphs[0]);
  ProfileDb db;
  db.Add(c.device.name,
         ProfileDb::Signature(program.graphs[0].ops[1], PriceContext{program.graphs[0], index, program.mesh, 0},
                              c),
         10);
  // s0 twice (stage0, stage2): explicit 1+1, profile 1+1, analytic 1+1; s1: analytic 1, explicit 1.
  CostReport r = SummarizeCosts(program, ProfiledCostModel(db, c));
  EXPECT_EQ(r.explicit_ops, 3);
  EXPECT_EQ(r.profiled_ops, 2);
  EXPECT_EQ(r.analytic_ops, 3);
  r = SummarizeCosts(program, AnalyticCostModel(c));
  EXPECT_EQ(r.explicit_ops, 3);
  EXPECT_EQ(r.profiled_ops, 0);
  EXPECT_EQ(r.analytic_ops, 5);
}

TEST(CostAnalyticTest, PresetsGiveFiniteNonNegativeDurations) {
  Fixture f = ProfileFixture();
  for (const std::string& name : ClusterPresetNames()) {
    AnalyticCostModel model(*LoadCluster(name));
    for (int rank : {0, 7, 8, 31})
      for (const Op& op : f.graph.ops) {
        double us = model.Price(op, f.Ctx(rank)).duration_us;
        EXPECT_TRUE(std::isfinite(us) && us >= 0) << name << " " << OpLabel(op);
      }
  }
}

// ---------------------------------------------------------------------------
// Attention and NVLS (docs/cost-model.md, "Attention" and "NVLS").

/// An attention op over q = k = v [2, 2048, 4096] bf16 with 32 heads (d 128):
/// flops 4 b s^2 h = 4 x 2 x 2048^2 x 4096 = 137,438,953,472 (the grad 2.5x
/// that, kAttentionGradFlops); causal unless `causal` is false.
Op AttentionOp(bool grad, double fused, bool causal = true) {
  Op op;
  op.id = 0;
  op.name = grad ? "attn.grad" : "attn";
  op.kind = OpKind::kCompute;
  op.compute_type = grad ? ComputeType::kAttentionGrad : ComputeType::kAttention;
  op.inputs = grad ? std::vector<std::string>{"do", "q", "k", "v", "o"} : std::vector<std::string>{"q", "k", "v"};
  op.outputs = grad ? std::vector<std::string>{"dq", "dk", "dv"} : std::vector<std::string>{"o"};
  op.flops = (grad ? kAttentionGradFlops : 1) * 4.0 * 2 * 2048.0 * 2048.0 * 4096;
  op.bytes = 4 * 2 * 2048.0 * 4096 * 2;
  op.attrs = {{"heads", 32}, {"causal", causal ? 1.0 : 0.0}};
  if (fused >= 0) op.attrs["fused"] = fused;
  return op;
}

TEST(CostAnalyticTest, FusedAttentionRunsAtAttentionEfficiency) {
  Fixture f;
  for (const char* t : {"q", "k", "v", "o", "do", "dq", "dk", "dv"}) f.AddTensor(t, {2, 2048, 4096});
  f.Reindex();
  // a800-4x8: 312 TFLOP/s x attention_efficiency 0.575 = 179.4 TFLOP/s.
  // Causal: half the counted flops run, 68.719e9 / 179.4e12 = 383.05 us,
  // + 4 us launch = 387.05 us (the bytes, 134 MB at 1733 GB/s = 77 us, are
  // not the bound); without the mask all of them, 766.10 + 4 us.
  AnalyticCostModel model(A800());
  const double half_us = 0.5 * 137438953472.0 / (312 * 0.575 * 1e6);
  EXPECT_NEAR(model.Price(AttentionOp(false, -1), f.Ctx()).duration_us, half_us + 4, 1e-6);
  EXPECT_NEAR(model.Price(AttentionOp(false, 1), f.Ctx()).duration_us, half_us + 4, 1e-6);
  EXPECT_NEAR(model.Price(AttentionOp(false, -1, /*causal=*/false), f.Ctx()).duration_us, 2 * half_us + 4, 1e-6);
  // The backward: 2.5x the flops at the same fraction: 957.63 + 4 us. The
  // pair, 3.5 x 383.05 = 1340.68 us of kernels, is what FlashAttention-2's
  // fwd + bwd benchmark at 179.4 TFLOP/s times (the figure the efficiency
  // comes from).
  EXPECT_NEAR(model.Price(AttentionOp(true, -1), f.Ctx()).duration_us, 2.5 * half_us + 4, 1e-6);
  // attention_efficiency 0 takes matmul_efficiency (0.87): 68.719e9 / 271.44e12 = 253.16 us + 4.
  ClusterSpec old = A800();
  old.device.attention_efficiency = 0;
  EXPECT_NEAR(AnalyticCostModel(old).Price(AttentionOp(false, -1), f.Ctx()).duration_us,
              0.5 * 137438953472.0 / (312 * 0.87 * 1e6) + 4, 1e-6);
}

TEST(CostAnalyticTest, UnfusedAttentionIsItsGemmsAndScorePasses) {
  Fixture f;
  for (const char* t : {"q", "k", "v", "o", "do", "dq", "dk", "dv"}) f.AddTensor(t, {2, 2048, 4096});
  f.Reindex();
  AnalyticCostModel model(A800());
  // b x heads = 64 batched GEMMs per kernel. Scores: 64 x 2048^2 = 268,435,456
  // elements of 2 bytes; at 2039 x 0.85 = 1733.15 GB/s one pass takes 309.76 us.
  // Forward: Q K^T (m 2048, n 2048, k 128) and P V (m 2048, n 128, k 2048), each
  // 2 x 64 x 2048^2 x 128 = 68.72e9 flops at 271.44 TFLOP/s x its shape factor,
  // + 4 us launch; 6.5 passes; 2 more launches.
  const double gemm_flops = 2.0 * 64 * 2048 * 2048 * 128;
  const double gemm_us = gemm_flops / (312 * 0.87 * 1e6);
  const double qk = gemm_us / model.GemmShapeFactor(64, 2048, 2048, 128) + 4;
  const double pv = gemm_us / model.GemmShapeFactor(64, 2048, 128, 2048) + 4;
  const double pass_us = 64.0 * 2048 * 2048 * 2 / 1733.15e3;
  EXPECT_NEAR(pass_us, 309.76, 0.01);
  EXPECT_NEAR(model.Price(AttentionOp(false, 0), f.Ctx()).duration_us, qk + pv + 6.5 * pass_us + 8, 1e-6);
  // Backward: dV and dQ and dK (depth s) and dP (depth d); 9.5 passes.
  EXPECT_NEAR(model.Price(AttentionOp(true, 0), f.Ctx()).duration_us, 3 * pv + qk + 9.5 * pass_us + 8, 1e-6);
  // The unfused forward costs more than the fused one: depth-128 GEMMs and
  // 2 GB of score traffic against one kernel at 57.5% of peak.
  EXPECT_GT(model.Price(AttentionOp(false, 0), f.Ctx()).duration_us,
            2 * model.Price(AttentionOp(false, 1), f.Ctx()).duration_us);
}

TEST(CostAnalyticTest, NvlsAllReduceInsideAnH100Node) {
  Result<ClusterSpec> h100 = LoadCluster("h100-8x8");
  ASSERT_TRUE(h100.ok());
  AnalyticCostModel model(*h100);
  const int64_t s = int64_t{1} << 30;
  // 8 ranks: ring 14 x 3.4 + 1.75 x 2^30 / 370e9 = 47.6 + 5078.51 = 5126.11 us;
  // NVLS 47.6 + 2^30 / 275e9 = 47.6 + 3904.52 = 3952.12 us: NVLS.
  EXPECT_NEAR(model.CollectiveUs(CollectiveType::kAllReduce, s, {0, 1, 2, 3, 4, 5, 6, 7}), 3952.12, 0.01);
  // 2 ranks: ring 2 x 3.4 + 2^30 / 370e9 = 6.8 + 2902.00 = 2908.80 us; NVLS 3911.32: the ring.
  EXPECT_NEAR(model.CollectiveUs(CollectiveType::kAllReduce, s, {0, 1}), 2908.80, 0.01);
  // All-gather is not NVLS: ring 7 x 3.4 + 7 x 2^30 / 8 / 370e9 = 23.8 + 2539.25 = 2563.05 us.
  EXPECT_NEAR(model.CollectiveUs(CollectiveType::kAllGather, s / 8, {0, 1, 2, 3, 4, 5, 6, 7}), 2563.05, 0.01);
  // Off (0, A100-class presets): the ring.
  ClusterSpec off = *h100;
  off.topology.nvls_algbw_gbps = 0;
  EXPECT_NEAR(AnalyticCostModel(off).CollectiveUs(CollectiveType::kAllReduce, s, {0, 1, 2, 3, 4, 5, 6, 7}), 5126.11,
              0.01);
  // A group across nodes keeps the hierarchical algorithm.
  EXPECT_GT(model.CollectiveUs(CollectiveType::kAllReduce, s, {0, 8}), 3952.12);
}

TEST(CostClusterTest, AttentionEfficiencyAndNvlsAreValidated) {
  ClusterSpec c = A800();
  c.device.attention_efficiency = 1.5;
  Status s = ValidateCluster(c, "c.yaml");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("device.attention_efficiency"), std::string::npos) << s.message();
  c = A800();
  c.topology.nvls_algbw_gbps = -1;
  s = ValidateCluster(c, "c.yaml");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("topology.nvls_algbw_gbps"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace concerto
