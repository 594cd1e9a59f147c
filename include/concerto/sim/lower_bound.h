// A lower bound on the makespan of any schedule of a program.
#pragma once

#include <string>

#include "concerto/cost/cost_model.h"

namespace concerto {

/// LB = max(critical path, busiest stream's total work, fill + work + drain
/// of one stream), from undelayed op durations on each role's lowest rank.
/// The graphs of all roles are joined where sends on one representative meet
/// recvs on another (a rendezvous: both start together; which send meets
/// which recv depends on the schedule, so only the earliest candidate
/// counts), so pipeline fill and drain count. With `control_deps` false only data edges count:
/// a relaxation, so still a bound, that ignores the ordering edges a
/// scheduler added.
struct LowerBound {
  /// Longest chain of durations through the joined graphs.
  double critical_path_us = 0;
  /// The largest total work of one stream.
  double stream_load_us = 0;
  std::string busiest_stream;
  /// Per stream and threshold h (an op's earliest start): h + the work of
  /// the stream's ops that cannot start before h + the smallest work that
  /// must follow one of them (the pipeline's fill and drain); the largest.
  double fill_drain_us = 0;
  std::string fill_drain_stream;
  int send_recv_pairs_joined = 0;  // send/recv pairs between representatives
  double lower_bound_us = 0;
};
LowerBound ComputeLowerBound(const Program& program, const CostModel& cost, bool control_deps = true);

}  // namespace concerto
