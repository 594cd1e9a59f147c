// Suggestions for mistyped names in error messages ("did you mean 'gpt-13b'?").
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace concerto {

/// " (did you mean 'x'?)" for the candidate closest to `word` (edit distance
/// at most a third of its length, at least 2, or `word` a prefix of exactly
/// one candidate); "" when none is close.
std::string DidYouMean(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace concerto
