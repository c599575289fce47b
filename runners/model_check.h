// Model-level checks: a built model (model_builder.h) run on a backend under
// test and on the CPU reference with identical weights and inputs, at three
// levels:
//   module  one module of each kind (attention, MLP/MoE, norm, embedding,
//           stem / patch embedding, head) run on the backend with the exact
//           inputs the reference computed for it;
//   model   the whole forward pass on the backend;
//   train   N steps of forward, backward and AdamW on a fixed synthetic batch.
// The backend receives the model's ops through dispatch routing (Note
// [Dispatch routing] in model_session.h). Verdicts use the unit stage's rules
// (Note [Tolerances]) plus model-level ones (Note [Model verdicts] in
// model_check.cc).
//
// Torch-free interface. Nothing here throws: a backend failure is an Outcome.
// Thread safety: one check at a time per thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/outcome.h"
#include "runners/compare_options.h"
#include "runners/model_builder.h"
#include "runners/replay.h"

namespace coverage::runners {

class Backend;

struct ModelCheckOptions {
  uint64_t seed = 0;
  ComparisonOptions comparison;              // the unit stage's tolerances
  GoldenMode golden = GoldenMode::kWhenNeeded;
  double min_cosine = 0.99;                  // of the flattened outputs
  int64_t top_k = 5;                         // language models: the backend's top-1 token
  double min_topk_agreement = 0.99;          //   must be in the reference's top-k at this share of positions
  // Training.
  int train_steps = 3;
  double learning_rate = 1e-3;               // AdamW, as torch.optim.AdamW
  double weight_decay = 0.01;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double loss_rtol = 1e-3;                   // per step, relative to the reference loss (fp32;
                                             // 16-bit profiles use 10x)
  double grad_norm_rtol = 1e-3;              // each parameter's gradient norm, every step (likewise)
  double param_update_rtol = 0.05;           // ||p_backend - p_ref|| / ||p_ref - p_initial|| after the last step
};

struct ModelCheckItem {
  std::string item;  // module kind ("attention", ...), "forward" or "train"
  Outcome outcome = Outcome::kPass;
  std::string error;  // why it is not a pass
  double max_abs_err = 0;
  double max_rel_err = 0;
  double cosine = 1;
  std::optional<double> error_ratio;  // vs the fp64 golden, when it ran
  bool values_compared = false;       // the metrics above mean something (not for errors and skips)
  nlohmann::json detail = nlohmann::json::object();  // module path, top-k, losses, grad norms, op counts
  double seconds = 0;
};

// One item per module kind the model has, in the order the kinds first run.
std::vector<ModelCheckItem> CheckModules(const selection::Features& features, const BuildPlan& plan,
                                         const CaptureProfile& profile, Backend& backend,
                                         const ModelCheckOptions& options);
// The whole forward pass ("forward").
ModelCheckItem CheckForward(const selection::Features& features, const BuildPlan& plan, const CaptureProfile& profile,
                            Backend& backend, const ModelCheckOptions& options);
// options.train_steps optimizer steps ("train").
ModelCheckItem CheckTraining(const selection::Features& features, const BuildPlan& plan,
                             const CaptureProfile& profile, Backend& backend, const ModelCheckOptions& options);

}  // namespace coverage::runners
