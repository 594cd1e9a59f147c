#include "concerto/driver/plan_search.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <tuple>

#include <fmt/format.h>

#include "concerto/driver/driver.h"
#include "concerto/ir/graph_index.h"
#include "concerto/lower/frontend.h"
#include "concerto/sim/lower_bound.h"
#include "concerto/util/stopwatch.h"

namespace concerto {

std::string_view ToString(PlanFate fate) {
  switch (fate) {
    case PlanFate::kStaticMemory: return "static-memory";
    case PlanFate::kBound: return "compute-bound";
    case PlanFate::kOverMemory: return "over-memory";
    case PlanFate::kEvaluated: return "evaluated";
    case PlanFate::kTimeBudget: return "time-budget";
    case PlanFate::kFailed: return "failed";
  }
  return "?";
}

Result<ModelConfig> LoadPlanSearchModel(const std::string& name_or_path) {
  const std::vector<std::string> all = AllModelPresetNames();
  const std::vector<std::string> decoders = ModelPresetNames();
  if (std::find(all.begin(), all.end(), name_or_path) != all.end() &&
      std::find(decoders.begin(), decoders.end(), name_or_path) == decoders.end())
    return Status::Error("plan search covers the gpt and llama families (presets and model files); '" +
                         name_or_path + "' is another frontend's preset");
  return LoadModel(name_or_path);
}

double ModelStepFlops(const ModelConfig& model, int64_t global_batch) {
  double params = static_cast<double>(ModelParameterCount(model));
  if (IsMoe(model)) {
    // A token meets top_k of the E experts of each layer: the others' weights
    // do no work for it.
    const double expert = 3.0 * model.hidden * static_cast<double>(model.ffn_hidden);
    params -= static_cast<double>(model.layers) * (model.experts - model.top_k) * expert;
  }
  const double tokens = static_cast<double>(global_batch) * model.seq;
  return 6 * params * tokens + 12.0 * model.layers * model.hidden * static_cast<double>(model.seq) * tokens;
}

namespace {

std::vector<int> Divisors(int n) {
  std::vector<int> d;
  for (int k = 1; k <= n; ++k)
    if (n % k == 0) d.push_back(k);
  return d;
}

/// The baselines that model the systems a plan runs on (docs/cli.md).
std::vector<std::string> NaturalBaselines(const ParallelPlan& plan) {
  if (plan.zero > 0) return {"zero"};
  if (plan.tp > 1 || plan.pp > 1 || plan.ep > 1) return {"megatron"};
  return {"ddp"};
}

std::string Label(const PlanCandidate& c) {
  return fmt::format("{},mbs={}", PlanToString(c.plan), c.micro_batch);
}

using Clock = std::chrono::steady_clock;

/// Bytes of every graph input (a tensor no op writes: parameters, optimizer
/// state, data) of the role's graph: all of them are live at time 0, so their
/// sum is a lower bound on the rank's peak under any schedule (sim/memory.h).
int64_t GraphInputBytes(const Graph& graph, const GraphIndex& index) {
  int64_t bytes = 0;
  for (size_t t = 0; t < graph.tensors.size(); ++t)
    if (index.producer[t] < 0) bytes += graph.tensors[t].Bytes();
  return bytes;
}

/// The figures BoundPlans reads off one proxy lowering (pp = 1, one
/// micro-batch), for the role with the most of each.
struct ProxyFigures {
  int64_t static_bytes = 0;  // graph inputs
  int64_t live_bytes = 0;    // held when the backward starts (LiveAtBackwardBytes)
  double layer_us = 0;       // layer 0's forward and backward compute (one micro-batch)
  double layer_fwd_us = 0;   // its forward part
  double layer_opt_us = 0;   // its optimizer compute
  double base_us = 0;        // compute outside the layers (embedding, head, loss, optimizer)
};

/// Bytes live, under any schedule, when the backward starts: the first op
/// to start among the loss gradients (cross_entropy_grad) and the ops after
/// them is a loss gradient, and everything every loss gradient depends on has
/// finished. So held then: each tensor that one of those ops still reads and
/// that is a graph input or written by an op every loss gradient depends on.
/// 0 without a loss gradient (a pipeline stage other than the last).
int64_t LiveAtBackwardBytes(const Graph& g, const GraphIndex& index) {
  const int n = static_cast<int>(g.ops.size());
  std::vector<int> losses;
  for (int i = 0; i < n; ++i)
    if (g.ops[i].kind == OpKind::kCompute && g.ops[i].compute_type == ComputeType::kCrossEntropyGrad)
      losses.push_back(i);
  if (losses.empty()) return 0;
  auto reach = [&](int from, const std::vector<std::vector<int>>& next) {
    std::vector<char> seen(n, 0);
    std::vector<int> stack = {from};
    seen[from] = 1;
    while (!stack.empty()) {
      const int i = stack.back();
      stack.pop_back();
      for (int j : next[i])
        if (!seen[j]) seen[j] = 1, stack.push_back(j);
    }
    return seen;
  };
  // Strict ancestors of every loss gradient; the loss gradients and their descendants.
  std::vector<char> before(n, 1), after(n, 0);
  for (int l : losses) {
    const std::vector<char> a = reach(l, index.preds), d = reach(l, index.succs);
    for (int i = 0; i < n; ++i) {
      before[i] = before[i] && a[i] && i != l;
      after[i] = after[i] || d[i];
    }
  }
  int64_t bytes = 0;
  for (size_t t = 0; t < g.tensors.size(); ++t) {
    const int p = index.producer[t];
    if (p >= 0 && !before[p]) continue;
    bool needed = false;
    for (int c : index.consumers[t]) needed = needed || after[c];
    if (needed) bytes += g.tensors[t].Bytes();
  }
  return bytes;
}

Result<ProxyFigures> MeasureProxy(const ModelConfig& model, const ParallelPlan& plan, const CostModel& cost) {
  Result<Program> program = LowerTransformer(model, plan);
  if (!program.ok()) return program.status();
  ProxyFigures f;
  for (const Role& role : program->roles) {
    if (role.ranks.empty()) continue;
    const Graph& g = program->GraphOf(role);
    const GraphIndex index = GraphIndex::Build(g);
    const PriceContext ctx{g, index, program->mesh, role.ranks.front()};
    ProxyFigures r;
    r.static_bytes = GraphInputBytes(g, index);
    r.live_bytes = LiveAtBackwardBytes(g, index);
    for (const Op& op : g.ops) {
      if (op.kind != OpKind::kCompute || op.stream != "compute") continue;
      const double us = cost.Price(op, ctx).duration_us;
      if (op.tags.layer != 0) {
        r.base_us += us;
      } else if (op.tags.phase == Phase::kOptimizer) {
        r.layer_opt_us += us;
      } else {
        r.layer_us += us;
        if (op.tags.phase == Phase::kForward) r.layer_fwd_us += us;
      }
    }
    f.static_bytes = std::max(f.static_bytes, r.static_bytes);
    f.live_bytes = std::max(f.live_bytes, r.live_bytes);
    f.layer_us = std::max(f.layer_us, r.layer_us);
    f.layer_fwd_us = std::max(f.layer_fwd_us, r.layer_fwd_us);
    f.layer_opt_us = std::max(f.layer_opt_us, r.layer_opt_us);
    f.base_us = std::max(f.base_us, r.base_us);
  }
  return f;
}

}  // namespace

std::vector<PlanCandidate> EnumeratePlans(const ModelConfig& model, int devices, int devices_per_node,
                                          const PlanSearchOptions& options) {
  std::vector<PlanCandidate> out;
  const int max_tp = options.max_tp > 0 ? std::min(options.max_tp, devices_per_node) : devices_per_node;
  const bool moe = IsMoe(model);
  for (int tp : Divisors(devices)) {
    if (tp > max_tp || devices_per_node % tp != 0) continue;
    for (int pp : Divisors(devices / tp)) {
      if (model.layers % pp != 0) continue;
      const int dp = devices / (tp * pp);
      if (options.global_batch % dp != 0) continue;
      const int64_t per_dp = options.global_batch / dp;
      for (int64_t b = 1; b <= std::min<int64_t>(per_dp, options.max_micro_batch); ++b) {
        if (per_dp % b != 0) continue;
        if (!options.all_micro_batch_sizes && (b & (b - 1)) != 0) continue;
        const int64_t m = per_dp / b;
        if (m > std::numeric_limits<int>::max()) continue;
        for (int v = 1; v <= (pp > 1 ? options.max_vstages : 1); ++v) {
          for (int ep : moe ? Divisors(dp) : std::vector<int>{1}) {
            const int max_zero = dp == 1 || ep > 1 ? 0 : pp > 1 && !options.zero_with_pp ? 1 : 3;
            for (int zero = 0; zero <= max_zero; ++zero) {
              for (int sp = 0; sp <= (tp > 1 && !moe ? 1 : 0); ++sp) {
                for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
                  // Megatron's rank order (tp, dp, pp) and, when asked, with
                  // both dp and pp, the stages inside the data-parallel replicas.
                  std::vector<std::vector<std::string>> orders = {{}};
                  if (pp > 1 && dp > 1 && options.all_orders) orders.push_back({"tp", "pp", "dp"});
                  for (const auto& order : orders) {
                    PlanCandidate c;
                    c.plan.dp = dp;
                    c.plan.tp = tp;
                    c.plan.pp = pp;
                    c.plan.ep = ep;
                    c.plan.sp = sp == 1;
                    c.plan.zero = zero;
                    c.plan.microbatches = static_cast<int>(m);
                    c.plan.vstages = v;
                    c.plan.recompute = rc;
                    c.plan.order = order;
                    c.micro_batch = static_cast<int>(b);
                    ModelConfig mb = model;
                    mb.batch = c.micro_batch;
                    if (!ValidatePlan(mb, c.plan, devices).ok()) continue;
                    out.push_back(std::move(c));
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  return out;
}

Status BoundPlans(const ModelConfig& model, const CostModel& cost, std::vector<PlanCandidate>* candidates) {
  // Key: what a layer's ops and inputs depend on (not pp, vstages, order or
  // the micro-batch count).
  using Key = std::tuple<int, bool, int, int, int, int, int>;
  std::map<Key, std::pair<ProxyFigures, ProxyFigures>> cache;  // one layer, two layers
  for (PlanCandidate& c : *candidates) {
    const ParallelPlan& p = c.plan;
    const Key key{p.tp, p.sp, p.dp, p.ep, p.zero, c.micro_batch, static_cast<int>(p.recompute)};
    auto it = cache.find(key);
    if (it == cache.end()) {
      ParallelPlan proxy;
      proxy.dp = p.dp;
      proxy.tp = p.tp;
      proxy.sp = p.sp;
      proxy.ep = p.ep;
      proxy.zero = p.zero;
      proxy.recompute = p.recompute;
      ModelConfig one = model, two = model;
      one.batch = two.batch = c.micro_batch;
      one.layers = 1;
      two.layers = 2;
      Result<ProxyFigures> f1 = MeasureProxy(one, proxy, cost);
      if (!f1.ok()) return Status::Error("bounding " + Label(c) + ": one-layer lowering: " + f1.status().message());
      Result<ProxyFigures> f2 = MeasureProxy(two, proxy, cost);
      if (!f2.ok()) return Status::Error("bounding " + Label(c) + ": two-layer lowering: " + f2.status().message());
      it = cache.emplace(key, std::make_pair(*f1, *f2)).first;
    }
    const ProxyFigures& one = it->second.first;
    const ProxyFigures& two = it->second.second;
    // Per layer: the two-layer program holds one layer more than the
    // one-layer program, and nothing else more.
    const int64_t layer_bytes = std::max<int64_t>(0, two.static_bytes - one.static_bytes);
    const int64_t base_bytes = std::max<int64_t>(0, one.static_bytes - layer_bytes);
    const int k = model.layers / p.pp;  // layers per stage
    // A stage holds its k layers' inputs; with one stage also the rest
    // (embedding, head, data). With more, the rest is split over the first
    // and last stage: left out (the bound stays below the peak).
    c.static_bytes = k * layer_bytes + (p.pp == 1 ? base_bytes : 0);
    // When a stage's first backward op of some micro-batch starts, that
    // micro-batch's forward through all k of its layers is done and what
    // their backward reads is still held: k times a layer's share of the set
    // held when the one-stage proxy's backward starts (and the rest's, with
    // one stage).
    const int64_t layer_live = std::max<int64_t>(0, two.live_bytes - one.live_bytes);
    const int64_t base_live = std::max<int64_t>(0, one.live_bytes - layer_live);
    c.live_bytes = k * layer_live + (p.pp == 1 ? base_live : 0);
    // Compute on the busiest stage: k layers of m micro-batches plus their
    // optimizer steps (and the embedding, head and loss with one stage). The
    // last stage also waits, before its first op, for micro-batch 0's forward
    // through one model chunk (k / vstages layers) on each stage before it.
    const double m = p.microbatches;
    double bound = k * (m * one.layer_us + one.layer_opt_us);
    // The rest (embedding, head, loss per micro-batch; the optimizer of the
    // rest once) is counted once: at most m times it, at least once.
    if (p.pp == 1) bound += one.base_us;
    if (p.pp > 1) bound += (p.pp - 1) * (static_cast<double>(k) / p.vstages) * one.layer_fwd_us;
    c.compute_bound_us = bound;
  }
  return Status::Ok();
}

namespace {

/// The lowered program's graph inputs on its busiest role.
int64_t ProgramStaticBytes(const Program& program) {
  int64_t most = 0;
  for (const Graph& g : program.graphs) most = std::max(most, GraphInputBytes(g, GraphIndex::Build(g)));
  return most;
}

std::string Ms(double us) { return fmt::format("{:.1f} ms", us / 1e3); }
std::string Gb(int64_t bytes) { return fmt::format("{:.1f} GB", static_cast<double>(bytes) / 1e9); }

double PeakTflops(const ClusterSpec& cluster, DType dtype) {
  switch (dtype) {
    case DType::kF16: return cluster.device.peak_tflops_fp16;
    case DType::kF32: return cluster.device.peak_tflops_fp32;
    default: return cluster.device.peak_tflops_bf16;
  }
}

/// Fills the per-GPU figures of an evaluated plan from its step.
void FillRates(const ModelConfig& model, const ClusterSpec& cluster, int devices, int64_t global_batch,
               PlanCandidate* c) {
  const double step_s = c->step_us * 1e-6;
  if (step_s <= 0) return;
  c->tokens_per_s_per_gpu = static_cast<double>(global_batch) * model.seq / (step_s * devices);
  c->model_tflops_per_gpu = ModelStepFlops(model, global_batch) / (step_s * devices) / 1e12;
  const double peak = PeakTflops(cluster, model.dtype);
  c->mfu = peak > 0 ? c->model_tflops_per_gpu / peak : 0;
}

}  // namespace

Result<PlanSearchResult> SearchPlans(const ModelConfig& model_in, const CostModel& cost,
                                     const PlanSearchOptions& options, const ProgressFn& progress) {
  const auto t0 = Clock::now();
  auto say = [&](const std::string& line) {
    if (progress) progress(line);
  };
  if (model_in.family != ModelFamily::kGpt && model_in.family != ModelFamily::kLlama)
    return Status::Error("plan search covers the gpt and llama families (presets and model files); '" +
                         model_in.name + "' is not one");
  if (options.global_batch <= 0) return Status::Error("--global-batch: must be a positive number of sequences");
  ModelConfig model = model_in;
  if (options.seq > 0) model.seq = options.seq;
  if (Status s = ValidateModel(model); !s.ok()) return Status::Error(model.name + ": " + s.message());
  const ClusterSpec& cluster = cost.cluster();
  const int devices = cluster.NumDevices();

  PlanSearchResult result;
  result.model = model.name;
  result.cluster = cluster.name;
  result.devices = devices;
  result.global_batch = options.global_batch;
  result.seq = model.seq;
  result.objective = options.objective;
  result.memory_budget_bytes = MemoryBudgetBytes(options.options, cluster);
  const int64_t budget = result.memory_budget_bytes;

  std::vector<PlanCandidate> plans = EnumeratePlans(model, devices, cluster.devices_per_node, options);
  if (plans.empty())
    return Status::Error(fmt::format(
        "no valid plan of {} on {} devices ({} per node) with global batch {}: the batch must split over dp "
        "into micro-batches of at most {} sequences, tp must divide a node and the heads, pp the layers",
        model.name, devices, cluster.devices_per_node, options.global_batch, options.max_micro_batch));
  say(fmt::format("{} plans of {} on {} ({} devices); bounding them", plans.size(), model.name, cluster.name,
                  devices));
  CONCERTO_RETURN_IF_ERROR(BoundPlans(model, cost, &plans));

  // Static memory first, then the compute bound against the best step found,
  // in order of the bound: once a plan's bound reaches the best step, every
  // later one's does.
  std::vector<int> order;
  for (int i = 0; i < static_cast<int>(plans.size()); ++i) {
    PlanCandidate& c = plans[i];
    if (budget > 0 && c.static_bytes > budget) {
      c.fate = PlanFate::kStaticMemory;
      c.reason = fmt::format("graph inputs {} > budget {} (before lowering)", Gb(c.static_bytes), Gb(budget));
    } else if (budget > 0 && c.live_bytes > budget) {
      c.fate = PlanFate::kStaticMemory;
      c.reason = fmt::format("held at the first backward op {} > budget {} (before lowering)", Gb(c.live_bytes),
                             Gb(budget));
    } else {
      order.push_back(i);
    }
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return plans[a].compute_bound_us < plans[b].compute_bound_us; });
  say(fmt::format("bounded in {:.1f} s: {} plans over memory by a memory bound; {} to evaluate, best bound first",
                  SecondsSince(t0), plans.size() - order.size(), order.size()));

  double best = std::numeric_limits<double>::infinity();
  std::string best_label;
  // The simulations get the budget up to the concerto searches' share: 40%
  // of it when they run.
  const double budget_s = options.options.concerto.time_budget_s;
  const double evaluation_budget_s = options.search_top > 0 ? budget_s * 0.6 : budget_s;
  Options run_options = options.options;
  int done = 0;
  for (int i : order) {
    PlanCandidate& c = plans[i];
    ++done;
    if (c.compute_bound_us >= best) {
      c.fate = PlanFate::kBound;
      c.reason = fmt::format("compute bound {} >= best {} ({})", Ms(c.compute_bound_us), Ms(best), best_label);
      continue;
    }
    if (SecondsSince(t0) > evaluation_budget_s) {
      if (!result.time_budget_hit) result.unexplored_bound_us = c.compute_bound_us;  // the smallest left: sorted
      result.time_budget_hit = true;
      c.fate = PlanFate::kTimeBudget;
      c.reason = "not evaluated: the time budget ran out";
      continue;
    }
    ModelConfig mb = model;
    mb.batch = c.micro_batch;
    const auto t_lower = Clock::now();
    Result<Program> program = LowerTransformer(mb, c.plan);
    if (!program.ok()) return Status::Error("lowering " + Label(c) + ": " + program.status().message());
    ++result.lowered;
    const double lower_s = SecondsSince(t_lower);
    const int64_t inputs = ProgramStaticBytes(*program);
    if (budget > 0 && inputs > budget) {
      c.fate = PlanFate::kStaticMemory;
      c.reason = fmt::format("graph inputs {} > budget {} (lowered)", Gb(inputs), Gb(budget));
      continue;
    }
    std::vector<std::string> schedulers = options.baselines.empty() ? NaturalBaselines(c.plan) : options.baselines;
    if (options.objective == PlanObjective::kAdditive) schedulers.push_back("sequential");
    ++result.simulated;
    const auto t_sim = Clock::now();
    std::string failure;
    int64_t least_peak = std::numeric_limits<int64_t>::max();
    for (const std::string& name : schedulers) {
      Result<StepFigures> run = SimulateBaselineStep(*program, name, cost, run_options);
      if (!run.ok()) {
        // A baseline that cannot run this plan (its message kept) fails the
        // plan, not the search.
        const std::string m = run.status().message();
        failure = "scheduler '" + name + "': " + m.substr(0, m.find('\n'));
        continue;
      }
      c.ops = run->num_ops;
      least_peak = std::min(least_peak, run->peak_memory_bytes);
      if (name == "sequential") {
        c.additive_step_us = run->makespan_us;
        continue;
      }
      if (!run->fits_memory) continue;
      if (!c.fits || run->makespan_us < c.baseline_step_us) {
        c.fits = true;
        c.baseline_step_us = run->makespan_us;
        c.baseline = name;
        c.peak_bytes = run->peak_memory_bytes;
      }
    }
    if (!c.fits && !failure.empty() && least_peak == std::numeric_limits<int64_t>::max()) {
      c.fate = PlanFate::kFailed;
      c.reason = failure;
    } else if (!c.fits) {
      c.fate = PlanFate::kOverMemory;
      c.peak_bytes = least_peak;
      c.reason = fmt::format("simulated peak {} > budget {}", Gb(least_peak), Gb(budget));
    } else {
      c.fate = PlanFate::kEvaluated;
      c.step_us = c.baseline_step_us;
      c.scheduler = c.baseline;
      if (c.RankUs(options.objective) < best) {
        best = c.RankUs(options.objective);
        best_label = Label(c);
      }
    }
    say(fmt::format("[{}/{}] {}: {} (bound {}), best {}; {} ops lowered in {:.1f} s, simulated in {:.1f} s "
                    "({:.0f} s in all)",
                    done, order.size(), Label(c), c.fits ? c.baseline + " " + Ms(c.baseline_step_us) : c.reason,
                    Ms(c.compute_bound_us), Ms(best), c.ops, lower_s, SecondsSince(t_sim), SecondsSince(t0)));
  }

  // The concerto search on the best few by the objective.
  std::vector<int> evaluated;
  for (int i = 0; i < static_cast<int>(plans.size()); ++i)
    if (plans[i].fate == PlanFate::kEvaluated) evaluated.push_back(i);
  auto by_rank = [&](int a, int b) {
    const double ra = plans[a].RankUs(options.objective), rb = plans[b].RankUs(options.objective);
    return ra != rb ? ra < rb : a < b;
  };
  std::sort(evaluated.begin(), evaluated.end(), by_rank);
  const int searched = std::min<int>(options.search_top, static_cast<int>(evaluated.size()));
  double best_step = std::numeric_limits<double>::infinity();
  double longest_search_s = 0;
  for (int i : evaluated) best_step = std::min(best_step, plans[i].step_us);
  for (int r = 0; r < searched; ++r) {
    PlanCandidate& c = plans[evaluated[r]];
    // No schedule of it can beat the best step found: nothing to search for
    // (the overlap objective ranks by that step).
    if (options.objective == PlanObjective::kOverlap && c.compute_bound_us >= best_step) continue;
    const double left_s = budget_s - SecondsSince(t0);
    // A search costs more than its own budget (baselines, list schedules and
    // the decomposition come first): none starts without 1.5 times the
    // longest so far left.
    if (left_s <= 0 || left_s < 1.5 * longest_search_s) {
      result.time_budget_hit = true;
      say("time budget spent: no concerto search on " + Label(c));
      continue;
    }
    const auto t_search = Clock::now();
    say(fmt::format("concerto search on {} ({} of {})", Label(c), r + 1, searched));
    ModelConfig mb = model;
    mb.batch = c.micro_batch;
    Result<Program> program = LowerTransformer(mb, c.plan);
    if (!program.ok()) return Status::Error("lowering " + Label(c) + ": " + program.status().message());
    Options concerto_options = run_options;
    // Its share of what is left, less a fifth: the search checks its budget
    // between passes, and one pass over a large program can take tens of seconds.
    concerto_options.concerto.time_budget_s =
        std::min(concerto_options.concerto.time_budget_s, std::max(1.0, 0.8 * left_s / (searched - r)));
    Result<RunResult> run = RunScheduler(*program, "concerto", cost, concerto_options);
    if (!run.ok()) return Status::Error(Label(c) + ": concerto: " + run.status().message());
    longest_search_s = std::max(longest_search_s, SecondsSince(t_search));
    const Summary& s = run->summary;
    if (run->concerto && run->concerto->hit_time_budget) result.time_budget_hit = true;
    if (s.fits_memory) {
      c.concerto_step_us = s.makespan_us;
      if (s.makespan_us < c.step_us) {
        c.step_us = s.makespan_us;
        c.scheduler = "concerto";
        c.peak_bytes = s.peak_memory_bytes;
      }
      best_step = std::min(best_step, c.step_us);
    }
  }

  for (PlanCandidate& c : plans)
    if (c.fate == PlanFate::kEvaluated) FillRates(model, cluster, devices, options.global_batch, &c);
  // Ranked: evaluated plans by the objective, then the rest as enumerated.
  std::vector<int> rest;
  for (int i = 0; i < static_cast<int>(plans.size()); ++i)
    if (plans[i].fate != PlanFate::kEvaluated) rest.push_back(i);
  std::sort(evaluated.begin(), evaluated.end(), by_rank);
  result.ranked = static_cast<int>(evaluated.size());
  for (int i : evaluated) result.plans.push_back(plans[i]);
  for (int i : rest) result.plans.push_back(plans[i]);
  // The memory-time front: a ranked plan no other beats on both step and peak.
  for (int i = 0; i < result.ranked; ++i) {
    const PlanCandidate& a = result.plans[i];
    bool dominated = false;
    for (int j = 0; j < result.ranked && !dominated; ++j) {
      const PlanCandidate& b = result.plans[j];
      dominated = j != i && b.step_us <= a.step_us && b.peak_bytes <= a.peak_bytes &&
                  (b.step_us < a.step_us || b.peak_bytes < a.peak_bytes || j < i);
    }
    if (!dominated) result.pareto.push_back(i);
  }
  std::sort(result.pareto.begin(), result.pareto.end(),
            [&](int a, int b) { return result.plans[a].peak_bytes < result.plans[b].peak_bytes; });
  result.seconds = SecondsSince(t0);
  return result;
}

namespace {

std::string Row(const PlanCandidate& c, int width) {
  return fmt::format("{:<{}} {:>11.1f} {:>10.0f} {:>9.1f} {:>6.1f}% {:>8.1f} {:>5} {:<10}", Label(c), width,
                     c.step_us / 1e3, c.tokens_per_s_per_gpu, c.model_tflops_per_gpu, 100 * c.mfu,
                     static_cast<double>(c.peak_bytes) / 1e9, c.fits ? "yes" : "no", c.scheduler);
}

std::map<PlanFate, int> FateCounts(const PlanSearchResult& r) {
  std::map<PlanFate, int> n;
  for (const PlanCandidate& c : r.plans) ++n[c.fate];
  return n;
}

nlohmann::json CandidateJson(const PlanCandidate& c) {
  nlohmann::json j = {{"plan", PlanToString(c.plan)},
                      {"micro_batch", c.micro_batch},
                      {"fate", std::string(ToString(c.fate))},
                      {"static_memory_bytes", c.static_bytes},
                      {"live_at_backward_bytes", c.live_bytes},
                      {"compute_bound_us", c.compute_bound_us}};
  if (!c.reason.empty()) j["reason"] = c.reason;
  if (c.fate == PlanFate::kEvaluated || c.fate == PlanFate::kOverMemory) {
    j["peak_memory_bytes"] = c.peak_bytes;
    j["fits_memory"] = c.fits;
    j["ops"] = c.ops;
  }
  if (c.fate == PlanFate::kEvaluated) {
    j["step_us"] = c.step_us;
    j["scheduler"] = c.scheduler;
    j["baseline"] = c.baseline;
    j["baseline_step_us"] = c.baseline_step_us;
    if (c.concerto_step_us > 0) j["concerto_step_us"] = c.concerto_step_us;
    if (c.additive_step_us > 0) j["additive_step_us"] = c.additive_step_us;
    j["tokens_per_s_per_gpu"] = c.tokens_per_s_per_gpu;
    j["model_tflops_per_gpu"] = c.model_tflops_per_gpu;
    j["mfu"] = c.mfu;
  }
  return j;
}

}  // namespace

std::string PlanSearchTable(const PlanSearchResult& r, int top) {
  std::string out = fmt::format(
      "{} on {} ({} devices), global batch {} x seq {}, memory budget {}, ranked by {}\n", r.model, r.cluster,
      r.devices, r.global_batch, r.seq, r.memory_budget_bytes > 0 ? Gb(r.memory_budget_bytes) : "none",
      r.objective == PlanObjective::kAdditive ? "the additive (overlap-blind) step" : "the best simulated step");
  int width = 24;
  for (int i = 0; i < std::min(top, r.ranked); ++i) width = std::max<int>(width, Label(r.plans[i]).size());
  for (int i : r.pareto) width = std::max<int>(width, Label(r.plans[i]).size());
  const std::string header = fmt::format("{:<4} {:<{}} {:>11} {:>10} {:>9} {:>7} {:>8} {:>5} {:<10}\n", "rank",
                                         "plan", width, "step_ms", "tok/s/gpu", "TFLOP/s", "MFU", "peak_GB",
                                         "fits", "schedule");
  out += header;
  for (int i = 0; i < std::min(top, r.ranked); ++i) {
    out += fmt::format("{:<4} {}", i + 1, Row(r.plans[i], width));
    if (r.objective == PlanObjective::kAdditive) out += fmt::format("  additive {:.1f} ms", r.plans[i].additive_step_us / 1e3);
    out += "\n";
  }
  if (r.ranked == 0)
    out += r.simulated == 0 && r.time_budget_hit ? "(the time budget ran out before a plan was simulated)\n"
                                                 : "(no plan fits the memory budget)\n";
  out += "memory-time front (least memory first):\n";
  for (int i : r.pareto) out += fmt::format("{:<4} {}\n", i + 1, Row(r.plans[i], width));
  const auto n = FateCounts(r);
  auto count = [&](PlanFate f) { return n.count(f) ? n.at(f) : 0; };
  out += fmt::format(
      "{} plans: {} evaluated, {} over memory by a memory bound, {} pruned by the compute bound, {} over memory "
      "when simulated{}{}; {} lowered, {} simulated, in {:.1f} s\n",
      r.plans.size(), count(PlanFate::kEvaluated), count(PlanFate::kStaticMemory), count(PlanFate::kBound),
      count(PlanFate::kOverMemory),
      count(PlanFate::kFailed) ? fmt::format(", {} failed (a baseline could not run them: --explain)",
                                             count(PlanFate::kFailed))
                               : std::string(),
      count(PlanFate::kTimeBudget) ? fmt::format(", {} not evaluated (time budget)", count(PlanFate::kTimeBudget))
                                   : std::string(),
      r.lowered, r.simulated, r.seconds);
  if (r.time_budget_hit && r.unexplored_bound_us > 0) {
    const double best = r.ranked > 0 ? r.plans[0].step_us : 0;
    out += fmt::format(
        "the time budget stopped the search: no plan left unevaluated can step faster than {:.1f} ms under any "
        "schedule (the smallest compute bound left){}\n",
        r.unexplored_bound_us / 1e3,
        best > 0 ? fmt::format(": at most {:.1f}% faster than the first plan",
                               100 * std::max(0.0, best / r.unexplored_bound_us - 1))
                 : std::string());
  }
  return out;
}

std::string PlanSearchExplain(const PlanSearchResult& r) {
  std::string out;
  int width = 24;
  for (const PlanCandidate& c : r.plans) width = std::max<int>(width, Label(c).size());
  for (const PlanCandidate& c : r.plans)
    out += fmt::format("{:<{}} {:<14} bound {:>10.1f} ms  inputs {:>7.1f} GB  {}\n", Label(c), width, ToString(c.fate),
                       c.compute_bound_us / 1e3, static_cast<double>(c.static_bytes) / 1e9,
                       c.fate == PlanFate::kEvaluated
                           ? fmt::format("{} {:.1f} ms", c.scheduler, c.step_us / 1e3)
                           : c.reason);
  return out;
}

nlohmann::json PlanSearchJson(const PlanSearchResult& r, int top, bool explain) {
  nlohmann::json ranked = nlohmann::json::array(), pareto = nlohmann::json::array(), all = nlohmann::json::array();
  for (int i = 0; i < std::min(top, r.ranked); ++i) ranked.push_back(CandidateJson(r.plans[i]));
  for (int i : r.pareto) pareto.push_back(CandidateJson(r.plans[i]));
  nlohmann::json counts = nlohmann::json::object();
  for (const auto& [fate, n] : FateCounts(r)) counts[std::string(ToString(fate))] = n;
  nlohmann::json j = {{"model", r.model},
                      {"cluster", r.cluster},
                      {"devices", r.devices},
                      {"global_batch", r.global_batch},
                      {"seq", r.seq},
                      {"memory_budget_bytes", r.memory_budget_bytes},
                      {"objective", r.objective == PlanObjective::kAdditive ? "additive" : "overlap"},
                      {"plans", r.plans.size()},
                      {"ranked_count", r.ranked},
                      {"fates", counts},
                      {"lowered", r.lowered},
                      {"simulated", r.simulated},
                      {"time_budget_hit", r.time_budget_hit},
                      {"unexplored_bound_us", r.unexplored_bound_us},
                      {"search_s", r.seconds},
                      {"ranked", ranked},
                      {"pareto", pareto}};
  if (explain) {
    for (const PlanCandidate& c : r.plans) all.push_back(CandidateJson(c));
    j["every_plan"] = all;
  }
  return j;
}

}  // namespace concerto
