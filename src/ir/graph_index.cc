#include "concerto/ir/graph_index.h"

#include <cassert>

#include "concerto/ir/graph_order.h"

#include <algorithm>
#include <queue>

namespace concerto {

GraphIndex GraphIndex::Build(const Graph& graph) {
  GraphIndex idx;
  const int n_ops = static_cast<int>(graph.ops.size());
  // Sized up front: no rehashing, and each op's inputs are looked up once.
  idx.tensor.reserve(graph.tensors.size());
  idx.op.reserve(graph.ops.size());
  size_t chars = 0;
  for (const Tensor& t : graph.tensors) chars += t.name.size();
  auto names = std::make_shared<std::string>();
  names->reserve(chars);  // never reallocates below, so the views stay put
  for (const Tensor& t : graph.tensors) names->append(t.name);
  size_t at = 0;
  for (size_t t = 0; t < graph.tensors.size(); ++t) {
    const size_t len = graph.tensors[t].name.size();
    idx.tensor.emplace(std::string_view(names->data() + at, len), static_cast<int>(t));
    at += len;
  }
  idx.names = std::move(names);
  for (int i = 0; i < n_ops; ++i) idx.op.emplace(graph.ops[i].id, i);
  idx.producer.assign(graph.tensors.size(), -1);
  idx.consumers.assign(graph.tensors.size(), {});
  idx.preds.assign(n_ops, {});
  idx.succs.assign(n_ops, {});
  for (int i = 0; i < n_ops; ++i) {
    for (const auto& name : graph.ops[i].outputs) {
      auto it = idx.tensor.find(name);
      if (it != idx.tensor.end() && idx.producer[it->second] < 0) idx.producer[it->second] = i;
    }
  }
  for (int i = 0; i < n_ops; ++i) {
    const Op& op = graph.ops[i];
    auto& p = idx.preds[i];
    p.reserve(op.inputs.size() + op.control_deps.size());
    for (const auto& name : op.inputs) {
      auto it = idx.tensor.find(name);
      if (it == idx.tensor.end()) continue;
      idx.consumers[it->second].push_back(i);
      int q = idx.producer[it->second];
      if (q >= 0 && q != i) p.push_back(q);
    }
    for (int dep : op.control_deps) {
      auto it = idx.op.find(dep);
      if (it != idx.op.end() && it->second != i) p.push_back(it->second);
    }
    std::sort(p.begin(), p.end());
    p.erase(std::unique(p.begin(), p.end()), p.end());
    for (int q : p) idx.succs[q].push_back(i);
  }
  return idx;
}

std::vector<int> KahnOrder(const std::vector<std::vector<int>>& preds, const std::vector<std::vector<int>>& succs) {
  assert(preds.size() == succs.size() && "one predecessor and one successor list per node");
  (void)preds;  // the in-degrees come from the successor lists (graph_order.h)
  return KahnOrderBy(succs);
}

std::vector<int> TopologicalOrder(const Graph& /*graph*/, const GraphIndex& index) {
  return KahnOrder(index.preds, index.succs);
}

}  // namespace concerto
