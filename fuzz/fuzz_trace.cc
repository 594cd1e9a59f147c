// Fuzz target: Chrome traces read by `profile --from-trace` (DurationsFromTrace)
// against gpt-tiny under dp=2 (the program fuzz/seeds/trace/ was recorded
// from), the first byte's low bit choosing whether collectives are taken too.
// Every accepted trace gives samples with finite, non-negative medians.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "concerto/cost/cluster.h"
#include "concerto/lower/frontend.h"
#include "concerto/profile/profile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const concerto::Program program = concerto::LowerModelPlan("gpt-tiny", "dp=2").value();
  static const concerto::ClusterSpec cluster = concerto::LoadCluster("a800-4x8").value();
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  concerto::Result<std::vector<concerto::TraceSample>> samples =
      concerto::DurationsFromTrace(text, "fuzz.json", program, cluster, data[0] & 1);
  if (!samples.ok()) return 0;
  for (const concerto::TraceSample& s : *samples)
    if (!std::isfinite(s.median_us) || s.median_us < 0 || s.count < 1) {
      std::fprintf(stderr, "bad sample '%s': median %g over %d\n", s.signature.c_str(), s.median_us, s.count);
      std::abort();
    }
  return 0;
}
