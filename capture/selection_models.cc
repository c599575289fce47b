#include "capture/selection_models.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "registry/registry.h"
#include "selection/features.h"

namespace coverage::capture {

Result<std::string> StoredStructure(const registry::SelectedModel& model) {
  if (model.features_json.empty()) return Status::InvalidArgument("its features could not be read when selected");
  auto j = nlohmann::json::parse(model.features_json, nullptr, false);
  if (j.is_discarded()) return Status::InvalidArgument("its features could not be read when selected");
  COV_ASSIGN_OR_RETURN(auto features, selection::FeaturesFromJson(j));
  return features.structure;
}

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
    if (auto structure = StoredStructure(m)) c.structure = *structure;
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

}  // namespace coverage::capture
