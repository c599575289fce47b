// Fuzz target: the small text parsers of the Hub client, each given the
// whole input: the `Link` header (crawler/link_header.h), `RateLimit` and
// `Retry-After` (crawler/retry.h), model ids (crawler/model_id.h), and the
// URL helpers of crawler/fetcher.h. Invariants: only http(s) links with
// lower-case, non-empty relation names; NextPageUrl agrees with the map;
// server waits are finite, >= 0 and capped; an accepted id obeys the Hub's
// rules as written out here again; UrlEncode decodes back to its input.
#include <cctype>
#include <cmath>

#include "crawler/fetcher.h"
#include "crawler/link_header.h"
#include "crawler/model_id.h"
#include "crawler/retry.h"
#include "fuzz/fuzz_check.h"

namespace {

using namespace coverage;
using namespace coverage::crawler;

bool IsWord(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// The rules of model_id.h, restated.
bool FollowsIdRules(std::string_view id) {
  if (id.empty() || id.find("--") != std::string_view::npos || id.find("..") != std::string_view::npos) return false;
  if (id.size() >= 4 && id.substr(id.size() - 4) == ".git") return false;
  const size_t slash = id.find('/');
  auto part_ok = [](std::string_view p) {
    if (p.empty() || !IsWord(p.front()) || !IsWord(p.back())) return false;
    for (char c : p) {
      if (!IsWord(c) && c != '-' && c != '.') return false;
    }
    return true;
  };
  if (slash == std::string_view::npos) return part_ok(id) && id.size() <= 96;
  const std::string_view name = id.substr(slash + 1);
  return part_ok(id.substr(0, slash)) && part_ok(name) && name.size() <= 96;
}

std::string UrlDecode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      out.push_back(static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = fuzz::AsText(data, size);

  const auto links = ParseLinkHeader(text);
  for (const auto& [rel, url] : links) {
    FUZZ_CHECK(!rel.empty(), std::string(text));
    for (char c : rel) FUZZ_CHECK(!std::isupper(static_cast<unsigned char>(c)) && c != ' ', rel);
    FUZZ_CHECK(url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0, url);
  }
  const auto next = NextPageUrl(text);
  FUZZ_CHECK(next.has_value() == (links.count("next") == 1), std::string(text));
  if (next) FUZZ_CHECK(*next == links.at("next"), *next);

  const RetryPolicy policy;
  const auto rate_limit = ParseRateLimit(text);
  if (rate_limit) FUZZ_CHECK(rate_limit->remaining >= 0 && rate_limit->reset_s >= 0, std::string(text));
  const auto retry_after = ParseRetryAfter(text, /*now=*/1700000000);
  if (retry_after) FUZZ_CHECK(std::isfinite(*retry_after) && *retry_after >= 0, std::string(text));
  const double wait = WaitBeforeRetry(policy, 3, rate_limit, retry_after, 0.5);
  FUZZ_CHECK(std::isfinite(wait) && wait >= 0 && wait <= std::max(policy.max_server_wait_s, policy.max_wait_s * 2),
             std::to_string(wait));

  const Status id = ValidateModelId(text);
  FUZZ_CHECK(id.ok() == FollowsIdRules(text), id.ToString());
  if (!id.ok()) FUZZ_CHECK(id.code() == StatusCode::kInvalidArgument, id.ToString());

  const std::string encoded = detail::UrlEncode(text);
  for (char c : encoded) FUZZ_CHECK(std::isalnum(static_cast<unsigned char>(c)) || std::string_view("-_.~%").find(c) != std::string_view::npos, encoded);
  FUZZ_CHECK(UrlDecode(encoded) == text, encoded);
  const std::string url(text);
  FUZZ_CHECK(url.rfind(detail::Origin(url), 0) == 0, url);
  return 0;
}
