#include "apps/worker_service.h"

#include <nlohmann/json.hpp>

#include "backends/backends.h"
#include "core/json_double.h"
#include "isolation/protocol.h"

namespace coverage::apps {

using nlohmann::json;

WorkerService::WorkerService(BackendMaker make_backend, ProgramLoader load_program)
    : make_backend_(std::move(make_backend)), load_program_(std::move(load_program)) {}

std::string WorkerService::Handle(const std::string& request) {
  auto r = isolation::ParseWorkerRequest(request);
  if (!r) return DumpJson(json{{"error", r.error().message()}});
  if (r->kind == "setup") return DumpJson(Setup(r->body));
  if (!state_) return DumpJson(json{{"error", "the first request must be the setup"}});
  for (const auto* family : TestStageFamilies()) {
    if (family->request() == r->kind) return DumpJson(family->Answer(*state_, r->whole, r->body));
  }
  return DumpJson(json{{"error", "unknown request: " + request.substr(0, 200)}});
}

json WorkerService::Setup(const json& setup_json) {
  auto setup = isolation::WorkerSetup::FromJson(setup_json);
  // FromJson parses the tolerances too: ones that do not parse are refused here, before any request.
  if (!setup) return {{"error", setup.error().message()}};
  auto backend = make_backend_(setup->backend);
  if (!backend) return {{"error", backend.error().message()}};
  if (Status named = backends::NameDevice(**backend, setup->device_name); !named.ok()) {
    return {{"error", named.WithContext("--device-name").message()}};
  }
  Status numerics = setup->UseBackendNumerics(setup->backend, backends::BackendNumericsOf(**backend));
  if (!numerics.ok()) return {{"error", numerics.message()}};
  auto state = std::make_unique<WorkerState>();
  state->setup = std::move(*setup);
  state->backend = *backend;
  const std::string registry = state->setup.registry;
  state->load_program = [this, registry](const std::string& model_id, const std::string& profile) {
    return load_program_(registry, model_id, profile);
  };
  state_ = std::move(state);
  const backends::BackendIdentity identity = backends::IdentityOf(*state_->backend);
  return {{"ready", true},
          {"backend_name", identity.name},
          {"backend_version", identity.version},
          {"numerics", state_->setup.checks.comparison.numerics.text}};
}

}  // namespace coverage::apps
