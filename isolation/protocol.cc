#include "isolation/protocol.h"

#include "core/json_fields.h"
#include "isolation/isolation.h"

namespace coverage::isolation {

using nlohmann::json;

// WorkerSetup travels in the setup request (its JSON form is the protocol's).
json WorkerSetup::ToJson() const {
  const ModelCheckOptions& c = checks;
  return json{{"backend", backend},
              {"device_name", device_name},
              {"registry", registry},
              {"tolerances_json", tolerances_json},
              {"tolerances_source", tolerances_source},
              {"warm_iterations", warm_iterations},
              {"golden", golden == GoldenMode::kAlways ? "always" : golden == GoldenMode::kNever ? "never" : "auto"},
              {"numerics_json", numerics_json},
              {"numerics_source", numerics_source},
              {"seed", seed},
              {"checks",
               {{"seed", c.seed}, {"min_cosine", c.min_cosine}, {"top_k", c.top_k},
                {"min_topk_agreement", c.min_topk_agreement}, {"train_steps", c.train_steps}}}};
}

Result<WorkerSetup> WorkerSetup::FromJson(const json& j) {
  const JsonFields f(j, "worker setup", StatusCode::kInvalidArgument);
  WorkerSetup s;
  COV_RETURN_IF_ERROR(f.RequiredString("backend", &s.backend));
  COV_RETURN_IF_ERROR(f.String("device_name", &s.device_name));
  COV_RETURN_IF_ERROR(f.String("registry", &s.registry));
  s.tolerances_json = "{}";
  COV_RETURN_IF_ERROR(f.String("tolerances_json", &s.tolerances_json));
  s.tolerances_source = "(setup)";
  COV_RETURN_IF_ERROR(f.String("tolerances_source", &s.tolerances_source));
  COV_RETURN_IF_ERROR(f.Int("warm_iterations", &s.warm_iterations));
  std::string golden = "auto";
  COV_RETURN_IF_ERROR(f.String("golden", &golden));
  s.golden = golden == "always" ? GoldenMode::kAlways : golden == "never" ? GoldenMode::kNever : GoldenMode::kWhenNeeded;
  COV_RETURN_IF_ERROR(f.Int("seed", &s.seed));
  const json no_checks = json::object();
  const json* checks = f.Find("checks");
  const JsonFields c = f.Sub("checks", checks ? *checks : no_checks);
  ModelCheckOptions& o = s.checks;
  COV_RETURN_IF_ERROR(c.Int("seed", &o.seed));
  COV_RETURN_IF_ERROR(c.Double("min_cosine", &o.min_cosine));
  COV_RETURN_IF_ERROR(c.Int("top_k", &o.top_k));
  COV_RETURN_IF_ERROR(c.Double("min_topk_agreement", &o.min_topk_agreement));
  COV_RETURN_IF_ERROR(c.Int("train_steps", &o.train_steps));
  o.golden = s.golden;
  COV_ASSIGN_OR_RETURN(s.checks.comparison, replay::ComparisonOptions::FromJson(s.tolerances_json, s.tolerances_source));
  COV_RETURN_IF_ERROR(f.String("numerics_json", &s.numerics_json));
  COV_RETURN_IF_ERROR(f.String("numerics_source", &s.numerics_source));
  if (s.numerics_source != kAskBackend) {
    COV_ASSIGN_OR_RETURN(s.checks.comparison.numerics,
                         replay::DeclaredNumerics::FromJson(s.numerics_json, s.numerics_source));
  }
  return s;
}

Status WorkerSetup::UseBackendNumerics(const std::string& backend_name, const std::string& declared) {
  if (numerics_source != kAskBackend) return Status::Ok();
  COV_ASSIGN_OR_RETURN(checks.comparison.numerics,
                       replay::DeclaredNumerics::FromJson(
                           declared, "the numerics backend '" + backend_name + "' declares (coverage_backend_numerics)"));
  return Status::Ok();
}

ReplayOptions WorkerSetup::Replay() const {
  ReplayOptions r;
  r.comparison = checks.comparison;
  r.warm_iterations = warm_iterations;
  r.golden = golden;
  r.seed = seed;
  return r;
}

Result<SetupReply> ParseSetupReply(std::string_view line) {
  // Any member may have any type here (fuzz/worker_protocol.cc found a
  // non-boolean "ready" throwing): only {"ready": true} is ready, only a
  // string "error" is the reason.
  json j = json::parse(line, nullptr, false);
  if (!j.is_object()) return Status::InvalidArgument(std::string(line));
  if (auto ready = j.find("ready"); ready != j.end() && ready->is_boolean() && ready->get<bool>()) {
    SetupReply reply;
    for (auto [name, to] : {std::pair{"numerics", &reply.numerics}, std::pair{"backend_name", &reply.backend_name},
                            std::pair{"backend_version", &reply.backend_version}}) {
      if (auto member = j.find(name); member != j.end() && member->is_string()) *to = member->get<std::string>();
    }
    return reply;
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

Result<std::vector<ModelItemResult>> ParseModelReply(std::string_view line) {
  json j = json::parse(line, nullptr, false);
  if (j.is_object() && j.contains("items") && j["items"].is_array()) {
    std::vector<ModelItemResult> items;
    for (const auto& e : j["items"]) {
      auto item = ModelItemResult::FromJsonValue(e);
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
