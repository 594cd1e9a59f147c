// Golden simulator tests: each tests/golden/NAME.json program is scheduled
// and simulated; the timeline must equal NAME.expected (its '#' lines draw
// the expected timeline and show the arithmetic). Every op in these programs
// has an explicit duration_us, so the cost model plays no part.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "concerto/cost/cluster.h"
#include "concerto/cost/cost_model.h"
#include "concerto/ir/json_io.h"
#include "concerto/schedule/scheduler.h"
#include "concerto/sim/simulator.h"

namespace concerto {
namespace {

namespace fs = std::filesystem;

std::string ReadText(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", std::round(v * 1000) / 1000);
  std::string s = buf;
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

struct Expected {
  std::string scheduler = "fifo";
  double interference = 0;
  std::string cluster = "a800-4x8";  // a preset, or a file under tests/golden/
  std::string error;
  std::vector<std::string> lines;
};

Expected ParseExpected(const std::string& text) {
  Expected e;
  std::istringstream in(text);
  std::string line;
  bool body = false;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line == "---") {
      body = true;
      continue;
    }
    if (body) {
      e.lines.push_back(line);
      continue;
    }
    auto colon = line.find(':');
    std::string key = line.substr(0, colon), value = line.substr(colon + 2);
    if (key == "scheduler") e.scheduler = value;
    if (key == "interference") e.interference = std::stod(value);
    if (key == "expect_error") e.error = value;
    if (key == "cluster") e.cluster = value;
  }
  return e;
}

std::vector<std::string> Render(const ScheduledProgram& sp, const Timeline& t) {
  std::vector<OpRecord> recs = t.records;
  std::sort(recs.begin(), recs.end(), [](const OpRecord& a, const OpRecord& b) {
    return std::tie(a.rank, a.stream, a.start_us, a.op_index) < std::tie(b.rank, b.stream, b.start_us, b.op_index);
  });
  std::vector<std::string> out;
  for (const auto& r : recs) {
    const Program& p = sp.program;
    const Graph& g = p.GraphOf(p.roles[p.RoleOfRank(r.rank)]);
    out.push_back("rank " + std::to_string(r.rank) + " " + g.streams[r.stream] + " " + g.ops[r.op_index].name +
                  " " + Num(r.start_us) + " " + Num(r.end_us));
  }
  out.push_back("makespan " + Num(t.makespan_us));
  return out;
}

std::vector<fs::path> GoldenFiles() {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(fs::path(CONCERTO_SOURCE_DIR) / "tests" / "golden"))
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

TEST(GoldenSim, HasAtLeastSixCases) { EXPECT_GE(GoldenFiles().size(), 6u); }

TEST(GoldenSim, TimelinesMatch) {
  for (const fs::path& json : GoldenFiles()) {
    SCOPED_TRACE(json.filename().string());
    fs::path exp_path = json;
    exp_path.replace_extension(".expected");
    ASSERT_TRUE(fs::exists(exp_path));
    Expected exp = ParseExpected(ReadText(exp_path));
    const bool file = exp.cluster.find('.') != std::string::npos;
    Result<ClusterSpec> cluster = LoadCluster(file ? (json.parent_path() / exp.cluster).string() : exp.cluster);
    ASSERT_TRUE(cluster.ok()) << cluster.status().message();
    AnalyticCostModel cost(*cluster);
    Result<Program> program = ParseProgram(ReadText(json), json.filename().string());
    ASSERT_TRUE(program.ok()) << program.status().message();
    Result<ScheduledProgram> sp = RunBaseline(exp.scheduler, *program, cost);
    ASSERT_TRUE(sp.ok()) << sp.status().message();
    EXPECT_TRUE(VerifySchedule(sp->program, sp->schedule).empty());
    SimOptions opts;
    opts.interference = exp.interference;
    Result<Timeline> t = Simulate(*sp, cost, opts);
    if (!exp.error.empty()) {
      ASSERT_FALSE(t.ok());
      EXPECT_NE(t.status().message().find(exp.error), std::string::npos) << t.status().message();
      continue;
    }
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_EQ(Render(*sp, *t), exp.lines);
  }
}

}  // namespace
}  // namespace concerto
