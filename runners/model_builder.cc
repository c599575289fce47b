#include "runners/model_builder.h"

#include "runners/model_builder_internal.h"

#include <cstdio>
#include <limits>

#include <ATen/CPUGeneratorImpl.h>

namespace coverage::runners {

BuildPlan PlanModel(const selection::Features& f, const nlohmann::json& config, const CaptureProfile& profile,
                    const BuildOptions& requested) {
  // With meta_over_budget, families plan without the budget and it is
  // applied here: over it, the plan runs on meta tensors instead.
  BuildOptions options = requested;
  const bool meta_allowed = requested.meta_over_budget && !profile.training;
  if (meta_allowed) options.max_bytes = std::numeric_limits<double>::infinity();
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
  } else if (s == "hybrid") {
    plan = builder::PlanHybrid(f, config, profile, options);
  } else if (s == "ssm") {
    plan = builder::PlanSsm(f, config, profile, options);
  } else if (s == "multimodal") {
    plan = builder::PlanMultimodal(f, config, profile, options);
  } else {
    plan.reason = "the " + (s.empty() ? std::string("unknown") : s) + " structure is not built yet";
  }
  plan.config = config;
  if (meta_allowed && plan.buildable && plan.weight_bytes + plan.activation_bytes > requested.max_bytes) {
    plan.meta = true;
    char buf[240];
    std::snprintf(buf, sizeof buf,
                  "needs about %.3g GB, over the %.3g GB budget: captured on meta tensors (shapes only; ops without "
                  "a meta kernel ran on zero-filled CPU tensors, so data-dependent shapes follow zero inputs)",
                  (plan.weight_bytes + plan.activation_bytes) / 1e9, requested.max_bytes / 1e9);
    plan.notes.push_back(buf);
  }
  if (plan.buildable && plan.layers_built < plan.layers_total) {
    plan.notes.push_back(std::to_string(plan.layers_built) + " of " + std::to_string(plan.layers_total) +
                         " layers built (layers repeat)");
  }
  return plan;
}

Status RunModel(const selection::Features& f, const BuildPlan& plan, const CaptureProfile& profile, OpRecorder& recorder,
                uint64_t seed) {
  ModelSession session(&recorder);
  session.training = profile.training;
  MetaShapeBackend meta;
  DispatchRoute route;  // observes op outputs (the model's output, for the loss); routes to meta when planned
  route.session = &session;
  if (profile.training || plan.meta) session.route = &route;
  if (plan.meta) {
    if (profile.training) return Status::InvalidArgument("a training profile cannot run on meta tensors");
    session.device = c10::Device(c10::kMeta);
    route.backend = &meta;
  }
  COV_RETURN_IF_ERROR(builder::RunInSession(f, plan, profile, session, seed));
  if (!profile.training) return Status::Ok();
  // A training step's loss and backward pass, recorded too.
  try {
    const at::Tensor out = session.output();
    if (!out.defined() || !out.requires_grad()) return Status::Internal("the model's output has no gradient");
    const builder::TrainingTarget target = builder::MakeTrainingTarget(f, out, seed);
    recorder.Start();
    recorder.SetModulePath("loss");
    const at::Tensor loss = builder::TrainingLoss(out, target);
    recorder.SetModulePath("backward");
    loss.backward();
    recorder.Stop();
  } catch (const std::exception& e) {
    recorder.Stop();
    return Status::Internal(std::string("the backward pass failed: ") + e.what());
  }
  return Status::Ok();
}

namespace builder {

bool IsLogits(const selection::Features& f, const at::Tensor& out) {
  return f.vocab > 1 && out.defined() && out.dim() >= 2 && out.size(-1) == f.vocab;
}

TrainingTarget MakeTrainingTarget(const selection::Features& f, const at::Tensor& output, uint64_t seed) {
  TrainingTarget t;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 17);
  if (IsLogits(f, output)) {
    t.labels = at::randint(0, output.size(-1), {output.numel() / output.size(-1)}, gen, at::TensorOptions(at::kLong));
  } else {
    t.target = at::randn(output.sizes(), gen);
  }
  return t;
}

at::Tensor TrainingLoss(const at::Tensor& output, const TrainingTarget& t) {
  const at::Tensor out = output.to(at::kFloat);
  return t.labels.defined() ? at::cross_entropy_loss(out.reshape({-1, out.size(-1)}), t.labels)
                            : at::mse_loss(out, t.target);
}

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
  if (family == "hybrid") status = RunHybrid(f, plan, profile, rec, seed);
  if (family == "ssm") status = RunSsm(f, plan, profile, rec, seed);
  if (family == "multimodal") status = RunMultimodal(f, plan, profile, rec, seed);
  // A session that stopped on purpose (it had what it watched for) succeeded.
  return rec.stopped() ? Status::Ok() : status;
}

}  // namespace builder

}  // namespace coverage::runners
