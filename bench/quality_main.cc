// The scheduler quality table (make bench): every baseline and concerto on
// the frontends' workloads, on a800-4x8 and commodity-4x8. Prints a
// markdown table (docs/results.md) and, with --json, one JSON object.
//
//   concerto_quality [--time-budget S] [--json] [--only NAME]
//   concerto_quality --scaling   scheduling time vs graph size (1k, 10k, 100k ops)
//   concerto_quality --sweep     quality vs rounds and block size on two workloads
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fmt/format.h>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "concerto/cost/cluster.h"
#include "concerto/driver/driver.h"
#include "concerto/lower/frontend.h"

namespace {

using namespace concerto;

struct Workload {
  std::string model;
  std::string plan;
};

const std::vector<Workload>& Workloads() {
  static const std::vector<Workload> w = {
      {"gpt-1.3b", "dp=4,tp=8"},
      {"gpt-6.7b", "pp=4,tp=4,dp=2,microbatches=8"},
      {"gpt-13b", "zero=3,dp=32"},
      {"gpt-2.7b", "zero=2,dp=32"},
      {"llama-7b", "dp=4,tp=8,sp"},
      {"evoformer", "dp=4,dap=8"},
      {"mixtral-8x7b", "dp=4,ep=4,tp=8"},
  };
  return w;
}

/// Seconds since `t0`.
double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// One concerto run with `options` on a lowered workload: prints a table row
/// (ops, makespan, T/LB, windows, seconds).
Status ConcertoRow(const std::string& label, const Program& program, const CostModel& cost, const Options& options) {
  size_t ops = 0;
  for (const Graph& g : program.graphs) ops += g.ops.size();
  const auto t0 = std::chrono::steady_clock::now();
  Result<RunResult> run = RunScheduler(program, "concerto", cost, options);
  if (!run.ok()) return run.status();
  const double seconds = Since(t0);
  const ConcertoReport& r = *run->concerto;
  std::cout << fmt::format("| {} | {} | {:.1f} | {:.1f} | {:.3f} | {} ({} optimal, {} at the fail limit{}; {} reused, {} "
                           "solved ahead) | {:.1f} | {:.1f} |\n",
                           label, ops, r.incumbent_makespan_us / 1e3, r.final_makespan_us / 1e3,
                           r.final_makespan_us / run->summary.bound.lower_bound_us, r.windows.size(), r.windows_optimal,
                           r.windows_feasible,
                           r.windows_hit_time_limit ? fmt::format(", {} at the time limit", r.windows_hit_time_limit) : "",
                           r.windows_reused, r.windows_speculated,
                           r.seconds, seconds)
            << std::flush;
  return Status::Ok();
}

/// Scheduling time vs graph size on real workloads, default options.
int Scaling(const Options& options) {
  const std::vector<Workload> sizes = {{"gpt-1.3b", "dp=4,tp=8"},
                                       {"gpt-1.3b", "dp=4,tp=8,microbatches=8"},
                                       {"gpt-1.3b", "dp=4,tp=8,microbatches=92"}};
  AnalyticCostModel cost(LoadCluster("a800-4x8").value());
  std::cout << "| workload (a800-4x8) | ops | best baseline ms | concerto ms | T/LB | windows | search s | total s |\n"
               "|---|---|---|---|---|---|---|---|\n";
  for (const auto& w : sizes) {
    std::fprintf(stderr, "scaling: %s %s\n", w.model.c_str(), w.plan.c_str());
    Result<Program> program = LowerModelPlan(w.model, w.plan);
    if (!program.ok()) return std::fprintf(stderr, "%s\n", program.status().message().c_str()), 1;
    if (Status s = ConcertoRow(w.model + " " + w.plan, *program, cost, options); !s.ok())
      return std::fprintf(stderr, "%s\n", s.message().c_str()), 1;
  }
  return 0;
}

/// Quality vs rounds (block 125) and vs block size (4 rounds) on two workloads.
int Sweep(Options options) {
  const std::vector<Workload> workloads = {{"gpt-1.3b", "dp=4,tp=8"}, {"llama-7b", "dp=4,tp=8,sp"}};
  AnalyticCostModel cost(LoadCluster("a800-4x8").value());
  std::cout << "| workload (a800-4x8) | ops | best baseline ms | concerto ms | T/LB | windows | search s | total s |\n"
               "|---|---|---|---|---|---|---|---|\n";
  for (const auto& w : workloads) {
    Result<Program> program = LowerModelPlan(w.model, w.plan);
    if (!program.ok()) return std::fprintf(stderr, "%s\n", program.status().message().c_str()), 1;
    std::vector<std::pair<int, int>> settings = {{1, 125}, {2, 125}, {4, 125}, {8, 125}, {4, 50}, {4, 250}};
    for (const auto& [rounds, block] : settings) {
      std::fprintf(stderr, "sweep: %s %s rounds %d block %d\n", w.model.c_str(), w.plan.c_str(), rounds, block);
      Options o = options;
      (void)o.Set("rounds", rounds);
      (void)o.Set("block", block);
      if (Status s = ConcertoRow(fmt::format("{} {}, rounds {}, block {}", w.model, w.plan, rounds, block), *program,
                                 cost, o);
          !s.ok())
        return std::fprintf(stderr, "%s\n", s.message().c_str()), 1;
    }
  }
  return 0;
}

int Main(int argc, char** argv) {
  Options options;
  bool json = false;
  std::string only;
  std::string mode;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json")) {
      json = true;
    } else if (!std::strcmp(argv[i], "--time-budget") && i + 1 < argc) {
      Status s = options.Set("time-budget", std::atof(argv[++i]));
      if (!s.ok()) return std::fprintf(stderr, "%s\n", s.message().c_str()), 2;
    } else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) {
      only = argv[++i];
    } else if (!std::strcmp(argv[i], "--scaling") || !std::strcmp(argv[i], "--sweep")) {
      mode = argv[i];
    } else {
      std::fprintf(stderr, "usage: concerto_quality [--time-budget S] [--json] [--only MODEL] [--scaling | --sweep]\n");
      return 2;
    }
  }
  if (mode == "--scaling") return Scaling(options);
  if (mode == "--sweep") return Sweep(options);
  nlohmann::json all = nlohmann::json::array();
  std::cout << "| workload | cluster | best baseline | baseline ms | concerto ms | improvement | T/LB | overlap eff. "
               "| peak GiB | search s |\n|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& w : Workloads()) {
    if (!only.empty() && w.model != only) continue;
    Result<Program> program = LowerModelPlan(w.model, w.plan);
    if (!program.ok()) {
      std::cout << fmt::format("| {} {} | - | not available: {} |\n", w.model, w.plan, program.status().message())
              << std::flush;
      continue;
    }
    for (const std::string cluster : {"a800-4x8", "commodity-4x8"}) {
      std::fprintf(stderr, "quality: %s %s on %s\n", w.model.c_str(), w.plan.c_str(), cluster.c_str());
      AnalyticCostModel cost(LoadCluster(cluster).value());
      Result<std::vector<RunResult>> runs = Compare(*program, SchedulerNames(), cost, options);
      if (!runs.ok()) {
        std::cout << fmt::format("| {} {} | {} | error: {} |\n", w.model, w.plan, cluster, runs.status().message());
        continue;
      }
      LowerBound lb = ComputeLowerBound(*program, cost);
      const RunResult* best = nullptr;
      const RunResult* concerto = nullptr;
      double t_seq = 0;
      for (const auto& r : *runs) {
        if (r.summary.scheduler == "concerto") concerto = &r;
        else if (!best || r.summary.makespan_us < best->summary.makespan_us) best = &r;
        if (r.summary.scheduler == "sequential") t_seq = r.summary.makespan_us;
      }
      const double t = concerto->summary.makespan_us;
      const double bound = concerto->summary.bound.lower_bound_us;
      // Overlap efficiency against the bound of concerto's own (possibly
      // fused) program, the same bound T/LB uses.
      const double eff = t_seq > bound ? (t_seq - t) / (t_seq - bound) : 1.0;
      std::cout << fmt::format("| {} {} | {} | {} | {:.1f} | {:.1f} | {:.3f}x | {:.3f} | {:.1f}% | {:.2f} | {:.1f} |\n",
                               w.model, w.plan, cluster, best->summary.scheduler, best->summary.makespan_us / 1e3,
                               t / 1e3, best->summary.makespan_us / t, t / bound, 100 * eff,
                               concerto->summary.peak_memory_bytes / double(1 << 30),
                               concerto->concerto ? concerto->concerto->seconds : 0.0)
                << std::flush;
      nlohmann::json j = CompareJson(*runs, lb, cluster);
      j["model"] = w.model;
      j["plan"] = w.plan;
      all.push_back(j);
    }
  }
  if (json) std::cout << all.dump(2) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Main(argc, argv); }
