// The worker's side of isolation (`coverage worker`, apps/cmd_worker.cc):
// answers one request line with one reply line in the protocol of
// isolation/isolation.h. The setup comes first; every later request goes to
// the test stage family that owns it (apps/test_stages.h).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "apps/test_stages.h"
#include "core/program.h"
#include "core/result.h"

namespace coverage::apps {

class WorkerService {
 public:
  using BackendMaker = std::function<Result<std::shared_ptr<backends::Backend>>(const std::string& name)>;
  // Loads a captured program: (registry path, model id, profile).
  using ProgramLoader =
      std::function<Result<Program>(const std::string& registry, const std::string& model_id, const std::string& profile)>;
  WorkerService(BackendMaker make_backend, ProgramLoader load_program);
  std::string Handle(const std::string& request);

 private:
  nlohmann::json Setup(const nlohmann::json& setup);

  BackendMaker make_backend_;
  ProgramLoader load_program_;
  std::unique_ptr<WorkerState> state_;  // after the setup
};

}  // namespace coverage::apps
