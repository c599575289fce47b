#include "core/model_item.h"

#include "core/json_double.h"
#include "core/json_fields.h"

namespace coverage {

namespace {

void PutOptional(nlohmann::json& j, const char* key, const std::optional<double>& v) {
  if (v) j[key] = DoubleToJson(*v);
}

}  // namespace

nlohmann::json ModelItemResult::ToJsonValue() const {
  nlohmann::json j = {{"item", item}, {"outcome", OutcomeName(outcome)}, {"error", error},
                      {"detail", detail},  {"seconds", seconds}};
  PutOptional(j, "max_abs_err", max_abs_err);
  PutOptional(j, "max_rel_err", max_rel_err);
  PutOptional(j, "cosine", cosine);
  PutOptional(j, "error_ratio", error_ratio);
  if (attempts != 1) j["attempts"] = attempts;
  if (flaky) j["flaky"] = true;
  if (!attempt_outcomes.empty()) {
    j["attempt_outcomes"] = nlohmann::json::array();
    for (Outcome o : attempt_outcomes) j["attempt_outcomes"].push_back(OutcomeName(o));
  }
  return j;
}

Result<ModelItemResult> ModelItemResult::FromJsonValue(const nlohmann::json& j) {
  const JsonFields f(j, "model item");
  ModelItemResult r;
  COV_RETURN_IF_ERROR(f.RequiredString("item", &r.item));
  COV_RETURN_IF_ERROR(f.RequiredOutcome("outcome", &r.outcome));
  COV_RETURN_IF_ERROR(f.String("error", &r.error));
  COV_RETURN_IF_ERROR(f.OptionalDouble("max_abs_err", &r.max_abs_err));
  COV_RETURN_IF_ERROR(f.OptionalDouble("max_rel_err", &r.max_rel_err));
  COV_RETURN_IF_ERROR(f.OptionalDouble("cosine", &r.cosine));
  COV_RETURN_IF_ERROR(f.OptionalDouble("error_ratio", &r.error_ratio));
  COV_RETURN_IF_ERROR(f.Object("detail", &r.detail));
  COV_RETURN_IF_ERROR(f.Double("seconds", &r.seconds));
  COV_RETURN_IF_ERROR(f.Int("attempts", &r.attempts, 1, 1000000));
  COV_RETURN_IF_ERROR(f.Bool("flaky", &r.flaky));
  COV_RETURN_IF_ERROR(f.Outcomes("attempt_outcomes", &r.attempt_outcomes));
  return r;
}

std::string ModelItemResult::AttemptOutcomesText() const { return OutcomesText(attempt_outcomes); }

Status ModelItemResult::SetAttemptOutcomesText(std::string_view text) {
  return OutcomesFromText(text, &attempt_outcomes);
}

}  // namespace coverage
