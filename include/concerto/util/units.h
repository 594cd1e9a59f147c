// Sizes as people write them: "80GB", "74.5GiB", "512MiB", "3e9".
#pragma once

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string>

#include "concerto/util/status.h"

namespace concerto {

/// Bytes from a number with an optional unit: B, kB/KB, MB, GB, TB (powers of
/// 1000) or KiB, MiB, GiB, TiB (powers of 1024), with or without a space;
/// no unit means bytes. Errors name the text and the units accepted.
/// Whether [begin, end) is a decimal number as people write one ("80", "74.5", "3e9", "-1"):
/// strtod also reads hexadecimal ("0x10" is 16), "inf" and "nan", which a size or an option
/// value never means.
inline bool IsDecimalNumber(const char* begin, const char* end) {
  if (begin == end) return false;
  for (const char* c = begin; c != end; ++c)
    if (!std::isdigit(static_cast<unsigned char>(*c)) && *c != '.' && *c != 'e' && *c != 'E' && *c != '+' && *c != '-')
      return false;
  return true;
}

inline Result<double> ParseByteSize(const std::string& text) {
  const char* begin = text.c_str();
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  auto error = [&] {
    return Status::Error("'" + text + "' is not a size: give bytes or a number with a unit (B, KB, MB, GB, TB, KiB, "
                         "MiB, GiB, TiB), e.g. 80GB or 74.5GiB");
  };
  if (end == begin || !std::isfinite(v) || !IsDecimalNumber(begin, end)) return error();
  std::string unit(end);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  struct Unit {
    const char* name;
    double bytes;
  };
  static constexpr Unit kUnits[] = {{"", 1},       {"B", 1},        {"kB", 1e3},          {"KB", 1e3},
                                    {"MB", 1e6},   {"GB", 1e9},     {"TB", 1e12},         {"KiB", 1024.0},
                                    {"MiB", 1 << 20}, {"GiB", double(1 << 30)}, {"TiB", 1099511627776.0}};
  for (const Unit& u : kUnits)
    if (unit == u.name) return v * u.bytes;
  return error();
}

}  // namespace concerto
