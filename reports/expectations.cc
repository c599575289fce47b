#include "reports/expectations.h"

#include <fnmatch.h>

#include <algorithm>
#include <array>

#include <nlohmann/json.hpp>

#include "core/json_capped.h"
#include "core/op_case.h"
#include "core/outcome.h"

namespace coverage::reports {
namespace {

using nlohmann::json;

constexpr std::array<std::string_view, 4> kStages = {"unit", "module", "model", "train"};
constexpr std::array<std::string_view, 2> kCommentKeys = {"_comment", "comment"};

bool IsCommentKey(std::string_view key) {
  return std::find(kCommentKeys.begin(), kCommentKeys.end(), key) != kCommentKeys.end();
}

// Errors name where the bad value is: "<source>: expected_failures[3].reason: ...".
Status Bad(std::string_view source, std::string_view where, std::string_view what) {
  return Status::InvalidArgument(std::string(source) + ": " + std::string(where) + ": " + std::string(what));
}

// An outcome an expectation may list: one that fails unexpectedly when no
// expectation covers it. pass, skipped and the verdict names are not.
bool IsExpectableOutcome(Outcome o) {
  return IsUnexpectedFailure(o) && o != Outcome::kUnexpectedPass && o != Outcome::kExpectedFailure;
}

Result<Expectation> ParseEntry(const json& e, std::string_view source, const std::string& where) {
  if (!e.is_object()) return Bad(source, where, "an entry must be an object");
  Expectation x;
  const std::pair<std::string_view, std::string*> kStrings[] = {
      {"stage", &x.stage}, {"op", &x.op},       {"key", &x.key},       {"dtype", &x.dtype},
      {"model", &x.model}, {"item", &x.item},   {"reason", &x.reason},
  };
  for (const auto& [key, value] : e.items()) {
    const std::string at = where + "." + key;
    if (IsCommentKey(key)) continue;
    if (key == "outcomes") {
      if (!value.is_array()) return Bad(source, at, "must be an array of outcome names");
      for (const auto& o : value) {
        if (!o.is_string()) return Bad(source, at, "must be an array of outcome names");
        const std::string name = o.get<std::string>();
        auto outcome = OutcomeFromName(name);
        if (!outcome) return Bad(source, at, "'" + name + "' is not an outcome");
        if (!IsExpectableOutcome(*outcome)) {
          return Bad(source, at, "'" + name + "' is not a failing outcome (mismatch, error, crash, ...)");
        }
        x.outcomes.push_back(*outcome);
      }
      continue;
    }
    auto field = std::find_if(std::begin(kStrings), std::end(kStrings), [&name = key](const auto& p) { return p.first == name; });
    if (field == std::end(kStrings)) {
      return Bad(source, at,
                 "unknown key (stage, op, key, dtype, model, item, outcomes, reason, _comment)");
    }
    if (!value.is_string()) return Bad(source, at, "must be a string");
    *field->second = value.get<std::string>();
  }
  if (x.reason.empty()) return Bad(source, where + ".reason", "missing or empty: every expectation says why it fails");
  if (!x.stage.empty() && std::find(kStages.begin(), kStages.end(), x.stage) == kStages.end()) {
    return Bad(source, where + ".stage", "'" + x.stage + "' is not a stage (unit, module, model, train)");
  }
  if (!x.dtype.empty() && !DTypeFromName(x.dtype)) {
    return Bad(source, where + ".dtype", "'" + x.dtype + "' is not a dtype (f32, bf16, i64, ...)");
  }
  const bool unit_keys = !x.op.empty() || !x.key.empty() || !x.dtype.empty();
  const bool model_keys = !x.model.empty() || !x.item.empty();
  if (unit_keys && model_keys) {
    return Bad(source, where, "op/key/dtype select op cases and model/item select model items; an entry has one kind");
  }
  if (unit_keys && !x.stage.empty() && x.stage != "unit") {
    return Bad(source, where + ".stage", "op/key/dtype select op cases, which only the unit stage has");
  }
  if (model_keys && x.stage == "unit") {
    return Bad(source, where + ".stage", "model/item select module, model or train items, not unit cases");
  }
  return x;
}

// "aten::mm" covers every overload of aten::mm; "aten::mm.out" only that one.
bool OpMatches(std::string_view pattern, std::string_view op_qualified) {
  if (pattern == op_qualified) return true;
  const size_t colons = pattern.rfind("::");
  const std::string_view name = colons == std::string_view::npos ? pattern : pattern.substr(colons + 2);
  if (name.find('.') != std::string_view::npos) return false;  // an overload was named
  return op_qualified.size() > pattern.size() && op_qualified.substr(0, pattern.size()) == pattern &&
         op_qualified[pattern.size()] == '.';
}

}  // namespace

Result<Expectations> Expectations::FromJson(std::string_view text, std::string_view source) {
  COV_ASSIGN_OR_RETURN(json doc, ParseJsonText(text, source));
  if (!doc.is_object()) return Bad(source, "top level", "must be an object {\"backend\": ..., \"expected_failures\": [...]}");
  Expectations out;
  out.source = std::string(source);
  for (const auto& [key, value] : doc.items()) {
    if (IsCommentKey(key)) continue;
    if (key == "backend") {
      if (!value.is_string()) return Bad(source, "backend", "must be a string");
      out.backend = value.get<std::string>();
    } else if (key == "expected_failures") {
      if (!value.is_array()) return Bad(source, "expected_failures", "must be an array");
      for (size_t i = 0; i < value.size(); ++i) {
        auto entry = ParseEntry(value[i], source, "expected_failures[" + std::to_string(i) + "]");
        if (!entry) return entry.error();
        out.entries.push_back(std::move(*entry));
      }
    } else {
      return Bad(source, key, "unknown key (backend, expected_failures, _comment)");
    }
  }
  return out;
}

bool Expectation::Lists(Outcome outcome) const {
  return outcomes.empty() || std::find(outcomes.begin(), outcomes.end(), outcome) != outcomes.end();
}

const Expectation* Expectations::MatchCase(std::string_view op_qualified, std::string_view key,
                                           const std::vector<std::string>& dtypes,
                                           std::optional<Outcome> outcome) const {
  const Expectation* first = nullptr;
  for (const Expectation& e : entries) {
    if (!e.stage.empty() && e.stage != "unit") continue;
    if (!e.model.empty() || !e.item.empty()) continue;
    if (!e.op.empty() && !OpMatches(e.op, op_qualified)) continue;
    if (!e.key.empty() && e.key != key) continue;
    if (!e.dtype.empty() && std::find(dtypes.begin(), dtypes.end(), e.dtype) == dtypes.end()) continue;
    if (!outcome || e.Lists(*outcome)) return &e;
    if (first == nullptr) first = &e;
  }
  return first;
}

const Expectation* Expectations::MatchModelItem(std::string_view stage, std::string_view model_id,
                                                std::string_view item, std::optional<Outcome> outcome) const {
  const std::string model(model_id);
  const Expectation* first = nullptr;
  for (const Expectation& e : entries) {
    if (!e.stage.empty() && e.stage != stage) continue;
    if (e.stage == "unit" || !e.op.empty() || !e.key.empty() || !e.dtype.empty()) continue;
    if (!e.model.empty() && fnmatch(e.model.c_str(), model.c_str(), 0) != 0) continue;
    if (!e.item.empty() && e.item != item) continue;
    if (!outcome || e.Lists(*outcome)) return &e;
    if (first == nullptr) first = &e;
  }
  return first;
}

}  // namespace coverage::reports
