// Memory held by a rank over a timeline: a tensor occupies memory from its
// producer's start until its last consumer ends. Graph inputs (parameters,
// data, optimizer state) are held from time 0, tensors nothing consumes
// until the end of the step.
#pragma once

#include <vector>
#include <utility>
#include <string>
#include <cstdint>

#include "concerto/ir/graph_index.h"
#include "concerto/ir/ir.h"
#include "concerto/sim/simulator.h"

namespace concerto {

/// A tensor live at a rank's peak.
struct LiveTensor {
  std::string name;
  int64_t bytes = 0;
  std::string producer;  // the op that writes it ("" for a graph input)
};

struct MemoryPeak {
  int64_t peak_bytes = 0;
  int rank = 0;           // the simulated rank where the peak occurs
  double time_us = 0;     // when it first occurs
  /// The op whose output, allocated when it started, reached the peak ("" when
  /// the peak is the graph inputs at time 0), and the largest tensors live
  /// then (at most 5, largest first).
  std::string op;
  std::vector<LiveTensor> top_live;
};

/// Live bytes of one simulated rank over time: (time, bytes from then on),
/// one point per time at which the amount changes.
struct MemoryCurve {
  int rank = 0;
  std::vector<std::pair<double, int64_t>> points;
};

/// The largest peak over the simulated ranks of `timeline`.
MemoryPeak PeakMemory(const Program& program, const Timeline& timeline);

/// The same with the index of every graph already built (one per graph of
/// the program, in its order).
MemoryPeak PeakMemory(const Program& program, const Timeline& timeline, const std::vector<GraphIndex>& indexes);

/// Every simulated rank's live bytes over the timeline (the same rule as
/// PeakMemory), for the trace's memory counter track.
std::vector<MemoryCurve> MemoryCurves(const Program& program, const Timeline& timeline);

}  // namespace concerto
