#include "crawler/crawl.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <set>
#include <mutex>
#include <random>
#include <thread>

#include "crawler/fetcher.h"
#include "crawler/link_header.h"
#include "crawler/model_id.h"

namespace coverage::crawler {
namespace {

using namespace detail;
using Clock = std::chrono::steady_clock;

// Rejected entries kept per page (all are counted): a page of junk must not
// turn into millions of rows.
constexpr int64_t kRejectsKeptPerPage = 20;
// Listing pages in a row without one valid model before the crawl gives up.
constexpr int kMaxPagesWithoutModels = 10;


// Lists pages until the listing ends, `max_models` is reached or a stop.
// The next page is fetched while the current one is validated and stored,
// so the server's and the database's time overlap (two clients alternate).
Status ListModels(const CrawlOptions& options, CrawlSink& sink, const HttpClientFactory& make_client,
                  Fetcher& fetcher, CrawlSummary& summary) {
  const std::string crawl_id = FirstPageUrl(options);
  const std::string origin = Origin(options.endpoint);
  COV_ASSIGN_OR_RETURN(std::optional<std::string> url, sink.NextPage(crawl_id, options.resume));
  if (!url) return Status::Ok();
  std::unique_ptr<HttpClient> clients[2] = {make_client(), make_client()};
  int turn = 0;
  std::set<std::string> visited;
  int pages_without_models = 0;
  auto fetch_async = [&](const std::string& page_url) {
    HttpClient* client = clients[turn].get();
    turn ^= 1;
    return std::async(std::launch::async,
                      [&options, &fetcher, client, page_url] { return FetchPage(options, *client, fetcher, page_url); });
  };
  auto pending = fetch_async(*url);
  while (url) {
    Result<Page> page = pending.get();
    if (!page) return page.error();
    if (page->aborted || fetcher.Stopped()) {
      summary.interrupted = true;
      return Status::Ok();
    }
    std::optional<std::string> next = NextPageUrl(page->response.Header("Link"));
    if (next && Origin(*next) != origin) {
      return Status::IoError("listing page " + *url + " points its next page off the endpoint (" +
                             next->substr(0, 200) + "); refusing to follow");
    }
    // A hostile or broken server must not keep the crawl busy forever.
    visited.insert(*url);
    if (next && visited.count(*next)) {
      return Status::IoError("listing page " + *url + " links back to a page already listed; refusing to loop");
    }
    if (static_cast<int64_t>(page->body.size()) > options.page_limit) {
      return Status::IoError("listing page " + *url + " has " + std::to_string(page->body.size()) +
                             " entries, more than the " + std::to_string(options.page_limit) + " asked for");
    }
    if (page->body.empty()) next.reset();  // an empty page ends the listing, whatever its Link says
    std::vector<HubModel> models;
    std::vector<Reject> rejects;
    int64_t rejected = 0;
    for (const auto& entry : page->body) {
      auto m = ParseHubModel(entry);
      if (m) {
        models.push_back(std::move(*m));
      } else if (++rejected <= kRejectsKeptPerPage) {
        rejects.push_back({entry.dump().substr(0, 300), m.error().message()});
      }
    }
    pages_without_models = models.empty() ? pages_without_models + 1 : 0;
    if (pages_without_models >= kMaxPagesWithoutModels) {
      return Status::IoError("giving up: " + std::to_string(pages_without_models) +
                             " listing pages in a row held no valid model (last " + *url + ")");
    }
    // --max-models stops after the page that reaches it; the page is stored
    // whole, so a resumed crawl goes on at the next page.
    const bool last = options.max_models > 0 &&
                      summary.models + static_cast<int64_t>(models.size()) >= options.max_models;
    if (next && !last) pending = fetch_async(*next);
    Status stored = sink.StorePage(crawl_id, models, rejects, next);
    if (!stored.ok()) {
      if (pending.valid()) pending.wait();
      return stored;
    }
    summary.models += static_cast<int64_t>(models.size());
    summary.rejects += rejected;
    ++summary.pages;
    if (options.on_progress) options.on_progress({summary.pages, summary.models, 0, 0});
    if (last) return Status::Ok();
    url = next;
  }
  return Status::Ok();
}

// Fetches named models one by one (`GET /api/models/{id}`) and stores each
// as a one-model page; ids that break the Hub's rules are rejected unsent.
Status FetchNamedModels(const CrawlOptions& options, CrawlSink& sink, const HttpClientFactory& make_client,
                        Fetcher& fetcher, CrawlSummary& summary, std::vector<std::string>* stored) {
  const std::string crawl_id = FirstPageUrl(options);
  COV_RETURN_IF_ERROR(sink.NextPage(crawl_id, /*resume=*/false).error());
  std::unique_ptr<HttpClient> client = make_client();
  for (size_t i = 0; i < options.model_ids.size(); ++i) {
    const std::string& id = options.model_ids[i];
    const std::optional<std::string> next =
        i + 1 < options.model_ids.size() ? std::optional<std::string>(options.endpoint + "/api/models/" +
                                                                       options.model_ids[i + 1])
                                         : std::nullopt;
    std::vector<HubModel> models;
    std::vector<Reject> rejects;
    if (Status valid = ValidateModelId(id); !valid.ok()) {
      rejects.push_back({id.substr(0, 300), valid.message()});
    } else {
      auto r = fetcher.Get(*client, options.endpoint + "/api/models/" + id);
      if (!r) {
        if (r.error().code() == StatusCode::kAborted) {
          summary.interrupted = true;
          return Status::Ok();
        }
        return r.error();
      }
      if (r->status != 200) {
        rejects.push_back({id, Describe(*r)});
      } else {
        auto body = ParseJsonCapped(r->body);
        auto m = body ? ParseHubModel(*body) : Result<HubModel>(body.error());
        if (m) {
          stored->push_back(m->id);
          models.push_back(std::move(*m));
        } else {
          rejects.push_back({r->body.substr(0, 300), m.error().message()});
        }
      }
    }
    COV_RETURN_IF_ERROR(sink.StorePage(crawl_id, models, rejects, next));
    summary.models += static_cast<int64_t>(models.size());
    summary.rejects += static_cast<int64_t>(rejects.size());
    ++summary.pages;
    if (options.on_progress) options.on_progress({summary.pages, summary.models, 0, 0});
  }
  return Status::Ok();
}

Status FetchConfigs(const CrawlOptions& options, CrawlSink& sink, const HttpClientFactory& make_client,
                    Fetcher& fetcher, CrawlSummary& summary, const std::vector<std::string>& stored_named) {
  COV_ASSIGN_OR_RETURN(auto ids, sink.ModelsWithoutConfig(options.model_ids.empty() ? options.max_models : 0));
  if (!options.model_ids.empty()) {
    // A crawl of named models fetches only their configs.
    std::set<std::string> named(stored_named.begin(), stored_named.end());
    ids.erase(std::remove_if(ids.begin(), ids.end(), [&](const std::string& id) { return !named.count(id); }),
              ids.end());
  }
  std::mutex mu;
  size_t next = 0;
  int64_t done = 0;
  Status first_error;
  // An endpoint that stops answering (or answers only errors) would
  // otherwise cost every remaining model its full retry ladder: give up after
  // this many consecutive failed fetches (each already retried).
  constexpr int kMaxConsecutiveTransportFailures = 5;
  int consecutive_transport_failures = 0;
  auto worker = [&]() {
    std::unique_ptr<HttpClient> client = make_client();
    for (;;) {
      std::string id;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (next >= ids.size() || !first_error.ok() || fetcher.Stopped()) return;
        id = ids[next++];
      }
      if (Status valid = ValidateModelId(id); !valid.ok()) {
        // Never put an unchecked id into a URL; record why it has no config.
        Status stored = sink.StoreConfig(id, ConfigStatus::kInvalid, valid.message(), "");
        std::lock_guard<std::mutex> lock(mu);
        if (!stored.ok() && first_error.ok()) first_error = stored;
        ++summary.configs_invalid;
        ++done;
        continue;
      }
      ConfigFetch fetched = FetchConfig(options.endpoint, *client, fetcher, id);
      Status stored;
      if (fetched.aborted) continue;  // the loop head sees the stop
      const ConfigStatus status = fetched.status;
      const std::string& reason = fetched.reason;
      const bool record = fetched.record;
      if (record) stored = sink.StoreConfig(id, status, reason, fetched.body);
      std::lock_guard<std::mutex> lock(mu);
      if (!stored.ok()) {
        first_error = stored;
        return;
      }
      if (!record) {
        if (++consecutive_transport_failures >= kMaxConsecutiveTransportFailures && first_error.ok()) {
          first_error = Status::IoError("giving up on " + options.endpoint + ": " +
                                        std::to_string(consecutive_transport_failures) +
                                        " config fetches in a row failed (" + reason + ")");
        }
      } else {
        consecutive_transport_failures = 0;
      }
      if (!record) {
        ++summary.config_errors;
        if (summary.errors.size() < 5) summary.errors.push_back(id + ": " + reason);
      } else if (status == ConfigStatus::kFetched) {
        ++summary.configs_fetched;
      } else if (status == ConfigStatus::kMissing) {
        ++summary.configs_missing;
      } else if (status == ConfigStatus::kGated) {
        ++summary.configs_gated;
      } else {
        ++summary.configs_invalid;
      }
      ++done;
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < std::max(1, options.concurrency); ++i) threads.emplace_back(worker);
  // Progress from this thread while the workers run.
  for (;;) {
    bool finished;
    CrawlProgress p;
    {
      std::lock_guard<std::mutex> lock(mu);
      finished = next >= ids.size() || !first_error.ok() || fetcher.Stopped();
      p = {summary.pages, summary.models, done, static_cast<int64_t>(ids.size())};
    }
    if (options.on_progress) options.on_progress(p);
    if (finished) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (auto& t : threads) t.join();
  if (fetcher.Stopped()) summary.interrupted = true;
  return first_error;
}

}  // namespace

std::string_view ConfigStatusName(ConfigStatus status) {
  switch (status) {
    case ConfigStatus::kFetched: return "fetched";
    case ConfigStatus::kMissing: return "missing";
    case ConfigStatus::kGated: return "gated";
    case ConfigStatus::kInvalid: return "invalid";
  }
  return "?";
}

std::string FirstPageUrl(const CrawlOptions& options) {
  if (!options.model_ids.empty()) return options.endpoint + "/api/models/" + options.model_ids.front();
  std::string url = options.endpoint + "/api/models?";
  for (const auto& [key, value] : options.query) url += UrlEncode(key) + "=" + UrlEncode(value) + "&";
  url += "full=true&config=true&limit=" + std::to_string(options.page_limit);
  return url;
}

Result<CrawlSummary> RunCrawl(const CrawlOptions& options, CrawlSink& sink, const HttpClientFactory& make_client) {
  const auto start = Clock::now();
  if (options.endpoint.rfind("http://", 0) != 0 && options.endpoint.rfind("https://", 0) != 0) {
    return Status::InvalidArgument("endpoint '" + options.endpoint + "' must start with http:// or https://");
  }
  if (options.page_limit < 1) return Status::InvalidArgument("page limit must be positive");
  CrawlSummary summary;
  Fetcher fetcher(options);
  std::vector<std::string> named;
  if (options.model_ids.empty()) {
    COV_RETURN_IF_ERROR(ListModels(options, sink, make_client, fetcher, summary));
  } else {
    COV_RETURN_IF_ERROR(FetchNamedModels(options, sink, make_client, fetcher, summary, &named));
  }
  if (options.fetch_configs && !summary.interrupted) {
    COV_RETURN_IF_ERROR(FetchConfigs(options, sink, make_client, fetcher, summary, named));
  }
  summary.requests = fetcher.requests();
  summary.retries = fetcher.retries();
  summary.waited_s = fetcher.waited_s();
  summary.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return summary;
}

}  // namespace coverage::crawler
