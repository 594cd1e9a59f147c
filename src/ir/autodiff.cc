// Reverse-mode autodiff over the IR (ir/autodiff.h): the pass that walks the
// ops the loss depends on backwards and applies each compute type's backward
// rule from the op registry.
#include "concerto/ir/autodiff.h"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include "concerto/ir/graph_index.h"
#include "concerto/ir/op_registry.h"

namespace concerto {
namespace {

/// One contribution to a tensor's gradient: the whole gradient, or a piece
/// of it along an axis (a slice's backward).
struct Contribution {
  std::string grad;
  int axis = -1;  // -1: the whole tensor
  int64_t start = 0;
};

class Autodiff : public BackwardBuilder {
 public:
  Autodiff(Graph* graph, std::vector<LossTerm> losses, std::vector<std::string> wrt)
      : g_(*graph), losses_(std::move(losses)), wrt_(std::move(wrt)) {}

  Result<AutodiffResult> Run() {
    for (size_t i = 0; i < g_.tensors.size(); ++i) tensors_[g_.tensors[i].name] = i;
    const GraphIndex index = GraphIndex::Build(g_);
    const std::vector<int> order = TopologicalOrder(g_, index);
    if (order.size() != g_.ops.size()) return Status::Error("autodiff: the graph has a cycle");
    if (losses_.empty()) return Status::Error("autodiff: no loss to differentiate");
    for (const LossTerm& l : losses_) {
      if (!tensors_.count(l.tensor)) return Status::Error("autodiff: no tensor '" + l.tensor + "' (a loss)");
      if (weights_.count(l.tensor)) return Status::Error("autodiff: loss '" + l.tensor + "' named twice");
      weights_[l.tensor] = l.weight;
    }
    for (const std::string& w : wrt_) {
      if (!tensors_.count(w)) return Status::Error("autodiff: no tensor '" + w + "' to differentiate");
      if (!IsFloat(Get(w).dtype))
        return Status::Error("autodiff: tensor '" + w + "' is of integer type " +
                             std::string(ToString(Get(w).dtype)) + "; it has no gradient");
    }
    for (int i : order)
      for (const std::string& out : g_.ops[i].outputs) producer_[out] = i;
    CONCERTO_RETURN_IF_ERROR(MarkPath(order));
    next_id_ = 0;
    for (const Op& op : g_.ops) next_id_ = std::max(next_id_, op.id + 1);
    const size_t forward_ops = g_.ops.size();
    // The loss's gradient is 1; walk the path's ops last to first.
    for (const LossTerm& l : losses_) grads_[l.tensor] = kUnitGradient;
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      const int i = *it;
      if (!on_path_op_.count(i)) continue;
      current_ = g_.ops[i];  // a copy: Emit appends to g_.ops
      bool any = false;
      for (const std::string& out : current_.outputs) {
        CONCERTO_RETURN_IF_ERROR(Finish(out));
        any = any || !grads_[out].empty();
      }
      if (!any) continue;
      const BackwardRule rule = OpInfo(current_.compute_type).backward;
      if (rule == nullptr)
        return Status::Error("autodiff: " + std::string(ToString(current_.compute_type)) + " op '" +
                             current_.name + "' has no backward rule (op registry)");
      CONCERTO_RETURN_IF_ERROR(rule(current_, *this));
    }
    AutodiffResult result;
    for (const std::string& w : wrt_) {
      CONCERTO_RETURN_IF_ERROR(Finish(w));
      if (!grads_[w].empty()) result.grads[w] = grads_[w];
    }
    result.ops_added = static_cast<int>(g_.ops.size() - forward_ops);
    return result;
  }

  // ---- BackwardBuilder ------------------------------------------------------

  const Tensor& Get(const std::string& name) const override { return g_.tensors[tensors_.at(name)]; }
  std::string OutputGrad(size_t o) const override {
    auto it = grads_.find(current_.outputs[o]);
    return it == grads_.end() ? "" : it->second;
  }
  double LossWeight(size_t o) const override {
    auto it = weights_.find(current_.outputs[o]);
    return it == weights_.end() ? 0 : it->second;
  }
  bool NeedsGrad(const std::string& name) const override { return on_path_.count(name) > 0; }
  const Op* Producer(const std::string& name) const override {
    auto it = producer_.find(name);
    return it == producer_.end() ? nullptr : &g_.ops[it->second];
  }
  std::string NewTensor(const std::string& stem, std::vector<int64_t> shape, DType dtype) override {
    std::string name = stem;
    for (int k = 1; tensors_.count(name); ++k) name = stem + "." + std::to_string(k);
    Tensor t;
    t.name = name;
    t.shape = std::move(shape);
    t.dtype = dtype;
    t.sharding.assign(t.shape.size(), {});
    tensors_[name] = g_.tensors.size();
    g_.tensors.push_back(std::move(t));
    return name;
  }
  std::string Ones(int64_t n, DType dtype) override {
    const std::string name = "const.ones." + std::to_string(n);
    if (!tensors_.count(name)) {
      Tensor t;
      t.name = name;
      t.shape = {1, n};
      t.dtype = dtype;
      t.sharding.assign(2, {});
      tensors_[name] = g_.tensors.size();
      g_.tensors.push_back(std::move(t));
    }
    return name;
  }
  /// The graph input "const.zeros.<d0>x<d1>..." of `shape`, all zeros (the
  /// runtime initialises every "const.zeros.*" tensor so), declared once.
  std::string Zeros(const std::vector<int64_t>& shape, DType dtype) {
    std::string name = "const.zeros.";
    for (size_t i = 0; i < shape.size(); ++i) name += (i ? "x" : "") + std::to_string(shape[i]);
    if (!tensors_.count(name)) {
      Tensor t;
      t.name = name;
      t.shape = shape;
      t.dtype = dtype;
      t.sharding.assign(shape.size(), {});
      tensors_[name] = g_.tensors.size();
      g_.tensors.push_back(std::move(t));
    }
    return name;
  }
  void Emit(const std::string& suffix, ComputeType type, std::vector<std::string> inputs,
            std::vector<std::string> outputs, double flops, std::map<std::string, double> attrs) override {
    Op op;
    op.id = next_id_++;
    op.name = current_.name + ".grad" + suffix;
    op.kind = OpKind::kCompute;
    op.stream = "compute";
    op.compute_type = type;
    op.tags = current_.tags;
    op.tags.phase = Phase::kBackward;
    op.inputs = std::move(inputs);
    op.outputs = std::move(outputs);
    op.flops = flops;
    op.attrs = std::move(attrs);
    double bytes = 0;  // views (identity) move nothing, as in the frontends
    if (type != ComputeType::kIdentity)
      for (const auto* names : {&op.inputs, &op.outputs})
        for (const std::string& n : *names) bytes += static_cast<double>(Get(n).Bytes());
    op.bytes = bytes;
    g_.ops.push_back(std::move(op));
  }
  void AddGrad(const std::string& tensor, const std::string& grad) override {
    pending_[tensor].push_back({grad, -1, 0});
  }
  void AddGradPiece(const std::string& tensor, const std::string& grad, int axis, int64_t start) override {
    pending_[tensor].push_back({grad, axis, start});
  }

 private:
  /// The tensors (and ops) on a path from a wrt tensor to the loss.
  Status MarkPath(const std::vector<int>& order) {
    std::set<std::string> from_wrt(wrt_.begin(), wrt_.end());
    for (int i : order) {
      const Op& op = g_.ops[i];
      const bool reached = std::any_of(op.inputs.begin(), op.inputs.end(),
                                       [&](const std::string& t) { return from_wrt.count(t) > 0; });
      if (!reached) continue;
      if (op.kind != OpKind::kCompute)
        return Status::Error("autodiff: op '" + op.name + "' is a " + std::string(ToString(op.kind)) +
                             "; differentiate the unsharded graph, then partition it");
      from_wrt.insert(op.outputs.begin(), op.outputs.end());
    }
    std::set<std::string> to_loss;
    for (const LossTerm& l : losses_) {
      if (!from_wrt.count(l.tensor))
        return Status::Error("autodiff: the loss '" + l.tensor + "' depends on no tensor to differentiate");
      to_loss.insert(l.tensor);
    }
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      const Op& op = g_.ops[*it];
      const bool feeds = std::any_of(op.outputs.begin(), op.outputs.end(),
                                     [&](const std::string& t) { return to_loss.count(t) > 0; });
      if (!feeds) continue;
      to_loss.insert(op.inputs.begin(), op.inputs.end());
      if (std::any_of(op.outputs.begin(), op.outputs.end(), [&](const std::string& t) { return from_wrt.count(t) > 0; }))
        on_path_op_.insert(*it);
    }
    for (const std::string& t : from_wrt)
      if (to_loss.count(t) && IsFloat(Get(t).dtype)) on_path_.insert(t);
    return Status::Ok();
  }

  static bool IsFloat(DType d) { return d != DType::kI32 && d != DType::kI64; }

  /// Sums the contributions to `tensor`'s gradient into grads_[tensor] (all
  /// its consumers are done): one is the gradient; several whole ones are
  /// added; pieces along one axis that tile it are concatenated.
  Status Finish(const std::string& tensor) {
    auto it = pending_.find(tensor);
    if (it == pending_.end()) return Status::Ok();
    std::vector<Contribution> parts = std::move(it->second);
    pending_.erase(it);
    // Accumulation ops are named after the tensor; the rule's op is restored after.
    const Op saved = current_;
    current_.name = tensor;
    Status st = Combine(tensor, std::move(parts));
    current_ = saved;
    return st;
  }

  /// Finish's work, with current_ named after `tensor`.
  Status Combine(const std::string& tensor, std::vector<Contribution> parts) {
    std::vector<std::string> whole;
    std::vector<Contribution> pieces;
    for (Contribution& c : parts) (c.axis < 0 ? whole.push_back(c.grad) : pieces.push_back(c));
    if (!pieces.empty()) {
      std::sort(pieces.begin(), pieces.end(), [](const Contribution& a, const Contribution& b) { return a.start < b.start; });
      const Tensor& t = Get(tensor);
      const int axis = pieces[0].axis;
      const int64_t extent = t.shape[static_cast<size_t>(axis)];
      int64_t at = 0;
      std::vector<std::string> names;
      // Where no slice reads the tensor, its gradient is zero: a "const.zeros.*" block.
      auto zeros_until = [&](int64_t end) {
        if (end <= at) return;
        std::vector<int64_t> gap = t.shape;
        gap[static_cast<size_t>(axis)] = end - at;
        names.push_back(Zeros(gap, t.dtype));
        at = end;
      };
      for (const Contribution& p : pieces) {
        if (p.axis != axis || p.start < at)
          return Status::Error("autodiff: the slices of '" + tensor + "' overlap or lie on different axes (" +
                               std::to_string(axis) + ", " + std::to_string(p.axis) + ")");
        zeros_until(p.start);
        at += Get(p.grad).shape[static_cast<size_t>(axis)];
        names.push_back(p.grad);
      }
      zeros_until(extent);
      std::string full = names[0];
      if (names.size() > 1) {
        full = NewTensor(tensor + ".grad", t.shape, t.dtype);
        Emit(".concat", ComputeType::kConcat, names, {full}, 0, {{"axis", axis}});
      }
      whole.push_back(full);
    }
    std::string sum = whole[0];
    for (size_t k = 1; k < whole.size(); ++k) {
      const Tensor& t = Get(tensor);
      std::string next = NewTensor(tensor + ".grad.sum", t.shape, t.dtype);
      Emit(".acc" + std::to_string(k), ComputeType::kAdd, {sum, whole[k]}, {next},
           FlopsPerUnit(ComputeType::kAdd) * static_cast<double>(t.NumElements()), {});
      sum = next;
    }
    grads_[tensor] = sum;
    return Status::Ok();
  }

  Graph& g_;
  std::vector<LossTerm> losses_;
  std::map<std::string, double> weights_;
  std::vector<std::string> wrt_;
  std::unordered_map<std::string, size_t> tensors_;
  std::unordered_map<std::string, int> producer_;
  std::set<std::string> on_path_;
  std::set<int> on_path_op_;
  std::unordered_map<std::string, std::string> grads_;
  std::unordered_map<std::string, std::vector<Contribution>> pending_;
  Op current_;
  int next_id_ = 0;
};

}  // namespace

Result<AutodiffResult> Differentiate(Graph* graph, const std::vector<LossTerm>& losses,
                                     const std::vector<std::string>& wrt) {
  return Autodiff(graph, losses, wrt).Run();
}

Result<AutodiffResult> Differentiate(Graph* graph, const std::string& loss, const std::vector<std::string>& wrt) {
  return Differentiate(graph, std::vector<LossTerm>{{loss, 1}}, wrt);
}

}  // namespace concerto
