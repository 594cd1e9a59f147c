#include "concerto/driver/options.h"

#include <cassert>
#include <cstdlib>

#include "concerto/util/units.h"

namespace concerto {

const std::vector<OptionRecord<Options>>& DriverOptionRecords() {
  static const std::vector<OptionRecord<Options>> records = {
      {"memory-budget", "bytes", -1, 1e15,
       "peak memory per rank a schedule must fit: bytes or a size (80GB, 74.5GiB); 'device' (default): the "
       "device's memory minus the cluster's reserve; 'none': no limit. Schedules over it are marked OOM and "
       "concerto does not return one when one under it exists",
       &Options::memory_budget, 1, {{"none", 0}, {"device", -1}}},
  };
  return records;
}

namespace {

/// Rows for the records of one struct, reached from Options by `part`.
template <typename Struct, typename Part>
void AddRows(std::vector<OptionSpec>& table, const std::vector<OptionRecord<Struct>>& records, Part part) {
  for (const OptionRecord<Struct>& r : records)
    table.push_back({r.name, r.unit, r.Default(), r.min_value, r.max_value, r.help, r.words,
                     [r, part](const Options& o) { return r.Get(part(const_cast<Options&>(o))); },
                     [r, part](Options& o, double v) { return r.Set(part(o), v); }});
}

}  // namespace

const std::vector<OptionSpec>& OptionTable() {
  static const std::vector<OptionSpec> table = [] {
    std::vector<OptionSpec> t;
    AddRows(t, SimOptionRecords(), [](Options& o) -> SimOptions& { return o.concerto.sim; });
    AddRows(t, BaselineOptionRecords(), [](Options& o) -> BaselineOptions& { return o.concerto.baselines; });
    AddRows(t, ConcertoOptionRecords(), [](Options& o) -> ConcertoOptions& { return o.concerto; });
    AddRows(t, DecomposeOptionRecords(), [](Options& o) -> DecomposeOptions& { return o.decompose; });
    AddRows(t, DriverOptionRecords(), [](Options& o) -> Options& { return o; });
    return t;
  }();
  return table;
}

Result<double> ParseOptionValue(const OptionSpec& spec, const std::string& text) {
  for (const auto& [word, value] : spec.words)
    if (text == word) return value;
  double v = 0;
  if (spec.unit == "bytes") {
    Result<double> bytes = ParseByteSize(text);
    if (!bytes.ok()) return Status::Error("option --" + spec.name + ": " + bytes.status().message());
    v = *bytes;
  } else {
    const char* begin = text.c_str();
    char* end = nullptr;
    v = std::strtod(begin, &end);
    if (end == begin || *end != '\0' || !IsDecimalNumber(begin, end)) {
      std::string words;
      for (const auto& w : spec.words) words += (words.empty() ? "" : ", ") + w.first;
      return Status::Error("option --" + spec.name + ": '" + text + "' is not a number" +
                           (words.empty() ? "" : " or one of " + words));
    }
  }
  Options check;
  CONCERTO_RETURN_IF_ERROR(spec.set(check, v));
  return v;
}

Status Options::Set(const std::string& name, double value) {
  for (const OptionSpec& spec : OptionTable())
    if (spec.name == name) return spec.set(*this, value);
  return Status::Error("unknown option --" + name);
}

double Options::Get(const std::string& name) const {
  for (const OptionSpec& spec : OptionTable())
    if (spec.name == name) return spec.get(*this);
  assert(false && "option missing from OptionTable");
  return 0;
}

nlohmann::json OptionsJson(const Options& options) {
  nlohmann::json j = nlohmann::json::object();
  for (const OptionSpec& spec : OptionTable()) j[spec.name] = spec.get(options);
  j["solver"] = options.concerto.solver;
  return j;
}

}  // namespace concerto
