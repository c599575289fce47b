#include "backends/backends.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/version.h>

#include "backends/backend.h"

namespace coverage::backends {
namespace {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  c10::Device device() const override { return c10::Device(c10::kCPU); }
  std::string Version() const override { return LibtorchVersion(); }
  bool RespectsReadOnlyInputs() const override { return true; }  // the reference's own kernels
};

// Note [TF32 on cuda]: PyTorch's defaults differ by library (cuBLAS matmuls
// in IEEE fp32, cuDNN convolutions in TF32), so a plain "cuda" run would
// judge fp32 convolutions at TF32 precision and matmuls not. "cuda" sets
// both to IEEE fp32; "cuda-tf32" lets both use TF32, as training jobs that
// set torch.backends.cuda.matmul.allow_tf32 do. The setting is process-wide
// and made when the backend is created (one backend per worker process).
class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(bool tf32) : tf32_(tf32) {
    at::globalContext().setAllowTF32CuBLAS(tf32);
    at::globalContext().setAllowTF32CuDNN(tf32);
  }
  std::string name() const override { return tf32_ ? "cuda-tf32" : "cuda"; }
  c10::Device device() const override { return c10::Device(c10::kCUDA, 0); }
  void Synchronize() override { at::detail::getCUDAHooks().deviceSynchronize(0); }
  std::string Version() const override { return LibtorchVersion() + (tf32_ ? " (CUDA, TF32)" : " (CUDA)"); }

 private:
  bool tf32_;
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
  for (const bool tf32 : {false, true}) {
    const std::string name = tf32 ? "cuda-tf32" : "cuda";
    const std::string description = tf32 ? "ATen CUDA kernels on cuda:0, fp32 matmuls and convolutions in TF32"
                                         : "ATen CUDA kernels on cuda:0, fp32 matmuls and convolutions in IEEE fp32";
    if (std::string reason = CudaUnavailableReason(); !reason.empty()) {
      registry.RegisterUnavailable(name, description, reason);
      continue;
    }
    registry.Register(name, description, [tf32]() -> Result<std::shared_ptr<Backend>> {
      return std::shared_ptr<Backend>(std::make_shared<CudaBackend>(tf32));
    });
  }
}


std::string BackendNumericsOf(const Backend& backend) { return backend.Numerics(); }

std::string BackendNameOf(const Backend& backend) { return backend.name(); }

BackendIdentity IdentityOf(const Backend& backend) {
  BackendIdentity id{backend.name(), backend.Version()};
  if (id.name.rfind(kPluginPrefix, 0) == 0 && backend.device().type() == c10::DeviceType::PrivateUse1) {
    id.name = std::string(kPluginPrefix) + c10::get_privateuse1_backend();
  }
  return id;
}

Status NameDevice(const Backend& backend, const std::string& name) {
  if (name.empty()) return Status::Ok();
  if (backend.device().type() != c10::DeviceType::PrivateUse1) {
    return Status::InvalidArgument("--device-name names a PrivateUse1 plugin's device; backend '" + backend.name() +
                                   "' runs on " + backend.device().str());
  }
  const std::string current = c10::get_privateuse1_backend();
  if (current == name) return Status::Ok();
  if (current != "privateuseone") {
    return Status::InvalidArgument("the plugin named its device '" + current + "' itself; --device-name '" + name +
                                   "' would rename it (leave --device-name out)");
  }
  c10::register_privateuse1_backend(name);
  return Status::Ok();
}

std::string LibtorchVersion() { return TORCH_VERSION; }

}  // namespace coverage::backends
