#include "concerto/lower/plan.h"

#include <charconv>
#include <set>

namespace concerto {

Result<DpTpPlan> ParseDpTpPlan(const std::string& text) {
  DpTpPlan plan;
  std::set<std::string> seen;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? text.size() + 1 : comma + 1;
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string::npos)
      return Status::Error("plan '" + text + "': item '" + item + "' is not KEY=VALUE (e.g. dp=4,tp=8)");
    std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key != "dp" && key != "tp")
      return Status::Error("plan '" + text + "': unknown key '" + key + "' (this frontend knows dp and tp)");
    if (!seen.insert(key).second) return Status::Error("plan '" + text + "': key '" + key + "' given twice");
    int n = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    if (ec != std::errc() || end != value.data() + value.size() || n < 1)
      return Status::Error("plan '" + text + "': " + key + " must be a positive integer, got '" + value + "'");
    (key == "dp" ? plan.dp : plan.tp) = n;
  }
  return plan;
}

}  // namespace concerto
