// The HTML report's stylesheet and script, kept as plain files in
// reports/assets/ and compiled in at build time: cmake/embed_file.cmake
// turns each into a generated .cc (reports/CMakeLists.txt), so an edit to an
// asset rebuilds the library and the report embeds the file byte for byte.
//
// Both views refer to static storage and are valid for the whole program;
// they are constant-initialised, so using them from other static
// initialisers is safe.
#pragma once

#include <string_view>

namespace coverage::reports::assets {

// reports/assets/report.css: the page's only stylesheet, inside <style>.
extern const std::string_view kReportCss;

// reports/assets/report.js: builds the case table from the JSON block
// (Note [Script data] in html_cases.cc), a page at a time, with sorting,
// filters, details and copy buttons. It sets textContent only and attaches
// handlers with addEventListener, so no data becomes markup (Note
// [Self-contained report] in html.cc).
extern const std::string_view kReportJs;

}  // namespace coverage::reports::assets
