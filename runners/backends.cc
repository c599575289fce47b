#include "runners/backends.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
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

class CudaBackend final : public Backend {
 public:
  std::string name() const override { return "cuda"; }
  c10::Device device() const override { return c10::Device(c10::kCUDA, 0); }
  void Synchronize() override { at::detail::getCUDAHooks().deviceSynchronize(0); }
  std::string Version() const override { return LibtorchVersion() + " (CUDA)"; }
};

// Why "cuda" cannot run here, or "" when it can.
std::string CudaUnavailableReason() {
  if (!at::hasCUDA()) {
    return at::detail::getCUDAHooks().hasCUDART() ? "no CUDA device found"
                                                   : "this libtorch (" + LibtorchVersion() + ") was built without CUDA";
  }
  if (at::detail::getCUDAHooks().getNumGPUs() < 1) return "no CUDA device found";
  return "";
}

}  // namespace

void BackendRegistry::Register(const std::string& name, std::string description, BackendFactory factory) {
  entries_[name] = Entry{std::move(description), std::move(factory), nullptr, ""};
}

void BackendRegistry::RegisterPrefix(const std::string& prefix, std::string description, PrefixBackendFactory factory) {
  entries_[prefix] = Entry{std::move(description), nullptr, std::move(factory), ""};
}

void BackendRegistry::RegisterUnavailable(const std::string& name, std::string description, std::string reason) {
  entries_[name] = Entry{std::move(description), nullptr, nullptr, std::move(reason)};
}

Result<std::shared_ptr<Backend>> BackendRegistry::Create(const std::string& name) const {
  auto it = entries_.find(name);
  if (it != entries_.end() && !it->second.prefix) {
    if (!it->second.factory) {
      return Status::Unsupported("backend '" + name + "' is not available here: " + it->second.unavailable);
    }
    return it->second.factory();
  }
  for (const auto& [prefix, e] : entries_) {
    if (e.prefix && name.size() >= prefix.size() && name.compare(0, prefix.size(), prefix) == 0) {
      const std::string rest = name.substr(prefix.size());
      if (rest.empty()) return Status::InvalidArgument("backend '" + name + "' needs a value after '" + prefix + "'");
      return e.prefix(rest);
    }
  }
  std::string known;
  for (const auto& [n, e] : entries_) known += (known.empty() ? "" : ", ") + n + (e.prefix ? "<path>" : "");
  return Status::InvalidArgument("unknown backend '" + name + "' (known: " + known + ")");
}

std::vector<std::pair<std::string, std::string>> BackendRegistry::List() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [n, e] : entries_) {
    if (e.factory) out.emplace_back(n, e.description);
  }
  return out;
}

std::vector<BackendInfo> BackendRegistry::Describe() const {
  std::vector<BackendInfo> out;
  for (const auto& [n, e] : entries_) {
    out.push_back(BackendInfo{e.prefix ? n + "<path>" : n, e.description, e.factory || e.prefix, e.unavailable});
  }
  return out;
}

void RegisterCpuBackend(BackendRegistry& registry) {
  registry.Register("cpu", "ATen CPU kernels (same as the reference; a sanity baseline)",
                    []() -> Result<std::shared_ptr<Backend>> { return std::shared_ptr<Backend>(std::make_shared<CpuBackend>()); });
}

void RegisterCudaBackend(BackendRegistry& registry) {
  const std::string description = "ATen CUDA kernels on cuda:0";
  if (std::string reason = CudaUnavailableReason(); !reason.empty()) {
    registry.RegisterUnavailable("cuda", description, reason);
    return;
  }
  registry.Register("cuda", description,
                    []() -> Result<std::shared_ptr<Backend>> { return std::shared_ptr<Backend>(std::make_shared<CudaBackend>()); });
}

std::string BackendNameOf(const Backend& backend) { return backend.name(); }

std::string LibtorchVersion() { return TORCH_VERSION; }

}  // namespace coverage::runners
