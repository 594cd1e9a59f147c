// Shape rules of compute, copy and collective ops (docs/ir.md, "Compute
// types"). Shapes are this rank's local shapes, as stored in the graph.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "concerto/ir/verifier.h"

#include <cassert>

#include "concerto/ir/op_registry.h"
#include "backward_rules.h"
#include "sharding_rules.h"

namespace concerto {
namespace {

using Shape = std::vector<int64_t>;

/// "[8, 2048]".
std::string ShapeText(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

/// Element count, saturating instead of overflowing.
int64_t ElementCount(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d <= 0) return 0;
    if (n > INT64_MAX / d) return INT64_MAX;
    n *= d;
  }
  return n;
}

/// All dims but the last (the shape of a reduction over the last dim).
Shape DropLast(const Shape& shape) {
  return shape.empty() ? Shape{} : Shape(shape.begin(), shape.end() - 1);
}

bool IsIntegerDType(DType dtype) { return dtype == DType::kI32 || dtype == DType::kI64; }

/// The operands of one op, with helpers that return a message or "".
class Operands {
 public:
  Operands(const Op& op, const std::vector<const Tensor*>& in,
           const std::vector<const Tensor*>& out)
      : op_(op), in_(in), out_(out) {}

  const Shape& In(size_t i) const { return in_[i]->shape; }
  const Shape& Out(size_t i) const { return out_[i]->shape; }
  const Tensor& InTensor(size_t i) const { return *in_[i]; }
  const Tensor& OutTensor(size_t i) const { return *out_[i]; }
  size_t NumIn() const { return in_.size(); }
  size_t NumOut() const { return out_.size(); }

  /// Readable name of input i, e.g. "input 1 'w' [1024, 512]".
  std::string InName(size_t i) const { return Describe("input", i, *in_[i]); }
  std::string OutName(size_t i) const { return Describe("output", i, *out_[i]); }

  /// Exactly `n_in` inputs and `n_out` outputs.
  std::string Counts(size_t n_in, size_t n_out) const {
    if (in_.size() == n_in && out_.size() == n_out) return "";
    return Type() + " takes " + std::to_string(n_in) + " input(s) and " + std::to_string(n_out) +
           " output(s), got " + std::to_string(in_.size()) + " and " + std::to_string(out_.size());
  }
  /// Input i has rank >= `min_rank` (or exactly `min_rank` when `exact`).
  std::string InRank(size_t i, size_t min_rank, bool exact = false) const {
    size_t r = In(i).size();
    if (exact ? r == min_rank : r >= min_rank) return "";
    return Type() + ": " + InName(i) + " must have rank " + (exact ? "" : ">= ") +
           std::to_string(min_rank);
  }
  /// Output i has shape `want` (`why` explains where it comes from).
  std::string OutIs(size_t i, const Shape& want, const std::string& why) const {
    if (Out(i) == want) return "";
    return Type() + ": " + OutName(i) + " must have shape " + ShapeText(want) + " (" + why + ")";
  }
  /// Input i has shape `want`.
  std::string InIs(size_t i, const Shape& want, const std::string& why) const {
    if (In(i) == want) return "";
    return Type() + ": " + InName(i) + " must have shape " + ShapeText(want) + " (" + why + ")";
  }
  /// Input i has an integer dtype (ids, labels).
  std::string InInteger(size_t i) const {
    if (IsIntegerDType(in_[i]->dtype)) return "";
    return Type() + ": " + InName(i) + " must have an integer dtype (i32 or i64), got " +
           std::string(ToString(in_[i]->dtype));
  }
  /// Every input and output has the shape of input 0.
  std::string AllSame() const {
    for (size_t i = 1; i < in_.size(); ++i)
      if (auto e = InIs(i, In(0), "same as input 0"); !e.empty()) return e;
    for (size_t i = 0; i < out_.size(); ++i)
      if (auto e = OutIs(i, In(0), "same as input 0"); !e.empty()) return e;
    return "";
  }
  /// An integral attribute; `fallback` when absent; an error when not integral.
  std::optional<int64_t> IntAttr(const std::string& key, std::optional<int64_t> fallback,
                                 std::string* error) const {
    auto it = op_.attrs.find(key);
    if (it == op_.attrs.end()) {
      if (!fallback) *error = Type() + ": missing attribute '" + key + "'";
      return fallback;
    }
    double v = it->second;
    if (!std::isfinite(v) || v != std::floor(v) || std::fabs(v) > 9.0e15) {
      *error = Type() + ": attribute '" + key + "' must be an integer";
      return std::nullopt;
    }
    return static_cast<int64_t>(v);
  }
  std::string Type() const {
    if (op_.kind == OpKind::kCompute) return std::string(ToString(op_.compute_type));
    if (op_.kind == OpKind::kCollective) return std::string(ToString(op_.collective));
    return std::string(ToString(op_.kind));
  }

 private:
  static std::string Describe(const char* role, size_t i, const Tensor& t) {
    return std::string(role) + " " + std::to_string(i) + " '" + t.name + "' " + ShapeText(t.shape);
  }

  const Op& op_;
  const std::vector<const Tensor*>& in_;
  const std::vector<const Tensor*>& out_;
};

/// Runs checks in order and keeps the first failure.
#define CONCERTO_SHAPE_CHECK(expr) \
  do {                             \
    std::string _e = (expr);       \
    if (!_e.empty()) return _e;    \
  } while (0)

/// (x...) -> (y...) with every tensor the shape of input 0.
std::string CheckSameShapes(const Operands& o, size_t n_in, size_t n_out) {
  CONCERTO_SHAPE_CHECK(o.Counts(n_in, n_out));
  return o.AllSame();
}

/// A 0/1 transpose flag.
std::optional<bool> TransposeAttr(const Operands& o, const std::string& key, std::string* error) {
  auto v = o.IntAttr(key, 0, error);
  if (!v) return std::nullopt;
  if (*v != 0 && *v != 1) {
    *error = o.Type() + ": attribute '" + key + "' must be 0 or 1";
    return std::nullopt;
  }
  return *v == 1;
}

/// a [..., m, k] x b [..., k, n] (or 2-D b, broadcast) -> [..., m, n].
std::string CheckMatmul(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.Counts(2, 1));
  CONCERTO_SHAPE_CHECK(o.InRank(0, 2));
  CONCERTO_SHAPE_CHECK(o.InRank(1, 2));
  std::string error;
  auto ta = TransposeAttr(o, "transpose_a", &error);
  auto tb = TransposeAttr(o, "transpose_b", &error);
  if (!ta || !tb) return error;
  const Shape& a = o.In(0);
  const Shape& b = o.In(1);
  const size_t ra = a.size(), rb = b.size();
  int64_t m = *ta ? a[ra - 1] : a[ra - 2];
  int64_t ka = *ta ? a[ra - 2] : a[ra - 1];
  int64_t kb = *tb ? b[rb - 1] : b[rb - 2];
  int64_t n = *tb ? b[rb - 2] : b[rb - 1];
  Shape batch(a.begin(), a.end() - 2);
  if (rb > 2 && Shape(b.begin(), b.end() - 2) != batch)
    return "matmul: batch dimensions differ: " + o.InName(0) + " vs " + o.InName(1) +
           " (b must be 2-D or have a's leading dims)";
  if (ka != kb)
    return "matmul: inner dimensions differ: " + o.InName(0) + " has k=" + std::to_string(ka) +
           ", " + o.InName(1) + " has k=" + std::to_string(kb);
  Shape c = batch;
  c.push_back(m);
  c.push_back(n);
  return o.OutIs(0, c, "batch + [m, n]");
}

/// (x, y) -> x + y; y's shape is a suffix of x's.
std::string CheckAdd(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.Counts(2, 1));
  const Shape& x = o.In(0);
  const Shape& y = o.In(1);
  bool suffix = y.size() <= x.size() && std::equal(y.begin(), y.end(), x.end() - y.size());
  if (!suffix)
    return "add: " + o.InName(1) + " must equal " + o.InName(0) +
           " or a suffix of it (broadcast over leading dims)";
  return o.OutIs(0, x, "same as input 0");
}

/// (x, gamma[, beta]) -> y, normalizing over the last dim.
std::string CheckNorm(const Operands& o, bool with_beta) {
  CONCERTO_SHAPE_CHECK(o.Counts(with_beta ? 3 : 2, 1));
  CONCERTO_SHAPE_CHECK(o.InRank(0, 1));
  Shape h = {o.In(0).back()};
  CONCERTO_SHAPE_CHECK(o.InIs(1, h, "gamma is [last dim of x]"));
  if (with_beta) CONCERTO_SHAPE_CHECK(o.InIs(2, h, "beta is [last dim of x]"));
  return o.OutIs(0, o.In(0), "same as x");
}

/// (dy, x, gamma) -> (dx, dgamma[, dbeta]).
std::string CheckNormGrad(const Operands& o, bool with_beta) {
  CONCERTO_SHAPE_CHECK(o.Counts(3, with_beta ? 3 : 2));
  CONCERTO_SHAPE_CHECK(o.InRank(1, 1));
  const Shape& x = o.In(1);
  Shape h = {x.back()};
  CONCERTO_SHAPE_CHECK(o.InIs(0, x, "dy has x's shape"));
  CONCERTO_SHAPE_CHECK(o.InIs(2, h, "gamma is [last dim of x]"));
  CONCERTO_SHAPE_CHECK(o.OutIs(0, x, "dx has x's shape"));
  CONCERTO_SHAPE_CHECK(o.OutIs(1, h, "dgamma has gamma's shape"));
  if (with_beta) CONCERTO_SHAPE_CHECK(o.OutIs(2, h, "dbeta has gamma's shape"));
  return "";
}

/// q [b, s, heads*d], k and v [b, s, kv_heads*d] starting at input `first`.
std::string CheckQkv(const Operands& o, size_t first) {
  for (size_t i = first; i < first + 3; ++i) CONCERTO_SHAPE_CHECK(o.InRank(i, 3, true));
  std::string error;
  auto heads = o.IntAttr("heads", std::nullopt, &error);
  if (!heads) return error;
  auto kv_heads = o.IntAttr("kv_heads", *heads, &error);
  if (!kv_heads) return error;
  if (*heads < 1 || *kv_heads < 1 || *heads % *kv_heads != 0)
    return "attention: attributes heads=" + std::to_string(*heads) +
           " and kv_heads=" + std::to_string(*kv_heads) +
           " must be >= 1 with heads a multiple of kv_heads";
  const Shape& q = o.In(first);
  if (q[2] % *heads != 0)
    return "attention: " + o.InName(first) +
           " last dim is not a multiple of heads=" + std::to_string(*heads);
  Shape kv = {q[0], q[1], *kv_heads * (q[2] / *heads)};
  CONCERTO_SHAPE_CHECK(o.InIs(first + 1, kv, "k is [b, s, kv_heads*d]"));
  return o.InIs(first + 2, kv, "v is [b, s, kv_heads*d]");
}

/// (q, k, v) -> o.
std::string CheckAttention(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.Counts(3, 1));
  CONCERTO_SHAPE_CHECK(CheckQkv(o, 0));
  return o.OutIs(0, o.In(0), "o has q's shape");
}

/// (do, q, k, v[, o]) -> (dq, dk, dv); o, the forward output, is what a
/// flash-style backward reads for its row sums.
std::string CheckAttentionGrad(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.Counts(o.NumIn() == 5 ? 5 : 4, 3));
  CONCERTO_SHAPE_CHECK(CheckQkv(o, 1));
  CONCERTO_SHAPE_CHECK(o.InIs(0, o.In(1), "do has q's shape"));
  if (o.NumIn() == 5) CONCERTO_SHAPE_CHECK(o.InIs(4, o.In(1), "o (the forward output) has q's shape"));
  CONCERTO_SHAPE_CHECK(o.OutIs(0, o.In(1), "dq has q's shape"));
  CONCERTO_SHAPE_CHECK(o.OutIs(1, o.In(2), "dk has k's shape"));
  return o.OutIs(2, o.In(3), "dv has v's shape");
}

/// (table [V, h], ids [...]) -> [..., h].
std::string CheckEmbedding(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.Counts(2, 1));
  CONCERTO_SHAPE_CHECK(o.InRank(0, 2, true));
  CONCERTO_SHAPE_CHECK(o.InRank(1, 1));
  CONCERTO_SHAPE_CHECK(o.InInteger(1));
  Shape y = o.In(1);
  y.push_back(o.In(0)[1]);
  return o.OutIs(0, y, "ids shape + [h]");
}

/// (dy [..., h], ids [...]) -> dtable [V, h].
std::string CheckEmbeddingGrad(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.Counts(2, 1));
  CONCERTO_SHAPE_CHECK(o.InRank(0, 2));
  CONCERTO_SHAPE_CHECK(o.InInteger(1));
  CONCERTO_SHAPE_CHECK(o.InIs(1, DropLast(o.In(0)), "ids shape is dy shape without its last dim"));
  const Shape& t = o.Out(0);
  if (t.size() != 2 || t[1] != o.In(0).back())
    return "embedding_grad: " + o.OutName(0) + " must be [V, " + std::to_string(o.In(0).back()) +
           "] (h from dy)";
  return "";
}

/// (x) -> max over the last dim.
std::string CheckReduceMax(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.Counts(1, 1));
  CONCERTO_SHAPE_CHECK(o.InRank(0, 1));
  return o.OutIs(0, DropLast(o.In(0)), "x without its last dim");
}

/// (x, m) -> sum(exp(x - m)) over the last dim.
std::string CheckSumExp(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.Counts(2, 1));
  CONCERTO_SHAPE_CHECK(o.InRank(0, 1));
  Shape r = DropLast(o.In(0));
  CONCERTO_SHAPE_CHECK(o.InIs(1, r, "m is x without its last dim"));
  return o.OutIs(0, r, "x without its last dim");
}

/// (logits [..., V], labels [...]) -> [...].
std::string CheckGatherTarget(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.Counts(2, 1));
  CONCERTO_SHAPE_CHECK(o.InRank(0, 1));
  CONCERTO_SHAPE_CHECK(o.InInteger(1));
  Shape r = DropLast(o.In(0));
  CONCERTO_SHAPE_CHECK(o.InIs(1, r, "labels are logits without the vocab dim"));
  return o.OutIs(0, r, "logits without the vocab dim");
}

/// (m, z, target) -> a scalar ([] or [1]).
std::string CheckCrossEntropy(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.Counts(3, 1));
  CONCERTO_SHAPE_CHECK(o.InIs(1, o.In(0), "z has m's shape"));
  CONCERTO_SHAPE_CHECK(o.InIs(2, o.In(0), "target has m's shape"));
  if (!o.Out(0).empty() && o.Out(0) != Shape{1})
    return "cross_entropy: " + o.OutName(0) + " must be a scalar ([] or [1])";
  return "";
}

/// (logits [..., V], m, z, labels [...]) -> dlogits.
std::string CheckCrossEntropyGrad(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.Counts(4, 1));
  CONCERTO_SHAPE_CHECK(o.InRank(0, 1));
  Shape r = DropLast(o.In(0));
  for (size_t i = 1; i < 4; ++i) CONCERTO_SHAPE_CHECK(o.InIs(i, r, "logits without the vocab dim"));
  CONCERTO_SHAPE_CHECK(o.InInteger(3));
  return o.OutIs(0, o.In(0), "same as logits");
}

/// (x) -> x[start:start+len] on attrs.axis, len from the output.
std::string CheckSlice(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.Counts(1, 1));
  std::string error;
  auto axis = o.IntAttr("axis", std::nullopt, &error);
  auto start = axis ? o.IntAttr("start", std::nullopt, &error) : std::nullopt;
  if (!axis || !start) return error;
  const Shape& x = o.In(0);
  if (*axis < 0 || *axis >= static_cast<int64_t>(x.size()))
    return "slice: attribute axis=" + std::to_string(*axis) + " is outside " + o.InName(0);
  Shape y = o.Out(0);
  if (y.size() != x.size())
    return "slice: " + o.OutName(0) + " must have the rank of " + o.InName(0);
  int64_t len = y[*axis];
  auto want_len = o.IntAttr("len", len, &error);
  if (!want_len) return error;
  if (*want_len != len)
    return "slice: attribute len=" + std::to_string(*want_len) + " differs from " + o.OutName(0);
  if (*start < 0 || *start > x[*axis] - len)
    return "slice: [" + std::to_string(*start) + ", " + std::to_string(*start + len) +
           ") is outside dim " + std::to_string(*axis) + " of " + o.InName(0);
  y[*axis] = x[*axis];
  if (y != x)
    return "slice: " + o.OutName(0) + " must match " + o.InName(0) + " except on axis " +
           std::to_string(*axis);
  return "";
}

/// (x...) -> concat on attrs.axis.
std::string CheckConcat(const Operands& o) {
  if (o.NumIn() < 1 || o.NumOut() != 1)
    return "concat takes >= 1 inputs and 1 output, got " + std::to_string(o.NumIn()) + " and " +
           std::to_string(o.NumOut());
  std::string error;
  auto axis = o.IntAttr("axis", std::nullopt, &error);
  if (!axis) return error;
  Shape want = o.In(0);
  if (*axis < 0 || *axis >= static_cast<int64_t>(want.size()))
    return "concat: attribute axis=" + std::to_string(*axis) + " is outside " + o.InName(0);
  for (size_t i = 1; i < o.NumIn(); ++i) {
    Shape s = o.In(i);
    if (s.size() != want.size())
      return "concat: " + o.InName(i) + " must have the rank of " + o.InName(0);
    int64_t along = s[*axis];
    s[*axis] = want[*axis];
    if (s != want)
      return "concat: " + o.InName(i) + " must match " + o.InName(0) + " except on axis " +
             std::to_string(*axis);
    want[*axis] += along;
  }
  return o.OutIs(0, want, "inputs joined on axis " + std::to_string(*axis));
}

/// n inputs -> n outputs, pairwise the same number of elements (a row-major view).
std::string CheckIdentity(const Operands& o) {
  if (o.NumIn() != o.NumOut())
    return "identity takes as many outputs as inputs, got " + std::to_string(o.NumIn()) + " and " +
           std::to_string(o.NumOut());
  for (size_t i = 0; i < o.NumIn(); ++i)
    if (ElementCount(o.In(i)) != ElementCount(o.Out(i)))
      return "identity: " + o.OutName(i) + " must have as many elements as " + o.InName(i);
  return "";
}

/// A float (not integer) dtype for input i (gates, probabilities).
std::string InFloat(const Operands& o, size_t i) {
  if (!IsIntegerDType(o.InTensor(i).dtype)) return "";
  return o.Type() + ": " + o.InName(i) + " must have a float dtype";
}

/// (probs [..., E]) -> (gates [..., k], ids [..., k] integer); 1 <= k <= E.
std::string CheckTopK(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.Counts(1, 2));
  CONCERTO_SHAPE_CHECK(o.InRank(0, 1));
  std::string error;
  auto k = o.IntAttr("k", std::nullopt, &error);
  if (!k) return error;
  auto normalize = o.IntAttr("normalize", 0, &error);
  if (!normalize) return error;
  if (*normalize != 0 && *normalize != 1) return "top_k: attribute 'normalize' must be 0 or 1";
  const Shape& p = o.In(0);
  if (*k < 1 || *k > p.back())
    return "top_k: attribute k=" + std::to_string(*k) + " must be in [1, " +
           std::to_string(p.back()) + "] (the last dim of " + o.InName(0) + ")";
  Shape want = DropLast(p);
  want.push_back(*k);
  CONCERTO_SHAPE_CHECK(o.OutIs(0, want, "gates: probs with k in the last dim"));
  CONCERTO_SHAPE_CHECK(o.OutIs(1, want, "ids: probs with k in the last dim"));
  if (!IsIntegerDType(o.OutTensor(1).dtype))
    return "top_k: " + o.OutName(1) + " must have an integer dtype (i32 or i64)";
  return "";
}

/// (dgates [..., k], ids [..., k], probs [..., E]) -> dprobs [..., E].
std::string CheckTopKGrad(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.Counts(3, 1));
  CONCERTO_SHAPE_CHECK(o.InRank(2, 1));
  CONCERTO_SHAPE_CHECK(o.InInteger(1));
  const Shape& p = o.In(2);
  const Shape& g = o.In(0);
  if (g.size() != p.size() || DropLast(g) != DropLast(p) || g.back() > p.back())
    return "top_k_grad: " + o.InName(0) + " must be " + o.InName(2) +
           " with k <= E in the last dim";
  CONCERTO_SHAPE_CHECK(o.InIs(1, g, "ids have dgates' shape"));
  return o.OutIs(0, p, "dprobs have probs' shape");
}

/// Checks tokens [G, n, h] at input `x`, ids [G, n, k] at input `ids` and
/// expert buffers [E, G*C, h] (C >= 0 integral) described by `buffers`.
std::string CheckMoeOperands(const Operands& o, const Shape& x, const std::string& x_name,
                             size_t ids, const Shape& buffers, const std::string& buffers_name) {
  CONCERTO_SHAPE_CHECK(o.InInteger(ids));
  if (x.size() != 3) return o.Type() + ": " + x_name + " must be tokens [G, n, h] (rank 3)";
  const Shape& id = o.In(ids);
  if (id.size() != 3 || id[0] != x[0] || id[1] != x[1] || id[2] < 1)
    return o.Type() + ": " + o.InName(ids) + " must be [G, n, k] with G, n from " + x_name;
  if (buffers.size() != 3 || buffers[2] != x[2] || buffers[0] < 1 ||
      (x[0] > 0 && buffers[1] % x[0] != 0))
    return o.Type() + ": " + buffers_name + " must be expert buffers [E, G*C, h] with G=" +
           std::to_string(x[0]) + " and h=" + std::to_string(x[2]) + " from " + x_name;
  return "";
}

/// (x [G, n, h], ids [G, n, k]) -> buffers [E, G*C, h].
std::string CheckMoeDispatch(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.Counts(2, 1));
  return CheckMoeOperands(o, o.In(0), o.InName(0), 1, o.Out(0), o.OutName(0));
}

/// (dbuffers [E, G*C, h], ids [G, n, k]) -> dx [G, n, h].
std::string CheckMoeDispatchGrad(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.Counts(2, 1));
  return CheckMoeOperands(o, o.Out(0), o.OutName(0), 1, o.In(0), o.InName(0));
}

/// (y [E, G*C, h], ids [G, n, k], gates [G, n, k]) -> out [G, n, h].
std::string CheckMoeCombine(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.Counts(3, 1));
  CONCERTO_SHAPE_CHECK(CheckMoeOperands(o, o.Out(0), o.OutName(0), 1, o.In(0), o.InName(0)));
  CONCERTO_SHAPE_CHECK(InFloat(o, 2));
  return o.InIs(2, o.In(1), "gates have ids' shape");
}

/// (dout [G, n, h], y [E, G*C, h], ids, gates) -> (dy = y, dgates = gates).
std::string CheckMoeCombineGrad(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.Counts(4, 2));
  CONCERTO_SHAPE_CHECK(CheckMoeOperands(o, o.In(0), o.InName(0), 2, o.In(1), o.InName(1)));
  CONCERTO_SHAPE_CHECK(InFloat(o, 3));
  CONCERTO_SHAPE_CHECK(o.InIs(3, o.In(2), "gates have ids' shape"));
  CONCERTO_SHAPE_CHECK(o.OutIs(0, o.In(1), "dy has y's shape"));
  return o.OutIs(1, o.In(3), "dgates have gates' shape");
}

/// (x) -> x with dims axis0 and axis1 swapped.
std::string CheckTranspose(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.Counts(1, 1));
  std::string error;
  auto a0 = o.IntAttr("axis0", std::nullopt, &error);
  auto a1 = a0 ? o.IntAttr("axis1", std::nullopt, &error) : std::nullopt;
  if (!a0 || !a1) return error;
  Shape y = o.In(0);
  const int64_t rank = static_cast<int64_t>(y.size());
  if (*a0 < 0 || *a0 >= rank || *a1 < 0 || *a1 >= rank)
    return "transpose: attributes axis0=" + std::to_string(*a0) + ", axis1=" + std::to_string(*a1) +
           " must be dims of " + o.InName(0);
  std::swap(y[*a0], y[*a1]);
  return o.OutIs(0, y, "x with axis0 and axis1 swapped");
}

/// One spatial dim of a window op (convolution, pooling): (in + 2 pad -
/// kernel) / stride + 1 positions, or nullopt when the window does not fit.
std::optional<int64_t> WindowPositions(int64_t in, int64_t kernel, int64_t stride, int64_t pad) {
  const int64_t span = in + 2 * pad - kernel;
  if (stride < 1 || kernel < 1 || pad < 0 || span < 0) return std::nullopt;
  return span / stride + 1;
}

/// conv2d's output shape from x [N, C, H, W] and w [K, C, R, S], or an error.
std::string ConvOutput(const Operands& o, size_t x, size_t w, Shape* y) {
  CONCERTO_SHAPE_CHECK(o.InRank(x, 4, true));
  CONCERTO_SHAPE_CHECK(o.InRank(w, 4, true));
  std::string error;
  auto stride = o.IntAttr("stride", 1, &error);
  auto pad = stride ? o.IntAttr("padding", 0, &error) : std::nullopt;
  if (!stride || !pad) return error;
  const Shape &xs = o.In(x), &ws = o.In(w);
  if (xs[1] != ws[1])
    return o.Type() + ": " + o.InName(x) + " has " + std::to_string(xs[1]) + " channels, " + o.InName(w) +
           " expects " + std::to_string(ws[1]);
  auto p = WindowPositions(xs[2], ws[2], *stride, *pad), q = WindowPositions(xs[3], ws[3], *stride, *pad);
  if (!p || !q)
    return o.Type() + ": a " + std::to_string(ws[2]) + "x" + std::to_string(ws[3]) + " kernel with stride " +
           std::to_string(*stride) + " and padding " + std::to_string(*pad) + " does not fit " + o.InName(x);
  *y = {xs[0], ws[0], *p, *q};
  return "";
}

std::string CheckConv2d(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.Counts(2, 1));
  Shape y;
  CONCERTO_SHAPE_CHECK(ConvOutput(o, 0, 1, &y));
  return o.OutIs(0, y, "[N, K, (H + 2 padding - R) / stride + 1, (W + 2 padding - S) / stride + 1]");
}

/// conv2d_grad: (dy, x, w) -> (dx, dw), dy shaped as conv2d(x, w).
std::string CheckConv2dGrad(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.Counts(3, 2));
  Shape y;
  CONCERTO_SHAPE_CHECK(ConvOutput(o, 1, 2, &y));
  CONCERTO_SHAPE_CHECK(o.InIs(0, y, "conv2d(x, w)'s output"));
  CONCERTO_SHAPE_CHECK(o.OutIs(0, o.In(1), "x's"));
  return o.OutIs(1, o.In(2), "w's");
}

/// max_pool2d's output shape from x [N, C, H, W], or an error.
std::string PoolOutput(const Operands& o, size_t x, Shape* y) {
  CONCERTO_SHAPE_CHECK(o.InRank(x, 4, true));
  std::string error;
  auto kernel = o.IntAttr("kernel", std::nullopt, &error);
  auto stride = kernel ? o.IntAttr("stride", *kernel, &error) : std::nullopt;
  auto pad = stride ? o.IntAttr("padding", 0, &error) : std::nullopt;
  if (!kernel || !stride || !pad) return error;
  if (2 * *pad > *kernel)
    return o.Type() + ": padding " + std::to_string(*pad) + " is more than half the kernel " + std::to_string(*kernel);
  const Shape& xs = o.In(x);
  auto p = WindowPositions(xs[2], *kernel, *stride, *pad), q = WindowPositions(xs[3], *kernel, *stride, *pad);
  if (!p || !q)
    return o.Type() + ": a " + std::to_string(*kernel) + "x" + std::to_string(*kernel) + " window with stride " +
           std::to_string(*stride) + " and padding " + std::to_string(*pad) + " does not fit " + o.InName(x);
  *y = {xs[0], xs[1], *p, *q};
  return "";
}

std::string CheckMaxPool2d(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.Counts(1, 1));
  Shape y;
  CONCERTO_SHAPE_CHECK(PoolOutput(o, 0, &y));
  return o.OutIs(0, y, "[N, C, (H + 2 padding - kernel) / stride + 1, (W + 2 padding - kernel) / stride + 1]");
}

/// max_pool2d_grad: (dy, x) -> dx, dy shaped as max_pool2d(x).
std::string CheckMaxPool2dGrad(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.Counts(2, 1));
  Shape y;
  CONCERTO_SHAPE_CHECK(PoolOutput(o, 1, &y));
  CONCERTO_SHAPE_CHECK(o.InIs(0, y, "max_pool2d(x)'s output"));
  return o.OutIs(0, o.In(1), "x's");
}

/// batch_norm's operands: x [N, C, ...] (rank >= 2) at input `x`, then
/// per-channel vectors [C] at inputs `first_vec`..`first_vec + vecs - 1`.
std::string CheckChannelVectors(const Operands& o, size_t x, size_t first_vec, size_t vecs) {
  CONCERTO_SHAPE_CHECK(o.InRank(x, 2));
  const Shape c = {o.In(x)[1]};
  for (size_t i = first_vec; i < first_vec + vecs; ++i)
    CONCERTO_SHAPE_CHECK(o.InIs(i, c, "one per channel of x"));
  return "";
}

/// The `count` attribute of synchronised batch norm (elements per channel
/// over every rank): >= 1.
std::string CheckSyncCount(const Operands& o) {
  std::string error;
  auto count = o.IntAttr("count", std::nullopt, &error);
  if (!error.empty()) return error;
  if (*count < 1) return o.Type() + ": attribute 'count' must be >= 1, got " + std::to_string(*count);
  return "";
}

/// batch_norm: (x, gamma, beta[, sum, sqdev]) -> (y, mean, invstd).
std::string CheckBatchNorm(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.NumIn() == 5 && o.NumOut() == 3 ? std::string() : o.Counts(3, 3));
  CONCERTO_SHAPE_CHECK(CheckChannelVectors(o, 0, 1, 2));
  if (o.NumIn() == 5) {
    CONCERTO_SHAPE_CHECK(o.InIs(3, Shape{1, o.In(0)[1]}, "the sum of x per channel"));
    CONCERTO_SHAPE_CHECK(o.InIs(4, Shape{1, o.In(0)[1]}, "the squared deviations' sum per channel"));
    CONCERTO_SHAPE_CHECK(CheckSyncCount(o));
  }
  CONCERTO_SHAPE_CHECK(o.OutIs(0, o.In(0), "x's"));
  CONCERTO_SHAPE_CHECK(o.OutIs(1, o.In(1), "one per channel"));
  return o.OutIs(2, o.In(1), "one per channel");
}

/// batch_norm_grad: (dy, x, gamma, mean, invstd[, gsums]) -> (dx, dgamma, dbeta).
std::string CheckBatchNormGrad(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.NumIn() == 6 && o.NumOut() == 3 ? std::string() : o.Counts(5, 3));
  CONCERTO_SHAPE_CHECK(CheckChannelVectors(o, 1, 2, 3));
  if (o.NumIn() == 6) {
    CONCERTO_SHAPE_CHECK(o.InIs(5, Shape{2, o.In(1)[1]}, "sums per channel of x"));
    CONCERTO_SHAPE_CHECK(CheckSyncCount(o));
  }
  CONCERTO_SHAPE_CHECK(o.InIs(0, o.In(1), "x's"));
  CONCERTO_SHAPE_CHECK(o.OutIs(0, o.In(1), "x's"));
  CONCERTO_SHAPE_CHECK(o.OutIs(1, o.In(2), "gamma's"));
  return o.OutIs(2, o.In(2), "gamma's");
}

/// batch_norm_stats: (x) -> sum [1, C], or (x, sum [1, C]) -> sqdev [1, C]
/// with `count`.
std::string CheckBatchNormStats(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.NumIn() == 2 && o.NumOut() == 1 ? std::string() : o.Counts(1, 1));
  CONCERTO_SHAPE_CHECK(o.InRank(0, 2));
  if (o.NumIn() == 2) {
    CONCERTO_SHAPE_CHECK(o.InIs(1, Shape{1, o.In(0)[1]}, "the sum of x per channel"));
    CONCERTO_SHAPE_CHECK(CheckSyncCount(o));
  }
  return o.OutIs(0, Shape{1, o.In(0)[1]}, "one sum per channel of x");
}

/// batch_norm_grad_stats: (dy, x, mean, invstd) -> gstats [2, C].
std::string CheckBatchNormGradStats(const Operands& o) {
  CONCERTO_SHAPE_CHECK(o.Counts(4, 1));
  CONCERTO_SHAPE_CHECK(CheckChannelVectors(o, 1, 2, 2));
  CONCERTO_SHAPE_CHECK(o.InIs(0, o.In(1), "x's"));
  return o.OutIs(0, Shape{2, o.In(1)[1]}, "sums per channel of x");
}

/// Copy: n -> n, pairwise the same shape and dtype.
std::string CheckCopy(const Operands& o) {
  if (o.NumIn() != o.NumOut())
    return "copy takes as many outputs as inputs, got " + std::to_string(o.NumIn()) + " and " +
           std::to_string(o.NumOut());
  for (size_t i = 0; i < o.NumIn(); ++i) {
    CONCERTO_SHAPE_CHECK(o.OutIs(i, o.In(i), "same as input " + std::to_string(i)));
  }
  return "";
}

/// One input/output pair of a collective over `group_size` ranks.
std::string CheckCollectivePair(const Operands& o, CollectiveType type, size_t i,
                                int64_t group_size) {
  const Shape& in = o.In(i);
  const Shape& out = o.Out(i);
  if (o.InTensor(i).dtype != o.OutTensor(i).dtype)
    return o.Type() + ": " + o.OutName(i) + " must have the dtype of " + o.InName(i);
  switch (type) {
    case CollectiveType::kAllReduce:
    case CollectiveType::kBroadcast: return o.OutIs(i, in, "same as input " + std::to_string(i));
    case CollectiveType::kAllToAll:
      if (ElementCount(in) != ElementCount(out))
        return "all_to_all: " + o.OutName(i) + " must have as many elements as " + o.InName(i);
      if (group_size > 0 && ElementCount(in) % group_size != 0)
        return "all_to_all: " + o.InName(i) + " does not split into " + std::to_string(group_size) +
               " equal chunks";
      return "";
    case CollectiveType::kAllGather:
    case CollectiveType::kReduceScatter: {
      bool gather = type == CollectiveType::kAllGather;
      const Shape& small = gather ? in : out;
      const Shape& big = gather ? out : in;
      if (small.size() == big.size()) {
        if (group_size == 1 && small == big) return "";
        for (size_t d = 0; d < small.size(); ++d) {
          Shape scaled = small;
          scaled[d] *= group_size;
          if (scaled == big) return "";
        }
      }
      return o.Type() + ": " + (gather ? o.OutName(i) : o.InName(i)) + " must be " +
             (gather ? o.InName(i) : o.OutName(i)) + " with one dim multiplied by the group size " +
             std::to_string(group_size);
    }
  }
  return "unknown collective";
}

#undef CONCERTO_SHAPE_CHECK

}  // namespace

// ---- The op registry (ir/op_registry.h): one entry per compute type, beside
// the shape rules it points at. ----

/// A shape rule from an expression over `o` (the op's Operands).
#define CONCERTO_RULE(expr)                                                                          \
  +[](const Op& op_, const std::vector<const Tensor*>& in_, const std::vector<const Tensor*>& out_) { \
    const Operands o(op_, in_, out_);                                                                \
    return std::string(expr);                                                                        \
  }

const std::vector<OpTypeInfo>& OpRegistry() {
  using T = ComputeType;
  constexpr double kAttrMax = 1e15;  // integer attributes: no practical upper bound
  static const std::vector<OpTypeInfo> registry = {
      {T::kMatmul, "matmul", "(a, b) -> c; attrs transpose_a, transpose_b; leading dims batch", 0,
       "formula: 2 m n k per batch",
       CONCERTO_RULE(CheckMatmul(o)), KernelClass::kTensorCore,
       {{"transpose_a", false, true, 0, 1, true}, {"transpose_b", false, true, 0, 1, true}}, sharding_rules::Matmul, backward_rules::Matmul},
      {T::kAdd, "add", "(x, y) -> x + y; y may broadcast over leading dims", 1, "output element",
       CONCERTO_RULE(CheckAdd(o)), KernelClass::kStreaming,
       {}, sharding_rules::Add, backward_rules::Add},
      {T::kMul, "mul", "(x, y) -> x * y, same shapes", 1, "output element",
       CONCERTO_RULE(CheckSameShapes(o, 2, 1)), KernelClass::kStreaming,
       {}, sharding_rules::Elementwise, backward_rules::Mul},
      {T::kScale, "scale", "(x) -> x * attrs.scale", 1, "output element",
       CONCERTO_RULE(CheckSameShapes(o, 1, 1)), KernelClass::kStreaming,
       {{"scale"}}, sharding_rules::Scale, backward_rules::Scale},
      {T::kGelu, "gelu", "(x) -> gelu(x) (tanh approximation; attrs exact 1: x Phi(x))", 8, "output element",
       CONCERTO_RULE(CheckSameShapes(o, 1, 1)), KernelClass::kVector,
       {{"exact", false, true, 0, 1}}, sharding_rules::Elementwise, backward_rules::Gelu},
      {T::kGeluGrad, "gelu_grad", "(dy, x) -> dx; attrs exact", 12, "output element",
       CONCERTO_RULE(CheckSameShapes(o, 2, 1)), KernelClass::kVector,
       {{"exact", false, true, 0, 1}}, sharding_rules::Elementwise},
      {T::kSilu, "silu", "(x) -> x * sigmoid(x)", 4, "output element",
       CONCERTO_RULE(CheckSameShapes(o, 1, 1)), KernelClass::kVector,
       {}, sharding_rules::Elementwise, backward_rules::Silu},
      {T::kSiluGrad, "silu_grad", "(dy, x) -> dx", 8, "output element",
       CONCERTO_RULE(CheckSameShapes(o, 2, 1)), KernelClass::kVector,
       {}, sharding_rules::Elementwise},
      // silu (4) and the product (1), per output; its gradient: both input grads.
      {T::kSwiglu, "swiglu", "(gate, up) -> silu(gate) * up", 6, "output element",
       CONCERTO_RULE(CheckSameShapes(o, 2, 1)), KernelClass::kVector,
       {}, sharding_rules::Elementwise, backward_rules::Swiglu},
      {T::kSwigluGrad, "swiglu_grad", "(dy, gate, up) -> (dgate, dup)", 12, "element of dy",
       CONCERTO_RULE(CheckSameShapes(o, 3, 2)), KernelClass::kVector,
       {}, sharding_rules::Elementwise},
      {T::kLayerNorm, "layer_norm", "(x, gamma, beta) -> y over the last dim; attrs eps", 8, "element of x",
       CONCERTO_RULE(CheckNorm(o, true)), KernelClass::kVector,
       {{"eps"}}, sharding_rules::Norm, backward_rules::LayerNorm},
      {T::kLayerNormGrad, "layer_norm_grad", "(dy, x, gamma) -> (dx, dgamma, dbeta)", 16, "element of x",
       CONCERTO_RULE(CheckNormGrad(o, true)), KernelClass::kVector,
       {{"eps"}}, sharding_rules::Norm},
      {T::kRmsNorm, "rms_norm", "(x, gamma) -> y over the last dim; attrs eps", 4, "element of x",
       CONCERTO_RULE(CheckNorm(o, false)), KernelClass::kVector,
       {{"eps"}}, sharding_rules::Norm, backward_rules::RmsNorm},
      {T::kRmsNormGrad, "rms_norm_grad", "(dy, x, gamma) -> (dx, dgamma)", 8, "element of x",
       CONCERTO_RULE(CheckNormGrad(o, false)), KernelClass::kVector,
       {{"eps"}}, sharding_rules::Norm},
      // max, subtract, exp, sum, divide; the gradient: product, row sum, subtract, product.
      {T::kSoftmax, "softmax", "(x) -> softmax over the last dim", 5, "output element",
       CONCERTO_RULE(CheckSameShapes(o, 1, 1)), KernelClass::kVector,
       {}, sharding_rules::Softmax, backward_rules::Softmax},
      {T::kSoftmaxGrad, "softmax_grad", "(dy, y) -> dx", 4, "output element",
       CONCERTO_RULE(CheckSameShapes(o, 2, 1)), KernelClass::kVector,
       {}, sharding_rules::Softmax},
      {T::kAttention, "attention", "(q, k, v) [b, s, heads*d] -> o; attrs heads, kv_heads, causal, fused (0: scores materialised)", 0,
       "formula: 4 b s^2 h (halved when causal)",
       CONCERTO_RULE(CheckAttention(o)), KernelClass::kTensorCore,
       {{"heads", true, true, 1, kAttrMax, true}, {"kv_heads", false, true, 1, kAttrMax, true}, {"causal", false, true, 0, 1, true}, {"scale"}, {"fused", false, true, 0, 1, true}}, sharding_rules::Attention, backward_rules::Attention},
      {T::kAttentionGrad, "attention_grad", "(do, q, k, v) -> (dq, dk, dv)", 0, "formula: 2.5x the forward",
       CONCERTO_RULE(CheckAttentionGrad(o)), KernelClass::kTensorCore,
       {{"heads", true, true, 1, kAttrMax, true}, {"kv_heads", false, true, 1, kAttrMax, true}, {"causal", false, true, 0, 1, true}, {"scale"}, {"fused", false, true, 0, 1, true}}, sharding_rules::Attention},
      {T::kEmbedding, "embedding", "(table [V, h], ids [b, s]) -> [b, s, h]", 0, "a gather: bytes only",
       CONCERTO_RULE(CheckEmbedding(o)), KernelClass::kVector,
       {}, sharding_rules::Embedding, backward_rules::Embedding},
      {T::kEmbeddingGrad, "embedding_grad", "(dy [b, s, h], ids) -> dtable [V, h]", 1,
       "element of dy (scatter-add)",
       CONCERTO_RULE(CheckEmbeddingGrad(o)), KernelClass::kVector,
       {}, sharding_rules::EmbeddingGrad},
      {T::kReduceMax, "reduce_max", "(x) -> max over the last dim", 1, "element of x",
       CONCERTO_RULE(CheckReduceMax(o)), KernelClass::kVector,
       {}, sharding_rules::RowReduction},
      {T::kSumExp, "sum_exp", "(x, m) -> sum(exp(x - m)) over the last dim", 3,
       "element of x (subtract, exp, accumulate)",
       CONCERTO_RULE(CheckSumExp(o)), KernelClass::kVector,
       {}, sharding_rules::RowReduction},
      {T::kGatherTarget, "gather_target", "(logits [b, s, V], labels [b, s]) -> logits[label]", 0,
       "a gather: bytes only",
       CONCERTO_RULE(CheckGatherTarget(o)), KernelClass::kVector,
       {}, sharding_rules::RowReduction},
      {T::kCrossEntropy, "cross_entropy", "(m, z, target) -> mean(log z + m - target), a scalar", 4,
       "token (log, add, subtract, accumulate)",
       CONCERTO_RULE(CheckCrossEntropy(o)), KernelClass::kVector,
       {{"denominator"}}, sharding_rules::CrossEntropy, backward_rules::CrossEntropy},
      {T::kCrossEntropyGrad, "cross_entropy_grad", "(logits, m, z, labels) -> dlogits", 4,
       "element of the logits (exp, divide, subtract one-hot, scale)",
       CONCERTO_RULE(CheckCrossEntropyGrad(o)), KernelClass::kVector,
       {{"denominator"}}, sharding_rules::CrossEntropyGrad},
      {T::kAdam, "adam", "(param, grad, m, v[, master]) -> (param', m', v'[, master'])", 10, "parameter element",
       CONCERTO_RULE(o.NumIn() == 5 ? CheckSameShapes(o, 5, 4) : CheckSameShapes(o, 4, 3)), KernelClass::kStreaming,
       {{"lr"}, {"beta1"}, {"beta2"}, {"eps"}, {"step"}, {"weight_decay"}}, sharding_rules::Elementwise},
      {T::kSlice, "slice", "(x) -> x[start:start+len] on attrs.axis", 0, "a copy: bytes only",
       CONCERTO_RULE(CheckSlice(o)), KernelClass::kStreaming,
       {{"axis", true, true, 0, kAttrMax, true}, {"start", true, true, 0, kAttrMax, false}}, sharding_rules::Slice, backward_rules::Slice},
      {T::kConcat, "concat", "(x...) -> concat on attrs.axis", 0, "a copy: bytes only",
       CONCERTO_RULE(CheckConcat(o)), KernelClass::kStreaming,
       {{"axis", true, true, 0, kAttrMax, true}}, sharding_rules::Concat, backward_rules::Concat},
      {T::kCast, "cast", "(x) -> x in the output's dtype", 0, "a copy: bytes only",
       CONCERTO_RULE(CheckSameShapes(o, 1, 1)), KernelClass::kStreaming,
       {}, sharding_rules::Elementwise, backward_rules::Cast},
      {T::kIdentity, "identity", "(x) -> x (a fused collective's split, a marker)", 0, "nothing",
       CONCERTO_RULE(CheckIdentity(o)), KernelClass::kStreaming,
       {}, sharding_rules::Identity, backward_rules::Identity},
      {T::kTopK, "top_k", "(probs [..., E]) -> (gates [..., k], ids [..., k]); attrs k, normalize", 2,
       "router probability",
       CONCERTO_RULE(CheckTopK(o)), KernelClass::kVector,
       {{"k", true, true, 1, kAttrMax, false}, {"normalize", false, true, 0, 1, false}}, nullptr, backward_rules::TopK},
      {T::kTopKGrad, "top_k_grad", "(dgates, ids, probs) -> dprobs [..., E]", 4, "(token, choice)",
       CONCERTO_RULE(CheckTopKGrad(o)), KernelClass::kVector,
       {{"normalize", false, true, 0, 1, false}}, nullptr},
      {T::kMoeDispatch, "moe_dispatch", "(x [G, n, h], ids [G, n, k]) -> buffers [E, G*C, h]", 0,
       "a copy: bytes only",
       CONCERTO_RULE(CheckMoeDispatch(o)), KernelClass::kVector,
       {}, nullptr, backward_rules::MoeDispatch},
      {T::kMoeDispatchGrad, "moe_dispatch_grad", "(dbuffers [E, G*C, h], ids) -> dx [G, n, h]", 1,
       "(token, choice, h) (accumulate)",
       CONCERTO_RULE(CheckMoeDispatchGrad(o)), KernelClass::kVector,
       {}, nullptr},
      {T::kMoeCombine, "moe_combine", "(y [E, G*C, h], ids, gates [G, n, k]) -> out [G, n, h]", 2,
       "(token, choice, h) (gate * row + accumulate)",
       CONCERTO_RULE(CheckMoeCombine(o)), KernelClass::kVector,
       {}, nullptr, backward_rules::MoeCombine},
      {T::kMoeCombineGrad, "moe_combine_grad", "(dout, y, ids, gates) -> (dy, dgates)", 4,
       "(token, choice, h) (dy row and the gate's dot product)",
       CONCERTO_RULE(CheckMoeCombineGrad(o)), KernelClass::kVector,
       {}, nullptr},
      {T::kTranspose, "transpose", "(x) -> x with dims attrs.axis0 and attrs.axis1 swapped", 0,
       "a copy: bytes only",
       CONCERTO_RULE(CheckTranspose(o)), KernelClass::kVector,
       {{"axis0", true, true, 0, kAttrMax, false}, {"axis1", true, true, 0, kAttrMax, false}}, sharding_rules::Transpose, backward_rules::Transpose},
      {T::kRelu, "relu", "(x) -> max(x, 0)", 1, "output element",
       CONCERTO_RULE(CheckSameShapes(o, 1, 1)), KernelClass::kStreaming,
       {}, sharding_rules::Elementwise, backward_rules::Relu},
      {T::kReluGrad, "relu_grad", "(dy, x) -> dy * (x > 0)", 1, "output element",
       CONCERTO_RULE(CheckSameShapes(o, 2, 1)), KernelClass::kStreaming,
       {}, sharding_rules::Elementwise},
      {T::kConv2d, "conv2d", "(x [N, C, H, W], w [K, C, R, S]) -> y [N, K, P, Q]; attrs stride, padding", 0,
       "formula: 2 N K P Q C R S",
       CONCERTO_RULE(CheckConv2d(o)), KernelClass::kTensorCore,
       {{"stride", false, true, 1, kAttrMax, true}, {"padding", false, true, 0, kAttrMax, true}}, sharding_rules::Conv2d,
       backward_rules::Conv2d},
      {T::kConv2dGrad, "conv2d_grad", "(dy, x, w) -> (dx, dw)", 0, "formula: twice the forward",
       CONCERTO_RULE(CheckConv2dGrad(o)), KernelClass::kTensorCore,
       {{"stride", false, true, 1, kAttrMax, true}, {"padding", false, true, 0, kAttrMax, true}}, sharding_rules::Conv2d},
      {T::kMaxPool2d, "max_pool2d", "(x [N, C, H, W]) -> y [N, C, P, Q]; attrs kernel, stride (kernel), padding", 0,
       "formula: kernel^2 per output element",
       CONCERTO_RULE(CheckMaxPool2d(o)), KernelClass::kVector,
       {{"kernel", true, true, 1, kAttrMax, true}, {"stride", false, true, 1, kAttrMax, true},
        {"padding", false, true, 0, kAttrMax, true}}, sharding_rules::Pool2d, backward_rules::MaxPool2d},
      {T::kMaxPool2dGrad, "max_pool2d_grad", "(dy, x) -> dx (each window's first maximum)", 0,
       "formula: kernel^2 per element of dy",
       CONCERTO_RULE(CheckMaxPool2dGrad(o)), KernelClass::kVector,
       {{"kernel", true, true, 1, kAttrMax, true}, {"stride", false, true, 1, kAttrMax, true},
        {"padding", false, true, 0, kAttrMax, true}}, sharding_rules::Pool2d},
      // mean, variance, normalise, scale and shift; the gradient: two channel
      // sums and the three-term dx.
      {T::kBatchNorm, "batch_norm",
       "(x [N, C, ...], gamma [C], beta [C][, sum [1, C], sqdev [1, C]]) -> (y, mean [C], invstd [C]); attrs eps, "
       "local_stats, count; statistics over all but dim 1 (synchronised: the all-reduced sums of batch_norm_stats over "
       "count elements)",
       8, "element of x",
       CONCERTO_RULE(CheckBatchNorm(o)), KernelClass::kVector,
       {{"eps"}, {"local_stats", false, true, 0, 1}, {"count", false, true, 1, kAttrMax}}, sharding_rules::BatchNorm,
       backward_rules::BatchNorm},
      {T::kBatchNormGrad, "batch_norm_grad", "(dy, x, gamma, mean, invstd[, gstats [2, C]]) -> (dx, dgamma, dbeta)", 12,
       "element of x",
       CONCERTO_RULE(CheckBatchNormGrad(o)), KernelClass::kVector,
       {{"eps"}, {"local_stats", false, true, 0, 1}, {"count", false, true, 1, kAttrMax}}, sharding_rules::BatchNorm},
      {T::kBatchNormStats, "batch_norm_stats",
       "(x [N, C, ...][, sum [1, C]]) -> [1, C]: sum x, or sum (x - sum / count)^2, per channel (sync-BN)", 2,
       "element of x",
       CONCERTO_RULE(CheckBatchNormStats(o)), KernelClass::kVector,
       {{"count", false, true, 1, kAttrMax}}, sharding_rules::BatchNormStats, backward_rules::Statistics},
      {T::kBatchNormGradStats, "batch_norm_grad_stats",
       "(dy, x, mean [C], invstd [C]) -> gstats [2, C]: sum dy, sum dy xhat per channel (sync-BN)", 4, "element of x",
       CONCERTO_RULE(CheckBatchNormGradStats(o)), KernelClass::kVector,
       {}, sharding_rules::BatchNormStats},
  };
  return registry;
}

#undef CONCERTO_RULE

const OpTypeInfo& OpInfo(ComputeType type) {
  const std::vector<OpTypeInfo>& r = OpRegistry();
  const size_t i = static_cast<size_t>(type);
  assert(i < r.size() && r[i].type == type && "OpRegistry is in enum order and complete");
  return r[i];
}

double FlopsPerUnit(ComputeType type) { return OpInfo(type).flops; }

const AttrInfo* FindAttr(ComputeType type, std::string_view name) {
  for (const AttrInfo& a : OpInfo(type).attrs)
    if (a.name == name) return &a;
  return nullptr;
}

std::string CheckComputeShapes(const Op& op, const std::vector<const Tensor*>& inputs,
                               const std::vector<const Tensor*>& outputs) {
  Operands o(op, inputs, outputs);
  if (op.kind == OpKind::kCopy) return CheckCopy(o);
  if (op.kind != OpKind::kCompute) return "";
  return OpInfo(op.compute_type).shape_rule(op, inputs, outputs);
}

std::string CheckCollectiveShapes(const Op& op, const std::vector<const Tensor*>& inputs,
                                  const std::vector<const Tensor*>& outputs, int group_size) {
  Operands o(op, inputs, outputs);
  if (inputs.empty()) return o.Type() + ": a collective needs at least one input";
  if (inputs.size() != outputs.size())
    return o.Type() + ": takes as many outputs as inputs (pairwise), got " +
           std::to_string(inputs.size()) + " and " + std::to_string(outputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::string e = CheckCollectivePair(o, op.collective, i, group_size);
    if (!e.empty()) return e;
  }
  return "";
}

}  // namespace concerto
