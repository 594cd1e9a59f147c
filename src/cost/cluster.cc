// Cluster presets, the cluster-file reader (YAML or JSON) and validation.
// Every preset value and its source is listed in docs/cost-model.md.
#include "concerto/cost/cluster.h"
#include "concerto/util/did_you_mean.h"
#include "concerto/util/input_file.h"
#include "concerto/util/json_text.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

namespace concerto {
namespace {

// ---------------------------------------------------------------------------
// Presets. Values and their sources: docs/cost-model.md, "Presets".

/// 4 nodes x 8 A800-SXM4-80GB: the testbed of the Concerto paper (ASPLOS 2025).
ClusterSpec A800Preset() {
  ClusterSpec c;
  c.name = "a800-4x8";
  c.description =
      "Concerto paper testbed: 4 nodes x 8 A800-SXM4-80GB, NVLink 400 GB/s, 800 Gb/s per node";
  c.nodes = 4;
  c.devices_per_node = 8;
  c.device.name = "A800-SXM4-80GB";
  c.device.peak_tflops_bf16 = 312;  // as A100 SXM (inferred: same GA100 die)
  c.device.peak_tflops_fp16 = 312;
  c.device.peak_tflops_fp32 = 19.5;  // CUDA cores, no TF32
  c.device.memory_bandwidth_gbps = 2039;
  c.device.memory_gb = 80;
  c.device.memory_reserve_gb = 4;  // inferred: docs/cost-model.md, "Memory budget"
  c.device.matmul_efficiency = 0.87;  // A100 SXM large bf16 GEMM
  c.device.attention_efficiency = 0.575;  // FlashAttention-2 forward on A100-SXM4: 179.5 of 312 TFLOP/s (docs/validation.md)
  c.device.vector_efficiency = 0.125;  // CUDA-core bf16 rate / tensor-core peak (inferred)
  c.device.memory_efficiency = 0.85;   // low end of 85-90% of HBM
  c.device.launch_overhead_us = 4;     // inferred
  c.device.sm_count = 108;             // GA100 as in the A100 SXM (A800 datasheet)
  // nccl-tests busbw 155-215 GB/s, midpoint; alpha: NCCL's Simple-protocol
  // per-hop latency on NVLink (3.4 us), which the 1 MiB points of the
  // nccl-tests sweeps confirm (docs/validation.md)
  c.intra_node = {185, 3.4};
  c.inter_node = {11.25, 3.8};  // 90 GB/s achieved of 100 GB/s per node, / 8 devices
  c.collective_algorithm = "auto";
  c.interference = 0.2;  // paper: 18.2%, 21.9%, 23.8% on A800
  c.topology.intra_link = "nvswitch";
  c.topology.nics_per_node = 4;  // 4 x 200 Gb/s HDR = 800 Gb/s per node
  return c;
}

/// 4 DGX A100 80GB nodes (8 x A100-SXM4-80GB on NVSwitch, 8 x HDR 200 Gb/s
/// compute NICs per node): the machine of Megatron-LM's published runs
/// (Selene) and of most A100 nccl-tests figures. docs/validation.md predicts
/// published measurements on it (scaled with --nodes).
ClusterSpec A100DgxPreset() {
  ClusterSpec c = A800Preset();
  c.name = "a100-dgx";
  c.description = "4 DGX A100 nodes: 8 x A100-SXM4-80GB, NVSwitch 600 GB/s, 8 x 200 Gb/s HDR InfiniBand per node";
  c.device.name = "A100-SXM4-80GB";
  c.intra_node = {216, 3.4};  // nccl-tests busbw on 8 x A100 NVSwitch: 200-232 GB/s, midpoint (REFERENCES.md); alpha as a800
  c.inter_node = {24, 3.8};   // one HDR NIC per GPU: 25 GB/s, 24 achieved (REFERENCES.md)
  c.topology.nics_per_node = 8;
  return c;
}

/// 8 nodes x 8 H100-SXM5-80GB, NVLink 900 GB/s, 8 x 400 Gb/s NDR per node.
ClusterSpec H100Preset() {
  ClusterSpec c;
  c.name = "h100-8x8";
  c.description = "8 nodes x 8 H100-SXM5-80GB, NVLink 900 GB/s, 8 x 400 Gb/s NDR InfiniBand per node";
  c.nodes = 8;
  c.devices_per_node = 8;
  c.device.name = "H100-SXM5-80GB";
  c.device.peak_tflops_bf16 = 989;
  c.device.peak_tflops_fp16 = 989;
  c.device.peak_tflops_fp32 = 67;  // CUDA cores (datasheet; not in REFERENCES.md)
  c.device.memory_bandwidth_gbps = 3350;
  c.device.memory_gb = 80;
  c.device.memory_reserve_gb = 4;  // inferred: docs/cost-model.md, "Memory budget"
  c.device.matmul_efficiency = 0.80;  // H100 SXM large bf16 GEMM
  c.device.attention_efficiency = 0.33;  // FlashAttention-2 forward on H100 SXM: 327.9 of 989 TFLOP/s (docs/validation.md)
  c.device.vector_efficiency = 0.125;
  c.device.memory_efficiency = 0.85;
  c.device.launch_overhead_us = 4;
  c.device.sm_count = 132;  // H100 SXM5 datasheet
  c.device.gemm_ramp_k = 256;  // K sweep at M = N = 8192 on the H800's SMs (tilelang): K = 256 runs at half of K = 16384
  c.intra_node = {370, 3.4};  // nccl-tests busbw without NVLS; alpha: NCCL's Simple per-hop NVLink latency
  c.inter_node = {47, 3.2};   // one NDR NIC per GPU: 46-48 GB/s achieved
  c.collective_algorithm = "auto";
  c.interference = 0.2;  // middle of the common 15-25% range
  c.topology.intra_link = "nvswitch";
  c.topology.nics_per_node = 8;  // one NDR NIC per GPU (rail-optimised)
  c.topology.nvls_algbw_gbps = 275;  // NVLS all-reduce on 8 x H100: busbw ~480, algbw ~275 (nccl-tests #212)
  return c;
}

/// 4 nodes x 8 A100-PCIe-80GB, PCIe Gen4 x16 inside a node, 25 GbE between nodes.
ClusterSpec CommodityPreset() {
  ClusterSpec c;
  c.name = "commodity-4x8";
  c.description = "4 nodes x 8 A100-PCIe-80GB, PCIe Gen4 x16 inside a node, one 25 GbE port per node";
  c.nodes = 4;
  c.devices_per_node = 8;
  c.device.name = "A100-PCIe-80GB";
  c.device.peak_tflops_bf16 = 312;
  c.device.peak_tflops_fp16 = 312;
  c.device.peak_tflops_fp32 = 19.5;
  c.device.memory_bandwidth_gbps = 1935;  // datasheet; not in REFERENCES.md
  c.device.memory_gb = 80;
  c.device.memory_reserve_gb = 4;  // inferred: docs/cost-model.md, "Memory budget"
  c.device.matmul_efficiency = 0.69;  // A800 PCIe fp16 GEMM at n=8192 (same board class)
  c.device.attention_efficiency = 0.575 * 0.69 / 0.87;  // the SXM part's FlashAttention-2 share, scaled as its GEMMs
  c.device.vector_efficiency = 0.125;
  c.device.memory_efficiency = 0.85;
  c.device.launch_overhead_us = 4;
  c.device.sm_count = 108;  // A100 PCIe datasheet
  c.intra_node = {20, 1.5};        // inferred: ~63% of 31.5 GB/s PCIe Gen4 x16
  c.inter_node = {0.3375, 15};     // 2.7 GB/s achieved per 25 GbE node / 8 devices; TCP alpha inferred
  c.collective_algorithm = "auto";
  c.interference = 0.15;  // low end of 15-25%: slow links keep NCCL kernels light (inferred)
  c.topology.intra_link = "pcie";
  c.topology.nics_per_node = 1;
  c.topology.network_crosses_intra_link = true;  // the NIC sits behind the same PCIe fabric
  return c;
}

struct Preset {
  const char* name;
  ClusterSpec (*make)();
};
constexpr Preset kPresets[] = {
    {"a800-4x8", A800Preset},
    {"h100-8x8", H100Preset},
    {"commodity-4x8", CommodityPreset},
    {"a100-dgx", A100DgxPreset},
};

/// The preset called `name`, or nullptr.
const Preset* FindPreset(const std::string& name) {
  for (const Preset& p : kPresets)
    if (name == p.name) return &p;
  return nullptr;
}

/// "a800-4x8, h100-8x8, commodity-4x8".
std::string PresetList() {
  std::string out;
  for (const Preset& p : kPresets) {
    if (!out.empty()) out += ", ";
    out += p.name;
  }
  return out;
}

/// A double as people write it: 3, -3, 0.125, 1e+20, inf.
std::string FormatNumber(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

// ---------------------------------------------------------------------------
// A parsed file, YAML or JSON, reduced to what the reader needs.

struct FileNode {
  enum class Kind { kNull, kScalar, kMap, kOther };
  Kind kind = Kind::kNull;
  std::string text;        // scalar text; for kOther, a short description
  bool quoted = false;     // a JSON string or a quoted YAML scalar
  std::vector<std::string> keys;  // kMap, in file order
  std::vector<FileNode> values;
};

/// How deep a cluster file's maps may nest (the format needs 3 levels); a
/// deeper value, or a YAML alias that contains itself, reads as "nested too
/// deep" instead of recursing without end.
constexpr int kMaxFileDepth = 32;

FileNode TooDeep() {
  FileNode n;
  n.kind = FileNode::Kind::kOther;
  n.text = "a value nested deeper than " + std::to_string(kMaxFileDepth) + " levels";
  return n;
}

/// Converts a yaml-cpp node (which may throw on malformed input; callers catch).
FileNode FromYaml(const YAML::Node& y, int depth = 0) {
  if (depth > kMaxFileDepth) return TooDeep();
  FileNode n;
  switch (y.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      n.kind = FileNode::Kind::kNull;
      n.text = "null";
      break;
    case YAML::NodeType::Scalar:
      n.kind = FileNode::Kind::kScalar;
      n.text = y.Scalar();
      n.quoted = y.Tag() == "!";
      break;
    case YAML::NodeType::Sequence:
      n.kind = FileNode::Kind::kOther;
      n.text = "a list";
      break;
    case YAML::NodeType::Map:
      n.kind = FileNode::Kind::kMap;
      for (const auto& kv : y) {
        n.keys.push_back(kv.first.IsScalar() ? kv.first.Scalar() : std::string("?"));
        n.values.push_back(FromYaml(kv.second, depth + 1));
      }
      break;
  }
  return n;
}

/// Converts a parsed JSON value.
FileNode FromJson(const nlohmann::json& j, int depth = 0) {
  if (depth > kMaxFileDepth) return TooDeep();
  FileNode n;
  if (j.is_null()) {
    n.kind = FileNode::Kind::kNull;
    n.text = "null";
  } else if (j.is_string()) {
    n.kind = FileNode::Kind::kScalar;
    n.text = j.get<std::string>();
    n.quoted = true;
  } else if (j.is_number() || j.is_boolean()) {
    n.kind = FileNode::Kind::kScalar;
    n.text = DescribeJson(j);
  } else if (j.is_object()) {
    n.kind = FileNode::Kind::kMap;
    for (auto it = j.begin(); it != j.end(); ++it) {
      n.keys.push_back(it.key());
      n.values.push_back(FromJson(it.value(), depth + 1));
    }
  } else {
    n.kind = FileNode::Kind::kOther;
    n.text = DescribeJson(j);
  }
  return n;
}

/// How a value reads in an error message.
std::string Describe(const FileNode& n) {
  switch (n.kind) {
    case FileNode::Kind::kNull: return "null";
    case FileNode::Kind::kMap: return "a map";
    case FileNode::Kind::kOther: return n.text;
    case FileNode::Kind::kScalar: return n.quoted ? "'" + n.text + "'" : n.text;
  }
  return n.text;
}

/// Reads a cluster file's tree into a ClusterSpec; every error names the file and field.
class ClusterFileReader {
 public:
  explicit ClusterFileReader(std::string file) : file_(std::move(file)) {}

  /// Fills *spec from the top-level map `root`.
  Status Read(const FileNode& root, ClusterSpec* spec) {
    if (root.kind != FileNode::Kind::kMap)
      return Status::Error(file_ + ": top level must be a map of cluster fields, got " +
                           Describe(root));
    // 'base' first, whatever its position: the other fields override the preset.
    bool has_base = false;
    for (size_t i = 0; i < root.keys.size(); ++i) {
      if (root.keys[i] != "base") continue;
      std::string base;
      CONCERTO_RETURN_IF_ERROR(String(root.values[i], "base", &base));
      const Preset* preset = FindPreset(base);
      if (!preset)
        return Error("base", "unknown preset '" + base + "' (presets: " + PresetList() + ")");
      *spec = preset->make();
      has_base = true;
    }
    DeviceSpec& d = spec->device;
    std::vector<Field> device_fields = {
        {"name", [&](const FileNode& n, const std::string& f) { return String(n, f, &d.name); }},
        {"peak_tflops_bf16", NumberField(&d.peak_tflops_bf16)},
        {"peak_tflops_fp16", NumberField(&d.peak_tflops_fp16)},
        {"peak_tflops_fp32", NumberField(&d.peak_tflops_fp32)},
        {"memory_bandwidth_gbps", NumberField(&d.memory_bandwidth_gbps)},
        {"memory_gb", NumberField(&d.memory_gb)},
        {"memory_reserve_gb", NumberField(&d.memory_reserve_gb)},
        {"matmul_efficiency", NumberField(&d.matmul_efficiency)},
        {"attention_efficiency", NumberField(&d.attention_efficiency)},
        {"vector_efficiency", NumberField(&d.vector_efficiency)},
        {"memory_efficiency", NumberField(&d.memory_efficiency)},
        {"launch_overhead_us", NumberField(&d.launch_overhead_us)},
        {"sm_count", WholeField(&d.sm_count, 0)},
        {"gemm_ramp_k", NumberField(&d.gemm_ramp_k)},
    };
    TopologySpec& t = spec->topology;
    std::vector<Field> topology_fields = {
        {"intra_link", [&](const FileNode& n, const std::string& f) { return String(n, f, &t.intra_link); }},
        {"nics_per_node", WholeField(&t.nics_per_node, 0)},
        {"network_crosses_intra_link", BoolField(&t.network_crosses_intra_link)},
        {"share_links", BoolField(&t.share_links)},
        {"interference_growth", NumberField(&t.interference_growth)},
        {"nvls_algbw_gbps", NumberField(&t.nvls_algbw_gbps)},
    };
    auto link_fields = [&](LinkSpec* link) {
      return std::vector<Field>{{"bandwidth_gbps", NumberField(&link->bandwidth_gbps)},
                                {"latency_us", NumberField(&link->latency_us)}};
    };
    std::vector<Field> top_fields = {
        {"base", [](const FileNode&, const std::string&) { return Status::Ok(); }},
        {"name", [&](const FileNode& n, const std::string& f) { return String(n, f, &spec->name); }},
        {"description",
         [&](const FileNode& n, const std::string& f) { return String(n, f, &spec->description); }},
        {"nodes", WholeField(&spec->nodes, 1)},
        {"devices_per_node", WholeField(&spec->devices_per_node, 1)},
        {"device", [&](const FileNode& n, const std::string& f) { return Map(n, f, device_fields); }},
        {"intra_node",
         [&](const FileNode& n, const std::string& f) {
           return Map(n, f, link_fields(&spec->intra_node));
         }},
        {"inter_node",
         [&](const FileNode& n, const std::string& f) {
           return Map(n, f, link_fields(&spec->inter_node));
         }},
        {"collective_algorithm",
         [&](const FileNode& n, const std::string& f) {
           return String(n, f, &spec->collective_algorithm);
         }},
        {"interference", NumberField(&spec->interference)},
        {"corun_slowdown", NumberField(&spec->corun_slowdown)},
        {"corun_slowdown_memory", NumberField(&spec->corun_slowdown_memory)},
        {"comm_corun_slowdown", NumberField(&spec->comm_corun_slowdown)},
        {"comm_corun_latency_us", NumberField(&spec->comm_corun_latency_us)},
        {"link_burst_us", NumberField(&spec->link_burst_us)},
        {"comm_corun_hold_us", NumberField(&spec->comm_corun_hold_us)},
        {"compute_jitter", NumberField(&spec->compute_jitter)},
        {"topology", [&](const FileNode& n, const std::string& f) { return Map(n, f, topology_fields); }},
    };
    CONCERTO_RETURN_IF_ERROR(Map(root, "", top_fields));
    if (!has_base) {
      // Fields whose struct default is not a usable value must be given.
      static const char* const kRequired[] = {
          "nodes", "devices_per_node", "device.name", "device.peak_tflops_bf16",
          "device.peak_tflops_fp16", "device.peak_tflops_fp32", "device.memory_bandwidth_gbps",
          "device.memory_gb", "intra_node.bandwidth_gbps", "intra_node.latency_us",
          "inter_node.bandwidth_gbps", "inter_node.latency_us"};
      for (const char* field : kRequired)
        if (!seen_.count(field))
          return Error(field, "missing (required unless 'base' names a preset)");
    }
    if (!seen_.count("name")) spec->name = std::filesystem::path(file_).stem().string();
    return Status::Ok();
  }

 private:
  using Setter = std::function<Status(const FileNode&, const std::string& field)>;
  struct Field {
    std::string key;
    Setter set;
  };

  Status Error(const std::string& field, const std::string& what) const {
    return Status::Error(file_ + ": field '" + field + "': " + what);
  }

  /// Applies `fields` to the map `node`; unknown keys are errors.
  Status Map(const FileNode& node, const std::string& prefix, const std::vector<Field>& fields) {
    if (node.kind != FileNode::Kind::kMap)
      return Error(prefix, "must be a map, got " + Describe(node));
    for (size_t i = 0; i < node.keys.size(); ++i) {
      const std::string field = prefix.empty() ? node.keys[i] : prefix + "." + node.keys[i];
      const Field* match = nullptr;
      for (const Field& f : fields)
        if (f.key == node.keys[i]) match = &f;
      if (!match) {
        std::string known;
        for (const Field& f : fields) known += (known.empty() ? "" : ", ") + f.key;
        return Error(field, "unknown key (known keys here: " + known + ")");
      }
      seen_.insert(field);
      CONCERTO_RETURN_IF_ERROR(match->set(node.values[i], field));
    }
    return Status::Ok();
  }

  Status String(const FileNode& n, const std::string& field, std::string* out) const {
    if (n.kind != FileNode::Kind::kScalar) return Error(field, "must be a string, got " + Describe(n));
    *out = n.text;
    return Status::Ok();
  }

  /// Parses a number; the range is ValidateCluster's job.
  Status Number(const FileNode& n, const std::string& field, double* out) const {
    if (n.kind != FileNode::Kind::kScalar || n.quoted || n.text.empty())
      return Error(field, "must be a number, got " + Describe(n));
    const char* begin = n.text.c_str();
    char* end = nullptr;
    double v = std::strtod(begin, &end);
    if (end == begin || *end != '\0') return Error(field, "must be a number, got " + Describe(n));
    *out = v;
    return Status::Ok();
  }

  Setter NumberField(double* out) {
    return [this, out](const FileNode& n, const std::string& f) { return Number(n, f, out); };
  }

  /// A whole number in [min, 1000000] (for `min` 0, 0 means "off" or "not given").
  Setter WholeField(int* out, int min) {
    return [this, out, min](const FileNode& n, const std::string& f) -> Status {
      double v = 0;
      CONCERTO_RETURN_IF_ERROR(Number(n, f, &v));
      if (!std::isfinite(v) || v != std::floor(v) || v < min || v > 1e6)
        return Error(f, min == 1 ? "must be a positive integer, got " + Describe(n)
                                 : "must be a whole number in [" + std::to_string(min) + ", 1000000], got " +
                                       Describe(n));
      *out = static_cast<int>(v);
      return Status::Ok();
    };
  }

  /// true or false (unquoted; nothing else is read as a switch).
  Setter BoolField(bool* out) {
    return [this, out](const FileNode& n, const std::string& f) -> Status {
      if (n.kind == FileNode::Kind::kScalar && !n.quoted && (n.text == "true" || n.text == "false")) {
        *out = n.text == "true";
        return Status::Ok();
      }
      return Error(f, "must be true or false, got " + Describe(n));
    };
  }

  std::string file_;
  std::set<std::string> seen_;  // dotted field names present in the file
};

/// Ends with `suffix`.
bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// Reads, parses and validates a cluster file.
Result<ClusterSpec> LoadClusterFile(const std::string& path) {
  Result<std::string> text = ReadInputFile(path, "cluster file", kMaxSmallInputBytes);
  if (!text.ok()) return text.status();
  return ParseCluster(*text, path, EndsWith(path, ".json"));
}

}  // namespace

Result<ClusterSpec> ParseCluster(const std::string& text, const std::string& path, bool json) {
  FileNode root;
  try {
    if (json) {
      root = FromJson(nlohmann::json::parse(text));
    } else {
      root = FromYaml(YAML::Load(text));
    }
  } catch (const YAML::Exception& e) {
    return Status::Error(path + ": YAML parse error: " + e.what());
  } catch (const nlohmann::json::exception& e) {
    return Status::Error(path + ": JSON parse error: " + e.what());
  } catch (const std::exception& e) {
    return Status::Error(path + ": cannot read cluster file: " + e.what());
  }
  ClusterSpec spec;
  ClusterFileReader reader(path);
  CONCERTO_RETURN_IF_ERROR(reader.Read(root, &spec));
  CONCERTO_RETURN_IF_ERROR(ValidateCluster(spec, path));
  return spec;
}


std::vector<std::string> ClusterPresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.push_back(p.name);
  return names;
}

Result<ClusterSpec> LoadCluster(const std::string& name_or_path) {
  if (EndsWith(name_or_path, ".yaml") || EndsWith(name_or_path, ".yml") ||
      EndsWith(name_or_path, ".json"))
    return LoadClusterFile(name_or_path);
  const Preset* preset = FindPreset(name_or_path);
  if (!preset)
    return Status::Error("unknown cluster '" + name_or_path + "'" + DidYouMean(name_or_path, ClusterPresetNames()) +
                         ": not a preset (" + PresetList() + ") and not a .yaml, .yml or .json file");
  ClusterSpec spec = preset->make();
  Status st = ValidateCluster(spec, "preset '" + name_or_path + "'");
  assert(st.ok() && "a built-in preset fails ValidateCluster");
  (void)st;
  return spec;
}

Status ValidateCluster(const ClusterSpec& spec, const std::string& source) {
  auto error = [&](const std::string& field, const std::string& what) {
    return Status::Error(source + ": field '" + field + "': " + what);
  };
  // Every number is bounded here, where it is read, so that no sum or product the cost model
  // forms from an accepted file can overflow (a latency of 1e308 us reached an assertion in
  // AnalyticCostModel::Price): 1e15 is far above any real time (us), rate (GB/s, TFLOP/s) or
  // size (bytes) a cluster states.
  constexpr double kMaxValue = 1e15;
  auto positive = [&](const std::string& field, double v) {
    if (!(std::isfinite(v) && v > 0)) return error(field, "must be a positive finite number, got " + FormatNumber(v));
    return v <= kMaxValue ? Status::Ok() : error(field, "must be at most 1e15, got " + FormatNumber(v));
  };
  auto non_negative = [&](const std::string& field, double v) {
    if (!(std::isfinite(v) && v >= 0))
      return error(field, "must be a non-negative finite number, got " + FormatNumber(v));
    return v <= kMaxValue ? Status::Ok() : error(field, "must be at most 1e15, got " + FormatNumber(v));
  };
  auto fraction = [&](const std::string& field, double v) {
    return std::isfinite(v) && v > 0 && v <= 1
               ? Status::Ok()
               : error(field, "must be a fraction in (0, 1], got " + FormatNumber(v));
  };
  if (spec.name.empty()) return error("name", "must not be empty");
  if (spec.nodes < 1) return error("nodes", "must be a positive integer, got " + std::to_string(spec.nodes));
  if (spec.devices_per_node < 1)
    return error("devices_per_node",
                 "must be a positive integer, got " + std::to_string(spec.devices_per_node));
  if (static_cast<int64_t>(spec.nodes) * spec.devices_per_node > (1 << 24))
    return error("nodes", "nodes x devices_per_node must be at most 16777216, got " +
                              std::to_string(static_cast<int64_t>(spec.nodes) * spec.devices_per_node));
  const DeviceSpec& d = spec.device;
  if (d.name.empty()) return error("device.name", "must not be empty (it keys the profile database)");
  CONCERTO_RETURN_IF_ERROR(positive("device.peak_tflops_bf16", d.peak_tflops_bf16));
  CONCERTO_RETURN_IF_ERROR(positive("device.peak_tflops_fp16", d.peak_tflops_fp16));
  CONCERTO_RETURN_IF_ERROR(positive("device.peak_tflops_fp32", d.peak_tflops_fp32));
  CONCERTO_RETURN_IF_ERROR(positive("device.memory_bandwidth_gbps", d.memory_bandwidth_gbps));
  CONCERTO_RETURN_IF_ERROR(positive("device.memory_gb", d.memory_gb));
  CONCERTO_RETURN_IF_ERROR(non_negative("device.memory_reserve_gb", d.memory_reserve_gb));
  if (d.memory_reserve_gb >= d.memory_gb)
    return error("device.memory_reserve_gb", "must be less than device.memory_gb (" + FormatNumber(d.memory_gb) +
                                                 "), got " + FormatNumber(d.memory_reserve_gb));
  CONCERTO_RETURN_IF_ERROR(fraction("device.matmul_efficiency", d.matmul_efficiency));
  if (d.attention_efficiency != 0)
    CONCERTO_RETURN_IF_ERROR(fraction("device.attention_efficiency", d.attention_efficiency));
  CONCERTO_RETURN_IF_ERROR(fraction("device.vector_efficiency", d.vector_efficiency));
  CONCERTO_RETURN_IF_ERROR(fraction("device.memory_efficiency", d.memory_efficiency));
  CONCERTO_RETURN_IF_ERROR(non_negative("device.launch_overhead_us", d.launch_overhead_us));
  CONCERTO_RETURN_IF_ERROR(positive("intra_node.bandwidth_gbps", spec.intra_node.bandwidth_gbps));
  CONCERTO_RETURN_IF_ERROR(non_negative("intra_node.latency_us", spec.intra_node.latency_us));
  CONCERTO_RETURN_IF_ERROR(positive("inter_node.bandwidth_gbps", spec.inter_node.bandwidth_gbps));
  CONCERTO_RETURN_IF_ERROR(non_negative("inter_node.latency_us", spec.inter_node.latency_us));
  const std::string& algo = spec.collective_algorithm;
  if (algo != "auto" && algo != "ring" && algo != "tree" && algo != "hierarchical")
    return error("collective_algorithm",
                 "must be one of auto, ring, tree, hierarchical, got '" + algo + "'");
  if (!std::isfinite(spec.interference) || spec.interference < 0 || spec.interference > 10)
    return error("interference",
                 "must be a slowdown fraction in [0, 10], got " + FormatNumber(spec.interference));
  if (!std::isfinite(spec.corun_slowdown) || spec.corun_slowdown < 0 || spec.corun_slowdown > 10)
    return error("corun_slowdown",
                 "must be a slowdown fraction in [0, 10], got " + FormatNumber(spec.corun_slowdown));
  if (!std::isfinite(spec.comm_corun_slowdown) || spec.comm_corun_slowdown < 0 || spec.comm_corun_slowdown > 10)
    return error("comm_corun_slowdown",
                 "must be a slowdown fraction in [0, 10], got " + FormatNumber(spec.comm_corun_slowdown));
  if (!std::isfinite(spec.comm_corun_latency_us) || spec.comm_corun_latency_us < 0 ||
      spec.comm_corun_latency_us > 1e7)
    return error("comm_corun_latency_us",
                 "must be a latency in [0, 1e7] us, got " + FormatNumber(spec.comm_corun_latency_us));
  if (!std::isfinite(spec.link_burst_us) || spec.link_burst_us < 0 || spec.link_burst_us > 1e7)
    return error("link_burst_us", "must be a time in [0, 1e7] us, got " + FormatNumber(spec.link_burst_us));
  if (!std::isfinite(spec.comm_corun_hold_us) || spec.comm_corun_hold_us < 0 || spec.comm_corun_hold_us > 1e7)
    return error("comm_corun_hold_us", "must be a time in [0, 1e7] us, got " + FormatNumber(spec.comm_corun_hold_us));
  if (!std::isfinite(spec.compute_jitter) || spec.compute_jitter < 0 || spec.compute_jitter > 1)
    return error("compute_jitter",
                 "must be a coefficient of variation in [0, 1], got " + FormatNumber(spec.compute_jitter));
  if (spec.corun_slowdown_memory != -1 &&
      (!std::isfinite(spec.corun_slowdown_memory) || spec.corun_slowdown_memory < 0 || spec.corun_slowdown_memory > 10))
    return error("corun_slowdown_memory", "must be a slowdown fraction in [0, 10] (or absent: as corun_slowdown), got " +
                                              FormatNumber(spec.corun_slowdown_memory));
  CONCERTO_RETURN_IF_ERROR(positive("device.gemm_ramp_k", d.gemm_ramp_k));
  if (d.sm_count < 0 || d.sm_count > 100000)
    return error("device.sm_count", "must be a whole number in [0, 100000] (0: size-blind GEMMs), got " +
                                        std::to_string(d.sm_count));
  const TopologySpec& t = spec.topology;
  if (t.intra_link != "nvswitch" && t.intra_link != "pcie" && t.intra_link != "bus")
    return error("topology.intra_link", "must be one of nvswitch, pcie, bus, got '" + t.intra_link + "'");
  if (t.nics_per_node < 0) return error("topology.nics_per_node", "must be >= 0");
  if (!std::isfinite(t.nvls_algbw_gbps) || t.nvls_algbw_gbps < 0)
    return error("topology.nvls_algbw_gbps", "must be >= 0 (0: no NVLink SHARP), got " + FormatNumber(t.nvls_algbw_gbps));
  if (!std::isfinite(t.interference_growth) || t.interference_growth < 0 || t.interference_growth > 10)
    return error("topology.interference_growth",
                 "must be a fraction in [0, 10], got " + FormatNumber(t.interference_growth));
  return Status::Ok();
}

std::string ClusterToJson(const ClusterSpec& spec) {
  nlohmann::ordered_json j;
  j["name"] = spec.name;
  j["description"] = spec.description;
  j["nodes"] = spec.nodes;
  j["devices_per_node"] = spec.devices_per_node;
  const DeviceSpec& d = spec.device;
  j["device"] = {{"name", d.name},
                 {"peak_tflops_bf16", d.peak_tflops_bf16},
                 {"peak_tflops_fp16", d.peak_tflops_fp16},
                 {"peak_tflops_fp32", d.peak_tflops_fp32},
                 {"memory_bandwidth_gbps", d.memory_bandwidth_gbps},
                 {"memory_gb", d.memory_gb},
                 {"memory_reserve_gb", d.memory_reserve_gb},
                 {"matmul_efficiency", d.matmul_efficiency},
                 {"attention_efficiency", d.attention_efficiency},
                 {"vector_efficiency", d.vector_efficiency},
                 {"memory_efficiency", d.memory_efficiency},
                 {"launch_overhead_us", d.launch_overhead_us},
                 {"sm_count", d.sm_count},
                 {"gemm_ramp_k", d.gemm_ramp_k}};
  j["intra_node"] = {{"bandwidth_gbps", spec.intra_node.bandwidth_gbps},
                     {"latency_us", spec.intra_node.latency_us}};
  j["inter_node"] = {{"bandwidth_gbps", spec.inter_node.bandwidth_gbps},
                     {"latency_us", spec.inter_node.latency_us}};
  j["collective_algorithm"] = spec.collective_algorithm;
  j["interference"] = spec.interference;
  j["corun_slowdown"] = spec.corun_slowdown;
  if (spec.corun_slowdown_memory >= 0) j["corun_slowdown_memory"] = spec.corun_slowdown_memory;
  j["comm_corun_slowdown"] = spec.comm_corun_slowdown;
  if (spec.comm_corun_latency_us > 0) j["comm_corun_latency_us"] = spec.comm_corun_latency_us;
  if (spec.link_burst_us > 0) j["link_burst_us"] = spec.link_burst_us;
  if (spec.comm_corun_hold_us > 0) j["comm_corun_hold_us"] = spec.comm_corun_hold_us;
  if (spec.compute_jitter > 0) j["compute_jitter"] = spec.compute_jitter;
  const TopologySpec& t = spec.topology;
  j["topology"] = {{"intra_link", t.intra_link},
                   {"nics_per_node", t.nics_per_node},
                   {"network_crosses_intra_link", t.network_crosses_intra_link},
                   {"share_links", t.share_links},
                   {"interference_growth", t.interference_growth},
                   {"nvls_algbw_gbps", t.nvls_algbw_gbps}};
  return DumpJson(j, 2) + "\n";
}

double EffectiveInterference(double requested, const ClusterSpec& cluster) {
  return requested >= 0 ? requested : cluster.interference;
}

}  // namespace concerto
