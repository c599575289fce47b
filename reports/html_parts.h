// The pieces of the HTML report (ReportToHtml in html.cc), private to
// reports/: the section writers, one file per part of the page, and the
// helpers they share. Not installed, not for use outside reports/.
//
// Every writer appends to `out` and writes registry text only through E
// (EscapeHtml; Note [Self-contained report] in html.cc). Sections are
// `<section id="...">` elements that read without script; the header's nav
// links to them by id.
#pragma once

#include <fmt/core.h>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/outcome.h"
#include "reports/escape.h"
#include "reports/report.h"

namespace coverage::reports::html {

using Out = std::string;

// Rows of the regressions table and of drill-downs are capped; the case table
// holds every case.
constexpr size_t kMaxRegressionRows = 500;
constexpr size_t kMaxBlockerRows = 100;
constexpr size_t kMaxModelsPerBlocker = 8;
constexpr size_t kMaxRootCausesPerModel = 50;
constexpr size_t kMaxFamilyBars = 40;
constexpr int kCasePageSize = 100;

inline std::string E(std::string_view text) { return EscapeHtml(text); }

template <typename... Args>
void Put(Out& out, fmt::format_string<Args...> format, Args&&... args) {
  fmt::format_to(std::back_inserter(out), format, std::forward<Args>(args)...);
}

// ---------------------------------------------------------------- helpers (html_parts.cc)

std::string Percent(double fraction);  // "12.3%"

// Cuts `text` to at most `max_bytes` without splitting a UTF-8 sequence.
std::string Shorten(std::string_view text, size_t max_bytes);

std::string Join(const std::vector<std::string>& parts, std::string_view separator);

// A CSS class for a verdict; fixed strings, so data never picks a class.
std::string_view VerdictClass(Outcome verdict);

// `<span class="badge v-...">verdict</span>`, or "" for none.
std::string VerdictBadge(std::optional<Outcome> verdict);

// A case's verdict as the case table shows it: a removed case has none, so
// its change stands in.
std::string ShownVerdict(const CaseEntry& c);

// Whether a case belongs in the regressions table: its change or one of its
// extra changes is a regression.
bool HasRegression(const CaseEntry& c);

int64_t ChangeCount(const Report& report, Change change);

// A pass rate as a colour from red (0) through yellow to green (1).
std::string RateColour(double rate, bool strong = false);

// Stages in pipeline order, then any others by name.
std::vector<std::string> OrderStages(const std::set<std::string>& stages);

// Percent-encodes all but unreserved characters, for a URL fragment.
std::string PercentEncode(std::string_view text);

std::string FamilyName(std::string_view family);  // "(unknown)" for ""

// ---------------------------------------------------------------- sections, in page order

void WriteHeader(Out& out, const Report& report);        // html_header.cc: title, verdict, pipeline, nav
void WriteBroken(Out& out, const Report& report);        // html_broken.cc: what fails now
void WriteLacks(Out& out, const Report& report);         // html_broken.cc: missing kernels, host fallbacks
void WriteSummary(Out& out, const Report& report);       // html_summary.cc: stage cards, change counts
void WriteRegressions(Out& out, const Report& report);   // html_broken.cc: what got worse, with repro
void WriteMatrix(Out& out, const Report& report);        // html_summary.cc: stage x family pass rates
void WriteCharts(Out& out, const Report& report);        // html_charts.cc: SVG charts
void WriteModels(Out& out, const Report& report);        // html_models.cc: models and their drill-downs
void WriteBlockers(Out& out, const Report& report);      // html_models.cc: op cases ranked by models blocked
void WriteCases(Out& out, const Report& report);         // html_cases.cc: the scripted case table and its data
void WriteRuns(Out& out, const Report& report);          // html_header.cc: runs, baselines, warnings

}  // namespace coverage::reports::html
