// The capture step's inputs: a selection's representatives as the tracer
// takes them.
//
// Capture itself is the tracer's (capture/tracer_capture.h): the models to
// capture come from a selection (SelectionCaptureModels) or from a JSONL
// file of configs (apps/cmd_capture.cc).
#pragma once

#include <string>
#include <vector>

#include "capture/tracer_capture.h"
#include "core/result.h"

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

}  // namespace coverage::stages
