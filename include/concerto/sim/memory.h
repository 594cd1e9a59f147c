// Memory held by a rank over a timeline: a tensor occupies memory from its
// producer's start until its last consumer ends. Graph inputs (parameters,
// data, optimizer state) are held from time 0, tensors nothing consumes
// until the end of the step.
#pragma once

#include <cstdint>

#include "concerto/ir/graph_index.h"
#include "concerto/ir/ir.h"
#include "concerto/sim/simulator.h"

namespace concerto {

struct MemoryPeak {
  int64_t peak_bytes = 0;
  int rank = 0;           // the simulated rank where the peak occurs
  double time_us = 0;     // when it first occurs
};

/// The largest peak over the simulated ranks of `timeline`.
MemoryPeak PeakMemory(const Program& program, const Timeline& timeline);

/// The same with the index of every graph already built (one per graph of
/// the program, in its order).
MemoryPeak PeakMemory(const Program& program, const Timeline& timeline, const std::vector<GraphIndex>& indexes);

}  // namespace concerto
