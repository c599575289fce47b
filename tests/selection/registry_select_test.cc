// The select step on a registry of real configs: features derived
// incrementally and resumably, reasons stored, selections stored.
#include <atomic>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/json_capped.h"
#include "registry/registry.h"
#include "selection/features.h"
#include "tests/support/family_defaults.h"
#include "selection/registry_select.h"
#include "tests/support/temp_dir.h"

namespace coverage::selection {
namespace {

using nlohmann::json;

// Every real config of data/hub/configs.jsonl, stored as a crawl would, plus
// two broken ones.
int64_t FillRegistry(registry::Registry& reg) {
  std::ifstream in(std::string(COVERAGE_SOURCE_DIR) + "/data/hub/configs.jsonl");
  std::vector<registry::HubModelRecord> models;
  std::vector<std::pair<std::string, std::string>> configs;
  std::string line;
  int64_t downloads = 1000000;
  while (std::getline(in, line)) {
    json j = *ParseJsonCapped(line, {.python_literals = true});  // some configs hold Infinity
    registry::HubModelRecord m;
    m.id = j.at("id");
    m.downloads = downloads -= 1000;
    m.model_type = j.at("config").value("model_type", "");
    models.push_back(m);
    configs.emplace_back(m.id, j.at("config").dump());
  }
  for (const char* id : {"broken/not-an-object", "broken/empty-object"}) {
    registry::HubModelRecord m;
    m.id = id;
    models.push_back(m);
  }
  configs.emplace_back("broken/not-an-object", "[1, 2, 3]");
  configs.emplace_back("broken/empty-object", "{}");
  EXPECT_TRUE(reg.StartCrawl("test").ok());
  EXPECT_TRUE(reg.StoreCrawlPage("test", models, {}, std::nullopt).ok());
  for (const auto& [id, config] : configs) EXPECT_TRUE(reg.StoreConfig(id, "fetched", "", config).ok());
  return static_cast<int64_t>(configs.size());
}

std::shared_ptr<const selection::FamilyDefaults> Defaults() { return testing::RealFamilyDefaults(); }

int64_t Count(registry::Registry& reg, const std::string& sql) { return std::stoll(reg.Query(sql)->rows[0][0]); }

TEST(SelectStage, DerivesFeaturesOnceStoresReasonsAndRederivesChangedConfigs) {
  testing::TempDir dir;
  auto reg = registry::Registry::Open(dir.File("r.db"));
  ASSERT_TRUE(reg.has_value());
  const int64_t n = FillRegistry(**reg);
  auto defaults = Defaults();
  DeriveOptions options;
  options.batch = 50;  // several batches
  int64_t progress_calls = 0;
  options.on_progress = [&](int64_t) { ++progress_calls; };
  auto first = DeriveFeatures(**reg, *defaults, options);
  ASSERT_TRUE(first.has_value()) << first.error().ToString();
  EXPECT_EQ(first->derived, n);
  EXPECT_EQ(first->failed, 2);
  EXPECT_GT(first->understood, 200);
  EXPECT_GE(progress_calls, n / 50);
  EXPECT_EQ(Count(**reg, "SELECT COUNT(*) FROM features WHERE status = 'failed' AND reason <> ''"), 2);
  EXPECT_EQ(Count(**reg, "SELECT COUNT(*) FROM v_feature_failures"), 2);
  // Nothing to do the second time.
  auto again = DeriveFeatures(**reg, *defaults, options);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->derived, 0);
  // A changed config drops its features; the next run derives only it.
  ASSERT_TRUE((*reg)->StoreConfig("broken/empty-object", "fetched", "", R"({"model_type": "bert"})").ok());
  auto changed = DeriveFeatures(**reg, *defaults, options);
  ASSERT_TRUE(changed.has_value());
  EXPECT_EQ(changed->derived, 1);
  EXPECT_EQ(changed->failed, 0);
  // Features of an older extractor version are derived again.
  ASSERT_TRUE((*reg)->Query("UPDATE features SET version = 0 WHERE model_id LIKE 'google%'").has_value());
  const int64_t google = Count(**reg, "SELECT COUNT(*) FROM features WHERE version = 0");
  ASSERT_GT(google, 0);
  auto old = DeriveFeatures(**reg, *defaults, options);
  ASSERT_TRUE(old.has_value());
  EXPECT_EQ(old->derived, google);
}

TEST(SelectStage, FeaturesOfAConfigThatChangedOrWentAwayAreNotUsed) {
  testing::TempDir dir;
  auto reg = registry::Registry::Open(dir.File("r.db"));
  ASSERT_TRUE(reg.has_value());
  FillRegistry(**reg);
  auto defaults = Defaults();
  ASSERT_TRUE(DeriveFeatures(**reg, *defaults).has_value());
  const std::string id = (*reg)->Query("SELECT model_id FROM features WHERE status = 'ok' LIMIT 1")->rows[0][0];
  // A later crawl finds the config gone: the model is not selected from.
  ASSERT_TRUE((*reg)->StoreConfig(id, "missing", "HTTP 404 EntryNotFound", "").ok());
  auto s = RunSelect(**reg, {});
  ASSERT_TRUE(s.has_value());
  for (size_t m = 0; m < s->population.size(); ++m) EXPECT_NE(s->population.id(m), id);

  // Features derived from a config text that was replaced meanwhile are not stored.
  registry::FeatureRecord stale;
  stale.model_id = "broken/empty-object";
  stale.version = selection::kFeatureExtractorVersion;
  stale.ok = false;
  stale.reason = "derived from an old text";
  stale.derived_from = "{\"model_type\": \"an older text\"}";
  auto stored = (*reg)->StoreFeatures({stale});
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(*stored, 0);
  EXPECT_EQ(Count(**reg, "SELECT COUNT(*) FROM features WHERE reason = 'derived from an old text'"), 0);
}

TEST(SelectStage, AnInterruptedDerivationKeepsItsBatchesAndGoesOn) {
  testing::TempDir dir;
  auto reg = registry::Registry::Open(dir.File("r.db"));
  ASSERT_TRUE(reg.has_value());
  const int64_t n = FillRegistry(**reg);
  auto defaults = Defaults();
  std::atomic<bool> stop{false};
  DeriveOptions options;
  options.batch = 40;
  options.stop = &stop;
  options.on_progress = [&](int64_t done) {
    if (done >= 80) stop = true;
  };
  auto first = DeriveFeatures(**reg, *defaults, options);
  ASSERT_FALSE(first.has_value());
  EXPECT_EQ(first.error().code(), StatusCode::kAborted);
  EXPECT_EQ(Count(**reg, "SELECT COUNT(*) FROM features"), 80);
  stop = false;
  options.on_progress = nullptr;
  auto rest = DeriveFeatures(**reg, *defaults, options);
  ASSERT_TRUE(rest.has_value());
  EXPECT_EQ(rest->derived, n - 80);
}

TEST(SelectStage, StoresTheSelectionWithReasonsAndMembers) {
  testing::TempDir dir;
  auto reg = registry::Registry::Open(dir.File("r.db"));
  ASSERT_TRUE(reg.has_value());
  FillRegistry(**reg);
  ASSERT_TRUE(DeriveFeatures(**reg, *Defaults()).has_value());
  // Nothing to select from without features is a clear error.
  testing::TempDir empty_dir;
  auto empty = registry::Registry::Open(empty_dir.File("e.db"));
  auto none = RunSelect(**empty, {});
  ASSERT_FALSE(none.has_value());
  EXPECT_NE(none.error().message().find("coverage crawl"), std::string::npos);

  SelectOptions options;
  options.k = 40;
  options.seed = 3;
  auto s = RunSelect(**reg, options);
  ASSERT_TRUE(s.has_value()) << s.error().ToString();
  const int64_t models = Count(**reg, "SELECT COUNT(*) FROM features WHERE status = 'ok'");
  EXPECT_EQ(static_cast<int64_t>(s->population.size()), models);
  EXPECT_EQ(s->failed_features, 2);
  EXPECT_EQ(Count(**reg, "SELECT COUNT(*) FROM representatives WHERE selection_id = " +
                             std::to_string(s->selection_id)),
            static_cast<int64_t>(s->selection.representatives.size()));
  EXPECT_EQ(Count(**reg, "SELECT COUNT(*) FROM selection_members"), models);
  EXPECT_EQ(Count(**reg, "SELECT SUM(stands_for) FROM v_representatives"), models);
  EXPECT_EQ(Count(**reg, "SELECT COUNT(*) FROM v_representatives WHERE reason = ''"), 0);
  auto stored = (*reg)->Query("SELECT coverage_json, k, seed FROM selections");
  json coverage = json::parse(stored->rows[0][0]);
  EXPECT_EQ(coverage.at("models").get<int64_t>(), models);
  EXPECT_EQ(coverage.at("coarse_covered").get<int64_t>(), std::min<int64_t>(40, coverage.at("coarse_total")));
  EXPECT_EQ(stored->rows[0][1], "40");
  EXPECT_EQ(stored->rows[0][2], "3");
  EXPECT_FALSE(s->unchanged);
  // The same inputs choose the same models: a rerun (say, of a select killed
  // after it stored) keeps the stored selection instead of a second copy.
  auto again = RunSelect(**reg, options);
  ASSERT_TRUE(again.has_value());
  EXPECT_TRUE(again->unchanged);
  EXPECT_EQ(again->selection_id, s->selection_id);
  EXPECT_EQ(Count(**reg, "SELECT COUNT(*) FROM selections"), 1);
  EXPECT_EQ(Count(**reg, "SELECT COUNT(*) FROM selection_members"), models);
  // Other inputs make a new selection, and going back to the first inputs
  // stores them again as the newest.
  options.k = 20;
  auto fewer = RunSelect(**reg, options);
  ASSERT_TRUE(fewer.has_value());
  EXPECT_FALSE(fewer->unchanged);
  EXPECT_EQ(fewer->selection_id, s->selection_id + 1);
  options.k = 40;
  auto back = RunSelect(**reg, options);
  ASSERT_TRUE(back.has_value());
  EXPECT_FALSE(back->unchanged);
  EXPECT_EQ(Count(**reg, "SELECT COUNT(*) FROM representatives a JOIN representatives b ON a.rank = b.rank AND "
                         "a.model_id = b.model_id AND a.selection_id = 1 AND b.selection_id = 3"),
            static_cast<int64_t>(s->selection.representatives.size()));
}

}  // namespace
}  // namespace coverage::selection
