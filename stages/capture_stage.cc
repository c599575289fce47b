#include "stages/capture_stage.h"

#include <algorithm>
#include <chrono>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "core/progress.h"
#include "registry/registry.h"
#include "runners/capture.h"
#include "runners/model_builder.h"
#include "selection/features.h"

namespace coverage::stages {

namespace {

// The builds row of a model no input profile applies to.
constexpr const char* kNoProfile = "(none)";

// Stores one pair's calls with provenance; returns (calls, distinct cases).
Result<std::pair<int64_t, int64_t>> StoreCalls(registry::Registry& registry, const std::string& model_id,
                                               const std::string& profile,
                                               const std::vector<runners::CapturedCall>& calls) {
  int64_t call_count = 0;
  std::unordered_set<std::string> keys;
  COV_RETURN_IF_ERROR(registry.ClearCaseSources(model_id, profile));
  for (const auto& call : calls) {
    COV_ASSIGN_OR_RETURN(int64_t case_id, registry.UpsertCase(call.op_case, {call.flops, call.bytes}));
    registry::CaseSource src;
    src.model_id = model_id;
    src.module_path = call.module_path;
    src.call_site = call.parent_op;
    src.profile = profile;
    src.depth = call.depth;
    src.call_count = call.count;
    COV_RETURN_IF_ERROR(registry.AddCaseSource(case_id, src));
    call_count += call.count;
    keys.insert(call.key);
  }
  return std::make_pair(call_count, static_cast<int64_t>(keys.size()));
}

}  // namespace

Result<std::vector<capture::CaptureModel>> SelectionCaptureModels(registry::Registry& registry, int64_t selection_id,
                                                                  const std::vector<std::string>& only_models,
                                                                  int64_t* resolved_id) {
  COV_ASSIGN_OR_RETURN(auto models, registry.SelectionModels(selection_id, resolved_id));
  std::vector<capture::CaptureModel> out;
  for (const auto& m : models) {
    if (!only_models.empty() && std::find(only_models.begin(), only_models.end(), m.model_id) == only_models.end()) {
      continue;
    }
    capture::CaptureModel c;
    c.id = m.model_id;
    c.model_type = m.model_type;
    c.source = "selection " + std::to_string(*resolved_id);
    c.config_json = m.config_json;
    if (!m.features_json.empty()) {
      auto j = nlohmann::json::parse(m.features_json, nullptr, false);
      if (!j.is_discarded()) {
        auto f = selection::FeaturesFromJson(j);
        if (f) c.structure = f->structure;
      }
    }
    out.push_back(std::move(c));
  }
  for (const auto& id : only_models) {
    if (std::none_of(out.begin(), out.end(), [&](const auto& c) { return c.id == id; })) {
      return Status::InvalidArgument("--model '" + id + "' is not a representative of selection " +
                                     std::to_string(*resolved_id));
    }
  }
  return out;
}

Result<SelectionCaptureSummary> RunSelectionCapture(registry::Registry& registry,
                                                    const SelectionCaptureOptions& options) {
  SelectionCaptureSummary summary;
  COV_ASSIGN_OR_RETURN(auto models, registry.SelectionModels(options.selection_id, &summary.selection_id));
  if (!options.only_models.empty()) {
    std::vector<registry::SelectedModel> kept;
    for (const auto& id : options.only_models) {
      auto it = std::find_if(models.begin(), models.end(), [&](const auto& m) { return m.model_id == id; });
      if (it == models.end()) {
        return Status::InvalidArgument("--model '" + id + "' is not a representative of selection " +
                                       std::to_string(summary.selection_id));
      }
      kept.push_back(*it);
    }
    models = std::move(kept);
  }
  summary.representatives = static_cast<int64_t>(models.size());
  COV_ASSIGN_OR_RETURN(int64_t before, registry.CountCases());
  int64_t without_profile = 0;
  Progress progress("capture", summary.representatives, options.progress);
  for (size_t i = 0; i < models.size() && !summary.interrupted; ++i) {
    const registry::SelectedModel& model = models[i];
    progress.Update(static_cast<int64_t>(i), model.model_id);
    // Its features and config, as the select step stored them.
    Result<selection::Features> features = Status::InvalidArgument("its features could not be read when selected");
    nlohmann::json config = nlohmann::json::parse(model.config_json, nullptr, false);
    const auto record_no_profile = [&](const std::string& structure) -> Status {
      // No profile applies: the model would otherwise leave no trace.
      registry::BuildRecord build;
      build.model_id = model.model_id;
      build.profile = kNoProfile;
      build.builder_version = runners::kModelBuilderVersion;
      build.status = "not_built";
      build.reason = "no selected input profile applies to the " + (structure.empty() ? "unknown" : structure) +
                     " structure";
      ++without_profile;
      ++summary.not_built[build.reason];
      return registry.RecordBuild(build);
    };
    if (!model.features_json.empty()) {
      auto j = nlohmann::json::parse(model.features_json, nullptr, false);
      if (!j.is_discarded()) features = selection::FeaturesFromJson(j);
    }
    if (config.is_discarded()) config = nlohmann::json::object();
    bool any_profile = false;
    for (const auto& profile : options.profiles) {
      if (options.stop && options.stop->load()) {
        summary.interrupted = true;
        break;
      }
      const std::string structure = features ? features->structure : std::string();
      if (features && std::find(profile.families.begin(), profile.families.end(), structure) == profile.families.end()) {
        continue;  // the profile does not apply to this structure
      }
      any_profile = true;
      if (!options.force) {
        COV_ASSIGN_OR_RETURN(auto done, registry.GetBuild(model.model_id, profile.name));
        if (done && done->builder_version == runners::kModelBuilderVersion) {
          ++summary.pairs_skipped;
          continue;
        }
      }
      registry::BuildRecord build;
      build.model_id = model.model_id;
      build.profile = profile.name;
      build.builder_version = runners::kModelBuilderVersion;
      if (!features) {
        build.status = "not_built";
        build.reason = features.error().message();
        ++summary.pairs_not_built;
        ++summary.not_built[build.reason];
        COV_RETURN_IF_ERROR(registry.RecordBuild(build));
        break;  // the same for every profile
      }
      const runners::BuildPlan plan =
          runners::PlanModel(*features, config, profile,
                             runners::BuildOptions{options.max_layers, options.max_bytes, options.meta_over_budget});
      build.family = plan.family;
      build.layers_built = plan.layers_built;
      build.layers_total = plan.layers_total;
      build.estimated_bytes = plan.weight_bytes + plan.activation_bytes;
      build.estimated_flops = plan.flops;
      build.notes_json = nlohmann::json(plan.notes).dump();
      if (!plan.buildable) {
        build.status = "not_built";
        build.reason = plan.reason;
        ++summary.pairs_not_built;
        ++summary.not_built[plan.reason];
        COV_RETURN_IF_ERROR(registry.RecordBuild(build));
        continue;
      }
      const auto start = std::chrono::steady_clock::now();
      runners::OpRecorder recorder(runners::CaptureOptions{options.max_depth});
      Status ran = runners::RunModel(*features, plan, profile, recorder);
      build.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!ran.ok()) {
        build.status = "failed";
        build.reason = ran.message();
        ++summary.pairs_failed;
        COV_RETURN_IF_ERROR(registry.RecordBuild(build));
        continue;
      }
      const std::vector<runners::CapturedCall> calls = recorder.TakeCalls();
      COV_RETURN_IF_ERROR(registry.Begin());
      Status stored = [&]() -> Status {
        COV_ASSIGN_OR_RETURN(auto counts, StoreCalls(registry, model.model_id, profile.name, calls));
        build.status = "built";
        build.calls = counts.first;
        build.cases = counts.second;
        return registry.RecordBuild(build);
      }();
      if (!stored.ok()) {
        registry.Rollback().IgnoreError();
        return stored.WithContext("storing the capture of " + model.model_id + " / " + profile.name);
      }
      COV_RETURN_IF_ERROR(registry.Commit());
      COV_RETURN_IF_ERROR(registry.DeleteBuild(model.model_id, kNoProfile));
      ++summary.pairs_built;
      if (plan.meta) ++summary.pairs_meta;
      summary.calls += build.calls;
      summary.cases_seen += build.cases;
    }
    if (!any_profile && features && !summary.interrupted) COV_RETURN_IF_ERROR(record_no_profile(features->structure));
  }
  progress.Update(summary.representatives);
  progress.Finish();
  COV_ASSIGN_OR_RETURN(summary.cases_total, registry.CountCases());
  summary.cases_new = summary.cases_total - before;
  summary.models_without_profile = without_profile;
  return summary;
}

}  // namespace coverage::stages
