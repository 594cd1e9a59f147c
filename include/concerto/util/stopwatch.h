// Wall-clock seconds for progress messages and time budgets (never for a
// result: answers depend on work limits, not on the clock).
#pragma once

#include <chrono>

namespace concerto {

/// Seconds since `t0` (a steady_clock::now() taken earlier).
inline double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace concerto
