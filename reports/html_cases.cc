// The case table: static controls and headings, and every case as JSON that
// the report's script (reports/assets/report.js) draws a page at a time.
#include <fmt/core.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "core/json_double.h"
#include "reports/html_parts.h"

namespace coverage::reports::html {
namespace {

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
    const CaseResult& r = c.ResultOrEmpty();
    rows.push_back(nlohmann::json::array({
        c.op,
        c.summary,
        c.dtypes,
        ShownVerdict(c),
        ChangeName(c.change),
        OptionalNumber(r.max_abs_err),
        OptionalNumber(r.max_rel_err),
        OptionalNumber(r.warm_us),
        OptionalNumber(c.baseline ? c.baseline->warm_us : std::nullopt),
        r.attempts,
        c.models.size(),
        c.key,
        c.run_id,
        OutcomeNameOrEmpty(OutcomeOf(c.result)),
        c.expectation,
        r.error,
        Join(c.models, ", "),
        Join(c.families, ", "),
        Join(c.opinfos, ", "),
        c.extra_changes,
        c.change_detail,
        OutcomeNameOrEmpty(OutcomeOf(c.baseline)),
        r.flaky,
        r.AttemptOutcomesText(),
        r.CountersText(),
        c.repro,
        OptionalNumber(r.first_call_us),
        OptionalNumber(r.warm_spread_us),
        OptionalNumber(r.mismatch_frac),
        OptionalNumber(r.cosine),
    }));
  }
  return nlohmann::json{{"fields", std::move(fields)}, {"cases", std::move(rows)}, {"page_size", kCasePageSize}};
}

}  // namespace

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

}  // namespace coverage::reports::html
