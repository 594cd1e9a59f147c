// A lower bound on the makespan of any schedule of a program.
#pragma once

#include <array>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "concerto/cost/cost_model.h"

namespace concerto {

/// An op of one role's graph: role index into Program::roles, op index into
/// that role's graph ops. {-1, -1}: none.
struct RoleOp {
  int role = -1;
  int op = -1;
  bool operator==(const RoleOp&) const = default;
};

/// The representative (lowest rank) of each role with ranks: rank -> role.
std::map<int, int> RepresentativeRoles(const Program& program);

/// Per role, per op: the op a send or recv meets on another role's
/// representative, or {-1, -1} (not a send/recv, or its peer is not a
/// representative). The k-th send of a (source, destination, tag) key in
/// program order meets the k-th recv of that key in program order (the
/// schedule verifier holds every schedule to this pairing, so it does not
/// depend on the schedule).
std::vector<std::vector<RoleOp>> PairSendRecv(const Program& program);

/// Every role's representative graph (its lowest rank) as one node list,
/// nominal durations from the cost model, and the sends and recvs between
/// representatives by (source, destination, tag): the relaxation both lower
/// bounds (this one and schedule/propagation_bound.h) reason about.
struct JoinedGraph {
  std::vector<double> dur;           // nominal duration, us
  std::vector<std::string> stream;   // "role/stream" per node
  std::vector<int> role;             // index into Program::roles per node
  std::vector<char> comm;            // 1 for communication ops (Op::IsComm)
  std::vector<std::vector<int>> preds, succs;
  std::vector<int> partner;          // the node a send or recv meets (PairSendRecv), or -1
  /// Per node: the link work it puts on its rank's links at full rate, us:
  /// LinkLoad share x (duration - latency), per link slot (kLinkNames order:
  /// NVLink/PCIe out, in; NIC out, in). Zero for compute.
  std::vector<std::array<double, 4>> link_us;
};
/// The link slots of JoinedGraph::link_us.
inline constexpr const char* kLinkNames[4] = {"intra-link.out", "intra-link.in", "nic.out", "nic.in"};
/// The joined graph: data and control edges (both are precedences the
/// machine model honours, so every bound counts both).
JoinedGraph BuildJoinedGraph(const Program& program, const CostModel& cost);

/// LB = max(critical path, busiest stream's total work, fill + work + drain
/// of one stream), from undelayed op durations on each role's lowest rank.
/// The graphs of all roles are joined where sends on one representative meet
/// recvs on another (a rendezvous: both start together; the k-th send of a
/// key meets its k-th recv), so pipeline fill and drain count. Data and
/// control edges count alike (a program's control edges, and those a
/// scheduler added, are precedences of that program). This is the
/// *plain* bound; the driver raises `lower_bound_us` with the propagation
/// and interference bounds.
struct LowerBound {
  /// Longest chain of durations through the joined graphs.
  double critical_path_us = 0;
  /// The largest total work of one stream, or of one link of a rank (the
  /// transfer work of every communication op crossing it, whatever its
  /// stream: links are shared, docs/cost-model.md); `busiest_stream` names
  /// it ("link:nic.out" for a link).
  double stream_load_us = 0;
  std::string busiest_stream;
  /// Per stream and threshold h (an op's earliest start): h + the work of
  /// the stream's ops that cannot start before h + the smallest work that
  /// must follow one of them (the pipeline's fill and drain); the largest.
  double fill_drain_us = 0;
  std::string fill_drain_stream;
  int send_recv_pairs_joined = 0;  // send/recv pairs between representatives
  /// The destructive (constraint propagation) bound when one was computed
  /// (schedule/propagation_bound.h; the driver fills it in), else 0.
  double propagation_us = 0;
  /// The interference bound when one was computed (the overload of
  /// ComputeLowerBound with an interference; Summarize passes the
  /// simulation's), else 0.
  double interference_us = 0;
  /// max(critical path, stream load, fill + work + drain, propagation,
  /// interference).
  double lower_bound_us = 0;
  /// max of the three terms ComputeLowerBound computes (the plain bound).
  double PlainUs() const;
  /// The term that binds: "propagation", "interference", "fill+drain",
  /// "stream load" or "critical path".
  std::string BindingTerm() const;
};
LowerBound ComputeLowerBound(const Program& program, const CostModel& cost);
/// The plain bound and, from the same joined graph, the interference bound
/// (InterferenceBoundUs): `interference_us` is set and `lower_bound_us` is
/// the max of both.
LowerBound ComputeLowerBound(const Program& program, const CostModel& cost, double interference);
/// The same bound of an already joined graph of `roles` roles; also hands
/// back the heads (earliest starts, us) and tails (work that must follow an
/// op's nominal end, us) it used: valid for every schedule.
LowerBound BoundOfJoinedGraph(const JoinedGraph& j, int roles, std::vector<double>* head, std::vector<double>* tail);

/// With interference f (compute runs at 1/(1+f) of its speed while any
/// communication op is in flight on its rank), on every role's
/// representative, compute stream s and threshold h (an earliest start):
///   makespan >= h + C + (f A + q) / (1 + f)
/// where C is s's nominal compute work that cannot start before h, A the
/// largest comm work of one stream that cannot start before h (its ops run
/// one at a time inside [h, makespan], so comm is in flight at least A
/// there), and q the smallest tail of those compute ops. Proof: let e be
/// when the last of them ends; in [h, e] the stream gets through at most
/// 1/(1+f) of a unit of work per unit of time while comm is in flight, so
/// e - h >= C + f/(1+f) (A - (makespan - e)), and makespan - e >= q. With
/// f = 0 this is the plain fill + work + drain. The largest, us; `role`
/// names the role (when not null). 0 when f <= 0.
double InterferenceBoundUs(const Program& program, const CostModel& cost, double interference,
                           std::string* role = nullptr);

}  // namespace concerto
