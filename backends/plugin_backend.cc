#include "backends/plugin_backend.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <cctype>
#include <charconv>
#include <filesystem>
#include <mutex>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <nlohmann/json.hpp>

#include "backends/backend.h"
#include "backends/backends.h"

namespace coverage::backends {
namespace {

using InitFn = const char* (*)();
using StringFn = const char* (*)();
using VoidFn = void (*)();

struct Plugin {
  std::string path;       // as given first
  std::string real_path;  // canonical, to recognise the same library under another name
  void* handle = nullptr;
  InitFn init = nullptr;
  StringFn version = nullptr;
  StringFn counters = nullptr;
  StringFn numerics = nullptr;
  VoidFn synchronize = nullptr;
};

std::mutex& LoaderMutex() {
  static std::mutex mu;
  return mu;
}
// The plugin that owns PrivateUse1 in this process, once one loaded.
Plugin*& Loaded() {
  static Plugin* plugin = nullptr;
  return plugin;
}
// Set when a library registered part of a PrivateUse1 backend and failed.
std::string& Tainted() {
  static std::string by;
  return by;
}

bool HasPrivateUse1Kernels() {
  auto op = c10::Dispatcher::singleton().findSchema({"aten::empty", "memory_format"});
  return op && op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1);
}
bool HasPrivateUse1Allocator() { return c10::GetAllocator(c10::DeviceType::PrivateUse1) != nullptr; }
bool HasPrivateUse1Guard() { return c10::impl::hasDeviceGuardImpl(c10::DeviceType::PrivateUse1); }

class PluginBackend final : public Backend {
 public:
  PluginBackend(std::string name, const Plugin* plugin) : name_(std::move(name)), plugin_(plugin) {}
  std::string name() const override { return name_; }
  c10::Device device() const override { return c10::Device(c10::DeviceType::PrivateUse1, 0); }
  void Synchronize() override {
    if (plugin_->synchronize) plugin_->synchronize();
  }
  std::string Numerics() const override {
    const char* text = plugin_->numerics ? plugin_->numerics() : nullptr;
    return text ? std::string(text) : std::string();
  }
  std::string Version() const override {
    const char* v = plugin_->version ? plugin_->version() : nullptr;
    return v ? v : "";
  }
  std::map<std::string, int64_t> Counters() const override {
    const char* text = plugin_->counters ? plugin_->counters() : nullptr;
    return text == nullptr ? std::map<std::string, int64_t>() : ParseCounters(text);
  }

 private:
  std::string name_;
  const Plugin* plugin_;  // loaded for the life of the process
};

Result<const Plugin*> Load(const std::string& path) {
  std::lock_guard<std::mutex> lock(LoaderMutex());
  const std::string what = "PrivateUse1 plugin '" + path + "'";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return Status::NotFound(what + ": no such file");
  char resolved[PATH_MAX];
  const std::string real = realpath(path.c_str(), resolved) ? resolved : path;
  if (Plugin* p = Loaded()) {
    if (p->real_path == real) return static_cast<const Plugin*>(p);
    return Status::Unsupported("cannot load " + what + ": PrivateUse1 already belongs to plugin '" + p->path +
                               "' in this process (one PrivateUse1 backend per process)");
  }
  if (!Tainted().empty()) {
    return Status::Unsupported("cannot load " + what + ": '" + Tainted() +
                               "' registered part of a PrivateUse1 backend in this process and could not be unloaded");
  }
  if (HasPrivateUse1Kernels()) {
    return Status::Unsupported("cannot load " + what +
                               ": PrivateUse1 kernels are already registered in this process by another library");
  }
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    return Status::InvalidArgument("cannot load " + what + ": " + (err ? err : "dlopen failed"));
  }
  std::string missing;
  int registered = 0;
  auto need = [&](bool has, const char* thing) {
    if (has) {
      ++registered;
    } else {
      missing += (missing.empty() ? "" : ", ") + std::string(thing);
    }
  };
  need(HasPrivateUse1Kernels(), "PrivateUse1 kernels (aten::empty.memory_format)");
  need(HasPrivateUse1Allocator(), "a PrivateUse1 allocator");
  need(HasPrivateUse1Guard(), "a PrivateUse1 device guard");
  if (!missing.empty()) {
    if (registered == 0) {
      dlclose(handle);
    } else {
      Tainted() = path;
    }
    return Status::InvalidArgument(what + " is not a PrivateUse1 backend plugin: it registered no " + missing);
  }
  auto* plugin = new Plugin;
  plugin->path = path;
  plugin->real_path = real;
  plugin->handle = handle;
  plugin->init = reinterpret_cast<InitFn>(dlsym(handle, "coverage_backend_init"));
  plugin->version = reinterpret_cast<StringFn>(dlsym(handle, "coverage_backend_version"));
  plugin->counters = reinterpret_cast<StringFn>(dlsym(handle, "coverage_backend_counters"));
  plugin->numerics = reinterpret_cast<StringFn>(dlsym(handle, "coverage_backend_numerics"));
  plugin->synchronize = reinterpret_cast<VoidFn>(dlsym(handle, "coverage_backend_synchronize"));
  Loaded() = plugin;
  return static_cast<const Plugin*>(plugin);
}

}  // namespace

std::map<std::string, int64_t> ParseCounters(std::string_view text) {
  auto parsed = [&] {
    std::map<std::string, int64_t> out;
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (!j.is_object()) return out;
    for (const auto& [k, v] : j.items()) {
      if (v.is_number_integer()) out[k] = v.get<int64_t>();
    }
    return out;
  };
  std::map<std::string, int64_t> out;
  if (text.size() < 2 || text.front() != '{' || text.back() != '}') return parsed();
  size_t i = 1;
  while (i < text.size() - 1) {
    if (text[i] != '"') return parsed();
    const size_t close = text.find('"', i + 1);
    if (close == std::string_view::npos) return parsed();
    const std::string_view key = text.substr(i + 1, close - i - 1);
    for (char c : key) {
      const auto u = static_cast<unsigned char>(c);
      if (c == '\\' || u < 0x20 || u >= 0x80) return parsed();
    }
    i = close + 1;
    if (i >= text.size() || text[i] != ':') return parsed();
    ++i;
    const size_t digits = i + (i < text.size() && text[i] == '-');
    // JSON's integers: no leading zero, no fraction or exponent after them.
    if (digits >= text.size() || !std::isdigit(static_cast<unsigned char>(text[digits])) ||
        (text[digits] == '0' && digits + 1 < text.size() && std::isdigit(static_cast<unsigned char>(text[digits + 1])))) {
      return parsed();
    }
    int64_t value = 0;
    const auto [end, ec] = std::from_chars(text.data() + i, text.data() + text.size(), value);
    if (ec != std::errc()) return parsed();
    i = static_cast<size_t>(end - text.data());
    if (text[i] != ',' && i != text.size() - 1) return parsed();
    out.insert_or_assign(out.end(), std::string(key), value);  // the last of a repeated name, as the parser keeps
    if (text[i] == ',') {
      ++i;
      if (i >= text.size() - 1) return parsed();  // a trailing comma
    }
  }
  return out;
}

Result<std::shared_ptr<Backend>> LoadPluginBackend(const std::string& name, const std::string& path) {
  auto plugin = Load(path);
  if (!plugin) return plugin.error();
  if ((*plugin)->init) {
    std::lock_guard<std::mutex> lock(LoaderMutex());
    if (const char* err = (*plugin)->init()) {
      return Status::InvalidArgument("PrivateUse1 plugin '" + path + "' is not ready: " + err);
    }
  }
  return std::shared_ptr<Backend>(std::make_shared<PluginBackend>(name, *plugin));
}

std::string DefaultSimPluginPath() {
  if (const char* env = std::getenv("COVERAGE_SIM_PLUGIN"); env && *env) return env;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "libcoverage_sim.so";
  return (exe.parent_path().parent_path() / "lib" / "libcoverage_sim.so").string();
}

void RegisterPluginBackends(BackendRegistry& registry, SimBackendOptions sim) {
  registry.Register(
      "sim", "simulated PrivateUse1 device (host memory; bf16 matmul numerics, compile cache, fault injection)",
      [sim]() -> Result<std::shared_ptr<Backend>> {
        if (!sim.default_config_path.empty()) setenv("COVERAGE_SIM_CONFIG", sim.default_config_path.c_str(), /*overwrite=*/0);
        const std::string path = sim.plugin_path.empty() ? DefaultSimPluginPath() : sim.plugin_path;
        return LoadPluginBackend("sim", path);
      });
  registry.RegisterPrefix(std::string(kPluginPrefix), "a PrivateUse1 backend plugin (.so) loaded by path",
                          [](const std::string& path) { return LoadPluginBackend(std::string(kPluginPrefix) + path, path); });
}

}  // namespace coverage::backends
