// GraphIndex: lookups, edges, and an index that owns its names (it stays
// valid after its graph changes or is gone).
#include "concerto/ir/graph_index.h"

#include <gtest/gtest.h>

#include <memory>

namespace concerto {
namespace {

Op MakeOp(int id, std::vector<std::string> in, std::vector<std::string> out, std::vector<int> deps = {}) {
  Op op;
  op.id = id;
  op.name = "op" + std::to_string(id);
  op.inputs = std::move(in);
  op.outputs = std::move(out);
  op.control_deps = std::move(deps);
  return op;
}

/// Ops 10 -> 20 through a long-named tensor (longer than the small-string
/// buffer, so it lives on the heap), 30 reads both it and the short "x" and
/// waits on 10 by a control edge as well.
Graph IndexChain() {
  Graph g;
  g.name = "g";
  g.streams = {"compute"};
  for (const char* n : {"x", "a_tensor_name_longer_than_sixteen_chars", "y", "z"}) {
    Tensor t;
    t.name = n;
    t.shape = {2};
    g.tensors.push_back(t);
  }
  g.ops.push_back(MakeOp(10, {"x"}, {"a_tensor_name_longer_than_sixteen_chars"}));
  g.ops.push_back(MakeOp(20, {"a_tensor_name_longer_than_sixteen_chars"}, {"y"}));
  g.ops.push_back(MakeOp(30, {"a_tensor_name_longer_than_sixteen_chars", "x"}, {"z"}, {10}));
  return g;
}

TEST(GraphIndex, IndexesTensorsOpsAndEdges) {
  const Graph g = IndexChain();
  const GraphIndex index = GraphIndex::Build(g);
  EXPECT_EQ(index.tensor.at("x"), 0);
  EXPECT_EQ(index.tensor.at(std::string("a_tensor_name_longer_than_sixteen_chars")), 1);
  EXPECT_EQ(index.tensor.count("w"), 0u);
  EXPECT_EQ(index.op.at(30), 2);
  EXPECT_EQ(index.producer, (std::vector<int>{-1, 0, 1, 2}));  // x is a graph input
  EXPECT_EQ(index.consumers[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(index.consumers[1], (std::vector<int>{1, 2}));
  // Op 30 depends on op 10 twice (data and control): listed once.
  EXPECT_EQ(index.preds[2], (std::vector<int>{0}));
  EXPECT_EQ(index.succs[0], (std::vector<int>{1, 2}));
  EXPECT_EQ(TopologicalOrder(g, index), (std::vector<int>{0, 1, 2}));
}

TEST(GraphIndex, OutlivesItsGraphAndSharesItsNamesWithCopies) {
  auto g = std::make_unique<Graph>(IndexChain());
  GraphIndex copy;
  {
    const GraphIndex index = GraphIndex::Build(*g);
    copy = index;
  }  // the original index is gone; the copy holds the names
  for (Tensor& t : g->tensors) t.name = "renamed";  // and the graph changes
  g.reset();                                       // then is gone
  EXPECT_EQ(copy.tensor.at("a_tensor_name_longer_than_sixteen_chars"), 1);
  EXPECT_EQ(copy.tensor.at("z"), 3);
  EXPECT_EQ(copy.tensor.count("renamed"), 0u);
}

}  // namespace
}  // namespace concerto
