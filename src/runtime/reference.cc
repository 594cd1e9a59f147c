// The reference check: gathers shards into logical global tensors and
// compares a parallel run with the unsharded one, loss first, then each
// parameter's gradient and its updated value (found through the Adam ops,
// which keep their names across plans and scheduler rewrites).
#include "concerto/runtime/reference.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <functional>
#include <set>

#include "concerto/runtime/kernels.h"

namespace concerto {

namespace {

/// "1.234e-05".
std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

/// "[2, 17]": the coordinates of row-major index `flat` in `shape`.
std::string Coords(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = shape[d] ? flat % shape[d] : 0;
    flat = shape[d] ? flat / shape[d] : 0;
  }
  std::string s = "[";
  for (size_t d = 0; d < c.size(); ++d) s += (d ? ", " : "") + std::to_string(c[d]);
  return s + "]";
}

/// The index of the op called `name` in `graph`, or -1.
int FindOp(const Graph& graph, const std::string& name) {
  for (size_t i = 0; i < graph.ops.size(); ++i)
    if (graph.ops[i].name == name) return static_cast<int>(i);
  return -1;
}

/// The tensor called `name` in `graph` (must exist).
const Tensor& FindTensor(const Graph& graph, const std::string& name) {
  for (const Tensor& t : graph.tensors)
    if (t.name == name) return t;
  assert(false && "tensor of an op not in its graph");
  return graph.tensors.front();
}

/// The names of the Adam ops of `program`, in graph and program order, once each.
std::vector<std::string> AdamOps(const Program& program) {
  std::vector<std::string> names;
  std::set<std::string> seen;
  for (const Graph& g : program.graphs)
    for (const Op& op : g.ops)
      if (op.kind == OpKind::kCompute && op.compute_type == ComputeType::kAdam &&
          seen.insert(op.name).second)
        names.push_back(op.name);
  return names;
}

/// The layouts that apply to parameter `param`, rewritten to apply to any
/// tensor (a gradient's name does not end like its parameter's).
std::vector<SegmentedLayout> LayoutsFor(const std::string& param,
                                        const std::vector<SegmentedLayout>& layouts) {
  for (const SegmentedLayout& l : layouts)
    if (param.size() >= l.name_suffix.size() &&
        param.compare(param.size() - l.name_suffix.size(), l.name_suffix.size(), l.name_suffix) == 0) {
      SegmentedLayout any = l;
      any.name_suffix = "";
      return {any};
    }
  return {};
}

/// Compares two global tensors: the largest |got - ref| (or the replicas'
/// disagreement, if larger) against `tolerance`.
TensorCheck CompareTensors(const std::string& what, const GlobalTensor& ref, const GlobalTensor& got,
                           double tolerance, double scale) {
  TensorCheck c;
  c.what = what;
  c.scale = scale;
  c.tolerance = tolerance;
  for (size_t i = 0; i < ref.values.size(); ++i) {
    const double e = std::fabs(static_cast<double>(got.values[i]) - ref.values[i]);
    if (e > c.max_error || std::isnan(e)) {
      c.max_error = std::isnan(e) ? INFINITY : e;
      c.worst_index = static_cast<int64_t>(i);
      c.ref = ref.values[i];
      c.got = got.values[i];
    }
  }
  c.ok = c.max_error <= tolerance && got.replica_error <= tolerance;
  if (got.replica_error > tolerance) c.what += " (ranks holding the same element disagree by " + Num(got.replica_error) + ")";
  return c;
}

/// max |v|.
double MaxAbs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

/// The gradient and parameter checks of Adam op `adam` (grad: input 1;
/// updated parameter: output 0).
Status CheckParameter(const ScheduledProgram& ref_sp, const ExecutionResult& ref_run,
                      const ScheduledProgram& sp, const ExecutionResult& run, const std::string& adam,
                      const Tolerance& tol, const std::vector<SegmentedLayout>& layouts,
                      std::vector<TensorCheck>* grads, std::vector<TensorCheck>* params) {
  const std::string param = adam.size() > 5 && adam.compare(adam.size() - 5, 5, ".adam") == 0
                                ? adam.substr(0, adam.size() - 5)
                                : adam;
  const std::vector<SegmentedLayout> lay = LayoutsFor(param, layouts);
  for (bool output : {false, true}) {
    const int position = output ? 0 : 1;
    Result<GlobalTensor> ref = GatherOpTensor(ref_sp, ref_run, adam, output, position, lay);
    if (!ref.ok()) return Status::Error("reference: " + ref.status().message());
    Result<GlobalTensor> got = GatherOpTensor(sp, run, adam, output, position, lay);
    if (!got.ok()) return got.status();
    if (got->shape != ref->shape)
      return Status::Error("parameter '" + param + "': global shape differs from the reference");
    if (output) {
      params->push_back(CompareTensors("updated parameter '" + param + "'", *ref, *got,
                                       tol.param_abs, 0));
    } else {
      const double scale = MaxAbs(ref->values);
      grads->push_back(CompareTensors("gradient of '" + param + "'", *ref, *got,
                                      tol.grad_rel * scale + tol.grad_abs + 1e-30, scale));
    }
  }
  return Status::Ok();
}

/// "gradient of 'x': max error E at global index I [coords] (reference R,
/// got G), tolerance T".
std::string Describe(const TensorCheck& c, const std::vector<int64_t>& shape) {
  std::string s = c.what + ": max error " + Num(c.max_error) + " at global index " +
                  std::to_string(c.worst_index);
  if (!shape.empty()) s.append(" ").append(Coords(c.worst_index, shape));
  s += " (reference " + Num(c.ref) + ", got " + Num(c.got) + "), tolerance " + Num(c.tolerance);
  if (c.scale > 0) s += " (relative to max |reference| " + Num(c.scale) + ")";
  return s;
}

}  // namespace

std::string ReferenceReport::Summary() const {
  double worst_grad = 0, worst_param = 0;
  std::string grad_name, param_name;
  int grads = 0, params = 0;
  for (const TensorCheck& c : checks) {
    if (c.what.rfind("gradient", 0) == 0) {
      ++grads;
      const double r = c.scale > 0 ? c.max_error / c.scale : c.max_error;
      if (r >= worst_grad) worst_grad = r, grad_name = c.what;
    } else if (c.what.rfind("updated", 0) == 0) {
      ++params;
      if (c.max_error >= worst_param) worst_param = c.max_error, param_name = c.what;
    }
  }
  return "loss " + Num(loss) + " (reference " + Num(reference_loss) + ", diff " +
         Num(std::fabs(loss - reference_loss)) + "); " + std::to_string(grads) + " gradients, worst relative error " +
         Num(worst_grad) + " (" + grad_name + "); " + std::to_string(params) +
         " parameters, worst error " + Num(worst_param) + " (" + param_name + ")";
}

Result<double> StepLoss(const ScheduledProgram& sp, const ExecutionResult& run) {
  const Program& p = sp.program;
  double sum = 0;
  int count = 0;
  for (const RankTensors& rt : run.ranks) {
    const Graph& g = p.GraphOf(p.roles[p.RoleOfRank(rt.rank)]);
    for (const Op& op : g.ops) {
      if (op.kind != OpKind::kCompute || op.compute_type != ComputeType::kCrossEntropy) continue;
      const std::vector<float>* v = rt.Find(op.outputs[0]);
      if (!v || v->empty()) return Status::Error("rank " + std::to_string(rt.rank) + ": no loss value");
      sum += (*v)[0];
      ++count;
    }
  }
  if (count == 0) return Status::Error("program '" + p.name + "' has no cross_entropy op (no loss)");
  return sum / count;
}

namespace {

/// Assembles a global tensor from the ranks' shards: `name_on` gives the
/// name of the tensor on a rank's graph ("" when that rank has none, an
/// error for a malformed request); `what` names the request in messages.
Result<GlobalTensor> GatherShards(const ScheduledProgram& sp, const ExecutionResult& run, const std::string& what,
                                  const std::function<Result<std::string>(const Graph&)>& name_on,
                                  const std::vector<SegmentedLayout>& layouts) {
  const Program& p = sp.program;
  GlobalTensor gt;
  std::vector<char> filled;
  bool found = false;
  for (const RankTensors& rt : run.ranks) {
    const Graph& g = p.GraphOf(p.roles[p.RoleOfRank(rt.rank)]);
    Result<std::string> name = name_on(g);
    if (!name.ok()) return name.status();
    if (name->empty()) continue;
    const Tensor& t = FindTensor(g, *name);
    if (!t.partial.empty())
      return Status::Error("tensor '" + t.name + "' holds a partial sum; it has no global value");
    const std::vector<int64_t> shape = GlobalShape(t, p.mesh);
    if (!found) {
      gt.shape = shape;
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      gt.values.assign(n, 0.0f);
      filled.assign(n, 0);
      found = true;
    } else if (shape != gt.shape) {
      return Status::Error("tensor '" + t.name + "': ranks disagree on its global shape");
    }
    Result<std::vector<int64_t>> idx = LogicalGlobalIndices(t, p.mesh, rt.rank, layouts);
    if (!idx.ok()) return idx.status();
    const std::vector<float>* v = rt.Find(t.name);
    assert(v && v->size() == idx->size());
    for (size_t i = 0; i < idx->size(); ++i) {
      const int64_t gi = (*idx)[i];
      if (filled[gi]) {
        gt.replica_error = std::max(gt.replica_error, std::fabs(static_cast<double>(gt.values[gi]) - (*v)[i]));
      } else {
        gt.values[gi] = (*v)[i];
        filled[gi] = 1;
      }
    }
  }
  if (!found) return Status::Error("no rank of program '" + p.name + "' has " + what);
  if (std::find(filled.begin(), filled.end(), 0) != filled.end())
    return Status::Error(what + ": the ranks' shards do not cover its global tensor");
  return gt;
}

}  // namespace

Result<GlobalTensor> GatherOpTensor(const ScheduledProgram& sp, const ExecutionResult& run,
                                    const std::string& op_name, bool output, int position,
                                    const std::vector<SegmentedLayout>& layouts) {
  auto name_on = [&](const Graph& g) -> Result<std::string> {
    const int oi = FindOp(g, op_name);
    if (oi < 0) return std::string();
    const std::vector<std::string>& names = output ? g.ops[oi].outputs : g.ops[oi].inputs;
    if (position >= static_cast<int>(names.size()))
      return Status::Error("op '" + op_name + "' has no " + (output ? "output " : "input ") + std::to_string(position));
    return names[position];
  };
  return GatherShards(sp, run, "an op named '" + op_name + "'", name_on, layouts);
}

Result<GlobalTensor> GatherTensor(const ScheduledProgram& sp, const ExecutionResult& run,
                                  const std::string& tensor_name, const std::vector<SegmentedLayout>& layouts) {
  auto name_on = [&](const Graph& g) -> Result<std::string> {
    for (const Tensor& t : g.tensors)
      if (t.name == tensor_name) return tensor_name;
    return std::string();
  };
  return GatherShards(sp, run, "a tensor named '" + tensor_name + "'", name_on, layouts);
}

Result<ReferenceReport> CompareToReference(const ScheduledProgram& ref_sp, const ExecutionResult& ref_run,
                                           const ScheduledProgram& sp, const ExecutionResult& run,
                                           const Tolerance& tolerance,
                                           const std::vector<SegmentedLayout>& layouts) {
  ReferenceReport report;
  Result<double> ref_loss = StepLoss(ref_sp, ref_run);
  if (!ref_loss.ok()) return ref_loss.status();
  Result<double> loss = StepLoss(sp, run);
  if (!loss.ok()) return loss.status();
  report.reference_loss = *ref_loss;
  report.loss = *loss;
  TensorCheck lc;
  lc.what = "loss";
  lc.max_error = std::fabs(*loss - *ref_loss);
  lc.tolerance = tolerance.loss_rel * std::max(1.0, std::fabs(*ref_loss));
  lc.ref = *ref_loss;
  lc.got = *loss;
  lc.ok = lc.max_error <= lc.tolerance;
  report.checks.push_back(lc);
  std::vector<TensorCheck> grads, params;
  for (const std::string& adam : AdamOps(ref_sp.program)) {
    Status st = CheckParameter(ref_sp, ref_run, sp, run, adam, tolerance, layouts, &grads, &params);
    if (!st.ok())
      return Status::Error("program '" + sp.program.name + "': " + st.message());
  }
  report.checks.insert(report.checks.end(), grads.begin(), grads.end());
  report.checks.insert(report.checks.end(), params.begin(), params.end());
  int bad = 0;
  const TensorCheck* first = nullptr;
  for (const TensorCheck& c : report.checks)
    if (!c.ok && ++bad == 1) first = &c;
  if (!first) return report;
  // The shape of the first diverging tensor, for its coordinates.
  std::vector<int64_t> shape;
  if (first->what != "loss") {
    const std::string name = first->what.substr(first->what.find('\'') + 1);
    const std::string param = name.substr(0, name.find('\''));
    Result<GlobalTensor> g = GatherOpTensor(sp, run, param + ".adam", true, 0, LayoutsFor(param, layouts));
    if (g.ok()) shape = g->shape;
  }
  return Status::Error("program '" + sp.program.name + "' (scheduler '" + sp.schedule.scheduler +
                       "') diverges from the reference: first diverging tensor: " +
                       Describe(*first, shape) + "; " + std::to_string(bad) + " of " +
                       std::to_string(report.checks.size()) + " checks fail. " + report.Summary());
}

SegmentedLayout FusedQkvLayout(int64_t q_width, int64_t kv_width) {
  return SegmentedLayout{".attn.qkv.w", 1, {q_width, kv_width, kv_width}};
}

}  // namespace concerto
