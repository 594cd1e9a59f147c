// Readers never crash, never recurse without bound and never truncate silently:
// each class of defect found by attacking the readers (issue "Reliability"),
// with an input of that class and the message it must give instead.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fstream>
#include <string>

#include "concerto/cost/cluster.h"
#include "concerto/ir/verifier.h"
#include "concerto/lower/frontend.h"
#include "concerto/lower/plan.h"
#include "concerto/lower/sharding_plan.h"
#include "concerto/lower/transformer.h"
#include "concerto/schedule/schedule.h"
#include "concerto/ir/json_io.h"
#include "concerto/util/input_file.h"
#include "concerto/util/json_text.h"

namespace concerto {
namespace {

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

/// `depth` nested lists: [[[...]]].
std::string DeepList(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

/// `depth` nested objects: {"a":{"a":...{}}}.
std::string DeepObject(int depth) {
  std::string s;
  for (int i = 0; i < depth; ++i) s += "{\"a\":";
  s += "{}";
  s += std::string(depth, '}');
  return s;
}

void ExpectErrorContains(const Status& st, const std::string& part) {
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(part), std::string::npos) << st.message();
}

TEST(ReaderRobustness, ClusterFileWithASelfReferencingAliasIsRejected) {
  // a: &x {b: *x} is a map that contains itself: converted to a bounded depth.
  Result<ClusterSpec> c = LoadCluster(WriteTemp("self_alias.yaml", "a: &x\n  b: *x\n"));
  ExpectErrorContains(c.status(), "field 'a': unknown key");
  c = LoadCluster(WriteTemp("self_alias_device.yaml", "base: a800-4x8\ndevice: &x\n  name: *x\n"));
  ExpectErrorContains(c.status(), "field 'device.name'");
}

TEST(ReaderRobustness, ClusterFileNestedDeeplyIsRejectedCheaply) {
  // 100,000 levels: a list is described by its size, never dumped.
  Result<ClusterSpec> c = LoadCluster(WriteTemp("deep_list.json", "{\"name\": " + DeepList(100000) + "}"));
  ExpectErrorContains(c.status(), "field 'name': must be a string, got a list of 1 item");
  c = LoadCluster(WriteTemp("deep_object.json", "{\"device\": " + DeepObject(100000) + "}"));
  ExpectErrorContains(c.status(), "field 'device.a': unknown key");
  c = LoadCluster(WriteTemp("deep_root.json", DeepList(100000)));
  ExpectErrorContains(c.status(), "top level must be a map");
}

TEST(ReaderRobustness, InvalidUtf8NameIsWrittenAsJson) {
  // YAML passes the bytes through; the JSON writer replaces them instead of throwing.
  Result<ClusterSpec> c = LoadCluster(WriteTemp("utf8.yaml", "base: a800-4x8\nname: \"bad\xff\"\n"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  const std::string json = ClusterToJson(*c);
  EXPECT_NE(json.find("bad\xEF\xBF\xBD"), std::string::npos) << json;  // U+FFFD
  nlohmann::json j = {{"name", c->name}};
  EXPECT_EQ(DumpJson(j), "{\"name\":\"bad\xEF\xBF\xBD\"}");
  EXPECT_EQ(DescribeJson(nlohmann::json(c->name)), "\"bad\xEF\xBF\xBD\"");
}

TEST(ReaderRobustness, PlanFileWithANonScalarKeyIsRejected) {
  Result<ParallelPlan> p = ParsePlanFile("? [a, b]\n: 1\n", "p.yaml");
  ExpectErrorContains(p.status(), "p.yaml: line 1: a key must be a plan key name");
  p = ParsePlanFile("? {dp: 2}\n: 1\n", "p.yaml");
  ExpectErrorContains(p.status(), "a key must be a plan key name");
}

TEST(ReaderRobustness, ScheduleFileTypesAndRangesAreChecked) {
  auto schedule = [](const std::string& ops, const std::string& extra = "") {
    return ParseSchedule("{\"format\": \"concerto-schedule\", \"scheduler\": \"x\", \"roles\": [{\"role\": \"r\", "
                         "\"streams\": [{\"stream\": \"compute\", \"ops\": " +
                             ops + "}]}]" + extra + "}",
                         "s.json");
  };
  ASSERT_TRUE(schedule("[0, 1, 2]").ok());
  // An id past int's range or a fraction is an error, not op 1.
  ExpectErrorContains(schedule("[4294967297]").status(), "field 'ops'[0] must be a whole number");
  ExpectErrorContains(schedule("[1.5]").status(), "field 'ops'[0] must be a whole number in");
  ExpectErrorContains(schedule("[-3000000000]").status(), "got -3000000000");
  ExpectErrorContains(schedule("5").status(), "field 'ops' must be a list of op ids, got 5");
  ExpectErrorContains(schedule("[\"3\"]").status(), "got \"3\"");
  // A number where the list of fusion groups belongs.
  ExpectErrorContains(schedule("[0]", ", \"fusion_groups\": 3").status(), "field 'fusion_groups' must be a list, got 3");
  ExpectErrorContains(schedule("[0]", ", \"fusion_groups\": [{\"role\": \"r\", \"fused_op\": 1e30, \"members\": []}]")
                          .status(),
                      "field 'fused_op' must be a whole number");
}

TEST(ReaderRobustness, ShardingFileDescribesDeepValuesCheaply) {
  Result<ShardingPlan> s = ParseShardingPlan("{\"mesh\": {\"dp\": " + DeepList(100000) + "}}", "sh.json");
  ExpectErrorContains(s.status(), "size must be an integer >= 1, got a list of 1 item");
}

TEST(ReaderRobustness, MicrobatchesAreBoundedBeforeAnythingIsBuilt) {
  // A million micro-batches on gpt-tiny grew past 2.8 GB before; now a message, at once.
  Result<Program> p = LowerModelPlan("gpt-tiny", "pp=2,microbatches=1048576");
  ExpectErrorContains(p.status(), "microbatches must be at most 4096, got 1048576");
  p = LowerModelPlan("gpt-tiny", "microbatches=1048576");
  ExpectErrorContains(p.status(), "microbatches must be at most 4096");
  EXPECT_TRUE(LowerModelPlan("gpt-tiny", "pp=2,microbatches=64").ok());
}

TEST(ReaderRobustness, PointToPointPairingIsBoundedUpFront) {
  // 32 sends and recvs on a mesh of 2^20 ranks: the pairing check would hold
  // 32 x 2^20 entries (gigabytes); it is refused at once with the limit.
  Program p;
  p.name = "wide";
  p.mesh.axes = {{"pp", 1 << 20}};
  Graph g;
  g.name = "main";
  g.streams = {"compute", "comm"};
  for (int i = 0; i < 16; ++i) {
    const std::string t = "t" + std::to_string(i), r = "r" + std::to_string(i);
    g.tensors.push_back(Tensor{t, {4}, DType::kF32, {{}}, {}});
    g.tensors.push_back(Tensor{r, {4}, DType::kF32, {{}}, {}});
    Op send;
    send.id = 2 * i;
    send.name = "send" + std::to_string(i);
    send.kind = OpKind::kSend;
    send.stream = "comm";
    send.inputs = {t};
    send.peer = {"pp", 1, -1};
    send.message_bytes = 16;
    Op recv = send;
    recv.id = 2 * i + 1;
    recv.name = "recv" + std::to_string(i);
    recv.kind = OpKind::kRecv;
    recv.inputs = {};
    recv.outputs = {r};
    recv.peer = {"pp", -1, -1};
    g.ops.push_back(send);
    g.ops.push_back(recv);
  }
  p.graphs.push_back(g);
  Role role{"all", "main", {}};
  for (int r = 0; r < (1 << 20); ++r) role.ranks.push_back(r);
  p.roles.push_back(role);
  const std::vector<std::string> v = VerifyProgram(p);
  bool found = false;
  for (const std::string& line : v) found |= line.find("more than the 4194304 the verifier pairs") != std::string::npos;
  EXPECT_TRUE(found) << (v.empty() ? "no violations" : v.front());
}

TEST(ReaderRobustness, DescribeJsonNeverDumpsContainers) {
  EXPECT_EQ(DescribeJson(nlohmann::json::parse("[1, [2, 3]]")), "a list of 2 items");
  EXPECT_EQ(DescribeJson(nlohmann::json::parse("{\"a\": 1}")), "an object with 1 key");
  EXPECT_EQ(DescribeJson(nlohmann::json(std::string(200, 'x'))).size(), 80u);
  EXPECT_EQ(DescribeJson(nlohmann::json(2.5)), "2.5");
}

TEST(ReaderRobustness, WhitespaceRunsAreBoundedInEveryReader) {
  // JSON's parser keeps the whitespace before a failing token and escapes it
  // into its message (8 bytes a newline): 1 GB of newlines cost 10.6 GB to
  // reject. Every file reader checks runs first, and so does the program
  // parser for text that never was a file.
  const std::string newlines(kMaxWhitespaceRun + 1, '\n');
  const std::string limit = "of whitespace in a row (the readers' limit";
  ExpectErrorContains(ReadProgramFile(WriteTemp("nl.json", newlines)).status(), "nl.json:1: more than 1 MiB " + limit);
  std::string text = "{}";
  text += newlines;
  ExpectErrorContains(ParseProgram(text, "text.json").status(), "text.json:1: more than 1 MiB");
  ExpectErrorContains(ReadScheduleFile(WriteTemp("nl_schedule.json", newlines)).status(), limit);
  ExpectErrorContains(LoadCluster(WriteTemp("nl_cluster.yaml", std::string("name: x") + newlines)).status(), "nl_cluster.yaml:1: more than 1 MiB");
  ExpectErrorContains(LoadPlan(WriteTemp("nl_plan.yaml", newlines)).status(), limit);
  ExpectErrorContains(LoadShardingPlan(WriteTemp("nl_sharding.json", newlines)).status(), limit);
  ExpectErrorContains(LoadModel(WriteTemp("nl_model.yaml", newlines)).status(), limit);
  // A run at the limit is fine (the parser then says what is wrong).
  ExpectErrorContains(ReadProgramFile(WriteTemp("ok_ws.json", std::string(kMaxWhitespaceRun, ' ').append("["))).status(),
                      "malformed JSON");
}

TEST(ReaderRobustness, FilesAreSizeCheckedBeforeReading) {
  // A sparse 65 MiB file: rejected by its size, without reading it.
  const std::string path = ::testing::TempDir() + "/big_plan.yaml";
  { std::ofstream(path, std::ios::binary).seekp(kMaxSmallInputBytes) << 'x'; }
  ExpectErrorContains(LoadPlan(path).status(), "big_plan.yaml: the plan file is 64 MiB, more than the limit of 64 MiB");
  ExpectErrorContains(ReadProgramFile("/no/such/program.json").status(), "/no/such/program.json: no such program file");
  ExpectErrorContains(ReadProgramFile(::testing::TempDir()).status(), "is a directory, not a program file");
}

TEST(ReaderRobustness, StreamsPerGraphAreBounded) {
  // 100k declared streams made scheduling quadratic (38 s for 11 ops); the
  // reader and the verifier stop at kMaxStreamsPerGraph.
  Program p = ParseProgram(R"({"format": "concerto-ir", "version": 1, "name": "s", "mesh": {"axes": [{"name": "dp", "size": 1}]},
    "graphs": [{"name": "main", "streams": ["compute"], "tensors": [], "ops": []}],
    "roles": [{"name": "r", "graph": "main", "ranks": [0]}]})", "s.json").value();
  for (int i = 0; i < kMaxStreamsPerGraph; ++i) p.graphs[0].streams.push_back(fmt::format("s{}", i));
  const std::vector<std::string> v = VerifyProgram(p);
  ASSERT_FALSE(v.empty());
  EXPECT_NE(v.front().find("257 streams, more than the limit of 256"), std::string::npos) << v.front();
  ExpectErrorContains(ParseProgram(WriteProgram(p), "s.json").status(),
                      "s.json: graph 'main': field 'streams': 257 streams, more than the limit of 256");
}

TEST(ReaderRobustness, ModelSizesAreBoundedBeforeLowering) {
  // hidden = 2^30 once lowered to a program with negative byte counts (an
  // int64 overflow in the optimizer's bytes); every oversized dimension or
  // product is refused by ValidateModel, naming what would be too large.
  const std::string base = "family: gpt\nlayers: 2\nheads: 16\nseq: 128\nvocab: 1024\n";
  ExpectErrorContains(LoadModel(WriteTemp("huge_hidden.yaml", base + "hidden: 1073741824\nffn_hidden: 4096\n")).status(),
                      "model 'huge_hidden': the attention weights (hidden x (hidden + 2 x kv width)) would have "
                      "3.46e+18 elements, more than the limit of 2^40");
  ExpectErrorContains(LowerModelPlan(WriteTemp("huge_seq.yaml", "family: gpt\nlayers: 2\nheads: 16\nhidden: 1024\n"
                                                                "seq: 1048576\nvocab: 1024\nbatch: 64\n"),
                                     "dp=1")
                          .status(),
                      "the attention scores (batch x heads x seq x seq) would have");
  EXPECT_TRUE(LoadModel(WriteTemp("fine.yaml", base + "hidden: 1024\n")).ok());
}

TEST(ReaderRobustness, LayerCountsAreBoundedInEveryFamily) {
  // 2^20 layers were accepted and grew past 12 GB before failing (gpt, vit,
  // wide-resnet); each family now refuses them at once, naming the field.
  ExpectErrorContains(LoadModel(WriteTemp("deep_gpt.yaml", "family: gpt\nlayers: 1048576\nhidden: 64\nheads: 4\n"
                                                           "seq: 32\nvocab: 128\n"))
                          .status(),
                      "deep_gpt.yaml: model 'deep_gpt': layers must be at most 4096");
  ExpectErrorContains(LowerModelPlan(WriteTemp("deep_vit.yaml", "family: vit\nimage: 32\nclasses: 10\nbatch: 1\n"
                                                                "patch: 16\nlayers: 1048576\nhidden: 64\nheads: 4\n"
                                                                "mlp: 128\n"),
                                     "dp=1")
                          .status(),
                      "deep_vit.yaml: model 'deep_vit': layers must be at most 4096 in all");
  ExpectErrorContains(LowerModelPlan(WriteTemp("deep_wrn.yaml", "family: wide-resnet\nimage: 32\nclasses: 10\n"
                                                                "batch: 1\nblocks: [4000, 100, 1, 1]\n"),
                                     "dp=1")
                          .status(),
                      "blocks must be at most 4096 in all (every one adds ops to the lowered program), got 4102");
  // layers x micro-batches: 4096 x 32 is past 2^16.
  ExpectErrorContains(LowerModelPlan(WriteTemp("deep_ok.yaml", "family: gpt\nlayers: 4096\nhidden: 64\nheads: 4\n"
                                                               "seq: 32\nvocab: 128\n"),
                                     "pp=2,microbatches=32")
                          .status(),
                      "layers x microbatches must be at most 65536 (4096 x 32)");
}

TEST(ReaderRobustness, VisionSizesAreBoundedBeforeLowering) {
  // image 2^20 with patch 1: 2^40 tokens were lowered (155 ops, tensors of
  // 1.4e14 elements); a ResNet at that size failed in the verifier with 152
  // lines. Both now name the tensor that would be too large.
  ExpectErrorContains(LowerModelPlan(WriteTemp("big_vit.yaml", "family: vit\nimage: 1048576\nclasses: 10\n"
                                                               "batch: 1\npatch: 1\nlayers: 1\nhidden: 64\n"
                                                               "heads: 4\nmlp: 128\n"),
                                     "dp=1")
                          .status(),
                      "big_vit.yaml: model 'big_vit': the images (batch x 3 x image x image) would have 3.3e+12 "
                      "elements, more than the limit of 2^40");
  ExpectErrorContains(LowerModelPlan(WriteTemp("wide_wrn.yaml", "family: wide-resnet\nimage: 224\nclasses: 10\n"
                                                                "batch: 64\nblocks: [1, 1, 1, 1]\n"
                                                                "width_factor: 1048576\n"),
                                     "dp=1")
                          .status(),
                      "an activation (batch x channels x height x width) would have 1.35e+13 elements");
  ExpectErrorContains(LowerModelPlan(WriteTemp("tokens_vit.yaml", "family: vit\nimage: 4096\nclasses: 10\n"
                                                                  "batch: 1\npatch: 1\nlayers: 1\nhidden: 64\n"
                                                                  "heads: 4\nmlp: 128\n"),
                                     "dp=1")
                          .status(),
                      "the attention scores (batch x heads x tokens x tokens) would have 1.13e+15 elements");
}

TEST(ReaderRobustness, ParameterGuardCountsEachFamilysMlp) {
  // GPT-1T (Narayanan et al. 2021, Table 1: 1.008e12 parameters) was refused
  // when the guard counted LLaMA's three MLP matrices for GPT too.
  EXPECT_TRUE(LoadModel(WriteTemp("gpt_1t.yaml", "family: gpt\nlayers: 128\nhidden: 25600\nheads: 160\n"
                                                 "seq: 2048\nvocab: 51200\nbatch: 1\n"))
                  .ok());
}

TEST(ReaderRobustness, NumbersPastADoubleAreErrorsInEveryJsonReader) {
  // Found by fuzz_schedule: 33333333e3333333333333333 threw nlohmann's
  // out_of_range past the readers' parse_error handlers (an abort). Every
  // JSON reader now parses through ParseJsonDocument.
  const std::string huge = "33333333e3333333333333333";
  ExpectErrorContains(ParseSchedule("{\"format\": \"concerto-schedule\", \"roles\": [" + huge + "]}", "s.json").status(),
                      "s.json: malformed JSON: number overflow parsing '" + huge + "'");
  ExpectErrorContains(ParseShardingPlan("{\"mesh\": {\"dp\": " + huge + "}}", "h.json").status(),
                      "h.json: malformed JSON: number overflow");
  ExpectErrorContains(ParseProgram("{\"format\": " + huge + "}", "p.json").status(), "p.json");
  ExpectErrorContains(ParseCluster("{\"nodes\": " + huge + "}", "c.json", true).status(), "c.json");
  ExpectErrorContains(ParseJsonDocument<nlohmann::json>("[1e999]", "d.json").status(), "d.json: malformed JSON");
  ExpectErrorContains(ParseJsonDocument<nlohmann::json>("[1,", "d.json").status(), "d.json:1:4: malformed JSON");
}

}  // namespace
}  // namespace concerto
