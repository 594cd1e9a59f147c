// A stronger lower bound on the makespan by destructive bounding: for a
// candidate makespan T, post the scheduling relaxation (the joined graph of
// sim/lower_bound.h: one unary resource per role/stream, data-edge
// precedences, a send and its recv start together, start >= 0, end <= T) and
// let constraint propagation try to prove it infeasible; the largest T proven
// infeasible plus one tick is the bound. Two phases: the unary resources'
// cheap propagation, then (small programs) Gecode's full one. The model lives
// in src/schedule/solver_gecode_bound.cc (Gecode is included only in
// src/schedule/solver_*.cc). docs/architecture.md, "Lower bound".
#pragma once

#include <cstdint>
#include <string>

#include "concerto/cost/cost_model.h"
#include "concerto/ir/ir.h"
#include "concerto/util/status.h"

namespace concerto {

struct PropagationBoundOptions {
  /// The top of the search (a known makespan, e.g. of the run being
  /// reported); 0 means 2 x the plain bound. Only proven infeasible T count,
  /// so a wrong value costs probes, never validity.
  double upper_bound_us = 0;
  /// Programs whose roles' representatives have more ops than this are
  /// skipped (with a reason): one probe's propagation cannot be interrupted.
  int max_ops = 50000;
  /// Every program is probed with the unary resources' cheap propagation
  /// (overload checking, time-tabling); programs up to this many ops then
  /// again with edge finding, detectable precedences and not-first/not-last
  /// (2 s a probe at 30k ops; docs/architecture.md, "Lower bound").
  int edge_finding_max_ops = 15000;
  /// Wall-clock budget for all probes, checked between probes (a single
  /// probe's propagation cannot be interrupted; `max_ops` bounds it).
  double time_budget_s = 2.0;
  /// Failed nodes a probe may search after propagation; a probe counts only
  /// when its search exhausts. 0: propagation only.
  int64_t probe_fail_limit = 0;
  /// Wall-clock limit of one probe's search (with probe_fail_limit > 0).
  double probe_time_limit_s = 0.1;
  /// Stop bisecting when the interval is below this fraction of the plain bound.
  double relative_precision = 1e-4;
};

struct PropagationBound {
  /// No schedule the machine model allows finishes earlier (us): the
  /// largest T proven infeasible plus one tick, or the plain bound when that
  /// is higher (nothing proven beyond it; skipped: the plain bound, or 0 when
  /// skipped before computing it).
  double bound_us = 0;
  /// ComputeLowerBound(program, cost) on the same graph, us.
  double plain_us = 0;
  double tick_us = 0;        // the time unit of the model
  int64_t bound_ticks = 0;   // largest T proven infeasible, plus one
  int ops = 0;               // ops of the roles' representatives (nodes of the joined graph)
  int probes = 0;            // candidate makespans tried
  int probes_infeasible = 0; // of which proven infeasible
  bool edge_finding = false; // the last phase used the full unary propagation
  double seconds = 0;
  bool hit_time_budget = false;
  bool skipped = false;
  std::string skip_reason;   // why (when skipped)
};

/// The propagation bound of `program` (data and control edges, as
/// ComputeLowerBound(program, cost)). Errors: bad options, or a model
/// Gecode rejects.
Result<PropagationBound> ComputePropagationBound(const Program& program, const CostModel& cost,
                                                 const PropagationBoundOptions& options);

}  // namespace concerto
