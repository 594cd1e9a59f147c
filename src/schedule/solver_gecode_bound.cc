// The propagation bound (schedule/propagation_bound.h): destructive lower
// bounding with Gecode. For a candidate makespan T the relaxation (unary
// streams, precedences, send/recv start together, every op inside [0, T]) is
// propagated; a failure proves that no schedule finishes by T.
//
// Validity. Times are integer ticks with durations, heads and tails rounded
// DOWN. Take any schedule the machine model allows, with real starts s and
// real durations d >= the nominal ones (interference and waits only delay),
// in ticks, and makespan M. Then floor(s) is a schedule of the tick model:
// precedence s_b >= s_a + d_a gives floor(s_b) >= floor(s_a) + floor(d_a) (the
// same for the two orders of a unary pair), equal starts stay equal (a send
// and its recv start together and both run for the longer of their
// durations: the simulator's rendezvous), and floor(s) + floor(d + tail) <=
// floor(M). So a T proven infeasible
// means floor(M) > T, i.e. M >= (T + 1) ticks.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include <gecode/int.hh>
#include <gecode/minimodel.hh>
#include <gecode/search.hh>
#pragma GCC diagnostic pop

#include "concerto/ir/graph_index.h"
#include "concerto/schedule/propagation_bound.h"
#include "concerto/sim/lower_bound.h"

namespace concerto {
namespace {

using Clock = std::chrono::steady_clock;

/// The plain bound is this many ticks: fine enough that rounding every
/// duration down loses little (at most one tick per op on a chain), coarse
/// enough that 8 x the bound plus a duration fits Gecode's 32-bit domains.
constexpr double kTicksPerPlainBound = double(1 << 25);
constexpr int64_t kMaxHorizonTicks = int64_t(1) << 28;

/// `us` in ticks, rounded down, with a hair of slack against the rounding of
/// the floating-point sums that produced `us`.
int64_t FloorTicks(double us, double tick_us) {
  const double x = us / tick_us;
  return x <= 0 ? 0 : static_cast<int64_t>(std::floor(x * (1 - 1e-12)));
}

/// The joined graph in ticks: durations, heads and tails (all rounded down),
/// precedences, equal starts and the positive-duration ops of each stream.
/// `after` is the nominal duration plus the tail (the tail counts from the
/// nominal end: a send or recv may run longer, its partner's tail is then
/// already in it), so start + after <= makespan.
struct TickModel {
  std::vector<int> dur, head, after;
  std::vector<std::pair<int, int>> edges;       // (a, b): b starts after a ends
  std::vector<std::pair<int, int>> same_start;  // a send and the recv it meets
  std::vector<std::vector<int>> streams;        // ops of positive duration per stream
  int64_t min_makespan = 0;                     // max of head + max(dur, after)
};

/// A send and the recv it meets run together for the longer of their two
/// durations (the simulator's rendezvous), so both get the max.
TickModel ToTicks(const JoinedGraph& j, const std::vector<double>& head, const std::vector<double>& tail,
                  double tick_us) {
  TickModel m;
  const size_t n = j.dur.size();
  const std::vector<int>& partner = j.partner;
  std::map<std::string, int> stream_index;
  for (size_t i = 0; i < n; ++i) {
    const double dur_us = partner[i] >= 0 ? std::max(j.dur[i], j.dur[partner[i]]) : j.dur[i];
    m.dur.push_back(static_cast<int>(FloorTicks(dur_us, tick_us)));
    m.head.push_back(static_cast<int>(FloorTicks(head[i], tick_us)));
    m.after.push_back(static_cast<int>(FloorTicks(j.dur[i] + tail[i], tick_us)));
    m.min_makespan = std::max<int64_t>(m.min_makespan, int64_t(m.head[i]) + std::max(m.dur[i], m.after[i]));
    for (int p : j.preds[i]) m.edges.push_back({p, static_cast<int>(i)});
    if (m.dur[i] == 0) continue;  // occupies no stream (a relaxation for ops under a tick)
    auto [it, added] = stream_index.emplace(j.stream[i], static_cast<int>(m.streams.size()));
    if (added) m.streams.emplace_back();
    m.streams[it->second].push_back(static_cast<int>(i));
  }
  for (size_t i = 0; i < n; ++i)
    if (partner[i] > static_cast<int>(i)) m.same_start.push_back({static_cast<int>(i), partner[i]});
  return m;
}

/// The relaxation with the makespan as a variable in [0, horizon]; a probe
/// clones it and caps the makespan.
class BoundSpace : public Gecode::Space {
 public:
  /// `edge_finding`: the unary resources run Gecode's full propagation
  /// (overload checking, time-tabling, detectable precedences,
  /// not-first/not-last, edge finding); without it only the first two.
  BoundSpace(const TickModel& m, int horizon, bool edge_finding, bool branch)
      : start_(*this, static_cast<int>(m.dur.size())), makespan_(*this, 0, horizon) {
    for (size_t i = 0; i < m.dur.size(); ++i) {
      const int after = std::max(m.dur[i], m.after[i]);
      start_[i] = Gecode::IntVar(*this, m.head[i], std::max(m.head[i], horizon - after));
      Gecode::rel(*this, start_[i] + after <= makespan_);
    }
    for (const auto& [a, b] : m.edges) Gecode::rel(*this, start_[a] + m.dur[a] <= start_[b]);
    for (const auto& [a, b] : m.same_start) Gecode::rel(*this, start_[a], Gecode::IRT_EQ, start_[b]);
    for (const auto& ops : m.streams) {
      if (ops.size() < 2) continue;
      Gecode::IntVarArgs s;
      Gecode::IntArgs p;
      for (int i : ops) s << start_[i], p << m.dur[i];
      Gecode::unary(*this, s, p, edge_finding ? Gecode::IPL_DEF : Gecode::IPL_BASIC);
    }
    if (branch) Gecode::branch(*this, start_, Gecode::INT_VAR_MIN_MIN(), Gecode::INT_VAL_MIN());
  }
  BoundSpace(BoundSpace& other) : Gecode::Space(other) {
    start_.update(*this, other.start_);
    makespan_.update(*this, other.makespan_);
  }
  /// Gecode's cloning hook.
  Gecode::Space* copy() override { return new BoundSpace(*this); }
  /// Caps the makespan at `t` ticks.
  void CapMakespan(int t) { Gecode::rel(*this, makespan_, Gecode::IRT_LQ, t); }

 private:
  Gecode::IntVarArray start_;
  Gecode::IntVar makespan_;
};

/// Stops a probe's search at its fail or wall-clock limit.
class ProbeStop : public Gecode::Search::Stop {
 public:
  ProbeStop(unsigned long ms, unsigned long fails) : time_(ms), fails_(fails) {}
  /// True once either limit is reached.
  bool stop(const Gecode::Search::Statistics& s, const Gecode::Search::Options& o) override {
    return fails_.stop(s, o) || time_.stop(s, o);
  }

 private:
  Gecode::Search::TimeStop time_;
  Gecode::Search::FailStop fails_;
};

/// True when no schedule of the tick model finishes by `t`: propagation
/// fails, or the fail-limited search exhausts without a solution.
bool ProvenInfeasible(const BoundSpace& root, int64_t t, const PropagationBoundOptions& options) {
  std::unique_ptr<BoundSpace> s(static_cast<BoundSpace*>(root.clone()));
  s->CapMakespan(static_cast<int>(t));
  if (s->status() == Gecode::SS_FAILED) return true;
  if (options.probe_fail_limit <= 0) return false;
  ProbeStop stop(static_cast<unsigned long>(std::max(1.0, options.probe_time_limit_s * 1e3)),
                 static_cast<unsigned long>(options.probe_fail_limit));
  Gecode::Search::Options o;
  o.threads = 1;
  o.stop = &stop;
  Gecode::DFS<BoundSpace> engine(s.get(), o);
  std::unique_ptr<BoundSpace> solution(engine.next());
  return !solution && !engine.stopped();
}

Status CheckOptions(const PropagationBoundOptions& o) {
  if (!(o.upper_bound_us >= 0)) return Status::Error("propagation bound: upper_bound_us must be >= 0");
  if (o.max_ops < 0) return Status::Error("propagation bound: max_ops must be >= 0");
  if (o.edge_finding_max_ops < 0) return Status::Error("propagation bound: edge_finding_max_ops must be >= 0");
  if (!(o.time_budget_s >= 0)) return Status::Error("propagation bound: time_budget_s must be >= 0");
  if (o.probe_fail_limit < 0) return Status::Error("propagation bound: probe_fail_limit must be >= 0");
  if (!(o.probe_time_limit_s > 0)) return Status::Error("propagation bound: probe_time_limit_s must be positive");
  if (!(o.relative_precision > 0 && o.relative_precision < 1))
    return Status::Error("propagation bound: relative_precision must be in (0, 1)");
  return Status::Ok();
}

/// Exponential steps up from `base`, then bisection, for the largest T in
/// (base, horizon] proven infeasible; returns it, or `proven` if none.
int64_t SearchLargestInfeasible(const BoundSpace& root, int64_t base, int64_t proven, int64_t horizon,
                                int64_t precision, const PropagationBoundOptions& options, Clock::time_point t0,
                                PropagationBound* out) {
  auto out_of_time = [&] {
    out->hit_time_budget = std::chrono::duration<double>(Clock::now() - t0).count() > options.time_budget_s;
    return out->hit_time_budget;
  };
  auto probe = [&](int64_t t) {
    ++out->probes;
    const bool infeasible = ProvenInfeasible(root, t, options);
    out->probes_infeasible += infeasible;
    return infeasible;
  };
  int64_t lo = base, hi = horizon + 1;  // hi: not proven infeasible (or past the horizon)
  for (int64_t step = precision; lo < horizon && !out_of_time(); step *= 2) {
    const int64_t t = std::min(lo + step, horizon);
    if (!probe(t)) {
      hi = t;
      break;
    }
    lo = proven = t;
  }
  while (hi - lo > precision && lo < horizon && !out_of_time()) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (probe(mid))
      lo = proven = mid;
    else
      hi = mid;
  }
  return proven;
}

/// Ops of the roles' representatives (the nodes of the joined graph).
int RepresentativeOps(const Program& program) {
  int ops = 0;
  for (const Role& role : program.roles)
    if (!role.ranks.empty()) ops += static_cast<int>(program.GraphOf(role).ops.size());
  return ops;
}

/// The cheap propagation first, then (programs of up to
/// edge_finding_max_ops) the full one from where the cheap one stopped; the
/// largest T proven infeasible (or `proven`). Gecode exceptions become errors.
Result<int64_t> ProbeInPhases(const TickModel& m, int64_t horizon, int64_t base, int64_t proven, int64_t precision,
                              const PropagationBoundOptions& options, Clock::time_point t0, PropagationBound* out) {
  try {
    for (const bool edge_finding : {false, true}) {
      if (edge_finding && out->ops > options.edge_finding_max_ops) break;
      out->edge_finding = edge_finding;
      BoundSpace root(m, static_cast<int>(horizon), edge_finding, options.probe_fail_limit > 0);
      ++out->probes;
      if (root.status() == Gecode::SS_FAILED) {
        ++out->probes_infeasible;
        return horizon;
      }
      proven = SearchLargestInfeasible(root, std::max(base, proven), proven, horizon, precision, options, t0, out);
      if (out->hit_time_budget) break;
    }
  } catch (const Gecode::Exception& e) {
    return Status::Error(std::string("propagation bound: gecode: ") + e.what());
  }
  return proven;
}

}  // namespace

Result<PropagationBound> ComputePropagationBound(const Program& program, const CostModel& cost,
                                                 const PropagationBoundOptions& options) {
  const auto t0 = Clock::now();
  CONCERTO_RETURN_IF_ERROR(CheckOptions(options));
  PropagationBound out;
  auto finish = [&] {
    out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return out;
  };
  out.ops = RepresentativeOps(program);
  if (out.ops > options.max_ops) {
    out.skipped = true;
    out.skip_reason = std::to_string(out.ops) + " ops, more than max_ops " + std::to_string(options.max_ops);
    return finish();
  }
  const JoinedGraph j = BuildJoinedGraph(program, cost);
  if (KahnOrder(j.preds, j.succs).size() != j.dur.size())
    return Status::Error("propagation bound: a role's graph has a cycle");
  std::vector<double> head, tail;
  out.plain_us = BoundOfJoinedGraph(j, static_cast<int>(program.roles.size()), &head, &tail).lower_bound_us;
  out.bound_us = out.plain_us;
  if (!(out.plain_us > 0)) {
    out.skipped = true;
    out.skip_reason = "the plain bound is 0 (no work)";
    return finish();
  }
  out.tick_us = out.plain_us / kTicksPerPlainBound;
  const TickModel m = ToTicks(j, head, tail, out.tick_us);
  const double upper_us = options.upper_bound_us > 0 ? options.upper_bound_us : 2 * out.plain_us;
  const int64_t horizon = std::clamp<int64_t>(
      static_cast<int64_t>(std::ceil(std::min(upper_us / out.tick_us, double(kMaxHorizonTicks)))), m.min_makespan,
      kMaxHorizonTicks);
  const int64_t precision = std::max<int64_t>(1, static_cast<int64_t>(options.relative_precision * kTicksPerPlainBound));
  // Below head + duration + tail of some op, nothing finishes: proven.
  const int64_t trivially_infeasible = m.min_makespan - 1;
  const int64_t base = std::max(trivially_infeasible, FloorTicks(out.plain_us, out.tick_us) - 1);
  Result<int64_t> proven = ProbeInPhases(m, horizon, base, trivially_infeasible, precision, options, t0, &out);
  if (!proven.ok()) return proven.status();
  out.bound_ticks = *proven + 1;
  out.bound_us = std::max(out.plain_us, static_cast<double>(out.bound_ticks) * out.tick_us * (1 - 1e-12));
  return finish();
}

}  // namespace concerto

