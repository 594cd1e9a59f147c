// Generated hard window problems with known shapes, for the solver tests and
// the hard-window table of docs/solvers.md (`concerto_quality --hard-windows`).
// Deterministic for a seed on every platform (std::mt19937 and our own
// shuffle; no std::uniform_*_distribution, whose results are unspecified).
#pragma once

#include <cstdint>

#include "concerto/schedule/window_solver.h"

namespace concerto {

/// A job shop in the style of Taillard's generator: `jobs` chains of
/// `machines` tasks, each chain visiting every machine once in a random
/// order, durations uniform in 1..99. Machines are the resources; no hint;
/// deadlines at the sum of all durations.
WindowProblem JobShopWindow(int jobs, int machines, uint32_t seed);

/// A project of `tasks` tasks on `resources` unary resources (each task on
/// one, uniform), durations uniform in 1..99, and each task after up to
/// `max_preds` earlier tasks (uniform count, uniform among the earlier
/// ones): the shape of the scheduler's windows, with more resources. No
/// hint; deadlines at the sum of all durations.
WindowProblem RandomUnaryWindow(int tasks, int resources, int max_preds, uint32_t seed);

}  // namespace concerto
