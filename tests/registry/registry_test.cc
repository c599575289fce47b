#include <set>

#include <gtest/gtest.h>

#include "registry/registry.h"
#include "registry/schema.h"
#include "registry/sqlite.h"
#include "tests/support/case_builder.h"
#include "tests/support/temp_dir.h"

namespace coverage::registry {
namespace {

using testing::AddCase;
using testing::MmCase;
using testing::TempDir;

std::unique_ptr<Registry> OpenFresh(const TempDir& dir) {
  auto r = Registry::Open(dir.File("r.db"));
  EXPECT_TRUE(r.has_value()) << r.error().ToString();
  return std::move(*r);
}

int64_t CountRows(Registry& r, const std::string& table) {
  auto q = r.Query("SELECT COUNT(*) FROM " + table);
  EXPECT_TRUE(q.has_value());
  return std::stoll(q->rows.at(0).at(0));
}

// Brings a fresh database to schema `version` as a build of that version
// would have left it.
void MigrateTo(Database& db, int version) {
  for (const auto& m : Migrations()) {
    if (m.version > version) break;
    ASSERT_TRUE(db.Exec(std::string(m.sql)).ok()) << m.version;
  }
  ASSERT_TRUE(db.Exec("PRAGMA user_version = " + std::to_string(version)).ok());
}

TEST(Registry, NewDatabaseIsMigratedToTheLatestVersionOnce) {
  TempDir dir;
  {
    auto r = OpenFresh(dir);
    EXPECT_EQ(r->schema_version(), LatestSchemaVersion());
    ASSERT_TRUE(r->UpsertCase(MmCase(2, 3, 4), {48, 96}).has_value());
  }
  auto again = OpenFresh(dir);  // reopening migrates nothing and keeps data
  EXPECT_EQ(*again->CountCases(), 1);
  auto mode = again->Query("PRAGMA journal_mode");
  EXPECT_EQ(mode->rows[0][0], "wal");
  auto fk = again->Query("PRAGMA foreign_keys");
  EXPECT_EQ(fk->rows[0][0], "1");
}

TEST(Registry, RefusesADatabaseFromANewerBuild) {
  TempDir dir;
  {
    auto db = Database::Open(dir.File("r.db"));
    ASSERT_TRUE(db.has_value());
    ASSERT_TRUE((*db)->Exec("PRAGMA user_version = 99").ok());
  }
  auto r = Registry::Open(dir.File("r.db"));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), StatusCode::kUnsupported);
  EXPECT_NE(r.error().message().find("99"), std::string::npos);
}

TEST(Registry, ReadOnlyOpenOfAnEmptyFileSaysItIsNotARegistry) {
  TempDir dir;
  { auto db = Database::Open(dir.File("empty.db")); }
  auto r = Registry::Open(dir.File("empty.db"), RegistryOptions{.read_only = true});
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message().find("not a coverage registry"), std::string::npos);
}

TEST(Registry, UpsertOfSameCaseKeepsOneRow) {
  TempDir dir;
  auto r = OpenFresh(dir);
  auto first = r->UpsertCase(MmCase(8, 8, 8), {1024, 768});
  auto second = r->UpsertCase(MmCase(8, 8, 8), {1024, 768});
  auto other = r->UpsertCase(MmCase(8, 8, 9), {1152, 800});
  ASSERT_TRUE(first && second && other);
  EXPECT_EQ(*first, *second);
  EXPECT_NE(*first, *other);
  EXPECT_EQ(*r->CountCases(), 2);
}

TEST(Registry, SourcesOfIdenticalCallsAddUpTheirCounts) {
  TempDir dir;
  auto r = OpenFresh(dir);
  int64_t id = *r->UpsertCase(AddCase({4, 4}), {16, 192});
  CaseSource src{"org/model", "layers.0.mlp", "", "prefill", 0, 3};
  ASSERT_TRUE(r->AddCaseSource(id, src).ok());
  ASSERT_TRUE(r->AddCaseSource(id, src).ok());
  src.profile = "decode";
  ASSERT_TRUE(r->AddCaseSource(id, src).ok());
  EXPECT_EQ(CountRows(*r, "case_sources"), 2);
  auto cases = r->FindCases({});
  ASSERT_TRUE(cases.has_value());
  ASSERT_EQ(cases->size(), 1u);
  EXPECT_EQ((*cases)[0].total_calls, 9);
  EXPECT_EQ((*cases)[0].models, "org/model");
}

TEST(Registry, PruningKeepsCasesWithSourcesOrResults) {
  TempDir dir;
  auto r = OpenFresh(dir);
  int64_t sourced = *r->UpsertCase(MmCase(2, 2, 2), {});
  int64_t judged = *r->UpsertCase(MmCase(3, 3, 3), {});
  int64_t orphan = *r->UpsertCase(MmCase(4, 4, 4), {});
  ASSERT_TRUE(r->AddCaseSource(sourced, {"m/a", "x", "", "p", 0, 1}).ok());
  ASSERT_TRUE(r->CreateOrResumeRun({.run_id = "r", .stage = "unit", .backend = "cpu", .started_at = "t"}, nullptr));
  ASSERT_TRUE(r->RecordResult("r", judged, CaseResult{.outcome = Outcome::kPass}).ok());
  EXPECT_EQ(*r->PruneOrphanCases(), 1);
  EXPECT_FALSE((*r->GetCaseByKey(MmCase(4, 4, 4).Key())).has_value());
  EXPECT_EQ(*r->CountCases(), 2);
  (void)orphan;
}

TEST(Registry, OpInfoSamplesAreASourceOfTheirOwn) {
  TempDir dir;
  auto r = OpenFresh(dir);
  const int64_t captured = *r->UpsertCase(MmCase(2, 2, 2), {});
  ASSERT_TRUE(r->AddCaseSource(captured, {"m/a", "x", "", "p", 0, 1}).ok());
  // Sample 0 makes the captured case too; sample 1 makes a new one twice.
  OpInfoImportRecord rec{.opinfo = "mm", .variant = "", .dtype = "f32", .status = "imported", .samples = 2};
  std::vector<OpInfoSampleCall> calls = {{0, "", 0, MmCase(2, 2, 2), {}},
                                         {1, "edge", 0, MmCase(0, 5, 3), {}},
                                         {1, "edge", 1, MmCase(0, 5, 3), {}}};
  ASSERT_TRUE(r->StoreOpInfo(&rec, calls).ok());
  EXPECT_EQ(rec.calls, 3);
  EXPECT_EQ(rec.cases, 2);
  EXPECT_EQ(*r->CountCases(), 2);

  auto by_source = [&](const std::string& source) {
    std::set<std::string> keys;
    auto found = r->FindCases({.source = source});
    EXPECT_TRUE(found.has_value());
    for (const StoredCase& c : *found) keys.insert(c.key);
    return keys;
  };
  EXPECT_EQ(by_source("captured"), (std::set<std::string>{MmCase(2, 2, 2).Key()}));
  EXPECT_EQ(by_source("opinfo"), (std::set<std::string>{MmCase(2, 2, 2).Key(), MmCase(0, 5, 3).Key()}));
  EXPECT_FALSE(r->FindCases({.source = "elsewhere"}).has_value());
  auto all = r->FindCases({});
  ASSERT_TRUE(all.has_value());
  for (const StoredCase& c : *all) {
    EXPECT_EQ(c.opinfo_samples, c.key == MmCase(0, 5, 3).Key() ? 2 : 1) << c.key;
  }
  // Cases only an OpInfo sample makes are not orphans.
  EXPECT_EQ(*r->PruneOrphanCases(), 0);

  // Storing the pair again replaces its samples; a skipped pair keeps a reason.
  calls.pop_back();
  ASSERT_TRUE(r->StoreOpInfo(&rec, calls).ok());
  EXPECT_EQ(CountRows(*r, "opinfo_samples"), 2);
  OpInfoImportRecord skipped{.opinfo = "bitwise_and", .variant = "", .dtype = "f32", .status = "skipped",
                             .reason = "bitwise_and does not support f32 on CPU"};
  ASSERT_TRUE(r->StoreOpInfo(&skipped, {}).ok());
  auto imports = r->ListOpInfoImports();
  ASSERT_TRUE(imports.has_value());
  ASSERT_EQ(imports->size(), 2u);
  EXPECT_EQ((*imports)[0].opinfo, "bitwise_and");
  EXPECT_EQ((*imports)[0].reason, "bitwise_and does not support f32 on CPU");
  EXPECT_EQ((*imports)[1].calls, 2);
  OpInfoImportRecord bad = rec;
  bad.status = "maybe";
  EXPECT_FALSE(r->StoreOpInfo(&bad, {}).ok());
  EXPECT_EQ(*r->DistinctOps(), (std::vector<std::string>{"aten::mm"}));
}

HubModelRecord Hub(std::string id, int64_t downloads, std::string sha = "abc") {
  HubModelRecord m;
  m.id = std::move(id);
  m.downloads = downloads;
  m.sha = std::move(sha);
  m.model_type = "llama";
  return m;
}

TEST(Registry, ACrawlPageAndItsCursorAreStoredTogether) {
  TempDir dir;
  auto r = OpenFresh(dir);
  const std::string crawl = "http://hub/api/models?limit=2";
  ASSERT_TRUE(r->StartCrawl(crawl).ok());
  EXPECT_EQ((*r->GetCrawl(crawl))->next_url, crawl);
  ASSERT_TRUE(r->StoreCrawlPage(crawl, {Hub("a/x", 10), Hub("a/y", 5)}, {{"{\"id\":\"../x\"}", "bad id"}},
                                std::string("http://hub/next1")).ok());
  auto state = *r->GetCrawl(crawl);
  EXPECT_EQ(state->next_url, "http://hub/next1");
  EXPECT_EQ(state->pages, 1);
  EXPECT_EQ(state->models, 2);
  EXPECT_EQ(state->rejects, 1);
  // The same model on a later page updates its row instead of adding one.
  ASSERT_TRUE(r->StoreCrawlPage(crawl, {Hub("a/x", 11)}, {}, std::nullopt).ok());
  EXPECT_EQ(CountRows(*r, "models"), 2);
  EXPECT_FALSE((*r->GetCrawl(crawl))->next_url.has_value());
  EXPECT_EQ(*r->ModelsWithoutConfig(0), (std::vector<std::string>{"a/x", "a/y"}));  // by downloads
  // A page of an unknown crawl is refused and nothing of it is kept.
  Status s = r->StoreCrawlPage("http://hub/other", {Hub("b/z", 1)}, {}, std::nullopt);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(CountRows(*r, "models"), 2);
}

TEST(Registry, ConfigsAreKeptUntilTheModelChanges) {
  TempDir dir;
  auto r = OpenFresh(dir);
  const std::string crawl = "c";
  ASSERT_TRUE(r->StartCrawl(crawl).ok());
  ASSERT_TRUE(r->StoreCrawlPage(crawl, {Hub("a/x", 10, "sha1"), Hub("a/y", 5, "sha1")}, {}, std::nullopt).ok());
  ASSERT_TRUE(r->StoreConfig("a/x", "fetched", "", "{\"model_type\": \"llama\"}").ok());
  ASSERT_TRUE(r->StoreConfig("a/y", "gated", "401 GatedRepo", "").ok());
  EXPECT_TRUE(r->ModelsWithoutConfig(0)->empty());
  EXPECT_FALSE(r->StoreConfig("a/none", "fetched", "", "{}").ok());
  EXPECT_FALSE(r->StoreConfig("a/x", "maybe", "", "").ok());
  // A re-crawl with the same commit keeps the config; a new commit refetches.
  ASSERT_TRUE(r->StartCrawl(crawl).ok());
  ASSERT_TRUE(r->StoreCrawlPage(crawl, {Hub("a/x", 12, "sha1"), Hub("a/y", 6, "sha2")}, {}, std::nullopt).ok());
  EXPECT_EQ(*r->ModelsWithoutConfig(0), std::vector<std::string>{"a/y"});
  auto q = r->Query("SELECT config_json, downloads FROM models WHERE id = 'a/x'");
  EXPECT_EQ(q->rows[0][0], "{\"model_type\": \"llama\"}");
  EXPECT_EQ(q->rows[0][1], "12");
}

TEST(Registry, VersionOneDatabasesMigrateKeepingTheirData) {
  TempDir dir;
  {
    auto db = Database::Open(dir.File("r.db"));
    ASSERT_TRUE(db.has_value());
    ASSERT_TRUE((*db)->Exec(std::string(Migrations()[0].sql)).ok());
    ASSERT_TRUE((*db)->Exec("PRAGMA user_version = 1; INSERT INTO models(id, model_type) VALUES ('a/b', 'bert')").ok());
  }
  auto r = OpenFresh(dir);
  EXPECT_EQ(r->schema_version(), LatestSchemaVersion());
  auto q = r->Query("SELECT model_type, config_status FROM models WHERE id = 'a/b'");
  ASSERT_EQ(q->rows.size(), 1u);
  EXPECT_EQ(q->rows[0][0], "bert");
  EXPECT_EQ(q->rows[0][1], "");
}

// A version-7 registry with the retired builder's bookkeeping: v8 drops its
// tables and views and keeps the op cases the builder captured, with their
// provenance.
TEST(Registry, TheRetiredBuildersTablesAreDroppedAndCapturedCasesKept) {
  TempDir dir;
  {
    auto db = Database::Open(dir.File("r.db"));
    ASSERT_TRUE(db.has_value());
    ASSERT_NO_FATAL_FAILURE(MigrateTo(**db, 7));
    ASSERT_TRUE((*db)->Exec("INSERT INTO models(id, model_type) VALUES ('a/b', 'llama');"
                            "INSERT INTO builds(model_id, profile, builder_version, status) VALUES ('a/b', 'prefill', 3, 'built');"
                            "INSERT INTO captures(model_id, profile, builder_version, calls, cases) "
                            "VALUES ('a/b', 'prefill', 3, 10, 2);"
                            "INSERT INTO op_cases(case_id, key, op, overload, case_json, case_version, dtypes, summary) "
                            "VALUES (1, 'k1', 'aten::mm', '', '{}', 1, ' f32 ', 'mm');"
                            "INSERT INTO case_sources(case_id, model_id, module_path, call_site, profile, depth, "
                            "call_count) VALUES (1, 'a/b', 'layers.0', '', 'prefill', 0, 1)")
                    .ok());
  }
  auto r = OpenFresh(dir);
  EXPECT_EQ(r->schema_version(), LatestSchemaVersion());
  auto q = r->Query(
      "SELECT name FROM sqlite_master WHERE name IN ('builds', 'captures', 'v_build_coverage', 'v_build_failures')");
  ASSERT_TRUE(q.has_value());
  EXPECT_TRUE(q->rows.empty()) << q->rows.size() << " of the builder's tables or views are left";
  EXPECT_EQ(CountRows(*r, "op_cases"), 1);
  EXPECT_EQ(CountRows(*r, "case_sources"), 1);
  EXPECT_EQ(CountRows(*r, "models"), 1);
}

// A version-10 registry ordered its runs by their start, stored to the
// second: v11 numbers them by start, then by the order of their rows, and a
// run inserted after takes the next number whatever its start says.
TEST(Registry, RunsOfVersionTenAreNumberedInTheOrderTheyWereRecorded) {
  TempDir dir;
  {
    auto db = Database::Open(dir.File("r.db"));
    ASSERT_TRUE(db.has_value());
    ASSERT_NO_FATAL_FAILURE(MigrateTo(**db, 10));
    ASSERT_TRUE((*db)->Exec("INSERT INTO runs(run_id, stage, backend, started_at) VALUES "
                            "('late', 'unit', 'sim', '2026-12-06T21:10:00Z'), "
                            "('b', 'unit', 'sim', '2026-12-06T21:09:59Z'), ('a', 'unit', 'sim', '2026-12-06T21:09:59Z')")
                    .ok());
  }
  auto r = OpenFresh(dir);
  ASSERT_TRUE(r->CreateOrResumeRun({.run_id = "new", .stage = "unit", .backend = "sim",
                                    .started_at = "2026-12-06T21:09:58.500Z"},
                                   nullptr));
  auto q = r->Query("SELECT run_id, seq FROM runs ORDER BY seq");
  ASSERT_TRUE(q.has_value());
  ASSERT_EQ(q->rows.size(), 4u);
  EXPECT_EQ(q->rows[0], (std::vector<std::string>{"b", "1"}));
  EXPECT_EQ(q->rows[1], (std::vector<std::string>{"a", "2"}));
  EXPECT_EQ(q->rows[2], (std::vector<std::string>{"late", "3"}));
  EXPECT_EQ(q->rows[3], (std::vector<std::string>{"new", "4"}));
  auto before = r->FinishedRunsBefore("unit", "new");
  ASSERT_TRUE(before.has_value());
  EXPECT_TRUE(before->empty()) << "none of them is finished";
}

class RegistryQuery : public ::testing::Test {
 protected:
  void SetUp() override {
    r_ = OpenFresh(dir_);
    Add(MmCase(512, 2048, 5632), "meta/llama", "prefill", 2.0 * 512 * 2048 * 5632);
    Add(MmCase(8, 2048, 5632, DType::kBFloat16), "meta/llama", "decode", 2.0 * 8 * 2048 * 5632);
    Add(MmCase(1, 4096, 4096), "qwen/qwen", "decode", 2.0 * 4096 * 4096);
    Add(AddCase({1, 512, 4096}), "qwen/qwen", "prefill", 512 * 4096);
  }
  void Add(const OpCase& c, const std::string& model, const std::string& profile, double flops) {
    int64_t id = *r_->UpsertCase(c, {flops, 0});
    ASSERT_TRUE(r_->AddCaseSource(id, {model, "m", "", profile, 0, 1}).ok());
  }
  size_t Count(CaseFilter f) {
    auto cases = r_->FindCases(f);
    EXPECT_TRUE(cases.has_value()) << cases.error().ToString();
    return cases ? cases->size() : 0;
  }
  TempDir dir_;
  std::unique_ptr<Registry> r_;
};

TEST_F(RegistryQuery, FiltersByOpModelDtypeProfileAndFlops) {
  EXPECT_EQ(Count({}), 4u);
  EXPECT_EQ(Count({.ops = {"mm"}}), 3u);
  EXPECT_EQ(Count({.ops = {"aten::add.Tensor"}}), 1u);
  EXPECT_EQ(Count({.ops = {"mm", "add"}}), 4u);
  EXPECT_EQ(Count({.model = "meta/*"}), 2u);
  EXPECT_EQ(Count({.dtype = "bf16"}), 1u);
  EXPECT_EQ(Count({.profile = "decode"}), 2u);
  EXPECT_EQ(Count({.max_flops = 1e9}), 3u);  // all but the 11.8 GFLOP prefill mm
  EXPECT_EQ(Count({.min_flops = 1e9}), 1u);
  EXPECT_EQ(Count({.limit = 1}), 1u);
}

TEST_F(RegistryQuery, DimensionPredicatesSelectByShape) {
  auto count_dims = [&](std::vector<std::string> texts) {
    CaseFilter f;
    for (const auto& t : texts) {
      auto p = ParseDimPredicate(t);
      EXPECT_TRUE(p.has_value()) << t;
      f.dims.push_back(*p);
    }
    return Count(f);
  };
  EXPECT_EQ(count_dims({"self[-1]>=4096"}), 2u);    // mm 1x4096 and add [..,4096]
  EXPECT_EQ(count_dims({"mat2[1]==5632"}), 2u);
  EXPECT_EQ(count_dims({"*[0]==1"}), 2u);           // any tensor with leading 1
  EXPECT_EQ(count_dims({"self.rank==3"}), 1u);
  EXPECT_EQ(count_dims({"self[0]<100", "mat2[1]!=4096"}), 1u);
}

TEST(DimPredicate, BadPredicatesAreExplained) {
  for (const char* bad : {"self[1]>>3", "self[x]==1", "[0]==1", "self==3", "self[0]==abc", "self[0"}) {
    auto p = ParseDimPredicate(bad);
    ASSERT_FALSE(p.has_value()) << bad;
    EXPECT_EQ(p.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(p.error().message().find(bad), std::string::npos) << p.error().message();
  }
}

TEST(Registry, RunsResumeWithTheSameStageOnly) {
  TempDir dir;
  auto r = OpenFresh(dir);
  RunRecord run{.run_id = "r1", .stage = "unit", .backend = "cpu", .started_at = "2026-11-30T00:00:00Z"};
  bool resumed = true;
  ASSERT_TRUE(r->CreateOrResumeRun(run, &resumed).has_value());
  EXPECT_FALSE(resumed);
  ASSERT_TRUE(r->CreateOrResumeRun(run, &resumed).has_value());
  EXPECT_TRUE(resumed);
  run.backend = "cuda";
  auto clash = r->CreateOrResumeRun(run, &resumed);
  ASSERT_FALSE(clash.has_value());
  EXPECT_NE(clash.error().message().find("r1"), std::string::npos);
}

// A lease per run, or per shard: a live holder keeps it, a dead one loses it
// to the next taker, and only the holder renews or gives it back.
TEST(Registry, RunLeasesGoToOneLiveHolderAndAreTakenOverFromDeadOnes) {
  TempDir dir;
  auto r = OpenFresh(dir);
  RunRecord run{.run_id = "r1", .stage = "unit", .backend = "cpu", .started_at = "2026-11-30T00:00:00Z"};
  ASSERT_TRUE(r->CreateOrResumeRun(run, nullptr).has_value());
  auto lease = [](int index, int count, int64_t pid) {
    return RunLease{.run_id = "r1", .shard_index = index, .shard_count = count, .host = "h", .pid = pid,
                    .process_start = 7};
  };
  std::set<int64_t> live = {100, 200};
  auto is_live = [&](const RunLease& l) { return live.count(l.pid) > 0; };
  std::vector<RunLease> gone;

  auto first = r->AcquireRunLease(lease(0, 0, 100), is_live, &gone);
  ASSERT_TRUE(first.has_value()) << first.error().ToString();
  EXPECT_FALSE(first->has_value()) << "the first taker gets the lease";
  auto second = r->AcquireRunLease(lease(0, 0, 200), is_live, &gone);
  ASSERT_TRUE(second.has_value());
  ASSERT_TRUE(second->has_value()) << "a live holder keeps it";
  EXPECT_EQ((*second)->pid, 100);
  EXPECT_EQ((*second)->host, "h");
  EXPECT_FALSE((*second)->acquired_at.empty());
  EXPECT_LE((*second)->age_seconds, 5);
  EXPECT_TRUE(gone.empty());
  EXPECT_EQ(CountRows(*r, "run_leases"), 1) << "a refused taker writes nothing";
  // A shard overlaps the whole run.
  ASSERT_TRUE(r->AcquireRunLease(lease(0, 2, 200), is_live, &gone)->has_value());

  live.erase(100);  // the holder died
  auto taken = r->AcquireRunLease(lease(0, 2, 200), is_live, &gone);
  ASSERT_TRUE(taken.has_value());
  EXPECT_FALSE(taken->has_value());
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].pid, 100);
  EXPECT_EQ(gone[0].shard_count, 0);
  // The dead holder can neither renew nor give back the new holder's lease.
  Status renew = r->RenewRunLease(lease(0, 0, 100));
  ASSERT_FALSE(renew.ok());
  EXPECT_NE(renew.message().find("run 'r1' was taken over by another process"), std::string::npos) << renew.message();
  ASSERT_TRUE(r->ReleaseRunLease(lease(0, 0, 100)).ok());
  EXPECT_EQ(CountRows(*r, "run_leases"), 1);
  EXPECT_TRUE(r->RenewRunLease(lease(0, 2, 200)).ok());

  // Shards of one split are separate writers; another split or the same
  // index is not.
  live.insert(300);
  EXPECT_FALSE(r->AcquireRunLease(lease(1, 2, 300), is_live, &gone)->has_value());
  EXPECT_TRUE(r->AcquireRunLease(lease(1, 3, 300), is_live, &gone)->has_value());
  EXPECT_TRUE(r->AcquireRunLease(lease(0, 2, 300), is_live, &gone)->has_value());
  EXPECT_TRUE(r->AcquireRunLease(lease(0, 0, 300), is_live, &gone)->has_value());
  EXPECT_EQ(CountRows(*r, "run_leases"), 2);

  ASSERT_TRUE(r->ReleaseRunLease(lease(0, 2, 200)).ok());
  ASSERT_TRUE(r->ReleaseRunLease(lease(1, 2, 300)).ok());
  EXPECT_EQ(CountRows(*r, "run_leases"), 0);
  EXPECT_TRUE(r->ReleaseRunLease(lease(1, 2, 300)).ok()) << "giving back twice is no error";
}

TEST(Registry, RecordingAResultTwiceReplacesIt) {
  TempDir dir;
  auto r = OpenFresh(dir);
  int64_t id = *r->UpsertCase(MmCase(2, 2, 2), {});
  RunRecord run{.run_id = "r1", .stage = "unit", .backend = "cpu", .started_at = "t"};
  ASSERT_TRUE(r->CreateOrResumeRun(run, nullptr).has_value());
  CaseResult res{.outcome = Outcome::kError, .error = "first"};
  ASSERT_TRUE(r->RecordResult("r1", id, res).ok());
  res.outcome = Outcome::kMismatch;
  res.max_abs_err = 0.25;
  res.counters = {{"compiles", 2}};
  res.attempts = 2;
  res.attempt_outcomes = {Outcome::kMismatch, Outcome::kMismatch};
  res.timing.backend_us = 12.5;
  res.detail_json = R"({"golden":false,"outputs":[]})";
  ASSERT_TRUE(r->RecordResult("r1", id, res).ok());
  auto results = r->ResultsForRun("r1");
  ASSERT_EQ(results->size(), 1u);
  // The record comes back as it went in (Note [Stored results]).
  const CaseResult& back = (*results)[0].result;
  EXPECT_EQ((*results)[0].case_id, id);
  EXPECT_EQ(back.outcome, Outcome::kMismatch);
  EXPECT_DOUBLE_EQ(*back.max_abs_err, 0.25);
  EXPECT_EQ(back.counters, res.counters);
  EXPECT_EQ(back.attempt_outcomes, res.attempt_outcomes);
  EXPECT_DOUBLE_EQ(back.timing.backend_us, 12.5);
  EXPECT_EQ(back.detail_json, res.detail_json);
  auto stored = r->Query("SELECT detail_json, counters_json, attempt_outcomes FROM results");
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(stored->rows[0][0], R"({"timing":{"materialize_us":0.0,"golden_us":0.0,"reference_us":0.0,"backend_us":12.5,)"
                                R"("compare_us":0.0,"total_us":0.0},"replay":{"golden":false,"outputs":[]}})");
  EXPECT_EQ(stored->rows[0][1], R"({"compiles":2})");
  EXPECT_EQ(stored->rows[0][2], "mismatch,mismatch");
  EXPECT_EQ(*r->FinishedCaseIds("r1"), std::unordered_set<int64_t>{id});
}

// The typed reads reports use: outcomes parsed once, a run's overview with
// its result count, baseline candidates newest first, and an outcome no
// build knows is a Corruption naming the database, table, run and row.
TEST(Registry, TypedReadsForReportsParseOutcomesAndNameCorruptRows) {
  TempDir dir;
  auto r = OpenFresh(dir);
  int64_t id = *r->UpsertCase(MmCase(2, 2, 2), {});
  ASSERT_TRUE(r->AddCaseSource(id, {"org/model", "m", "", "prefill", 0, 1}).ok());
  for (const char* run_id : {"r1", "r2"}) {
    RunRecord run{.run_id = run_id, .stage = "unit", .backend = "cpu", .started_at = run_id};
    ASSERT_TRUE(r->CreateOrResumeRun(run, nullptr).has_value());
    ASSERT_TRUE(r->RecordResult(run_id, id, CaseResult{.outcome = Outcome::kMismatch, .max_abs_err = 0.5})
                    .ok());
    ASSERT_TRUE(r->FinishRun(run_id, std::string(run_id) + "z").ok());
  }
  auto overview = r->GetRunOverview("r2");
  ASSERT_TRUE(overview.has_value() && overview->has_value());
  EXPECT_EQ((*overview)->unit_results, 1);
  EXPECT_EQ((*overview)->shard_count, 0);
  EXPECT_FALSE(r->GetRunOverview("nope")->has_value());
  auto before = r->FinishedRunsBefore("unit", "r2");
  ASSERT_TRUE(before.has_value());
  ASSERT_EQ(before->size(), 1u);
  EXPECT_EQ((*before)[0].run.run_id, "r1");
  auto cases = r->CaseResultsForRun("r2");
  ASSERT_TRUE(cases.has_value());
  ASSERT_EQ(cases->size(), 1u);
  EXPECT_EQ((*cases)[0].op, "aten::mm");
  EXPECT_EQ((*cases)[0].result.outcome, Outcome::kMismatch);
  EXPECT_DOUBLE_EQ(*(*cases)[0].result.max_abs_err, 0.5);
  auto models = r->CaseModelsOfRuns("r2", "");
  ASSERT_TRUE(models.has_value());
  ASSERT_EQ(models->size(), 1u);
  EXPECT_EQ((*models)[0].model_id, "org/model");

  EXPECT_EQ(**r->LatestRunId(), "r2");
  const std::string key = (*cases)[0].key;
  auto sources = r->SourcesOfCase(key, 10);
  ASSERT_TRUE(sources.has_value());
  ASSERT_EQ(sources->size(), 1u);
  EXPECT_EQ((*sources)[0].profile, "prefill");
  auto history = r->ResultsOfCase(key, 1);
  ASSERT_TRUE(history.has_value());
  ASSERT_EQ(history->size(), 1u) << "at most the limit";
  EXPECT_EQ((*history)[0].run_id, "r2");
  EXPECT_EQ((*history)[0].outcome, Outcome::kMismatch);

  ASSERT_TRUE(r->Query("UPDATE results SET outcome = 'exploded' WHERE run_id = 'r2'").has_value());
  auto bad = r->CaseResultsForRun("r2");
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code(), StatusCode::kCorruption);
  const std::string msg = bad.error().message();
  for (const std::string& part : {dir.File("r.db"), std::string("results of run 'r2'"),
                                 "case " + std::to_string(id), std::string("unknown outcome 'exploded'")}) {
    EXPECT_NE(msg.find(part), std::string::npos) << part << " not in: " << msg;
  }
}

TEST(Registry, ViewsAnswerTheCommonQuestions) {
  TempDir dir;
  auto r = OpenFresh(dir);
  int64_t mm = *r->UpsertCase(MmCase(2, 2, 2), {});
  int64_t mm2 = *r->UpsertCase(MmCase(2, 2, 3), {});
  int64_t add = *r->UpsertCase(AddCase({2}), {});
  for (int64_t id : {mm, mm2, add}) ASSERT_TRUE(r->AddCaseSource(id, {"m/a", "x", "", "p", 0, 1}).ok());
  ASSERT_TRUE(r->CreateOrResumeRun({.run_id = "r", .stage = "unit", .backend = "cpu", .started_at = "t"}, nullptr));
  ASSERT_TRUE(r->RecordResult("r", mm, CaseResult{.outcome = Outcome::kMismatch}).ok());
  ASSERT_TRUE(r->RecordResult("r", mm2, CaseResult{.outcome = Outcome::kMismatch}).ok());
  ASSERT_TRUE(r->RecordResult("r", add, CaseResult{.outcome = Outcome::kPass}).ok());
  auto per_op = r->Query("SELECT op, cases, models FROM v_cases_per_op ORDER BY op");
  ASSERT_EQ(per_op->rows.size(), 2u);
  EXPECT_EQ(per_op->rows[1], (std::vector<std::string>{"aten::mm", "2", "1"}));
  auto failures = r->Query("SELECT op, outcome, cases FROM v_failures_per_op WHERE run_id = 'r'");
  ASSERT_EQ(failures->rows.size(), 1u);
  EXPECT_EQ(failures->rows[0], (std::vector<std::string>{"aten::mm", "mismatch", "2"}));
  auto summary = r->Query("SELECT outcome, cases FROM v_run_summary WHERE run_id = 'r' ORDER BY outcome");
  EXPECT_EQ(summary->rows.size(), 2u);
  auto per_model = r->Query("SELECT model_id, failing_cases FROM v_failures_per_model WHERE run_id = 'r'");
  EXPECT_EQ(per_model->rows[0], (std::vector<std::string>{"m/a", "2"}));
}

TEST(Registry, ForeignKeysRejectResultsForUnknownRuns) {
  TempDir dir;
  auto r = OpenFresh(dir);
  int64_t id = *r->UpsertCase(MmCase(2, 2, 2), {});
  Status s = r->RecordResult("no-such-run", id, CaseResult{.outcome = Outcome::kPass});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("FOREIGN KEY"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace coverage::registry
