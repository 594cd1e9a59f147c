// Synthetic programs of any size, for benchmarks and property tests.
#pragma once

#include <cstdint>

#include "concerto/ir/ir.h"

namespace concerto {

struct SyntheticSpec {
  int num_ops = 1000;     // total ops in the graph
  int ranks = 8;          // one "dp" mesh axis of this size, one SPMD role
  int comm_every = 8;     // every N-th op is an all-reduce over "dp"
  int fan_in = 2;         // each compute op reads up to this many earlier tensors
  uint64_t seed = 1;
};

/// A random DAG shaped like a training step: a chain of compute ops (matmul
/// and elementwise, priced by flops/bytes) with extra edges to recent ops,
/// and all-reduces of recent results consumed a little later. Deterministic
/// in `seed`; valid under VerifyProgram.
Program SyntheticProgram(const SyntheticSpec& spec);

}  // namespace concerto
