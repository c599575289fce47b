// ModelItemResult: the verdict on one item of a model-level stage (module,
// model, train): a module path, "forward" or "train". It is the one record of
// an item from program replay (replay/program_replay.h) through the worker's
// reply (isolation/protocol.h) and the registry's model_results row
// (registry::ModelResultRecord holds it) to the report (reports::
// ModelItemEntry holds those), as CaseResult is for an op case.
//
// Torch-free.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/outcome.h"
#include "core/result.h"

namespace coverage {

struct ModelItemResult {
  std::string item;  // a module path ("model.layers.0.mlp"), "forward", "train", or "*" for a skipped stage
  Outcome outcome = Outcome::kPass;
  std::string error;  // why it is not a pass
  // Over the item's compared outputs; empty when no values were compared
  // (errors, skips, shape-only outputs). Note [Model verdicts] in
  // replay/model_check.cc.
  std::optional<double> max_abs_err, max_rel_err, cosine;
  std::optional<double> error_ratio;  // vs the fp64 golden, when it ran
  // First divergent call, top-k, losses, grad norms, replay counts, the
  // program's size: a JSON object.
  nlohmann::json detail = nlohmann::json::object();
  double seconds = 0;
  // Reruns (isolation/isolation.h): the outcome above is the first attempt's.
  int attempts = 1;
  bool flaky = false;
  std::vector<Outcome> attempt_outcomes;

  bool values_compared() const { return max_abs_err.has_value(); }
  // "crash,pass"; "" for one attempt (as CaseResult's).
  std::string AttemptOutcomesText() const;
  Status SetAttemptOutcomesText(std::string_view text);
  nlohmann::json ToJsonValue() const;
  static Result<ModelItemResult> FromJsonValue(const nlohmann::json& j);
};

}  // namespace coverage
