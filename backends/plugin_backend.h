// PrivateUse1 plugins: out-of-tree backends that register a PyTorch device
// the way accelerator extensions do (an allocator, a device guard and ATen
// kernels for c10::DeviceType::PrivateUse1, from the library's static
// initialisers), loaded by path: `--backend privateuse1:/path/to/plugin.so`.
// The optional C hooks a plugin may export are in plugin_abi.h. `sim`
// (sim/README.md) is the project's own plugin.
//
// Torch-free. Thread safety: loading is serialised inside; a Backend is used
// from one thread at a time.
#pragma once

#include <memory>
#include <string>

#include <cstdint>
#include <map>
#include <string_view>

#include "core/result.h"

namespace coverage::backends {

class Backend;
class BackendRegistry;

// Loads `path` (dlopen with RTLD_NOW | RTLD_GLOBAL) unless it is already
// loaded, checks that it registered PrivateUse1 kernels, an allocator and a
// device guard, calls its coverage_backend_init hook, and returns a Backend
// named `name` on device privateuseone:0. Errors name the path and say what
// is wrong: no such file, the loader's message, what the library did not
// register, the init hook's message, or a different PrivateUse1 plugin
// already loaded in this process (a process has one PrivateUse1 device). A
// library that registered nothing is unloaded again; one that registered
// only part of it cannot be and stays loaded.
Result<std::shared_ptr<Backend>> LoadPluginBackend(const std::string& name, const std::string& path);

// Where `sim` is: $COVERAGE_SIM_PLUGIN, else
// <folder of /proc/self/exe>/../lib/libcoverage_sim.so (build/bin and build/lib).
std::string DefaultSimPluginPath();

struct SimBackendOptions {
  std::string plugin_path;          // empty: DefaultSimPluginPath()
  // Set as $COVERAGE_SIM_CONFIG (which worker processes inherit) before
  // loading, when that variable is unset; empty: leave it unset (defaults).
  std::string default_config_path;
};

// A plugin's coverage_backend_counters text (plugin_abi.h): its integer
// members. Asked before and after every case, so the usual flat form
// ({"name":12,...}: no spaces, escapes or non-ASCII bytes) is read directly;
// any other text goes through the JSON parser, with the same result: members
// that are not integers are left out, and text that is not a JSON object
// gives no counters (a plugin bug must not fail the run).
std::map<std::string, int64_t> ParseCounters(std::string_view text);

// Registers "sim" (the simulated PrivateUse1 device) and the prefix
// "privateuse1:" (any plugin, by path).
void RegisterPluginBackends(BackendRegistry& registry, SimBackendOptions sim);

}  // namespace coverage::backends
