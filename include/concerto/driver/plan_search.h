// The parallel-plan search (`concerto plan`, `concerto.plan`): every valid
// plan of a transformer over a cluster's devices, pruned by bounds that are
// safe (a plan goes only when no schedule of it can beat the best plan found,
// or its graph inputs alone overflow the memory budget), the survivors
// simulated with their own system's baseline, and the best few searched with
// concerto. docs/cli.md, "concerto plan", has the rules and their arithmetic.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "concerto/cost/cost_model.h"
#include "concerto/driver/options.h"
#include "concerto/lower/plan.h"
#include "concerto/lower/transformer.h"
#include "concerto/schedule/concerto_scheduler.h"
#include "concerto/util/status.h"

namespace concerto {

/// What the search ranks plans by: their best simulated step (the overlap
/// scheduler in the loop), or the additive cost an overlap-blind planner uses
/// (the `sequential` schedule: compute plus every collective as if serial).
enum class PlanObjective { kOverlap, kAdditive };

struct PlanSearchOptions {
  int64_t global_batch = 0;  // sequences per step (required)
  int seq = 0;               // > 0: the model's sequence length replaced
  int max_micro_batch = 8;   // largest micro-batch size (sequences) tried
  /// Every divisor of the per-replica batch as a micro-batch size (false:
  /// powers of two, as the Megatron and NeMo auto-configurators try).
  bool all_micro_batch_sizes = false;
  /// ZeRO stages 2 and 3 with pipeline parallelism too (false: stage 0 or 1
  /// with pp > 1, what DeepSpeed's pipeline engine and Megatron's
  /// distributed optimizer run).
  bool zero_with_pp = false;
  /// Both mesh orders with pp and dp (tp-dp-pp and tp-pp-dp); false:
  /// Megatron's tp-dp-pp only.
  bool all_orders = false;
  int max_vstages = 4;       // largest number of virtual stages tried
  /// At most this many tensor-parallel ranks (0: a node's devices; tp never
  /// crosses a node).
  int max_tp = 0;
  int search_top = 8;  // the best plans by baseline that the concerto search runs on (0: none)
  /// Baselines each surviving plan is simulated with; empty: the plan's own
  /// system (ZeRO stages: zero; tp or pp: megatron; dp only: ddp).
  std::vector<std::string> baselines;
  PlanObjective objective = PlanObjective::kOverlap;
  /// The scheduler and simulation options (memory budget included). Its
  /// time budget (`--time-budget`) bounds the whole search, a wall-clock
  /// safety net: plans not evaluated when it fires are reported as such.
  Options options;
};

/// What happened to one plan.
enum class PlanFate {
  kStaticMemory,       // a memory lower bound (graph inputs, or what the first backward op
                       // finds held) is over the budget, before lowering it
  kBound,              // its compute bound (before lowering it) >= the best step found
  kOverMemory,         // simulated: every schedule tried is over the budget
  kEvaluated,          // simulated and fits
  kTimeBudget,         // not evaluated: the time budget ran out
  kFailed,             // no baseline could schedule it (reason: the first one's message)
};
std::string_view ToString(PlanFate fate);

struct PlanCandidate {
  ParallelPlan plan;
  int micro_batch = 1;  // sequences per micro-batch (the model's batch)
  /// Graph inputs (parameters, optimizer state, data) of the busiest rank,
  /// extrapolated from one- and two-layer lowerings: a lower bound on its peak.
  int64_t static_bytes = 0;
  /// What the busiest rank holds, under any schedule, when its first backward
  /// op starts (a micro-batch's forward through the rank's layers done, what
  /// their backward reads still held, with the parameters and optimizer state
  /// it reads), from the same lowerings: also a lower bound on its peak.
  int64_t live_bytes = 0;
  /// Compute bound: the compute work of the busiest pipeline stage plus the
  /// pipeline's fill, from the same lowerings (a lower bound on any schedule).
  double compute_bound_us = 0;
  PlanFate fate = PlanFate::kTimeBudget;
  std::string reason;  // why it was dropped (or "")
  // Evaluated plans:
  double baseline_step_us = 0;
  std::string baseline;  // the baseline that gave baseline_step_us
  double additive_step_us = 0;  // the sequential schedule's step (objective additive)
  double concerto_step_us = 0;  // 0: concerto not run on it
  double step_us = 0;           // the best fitting step (concerto's or the baseline's)
  std::string scheduler;        // the scheduler of step_us
  int64_t peak_bytes = 0;       // of the schedule of step_us
  bool fits = false;
  int ops = 0;
  double tokens_per_s_per_gpu = 0;
  double model_tflops_per_gpu = 0;
  double mfu = 0;  // model TFLOP/s over the device's peak for the model's dtype
  /// The figure the objective ranks by (step_us, or additive_step_us).
  double RankUs(PlanObjective objective) const {
    return objective == PlanObjective::kAdditive ? additive_step_us : step_us;
  }
};

struct PlanSearchResult {
  std::string model;
  std::string cluster;
  int devices = 0;
  int64_t global_batch = 0;
  int seq = 0;
  int64_t memory_budget_bytes = 0;
  PlanObjective objective = PlanObjective::kOverlap;
  /// Every plan enumerated, ranked: evaluated plans that fit by the objective,
  /// then the rest in enumeration order.
  std::vector<PlanCandidate> plans;
  int ranked = 0;             // plans[0, ranked) are evaluated and fit
  std::vector<int> pareto;    // indices into plans: the memory-time front of the ranked plans
  int lowered = 0;            // plans lowered in full
  int simulated = 0;          // plans simulated
  bool time_budget_hit = false;
  /// With the time budget hit: the smallest compute bound among the plans not
  /// evaluated (no plan of the space is faster; the best plan's step over it
  /// is the search's optimality gap). 0 otherwise.
  double unexplored_bound_us = 0;
  double seconds = 0;
};

/// The model a plan search takes: a gpt or llama preset or model file; any
/// other frontend's preset is refused by name.
Result<ModelConfig> LoadPlanSearchModel(const std::string& name_or_path);

/// Model FLOPs of one step of `global_batch` sequences (no recomputation):
/// 6 N T + 12 L h s T for T tokens, N the parameters a token meets (a
/// mixture of experts: top_k of its experts), the second term attention's
/// scores and values (PaLM's accounting, Chowdhery et al. 2022, appendix B).
double ModelStepFlops(const ModelConfig& model, int64_t global_batch);

/// The plans of `model` (its batch and seq as given) on `devices` devices of
/// which `devices_per_node` share a node, under `options`' limits: every
/// combination that ValidatePlan accepts with dp * micro_batch *
/// microbatches = global_batch. In a fixed order.
std::vector<PlanCandidate> EnumeratePlans(const ModelConfig& model, int devices, int devices_per_node,
                                          const PlanSearchOptions& options);

/// Fills static_bytes and compute_bound_us of every candidate from one- and
/// two-layer lowerings of its (tp, sp, dp, ep, zero, micro-batch,
/// recomputation), priced by `cost` (cached per key). The arithmetic is in
/// docs/cli.md ("concerto plan"); tests check it against full lowerings.
Status BoundPlans(const ModelConfig& model, const CostModel& cost, std::vector<PlanCandidate>* candidates);

/// The search: enumerate, bound, prune, simulate the survivors (best bound
/// first), run concerto on the best `search_top`, rank.
Result<PlanSearchResult> SearchPlans(const ModelConfig& model, const CostModel& cost,
                                     const PlanSearchOptions& options, const ProgressFn& progress = nullptr);

/// The ranked table (at most `top` rows), the Pareto front and the counts.
std::string PlanSearchTable(const PlanSearchResult& result, int top);
/// Why each plan was kept or dropped, one line per plan.
std::string PlanSearchExplain(const PlanSearchResult& result);
/// The search as one JSON object (at most `top` ranked rows; `explain`: every plan).
nlohmann::json PlanSearchJson(const PlanSearchResult& result, int top, bool explain);

}  // namespace concerto
