#include "crawler/curl_http_client.h"
#include "crawler/fetcher.h"

#include <curl/curl.h>

#include <cctype>
#include <mutex>

namespace coverage::crawler {
namespace {

void GlobalInitOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct Transfer {
  HttpResponse* response;
  int64_t max_bytes;
  bool over_cap = false;
};

size_t OnBody(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * count;
  if (static_cast<int64_t>(t->response->body.size() + n) > t->max_bytes) {
    t->over_cap = true;
    return 0;  // makes curl abort with CURLE_WRITE_ERROR
  }
  t->response->body.append(data, n);
  return n;
}

// Keeps the headers of the last response only: a new status line (after a
// redirect) starts a fresh set.
size_t OnHeader(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * count;
  std::string line(data, n);
  while (!line.empty() && (line.back() == '\r' || line.back() == '\n')) line.pop_back();
  if (line.rfind("HTTP/", 0) == 0) {
    t->response->headers.clear();
    return n;
  }
  const size_t colon = line.find(':');
  if (colon == std::string::npos) return n;
  std::string name = line.substr(0, colon);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  size_t start = colon + 1;
  while (start < line.size() && (line[start] == ' ' || line[start] == '\t')) ++start;
  t->response->headers.emplace(std::move(name), line.substr(start));
  return n;
}

bool IsHttpUrl(const std::string& url) { return url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0; }

}  // namespace

struct CurlHttpClient::Impl {
  CurlOptions options;
  CURL* easy = nullptr;
};

CurlHttpClient::CurlHttpClient(CurlOptions options) : impl_(std::make_unique<Impl>()) {
  GlobalInitOnce();
  impl_->options = std::move(options);
  impl_->easy = curl_easy_init();
}

CurlHttpClient::~CurlHttpClient() {
  if (impl_->easy) curl_easy_cleanup(impl_->easy);
}

// Note [Redirects checked before they are followed]: curl follows no
// redirect itself. A 3xx whose Location (resolved against the request) is
// on the request's own origin is followed here, up to max_redirects (0: the
// 3xx itself is the answer); one
// anywhere else is returned unfollowed, as the 3xx with final_url set to
// where it points, so nothing is ever sent off the endpoint (the fetcher
// then reports "redirected off the endpoint"). Before, curl fetched the
// other origin first and the check came after.
Result<HttpResponse> CurlHttpClient::Get(const HttpRequest& request) {
  if (!IsHttpUrl(request.url)) {
    return Status::InvalidArgument("only http and https URLs are fetched, not '" + request.url.substr(0, 200) + "'");
  }
  if (!impl_->easy) return Status::Internal("curl_easy_init failed");
  const CurlOptions& o = impl_->options;
  std::string url = request.url;
  for (int redirects = 0;; ++redirects) {
    HttpResponse response;
    std::string location;
    Perform(url, request, &response, &location);
    response.redirects = redirects;
    response.final_url = url;
    // max_redirects 0: every redirect comes back as it was answered.
    if (response.status < 300 || response.status >= 400 || location.empty() || o.max_redirects == 0) return response;
    if (detail::Origin(location) != detail::Origin(request.url)) {
      response.final_url = location;  // not followed
      return response;
    }
    if (redirects + 1 > o.max_redirects) {
      response.status = 0;
      response.body.clear();
      response.error = "more than " + std::to_string(o.max_redirects) + " redirects (curl error " +
                       std::to_string(static_cast<int>(CURLE_TOO_MANY_REDIRECTS)) + ")";
      return response;
    }
    url = location;
  }
}

void CurlHttpClient::Perform(const std::string& url, const HttpRequest& request, HttpResponse* out,
                             std::string* location) {
  CURL* h = impl_->easy;
  const CurlOptions& o = impl_->options;
  curl_easy_reset(h);
  HttpResponse& response = *out;
  Transfer transfer{&response, o.max_response_bytes};
  char error_buffer[CURL_ERROR_SIZE] = {0};

  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);  // Note [Redirects checked before they are followed]
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, o.connect_timeout_ms);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, o.total_timeout_ms);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, o.low_speed_bytes_per_s);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, o.low_speed_time_s);
  curl_easy_setopt(h, CURLOPT_MAXFILESIZE_LARGE, static_cast<curl_off_t>(o.max_response_bytes));
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_ACCEPT_ENCODING, "");  // whatever curl can decode
  curl_easy_setopt(h, CURLOPT_USERAGENT, o.user_agent.c_str());
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &OnBody);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &transfer);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, &OnHeader);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &transfer);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, error_buffer);
  struct curl_slist* headers = nullptr;
  for (const auto& [name, value] : request.headers) headers = curl_slist_append(headers, (name + ": " + value).c_str());
  if (headers) curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);

  const CURLcode rc = curl_easy_perform(h);
  if (headers) curl_slist_free_all(headers);

  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  char* redirect = nullptr;
  curl_easy_getinfo(h, CURLINFO_REDIRECT_URL, &redirect);  // the Location, resolved against the URL
  if (redirect) *location = redirect;

  if (rc != CURLE_OK) {
    // A transport failure: no usable HTTP answer. Error text comes from curl
    // and names no request header, so a token cannot leak through it.
    response.status = 0;
    response.body.clear();
    location->clear();
    if (transfer.over_cap || rc == CURLE_FILESIZE_EXCEEDED) {
      response.error = "response larger than " + std::to_string(o.max_response_bytes) + " bytes";
      response.over_size = true;
    } else if (rc == CURLE_OPERATION_TIMEDOUT) {
      response.error = std::string("timed out: ") + (error_buffer[0] ? error_buffer : curl_easy_strerror(rc));
    } else {
      response.error = error_buffer[0] ? error_buffer : curl_easy_strerror(rc);
    }
    response.error += " (curl error " + std::to_string(static_cast<int>(rc)) + ")";
    return;
  }
  response.status = static_cast<int>(status);
}

}  // namespace coverage::crawler
