// ReportToJUnit: JUnit XML for CI systems that show test results. One
// <testsuite> per stage; an op case or model item is a <testcase>. Verdicts
// map as CI expects: failing comparisons are <failure>, a backend that fell
// over (crash, error, timeout) is <error>, skipped is <skipped/>, and known
// failures pass with a note.
#include <algorithm>
#include <array>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "core/outcome.h"
#include "reports/escape.h"
#include "reports/report.h"

namespace coverage::reports {
namespace {

struct TestCase {
  std::string classname, name;
  std::optional<Outcome> verdict;
  std::string message, text, note;
  double seconds = 0;
};

struct Suite {
  std::vector<TestCase> cases;
  int64_t failures = 0, errors = 0, skipped = 0;
  double seconds = 0;
};

enum class Kind { kPass, kFailure, kError, kSkipped };

Kind KindOf(std::optional<Outcome> verdict) {
  if (!verdict) return Kind::kFailure;  // unjudged: a failure rather than a silent pass
  switch (*verdict) {
    case Outcome::kCrash:
    case Outcome::kError:
    case Outcome::kTimeout:
      return Kind::kError;
    case Outcome::kSkipped:
      return Kind::kSkipped;
    case Outcome::kPass:
    case Outcome::kExpectedFailure:
    case Outcome::kUnexpectedPass:
      return Kind::kPass;
    default:
      return Kind::kFailure;
  }
}

std::string FirstLine(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return line.size() > 300 ? line.substr(0, 300) + "..." : line;
}

std::string Note(std::optional<Outcome> verdict, std::optional<Outcome> outcome, const std::string& expectation) {
  if (verdict == Outcome::kExpectedFailure) {
    return fmt::format("expected failure ({}): {}", OutcomeNameOrEmpty(outcome), expectation);
  }
  if (verdict == Outcome::kUnexpectedPass) {
    return "passed, but expected to fail (" + expectation + "): the expectation can go";
  }
  return "";
}

void Add(Suite& suite, TestCase tc) {
  switch (KindOf(tc.verdict)) {
    case Kind::kFailure: ++suite.failures; break;
    case Kind::kError: ++suite.errors; break;
    case Kind::kSkipped: ++suite.skipped; break;
    case Kind::kPass: break;
  }
  suite.seconds += tc.seconds;
  suite.cases.push_back(std::move(tc));
}

void WriteCase(const TestCase& tc, std::string* out) {
  *out += fmt::format("    <testcase classname=\"{}\" name=\"{}\" time=\"{:.6f}\"", EscapeXml(tc.classname),
                      EscapeXml(tc.name), tc.seconds);
  const Kind kind = KindOf(tc.verdict);
  if (kind == Kind::kPass && tc.note.empty()) {
    *out += "/>\n";
    return;
  }
  *out += ">\n";
  switch (kind) {
    case Kind::kFailure:
    case Kind::kError:
      *out += fmt::format("      <{0} message=\"{1}\" type=\"{2}\">{3}</{0}>\n",
                          kind == Kind::kFailure ? "failure" : "error", EscapeXml(tc.message),
                          EscapeXml(OutcomeNameOrEmpty(tc.verdict)), EscapeXml(tc.text));
      break;
    case Kind::kSkipped:
      *out += fmt::format("      <skipped message=\"{}\"/>\n", EscapeXml(tc.message));
      break;
    case Kind::kPass:
      break;
  }
  if (!tc.note.empty()) *out += fmt::format("      <system-out>{}</system-out>\n", EscapeXml(tc.note));
  *out += "    </testcase>\n";
}

TestCase FromCase(const CaseEntry& c) {
  const CaseResult& r = c.ResultOrEmpty();
  TestCase tc;
  tc.classname = c.op;
  tc.name = c.summary;
  tc.verdict = c.verdict;
  tc.seconds = r.first_call_us.value_or(r.warm_us.value_or(0)) / 1e6;
  const std::string outcome(OutcomeNameOrEmpty(OutcomeOf(c.result)));
  tc.message = !r.error.empty() ? FirstLine(r.error)
               : r.max_abs_err  ? fmt::format("{}: max abs error {:.3g}", outcome, *r.max_abs_err)
                                : outcome;
  tc.text = r.error;
  if (!c.change_detail.empty()) tc.text += (tc.text.empty() ? "" : "\n") + std::string(ChangeName(c.change)) + ": " + c.change_detail;
  tc.text += (tc.text.empty() ? "" : "\n") + std::string("key ") + c.key + "\nrepro: " + c.repro;
  tc.note = Note(c.verdict, OutcomeOf(c.result), c.expectation);
  return tc;
}

TestCase FromItem(const ModelEntry& m, const ModelItemEntry& item) {
  const registry::ModelResultRecord& record = item.Record();
  const ModelItemResult& r = record.result;
  TestCase tc;
  tc.classname = m.model_id;
  tc.name = record.stage + ":" + r.item;
  tc.verdict = item.verdict;
  tc.seconds = r.seconds;
  tc.message = !r.error.empty() ? FirstLine(r.error) : std::string(OutcomeNameOrEmpty(OutcomeOf(item.result)));
  tc.text = r.error;
  if (!record.blocked_by.empty()) {
    tc.text += (tc.text.empty() ? "" : "\n") + std::string("blocked by ") + record.blocked_by;
  }
  if (!item.change_detail.empty()) {
    tc.text += (tc.text.empty() ? "" : "\n") + std::string(ChangeName(item.change)) + ": " + item.change_detail;
  }
  tc.note = Note(item.verdict, OutcomeOf(item.result), item.expectation);
  return tc;
}

}  // namespace

std::string ReportToJUnit(const Report& report) {
  constexpr std::array<const char*, 4> kStages = {"unit", "module", "model", "train"};
  std::map<std::string, Suite> suites;
  for (const CaseEntry& c : report.cases) {
    if (c.change != Change::kRemoved) Add(suites["unit"], FromCase(c));
  }
  for (const ModelEntry& m : report.models) {
    for (const ModelItemEntry& item : m.items) {
      if (item.change != Change::kRemoved) Add(suites[item.Record().stage], FromItem(m, item));
    }
  }
  int64_t tests = 0, failures = 0, errors = 0, skipped = 0;
  double seconds = 0;
  for (const auto& [name, s] : suites) {
    tests += static_cast<int64_t>(s.cases.size());
    failures += s.failures;
    errors += s.errors;
    skipped += s.skipped;
    seconds += s.seconds;
  }
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += fmt::format("<testsuites name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" time=\"{:.6f}\">\n",
                     EscapeXml(report.title), tests, failures, errors, skipped, seconds);
  auto write_suite = [&](const std::string& stage, const Suite& s) {
    out += fmt::format(
        "  <testsuite name=\"coverage.{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" time=\"{:.6f}\" "
        "timestamp=\"{}\">\n",
        EscapeXml(stage), s.cases.size(), s.failures, s.errors, s.skipped, s.seconds, EscapeXml(report.generated_at));
    for (const TestCase& tc : s.cases) WriteCase(tc, &out);
    out += "  </testsuite>\n";
  };
  for (const char* stage : kStages) {
    if (auto it = suites.find(stage); it != suites.end()) write_suite(stage, it->second);
  }
  for (const auto& [stage, s] : suites) {  // a stage this build does not know, in name order
    if (std::find(kStages.begin(), kStages.end(), stage) == kStages.end()) write_suite(stage, s);
  }
  out += "</testsuites>\n";
  return out;
}

}  // namespace coverage::reports
