#include "crawler/fetcher.h"

#include <cctype>

namespace coverage::crawler::detail {

std::string UrlEncode(std::string_view s) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

std::string Origin(const std::string& url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos) return "";
  const size_t path = url.find('/', scheme + 3);
  return url.substr(0, path);
}

std::string Describe(const HttpResponse& r) {
  if (r.status == 0) return "transport error: " + r.error;
  std::string s = "HTTP " + std::to_string(r.status);
  if (const std::string code = r.Header("X-Error-Code"); !code.empty()) s += " " + code;
  return s;
}

Result<Page> FetchPage(const CrawlOptions& options, HttpClient& client, Fetcher& fetcher, const std::string& url) {
  Page page;
  for (int attempt = 1;; ++attempt) {
    auto fetched = fetcher.Get(client, url);
    if (!fetched) {
      if (fetched.error().code() == StatusCode::kAborted) {
        page.aborted = true;
        return page;
      }
      return fetched.error();
    }
    page.response = std::move(*fetched);
    if (page.response.status != 200) {
      return Status::IoError("listing page " + url + " failed: " + Describe(page.response));
    }
    auto body = ParseJsonCapped(page.response.body);
    if (body && body->is_array()) {
      page.body = std::move(*body);
      return page;
    }
    if (attempt >= options.retry.max_tries) {
      return Status::IoError("listing page " + url + " is not a JSON array" +
                             (body ? std::string() : ": " + body.error().message()) + " (after " +
                             std::to_string(attempt) + " tries)");
    }
    fetcher.Backoff(attempt);
  }
}

// Note [Permanent config failures]
// What is wrong with a config.json itself is recorded (status invalid, with
// the reason), so no later crawl fetches it again until the model's commit
// changes: a body over the size cap (the client stops reading at the cap;
// retrying reads the same bytes), and JSON nested deeper than the parser's
// cap. Only what may be the transfer's fault is retried: a transport error,
// a 5xx or 429, or a body cut or garbled so that it does not parse (three
// fetches before it is called invalid).
ConfigFetch FetchConfig(const std::string& endpoint, HttpClient& client, Fetcher& fetcher, const std::string& id) {
  ConfigFetch out;
  const std::string url = endpoint + "/" + id + "/resolve/main/config.json";
  auto r = fetcher.Get(client, url);
  // A 200 whose body does not parse may be a cut or garbled transfer: fetch
  // it again (up to kInvalidBodyTries times) before calling the config invalid.
  // JSON nested too deep (Unsupported) is the document itself: not fetched again.
  constexpr int kInvalidBodyTries = 3;
  Result<nlohmann::json> parsed = Status::Internal("not parsed");
  for (int attempt = 1; r && r->status == 200; ++attempt) {
    parsed = ParseJsonCapped(r->body, {.python_literals = true});
    if ((parsed && parsed->is_object()) || attempt >= kInvalidBodyTries) break;
    if (!parsed && parsed.error().code() == StatusCode::kUnsupported) break;
    fetcher.Backoff(1);
    r = fetcher.Get(client, url);
  }
  if (!r) {
    out.aborted = r.error().code() == StatusCode::kAborted;
    out.reason = r.error().message();
    return out;
  }
  out.record = true;
  if (r->status == 200) {
    if (parsed && parsed->is_object()) {
      out.status = ConfigStatus::kFetched;
      out.body = std::move(r->body);
    } else {
      out.status = ConfigStatus::kInvalid;
      out.reason = parsed ? "config.json is not a JSON object" : parsed.error().message();
    }
  } else if (r->status == 401 || r->status == 403) {
    out.status = ConfigStatus::kGated;
    out.reason = Describe(*r);
  } else if (r->status == 0 && r->over_size) {
    // Note [Permanent config failures]: recorded, so no later crawl fetches it
    // again until its commit changes.
    out.status = ConfigStatus::kInvalid;
    out.reason = "config.json: " + r->error;
  } else if (r->status == 404) {
    out.status = ConfigStatus::kMissing;
    out.reason = Describe(*r);
  } else {
    out.record = false;  // transport or server error after retries
    out.reason = Describe(*r);
  }
  return out;
}

}  // namespace coverage::crawler::detail
