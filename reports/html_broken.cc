// The sections on what fails: "What is broken" (what fails now, whatever the
// baseline; Note [What is broken] in build_finish.cc) and "Regressions" (what
// got worse since the baseline, each with its repro command).
#include <fmt/core.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "reports/html_parts.h"

namespace coverage::reports::html {
namespace {

std::string CaseLink(std::string_view filter, std::string_view label) {
  // The case table's script reads "#case-filter=<text>" (Note [Case links] in
  // reports/assets/report.js).
  return fmt::format("<a class=\"case-link\" href=\"#case-filter={}\">{}</a>", E(PercentEncode(filter)), E(label));
}

void WriteRepro(Out& out, std::string_view repro) {
  if (repro.empty()) return;
  Put(out, "<code class=\"repro\">{}</code> <button type=\"button\" class=\"copy\">Copy</button>", E(repro));
}

// Flaky: what answered differently when it ran again (a rerun, or a warm
// call; Note [Warm calls judged]), named with its op or call.
void WriteFlaky(Out& out, const Report& report) {
  std::vector<std::string> names;
  int64_t cases = 0, items = 0;
  for (const CaseEntry& c : report.cases) {
    if (c.change == Change::kRemoved || !c.result || !c.result->flaky) continue;
    ++cases;
    if (names.size() < 8) names.push_back(CaseLink(c.key, c.op));
  }
  for (const ModelEntry& model : report.models) {
    for (const ModelItemEntry& item : model.items) {
      if (!item.result || !item.result->result.flaky) continue;
      ++items;
      if (names.size() < 8) names.push_back(fmt::format("<code>{}</code> {}:{}", E(model.model_id), E(item.result->stage),
                                                        E(item.result->result.item)));
    }
  }
  if (cases + items == 0) return;
  Put(out,
      "<p class=\"flaky-summary\"><span class=\"badge v-flaky\">flaky</span> {} op cases and {} model items "
      "answered differently when run again: {}{}.</p>\n",
      cases, items, Join(names, ", "), cases + items > static_cast<int64_t>(names.size()) ? ", ..." : "");
}

}  // namespace

void WriteBroken(Out& out, const Report& report) {
  out += "<section id=\"broken\">\n<h2>What is broken</h2>\n";
  int64_t failing_cases = 0;
  for (const BrokenOp& b : report.broken_ops) failing_cases += b.cases;
  if (report.broken_ops.empty() && report.broken_models.empty()) {
    out += "<p class=\"empty\">Nothing fails unexpectedly: every judged op case and model passes or fails as "
           "expected.</p>\n";
    WriteFlaky(out, report);
    out += "</section>\n";
    return;
  }
  Put(out, "<p class=\"lede\">{} op cases of {} op and dtype groups and {} models fail now{}.</p>\n", failing_cases,
      report.broken_ops.size(), report.broken_models.size(),
      report.baselines.empty() ? " (first run: no baseline, so nothing is marked new)" : "");
  WriteFlaky(out, report);
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
      // Note [What is broken]: the call, or in words why none is named.
      std::string divergent = fmt::format(
          "<span class=\"empty\">{}</span>",
          E(m.locate_note.empty() ? "no call named: the stage does not search for one (see the error)" : m.locate_note));
      if (m.first_divergent) {
        const FirstDivergent& d = *m.first_divergent;
        divergent = fmt::format("{}call {} <code>{}</code> in <code>{}</code> ({}){}", d.died_in ? "died in " : "",
                                d.call, E(d.op), E(d.module), E(d.phase),
                                d.error_ratio ? fmt::format(", error ratio {:.3g}", *d.error_ratio) : "");
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

void WriteLacks(Out& out, const Report& report) {
  out += "<section id=\"lacks\">\n<h2>What this backend lacks</h2>\n";
  if (report.cases.empty()) {
    out += "<p class=\"empty\">No op cases in this report: the unit stage says which kernels the backend "
           "lacks.</p>\n</section>\n";
    return;
  }
  if (report.lacks.empty()) {
    out += "<p class=\"empty\">Every judged op case ran on the backend itself: no kernel missing, no host fallback "
           "counted.</p>\n</section>\n";
    return;
  }
  int64_t missing = 0, fallback = 0;
  for (const OpSupport& s : report.lacks) (s.unsupported > 0 ? missing : fallback) += 1;
  Put(out,
      "<p class=\"lede\">{} op and dtype groups have a case the backend has no kernel for (N: none ran, partly: "
      "some did not); {} more ran, some of their cases through the backend's host fallback (its counters).</p>\n",
      missing, fallback);
  auto table = [&](bool with_missing) {
    out += "<table class=\"lacks\"><thead><tr><th>Op</th><th>Dtypes</th><th>Support</th>"
           "<th class=\"num\">Unsupported</th><th class=\"num\">On the host</th><th class=\"num\">Judged</th>"
           "<th>Missing kernel</th><th>Cases</th></tr></thead><tbody>\n";
    size_t rows = 0;
    for (const OpSupport& s : report.lacks) {
      if ((s.unsupported > 0) != with_missing) continue;
      if (rows++ == kMaxRegressionRows) break;
      Put(out,
          "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>"
          "<td class=\"num\">{}</td><td><code>{}</code></td><td>{} {}</td></tr>\n",
          E(s.op), E(s.dtypes), E(s.Support()), s.unsupported, s.fallback, s.cases, E(s.missing),
          CaseLink(s.op, "all"), CaseLink(s.example_key, "one"));
    }
    out += "</tbody></table>\n";
    if (rows > kMaxRegressionRows) Put(out, "<p class=\"more\">Showing {} groups; the case table has every case.</p>\n",
                                       kMaxRegressionRows);
  };
  if (missing > 0) table(true);
  if (fallback > 0) {
    Put(out, "<details><summary>{} groups ran through the host fallback</summary>\n", fallback);
    table(false);
    out += "</details>\n";
  }
  out += "</section>\n";
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
        E(c->change_detail), E(Shorten(c->ResultOrEmpty().error, 2000)));
    WriteRepro(out, c->repro);
    out += "</td></tr>\n";
  }
  for (const auto& [model, item] : items) {
    if (rows++ >= kMaxRegressionRows) break;
    const registry::ModelResultRecord& record = item->Record();
    Put(out,
        "<tr class=\"{}\"><td><code>{}</code></td><td>{}:{} {}</td><td>{}</td><td>{}</td><td><pre class=\"error\">{}"
        "</pre></td><td></td></tr>\n",
        item->change == Change::kNewFailure ? "new-failure" : "regressed", E(model->model_id), E(record.stage),
        E(record.result.item), E(record.profile), E(ChangeName(item->change)), E(item->change_detail),
        E(Shorten(record.result.error, 2000)));
  }
  out += "</tbody></table>\n";
  const size_t total = cases.size() + items.size();
  if (total > kMaxRegressionRows) {
    Put(out, "<p class=\"more\">Showing {} of {} regressions; the case table below has them all.</p>\n",
        kMaxRegressionRows, total);
  }
  out += "</section>\n";
}

}  // namespace coverage::reports::html
