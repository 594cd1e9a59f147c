// GraphBuilder: appends tensors and ops to one graph, for frontends. Ops get
// ids 0..n-1 in program order and the builder's current tags.
#pragma once

#include <algorithm>
#include <cassert>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "concerto/ir/ir.h"

namespace concerto::lower {

using Shape = std::vector<int64_t>;
using Sharding = std::vector<std::vector<std::string>>;
using Axes = std::vector<std::string>;
using Attrs = std::map<std::string, double>;

/// Appends tensors and ops to one graph. Ops get ids 0..n-1 in program order
/// and the current tags; compute ops get bytes = input + output tensor bytes.
class GraphBuilder {
 public:
  explicit GraphBuilder(Graph* graph) : graph_(graph) { tags_.microbatch = 0; }

  /// Phase and layer tags of the ops appended from now on.
  void SetPhase(Phase phase) { tags_.phase = phase; }
  void SetLayer(int layer) { tags_.layer = layer; }

  /// Declares a tensor (local shape) and returns its name.
  std::string AddTensor(const std::string& name, Shape shape, DType dtype, Sharding sharding,
                        Axes partial = {}) {
    assert(sharding.size() == shape.size());
    assert(!tensor_index_.count(name) && "duplicate tensor name");
    tensor_index_.emplace(name, graph_->tensors.size());
    Tensor t;
    t.name = name;
    t.shape = std::move(shape);
    t.dtype = dtype;
    t.sharding = std::move(sharding);
    t.partial = std::move(partial);
    graph_->tensors.push_back(std::move(t));
    return name;
  }

  /// The tensor called `name` (must exist). The reference is valid until the
  /// next AddTensor.
  const Tensor& Get(const std::string& name) const {
    auto it = tensor_index_.find(name);
    assert(it != tensor_index_.end() && "unknown tensor");
    return graph_->tensors[it->second];
  }

  /// Declares a tensor shaped and sharded like `like`, with its own dtype and partial axes.
  std::string AddLike(const std::string& name, const std::string& like, DType dtype,
                      Axes partial = {}) {
    const Tensor& t = Get(like);
    Shape shape = t.shape;
    Sharding sharding = t.sharding;
    return AddTensor(name, std::move(shape), dtype, std::move(sharding), std::move(partial));
  }

  /// Appends a compute op on stream "compute"; returns its id.
  int AddCompute(const std::string& name, ComputeType type, std::vector<std::string> inputs,
                 std::vector<std::string> outputs, double flops, Attrs attrs = {}) {
    Op& op = NewOp(name, OpKind::kCompute, "compute");
    op.compute_type = type;
    op.inputs = std::move(inputs);
    op.outputs = std::move(outputs);
    op.flops = flops;
    op.attrs = std::move(attrs);
    op.bytes = static_cast<double>(SumBytes(op.inputs) + SumBytes(op.outputs));
    return op.id;
  }

  /// Appends a collective over mesh axes `axes` on stream "comm"; its
  /// message is the input's bytes. Returns its id.
  int AddCollective(const std::string& name, CollectiveType type, const std::string& input,
                    const std::string& output, Axes axes, ReduceOp reduce,
                    const std::string& purpose) {
    Op& op = NewOp(name, OpKind::kCollective, "comm");
    op.collective = type;
    op.reduce = reduce;
    op.group.axes = std::move(axes);
    op.inputs = {input};
    op.outputs = {output};
    op.message_bytes = Get(input).Bytes();
    op.tags.purpose = purpose;
    return op.id;
  }

  /// Overrides the bytes of op `id` (for ops that touch less than whole tensors).
  void SetBytes(int id, double bytes) { graph_->ops[id].bytes = bytes; }

  /// Number of ops so far (the id the next op gets).
  int NumOps() const { return static_cast<int>(graph_->ops.size()); }

  /// Makes the compute ops from id `first_op` on that read no tensor another
  /// of those compute ops writes wait (control deps) for the op that wrote `tensor`, if an
  /// earlier op did: recomputation starts when the backward reaches it, as
  /// PyTorch's checkpoint and Megatron's recompute do, so no schedule can run
  /// it early. Collectives stay free (ZeRO-3's parameter all-gathers for the
  /// recomputed forward may be prefetched, as FSDP and DeepSpeed do). Returns
  /// how many ops it gated.
  int GateOpsFrom(int first_op, const std::string& tensor) {
    const int n = NumOps();
    assert(first_op >= 0 && first_op <= n);
    int producer = -1;
    for (int i = first_op - 1; i >= 0 && producer < 0; --i)
      for (const std::string& out : graph_->ops[i].outputs)
        if (out == tensor) producer = i;
    if (producer < 0) return 0;
    std::unordered_set<std::string> written;
    for (int i = first_op; i < n; ++i)
      if (graph_->ops[i].kind == OpKind::kCompute)
        for (const std::string& out : graph_->ops[i].outputs) written.insert(out);
    int gated = 0;
    for (int i = first_op; i < n; ++i) {
      Op& op = graph_->ops[i];
      if (op.kind != OpKind::kCompute) continue;
      const bool inner = std::any_of(op.inputs.begin(), op.inputs.end(),
                                     [&](const std::string& in) { return written.count(in) > 0; });
      if (inner) continue;
      op.control_deps.push_back(producer);
      ++gated;
    }
    return gated;
  }

 private:
  /// Appends an op with the next id and the current tags.
  Op& NewOp(const std::string& name, OpKind kind, const std::string& stream) {
    Op op;
    op.id = static_cast<int>(graph_->ops.size());
    op.name = name;
    op.kind = kind;
    op.stream = stream;
    op.tags = tags_;
    graph_->ops.push_back(std::move(op));
    return graph_->ops.back();
  }

  /// Total bytes of the named tensors.
  int64_t SumBytes(const std::vector<std::string>& names) const {
    int64_t total = 0;
    for (const auto& n : names) total += Get(n).Bytes();
    return total;
  }

  Graph* graph_;
  Tags tags_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace concerto::lower
