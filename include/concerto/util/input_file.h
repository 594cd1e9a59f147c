// Files: reading input files within documented limits (docs/ir.md, "Limits"):
// every reader goes through ReadInputFile, so a small or degenerate file cannot
// make a reader use memory or time out of proportion to its size; and the one
// way output files are written (WriteTextFile).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "concerto/util/status.h"

namespace concerto {

/// Programs, schedules, profile databases: the largest files the tool reads.
inline constexpr int64_t kMaxLargeInputBytes = int64_t{1} << 30;  // 1 GiB
/// Plans, clusters, models, sharding files.
inline constexpr int64_t kMaxSmallInputBytes = int64_t{64} << 20;  // 64 MiB
/// Whitespace in a row: JSON's parser keeps the run before a failing token
/// and escapes it into its message (8 bytes per newline), so a file of
/// newlines would cost ten times its size to reject.
inline constexpr int64_t kMaxWhitespaceRun = int64_t{1} << 20;  // 1 MiB

/// The whole text of `path`, a regular file of at most `max_bytes` bytes, with
/// no whitespace run over kMaxWhitespaceRun. `what` names the file's kind in
/// messages ("plan file"). Errors start with the path.
Result<std::string> ReadInputFile(const std::string& path, std::string_view what, int64_t max_bytes);

/// Ok, or an error naming `source`, the line and the limit, when `text` holds
/// more than kMaxWhitespaceRun whitespace characters in a row.
Status CheckWhitespaceRuns(std::string_view text, const std::string& source);

/// Writes `text` to `path` (created or truncated). Errors name the path.
Status WriteTextFile(const std::string& path, std::string_view text);

}  // namespace concerto
