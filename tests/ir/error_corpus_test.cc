// The error corpus: every tests/errors/NAME.json must be rejected with a
// message that contains tests/errors/NAME.expected (file, op and field).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "concerto/ir/json_io.h"

namespace concerto {
namespace {

namespace fs = std::filesystem;

const fs::path kErrorDir = fs::path(CONCERTO_SOURCE_DIR) / "tests" / "errors";

/// The file's text without trailing newlines.
std::string ReadTrimmed(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text;
}

/// Sorted case names (file stems) with the given extension.
std::vector<std::string> Stems(const std::string& extension) {
  std::vector<std::string> stems;
  for (const auto& entry : fs::directory_iterator(kErrorDir))
    if (entry.path().extension() == extension) stems.push_back(entry.path().stem().string());
  std::sort(stems.begin(), stems.end());
  return stems;
}

TEST(ErrorCorpus, HasAtLeastTwentyCasesEachWithAnExpectation) {
  std::vector<std::string> inputs = Stems(".json");
  EXPECT_GE(inputs.size(), 20u);
  EXPECT_EQ(inputs, Stems(".expected"));
}

/// Reads one case; fails unless it is rejected with its expected message.
void CheckCase(const std::string& name) {
  const fs::path json = kErrorDir / (name + ".json");
  const fs::path expected_path = kErrorDir / (name + ".expected");
  ASSERT_TRUE(fs::exists(expected_path));
  const std::string expected = ReadTrimmed(expected_path);
  ASSERT_FALSE(expected.empty());
  EXPECT_NE(expected.find(name + ".json"), std::string::npos)
      << "the expectation must name the file";
  Result<Program> program = ReadProgramFile(json.string());
  ASSERT_FALSE(program.ok()) << "accepted a bad file";
  const std::string message = program.status().message();
  EXPECT_EQ(message.rfind(json.string(), 0), 0u) << "message must start with the file: " << message;
  EXPECT_NE(message.find(expected), std::string::npos)
      << "expected: " << expected << "\n     got: " << message;
}

TEST(ErrorCorpus, EveryFileIsRejectedWithItsMessage) {
  for (const std::string& name : Stems(".json")) {
    SCOPED_TRACE(name);
    CheckCase(name);
  }
}

}  // namespace
}  // namespace concerto
