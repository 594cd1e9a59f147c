#include "concerto/ir/op_registry.h"

#include <cassert>

namespace concerto {

const std::vector<OpTypeInfo>& OpRegistry() {
  using T = ComputeType;
  static const std::vector<OpTypeInfo> registry = {
      {T::kMatmul, "matmul", "(a, b) -> c; attrs transpose_a, transpose_b; leading dims batch", 0,
       "formula: 2 m n k per batch"},
      {T::kAdd, "add", "(x, y) -> x + y; y may broadcast over leading dims", 1, "output element"},
      {T::kMul, "mul", "(x, y) -> x * y, same shapes", 1, "output element"},
      {T::kScale, "scale", "(x) -> x * attrs.scale", 1, "output element"},
      {T::kGelu, "gelu", "(x) -> gelu(x) (tanh approximation)", 8, "output element"},
      {T::kGeluGrad, "gelu_grad", "(dy, x) -> dx", 12, "output element"},
      {T::kSilu, "silu", "(x) -> x * sigmoid(x)", 4, "output element"},
      {T::kSiluGrad, "silu_grad", "(dy, x) -> dx", 8, "output element"},
      // silu (4) and the product (1), per output; its gradient: both input grads.
      {T::kSwiglu, "swiglu", "(gate, up) -> silu(gate) * up", 6, "output element"},
      {T::kSwigluGrad, "swiglu_grad", "(dy, gate, up) -> (dgate, dup)", 12, "element of dy"},
      {T::kLayerNorm, "layer_norm", "(x, gamma, beta) -> y over the last dim; attrs eps", 8, "element of x"},
      {T::kLayerNormGrad, "layer_norm_grad", "(dy, x, gamma) -> (dx, dgamma, dbeta)", 16, "element of x"},
      {T::kRmsNorm, "rms_norm", "(x, gamma) -> y over the last dim; attrs eps", 4, "element of x"},
      {T::kRmsNormGrad, "rms_norm_grad", "(dy, x, gamma) -> (dx, dgamma)", 8, "element of x"},
      // max, subtract, exp, sum, divide; the gradient: product, row sum, subtract, product.
      {T::kSoftmax, "softmax", "(x) -> softmax over the last dim", 5, "output element"},
      {T::kSoftmaxGrad, "softmax_grad", "(dy, y) -> dx", 4, "output element"},
      {T::kAttention, "attention", "(q, k, v) [b, s, heads*d] -> o; attrs heads, kv_heads, causal", 0,
       "formula: 4 b s^2 h (halved when causal)"},
      {T::kAttentionGrad, "attention_grad", "(do, q, k, v) -> (dq, dk, dv)", 0, "formula: 2.5x the forward"},
      {T::kEmbedding, "embedding", "(table [V, h], ids [b, s]) -> [b, s, h]", 0, "a gather: bytes only"},
      {T::kEmbeddingGrad, "embedding_grad", "(dy [b, s, h], ids) -> dtable [V, h]", 1,
       "element of dy (scatter-add)"},
      {T::kReduceMax, "reduce_max", "(x) -> max over the last dim", 1, "element of x"},
      {T::kSumExp, "sum_exp", "(x, m) -> sum(exp(x - m)) over the last dim", 3,
       "element of x (subtract, exp, accumulate)"},
      {T::kGatherTarget, "gather_target", "(logits [b, s, V], labels [b, s]) -> logits[label]", 0,
       "a gather: bytes only"},
      {T::kCrossEntropy, "cross_entropy", "(m, z, target) -> mean(log z + m - target), a scalar", 4,
       "token (log, add, subtract, accumulate)"},
      {T::kCrossEntropyGrad, "cross_entropy_grad", "(logits, m, z, labels) -> dlogits", 4,
       "element of the logits (exp, divide, subtract one-hot, scale)"},
      {T::kAdam, "adam", "(param, grad, m, v[, master]) -> (param', m', v'[, master'])", 10, "parameter element"},
      {T::kSlice, "slice", "(x) -> x[start:start+len] on attrs.axis", 0, "a copy: bytes only"},
      {T::kConcat, "concat", "(x...) -> concat on attrs.axis", 0, "a copy: bytes only"},
      {T::kCast, "cast", "(x) -> x in the output's dtype", 0, "a copy: bytes only"},
      {T::kIdentity, "identity", "(x) -> x (a fused collective's split, a marker)", 0, "nothing"},
      {T::kTopK, "top_k", "(probs [..., E]) -> (gates [..., k], ids [..., k]); attrs k, normalize", 2,
       "router probability"},
      {T::kTopKGrad, "top_k_grad", "(dgates, ids, probs) -> dprobs [..., E]", 4, "(token, choice)"},
      {T::kMoeDispatch, "moe_dispatch", "(x [G, n, h], ids [G, n, k]) -> buffers [E, G*C, h]", 0,
       "a copy: bytes only"},
      {T::kMoeDispatchGrad, "moe_dispatch_grad", "(dbuffers [E, G*C, h], ids) -> dx [G, n, h]", 1,
       "(token, choice, h) (accumulate)"},
      {T::kMoeCombine, "moe_combine", "(y [E, G*C, h], ids, gates [G, n, k]) -> out [G, n, h]", 2,
       "(token, choice, h) (gate * row + accumulate)"},
      {T::kMoeCombineGrad, "moe_combine_grad", "(dout, y, ids, gates) -> (dy, dgates)", 4,
       "(token, choice, h) (dy row and the gate's dot product)"},
      {T::kTranspose, "transpose", "(x) -> x with dims attrs.axis0 and attrs.axis1 swapped", 0,
       "a copy: bytes only"},
  };
  return registry;
}

const OpTypeInfo& OpInfo(ComputeType type) {
  const std::vector<OpTypeInfo>& r = OpRegistry();
  const size_t i = static_cast<size_t>(type);
  assert(i < r.size() && r[i].type == type && "OpRegistry is in enum order and complete");
  return r[i];
}

double FlopsPerUnit(ComputeType type) { return OpInfo(type).flops; }

}  // namespace concerto
