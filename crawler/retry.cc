#include "crawler/retry.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>

#include "crawler/text.h"

namespace coverage::crawler {
namespace {

std::optional<int64_t> ParseNonNegative(std::string_view s) {
  s = Trim(s);
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty() || v < 0) return std::nullopt;
  return v;
}

}  // namespace

bool IsRetryableStatus(int status) {
  return status == 408 || status == 429 || status == 500 || status == 502 || status == 503 || status == 504;
}

std::optional<RateLimit> ParseRateLimit(std::string_view header) {
  // "api";r=0;t=55 — the first item; parameters in any order.
  const size_t comma = header.find(',');
  std::string_view item = Trim(header.substr(0, comma));
  RateLimit rl;
  bool have_r = false, have_t = false;
  size_t pos = 0;
  while (pos <= item.size()) {
    const size_t semi = item.find(';', pos);
    std::string_view part = Trim(item.substr(pos, semi == std::string_view::npos ? std::string_view::npos : semi - pos));
    pos = semi == std::string_view::npos ? item.size() + 1 : semi + 1;
    if (part.empty()) continue;
    if (part.front() == '"') {
      if (part.size() < 2 || part.back() != '"') return std::nullopt;
      rl.bucket = std::string(part.substr(1, part.size() - 2));
      continue;
    }
    const size_t eq = part.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view key = Trim(part.substr(0, eq));
    auto value = ParseNonNegative(part.substr(eq + 1));
    if (key == "r") {
      if (!value) return std::nullopt;
      rl.remaining = *value;
      have_r = true;
    } else if (key == "t") {
      if (!value) return std::nullopt;
      rl.reset_s = *value;
      have_t = true;
    }
  }
  if (!have_r || !have_t) return std::nullopt;
  return rl;
}

std::optional<double> ParseRetryAfter(std::string_view header, std::time_t now) {
  header = Trim(header);
  if (header.empty()) return std::nullopt;
  if (std::isdigit(static_cast<unsigned char>(header.front()))) {
    auto v = ParseNonNegative(header);
    if (!v) return std::nullopt;
    return static_cast<double>(*v);
  }
  // IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT".
  std::tm tm{};
  const std::string text(header);
  const char* end = strptime(text.c_str(), "%a, %d %b %Y %H:%M:%S GMT", &tm);
  if (!end || *end != '\0') return std::nullopt;
  const std::time_t when = timegm(&tm);
  return std::max(0.0, std::difftime(when, now));
}

double BackoffSeconds(const RetryPolicy& policy, int retry, double unit_random) {
  const double exp = policy.base_wait_s * std::pow(2.0, std::max(0, retry - 1));
  const double capped = std::min(exp, policy.max_wait_s);
  const double u = std::clamp(unit_random, 0.0, 1.0);
  return std::max(0.0, capped * (1.0 + policy.jitter * (2.0 * u - 1.0)));
}

double WaitBeforeRetry(const RetryPolicy& policy, int retry, const std::optional<RateLimit>& rate_limit,
                       const std::optional<double>& retry_after, double unit_random) {
  if (rate_limit && rate_limit->remaining == 0) {
    return std::min(static_cast<double>(rate_limit->reset_s) + 1.0, policy.max_server_wait_s);
  }
  if (retry_after) return std::min(*retry_after, policy.max_server_wait_s);
  return BackoffSeconds(policy, retry, unit_random);
}

}  // namespace coverage::crawler
