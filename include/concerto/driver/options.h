// The option table: every option of a job, gathered from the option records
// declared next to the structs they configure (util/option_record.h:
// SimOptionRecords, BaselineOptionRecords, ConcertoOptionRecords,
// DecomposeOptionRecords, and the driver's own memory-budget below). The
// CLI's flags (tools/common/option_flags.h, both tools), their --help and the
// JSON reports' "options" object are generated from it; every value is
// checked once, by its record.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "concerto/decompose/decompose.h"
#include "concerto/schedule/concerto_scheduler.h"
#include "concerto/util/option_record.h"
#include "concerto/util/status.h"

namespace concerto {

/// Everything a job's scheduler, simulation and passes can be told.
struct Options {
  /// The concerto search; its `baselines` and `sim` are the baselines' and
  /// the simulation's options for every scheduler.
  ConcertoOptions concerto;
  /// The decomposition pass (its interference is concerto.sim's).
  DecomposeOptions decompose;
  /// Peak memory per rank a schedule must fit, bytes; -1: the device's memory
  /// minus the cluster's reserve; 0: no limit.
  double memory_budget = -1;
  /// Simulate every rank even where one representative per role is exact.
  bool all_ranks = false;

  /// Sets option `name` (a record's name) after checking it; the error names
  /// the option, its unit and its bounds. Unknown names are errors.
  Status Set(const std::string& name, double value);
  /// The value of option `name` (asserts it exists).
  double Get(const std::string& name) const;
};

/// The driver's own option records (memory-budget).
const std::vector<OptionRecord<Options>>& DriverOptionRecords();

/// One row of the option table: a record of one of the structs above, with
/// the way to reach its field from Options.
struct OptionSpec {
  std::string name;  // flag name without dashes, kebab-case
  std::string unit;
  double default_value;
  double min_value;
  double max_value;
  std::string help;
  std::vector<std::pair<std::string, double>> words;
  std::function<double(const Options&)> get;
  std::function<Status(Options&, double)> set;
};

/// Every option, in --help order: the simulation's, the baselines', the
/// concerto search's, the decomposition pass's, the driver's.
const std::vector<OptionSpec>& OptionTable();

/// Reads an option's text: one of its words, a size with a unit for options
/// measured in bytes ("80GB", "74.5GiB"), or a plain number; then checks it
/// as Options::Set does. The error names the option.
Result<double> ParseOptionValue(const OptionSpec& spec, const std::string& text);

/// Every option's value by name, and the window solver: the "options" object
/// of the JSON reports.
nlohmann::json OptionsJson(const Options& options);

}  // namespace concerto
