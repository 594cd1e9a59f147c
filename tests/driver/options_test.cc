// The option table (driver/options.h) and the option records it gathers
// (util/option_record.h): each option is declared once, next to its struct,
// and sets that struct's field; defaults are the fields' initializers.
#include <gtest/gtest.h>

#include <set>

#include "concerto/driver/driver.h"
#include "concerto/driver/options.h"

namespace concerto {
namespace {

TEST(OptionTable, EveryOptionIsOneRecordWithItsFieldsDefault) {
  std::set<std::string> names;
  const Options defaults;
  for (const OptionSpec& spec : OptionTable()) {
    EXPECT_TRUE(names.insert(spec.name).second) << "declared twice: " << spec.name;
    EXPECT_EQ(spec.get(defaults), spec.default_value) << spec.name;
    EXPECT_LE(spec.min_value, spec.default_value) << spec.name;
    EXPECT_GE(spec.max_value, spec.default_value) << spec.name;
    EXPECT_FALSE(spec.help.empty()) << spec.name;
  }
  // The scheduler's options that used to be fixed in code are settable.
  for (const char* name : {"threads", "reuse-windows", "fuse", "te-overlap-chunks", "block", "memory-budget"})
    EXPECT_TRUE(names.count(name)) << name;
}

TEST(OptionTable, SettingAnOptionSetsItsStructField) {
  // ddp-bucket is in MiB, its field in bytes: 25 MiB -> 26214400 bytes.
  Options o;
  ASSERT_TRUE(o.Set("ddp-bucket", 25).ok());
  EXPECT_EQ(o.concerto.baselines.ddp_bucket_bytes, 25 << 20);
  ASSERT_TRUE(o.Set("block", 40).ok());
  EXPECT_EQ(o.concerto.block_ops, 40);
  ASSERT_TRUE(o.Set("fuse", 0).ok());
  EXPECT_FALSE(o.concerto.fuse);
  ASSERT_TRUE(o.Set("threads", 1).ok());
  EXPECT_EQ(o.concerto.threads, 1);
  ASSERT_TRUE(o.Set("interference", 0.25).ok());
  EXPECT_EQ(o.concerto.sim.interference, 0.25);
  ASSERT_TRUE(o.Set("decompose", 2).ok());
  EXPECT_EQ(o.decompose.max_chunks, 2);
  // The passes get them: the decomposition pass the simulation's interference.
  EXPECT_EQ(ToDecomposeOptions(o).interference, 0.25);
  EXPECT_EQ(ToConcertoOptions(o).block_ops, 40);
  EXPECT_EQ(ToBaselineOptions(o).ddp_bucket_bytes, 25 << 20);
  EXPECT_EQ(o.Get("ddp-bucket"), 25);
}

TEST(OptionTable, ValuesAreCheckedOnceByTheirRecord) {
  Options o;
  Status s = o.Set("threads", 300);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "option --threads: 300 threads is out of range [1, 256]");
  s = o.Set("fuse", 0.5);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "option --fuse: 0.5 is not 0 or 1");
  s = o.Set("interference", -0.5);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("give -1 for the cluster's value"), std::string::npos);
  EXPECT_FALSE(o.Set("no-such-option", 1).ok());
  EXPECT_EQ(o.concerto.threads, 2);  // a refused value leaves the field alone
}

TEST(OptionTable, TheJsonReportListsEveryOption) {
  Options o;
  ASSERT_TRUE(o.Set("rounds", 7).ok());
  const nlohmann::json j = OptionsJson(o);
  EXPECT_EQ(j.size(), OptionTable().size() + 1);  // and the solver
  EXPECT_EQ(j["rounds"], 7);
  EXPECT_EQ(j["solver"], "gecode");
  EXPECT_EQ(j["memory-budget"], -1);
}

}  // namespace
}  // namespace concerto
