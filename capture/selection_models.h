// A selection's representatives as the tracer takes them: the capture
// step's inputs, and the structure that picks each one's input profiles
// (the program stages read it too).
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
struct SelectedModel;
}

namespace coverage::capture {

// The representatives of selection `selection_id` (0: the newest; the id
// used is stored in `*resolved_id`), or only `only_models` of them, as
// tracer capture inputs: config text, model type, and the structure their
// stored features name (so only the profiles for it are traced).
Result<std::vector<capture::CaptureModel>> SelectionCaptureModels(registry::Registry& registry, int64_t selection_id,
                                                                  const std::vector<std::string>& only_models,
                                                                  int64_t* resolved_id);

// The model structure ("decoder", "vision", ...) a representative's stored
// features name, which picks its input profiles; an error says why there is
// none.
Result<std::string> StoredStructure(const registry::SelectedModel& model);

}  // namespace coverage::capture
