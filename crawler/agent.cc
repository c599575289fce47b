#include "crawler/agent.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "core/hash.h"
#include "crawler/agent_regions.h"
#include "crawler/agent_trace.h"
#include "crawler/fetcher.h"
#include "crawler/link_header.h"
#include "crawler/model_id.h"

namespace coverage::crawler {
namespace {

using namespace detail;
using nlohmann::json;

constexpr int kMaxConsecutiveFailures = 5;
constexpr double kPagePriorRegions = 100;  // expected new regions of a page never read
constexpr double kPageEmaWeight = 0.5;

class Agent {
 public:
  Agent(const AgentOptions& options, AgentSink& sink, const HttpClientFactory& make_client, const Classifier& classify)
      : options_(options),
        transport_(options.transport),
        sink_(sink),
        make_client_(make_client),
        classify_(classify),
        fetcher_(transport_) {}

  Result<AgentSummary> Run();

 private:
  struct Action {
    enum Type { kNothing, kFetch, kMainPage, kFacetPage } type = kNothing;
    size_t region = 0;
    double gain = 0;  // per request
    std::string why;
  };

  Status Resume();
  Status Trace(json line);
  Action Choose();
  Status ReadPage(const std::string& crawl_id, const std::string& url, std::optional<std::string>* next,
                  int64_t* new_regions, int64_t* new_models);
  Status Fetch(size_t region, const Action& action);
  size_t AddModel(const HubModel& m, bool* new_region);
  void Account(Region& r, const std::optional<std::string>& sig, bool* discovered);
  int64_t Requests() const { return used_before_ + fetcher_.requests(); }

  const AgentOptions& options_;
  CrawlOptions transport_;
  AgentSink& sink_;
  const HttpClientFactory& make_client_;
  const Classifier& classify_;
  Fetcher fetcher_;
  std::unique_ptr<HttpClient> client_;
  TraceWriter trace_;
  int64_t step_ = 0;
  int64_t used_before_ = 0;  // requests of earlier runs (resume)

  std::vector<Region> regions_;
  std::unordered_map<std::string, size_t> region_index_;
  std::unordered_set<uint64_t> seen_;  // hashes of listed model ids
  std::unordered_set<std::string> fine_;
  std::map<std::string, std::unique_ptr<GroupStats>> groups_;  // by region group

  // The whole listing in different orders: the most downloaded first, and
  // the newest first (new families show up there long before they are
  // downloaded much).
  struct Stream {
    std::string sort;
    std::string crawl_id;
    std::optional<std::string> next;
    double ema = kPagePriorRegions;  // new regions per page, moving average
  };
  std::vector<Stream> streams_;
  // Facet listings (filter=<facet>) that refill regions, by facet; several
  // regions may share one (a model_type facet). Started in the sink on first
  // use, so a facet nobody needs costs nothing.
  struct Facet {
    std::string crawl_id;
    bool started = false;
    std::optional<std::string> next;  // valid once started; nullopt: exhausted
  };
  std::map<std::string, Facet> facets_;
  bool FacetOpen(const Region& r) const {
    if (r.facet.empty()) return false;
    const Facet& f = facets_.at(r.facet);
    return !f.started || f.next.has_value();
  }
  int consecutive_failures_ = 0;
  AgentSummary summary_;
};

Status Agent::Trace(json line) {
  line["step"] = ++step_;
  line["requests"] = Requests();
  line["fine_signatures"] = static_cast<int64_t>(fine_.size());
  return trace_.Write(line);
}

size_t Agent::AddModel(const HubModel& m, bool* new_region) {
  RegionOf of = RegionFor(m);
  auto [it, inserted] = region_index_.try_emplace(of.key, regions_.size());
  if (inserted) {
    Region r;
    r.key = of.key;
    r.group = of.group;
    auto& g = groups_[of.group];
    if (!g) g = std::make_unique<GroupStats>();
    r.stats = g.get();
    r.facet = of.facet;
    if (!r.facet.empty() && !facets_.count(r.facet)) {
      CrawlOptions query = transport_;
      query.query = {{"filter", r.facet}, {"sort", "downloads"}};
      facets_[r.facet].crawl_id = FirstPageUrl(query);
    }
    regions_.push_back(std::move(r));
  }
  *new_region = inserted;
  regions_[it->second].pool.push_back({m.downloads, m.id, m.gated != "false"});
  return it->second;
}

void Agent::Account(Region& r, const std::optional<std::string>& sig, bool* discovered) {
  *discovered = RecordOutcome(r, sig, &fine_);
  if (*discovered) summary_.curve.emplace_back(Requests(), static_cast<int64_t>(fine_.size()));
}

Agent::Action Agent::Choose() {
  Action best;
  auto consider = [&](Action a) {
    if (a.gain > best.gain) best = std::move(a);
  };
  // The listing streams.
  {
    GroupStats first;  // first fetches of all groups
    for (const auto& [group, g] : groups_) {
      first.reached[0] += g->reached[0];
      first.moved_on[0] += g->moved_on[0];
    }
    for (size_t i = 0; i < streams_.size(); ++i) {
      const Stream& stream = streams_[i];
      if (!stream.next) continue;
      Action a;
      a.type = Action::kMainPage;
      a.region = i;  // the stream
      a.gain = stream.ema * first.W(0);
      char buf[200];
      std::snprintf(buf, sizeof buf,
                    "recent pages by %s revealed %.1f new regions each; a first fetch reveals a new signature %.0f%% "
                    "of the time",
                    stream.sort.c_str(), stream.ema, 100 * first.W(0));
      a.why = buf;
      consider(std::move(a));
    }
  }
  // Regions: ties go to the region whose next member is most downloaded,
  // then to the older region.
  int64_t best_downloads = -1;
  for (size_t i = 0; i < regions_.size(); ++i) {
    Region& r = regions_[i];
    const bool refill = r.pool.empty();
    if (refill && !FacetOpen(r)) continue;
    double gain = RegionGain(r, nullptr);
    if (refill) gain /= 2;  // a facet page, then the fetch
    int64_t top = 0;
    if (!refill) {
      for (const Member& m : r.pool) top = std::max(top, m.downloads);
    }
    if (gain > best.gain || (gain == best.gain && best.type != Action::kMainPage && top > best_downloads)) {
      best.type = refill ? Action::kFacetPage : Action::kFetch;
      best.region = i;
      best.gain = gain;
      best_downloads = top;
    }
  }
  if (best.type == Action::kFetch || best.type == Action::kFacetPage) {
    RegionGain(regions_[best.region], &best.why);
    if (best.type == Action::kFacetPage) best.why = "refill an empty region: " + best.why;
  }
  return best;
}

Status Agent::ReadPage(const std::string& crawl_id, const std::string& url, std::optional<std::string>* next,
                       int64_t* new_regions, int64_t* new_models) {
  if (!client_) client_ = make_client_();
  COV_ASSIGN_OR_RETURN(Page page, FetchPage(transport_, *client_, fetcher_, url));
  if (page.aborted) return Status::Aborted("stopped");
  std::optional<std::string> link = NextPageUrl(page.response.Header("Link"));
  if (link && Origin(*link) != Origin(transport_.endpoint)) {
    return Status::IoError("listing page " + url + " points its next page off the endpoint; refusing to follow");
  }
  if (link && *link == url) return Status::IoError("listing page " + url + " links to itself; refusing to loop");
  if (static_cast<int64_t>(page.body.size()) > transport_.page_limit) {
    return Status::IoError("listing page " + url + " has more entries than the " +
                           std::to_string(transport_.page_limit) + " asked for");
  }
  if (page.body.empty()) link.reset();
  std::vector<HubModel> models;
  std::vector<Reject> rejects;
  for (const auto& entry : page.body) {
    auto m = ParseHubModel(entry);
    if (m) {
      models.push_back(std::move(*m));
    } else if (rejects.size() < 20) {
      rejects.push_back({entry.dump().substr(0, 300), m.error().message()});
    }
  }
  COV_RETURN_IF_ERROR(sink_.StorePage(crawl_id, models, rejects, link));
  ++summary_.pages;
  *new_regions = *new_models = 0;
  for (const HubModel& m : models) {
    if (!seen_.insert(Fnv1a64(m.id)).second) continue;
    bool created = false;
    AddModel(m, &created);
    ++*new_models;
    if (created) ++*new_regions;
  }
  *next = link;
  return Status::Ok();
}

Status Agent::Fetch(size_t index, const Action& action) {
  Region& r = regions_[index];
  // The most downloaded member first (the one a selection would want),
  // then seeded random picks, so the region is sampled without bias. Gated
  // members come last without a token: their config would not come back.
  const bool avoid_gated = transport_.token.empty();
  auto usable = [&](const Member& m) { return !(avoid_gated && m.gated); };
  const bool any_usable = std::any_of(r.pool.begin(), r.pool.end(), usable);
  size_t pick = r.pool.size();
  if (r.fetched == 0) {
    for (size_t i = 0; i < r.pool.size(); ++i) {
      if (any_usable && !usable(r.pool[i])) continue;
      if (pick == r.pool.size() || r.pool[i].downloads > r.pool[pick].downloads) pick = i;
    }
  } else {
    pick = static_cast<size_t>(Mix64(options_.seed ^ Fnv1a64(r.key) ^ static_cast<uint64_t>(r.fetched)) % r.pool.size());
    for (size_t tries = 0; any_usable && !usable(r.pool[pick]) && tries < r.pool.size(); ++tries) {
      pick = (pick + 1) % r.pool.size();
    }
  }
  if (r.saturated) {
    // Evidence from its group raised the region's expected gain again.
    r.saturated = false;
    COV_RETURN_IF_ERROR(Trace({{"action", "reopen_region"},
                               {"region", r.key},
                               {"why", action.why},
                               {"expected_gain", action.gain},
                               {"observed_gain", 0}}));
  }
  const Member member = r.pool[pick];
  const std::string& id = member.id;
  r.pool[pick] = std::move(r.pool.back());
  r.pool.pop_back();
  if (!client_) client_ = make_client_();
  std::optional<std::string> sig;
  std::string outcome;
  if (Status valid = ValidateModelId(id); !valid.ok()) {
    outcome = "invalid";
    COV_RETURN_IF_ERROR(sink_.StoreConfig(id, ConfigStatus::kInvalid, valid.message(), ""));
  } else {
    ConfigFetch fetched = FetchConfig(transport_.endpoint, *client_, fetcher_, id);
    if (fetched.aborted) {
      r.pool.push_back(member);  // not fetched after all
      return Status::Aborted("stopped");
    }
    ++summary_.configs_fetched;
    if (!fetched.record) {
      if (++consecutive_failures_ >= kMaxConsecutiveFailures) {
        return Status::IoError("giving up on " + transport_.endpoint + ": " + std::to_string(consecutive_failures_) +
                               " config fetches in a row failed (" + fetched.reason + ")");
      }
      outcome = "failed: " + fetched.reason;
    } else {
      consecutive_failures_ = 0;
      outcome = std::string(ConfigStatusName(fetched.status));
      COV_RETURN_IF_ERROR(sink_.StoreConfig(id, fetched.status, fetched.reason, fetched.body));
      if (fetched.status == ConfigStatus::kFetched) {
        sig = classify_(fetched.body);
        if (!sig) outcome = "fetched, unreadable";
      }
    }
  }
  // A gated config says nothing about the region's design space: it does
  // not count as a sample of the region.
  bool discovered = false;
  if (outcome != "gated") Account(r, sig, &discovered);
  json line = {{"action", "fetch_config"}, {"region", r.key},          {"model", id},
               {"why", action.why},        {"expected_gain", action.gain}, {"observed_gain", discovered ? 1 : 0},
               {"outcome", outcome}};
  if (sig) line["fine"] = *sig;
  COV_RETURN_IF_ERROR(Trace(std::move(line)));
  const double after = RegionGain(r, nullptr);
  if (!r.saturated && after < options_.min_gain) {
    r.saturated = true;
    std::string why;
    RegionGain(r, &why);
    COV_RETURN_IF_ERROR(Trace({{"action", "saturate_region"},
                               {"region", r.key},
                               {"why", "expected gain " + std::to_string(after) + " < min-gain: " + why},
                               {"expected_gain", after},
                               {"observed_gain", 0}}));
  }
  return Status::Ok();
}

Status Agent::Resume() {
  // Requests spent and fetches made, in order, from the trace.
  COV_ASSIGN_OR_RETURN(const TraceHistory history, ReadTraceHistory(options_.trace_path));
  used_before_ = std::max(used_before_, history.requests);
  step_ = std::max(step_, history.steps);
  const auto& fetches = history.fetches;
  // Killed in the middle of an action: its requests never reached the
  // trace. Charge the most one action can send (a page: tries of a parse
  // failure times tries of a transport failure), so the budget holds.
  int64_t charged = 0;
  if (!history.ended && history.lines > 0) {
    const int64_t tries = std::max(1, transport_.retry.max_tries);
    charged = std::max(tries * tries, 3 * tries);
    used_before_ += charged;
  }
  // Regions and pools from the stored models; configs fetched outside the
  // trace (an earlier plain crawl) count as known.
  std::unordered_map<std::string, size_t> region_of_model;
  std::unordered_set<std::string> traced;
  for (const auto& f : fetches) traced.insert(f.first);
  COV_RETURN_IF_ERROR(sink_.ForEachStoredModel(
      [&](const HubModel& m, std::optional<ConfigStatus> status, std::string_view config) -> Status {
        if (!seen_.insert(Fnv1a64(m.id)).second) return Status::Ok();
        bool created = false;
        const size_t r = AddModel(m, &created);
        region_of_model[m.id] = r;
        if (status && !traced.count(m.id) && *status == ConfigStatus::kFetched) {
          if (auto sig = classify_(config)) fine_.insert(*sig);  // known before the agent ran
        }
        if (status) regions_[r].pool.pop_back();  // fetched already
        return Status::Ok();
      }));
  for (const auto& [model, fine] : fetches) {
    auto it = region_of_model.find(model);
    if (it == region_of_model.end()) continue;
    bool discovered = false;
    Account(regions_[it->second], fine, &discovered);
  }
  // Streams continue at their stored cursors.
  for (Stream& stream : streams_) {
    COV_ASSIGN_OR_RETURN(stream.next, sink_.NextPage(stream.crawl_id, /*resume=*/true));
  }
  return Trace({{"action", "resume"},
                {"why", "continuing with " + std::to_string(std::max<int64_t>(0, options_.budget - used_before_)) +
                            " of " + std::to_string(options_.budget) + " requests left" +
                            (charged > 0 ? "; the previous run was killed mid-action, so " + std::to_string(charged) +
                                               " requests it may have sent are charged"
                                         : std::string())},
                {"regions", static_cast<int64_t>(regions_.size())}});
}

Result<AgentSummary> Agent::Run() {
  if (options_.trace_path.empty()) return Status::InvalidArgument("the crawl agent needs a trace path");
  if (options_.budget < 1) return Status::InvalidArgument("--budget must be at least 1");
  if (transport_.endpoint.rfind("http://", 0) != 0 && transport_.endpoint.rfind("https://", 0) != 0) {
    return Status::InvalidArgument("endpoint '" + transport_.endpoint + "' must start with http:// or https://");
  }
  COV_RETURN_IF_ERROR(trace_.Open(options_.trace_path, options_.resume));
  for (const char* sort : {"downloads", "createdAt"}) {
    CrawlOptions listing = transport_;
    listing.query = {{"sort", sort}};
    streams_.push_back({sort, FirstPageUrl(listing), std::nullopt, kPagePriorRegions});
  }
  if (options_.resume) {
    COV_RETURN_IF_ERROR(Resume());
  } else {
    for (Stream& stream : streams_) {
      COV_ASSIGN_OR_RETURN(stream.next, sink_.NextPage(stream.crawl_id, /*resume=*/false));
    }
    COV_RETURN_IF_ERROR(Trace({{"action", "start"},
                               {"why", "budget " + std::to_string(options_.budget) + " requests, min-gain " +
                                           std::to_string(options_.min_gain) + ", seed " +
                                           std::to_string(options_.seed)}}));
  }
  fetcher_.set_max_requests(std::max<int64_t>(1, options_.budget - used_before_));
  if (options_.budget - used_before_ <= 0) summary_.stopped_because = "the budget was already spent";

  while (summary_.stopped_because.empty()) {
    if (fetcher_.Stopped()) {
      summary_.interrupted = true;
      summary_.stopped_because = "interrupted";
      break;
    }
    if (Requests() >= options_.budget) {
      summary_.stopped_because = "budget spent";
      break;
    }
    Action a = Choose();
    if (a.type == Action::kNothing || a.gain < options_.min_gain) {
      char buf[200];
      std::snprintf(buf, sizeof buf, "no action is expected to reveal %.4f new signatures per request (best %.4f)",
                    options_.min_gain, a.gain);
      summary_.stopped_because = a.type == Action::kNothing ? "nothing left to list or fetch" : buf;
      break;
    }
    Status s;
    if (a.type == Action::kFetch) {
      s = Fetch(a.region, a);
    } else {
      const bool main_page = a.type == Action::kMainPage;
      Stream* stream = main_page ? &streams_[a.region] : nullptr;
      Facet* facet = main_page ? nullptr : &facets_.at(regions_[a.region].facet);
      if (facet && !facet->started) {
        // Continues a facet listing stored by an earlier run when resuming.
        auto first = sink_.NextPage(facet->crawl_id, options_.resume);
        if (!first) {
          (void)Trace({{"action", "error"}, {"why", first.error().message()}});
          return first.error();
        }
        facet->started = true;
        facet->next = *first;
        if (!facet->next) continue;  // exhausted in an earlier run
      }
      const std::string crawl_id = main_page ? stream->crawl_id : facet->crawl_id;
      const std::string url = main_page ? *stream->next : *facet->next;
      std::optional<std::string> next;
      int64_t new_regions = 0, new_models = 0;
      s = ReadPage(crawl_id, url, &next, &new_regions, &new_models);
      if (s.ok()) {
        if (main_page) {
          stream->next = next;
          stream->ema = kPageEmaWeight * static_cast<double>(new_regions) + (1 - kPageEmaWeight) * stream->ema;
        } else {
          facet->next = next;
        }
        s = Trace({{"action", main_page ? "list_page" : "facet_page"},
                   {"url", url},
                   {"why", a.why},
                   {"expected_gain", a.gain},
                   {"observed_gain", new_regions},
                   {"new_models", new_models},
                   {"region", main_page ? "" : regions_[a.region].key},
                   {"sort", main_page ? stream->sort : "downloads"}});
      }
    }
    if (!s.ok()) {
      if (s.code() == StatusCode::kAborted) {
        if (fetcher_.BudgetSpent()) {
          summary_.stopped_because = "budget spent";
        } else {
          summary_.interrupted = true;
          summary_.stopped_because = "interrupted";
        }
        break;
      }
      (void)Trace({{"action", "error"}, {"why", s.message()}});
      return s;
    }
    if (options_.on_progress && step_ % 64 == 0) options_.on_progress(Requests(), static_cast<int64_t>(fine_.size()));
  }
  summary_.requests = Requests();
  summary_.fine_signatures = static_cast<int64_t>(fine_.size());
  summary_.regions = static_cast<int64_t>(regions_.size());
  summary_.saturated_regions = std::count_if(regions_.begin(), regions_.end(), [](const Region& r) { return r.saturated; });
  COV_RETURN_IF_ERROR(Trace({{"action", "stop"},
                             {"why", summary_.stopped_because},
                             {"regions", summary_.regions},
                             {"saturated_regions", summary_.saturated_regions}}));
  return summary_;
}

}  // namespace

Result<AgentSummary> RunAgent(const AgentOptions& options, AgentSink& sink, const HttpClientFactory& make_client,
                              const Classifier& classify) {
  Agent agent(options, sink, make_client, classify);
  return agent.Run();
}

}  // namespace coverage::crawler
