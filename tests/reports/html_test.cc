// The HTML report: hostile registry strings never reach the page raw, the
// script data parses back, nothing outside the file is referenced, the
// structure matches the golden outline, and 30,000 cases stay compact.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>

#include "reports/build_parts.h"
#include "reports/escape.h"
#include "reports/report.h"
#include "tests/reports/report_fixture.h"

namespace coverage::reports {
namespace {

using testing::kInvalidUtf8Error;
using testing::kLineSeparatorSummary;
using testing::kQuotesError;
using testing::kScriptEndError;
using testing::kScriptModelId;

size_t Occurrences(std::string_view text, std::string_view needle) {
  size_t count = 0;
  for (size_t at = text.find(needle); at != std::string_view::npos; at = text.find(needle, at + needle.size())) {
    ++count;
  }
  return count;
}

// True when `text` is well-formed UTF-8 (no stray, truncated, overlong or
// surrogate sequences).
bool IsUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    size_t n = b < 0x80 ? 1 : b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
    if (n == 0 || i + n > text.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) return false;
    }
    const auto b1 = static_cast<unsigned char>(n > 1 ? text[i + 1] : 0);
    if ((b == 0xE0 && b1 < 0xA0) || (b == 0xED && b1 > 0x9F) || (b == 0xF0 && b1 < 0x90) || (b == 0xF4 && b1 > 0x8F)) {
      return false;
    }
    i += n;
  }
  return true;
}

// The text of the <script type="application/json"> block.
std::string ScriptData(const std::string& html) {
  const std::string open = "<script type=\"application/json\" id=\"case-data\">";
  const size_t begin = html.find(open);
  if (begin == std::string::npos) return "";
  const size_t end = html.find("</script>", begin);
  return html.substr(begin + open.size(), end - begin - open.size());
}

// The report's structure as text: sections, headings, figure captions,
// charts and each table's column headings, in document order.
std::string Outline(const std::string& html) {
  static const std::regex kTag(R"(<(header|section|h1|h2|h3|table|figcaption|svg)\b([^>]*)>)");
  static const std::regex kId(R"re(\b(id|class)="([^"]*)")re");
  static const std::regex kMarkup("<[^>]*>");
  auto text_until = [&](size_t from, const std::string& tag) {
    const size_t end = html.find("</" + tag + ">", from);
    return std::regex_replace(html.substr(from, end - from), kMarkup, "");
  };
  std::ostringstream out;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), kTag); it != std::sregex_iterator(); ++it) {
    const std::string tag = (*it)[1];
    const std::string attributes = (*it)[2];
    const size_t after = static_cast<size_t>(it->position() + it->length());
    std::smatch id;
    const std::string name = std::regex_search(attributes, id, kId) ? (id[1] == "id" ? "#" : ".") + id[2].str() : "";
    if (tag == "header" || tag == "section") {
      out << tag << " " << name << "\n";
    } else if (tag == "svg") {
      out << "  svg " << name << "\n";
    } else if (tag == "table") {
      const size_t head_end = html.find("</thead>", after);
      const std::string head = html.substr(after, head_end - after);
      out << "  table " << name << ":";
      static const std::regex kTh(R"(<th\b[^>]*>(.*?)</th>)");
      for (auto th = std::sregex_iterator(head.begin(), head.end(), kTh); th != std::sregex_iterator(); ++th) {
        out << " | " << std::regex_replace((*th)[1].str(), kMarkup, "");
      }
      out << "\n";
    } else {
      out << "  " << tag << " " << text_until(after, tag) << "\n";
    }
  }
  return out.str();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(EscapeHtml, EscapesMarkupAndBothQuotes) {
  EXPECT_EQ(EscapeHtml(R"(<a href="x" title='y'>&</a>)"),
            "&lt;a href=&quot;x&quot; title=&#39;y&#39;&gt;&amp;&lt;/a&gt;");
}

TEST(EscapeHtml, KeepsWellFormedMultibyteText) {
  const std::string text =
      "Gr\xC3\xBC\xC3\x9F"
      "e \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80";
  EXPECT_EQ(EscapeHtml(text), text);
}

TEST(EscapeHtml, ReplacesBytesThatAreNotUtf8) {
  // A stray continuation byte, an invalid lead byte, a truncated sequence, an
  // overlong '/', a surrogate.
  const std::string out = EscapeHtml("a\x80 b\xff c\xe6\x97 d\xc0\xaf e\xed\xa0\x80");
  EXPECT_TRUE(IsUtf8(out)) << out;
  EXPECT_EQ(Occurrences(out, "\xEF\xBF\xBD"), 9u) << out;  // one per byte
  EXPECT_NE(out.find("a\xEF\xBF\xBD b"), std::string::npos);
}

TEST(EscapeHtml, WritesLineSeparatorsAsReferences) {
  EXPECT_EQ(EscapeHtml("a\xE2\x80\xA8"
                       "b\xE2\x80\xA9"
                       "c"),
            "a&#x2028;b&#x2029;c");
}

TEST(EscapeHtml, ReplacesControlCharactersButKeepsWhitespace) {
  EXPECT_EQ(EscapeHtml(std::string("a\0b\x1b\x7f\tc\nd\r", 10)),
            "a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD\xEF\xBF\xBD\tc\nd\r");
}

class HtmlReportTest : public ::testing::TestWithParam<const char*> {
 protected:
  Report MakeReport() const {
    return std::string(GetParam()) == "small" ? testing::SmallReport() : testing::RealisticReport();
  }
};

TEST_P(HtmlReportTest, HostileStringsNeverAppearRaw) {
  const std::string html = ReportToHtml(MakeReport());
  EXPECT_EQ(html.find(kScriptModelId), std::string::npos);
  EXPECT_EQ(html.find("<script>alert"), std::string::npos);
  EXPECT_EQ(html.find(kScriptEndError), std::string::npos);
  EXPECT_EQ(html.find(kQuotesError), std::string::npos);
  EXPECT_EQ(html.find("<b>bold</b>"), std::string::npos);
  EXPECT_EQ(html.find("\"quoted\""), std::string::npos);
  EXPECT_EQ(html.find("<!-- end"), std::string::npos);
  EXPECT_EQ(html.find("\xE2\x80\xA8"), std::string::npos);
  EXPECT_EQ(html.find("\xE2\x80\xA9"), std::string::npos);
  EXPECT_TRUE(IsUtf8(html));
  // Only the report's own two script elements: the data and the code.
  EXPECT_EQ(Occurrences(html, "<script"), 2u);
  EXPECT_EQ(Occurrences(html, "</script"), 2u);
  // Escaped, the hostile model id is still shown.
  EXPECT_NE(html.find(EscapeHtml(kScriptModelId)), std::string::npos);
}

TEST_P(HtmlReportTest, ScriptDataParsesBackToEveryCase) {
  const Report report = MakeReport();
  const std::string data = ScriptData(ReportToHtml(report));
  ASSERT_FALSE(data.empty());
  for (char c : std::string("<>&")) EXPECT_EQ(data.find(c), std::string::npos) << c;
  const nlohmann::json json = nlohmann::json::parse(data);
  ASSERT_EQ(json["cases"].size(), report.cases.size());
  std::map<std::string, size_t> field;
  for (size_t i = 0; i < json["fields"].size(); ++i) field[json["fields"][i]] = i;
  bool saw_script_end = false, saw_replacement = false, saw_separator = false;
  for (const auto& row : json["cases"]) {
    const std::string error = row[field["error"]];
    saw_script_end |= error == kScriptEndError;
    saw_replacement |= error.find("bad bytes \xEF\xBF\xBD") == 0;
    saw_separator |= row[field["summary"]] == kLineSeparatorSummary;
  }
  EXPECT_TRUE(saw_script_end);
  EXPECT_TRUE(saw_replacement);
  EXPECT_TRUE(saw_separator);
}

TEST_P(HtmlReportTest, ReferencesNothingOutsideTheFile) {
  const std::string html = ReportToHtml(MakeReport());
  for (const char* reference :
       {"http://", "https://", "//cdn", "<link", "<img", "<iframe", " src=", "url(", "@import", "@font-face"}) {
    EXPECT_EQ(html.find(reference), std::string::npos) << reference;
  }
  EXPECT_NE(html.find("default-src 'none'"), std::string::npos);
}

TEST_P(HtmlReportTest, HasNoInlineEventHandlers) {
  const std::string html = ReportToHtml(MakeReport());
  EXPECT_FALSE(std::regex_search(html, std::regex(R"(<[^>]*\son[a-z]+\s*=)", std::regex::icase)));
  EXPECT_EQ(html.find("javascript:"), std::string::npos);
}

TEST_P(HtmlReportTest, ListsEveryRegressionWithItsRepro) {
  const Report report = MakeReport();
  const std::string html = ReportToHtml(report);
  const size_t section = html.find("<section id=\"regressions\">");
  const std::string regressions = html.substr(section, html.find("</section>", section) - section);
  for (const CaseEntry& c : report.cases) {
    if (c.repro.empty()) continue;  // removed cases
    const bool regression =
        c.change == Change::kNewFailure || c.change == Change::kDrift || c.change == Change::kPerfRegression;
    EXPECT_EQ(regressions.find(EscapeHtml(c.repro)) != std::string::npos, regression) << c.key;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HtmlReportTest, ::testing::Values("small", "realistic"),
                         [](const auto& info) { return std::string(info.param); });

TEST(HtmlReport, OutlineMatchesGolden) {
  const std::string outline = Outline(ReportToHtml(testing::SmallReport()));
  const std::string golden_path = std::string(COVERAGE_SOURCE_DIR) + "/tests/reports/golden/report_outline.txt";
  const char* update = std::getenv("COVERAGE_UPDATE_GOLDEN");
  if (update != nullptr && std::string(update) == "1") {
    std::ofstream(golden_path, std::ios::binary) << outline;
    GTEST_SKIP() << "rewrote " << golden_path;
  }
  EXPECT_EQ(outline, ReadFile(golden_path))
      << "the report's structure changed; if on purpose, rerun with COVERAGE_UPDATE_GOLDEN=1 and review the diff of "
      << golden_path;
}

TEST(HtmlReport, WhatIsBrokenComesFirstGroupedByOpAndDtype) {
  const Report report = testing::SmallReport();
  // Failing now, unexpectedly: the mm mismatch (new) and the convolution
  // crash; the expected failures, passes and the removed case are not broken.
  ASSERT_EQ(report.broken_ops.size(), 2u);
  const BrokenOp* mm = nullptr;
  for (const BrokenOp& b : report.broken_ops) {
    if (b.op == "aten::mm") mm = &b;
    EXPECT_NE(b.op, "aten::addmm");
  }
  ASSERT_NE(mm, nullptr);
  EXPECT_EQ(mm->cases, 1);
  EXPECT_EQ(mm->new_failures, 1);
  ASSERT_TRUE(mm->worst_error_ratio.has_value());
  EXPECT_DOUBLE_EQ(*mm->worst_error_ratio, 35.5);
  EXPECT_EQ(mm->worst_key, "k-mm");
  EXPECT_EQ(mm->models.size(), 2u);
  ASSERT_EQ(report.broken_models.size(), 2u);
  const BrokenModel* qwen = nullptr;
  for (const BrokenModel& m : report.broken_models) {
    if (m.model_id == "Qwen/Qwen3-0.6B") qwen = &m;
    EXPECT_NE(m.model_id, "bert-base-uncased");
  }
  ASSERT_NE(qwen, nullptr);
  ASSERT_TRUE(qwen->first_divergent.has_value());
  EXPECT_EQ(qwen->first_divergent->call, 17);

  const std::string html = ReportToHtml(report);
  const size_t broken = html.find("<section id=\"broken\">");
  ASSERT_NE(broken, std::string::npos);
  EXPECT_LT(broken, html.find("<section id=\"summary\">"));
  EXPECT_LT(broken, html.find("<section id=\"regressions\">"));
  const std::string section = html.substr(broken, html.find("</section>", broken) - broken);
  EXPECT_NE(section.find("<code>aten::mm</code>"), std::string::npos);
  EXPECT_NE(section.find("35.5"), std::string::npos);
  EXPECT_NE(section.find("href=\"#case-filter=k-mm\""), std::string::npos);  // worst case, and the divergent call's
  EXPECT_NE(section.find("model.layers.0.mlp.down_proj"), std::string::npos);
  EXPECT_NE(section.find("href=\"#case-filter=aten::mm\""), std::string::npos);
}

// Note [Missing kernels]: per op and dtypes, the cases the backend has no
// kernel for (N when none ran, partly when some did) and those its counters
// say ran through its host fallback; an expected gap is still a gap.
TEST(HtmlReport, WhatTheBackendLacksListsMissingKernelsAndHostFallbacks) {
  Report report = testing::SmallReport();
  EXPECT_TRUE(report.lacks.empty());  // nothing unsupported, no fallback counted
  auto add = [&](std::string key, std::string op, std::string dtypes, Outcome outcome, Outcome verdict,
                 std::string error, std::map<std::string, int64_t> counters) {
    CaseEntry c;
    c.run_id = "nightly-42-unit";
    c.key = std::move(key);
    c.op = std::move(op);
    c.dtypes = std::move(dtypes);
    c.result = CaseResult{};
    c.result->outcome = outcome;
    c.result->error = std::move(error);
    c.result->counters = std::move(counters);
    c.verdict = verdict;
    report.cases.push_back(std::move(c));
  };
  const std::string conv = "convolution_overrideable not implemented. You are likely triggering this with tensor "
                           "backend other than CPU/CUDA/MKLDNN, if this is intended, please use TORCH_LIBRARY_IMPL "
                           "to override this function ";
  add("k-c1", "aten::convolution", "bf16", Outcome::kUnsupported, Outcome::kUnsupported, conv, {});
  add("k-c2", "aten::convolution", "bf16", Outcome::kUnsupported, Outcome::kExpectedFailure, conv, {});
  add("k-a1", "aten::abs", "i32", Outcome::kUnsupported, Outcome::kUnsupported, "\"abs_cpu\" not implemented for 'Int'",
      {});
  add("k-a2", "aten::abs", "i32", Outcome::kPass, Outcome::kPass, "", {});
  add("k-a3", "aten::abs", "i32", Outcome::kSkipped, Outcome::kSkipped, "over the cap", {});
  add("k-n1", "aten::nonzero", "f32", Outcome::kPass, Outcome::kPass, "",
      {{"fallbacks", 1}, {"fallback:aten::nonzero", 1}});
  add("k-n2", "aten::nonzero", "f32", Outcome::kPass, Outcome::kPass, "", {{"kernel_launches", 2}});
  // Only the views that placed its inputs went through the fallback: not the op.
  add("k-r1", "aten::relu", "f32", Outcome::kPass, Outcome::kPass, "",
      {{"fallbacks", 2}, {"fallback:aten::as_strided", 2}});
  // A backend that counts fallbacks only in all.
  add("k-g1", "aten::gather", "f32", Outcome::kPass, Outcome::kPass, "", {{"fallbacks", 1}});
  FindBroken(report);

  ASSERT_EQ(report.lacks.size(), 4u);
  const OpSupport& none = report.lacks[0];
  EXPECT_EQ(none.op, "aten::convolution");
  EXPECT_EQ(none.Support(), "N");
  EXPECT_EQ(none.cases, 2);
  EXPECT_EQ(none.unsupported, 2);  // the expected failure counts: the kernel is missing all the same
  EXPECT_EQ(none.missing, "convolution_overrideable");
  EXPECT_EQ(none.example_key, "k-c1");
  const OpSupport& partly = report.lacks[1];
  EXPECT_EQ(partly.op, "aten::abs");
  EXPECT_EQ(partly.Support(), "partly");
  EXPECT_EQ(partly.cases, 2);  // the skipped case was not judged
  EXPECT_EQ(partly.unsupported, 1);
  EXPECT_EQ(partly.missing, "abs_cpu for 'Int'");
  EXPECT_EQ(report.lacks[2].op, "aten::gather");
  EXPECT_EQ(report.lacks[2].Support(), "CPU fallback");
  const OpSupport& host = report.lacks[3];
  EXPECT_EQ(host.op, "aten::nonzero");
  EXPECT_EQ(host.Support(), "CPU fallback");
  EXPECT_EQ(host.cases, 2);
  EXPECT_EQ(host.fallback, 1);
  EXPECT_EQ(host.example_key, "k-n1");

  const std::string html = ReportToHtml(report);
  const size_t at = html.find("<section id=\"lacks\">");
  ASSERT_NE(at, std::string::npos);
  const std::string section = html.substr(at, html.find("</section>", at) - at);
  EXPECT_NE(section.find("<code>convolution_overrideable</code>"), std::string::npos);
  EXPECT_NE(section.find("abs_cpu for &#39;Int&#39;"), std::string::npos) << section;
  EXPECT_LT(section.find("aten::abs"), section.find("<details>"));      // missing kernels first
  EXPECT_GT(section.find("aten::nonzero"), section.find("<details>"));  // fallbacks folded below
  EXPECT_NE(section.find("href=\"#case-filter=k-c1\""), std::string::npos);
  const nlohmann::json json = nlohmann::json::parse(ReportToJson(report));
  ASSERT_EQ(json["lacks"].size(), 4u);
  EXPECT_EQ(json["lacks"][0]["support"], "N");
  EXPECT_EQ(json["lacks"][1]["missing_kernel"], "abs_cpu for 'Int'");
  EXPECT_EQ(json["lacks"][3]["fallback"], 1);
  EXPECT_EQ(section.find("aten::relu"), std::string::npos);
}

// Note [What is broken]: a failing model names its call, the call its
// worker died in, or in words why it names none; what answered differently
// when run again is listed as flaky at the top.
TEST(HtmlReport, WhatIsBrokenNamesEveryCallOrSaysWhyNotAndListsFlakiness) {
  const nlohmann::json located = {{"first_divergent", {{"call", 7}, {"op", "aten::mm"}, {"module", "lm_head"}}},
                                  {"worker", {{"in_call", {{"call", 9}}}}}};
  ASSERT_TRUE(build::ReadFirstDivergent(located).has_value());
  EXPECT_EQ(build::ReadFirstDivergent(located)->call, 7);
  EXPECT_FALSE(build::ReadFirstDivergent(located)->died_in);
  const nlohmann::json died = {{"worker", {{"in_call", {{"call", 41}, {"op", "aten::topk"}, {"module", "mlp.gate"},
                                                        {"phase", "forward"}}}}}};
  ASSERT_TRUE(build::ReadFirstDivergent(died).has_value());
  EXPECT_TRUE(build::ReadFirstDivergent(died)->died_in);
  EXPECT_EQ(build::ReadFirstDivergent(died)->op, "aten::topk");
  EXPECT_FALSE(build::ReadFirstDivergent({{"first_divergent_note", "every call ..."}}).has_value());
  EXPECT_EQ(build::ReadLocateNote({{"first_divergent_note", "every call is within its tolerance"}}),
            "every call is within its tolerance");

  Report report = testing::SmallReport();
  ASSERT_EQ(report.broken_models.size(), 2u);
  BrokenModel* other = report.broken_models[0].model_id == "Qwen/Qwen3-0.6B" ? &report.broken_models[1]
                                                                            : &report.broken_models[0];
  other->first_divergent.reset();
  other->locate_note = "every call is within its tolerance given the reference's inputs: the error accumulated";
  BrokenModel crashed = *other;
  crashed.model_id = "t/crashed";
  crashed.first_divergent = build::ReadFirstDivergent(died);
  report.broken_models.push_back(crashed);
  std::string html = ReportToHtml(report);
  size_t broken = html.find("<section id=\"broken\">");
  std::string section = html.substr(broken, html.find("</section>", broken) - broken);
  EXPECT_NE(section.find("the error accumulated"), std::string::npos);
  EXPECT_NE(section.find("died in call 41 <code>aten::topk</code>"), std::string::npos);
  EXPECT_EQ(section.find("flaky"), std::string::npos);

  ASSERT_TRUE(report.cases[0].result.has_value());
  report.cases[0].result->flaky = true;
  html = ReportToHtml(report);
  broken = html.find("<section id=\"broken\">");
  section = html.substr(broken, html.find("</section>", broken) - broken);
  EXPECT_NE(section.find("1 op cases and 0 model items answered differently when run again"), std::string::npos)
      << section;
  EXPECT_NE(section.find(EscapeHtml(report.cases[0].op)), std::string::npos);
}

TEST(HtmlReport, AFirstRunSaysSoInsteadOfNoRegressions) {
  Report report = testing::SmallReport();
  report.baselines.clear();
  report.changes.clear();  // without a baseline nothing has a change
  for (CaseEntry& c : report.cases) c.change = Change::kNoBaseline;
  const std::string html = ReportToHtml(report);
  EXPECT_NE(html.find("First run: no baseline to compare with."), std::string::npos);
  const size_t section = html.find("<section id=\"regressions\">");
  EXPECT_NE(html.find("First run: there is no baseline", section), std::string::npos);
  EXPECT_EQ(html.find("No regressions."), std::string::npos);
}

TEST(HtmlReport, EmptyReportStillHasEverySection) {
  Report report;
  report.title = "coverage: nothing";
  const std::string html = ReportToHtml(report);
  for (const char* id : {"summary", "regressions", "matrix", "charts", "models", "blockers", "cases"}) {
    EXPECT_NE(html.find(std::string("<section id=\"") + id + "\">"), std::string::npos) << id;
  }
  EXPECT_NE(html.find("First run"), std::string::npos);
  EXPECT_NE(html.find("0 of 0 cases"), std::string::npos);
  EXPECT_EQ(nlohmann::json::parse(ScriptData(html))["cases"].size(), 0u);
}

TEST(HtmlReport, ThirtyThousandCasesStayCompact) {
  const Report report = testing::RealisticReport(30000, 20);
  const std::string html = ReportToHtml(report);
  // The case table is drawn from the data block, not written as rows.
  EXPECT_LT(Occurrences(html, "<tr"), 2000u);
  EXPECT_LT(html.size(), 30000u * 700u) << html.size() << " bytes";
  EXPECT_EQ(nlohmann::json::parse(ScriptData(html))["cases"].size(), report.cases.size());
}

}  // namespace
}  // namespace coverage::reports
