// Backend creation by name, torch-free. The app registers the backends it
// offers explicitly (Habit 13: no static registration); stages create them
// by the name the user passed with --backend.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/result.h"

namespace coverage::runners {

class Backend;  // backend.h (torch-facing)

using BackendFactory = std::function<Result<std::shared_ptr<Backend>>()>;

class BackendRegistry {
 public:
  // Registering the same name twice replaces the factory.
  void Register(const std::string& name, std::string description, BackendFactory factory);
  // Errors name the unknown backend and list the known ones.
  Result<std::shared_ptr<Backend>> Create(const std::string& name) const;
  // (name, description) pairs, sorted by name.
  std::vector<std::pair<std::string, std::string>> List() const;

 private:
  struct Entry {
    std::string description;
    BackendFactory factory;
  };
  std::map<std::string, Entry> entries_;
};

// Registers "cpu": ATen's own CPU kernels, the same as the reference. A run on
// it is a sanity baseline: every case should pass with zero error.
void RegisterCpuBackend(BackendRegistry& registry);

std::string BackendNameOf(const Backend& backend);
std::string LibtorchVersion();

}  // namespace coverage::runners
