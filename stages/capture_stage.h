// The capture step's inputs and the model builder's capture.
//
// Capture itself is the tracer's (capture/tracer_capture.h): the models to
// capture come from a selection (SelectionCaptureModels) or from a JSONL
// file of configs (apps/cmd_capture.cc).
#pragma once

#include <atomic>
#include <map>
#include <string>
#include <vector>

#include "capture/tracer_capture.h"
#include "core/result.h"
#include "runners/blocks.h"

namespace coverage::registry {
class Registry;
}

namespace coverage::stages {

// The representatives of selection `selection_id` (0: the newest; the id
// used is stored in `*resolved_id`), or only `only_models` of them, as
// tracer capture inputs: config text, model type, and the structure their
// stored features name (so only the profiles for it are traced).
Result<std::vector<capture::CaptureModel>> SelectionCaptureModels(registry::Registry& registry, int64_t selection_id,
                                                                  const std::vector<std::string>& only_models,
                                                                  int64_t* resolved_id);

// Capture of a selection's representatives with the config-driven model
// builder (runners/model_builder.h), kept only to measure the tracer's
// fidelity against it (`coverage capture --selection --engine builder`)
// until program replay retires the model families: each representative is planned and,
// when buildable, built from its stored features and config and run under
// every profile whose `families` name its structure ("decoder", "encoder",
// "encoder-decoder", "vision", "conv", "speech"). Every (model, profile)
// gets a `builds` row (built, not built with the reason, or failed with the
// error) committed with its cases in one transaction, so an interrupted
// capture resumes and pairs done by the same builder version are skipped.
struct SelectionCaptureOptions {
  int64_t selection_id = 0;  // 0: the newest selection
  std::vector<std::string> only_models;  // empty: all representatives
  std::vector<runners::CaptureProfile> profiles;
  int64_t max_layers = 2;
  double max_bytes = 8e9;
  bool meta_over_budget = true;  // above max_bytes: capture shapes on meta tensors instead of refusing
  int max_depth = 0;
  bool force = false;
  bool progress = true;
  const std::atomic<bool>* stop = nullptr;
};

struct SelectionCaptureSummary {
  int64_t selection_id = 0;
  int64_t representatives = 0;
  int64_t pairs_built = 0;
  int64_t pairs_not_built = 0;  // the builder does not build it (reason stored)
  int64_t pairs_failed = 0;     // planned but the run failed (error stored)
  int64_t pairs_skipped = 0;    // done before by this builder version
  int64_t pairs_meta = 0;       // of the built ones: captured on meta tensors (over the memory budget)
  int64_t calls = 0;
  int64_t cases_seen = 0;
  int64_t cases_new = 0;
  int64_t cases_total = 0;
  int64_t models_without_profile = 0;  // no selected profile applies (a "(none)" row says so)
  bool interrupted = false;
  std::map<std::string, int64_t> not_built;  // reason -> pairs
};

Result<SelectionCaptureSummary> RunSelectionCapture(registry::Registry& registry, const SelectionCaptureOptions& options);

}  // namespace coverage::stages
