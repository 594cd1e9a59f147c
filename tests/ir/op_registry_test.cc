// The op registry (ir/op_registry.h) is complete and in enum order, names
// every compute type once, and is where the IR's spelling, the frontends'
// flop counts and the verifier's shape rules come from.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "concerto/ir/ir.h"
#include "concerto/ir/op_registry.h"

namespace concerto {
namespace {

TEST(OpRegistry, OneEntryPerComputeTypeInEnumOrder) {
  const std::vector<OpTypeInfo>& r = OpRegistry();
  ASSERT_EQ(r.size(), static_cast<size_t>(ComputeType::kBatchNormGradStats) + 1);
  std::set<std::string_view> names;
  for (size_t i = 0; i < r.size(); ++i) {
    EXPECT_EQ(static_cast<size_t>(r[i].type), i);
    EXPECT_TRUE(names.insert(r[i].name).second) << r[i].name;
    EXPECT_FALSE(r[i].signature.empty()) << r[i].name;
    EXPECT_FALSE(r[i].flops_per.empty()) << r[i].name;
    EXPECT_GE(r[i].flops, 0) << r[i].name;
    EXPECT_NE(r[i].shape_rule, nullptr) << r[i].name;
    // The IR's spelling is the registry's, both ways.
    EXPECT_EQ(ToString(r[i].type), r[i].name);
    EXPECT_EQ(ParseComputeType(r[i].name), r[i].type);
  }
  EXPECT_EQ(AllComputeTypeNames().size(), r.size());
  EXPECT_FALSE(ParseComputeType("no_such_op").has_value());
}

TEST(OpRegistry, TheFrontendsFlopCountsAreTheRegistrys) {
  // The numbers docs/workloads.md states, read back through the registry.
  EXPECT_EQ(FlopsPerUnit(ComputeType::kAdam), 10);
  EXPECT_EQ(FlopsPerUnit(ComputeType::kLayerNorm), 8);
  EXPECT_EQ(FlopsPerUnit(ComputeType::kGeluGrad), 12);
  EXPECT_EQ(FlopsPerUnit(ComputeType::kMatmul), 0);  // a formula, not a per-element count
}

TEST(OpRegistry, KernelClassesForTheCostModelAndTheProfiler) {
  // Tensor-core kernels are priced at matmul efficiency; streaming ones are
  // fitted to memory bandwidth by the profiler; the rest are vector kernels.
  int tensor_core = 0, streaming = 0;
  for (const OpTypeInfo& info : OpRegistry()) {
    tensor_core += info.kernel_class == KernelClass::kTensorCore;
    streaming += info.kernel_class == KernelClass::kStreaming;
  }
  EXPECT_EQ(tensor_core, 5);  // matmul, attention(_grad), conv2d(_grad)
  EXPECT_EQ(streaming, 10);   // add, mul, scale, slice, concat, identity, cast, adam, relu(_grad)
  EXPECT_EQ(OpInfo(ComputeType::kAttentionGrad).kernel_class, KernelClass::kTensorCore);
  EXPECT_EQ(OpInfo(ComputeType::kAdam).kernel_class, KernelClass::kStreaming);
  EXPECT_EQ(OpInfo(ComputeType::kGelu).kernel_class, KernelClass::kVector);
}

TEST(OpRegistry, TheVerifierAppliesTheEntrysShapeRule) {
  // gelu's rule: one input, one output of its shape. [4, 8] -> [4, 9] fails
  // with the rule's message; [4, 8] -> [4, 8] passes.
  auto tensor = [](const std::string& name, std::vector<int64_t> shape) {
    Tensor t;
    t.name = name;
    t.shape = std::move(shape);
    t.dtype = DType::kF32;
    return t;
  };
  const Tensor x = tensor("x", {4, 8}), good = tensor("y", {4, 8}), bad = tensor("z", {4, 9});
  Op op;
  op.kind = OpKind::kCompute;
  op.compute_type = ComputeType::kGelu;
  EXPECT_EQ(OpInfo(ComputeType::kGelu).shape_rule(op, {&x}, {&good}), "");
  const std::string message = OpInfo(ComputeType::kGelu).shape_rule(op, {&x}, {&bad});
  EXPECT_NE(message.find("'z'"), std::string::npos) << message;
}

TEST(OpRegistry, AttributesSayWhatKeysTheProfile) {
  // Attributes that change a kernel's time are in the profile key; eps, lr
  // and the like are not. Attribute names are unique within an entry.
  for (const OpTypeInfo& info : OpRegistry()) {
    std::set<std::string_view> names;
    for (const AttrInfo& a : info.attrs) {
      EXPECT_TRUE(names.insert(a.name).second) << info.name << "." << a.name;
      if (a.integer) {
        EXPECT_LE(a.lo, a.hi) << info.name << "." << a.name;
      }
    }
  }
  EXPECT_TRUE(FindAttr(ComputeType::kMatmul, "transpose_b")->timing);
  EXPECT_TRUE(FindAttr(ComputeType::kAttention, "causal")->timing);
  EXPECT_FALSE(FindAttr(ComputeType::kLayerNorm, "eps")->timing);
  EXPECT_TRUE(FindAttr(ComputeType::kAttention, "heads")->required);
  EXPECT_EQ(FindAttr(ComputeType::kGelu, "eps"), nullptr);
}

/// A context over one graph whose tensors are all replicated.
class ReplicatedContext : public ShardingRuleContext {
 public:
  explicit ReplicatedContext(Graph g) : g_(std::move(g)) {}
  const Graph& graph() const override { return g_; }
  const Tensor& Global(const std::string& name) const override { return g_.tensors.at(index_.at(name)); }
  const DimSharding& CurrentDim(const std::string&, size_t) const override { return none_; }
  void Index() {
    for (size_t i = 0; i < g_.tensors.size(); ++i) index_[g_.tensors[i].name] = i;
  }

 private:
  Graph g_;
  std::map<std::string, size_t> index_;
  DimSharding none_;
};

TEST(OpRegistry, ShardingRulesLabelOperandDimensions) {
  // matmul x [4, 8, 16] (batch b, m, k) times w [16, 32] (k, n) -> y [4, 8, 32]:
  // labels b=0, m=1, k=2, n=3; x = (0, 1, 2), w = (2, 3), y = (0, 1, 3); k
  // is contracted (y lacks it), linear in one input (a partial x stays partial).
  Graph g;
  g.tensors = {{"x", {4, 8, 16}, DType::kF32}, {"w", {16, 32}, DType::kF32}, {"y", {4, 8, 32}, DType::kF32}};
  ReplicatedContext ctx(g);
  ctx.Index();
  Op op;
  op.kind = OpKind::kCompute;
  op.compute_type = ComputeType::kMatmul;
  op.inputs = {"x", "w"};
  op.outputs = {"y"};
  Result<ShardingSignature> sig = OpInfo(ComputeType::kMatmul).sharding(op, ctx);
  ASSERT_TRUE(sig.ok()) << sig.status().message();
  EXPECT_EQ(sig->in[0], (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(sig->in[1], (std::vector<int>{2, 3}));
  EXPECT_EQ(sig->out[0], (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(sig->linear, ShardingSignature::Linear::kOne);
  // Types the frontends emit already sharded have no rule; the rest have one.
  int without = 0;
  for (const OpTypeInfo& info : OpRegistry()) without += info.sharding == nullptr;
  // top_k(_grad), moe_dispatch/combine(_grad) (the frontends emit them sharded).
  EXPECT_EQ(without, 6);
  EXPECT_EQ(OpInfo(ComputeType::kTopK).sharding, nullptr);
  for (ComputeType t : {ComputeType::kTranspose, ComputeType::kConv2d, ComputeType::kConv2dGrad, ComputeType::kMaxPool2d,
                        ComputeType::kMaxPool2dGrad, ComputeType::kBatchNorm, ComputeType::kBatchNormGrad})
    EXPECT_NE(OpInfo(t).sharding, nullptr) << OpInfo(t).name;
}

}  // namespace
}  // namespace concerto
