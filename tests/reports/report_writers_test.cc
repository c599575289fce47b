// The JSON and JUnit writers over a hand-built Report, with hostile text
// (markup, quotes, ampersands, control characters, invalid UTF-8) in every
// string that comes from the registry; and EscapeXml itself.
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/outcome.h"
#include "reports/escape.h"
#include "reports/report.h"

namespace coverage::reports {
namespace {

const std::string kHostile = "<script>alert(\"x\")</script> & 'q' \x01\x1f tab\there \xff\xfe end";

size_t Count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + part.size())) ++n;
  return n;
}

CaseEntry MakeCase(std::string key, std::optional<Outcome> outcome, std::optional<Outcome> verdict, Change change) {
  CaseEntry c;
  c.run_id = "now";
  c.key = std::move(key);
  c.op = "aten::mm";
  c.summary = "mm(f32[2,8], f32[8,8])";
  c.dtypes = "f32";
  if (outcome) {
    c.result.emplace();
    c.result->outcome = *outcome;
  }
  c.verdict = verdict;
  c.change = change;
  c.repro = "coverage repro " + c.key;
  return c;
}

Report SampleReport() {
  Report r;
  r.title = "coverage: sim now";
  r.generated_at = "2026-01-02T00:00:00Z";
  r.registry_path = "coverage.db";
  r.runs.push_back({"now", "unit", "sim", "2026-01-02T00:00:00Z", "2026-01-02T01:00:00Z", "host", "abc", "1.13.1",
                    "{}", 5, ""});
  r.baselines.push_back({"base", "unit", "sim", "2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z", "host", "abb",
                         "1.13.1", "{}", 5, ""});

  CaseEntry failing = MakeCase("k-fail", Outcome::kMismatch, Outcome::kMismatch, Change::kNewFailure);
  failing.op = "aten::<script>";
  failing.summary = kHostile;
  failing.result->error = "max abs error 0.5 > 1e-5\nsecond line";
  failing.result->max_abs_err = 0.5;
  failing.change_detail = "pass -> mismatch";
  failing.result->first_call_us = 1500;
  CaseEntry crash = MakeCase("k-crash", Outcome::kCrash, Outcome::kCrash, Change::kStillFailing);
  crash.result->error = "worker died: SIGSEGV \xc3\x28";
  CaseEntry expected = MakeCase("k-expected", Outcome::kMismatch, Outcome::kExpectedFailure, Change::kUnchanged);
  expected.expectation = "bf16 matmul numerics";
  CaseEntry skipped = MakeCase("k-skipped", Outcome::kSkipped, Outcome::kSkipped, Change::kUnchanged);
  skipped.result->error = "over the cost cap";
  CaseEntry drift = MakeCase("k-drift", Outcome::kPass, Outcome::kPass, Change::kDrift);
  drift.change_detail = "max abs error 1.0e-05 -> 1.0e-03 (100x)";
  drift.extra_changes = {"perf_regression"};
  drift.result->max_abs_err = std::numeric_limits<double>::infinity();
  CaseEntry removed = MakeCase("k-removed", std::nullopt, std::nullopt, Change::kRemoved);
  removed.run_id = "";
  r.cases = {failing, drift, crash, expected, skipped, removed};

  ModelEntry m;
  m.model_id = "org/\"evil\" & <b>";
  m.family = "decoder";
  m.stage_verdict = {{"module", Outcome::kTimeout}, {"train", Outcome::kPass}};
  m.failing = true;
  m.failing_cases = {"k-fail"};
  ModelItemEntry attention;
  registry::ModelResultRecord& record = attention.result.emplace();
  record.run_id = "models";
  record.model_id = m.model_id;
  record.stage = "module";
  record.result.item = "attention";
  record.result.outcome = Outcome::kTimeout;
  record.result.error = "ran past 60 s";
  record.result.seconds = 60;
  attention.verdict = Outcome::kTimeout;
  attention.change = Change::kNewFailure;
  attention.change_detail = "pass -> timeout";
  ModelItemEntry train = attention;
  train.result->stage = "train";
  train.result->result.item = "train";
  train.result->result.outcome = Outcome::kPass;
  train.result->result.error = "";
  train.result->result.seconds = 2;
  train.verdict = Outcome::kUnexpectedPass;
  train.expectation = "loss diverges";
  train.change = Change::kUnchanged;
  m.items = {attention, train};
  r.models = {m};

  r.blockers.push_back({"k-fail", "aten::<script>", kHostile, Outcome::kMismatch, {m.model_id}});
  r.stages.push_back({"unit",
                      {{Outcome::kMismatch, 1}, {Outcome::kCrash, 1}, {Outcome::kExpectedFailure, 1},
                       {Outcome::kSkipped, 1}, {Outcome::kPass, 1}},
                      5, 0.5});
  r.matrix["llama"]["unit"] = {3, 4};
  r.changes = {{Change::kNewFailure, 2}, {Change::kDrift, 1}, {Change::kStillFailing, 1}, {Change::kUnchanged, 3},
               {Change::kRemoved, 1}};
  r.warnings = {"no baseline for run models: none given \xff"};
  return r;
}

TEST(ReportJson, HoldsTheSummaryAndNeverThrowsOnBadUtf8) {
  const std::string text = ReportToJson(SampleReport());
  const nlohmann::json j = nlohmann::json::parse(text);  // valid JSON, bad bytes replaced
  EXPECT_EQ(j["title"], "coverage: sim now");
  EXPECT_TRUE(j["regressed"].get<bool>());
  ASSERT_EQ(j["runs"].size(), 1u);
  EXPECT_EQ(j["runs"][0]["run_id"], "now");
  EXPECT_EQ(j["runs"][0]["libtorch_version"], "1.13.1");
  EXPECT_EQ(j["baselines"][0]["run_id"], "base");
  EXPECT_EQ(j["stages"][0]["stage"], "unit");
  EXPECT_EQ(j["stages"][0]["verdicts"]["expected_failure"], 1);
  EXPECT_EQ(j["stages"][0]["pass_rate"], 0.5);
  EXPECT_EQ(j["changes"]["new_failure"], 2);
  EXPECT_EQ(j["changes"]["removed"], 1);

  ASSERT_EQ(j["regressions"].size(), 2u);  // the new failure and the drift, not the still failing crash
  EXPECT_EQ(j["regressions"][0]["key"], "k-fail");
  EXPECT_EQ(j["regressions"][0]["op"], "aten::<script>");
  EXPECT_EQ(j["regressions"][0]["change"], "new_failure");
  EXPECT_EQ(j["regressions"][0]["detail"], "pass -> mismatch");
  EXPECT_NE(j["regressions"][0]["summary"].get<std::string>().find("\xef\xbf\xbd"), std::string::npos);
  EXPECT_EQ(j["regressions"][1]["change"], "drift");
  EXPECT_EQ(j["regressions"][1]["extra_changes"][0], "perf_regression");
  EXPECT_EQ(j["regressions"][1]["max_abs_err"], "inf");
  ASSERT_EQ(j["model_regressions"].size(), 1u);
  EXPECT_EQ(j["model_regressions"][0]["item"], "attention");

  ASSERT_EQ(j["blockers"].size(), 1u);
  EXPECT_EQ(j["blockers"][0]["models"][0], "org/\"evil\" & <b>");
  ASSERT_EQ(j["models_failing"].size(), 1u);
  EXPECT_EQ(j["models_failing"][0]["stages"]["module"], "timeout");
  EXPECT_EQ(j["models_failing"][0]["failing_cases"][0], "k-fail");
  EXPECT_EQ(j["matrix"]["llama"]["unit"]["passing"], 3);
  EXPECT_EQ(j["warnings"].size(), 1u);
}

TEST(ReportJson, EmptyReportIsValid) {
  const nlohmann::json j = nlohmann::json::parse(ReportToJson(Report()));
  EXPECT_FALSE(j["regressed"].get<bool>());
  EXPECT_TRUE(j["regressions"].empty());
}

// The writers list a stage's verdicts by name (crash before pass), not in the
// enum's order.
TEST(StageSummary, VerdictsInNameOrder) {
  std::vector<std::string> names;
  for (const auto& [verdict, n] : SampleReport().stages[0].VerdictsInNameOrder()) {
    names.emplace_back(OutcomeName(verdict));
  }
  EXPECT_EQ(names, (std::vector<std::string>{"crash", "expected_failure", "mismatch", "pass", "skipped"}));
}

TEST(ReportJUnit, OneSuitePerStageWithCounts) {
  const std::string xml = ReportToJUnit(SampleReport());
  EXPECT_EQ(xml.rfind("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites ", 0), 0u) << xml;
  EXPECT_NE(xml.find("<testsuites name=\"coverage: sim now\" tests=\"7\" failures=\"1\" errors=\"2\" skipped=\"1\""),
            std::string::npos)
      << xml;
  EXPECT_NE(xml.find("<testsuite name=\"coverage.unit\" tests=\"5\" failures=\"1\" errors=\"1\" skipped=\"1\""),
            std::string::npos)
      << xml;
  EXPECT_NE(xml.find("<testsuite name=\"coverage.module\" tests=\"1\" failures=\"0\" errors=\"1\" skipped=\"0\" "
                     "time=\"60.000000\""),
            std::string::npos)
      << xml;
  EXPECT_NE(xml.find("<testsuite name=\"coverage.train\" tests=\"1\""), std::string::npos);
  EXPECT_LT(xml.find("coverage.unit"), xml.find("coverage.module"));
  EXPECT_LT(xml.find("coverage.module"), xml.find("coverage.train"));
  EXPECT_EQ(Count(xml, "<testcase "), 7u);  // the removed case is not a test
  EXPECT_EQ(Count(xml, "<testsuite "), 3u);
  EXPECT_EQ(Count(xml, "</testsuite>"), 3u);
  EXPECT_EQ(xml.find("k-removed"), std::string::npos);
  EXPECT_EQ(xml.substr(xml.size() - 14), "</testsuites>\n");
}

TEST(ReportJUnit, VerdictsBecomeFailuresErrorsSkipsAndNotes) {
  const std::string xml = ReportToJUnit(SampleReport());
  EXPECT_NE(xml.find("<failure message=\"max abs error 0.5 &gt; 1e-5\" type=\"mismatch\">"), std::string::npos) << xml;
  EXPECT_NE(xml.find("repro: coverage repro k-fail"), std::string::npos);
  EXPECT_NE(xml.find("<error message=\"worker died: SIGSEGV \xef\xbf\xbd(\" type=\"crash\">"), std::string::npos) << xml;
  EXPECT_NE(xml.find("<error message=\"ran past 60 s\" type=\"timeout\">"), std::string::npos);
  EXPECT_NE(xml.find("<skipped message=\"over the cost cap\"/>"), std::string::npos);
  EXPECT_NE(xml.find("<system-out>expected failure (mismatch): bf16 matmul numerics</system-out>"), std::string::npos);
  EXPECT_NE(xml.find("<system-out>passed, but expected to fail (loss diverges): the expectation can go</system-out>"),
            std::string::npos);
  EXPECT_NE(xml.find("name=\"train:train\""), std::string::npos);
  EXPECT_NE(xml.find("time=\"0.001500\""), std::string::npos);
}

TEST(ReportJUnit, HostileTextIsEscaped) {
  const std::string xml = ReportToJUnit(SampleReport());
  EXPECT_EQ(xml.find("<script>"), std::string::npos);
  EXPECT_EQ(xml.find("<b>"), std::string::npos);
  EXPECT_NE(xml.find("classname=\"aten::&lt;script&gt;\""), std::string::npos) << xml;
  EXPECT_NE(xml.find("classname=\"org/&quot;evil&quot; &amp; &lt;b&gt;\""), std::string::npos);
  // Control characters stay visible (\x01), a tab survives the attribute.
  EXPECT_NE(xml.find("name=\"&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &apos;q&apos; \\x01\\x1f "
                     "tab&#9;here \xef\xbf\xbd\xef\xbf\xbd end\""),
            std::string::npos)
      << xml;
  for (char c : xml) {
    const auto u = static_cast<unsigned char>(c);
    EXPECT_TRUE(u >= 0x20 || c == '\n' || c == '\t') << "control byte " << int{u};
  }
}

TEST(EscapeXml, EscapesMarkupAndQuotes) {
  EXPECT_EQ(EscapeXml("a<b>&\"c\"'d'"), "a&lt;b&gt;&amp;&quot;c&quot;&apos;d&apos;");
  EXPECT_EQ(EscapeXml("plain text"), "plain text");
  EXPECT_EQ(EscapeXml(""), "");
}

// Before, these were dropped: a NUL in a model id vanished from JUnit, and
// an attribute's newline became a space.
TEST(EscapeXml, ShowsCharactersXmlCannotHoldAndKeepsLineBreaks) {
  EXPECT_EQ(EscapeXml(std::string("a\0b\x01\x08\x0b\x0c\x1f" "c", 9)), "a\\x00b\\x01\\x08\\x0b\\x0c\\x1fc");
  EXPECT_EQ(EscapeXml("keep\ttab\nnewline"), "keep&#9;tab&#10;newline");
  EXPECT_EQ(EscapeXml("cr\r"), "cr&#13;");
  EXPECT_EQ(EscapeXml("\xef\xbf\xbe\xef\xbf\xbf"), "\\ufffe\\uffff");  // U+FFFE, U+FFFF
}

TEST(EscapeXml, ReplacesInvalidUtf8AndKeepsValid) {
  EXPECT_EQ(EscapeXml("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(EscapeXml("\xff"), "\xef\xbf\xbd");
  EXPECT_EQ(EscapeXml("\xc0\xaf"), "\xef\xbf\xbd\xef\xbf\xbd");  // overlong '/'
  EXPECT_EQ(EscapeXml("\xed\xa0\x80"), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // a surrogate
  EXPECT_EQ(EscapeXml("ab\xe2\x82"), "ab\xef\xbf\xbd\xef\xbf\xbd");             // cut short
}

}  // namespace
}  // namespace coverage::reports
