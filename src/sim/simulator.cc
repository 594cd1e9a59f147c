#include "concerto/sim/simulator.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <map>
#include <queue>
#include <set>
#include <tuple>

#include "concerto/ir/graph_index.h"
#include "concerto/ir/op_registry.h"
#include "concerto/sim/jitter.h"

namespace concerto {
namespace {

constexpr int kNone = -1;
constexpr int kFlowJoin = 0;  // a transfer's latency is over: it joins its links
constexpr int kFlowEnd = 1;   // a transfer ends: every member of its rendezvous finishes
constexpr int kWaitEnd = 2;   // a rendezvous's co-run wait is over (ClusterSpec::comm_corun_latency_us)
constexpr int kTransferEnd = 3;  // a transfer off the shared links ends
constexpr int kHoldEnd = 4;      // a held transfer's hold is over (ClusterSpec::comm_corun_hold_us)
constexpr int kLastArrival = 5;  // a rendezvous's expected last arrival (ClusterSpec::compute_jitter)

/// The link resources of one simulated rank (docs/cost-model.md, "Shared links").
enum LinkSlot { kIntraTx = 0, kIntraRx = 1, kInterTx = 2, kInterRx = 3, kLinkSlots = 4 };

/// One transfer in flight over shared links: a collective instance or a
/// send/recv pair. Its transfer part progresses at `rate` (1: the priced
/// speed) and needs `demand` of each link's capacity at rate 1.
struct Flow {
  double left_us = 0;  // transfer time left at rate 1
  bool waiting = false;        // in its co-run wait (ClusterSpec::comm_corun_latency_us)
  int wait_version = 0;        // its kWaitEnd event's (a wait ended early voids it)
  bool transfer_done = false;  // its transfer ended during the wait
  bool held = false;           // in the first part of its wait, moving nothing (ClusterSpec::comm_corun_hold_us)
  double held_dur_us = 0;      // while held: the transfer's price, started when the hold ends
  int held_longest = -1;       // while held: the member that priced it
  double held_us = 0;          // how long its hold lasted (not link sharing)
  double rate = 1;
  double last_us = 0;
  int version = 0;
  bool fresh = false;  // joined its links and has no end event yet
  std::vector<std::pair<int, double>> demand;  // (global link id, fraction of its capacity)
};

/// One rank being simulated: its graph, schedule and per-op state offsets.
struct SimRank {
  int rank = 0;
  int role = 0;
  const Graph* graph = nullptr;
  const GraphIndex* index = nullptr;
  std::vector<std::vector<int>> order;  // per stream: op indices
  std::vector<int> stream_of;           // per op: stream index
  int base = 0;                         // offset of this rank's ops in the global arrays
};

/// A rendezvous: the members of one collective instance, or a send/recv pair.
struct Rendezvous {
  int expected = 0;
  int arrived = 0;
  std::vector<int> members;  // global op ids (gid)
  int last_gid = kNone;
  bool cold = false;  // the last member's stream idled before it (ClusterSpec::comm_corun_hold_us)
};

struct Event {
  double time_us;
  long seq;
  int gid;      // an op (flow < 0), or the rendezvous a flow event is for
  int version;
  int flow = -1;  // -1: an op finishes; kFlowJoin / kFlowEnd: a shared-link transfer; kWaitEnd
  bool operator>(const Event& o) const {
    return time_us != o.time_us ? time_us > o.time_us : seq > o.seq;
  }
};

std::string Key(const std::vector<int>& v) {
  std::string k;
  for (int x : v) k += std::to_string(x) + ",";
  return k;
}

/// Chooses which ranks to simulate: one per role when that is exact (no
/// group or peer reaches outside the representatives, and collectives cost
/// the same on every rank of a role), else all ranks.
std::vector<int> ChooseRanks(const Program& p, const std::vector<GraphIndex>& indexes,
                             const CostModel& cost, bool all_ranks, bool* representative) {
  std::vector<int> all;
  for (const auto& role : p.roles)
    for (int r : role.ranks) all.push_back(r);
  std::sort(all.begin(), all.end());
  *representative = false;
  // On a bus every transfer of a node meets every other, the replicas' too.
  if (all_ranks || cost.cluster().topology.IsBus()) return all;
  std::vector<int> reps;
  for (const auto& role : p.roles) reps.push_back(*std::min_element(role.ranks.begin(), role.ranks.end()));
  std::set<int> rep_set(reps.begin(), reps.end());
  for (size_t r = 0; r < p.roles.size(); ++r) {
    const Role& role = p.roles[r];
    const int gi = p.GraphIndex(role.graph);
    const Graph& g = p.graphs[gi];
    std::set<std::string> alike_checked;
    for (const Op& op : g.ops) {
      if (!op.IsComm()) continue;
      if (op.kind == OpKind::kCollective) {
        // Collectives alike in everything a price reads are checked once per
        // role (a role of 1,024 ranks and thousands of collectives: millions
        // of prices otherwise).
        std::string key = std::to_string(static_cast<int>(op.collective)) + "|" +
                          std::to_string(static_cast<int>(op.reduce)) + "|" + std::to_string(op.message_bytes) +
                          "|" + GroupSpecKey(op.group) + "|" +
                          (op.duration_us ? std::to_string(*op.duration_us) : std::string("-"));
        for (const std::string& in : op.inputs) {
          auto t = indexes[gi].tensor.find(in);
          if (t != indexes[gi].tensor.end()) key += "|" + std::to_string(static_cast<int>(g.tensors[t->second].dtype));
        }
        if (!alike_checked.insert(std::move(key)).second) continue;
        for (int m : GroupRanks(p.mesh, op.group, reps[r]))
          if (p.RoleOfRank(m) != static_cast<int>(r)) return all;
        PriceContext rep_ctx{g, indexes[gi], p.mesh, reps[r]};
        double rep_us = cost.Price(op, rep_ctx).duration_us;
        for (int rank : role.ranks) {
          PriceContext ctx{g, indexes[gi], p.mesh, rank};
          if (cost.Price(op, ctx).duration_us != rep_us) return all;
        }
      } else if (!rep_set.count(PeerRank(p.mesh, op.peer, reps[r]))) {
        return all;
      }
    }
  }
  *representative = true;
  std::sort(reps.begin(), reps.end());
  return reps;
}

class Simulator {
 public:
  Simulator(const ScheduledProgram& sp, const CostModel& cost, const SimOptions& options,
            const std::vector<GraphIndex>& indexes)
      : p_(sp.program), sched_(sp.schedule), cost_(cost), indexes_(indexes) {
    assert(indexes_.size() == p_.graphs.size() && "one index per graph");
    interference_ = EffectiveInterference(options.interference, cost.cluster());
    growth_ = cost.cluster().topology.interference_growth;
    corun_ = cost.cluster().corun_slowdown;
    corun_memory_ = cost.cluster().CorunSlowdownMemory();
    comm_corun_ = cost.cluster().comm_corun_slowdown;
    comm_corun_latency_us_ = cost.cluster().comm_corun_latency_us;
    link_burst_us_ = cost.cluster().link_burst_us;
    comm_hold_us_ = std::min(cost.cluster().comm_corun_hold_us, cost.cluster().comm_corun_latency_us);
    jitter_ = cost.cluster().compute_jitter;
    bus_ = cost.cluster().topology.IsBus();
    share_links_ = options.share_links >= 0 ? options.share_links > 0 : cost.cluster().topology.share_links;
    bool rep = false;
    ranks_ = ChooseRanks(p_, indexes_, cost_, options.all_ranks, &rep);
    timeline_.ranks = ranks_;
    timeline_.representative = rep;
  }

  Result<Timeline> Run() {
    CONCERTO_RETURN_IF_ERROR(Setup());
    CONCERTO_RETURN_IF_ERROR(BuildRendezvous());
    for (size_t sr = 0; sr < sim_.size(); ++sr)
      for (size_t s = 0; s < sim_[sr].order.size(); ++s) TryStart(static_cast<int>(sr), static_cast<int>(s));
    while (!queue_.empty()) {
      Event e = queue_.top();
      queue_.pop();
      if (e.flow == kWaitEnd) {
        if (e.version != flows_[e.gid].wait_version) continue;  // its ranks stopped computing first
        now_ = e.time_us;
        EndWait(e.gid);
        continue;
      }
      if (e.flow == kHoldEnd) {
        if (e.version != flows_[e.gid].wait_version) continue;  // its ranks stopped computing first
        now_ = e.time_us;
        EndHold(e.gid);
        continue;
      }
      if (e.flow == kTransferEnd) {
        now_ = e.time_us;
        TransferDone(e.gid);
        continue;
      }
      if (e.flow == kLastArrival) {
        now_ = e.time_us;
        StartRendezvous(e.gid);
        continue;
      }
      if (e.flow >= 0) {
        if (e.version != flows_[e.gid].version) continue;  // re-timed by link sharing
        FlowEvent(e.gid, e.flow, e.time_us);
        continue;
      }
      if (e.version != version_[e.gid]) continue;  // re-timed by interference
      Finish(e.gid, e.time_us);
    }
    if (finished_ < static_cast<long>(total_ops_)) return Deadlock();
    Collect();
    if (!std::isfinite(timeline_.makespan_us)) return Overflow();
    return std::move(timeline_);
  }

 private:
  Status Setup() {
    int base = 0;
    for (int rank : ranks_) {
      SimRank s;
      s.rank = rank;
      s.role = p_.RoleOfRank(rank);
      const Role& role = p_.roles[s.role];
      const int gi = p_.GraphIndex(role.graph);
      s.graph = &p_.graphs[gi];
      s.index = &indexes_[gi];
      const RoleSchedule* rs = sched_.ForRole(role.name);
      if (!rs) return Status::Error("schedule has no entry for role '" + role.name + "'");
      s.order.assign(s.graph->streams.size(), {});
      s.stream_of.assign(s.graph->ops.size(), kNone);
      for (const auto& so : rs->streams) {
        auto it = std::find(s.graph->streams.begin(), s.graph->streams.end(), so.stream);
        if (it == s.graph->streams.end()) return Status::Error("schedule uses unknown stream '" + so.stream + "'");
        int si = static_cast<int>(it - s.graph->streams.begin());
        for (int id : so.op_ids) {
          auto oit = s.index->op.find(id);
          if (oit == s.index->op.end()) return Status::Error("schedule lists unknown op id " + std::to_string(id));
          s.order[si].push_back(oit->second);
          s.stream_of[oit->second] = si;
        }
      }
      for (size_t i = 0; i < s.stream_of.size(); ++i)
        if (s.stream_of[i] == kNone)
          return Status::Error("role '" + role.name + "': " + OpLabel(s.graph->ops[i]) + " is not scheduled");
      s.base = base;
      base += static_cast<int>(s.graph->ops.size());
      sim_.push_back(std::move(s));
    }
    total_ops_ = base;
    gid_rank_.resize(total_ops_);
    duration_.resize(total_ops_);
    remaining_.assign(total_ops_, 0);
    rate_.assign(total_ops_, 1.0);
    last_update_.assign(total_ops_, 0);
    start_.assign(total_ops_, -1);
    end_.assign(total_ops_, -1);
    pending_.resize(total_ops_);
    cause_.assign(total_ops_, kNone);
    rv_.assign(total_ops_, kNone);
    version_.assign(total_ops_, 0);
    arrived_.assign(total_ops_, 0);
    load_.assign(total_ops_, {});
    arrive_us_.assign(total_ops_, 0);
    arrive_compute_us_.assign(total_ops_, 0);
    for (size_t sr = 0; sr < sim_.size(); ++sr) {
      const SimRank& s = sim_[sr];
      PriceContext ctx{*s.graph, *s.index, p_.mesh, s.rank};
      for (size_t i = 0; i < s.graph->ops.size(); ++i) {
        int gid = s.base + static_cast<int>(i);
        gid_rank_[gid] = static_cast<int>(sr);
        const PricedOp priced = cost_.Price(s.graph->ops[i], ctx);
        const double d = priced.duration_us;
        assert(std::isfinite(d) && d >= 0 && "cost model returned a bad duration");
        duration_[gid] = d;
        load_[gid] = priced.load;
        pending_[gid] = static_cast<int>(s.index->preds[i].size());
      }
      heads_.push_back(std::vector<size_t>(s.order.size(), 0));
      stream_last_.push_back(std::vector<int>(s.order.size(), kNone));
      running_compute_.push_back({});
      comm_inflight_.push_back(0);
    }
    compute_done_us_.assign(sim_.size(), 0);
    sync_compute_us_.assign(sim_.size(), 0);
    if (corun_ > 0 || corun_memory_ > 0) SetupCorun();
    return Status::Ok();
  }

  /// Co-running: for each simulated rank, the simulated ranks that stand for
  /// the other devices of its node (with how many devices each stands for:
  /// a role's representative stands for all the role's ranks), and the
  /// reverse lists.
  void SetupCorun() {
    std::map<int, int> sim_of;  // real rank -> simulated rank standing for it
    for (size_t sr = 0; sr < sim_.size(); ++sr) sim_of[sim_[sr].rank] = static_cast<int>(sr);
    if (timeline_.representative)
      for (size_t sr = 0; sr < sim_.size(); ++sr)
        for (int r : p_.roles[sim_[sr].role].ranks) sim_of[r] = static_cast<int>(sr);
    const ClusterSpec& c = cost_.cluster();
    mates_.assign(sim_.size(), {});
    node_others_.assign(sim_.size(), 0);
    watchers_.assign(sim_.size(), {});
    for (size_t sr = 0; sr < sim_.size(); ++sr) {
      const int me = sim_[sr].rank, node = c.NodeOf(me);
      std::map<int, int> count;
      for (const auto& [r, s] : sim_of)
        if (r != me && c.NodeOf(r) == node) ++count[s];
      for (const auto& [s, n] : count) {
        mates_[sr].push_back({s, n});
        node_others_[sr] += n;
        if (s != static_cast<int>(sr)) watchers_[s].push_back(static_cast<int>(sr));
      }
    }
  }

  /// Matches collective instances (k-th collective on one group) and
  /// send/recv pairs (k-th message from src to dst with one tag).
  Status BuildRendezvous() {
    std::vector<int> sim_index(p_.mesh.NumRanks(), kNone);
    for (size_t sr = 0; sr < sim_.size(); ++sr) sim_index[sim_[sr].rank] = static_cast<int>(sr);
    std::map<std::pair<std::string, int>, int> coll_instance;
    std::map<std::tuple<int, int, int, int>, int> p2p_instance;
    for (size_t sr = 0; sr < sim_.size(); ++sr) {
      const SimRank& s = sim_[sr];
      std::map<std::string, int> coll_count;
      std::map<std::tuple<int, int, int>, int> p2p_count;
      std::map<std::string, std::string> group_cache;
      for (const auto& order : s.order) {
        for (int i : order) {
          const Op& op = s.graph->ops[i];
          const int gid = s.base + i;
          if (op.kind == OpKind::kCollective) {
            const std::string spec = GroupSpecKey(op.group);
            auto cit = group_cache.find(spec);
            if (cit == group_cache.end()) {
              std::vector<int> members;
              for (int m : GroupRanks(p_.mesh, op.group, s.rank))
                if (sim_index[m] != kNone) members.push_back(m);
              cit = group_cache.emplace(spec, Key(members)).first;
              group_size_[cit->second] = static_cast<int>(members.size());
            }
            int k = coll_count[cit->second]++;
            auto [it, inserted] = coll_instance.emplace(std::make_pair(cit->second, k), static_cast<int>(rvs_.size()));
            if (inserted) rvs_.push_back({group_size_[cit->second], 0, {}, kNone, false});
            rv_[gid] = it->second;
            rvs_[it->second].members.push_back(gid);
          } else if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv) {
            int peer = PeerRank(p_.mesh, op.peer, s.rank);
            if (peer < 0 || sim_index[peer] == kNone)
              return Status::Error("rank " + std::to_string(s.rank) + ": " + OpLabel(op) + " has no peer rank");
            int src = op.kind == OpKind::kSend ? s.rank : peer;
            int dst = op.kind == OpKind::kSend ? peer : s.rank;
            int k = p2p_count[{src, dst, op.tag}]++;
            auto [it, inserted] = p2p_instance.emplace(std::make_tuple(src, dst, op.tag, k), static_cast<int>(rvs_.size()));
            if (inserted) rvs_.push_back({2, 0, {}, kNone, false});
            rv_[gid] = it->second;
            rvs_[it->second].members.push_back(gid);
          }
        }
      }
    }
    for (const auto& rv : rvs_) CONCERTO_RETURN_IF_ERROR(CheckInstance(rv));
    flows_.assign(rvs_.size(), {});
    return Status::Ok();
  }

  /// Members of one collective instance must agree on what they do.
  Status CheckInstance(const Rendezvous& rv) {
    if (rv.members.size() < 2) return Status::Ok();
    const Op& a = OpOf(rv.members[0]);
    for (size_t k = 1; k < rv.members.size(); ++k) {
      const int gid = rv.members[k];
      const Op& b = OpOf(gid);
      bool same = a.kind == OpKind::kCollective
                      ? b.collective == a.collective && b.message_bytes == a.message_bytes
                      : b.kind != a.kind && b.message_bytes == a.message_bytes;
      if (!same)
        return Status::Error("mismatched communication: rank " + std::to_string(RankOf(rv.members[0])) + " " +
                             OpLabel(a) + " meets rank " + std::to_string(RankOf(gid)) + " " + OpLabel(b) +
                             " (different type or size); a real run would hang or corrupt data");
    }
    return Status::Ok();
  }

  const Op& OpOf(int gid) const {
    const SimRank& s = sim_[gid_rank_[gid]];
    return s.graph->ops[gid - s.base];
  }
  int RankOf(int gid) const { return sim_[gid_rank_[gid]].rank; }

  /// Starts the head op of a stream if its stream is free and inputs are ready.
  void TryStart(int sr, int s) {
    SimRank& r = sim_[sr];
    size_t& head = heads_[sr][s];
    if (head >= r.order[s].size()) return;
    if (stream_busy(sr, s)) return;
    int i = r.order[s][head];
    int gid = r.base + i;
    if (pending_[gid] > 0 || start_[gid] >= 0 || arrived_[gid]) return;
    const Op& op = r.graph->ops[i];
    cause_[gid] = LocalCause(sr, gid, s);
    if (op.IsComm()) {
      Arrive(gid);
    } else {
      StartCompute(sr, gid);
    }
  }

  bool stream_busy(int sr, int s) const { return stream_last_[sr][s] != kNone && end_[stream_last_[sr][s]] < 0; }

  /// The latest-finishing predecessor or stream predecessor of an op.
  int LocalCause(int sr, int gid, int s) const {
    const SimRank& r = sim_[sr];
    int best = stream_last_[sr][s];
    double best_t = best == kNone ? -1 : end_[best];
    for (int p : r.index->preds[gid - r.base]) {
      int pg = r.base + p;
      if (end_[pg] > best_t) best = pg, best_t = end_[pg];
    }
    return best;
  }

  void Arrive(int gid) {
    Rendezvous& rv = rvs_[rv_[gid]];
    arrived_[gid] = 1;
    rv.arrived++;
    rv.last_gid = gid;
    int sr = gid_rank_[gid];
    arrive_us_[gid] = now_;
    arrive_compute_us_[gid] = compute_done_us_[sr] - sync_compute_us_[sr];
    int& last = stream_last_[sr][sim_[sr].stream_of[gid - sim_[sr].base]];
    // Its stream's thread idled before it (nothing ran on the stream up to
    // now): a hold applies (ClusterSpec::comm_corun_hold_us).
    rv.cold = last == kNone || end_[last] < now_;
    last = gid;  // blocks the stream
    if (rv.arrived < rv.expected) return;
    const int id = rv_[gid];
    const double last_us = jitter_ > 0 ? LastArrivalUs(id) : now_;
    if (last_us > now_) {
      queue_.push({last_us, seq_++, id, 0, kLastArrival});
      return;
    }
    StartRendezvous(id);
  }

  /// When the last member of rendezvous `id` is expected to arrive
  /// (ClusterSpec::compute_jitter): each member's arrival varies by jitter x
  /// its rank's compute since its last rendezvous (a representative stands
  /// for its role's ranks in the group); the expected maximum
  /// (ExpectedLastArrival), at least now.
  double LastArrivalUs(int id) const {
    const Rendezvous& rv = rvs_[id];
    std::vector<Arrival> arrivals;
    for (int m : rv.members)
      arrivals.push_back({arrive_us_[m], jitter_ * std::max(0.0, arrive_compute_us_[m]), StandsFor(m)});
    return std::max(now_, ExpectedLastArrival(arrivals));
  }

  /// How many ranks of member `gid`'s rendezvous its simulated rank stands
  /// for: 1, or with one representative per role its role's ranks in the
  /// collective's group.
  int StandsFor(int gid) const {
    const Op& op = OpOf(gid);
    if (!timeline_.representative || op.kind != OpKind::kCollective) return 1;
    const SimRank& s = sim_[gid_rank_[gid]];
    int n = 0;
    for (int r : GroupRanks(p_.mesh, op.group, s.rank)) n += p_.RoleOfRank(r) == s.role;
    return std::max(1, n);
  }

  /// Every member of rendezvous `id` has arrived: its members start (each
  /// rank's compute since its last rendezvous counts from here) and its
  /// transfer begins, or its co-run wait and hold first (the hold when the
  /// last member's stream idled before it: Rendezvous::cold).
  void StartRendezvous(int id) {
    const Rendezvous& rv = rvs_[id];
    const int gid = rv.last_gid;
    double dur = 0;
    int longest = rv.members.front();
    for (int m : rv.members)
      if (duration_[m] > dur) dur = duration_[m], longest = m;
    for (int m : rv.members) {
      if (m != gid) cause_[m] = gid;  // waited for the last arrival
      start_[m] = now_;
      int msr = gid_rank_[m];
      sync_compute_us_[msr] = compute_done_us_[msr];
      CommInflightChange(msr, +1);
    }
    if (comm_corun_latency_us_ > 0 && AnyComputing(rv)) {
      // Its completion waits for a core: it ends no earlier than
      // comm_corun_latency_us from now or its ranks' compute stopping,
      // whichever comes first; its bytes move meanwhile, except in its
      // first comm_corun_hold_us (or until they stop computing) when the
      // last member's stream thread idled before it (a thread that goes
      // straight on from the previous op keeps its core).
      Flow& f = flows_[id];
      f.waiting = true;
      waiting_.push_back(id);
      queue_.push({now_ + comm_corun_latency_us_, seq_++, id, f.wait_version, kWaitEnd});
      f.held_us = 0;
      if (comm_hold_us_ > 0 && rv.cold) {
        f.held = true;
        f.held_dur_us = dur;
        f.held_longest = longest;
        queue_.push({now_ + comm_hold_us_, seq_++, id, f.wait_version, kHoldEnd});
        return;
      }
    }
    BeginTransfer(id, dur, longest);
  }

  /// A held transfer (ClusterSpec::comm_corun_hold_us) starts: its hold
  /// passed, or its ranks stopped computing.
  void EndHold(int id) {
    Flow& f = flows_[id];
    if (!f.held) return;
    f.held = false;
    f.held_us = now_ - start_[rvs_[id].members.front()];
    BeginTransfer(id, f.held_dur_us, f.held_longest);
  }

  /// A rendezvous whose members have all arrived starts its transfer (its
  /// co-run wait, if any, runs beside it): it ends after `dur`, or over
  /// shared links its latency first, then its transfer at the rate its links
  /// give it.
  void BeginTransfer(int id, double dur, int longest) {
    const Rendezvous& rv = rvs_[id];
    const LinkLoad& load = load_[longest];
    if (!share_links_ || !load.Any() || dur <= load.latency_us) {
      queue_.push({now_ + dur, seq_++, id, 0, kTransferEnd});
      return;
    }
    Flow& f = flows_[id];
    f.left_us = dur - load.latency_us;
    f.demand = Demand(rv, load);
    if (load.latency_us > 0) {
      queue_.push({now_ + load.latency_us, seq_++, id, f.version, kFlowJoin});
    } else {
      FlowEvent(id, kFlowJoin, now_);
    }
  }

  bool AnyComputing(const Rendezvous& rv) const {
    for (int m : rv.members)
      if (!running_compute_[gid_rank_[m]].empty()) return true;
    return false;
  }

  /// A rendezvous's transfer ended: its members finish, unless its co-run
  /// wait is still on (then they finish when it ends).
  void TransferDone(int id) {
    Flow& f = flows_[id];
    if (f.waiting) {
      f.transfer_done = true;
      return;
    }
    for (int m : rvs_[id].members) Finish(m, now_);
  }

  /// A rendezvous's co-run wait ends (its time passed, or its ranks stopped
  /// computing): if its transfer is done, its members finish now.
  void EndWait(int id) {
    Flow& f = flows_[id];
    ++f.wait_version;  // the other way of ending the wait (and its hold) is void
    f.waiting = false;
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
    EndHold(id);
    if (f.transfer_done) TransferDone(id);
  }

  /// After rank `sr` stopped computing (its next kernels, if any, started):
  /// the waiting rendezvous none of whose ranks computes any more end their wait.
  void WakeWaiting() {
    std::vector<int> ready;
    for (int id : waiting_)
      if (!AnyComputing(rvs_[id])) ready.push_back(id);
    for (int id : ready) EndWait(id);
  }

  /// The links a rendezvous's transfer loads: a collective both directions
  /// of each member's links; a send/recv pair the sender's outgoing and the
  /// receiver's incoming direction. On a bus the intra-node part loads its
  /// node's one medium instead, once per node: the transfer at its price
  /// fills it (a ring of k ranks is priced at B / k each).
  std::vector<std::pair<int, double>> Demand(const Rendezvous& rv, const LinkLoad& load) const {
    std::vector<std::pair<int, double>> d;
    auto add = [&](int sr, int slot, double x) {
      if (x > 0) d.push_back({sr * kLinkSlots + slot, x});
    };
    std::set<int> bus_nodes;
    for (int m : rv.members) {
      const int sr = gid_rank_[m];
      const OpKind kind = OpOf(m).kind;
      const bool tx = kind != OpKind::kRecv, rx = kind != OpKind::kSend;
      if (bus_) bus_nodes.insert(cost_.cluster().NodeOf(sim_[sr].rank));
      if (tx) add(sr, kInterTx, load.inter), bus_ ? void() : add(sr, kIntraTx, load.intra);
      if (rx) add(sr, kInterRx, load.inter), bus_ ? void() : add(sr, kIntraRx, load.intra);
    }
    const int bus_base = static_cast<int>(sim_.size()) * kLinkSlots;
    if (load.intra > 0)
      for (int node : bus_nodes) d.push_back({bus_base + node, load.intra});
    return d;
  }

  /// A transfer joins its links (its latency is over) or ends.
  void FlowEvent(int id, int what, double t) {
    now_ = t;
    Flow& f = flows_[id];
    if (what == kFlowJoin) {
      f.fresh = true;
      f.rate = 1;
      f.last_us = now_;
      f.left_us -= std::min(f.left_us, BurstCredit(f));
      for (const auto& [link, x] : f.demand) ++link_flows_[link];
      active_flows_.push_back(id);
      ShareLinks();
      return;
    }
    for (const auto& [link, x] : f.demand)
      if (--link_flows_[link] == 0) link_idle_since_[link] = now_;
    active_flows_.erase(std::find(active_flows_.begin(), active_flows_.end(), id));
    ShareLinks();
    for (int m : rvs_[id].members)
      timeline_.link_sharing_delay_us += std::max(0.0, now_ - start_[m] - f.held_us - duration_[m]);
    TransferDone(id);
  }

  /// Max-min fair rates of the transfers in flight (progressive filling: all
  /// unfrozen transfers rise together until a link is full or they reach
  /// their priced speed; those crossing a full link keep that rate), then
  /// re-times every transfer whose rate changed.
  void ShareLinks() {
    std::vector<double> rate(active_flows_.size(), 0);
    std::vector<char> frozen(active_flows_.size(), 0);
    std::vector<double> cap(active_flows_.size(), 1);  // the transfer's own top speed (FlowCap)
    for (size_t k = 0; k < active_flows_.size(); ++k) cap[k] = FlowCap(active_flows_[k]);
    std::map<int, double> used;  // link -> capacity taken by frozen transfers
    size_t left = active_flows_.size();
    while (left > 0) {
      std::map<int, double> want;  // link -> demand of unfrozen transfers at rate 1
      double level = 1;
      for (size_t k = 0; k < active_flows_.size(); ++k)
        if (!frozen[k]) {
          level = std::min(level, cap[k]);
          for (const auto& [link, x] : flows_[active_flows_[k]].demand) want[link] += x;
        }
      for (const auto& [link, x] : want) level = std::min(level, std::max(0.0, 1 - used[link]) / x);
      std::set<int> full;
      for (const auto& [link, x] : want)
        if (std::max(0.0, 1 - used[link]) / x <= level * (1 + 1e-12)) full.insert(link);
      for (size_t k = 0; k < active_flows_.size(); ++k) {
        if (frozen[k]) continue;
        bool stop = level >= cap[k] * (1 - 1e-12);
        for (const auto& [link, x] : flows_[active_flows_[k]].demand) stop = stop || full.count(link);
        if (!stop) continue;
        frozen[k] = 1;
        rate[k] = level;
        --left;
        for (const auto& [link, x] : flows_[active_flows_[k]].demand) used[link] += level * x;
      }
    }
    for (size_t k = 0; k < active_flows_.size(); ++k) {
      Flow& f = flows_[active_flows_[k]];
      const double r = std::max(rate[k], 1e-9);
      if (!f.fresh && r == f.rate) continue;  // its end event stands
      f.left_us = std::max(0.0, f.left_us - (now_ - f.last_us) * f.rate);
      f.last_us = now_;
      f.rate = r;
      f.fresh = false;
      ++f.version;
      queue_.push({now_ + f.left_us / f.rate, seq_++, active_flows_[k], f.version, kFlowEnd});
    }
  }

  /// The transfer time a flow joining its links now saves because they idled
  /// (ClusterSpec::link_burst_us: a token bucket refilled at the link's rate,
  /// so idle time t buys min(t, burst) of transfer); 0 when one of them
  /// carries a transfer.
  double BurstCredit(const Flow& f) const {
    if (link_burst_us_ <= 0 || f.demand.empty()) return 0;
    double idle_us = link_burst_us_;
    for (const auto& [link, x] : f.demand) {
      if (auto n = link_flows_.find(link); n != link_flows_.end() && n->second > 0) return 0;
      if (auto it = link_idle_since_.find(link); it != link_idle_since_.end())
        idle_us = std::min(idle_us, now_ - it->second);
    }
    return std::max(0.0, idle_us);
  }

  /// A transfer's top speed: 1 (its price), or 1 / (1 + c) while one of its
  /// ranks computes (ClusterSpec::comm_corun_slowdown: its progress needs
  /// the cores the compute takes).
  double FlowCap(int id) const {
    return comm_corun_ > 0 && AnyComputing(rvs_[id]) ? 1 / (1 + comm_corun_) : 1;
  }

  /// Compute speed on a rank with `n` communication ops in flight: the
  /// first slows compute by f, each further one by growth x f more.
  double ComputeRate(int n) const {
    if (n <= 0 || interference_ <= 0) return 1.0;
    return 1.0 / (1.0 + interference_ * (1.0 + growth_ * (n - 1)));
  }

  /// Compute speed of op `gid` on simulated rank `sr`: interference from the
  /// rank's collectives in flight, and the co-run slowdown s x (share of its
  /// node's other devices computing now), s of the op's kernel class
  /// (ClusterSpec::corun_slowdown; streaming kernels and copies
  /// corun_slowdown_memory).
  double RankRate(int sr, int gid) const {
    double rate = ComputeRate(comm_inflight_[sr]);
    const Op& op = OpOf(gid);
    const bool memory = op.kind == OpKind::kCopy || (op.kind == OpKind::kCompute &&
                                                      OpInfo(op.compute_type).kernel_class == KernelClass::kStreaming);
    const double s = memory ? corun_memory_ : corun_;
    if (s > 0 && node_others_[sr] > 0) {
      int computing = 0;
      for (const auto& [m, n] : mates_[sr])
        if (m == sr || !running_compute_[m].empty()) computing += n;
      rate /= 1.0 + s * computing / node_others_[sr];
    }
    return rate;
  }

  /// Re-times `sr`'s running compute ops whose speed RankRate changed.
  void Retime(int sr) {
    for (int gid : running_compute_[sr]) {
      const double new_rate = RankRate(sr, gid);
      if (rate_[gid] == new_rate) continue;
      remaining_[gid] -= (now_ - last_update_[gid]) * rate_[gid];
      remaining_[gid] = std::max(0.0, remaining_[gid]);
      rate_[gid] = new_rate;
      last_update_[gid] = now_;
      ++version_[gid];
      Push(gid, now_ + remaining_[gid] / rate_[gid]);
    }
  }

  /// Co-running: `sr` started or stopped computing; its node-mates' compute
  /// speeds change.
  void ComputingChange(int sr) {
    if (comm_corun_ > 0 && !active_flows_.empty()) ShareLinks();  // FlowCap changed
    if (corun_ <= 0 && corun_memory_ <= 0) return;
    for (int w : watchers_[sr]) Retime(w);
  }

  void StartCompute(int sr, int gid) {
    start_[gid] = now_;
    stream_last_[sr][sim_[sr].stream_of[gid - sim_[sr].base]] = gid;
    remaining_[gid] = duration_[gid];
    running_compute_[sr].push_back(gid);
    rate_[gid] = RankRate(sr, gid);
    last_update_[gid] = now_;
    Push(gid, now_ + remaining_[gid] / rate_[gid]);
    if (running_compute_[sr].size() == 1) ComputingChange(sr);
  }

  /// Interference: when a rank's in-flight comm count changes the compute
  /// speed (RankRate), running compute ops are re-timed.
  void CommInflightChange(int sr, int delta) {
    int before = comm_inflight_[sr];
    comm_inflight_[sr] += delta;
    if (ComputeRate(comm_inflight_[sr]) == ComputeRate(before)) return;
    Retime(sr);
  }

  void Push(int gid, double t) { queue_.push({t, seq_++, gid, version_[gid]}); }

  void Finish(int gid, double t) {
    now_ = t;
    end_[gid] = t;
    ++finished_;
    int sr = gid_rank_[gid];
    SimRank& r = sim_[sr];
    int i = gid - r.base;
    const Op& op = r.graph->ops[i];
    if (op.IsComm()) {
      CommInflightChange(sr, -1);
    } else {
      auto& run = running_compute_[sr];
      run.erase(std::find(run.begin(), run.end(), gid));
      compute_done_us_[sr] += t - start_[gid];
      if (run.empty()) ComputingChange(sr);
    }
    int s = r.stream_of[i];
    heads_[sr][s]++;
    std::vector<int> touched = {s};
    for (int succ : r.index->succs[i]) {
      if (--pending_[r.base + succ] == 0) touched.push_back(r.stream_of[succ]);
    }
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (int ts : touched) TryStart(sr, ts);
    // Back-to-back kernels keep the cores: only a rank idle after its
    // successors started frees one for the waiting messages.
    if (!op.IsComm() && !waiting_.empty() && running_compute_[sr].empty()) WakeWaiting();
  }

  /// Durations each finite can add up past what a double holds: say so
  /// (naming the longest op) instead of reporting an infinite iteration.
  Status Overflow() const {
    int longest = 0;
    for (int gid = 1; gid < static_cast<int>(total_ops_); ++gid)
      if (duration_[gid] > duration_[longest]) longest = gid;
    return Status::Error("the simulated iteration overflows (its time is not a finite number of microseconds); the "
                         "longest op is rank " + std::to_string(RankOf(longest)) + " " + OpLabel(OpOf(longest)) +
                         " at " + std::to_string(duration_[longest]) + " us: check the program's durations");
  }

  Status Deadlock() {
    std::string msg = "deadlock: the run stops at " + std::to_string(now_) + " us with " +
                      std::to_string(total_ops_ - finished_) + " ops unfinished; stuck:";
    int shown = 0;
    for (size_t sr = 0; sr < sim_.size() && shown < 6; ++sr) {
      const SimRank& r = sim_[sr];
      for (size_t s = 0; s < r.order.size() && shown < 6; ++s) {
        if (heads_[sr][s] >= r.order[s].size()) continue;
        int i = r.order[s][heads_[sr][s]];
        int gid = r.base + i;
        const Op& op = r.graph->ops[i];
        msg += "\n  rank " + std::to_string(r.rank) + " stream '" + r.graph->streams[s] + "': " + OpLabel(op);
        if (arrived_[gid]) {
          const Rendezvous& rv = rvs_[rv_[gid]];
          msg += " waits for its peers (" + std::to_string(rv.arrived) + " of " + std::to_string(rv.expected) +
                 " arrived)";
          std::vector<int> in;
          for (int m : rv.members)
            if (!arrived_[m]) in.push_back(m);
          for (int m : in) msg += "; rank " + std::to_string(RankOf(m)) + " has " + OpLabel(OpOf(m)) + " not yet issued";
          if (static_cast<int>(rv.members.size()) < rv.expected) msg += "; a member never issues this collective";
        } else if (pending_[gid] > 0) {
          msg += " waits for " + std::to_string(pending_[gid]) + " unfinished inputs";
        }
        ++shown;
      }
    }
    return Status::Error(msg);
  }

  void Collect() {
    timeline_.records.reserve(total_ops_);
    std::vector<int> record_of(total_ops_);
    for (size_t sr = 0; sr < sim_.size(); ++sr) {
      const SimRank& r = sim_[sr];
      std::vector<double> busy(r.graph->streams.size(), 0);
      for (size_t i = 0; i < r.graph->ops.size(); ++i) {
        int gid = r.base + static_cast<int>(i);
        record_of[gid] = static_cast<int>(timeline_.records.size());
        timeline_.records.push_back({r.rank, static_cast<int>(i), r.stream_of[i], start_[gid], end_[gid]});
        busy[r.stream_of[i]] += end_[gid] - start_[gid];
        timeline_.makespan_us = std::max(timeline_.makespan_us, end_[gid]);
      }
      for (size_t s = 0; s < busy.size(); ++s) timeline_.busy.push_back({r.rank, r.graph->streams[s], busy[s]});
    }
    // Critical path: from the last op to finish, follow what each op waited for.
    int last = kNone;
    for (int gid = 0; gid < static_cast<int>(total_ops_); ++gid)
      if (last == kNone || end_[gid] > end_[last]) last = gid;
    std::vector<int> path;
    std::vector<char> seen(total_ops_, 0);
    for (int g = last; g != kNone && !seen[g]; g = cause_[g]) {
      seen[g] = 1;
      path.push_back(record_of[g]);
    }
    std::reverse(path.begin(), path.end());
    timeline_.critical_path = std::move(path);
  }

  const Program& p_;
  const Schedule& sched_;
  const CostModel& cost_;
  double interference_ = 0;
  double growth_ = 0;
  bool share_links_ = false;
  std::vector<LinkLoad> load_;     // per op: its links' load (comm ops)
  std::vector<Flow> flows_;        // per rendezvous: its transfer over shared links
  std::vector<int> active_flows_;  // rendezvous ids whose transfer is on its links
  std::map<int, int> link_flows_;          // global link id -> transfers on it now
  std::map<int, double> link_idle_since_;  // global link id -> when its last transfer ended (absent: never used)
  double link_burst_us_ = 0;               // ClusterSpec::link_burst_us
  double comm_hold_us_ = 0;                // ClusterSpec::comm_corun_hold_us (at most the wait)
  double jitter_ = 0;                      // ClusterSpec::compute_jitter
  std::vector<double> arrive_us_;          // per comm op: when it arrived at its rendezvous
  std::vector<double> arrive_compute_us_;  // per comm op: its rank's compute since its last rendezvous then
  std::vector<double> compute_done_us_;    // per simulated rank: compute time finished so far
  std::vector<double> sync_compute_us_;    // per simulated rank: compute_done_us_ at its last rendezvous
  const std::vector<GraphIndex>& indexes_;  // one per graph of p_
  std::vector<int> ranks_;
  std::vector<SimRank> sim_;
  size_t total_ops_ = 0;
  std::vector<int> gid_rank_;
  std::vector<double> duration_, remaining_, rate_, last_update_, start_, end_;
  std::vector<int> pending_, cause_, rv_, version_;
  std::vector<Rendezvous> rvs_;
  std::map<std::string, int> group_size_;
  std::vector<char> arrived_;
  std::vector<std::vector<size_t>> heads_;
  std::vector<std::vector<int>> stream_last_;
  std::vector<std::vector<int>> running_compute_;
  std::vector<int> comm_inflight_;
  double corun_ = 0;                                   // ClusterSpec::corun_slowdown
  double corun_memory_ = 0;                            // ClusterSpec::CorunSlowdownMemory()
  double comm_corun_ = 0;                              // ClusterSpec::comm_corun_slowdown
  double comm_corun_latency_us_ = 0;                   // ClusterSpec::comm_corun_latency_us
  std::vector<int> waiting_;                           // rendezvous in their co-run wait
  bool bus_ = false;                                   // TopologySpec::IsBus(): one link per node
  std::vector<std::vector<std::pair<int, int>>> mates_;  // per simulated rank: (simulated rank, devices it stands for)
  std::vector<int> node_others_;                       // per simulated rank: other devices on its node
  std::vector<std::vector<int>> watchers_;             // per simulated rank: ranks whose mates_ hold it
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> queue_;
  long seq_ = 0;
  long finished_ = 0;
  double now_ = 0;
  Timeline timeline_;
};

}  // namespace

Result<Timeline> Simulate(const ScheduledProgram& sp, const CostModel& cost, const SimOptions& options) {
  std::vector<GraphIndex> indexes;
  indexes.reserve(sp.program.graphs.size());
  for (const Graph& g : sp.program.graphs) indexes.push_back(GraphIndex::Build(g));
  return Simulate(sp, cost, options, indexes);
}

Result<Timeline> Simulate(const ScheduledProgram& sp, const CostModel& cost, const SimOptions& options,
                          const std::vector<GraphIndex>& indexes) {
  Simulator sim(sp, cost, options, indexes);
  return sim.Run();
}

const std::vector<OptionRecord<SimOptions>>& SimOptionRecords() {
  static const std::vector<OptionRecord<SimOptions>> records = {
      {"interference", "fraction", -1, 10,
       "compute slowdown while a collective is in flight (0.2 = 20% slower); -1 takes the cluster's value",
       &SimOptions::interference},
      {"share-links", "0/1", -1, 1,
       "1: transfers in flight together share each link max-min fairly; 0: every transfer at its price "
       "(the model without link contention); default -1 takes the cluster's topology.share_links",
       &SimOptions::share_links},
  };
  return records;
}

}  // namespace concerto
