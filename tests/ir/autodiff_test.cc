// The autodiff pass (ir/autodiff.h) and the op registry's backward rules:
// the ops it appends to a small graph, and, on the runtime, the gradients of
// the frontends' own models against their hand-written backward.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "concerto/ir/autodiff.h"
#include "concerto/ir/op_registry.h"
#include "concerto/ir/verifier.h"
#include "concerto/lower/frontend.h"
#include "concerto/runtime/executor.h"
#include "concerto/runtime/reference.h"
#include "concerto/schedule/schedule.h"

namespace concerto {
namespace {

Tensor T(const std::string& name, std::vector<int64_t> shape, DType dtype = DType::kF32) {
  Tensor t;
  t.name = name;
  t.shape = std::move(shape);
  t.dtype = dtype;
  t.sharding.assign(t.shape.size(), {});
  return t;
}

void AddOp(Graph& g, const std::string& name, ComputeType type, std::vector<std::string> in,
           std::vector<std::string> out, std::map<std::string, double> attrs = {}) {
  Op op;
  op.id = static_cast<int>(g.ops.size());
  op.name = name;
  op.kind = OpKind::kCompute;
  op.stream = "compute";
  op.compute_type = type;
  op.tags.phase = Phase::kForward;
  op.inputs = std::move(in);
  op.outputs = std::move(out);
  op.attrs = std::move(attrs);
  g.ops.push_back(op);
}

/// A two-layer MLP with a cross-entropy loss: x [4, 8] -> fc1 (w1 [8, 16])
/// -> gelu -> fc2 (w2 [16, 10]) -> logits [4, 10] -> loss.
Graph Mlp(ComputeType activation = ComputeType::kGelu) {
  Graph g;
  g.name = "main";
  g.tensors = {T("x", {4, 8}), T("w1", {8, 16}), T("h", {4, 16}), T("a", {4, 16}), T("w2", {16, 10}),
               T("logits", {4, 10}), T("labels", {4}, DType::kI32), T("m", {4}), T("z", {4}),
               T("target", {4}), T("loss", {})};
  AddOp(g, "fc1", ComputeType::kMatmul, {"x", "w1"}, {"h"});
  AddOp(g, std::string(ToString(activation)), activation, {"h"}, {"a"});
  AddOp(g, "fc2", ComputeType::kMatmul, {"a", "w2"}, {"logits"});
  AddOp(g, "max", ComputeType::kReduceMax, {"logits"}, {"m"});
  AddOp(g, "sum_exp", ComputeType::kSumExp, {"logits", "m"}, {"z"});
  AddOp(g, "target", ComputeType::kGatherTarget, {"logits", "labels"}, {"target"});
  AddOp(g, "ce", ComputeType::kCrossEntropy, {"m", "z", "target"}, {"loss"});
  return g;
}

/// "name: type(in, ...) -> (out, ...)" per op from index `from`.
std::vector<std::string> Listing(const Graph& g, size_t from) {
  std::vector<std::string> out;
  for (size_t i = from; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    std::string line = op.name + ": " + std::string(ToString(op.compute_type)) + "(";
    for (size_t k = 0; k < op.inputs.size(); ++k) line += (k ? ", " : "") + op.inputs[k];
    line += ") -> (";
    for (size_t k = 0; k < op.outputs.size(); ++k) line += (k ? ", " : "") + op.outputs[k];
    out.push_back(line + ")");
  }
  return out;
}

TEST(Autodiff, AppendsTheRegistrysBackwardRulesInReverseOrder) {
  // Backward of the MLP, last op first. cross_entropy's rule covers the loss
  // chain (max, sum_exp and target get no gradient of their own); each
  // matmul gives dX = dY W^T (transpose_b) and dW = X^T dY (transpose_a);
  // x needs no gradient (not differentiated), so fc1 has no dX.
  Graph g = Mlp();
  const size_t forward = g.ops.size();
  Result<AutodiffResult> r = Differentiate(&g, "loss", {"w1", "w2"});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(Listing(g, forward), (std::vector<std::string>{
                                     "ce.grad: cross_entropy_grad(logits, m, z, labels) -> (logits.grad)",
                                     "fc2.grad.da: matmul(logits.grad, w2) -> (a.grad)",
                                     "fc2.grad.dw: matmul(a, logits.grad) -> (w2.grad)",
                                     "gelu.grad: gelu_grad(a.grad, h) -> (h.grad)",
                                     "fc1.grad.dw: matmul(x, h.grad) -> (w1.grad)",
                                 }));
  EXPECT_EQ(r->ops_added, 5);
  EXPECT_EQ(r->grads.at("w1"), "w1.grad");
  EXPECT_EQ(r->grads.at("w2"), "w2.grad");
  const Op& da = g.ops[forward + 1];
  EXPECT_EQ(da.Attr("transpose_b", 0), 1);
  EXPECT_EQ(da.flops, 2.0 * 4 * 10 * 16);  // the forward's 2 m n k
  EXPECT_EQ(da.tags.phase, Phase::kBackward);
  EXPECT_EQ(g.ops[forward + 2].Attr("transpose_a", 0), 1);
  Program p;
  p.name = "mlp";
  p.graphs = {g};
  p.roles = {Role{"spmd", "main", {0}}};
  EXPECT_EQ(VerifyProgram(p), std::vector<std::string>{});
}

TEST(Autodiff, EveryActivationEmitsItsOwnGradientType) {
  // The MLP with each one-input activation that has a "<name>_grad" type:
  // its backward must be that type (silu's rule once emitted gelu_grad; the
  // kernels' finite-difference tests could not see it).
  int checked = 0;
  for (ComputeType type : {ComputeType::kGelu, ComputeType::kSilu, ComputeType::kSoftmax}) {
    Graph g = Mlp(type);
    const size_t forward = g.ops.size();
    Result<AutodiffResult> r = Differentiate(&g, "loss", {"w1", "w2"});
    ASSERT_TRUE(r.ok()) << ToString(type) << ": " << r.status().message();
    const std::optional<ComputeType> grad = ParseComputeType(std::string(ToString(type)) + "_grad");
    ASSERT_TRUE(grad.has_value()) << ToString(type);
    bool found = false;
    for (size_t i = forward; i < g.ops.size(); ++i)
      if (g.ops[i].name == std::string(ToString(type)) + ".grad") {
        EXPECT_EQ(g.ops[i].compute_type, *grad) << ToString(type) << "'s backward is " << ToString(g.ops[i].compute_type);
        found = true;
      }
    EXPECT_TRUE(found) << ToString(type) << ": no backward op";
    checked++;
  }
  EXPECT_EQ(checked, 3);
}

TEST(Autodiff, DifferentiatesAConvolutionalNetwork) {
  // x [2, 3, 6, 6] -> conv2d (w [4, 3, 3, 3], padding 1) -> batch_norm -> relu ->
  // max_pool2d (kernel 2) [2, 4, 3, 3] -> matmul (w2 [3, 5]) -> logits
  // [2, 4, 3, 5] -> cross-entropy. Backward: the loss chain, the matmul (its
  // weight gradient over 2-D views of the batched operands), then
  // max_pool2d_grad, relu_grad, batch_norm_grad and conv2d_grad (its dx
  // unused: x needs none).
  Graph g;
  g.name = "main";
  g.tensors = {T("x", {2, 3, 6, 6}),  T("w", {4, 3, 3, 3}),  T("h", {2, 4, 6, 6}),         T("a", {2, 4, 6, 6}),
               T("p", {2, 4, 3, 3}),  T("w2", {3, 5}),       T("logits", {2, 4, 3, 5}),    T("labels", {2, 4, 3}, DType::kI32),
               T("m", {2, 4, 3}),     T("z", {2, 4, 3}),     T("target", {2, 4, 3}),       T("loss", {}),
               T("gamma", {4}),       T("beta", {4}),        T("hn", {2, 4, 6, 6}),        T("mean", {4}),
               T("invstd", {4})};
  AddOp(g, "conv", ComputeType::kConv2d, {"x", "w"}, {"h"}, {{"padding", 1}});
  g.ops.back().flops = 2.0 * 2 * 4 * 6 * 6 * 3 * 3 * 3;
  AddOp(g, "bn", ComputeType::kBatchNorm, {"h", "gamma", "beta"}, {"hn", "mean", "invstd"}, {{"eps", 1e-5}});
  AddOp(g, "relu", ComputeType::kRelu, {"hn"}, {"a"});
  AddOp(g, "pool", ComputeType::kMaxPool2d, {"a"}, {"p"}, {{"kernel", 2}});
  AddOp(g, "fc", ComputeType::kMatmul, {"p", "w2"}, {"logits"});
  AddOp(g, "max", ComputeType::kReduceMax, {"logits"}, {"m"});
  AddOp(g, "sum_exp", ComputeType::kSumExp, {"logits", "m"}, {"z"});
  AddOp(g, "target", ComputeType::kGatherTarget, {"logits", "labels"}, {"target"});
  AddOp(g, "ce", ComputeType::kCrossEntropy, {"m", "z", "target"}, {"loss"});
  const size_t forward = g.ops.size();
  Result<AutodiffResult> r = Differentiate(&g, "loss", {"w", "w2", "gamma", "beta"});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(Listing(g, forward), (std::vector<std::string>{
                                     "ce.grad: cross_entropy_grad(logits, m, z, labels) -> (logits.grad)",
                                     "fc.grad.da: matmul(logits.grad, w2) -> (p.grad)",
                                     "fc.grad.view: identity(p, logits.grad) -> (p.2d, logits.grad.2d)",
                                     "fc.grad.dw: matmul(p.2d, logits.grad.2d) -> (w2.grad)",
                                     "pool.grad: max_pool2d_grad(p.grad, a) -> (a.grad)",
                                     "relu.grad: relu_grad(a.grad, hn) -> (hn.grad)",
                                     "bn.grad: batch_norm_grad(hn.grad, h, gamma, mean, invstd) -> (h.grad, gamma.grad, beta.grad)",
                                     "conv.grad: conv2d_grad(h.grad, x, w) -> (x.grad, w.grad)",
                                 }));
  const Op& conv_grad = g.ops.back();
  EXPECT_EQ(conv_grad.Attr("padding", 0), 1);  // the forward's attributes
  EXPECT_EQ(conv_grad.flops, 2 * g.ops[0].flops);
  EXPECT_EQ(r->grads.at("w"), "w.grad");
  Program p;
  p.name = "cnn";
  p.graphs = {g};
  p.roles = {Role{"spmd", "main", {0}}};
  EXPECT_EQ(VerifyProgram(p), std::vector<std::string>{});
}

TEST(Autodiff, SumsTheGradientsOfATensorReadTwice) {
  // w1 feeds fc1 and, through a second matmul, a residual add: its
  // gradient is the sum of both contributions (one add op named after it).
  Graph g = Mlp();
  g.tensors.push_back(T("h2", {4, 16}));
  g.tensors.push_back(T("hs", {4, 16}));
  AddOp(g, "fc1b", ComputeType::kMatmul, {"x", "w1"}, {"h2"});
  AddOp(g, "res", ComputeType::kAdd, {"h", "h2"}, {"hs"});
  for (Op& op : g.ops)
    if (op.name == "gelu") op.inputs = {"hs"};
  Result<AutodiffResult> r = Differentiate(&g, "loss", {"w1", "w2"});
  ASSERT_TRUE(r.ok()) << r.status().message();
  const std::string grad = r->grads.at("w1");
  int adds = 0;
  for (const Op& op : g.ops)
    if (op.compute_type == ComputeType::kAdd && op.tags.phase == Phase::kBackward) {
      ++adds;
      EXPECT_EQ(op.outputs[0], grad);
      EXPECT_EQ(op.name, "w1.grad.acc1");
    }
  EXPECT_EQ(adds, 1);
}

TEST(Autodiff, ABroadcastBiasGetsTheRowSumOfItsGradient) {
  // h [4, 16] + bias [16]: d bias = ones [1, 4] x dh viewed [4, 16], viewed
  // back to [16] (a matmul of 2 * 4 * 16 flops and two free views).
  Graph g = Mlp();
  g.tensors.push_back(T("bias", {16}));
  g.tensors.push_back(T("hb", {4, 16}));
  AddOp(g, "bias_add", ComputeType::kAdd, {"h", "bias"}, {"hb"});
  for (Op& op : g.ops)
    if (op.name == "gelu") op.inputs = {"hb"};
  const size_t forward = g.ops.size();
  Result<AutodiffResult> r = Differentiate(&g, "loss", {"bias"});
  ASSERT_TRUE(r.ok()) << r.status().message();
  const std::vector<std::string> ops = Listing(g, forward);
  ASSERT_GE(ops.size(), 3u);
  EXPECT_EQ(std::vector<std::string>(ops.end() - 3, ops.end()),
            (std::vector<std::string>{
                "bias_add.grad.row_sum1.view: identity(hb.grad) -> (hb.grad.row_sum1.2d)",
                "bias_add.grad.row_sum1: matmul(const.ones.4, hb.grad.row_sum1.2d) -> (bias.grad.row_sum)",
                "bias_add.grad.row_sum1.out: identity(bias.grad.row_sum) -> (bias.grad)",
            }));
  EXPECT_EQ(g.ops[g.ops.size() - 2].flops, 2.0 * 4 * 16);
}

TEST(Autodiff, ErrorsNameTheOpAndWhy) {
  {  // the max is used outside the loss chain: reduce_max has no backward rule
    Graph g = Mlp();
    g.tensors.push_back(T("m2", {4}));
    AddOp(g, "twice", ComputeType::kScale, {"m"}, {"m2"}, {{"scale", 2}});
    for (Op& op : g.ops)
      if (op.name == "ce") op.inputs[0] = "m2";
    Result<AutodiffResult> r = Differentiate(&g, "loss", {"w2"});
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("cross_entropy op 'ce'"), std::string::npos) << r.status().message();
  }
  {
    Graph g = Mlp();
    EXPECT_NE(Differentiate(&g, "nope", {"w1"}).status().message().find("'nope'"), std::string::npos);
    EXPECT_NE(Differentiate(&g, "loss", {"labels"}).status().message().find("integer"), std::string::npos);
    EXPECT_NE(Differentiate(&g, "m", {"x"}).status().message().find("reduce_max op 'max' has no backward rule"),
              std::string::npos);
  }
}

TEST(Autodiff, EveryForwardTypeHasABackwardRuleAndNoGradientTypeDoes) {
  int with = 0;
  for (const OpTypeInfo& info : OpRegistry()) {
    const bool is_grad = info.name.ends_with("_grad");
    if (is_grad) {
      EXPECT_EQ(info.backward, nullptr) << info.name;
    }
    with += info.backward != nullptr;
  }
  // The 16 gradient ops, adam, the loss chain's reduce_max, sum_exp and
  // gather_target (cross_entropy's rule covers them) and batch_norm_grad_stats
  // (emitted by synchronised batch_norm's rule) have none.
  EXPECT_EQ(with, static_cast<int>(OpRegistry().size()) - 16 - 1 - 3 - 1);
}

/// `model`'s one-rank program with its hand-written backward replaced by the
/// autodiff's: the forward ops, Differentiate from the loss with respect to
/// every parameter an Adam op updates, and the Adam ops reading the new
/// gradients.
Program WithAutodiffBackward(const Program& hand) {
  Program p = hand;
  Graph& g = p.graphs.at(0);
  std::vector<Op> forward, adam;
  std::vector<LossTerm> losses;
  std::map<std::string, double> weights;  // the hand-written backward's "<loss>.weight" scales
  for (const Op& op : g.ops) {
    if (op.tags.phase == Phase::kForward) forward.push_back(op);
    if (op.kind == OpKind::kCompute && op.compute_type == ComputeType::kAdam) adam.push_back(op);
    if (op.kind == OpKind::kCompute && op.compute_type == ComputeType::kCrossEntropy)
      losses.push_back({op.outputs[0], 1});
    if (op.kind == OpKind::kCompute && op.compute_type == ComputeType::kScale && op.name.ends_with(".weight"))
      weights[op.name.substr(0, op.name.size() - 7)] = op.Attr("scale", 1);
  }
  for (LossTerm& l : losses)
    if (weights.count(l.tensor)) l.weight = weights[l.tensor];
  g.ops = forward;
  std::vector<std::string> params;
  for (const Op& op : adam) params.push_back(op.inputs[0]);
  Result<AutodiffResult> r = Differentiate(&g, losses, params);
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (!r.ok()) return hand;
  int next_id = 0;
  for (const Op& op : g.ops) next_id = std::max(next_id, op.id + 1);
  for (Op op : adam) {
    op.id = next_id++;
    EXPECT_TRUE(r->grads.count(op.inputs[0])) << "no gradient for " << op.inputs[0];
    if (!r->grads.count(op.inputs[0])) return hand;
    op.inputs[1] = r->grads.at(op.inputs[0]);
    g.ops.push_back(op);
  }
  // Drop the tensors only the hand-written backward used.
  std::set<std::string> used;
  for (const Op& op : g.ops) {
    used.insert(op.inputs.begin(), op.inputs.end());
    used.insert(op.outputs.begin(), op.outputs.end());
  }
  std::vector<Tensor> kept;
  for (const Tensor& t : g.tensors)
    if (used.count(t.name)) kept.push_back(t);
  g.tensors = kept;
  return p;
}

class AutodiffModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(AutodiffModelTest, MatchesTheHandWrittenBackwardOnTheRuntime) {
  // The same forward, data and parameters: the loss, every parameter's
  // gradient (what its Adam op reads) and every updated parameter agree
  // within the reference check's tolerances.
  Result<Program> hand = LowerModelPlan(GetParam(), "dp=1");
  ASSERT_TRUE(hand.ok()) << hand.status().message();
  const Program autodiff = WithAutodiffBackward(*hand);
  ASSERT_EQ(VerifyProgram(autodiff), std::vector<std::string>{});
  const ScheduledProgram ref{*hand, ProgramOrderSchedule(*hand, "fifo")};
  const ScheduledProgram got{autodiff, ProgramOrderSchedule(autodiff, "fifo")};
  Result<ExecutionResult> ref_run = RunInProcess(ref);
  ASSERT_TRUE(ref_run.ok()) << ref_run.status().message();
  Result<ExecutionResult> got_run = RunInProcess(got);
  ASSERT_TRUE(got_run.ok()) << got_run.status().message();
  Tolerance tolerance;
  // The Evoformer's pair-bias LayerNorm beta has a gradient that is 0 in
  // exact arithmetic (runtime_test's floor for it).
  tolerance.grad_abs = 1e-13;
  Result<ReferenceReport> report = CompareToReference(ref, *ref_run, got, *got_run, tolerance, {});
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_GT(report->checks.size(), 10u);
}

INSTANTIATE_TEST_SUITE_P(Models, AutodiffModelTest, ::testing::Values("gpt-tiny", "llama-tiny", "mixtral-tiny", "evoformer-tiny"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace concerto
