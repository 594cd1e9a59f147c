#include "concerto/util/did_you_mean.h"

#include <algorithm>

namespace concerto {

namespace {

/// Levenshtein distance (two rows), case-insensitive.
size_t EditDistance(std::string_view a, std::string_view b) {
  auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (lower(a[i - 1]) != lower(b[j - 1]))});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

std::string DidYouMean(std::string_view word, const std::vector<std::string>& candidates) {
  if (word.empty() || word.size() > 256) return "";
  const std::string* best = nullptr;
  size_t best_distance = std::max<size_t>(2, word.size() / 3) + 1;
  for (const std::string& c : candidates) {
    const size_t d = EditDistance(word, c);
    if (d < best_distance) best = &c, best_distance = d;
  }
  if (!best) {
    const std::string* prefixed = nullptr;
    for (const std::string& c : candidates)
      if (c.size() > word.size() && c.compare(0, word.size(), word) == 0) {
        if (prefixed) return "";  // several: no single suggestion
        prefixed = &c;
      }
    best = prefixed;
  }
  return best ? " (did you mean '" + *best + "'?)" : "";
}

}  // namespace concerto
