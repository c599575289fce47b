#include "apps/app.h"
#include "core/text_safety.h"

#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/json_capped.h"
#include "registry/registry.h"
#include "backends/backends.h"
#include "backends/plugin_backend.h"
#include "backends/host.h"

#ifndef COVERAGE_SOURCE_DIR
#define COVERAGE_SOURCE_DIR "."
#endif

namespace coverage::apps {
namespace {

std::atomic<bool> g_stop{false};

void OnSignal(int sig) {
  if (g_stop.load() && sig == SIGINT) std::_Exit(kExitInterrupted);
  g_stop.store(true);
  const char msg[] = "\ncoverage: stopping after the current step (Ctrl-C again to quit now)\n";
  ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
  (void)ignored;
}

}  // namespace

std::string DefaultHome() {
  if (const char* env = std::getenv("COVERAGE_HOME"); env && *env) return env;
  if (std::filesystem::exists("configs/tolerances.json")) return ".";
  return COVERAGE_SOURCE_DIR;
}

std::string DefaultRegistryPath() {
  if (const char* env = std::getenv("COVERAGE_REGISTRY"); env && *env) return env;
  return "coverage.db";
}

Result<std::string> ReadFile(const std::string& path) {
  // stdio rather than a stream, so that the reason (a folder, no permission)
  // reaches the message.
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return Status::NotFound("cannot read '" + path + "': " + std::strerror(errno));
  std::string text;
  char buffer[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) text.append(buffer, n);
  const bool failed = std::ferror(f) != 0;
  const int read_errno = errno;
  std::fclose(f);
  if (failed) return Status::IoError("cannot read '" + path + "': " + std::strerror(read_errno));
  return text;
}

const std::atomic<bool>* InstallStopHandler() {
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  return &g_stop;
}

Result<std::unique_ptr<registry::Registry>> OpenRegistry(const GlobalOptions& global, bool read_only, bool create) {
  if (!create && !std::filesystem::exists(global.registry_path)) {
    return Status::NotFound("no registry at '" + global.registry_path +
                            "'; create one with `coverage capture --registry " + global.registry_path +
                            "` or pass --registry");
  }
  if (!read_only) {
    // SQLite writes its journal beside the file: a folder it cannot write
    // fails every write with "attempt to write a readonly database".
    std::error_code ec;
    const std::filesystem::path path(global.registry_path);
    std::filesystem::path folder = path.parent_path();
    if (folder.empty()) folder = ".";
    const bool exists = std::filesystem::exists(path, ec);
    if (std::filesystem::is_directory(folder, ec) && ::access(folder.c_str(), W_OK) != 0) {
      return Status::IoError("cannot write the registry '" + global.registry_path + "': its folder '" +
                                      folder.string() + "' is not writable (" + std::strerror(errno) +
                                      "; SQLite keeps its journal beside the file); copy it somewhere writable");
    }
    if (exists && ::access(path.c_str(), W_OK) != 0) {
      return Status::IoError("cannot write the registry '" + global.registry_path + "': " +
                                      std::strerror(errno));
    }
  }
  registry::RegistryOptions options;
  options.read_only = read_only;
  options.busy_timeout_ms = static_cast<int>(global.busy_timeout_s * 1000);
  return registry::Registry::Open(global.registry_path, options);
}

std::string TracerPython(const GlobalOptions& global, const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* env = std::getenv("COVERAGE_PYTHON");
  return env && *env ? std::string(env) : global.home + "/.venv/bin/python";
}

std::string GitRevision(const std::string& home) {
  if (const char* env = std::getenv("COVERAGE_GIT_REVISION"); env && *env) return env;
  std::string cmd = "git -C '" + home + "' rev-parse --short HEAD 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "";
  char buf[64] = {0};
  std::string out;
  if (fgets(buf, sizeof(buf), p)) out = buf;
  pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

void ApplyHostSettings(const GlobalOptions& global) { backends::SetIntraOpThreads(global.threads); }

int ReportError(const Status& status) {
  // Note [Terminal-safe text], line by line (a message may span lines).
  std::string safe;
  const std::string& message = status.message();
  for (size_t at = 0; at <= message.size();) {
    const size_t nl = std::min(message.find('\n', at), message.size());
    safe += (at ? "\n" : "") + TerminalSafe(std::string_view(message).substr(at, nl - at));
    at = nl + 1;
  }
  std::fprintf(stderr, "coverage: error: %s\n", safe.c_str());
  return kExitUsage;
}

Result<std::vector<capture::CaptureProfile>> LoadProfiles(const std::string& path, const std::vector<std::string>& only) {
  COV_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  COV_ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonText(text, path));
  auto all = capture::ParseCaptureProfiles(j);
  if (!all) return all.error().WithContext(path);
  if (only.empty()) return all;
  std::vector<capture::CaptureProfile> out;
  for (const auto& name : only) {
    bool found = false;
    for (const auto& p : *all) {
      if (p.name == name) {
        out.push_back(p);
        found = true;
      }
    }
    if (!found) return Status::InvalidArgument("--profile '" + name + "' is not in " + path);
  }
  return out;
}

void RegisterBackends(const GlobalOptions& global, backends::BackendRegistry& backends) {
  backends::RegisterCpuBackend(backends);
  backends::RegisterCudaBackend(backends);
  // sim's configuration travels in $COVERAGE_SIM_CONFIG so that worker
  // processes inherit it; by default the shipped configs/sim.json.
  backends::RegisterPluginBackends(backends, {.default_config_path = global.home + "/configs/sim.json"});
}

}  // namespace coverage::apps
