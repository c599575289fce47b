// When and how long the Hub client waits before trying a request again.
// Mirrors huggingface_hub's `http_backoff` (5 tries; waits doubling from 1 s
// to at most 8 s; retries on 408, 429, 500, 502, 503, 504 and network
// errors), adds jitter so that many clients do not retry in lockstep, and
// honours the server's own word: the `RateLimit` header's reset time when
// the quota is spent, else `Retry-After` (capped, since a hostile or broken
// server could ask for days). Facts and sources: shared/data/hub/API.md §5.
#pragma once

#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <string_view>

namespace coverage::crawler {

struct RetryPolicy {
  int max_tries = 5;              // attempts in all, the first included
  double base_wait_s = 1.0;       // wait before the first retry
  double max_wait_s = 8.0;        // cap of the exponential backoff
  double jitter = 0.25;           // each backoff wait is scaled by 1 ± jitter
  double max_server_wait_s = 300; // cap on waits the server asks for (one 5-minute quota window)
};

// 408, 429, 500, 502, 503 and 504.
bool IsRetryableStatus(int status);

// `RateLimit: "api";r=0;t=55` (IETF draft-ietf-httpapi-ratelimit-headers).
struct RateLimit {
  std::string bucket;     // "api", "resolvers", "pages"
  int64_t remaining = 0;  // requests left in the window
  int64_t reset_s = 0;    // seconds until the window resets
};
std::optional<RateLimit> ParseRateLimit(std::string_view header);

// `Retry-After` as delay-seconds or an HTTP-date (IMF-fixdate, relative to
// `now`); nullopt when malformed. A date in the past gives 0.
std::optional<double> ParseRetryAfter(std::string_view header, std::time_t now);

// The wait before retry number `retry` (1 = first retry) when no server hint
// applies: base * 2^(retry-1), capped, scaled by 1 + jitter * (2u - 1) with
// `unit_random` u in [0, 1).
double BackoffSeconds(const RetryPolicy& policy, int retry, double unit_random);

// The wait before retry number `retry` after a retryable answer: the quota's
// reset time plus one second when `rate_limit` says nothing remains, else
// `retry_after`, else the backoff; server hints are capped at
// max_server_wait_s.
double WaitBeforeRetry(const RetryPolicy& policy, int retry, const std::optional<RateLimit>& rate_limit,
                       const std::optional<double>& retry_after, double unit_random);

}  // namespace coverage::crawler
