#include "core/outcome.h"

namespace coverage {

std::string_view OutcomeName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kPass: return "pass";
    case Outcome::kMismatch: return "mismatch";
    case Outcome::kShapeMismatch: return "shape_mismatch";
    case Outcome::kShapeDivergence: return "shape_divergence";
    case Outcome::kDtypeMismatch: return "dtype_mismatch";
    case Outcome::kNonFiniteMismatch: return "nonfinite_mismatch";
    case Outcome::kError: return "error";
    case Outcome::kUnsupported: return "unsupported";
    case Outcome::kSkipped: return "skipped";
    case Outcome::kCrash: return "crash";
    case Outcome::kTimeout: return "timeout";
    case Outcome::kExpectedFailure: return "expected_failure";
    case Outcome::kUnexpectedPass: return "unexpected_pass";
  }
  return "unknown";
}

std::optional<Outcome> OutcomeFromName(std::string_view name) {
  for (Outcome o : kAllOutcomes) {
    if (OutcomeName(o) == name) return o;
  }
  return std::nullopt;
}

bool IsUnexpectedFailure(Outcome outcome) {
  switch (outcome) {
    case Outcome::kPass:
    case Outcome::kSkipped:
    case Outcome::kExpectedFailure:
      return false;
    default:
      return true;
  }
}

}  // namespace coverage
