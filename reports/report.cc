// The functions of the Report data model (report.h) that are not writers.
#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/outcome.h"
#include "reports/report.h"

namespace coverage::reports {

std::string_view ChangeName(Change change) {
  switch (change) {
    case Change::kNoBaseline: return "no_baseline";
    case Change::kNewCase: return "new_case";
    case Change::kRemoved: return "removed";
    case Change::kNewFailure: return "new_failure";
    case Change::kFixed: return "fixed";
    case Change::kStillFailing: return "still_failing";
    case Change::kDrift: return "drift";
    case Change::kPerfRegression: return "perf_regression";
    case Change::kPerfImprovement: return "perf_improvement";
    case Change::kCompileChange: return "compile_change";
    case Change::kUnchanged: return "unchanged";
  }
  return "unknown";
}

bool IsRegression(Change change) {
  return change == Change::kNewFailure || change == Change::kDrift || change == Change::kPerfRegression;
}

bool Report::Regressed() const {
  return std::any_of(changes.begin(), changes.end(), [](const auto& c) { return IsRegression(c.first) && c.second > 0; });
}

int64_t Report::CountOf(Change change) const {
  auto it = changes.find(change);
  return it == changes.end() ? 0 : it->second;
}

bool Passes(Outcome verdict) {
  return verdict == Outcome::kPass || verdict == Outcome::kExpectedFailure || verdict == Outcome::kUnexpectedPass;
}

std::vector<std::pair<Outcome, int64_t>> StageSummary::VerdictsInNameOrder() const {
  std::vector<std::pair<Outcome, int64_t>> out(verdicts.begin(), verdicts.end());
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return OutcomeName(a.first) < OutcomeName(b.first); });
  return out;
}

std::string_view OutcomeNameOrEmpty(const std::optional<Outcome>& outcome) {
  return outcome ? OutcomeName(*outcome) : std::string_view();
}

const CaseResult& CaseEntry::ResultOrEmpty() const {
  static const CaseResult kEmpty;
  return result ? *result : kEmpty;
}

const registry::ModelResultRecord& ModelItemEntry::Record() const {
  COV_CHECK(result || baseline, "ModelItemEntry::Record: the entry holds no record");
  return result ? *result : *baseline;
}

}  // namespace coverage::reports
