// The crawler against hub-replay over real HTTP: what it stores is exactly
// what the hub serves, with and without injected faults.
#include <gtest/gtest.h>

#include "crawler/crawl.h"
#include "crawler/curl_http_client.h"
#include "registry/registry.h"
#include "crawler/registry_sink.h"
#include "tests/support/temp_dir.h"
#include "tools/hub-replay/hub_server.h"

#ifndef COVERAGE_SOURCE_DIR
#define COVERAGE_SOURCE_DIR "."
#endif

namespace coverage::crawler {
namespace {

struct CrawlResult {
  crawler::CrawlSummary summary;
  std::unique_ptr<registry::Registry> registry;
};

CrawlResult CrawlHub(const hub_replay::HubServer& hub, const testing::TempDir& dir, const std::string& name,
                     double wait_scale = 1.0) {
  CrawlResult out;
  auto r = registry::Registry::Open(dir.File(name));
  EXPECT_TRUE(r.has_value());
  out.registry = std::move(*r);
  crawler::CrawlOptions options;
  options.endpoint = hub.endpoint();
  options.page_limit = 100;
  options.rate_per_s = 0;
  options.concurrency = 4;
  options.wait_scale = wait_scale;
  RegistryCrawlSink sink(out.registry.get());
  auto s = crawler::RunCrawl(options, sink, [] { return std::make_unique<crawler::CurlHttpClient>(); });
  EXPECT_TRUE(s.has_value()) << s.error().ToString();
  if (s) out.summary = *s;
  return out;
}

std::vector<std::vector<std::string>> Dump(registry::Registry& r) {
  return r.Query("SELECT id, sha, downloads, model_type, config_status, config_json, config_reason FROM models ORDER BY id")->rows;
}

TEST(CrawlReplay, StoresExactlyTheRealServedSetConfigsByteForByte) {
  hub_replay::HubOptions options;
  options.data_dir = std::string(COVERAGE_SOURCE_DIR) + "/data/hub";
  auto hub = hub_replay::HubServer::Start(options);
  ASSERT_TRUE(hub.has_value()) << hub.error().ToString();
  testing::TempDir dir;
  CrawlResult c = CrawlHub(**hub, dir, "real.db");
  const int64_t served = (*hub)->model_count();
  EXPECT_EQ(c.summary.models + c.summary.rejects, served);
  int64_t configs = 0;
  for (int64_t i = 0; i < served; ++i) {
    const std::string id = (*hub)->ModelIdAt(i);
    auto row = c.registry->Query("SELECT config_status, config_json FROM models WHERE id = ?1", {id});
    ASSERT_TRUE(row.has_value());
    if (row->rows.empty()) continue;  // rejected by validation
    auto bytes = (*hub)->ConfigBytes(id);
    if (bytes && row->rows[0][0] == "fetched") {
      EXPECT_EQ(row->rows[0][1], *bytes) << id;
      ++configs;
    } else {
      EXPECT_NE(row->rows[0][0], "fetched") << id;
    }
  }
  EXPECT_GT(configs, 200);
  EXPECT_EQ(c.summary.configs_fetched, configs);
}

TEST(CrawlReplay, NamedModelsFollowTheHubsRenameRedirects) {
  hub_replay::HubOptions options;
  options.data_dir = std::string(COVERAGE_SOURCE_DIR) + "/data/hub";
  auto hub = hub_replay::HubServer::Start(options);
  ASSERT_TRUE(hub.has_value()) << hub.error().ToString();
  testing::TempDir dir;
  auto reg = registry::Registry::Open(dir.File("named.db"));
  ASSERT_TRUE(reg.has_value());
  crawler::CrawlOptions crawl;
  crawl.endpoint = (*hub)->endpoint();
  crawl.rate_per_s = 0;
  crawl.model_ids = {"bert-base-uncased"};  // renamed to google-bert/bert-base-uncased
  RegistryCrawlSink sink(reg->get());
  auto s = crawler::RunCrawl(crawl, sink, [] { return std::make_unique<crawler::CurlHttpClient>(); });
  ASSERT_TRUE(s.has_value()) << s.error().ToString();
  EXPECT_EQ(s->models, 1);
  auto row = (*reg)->Query("SELECT id, config_status FROM models");
  ASSERT_EQ(row->rows.size(), 1u);
  EXPECT_EQ(row->rows[0][0], "google-bert/bert-base-uncased");
  EXPECT_EQ(row->rows[0][1], (*hub)->ConfigBytes("google-bert/bert-base-uncased") ? "fetched" : "missing");
}

TEST(CrawlReplay, TenPercentFaultsGiveTheSameResultWithBoundedRetries) {
  testing::TempDir dir;
  hub_replay::HubOptions clean_options;
  clean_options.synthetic = 1500;
  clean_options.seed = 3;
  auto clean_hub = hub_replay::HubServer::Start(clean_options);
  ASSERT_TRUE(clean_hub.has_value()) << clean_hub.error().ToString();
  CrawlResult clean = CrawlHub(**clean_hub, dir, "clean.db");

  hub_replay::HubOptions faulty_options = clean_options;
  faulty_options.faults.rate = 0.1;
  faulty_options.faults.seed = 5;
  // Transient faults: the crawler fetches a config whose body does not parse
  // up to 3 times, so 2 faults in a row must never change what is stored.
  faulty_options.faults.max_in_a_row = 2;
  auto faulty_hub = hub_replay::HubServer::Start(faulty_options);
  ASSERT_TRUE(faulty_hub.has_value());
  CrawlResult faulty = CrawlHub(**faulty_hub, dir, "faulty.db", /*wait_scale=*/0.001);

  const auto a = Dump(*clean.registry), b = Dump(*faulty.registry);
  ASSERT_EQ(a.size(), b.size());
  int differing = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;
    if (++differing <= 3) {
      ADD_FAILURE() << "row " << i << " differs: " << a[i][0] << " " << a[i][4] << " vs " << b[i][0] << " " << b[i][4]
                    << " (" << b[i][5].size() << " bytes; " << b[i][6] << ")";
    }
  }
  EXPECT_EQ(differing, 0);
  EXPECT_EQ(faulty.summary.config_errors, 0);
  EXPECT_GT(faulty.summary.retries, 0);
  EXPECT_GT((*faulty_hub)->stats().faults, 0);
  // No tight loops: about one retry per injected fault, not many.
  EXPECT_LE(faulty.summary.retries, 2 * (*faulty_hub)->stats().faults);
  EXPECT_LT(faulty.summary.requests, clean.summary.requests * 13 / 10);
}

}  // namespace
}  // namespace coverage::crawler
