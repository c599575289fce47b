// Verdicts of the model-level stages (module, model, train): the options
// they are judged with and the item each check yields. Program replay
// (program_replay.h) produces them; the stage loop (stages/model_stage.h)
// stores them; worker processes (isolation/isolation.h) send them as JSON.
// The rules are Note [Model verdicts] and Note [Training verdicts] in
// model_check.cc.
//
// Torch-free.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/model_item.h"
#include "core/outcome.h"
#include "core/result.h"
#include "replay/compare_options.h"
#include "replay/replay.h"

namespace coverage::replay {

struct ModelCheckOptions {
  uint64_t seed = 0;
  ComparisonOptions comparison;              // the unit stage's tolerances
  GoldenMode golden = GoldenMode::kWhenNeeded;
  double min_cosine = 0.99;                  // of the flattened outputs
  int64_t top_k = 5;                         // language models: the backend's top-1 token
  double min_topk_agreement = 0.99;          //   must be in the reference's top-k at this share of positions
  // Training: the captured step (forward, loss, backward, optimizer) replayed
  // this many times, parameters carried over (Note [Training verdicts]).
  int train_steps = 3;
};

}  // namespace coverage::replay
