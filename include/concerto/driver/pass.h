// Passes: each has a name, a one-line description and one signature over the
// job's program and the analyses passes share (PassContext), and returns what
// it changed. RunScheduler (driver.h) builds a pipeline of them in a straight
// line (read, then decompose for concerto, then schedule), calls the pass hook
// after each (`--dump-after NAME`, the names of RegisteredPasses()), and
// evaluates the result (verify, simulate, summarize) with the same cached
// analyses.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "concerto/cost/cost_model.h"
#include "concerto/decompose/decompose.h"
#include "concerto/driver/options.h"
#include "concerto/ir/graph_index.h"
#include "concerto/schedule/concerto_scheduler.h"
#include "concerto/schedule/schedule.h"
#include "concerto/util/status.h"

namespace concerto {

/// The analyses of a program that passes and the evaluation share, built on
/// first use: one GraphIndex per graph (about a second at 100k ops). A pass
/// that changes the program invalidates them.
class AnalysisCache {
 public:
  /// The indexes of `program`'s graphs, built now if not cached.
  const std::vector<GraphIndex>& Indexes(const Program& program);
  void Invalidate() { indexes_.reset(); }

 private:
  std::optional<std::vector<GraphIndex>> indexes_;
};

/// What passes read and write.
struct PassContext {
  Program program;                   // the program; rewritten in place by passes
  std::optional<Schedule> schedule;  // set by the schedule pass
  const CostModel* cost = nullptr;
  const Options* options = nullptr;
  ProgressFn progress;
  AnalysisCache analyses;
  /// The passes' own reports (each owns its JSON: DecomposeReportJson,
  /// ConcertoReportJson).
  std::optional<DecomposeReport> decompose;
  std::optional<ConcertoReport> concerto;
  /// The program before the decompose pass changed it (concerto's search
  /// also starts from its list schedules; ConcertoOptions::undecomposed).
  std::optional<Program> before_decompose;
};

/// What a pass did: whether the program changed (the analyses are then
/// rebuilt) and one line for the progress stream.
struct PassChange {
  bool program_changed = false;
  std::string summary;
};

class Pass {
 public:
  virtual ~Pass() = default;
  virtual std::string_view Name() const = 0;
  virtual Result<PassChange> Run(PassContext& context) = 0;
};

/// A registered pass: its name (what --dump-after takes) and what it does.
struct PassInfo {
  std::string name;
  std::string description;
};
/// Every pass the driver can run, in pipeline order.
const std::vector<PassInfo>& RegisteredPasses();

/// The pass `name` (one of RegisteredPasses()); `scheduler` configures the
/// schedule pass (a baseline name or "concerto").
Result<std::unique_ptr<Pass>> MakePass(const std::string& name, const std::string& scheduler = "");

/// Runs `passes` in order on `context`; after each, `hook(name, program)`
/// when set. A pass's error names the pass.
Status RunPasses(const std::vector<std::unique_ptr<Pass>>& passes, PassContext& context,
                 const std::function<void(const std::string&, const Program&)>& hook);

}  // namespace concerto
