// The HTML report: one self-contained file (Note [Self-contained report]).
//
// Note [Self-contained report]
// The report is opened from file://, mailed, attached to CI runs and kept for
// years, so it references nothing outside itself: CSS, script and SVG charts
// are inline, there are no fonts, images or links to other origins, and a
// Content-Security-Policy forbids the browser from fetching anything. What
// comes from the registry (model ids, summaries, error text, tags) is
// untrusted: it reaches the HTML only through EscapeHtml, and the script only
// as data in one <script type="application/json"> block (Note [Script data]).
// No markup is built from data in the script: it sets textContent only, and
// handlers are attached with addEventListener, never as attributes.
//
// The case table is rendered by the script from that block, a page at a
// time, so a run of 30,000 cases is a few megabytes of JSON rather than
// 30,000 rows of markup; everything else is static HTML that reads without
// script.

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/json_double.h"
#include "core/outcome.h"
#include "reports/escape.h"
#include "reports/report.h"

namespace coverage::reports {
namespace {

using Out = std::string;

// Rows of the regressions table and of drill-downs are capped; the case table
// holds every case.
constexpr size_t kMaxRegressionRows = 500;
constexpr size_t kMaxBlockerRows = 100;
constexpr size_t kMaxModelsPerBlocker = 8;
constexpr size_t kMaxRootCausesPerModel = 50;
constexpr size_t kMaxFamilyBars = 40;
constexpr int kCasePageSize = 100;

std::string E(std::string_view text) { return EscapeHtml(text); }

template <typename... Args>
void Put(Out& out, fmt::format_string<Args...> format, Args&&... args) {
  fmt::format_to(std::back_inserter(out), format, std::forward<Args>(args)...);
}

std::string Percent(double fraction) { return fmt::format("{:.1f}%", 100.0 * fraction); }

// Cuts `text` to at most `max_bytes` without splitting a UTF-8 sequence.
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

// A CSS class for a verdict; fixed strings, so data never picks a class.
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

// A case's verdict as the case table shows it: a removed case has none, so
// its change stands in.
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

// A pass rate as a colour from red (0) through yellow to green (1). Rates
// are cubed first: backends pass most cases, and the difference between 80%
// and 99% is the one to see.
std::string RateColour(double rate, bool strong = false) {
  const double hue = 120.0 * std::pow(std::clamp(rate, 0.0, 1.0), 3.0);
  return fmt::format(fmt::runtime(strong ? "hsl({:.0f},60%,45%)" : "hsl({:.0f},65%,82%)"), hue);
}

// Stages in pipeline order, then any others by name.
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

// Percent-encodes all but unreserved characters, for a URL fragment.
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

// ---------------------------------------------------------------- header

void WriteRunTable(Out& out, std::string_view id, const std::vector<RunInfo>& runs) {
  Put(out,
      "<table id=\"{}\"><thead><tr><th>Run</th><th>Stage</th><th>Backend</th><th>Host</th><th>Git revision</th>"
      "<th>libtorch</th><th>Started</th><th>Finished</th><th class=\"num\">Results</th><th>Shards</th></tr></thead>"
      "<tbody>\n",
      id);
  for (const RunInfo& run : runs) {
    Put(out,
        "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td>"
        "<td>{}</td><td class=\"num\">{}</td><td>{}</td></tr>\n",
        E(run.run_id), E(run.stage), E(run.backend), E(run.host), E(run.git_revision), E(run.libtorch_version),
        E(run.started_at), run.finished_at.empty() ? "<em>not finished</em>" : E(run.finished_at), run.results,
        E(run.shards));
  }
  out += "</tbody></table>\n";
}

void WritePipeline(Out& out, const Report& report);

void WriteHeader(Out& out, const Report& report) {
  Put(out, "<header id=\"top\">\n<h1>{}</h1>\n<p class=\"meta\">Generated {}", E(report.title), E(report.generated_at));
  if (!report.registry_path.empty()) Put(out, " from <code>{}</code>", E(report.registry_path));
  out += "</p>\n";
  const int64_t regressions = ChangeCount(report, Change::kNewFailure) + ChangeCount(report, Change::kDrift) +
                              ChangeCount(report, Change::kPerfRegression);
  if (regressions > 0) {
    Put(out, "<p class=\"verdict bad\">Regressed: {} new failure(s), {} drift, {} performance regression(s).</p>\n",
        ChangeCount(report, Change::kNewFailure), ChangeCount(report, Change::kDrift),
        ChangeCount(report, Change::kPerfRegression));
  } else if (report.baselines.empty()) {
    out += "<p class=\"verdict\">First run: no baseline to compare with.</p>\n";
  } else {
    out += "<p class=\"verdict good\">No regressions.</p>\n";
  }
  WritePipeline(out, report);
  out +=
      "<nav><a href=\"#broken\">What is broken</a> <a href=\"#summary\">Summary</a> <a href=\"#regressions\">"
      "Regressions</a> <a href=\"#matrix\">Stages by family</a> <a href=\"#charts\">Charts</a> <a href=\"#models\">"
      "Models</a> <a href=\"#blockers\">Blockers</a> <a href=\"#cases\">Cases</a> <a href=\"#runs\">Runs</a></nav>\n";
  out += "</header>\n";
}

void WriteRuns(Out& out, const Report& report) {
  out += "<section id=\"runs\">\n<h2>Runs</h2>\n";
  WriteRunTable(out, "runs", report.runs);
  out += "<h2>Baselines</h2>\n";
  if (report.baselines.empty()) {
    out += "<p class=\"empty\">First run: no earlier run of the same stages, backend and options to compare with.</p>\n";
  } else {
    WriteRunTable(out, "baselines", report.baselines);
  }
  if (!report.warnings.empty()) {
    out += "<h2>Warnings</h2>\n<ul id=\"warnings\">\n";
    for (const std::string& warning : report.warnings) Put(out, "<li>{}</li>\n", E(warning));
    out += "</ul>\n";
  }
  out += "</section>\n";
}

// Where the models came from: crawl, selection, capture, and the stages run.
void WritePipeline(Out& out, const Report& report) {
  const PipelineInfo& p = report.pipeline;
  out += "<ol id=\"pipeline\" class=\"pipeline\">\n";
  if (p.models_listed > 0 || p.crawls > 0) {
    Put(out, "<li><b>Crawl</b> {} models listed, {} configs fetched</li>\n", p.models_listed, p.configs_fetched);
  } else {
    out += "<li><b>Crawl</b> <span class=\"empty\">none in this registry</span></li>\n";
  }
  if (p.selection_id > 0) {
    Put(out, "<li><b>Selection {}</b> {} representatives of {} models; families covered {} of {}</li>\n",
        p.selection_id, p.representatives, p.selection_models, p.families_covered, p.families);
  } else {
    out += "<li><b>Selection</b> <span class=\"empty\">none in this registry</span></li>\n";
  }
  std::string statuses;
  for (const auto& [status, n] : p.capture_statuses) {
    if (status == "captured") continue;
    statuses += fmt::format("{}{} {}", statuses.empty() ? "" : ", ", n, status);
  }
  Put(out, "<li><b>Capture</b> {} (model, profile) pairs of {} models captured{}; {} op cases</li>\n",
      p.pairs_captured, p.models_captured, statuses.empty() ? "" : " (" + E(statuses) + ")", p.op_cases);
  std::string stages;
  for (const StageSummary& stage : report.stages) {
    stages += fmt::format("{}{} {}", stages.empty() ? "" : ", ", E(stage.stage), stage.total);
  }
  Put(out, "<li><b>Stages</b> {}</li>\n</ol>\n", stages.empty() ? "none" : stages);
}

// ---------------------------------------------------------------- what is broken

std::string CaseLink(std::string_view filter, std::string_view label) {
  // The case table's script reads "#case-filter=<text>" (Note [Case links]).
  return fmt::format("<a class=\"case-link\" href=\"#case-filter={}\">{}</a>", E(PercentEncode(filter)), E(label));
}

void WriteBroken(Out& out, const Report& report) {
  out += "<section id=\"broken\">\n<h2>What is broken</h2>\n";
  int64_t failing_cases = 0;
  for (const BrokenOp& b : report.broken_ops) failing_cases += b.cases;
  if (report.broken_ops.empty() && report.broken_models.empty()) {
    out += "<p class=\"empty\">Nothing fails unexpectedly: every judged op case and model passes or fails as "
           "expected.</p>\n</section>\n";
    return;
  }
  Put(out, "<p class=\"lede\">{} op cases of {} op and dtype groups and {} models fail now{}.</p>\n", failing_cases,
      report.broken_ops.size(), report.broken_models.size(),
      report.baselines.empty() ? " (first run: no baseline, so nothing is marked new)" : "");
  if (!report.broken_ops.empty()) {
    out +=
        "<h3>Op cases, by op and dtype</h3>\n<table id=\"broken-ops\"><thead><tr><th>Op</th><th>Dtypes</th>"
        "<th class=\"num\">Failing cases</th><th>Verdicts</th><th class=\"num\">Worst error ratio</th>"
        "<th>Models</th><th>Cases</th></tr></thead><tbody>\n";
    size_t rows = 0;
    for (const BrokenOp& b : report.broken_ops) {
      if (rows++ == kMaxRegressionRows) break;
      std::string verdicts;
      for (const auto& [v, n] : b.verdicts) verdicts += fmt::format("{} {} ", VerdictBadge(v), n);
      std::vector<std::string> shown(b.models.begin(), b.models.begin() + std::min<size_t>(b.models.size(), 3));
      std::string models = E(Join(shown, ", "));
      if (b.models.size() > shown.size()) models += fmt::format(" and {} more", b.models.size() - shown.size());
      Put(out,
          "<tr><td><code>{}</code></td><td>{}</td><td class=\"num\">{}{}</td><td>{}</td><td class=\"num\">{}</td>"
          "<td>{}</td><td>{} {}</td></tr>\n",
          E(b.op), E(b.dtypes), b.cases, b.new_failures > 0 ? fmt::format(" ({} new)", b.new_failures) : "", verdicts,
          b.worst_error_ratio ? fmt::format("{:.3g}", *b.worst_error_ratio) : "", models,
          CaseLink(b.op, "all"), CaseLink(b.worst_key, "worst"));
    }
    out += "</tbody></table>\n";
    if (report.broken_ops.size() > kMaxRegressionRows) {
      Put(out, "<p class=\"more\">Showing {} of {} groups; the case table has every case.</p>\n",
          kMaxRegressionRows, report.broken_ops.size());
    }
    out += "<p class=\"meta\">Error ratio: the backend's error against the fp64 golden over the CPU reference's "
           "own; 1 is as good as the CPU.</p>\n";
  }
  if (!report.broken_models.empty()) {
    out +=
        "<h3>Models, by the first stage that fails</h3>\n<table id=\"broken-models\"><thead><tr><th>Model</th>"
        "<th>Family</th><th>Stage</th><th>Verdict</th><th>First divergent call</th><th>Error</th></tr></thead>"
        "<tbody>\n";
    size_t rows = 0;
    for (const BrokenModel& m : report.broken_models) {
      if (rows++ == kMaxRegressionRows) break;
      std::string divergent = "<span class=\"empty\">not located</span>";
      if (m.first_divergent) {
        const FirstDivergent& d = *m.first_divergent;
        divergent = fmt::format("call {} <code>{}</code> in <code>{}</code> ({}){}", d.call, E(d.op), E(d.module),
                                E(d.phase), d.error_ratio ? fmt::format(", error ratio {:.3g}", *d.error_ratio) : "");
        if (!d.case_key.empty()) divergent += " " + CaseLink(d.case_key, "op case");
      }
      Put(out,
          "<tr><td><code>{}</code>{}</td><td>{}</td><td>{}:{} {}</td><td>{}</td><td>{}</td><td><pre class=\"error\">"
          "{}</pre></td></tr>\n",
          E(m.model_id), m.is_new ? " <span class=\"badge v-fail\">new</span>" : "", E(FamilyName(m.family)),
          E(m.stage), E(m.item), E(m.profile), VerdictBadge(m.verdict), divergent, E(Shorten(m.error, 600)));
    }
    out += "</tbody></table>\n";
  }
  out += "</section>\n";
}

// ---------------------------------------------------------------- summary

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

// ---------------------------------------------------------------- regressions

void WriteRepro(Out& out, std::string_view repro) {
  if (repro.empty()) return;
  Put(out, "<code class=\"repro\">{}</code> <button type=\"button\" class=\"copy\">Copy</button>", E(repro));
}

void WriteRegressions(Out& out, const Report& report) {
  out += "<section id=\"regressions\">\n<h2>Regressions</h2>\n";
  std::vector<const CaseEntry*> cases;
  for (const CaseEntry& c : report.cases) {
    if (HasRegression(c)) cases.push_back(&c);
  }
  std::vector<std::pair<const ModelEntry*, const ModelItemEntry*>> items;
  for (const ModelEntry& model : report.models) {
    for (const ModelItemEntry& item : model.items) {
      if (IsRegression(item.change)) items.emplace_back(&model, &item);
    }
  }
  if (report.baselines.empty()) {
    out += "<p class=\"empty\">First run: there is no baseline, so nothing can have regressed yet; what fails now "
           "is under <a href=\"#broken\">What is broken</a>.</p>\n</section>\n";
    return;
  }
  if (cases.empty() && items.empty()) {
    out += "<p class=\"empty\">No new failures, drift or performance regressions.</p>\n</section>\n";
    return;
  }
  out +=
      "<table id=\"regression-table\"><thead><tr><th>Op or model</th><th>Case or item</th><th>Change</th>"
      "<th>Detail</th><th>Error</th><th>Repro</th></tr></thead><tbody>\n";
  size_t rows = 0;
  for (const CaseEntry* c : cases) {
    if (rows++ == kMaxRegressionRows) break;
    std::string change(ChangeName(c->change));
    for (const std::string& extra : c->extra_changes) change += ", " + extra;
    Put(out,
        "<tr class=\"{}\"><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td><pre class=\"error\">{}</pre>"
        "</td><td>",
        c->change == Change::kNewFailure ? "new-failure" : "regressed", E(c->op), E(c->summary), E(change),
        E(c->change_detail), E(Shorten(c->error, 2000)));
    WriteRepro(out, c->repro);
    out += "</td></tr>\n";
  }
  for (const auto& [model, item] : items) {
    if (rows++ >= kMaxRegressionRows) break;
    Put(out,
        "<tr class=\"{}\"><td><code>{}</code></td><td>{}:{} {}</td><td>{}</td><td>{}</td><td><pre class=\"error\">{}"
        "</pre></td><td></td></tr>\n",
        item->change == Change::kNewFailure ? "new-failure" : "regressed", E(model->model_id), E(item->stage),
        E(item->item), E(item->profile), E(ChangeName(item->change)), E(item->change_detail),
        E(Shorten(item->error, 2000)));
  }
  out += "</tbody></table>\n";
  const size_t total = cases.size() + items.size();
  if (total > kMaxRegressionRows) {
    Put(out, "<p class=\"more\">Showing {} of {} regressions; the case table below has them all.</p>\n",
        kMaxRegressionRows, total);
  }
  out += "</section>\n";
}

// ---------------------------------------------------------------- matrix

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

// ---------------------------------------------------------------- charts

struct Bar {
  std::string label;
  int64_t count = 0;
  std::string_view colour;
};

// A vertical histogram with a label under each bar and its count above it.
void WriteColumnChart(Out& out, std::string_view id, std::string_view title, const std::vector<Bar>& bars) {
  constexpr double kHeight = 160, kTop = 20, kBottom = 40, kLeft = 10, kSlot = 64, kWidthFraction = 0.7;
  int64_t peak = 1;
  for (const Bar& bar : bars) peak = std::max(peak, bar.count);
  const double width = kLeft * 2 + kSlot * static_cast<double>(bars.size());
  Put(out,
      "<svg id=\"{}\" class=\"chart\" role=\"img\" aria-labelledby=\"{}-title\" width=\"{:.0f}\" height=\"{:.0f}\" "
      "viewBox=\"0 0 {:.0f} {:.0f}\"><title id=\"{}-title\">{}</title>\n",
      id, id, width, kTop + kHeight + kBottom, width, kTop + kHeight + kBottom, id, E(title));
  for (size_t i = 0; i < bars.size(); ++i) {
    const Bar& bar = bars[i];
    const double h = kHeight * static_cast<double>(bar.count) / static_cast<double>(peak);
    const double x = kLeft + kSlot * static_cast<double>(i);
    const double w = kSlot * kWidthFraction;
    Put(out,
        "<g><title>{}: {}</title><rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\"/>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"value\">{}</text><text x=\"{:.1f}\" y=\"{:.1f}\" "
        "class=\"label\">{}</text></g>\n",
        E(bar.label), bar.count, x, kTop + kHeight - h, w, h, bar.colour, x + w / 2, kTop + kHeight - h - 4, bar.count,
        x + w / 2, kTop + kHeight + 16, E(bar.label));
  }
  out += "</svg>\n";
}

void WriteFamilyChart(Out& out, const Report& report) {
  struct Family {
    std::string name;
    int64_t passing = 0, total = 0;
  };
  std::vector<Family> families;
  for (const auto& [family, by_stage] : report.matrix) {
    Family f{FamilyName(family)};
    for (const auto& [stage, counts] : by_stage) {
      f.passing += counts.first;
      f.total += counts.second;
    }
    if (f.total > 0) families.push_back(f);
  }
  out += "<figure>\n<figcaption>Pass rate by family (all stages)</figcaption>\n";
  if (families.empty()) {
    out += "<p class=\"empty\">No results with a model family.</p>\n</figure>\n";
    return;
  }
  std::stable_sort(families.begin(), families.end(),
                   [](const Family& a, const Family& b) { return a.total > b.total; });
  const size_t shown = std::min(families.size(), kMaxFamilyBars);
  constexpr double kLabel = 180, kBarWidth = 360, kRow = 20;
  const double height = kRow * static_cast<double>(shown) + 8;
  Put(out,
      "<svg id=\"family-chart\" class=\"chart\" role=\"img\" aria-labelledby=\"family-chart-title\" width=\"{:.0f}\" "
      "height=\"{:.0f}\" viewBox=\"0 0 {:.0f} {:.0f}\"><title id=\"family-chart-title\">Pass rate by family</title>\n",
      kLabel + kBarWidth + 110, height, kLabel + kBarWidth + 110, height);
  for (size_t i = 0; i < shown; ++i) {
    const Family& f = families[i];
    const double rate = static_cast<double>(f.passing) / static_cast<double>(f.total);
    const double y = kRow * static_cast<double>(i) + 4;
    Put(out,
        "<g><title>{}: {} of {} pass</title><text x=\"{:.0f}\" y=\"{:.1f}\" class=\"family\">{}</text>"
        "<rect x=\"{:.0f}\" y=\"{:.1f}\" width=\"{:.0f}\" height=\"{:.0f}\" class=\"track\"/>"
        "<rect x=\"{:.0f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.0f}\" fill=\"{}\"/>"
        "<text x=\"{:.0f}\" y=\"{:.1f}\" class=\"rate\">{} ({}/{})</text></g>\n",
        E(f.name), f.passing, f.total, kLabel - 6, y + 13, E(Shorten(f.name, 28)), kLabel, y, kBarWidth, kRow - 4,
        kLabel, y, kBarWidth * rate, kRow - 4, RateColour(rate, true), kLabel + kBarWidth + 6, y + 13, Percent(rate),
        f.passing, f.total);
  }
  out += "</svg>\n";
  if (families.size() > shown) {
    Put(out, "<p class=\"more\">The {} largest of {} families.</p>\n", shown, families.size());
  }
  out += "</figure>\n";
}

void WriteErrorChart(Out& out, const Report& report) {
  // Decades of max_rel_err over compared cases; exact zeros and non-finite
  // errors get bars of their own.
  std::map<int, int64_t> decades;
  int64_t zeros = 0, nonfinite = 0;
  for (const CaseEntry& c : report.cases) {
    if (!c.max_rel_err || !c.outcome) continue;
    const double v = std::abs(*c.max_rel_err);
    if (!std::isfinite(v)) {
      ++nonfinite;
    } else if (v == 0) {
      ++zeros;
    } else {
      decades[std::clamp(static_cast<int>(std::floor(std::log10(v))), -20, 20)]++;
    }
  }
  out += "<figure>\n<figcaption>Error distribution: max relative error of compared cases</figcaption>\n";
  if (decades.empty() && zeros == 0 && nonfinite == 0) {
    out += "<p class=\"empty\">No compared cases.</p>\n</figure>\n";
    return;
  }
  std::vector<Bar> bars;
  if (zeros > 0) bars.push_back({"0", zeros, "#3a9d5d"});
  if (!decades.empty()) {
    for (int d = decades.begin()->first; d <= decades.rbegin()->first; ++d) {
      auto it = decades.find(d);
      bars.push_back({fmt::format("1e{}", d), it == decades.end() ? 0 : it->second, d < -4 ? "#5b8ec9" : "#d9a520"});
    }
  }
  if (nonfinite > 0) bars.push_back({"inf/nan", nonfinite, "#c94a3f"});
  WriteColumnChart(out, "error-chart", "Cases by decade of max relative error", bars);
  out += "</figure>\n";
}

void WriteLatencyChart(Out& out, const Report& report) {
  struct Bin {
    double upper;  // ratio (warm / baseline warm) below which a case falls in the bin
    std::string_view label, colour;
  };
  static const Bin kBins[] = {
      {0.5, "<0.5x", "#3a9d5d"},    {0.8, "0.5-0.8x", "#6cb784"},    {0.95, "0.8-0.95x", "#a7d3b3"},
      {1.05, "0.95-1.05x", "#bbb"}, {1.25, "1.05-1.25x", "#e8b7a9"}, {2.0, "1.25-2x", "#db7f6a"},
      {INFINITY, ">2x", "#c94a3f"},
  };
  std::vector<int64_t> counts(std::size(kBins), 0);
  int64_t compared = 0;
  for (const CaseEntry& c : report.cases) {
    if (!c.warm_us || !c.baseline_warm_us || *c.baseline_warm_us <= 0 || *c.warm_us <= 0) continue;
    const double ratio = *c.warm_us / *c.baseline_warm_us;
    if (!std::isfinite(ratio)) continue;
    size_t bin = 0;
    while (bin + 1 < std::size(kBins) && ratio >= kBins[bin].upper) ++bin;
    ++counts[bin];
    ++compared;
  }
  out += "<figure>\n<figcaption>Latency change: warm latency over the baseline's</figcaption>\n";
  if (compared == 0) {
    out += "<p class=\"empty\">No cases with a warm latency in both the run and a baseline.</p>\n</figure>\n";
    return;
  }
  std::vector<Bar> bars;
  for (size_t i = 0; i < std::size(kBins); ++i)
    bars.push_back({std::string(kBins[i].label), counts[i], kBins[i].colour});
  WriteColumnChart(out, "latency-chart", "Cases by ratio of warm latency to the baseline's", bars);
  out += "</figure>\n";
}

void WriteCharts(Out& out, const Report& report) {
  out += "<section id=\"charts\">\n<h2>Charts</h2>\n<div class=\"charts\">\n";
  WriteFamilyChart(out, report);
  WriteErrorChart(out, report);
  WriteLatencyChart(out, report);
  out += "</div>\n</section>\n";
}

// ---------------------------------------------------------------- models

void WriteModels(Out& out, const Report& report) {
  out += "<section id=\"models\">\n<h2>Models</h2>\n";
  if (report.models.empty()) {
    out += "<p class=\"empty\">No model-level results.</p>\n</section>\n";
    return;
  }
  std::set<std::string> stage_set;
  for (const ModelEntry& model : report.models) {
    for (const auto& [stage, verdict] : model.stage_verdict) stage_set.insert(stage);
  }
  const std::vector<std::string> stages = OrderStages(stage_set);
  std::unordered_map<std::string_view, const CaseEntry*> case_by_key;
  for (const CaseEntry& c : report.cases) case_by_key.emplace(c.key, &c);

  out += "<table id=\"model-table\"><thead><tr><th>Model</th><th>Family</th>";
  for (const std::string& stage : stages) Put(out, "<th>{}</th>", E(stage));
  out += "<th class=\"num\">Root-cause cases</th></tr></thead><tbody>\n";
  for (const ModelEntry& model : report.models) {
    Put(out, "<tr class=\"{}\"><td><details><summary>{}</summary>\n", model.failing ? "failing" : "passing",
        E(model.model_id));
    std::vector<const ModelItemEntry*> failing;
    for (const ModelItemEntry& item : model.items) {
      const auto& verdict = item.verdict;
      if (verdict && IsUnexpectedFailure(*verdict) && *verdict != Outcome::kUnexpectedPass) failing.push_back(&item);
    }
    if (failing.empty()) {
      out += "<p class=\"empty\">No failing items.</p>\n";
    } else {
      out +=
          "<h4>Failing items</h4>\n<table "
          "class=\"drill\"><thead><tr><th>Stage</th><th>Item</th><th>Profile</th><th>Verdict</th>"
          "<th>Error</th><th>Blocked by</th></tr></thead><tbody>\n";
      for (const ModelItemEntry* item : failing) {
        Put(out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><pre class=\"error\">{}</pre></td><td>{}</td></tr>\n",
            E(item->stage), E(item->item), E(item->profile), VerdictBadge(item->verdict), E(Shorten(item->error, 2000)),
            E(item->blocked_by));
      }
      out += "</tbody></table>\n";
    }
    if (!model.failing_cases.empty()) {
      out +=
          "<h4>Root-cause op cases</h4>\n<table "
          "class=\"drill\"><thead><tr><th>Key</th><th>Op</th><th>Case</th><th>Verdict</th></tr></thead>"
          "<tbody>\n";
      for (size_t i = 0; i < model.failing_cases.size() && i < kMaxRootCausesPerModel; ++i) {
        const std::string& key = model.failing_cases[i];
        auto it = case_by_key.find(key);
        const CaseEntry* c = it == case_by_key.end() ? nullptr : it->second;
        Put(out, "<tr><td><code>{}</code></td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>\n", E(key),
            c ? E(c->op) : "", c ? E(c->summary) : "", c ? VerdictBadge(c->verdict) : "");
      }
      out += "</tbody></table>\n";
      if (model.failing_cases.size() > kMaxRootCausesPerModel) {
        Put(out, "<p class=\"more\">The first {} of {} root-cause cases; filter the case table by the model id.</p>\n",
            kMaxRootCausesPerModel, model.failing_cases.size());
      }
    }
    Put(out, "</details></td><td>{}</td>", E(FamilyName(model.family)));
    for (const std::string& stage : stages) {
      auto it = model.stage_verdict.find(stage);
      Put(out, "<td>{}</td>", it == model.stage_verdict.end() ? "" : VerdictBadge(it->second));
    }
    Put(out, "<td class=\"num\">{}</td></tr>\n", model.failing_cases.size());
  }
  out += "</tbody></table>\n</section>\n";
}

// ---------------------------------------------------------------- blockers

void WriteBlockers(Out& out, const Report& report) {
  out += "<section id=\"blockers\">\n<h2>Blockers</h2>\n";
  if (report.blockers.empty()) {
    out += "<p class=\"empty\">No failing op case is used by a failing model.</p>\n</section>\n";
    return;
  }
  out +=
      "<p>Failing op cases, ranked by how many failing models use them: fixing the first rows unblocks the most "
      "models.</p>\n<table id=\"blocker-table\"><thead><tr><th class=\"num\">Rank</th><th>Op</th><th>Case</th>"
      "<th>Verdict</th><th class=\"num\">Models blocked</th><th>Models</th></tr></thead><tbody>\n";
  for (size_t i = 0; i < report.blockers.size() && i < kMaxBlockerRows; ++i) {
    const Blocker& b = report.blockers[i];
    std::vector<std::string> names;
    for (size_t m = 0; m < b.models.size() && m < kMaxModelsPerBlocker; ++m) names.push_back(E(b.models[m]));
    std::string models = Join(names, ", ");
    if (b.models.size() > kMaxModelsPerBlocker) {
      models += fmt::format(" and {} more", b.models.size() - kMaxModelsPerBlocker);
    }
    Put(out,
        "<tr><td class=\"num\">{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td class=\"num\">{}</td>"
        "<td>{}</td></tr>\n",
        i + 1, E(b.op), E(b.summary), VerdictBadge(b.verdict), b.models.size(), models);
  }
  out += "</tbody></table>\n";
  if (report.blockers.size() > kMaxBlockerRows) {
    Put(out, "<p class=\"more\">The first {} of {} blockers.</p>\n", kMaxBlockerRows, report.blockers.size());
  }
  out += "</section>\n";
}

// ---------------------------------------------------------------- cases

// Note [Script data]
// The case table's data is JSON inside <script type="application/json">.
// The HTML parser ends that element at the first "</script" whatever the
// JSON means, and "<!--" changes how it gets there, so every <, > and & in
// the JSON is written as a \u escape (they only occur inside strings, where
// the escape means the same). U+2028 and U+2029 are escaped too, so the text
// stays valid if it is ever pasted into script source. Bytes that are not
// UTF-8 become U+FFFD instead of throwing (DumpJson).
std::string ScriptSafeJson(const nlohmann::json& value) {
  const std::string text = DumpJson(value);
  std::string out;
  out.reserve(text.size() + text.size() / 16);
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '<') {
      out += "\\u003c";
    } else if (c == '>') {
      out += "\\u003e";
    } else if (c == '&') {
      out += "\\u0026";
    } else if (c == '\xE2' && i + 2 < text.size() && text[i + 1] == '\x80' &&
               (text[i + 2] == '\xA8' || text[i + 2] == '\xA9')) {
      out += text[i + 2] == '\xA8' ? "\\u2028" : "\\u2029";
      i += 2;
    } else {
      out += c;
    }
  }
  return out;
}

nlohmann::json OptionalNumber(const std::optional<double>& value) {
  if (!value) return nullptr;
  return DoubleToJson(*value);
}

// The columns of the case table: field name in the JSON rows, heading, and
// whether it sorts as a number.
struct Column {
  std::string_view field, heading;
  bool numeric;
};
constexpr Column kCaseColumns[] = {
    {"op", "Op", false},
    {"summary", "Case", false},
    {"dtypes", "Dtypes", false},
    {"verdict", "Verdict", false},
    {"change", "Change", false},
    {"max_abs_err", "Max abs error", true},
    {"max_rel_err", "Max rel error", true},
    {"warm_us", "Warm (us)", true},
    {"baseline_warm_us", "Baseline warm (us)", true},
    {"attempts", "Attempts", true},
    {"model_count", "Models", true},
};

nlohmann::json CaseData(const Report& report) {
  nlohmann::json fields = nlohmann::json::array();
  for (std::string_view name : {"op",
                                "summary",
                                "dtypes",
                                "verdict",
                                "change",
                                "max_abs_err",
                                "max_rel_err",
                                "warm_us",
                                "baseline_warm_us",
                                "attempts",
                                "model_count",
                                "key",
                                "run_id",
                                "outcome",
                                "expectation",
                                "error",
                                "models",
                                "families",
                                "opinfos",
                                "extra_changes",
                                "change_detail",
                                "baseline_outcome",
                                "flaky",
                                "attempt_outcomes",
                                "counters_json",
                                "repro",
                                "first_call_us",
                                "warm_spread_us",
                                "mismatch_frac",
                                "cosine"}) {
    fields.push_back(name);
  }
  nlohmann::json rows = nlohmann::json::array();
  for (const CaseEntry& c : report.cases) {
    rows.push_back(nlohmann::json::array({
        c.op,
        c.summary,
        c.dtypes,
        ShownVerdict(c),
        ChangeName(c.change),
        OptionalNumber(c.max_abs_err),
        OptionalNumber(c.max_rel_err),
        OptionalNumber(c.warm_us),
        OptionalNumber(c.baseline_warm_us),
        c.attempts,
        c.models.size(),
        c.key,
        c.run_id,
        OutcomeNameOrEmpty(c.outcome),
        c.expectation,
        c.error,
        Join(c.models, ", "),
        Join(c.families, ", "),
        Join(c.opinfos, ", "),
        c.extra_changes,
        c.change_detail,
        OutcomeNameOrEmpty(c.baseline_outcome),
        c.flaky,
        c.attempt_outcomes,
        c.counters_json,
        c.repro,
        OptionalNumber(c.first_call_us),
        OptionalNumber(c.warm_spread_us),
        OptionalNumber(c.mismatch_frac),
        OptionalNumber(c.cosine),
    }));
  }
  return nlohmann::json{{"fields", std::move(fields)}, {"cases", std::move(rows)}, {"page_size", kCasePageSize}};
}

void WriteCases(Out& out, const Report& report) {
  out += "<section id=\"cases\">\n<h2>Cases</h2>\n";
  std::set<std::string> verdicts, changes;
  for (const CaseEntry& c : report.cases) {
    verdicts.insert(ShownVerdict(c));
    changes.insert(std::string(ChangeName(c.change)));
    changes.insert(c.extra_changes.begin(), c.extra_changes.end());
  }
  out +=
      "<div class=\"controls\"><label>Filter <input id=\"case-filter\" type=\"search\" "
      "placeholder=\"op, case, error or model\" autocomplete=\"off\"></label>\n"
      "<label>Verdict <select id=\"verdict-filter\"><option value=\"\">any</option>";
  for (const std::string& verdict : verdicts) Put(out, "<option value=\"{}\">{}</option>", E(verdict), E(verdict));
  out += "</select></label>\n<label>Change <select id=\"change-filter\"><option value=\"\">any</option>";
  for (const std::string& change : changes) Put(out, "<option value=\"{}\">{}</option>", E(change), E(change));
  Put(out,
      "</select></label>\n<span id=\"case-count\" aria-live=\"polite\">{} of {} cases</span></div>\n"
      "<table id=\"case-table\"><thead><tr><th class=\"expand\"><span class=\"hidden\">Details</span></th>",
      report.cases.size(), report.cases.size());
  for (const Column& column : kCaseColumns) {
    Put(out, "<th class=\"sortable{}\" data-field=\"{}\" data-type=\"{}\" aria-sort=\"none\" tabindex=\"0\">{}</th>",
        column.numeric ? " num" : "", column.field, column.numeric ? "number" : "text", column.heading);
  }
  out +=
      "</tr></thead><tbody></tbody></table>\n"
      "<noscript><p>The case table needs script; the same data is in the JSON block of this file.</p></noscript>\n"
      "<div class=\"pager\"><button type=\"button\" id=\"page-prev\">Previous</button> <span id=\"page-info\"></span> "
      "<button type=\"button\" id=\"page-next\">Next</button></div>\n";
  Put(out, "<script type=\"application/json\" id=\"case-data\">{}</script>\n</section>\n",
      ScriptSafeJson(CaseData(report)));
}

// ---------------------------------------------------------------- page

constexpr std::string_view kStyle = R"css(
:root { --fg: #1d2329; --muted: #5d6873; --line: #d8dde3; --bg: #fff; --soft: #f4f6f8;
  --pass: #2f8a4f; --fail: #c0392b; --xfail: #8e6bb8; --xpass: #c77c00; --skip: #7a8691; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: var(--bg);
  margin: 0 auto; max-width: 1400px; padding: 16px 24px 48px; }
h1 { font-size: 22px; margin: 4px 0; word-break: break-all; }
h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 15px; margin: 16px 0 6px; }
h4 { font-size: 13px; margin: 8px 0 2px; }
code, pre { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12px; }
pre.error { white-space: pre-wrap; word-break: break-word; margin: 0; max-height: 12em; overflow: auto; }
.meta, .empty, .more { color: var(--muted); }
.verdict { font-weight: 600; padding: 6px 10px; border-radius: 4px; display: inline-block; }
.verdict.bad { background: #fbe3e0; color: var(--fail); }
.verdict.good { background: #e1f3e7; color: var(--pass); }
nav a { margin-right: 12px; }
ol.pipeline { list-style: none; padding: 0; margin: 8px 0; display: flex; flex-wrap: wrap; gap: 6px; }
ol.pipeline li { background: var(--soft); border: 1px solid var(--line); border-radius: 4px; padding: 4px 10px; }
ol.pipeline li + li::before { content: "\2192  "; color: var(--muted); }
.lede { font-size: 15px; font-weight: 600; }
#broken-models pre.error { min-width: 28em; }
table { border-collapse: collapse; margin: 6px 0; width: 100%; }
th, td { border-bottom: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
thead th { background: var(--soft); }
#case-table thead th { position: sticky; top: 0; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; }
.card { border: 1px solid var(--line); border-top: 4px solid var(--line); border-radius: 6px; padding: 8px 14px;
  min-width: 180px; }
.card h3 { margin: 0; }
.card .rate { font-size: 26px; font-weight: 600; margin: 2px 0; }
.card ul { list-style: none; padding: 0; margin: 4px 0 0; }
.card.small { min-width: 110px; text-align: center; border-top-width: 1px; }
.card.small p { margin: 2px 0; }
.card.small .count { font-size: 22px; font-weight: 600; }
.card.bad { background: #fbe3e0; }
.card.warn { background: #fff1d6; }
.badge { display: inline-block; padding: 0 6px; border-radius: 3px; font-size: 12px; color: #fff; }
.v-pass { background: var(--pass); } .v-fail { background: var(--fail); } .v-xfail { background: var(--xfail); }
.v-xpass { background: var(--xpass); } .v-skip { background: var(--skip); } .v-none { background: #aaa; }
tr.new-failure td:first-child { border-left: 4px solid var(--fail); }
tr.regressed td:first-child { border-left: 4px solid var(--xpass); }
td.cell { text-align: center; font-variant-numeric: tabular-nums; }
.charts { display: flex; flex-wrap: wrap; gap: 24px; }
figure { margin: 0; }
figcaption { font-weight: 600; margin-bottom: 4px; }
svg.chart text { font-size: 11px; fill: var(--fg); }
svg.chart text.value, svg.chart text.label { text-anchor: middle; }
svg.chart text.family { text-anchor: end; }
svg.chart rect.track { fill: var(--soft); }
details summary { cursor: pointer; font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12px; }
table.drill { margin: 6px 0 10px; font-size: 12px; }
.controls { display: flex; flex-wrap: wrap; gap: 16px; align-items: center; margin: 8px 0; }
#case-filter { width: 320px; }
th.sortable { cursor: pointer; user-select: none; white-space: nowrap; }
th.sortable[aria-sort="ascending"]::after { content: " \25B2"; }
th.sortable[aria-sort="descending"]::after { content: " \25BC"; }
tr.case-detail td { background: var(--soft); }
tr.case-detail dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 4px 0; }
tr.case-detail dt { color: var(--muted); }
tr.case-detail dd { margin: 0; }
button.toggle { border: 1px solid var(--line); background: var(--bg); border-radius: 3px; width: 22px; cursor: pointer; }
.hidden { position: absolute; left: -10000px; }
.pager { margin: 8px 0; }
)css";

// Builds the case table from the JSON block; see Note [Self-contained report]
// for why nothing here turns data into markup.
constexpr std::string_view kScript = R"js(
(function () {
  'use strict';
  const data = JSON.parse(document.getElementById('case-data').textContent);
  const F = {};
  data.fields.forEach(function (name, i) { F[name] = i; });
  const rows = data.cases;
  const pageSize = data.page_size;
  const haystack = rows.map(function (r) {
    return [r[F.op], r[F.summary], r[F.error], r[F.models], r[F.key]].join('\n').toLowerCase();
  });
  const table = document.getElementById('case-table');
  const tbody = table.tBodies[0];
  const headers = Array.prototype.slice.call(table.tHead.rows[0].cells);
  const filterBox = document.getElementById('case-filter');
  const verdictSelect = document.getElementById('verdict-filter');
  const changeSelect = document.getElementById('change-filter');
  const countLabel = document.getElementById('case-count');
  const pageInfo = document.getElementById('page-info');
  const prev = document.getElementById('page-prev');
  const next = document.getElementById('page-next');
  let order = rows.map(function (_, i) { return i; });
  let visible = order;
  let page = 0;
  let sortField = null;
  let sortDirection = 1;
  const open = new Set();

  function asNumber(v) {
    if (typeof v === 'number') return v;
    if (v === 'inf') return Infinity;
    if (v === '-inf') return -Infinity;
    if (v === 'nan') return NaN;
    return null;
  }
  function formatNumber(v, field) {
    const n = asNumber(v);
    if (n === null) return '';
    if (!isFinite(n)) return String(v);
    if (field === 'attempts' || field === 'model_count') return String(n);
    if (field === 'warm_us' || field === 'baseline_warm_us') return n.toFixed(1);
    const magnitude = Math.abs(n);
    return magnitude !== 0 && (magnitude < 1e-3 || magnitude >= 1e5) ? n.toExponential(2) : String(+n.toPrecision(3));
  }
  function text(tag, content, className) {
    const node = document.createElement(tag);
    node.textContent = content;
    if (className) node.className = className;
    return node;
  }
  function verdictClass(v) {
    if (v === 'pass') return 'v-pass';
    if (v === 'expected_failure') return 'v-xfail';
    if (v === 'unexpected_pass') return 'v-xpass';
    if (v === 'skipped') return 'v-skip';
    return 'v-fail';
  }
  function copy(textToCopy, button) {
    const done = function () { button.textContent = 'Copied'; };
    const fail = function () { button.textContent = 'Select and copy'; };
    try {
      if (navigator.clipboard && navigator.clipboard.writeText) {
        navigator.clipboard.writeText(textToCopy).then(done, fail);
      } else {
        fail();
      }
    } catch (e) {
      fail();
    }
  }
  function detailRow(r) {
    const tr = document.createElement('tr');
    tr.className = 'case-detail';
    const td = document.createElement('td');
    td.colSpan = headers.length;
    const dl = document.createElement('dl');
    function item(label, value, pre) {
      if (value === null || value === undefined || value === '' ||
          (Array.isArray(value) && value.length === 0)) return;
      dl.appendChild(text('dt', label));
      const dd = document.createElement('dd');
      dd.appendChild(text(pre ? 'pre' : 'span', Array.isArray(value) ? value.join(', ') : String(value),
                          pre ? 'error' : ''));
      dl.appendChild(dd);
    }
    item('Key', r[F.key]);
    item('Run', r[F.run_id]);
    item('Outcome', r[F.outcome]);
    item('Expectation', r[F.expectation]);
    item('Error', r[F.error], true);
    item('Change', r[F.change_detail]);
    item('Also', r[F.extra_changes]);
    item('Baseline outcome', r[F.baseline_outcome]);
    let attempts = String(r[F.attempts]);
    if (r[F.attempt_outcomes]) attempts += ' (' + r[F.attempt_outcomes] + ')';
    if (r[F.flaky]) attempts += ', flaky';
    item('Attempts', attempts);
    item('First call (us)', formatNumber(r[F.first_call_us], 'warm_us'));
    item('Warm spread (us)', formatNumber(r[F.warm_spread_us], 'warm_us'));
    item('Mismatch fraction', formatNumber(r[F.mismatch_frac]));
    item('Cosine', formatNumber(r[F.cosine]));
    let counters = r[F.counters_json];
    if (counters) {
      try { counters = JSON.stringify(JSON.parse(counters), null, 1); } catch (e) { /* shown as stored */ }
    }
    item('Counters', counters, true);
    item('Models', r[F.models]);
    item('Families', r[F.families]);
    item('OpInfo samples', r[F.opinfos]);
    if (r[F.repro]) {
      dl.appendChild(text('dt', 'Repro'));
      const dd = document.createElement('dd');
      const code = text('code', r[F.repro], 'repro');
      const button = text('button', 'Copy', 'copy');
      button.type = 'button';
      button.addEventListener('click', function () { copy(code.textContent, button); });
      dd.appendChild(code);
      dd.appendChild(document.createTextNode(' '));
      dd.appendChild(button);
      dl.appendChild(dd);
    }
    td.appendChild(dl);
    tr.appendChild(td);
    return tr;
  }
  function render() {
    const pages = Math.max(1, Math.ceil(visible.length / pageSize));
    page = Math.min(page, pages - 1);
    const start = page * pageSize;
    const fragment = document.createDocumentFragment();
    visible.slice(start, start + pageSize).forEach(function (index) {
      const r = rows[index];
      const tr = document.createElement('tr');
      tr.className = 'case-row';
      const toggleCell = document.createElement('td');
      const toggle = text('button', open.has(index) ? '-' : '+', 'toggle');
      toggle.type = 'button';
      toggle.setAttribute('aria-expanded', open.has(index) ? 'true' : 'false');
      toggle.setAttribute('aria-label', 'Details');
      toggle.addEventListener('click', function () {
        if (open.has(index)) open.delete(index); else open.add(index);
        render();
      });
      toggleCell.appendChild(toggle);
      tr.appendChild(toggleCell);
      headers.slice(1).forEach(function (th) {
        const field = th.dataset.field;
        const value = r[F[field]];
        if (th.dataset.type === 'number') {
          tr.appendChild(text('td', formatNumber(value, field), 'num'));
        } else if (field === 'verdict') {
          const td = document.createElement('td');
          td.appendChild(text('span', value, 'badge ' + verdictClass(value)));
          tr.appendChild(td);
        } else if (field === 'op') {
          const td = document.createElement('td');
          td.appendChild(text('code', value));
          tr.appendChild(td);
        } else {
          tr.appendChild(text('td', value));
        }
      });
      fragment.appendChild(tr);
      if (open.has(index)) fragment.appendChild(detailRow(r));
    });
    tbody.textContent = '';
    tbody.appendChild(fragment);
    countLabel.textContent = visible.length + ' of ' + rows.length + ' cases';
    pageInfo.textContent = 'page ' + (page + 1) + ' of ' + pages;
    prev.disabled = page === 0;
    next.disabled = page >= pages - 1;
  }
  function applyFilters() {
    const query = filterBox.value.trim().toLowerCase();
    const verdict = verdictSelect.value;
    const change = changeSelect.value;
    visible = order.filter(function (i) {
      const r = rows[i];
      if (verdict && r[F.verdict] !== verdict) return false;
      if (change && r[F.change] !== change && r[F.extra_changes].indexOf(change) < 0) return false;
      return !query || haystack[i].indexOf(query) >= 0;
    });
    render();
  }
  function compare(field, numeric) {
    const column = F[field];
    return function (a, b) {
      let x = rows[a][column], y = rows[b][column];
      if (numeric) {
        x = asNumber(x); y = asNumber(y);
        if (x !== null && isNaN(x)) x = Infinity;
        if (y !== null && isNaN(y)) y = Infinity;
        // Cases without the value go last in both directions.
        if (x === null || y === null) return x === y ? a - b : (x === null ? 1 : -1);
        if (x !== y) return x < y ? -sortDirection : sortDirection;
        return a - b;
      }
      x = String(x); y = String(y);
      if (x !== y) return x < y ? -sortDirection : sortDirection;
      return a - b;
    };
  }
  function sortBy(th) {
    const field = th.dataset.field;
    if (sortField === field) {
      sortDirection = -sortDirection;
    } else {
      sortField = field;
      sortDirection = 1;
    }
    order = rows.map(function (_, i) { return i; });
    order.sort(compare(field, th.dataset.type === 'number'));
    headers.forEach(function (h) {
      if (!h.dataset.field) return;
      h.setAttribute('aria-sort', h === th ? (sortDirection > 0 ? 'ascending' : 'descending') : 'none');
    });
    page = 0;
    applyFilters();
  }
  headers.forEach(function (th) {
    if (!th.dataset.field) return;
    th.addEventListener('click', function () { sortBy(th); });
    th.addEventListener('keydown', function (event) {
      if (event.key === 'Enter' || event.key === ' ') {
        event.preventDefault();
        sortBy(th);
      }
    });
  });
  filterBox.addEventListener('input', function () { page = 0; applyFilters(); });
  verdictSelect.addEventListener('change', function () { page = 0; applyFilters(); });
  changeSelect.addEventListener('change', function () { page = 0; applyFilters(); });
  prev.addEventListener('click', function () { page -= 1; render(); });
  next.addEventListener('click', function () { page += 1; render(); });
  document.querySelectorAll('code.repro + button.copy').forEach(function (button) {
    button.addEventListener('click', function () { copy(button.previousElementSibling.textContent, button); });
  });
  // Note [Case links]: "#case-filter=<percent-encoded text>" (the links of
  // "What is broken") fills the case filter and shows the case table.
  function followCaseLink() {
    const prefix = '#case-filter=';
    if (location.hash.indexOf(prefix) !== 0) return false;
    let wanted = '';
    try {
      wanted = decodeURIComponent(location.hash.slice(prefix.length));
    } catch (e) {
      return false;
    }
    filterBox.value = wanted;
    verdictSelect.value = '';
    changeSelect.value = '';
    page = 0;
    applyFilters();
    document.getElementById('cases').scrollIntoView();
    return true;
  }
  window.addEventListener('hashchange', followCaseLink);
  if (!followCaseLink()) applyFilters();
})();
)js";

}  // namespace

std::string ReportToHtml(const Report& report) {
  Out out;
  out.reserve(64 * 1024 + report.cases.size() * 400);
  Put(out,
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
      "script-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<meta name=\"generator\" content=\"coverage\">\n<title>{}</title>\n<style>{}</style>\n</head>\n<body>\n",
      E(report.title), kStyle);
  WriteHeader(out, report);
  out += "<main>\n";
  WriteBroken(out, report);
  WriteSummary(out, report);
  WriteRegressions(out, report);
  WriteMatrix(out, report);
  WriteCharts(out, report);
  WriteModels(out, report);
  WriteBlockers(out, report);
  WriteCases(out, report);
  WriteRuns(out, report);
  Put(out, "</main>\n<script>{}</script>\n</body>\n</html>\n", kScript);
  return out;
}

}  // namespace coverage::reports
