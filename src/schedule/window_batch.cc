// Batches of window solves on local threads or remote workers (window_batch.h).
#include "concerto/schedule/window_batch.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace concerto {
namespace {

using nlohmann::json;

// ---- Wire format: one CBOR map per message ----

json ProblemJson(const WindowProblem& p) {
  json tasks = json::array();
  for (const WindowTask& t : p.tasks) tasks.push_back({t.duration, t.resource, t.release, t.deadline, t.is_comm});
  json precedences = json::array();
  for (const auto& [a, b] : p.precedences) precedences.push_back({a, b});
  json buffers = json::array();
  for (const WindowBuffer& b : p.buffers) buffers.push_back({b.units, b.producer, b.start, b.consumers, b.end});
  return {{"tasks", tasks},     {"precedences", precedences},        {"num_resources", p.num_resources},
          {"hint", p.hint},     {"buffers", buffers},                {"memory_capacity", p.memory_capacity}};
}

WindowProblem ProblemFromJson(const json& j) {
  WindowProblem p;
  for (const json& t : j.at("tasks"))
    p.tasks.push_back({t.at(0).get<int64_t>(), t.at(1).get<int>(), t.at(2).get<int64_t>(), t.at(3).get<int64_t>(),
                       t.at(4).get<bool>()});
  for (const json& e : j.at("precedences")) p.precedences.emplace_back(e.at(0).get<int>(), e.at(1).get<int>());
  p.num_resources = j.at("num_resources").get<int>();
  p.hint = j.at("hint").get<std::vector<int64_t>>();
  for (const json& b : j.at("buffers"))
    p.buffers.push_back({b.at(0).get<int64_t>(), b.at(1).get<int>(), b.at(2).get<int64_t>(),
                         b.at(3).get<std::vector<int>>(), b.at(4).get<int64_t>()});
  p.memory_capacity = j.at("memory_capacity").get<int64_t>();
  return p;
}

json AnswerJson(const Result<WindowSolution>& a) {
  if (!a.ok()) return {{"error", a.status().message()}};
  const WindowSolution& s = *a;
  return {{"status", static_cast<int>(s.status)}, {"start", s.start}, {"objective", s.objective},
          {"bound", s.bound},   {"gap", s.gap},   {"seconds", s.seconds}, {"found_s", s.found_s}, {"nodes", s.nodes},
          {"hit_time_limit", s.hit_time_limit}};
}

Result<WindowSolution> AnswerFromJson(const json& j) {
  if (j.contains("error")) return Status::Error(j.at("error").get<std::string>());
  WindowSolution s;
  const int status = j.at("status").get<int>();
  if (status < static_cast<int>(SolveStatus::kOptimal) || status > static_cast<int>(SolveStatus::kNoSolution))
    throw std::out_of_range("status " + std::to_string(status) + " is not a solve status");
  s.status = static_cast<SolveStatus>(status);
  s.start = j.at("start").get<std::vector<int64_t>>();
  s.objective = j.at("objective").get<int64_t>();
  s.bound = j.at("bound").get<int64_t>();
  s.gap = j.at("gap").get<double>();
  s.seconds = j.at("seconds").get<double>();
  s.found_s = j.at("found_s").get<double>();
  s.nodes = j.at("nodes").get<int64_t>();
  s.hit_time_limit = j.at("hit_time_limit").get<bool>();
  return s;
}

/// Parses CBOR bytes; an error instead of an exception.
Result<json> ParseCbor(const std::string& bytes, const char* what) {
  json j = json::from_cbor(bytes, /*strict=*/true, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::Error(std::string(what) + ": not a CBOR map");
  return j;
}

class ThreadBatchSolver : public WindowBatchSolver {
 public:
  explicit ThreadBatchSolver(std::vector<std::unique_ptr<WindowSolver>> solvers) : solvers_(std::move(solvers)) {}
  std::string name() const override {
    return fmt::format("{} thread{}", solvers_.size(), solvers_.size() == 1 ? "" : "s");
  }
  int parallelism() const override { return static_cast<int>(solvers_.size()); }

  std::vector<Result<WindowSolution>> SolveAll(const std::vector<const WindowProblem*>& problems,
                                               const SolverOptions& options) override {
    std::vector<Result<WindowSolution>> answers(problems.size(), Status::Error("not solved"));
    std::atomic<size_t> next{0};
    auto work = [&](WindowSolver& solver) {
      for (size_t i = next++; i < problems.size(); i = next++) answers[i] = solver.Solve(*problems[i], options);
    };
    const size_t helpers = std::min(solvers_.size(), std::max<size_t>(problems.size(), 1)) - 1;
    std::vector<std::thread> threads;
    for (size_t h = 0; h < helpers; ++h) threads.emplace_back(work, std::ref(*solvers_[h + 1]));
    work(*solvers_[0]);
    for (std::thread& t : threads) t.join();
    return answers;
  }

 private:
  std::vector<std::unique_ptr<WindowSolver>> solvers_;
};

}  // namespace

std::string EncodeWindowBatch(const std::vector<const WindowProblem*>& problems, const SolverOptions& options) {
  json list = json::array();
  for (const WindowProblem* p : problems) list.push_back(ProblemJson(*p));
  json j = {{"problems", list},
            {"options",
             {{"time_limit_s", options.time_limit_s},
              {"fail_limit", options.fail_limit},
              {"fails_before_answer", options.fails_before_answer},
              {"edge_finding", options.edge_finding},
              {"search", options.search == SolverOptions::Search::kRank ? "rank" : "dive"},
              {"seed", options.seed}}}};
  std::vector<uint8_t> bytes = json::to_cbor(j);
  return std::string(bytes.begin(), bytes.end());
}

std::string EncodeWindowStop() {
  std::vector<uint8_t> bytes = json::to_cbor(json{{"stop", true}});
  return std::string(bytes.begin(), bytes.end());
}

Result<DecodedWindowBatch> DecodeWindowBatch(const std::string& bytes) {
  Result<json> j = ParseCbor(bytes, "window batch");
  if (!j.ok()) return j.status();
  DecodedWindowBatch out;
  try {
    if (j->contains("stop")) {
      out.stop = true;
      return out;
    }
    for (const json& p : j->at("problems")) out.problems.push_back(ProblemFromJson(p));
    const json& o = j->at("options");
    out.options.time_limit_s = o.at("time_limit_s").get<double>();
    out.options.fail_limit = o.at("fail_limit").get<int64_t>();
    out.options.fails_before_answer = o.at("fails_before_answer").get<int64_t>();
    out.options.edge_finding = o.at("edge_finding").get<bool>();
    out.options.seed = o.at("seed").get<uint64_t>();
    const std::string search = o.at("search").get<std::string>();
    if (search != "dive" && search != "rank") return Status::Error("window batch: search '" + search + "' is not dive or rank");
    out.options.search = search == "rank" ? SolverOptions::Search::kRank : SolverOptions::Search::kDive;
  } catch (const json::exception& e) {
    return Status::Error(std::string("window batch: ") + e.what());
  }
  return out;
}

std::string EncodeWindowAnswers(const std::vector<Result<WindowSolution>>& answers) {
  json list = json::array();
  for (const Result<WindowSolution>& a : answers) list.push_back(AnswerJson(a));
  std::vector<uint8_t> bytes = json::to_cbor(json{{"answers", list}});
  return std::string(bytes.begin(), bytes.end());
}

Result<std::vector<Result<WindowSolution>>> DecodeWindowAnswers(const std::string& bytes) {
  Result<json> j = ParseCbor(bytes, "window answers");
  if (!j.ok()) return j.status();
  std::vector<Result<WindowSolution>> out;
  try {
    for (const json& a : j->at("answers")) out.push_back(AnswerFromJson(a));
  } catch (const std::exception& e) {
    return Status::Error(std::string("window answers: ") + e.what());
  }
  return out;
}

Result<std::unique_ptr<WindowBatchSolver>> NewThreadBatchSolver(const std::string& solver_name, int threads) {
  if (threads < 1) return Status::Error("window batches need at least 1 thread, got " + std::to_string(threads));
  std::vector<std::unique_ptr<WindowSolver>> solvers;
  for (int t = 0; t < threads; ++t) {
    Result<std::unique_ptr<WindowSolver>> s = MakeWindowSolver(solver_name);
    if (!s.ok()) return s.status();
    const bool alone = !(*s)->thread_safe();
    solvers.push_back(std::move(s).value());
    if (alone) break;
  }
  return std::unique_ptr<WindowBatchSolver>(new ThreadBatchSolver(std::move(solvers)));
}

DistributedBatchSolver::DistributedBatchSolver(WindowWorkerLink& link, std::unique_ptr<WindowSolver> local)
    : link_(link), local_(std::move(local)) {}

std::string DistributedBatchSolver::name() const {
  return fmt::format("1 thread + {} worker{}", link_.workers(), link_.workers() == 1 ? "" : "s");
}

std::vector<Result<WindowSolution>> DistributedBatchSolver::SolveAll(const std::vector<const WindowProblem*>& problems,
                                                                      const SolverOptions& options) {
  const int shares = link_.workers() + 1;
  std::vector<std::vector<const WindowProblem*>> share(shares);
  for (size_t i = 0; i < problems.size(); ++i) share[i % shares].push_back(problems[i]);
  std::vector<Result<WindowSolution>> answers(problems.size(), Status::Error("not solved"));
  auto fail_share = [&](int w, const std::string& why) {
    for (size_t i = w; i < problems.size(); i += shares) answers[i] = Status::Error(why);
  };
  std::vector<bool> sent(shares, false);
  for (int w = 1; w < shares && !shut_down_; ++w) {
    if (share[w].empty()) continue;
    if (Status st = link_.Send(w, EncodeWindowBatch(share[w], options)); !st.ok()) {
      fail_share(w, fmt::format("window worker {}: {}", w, st.message()));
      continue;
    }
    sent[w] = true;
    batches_sent_++;
  }
  for (size_t i = 0; i < problems.size(); i += shares) answers[i] = local_->Solve(*problems[i], options);
  for (int w = 1; w < shares; ++w) {
    if (!sent[w]) {
      if (!share[w].empty() && shut_down_) fail_share(w, "window workers were shut down");
      continue;
    }
    Result<std::string> bytes = link_.Receive(w);
    Result<std::vector<Result<WindowSolution>>> theirs =
        bytes.ok() ? DecodeWindowAnswers(*bytes) : Result<std::vector<Result<WindowSolution>>>(bytes.status());
    if (!theirs.ok() || theirs->size() != share[w].size()) {
      fail_share(w, fmt::format("window worker {}: {}", w,
                                theirs.ok() ? fmt::format("{} answers for {} problems", theirs->size(),
                                                          share[w].size())
                                            : theirs.status().message()));
      continue;
    }
    for (size_t k = 0; k < theirs->size(); ++k) answers[w + k * shares] = std::move((*theirs)[k]);
    problems_remote_ += static_cast<int>(theirs->size());
  }
  return answers;
}

Status DistributedBatchSolver::Shutdown() {
  if (shut_down_) return Status::Ok();
  shut_down_ = true;
  Status first = Status::Ok();
  for (int w = 1; w <= link_.workers(); ++w)
    if (Status st = link_.Send(w, EncodeWindowStop()); !st.ok() && first.ok()) first = st;
  return first;
}

Status ServeWindowBatches(const std::function<Result<std::string>()>& receive,
                          const std::function<Status(const std::string&)>& send, WindowSolver& solver) {
  for (;;) {
    Result<std::string> bytes = receive();
    if (!bytes.ok()) return bytes.status();
    Result<DecodedWindowBatch> batch = DecodeWindowBatch(*bytes);
    if (!batch.ok()) return batch.status();
    if (batch->stop) return Status::Ok();
    std::vector<Result<WindowSolution>> answers;
    answers.reserve(batch->problems.size());
    for (const WindowProblem& p : batch->problems) answers.push_back(solver.Solve(p, batch->options));
    CONCERTO_RETURN_IF_ERROR(send(EncodeWindowAnswers(answers)));
  }
}

}  // namespace concerto
