// The one table of numeric options: name, unit, default and bounds. The CLI
// registers flags from it and validates every value once, here.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "concerto/util/status.h"

namespace concerto {

struct OptionSpec {
  std::string name;  // flag name without dashes, kebab-case
  std::string unit;
  double default_value;
  double min_value;
  double max_value;
  std::string help;
  /// Words the option also takes, with the value each stands for
  /// (memory-budget: "none" = 0, "device" = -1).
  std::vector<std::pair<std::string, double>> words = {};
};

/// Reads an option's text: one of its words, a size with a unit for
/// options measured in bytes ("80GB", "74.5GiB"), or a plain number; then
/// checks it as Options::Set does. The error names the option.
Result<double> ParseOptionValue(const OptionSpec& spec, const std::string& text);

/// Every numeric option the tool takes.
const std::vector<OptionSpec>& OptionTable();

/// Values by option name, defaults filled in.
class Options {
 public:
  Options();
  /// Sets `name` to `value` after checking the bounds; the error names the
  /// option, its unit and its bounds.
  Status Set(const std::string& name, double value);
  double Get(const std::string& name) const;

  /// Simulate every rank even where one representative per role is exact.
  bool all_ranks = false;
  /// Window solver backend of the concerto scheduler ("gecode" or "cbc").
  std::string solver = "gecode";

 private:
  std::map<std::string, double> values_;
};

}  // namespace concerto
