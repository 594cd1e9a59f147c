#include "concerto/util/input_file.h"

#include <filesystem>
#include <fstream>

namespace concerto {

namespace {

std::string Size(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30)) return std::to_string(bytes >> 30) + " GiB";
  if (bytes >= (int64_t{1} << 20)) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes) + " bytes";
}

}  // namespace

Status CheckWhitespaceRuns(std::string_view text, const std::string& source) {
  int64_t run = 0, line = 1, run_line = 1;
  for (char c : text) {
    const bool space = c == ' ' || c == '\t' || c == '\n' || c == '\r';
    if (!space) {
      run = 0;
      continue;
    }
    if (run == 0) run_line = line;
    if (c == '\n') ++line;
    if (++run > kMaxWhitespaceRun)
      return Status::Error(source + ":" + std::to_string(run_line) + ": more than " + Size(kMaxWhitespaceRun) +
                           " of whitespace in a row (the readers' limit, docs/ir.md \"Limits\")");
  }
  return Status::Ok();
}

Result<std::string> ReadInputFile(const std::string& path, std::string_view what, int64_t max_bytes) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) return Status::Error(path + ": no such " + std::string(what));
  if (std::filesystem::is_directory(status))
    return Status::Error(path + ": is a directory, not a " + std::string(what));
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error(path + ": cannot open the " + std::string(what));
  std::string text;
  if (std::filesystem::is_regular_file(status)) {
    const auto size = std::filesystem::file_size(path, ec);
    if (!ec && static_cast<int64_t>(size) > max_bytes)
      return Status::Error(path + ": the " + std::string(what) + " is " + Size(static_cast<int64_t>(size)) +
                           ", more than the limit of " + Size(max_bytes) + " (docs/ir.md \"Limits\")");
    if (!ec) text.reserve(size);
  }
  // Read in pieces so that a pipe or a file that grows cannot pass the limit.
  char buffer[1 << 16];
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
    text.append(buffer, static_cast<size_t>(in.gcount()));
    if (static_cast<int64_t>(text.size()) > max_bytes)
      return Status::Error(path + ": the " + std::string(what) + " is more than the limit of " + Size(max_bytes) +
                           " (docs/ir.md \"Limits\")");
  }
  if (in.bad()) return Status::Error(path + ": read error");
  if (Status s = CheckWhitespaceRuns(text, path); !s.ok()) return s;
  return text;
}

Status WriteTextFile(const std::string& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary);
  if (!out) return Status::Error(path + ": cannot open for writing");
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.close();
  if (!out) return Status::Error(path + ": write failed");
  return Status::Ok();
}

}  // namespace concerto
