// The option table (driver/options.h) as CLI11 flags, shared by the two
// tools (concerto and concerto_mpi_run): one flag per option record, its help
// generated from the record (unit, default, range), its value parsed and
// checked against the record while the command line is parsed, so that a
// bad value is a usage error naming the option and its bounds.
#pragma once

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <string>

#include "concerto/driver/options.h"

namespace concerto {

/// An option's default as --help shows it: its word when it has one for that value.
inline std::string OptionDefaultText(const OptionSpec& spec) {
  for (const auto& [word, value] : spec.words)
    if (value == spec.default_value) return word;
  return fmt::format("{}", spec.default_value);
}

/// Adds one flag per option of OptionTable() to `cmd`, setting `options`.
inline void AddOptionFlags(CLI::App* cmd, Options* options) {
  for (const OptionSpec& spec : OptionTable()) {
    cmd->add_option_function<std::string>(
           "--" + spec.name,
           [options, spec](const std::string& text) {
             Result<double> v = ParseOptionValue(spec, text);
             if (!v.ok()) throw CLI::ValidationError(v.status().message());
             Status set = options->Set(spec.name, *v);
             if (!set.ok()) throw CLI::ValidationError(set.message());
           },
           fmt::format("{} [{}] (default {}, range {}..{})", spec.help, spec.unit, OptionDefaultText(spec),
                       spec.min_value, spec.max_value))
        ->type_name(spec.unit == "bytes" ? "SIZE" : "NUM");
  }
}

}  // namespace concerto
