// `coverage worker`: the process a run spawns to execute cases in isolation
// (isolation/isolation.h), answering through apps/worker_service.h. Not for
// people: it speaks JSON lines on fd 3.
#include <CLI/CLI.hpp>

#include "apps/app.h"
#include "registry/registry.h"
#include "backends/backends.h"
#include "apps/worker_service.h"
#include "isolation/worker.h"

namespace coverage::apps {

void AddWorkerCommand(CLI::App& app, GlobalOptions& global) {
  CLI::App* cmd = app.add_subcommand("worker", "Internal: executes cases for `run` in a separate process");
  cmd->group("");  // hidden from --help
  cmd->callback([&global]() {
    ApplyHostSettings(global);
    backends::BackendRegistry backends;
    RegisterBackends(global, backends);
    // Programs for the model stages, from the registry the run names (read
    // only; opened once, on the first model request).
    std::unique_ptr<registry::Registry> reg;
    std::string reg_path;
    auto load_program = [&](const std::string& path, const std::string& model_id,
                            const std::string& profile) -> Result<Program> {
      if (!reg || reg_path != path) {
        auto opened = registry::Registry::Open(path, {.read_only = true});
        if (!opened) return opened.error();
        reg = std::move(*opened);
        reg_path = path;
      }
      COV_ASSIGN_OR_RETURN(auto program, reg->LoadProgram(model_id, profile));
      if (!program) return Status::NotFound("no captured program for " + model_id + " / " + profile + " in " + path);
      return std::move(*program);
    };
    WorkerService service([&](const std::string& name) { return backends.Create(name); }, load_program);
    global.exit_code = isolation::RunWorkerLoop([&](const std::string& request) { return service.Handle(request); });
  });
}

}  // namespace coverage::apps
