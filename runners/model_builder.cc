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
  } else if (s == "multimodal") {
    plan = builder::PlanMultimodal(f, config, profile, options);
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

Status RunModel(const selection::Features& f, const BuildPlan& plan, const CaptureProfile& profile, OpRecorder& recorder,
                uint64_t seed) {
  ModelSession session(&recorder);
  return builder::RunInSession(f, plan, profile, session, seed);
}

namespace builder {

Status RunInSession(const selection::Features& f, const BuildPlan& plan, const CaptureProfile& profile,
                    ModelSession& rec, uint64_t seed) {
  if (!plan.buildable) return Status::InvalidArgument("model is not buildable: " + plan.reason);
  rec.BeginRun(seed);
  return RunFamily(f, plan, profile, rec, seed);
}

Status RunFamily(const selection::Features& f, const BuildPlan& plan, const CaptureProfile& profile,
                 ModelSession& rec, uint64_t seed) {
  if (!plan.buildable) return Status::InvalidArgument("model is not buildable: " + plan.reason);
  const std::string& family = plan.family;
  Status status = Status::Internal("no builder for family '" + plan.family + "'");
  if (family == "decoder") status = RunDecoder(f, plan, profile, rec, seed);
  if (family == "encoder") status = RunEncoder(f, plan, profile, rec, seed);
  if (family == "encoder-decoder") status = RunEncoderDecoder(f, plan, profile, rec, seed);
  if (family == "vision") status = RunVision(f, plan, profile, rec, seed);
  if (family == "conv") status = RunConv(f, plan, profile, rec, seed);
  if (family == "speech") status = RunSpeech(f, plan, profile, rec, seed);
  if (family == "multimodal") status = RunMultimodal(f, plan, profile, rec, seed);
  // A session that stopped on purpose (it had what it watched for) succeeded.
  return rec.stopped() ? Status::Ok() : status;
}

}  // namespace builder

}  // namespace coverage::runners
