#include "core/case_result.h"

#include "core/json_double.h"

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

std::optional<double> GetOptional(const json& j, const char* name) {
  return j.contains(name) ? DoubleFromJson(j[name]) : std::nullopt;
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
  if (!j.is_object()) return Status::Corruption("case result JSON: expected an object");
  // A member of another type than written makes nlohmann's value() and get()
  // throw (fuzz/worker_protocol.cc found them): that is a corrupt result too.
  try {
    CaseResult r;
    auto outcome = OutcomeFromName(j.value("outcome", std::string()));
    if (!outcome) return Status::Corruption("case result JSON: unknown outcome '" + j.value("outcome", std::string()) + "'");
    r.outcome = *outcome;
    r.error = j.value("error", std::string());
    r.max_abs_err = GetOptional(j, "max_abs_err");
    r.max_rel_err = GetOptional(j, "max_rel_err");
    r.mismatch_frac = GetOptional(j, "mismatch_frac");
    r.cosine = GetOptional(j, "cosine");
    r.error_ratio = GetOptional(j, "error_ratio");
    r.first_call_us = GetOptional(j, "first_call_us");
    r.warm_us = GetOptional(j, "warm_us");
    r.warm_spread_us = GetOptional(j, "warm_spread_us");
    r.warm_min_us = GetOptional(j, "warm_min_us");
    if (j.contains("counters")) {
      if (!j["counters"].is_object()) return Status::Corruption("case result JSON: 'counters' is not an object");
      for (const auto& [name, v] : j["counters"].items()) {
        if (!v.is_number_integer()) return Status::Corruption("case result JSON: counter '" + name + "' is not an integer");
        r.counters[name] = v.get<int64_t>();
      }
    }
    if (j.contains("timing") && j["timing"].is_object()) {
      const json& t = j["timing"];
      r.timing.materialize_us = t.value("materialize_us", 0.0);
      r.timing.golden_us = t.value("golden_us", 0.0);
      r.timing.reference_us = t.value("reference_us", 0.0);
      r.timing.backend_us = t.value("backend_us", 0.0);
      r.timing.compare_us = t.value("compare_us", 0.0);
      r.timing.total_us = t.value("total_us", 0.0);
    }
    if (auto detail = j.find("detail"); detail != j.end()) {
      if (detail->is_string()) {
        r.detail_json = detail->get<std::string>();
      } else if (detail->is_object()) {
        r.detail_json = DumpJson(*detail);
      } else if (!detail->is_null()) {
        return Status::Corruption("case result JSON: 'detail' must be an object");
      }
    }
    if (auto it = j.find("attempts"); it != j.end()) {
      // A plain value<int>() converts a float with a cast, undefined beyond
      // int (fuzz_worker_protocol found 9.2e19).
      if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > 1000000 ||
          (it->is_number_unsigned() && it->get<uint64_t>() > 1000000)) {
        return Status::Corruption("case result JSON: 'attempts' must be a whole number in [1, 1000000], not " +
                                  it->dump());
      }
      r.attempts = static_cast<int>(it->get<int64_t>());
    }
    r.flaky = j.value("flaky", false);
    if (j.contains("attempt_outcomes") && j["attempt_outcomes"].is_array()) {
      for (const auto& o : j["attempt_outcomes"]) {
        auto parsed = o.is_string() ? OutcomeFromName(o.get<std::string>()) : std::nullopt;
        if (!parsed) return Status::Corruption("case result JSON: unknown attempt outcome " + o.dump());
        r.attempt_outcomes.push_back(*parsed);
      }
    }
    return r;
  } catch (const json::exception& e) {
    return Status::Corruption(std::string("case result JSON: ") + e.what());
  }
}

std::string CaseResult::CountersText() const { return counters.empty() ? std::string() : json(counters).dump(); }

std::string CaseResult::AttemptOutcomesText() const {
  std::string text;
  for (Outcome o : attempt_outcomes) text += (text.empty() ? "" : ",") + std::string(OutcomeName(o));
  return text;
}

Status CaseResult::SetCountersText(std::string_view text) {
  counters.clear();
  if (text.empty()) return Status::Ok();
  const json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return Status::Corruption("counters are not a JSON object");
  for (const auto& [name, v] : j.items()) {
    if (!v.is_number_integer()) return Status::Corruption("counter '" + name + "' is not an integer");
    counters[name] = v.get<int64_t>();
  }
  return Status::Ok();
}

Status CaseResult::SetAttemptOutcomesText(std::string_view text) {
  attempt_outcomes.clear();
  for (size_t start = 0; !text.empty() && start <= text.size();) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view name = text.substr(start, comma - start);
    auto o = OutcomeFromName(name);
    if (!o) return Status::Corruption("unknown attempt outcome '" + std::string(name) + "'");
    attempt_outcomes.push_back(*o);
    start = comma + 1;
  }
  return Status::Ok();
}

}  // namespace coverage
