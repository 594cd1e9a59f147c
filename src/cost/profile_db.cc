// The profile database (measured durations keyed by device and op signature),
// the cost model that consults it, and the per-source cost summary.
// Format and signature scheme: docs/cost-model.md, "Profile database".
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "concerto/cost/cost_model.h"
#include "concerto/ir/op_registry.h"
#include "concerto/util/input_file.h"
#include "concerto/util/json_text.h"

namespace concerto {
namespace {

constexpr const char* kProfileFormat = "concerto-profile";
constexpr int kProfileVersion = 1;

/// Whether attribute `key` of a `type` op changes its running time (the op
/// registry's `timing` flag); the rest, such as eps, lr or step, do not, and
/// would only split the profile's keys.
bool IsTimingAttr(ComputeType type, const std::string& key) {
  const AttrInfo* a = FindAttr(type, key);
  return a != nullptr && a->timing;
}

/// A number as it appears in a signature: integers without a decimal point.
std::string SigNumber(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

/// The tensor called `name`, or nullptr when the index does not resolve it.
const Tensor* FindTensor(const PriceContext& ctx, const std::string& name) {
  auto it = ctx.index.tensor.find(name);
  if (it == ctx.index.tensor.end() || it->second < 0 ||
      it->second >= static_cast<int>(ctx.graph.tensors.size()))
    return nullptr;
  return &ctx.graph.tensors[it->second];
}

/// The dtype an op is keyed by: first output's, else first input's, else bf16
/// (the same rule the analytic model prices by).
DType KeyDType(const Op& op, const PriceContext& ctx) {
  if (!op.outputs.empty())
    if (const Tensor* t = FindTensor(ctx, op.outputs.front())) return t->dtype;
  if (!op.inputs.empty())
    if (const Tensor* t = FindTensor(ctx, op.inputs.front())) return t->dtype;
  return DType::kBF16;
}

/// "[8,2048,4096]" (prefixed by the dtype when it differs from the op's),
/// joined by "x"; "?" for a tensor the index does not resolve. Sets
/// *unresolved when any name is unresolved.
std::string ShapeList(const std::vector<std::string>& names, const PriceContext& ctx,
                      DType op_dtype, bool* unresolved) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i) out += "x";
    const Tensor* t = FindTensor(ctx, names[i]);
    if (!t) {
      out += "?";
      *unresolved = true;
      continue;
    }
    if (t->dtype != op_dtype) out += ToString(t->dtype);
    out += "[";
    for (size_t k = 0; k < t->shape.size(); ++k) {
      if (k) out += ",";
      out += std::to_string(t->shape[k]);
    }
    out += "]";
  }
  return out;
}

/// "intra" when both ranks share a node, else "inter".
std::string Placement(bool one_node) { return one_node ? "intra" : "inter"; }

/// The op's explicit duration when it is usable (finite, non-negative).
std::optional<double> ExplicitUs(const Op& op) {
  if (op.duration_us && std::isfinite(*op.duration_us) && *op.duration_us >= 0)
    return *op.duration_us;
  return std::nullopt;
}

}  // namespace

std::string ProfileDb::Signature(const Op& op, const PriceContext& ctx, const ClusterSpec& cluster) {
  const DType dtype = KeyDType(op, ctx);
  const std::string dt(ToString(dtype));
  const std::string bytes = "bytes=" + std::to_string(std::max<int64_t>(op.message_bytes, 0));
  switch (op.kind) {
    case OpKind::kCompute: {
      bool unresolved = false;
      std::string sig = std::string(ToString(op.compute_type)) + "|" + dt + "|" +
                        ShapeList(op.inputs, ctx, dtype, &unresolved) + "->" +
                        ShapeList(op.outputs, ctx, dtype, &unresolved) + "|";
      std::string attrs;
      for (const auto& [key, value] : op.attrs)  // std::map: sorted by key
        if (IsTimingAttr(op.compute_type, key)) attrs += (attrs.empty() ? "" : ",") + key + "=" + SigNumber(value);
      sig += attrs;
      if (unresolved) sig += "|flops=" + SigNumber(op.flops) + ",bytes=" + SigNumber(op.bytes);
      return sig;
    }
    case OpKind::kCopy:
      return "copy|" + dt + "|bytes=" + SigNumber(std::max(op.bytes, 0.0));
    case OpKind::kCollective: {
      std::vector<int> ranks = GroupRanks(ctx.mesh, op.group, ctx.rank);
      std::set<int> nodes;
      for (int r : ranks) nodes.insert(cluster.NodeOf(r));
      std::string where = nodes.size() <= 1 ? "intra" : "nodes=" + std::to_string(nodes.size());
      return std::string(ToString(op.collective)) + "|" + dt + "|" + bytes +
             "|n=" + std::to_string(ranks.size()) + "|" + where;
    }
    case OpKind::kSend:
    case OpKind::kRecv: {
      const int peer = PeerRank(ctx.mesh, op.peer, ctx.rank);
      const bool one_node = peer >= 0 && cluster.NodeOf(peer) == cluster.NodeOf(ctx.rank);
      return std::string(ToString(op.kind)) + "|" + dt + "|" + bytes + "|" + Placement(one_node);
    }
  }
  return "?";
}

void ProfileDb::Add(const std::string& device, const std::string& signature, double duration_us) {
  assert(std::isfinite(duration_us) && duration_us >= 0 && duration_us <= kMaxProfiledUs &&
         "profiled duration must be finite, in [0, kMaxProfiledUs]");
  entries_[{device, signature}] = duration_us;
}

double ProfileDb::Lookup(const std::string& device, const std::string& signature) const {
  auto it = entries_.find({device, signature});
  return it == entries_.end() ? -1 : it->second;
}

Result<ProfileDb> ProfileDb::Read(const std::string& path) {
  Result<std::string> text = ReadInputFile(path, "profile database", kMaxLargeInputBytes);
  if (!text.ok()) return text.status();
  return Parse(*text, path);
}

Result<ProfileDb> ProfileDb::Parse(const std::string& text, const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return Status::Error(path + ": JSON parse error: " + e.what());
  }
  if (!j.is_object()) return Status::Error(path + ": top level must be an object");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "format" && it.key() != "version" && it.key() != "entries")
      return Status::Error(path + ": field '" + it.key() +
                           "': unknown key (known: format, version, entries)");
  if (!j.contains("format") || !j["format"].is_string() || j["format"] != kProfileFormat)
    return Status::Error(path + ": field 'format': must be \"" + kProfileFormat + "\", got " +
                         (j.contains("format") ? DescribeJson(j["format"]) : "nothing"));
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"] != kProfileVersion)
    return Status::Error(path + ": field 'version': this build reads version " +
                         std::to_string(kProfileVersion) + ", got " +
                         (j.contains("version") ? DescribeJson(j["version"]) : "nothing"));
  if (!j.contains("entries") || !j["entries"].is_array())
    return Status::Error(path + ": field 'entries': must be a list, got " +
                         (j.contains("entries") ? DescribeJson(j["entries"]) : "nothing"));
  ProfileDb db;
  std::map<std::pair<std::string, std::string>, size_t> first_seen;
  const auto& entries = j["entries"];
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    const std::string where = path + ": entry " + std::to_string(i);
    if (!e.is_object()) return Status::Error(where + ": must be an object, got " + DescribeJson(e));
    for (auto it = e.begin(); it != e.end(); ++it)
      if (it.key() != "device" && it.key() != "signature" && it.key() != "duration_us")
        return Status::Error(where + ": field '" + it.key() +
                             "': unknown key (known: device, signature, duration_us)");
    for (const char* field : {"device", "signature"})
      if (!e.contains(field) || !e[field].is_string() || e[field].get<std::string>().empty())
        return Status::Error(where + ": field '" + field + "': must be a non-empty string, got " +
                             (e.contains(field) ? DescribeJson(e[field]) : "nothing"));
    if (!e.contains("duration_us") || !e["duration_us"].is_number() ||
        !std::isfinite(e["duration_us"].get<double>()) || e["duration_us"].get<double>() < 0 ||
        e["duration_us"].get<double>() > kMaxProfiledUs)
      return Status::Error(where + ": field 'duration_us': must be a number in [0, 1e12] us, got " +
                           (e.contains("duration_us") ? DescribeJson(e["duration_us"]) : "nothing"));
    std::pair<std::string, std::string> key = {e["device"].get<std::string>(),
                                               e["signature"].get<std::string>()};
    auto [pos, inserted] = first_seen.emplace(key, i);
    if (!inserted)
      return Status::Error(where + ": duplicates entry " + std::to_string(pos->second) +
                           " (same device and signature)");
    db.Add(key.first, key.second, e["duration_us"].get<double>());
  }
  return db;
}

std::string ProfileDb::Write() const {
  nlohmann::ordered_json j;
  j["format"] = kProfileFormat;
  j["version"] = kProfileVersion;
  j["entries"] = nlohmann::ordered_json::array();
  for (const auto& [key, duration_us] : entries_)
    j["entries"].push_back(
        {{"device", key.first}, {"signature", key.second}, {"duration_us", duration_us}});
  return DumpJson(j, 2) + "\n";
}

PricedOp ProfiledCostModel::Price(const Op& op, const PriceContext& ctx) const {
  // Explicit and measured times keep the analytic model's link shares.
  auto load = [&](double us) {
    return op.IsComm() ? analytic_.LoadOf(analytic_.CommTimeOf(op, ctx), us) : LinkLoad{};
  };
  if (auto us = ExplicitUs(op)) return {*us, CostSource::kExplicit, load(*us)};
  const double measured = db_.Lookup(cluster().device.name, ProfileDb::Signature(op, ctx, cluster()));
  if (measured >= 0) return {measured, CostSource::kProfile, load(measured)};
  return analytic_.Price(op, ctx);
}

CostReport SummarizeCosts(const Program& program, const CostModel& model) {
  CostReport report;
  std::map<int, GraphIndex> indexes;  // by position in program.graphs; built once per graph
  for (const Role& role : program.roles) {
    const int g = program.GraphIndex(role.graph);
    assert(g >= 0 && "role names an unknown graph");
    const Graph& graph = program.graphs[g];
    auto it = indexes.find(g);
    if (it == indexes.end()) it = indexes.emplace(g, GraphIndex::Build(graph)).first;
    const PriceContext ctx{graph, it->second, program.mesh, role.ranks.empty() ? 0 : role.ranks.front()};
    for (const Op& op : graph.ops) {
      switch (model.Price(op, ctx).source) {
        case CostSource::kExplicit: ++report.explicit_ops; break;
        case CostSource::kProfile: ++report.profiled_ops; break;
        case CostSource::kAnalytic: ++report.analytic_ops; break;
      }
    }
  }
  return report;
}

}  // namespace concerto
