// Parallel plans: parsing "dp=4,tp=8,sp,zero=2" and checking a plan against
// a model. Every error names the item or the constraint that failed.
#include "concerto/lower/plan.h"
#include "concerto/util/did_you_mean.h"
#include "concerto/util/input_file.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <numeric>
#include <cassert>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "concerto/lower/transformer.h"

namespace concerto {
namespace {

/// Largest accepted degree (keeps products of degrees far from overflow).
constexpr int kMaxDegree = 1 << 20;

constexpr const char* kKnownKeys =
    "dp, tp, pp, ep, sp, zero, microbatches, dap, vstages, order, recompute";

/// `text` without leading and trailing spaces and tabs.
std::string Trim(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  const size_t last = text.find_last_not_of(" \t");
  return text.substr(first, last - first + 1);
}

/// The default order of the plan's mesh axes, innermost first: tp, dp, pp.
const std::vector<std::string>& DefaultOrder() {
  static const std::vector<std::string> order = {"tp", "dp", "pp"};
  return order;
}

/// `order` as written in plan text: the axes joined by '-'.
std::string JoinOrder(const std::vector<std::string>& order) {
  std::string s;
  for (const std::string& axis : order) s += (s.empty() ? "" : "-") + axis;
  return s;
}

/// The effective order of `plan` (innermost first): its `order`, or the
/// default, without pp when pp = 1.
std::vector<std::string> EffectiveOrder(const ParallelPlan& plan) {
  std::vector<std::string> order = plan.order.empty() ? DefaultOrder() : plan.order;
  if (plan.pp == 1) order.erase(std::remove(order.begin(), order.end(), "pp"), order.end());
  return order;
}

/// The items of a comma-separated list, trimmed, empty ones dropped.
std::vector<std::string> SplitItems(const std::string& text) {
  std::vector<std::string> items;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = Trim(text.substr(pos, comma - pos));
    if (!item.empty()) items.push_back(std::move(item));
    pos = comma + 1;
  }
  return items;
}

/// Parses plan items one at a time into a ParallelPlan.
class PlanParser {
 public:
  explicit PlanParser(const std::string& text) : text_(text) {}

  /// Parses every item, then the checks that span items.
  Result<ParallelPlan> Parse() {
    for (const std::string& item : SplitItems(text_)) CONCERTO_RETURN_IF_ERROR(ParseItem(item));
    if (plan_.sp && plan_.tp <= 1)
      return Error("sp (sequence parallelism) shards over the tp group and needs tp > 1, got tp=" +
                   std::to_string(plan_.tp));
    Status order = CheckAxisOrder(plan_);
    if (!order.ok()) return Error(order.message());
    ParallelPlan default_order = plan_;
    default_order.order.clear();
    if (EffectiveOrder(plan_) == EffectiveOrder(default_order)) plan_.order.clear();
    return plan_;
  }

 private:
  /// "plan '<text>': <what>".
  Status Error(const std::string& what) const {
    return Status::Error("plan '" + text_ + "': " + what);
  }
  /// "plan '<text>': item '<item>': <what>".
  Status ItemError(const std::string& item, const std::string& what) const {
    return Error("item '" + item + "': " + what);
  }

  /// One "key=value" or bare-flag item.
  Status ParseItem(const std::string& item) {
    const size_t eq = item.find('=');
    const std::string key = Trim(item.substr(0, eq));
    const bool has_value = eq != std::string::npos;
    const std::string value = has_value ? Trim(item.substr(eq + 1)) : "";
    if (!IsKnown(key))
      return ItemError(item, "unknown key '" + key + "'" + DidYouMean(key, PlanKeys()) + " (known: " +
                                 std::string(kKnownKeys) + ")");
    if (!seen_.insert(key).second) return ItemError(item, "key '" + key + "' is given twice");
    if (key == "sp") return ParseFlag(item, key, has_value, value);
    if (key == "order") return ParseOrder(item, has_value, value);
    if (key == "recompute") return ParseRecompute(item, value);
    if (!has_value) return ItemError(item, "'" + key + "' needs a value (" + key + "=N)");
    if (key == "zero") return ParseInt(item, key, value, 0, 3, &plan_.zero);
    return ParseInt(item, key, value, 1, kMaxDegree, IntField(key));
  }

  /// Whether `key` is a plan key.
  static const std::vector<std::string>& PlanKeys() {
    static const std::vector<std::string> kKeys = {"dp",  "tp",           "pp",      "ep",    "sp",       "zero",
                                                   "dap", "microbatches", "vstages", "order", "recompute"};
    return kKeys;
  }
  static bool IsKnown(const std::string& key) {
    const std::vector<std::string>& keys = PlanKeys();
    return std::find(keys.begin(), keys.end(), key) != keys.end();
  }

  /// The integer field of a degree key (dp, tp, pp, ep, dap, microbatches).
  int* IntField(const std::string& key) {
    if (key == "dp") return &plan_.dp;
    if (key == "dap") return &plan_.dap;
    if (key == "tp") return &plan_.tp;
    if (key == "pp") return &plan_.pp;
    if (key == "ep") return &plan_.ep;
    if (key == "vstages") return &plan_.vstages;
    return &plan_.microbatches;
  }

  /// "order=a-b-c": mesh axes innermost first (checked once every item is read).
  Status ParseOrder(const std::string& item, bool has_value, const std::string& value) {
    if (!has_value || value.empty())
      return ItemError(item, "'order' needs the mesh axes innermost first, e.g. order=dp-tp-pp");
    size_t pos = 0;
    while (pos <= value.size()) {
      size_t dash = value.find('-', pos);
      if (dash == std::string::npos) dash = value.size();
      plan_.order.push_back(Trim(value.substr(pos, dash - pos)));
      pos = dash + 1;
    }
    return Status::Ok();
  }

  /// "recompute=none|selective|full".
  Status ParseRecompute(const std::string& item, const std::string& value) {
    for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull})
      if (value == ToString(r)) {
        plan_.recompute = r;
        return Status::Ok();
      }
    return ItemError(item, "recompute must be none, selective or full, got '" + value + "'");
  }

  /// A flag: bare ("sp"), or "=1" / "=0".
  Status ParseFlag(const std::string& item, const std::string& key, bool has_value,
                   const std::string& value) {
    bool* flag = &plan_.sp;
    if (!has_value || value == "1") {
      *flag = true;
    } else if (value == "0") {
      *flag = false;
    } else {
      return ItemError(item, "'" + key + "' is a flag: write '" + key + "' or " + key + "=1 / " +
                                 key + "=0, got '" + value + "'");
    }
    return Status::Ok();
  }

  /// An integer value in [lo, hi].
  Status ParseInt(const std::string& item, const std::string& key, const std::string& value,
                  int lo, int hi, int* out) {
    int n = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    const bool whole = ec == std::errc() && end == value.data() + value.size() && !value.empty();
    if (!whole || n < lo || n > hi) {
      const std::string range = key == "zero" ? "0, 1, 2 or 3"
                                              : "an integer from " + std::to_string(lo) + " to " +
                                                    std::to_string(hi);
      return ItemError(item, key + " must be " + range + ", got '" + value + "'");
    }
    *out = n;
    return Status::Ok();
  }

  const std::string& text_;
  ParallelPlan plan_;
  std::set<std::string> seen_;
};

/// Checks plans against a model; Fail() prefixes the plan and model.
class PlanChecker {
 public:
  PlanChecker(const ModelConfig& model, const ParallelPlan& plan, int world_size)
      : m_(model), p_(plan), world_(world_size) {}

  /// Every constraint, in the order documented in plan.h.
  Status Check() const {
    CONCERTO_RETURN_IF_ERROR(Degrees());
    CONCERTO_RETURN_IF_ERROR(WorldSize());
    CONCERTO_RETURN_IF_ERROR(TensorParallel());
    CONCERTO_RETURN_IF_ERROR(Pipeline());
    CONCERTO_RETURN_IF_ERROR(Experts());
    CONCERTO_RETURN_IF_ERROR(Zero());
    if (p_.dap > 1)
      return Fail("dap (dynamic axial parallelism) needs an Evoformer model; '" + m_.name +
                  "' is a " + std::string(ToString(m_.family)) + " decoder");
    return Status::Ok();
  }

 private:
  /// "plan '<plan>' for model '<name>': <what>".
  Status Fail(const std::string& what) const {
    return Status::Error("plan '" + PlanToString(p_) + "' for model '" + m_.name + "': " + what);
  }
  /// Error unless `divisor` divides `value`, as "tp (3) must divide heads (4)".
  Status Divides(const std::string& divisor_name, int64_t divisor, const std::string& value_name,
                 int64_t value) const {
    if (divisor > 0 && value % divisor == 0) return Status::Ok();
    return Fail(divisor_name + " (" + std::to_string(divisor) + ") must divide " + value_name +
                " (" + std::to_string(value) + ")");
  }
  /// Error unless value >= lo.
  Status AtLeast(const std::string& name, int value, int lo) const {
    if (value >= lo) return Status::Ok();
    return Fail(name + " must be >= " + std::to_string(lo) + ", got " + std::to_string(value));
  }

  /// Degrees >= 1, zero in 0..3, sp with tp > 1.
  Status Degrees() const {
    CONCERTO_RETURN_IF_ERROR(AtLeast("dp", p_.dp, 1));
    CONCERTO_RETURN_IF_ERROR(AtLeast("tp", p_.tp, 1));
    CONCERTO_RETURN_IF_ERROR(AtLeast("pp", p_.pp, 1));
    CONCERTO_RETURN_IF_ERROR(AtLeast("ep", p_.ep, 1));
    CONCERTO_RETURN_IF_ERROR(AtLeast("microbatches", p_.microbatches, 1));
    CONCERTO_RETURN_IF_ERROR(AtLeast("vstages", p_.vstages, 1));
    Status order = CheckAxisOrder(p_);
    if (!order.ok()) return Fail(order.message());
    if (p_.zero < 0 || p_.zero > 3)
      return Fail("zero must be 0, 1, 2 or 3, got " + std::to_string(p_.zero));
    if (p_.sp && p_.tp <= 1) return Fail("sp (sequence parallelism) needs tp > 1");
    return Status::Ok();
  }

  /// tp*pp divides the world size and dp*tp*pp equals it (when it is given).
  Status WorldSize() const {
    if (world_ <= 0) return Status::Ok();
    const int64_t tp_pp = int64_t{p_.tp} * p_.pp;
    const int64_t all = tp_pp * p_.dp;
    if (world_ % tp_pp != 0)
      return Fail("tp x pp (" + std::to_string(tp_pp) + ") must divide the world size (" +
                  std::to_string(world_) + ")");
    if (all != world_)
      return Fail("dp x tp x pp (" + std::to_string(all) + ") must equal the world size (" +
                  std::to_string(world_) + "); dp=" + std::to_string(world_ / tp_pp) + " would");
    return Status::Ok();
  }

  /// tp divides heads, kv_heads, vocab, ffn_hidden (and seq under sp).
  Status TensorParallel() const {
    CONCERTO_RETURN_IF_ERROR(Divides("tp", p_.tp, "heads", m_.heads));
    CONCERTO_RETURN_IF_ERROR(Divides("tp", p_.tp, "kv_heads", m_.kv_heads));
    if (p_.tp > 0 && m_.vocab % p_.tp != 0) {
      // Megatron pads the vocabulary to a multiple of 128 x tp
      // (--make-vocab-size-divisible-by); say which size that is.
      const int64_t multiple = int64_t{128} * p_.tp;
      const int64_t padded = (int64_t{m_.vocab} + multiple - 1) / multiple * multiple;
      return Fail("tp (" + std::to_string(p_.tp) + ") must divide vocab (" + std::to_string(m_.vocab) +
                  "): pad the vocabulary as Megatron does, to a multiple of 128 x tp, e.g. vocab: " +
                  std::to_string(padded) + " in the model spec");
    }
    CONCERTO_RETURN_IF_ERROR(Divides("tp", p_.tp, "ffn_hidden", m_.ffn_hidden));
    if (p_.sp) CONCERTO_RETURN_IF_ERROR(Divides("tp (sequence parallel)", p_.tp, "seq", m_.seq));
    return Status::Ok();
  }

  /// pp divides layers; 1F1B needs microbatches >= pp. Interleaved 1F1B
  /// (vstages > 1) needs pp > 1, pp x vstages dividing layers and
  /// microbatches a multiple of pp (Megatron's schedule runs them in groups
  /// of pp).
  Status Pipeline() const {
    CONCERTO_RETURN_IF_ERROR(Divides("pp", p_.pp, "layers", m_.layers));
    // Every micro-batch repeats a stage's ops: the lowered program grows with
    // layers x micro-batches, so both are bounded before anything is built.
    constexpr int64_t kMaxMicrobatches = 4096;
    if (p_.microbatches > kMaxMicrobatches)
      return Fail("microbatches must be at most " + std::to_string(kMaxMicrobatches) + ", got " +
                  std::to_string(p_.microbatches));
    if (int64_t{m_.layers} * p_.microbatches > kMaxLayerMicrobatches)
      return Fail("layers x microbatches must be at most " + std::to_string(kMaxLayerMicrobatches) + " (" +
                  std::to_string(m_.layers) + " x " + std::to_string(p_.microbatches) +
                  "): the program would have too many ops");
    if (p_.pp > 1 && p_.microbatches < p_.pp)
      return Fail("1F1B needs microbatches >= pp, got microbatches=" +
                  std::to_string(p_.microbatches) + " < pp=" + std::to_string(p_.pp));
    if (p_.vstages == 1) return Status::Ok();
    if (p_.pp == 1)
      return Fail("vstages (" + std::to_string(p_.vstages) +
                  ", interleaved 1F1B) needs pipeline stages, got pp=1");
    CONCERTO_RETURN_IF_ERROR(
        Divides("pp x vstages", int64_t{p_.pp} * p_.vstages, "layers", m_.layers));
    if (p_.microbatches % p_.pp != 0)
      return Fail("interleaved 1F1B (vstages=" + std::to_string(p_.vstages) +
                  ") needs microbatches to be a multiple of pp, got microbatches=" +
                  std::to_string(p_.microbatches) + " with pp=" + std::to_string(p_.pp));
    return Status::Ok();
  }

  /// ep > 1 needs a mixture of experts whose expert count it divides, and
  /// divides dp (the ep group is carved out of the data-parallel ranks); ep
  /// does not combine with ZeRO; no MoE model runs under sp.
  Status Experts() const {
    if (IsMoe(m_) && p_.sp)
      return Fail("sp (sequence parallelism) is not supported with a mixture-of-experts model "
                  "(the MoE layer routes whole sequences)");
    if (p_.ep <= 1) return Status::Ok();
    if (!IsMoe(m_))
      return Fail("ep (" + std::to_string(p_.ep) +
                  ") must divide the number of experts, and '" + m_.name + "' is a dense " +
                  std::string(ToString(m_.family)) + " decoder with no experts");
    CONCERTO_RETURN_IF_ERROR(Divides("ep", p_.ep, "experts", m_.experts));
    if (p_.dp % p_.ep != 0)
      return Fail("ep (" + std::to_string(p_.ep) + ") must divide dp (" + std::to_string(p_.dp) +
                  "): the expert-parallel group is carved out of the data-parallel ranks; e.g. dp=" +
                  std::to_string((p_.dp + p_.ep - 1) / p_.ep * p_.ep) + ",ep=" + std::to_string(p_.ep) +
                  " or ep=" + std::to_string(std::gcd(p_.dp, p_.ep)));
    if (p_.zero > 0)
      return Fail("zero=" + std::to_string(p_.zero) + " with ep > 1 is not supported");
    return Status::Ok();
  }

  /// ZeRO shards every parameter on its first dimension over dp.
  Status Zero() const {
    if (p_.zero == 0) return Status::Ok();
    if (p_.dp <= 1)
      return Fail("zero=" + std::to_string(p_.zero) + " shards over dp and needs dp > 1");
    const std::string dp = "dp (ZeRO shards dim 0 of every parameter)";
    CONCERTO_RETURN_IF_ERROR(Divides(dp, p_.dp, "hidden", m_.hidden));
    if (p_.tp > 1)
      CONCERTO_RETURN_IF_ERROR(Divides(dp, p_.dp, "hidden/tp", m_.hidden / p_.tp));
    CONCERTO_RETURN_IF_ERROR(Divides(dp, p_.dp, "ffn_hidden/tp", m_.ffn_hidden / p_.tp));
    CONCERTO_RETURN_IF_ERROR(Divides(dp, p_.dp, "vocab/tp", m_.vocab / p_.tp));
    if (m_.family == ModelFamily::kGpt)
      CONCERTO_RETURN_IF_ERROR(Divides(dp, p_.dp, "seq (the position table)", m_.seq));
    if (IsMoe(m_)) CONCERTO_RETURN_IF_ERROR(Divides(dp, p_.dp, "experts", m_.experts));
    return Status::Ok();
  }

  const ModelConfig& m_;
  const ParallelPlan& p_;
  int64_t world_;
};

}  // namespace

std::string_view ToString(Recompute recompute) {
  switch (recompute) {
    case Recompute::kNone: return "none";
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
  }
  return "none";
}

Result<ParallelPlan> ParsePlan(const std::string& text) { return PlanParser(text).Parse(); }

std::string PlanToString(const ParallelPlan& plan) {
  std::string s = "dp=" + std::to_string(plan.dp) + ",tp=" + std::to_string(plan.tp);
  // (vstages and order come last so that older canonical strings are unchanged.)
  if (plan.pp != 1) s += ",pp=" + std::to_string(plan.pp);
  if (plan.ep != 1) s += ",ep=" + std::to_string(plan.ep);
  if (plan.sp) s += ",sp";
  if (plan.zero != 0) s += ",zero=" + std::to_string(plan.zero);
  if (plan.microbatches != 1) s += ",microbatches=" + std::to_string(plan.microbatches);
  if (plan.dap != 1) s += ",dap=" + std::to_string(plan.dap);
  if (plan.vstages != 1) s += ",vstages=" + std::to_string(plan.vstages);
  if (!plan.order.empty()) s += ",order=" + JoinOrder(plan.order);
  if (plan.recompute != Recompute::kNone) s += ",recompute=" + std::string(ToString(plan.recompute));
  return s;
}

Status CheckAxisOrder(const ParallelPlan& plan) {
  if (plan.order.empty()) return Status::Ok();
  const std::string written = "order '" + JoinOrder(plan.order) + "'";
  std::set<std::string> seen;
  for (const std::string& axis : plan.order) {
    if (axis == "ep")
      return Status::Error(written + ": ep is not placed on its own; it always sits right inside "
                                     "dp (list tp, dp and pp, innermost first)");
    if (axis != "tp" && axis != "dp" && axis != "pp")
      return Status::Error(written + ": unknown axis '" + axis +
                           "' (list tp, dp and pp joined by '-', innermost first, e.g. "
                           "order=dp-tp-pp)");
    if (!seen.insert(axis).second)
      return Status::Error(written + ": axis '" + axis + "' is listed twice");
  }
  for (const char* axis : {"tp", "dp"})
    if (!seen.count(axis))
      return Status::Error(written + ": must list " + std::string(axis) +
                           " (every axis, innermost first, e.g. order=dp-tp-pp)");
  if (plan.pp > 1 && !seen.count("pp"))
    return Status::Error(written + ": must list pp when pp > 1 (e.g. order=dp-tp-pp)");
  return Status::Ok();
}

std::vector<MeshAxis> PlanMeshAxes(const ParallelPlan& plan) {
  assert(CheckAxisOrder(plan).ok());
  std::vector<MeshAxis> inner_first;
  for (const std::string& axis : EffectiveOrder(plan)) {
    if (axis == "tp") {
      inner_first.push_back({"tp", plan.tp});
    } else if (axis == "pp") {
      inner_first.push_back({"pp", plan.pp});
    } else if (plan.ep > 1) {  // dp: {dp: dp/ep, ep}, ep inside
      inner_first.push_back({"ep", plan.ep});
      inner_first.push_back({"dp", plan.dp / plan.ep});
    } else {
      inner_first.push_back({"dp", plan.dp});
    }
  }
  return std::vector<MeshAxis>(inner_first.rbegin(), inner_first.rend());
}

Status ValidatePlan(const ModelConfig& model, const ParallelPlan& plan, int world_size) {
  return PlanChecker(model, plan, world_size).Check();
}

Result<DpTpPlan> ParseDpTpPlan(const std::string& text) {
  Result<ParallelPlan> plan = ParsePlan(text);
  if (!plan.ok()) return plan.status();
  const ParallelPlan& p = *plan;
  ParallelPlan only_dp_tp;
  only_dp_tp.dp = p.dp;
  only_dp_tp.tp = p.tp;
  if (PlanToString(p) != PlanToString(only_dp_tp))
    return Status::Error("plan '" + text +
                         "': this entry point takes dp and tp only; use ParsePlan and "
                         "LowerTransformer for pp, ep, sp, zero, microbatches and dap");
  return DpTpPlan{p.dp, p.tp};
}

ParallelPlan ToParallelPlan(const DpTpPlan& plan) {
  ParallelPlan p;
  p.dp = plan.dp;
  p.tp = plan.tp;
  return p;
}

// ---------------------------------------------------------------------------
// Plan files.

Result<ParallelPlan> ParsePlanFile(const std::string& text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return Status::Error(source + ": line " + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  if (!root.IsMap()) return Status::Error(source + ": expected a map of plan keys (dp, tp, pp, ...)");
  static const std::set<std::string> kIntegers = {"dp",           "tp",  "pp",     "ep", "zero",
                                                  "microbatches", "dap", "vstages"};
  std::string text_plan;
  for (const auto& item : root) {
    if (!item.first.IsScalar())
      return Status::Error(source + ": line " + std::to_string(item.first.Mark().line + 1) +
                           ": a key must be a plan key name (dp, tp, pp, ...), not a list or map");
    const std::string key = item.first.Scalar();
    const YAML::Node& value = item.second;
    const std::string where = source + ": key '" + key + "'";
    if (key == "order" && value.IsSequence()) {  // [dp, tp, pp]
      std::string axes;
      for (const auto& axis : value) {
        if (!axis.IsScalar()) return Status::Error(where + ": expected a list of axis names");
        axes += (axes.empty() ? "" : "-") + axis.Scalar();
      }
      text_plan += (text_plan.empty() ? "" : ",") + ("order=" + axes);
      continue;
    }
    if (!value.IsScalar()) return Status::Error(where + ": expected a scalar value");
    const std::string v = value.Scalar();
    std::string entry;
    if (key == "sp") {
      if (v == "true" || v == "1") entry = "sp=1";
      else if (v == "false" || v == "0") entry = "sp=0";
      else return Status::Error(where + ": expected true or false, got '" + v + "'");
    } else if (key == "recompute") {
      entry = "recompute=" + v;
    } else if (key == "order") {
      if (v.find(',') != std::string::npos)
        return Status::Error(where + ": write the axes joined by '-' (dp-tp-pp) or as a list");
      entry = "order=" + v;
    } else if (kIntegers.count(key)) {
      int64_t n = 0;
      auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (ec != std::errc() || end != v.data() + v.size() || n < 0 || n > (int64_t{1} << 30))
        return Status::Error(where + ": expected a non-negative integer, got '" + v + "'");
      entry = key + "=" + v;
    } else {
      return Status::Error(where + ": unknown key (known: " + std::string(kKnownKeys) + ")");
    }
    text_plan += (text_plan.empty() ? "" : ",") + entry;
  }
  Result<ParallelPlan> plan = ParsePlan(text_plan);
  if (!plan.ok()) return Status::Error(source + ": " + plan.status().message());
  return plan;
}

Result<ParallelPlan> LoadPlanFile(const std::string& path) {
  Result<std::string> text = ReadInputFile(path, "plan file", kMaxSmallInputBytes);
  if (!text.ok()) return text.status();
  return ParsePlanFile(*text, path);
}

Result<ParallelPlan> LoadPlan(const std::string& arg) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(arg, ec)) return LoadPlanFile(arg);
  // A path, not a plan string: say the file is missing rather than "unknown
  // key 'plans/dp4-tp8.yaml'".
  const bool looks_like_path = arg.find('=') == std::string::npos &&
                               (arg.find('/') != std::string::npos || arg.ends_with(".yaml") ||
                                arg.ends_with(".yml") || arg.ends_with(".json"));
  if (looks_like_path) return LoadPlanFile(arg);
  return ParsePlan(arg);
}

}  // namespace concerto
