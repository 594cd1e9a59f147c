#include "concerto/driver/options.h"

#include <cassert>
#include <cmath>
#include <fmt/format.h>

#include <cstdlib>

#include "concerto/util/units.h"

namespace concerto {

const std::vector<OptionSpec>& OptionTable() {
  static const std::vector<OptionSpec> table = {
      {"interference", "fraction", -1, -1, 10,
       "compute slowdown while a collective is in flight (0.2 = 20% slower); -1 takes the cluster's value"},
      {"share-links", "0/1", -1, -1, 1,
       "1: transfers in flight together share each link max-min fairly; 0: every transfer at its price "
       "(the model without link contention); default -1 takes the cluster's topology.share_links"},
      {"ddp-first-bucket", "MiB", 1, 0.001, 1 << 20, "DDP: size of the first gradient bucket"},
      {"ddp-bucket", "MiB", 25, 0.001, 1 << 20, "DDP: size of later gradient buckets"},
      {"megatron-bucket", "parameters", 4e7, 1, 1e12,
       "Megatron: minimum gradient bucket (the bucket is max(this, 1e6 x dp))"},
      {"zero-reduce-bucket", "elements", 5e8, 1, 1e13, "ZeRO: reduce-scatter bucket size"},
      {"zero-prefetch-bucket", "elements", 5e7, 1, 1e13, "ZeRO: all-gather prefetch bucket size"},
      {"block", "ops", 125, 2, 1e6, "concerto: ops per block; each window solves two adjacent blocks"},
      {"rounds", "rounds", 4, 0, 1000, "concerto: odd-even rounds (each an odd and an even pass)"},
      {"stall-rounds", "rounds", 1, 0, 1000,
       "concerto: stop after this many rounds in a row that do not improve the best schedule (0: never)"},
      {"window-fail-limit", "fails", 50, 1, 1e9,
       "concerto: failed search nodes per window solve (deterministic; CBC: branch-and-bound nodes)"},
      {"window-time-limit", "s", 10, 0.01, 3600,
       "concerto: wall-clock safety net per window solve (reported when it fires; results then depend on load)"},
      {"time-budget", "s", 600, 0.1, 86400,
       "concerto: wall-clock safety net for the whole search (reported when it fires)"},
      {"decompose", "chunks", 4, 0, 64,
       "concerto: most chunks the decomposition pass cuts a matmul and its exposed activation collective into "
       "(0 or 1: off)"},
      {"memory-budget", "bytes", -1, -1, 1e15,
       "peak memory per rank a schedule must fit: bytes or a size (80GB, 74.5GiB); 'device' (default): the "
       "device's memory minus the cluster's reserve; 'none': no limit. Schedules over it are marked OOM and "
       "concerto does not return one when one under it exists",
       {{"none", 0}, {"device", -1}}},
      {"list-schedule", "0/1", 1, 0, 1,
       "concerto: also start from critical-path list schedules (pipelines: free and in program order); 0: from "
       "the baselines only"},
  };
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
    if (end == begin || *end != '\0') {
      std::string words;
      for (const auto& w : spec.words) words += (words.empty() ? "" : ", ") + w.first;
      return Status::Error("option --" + spec.name + ": '" + text + "' is not a number" +
                           (words.empty() ? "" : " or one of " + words));
    }
  }
  Options check;
  CONCERTO_RETURN_IF_ERROR(check.Set(spec.name, v));
  return v;
}

Options::Options() {
  for (const auto& spec : OptionTable()) values_[spec.name] = spec.default_value;
}

Status Options::Set(const std::string& name, double value) {
  for (const auto& spec : OptionTable()) {
    if (spec.name != name) continue;
    if (!std::isfinite(value) || value < spec.min_value || value > spec.max_value)
      return Status::Error(fmt::format("option --{}: {} {} is out of range [{}, {}]", name, value, spec.unit,
                                       spec.min_value, spec.max_value));
    // A range that starts at -1 uses -1 as "the default's source" (the
    // cluster's value): other negative values mean nothing and are errors.
    if (spec.min_value == -1 && value < 0 && value != -1)
      return Status::Error(fmt::format("option --{}: {} is negative; give -1 for the cluster's value or a value >= 0",
                                       name, value));
    if (spec.unit == "0/1" && value != 0 && value != 1 && !(spec.min_value == -1 && value == -1))
      return Status::Error(fmt::format("option --{}: {} is not 0 or 1", name, value));
    values_[name] = value;
    return Status::Ok();
  }
  return Status::Error("unknown option --" + name);
}

double Options::Get(const std::string& name) const {
  auto it = values_.find(name);
  assert(it != values_.end() && "option missing from OptionTable");
  return it->second;
}

}  // namespace concerto
