// Models: families, presets, spec files (YAML/JSON), validation and
// parameter counts (the ModelConfig half of lower/transformer.h).
#include "concerto/lower/transformer.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "concerto/lower/evoformer.h"
#include "spec_fields.h"
#include "concerto/util/did_you_mean.h"
#include "concerto/util/input_file.h"

namespace concerto {

namespace {

/// One row of the preset table.
struct PresetRow {
  const char* name;
  ModelFamily family;
  int layers, hidden, heads, kv_heads, ffn_hidden, seq, vocab, batch;
  int experts = 0, top_k = 0;  // mixture of experts (llama blocks)
  double capacity_factor = 0;
};

// GPT: REFERENCES.md "Standard workloads" (Alpa's GPT-3 family; gpt-13b with
// GPT-3's 40 layers; gpt-39b Megatron's 39.1B), sequence 2048, vocab 51,200.
// LLaMA: LLaMA-1 7B and LLaMA-2 70B (GQA with 8 kv heads), sequence 4096 (the
// LLaMA-2 context), vocab 32,000. Batch (sequences per dp rank) 1-8.
constexpr PresetRow kPresets[] = {
    {"gpt-tiny", ModelFamily::kGpt, 2, 256, 4, 4, 1024, 64, 512, 2},
    {"gpt-1.3b", ModelFamily::kGpt, 24, 2048, 32, 32, 8192, 2048, 51200, 8},
    {"gpt-2.7b", ModelFamily::kGpt, 32, 2560, 32, 32, 10240, 2048, 51200, 8},
    {"gpt-6.7b", ModelFamily::kGpt, 32, 4096, 32, 32, 16384, 2048, 51200, 8},
    {"gpt-13b", ModelFamily::kGpt, 40, 5120, 40, 40, 20480, 2048, 51200, 8},
    {"gpt-39b", ModelFamily::kGpt, 48, 8192, 64, 64, 32768, 2048, 51200, 8},
    {"llama-tiny", ModelFamily::kLlama, 2, 256, 8, 2, 512, 64, 512, 2},
    {"llama-7b", ModelFamily::kLlama, 32, 4096, 32, 32, 11008, 4096, 32000, 4},
    {"llama-70b", ModelFamily::kLlama, 80, 8192, 64, 8, 28672, 4096, 32000, 1},
    // Mixtral-like: LLaMA blocks (RMSNorm, GQA) with the MLP replaced by E
    // SwiGLU experts of width ffn_hidden, top-2 routing. Mixtral 8x7B's sizes
    // (46.7B parameters), sequence 4096 as llama; capacity factor 1.25 (GShard).
    // The tiny one drops tokens at capacity factor 1 (C = 32 of 64 tokens x 2).
    {"mixtral-tiny", ModelFamily::kLlama, 2, 256, 8, 2, 256, 64, 512, 2, 4, 2, 1.0},
    {"mixtral-8x7b", ModelFamily::kLlama, 32, 4096, 32, 8, 14336, 4096, 32000, 1, 8, 2, 1.25},
};

/// The ModelConfig of a preset row.
ModelConfig FromRow(const PresetRow& r) {
  ModelConfig m;
  m.name = r.name;
  m.family = r.family;
  m.layers = r.layers;
  m.hidden = r.hidden;
  m.heads = r.heads;
  m.kv_heads = r.kv_heads;
  m.ffn_hidden = r.ffn_hidden;
  m.seq = r.seq;
  m.vocab = r.vocab;
  m.batch = r.batch;
  m.experts = r.experts;
  m.top_k = r.top_k;
  m.capacity_factor = r.capacity_factor;
  return m;
}

/// "gpt-tiny, gpt-1.3b, ...".
/// Every model preset name, the Evoformer's too (LowerModelPlan takes both).
std::vector<std::string> AllPresetNames() {
  std::vector<std::string> names;
  for (const PresetRow& r : kPresets) names.push_back(r.name);
  for (const std::string& n : EvoformerPresetNames()) names.push_back(n);
  return names;
}

std::string PresetList() {
  std::string out;
  for (const std::string& name : AllPresetNames()) out += (out.empty() ? "" : ", ") + name;
  return out;
}

/// Largest accepted model size field (keeps products in int64).
constexpr int64_t kMaxModelDim = 1 << 30;

/// Reads the top-level map of a model spec into a ModelConfig. Every error
/// names the source and the field.
class ModelSpecReader {
 public:
  ModelSpecReader(const std::string& source, const std::string& default_name)
      : source_(source) {
    m_.name = default_name;
    m_.batch = 1;
  }

  /// Fills the config from `root`, applies the defaults and validates it.
  Result<ModelConfig> Read(const YAML::Node& root) {
    if (!root.IsMap()) return Status::Error(source_ + ": top level must be a map of model fields");
    std::set<std::string> seen;
    for (const auto& kv : root) {
      const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "?";
      if (!seen.insert(key).second) return FieldError(key, "given twice");
      CONCERTO_RETURN_IF_ERROR(ReadField(key, kv.second));
    }
    CONCERTO_RETURN_IF_ERROR(ApplyDefaults(seen));
    Status valid = ValidateModel(m_);
    if (!valid.ok()) return Status::Error(source_ + ": " + valid.message());
    return m_;
  }

 private:
  /// "<source>: field '<field>': <what>".
  Status FieldError(const std::string& field, const std::string& what) const {
    return Status::Error(source_ + ": field '" + field + "': " + what);
  }

  /// One field by name; unknown names are errors listing the known ones.
  Status ReadField(const std::string& key, const YAML::Node& node) {
    if (key == "name") return String(key, node, &m_.name);
    if (key == "family") return Family(key, node);
    if (key == "dtype") return Dtype(key, node);
    if (key == "capacity_factor") return Positive(key, node, &m_.capacity_factor);
    if (key == "attention") {
      const std::string v = node.IsScalar() ? node.Scalar() : std::string();
      if (v != "flash" && v != "unfused") return FieldError(key, "must be flash or unfused, got '" + v + "'");
      m_.fused_attention = v == "flash";
      return Status::Ok();
    }
    const std::map<std::string, int*> ints = {
        {"layers", &m_.layers},         {"hidden", &m_.hidden}, {"heads", &m_.heads},
        {"kv_heads", &m_.kv_heads},     {"seq", &m_.seq},       {"vocab", &m_.vocab},
        {"ffn_hidden", &m_.ffn_hidden}, {"batch", &m_.batch},   {"experts", &m_.experts},
        {"top_k", &m_.top_k}};
    auto it = ints.find(key);
    if (it != ints.end()) return Integer(key, node, it->second);
    return FieldError(key, "unknown field (known: name, family, layers, hidden, heads, kv_heads, "
                           "ffn_hidden, seq, vocab, batch, dtype, attention, experts, top_k, "
                           "capacity_factor)");
  }

  /// A finite number > 0 written as a number (not quoted).
  Status Positive(const std::string& key, const YAML::Node& node, double* out) const {
    const std::string text = node.IsScalar() ? node.Scalar() : std::string();
    char* end = nullptr;
    const double v = text.empty() ? 0 : std::strtod(text.c_str(), &end);
    const bool number = node.IsScalar() && node.Tag() != "!" && !text.empty() &&
                        end == text.c_str() + text.size();
    if (!number || !std::isfinite(v) || v <= 0)
      return FieldError(key, "must be a number > 0, got " +
                                 (node.IsScalar() ? "'" + text + "'" : std::string("a non-scalar")));
    *out = v;
    return Status::Ok();
  }

  /// Required fields present; kv_heads, ffn_hidden (gpt) defaulted.
  Status ApplyDefaults(const std::set<std::string>& seen) {
    for (const char* required : {"family", "layers", "hidden", "heads", "seq", "vocab"})
      if (!seen.count(required)) return FieldError(required, "missing (required)");
    if (!seen.count("kv_heads")) m_.kv_heads = m_.heads;
    const bool moe = seen.count("experts") > 0;
    for (const char* key : {"top_k", "capacity_factor"})
      if (!moe && seen.count(key)) return FieldError(key, "needs 'experts' (a mixture of experts)");
    if (moe && !seen.count("top_k")) m_.top_k = std::min(2, m_.experts);
    if (moe && !seen.count("capacity_factor")) m_.capacity_factor = 1.0;
    if (!seen.count("ffn_hidden")) {
      if (m_.family != ModelFamily::kGpt)
        return FieldError("ffn_hidden", "missing (required for family llama)");
      m_.ffn_hidden = 4 * m_.hidden;
    }
    return Status::Ok();
  }

  /// A scalar field as text.
  Status String(const std::string& key, const YAML::Node& node, std::string* out) const {
    if (!node.IsScalar()) return FieldError(key, "must be a string");
    *out = node.Scalar();
    return Status::Ok();
  }

  /// A positive integer written as a number (not quoted).
  Status Integer(const std::string& key, const YAML::Node& node, int* out) const {
    Status s = spec::PositiveInt(node, kMaxModelDim, out);
    return s.ok() ? s : FieldError(key, s.message());
  }

  /// "gpt" or "llama".
  Status Family(const std::string& key, const YAML::Node& node) {
    std::string text;
    CONCERTO_RETURN_IF_ERROR(String(key, node, &text));
    std::optional<ModelFamily> f = ParseModelFamily(text);
    if (!f) return FieldError(key, "must be gpt or llama (vision models: vit, wide-resnet), got '" + text + "'");
    m_.family = *f;
    return Status::Ok();
  }

  /// A floating-point dtype name (bf16, f16, f32).
  Status Dtype(const std::string& key, const YAML::Node& node) {
    Status s = spec::FloatDType(node, &m_.dtype);
    return s.ok() ? s : FieldError(key, s.message());
  }

  const std::string& source_;
  ModelConfig m_;
};

/// "model 'x': <what>".
Status ModelError(const ModelConfig& m, const std::string& what) {
  return Status::Error("model '" + m.name + "': " + what);
}

/// The mixture-of-experts fields: all unset for a dense model; otherwise
/// family llama, 1 <= top_k <= experts, a finite capacity_factor in (0, experts].
Status ValidateExperts(const ModelConfig& m) {
  if (m.experts < 0) return ModelError(m, "experts must be >= 0, got " + std::to_string(m.experts));
  if (m.experts == 0) {
    if (m.top_k != 0 || m.capacity_factor != 0)
      return ModelError(m, "top_k and capacity_factor need experts > 0 (a mixture of experts)");
    return Status::Ok();
  }
  if (m.family != ModelFamily::kLlama)
    return ModelError(m, "experts need family llama (MoE replaces the SwiGLU MLP), got family " +
                             std::string(ToString(m.family)));
  if (m.top_k < 1 || m.top_k > m.experts)
    return ModelError(m, "top_k (" + std::to_string(m.top_k) + ") must be in [1, experts (" +
                             std::to_string(m.experts) + ")]");
  if (!std::isfinite(m.capacity_factor) || m.capacity_factor <= 0)
    return ModelError(m, "capacity_factor must be a finite number > 0, got " +
                             std::to_string(m.capacity_factor));
  // capacity = capacity_factor x tokens x top_k / experts: past `experts` an
  // expert would hold more slots than there are routed tokens (and the slot
  // count would not fit an integer).
  if (m.capacity_factor > m.experts)
    return ModelError(m, "capacity_factor must be at most experts (" + std::to_string(m.experts) +
                             "): a larger one gives an expert more slots than there are tokens; got " +
                             std::to_string(m.capacity_factor));
  return Status::Ok();
}

/// The model's largest tensors and its parameter count, in doubles (they
/// cannot overflow here), each at most kMaxModelElements: every size the
/// lowering then computes in int64 (bytes of a weight's optimizer state,
/// flops of a matmul) stays far from overflow. A model past the limit (e.g.
/// hidden = 2^30) is rejected before anything is built.
Status ValidateModelSize(const ModelConfig& m) {
  constexpr double kMaxModelElements = 1099511627776.0;  // 2^40
  if (m.layers > kMaxModelLayers)
    return ModelError(m, fmt::format("layers must be at most {} (every layer adds ops to the lowered program; "
                                     "the largest published models have under 200), got {}",
                                     kMaxModelLayers, m.layers));
  const double h = m.hidden, f = m.ffn_hidden, tokens = double(m.batch) * m.seq;
  const double experts = std::max(1, m.experts);
  // GPT's MLP has two matrices (fc1, fc2), LLaMA's three (gate, up, down).
  const double mlp_matrices = m.family == ModelFamily::kGpt ? 2.0 : 3.0;
  const std::pair<std::string, double> sizes[] = {
      {"the attention weights (hidden x (hidden + 2 x kv width))", h * (h + 2.0 * m.kv_heads * (h / m.heads))},
      {"an MLP weight (hidden x ffn_hidden x experts)", h * f * experts},
      {"the embedding (vocab x hidden)", double(m.vocab) * h},
      {"an activation (batch x seq x max(hidden, ffn_hidden, vocab))", tokens * std::max({h, f, double(m.vocab)})},
      {"the attention scores (batch x heads x seq x seq)", tokens * m.heads * m.seq},
      {"the parameters (layers x per-layer weights)",
       m.layers * (h * h * 4 + mlp_matrices * h * f * experts) + 2.0 * m.vocab * h},
  };
  for (const auto& [what, elements] : sizes)
    if (!(elements <= kMaxModelElements))
      return ModelError(m, fmt::format("{} would have {:.3g} elements, more than the limit of 2^40 "
                                       "(docs/frontends.md, \"Model spec files\")",
                                       what, elements));
  return Status::Ok();
}

}  // namespace

std::string_view ToString(ModelFamily family) {
  return family == ModelFamily::kGpt ? "gpt" : "llama";
}

std::optional<ModelFamily> ParseModelFamily(std::string_view text) {
  if (text == "gpt") return ModelFamily::kGpt;
  if (text == "llama") return ModelFamily::kLlama;
  return std::nullopt;
}

std::vector<std::string> ModelPresetNames() {
  std::vector<std::string> names;
  for (const PresetRow& r : kPresets) names.push_back(r.name);
  return names;
}

Result<ModelConfig> ModelPreset(const std::string& name) {
  for (const PresetRow& r : kPresets)
    if (name == r.name) return FromRow(r);
  std::string known;
  for (const std::string& n : ModelPresetNames()) known += (known.empty() ? "" : ", ") + n;
  return Status::Error("model: unknown preset '" + name + "'" + DidYouMean(name, ModelPresetNames()) +
                       " (known: " + known + ")");
}

Result<ModelConfig> ParseModelSpec(const std::string& text, const std::string& source,
                                   const std::string& default_name) {
  try {
    return ModelSpecReader(source, default_name).Read(YAML::Load(text));
  } catch (const YAML::Exception& e) {
    return Status::Error(source + ": line " + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
}

Result<ModelConfig> LoadModelFile(const std::string& path) {
  Result<std::string> text = ReadInputFile(path, "model spec file", kMaxSmallInputBytes);
  if (!text.ok()) return text.status();
  return ParseModelSpec(*text, path, std::filesystem::path(path).stem().string());
}

Result<ModelConfig> LoadModel(const std::string& name_or_path) {
  for (const PresetRow& r : kPresets)
    if (name_or_path == r.name) return FromRow(r);
  std::error_code ec;
  if (std::filesystem::is_regular_file(name_or_path, ec)) return LoadModelFile(name_or_path);
  return Status::Error("model '" + name_or_path + "'" + DidYouMean(name_or_path, AllPresetNames()) +
                       ": not a preset (" + PresetList() + ") and not a readable model spec file");
}

Status ValidateModel(const ModelConfig& m) {
  const std::pair<const char*, int> sizes[] = {
      {"layers", m.layers}, {"hidden", m.hidden},         {"heads", m.heads},
      {"kv_heads", m.kv_heads}, {"ffn_hidden", m.ffn_hidden}, {"seq", m.seq},
      {"vocab", m.vocab},   {"batch", m.batch}};
  for (const auto& [field, value] : sizes)
    if (value <= 0)
      return ModelError(m, std::string(field) + " must be positive, got " + std::to_string(value));
  if (m.hidden % m.heads != 0)
    return ModelError(m, "heads (" + std::to_string(m.heads) + ") must divide hidden (" +
                             std::to_string(m.hidden) + ")");
  if (m.heads % m.kv_heads != 0)
    return ModelError(m, "kv_heads (" + std::to_string(m.kv_heads) + ") must divide heads (" +
                             std::to_string(m.heads) + ")");
  if (m.dtype == DType::kI32 || m.dtype == DType::kI64)
    return ModelError(m, "dtype must be bf16, f16 or f32");
  CONCERTO_RETURN_IF_ERROR(ValidateExperts(m));
  return ValidateModelSize(m);
}

int64_t ModelParameterCount(const ModelConfig& m) {
  const int64_t h = m.hidden, f = m.ffn_hidden, kv_width = int64_t{m.kv_heads} * (h / m.heads);
  const int64_t attention = 2 * h * h + 2 * h * kv_width;  // q and o; k and v
  if (m.family == ModelFamily::kGpt) {
    const int64_t per_layer = attention + 2 * h * f + 4 * h;  // fc1, fc2; two LayerNorms
    return m.layers * per_layer + int64_t{m.vocab} * h + int64_t{m.seq} * h + 2 * h;
  }
  const int64_t mlp = IsMoe(m) ? m.experts * 3 * h * f + h * m.experts  // experts, router
                               : 3 * h * f;                         // gate, up, down
  const int64_t per_layer = attention + mlp + 2 * h;  // two RMSNorms
  return m.layers * per_layer + 2 * int64_t{m.vocab} * h + h;
}

bool IsMoe(const ModelConfig& model) { return model.experts > 0; }

int64_t MoeCapacity(const ModelConfig& m) {
  if (!IsMoe(m)) return 0;
  const double slots = m.capacity_factor * m.seq * m.top_k / static_cast<double>(m.experts);
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(slots - 1e-9)));
}

}  // namespace concerto
