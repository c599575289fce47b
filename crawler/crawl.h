// The crawl: lists models from the Hub API page by page (following the
// `Link: <...>; rel="next"` cursor), stores each page with its next URL
// through a CrawlSink in one step, then fetches `config.json` of the listed
// models that do not have one yet, in parallel. Every request goes through
// one rate limiter and the retry policy (retry.h); an entry that fails
// validation is rejected with its reason and the crawl goes on.
//
// The crawler knows no database: the sink is a seam (the registry-backed
// one is crawler/registry_sink.h; tests use an in-memory one).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/result.h"
#include "crawler/http_client.h"
#include "crawler/hub_model.h"
#include "crawler/retry.h"

namespace coverage::crawler {

enum class ConfigStatus { kFetched, kMissing, kGated, kInvalid };
std::string_view ConfigStatusName(ConfigStatus status);  // "fetched", "missing", "gated", "invalid"

struct Reject {
  std::string raw;     // the entry as received, cut short
  std::string reason;
};

// Storage for a crawl. Calls may come from several threads at once (config
// fetches run in parallel); implementations serialise as they need.
class CrawlSink {
 public:
  virtual ~CrawlSink() = default;
  // The next page to fetch for `crawl_id` (the first page's URL): the stored
  // position when `resume`, else the first page again. nullopt: nothing left.
  virtual Result<std::optional<std::string>> NextPage(const std::string& crawl_id, bool resume) = 0;
  // Stores one page's models and rejects together with the next page URL,
  // atomically.
  virtual Status StorePage(const std::string& crawl_id, const std::vector<HubModel>& models,
                           const std::vector<Reject>& rejects, const std::optional<std::string>& next_url) = 0;
  // Listed models without a config status, most downloaded first.
  virtual Result<std::vector<std::string>> ModelsWithoutConfig(int64_t limit) = 0;
  virtual Status StoreConfig(const std::string& model_id, ConfigStatus status, const std::string& reason,
                             const std::string& body) = 0;
};

struct CrawlProgress {
  int64_t pages = 0;
  int64_t models = 0;
  int64_t configs_done = 0;
  int64_t configs_total = 0;
};

struct CrawlOptions {
  std::string endpoint = "https://huggingface.co";  // $HF_ENDPOINT; no trailing '/'
  std::string token;                                 // $HF_TOKEN, sent as a Bearer token, never logged
  std::vector<std::pair<std::string, std::string>> query;  // list parameters: search, author, filter, sort, ...
  int page_limit = 1000;      // `limit` per page
  int64_t max_models = 0;     // stop after the page that reaches this many models (0 = all); pages
                              // are stored whole, so a resumed crawl continues at the next one
  bool fetch_configs = true;
  int concurrency = 4;        // parallel config fetches
  double rate_per_s = 10;     // requests per second across all threads (0 = no limit)
  RetryPolicy retry;
  bool resume = false;        // continue a crawl from its stored position
  // When set, only these models are fetched, one `GET /api/models/{id}` each
  // (renamed ids follow the Hub's redirect), instead of listing.
  std::vector<std::string> model_ids;
  double wait_scale = 1.0;    // multiplies every retry wait (tests shorten them)
  const std::atomic<bool>* stop = nullptr;            // set to stop after the current request
  std::function<void(const CrawlProgress&)> on_progress;  // called from the crawl's thread
};

struct CrawlSummary {
  int64_t pages = 0;
  int64_t models = 0;
  int64_t rejects = 0;        // all rejected entries (at most 20 a page are kept in the sink)
  int64_t configs_fetched = 0, configs_missing = 0, configs_gated = 0, configs_invalid = 0;
  int64_t config_errors = 0;  // gave up after retries; left for the next crawl
  int64_t requests = 0;
  int64_t retries = 0;
  double waited_s = 0;        // time slept in retry waits, summed over threads
  double seconds = 0;
  bool interrupted = false;
  std::vector<std::string> errors;  // the first few, for the summary
};

using HttpClientFactory = std::function<std::unique_ptr<HttpClient>()>;

// The first page's URL for these options: the crawl's identity. For a crawl
// of named models, "{endpoint}/api/models/{id}" of the first one.
std::string FirstPageUrl(const CrawlOptions& options);

// Runs the crawl. A Status is returned when the listing itself cannot go on
// (a page that keeps failing, a sink error); per-model problems are counted.
Result<CrawlSummary> RunCrawl(const CrawlOptions& options, CrawlSink& sink, const HttpClientFactory& make_client);

}  // namespace coverage::crawler
