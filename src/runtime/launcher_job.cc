// Measured runs: iterations in process, the median iteration's figures, and
// scheduled programs packed for other ranks.
#include "concerto/runtime/launcher_job.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fmt/format.h>

#include "concerto/ir/json_io.h"

namespace concerto {

double IterationTimeUs(const std::vector<std::vector<OpRecord>>& per_rank) {
  double t = 0;
  for (const auto& records : per_rank)
    for (const OpRecord& r : records) t = std::max(t, r.end_us);
  return t;
}

Result<MeasuredJob> SummarizeMeasuredJob(const Program& program,
                                         const std::vector<std::vector<std::vector<OpRecord>>>& records,
                                         int warmup) {
  if (records.empty()) return Status::Error("no measured iterations");
  MeasuredJob job;
  job.warmup = warmup;
  for (const auto& per_rank : records) job.iteration_us.push_back(IterationTimeUs(per_rank));
  std::vector<int> order(job.iteration_us.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return job.iteration_us[a] < job.iteration_us[b]; });
  job.median_iteration = order[(order.size() - 1) / 2];
  job.median_iteration_us = job.iteration_us[job.median_iteration];
  job.timeline = MakeMeasuredTimeline(program, records[job.median_iteration]);
  return job;
}

std::string PackScheduledProgram(const ScheduledProgram& sp) {
  const std::string program = WriteProgram(sp.program);
  const std::string schedule = WriteSchedule(sp.schedule);
  std::string out;
  const uint64_t n = program.size();
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  out += program;
  out += schedule;
  return out;
}

Result<ScheduledProgram> UnpackScheduledProgram(const std::string& bytes, const std::string& source) {
  uint64_t n = 0;
  if (bytes.size() < sizeof n) return Status::Error(source + ": truncated scheduled program");
  std::memcpy(&n, bytes.data(), sizeof n);
  if (bytes.size() - sizeof n < n) return Status::Error(source + ": truncated scheduled program");
  Result<Program> program = ParseProgram(bytes.substr(sizeof n, n), source + " (program)");
  if (!program.ok()) return program.status();
  Result<Schedule> schedule = ParseSchedule(bytes.substr(sizeof n + n), source + " (schedule)");
  if (!schedule.ok()) return schedule.status();
  return ScheduledProgram{std::move(program).value(), std::move(schedule).value()};
}

Result<MeasuredJob> RunJobInProcess(const ScheduledProgram& sp, const RunOptions& options, int iterations,
                                    int warmup, ExecutionResult* first) {
  if (iterations < 1) return Status::Error("--iterations must be at least 1");
  if (warmup < 0) return Status::Error("--warmup must be at least 0");
  // Buffers are allocated and initialised once; every step computes the
  // same values, and `first` gets the tensors after the first step.
  std::vector<std::vector<std::vector<OpRecord>>> steps;
  Result<ExecutionResult> run = RunInProcessSteps(sp, options, warmup + iterations, &steps);
  if (!run.ok()) return run.status();
  std::vector<std::vector<std::vector<OpRecord>>> measured(std::make_move_iterator(steps.begin() + warmup),
                                                           std::make_move_iterator(steps.end()));
  if (first) *first = std::move(run).value();
  return SummarizeMeasuredJob(sp.program, measured, warmup);
}

}  // namespace concerto
