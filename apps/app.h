// Shared plumbing of the `coverage` CLI: where data and configs live, signal
// handling, reading files, opening the registry. Only the app reads the
// environment and config files; modules get options structs.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/result.h"
#include "capture/profiles.h"
#include "reports/report.h"

namespace CLI {
class App;
}
namespace coverage::registry {
class Registry;
}
namespace coverage::backends {
class BackendRegistry;
}

namespace coverage::apps {

// Exit codes a CI system can act on.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailures = 1;     // the run found unexpected failures
inline constexpr int kExitUsage = 2;        // bad flags, files or data; harness errors
inline constexpr int kExitInterrupted = 130;

struct GlobalOptions {
  std::string registry_path;  // --registry, $COVERAGE_REGISTRY, or ./coverage.db
  std::string home;           // --home, $COVERAGE_HOME, or the source tree it was built from
  bool quiet = false;         // no progress lines
  int threads = 0;            // ATen intra-op threads; 0 = one per available core
  double busy_timeout_s = 60;  // --busy-timeout, $COVERAGE_BUSY_TIMEOUT: waiting for another writer
  int exit_code = 0;          // set by the subcommand that ran
};

// The project folder holding configs/ and data/.
std::string DefaultHome();
std::string DefaultRegistryPath();

// Errors name the path and the reason ("Is a directory", "No such file ...").
Result<std::string> ReadFile(const std::string& path);

// SIGINT/SIGTERM set the returned flag; a second SIGINT exits at once.
const std::atomic<bool>* InstallStopHandler();

// Opens the registry. Unless `create` (capture), a missing file is a clear
// error that says how to create one, and no empty file is left behind.
Result<std::unique_ptr<registry::Registry>> OpenRegistry(const GlobalOptions& global, bool read_only,
                                                         bool create = false);

std::string GitRevision(const std::string& home);
// The Python the tracer runs in: `flag` (--python) when given, else
// $COVERAGE_PYTHON, else <home>/.venv/bin/python.
std::string TracerPython(const GlobalOptions& global, const std::string& flag);
std::string HostName();

// Applies process-wide settings (threads) before torch work starts.
void ApplyHostSettings(const GlobalOptions& global);

// Prints "coverage: error: <message>" to stderr and returns kExitUsage.
int ReportError(const Status& status);

// Input profiles from a capture_profiles.json; `only` (names) keeps those,
// in that order. Errors name the file and the profile.
Result<std::vector<capture::CaptureProfile>> LoadProfiles(const std::string& path, const std::vector<std::string>& only);

// Explicit registration (no static constructors): every backend this build
// offers, for `run` and for its workers.
void RegisterBackends(const GlobalOptions& global, backends::BackendRegistry& backends);

// Reports (apps/cmd_report.cc), shared by `report` and `nightly`.
struct ReportRequest {
  std::vector<std::string> runs;
  std::vector<std::string> baselines;
  bool find_baseline = true;
  std::string out_dir;       // default: reports/<first run> next to the registry
  std::string expectations;  // default: <home>/configs/expectations/<backend>.json when present
  std::vector<std::string> formats = {"html", "junit", "json"};
  double drift_factor = 4.0;
  double perf_spreads = 3.0;
  std::string title;
};
struct WrittenReports {
  std::vector<std::string> paths;
  bool regressed = false;                  // reports::Report::Regressed()
  std::map<std::string, int64_t> changes;  // change name -> cases and model items
  // Op cases judged slower than the baseline, with the baseline's warm
  // timing (Note [Fastest calls] in reports/build.cc), for the nightly to
  // measure again.
  struct PerfSuspect {
    std::string key;
    reports::WarmTiming base;
  };
  std::vector<PerfSuspect> perf_suspects;
};
// Builds the report, writes the files and prints a summary with their paths.
Result<WrittenReports> WriteReports(const GlobalOptions& global, registry::Registry& reg, const ReportRequest& request);

void AddCaptureCommand(CLI::App& app, GlobalOptions& global);
void AddImportCommand(CLI::App& app, GlobalOptions& global);
void AddNightlyCommand(CLI::App& app, GlobalOptions& global);
void AddReportCommand(CLI::App& app, GlobalOptions& global);
void AddMergeCommand(CLI::App& app, GlobalOptions& global);
void AddWorkerCommand(CLI::App& app, GlobalOptions& global);
void AddCrawlCommand(CLI::App& app, GlobalOptions& global);
void AddRegistryCommand(CLI::App& app, GlobalOptions& global);
void AddSelectCommand(CLI::App& app, GlobalOptions& global);
void AddRunCommand(CLI::App& app, GlobalOptions& global);

}  // namespace coverage::apps
