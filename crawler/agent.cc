#include "crawler/agent.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "core/hash.h"
#include "crawler/fetcher.h"
#include "crawler/link_header.h"
#include "crawler/model_id.h"

namespace coverage::crawler {
namespace {

using namespace detail;
using nlohmann::json;

// Region kinds: the relation to a base model, from the Hub's tags.
enum Kind { kNone, kFinetune, kAdapter, kQuantized, kMerge };
const char* KindName(int k) {
  static const char* const kNames[] = {"none", "finetune", "adapter", "quantized", "merge"};
  return kNames[k];
}


constexpr int kMaxConsecutiveFailures = 5;
constexpr double kPagePriorRegions = 100;  // expected new regions of a page never read
constexpr double kPageEmaWeight = 0.5;


// Trace fields, read defensively: a trace is a file a person may edit.
std::string StringField(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}
std::optional<int64_t> IntField(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}
double NumberField(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

struct RegionOf {
  std::string key;
  std::string group;  // relation and quantization tag: regions that behave alike
  Kind kind = kNone;
  std::string facet;  // the filter= value that lists this region's models ("" = none)
};

RegionOf RegionFor(const HubModel& m) {
  RegionOf r;
  std::string base, quant;
  for (const std::string& tag : m.tags) {
    if (tag.rfind("base_model:", 0) == 0) {
      const std::string rest = tag.substr(11);
      const size_t colon = rest.find(':');
      if (colon == std::string::npos) continue;
      const std::string relation = rest.substr(0, colon);
      const Kind k = relation == "finetune"    ? kFinetune
                     : relation == "adapter"   ? kAdapter
                     : relation == "quantized" ? kQuantized
                     : relation == "merge"     ? kMerge
                                               : kNone;
      if (k != kNone && r.kind == kNone) {
        r.kind = k;
        base = rest.substr(colon + 1);
        r.facet = tag;
      }
    } else if (tag == "gptq" || tag == "awq" || tag == "bitsandbytes" || tag == "gguf" || tag == "exl2" ||
               tag == "fp8" || tag == "compressed-tensors") {
      quant = tag;
    }
  }
  if (r.kind == kNone && m.library_name == "peft") r.kind = kAdapter;
  if (r.facet.empty() && !m.model_type.empty()) r.facet = m.model_type;
  r.group = std::string(KindName(r.kind)) + (quant.empty() ? "" : ":" + quant);
  r.key = (m.model_type.empty() ? "?" : m.model_type) + "|" + (m.architectures.empty() ? "" : m.architectures[0]) +
          "|" + KindName(r.kind) + "|" + base + "|" + quant;
  return r;
}

struct Member {
  int64_t downloads;
  std::string id;
  bool gated = false;  // listed as gated: its config needs a token
};

constexpr int kDepthBuckets = 24;
// 0 for the first fetch, then 1, 2-3, 4-7, ...
int DepthBucket(int64_t fetched) {
  return std::min(kDepthBuckets - 1, fetched <= 0 ? 0 : static_cast<int>(std::bit_width(static_cast<uint64_t>(fetched))));
}

// A region's state: how many different outcomes its fetches showed (0, 1,
// 2, 3+). An outcome is a fine signature, or "none" (no readable config).
constexpr int kStates = 4;

// What the regions of one group did after reaching each state: how many
// reached it (with at least one fetch made in it) and how many of those
// then showed another outcome that was a fine signature new to the agent.
// w(s) = (moved_on + 1/2) / (reached + 1) estimates the chance that a region
// of the group in state s still holds something new (Note [Crawl agent]).
//
// It also keeps, by state and depth bucket (fetches made before: 0, 1, 2-3,
// 4-7, ...), how many fetches were made and how many revealed a new fine
// signature. The rate of a cell is smoothed toward the cell one depth
// shallower, (D + 2 prior) / (F + 2), so a depth no region has reached yet
// inherits the rate above it; the first fetch's prior is 1/2.
struct GroupStats {
  int64_t reached[kStates] = {};
  int64_t moved_on[kStates] = {};
  int64_t fetches[kStates][kDepthBuckets] = {};
  int64_t discoveries[kStates][kDepthBuckets] = {};
  double rates[kStates][kDepthBuckets] = {};
  bool dirty = true;

  double W(int state) const {
    return (static_cast<double>(moved_on[state]) + 0.5) / (static_cast<double>(reached[state]) + 1.0);
  }
  double Rate(int state, int bucket) {
    if (dirty) {
      for (int s = 0; s < kStates; ++s) {
        double prior = 0.5;
        for (int b = 0; b < kDepthBuckets; ++b) {
          prior = (static_cast<double>(discoveries[s][b]) + 2 * prior) / (static_cast<double>(fetches[s][b]) + 2);
          rates[s][b] = prior;
        }
      }
      dirty = false;
    }
    return rates[state][bucket];
  }
};

struct Region {
  std::string key;
  std::string group;
  GroupStats* stats = nullptr;  // the group's, owned by the agent
  std::string facet;
  std::vector<Member> pool;  // not yet fetched
  int64_t fetched = 0;
  int64_t discoveries = 0;  // fetches that revealed a new fine signature
  // Outcomes of the region's fetches: fine signature (or "" for none) -> count.
  std::map<std::string, int64_t> outcomes;
  int64_t singletons = 0;  // outcomes seen exactly once
  int64_t fetched_in_state = 0;  // fetches since the region reached its state
  bool saturated = false;        // traced once
};

int State(const Region& r) { return std::min<int>(kStates - 1, static_cast<int>(r.outcomes.size())); }

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

  Status OpenTrace();
  Status Resume();
  Status Trace(json line);
  Action Choose();
  double RegionGain(Region& r, std::string* why) const;
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
  std::ofstream trace_;
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

Status Agent::OpenTrace() {
  if (options_.resume) {
    std::ifstream in(options_.trace_path);
    if (!in) {
      return Status::InvalidArgument("--resume: no trace at '" + options_.trace_path +
                                     "' to resume from; start without --resume");
    }
  }
  if (options_.resume) {
    // A kill may leave the last line cut short: drop it (it is ignored on
    // reading), so every line of the trace stays one JSON object.
    std::string text;
    {
      std::ifstream in(options_.trace_path, std::ios::binary);
      text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    if (!text.empty() && text.back() != '\n') {
      const size_t keep = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
      std::error_code ec;
      std::filesystem::resize_file(options_.trace_path, keep, ec);
      if (ec) return Status::IoError("cannot repair the cut agent trace '" + options_.trace_path + "': " + ec.message());
    }
  }
  trace_.open(options_.trace_path, options_.resume ? std::ios::app : std::ios::trunc);
  if (!trace_) return Status::IoError("cannot write the agent trace '" + options_.trace_path + "'");
  return Status::Ok();
}

Status Agent::Trace(json line) {
  line["step"] = ++step_;
  line["requests"] = Requests();
  line["fine_signatures"] = static_cast<int64_t>(fine_.size());
  trace_ << line.dump() << '\n';
  trace_.flush();  // a killed agent must not lose the requests it spent
  if (!trace_) return Status::IoError("writing the agent trace '" + options_.trace_path + "' failed");
  return Status::Ok();
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
  GroupStats& g = *r.stats;
  const int before = State(r), bucket = DepthBucket(r.fetched);
  if (r.fetched_in_state == 0) ++g.reached[before];  // the first fetch made in this state
  ++r.fetched_in_state;
  *discovered = sig && fine_.insert(*sig).second;
  g.dirty = true;
  ++g.fetches[before][bucket];
  if (*discovered) {
    ++g.discoveries[before][bucket];
    ++r.discoveries;
    summary_.curve.emplace_back(Requests(), static_cast<int64_t>(fine_.size()));
  }
  const int64_t seen = ++r.outcomes[sig.value_or("")];
  if (seen == 1) ++r.singletons;
  if (seen == 2) --r.singletons;
  ++r.fetched;
  if (seen == 1) {
    // A new outcome for the region: it leaves its state (3+ stays 3+).
    if (*discovered) ++g.moved_on[before];
    if (State(r) != before) r.fetched_in_state = 0;
  }
}

double Agent::RegionGain(Region& r, std::string* why) const {
  // Two estimates of the new fine signatures the next fetch reveals; the
  // larger counts. (1) What fetches at this state and depth revealed in
  // the group: learns fast which groups pay and how soon they stop paying.
  // (2) The chance that a region of the group in this state still holds a
  // new signature, times the chance that the next fetch shows an outcome
  // this region has not shown yet, (outcomes seen once + 1) / (fetches + 1)
  // (Good-Turing with one pseudo-count): it decays as 1 / fetches instead of
  // dropping to zero, so a budget left over goes to regions whose group is
  // known to hide late variants.
  GroupStats& g = *r.stats;
  const int state = State(r), bucket = DepthBucket(r.fetched);
  const double pooled = g.Rate(state, bucket);
  const double unseen = (static_cast<double>(r.singletons) + 1.0) / (static_cast<double>(r.fetched) + 1.0);
  const double tail = g.W(state) * unseen;
  if (why) {
    char buf[300];
    if (pooled >= tail) {
      std::snprintf(buf, sizeof buf,
                    "%s regions with %d outcome(s) at depth bucket %d revealed new signatures in %lld of %lld fetches",
                    r.group.c_str(), state, bucket, static_cast<long long>(g.discoveries[state][bucket]),
                    static_cast<long long>(g.fetches[state][bucket]));
    } else {
      std::snprintf(buf, sizeof buf,
                    "%s regions with %d outcome(s) went on to a new signature in %lld of %lld cases; this one "
                    "showed %zu outcome(s) in %lld fetches, %lld only once",
                    r.group.c_str(), state, static_cast<long long>(g.moved_on[state]),
                    static_cast<long long>(g.reached[state]), r.outcomes.size(), static_cast<long long>(r.fetched),
                    static_cast<long long>(r.singletons));
    }
    *why = buf;
  }
  return std::max(pooled, tail);
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
  std::ifstream in(options_.trace_path);
  std::string text;
  std::vector<std::pair<std::string, std::optional<std::string>>> fetches;  // (model, fine)
  int64_t line_no = 0;
  bool ended = false;  // the last decision is a stop: no action was cut short
  while (std::getline(in, text)) {
    ++line_no;
    if (text.empty()) continue;
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      // A line cut by a kill is the last one; anything else is damage.
      if (in.peek() == EOF) break;
      return Status::Corruption("agent trace '" + options_.trace_path + "' line " + std::to_string(line_no) +
                                " is not JSON; start again without --resume");
    }
    if (auto r = IntField(j, "requests")) used_before_ = std::max(used_before_, *r);
    if (auto st = IntField(j, "step")) step_ = std::max(step_, *st);
    const std::string action = StringField(j, "action");
    ended = action == "stop";
    const std::string model = StringField(j, "model");
    if (action == "fetch_config" && !model.empty() && StringField(j, "outcome") != "gated") {
      const std::string fine = StringField(j, "fine");
      fetches.emplace_back(model, fine.empty() ? std::nullopt : std::optional<std::string>(fine));
    }
  }
  // Killed in the middle of an action: its requests never reached the
  // trace. Charge the most one action can send (a page: tries of a parse
  // failure times tries of a transport failure), so the budget holds.
  int64_t charged = 0;
  if (!ended && line_no > 0) {
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
  COV_RETURN_IF_ERROR(OpenTrace());
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

Result<std::string> ExplainTrace(const std::string& trace_path) {
  std::ifstream in(trace_path);
  if (!in) return Status::NotFound("no agent trace at '" + trace_path + "' (run coverage crawl --agent first)");
  std::map<std::string, int64_t> actions;
  std::map<std::string, std::pair<int64_t, int64_t>> regions;  // key -> (fetches, discoveries)
  std::vector<std::string> saturated;
  std::vector<std::pair<int64_t, int64_t>> curve;
  int64_t requests = 0, fine = 0, lines = 0, bad = 0;
  std::string stopped, started;
  double expected_sum = 0, observed_sum = 0;
  std::string text;
  while (std::getline(in, text)) {
    if (text.empty()) continue;
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      ++bad;
      continue;
    }
    ++lines;
    std::string action = StringField(j, "action");
    if (action.empty()) action = "?";
    ++actions[action];
    if (auto r = IntField(j, "requests")) requests = *r;
    if (auto f = IntField(j, "fine_signatures")) {
      if (*f > fine) curve.emplace_back(requests, *f);
      fine = std::max(fine, *f);
    }
    if (action == "fetch_config") {
      auto& r = regions[StringField(j, "region")];
      ++r.first;
      const int64_t observed = IntField(j, "observed_gain").value_or(0);
      r.second += observed;
      expected_sum += NumberField(j, "expected_gain");
      observed_sum += static_cast<double>(observed);
    } else if (action == "saturate_region") {
      saturated.push_back(StringField(j, "region"));
    } else if (action == "stop") {
      stopped = StringField(j, "why");
    } else if (action == "start" || action == "resume") {
      started = StringField(j, "why");
    }
  }
  if (lines == 0) return Status::InvalidArgument("agent trace '" + trace_path + "' holds no decisions");
  std::string out;
  char buf[512];
  std::snprintf(buf, sizeof buf, "agent trace %s: %lld decisions, %lld requests, %lld fine signatures found\n",
                trace_path.c_str(), static_cast<long long>(lines), static_cast<long long>(requests),
                static_cast<long long>(fine));
  out += buf;
  if (!started.empty()) out += "  settings: " + started + "\n";
  out += "  actions:";
  for (const auto& [a, n] : actions) out += " " + a + " " + std::to_string(n) + ";";
  out += "\n";
  const int64_t fetches = actions.count("fetch_config") ? actions["fetch_config"] : 0;
  if (fetches > 0) {
    std::snprintf(buf, sizeof buf,
                  "  config fetches: expected %.1f new signatures in all, observed %.0f (%.1f%% of fetches revealed one)\n",
                  expected_sum, observed_sum, 100.0 * observed_sum / static_cast<double>(fetches));
    out += buf;
  }
  if (!curve.empty()) {
    out += "  discovery curve (requests -> fine signatures):";
    for (double share : {0.1, 0.25, 0.5, 0.75, 1.0}) {
      const int64_t at = static_cast<int64_t>(share * static_cast<double>(requests));
      int64_t f = 0;
      for (const auto& [r, n] : curve) {
        if (r <= at) f = n;
      }
      out += " " + std::to_string(at) + "->" + std::to_string(f);
    }
    out += "\n";
  }
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> top(regions.begin(), regions.end());
  std::sort(top.begin(), top.end(), [](const auto& a, const auto& b) {
    return a.second.first != b.second.first ? a.second.first > b.second.first : a.first < b.first;
  });
  std::snprintf(buf, sizeof buf, "  regions explored: %zu; saturated: %zu. Most explored:\n", regions.size(),
                saturated.size());
  out += buf;
  for (size_t i = 0; i < top.size() && i < 10; ++i) {
    std::snprintf(buf, sizeof buf, "    %6lld fetches, %4lld new signatures  %s\n",
                  static_cast<long long>(top[i].second.first), static_cast<long long>(top[i].second.second),
                  top[i].first.c_str());
    out += buf;
  }
  out += "  stopped: " + (stopped.empty() ? std::string("(no stop line: the agent was killed; --resume goes on)") : stopped) +
         "\n";
  if (bad > 0) out += "  " + std::to_string(bad) + " unreadable lines skipped\n";
  return out;
}

}  // namespace coverage::crawler
