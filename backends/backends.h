// Backend creation by name, torch-free. The app registers the backends it
// offers explicitly (Habit 13: no static registration); stages create them
// by the name the user passed with --backend.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace coverage::backends {

class Backend;  // backend.h (torch-facing)

using BackendFactory = std::function<Result<std::shared_ptr<Backend>>()>;
// Makes a backend from what follows a prefix ("privateuse1:" + "/path/x.so").
using PrefixBackendFactory = std::function<Result<std::shared_ptr<Backend>>(const std::string& rest)>;

// The prefix of a PrivateUse1 plugin loaded by path: "privateuse1:/opt/x/libx.so".
inline constexpr std::string_view kPluginPrefix = "privateuse1:";

// One line of `coverage run --list-backends`.
struct BackendInfo {
  std::string name;         // "cpu", "sim", "privateuse1:<path>" for a prefix
  std::string description;
  bool available = true;
  std::string reason;       // why not, when !available
};

class BackendRegistry {
 public:
  // Registering the same name twice replaces the factory.
  void Register(const std::string& name, std::string description, BackendFactory factory);
  // Names starting with `prefix` (e.g. "privateuse1:") are made by `factory`
  // from the rest of the name; exact names win over prefixes.
  void RegisterPrefix(const std::string& prefix, std::string description, PrefixBackendFactory factory);
  // A backend this build knows but cannot offer here (no device, no CUDA in
  // libtorch): listed with the reason, and Create returns an error with it.
  void RegisterUnavailable(const std::string& name, std::string description, std::string reason);
  // Errors name the unknown backend and list the known ones; an unavailable
  // backend's error gives its reason.
  Result<std::shared_ptr<Backend>> Create(const std::string& name) const;
  // (name, description) pairs of the available named backends, sorted by name.
  std::vector<std::pair<std::string, std::string>> List() const;
  // Every entry, prefixes and unavailable ones included, sorted by name.
  std::vector<BackendInfo> Describe() const;

 private:
  struct Entry {
    std::string description;
    BackendFactory factory;       // null when unavailable
    PrefixBackendFactory prefix;  // set for prefix entries
    std::string unavailable;      // the reason, when unavailable
  };
  std::map<std::string, Entry> entries_;
};

// Registers "cpu": ATen's own CPU kernels, the same as the reference. A run on
// it is a sanity baseline: every case should pass with zero error.
void RegisterCpuBackend(BackendRegistry& registry);

// Registers "cuda" (device cuda:0): available when this libtorch was built
// with CUDA and sees a device; otherwise listed as unavailable with the reason.
void RegisterCudaBackend(BackendRegistry& registry);

std::string BackendNameOf(const Backend& backend);
// A backend as runs and baselines know it: its name, where a plugin loaded by
// path ("privateuse1:/opt/x/libx.so") is named by its device instead
// ("privateuse1:neuron"), so moving the library keeps its baselines; and the
// version of its software stack (Backend::Version, "" for none).
struct BackendIdentity {
  std::string name, version;
};
BackendIdentity IdentityOf(const Backend& backend);
// --device-name: gives a PrivateUse1 plugin's device `name` when the plugin
// left it unnamed ("privateuseone"; one that renames itself only from
// Python). Nothing for "". Errors: the backend is not a PrivateUse1 one, or
// its device already has another name.
Status NameDevice(const Backend& backend, const std::string& name);
// Backend::Numerics(): its declared numerics as JSON, "" for none.
std::string BackendNumericsOf(const Backend& backend);
std::string LibtorchVersion();

}  // namespace coverage::backends
