// Reverse-mode autodiff over the IR: given a forward graph, its loss and the
// tensors to differentiate (the parameters), append the backward ops. Each
// compute type's gradient is its op registry entry's backward rule
// (OpTypeInfo::backward, src/ir/backward_rules.cc), written against the small
// BackwardBuilder interface below; the pass walks the ops the loss depends
// on in reverse topological order, calls the rules and sums the gradients
// of a tensor read by several ops. It works on one unsharded graph (no
// collectives); the SPMD partitioner shards the result like any program.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "concerto/ir/ir.h"
#include "concerto/util/status.h"

namespace concerto {

/// What a backward rule may do while differentiating one forward op.
class BackwardBuilder {
 public:
  virtual ~BackwardBuilder() = default;
  /// The tensor called `name` (an operand of the forward op, or one the rule made).
  virtual const Tensor& Get(const std::string& name) const = 0;
  /// The gradient flowing into output `o` of the forward op: a tensor name;
  /// "" when none flows into it; kUnitGradient when the output is the loss.
  virtual std::string OutputGrad(size_t o) const = 0;
  /// The weight of output `o` in the total loss when it is a loss term
  /// (OutputGrad is then kUnitGradient), else 0.
  virtual double LossWeight(size_t o) const = 0;
  /// Whether tensor `name` needs a gradient (it lies on a path from a
  /// differentiated tensor to the loss; ids, labels and constants do not).
  virtual bool NeedsGrad(const std::string& name) const = 0;
  /// The op producing tensor `name`, or null for a graph input.
  virtual const Op* Producer(const std::string& name) const = 0;
  /// Declares a new tensor of `shape` and `dtype` named from `stem`.
  virtual std::string NewTensor(const std::string& stem, std::vector<int64_t> shape, DType dtype) = 0;
  /// The graph input "const.ones.<n>" [1, n] of `dtype`, all ones (the
  /// runtime initialises every "const.ones.*" tensor so), declared once.
  virtual std::string Ones(int64_t n, DType dtype) = 0;
  /// Appends a backward compute op named "<forward op>.grad<suffix>".
  virtual void Emit(const std::string& suffix, ComputeType type, std::vector<std::string> inputs,
                    std::vector<std::string> outputs, double flops,
                    std::map<std::string, double> attrs = {}) = 0;
  /// Adds `grad` (shaped like `tensor`) to the gradient of `tensor`.
  virtual void AddGrad(const std::string& tensor, const std::string& grad) = 0;
  /// Adds `grad` as the piece [start, start + len) along `axis` of the
  /// gradient of `tensor` (a slice's backward); pieces that tile the axis
  /// are concatenated.
  virtual void AddGradPiece(const std::string& tensor, const std::string& grad, int axis,
                            int64_t start) = 0;
};

/// OutputGrad of a loss term: d loss / d term = its weight, which the term's
/// own rule (cross_entropy's) folds in.
inline constexpr const char* kUnitGradient = "<1>";

/// A compute type's backward rule: emits the ops that compute the gradients
/// of `fwd`'s inputs from its output gradients, or an error saying why this
/// op has none.
using BackwardRule = Status (*)(const Op& fwd, BackwardBuilder& b);

/// What Differentiate did.
struct AutodiffResult {
  std::map<std::string, std::string> grads;  // tensor in `wrt` -> its gradient tensor
  int ops_added = 0;
};

/// One term of the loss: a scalar tensor (the output of a cross_entropy op)
/// and its weight.
struct LossTerm {
  std::string tensor;
  double weight = 1;
};

/// Appends to `graph` the backward of the loss (the weighted sum of
/// `losses`) with respect to each tensor in `wrt` that the loss depends on: ops tagged Phase::kBackward with the forward op's layer, on
/// stream "compute". Errors name the op: a compute type without a backward
/// rule on the path, a collective or send/recv (differentiate before
/// partitioning), an unknown loss or wrt tensor.
Result<AutodiffResult> Differentiate(Graph* graph, const std::vector<LossTerm>& losses,
                                     const std::vector<std::string>& wrt);
/// The same with one loss of weight 1.
Result<AutodiffResult> Differentiate(Graph* graph, const std::string& loss,
                                     const std::vector<std::string>& wrt);

}  // namespace concerto
