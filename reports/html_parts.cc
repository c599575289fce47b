// Helpers shared by the HTML report's sections (html_parts.h).
#include "reports/html_parts.h"

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <cmath>

namespace coverage::reports::html {

std::string Percent(double fraction) { return fmt::format("{:.1f}%", 100.0 * fraction); }

std::string Shorten(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return std::string(text.substr(0, cut)) + "\xE2\x80\xA6";  // …
}

std::string Join(const std::vector<std::string>& parts, std::string_view separator) {
  std::string joined;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) joined += separator;
    joined += parts[i];
  }
  return joined;
}

std::string_view VerdictClass(Outcome verdict) {
  switch (verdict) {
    case Outcome::kPass: return "v-pass";
    case Outcome::kExpectedFailure: return "v-xfail";
    case Outcome::kUnexpectedPass: return "v-xpass";
    case Outcome::kSkipped: return "v-skip";
    default: return "v-fail";
  }
}

std::string VerdictBadge(std::optional<Outcome> verdict) {
  if (!verdict) return "";
  return fmt::format("<span class=\"badge {}\">{}</span>", VerdictClass(*verdict), E(OutcomeName(*verdict)));
}

std::string ShownVerdict(const CaseEntry& c) {
  return std::string(c.verdict ? OutcomeName(*c.verdict) : ChangeName(c.change));
}

bool HasRegression(const CaseEntry& c) {
  if (IsRegression(c.change)) return true;
  for (const std::string& extra : c.extra_changes) {
    if (extra == ChangeName(Change::kDrift) || extra == ChangeName(Change::kPerfRegression)) return true;
  }
  return false;
}

int64_t ChangeCount(const Report& report, Change change) {
  auto it = report.changes.find(change);
  return it == report.changes.end() ? 0 : it->second;
}

// Rates are cubed first: backends pass most cases, and the difference
// between 80% and 99% is the one to see.
std::string RateColour(double rate, bool strong) {
  const double hue = 120.0 * std::pow(std::clamp(rate, 0.0, 1.0), 3.0);
  return fmt::format(fmt::runtime(strong ? "hsl({:.0f},60%,45%)" : "hsl({:.0f},65%,82%)"), hue);
}

std::vector<std::string> OrderStages(const std::set<std::string>& stages) {
  static const std::vector<std::string> kPipeline = {"unit", "module", "model", "train"};
  std::vector<std::string> ordered;
  for (const std::string& stage : kPipeline) {
    if (stages.count(stage)) ordered.push_back(stage);
  }
  for (const std::string& stage : stages) {
    if (std::find(kPipeline.begin(), kPipeline.end(), stage) == kPipeline.end()) ordered.push_back(stage);
  }
  return ordered;
}

std::string PercentEncode(std::string_view text) {
  std::string out;
  for (unsigned char ch : text) {
    if (std::isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '~' || ch == ':') {
      out += static_cast<char>(ch);
    } else {
      out += fmt::format("%{:02X}", ch);
    }
  }
  return out;
}

std::string FamilyName(std::string_view family) { return family.empty() ? "(unknown)" : std::string(family); }

}  // namespace coverage::reports::html
