#include <gtest/gtest.h>

#include "crawler/crawl.h"
#include "registry/registry.h"
#include "crawler/registry_sink.h"
#include "tests/support/fake_hub.h"
#include "tests/support/temp_dir.h"

namespace coverage::crawler {
namespace {

using testing::FakeHub;

class Crawl : public ::testing::Test {
 protected:
  void SetUp() override {
    auto r = registry::Registry::Open(dir_.File("r.db"));
    ASSERT_TRUE(r.has_value());
    reg_ = std::move(*r);
    options_.endpoint = "http://fake";
    options_.page_limit = hub_.page_size;
    options_.rate_per_s = 0;
    options_.wait_scale = 0.001;  // retry waits in milliseconds
    options_.concurrency = 3;
  }
  Result<crawler::CrawlSummary> Run() {
    RegistryCrawlSink sink(reg_.get());
    return crawler::RunCrawl(options_, sink, [this] { return std::make_unique<testing::FakeHubClient>(&hub_); });
  }
  std::string One(const std::string& sql) {
    auto q = reg_->Query(sql);
    EXPECT_TRUE(q.has_value()) << q.error().ToString();
    return q->rows.empty() ? "" : q->rows[0][0];
  }
  testing::TempDir dir_;
  std::unique_ptr<registry::Registry> reg_;
  FakeHub hub_;
  crawler::CrawlOptions options_;
};

TEST_F(Crawl, StoresExactlyTheServedModelsAndConfigs) {
  auto s = Run();
  ASSERT_TRUE(s.has_value()) << s.error().ToString();
  EXPECT_EQ(s->pages, 3);
  EXPECT_EQ(s->models, 24);   // 25 listed, one hostile id rejected
  EXPECT_EQ(s->rejects, 1);
  EXPECT_EQ(s->configs_fetched, 21);
  EXPECT_EQ(s->configs_gated, 1);
  EXPECT_EQ(s->configs_missing, 1);
  EXPECT_EQ(s->configs_invalid, 1);
  EXPECT_EQ(One("SELECT COUNT(*) FROM models"), "24");
  EXPECT_EQ(One("SELECT config_json FROM models WHERE id = '" + FakeHub::Id(10) + "'"), FakeHub::Config(10));
  EXPECT_EQ(One("SELECT config_status || ':' || config_reason FROM models WHERE id = '" + FakeHub::Id(3) + "'"),
            "gated:HTTP 401 GatedRepo");
  EXPECT_EQ(One("SELECT config_status FROM models WHERE id = '" + FakeHub::Id(5) + "'"), "invalid");
  EXPECT_EQ(One("SELECT reason FROM crawl_rejects"), "model id '../../etc/passwd': more than one '/'");
  // Nothing listed twice, every config byte for byte.
  for (int64_t i = 0; i < hub_.models; ++i) {
    if (hub_.bad_entry.count(i) || hub_.gated.count(i) || hub_.no_config.count(i) || hub_.bad_config.count(i)) continue;
    EXPECT_EQ(One("SELECT config_json FROM models WHERE id = '" + FakeHub::Id(i) + "'"), FakeHub::Config(i));
  }
}

// Note [Permanent config failures]: an over-size or over-deep config.json is
// fetched once, recorded invalid with its reason, and not fetched again by
// the next crawl; a garbled one is fetched three times.
TEST_F(Crawl, PermanentConfigProblemsAreRecordedInvalidAndNotFetchedAgain) {
  hub_.huge_config = {8};
  hub_.deep_config = {9};
  auto s = Run();
  ASSERT_TRUE(s.has_value()) << s.error().ToString();
  EXPECT_EQ(s->configs_invalid, 3);  // 5 (garbled), 8, 9
  EXPECT_EQ(s->config_errors, 0);
  EXPECT_EQ(hub_.config_requests(8), 1);
  EXPECT_EQ(hub_.config_requests(9), 1);
  EXPECT_EQ(hub_.config_requests(5), 3);
  EXPECT_EQ(One("SELECT config_status || ': ' || config_reason FROM models WHERE id = '" + FakeHub::Id(8) + "'"),
            "invalid: config.json: response larger than 1048576 bytes (curl error 23)");
  EXPECT_EQ(One("SELECT config_status || ': ' || config_reason FROM models WHERE id = '" + FakeHub::Id(9) + "'"),
            "invalid: JSON nested deeper than 64 levels");
  auto again = Run();
  ASSERT_TRUE(again.has_value()) << again.error().ToString();
  EXPECT_EQ(hub_.config_requests(8), 1);
  EXPECT_EQ(hub_.config_requests(9), 1);
}

TEST_F(Crawl, FaultsAreRetriedAndGiveTheSameResult) {
  hub_.faults = {{1, FakeHub::Fault::k429},       {2, FakeHub::Fault::kTransport}, {4, FakeHub::Fault::kMalformed},
                 {6, FakeHub::Fault::k503},       {9, FakeHub::Fault::k429},       {12, FakeHub::Fault::kTransport}};
  auto s = Run();
  ASSERT_TRUE(s.has_value()) << s.error().ToString();
  EXPECT_EQ(s->models, 24);
  EXPECT_EQ(s->configs_fetched, 21);
  EXPECT_EQ(s->config_errors, 0);
  EXPECT_GE(s->retries, 5);  // the malformed page is retried like a fault
  EXPECT_EQ(One("SELECT COUNT(*) FROM models WHERE config_status = 'fetched'"), "21");
}

TEST_F(Crawl, PersistentFailuresStopWithoutTightLoops) {
  for (int64_t n = 1; n <= 100; ++n) hub_.faults[n] = FakeHub::Fault::k503;
  options_.retry.max_tries = 5;
  auto s = Run();
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.error().message().find("HTTP 503"), std::string::npos) << s.error().message();
  EXPECT_EQ(hub_.requests(), 5);  // one page, five tries
}

TEST_F(Crawl, AnEndpointThatStopsAnsweringEndsTheCrawlInsteadOfHanging) {
  // The listing (3 pages) works; then every request fails at the transport.
  for (int64_t n = 4; n <= 1000; ++n) hub_.faults[n] = FakeHub::Fault::kTransport;
  options_.concurrency = 1;
  auto s = Run();
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.error().message().find("config fetches in a row failed"), std::string::npos) << s.error().message();
  EXPECT_LE(hub_.requests(), 3 + 5 * 5);  // five models, five tries each
  EXPECT_EQ(One("SELECT COUNT(*) FROM models"), "24");  // the listing is kept
}

TEST_F(Crawl, AStoppedCrawlResumesAtTheNextPageWithoutDuplicates) {
  options_.fetch_configs = false;
  options_.max_models = 12;  // reached on page two, which is stored whole
  auto first = Run();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->pages, 2);
  EXPECT_EQ(One("SELECT COUNT(*) FROM models"), "19");
  options_.max_models = 0;
  options_.resume = true;
  auto s = Run();
  ASSERT_TRUE(s.has_value()) << s.error().ToString();
  EXPECT_EQ(s->pages, 1);  // only the last page was left
  EXPECT_EQ(One("SELECT COUNT(*) FROM models"), "24");
  // A finished crawl resumed has nothing left to list.
  auto again = Run();
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->pages, 0);
  // Restarting lists everything again without repeating old rejects.
  options_.resume = false;
  ASSERT_TRUE(Run().has_value());
  EXPECT_EQ(One("SELECT COUNT(*) FROM crawl_rejects"), "1");
  EXPECT_EQ(One("SELECT COUNT(*) FROM models"), "24");
}

TEST_F(Crawl, NamedModelsAreFetchedOneByOne) {
  options_.model_ids = {FakeHub::Id(1), "bad//id", FakeHub::Id(2), "org0/no-such-model"};
  auto s = Run();
  ASSERT_TRUE(s.has_value()) << s.error().ToString();
  EXPECT_EQ(s->models, 2);
  EXPECT_EQ(s->rejects, 2);  // the malformed id (never sent) and the unknown one
  EXPECT_EQ(One("SELECT COUNT(*) FROM crawl_rejects WHERE reason = 'HTTP 404'"), "1");
  EXPECT_EQ(One("SELECT config_json FROM models WHERE id = '" + FakeHub::Id(2) + "'"), FakeHub::Config(2));
  // Only the named models' configs were fetched.
  EXPECT_EQ(s->configs_fetched, 2);
}

TEST_F(Crawl, AListingThatNeverEndsIsCut) {
  hub_.models = 1000;
  hub_.page_size = 50;
  options_.page_limit = 50;
  hub_.bad_entry.clear();
  for (int64_t i = 0; i < 1000; ++i) hub_.bad_entry.insert(i);  // every entry hostile
  options_.fetch_configs = false;
  auto s = Run();
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.error().message().find("held no valid model"), std::string::npos) << s.error().message();
  EXPECT_EQ(hub_.requests(), 10);
  // Nine pages were stored before giving up, each keeping 20 of its 50 rejects.
  EXPECT_EQ(One("SELECT COUNT(*) FROM crawl_rejects"), "180");
  EXPECT_EQ(One("SELECT rejects FROM crawls"), "180");
}

TEST_F(Crawl, ANextLinkOffTheEndpointIsRefused) {
  hub_.next_link_origin = "http://evil.example";
  auto s = Run();
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.error().message().find("off the endpoint"), std::string::npos);
  // The page was not stored; the crawl still resumes at its first page.
  EXPECT_EQ(One("SELECT COUNT(*) FROM models"), "0");
  EXPECT_EQ(One("SELECT next_url FROM crawls"), crawler::FirstPageUrl(options_));
}

}  // namespace
}  // namespace coverage::crawler
