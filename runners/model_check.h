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
  // Reruns (isolation.h): the outcome above is the first attempt's.
  int attempts = 1;
  bool flaky = false;
  std::vector<Outcome> attempt_outcomes;
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

// Runs one model-level stage ("module", "model" or "train") of one model and
// returns its items. The stage loop (stages/model_stage.h) talks to this seam;
// InProcessModelStageRunner runs on the calling thread, the isolated one
// (isolation.h) in a worker process, which plans the model again from the
// same inputs (`plan` is what the caller planned with `build`).
class ModelStageRunner {
 public:
  virtual ~ModelStageRunner() = default;
  virtual std::vector<ModelCheckItem> Run(const std::string& stage, const selection::Features& features,
                                          const nlohmann::json& config, const CaptureProfile& profile,
                                          const BuildOptions& build, const BuildPlan& plan) = 0;
  // A failure of the harness itself (a worker that cannot start); the stage
  // loop stops with it and does not store the last Run's items.
  virtual Status HarnessStatus() const { return Status::Ok(); }
};

class InProcessModelStageRunner final : public ModelStageRunner {
 public:
  InProcessModelStageRunner(Backend& backend, ModelCheckOptions options)
      : backend_(backend), options_(std::move(options)) {}
  std::vector<ModelCheckItem> Run(const std::string& stage, const selection::Features& features,
                                  const nlohmann::json& config, const CaptureProfile& profile,
                                  const BuildOptions& build, const BuildPlan& plan) override;

 private:
  Backend& backend_;
  ModelCheckOptions options_;
};

// JSON forms, for worker messages.
nlohmann::json ModelCheckItemToJson(const ModelCheckItem& item);
Result<ModelCheckItem> ModelCheckItemFromJson(const nlohmann::json& j);

}  // namespace coverage::runners
