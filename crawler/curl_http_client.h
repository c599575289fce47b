// CurlHttpClient: the HttpClient over libcurl (one easy handle per client,
// reused across requests so connections are kept alive).
//
// Limits, all in CurlOptions: only http and https, redirects followed up to
// `max_redirects` (the Hub answers renamed ids with relative 307s), a connect
// timeout, a low-speed abort (stalled transfers), and a cap on response
// bytes counted as they arrive, so a hostile server cannot fill memory.
// Request headers such as `Authorization` are sent but never logged or put
// into error messages.
//
// Thread safety: one thread per client; use one client per thread.
#pragma once

#include <memory>

#include "crawler/http_client.h"

namespace coverage::crawler {

struct CurlOptions {
  int max_redirects = 5;
  long connect_timeout_ms = 10000;
  long low_speed_bytes_per_s = 1024;  // abort when slower than this...
  long low_speed_time_s = 30;          // ...for this long
  long total_timeout_ms = 120000;
  int64_t max_response_bytes = 64 << 20;
  std::string user_agent = "coverage/0.1";
};

class CurlHttpClient final : public HttpClient {
 public:
  explicit CurlHttpClient(CurlOptions options = {});
  ~CurlHttpClient() override;
  CurlHttpClient(const CurlHttpClient&) = delete;
  CurlHttpClient& operator=(const CurlHttpClient&) = delete;

  Result<HttpResponse> Get(const HttpRequest& request) override;

 private:
  // One request to `url`, no redirect followed; `location`: where a 3xx points.
  void Perform(const std::string& url, const HttpRequest& request, HttpResponse* out, std::string* location);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace coverage::crawler
