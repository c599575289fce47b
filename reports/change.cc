#include "reports/report.h"

namespace coverage::reports {

std::string_view ChangeName(Change change) {
  switch (change) {
    case Change::kNoBaseline:
      return "no_baseline";
    case Change::kNewCase:
      return "new_case";
    case Change::kRemoved:
      return "removed";
    case Change::kNewFailure:
      return "new_failure";
    case Change::kFixed:
      return "fixed";
    case Change::kStillFailing:
      return "still_failing";
    case Change::kDrift:
      return "drift";
    case Change::kPerfRegression:
      return "perf_regression";
    case Change::kPerfImprovement:
      return "perf_improvement";
    case Change::kCompileChange:
      return "compile_change";
    case Change::kUnchanged:
      return "unchanged";
  }
  return "unknown";
}

}  // namespace coverage::reports
