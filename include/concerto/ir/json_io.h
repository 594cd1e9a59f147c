// JSON text form of Programs (docs/ir.md, docs/ir.schema.json). Reading then
// writing gives back the same document, field for field.
#pragma once

#include <string>

#include "concerto/ir/ir.h"
#include "concerto/util/status.h"

namespace concerto {

/// Parses `text`; `source` (a file name) prefixes every error message. The
/// result has passed VerifyProgram.
Result<Program> ParseProgram(const std::string& text, const std::string& source);
/// Reads and parses a file.
Result<Program> ReadProgramFile(const std::string& path);
/// Canonical JSON text (2-space indent).
std::string WriteProgram(const Program& program);

/// "SOURCE:LINE:COLUMN: malformed JSON: WHY" for an nlohmann parse error in
/// `text`: `byte` is the error's 1-based byte position (parse_error::byte),
/// `what` its what(). Every JSON reader of the project words errors this way.
std::string MalformedJsonMessage(const std::string& text, const std::string& source, size_t byte,
                                 const std::string& what);

}  // namespace concerto
