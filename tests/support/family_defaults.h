// Real data for tests, loaded once per test process: the family defaults
// (data/transformers_defaults.jsonl) and files of {"id", "config"} lines
// (data/hub/configs.jsonl, data/seed_models.jsonl). Needs COVERAGE_SOURCE_DIR.
#pragma once

#include <fstream>
#include <map>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/json_capped.h"
#include "selection/features.h"

namespace coverage::testing {

inline std::shared_ptr<const selection::FamilyDefaults> RealFamilyDefaults() {
  static const auto loaded =
      selection::FamilyDefaults::Load(std::string(COVERAGE_SOURCE_DIR) + "/data/transformers_defaults.jsonl");
  EXPECT_TRUE(loaded.has_value()) << (loaded ? "" : loaded.error().ToString());
  return loaded ? *loaded : selection::FamilyDefaults::Empty();
}

// id -> config of a project file (path from the source root) of
// {"id", "config"} lines; Python's NaN/Infinity read as null.
inline std::map<std::string, nlohmann::json> ConfigsOf(const std::string& file) {
  std::map<std::string, nlohmann::json> out;
  std::ifstream in(std::string(COVERAGE_SOURCE_DIR) + file);
  std::string line;
  while (std::getline(in, line)) {
    auto j = ParseJsonCapped(line, {.python_literals = true});
    if (j && j->contains("id") && (*j)["id"].is_string()) out[(*j)["id"].get<std::string>()] = (*j)["config"];
  }
  return out;
}

// The 273 real configs of data/hub/configs.jsonl, by model id.
inline const std::map<std::string, nlohmann::json>& RealHubConfigs() {
  static const auto configs = ConfigsOf("/data/hub/configs.jsonl");
  return configs;
}

}  // namespace coverage::testing
