// FakeHub: an in-process Hub API for crawler tests, served through the
// HttpClient seam. Models "org{i%3}/model-{i}" are listed in pages of
// `page_size` with Link cursors; some ids are gated, have no config, or an
// invalid one. `faults` maps a request number (1-based, counted across all
// clients) to what goes wrong with it. Thread-safe.
#pragma once

#include <map>
#include <mutex>
#include <set>
#include <string>

#include "crawler/http_client.h"

namespace coverage::testing {

class FakeHub {
 public:
  enum class Fault { k429, k503, kTransport, kMalformed };

  int64_t models = 25;
  int page_size = 10;
  std::set<int64_t> gated = {3};
  std::set<int64_t> no_config = {4};
  std::set<int64_t> bad_config = {5};
  std::set<int64_t> bad_entry = {7};  // listed with a hostile id
  std::set<int64_t> huge_config;      // served as the client's size cap would report it
  std::set<int64_t> deep_config;      // valid JSON nested 100 levels deep
  std::map<int64_t, Fault> faults;
  std::string next_link_origin = "http://fake";  // where Link points

  static std::string Id(int64_t i) { return "org" + std::to_string(i % 3) + "/model-" + std::to_string(i); }
  static std::string Config(int64_t i) { return "{\"model_type\": \"llama\", \"hidden_size\": " + std::to_string(64 * (i + 1)) + "}"; }

  int64_t requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  // Requests for one model's config.json.
  int64_t config_requests(int64_t i) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = config_hits_.find(i);
    return it == config_hits_.end() ? 0 : it->second;
  }

  crawler::HttpResponse Serve(const std::string& url) {
    int64_t n;
    {
      std::lock_guard<std::mutex> lock(mu_);
      n = ++requests_;
    }
    crawler::HttpResponse r;
    r.final_url = url;
    auto fault = faults.find(n);
    if (fault != faults.end()) {
      switch (fault->second) {
        case Fault::k429:
          r.status = 429;
          r.headers.emplace("retry-after", "1");
          return r;
        case Fault::k503:
          r.status = 503;
          return r;
        case Fault::kTransport:
          r.status = 0;
          r.error = "connection reset by peer";
          return r;
        case Fault::kMalformed:
          r.status = 200;
          r.body = "[{\"id\": ";
          return r;
      }
    }
    const std::string list = "http://fake/api/models?";
    if (url.rfind(list, 0) == 0) {
      int64_t start = 0;
      if (auto c = url.find("cursor="); c != std::string::npos) start = std::stoll(url.substr(c + 7));
      std::string body = "[";
      for (int64_t i = start; i < std::min(models, start + page_size); ++i) {
        if (i > start) body += ",";
        const std::string id = bad_entry.count(i) ? "../../etc/passwd" : Id(i);
        body += "{\"id\":\"" + id + "\",\"downloads\":" + std::to_string(1000 - i) +
                ",\"sha\":\"s" + std::to_string(i) + "\",\"config\":{\"model_type\":\"llama\"}}";
      }
      body += "]";
      r.status = 200;
      r.body = body;
      if (start + page_size < models) {
        r.headers.emplace("link", "<" + next_link_origin + "/api/models?limit=" + std::to_string(page_size) +
                                      "&cursor=" + std::to_string(start + page_size) + ">; rel=\"next\"");
      }
      return r;
    }
    const std::string info = "http://fake/api/models/";
    if (url.rfind(info, 0) == 0) {
      const std::string id = url.substr(info.size());
      const size_t dash = id.find("model-");
      if (dash == std::string::npos) {
        r.status = 404;
        return r;
      }
      const int64_t i = std::stoll(id.substr(dash + 6));
      r.status = 200;
      r.body = "{\"id\":\"" + Id(i) + "\",\"downloads\":" + std::to_string(1000 - i) + ",\"sha\":\"s" +
               std::to_string(i) + "\",\"config\":{\"model_type\":\"llama\"}}";
      return r;
    }
    const std::string suffix = "/resolve/main/config.json";
    if (url.size() > suffix.size() && url.compare(url.size() - suffix.size(), suffix.size(), suffix) == 0) {
      const std::string id = url.substr(std::string("http://fake/").size(),
                                        url.size() - suffix.size() - std::string("http://fake/").size());
      const int64_t i = std::stoll(id.substr(id.find("model-") + 6));
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++config_hits_[i];
      }
      if (huge_config.count(i)) {
        r.status = 0;
        r.error = "response larger than 1048576 bytes (curl error 23)";
        r.over_size = true;
      } else if (deep_config.count(i)) {
        r.status = 200;
        r.body = "{\"model_type\": \"llama\", \"x\": " + std::string(100, '[') + std::string(100, ']') + "}";
      } else if (gated.count(i)) {
        r.status = 401;
        r.headers.emplace("x-error-code", "GatedRepo");
      } else if (no_config.count(i)) {
        r.status = 404;
        r.headers.emplace("x-error-code", "EntryNotFound");
      } else {
        r.status = 200;
        r.body = bad_config.count(i) ? "not json at all" : Config(i);
      }
      return r;
    }
    r.status = 404;
    return r;
  }

 private:
  mutable std::mutex mu_;
  int64_t requests_ = 0;
  std::map<int64_t, int64_t> config_hits_;
};

class FakeHubClient final : public crawler::HttpClient {
 public:
  explicit FakeHubClient(FakeHub* hub) : hub_(hub) {}
  Result<crawler::HttpResponse> Get(const crawler::HttpRequest& request) override { return hub_->Serve(request.url); }

 private:
  FakeHub* hub_;
};

}  // namespace coverage::testing
