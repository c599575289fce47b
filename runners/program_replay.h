// Program replay: a captured program (core/program.h) run call by call on a
// backend under test and on the CPU reference, through the same
// Backend::Execute as the unit stage. What an eager backend sees when the
// model runs on it, for any architecture the tracer captured, without a
// C++ copy of the model. See Note [Program replay] in program_replay.cc.
//
// Torch-free interface. Nothing here throws: a backend failure is an Outcome.
#pragma once

#include <cstdint>
#include <string>

#include "core/program.h"
#include "runners/model_check.h"

namespace coverage::runners {

class Backend;

struct ProgramReplayOptions {
  // Seed, tolerances, golden mode, cosine and top-k thresholds: the model
  // stage's (Note [Model verdicts]).
  ModelCheckOptions check;
  // When the free-running replay fails, replay again feeding every call the
  // reference's inputs to find the first call that misses its tolerance.
  bool locate_first_divergent = true;
};

// The whole program free-running on the backend (backend outputs feed later
// calls), judged on the program's outputs: the values no later call reads.
// The item is "forward"; its detail holds "first_divergent" (call index, op,
// op case key, module, phase, outcome, message) when the replay failed and a
// call could be blamed, and "replay" (calls run, peak live bytes, ...).
ModelCheckItem ReplayProgram(const Program& program, Backend& backend, const ProgramReplayOptions& options);

// One module's sub-program (the calls whose module path is `module` or lies
// below it) on the backend, fed the reference's values at its boundary;
// judged on the values it hands to calls outside it. The item is `module`.
ModelCheckItem ReplayModule(const Program& program, const std::string& module, Backend& backend,
                            const ProgramReplayOptions& options);

// The module paths to check in a module stage: the first instance of each
// module kind (a path with its layer indices dropped: model.layers.0.mlp and
// model.layers.1.mlp are one kind), in program order, leaves of the module
// tree that ran at least one call.
std::vector<std::string> ModuleKinds(const Program& program);

}  // namespace coverage::runners
