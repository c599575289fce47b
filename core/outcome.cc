#include "core/outcome.h"

#include <algorithm>

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

std::string OutcomesText(const std::vector<Outcome>& outcomes) {
  std::string text;
  for (Outcome o : outcomes) text += (text.empty() ? "" : ",") + std::string(OutcomeName(o));
  return text;
}

Status OutcomesFromText(std::string_view text, std::vector<Outcome>* out) {
  out->clear();
  for (size_t start = 0; !text.empty() && start <= text.size();) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view name = text.substr(start, comma - start);
    auto o = OutcomeFromName(name);
    if (!o) return Status::Corruption("unknown attempt outcome '" + std::string(name) + "'");
    out->push_back(*o);
    start = comma + 1;
  }
  return Status::Ok();
}

}  // namespace coverage
