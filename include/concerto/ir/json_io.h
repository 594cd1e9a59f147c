// JSON text form of Programs (docs/ir.md, docs/ir.schema.json). Reading then
// writing gives back the same document, field for field.
#pragma once

#include <nlohmann/json.hpp>
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

/// `text` parsed as a JSON document of type `Json` (nlohmann::json or
/// ordered_json), never throwing: a syntax error gives MalformedJsonMessage,
/// any other parser exception (a number past a double's range, 1e999)
/// "SOURCE: malformed JSON: ..." with the parser's reason. Every JSON reader
/// that does not need ParseProgram's overflow location goes through it.
template <typename Json>
Result<Json> ParseJsonDocument(const std::string& text, const std::string& source) {
  try {
    return Json::parse(text);
  } catch (const typename Json::parse_error& e) {
    return Status::Error(MalformedJsonMessage(text, source, e.byte, e.what()));
  } catch (const typename Json::exception& e) {
    std::string why = e.what();
    const size_t bracket = why.find("] ");
    if (bracket != std::string::npos) why = why.substr(bracket + 2);
    return Status::Error(source + ": malformed JSON: " + why);
  }
}

}  // namespace concerto
