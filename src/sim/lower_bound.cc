// The lower bound (see the header). Every term holds for every schedule the
// machine model allows: op durations only grow (interference), waits only
// delay, a stream runs one op at a time, and a send and its recv start
// together.
#include "concerto/sim/lower_bound.h"

#include <functional>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>

#include "concerto/ir/graph_index.h"
#include "concerto/util/serial_rule.h"

namespace concerto {

std::map<int, int> RepresentativeRoles(const Program& program) {
  std::map<int, int> rep_role;  // rank -> role
  for (size_t r = 0; r < program.roles.size(); ++r)
    if (!program.roles[r].ranks.empty())
      rep_role[*std::min_element(program.roles[r].ranks.begin(), program.roles[r].ranks.end())] = static_cast<int>(r);
  return rep_role;
}

std::vector<std::vector<RoleOp>> PairSendRecv(const Program& program) {
  std::vector<std::vector<RoleOp>> partner(program.roles.size());
  for (size_t r = 0; r < program.roles.size(); ++r) partner[r].assign(program.GraphOf(program.roles[r]).ops.size(), {});
  const std::map<int, int> rep_role = RepresentativeRoles(program);
  std::map<std::tuple<int, int, int>, std::pair<std::vector<RoleOp>, std::vector<RoleOp>>> keys;  // (sends, recvs)
  for (const auto& [rep, r] : rep_role) {
    const Graph& g = program.GraphOf(program.roles[r]);
    for (size_t i = 0; i < g.ops.size(); ++i) {
      const Op& op = g.ops[i];
      if (op.kind != OpKind::kSend && op.kind != OpKind::kRecv) continue;
      const int peer = PeerRank(program.mesh, op.peer, rep);
      if (!rep_role.count(peer)) continue;  // a peer not simulated: left unjoined (a relaxation)
      const bool send = op.kind == OpKind::kSend;
      auto& lists = keys[{send ? rep : peer, send ? peer : rep, op.tag}];
      (send ? lists.first : lists.second).push_back({r, static_cast<int>(i)});
    }
  }
  for (const auto& [key, lists] : keys)
    for (size_t m = 0; m < std::min(lists.first.size(), lists.second.size()); ++m) {
      const RoleOp s = lists.first[m], v = lists.second[m];
      partner[s.role][s.op] = v;
      partner[v.role][v.op] = s;
    }
  return partner;
}

JoinedGraph BuildJoinedGraph(const Program& program, const CostModel& cost) {
  JoinedGraph j;
  std::vector<int> base(program.roles.size(), -1);  // per role: node of its op 0
  for (const auto& [rep, r] : RepresentativeRoles(program)) {
    const Role& role = program.roles[r];
    const Graph& g = program.GraphOf(role);
    GraphIndex index = GraphIndex::Build(g);
    PriceContext ctx{g, index, program.mesh, rep};
    base[r] = static_cast<int>(j.dur.size());
    for (size_t i = 0; i < g.ops.size(); ++i) {
      const Op& op = g.ops[i];
      const PricedOp priced = cost.Price(op, ctx);
      // Over shared links a transfer may start with an idle link's burst
      // (ClusterSpec::link_burst_us): the bound grants every one of them.
      const double burst_us =
          op.IsComm() && priced.load.Any()
              ? std::min(cost.cluster().link_burst_us,
                         std::max(0.0, priced.duration_us - priced.load.latency_us))
              : 0.0;
      j.dur.push_back(priced.duration_us - burst_us);
      std::array<double, 4> link{0, 0, 0, 0};
      if (op.IsComm() && priced.load.Any()) {
        const double transfer = std::max(0.0, priced.duration_us - priced.load.latency_us - burst_us);
        const bool out = op.kind != OpKind::kRecv, in = op.kind != OpKind::kSend;
        link = {out ? priced.load.intra * transfer : 0, in ? priced.load.intra * transfer : 0,
                out ? priced.load.inter * transfer : 0, in ? priced.load.inter * transfer : 0};
      }
      j.link_us.push_back(link);
      j.stream.push_back(role.name + "/" + op.stream);
      j.role.push_back(r);
      j.comm.push_back(op.IsComm() ? 1 : 0);
      j.preds.emplace_back();
      for (int p : index.preds[i]) j.preds.back().push_back(base[r] + p);
    }
  }
  j.succs.assign(j.dur.size(), {});
  for (size_t i = 0; i < j.preds.size(); ++i)
    for (int p : j.preds[i]) j.succs[p].push_back(static_cast<int>(i));
  j.partner.assign(j.dur.size(), -1);
  const std::vector<std::vector<RoleOp>> partner_of = PairSendRecv(program);
  for (size_t i = 0; i < j.dur.size(); ++i) {
    const int r = j.role[i];
    const RoleOp p = partner_of[r][static_cast<int>(i) - base[r]];
    if (p.role >= 0) j.partner[i] = base[p.role] + p.op;
  }
  return j;
}

namespace {

/// Heads (earliest starts) and tails (work that must follow an op's end).
/// A head is at least every predecessor's head + duration and, for the
/// predecessors (and their predecessors) that share a stream, the
/// SerialBound of them: a stream runs one op at a time, so a node waiting
/// for two chunks of an all-reduce waits for both to run one after the
/// other. Tails mirror this. A send and its recv start together, so an op's
/// head is at least its partner's head, and its tail at least the
/// partner's (duration + tail) minus its own duration. Iterated (values
/// only grow and each step is a valid bound) until stable or `rounds` runs.
void HeadsAndTails(const JoinedGraph& j, const std::vector<int>& topo, int rounds, std::vector<double>* head,
                   std::vector<double>* tail) {
  const size_t n = j.dur.size();
  const std::vector<int>& partner = j.partner;
  std::vector<int> stream_id(n);
  {
    std::map<std::string, int> ids;
    for (size_t i = 0; i < n; ++i) stream_id[i] = ids.emplace(j.stream[i], static_cast<int>(ids.size())).first->second;
  }
  const auto before = GroupSerialRelatives(j.dur, stream_id, j.preds);
  const auto after = GroupSerialRelatives(j.dur, stream_id, j.succs);
  std::vector<int> order;
  head->assign(n, 0);
  tail->assign(n, 0);
  auto& h = *head;
  auto& t = *tail;
  for (int round = 0; round < rounds; ++round) {
    bool changed = false;
    for (int i : topo) {
      double v = h[i];
      for (int p : j.preds[i]) v = std::max(v, h[p] + j.dur[p]);
      for (const auto& g : before[i]) v = std::max(v, SerialBound(g, h, j.dur, &order));
      if (partner[i] >= 0) v = std::max(v, h[partner[i]]);
      changed = changed || v > h[i];
      h[i] = v;
    }
    for (auto it = topo.rbegin(); it != topo.rend(); ++it) {
      const int i = *it;
      double v = t[i];
      for (int s : j.succs[i]) v = std::max(v, j.dur[s] + t[s]);
      for (const auto& g : after[i]) v = std::max(v, SerialBound(g, t, j.dur, &order));
      if (partner[i] >= 0) v = std::max(v, j.dur[partner[i]] + t[partner[i]] - j.dur[i]);
      changed = changed || v > t[i];
      t[i] = v;
    }
    if (!changed) break;
  }
}

/// On one stream: for every threshold h (a head), the ops with head >= h run
/// one after another from h, and the last of them still has its tail to go.
/// `work` (default: each op's duration) is what the resource must get
/// through for op i; a link's work ends no later than its op does.
double FillDrain(std::vector<int> ops, const JoinedGraph& j, const std::vector<double>& head,
                 const std::vector<double>& tail, const std::function<double(int)>& work_of = nullptr) {
  std::sort(ops.begin(), ops.end(), [&](int a, int b) { return head[a] > head[b]; });
  double bound = 0, work = 0, min_tail = std::numeric_limits<double>::infinity();
  for (int i : ops) {
    work += work_of ? work_of(i) : j.dur[i];
    min_tail = std::min(min_tail, tail[i]);
    bound = std::max(bound, head[i] + work + min_tail);
  }
  return bound;
}

/// Carlier's one-machine bound on one stream (or link): for a head threshold
/// h and each tail threshold q, the ops with head >= h and tail >= q all run
/// after h, one after another, and the last of them to finish still has at
/// least q to go: h + their work + q. FillDrain is the case where q is the
/// smallest tail of the ops past h; dropping the ops of small tail (the last
/// backward sends of a pipeline stage) can give more. Every (h, q) pair gives
/// a valid bound, so on streams with many distinct heads only
/// kPairedHeadThresholds of them, evenly spread, are tried: O(that x n).
constexpr size_t kPairedHeadThresholds = 256;
double PairedFillDrain(std::vector<int> ops, const JoinedGraph& j, const std::vector<double>& head,
                       const std::vector<double>& tail, const std::function<double(int)>& work_of = nullptr) {
  std::sort(ops.begin(), ops.end(), [&](int a, int b) { return tail[a] > tail[b]; });  // largest tail first
  std::vector<double> heads;
  heads.reserve(ops.size());
  for (int i : ops) heads.push_back(head[i]);
  std::sort(heads.begin(), heads.end());
  heads.erase(std::unique(heads.begin(), heads.end()), heads.end());
  if (heads.size() > kPairedHeadThresholds) {
    std::vector<double> spread;
    for (size_t k = 0; k < kPairedHeadThresholds; ++k)
      spread.push_back(heads[k * (heads.size() - 1) / (kPairedHeadThresholds - 1)]);
    heads = std::move(spread);
  }
  double bound = 0;
  for (const double h : heads) {
    double work = 0;
    for (int i : ops) {
      if (head[i] < h) continue;
      work += work_of ? work_of(i) : j.dur[i];
      bound = std::max(bound, h + work + tail[i]);
    }
  }
  return bound;
}

}  // namespace

double LowerBound::PlainUs() const { return std::max({critical_path_us, stream_load_us, fill_drain_us}); }

std::string LowerBound::BindingTerm() const {
  if (std::max(propagation_us, interference_us) > PlainUs())
    return propagation_us >= interference_us ? "propagation" : "interference";
  if (fill_drain_us > std::max(critical_path_us, stream_load_us)) return "fill+drain";
  return stream_load_us > critical_path_us ? "stream load" : "critical path";
}

LowerBound BoundOfJoinedGraph(const JoinedGraph& j, int roles, std::vector<double>* head, std::vector<double>* tail) {
  LowerBound lb;
  std::vector<int> topo = KahnOrder(j.preds, j.succs);
  assert(topo.size() == j.dur.size() && "a role's graph has a cycle");
  for (size_t i = 0; i < j.partner.size(); ++i) lb.send_recv_pairs_joined += j.partner[i] > static_cast<int>(i);
  // Each round carries heads (and tails) at least one stage further.
  HeadsAndTails(j, topo, 4 * roles + 8, head, tail);
  std::map<std::string, std::vector<int>> on;
  std::map<std::string, double> load;
  for (size_t i = 0; i < j.dur.size(); ++i) {
    lb.critical_path_us = std::max(lb.critical_path_us, (*head)[i] + j.dur[i] + (*tail)[i]);
    load[j.stream[i]] += j.dur[i];
    if (j.dur[i] > 0) on[j.stream[i]].push_back(static_cast<int>(i));
  }
  for (const auto& [stream, us] : load)
    if (us > lb.stream_load_us) lb.stream_load_us = us, lb.busiest_stream = stream.substr(stream.find('/') + 1);
  for (const auto& [stream, ops] : on) {
    const double b = std::max(FillDrain(ops, j, *head, *tail), PairedFillDrain(ops, j, *head, *tail));
    if (b > lb.fill_drain_us) lb.fill_drain_us = b, lb.fill_drain_stream = stream;
  }
  // Links: every transfer crossing one link of a rank shares its capacity,
  // whatever stream it runs on, so the link's work is a load and a fill +
  // work + drain of its own (per role representative and link slot).
  std::map<std::pair<int, int>, std::vector<int>> on_link;  // (role, slot) -> nodes
  std::map<std::pair<int, int>, double> link_load;
  for (size_t i = 0; i < j.link_us.size(); ++i)
    for (int slot = 0; slot < 4; ++slot)
      if (j.link_us[i][slot] > 0) {
        on_link[{j.role[i], slot}].push_back(static_cast<int>(i));
        link_load[{j.role[i], slot}] += j.link_us[i][slot];
      }
  for (const auto& [key, us] : link_load)
    if (us > lb.stream_load_us) lb.stream_load_us = us, lb.busiest_stream = std::string("link:") + kLinkNames[key.second];
  for (const auto& [key, ops] : on_link) {
    const int slot = key.second;
    const auto link_work = [&](int i) { return j.link_us[i][slot]; };
    const double b =
        std::max(FillDrain(ops, j, *head, *tail, link_work), PairedFillDrain(ops, j, *head, *tail, link_work));
    if (b > lb.fill_drain_us) lb.fill_drain_us = b, lb.fill_drain_stream = "link:" + std::string(kLinkNames[slot]);
  }
  lb.lower_bound_us = std::max({lb.critical_path_us, lb.stream_load_us, lb.fill_drain_us});
  return lb;
}

namespace {

/// The interference bound of one role's ops (`ops`, nodes of `j`), see
/// InterferenceBoundUs: for every threshold h (a head, high to low) and
/// compute stream s, with C = s's compute work of head >= h, A = the largest
/// comm work of one stream of head >= h and q = the smallest tail among
/// those compute ops: h + C + (f A + q) / (1 + f).
double RoleInterferenceBound(const JoinedGraph& j, const std::vector<int>& ops, const std::vector<double>& head,
                             const std::vector<double>& tail, double f) {
  std::vector<int> order = ops;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return head[a] > head[b]; });
  std::map<std::string, double> comm_us;                       // per stream, head >= h
  std::map<std::string, std::pair<double, double>> compute;  // per stream: (work, smallest tail)
  double best = 0, busiest_comm_us = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const int i = order[k];
    if (j.comm[i]) {
      busiest_comm_us = std::max(busiest_comm_us, comm_us[j.stream[i]] += j.dur[i]);
    } else if (j.dur[i] > 0) {
      auto [it, added] = compute.emplace(j.stream[i], std::make_pair(0.0, tail[i]));
      it->second.first += j.dur[i];
      it->second.second = std::min(it->second.second, tail[i]);
    }
    if (k + 1 < order.size() && head[order[k + 1]] == head[i]) continue;  // the threshold takes all ops at h
    for (const auto& [stream, c] : compute)
      best = std::max(best, head[i] + c.first + (f * busiest_comm_us + c.second) / (1 + f));
  }
  return best;
}

/// The interference bound of a joined graph with its heads and tails: the
/// largest RoleInterferenceBound over the roles; `role` names it.
double JoinedInterferenceBound(const Program& program, const JoinedGraph& j, const std::vector<double>& head,
                               const std::vector<double>& tail, double interference, std::string* role) {
  std::map<int, std::vector<int>> by_role;
  for (size_t i = 0; i < j.dur.size(); ++i) by_role[j.role[i]].push_back(static_cast<int>(i));
  double best = 0;
  for (const auto& [r, ops] : by_role) {
    const double b = RoleInterferenceBound(j, ops, head, tail, interference);
    if (b > best) {
      best = b;
      if (role) *role = program.roles[r].name;
    }
  }
  return best;
}

}  // namespace

double InterferenceBoundUs(const Program& program, const CostModel& cost, double interference, std::string* role) {
  if (!(interference > 0)) return 0;
  const JoinedGraph j = BuildJoinedGraph(program, cost);
  std::vector<double> head, tail;
  BoundOfJoinedGraph(j, static_cast<int>(program.roles.size()), &head, &tail);
  return JoinedInterferenceBound(program, j, head, tail, interference, role);
}

LowerBound ComputeLowerBound(const Program& program, const CostModel& cost) {
  std::vector<double> head, tail;
  return BoundOfJoinedGraph(BuildJoinedGraph(program, cost), static_cast<int>(program.roles.size()),
                            &head, &tail);
}

LowerBound ComputeLowerBound(const Program& program, const CostModel& cost, double interference) {
  const JoinedGraph j = BuildJoinedGraph(program, cost);
  std::vector<double> head, tail;
  LowerBound lb = BoundOfJoinedGraph(j, static_cast<int>(program.roles.size()), &head, &tail);
  if (interference > 0) lb.interference_us = JoinedInterferenceBound(program, j, head, tail, interference, nullptr);
  lb.lower_bound_us = std::max(lb.lower_bound_us, lb.interference_us);
  return lb;
}

}  // namespace concerto
