// Generated hard window problems (window_instances.h).
#include "concerto/schedule/window_instances.h"

#include <random>
#include <set>
#include <utility>
#include <vector>

namespace concerto {
namespace {

/// Uniform in [0, n) from the generator's raw output (portable).
int Below(std::mt19937& rng, int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); }

/// Deadlines at the total work: every task fits one after another.
void DeadlinesAtTotal(WindowProblem& p) {
  int64_t total = 0;
  for (const WindowTask& t : p.tasks) total += t.duration;
  for (WindowTask& t : p.tasks) t.deadline = total;
}

}  // namespace

WindowProblem JobShopWindow(int jobs, int machines, uint32_t seed) {
  std::mt19937 rng(seed);
  WindowProblem p;
  p.num_resources = machines;
  for (int j = 0; j < jobs; ++j) {
    std::vector<int> order(machines);
    for (int k = 0; k < machines; ++k) order[k] = k;
    for (int k = machines - 1; k > 0; --k) std::swap(order[k], order[Below(rng, k + 1)]);  // Fisher-Yates
    for (int k = 0; k < machines; ++k) {
      p.tasks.push_back({1 + Below(rng, 99), order[k], 0, 0, false});
      if (k > 0) p.precedences.push_back({j * machines + k - 1, j * machines + k});
    }
  }
  DeadlinesAtTotal(p);
  return p;
}

WindowProblem RandomUnaryWindow(int tasks, int resources, int max_preds, uint32_t seed) {
  std::mt19937 rng(seed);
  WindowProblem p;
  p.num_resources = resources;
  for (int i = 0; i < tasks; ++i) {
    p.tasks.push_back({1 + Below(rng, 99), Below(rng, resources), 0, 0, false});
    if (i == 0) continue;
    const int preds = Below(rng, max_preds + 1);
    std::set<int> chosen;
    for (int k = 0; k < preds; ++k) chosen.insert(Below(rng, i));
    for (int b : chosen) p.precedences.push_back({b, i});
  }
  DeadlinesAtTotal(p);
  return p;
}

}  // namespace concerto
