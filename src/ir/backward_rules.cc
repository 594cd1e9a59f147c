// The backward rules of the op registry: for each differentiable forward
// compute type, the ops that compute its inputs' gradients (ir/autodiff.h).
// They emit the same gradient ops, operand orders and flop counts as the
// hand-written backward of the frontends (src/lower/transformer.cc), so an
// autodiff backward and a hand-written one price and run alike.
#include "backward_rules.h"

#include <string>
#include <vector>

#include "concerto/ir/op_registry.h"

namespace concerto {
namespace {

using Shape = std::vector<int64_t>;

double Elems(const BackwardBuilder& b, const std::string& t) {
  return static_cast<double>(b.Get(t).NumElements());
}

/// A new tensor shaped like `like`, named from `stem`.
std::string Like(BackwardBuilder& b, const std::string& stem, const std::string& like) {
  const Tensor& t = b.Get(like);
  return b.NewTensor(stem, t.shape, t.dtype);
}

/// "<type> op 'name'" for messages.
std::string Label(const Op& fwd) {
  return std::string(ToString(fwd.compute_type)) + " op '" + fwd.name + "'";
}

/// The gradient of output 0, which an elementwise rule needs.
Result<std::string> Dy(const Op& fwd, const BackwardBuilder& b) {
  std::string dy = b.OutputGrad(0);
  if (dy == kUnitGradient)
    return Status::Error(Label(fwd) + ": is the loss, but only cross_entropy can be the loss");
  return dy;
}

/// One grad op `(dy, extra...) -> dx` of `grad_type` for input `x`, with the
/// forward's attributes and the registry's flops per element of x.
Status Unary(const Op& fwd, BackwardBuilder& b, ComputeType grad_type, std::vector<std::string> extra) {
  Result<std::string> dy = Dy(fwd, b);
  if (!dy.ok()) return dy.status();
  const std::string& x = fwd.inputs[0];
  if (!b.NeedsGrad(x)) return Status::Ok();
  std::string dx = Like(b, x + ".grad", x);
  std::vector<std::string> in = {*dy};
  in.insert(in.end(), extra.begin(), extra.end());
  b.Emit("", grad_type, in, {dx}, FlopsPerUnit(grad_type) * Elems(b, x), fwd.attrs);
  b.AddGrad(x, dx);
  return Status::Ok();
}

/// Product of dims [begin, end) of `shape`.
int64_t Product(const Shape& shape, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= shape[i];
  return p;
}

}  // namespace

namespace backward_rules {

// y = op(a) op(b), op(a) [.., m, k], op(b) [(..,) k, n]: dA = dY op(b)^T and
// dB = op(a)^T dY (summed over the batch when b is 2-D: a and dY viewed as
// [tokens, k] and [tokens, n], as the frontends' weight gradient).
Status Matmul(const Op& fwd, BackwardBuilder& b) {
  Result<std::string> dy = Dy(fwd, b);
  if (!dy.ok()) return dy.status();
  const bool ta = fwd.Attr("transpose_a", 0) != 0, tb = fwd.Attr("transpose_b", 0) != 0;
  const std::string &a = fwd.inputs[0], &w = fwd.inputs[1];
  const Shape sa = b.Get(a).shape, sw = b.Get(w).shape, sy = b.Get(*dy).shape;
  const bool batched_w = sw.size() == sa.size() && sa.size() > 2;
  const int64_t k = ta ? sa[sa.size() - 2] : sa.back();
  const double flops = 2.0 * Product(sy, 0, sy.size()) * static_cast<double>(k);
  auto matmul = [&](const std::string& suffix, std::string x, std::string y, bool tx, bool ty,
                    const std::string& out) {
    b.Emit(suffix, ComputeType::kMatmul, {std::move(x), std::move(y)}, {out}, flops,
           {{"transpose_a", tx ? 1.0 : 0.0}, {"transpose_b", ty ? 1.0 : 0.0}});
  };
  if (b.NeedsGrad(a)) {
    std::string da = Like(b, a + ".grad", a);
    if (!ta) {
      matmul(".da", *dy, w, false, !tb, da);  // [.., m, n] x op(b)^T
    } else if (sa.size() == 2 || batched_w) {
      matmul(".da", w, *dy, tb, true, da);  // op(b) dY^T = [k, m]
    } else {
      return Status::Error(Label(fwd) + ": no backward for a batched transpose_a input times a 2-D one");
    }
    b.AddGrad(a, da);
  }
  if (b.NeedsGrad(w)) {
    std::string dw = Like(b, w + ".grad", w);
    std::string x = a, g = *dy;
    if (!batched_w && sa.size() > 2) {
      if (ta) return Status::Error(Label(fwd) + ": no backward for a batched transpose_a input times a 2-D one");
      const int64_t rows = Product(sa, 0, sa.size() - 1);
      x = b.NewTensor(a + ".2d", {rows, sa.back()}, b.Get(a).dtype);
      g = b.NewTensor(*dy + ".2d", {rows, sy.back()}, b.Get(*dy).dtype);
      b.Emit(".view", ComputeType::kIdentity, {a, *dy}, {x, g}, 0);
    }
    if (!tb) matmul(".dw", x, g, !ta, false, dw);  // op(a)^T dY = [k, n]
    else matmul(".dw", g, x, true, ta, dw);        // dY^T op(a) = [n, k]
    b.AddGrad(w, dw);
  }
  return Status::Ok();
}

// y = x + bias: dx = dy; a same-shaped operand's gradient is dy, a
// broadcast one's (y's trailing dims) the sum of dy over the leading rows:
// ones [1, rows] times dy viewed [rows, elems(y)], viewed back (the
// frontends' row sum).
Status Add(const Op& fwd, BackwardBuilder& b) {
  Result<std::string> dy = Dy(fwd, b);
  if (!dy.ok()) return dy.status();
  for (size_t i = 0; i < fwd.inputs.size(); ++i) {
    const std::string& in = fwd.inputs[i];
    if (!b.NeedsGrad(in)) continue;
    const Tensor& t = b.Get(in);
    const Tensor& g = b.Get(*dy);
    if (t.shape == g.shape) {
      b.AddGrad(in, *dy);
      continue;
    }
    const int64_t cols = t.NumElements(), rows = cols > 0 ? g.NumElements() / cols : 0;
    const std::string tag = ".row_sum" + std::to_string(i);
    std::string dy2d = b.NewTensor(*dy + tag + ".2d", {rows, cols}, g.dtype);
    b.Emit(tag + ".view", ComputeType::kIdentity, {*dy}, {dy2d}, 0);
    std::string sum = b.NewTensor(in + ".grad.row_sum", {1, cols}, t.dtype);
    b.Emit(tag, ComputeType::kMatmul, {b.Ones(rows, g.dtype), dy2d}, {sum}, 2.0 * rows * cols,
           {{"transpose_a", 0}, {"transpose_b", 0}});
    std::string din = Like(b, in + ".grad", in);
    b.Emit(tag + ".out", ComputeType::kIdentity, {sum}, {din}, 0);
    b.AddGrad(in, din);
  }
  return Status::Ok();
}

// y = x * z: dx = dy * z, dz = dy * x.
Status Mul(const Op& fwd, BackwardBuilder& b) {
  Result<std::string> dy = Dy(fwd, b);
  if (!dy.ok()) return dy.status();
  for (size_t i = 0; i < 2; ++i) {
    const std::string& x = fwd.inputs[i];
    if (!b.NeedsGrad(x)) continue;
    std::string dx = Like(b, x + ".grad", x);
    b.Emit(i == 0 ? ".d0" : ".d1", ComputeType::kMul, {*dy, fwd.inputs[1 - i]}, {dx},
           FlopsPerUnit(ComputeType::kMul) * Elems(b, x));
    b.AddGrad(x, dx);
  }
  return Status::Ok();
}

// Linear ops (scale, cast, transpose): the same op on dy, with the forward's attributes.
Status Scale(const Op& fwd, BackwardBuilder& b) { return Unary(fwd, b, ComputeType::kScale, {}); }

Status Gelu(const Op& fwd, BackwardBuilder& b) { return Unary(fwd, b, ComputeType::kGeluGrad, {fwd.inputs[0]}); }
Status Silu(const Op& fwd, BackwardBuilder& b) { return Unary(fwd, b, ComputeType::kSiluGrad, {fwd.inputs[0]}); }
Status Softmax(const Op& fwd, BackwardBuilder& b) {
  return Unary(fwd, b, ComputeType::kSoftmaxGrad, {fwd.outputs[0]});
}

// swiglu(gate, up) -> swiglu_grad(dy, gate, up) -> (dgate, dup).
Status Swiglu(const Op& fwd, BackwardBuilder& b) {
  Result<std::string> dy = Dy(fwd, b);
  if (!dy.ok()) return dy.status();
  const std::string &gate = fwd.inputs[0], &up = fwd.inputs[1];
  std::string dgate = Like(b, gate + ".grad", gate), dup = Like(b, up + ".grad", up);
  b.Emit("", ComputeType::kSwigluGrad, {*dy, gate, up}, {dgate, dup},
         FlopsPerUnit(ComputeType::kSwigluGrad) * Elems(b, *dy));
  if (b.NeedsGrad(gate)) b.AddGrad(gate, dgate);
  if (b.NeedsGrad(up)) b.AddGrad(up, dup);
  return Status::Ok();
}

/// A norm's backward: `grad_type`(dy, x, gamma) -> a gradient per input.
Status Norm(const Op& fwd, BackwardBuilder& b, ComputeType grad_type) {
  Result<std::string> dy = Dy(fwd, b);
  if (!dy.ok()) return dy.status();
  std::vector<std::string> grads;
  for (const std::string& in : fwd.inputs) grads.push_back(Like(b, in + ".grad", in));
  b.Emit("", grad_type, {*dy, fwd.inputs[0], fwd.inputs[1]}, grads,
         FlopsPerUnit(grad_type) * Elems(b, fwd.inputs[0]), fwd.attrs);
  for (size_t i = 0; i < fwd.inputs.size(); ++i)
    if (b.NeedsGrad(fwd.inputs[i])) b.AddGrad(fwd.inputs[i], grads[i]);
  return Status::Ok();
}

// layer_norm(x, gamma, beta) -> layer_norm_grad(dy, x, gamma) -> (dx, dgamma, dbeta).
Status LayerNorm(const Op& fwd, BackwardBuilder& b) { return Norm(fwd, b, ComputeType::kLayerNormGrad); }
// rms_norm(x, gamma) -> rms_norm_grad(dy, x, gamma) -> (dx, dgamma).
Status RmsNorm(const Op& fwd, BackwardBuilder& b) { return Norm(fwd, b, ComputeType::kRmsNormGrad); }

/// One gradient op of `grad_type` reading (dy, `saved`...) and writing a
/// gradient per forward input (those no one needs stay unread), with the
/// forward's attributes.
static Status GradOfEveryInput(const Op& fwd, BackwardBuilder& b, ComputeType grad_type, std::vector<std::string> saved,
                               double flops) {
  Result<std::string> dy = Dy(fwd, b);
  if (!dy.ok()) return dy.status();
  std::vector<std::string> grads;
  for (const std::string& in : fwd.inputs) grads.push_back(Like(b, in + ".grad", in));
  saved.insert(saved.begin(), *dy);
  b.Emit("", grad_type, saved, grads, flops, fwd.attrs);
  for (size_t i = 0; i < fwd.inputs.size(); ++i)
    if (b.NeedsGrad(fwd.inputs[i])) b.AddGrad(fwd.inputs[i], grads[i]);
  return Status::Ok();
}

// attention(q, k, v) -> o: attention_grad(do, q, k, v, o) -> (dq, dk, dv),
// kAttentionGradFlops x the forward's flops (the frontends' count).
Status Attention(const Op& fwd, BackwardBuilder& b) {
  return GradOfEveryInput(fwd, b, ComputeType::kAttentionGrad,
                          {fwd.inputs[0], fwd.inputs[1], fwd.inputs[2], fwd.outputs[0]},
                          kAttentionGradFlops * fwd.flops);
}

// embedding(table, ids) -> embedding_grad(dy, ids) -> dtable (ids: none).
Status Embedding(const Op& fwd, BackwardBuilder& b) {
  Result<std::string> dy = Dy(fwd, b);
  if (!dy.ok()) return dy.status();
  const std::string& table = fwd.inputs[0];
  if (!b.NeedsGrad(table)) return Status::Ok();
  std::string dtable = Like(b, table + ".grad", table);
  b.Emit("", ComputeType::kEmbeddingGrad, {*dy, fwd.inputs[1]}, {dtable},
         FlopsPerUnit(ComputeType::kEmbeddingGrad) * Elems(b, *dy));
  b.AddGrad(table, dtable);
  return Status::Ok();
}

// The loss: cross_entropy(m, z, target) with m = reduce_max(logits), z =
// sum_exp(logits, m), target = gather_target(logits, labels). Its rule is the
// whole chain's: cross_entropy_grad(logits, m, z, labels) -> dlogits (for
// d loss = 1), scaled by the term's weight when it is not 1 ("<op>.grad.weight",
// as the Evoformer's frontend); m, z and target get no gradient of their own.
Status CrossEntropy(const Op& fwd, BackwardBuilder& b) {
  if (b.OutputGrad(0) != kUnitGradient)
    return Status::Error(Label(fwd) + ": its gradient is defined only as the loss (d loss = 1)");
  const Op* gather = b.Producer(fwd.inputs[2]);
  const Op* max = b.Producer(fwd.inputs[0]);
  if (gather == nullptr || gather->compute_type != ComputeType::kGatherTarget || max == nullptr ||
      max->compute_type != ComputeType::kReduceMax || gather->inputs[0] != max->inputs[0])
    return Status::Error(Label(fwd) + ": needs (reduce_max(logits), sum_exp(logits, m), "
                         "gather_target(logits, labels)) as its inputs to be differentiated");
  const std::string& logits = gather->inputs[0];
  if (!b.NeedsGrad(logits)) return Status::Ok();
  std::string dlogits = Like(b, logits + ".grad", logits);
  std::map<std::string, double> attrs;
  if (fwd.attrs.count("denominator")) attrs["denominator"] = fwd.Attr("denominator", 1);
  b.Emit("", ComputeType::kCrossEntropyGrad, {logits, fwd.inputs[0], fwd.inputs[1], gather->inputs[1]},
         {dlogits}, FlopsPerUnit(ComputeType::kCrossEntropyGrad) * Elems(b, logits), attrs);
  const double weight = b.LossWeight(0);
  if (weight != 1) {
    std::string scaled = Like(b, logits + ".grad.weighted", logits);
    b.Emit(".weight", ComputeType::kScale, {dlogits}, {scaled},
           FlopsPerUnit(ComputeType::kScale) * Elems(b, logits), {{"scale", weight}});
    dlogits = scaled;
  }
  b.AddGrad(logits, dlogits);
  return Status::Ok();
}

// x[start:start+len] on axis: the piece of x's gradient at start.
Status Slice(const Op& fwd, BackwardBuilder& b) {
  Result<std::string> dy = Dy(fwd, b);
  if (!dy.ok()) return dy.status();
  if (!b.NeedsGrad(fwd.inputs[0])) return Status::Ok();
  b.AddGradPiece(fwd.inputs[0], *dy, static_cast<int>(fwd.Attr("axis", 0)),
                 static_cast<int64_t>(fwd.Attr("start", 0)));
  return Status::Ok();
}

// concat on axis: each input's gradient is its slice of dy.
Status Concat(const Op& fwd, BackwardBuilder& b) {
  Result<std::string> dy = Dy(fwd, b);
  if (!dy.ok()) return dy.status();
  const int axis = static_cast<int>(fwd.Attr("axis", 0));
  int64_t start = 0;
  for (size_t i = 0; i < fwd.inputs.size(); ++i) {
    const std::string& x = fwd.inputs[i];
    const int64_t len = b.Get(x).shape[static_cast<size_t>(axis)];
    if (b.NeedsGrad(x)) {
      std::string dx = Like(b, x + ".grad", x);
      b.Emit(".slice" + std::to_string(i), ComputeType::kSlice, {*dy}, {dx}, 0,
             {{"axis", axis}, {"start", static_cast<double>(start)}});
      b.AddGrad(x, dx);
    }
    start += len;
  }
  return Status::Ok();
}

Status Cast(const Op& fwd, BackwardBuilder& b) { return Unary(fwd, b, ComputeType::kCast, {}); }

// Pairwise reshapes: each output's gradient reshaped back (a free view).
Status Identity(const Op& fwd, BackwardBuilder& b) {
  std::vector<std::string> in, out;
  for (size_t i = 0; i < fwd.outputs.size(); ++i) {
    const std::string dy = b.OutputGrad(i);
    if (dy.empty() || !b.NeedsGrad(fwd.inputs[i])) continue;
    if (dy == kUnitGradient) return Status::Error(Label(fwd) + ": only cross_entropy can be the loss");
    in.push_back(dy);
    out.push_back(Like(b, fwd.inputs[i] + ".grad", fwd.inputs[i]));
    b.AddGrad(fwd.inputs[i], out.back());
  }
  if (!in.empty()) b.Emit("", ComputeType::kIdentity, in, out, 0);
  return Status::Ok();
}

Status Transpose(const Op& fwd, BackwardBuilder& b) { return Unary(fwd, b, ComputeType::kTranspose, {}); }

Status Relu(const Op& fwd, BackwardBuilder& b) { return Unary(fwd, b, ComputeType::kReluGrad, {fwd.inputs[0]}); }

// conv2d(x, w) -> conv2d_grad(dy, x, w) -> (dx, dw), twice the forward's
// flops (the data and the weight gradient each cost one forward).
Status Conv2d(const Op& fwd, BackwardBuilder& b) {
  const std::string &x = fwd.inputs[0], &w = fwd.inputs[1];
  if (!b.NeedsGrad(x) && !b.NeedsGrad(w)) return Dy(fwd, b).status();
  return GradOfEveryInput(fwd, b, ComputeType::kConv2dGrad, {x, w}, 2.0 * fwd.flops);
}

// batch_norm(x, gamma, beta) -> (y, mean, invstd):
// batch_norm_grad(dy, x, gamma, mean, invstd) -> (dx, dgamma, dbeta). Only y
// is differentiated (the statistics feed nothing differentiable).
// Synchronised (4th and 5th inputs, the all-reduced sum and squared
// deviations of batch_norm_stats):
// batch_norm_grad_stats(dy, x, mean, invstd) -> gstats (all-reduced in turn
// where the batch is split), then batch_norm_grad(dy, x, gamma, mean, invstd,
// gstats); the gradient through the statistics is in that formula, so none
// flows into the sums.
Status BatchNorm(const Op& fwd, BackwardBuilder& b) {
  const double flops = FlopsPerUnit(ComputeType::kBatchNormGrad) * Elems(b, fwd.inputs[0]);
  if (fwd.inputs.size() != 5)
    return GradOfEveryInput(fwd, b, ComputeType::kBatchNormGrad,
                            {fwd.inputs[0], fwd.inputs[1], fwd.outputs[1], fwd.outputs[2]}, flops);
  Result<std::string> dy = Dy(fwd, b);
  if (!dy.ok()) return dy.status();
  const std::string &x = fwd.inputs[0], &gamma = fwd.inputs[1], &beta = fwd.inputs[2];
  const Tensor& sum = b.Get(fwd.inputs[3]);
  const std::string gstats = b.NewTensor(x + ".grad.bn_sums", {2, sum.shape[1]}, sum.dtype);
  b.Emit(".sums", ComputeType::kBatchNormGradStats, {*dy, x, fwd.outputs[1], fwd.outputs[2]}, {gstats},
         FlopsPerUnit(ComputeType::kBatchNormGradStats) * Elems(b, x));
  const std::string dx = Like(b, x + ".grad", x), dgamma = Like(b, gamma + ".grad", gamma);
  const std::string dbeta = Like(b, beta + ".grad", beta);
  b.Emit("", ComputeType::kBatchNormGrad, {*dy, x, gamma, fwd.outputs[1], fwd.outputs[2], gstats},
         {dx, dgamma, dbeta}, flops, fwd.attrs);
  if (b.NeedsGrad(x)) b.AddGrad(x, dx);
  if (b.NeedsGrad(gamma)) b.AddGrad(gamma, dgamma);
  if (b.NeedsGrad(beta)) b.AddGrad(beta, dbeta);
  return Status::Ok();
}

// batch_norm_stats: its sums feed only a synchronised batch_norm, whose rule
// differentiates through them; a gradient reaching them otherwise is an error.
Status Statistics(const Op& fwd, BackwardBuilder& b) {
  if (b.OutputGrad(0).empty()) return Status::Ok();
  return Status::Error("autodiff: op '" + fwd.name + "' (batch_norm_stats): a gradient flows into its sums; only a "
                       "synchronised batch_norm may read them");
}

// max_pool2d(x) -> max_pool2d_grad(dy, x) -> dx, the forward's flops.
Status MaxPool2d(const Op& fwd, BackwardBuilder& b) {
  Result<std::string> dy = Dy(fwd, b);
  if (!dy.ok()) return dy.status();
  const std::string& x = fwd.inputs[0];
  if (!b.NeedsGrad(x)) return Status::Ok();
  std::string dx = Like(b, x + ".grad", x);
  b.Emit("", ComputeType::kMaxPool2dGrad, {*dy, x}, {dx}, fwd.flops, fwd.attrs);
  b.AddGrad(x, dx);
  return Status::Ok();
}

// top_k(probs) -> (gates, ids): top_k_grad(dgates, ids, probs) -> dprobs.
Status TopK(const Op& fwd, BackwardBuilder& b) {
  Result<std::string> dgates = Dy(fwd, b);
  if (!dgates.ok()) return dgates.status();
  const std::string& probs = fwd.inputs[0];
  if (dgates->empty() || !b.NeedsGrad(probs)) return Status::Ok();
  std::string dprobs = Like(b, probs + ".grad", probs);
  std::map<std::string, double> attrs;
  if (fwd.attrs.count("normalize")) attrs["normalize"] = fwd.Attr("normalize", 0);
  b.Emit("", ComputeType::kTopKGrad, {*dgates, fwd.outputs[1], probs}, {dprobs},
         FlopsPerUnit(ComputeType::kTopKGrad) * Elems(b, *dgates), attrs);
  b.AddGrad(probs, dprobs);
  return Status::Ok();
}

// moe_dispatch(x, ids) -> buffers: moe_dispatch_grad(dbuffers, ids) -> dx.
Status MoeDispatch(const Op& fwd, BackwardBuilder& b) {
  Result<std::string> dy = Dy(fwd, b);
  if (!dy.ok()) return dy.status();
  const std::string& x = fwd.inputs[0];
  if (!b.NeedsGrad(x)) return Status::Ok();
  std::string dx = Like(b, x + ".grad", x);
  const double unit = FlopsPerUnit(ComputeType::kMoeDispatch);
  b.Emit("", ComputeType::kMoeDispatchGrad, {*dy, fwd.inputs[1]}, {dx},
         unit > 0 ? fwd.flops / unit * FlopsPerUnit(ComputeType::kMoeDispatchGrad) : 0);
  b.AddGrad(x, dx);
  return Status::Ok();
}

// moe_combine(rows, ids, gates) -> y: moe_combine_grad(dy, rows, ids, gates) -> (drows, dgates).
Status MoeCombine(const Op& fwd, BackwardBuilder& b) {
  Result<std::string> dy = Dy(fwd, b);
  if (!dy.ok()) return dy.status();
  const std::string &rows = fwd.inputs[0], &gates = fwd.inputs[2];
  std::string drows = Like(b, rows + ".grad", rows), dgates = Like(b, gates + ".grad", gates);
  const double unit = FlopsPerUnit(ComputeType::kMoeCombine);
  b.Emit("", ComputeType::kMoeCombineGrad, {*dy, rows, fwd.inputs[1], gates}, {drows, dgates},
         unit > 0 ? fwd.flops / unit * FlopsPerUnit(ComputeType::kMoeCombineGrad) : 0);
  if (b.NeedsGrad(rows)) b.AddGrad(rows, drows);
  if (b.NeedsGrad(gates)) b.AddGrad(gates, dgates);
  return Status::Ok();
}

}  // namespace backward_rules
}  // namespace concerto
