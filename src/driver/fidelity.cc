// Predictions of published measurements (docs/validation.md).
#include "concerto/driver/fidelity.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fmt/format.h>
#include <map>
#include <set>

#include "concerto/cost/cost_model.h"
#include "concerto/driver/job.h"
#include "concerto/ir/graph_index.h"
#include "concerto/lower/graph_builder.h"
#include "concerto/lower/plan.h"
#include "concerto/lower/transformer.h"
#include "concerto/util/input_file.h"

namespace concerto {

std::string_view ToString(PublishedKind kind) {
  switch (kind) {
    case PublishedKind::kCollective: return "collective";
    case PublishedKind::kGemm: return "gemm";
    case PublishedKind::kTraining: return "training";
  }
  return "?";
}

namespace {

/// The metrics each kind may report.
const std::map<PublishedKind, std::set<std::string>>& KindMetrics() {
  static const std::map<PublishedKind, std::set<std::string>> kMetrics = {
      {PublishedKind::kCollective, {"busbw_gbps", "time_us"}},
      {PublishedKind::kGemm, {"tflops"}},
      {PublishedKind::kTraining, {"tflops_per_gpu", "tokens_per_s_per_gpu", "step_time_s"}},
  };
  return kMetrics;
}

/// The fields each kind takes besides the common ones.
const std::map<PublishedKind, std::set<std::string>>& KindFields() {
  static const std::map<PublishedKind, std::set<std::string>> kFields = {
      {PublishedKind::kCollective, {"collective", "ranks", "bytes"}},
      {PublishedKind::kGemm, {"m", "n", "k", "dtype"}},
      {PublishedKind::kTraining, {"model", "micro_batch", "plan", "scheduler", "global_batch"}},
  };
  return kFields;
}

const std::set<std::string> kCommonFields = {"id",     "kind",      "origin", "source", "cluster",
                                             "nodes",  "metric",    "published", "note"};

/// Reads one row's fields, naming the row and field in every error.
class RowReader {
 public:
  RowReader(const YAML::Node& node, std::string where) : node_(node), where_(std::move(where)) {}

  Status Text(const char* key, std::string* out, bool required = true) const {
    const YAML::Node v = node_[key];
    if (!v) return required ? Status::Error(where_ + ": missing field '" + key + "'") : Status::Ok();
    if (!v.IsScalar()) return Status::Error(where_ + ": field '" + key + "': expected text");
    *out = v.Scalar();
    if (required && out->empty()) return Status::Error(where_ + ": field '" + key + "' is empty");
    return Status::Ok();
  }

  Status Integer(const char* key, int64_t lo, int64_t hi, int64_t* out, bool required = true) const {
    std::string text;
    CONCERTO_RETURN_IF_ERROR(Text(key, &text, required));
    if (text.empty()) return Status::Ok();
    int64_t v = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi)
      return Status::Error(fmt::format("{}: field '{}': expected an integer in {}..{}, got '{}'", where_, key, lo, hi,
                                       text));
    *out = v;
    return Status::Ok();
  }

  Status Positive(const char* key, double* out) const {
    std::string text;
    CONCERTO_RETURN_IF_ERROR(Text(key, &text));
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (end != text.c_str() + text.size() || !std::isfinite(v) || v <= 0)
      return Status::Error(where_ + ": field '" + key + "': expected a positive number, got '" + text + "'");
    *out = v;
    return Status::Ok();
  }

  const std::string& where() const { return where_; }

 private:
  const YAML::Node& node_;
  std::string where_;
};

/// `path` resolved against the table's folder unless it is a preset name or absolute.
std::string Resolve(const std::string& dir, const std::string& path) {
  const bool file_like = path.find('/') != std::string::npos || path.ends_with(".yaml") ||
                         path.ends_with(".yml") || path.ends_with(".json");
  if (!file_like || dir.empty() || std::filesystem::path(path).is_absolute()) return path;
  return (std::filesystem::path(dir) / path).lexically_normal().string();
}

Result<PublishedRow> ParseRow(const YAML::Node& node, const std::string& where, const std::string& dir) {
  if (!node.IsMap()) return Status::Error(where + ": expected a map of fields (id, kind, ...)");
  PublishedRow r;
  const RowReader read(node, where);
  std::string kind;
  CONCERTO_RETURN_IF_ERROR(read.Text("id", &r.id));
  const RowReader row(node, where + " (" + r.id + ")");
  CONCERTO_RETURN_IF_ERROR(row.Text("kind", &kind));
  if (kind == "collective") r.kind = PublishedKind::kCollective;
  else if (kind == "gemm") r.kind = PublishedKind::kGemm;
  else if (kind == "training") r.kind = PublishedKind::kTraining;
  else return Status::Error(row.where() + ": field 'kind': expected collective, gemm or training, got '" + kind + "'");
  for (const auto& item : node) {
    const std::string key = item.first.IsScalar() ? item.first.Scalar() : "?";
    if (!kCommonFields.count(key) && !KindFields().at(r.kind).count(key))
      return Status::Error(row.where() + ": unknown field '" + key + "' for a " + kind + " row");
  }
  CONCERTO_RETURN_IF_ERROR(row.Text("origin", &r.origin));
  CONCERTO_RETURN_IF_ERROR(row.Text("source", &r.source));
  CONCERTO_RETURN_IF_ERROR(row.Text("cluster", &r.cluster));
  r.cluster = Resolve(dir, r.cluster);
  int64_t nodes = 0;
  CONCERTO_RETURN_IF_ERROR(row.Integer("nodes", 1, 1 << 20, &nodes, false));
  r.nodes = static_cast<int>(nodes);
  CONCERTO_RETURN_IF_ERROR(row.Text("metric", &r.metric));
  if (!KindMetrics().at(r.kind).count(r.metric)) {
    std::string known;
    for (const std::string& m : KindMetrics().at(r.kind)) known += (known.empty() ? "" : ", ") + m;
    return Status::Error(row.where() + ": field 'metric': '" + r.metric + "' is not a metric of a " + kind +
                         " row (known: " + known + ")");
  }
  CONCERTO_RETURN_IF_ERROR(row.Positive("published", &r.published));
  CONCERTO_RETURN_IF_ERROR(row.Text("note", &r.note, false));
  switch (r.kind) {
    case PublishedKind::kCollective: {
      std::string coll;
      CONCERTO_RETURN_IF_ERROR(row.Text("collective", &coll));
      std::optional<CollectiveType> type = ParseCollectiveType(coll);
      if (!type || *type == CollectiveType::kBroadcast)
        return Status::Error(row.where() + ": field 'collective': expected all_reduce, all_gather, reduce_scatter "
                                           "or all_to_all, got '" + coll + "'");
      r.collective = *type;
      int64_t ranks = 0;
      CONCERTO_RETURN_IF_ERROR(row.Integer("ranks", 2, 1 << 20, &ranks));
      r.ranks = static_cast<int>(ranks);
      CONCERTO_RETURN_IF_ERROR(row.Integer("bytes", 1, int64_t{1} << 50, &r.bytes));
      break;
    }
    case PublishedKind::kGemm: {
      CONCERTO_RETURN_IF_ERROR(row.Integer("m", 1, 1 << 24, &r.m));
      CONCERTO_RETURN_IF_ERROR(row.Integer("n", 1, 1 << 24, &r.n));
      CONCERTO_RETURN_IF_ERROR(row.Integer("k", 1, 1 << 24, &r.k));
      std::string dtype = "bf16";
      CONCERTO_RETURN_IF_ERROR(row.Text("dtype", &dtype, false));
      std::optional<DType> d = ParseDType(dtype);
      if (!d || (*d != DType::kBF16 && *d != DType::kF16 && *d != DType::kF32))
        return Status::Error(row.where() + ": field 'dtype': expected bf16, f16 or f32, got '" + dtype + "'");
      r.dtype = *d;
      break;
    }
    case PublishedKind::kTraining: {
      CONCERTO_RETURN_IF_ERROR(row.Text("model", &r.model));
      r.model = Resolve(dir, r.model);
      CONCERTO_RETURN_IF_ERROR(row.Integer("micro_batch", 1, 1 << 20, &r.micro_batch, false));
      CONCERTO_RETURN_IF_ERROR(row.Text("plan", &r.plan));
      CONCERTO_RETURN_IF_ERROR(row.Text("scheduler", &r.scheduler));
      const std::vector<std::string> schedulers = SchedulerNames();
      if (std::find(schedulers.begin(), schedulers.end(), r.scheduler) == schedulers.end())
        return Status::Error(row.where() + ": field 'scheduler': unknown scheduler '" + r.scheduler + "'");
      CONCERTO_RETURN_IF_ERROR(row.Integer("global_batch", 1, int64_t{1} << 40, &r.global_batch));
      break;
    }
  }
  return r;
}

/// nccl-tests' bus-bandwidth factor: busbw = algbw x factor.
double BusFactor(CollectiveType type, int n) {
  return type == CollectiveType::kAllReduce ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
}

/// The per-rank input our cost model takes for nccl-tests' `size`.
int64_t InputBytes(CollectiveType type, int64_t size, int n) {
  return type == CollectiveType::kAllGather ? size / n : size;
}

Result<FidelityRow> PredictCollective(const PublishedRow& r, const ClusterSpec& cluster) {
  if (r.ranks > cluster.NumDevices())
    return Status::Error(fmt::format("row {}: {} ranks but cluster '{}' has {} devices", r.id, r.ranks, cluster.name,
                                     cluster.NumDevices()));
  const AnalyticCostModel cost(cluster);
  std::vector<int> group(r.ranks);
  for (int i = 0; i < r.ranks; ++i) group[i] = i;
  FidelityRow out;
  out.row = r;
  out.step_us = cost.CollectiveUs(r.collective, InputBytes(r.collective, r.bytes, r.ranks), group);
  const double algbw_gbps = static_cast<double>(r.bytes) / (out.step_us * 1e3);
  out.predicted = r.metric == "time_us" ? out.step_us : algbw_gbps * BusFactor(r.collective, r.ranks);
  return out;
}

Result<FidelityRow> PredictGemm(const PublishedRow& r, const ClusterSpec& cluster) {
  Graph graph;
  graph.name = "gemm";
  lower::GraphBuilder b(&graph);
  const lower::Sharding none2 = {{}, {}};
  b.AddTensor("a", {r.m, r.k}, r.dtype, none2);
  b.AddTensor("b", {r.k, r.n}, r.dtype, none2);
  b.AddTensor("c", {r.m, r.n}, r.dtype, none2);
  const double flops = 2.0 * static_cast<double>(r.m) * static_cast<double>(r.n) * static_cast<double>(r.k);
  b.AddCompute("matmul", ComputeType::kMatmul, {"a", "b"}, {"c"}, flops);
  const GraphIndex index = GraphIndex::Build(graph);
  const Mesh mesh;
  const AnalyticCostModel cost(cluster);
  FidelityRow out;
  out.row = r;
  out.step_us = cost.Price(graph.ops[0], PriceContext{graph, index, mesh, 0}).duration_us;
  out.predicted = flops / (out.step_us * 1e6);
  return out;
}

/// Megatron's flop count of one step (Narayanan et al. 2021, eq. 3): 96 B s l
/// h^2 (1 + s / 6h + V / 16lh), full recomputation included.
double MegatronStepFlops(const ModelConfig& m, int64_t global_batch) {
  const double b = static_cast<double>(global_batch), s = m.seq, l = m.layers, h = m.hidden, v = m.vocab;
  return 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h));
}

Result<FidelityRow> PredictTraining(const PublishedRow& r) {
  const std::string where = "row " + r.id;
  Result<ModelConfig> model = LoadModel(r.model);
  if (!model.ok()) return Status::Error(where + ": " + model.status().message());
  if (r.micro_batch > 0) model->batch = static_cast<int>(r.micro_batch);
  Result<ParallelPlan> plan = ParsePlan(r.plan);
  if (!plan.ok()) return Status::Error(where + ": plan: " + plan.status().message());
  const int64_t global = static_cast<int64_t>(model->batch) * plan->microbatches * plan->dp;
  if (global != r.global_batch)
    return Status::Error(fmt::format("{}: global_batch {} but the model's batch {} x microbatches {} x dp {} = {}",
                                     where, r.global_batch, model->batch, plan->microbatches, plan->dp, global));
  Result<Program> program = LowerTransformer(*model, *plan);
  if (!program.ok()) return Status::Error(where + ": " + program.status().message());
  JobSpec spec;
  spec.program = std::move(program).value();
  spec.scheduler = r.scheduler;
  spec.cluster = r.cluster;
  spec.nodes = r.nodes;
  Result<JobResult> job = RunJob(spec);
  if (!job.ok()) return Status::Error(where + ": " + job.status().message());
  FidelityRow out;
  out.row = r;
  const Summary& s = job->run.summary;
  out.step_us = s.makespan_us;
  out.fits_memory = s.fits_memory;
  out.peak_memory_bytes = s.peak_memory_bytes;
  out.gpus = job->run.scheduled.program.mesh.NumRanks();
  const double step_s = out.step_us * 1e-6;
  if (r.metric == "tflops_per_gpu")
    out.predicted = MegatronStepFlops(*model, r.global_batch) / (step_s * out.gpus) / 1e12;
  else if (r.metric == "step_time_s")
    out.predicted = step_s;
  else
    out.predicted = static_cast<double>(r.global_batch) * model->seq / (step_s * out.gpus);
  return out;
}

}  // namespace

Result<std::vector<PublishedRow>> ParsePublishedTable(const std::string& text, const std::string& source,
                                                      const std::string& dir) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return Status::Error(source + ": line " + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  if (!root.IsMap() || !root["rows"] || !root["rows"].IsSequence())
    return Status::Error(source + ": expected a map with 'rows:', a list of published figures");
  std::vector<PublishedRow> rows;
  std::set<std::string> ids;
  int index = 0;
  for (const YAML::Node& node : root["rows"]) {
    Result<PublishedRow> r = ParseRow(node, fmt::format("{}: row {}", source, index++), dir);
    if (!r.ok()) return r.status();
    if (!ids.insert(r->id).second) return Status::Error(source + ": duplicate row id '" + r->id + "'");
    rows.push_back(std::move(r).value());
  }
  if (rows.empty()) return Status::Error(source + ": 'rows' is empty");
  return rows;
}

Result<std::vector<PublishedRow>> LoadPublishedTable(const std::string& path) {
  Result<std::string> text = ReadInputFile(path, "published table", kMaxSmallInputBytes);
  if (!text.ok()) return text.status();
  return ParsePublishedTable(*text, path, std::filesystem::path(path).parent_path().string());
}

Result<FidelityRow> PredictPublished(const PublishedRow& row) {
  Result<FidelityRow> out = Status::Error("unreachable");
  if (row.kind == PublishedKind::kTraining) {
    out = PredictTraining(row);
  } else {
    Result<ClusterSpec> cluster = LoadClusterNodes(row.cluster, row.nodes);
    if (!cluster.ok()) return Status::Error("row " + row.id + ": " + cluster.status().message());
    out = row.kind == PublishedKind::kGemm ? PredictGemm(row, *cluster) : PredictCollective(row, *cluster);
  }
  if (out.ok()) out->error = out->predicted / row.published - 1;
  return out;
}

Result<FidelityReport> PredictPublishedTable(const std::vector<PublishedRow>& rows, const ProgressFn& progress) {
  FidelityReport report;
  std::set<std::string> origins;
  std::vector<double> errors;
  for (const PublishedRow& row : rows) {
    Result<FidelityRow> r = PredictPublished(row);
    if (!r.ok()) return r.status();
    if (progress)
      progress(fmt::format("{}: predicted {:.4g} {}, published {:.4g} ({:+.1f}%){}", row.id, r->predicted, row.metric,
                           row.published, 100 * r->error, r->fits_memory ? "" : ", over memory"));
    origins.insert(row.origin);
    errors.push_back(std::abs(r->error));
    if (std::abs(r->error) >= report.max_abs_error) {
      report.max_abs_error = std::abs(r->error);
      report.max_error_row = row.id;
    }
    report.over_memory += !r->fits_memory;
    report.rows.push_back(std::move(r).value());
  }
  report.sources = static_cast<int>(origins.size());
  std::sort(errors.begin(), errors.end());
  const size_t n = errors.size();
  report.median_abs_error = n == 0 ? 0 : n % 2 ? errors[n / 2] : (errors[n / 2 - 1] + errors[n / 2]) / 2;
  return report;
}

nlohmann::json FidelityReportJson(const FidelityReport& report) {
  nlohmann::json rows = nlohmann::json::array();
  for (const FidelityRow& r : report.rows) {
    nlohmann::json j = {{"id", r.row.id},
                        {"kind", ToString(r.row.kind)},
                        {"origin", r.row.origin},
                        {"source", r.row.source},
                        {"cluster", r.row.cluster},
                        {"metric", r.row.metric},
                        {"published", r.row.published},
                        {"predicted", r.predicted},
                        {"error_percent", 100 * r.error}};
    if (r.row.nodes > 0) j["nodes"] = r.row.nodes;
    if (r.row.kind == PublishedKind::kTraining) {
      j["step_us"] = r.step_us;
      j["gpus"] = r.gpus;
      j["fits_memory"] = r.fits_memory;
      j["peak_memory_bytes"] = r.peak_memory_bytes;
      j["model"] = r.row.model;
      j["plan"] = r.row.plan;
      j["scheduler"] = r.row.scheduler;
    } else {
      j["time_us"] = r.step_us;
    }
    rows.push_back(std::move(j));
  }
  return {{"rows", rows},
          {"num_rows", report.rows.size()},
          {"sources", report.sources},
          {"median_abs_error_percent", 100 * report.median_abs_error},
          {"max_abs_error_percent", 100 * report.max_abs_error},
          {"max_error_row", report.max_error_row},
          {"over_memory", report.over_memory}};
}

std::string FidelityMarkdown(const FidelityReport& report) {
  std::string out =
      "| id | kind | metric | published | predicted | error | source |\n"
      "|---|---|---|---:|---:|---:|---|\n";
  for (const FidelityRow& r : report.rows)
    out += fmt::format("| {} | {} | {} | {:.4g} | {:.4g} | {:+.1f}%{} | {} |\n", r.row.id, ToString(r.row.kind),
                       r.row.metric, r.row.published, r.predicted, 100 * r.error,
                       r.fits_memory ? "" : " (over memory)", r.row.origin);
  out += fmt::format("\n{} rows from {} sources: median |error| {:.1f}%, max {:.1f}% ({}); {} over memory.\n",
                     report.rows.size(), report.sources, 100 * report.median_abs_error, 100 * report.max_abs_error,
                     report.max_error_row, report.over_memory);
  return out;
}

}  // namespace concerto
