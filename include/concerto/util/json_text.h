// JSON text that never fails and never recurses without bound: values shown
// in error messages (DescribeJson) and JSON written for users (DumpJson).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace concerto {

/// A value as an error message shows it: a scalar as JSON (strings quoted,
/// invalid UTF-8 replaced, at most 80 characters), a container by its type
/// and size ("a list of 3 items", "an object with 2 keys"), never its
/// contents, so a deeply nested or huge value costs nothing to describe.
template <typename Json>
std::string DescribeJson(const Json& v) {
  if (v.is_array()) return "a list of " + std::to_string(v.size()) + (v.size() == 1 ? " item" : " items");
  if (v.is_object()) return "an object with " + std::to_string(v.size()) + (v.size() == 1 ? " key" : " keys");
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

/// `v` as JSON text for output; invalid UTF-8 in strings (a name read from
/// a file) is replaced by U+FFFD instead of throwing. `indent` as
/// nlohmann's dump (-1: one line).
template <typename Json>
std::string DumpJson(const Json& v, int indent = -1) {
  return v.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace concerto
