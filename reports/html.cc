// The HTML report: one self-contained file (Note [Self-contained report]).
//
// Note [Self-contained report]
// The report is opened from file://, mailed, attached to CI runs and kept for
// years, so it references nothing outside itself: CSS, script and SVG charts
// are inline, there are no fonts, images or links to other origins, and a
// Content-Security-Policy forbids the browser from fetching anything. What
// comes from the registry (model ids, summaries, error text, tags) is
// untrusted: it reaches the HTML only through EscapeHtml, and the script only
// as data in one <script type="application/json"> block (Note [Script data]
// in html_cases.cc). No markup is built from data in the script: it sets
// textContent only, and handlers are attached with addEventListener, never as
// attributes.
//
// The case table is rendered by the script from that block, a page at a
// time, so a run of 30,000 cases is a few megabytes of JSON rather than
// 30,000 rows of markup; everything else is static HTML that reads without
// script.
//
// The stylesheet and script are files, reports/assets/report.css and
// report.js, compiled in at build time (reports/assets.h); each goes in on
// the line after its opening tag. The page is
// assembled here from its sections, one writer each (reports/html_parts.h),
// in the order a reader wants them: what is broken and what regressed first,
// the runs last.

#include <string>

#include "reports/assets.h"
#include "reports/html_parts.h"
#include "reports/report.h"

namespace coverage::reports {

using html::E;
using html::Out;
using html::Put;

std::string ReportToHtml(const Report& report) {
  Out out;
  out.reserve(64 * 1024 + report.cases.size() * 400);
  Put(out,
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
      "script-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<meta name=\"generator\" content=\"coverage\">\n<title>{}</title>\n<style>\n{}</style>\n</head>\n<body>\n",
      E(report.title), assets::kReportCss);
  html::WriteHeader(out, report);
  out += "<main>\n";
  html::WriteBroken(out, report);
  html::WriteLacks(out, report);
  html::WriteSummary(out, report);
  html::WriteRegressions(out, report);
  html::WriteMatrix(out, report);
  html::WriteCharts(out, report);
  html::WriteModels(out, report);
  html::WriteBlockers(out, report);
  html::WriteCases(out, report);
  html::WriteRuns(out, report);
  Put(out, "</main>\n<script>\n{}</script>\n</body>\n</html>\n", assets::kReportJs);
  return out;
}

}  // namespace coverage::reports
