// GPT entry points over the transformer frontend (concerto/lower/transformer.h).
#include "concerto/lower/gpt.h"

#include <string>

namespace concerto {
namespace {

/// "what (value) must ..." when `value` is not positive.
Status CheckPositive(const std::string& what, int64_t value) {
  if (value > 0) return Status::Ok();
  return Status::Error("gpt: " + what + " must be positive, got " + std::to_string(value));
}

/// Error unless `divisor` divides `value`.
Status CheckDivides(const std::string& divisor_name, int64_t divisor,
                    const std::string& value_name, int64_t value) {
  if (value % divisor == 0) return Status::Ok();
  return Status::Error("gpt: " + divisor_name + " (" + std::to_string(divisor) +
                       ") must divide " + value_name + " (" + std::to_string(value) + ")");
}

}  // namespace

std::vector<std::string> GptPresetNames() {
  std::vector<std::string> names;
  for (const std::string& name : ModelPresetNames()) {
    Result<ModelConfig> m = ModelPreset(name);
    if (m.ok() && m->family == ModelFamily::kGpt) names.push_back(name);
  }
  return names;
}

Result<GptConfig> GptPreset(const std::string& name) {
  Result<ModelConfig> m = ModelPreset(name);
  if (!m.ok() || m->family != ModelFamily::kGpt) {
    std::string known;
    for (const auto& n : GptPresetNames()) known += (known.empty() ? "" : ", ") + n;
    return Status::Error("gpt: unknown preset '" + name + "' (known: " + known + ")");
  }
  GptConfig c;
  c.name = m->name;
  c.layers = m->layers;
  c.hidden = m->hidden;
  c.heads = m->heads;
  c.seq = m->seq;
  c.vocab = m->vocab;
  c.batch = m->batch;
  c.ffn_mult = m->ffn_hidden / m->hidden;
  c.dtype = m->dtype;
  return c;
}

ModelConfig ToModelConfig(const GptConfig& c) {
  ModelConfig m;
  m.name = c.name;
  m.family = ModelFamily::kGpt;
  m.layers = c.layers;
  m.hidden = c.hidden;
  m.heads = c.heads;
  m.kv_heads = c.heads;
  m.ffn_hidden = c.ffn_mult * c.hidden;
  m.seq = c.seq;
  m.vocab = c.vocab;
  m.batch = c.batch;
  m.dtype = c.dtype;
  return m;
}

Status ValidateGpt(const GptConfig& c, const DpTpPlan& plan) {
  CONCERTO_RETURN_IF_ERROR(CheckPositive("layers", c.layers));
  CONCERTO_RETURN_IF_ERROR(CheckPositive("hidden", c.hidden));
  CONCERTO_RETURN_IF_ERROR(CheckPositive("heads", c.heads));
  CONCERTO_RETURN_IF_ERROR(CheckPositive("seq", c.seq));
  CONCERTO_RETURN_IF_ERROR(CheckPositive("vocab", c.vocab));
  CONCERTO_RETURN_IF_ERROR(CheckPositive("batch", c.batch));
  CONCERTO_RETURN_IF_ERROR(CheckPositive("ffn_mult", c.ffn_mult));
  CONCERTO_RETURN_IF_ERROR(CheckPositive("dp", plan.dp));
  CONCERTO_RETURN_IF_ERROR(CheckPositive("tp", plan.tp));
  CONCERTO_RETURN_IF_ERROR(CheckDivides("heads", c.heads, "hidden", c.hidden));
  CONCERTO_RETURN_IF_ERROR(CheckDivides("tp", plan.tp, "heads", c.heads));
  CONCERTO_RETURN_IF_ERROR(CheckDivides("tp", plan.tp, "vocab", c.vocab));
  CONCERTO_RETURN_IF_ERROR(
      CheckDivides("tp", plan.tp, "ffn_mult * hidden", int64_t{c.ffn_mult} * c.hidden));
  return Status::Ok();
}

int64_t GptParameterCount(const GptConfig& c) { return ModelParameterCount(ToModelConfig(c)); }

Result<Program> LowerGpt(const GptConfig& config, const DpTpPlan& plan) {
  CONCERTO_RETURN_IF_ERROR(ValidateGpt(config, plan));
  return LowerTransformer(ToModelConfig(config), ToParallelPlan(plan));
}

}  // namespace concerto
