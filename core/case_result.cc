#include "core/case_result.h"

#include "core/json_double.h"
#include "core/json_fields.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

namespace coverage {
namespace {

using nlohmann::json;

void PutOptional(json& j, const char* name, const std::optional<double>& v) {
  if (v) j[name] = DoubleToJson(*v);
}

// Counters: an object of whole numbers.
Status ReadCounters(const JsonFields& f, const json& j, std::map<std::string, int64_t>* out) {
  if (!j.is_object()) return Status::Corruption(f.what() + ": expected a JSON object");
  for (const auto& [name, v] : j.items()) {
    int64_t n = 0;
    COV_RETURN_IF_ERROR(f.Int(name.c_str(), &n));
    (*out)[name] = n;
  }
  return Status::Ok();
}

}  // namespace

std::string CaseResult::ToJson() const { return DumpJson(ToJsonValue()); }

Result<CaseResult> CaseResult::FromJson(std::string_view text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::Corruption("case result JSON does not parse");
  return FromJsonValue(j);
}

json CaseResult::ToJsonValue() const {
  json j;
  j["outcome"] = OutcomeName(outcome);
  j["error"] = error;
  PutOptional(j, "max_abs_err", max_abs_err);
  PutOptional(j, "max_rel_err", max_rel_err);
  PutOptional(j, "mismatch_frac", mismatch_frac);
  PutOptional(j, "cosine", cosine);
  PutOptional(j, "error_ratio", error_ratio);
  PutOptional(j, "first_call_us", first_call_us);
  PutOptional(j, "warm_us", warm_us);
  PutOptional(j, "warm_spread_us", warm_spread_us);
  PutOptional(j, "warm_min_us", warm_min_us);
  if (!counters.empty()) j["counters"] = counters;
  j["timing"] = {{"materialize_us", timing.materialize_us}, {"golden_us", timing.golden_us},
                 {"reference_us", timing.reference_us},     {"backend_us", timing.backend_us},
                 {"compare_us", timing.compare_us},         {"total_us", timing.total_us}};
  // The detail is a JSON object as text; it travels as the value it is.
  if (!detail_json.empty()) {
    json detail = json::parse(detail_json, nullptr, false);
    j["detail"] = detail.is_discarded() ? json(detail_json) : std::move(detail);
  }
  if (attempts != 1) j["attempts"] = attempts;
  if (flaky) j["flaky"] = true;
  if (!attempt_outcomes.empty()) {
    j["attempt_outcomes"] = json::array();
    for (Outcome o : attempt_outcomes) j["attempt_outcomes"].push_back(OutcomeName(o));
  }
  return j;
}

Result<CaseResult> CaseResult::FromJsonValue(const json& j) {
  const JsonFields f(j, "case result JSON");
  CaseResult r;
  COV_RETURN_IF_ERROR(f.RequiredOutcome("outcome", &r.outcome));
  COV_RETURN_IF_ERROR(f.String("error", &r.error));
  COV_RETURN_IF_ERROR(f.OptionalDouble("max_abs_err", &r.max_abs_err));
  COV_RETURN_IF_ERROR(f.OptionalDouble("max_rel_err", &r.max_rel_err));
  COV_RETURN_IF_ERROR(f.OptionalDouble("mismatch_frac", &r.mismatch_frac));
  COV_RETURN_IF_ERROR(f.OptionalDouble("cosine", &r.cosine));
  COV_RETURN_IF_ERROR(f.OptionalDouble("error_ratio", &r.error_ratio));
  COV_RETURN_IF_ERROR(f.OptionalDouble("first_call_us", &r.first_call_us));
  COV_RETURN_IF_ERROR(f.OptionalDouble("warm_us", &r.warm_us));
  COV_RETURN_IF_ERROR(f.OptionalDouble("warm_spread_us", &r.warm_spread_us));
  COV_RETURN_IF_ERROR(f.OptionalDouble("warm_min_us", &r.warm_min_us));
  if (const json* counters = f.Find("counters")) {
    COV_RETURN_IF_ERROR(ReadCounters(f.Sub("counters", *counters), *counters, &r.counters));
  }
  if (const json* timing = f.Find("timing")) {
    const JsonFields t = f.Sub("timing", *timing);
    COV_RETURN_IF_ERROR(t.Double("materialize_us", &r.timing.materialize_us));
    COV_RETURN_IF_ERROR(t.Double("golden_us", &r.timing.golden_us));
    COV_RETURN_IF_ERROR(t.Double("reference_us", &r.timing.reference_us));
    COV_RETURN_IF_ERROR(t.Double("backend_us", &r.timing.backend_us));
    COV_RETURN_IF_ERROR(t.Double("compare_us", &r.timing.compare_us));
    COV_RETURN_IF_ERROR(t.Double("total_us", &r.timing.total_us));
  }
  if (const json* detail = f.Find("detail")) {
    if (detail->is_string()) {
      r.detail_json = detail->get<std::string>();
    } else if (detail->is_object()) {
      r.detail_json = DumpJson(*detail);
    } else if (!detail->is_null()) {
      return f.Error("detail", "expected a JSON object");
    }
  }
  COV_RETURN_IF_ERROR(f.Int("attempts", &r.attempts, 1, 1000000));
  COV_RETURN_IF_ERROR(f.Bool("flaky", &r.flaky));
  COV_RETURN_IF_ERROR(f.Outcomes("attempt_outcomes", &r.attempt_outcomes));
  return r;
}

std::string CaseResult::CountersText() const { return counters.empty() ? std::string() : json(counters).dump(); }

std::string CaseResult::AttemptOutcomesText() const { return OutcomesText(attempt_outcomes); }

Status CaseResult::SetCountersText(std::string_view text) {
  counters.clear();
  if (text.empty()) return Status::Ok();
  const json j = json::parse(text, nullptr, false);
  return ReadCounters(JsonFields(j, "counters"), j, &counters);
}

Status CaseResult::SetAttemptOutcomesText(std::string_view text) { return OutcomesFromText(text, &attempt_outcomes); }

}  // namespace coverage
