// BuildReport over hand-built registries: baselines, every Change of op cases
// and model items (Note [Run diffs] in reports/build.cc), expectations, root
// cause and blockers, stage summaries and the stage x family matrix. Also
// Expectations::FromJson and its matching.
#include <algorithm>
#include <chrono>
#include <map>
#include <sstream>
#include <tuple>
#include <memory>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "registry/registry.h"
#include "reports/escape.h"
#include "reports/report.h"
#include "reports/repro.h"
#include "tests/support/case_builder.h"
#include "tests/support/temp_dir.h"

namespace coverage::reports {
namespace {

using registry::ModelResultRecord;
using registry::Registry;
using testing::AddCase;
using testing::BoolArg;
using testing::DoubleArg;
using testing::MakeCase;
using testing::NoneArg;
using testing::TensorArg;
using testing::MmCase;
using testing::TempDir;

constexpr const char* kReplay = R"({"replay":{"golden":"auto","seed":0}})";
constexpr const char* kChecks = R"({"checks":{"golden":"auto","seed":0,"lr":0.001}})";

// Numbers of a result, all optional.
struct Numbers {
  std::optional<double> err, warm, spread, first, fastest;
};

class ReportBuild : public ::testing::Test {
 protected:
  void SetUp() override {
    auto r = Registry::Open(dir_.File("registry.db"));
    ASSERT_TRUE(r) << r.error().ToString();
    reg_ = std::move(*r);
  }

  void Model(const std::string& id, const std::string& type) {
    ASSERT_TRUE(reg_->UpsertModel({id, type, "test", ""}).ok());
  }
  // Stores the case with provenance from `models`; returns its case id.
  int64_t Case(const OpCase& c, const std::vector<std::string>& models = {}) {
    auto id = reg_->UpsertCase(c, {});
    EXPECT_TRUE(id) << id.error().ToString();
    for (const auto& m : models) {
      registry::CaseSource s;
      s.model_id = m;
      s.module_path = "layers.0";
      s.profile = "prefill";
      EXPECT_TRUE(reg_->AddCaseSource(*id, s).ok());
    }
    keys_[*id] = c.Key();
    return *id;
  }
  void Run(const std::string& id, const std::string& stage, const std::string& started, bool finished = true,
           const std::string& backend = "sim", const std::string& config = "") {
    registry::RunRecord run;
    run.run_id = id;
    run.stage = stage;
    run.backend = backend;
    run.started_at = started;
    run.config_json = !config.empty() ? config : stage == "unit" ? kReplay : kChecks;
    bool resumed = false;
    ASSERT_TRUE(reg_->CreateOrResumeRun(run, &resumed));
    if (finished) {
      ASSERT_TRUE(reg_->FinishRun(id, started + "+1h").ok());
    }
  }
  void Record(const std::string& run, int64_t case_id, Outcome outcome, Numbers n = {}, const std::string& error = "") {
    CaseResult r;
    r.outcome = outcome;
    r.error = error;
    r.max_abs_err = n.err;
    r.warm_us = n.warm;
    r.warm_spread_us = n.spread;
    r.first_call_us = n.first;
    r.warm_min_us = n.fastest;
    ASSERT_TRUE(reg_->RecordResult(run, case_id, r).ok());
  }
  // Items of one (run, model, stage): {item, outcome, max_abs_err}.
  void Stage(const std::string& run, const std::string& model, const std::string& stage,
             const std::vector<std::tuple<std::string, Outcome, std::optional<double>>>& items,
             const std::string& family = "decoder") {
    std::vector<ModelResultRecord> records;
    for (const auto& [item, outcome, err] : items) {
      ModelResultRecord r;
      r.run_id = run;
      r.model_id = model;
      r.profile = "prefill";
      r.stage = stage;
      r.result.item = item;
      r.result.outcome = outcome;
      r.family = family;
      r.result.max_abs_err = err;
      records.push_back(r);
    }
    ASSERT_TRUE(reg_->RecordModelStage(run, model, "prefill", stage, records).ok());
  }

  Report Build(ReportOptions options) {
    auto report = BuildReport(*reg_, options);
    EXPECT_TRUE(report) << report.error().ToString();
    return report ? *report : Report();
  }
  Report Build(const std::vector<std::string>& runs) {
    ReportOptions o;
    o.run_ids = runs;
    o.registry_path = "/data/my registry.db";
    return Build(o);
  }
  const CaseEntry& Entry(const Report& report, int64_t case_id) {
    for (const auto& c : report.cases) {
      if (c.key == keys_.at(case_id)) return c;
    }
    ADD_FAILURE() << "no case " << case_id << " in the report";
    static const CaseEntry kNone;
    return kNone;
  }
  static const ModelEntry& ModelOf(const Report& report, const std::string& id) {
    for (const auto& m : report.models) {
      if (m.model_id == id) return m;
    }
    ADD_FAILURE() << "no model " << id << " in the report";
    static const ModelEntry kNone;
    return kNone;
  }
  static const ModelItemEntry& ItemOf(const Report& report, const std::string& model, const std::string& stage,
                                      const std::string& item) {
    for (const auto& i : ModelOf(report, model).items) {
      if (i.Record().stage == stage && i.Record().result.item == item) return i;
    }
    ADD_FAILURE() << "no item " << stage << ":" << item << " of " << model;
    static const ModelItemEntry kNone;
    return kNone;
  }
  static bool HasWarning(const Report& report, const std::string& part) {
    return std::any_of(report.warnings.begin(), report.warnings.end(),
                       [&](const std::string& w) { return w.find(part) != std::string::npos; });
  }

  TempDir dir_;
  std::unique_ptr<Registry> reg_;
  std::map<int64_t, std::string> keys_;
};

TEST_F(ReportBuild, EveryChangeOfAnOpCase) {
  const int64_t new_failure = Case(MmCase(1, 8, 8)), fixed = Case(MmCase(2, 8, 8)), still = Case(MmCase(3, 8, 8));
  const int64_t new_case = Case(MmCase(4, 8, 8)), removed = Case(MmCase(5, 8, 8)), drift = Case(MmCase(6, 8, 8));
  const int64_t slower = Case(MmCase(7, 8, 8)), faster = Case(MmCase(8, 8, 8)), compile = Case(MmCase(9, 8, 8));
  const int64_t same = Case(MmCase(10, 8, 8)), both = Case(MmCase(11, 8, 8));
  Run("base", "unit", "2026-01-01T00:00:00Z");
  Run("now", "unit", "2026-01-02T00:00:00Z");
  Record("base", new_failure, Outcome::kPass);
  Record("now", new_failure, Outcome::kMismatch, {.err = 0.5}, "max abs error 0.5 > 1e-5");
  Record("base", fixed, Outcome::kCrash);
  Record("now", fixed, Outcome::kPass);
  Record("base", still, Outcome::kMismatch);
  Record("now", still, Outcome::kCrash);
  Record("now", new_case, Outcome::kPass);
  Record("base", removed, Outcome::kPass);
  Record("base", drift, Outcome::kPass, {.err = 1e-5});
  Record("now", drift, Outcome::kPass, {.err = 1e-3});
  Record("base", slower, Outcome::kPass, {.warm = 100, .spread = 2});
  Record("now", slower, Outcome::kPass, {.warm = 150, .spread = 2});
  Record("base", faster, Outcome::kPass, {.warm = 100, .spread = 2});
  Record("now", faster, Outcome::kPass, {.warm = 50, .spread = 2});
  Record("base", compile, Outcome::kPass, {.warm = 100, .first = 2000});
  Record("now", compile, Outcome::kPass, {.warm = 100, .first = 10100});
  Record("base", same, Outcome::kPass, {.err = 1e-6, .warm = 100, .spread = 2, .first = 900});
  Record("now", same, Outcome::kPass, {.err = 2e-6, .warm = 103, .spread = 2, .first = 1000});
  Record("base", both, Outcome::kPass, {.err = 1e-5, .warm = 100, .spread = 2});
  Record("now", both, Outcome::kPass, {.err = 1e-3, .warm = 150, .spread = 2});

  const Report r = Build({"now"});
  ASSERT_EQ(r.baselines.size(), 1u);
  EXPECT_EQ(r.baselines[0].run_id, "base");
  EXPECT_EQ(Entry(r, new_failure).change, Change::kNewFailure);
  EXPECT_EQ(Entry(r, new_failure).change_detail, "pass -> mismatch");
  EXPECT_EQ(Entry(r, fixed).change, Change::kFixed);
  EXPECT_EQ(Entry(r, still).change, Change::kStillFailing);
  EXPECT_EQ(Entry(r, still).change_detail, "mismatch -> crash");
  EXPECT_EQ(Entry(r, new_case).change, Change::kNewCase);
  EXPECT_EQ(Entry(r, removed).change, Change::kRemoved);
  EXPECT_EQ(Entry(r, removed).run_id, "");
  EXPECT_FALSE(Entry(r, removed).result.has_value());
  EXPECT_EQ(OutcomeOf(Entry(r, removed).baseline), Outcome::kPass);
  EXPECT_EQ(Entry(r, drift).change, Change::kDrift);
  EXPECT_EQ(Entry(r, drift).change_detail, "max abs error 1.0e-05 -> 1.0e-03 (100x)");
  EXPECT_EQ(Entry(r, slower).change, Change::kPerfRegression);
  EXPECT_EQ(Entry(r, slower).change_detail, "warm 100.0 us -> 150.0 us (+50.0 us, +50%)");
  EXPECT_EQ(Entry(r, faster).change, Change::kPerfImprovement);
  EXPECT_EQ(Entry(r, compile).change, Change::kCompileChange);
  EXPECT_EQ(Entry(r, compile).change_detail, "first-call overhead 1900 us -> 10000 us (5.26x)");
  EXPECT_EQ(Entry(r, same).change, Change::kUnchanged);
  EXPECT_EQ(Entry(r, both).change, Change::kDrift);
  EXPECT_EQ(Entry(r, both).extra_changes, std::vector<std::string>{"perf_regression"});
  EXPECT_NE(Entry(r, both).change_detail.find("warm 100.0 us -> 150.0 us"), std::string::npos);
  ASSERT_TRUE(Entry(r, slower).baseline.has_value());
  EXPECT_EQ(Entry(r, slower).baseline->warm_us, 100);

  EXPECT_EQ(r.CountOf(Change::kNewFailure), 1);
  EXPECT_EQ(r.CountOf(Change::kDrift), 2);
  EXPECT_EQ(r.CountOf(Change::kRemoved), 1);
  EXPECT_EQ(r.CountOf(Change::kNoBaseline), 0);
  EXPECT_TRUE(r.Regressed());
  // Regressions first (new failures, drift, perf), the rest by op and key.
  EXPECT_EQ(r.cases[0].change, Change::kNewFailure);
  EXPECT_EQ(r.cases[1].change, Change::kDrift);
  EXPECT_EQ(r.cases[2].change, Change::kDrift);
  EXPECT_EQ(r.cases[3].change, Change::kPerfRegression);
  EXPECT_TRUE(std::is_sorted(r.cases.begin() + 4, r.cases.end(),
                             [](const CaseEntry& a, const CaseEntry& b) { return a.key < b.key; }));
}

// Note [Fastest calls]: measured relu timings of a nightly under two busy
// loops. A baseline disturbed in one or two of its three calls hid a +100 ms
// regression when medians were compared against the larger spread; the
// fastest calls show it, and a run disturbed only now is no change.
TEST_F(ReportBuild, PerformanceIsJudgedOnTheFastestCallsSoOneDisturbedRunHidesNothing) {
  const int64_t one = Case(MmCase(1, 8, 8)), two = Case(MmCase(2, 8, 8)), disturbed_now = Case(MmCase(3, 8, 8)),
                faster = Case(MmCase(4, 8, 8)), old = Case(MmCase(5, 8, 8));
  Run("base", "unit", "2026-01-01T00:00:00Z");
  Run("now", "unit", "2026-01-02T00:00:00Z");
  // Calls [19, 20, 91000] and [3090, 51812, 51812] us; now [100000, 100010, 100020].
  Record("base", one, Outcome::kPass, {.warm = 20, .spread = 90981, .fastest = 19});
  Record("now", one, Outcome::kPass, {.warm = 100010, .spread = 20, .fastest = 100000});
  Record("base", two, Outcome::kPass, {.warm = 51812, .spread = 48722, .fastest = 3090});
  Record("now", two, Outcome::kPass, {.warm = 100010, .spread = 20, .fastest = 100000});
  // [100, 101, 102] then [101, 5000, 9000]: the kernel did not change.
  Record("base", disturbed_now, Outcome::kPass, {.warm = 101, .spread = 2, .fastest = 100});
  Record("now", disturbed_now, Outcome::kPass, {.warm = 5000, .spread = 8899, .fastest = 101});
  Record("base", faster, Outcome::kPass, {.warm = 1010, .spread = 20, .fastest = 1000});
  Record("now", faster, Outcome::kPass, {.warm = 9000, .spread = 8600, .fastest = 500});
  // Stored before the fastest call was: medians against the larger spread.
  Record("base", old, Outcome::kPass, {.warm = 20, .spread = 90981});
  Record("now", old, Outcome::kPass, {.warm = 100010, .spread = 20, .fastest = 100000});
  const Report r = Build({"now"});
  EXPECT_EQ(Entry(r, one).change, Change::kPerfRegression);
  EXPECT_EQ(Entry(r, one).change_detail, "fastest warm call 19.0 us -> 100000.0 us (+99981.0 us, +526216%)");
  EXPECT_EQ(Entry(r, two).change, Change::kPerfRegression);
  EXPECT_EQ(Entry(r, disturbed_now).change, Change::kUnchanged);
  EXPECT_EQ(Entry(r, faster).change, Change::kPerfImprovement);
  EXPECT_EQ(Entry(r, old).change, Change::kUnchanged) << Entry(r, old).change_detail;
  ASSERT_TRUE(Entry(r, one).baseline.has_value());
  EXPECT_EQ(Entry(r, one).baseline->warm_min_us, 19);

  const auto base = WarmTimingOf(20.0, 19.0, 90981.0);
  ASSERT_TRUE(base.has_value());
  EXPECT_DOUBLE_EQ(base->fastest_us, 19);
  EXPECT_DOUBLE_EQ(base->noise_us, 1);
  EXPECT_FALSE(WarmTimingOf(std::nullopt, 19.0, 1.0).has_value());
}

TEST_F(ReportBuild, SmallChangesAreNotReported) {
  const int64_t tiny_errors = Case(MmCase(1, 8, 8)), noisy = Case(MmCase(2, 8, 8)), fast = Case(MmCase(3, 8, 8));
  Run("base", "unit", "2026-01-01T00:00:00Z");
  Run("now", "unit", "2026-01-02T00:00:00Z");
  // 100x more error but under the 1e-6 floor; 50 us slower within 3 spreads of 20 us; 4 us slower on a 10 us op.
  Record("base", tiny_errors, Outcome::kPass, {.err = 1e-9});
  Record("now", tiny_errors, Outcome::kPass, {.err = 1e-7});
  Record("base", noisy, Outcome::kPass, {.warm = 100, .spread = 20});
  Record("now", noisy, Outcome::kPass, {.warm = 150, .spread = 5});
  Record("base", fast, Outcome::kPass, {.warm = 10, .spread = 0});
  Record("now", fast, Outcome::kPass, {.warm = 14, .spread = 0});
  const Report r = Build({"now"});
  EXPECT_EQ(Entry(r, tiny_errors).change, Change::kUnchanged);
  EXPECT_EQ(Entry(r, noisy).change, Change::kUnchanged);
  EXPECT_EQ(Entry(r, fast).change, Change::kUnchanged);
  EXPECT_FALSE(r.Regressed());
}

TEST_F(ReportBuild, CaseCarriesItsOpDtypesProvenanceAndRepro) {
  Model("org/llama-b", "llama");
  Model("org/llama-a", "llama");
  Model("org/bert", "bert");
  const int64_t add = Case(AddCase({2, 3}), {"org/llama-b", "org/bert", "org/llama-a"});
  Run("now", "unit", "2026-01-02T00:00:00Z");
  Record("now", add, Outcome::kPass, {.err = 0.0});
  const Report r = Build({"now"});
  const CaseEntry& c = Entry(r, add);
  EXPECT_EQ(c.op, "aten::add.Tensor");
  EXPECT_EQ(c.dtypes, "f32");
  EXPECT_EQ(c.summary, AddCase({2, 3}).Summary());
  EXPECT_EQ(c.models, (std::vector<std::string>{"org/bert", "org/llama-a", "org/llama-b"}));
  EXPECT_EQ(c.families, (std::vector<std::string>{"bert", "llama"}));
  EXPECT_EQ(c.repro, "coverage --registry '/data/my registry.db' repro " + c.key);
  EXPECT_EQ(c.run_id, "now");
}

// A run id no CLI would take (a registry written by other tools, or before
// run ids were checked) and a registry path full of shell and markup
// characters: every writer escapes them, and the printed repro command, run
// by a shell, gives back exactly the path and key.
TEST_F(ReportBuild, HostileRunIdsAndPrintedCommandsAreEscapedInEveryWriter) {
  const std::string run = "<script>alert('run')</script> & \"q\"";
  const std::string path = "/tmp/it's \"a\" <b>&amp; $(touch pwned) `x`/r.db";
  const int64_t mm = Case(MmCase(1, 8, 8));
  Run("base", "unit", "2026-01-01T00:00:00Z");
  Record("base", mm, Outcome::kPass, {.err = 0.0});
  Run(run, "unit", "2026-01-02T00:00:00Z");
  Record(run, mm, Outcome::kMismatch, {.err = 0.5}, "max abs error </script><script>alert(1)</script>");
  ReportOptions o;
  o.run_ids = {run};
  o.baseline_run_ids = {"base"};
  o.registry_path = path;
  const Report r = Build(o);
  const CaseEntry& c = Entry(r, mm);
  ASSERT_EQ(c.run_id, run);

  // The command a user pastes: a shell gives back the path and key as words.
  std::string shell = c.repro;
  ASSERT_EQ(shell.rfind("coverage ", 0), 0u) << shell;
  shell.replace(0, 8, "printf '%s\\n'");
  FILE* pipe = popen(shell.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string words;
  char buf[256];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) words.append(buf, n);
  ASSERT_EQ(pclose(pipe), 0);
  EXPECT_EQ(words, "--registry\n" + path + "\nrepro\n" + c.key + "\n");

  const nlohmann::json j = nlohmann::json::parse(ReportToJson(r));
  EXPECT_EQ(j["registry"], path);
  EXPECT_EQ(j["runs"][0]["run_id"], run);
  ASSERT_EQ(j["regressions"].size(), 1u);
  EXPECT_EQ(j["regressions"][0]["run_id"], run);
  EXPECT_EQ(j["regressions"][0]["repro"], c.repro);

  const std::string xml = ReportToJUnit(r);
  EXPECT_EQ(xml.find("<script"), std::string::npos);
  EXPECT_EQ(xml.find("<b>"), std::string::npos);
  EXPECT_NE(xml.find(EscapeXml(c.repro)), std::string::npos) << "the repro command, escaped";

  const std::string html = ReportToHtml(r);
  EXPECT_EQ(html.find("<script>alert('run')"), std::string::npos);
  EXPECT_EQ(html.find("<b>&amp;"), std::string::npos);
  EXPECT_EQ(html.find("</script><script>alert(1)"), std::string::npos);
  EXPECT_NE(html.find(EscapeHtml(run)), std::string::npos) << "the run id is shown, escaped";
  EXPECT_NE(html.find(EscapeHtml(c.repro)), std::string::npos) << "the repro command is shown, escaped";
  // Only the report's own two script elements: the data and the code.
  size_t scripts = 0;
  for (size_t at = html.find("<script"); at != std::string::npos; at = html.find("<script", at + 1)) ++scripts;
  EXPECT_EQ(scripts, 2u);
}

TEST_F(ReportBuild, NoBaselineIsAWarningAndNoBaselineEverywhere) {
  const int64_t mm = Case(MmCase(1, 8, 8));
  Run("now", "unit", "2026-01-02T00:00:00Z");
  Record("now", mm, Outcome::kMismatch);
  const Report r = Build({"now"});
  EXPECT_TRUE(r.baselines.empty());
  EXPECT_EQ(Entry(r, mm).change, Change::kNoBaseline);
  EXPECT_TRUE(HasWarning(r, "no baseline for run now")) << ::testing::PrintToString(r.warnings);
  EXPECT_FALSE(r.Regressed());
  EXPECT_EQ(r.title, "coverage: sim now");
}

TEST_F(ReportBuild, FoundBaselineIsTheLastFinishedRunJudgedTheSameWay) {
  const int64_t mm = Case(MmCase(1, 8, 8));
  Run("older", "unit", "2026-01-01T00:00:00Z");
  Run("right", "unit", "2026-01-02T00:00:00Z");
  Run("unfinished", "unit", "2026-01-03T00:00:00Z", /*finished=*/false);
  Run("cpu", "unit", "2026-01-04T00:00:00Z", true, "cpu");
  Run("other-seed", "unit", "2026-01-05T00:00:00Z", true, "sim", R"({"replay":{"golden":"auto","seed":7}})");
  Run("module-run", "module", "2026-01-06T00:00:00Z");
  Run("now", "unit", "2026-01-07T00:00:00Z");
  Run("later", "unit", "2026-01-09T00:00:00Z");  // recorded after the reported run
  for (const char* run : {"older", "right", "unfinished", "cpu", "other-seed", "later", "now"}) {
    Record(run, mm, Outcome::kPass);
  }
  const Report r = Build({"now"});
  ASSERT_EQ(r.baselines.size(), 1u);
  EXPECT_EQ(r.baselines[0].run_id, "right");
  EXPECT_EQ(Entry(r, mm).change, Change::kUnchanged);
  EXPECT_EQ(Entry(r, mm).baseline_run_id, "right");
}

// Two nightlies started within one second (here: one millisecond) order as
// they were recorded (Note [Run order]): the second's baseline is the first,
// and the first has none. Run ids are chosen so that their own order would
// pick the wrong one. A clock set back between two runs changes nothing.
TEST_F(ReportBuild, TwoRunsStartedInTheSameSecondOrderAsTheyWereRecorded) {
  const int64_t mm = Case(MmCase(1, 8, 8));
  for (const std::string started : {"2026-01-02T00:00:00Z", "2026-01-03T00:00:00.250Z"}) {
    const std::string first = "z-first" + started, second = "a-second" + started;
    Run(first, "unit", started);
    Run(second, "unit", started);
    Record(first, mm, Outcome::kPass);
    Record(second, mm, Outcome::kMismatch);
    const Report r = Build({second});
    ASSERT_EQ(r.baselines.size(), 1u) << started << ": " << ::testing::PrintToString(r.warnings);
    EXPECT_EQ(r.baselines[0].run_id, first);
    EXPECT_EQ(Entry(r, mm).change, Change::kNewFailure);
    EXPECT_TRUE(r.Regressed());
  }
  const Report r = Build({"z-first2026-01-02T00:00:00Z"});
  EXPECT_TRUE(r.baselines.empty()) << "a run recorded later in the same second is no baseline of an earlier one";

  Run("clock-set-back", "unit", "2025-12-31T23:59:59.000Z");
  Record("clock-set-back", mm, Outcome::kPass);
  const Report back = Build({"clock-set-back"});
  ASSERT_EQ(back.baselines.size(), 1u);
  EXPECT_EQ(back.baselines[0].run_id, "a-second2026-01-03T00:00:00.250Z");
}

TEST_F(ReportBuild, NoBaselineWhenEveryEarlierRunWasJudgedDifferently) {
  const int64_t mm = Case(MmCase(1, 8, 8));
  Run("other-seed", "unit", "2026-01-01T00:00:00Z", true, "sim", R"({"replay":{"golden":"auto","seed":7}})");
  Run("now", "unit", "2026-01-02T00:00:00Z");
  Record("other-seed", mm, Outcome::kPass);
  Record("now", mm, Outcome::kPass);
  const Report r = Build({"now"});
  EXPECT_TRUE(r.baselines.empty());
  EXPECT_TRUE(HasWarning(r, "judged with other options")) << ::testing::PrintToString(r.warnings);
}

TEST_F(ReportBuild, ARunOfOtherCasesIsNoBaselineButOneOnAnotherShardOrPathIs) {
  const int64_t mm = Case(MmCase(1, 8, 8));
  const std::string full = R"({"replay":{"golden":"auto","seed":0},"filters":{"cases":[]},"tolerances":"/a/t.json"})";
  Run("nightly-1", "unit", "2026-01-01T00:00:00Z", true, "sim", full);
  // `coverage repro`'s replay of one case, after the nightly: not comparable.
  Run("repro", "unit", "2026-01-02T00:00:00Z", true, "sim",
      R"({"replay":{"golden":"auto","seed":0},"filters":{"cases":["abc"]},"tolerances":"/a/t.json"})");
  // Another checkout path and isolation mode: still the same run.
  Run("nightly-2", "unit", "2026-01-03T00:00:00Z", true, "sim",
      R"({"replay":{"golden":"auto","seed":0},"filters":{"cases":[]},"tolerances":"/b/t.json","isolation":"none"})");
  for (const char* run : {"nightly-1", "repro", "nightly-2"}) Record(run, mm, Outcome::kPass);
  const Report r = Build({"nightly-2"});
  ASSERT_EQ(r.baselines.size(), 1u);
  EXPECT_EQ(r.baselines[0].run_id, "nightly-1");
}

TEST_F(ReportBuild, TheExpectationListingTheOutcomeWinsOverAnEarlierOne) {
  const int64_t mm = Case(MmCase(1, 8, 8));
  Run("now", "unit", "2026-01-02T00:00:00Z");
  Record("now", mm, Outcome::kCrash);
  auto e = Expectations::FromJson(
      R"({"backend": "sim", "expected_failures": [
           {"op": "aten::mm", "outcomes": ["mismatch"], "reason": "bf16"},
           {"op": "aten::mm", "outcomes": ["crash"], "reason": "known crash"}]})",
      "e.json");
  ASSERT_TRUE(e.has_value()) << e.error().ToString();
  ReportOptions o;
  o.run_ids = {"now"};
  o.expectations = *e;
  auto r = BuildReport(*reg_, o);
  ASSERT_TRUE(r.has_value()) << r.error().ToString();
  EXPECT_EQ(Entry(*r, mm).verdict, Outcome::kExpectedFailure);
  EXPECT_EQ(Entry(*r, mm).expectation, "known crash");
}

TEST_F(ReportBuild, ExplicitBaselineIsUsedWhateverItsOptions) {
  const int64_t mm = Case(MmCase(1, 8, 8));
  Run("chosen", "unit", "2026-01-01T00:00:00Z", true, "cpu");
  Run("found", "unit", "2026-01-02T00:00:00Z");
  Run("models", "module,model", "2026-01-02T00:00:00Z");
  Run("now", "unit", "2026-01-03T00:00:00Z");
  Record("chosen", mm, Outcome::kMismatch);
  Record("found", mm, Outcome::kPass);
  Record("now", mm, Outcome::kPass);
  ReportOptions o;
  o.run_ids = {"now"};
  o.baseline_run_ids = {"models", "chosen"};
  const Report r = Build(o);
  ASSERT_EQ(r.baselines.size(), 1u);
  EXPECT_EQ(r.baselines[0].run_id, "chosen");
  EXPECT_EQ(Entry(r, mm).change, Change::kFixed);
  EXPECT_TRUE(HasWarning(r, "baseline models (stage module,model) matches no reported run"));
}

TEST_F(ReportBuild, UnknownRunIsNotFound) {
  ReportOptions o;
  o.run_ids = {"nope"};
  auto r = BuildReport(*reg_, o);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), StatusCode::kNotFound);
  EXPECT_FALSE(BuildReport(*reg_, ReportOptions{}));
}

TEST_F(ReportBuild, ShardedRunThatIsNotFinishedIsSaid) {
  const int64_t mm = Case(MmCase(1, 8, 8));
  Run("now", "unit", "2026-01-02T00:00:00Z", /*finished=*/false);
  ASSERT_TRUE(reg_->StartShard("now", 0, 2, "a", "2026-01-02T00:00:00Z").ok());
  ASSERT_TRUE(reg_->StartShard("now", 1, 2, "b", "2026-01-02T00:00:00Z").ok());
  ASSERT_TRUE(reg_->FinishShard("now", 0, 2, "2026-01-02T01:00:00Z").ok());
  Record("now", mm, Outcome::kPass);
  const Report r = Build({"now"});
  ASSERT_EQ(r.runs.size(), 1u);
  EXPECT_EQ(r.runs[0].shards, "1 of 2 shards finished");
  EXPECT_EQ(r.runs[0].results, 1);
  EXPECT_TRUE(HasWarning(r, "run now is not finished (1 of 2 shards finished)"));
}

Expectations Parse(const std::string& json) {
  auto e = Expectations::FromJson(json, "sim.json");
  EXPECT_TRUE(e) << e.error().ToString();
  return e ? *e : Expectations();
}

TEST_F(ReportBuild, ExpectedFailureIsNotARegressionButAnotherOutcomeIs) {
  const int64_t expected = Case(MmCase(1, 8, 8)), other_outcome = Case(MmCase(2, 8, 8));
  const int64_t starts_passing = Case(MmCase(3, 8, 8)), bf16 = Case(MmCase(4, 8, 8, DType::kBFloat16));
  Run("base", "unit", "2026-01-01T00:00:00Z");
  Run("now", "unit", "2026-01-02T00:00:00Z");
  Record("base", expected, Outcome::kPass);
  Record("now", expected, Outcome::kMismatch);
  Record("base", other_outcome, Outcome::kPass);
  Record("now", other_outcome, Outcome::kCrash);
  Record("base", starts_passing, Outcome::kMismatch);
  Record("now", starts_passing, Outcome::kPass);
  Record("base", bf16, Outcome::kPass);
  Record("now", bf16, Outcome::kPass);
  ReportOptions o;
  o.run_ids = {"now"};
  o.expectations = Parse(R"({"backend": "sim", "expected_failures": [
      {"op": "aten::mm", "dtype": "f32", "outcomes": ["mismatch"], "reason": "bf16 matmul numerics"},
      {"op": "aten::conv2d", "reason": "not implemented"}]})");
  const Report r = Build(o);
  EXPECT_EQ(Entry(r, expected).verdict, Outcome::kExpectedFailure);
  EXPECT_EQ(Entry(r, expected).expectation, "bf16 matmul numerics");
  EXPECT_EQ(Entry(r, expected).change, Change::kUnchanged);
  EXPECT_EQ(Entry(r, other_outcome).verdict, Outcome::kCrash);
  EXPECT_EQ(Entry(r, other_outcome).change, Change::kNewFailure);
  EXPECT_EQ(Entry(r, starts_passing).verdict, Outcome::kUnexpectedPass);
  EXPECT_EQ(Entry(r, starts_passing).change, Change::kUnchanged);
  EXPECT_EQ(Entry(r, bf16).verdict, Outcome::kPass);
  EXPECT_EQ(r.CountOf(Change::kNewFailure), 1);
  EXPECT_TRUE(HasWarning(r, "expectation 1 of sim.json (not implemented) matched no result"));
  EXPECT_FALSE(HasWarning(r, "expectation 0"));
}

TEST_F(ReportBuild, ExpectedFailureAloneDoesNotRegress) {
  const int64_t mm = Case(MmCase(1, 8, 8));
  Run("base", "unit", "2026-01-01T00:00:00Z");
  Run("now", "unit", "2026-01-02T00:00:00Z");
  Record("base", mm, Outcome::kPass);
  Record("now", mm, Outcome::kMismatch);
  ReportOptions o;
  o.run_ids = {"now"};
  o.expectations = Parse(R"({"expected_failures": [{"key": ")" + keys_[mm] + R"(", "reason": "known"}]})");
  EXPECT_FALSE(Build(o).Regressed());
  o.expectations = {};
  EXPECT_TRUE(Build(o).Regressed());
}

TEST_F(ReportBuild, EveryChangeOfAModelItem) {
  Run("base", "module,model", "2026-01-01T00:00:00Z");
  Run("now", "module,model", "2026-01-02T00:00:00Z");
  Stage("base", "org/a", "module",
        {{"attention", Outcome::kPass, 1e-5}, {"mlp", Outcome::kMismatch, 0.1}, {"norm", Outcome::kCrash, {}},
         {"embedding", Outcome::kPass, 1e-5}, {"rope", Outcome::kPass, 1e-5}, {"gone", Outcome::kPass, 0.0}});
  Stage("now", "org/a", "module",
        {{"attention", Outcome::kMismatch, 0.2}, {"mlp", Outcome::kPass, 1e-6}, {"norm", Outcome::kError, {}},
         {"embedding", Outcome::kPass, 1e-2}, {"rope", Outcome::kPass, 1e-5}, {"new", Outcome::kPass, 0.0}});
  Stage("base", "org/b", "model", {{"forward", Outcome::kPass, 1e-4}}, "encoder");
  const Report r = Build({"now"});
  EXPECT_EQ(ItemOf(r, "org/a", "module", "attention").change, Change::kNewFailure);
  EXPECT_EQ(ItemOf(r, "org/a", "module", "mlp").change, Change::kFixed);
  EXPECT_EQ(ItemOf(r, "org/a", "module", "norm").change, Change::kStillFailing);
  EXPECT_EQ(ItemOf(r, "org/a", "module", "norm").change_detail, "crash -> error");
  EXPECT_EQ(ItemOf(r, "org/a", "module", "embedding").change, Change::kDrift);
  EXPECT_EQ(ItemOf(r, "org/a", "module", "rope").change, Change::kUnchanged);
  EXPECT_EQ(ItemOf(r, "org/a", "module", "new").change, Change::kNewCase);
  EXPECT_EQ(ItemOf(r, "org/a", "module", "gone").change, Change::kRemoved);
  EXPECT_EQ(ItemOf(r, "org/b", "model", "forward").change, Change::kRemoved);
  EXPECT_EQ(OutcomeOf(ItemOf(r, "org/a", "module", "attention").baseline), Outcome::kPass);
  EXPECT_FALSE(ItemOf(r, "org/a", "module", "gone").result.has_value());
  EXPECT_EQ(ItemOf(r, "org/a", "module", "gone").Record().run_id, "base");
  const ModelEntry& a = ModelOf(r, "org/a");
  EXPECT_TRUE(a.failing);
  EXPECT_EQ(a.family, "decoder");
  EXPECT_EQ(a.stage_verdict.at("module"), Outcome::kMismatch);  // the first failing item
  EXPECT_EQ(r.models.front().model_id, "org/a");        // failing first
  EXPECT_EQ(r.CountOf(Change::kRemoved), 2);
  EXPECT_TRUE(r.Regressed());
}

TEST_F(ReportBuild, ModelItemExpectationsUseTheModelGlob) {
  Run("now", "train", "2026-01-02T00:00:00Z");
  Stage("now", "Qwen/Qwen3-0.6B", "train", {{"train", Outcome::kNonFiniteMismatch, {}}});
  Stage("now", "org/other", "train", {{"train", Outcome::kNonFiniteMismatch, {}}});
  ReportOptions o;
  o.run_ids = {"now"};
  o.expectations = Parse(R"({"expected_failures": [{"stage": "train", "model": "Qwen/*", "reason": "bf16 loss"}]})");
  const Report r = Build(o);
  EXPECT_EQ(ItemOf(r, "Qwen/Qwen3-0.6B", "train", "train").verdict, Outcome::kExpectedFailure);
  EXPECT_EQ(ModelOf(r, "Qwen/Qwen3-0.6B").stage_verdict.at("train"), Outcome::kExpectedFailure);
  EXPECT_FALSE(ModelOf(r, "Qwen/Qwen3-0.6B").failing);
  EXPECT_EQ(ItemOf(r, "org/other", "train", "train").verdict, Outcome::kNonFiniteMismatch);
  EXPECT_TRUE(ModelOf(r, "org/other").failing);
}

TEST_F(ReportBuild, StageVerdictIsFirstFailureElseSkippedElsePass) {
  Run("now", "module", "2026-01-02T00:00:00Z");
  Stage("now", "org/skips", "module", {{"attention", Outcome::kPass, 0.0}, {"mlp", Outcome::kSkipped, {}}});
  Stage("now", "org/fails", "module",
        {{"attention", Outcome::kPass, 0.0}, {"mlp", Outcome::kTimeout, {}}, {"norm", Outcome::kMismatch, 1.0},
         {"rope", Outcome::kSkipped, {}}});
  Stage("now", "org/passes", "module", {{"attention", Outcome::kPass, 0.0}});
  const Report r = Build({"now"});
  EXPECT_EQ(ModelOf(r, "org/skips").stage_verdict.at("module"), Outcome::kSkipped);
  EXPECT_EQ(ModelOf(r, "org/fails").stage_verdict.at("module"), Outcome::kTimeout);
  EXPECT_EQ(ModelOf(r, "org/passes").stage_verdict.at("module"), Outcome::kPass);
}

// A blocker is a failing op case that failing models' items located as
// their first wrong call; a failing case that only occurs in a failing model
// (only_a) is among its root causes, not its blockers.
TEST_F(ReportBuild, RootCauseAndBlockersRankedByFailingModels) {
  for (const char* m : {"org/a", "org/b", "org/ok"}) Model(m, "llama");
  const int64_t shared = Case(MmCase(1, 8, 8), {"org/a", "org/b"});
  const int64_t only_a = Case(AddCase({4}), {"org/a"});
  const int64_t only_ok = Case(MmCase(2, 8, 8), {"org/ok"});
  const int64_t passes = Case(MmCase(3, 8, 8), {"org/a", "org/b"});
  Run("unit", "unit", "2026-01-02T00:00:00Z");
  Run("models", "model", "2026-01-02T00:00:00Z");
  Record("unit", shared, Outcome::kMismatch);
  Record("unit", only_a, Outcome::kCrash);
  Record("unit", only_ok, Outcome::kMismatch);
  Record("unit", passes, Outcome::kPass);
  auto located = [&](const std::string& model, int64_t case_id) {
    registry::ModelResultRecord rec;
    rec.family = "decoder";
    rec.result.item = "forward";
    rec.result.outcome = Outcome::kMismatch;
    rec.result.max_abs_err = 1.0;
    rec.result.detail = {{"first_divergent", {{"call", 7}, {"op", "aten::mm"}, {"case_key", keys_[case_id]}}}};
    ASSERT_TRUE(reg_->RecordModelStage("models", model, "prefill", "model", {rec}).ok());
  };
  located("org/a", shared);
  located("org/b", shared);
  Stage("models", "org/ok", "model", {{"forward", Outcome::kPass, 0.0}});
  const Report r = Build({"unit", "models"});
  ASSERT_EQ(r.blockers.size(), 1u);
  EXPECT_EQ(r.blockers[0].key, keys_[shared]);
  EXPECT_EQ(r.blockers[0].models, (std::vector<std::string>{"org/a", "org/b"}));
  EXPECT_EQ(r.blockers[0].op, "aten::mm");
  EXPECT_EQ(r.blockers[0].verdict, Outcome::kMismatch);
  std::vector<std::string> a_causes = {keys_[shared], keys_[only_a]};
  std::sort(a_causes.begin(), a_causes.end());
  EXPECT_EQ(ModelOf(r, "org/a").failing_cases, a_causes);
  EXPECT_EQ(ModelOf(r, "org/b").failing_cases, std::vector<std::string>{keys_[shared]});
  EXPECT_TRUE(ModelOf(r, "org/ok").failing_cases.empty());
}

TEST_F(ReportBuild, StageSummariesAndFamilyMatrix) {
  Model("org/llama", "llama");
  Model("org/bert", "bert");
  const int64_t both = Case(MmCase(1, 8, 8), {"org/llama", "org/bert"});
  const int64_t llama_only = Case(MmCase(2, 8, 8), {"org/llama"});
  const int64_t skipped = Case(MmCase(3, 8, 8), {"org/bert"});
  const int64_t orphan = Case(MmCase(4, 8, 8));
  Run("unit", "unit", "2026-01-02T00:00:00Z");
  Run("models", "module,train", "2026-01-02T00:00:00Z");
  Record("unit", both, Outcome::kPass);
  Record("unit", llama_only, Outcome::kMismatch);
  Record("unit", skipped, Outcome::kSkipped);
  Record("unit", orphan, Outcome::kPass);
  Stage("models", "org/llama", "module", {{"attention", Outcome::kPass, 0.0}}, "decoder");
  Stage("models", "org/llama", "train", {{"train", Outcome::kCrash, {}}}, "decoder");
  Stage("models", "org/bert", "module", {{"attention", Outcome::kPass, 0.0}}, "encoder");
  const Report r = Build({"unit", "models"});
  ASSERT_EQ(r.stages.size(), 3u);
  EXPECT_EQ(r.stages[0].stage, "unit");
  EXPECT_EQ(r.stages[0].total, 4);
  EXPECT_EQ(r.stages[0].verdicts.at(Outcome::kPass), 2);
  EXPECT_EQ(r.stages[0].verdicts.at(Outcome::kMismatch), 1);
  EXPECT_EQ(r.stages[0].verdicts.at(Outcome::kSkipped), 1);
  EXPECT_DOUBLE_EQ(r.stages[0].pass_rate, 2.0 / 3.0);
  EXPECT_EQ(r.stages[1].stage, "module");
  EXPECT_EQ(r.stages[1].total, 2);
  EXPECT_DOUBLE_EQ(r.stages[1].pass_rate, 1.0);
  EXPECT_EQ(r.stages[2].stage, "train");
  EXPECT_DOUBLE_EQ(r.stages[2].pass_rate, 0.0);

  using Cell = std::pair<int64_t, int64_t>;
  EXPECT_EQ(r.matrix.at("llama").at("unit"), Cell(1, 2));
  EXPECT_EQ(r.matrix.at("bert").at("unit"), Cell(1, 1));  // the skipped case is not judged
  EXPECT_EQ(r.matrix.at("unknown").at("unit"), Cell(1, 1));
  // A model is one row across stages: its model type, as for its op cases.
  EXPECT_EQ(r.matrix.at("llama").at("module"), Cell(1, 1));
  EXPECT_EQ(r.matrix.at("llama").at("train"), Cell(0, 1));
  EXPECT_EQ(r.matrix.at("bert").at("module"), Cell(1, 1));
  EXPECT_EQ(r.matrix.count("decoder"), 0u);
}

TEST_F(ReportBuild, AModelWithoutAKnownTypeIsInItsBuilderFamilysRow) {
  Run("models", "module", "2026-01-02T00:00:00Z");
  Stage("models", "org/unlisted", "module", {{"attention", Outcome::kPass, 0.0}}, "decoder");
  const Report r = Build({"models"});
  EXPECT_EQ(r.matrix.at("decoder").at("module"), (std::pair<int64_t, int64_t>(1, 1)));
}

TEST_F(ReportBuild, ThousandsOfCasesBuildQuickly) {
  Model("org/m", "llama");
  Run("base", "unit", "2026-01-01T00:00:00Z");
  Run("now", "unit", "2026-01-02T00:00:00Z");
  std::vector<int64_t> ids;
  ASSERT_TRUE(reg_->Begin().ok());
  for (int i = 1; i <= 3000; ++i) ids.push_back(Case(MmCase(i, 4, 4), {"org/m"}));
  ASSERT_TRUE(reg_->Commit().ok());
  for (int64_t id : ids) {  // RecordResult commits each result itself
    Record("base", id, Outcome::kPass, {.err = 1e-6, .warm = 10});
    Record("now", id, id % 100 == 0 ? Outcome::kMismatch : Outcome::kPass, {.err = 1e-6, .warm = 10});
  }
  const auto start = std::chrono::steady_clock::now();
  const Report r = Build({"now"});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.cases.size(), 3000u);
  EXPECT_EQ(r.CountOf(Change::kNewFailure), 30);
  EXPECT_LT(seconds, 5.0);
}

// ---- Expectations ----------------------------------------------------------

TEST(Expectations, ParsesEntriesAndComments) {
  auto e = Expectations::FromJson(R"({"_comment": "known failures of sim", "backend": "sim", "expected_failures": [
      {"stage": "unit", "op": "aten::mm", "dtype": "f32", "outcomes": ["mismatch"], "reason": "bf16 matmul numerics"},
      {"comment": "whole family", "stage": "train", "model": "Qwen/*", "reason": "loss diverges"}]})",
                                  "configs/expectations/sim.json");
  ASSERT_TRUE(e) << e.error().ToString();
  EXPECT_EQ(e->backend, "sim");
  EXPECT_EQ(e->source, "configs/expectations/sim.json");
  ASSERT_EQ(e->entries.size(), 2u);
  EXPECT_EQ(e->entries[0].outcomes, std::vector<Outcome>{Outcome::kMismatch});
  EXPECT_EQ(e->entries[1].model, "Qwen/*");
}

// Each bad file, and the words its error must contain (source, entry and key).
struct BadExpectations {
  const char* name;
  const char* json;
  std::vector<std::string> words;
};

class ExpectationErrors : public ::testing::TestWithParam<BadExpectations> {};

TEST_P(ExpectationErrors, NameTheSourceTheEntryAndTheKey) {
  auto e = Expectations::FromJson(GetParam().json, "sim.json");
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().code(), StatusCode::kInvalidArgument);
  for (const auto& w : GetParam().words) {
    EXPECT_NE(e.error().message().find(w), std::string::npos) << e.error().message() << " lacks " << w;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Files, ExpectationErrors,
    ::testing::Values(
        BadExpectations{"UnknownKey", R"({"expected_failures": [{"op": "aten::mm", "reson": "x", "reason": "y"}]})",
                        {"sim.json", "expected_failures[0].reson", "unknown key"}},
        BadExpectations{"MissingReason", R"({"expected_failures": [{"reason": "a"}, {"op": "aten::mm"}]})",
                        {"sim.json", "expected_failures[1].reason", "missing or empty"}},
        BadExpectations{"EmptyReason", R"({"expected_failures": [{"op": "aten::mm", "reason": ""}]})",
                        {"expected_failures[0].reason"}},
        BadExpectations{"BadStage", R"({"expected_failures": [{"stage": "units", "reason": "x"}]})",
                        {"expected_failures[0].stage", "'units' is not a stage"}},
        BadExpectations{"BadOutcome", R"({"expected_failures": [{"outcomes": ["mismatch", "broken"], "reason": "x"}]})",
                        {"sim.json", "expected_failures[0].outcomes", "'broken' is not an outcome"}},
        BadExpectations{"PassIsNotAFailure", R"({"expected_failures": [{"outcomes": ["pass"], "reason": "x"}]})",
                        {"expected_failures[0].outcomes", "not a failing outcome"}},
        BadExpectations{"BadDtype", R"({"expected_failures": [{"dtype": "float", "reason": "x"}]})",
                        {"expected_failures[0].dtype"}},
        BadExpectations{"OpAndModel", R"({"expected_failures": [{"op": "aten::mm", "model": "a/*", "reason": "x"}]})",
                        {"expected_failures[0]", "one kind"}},
        BadExpectations{"NotAString", R"({"expected_failures": [{"op": 3, "reason": "x"}]})",
                        {"expected_failures[0].op", "must be a string"}},
        BadExpectations{"UnknownTopLevelKey", R"({"backend": "sim", "expected": []})", {"sim.json", "expected"}},
        BadExpectations{"NotJson", R"({"expected_failures": [)", {"sim.json", "not valid JSON", "line 1, column 24"}},
        // Found by fuzz/expectations.cc: nlohmann reports this as out_of_range, not parse_error.
        BadExpectations{"NumberBeyondADouble", R"({"expected_failures": [{"reason": 1E666}]})",
                        {"sim.json", "not valid JSON"}},
        BadExpectations{"NotAnObject", R"([1, 2])", {"sim.json", "top level"}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Expectations, OpWithoutOverloadCoversEveryOverload) {
  auto e = Expectations::FromJson(R"({"expected_failures": [
      {"op": "aten::add", "reason": "any add"}, {"op": "aten::mm.out", "reason": "only out"}]})",
                                  "x.json");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->MatchCase("aten::add.Tensor", "k", {"f32"}), &e->entries[0]);
  EXPECT_EQ(e->MatchCase("aten::add", "k", {"f32"}), &e->entries[0]);
  EXPECT_EQ(e->MatchCase("aten::addmm", "k", {"f32"}), nullptr);
  EXPECT_EQ(e->MatchCase("aten::mm.out", "k", {"f32"}), &e->entries[1]);
  EXPECT_EQ(e->MatchCase("aten::mm", "k", {"f32"}), nullptr);
}

TEST(Expectations, TheFirstEntryListingTheOutcomeElseTheFirstCoveringIt) {
  auto e = Expectations::FromJson(R"({"expected_failures": [
      {"op": "aten::mm", "outcomes": ["mismatch"], "reason": "numerics"},
      {"op": "aten::mm", "outcomes": ["crash", "timeout"], "reason": "hangs"}]})",
                                  "x.json");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->entries[1].outcomes, (std::vector<Outcome>{Outcome::kCrash, Outcome::kTimeout}));
  EXPECT_EQ(e->MatchCase("aten::mm", "k", {"f32"}, Outcome::kTimeout), &e->entries[1]);
  EXPECT_EQ(e->MatchCase("aten::mm", "k", {"f32"}, Outcome::kMismatch), &e->entries[0]);
  EXPECT_EQ(e->MatchCase("aten::mm", "k", {"f32"}, Outcome::kError), &e->entries[0]);
  EXPECT_EQ(e->MatchCase("aten::mm", "k", {"f32"}), &e->entries[0]);
}

TEST(Expectations, DtypeKeyAndStageNarrowAMatch) {
  auto e = Expectations::FromJson(R"({"expected_failures": [
      {"dtype": "bf16", "reason": "bf16"}, {"key": "abc", "reason": "one case"},
      {"stage": "module", "item": "attention", "reason": "attention"}]})",
                                  "x.json");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->MatchCase("aten::mm", "k", {"f32", "bf16"}), &e->entries[0]);
  EXPECT_EQ(e->MatchCase("aten::mm", "abc", {"f32"}), &e->entries[1]);
  EXPECT_EQ(e->MatchCase("aten::mm", "k", {"f32"}), nullptr);
  EXPECT_EQ(e->MatchModelItem("module", "org/a", "attention"), &e->entries[2]);
  EXPECT_EQ(e->MatchModelItem("model", "org/a", "attention"), nullptr);
  EXPECT_EQ(e->MatchModelItem("module", "org/a", "mlp"), nullptr);  // unit entries never match items
}

// The repro script draws what replay draws: GPT-2's token ids, recorded in
// [1, 32768), index a table of 50,257 rows and take the whole of it.
TEST(Repro, AnIndexTakesTheWholeDimensionItIndexesAsInReplay) {
  ValueDomain ids;
  ids.kind = ValueDomain::Kind::kInteger;
  ids.lo = 1;
  ids.hi = 32768;
  const OpCase c = MakeCase("aten::embedding", "",
                            {TensorArg("weight", DType::kFloat32, {50257, 8}),
                             TensorArg("indices", testing::Spec(DType::kInt64, {1, 4}, ids)),
                             testing::IntArg("padding_idx", -1), BoolArg("scale_grad_by_freq", false),
                             BoolArg("sparse", false)});
  const std::string script = PythonRepro(c, 0, ReproTarget{});
  EXPECT_NE(script.find("Input([1, 4], [4, 1], 0, torch.int64, 'integer', 0, 50257)"), std::string::npos) << script;
  EXPECT_EQ(script.find("'integer', 1, 32768"), std::string::npos) << script;
}

// The repro of a case of coverage::scaled_dot_product_attention_backward,
// an op of this project (replay/composites.cc) that PyTorch does not have,
// runs with PyTorch alone.
TEST(Repro, AnOpOfThisProjectRunsInThePythonRepro) {
  const std::string python = std::string(COVERAGE_SOURCE_DIR) + "/.venv/bin/python";
  if (!std::filesystem::exists(python)) GTEST_SKIP() << "no project venv at " << python << " (scripts/setup.sh)";
  OpCase c = MakeCase("coverage::scaled_dot_product_attention_backward", "",
                      {TensorArg("grad_out", DType::kFloat32, {1, 4, 6, 8}), TensorArg("query", DType::kFloat32, {1, 4, 6, 8}),
                       TensorArg("key", DType::kFloat32, {1, 2, 6, 8}), TensorArg("value", DType::kFloat32, {1, 2, 6, 8}),
                       NoneArg("attn_mask"), DoubleArg("dropout_p", 0.0), BoolArg("is_causal", true), NoneArg("scale"),
                       BoolArg("enable_gqa", true)});
  Argument mask;
  mask.name = "output_mask";
  mask.kind = Argument::Kind::kBoolList;
  mask.bools = {true, true, true, false};
  c.args.push_back(mask);
  TempDir dir;
  const std::string script = dir.File("repro.py");
  std::ofstream(script) << PythonRepro(c, 0, ReproTarget{});
  const std::string out = dir.File("out.txt");
  const std::string command = "'" + python + "' '" + script + "' > '" + out + "' 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << std::ifstream(out).rdbuf();
  std::stringstream printed;
  printed << std::ifstream(out).rdbuf();
  // The gradients of query, key and value; none for the mask.
  EXPECT_NE(printed.str().find("output 0: shape (1, 4, 6, 8)"), std::string::npos) << printed.str();
  EXPECT_NE(printed.str().find("output 2: shape (1, 2, 6, 8)"), std::string::npos) << printed.str();
  EXPECT_EQ(printed.str().find("output 3"), std::string::npos) << printed.str();
}

}  // namespace
}  // namespace coverage::reports
