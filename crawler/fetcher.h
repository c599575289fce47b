// Fetching from the Hub with the crawl's policy: request pacing, retries
// with backoff that honour Retry-After and RateLimit, an optional request
// budget, and interruptible waits. Shared by the listing crawl (crawl.cc)
// and the crawl agent (agent.cc); not part of the crawler's public API.
//
// Thread safety: one Fetcher is shared by all threads of a crawl.
#pragma once

#include <algorithm>
#include <chrono>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/result.h"
#include "crawler/crawl.h"
#include "crawler/http_client.h"
#include "crawler/retry.h"

namespace coverage::crawler::detail {

using Clock = std::chrono::steady_clock;

std::string UrlEncode(std::string_view s);
// "https://host:port" of a URL, for keeping the cursor on the endpoint.
std::string Origin(const std::string& url);

// Shared by all threads: request pacing, counters, and interruptible waits.
class Fetcher {
 public:
  explicit Fetcher(const CrawlOptions& options) : options_(options), rng_(std::random_device{}()) {}

  // GET with the retry policy; returns the last answer (which may be an
  // error status or a transport failure with status 0).
  Result<HttpResponse> Get(HttpClient& client, const std::string& url) {
    HttpRequest request{url, {{"Accept", "application/json"}}};
    if (!options_.token.empty()) request.headers.emplace_back("Authorization", "Bearer " + options_.token);
    HttpResponse last;
    for (int attempt = 1; attempt <= std::max(1, options_.retry.max_tries); ++attempt) {
      if (Stopped()) return Status::Aborted("interrupted");

      Pace();
      if (Stopped()) return Status::Aborted("interrupted");
      // The request is counted (and the budget checked) before it is sent,
      // under one lock, so threads sharing a budget never overshoot it.
      if (!TakeRequest()) {
        return Status::Aborted("the request budget of " + std::to_string(max_requests_) + " is spent");
      }
      COV_ASSIGN_OR_RETURN(last, client.Get(request));
      if (last.status != 0 && !last.final_url.empty() && Origin(last.final_url) != Origin(options_.endpoint)) {
        // Renamed repos redirect within the Hub; anything else is not followed.
        last.error = "redirected off the endpoint to " + last.final_url.substr(0, 200);
        last.status = 0;
        last.body.clear();
        return last;
      }
      const bool retryable = (last.status == 0 && !last.over_size) || IsRetryableStatus(last.status);
      if (!retryable || attempt == options_.retry.max_tries) return last;
      std::optional<RateLimit> rate_limit;
      if (const std::string h = last.Header("RateLimit"); !h.empty()) rate_limit = ParseRateLimit(h);
      std::optional<double> retry_after;
      if (const std::string h = last.Header("Retry-After"); !h.empty()) retry_after = ParseRetryAfter(h, std::time(nullptr));
      const double wait = WaitBeforeRetry(options_.retry, attempt, rate_limit, retry_after, Random()) * options_.wait_scale;
      Count(&retries_);
      Sleep(wait);
    }
    return last;
  }

  bool Stopped() const { return options_.stop && options_.stop->load(); }
  // At most `n` requests in all, retries included (0 = no cap); a Get that
  // would send one more returns Aborted.
  void set_max_requests(int64_t n) { max_requests_ = n; }
  bool BudgetSpent() const {
    std::lock_guard<std::mutex> lock(mu_);
    return max_requests_ > 0 && requests_ >= max_requests_;
  }

  // Waits as after a failed try that had no server hint.
  void Backoff(int attempt) {
    Count(&retries_);
    Sleep(BackoffSeconds(options_.retry, attempt, Random()) * options_.wait_scale);
  }
  int64_t requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  int64_t retries() const {
    std::lock_guard<std::mutex> lock(mu_);
    return retries_;
  }
  double waited_s() const {
    std::lock_guard<std::mutex> lock(mu_);
    return waited_s_;
  }

 private:
  bool TakeRequest() {
    std::lock_guard<std::mutex> lock(mu_);
    if (max_requests_ > 0 && requests_ >= max_requests_) return false;
    ++requests_;
    return true;
  }
  void Count(int64_t* counter) {
    std::lock_guard<std::mutex> lock(mu_);
    ++*counter;
  }
  double Random() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  }
  // One request every 1/rate seconds across all threads.
  void Pace() {
    if (options_.rate_per_s <= 0) return;
    Clock::time_point slot;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto now = Clock::now();
      next_slot_ = std::max(next_slot_, now);
      slot = next_slot_;
      next_slot_ += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1.0 / options_.rate_per_s));
    }
    while (Clock::now() < slot && !Stopped()) {
      std::this_thread::sleep_for(std::min<Clock::duration>(slot - Clock::now(), std::chrono::milliseconds(50)));
    }
  }
  // Sleeps in short slices so that a stop request is seen quickly.
  void Sleep(double seconds) {
    const auto start = Clock::now();
    const auto until = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    while (Clock::now() < until && !Stopped()) {
      std::this_thread::sleep_for(std::min<Clock::duration>(until - Clock::now(), std::chrono::milliseconds(50)));
    }
    std::lock_guard<std::mutex> lock(mu_);
    waited_s_ += std::chrono::duration<double>(Clock::now() - start).count();
  }

  const CrawlOptions& options_;
  mutable std::mutex mu_;
  std::mt19937_64 rng_;
  Clock::time_point next_slot_{};
  int64_t requests_ = 0, retries_ = 0, max_requests_ = 0;
  double waited_s_ = 0;
};

// "HTTP 404 EntryNotFound" or "transport error: ...".
std::string Describe(const HttpResponse& r);

// One list page, fetched and parsed. A 200 whose body is not a JSON array
// (a truncated or garbled page) is retried like a failed request.
struct Page {
  HttpResponse response;
  nlohmann::json body;
  bool aborted = false;  // stopped or out of budget
};
Result<Page> FetchPage(const CrawlOptions& options, HttpClient& client, Fetcher& fetcher, const std::string& url);

// The outcome of fetching one model's config.json.
struct ConfigFetch {
  bool aborted = false;  // stopped or out of budget: nothing to record
  bool record = false;   // false: failed after retries; try again next crawl
  ConfigStatus status = ConfigStatus::kInvalid;
  std::string reason;
  std::string body;  // the bytes when fetched
};
// GETs {endpoint}/{id}/resolve/main/config.json; `id` must already be valid.
ConfigFetch FetchConfig(const std::string& endpoint, HttpClient& client, Fetcher& fetcher, const std::string& id);

}  // namespace coverage::crawler::detail
