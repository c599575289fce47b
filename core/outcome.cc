#include "core/outcome.h"

#include <algorithm>
#include <cctype>

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

bool LooksUnsupported(std::string_view message) {
  for (std::string_view words : {"Could not run", "not implemented", "NotImplementedError", "is not supported",
                                 "please use TORCH_LIBRARY_IMPL"}) {
    if (message.find(words) != std::string_view::npos) return true;
  }
  return false;
}

namespace {

bool IsNameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == ':' || c == '.';
}

// The word that ends just before `end` (after skipping spaces): a quoted
// string without its quotes, else a run of name characters.
std::string_view WordBefore(std::string_view text, size_t end, size_t* begin) {
  while (end > 0 && text[end - 1] == ' ') --end;
  if (end >= 2 && (text[end - 1] == '"' || text[end - 1] == '\'')) {
    const size_t open = text.rfind(text[end - 1], end - 2);
    if (open != std::string_view::npos && open + 1 < end - 1) {
      *begin = open;
      return text.substr(open + 1, end - 2 - open);
    }
  }
  while (end > 0 && (text[end - 1] == ':' || text[end - 1] == '.')) --end;  // "convolution_backward_overrideable:"
  size_t start = end;
  while (start > 0 && IsNameChar(text[start - 1])) --start;
  *begin = start;
  return text.substr(start, end - start);
}

}  // namespace

std::string MissingKernel(std::string_view message) {
  constexpr std::string_view kCouldNotRun = "Could not run '";
  if (size_t at = message.find(kCouldNotRun); at != std::string_view::npos) {
    const size_t from = at + kCouldNotRun.size();
    const size_t to = message.find('\'', from);
    if (to != std::string_view::npos && to > from) return std::string(message.substr(from, to - from));
  }
  constexpr std::string_view kNotImplemented = " not implemented";
  const size_t at = message.find(kNotImplemented);
  if (at == std::string_view::npos) {
    // "convolution_backward_overrideable: You are likely triggering this ...
    // please use TORCH_LIBRARY_IMPL to override this function": the kernel
    // that only throws names itself first.
    if (message.find("TORCH_LIBRARY_IMPL") == std::string_view::npos) return "";
    size_t end = 0;
    while (end < message.size() && IsNameChar(message[end])) ++end;
    size_t begin = 0;
    return std::string(WordBefore(message, end, &begin));
  }
  size_t begin = 0;
  std::string_view name = WordBefore(message, at, &begin);
  if (name == "is") name = WordBefore(message, begin, &begin);  // "derivative for aten::x is not implemented"
  if (name.empty()) return "";
  std::string out(name);
  // "... not implemented for 'Int'": the dtype it lacks.
  constexpr std::string_view kFor = " for '";
  const size_t after = at + kNotImplemented.size();
  if (message.substr(after, kFor.size()) == kFor) {
    const size_t close = message.find('\'', after + kFor.size());
    if (close != std::string_view::npos) out += std::string(message.substr(after, close + 1 - after));
  }
  return out;
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
