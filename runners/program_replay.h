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
#include <vector>

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

// Modules' own calls (those whose module path is exactly the module; its
// sub-modules are modules of their own) on the backend, each module fed the
// reference's values at its boundary, judged on the values it hands to calls
// outside it: one item per module, named by its path, from one pass of the
// program. A failure inside a module is that module's item; the others are
// then skipped as not reached.
std::vector<ModelCheckItem> ReplayModules(const Program& program, const std::vector<std::string>& modules,
                                          Backend& backend, const ProgramReplayOptions& options);
ModelCheckItem ReplayModule(const Program& program, const std::string& module, Backend& backend,
                            const ProgramReplayOptions& options);

// The training program (forward, loss, backward, optimizer) replayed
// options.check.train_steps times, parameters carried over, judged as the
// train stage judges (Note [Model verdicts], Note [Reproducible training]):
// each step's loss, each gradient's norm, and the parameters after the last
// step against how far the reference's moved. The item is "train".
ModelCheckItem ReplayTraining(const Program& program, Backend& backend, const ProgramReplayOptions& options);

// The module paths a module stage checks: the first instance of each module
// kind (the path with its layer indices dropped: model.layers.0.mlp and
// model.layers.1.mlp are one kind) that made calls of its own in the
// forward phase, in program order.
std::vector<std::string> ModuleKinds(const Program& program);

}  // namespace coverage::runners
