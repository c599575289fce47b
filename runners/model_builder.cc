#include "runners/model_builder.h"

#include "runners/model_builder_internal.h"

namespace coverage::runners {

BuildPlan PlanModel(const selection::Features& f, const nlohmann::json& config, const CaptureProfile& profile,
                    const BuildOptions& options) {
  BuildPlan plan;
  const std::string& s = f.structure;
  if (s == "decoder") {
    plan = builder::PlanDecoder(f, config, profile, options);
  } else if (s == "encoder") {
    plan = builder::PlanEncoder(f, config, profile, options);
  } else if (s == "encoder-decoder") {
    plan = builder::PlanEncoderDecoder(f, config, profile, options);
  } else if (s == "vision") {
    plan = builder::PlanVision(f, config, profile, options);
  } else if (s == "conv") {
    plan = builder::PlanConv(f, config, profile, options);
  } else if (s == "speech") {
    plan = builder::PlanSpeech(f, config, profile, options);
  } else {
    plan.reason = "the " + (s.empty() ? std::string("unknown") : s) + " structure is not built yet";
  }
  plan.config = config;
  if (plan.buildable && plan.layers_built < plan.layers_total) {
    plan.notes.push_back(std::to_string(plan.layers_built) + " of " + std::to_string(plan.layers_total) +
                         " layers built (layers repeat)");
  }
  return plan;
}

Status RunModel(const selection::Features& f, const BuildPlan& plan, const CaptureProfile& profile, OpRecorder& rec,
                uint64_t seed) {
  if (!plan.buildable) return Status::InvalidArgument("model is not buildable: " + plan.reason);
  const std::string& family = plan.family;
  if (family == "decoder") return builder::RunDecoder(f, plan, profile, rec, seed);
  if (family == "encoder") return builder::RunEncoder(f, plan, profile, rec, seed);
  if (family == "encoder-decoder") return builder::RunEncoderDecoder(f, plan, profile, rec, seed);
  if (family == "vision") return builder::RunVision(f, plan, profile, rec, seed);
  if (family == "conv") return builder::RunConv(f, plan, profile, rec, seed);
  if (family == "speech") return builder::RunSpeech(f, plan, profile, rec, seed);
  return Status::Internal("no builder for family '" + plan.family + "'");
}

}  // namespace coverage::runners
