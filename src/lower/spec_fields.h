// Field readers shared by the model spec files' readers (model_config.cc for
// the transformers, vision.cc for the vision models). Each returns what is
// wrong with the value (the caller names the file and field) or Ok.
// Internal to src/lower/.
#pragma once

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>

#include "concerto/ir/ir.h"
#include "concerto/util/status.h"

namespace concerto::spec {

/// A positive integer written as a number (not quoted), at most `max`.
inline Status PositiveInt(const YAML::Node& node, int64_t max, int* out) {
  const std::string text = node.IsScalar() ? node.Scalar() : std::string();
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  const bool number = node.IsScalar() && node.Tag() != "!" && !text.empty() && ec == std::errc() &&
                      end == text.data() + text.size();
  if (!number || v < 1 || v > max)
    return Status::Error("must be a positive integer (at most " + std::to_string(max) + "), got " +
                         (node.IsScalar() ? "'" + text + "'" : std::string("a non-scalar")));
  *out = static_cast<int>(v);
  return Status::Ok();
}

/// A floating-point dtype name (bf16, f16, f32).
inline Status FloatDType(const YAML::Node& node, DType* out) {
  if (!node.IsScalar()) return Status::Error("must be a string");
  std::optional<DType> d = ParseDType(node.Scalar());
  if (!d || *d == DType::kI32 || *d == DType::kI64)
    return Status::Error("must be bf16, f16 or f32, got '" + node.Scalar() + "'");
  *out = *d;
  return Status::Ok();
}

}  // namespace concerto::spec
