// FuseCollectives: the rewrite itself (fields, placement, control deps) and
// the groups it must reject.
#include "concerto/schedule/fusion.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "concerto/ir/verifier.h"

namespace concerto {
namespace {

/// A tiny graph builder: f32 tensors, ops with ids in creation order.
struct Builder {
  Graph g;
  Mesh mesh{{{"dp", 2}}};

  Builder() { g.name = "main"; }
  void Tensor1(const std::string& name, int64_t elements, DType dtype = DType::kF32) {
    Tensor t;
    t.name = name;
    t.shape = {elements};
    t.dtype = dtype;
    g.tensors.push_back(t);
  }
  Op& Add(Op op) {
    op.id = static_cast<int>(g.ops.size());
    g.ops.push_back(std::move(op));
    return g.ops.back();
  }
  /// (x) -> y = x * 2 on the compute stream.
  Op& Scale(const std::string& name, const std::string& x, const std::string& y) {
    Op op;
    op.name = name;
    op.stream = "compute";
    op.compute_type = ComputeType::kScale;
    op.attrs["scale"] = 2;
    op.inputs = {x};
    op.outputs = {y};
    return Add(op);
  }
  /// (x, y) -> z on the compute stream.
  Op& Sum(const std::string& name, const std::string& x, const std::string& y,
          const std::string& z) {
    Op op;
    op.name = name;
    op.stream = "compute";
    op.compute_type = ComputeType::kAdd;
    op.inputs = {x, y};
    op.outputs = {z};
    return Add(op);
  }
  /// A collective over "dp" on the comm stream.
  Op& Coll(const std::string& name, const std::string& x, const std::string& y,
           CollectiveType type = CollectiveType::kAllReduce) {
    Op op;
    op.name = name;
    op.kind = OpKind::kCollective;
    op.stream = "comm";
    op.collective = type;
    op.group.axes = {"dp"};
    op.inputs = {x};
    op.outputs = {y};
    for (const auto& t : g.tensors)
      if (t.name == x) op.message_bytes = t.Bytes();
    op.tags.purpose = "grad_sync";
    return Add(op);
  }
};

/// Index of the op with `id` in `g`, or -1.
int IndexOf(const Graph& g, int id) {
  for (size_t i = 0; i < g.ops.size(); ++i)
    if (g.ops[i].id == id) return static_cast<int>(i);
  return -1;
}

/// x -> g1, g2 (two grads); ar1(g1), ar2(g2); s = s1 + s2; a marker op with
/// control deps on both all-reduces.
Builder TwoGrads() {
  Builder b;
  for (const char* t : {"x", "g1", "g2", "s1", "s2", "s", "m"}) b.Tensor1(t, 100);
  b.Scale("grad1", "x", "g1");                       // 0
  b.Scale("grad2", "x", "g2");                       // 1
  Op& ar1 = b.Coll("ar1", "g1", "s1");               // 2
  ar1.tags.layer = 1;
  ar1.control_deps = {0};
  Op& ar2 = b.Coll("ar2", "g2", "s2");               // 3
  ar2.tags.layer = 0;
  ar2.tags.phase = Phase::kBackward;
  ar2.control_deps = {1, 2};
  b.Sum("sum", "s1", "s2", "s");                     // 4
  b.Scale("marker", "x", "m").control_deps = {2, 3};  // 5
  return b;
}

TEST(FusionTest, FusesTwoAllReducesIntoOneOp) {
  Builder b = TwoGrads();
  Result<std::vector<int>> ids = FuseCollectives(b.g, {{2, 3}});
  ASSERT_TRUE(ids.ok()) << ids.status().message();
  ASSERT_EQ(*ids, std::vector<int>{6});  // max id 5, plus 1
  ASSERT_EQ(b.g.ops.size(), 5u);
  EXPECT_EQ(IndexOf(b.g, 2), -1);
  EXPECT_EQ(IndexOf(b.g, 3), -1);
  // Placed where the last member was: after grad1, grad2, before sum.
  ASSERT_EQ(IndexOf(b.g, 6), 2);
  const Op& f = b.g.ops[2];
  EXPECT_EQ(f.name, "fused.ar1+1");
  EXPECT_EQ(f.kind, OpKind::kCollective);
  EXPECT_EQ(f.collective, CollectiveType::kAllReduce);
  EXPECT_EQ(f.stream, "comm");
  EXPECT_EQ(f.group.axes, std::vector<std::string>{"dp"});
  EXPECT_EQ(f.inputs, (std::vector<std::string>{"g1", "g2"}));
  EXPECT_EQ(f.outputs, (std::vector<std::string>{"s1", "s2"}));
  EXPECT_EQ(f.message_bytes, 800);
  EXPECT_EQ(f.fused_from, (std::vector<int>{2, 3}));
  EXPECT_EQ(f.tags.layer, 0);  // from the last member
  EXPECT_EQ(f.tags.phase, Phase::kBackward);
  EXPECT_EQ(f.tags.purpose, "grad_sync");
  // Member control deps carried over; the direct one between members
  // (ar2 after ar1) is dropped: the fused op runs them together.
  EXPECT_EQ(f.control_deps, (std::vector<int>{0, 1}));
  // The marker's two deps on members became one dep on the fused op.
  EXPECT_EQ(b.g.ops[IndexOf(b.g, 5)].control_deps, std::vector<int>{6});
  EXPECT_TRUE(VerifyGraph(b.g, b.mesh).empty());
}

TEST(FusionTest, MeasuredDurationsAreKept) {
  // Both members measured (30 and 12 us): the fused op gets their sum, 42 us
  // (one launch instead of two, so an upper bound), not nothing.
  Builder b = TwoGrads();
  b.g.ops[IndexOf(b.g, 2)].duration_us = 30;
  b.g.ops[IndexOf(b.g, 3)].duration_us = 12;
  ASSERT_TRUE(FuseCollectives(b.g, {{2, 3}}).ok());
  ASSERT_TRUE(b.g.ops[IndexOf(b.g, 6)].duration_us.has_value());
  EXPECT_EQ(*b.g.ops[IndexOf(b.g, 6)].duration_us, 42);
  // One member unmeasured: the cost model prices the fused op whole.
  Builder c = TwoGrads();
  c.g.ops[IndexOf(c.g, 2)].duration_us = 30;
  ASSERT_TRUE(FuseCollectives(c.g, {{2, 3}}).ok());
  EXPECT_FALSE(c.g.ops[IndexOf(c.g, 6)].duration_us.has_value());
}

TEST(FusionTest, MemberOrderDecidesInputOrderNotProgramOrder) {
  Builder b = TwoGrads();
  Result<std::vector<int>> ids = FuseCollectives(b.g, {{3, 2}});
  ASSERT_TRUE(ids.ok()) << ids.status().message();
  const Op& f = b.g.ops[IndexOf(b.g, (*ids)[0])];
  EXPECT_EQ(f.name, "fused.ar2+1");
  EXPECT_EQ(f.inputs, (std::vector<std::string>{"g2", "g1"}));
  EXPECT_EQ(f.outputs, (std::vector<std::string>{"s2", "s1"}));
  EXPECT_EQ(f.tags.layer, 1);  // tags of the last member listed (ar1)
  EXPECT_EQ(IndexOf(b.g, f.id), 2);  // still at the later member's position
}

TEST(FusionTest, SeveralGroupsGetConsecutiveIds) {
  Builder b;
  for (const char* t : {"x", "a", "b", "c", "d", "ra", "rb", "rc", "rd"}) b.Tensor1(t, 10);
  for (const char* g : {"a", "b", "c", "d"}) b.Scale(std::string("mk_") + g, "x", g);  // 0-3
  b.Coll("ar_a", "a", "ra");                                                         // 4
  b.Coll("ar_b", "b", "rb");                                                         // 5
  b.Coll("ag_c", "c", "rc", CollectiveType::kAllGather);                             // 6
  b.Coll("ag_d", "d", "rd", CollectiveType::kAllGather);                             // 7
  b.g.tensors[7].shape = {20};
  b.g.tensors[8].shape = {20};
  Result<std::vector<int>> ids = FuseCollectives(b.g, {{6, 7}, {4, 5}});
  ASSERT_TRUE(ids.ok()) << ids.status().message();
  EXPECT_EQ(*ids, (std::vector<int>{8, 9}));
  ASSERT_EQ(b.g.ops.size(), 6u);
  EXPECT_EQ(b.g.ops[4].id, 9);  // the all-reduce pair ended at index 5
  EXPECT_EQ(b.g.ops[5].id, 8);  // the all-gather pair at index 7
  EXPECT_TRUE(VerifyGraph(b.g, b.mesh).empty());
}

TEST(FusionTest, EmptyGroupListIsANoOp) {
  Builder b = TwoGrads();
  Result<std::vector<int>> ids = FuseCollectives(b.g, {});
  ASSERT_TRUE(ids.ok());
  EXPECT_TRUE(ids->empty());
  EXPECT_EQ(b.g.ops.size(), 6u);
}

/// Expects FuseCollectives(groups) to fail with a message containing
/// `needle` and to leave the graph untouched.
void ExpectRejected(Builder b, const std::vector<std::vector<int>>& groups,
                    const std::string& needle) {
  const size_t before = b.g.ops.size();
  Result<std::vector<int>> ids = FuseCollectives(b.g, groups);
  ASSERT_FALSE(ids.ok());
  EXPECT_NE(ids.status().message().find(needle), std::string::npos) << ids.status().message();
  EXPECT_EQ(b.g.ops.size(), before);
}

TEST(FusionTest, RejectsMalformedGroups) {
  ExpectRejected(TwoGrads(), {{2}}, "at least 2");
  ExpectRejected(TwoGrads(), {{2, 42}}, "no op with id 42");
  ExpectRejected(TwoGrads(), {{0, 2}}, "not a collective");
  ExpectRejected(TwoGrads(), {{2, 3}, {3, 2}}, "already in fusion group 0");
}

TEST(FusionTest, RejectsIncompatibleMembers) {
  Builder b = TwoGrads();
  b.g.ops[3].collective = CollectiveType::kBroadcast;
  ExpectRejected(b, {{2, 3}}, "differs from op 2");
  b = TwoGrads();
  b.g.ops[3].group.axes = {"tp"};
  ExpectRejected(b, {{2, 3}}, "differs");
  b = TwoGrads();
  b.g.ops[3].reduce = ReduceOp::kMax;
  ExpectRejected(b, {{2, 3}}, "differs");
  b = TwoGrads();
  b.g.ops[3].stream = "compute";
  ExpectRejected(b, {{2, 3}}, "differs");
}

TEST(FusionTest, RejectsAMemberThatDependsOnAnother) {
  // ar1 -> scale -> ar2: one fused op would need its own output.
  Builder b;
  for (const char* t : {"x", "r1", "y", "r2"}) b.Tensor1(t, 10);
  b.Coll("ar1", "x", "r1");     // 0
  b.Scale("mid", "r1", "y");    // 1
  b.Coll("ar2", "y", "r2");     // 2
  ExpectRejected(b, {{0, 2}}, "op 2 depends on the output of op 0");
  // A control dep on the way closes the same kind of cycle.
  Builder c;
  for (const char* t : {"x", "r1", "y", "r2"}) c.Tensor1(t, 10);
  c.Coll("ar1", "x", "r1");                            // 0
  c.Scale("mid", "x", "y").control_deps = {0};         // 1
  c.Coll("ar2", "y", "r2");                            // 2
  ExpectRejected(c, {{0, 2}}, "op 2 depends on the output of op 0");
  // A member reading another member's output directly.
  Builder d;
  for (const char* t : {"x", "r1", "r2"}) d.Tensor1(t, 10);
  d.Coll("ar1", "x", "r1");
  d.Coll("ar2", "r1", "r2");
  ExpectRejected(d, {{0, 1}}, "would create a cycle");
}

TEST(FusionTest, RejectsGroupsThatFormACycleTogether) {
  // a1 -> b1 and b2 -> a2: fusing {a1, a2} and {b1, b2} loops A -> B -> A.
  Builder b;
  for (const char* t : {"x", "ra1", "rb1", "y", "rb2", "ra2"}) b.Tensor1(t, 10);
  b.Coll("a1", "x", "ra1");                                // 0
  b.Coll("b1", "ra1", "rb1", CollectiveType::kBroadcast);  // 1
  b.Coll("b2", "x", "rb2", CollectiveType::kBroadcast);    // 2
  b.Scale("mid", "rb2", "y");                              // 3
  b.Coll("a2", "y", "ra2");                                // 4
  ExpectRejected(b, {{0, 4}, {1, 2}}, "together with another fusion group");
}

}  // namespace
}  // namespace concerto
