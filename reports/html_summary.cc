// The overview sections: summary cards per stage with the change counts, and
// the stage x family matrix coloured by pass rate.
#include <fmt/core.h>

#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "reports/html_parts.h"

namespace coverage::reports::html {

void WriteSummary(Out& out, const Report& report) {
  out += "<section id=\"summary\">\n<h2>Summary</h2>\n<div class=\"cards\">\n";
  for (const StageSummary& stage : report.stages) {
    Put(out, "<div class=\"card\" style=\"border-top-color:{}\"><h3>{}</h3><p class=\"rate\">{}</p>",
        RateColour(stage.pass_rate), E(stage.stage), Percent(stage.pass_rate));
    Put(out, "<p class=\"total\">{} {}</p><ul>", stage.total, stage.stage == "unit" ? "cases" : "models");
    for (const auto& [verdict, count] : stage.VerdictsInNameOrder()) {
      Put(out, "<li>{} <span class=\"count\">{}</span></li>", VerdictBadge(verdict), count);
    }
    out += "</ul>";
    if (stage.by_source.count("opinfo")) {
      // Captured real shapes and OpInfo's edge-case samples, told apart.
      out += "<p class=\"sources\">";
      for (const auto& [source, label] : {std::pair<std::string, std::string_view>{"captured", "from models"},
                                          {"opinfo", "from OpInfo samples"}}) {
        auto it = stage.by_source.find(source);
        if (it == stage.by_source.end()) continue;
        int64_t total = 0, passing = 0;
        for (const auto& [v, n] : it->second) {
          total += n;
          passing += Passes(v) ? n : 0;
        }
        Put(out, "<span class=\"source\" data-source=\"{}\">{}: {} of {} pass</span> ", source, label, passing,
            total);
      }
      out += "</p>";
    }
    out += "</div>\n";
  }
  out += "</div>\n<h3>Changes since the baseline</h3>\n<div class=\"cards changes\">\n";
  int64_t unexpected_passes = 0;
  for (const StageSummary& stage : report.stages) {
    auto it = stage.verdicts.find(Outcome::kUnexpectedPass);
    if (it != stage.verdicts.end()) unexpected_passes += it->second;
  }
  struct Shown {
    Change change;
    std::string_view label;
    bool bad;
  };
  static const Shown kShown[] = {
      {Change::kNewFailure, "New failures", true},
      {Change::kDrift, "Accuracy drift", true},
      {Change::kPerfRegression, "Slower", true},
      {Change::kFixed, "Fixed", false},
      {Change::kStillFailing, "Still failing", false},
      {Change::kCompileChange, "Compile time changed", false},
      {Change::kPerfImprovement, "Faster", false},
      {Change::kNewCase, "New", false},
      {Change::kRemoved, "Removed", false},
      {Change::kUnchanged, "Unchanged", false},
      {Change::kNoBaseline, "Without baseline", false},
  };
  for (const Shown& shown : kShown) {
    const int64_t count = ChangeCount(report, shown.change);
    Put(out, "<div class=\"card small{}\"><p class=\"count\">{}</p><p>{}</p></div>\n",
        shown.bad && count > 0 ? " bad" : "", count, shown.label);
  }
  Put(out, "<div class=\"card small{}\"><p class=\"count\">{}</p><p>Unexpected passes</p></div>\n",
      unexpected_passes > 0 ? " warn" : "", unexpected_passes);
  out += "</div>\n</section>\n";
}

void WriteMatrix(Out& out, const Report& report) {
  out += "<section id=\"matrix\">\n<h2>Stages by family</h2>\n";
  std::set<std::string> stage_set;
  for (const auto& [family, by_stage] : report.matrix) {
    for (const auto& [stage, counts] : by_stage) stage_set.insert(stage);
  }
  if (report.matrix.empty()) {
    out += "<p class=\"empty\">No results with a model family.</p>\n</section>\n";
    return;
  }
  const std::vector<std::string> stages = OrderStages(stage_set);
  out += "<table id=\"matrix-table\"><thead><tr><th>Family</th>";
  for (const std::string& stage : stages) Put(out, "<th>{}</th>", E(stage));
  out += "</tr></thead><tbody>\n";
  for (const auto& [family, by_stage] : report.matrix) {
    Put(out, "<tr><th scope=\"row\">{}</th>", E(FamilyName(family)));
    for (const std::string& stage : stages) {
      auto it = by_stage.find(stage);
      if (it == by_stage.end() || it->second.second == 0) {
        out += "<td class=\"cell empty\"></td>";
        continue;
      }
      const auto [passing, total] = it->second;
      const double rate = static_cast<double>(passing) / static_cast<double>(total);
      Put(out, "<td class=\"cell\" style=\"background:{}\" title=\"{}\">{}/{}</td>", RateColour(rate), Percent(rate),
          passing, total);
    }
    out += "</tr>\n";
  }
  out += "</tbody></table>\n</section>\n";
}

}  // namespace coverage::reports::html
