// Registry::MergeFrom: shards of one run come back together, idempotently;
// in-flight marks and shard records.
#include <filesystem>

#include <gtest/gtest.h>

#include "registry/registry.h"
#include "tests/support/case_builder.h"
#include "tests/support/temp_dir.h"

namespace coverage::registry {
namespace {

using coverage::testing::MmCase;
using coverage::testing::TempDir;

class Merge : public ::testing::Test {
 protected:
  // A registry of ten cases, and copies of it for two shards.
  void SetUp() override {
    auto base = Registry::Open(dir_.File("base.db"));
    ASSERT_TRUE(base.has_value());
    for (int n = 1; n <= 10; ++n) ids_.push_back(*(*base)->UpsertCase(MmCase(n, 2, 2), {}));
    base->reset();
    for (const char* f : {"s0.db", "s1.db", "merged.db"}) std::filesystem::copy_file(dir_.File("base.db"), dir_.File(f));
  }
  std::unique_ptr<Registry> Open(const char* f) {
    auto r = Registry::Open(dir_.File(f));
    EXPECT_TRUE(r.has_value()) << r.error().ToString();
    return std::move(*r);
  }
  // Shard `index` of 2 records results for its half of the cases.
  void RunShard(const char* f, int index, const std::string& config = R"({"replay":{"seed":0},"shard":"x"})") {
    auto r = Open(f);
    RunRecord run{.run_id = "R", .stage = "unit", .backend = "sim", .started_at = "2026-11-30T0" +
                  std::to_string(index) + ":00:00Z", .config_json = config};
    ASSERT_TRUE(r->CreateOrResumeRun(run, nullptr).has_value());
    ASSERT_TRUE(r->StartShard("R", index, 2, "host", run.started_at).ok());
    for (size_t i = index; i < ids_.size(); i += 2) {
      CaseResult res{.outcome = i % 3 ? Outcome::kPass : Outcome::kMismatch, .max_abs_err = 0.5 * i,
                     .warm_min_us = 10.0 + i, .attempts = i == 4 ? 2 : 1, .flaky = i == 4};
      if (i == 4) res.attempt_outcomes = {Outcome::kMismatch, Outcome::kPass};
      ASSERT_TRUE(r->RecordResult("R", ids_[i], res).ok());
    }
    ASSERT_TRUE(r->FinishShard("R", index, 2, "2026-11-30T05:00:00Z").ok());
  }
  std::string Dump(Registry& r) {
    auto q = r.Query("SELECT c.key, x.outcome, x.max_abs_err, x.attempts, x.flaky, x.attempt_outcomes, x.warm_min_us "
                     "FROM results x "
                     "JOIN op_cases c ON c.case_id = x.case_id WHERE x.run_id = 'R' ORDER BY c.key");
    std::string out;
    for (const auto& row : q->rows) {
      for (const auto& v : row) out += v + "|";
      out += "\n";
    }
    return out;
  }
  TempDir dir_;
  std::vector<int64_t> ids_;
};

TEST_F(Merge, ShardsMergeIntoOneFinishedRunAndMergingTwiceChangesNothing) {
  RunShard("s0.db", 0);
  auto merged = Open("merged.db");
  auto first = merged->MergeFrom(dir_.File("s0.db"));
  ASSERT_TRUE(first.has_value()) << first.error().ToString();
  EXPECT_EQ(first->runs_added, 1);
  EXPECT_EQ(first->results_added, 5);
  EXPECT_TRUE((*merged->GetRun("R"))->finished_at.empty()) << "one of two shards is not a finished run";

  RunShard("s1.db", 1);
  auto second = merged->MergeFrom(dir_.File("s1.db"));
  ASSERT_TRUE(second.has_value()) << second.error().ToString();
  EXPECT_EQ(second->runs_added, 0);
  EXPECT_EQ(second->results_added, 5);
  auto run = *merged->GetRun("R");
  EXPECT_EQ(run->finished_at, "2026-11-30T05:00:00Z");
  EXPECT_EQ(run->started_at, "2026-11-30T00:00:00Z");  // the earliest shard's start

  const std::string once = Dump(*merged);
  EXPECT_NE(once.find("mismatch,pass"), std::string::npos);
  for (const char* f : {"s0.db", "s1.db"}) {
    auto again = merged->MergeFrom(dir_.File(f));
    ASSERT_TRUE(again.has_value());
    EXPECT_EQ(again->results_added, 0);
    EXPECT_EQ(again->already_present, 5);
    EXPECT_EQ(again->conflicts, 0);
    EXPECT_EQ(again->shards_added, 0);
  }
  EXPECT_EQ(Dump(*merged), once);

  // The same results as one unsharded run of every case.
  auto whole = Open("base.db");
  ASSERT_TRUE(whole->CreateOrResumeRun({.run_id = "R", .stage = "unit", .backend = "sim", .started_at = "t"}, nullptr));
  for (size_t i = 0; i < ids_.size(); ++i) {
    CaseResult res{.outcome = i % 3 ? Outcome::kPass : Outcome::kMismatch, .max_abs_err = 0.5 * i,
                   .warm_min_us = 10.0 + i, .attempts = i == 4 ? 2 : 1, .flaky = i == 4};
    if (i == 4) res.attempt_outcomes = {Outcome::kMismatch, Outcome::kPass};
    ASSERT_TRUE(whole->RecordResult("R", ids_[i], res).ok());
  }
  EXPECT_EQ(Dump(*whole), once);

  // A merged run takes its place in the target's run order when it arrives
  // (Note [Run order]): a run started here afterwards comes after it.
  ASSERT_TRUE(merged->CreateOrResumeRun({.run_id = "later", .stage = "unit", .backend = "sim", .started_at = "t"},
                                        nullptr));
  ASSERT_TRUE(merged->FinishRun("later", "t").ok());
  auto order = merged->Query("SELECT run_id FROM runs ORDER BY seq");
  ASSERT_TRUE(order.has_value());
  ASSERT_EQ(order->rows.size(), 2u);
  EXPECT_EQ(order->rows[0][0], "R");
  EXPECT_EQ(order->rows[1][0], "later");
}

TEST_F(Merge, ASkippedResultIsReplacedByTheShardsRealOneAndTheSourceIsOnlyRead) {
  RunShard("s0.db", 0);
  auto merged = Open("merged.db");
  {
    // The merged run holds case 0 as skipped (an earlier cost cap) and a
    // model stage skipped whole.
    ASSERT_TRUE(merged->CreateOrResumeRun({.run_id = "R", .stage = "unit", .backend = "sim", .started_at = "t",
                                           .config_json = R"({"replay":{"seed":0}})"}, nullptr));
    ASSERT_TRUE(merged->RecordResult("R", ids_[0], CaseResult{.outcome = Outcome::kSkipped,
                                      .error = "over the cost cap"}).ok());
    ASSERT_TRUE(merged->RecordModelStage("R", "m/x", "prefill", "model",
                                         {{.result = {.item = "*", .outcome = Outcome::kSkipped, .error = "cap"}}}).ok());
    auto s0 = Open("s0.db");
    ASSERT_TRUE(s0->RecordModelStage("R", "m/x", "prefill", "model", {{.result = {.item = "forward"}}}).ok());
  }
  const auto before = std::filesystem::last_write_time(dir_.File("s0.db"));
  const auto size = std::filesystem::file_size(dir_.File("s0.db"));
  auto m = merged->MergeFrom(dir_.File("s0.db"));
  ASSERT_TRUE(m.has_value()) << m.error().ToString();
  EXPECT_EQ(m->conflicts, 0);
  auto row = merged->Query("SELECT outcome FROM results WHERE run_id = 'R' AND case_id = ?1", {std::to_string(ids_[0])});
  EXPECT_EQ(row->rows[0][0], "mismatch");
  auto stage = merged->Query("SELECT item, outcome FROM model_results WHERE run_id = 'R' ORDER BY item");
  ASSERT_EQ(stage->rows.size(), 1u);
  EXPECT_EQ(stage->rows[0], (std::vector<std::string>{"forward", "pass"}));
  EXPECT_EQ(std::filesystem::last_write_time(dir_.File("s0.db")), before);
  EXPECT_EQ(std::filesystem::file_size(dir_.File("s0.db")), size);
}

TEST_F(Merge, CasesTheTargetLacksAreCopiedByKey) {
  RunShard("s0.db", 0);
  {
    auto s0 = Open("s0.db");
    int64_t extra = *s0->UpsertCase(MmCase(99, 2, 2), {});
    ASSERT_TRUE(s0->RecordResult("R", extra, CaseResult{.outcome = Outcome::kCrash, .error = "SIGSEGV"}).ok());
  }
  std::filesystem::remove(dir_.File("merged.db"));
  auto empty = Open("merged.db");  // a new registry
  auto m = empty->MergeFrom(dir_.File("s0.db"));
  ASSERT_TRUE(m.has_value()) << m.error().ToString();
  EXPECT_EQ(m->cases_added, 6);
  EXPECT_EQ(m->results_added, 6);
  auto found = empty->GetCaseByKey(MmCase(99, 2, 2).Key());
  ASSERT_TRUE(found.has_value() && found->has_value());
  EXPECT_EQ((*found)->op_case, MmCase(99, 2, 2));
}

TEST_F(Merge, DifferentRowsAreConflictsKeptAsTheyWere) {
  RunShard("s0.db", 0);
  auto merged = Open("merged.db");
  ASSERT_TRUE(merged->MergeFrom(dir_.File("s0.db")).has_value());
  {
    auto s0 = Open("s0.db");
    ASSERT_TRUE(s0->RecordResult("R", ids_[0], CaseResult{.outcome = Outcome::kTimeout}).ok());
  }
  auto m = merged->MergeFrom(dir_.File("s0.db"));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->conflicts, 1);
  ASSERT_EQ(m->conflict_examples.size(), 1u);
  EXPECT_NE(m->conflict_examples[0].find("timeout"), std::string::npos) << m->conflict_examples[0];
  auto kept = merged->Query("SELECT outcome FROM results WHERE run_id = 'R' AND case_id = ?1", {std::to_string(ids_[0])});
  EXPECT_EQ(kept->rows[0][0], "mismatch");
}

TEST_F(Merge, AnotherRunUnderTheSameIdIsRefusedAndNothingIsMerged) {
  RunShard("s0.db", 0);
  RunShard("s1.db", 1, R"({"replay":{"seed":7}})");
  auto merged = Open("merged.db");
  ASSERT_TRUE(merged->MergeFrom(dir_.File("s0.db")).has_value());
  auto m = merged->MergeFrom(dir_.File("s1.db"));
  ASSERT_FALSE(m.has_value());
  EXPECT_NE(m.error().message().find("seed"), std::string::npos) << m.error().ToString();
  EXPECT_NE(m.error().message().find("nothing was merged"), std::string::npos);
  auto rows = merged->Query("SELECT COUNT(*) FROM results");
  EXPECT_EQ(rows->rows[0][0], "5");
}

// A shard is read as the registry reads its own rows before anything is
// written: one unreadable row refuses it whole, naming file, table and row.
TEST_F(Merge, AShardWithARowTheRegistryCannotReadIsRefusedWhole) {
  RunShard("s0.db", 0);
  {
    auto s0 = Open("s0.db");
    ASSERT_TRUE(s0->Query("UPDATE results SET outcome = 'banana' WHERE case_id = ?1", {std::to_string(ids_[2])}));
  }
  auto merged = Open("merged.db");
  auto m = merged->MergeFrom(dir_.File("s0.db"));
  ASSERT_FALSE(m.has_value());
  const std::string why = m.error().message();
  for (const std::string& part : {std::string("s0.db"), std::string("results of run 'R'"),
                                  "case " + std::to_string(ids_[2]), std::string("unknown outcome 'banana'"),
                                  std::string("nothing was merged")}) {
    EXPECT_NE(why.find(part), std::string::npos) << part << " in " << why;
  }
  EXPECT_EQ(merged->Query("SELECT COUNT(*) FROM results")->rows[0][0], "0");
  EXPECT_EQ(merged->Query("SELECT COUNT(*) FROM runs")->rows[0][0], "0");
  // A case whose description is not JSON is refused the same way.
  {
    auto s0 = Open("s0.db");
    ASSERT_TRUE(s0->Query("UPDATE results SET outcome = 'pass'"));
    ASSERT_TRUE(s0->Query("UPDATE op_cases SET case_json = '{' WHERE case_id = ?1", {std::to_string(ids_[4])}));
  }
  auto c = merged->MergeFrom(dir_.File("s0.db"));
  ASSERT_FALSE(c.has_value());
  EXPECT_NE(c.error().message().find("s0.db"), std::string::npos) << c.error().message();
  EXPECT_NE(c.error().message().find("nothing was merged"), std::string::npos) << c.error().message();
  EXPECT_EQ(merged->Query("SELECT COUNT(*) FROM results")->rows[0][0], "0");
}

TEST_F(Merge, AMissingFileOrItselfIsAClearError) {
  auto merged = Open("merged.db");
  auto missing = merged->MergeFrom(dir_.File("nope.db"));
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.error().message().find("nope.db"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir_.File("nope.db")));
  auto self = merged->MergeFrom(dir_.File("merged.db"));
  ASSERT_FALSE(self.has_value());
  EXPECT_NE(self.error().message().find("itself"), std::string::npos);
}

TEST(InFlight, AMarkIsClearedWithItsResultOnly) {
  TempDir dir;
  auto r = *Registry::Open(dir.File("r.db"));
  int64_t a = *r->UpsertCase(MmCase(1, 2, 2), {}), b = *r->UpsertCase(MmCase(2, 2, 2), {});
  ASSERT_TRUE(r->CreateOrResumeRun({.run_id = "R", .stage = "unit", .backend = "cpu", .started_at = "t"}, nullptr));
  ASSERT_TRUE(r->MarkInFlight("R", "case:" + std::to_string(a), "h", 1).ok());
  ASSERT_TRUE(r->MarkInFlight("R", "case:" + std::to_string(b), "h", 1).ok());
  ASSERT_TRUE(r->RecordResult("R", a, CaseResult{.outcome = Outcome::kPass}).ok());
  EXPECT_EQ(*r->InFlight("R"), std::vector<std::string>{"case:" + std::to_string(b)});
  ASSERT_TRUE(r->RecordModelStage("R", "m/x", "prefill", "model", {{.result = {.item = "forward"}}}).ok());
  ASSERT_TRUE(r->MarkInFlight("R", "model:m/x:train", "h", 1).ok());
  ASSERT_TRUE(r->RecordModelStage("R", "m/x", "train", "train", {{.result = {.item = "train"}}}).ok());
  EXPECT_EQ(r->InFlight("R")->size(), 1u);
}

}  // namespace
}  // namespace coverage::registry
