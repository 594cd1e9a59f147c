// Fuzz target: the IR reader (ParseProgram) and its write/read round trip.
// A program the reader accepts must write, read back and write again to the
// same bytes (docs/ir.md, "The canonical form"); anything else aborts.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "concerto/ir/json_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  concerto::Result<concerto::Program> program = concerto::ParseProgram(text, "fuzz.json");
  if (!program.ok()) return 0;
  const std::string written = concerto::WriteProgram(*program);
  concerto::Result<concerto::Program> again = concerto::ParseProgram(written, "written.json");
  if (!again.ok()) {
    std::fprintf(stderr, "round trip: the written program is rejected: %s\n", again.status().message().c_str());
    std::abort();
  }
  if (concerto::WriteProgram(*again) != written) {
    std::fprintf(stderr, "round trip: write(read(write(p))) != write(p)\n");
    std::abort();
  }
  return 0;
}
