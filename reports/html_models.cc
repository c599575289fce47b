// The model sections: every model with a drill-down to its failing items and
// the root-cause op cases, and the blockers, failing op cases ranked by the
// failing models they block.
#include <fmt/core.h>

#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "reports/html_parts.h"

namespace coverage::reports::html {

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
        const registry::ModelResultRecord& record = item->Record();
        Put(out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><pre class=\"error\">{}</pre></td><td>{}</td></tr>\n",
            E(record.stage), E(record.result.item), E(record.profile), VerdictBadge(item->verdict),
            E(Shorten(record.result.error, 2000)), E(record.blocked_by));
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

}  // namespace coverage::reports::html
