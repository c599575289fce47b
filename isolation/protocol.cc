#include "isolation/protocol.h"

#include <limits>

#include <fmt/format.h>

#include "isolation/isolation.h"

namespace coverage::isolation {

using nlohmann::json;
using replay::ModelCheckItem;
using replay::ModelCheckItemFromJson;

namespace {

// Reads an integer member when present. nlohmann's value<int>() converts a
// float member with a plain cast, undefined for 1e33 (fuzz/worker_protocol.cc
// found it): only a whole JSON number within T's range is taken.
template <typename T>
Status ReadInteger(const json& j, const char* key, T* out) {
  auto it = j.find(key);
  if (it == j.end()) return Status::Ok();
  using Limits = std::numeric_limits<T>;
  bool fits = false;
  if (it->is_number_unsigned()) {
    const uint64_t v = it->get<uint64_t>();
    fits = v <= static_cast<uint64_t>(Limits::max());
    if (fits) *out = static_cast<T>(v);
  } else if (it->is_number_integer()) {
    const int64_t v = it->get<int64_t>();
    fits = v >= 0 ? static_cast<uint64_t>(v) <= static_cast<uint64_t>(Limits::max())
                  : Limits::is_signed && v >= static_cast<int64_t>(Limits::min());
    if (fits) *out = static_cast<T>(v);
  }
  if (!fits) {
    return Status::InvalidArgument(fmt::format("worker setup: '{}' must be a whole number in [{}, {}], not {}", key,
                                               Limits::min(), Limits::max(), it->dump()));
  }
  return Status::Ok();
}

}  // namespace

// WorkerSetup travels in the setup request (its JSON form is the protocol's).
json WorkerSetup::ToJson() const {
  const ModelCheckOptions& c = checks;
  return json{{"backend", backend},
              {"registry", registry},
              {"tolerances_json", tolerances_json},
              {"tolerances_source", tolerances_source},
              {"warm_iterations", warm_iterations},
              {"golden", golden == GoldenMode::kAlways ? "always" : golden == GoldenMode::kNever ? "never" : "auto"},
              {"seed", seed},
              {"checks",
               {{"seed", c.seed}, {"min_cosine", c.min_cosine}, {"top_k", c.top_k},
                {"min_topk_agreement", c.min_topk_agreement}, {"train_steps", c.train_steps},
                {"loss_rtol", c.loss_rtol}, {"grad_norm_rtol", c.grad_norm_rtol},
                {"param_update_rtol", c.param_update_rtol}}}};
}

Result<WorkerSetup> WorkerSetup::FromJson(const json& j) {
  if (!j.is_object() || !j.contains("backend") || !j["backend"].is_string()) {
    return Status::InvalidArgument("worker setup: expected an object with 'backend'");
  }
  WorkerSetup s;
  try {
    s.backend = j["backend"].get<std::string>();
    s.registry = j.value("registry", std::string());
    s.tolerances_json = j.value("tolerances_json", std::string("{}"));
    s.tolerances_source = j.value("tolerances_source", std::string("(setup)"));
    COV_RETURN_IF_ERROR(ReadInteger(j, "warm_iterations", &s.warm_iterations));
    const std::string golden = j.value("golden", std::string("auto"));
    s.golden = golden == "always" ? GoldenMode::kAlways : golden == "never" ? GoldenMode::kNever : GoldenMode::kWhenNeeded;
    COV_RETURN_IF_ERROR(ReadInteger(j, "seed", &s.seed));
    const json c = j.value("checks", json::object());
    ModelCheckOptions& o = s.checks;
    COV_RETURN_IF_ERROR(ReadInteger(c, "seed", &o.seed));
    o.min_cosine = c.value("min_cosine", o.min_cosine);
    COV_RETURN_IF_ERROR(ReadInteger(c, "top_k", &o.top_k));
    o.min_topk_agreement = c.value("min_topk_agreement", o.min_topk_agreement);
    COV_RETURN_IF_ERROR(ReadInteger(c, "train_steps", &o.train_steps));
    o.loss_rtol = c.value("loss_rtol", o.loss_rtol);
    o.grad_norm_rtol = c.value("grad_norm_rtol", o.grad_norm_rtol);
    o.param_update_rtol = c.value("param_update_rtol", o.param_update_rtol);
    o.golden = s.golden;
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("worker setup: ") + e.what());
  }
  COV_ASSIGN_OR_RETURN(s.checks.comparison, replay::ComparisonOptions::FromJson(s.tolerances_json, s.tolerances_source));
  return s;
}

Result<ReplayOptions> WorkerSetup::Replay() const {
  ReplayOptions r;
  COV_ASSIGN_OR_RETURN(r.comparison, replay::ComparisonOptions::FromJson(tolerances_json, tolerances_source));
  r.warm_iterations = warm_iterations;
  r.golden = golden;
  r.seed = seed;
  return r;
}

Status ParseSetupReply(std::string_view line) {
  // Any member may have any type here (fuzz/worker_protocol.cc found a
  // non-boolean "ready" throwing): only {"ready": true} is ready, only a
  // string "error" is the reason.
  json j = json::parse(line, nullptr, false);
  if (!j.is_object()) return Status::InvalidArgument(std::string(line));
  if (auto ready = j.find("ready"); ready != j.end() && ready->is_boolean() && ready->get<bool>()) {
    return Status::Ok();
  }
  auto error = j.find("error");
  return Status::InvalidArgument(error != j.end() && error->is_string() ? error->get<std::string>()
                                                                         : std::string(line));
}

Result<CaseResult> ParseUnitReply(std::string_view line) {
  json j = json::parse(line, nullptr, false);
  if (j.is_object() && j.contains("result") && j["result"].is_object()) {
    auto parsed = CaseResult::FromJsonValue(j["result"]);
    if (!parsed) return parsed.error().WithContext("reading a worker's result");
    return parsed;
  }
  return Status::Internal("the worker answered a case with: " + std::string(line.substr(0, 2000)));
}

Result<std::vector<ModelCheckItem>> ParseModelReply(std::string_view line) {
  json j = json::parse(line, nullptr, false);
  if (j.is_object() && j.contains("items") && j["items"].is_array()) {
    std::vector<ModelCheckItem> items;
    for (const auto& e : j["items"]) {
      auto item = ModelCheckItemFromJson(e);
      if (!item) return item.error().WithContext("reading a worker's model result");
      items.push_back(std::move(*item));
    }
    return items;
  }
  return Status::Internal("the worker answered a model stage with: " + std::string(line.substr(0, 2000)));
}

Result<WorkerRequest> ParseWorkerRequest(std::string_view line) {
  json j = json::parse(line, nullptr, false);
  if (!j.is_object()) return Status::InvalidArgument("request is not a JSON object");
  WorkerRequest r;
  if (j.contains("setup")) {
    r.kind = "setup";
    r.body = j["setup"];
  } else {
    for (const auto& [name, value] : j.items()) {
      if (!value.is_object()) continue;
      r.kind = name;
      r.body = value;
      break;
    }
  }
  r.whole = std::move(j);
  return r;
}

}  // namespace coverage::isolation
