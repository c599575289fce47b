// coverage: which real models run correctly on a PyTorch backend.
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "apps/app.h"
#include "apps/flags.h"
#include "backends/host.h"

int main(int argc, char** argv) {
  using namespace coverage::apps;
  coverage::backends::KeepFreedHostMemory();
  CLI::App app{
      "coverage: model-coverage test harness for PyTorch backends.\n"
      "Captures the ops and shapes real models execute into a SQLite registry,\n"
      "replays them on a backend against the CPU reference, and reports."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "coverage 0.1.0");
  GlobalOptions global;
  global.registry_path = DefaultRegistryPath();
  global.home = DefaultHome();
  app.add_option("--registry", global.registry_path, "Registry database file ($COVERAGE_REGISTRY)")
      ->capture_default_str();
  app.add_option("--home", global.home, "Folder holding configs/ and data/ ($COVERAGE_HOME)")->capture_default_str();
  app.add_flag("-q,--quiet", global.quiet, "No progress output");
  app.add_option("--busy-timeout", global.busy_timeout_s,
                 "Seconds to wait for another writer of the registry before giving up ($COVERAGE_BUSY_TIMEOUT)")
      ->envname("COVERAGE_BUSY_TIMEOUT")
      ->capture_default_str()
      ->check(FiniteRange(0, 86400));
  app.add_option("--threads", global.threads, "ATen intra-op threads (0 = one per available core)")
      ->capture_default_str()
      ->check(ThreadCount());
  AddCrawlCommand(app, global);
  AddSelectCommand(app, global);
  AddCaptureCommand(app, global);
  AddImportCommand(app, global);
  AddRegistryCommand(app, global);
  AddRunCommand(app, global);
  AddMergeCommand(app, global);
  AddReportCommand(app, global);
  AddNightlyCommand(app, global);
  AddWorkerCommand(app, global);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);  // prints help/version (rc 0) or the parse error
    return rc == 0 ? 0 : kExitUsage;
  } catch (const std::exception& e) {
    // A bug, not bad input (that gets a Status): say so rather than abort.
    std::fprintf(stderr, "coverage: internal error: %s\n", e.what());
    return kExitUsage;
  }
  return global.exit_code;  // set by the subcommand's callback
}
