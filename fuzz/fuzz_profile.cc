// Fuzz target: profile databases (ProfileDb::Parse, what `--profile` and
// `profile --merge` read). An accepted database writes and reads back to the
// same entries, and merges with itself and with its entries halved without a
// crash: every merged entry is a finite duration within the profile limit.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "concerto/cost/cost_model.h"
#include "concerto/profile/profile.h"

namespace {
[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "%s\n", what);
  std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  concerto::Result<concerto::ProfileDb> db = concerto::ProfileDb::Parse(text, "fuzz.json");
  if (!db.ok()) return 0;
  concerto::Result<concerto::ProfileDb> again = concerto::ProfileDb::Parse(db->Write(), "written.json");
  if (!again.ok() || again->entries() != db->entries()) Die("a written database does not read back the same");
  std::vector<concerto::ProfileDb> dbs = {*db, *db};
  // A second database: the input's own entries with every duration halved.
  concerto::ProfileDb halves;
  for (const auto& [key, us] : db->entries()) halves.Add(key.first, key.second, us / 2);
  dbs.push_back(halves);
  const concerto::MergedProfile merged = concerto::MergeProfiles(dbs);
  for (const auto& [key, us] : merged.db.entries())
    if (!std::isfinite(us) || us < 0 || us > concerto::kMaxProfiledUs) Die("a merged entry is out of range");
  return 0;
}
