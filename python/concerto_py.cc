// The Python package's native module (concerto._concerto): pybind11 over the
// C++ library. Programs are Python objects; reports are the dicts of the
// CLI's --json (the same JSON builders, parsed); a failing Status raises
// concerto.Error with the C++ message. docs/python.md documents it.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "concerto/cost/cluster.h"
#include "concerto/cost/cost_model.h"
#include "concerto/driver/driver.h"
#include "concerto/driver/job.h"
#include "concerto/driver/plan_search.h"
#include "concerto/driver/options.h"
#include "concerto/ir/autodiff.h"
#include "concerto/ir/json_io.h"
#include "concerto/ir/op_registry.h"
#include "concerto/ir/verifier.h"
#include "concerto/lower/frontend.h"
#include "concerto/lower/plan_sharding.h"
#include "concerto/lower/sharding_plan.h"
#include "concerto/ir/graph_index.h"
#include "concerto/runtime/executor.h"
#include "concerto/runtime/init.h"
#include "concerto/runtime/kernels.h"
#include "concerto/runtime/reference.h"
#include "concerto/schedule/schedule.h"
#include "concerto/util/input_file.h"
#include "concerto/util/json_text.h"
#include "concerto/version.h"

namespace py = pybind11;

namespace concerto {
namespace {

/// What a failing Status becomes: concerto.Error (a RuntimeError) with its message.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void Check(const Status& s) {
  if (!s.ok()) throw Error(s.message());
}
template <typename T>
T Take(Result<T> r) {
  if (!r.ok()) throw Error(r.status().message());
  return std::move(r).value();
}

/// nlohmann::json -> a Python object, through Python's json module (exact,
/// and the dict is the CLI's --json to the key).
py::object ToPython(const nlohmann::json& j) {
  // Leaked on purpose: a static py::object would be destroyed after the
  // interpreter finalises, without the GIL.
  static py::object* loads = new py::object(py::module_::import("json").attr("loads"));
  return (*loads)(j.dump());
}

/// Options from a dict {name: number, "solver": str}; unknown names and
/// values out of range raise with the option table's message.
Options ToOptions(const py::dict& values) {
  Options o;
  for (const auto& [key, value] : values) {
    const std::string name = py::str(key);
    if (name == "solver") {
      o.concerto.solver = py::str(value);
      continue;
    }
    if (py::isinstance<py::str>(value)) {
      const OptionSpec* spec = nullptr;
      for (const OptionSpec& s : OptionTable())
        if (s.name == name) spec = &s;
      if (spec == nullptr) throw Error("unknown option '" + name + "'");
      Check(o.Set(name, Take(ParseOptionValue(*spec, py::str(value)))));
    } else {
      Check(o.Set(name, value.cast<double>()));
    }
  }
  return o;
}

JobSpec Spec(const Program& program, const std::string& cluster, const std::string& scheduler,
             const py::dict& options, const std::string& profile) {
  JobSpec spec;
  spec.program = program;
  spec.cluster = cluster;
  spec.profile = profile;
  spec.scheduler = scheduler;
  spec.options = ToOptions(options);
  return spec;
}

int NumOps(const Program& p) {
  int n = 0;
  for (const Graph& g : p.graphs) n += static_cast<int>(g.ops.size());
  return n;
}

/// One of execute's input values: a contiguous float32 buffer (a numpy array: one copy, no Python
/// floats) or a sequence of numbers.
std::vector<float> FloatValues(const py::handle& key, const py::handle& value) {
  const std::string where = "execute: inputs['" + py::str(key).cast<std::string>() + "']";
  if (PyObject_CheckBuffer(value.ptr()) && !py::isinstance<py::str>(value)) {
    const py::buffer_info info = py::reinterpret_borrow<py::buffer>(value).request();
    if (info.format != py::format_descriptor<float>::format() || info.itemsize != sizeof(float))
      throw Error(where + ": a buffer of float32 values is needed, got format '" + info.format + "'");
    py::ssize_t expect = info.itemsize;
    for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
      if (info.shape[d] > 1 && info.strides[d] != expect)
        throw Error(where + ": the buffer is not contiguous (numpy.ascontiguousarray makes it so)");
      expect *= info.shape[d];
    }
    const float* data = static_cast<const float*>(info.ptr);
    return std::vector<float>(data, data + info.size);
  }
  try {
    return value.cast<std::vector<float>>();
  } catch (const py::cast_error&) {
    throw Error(where + ": a flat list of numbers or a float32 buffer is needed, got " +
                py::str(py::type::of(value)).cast<std::string>());
  }
}


/// The role, graph and graph index rank `rank` of `p` runs; an Error naming the rank when it runs none.
struct RankGraph {
  const Role* role;
  const Graph* graph;
};
RankGraph GraphOfRank(const Program& p, int rank) {
  if (rank < 0 || rank >= p.mesh.NumRanks())
    throw Error("rank " + std::to_string(rank) + " is outside the program's mesh of " +
                std::to_string(p.mesh.NumRanks()) + " ranks");
  const int r = p.RoleOfRank(rank);
  if (r < 0) throw Error("rank " + std::to_string(rank) + " runs no role of program '" + p.name + "'");
  const Role& role = p.roles[static_cast<size_t>(r)];
  return {&role, &p.GraphOf(role)};
}

/// The fused-tensor layouts of a decoder preset or model file (Megatron's fused QKV weight), as `concerto run`
/// initialises and gathers them; none for "" or a model without them.
std::vector<SegmentedLayout> LayoutsOf(const std::string& model) {
  if (model.empty()) return {};
  return Take(JobRunOptions(model)).init.layouts;
}

/// Throws an Error naming the first key of `values` that is the init key (InitKey) of no graph
/// input of `p`: a misspelt input would otherwise be ignored and the input generated instead.
void CheckInputKeys(const Program& p, const std::map<std::string, std::vector<float>>& values, const std::string& who) {
  std::set<std::string> keys;
  for (const Graph& g : p.graphs) {
    const GraphIndex index = GraphIndex::Build(g);
    for (size_t i = 0; i < g.tensors.size(); ++i)
      if (index.producer[i] < 0) keys.insert(InitKey(g.tensors[i].name));
  }
  for (const auto& [key, v] : values) {
    if (keys.count(key)) continue;
    std::string some;
    int n = 0;
    for (const std::string& k : keys) {
      if (n++ == 6) break;
      some += (some.empty() ? "" : ", ") + k;
    }
    throw Error(who + ": inputs['" + key + "']: program '" + p.name + "' has no graph input of that name (its inputs: " +
                some + (keys.size() > 6 ? ", ..." : "") + ")");
  }
}

py::bytes Bytes(const void* data, size_t n) { return py::bytes(static_cast<const char*>(data), n); }

}  // namespace
}  // namespace concerto

PYBIND11_MODULE(_concerto, m) {
  using namespace concerto;
  m.doc() = "Concerto: schedule and simulate distributed training programs (the C++ library's bindings).";
  m.attr("__version__") = std::string(kVersion);
  py::register_exception<Error>(m, "Error", PyExc_RuntimeError);

  py::class_<Program>(m, "Program", "A program of the IR: a mesh, graphs and the roles that run them.")
      .def_property_readonly("name", [](const Program& p) { return p.name; })
      .def_property_readonly("num_ranks", [](const Program& p) { return p.mesh.NumRanks(); })
      .def_property_readonly("num_ops", &NumOps, "ops over all graphs")
      .def_property_readonly("graph_names",
                             [](const Program& p) {
                               std::vector<std::string> names;
                               for (const Graph& g : p.graphs) names.push_back(g.name);
                               return names;
                             })
      .def("to_json", [](const Program& p) { return WriteProgram(p); }, "the IR file's text (concerto-ir JSON)")
      .def("to_dict", [](const Program& p) { return ToPython(nlohmann::json::parse(WriteProgram(p))); },
           "the IR file as a dict")
      .def("write", [](const Program& p, const std::string& path) { Check(WriteTextFile(path, WriteProgram(p))); },
           py::arg("path"))
      .def("verify", [](const Program& p) { return VerifyProgram(p); },
           "the verifier's findings (empty: the program is valid)")
      .def("__repr__", [](const Program& p) {
        return "<concerto.Program '" + p.name + "': " + std::to_string(p.mesh.NumRanks()) + " ranks, " +
               std::to_string(NumOps(p)) + " ops>";
      });

  m.def("parse_program", [](const std::string& text, const std::string& source) {
    return Take(ParseProgram(text, source));
  }, py::arg("text"), py::arg("source") = "<string>", "a program from IR text; errors name `source`");
  m.def("read_program", [](const std::string& path) { return Take(ReadProgramFile(path)); }, py::arg("path"),
        "a program from an IR file");
  m.def("lower", [](const std::string& model, const std::string& plan) { return Take(LowerModelPlan(model, plan)); },
        py::arg("model"), py::arg("plan") = "dp=1",
        "lower a model preset (or .yaml/.json model file) under a plan string or plan file");

  m.def("models", [] { return AllModelPresetNames(); }, "the model presets");
  m.def("clusters", [] { return ClusterPresetNames(); }, "the cluster presets");
  m.def("schedulers", [] { return SchedulerNames(); }, "the schedulers: the baselines and concerto");
  m.def("op_types", [] {
    py::list out;
    for (const OpTypeInfo& info : OpRegistry()) {
      py::dict d;
      d["name"] = std::string(info.name);
      d["signature"] = std::string(info.signature);
      d["flops"] = info.flops;
      d["flops_per"] = std::string(info.flops_per);
      py::list attrs;
      for (const AttrInfo& a : info.attrs) attrs.append(std::string(a.name));
      d["attrs"] = attrs;
      d["has_backward"] = info.backward != nullptr;
      d["has_sharding_rule"] = info.sharding != nullptr;
      out.append(d);
    }
    return out;
  }, "the compute types of the op registry (docs/ir.md): name, signature, flops per `flops_per` (0: a formula), "
     "attrs, whether autodiff and the partitioner have rules for it");

  m.def("options", [] {
    py::list out;
    for (const OptionSpec& s : OptionTable()) {
      py::dict d;
      d["name"] = s.name;
      d["unit"] = s.unit;
      d["default"] = s.default_value;
      d["min"] = s.min_value;
      d["max"] = s.max_value;
      d["help"] = s.help;
      out.append(d);
    }
    return out;
  }, "the option table: name, unit, default, bounds, help (the keys `options=` takes)");

  m.def("simulate", [](const Program& program, const std::string& cluster, const std::string& scheduler,
                       const py::dict& options, const std::string& profile) {
    const JobSpec spec = Spec(program, cluster, scheduler, options, profile);
    JobResult job = [&] { py::gil_scoped_release release; return Take(RunJob(spec)); }();
    return ToPython(JobResultJson(spec, job));
  }, py::arg("program"), py::arg("cluster") = "a800-4x8", py::arg("scheduler") = "fifo",
        py::arg("options") = py::dict(), py::arg("profile") = "",
        "schedule and simulate: the dict of `concerto simulate --json`");

  m.def("schedule", [](const Program& program, const std::string& cluster, const std::string& scheduler,
                       const py::dict& options, const std::string& profile) {
    const JobSpec spec = Spec(program, cluster, scheduler, options, profile);
    JobResult job = [&] { py::gil_scoped_release release; return Take(RunJob(spec)); }();
    return py::make_tuple(job.run.scheduled.program,
                          ToPython(nlohmann::json::parse(WriteSchedule(job.run.scheduled.schedule))));
  }, py::arg("program"), py::arg("cluster") = "a800-4x8", py::arg("scheduler") = "concerto",
        py::arg("options") = py::dict(), py::arg("profile") = "",
        "schedule: (the program the schedule belongs to, which a scheduler may rewrite; the schedule as a dict)");

  m.def("compare", [](const Program& program, const std::string& cluster, std::vector<std::string> schedulers,
                      const py::dict& options, const std::string& profile) {
    const JobSpec spec = Spec(program, cluster, "fifo", options, profile);
    if (schedulers.empty()) schedulers = SchedulerNames();
    CompareResult compared = [&] { py::gil_scoped_release release; return Take(CompareJob(spec, schedulers)); }();
    return ToPython(CompareResultJson(spec, compared));
  }, py::arg("program"), py::arg("cluster") = "a800-4x8", py::arg("schedulers") = std::vector<std::string>{},
        py::arg("options") = py::dict(), py::arg("profile") = "",
        "every scheduler (or those named) side by side: the dict of `concerto compare --json`");

  m.def("plan", [](const std::string& model, const std::string& cluster, int64_t global_batch, int seq, int nodes,
                   int top, int search_top, int max_micro_batch, int max_vstages, int max_tp,
                   const std::string& objective, const std::vector<std::string>& baselines, const py::dict& options,
                   const std::string& profile, bool explain) {
    if (objective != "overlap" && objective != "additive")
      throw Error("objective: '" + objective + "' is not overlap or additive");
    for (const std::string& b : baselines)
      if (std::find(SchedulerNames().begin(), SchedulerNames().end(), b) == SchedulerNames().end())
        throw Error("baselines: unknown scheduler '" + b + "'");
    if (top < 1 || search_top < 0 || max_micro_batch < 1 || max_vstages < 1 || max_tp < 0 || seq < 0 || nodes < 0)
      throw Error("top and the max_ limits must be >= 1 (max_tp, search_top, seq and nodes >= 0)");
    const ModelConfig m = Take(LoadPlanSearchModel(model));
    PlanSearchOptions o;
    o.global_batch = global_batch;
    o.seq = seq;
    o.search_top = search_top;
    o.max_micro_batch = max_micro_batch;
    o.max_vstages = max_vstages;
    o.max_tp = max_tp;
    o.baselines = baselines;
    o.objective = objective == "additive" ? PlanObjective::kAdditive : PlanObjective::kOverlap;
    o.options = ToOptions(options);
    std::unique_ptr<CostModel> cost = Take(MakeCostModel(cluster, profile, nodes));
    PlanSearchResult r = [&] { py::gil_scoped_release release; return Take(SearchPlans(m, *cost, o)); }();
    return ToPython(PlanSearchJson(r, top, explain));
  }, py::arg("model"), py::arg("cluster") = "a800-4x8", py::arg("global_batch") = 0, py::arg("seq") = 0,
        py::arg("nodes") = 0, py::arg("top") = 10, py::arg("search_top") = 8, py::arg("max_micro_batch") = 8,
        py::arg("max_vstages") = 4, py::arg("max_tp") = 0, py::arg("objective") = "overlap",
        py::arg("baselines") = std::vector<std::string>{}, py::arg("options") = py::dict(),
        py::arg("profile") = "", py::arg("explain") = false,
        "search the parallel plans of a model on a cluster: the dict of `concerto plan --json` (docs/cli.md)");

  m.def("execute", [](const Program& program, const std::string& scheduler, const std::string& cluster,
                      const py::dict& options, const py::dict& input_values, const std::vector<std::string>& fetch,
                      uint64_t seed, bool as_buffers) {
    const JobSpec spec = Spec(program, cluster, scheduler, options, "");
    std::map<std::string, std::vector<float>> inputs;
    for (const auto& [key, value] : input_values) inputs[py::cast<std::string>(key)] = FloatValues(key, value);
    CheckInputKeys(program, inputs, "execute");
    py::dict out;
    double loss = 0;
    bool has_loss = false;
    std::vector<std::pair<std::string, GlobalTensor>> fetched;
    {
      py::gil_scoped_release release;
      JobResult job = Take(RunJob(spec));
      const ScheduledProgram& sp = job.run.scheduled;
      RunOptions run_options;
      run_options.init.seed = seed;
      run_options.init.values = std::move(inputs);
      ExecutionResult run = Take(RunInProcess(sp, run_options));
      if (Result<double> l = StepLoss(sp, run); l.ok()) {
        loss = *l;
        has_loss = true;
      }
      for (const std::string& name : fetch) fetched.emplace_back(name, Take(GatherTensor(sp, run, name, {})));
    }
    out["loss"] = has_loss ? py::object(py::float_(loss)) : py::object(py::none());
    py::dict tensors;
    for (auto& [name, gt] : fetched) {
      py::dict t;
      t["shape"] = gt.shape;
      if (as_buffers) {
        t["values"] = py::bytes(reinterpret_cast<const char*>(gt.values.data()), gt.values.size() * sizeof(float));
      } else {
        t["values"] = std::move(gt.values);
      }
      t["replica_error"] = gt.replica_error;
      tensors[py::str(name)] = t;
    }
    out["tensors"] = tensors;
    return out;
  }, py::arg("program"), py::arg("scheduler") = "fifo", py::arg("cluster") = "a800-4x8",
        py::arg("options") = py::dict(), py::arg("inputs") = py::dict(),
        py::arg("fetch") = std::vector<std::string>{}, py::arg("seed") = InitOptions{}.seed,
        py::arg("as_buffers") = false,
        "run one step for real on the CPU runtime (every rank in this process), scheduled by `scheduler`: "
        "{'loss': the step loss (None without a cross_entropy), 'tensors': {name: {'shape', 'values', "
        "'replica_error'}}} for the tensors named in `fetch`, gathered from the ranks' shards into global "
        "tensors (row-major). `inputs` gives graph inputs' global values {name: flat list, or a contiguous float32 "
        "buffer such as a numpy array}; the rest are generated from `seed` (docs/runtime.md). With `as_buffers`, "
        "'values' are bytes of float32 (numpy.frombuffer(v, numpy.float32)) instead of lists");

  m.def("partition", [](const Program& unsharded, const std::string& sharding_json, const std::string& source) {
    const ShardingPlan plan = Take(ParseShardingPlan(sharding_json, source));
    PartitionReport report;
    Program out = Take(PartitionProgram(unsharded, plan, &report));
    py::dict inserted;
    for (const auto& [what, n] : report.inserted) inserted[py::str(what)] = n;
    return py::make_tuple(out, inserted);
  }, py::arg("program"), py::arg("sharding"), py::arg("source") = "<sharding>",
        "the SPMD partitioner (docs/frontends.md, 'Per-op sharding plans'): the unsharded one-rank `program` "
        "under the sharding file's JSON text `sharding`: (the per-rank program, {inserted op type: count})");

  m.def("sharding_from_plan", [](const Program& unsharded, const std::string& plan_text,
                                 const std::vector<std::string>& data_inputs) {
    return ShardingPlanJson(Take(ShardingFromPlan(unsharded, Take(ParsePlan(plan_text)), data_inputs)));
  }, py::arg("program"), py::arg("plan"), py::arg("data_inputs"),
        "the annotations partition_plan gives the partitioner, as a sharding file's JSON text (docs/frontends.md "
        "'Per-op sharding plans'): what Megatron's and DDP/ZeRO's layout of `plan` fixes on the graph");

  m.def("partition_plan", [](const Program& unsharded, const std::string& plan_text,
                             const std::vector<std::string>& data_inputs) {
    const ParallelPlan plan = Take(ParsePlan(plan_text));
    const ShardingPlan sharding = Take(ShardingFromPlan(unsharded, plan, data_inputs));
    PartitionReport report;
    Program out = Take(PartitionProgram(unsharded, sharding, &report));
    py::dict inserted;
    for (const auto& [what, n] : report.inserted) inserted[py::str(what)] = n;
    return py::make_tuple(out, inserted);
  }, py::arg("program"), py::arg("plan"), py::arg("data_inputs"),
        "the unsharded one-rank `program` under a plan string (dp, tp, sp, zero=1|2): Megatron's and DDP/ZeRO's "
        "layout found on the graph (ShardingFromPlan, docs/frontends.md 'Plans through the partitioner'), "
        "`data_inputs` split on dim 0 by dp, every collective derived by the partitioner: (the per-rank program, "
        "{inserted op type: count})");

  m.def("differentiate", [](Program program, const std::vector<std::pair<std::string, double>>& losses,
                            const std::vector<std::string>& wrt, const std::string& graph) {
    Graph* g = nullptr;
    for (Graph& candidate : program.graphs)
      if (candidate.name == graph || (graph.empty() && program.graphs.size() == 1)) g = &candidate;
    if (g == nullptr) throw Error("differentiate: name the graph (the program has " +
                                  std::to_string(program.graphs.size()) + ")");
    std::vector<LossTerm> terms;
    for (const auto& [tensor, weight] : losses) terms.push_back({tensor, weight});
    AutodiffResult r = Take(Differentiate(g, terms, wrt));
    return py::make_tuple(program, r.grads);
  }, py::arg("program"), py::arg("losses"), py::arg("wrt"), py::arg("graph") = "",
        "append the backward (the op registry's rules) of the weighted losses [(tensor, weight)] with respect to "
        "`wrt`: (the new program, {tensor: its gradient tensor})");

  m.def("verify_schedule", [](const Program& program, const std::string& schedule_json, const std::string& source) {
    const Schedule schedule = Take(ParseSchedule(schedule_json, source));
    return VerifySchedule(program, schedule);
  }, py::arg("program"), py::arg("schedule"), py::arg("source") = "<schedule>",
        "the schedule verifier's findings for the schedule file's JSON text on `program` (empty: the schedule is "
        "valid: every op once, no same-stream deadlock, consistent collective and send/recv orders); a schedule "
        "that does not parse raises concerto.Error");

  m.def("rank_layout", [](const Program& program, int rank) {
    const RankGraph rg = GraphOfRank(program, rank);
    py::dict out, groups, peers, offsets, global_shapes;
    out["role"] = rg.role->name;
    out["graph"] = rg.graph->name;
    out["coords"] = program.mesh.Coords(rank);
    for (const Op& op : rg.graph->ops) {
      if (op.kind == OpKind::kCollective) groups[py::int_(op.id)] = GroupRanks(program.mesh, op.group, rank);
      if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv) peers[py::int_(op.id)] = PeerRank(program.mesh, op.peer, rank);
    }
    for (const Tensor& t : rg.graph->tensors) {
      std::vector<int64_t> off;
      for (size_t d = 0; d < t.shape.size(); ++d) off.push_back(ShardOffset(t, static_cast<int>(d), program.mesh, rank));
      offsets[py::str(t.name)] = off;
      global_shapes[py::str(t.name)] = GlobalShape(t, program.mesh);
    }
    out["groups"] = groups;
    out["peers"] = peers;
    out["offsets"] = offsets;
    out["global_shapes"] = global_shapes;
    return out;
  }, py::arg("program"), py::arg("rank"),
        "what rank `rank` runs: {'role', 'graph', 'coords' (its mesh coordinates), 'groups' {collective op id: "
        "member ranks, ascending}, 'peers' {send/recv op id: peer rank}, 'offsets' {tensor: first global index "
        "per dim (ShardOffset)}, 'global_shapes' {tensor: global shape}}");

  m.def("profile_signatures", [](const Program& program, int rank, const std::string& cluster) {
    if (rank < 0 || rank >= program.mesh.NumRanks())
      throw Error("profile_signatures: rank " + std::to_string(rank) + " is not in the program's " +
                  std::to_string(program.mesh.NumRanks()) + " ranks");
    const ClusterSpec spec = Take(LoadCluster(cluster));
    const RankGraph rg = GraphOfRank(program, rank);
    const GraphIndex index = GraphIndex::Build(*rg.graph);
    const PriceContext ctx{*rg.graph, index, program.mesh, rank};
    py::dict out;
    for (const Op& op : rg.graph->ops) out[py::int_(op.id)] = ProfileDb::Signature(op, ctx, spec);
    return py::make_tuple(spec.device.name, out);
  }, py::arg("program"), py::arg("rank"), py::arg("cluster") = "a800-4x8",
        "(the cluster's device name, {op id: profile signature}) of rank `rank`'s ops on `cluster` (a preset or "
        "file): the keys a profile database holds their measured durations under (docs/cost-model.md)");

  m.def("collective_groups", [](const Program& program) {
    std::set<std::vector<int>> groups;
    for (const Role& role : program.roles)
      for (const Op& op : program.GraphOf(role).ops)
        if (op.kind == OpKind::kCollective)
          for (int rank : role.ranks)
            if (std::vector<int> g = GroupRanks(program.mesh, op.group, rank); g.size() > 1) groups.insert(g);
    return std::vector<std::vector<int>>(groups.begin(), groups.end());
  }, py::arg("program"),
        "every distinct member set (ascending ranks, more than one) of a collective on any rank, sorted: the "
        "communicators a torch.distributed job makes process groups for, in the same order on every rank");

  m.def("rank_inputs", [](const Program& program, int rank, uint64_t seed, const std::string& model,
                          const py::dict& input_values) {
    const RankGraph rg = GraphOfRank(program, rank);
    InitOptions init;
    init.seed = seed;
    init.layouts = LayoutsOf(model);
    for (const auto& [key, value] : input_values) init.values[py::cast<std::string>(key)] = FloatValues(key, value);
    CheckInputKeys(program, init.values, "rank_inputs");
    const GraphIndex index = GraphIndex::Build(*rg.graph);
    py::dict out;
    std::vector<float> buf;
    for (size_t i = 0; i < rg.graph->tensors.size(); ++i) {
      if (index.producer[i] >= 0) continue;
      const Tensor& t = rg.graph->tensors[i];
      buf.assign(static_cast<size_t>(t.NumElements()), 0.0f);
      Check(FillGraphInput(*rg.graph, index, static_cast<int>(i), program.mesh, rank, init, buf.data()));
      out[py::str(t.name)] = Bytes(buf.data(), buf.size() * sizeof(float));
    }
    return out;
  }, py::arg("program"), py::arg("rank"), py::arg("seed") = InitOptions{}.seed, py::arg("model") = "",
        py::arg("inputs") = py::dict(),
        "rank `rank`'s graph inputs as the runtime initialises them (docs/runtime.md, 'Initialisation'): {tensor: "
        "bytes of its local float32 values, row-major} (ids as exact floats); `inputs` gives global values by "
        "init key as execute's does; `model` names the preset or model file whose fused layouts apply");

  m.def("global_indices", [](const Program& program, int rank, const std::string& tensor, const std::string& model) {
    const RankGraph rg = GraphOfRank(program, rank);
    for (const Tensor& t : rg.graph->tensors) {
      if (t.name != tensor) continue;
      const std::vector<int64_t> idx = Take(LogicalGlobalIndices(t, program.mesh, rank, LayoutsOf(model)));
      return Bytes(idx.data(), idx.size() * sizeof(int64_t));
    }
    throw Error("rank " + std::to_string(rank) + " (graph '" + rg.graph->name + "') has no tensor '" + tensor + "'");
  }, py::arg("program"), py::arg("rank"), py::arg("tensor"), py::arg("model") = "",
        "for every local element of `tensor` on `rank` (row-major), its row-major index in the logical global "
        "tensor: bytes of int64 (numpy.frombuffer(b, numpy.int64))");
}
