// The model-level stages: module, model and train, run over the
// representatives of a selection on a backend by replaying the programs
// `coverage capture` recorded (replay/program_replay.h), in that order for
// each model, with their results in the registry's model_results.
//
// One profile per stage, chosen by the model's structure:
//   module, model  the profile named with --profile, else the first profile in
//                  configs/capture_profiles.json that applies to the model's
//                  structure, has no KV cache and is not a training profile;
//   train          the first applicable training profile, else the same one.
// A (model, profile) without a captured program is skipped with the
// capture's own reason (not built, refused, failed) or, when it was never
// traced, with the command that captures it.
// Cost caps: a stage whose estimated FLOPs (the program's, times the runs
// the stage makes) exceed max_model_flops is skipped with the estimate
// stored; so is a program whose largest live set, on the backend and the
// reference together, exceeds max_bytes (core/program.h EstimateFootprint).
// Gating: with `gate`, a model whose earlier stage did not pass skips its
// later stages; the skipped row names what blocked it ("module:model.norm").
//
// Resuming: running again with the same run id skips the (model, profile,
// stage) triples that already have results (skips by cost or gate are
// retried); each triple is stored in one transaction.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "capture/profiles.h"
#include "core/outcome.h"
#include "core/result.h"
#include "replay/program_replay.h"
#include "stages/stage_run.h"

namespace coverage::registry {
class Registry;
}
namespace coverage::backends {
class Backend;
}

namespace coverage::stages {

inline constexpr const char* kModelStages[] = {"module", "model", "train"};

// The run itself (id, backend, config_json, shard, stop) is StageRunOptions';
// config_json's "checks" member must match on resume. A shard runs whole
// models (all stages of a model stay together).
struct ModelStageOptions : StageRunOptions {
  std::vector<std::string> stages;    // a subset of kModelStages; run in that order
  // Which models: the listed ids (a user's own list, imported with
  // `coverage capture --models`), else every model with a captured program
  // (all_captured), else the representatives of a selection.
  std::vector<std::string> model_ids;
  bool all_captured = false;
  int64_t selection_id = 0;           // 0: the latest selection
  std::vector<std::string> models;    // glob patterns over model ids; empty: all of them
  std::vector<capture::CaptureProfile> profiles;
  std::string profile;                // force this profile for module and model (and train)
  double max_bytes = 8e9;
  std::optional<double> max_model_flops;  // per model and stage
  bool gate = false;
  replay::ModelCheckOptions checks;
};

struct ModelStageSummary {
  std::string run_id;
  bool resumed = false;
  bool interrupted = false;
  int64_t models = 0;           // representatives considered
  int64_t not_captured = 0;     // (model, stage) pairs without a captured program (the capture's reason shown)
  int64_t already_done = 0;     // (model, stage) pairs with results before this invocation
  int64_t executed = 0;         // (model, stage) pairs run now
  int64_t skipped_by_cost = 0;
  int64_t blocked = 0;          // skipped by the gate
  int64_t outside_shard = 0;    // representatives other shards run
  int64_t was_in_flight = 0;    // stages an earlier invocation sent to a worker and did not finish
  double seconds = 0;
  // Whole run: per stage, models by their worst item's outcome.
  std::map<std::string, std::map<Outcome, int64_t>> per_stage;
  std::map<std::string, std::map<std::string, int64_t>> failing_items;  // stage -> item -> models
  int64_t failing_total = 0;          // failing items in the whole run
  std::vector<std::string> failures;  // "stage model (profile) item: outcome: error", the first 100
  std::map<std::string, int64_t> not_captured_reasons;
  bool Failed() const;
};

// Runs each (model, stage) through `runner` (in-process or in a worker,
// isolation/isolation.h). Each is marked in flight before it is sent and
// the mark is cleared with its results, in one transaction.
Result<ModelStageSummary> RunModelStages(registry::Registry& registry, replay::ProgramStageRunner& runner,
                                         const ModelStageOptions& options);
// In-process on `backend`, with options.checks.
Result<ModelStageSummary> RunModelStages(registry::Registry& registry, backends::Backend& backend,
                                         const ModelStageOptions& options);

}  // namespace coverage::stages
