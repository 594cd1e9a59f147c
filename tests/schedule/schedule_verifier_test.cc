// The schedule verifier lists every violation: missing or repeated ops, a
// dependency order broken on one stream, collectives issued in different
// orders by different ranks, unmatched sends.
#include <gtest/gtest.h>

#include <functional>

#include "concerto/schedule/schedule.h"

namespace concerto {
namespace {

Tensor T(const std::string& name) { return Tensor{name, {4}, DType::kF32, {{}}, {}}; }

Op Compute(int id, const std::string& name, std::vector<std::string> in, std::vector<std::string> out) {
  Op op;
  op.id = id;
  op.name = name;
  op.kind = OpKind::kCompute;
  op.stream = "compute";
  op.compute_type = ComputeType::kScale;
  op.inputs = std::move(in);
  op.outputs = std::move(out);
  return op;
}

Op AllReduce(int id, const std::string& name, const std::string& in, const std::string& out, int64_t bytes) {
  Op op;
  op.id = id;
  op.name = name;
  op.kind = OpKind::kCollective;
  op.stream = "comm";
  op.collective = CollectiveType::kAllReduce;
  op.group.axes = {"dp"};
  op.inputs = {in};
  op.outputs = {out};
  op.message_bytes = bytes;
  return op;
}

// a -> b -> c on compute; ar(b) on comm.
Program VerifierChain() {
  Program p;
  p.mesh.axes = {{"dp", 2}};
  Graph g;
  g.name = "main";
  g.tensors = {T("x"), T("y"), T("z"), T("w"), T("s")};
  g.ops = {Compute(0, "a", {"x"}, {"y"}), Compute(1, "b", {"y"}, {"z"}), AllReduce(2, "ar", "z", "s", 16),
           Compute(3, "c", {"s"}, {"w"})};
  p.graphs = {g};
  p.roles = {{"spmd", "main", {0, 1}}};
  return p;
}

bool Contains(const std::vector<std::string>& v, const std::string& needle) {
  for (const auto& s : v)
    if (s.find(needle) != std::string::npos) return true;
  return false;
}

TEST(ScheduleVerifier, ProgramOrderIsClean) {
  Program p = VerifierChain();
  EXPECT_TRUE(VerifySchedule(p, ProgramOrderSchedule(p, "fifo")).empty());
}

TEST(ScheduleVerifier, MissingAndRepeatedOps) {
  Program p = VerifierChain();
  Schedule s = ProgramOrderSchedule(p, "x");
  s.roles[0].streams[0].op_ids = {0, 1, 1};  // c missing, b twice
  auto v = VerifySchedule(p, s);
  EXPECT_TRUE(Contains(v, "op 1 'b' is listed twice"));
  EXPECT_TRUE(Contains(v, "op 3 'c' is missing from the schedule"));
}

TEST(ScheduleVerifier, DependencyOrderBrokenOnOneStream) {
  Program p = VerifierChain();
  Schedule s = ProgramOrderSchedule(p, "x");
  s.roles[0].streams[0].op_ids = {1, 0, 3};
  auto v = VerifySchedule(p, s);
  EXPECT_TRUE(Contains(v, "op 1 'b' runs before its dependency op 0 'a' on stream 'compute'"));
}

TEST(ScheduleVerifier, CrossStreamCycleIsADeadlock) {
  // compute: a, c, b   comm: ar.  c needs ar, ar needs b, b is behind c on
  // the compute stream: c -> ar -> b -> (stream order) -> c never moves.
  Program p = VerifierChain();
  Schedule s = ProgramOrderSchedule(p, "x");
  s.roles[0].streams[0].op_ids = {0, 3, 1};
  auto v = VerifySchedule(p, s);
  EXPECT_TRUE(Contains(v, "deadlock:")) << (v.empty() ? "" : v[0]);
  EXPECT_TRUE(Contains(v, "waits in a cycle of dependencies and stream order (3 ops stuck)"));
}

TEST(ScheduleVerifier, OpsStayOnTheirOwnStream) {
  Program p = VerifierChain();
  Schedule s = ProgramOrderSchedule(p, "x");
  s.roles[0].streams[0].op_ids = {0, 2, 3};
  s.roles[0].streams[1].op_ids = {1};
  auto v = VerifySchedule(p, s);
  EXPECT_TRUE(Contains(v, "op 1 'b' belongs on stream 'compute', not 'comm'"));
  EXPECT_TRUE(Contains(v, "op 2 'ar' belongs on stream 'comm', not 'compute'"));
}

/// dp=2 with one role per rank; role r runs graph "g<r>" over tensors x, y,
/// u, v with the ops `ops_of(r)`.
Program TwoRoles(const std::function<std::vector<Op>(int)>& ops_of) {
  Program p;
  p.mesh.axes = {{"dp", 2}};
  for (int r = 0; r < 2; ++r) {
    Graph g;
    g.name = "g" + std::to_string(r);
    g.tensors = {T("x"), T("y"), T("u"), T("v")};
    g.streams = {"compute", "comm"};
    g.ops = ops_of(r);
    p.graphs.push_back(g);
    p.roles.push_back({"r" + std::to_string(r), g.name, {r}});
  }
  return p;
}

TEST(ScheduleVerifier, CollectivesInDifferentOrdersAcrossRoles) {
  // Two roles (one rank each) issue two all-reduces of different sizes on the
  // same group in opposite orders: a real run would hang.
  Program p = TwoRoles([](int r) {
    Op first = AllReduce(0, "ar_small", "x", "y", 16);
    Op second = AllReduce(1, "ar_big", "u", "v", 64);
    if (r == 1) std::swap(first.id, second.id);
    return r == 0 ? std::vector<Op>{first, second} : std::vector<Op>{second, first};
  });
  auto v = VerifySchedule(p, ProgramOrderSchedule(p, "x"));
  EXPECT_TRUE(Contains(v, "collective order differs on group {0,1,}")) << (v.empty() ? "" : v[0]);
}

TEST(ScheduleVerifier, CollectivesOfOneTypeAndSizeInDifferentOrdersAcrossRoles) {
  // Two roles issue two all-reduces of the same type and size on one group in
  // opposite orders: nothing would hang, but rank 0's 'grad.a' would be
  // summed with rank 1's 'grad.b'. The names are the identity that must meet.
  Program p = TwoRoles([](int) {
    return std::vector<Op>{AllReduce(0, "grad.a", "x", "y", 16), AllReduce(1, "grad.b", "u", "v", 16)};
  });
  Schedule s = ProgramOrderSchedule(p, "x");
  EXPECT_TRUE(VerifySchedule(p, s).empty());  // same order: they meet by name
  for (auto& so : s.roles[1].streams)
    if (so.stream == "comm") so.op_ids = {1, 0};  // rank 1: grad.b first
  auto v = VerifySchedule(p, s);
  EXPECT_TRUE(Contains(v, "collectives on group {0,1,} do not match: rank 0 issues op 0 'grad.a' as its collective 1 "
                          "where rank 1 issues op 1 'grad.b'"))
      << (v.empty() ? "" : v[0]);
}

TEST(ScheduleVerifier, UnmatchedSend) {
  Program p;
  p.mesh.axes = {{"pp", 2}};
  Graph g0;
  g0.name = "s0";
  g0.tensors = {T("h")};
  Op send;
  send.id = 0;
  send.name = "send_h";
  send.kind = OpKind::kSend;
  send.stream = "comm";
  send.peer.axis = "pp";
  send.peer.offset = 1;
  send.inputs = {"h"};
  g0.ops = {send};
  Graph g1;
  g1.name = "s1";
  p.graphs = {g0, g1};
  p.roles = {{"s0", "s0", {0}}, {"s1", "s1", {1}}};
  auto v = VerifySchedule(p, ProgramOrderSchedule(p, "x"));
  EXPECT_TRUE(Contains(v, "unmatched send op 0 'send_h': rank 0 sends 1 messages to rank 1 (tag 0) and it receives 0"))
      << (v.empty() ? "" : v[0]);
}

TEST(ScheduleVerifier, SendsAndRecvsMustBePermutedAlike) {
  // Stage 0 sends micro-batches a then b to stage 1 (tag 0), stage 1
  // receives a then b. A schedule that issues the sends b, a but the recvs
  // a, b would hand b's data to a's recv: the k-th send issued meets the k-th
  // recv issued. Permuting both ends alike is fine.
  Program p;
  p.mesh.axes = {{"pp", 2}};
  auto p2p = [](int id, const std::string& name, OpKind kind, int offset, const std::string& tensor) {
    Op op;
    op.id = id;
    op.name = name;
    op.kind = kind;
    op.stream = "comm";
    op.peer.axis = "pp";
    op.peer.offset = offset;
    (kind == OpKind::kSend ? op.inputs : op.outputs) = {tensor};
    return op;
  };
  Graph g0;
  g0.name = "s0";
  g0.tensors = {T("a"), T("b")};
  g0.ops = {p2p(0, "send_a", OpKind::kSend, 1, "a"), p2p(1, "send_b", OpKind::kSend, 1, "b")};
  Graph g1;
  g1.name = "s1";
  g1.tensors = {T("ra"), T("rb")};
  g1.ops = {p2p(0, "recv_a", OpKind::kRecv, -1, "ra"), p2p(1, "recv_b", OpKind::kRecv, -1, "rb")};
  p.graphs = {g0, g1};
  p.roles = {{"s0", "s0", {0}}, {"s1", "s1", {1}}};
  EXPECT_TRUE(VerifySchedule(p, ProgramOrderSchedule(p, "x")).empty());

  Schedule swapped = ProgramOrderSchedule(p, "x");
  swapped.roles[0].streams[1].op_ids = {1, 0};  // stage 0: send_b, send_a
  auto v = VerifySchedule(p, swapped);
  EXPECT_TRUE(Contains(v, "send/recv order differs: rank 0 issues op 1 'send_b' (its send #1 to rank 1, tag 0, in "
                          "program order) as message 0, which rank 1 receives in op 0 'recv_a' (its recv #0)"))
      << (v.empty() ? "" : v[0]);

  swapped.roles[1].streams[1].op_ids = {1, 0};  // stage 1 alike: recv_b, recv_a
  EXPECT_TRUE(VerifySchedule(p, swapped).empty());
}

TEST(ScheduleVerifier, UnknownRoleAndStream) {
  Program p = VerifierChain();
  Schedule s = ProgramOrderSchedule(p, "x");
  s.roles[0].streams[1].stream = "nccl";
  s.roles.push_back({"ghost", {}});
  auto v = VerifySchedule(p, s);
  EXPECT_TRUE(Contains(v, "schedule names unknown role 'ghost'"));
  EXPECT_TRUE(Contains(v, "unknown stream 'nccl'"));
}

TEST(ScheduleVerifier, JsonRoundTrip) {
  Program p = VerifierChain();
  Schedule s = ProgramOrderSchedule(p, "fifo");
  s.fusion_groups.push_back({"spmd", 9, {1, 2}});
  std::string text = WriteSchedule(s);
  Result<Schedule> back = ParseSchedule(text, "s.json");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(WriteSchedule(*back), text);
  Result<Schedule> bad = ParseSchedule("{\"format\": \"concerto-schedule\"}", "bad.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "bad.json: missing field 'scheduler'");
}

}  // namespace
}  // namespace concerto
