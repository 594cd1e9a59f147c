// JSON text form of Programs: a strict reader with messages that name the
// file, graph, op and field, and a canonical writer (docs/ir.md).
#include "concerto/ir/json_io.h"
#include "concerto/util/input_file.h"
#include "concerto/util/json_text.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include "concerto/ir/verifier.h"

namespace concerto {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

constexpr std::string_view kFormat = "concerto-ir";
constexpr int kVersion = 1;
/// Stands in for a number that overflowed to infinity (JSON escape form and value).
constexpr std::string_view kOverflowEscaped = "\\u0001concerto:non-finite-number";
constexpr std::string_view kOverflowValue =
    "\x01"
    "concerto:non-finite-number";
/// Containers up to this many columns are written on one line.
constexpr size_t kLineWidth = 100;
/// Doubles below this magnitude that are integral are written as integers.
constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53

// ---------------------------------------------------------------------------
// Parsing JSON text.

/// "3:17": 1-based line and column of byte `offset` (0-based) in `text`.
std::string LineColumn(const std::string& text, size_t offset) {
  offset = std::min(offset, text.size());
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < offset; ++i)
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  return std::to_string(line) + ":" + std::to_string(offset - line_start + 1);
}

/// nlohmann's message without its "[json.exception...] parse error at ..: " prefix.
std::string JsonErrorText(const std::string& what) {
  size_t at = what.find("column ");
  if (at != std::string::npos) {
    size_t colon = what.find(": ", at);
    if (colon != std::string::npos) return what.substr(colon + 2);
  }
  size_t bracket = what.find("] ");
  return bracket == std::string::npos ? what : what.substr(bracket + 2);
}

/// A SAX consumer that only records where parsing failed.
class ErrorLocator : public nlohmann::json_sax<json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t position, const std::string& last_token,
                   const nlohmann::detail::exception&) override {
    found = true;
    end = position;
    token = last_token;
    return false;
  }

  bool found = false;
  size_t end = 0;  // one past the failing token
  std::string token;
};

/// A number in the text too large for a double (JSON has no inf literal).
struct Overflow {
  std::string token;     // as written, e.g. "1e999"
  std::string location;  // "line:col"
};

/// Parses `text` into `root`. A number that overflows is replaced by a marker
/// string (recorded in `overflow`) so that the reader can name its field.
Status ParseJsonText(const std::string& text, const std::string& source, json* root,
                     std::optional<Overflow>* overflow) {
  if (Status s = CheckWhitespaceRuns(text, source); !s.ok()) return s;
  try {
    *root = json::parse(text);
    return Status::Ok();
  } catch (const json::parse_error& e) {
    return Status::Error(MalformedJsonMessage(text, source, e.byte, e.what()));
  } catch (const json::exception& e) {
    ErrorLocator locator;
    json::sax_parse(text, &locator);
    size_t len = locator.token.size();
    if (!locator.found || locator.end < len ||
        text.compare(locator.end - len, len, locator.token) != 0)
      return Status::Error(source + ": malformed JSON: " + JsonErrorText(e.what()));
    size_t start = locator.end - len;
    *overflow = Overflow{locator.token, LineColumn(text, start)};
    std::string patched = text.substr(0, start) + "\"" + std::string(kOverflowEscaped) + "\"" +
                          text.substr(locator.end);
    try {
      *root = json::parse(patched);
      return Status::Ok();
    } catch (const json::exception&) {
      return Status::Error(source + ":" + (*overflow)->location + ": non-finite number '" +
                           locator.token + "' (overflows a double)");
    }
  }
}

// ---------------------------------------------------------------------------
// Reading a Program from parsed JSON.

using FieldList = std::span<const std::string_view>;

/// Field lists per object kind (unknown fields are rejected: they are typos).
constexpr std::string_view kProgramFields[] = {"format", "version", "name",
                                               "mesh",   "graphs",  "roles"};
constexpr std::string_view kMeshFields[] = {"axes"};
constexpr std::string_view kAxisFields[] = {"name", "size"};
constexpr std::string_view kGraphFields[] = {"name", "streams", "tensors", "ops"};
constexpr std::string_view kTensorFields[] = {"name", "shape", "dtype", "sharding", "partial", "segments"};
constexpr std::string_view kRoleFields[] = {"name", "graph", "ranks"};
constexpr std::string_view kTagFields[] = {"phase", "layer", "microbatch", "purpose"};
constexpr std::string_view kOpCommonFields[] = {
    "id",      "name",         "kind",        "stream", "inputs",
    "outputs", "control_deps", "duration_us", "tags",   "fused_from"};
constexpr std::string_view kComputeFields[] = {"type", "attrs", "flops", "bytes"};
constexpr std::string_view kCopyFields[] = {"bytes"};
constexpr std::string_view kCollectiveFields[] = {"collective", "reduce", "group", "bytes"};
constexpr std::string_view kP2pFields[] = {"peer", "tag", "bytes"};
constexpr std::string_view kPeerAxisFields[] = {"axis", "offset"};

bool Contains(FieldList list, std::string_view key) {
  return std::find(list.begin(), list.end(), key) != list.end();
}

/// The kind-specific fields of an op kind.
FieldList KindFields(OpKind kind) {
  switch (kind) {
    case OpKind::kCompute: return kComputeFields;
    case OpKind::kCopy: return kCopyFields;
    case OpKind::kCollective: return kCollectiveFields;
    case OpKind::kSend:
    case OpKind::kRecv: return kP2pFields;
  }
  return {};
}

/// JSON type names for messages.
enum class JType { kString, kNumber, kInteger, kArray, kObject };

const char* JTypeName(JType t) {
  switch (t) {
    case JType::kString: return "a string";
    case JType::kNumber: return "a number";
    case JType::kInteger: return "an integer";
    case JType::kArray: return "an array";
    case JType::kObject: return "an object";
  }
  return "?";
}

const char* ValueTypeName(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "an unsupported value";
  }
}

/// Reads one Program, failing on the first problem with a located message.
class Reader {
 public:
  Reader(std::string source, std::optional<Overflow> overflow)
      : source_(std::move(source)), overflow_(std::move(overflow)) {}

  Result<Program> Read(const json& root) {
    Program program;
    Status st = ReadProgram(root, &program);
    if (!st.ok()) return st;
    if (overflow_)  // the overflowing number sat somewhere no field reads
      return Status::Error(source_ + ":" + overflow_->location + ": non-finite number '" +
                           overflow_->token + "' (overflows a double)");
    return program;
  }

 private:
  // --- messages and typed access -------------------------------------------

  /// "src: <where>: field 'f': <what>".
  Status Fail(const std::string& where, const std::string& field, const std::string& what) const {
    std::string msg = source_ + ": ";
    if (!where.empty()) msg += where + ": ";
    if (!field.empty()) msg += "field '" + field + "': ";
    return Status::Error(msg + what);
  }

  bool IsOverflow(const json& v) const {
    return overflow_ && v.is_string() && v.get_ref<const std::string&>() == kOverflowValue;
  }

  /// Checks the JSON type of a value.
  Status Expect(const json& v, JType type, const std::string& where, const std::string& field) {
    if (IsOverflow(v)) {
      Status st =
          Fail(where, field, "non-finite number '" + overflow_->token + "' (overflows a double)");
      overflow_.reset();
      return st;
    }
    bool ok = false;
    switch (type) {
      case JType::kString: ok = v.is_string(); break;
      case JType::kNumber: ok = v.is_number(); break;
      case JType::kInteger: ok = v.is_number_integer() || IsIntegralFloat(v); break;
      case JType::kArray: ok = v.is_array(); break;
      case JType::kObject: ok = v.is_object(); break;
    }
    if (ok) return Status::Ok();
    return Fail(where, field,
                std::string("expected ") + JTypeName(type) + ", got " + ValueTypeName(v));
  }

  static bool IsIntegralFloat(const json& v) {
    if (!v.is_number_float()) return false;
    double d = v.get<double>();
    return std::isfinite(d) && d == std::floor(d) && std::fabs(d) < kMaxExactInteger;
  }

  /// Rejects keys of `obj` outside `allowed`.
  Status CheckFields(const json& obj, FieldList allowed, const std::string& where) {
    for (const auto& item : obj.items())
      if (!Contains(allowed, item.key())) return Fail(where, item.key(), "unknown field");
    return Status::Ok();
  }

  /// Member `key` of object `obj`, or null when absent.
  static const json* Member(const json& obj, const char* key) {
    auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
  }

  Status Missing(const std::string& where, const std::string& field) const {
    return Fail(where, field, "missing required field");
  }

  /// A string member; absent leaves `out` unchanged unless `required`.
  Status GetString(const json& obj, const char* key, const std::string& where, bool required,
                   std::string* out) {
    const json* v = Member(obj, key);
    if (!v) return required ? Missing(where, key) : Status::Ok();
    CONCERTO_RETURN_IF_ERROR(Expect(*v, JType::kString, where, key));
    *out = v->get<std::string>();
    return Status::Ok();
  }

  /// An integer value in [lo, hi].
  Status IntValue(const json& v, const std::string& where, const std::string& field, int64_t lo,
                  int64_t hi, int64_t* out) {
    CONCERTO_RETURN_IF_ERROR(Expect(v, JType::kInteger, where, field));
    bool too_big = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX);
    int64_t x =
        too_big ? INT64_MAX
                : (v.is_number_float() ? static_cast<int64_t>(v.get<double>()) : v.get<int64_t>());
    if (lo >= 0 && x < 0) return Fail(where, field, "negative value " + std::to_string(x));
    if (too_big || x < lo || x > hi)
      return Fail(where, field,
                  "value " + DescribeJson(v) + " is outside [" + std::to_string(lo) + ", " +
                      std::to_string(hi) + "]");
    *out = x;
    return Status::Ok();
  }

  /// An int member in [lo, hi]; absent leaves `out` unchanged unless `required`.
  template <typename Int>
  Status GetInt(const json& obj, const char* key, const std::string& where, bool required,
                int64_t lo, int64_t hi, Int* out) {
    const json* v = Member(obj, key);
    if (!v) return required ? Missing(where, key) : Status::Ok();
    int64_t x = 0;
    CONCERTO_RETURN_IF_ERROR(IntValue(*v, where, key, lo, hi, &x));
    *out = static_cast<Int>(x);
    return Status::Ok();
  }

  /// A finite non-negative number member (flops, bytes, duration_us).
  Status GetAmount(const json& obj, const char* key, const std::string& where, double* out) {
    const json* v = Member(obj, key);
    if (!v) return Status::Ok();
    CONCERTO_RETURN_IF_ERROR(Expect(*v, JType::kNumber, where, key));
    double x = v->get<double>();
    if (!std::isfinite(x)) return Fail(where, key, "non-finite value");
    if (x < 0) return Fail(where, key, "negative value " + DescribeJson(*v));
    *out = x;
    return Status::Ok();
  }

  /// "inputs[2]".
  static std::string ElementField(const char* key, size_t i) {
    return std::string(key) + "[" + std::to_string(i) + "]";
  }

  /// An array member of strings.
  Status GetStringList(const json& obj, const char* key, const std::string& where,
                       std::vector<std::string>* out) {
    const json* v = Member(obj, key);
    if (!v) return Status::Ok();
    CONCERTO_RETURN_IF_ERROR(Expect(*v, JType::kArray, where, key));
    out->clear();
    out->reserve(v->size());
    for (size_t i = 0; i < v->size(); ++i) {
      const json& item = (*v)[i];
      if (!item.is_string() || IsOverflow(item))
        return Expect(item, JType::kString, where, ElementField(key, i));
      out->push_back(item.get<std::string>());
    }
    return Status::Ok();
  }

  /// An array member of ints in [lo, hi].
  template <typename Int>
  Status GetIntList(const json& obj, const char* key, const std::string& where, int64_t lo,
                    int64_t hi, std::vector<Int>* out) {
    const json* v = Member(obj, key);
    if (!v) return Status::Ok();
    CONCERTO_RETURN_IF_ERROR(Expect(*v, JType::kArray, where, key));
    out->clear();
    out->reserve(v->size());
    for (size_t i = 0; i < v->size(); ++i) {
      const json& item = (*v)[i];
      bool plain =
          item.is_number_integer() &&
          (!item.is_number_unsigned() || item.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX));
      int64_t x = plain ? item.get<int64_t>() : 0;
      if (!plain || x < lo || x > hi) {  // slow path: the exact message
        CONCERTO_RETURN_IF_ERROR(IntValue(item, where, ElementField(key, i), lo, hi, &x));
      }
      out->push_back(static_cast<Int>(x));
    }
    return Status::Ok();
  }

  /// An enum member parsed by `parse`; `what` names the vocabulary in messages.
  template <typename E, typename Parse>
  Status GetEnum(const json& obj, const char* key, const std::string& where, bool required,
                 Parse parse, const char* what, E* out) {
    const json* v = Member(obj, key);
    if (!v) return required ? Missing(where, key) : Status::Ok();
    CONCERTO_RETURN_IF_ERROR(Expect(*v, JType::kString, where, key));
    const std::string& s = v->get_ref<const std::string&>();
    std::optional<E> e = parse(s);
    if (!e) return Fail(where, key, std::string("unknown ") + what + " '" + s + "'");
    *out = *e;
    return Status::Ok();
  }

  // --- the document ---------------------------------------------------------

  Status ReadProgram(const json& root, Program* p) {
    if (IsOverflow(root) || !root.is_object())
      return Fail("", "",
                  std::string("the document must be an object, got ") + ValueTypeName(root));
    CONCERTO_RETURN_IF_ERROR(CheckFields(root, kProgramFields, ""));
    CONCERTO_RETURN_IF_ERROR(ReadHeader(root));
    CONCERTO_RETURN_IF_ERROR(GetString(root, "name", "", false, &p->name));
    const json* mesh = Member(root, "mesh");
    if (!mesh) return Missing("", "mesh");
    CONCERTO_RETURN_IF_ERROR(ReadMesh(*mesh, &p->mesh));
    const json* graphs = Member(root, "graphs");
    if (!graphs) return Missing("", "graphs");
    CONCERTO_RETURN_IF_ERROR(Expect(*graphs, JType::kArray, "", "graphs"));
    if (graphs->empty()) return Fail("", "graphs", "a program needs at least one graph");
    p->graphs.resize(graphs->size());
    for (size_t i = 0; i < graphs->size(); ++i)
      CONCERTO_RETURN_IF_ERROR(ReadGraph((*graphs)[i], i, &p->graphs[i]));
    return ReadRoles(root, p);
  }

  /// "format" and "version".
  Status ReadHeader(const json& root) {
    std::string format;
    CONCERTO_RETURN_IF_ERROR(GetString(root, "format", "", true, &format));
    if (format != kFormat)
      return Fail("", "format", "expected '" + std::string(kFormat) + "', got '" + format + "'");
    int64_t version = 0;
    CONCERTO_RETURN_IF_ERROR(GetInt(root, "version", "", true, INT64_MIN, INT64_MAX, &version));
    if (version != kVersion)
      return Fail("", "version",
                  "unsupported version " + std::to_string(version) +
                      " (this reader reads version " + std::to_string(kVersion) + ")");
    return Status::Ok();
  }

  Status ReadMesh(const json& j, Mesh* mesh) {
    CONCERTO_RETURN_IF_ERROR(Expect(j, JType::kObject, "", "mesh"));
    CONCERTO_RETURN_IF_ERROR(CheckFields(j, kMeshFields, "mesh"));
    const json* axes = Member(j, "axes");
    if (!axes) return Missing("mesh", "axes");
    CONCERTO_RETURN_IF_ERROR(Expect(*axes, JType::kArray, "mesh", "axes"));
    int64_t ranks = 1;
    for (size_t i = 0; i < axes->size(); ++i) {
      const json& a = (*axes)[i];
      std::string where = "mesh: axis " + std::to_string(i);
      CONCERTO_RETURN_IF_ERROR(
          Expect(a, JType::kObject, "mesh", "axes[" + std::to_string(i) + "]"));
      CONCERTO_RETURN_IF_ERROR(CheckFields(a, kAxisFields, where));
      MeshAxis axis;
      CONCERTO_RETURN_IF_ERROR(GetString(a, "name", where, true, &axis.name));
      where += " '" + axis.name + "'";
      CONCERTO_RETURN_IF_ERROR(GetInt(a, "size", where, true, INT32_MIN, INT32_MAX, &axis.size));
      if (axis.size < 1)
        return Fail(where, "size", "must be >= 1, got " + std::to_string(axis.size));
      ranks *= axis.size;
      if (ranks > kMaxMeshRanks)
        return Fail("mesh", "axes", "more than " + std::to_string(kMaxMeshRanks) + " ranks");
      mesh->axes.push_back(axis);
    }
    return Status::Ok();
  }

  Status ReadGraph(const json& j, size_t index, Graph* g) {
    CONCERTO_RETURN_IF_ERROR(
        Expect(j, JType::kObject, "", "graphs[" + std::to_string(index) + "]"));
    std::string where = "graphs[" + std::to_string(index) + "]";
    CONCERTO_RETURN_IF_ERROR(GetString(j, "name", where, true, &g->name));
    where = "graph '" + g->name + "'";
    CONCERTO_RETURN_IF_ERROR(CheckFields(j, kGraphFields, where));
    CONCERTO_RETURN_IF_ERROR(GetStringList(j, "streams", where, &g->streams));
    if (g->streams.size() > static_cast<size_t>(kMaxStreamsPerGraph))
      return Fail(where, "streams",
                  std::to_string(g->streams.size()) + " streams, more than the limit of " +
                      std::to_string(kMaxStreamsPerGraph) + " (docs/ir.md \"Limits\")");
    if (const json* tensors = Member(j, "tensors")) {
      CONCERTO_RETURN_IF_ERROR(Expect(*tensors, JType::kArray, where, "tensors"));
      g->tensors.resize(tensors->size());
      for (size_t i = 0; i < tensors->size(); ++i)
        CONCERTO_RETURN_IF_ERROR(ReadTensor((*tensors)[i], where, i, &g->tensors[i]));
    }
    std::unordered_map<std::string_view, const Tensor*> by_name;
    by_name.reserve(g->tensors.size());
    for (const Tensor& t : g->tensors) by_name.emplace(t.name, &t);
    if (const json* ops = Member(j, "ops")) {
      CONCERTO_RETURN_IF_ERROR(Expect(*ops, JType::kArray, where, "ops"));
      g->ops.resize(ops->size());
      for (size_t i = 0; i < ops->size(); ++i)
        CONCERTO_RETURN_IF_ERROR(ReadOp((*ops)[i], where, i, by_name, &g->ops[i]));
    }
    return Status::Ok();
  }

  Status ReadTensor(const json& j, const std::string& graph_where, size_t index, Tensor* t) {
    std::string where = graph_where + ": tensors[" + std::to_string(index) + "]";
    CONCERTO_RETURN_IF_ERROR(
        Expect(j, JType::kObject, graph_where, "tensors[" + std::to_string(index) + "]"));
    CONCERTO_RETURN_IF_ERROR(GetString(j, "name", where, true, &t->name));
    where = graph_where + ": tensor '" + t->name + "'";
    CONCERTO_RETURN_IF_ERROR(CheckFields(j, kTensorFields, where));
    const json* shape_json = Member(j, "shape");
    if (!shape_json) return Missing(where, "shape");
    const json& shape = *shape_json;
    CONCERTO_RETURN_IF_ERROR(Expect(shape, JType::kArray, where, "shape"));
    for (size_t d = 0; d < shape.size(); ++d) {
      int64_t dim = 0;
      CONCERTO_RETURN_IF_ERROR(IntValue(shape[d], where, "shape", INT64_MIN, INT64_MAX, &dim));
      if (dim < 0) return Fail(where, "shape", "negative dimension " + std::to_string(dim));
      t->shape.push_back(dim);
    }
    CONCERTO_RETURN_IF_ERROR(GetEnum(j, "dtype", where, true, ParseDType, "dtype", &t->dtype));
    CONCERTO_RETURN_IF_ERROR(ReadSharding(j, where, t));
    CONCERTO_RETURN_IF_ERROR(GetStringList(j, "partial", where, &t->partial));
    return ReadSegments(j, where, t);
  }

  /// "segments": per dim, a list of segment sizes ([] for a plain dim); absent: none.
  Status ReadSegments(const json& j, const std::string& where, Tensor* t) {
    const json* s = Member(j, "segments");
    if (!s) return Status::Ok();
    CONCERTO_RETURN_IF_ERROR(Expect(*s, JType::kArray, where, "segments"));
    t->segments.resize(s->size());
    for (size_t d = 0; d < s->size(); ++d) {
      const std::string field = "segments[" + std::to_string(d) + "]";
      CONCERTO_RETURN_IF_ERROR(Expect((*s)[d], JType::kArray, where, field));
      for (size_t i = 0; i < (*s)[d].size(); ++i) {
        int64_t size = 0;
        CONCERTO_RETURN_IF_ERROR(IntValue((*s)[d][i], where, field, 1, INT64_MAX, &size));
        t->segments[d].push_back(size);
      }
    }
    return Status::Ok();
  }

  /// "sharding": one list of mesh axes per dim; absent means all replicated.
  Status ReadSharding(const json& j, const std::string& where, Tensor* t) {
    const json* s = Member(j, "sharding");
    if (!s) {
      t->sharding.assign(t->shape.size(), {});
      return Status::Ok();
    }
    CONCERTO_RETURN_IF_ERROR(Expect(*s, JType::kArray, where, "sharding"));
    t->sharding.resize(s->size());
    for (size_t d = 0; d < s->size(); ++d) {
      const json& dim = (*s)[d];
      std::string field = "sharding[" + std::to_string(d) + "]";
      CONCERTO_RETURN_IF_ERROR(Expect(dim, JType::kArray, where, field));
      for (const json& axis : dim) {
        CONCERTO_RETURN_IF_ERROR(Expect(axis, JType::kString, where, field));
        t->sharding[d].push_back(axis.get<std::string>());
      }
    }
    return Status::Ok();
  }

  Status ReadOp(const json& j, const std::string& graph_where, size_t index,
                const std::unordered_map<std::string_view, const Tensor*>& tensors, Op* op) {
    std::string where = graph_where + ": ops[" + std::to_string(index) + "]";
    CONCERTO_RETURN_IF_ERROR(
        Expect(j, JType::kObject, graph_where, "ops[" + std::to_string(index) + "]"));
    CONCERTO_RETURN_IF_ERROR(GetInt(j, "id", where, true, 0, INT32_MAX, &op->id));
    CONCERTO_RETURN_IF_ERROR(GetString(j, "name", where, false, &op->name));
    where = graph_where + ": " + OpLabel(*op);
    CONCERTO_RETURN_IF_ERROR(GetEnum(j, "kind", where, true, ParseOpKind, "op kind", &op->kind));
    CONCERTO_RETURN_IF_ERROR(CheckOpFields(j, op->kind, where));
    CONCERTO_RETURN_IF_ERROR(ReadOpCommon(j, where, op));
    switch (op->kind) {
      case OpKind::kCompute: return ReadCompute(j, where, op);
      case OpKind::kCopy: return GetAmount(j, "bytes", where, &op->bytes);
      case OpKind::kCollective: return ReadCollective(j, where, tensors, op);
      case OpKind::kSend:
      case OpKind::kRecv: return ReadPointToPoint(j, where, tensors, op);
    }
    return Status::Ok();
  }

  /// Rejects fields that no op has, or that belong to another kind.
  Status CheckOpFields(const json& j, OpKind kind, const std::string& where) {
    auto own = KindFields(kind);
    for (const auto& item : j.items()) {
      const std::string& key = item.key();
      if (Contains(kOpCommonFields, key) || Contains(own, key)) continue;
      for (OpKind other : {OpKind::kCompute, OpKind::kCopy, OpKind::kCollective, OpKind::kSend})
        if (Contains(KindFields(other), key))
          return Fail(where, key, "not a field of a " + std::string(ToString(kind)) + " op");
      return Fail(where, key, "unknown field");
    }
    return Status::Ok();
  }

  /// Fields every op kind has.
  Status ReadOpCommon(const json& j, const std::string& where, Op* op) {
    op->stream = op->IsComm() ? "comm" : "compute";
    CONCERTO_RETURN_IF_ERROR(GetString(j, "stream", where, false, &op->stream));
    CONCERTO_RETURN_IF_ERROR(GetStringList(j, "inputs", where, &op->inputs));
    CONCERTO_RETURN_IF_ERROR(GetStringList(j, "outputs", where, &op->outputs));
    CONCERTO_RETURN_IF_ERROR(
        GetIntList(j, "control_deps", where, INT32_MIN, INT32_MAX, &op->control_deps));
    if (const json* d = Member(j, "duration_us"); d && !d->is_null()) {
      double us = 0;
      CONCERTO_RETURN_IF_ERROR(GetAmount(j, "duration_us", where, &us));
      op->duration_us = us;
    }
    CONCERTO_RETURN_IF_ERROR(ReadTags(j, where, &op->tags));
    return GetIntList(j, "fused_from", where, INT32_MIN, INT32_MAX, &op->fused_from);
  }

  Status ReadTags(const json& j, const std::string& where, Tags* tags) {
    const json* t = Member(j, "tags");
    if (!t) return Status::Ok();
    CONCERTO_RETURN_IF_ERROR(Expect(*t, JType::kObject, where, "tags"));
    CONCERTO_RETURN_IF_ERROR(CheckFields(*t, kTagFields, where + ": tags"));
    const std::string tw = where + ": tags";
    CONCERTO_RETURN_IF_ERROR(GetEnum(*t, "phase", tw, false, ParsePhase, "phase", &tags->phase));
    CONCERTO_RETURN_IF_ERROR(GetInt(*t, "layer", tw, false, -1, INT32_MAX, &tags->layer));
    CONCERTO_RETURN_IF_ERROR(GetInt(*t, "microbatch", tw, false, -1, INT32_MAX, &tags->microbatch));
    return GetString(*t, "purpose", tw, false, &tags->purpose);
  }

  Status ReadCompute(const json& j, const std::string& where, Op* op) {
    CONCERTO_RETURN_IF_ERROR(
        GetEnum(j, "type", where, true, ParseComputeType, "compute type", &op->compute_type));
    if (const json* attrs = Member(j, "attrs")) {
      CONCERTO_RETURN_IF_ERROR(Expect(*attrs, JType::kObject, where, "attrs"));
      for (const auto& item : attrs->items()) {
        std::string field = "attrs." + item.key();
        CONCERTO_RETURN_IF_ERROR(Expect(item.value(), JType::kNumber, where, field));
        op->attrs[item.key()] = item.value().get<double>();
      }
    }
    CONCERTO_RETURN_IF_ERROR(GetAmount(j, "flops", where, &op->flops));
    return GetAmount(j, "bytes", where, &op->bytes);
  }

  /// Bytes of one tensor, saturating far below overflow (the verifier
  /// rejects such tensors anyway).
  static int64_t SaturatedBytes(const Tensor& t) {
    constexpr int64_t kCap = int64_t{1} << 56;
    int64_t elements = 1;
    for (int64_t d : t.shape) {
      if (d <= 0) return 0;
      elements = elements > kCap / d ? kCap : elements * d;
    }
    return elements * DTypeBytes(t.dtype);
  }

  /// Sum of the bytes of the named tensors that exist.
  static int64_t TensorBytes(const std::vector<std::string>& names,
                             const std::unordered_map<std::string_view, const Tensor*>& tensors) {
    int64_t total = 0;
    for (const auto& name : names) {
      auto it = tensors.find(name);
      if (it != tensors.end())
        total = std::min(total + SaturatedBytes(*it->second), int64_t{1} << 60);
    }
    return total;
  }

  Status ReadCollective(const json& j, const std::string& where,
                        const std::unordered_map<std::string_view, const Tensor*>& tensors,
                        Op* op) {
    CONCERTO_RETURN_IF_ERROR(
        GetEnum(j, "collective", where, true, ParseCollectiveType, "collective", &op->collective));
    CONCERTO_RETURN_IF_ERROR(
        GetEnum(j, "reduce", where, false, ParseReduceOp, "reduce op", &op->reduce));
    const json* group = Member(j, "group");
    if (!group) return Missing(where, "group");
    CONCERTO_RETURN_IF_ERROR(ReadGroup(*group, where, &op->group));
    if (op->inputs.empty()) return Fail(where, "inputs", "a collective needs at least one input");
    op->message_bytes = TensorBytes(op->inputs, tensors);
    return GetInt(j, "bytes", where, false, 0, INT64_MAX, &op->message_bytes);
  }

  /// {"axes": [...]} or {"ranks": [...]}.
  Status ReadGroup(const json& g, const std::string& where, Group* group) {
    CONCERTO_RETURN_IF_ERROR(Expect(g, JType::kObject, where, "group"));
    bool axes = g.contains("axes"), ranks = g.contains("ranks");
    if (axes == ranks || g.size() != 1)
      return Fail(where, "group", "needs exactly one of 'axes' or 'ranks'");
    if (axes) return GetStringList(g, "axes", where + ": group", &group->axes);
    CONCERTO_RETURN_IF_ERROR(
        GetIntList(g, "ranks", where + ": group", INT32_MIN, INT32_MAX, &group->ranks));
    if (group->ranks.empty()) return Fail(where, "group", "empty rank list");
    return Status::Ok();
  }

  Status ReadPointToPoint(const json& j, const std::string& where,
                          const std::unordered_map<std::string_view, const Tensor*>& tensors,
                          Op* op) {
    const json* peer = Member(j, "peer");
    if (!peer) return Missing(where, "peer");
    CONCERTO_RETURN_IF_ERROR(ReadPeer(*peer, where, &op->peer));
    CONCERTO_RETURN_IF_ERROR(GetInt(j, "tag", where, false, 0, INT32_MAX, &op->tag));
    const auto& payload = op->kind == OpKind::kSend ? op->inputs : op->outputs;
    op->message_bytes = TensorBytes(payload, tensors);
    return GetInt(j, "bytes", where, false, 0, INT64_MAX, &op->message_bytes);
  }

  /// {"axis": "pp", "offset": 1} or {"rank": 3}.
  Status ReadPeer(const json& p, const std::string& where, Peer* peer) {
    CONCERTO_RETURN_IF_ERROR(Expect(p, JType::kObject, where, "peer"));
    const std::string pw = where + ": peer";
    if (p.contains("rank")) {
      if (p.size() != 1) return Fail(where, "peer", "a rank peer has only 'rank'");
      return GetInt(p, "rank", pw, true, 0, INT32_MAX, &peer->rank);
    }
    CONCERTO_RETURN_IF_ERROR(CheckFields(p, kPeerAxisFields, pw));
    CONCERTO_RETURN_IF_ERROR(GetString(p, "axis", pw, true, &peer->axis));
    return GetInt(p, "offset", pw, true, INT32_MIN, INT32_MAX, &peer->offset);
  }

  /// "roles", or the default single role when there is exactly one graph.
  Status ReadRoles(const json& root, Program* p) {
    const json* roles = Member(root, "roles");
    if (!roles) {
      if (p->graphs.size() != 1)
        return Fail("", "roles", "missing (required when there is more than one graph)");
      Role role{p->graphs[0].name, p->graphs[0].name, {}};
      for (int r = 0; r < p->mesh.NumRanks(); ++r) role.ranks.push_back(r);
      p->roles.push_back(std::move(role));
      return Status::Ok();
    }
    CONCERTO_RETURN_IF_ERROR(Expect(*roles, JType::kArray, "", "roles"));
    p->roles.resize(roles->size());
    for (size_t i = 0; i < roles->size(); ++i) {
      const json& r = (*roles)[i];
      std::string where = "roles[" + std::to_string(i) + "]";
      CONCERTO_RETURN_IF_ERROR(Expect(r, JType::kObject, "", where));
      Role& role = p->roles[i];
      CONCERTO_RETURN_IF_ERROR(GetString(r, "name", where, true, &role.name));
      where = "role '" + role.name + "'";
      CONCERTO_RETURN_IF_ERROR(CheckFields(r, kRoleFields, where));
      CONCERTO_RETURN_IF_ERROR(GetString(r, "graph", where, true, &role.graph));
      if (!Member(r, "ranks")) return Missing(where, "ranks");
      CONCERTO_RETURN_IF_ERROR(GetIntList(r, "ranks", where, INT32_MIN, INT32_MAX, &role.ranks));
    }
    return Status::Ok();
  }

  std::string source_;
  std::optional<Overflow> overflow_;  // reset once reported
};

// ---------------------------------------------------------------------------
// Writing.

/// A number as JSON: integral values as integers, so 1e9 reads back as 1000000000.
ojson Number(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < kMaxExactInteger)
    return ojson(static_cast<int64_t>(v));
  return ojson(v);
}

ojson MeshJson(const Mesh& mesh) {
  ojson axes = ojson::array();
  for (const auto& a : mesh.axes) axes.push_back(ojson{{"name", a.name}, {"size", a.size}});
  return ojson{{"axes", std::move(axes)}};
}

ojson TensorJson(const Tensor& t) {
  ojson sharding = ojson::array();
  if (t.sharding.empty()) {
    for (size_t d = 0; d < t.shape.size(); ++d) sharding.push_back(ojson::array());
  } else {
    for (const auto& dim : t.sharding) sharding.push_back(dim);
  }
  ojson j;
  j["name"] = t.name;
  j["shape"] = t.shape;
  j["dtype"] = ToString(t.dtype);
  j["sharding"] = std::move(sharding);
  j["partial"] = t.partial;
  if (!t.segments.empty()) j["segments"] = t.segments;
  return j;
}

ojson GroupJson(const Group& g) {
  if (!g.ranks.empty()) return ojson{{"ranks", g.ranks}};
  return ojson{{"axes", g.axes}};
}

ojson PeerJson(const Peer& p) {
  if (p.rank >= 0) return ojson{{"rank", p.rank}};
  ojson j;
  j["axis"] = p.axis;
  j["offset"] = p.offset;
  return j;
}

ojson TagsJson(const Tags& t) {
  ojson j;
  j["phase"] = ToString(t.phase);
  j["layer"] = t.layer;
  j["microbatch"] = t.microbatch;
  j["purpose"] = t.purpose;
  return j;
}

/// The kind-specific fields, in canonical order, that come before inputs.
void WriteKindHead(const Op& op, ojson* j) {
  switch (op.kind) {
    case OpKind::kCompute: (*j)["type"] = ToString(op.compute_type); break;
    case OpKind::kCopy: break;
    case OpKind::kCollective:
      (*j)["collective"] = ToString(op.collective);
      (*j)["reduce"] = ToString(op.reduce);
      (*j)["group"] = GroupJson(op.group);
      (*j)["bytes"] = op.message_bytes;
      break;
    case OpKind::kSend:
    case OpKind::kRecv:
      (*j)["peer"] = PeerJson(op.peer);
      (*j)["tag"] = op.tag;
      (*j)["bytes"] = op.message_bytes;
      break;
  }
}

ojson OpJson(const Op& op) {
  ojson j;
  j["id"] = op.id;
  j["name"] = op.name;
  j["kind"] = ToString(op.kind);
  j["stream"] = op.stream;
  WriteKindHead(op, &j);
  j["inputs"] = op.inputs;
  j["outputs"] = op.outputs;
  if (op.kind == OpKind::kCompute) {
    ojson attrs = ojson::object();
    for (const auto& [k, v] : op.attrs) attrs[k] = Number(v);
    j["attrs"] = std::move(attrs);
    j["flops"] = Number(op.flops);
  }
  if (op.kind == OpKind::kCompute || op.kind == OpKind::kCopy) j["bytes"] = Number(op.bytes);
  j["control_deps"] = op.control_deps;
  j["duration_us"] = op.duration_us ? Number(*op.duration_us) : ojson(nullptr);
  j["tags"] = TagsJson(op.tags);
  j["fused_from"] = op.fused_from;
  return j;
}

ojson GraphJson(const Graph& g) {
  ojson tensors = ojson::array();
  for (const auto& t : g.tensors) tensors.push_back(TensorJson(t));
  ojson ops = ojson::array();
  for (const auto& op : g.ops) ops.push_back(OpJson(op));
  ojson j;
  j["name"] = g.name;
  j["streams"] = g.streams;
  j["tensors"] = std::move(tensors);
  j["ops"] = std::move(ops);
  return j;
}

ojson ProgramJson(const Program& p) {
  ojson graphs = ojson::array();
  for (const auto& g : p.graphs) graphs.push_back(GraphJson(g));
  ojson roles = ojson::array();
  for (const auto& r : p.roles) {
    ojson role;
    role["name"] = r.name;
    role["graph"] = r.graph;
    role["ranks"] = r.ranks;
    roles.push_back(std::move(role));
  }
  ojson j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["name"] = p.name;
  j["mesh"] = MeshJson(p.mesh);
  j["graphs"] = std::move(graphs);
  j["roles"] = std::move(roles);
  return j;
}

/// True when `s` can be written between quotes as is (plain printable ASCII).
bool IsPlainAscii(const std::string& s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return c >= 0x20 && c < 0x7f && c != '"' && c != '\\'; });
}

/// A scalar as JSON text (invalid UTF-8 replaced, never thrown). Integers and
/// plain strings take a fast path: the writer emits millions of them.
std::string ScalarText(const ojson& j) {
  if (j.is_number_integer()) return std::to_string(j.get<int64_t>());
  if (j.is_string() && IsPlainAscii(j.get_ref<const std::string&>()))
    return "\"" + j.get_ref<const std::string&>() + "\"";
  return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

/// Appends the one-line form of `j` ({"a": 1, "b": [1, 2]}) to `out`;
/// false (with `out` partly written) once it grows past `limit` bytes.
bool AppendInline(const ojson& j, size_t limit, std::string* out) {
  if (!j.is_structured()) {
    *out += ScalarText(j);
    return out->size() <= limit;
  }
  *out += j.is_object() ? '{' : '[';
  bool first = true;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!first) *out += ", ";
    first = false;
    if (j.is_object()) *out += ScalarText(ojson(it.key())) + ": ";
    if (out->size() > limit || !AppendInline(it.value(), limit, out)) return false;
  }
  *out += j.is_object() ? '}' : ']';
  return out->size() <= limit;
}

bool AllScalars(const ojson& j) {
  return std::none_of(j.begin(), j.end(), [](const ojson& v) { return v.is_structured(); });
}

/// Indented form: containers that fit in kLineWidth from `column`, and
/// arrays of scalars, stay on one line; the rest get one member per line.
void WritePretty(const ojson& j, size_t indent, size_t column, std::string* out) {
  if (!j.is_structured() || j.empty() || (j.is_array() && AllScalars(j))) {
    AppendInline(j, SIZE_MAX, out);
    return;
  }
  const size_t mark = out->size();
  if (column <= kLineWidth && AppendInline(j, mark + (kLineWidth - column), out)) return;
  out->resize(mark);
  const std::string pad(indent + 2, ' ');
  *out += j.is_object() ? "{\n" : "[\n";
  bool first = true;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!first) *out += ",\n";
    first = false;
    *out += pad;
    size_t child_column = pad.size();
    if (j.is_object()) {
      std::string key = ScalarText(ojson(it.key())) + ": ";
      *out += key;
      child_column += key.size();
    }
    WritePretty(it.value(), indent + 2, child_column, out);
  }
  *out += "\n" + std::string(indent, ' ') + (j.is_object() ? "}" : "]");
}

}  // namespace

Result<Program> ParseProgram(const std::string& text, const std::string& source) {
  try {
    json root;
    std::optional<Overflow> overflow;
    CONCERTO_RETURN_IF_ERROR(ParseJsonText(text, source, &root, &overflow));
    Result<Program> program = Reader(source, std::move(overflow)).Read(root);
    if (!program.ok()) return program;
    CONCERTO_RETURN_IF_ERROR(CheckProgram(*program, source));
    return program;
  } catch (const std::exception& e) {
    return Status::Error(source + ": cannot read: " + e.what());
  }
}

Result<Program> ReadProgramFile(const std::string& path) {
  Result<std::string> text = ReadInputFile(path, "program file", kMaxLargeInputBytes);
  if (!text.ok()) return text.status();
  return ParseProgram(*text, path);
}

namespace {

/// `key` and its separator as WritePretty writes an object member's head.
std::string KeyText(const char* key) { return ScalarText(ojson(key)) + ": "; }

/// Appends what WritePretty would write for an array of the `count` objects
/// `element(i)` makes, holding one of them at a time: on one line when all
/// fit in kLineWidth from `column`, else one per line.
template <class Element>
void WriteObjectArray(size_t count, const Element& element, size_t indent, size_t column, std::string* out) {
  if (count == 0) {
    *out += "[]";
    return;
  }
  const size_t mark = out->size();
  if (column <= kLineWidth) {  // AppendInline's form, stopped at the limit
    const size_t limit = mark + (kLineWidth - column);
    bool fits = true;
    *out += '[';
    for (size_t i = 0; i < count && fits; ++i) {
      if (i > 0) *out += ", ";
      fits = out->size() <= limit && AppendInline(element(i), limit, out);
    }
    if (fits) {
      *out += ']';
      if (out->size() <= limit) return;
    }
    out->resize(mark);
  }
  const std::string pad(indent + 2, ' ');
  *out += "[\n";
  for (size_t i = 0; i < count; ++i) {
    if (i > 0) *out += ",\n";
    *out += pad;
    WritePretty(element(i), indent + 2, pad.size(), out);
  }
  *out += "\n" + std::string(indent, ' ') + "]";
}

/// A graph with ops as WritePretty writes it at `indent` (never on one line:
/// an op alone is wider than kLineWidth), one tensor or op at a time.
void WriteGraphStreaming(const Graph& g, size_t indent, std::string* out) {
  const std::string pad(indent + 2, ' ');
  *out += "{\n" + pad + KeyText("name");
  WritePretty(ojson(g.name), indent + 2, pad.size() + KeyText("name").size(), out);
  *out += ",\n" + pad + KeyText("streams");
  WritePretty(ojson(g.streams), indent + 2, pad.size() + KeyText("streams").size(), out);
  *out += ",\n" + pad + KeyText("tensors");
  WriteObjectArray(
      g.tensors.size(), [&](size_t i) { return TensorJson(g.tensors[i]); }, indent + 2,
      pad.size() + KeyText("tensors").size(), out);
  *out += ",\n" + pad + KeyText("ops");
  WriteObjectArray(
      g.ops.size(), [&](size_t i) { return OpJson(g.ops[i]); }, indent + 2, pad.size() + KeyText("ops").size(), out);
  *out += "\n" + std::string(indent, ' ') + "}";
}

}  // namespace

std::string WriteProgram(const Program& program) {
  std::string out;
  const bool any_ops =
      std::any_of(program.graphs.begin(), program.graphs.end(), [](const Graph& g) { return !g.ops.empty(); });
  if (!any_ops) {  // small: the document at once
    WritePretty(ProgramJson(program), 0, 0, &out);
    out += "\n";
    return out;
  }
  // The same text as WritePretty(ProgramJson(program)) without the document
  // tree (about 3 KB an op): each graph's tensors and ops are converted one at
  // a time. The program, its graph list and every graph with ops span lines.
  ojson head = ProgramJson(Program{program.name, program.mesh, {}, program.roles});
  out += "{\n";
  bool first = true;
  for (auto it = head.begin(); it != head.end(); ++it) {
    out += first ? "  " : ",\n  ";
    first = false;
    const std::string key = ScalarText(ojson(it.key())) + ": ";
    out += key;
    if (it.key() != "graphs") {
      WritePretty(it.value(), 2, 2 + key.size(), &out);
      continue;
    }
    out += "[\n";
    for (size_t i = 0; i < program.graphs.size(); ++i) {
      out += i > 0 ? ",\n    " : "    ";
      const Graph& g = program.graphs[i];
      if (g.ops.empty()) {
        WritePretty(GraphJson(g), 4, 4, &out);
      } else {
        WriteGraphStreaming(g, 4, &out);
      }
    }
    out += "\n  ]";
  }
  out += "\n}\n";
  return out;
}

std::string MalformedJsonMessage(const std::string& text, const std::string& source, size_t byte,
                                 const std::string& what) {
  const size_t offset = byte > 0 ? byte - 1 : 0;
  return source + ":" + LineColumn(text, offset) + ": malformed JSON: " + JsonErrorText(what);
}

}  // namespace concerto
