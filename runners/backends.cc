#include "runners/backends.h"

#include <torch/version.h>

#include "runners/backend.h"

namespace coverage::runners {
namespace {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  c10::Device device() const override { return c10::Device(c10::kCPU); }
  std::string Version() const override { return LibtorchVersion(); }
  bool RespectsReadOnlyInputs() const override { return true; }  // the reference's own kernels
};

}  // namespace

void BackendRegistry::Register(const std::string& name, std::string description, BackendFactory factory) {
  entries_[name] = Entry{std::move(description), std::move(factory)};
}

Result<std::shared_ptr<Backend>> BackendRegistry::Create(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    std::string known;
    for (const auto& [n, e] : entries_) known += (known.empty() ? "" : ", ") + n;
    return Status::InvalidArgument("unknown backend '" + name + "' (known: " + known + ")");
  }
  return it->second.factory();
}

std::vector<std::pair<std::string, std::string>> BackendRegistry::List() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [n, e] : entries_) out.emplace_back(n, e.description);
  return out;
}

void RegisterCpuBackend(BackendRegistry& registry) {
  registry.Register("cpu", "ATen CPU kernels (same as the reference; a sanity baseline)",
                    []() -> Result<std::shared_ptr<Backend>> { return std::shared_ptr<Backend>(std::make_shared<CpuBackend>()); });
}

std::string BackendNameOf(const Backend& backend) { return backend.name(); }

std::string LibtorchVersion() { return TORCH_VERSION; }

}  // namespace coverage::runners
