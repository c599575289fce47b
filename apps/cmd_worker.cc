// `coverage worker`: the process a run spawns to execute cases in isolation
// (runners/isolation.h). Not for people: it speaks JSON lines on fd 3.
#include <CLI/CLI.hpp>

#include "apps/app.h"
#include "runners/backends.h"
#include "runners/isolation.h"
#include "runners/worker.h"

namespace coverage::apps {

void AddWorkerCommand(CLI::App& app, GlobalOptions& global) {
  CLI::App* cmd = app.add_subcommand("worker", "Internal: executes cases for `run` in a separate process");
  cmd->group("");  // hidden from --help
  cmd->callback([&global]() {
    ApplyHostSettings(global);
    runners::BackendRegistry backends;
    RegisterBackends(global, backends);
    runners::WorkerService service([&](const std::string& name) { return backends.Create(name); });
    global.exit_code = runners::RunWorkerLoop([&](const std::string& request) { return service.Handle(request); });
  });
}

}  // namespace coverage::apps
