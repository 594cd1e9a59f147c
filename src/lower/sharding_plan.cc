// Sharding files: parsing and checks, and lowering a decoder model
// unsharded with the plan's global batch before partitioning it
// (src/lower/partitioner.cc). Syntax: docs/frontends.md.
#include "concerto/lower/sharding_plan.h"
#include "concerto/util/input_file.h"
#include "concerto/util/json_text.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "concerto/ir/json_io.h"
#include "concerto/lower/plan.h"
#include "concerto/lower/transformer.h"

namespace concerto {
namespace {

using ojson = nlohmann::ordered_json;


/// Reads one sharding file's JSON into a ShardingPlan.
class ShardingParser {
 public:
  ShardingParser(const ojson& root, const std::string& source) : root_(root), source_(source) {}

  Result<ShardingPlan> Parse() {
    if (!root_.is_object()) return Fail("the file must hold one JSON object");
    plan_.source = source_;
    for (const auto& [key, value] : root_.items()) {
      if (key != "mesh" && key != "default" && key != "tensors" && key != "global_batch" &&
          key != "description" && key != "regather")
        return Fail("field '" + key +
                    "': unknown field (known: mesh, default, tensors, regather, global_batch, description)");
    }
    if (!root_.contains("mesh")) return Fail("field 'mesh': missing required field");
    CONCERTO_RETURN_IF_ERROR(ParseMesh(root_["mesh"]));
    if (root_.contains("default")) {
      const ojson& d = root_["default"];
      if (!d.is_string() || d.get<std::string>() != "replicated")
        return Fail("field 'default': only \"replicated\" is supported, got " + DescribeJson(d));
    }
    if (root_.contains("global_batch")) {
      const ojson& b = root_["global_batch"];
      if (!b.is_number_integer() || b.get<int64_t>() < 1)
        return Fail("field 'global_batch': must be a positive integer, got " + DescribeJson(b));
      plan_.global_batch = b.get<int64_t>();
    }
    if (root_.contains("tensors")) {
      const ojson& t = root_["tensors"];
      if (!t.is_object()) return Fail("field 'tensors': expected an object of pattern -> sharding");
      for (const auto& [pattern, spec] : t.items()) {
        Result<ShardingRule> rule = ParseRule(pattern, spec);
        if (!rule.ok()) return rule.status();
        plan_.rules.push_back(std::move(rule).value());
      }
    }
    if (root_.contains("regather")) {
      const ojson& r = root_["regather"];
      if (!r.is_array()) return Fail("field 'regather': expected a list of patterns of 'tensors'");
      for (const ojson& p : r) {
        if (!p.is_string()) return Fail("field 'regather': expected a pattern (string), got " + DescribeJson(p));
        auto it = std::find_if(plan_.rules.begin(), plan_.rules.end(),
                               [&](const ShardingRule& rule) { return rule.pattern == p.get<std::string>(); });
        if (it == plan_.rules.end())
          return Fail("field 'regather': pattern '" + p.get<std::string>() + "' is not a key of 'tensors'");
        it->regather = true;
      }
    }
    return plan_;
  }

 private:
  Status Fail(const std::string& what) const { return Status::Error(source_ + ": " + what); }

  Status ParseMesh(const ojson& mesh) {
    if (!mesh.is_object() || mesh.empty())
      return Fail("field 'mesh': expected a non-empty object of axis -> size, e.g. {\"dp\": 2, \"tp\": 4}");
    int64_t ranks = 1;
    for (const auto& [name, size] : mesh.items()) {
      if (name.empty()) return Fail("mesh: an axis name is empty");
      if (!size.is_number_integer() || size.get<int64_t>() < 1)
        return Fail("mesh: axis '" + name + "': size must be an integer >= 1, got " + DescribeJson(size));
      ranks *= size.get<int64_t>();
      if (ranks > (int64_t{1} << 20)) return Fail("mesh: more than 2^20 ranks");
      plan_.mesh.axes.push_back({name, static_cast<int>(size.get<int64_t>())});
    }
    return Status::Ok();
  }

  /// One axis name of `where`, which must be a mesh axis.
  Result<std::string> Axis(const ojson& v, const std::string& where) const {
    if (!v.is_string()) return Fail(where + ": expected a mesh axis name, got " + DescribeJson(v));
    const std::string a = v.get<std::string>();
    if (plan_.mesh.AxisIndex(a) < 0) {
      std::string known;
      for (const MeshAxis& m : plan_.mesh.axes) known += (known.empty() ? "" : ", ") + m.name;
      return Fail(where + ": unknown mesh axis '" + a + "' (mesh axes: " + known + ")");
    }
    return a;
  }

  /// A list of axes: "a", ["a", "b"], [] or null.
  Result<std::vector<std::string>> AxisList(const ojson& v, const std::string& where) const {
    std::vector<std::string> axes;
    if (v.is_null()) return axes;
    if (v.is_string()) {
      Result<std::string> a = Axis(v, where);
      if (!a.ok()) return a.status();
      axes.push_back(*a);
      return axes;
    }
    if (!v.is_array()) return Fail(where + ": expected an axis, a list of axes or [], got " + DescribeJson(v));
    for (const ojson& e : v) {
      Result<std::string> a = Axis(e, where);
      if (!a.ok()) return a.status();
      axes.push_back(*a);
    }
    return axes;
  }

  Result<DimSharding> ParseDim(const ojson& v, const std::string& where) const {
    DimSharding dim;
    if (!v.is_object()) {
      Result<std::vector<std::string>> axes = AxisList(v, where);
      if (!axes.ok()) return axes.status();
      dim.axes = *axes;
      return dim;
    }
    for (const auto& [key, value] : v.items()) {
      if (key == "axes") {
        Result<std::vector<std::string>> axes = AxisList(value, where + ": field 'axes'");
        if (!axes.ok()) return axes.status();
        dim.axes = *axes;
      } else if (key == "segments") {
        if (!value.is_array() || value.empty())
          return Fail(where + ": field 'segments': expected a non-empty list of sizes");
        for (const ojson& s : value) {
          if (!s.is_number_integer() || s.get<int64_t>() < 1)
            return Fail(where + ": field 'segments': sizes must be integers >= 1, got " + DescribeJson(s));
          dim.segments.push_back(s.get<int64_t>());
        }
      } else {
        return Fail(where + ": field '" + key + "': unknown field (known: axes, segments)");
      }
    }
    return dim;
  }

  Result<ShardingRule> ParseRule(const std::string& pattern, const ojson& spec) const {
    ShardingRule rule;
    rule.pattern = pattern;
    const std::string where = "tensors: pattern '" + pattern + "'";
    if (pattern.empty()) return Fail("tensors: an empty pattern");
    if (spec.is_string()) {
      if (spec.get<std::string>() != "replicated")
        return Fail(where + ": expected \"replicated\" or one entry per dimension, got " + DescribeJson(spec));
      rule.replicated = true;
      return rule;
    }
    if (!spec.is_array())
      return Fail(where + ": expected \"replicated\" or one entry per dimension, got " + DescribeJson(spec));
    std::set<std::string> used;
    for (size_t d = 0; d < spec.size(); ++d) {
      Result<DimSharding> dim = ParseDim(spec[d], where + ": dim " + std::to_string(d));
      if (!dim.ok()) return dim.status();
      for (const std::string& a : dim->axes)
        if (!used.insert(a).second)
          return Fail(where + ": mesh axis '" + a + "' is used twice in one tensor (an axis shards at most one dimension, once)");
      rule.dims.push_back(std::move(dim).value());
    }
    return rule;
  }

  const ojson& root_;
  std::string source_;
  ShardingPlan plan_;
};

/// Whether `name` matches glob `pattern` ('*' any run, '?' one character).
bool GlobMatch(const std::string& pattern, const std::string& name) {
  size_t p = 0, n = 0, star = std::string::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = n;
    } else if (star != std::string::npos) {
      p = star + 1;
      n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace

// Exposed to the partitioner (same library, declared there).
bool ShardingGlobMatch(const std::string& pattern, const std::string& name) {
  return GlobMatch(pattern, name);
}

Result<ShardingPlan> ParseShardingPlan(const std::string& text, const std::string& source) {
  Result<ojson> root = ParseJsonDocument<ojson>(text, source);
  if (!root.ok()) return root.status();
  return ShardingParser(*root, source).Parse();
}

std::string ShardingPlanJson(const ShardingPlan& plan) {
  ojson mesh = ojson::object(), tensors = ojson::object();
  for (const MeshAxis& a : plan.mesh.axes) mesh[a.name] = a.size;
  for (const ShardingRule& rule : plan.rules) {
    if (rule.replicated) {
      tensors[rule.pattern] = "replicated";
      continue;
    }
    ojson dims = ojson::array();
    for (const DimSharding& d : rule.dims) {
      if (d.segments.empty()) dims.push_back(d.axes);
      else dims.push_back(ojson{{"axes", d.axes}, {"segments", d.segments}});
    }
    tensors[rule.pattern] = std::move(dims);
  }
  ojson root = {{"mesh", mesh}, {"default", "replicated"}, {"tensors", tensors}};
  ojson regather = ojson::array();
  for (const ShardingRule& rule : plan.rules)
    if (rule.regather) regather.push_back(rule.pattern);
  if (!regather.empty()) root["regather"] = std::move(regather);
  if (plan.global_batch) root["global_batch"] = *plan.global_batch;
  return root.dump(2);
}

Result<ShardingPlan> LoadShardingPlan(const std::string& path) {
  Result<std::string> text = ReadInputFile(path, "sharding file", kMaxSmallInputBytes);
  if (!text.ok()) return text.status();
  return ParseShardingPlan(*text, path);
}

Status CheckShardingWorld(const ShardingPlan& plan, int world_size) {
  const int ranks = plan.mesh.NumRanks();
  if (ranks == world_size) return Status::Ok();
  std::string product;
  for (const MeshAxis& a : plan.mesh.axes)
    product += (product.empty() ? "" : " x ") + a.name + "=" + std::to_string(a.size);
  return Status::Error(plan.source + ": field 'mesh': the axes multiply to " + std::to_string(ranks) +
                       " ranks (" + product + ") but the world has " + std::to_string(world_size));
}

Result<Program> LowerModelSharding(const std::string& model, const ShardingPlan& plan,
                                   PartitionReport* report) {
  Result<ModelConfig> config = LoadModel(model);
  if (!config.ok()) return config.status();
  ModelConfig unsharded = *config;
  if (plan.global_batch) {
    unsharded.batch = static_cast<int>(*plan.global_batch);
  } else {
    // The model's batch is per data-parallel rank: scale it by the axes that shard the tokens' batch.
    for (const ShardingRule& rule : plan.rules) {
      if (!GlobMatch(rule.pattern, "tokens")) continue;
      if (!rule.replicated && !rule.dims.empty())
        for (const std::string& a : rule.dims[0].axes)
          unsharded.batch *= plan.mesh.axes[plan.mesh.AxisIndex(a)].size;
      break;
    }
  }
  Result<Program> program = LowerTransformer(unsharded, ParallelPlan{});
  if (!program.ok()) return program.status();
  return PartitionProgram(*program, plan, report);
}

}  // namespace concerto
