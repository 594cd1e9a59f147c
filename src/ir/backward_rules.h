// The backward rules of the op registry (ir/autodiff.h), one per
// differentiable forward compute type; OpRegistry() (shapes.cc) points at them.
#pragma once

#include "concerto/ir/autodiff.h"

namespace concerto::backward_rules {

Status Matmul(const Op& fwd, BackwardBuilder& b);
Status Add(const Op& fwd, BackwardBuilder& b);
Status Mul(const Op& fwd, BackwardBuilder& b);
Status Scale(const Op& fwd, BackwardBuilder& b);
Status Gelu(const Op& fwd, BackwardBuilder& b);
Status Silu(const Op& fwd, BackwardBuilder& b);
Status Swiglu(const Op& fwd, BackwardBuilder& b);
Status LayerNorm(const Op& fwd, BackwardBuilder& b);
Status RmsNorm(const Op& fwd, BackwardBuilder& b);
Status Softmax(const Op& fwd, BackwardBuilder& b);
Status Attention(const Op& fwd, BackwardBuilder& b);
Status Embedding(const Op& fwd, BackwardBuilder& b);
Status CrossEntropy(const Op& fwd, BackwardBuilder& b);
Status Slice(const Op& fwd, BackwardBuilder& b);
Status Concat(const Op& fwd, BackwardBuilder& b);
Status Cast(const Op& fwd, BackwardBuilder& b);
Status Identity(const Op& fwd, BackwardBuilder& b);
Status Transpose(const Op& fwd, BackwardBuilder& b);
Status Relu(const Op& fwd, BackwardBuilder& b);
Status Conv2d(const Op& fwd, BackwardBuilder& b);
Status MaxPool2d(const Op& fwd, BackwardBuilder& b);
Status BatchNorm(const Op& fwd, BackwardBuilder& b);
Status Statistics(const Op& fwd, BackwardBuilder& b);
Status TopK(const Op& fwd, BackwardBuilder& b);
Status MoeDispatch(const Op& fwd, BackwardBuilder& b);
Status MoeCombine(const Op& fwd, BackwardBuilder& b);

}  // namespace concerto::backward_rules
