// Program replay: a captured program (core/program.h) run call by call on a
// backend under test and on the CPU reference, through the same
// Backend::Execute as the unit stage. What an eager backend sees when the
// model runs on it, for any architecture the tracer captured, without a
// C++ copy of the model. See Note [Program replay] in program_replay.cc.
//
// Torch-free interface. Nothing here throws: a backend failure is an Outcome.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "core/program.h"
#include "replay/model_check.h"

namespace coverage::backends {
class Backend;  // backends/backend.h (torch-facing)
}  // namespace coverage::backends

namespace coverage::replay {

using backends::Backend;

struct ProgramReplayOptions {
  // Seed, tolerances, golden mode, cosine and top-k thresholds: the model
  // stage's (Note [Model verdicts]).
  ModelCheckOptions check;
  // When the free-running replay fails, replay again feeding every call the
  // reference's inputs to find the first call that misses its tolerance.
  bool locate_first_divergent = true;
  // Called before each call runs on the backend (a worker says where it is:
  // Note [Where a worker died] in isolation/isolation.cc).
  std::function<void(const ProgramCall&)> before_backend_call;
  // The module stage leaves these modules out (each killed a worker: Note
  // [A module that kills its worker] in isolation/isolation.cc).
  std::set<std::string> skip_modules;
};

// The whole program free-running on the backend (backend outputs feed later
// calls), judged on the program's outputs: the values no later call reads.
// The item is "forward"; its detail holds "first_divergent" (call index, op,
// op case key, module, phase, outcome, message) when the replay failed and a
// call could be blamed, and "replay" (calls run, peak live bytes, ...).
ModelItemResult ReplayProgram(const Program& program, Backend& backend, const ProgramReplayOptions& options);

// Modules' own calls (those whose module path is exactly the module; its
// sub-modules are modules of their own) on the backend, each module fed the
// reference's values at its boundary, judged on the values it hands to calls
// outside it: one item per module, named by its path, from one pass of the
// program. A failure inside a module is that module's item; the others are
// then skipped as not reached.
std::vector<ModelItemResult> ReplayModules(const Program& program, const std::vector<std::string>& modules,
                                           Backend& backend, const ProgramReplayOptions& options);
ModelItemResult ReplayModule(const Program& program, const std::string& module, Backend& backend,
                             const ProgramReplayOptions& options);

// The training program (forward, loss, backward, optimizer) replayed
// options.check.train_steps times, parameters carried over, judged as the
// train stage judges (Note [Model verdicts], Note [Training verdicts]):
// each step's loss, each gradient's norm, and the parameters after the last
// step against how far the reference's moved. The item is "train".
ModelItemResult ReplayTraining(const Program& program, Backend& backend, const ProgramReplayOptions& options);

// What replaying a program in a model-level stage holds in memory at most,
// estimated before it runs (Note [Memory estimate] in program_replay.cc):
// the replay with reference and backend side by side, and the fp64 golden
// with what the replay keeps for it. `backend_on_host` says the backend's
// tensors are not the CPU's own (every backend but cpu): its results then
// pass through copies.
struct MemoryEstimate {
  double bytes = 0;         // the larger of the two phases
  double replay_bytes = 0;  // both sides, the judged outputs, the call's copies
  double golden_bytes = 0;  // the fp64 golden, with what the replay keeps for it
  int64_t calls_without_shapes = 0;  // calls without a meta kernel: outputs sized by their readers
  std::string error;        // the program cannot be sized (a call that cannot be built); bytes stays 0
};
// What a stage's process holds besides tensors while it runs (thread
// pools, kernel scratch), in every estimate; and the share its tensors'
// own size is raised by (Note [Memory estimate]).
inline constexpr double kStageWorkingBytes = 0.08e9;
inline constexpr double kStageMemoryMargin = 1.03;
MemoryEstimate EstimateMemory(const Program& program, const std::string& stage, const ProgramReplayOptions& options,
                              bool backend_copies);

// The module paths a module stage checks: the first instance of each module
// kind (the path with its layer indices dropped: model.layers.0.mlp and
// model.layers.1.mlp are one kind) that made calls of its own in the
// forward phase, in program order.
std::vector<std::string> ModuleKinds(const Program& program);

// One model-level stage of one captured program: "module" (ReplayModules
// over ModuleKinds), "model" (ReplayProgram) or "train" (ReplayTraining).
std::vector<ModelItemResult> RunProgramStage(const std::string& stage, const Program& program, Backend& backend,
                                             const ProgramReplayOptions& options);

// The seam the model stages (stages/model_stage.h) talk to: in this process
// (InProcessProgramStageRunner) or in a worker (isolation.h), which loads the
// program from the registry itself.
class ProgramStageRunner {
 public:
  virtual ~ProgramStageRunner() = default;
  virtual std::vector<ModelItemResult> Run(const std::string& stage, const std::string& model_id,
                                           const std::string& profile, const Program& program) = 0;
  // A failure of the harness itself (a worker that cannot start); the stage
  // loop stops with it and does not store the last Run's items.
  virtual Status HarnessStatus() const { return Status::Ok(); }
};

class InProcessProgramStageRunner final : public ProgramStageRunner {
 public:
  InProcessProgramStageRunner(Backend& backend, ProgramReplayOptions options)
      : backend_(backend), options_(std::move(options)) {}
  std::vector<ModelItemResult> Run(const std::string& stage, const std::string& model_id, const std::string& profile,
                                   const Program& program) override;

 private:
  Backend& backend_;
  ProgramReplayOptions options_;
};

}  // namespace coverage::replay
