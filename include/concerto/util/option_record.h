// Option records: one per option, declared once next to the struct it
// configures (SimOptionRecords in sim/simulator.h, BaselineOptionRecords in
// schedule/scheduler.h, ConcertoOptionRecords in schedule/concerto_scheduler.h,
// DecomposeOptionRecords in decompose/decompose.h, the driver's own in
// driver/options.h). A record names the option (a kebab-case flag), its unit,
// bounds, help, the words it also takes, and the struct field it sets; its
// default is the field's initializer (no second copy). The driver's option
// table (driver/options.h) gathers every record; the CLI's flags, their
// --help and the JSON reports' "options" object are generated from it.
#pragma once

#include <cmath>
#include <cstdint>
#include <fmt/format.h>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "concerto/util/status.h"

namespace concerto {

template <typename Struct>
struct OptionRecord {
  using Field = std::variant<int Struct::*, int64_t Struct::*, double Struct::*, bool Struct::*>;
  using Words = std::vector<std::pair<std::string, double>>;

  /// `field_scale`: the field holds value x scale (an option in MiB setting
  /// a field in bytes: 2^20). `option_words`: words the option also takes,
  /// with the value each stands for (memory-budget: "none" = 0, "device" = -1).
  template <typename Member>
  OptionRecord(std::string option_name, std::string option_unit, double min, double max, std::string option_help,
               Member Struct::*member, double field_scale = 1, Words option_words = {})
      : name(std::move(option_name)),
        unit(std::move(option_unit)),
        min_value(min),
        max_value(max),
        help(std::move(option_help)),
        field(member),
        scale(field_scale),
        words(std::move(option_words)) {}

  std::string name;  // flag name without dashes, kebab-case
  std::string unit;  // "bytes" values also take sizes ("80GB"); "0/1" is a switch
  double min_value;
  double max_value;
  std::string help;
  Field field;  // the field the option sets (the value times `scale`, converted to its type)
  double scale;
  Words words;

  /// The option's value in `s`, in the option's unit.
  double Get(const Struct& s) const {
    return std::visit([&](auto member) { return static_cast<double>(s.*member) / scale; }, field);
  }
  /// The default: the value in a default-constructed Struct.
  double Default() const { return Get(Struct{}); }

  /// Checks `value` against the bounds; the error names the option, its
  /// unit and its bounds. A range that starts at -1 uses -1 as "the
  /// default's source" (the cluster's value): other negative values are errors.
  Status Check(double value) const {
    if (!std::isfinite(value) || value < min_value || value > max_value)
      return Status::Error(
          fmt::format("option --{}: {} {} is out of range [{}, {}]", name, value, unit, min_value, max_value));
    if (min_value == -1 && value < 0 && value != -1)
      return Status::Error(
          fmt::format("option --{}: {} is negative; give -1 for the cluster's value or a value >= 0", name, value));
    if (unit == "bytes" && value > 0 && value < 1)
      return Status::Error(fmt::format("option --{}: {} bytes is less than one byte (a size is at least 1 byte)",
                                       name, value));
    if (unit == "0/1" && value != 0 && value != 1 && !(min_value == -1 && value == -1))
      return Status::Error(fmt::format("option --{}: {} is not 0 or 1", name, value));
    return Status::Ok();
  }

  /// Checks `value`, then sets the field of `s`.
  Status Set(Struct& s, double value) const {
    CONCERTO_RETURN_IF_ERROR(Check(value));
    std::visit(
        [&](auto member) {
          using T = std::remove_reference_t<decltype(s.*member)>;
          if constexpr (std::is_same_v<T, bool>)
            s.*member = value != 0;
          else
            s.*member = static_cast<T>(value * scale);
        },
        field);
    return Status::Ok();
  }
};

}  // namespace concerto
