// The concerto search's window answers (window_solve_cache.h).
#include "window_solve_cache.h"

#include <cassert>
#include <chrono>
#include <exception>

namespace concerto::search {

const WindowSolution* WindowSolveCache::Find(const Place& place, const WindowProblem& problem) const {
  auto it = memo_.find(place);
  return it != memo_.end() && it->second.first == problem ? &it->second.second : nullptr;
}

void WindowSolveCache::Remember(const Place& place, const WindowProblem& problem, const WindowSolution& solution) {
  memo_[place] = {problem, solution};
}

bool SpeculationExecutor::Idle() const {
  return !run_.valid() || run_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

void SpeculationExecutor::Wait() {
  if (run_.valid()) run_.wait();
}

std::deque<Speculation> SpeculationExecutor::Start(std::vector<std::pair<int, WindowProblem>> problems,
                                                   const SolverOptions& options) {
  assert(enabled() && Idle() && "one batch at a time");
  std::deque<Speculation> ahead;
  if (problems.empty()) return ahead;
  auto batch = std::make_shared<std::vector<WindowProblem>>();
  auto answers = std::make_shared<std::vector<std::promise<Result<WindowSolution>>>>(problems.size());
  for (size_t i = 0; i < problems.size(); ++i) {
    ahead.push_back({problems[i].first, problems[i].second, (*answers)[i].get_future().share()});
    batch->push_back(std::move(problems[i].second));
  }
  run_ = std::async(std::launch::async, [solver = solver_.get(), batch, answers, options] {
    for (size_t i = 0; i < batch->size(); ++i) {
      try {
        (*answers)[i].set_value(solver->Solve((*batch)[i], options));
      } catch (...) {
        (*answers)[i].set_exception(std::current_exception());
      }
    }
  });
  return ahead;
}

}  // namespace concerto::search
