// HttpClient: the seam between the crawler and the network. The crawler asks
// for one GET at a time through this interface; the libcurl client (with
// timeouts, redirect limits and a response-size cap) sits behind it, and
// tests use a replaying fake. A transport failure (no connection, reset,
// timeout, body over the cap) is a response with `status == 0` and `error`
// set, so retry decisions see it like an HTTP status; a Status is only for
// misuse (an unsupported URL scheme).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/result.h"

namespace coverage::crawler {

struct HttpRequest {
  std::string url;  // http or https only
  std::vector<std::pair<std::string, std::string>> headers;
};

struct HttpResponse {
  int status = 0;  // 0: transport failure, see `error`
  std::string error;
  std::multimap<std::string, std::string> headers;  // names lower-cased
  std::string body;
  std::string final_url;  // after redirects
  int redirects = 0;
  // A transport failure because the body passed the size cap: a property of
  // the resource, so it is not retried and the config is recorded invalid.
  bool over_size = false;

  // The first value of a header (name in any case), or "".
  std::string Header(const std::string& name) const;
};

class HttpClient {
 public:
  virtual ~HttpClient() = default;
  virtual Result<HttpResponse> Get(const HttpRequest& request) = 0;
};

}  // namespace coverage::crawler
