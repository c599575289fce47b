// HubModel: one model entry of the Hub API (`GET /api/models` list items and
// `GET /api/models/{id}`), parsed defensively: the id must pass the Hub's
// rules, every field must have its documented type, and JSON nesting is
// capped, so hostile or broken entries become per-model errors instead of
// crashes. Field names are the wire format's (shared/data/hub/API.md §3).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/json_capped.h"
#include "core/result.h"

namespace coverage::crawler {

struct HubModel {
  std::string id;
  std::string author;
  std::string sha;
  int64_t downloads = 0;
  int64_t likes = 0;
  std::vector<std::string> tags;
  std::string pipeline_tag;
  std::string library_name;
  std::string created_at;
  std::string last_modified;
  std::string gated = "false";  // "false", "auto" or "manual"
  bool is_private = false;
  std::string model_type;                  // from the entry's trimmed `config`
  std::vector<std::string> architectures;  // likewise
};

// Parses one entry. Errors name the model (when its id is readable) and the
// field that is wrong.
Result<HubModel> ParseHubModel(const nlohmann::json& entry);

}  // namespace coverage::crawler
