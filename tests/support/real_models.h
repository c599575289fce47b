// Registry fixtures from the real Hub data: stores chosen models with their
// real config.json (data/hub/configs.jsonl) as if crawled, derives features
// and selects them all as representatives.
#pragma once

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/json_capped.h"
#include "registry/registry.h"
#include "selection/registry_select.h"
#include "tests/support/family_defaults.h"

namespace coverage::testing {

inline void StoreRealModels(registry::Registry& reg, const std::vector<std::string>& ids) {
  std::ifstream in(std::string(COVERAGE_SOURCE_DIR) + "/data/hub/configs.jsonl");
  std::string line;
  std::vector<registry::HubModelRecord> models;
  std::vector<std::pair<std::string, std::string>> configs;
  while (std::getline(in, line)) {
    auto j = ParseJsonCapped(line, {.python_literals = true});
    ASSERT_TRUE(j.has_value());
    const std::string id = (*j)["id"];
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) continue;
    registry::HubModelRecord m;
    m.id = id;
    m.downloads = 1000 - static_cast<int64_t>(models.size());
    m.model_type = (*j)["config"].value("model_type", "");
    models.push_back(m);
    configs.emplace_back(id, (*j)["config"].dump());
  }
  ASSERT_EQ(models.size(), ids.size());
  ASSERT_TRUE(reg.StartCrawl("test").ok());
  ASSERT_TRUE(reg.StoreCrawlPage("test", models, {}, std::nullopt).ok());
  for (const auto& [id, config] : configs) ASSERT_TRUE(reg.StoreConfig(id, "fetched", "", config).ok());
}

// Derives features and selects every stored model (k = their number).
inline void SelectAll(registry::Registry& reg, int k) {
  ASSERT_TRUE(selection::DeriveFeatures(reg, *RealFamilyDefaults()).has_value());
  selection::SelectOptions select;
  select.k = k;
  ASSERT_TRUE(selection::RunSelect(reg, select).has_value());
}

}  // namespace coverage::testing
